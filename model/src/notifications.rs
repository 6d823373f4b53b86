//! The keyspace notifications the module sends, each in the module class
//! (`notify-keyspace-events` with `d`, on `__keyspace@<db>__:<key>` and
//! `__keyevent@<db>__:<event>`), each on the key it names. Every
//! `rm::notify` names one of these: the book's table of them
//! (docs/src/operations/observability.md) is generated from this file and
//! those calls by tests/docs.rs, which fails on a notification sent under
//! any other name.

use std::ffi::CStr;

/// On the lease key, at every grant: a new hold, the idempotent retry, and a
/// hold handed to a blocked waiter.
pub const ACQUIRE: &CStr = c"lease.acquire";

/// On the lease key, at every `LEASE.RENEW` that answered 1.
pub const RENEW: &CStr = c"lease.renew";

/// On the lease key, at every `LEASE.RELEASE` that answered 1 (of a session
/// too, before its `lease.session-end`).
pub const RELEASE: &CStr = c"lease.release";

/// On the lease key, when holds on it expired: their deadline passed, or the
/// session they were bound to ended. Sent by the reaper within a tick, or by
/// the command that finds them expired first.
pub const EXPIRE: &CStr = c"lease.expire";

/// On the resource key, at every fence `LEASE.FENCE` accepted (after its
/// inner command ran).
pub const FENCE: &CStr = c"lease.fence";

/// On the session key, once, when a session with bound holds ends (after
/// its `lease.release` or `lease.expire`); each key it freed gets
/// `lease.expire`. Sent by the reaper, within a tick.
pub const SESSION_END: &CStr = c"lease.session-end";
