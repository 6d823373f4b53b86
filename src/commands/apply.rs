//! `LEASE.APPLY key fence:deadline token`: a master's or the AOF's effect.

use std::os::raw::c_int;

use crate::keyspace::effects::index_lease;
use crate::keyspace::state;
use crate::keyspace::types;
use crate::model::args;
use crate::model::error;
use crate::model::lease::Lease;
use crate::rm::{self, Ctx, Key, RString, Slot};

use super::{command, last_argument, origin, Origin};

/// `LEASE.APPLY key fence:deadline token`: an effect from a master or the
/// AOF. An empty token means free.
pub extern "C" fn apply_command(ctx: Ctx, argv: *mut RString, argc: c_int) -> c_int {
    command("LEASE.APPLY", ctx, argv, argc, apply, last_argument)
}

fn apply(ctx: Ctx, args: &[RString]) -> c_int {
    let origin = origin(ctx);
    if origin == Origin::Client {
        return rm::reply_error(ctx, error::INTERNAL_ONLY);
    }
    let [_, key_name, effect @ ..] = args else {
        return rm::reply_error(ctx, error::APPLY_ARGS);
    };
    let (fence, holder) = match args::parse_apply_args(effect, rm::bytes) {
        Ok(parsed) => parsed,
        Err(e) => return rm::reply_error(ctx, e),
    };
    state::fences().observe(fence, rm::now_ms());
    let Some(mut key) = Key::open_write(ctx, *key_name) else {
        return rm::reply_error(ctx, error::INTERNAL);
    };
    let lease = match key.value::<Lease>() {
        Slot::Ours(lease) => {
            lease.apply(holder, fence);
            lease
        }
        slot => {
            // The master says this key is a lease; whatever the replica had
            // under the name is gone on the master too.
            if matches!(slot, Slot::WrongType) {
                key.delete();
            }
            types::store_lease(&mut key, Lease::from_parts(holder, fence))
        }
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
