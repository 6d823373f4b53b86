//! Sessions and lock-delay (contract version 2): `LEASE.ACQUIRE ... SESSION
//! session-key session-token` and `DELAY ms`, the exact errors of both options, and the checks the session test files share (tests/sessions.rs,
//! tests/sessions_persistence.rs).

use redis::{Cmd, ConnectionLike, Value};

use super::calls::send;
use super::holds::holders;
use super::lease::{lease_info, lease_stat, Info};
use super::reply::{self, grant};
use super::Server;

/// The error for a SESSION that is not a live lease held by the session token.
pub fn no_session(session: &str) -> String {
    format!("ERR no live session on {session} for this token")
}

pub const SHARED_SESSION_ERR: &str = "ERR a session must be an exclusive lease";
pub const NESTED_SESSION_ERR: &str = "ERR a session cannot itself be bound to a session";
pub const SELF_BIND_ERR: &str = "ERR a key cannot be bound to itself";
pub const OTHER_SESSION_ERR: &str = "ERR this token's hold is not bound to that session";
pub const DELAY_ERR: &str = "ERR DELAY must be an integer from 0 to 1099511627776 (milliseconds)";
pub const DELAY_SHARED_ERR: &str = "ERR DELAY applies to exclusive leases only";

/// `LEASE.ACQUIRE key ttl TOKEN token` followed by `words` (options in any order).
pub fn acquire_with(key: &str, ttl: u64, token: &str, words: &[&str]) -> Cmd {
    let mut c = redis::cmd("LEASE.ACQUIRE");
    c.arg(key).arg(ttl).arg("TOKEN").arg(token);
    for word in words {
        c.arg(*word);
    }
    c
}

/// `acquire_with`, sent: the reply as it came, error replies included.
pub fn acquire_reply<C: ConnectionLike>(
    con: &mut C,
    key: &str,
    ttl: u64,
    token: &str,
    words: &[&str],
) -> Value {
    send(con, &acquire_with(key, ttl, token, words))
}

/// The fence of a grant that must go to `token`.
fn granted_fence(reply: Value, token: &str, what: &str) -> u64 {
    if let Some(error) = reply::error_text(&reply) {
        panic!("{what}: {error}");
    }
    let (echoed, fence) = grant(reply, what).unwrap_or_else(|| panic!("{what}: not granted"));
    assert_eq!(echoed, token.as_bytes(), "{what}: the token of the grant");
    fence
}

/// `LEASE.ACQUIRE key ttl TOKEN token <words>`, which must be granted; the fence.
pub fn take_with<C: ConnectionLike>(
    con: &mut C,
    key: &str,
    ttl: u64,
    token: &str,
    words: &[&str],
) -> u64 {
    let what = format!(
        "LEASE.ACQUIRE {key} {ttl} TOKEN {token} {}",
        words.join(" ")
    );
    granted_fence(acquire_reply(con, key, ttl, token, words), token, &what)
}

/// A hold on `key` for `token` bound to the session `session` held by `session_token`
/// (`ttl` 0: no deadline of its own); panics unless granted. The fence.
pub fn bind<C: ConnectionLike>(
    con: &mut C,
    key: &str,
    ttl: u64,
    token: &str,
    session: &str,
    session_token: &str,
) -> u64 {
    take_with(con, key, ttl, token, &["SESSION", session, session_token])
}

/// As `bind`, a shared hold.
pub fn bind_shared<C: ConnectionLike>(
    con: &mut C,
    key: &str,
    ttl: u64,
    token: &str,
    session: &str,
    session_token: &str,
) -> u64 {
    take_with(
        con,
        key,
        ttl,
        token,
        &["SHARED", "SESSION", session, session_token],
    )
}

/// `n` holds `<prefix><i>` (i in 0..n) for `token`, bound to `session`, with `ttl`,
/// sent in pipelines of 1,000; each must be granted.
pub fn bind_many<C: ConnectionLike>(
    con: &mut C,
    prefix: &str,
    n: usize,
    ttl: u64,
    token: &str,
    session: &str,
    session_token: &str,
) {
    for start in (0..n).step_by(1000) {
        let end = (start + 1000).min(n);
        let mut pipe = redis::pipe();
        for i in start..end {
            pipe.add_command(acquire_with(
                &format!("{prefix}{i}"),
                ttl,
                token,
                &["SESSION", session, session_token],
            ));
        }
        let replies: Vec<Value> = pipe
            .query(con)
            .unwrap_or_else(|e| panic!("pipelined bound acquires {start}..{end}: {e}"));
        assert_eq!(replies.len(), end - start);
        for (i, r) in (start..end).zip(replies) {
            granted_fence(r, token, &format!("bound LEASE.ACQUIRE {prefix}{i}"));
        }
    }
}

/// Whether `LEASE.INFO` shows no live hold: no record, or a record that is free or
/// delayed with no holder.
pub fn unheld(info: &Option<Info>) -> bool {
    match info {
        None => true,
        Some(i) => i.state != "held" && i.holders == 0 && i.mode.is_none(),
    }
}

/// No hold on `key` is live right now: `LEASE.INFO` is nil, or free (or delayed) with
/// no mode, no holder, no owner and no session; `LEASE.HOLDERS` is empty.
pub fn assert_unheld<C: ConnectionLike>(con: &mut C, key: &str, when: &str) {
    let info = lease_info(con, key);
    assert!(unheld(&info), "{when}: LEASE.INFO {key} = {info:?}");
    if let Some(i) = &info {
        if i.state == "free" {
            assert_eq!(i.ttl, -1, "{when}: {key}: {i:?}");
        }
        assert_eq!((&i.owner, &i.session), (&None, &None), "{when}: {key}");
    }
    let list = holders(con, key);
    assert!(list.is_empty(), "{when}: LEASE.HOLDERS {key} = {list:?}");
}

/// `LEASE.INFO key`, which must show a live exclusive hold bound to `session` with
/// `fence`.
pub fn assert_bound<C: ConnectionLike>(
    con: &mut C,
    key: &str,
    fence: u64,
    session: &str,
    when: &str,
) -> Info {
    let info = lease_info(con, key).unwrap_or_else(|| panic!("{when}: LEASE.INFO {key} is nil"));
    assert_eq!(info.state, "held", "{when}: {key}: {info:?}");
    assert_eq!(info.fence, fence, "{when}: {key}: {info:?}");
    assert_eq!(info.mode.as_deref(), Some("exclusive"), "{when}: {key}");
    assert_eq!(info.holders, 1, "{when}: {key}: {info:?}");
    assert_eq!(info.session.as_deref(), Some(session), "{when}: {key}");
    assert!(info.ttl > 0, "{when}: {key}: {info:?}");
    info
}

/// `bound` of `LEASE.INFO session` (0 for no record).
pub fn bound_count<C: ConnectionLike>(con: &mut C, session: &str) -> i64 {
    lease_info(con, session).map_or(0, |i| i.bound)
}

/// The session gauges and counter of `INFO lease`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionStats {
    pub bound_holds: u64,
    pub sessions: u64,
    pub session_expiries: u64,
    pub delays: u64,
}

pub fn session_stats(server: &Server) -> SessionStats {
    SessionStats {
        bound_holds: lease_stat(server, "bound_holds"),
        sessions: lease_stat(server, "sessions"),
        session_expiries: lease_stat(server, "session_expiries"),
        delays: lease_stat(server, "delays"),
    }
}
