//! The LEASE commands: parse, open the key, ask the core, reply, replicate,
//! notify.
//!
//! Every effect is replicated with absolute values (`LEASE.APPLY key
//! fence:deadline token`, `DEL key`, `LEASE.FENCE resource fence`), or as the call
//! itself where that is already exact (`LEASE.FENCE` without a command, and
//! `LEASE.RELEASE` that deleted the key, which a replica applies as the
//! deletion), so replicas and AOF replay never consult their own clock or
//! random source.

mod inner;
pub mod stats;

use std::ffi::CStr;
use std::os::raw::c_int;

use redis_module::raw;

use crate::keyspace::effects::{
    self, expired_before_reaping, granted, index_lease, replicate_held, replicate_lease,
    replicate_record, Wire,
};
use crate::keyspace::state::{self, STATS};
use crate::keyspace::types::{self, lease_type, resource_type};
use crate::model::args::{self, check_token, parse_fence, parse_ttl};
use crate::model::error;
use crate::model::lease::{Acquire, Lease, Resource, State};
use crate::rm::{self, api, Ctx, Key, RString, Slot};
use inner::Verdict;

const OK: c_int = raw::REDISMODULE_OK as c_int;

/// A random 128-bit token as 32 lowercase hex characters, from the thread's
/// OS-seeded CSPRNG.
fn generate_token() -> [u8; 32] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bits: u128 = rand::random();
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = HEX[((bits >> (124 - 4 * i)) & 0xf) as usize];
    }
    out
}

/// Wraps a command body: a panic becomes an error reply and a log line.
///
/// `secret` names the arguments that carry a token; they are redacted from
/// MONITOR, SLOWLOG and logs once the body is done with it (some servers
/// replace the argument itself, so redacting earlier would hide the token
/// from the command too).
fn command(
    name: &str,
    ctx: Ctx,
    argv: *mut RString,
    argc: c_int,
    body: fn(Ctx, &[RString]) -> c_int,
    secret: fn(&[RString], &mut dyn FnMut(usize)),
) -> c_int {
    rm::guard(
        name,
        || rm::reply_error(ctx, error::INTERNAL),
        || {
            let args = rm::args(argv, argc);
            let status = body(ctx, args);
            secret(args, &mut |pos| rm::redact(ctx, pos));
            status
        },
    )
}

fn no_secret(_: &[RString], _: &mut dyn FnMut(usize)) {}

/// RENEW and RELEASE: `key token ...`.
fn second_argument(args: &[RString], redact: &mut dyn FnMut(usize)) {
    if args.len() > 2 {
        redact(2);
    }
}

/// ACQUIRE: every argument after a `TOKEN`, also in a call refused for
/// its syntax.
fn token_option(args: &[RString], redact: &mut dyn FnMut(usize)) {
    (3..args.len().saturating_sub(1))
        .filter(|&i| rm::bytes(args[i]).eq_ignore_ascii_case(b"TOKEN"))
        .for_each(|i| redact(i + 1));
}

/// FENCE: a nested LEASE command (refused) may carry a token anywhere.
fn nested_lease_command(args: &[RString], redact: &mut dyn FnMut(usize)) {
    let nested = args.get(3).is_some_and(|&c| {
        let name = rm::bytes(c);
        name.len() > 6 && name[..6].eq_ignore_ascii_case(b"lease.")
    });
    if nested {
        (4..args.len()).for_each(redact);
    }
}

/// APPLY: the token is the last argument (`key fence:deadline token`, or
/// `key fence deadline token` as earlier versions wrote it).
fn last_argument(args: &[RString], redact: &mut dyn FnMut(usize)) {
    if args.len() > 3 {
        redact(args.len() - 1);
    }
}

/// The lease in an open key: `None` for an empty key, an error for a key of
/// another type.
fn lease_in(key: &mut Key) -> Result<Option<&mut Lease>, &'static CStr> {
    match key.value::<Lease>(lease_type()) {
        Slot::WrongType => Err(error::WRONGTYPE),
        Slot::Empty => Ok(None),
        Slot::Ours(lease) => Ok(Some(lease)),
    }
}

fn reply_grant(ctx: Ctx, token: &[u8], fence: u64) -> c_int {
    rm::reply_array(ctx, 2);
    rm::reply_bulk(ctx, token);
    rm::reply_integer(ctx, fence as i64)
}

/// `LEASE.ACQUIRE key ttl [TOKEN token] [BLOCK timeout]`
pub extern "C" fn acquire_command(ctx: Ctx, argv: *mut RString, argc: c_int) -> c_int {
    command("LEASE.ACQUIRE", ctx, argv, argc, acquire, token_option)
}

fn parse_acquire(args: &[RString]) -> Result<(RString, args::Acquire<'_, RString>), &'static CStr> {
    let [_, key, ttl, options @ ..] = args else {
        return Err(error::ACQUIRE_SYNTAX);
    };
    let parsed = args::parse_acquire(rm::bytes(*ttl), options, |o| rm::bytes(*o))?;
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
        Some(&arg) => (rm::bytes(arg), Wire::Arg(arg)),
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
    let (lease, stored) = match key.value::<Lease>(lease_type()) {
        Slot::WrongType => return rm::reply_error(ctx, error::WRONGTYPE),
        Slot::Empty => (&mut fresh, false),
        Slot::Ours(lease) => (lease, true),
    };
    // Clients already waiting get a free lease before this caller does.
    let queue_ahead = effects::has_waiters(ctx, key_name);
    // A grant over a holder is a grant over an expired one.
    let had_holder = lease.deadline().is_some();
    let outcome = lease.acquire(token, parsed.ttl_ms, now, queue_ahead, &mut state::fences());
    let fence = match outcome {
        Err(_) => return rm::reply_error(ctx, error::FENCE_EXHAUSTED),
        Ok(Acquire::Busy) => {
            state::bump(&STATS.contended);
            if queue_ahead && !lease.is_live(now) {
                // Free, but owed to the queue: serve its head now rather
                // than at the reaper's next tick.
                effects::signal(ctx, key_name);
            }
            return match parsed.block_ms {
                Some(timeout) => {
                    crate::background::waiters::block(ctx, key_name, token, parsed.ttl_ms, timeout)
                }
                None => rm::reply_null_array(ctx),
            };
        }
        Ok(Acquire::Granted { fence }) => {
            state::bump(&STATS.grants);
            if had_holder {
                expired_before_reaping(ctx, key_name);
            }
            fence
        }
        Ok(Acquire::Retried { fence }) => {
            state::bump(&STATS.retries);
            fence
        }
    };
    let lease = if stored {
        lease
    } else {
        types::store_lease(&mut key, fresh)
    };
    granted(ctx, key_name, lease, wire);
    drop(key);
    reply_grant(ctx, token, fence)
}

/// `LEASE.RENEW key token ttl`
pub extern "C" fn renew_command(ctx: Ctx, argv: *mut RString, argc: c_int) -> c_int {
    command("LEASE.RENEW", ctx, argv, argc, renew, second_argument)
}

fn renew(ctx: Ctx, args: &[RString]) -> c_int {
    if !writable(ctx) {
        return rm::reply_error(ctx, error::READONLY);
    }
    let [_, key_name, token_arg, ttl] = args else {
        return rm::reply_error(
            ctx,
            c"ERR wrong number of arguments for 'lease.renew' command",
        );
    };
    let parsed =
        check_token(rm::bytes(*token_arg)).and_then(|t| Ok((t, parse_ttl(rm::bytes(*ttl))?)));
    let (token, ttl_ms) = match parsed {
        Ok(p) => p,
        Err(e) => return rm::reply_error(ctx, e),
    };
    let Some(mut key) = Key::open_write(ctx, *key_name) else {
        return rm::reply_error(ctx, error::INTERNAL);
    };
    let lease = match lease_in(&mut key) {
        Ok(lease) => lease,
        Err(e) => return rm::reply_error(ctx, e),
    };
    // No key, an expired lease or another holder's: refused alike.
    let mut mark = None;
    let renewed = lease.and_then(|l| {
        mark = l.index_mark();
        l.renew(token, ttl_ms, rm::now_ms()).then_some(l)
    });
    let Some(lease) = renewed else {
        state::bump(&STATS.renewals_rejected);
        return rm::reply_integer(ctx, 0);
    };
    // A renewal to a shorter ttl moves the deadline before the lease's
    // index entry, which would reach its expiry (and its waiters) late.
    if mark.is_some_and(|at| lease.deadline().is_some_and(|d| d < at)) {
        index_lease(ctx, *key_name, lease);
    }
    state::bump(&STATS.renewals);
    replicate_held(ctx, *key_name, lease, Wire::Arg(*token_arg));
    rm::notify(ctx, c"lease.renew", *key_name);
    rm::reply_integer(ctx, 1)
}

/// `LEASE.RELEASE key token`
pub extern "C" fn release_command(ctx: Ctx, argv: *mut RString, argc: c_int) -> c_int {
    command("LEASE.RELEASE", ctx, argv, argc, release, second_argument)
}

fn release(ctx: Ctx, args: &[RString]) -> c_int {
    if !writable(ctx) {
        return rm::reply_error(ctx, error::READONLY);
    }
    let [_, key_name, token] = args else {
        return rm::reply_error(
            ctx,
            c"ERR wrong number of arguments for 'lease.release' command",
        );
    };
    let token = match check_token(rm::bytes(*token)) {
        Ok(t) => t,
        Err(e) => return rm::reply_error(ctx, e),
    };
    let Some(mut key) = Key::open_write(ctx, *key_name) else {
        return rm::reply_error(ctx, error::INTERNAL);
    };
    let lease = match lease_in(&mut key) {
        Ok(lease) => lease,
        Err(e) => return rm::reply_error(ctx, e),
    };
    if from_master_or_aof(ctx) {
        // The effect of a release that deleted the key where it was decided:
        // applied as that, whatever this node's clock says of the deadline.
        if lease.is_none() {
            return rm::reply_integer(ctx, 0);
        }
        types::delete(&mut key);
        drop(key);
        // Into this node's own AOF: a module command is written there only
        // when it replicates itself.
        rm::replicate_verbatim(ctx);
        rm::notify(ctx, c"lease.release", *key_name);
        return rm::reply_integer(ctx, 1);
    }
    let now = rm::now_ms();
    let Some(lease) = lease else {
        state::bump(&STATS.releases_rejected);
        return rm::reply_integer(ctx, 0);
    };
    let mark = lease.index_mark();
    if !lease.release(token, now) {
        state::bump(&STATS.releases_rejected);
        return rm::reply_integer(ctx, 0);
    }
    state::bump(&STATS.releases);
    if let (Some(at), true) = (mark, state::is_primary()) {
        state::index().remove(at, rm::selected_db(ctx), rm::bytes(*key_name));
    }
    if !effects::has_waiters(ctx, *key_name) {
        types::delete(&mut key);
        // Replicas and the AOF replay the call itself as this deletion,
        // which costs less than building a `DEL` to send instead.
        rm::replicate_verbatim(ctx);
    } else {
        // The key stays, free, for the first waiter, who is served before
        // any other client's command runs.
        replicate_lease(ctx, *key_name, lease);
        effects::signal(ctx, *key_name);
    }
    rm::notify(ctx, c"lease.release", *key_name);
    rm::reply_integer(ctx, 1)
}

/// `LEASE.INFO key`
pub extern "C" fn info_command(ctx: Ctx, argv: *mut RString, argc: c_int) -> c_int {
    command("LEASE.INFO", ctx, argv, argc, info, no_secret)
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
    let lease = match key.value::<Lease>(lease_type()) {
        Slot::WrongType => return rm::reply_error(ctx, error::WRONGTYPE),
        Slot::Empty => return rm::reply_null(ctx),
        Slot::Ours(lease) => lease,
    };
    let (state, ttl): (&[u8], i64) = match lease.state(rm::now_ms()) {
        State::Held { ttl_ms } => (b"held", ttl_ms as i64),
        State::Free => (b"free", -1),
    };
    rm::reply_map(ctx, 4);
    rm::reply_bulk(ctx, b"state");
    rm::reply_bulk(ctx, state);
    rm::reply_bulk(ctx, b"ttl");
    rm::reply_integer(ctx, ttl);
    rm::reply_bulk(ctx, b"fence");
    rm::reply_integer(ctx, lease.fence() as i64);
    rm::reply_bulk(ctx, b"waiters");
    rm::reply_integer(ctx, effects::waiters_on(ctx, *key_name) as i64)
}

/// `LEASE.FENCE resource fence [command [arg ...]]`
pub extern "C" fn fence_command(ctx: Ctx, argv: *mut RString, argc: c_int) -> c_int {
    if unsafe { api!(RedisModule_IsKeysPositionRequest)(ctx) } != 0 {
        return rm::guard(
            "LEASE.FENCE getkeys",
            || OK,
            || {
                inner::report_keys(ctx, rm::args(argv, argc));
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
    let fence = match parse_fence(rm::bytes(*fence_arg)) {
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
        match key.value::<Resource>(resource_type()) {
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
            return rm::reply_error_string(ctx, &error::fence_forbidden(rm::bytes(inner_args[0])))
        }
    }
    if inner::touches(inner_args, rm::bytes(*resource)) {
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
    let recorded = match key.value::<Resource>(resource_type()) {
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
        replicate_record(ctx, *resource, fence);
        rm::notify(ctx, c"lease.fence", *resource);
    }
    reply.send(ctx)
}

/// `LEASE.FENCE resource fence` with no command: check and record in one
/// key open.
fn record_fence(ctx: Ctx, resource: RString, fence: u64) -> c_int {
    let Some(mut key) = Key::open_write(ctx, resource) else {
        return rm::reply_error(ctx, error::INTERNAL);
    };
    match key.value::<Resource>(resource_type()) {
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
    rm::replicate_verbatim(ctx);
    rm::notify(ctx, c"lease.fence", resource);
    rm::reply_integer(ctx, fence as i64)
}

/// `LEASE.APPLY key fence:deadline token`: an effect from a master or the
/// AOF. An empty token means free.
pub extern "C" fn apply_command(ctx: Ctx, argv: *mut RString, argc: c_int) -> c_int {
    command("LEASE.APPLY", ctx, argv, argc, apply, last_argument)
}

/// Where the running command comes from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// A client: this node decides.
    Client,
    /// This node's master, or the AOF replay: an effect decided elsewhere.
    Master,
    /// The import client of an atomic slot migration into this primary
    /// (Valkey 9): the source's effects, for keys of slots not yet this
    /// node's.
    SlotImport,
}

/// A primary has no master, so there, outside slot imports, only the AOF
/// client's id is checked; the context flags, which compute every flag to
/// answer one, are asked on replicas and while slots are imported (the
/// import client is the only one a primary sees as replicated).
fn origin(ctx: Ctx) -> Origin {
    if rm::replaying_aof(ctx) {
        return Origin::Master;
    }
    let primary = state::is_primary();
    if primary && !state::importing_slots() {
        return Origin::Client;
    }
    if rm::context_flags(ctx) & raw::REDISMODULE_CTX_FLAGS_REPLICATED == 0 {
        Origin::Client
    } else if primary {
        Origin::SlotImport
    } else {
        Origin::Master
    }
}

/// Whether the running command is an effect decided elsewhere.
fn from_master_or_aof(ctx: Ctx) -> bool {
    origin(ctx) != Origin::Client
}

/// Whether this node may decide a write: a primary, or a replica applying
/// what its master or the AOF says. A writable replica
/// (`replica-read-only no`) takes other writes to its own keys, never to
/// leases: a grant there would be a second holder nobody else sees.
fn writable(ctx: Ctx) -> bool {
    state::is_primary() || from_master_or_aof(ctx)
}

fn apply(ctx: Ctx, args: &[RString]) -> c_int {
    let origin = origin(ctx);
    if origin == Origin::Client {
        return rm::reply_error(ctx, error::INTERNAL_ONLY);
    }
    let [_, key_name, effect @ ..] = args else {
        return rm::reply_error(ctx, error::APPLY_ARGS);
    };
    let (fence, holder) = match args::parse_apply_args(effect, |a| rm::bytes(*a)) {
        Ok(parsed) => parsed,
        Err(e) => return rm::reply_error(ctx, e),
    };
    state::fences().observe(fence, rm::now_ms());
    let Some(mut key) = Key::open_write(ctx, *key_name) else {
        return rm::reply_error(ctx, error::INTERNAL);
    };
    let lease = match key.value::<Lease>(lease_type()) {
        Slot::Ours(lease) => {
            lease.apply(holder, fence);
            lease
        }
        slot => {
            // The master says this key is a lease; whatever the replica had
            // under the name is gone on the master too.
            if matches!(slot, Slot::WrongType) {
                key.delete();
            }
            types::store_lease(&mut key, Lease::from_parts(holder, fence))
        }
    };
    if origin != Origin::SlotImport {
        index_lease(ctx, *key_name, lease);
    }
    drop(key);
    // A replica's own AOF gets the effect only this way (a module command
    // is never written there for it); replaying the AOF propagates nothing.
    rm::replicate_verbatim(ctx);
    rm::reply_simple(ctx, c"OK")
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_tokens_are_32_hex_and_differ() {
        let a = generate_token();
        let b = generate_token();
        assert!(a
            .iter()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_ne!(a, b);
    }
}
