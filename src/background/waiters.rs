//! `LEASE.ACQUIRE ... BLOCK timeout`: waiters blocked on the key, served
//! first come, first served.
//!
//! A waiter is a client blocked on the key name with the blocked-clients
//! API and an entry in the node's wait queue. When the lease is released or
//! expires, the key is signalled ready; Redis then runs the waiters' reply
//! callbacks before any other client's command, and only the head of the
//! queue may take the lease. Every way out (grant, timeout, disconnect,
//! `CLIENT UNBLOCK`) ends in `free_waiter`, which leaves the queue.

use std::os::raw::{c_int, c_void};

use redis_module::raw;

use crate::keyspace::cluster;
use crate::keyspace::commit::values;
use crate::keyspace::commit::{commit, On};
use crate::keyspace::sessions::{self, Lookup};
use crate::keyspace::state::{self, STATS};
use crate::keyspace::types::{self};
use crate::keyspace::wake;
use crate::keyspace::wire::Wire;
use crate::model::change::{Change, Index, Signal};
use crate::model::config;
use crate::model::error;
use crate::model::holds::{Binding, Mode, Refused, Terms};
use crate::model::lease::{Acquire, Lease, Request};
use crate::rm::{self, api, Ctx, Key, OwnedString, RString, Slot};

const OK: c_int = raw::REDISMODULE_OK as c_int;
const ERR: c_int = raw::REDISMODULE_ERR as c_int;

/// A waiter's `SESSION` key and token.
type SessionArgs = (Box<[u8]>, Box<[u8]>);

struct Waiter {
    id: u64,
    db: i32,
    key: Box<[u8]>,
    token: Box<[u8]>,
    ttl_ms: u64,
    mode: Mode,
    limit: Option<u32>,
    owner: Option<Box<[u8]>>,
    delay_ms: u64,
    /// `SESSION key token`, checked again at the waiter's turn.
    session: Option<SessionArgs>,
}

impl Waiter {
    fn terms(&self, session_fence: Option<u64>) -> Terms<'_> {
        Terms {
            mode: self.mode,
            limit: self.limit,
            owner: self.owner.as_deref(),
            session: self
                .session
                .as_ref()
                .zip(session_fence)
                .map(|((key, _), fence)| (&**key, fence)),
            delay_ms: self.delay_ms,
        }
    }
}

/// Whether the caller may block here: not inside MULTI, a script, or any
/// context that forbids blocking.
fn may_block(ctx: Ctx) -> bool {
    let no_block = raw::REDISMODULE_CTX_FLAGS_MULTI
        | raw::REDISMODULE_CTX_FLAGS_LUA
        | raw::REDISMODULE_CTX_FLAGS_DENY_BLOCKING;
    rm::context_flags(ctx) & no_block == 0
}

/// Blocks the caller until it gets the lease or `timeout_ms` passes
/// (0: forever). Where blocking is not possible, replies nil as a busy
/// non-blocking acquire does.
pub fn block(
    ctx: Ctx,
    key: RString,
    token: &[u8],
    ttl_ms: u64,
    terms: Terms,
    session: Option<(&[u8], &[u8])>,
    timeout_ms: u64,
) -> c_int {
    if !may_block(ctx) {
        return rm::reply_null_array(ctx);
    }
    let db = rm::selected_db(ctx);
    let name = rm::bytes(&key);
    let id = {
        let mut waiters = state::waiters();
        if waiters.len(db, name) >= crate::model::config::max_waiters() {
            return rm::reply_error(ctx, error::TOO_MANY_WAITERS);
        }
        waiters.enqueue(db, name)
    };
    let waiter = Box::new(Waiter {
        id,
        db,
        key: name.into(),
        token: token.into(),
        ttl_ms,
        mode: terms.mode,
        limit: terms.limit,
        owner: terms.owner.map(Into::into),
        delay_ms: terms.delay_ms,
        session: session.map(|(k, t)| (k.into(), t.into())),
    });
    let privdata = Box::into_raw(waiter).cast::<c_void>();
    let mut keys = [key];
    let timeout = i64::try_from(timeout_ms).unwrap_or(i64::MAX);
    // SAFETY: a read of the API table after RedisModule_Init wrote it (see
    // `api!`); `ctx` is the running command's context and `keys` one live
    // key name, which Redis retains. `privdata` is a `Waiter` that Redis
    // hands to the callbacks, which read it as one, and frees once with
    // `free_waiter`.
    let blocked = unsafe {
        match raw::RedisModule_BlockClientOnKeysWithFlags {
            // Unblock-on-delete: a DEL of the lease key frees it for the queue.
            Some(block_with_flags) => block_with_flags(
                ctx,
                Some(serve_waiter),
                Some(waiter_timed_out),
                Some(free_waiter),
                timeout,
                keys.as_mut_ptr(),
                1,
                privdata,
                raw::REDISMODULE_BLOCK_UNBLOCK_DELETED as c_int,
            ),
            None => api!(RedisModule_BlockClientOnKeys)(
                ctx,
                Some(serve_waiter),
                Some(waiter_timed_out),
                Some(free_waiter),
                timeout,
                keys.as_mut_ptr(),
                1,
                privdata,
            ),
        }
    };
    if blocked.is_null() {
        // Not blocked after all: take the waiter back and answer now.
        // SAFETY: not blocked, so Redis did not take `privdata`: it is
        // still the `Box<Waiter>` made above, freed only here.
        unsafe { drop(Box::from_raw(privdata.cast::<Waiter>())) };
        state::waiters().remove(db, name, id);
        return rm::reply_error(ctx, error::BLOCK_UNSUPPORTED);
    }
    OK
}

/// Reply callback: the key was signalled. Only the head of the queue may
/// take a free lease; everyone else stays blocked (`ERR`).
///
/// # Safety
/// `ctx` is the reply context of a client blocked by `block`, valid for the
/// call, whose private data is its `Waiter`, not yet freed.
unsafe extern "C" fn serve_waiter(ctx: Ctx, _argv: *mut RString, _argc: c_int) -> c_int {
    rm::guard(
        "LEASE.ACQUIRE waiter",
        || ERR,
        || {
            // SAFETY: `ctx` is a blocked client's reply context; its private
            // data is the `Waiter` `block` gave it, freed (`free_waiter`)
            // only after the client unblocks, and only read meanwhile.
            let Some(waiter) = (unsafe {
                api!(RedisModule_GetBlockedClientPrivateData)(ctx)
                    .cast::<Waiter>()
                    .as_ref()
            }) else {
                return ERR;
            };
            if state::waiters().head(waiter.db, &waiter.key) != Some(waiter.id) {
                return ERR;
            }
            if rm::writes_paused() {
                // A grant writes and propagates: offered again once the
                // pause ends (nothing the module does signals a key while
                // paused; this guards what the server might).
                wake::resignal_later(ctx, waiter.db, &waiter.key);
                return ERR;
            }
            // SAFETY: `ctx` is a blocked client's reply context, where the
            // ready key is live for the call (null outside a key signal).
            let key_name = unsafe { api!(RedisModule_GetBlockedClientReadyKey)(ctx) };
            if key_name.is_null() {
                return ERR;
            }
            let Some(mut key) = Key::open_write(ctx, key_name) else {
                return ERR;
            };
            let now = rm::now_ms();
            // The session is checked at the turn: one that ended since the
            // waiter queued is answered with the error, never granted.
            let session_fence = match &waiter.session {
                None => None,
                Some((session, token)) => {
                    let name = OwnedString::new(ctx, session);
                    match sessions::resolve(ctx, key_name, name.as_ptr(), token, now) {
                        Ok(fence) => Some(fence),
                        Err(message) => {
                            rm::reply_message(ctx, message);
                            if matches!(key.value::<Lease>(), Slot::Ours(_)) {
                                let change = Change::waiter_refused(now);
                                commit(ctx, key_name, On::Key(&mut key), None, change);
                            }
                            return OK;
                        }
                    }
                }
            };
            let mut fresh = Lease::default();
            let (lease, stored) = match key.value::<Lease>() {
                Slot::WrongType => {
                    rm::reply_error(ctx, error::WRONGTYPE);
                    return OK;
                }
                // A key migrated away leaves no lease to take here: the
                // waiter stays blocked until the server redirects it.
                Slot::Empty if !cluster::serves_slot_of(ctx, key_name) => return ERR,
                Slot::Empty => (&mut fresh, false),
                Slot::Ours(lease) => (lease, true),
            };
            let shared_before = lease.shared_holds();
            let ending = sessions::session_grant(lease);
            let terms = waiter.terms(session_fence);
            let request = Request {
                token: &waiter.token,
                ttl_ms: waiter.ttl_ms,
                terms,
                now_ms: now,
                waiting: true,
                queue_ahead: false,
                max_holders: config::max_holders(),
            };
            let outcome = lease.acquire(request, &mut state::fences(), &mut Lookup::new(ctx, now));
            let bound = terms.session.map(|(session, session_fence)| Binding {
                key: session.into(),
                fence: session_fence,
            });
            let shared = (shared_before, lease.shared_holds());
            let mut change = Change::acquired(&outcome, ending, bound, shared, true);
            let fence = match outcome {
                Ok((Acquire::Granted { fence } | Acquire::Retried { fence }, _)) => fence,
                // The limit or max-holders reached, or a lock-delay: wait
                // for it to end.
                Ok((Acquire::Busy, _)) | Err(Refused::TooManyHolders) => {
                    commit(ctx, key_name, On::Key(&mut key), None, change);
                    return ERR;
                }
                Err(refused) => {
                    if stored {
                        // The free lease kept for this waiter is looked at again.
                        change.index = Index::Recheck(now);
                    }
                    commit(ctx, key_name, On::Key(&mut key), None, change);
                    rm::reply_message(ctx, error::refused(refused));
                    return OK;
                }
            };
            let lease = if stored {
                lease
            } else {
                types::store_lease(&mut key, fresh)
            };
            state::waiters().remove(waiter.db, &waiter.key, waiter.id);
            if waiter.mode == Mode::Shared {
                // A shared grant may leave room for the shared waiter now at
                // the head: offered at once, before any other command.
                change.signal = Signal::IfWaiting;
            }
            commit(
                ctx,
                key_name,
                On::Lease(lease),
                Some(Wire::Bytes(&waiter.token)),
                change,
            );
            drop(key);
            rm::reply_array(ctx, 2);
            rm::reply_bulk(ctx, &waiter.token);
            rm::reply_integer(ctx, fence as i64);
            OK
        },
    )
}

/// Timeout callback, also run for `CLIENT UNBLOCK`: nil, as BLPOP replies.
///
/// # Safety
/// `ctx` is the reply context of a client blocked by `block`, valid for the
/// call.
unsafe extern "C" fn waiter_timed_out(ctx: Ctx, _argv: *mut RString, _argc: c_int) -> c_int {
    rm::guard(
        "LEASE.ACQUIRE waiter timeout",
        || rm::reply_null_array(ctx),
        || {
            state::bump(&STATS.block_timeouts);
            rm::reply_null_array(ctx)
        },
    );
    OK
}

/// Every way out of the queue ends here, exactly once per waiter.
///
/// # Safety
/// `ctx` is valid for the call; `privdata` is null or the `Waiter` that
/// `block` handed to Redis, which nothing uses after this call.
unsafe extern "C" fn free_waiter(ctx: Ctx, privdata: *mut c_void) {
    if privdata.is_null() {
        return;
    }
    // SAFETY: `privdata` is the `Box<Waiter>` from `block`; Redis calls the
    // free callback once per blocked client, after its last reply callback.
    let waiter = unsafe { Box::from_raw(privdata.cast::<Waiter>()) };
    rm::guard(
        "LEASE.ACQUIRE waiter cleanup",
        || (),
        || {
            let mut waiters = state::waiters();
            let was_head = waiters.head(waiter.db, &waiter.key) == Some(waiter.id);
            waiters.remove(waiter.db, &waiter.key, waiter.id);
            if was_head && waiters.len(waiter.db, &waiter.key) > 0 {
                // The head left unserved (timeout, disconnect): the next waiter
                // must be offered the lease in case it is free.
                wake::resignal_later(ctx, waiter.db, &waiter.key);
            }
        },
    );
}

/// Makes `resignal_tick` the timer `state::wake_later` arms; at load.
pub fn install_waker() {
    state::set_waker(resignal_tick);
}

/// # Safety
/// `ctx` is a timer callback's context, valid for the call.
unsafe extern "C" fn resignal_tick(ctx: Ctx, _data: *mut c_void) {
    if rm::writes_paused() {
        // Serving a waiter writes: try again once the pause ends.
        // SAFETY: `ctx` is this timer's context; the new timer carries no
        // data, and its callback is this function, of a module that is
        // never unloaded.
        unsafe {
            api!(RedisModule_CreateTimer)(
                ctx,
                wake::PAUSED_RETRY_MS,
                Some(resignal_tick),
                std::ptr::null_mut(),
            )
        };
        return;
    }
    rm::guard("waiter resignal", || (), || resignal(ctx));
}

fn resignal(ctx: Ctx) {
    let pending = state::take_wakes();
    for (db, key) in pending {
        if state::waiters().len(db, &key) == 0 || !rm::select_db(ctx, db) {
            continue;
        }
        let name = OwnedString::new(ctx, &key);
        if let Some(mut open) = Key::open_write(ctx, name.as_ptr()) {
            if open.is_empty() && !cluster::serves_slot_of(ctx, name.as_ptr()) {
                // Migrated away: the server redirects its waiters.
                continue;
            }
            if open.is_empty() {
                // The key vanished under its waiters. Blocked clients are
                // served only on keys that exist (Redis 7.0), so put a free
                // lease record there for the head of the queue to take; the
                // reaper deletes it if the queue empties first.
                let lease = types::store_lease(&mut open, Lease::default());
                values::kept_for_waiters(ctx, name.as_ptr(), lease);
            }
        }
        wake::signal(ctx, name.as_ptr());
    }
}
