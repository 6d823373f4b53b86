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

/// Most clients that may wait in one key's queue: a bound on the memory and
/// the work one busy key can cost.
pub const MAX_WAITERS_DEFAULT: i64 = 10_000;
pub const MAX_WAITERS_MIN: i64 = 1;
pub const MAX_WAITERS_MAX: i64 = 1_000_000;

pub static MAX_WAITERS: AtomicI64 = AtomicI64::new(MAX_WAITERS_DEFAULT);

pub fn max_waiters() -> usize {
    MAX_WAITERS
        .load(Ordering::Relaxed)
        .clamp(MAX_WAITERS_MIN, MAX_WAITERS_MAX) as usize
}

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

/// The configs a `loadmodule` line may set, as `<name> <value>` pairs.
pub const NAMES: &[&str] = &["reap-batch", "reap-hz", "max-waiters", "allkeys-eviction"];

/// Rejects `loadmodule` arguments that would otherwise be ignored silently:
/// an unknown name, a `lease.` prefix, a name without a value.
pub fn check_module_args<'a>(args: impl Iterator<Item = &'a [u8]>) -> Result<(), String> {
    let args: Vec<&[u8]> = args.collect();
    for pair in args.chunks(2) {
        let name = String::from_utf8_lossy(pair[0]);
        if !NAMES.contains(&name.as_ref()) {
            return Err(format!(
                "unknown module argument '{name}': pass configs as '<name> <value>' pairs, names: {}",
                NAMES.join(", ")
            ));
        }
        if pair.len() < 2 {
            return Err(format!("module argument '{name}' has no value"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(args: &[&str]) -> Result<(), String> {
        check_module_args(args.iter().map(|a| a.as_bytes()))
    }

    #[test]
    fn module_args_are_name_value_pairs_of_known_configs() {
        assert!(check(&[]).is_ok());
        assert!(check(&["reap-hz", "50", "allkeys-eviction", "allow"]).is_ok());
        assert!(check(&["lease.reap-hz", "50"])
            .unwrap_err()
            .contains("unknown"));
        assert!(check(&["reap-hz"]).unwrap_err().contains("no value"));
        assert!(check(&["bogus", "1"]).is_err());
    }
}
