//! Every error reply of the module, each starting with its Redis error code,
//! with when it is sent: the book's error table
//! (docs/src/reference/errors.md) is generated from this file by
//! tests/docs.rs, which fails when the two differ. Each reply has a doc
//! comment: for a constant, when it is sent; for a function, the reply with
//! `<placeholders>` in backticks, a blank line, then when.
//!
//! They are C strings because `RedisModule_ReplyWithError` takes one: a
//! constant reply costs no allocation. The replies that carry values (STALE,
//! the limit, the session key, the inner command's name) are formatted where
//! they are sent.

use std::ffi::CStr;

use crate::holds::Refused;

/// The key holds a value of another type.
pub const WRONGTYPE: &CStr = c"WRONGTYPE Operation against a key holding the wrong kind of value";
/// ttl not an integer from 1 to 2^40; or 0 without `SESSION`, or in
/// `LEASE.RENEW` of a live hold not bound to a session.
pub const TTL: &CStr = c"ERR ttl must be an integer from 1 to 1099511627776 (milliseconds)";
/// An empty or over-long token, or session-token.
pub const TOKEN: &CStr = c"ERR token must be 1 to 256 bytes";
/// `BLOCK`'s timeout not an integer from 0 to 2^40.
pub const BLOCK_TIMEOUT: &CStr =
    c"ERR BLOCK timeout must be an integer from 0 to 1099511627776 (milliseconds)";
/// An unknown or repeated option, `LIMIT` not right after `SHARED`, `SESSION`
/// without both its arguments.
pub const ACQUIRE_SYNTAX: &CStr =
    c"ERR syntax error: LEASE.ACQUIRE key ttl [TOKEN token] [BLOCK timeout] [SHARED [LIMIT n]] [SESSION session-key session-token] [OWNER label] [DELAY ms]";
/// `LIMIT` not an integer from 1 to 1,000,000.
pub const LIMIT: &CStr = c"ERR LIMIT must be an integer from 1 to 1000000";
/// An `OWNER` label that is empty, over 128 bytes, or holds a byte below 0x20
/// or 0x7f.
pub const OWNER: &CStr = c"ERR OWNER must be 1 to 128 bytes without control characters";
/// The token holds a shared hold and asks for an exclusive one, or the other
/// way round: a reader does not become the writer in place.
pub const OTHER_MODE: &CStr = c"ERR this token holds the lease in the other mode";
/// A retry with `SESSION` by a token whose hold is bound to another session, or
/// to none.
pub const OTHER_SESSION: &CStr = c"ERR this token's hold is not bound to that session";
/// `DELAY` not an integer from 0 to 2^40.
pub const DELAY: &CStr = c"ERR DELAY must be an integer from 0 to 1099511627776 (milliseconds)";
/// `DELAY` with `SHARED`: a lock-delay is for exclusive holds only.
pub const DELAY_SHARED: &CStr = c"ERR DELAY applies to exclusive leases only";
/// `session-token` holds `session-key` with `SHARED`.
pub const SESSION_SHARED: &CStr = c"ERR a session must be an exclusive lease";
/// `session-token`'s hold on `session-key` is itself bound to a session.
pub const SESSION_BOUND: &CStr = c"ERR a session cannot itself be bound to a session";
/// `session-key` is `key`.
pub const SESSION_SELF: &CStr = c"ERR a key cannot be bound to itself";
/// `SESSION "" token`: an empty session key.
pub const SESSION_KEY: &CStr = c"ERR session-key must not be empty";
/// A shared hold past `lease.max-holders` without `BLOCK` (with `BLOCK` the
/// caller waits in the queue for room instead).
pub const TOO_MANY_HOLDERS: &CStr = c"ERR too many holders for this key (see lease.max-holders)";
/// `LEASE.FENCE`'s fence not an integer from 0 to 2^53 - 1.
pub const FENCE: &CStr = c"ERR fence must be an integer from 0 to 9007199254740991";
/// A grant would need a fence of 2^53 or more: the key's own fence is 2^53 - 1
/// (delete the key), or the clock is past the year 2248.
pub const FENCE_EXHAUSTED: &CStr =
    c"ERR fence sequence exhausted: fences must stay below 2^53 (is the clock past year 2248?)";
/// The inner command of `LEASE.FENCE` is a LEASE command.
pub const FENCE_NESTED: &CStr = c"ERR LEASE.FENCE cannot run LEASE commands";
/// The inner command of `LEASE.FENCE` is not a command the server knows.
pub const FENCE_UNKNOWN_COMMAND: &CStr = c"ERR LEASE.FENCE: unknown inner command";
/// The inner command of `LEASE.FENCE` names the resource key.
pub const FENCE_TOUCHES_RESOURCE: &CStr =
    c"ERR LEASE.FENCE: the inner command may not use the resource key itself";
/// The caller's ACL user may not run `LEASE.FENCE`'s inner command or touch its
/// keys; nothing is recorded.
pub const NOPERM_INNER: &CStr =
    c"NOPERM this user has no permissions to run the inner command or to access one of its keys";
/// The server refused the inner command without an error reply to pass on;
/// nothing is recorded.
pub const FENCE_CALL_REFUSED: &CStr =
    c"ERR LEASE.FENCE: the server refused to run the inner command";
/// `LEASE.APPLY` sent by a client: only a master or the AOF may replay effects
/// (on Redis 8 the command is internal and clients do not see it).
pub const INTERNAL_ONLY: &CStr =
    c"ERR LEASE.APPLY only replays effects from a master or the AOF; clients cannot call it";
/// `LEASE.ACQUIRE`, `RENEW`, `RELEASE` or `FENCE` from a client of a replica, a
/// writable one too: only the primary decides.
pub const READONLY: &CStr = c"READONLY You can't write against a read only replica.";
/// A `LEASE.APPLY` effect that does not parse, such as a form written by a
/// newer build replayed by an older one (logged; see Persistence and upgrades).
pub const APPLY_ARGS: &CStr = c"ERR LEASE.APPLY: malformed effect";
/// A panic caught inside a command (the server log says where), or a key the
/// server would not open for writing.
pub const INTERNAL: &CStr = c"ERR redis-lease internal error (see the server log)";
/// The server did not block the client for `BLOCK`; the waiter is withdrawn.
pub const BLOCK_UNSUPPORTED: &CStr =
    c"ERR BLOCK needs the blocked-clients API, which this server does not offer";

/// `STALE fencing token <fence> is older than <highest>`
///
/// `LEASE.FENCE` with a fence below the highest the resource record has
/// accepted; nothing runs and nothing changes.
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
///
/// The key has live holds or waiters and was acquired with another limit
/// (or none where this ACQUIRE states one, or one where it states none).
pub fn limit_mismatch(limit: Option<u32>) -> String {
    match limit {
        Some(n) => format!("ERR LIMIT does not match this lease's limit {n}"),
        None => "ERR LIMIT does not match this lease's limit none".to_owned(),
    }
}

/// `ERR no live session on <session-key> for this token`
///
/// `SESSION` names a key that `session-token` does not hold live (no key,
/// expired, released, another token); also the answer to a blocked ACQUIRE
/// whose session ended before its turn.
pub fn no_live_session(session: &[u8]) -> String {
    let shown: String = String::from_utf8_lossy(&session[..session.len().min(128)])
        .chars()
        .filter(|c| !c.is_control())
        .collect();
    format!("ERR no live session on {shown} for this token")
}

/// `ERR LEASE.FENCE cannot run '<command>': blocking, scripting, transaction, admin and dangerous commands are not allowed`
///
/// The inner command of `LEASE.FENCE` is of a kind it may not run.
pub fn fence_forbidden(name: &[u8]) -> String {
    let shown: String = String::from_utf8_lossy(&name[..name.len().min(64)])
        .chars()
        .filter(|c| !c.is_control())
        .collect();
    format!(
        "ERR LEASE.FENCE cannot run '{shown}': blocking, scripting, transaction, admin and dangerous commands are not allowed"
    )
}

/// `LEASE.ACQUIRE` or `LEASE.FENCE` while `maxmemory-policy` is `allkeys-*`
/// with `maxmemory` set and `lease.allkeys-eviction` is `refuse`.
pub const EVICTION_REFUSED: &CStr = c"ERR lease refused: maxmemory-policy is allkeys-* with maxmemory set, so eviction could silently delete a held lease. Use noeviction, or a volatile-* policy with TTLs on cache keys, or a separate instance for locks, or CONFIG SET lease.allkeys-eviction allow";

/// `BLOCK` on a key whose queue already holds `lease.max-waiters` clients.
pub const TOO_MANY_WAITERS: &CStr =
    c"ERR too many clients already wait for this key (see lease.max-waiters)";

/// An inner command of more than 256 arguments after its name.
pub const FENCE_TOO_MANY_ARGS: &CStr =
    c"ERR LEASE.FENCE: the inner command may have at most 256 arguments after its name";
