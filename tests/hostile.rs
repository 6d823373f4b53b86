//! Hostile input, ACLs and secrets (issue 7), on each real server: `RESTORE` of crafted
//! payloads with a valid checksum, an RDB file with a corrupt lease value, the ACL
//! categories and key patterns of the LEASE commands and of LEASE.FENCE's inner command,
//! tokens kept out of LEASE.INFO, MONITOR, SLOWLOG and the log, and the limits (token
//! length, ttl range, waiters per key, inner commands, huge argument counts). Every
//! refusal is an error reply, the server stays up, and the dataset does not change.

#[macro_use]
extern crate harness;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use harness::calls::{cmd, describe, exists, login, restore, sanitize_dump_payload, send, take};
use harness::errors::{
    forbidden, BLOCK_ERR, FENCE_ERR, NESTED_ERR, RESOURCE_ERR, SYNTAX_ERR, TOKEN_ERR, TTL_ERR,
    UNKNOWN_INNER_ERR,
};
use harness::lease::{dump, lease_info, lease_stat, Dump};
use harness::rdb::{crc64, module_id, push_len, seal, Body};
use harness::reply::{assert_ok, error_text, expect_error, int, text, FENCE_LIMIT};
use harness::{info_number, now_ms, wait_until, Flavor, Server};
use redis::{Connection, Value};

const TOO_MANY_INNER_ERR: &str =
    "ERR LEASE.FENCE: the inner command may have at most 256 arguments after its name";
const MINUTE: u64 = 60_000;
const MAX_TTL: u64 = 1 << 40;
/// Deadlines past this are corrupt (model/src/lease/mod.rs `MAX_DEADLINE_MS`).
const MAX_DEADLINE: u64 = FENCE_LIMIT / 1024 + MAX_TTL;
const WAIT: Duration = Duration::from_secs(10);

const WAITERS_ERR: &str = "ERR too many clients already wait for this key (see lease.max-waiters)";

// ---------------------------------------------------------------------------------------
// Commands and replies
// ---------------------------------------------------------------------------------------

/// Every string in a reply, however nested.
fn flatten(v: &Value, out: &mut Vec<Vec<u8>>) {
    match v {
        Value::BulkString(b) => out.push(b.clone()),
        Value::SimpleString(s) => out.push(s.as_bytes().to_vec()),
        Value::VerbatimString { text, .. } => out.push(text.as_bytes().to_vec()),
        Value::Int(i) => out.push(i.to_string().into_bytes()),
        Value::Array(items) | Value::Set(items) => items.iter().for_each(|i| flatten(i, out)),
        Value::Map(pairs) => pairs.iter().for_each(|(k, v)| {
            flatten(k, out);
            flatten(v, out);
        }),
        Value::Attribute { data, attributes } => {
            flatten(data, out);
            attributes.iter().for_each(|(k, v)| {
                flatten(k, out);
                flatten(v, out);
            });
        }
        Value::Push { data, .. } => data.iter().for_each(|i| flatten(i, out)),
        Value::ServerError(e) => out.push(format!("{e:?}").into_bytes()),
        _ => {}
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn reply_contains(v: &Value, needle: &[u8]) -> bool {
    let mut parts = Vec::new();
    flatten(v, &mut parts);
    parts.iter().any(|p| contains(p, needle))
}

fn ping(con: &mut Connection, what: &str) {
    assert_eq!(text(q!(con, "PING"), "PING"), "PONG", "PING after {what}");
}

/// What must not change when a command is refused: the number of keys, the digest of
/// the whole dataset, and how many lease and record values the module holds.
#[derive(Debug, PartialEq, Eq)]
struct Snapshot {
    dbsize: i64,
    digest: String,
    lease_values: u64,
    record_values: u64,
}

fn snapshot(server: &Server) -> Snapshot {
    let con = &mut server.client();
    Snapshot {
        dbsize: int(q!(con, "DBSIZE"), "DBSIZE"),
        digest: text(q!(con, "DEBUG", "DIGEST"), "DEBUG DIGEST"),
        lease_values: lease_stat(server, "keys"),
        record_values: lease_stat(server, "resource_keys"),
    }
}

/// Sends `c` on `con` (any user's), which must fail with an error that `check` accepts,
/// leave the server up and change nothing (as the default user sees it). Returns the
/// error.
fn refused(
    server: &Server,
    con: &mut Connection,
    c: &redis::Cmd,
    check: impl Fn(&str) -> bool,
) -> String {
    let before = snapshot(server);
    let what = describe(c);
    let reply = send(con, c);
    let error = expect_error(&reply, &what);
    assert!(check(&error), "`{what}`: unexpected error {error:?}");
    ping(&mut server.client(), &what);
    assert_eq!(before, snapshot(server), "`{what}` changed the dataset");
    error
}

fn refused_exactly(server: &Server, con: &mut Connection, c: &redis::Cmd, expected: &str) {
    refused(server, con, c, |e| e == expected);
}

fn acl_user(con: &mut Connection, user: &str, rules: &[&str]) {
    let mut c = cmd(&["ACL", "SETUSER", user, "reset", "on", ">pw"]);
    for r in rules {
        c.arg(*r);
    }
    assert_ok(send(con, &c), &format!("ACL SETUSER {user} {rules:?}"));
}

fn is_noperm(e: &str) -> bool {
    e.starts_with("NOPERM")
}

// ---------------------------------------------------------------------------------------
// Crafted DUMP payloads (the encoder and the format: model/src/rdb.rs)
// ---------------------------------------------------------------------------------------

#[test]
fn crc64_is_redis_crc64() {
    // The check value Redis's own crc64 test uses.
    assert_eq!(crc64(b"123456789"), 0xe9c6_d914_c4b8_d9ca);
}

/// The crafted payloads of `restore_of_crafted_payloads_fails_and_changes_nothing`.
fn crafted_payloads(live: u64) -> Vec<(String, Body)> {
    let token40 = [b'k'; 40];
    let good = Body::lease(12_345, live, &token40);
    let mut cases: Vec<(String, Body)> = Vec::new();
    // Truncated: every cut leaves more than the 10-byte trailer missing, so no reading
    // of the version and CRC bytes can complete the value.
    let token_start = good.0.len() - 1 - token40.len();
    for cut in [
        1,
        2,
        6,
        10,
        11,
        12,
        13,
        20,
        token_start - 2,
        token_start,
        token_start + 5,
    ] {
        cases.push((format!("a lease-key cut to {cut} bytes"), good.cut(cut)));
    }
    let record = Body::new("fence-rec", 1).unsigned(u64::from(u32::MAX) + 7);
    for cut in [1, 2, 10] {
        cases.push((format!("a fence-rec cut to {cut} bytes"), record.cut(cut)));
    }
    cases.push((
        "a lease-key without its EOF marker".into(),
        good.cut(good.0.len() - 1),
    ));
    cases.push((
        "a fence-rec without its EOF marker".into(),
        Body::new("fence-rec", 1).unsigned(5),
    ));
    // Encoding versions the module does not know.
    for v in [0, 4, 1023] {
        cases.push((
            format!("a lease-key of encoding version {v}"),
            Body::new("lease-key", v)
                .unsigned(5)
                .unsigned(live)
                .string(b"t")
                .eof(),
        ));
        cases.push((
            format!("a fence-rec of encoding version {v}"),
            Body::new("fence-rec", v).unsigned(5).eof(),
        ));
    }
    cases.push((
        "a module type nobody registered".into(),
        Body::new("lease-kez", 1)
            .unsigned(5)
            .unsigned(live)
            .string(b"t")
            .eof(),
    ));
    // One type's fields under the other type's id.
    cases.push((
        "lease-key fields under the fence-rec id".into(),
        Body::new("fence-rec", 1)
            .unsigned(5)
            .unsigned(live)
            .string(b"t")
            .eof(),
    ));
    cases.push((
        "fence-rec fields under the lease-key id".into(),
        Body::new("lease-key", 1).unsigned(5).eof(),
    ));
    // Huge string lengths, with no such bytes behind them.
    for len in [1u64 << 32, u64::from(u32::MAX), 1 << 63, u64::MAX] {
        cases.push((
            format!("a token length of {len}"),
            Body::new("lease-key", 1)
                .unsigned(5)
                .unsigned(live)
                .string_len_only(len)
                .raw(b"tok")
                .eof(),
        ));
    }
    // Values out of range.
    cases.push((
        "a fence of 2^53".into(),
        Body::lease(FENCE_LIMIT, live, b"t"),
    ));
    cases.push((
        "a fence of 2^64-1".into(),
        Body::lease(u64::MAX, live, b"t"),
    ));
    cases.push(("a holder with deadline 0".into(), Body::lease(9, 0, b"t")));
    cases.push((
        "a deadline past 2^53/1024 + 2^40 ms".into(),
        Body::lease(9, MAX_DEADLINE + 1, b"t"),
    ));
    cases.push((
        "a deadline of 2^64-1".into(),
        Body::lease(9, u64::MAX, b"t"),
    ));
    cases.push((
        "a 257-byte token".into(),
        Body::lease(9, live, &[b'x'; 257]),
    ));
    cases.push((
        "a 10 MB token".into(),
        Body::lease(9, live, &vec![b'x'; 10 << 20]),
    ));
    cases.push(("a record fence of 2^53".into(), Body::record(FENCE_LIMIT)));
    cases.push(("a record fence of 2^64-1".into(), Body::record(u64::MAX)));
    // Wrong opcodes, and values the module never reads.
    cases.push((
        "a string where the fence belongs".into(),
        Body::new("lease-key", 1)
            .string(b"5")
            .unsigned(live)
            .string(b"t")
            .eof(),
    ));
    cases.push((
        "an unsigned where the token belongs".into(),
        Body::new("lease-key", 1)
            .unsigned(5)
            .unsigned(live)
            .unsigned(7)
            .eof(),
    ));
    cases.push((
        "a float opcode where the fence belongs".into(),
        Body::new("lease-key", 1)
            .raw(&[3])
            .raw(&1.5f32.to_le_bytes())
            .unsigned(live)
            .string(b"t")
            .eof(),
    ));
    cases.push((
        "an EOF marker right after the module id".into(),
        Body::new("lease-key", 1).eof(),
    ));
    cases.push((
        "an unknown length encoding".into(),
        Body::new("lease-key", 1).raw(&[2, 0x85, 1, 2, 3, 4]).eof(),
    ));
    cases.push((
        "trailing values before the EOF marker".into(),
        Body::new("lease-key", 1)
            .unsigned(5)
            .unsigned(live)
            .string(b"t")
            .unsigned(6)
            .string(b"garbage")
            .eof(),
    ));
    cases.push((
        "a trailing value in a fence-rec".into(),
        Body::new("fence-rec", 1).unsigned(5).unsigned(6).eof(),
    ));
    cases
}

for_each_server!(
    restore_of_crafted_payloads_fails_and_changes_nothing,
    |flavor| {
        let server = Server::start(flavor);
        let mut con = server.client();
        assert_ok(q!(&mut con, "SET", "plain", "v"), "SET");
        let fence = take(&mut con, "lease:src", 10 * MINUTE, b"tok-src");
        assert_eq!(q!(&mut con, "LEASE.FENCE", "res:src", 5), Value::Int(5));
        let Dump {
            body: lease_body,
            version,
        } = dump(&mut con, "lease:src");
        let Dump {
            body: record_body, ..
        } = dump(&mut con, "res:src");
        let live = now_ms() + 10 * MINUTE;
        // The test's encoder writes what the module writes: the real values re-encoded are
        // the DUMP bodies byte for byte, and crafted well-formed values load.
        let deadline = {
            let mut d = [0u8; 8];
            // From the end: EOF, the compact marker (opcode and 0), the token, its
            // length and opcode; the deadline's 8 bytes before.
            let at = lease_body.len() - 1 - 2 - b"tok-src".len() - 1 - 1 - 8;
            d.copy_from_slice(&lease_body[at..at + 8]);
            u64::from_be_bytes(d)
        };
        assert_eq!(
            Body::lease(fence, deadline, b"tok-src").0,
            lease_body,
            "the test's lease-key encoding"
        );
        assert_eq!(
            Body::record(5).0,
            record_body,
            "the test's fence-rec encoding"
        );
        let good = seal(&Body::lease(12_345, live, b"crafted").0, version);
        assert_ok(restore(&mut con, "lease:crafted", &good), "a crafted lease");
        assert_eq!(
            lease_info(&mut con, "lease:crafted").map(|i| (i.state, i.fence, i.waiters)),
            Some(("held".to_string(), 12_345, 0))
        );
        assert_eq!(int(q!(&mut con, "DEL", "lease:crafted"), "DEL"), 1);
        let good = seal(&Body::record(77).0, version);
        assert_ok(restore(&mut con, "res:crafted", &good), "a crafted record");
        assert_eq!(int(q!(&mut con, "DEL", "res:crafted"), "DEL"), 1);

        let cases = crafted_payloads(live);
        assert!(cases.len() >= 40, "{} cases", cases.len());
        for &setting in flavor.sanitize_dump_payload_settings() {
            let sanitize = sanitize_dump_payload(&mut con, setting);
            for (what, body) in &cases {
                let what = format!("RESTORE of {what} (sanitize-dump-payload {sanitize})");
                let payload = seal(&body.0, version);
                let c = {
                    let mut c = cmd(&["RESTORE", "victim", "0"]);
                    c.arg(&payload[..]);
                    c
                };
                let error = refused(&server, &mut con, &c, |e| e.starts_with("ERR"));
                assert!(error.contains("Bad data format"), "{what}: {error}");
                assert!(!exists(&mut con, "victim"), "{what} created the key");
            }
        }
        // Bytes after the EOF marker are outside the value: the server's framing, not the
        // module, decides about them. Whatever it does, a key that appears is the intact
        // lease and nothing else.
        let mut trailing = Body::lease(12_345, live, b"crafted");
        trailing.0.extend_from_slice(b"trailing garbage");
        let reply = restore(&mut con, "lease:trailing", &seal(&trailing.0, version));
        ping(&mut con, "RESTORE with bytes after the EOF marker");
        match error_text(&reply) {
            Some(e) => assert!(e.contains("Bad data format"), "{e}"),
            None => assert_eq!(
                lease_info(&mut con, "lease:trailing").map(|i| (i.state, i.fence, i.waiters)),
                Some(("held".to_string(), 12_345, 0))
            ),
        }

        let log = server.log();
        for line in [
            "redis-lease: refusing to load a truncated lease-key",
            "redis-lease: refusing to load a lease-key of an unknown encoding version",
            "redis-lease: refusing to load a fence-rec of an unknown encoding version",
            "redis-lease: refusing to load a lease-key whose fence is not below 2^53",
            "redis-lease: refusing to load a lease-key with an impossible deadline",
            "redis-lease: refusing to load a lease-key whose token is longer than 256 bytes",
            "redis-lease: refusing to load a fence-rec whose fence is not below 2^53",
        ] {
            assert!(log.contains(line), "the log lacks {line:?}:\n{log}");
        }
        assert!(!log.contains("internal error"), "{log}");
        // The real keys are untouched and work.
        assert_eq!(
            int(
                q!(&mut con, "LEASE.RENEW", "lease:src", "tok-src", MINUTE),
                "RENEW"
            ),
            1
        );
        assert_eq!(
            lease_info(&mut con, "lease:src").map(|i| (i.state, i.fence, i.waiters)),
            Some(("held".to_string(), fence, 0))
        );
        assert_eq!(q!(&mut con, "LEASE.FENCE", "res:src", 5), Value::Int(5));
        assert_eq!(text(q!(&mut con, "GET", "plain"), "GET"), "v");
    }
);

// ---------------------------------------------------------------------------------------
// A corrupt RDB file
// ---------------------------------------------------------------------------------------

/// Replaces the one occurrence of the value of DUMP body `from` in the RDB `data` with
/// the value of `to`. In an RDB the type byte comes before the key's name, so the value
/// is the body without its first byte.
fn replace_once(data: &[u8], from: &[u8], to: &[u8], what: &str) -> Vec<u8> {
    let (from, to) = (&from[1..], &to[1..]);
    let found: Vec<usize> = (0..=data.len() - from.len())
        .filter(|&i| data[i..].starts_with(from))
        .collect();
    assert_eq!(
        found.len(),
        1,
        "{what}: {} occurrences in the RDB",
        found.len()
    );
    let at = found[0];
    let mut out = data[..at].to_vec();
    out.extend_from_slice(to);
    out.extend_from_slice(&data[at + from.len()..]);
    out
}

/// An RDB file's content with its trailing CRC64 made right again.
fn reseal_rdb(mut rdb: Vec<u8>) -> Vec<u8> {
    let body = rdb.len() - 8;
    let crc = crc64(&rdb[..body]);
    rdb[body..].copy_from_slice(&crc.to_le_bytes());
    rdb
}

/// The module aux field in an RDB: `0xF7`, the module id, `when`, then the module's
/// values; returns the range of the first value (opcode and length).
fn aux_value_range(rdb: &[u8], lease_id: u64) -> std::ops::Range<usize> {
    let mut header = vec![0xF7, 0x81];
    header.extend_from_slice(&lease_id.to_be_bytes());
    header.extend_from_slice(&[2, 1]); // opcode unsigned, when = REDISMODULE_AUX_BEFORE_RDB
    let at = (0..rdb.len() - header.len())
        .find(|&i| rdb[i..].starts_with(&header))
        .expect("the module's aux field in the RDB");
    let start = at + header.len();
    assert_eq!(rdb[start], 2, "the aux value is an unsigned");
    let len = match rdb[start + 1] >> 6 {
        0 => 1,
        1 => 2,
        _ if rdb[start + 1] == 0x80 => 5,
        _ if rdb[start + 1] == 0x81 => 9,
        _ => panic!("an RDB length at {}", start + 1),
    };
    start..start + 1 + len
}

/// Runs the server binary on its own config file until it exits (it must: the RDB is
/// corrupt); returns the exit status and what it added to its log.
fn start_and_expect_exit(server: &Server) -> (std::process::ExitStatus, String) {
    let conf = std::fs::read_dir(&server.dir)
        .expect("server dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "conf"))
        .expect("the server's config file");
    let log_path: PathBuf = server.dir.join("server.log");
    let before = std::fs::read(&log_path).map(|b| b.len()).unwrap_or(0);
    let mut child = Command::new(server.flavor.binary())
        .arg(&conf)
        .current_dir(&server.dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the server");
    // Generous: under valgrind the load alone takes seconds.
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{} loaded a corrupt RDB and kept running", server.flavor);
        }
        thread::sleep(Duration::from_millis(20));
    };
    let log = std::fs::read(&log_path).unwrap_or_default();
    let added = String::from_utf8_lossy(&log[before.min(log.len())..]).into_owned();
    (status, added)
}

for_each_server!(
    rdb_file_with_corrupt_lease_values_is_refused_cleanly,
    |flavor| {
        let mut server = Server::start(flavor);
        let mut con = server.client();
        let fence = take(&mut con, "lease:a", 10 * MINUTE, b"tok-a");
        assert_eq!(q!(&mut con, "LEASE.FENCE", "res:a", 5), Value::Int(5));
        assert_ok(q!(&mut con, "SET", "plain", "v"), "SET");
        let Dump {
            body: lease_body, ..
        } = dump(&mut con, "lease:a");
        let Dump {
            body: record_body, ..
        } = dump(&mut con, "res:a");
        assert_ok(q!(&mut con, "SAVE"), "SAVE");
        drop(con);
        server.stop();
        let rdb_path = server.dir.join("dump.rdb");
        let original = std::fs::read(&rdb_path).expect("dump.rdb");
        assert_eq!(
            crc64(&original[..original.len() - 8]).to_le_bytes(),
            original[original.len() - 8..],
            "the RDB's CRC64 as this test computes it"
        );
        let lease_id = module_id("lease-key", 3);
        let aux = aux_value_range(&original, lease_id);
        let mut bad_aux = vec![2];
        push_len(&mut bad_aux, FENCE_LIMIT);
        let corruptions = [
            (
                "a lease fence of 2^53",
                replace_once(
                    &original,
                    &lease_body,
                    &Body::lease(FENCE_LIMIT, now_ms() + MINUTE, b"tok-a").0,
                    "lease:a",
                ),
                "redis-lease: refusing to load a lease-key whose fence is not below 2^53",
            ),
            (
                "a 300-byte token",
                replace_once(
                    &original,
                    &lease_body,
                    &Body::lease(7, now_ms() + MINUTE, &[b'x'; 300]).0,
                    "lease:a",
                ),
                "redis-lease: refusing to load a lease-key whose token is longer than 256 bytes",
            ),
            (
                "a record fence of 2^64-1",
                replace_once(&original, &record_body, &Body::record(u64::MAX).0, "res:a"),
                "redis-lease: refusing to load a fence-rec whose fence is not below 2^53",
            ),
            (
                "a fence sequence of 2^53 in the aux field",
                [&original[..aux.start], &bad_aux, &original[aux.end..]].concat(),
                "redis-lease: refusing to load a fence sequence not below 2^53",
            ),
        ];
        for (what, rdb, line) in corruptions {
            std::fs::write(&rdb_path, reseal_rdb(rdb)).expect("write dump.rdb");
            let (status, log) = start_and_expect_exit(&server);
            assert_eq!(
                status.signal(),
                None,
                "{flavor} crashed on an RDB with {what}:\n{log}"
            );
            // Redis 7.0 and 8 then run their RDB checker on the file, which knows nothing
            // of the module's rules and exits 0 ("RDB looks OK"): the exit code is not
            // the verdict, the module's refusal in the log and a clean exit are.
            eprintln!("{flavor}: an RDB with {what}: the server exited with {status}");
            for crash in ["crashed by signal", "BUG REPORT", "Guru Meditation"] {
                assert!(!log.contains(crash), "{what}:\n{log}");
            }
            assert!(log.contains(line), "{what}: the log lacks {line:?}:\n{log}");
            assert!(!log.contains("internal error"), "{what}:\n{log}");
        }
        // The untouched file loads: what failed above was the corruption alone.
        std::fs::write(&rdb_path, &original).expect("write dump.rdb");
        server.start_again();
        let mut con = server.client();
        assert_eq!(
            lease_info(&mut con, "lease:a").map(|i| (i.state, i.fence, i.waiters)),
            Some(("held".to_string(), fence, 0))
        );
        assert_eq!(q!(&mut con, "LEASE.FENCE", "res:a", 5), Value::Int(5));
        assert_eq!(text(q!(&mut con, "GET", "plain"), "GET"), "v");
    }
);

// ---------------------------------------------------------------------------------------
// ACL
// ---------------------------------------------------------------------------------------

const LEASE_COMMANDS: [&str; 5] = [
    "lease.acquire",
    "lease.renew",
    "lease.release",
    "lease.fence",
    "lease.info",
];

/// The ACL categories `COMMAND INFO` reports for a command.
fn categories(con: &mut Connection, command: &str) -> Vec<String> {
    let reply = q!(con, "COMMAND", "INFO", command);
    let Value::Array(entries) = reply else {
        panic!("COMMAND INFO {command}: {reply:?}")
    };
    let Some(Value::Array(entry)) = entries.into_iter().next() else {
        panic!("COMMAND INFO {command}: no entry")
    };
    match entry.get(6) {
        Some(Value::Array(cats)) | Some(Value::Set(cats)) => {
            cats.iter().map(|c| text(c.clone(), "category")).collect()
        }
        other => panic!("COMMAND INFO {command}: categories {other:?}"),
    }
}

/// Whether the server lets modules add ACL categories (Redis 7.4+, Valkey 8.1+).
fn has_module_categories(flavor: Flavor) -> bool {
    flavor != Flavor::Redis7
}

/// One call of each LEASE command on keys under `prefix`.
fn each_lease_command(prefix: &str) -> Vec<redis::Cmd> {
    let k = format!("{prefix}lock");
    let r = format!("{prefix}res");
    vec![
        cmd(&["LEASE.ACQUIRE", &k, "1000", "TOKEN", "t"]),
        cmd(&["LEASE.RENEW", &k, "t", "1000"]),
        cmd(&["LEASE.RELEASE", &k, "t"]),
        cmd(&["LEASE.FENCE", &r, "1"]),
        cmd(&["LEASE.INFO", &k]),
    ]
}

for_each_server!(acl_lease_and_blocking_categories, |flavor| {
    let server = Server::start(flavor);
    let mut admin = server.client();
    let cats: Vec<Vec<String>> = LEASE_COMMANDS
        .iter()
        .map(|c| categories(&mut admin, c))
        .collect();
    if !has_module_categories(flavor) {
        // Redis 7.0 has no API for module command categories: the commands are in none,
        // so only `+@all` or naming them grants them.
        assert!(cats.iter().all(Vec::is_empty), "{cats:?}");
        let e = expect_error(&q!(&mut admin, "ACL", "CAT", "lease"), "ACL CAT lease");
        assert!(e.contains("Unknown category"), "{e}");
        acl_user(
            &mut admin,
            "named",
            &["+lease.acquire", "+lease.info", "~*"],
        );
        let mut named = login(&server, "named");
        take(&mut named, "k", 1000, b"t");
        let e = expect_error(&q!(&mut named, "LEASE.RELEASE", "k", "t"), "RELEASE");
        assert!(is_noperm(&e), "{e}");
        return;
    }
    for (command, cats) in LEASE_COMMANDS.iter().zip(&cats) {
        assert!(cats.contains(&"@lease".to_string()), "{command}: {cats:?}");
        assert_eq!(
            cats.contains(&"@blocking".to_string()),
            *command == "lease.acquire",
            "{command}: {cats:?}"
        );
        for never in ["@dangerous", "@admin"] {
            assert!(!cats.contains(&never.to_string()), "{command}: {cats:?}");
        }
    }
    let listed: Vec<String> = match q!(&mut admin, "ACL", "CAT", "lease") {
        Value::Array(v) | Value::Set(v) => v.into_iter().map(|c| text(c, "ACL CAT")).collect(),
        other => panic!("ACL CAT lease: {other:?}"),
    };
    for command in LEASE_COMMANDS {
        assert!(listed.contains(&command.to_string()), "{listed:?}");
    }
    // +@lease grants every LEASE command, but not what LEASE.FENCE would run.
    acl_user(&mut admin, "leaser", &["+@lease", "~*"]);
    let mut leaser = login(&server, "leaser");
    for c in each_lease_command("") {
        let reply = send(&mut leaser, &c);
        assert!(error_text(&reply).is_none(), "{}: {reply:?}", describe(&c));
    }
    let c = cmd(&["LEASE.FENCE", "res", "2", "SET", "k", "v"]);
    let e = refused(&server, &mut leaser, &c, is_noperm);
    assert!(is_noperm(&e));
    // -@lease takes them all away, and -@blocking takes LEASE.ACQUIRE.
    acl_user(&mut admin, "nolease", &["+@all", "-@lease", "~*"]);
    let mut nolease = login(&server, "nolease");
    for c in each_lease_command("") {
        refused(&server, &mut nolease, &c, is_noperm);
    }
    acl_user(&mut admin, "noblock", &["+@all", "-@blocking", "~*"]);
    let mut noblock = login(&server, "noblock");
    let c = cmd(&["LEASE.ACQUIRE", "k2", "1000", "BLOCK", "10"]);
    refused(&server, &mut noblock, &c, is_noperm);
});

for_each_server!(acl_write_read_and_fast_categories, |flavor| {
    let server = Server::start(flavor);
    let mut admin = server.client();
    if !has_module_categories(flavor) {
        // No category API on Redis 7.0: `-@write` cannot reach module commands, and
        // the commands show no categories at all (documented in docs/src/proof/security.md).
        for command in LEASE_COMMANDS {
            assert_eq!(categories(&mut admin, command), Vec::<String>::new());
        }
        return;
    }
    // The issue's contract: write/read, fast, blocking, as Redis's own commands are.
    let expected: [(&str, &[&str]); 5] = [
        ("lease.acquire", &["@write", "@blocking"]),
        ("lease.renew", &["@write", "@fast"]),
        ("lease.release", &["@write", "@fast"]),
        ("lease.fence", &["@write"]),
        ("lease.info", &["@read", "@fast"]),
    ];
    let mut missing = Vec::new();
    for (command, wanted) in expected {
        let cats = categories(&mut admin, command);
        for w in wanted {
            if !cats.contains(&w.to_string()) {
                missing.push(format!("{command} lacks {w} (has {cats:?})"));
            }
        }
    }
    // So that an ACL on categories means what it says: a user denied @write may read
    // leases but not take, renew, release or fence them.
    acl_user(&mut admin, "nowrite", &["+@all", "-@write", "~*"]);
    let mut nowrite = login(&server, "nowrite");
    for c in each_lease_command("") {
        let reply = send(&mut nowrite, &c);
        let denied = error_text(&reply).is_some_and(|e| is_noperm(&e));
        let is_info = describe(&c).starts_with("LEASE.INFO");
        if denied == is_info {
            missing.push(format!(
                "user -@write: `{}` answered {reply:?}",
                describe(&c)
            ));
        }
    }
    assert!(missing.is_empty(), "{missing:#?}");
});

for_each_server!(key_pattern_acls_restrict_every_lease_command, |flavor| {
    let server = Server::start(flavor);
    let mut admin = server.client();
    take(&mut admin, "other:lock", MINUTE, b"t");
    acl_user(&mut admin, "scoped", &["+@all", "~lock:*"]);
    acl_user(&mut admin, "reader", &["+@all", "%R~ro:*"]);
    let mut scoped = login(&server, "scoped");
    for c in each_lease_command("other:") {
        refused(&server, &mut scoped, &c, is_noperm);
    }
    for c in each_lease_command("lock:") {
        let reply = send(&mut scoped, &c);
        assert!(error_text(&reply).is_none(), "{}: {reply:?}", describe(&c));
    }
    // The other holder's lease is untouched by the refused RENEW and RELEASE.
    assert_eq!(
        int(
            q!(&mut admin, "LEASE.RENEW", "other:lock", "t", MINUTE),
            "RENEW"
        ),
        1
    );
    // Read-only key permission: LEASE.INFO may look, nothing may write.
    take(&mut admin, "ro:lock", MINUTE, b"t");
    let mut reader = login(&server, "reader");
    assert!(lease_info(&mut reader, "ro:lock").is_some());
    for c in each_lease_command("ro:") {
        if describe(&c).starts_with("LEASE.INFO") {
            continue;
        }
        refused(&server, &mut reader, &c, is_noperm);
    }
    // The inner command's keys: a scoped user fences its own resource but cannot
    // write outside its pattern through it, and nothing is recorded when refused.
    let c = cmd(&["LEASE.FENCE", "lock:res", "3", "SET", "other:k", "v"]);
    refused(&server, &mut scoped, &c, is_noperm);
    let c = cmd(&[
        "LEASE.FENCE",
        "lock:res",
        "3",
        "MSET",
        "lock:a",
        "1",
        "other:b",
        "2",
    ]);
    refused(&server, &mut scoped, &c, is_noperm);
    let reply = q!(
        &mut scoped,
        "LEASE.FENCE",
        "lock:res",
        3,
        "SET",
        "lock:k",
        "v"
    );
    assert_ok(reply, "FENCE lock:res 3 SET lock:k v");
});

for_each_server!(
    fence_inner_command_is_checked_against_the_callers_acl,
    |flavor| {
        let server = Server::start(flavor);
        let mut admin = server.client();
        assert_ok(q!(&mut admin, "SET", "k", "1"), "SET");
        // Only LEASE.FENCE and GET: no SET, no INCR, no DEL, through the fence or not.
        acl_user(&mut admin, "fenceget", &["+lease.fence", "+get", "~*"]);
        // Everything but SET (in any spelling).
        acl_user(&mut admin, "noset", &["+@all", "-set", "~*"]);
        // Everything but the string commands.
        acl_user(&mut admin, "nostring", &["+@all", "-@string", "~*"]);
        let mut fenceget = login(&server, "fenceget");
        for inner in [
            &["SET", "k", "2"][..],
            &["set", "k", "2"],
            &["sEt", "k", "2"],
            &["INCR", "k"],
            &["DEL", "k"],
            &["EXPIRE", "k", "1"],
            &["HSET", "h", "f", "v"],
        ] {
            let mut c = cmd(&["LEASE.FENCE", "res", "1"]);
            for a in inner {
                c.arg(*a);
            }
            refused(&server, &mut fenceget, &c, is_noperm);
        }
        let reply = q!(&mut fenceget, "LEASE.FENCE", "res", 1, "GET", "k");
        assert_eq!(reply, Value::BulkString(b"1".to_vec()));
        let mut noset = login(&server, "noset");
        for spelling in ["SET", "set", "Set"] {
            let c = cmd(&["LEASE.FENCE", "res", "2", spelling, "k", "3"]);
            refused(&server, &mut noset, &c, is_noperm);
        }
        let mut nostring = login(&server, "nostring");
        for inner in [
            &["SET", "k", "3"][..],
            &["APPEND", "k", "x"],
            &["INCRBY", "k", "5"],
        ] {
            let mut c = cmd(&["LEASE.FENCE", "res", "2"]);
            for a in inner {
                c.arg(*a);
            }
            refused(&server, &mut nostring, &c, is_noperm);
        }
        assert_eq!(
            int(
                q!(&mut nostring, "LEASE.FENCE", "res", 2, "LPUSH", "l", "x"),
                "LPUSH"
            ),
            1
        );
        // A user without LEASE.FENCE cannot reach the inner command at all.
        acl_user(&mut admin, "nofence", &["+@all", "-lease.fence", "~*"]);
        let mut nofence = login(&server, "nofence");
        let c = cmd(&["LEASE.FENCE", "res", "3", "SET", "k", "4"]);
        refused(&server, &mut nofence, &c, is_noperm);
        assert_eq!(text(q!(&mut admin, "GET", "k"), "GET"), "1");
        assert_eq!(q!(&mut admin, "LEASE.FENCE", "res", 2), Value::Int(2));
    }
);

// ---------------------------------------------------------------------------------------
// Tokens
// ---------------------------------------------------------------------------------------

for_each_server!(lease_info_never_shows_the_token, |flavor| {
    let server = Server::start(flavor);
    let mut resp2 = server.client();
    let mut resp3 = server.client_resp3();
    let secret = b"secret-info-token-7f3a";
    take(&mut resp2, "k", MINUTE, secret);
    let generated = match q!(&mut resp2, "LEASE.ACQUIRE", "g", MINUTE) {
        Value::Array(items) => match &items[0] {
            Value::BulkString(t) => t.clone(),
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    };
    for key in ["k", "g"] {
        for con in [&mut resp2, &mut resp3] {
            let reply = q!(con, "LEASE.INFO", key);
            assert!(!reply_contains(&reply, secret), "{reply:?}");
            assert!(!reply_contains(&reply, &generated), "{reply:?}");
            assert!(reply_contains(&reply, b"held"), "{reply:?}");
        }
    }
    // Nor any other introspection a reader of the key has, short of DUMP.
    for c in [
        cmd(&["TYPE", "k"]),
        cmd(&["OBJECT", "ENCODING", "k"]),
        cmd(&["MEMORY", "USAGE", "k"]),
        cmd(&["CLIENT", "LIST"]),
        cmd(&["INFO", "everything"]),
    ] {
        let reply = send(&mut resp2, &c);
        assert!(
            !reply_contains(&reply, secret),
            "{}: {reply:?}",
            describe(&c)
        );
    }
});

/// A MONITOR connection: everything the server shows it, as raw bytes.
struct Monitor(TcpStream);

impl Monitor {
    fn start(server: &Server) -> Monitor {
        let mut s = TcpStream::connect(server.addr()).expect("connect for MONITOR");
        s.set_read_timeout(Some(WAIT)).expect("timeout");
        s.write_all(b"MONITOR\r\n").expect("MONITOR");
        let mut ok = [0u8; 5];
        s.read_exact(&mut ok).expect("MONITOR reply");
        assert_eq!(&ok, b"+OK\r\n");
        Monitor(s)
    }

    /// Reads until `marker` has been seen (send it with ECHO from another client).
    fn capture_until(mut self, marker: &[u8]) -> Vec<u8> {
        let mut seen = Vec::new();
        let mut buf = [0u8; 65536];
        while !contains(&seen, marker) {
            let n = self.0.read(&mut buf).expect("MONITOR stream");
            assert!(n > 0, "MONITOR closed");
            seen.extend_from_slice(&buf[..n]);
        }
        seen
    }
}

/// Runs the commands of `tokens_are_hidden_from_monitor_slowlog_and_log` that carry
/// `secrets`; returns how many of them the server executes (and so shows).
fn commands_with_tokens(
    server: &Server,
    con: &mut Connection,
    secrets: [&'static [u8]; 4],
) -> usize {
    let [s1, s2, s3, s4] = secrets;
    // Granted, retried, renewed; a busy ACQUIRE by another token; refused arguments.
    let plain = [
        cmd(&[&b"LEASE.ACQUIRE"[..], b"k", b"60000", b"TOKEN", s1]),
        cmd(&[&b"LEASE.ACQUIRE"[..], b"k", b"60000", b"token", s1]),
        cmd(&[&b"LEASE.RENEW"[..], b"k", s1, b"60000"]),
        cmd(&[&b"LEASE.RENEW"[..], b"k", s1, b"0"]),
        cmd(&[&b"LEASE.ACQUIRE"[..], b"k", b"60000", b"TOKEN", s2]),
        cmd(&[&b"LEASE.ACQUIRE"[..], b"k", b"0", b"TOKEN", s2]),
        cmd(&[
            &b"LEASE.ACQUIRE"[..],
            b"k",
            b"100",
            b"BLOCK",
            b"1",
            b"TOKEN",
            s2,
        ]),
        cmd(&[&b"LEASE.RELEASE"[..], b"other", s2]),
    ];
    for c in &plain {
        send(con, c);
    }
    // A waiter blocked with its token, served when the holder releases.
    let mut waiter = server.client();
    let blocked = thread::spawn(move || {
        let c = cmd(&[
            &b"LEASE.ACQUIRE"[..],
            b"k",
            b"60000",
            b"TOKEN",
            s3,
            b"BLOCK",
            b"0",
        ]);
        send(&mut waiter, &c)
    });
    wait_until("the waiter to block", WAIT, || {
        lease_info(con, "k").is_some_and(|i| i.waiters == 1)
    });
    assert_eq!(
        int(
            send(con, &cmd(&[&b"LEASE.RELEASE"[..], b"k", s1])),
            "RELEASE"
        ),
        1
    );
    let served = blocked.join().expect("waiter thread");
    assert!(reply_contains(&served, s3), "{served:?}");
    assert_eq!(
        int(
            send(con, &cmd(&[&b"LEASE.RELEASE"[..], b"k", s3])),
            "RELEASE"
        ),
        1
    );
    // Inside MULTI/EXEC.
    assert_ok(q!(con, "MULTI"), "MULTI");
    let queued = send(
        con,
        &cmd(&[&b"LEASE.ACQUIRE"[..], b"m", b"60000", b"TOKEN", s4]),
    );
    assert!(error_text(&queued).is_none(), "{queued:?}");
    send(con, &cmd(&["EXEC"]));
    // The internal LEASE.APPLY, refused to clients (Redis 8 hides it: never executed).
    send(
        con,
        &cmd(&[&b"LEASE.APPLY"[..], b"m", b"5", b"99999999999", s4]),
    );
    plain.len() + 4
}

for_each_server!(tokens_are_hidden_from_monitor_slowlog_and_log, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    assert_ok(
        q!(&mut con, "CONFIG", "SET", "loglevel", "debug"),
        "loglevel",
    );
    assert_ok(
        q!(&mut con, "CONFIG", "SET", "slowlog-log-slower-than", 0),
        "slowlog",
    );
    assert_ok(
        q!(&mut con, "CONFIG", "SET", "slowlog-max-len", 1000),
        "slowlog",
    );
    if flavor.is_valkey() {
        // Valkey's COMMANDLOG (8.1+) also keeps large requests; make every request large.
        assert_ok(
            q!(
                &mut con,
                "CONFIG",
                "SET",
                "commandlog-request-larger-than",
                0
            ),
            "commandlog",
        );
    }
    assert_ok(q!(&mut con, "SLOWLOG", "RESET"), "SLOWLOG RESET");
    let secrets: [&'static [u8]; 4] = [
        b"SECRET-one-a81c",
        b"SECRET-two-5d02",
        b"SECRET-three-e9b7",
        b"SECRET-four-77f1",
    ];
    let monitor = Monitor::start(&server);
    let sent = commands_with_tokens(&server, &mut con, secrets);
    q!(&mut con, "ECHO", "hostile-monitor-end");
    let captured = monitor.capture_until(b"hostile-monitor-end");
    let shown = String::from_utf8_lossy(&captured);
    for s in secrets {
        assert!(!contains(&captured, s), "MONITOR shows a token:\n{shown}");
    }
    let redacted = shown.matches("(redacted)").count();
    assert!(redacted >= sent, "{redacted} of {sent} redacted:\n{shown}");

    let slowlog = q!(&mut con, "SLOWLOG", "GET", 1000);
    for s in secrets {
        assert!(
            !reply_contains(&slowlog, s),
            "SLOWLOG shows a token: {slowlog:?}"
        );
    }
    assert!(reply_contains(&slowlog, b"(redacted)"), "{slowlog:?}");
    if flavor.is_valkey() {
        let large = q!(&mut con, "COMMANDLOG", "GET", 1000, "large-request");
        assert!(reply_contains(&large, b"(redacted)"), "{large:?}");
        for s in secrets {
            assert!(
                !reply_contains(&large, s),
                "COMMANDLOG shows a token: {large:?}"
            );
        }
    }
    // The whole log, written at debug level.
    let log = server.log();
    for s in secrets {
        let s = String::from_utf8_lossy(s);
        assert!(!log.contains(s.as_ref()), "the log shows {s}:\n{log}");
    }
});

for_each_server!(tokens_of_refused_commands_are_hidden_too, |flavor| {
    // A command the module refuses still carried a token its client holds (a client
    // library that added TOKEN twice, a LEASE command wrapped in LEASE.FENCE).
    let server = Server::start(flavor);
    let mut con = server.client();
    let secret = b"SECRET-refused-c0de";
    let monitor = Monitor::start(&server);
    for c in [
        cmd(&[
            &b"LEASE.ACQUIRE"[..],
            b"k",
            b"100",
            b"TOKEN",
            b"a",
            b"TOKEN",
            secret,
        ]),
        cmd(&[
            &b"LEASE.ACQUIRE"[..],
            b"k",
            b"100",
            b"TOKEN",
            secret,
            b"TOKEN",
            secret,
        ]),
        cmd(&[
            &b"LEASE.FENCE"[..],
            b"r",
            b"1",
            b"LEASE.RELEASE",
            b"k",
            secret,
        ]),
        cmd(&[
            &b"LEASE.FENCE"[..],
            b"r",
            b"1",
            b"LEASE.ACQUIRE",
            b"k",
            b"1",
            b"TOKEN",
            secret,
        ]),
    ] {
        let reply = send(&mut con, &c);
        assert!(error_text(&reply).is_some(), "{}: {reply:?}", describe(&c));
    }
    q!(&mut con, "ECHO", "hostile-monitor-end");
    let captured = monitor.capture_until(b"hostile-monitor-end");
    assert!(
        !contains(&captured, secret),
        "MONITOR shows the token of a refused command:\n{}",
        String::from_utf8_lossy(&captured)
    );
});

// ---------------------------------------------------------------------------------------
// Limits
// ---------------------------------------------------------------------------------------

for_each_server!(argument_limits_are_clear_errors, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    take(&mut con, "held", MINUTE, b"t");
    let big = vec![b'x'; 10 << 20];
    let cases: Vec<(redis::Cmd, &str)> = vec![
        (
            cmd(&[&b"LEASE.ACQUIRE"[..], b"k", b"100", b"TOKEN", &[b'x'; 257]]),
            TOKEN_ERR,
        ),
        (
            cmd(&[
                &b"LEASE.ACQUIRE"[..],
                b"k",
                b"100",
                b"TOKEN",
                big.as_slice(),
            ]),
            TOKEN_ERR,
        ),
        (
            cmd(&[&b"LEASE.ACQUIRE"[..], b"k", b"100", b"TOKEN", b""]),
            TOKEN_ERR,
        ),
        (
            cmd(&[&b"LEASE.RENEW"[..], b"held", big.as_slice(), b"100"]),
            TOKEN_ERR,
        ),
        (
            cmd(&[&b"LEASE.RELEASE"[..], b"held", &[b'x'; 257]]),
            TOKEN_ERR,
        ),
        (cmd(&["LEASE.ACQUIRE", "k", "0"]), TTL_ERR),
        (cmd(&["LEASE.ACQUIRE", "k", "1099511627777"]), TTL_ERR),
        (
            cmd(&["LEASE.ACQUIRE", "k", "18446744073709551616"]),
            TTL_ERR,
        ),
        (cmd(&["LEASE.ACQUIRE", "k", "-1"]), TTL_ERR),
        (cmd(&["LEASE.ACQUIRE", "k", "0100"]), TTL_ERR),
        (cmd(&["LEASE.ACQUIRE", "k", "1e3"]), TTL_ERR),
        (cmd(&["LEASE.ACQUIRE", "k", " 100"]), TTL_ERR),
        (cmd(&["LEASE.RENEW", "held", "t", "1099511627777"]), TTL_ERR),
        (
            cmd(&["LEASE.ACQUIRE", "k", "100", "BLOCK", "1099511627777"]),
            BLOCK_ERR,
        ),
        (
            cmd(&["LEASE.ACQUIRE", "k", "100", "BLOCK", "00"]),
            BLOCK_ERR,
        ),
        (cmd(&["LEASE.ACQUIRE", "k", "100", "BLOCK"]), SYNTAX_ERR),
        (cmd(&["LEASE.FENCE", "r", "9007199254740992"]), FENCE_ERR),
        (cmd(&["LEASE.FENCE", "r", "01"]), FENCE_ERR),
        (cmd(&["LEASE.FENCE", "r", "-0"]), FENCE_ERR),
    ];
    for (c, expected) in &cases {
        refused_exactly(&server, &mut con, c, expected);
    }
    // The limits themselves are accepted.
    take(&mut con, "max", MAX_TTL, &[b'x'; 256]);
    assert_eq!(
        int(
            q!(&mut con, "LEASE.RENEW", "max", &[b'x'; 256][..], MAX_TTL),
            "RENEW"
        ),
        1
    );
    let reply = q!(&mut con, "LEASE.FENCE", "r", FENCE_LIMIT - 1);
    assert_eq!(reply, Value::Int((FENCE_LIMIT - 1) as i64));
});

for_each_server!(waiters_per_key_are_bounded, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    assert_ok(
        q!(&mut con, "CONFIG", "SET", "lease.max-waiters", 2),
        "max-waiters",
    );
    let e = expect_error(
        &q!(&mut con, "CONFIG", "SET", "lease.max-waiters", 0),
        "max-waiters 0",
    );
    assert!(e.starts_with("ERR"), "{e}");
    take(&mut con, "busy", MINUTE, b"holder");
    let waiters: Vec<_> = (0..2i64)
        .map(|i| {
            let mut c = server.client();
            let token = format!("waiter-{i}");
            let handle = thread::spawn(move || {
                q!(
                    &mut c,
                    "LEASE.ACQUIRE",
                    "busy",
                    MINUTE,
                    "TOKEN",
                    &token,
                    "BLOCK",
                    0
                )
            });
            wait_until("the waiter to block", WAIT, || {
                lease_info(&mut con, "busy").is_some_and(|info| info.waiters == i + 1)
            });
            handle
        })
        .collect();
    let c = cmd(&[
        "LEASE.ACQUIRE",
        "busy",
        "60000",
        "TOKEN",
        "third",
        "BLOCK",
        "0",
    ]);
    refused_exactly(&server, &mut con, &c, WAITERS_ERR);
    // Without BLOCK the third caller just hears "busy"; another key has its own queue.
    assert_eq!(
        q!(&mut con, "LEASE.ACQUIRE", "busy", MINUTE, "TOKEN", "third"),
        Value::Nil
    );
    take(&mut con, "other", MINUTE, b"holder");
    let mut other = server.client();
    let other_waiter = thread::spawn(move || {
        q!(
            &mut other,
            "LEASE.ACQUIRE",
            "other",
            MINUTE,
            "TOKEN",
            "w",
            "BLOCK",
            0
        )
    });
    wait_until("the other waiter", WAIT, || {
        lease_info(&mut con, "other").is_some_and(|i| i.waiters == 1)
    });
    // The queue drains in order, and a place frees up for a new waiter.
    assert_eq!(
        int(q!(&mut con, "LEASE.RELEASE", "busy", "holder"), "RELEASE"),
        1
    );
    let mut waiters = waiters.into_iter();
    let first = waiters.next().expect("first").join().expect("first waiter");
    assert!(reply_contains(&first, b"waiter-0"), "{first:?}");
    assert_eq!(lease_info(&mut con, "busy").map(|i| i.waiters), Some(1));
    assert_eq!(
        int(q!(&mut con, "LEASE.RELEASE", "busy", "waiter-0"), "RELEASE"),
        1
    );
    let second = waiters
        .next()
        .expect("second")
        .join()
        .expect("second waiter");
    assert!(reply_contains(&second, b"waiter-1"), "{second:?}");
    assert_eq!(
        int(q!(&mut con, "LEASE.RELEASE", "other", "holder"), "RELEASE"),
        1
    );
    let third = other_waiter.join().expect("other waiter");
    assert!(reply_contains(&third, b"w"), "{third:?}");
    ping(&mut con, "the waiters");
});

for_each_server!(
    fence_refuses_recursion_and_forbidden_inner_commands,
    |flavor| {
        let server = Server::start(flavor);
        let mut con = server.client();
        assert_ok(q!(&mut con, "SET", "k", "v"), "SET");
        assert_eq!(q!(&mut con, "LEASE.FENCE", "res", 10), Value::Int(10));
        take(&mut con, "lock", MINUTE, b"t");
        let fence = |inner: &[&[u8]]| {
            let mut c = cmd(&["LEASE.FENCE", "res", "11"]);
            for a in inner {
                c.arg(*a);
            }
            c
        };
        // Recursion and LEASE commands, in any spelling.
        for inner in [
            &[&b"LEASE.FENCE"[..], b"res2", b"1"][..],
            &[b"lease.fence", b"res", b"12", b"SET", b"k", b"w"],
            &[b"Lease.Acquire", b"lock2", b"100"],
            &[b"LEASE.RELEASE", b"lock", b"t"],
            &[b"LEASE.RENEW", b"lock", b"t", b"100"],
            &[b"LEASE.INFO", b"lock"],
            &[b"LEASE.APPLY", b"lock", b"1", b"0", b""],
        ] {
            refused_exactly(&server, &mut con, &fence(inner), NESTED_ERR);
        }
        // Blocking, scripting, transaction, admin and dangerous commands.
        let forbidden_inner: Vec<(&[&[u8]], &str)> = vec![
            (&[b"BLPOP", b"l", b"0"], "BLPOP"),
            (&[b"BRPOPLPUSH", b"a", b"b", b"0"], "BRPOPLPUSH"),
            (&[b"XREAD", b"BLOCK", b"0", b"STREAMS", b"s", b"$"], "XREAD"),
            (&[b"WAIT", b"1", b"0"], "WAIT"),
            (&[b"EVAL", b"return 1", b"0"], "EVAL"),
            (&[b"FCALL", b"f", b"0"], "FCALL"),
            (&[b"SCRIPT", b"FLUSH"], "SCRIPT"),
            (&[b"FUNCTION", b"FLUSH"], "FUNCTION"),
            (&[b"MULTI"], "MULTI"),
            (&[b"EXEC"], "EXEC"),
            (&[b"WATCH", b"k"], "WATCH"),
            (&[b"SUBSCRIBE", b"ch"], "SUBSCRIBE"),
            (&[b"MONITOR"], "MONITOR"),
            (&[b"CONFIG", b"SET", b"maxmemory", b"1"], "CONFIG"),
            (&[b"config", b"get", b"maxmemory"], "config"),
            (&[b"CLIENT", b"KILL", b"TYPE", b"normal"], "CLIENT"),
            (&[b"ACL", b"SETUSER", b"evil", b"on", b"+@all"], "ACL"),
            (&[b"SHUTDOWN", b"NOSAVE"], "SHUTDOWN"),
            (&[b"DEBUG", b"SLEEP", b"0"], "DEBUG"),
            (&[b"MODULE", b"LIST"], "MODULE"),
            (&[b"REPLICAOF", b"NO", b"ONE"], "REPLICAOF"),
            (&[b"FLUSHALL"], "FLUSHALL"),
            (&[b"FLUSHDB"], "FLUSHDB"),
            (&[b"KEYS", b"*"], "KEYS"),
            (&[b"SWAPDB", b"0", b"1"], "SWAPDB"),
            (&[b"RESTORE", b"x", b"0", b"payload"], "RESTORE"),
            (
                &[b"MIGRATE", b"127.0.0.1", b"1", b"k", b"0", b"10"],
                "MIGRATE",
            ),
            (&[b"SAVE"], "SAVE"),
            (&[b"BGREWRITEAOF"], "BGREWRITEAOF"),
        ];
        for (inner, name) in &forbidden_inner {
            refused_exactly(&server, &mut con, &fence(inner), &forbidden(name));
        }
        // Unknown commands, NUL bytes in the name.
        for inner in [
            &[&b"NOSUCHCOMMAND"[..]][..],
            &[b""],
            &[b"SET\0", b"k", b"x"],
            &[b"S\0ET", b"k", b"x"],
            &[b"lease\0.fence", b"res", b"12"],
        ] {
            refused_exactly(&server, &mut con, &fence(inner), UNKNOWN_INNER_ERR);
        }
        // A container without its subcommand runs as itself (COMMAND does); CONFIG
        // alone is the server's own arity error, and nothing is recorded.
        refused(&server, &mut con, &fence(&[b"CONFIG"]), |e| {
            e == "ERR wrong number of arguments for 'config' command"
        });
        // The resource key itself, as any key of the inner command.
        for inner in [
            &[&b"SET"[..], b"res", b"x"][..],
            &[b"DEL", b"res"],
            &[b"UNLINK", b"k", b"res"],
            &[b"RENAME", b"k", b"res"],
            &[b"RENAME", b"res", b"moved"],
            &[b"COPY", b"res", b"copy"],
            &[b"EXPIRE", b"res", b"1"],
            &[b"MOVE", b"res", b"1"],
            &[b"MSET", b"a", b"1", b"res", b"2"],
        ] {
            refused_exactly(&server, &mut con, &fence(inner), RESOURCE_ERR);
        }
        // Still at 10: nothing above was recorded, and an allowed command runs.
        let reply = q!(&mut con, "LEASE.FENCE", "res", 9);
        assert_eq!(
            expect_error(&reply, "fence 9"),
            "STALE fencing token 9 is older than 10"
        );
        assert_ok(
            q!(&mut con, "LEASE.FENCE", "res", 11, "SET", "k", "w"),
            "FENCE SET",
        );
        assert_eq!(text(q!(&mut con, "GET", "k"), "GET"), "w");
    }
);

for_each_server!(huge_argument_counts, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    let n = 100_000;
    // LEASE.ACQUIRE with 100k options: a syntax error, whatever they are.
    let mut c = cmd(&["LEASE.ACQUIRE", "k", "1000"]);
    for _ in 0..n / 2 {
        c.arg("TOKEN").arg("t");
    }
    refused_exactly(&server, &mut con, &c, SYNTAX_ERR);
    let mut c = cmd(&["LEASE.ACQUIRE", "k", "1000"]);
    for i in 0..n {
        c.arg(i);
    }
    refused_exactly(&server, &mut con, &c, SYNTAX_ERR);
    // Fixed-arity commands: the server's arity error.
    for name in ["LEASE.RENEW", "LEASE.RELEASE", "LEASE.INFO"] {
        let mut c = cmd(&[name, "k"]);
        for i in 0..n {
            c.arg(i);
        }
        refused(&server, &mut con, &c, |e| {
            e.contains("wrong number of arguments")
        });
    }
    // LEASE.FENCE with an inner MSET of 100k arguments: refused before it runs (the
    // inner command is capped at 256 arguments), nothing written.
    let dbsize = int(q!(&mut con, "DBSIZE"), "DBSIZE");
    let mut c = cmd(&["LEASE.FENCE", "res", "7", "MSET"]);
    for i in 0..n / 2 {
        c.arg(format!("key:{i}")).arg(i);
    }
    refused_exactly(&server, &mut con, &c, TOO_MANY_INNER_ERR);
    assert_eq!(int(q!(&mut con, "DBSIZE"), "DBSIZE"), dbsize);
    // COMMAND GETKEYS of it: only the resource; its inner keys are never extracted.
    let mut c = cmd(&["COMMAND", "GETKEYS", "LEASE.FENCE", "res", "8", "MSET"]);
    for i in 0..n / 2 {
        c.arg(format!("key:{i}")).arg(i);
    }
    match send(&mut con, &c) {
        Value::Array(keys) => assert_eq!(keys.len(), 1),
        other => panic!("COMMAND GETKEYS: {other:?}"),
    }
    // At the cap it runs, all of it: 128 key/value pairs.
    let mut c = cmd(&["LEASE.FENCE", "res", "9", "MSET"]);
    for i in 0..128 {
        c.arg(format!("key:{i}")).arg(i);
    }
    assert_ok(send(&mut con, &c), "LEASE.FENCE res 9 MSET <256 args>");
    assert_eq!(text(q!(&mut con, "GET", "key:127"), "GET"), "127");
    let digits = "9".repeat(n as usize);
    let c = cmd(&["LEASE.FENCE", "res", digits.as_str()]);
    refused_exactly(&server, &mut con, &c, FENCE_ERR);
    let c = cmd(&["LEASE.ACQUIRE", "k", digits.as_str()]);
    refused_exactly(&server, &mut con, &c, TTL_ERR);
    assert_eq!(q!(&mut con, "LEASE.FENCE", "res", 9), Value::Int(9));
});

/// `used_memory` of `INFO memory`.
fn used_memory(server: &Server) -> i64 {
    info_number(server, "memory", "used_memory") as i64
}

for_each_server!(fence_with_many_inner_keys_does_not_leak, |flavor| {
    // The inner command's keys are looked up for every call (and for key ACLs and
    // cluster routing): whatever that costs must be given back, or any client with
    // LEASE.FENCE grows the server's memory without bound. Past 256 keys the servers'
    // key extraction leaks, so the module caps the inner command at 256 arguments.
    let server = Server::start(flavor);
    let mut con = server.client();
    let mut big = cmd(&["LEASE.FENCE", "res", "1", "MSET"]);
    for i in 0..10_000 {
        big.arg(format!("key:{i}")).arg("v");
    }
    let keys = 128;
    let mut c = cmd(&["LEASE.FENCE", "res", "1", "MSET"]);
    for i in 0..keys {
        c.arg(format!("key:{i}")).arg("v");
    }
    assert_ok(send(&mut con, &c), "the first MSET");
    let before = used_memory(&server);
    let calls = 2_000;
    for _ in 0..calls {
        // The same keys and values again: the dataset does not grow.
        assert_ok(send(&mut con, &c), "LEASE.FENCE res 1 MSET <128 keys>");
    }
    for _ in 0..20 {
        refused_exactly(&server, &mut con, &big, TOO_MANY_INNER_ERR);
    }
    let grown = used_memory(&server) - before;
    // 16 bytes a key and call would be 4 MB; allow a tenth of it for the allocator.
    assert!(
        grown < 16 * keys * calls / 10,
        "used_memory grew by {grown} bytes over {calls} calls of {keys} inner keys"
    );
});

for_each_server!(
    a_refused_restore_leaves_the_fence_sequence_alone,
    |flavor| {
        // The value decodes, then Redis refuses the payload (a value after the module's
        // fields, where the EOF marker belongs): nothing of it may stay behind, least of
        // all a fence sequence pushed to 2^53 - 1, after which no lease can be granted.
        let server = Server::start(flavor);
        let mut con = server.client();
        take(&mut con, "lease:src", MINUTE, b"t");
        let Dump { body: _, version } = dump(&mut con, "lease:src");
        let last = lease_stat(&server, "fence_last");
        let top = FENCE_LIMIT - 1;
        let cases = [
            (
                "a fence-rec",
                Body::new("fence-rec", 1)
                    .unsigned(top - 10)
                    .unsigned(7)
                    .eof(),
            ),
            (
                "a lease-key",
                Body::new("lease-key", 1)
                    .unsigned(top)
                    .unsigned(now_ms() + MINUTE)
                    .string(b"t")
                    .unsigned(7)
                    .eof(),
            ),
        ];
        let mut moved = Vec::new();
        for (what, body) in cases {
            let before = lease_stat(&server, "fence_last");
            let mut c = cmd(&["RESTORE", "victim", "0"]);
            c.arg(seal(&body.0, version));
            let error = refused(&server, &mut con, &c, |e| e.starts_with("ERR"));
            assert!(error.contains("Bad data format"), "{what}: {error}");
            let after = lease_stat(&server, "fence_last");
            if after != before {
                moved.push(format!(
                    "a refused RESTORE of {what}: fence_last {before} -> {after}"
                ));
            }
        }
        assert!(moved.is_empty(), "{moved:#?} (it was {last})");
        let reply = q!(&mut con, "LEASE.ACQUIRE", "lease:new", MINUTE);
        assert!(error_text(&reply).is_none(), "{reply:?}");
    }
);
