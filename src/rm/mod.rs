//! Thin, safe wrappers over the parts of the Redis module API this module
//! uses, so the commands and the background work read as their logic rather
//! than FFI.
//!
//! Where `redis-module` 2.0.8 offers the same thing safely at the same cost,
//! its version is used: `Context::call` for `CONFIG GET`, `RedisString`
//! (through `create_from_slice`) for owned strings, `raw::save_unsigned` and
//! `raw::save_slice` for RDB writes, `raw::replicate_verbatim`. Kept, each
//! for a reason:
//! - `context_flags`: the raw bits, compared with the server's constants,
//!   including Valkey's that the crate's `ContextFlags` does not name;
//! - `SetModuleOptions` (in `lib.rs`): the crate's `ModuleOptions` lacks
//!   Valkey 9's atomic-slot-migration bit;
//! - post-notification jobs, timers and events with our own `extern "C"`
//!   trampolines: the crate's trampolines do not catch a panic, ours run
//!   their bodies under `guard`;
//! - `Key`, `Slot`, `ModuleValue`: a key can only be read as the Rust type
//!   registered for its module type, which the crate's `RedisKey` does not
//!   enforce;
//! - the reply, replicate and notify calls: one API call each, with the
//!   arguments built once (the hot paths count instructions in CI).
//!
//! The API table is filled by `RedisModule_Init` before any of these run;
//! functions a server may lack (newer than Redis 7.0) are checked at the call
//! site instead of going through `api!`.
//!
//! The wrappers take the raw handles Redis passes a callback (`Ctx`,
//! `RString`, IO and key handles) and are safe functions on one rule the
//! whole crate keeps: a handle is used only while it is valid, that is
//! during the callback Redis passed it to, or while the module owns it
//! (`OwnedString`, `Key`, the module's own context). The `SAFETY:`
//! comments rely on that rule ("the handle rule") and say what else makes
//! each call sound. Redis runs every callback on its main thread (an RDB
//! save in a fork of it), so nothing here is called concurrently.

use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;

use redis_module::raw;

/// A function of the module API that every supported server has.
macro_rules! api {
    ($name:ident) => {{
        // SAFETY: the table is `static mut`: RedisModule_Init writes it
        // once, at load, on the main thread, before Redis runs any
        // callback of the module, and nothing writes it again; every read
        // is a later one on that thread (or in a fork of it), so none
        // races a write. And every server the module supports (Redis 7.0+,
        // Valkey 8) fills the entries read through `api!`.
        #[allow(unused_unsafe)]
        let f = unsafe { redis_module::raw::$name.unwrap() }; // ok: filled at load
        f
    }};
}
pub(crate) use api;

pub mod filter;

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
            panic!("injected into {what}"); // ok: fault-injection builds only, inside the guard
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
    // SAFETY: `ctx` is null (allowed: the module's name is then unknown) or
    // valid by the handle rule; the format is a constant `%s` whose one
    // argument is `buf`, NUL-terminated above, so no client byte is read
    // as a format.
    unsafe { api!(RedisModule_Log)(ctx, level.as_ptr(), c"%s".as_ptr(), buf.as_ptr()) };
}

/// The bytes of a module string, borrowed as long as the handle is: those
/// of a command argument live as long as the slice `args` gave (the
/// command), those of a string a callback was passed cannot leave that
/// callback's frame, those of an `OwnedString`'s handle end with the
/// borrow of the handle. Keep the handle, not the bytes.
pub fn bytes(s: &RString) -> &[u8] {
    // SAFETY: by the handle rule `*s` is a live string for as long as the
    // caller holds it, and the slice borrows the caller's handle. Nothing
    // the module does changes a string it reads this way.
    unsafe { string_bytes(*s) }
}

/// The bytes of a module string, for a lifetime the caller picks.
///
/// # Safety
/// `s` is a live module string that is neither changed nor freed during
/// `'a`.
unsafe fn string_bytes<'a>(s: RString) -> &'a [u8] {
    let mut len = 0usize;
    // SAFETY: `s` is live (the caller's promise); the call only reads it
    // and writes `len`.
    let ptr = unsafe { api!(RedisModule_StringPtrLen)(s, &mut len) };
    if ptr.is_null() || len == 0 {
        return &[];
    }
    // SAFETY: Redis gave `len` initialized bytes at `ptr`, the string's own
    // buffer, which stays put and unchanged during `'a` (the caller's
    // promise).
    unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) }
}

/// The arguments of a command call. Their bytes (`bytes(&args[i])`) are
/// borrowed from the slice, so they too end with it.
///
/// # Safety
/// `argv` and `argc` are what Redis passed to the running command (or a
/// null `argv`), and the slice does not outlive that call: Redis frees the
/// arguments after it.
pub unsafe fn args<'a>(argv: *mut RString, argc: c_int) -> &'a [RString] {
    match usize::try_from(argc) {
        // SAFETY: Redis passes `argc` initialized handles at `argv`, an
        // array that stays allocated for the call, which `'a` does not
        // outlive (the caller's promise).
        Ok(n) if n > 0 && !argv.is_null() => unsafe { std::slice::from_raw_parts(argv, n) },
        _ => &[],
    }
}

pub fn now_ms() -> u64 {
    // SAFETY: takes no argument and only reads the clock.
    u64::try_from(unsafe { api!(RedisModule_Milliseconds)() }).unwrap_or(0)
}

pub fn context_flags(ctx: Ctx) -> u32 {
    // SAFETY: `ctx` is valid by the handle rule; the call only reads it.
    unsafe { api!(RedisModule_GetContextFlags)(ctx) as u32 }
}

/// The id every server gives the client that replays the AOF at startup
/// (`CLIENT_ID_AOF`, reserved so that modules can tell it apart).
const AOF_CLIENT_ID: u64 = u64::MAX;

/// Whether the command runs in the AOF replay at startup. Cheaper than the
/// context flags, which compute every flag to answer one.
pub fn replaying_aof(ctx: Ctx) -> bool {
    // SAFETY: `ctx` is a command's context (the handle rule); a context
    // without a client answers 0.
    unsafe { api!(RedisModule_GetClientId)(ctx) == AOF_CLIENT_ID }
}

/// Whether the server pauses writes (`CLIENT PAUSE`, `FAILOVER`, a manual
/// cluster failover, a shutdown waiting for replicas). Work outside a client
/// command (timers, jobs) must then neither write nor propagate: the server
/// asserts that nothing reaches its replicas or AOF while paused, and keeps
/// the dataset still as its own expiry and eviction do.
pub fn writes_paused() -> bool {
    // SAFETY: takes no argument and only reads server state.
    unsafe { api!(RedisModule_AvoidReplicaTraffic)() != 0 }
}

/// A context of the module's own, for callbacks that are given none (a
/// type's unlink callback) but must start a timer.
static MODULE_CTX: std::sync::atomic::AtomicPtr<raw::RedisModuleCtx> =
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());

/// Creates the module's own context; called once, at load.
pub fn keep_module_ctx(ctx: Ctx) {
    // SAFETY: `ctx` is the load context (the handle rule); the context made
    // is the module's for good, never freed.
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
    // SAFETY: a read of the API table after RedisModule_Init wrote it (see
    // `api!`); a server that lacks the function leaves it `None`.
    let has_jobs = unsafe { raw::RedisModule_AddPostNotificationJob }.is_some();
    // SAFETY: as above for the read; `f` takes no argument.
    let version = unsafe { raw::RedisModule_GetServerVersion }.map_or(0, |f| unsafe { f() });
    has_jobs && version >= 0x00_07_02_04
}

pub fn selected_db(ctx: Ctx) -> i32 {
    // SAFETY: `ctx` is valid by the handle rule; the call only reads it.
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
    // SAFETY: `ctx` is valid by the handle rule; the server range-checks
    // `db` and answers an error for one that does not exist.
    unsafe { api!(RedisModule_SelectDb)(ctx, db) == raw::REDISMODULE_OK as c_int }
}

/// Calls `each` with the name and the open key of every key of the
/// database selected in `ctx`, in one go, for a command that must see the
/// whole database at one moment (`LEASE.DEBUG CHECK`): nothing else runs
/// between the steps of the scan, so every key is seen once. The key is
/// open for reading, lent for the call (`None` where the server lends
/// none); neither it nor the name may be kept past it. Opening a key this
/// way has no effect on it (no expiry, no access time, no notification),
/// unlike `Key::open_read`.
///
/// The reaper's rebuild scan keeps its cursor across ticks and does not
/// use this.
pub fn scan_db<F: FnMut(RString, Option<&mut Key>)>(ctx: Ctx, mut each: F) {
    struct Cursor(*mut raw::RedisModuleScanCursor);
    impl Drop for Cursor {
        fn drop(&mut self) {
            // SAFETY: the cursor was made by ScanCursorCreate below and is
            // destroyed once, here.
            unsafe { api!(RedisModule_ScanCursorDestroy)(self.0) };
        }
    }
    // SAFETY: takes no argument; the cursor is this Cursor's.
    let cursor = Cursor(unsafe { api!(RedisModule_ScanCursorCreate)() });
    let data: *mut F = &mut each;
    loop {
        // SAFETY: `ctx` is valid by the handle rule, with the database to
        // scan selected; the cursor is live (destroyed on return); `scanned`
        // reads `data` as the `F` it is, which outlives the call, and Scan
        // calls back only during it.
        let more =
            unsafe { api!(RedisModule_Scan)(ctx, cursor.0, Some(scanned::<F>), data.cast()) };
        if more == 0 {
            break;
        }
    }
}

/// One key of `scan_db`, its closure run under `guard`.
///
/// # Safety
/// Called back by `RedisModule_Scan` in `scan_db`: `name` and `key` (or
/// null) are the scanned key's, valid for the call, and `data` is the
/// closure `scan_db` passed, used by nothing else meanwhile.
unsafe extern "C" fn scanned<F: FnMut(RString, Option<&mut Key>)>(
    _ctx: Ctx,
    name: RString,
    key: *mut raw::RedisModuleKey,
    data: *mut c_void,
) {
    guard(
        "key scan",
        || (),
        || {
            // SAFETY: `data` is `scan_db`'s closure, which it does not touch
            // while Scan runs (the caller's promise).
            let Some(each) = (unsafe { data.cast::<F>().as_mut() }) else {
                return;
            };
            // SAFETY: `key` is the open key Scan lends this callback; the Key
            // is dropped (never closed) before it returns.
            let mut key = unsafe { Key::borrowed(key) };
            each(name, key.as_deref_mut());
        },
    );
}

/// A numeric field of `INFO <section>`, `None` where the server has none
/// of that name.
pub fn info_number(ctx: Ctx, section: &CStr, field: &CStr) -> Option<u64> {
    // SAFETY: `ctx` is valid by the handle rule; the section name is
    // NUL-terminated; the data returned is ours until freed below.
    let data = unsafe { api!(RedisModule_GetServerInfo)(ctx, section.as_ptr()) };
    if data.is_null() {
        return None;
    }
    let mut missing: c_int = 0;
    // SAFETY: `data` is live (freed below); the field name is
    // NUL-terminated; `missing` is written.
    let value =
        unsafe { api!(RedisModule_ServerInfoGetFieldUnsigned)(data, field.as_ptr(), &mut missing) };
    // SAFETY: `data` came from GetServerInfo on `ctx` and is freed once,
    // here; `value` is a copy.
    unsafe { api!(RedisModule_FreeServerInfo)(ctx, data) };
    (missing == 0).then_some(value)
}

/// Starts a one-shot module timer: `callback` runs in `after_ms`.
pub fn timer(ctx: Ctx, after_ms: i64, callback: unsafe extern "C" fn(Ctx, *mut c_void)) {
    // SAFETY: `ctx` is valid by the handle rule; the timer carries no data
    // (null), and the callback is a function of the module, which is never
    // unloaded (Redis refuses to unload a module that has data types).
    unsafe {
        api!(RedisModule_CreateTimer)(ctx, after_ms.max(1), Some(callback), std::ptr::null_mut())
    };
}

/// A module string owned by us, freed on drop: the crate's `RedisString`
/// made with `create_from_slice` (its `create` panics on a NUL byte, which
/// a key name may hold).
pub struct OwnedString(redis_module::RedisString);

impl OwnedString {
    pub fn new(ctx: Ctx, bytes: &[u8]) -> Self {
        Self(redis_module::RedisString::create_from_slice(ctx, bytes))
    }

    pub fn as_ptr(&self) -> RString {
        self.0.inner
    }
}

/// A Rust type stored as the values of one module type. `Key::value` and
/// `Key::set` take the module type from it, so a key's value can only be
/// read as the Rust type registered for its module type.
///
/// # Safety
/// `module_type()` is a module type of this module whose every value is a
/// `Box<Self>` turned into a raw pointer, freed (and read by its callbacks)
/// as `Self`, and no other `ModuleValue` names the same type.
pub unsafe trait ModuleValue: Sized {
    /// The module type whose values are `Self`.
    fn module_type() -> *mut raw::RedisModuleType;
}

/// What an open key holds, as seen by one of our types.
pub enum Slot<'k, T> {
    Empty,
    Ours(&'k mut T),
    WrongType,
}

/// An open key, closed on drop. `inner` stays open for as long as the Key
/// lives: this Key opened it and only `drop` closes it, or (`borrowed`)
/// Redis lent it for a callback the Key does not outlive.
///
/// The module keeps at most one Key open per key name at a time, and the
/// types' callbacks do not run on a value while a command holds it open,
/// so a reference `value` or `set` gives, borrowing the Key mutably, is
/// the only one to that value.
pub struct Key {
    inner: NonNull<raw::RedisModuleKey>,
}

impl Key {
    pub fn open_write(ctx: Ctx, name: RString) -> Option<Self> {
        let mode = (raw::REDISMODULE_READ | raw::REDISMODULE_WRITE) as c_int;
        // SAFETY: `ctx` and `name` are valid by the handle rule; the key
        // retains its own reference to `name`. The handle (or null) becomes
        // this Key's, closed once, on drop.
        NonNull::new(unsafe { api!(RedisModule_OpenKey)(ctx, name, mode) })
            .map(|inner| Self { inner })
    }

    pub fn open_read(ctx: Ctx, name: RString) -> Option<Self> {
        let mode = raw::REDISMODULE_READ as c_int;
        // SAFETY: as in `open_write`.
        NonNull::new(unsafe { api!(RedisModule_OpenKey)(ctx, name, mode) })
            .map(|inner| Self { inner })
    }

    /// Wraps a key handle Redis lends us (scan callbacks, key events)
    /// without owning it: it is never closed here.
    ///
    /// # Safety
    /// `key` is null or a key handle Redis passed to the running callback,
    /// and the Key does not outlive that callback: Redis closes the handle
    /// after it.
    pub unsafe fn borrowed(key: *mut raw::RedisModuleKey) -> Option<std::mem::ManuallyDrop<Self>> {
        NonNull::new(key).map(|inner| std::mem::ManuallyDrop::new(Self { inner }))
    }

    pub fn is_empty(&self) -> bool {
        // SAFETY: `inner` is open while this Key lives (see `Key`).
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
        // SAFETY: `key` is open while this Key lives (see `Key`).
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
        // SAFETY: the key holds a value of `ty`, `T`'s module type, and
        // every value of it is a `Box<T>` (`ModuleValue`'s contract), so
        // the pointer is a live, aligned `T`, or null; the reference
        // borrows `self` mutably, which makes it the only one (see `Key`).
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
        // SAFETY: `inner` is open while this Key lives (callers open it for
        // writing and find it empty); `ptr` is a `Box<T>` stored under `T`'s
        // own module type, which frees it as `T` (`ModuleValue`). The key
        // owns it now and keeps it while open, so the reference, borrowing
        // `self` mutably, is live and the only one (see `Key`).
        unsafe {
            api!(RedisModule_ModuleTypeSetValue)(self.inner.as_ptr(), ty, ptr.cast::<c_void>());
            &mut *ptr
        }
    }

    /// The key's name.
    pub fn name(&self) -> &[u8] {
        // SAFETY: `inner` is open while this Key lives (see `Key`).
        let name = unsafe { api!(RedisModule_GetKeyNameFromModuleKey)(self.inner.as_ptr()) };
        if name.is_null() {
            return &[];
        }
        // SAFETY: the name is the open key's, which holds a reference to it
        // until it is closed; the slice borrows `self`, so it ends first.
        unsafe { string_bytes(name.cast_mut()) }
    }

    /// The database the key is in. In a keyspace notification this is the
    /// event's, where `RedisModule_GetSelectedDb` may not be: Valkey 9 runs
    /// the callback on the command's own client and answers it with the
    /// transaction's database while that client is in `MULTI`.
    pub fn db(&self) -> i32 {
        // SAFETY: `inner` is open while this Key lives (see `Key`).
        unsafe { api!(RedisModule_GetDbIdFromModuleKey)(self.inner.as_ptr()) }
    }

    /// Whether the key carries a Redis TTL.
    pub fn has_ttl(&self) -> bool {
        // SAFETY: `inner` is open while this Key lives (see `Key`).
        unsafe {
            api!(RedisModule_GetExpire)(self.inner.as_ptr())
                != raw::mstime_t::from(raw::REDISMODULE_NO_EXPIRE)
        }
    }

    /// Removes the key's Redis TTL; the key must be open for writing.
    pub fn persist(&mut self) -> bool {
        let no_expire = raw::mstime_t::from(raw::REDISMODULE_NO_EXPIRE);
        // SAFETY: `inner` is open while this Key lives (see `Key`); a key
        // not open for writing answers an error.
        unsafe { api!(RedisModule_SetExpire)(self.inner.as_ptr(), no_expire) == OK }
    }

    pub fn delete(&mut self) {
        // SAFETY: `inner` is open while this Key lives (see `Key`); the
        // value goes to its type's free callback, and `&mut self` ends any
        // reference `value` or `set` gave into it.
        unsafe { api!(RedisModule_DeleteKey)(self.inner.as_ptr()) };
    }
}

impl Drop for Key {
    fn drop(&mut self) {
        // SAFETY: this Key opened `inner` and closes it only here, once (a
        // borrowed Key is `ManuallyDrop` and never gets here).
        unsafe { api!(RedisModule_CloseKey)(self.inner.as_ptr()) };
    }
}

// The replies: `ctx` is the context of the running command or blocked
// client callback (the handle rule), and Redis copies what it is given.

pub fn reply_error(ctx: Ctx, err: &CStr) -> c_int {
    // SAFETY: `ctx` is a command's context; `err` is NUL-terminated.
    unsafe { api!(RedisModule_ReplyWithError)(ctx, err.as_ptr()) }
}

/// An error reply built at run time (it names values from the call).
pub fn reply_error_string(ctx: Ctx, err: &str) -> c_int {
    let mut buf = Vec::with_capacity(err.len() + 1);
    buf.extend(err.bytes().filter(|&b| b != 0 && b != b'\r' && b != b'\n'));
    buf.push(0);
    // SAFETY: `ctx` is a command's context; `buf` is NUL-terminated above
    // and has no other NUL, CR or LF (which would end or split the reply).
    unsafe { api!(RedisModule_ReplyWithError)(ctx, buf.as_ptr().cast::<c_char>()) }
}

/// Reports a key's position (and its flags, where the server takes them)
/// to a keys-position request (`COMMAND GETKEYS`, cluster routing, ACLs).
pub fn report_key(ctx: Ctx, pos: c_int, flags: c_int) {
    // SAFETY: a read of the API table after RedisModule_Init wrote it (see
    // `api!`); `None` before Redis 7.2. `ctx` is a keys-position request's
    // context and `pos` one of its arguments (the caller's promise).
    unsafe {
        match raw::RedisModule_KeyAtPosWithFlags {
            Some(at) => at(ctx, pos, flags),
            None => api!(RedisModule_KeyAtPos)(ctx, pos),
        }
    }
}

/// Whether the running call only asks for the command's key positions.
pub fn keys_position_request(ctx: Ctx) -> bool {
    // SAFETY: `ctx` is a command's context (the handle rule).
    unsafe { api!(RedisModule_IsKeysPositionRequest)(ctx) != 0 }
}

pub fn reply_message(ctx: Ctx, message: crate::model::error::Message) -> c_int {
    match message {
        crate::model::error::Message::Fixed(e) => reply_error(ctx, e),
        crate::model::error::Message::Formatted(e) => reply_error_string(ctx, &e),
    }
}

pub fn reply_null(ctx: Ctx) -> c_int {
    // SAFETY: `ctx` is a command's context.
    unsafe { api!(RedisModule_ReplyWithNull)(ctx) }
}

/// Nil where an array was expected: `*-1` in RESP2 (as BLPOP answers a
/// timeout), `_` in RESP3.
pub fn reply_null_array(ctx: Ctx) -> c_int {
    // SAFETY: `ctx` is a command's context.
    unsafe { api!(RedisModule_ReplyWithNullArray)(ctx) }
}

pub fn reply_integer(ctx: Ctx, v: i64) -> c_int {
    // SAFETY: `ctx` is a command's context.
    unsafe { api!(RedisModule_ReplyWithLongLong)(ctx, v) }
}

pub fn reply_bulk(ctx: Ctx, b: &[u8]) -> c_int {
    // SAFETY: `ctx` is a command's context; Redis copies `b.len()` bytes
    // from `b`, a live slice.
    unsafe { api!(RedisModule_ReplyWithStringBuffer)(ctx, b.as_ptr().cast(), b.len()) }
}

pub fn reply_simple(ctx: Ctx, s: &CStr) -> c_int {
    // SAFETY: `ctx` is a command's context; `s` is NUL-terminated.
    unsafe { api!(RedisModule_ReplyWithSimpleString)(ctx, s.as_ptr()) }
}

pub fn reply_array(ctx: Ctx, len: usize) -> c_int {
    // SAFETY: `ctx` is a command's context; the caller sends `len` elements
    // next (a short array is a protocol error for the client, not memory
    // unsafety).
    unsafe { api!(RedisModule_ReplyWithArray)(ctx, len as _) }
}

/// A map in RESP3, a flat array of `2 * len` in RESP2.
pub fn reply_map(ctx: Ctx, len: usize) -> c_int {
    // SAFETY: as in `reply_array`, with `2 * len` elements.
    unsafe { api!(RedisModule_ReplyWithMap)(ctx, len as _) }
}

/// Sends `event` (module class) for `key` to keyspace-notification
/// subscribers.
pub fn notify(ctx: Ctx, event: &CStr, key: RString) {
    // SAFETY: `ctx` and `key` are valid by the handle rule; `event` is
    // NUL-terminated; Redis copies what it keeps.
    unsafe {
        api!(RedisModule_NotifyKeyspaceEvent)(
            ctx,
            raw::REDISMODULE_NOTIFY_MODULE,
            event.as_ptr(),
            key,
        )
    };
}

/// Touches `key` in the selected database as a change does: clients that
/// `WATCH` it abort their `EXEC`, client-side caches drop it.
pub fn touch(ctx: Ctx, key: RString) {
    // SAFETY: `ctx` and `key` are valid by the handle rule; the call only
    // marks watchers and tracking clients of that name.
    unsafe { api!(RedisModule_SignalModifiedKey)(ctx, key) };
}

/// Propagates `PERSIST key` to replicas and the AOF.
pub fn replicate_persist(ctx: Ctx, key: RString) {
    // SAFETY: `ctx` and `key` are valid by the handle rule; the format `s`
    // takes exactly the one module string passed.
    unsafe { api!(RedisModule_Replicate)(ctx, c"PERSIST".as_ptr(), c"s".as_ptr(), key) };
}

/// Propagates `DEL key [key ...]` to replicas and the AOF.
pub fn replicate_del(ctx: Ctx, keys: &[RString]) {
    // SAFETY: `ctx` and each key are valid by the handle rule; the format
    // `v` takes an array of module strings and its length, which `keys`
    // gives.
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
        // SAFETY: a read of the API table after RedisModule_Init wrote it
        // (see `api!`); `None` on a server without redaction.
        unsafe { raw::RedisModule_RedactClientCommandArgument },
        c_int::try_from(pos),
    ) {
        // SAFETY: `ctx` is the running command's context; the server checks
        // `pos` against the argument count.
        unsafe { redact(ctx, pos) };
    }
}

/// `CONFIG GET name` through the server, as a string. The crate's
/// `Context::call` does it safely; it runs at load and on config changes,
/// never on a command's path.
pub fn config_get(ctx: Ctx, name: &str) -> Option<String> {
    let reply = redis_module::Context::new(ctx).call("CONFIG", &["GET", name]);
    let value = match reply {
        // [name, value] in RESP2, {name: value} in RESP3.
        Ok(redis_module::RedisValue::Array(items)) => items.into_iter().nth(1),
        Ok(redis_module::RedisValue::Map(map)) => map.into_values().next(),
        _ => None,
    };
    let text = match value {
        Some(
            redis_module::RedisValue::SimpleString(s) | redis_module::RedisValue::BulkString(s),
        ) => Some(s),
        Some(redis_module::RedisValue::StringBuffer(b)) => {
            Some(String::from_utf8_lossy(&b).into_owned())
        }
        _ => None,
    };
    if text.is_none() {
        log_warning(
            ctx,
            &format!("redis-lease: could not read the server's {name}"),
        );
    }
    text
}

/// The major version of Valkey, `None` on Redis (from `INFO server`, which
/// names `valkey_version` on Valkey; both report 7.2.4 to modules).
pub fn valkey_major(ctx: Ctx) -> Option<u32> {
    // SAFETY: `ctx` is the load context; the format `c` takes the one
    // NUL-terminated string passed.
    let reply =
        unsafe { api!(RedisModule_Call)(ctx, c"INFO".as_ptr(), c"c".as_ptr(), c"server".as_ptr()) };
    if reply.is_null() {
        return None;
    }
    let mut len = 0usize;
    // SAFETY: `reply` is live until freed below; a reply that is no string
    // answers null.
    let ptr = unsafe { api!(RedisModule_CallReplyStringPtr)(reply, &mut len) };
    let major = (!ptr.is_null()).then(|| {
        // SAFETY: Redis gave `len` bytes at `ptr`, inside `reply`, which is
        // freed only after this closure ran.
        let text = unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) };
        String::from_utf8_lossy(text)
            .lines()
            .find_map(|l| l.strip_prefix("valkey_version:"))
            .and_then(|v| v.split('.').next())
            .and_then(|v| v.trim().parse::<u32>().ok())
    });
    // SAFETY: `reply` came from RedisModule_Call and is freed once, here;
    // `major` holds nothing borrowed from it.
    unsafe { api!(RedisModule_FreeCallReply)(reply) };
    major.flatten()
}

/// Adds `ms` of `event` to the server's latency monitor (LATENCY LATEST,
/// HISTORY). The server keeps any sample at or over its threshold, 0
/// included, so callers check `latency-monitor-threshold` first.
pub fn latency_sample(event: &CStr, ms: u64) {
    let ms = raw::mstime_t::try_from(ms).unwrap_or(raw::mstime_t::MAX);
    // SAFETY: `event` is NUL-terminated; the server copies the name for a
    // new event.
    unsafe { api!(RedisModule_LatencyAddSample)(event.as_ptr(), ms) };
}

/// Propagates the current command as the client sent it (the crate's own
/// wrapper, inlined).
pub fn replicate_verbatim(ctx: Ctx) {
    raw::replicate_verbatim(ctx);
}
