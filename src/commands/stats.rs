//! The `lease` section of `INFO`. Redis prefixes each field with the module
//! name, so `grants` reads as `lease_grants`.

use std::ffi::CString;
use std::os::raw::c_int;

use redis_module::raw;

use crate::background::eviction;
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
            // SAFETY: `ctx` is the INFO context Redis passed this call; a
            // null name is the module's default section.
            unsafe { api!(RedisModule_InfoAddSection)(ctx, std::ptr::null()) };
            add(c"keys", read(&STATS.lease_keys));
            add(c"resource_keys", read(&STATS.resource_keys));
            add(c"shared_holds", read(&STATS.shared_holds));
            let (bound, sessions) = {
                let index = state::bound();
                (index.holds(), index.sessions() as u64)
            };
            add(c"bound_holds", bound);
            add(c"sessions", sessions);
            add(c"session_expiries", read(&STATS.session_expiries));
            add(c"delays", read(&STATS.delays));
            add(c"indexed_deadlines", state::index().len() as u64);
            add(c"waiters", state::waiters().total() as u64);
            add(c"fence_last", state::fences().last());
            add(c"grants", read(&STATS.grants));
            add(c"grants_to_waiters", read(&STATS.waiter_grants));
            add(c"retries", read(&STATS.retries));
            add(c"acquires_contended", read(&STATS.contended));
            add(c"block_timeouts", read(&STATS.block_timeouts));
            add(c"renewals", read(&STATS.renewals));
            add(c"renewals_rejected", read(&STATS.renewals_rejected));
            add(c"releases", read(&STATS.releases));
            add(c"releases_rejected", read(&STATS.releases_rejected));
            add(c"expired", read(&STATS.expired));
            add(c"fence_accepted", read(&STATS.fence_accepted));
            add(c"fence_rejected", read(&STATS.fence_rejected));
            add(c"evicted", read(&STATS.evicted));
            add(c"restored", read(&STATS.restored));
            add(
                c"acquires_refused_for_eviction",
                read(&STATS.eviction_refused),
            );
            let policy = CString::new(eviction::policy()).unwrap_or_default();
            // SAFETY: `ctx` is the INFO context Redis passed this call; both
            // strings are NUL-terminated, live for the call, and copied.
            unsafe {
                api!(RedisModule_InfoAddFieldCString)(
                    ctx,
                    c"maxmemory_policy".as_ptr(),
                    policy.as_ptr(),
                )
            };
            add(c"maxmemory", eviction::maxmemory());
            let mode = format!("{:?}", eviction::MODE.current());
            let mode = CString::new(mode).unwrap_or_default();
            // SAFETY: as for `maxmemory_policy`.
            unsafe {
                api!(RedisModule_InfoAddFieldCString)(
                    ctx,
                    c"allkeys_eviction".as_ptr(),
                    mode.as_ptr(),
                )
            };
            add(c"role_primary", u64::from(state::is_primary()));
        },
    )
}
