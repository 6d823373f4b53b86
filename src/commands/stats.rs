//! The `lease` section of `INFO`. Redis prefixes each field with the module
//! name, so `grants` reads as `lease_grants`.
//!
//! The comment over each field says what it counts: the book's table of the
//! fields (docs/src/operations/observability.md) is generated from them by
//! tests/docs.rs, which fails on a field without one.

use std::ffi::CString;
use std::os::raw::c_int;

use redis_module::raw;

use crate::background::{armed, eviction};
use crate::keyspace::state::{self, read, STATS};
use crate::rm::api;

/// # Safety
/// `ctx` is an INFO context, valid for the call.
pub unsafe extern "C" fn info(ctx: *mut raw::RedisModuleInfoCtx, _for_crash_report: c_int) {
    crate::rm::guard(
        "INFO",
        || (),
        || {
            let add = |name: &std::ffi::CStr, value: u64| {
                // SAFETY: `ctx` is the INFO context Redis passed this call;
                // `name` is NUL-terminated and copied.
                unsafe { api!(RedisModule_InfoAddFieldULongLong)(ctx, name.as_ptr(), value) };
            };
            let add_text = |name: &std::ffi::CStr, value: &str| {
                let value = CString::new(value).unwrap_or_default();
                // SAFETY: `ctx` is the INFO context Redis passed this call;
                // both strings are NUL-terminated, live for the call, and
                // copied.
                unsafe {
                    api!(RedisModule_InfoAddFieldCString)(ctx, name.as_ptr(), value.as_ptr())
                };
            };
            // SAFETY: `ctx` is the INFO context Redis passed this call; a
            // null name is the module's default section.
            unsafe { api!(RedisModule_InfoAddSection)(ctx, std::ptr::null()) };
            // Gauge: lease keys stored, live or expired but not yet reaped.
            add(c"keys", read(&STATS.lease_keys));
            // Gauge: resource records (the keys `LEASE.FENCE` keeps).
            add(c"resource_keys", read(&STATS.resource_keys));
            // Gauge: shared holds stored, live or expired but not yet dropped.
            add(c"shared_holds", read(&STATS.shared_holds));
            let (bound, sessions) = {
                let index = state::bound();
                (index.holds(), index.sessions() as u64)
            };
            // Gauge: holds bound to a session, stored.
            add(c"bound_holds", bound);
            // Gauge: sessions with at least one bound hold.
            add(c"sessions", sessions);
            // Counter: bound holds freed by their session's end.
            add(c"session_expiries", read(&STATS.session_expiries));
            // Counter: lock-delays started (`DELAY`).
            add(c"delays", read(&STATS.delays));
            // Gauge: entries of the deadline index, a hint that may keep an
            // entry after its key is gone (empty on a replica).
            add(c"indexed_deadlines", state::index().len() as u64);
            // Gauge: clients blocked in `LEASE.ACQUIRE ... BLOCK`.
            add(c"waiters", state::waiters().total() as u64);
            // The last fence this node's sequence issued or observed.
            add(c"fence_last", state::fences().last());
            // Counter: holds granted, to callers and to waiters (retries
            // are `retries`).
            add(c"grants", read(&STATS.grants));
            // Counter: grants made to a blocked waiter.
            add(c"grants_to_waiters", read(&STATS.waiter_grants));
            // Counter: idempotent retries by a token that holds the lease.
            add(c"retries", read(&STATS.retries));
            // Counter: `LEASE.ACQUIRE` calls that found the key busy.
            add(c"acquires_contended", read(&STATS.contended));
            // Counter: blocked `LEASE.ACQUIRE` calls whose timeout passed.
            add(c"block_timeouts", read(&STATS.block_timeouts));
            // Counter: `LEASE.RENEW` calls answered 1.
            add(c"renewals", read(&STATS.renewals));
            // Counter: `LEASE.RENEW` calls answered 0.
            add(c"renewals_rejected", read(&STATS.renewals_rejected));
            // Counter: `LEASE.RELEASE` calls answered 1.
            add(c"releases", read(&STATS.releases));
            // Counter: `LEASE.RELEASE` calls answered 0.
            add(c"releases_rejected", read(&STATS.releases_rejected));
            // Counter: holds that expired (their deadline, or their session's
            // end).
            add(c"expired", read(&STATS.expired));
            // Counter: fences `LEASE.FENCE` accepted.
            add(c"fence_accepted", read(&STATS.fence_accepted));
            // Counter: `LEASE.FENCE` calls refused (`STALE`, or the inner
            // command refused or failed).
            add(c"fence_rejected", read(&STATS.fence_rejected));
            // Counter: live leases and records eviction took (each then
            // restored, or logged).
            add(c"evicted", read(&STATS.evicted));
            // Counter: evicted live leases and records written back
            // (`lease.allkeys-eviction restore`).
            add(c"restored", read(&STATS.restored));
            // Counter: `LEASE.ACQUIRE` and `LEASE.FENCE` calls refused
            // because eviction could take what they grant.
            add(
                c"acquires_refused_for_eviction",
                read(&STATS.eviction_refused),
            );
            // The server's `maxmemory-policy`, as the module last saw it.
            add_text(c"maxmemory_policy", &eviction::policy());
            // The server's `maxmemory`, as the module last saw it.
            add(c"maxmemory", eviction::maxmemory());
            // `lease.allkeys-eviction`: `refuse`, `restore` or `allow`.
            add_text(
                c"allkeys_eviction",
                &format!("{:?}", eviction::MODE.current()),
            );
            // 1 on a primary (which decides and reaps), 0 on a replica.
            add(c"role_primary", u64::from(state::is_primary()));
            // 1 while the module's command filter runs before every command:
            // while lease keys exist, and for 10 s after the last one goes.
            add(c"command_filter", u64::from(armed::filtering()));
            // 1 once the module hears key events (`DEL`, `RENAME`, `EXPIRE`,
            // ...): from its first lease or record on.
            add(c"key_events", u64::from(armed::hearing_keys()));
        },
    )
}
