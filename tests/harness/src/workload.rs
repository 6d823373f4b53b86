//! The workload both benches send: the Lua way's scripts, key names, tokens, the
//! commands of each way, and the pipelined driver that checks every reply.

use crate::resp::{encode, Conn, Reply};
use crate::Server;

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
    let get = |f: &str| crate::info_field(&info, f);
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

// Shared holds (issue 16) and the semaphore built the usual way: a sorted set of tokens
// scored by their deadlines, the server's clock read inside each script.

/// The semaphore's acquire: drop the expired holds, count the rest, add this one.
/// `ARGV`: token, limit, ttl (ms). Returns 1 when granted, 0 when full.
pub const SEM_ACQUIRE_LUA: &str = "local t = redis.call('time') \
     local now = t[1] * 1000 + math.floor(t[2] / 1000) \
     redis.call('zremrangebyscore', KEYS[1], '-inf', now) \
     if redis.call('zcard', KEYS[1]) < tonumber(ARGV[2]) then \
     redis.call('zadd', KEYS[1], now + tonumber(ARGV[3]), ARGV[1]) return 1 end \
     return 0";
/// The semaphore's renew: the token's hold must be there and not expired, then its
/// deadline moves (`ZADD XX`). `ARGV`: token, ttl (ms). Returns 1 when renewed.
pub const SEM_RENEW_LUA: &str = "local s = redis.call('zscore', KEYS[1], ARGV[1]) \
     if not s then return 0 end \
     local t = redis.call('time') \
     local now = t[1] * 1000 + math.floor(t[2] / 1000) \
     if tonumber(s) <= now then return 0 end \
     redis.call('zadd', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1]) return 1";

/// The semaphore's scripts, loaded: their SHA1s for EVALSHA. Release is a plain `ZREM`.
pub struct SemScripts {
    pub acquire: String,
    pub renew: String,
}

pub fn load_sem_scripts(conn: &mut Conn) -> SemScripts {
    SemScripts {
        acquire: conn.must(&["SCRIPT", "LOAD", SEM_ACQUIRE_LUA]).text(),
        renew: conn.must(&["SCRIPT", "LOAD", SEM_RENEW_LUA]).text(),
    }
}

/// `LEASE.ACQUIRE key ttl TOKEN token SHARED LIMIT limit`.
pub fn acquire_shared(buf: &mut Vec<u8>, k: &[u8], t: &[u8], ttl: &[u8], limit: &[u8]) {
    encode(
        buf,
        &[
            b"LEASE.ACQUIRE",
            k,
            ttl,
            b"TOKEN",
            t,
            b"SHARED",
            b"LIMIT",
            limit,
        ],
    );
}

pub fn sem_acquire(buf: &mut Vec<u8>, sha: &str, k: &[u8], t: &[u8], ttl: &[u8], limit: &[u8]) {
    encode(buf, &[b"EVALSHA", sha.as_bytes(), b"1", k, t, limit, ttl]);
}

pub fn sem_renew(buf: &mut Vec<u8>, sha: &str, k: &[u8], t: &[u8], ttl: &[u8]) {
    encode(buf, &[b"EVALSHA", sha.as_bytes(), b"1", k, t, ttl]);
}

pub fn sem_release(buf: &mut Vec<u8>, k: &[u8], t: &[u8]) {
    encode(buf, &[b"ZREM", k, t]);
}

/// Whether the server's module takes `SHARED` (issue 16): a shared acquire of a fresh
/// key, deleted again. Before issue 16 the option is an unknown argument.
pub fn supports_shared(conn: &mut Conn) -> bool {
    let k: &[u8] = b"bench:shared-probe";
    let t = token(usize::MAX);
    let mut buf = Vec::new();
    acquire_shared(&mut buf, k, &t, b"60000", b"2");
    encode(&mut buf, &[b"DEL", k]);
    conn.send(&buf)
        .unwrap_or_else(|e| panic!("shared probe: cannot send: {e}"));
    let granted = conn
        .read()
        .unwrap_or_else(|e| panic!("shared probe: cannot read: {e}"))
        .is_grant();
    conn.read()
        .unwrap_or_else(|e| panic!("shared probe: cannot read: {e}"));
    granted
}

/// Where the commands of one step among `size` holds per key go (the shared benches).
/// `keys` keys hold `size - per_key` holds before the steps start; the acquire step adds
/// `per_key` holds to each (the key's holds go from `0.9 × size` to `size`), the renew
/// step renews `per_key` holds of each spread evenly over all its holds, old and new, and
/// the release step releases `per_key` others, also spread evenly (back to `0.9 × size`).
/// With one hold, each key has only the hold measured: the acquire creates the key and
/// the release deletes it. Calls go round the keys.
pub struct Layout {
    pub size: usize,
    pub per_key: usize,
    pub keys: usize,
    prefix: String,
}

impl Layout {
    /// About `calls` commands per step.
    pub fn new(prefix: &str, size: usize, calls: usize) -> Layout {
        let per_key = (size / 10).max(1);
        Layout {
            size,
            per_key,
            keys: calls.div_ceil(per_key).max(1),
            prefix: format!("{prefix}{size}"),
        }
    }

    /// Commands per step.
    pub fn calls(&self) -> usize {
        self.keys * self.per_key
    }

    /// Holds on each key before the acquire step.
    pub fn filler(&self) -> usize {
        self.size - self.per_key
    }

    fn stride(&self) -> usize {
        self.size / self.per_key
    }

    pub fn key(&self, k: usize) -> Vec<u8> {
        key(&self.prefix, k)
    }

    pub fn token(&self, k: usize, hold: usize) -> [u8; 32] {
        token((1 << 40) + k * self.size + hold)
    }

    /// (key, hold) of call `i` of the fill.
    pub fn filled(&self, i: usize) -> (usize, usize) {
        (i % self.keys, i / self.keys)
    }

    /// (key, hold) of call `i` of the acquire step.
    pub fn acquired(&self, i: usize) -> (usize, usize) {
        (i % self.keys, self.filler() + i / self.keys)
    }

    /// (key, hold) of call `i` of the renew step.
    pub fn renewed(&self, i: usize) -> (usize, usize) {
        (i % self.keys, (i / self.keys) * self.stride())
    }

    /// (key, hold) of call `i` of the release step.
    pub fn released(&self, i: usize) -> (usize, usize) {
        (
            i % self.keys,
            (i / self.keys) * self.stride() + self.stride() / 2,
        )
    }
}

// Sessions (issue 17): holds bound to a session, which one RENEW keeps alive.

/// `LEASE.ACQUIRE key ttl TOKEN token SESSION session session-token`.
pub fn acquire_bound(buf: &mut Vec<u8>, k: &[u8], t: &[u8], ttl: &[u8], session: &[u8], st: &[u8]) {
    encode(
        buf,
        &[
            b"LEASE.ACQUIRE",
            k,
            ttl,
            b"TOKEN",
            t,
            b"SESSION",
            session,
            st,
        ],
    );
}

/// Whether the server's module takes `SESSION` (issue 17): a session and one hold bound
/// to it with ttl 0, deleted again. Before issue 17 the option is an unknown argument.
pub fn supports_sessions(conn: &mut Conn) -> bool {
    let (s, k): (&[u8], &[u8]) = (b"bench:session-probe", b"bench:bound-probe");
    let (st, t) = (token(usize::MAX - 1), token(usize::MAX - 2));
    let mut buf = Vec::new();
    acquire(&mut buf, s, &st, b"60000");
    acquire_bound(&mut buf, k, &t, b"0", s, &st);
    encode(&mut buf, &[b"DEL", k, s]);
    conn.send(&buf)
        .unwrap_or_else(|e| panic!("session probe: cannot send: {e}"));
    let mut read = || {
        conn.read()
            .unwrap_or_else(|e| panic!("session probe: cannot read: {e}"))
    };
    let session = read().is_grant();
    let bound = read().is_grant();
    read();
    session && bound
}
