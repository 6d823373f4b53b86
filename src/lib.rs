//! redis-lease: distributed locks as native leases with fencing tokens.
//!
//! The module table and start-up. The code is layered, each folder calling
//! only those below it:
//!
//! - `commands/`, `background/`: the LEASE commands; the reaper, blocked
//!   waiters, eviction handling and server events (never the commands);
//! - `keyspace/`: the module types, node-wide state, and the effects of a
//!   state change (index, replicate, notify, wake waiters);
//! - `rm/`: safe wrappers over the module API;
//! - `model/`: the pure model, unit-tested on an injected clock.
//!
//! `scripts/layers` checks the arrows.

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod background;
mod commands;
mod keyspace;
use redis_lease_model as model;
mod rm;

use redis_module::configuration::ConfigurationFlags;
use redis_module::{raw, redis_module, Context, RedisString, Status};

use background::{events, eviction, reaper};
use keyspace::state as node;
use keyspace::types::{LEASE_TYPE, RESOURCE_TYPE};
use model::config;

// Redis's allocator exists only inside a server; unit tests use the system's.
#[cfg(not(test))]
type Allocator = redis_module::alloc::RedisAlloc;
#[cfg(not(test))]
const ALLOCATOR: Allocator = redis_module::alloc::RedisAlloc;
#[cfg(test)]
type Allocator = std::alloc::System;
#[cfg(test)]
const ALLOCATOR: Allocator = std::alloc::System;

fn init(ctx: &Context, args: &[RedisString]) -> Status {
    let raw_ctx = ctx.ctx;
    // Module arguments are checked and applied here, not by the configs'
    // registration, which neither range-checks them nor names a bad one.
    let settings = config::parse_module_args(
        args.iter().map(|a| a.as_slice()),
        eviction::restore_supported(),
    );
    match settings {
        Ok(settings) => settings.into_iter().for_each(|s| match s {
            config::Setting::Number(name, value) => config::apply_number(name, value),
            config::Setting::AllkeysEviction(choice) => eviction::MODE.set_named(choice),
            #[cfg(feature = "fault-injection")]
            config::Setting::InjectPanic(names) => rm::faults::arm(&names),
            #[cfg(not(feature = "fault-injection"))]
            config::Setting::InjectPanic(_) => {}
        }),
        Err(e) => {
            rm::log_warning(raw_ctx, &format!("redis-lease: {e}"));
            return Status::Err;
        }
    }
    node::set_cluster(rm::context_flags(raw_ctx) & raw::REDISMODULE_CTX_FLAGS_CLUSTER != 0);
    // Valkey 9 moves slots atomically only when every module says it can:
    // leases and records travel as their AOF form (LEASE.APPLY, LEASE.FENCE),
    // which the destination's import client may send (see events.rs).
    let slot_migration = rm::valkey_major(raw_ctx).is_some_and(|major| major >= 9);
    let mut options = raw::REDISMODULE_OPTIONS_HANDLE_IO_ERRORS as i32;
    if slot_migration {
        options |= events::VALKEY_OPTIONS_HANDLE_ATOMIC_SLOT_MIGRATION;
    }
    // SAFETY: `raw_ctx` is the load context Redis passed RedisModule_OnLoad.
    unsafe { rm::api!(RedisModule_SetModuleOptions)(raw_ctx, options) };
    // The `@lease` ACL category exists where the server lets modules add
    // categories (Redis 7.4+).
    // SAFETY: a read of the API table after RedisModule_Init wrote it (see
    // `api!`); `None` before Redis 7.4.
    let with_category = match unsafe { raw::RedisModule_AddACLCategory } {
        // SAFETY: `raw_ctx` is the load context, where categories may be
        // added; the name is NUL-terminated and copied.
        Some(add) => (unsafe { add(raw_ctx, c"lease".as_ptr()) }) == raw::REDISMODULE_OK as i32,
        None => false,
    };
    rm::keep_module_ctx(raw_ctx);
    background::waiters::install_waker();
    let started = commands::register(raw_ctx, with_category)
        .and_then(|()| commands::subscribe_module_changes(raw_ctx))
        .and_then(|()| events::subscribe(raw_ctx))
        .and_then(|()| match slot_migration {
            true => events::subscribe_slot_migration(raw_ctx),
            false => Ok(()),
        });
    if let Err(e) = started {
        rm::log_warning(raw_ctx, &format!("redis-lease: {e}"));
        return Status::Err;
    }
    // SAFETY: `raw_ctx` is the load context; `info` is a function of the
    // module, which is never unloaded (it has data types).
    unsafe { rm::api!(RedisModule_RegisterInfoFunc)(raw_ctx, Some(commands::stats::info)) };
    eviction::probe_key_events();
    events::refresh_role(raw_ctx);
    eviction::refresh(raw_ctx);
    reaper::refresh_latency_threshold(raw_ctx);
    reaper::start(raw_ctx);
    Status::Ok
}

redis_module! {
    name: "lease",
    version: 1,
    allocator: (crate::Allocator, crate::ALLOCATOR),
    data_types: [LEASE_TYPE, RESOURCE_TYPE],
    init: init,
    configurations: [
        i64: [
            ["reap-batch", &config::REAP_BATCH, config::REAP_BATCH_DEFAULT, config::REAP_BATCH_MIN, config::REAP_BATCH_MAX, ConfigurationFlags::DEFAULT, None],
            ["max-waiters", &config::MAX_WAITERS, config::MAX_WAITERS_DEFAULT, config::MAX_WAITERS_MIN, config::MAX_WAITERS_MAX, ConfigurationFlags::DEFAULT, None],
            ["max-holders", &config::MAX_HOLDERS, config::MAX_HOLDERS_DEFAULT, config::MAX_HOLDERS_MIN, config::MAX_HOLDERS_MAX, ConfigurationFlags::DEFAULT, None],
            ["reap-hz", &config::REAP_HZ, config::REAP_HZ_DEFAULT, config::REAP_HZ_MIN, config::REAP_HZ_MAX, ConfigurationFlags::DEFAULT, None],
        ],
        string: [],
        bool: [],
        enum: [
            ["allkeys-eviction", &eviction::MODE, eviction::AllkeysEviction::refuse, ConfigurationFlags::DEFAULT, None],
        ],
        module_args_as_configuration: false,
    ]
}
