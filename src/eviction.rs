//! What `maxmemory` eviction may do to lease keys, and the one check on the
//! ACQUIRE path that keeps a grant from being made where eviction could take
//! it silently.
//!
//! Lease keys and resource records have no Redis TTL, so `noeviction` and
//! every `volatile-*` policy never pick them. Only `allkeys-*` with
//! `maxmemory` > 0 can; `lease.allkeys-eviction` decides what ACQUIRE does
//! then. The server's settings are read at load and on every config change
//! event, so the check itself is two atomic loads.

use std::ffi::CStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use redis_module::configuration::ConfigurationContext;
use redis_module::{enum_configuration, ConfigurationValue, RedisError};

use crate::error;
use crate::node::{self, STATS};
use crate::rm::{self, api, Ctx};

enum_configuration! {
    /// `lease.allkeys-eviction`: what LEASE.ACQUIRE does under `allkeys-*`.
    #[allow(non_camel_case_types)]
    #[derive(Debug, PartialEq, Eq, Copy)]
    pub enum AllkeysEviction {
        refuse = 0,
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
        self.0.store(val as i32, Ordering::Relaxed);
        Ok(())
    }
}

impl Mode {
    pub fn current(&self) -> AllkeysEviction {
        AllkeysEviction::try_from(self.0.load(Ordering::Relaxed)).unwrap_or(AllkeysEviction::refuse)
    }
}

/// `maxmemory` > 0 and an `allkeys-*` policy: lease keys can be evicted.
static ALLKEYS_AT_RISK: AtomicBool = AtomicBool::new(false);
static MAXMEMORY: AtomicU64 = AtomicU64::new(0);
static POLICY: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());

/// The ACQUIRE-path check.
pub fn admit_acquire(_ctx: Ctx) -> Result<(), &'static CStr> {
    if !ALLKEYS_AT_RISK.load(Ordering::Relaxed) {
        return Ok(());
    }
    match MODE.current() {
        AllkeysEviction::allow => Ok(()),
        AllkeysEviction::refuse => {
            node::bump(&STATS.eviction_refused);
            Err(error::EVICTION_REFUSED)
        }
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
    let policy = config_get(ctx, c"maxmemory-policy").unwrap_or_default();
    let maxmemory = config_get(ctx, c"maxmemory")
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    MAXMEMORY.store(maxmemory, Ordering::Relaxed);
    ALLKEYS_AT_RISK.store(
        maxmemory > 0 && policy.starts_with("allkeys-"),
        Ordering::Relaxed,
    );
    *POLICY.lock().unwrap_or_else(|e| e.into_inner()) = policy;
}

/// `CONFIG GET name` through the server, as a string.
fn config_get(ctx: Ctx, name: &CStr) -> Option<String> {
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
        rm::log_warning(
            ctx,
            "redis-lease: could not read the server's eviction settings",
        );
    }
    text
}
