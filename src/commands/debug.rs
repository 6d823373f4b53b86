//! `LEASE.DEBUG CHECK`: whether the module's own structures (deadline
//! index, bound-hold index, waiter queues, the gauges of `INFO lease`)
//! agree with the keyspace. `OK`, or `ERR lease check: <n> problems: ...`
//! naming the first few. Admin only, never in a script; O(N) in the keys
//! of every database; changes nothing and shows no token. The rules are
//! `model::check`'s; this gathers the facts (`keyspace::audit`, and the
//! reaper's own) and replies.
//!
//! A `fault-injection` build also has `LEASE.DEBUG CORRUPT <what>`, which
//! breaks one structure on purpose, so that tests/debug_check.rs can show
//! each rule failing.

use std::os::raw::c_int;

use crate::background::reaper;
use crate::keyspace::audit;
use crate::model::check::{self, Reaper};
use crate::model::config;
use crate::rm::{self, Ctx, RString};

use super::{command, no_secret};

/// `LEASE.DEBUG CHECK`
pub extern "C" fn debug_command(ctx: Ctx, argv: *mut RString, argc: c_int) -> c_int {
    command("LEASE.DEBUG", ctx, argv, argc, debug, no_secret)
}

fn debug(ctx: Ctx, args: &[RString]) -> c_int {
    // The server answers a call without a subcommand (arity -2).
    let Some(sub) = args.get(1).map(rm::bytes) else {
        return rm::reply_error(
            ctx,
            c"ERR wrong number of arguments for 'lease.debug' command",
        );
    };
    if sub.eq_ignore_ascii_case(b"CHECK") {
        if args.len() != 2 {
            return rm::reply_error(ctx, check::CHECK_ARITY);
        }
        return check(ctx);
    }
    #[cfg(feature = "fault-injection")]
    if sub.eq_ignore_ascii_case(b"CORRUPT") {
        return faults::corrupt(ctx, args.get(2..).unwrap_or_default());
    }
    rm::reply_error_string(ctx, &check::unknown_subcommand(sub))
}

fn check(ctx: Ctx) -> c_int {
    let now = rm::now_ms();
    let mut facts = audit::gather(ctx, now);
    facts.reaper = Reaper {
        interval_ms: config::reap_interval_ms() as u64,
        swept_at: reaper::swept_at(),
        held_back: rm::writes_paused() || reaper::held_back(),
        rescanning: reaper::rescanning(),
    };
    match check::reply(&check::problems(&facts)) {
        None => rm::reply_simple(ctx, c"OK"),
        Some(problems) => rm::reply_error_string(ctx, &problems),
    }
}

/// `LEASE.DEBUG CORRUPT <what> [args]`, in `fault-injection` builds only:
/// each breaks one structure the way a bug would, in the selected
/// database, and replies `OK`.
///
/// - `lease-keys`, `resource-keys`, `shared-holds`: the gauge one up;
/// - `waiters`: the waiter queues' total one up;
/// - `index-drop key`: every deadline-index entry of `key` gone;
/// - `index-stale key ms`: an entry of `key` due `ms` ago;
/// - `bound-drop key`: the first bound hold of `key` unbound from the
///   bound-hold index (the hold stays);
/// - `bound-again key`: that hold counted once more;
/// - `bound-ghost session`: an entry for a hold on `ghost` bound to
///   `session`'s grant with fence 1, which no key stores.
#[cfg(feature = "fault-injection")]
mod faults {
    use std::os::raw::c_int;

    use crate::keyspace::sessions;
    use crate::keyspace::state::{self, STATS};
    use crate::model::holds::Binding;
    use crate::model::lease::Lease;
    use crate::rm::{self, Ctx, Key, OwnedString, RString, Slot};

    pub fn corrupt(ctx: Ctx, args: &[RString]) -> c_int {
        match break_one(ctx, args) {
            true => rm::reply_simple(ctx, c"OK"),
            false => rm::reply_error(ctx, c"ERR LEASE.DEBUG CORRUPT: nothing to corrupt that way"),
        }
    }

    /// Whether `args` named something, now broken.
    fn break_one(ctx: Ctx, args: &[RString]) -> bool {
        let db = rm::selected_db(ctx);
        let arg = |i: usize| args.get(i).map(rm::bytes);
        match (arg(0), arg(1), arg(2)) {
            (Some(b"lease-keys"), None, _) => state::bump(&STATS.lease_keys),
            (Some(b"resource-keys"), None, _) => state::bump(&STATS.resource_keys),
            (Some(b"shared-holds"), None, _) => state::bump(&STATS.shared_holds),
            (Some(b"waiters"), None, _) => state::waiters().miscount(),
            (Some(b"index-drop"), Some(key), None) => {
                let mut index = state::index();
                let entries: Vec<u64> = index
                    .entries()
                    .filter(|(d, _, k)| *d == db && *k == key)
                    .map(|(_, at, _)| at)
                    .collect();
                for at in entries {
                    index.remove(at, db, key);
                }
            }
            (Some(b"index-stale"), Some(key), Some(ago)) => {
                let Some(ago) = std::str::from_utf8(ago)
                    .ok()
                    .and_then(|a| a.parse::<u64>().ok())
                else {
                    return false;
                };
                state::index().insert(rm::now_ms().saturating_sub(ago), db, key);
            }
            (Some(b"bound-drop"), Some(key), None) => match first_binding(ctx, key) {
                Some(binding) => sessions::unbind_each(db, key, std::slice::from_ref(&binding)),
                None => return false,
            },
            (Some(b"bound-again"), Some(key), None) => match first_binding(ctx, key) {
                Some(binding) => sessions::bind(db, key, &binding),
                None => return false,
            },
            (Some(b"bound-ghost"), Some(session), None) => {
                let binding = Binding {
                    key: session.into(),
                    fence: 1,
                };
                sessions::bind(db, b"ghost", &binding);
            }
            _ => return false,
        }
        true
    }

    /// The session of the first bound hold of the lease in `key`.
    fn first_binding(ctx: Ctx, key: &[u8]) -> Option<Binding> {
        let name = OwnedString::new(ctx, key);
        let mut open = Key::open_read(ctx, name.as_ptr())?;
        let Slot::Ours(lease) = open.value::<Lease>() else {
            return None;
        };
        let holds = lease.extended()?;
        let binding = holds.iter().find_map(|(_, g)| g.session().cloned());
        binding
    }
}
