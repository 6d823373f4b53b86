//! Every fixed error reply, each starting with its Redis error code.
//!
//! They are C strings because `RedisModule_ReplyWithError` takes one: a
//! constant reply costs no allocation. The two replies that carry values
//! (STALE, and the inner command's name) are formatted where they are sent.

use std::ffi::CStr;

use crate::model::holds::Refused;

pub const WRONGTYPE: &CStr = c"WRONGTYPE Operation against a key holding the wrong kind of value";
pub const TTL: &CStr = c"ERR ttl must be an integer from 1 to 1099511627776 (milliseconds)";
pub const TOKEN: &CStr = c"ERR token must be 1 to 256 bytes";
pub const BLOCK_TIMEOUT: &CStr =
    c"ERR BLOCK timeout must be an integer from 0 to 1099511627776 (milliseconds)";
pub const ACQUIRE_SYNTAX: &CStr =
    c"ERR syntax error: LEASE.ACQUIRE key ttl [TOKEN token] [BLOCK timeout] [SHARED [LIMIT n]] [SESSION session-key session-token] [OWNER label] [DELAY ms]";
pub const LIMIT: &CStr = c"ERR LIMIT must be an integer from 1 to 1000000";
pub const OWNER: &CStr = c"ERR OWNER must be 1 to 128 bytes without control characters";
pub const OTHER_MODE: &CStr = c"ERR this token holds the lease in the other mode";
pub const OTHER_SESSION: &CStr = c"ERR this token's hold is bound to another session";
pub const DELAY: &CStr = c"ERR DELAY must be an integer from 0 to 1099511627776 (milliseconds)";
pub const DELAY_SHARED: &CStr = c"ERR DELAY applies to exclusive leases only";
pub const SESSION_SHARED: &CStr = c"ERR a session must be an exclusive lease";
pub const SESSION_BOUND: &CStr = c"ERR a session cannot itself be bound to a session";
pub const SESSION_SELF: &CStr = c"ERR a key cannot be bound to itself";
pub const TOO_MANY_HOLDERS: &CStr = c"ERR too many holders for this key (see lease.max-holders)";
pub const FENCE: &CStr = c"ERR fence must be an integer from 0 to 9007199254740991";
pub const FENCE_EXHAUSTED: &CStr =
    c"ERR fence sequence exhausted: fences must stay below 2^53 (is the clock past year 2248?)";
pub const FENCE_NESTED: &CStr = c"ERR LEASE.FENCE cannot run LEASE commands";
pub const FENCE_UNKNOWN_COMMAND: &CStr = c"ERR LEASE.FENCE: unknown inner command";
pub const FENCE_TOUCHES_RESOURCE: &CStr =
    c"ERR LEASE.FENCE: the inner command may not use the resource key itself";
pub const NOPERM_INNER: &CStr =
    c"NOPERM this user has no permissions to run the inner command or to access one of its keys";
pub const FENCE_CALL_REFUSED: &CStr =
    c"ERR LEASE.FENCE: the server refused to run the inner command";
pub const INTERNAL_ONLY: &CStr =
    c"ERR LEASE.APPLY only replays effects from a master or the AOF; clients cannot call it";
pub const READONLY: &CStr = c"READONLY You can't write against a read only replica.";
pub const APPLY_ARGS: &CStr = c"ERR LEASE.APPLY: malformed effect";
pub const INTERNAL: &CStr = c"ERR redis-lease internal error (see the server log)";
pub const BLOCK_UNSUPPORTED: &CStr =
    c"ERR BLOCK needs the blocked-clients API, which this server does not offer";

/// `STALE fencing token <fence> is older than <highest>`
pub fn stale(fence: u64, highest: u64) -> String {
    format!("STALE fencing token {fence} is older than {highest}")
}

/// An error reply: fixed, or formatted with the values it names.
pub enum Message {
    Fixed(&'static CStr),
    Formatted(String),
}

/// The error for an acquire refused (not busy): nothing changed.
pub fn refused(refused: Refused) -> Message {
    match refused {
        Refused::OtherMode => Message::Fixed(OTHER_MODE),
        Refused::LimitMismatch(limit) => Message::Formatted(limit_mismatch(limit)),
        Refused::TooManyHolders => Message::Fixed(TOO_MANY_HOLDERS),
        Refused::OtherSession => Message::Fixed(OTHER_SESSION),
        Refused::NoDeadlineUnbound => Message::Fixed(TTL),
        Refused::FenceExhausted => Message::Fixed(FENCE_EXHAUSTED),
    }
}

/// `ERR LIMIT does not match this lease's limit <m|none>`
pub fn limit_mismatch(limit: Option<u32>) -> String {
    match limit {
        Some(n) => format!("ERR LIMIT does not match this lease's limit {n}"),
        None => "ERR LIMIT does not match this lease's limit none".to_owned(),
    }
}

/// `ERR no live session on <session-key> for this token`
pub fn no_live_session(session: &[u8]) -> String {
    let shown: String = String::from_utf8_lossy(&session[..session.len().min(128)])
        .chars()
        .filter(|c| !c.is_control())
        .collect();
    format!("ERR no live session on {shown} for this token")
}

/// The inner command of LEASE.FENCE is of a kind it may not run.
pub fn fence_forbidden(name: &[u8]) -> String {
    let shown: String = String::from_utf8_lossy(&name[..name.len().min(64)])
        .chars()
        .filter(|c| !c.is_control())
        .collect();
    format!(
        "ERR LEASE.FENCE cannot run '{shown}': blocking, scripting, transaction, admin and dangerous commands are not allowed"
    )
}

pub const EVICTION_REFUSED: &CStr = c"ERR lease refused: maxmemory-policy is allkeys-* with maxmemory set, so eviction could silently delete a held lease. Use noeviction, or a volatile-* policy with TTLs on cache keys, or a separate instance for locks, or CONFIG SET lease.allkeys-eviction allow";

pub const TOO_MANY_WAITERS: &CStr =
    c"ERR too many clients already wait for this key (see lease.max-waiters)";

pub const FENCE_TOO_MANY_ARGS: &CStr =
    c"ERR LEASE.FENCE: the inner command may have at most 256 arguments after its name";
