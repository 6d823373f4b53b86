//! Thin, safe wrappers over the parts of the Redis module API this module
//! uses, so `commands.rs` reads as command logic rather than FFI.
//!
//! The API table is filled by `RedisModule_Init` before any of these run;
//! functions a server may lack (newer than Redis 7.0) are checked at the call
//! site instead of going through `api!`.

use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;

use redis_module::raw;

/// A function of the module API that every supported server has.
macro_rules! api {
    ($name:ident) => {{
        // RedisModule_Init fills these before any callback can run, and
        // every server the module supports (Redis 7.0+, Valkey 8) has them.
        #[allow(unused_unsafe)]
        let f = unsafe { redis_module::raw::$name.unwrap() }; // ok: filled at load
        f
    }};
}
pub(crate) use api;

pub type Ctx = *mut raw::RedisModuleCtx;

const OK: c_int = raw::REDISMODULE_OK as c_int;
pub type RString = *mut raw::RedisModuleString;

/// Runs a callback body, turning a panic into a logged warning and
/// `on_panic()` instead of an abort of the whole server: redis-module does
/// not catch unwinds, and unwinding across `extern "C"` aborts.
pub fn guard<T>(what: &str, on_panic: impl FnOnce() -> T, body: impl FnOnce() -> T) -> T {
    #[cfg(feature = "fault-injection")]
    let body = || {
        if faults::armed(what) {
            panic!("injected into {what}");
        }
        body()
    };
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(v) => v,
        Err(payload) => {
            let detail = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            log_warning(
                std::ptr::null_mut(),
                &format!("redis-lease: internal error in {what}: {detail}"),
            );
            on_panic()
        }
    }
}

/// The entry points that panic on purpose (`fault-injection` builds only).
#[cfg(feature = "fault-injection")]
pub mod faults {
    use std::sync::Mutex;

    static ARMED: Mutex<Vec<String>> = Mutex::new(Vec::new());

    /// `names`: guard names separated by `|`.
    pub fn arm(names: &str) {
        let mut armed = ARMED.lock().unwrap_or_else(|e| e.into_inner());
        armed.extend(names.split('|').map(str::to_string));
    }

    pub fn armed(what: &str) -> bool {
        ARMED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|n| n == what)
    }
}

pub fn log_warning(ctx: Ctx, msg: &str) {
    log(ctx, c"warning", msg);
}

/// Writes `msg` to the server log. Control characters (a key name is any
/// bytes a client chose) become `?`, so one call is one log line.
fn log(ctx: Ctx, level: &CStr, msg: &str) {
    let mut buf = Vec::with_capacity(msg.len() + 1);
    buf.extend(
        msg.bytes()
            .map(|b| if b < 0x20 || b == 0x7f { b'?' } else { b }),
    );
    buf.push(0);
    unsafe { api!(RedisModule_Log)(ctx, level.as_ptr(), c"%s".as_ptr(), buf.as_ptr()) };
}

/// The bytes of a module string. Valid while the string lives, which for
/// command arguments is the whole command.
pub fn bytes<'a>(s: RString) -> &'a [u8] {
    let mut len = 0usize;
    let ptr = unsafe { api!(RedisModule_StringPtrLen)(s, &mut len) };
    if ptr.is_null() || len == 0 {
        return &[];
    }
    unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) }
}

/// The arguments of a command call.
pub fn args<'a>(argv: *mut RString, argc: c_int) -> &'a [RString] {
    match usize::try_from(argc) {
        Ok(n) if n > 0 && !argv.is_null() => unsafe { std::slice::from_raw_parts(argv, n) },
        _ => &[],
    }
}

pub fn now_ms() -> u64 {
    u64::try_from(unsafe { api!(RedisModule_Milliseconds)() }).unwrap_or(0)
}

pub fn context_flags(ctx: Ctx) -> u32 {
    unsafe { api!(RedisModule_GetContextFlags)(ctx) as u32 }
}

/// The id every server gives the client that replays the AOF at startup
/// (`CLIENT_ID_AOF`, reserved so that modules can tell it apart).
const AOF_CLIENT_ID: u64 = u64::MAX;

/// Whether the command runs in the AOF replay at startup. Cheaper than the
/// context flags, which compute every flag to answer one.
pub fn replaying_aof(ctx: Ctx) -> bool {
    unsafe { api!(RedisModule_GetClientId)(ctx) == AOF_CLIENT_ID }
}

/// Whether the server pauses writes (`CLIENT PAUSE`, `FAILOVER`, a manual
/// cluster failover, a shutdown waiting for replicas). Work outside a client
/// command (timers, jobs) must then neither write nor propagate: the server
/// asserts that nothing reaches its replicas or AOF while paused, and keeps
/// the dataset still as its own expiry and eviction do.
pub fn writes_paused() -> bool {
    unsafe { api!(RedisModule_AvoidReplicaTraffic)() != 0 }
}

/// A context of the module's own, for callbacks that are given none (a
/// type's unlink callback) but must start a timer.
static MODULE_CTX: std::sync::atomic::AtomicPtr<raw::RedisModuleCtx> =
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());

/// Creates the module's own context; called once, at load.
pub fn keep_module_ctx(ctx: Ctx) {
    let own = unsafe { api!(RedisModule_GetDetachedThreadSafeContext)(ctx) };
    MODULE_CTX.store(own, std::sync::atomic::Ordering::Relaxed);
}

/// The module's own context (null before load).
pub fn module_ctx() -> Ctx {
    MODULE_CTX.load(std::sync::atomic::Ordering::Relaxed)
}

/// Whether the server runs post-notification jobs soundly: Redis 7.2.4+,
/// and Valkey (which reports 7.2.4 to modules).
pub fn post_notification_jobs() -> bool {
    let has_jobs = unsafe { raw::RedisModule_AddPostNotificationJob }.is_some();
    let version = unsafe { raw::RedisModule_GetServerVersion }.map_or(0, |f| unsafe { f() });
    has_jobs && version >= 0x00_07_02_04
}

pub fn selected_db(ctx: Ctx) -> i32 {
    unsafe { api!(RedisModule_GetSelectedDb)(ctx) }
}

/// Runs `body` with database `db` selected in `ctx`, then selects the one
/// that was: a post-notification job's context may be the client's own
/// (Valkey), whose next command must run where the client left off.
/// `None` when `db` does not exist.
pub fn in_db<T>(ctx: Ctx, db: i32, body: impl FnOnce() -> T) -> Option<T> {
    let before = selected_db(ctx);
    if !select_db(ctx, db) {
        return None;
    }
    let out = body();
    select_db(ctx, before);
    Some(out)
}

pub fn select_db(ctx: Ctx, db: i32) -> bool {
    unsafe { api!(RedisModule_SelectDb)(ctx, db) == raw::REDISMODULE_OK as c_int }
}

/// Starts a one-shot module timer: `callback` runs in `after_ms`.
pub fn timer(ctx: Ctx, after_ms: i64, callback: unsafe extern "C" fn(Ctx, *mut c_void)) {
    unsafe {
        api!(RedisModule_CreateTimer)(ctx, after_ms.max(1), Some(callback), std::ptr::null_mut())
    };
}

/// A module string owned by us, freed on drop.
pub struct OwnedString {
    ctx: Ctx,
    inner: RString,
}

impl OwnedString {
    pub fn new(ctx: Ctx, bytes: &[u8]) -> Self {
        let inner =
            unsafe { api!(RedisModule_CreateString)(ctx, bytes.as_ptr().cast(), bytes.len()) };
        Self { ctx, inner }
    }

    pub fn as_ptr(&self) -> RString {
        self.inner
    }
}

impl Drop for OwnedString {
    fn drop(&mut self) {
        unsafe { api!(RedisModule_FreeString)(self.ctx, self.inner) };
    }
}

/// A Rust type stored as the values of one module type. `Key::value` and
/// `Key::set` take the module type from it, so a key's value can only be
/// read as the Rust type registered for its module type.
pub trait ModuleValue: Sized {
    /// The module type whose values are `Self`.
    fn module_type() -> *mut raw::RedisModuleType;
}

/// What an open key holds, as seen by one of our types.
pub enum Slot<'k, T> {
    Empty,
    Ours(&'k mut T),
    WrongType,
}

/// An open key, closed on drop.
pub struct Key {
    inner: NonNull<raw::RedisModuleKey>,
}

impl Key {
    pub fn open_write(ctx: Ctx, name: RString) -> Option<Self> {
        let mode = (raw::REDISMODULE_READ | raw::REDISMODULE_WRITE) as c_int;
        NonNull::new(unsafe { api!(RedisModule_OpenKey)(ctx, name, mode) })
            .map(|inner| Self { inner })
    }

    pub fn open_read(ctx: Ctx, name: RString) -> Option<Self> {
        let mode = raw::REDISMODULE_READ as c_int;
        NonNull::new(unsafe { api!(RedisModule_OpenKey)(ctx, name, mode) })
            .map(|inner| Self { inner })
    }

    /// Wraps a key handle Redis lends us (scan callbacks) without owning it.
    pub fn borrowed(key: *mut raw::RedisModuleKey) -> Option<std::mem::ManuallyDrop<Self>> {
        NonNull::new(key).map(|inner| std::mem::ManuallyDrop::new(Self { inner }))
    }

    pub fn is_empty(&self) -> bool {
        unsafe {
            api!(RedisModule_KeyType)(self.inner.as_ptr())
                == raw::REDISMODULE_KEYTYPE_EMPTY as c_int
        }
    }

    /// The value if the key holds `T`'s module type.
    pub fn value<T: ModuleValue>(&mut self) -> Slot<'_, T> {
        let ty = T::module_type();
        let key = self.inner.as_ptr();
        // Null for an empty key and for any value that is not a module's.
        let held = unsafe { api!(RedisModule_ModuleTypeGetType)(key) };
        if held.is_null() {
            return if self.is_empty() {
                Slot::Empty
            } else {
                Slot::WrongType
            };
        }
        if held != ty {
            return Slot::WrongType;
        }
        match unsafe {
            api!(RedisModule_ModuleTypeGetValue)(key)
                .cast::<T>()
                .as_mut()
        } {
            Some(v) => Slot::Ours(v),
            None => Slot::WrongType,
        }
    }

    /// Stores a new value in an empty key; the key takes ownership.
    pub fn set<T: ModuleValue>(&mut self, value: Box<T>) -> &mut T {
        let ty = T::module_type();
        let ptr = Box::into_raw(value);
        unsafe {
            api!(RedisModule_ModuleTypeSetValue)(self.inner.as_ptr(), ty, ptr.cast::<c_void>());
            &mut *ptr
        }
    }

    /// The key's name.
    pub fn name(&self) -> &[u8] {
        let name = unsafe { api!(RedisModule_GetKeyNameFromModuleKey)(self.inner.as_ptr()) };
        if name.is_null() {
            return &[];
        }
        bytes(name.cast_mut())
    }

    /// The database the key is in. In a keyspace notification this is the
    /// event's, where `RedisModule_GetSelectedDb` may not be: Valkey 9 runs
    /// the callback on the command's own client and answers it with the
    /// transaction's database while that client is in `MULTI`.
    pub fn db(&self) -> i32 {
        unsafe { api!(RedisModule_GetDbIdFromModuleKey)(self.inner.as_ptr()) }
    }

    /// Whether the key carries a Redis TTL.
    pub fn has_ttl(&self) -> bool {
        unsafe {
            api!(RedisModule_GetExpire)(self.inner.as_ptr())
                != raw::mstime_t::from(raw::REDISMODULE_NO_EXPIRE)
        }
    }

    /// Removes the key's Redis TTL; the key must be open for writing.
    pub fn persist(&mut self) -> bool {
        let no_expire = raw::mstime_t::from(raw::REDISMODULE_NO_EXPIRE);
        unsafe { api!(RedisModule_SetExpire)(self.inner.as_ptr(), no_expire) == OK }
    }

    pub fn delete(&mut self) {
        unsafe { api!(RedisModule_DeleteKey)(self.inner.as_ptr()) };
    }
}

impl Drop for Key {
    fn drop(&mut self) {
        unsafe { api!(RedisModule_CloseKey)(self.inner.as_ptr()) };
    }
}

pub fn reply_error(ctx: Ctx, err: &CStr) -> c_int {
    unsafe { api!(RedisModule_ReplyWithError)(ctx, err.as_ptr()) }
}

/// An error reply built at run time (it names values from the call).
pub fn reply_error_string(ctx: Ctx, err: &str) -> c_int {
    let mut buf = Vec::with_capacity(err.len() + 1);
    buf.extend(err.bytes().filter(|&b| b != 0 && b != b'\r' && b != b'\n'));
    buf.push(0);
    unsafe { api!(RedisModule_ReplyWithError)(ctx, buf.as_ptr().cast::<c_char>()) }
}

pub fn reply_null(ctx: Ctx) -> c_int {
    unsafe { api!(RedisModule_ReplyWithNull)(ctx) }
}

/// Nil where an array was expected: `*-1` in RESP2 (as BLPOP answers a
/// timeout), `_` in RESP3.
pub fn reply_null_array(ctx: Ctx) -> c_int {
    unsafe { api!(RedisModule_ReplyWithNullArray)(ctx) }
}

pub fn reply_integer(ctx: Ctx, v: i64) -> c_int {
    unsafe { api!(RedisModule_ReplyWithLongLong)(ctx, v) }
}

pub fn reply_bulk(ctx: Ctx, b: &[u8]) -> c_int {
    unsafe { api!(RedisModule_ReplyWithStringBuffer)(ctx, b.as_ptr().cast(), b.len()) }
}

pub fn reply_simple(ctx: Ctx, s: &CStr) -> c_int {
    unsafe { api!(RedisModule_ReplyWithSimpleString)(ctx, s.as_ptr()) }
}

pub fn reply_array(ctx: Ctx, len: usize) -> c_int {
    unsafe { api!(RedisModule_ReplyWithArray)(ctx, len as _) }
}

/// A map in RESP3, a flat array of `2 * len` in RESP2.
pub fn reply_map(ctx: Ctx, len: usize) -> c_int {
    unsafe { api!(RedisModule_ReplyWithMap)(ctx, len as _) }
}

/// Sends `event` (module class) for `key` to keyspace-notification
/// subscribers.
pub fn notify(ctx: Ctx, event: &CStr, key: RString) {
    unsafe {
        api!(RedisModule_NotifyKeyspaceEvent)(
            ctx,
            raw::REDISMODULE_NOTIFY_MODULE,
            event.as_ptr(),
            key,
        )
    };
}

/// Propagates `PERSIST key` to replicas and the AOF.
pub fn replicate_persist(ctx: Ctx, key: RString) {
    unsafe { api!(RedisModule_Replicate)(ctx, c"PERSIST".as_ptr(), c"s".as_ptr(), key) };
}

/// Propagates `DEL key [key ...]` to replicas and the AOF.
pub fn replicate_del(ctx: Ctx, keys: &[RString]) {
    unsafe {
        api!(RedisModule_Replicate)(
            ctx,
            c"DEL".as_ptr(),
            c"v".as_ptr(),
            keys.as_ptr(),
            keys.len(),
        )
    };
}

/// Hides argument `pos` of the current command from MONITOR, SLOWLOG and
/// the server log: tokens are capabilities.
///
/// Not in the AOF replay at startup: it runs each command outside the
/// server's call path, where no MONITOR or SLOWLOG sees it, and never drops
/// the copy of the arguments a redaction keeps, so a later redaction past
/// that copy's end would read out of bounds and crash the server mid-load.
pub fn redact(ctx: Ctx, pos: usize) {
    if replaying_aof(ctx) {
        return;
    }
    if let (Some(redact), Ok(pos)) = (
        unsafe { raw::RedisModule_RedactClientCommandArgument },
        c_int::try_from(pos),
    ) {
        unsafe { redact(ctx, pos) };
    }
}

/// `CONFIG GET name` through the server, as a string.
pub fn config_get(ctx: Ctx, name: &CStr) -> Option<String> {
    let reply = unsafe {
        api!(RedisModule_Call)(
            ctx,
            c"CONFIG".as_ptr(),
            c"cc".as_ptr(),
            c"GET".as_ptr(),
            name.as_ptr(),
        )
    };
    if reply.is_null() {
        return None;
    }
    // A two-element array (RESP2 map): [name, value].
    let value = unsafe { api!(RedisModule_CallReplyArrayElement)(reply, 1) };
    let text = (!value.is_null()).then(|| {
        let mut len = 0usize;
        let ptr = unsafe { api!(RedisModule_CallReplyStringPtr)(value, &mut len) };
        if ptr.is_null() {
            String::new()
        } else {
            String::from_utf8_lossy(unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) })
                .into_owned()
        }
    });
    unsafe { api!(RedisModule_FreeCallReply)(reply) };
    if text.is_none() {
        log_warning(
            ctx,
            &format!(
                "redis-lease: could not read the server's {}",
                name.to_string_lossy()
            ),
        );
    }
    text
}

/// The major version of Valkey, `None` on Redis (from `INFO server`, which
/// names `valkey_version` on Valkey; both report 7.2.4 to modules).
pub fn valkey_major(ctx: Ctx) -> Option<u32> {
    let reply =
        unsafe { api!(RedisModule_Call)(ctx, c"INFO".as_ptr(), c"c".as_ptr(), c"server".as_ptr()) };
    if reply.is_null() {
        return None;
    }
    let mut len = 0usize;
    let ptr = unsafe { api!(RedisModule_CallReplyStringPtr)(reply, &mut len) };
    let major = (!ptr.is_null()).then(|| {
        let text = unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) };
        String::from_utf8_lossy(text)
            .lines()
            .find_map(|l| l.strip_prefix("valkey_version:"))
            .and_then(|v| v.split('.').next())
            .and_then(|v| v.trim().parse::<u32>().ok())
    });
    unsafe { api!(RedisModule_FreeCallReply)(reply) };
    major.flatten()
}

/// Adds `ms` of `event` to the server's latency monitor (LATENCY LATEST,
/// HISTORY). The server keeps any sample at or over its threshold, 0
/// included, so callers check `latency-monitor-threshold` first.
pub fn latency_sample(event: &CStr, ms: u64) {
    let ms = raw::mstime_t::try_from(ms).unwrap_or(raw::mstime_t::MAX);
    unsafe { api!(RedisModule_LatencyAddSample)(event.as_ptr(), ms) };
}

/// Propagates the current command as the client sent it.
pub fn replicate_verbatim(ctx: Ctx) {
    unsafe { api!(RedisModule_ReplicateVerbatim)(ctx) };
}
