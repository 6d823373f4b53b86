//! Files written by the module's version-1 encoding still load: `tests/fixtures/v1/`
//! holds an RDB (`leases.rdb`) and an AOF directory without RDB preamble (`aof/`), made
//! by Redis 7.0 with the encoding-1 build (how, and what they hold: the README there).
//! Each server of the matrix starts from each of them, and every lease, resource record,
//! plain key and the fence sequence must come back as recorded below, then behave: the
//! recorded tokens renew and release, older fences are STALE, new grants get higher
//! fences, and `DEBUG RELOAD` (a save and load in the current encoding) keeps it all.
//!
//! `LEASE.INFO` is read by field name, so a reply with more fields (version 2 adds six)
//! reads the same.

#[macro_use]
extern crate harness;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use harness::calls::{acquire, call, config_get, digest, fenced, int, release, renew, select};
use harness::calls::{stale, text, NONE};
use harness::lease::lease_stat;
use harness::rdb::module_id;
use harness::reply::{error_text, pairs};
use harness::{now_ms, repo_dir, wait_until, Flavor, Server, ServerOptions};
use redis::{Connection, Value};

// ---------------------------------------------------------------------------
// What the fixtures hold (tests/fixtures/v1/README.md)

/// A 256-byte token: every byte value, 0x00 to 0xff, in order.
const ALL_BYTES: [u8; 256] = {
    let mut bytes = [0u8; 256];
    let mut i = 0;
    while i < 256 {
        bytes[i] = i as u8;
        i += 1;
    }
    bytes
};

/// A lease held when the fixtures were made, until `deadline` (unix ms, about 2056).
struct Held {
    db: i64,
    key: &'static str,
    token: &'static [u8],
    fence: u64,
    deadline: u64,
}

const HELD: [Held; 10] = [
    Held {
        db: 0,
        key: "lease:generated",
        token: b"d8523d4765ae31423dffcfa09c765f5c",
        fence: 1839250623110144,
        deadline: 2742223186631,
    },
    Held {
        db: 0,
        key: "lease:uuid",
        token: b"123e4567-e89b-12d3-a456-426614174000",
        fence: 1839250623126528,
        deadline: 2742223186647,
    },
    Held {
        db: 0,
        key: "lease:short",
        token: b"t1",
        fence: 1839250623142912,
        deadline: 2742223186663,
    },
    Held {
        db: 3,
        key: "lease:db3",
        token: b"db3-token",
        fence: 1839250623173632,
        deadline: 2742223186693,
    },
    Held {
        db: 3,
        key: "lease:short",
        token: b"t3",
        fence: 1839250623181824,
        deadline: 2742223186701,
    },
    Held {
        db: 0,
        key: "lease:long",
        token: b"6b1f0d2e-93a4-4c55-b0e1-3f7d2c9a8b10:worker-17",
        fence: 1839250623309824,
        deadline: 2742223186826,
    },
    Held {
        db: 0,
        key: "lease:upper-uuid",
        token: b"123E4567-E89B-12D3-A456-426614174000",
        fence: 1839250623331328,
        deadline: 2742223186847,
    },
    Held {
        db: 0,
        key: "lease:sixteen",
        token: b"0123456789abcdef",
        fence: 1839250623346688,
        deadline: 2742223186862,
    },
    Held {
        db: 0,
        key: "lease:max",
        token: &ALL_BYTES,
        fence: 1839250623375360,
        deadline: 2742223186890,
    },
    Held {
        db: 0,
        key: "lease:renewed",
        token: b"renew-me",
        fence: 1839250623388672,
        deadline: 2742223186923,
    },
];

/// A lease record that holds no live lease: `lease:waited`, released while a client
/// waited (saved free: deadline 0, no token), and `lease:expired` (ttl 1 ms, saved
/// expired before the reaper saw it). Nobody waits on either after a load: the reaper
/// deletes them. `(key in db 0, its last holder's token, its fence)`.
const FREE: [(&str, &[u8], u64); 2] = [
    ("lease:waited", b"held-then-released", 1839250623425536),
    ("lease:expired", b"gone-soon", 1839250623509504),
];

/// Resource records: `(db, key, highest fence accepted)`.
const RECORDS: [(i64, &str, u64); 3] = [
    (0, "res", 123),
    (0, "res:data", 1839250623309824),
    (3, "res:db3", 1839250623173632),
];

/// Plain string keys in db 0: `data:1` was written through `LEASE.FENCE res:data`.
const STRINGS: [(&str, &str); 2] = [("data:1", "v2"), ("plain", "v")];

/// The fence sequence when the files were written: the fence of `lease:gone`, granted
/// and released last, which no key holds (the RDB's aux field carries it; the AOF's
/// grant effect does).
const SEQUENCE: u64 = 1839250623509505;

fn fixture(path: &str) -> PathBuf {
    repo_dir().join("tests/fixtures/v1").join(path)
}

// ---------------------------------------------------------------------------
// Starting a server from a fixture

/// `flavor` with the module, started once from an empty directory (so the harness has
/// written its config), stopped, and started again on the fixture's RDB.
fn start_from_rdb(flavor: Flavor) -> Server {
    let rdb = fs::read(fixture("leases.rdb")).expect("read tests/fixtures/v1/leases.rdb");
    assert!(
        rdb.starts_with(b"REDIS0010"),
        "leases.rdb is RDB version 10"
    );
    // The values are in encoding 1: the module ids name version 1 of both types.
    for name in ["lease-key", "fence-rec"] {
        let id = module_id(name, 1).to_be_bytes();
        assert!(
            rdb.windows(id.len()).any(|w| w == id),
            "leases.rdb holds no {name} of encoding version 1"
        );
    }
    let mut server = Server::start(flavor);
    server.stop();
    fs::write(server.dir.join("dump.rdb"), &rdb).expect("write dump.rdb");
    server.start_again();
    server
}

/// `flavor` with the module and `appendonly yes`, `appenddirname aof`, started again on
/// the fixture's AOF directory in place of its own.
fn start_from_aof(flavor: Flavor) -> Server {
    let options = ServerOptions::new()
        .config("appendonly", "yes")
        .config("appenddirname", "aof");
    let mut server = Server::start_with(flavor, options);
    server.stop();
    let dir = server.dir.join("aof");
    fs::remove_dir_all(&dir).unwrap_or_else(|e| panic!("remove {}: {e}", dir.display()));
    copy_dir(&fixture("aof"), &dir);
    assert!(!server.dir.join("dump.rdb").exists());
    server.start_again();
    assert_eq!(config_get(&mut server.client(), "appendonly"), "yes");
    server
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap_or_else(|e| panic!("create {}: {e}", to.display()));
    let entries = fs::read_dir(from).unwrap_or_else(|e| panic!("list {}: {e}", from.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        let dest = to.join(path.file_name().expect("a file name"));
        fs::copy(&path, &dest).unwrap_or_else(|e| panic!("copy {}: {e}", path.display()));
    }
}

// ---------------------------------------------------------------------------
// Reading LEASE.INFO by field name

/// `LEASE.INFO key` as `(field, value)` pairs, None for nil. Any number of fields.
fn info_fields(con: &mut Connection, key: &str) -> Option<Vec<(String, Value)>> {
    match call(con, "LEASE.INFO", key) {
        Value::Nil => None,
        reply => Some(pairs(&reply, &format!("LEASE.INFO {key}"))),
    }
}

fn field<'a>(info: &'a [(String, Value)], name: &str) -> &'a Value {
    info.iter()
        .find_map(|(k, v)| (k == name).then_some(v))
        .unwrap_or_else(|| panic!("LEASE.INFO has no `{name}`: {info:?}"))
}

fn field_int(info: &[(String, Value)], name: &str) -> i64 {
    match field(info, name) {
        Value::Int(n) => *n,
        other => panic!("LEASE.INFO `{name}` is {other:?}, not an integer"),
    }
}

fn field_text(info: &[(String, Value)], name: &str) -> String {
    text(field(info, name).clone())
}

// ---------------------------------------------------------------------------
// Checks

/// Every held lease is there, held, with its fence, no waiter, and a ttl that puts its
/// deadline where it was saved (measured on this machine's clock, which the server
/// shares).
fn check_held(con: &mut Connection, when: &str) {
    for held in &HELD {
        select(con, held.db);
        let what = format!("{when}: {} (db {})", held.key, held.db);
        assert_eq!(text(call(con, "TYPE", held.key)), "lease-key", "{what}");
        let before = now_ms();
        let info =
            info_fields(con, held.key).unwrap_or_else(|| panic!("{what}: LEASE.INFO is nil"));
        let after = now_ms();
        assert_eq!(field_text(&info, "state"), "held", "{what}: {info:?}");
        assert_eq!(field_int(&info, "fence") as u64, held.fence, "{what}");
        assert_eq!(field_int(&info, "waiters"), 0, "{what}");
        let ttl = field_int(&info, "ttl");
        let low = held.deadline as i64 - after as i64 - 1;
        let high = held.deadline as i64 - before as i64 + 1;
        assert!(
            (low..=high).contains(&ttl),
            "{what}: ttl {ttl} ms; the saved deadline {} puts it in {low}..={high}",
            held.deadline
        );
    }
    select(con, 0);
}

fn check_records_and_strings(con: &mut Connection, when: &str) {
    for (db, key, _) in RECORDS {
        select(con, db);
        assert_eq!(text(call(con, "TYPE", key)), "fence-rec", "{when}: {key}");
    }
    select(con, 0);
    for (key, value) in STRINGS {
        assert_eq!(text(call(con, "GET", key)), value, "{when}: GET {key}");
    }
}

fn check_counts(server: &Server, when: &str) {
    // A server may free the dataset a reload replaced in the background (Valkey 9
    // after `DEBUG RELOAD`): the gauge comes down as each old value is freed.
    let settled = || lease_stat(server, "keys") == HELD.len() as u64;
    if !settled() {
        wait_until(
            "the replaced dataset to be freed",
            Duration::from_secs(10),
            settled,
        );
    }
    assert_eq!(lease_stat(server, "keys"), HELD.len() as u64, "{when}");
    assert_eq!(
        lease_stat(server, "resource_keys"),
        RECORDS.len() as u64,
        "{when}"
    );
}

/// The free and expired records: free with their fence if the reaper has not deleted
/// them yet, their old tokens renew and release nothing, and then the reaper deletes
/// them.
fn check_free_then_reaped(server: &Server, con: &mut Connection) {
    for (key, token, fence) in FREE {
        if let Some(info) = info_fields(con, key) {
            assert_eq!(field_text(&info, "state"), "free", "{key}: {info:?}");
            assert_eq!(field_int(&info, "ttl"), -1, "{key}: {info:?}");
            assert_eq!(field_int(&info, "fence") as u64, fence, "{key}: {info:?}");
            assert_eq!(field_int(&info, "waiters"), 0, "{key}: {info:?}");
        }
        assert_eq!(renew(con, key, token, 60_000), 0, "{key} revived by RENEW");
        assert_eq!(release(con, key, token), 0, "{key} released again");
    }
    wait_until(
        "the reaper to delete lease:waited and lease:expired",
        Duration::from_secs(5),
        || {
            FREE.iter()
                .all(|(key, _, _)| int(call(con, "EXISTS", *key)) == 0)
        },
    );
    check_counts(server, "after reaping");
}

/// `DEBUG DIGEST-VALUE` of every key the fixture holds, db by db.
fn digests(con: &mut Connection) -> Vec<String> {
    let mut keys: Vec<(i64, &str)> = HELD.iter().map(|h| (h.db, h.key)).collect();
    keys.extend(RECORDS.iter().map(|&(db, key, _)| (db, key)));
    keys.extend(STRINGS.iter().map(|&(key, _)| (0, key)));
    let mut out = Vec::new();
    for (db, key) in keys {
        select(con, db);
        let reply = call(con, "DEBUG", ("DIGEST-VALUE", key));
        let digest = match reply {
            Value::Array(mut items) if items.len() == 1 => text(items.remove(0)),
            other => panic!("DEBUG DIGEST-VALUE {key}: {other:?}"),
        };
        assert_ne!(digest, "0".repeat(40), "{key} (db {db}) is missing");
        out.push(format!("{db}/{key}={digest}"));
    }
    select(con, 0);
    out
}

/// Each recorded token renews and releases its lease, and nothing else does; a new
/// grant on the freed key is above every fence the fixture recorded.
fn check_tokens(con: &mut Connection) {
    for held in &HELD {
        select(con, held.db);
        let key = held.key;
        let what = format!("{key} (db {})", held.db);
        assert_eq!(
            acquire(con, key, 60_000, "someone-else"),
            None,
            "{what}: another token got it"
        );
        assert_eq!(renew(con, key, "wrong-token", 60_000), 0, "{what}");
        assert_eq!(renew(con, key, held.token, 60_000), 1, "{what}");
        let info = info_fields(con, key).unwrap_or_else(|| panic!("{what}: nil after RENEW"));
        let ttl = field_int(&info, "ttl");
        assert!((1..=60_000).contains(&ttl), "{what}: ttl {ttl} after RENEW");
        assert_eq!(field_int(&info, "fence") as u64, held.fence, "{what}");
        assert_eq!(
            acquire(con, key, 60_000, held.token),
            Some(held.fence),
            "{what}: the holder's retry repeats its fence"
        );
        assert_eq!(release(con, key, "wrong-token"), 0, "{what}");
        assert_eq!(release(con, key, held.token), 1, "{what}");
        assert_eq!(
            info_fields(con, key),
            None,
            "{what}: still there after RELEASE"
        );
        assert_eq!(release(con, key, held.token), 0, "{what}: released twice");
        let again = acquire(con, key, 60_000, "token-again").expect("a grant");
        assert!(
            again > SEQUENCE,
            "{what}: granted fence {again} after {SEQUENCE}"
        );
    }
    select(con, 0);
}

/// Each record refuses a lower fence (STALE, the inner command not run) and accepts a
/// higher one.
fn check_records_fence(con: &mut Connection) {
    for (db, key, highest) in RECORDS {
        select(con, db);
        let reply = fenced(con, key, highest - 1, NONE);
        assert_eq!(
            error_text(&reply),
            Some(stale(highest - 1, highest)),
            "{key} (db {db})"
        );
        assert_eq!(
            fenced(con, key, highest + 1, NONE),
            Value::Int(highest as i64 + 1),
            "{key} (db {db})"
        );
        let reply = fenced(con, key, highest, NONE);
        assert_eq!(error_text(&reply), Some(stale(highest, highest + 1)));
    }
    select(con, 0);
    let (_, _, highest) = RECORDS[1];
    let reply = fenced(con, "res:data", highest, ("SET", "data:1", "stale"));
    assert_eq!(error_text(&reply), Some(stale(highest, highest + 1)));
    assert_eq!(text(call(con, "GET", "data:1")), "v2");
    assert_eq!(
        fenced(con, "res:data", highest + 2, ("SET", "data:1", "v3")),
        Value::Okay
    );
    assert_eq!(text(call(con, "GET", "data:1")), "v3");
}

/// New grants, on a new key and on the keys the reaper deleted, are above every fence
/// the fixture recorded, the sequence's included.
fn check_new_grants(con: &mut Connection) {
    for db in [0, 3] {
        select(con, db);
        let fence = acquire(con, "lease:fresh", 60_000, "fresh").expect("a grant");
        assert!(fence > SEQUENCE, "db {db}: fence {fence} after {SEQUENCE}");
    }
    select(con, 0);
    for (key, _, old) in FREE {
        let fence = acquire(con, key, 60_000, "fresh").expect("a grant");
        assert!(fence > old && fence > SEQUENCE, "{key}: fence {fence}");
    }
}

fn check_fixture(server: &Server) {
    let mut con = server.client();
    // Nothing issued since the load: the sequence is what the files carry, exactly.
    assert_eq!(lease_stat(server, "fence_last"), SEQUENCE);
    check_held(&mut con, "after the load");
    check_records_and_strings(&mut con, "after the load");
    check_free_then_reaped(server, &mut con);

    // RESP3: the map form, read by name as well.
    let mut con3 = server.client_resp3();
    let held = &HELD[0];
    let info3 = info_fields(&mut con3, held.key).expect("LEASE.INFO over RESP3");
    assert_eq!(field_text(&info3, "state"), "held");
    assert_eq!(field_int(&info3, "fence") as u64, held.fence);

    // A save and a load in the current encoding keeps every value.
    let before = digests(&mut con);
    let dataset = digest(server);
    assert_eq!(call(&mut con, "DEBUG", "RELOAD"), Value::Okay);
    assert_eq!(
        digests(&mut con),
        before,
        "DEBUG DIGEST-VALUE after DEBUG RELOAD"
    );
    assert_eq!(digest(server), dataset, "DEBUG DIGEST after DEBUG RELOAD");
    check_held(&mut con, "after DEBUG RELOAD");
    check_records_and_strings(&mut con, "after DEBUG RELOAD");
    check_counts(server, "after DEBUG RELOAD");
    assert_eq!(lease_stat(server, "fence_last"), SEQUENCE);

    check_records_fence(&mut con);
    check_tokens(&mut con);
    check_new_grants(&mut con);
    assert!(
        !server.log().contains("redis-lease: refusing"),
        "{}",
        server.log()
    );
}

for_each_server!(rdb_fixture_loads, |flavor| {
    let server = start_from_rdb(flavor);
    check_fixture(&server);
});

for_each_server!(aof_fixture_loads, |flavor| {
    let server = start_from_aof(flavor);
    check_fixture(&server);
});
