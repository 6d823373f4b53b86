//! `LEASE.FENCE resource fence [command [arg ...]]`: the protected resource's
//! side of fencing.

use std::os::raw::c_int;

use crate::keyspace::commit::values::{self, Record};
use crate::keyspace::state::{self, STATS};
use crate::keyspace::types;
use crate::model::args::parse_fence;
use crate::model::error;
use crate::model::lease::Resource;
use crate::rm::{self, Ctx, Key, RString, Slot};

use super::inner::{self, Verdict};
use super::{command, nested_lease_command, writable, OK};

/// `LEASE.FENCE resource fence [command [arg ...]]`
pub extern "C" fn fence_command(ctx: Ctx, argv: *mut RString, argc: c_int) -> c_int {
    if rm::keys_position_request(ctx) {
        return rm::guard(
            "LEASE.FENCE getkeys",
            || OK,
            || {
                // SAFETY: `argv` and `argc` are this call's arguments, and
                // the slice ends with this closure.
                inner::report_keys(ctx, unsafe { rm::args(argv, argc) });
                OK
            },
        );
    }
    command("LEASE.FENCE", ctx, argv, argc, fence, nested_lease_command)
}

fn fence(ctx: Ctx, args: &[RString]) -> c_int {
    if !writable(ctx) {
        return rm::reply_error(ctx, error::READONLY);
    }
    let [_, resource, fence_arg, inner_args @ ..] = args else {
        return rm::reply_error(
            ctx,
            c"ERR wrong number of arguments for 'lease.fence' command",
        );
    };
    let fence = match parse_fence(rm::bytes(fence_arg)) {
        Ok(f) => f,
        Err(e) => return rm::reply_error(ctx, e),
    };
    if let Err(e) = crate::background::eviction::admit(ctx) {
        return rm::reply_error(ctx, e);
    }
    if inner_args.is_empty() {
        return record_fence(ctx, *resource, fence);
    }
    if inner_args.len() > 1 + inner::MAX_ARGS {
        return rm::reply_error(ctx, error::FENCE_TOO_MANY_ARGS);
    }
    // Check first, with the key closed again before the inner command runs:
    // the inner command may touch any key, and no handle may outlive that.
    {
        let Some(mut key) = Key::open_write(ctx, *resource) else {
            return rm::reply_error(ctx, error::INTERNAL);
        };
        match key.value::<Resource>() {
            Slot::WrongType => return rm::reply_error(ctx, error::WRONGTYPE),
            Slot::Empty => {}
            Slot::Ours(r) => {
                if let Err(stale) = r.check(fence) {
                    state::bump(&STATS.fence_rejected);
                    return rm::reply_error_string(ctx, &error::stale(fence, stale.highest));
                }
            }
        }
    }
    match inner::verdict(ctx, inner_args) {
        Verdict::Allowed => {}
        Verdict::Nested => return rm::reply_error(ctx, error::FENCE_NESTED),
        Verdict::Unknown => return rm::reply_error(ctx, error::FENCE_UNKNOWN_COMMAND),
        Verdict::Forbidden => {
            return rm::reply_error_string(ctx, &error::fence_forbidden(rm::bytes(&inner_args[0])))
        }
    }
    if inner::touches(inner_args, rm::bytes(resource)) {
        return rm::reply_error(ctx, error::FENCE_TOUCHES_RESOURCE);
    }
    let reply = match inner::call(ctx, inner_args) {
        Ok(reply) => reply,
        // The inner command was refused or failed: nothing is recorded, and
        // its error is the reply.
        Err(reply) => {
            state::bump(&STATS.fence_rejected);
            return match reply {
                Some(reply) if reply.is_acl_refusal() => rm::reply_error(ctx, error::NOPERM_INNER),
                Some(reply) => reply.send(ctx),
                None => rm::reply_error(ctx, error::FENCE_CALL_REFUSED),
            };
        }
    };
    let Some(mut key) = Key::open_write(ctx, *resource) else {
        return rm::reply_error(ctx, error::INTERNAL);
    };
    let recorded = match key.value::<Resource>() {
        Slot::Empty => {
            types::store_resource(&mut key, Resource::new(fence));
            true
        }
        Slot::Ours(r) => r.accept(fence).is_ok(),
        Slot::WrongType => false,
    };
    drop(key);
    if recorded {
        state::bump(&STATS.fence_accepted);
        values::record_written(ctx, *resource, Record::Highest(fence), true);
    }
    reply.send(ctx)
}

/// `LEASE.FENCE resource fence` with no command: check and record in one
/// key open.
fn record_fence(ctx: Ctx, resource: RString, fence: u64) -> c_int {
    let Some(mut key) = Key::open_write(ctx, resource) else {
        return rm::reply_error(ctx, error::INTERNAL);
    };
    match key.value::<Resource>() {
        Slot::WrongType => return rm::reply_error(ctx, error::WRONGTYPE),
        Slot::Empty => {
            types::store_resource(&mut key, Resource::new(fence));
        }
        Slot::Ours(r) => {
            if let Err(stale) = r.accept(fence) {
                state::bump(&STATS.fence_rejected);
                return rm::reply_error_string(ctx, &error::stale(fence, stale.highest));
            }
        }
    }
    drop(key);
    state::bump(&STATS.fence_accepted);
    // The call is its own effect: the replica's record holds the same
    // highest, so replaying it is exact.
    values::record_written(ctx, resource, Record::Verbatim, true);
    rm::reply_integer(ctx, fence as i64)
}
