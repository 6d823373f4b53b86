//! Eviction under `allkeys-*`: arming it and writing until it happens, for the tests
//! of shared holds and sessions.

use redis::{Connection, Value};

use super::calls::config_set;
use super::reply::error_text;

pub const MAXMEMORY: u64 = 20 * 1024 * 1024;
const FILL_WRITES: usize = 60_000;
const FILL_BATCH: usize = 500;

/// `maxmemory` 20 MB, `allkeys-lru`, and `lease.allkeys-eviction mode`.
pub fn arm(con: &mut Connection, mode: &str) {
    config_set(con, "maxmemory", &MAXMEMORY.to_string());
    config_set(con, "maxmemory-policy", "allkeys-lru");
    config_set(con, "lease.allkeys-eviction", mode);
}

/// Pipelined 1 KB writes, a round of 60,000 at most, until `done` says so (asked after
/// each batch of 500); false if five rounds were not enough.
pub fn fill_until(con: &mut Connection, mut done: impl FnMut(&mut Connection) -> bool) -> bool {
    let value = vec![b'v'; 1024];
    for round in 0..5 {
        for batch in 0..FILL_WRITES / FILL_BATCH {
            let mut pipe = redis::pipe();
            for i in 0..FILL_BATCH {
                pipe.cmd("SET")
                    .arg(format!("cache:{round}:{}", batch * FILL_BATCH + i))
                    .arg(&value[..]);
            }
            let replies: Vec<Value> = pipe
                .query(con)
                .unwrap_or_else(|e| panic!("fill batch {batch}: {e}"));
            for r in &replies {
                if let Some(e) = error_text(r) {
                    panic!("fill batch {batch}: {e}");
                }
            }
            if done(con) {
                return true;
            }
        }
    }
    false
}
