//! `LEASE.APPLY`: a master's or the AOF's effect, in one of three forms:
//! - `key fence:deadline token`: a compact lease's whole state (an empty
//!   token: free), which also ends any extended holds;
//! - `key state token`, the state a hold's (`args::hold_state`, seven
//!   fields): one hold of an extended lease (an exclusive one is the only
//!   hold);
//! - `key DROP token [token ...]`: holds of an extended lease gone.

use std::os::raw::c_int;

use crate::keyspace::effects::index_lease;
use crate::keyspace::sessions;
use crate::keyspace::state;
use crate::keyspace::types;
use crate::model::args;
use crate::model::error;
use crate::model::holds::{Grant, Mode};
use crate::model::lease::{Lease, MAX_DEADLINE_MS};
use crate::rm::{self, Ctx, Key, RString, Slot};

use super::{command, origin, Origin, Redact};

/// `LEASE.APPLY key fence:deadline token`: an effect from a master or the
/// AOF. An empty token means free.
pub extern "C" fn apply_command(ctx: Ctx, argv: *mut RString, argc: c_int) -> c_int {
    command("LEASE.APPLY", ctx, argv, argc, apply, apply_secrets)
}

/// The tokens of every form: the last argument, or all after `DROP`.
fn apply_secrets(args: &[RString]) -> Redact {
    match args.get(2) {
        Some(form) if rm::bytes(form).eq_ignore_ascii_case(b"DROP") => Redact::From(3, args.len()),
        _ if args.len() > 3 => Redact::One(args.len() - 1),
        _ => Redact::Nothing,
    }
}

/// The effect on a stored lease, or the lease a new key gets.
enum Effect {
    Whole(u64, Option<crate::model::lease::Holder>),
    Hold(Box<[u8]>, Grant, Mode, Option<u32>),
    Drop,
    Delay(u64),
}

fn apply(ctx: Ctx, args: &[RString]) -> c_int {
    let origin = origin(ctx);
    if origin == Origin::Client {
        return rm::reply_error(ctx, error::INTERNAL_ONLY);
    }
    let [_, key_name, effect @ ..] = args else {
        return rm::reply_error(ctx, error::APPLY_ARGS);
    };
    let form = effect.first().map(rm::bytes);
    let parsed = match form {
        Some(f) if effect.len() == 2 && args::is_hold_state(f) => {
            args::parse_hold_args(effect, rm::bytes)
                .map(|(token, grant, mode, limit)| Effect::Hold(token, grant, mode, limit))
        }
        Some(f) if f.eq_ignore_ascii_case(b"DROP") && effect.len() > 1 => Ok(Effect::Drop),
        Some(f) if f.eq_ignore_ascii_case(b"DELAY") => match effect {
            [_, until] => args::parse_u64(rm::bytes(until))
                .filter(|&u| u <= MAX_DEADLINE_MS)
                .map(Effect::Delay)
                .ok_or(error::APPLY_ARGS),
            _ => Err(error::APPLY_ARGS),
        },
        _ => args::parse_apply_args(effect, rm::bytes).map(|(f, h)| Effect::Whole(f, h)),
    };
    let effect = match parsed {
        Ok(parsed) => parsed,
        Err(e) => return rm::reply_error(ctx, e),
    };
    match &effect {
        Effect::Whole(fence, _) => state::fences().observe(*fence, rm::now_ms()),
        Effect::Hold(_, grant, ..) => state::fences().observe(grant.fence, rm::now_ms()),
        Effect::Drop | Effect::Delay(_) => {}
    }
    let Some(mut key) = Key::open_write(ctx, *key_name) else {
        return rm::reply_error(ctx, error::INTERNAL);
    };
    let mut fresh = Lease::default();
    let (lease, stored) = match key.value::<Lease>() {
        Slot::Ours(lease) => (lease, true),
        slot => {
            // The master says this key is a lease; whatever the replica had
            // under the name is gone on the master too.
            if matches!(slot, Slot::WrongType) {
                key.delete();
            }
            (&mut fresh, false)
        }
    };
    let shared_before = lease.shared_holds();
    let (db, name) = (rm::selected_db(ctx), rm::bytes(key_name));
    match effect {
        Effect::Whole(fence, holder) => {
            sessions::unbind_all(db, name, lease);
            lease.apply(holder, fence);
        }
        Effect::Hold(token, grant, mode, limit) => {
            let binding = grant.session().cloned();
            let replaced = lease.apply_hold(&token, grant, mode, limit);
            sessions::unbind(db, name, &replaced);
            if let Some(binding) = binding {
                sessions::bind(db, name, &binding);
            }
        }
        Effect::Drop => {
            let gone = lease.apply_drop(args[3..].iter().map(rm::bytes));
            sessions::unbind(db, name, &gone);
        }
        Effect::Delay(until) => lease.apply_delay(until),
    }
    state::shared_holds_moved(shared_before, lease.shared_holds());
    let lease = if stored {
        lease
    } else {
        types::store_lease(&mut key, fresh)
    };
    if origin != Origin::SlotImport {
        index_lease(ctx, *key_name, lease);
    }
    drop(key);
    // A replica's own AOF gets the effect only this way (a module command
    // is never written there for it); replaying the AOF propagates nothing.
    rm::replicate_verbatim(ctx);
    rm::reply_simple(ctx, c"OK")
}
