#![allow(clippy::undocumented_unsafe_blocks, unsafe_op_in_unsafe_fn)] // SAFETY comments come with the generated registration
//! The commands' registration: name, handler, flags, arity, key specs and
//! ACL categories; and what `LEASE.FENCE`'s inner-command verdicts depend on.

use std::ffi::CStr;
use std::os::raw::c_int;

use redis_module::raw;

use crate::rm::{api, Ctx, RString};

use super::acquire::acquire_command;
use super::apply::apply_command;
use super::fence::fence_command;
use super::info::info_command;
use super::inner;
use super::release::release_command;
use super::renew::renew_command;
use super::OK;

/// One command's registration: name, handler, flags, arity, key specs and
/// the ACL categories set on servers that have the API (7.2+). Setting them
/// replaces the ones Redis derives from the flags, so they are all named.
struct Spec {
    name: &'static CStr,
    handler: extern "C" fn(Ctx, *mut RString, c_int) -> c_int,
    flags: &'static CStr,
    arity: c_int,
    key_flags: u32,
    /// Whether keys after the third argument (LEASE.FENCE's inner command)
    /// come from the getkeys callback.
    inner_keys: bool,
    acl: &'static str,
    summary: &'static CStr,
}

const SPECS: &[Spec] = &[
    Spec {
        name: c"lease.acquire",
        handler: acquire_command,
        flags: c"write deny-oom",
        arity: -3,
        key_flags: raw::REDISMODULE_CMD_KEY_RW
            | raw::REDISMODULE_CMD_KEY_ACCESS
            | raw::REDISMODULE_CMD_KEY_UPDATE,
        inner_keys: false,
        acl: "write slow blocking",
        summary: c"Acquires a lease on a key: [token, fence], or nil while another token holds it.",
    },
    Spec {
        name: c"lease.renew",
        handler: renew_command,
        flags: c"write fast",
        arity: 4,
        key_flags: raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_UPDATE,
        inner_keys: false,
        acl: "write fast",
        summary: c"Extends a live lease held by the token: 1, else 0.",
    },
    Spec {
        name: c"lease.release",
        handler: release_command,
        flags: c"write fast",
        arity: 3,
        key_flags: raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_DELETE,
        inner_keys: false,
        acl: "write fast",
        summary: c"Releases a live lease held by the token: 1, else 0.",
    },
    Spec {
        name: c"lease.fence",
        handler: fence_command,
        flags: c"write deny-oom getkeys-api",
        arity: -3,
        key_flags: raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_UPDATE,
        inner_keys: true,
        acl: "write slow",
        summary: c"Accepts a fencing token for a resource, then runs an optional command in the same atomic step.",
    },
    Spec {
        name: c"lease.info",
        handler: info_command,
        flags: c"readonly fast",
        arity: 2,
        key_flags: raw::REDISMODULE_CMD_KEY_RO,
        inner_keys: false,
        acl: "read fast",
        summary: c"State, ttl, fence and waiters of a lease; never the token.",
    },
    Spec {
        name: c"lease.apply",
        handler: apply_command,
        flags: c"write",
        // `key fence:deadline token`, or `key fence deadline token` as
        // earlier versions wrote it.
        arity: -4,
        key_flags: raw::REDISMODULE_CMD_KEY_OW | raw::REDISMODULE_CMD_KEY_UPDATE,
        inner_keys: false,
        acl: "write slow",
        summary: c"Internal: replays a lease's state from a master or the AOF.",
    },
];

fn key_spec(flags: u32, begin: c_int, last: c_int) -> raw::RedisModuleCommandKeySpec {
    raw::RedisModuleCommandKeySpec {
        notes: std::ptr::null(),
        flags: u64::from(flags),
        begin_search_type: raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX,
        bs: raw::RedisModuleCommandKeySpec__bindgen_ty_1 {
            index: raw::RedisModuleCommandKeySpec__bindgen_ty_1__bindgen_ty_1 { pos: begin },
        },
        find_keys_type: raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE,
        fk: raw::RedisModuleCommandKeySpec__bindgen_ty_2 {
            range: raw::RedisModuleCommandKeySpec__bindgen_ty_2__bindgen_ty_1 {
                lastkey: last,
                keystep: 1,
                limit: 0,
            },
        },
    }
}

/// `LEASE.FENCE`'s verdicts on inner commands come from `COMMAND INFO`:
/// a module loaded or unloaded may change them.
pub fn subscribe_module_changes(ctx: Ctx) -> Result<(), String> {
    let event = raw::RedisModuleEvent {
        id: raw::REDISMODULE_EVENT_MODULE_CHANGE,
        dataver: 1,
    };
    if unsafe { api!(RedisModule_SubscribeToServerEvent)(ctx, event, Some(on_module_change)) } != OK
    {
        return Err("cannot subscribe to module changes".into());
    }
    Ok(())
}

/// # Safety
/// Called by Redis for a subscribed server event.
unsafe extern "C" fn on_module_change(
    _ctx: Ctx,
    _e: raw::RedisModuleEvent,
    _sub: u64,
    _d: *mut std::os::raw::c_void,
) {
    inner::forget_verdicts();
}

/// Registers the commands. `lease.apply` is marked `internal` where the
/// server knows the flag (Redis 8), hiding it from clients altogether; the
/// handler refuses ordinary clients everywhere.
pub fn register(ctx: Ctx, with_acl_category: bool) -> Result<(), String> {
    static VERSION: raw::RedisModuleCommandInfoVersion = raw::RedisModuleCommandInfoVersion {
        version: 1,
        sizeof_historyentry: std::mem::size_of::<raw::RedisModuleCommandHistoryEntry>(),
        sizeof_keyspec: std::mem::size_of::<raw::RedisModuleCommandKeySpec>(),
        sizeof_arg: std::mem::size_of::<raw::RedisModuleCommandArg>(),
    };
    for spec in SPECS {
        let create = |flags: &CStr| unsafe {
            api!(RedisModule_CreateCommand)(
                ctx,
                spec.name.as_ptr(),
                Some(spec.handler),
                flags.as_ptr(),
                1,
                1,
                1,
            )
        };
        let created = if spec.name == c"lease.apply" {
            create(c"write internal") == OK || create(spec.flags) == OK
        } else {
            create(spec.flags) == OK
        };
        if !created {
            return Err(format!("cannot create command {:?}", spec.name));
        }
        let command = unsafe { api!(RedisModule_GetCommand)(ctx, spec.name.as_ptr()) };
        if command.is_null() {
            return Err(format!("cannot find command {:?}", spec.name));
        }
        let mut specs = vec![key_spec(spec.key_flags, 1, 0)];
        if spec.inner_keys {
            // Any argument from the fourth on may be a key of the inner
            // command; VARIABLE_FLAGS sends key extraction to the callback.
            specs.push(key_spec(
                raw::REDISMODULE_CMD_KEY_RW
                    | raw::REDISMODULE_CMD_KEY_INCOMPLETE
                    | raw::REDISMODULE_CMD_KEY_VARIABLE_FLAGS,
                3,
                -1,
            ));
        }
        specs.push(unsafe { std::mem::zeroed() });
        // Redis copies what it keeps (strings, key specs), so the info only
        // needs to outlive the call.
        let info = raw::RedisModuleCommandInfo {
            version: &VERSION,
            summary: spec.summary.as_ptr(),
            complexity: c"O(1)".as_ptr(),
            since: c"0.1.0".as_ptr(),
            history: std::ptr::null_mut(),
            tips: std::ptr::null(),
            arity: spec.arity,
            key_specs: specs.as_mut_ptr(),
            args: std::ptr::null_mut(),
        };
        if unsafe { api!(RedisModule_SetCommandInfo)(command, &info) } != OK {
            return Err(format!("cannot set command info of {:?}", spec.name));
        }
        if let Some(set_categories) = unsafe { raw::RedisModule_SetCommandACLCategories } {
            let mut categories = spec.acl.to_string();
            if with_acl_category {
                categories.push_str(" lease");
            }
            let categories = std::ffi::CString::new(categories.trim()).unwrap_or_default();
            if !categories.is_empty()
                && unsafe { set_categories(command, categories.as_ptr()) } != OK
            {
                return Err(format!("cannot set ACL categories of {:?}", spec.name));
            }
        }
    }
    Ok(())
}
