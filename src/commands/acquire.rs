//! `LEASE.ACQUIRE key ttl [TOKEN token] [BLOCK timeout] [SHARED [LIMIT n]]
//! [OWNER label]`.

use std::ffi::CStr;
use std::os::raw::c_int;

use redis_module::raw;

use crate::keyspace::commit::{commit, On};
use crate::keyspace::sessions::{self, Lookup};
use crate::keyspace::state;
use crate::keyspace::types;
use crate::keyspace::wake;
use crate::keyspace::wire::Wire;
use crate::model::args;
use crate::model::change::{Change, Signal};
use crate::model::config;
use crate::model::error;
use crate::model::holds::{Binding, Refused, Terms};
use crate::model::lease::{Acquire, Lease, Request};
use crate::rm::{self, Ctx, Key, RString, Slot};

use super::{command, generate_token, token_option, writable, OK};

/// Blocks the caller in the key's queue, with what it asked for.
fn block(
    ctx: Ctx,
    key: RString,
    token: &[u8],
    parsed: &args::Acquire<'_, RString>,
    terms: Terms,
) -> c_int {
    let session = parsed.session.map(|(k, t)| (rm::bytes(k), rm::bytes(t)));
    let timeout = parsed.block_ms.unwrap_or(0);
    crate::background::waiters::block(ctx, key, token, parsed.ttl_ms, terms, session, timeout)
}

fn reply_grant(ctx: Ctx, token: &[u8], fence: u64) -> c_int {
    rm::reply_array(ctx, 2);
    rm::reply_bulk(ctx, token);
    rm::reply_integer(ctx, fence as i64)
}

/// `LEASE.ACQUIRE key ttl [TOKEN token] [BLOCK timeout] [SHARED [LIMIT n]]
/// [OWNER label]`
pub extern "C" fn acquire_command(ctx: Ctx, argv: *mut RString, argc: c_int) -> c_int {
    if rm::keys_position_request(ctx) {
        return rm::guard(
            "LEASE.ACQUIRE getkeys",
            || OK,
            || {
                // SAFETY: `argv` and `argc` are this call's arguments, and
                // the slice ends with this closure.
                report_keys(ctx, unsafe { rm::args(argv, argc) });
                OK
            },
        );
    }
    command("LEASE.ACQUIRE", ctx, argv, argc, acquire, token_option)
}

/// `COMMAND GETKEYS` and cluster routing: the key, and the session key of
/// `SESSION`, so a session in another slot is `CROSSSLOT` (routing reads
/// keys this way, not from the key specs).
fn report_keys(ctx: Ctx, args: &[RString]) {
    if args.len() < 2 {
        return;
    }
    let rw = raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_ACCESS;
    rm::report_key(ctx, 1, (rw | raw::REDISMODULE_CMD_KEY_UPDATE) as c_int);
    let Ok((_, parsed)) = parse_acquire(args) else {
        return;
    };
    if let Some((session, _)) = parsed.session {
        if let Some(pos) = args.iter().position(|a| std::ptr::eq(a, session)) {
            let ro = raw::REDISMODULE_CMD_KEY_RO | raw::REDISMODULE_CMD_KEY_ACCESS;
            rm::report_key(ctx, pos as c_int, ro as c_int);
        }
    }
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
    // A session is read before the key is opened: its fence binds the hold.
    let mut terms = parsed.terms;
    if let Some((session_key, session_token)) = parsed.session {
        let now = rm::now_ms();
        let resolved =
            sessions::resolve(ctx, key_name, *session_key, rm::bytes(session_token), now);
        match resolved {
            Ok(fence) => terms.session = Some((rm::bytes(session_key), fence)),
            Err(message) => return rm::reply_message(ctx, message),
        }
    }
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
    let queue_ahead = wake::has_waiters(ctx, key_name);
    let shared_before = lease.shared_holds();
    let mut lookup = Lookup::new(ctx, now);
    // The key's own grant, read before this one may replace it: if it was a
    // session that expired, its end is noted with the replacement.
    let ending = sessions::session_grant(lease);
    let request = Request {
        token,
        ttl_ms: parsed.ttl_ms,
        terms,
        now_ms: now,
        waiting: queue_ahead,
        queue_ahead,
        max_holders: config::max_holders(),
    };
    let outcome = lease.acquire(request, &mut state::fences(), &mut lookup);
    let bound = terms.session.map(|(session, session_fence)| Binding {
        key: session.into(),
        fence: session_fence,
    });
    let shared = (shared_before, lease.shared_holds());
    let mut change = Change::acquired(&outcome, ending, bound, shared, false);
    let fence = match outcome {
        Err(Refused::TooManyHolders) if parsed.block_ms.is_some() => {
            // Full to the operator's cap: a blocking caller waits its turn.
            commit(ctx, key_name, On::Key(&mut key), None, change);
            return block(ctx, key_name, token, &parsed, terms);
        }
        Err(refused) => {
            commit(ctx, key_name, On::Key(&mut key), None, change);
            return rm::reply_message(ctx, error::refused(refused));
        }
        Ok((Acquire::Busy, _)) => {
            if queue_ahead && !lease.is_live(now, &mut lookup) {
                // Free, but owed to the queue: serve its head now rather
                // than at the reaper's next tick.
                change.signal = Signal::IfWaiting;
            }
            commit(ctx, key_name, On::Key(&mut key), None, change);
            return match parsed.block_ms {
                Some(_) => block(ctx, key_name, token, &parsed, terms),
                None => rm::reply_null_array(ctx),
            };
        }
        Ok((Acquire::Granted { fence } | Acquire::Retried { fence }, _)) => fence,
    };
    let lease = if stored {
        lease
    } else {
        types::store_lease(&mut key, fresh)
    };
    commit(ctx, key_name, On::Lease(lease), Some(wire), change);
    drop(key);
    reply_grant(ctx, token, fence)
}
