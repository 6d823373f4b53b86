//! Server events and keyspace notifications that keep the node-wide state
//! true: the role (only a primary reaps), the deadline index (keys that
//! appear by `RENAME`, `MOVE`, `COPY`, `RESTORE`, a load or a promotion),
//! waiters (a deleted key frees the lease for the queue) and the eviction
//! settings.

use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_void};

use redis_module::raw;

use crate::data_type::{lease_type, resource_type};
use crate::lease::{Lease, Resource};
use crate::node;
use crate::rm::{self, api, Ctx, Key, RString, Slot};

const OK: c_int = raw::REDISMODULE_OK as c_int;

pub fn subscribe(ctx: Ctx) -> Result<(), String> {
    let server_events: [(u64, raw::RedisModuleEventCallback); 6] = [
        (
            raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED,
            Some(on_role_changed),
        ),
        (raw::REDISMODULE_EVENT_LOADING, Some(on_loading)),
        (raw::REDISMODULE_EVENT_FLUSHDB, Some(on_flush)),
        (raw::REDISMODULE_EVENT_SWAPDB, Some(on_swapdb)),
        (raw::REDISMODULE_EVENT_CONFIG, Some(on_config_change)),
        (raw::REDISMODULE_EVENT_MODULE_CHANGE, Some(on_module_change)),
    ];
    for (id, callback) in server_events {
        let event = raw::RedisModuleEvent { id, dataver: 1 };
        if unsafe { api!(RedisModule_SubscribeToServerEvent)(ctx, event, callback) } != OK {
            return Err(format!("cannot subscribe to server event {id}"));
        }
    }
    let classes = raw::REDISMODULE_NOTIFY_GENERIC
        | raw::REDISMODULE_NOTIFY_EXPIRED
        | raw::REDISMODULE_NOTIFY_EVICTED;
    if unsafe { api!(RedisModule_SubscribeToKeyspaceEvents)(ctx, classes, Some(on_keyspace_event)) }
        != OK
    {
        return Err("cannot subscribe to keyspace events".into());
    }
    Ok(())
}

pub fn refresh_role(ctx: Ctx) {
    let primary = rm::context_flags(ctx) & raw::REDISMODULE_CTX_FLAGS_MASTER != 0;
    node::set_primary(primary);
}

/// # Safety
/// Called by Redis for a subscribed server event.
unsafe extern "C" fn on_role_changed(
    ctx: Ctx,
    _e: raw::RedisModuleEvent,
    sub: u64,
    _d: *mut c_void,
) {
    rm::guard(
        "role change",
        || (),
        || {
            let primary = sub == raw::REDISMODULE_EVENT_REPLROLECHANGED_NOW_MASTER;
            node::set_primary(primary);
            if primary {
                // The replica kept no index; build it from what it replicated.
                crate::reaper::rescan();
            } else {
                node::index().clear();
            }
            let _ = ctx;
        },
    )
}

/// # Safety
/// Called by Redis for a subscribed server event.
unsafe extern "C" fn on_loading(ctx: Ctx, _e: raw::RedisModuleEvent, sub: u64, _d: *mut c_void) {
    rm::guard(
        "loading",
        || (),
        || {
            if sub == raw::REDISMODULE_SUBEVENT_LOADING_ENDED {
                refresh_role(ctx);
                if node::is_primary() {
                    crate::reaper::rescan();
                }
            }
        },
    )
}

/// # Safety
/// `data` is a `RedisModuleFlushInfo`.
unsafe extern "C" fn on_flush(_ctx: Ctx, _e: raw::RedisModuleEvent, sub: u64, data: *mut c_void) {
    if sub != raw::REDISMODULE_SUBEVENT_FLUSHDB_END {
        return;
    }
    if let Some(info) = data.cast::<raw::RedisModuleFlushInfo>().as_ref() {
        node::index().flush(info.dbnum);
    }
}

/// # Safety
/// `data` is a `RedisModuleSwapDbInfo`.
unsafe extern "C" fn on_swapdb(_ctx: Ctx, _e: raw::RedisModuleEvent, _sub: u64, data: *mut c_void) {
    if let Some(info) = data.cast::<raw::RedisModuleSwapDbInfo>().as_ref() {
        node::index().swap_db(info.dbnum_first, info.dbnum_second);
    }
}

/// # Safety
/// `data` is a `RedisModuleConfigChange`.
unsafe extern "C" fn on_config_change(
    ctx: Ctx,
    _e: raw::RedisModuleEvent,
    _sub: u64,
    data: *mut c_void,
) {
    rm::guard(
        "config change",
        || (),
        || {
            let Some(change) = data.cast::<raw::RedisModuleConfigChange>().as_ref() else {
                return;
            };
            let names =
                std::slice::from_raw_parts(change.config_names, change.num_changes as usize);
            let changed = |prefix: &[u8]| {
                names
                    .iter()
                    .any(|&n| CStr::from_ptr(n).to_bytes().starts_with(prefix))
            };
            if changed(b"maxmemory") {
                crate::eviction::refresh(ctx);
            }
            if changed(b"latency-monitor-threshold") {
                crate::reaper::refresh_latency_threshold(ctx);
            }
        },
    )
}

/// # Safety
/// Called by Redis for a subscribed server event.
unsafe extern "C" fn on_module_change(
    _ctx: Ctx,
    _e: raw::RedisModuleEvent,
    _sub: u64,
    _d: *mut c_void,
) {
    crate::inner::forget_verdicts();
}

/// # Safety
/// Called by Redis for a subscribed keyspace event, with the context's
/// database set to the key's.
unsafe extern "C" fn on_keyspace_event(
    ctx: Ctx,
    _class: c_int,
    event: *const c_char,
    key: RString,
) -> c_int {
    rm::guard(
        "keyspace event",
        || OK,
        || {
            let event = CStr::from_ptr(event).to_bytes();
            match event {
                b"move_to" => track(ctx, key),
                b"evicted" => {
                    crate::eviction::on_evicted(ctx, key);
                    wake_waiters(ctx, key);
                }
                b"del" | b"expired" | b"rename_from" | b"move_from" | b"rename_to" | b"copy_to"
                | b"restore" => {
                    crate::eviction::forget_unlinked();
                    if matches!(event, b"rename_to" | b"copy_to" | b"restore") {
                        track(ctx, key);
                    } else {
                        wake_waiters(ctx, key);
                    }
                }
                _ => {}
            }
            OK
        },
    )
}

/// The key left the keyspace: its waiters must not wait for a release that
/// will never come.
fn wake_waiters(ctx: Ctx, key: RString) {
    if crate::blocking::has_waiters(ctx, key) {
        crate::reaper::resignal_later(ctx, rm::selected_db(ctx), rm::bytes(key));
    }
}

/// A lease key or record appeared under a new name or database (`RENAME`,
/// `MOVE`, `COPY`, `RESTORE`, `MIGRATE`): its fence raises the sequence (a
/// restored key carries a fence issued elsewhere, and the next grant here must
/// be above it), and a primary indexes its deadline.
fn track(ctx: Ctx, name: RString) {
    let Some(mut key) = Key::open_read(ctx, name) else {
        return;
    };
    match key.value::<Lease>(lease_type()) {
        Slot::Ours(lease) => {
            node::fences().observe(lease.fence(), rm::now_ms());
            // A new name: whatever the lease's mark says is about the old one.
            lease.set_index_mark(None);
            node::index_lease(rm::selected_db(ctx), rm::bytes(name), lease);
        }
        Slot::WrongType => {
            if let Slot::Ours(record) = key.value::<Resource>(resource_type()) {
                node::fences().observe(record.highest(), rm::now_ms());
            }
        }
        Slot::Empty => {}
    }
}
