//! One command at a time on a node's connection, with its reply as a value (error
//! replies included), and the LEASE calls that several test files make the same way.

use redis::{ConnectionLike, ToRedisArgs, Value};

/// One command and its reply, error replies included.
pub fn call<C: ConnectionLike, A: ToRedisArgs>(con: &mut C, name: &str, args: A) -> Value {
    let mut cmd = redis::cmd(name);
    cmd.arg(args);
    con.req_command(&cmd)
        .unwrap_or_else(|e| panic!("{name}: the connection failed: {e}"))
}

/// An integer reply.
pub fn int(reply: Value) -> i64 {
    super::reply::int(reply, "reply")
}

/// A bulk or status reply as text.
pub fn text(reply: Value) -> String {
    super::reply::text(reply, "reply")
}

pub fn renew<C: ConnectionLike>(con: &mut C, key: &str, token: &str, ttl: u64) -> i64 {
    int(call(con, "LEASE.RENEW", (key, token, ttl)))
}

pub fn release<C: ConnectionLike>(con: &mut C, key: &str, token: &str) -> i64 {
    int(call(con, "LEASE.RELEASE", (key, token)))
}

/// `LEASE.FENCE resource fence [command ...]`.
pub fn fence<C: ConnectionLike, A: ToRedisArgs>(
    con: &mut C,
    resource: &str,
    fence: u64,
    inner: A,
) -> Value {
    call(con, "LEASE.FENCE", (resource, fence, inner))
}

/// The error text of a stale fence.
pub fn stale(fence: u64, highest: u64) -> String {
    format!("STALE fencing token {fence} is older than {highest}")
}
