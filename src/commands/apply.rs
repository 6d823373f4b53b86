//! `LEASE.APPLY key ...`: a master's or the AOF's effect, in one of the
//! forms of `model::effect` (a whole compact state, one hold, holds
//! dropped, a lock-delay), decoded there.

use std::os::raw::c_int;

use crate::keyspace::commit::{commit, On};
use crate::keyspace::state;
use crate::keyspace::types;
use crate::model::change::Change;
use crate::model::effect::{self, Effect};
use crate::model::error;
use crate::model::lease::Lease;
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

fn apply(ctx: Ctx, args: &[RString]) -> c_int {
    let origin = origin(ctx);
    if origin == Origin::Client {
        return rm::reply_error(ctx, error::INTERNAL_ONLY);
    }
    let [_, key_name, effect @ ..] = args else {
        return rm::reply_error(ctx, error::APPLY_ARGS);
    };
    let parts: Vec<&[u8]> = effect.iter().map(rm::bytes).collect();
    let effect = match Effect::decode(&parts) {
        Ok(effect) => effect,
        Err(e) => return rm::reply_error(ctx, e),
    };
    if let Some(fence) = effect.fence() {
        state::fences().observe(fence, rm::now_ms());
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
    let applied = effect::apply(lease, effect);
    let shared = (shared_before, lease.shared_holds());
    let lease = if stored {
        lease
    } else {
        types::store_lease(&mut key, fresh)
    };
    // A slot being imported is indexed when the import ends.
    let index = origin != Origin::SlotImport;
    // A replica's own AOF gets the effect only by its verbatim replication
    // (a module command is never written there for it); replaying the AOF
    // propagates nothing.
    commit(
        ctx,
        *key_name,
        On::Lease(lease),
        None,
        Change::applied(applied.unbound, applied.bound, shared, index),
    );
    drop(key);
    rm::reply_simple(ctx, c"OK")
}
