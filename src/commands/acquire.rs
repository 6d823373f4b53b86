//! `LEASE.ACQUIRE key ttl [TOKEN token] [BLOCK timeout] [SHARED [LIMIT n]]
//! [OWNER label]`.

use std::ffi::CStr;
use std::os::raw::c_int;

use crate::keyspace::effects;
use crate::keyspace::effects::{expired_before_reaping, granted, Wire};
use crate::keyspace::state::{self, STATS};
use crate::keyspace::types;
use crate::model::args;
use crate::model::config;
use crate::model::error;
use crate::model::holds::Refused;
use crate::model::lease::{Acquire, Lease};
use crate::rm::{self, Ctx, Key, RString, Slot};

use super::{command, generate_token, token_option, writable};

fn reply_grant(ctx: Ctx, token: &[u8], fence: u64) -> c_int {
    rm::reply_array(ctx, 2);
    rm::reply_bulk(ctx, token);
    rm::reply_integer(ctx, fence as i64)
}

/// `LEASE.ACQUIRE key ttl [TOKEN token] [BLOCK timeout] [SHARED [LIMIT n]]
/// [OWNER label]`
pub extern "C" fn acquire_command(ctx: Ctx, argv: *mut RString, argc: c_int) -> c_int {
    command("LEASE.ACQUIRE", ctx, argv, argc, acquire, token_option)
}

fn parse_acquire(args: &[RString]) -> Result<(RString, args::Acquire<'_, RString>), &'static CStr> {
    let [_, key, ttl, options @ ..] = args else {
        return Err(error::ACQUIRE_SYNTAX);
    };
    let parsed = args::parse_acquire(rm::bytes(ttl), options, rm::bytes)?;
    Ok((*key, parsed))
}

fn acquire(ctx: Ctx, args: &[RString]) -> c_int {
    if !writable(ctx) {
        return rm::reply_error(ctx, error::READONLY);
    }
    let (key_name, parsed) = match parse_acquire(args) {
        Ok(p) => p,
        Err(e) => return rm::reply_error(ctx, e),
    };
    if let Err(e) = crate::background::eviction::admit(ctx) {
        return rm::reply_error(ctx, e);
    }
    let generated;
    let (token, wire) = match parsed.token {
        Some(arg) => (rm::bytes(arg), Wire::Arg(*arg)),
        None => {
            generated = generate_token();
            (&generated[..], Wire::Bytes(&generated))
        }
    };
    let Some(mut key) = Key::open_write(ctx, key_name) else {
        return rm::reply_error(ctx, error::INTERNAL);
    };
    let now = rm::now_ms();
    let mut fresh = Lease::default();
    let (lease, stored) = match key.value::<Lease>() {
        Slot::WrongType => return rm::reply_error(ctx, error::WRONGTYPE),
        Slot::Empty => (&mut fresh, false),
        Slot::Ours(lease) => (lease, true),
    };
    // Clients already waiting get a free lease before this caller does.
    let queue_ahead = effects::has_waiters(ctx, key_name);
    let shared_before = lease.shared_holds();
    let outcome = if parsed.terms.is_plain() && !lease.is_extended() {
        // Version 1's grant, on the compact form: the hot path.
        // A grant over a holder is a grant over an expired one.
        let had_holder = lease.deadline().is_some();
        lease
            .acquire(token, parsed.ttl_ms, now, queue_ahead, &mut state::fences())
            .map(|a| {
                (
                    a,
                    usize::from(had_holder && matches!(a, Acquire::Granted { .. })),
                )
            })
            .map_err(|_| Refused::FenceExhausted)
    } else {
        lease.acquire_on(
            token,
            parsed.ttl_ms,
            parsed.terms,
            now,
            queue_ahead,
            queue_ahead,
            config::max_holders(),
            &mut state::fences(),
        )
    };
    let fence = match outcome {
        Err(refused) => return rm::reply_message(ctx, error::refused(refused)),
        Ok((Acquire::Busy, _)) => {
            state::bump(&STATS.contended);
            if queue_ahead && !lease.is_live(now) {
                // Free, but owed to the queue: serve its head now rather
                // than at the reaper's next tick.
                effects::signal(ctx, key_name);
            }
            return match parsed.block_ms {
                Some(timeout) => crate::background::waiters::block(
                    ctx,
                    key_name,
                    token,
                    parsed.ttl_ms,
                    parsed.terms,
                    timeout,
                ),
                None => rm::reply_null_array(ctx),
            };
        }
        Ok((Acquire::Granted { fence }, replaced)) => {
            state::bump(&STATS.grants);
            if replaced > 0 {
                expired_before_reaping(ctx, key_name, replaced);
            }
            fence
        }
        Ok((Acquire::Retried { fence }, _)) => {
            state::bump(&STATS.retries);
            fence
        }
    };
    state::shared_holds_moved(shared_before, lease.shared_holds());
    let lease = if stored {
        lease
    } else {
        types::store_lease(&mut key, fresh)
    };
    granted(ctx, key_name, lease, wire);
    drop(key);
    reply_grant(ctx, token, fence)
}
