//! What the module costs the server's other commands, and when it pays it:
//! the key-event subscription from its first lease or record on (the
//! server cannot end one), the command filter while lease keys exist and
//! for a while after the last one goes. Before the module holds anything,
//! no command of the server calls into it. The callbacks are `events.rs`'s,
//! handed over at load.

use std::os::raw::{c_char, c_int};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use redis_module::raw;

use crate::keyspace::sessions;
use crate::keyspace::state;
use crate::rm::{self, api, Ctx, RString};

const OK: c_int = raw::REDISMODULE_OK as c_int;

struct Callbacks {
    on_command: unsafe extern "C" fn(*mut raw::RedisModuleCommandFilterCtx),
    on_key_event: unsafe extern "C" fn(Ctx, c_int, *const c_char, RString) -> c_int,
}

static CALLBACKS: OnceLock<Callbacks> = OnceLock::new();

/// At load: the callbacks to register when the module arms, and the types'
/// way to ask for it (`state::arm_leases`, `state::arm_records`).
pub fn install(
    on_command: unsafe extern "C" fn(*mut raw::RedisModuleCommandFilterCtx),
    on_key_event: unsafe extern "C" fn(Ctx, c_int, *const c_char, RString) -> c_int,
) {
    let _ = CALLBACKS.set(Callbacks {
        on_command,
        on_key_event,
    });
    state::set_armers(arm_leases, arm_records);
}

/// Whether the module listens to key events: from its first value on.
static KEY_EVENTS: AtomicBool = AtomicBool::new(false);

/// Subscribes to the key events (generic, expired, evicted, loaded), once:
/// before the module holds anything it has no key to hear about, and every
/// `DEL`, `EXPIRE` or `SET ... PX` on the server would pay for the call.
fn subscribe_key_events() {
    if KEY_EVENTS.swap(true, Ordering::Relaxed) {
        return;
    }
    let classes = raw::REDISMODULE_NOTIFY_GENERIC
        | raw::REDISMODULE_NOTIFY_EXPIRED
        | raw::REDISMODULE_NOTIFY_EVICTED
        | raw::REDISMODULE_NOTIFY_LOADED;
    // SAFETY: the module's context (kept at load), whose module the
    // subscription is made for; the callback is a function of the module,
    // which is never unloaded.
    let done = unsafe {
        api!(RedisModule_SubscribeToKeyspaceEvents)(
            rm::module_ctx(),
            classes,
            CALLBACKS.get().map(|c| c.on_key_event),
        )
    };
    if done != OK {
        KEY_EVENTS.store(false, Ordering::Relaxed);
        rm::log_warning(
            rm::module_ctx(),
            "redis-lease: cannot subscribe to keyspace events",
        );
    }
}

/// A first record: the key events.
fn arm_records() {
    subscribe_key_events();
}

/// A first lease key (or the first since the filter was taken off): the key
/// events, and the command filter. A `WATCH` sent while no lease key
/// existed cannot matter to one (storing it touched its key), but client
/// tracking turned on then can: a client that reads a lease key from now
/// on is tracked, so a tracking client counts as a watcher.
fn arm_leases() {
    subscribe_key_events();
    let ctx = rm::module_ctx();
    let mut filter = FILTER.lock().unwrap_or_else(|e| e.into_inner());
    if filter.is_some() {
        return;
    }
    // SAFETY: the module's context; the callback is a function of the
    // module, which is never unloaded.
    let registered = unsafe {
        api!(RedisModule_RegisterCommandFilter)(
            ctx,
            CALLBACKS.get().map(|c| c.on_command),
            raw::REDISMODULE_CMDFILTER_NOSELF as c_int,
        )
    };
    if registered.is_null() {
        rm::log_warning(ctx, "redis-lease: cannot register the command filter");
        return;
    }
    *filter = Some(Filter(registered));
    if rm::info_number(ctx, c"clients", c"tracking_clients").is_some_and(|n| n > 0) {
        sessions::note_watched();
    }
}

/// The registered command filter, while lease keys exist.
struct Filter(*mut raw::RedisModuleCommandFilter);

// SAFETY: the filter is registered, used and unregistered on the server's
// main thread only; the Mutex that needs `Send` never hands it elsewhere.
unsafe impl Send for Filter {}

static FILTER: Mutex<Option<Filter>> = Mutex::new(None);

/// How long no lease key may exist before the filter comes off: a lease
/// key that comes and goes with each grant and release must not register
/// and unregister it every time.
const FILTER_IDLE_MS: u64 = 10_000;

/// When the node was last seen without a lease key and with the filter on
/// (0: not so now).
static IDLE_SINCE: AtomicU64 = AtomicU64::new(0);

/// Takes the command filter off once no lease key has existed for
/// `FILTER_IDLE_MS` (the reaper's tick asks): with no lease there is no
/// `EXEC` to touch for, no session group to `MIGRATE`, and no `WATCH` that
/// can matter. The next lease value puts it back (`arm_leases`).
pub fn disarm_when_idle(now: u64) {
    let idle = state::read(&state::STATS.lease_keys) == 0 && !sessions::any_bound();
    if !idle || !state::leases_armed() {
        IDLE_SINCE.store(0, Ordering::Relaxed);
        return;
    }
    let since = IDLE_SINCE.load(Ordering::Relaxed);
    if since == 0 {
        IDLE_SINCE.store(now, Ordering::Relaxed);
        return;
    }
    if now.saturating_sub(since) < FILTER_IDLE_MS {
        return;
    }
    IDLE_SINCE.store(0, Ordering::Relaxed);
    let mut filter = FILTER.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(Filter(registered)) = filter.take() {
        // SAFETY: the module's context; `registered` is the filter this
        // module registered, unregistered once (taken out of FILTER).
        unsafe { api!(RedisModule_UnregisterCommandFilter)(rm::module_ctx(), registered) };
    }
    state::disarm_leases();
}

/// Whether the module listens to key events.
pub fn hearing_keys() -> bool {
    KEY_EVENTS.load(Ordering::Relaxed)
}

/// Whether the command filter is registered now.
pub fn filtering() -> bool {
    FILTER.lock().unwrap_or_else(|e| e.into_inner()).is_some()
}
