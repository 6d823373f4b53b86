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

/// Most live holds one key may have, shared or not, also under a larger
/// `LIMIT`: a bound on the memory and the work one key can cost.
pub const MAX_HOLDERS_DEFAULT: i64 = 10_000;
pub const MAX_HOLDERS_MIN: i64 = 1;
pub const MAX_HOLDERS_MAX: i64 = 1_000_000;

pub static MAX_HOLDERS: AtomicI64 = AtomicI64::new(MAX_HOLDERS_DEFAULT);

pub fn max_holders() -> usize {
    MAX_HOLDERS
        .load(Ordering::Relaxed)
        .clamp(MAX_HOLDERS_MIN, MAX_HOLDERS_MAX) as usize
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

/// A numeric config: name, the static it sets, bounds.
struct Numeric {
    name: &'static str,
    value: &'static AtomicI64,
    min: i64,
    max: i64,
}

const NUMERIC: &[Numeric] = &[
    Numeric {
        name: "reap-batch",
        value: &REAP_BATCH,
        min: REAP_BATCH_MIN,
        max: REAP_BATCH_MAX,
    },
    Numeric {
        name: "reap-hz",
        value: &REAP_HZ,
        min: REAP_HZ_MIN,
        max: REAP_HZ_MAX,
    },
    Numeric {
        name: "max-waiters",
        value: &MAX_WAITERS,
        min: MAX_WAITERS_MIN,
        max: MAX_WAITERS_MAX,
    },
    Numeric {
        name: "max-holders",
        value: &MAX_HOLDERS,
        min: MAX_HOLDERS_MIN,
        max: MAX_HOLDERS_MAX,
    },
];

/// The one config whose value is a name.
pub const ALLKEYS_EVICTION: &str = "allkeys-eviction";
pub const ALLKEYS_EVICTION_CHOICES: &[&str] = &["refuse", "restore", "allow"];

/// The configs a `loadmodule` line may set, as `<name> <value>` pairs.
pub const NAMES: &[&str] = &[
    "reap-batch",
    "reap-hz",
    "max-waiters",
    "max-holders",
    ALLKEYS_EVICTION,
];

/// `inject-panic <names>`: accepted only by a `fault-injection` build.
pub const INJECT_PANIC: &str = "inject-panic";

/// One `loadmodule` argument pair, checked.
#[derive(Debug, PartialEq, Eq)]
pub enum Setting {
    Number(&'static str, i64),
    /// `allkeys-eviction` and its value, one of `ALLKEYS_EVICTION_CHOICES`.
    AllkeysEviction(&'static str),
    /// `inject-panic` and the guard names to arm (`fault-injection` builds).
    InjectPanic(String),
}

/// Checks `loadmodule` arguments as `CONFIG SET` would: an unknown name, a
/// `lease.` prefix, a name without a value, a value that is not a number
/// in range or not a known choice each fail the load with a message that
/// names the argument. `restore_supported`: whether this server can run
/// `allkeys-eviction restore`.
pub fn parse_module_args<'a>(
    args: impl Iterator<Item = &'a [u8]>,
    restore_supported: bool,
) -> Result<Vec<Setting>, String> {
    let args: Vec<&[u8]> = args.collect();
    let mut settings = Vec::new();
    for pair in args.chunks(2) {
        let name = String::from_utf8_lossy(pair[0]);
        if cfg!(feature = "fault-injection") && name == INJECT_PANIC {
            let value = pair.get(1).map(|v| String::from_utf8_lossy(v).into_owned());
            settings.push(Setting::InjectPanic(value.unwrap_or_default()));
            continue;
        }
        let Some(&known) = NAMES.iter().find(|&&n| n == name) else {
            return Err(format!(
                "unknown module argument '{}': pass configs as '<name> <value>' pairs, names: {}",
                printable(&name),
                NAMES.join(", ")
            ));
        };
        let Some(raw) = pair.get(1) else {
            return Err(format!("module argument '{known}' has no value"));
        };
        let value = String::from_utf8_lossy(raw);
        if known == ALLKEYS_EVICTION {
            let Some(&choice) = ALLKEYS_EVICTION_CHOICES.iter().find(|&&c| c == value) else {
                return Err(format!(
                    "module argument '{known}' must be one of {}, not '{}'",
                    ALLKEYS_EVICTION_CHOICES.join(", "),
                    printable(&value)
                ));
            };
            if choice == "restore" && !restore_supported {
                return Err(format!(
                    "module argument '{known} restore' needs post-notification jobs (Redis 7.2.4 or newer, or Valkey); use refuse or allow"
                ));
            }
            settings.push(Setting::AllkeysEviction(choice));
            continue;
        }
        let Some(numeric) = NUMERIC.iter().find(|n| n.name == known) else {
            return Err(format!("module argument '{known}' is not settable"));
        };
        match value.parse::<i64>() {
            Ok(v) if (numeric.min..=numeric.max).contains(&v) => {
                settings.push(Setting::Number(known, v));
            }
            _ => {
                return Err(format!(
                    "module argument '{known}' must be an integer from {} to {}, not '{}'",
                    numeric.min,
                    numeric.max,
                    printable(&value)
                ))
            }
        }
    }
    Ok(settings)
}

/// Stores a checked numeric setting.
pub fn apply_number(name: &str, value: i64) {
    if let Some(numeric) = NUMERIC.iter().find(|n| n.name == name) {
        numeric.value.store(value, Ordering::Relaxed);
    }
}

/// A client-chosen text as a log line may show it: no control characters,
/// at most 64 characters.
fn printable(s: &str) -> String {
    s.chars()
        .take(64)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str], restore: bool) -> Result<Vec<Setting>, String> {
        parse_module_args(args.iter().map(|a| a.as_bytes()), restore)
    }

    #[test]
    fn module_args_are_name_value_pairs_of_known_configs() {
        assert_eq!(parse(&[], true), Ok(vec![]));
        assert_eq!(
            parse(&["reap-hz", "50", "allkeys-eviction", "allow"], false),
            Ok(vec![
                Setting::Number("reap-hz", 50),
                Setting::AllkeysEviction("allow")
            ])
        );
        assert!(parse(&["lease.reap-hz", "50"], true)
            .unwrap_err()
            .contains("unknown"));
        assert!(parse(&["reap-hz"], true).unwrap_err().contains("no value"));
        assert!(parse(&["bogus", "1"], true).is_err());
    }

    #[test]
    fn module_arg_values_are_checked_as_config_set_checks_them() {
        // (arguments, restore supported, what the error names)
        let refused: &[(&[&str], bool, &str)] = &[
            (
                &["reap-hz", "0"],
                true,
                "'reap-hz' must be an integer from 1 to 1000, not '0'",
            ),
            (
                &["reap-hz", "-1"],
                true,
                "'reap-hz' must be an integer from 1 to 1000",
            ),
            (&["reap-hz", "99999999"], true, "not '99999999'"),
            (
                &["reap-hz", "abc"],
                true,
                "'reap-hz' must be an integer from 1 to 1000, not 'abc'",
            ),
            (
                &["reap-batch", "0"],
                true,
                "'reap-batch' must be an integer from 1 to 100000",
            ),
            (
                &["max-waiters", "0"],
                true,
                "'max-waiters' must be an integer from 1 to 1000000",
            ),
            (
                &["max-waiters", ""],
                true,
                "'max-waiters' must be an integer",
            ),
            (
                &["allkeys-eviction", "maybe"],
                true,
                "one of refuse, restore, allow, not 'maybe'",
            ),
            (
                &["allkeys-eviction", "restore"],
                false,
                "needs post-notification jobs",
            ),
            (&["reap-hz", "a\nb"], true, "not 'a?b'"),
            (&["x\ny", "1"], true, "unknown module argument 'x?y'"),
        ];
        for (args, restore, names) in refused {
            let e = parse(args, *restore).expect_err(&format!("{args:?}"));
            assert!(e.contains(names), "{args:?}: {e}");
            assert!(!e.contains('\n'), "{args:?}: {e}");
        }
        let accepted: &[&[&str]] = &[
            &["reap-hz", "1"],
            &["reap-hz", "1000"],
            &["reap-batch", "100000"],
            &["max-waiters", "1000000"],
            &["allkeys-eviction", "restore"],
        ];
        for args in accepted {
            assert!(parse(args, true).is_ok(), "{args:?}");
        }
    }
}
