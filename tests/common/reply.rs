//! Reading replies: error text, integers, strings, OK, with the call named in panics.

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
