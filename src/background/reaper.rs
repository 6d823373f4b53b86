//! The reaper: a module timer that, on a primary, deletes expired lease keys
//! nobody waits for (replicating each `DEL`), wakes waiters of expired
//! leases, and rebuilds the deadline index by scanning after a load or a
//! promotion. Work per tick is bounded (`lease.reap-batch` keys, `TICK_BUDGET`
//! of time, a fixed scan budget); a tick that leaves work behind schedules
//! the next as soon as the server's timers allow (1 ms), serving the clients
//! in between.

use std::os::raw::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use redis_module::raw;

use crate::keyspace::commit::values;
use crate::keyspace::commit::{commit, commit_reaped, Deletions, On};
use crate::keyspace::sessions::{self, Lookup};
use crate::keyspace::state;
use crate::keyspace::wake;
use crate::model::change::Change;
use crate::model::config;
use crate::model::index::Due;
use crate::model::lease::Lease;
use crate::model::notifications;
use crate::rm::{self, api, Ctx, Key, OwnedString, RString, Slot};

/// Keys a rebuild scan visits per tick.
const SCAN_BUDGET: usize = 2_000;

/// Longest a tick works before it hands the event loop back: the longest a
/// client waits behind the reaper, whatever a key costs (the server's own
/// fast expire cycle takes 1 ms too).
const TICK_BUDGET: std::time::Duration = std::time::Duration::from_millis(1);

/// Keys between two looks at the clock (about 1 µs each).
const CLOCK_EVERY: usize = 8;

/// Keys of an ended session settled with one read of the session (and
/// one look at the clock).
const SETTLE_STEP: usize = 32;

/// A tick's time: spent once `TICK_BUDGET` has passed since it began.
struct Budget(std::time::Instant);

impl Budget {
    /// Whether the tick should stop, after `taken` keys: the clock is read
    /// every `CLOCK_EVERY` of them.
    fn spent(&self, taken: usize) -> bool {
        taken % CLOCK_EVERY == 0 && taken > 0 && self.over()
    }

    fn over(&self) -> bool {
        self.0.elapsed() >= TICK_BUDGET
    }
}

struct Rescan {
    db: i32,
    cursor: *mut raw::RedisModuleScanCursor,
}

// SAFETY: the cursor is only created, used and destroyed on the server's
// main thread (at load, in events and in timer callbacks); the Mutex that
// needs `Send` never hands it to another thread.
unsafe impl Send for Rescan {}

static RESCAN: Mutex<Option<Rescan>> = Mutex::new(None);

/// The server's `latency-monitor-threshold` in ms, 0 when the monitor is
/// off; read at load and on every change of it.
static LATENCY_THRESHOLD_MS: AtomicU64 = AtomicU64::new(0);

/// Re-reads `latency-monitor-threshold`.
pub fn refresh_latency_threshold(ctx: Ctx) {
    let ms = rm::config_get(ctx, "latency-monitor-threshold")
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    LATENCY_THRESHOLD_MS.store(ms, Ordering::Relaxed);
}

/// Reports a tick as the `lease-reap` latency event when the monitor is on
/// and the tick reached its threshold, as Redis reports its own
/// `expire-cycle`.
fn report_tick(took: std::time::Duration) {
    let threshold = LATENCY_THRESHOLD_MS.load(Ordering::Relaxed);
    let ms = u64::try_from(took.as_millis()).unwrap_or(u64::MAX);
    if threshold > 0 && ms >= threshold {
        rm::latency_sample(c"lease-reap", ms);
    }
}

pub fn start(ctx: Ctx) {
    // The index is empty at load: nothing is due that a sweep would take.
    SWEPT_AT.store(rm::now_ms(), Ordering::Relaxed);
    schedule(ctx, config::reap_interval_ms());
}

fn schedule(ctx: Ctx, after_ms: i64) {
    // SAFETY: `ctx` is valid by the handle rule; the timer carries no data,
    // and `tick` is a function of the module, which is never unloaded.
    unsafe {
        api!(RedisModule_CreateTimer)(ctx, after_ms.max(1), Some(tick), std::ptr::null_mut())
    };
}

/// Rebuilds the deadline index from the keyspace, a little each tick.
pub fn rescan() {
    values::index_cleared();
    start_scan();
}

/// Indexes every lease in the keyspace, a little each tick, beside the
/// entries the index has (keys that arrived by atomic slot migration).
pub fn scan_keyspace() {
    start_scan();
}

fn start_scan() {
    let mut rescan = RESCAN.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(old) = rescan.take() {
        // SAFETY: `old.cursor` was created by ScanCursorCreate and is
        // destroyed once: the Rescan holding it is gone after this.
        unsafe { api!(RedisModule_ScanCursorDestroy)(old.cursor) };
    }
    // SAFETY: takes no argument; the cursor is the new Rescan's.
    let cursor = unsafe { api!(RedisModule_ScanCursorCreate)() };
    *rescan = Some(Rescan { db: 0, cursor });
}

/// # Safety
/// `ctx` is a timer callback's context, valid for the call.
unsafe extern "C" fn tick(ctx: Ctx, _data: *mut c_void) {
    let next = rm::guard("reaper", config::reap_interval_ms, || {
        let interval = config::reap_interval_ms();
        // On replicas too: the filter is about the keyspace, not the role.
        crate::background::armed::disarm_when_idle(rm::now_ms());
        if !state::is_primary() {
            return interval;
        }
        if rm::writes_paused() {
            // Deleting or handing over an expired lease writes; the server's
            // own active expiry waits out a pause the same way.
            HELD_BACK.store(true, Ordering::Relaxed);
            return wake::PAUSED_RETRY_MS;
        }
        HELD_BACK.store(false, Ordering::Relaxed);
        let now = rm::now_ms();
        let batch = config::reap_batch();
        let budget = Budget(std::time::Instant::now());
        let swept = reap(ctx, now, batch, &budget);
        if swept {
            SWEPT_AT.store(now, Ordering::Relaxed);
        }
        let settled = reap_ended(ctx, now, batch, &budget);
        let scanning = scan_step(ctx);
        report_tick(budget.0.elapsed());
        if !swept || !settled || scanning {
            // The soonest the server fires a module timer.
            return 1;
        }
        // Wake for the next deadline, so waiters get an expired lease on time.
        match state::index().next_deadline() {
            Some(d) if d > now => interval.min((d - now) as i64),
            Some(_) => 1,
            None => interval,
        }
    });
    schedule(ctx, next);
}

/// Handles up to `batch` due index entries, within the tick's `budget`;
/// returns whether it took every entry due at `now`. The keys it deletes
/// replicate as one `DEL` per database per batch (`commit::Deletions`).
fn reap(ctx: Ctx, now: u64, batch: usize, budget: &Budget) -> bool {
    let mut taken = 0;
    let mut deleted = Deletions::default();
    while taken < batch && !budget.spent(taken) {
        let Some(entry) = state::index().pop_due(now) else {
            break;
        };
        taken += 1;
        if !rm::select_db(ctx, entry.db()) {
            continue;
        }
        let name = OwnedString::new(ctx, entry.key());
        reap_key(ctx, &entry, name, now, &mut deleted);
    }
    deleted.flush(ctx);
    !state::index().next_deadline().is_some_and(|d| d <= now)
}

/// Looks at one due key: an expired one (or a free record nobody waits
/// for) is deleted, one with waiters is offered to them, a live one is
/// indexed again.
fn reap_key(ctx: Ctx, entry: &Due, name: OwnedString, now: u64, deleted: &mut Deletions) {
    let (db, key_bytes) = (entry.db(), entry.key());
    // Read first: closing a key opened for writing touches it for WATCH and
    // client tracking, which a lease found live must not be.
    let Some(mut key) = Key::open_read(ctx, name.as_ptr()) else {
        return;
    };
    let Slot::Ours(lease) = key.value::<Lease>() else {
        // Deleted, renamed or replaced since it was indexed.
        return;
    };
    let mut lookup = Lookup::new(ctx, now);
    if lease.is_live(now, &mut lookup) && !lease.has_expired_hold(now) {
        // Renewed since it was indexed, or an older entry of a key that has
        // another: the lease needs one entry, at its deadline, unless it has
        // one elsewhere that is not later.
        let elsewhere = lease.index_mark().is_some_and(|at| {
            at != entry.deadline_ms() && state::index().contains(at, db, key_bytes)
        });
        if !elsewhere {
            commit(
                ctx,
                name.as_ptr(),
                On::Lease(lease),
                None,
                Change::reindexed(),
            );
        }
        return;
    }
    if lease.is_extended() {
        drop(key);
        return settle_key(ctx, db, name, now, &mut lookup, deleted);
    }
    let recheck_at = now.saturating_add(config::reap_interval_ms() as u64);
    if state::waiting_on(db, key_bytes) {
        // Expired with a queue: the head waiter takes it now. The key keeps
        // an entry, to be looked at again after the waiter's grant.
        drop(key);
        return commit(
            ctx,
            name.as_ptr(),
            On::Name,
            None,
            Change::offered(recheck_at),
        );
    }
    let expired = lease.deadline().is_some();
    // Its entry was just taken: the unlink has none to remove.
    lease.set_index_mark(None);
    drop(key);
    let Some(mut key) = Key::open_write(ctx, name.as_ptr()) else {
        return;
    };
    commit_reaped(
        ctx,
        db,
        name,
        On::Key(&mut key),
        Change::reaped(expired),
        deleted,
    );
}

/// Carries out what time and ended sessions did to an extended lease
/// (`Change::settled`).
fn settle_key(
    ctx: Ctx,
    db: i32,
    name: OwnedString,
    now: u64,
    lookup: &mut Lookup,
    deleted: &mut Deletions,
) {
    let Some(mut key) = Key::open_write(ctx, name.as_ptr()) else {
        return;
    };
    let Slot::Ours(lease) = key.value::<Lease>() else {
        return;
    };
    if !lease.is_extended() {
        // Granted anew in the compact form since it was queued: no bound
        // hold, and its deadline is the index's business.
        return;
    }
    let own_session = sessions::session_grant(lease);
    let waiting = state::waiting_on(db, rm::bytes(&name.as_ptr()));
    let recheck_at = now.saturating_add(config::reap_interval_ms() as u64);
    let change = Change::settled(lease, now, lookup, own_session, waiting, recheck_at);
    commit_reaped(ctx, db, name, On::Key(&mut key), change, deleted);
}

/// Reaps, up to `batch` keys and within the tick's `budget`, the bound
/// holds of sessions that ended; returns whether it settled them all.
fn reap_ended(ctx: Ctx, now: u64, batch: usize, budget: &Budget) -> bool {
    let mut taken = 0;
    let mut deleted = Deletions::default();
    let mut settled = false;
    while taken < batch && !(taken > 0 && budget.over()) {
        let next = {
            let mut index = state::bound();
            let Some(ended) = index.next_ended() else {
                settled = true;
                break;
            };
            let announce = !ended.announced;
            ended.announced = true;
            let keys = ended.next_keys((batch - taken).min(SETTLE_STEP));
            if keys.is_empty() {
                index.finish_ended();
                continue;
            }
            (ended.db, ended.session.clone(), announce, keys)
        };
        let (db, session, announce, keys) = next;
        if !rm::select_db(ctx, db) {
            taken += keys.len();
            continue;
        }
        if announce {
            let name = OwnedString::new(ctx, &session);
            let change = Change::announced(notifications::SESSION_END);
            commit(ctx, name.as_ptr(), On::Name, None, change);
        }
        // One lookup for the batch: its keys are bound to the one session
        // that ended, read once rather than once a key.
        let mut lookup = Lookup::new(ctx, now);
        for key in keys {
            taken += 1;
            let name = OwnedString::new(ctx, &key);
            settle_key(ctx, db, name, now, &mut lookup, &mut deleted);
        }
    }
    deleted.flush(ctx);
    settled
}

struct ScanState {
    db: i32,
    visited: usize,
    /// Lease keys and records found with a Redis TTL (an RDB or AOF written
    /// before TTLs were removed): they lose it once the scan step is done.
    with_ttl: Vec<Box<[u8]>>,
}

/// Advances the rebuild scan; returns whether it has more to do.
fn scan_step(ctx: Ctx) -> bool {
    let mut guard = RESCAN.lock().unwrap_or_else(|e| e.into_inner());
    let Some(rescan) = guard.as_mut() else {
        return false;
    };
    let mut state = ScanState {
        db: rescan.db,
        visited: 0,
        with_ttl: Vec::new(),
    };
    while state.visited < SCAN_BUDGET {
        if !rm::select_db(ctx, rescan.db) {
            // Past the last database: done.
            // SAFETY: the cursor is the Rescan's, destroyed once: the
            // Rescan is dropped right after.
            unsafe { api!(RedisModule_ScanCursorDestroy)(rescan.cursor) };
            *guard = None;
            return false;
        }
        state.db = rescan.db;
        // SAFETY: `ctx` is the timer's context, with the scanned database
        // selected; the cursor is the Rescan's, live; `index_scanned_key`
        // reads the private data as the `ScanState` it is, which outlives
        // the call (Scan calls back only during it).
        let more = unsafe {
            api!(RedisModule_Scan)(
                ctx,
                rescan.cursor,
                Some(index_scanned_key),
                (&mut state as *mut ScanState).cast(),
            )
        };
        persist_all(ctx, &mut state.with_ttl);
        if more == 0 {
            rescan.db += 1;
            // SAFETY: the cursor is the Rescan's, live.
            unsafe { api!(RedisModule_ScanCursorRestart)(rescan.cursor) };
        }
    }
    true
}

/// Removes the Redis TTL of each key (in the selected database) and
/// replicates that.
fn persist_all(ctx: Ctx, names: &mut Vec<Box<[u8]>>) {
    for name in names.drain(..) {
        let name = OwnedString::new(ctx, &name);
        if let Some(mut key) = Key::open_write(ctx, name.as_ptr()) {
            if key.persist() {
                drop(key);
                values::persisted(ctx, name.as_ptr());
            }
        }
    }
}

/// # Safety
/// Called back by `RedisModule_Scan` in `scan_step`: `name` and `key` (or
/// null) are the scanned key's, valid for the call, and `privdata` is the
/// `ScanState` passed to Scan, used by nothing else meanwhile.
unsafe extern "C" fn index_scanned_key(
    _ctx: Ctx,
    name: RString,
    key: *mut raw::RedisModuleKey,
    privdata: *mut c_void,
) {
    rm::guard(
        "index scan",
        || (),
        // SAFETY: `name`, `key` and `privdata` are as Scan passed them to
        // this callback, which is what `index_scanned` needs.
        || unsafe { index_scanned(name, key, privdata) },
    );
}

/// One key of the rebuild scan.
///
/// # Safety
/// As `index_scanned_key`.
unsafe fn index_scanned(name: RString, key: *mut raw::RedisModuleKey, privdata: *mut c_void) {
    // SAFETY: `privdata` is `scan_step`'s ScanState, which it does not touch
    // while Scan runs (the caller's promise).
    let Some(state) = (unsafe { privdata.cast::<ScanState>().as_mut() }) else {
        return;
    };
    state.visited += 1;
    // SAFETY: `key` is the open key Scan lends this callback; the Key is
    // dropped (never closed) before it returns.
    let Some(mut key) = (unsafe { Key::borrowed(key) }) else {
        return;
    };
    let ours = match key.value::<Lease>() {
        Slot::Ours(lease) => {
            // A free record (kept for waiters) is due at once: the reaper
            // deletes it if its queue is gone. Marks from before the index
            // was cleared are stale: every key gets its entry again.
            let due = lease.deadline().unwrap_or(0);
            values::scanned(state.db, rm::bytes(&name), due);
            lease.set_index_mark(Some(due));
            state::fences().observe(lease.fence(), rm::now_ms());
            true
        }
        Slot::WrongType => matches!(key.value::<crate::model::lease::Resource>(), Slot::Ours(_)),
        Slot::Empty => false,
    };
    if ours && key.has_ttl() {
        state.with_ttl.push(rm::bytes(&name).into());
    }
}

/// The clock of the reaper's last tick that took every due entry (or of
/// the module's load, when the index was empty), and whether its last tick
/// found writes paused: what `LEASE.DEBUG CHECK` needs to tell an entry the
/// reaper left behind from one that arrived since it swept (`model::check`).
/// Such a tick leaves no entry at or before its clock: what it keeps, it
/// puts at later deadlines.
static SWEPT_AT: AtomicU64 = AtomicU64::new(0);
static HELD_BACK: AtomicBool = AtomicBool::new(false);

/// When the reaper last took every due entry (`None` before the load).
pub fn swept_at() -> Option<u64> {
    Some(SWEPT_AT.load(Ordering::Relaxed)).filter(|&at| at != 0)
}

/// Whether its last tick found writes paused (it waits them out).
pub fn held_back() -> bool {
    HELD_BACK.load(Ordering::Relaxed)
}

/// Whether the deadline index is being rebuilt by a scan.
pub fn rescanning() -> bool {
    RESCAN.lock().unwrap_or_else(|e| e.into_inner()).is_some()
}
