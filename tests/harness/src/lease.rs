//! Helpers about the module's own replies and formats, shared by the test files:
//! `LEASE.INFO`, `INFO lease`, and DUMP payloads of leases and records.

use std::time::Duration;

use redis::{ConnectionLike, Value};

use super::calls::{call, int, restore, take};
use super::rdb::{crc64, seal, Body};
use super::reply::assert_ok;
use super::{now_ms, wait_until, Server};

/// What `LEASE.INFO` says about a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Info {
    pub state: String,
    pub ttl: i64,
    pub fence: u64,
    pub waiters: i64,
    /// `exclusive`, `shared`, or `None` when free.
    pub mode: Option<String>,
    pub holders: i64,
    pub limit: Option<i64>,
    pub owner: Option<String>,
    pub session: Option<String>,
    pub bound: i64,
    /// Every field name, in reply order.
    pub fields: Vec<String>,
}

/// `LEASE.INFO`'s fields, in the order the contract gives them.
pub const INFO_FIELDS: [&str; 10] = [
    "state", "ttl", "fence", "waiters", "mode", "holders", "limit", "owner", "session", "bound",
];

fn optional_text(v: Value, what: &str, name: &str) -> Option<String> {
    match v {
        Value::Nil => None,
        Value::BulkString(b) => Some(String::from_utf8_lossy(&b).into_owned()),
        other => panic!("{what}: `{name}` is neither nil nor a string: {other:?}"),
    }
}

/// Parses a `LEASE.INFO` reply: nil, a RESP2 flat array or a RESP3 map of exactly
/// `INFO_FIELDS` in that order: `state` (a bulk string), `ttl`, `fence` and `waiters`
/// (integers), `mode` (a bulk string or nil), `holders` (an integer), `limit` (an
/// integer or nil), `owner` and `session` (a bulk string or nil), `bound` (an
/// integer). Anything else panics, naming `what`.
pub fn parse_info(reply: Value, what: &str) -> Option<Info> {
    let pairs: Vec<(Value, Value)> = match reply {
        Value::Nil => return None,
        Value::Map(pairs) => pairs,
        Value::Array(items) => {
            assert!(items.len() % 2 == 0, "{what}: odd flat array {items:?}");
            let mut it = items.into_iter();
            let mut pairs = Vec::new();
            while let (Some(k), Some(v)) = (it.next(), it.next()) {
                pairs.push((k, v));
            }
            pairs
        }
        other => panic!("{what}: expected nil, a map or a flat array, got {other:?}"),
    };
    let (mut state, mut ttl, mut fence, mut waiters) = (None, None, None, None);
    let (mut mode, mut holders, mut limit, mut owner, mut session, mut bound) =
        (None, None, None, None, None, None);
    let mut fields = Vec::new();
    for (k, v) in pairs {
        let name = match k {
            Value::BulkString(name) => String::from_utf8_lossy(&name).into_owned(),
            other => panic!("{what}: a field name {other:?}"),
        };
        match (name.as_str(), v) {
            ("state", Value::BulkString(s)) => {
                state = Some(String::from_utf8_lossy(&s).into_owned())
            }
            ("ttl", Value::Int(n)) => ttl = Some(n),
            ("fence", Value::Int(n)) if n >= 0 => fence = Some(n as u64),
            ("waiters", Value::Int(n)) => waiters = Some(n),
            ("mode", v) => mode = Some(optional_text(v, what, "mode")),
            ("holders", Value::Int(n)) if n >= 0 => holders = Some(n),
            ("limit", Value::Int(n)) if n > 0 => limit = Some(Some(n)),
            ("limit", Value::Nil) => limit = Some(None),
            ("owner", v) => owner = Some(optional_text(v, what, "owner")),
            ("session", v) => session = Some(optional_text(v, what, "session")),
            ("bound", Value::Int(n)) if n >= 0 => bound = Some(n),
            (name, v) => panic!("{what}: unexpected field {name} = {v:?}"),
        }
        fields.push(name);
    }
    assert_eq!(fields, INFO_FIELDS, "{what}: the fields and their order");
    let missing = |field: &str| -> ! { panic!("{what}: no `{field}` in {fields:?}") };
    Some(Info {
        state: state.unwrap_or_else(|| missing("state")),
        ttl: ttl.unwrap_or_else(|| missing("ttl")),
        fence: fence.unwrap_or_else(|| missing("fence")),
        waiters: waiters.unwrap_or_else(|| missing("waiters")),
        mode: mode.unwrap_or_else(|| missing("mode")),
        holders: holders.unwrap_or_else(|| missing("holders")),
        limit: limit.unwrap_or_else(|| missing("limit")),
        owner: owner.unwrap_or_else(|| missing("owner")),
        session: session.unwrap_or_else(|| missing("session")),
        bound: bound.unwrap_or_else(|| missing("bound")),
        fields,
    })
}

/// `LEASE.INFO key`, over RESP2 or RESP3; `None` for nil.
pub fn lease_info<C: ConnectionLike>(con: &mut C, key: &str) -> Option<Info> {
    let what = format!("LEASE.INFO {key}");
    parse_info(call(con, "LEASE.INFO", key), &what)
}

/// The clients `LEASE.INFO key` counts as waiting, 0 for no key.
pub fn waiters<C: ConnectionLike>(con: &mut C, key: &str) -> i64 {
    lease_info(con, key).map_or(0, |i| i.waiters)
}

/// Waits until `LEASE.INFO key` counts `n` waiters.
pub fn wait_for_waiters<C: ConnectionLike>(con: &mut C, key: &str, n: i64) {
    wait_until(
        &format!("LEASE.INFO {key} waiters = {n}"),
        Duration::from_secs(5),
        || waiters(con, key) == n,
    );
}

/// A field of `INFO lease`, named without its `lease_` prefix.
pub fn lease_stat(server: &Server, field: &str) -> u64 {
    let name = format!("lease_{field}");
    let value = server
        .info_field("lease", &name)
        .unwrap_or_else(|| panic!("INFO lease has no {name}:\n{}", server.info("lease")));
    value
        .parse()
        .unwrap_or_else(|e| panic!("{name}:{value} is not a number: {e}"))
}

/// A DUMP payload split into its value and its RDB version.
#[derive(Clone, Debug)]
pub struct Dump {
    pub body: Vec<u8>,
    pub version: [u8; 2],
}

impl Dump {
    /// Splits a payload, checking its CRC-64 as this harness computes it.
    pub fn parse(payload: &[u8], what: &str) -> Dump {
        assert!(payload.len() > 10, "{what}: {payload:?}");
        let (signed, crc) = payload.split_at(payload.len() - 8);
        let mut crc_bytes = [0u8; 8];
        crc_bytes.copy_from_slice(crc);
        assert_eq!(
            crc64(signed),
            u64::from_le_bytes(crc_bytes),
            "the CRC64 of {what} as this test computes it"
        );
        let (body, version) = signed.split_at(signed.len() - 2);
        Dump {
            body: body.to_vec(),
            version: [version[0], version[1]],
        }
    }

    /// The payload again, as `RESTORE` takes it.
    pub fn payload(&self) -> Vec<u8> {
        seal(&self.body, self.version)
    }

    /// The module type id (type name and encoding version).
    pub fn module_id(&self) -> u64 {
        Body(self.body.clone()).module_id()
    }

    pub fn with_module_id(&self, id: u64) -> Dump {
        let mut body = self.body.clone();
        body[2..10].copy_from_slice(&id.to_be_bytes());
        Dump {
            body,
            version: self.version,
        }
    }

    /// A module value of this dump's module id and RDB version.
    fn with_fields(&self, fields: impl FnOnce(Body) -> Body) -> Dump {
        Dump {
            body: fields(Body::with_id(self.module_id())).0,
            version: self.version,
        }
    }
}

/// `DUMP key`, which must exist, split and checked.
pub fn dump<C: ConnectionLike>(con: &mut C, key: &str) -> Dump {
    match call(con, "DUMP", key) {
        Value::BulkString(payload) => Dump::parse(&payload, &format!("DUMP {key}")),
        other => panic!("DUMP {key} answered {other:?}"),
    }
}

/// A lease-key value as the module saves it (encoding 1: fence, deadline, token), under
/// the module id and RDB version of `template`, a DUMP of a real lease.
pub fn lease_dump(template: &Dump, fence: u64, deadline_ms: u64, token: &[u8]) -> Dump {
    template.with_fields(|b| b.lease_fields(fence, deadline_ms, token))
}

/// A fence-rec value (encoding 1: highest) under the module id and RDB version of
/// `template`, a DUMP of a real resource record.
pub fn record_dump(template: &Dump, highest: u64) -> Dump {
    template.with_fields(|b| b.unsigned(highest).eof())
}

/// A fence far above this node's clock floor (about 19 hours of grants ahead), as a key
/// restored from a node whose clock runs ahead would carry. Only the module's own
/// bookkeeping, not the clock, can keep later fences above it.
pub fn fence_ahead() -> u64 {
    now_ms() * 1024 + (1 << 36)
}

/// RESTOREs under `key` a lease held by `token` for a minute, with a `fence_ahead()`,
/// as a key migrated from a node with a fast clock carries; returns that fence.
/// `template` is a free key name (in `key`'s slot, on a cluster), taken for a DUMP and
/// deleted again.
pub fn restore_fence_ahead<C: ConnectionLike>(
    con: &mut C,
    key: &str,
    template: &str,
    token: &str,
) -> u64 {
    take(con, template, 60_000, "t");
    let template_dump = dump(con, template);
    assert_eq!(int(call(con, "DEL", template)), 1);
    let ahead = fence_ahead();
    let payload = lease_dump(&template_dump, ahead, now_ms() + 60_000, token.as_bytes());
    assert_ok(
        restore(con, key, &payload.payload()),
        &format!("RESTORE {key} with a fence ahead"),
    );
    ahead
}
