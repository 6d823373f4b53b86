//! The workload both benches send: the Lua way's scripts, key names, tokens, the
//! commands of each way, and the pipelined driver that checks every reply.

use crate::common::{self, Server};
use crate::resp::{encode, Conn, Reply};

/// The compare-and-pexpire script of the usual Redis lock recipe.
pub const RENEW_LUA: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then \
     return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end";
/// The compare-and-delete script of the usual Redis lock recipe.
pub const RELEASE_LUA: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then \
     return redis.call('del', KEYS[1]) else return 0 end";

/// Commands per pipeline when loading or measuring.
pub const CHUNK: usize = 1000;
/// Resources / counters that `LEASE.FENCE` / `INCR` cycle through.
pub const COUNTER_KEYS: usize = 1024;

/// `prefix:00001234`: the same names for leases and strings.
pub fn key(prefix: &str, i: usize) -> Vec<u8> {
    format!("{prefix}:{i:08}").into_bytes()
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// A 32-lowercase-hex token, as the module generates, different for every `i`.
pub fn token(i: usize) -> [u8; 32] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let words = [splitmix64(i as u64), splitmix64(!(i as u64))];
    let mut out = [0u8; 32];
    for (w, word) in words.iter().enumerate() {
        for n in 0..16 {
            out[w * 16 + n] = HEX[((word >> (60 - 4 * n)) & 0xf) as usize];
        }
    }
    out
}

/// Sends `n` commands made by `make(i, buf)` in pipelines of `CHUNK`, one pipeline
/// always in flight ahead of the replies being read so the server never waits for the
/// client, and checks every reply with `check`.
pub fn drive(
    conn: &mut Conn,
    n: usize,
    what: &str,
    mut make: impl FnMut(usize, &mut Vec<u8>),
    check: impl Fn(usize, &Reply) -> bool,
) {
    let mut buf = Vec::with_capacity(CHUNK * 100);
    let mut send = |conn: &mut Conn, from: usize| -> usize {
        let to = (from + CHUNK).min(n);
        buf.clear();
        for i in from..to {
            make(i, &mut buf);
        }
        conn.send(&buf)
            .unwrap_or_else(|e| panic!("{what}: cannot send: {e}"));
        to
    };
    let mut sent = if n > 0 { send(conn, 0) } else { 0 };
    let mut read = 0;
    while read < n {
        let upto = sent;
        if sent < n {
            sent = send(conn, sent);
        }
        for i in read..upto {
            let reply = conn
                .read()
                .unwrap_or_else(|e| panic!("{what}: cannot read reply {i}: {e}"));
            if !check(i, &reply) {
                panic!("{what}: unexpected reply to command {i}: {reply:?}");
            }
        }
        read = upto;
    }
}

/// `Redis 7.0.15`, `Valkey 8.1.8`: what the server says it is.
pub fn server_version(server: &Server) -> String {
    let info = server.info("server");
    let get = |f: &str| common::info_field(&info, f);
    match (get("valkey_version"), get("redis_version")) {
        (Some(v), _) => format!("Valkey {v}"),
        (None, Some(v)) => format!("Redis {v}"),
        _ => "unknown".to_string(),
    }
}

/// The Lua way's scripts, loaded: their SHA1s for EVALSHA.
pub struct Scripts {
    pub renew: String,
    pub release: String,
}

pub fn load_scripts(conn: &mut Conn) -> Scripts {
    Scripts {
        renew: conn.must(&["SCRIPT", "LOAD", RENEW_LUA]).text(),
        release: conn.must(&["SCRIPT", "LOAD", RELEASE_LUA]).text(),
    }
}

// Command makers. Each writes one command for index `i` into the buffer.

pub fn set_nx_px(buf: &mut Vec<u8>, k: &[u8], t: &[u8], ttl: &[u8]) {
    encode(buf, &[b"SET", k, t, b"NX", b"PX", ttl]);
}

pub fn acquire(buf: &mut Vec<u8>, k: &[u8], t: &[u8], ttl: &[u8]) {
    encode(buf, &[b"LEASE.ACQUIRE", k, ttl, b"TOKEN", t]);
}

pub fn eval_renew(buf: &mut Vec<u8>, sha: &str, k: &[u8], t: &[u8], ttl: &[u8]) {
    encode(buf, &[b"EVALSHA", sha.as_bytes(), b"1", k, t, ttl]);
}

pub fn eval_release(buf: &mut Vec<u8>, sha: &str, k: &[u8], t: &[u8]) {
    encode(buf, &[b"EVALSHA", sha.as_bytes(), b"1", k, t]);
}

pub fn renew(buf: &mut Vec<u8>, k: &[u8], t: &[u8], ttl: &[u8]) {
    encode(buf, &[b"LEASE.RENEW", k, t, ttl]);
}

pub fn release(buf: &mut Vec<u8>, k: &[u8], t: &[u8]) {
    encode(buf, &[b"LEASE.RELEASE", k, t]);
}

pub fn is_one(r: &Reply) -> bool {
    r.int() == Some(1)
}
