//! One command at a time on a connection, with its reply as a value (error replies
//! included), and the calls the test files make the same way: the LEASE commands, and
//! the server commands they check the keyspace with.
//!
//! Fences are `u64` (the module's type: below 2^53); integer replies are `i64`.

use redis::{Cmd, ConnectionLike, ToRedisArgs, Value};

use super::{reply, Server};

/// No arguments: `call(con, "PING", NONE)`, `fenced(con, "res", 5, NONE)`.
pub const NONE: &[&str] = &[];

/// One command and its reply, error replies included.
pub fn call<C: ConnectionLike, A: ToRedisArgs>(con: &mut C, name: &str, args: A) -> Value {
    let mut cmd = redis::cmd(name);
    cmd.arg(args);
    con.req_command(&cmd)
        .unwrap_or_else(|e| panic!("{name}: the connection failed: {e}"))
}

/// The error reply of a command that must fail, as `CODE detail`. A node's connection
/// hands error replies back as values, a cluster client as `Err`: both end up here.
pub fn call_error<C: ConnectionLike, A: ToRedisArgs>(con: &mut C, name: &str, args: A) -> String {
    let mut cmd = redis::cmd(name);
    cmd.arg(args);
    match con.req_command(&cmd) {
        Ok(v) => {
            reply::error_text(&v).unwrap_or_else(|| panic!("{name} answered {v:?}, not an error"))
        }
        Err(e) if e.code().is_some() => reply::redis_error_text(&e),
        Err(e) => panic!("{name}: the connection failed: {e}"),
    }
}

/// A command from byte-string (or string) arguments.
pub fn cmd<A: AsRef<[u8]>>(args: &[A]) -> Cmd {
    let mut c = Cmd::new();
    for a in args {
        c.arg(a.as_ref());
    }
    c
}

/// The first words of a command, for messages (huge commands stay readable).
pub fn describe(c: &Cmd) -> String {
    let words: Vec<String> = c
        .args_iter()
        .take(8)
        .map(|arg| match arg {
            redis::Arg::Simple(bytes) if bytes.len() > 40 => {
                format!("<{} bytes>", bytes.len())
            }
            redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
            _ => "<cursor>".to_string(),
        })
        .collect();
    let total = c.args_iter().count();
    if total > 8 {
        format!("{} ... ({total} arguments)", words.join(" "))
    } else {
        words.join(" ")
    }
}

/// Sends a command; the reply as the server sent it, error replies included.
pub fn send<C: ConnectionLike>(con: &mut C, c: &Cmd) -> Value {
    con.req_command(c)
        .unwrap_or_else(|e| panic!("`{}` got no reply: {e}", describe(c)))
}

/// `q!(con, "NAME", arg, ...)`: any `ToRedisArgs` arguments, reply as sent.
#[macro_export]
macro_rules! q {
    ($con:expr, $($arg:expr),+ $(,)?) => {{
        let mut c = redis::Cmd::new();
        $( c.arg($arg); )+
        $crate::calls::send($con, &c)
    }};
}

/// An integer reply.
pub fn int(reply: Value) -> i64 {
    reply::int(reply, "reply")
}

/// A bulk or status reply as text.
pub fn text(reply: Value) -> String {
    reply::text(reply, "reply")
}

/// An array (or set) of strings.
pub fn strings(reply: Value) -> Vec<String> {
    reply::strings(reply, "reply")
}

pub fn exists<C: ConnectionLike>(con: &mut C, key: &str) -> bool {
    int(call(con, "EXISTS", key)) == 1
}

pub fn get<C: ConnectionLike>(con: &mut C, key: &str) -> Option<String> {
    match call(con, "GET", key) {
        Value::Nil => None,
        v => Some(reply::text(v, "GET")),
    }
}

/// `TYPE key`.
pub fn key_type<C: ConnectionLike>(con: &mut C, key: &str) -> String {
    reply::text(call(con, "TYPE", key), "TYPE")
}

pub fn pttl<C: ConnectionLike>(con: &mut C, key: &str) -> i64 {
    reply::int(call(con, "PTTL", key), "PTTL")
}

pub fn select<C: ConnectionLike>(con: &mut C, db: i64) {
    reply::assert_ok(call(con, "SELECT", db), &format!("SELECT {db}"));
}

pub fn config_set<C: ConnectionLike>(con: &mut C, name: &str, value: &str) {
    reply::assert_ok(
        call(con, "CONFIG", ("SET", name, value)),
        &format!("CONFIG SET {name} {value}"),
    );
}

/// Puts `con`'s server under one of `Flavor::sanitize_dump_payload_settings()` (`None`:
/// the server's only behaviour, nothing to set); returns its name for messages.
pub fn sanitize_dump_payload<C: ConnectionLike>(
    con: &mut C,
    setting: Option<&'static str>,
) -> &'static str {
    if let Some(value) = setting {
        config_set(con, "sanitize-dump-payload", value);
    }
    setting.unwrap_or("always")
}

pub fn config_get<C: ConnectionLike>(con: &mut C, name: &str) -> String {
    let pairs = reply::strings(call(con, "CONFIG", ("GET", name)), "CONFIG GET");
    assert_eq!(pairs.len(), 2, "CONFIG GET {name}: {pairs:?}");
    assert_eq!(pairs[0], name);
    pairs[1].clone()
}

pub fn client_id<C: ConnectionLike>(con: &mut C) -> i64 {
    reply::int(call(con, "CLIENT", "ID"), "CLIENT ID")
}

/// A numeric `field:value` of `INFO section` read on `con` (a connection the test
/// keeps, where the harness's fresh ones could be refused or evicted).
pub fn info_on<C: ConnectionLike>(con: &mut C, section: &str, field: &str) -> i64 {
    let info = reply::text(call(con, "INFO", section), "INFO");
    super::info_field(&info, field)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("INFO {section} has no number {field}"))
}

/// `DEBUG DIGEST` of the whole dataset, on a new connection.
pub fn digest(server: &Server) -> String {
    reply::text(
        call(&mut server.client(), "DEBUG", "DIGEST"),
        &format!("DEBUG DIGEST on {}", server.flavor),
    )
}

/// A connection to `server` authenticated as `user` (password `pw`).
pub fn login(server: &Server, user: &str) -> redis::Connection {
    let mut con = server.client();
    reply::assert_ok(
        call(&mut con, "AUTH", (user, "pw")),
        &format!("AUTH {user}"),
    );
    con
}

/// `RESTORE key 0 payload`, reply as sent.
pub fn restore<C: ConnectionLike>(con: &mut C, key: &str, payload: &[u8]) -> Value {
    call(con, "RESTORE", (key, 0, payload))
}

/// `LEASE.ACQUIRE key ttl [TOKEN token] [BLOCK timeout]`.
pub fn acquire_cmd(key: &str, ttl: u64, token: Option<&str>, block: Option<u64>) -> Cmd {
    let mut cmd = redis::cmd("LEASE.ACQUIRE");
    cmd.arg(key).arg(ttl);
    if let Some(token) = token {
        cmd.arg("TOKEN").arg(token);
    }
    if let Some(block) = block {
        cmd.arg("BLOCK").arg(block);
    }
    cmd
}

/// `LEASE.ACQUIRE key ttl TOKEN token`: the fence, or None when another token holds
/// the lease. A grant must repeat the token.
pub fn acquire<C: ConnectionLike>(
    con: &mut C,
    key: &str,
    ttl: u64,
    token: &(impl AsRef<[u8]> + ?Sized),
) -> Option<u64> {
    let token = token.as_ref();
    let what = format!("LEASE.ACQUIRE {key} {ttl} TOKEN ...");
    let grant = reply::grant(
        call(con, "LEASE.ACQUIRE", (key, ttl, "TOKEN", token)),
        &what,
    );
    grant.map(|(echoed, fence)| {
        assert_eq!(
            echoed, token,
            "{what}: the grant must repeat the chosen token"
        );
        fence
    })
}

/// `LEASE.ACQUIRE <prefix>:<i> ttl TOKEN token` for i in 0..n, in one pipeline; every
/// one must be granted.
pub fn take_many<C: ConnectionLike>(con: &mut C, prefix: &str, n: usize, ttl: u64, token: &str) {
    let mut pipe = redis::pipe();
    for i in 0..n {
        pipe.add_command(acquire_cmd(
            &format!("{prefix}:{i}"),
            ttl,
            Some(token),
            None,
        ));
    }
    let replies: Vec<Value> = pipe
        .query(con)
        .unwrap_or_else(|e| panic!("{n} pipelined acquires of {prefix}: {e}"));
    for (i, r) in replies.into_iter().enumerate() {
        let what = format!("LEASE.ACQUIRE {prefix}:{i}");
        assert!(reply::grant(r, &what).is_some(), "{what} was not granted");
    }
}

/// `LEASE.ACQUIRE key ttl`, with a generated token: `(token, fence)`, or None.
pub fn acquire_new<C: ConnectionLike>(con: &mut C, key: &str, ttl: u64) -> Option<(Vec<u8>, u64)> {
    let reply = call(con, "LEASE.ACQUIRE", (key, ttl));
    reply::grant(reply, &format!("LEASE.ACQUIRE {key} {ttl}"))
}

/// `LEASE.ACQUIRE key ttl TOKEN token`, which must be granted to `token`; the fence.
pub fn take<C: ConnectionLike>(
    con: &mut C,
    key: &str,
    ttl: u64,
    token: &(impl AsRef<[u8]> + ?Sized),
) -> u64 {
    acquire(con, key, ttl, token)
        .unwrap_or_else(|| panic!("LEASE.ACQUIRE {key} {ttl} was not granted"))
}

pub fn renew<C: ConnectionLike>(
    con: &mut C,
    key: &str,
    token: &(impl AsRef<[u8]> + ?Sized),
    ttl: u64,
) -> i64 {
    let reply = call(con, "LEASE.RENEW", (key, token.as_ref(), ttl));
    reply::int(reply, &format!("LEASE.RENEW {key}"))
}

pub fn release<C: ConnectionLike>(
    con: &mut C,
    key: &str,
    token: &(impl AsRef<[u8]> + ?Sized),
) -> i64 {
    let reply = call(con, "LEASE.RELEASE", (key, token.as_ref()));
    reply::int(reply, &format!("LEASE.RELEASE {key}"))
}

/// `LEASE.FENCE resource fence [command ...]`, reply as sent.
pub fn fenced<C: ConnectionLike, A: ToRedisArgs>(
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
