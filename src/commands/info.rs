//! `LEASE.INFO key` and `LEASE.HOLDERS key`: what a lease is and who holds
//! it; never a token.

use std::os::raw::c_int;

use crate::keyspace::sessions::{self, Lookup};
use crate::keyspace::state;
use crate::keyspace::wake;
use crate::model::error;
use crate::model::holds::Mode;
use crate::model::lease::{Lease, State};
use crate::rm::{self, Ctx, Key, RString, Slot};

use super::{command, no_secret, OK};

/// `LEASE.INFO key`
pub extern "C" fn info_command(ctx: Ctx, argv: *mut RString, argc: c_int) -> c_int {
    command("LEASE.INFO", ctx, argv, argc, info, no_secret)
}

/// `LEASE.HOLDERS key`
pub extern "C" fn holders_command(ctx: Ctx, argv: *mut RString, argc: c_int) -> c_int {
    command("LEASE.HOLDERS", ctx, argv, argc, holders, no_secret)
}

fn mode_name(mode: Mode) -> &'static [u8] {
    match mode {
        Mode::Exclusive => b"exclusive",
        Mode::Shared => b"shared",
    }
}

fn reply_optional_bulk(ctx: Ctx, value: Option<&[u8]>) -> c_int {
    match value {
        Some(v) => rm::reply_bulk(ctx, v),
        None => rm::reply_null(ctx),
    }
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
    let now = rm::now_ms();
    let mut sessions = Lookup::new(ctx, now);
    let (state, ttl): (&[u8], i64) = match lease.state(now, &mut sessions) {
        State::Held { ttl_ms } => (b"held", ttl_ms as i64),
        State::Delayed { ttl_ms } => (b"delayed", ttl_ms as i64),
        State::Free => (b"free", -1),
    };
    let view = lease.view(now, &mut sessions);
    let waiters = wake::waiters_on(ctx, *key_name);
    // A limit binds while the key has holders or waiters, and shows then.
    let limit = view.limit.filter(|_| view.holders > 0 || waiters > 0);
    // Holds bound to this key as a session, while it is a live one.
    let bound = match sessions::session_grant(lease) {
        Some((fence, deadline)) if now < deadline => {
            state::bound().bound_to(rm::selected_db(ctx), rm::bytes(key_name), fence)
        }
        _ => 0,
    };
    rm::reply_map(ctx, 10);
    rm::reply_bulk(ctx, b"state");
    rm::reply_bulk(ctx, state);
    rm::reply_bulk(ctx, b"ttl");
    rm::reply_integer(ctx, ttl);
    rm::reply_bulk(ctx, b"fence");
    rm::reply_integer(ctx, lease.fence() as i64);
    rm::reply_bulk(ctx, b"waiters");
    rm::reply_integer(ctx, waiters as i64);
    rm::reply_bulk(ctx, b"mode");
    reply_optional_bulk(ctx, view.mode.map(mode_name));
    rm::reply_bulk(ctx, b"holders");
    rm::reply_integer(ctx, view.holders as i64);
    rm::reply_bulk(ctx, b"limit");
    match limit {
        Some(n) => rm::reply_integer(ctx, i64::from(n)),
        None => rm::reply_null(ctx),
    };
    rm::reply_bulk(ctx, b"owner");
    reply_optional_bulk(ctx, view.owner);
    rm::reply_bulk(ctx, b"session");
    reply_optional_bulk(ctx, view.session);
    rm::reply_bulk(ctx, b"bound");
    rm::reply_integer(ctx, bound as i64)
}

fn holders(ctx: Ctx, args: &[RString]) -> c_int {
    let [_, key_name] = args else {
        return rm::reply_error(
            ctx,
            c"ERR wrong number of arguments for 'lease.holders' command",
        );
    };
    let Some(mut key) = Key::open_read(ctx, *key_name) else {
        return rm::reply_array(ctx, 0);
    };
    let lease = match key.value::<Lease>() {
        Slot::WrongType => return rm::reply_error(ctx, error::WRONGTYPE),
        Slot::Empty => return rm::reply_array(ctx, 0),
        Slot::Ours(lease) => lease,
    };
    let now = rm::now_ms();
    let live = lease.live_holds(now, &mut Lookup::new(ctx, now));
    rm::reply_array(ctx, live.len());
    for hold in live {
        rm::reply_map(ctx, 5);
        rm::reply_bulk(ctx, b"fence");
        rm::reply_integer(ctx, hold.fence as i64);
        rm::reply_bulk(ctx, b"ttl");
        rm::reply_integer(ctx, (hold.deadline_ms - now) as i64);
        rm::reply_bulk(ctx, b"mode");
        rm::reply_bulk(ctx, mode_name(hold.mode));
        rm::reply_bulk(ctx, b"owner");
        reply_optional_bulk(ctx, hold.owner);
        rm::reply_bulk(ctx, b"session");
        reply_optional_bulk(ctx, hold.session);
    }
    OK
}
