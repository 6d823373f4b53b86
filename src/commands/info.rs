//! `LEASE.INFO key`: state, ttl, fence and waiters; never the token.

use std::os::raw::c_int;

use crate::keyspace::effects;
use crate::model::error;
use crate::model::lease::{Lease, State};
use crate::rm::{self, Ctx, Key, RString, Slot};

use super::{command, no_secret};

/// `LEASE.INFO key`
pub extern "C" fn info_command(ctx: Ctx, argv: *mut RString, argc: c_int) -> c_int {
    command("LEASE.INFO", ctx, argv, argc, info, no_secret)
}

fn info(ctx: Ctx, args: &[RString]) -> c_int {
    let [_, key_name] = args else {
        return rm::reply_error(
            ctx,
            c"ERR wrong number of arguments for 'lease.info' command",
        );
    };
    let Some(mut key) = Key::open_read(ctx, *key_name) else {
        return rm::reply_null(ctx);
    };
    let lease = match key.value::<Lease>() {
        Slot::WrongType => return rm::reply_error(ctx, error::WRONGTYPE),
        Slot::Empty => return rm::reply_null(ctx),
        Slot::Ours(lease) => lease,
    };
    let (state, ttl): (&[u8], i64) = match lease.state(rm::now_ms()) {
        State::Held { ttl_ms } => (b"held", ttl_ms as i64),
        State::Free => (b"free", -1),
    };
    rm::reply_map(ctx, 4);
    rm::reply_bulk(ctx, b"state");
    rm::reply_bulk(ctx, state);
    rm::reply_bulk(ctx, b"ttl");
    rm::reply_integer(ctx, ttl);
    rm::reply_bulk(ctx, b"fence");
    rm::reply_integer(ctx, lease.fence() as i64);
    rm::reply_bulk(ctx, b"waiters");
    rm::reply_integer(ctx, effects::waiters_on(ctx, *key_name) as i64)
}
