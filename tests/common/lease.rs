//! Helpers about the module's own replies and formats, shared by the test files.

use redis::{ConnectionLike, Value};

use super::Server;

/// What `LEASE.INFO` says about a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Info {
    pub state: String,
    pub ttl: i64,
    pub fence: u64,
    pub waiters: i64,
}

/// `LEASE.INFO key`, read from a RESP2 flat array or a RESP3 map; `None` for nil.
pub fn lease_info<C: ConnectionLike>(con: &mut C, key: &str) -> Option<Info> {
    let reply: Value = redis::cmd("LEASE.INFO")
        .arg(key)
        .query(con)
        .unwrap_or_else(|e| panic!("LEASE.INFO {key} failed: {e}"));
    let pairs: Vec<(Value, Value)> = match reply {
        Value::Nil => return None,
        Value::Array(items) => items
            .chunks(2)
            .map(|pair| (pair[0].clone(), pair.get(1).cloned().unwrap_or(Value::Nil)))
            .collect(),
        Value::Map(pairs) => pairs,
        other => panic!("LEASE.INFO {key} answered {other:?}"),
    };
    let field = |name: &str| {
        pairs
            .iter()
            .find(|(k, _)| *k == Value::BulkString(name.as_bytes().to_vec()))
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("LEASE.INFO {key} has no {name}: {pairs:?}"))
    };
    let int = |name: &str| match field(name) {
        Value::Int(n) => n,
        other => panic!("LEASE.INFO {key} {name} is not an integer: {other:?}"),
    };
    let state = match field("state") {
        Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
        Value::SimpleString(s) => s,
        other => panic!("LEASE.INFO {key} state is not a string: {other:?}"),
    };
    Some(Info {
        state,
        ttl: int("ttl"),
        fence: int("fence") as u64,
        waiters: int("waiters"),
    })
}

/// CRC-64 as Redis computes it for DUMP payloads: Jones polynomial, reflected, init 0,
/// no final xor.
pub fn crc64(data: &[u8]) -> u64 {
    const POLY_REFLECTED: u64 = 0x95ac_9329_ac4b_c9b5; // 0xad93d23594c935a9 bit-reversed
    let mut crc = 0u64;
    for &byte in data {
        crc ^= u64::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ POLY_REFLECTED
            } else {
                crc >> 1
            };
        }
    }
    crc
}

pub fn lease_stat(server: &Server, field: &str) -> u64 {
    let name = format!("lease_{field}");
    let value = server
        .info_field("lease", &name)
        .unwrap_or_else(|| panic!("INFO lease has no {name}"));
    value
        .parse()
        .unwrap_or_else(|e| panic!("{name}:{value} is not a number: {e}"))
}

/// An RDB length as `rdbSaveLen` writes it.
pub fn rdb_len(out: &mut Vec<u8>, v: u64) {
    if v < 1 << 6 {
        out.push(v as u8);
    } else if v < 1 << 14 {
        out.push(0x40 | (v >> 8) as u8);
        out.push(v as u8);
    } else if v <= u64::from(u32::MAX) {
        out.push(0x80);
        out.extend_from_slice(&(v as u32).to_be_bytes());
    } else {
        out.push(0x81);
        out.extend_from_slice(&v.to_be_bytes());
    }
}

/// A lease DUMPed from `template`'s server, rebuilt with other values: type byte,
/// module id (0x81 + 8 bytes), then fence, deadline, token behind their opcodes, EOF,
/// the RDB version and a CRC-64 (Jones, reflected, as Redis computes it).
pub fn lease_payload(template: &[u8], fence: u64, deadline_ms: u64, token: &[u8]) -> Vec<u8> {
    fn len(out: &mut Vec<u8>, v: u64) {
        out.push(0x81);
        out.extend_from_slice(&v.to_be_bytes());
    }
    assert_eq!(&template[..2], &[7, 0x81], "a module value: {template:?}");
    assert!(token.len() < 64, "one-byte length only");
    let mut out = template[..10].to_vec();
    out.push(2);
    len(&mut out, fence);
    out.push(2);
    len(&mut out, deadline_ms);
    out.push(5);
    out.push(token.len() as u8);
    out.extend_from_slice(token);
    out.push(0);
    let version = [template[template.len() - 10], template[template.len() - 9]];
    seal(&out, version)
}

/// A DUMP payload: `body` + the RDB version + a valid CRC-64 of both.
pub fn seal(body: &[u8], version: [u8; 2]) -> Vec<u8> {
    let mut out = body.to_vec();
    out.extend_from_slice(&version);
    let crc = crc64(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}
