//! Version 2 of the contract as the shared-hold tests see it (tests/shared.rs,
//! tests/shared_persistence.rs): `LEASE.ACQUIRE` with `SHARED [LIMIT n]` and `OWNER`,
//! `LEASE.HOLDERS`, blocked acquires of either mode, and what a refused command must
//! leave as it was (`LEASE.INFO` itself: `lease`; the exact errors: `errors`).
//!
//! The `LEASE.HOLDERS` parser is strict: every field, in the contract's order, of the
//! contract's type. A reply that is not so panics with the reply in the message.

use std::time::Duration;

use redis::{Cmd, ConnectionLike, Value};

use super::calls::{call, describe, send};
use super::lease::{lease_info, wait_for_waiters, Info};
use super::reply::{error_text, expect_error, grant};
use super::waiter::Waiter;
use super::Server;

/// How long a test waits for anything that must happen.
pub const WAIT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------
// LEASE.ACQUIRE, full form

/// One `LEASE.ACQUIRE`, built option by option and sent as
/// `key ttl [TOKEN t] [BLOCK ms] [SHARED [LIMIT n]] [OWNER label]`.
#[derive(Clone, Debug)]
pub struct Acquire {
    pub key: String,
    pub ttl: u64,
    pub token: Option<Vec<u8>>,
    pub block: Option<u64>,
    pub shared: bool,
    pub limit: Option<u64>,
    pub owner: Option<Vec<u8>>,
}

impl Acquire {
    pub fn exclusive(key: &str, ttl: u64) -> Acquire {
        Acquire {
            key: key.to_string(),
            ttl,
            token: None,
            block: None,
            shared: false,
            limit: None,
            owner: None,
        }
    }

    pub fn shared(key: &str, ttl: u64) -> Acquire {
        Acquire {
            shared: true,
            ..Acquire::exclusive(key, ttl)
        }
    }

    pub fn token(mut self, token: impl AsRef<[u8]>) -> Acquire {
        self.token = Some(token.as_ref().to_vec());
        self
    }

    /// `SHARED LIMIT n` (sets SHARED too).
    pub fn limit(mut self, n: u64) -> Acquire {
        self.shared = true;
        self.limit = Some(n);
        self
    }

    pub fn owner(mut self, label: impl AsRef<[u8]>) -> Acquire {
        self.owner = Some(label.as_ref().to_vec());
        self
    }

    pub fn block(mut self, ms: u64) -> Acquire {
        self.block = Some(ms);
        self
    }

    pub fn cmd(&self) -> Cmd {
        let mut c = redis::cmd("LEASE.ACQUIRE");
        c.arg(&self.key).arg(self.ttl);
        if let Some(t) = &self.token {
            c.arg("TOKEN").arg(&t[..]);
        }
        if let Some(b) = self.block {
            c.arg("BLOCK").arg(b);
        }
        if self.shared {
            c.arg("SHARED");
        }
        if let Some(n) = self.limit {
            c.arg("LIMIT").arg(n);
        }
        if let Some(o) = &self.owner {
            c.arg("OWNER").arg(&o[..]);
        }
        c
    }

    pub fn what(&self) -> String {
        describe(&self.cmd())
    }

    /// The reply as sent.
    pub fn send<C: ConnectionLike>(&self, con: &mut C) -> Value {
        send(con, &self.cmd())
    }

    /// `(token, fence)` or None for nil; panics on an error reply. A grant to a
    /// chosen token must repeat it.
    pub fn grant<C: ConnectionLike>(&self, con: &mut C) -> Option<(Vec<u8>, u64)> {
        let what = self.what();
        let reply = self.send(con);
        if let Some(e) = error_text(&reply) {
            panic!("`{what}` answered the error {e:?}");
        }
        let granted = grant(reply, &what);
        if let (Some((echoed, _)), Some(token)) = (&granted, &self.token) {
            assert_eq!(echoed, token, "`{what}`: the grant must repeat the token");
        }
        granted
    }

    /// The fence, or None for nil.
    pub fn fence<C: ConnectionLike>(&self, con: &mut C) -> Option<u64> {
        self.grant(con).map(|(_, f)| f)
    }

    /// The fence of a grant that must come.
    pub fn take<C: ConnectionLike>(&self, con: &mut C) -> u64 {
        self.fence(con)
            .unwrap_or_else(|| panic!("`{}` answered nil, not a grant", self.what()))
    }

    /// Asserts the reply is nil.
    pub fn refused<C: ConnectionLike>(&self, con: &mut C) {
        let reply = self.send(con);
        assert_eq!(reply, Value::Nil, "`{}` must answer nil", self.what());
    }

    /// The error reply, which must come.
    pub fn error<C: ConnectionLike>(&self, con: &mut C) -> String {
        expect_error(&self.send(con), &self.what())
    }
}

// ---------------------------------------------------------------------------
// LEASE.INFO (parsed by `lease::parse_info`)

/// `LEASE.INFO key`, which must not be nil.
pub fn info_of<C: ConnectionLike>(con: &mut C, key: &str) -> Info {
    lease_info(con, key).unwrap_or_else(|| panic!("LEASE.INFO {key} is nil"))
}

/// Everything but the ttl, which counts down: for "nothing changed" checks.
pub fn info_still(info: &Info) -> Info {
    Info {
        ttl: 0,
        ..info.clone()
    }
}

// ---------------------------------------------------------------------------
// Reading maps

/// A name or a text value: bulk or simple string.
fn as_text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

/// A map (RESP3) or a flat array (RESP2) of exactly `names`, in that order.
fn fields(v: Value, names: &[&str], what: &str) -> Vec<Value> {
    let pairs: Vec<(Value, Value)> = match v {
        Value::Map(pairs) => pairs,
        Value::Array(items) if items.len() % 2 == 0 => {
            let mut out = Vec::new();
            let mut it = items.into_iter();
            while let (Some(k), Some(v)) = (it.next(), it.next()) {
                out.push((k, v));
            }
            out
        }
        other => panic!("{what}: expected a map or a flat array, got {other:?}"),
    };
    let shown: Vec<String> = pairs
        .iter()
        .map(|(k, _)| as_text(k).unwrap_or_else(|| format!("{k:?}")))
        .collect();
    assert_eq!(shown, names, "{what}: the field names, in order");
    pairs.into_iter().map(|(_, v)| v).collect()
}

fn int_field(v: &Value, name: &str, what: &str) -> i64 {
    match v {
        Value::Int(n) => *n,
        other => panic!("{what}: `{name}` must be an integer, got {other:?}"),
    }
}

fn text_or_nil(v: &Value, name: &str, what: &str) -> Option<String> {
    match v {
        Value::Nil => None,
        other => Some(
            as_text(other)
                .unwrap_or_else(|| panic!("{what}: `{name}` must be a string or nil: {other:?}")),
        ),
    }
}

// ---------------------------------------------------------------------------
// LEASE.HOLDERS

/// The field names of a `LEASE.HOLDERS` entry, in reply order.
pub const HOLDER_FIELDS: [&str; 5] = ["fence", "ttl", "mode", "owner", "session"];

/// One live hold as `LEASE.HOLDERS` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub fence: u64,
    pub ttl: i64,
    pub mode: String,
    pub owner: Option<String>,
    pub session: Option<String>,
}

/// Parses a `LEASE.HOLDERS` reply: an array of entries of the five fields in order.
pub fn parse_holders(reply: Value, what: &str) -> Vec<Holder> {
    let entries = match reply {
        Value::Array(entries) => entries,
        other => panic!("{what}: expected an array, got {other:?}"),
    };
    entries
        .into_iter()
        .enumerate()
        .map(|(i, entry)| {
            let what = format!("{what}: entry {i}");
            let v = fields(entry, &HOLDER_FIELDS, &what);
            let fence = int_field(&v[0], "fence", &what);
            assert!(fence > 0, "{what}: fence {fence}");
            Holder {
                fence: fence as u64,
                ttl: int_field(&v[1], "ttl", &what),
                mode: as_text(&v[2]).unwrap_or_else(|| panic!("{what}: mode {:?}", v[2])),
                owner: text_or_nil(&v[3], "owner", &what),
                session: text_or_nil(&v[4], "session", &what),
            }
        })
        .collect()
}

/// `LEASE.HOLDERS key`, over RESP2 or RESP3.
pub fn holders<C: ConnectionLike>(con: &mut C, key: &str) -> Vec<Holder> {
    parse_holders(
        call(con, "LEASE.HOLDERS", key),
        &format!("LEASE.HOLDERS {key}"),
    )
}

/// The fences `LEASE.HOLDERS key` lists, in its order.
pub fn holder_fences<C: ConnectionLike>(con: &mut C, key: &str) -> Vec<u64> {
    holders(con, key).iter().map(|h| h.fence).collect()
}

/// `(fence, mode, owner)` of a hold: what must survive a reload, a copy or a replica
/// (the ttl counts down).
pub type Still = (u64, String, Option<String>);

/// `(fence, mode, owner)` of each hold of `key`, oldest first.
pub fn holds_still<C: ConnectionLike>(con: &mut C, key: &str) -> Vec<Still> {
    holders(con, key)
        .into_iter()
        .map(|h| (h.fence, h.mode, h.owner))
        .collect()
}

// ---------------------------------------------------------------------------
// Tokens never shown

/// Every string in a reply, nested ones included.
pub fn strings_in(v: &Value, out: &mut Vec<Vec<u8>>) {
    match v {
        Value::BulkString(b) => out.push(b.clone()),
        Value::SimpleString(s) => out.push(s.as_bytes().to_vec()),
        Value::VerbatimString { text, .. } => out.push(text.as_bytes().to_vec()),
        Value::Array(items) | Value::Set(items) => items.iter().for_each(|i| strings_in(i, out)),
        Value::Map(pairs) => pairs.iter().for_each(|(k, v)| {
            strings_in(k, out);
            strings_in(v, out);
        }),
        _ => {}
    }
}

/// Panics if any string in `reply` contains one of `tokens`.
pub fn assert_no_token(reply: &Value, tokens: &[&[u8]], what: &str) {
    let mut all = Vec::new();
    strings_in(reply, &mut all);
    for s in &all {
        for t in tokens {
            assert!(
                !s.windows(t.len()).any(|w| w == *t),
                "{what} shows the token {:?}: {reply:?}",
                String::from_utf8_lossy(t)
            );
        }
    }
}

// ---------------------------------------------------------------------------
// "Nothing changed"

/// What a refused command must leave as it was: the number of keys, the digest of the
/// dataset, and `LEASE.INFO` / `LEASE.HOLDERS` of some keys without their ttls.
#[derive(Debug, PartialEq, Eq)]
pub struct Snapshot {
    dbsize: i64,
    digest: String,
    keys: Vec<(String, Option<Info>, Vec<Still>)>,
}

pub fn snapshot<C: ConnectionLike>(con: &mut C, keys: &[&str]) -> Snapshot {
    let dbsize = match call(con, "DBSIZE", super::calls::NONE) {
        Value::Int(n) => n,
        other => panic!("DBSIZE: {other:?}"),
    };
    let digest = match call(con, "DEBUG", "DIGEST") {
        Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
        Value::SimpleString(s) => s,
        other => panic!("DEBUG DIGEST: {other:?}"),
    };
    let keys = keys
        .iter()
        .map(|k| {
            let i = lease_info(con, k).map(|i| info_still(&i));
            (k.to_string(), i, holds_still(con, k))
        })
        .collect();
    Snapshot {
        dbsize,
        digest,
        keys,
    }
}

/// Sends `cmd`, asserts it fails with exactly `expected` and that nothing changed.
pub fn assert_refused<C: ConnectionLike>(con: &mut C, watched: &[&str], cmd: &Cmd, expected: &str) {
    assert_refused_with(con, watched, cmd, expected, |e| e == expected);
}

/// Sends `cmd`, asserts its error passes `check` and that nothing changed.
pub fn assert_refused_with<C: ConnectionLike>(
    con: &mut C,
    watched: &[&str],
    cmd: &Cmd,
    expected: &str,
    check: impl Fn(&str) -> bool,
) {
    let before = snapshot(con, watched);
    let what = describe(cmd);
    let error = expect_error(&send(con, cmd), &what);
    assert!(
        check(&error),
        "`{what}`: expected {expected}, got {error:?}"
    );
    let after = snapshot(con, watched);
    assert_eq!(before, after, "`{what}` was refused but changed something");
}

// ---------------------------------------------------------------------------
// Blocked clients

/// Sends `acquire` (which should block) from a thread of its own; returns once
/// `LEASE.INFO` counts it as the `position`th waiter of its key.
pub fn queue(server: &Server, acquire: &Acquire, position: i64) -> Waiter {
    let waiter = Waiter::send(server, &[], acquire.cmd());
    wait_for_waiters(&mut server.client(), &acquire.key, position);
    waiter
}

/// The fence of a waiter's grant to `token`, which must come within 10 s.
pub fn granted_to(waiter: Waiter, token: &str, what: &str) -> u64 {
    let (reply, _) = waiter.reply(WAIT, what);
    let (echoed, fence) = grant(reply, what).unwrap_or_else(|| panic!("{what}: answered nil"));
    assert_eq!(echoed, token.as_bytes(), "{what}: granted to another token");
    fence
}

/// The server-clock millisecond a fence was issued in (fences are `unix_ms * 1024`
/// or just above while grants come faster than one per 1/1024 ms).
pub fn fence_ms(fence: u64) -> u64 {
    fence / 1024
}
