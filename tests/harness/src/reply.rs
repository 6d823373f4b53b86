//! Reading replies: error text, integers, strings, OK, grants, with the call named in
//! panics.

use redis::Value;

/// The whole text of an error reply (`CODE detail`), or None for any other reply.
pub fn error_text(v: &Value) -> Option<String> {
    match v {
        Value::ServerError(e) => Some(match e.details() {
            Some(detail) => format!("{} {detail}", e.code()),
            None => e.code().to_string(),
        }),
        _ => None,
    }
}

pub fn expect_error(v: &Value, what: &str) -> String {
    error_text(v).unwrap_or_else(|| panic!("{what}: expected an error reply, got {v:?}"))
}

pub fn int(v: Value, what: &str) -> i64 {
    match v {
        Value::Int(i) => i,
        other => panic!("{what}: expected an integer, got {other:?}"),
    }
}

/// A bulk or status reply as text.
pub fn text(v: Value, what: &str) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
        Value::SimpleString(s) => s,
        Value::Okay => "OK".to_string(),
        Value::VerbatimString { text, .. } => text,
        other => panic!("{what}: expected a string, got {other:?}"),
    }
}

pub fn assert_ok(v: Value, what: &str) {
    assert!(
        matches!(&v, Value::Okay) || matches!(&v, Value::SimpleString(s) if s == "OK"),
        "{what}: expected OK, got {v:?}"
    );
}

/// A map reply (RESP2: a flat array of names and values) as `(name, value)` pairs.
pub fn pairs(v: &Value, what: &str) -> Vec<(String, Value)> {
    match v {
        Value::Map(pairs) => pairs
            .iter()
            .map(|(k, v)| (text(k.clone(), what), v.clone()))
            .collect(),
        Value::Array(items) if items.len() % 2 == 0 => items
            .chunks(2)
            .map(|pair| (text(pair[0].clone(), what), pair[1].clone()))
            .collect(),
        other => panic!("{what}: expected a map, got {other:?}"),
    }
}

/// An array (or set) of strings.
pub fn strings(v: Value, what: &str) -> Vec<String> {
    match v {
        Value::Array(items) | Value::Set(items) => {
            items.into_iter().map(|i| text(i, what)).collect()
        }
        other => panic!("{what}: expected an array, got {other:?}"),
    }
}

/// Fences are issued from 1 up to this, excluded.
pub const FENCE_LIMIT: u64 = 1 << 53;

/// A `LEASE.ACQUIRE` reply: `(token, fence)` for a grant, None for nil; panics on
/// anything else, a fence out of range included.
pub fn grant(v: Value, what: &str) -> Option<(Vec<u8>, u64)> {
    match v {
        Value::Nil => None,
        Value::Array(items) => match items.as_slice() {
            [Value::BulkString(token), Value::Int(fence)]
                if *fence > 0 && (*fence as u64) < FENCE_LIMIT =>
            {
                Some((token.clone(), *fence as u64))
            }
            _ => panic!("{what}: expected [token, fence] with 0 < fence < 2^53, got {items:?}"),
        },
        other => panic!("{what}: expected [token, fence] or nil, got {other:?}"),
    }
}

/// The text of an error the `redis` crate returns: `CODE detail` for a server's error
/// reply, the error's own description for anything else (a failed connection).
pub fn redis_error_text(e: &redis::RedisError) -> String {
    match (e.code(), e.detail()) {
        (Some(code), Some(detail)) => format!("{code} {detail}"),
        (Some(code), None) => code.to_string(),
        _ => e.to_string(),
    }
}

/// The fence of a grant to `token` (`[token, fence]`, 0 < fence < 2^53), or None for any
/// other reply.
pub fn granted(v: &Value, token: &str) -> Option<u64> {
    match v {
        Value::Array(items) => match items.as_slice() {
            [Value::BulkString(t), Value::Int(fence)]
                if t == token.as_bytes() && *fence > 0 && (*fence as u64) < FENCE_LIMIT =>
            {
                Some(*fence as u64)
            }
            _ => None,
        },
        _ => None,
    }
}
