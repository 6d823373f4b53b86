//! Notes of the values the last unlinks took from under a name, so that the
//! value arriving under that name in the same command (`RESTORE ...
//! REPLACE`, `RENAME` or `COPY ... REPLACE` onto an existing key, `DEBUG
//! RELOAD ... MERGE`) can be held to the one it replaced
//! (`background/events.rs`, `arrived`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// The last fence of a value an unlink took from under a name: a lease's
/// fence, a record's highest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Floor {
    Lease(u64),
    Record(u64),
}

/// One unlinked value's note; its key buffer is reused.
struct Removed {
    db: i32,
    key: Vec<u8>,
    floor: Option<Floor>,
}

/// The last two values unlinked, so that the value arriving under a name in
/// the same command (`restore`, `rename_to`, `copy_to`) can be held to the
/// one it replaced. Two, because `RENAME src dst` unlinks dst's value and
/// then src's before `rename_to`. Forgotten at every other removal event,
/// at a flush and at the module's own deletions.
struct Removals {
    slots: [Removed; 2],
    next: usize,
}

static REMOVED: Mutex<Removals> = Mutex::new(Removals {
    slots: [
        Removed {
            db: 0,
            key: Vec::new(),
            floor: None,
        },
        Removed {
            db: 0,
            key: Vec::new(),
            floor: None,
        },
    ],
    next: 0,
});

/// Whether a note may be there: read without the lock by the key events
/// every `DEL` of any key sends.
static NOTED: AtomicBool = AtomicBool::new(false);

fn removals() -> std::sync::MutexGuard<'static, Removals> {
    REMOVED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Called by the types' unlink callbacks for every value of ours that
/// leaves the keyspace.
pub fn note_removed(db: i32, key: &[u8], floor: Floor) {
    let mut removals = removals();
    let at = removals.next;
    removals.next = 1 - at;
    let slot = &mut removals.slots[at];
    slot.db = db;
    slot.key.clear();
    slot.key.extend_from_slice(key);
    slot.floor = Some(floor);
    NOTED.store(true, Ordering::Relaxed);
}

/// Whether an unlink left a note no arrival has taken yet.
pub fn any_removed() -> bool {
    NOTED.load(Ordering::Relaxed) && removals().slots.iter().any(|s| s.floor.is_some())
}

/// Forgets the notes: the removals they describe are done with.
pub fn forget_removed() {
    if !NOTED.swap(false, Ordering::Relaxed) {
        return;
    }
    let mut removals = removals();
    for slot in &mut removals.slots {
        slot.floor = None;
    }
}

/// The floor of the value just replaced under `key`, if one was; forgets
/// the notes either way.
pub fn take_removed(db: i32, key: &[u8]) -> Option<Floor> {
    if !NOTED.swap(false, Ordering::Relaxed) {
        return None;
    }
    let mut removals = removals();
    let floor = removals
        .slots
        .iter()
        .find(|s| s.floor.is_some() && s.db == db && s.key == key)
        .and_then(|s| s.floor);
    for slot in &mut removals.slots {
        slot.floor = None;
    }
    floor
}
