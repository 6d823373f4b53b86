//! The inner command of `LEASE.FENCE`: which commands may run, their keys
//! for `COMMAND GETKEYS`, cluster routing and key ACLs, and the call itself
//! under the caller's ACL user.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::os::raw::c_int;
use std::sync::Mutex;

use redis_module::raw;

use crate::rm::{self, api, Ctx, RString};

/// Most arguments the inner command may have after its name. Keeps key
/// extraction (`RedisModule_GetCommandKeysWithFlags`) under 256 keys: past
/// that, Redis 7.0-8.2 and Valkey 8.1 do not free its buffer.
pub const MAX_ARGS: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Allowed,
    /// Blocking, scripting, transaction, admin and other commands a script
    /// may not run.
    Forbidden,
    /// A LEASE command: no recursion.
    Nested,
    Unknown,
}

/// Verdicts by lowercase command name (`name` or `container|sub`). Filled on
/// first use of each name, from `COMMAND INFO`, so the hot path is one map
/// look-up. Cleared when a module loads or unloads.
static VERDICTS: Mutex<Option<HashMap<Vec<u8>, Known>>> = Mutex::new(None);

/// A command's verdict, and whether it is a container of subcommands.
type Known = (Verdict, bool);

pub fn forget_verdicts() {
    *VERDICTS.lock().unwrap_or_else(|e| e.into_inner()) = None;
}

/// Flags (as `COMMAND INFO` names them) that rule a command out: what a
/// script may not run (`noscript`: MULTI, EXEC, EVAL, SUBSCRIBE, WAIT...),
/// what may block, and admin commands.
const FORBIDDEN_FLAGS: &[&[u8]] = &[b"noscript", b"blocking", b"admin", b"no_multi"];

pub fn verdict(ctx: Ctx, args: &[RString]) -> Verdict {
    let Some(name) = args.first() else {
        return Verdict::Unknown;
    };
    let name = rm::bytes(name).to_ascii_lowercase();
    if name.starts_with(b"lease.") {
        return Verdict::Nested;
    }
    let (verdict, container) = lookup(ctx, &name);
    if !container || verdict != Verdict::Allowed {
        return verdict;
    }
    // A container (CONFIG, CLIENT, OBJECT...): the subcommand decides; one
    // that runs alone too (COMMAND) is judged as itself.
    let Some(sub) = args.get(1) else {
        return verdict;
    };
    let mut full = name;
    full.push(b'|');
    full.extend(rm::bytes(sub).to_ascii_lowercase());
    lookup(ctx, &full).0
}

fn lookup(ctx: Ctx, name: &[u8]) -> Known {
    let mut cache = VERDICTS.lock().unwrap_or_else(|e| e.into_inner());
    let cache = cache.get_or_insert_with(HashMap::new);
    if let Some(v) = cache.get(name) {
        return *v;
    }
    let found = command_info(ctx, name);
    // Unknown names are not cached: a client could fill the map with them.
    if found.0 != Verdict::Unknown {
        cache.insert(name.to_vec(), found);
    }
    found
}

/// Runs `COMMAND INFO name` and reads the flags and subcommands out of it.
fn command_info(ctx: Ctx, name: &[u8]) -> Known {
    // SAFETY: `ctx` is the running command's context; the format `cb`
    // takes the NUL-terminated string and the pointer and length passed.
    let reply = unsafe {
        api!(RedisModule_Call)(
            ctx,
            c"COMMAND".as_ptr(),
            c"cb".as_ptr(),
            c"INFO".as_ptr(),
            name.as_ptr(),
            name.len(),
        )
    };
    let Some(reply) = CallReply::new(reply) else {
        return (Verdict::Unknown, false);
    };
    let Some(entry) = reply.element(0).filter(|e| e.is_array()) else {
        return (Verdict::Unknown, false);
    };
    let forbidden = entry
        .element(2)
        .map(|flags| {
            (0..flags.len()).any(|i| {
                flags
                    .element(i)
                    .is_some_and(|f| FORBIDDEN_FLAGS.contains(&f.string()))
            })
        })
        .unwrap_or(true);
    // `@dangerous` (FLUSHALL, KEYS, SWAPDB, ...) is refused with admin: none
    // of it belongs inside a fenced write.
    let dangerous = entry.element(6).is_some_and(|cats| {
        (0..cats.len()).any(|i| cats.element(i).is_some_and(|c| c.string() == b"@dangerous"))
    });
    let forbidden = forbidden || dangerous;
    let container = entry.element(9).is_some_and(|subs| subs.len() > 0);
    let verdict = if forbidden {
        Verdict::Forbidden
    } else {
        Verdict::Allowed
    };
    (verdict, container)
}

/// A call reply; the top-level one is freed on drop, elements borrow it
/// (`'p`), so `inner` is a live reply for as long as a CallReply lives.
pub struct CallReply<'p> {
    inner: *mut raw::RedisModuleCallReply,
    owned: bool,
    parent: PhantomData<&'p ()>,
}

impl CallReply<'static> {
    /// Takes ownership of a reply from `RedisModule_Call` (null: none).
    fn new(inner: *mut raw::RedisModuleCallReply) -> Option<Self> {
        (!inner.is_null()).then_some(Self {
            inner,
            owned: true,
            parent: PhantomData,
        })
    }
}

impl CallReply<'_> {
    fn kind(&self) -> c_int {
        // SAFETY: `inner` is live while `self` is (see `CallReply`).
        unsafe { api!(RedisModule_CallReplyType)(self.inner) }
    }

    fn is_array(&self) -> bool {
        self.kind() == raw::REDISMODULE_REPLY_ARRAY as c_int
    }

    pub fn is_error(&self) -> bool {
        self.kind() == raw::REDISMODULE_REPLY_ERROR as c_int
    }

    /// Redis 7.0 reports an ACL refusal inside a module call as a plain
    /// `ERR acl verification failed`; newer servers say `NOPERM`.
    pub fn is_acl_refusal(&self) -> bool {
        self.is_error() && self.string().starts_with(b"ERR acl verification failed")
    }

    fn len(&self) -> usize {
        // SAFETY: `inner` is live while `self` is (see `CallReply`).
        unsafe { api!(RedisModule_CallReplyLength)(self.inner) }
    }

    /// Element `i` of an array reply, borrowing this one.
    fn element(&self, i: usize) -> Option<CallReply<'_>> {
        if !self.is_array() || i >= self.len() {
            return None;
        }
        // SAFETY: `inner` is a live array reply with more than `i` elements.
        let e = unsafe { api!(RedisModule_CallReplyArrayElement)(self.inner, i) };
        (!e.is_null()).then_some(CallReply {
            inner: e,
            owned: false,
            parent: PhantomData,
        })
    }

    fn string(&self) -> &[u8] {
        let mut len = 0usize;
        // SAFETY: `inner` is live while `self` is (see `CallReply`); a reply
        // that is no string answers null.
        let ptr = unsafe { api!(RedisModule_CallReplyStringPtr)(self.inner, &mut len) };
        if ptr.is_null() {
            return &[];
        }
        // SAFETY: Redis gave `len` bytes at `ptr`, inside the reply, which
        // outlives the borrow of `self` (see `CallReply`).
        unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) }
    }

    /// Passes the reply on to the client as it is.
    pub fn send(self, ctx: Ctx) -> c_int {
        // SAFETY: `ctx` is the running command's context; `inner` is live
        // while `self` is, and Redis copies the reply out.
        unsafe { api!(RedisModule_ReplyWithCallReply)(ctx, self.inner) }
    }
}

impl Drop for CallReply<'_> {
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: an owned reply came from RedisModule_Call and is freed
            // once, here; its elements borrow it, so none is left.
            unsafe { api!(RedisModule_FreeCallReply)(self.inner) };
        }
    }
}

/// Runs the inner command as the calling user (`C`: ACL for the command and
/// its keys), replicating its effects (`!`), with errors as replies (`E`) in
/// the caller's protocol (`0`). `Err` means the command was refused or
/// failed, with its error reply when the server gave one.
pub fn call(ctx: Ctx, args: &[RString]) -> Result<CallReply<'static>, Option<CallReply<'static>>> {
    let Some((name, rest)) = args.split_first() else {
        return Err(None);
    };
    let name = rm::bytes(name);
    let mut cname = Vec::with_capacity(name.len() + 1);
    cname.extend(name.iter().copied().filter(|&b| b != 0));
    cname.push(0);
    // SAFETY: `ctx` is the running command's context; `cname` is
    // NUL-terminated above; the format `v` takes the array of module
    // strings `rest` (live handles, by the handle rule) and its length.
    let reply = unsafe {
        api!(RedisModule_Call)(
            ctx,
            cname.as_ptr().cast(),
            c"!CE0v".as_ptr(),
            rest.as_ptr(),
            rest.len(),
        )
    };
    match CallReply::new(reply) {
        Some(r) if r.is_error() => Err(Some(r)),
        Some(r) => Ok(r),
        None => Err(None),
    }
}

/// Whether the inner command mentions `resource` among its arguments: it
/// could overwrite or delete the record that guards it. Comparing every
/// argument (not only the keys) is stricter than needed, and avoids the
/// servers' key extraction, whose buffers Redis 8.2 does not free.
pub fn touches(inner: &[RString], resource: &[u8]) -> bool {
    inner.iter().skip(1).any(|a| rm::bytes(a) == resource)
}

/// `COMMAND GETKEYS` and cluster routing: the resource, then the inner
/// command's keys, with their flags.
pub fn report_keys(ctx: Ctx, args: &[RString]) {
    if args.len() < 2 {
        return;
    }
    let rw_update = (raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_UPDATE) as c_int;
    // Position 1 (the resource) is an argument: `args.len() >= 2`.
    rm::report_key(ctx, 1, rw_update);
    // An oversized inner command is refused when it runs; its keys are
    // not extracted (see MAX_ARGS).
    if args.len() < 4 || args.len() > 4 + MAX_ARGS {
        return;
    }
    // SAFETY: a read of the API table after RedisModule_Init wrote it (see
    // `api!`); `None` on a server without key extraction.
    let Some(get_keys) = (unsafe { raw::RedisModule_GetCommandKeysWithFlags }) else {
        return;
    };
    let inner = &args[3..];
    let mut num: c_int = 0;
    let mut flags: *mut c_int = std::ptr::null_mut();
    // SAFETY: `ctx` is the running request's context; `inner` is `len` live
    // argument handles (Redis only reads them, whatever the pointer's
    // mutability); `num` and `flags` are out-parameters it writes.
    let positions = unsafe {
        get_keys(
            ctx,
            inner.as_ptr().cast_mut(),
            inner.len() as c_int,
            &mut num,
            &mut flags,
        )
    };
    if positions.is_null() {
        return;
    }
    let count = usize::try_from(num).unwrap_or(0);
    // SAFETY: Redis returned an array of `num` positions, ours until freed
    // below.
    let positions_slice = unsafe { std::slice::from_raw_parts(positions, count) };
    for (i, &pos) in positions_slice.iter().enumerate() {
        let key_flags = if flags.is_null() {
            rw_update
        } else {
            // SAFETY: a non-null `flags` is an array of `num` flags, one per
            // position, and `i < num`.
            unsafe { *flags.add(i) }
        };
        // Each position is one of the inner command's arguments, which
        // start at 3 in this command's: a position that exists.
        rm::report_key(ctx, pos + 3, key_flags);
    }
    // SAFETY: both arrays were allocated by the server for this module
    // (RedisModule_Alloc) and are freed once, here; nothing read from them
    // is kept.
    unsafe {
        api!(RedisModule_Free)(positions.cast());
        if !flags.is_null() {
            api!(RedisModule_Free)(flags.cast());
        }
    }
}
