//! What `maxmemory` eviction may do to lease keys: the one check on the
//! ACQUIRE and FENCE paths that keeps a grant from being made where eviction
//! could take it silently, and what happens when eviction takes one anyway.
//!
//! Lease keys and resource records have no Redis TTL, so `noeviction` and
//! every `volatile-*` policy never pick them. Only `allkeys-*` with
//! `maxmemory` > 0 can; `lease.allkeys-eviction` decides:
//! - `refuse`: LEASE.ACQUIRE and LEASE.FENCE fail while eviction is possible;
//! - `restore`: an evicted live lease or record is written back, same token,
//!   fence and deadline, by a post-notification job that runs before any
//!   command (Redis 7.2.4+, Valkey);
//! - `allow`: grants go ahead.
//!
//! In every mode an eviction of a live lease or a record is counted and, unless
//! restored, logged: never silent. Redis has deleted the value by the time
//! it fires the `evicted` keyspace event, so a copy is taken just before:
//! from the key event's `evicted` subevent where the server has it (7.2+,
//! Valkey), which names evictions exactly; on Redis 7.0 from the type's
//! unlink callback, which fires for every removal. There a copy is kept only
//! while memory is over `maxmemory`, as it is at every eviction's unlink and
//! never at an overwrite (`SET`, `RESTORE`, `COPY`, the `*STORE` commands are
//! all refused for memory then), and it counts only if the `evicted` event of
//! the same key comes next.
//!
//! The server's settings are read at load and on every config change event,
//! so the check on the command path is one atomic load.

use std::ffi::CStr;
use std::os::raw::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use redis_module::configuration::ConfigurationContext;
use redis_module::{enum_configuration, raw, ConfigurationValue, RedisError};

use crate::keyspace::commit::values::{self, Record};
use crate::keyspace::state::{self, STATS};
use crate::keyspace::types;
use crate::keyspace::unlinked::{self, Saved, Unlinked};
use crate::model::error;
use crate::model::holds::Unbound;
use crate::model::lease::{Lease, Resource};
use crate::rm::{self, api, Ctx, Key, OwnedString, RString, Slot};

enum_configuration! {
    /// What happens when `maxmemory-policy` is `allkeys-*` with `maxmemory`
    /// set, the one case where eviction can pick a lease key or a resource
    /// record.
    ///
    /// `lease.allkeys-eviction`. The book's configuration table takes its
    /// first paragraph and each choice's from here (tests/docs.rs).
    #[allow(non_camel_case_types)]
    #[derive(Debug, PartialEq, Eq, Copy)]
    pub enum AllkeysEviction {
        /// `LEASE.ACQUIRE` and `LEASE.FENCE` fail with an error naming the
        /// policy, so nothing is granted that could vanish; leases granted
        /// before, if evicted, are counted and logged.
        refuse = 0,
        /// An evicted live lease or record is written back, with the same
        /// token, fence and deadline, before any command runs (Redis 7.2.4+
        /// and Valkey: refused at `CONFIG SET` elsewhere).
        restore = 1,
        /// Granted anyway; every live lease or record lost to eviction is
        /// counted (`lease_evicted`) and logged.
        allow = 2,
    }
}

/// The config's current value, as an atomic the ACQUIRE path can read.
pub struct Mode(std::sync::atomic::AtomicI32);

pub static MODE: Mode = Mode(std::sync::atomic::AtomicI32::new(
    AllkeysEviction::refuse as i32,
));

impl ConfigurationValue<AllkeysEviction> for Mode {
    fn get(&self, _ctx: &ConfigurationContext) -> AllkeysEviction {
        self.current()
    }

    fn set(&self, _ctx: &ConfigurationContext, val: AllkeysEviction) -> Result<(), RedisError> {
        if val == AllkeysEviction::restore && !restore_supported() {
            return Err(RedisError::Str(
                "restore needs post-notification jobs (Redis 7.2.4 or newer, or Valkey); use refuse or allow",
            ));
        }
        self.0.store(val as i32, Ordering::Relaxed);
        Ok(())
    }
}

impl Mode {
    /// Sets the mode from a name `config::parse_module_args` checked.
    pub fn set_named(&self, choice: &str) {
        let mode = match choice {
            "restore" => AllkeysEviction::restore,
            "allow" => AllkeysEviction::allow,
            _ => AllkeysEviction::refuse,
        };
        self.0.store(mode as i32, Ordering::Relaxed);
    }

    pub fn current(&self) -> AllkeysEviction {
        AllkeysEviction::try_from(self.0.load(Ordering::Relaxed)).unwrap_or(AllkeysEviction::refuse)
    }
}

/// `maxmemory` > 0 and an `allkeys-*` policy: lease keys can be evicted.
static ALLKEYS_AT_RISK: AtomicBool = AtomicBool::new(false);
static MAXMEMORY: AtomicU64 = AtomicU64::new(0);
static POLICY: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());

/// Whether `restore` can work here: it puts values back from a
/// post-notification job.
pub fn restore_supported() -> bool {
    rm::post_notification_jobs()
}

/// The check on the ACQUIRE and FENCE paths.
pub fn admit(ctx: Ctx) -> Result<(), &'static CStr> {
    if !ALLKEYS_AT_RISK.load(Ordering::Relaxed) {
        return Ok(());
    }
    // A master's stream and the AOF replay what was already decided; a
    // replica or a restart under another policy must not refuse it.
    let replayed = raw::REDISMODULE_CTX_FLAGS_REPLICATED | raw::REDISMODULE_CTX_FLAGS_LOADING;
    if rm::context_flags(ctx) & replayed != 0 {
        return Ok(());
    }
    match MODE.current() {
        AllkeysEviction::allow | AllkeysEviction::restore => Ok(()),
        AllkeysEviction::refuse => {
            state::bump(&STATS.eviction_refused);
            Err(error::EVICTION_REFUSED)
        }
    }
}

const KEY_EVENT: raw::RedisModuleEvent = raw::RedisModuleEvent {
    id: raw::REDISMODULE_EVENT_KEY,
    dataver: 1,
};

/// Notes whether the server names evictions in key events.
pub fn probe_key_events() {
    // SAFETY: a read of the API table after RedisModule_Init wrote it (see
    // `api!`), `None` where the server lacks the function; `f` takes plain
    // values.
    let supported = unsafe { raw::RedisModule_IsSubEventSupported }
        .is_some_and(|f| unsafe { f(KEY_EVENT, raw::REDISMODULE_SUBEVENT_KEY_EVICTED) != 0 });
    unlinked::set_key_events(supported);
}

/// Listens to key events while eviction can take a lease (`allkeys-*` with
/// `maxmemory`), and only then: with a listener the server builds a module
/// key for every key it deletes, and `DEBUG RELOAD ... MERGE` then aborts
/// Redis 8.2 and Valkey (a key on the stack retained for the event).
///
/// The change is made from a timer: `refresh` runs inside the config event,
/// and removing a listener while the server walks its listeners frees the
/// node it steps to next (Valkey 8.1 crashed). Until then, and wherever the
/// server has no key events, the types' unlink callbacks take the copy.
fn listen_to_key_events(ctx: Ctx) {
    let listen = ALLKEYS_AT_RISK.load(Ordering::Relaxed);
    if unlinked::key_events() && unlinked::listening() != listen {
        // SAFETY: `ctx` is valid by the handle rule; the timer carries no
        // data, and its callback is a function of the module, which is
        // never unloaded.
        unsafe {
            api!(RedisModule_CreateTimer)(ctx, 1, Some(apply_listening), std::ptr::null_mut())
        };
    }
}

/// # Safety
/// `ctx` is a timer callback's context, valid for the call.
unsafe extern "C" fn apply_listening(ctx: Ctx, _data: *mut c_void) {
    rm::guard("key event listening", || (), || update_listening(ctx));
}

fn update_listening(ctx: Ctx) {
    let listen = ALLKEYS_AT_RISK.load(Ordering::Relaxed);
    if unlinked::listening() == listen {
        return;
    }
    let callback: raw::RedisModuleEventCallback = listen.then_some(on_key_event);
    // SAFETY: `ctx` is the timer's context; the callback (or none, to stop
    // listening) is a function of the module, which is never unloaded. A
    // timer runs outside the server's walk of its listeners.
    let done = unsafe { api!(RedisModule_SubscribeToServerEvent)(ctx, KEY_EVENT, callback) };
    if done == raw::REDISMODULE_OK as i32 {
        unlinked::set_listening(listen);
    }
}

/// The key event: on an eviction of a live lease or a record, keep a copy.
///
/// # Safety
/// `data` is null or a `RedisModuleKeyInfo` whose key is open (for
/// reading), valid for the call.
unsafe extern "C" fn on_key_event(
    _ctx: Ctx,
    _e: raw::RedisModuleEvent,
    sub: u64,
    data: *mut c_void,
) {
    if sub != raw::REDISMODULE_SUBEVENT_KEY_EVICTED {
        return;
    }
    rm::guard(
        "key event",
        || (),
        || {
            // SAFETY: Redis passes the key event a RedisModuleKeyInfo, live
            // for the call, of the version subscribed (1).
            let Some(info) = (unsafe { data.cast::<raw::RedisModuleKeyInfo>().as_ref() }) else {
                return;
            };
            // SAFETY: `info.key` is the open key Redis lends this callback;
            // the Key is dropped (never closed) before it returns.
            let Some(mut key) = (unsafe { Key::borrowed(info.key) }) else {
                return;
            };
            let saved = match key.value::<Lease>() {
                // Bound holds count as live: no other key is read from a
                // key event, and a copy whose session ended is free when
                // put back.
                Slot::Ours(lease) if lease.is_live(rm::now_ms(), &mut Unbound) => {
                    Some(Saved::Lease(lease.clone()))
                }
                Slot::WrongType => match key.value::<Resource>() {
                    Slot::Ours(r) => Some(Saved::Resource(*r)),
                    _ => None,
                },
                _ => None,
            };
            // SAFETY: `info.key` is the open key Redis lends this callback.
            let name = unsafe { api!(RedisModule_GetKeyNameFromModuleKey)(info.key) };
            if name.is_null() {
                return;
            }
            let db = key.db();
            unlinked::keep(db, rm::bytes(&name.cast_mut()), saved);
        },
    )
}

/// The `evicted` keyspace event: if it took a live lease or a record, count
/// it, and restore it or say so in the log.
pub fn on_evicted(ctx: Ctx, key: RString) {
    let Some(unlinked) = unlinked::take(rm::selected_db(ctx), rm::bytes(&key)) else {
        return;
    };
    state::bump(&STATS.evicted);
    if MODE.current() == AllkeysEviction::restore && restore_supported() {
        let job = Box::into_raw(Box::new(unlinked)).cast::<c_void>();
        // SAFETY: `ctx` is the notification's context; `job` is an
        // `Unlinked` that Redis hands to `restore_job`, then to `free_job`
        // once, both of which read it as one.
        let queued = unsafe {
            api!(RedisModule_AddPostNotificationJob)(ctx, Some(restore_job), job, Some(free_job))
        };
        if queued == raw::REDISMODULE_OK as i32 {
            return;
        }
        // Not queued: Redis did not take ownership of the job.
        // SAFETY: so `job` is still the `Box<Unlinked>` made above, taken
        // back only here.
        let unlinked = unsafe { Box::from_raw(job.cast::<Unlinked>()) };
        return warn_lost(ctx, &unlinked);
    }
    warn_lost(ctx, &unlinked);
}

fn warn_lost(ctx: Ctx, unlinked: &Unlinked) {
    let what = match &unlinked.value {
        Saved::Lease(l) => format!("live lease (fence {})", l.fence()),
        Saved::Resource(r) => format!("resource record (highest fence {})", r.highest()),
    };
    // Only allkeys-* reaches a key without a TTL, and leases and records
    // never keep one; advise what fits the policy in force.
    let advice = if policy().starts_with("allkeys-") {
        "set maxmemory-policy to noeviction or volatile-*, or lease.allkeys-eviction restore"
    } else {
        "the policy should not evict keys without a TTL: report this with the server's INFO"
    };
    rm::log_warning(
        ctx,
        &format!(
            "redis-lease: maxmemory eviction deleted the {what} at db {} key '{}' under maxmemory-policy {}; {advice}",
            unlinked.db,
            String::from_utf8_lossy(&unlinked.key[..unlinked.key.len().min(128)]),
            policy(),
        ),
    );
}

/// # Safety
/// `ctx` is the job's context, valid for the call; `pd` is null or the
/// `Unlinked` queued by `on_evicted`, not yet freed and used by nothing
/// else during the call.
unsafe extern "C" fn restore_job(ctx: Ctx, pd: *mut c_void) {
    rm::guard(
        "eviction restore",
        || (),
        || {
            // SAFETY: `pd` is the job's data, an `Unlinked` only this job
            // reads, which Redis frees (with `free_job`) after it runs.
            let Some(unlinked) = (unsafe { pd.cast::<Unlinked>().as_mut() }) else {
                return;
            };
            let db = unlinked.db;
            rm::in_db(ctx, db, || restore(ctx, unlinked));
        },
    )
}

/// Puts an evicted value back under its name, unless something took it.
fn restore(ctx: Ctx, unlinked: &mut Unlinked) {
    let name = OwnedString::new(ctx, &unlinked.key);
    let Some(mut key) = Key::open_write(ctx, name.as_ptr()) else {
        return;
    };
    if !key.is_empty() {
        return warn_lost(ctx, unlinked);
    }
    let value = std::mem::replace(&mut unlinked.value, Saved::Resource(Resource::default()));
    match value {
        Saved::Lease(lease) => {
            let lease = types::store_lease(&mut key, lease);
            values::lease_restored(ctx, name.as_ptr(), lease);
            drop(key);
        }
        Saved::Resource(record) => {
            let highest = record.highest();
            types::store_resource(&mut key, record);
            drop(key);
            values::record_written(ctx, name.as_ptr(), Record::Highest(highest), false);
        }
    }
    state::bump(&STATS.restored);
}

/// # Safety
/// `pd` is null or the `Unlinked` queued by `on_evicted`, which nothing
/// uses after this call.
unsafe extern "C" fn free_job(pd: *mut c_void) {
    if !pd.is_null() {
        rm::guard(
            "eviction job free",
            || (),
            // SAFETY: `pd` is the `Box<Unlinked>` queued in `on_evicted`;
            // Redis calls this free function once per job.
            || drop(unsafe { Box::from_raw(pd.cast::<Unlinked>()) }),
        );
    }
}

/// The policy the module currently sees, for INFO.
pub fn policy() -> String {
    POLICY.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

pub fn maxmemory() -> u64 {
    MAXMEMORY.load(Ordering::Relaxed)
}

/// Re-reads `maxmemory` and `maxmemory-policy` from the server.
pub fn refresh(ctx: Ctx) {
    let policy = rm::config_get(ctx, "maxmemory-policy").unwrap_or_default();
    let maxmemory = rm::config_get(ctx, "maxmemory")
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    MAXMEMORY.store(maxmemory, Ordering::Relaxed);
    let at_risk = maxmemory > 0 && policy.starts_with("allkeys-");
    ALLKEYS_AT_RISK.store(at_risk, Ordering::Relaxed);
    listen_to_key_events(ctx);
    *POLICY.lock().unwrap_or_else(|e| e.into_inner()) = policy;
}
