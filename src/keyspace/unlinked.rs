//! The copy of a live lease or record that left the keyspace, kept for the
//! `evicted` event that may follow (`background/eviction.rs`): Redis has
//! deleted the value by the time it fires that event. Where the server names
//! evictions in a key event (7.2+, Valkey) the copy comes from there; on
//! Redis 7.0 from the types' unlink callback, which fires for every removal,
//! and only while memory is over `maxmemory` (as it is at every eviction's
//! unlink and never at an overwrite).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use redis_module::raw;

use crate::model::lease::{Lease, Resource};

/// A copy of what was just unlinked from the keyspace.
pub enum Saved {
    Lease(Lease),
    Resource(Resource),
}

pub struct Unlinked {
    pub db: i32,
    pub key: Box<[u8]>,
    pub value: Saved,
    /// Monotonic µs when the copy was taken.
    at_us: u64,
}

static LAST_UNLINKED: Mutex<Option<Unlinked>> = Mutex::new(None);

/// Whether the server names evictions in a key event (Redis 7.2+, Valkey).
static KEY_EVENTS: AtomicBool = AtomicBool::new(false);

/// How long an unlink copy waits for its `evicted` event on Redis 7.0. Both
/// happen in the same eviction step, microseconds of CPU apart, but the
/// server thread can be off its CPU between them for milliseconds on a busy
/// machine (seconds under valgrind), and a copy taken then must still count.
/// The window only bounds how long a copy from a removal that was not an
/// eviction (made by a script that went over `maxmemory`) can wait for an
/// eviction of its key name.
const UNLINK_WINDOW_US: u64 = 1_000_000;

fn monotonic_us() -> u64 {
    // SAFETY: a read of the API table after RedisModule_Init wrote it (see
    // `api!`), `None` where the server lacks the function; `f` takes no
    // argument.
    unsafe { raw::RedisModule_MonotonicMicroseconds }.map_or(0, |f| unsafe { f() })
}

/// Whether a copy may be kept: read without the lock by the key events
/// every `DEL` of any key sends.
static KEPT: AtomicBool = AtomicBool::new(false);

fn store(unlinked: Option<Unlinked>) {
    if unlinked.is_none() && !KEPT.load(Ordering::Relaxed) {
        return;
    }
    KEPT.store(unlinked.is_some(), Ordering::Relaxed);
    *LAST_UNLINKED.lock().unwrap_or_else(|e| e.into_inner()) = unlinked;
}

/// Notes whether the server names evictions in key events.
pub fn set_key_events(supported: bool) {
    KEY_EVENTS.store(supported, Ordering::Relaxed);
}

pub fn key_events() -> bool {
    KEY_EVENTS.load(Ordering::Relaxed)
}

/// Whether the module listens to key events now (see
/// `background::eviction::listen_to_key_events`): then they bring the copy,
/// else the unlink callbacks do.
static LISTENING: AtomicBool = AtomicBool::new(false);

pub fn set_listening(listening: bool) {
    LISTENING.store(listening, Ordering::Relaxed);
}

pub fn listening() -> bool {
    LISTENING.load(Ordering::Relaxed)
}

/// Keeps a copy taken from a key event (or forgets the last one: `None`).
pub fn keep(db: i32, key: &[u8], value: Option<Saved>) {
    store(value.map(|value| Unlinked {
        db,
        key: key.into(),
        value,
        at_us: monotonic_us(),
    }));
}

/// The copy of `key` in `db`, if the last one is of it and recent enough to
/// be of this eviction.
pub fn take(db: i32, key: &[u8]) -> Option<Unlinked> {
    let taken = LAST_UNLINKED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take();
    KEPT.store(false, Ordering::Relaxed);
    let fresh =
        |u: &Unlinked| listening() || monotonic_us().saturating_sub(u.at_us) <= UNLINK_WINDOW_US;
    taken.filter(|u| u.db == db && *u.key == *key && fresh(u))
}

/// Called by the types' unlink callbacks on every removal of one of our
/// values, with a way to copy it when it is a live lease or a record: on
/// servers without key events, takes the copy in case this removal is an
/// eviction (memory is over the limit), and forgets any older copy either
/// way.
pub fn note_unlinked(db: i32, key: &[u8], copy: Option<impl FnOnce() -> Saved>) {
    if listening() {
        return;
    }
    let value = copy.filter(|_| over_maxmemory()).map(|copy| copy());
    keep(db, key, value);
}

/// Memory used over `maxmemory`, as the server counts it for eviction (a
/// ratio of 1 or more; 0 without a limit).
fn over_maxmemory() -> bool {
    // SAFETY: a read of the API table after RedisModule_Init wrote it (see
    // `api!`), `None` where the server lacks the function; `f` takes no
    // argument.
    unsafe { raw::RedisModule_GetUsedMemoryRatio }.is_some_and(|f| unsafe { f() } >= 1.0)
}

/// A removal that was not an eviction (`DEL`, `RENAME`, ...): the copy it
/// left is not owed a restore.
pub fn forget_unlinked() {
    if !listening() {
        store(None);
    }
}
