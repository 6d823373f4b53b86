//! Node-wide state: the fence sequence, the deadline index, the node's role
//! and the INFO counters.
//!
//! Redis runs module callbacks on its main thread (and, for `BGSAVE`, in a
//! forked child), so the locks below are never contended; they exist to make
//! the statics safe, not to coordinate threads.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard};

use crate::index::DeadlineIndex;
use crate::lease::{FenceSequence, Lease, WaitQueues};

static FENCES: Mutex<FenceSequence> = Mutex::new(FenceSequence::new());
static INDEX: Mutex<DeadlineIndex> = Mutex::new(DeadlineIndex::new());
static WAITERS: LazyLock<Mutex<WaitQueues>> = LazyLock::new(Default::default);
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

/// Clients blocked in `LEASE.ACQUIRE ... BLOCK`, per key.
pub fn waiters() -> MutexGuard<'static, WaitQueues> {
    lock(&WAITERS)
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
};

pub fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

pub fn drop_one(counter: &AtomicU64) {
    // Saturating: a gauge must not wrap if a free ever outruns its create.
    let _ = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| v.checked_sub(1));
}

pub fn read(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}
