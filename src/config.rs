//! Module configs: `CONFIG SET lease.<name>`, `lease.<name>` lines in
//! redis.conf after `loadmodule`, or `<name> <value>` pairs as `loadmodule`
//! arguments.

use std::sync::atomic::{AtomicI64, Ordering};

/// Most expired lease keys the reaper deletes in one tick. Bounds the time
/// one tick holds the event loop (about 1 µs per key).
pub const REAP_BATCH_DEFAULT: i64 = 200;
pub const REAP_BATCH_MIN: i64 = 1;
pub const REAP_BATCH_MAX: i64 = 100_000;

/// Reaper ticks per second while nothing is due. A tick that fills its batch
/// schedules the next one at once (1 ms), so a backlog drains quickly
/// without any single tick growing.
pub const REAP_HZ_DEFAULT: i64 = 10;
pub const REAP_HZ_MIN: i64 = 1;
pub const REAP_HZ_MAX: i64 = 1_000;

pub static REAP_BATCH: AtomicI64 = AtomicI64::new(REAP_BATCH_DEFAULT);
pub static REAP_HZ: AtomicI64 = AtomicI64::new(REAP_HZ_DEFAULT);

pub fn reap_batch() -> usize {
    REAP_BATCH
        .load(Ordering::Relaxed)
        .clamp(REAP_BATCH_MIN, REAP_BATCH_MAX) as usize
}

pub fn reap_interval_ms() -> i64 {
    1000 / REAP_HZ
        .load(Ordering::Relaxed)
        .clamp(REAP_HZ_MIN, REAP_HZ_MAX)
}
