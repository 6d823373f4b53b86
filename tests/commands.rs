//! Black-box tests of the LEASE commands on each real server: every reply and error of
//! the contract (and that a refused call changes nothing), fencing, transactions and
//! scripts, key specs and command flags, ACLs, keyspace notifications, configs, the
//! allkeys-eviction refusal, the INFO counters and the reaper.

#[macro_use]
extern crate harness;

use std::time::{Duration, Instant};

use harness::calls::{
    acquire, acquire_new, cmd as c, config_get, config_set, describe, exists, fenced, get,
    key_type, login, pttl, release, renew, send, stale, take, take_many, NONE,
};
use harness::errors::{
    forbidden, BLOCK_ERR, FENCE_ERR, NESTED_ERR, RESOURCE_ERR, SYNTAX_ERR, TOKEN_ERR, TTL_ERR,
    UNKNOWN_INNER_ERR,
};
use harness::lease::{lease_info, lease_stat, parse_info};
use harness::reply::{assert_ok, error_text, expect_error, grant, int, strings, text, FENCE_LIMIT};
use harness::{info_number, now_ms, wait_until, Flavor, Server, ServerOptions};
use redis::{Connection, Value};

const MINUTE: u64 = 60_000;
/// Long enough for anything a test waits on, short enough to fail fast.
const WAIT: Duration = Duration::from_secs(10);

const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
const APPLY_ERR: &str =
    "ERR LEASE.APPLY only replays effects from a master or the AOF; clients cannot call it";
const EVICTION_ERR_PREFIX: &str = "ERR lease refused: maxmemory-policy";

fn arity(command: &str) -> String {
    format!("ERR wrong number of arguments for '{command}' command")
}

// ---------------------------------------------------------------------------------------
// Sending commands and reading replies
// ---------------------------------------------------------------------------------------

/// A command written as one line of words; `''` stands for an empty argument and
/// `<257-bytes>` for a token one byte over the limit.
fn line(text: &str) -> redis::Cmd {
    let mut cmd = redis::Cmd::new();
    for word in text.split_whitespace() {
        match word {
            "''" => cmd.arg(""),
            "<257-bytes>" => cmd.arg("x".repeat(257)),
            word => cmd.arg(word),
        };
    }
    cmd
}

// ---------------------------------------------------------------------------------------
// LEASE commands
// ---------------------------------------------------------------------------------------

/// Waits until the lease on `key` is no longer held (free, or already reaped).
fn wait_not_held(con: &mut Connection, key: &str) {
    wait_until(&format!("the lease on {key} to expire"), WAIT, || {
        lease_info(con, key).map_or(true, |i| i.state == "free")
    });
}

fn dbsize(con: &mut Connection) -> i64 {
    int(q!(con, "DBSIZE"), "DBSIZE")
}

// ---------------------------------------------------------------------------------------
// "Nothing changed"
// ---------------------------------------------------------------------------------------

/// What a refused command must leave as it was: the number of keys, the digest of the
/// whole dataset, and what LEASE.INFO says of some keys (the ttl left out: it counts down).
#[derive(Debug, PartialEq, Eq)]
struct Snapshot {
    dbsize: i64,
    digest: String,
    leases: Vec<(String, String)>,
}

fn snapshot(con: &mut Connection, keys: &[&str]) -> Snapshot {
    let dbsize = dbsize(con);
    let digest = text(q!(con, "DEBUG", "DIGEST"), "DEBUG DIGEST");
    let leases = keys
        .iter()
        .map(|key| {
            let reply = q!(con, "LEASE.INFO", *key);
            let shown = match error_text(&reply) {
                Some(e) => e,
                None => match parse_info(reply, "LEASE.INFO") {
                    None => "nil".to_string(),
                    Some(i) => format!("{} fence={} waiters={}", i.state, i.fence, i.waiters),
                },
            };
            (key.to_string(), shown)
        })
        .collect();
    Snapshot {
        dbsize,
        digest,
        leases,
    }
}

/// Runs `cmd`, asserts its error reply passes `check`, and that nothing changed.
fn assert_refused_with(
    con: &mut Connection,
    watched: &[&str],
    cmd: &redis::Cmd,
    expected: &str,
    check: impl Fn(&str) -> bool,
) {
    let before = snapshot(con, watched);
    let reply = send(con, cmd);
    let what = describe(cmd);
    let error = expect_error(&reply, &what);
    assert!(
        check(&error),
        "`{what}`: expected {expected}, got {error:?}"
    );
    let after = snapshot(con, watched);
    assert_eq!(
        before, after,
        "`{what}` was refused but changed the dataset"
    );
}

/// Runs `cmd`, asserts it fails with exactly `expected`, and that nothing changed.
fn assert_refused(con: &mut Connection, watched: &[&str], cmd: &redis::Cmd, expected: &str) {
    assert_refused_with(con, watched, cmd, &format!("{expected:?}"), |e| {
        e == expected
    });
}

// ---------------------------------------------------------------------------------------
// ACQUIRE
// ---------------------------------------------------------------------------------------

for_each_server!(acquire_grants_generated_and_chosen_tokens, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();

    let before_ms = now_ms();
    let (token, fence) = acquire_new(&mut con, "gen", MINUTE).expect("a free key is granted");
    assert_eq!(token.len(), 32, "generated token {token:?}");
    assert!(
        token
            .iter()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b)),
        "generated token is not lowercase hex: {:?}",
        String::from_utf8_lossy(&token)
    );
    assert!(fence > 0 && fence < FENCE_LIMIT, "fence {fence}");
    assert!(
        fence >= before_ms * 1024,
        "fence {fence} is below unix_ms * 1024 ({})",
        before_ms * 1024
    );

    // The generated token is the capability: it renews and releases.
    assert_eq!(renew(&mut con, "gen", &token, MINUTE), 1);
    let (other, _) = acquire_new(&mut con, "gen2", MINUTE).expect("granted");
    assert_ne!(other, token, "two generated tokens must differ");

    let chosen = take(&mut con, "chosen", MINUTE, "my-token");
    assert!(chosen > fence);
    let i = lease_info(&mut con, "chosen").expect("a held lease has info");
    assert_eq!(i.state, "held");
    assert_eq!(i.fence, chosen);
    assert_eq!(i.waiters, 0);
    assert!(i.ttl > 0 && i.ttl <= MINUTE as i64, "ttl {}", i.ttl);

    // Option names are case-insensitive, in any order.
    let reply = q!(
        &mut con,
        "LEASE.ACQUIRE",
        "ci",
        1000,
        "token",
        "t1",
        "block",
        10
    );
    let (t, _) = grant(reply, "lower-case options").expect("granted");
    assert_eq!(t, b"t1");
    let reply = q!(
        &mut con,
        "LEASE.ACQUIRE",
        "ci2",
        1000,
        "BLOCK",
        10,
        "ToKeN",
        "t2"
    );
    let (t, _) = grant(reply, "BLOCK before TOKEN").expect("granted");
    assert_eq!(t, b"t2");

    // The ttl range ends are accepted.
    take(&mut con, "ttl-min", 1, "x");
    take(&mut con, "ttl-max", 1_099_511_627_776, "x");
    let i = lease_info(&mut con, "ttl-max").expect("info");
    assert!(i.ttl > 1_099_511_000_000, "ttl {}", i.ttl);

    // A lease key has no Redis TTL and its own type.
    assert_eq!(pttl(&mut con, "chosen"), -1);
    assert_eq!(key_type(&mut con, "chosen"), "lease-key");
});

for_each_server!(acquire_retry_keeps_fence_and_resets_ttl, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();

    let fence = take(&mut con, "k", 2_000, "a");
    let i = lease_info(&mut con, "k").expect("info");
    assert!(i.ttl <= 2_000, "ttl {}", i.ttl);

    // The same token again: same token and fence, deadline now + the new ttl.
    assert_eq!(acquire(&mut con, "k", MINUTE, "a"), Some(fence));
    let i = lease_info(&mut con, "k").expect("info");
    assert_eq!(i.fence, fence);
    assert!(
        i.ttl > 50_000 && i.ttl <= MINUTE as i64,
        "ttl after retry {}",
        i.ttl
    );

    // A retry with a shorter ttl moves the deadline down: it is now + ttl, not a max.
    assert_eq!(acquire(&mut con, "k", 1_000, "a"), Some(fence));
    let i = lease_info(&mut con, "k").expect("info");
    assert_eq!(i.fence, fence);
    assert!(i.ttl <= 1_000, "ttl after a shorter retry {}", i.ttl);
    assert_eq!(lease_stat(&server, "grants"), 1);
    assert_eq!(lease_stat(&server, "retries"), 2);

    // Once expired the same token is not a retry: it gets a new grant and a new fence.
    let old = take(&mut con, "short", 20, "a");
    wait_not_held(&mut con, "short");
    let new = take(&mut con, "short", MINUTE, "a");
    assert!(new > old, "a grant after expiry must carry a new fence");
    assert_eq!(lease_stat(&server, "grants"), 3);
    assert_eq!(lease_stat(&server, "retries"), 2);
});

for_each_server!(acquire_of_a_held_key_is_nil_and_changes_nothing, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();

    let fence = take(&mut con, "k", MINUTE, "a");
    let before = snapshot(&mut con, &["k"]);
    assert_eq!(acquire(&mut con, "k", MINUTE, "b"), None);
    assert_eq!(acquire_new(&mut con, "k", MINUTE), None);
    // Tokens are compared as bytes: case matters.
    assert_eq!(acquire(&mut con, "k", MINUTE, "A"), None);
    assert_eq!(snapshot(&mut con, &["k"]), before);
    assert_eq!(lease_info(&mut con, "k").expect("info").fence, fence);
    // The holder still renews.
    assert_eq!(renew(&mut con, "k", "a", MINUTE), 1);
});

// ---------------------------------------------------------------------------------------
// RENEW and RELEASE
// ---------------------------------------------------------------------------------------

for_each_server!(renew_only_extends_a_live_lease_of_its_token, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();

    // Live holder: 1, deadline now + ttl (down as well as up).
    let fence = take(&mut con, "k", 2_000, "a");
    assert_eq!(renew(&mut con, "k", "a", MINUTE), 1);
    let i = lease_info(&mut con, "k").expect("info");
    assert!(i.ttl > 50_000, "ttl after renew {}", i.ttl);
    assert_eq!(i.fence, fence, "renew keeps the fence");
    assert_eq!(renew(&mut con, "k", "a", 1_000), 1);
    assert!(lease_info(&mut con, "k").expect("info").ttl <= 1_000);

    // Another token: 0, nothing changes.
    let before = snapshot(&mut con, &["k"]);
    assert_eq!(renew(&mut con, "k", "b", MINUTE), 0);
    assert_eq!(renew(&mut con, "k", "aa", MINUTE), 0);
    assert_eq!(snapshot(&mut con, &["k"]), before);

    // Missing key: 0, and no key is created.
    assert_eq!(renew(&mut con, "missing", "a", MINUTE), 0);
    assert!(!exists(&mut con, "missing"));

    // Released: 0.
    take(&mut con, "rel", MINUTE, "a");
    assert_eq!(release(&mut con, "rel", "a"), 1);
    assert_eq!(renew(&mut con, "rel", "a", MINUTE), 0);
    assert!(!exists(&mut con, "rel"));

    // Expired: 0, and never revived: another token takes it at once.
    let old = take(&mut con, "exp", 30, "a");
    wait_not_held(&mut con, "exp");
    assert_eq!(renew(&mut con, "exp", "a", MINUTE), 0);
    assert!(
        lease_info(&mut con, "exp").map_or(true, |i| i.state == "free"),
        "a rejected renew must not revive the lease"
    );
    let new = take(&mut con, "exp", MINUTE, "b");
    assert!(new > old);
    assert_eq!(renew(&mut con, "exp", "a", MINUTE), 0);
    assert_eq!(renew(&mut con, "exp", "b", MINUTE), 1);
});

for_each_server!(release_deletes_only_the_holders_live_lease, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();

    // Another token: 0, the lease is untouched.
    take(&mut con, "k", MINUTE, "a");
    let before = snapshot(&mut con, &["k"]);
    assert_eq!(release(&mut con, "k", "b"), 0);
    assert_eq!(release(&mut con, "k", "A"), 0);
    assert_eq!(snapshot(&mut con, &["k"]), before);

    // The holder: 1, and the key is gone.
    assert_eq!(release(&mut con, "k", "a"), 1);
    assert!(!exists(&mut con, "k"));
    assert_eq!(lease_info(&mut con, "k"), None);
    // Twice: 0.
    assert_eq!(release(&mut con, "k", "a"), 0);

    // Missing key: 0, nothing created.
    assert_eq!(release(&mut con, "missing", "a"), 0);
    assert!(!exists(&mut con, "missing"));

    // Whatever the holder's token looks like (here the placeholder servers show for
    // redacted arguments), another token never releases or renews it.
    take(&mut con, "odd", MINUTE, "(redacted)");
    assert_eq!(release(&mut con, "odd", "someone-else"), 0);
    assert_eq!(renew(&mut con, "odd", "someone-else", MINUTE), 0);
    assert!(exists(&mut con, "odd"));
    assert_eq!(release(&mut con, "odd", "(redacted)"), 1);

    // Expired: 0.
    take(&mut con, "exp", 30, "a");
    wait_not_held(&mut con, "exp");
    assert_eq!(release(&mut con, "exp", "a"), 0);
    assert!(lease_info(&mut con, "exp").map_or(true, |i| i.state == "free"));
});

// ---------------------------------------------------------------------------------------
// INFO
// ---------------------------------------------------------------------------------------

for_each_server!(
    info_replies_over_resp2_and_resp3_without_the_token,
    |flavor| {
        let server = Server::start(flavor);
        let mut con2 = server.client();
        let mut con3 = server.client_resp3();

        assert_eq!(q!(&mut con2, "LEASE.INFO", "missing"), Value::Nil);
        assert_eq!(q!(&mut con3, "LEASE.INFO", "missing"), Value::Nil);

        let token = b"secret-token-123";
        let fence = take(&mut con2, "k", MINUTE, token);

        let resp2 = q!(&mut con2, "LEASE.INFO", "k");
        let Value::Array(items) = &resp2 else {
            panic!("RESP2 LEASE.INFO must be a flat array, got {resp2:?}");
        };
        assert!(
            !items
                .iter()
                .any(|v| matches!(v, Value::BulkString(b) if b == token)),
            "LEASE.INFO revealed the token: {resp2:?}"
        );
        let i2 = parse_info(resp2, "RESP2 LEASE.INFO").expect("info");

        let resp3 = q!(&mut con3, "LEASE.INFO", "k");
        let Value::Map(pairs) = &resp3 else {
            panic!("RESP3 LEASE.INFO must be a map, got {resp3:?}");
        };
        assert!(
            !pairs
                .iter()
                .any(|(_, v)| matches!(v, Value::BulkString(b) if b == token)),
            "LEASE.INFO revealed the token: {resp3:?}"
        );
        let i3 = parse_info(resp3, "RESP3 LEASE.INFO").expect("info");

        for i in [&i2, &i3] {
            assert_eq!(i.state, "held");
            assert_eq!(i.fence, fence);
            assert_eq!(i.waiters, 0);
            assert!(i.ttl > 0 && i.ttl <= MINUTE as i64, "ttl {}", i.ttl);
        }
        assert_eq!(i2.fields, i3.fields);
    }
);

for_each_server!(
    info_shows_an_expired_lease_free_before_it_is_reaped,
    |flavor| {
        // One reaper tick a second: an expired lease stays in the keyspace until the next tick.
        let server = Server::start_with(flavor, ServerOptions::new().config("lease.reap-hz", "1"));
        let mut con = server.client();
        assert_eq!(config_get(&mut con, "lease.reap-hz"), "1");

        // The reaper may tick right between the expiry and the look; then try again.
        for attempt in 0..3 {
            let key = format!("k{attempt}");
            let fence = take(&mut con, &key, 20, "a");
            let deadline = Instant::now() + WAIT;
            let seen = loop {
                match lease_info(&mut con, &key) {
                    Some(i) if i.state == "held" => {}
                    other => break other,
                }
                assert!(Instant::now() < deadline, "{key} stayed held");
                std::thread::sleep(Duration::from_millis(1));
            };
            if let Some(i) = seen {
                assert_eq!(i.state, "free", "{i:?}");
                assert_eq!(i.ttl, -1);
                assert_eq!(i.fence, fence, "a free lease still shows its last fence");
                assert_eq!(i.waiters, 0);
                assert!(
                    exists(&mut con, &key),
                    "free before reaping: the key is there"
                );
                return;
            }
        }
        panic!("the reaper took each expired lease before LEASE.INFO could see it free");
    }
);

// ---------------------------------------------------------------------------------------
// FENCE
// ---------------------------------------------------------------------------------------

for_each_server!(fence_records_the_highest_and_refuses_older, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();

    // No command: the reply is the fence itself.
    assert_eq!(fenced(&mut con, "res", 5, NONE), Value::Int(5));
    assert_eq!(key_type(&mut con, "res"), "fence-rec");
    assert_eq!(pttl(&mut con, "res"), -1);
    // Equal: accepted again.
    assert_eq!(fenced(&mut con, "res", 5, NONE), Value::Int(5));
    // Lower: STALE, exactly, and nothing changes.
    let before = snapshot(&mut con, &[]);
    let reply = fenced(&mut con, "res", 4, NONE);
    assert_eq!(expect_error(&reply, "FENCE res 4"), stale(4, 5));
    let reply = fenced(&mut con, "res", 0, &["SET", "data", "x"]);
    assert_eq!(expect_error(&reply, "FENCE res 0 SET"), stale(0, 5));
    assert_eq!(snapshot(&mut con, &[]), before);
    assert_eq!(get(&mut con, "data"), None, "a stale fence runs nothing");
    // Higher: accepted and recorded.
    assert_eq!(fenced(&mut con, "res", 9, NONE), Value::Int(9));
    let reply = fenced(&mut con, "res", 8, NONE);
    assert_eq!(expect_error(&reply, "FENCE res 8"), stale(8, 9));
    // The range ends.
    assert_eq!(fenced(&mut con, "zero", 0, NONE), Value::Int(0));
    assert_eq!(
        fenced(&mut con, "top", FENCE_LIMIT - 1, NONE),
        Value::Int(FENCE_LIMIT as i64 - 1)
    );
    // Resources are independent.
    assert_eq!(fenced(&mut con, "other", 1, NONE), Value::Int(1));
});

for_each_server!(
    fence_runs_the_inner_command_and_returns_its_reply,
    |flavor| {
        let server = Server::start(flavor);
        let mut con = server.client();
        let mut con3 = server.client_resp3();

        assert_ok(
            fenced(&mut con, "res", 10, &["SET", "data", "v1"]),
            "FENCE SET",
        );
        assert_eq!(get(&mut con, "data").as_deref(), Some("v1"));
        assert_eq!(
            fenced(&mut con, "res", 10, &["HSET", "h", "f1", "a", "f2", "b"]),
            Value::Int(2)
        );
        assert_eq!(fenced(&mut con, "res", 11, &["INCR", "n"]), Value::Int(1));
        assert_eq!(fenced(&mut con, "res", 11, &["INCR", "n"]), Value::Int(2));
        assert_eq!(
            fenced(&mut con, "res", 11, &["GET", "data"]),
            Value::BulkString(b"v1".to_vec())
        );
        assert_eq!(fenced(&mut con, "res", 11, &["GET", "nothing"]), Value::Nil);
        // The inner reply keeps the caller's protocol.
        let reply = fenced(&mut con3, "res", 11, &["HGETALL", "h"]);
        assert!(
            matches!(reply, Value::Map(ref m) if m.len() == 2),
            "RESP3 HGETALL: {reply:?}"
        );
        // A stale fence with a command: STALE, the command does not run.
        let reply = fenced(&mut con, "res", 10, &["SET", "data", "old"]);
        assert_eq!(expect_error(&reply, "stale FENCE SET"), stale(10, 11));
        assert_eq!(get(&mut con, "data").as_deref(), Some("v1"));

        // The inner command fails: its error is the reply and the fence is not recorded.
        assert_ok(q!(&mut con, "SET", "text", "not-a-number"), "SET");
        let reply = fenced(&mut con, "res", 20, &["INCR", "text"]);
        assert_eq!(
            expect_error(&reply, "FENCE INCR text"),
            "ERR value is not an integer or out of range"
        );
        let reply = fenced(&mut con, "res", 21, &["HSET", "text", "f", "v"]);
        assert_eq!(expect_error(&reply, "FENCE HSET text"), WRONGTYPE);
        // 12 is still accepted: 20 and 21 were not recorded.
        assert_eq!(fenced(&mut con, "res", 12, NONE), Value::Int(12));
        // On a new resource a failed inner command creates no record at all.
        let reply = fenced(&mut con, "fresh", 7, &["INCR", "text"]);
        assert!(error_text(&reply).is_some(), "{reply:?}");
        assert!(!exists(&mut con, "fresh"));
        assert_eq!(fenced(&mut con, "fresh", 1, NONE), Value::Int(1));
    }
);

// ---------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------

for_each_server!(argument_errors_change_nothing, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    take(&mut con, "k", MINUTE, "a");
    assert_eq!(fenced(&mut con, "res", 5, NONE), Value::Int(5));

    let cases: &[(&str, &str)] = &[
        // Arity.
        ("LEASE.ACQUIRE", "lease.acquire"),
        ("LEASE.ACQUIRE new", "lease.acquire"),
        ("LEASE.RENEW k a", "lease.renew"),
        ("LEASE.RENEW k a 1000 x", "lease.renew"),
        ("LEASE.RELEASE k", "lease.release"),
        ("LEASE.RELEASE k a x", "lease.release"),
        ("LEASE.INFO", "lease.info"),
        ("LEASE.INFO k x", "lease.info"),
        ("LEASE.FENCE res", "lease.fence"),
    ];
    for (cmd, name) in cases {
        assert_refused(&mut con, &["k", "new"], &line(cmd), &arity(name));
    }

    let cases: &[(&str, &str)] = &[
        // ttl: not an integer, zero, negative, over 2^40.
        ("LEASE.ACQUIRE new 0", TTL_ERR),
        ("LEASE.ACQUIRE new -1", TTL_ERR),
        ("LEASE.ACQUIRE new abc", TTL_ERR),
        ("LEASE.ACQUIRE new 1.5", TTL_ERR),
        ("LEASE.ACQUIRE new ''", TTL_ERR),
        ("LEASE.ACQUIRE new 1099511627777", TTL_ERR),
        ("LEASE.ACQUIRE new 99999999999999999999999", TTL_ERR),
        ("LEASE.ACQUIRE k 0 TOKEN a", TTL_ERR),
        ("LEASE.RENEW k a 0", TTL_ERR),
        ("LEASE.RENEW k a -5", TTL_ERR),
        ("LEASE.RENEW k a ten", TTL_ERR),
        ("LEASE.RENEW k a 1099511627777", TTL_ERR),
        // token: empty, 257 bytes.
        ("LEASE.ACQUIRE new 1000 TOKEN ''", TOKEN_ERR),
        ("LEASE.ACQUIRE new 1000 TOKEN <257-bytes>", TOKEN_ERR),
        ("LEASE.ACQUIRE k 1000 TOKEN ''", TOKEN_ERR),
        ("LEASE.RENEW k '' 1000", TOKEN_ERR),
        ("LEASE.RENEW k <257-bytes> 1000", TOKEN_ERR),
        ("LEASE.RELEASE k ''", TOKEN_ERR),
        ("LEASE.RELEASE k <257-bytes>", TOKEN_ERR),
        // Unknown, dangling and repeated options.
        ("LEASE.ACQUIRE new 1000 FOO bar", SYNTAX_ERR),
        ("LEASE.ACQUIRE new 1000 NX 1", SYNTAX_ERR),
        ("LEASE.ACQUIRE new 1000 TOKEN", SYNTAX_ERR),
        ("LEASE.ACQUIRE new 1000 BLOCK", SYNTAX_ERR),
        ("LEASE.ACQUIRE new 1000 TOKEN a extra", SYNTAX_ERR),
        ("LEASE.ACQUIRE new 1000 TOKEN a TOKEN b", SYNTAX_ERR),
        ("LEASE.ACQUIRE new 1000 token a TOKEN a", SYNTAX_ERR),
        ("LEASE.ACQUIRE new 1000 BLOCK 1 BLOCK 1", SYNTAX_ERR),
        ("LEASE.ACQUIRE new 1000 BLOCK 1 TOKEN a block 2", SYNTAX_ERR),
        // BLOCK timeout: negative, not an integer, over 2^40.
        ("LEASE.ACQUIRE new 1000 BLOCK -1", BLOCK_ERR),
        ("LEASE.ACQUIRE new 1000 BLOCK soon", BLOCK_ERR),
        ("LEASE.ACQUIRE new 1000 BLOCK 0.5", BLOCK_ERR),
        ("LEASE.ACQUIRE new 1000 BLOCK 1099511627777", BLOCK_ERR),
        ("LEASE.ACQUIRE k 1000 TOKEN b BLOCK -1", BLOCK_ERR),
        // fence: negative, not an integer, 2^53 and beyond.
        ("LEASE.FENCE res -1", FENCE_ERR),
        ("LEASE.FENCE res abc", FENCE_ERR),
        ("LEASE.FENCE res 6.5", FENCE_ERR),
        ("LEASE.FENCE res ''", FENCE_ERR),
        ("LEASE.FENCE res 9007199254740992", FENCE_ERR),
        ("LEASE.FENCE res 18446744073709551616", FENCE_ERR),
        ("LEASE.FENCE new -1 SET new v", FENCE_ERR),
        ("LEASE.FENCE res 9007199254740992 SET new v", FENCE_ERR),
    ];
    for (cmd, expected) in cases {
        assert_refused(&mut con, &["k", "new"], &line(cmd), expected);
    }
    // The lease and the record are as they were.
    assert_eq!(renew(&mut con, "k", "a", MINUTE), 1);
    let reply = fenced(&mut con, "res", 4, NONE);
    assert_eq!(expect_error(&reply, "FENCE res 4"), stale(4, 5));
});

for_each_server!(wrong_type_errors_both_ways_change_nothing, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    assert_ok(q!(&mut con, "SET", "str", "v"), "SET");
    take(&mut con, "lease", MINUTE, "a");
    assert_eq!(fenced(&mut con, "res", 5, NONE), Value::Int(5));

    // A string, and a resource record, where a lease is expected.
    for key in ["str", "res"] {
        for cmd in [
            "LEASE.ACQUIRE {} 1000",
            "LEASE.ACQUIRE {} 1000 TOKEN a",
            "LEASE.ACQUIRE {} 1000 TOKEN a BLOCK 10",
            "LEASE.RENEW {} a 1000",
            "LEASE.RELEASE {} a",
            "LEASE.INFO {}",
        ] {
            let cmd = line(&cmd.replace("{}", key));
            assert_refused(&mut con, &["lease"], &cmd, WRONGTYPE);
        }
    }
    // A string, and a lease, where a resource record is expected.
    for key in ["str", "lease"] {
        for cmd in ["LEASE.FENCE {} 1", "LEASE.FENCE {} 1 SET other v"] {
            let cmd = line(&cmd.replace("{}", key));
            assert_refused(&mut con, &["lease"], &cmd, WRONGTYPE);
        }
    }
    assert_eq!(
        get(&mut con, "other"),
        None,
        "the inner command did not run"
    );
    assert_eq!(key_type(&mut con, "str"), "string");
    assert_eq!(key_type(&mut con, "lease"), "lease-key");
    assert_eq!(key_type(&mut con, "res"), "fence-rec");
});

for_each_server!(
    fence_refuses_forbidden_and_unknown_inner_commands,
    |flavor| {
        let server = Server::start(flavor);
        let mut con = server.client();
        assert_eq!(fenced(&mut con, "res", 5, NONE), Value::Int(5));
        take(&mut con, "lock", MINUTE, "a");
        let watched = ["lock", "nested"];

        let forbidden_cases: &[(&str, &str)] = &[
            ("BLPOP list 1", "BLPOP"),
            ("BLPOP list 0", "BLPOP"),
            ("brpoplpush a b 0", "brpoplpush"),
            ("EVAL return(1) 0", "EVAL"),
            ("EVAL redis.call('SET','x','y') 0", "EVAL"),
            ("MULTI", "MULTI"),
            ("EXEC", "EXEC"),
            ("CONFIG SET maxmemory 1", "CONFIG"),
            ("CONFIG GET save", "CONFIG"),
            ("SUBSCRIBE ch", "SUBSCRIBE"),
            ("DEBUG SLEEP 0", "DEBUG"),
            ("SHUTDOWN NOSAVE", "SHUTDOWN"),
            ("FLUSHALL", "FLUSHALL"),
            ("KEYS *", "KEYS"),
        ];
        for (inner, name) in forbidden_cases {
            let cmd = line(&format!("LEASE.FENCE res 9 {inner}"));
            assert_refused(&mut con, &watched, &cmd, &forbidden(name));
        }
        let other_cases: &[(&str, &str)] = &[
            ("LEASE.ACQUIRE nested 1000", NESTED_ERR),
            ("lease.release lock a", NESTED_ERR),
            ("LEASE.INFO lock", NESTED_ERR),
            ("LEASE.FENCE res 10", NESTED_ERR),
            ("NOSUCHCOMMAND x", UNKNOWN_INNER_ERR),
            ("SET res overwritten", RESOURCE_ERR),
            ("DEL lock res", RESOURCE_ERR),
        ];
        for (inner, expected) in other_cases {
            let cmd = line(&format!("LEASE.FENCE res 9 {inner}"));
            assert_refused(&mut con, &watched, &cmd, expected);
        }
        // CONFIG SET did not run and 9 was never recorded.
        assert_eq!(config_get(&mut con, "maxmemory"), "0");
        assert_eq!(fenced(&mut con, "res", 6, NONE), Value::Int(6));
        assert_eq!(renew(&mut con, "lock", "a", MINUTE), 1);
        // Nothing is recorded for a new resource either.
        let cmd = line("LEASE.FENCE newres 1 BLPOP list 1");
        assert_refused(&mut con, &["newres"], &cmd, &forbidden("BLPOP"));
        assert!(!exists(&mut con, "newres"));
    }
);

for_each_server!(lease_apply_is_refused_to_clients, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    let fence = take(&mut con, "k", MINUTE, "a");
    let forged = fence + 1_000_000;
    let deadline = (now_ms() + 10 * MINUTE).to_string();
    let forged_s = forged.to_string();
    let watched = ["k", "new"];
    for key in ["k", "new"] {
        let cmd = c(&["LEASE.APPLY", key, &forged_s, &deadline, "thief"]);
        if flavor == Flavor::Redis8 {
            // Flagged internal: clients do not even see the command.
            assert_refused_with(&mut con, &watched, &cmd, "unknown command", |e| {
                e.starts_with("ERR unknown command 'LEASE.APPLY'")
                    || e.starts_with("ERR unknown command 'lease.apply'")
            });
        } else {
            assert_refused(&mut con, &watched, &cmd, APPLY_ERR);
        }
    }
    assert_eq!(acquire(&mut con, "k", MINUTE, "thief"), None);
    assert_eq!(release(&mut con, "k", "a"), 1);
});

for_each_server!(binary_tokens_are_tokens, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    let all_bytes: Vec<u8> = (0..=255u8).collect();
    let tokens: Vec<Vec<u8>> = vec![
        b"a\0b".to_vec(),
        b"\0".to_vec(),
        b"line\r\nbreak".to_vec(),
        b"*1\r\n$4\r\nPING\r\n".to_vec(),
        vec![0xff, 0xfe, 0x00, 0x80, 0xc3],
        all_bytes.clone(),
    ];
    assert_eq!(all_bytes.len(), 256, "the longest token allowed");
    for (i, token) in tokens.iter().enumerate() {
        let key = format!("k{i}");
        let fence = take(&mut con, &key, MINUTE, token);
        // A token that differs in one byte, or is a prefix, is another token.
        let mut other = token.clone();
        other[0] ^= 1;
        assert_eq!(acquire(&mut con, &key, MINUTE, &other), None, "{token:?}");
        if token.len() > 1 {
            let prefix = &token[..token.len() - 1];
            assert_eq!(acquire(&mut con, &key, MINUTE, prefix), None, "{token:?}");
            assert_eq!(renew(&mut con, &key, prefix, MINUTE), 0);
        }
        assert_eq!(renew(&mut con, &key, &other, MINUTE), 0);
        assert_eq!(release(&mut con, &key, &other), 0);
        // The token itself: retry, renew, release.
        assert_eq!(acquire(&mut con, &key, MINUTE, token), Some(fence));
        assert_eq!(renew(&mut con, &key, token, MINUTE), 1);
        assert_eq!(release(&mut con, &key, token), 1);
        assert!(!exists(&mut con, &key));
    }
});

// ---------------------------------------------------------------------------------------
// Fencing end to end
// ---------------------------------------------------------------------------------------

for_each_server!(seed_scenario_a_paused_holder_is_fenced_off, |flavor| {
    let server = Server::start(flavor);
    let mut a = server.client();
    let mut b = server.client();

    // A takes a 100 ms lease, then "works" (pauses) past its expiry.
    let fence_a = take(&mut a, "lock", 100, "A");
    wait_not_held(&mut b, "lock");

    // B gets the lease with a higher fence.
    let fence_b = take(&mut b, "lock", MINUTE, "B");
    assert!(fence_b > fence_a, "{fence_b} must be above {fence_a}");

    // A wakes up: its renew and release fail, and B still holds the lease.
    assert_eq!(renew(&mut a, "lock", "A", MINUTE), 0);
    assert_eq!(release(&mut a, "lock", "A"), 0);
    let i = lease_info(&mut a, "lock").expect("B's lease");
    assert_eq!(i.state, "held");
    assert_eq!(i.fence, fence_b);
    assert_eq!(renew(&mut b, "lock", "B", MINUTE), 1);

    // B writes through the fence; A's late write is STALE and does not run.
    assert_ok(
        fenced(&mut b, "fence:res", fence_b, &["SET", "data", "B"]),
        "B's fenced write",
    );
    let reply = fenced(&mut a, "fence:res", fence_a, &["SET", "data", "A"]);
    assert_eq!(
        expect_error(&reply, "A's fenced write"),
        stale(fence_a, fence_b)
    );
    assert_eq!(get(&mut a, "data").as_deref(), Some("B"));
    assert_eq!(release(&mut b, "lock", "B"), 1);
});

for_each_server!(
    fences_strictly_increase_across_release_expiry_del_and_keys,
    |flavor| {
        let server = Server::start(flavor);
        let mut con = server.client();
        let mut fences = Vec::new();

        // Release.
        fences.push(take(&mut con, "k", MINUTE, "a"));
        assert_eq!(release(&mut con, "k", "a"), 1);
        fences.push(take(&mut con, "k", MINUTE, "a"));
        assert_eq!(release(&mut con, "k", "a"), 1);

        // Expiry, possibly before the reaper runs.
        fences.push(take(&mut con, "e", 20, "a"));
        wait_not_held(&mut con, "e");
        fences.push(take(&mut con, "e", MINUTE, "b"));

        // Expiry and reaping: the key is deleted, the next grant is still higher.
        config_set(&mut con, "lease.reap-hz", "100");
        fences.push(take(&mut con, "r", 20, "a"));
        wait_until("the reaper to delete r", WAIT, || !exists(&mut con, "r"));
        fences.push(take(&mut con, "r", MINUTE, "a"));

        // DEL of a held lease.
        fences.push(take(&mut con, "d", MINUTE, "a"));
        assert_eq!(int(q!(&mut con, "DEL", "d"), "DEL"), 1);
        assert_eq!(lease_info(&mut con, "d"), None);
        fences.push(take(&mut con, "d", MINUTE, "a"));

        // Different keys.
        for key in ["x", "y", "z", "k"] {
            fences.push(take(&mut con, key, MINUTE, "a"));
        }
        for pair in fences.windows(2) {
            assert!(
                pair[0] < pair[1],
                "fences not strictly increasing: {fences:?}"
            );
        }
        assert!(*fences.last().unwrap() < FENCE_LIMIT);
        assert_eq!(lease_stat(&server, "fence_last"), *fences.last().unwrap());
    }
);

// ---------------------------------------------------------------------------------------
// Transactions and scripts
// ---------------------------------------------------------------------------------------

for_each_server!(multi_exec_runs_queued_lease_commands, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    take(&mut con, "held", MINUTE, "a");

    assert_ok(q!(&mut con, "MULTI"), "MULTI");
    let queued = [
        c(&["LEASE.ACQUIRE", "m", "60000", "TOKEN", "t"]),
        c(&["LEASE.ACQUIRE", "m", "60000", "TOKEN", "other"]),
        c(&["LEASE.RENEW", "m", "t", "120000"]),
        c(&["LEASE.INFO", "m"]),
        c(&["LEASE.FENCE", "res", "5", "SET", "data", "x"]),
        c(&["LEASE.FENCE", "res", "4"]),
        c(&["LEASE.RELEASE", "m", "other"]),
        c(&["LEASE.RELEASE", "m", "t"]),
        // BLOCK inside MULTI does not block: nil at once.
        c(&["LEASE.ACQUIRE", "held", "1000", "TOKEN", "b", "BLOCK", "0"]),
    ];
    for cmd in &queued {
        assert_eq!(
            send(&mut con, cmd),
            Value::SimpleString("QUEUED".into()),
            "{}",
            describe(cmd)
        );
    }
    // Were BLOCK to block, this read would time out.
    con.set_read_timeout(Some(WAIT)).unwrap();
    let started = Instant::now();
    let reply = q!(&mut con, "EXEC");
    assert!(started.elapsed() < Duration::from_secs(4), "EXEC blocked");
    let Value::Array(replies) = reply else {
        panic!("EXEC: {reply:?}");
    };
    assert_eq!(replies.len(), queued.len(), "{replies:?}");
    let mut r = replies.into_iter();
    let (token, fence) = grant(r.next().unwrap(), "queued ACQUIRE").expect("granted");
    assert_eq!(token, b"t");
    assert_eq!(r.next().unwrap(), Value::Nil, "queued contended ACQUIRE");
    assert_eq!(r.next().unwrap(), Value::Int(1), "queued RENEW");
    let i = parse_info(r.next().unwrap(), "queued INFO").expect("info");
    assert_eq!((i.state.as_str(), i.fence), ("held", fence));
    assert!(
        i.ttl > MINUTE as i64,
        "queued INFO saw the renewed ttl: {}",
        i.ttl
    );
    assert_ok(r.next().unwrap(), "queued FENCE SET");
    assert_eq!(
        error_text(&r.next().unwrap()).as_deref(),
        Some(stale(4, 5).as_str()),
        "queued stale FENCE"
    );
    assert_eq!(
        r.next().unwrap(),
        Value::Int(0),
        "queued RELEASE by another token"
    );
    assert_eq!(r.next().unwrap(), Value::Int(1), "queued RELEASE");
    assert_eq!(
        r.next().unwrap(),
        Value::Nil,
        "queued BLOCK ACQUIRE of a held key"
    );

    assert!(!exists(&mut con, "m"));
    assert_eq!(get(&mut con, "data").as_deref(), Some("x"));
    let held = lease_info(&mut con, "held").expect("info");
    assert_eq!(held.waiters, 0, "nobody was left waiting");
    assert_eq!(lease_stat(&server, "waiters"), 0);
});

for_each_server!(scripts_call_lease_commands, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    con.set_read_timeout(Some(WAIT)).unwrap();

    let acquire_script = "return redis.call('LEASE.ACQUIRE', KEYS[1], ARGV[1], 'TOKEN', ARGV[2])";
    let reply = q!(&mut con, "EVAL", acquire_script, 1, "sk", MINUTE, "lua");
    let (token, fence) = grant(reply, "EVAL LEASE.ACQUIRE").expect("granted");
    assert_eq!(token, b"lua");
    let i = lease_info(&mut con, "sk").expect("info");
    assert_eq!((i.state.as_str(), i.fence), ("held", fence));
    // Contended from a script: nil (false in Lua, nil to the client).
    let reply = q!(&mut con, "EVAL", acquire_script, 1, "sk", MINUTE, "other");
    assert_eq!(reply, Value::Nil);

    // BLOCK inside a script does not block.
    let block_script =
        "return redis.call('LEASE.ACQUIRE', KEYS[1], 1000, 'TOKEN', 'b', 'BLOCK', 0)";
    let started = Instant::now();
    assert_eq!(q!(&mut con, "EVAL", block_script, 1, "sk"), Value::Nil);
    assert!(started.elapsed() < Duration::from_secs(4), "EVAL blocked");
    assert_eq!(lease_info(&mut con, "sk").expect("info").waiters, 0);

    // LEASE.FENCE from a script: the inner reply comes back.
    let fence_script =
        "return redis.call('LEASE.FENCE', KEYS[1], ARGV[1], 'SET', KEYS[2], ARGV[2])";
    assert_ok(
        q!(&mut con, "EVAL", fence_script, 2, "res", "d", fence, "v1"),
        "EVAL LEASE.FENCE",
    );
    assert_eq!(get(&mut con, "d").as_deref(), Some("v1"));
    let pcall_script =
        "local r = redis.pcall('LEASE.FENCE', KEYS[1], ARGV[1], 'SET', KEYS[2], ARGV[2]) \
                        if type(r) == 'table' and r.err then return 'E:' .. r.err end return r";
    let reply = q!(
        &mut con,
        "EVAL",
        pcall_script,
        2,
        "res",
        "d",
        fence - 1,
        "old"
    );
    let shown = text(reply, "EVAL stale LEASE.FENCE");
    assert!(
        shown.starts_with("E:") && shown.contains(&stale(fence - 1, fence)),
        "{shown}"
    );
    assert_eq!(get(&mut con, "d").as_deref(), Some("v1"));

    // Acquire and fence in one script, with the fence the grant returned.
    let both = "local g = redis.call('LEASE.ACQUIRE', KEYS[1], ARGV[1]) \
                redis.call('LEASE.FENCE', KEYS[2], g[2], 'SET', KEYS[3], 'from-script') \
                return g[2]";
    let f2 = int(
        q!(&mut con, "EVAL", both, 3, "sk2", "res", "d", MINUTE),
        "EVAL both",
    ) as u64;
    assert!(f2 > fence);
    assert_eq!(get(&mut con, "d").as_deref(), Some("from-script"));
    assert_eq!(lease_info(&mut con, "sk2").expect("info").fence, f2);
    assert_eq!(
        expect_error(&fenced(&mut con, "res", fence, NONE), "FENCE"),
        stale(fence, f2)
    );
    // Release from a script.
    let rel = "return redis.call('LEASE.RELEASE', KEYS[1], ARGV[1])";
    assert_eq!(q!(&mut con, "EVAL", rel, 1, "sk", "lua"), Value::Int(1));
    assert!(!exists(&mut con, "sk"));
});

// ---------------------------------------------------------------------------------------
// Key specs and flags
// ---------------------------------------------------------------------------------------

for_each_server!(command_getkeys_and_command_info_flags, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();

    let getkeys = |con: &mut Connection, args: &[&str]| -> Vec<String> {
        let mut cmd = c(&["COMMAND", "GETKEYS"]);
        for a in args {
            cmd.arg(*a);
        }
        strings(send(con, &cmd), &describe(&cmd))
    };
    assert_eq!(getkeys(&mut con, &["LEASE.ACQUIRE", "k", "100"]), ["k"]);
    assert_eq!(
        getkeys(
            &mut con,
            &["LEASE.ACQUIRE", "k", "100", "TOKEN", "t", "BLOCK", "5"]
        ),
        ["k"]
    );
    assert_eq!(getkeys(&mut con, &["LEASE.RENEW", "k", "t", "100"]), ["k"]);
    assert_eq!(getkeys(&mut con, &["LEASE.RELEASE", "k", "t"]), ["k"]);
    assert_eq!(getkeys(&mut con, &["LEASE.INFO", "k"]), ["k"]);
    assert_eq!(getkeys(&mut con, &["LEASE.FENCE", "res", "1"]), ["res"]);
    assert_eq!(
        getkeys(&mut con, &["LEASE.FENCE", "res", "1", "SET", "a", "v"]),
        ["res", "a"]
    );
    assert_eq!(
        getkeys(
            &mut con,
            &["LEASE.FENCE", "res", "1", "MSET", "a", "1", "b", "2"]
        ),
        ["res", "a", "b"]
    );
    assert_eq!(
        getkeys(
            &mut con,
            &["LEASE.FENCE", "res", "1", "HSET", "h", "f", "v"]
        ),
        ["res", "h"]
    );
    assert_eq!(
        getkeys(&mut con, &["LEASE.FENCE", "res", "1", "PING"]),
        ["res"]
    );

    let flags = |con: &mut Connection, name: &str| -> Vec<String> {
        let reply = q!(con, "COMMAND", "INFO", name);
        let Value::Array(entries) = reply else {
            panic!("COMMAND INFO {name}: {reply:?}");
        };
        let Some(Value::Array(entry)) = entries.into_iter().next() else {
            panic!("COMMAND INFO {name}: no entry");
        };
        assert_eq!(
            text(entry[0].clone(), "name").to_ascii_lowercase(),
            name.to_ascii_lowercase()
        );
        strings(entry[2].clone(), "flags")
    };
    let has = |f: &[String], flag: &str| f.iter().any(|x| x == flag);

    let acquire_flags = flags(&mut con, "LEASE.ACQUIRE");
    assert!(
        has(&acquire_flags, "write") && has(&acquire_flags, "denyoom"),
        "{acquire_flags:?}"
    );
    for name in ["LEASE.RENEW", "LEASE.RELEASE"] {
        let f = flags(&mut con, name);
        assert!(has(&f, "write") && has(&f, "fast"), "{name}: {f:?}");
        assert!(
            !has(&f, "denyoom"),
            "{name} must run when memory is full: {f:?}"
        );
    }
    let info_flags = flags(&mut con, "LEASE.INFO");
    assert!(
        has(&info_flags, "readonly") && has(&info_flags, "fast"),
        "{info_flags:?}"
    );
    assert!(!has(&info_flags, "write"), "{info_flags:?}");
    let fence_flags = flags(&mut con, "LEASE.FENCE");
    assert!(
        has(&fence_flags, "write")
            && has(&fence_flags, "denyoom")
            && has(&fence_flags, "movablekeys"),
        "{fence_flags:?}"
    );
});

// ---------------------------------------------------------------------------------------
// ACL
// ---------------------------------------------------------------------------------------

/// Refusals that must be ACL errors: each is an error at once, and all are checked for
/// the NOPERM code at the end of the test, so that one server's wording does not hide
/// the rest of the test.
#[derive(Default)]
struct Denials(Vec<(String, String)>);

impl Denials {
    fn expect(&mut self, reply: &Value, what: &str) {
        let e = expect_error(reply, what);
        self.0.push((what.to_string(), e));
    }

    fn assert_all_noperm(&self) {
        let wrong: Vec<_> = self
            .0
            .iter()
            .filter(|(_, e)| !e.starts_with("NOPERM"))
            .collect();
        assert!(wrong.is_empty(), "expected NOPERM errors, got {wrong:#?}");
    }
}

for_each_server!(fence_inner_command_runs_with_the_callers_acl, |flavor| {
    let server = Server::start(flavor);
    let mut admin = server.client();
    for (user, rules) in [
        ("noset", vec!["+@all", "-set", "~*"]),
        ("scoped", vec!["+@all", "~allowed:*"]),
        ("readonly", vec!["+@all", "%R~ro:*", "~rw:*"]),
    ] {
        let mut cmd = c(&["ACL", "SETUSER", user, "on", ">pw"]);
        for r in rules {
            cmd.arg(r);
        }
        assert_ok(send(&mut admin, &cmd), "ACL SETUSER");
    }
    let mut denials = Denials::default();

    // LEASE.FENCE itself is allowed, the inner SET is not: the inner command runs as
    // the caller, not as a superuser.
    let mut noset = login(&server, "noset");
    let accepted = lease_stat(&server, "fence_accepted");
    denials.expect(&q!(&mut noset, "SET", "k", "v"), "a direct SET as noset");
    let reply = fenced(&mut noset, "res", 1, &["SET", "k", "v"]);
    denials.expect(&reply, "LEASE.FENCE res 1 SET k v as noset");
    assert!(!exists(&mut admin, "k"));
    assert!(!exists(&mut admin, "res"), "the fence must not be recorded");
    assert_eq!(lease_stat(&server, "fence_accepted"), accepted);
    // What the user may run goes through.
    assert_eq!(fenced(&mut noset, "res", 1, &["INCR", "n"]), Value::Int(1));
    assert!(exists(&mut admin, "res"));
    assert_eq!(lease_stat(&server, "fence_accepted"), accepted + 1);

    // Key patterns apply to the resource and to the inner command's keys.
    let mut scoped = login(&server, "scoped");
    let reply = fenced(&mut scoped, "allowed:res", 1, &["SET", "other:k", "v"]);
    denials.expect(&reply, "LEASE.FENCE allowed:res 1 SET other:k v as scoped");
    let reply = fenced(&mut scoped, "other:res", 1, &["SET", "allowed:k", "v"]);
    denials.expect(&reply, "LEASE.FENCE other:res 1 SET allowed:k v as scoped");
    for key in ["other:k", "allowed:k", "allowed:res", "other:res"] {
        assert!(!exists(&mut admin, key), "{key}");
    }
    assert_ok(
        fenced(&mut scoped, "allowed:res", 1, &["SET", "allowed:k", "v"]),
        "FENCE allowed:res SET allowed:k",
    );
    assert_eq!(get(&mut admin, "allowed:k").as_deref(), Some("v"));
    // The lease commands' own keys are ACL-checked too.
    let reply = q!(&mut scoped, "LEASE.ACQUIRE", "other:lock", 1000);
    denials.expect(&reply, "LEASE.ACQUIRE other:lock 1000 as scoped");
    assert!(!exists(&mut admin, "other:lock"));
    assert!(acquire(&mut scoped, "allowed:lock", 1000, "t").is_some());

    // Read-only key permissions: the inner command may read ro:* but not write it.
    assert_ok(q!(&mut admin, "SET", "ro:k", "1"), "SET ro:k");
    let mut readonly = login(&server, "readonly");
    let reply = fenced(&mut readonly, "rw:res", 1, &["GET", "ro:k"]);
    assert_eq!(reply, Value::BulkString(b"1".to_vec()));
    for inner in [&["INCR", "ro:k"][..], &["SET", "ro:k", "2"][..]] {
        let reply = fenced(&mut readonly, "rw:res", 2, inner);
        denials.expect(
            &reply,
            &format!("LEASE.FENCE rw:res 2 {} as readonly", inner.join(" ")),
        );
    }
    let reply = fenced(&mut readonly, "ro:res", 3, &["GET", "ro:k"]);
    denials.expect(&reply, "LEASE.FENCE ro:res 3 GET ro:k as readonly");
    assert_eq!(get(&mut admin, "ro:k").as_deref(), Some("1"));
    assert!(!exists(&mut admin, "ro:res"));
    // 1 is still the highest: 2 was never recorded.
    assert_eq!(fenced(&mut admin, "rw:res", 1, NONE), Value::Int(1));

    denials.assert_all_noperm();
});

// ---------------------------------------------------------------------------------------
// Keyspace notifications
// ---------------------------------------------------------------------------------------

for_each_server!(keyspace_notifications_for_every_lease_event, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    config_set(&mut con, "notify-keyspace-events", "Ed");
    config_set(&mut con, "lease.reap-hz", "100");

    let mut sub = server.client();
    let mut pubsub = sub.as_pubsub();
    pubsub.set_read_timeout(Some(WAIT)).unwrap();
    pubsub.psubscribe("__keyevent@0__:lease.*").unwrap();

    take(&mut con, "nk", MINUTE, "a");
    assert_eq!(renew(&mut con, "nk", "a", MINUTE), 1);
    assert_eq!(fenced(&mut con, "nr", 1, NONE), Value::Int(1));
    assert_eq!(release(&mut con, "nk", "a"), 1);
    // Refused calls notify nothing.
    assert_eq!(release(&mut con, "nk", "a"), 0);
    assert_eq!(renew(&mut con, "nk", "a", MINUTE), 0);
    assert!(acquire(&mut con, "busy", MINUTE, "a").is_some());
    assert_eq!(acquire(&mut con, "busy", MINUTE, "b"), None);
    assert_ok(
        fenced(&mut con, "nr", 2, &["SET", "data", "x"]),
        "FENCE SET",
    );
    // Neither a failed inner command nor a stale fence records, so neither notifies.
    assert_ok(q!(&mut con, "SET", "text", "x"), "SET");
    assert!(error_text(&fenced(&mut con, "nr", 3, &["INCR", "text"])).is_some());
    assert!(error_text(&fenced(&mut con, "nr", 1, NONE)).is_some());
    take(&mut con, "ek", 20, "a");

    let expected = [
        ("lease.acquire", "nk"),
        ("lease.renew", "nk"),
        ("lease.fence", "nr"),
        ("lease.release", "nk"),
        ("lease.acquire", "busy"),
        ("lease.fence", "nr"),
        ("lease.acquire", "ek"),
        ("lease.expire", "ek"),
    ];
    let mut seen = Vec::new();
    for _ in expected {
        let msg = pubsub
            .get_message()
            .unwrap_or_else(|e| panic!("no notification after {seen:?}: {e}"));
        let payload: String = msg.get_payload().unwrap();
        seen.push((msg.get_channel_name().to_string(), payload));
    }
    let expected: Vec<(String, String)> = expected
        .iter()
        .map(|(event, key)| (format!("__keyevent@0__:{event}"), key.to_string()))
        .collect();
    assert_eq!(seen, expected);
});

// ---------------------------------------------------------------------------------------
// Configs
// ---------------------------------------------------------------------------------------

for_each_server!(configs_get_set_and_refuse_out_of_range, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();

    assert_eq!(config_get(&mut con, "lease.reap-hz"), "10");
    assert_eq!(config_get(&mut con, "lease.reap-batch"), "1000");
    assert_eq!(config_get(&mut con, "lease.allkeys-eviction"), "refuse");

    config_set(&mut con, "lease.reap-batch", "500");
    assert_eq!(config_get(&mut con, "lease.reap-batch"), "500");
    config_set(&mut con, "lease.reap-hz", "1000");
    assert_eq!(config_get(&mut con, "lease.reap-hz"), "1000");
    config_set(&mut con, "lease.reap-hz", "1");
    assert_eq!(config_get(&mut con, "lease.reap-hz"), "1");
    config_set(&mut con, "lease.allkeys-eviction", "allow");
    assert_eq!(config_get(&mut con, "lease.allkeys-eviction"), "allow");
    config_set(&mut con, "lease.allkeys-eviction", "refuse");

    for (name, bad) in [
        ("lease.reap-batch", "0"),
        ("lease.reap-batch", "100001"),
        ("lease.reap-batch", "-1"),
        ("lease.reap-batch", "many"),
        ("lease.reap-hz", "0"),
        ("lease.reap-hz", "1001"),
        ("lease.allkeys-eviction", "sometimes"),
    ] {
        let before = config_get(&mut con, name);
        let reply = q!(&mut con, "CONFIG", "SET", name, bad);
        let e = expect_error(&reply, &format!("CONFIG SET {name} {bad}"));
        assert!(e.starts_with("ERR"), "{e}");
        assert_eq!(
            config_get(&mut con, name),
            before,
            "{name} changed by a refused set"
        );
    }
    assert_eq!(config_get(&mut con, "lease.reap-batch"), "500");
});

for_each_server!(configs_given_at_start, |flavor| {
    let as_args = ServerOptions::new()
        .module_arg("reap-hz")
        .module_arg("50")
        .module_arg("reap-batch")
        .module_arg("700");
    let server = Server::start_with(flavor, as_args);
    let mut con = server.client();
    assert_eq!(config_get(&mut con, "lease.reap-hz"), "50");
    assert_eq!(config_get(&mut con, "lease.reap-batch"), "700");
    drop(con);
    drop(server);

    let as_lines = ServerOptions::new()
        .config("lease.reap-hz", "25")
        .config("lease.reap-batch", "300")
        .config("lease.allkeys-eviction", "allow");
    let server = Server::start_with(flavor, as_lines);
    let mut con = server.client();
    assert_eq!(config_get(&mut con, "lease.reap-hz"), "25");
    assert_eq!(config_get(&mut con, "lease.reap-batch"), "300");
    assert_eq!(config_get(&mut con, "lease.allkeys-eviction"), "allow");
    assert_eq!(
        server
            .info_field("lease", "lease_allkeys_eviction")
            .as_deref(),
        Some("allow")
    );
});

for_each_server!(allkeys_eviction_refuse_and_allow, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    config_set(&mut con, "maxmemory", "100mb");

    for policy in ["allkeys-lru", "allkeys-lfu", "allkeys-random"] {
        config_set(&mut con, "maxmemory-policy", policy);
        let refused = lease_stat(&server, "acquires_refused_for_eviction");
        let cmd = c(&["LEASE.ACQUIRE", "lock", "1000", "TOKEN", "a"]);
        assert_refused_with(&mut con, &["lock"], &cmd, EVICTION_ERR_PREFIX, |e| {
            e.starts_with(EVICTION_ERR_PREFIX)
        });
        assert_eq!(
            lease_stat(&server, "acquires_refused_for_eviction"),
            refused + 1,
            "{policy}"
        );
        assert_eq!(
            server
                .info_field("lease", "lease_maxmemory_policy")
                .as_deref(),
            Some(policy)
        );
    }

    // allow: granted anyway.
    config_set(&mut con, "lease.allkeys-eviction", "allow");
    let refused = lease_stat(&server, "acquires_refused_for_eviction");
    take(&mut con, "lock", MINUTE, "a");
    assert_eq!(
        lease_stat(&server, "acquires_refused_for_eviction"),
        refused
    );
    assert_eq!(release(&mut con, "lock", "a"), 1);
    config_set(&mut con, "lease.allkeys-eviction", "refuse");
    assert!(error_text(&q!(&mut con, "LEASE.ACQUIRE", "lock", 1000)).is_some());

    // Policies that never evict a key without a TTL: granted.
    for policy in [
        "noeviction",
        "volatile-lru",
        "volatile-lfu",
        "volatile-random",
        "volatile-ttl",
    ] {
        config_set(&mut con, "maxmemory-policy", policy);
        take(&mut con, policy, MINUTE, "a");
    }
    // allkeys-* without maxmemory: nothing can be evicted, granted.
    config_set(&mut con, "maxmemory-policy", "allkeys-lru");
    config_set(&mut con, "maxmemory", "0");
    take(&mut con, "no-maxmemory", MINUTE, "a");
    assert_eq!(
        lease_stat(&server, "acquires_refused_for_eviction"),
        refused + 1
    );
});

// ---------------------------------------------------------------------------------------
// INFO counters and the reaper
// ---------------------------------------------------------------------------------------

for_each_server!(info_counters_follow_every_outcome, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    config_set(&mut con, "lease.reap-hz", "100");
    let counters = [
        "lease_grants",
        "lease_retries",
        "lease_acquires_contended",
        "lease_renewals",
        "lease_renewals_rejected",
        "lease_releases",
        "lease_releases_rejected",
        "lease_fence_accepted",
        "lease_fence_rejected",
        "lease_expired",
        "lease_keys",
        "lease_resource_keys",
    ];
    for name in counters {
        assert_eq!(
            info_number(&server, "lease", name),
            0,
            "{name} on a fresh server"
        );
    }

    take(&mut con, "k1", MINUTE, "a");
    take(&mut con, "k2", MINUTE, "a");
    assert_eq!(lease_stat(&server, "grants"), 2);
    assert_eq!(lease_stat(&server, "keys"), 2);

    take(&mut con, "k1", MINUTE, "a");
    assert_eq!(lease_stat(&server, "retries"), 1);
    assert_eq!(lease_stat(&server, "grants"), 2, "a retry is not a grant");

    assert_eq!(acquire(&mut con, "k1", MINUTE, "b"), None);
    assert_eq!(lease_stat(&server, "acquires_contended"), 1);

    assert_eq!(renew(&mut con, "k1", "a", MINUTE), 1);
    assert_eq!(renew(&mut con, "k1", "b", MINUTE), 0);
    assert_eq!(renew(&mut con, "missing", "a", MINUTE), 0);
    assert_eq!(lease_stat(&server, "renewals"), 1);
    assert_eq!(lease_stat(&server, "renewals_rejected"), 2);

    assert_eq!(release(&mut con, "k2", "a"), 1);
    assert_eq!(release(&mut con, "k2", "a"), 0);
    assert_eq!(release(&mut con, "k1", "b"), 0);
    assert_eq!(lease_stat(&server, "releases"), 1);
    assert_eq!(lease_stat(&server, "releases_rejected"), 2);
    assert_eq!(lease_stat(&server, "keys"), 1);

    assert_eq!(fenced(&mut con, "res", 5, NONE), Value::Int(5));
    assert_ok(fenced(&mut con, "res", 5, &["SET", "d", "v"]), "FENCE SET");
    assert!(error_text(&fenced(&mut con, "res", 4, NONE)).is_some());
    assert_eq!(lease_stat(&server, "fence_accepted"), 2);
    assert_eq!(lease_stat(&server, "fence_rejected"), 1);
    assert_eq!(lease_stat(&server, "resource_keys"), 1);

    take(&mut con, "e", 20, "a");
    assert_eq!(lease_stat(&server, "keys"), 2);
    wait_until("the reaper to delete e", WAIT, || !exists(&mut con, "e"));
    assert_eq!(lease_stat(&server, "expired"), 1);
    assert_eq!(lease_stat(&server, "keys"), 1);
    assert_eq!(lease_stat(&server, "grants"), 3);

    // DEL of a lease key and of a record drops the gauges.
    assert_eq!(int(q!(&mut con, "DEL", "k1", "res"), "DEL"), 2);
    assert_eq!(lease_stat(&server, "keys"), 0);
    assert_eq!(lease_stat(&server, "resource_keys"), 0);
    assert_eq!(lease_stat(&server, "expired"), 1, "a DEL is not an expiry");
    assert_eq!(lease_stat(&server, "role_primary"), 1);
});

for_each_server!(reaper_deletes_500_expired_leases, |flavor| {
    let server = Server::start_with(flavor, ServerOptions::new().config("lease.reap-hz", "100"));
    let mut con = server.client();

    let mut pipe = redis::pipe();
    for i in 0..500 {
        pipe.cmd("LEASE.ACQUIRE")
            .arg(format!("lease:{i}"))
            .arg(50)
            .arg("TOKEN")
            .arg("t");
    }
    let replies: Vec<Value> = pipe.query(&mut con).expect("500 acquires");
    assert_eq!(replies.len(), 500);
    for r in replies {
        assert!(grant(r, "pipelined ACQUIRE").is_some());
    }
    assert_eq!(lease_stat(&server, "grants"), 500);

    wait_until("the reaper to delete 500 expired leases", WAIT, || {
        dbsize(&mut con) == 0
    });
    assert_eq!(lease_stat(&server, "expired"), 500);
    assert_eq!(lease_stat(&server, "keys"), 0);
    assert_eq!(lease_stat(&server, "indexed_deadlines"), 0);
});

/// `LATENCY LATEST` as (event, max ms).
fn latency_latest(con: &mut Connection) -> Vec<(String, i64)> {
    match q!(con, "LATENCY", "LATEST") {
        Value::Array(events) => events
            .into_iter()
            .map(|e| match e {
                Value::Array(fields) => match fields.as_slice() {
                    [Value::BulkString(name), _, _, Value::Int(max), ..] => {
                        (String::from_utf8_lossy(name).into_owned(), *max)
                    }
                    other => panic!("LATENCY LATEST entry: {other:?}"),
                },
                other => panic!("LATENCY LATEST entry: {other:?}"),
            })
            .collect(),
        other => panic!("LATENCY LATEST: {other:?}"),
    }
}

/// Grants `n` leases of one second, then holds the server past their deadline
/// so the next reaper tick takes them all at once.
fn expire_together(con: &mut Connection, n: usize) {
    take_many(con, "together", n, 1000, "t");
    assert_ok(q!(con, "DEBUG", "SLEEP", "1.2"), "DEBUG SLEEP");
    wait_until("the reaper to delete the leases", WAIT, || dbsize(con) == 0);
}

for_each_server!(
    reaper_ticks_show_in_the_latency_monitor_when_it_is_on,
    |flavor| {
        let options = ServerOptions::new()
            .config("latency-monitor-threshold", "1")
            .config("lease.reap-batch", "100000");
        let server = Server::start_with(flavor, options);
        let mut con = server.client();

        // Threshold read at load: a tick deleting 5,000 keys takes milliseconds.
        expire_together(&mut con, 5_000);
        assert_eq!(lease_stat(&server, "expired"), 5_000);
        let events = latency_latest(&mut con);
        let reap = events.iter().find(|(name, _)| name == "lease-reap");
        assert!(
            reap.is_some_and(|&(_, max)| max >= 1),
            "no lease-reap event: {events:?}"
        );

        // Monitor switched off at run time: the same tick is not recorded.
        config_set(&mut con, "latency-monitor-threshold", "0");
        assert!(int(q!(&mut con, "LATENCY", "RESET"), "LATENCY RESET") >= 1);
        expire_together(&mut con, 5_000);
        assert_eq!(lease_stat(&server, "expired"), 10_000);
        let events = latency_latest(&mut con);
        assert!(
            events.iter().all(|(name, _)| name != "lease-reap"),
            "lease-reap recorded with the monitor off: {events:?}"
        );
    }
);
