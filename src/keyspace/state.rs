//! Node-wide state: the fence sequence, the deadline index, the node's role
//! and the INFO counters.
//!
//! Redis runs module callbacks on its main thread (and, for `BGSAVE`, in a
//! forked child), so the locks below are never contended; they exist to make
//! the statics safe, not to coordinate threads.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard, OnceLock};

use crate::model::index::DeadlineIndex;
use crate::model::lease::{FenceSequence, Lease, WaitQueues};
use crate::model::sessions::BoundIndex;
use crate::rm::{self, Ctx};

static FENCES: Mutex<FenceSequence> = Mutex::new(FenceSequence::new());
static INDEX: Mutex<DeadlineIndex> = Mutex::new(DeadlineIndex::new());
static WAITERS: LazyLock<Mutex<WaitQueues>> = LazyLock::new(Default::default);
static BOUND: LazyLock<Mutex<BoundIndex>> = LazyLock::new(Default::default);
static PRIMARY: AtomicBool = AtomicBool::new(true);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic caught at the FFI edge may have poisoned the lock; the data
    // is plain values that are valid in every state.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn fences() -> MutexGuard<'static, FenceSequence> {
    lock(&FENCES)
}

/// The deadline index. Only a primary keeps it; a replica rebuilds it by
/// scanning when it is promoted.
pub fn index() -> MutexGuard<'static, DeadlineIndex> {
    lock(&INDEX)
}

/// Gives a held lease an index entry at its deadline unless it has one
/// already, and marks the lease with where it is. Only a primary keeps the
/// index: it is the only node that reaps.
pub fn index_lease(db: i32, key: &[u8], lease: &mut Lease) {
    if !is_primary() || lease.index_mark().is_some() {
        return;
    }
    if let Some(deadline) = lease.deadline() {
        index().insert(deadline, db, key);
        lease.set_index_mark(Some(deadline));
    }
}

/// Key names that have held a lease or a record on this node, as one bit
/// of a hash each: the `expire` notification (sent by every `SET ... EX`
/// and `EXPIRE` of any key on the server) looks a key up only when its name
/// may be one of ours, so the module costs other keys' TTLs a hash, not a
/// key lookup. Set, never unset but by a flush of every database: a stale
/// bit costs one needless lookup.
const NAME_BITS: usize = 1 << 20;
static NAMES: [AtomicU64; NAME_BITS / 64] = [const { AtomicU64::new(0) }; NAME_BITS / 64];

/// FNV-1a over the name: a word and a bit of `NAMES`.
fn name_bit(key: &[u8]) -> (usize, u64) {
    let hash = key.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    let bit = (hash as usize) % NAME_BITS;
    (bit / 64, 1 << (bit % 64))
}

/// `key` holds a lease or a record now.
pub fn note_name(key: &[u8]) {
    let (word, bit) = name_bit(key);
    if let Some(w) = NAMES.get(word) {
        w.fetch_or(bit, Ordering::Relaxed);
    }
}

/// Whether `key` may hold a lease or a record (false: it never did).
pub fn may_be_ours(key: &[u8]) -> bool {
    let (word, bit) = name_bit(key);
    NAMES
        .get(word)
        .is_some_and(|w| w.load(Ordering::Relaxed) & bit != 0)
}

/// What the module costs the server's other commands, paid only while it
/// holds something: the key-event subscription from its first value on
/// (the server has no way to end one), the command filter while lease keys
/// exist. `background::events` installs the two functions at load; the
/// types call `arm_leases` and `arm_records` as they store or load a value,
/// which costs them a load of one flag once armed.
static LEASES_ARMED: AtomicBool = AtomicBool::new(false);
static RECORDS_ARMED: AtomicBool = AtomicBool::new(false);
static ARM_LEASES: OnceLock<fn()> = OnceLock::new();
static ARM_RECORDS: OnceLock<fn()> = OnceLock::new();

/// Installs what arms the module for leases (filter and events) and for
/// records (events).
pub fn set_armers(leases: fn(), records: fn()) {
    let _ = ARM_LEASES.set(leases);
    let _ = ARM_RECORDS.set(records);
}

/// A lease value is about to exist: the filter and the key events must be on.
#[inline]
pub fn arm_leases() {
    arm(&LEASES_ARMED, &ARM_LEASES);
}

/// A resource record is about to exist: the key events must be on.
#[inline]
pub fn arm_records() {
    arm(&RECORDS_ARMED, &ARM_RECORDS);
}

#[inline]
fn arm(armed: &AtomicBool, how: &OnceLock<fn()>) {
    if !armed.load(Ordering::Relaxed) {
        if let Some(arm) = how.get() {
            arm();
        }
        armed.store(true, Ordering::Relaxed);
    }
}

/// The command filter was taken off (no lease key for a while): the next
/// lease value arms it again.
pub fn disarm_leases() {
    LEASES_ARMED.store(false, Ordering::Relaxed);
}

pub fn leases_armed() -> bool {
    LEASES_ARMED.load(Ordering::Relaxed)
}

/// Every database was flushed: no name holds anything of ours.
pub fn forget_names() {
    NAMES.iter().for_each(|w| w.store(0, Ordering::Relaxed));
}

/// Keys whose waiters must be offered the lease again: the queue head left
/// unserved (timeout, disconnect), or the key vanished or changed type under
/// its waiters (`DEL`, `RENAME`, an overwrite, eviction, a flush). Handled by
/// a one-shot timer a millisecond later, outside the callback that noticed
/// it: the effects layer's, installed at load, so that the types' unlink
/// callbacks can ask for it without calling upwards.
static WAKES: Mutex<Vec<(i32, Box<[u8]>)>> = Mutex::new(Vec::new());
static WAKE_ARMED: AtomicBool = AtomicBool::new(false);
static WAKER: OnceLock<unsafe extern "C" fn(Ctx, *mut std::os::raw::c_void)> = OnceLock::new();

pub fn set_waker(waker: unsafe extern "C" fn(Ctx, *mut std::os::raw::c_void)) {
    let _ = WAKER.set(waker);
}

/// Queues `key`'s waiters for a wake and arms the timer.
pub fn wake_later(ctx: Ctx, db: i32, key: &[u8]) {
    {
        let mut pending = lock(&WAKES);
        // One removal can be reported twice (its unlink, then its event).
        if !pending.iter().any(|(d, k)| *d == db && **k == *key) {
            pending.push((db, key.into()));
        }
    }
    if let Some(&waker) = WAKER.get() {
        if !WAKE_ARMED.swap(true, Ordering::Relaxed) {
            rm::timer(ctx, 1, waker);
        }
    }
}

/// The queued wakes, for the timer; it may arm itself again.
pub fn take_wakes() -> Vec<(i32, Box<[u8]>)> {
    WAKE_ARMED.store(false, Ordering::Relaxed);
    std::mem::take(&mut *lock(&WAKES))
}

/// Clients blocked in `LEASE.ACQUIRE ... BLOCK`, per key.
/// Which keys hold holds bound to which session (`model::sessions`).
pub fn bound() -> MutexGuard<'static, BoundIndex> {
    lock(&BOUND)
}

pub fn waiters() -> Waiters {
    Waiters(lock(&WAITERS))
}

/// Whether any client waits, kept by `Waiters`: read without the lock by
/// the key events every `DEL` of any key sends, and by the reaper and the
/// unlink of each lease key.
static ANY_WAITING: AtomicBool = AtomicBool::new(false);

/// Whether clients wait for `key` in `db`; no lock while nobody waits.
pub fn waiting_on(db: i32, key: &[u8]) -> bool {
    ANY_WAITING.load(Ordering::Relaxed) && waiters().len(db, key) > 0
}

/// The wait queues, locked; `ANY_WAITING` is brought up to date as the lock
/// is let go.
pub struct Waiters(MutexGuard<'static, WaitQueues>);

impl std::ops::Deref for Waiters {
    type Target = WaitQueues;
    fn deref(&self) -> &WaitQueues {
        &self.0
    }
}

impl std::ops::DerefMut for Waiters {
    fn deref_mut(&mut self) -> &mut WaitQueues {
        &mut self.0
    }
}

impl Drop for Waiters {
    fn drop(&mut self) {
        ANY_WAITING.store(!self.0.is_empty(), Ordering::Relaxed);
    }
}

/// Whether the server runs in cluster mode (read at load).
static CLUSTER: AtomicBool = AtomicBool::new(false);
/// Atomic slot migrations this node is importing now (Valkey 9+).
static SLOT_IMPORTS: AtomicU64 = AtomicU64::new(0);

pub fn is_cluster() -> bool {
    CLUSTER.load(Ordering::Relaxed)
}

pub fn set_cluster(cluster: bool) {
    CLUSTER.store(cluster, Ordering::Relaxed);
}

/// Whether slots are being imported into this node, whose import client
/// then sends effects to a primary.
pub fn importing_slots() -> bool {
    SLOT_IMPORTS.load(Ordering::Relaxed) > 0
}

pub fn import_started() {
    bump(&SLOT_IMPORTS);
}

pub fn import_ended() {
    drop_one(&SLOT_IMPORTS);
}

pub fn is_primary() -> bool {
    PRIMARY.load(Ordering::Relaxed)
}

pub fn set_primary(primary: bool) {
    PRIMARY.store(primary, Ordering::Relaxed);
}

/// Counters and gauges reported by `INFO lease`.
pub struct Stats {
    pub lease_keys: AtomicU64,
    pub resource_keys: AtomicU64,
    pub grants: AtomicU64,
    pub waiter_grants: AtomicU64,
    pub block_timeouts: AtomicU64,
    pub retries: AtomicU64,
    pub contended: AtomicU64,
    pub renewals: AtomicU64,
    pub renewals_rejected: AtomicU64,
    pub releases: AtomicU64,
    pub releases_rejected: AtomicU64,
    pub expired: AtomicU64,
    pub fence_accepted: AtomicU64,
    pub fence_rejected: AtomicU64,
    pub evicted: AtomicU64,
    pub restored: AtomicU64,
    pub eviction_refused: AtomicU64,
    /// Shared holds stored, live or not yet reaped.
    pub shared_holds: AtomicU64,
    /// Bound holds freed by their session's end.
    pub session_expiries: AtomicU64,
    /// Lock-delays started.
    pub delays: AtomicU64,
}

pub static STATS: Stats = Stats {
    lease_keys: AtomicU64::new(0),
    resource_keys: AtomicU64::new(0),
    grants: AtomicU64::new(0),
    waiter_grants: AtomicU64::new(0),
    block_timeouts: AtomicU64::new(0),
    retries: AtomicU64::new(0),
    contended: AtomicU64::new(0),
    renewals: AtomicU64::new(0),
    renewals_rejected: AtomicU64::new(0),
    releases: AtomicU64::new(0),
    releases_rejected: AtomicU64::new(0),
    expired: AtomicU64::new(0),
    fence_accepted: AtomicU64::new(0),
    fence_rejected: AtomicU64::new(0),
    evicted: AtomicU64::new(0),
    restored: AtomicU64::new(0),
    eviction_refused: AtomicU64::new(0),
    shared_holds: AtomicU64::new(0),
    session_expiries: AtomicU64::new(0),
    delays: AtomicU64::new(0),
};

pub fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

pub fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

/// Moves the `shared_holds` gauge by a value's change from `before` to
/// `after` shared holds.
pub fn shared_holds_moved(before: usize, after: usize) {
    if after > before {
        add(&STATS.shared_holds, (after - before) as u64);
    } else if before > after {
        let gone = (before - after) as u64;
        let _ = STATS
            .shared_holds
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(gone))
            });
    }
}

pub fn drop_one(counter: &AtomicU64) {
    // Saturating: a gauge must not wrap if a free ever outruns its create.
    let _ = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| v.checked_sub(1));
}

pub fn read(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn noted_names_may_be_ours_and_others_mostly_not() {
        let ours: Vec<Vec<u8>> = (0..1000)
            .map(|i| format!("lock:{i}").into_bytes())
            .collect();
        ours.iter().for_each(|k| note_name(k));
        assert!(ours.iter().all(|k| may_be_ours(k)));
        // 1,000 noted names in 2^20 bits: other names collide rarely.
        let collisions = (0..10_000)
            .filter(|i| may_be_ours(format!("cache:{i}").as_bytes()))
            .count();
        assert!(collisions < 100, "{collisions}");
        forget_names();
        assert!(!ours.iter().any(|k| may_be_ours(k)));
    }
}
