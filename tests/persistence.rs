//! Leases, resource records and the fence sequence survive every way a server
//! persists and reloads its data: `DEBUG RELOAD`, an RDB and a restart, AOF replay after
//! a crash (fsync `always` and `everysec`), AOF rewrites with and without the RDB
//! preamble, and `DUMP`/`RESTORE`. An expired lease is never revived, and a corrupt
//! payload is refused without taking the server down.

#[macro_use]
extern crate harness;

use std::fs;
use std::path::PathBuf;
use std::time::Duration;

use harness::calls::{
    acquire, acquire_new, call, exists, fenced, int, release, renew, restore,
    sanitize_dump_payload, select, stale, text, NONE,
};
use harness::lease::{dump, fence_ahead, lease_dump, lease_info, lease_stat, record_dump};
use harness::rdb::seal;
use harness::reply::error_text;
use harness::{info_field, now_ms, wait_until, Server, ServerOptions};
use redis::{Connection, Value};

// ---------------------------------------------------------------------------
// Commands

/// Lets the wall clock move on by `ms`: a deadline that a load wrongly reset to
/// now+ttl then shows in the ttl. This waits for time itself, not for the server.
fn let_clock_advance(ms: u64) {
    let until = now_ms() + ms;
    wait_until("the wall clock to move on", Duration::from_secs(5), || {
        now_ms() >= until
    });
}

// ---------------------------------------------------------------------------
// What a test expects to find after a reload

/// A lease the test holds, with the window its absolute deadline must lie in (measured
/// on this machine's clock, which the server shares).
#[derive(Debug, Clone)]
struct Held {
    db: i64,
    key: String,
    token: String,
    fence: u64,
    ttl: u64,
    earliest: u64,
    latest: u64,
}

fn grant(con: &mut Connection, db: i64, key: &str, ttl: u64, token: Option<&str>) -> Held {
    select(con, db);
    let before = now_ms();
    let granted = match token {
        Some(t) => acquire(con, key, ttl, t).map(|fence| (t.to_string(), fence)),
        None => acquire_new(con, key, ttl)
            .map(|(t, fence)| (String::from_utf8_lossy(&t).into_owned(), fence)),
    };
    let (token, fence) =
        granted.unwrap_or_else(|| panic!("LEASE.ACQUIRE {key} (db {db}) was refused"));
    let after = now_ms();
    select(con, 0);
    Held {
        db,
        key: key.to_string(),
        token,
        fence,
        ttl,
        earliest: before + ttl,
        latest: after + ttl,
    }
}

fn renew_held(con: &mut Connection, held: &mut Held, ttl: u64) {
    select(con, held.db);
    let before = now_ms();
    assert_eq!(
        renew(con, &held.key, &held.token, ttl),
        1,
        "renew {}",
        held.key
    );
    let after = now_ms();
    select(con, 0);
    held.ttl = ttl;
    held.earliest = before + ttl;
    held.latest = after + ttl;
}

/// The lease is there with its token, fence and deadline: INFO agrees, another token is
/// refused, the holder's retry repeats the fence and its renewal succeeds.
fn check_held(con: &mut Connection, held: &mut Held, when: &str) {
    let key = held.key.clone();
    select(con, held.db);
    assert_eq!(
        text(call(con, "TYPE", &key)),
        "lease-key",
        "{when}: TYPE {key}"
    );
    let before = now_ms();
    let info = lease_info(con, &key)
        .unwrap_or_else(|| panic!("{when}: LEASE.INFO {key} (db {}) is nil", held.db));
    let after = now_ms();
    assert_eq!(info.state, "held", "{when}: {key}: {info:?}");
    assert_eq!(info.fence, held.fence, "{when}: fence of {key}");
    // The server computes ttl = deadline - its now, both on the shared clock.
    let low = held.earliest as i64 - after as i64 - 1;
    let high = held.latest as i64 - before as i64 + 1;
    assert!(
        (low..=high).contains(&info.ttl),
        "{when}: {key} has ttl {} ms; its deadline puts it in {low}..={high} (a deadline reset \
         on load would show as more)",
        info.ttl
    );
    assert_eq!(
        acquire(con, &key, 1_000, "someone-else"),
        None,
        "{when}: another token got {key}"
    );
    let before = now_ms();
    assert_eq!(
        acquire(con, &key, held.ttl, &held.token),
        Some(held.fence),
        "{when}: the holder's retry on {key} must repeat its fence"
    );
    let after = now_ms();
    held.earliest = before + held.ttl;
    held.latest = after + held.ttl;
    select(con, 0);
    let ttl = held.ttl;
    renew_held(con, held, ttl);
}

/// The record is there and remembers `highest`: a lower fence is STALE, an equal one is
/// accepted.
fn check_record(con: &mut Connection, resource: &str, highest: u64, when: &str) {
    assert_eq!(
        text(call(con, "TYPE", resource)),
        "fence-rec",
        "{when}: TYPE {resource}"
    );
    let reply = fenced(con, resource, highest - 1, NONE);
    assert_eq!(
        error_text(&reply).as_deref(),
        Some(stale(highest - 1, highest).as_str()),
        "{when}: {resource} must still remember {highest}"
    );
    assert_eq!(
        fenced(con, resource, highest, NONE),
        Value::Int(highest as i64),
        "{when}: {resource} must accept its highest fence again"
    );
}

/// Everything a test wrote, to be found again after each reload.
#[derive(Debug, Default)]
struct World {
    held: Vec<Held>,
    /// Released lease keys: (key, last fence issued for it).
    released: Vec<(String, u64)>,
    /// Resource records: (key, highest fence accepted).
    records: Vec<(String, u64)>,
    /// Plain keys written through LEASE.FENCE: (key, value or None if never written).
    data: Vec<(String, Option<String>)>,
    max_fence: u64,
    new_keys: usize,
}

impl World {
    fn saw(&mut self, fence: u64) {
        self.max_fence = self.max_fence.max(fence);
    }

    fn add(&mut self, held: Held) {
        self.saw(held.fence);
        self.held.push(held);
    }

    fn held_mut(&mut self, key: &str) -> &mut Held {
        self.held
            .iter_mut()
            .find(|h| h.key == key && h.db == 0)
            .unwrap_or_else(|| panic!("the test holds no {key}"))
    }

    fn release(&mut self, con: &mut Connection, key: &str) {
        let at = self
            .held
            .iter()
            .position(|h| h.key == key && h.db == 0)
            .unwrap_or_else(|| panic!("the test holds no {key}"));
        let held = self.held.remove(at);
        assert_eq!(release(con, key, &held.token), 1, "release {key}");
        self.released.push((held.key, held.fence));
    }

    fn record(&mut self, resource: &str, highest: u64) {
        match self.records.iter_mut().find(|(r, _)| r == resource) {
            Some(r) => r.1 = highest,
            None => self.records.push((resource.to_string(), highest)),
        }
    }

    fn set_data(&mut self, key: &str, value: Option<&str>) {
        let value = value.map(str::to_string);
        match self.data.iter_mut().find(|(k, _)| k == key) {
            Some(d) => d.1 = value,
            None => self.data.push((key.to_string(), value)),
        }
    }
}

/// Leases held (one renewed, one with a generated token, one in db 1), one released,
/// two resource records (one through a fenced SET), and a STALE write that changed
/// nothing.
fn populate(con: &mut Connection) -> World {
    let mut world = World::default();
    let a = grant(con, 0, "lease:a", 60_000, Some("token-a"));
    let mut b = grant(con, 0, "lease:b", 20_000, Some("token-b"));
    renew_held(con, &mut b, 90_000);
    let c = grant(con, 0, "lease:c", 60_000, Some("token-c"));
    let d = grant(con, 0, "lease:d", 60_000, None);
    assert_eq!(d.token.len(), 32, "a generated token is 32 hex characters");
    let a1 = grant(con, 1, "lease:a", 45_000, Some("token-a-db1"));
    // Tokens the module keeps in compact form (a UUID) or in a buffer of their
    // own (longer than 16 bytes, not lowercase hex): each must come back as sent.
    let u = grant(
        con,
        0,
        "lease:uuid",
        60_000,
        Some("123e4567-e89b-12d3-a456-426614174000"),
    );
    let h = grant(
        con,
        0,
        "lease:upper-hex",
        60_000,
        Some("0123456789ABCDEF0123456789abcdef"),
    );
    let r = grant(
        con,
        1,
        "lease:long",
        60_000,
        Some("6b1f0d2e-93a4-4c55-b0e1-3f7d2c9a8b10:thread-17"),
    );
    let (fa, fb) = (a.fence, b.fence);
    world.add(a);
    world.add(b);
    world.add(c);
    world.add(d);
    world.add(a1);
    world.add(u);
    world.add(h);
    world.add(r);
    world.release(con, "lease:c");

    assert_eq!(
        fenced(con, "res:1", fa, ("SET", "data:1", "v1")),
        Value::Okay
    );
    world.record("res:1", fa);
    world.set_data("data:1", Some("v1"));
    assert_eq!(fenced(con, "res:2", fb, NONE), Value::Int(fb as i64));
    world.record("res:2", fb);
    assert!(fa < fb, "fences rise: {fa} then {fb}");
    let reply = fenced(con, "res:2", fa, ("SET", "data:2", "stale"));
    assert_eq!(error_text(&reply), Some(stale(fa, fb)));
    world.set_data("data:2", None);

    let_clock_advance(50);
    world
}

/// More of everything after a first reload: a renewal, a release, a fenced overwrite.
fn write_more(con: &mut Connection, world: &mut World) {
    renew_held(con, world.held_mut("lease:a"), 120_000);
    world.release(con, "lease:d");
    let e = grant(con, 0, "lease:e", 70_000, Some("token-e"));
    let fe = e.fence;
    world.add(e);
    assert_eq!(
        fenced(con, "res:1", fe, ("SET", "data:1", "v2")),
        Value::Okay
    );
    world.record("res:1", fe);
    world.set_data("data:1", Some("v2"));
    let_clock_advance(50);
}

/// Checks every lease, released key, record and data key of `world`, then that new
/// grants (on a new key and on every released key) get fences above all earlier ones.
fn verify(server: &Server, con: &mut Connection, world: &mut World, when: &str) {
    // The gauges count a value until it is freed, which a server with lazy freeing
    // (Valkey 9's DEBUG RELOAD) does in a background thread a moment after the reload.
    let expected = (world.held.len() as u64, world.records.len() as u64);
    let gauges = format!("{when}: INFO lease_keys, lease_resource_keys at {expected:?}");
    wait_until(&gauges, Duration::from_secs(5), || {
        let seen = (
            lease_stat(server, "keys"),
            lease_stat(server, "resource_keys"),
        );
        seen == expected
    });
    for held in world.held.iter_mut() {
        check_held(con, held, when);
    }
    for (key, _) in &world.released {
        assert_eq!(
            lease_info(con, key),
            None,
            "{when}: released {key} came back"
        );
    }
    for (resource, highest) in &world.records {
        check_record(con, resource, *highest, when);
    }
    for (key, value) in &world.data {
        let got: Option<String> = match call(con, "GET", key) {
            Value::Nil => None,
            v => Some(text(v)),
        };
        assert_eq!(&got, value, "{when}: GET {key}");
    }
    let last = lease_stat(server, "fence_last");
    assert!(
        last >= world.max_fence,
        "{when}: lease_fence_last {last} is below the fence {} issued before",
        world.max_fence
    );

    world.new_keys += 1;
    let key = format!("lease:new{}", world.new_keys);
    let fresh = grant(con, 0, &key, 60_000, Some("token-new"));
    assert!(
        fresh.fence > world.max_fence,
        "{when}: a new grant got fence {}, not above {}",
        fresh.fence,
        world.max_fence
    );
    world.add(fresh);
    let released = std::mem::take(&mut world.released);
    for (key, old) in released {
        let again = grant(con, 0, &key, 60_000, Some("token-again"));
        assert!(
            again.fence > old && again.fence > world.max_fence,
            "{when}: {key} re-granted with fence {} after {old} (highest issued {})",
            again.fence,
            world.max_fence
        );
        world.saw(again.fence);
        assert_eq!(release(con, &key, "token-again"), 1);
        world.released.push((key, again.fence));
    }
}

// ---------------------------------------------------------------------------
// AOF files

fn aof_options(fsync: &str) -> ServerOptions {
    ServerOptions::new()
        .config("appendonly", "yes")
        .config("appendfsync", fsync)
}

/// The base file the AOF manifest names (`file <name> seq <n> type b`).
fn aof_base(server: &Server) -> Option<PathBuf> {
    aof_file(server, "b")
}

/// The file of `kind` the AOF manifest names: `b` base, `i` incremental (where new
/// writes go).
fn aof_file(server: &Server, kind: &str) -> Option<PathBuf> {
    let dir = server.dir.join("appendonlydir");
    let manifest = fs::read_to_string(dir.join("appendonly.aof.manifest")).ok()?;
    manifest.lines().find_map(|line| {
        let words: Vec<&str> = line.split_whitespace().collect();
        let name = words.windows(2).find(|w| w[0] == "file")?[1];
        words
            .windows(2)
            .any(|w| w[0] == "type" && w[1] == kind)
            .then(|| dir.join(name))
    })
}

/// `BGREWRITEAOF`, and waits until the new base file is in the manifest.
fn rewrite_aof(server: &Server, con: &mut Connection) -> PathBuf {
    let before = aof_base(server);
    let reply = call(con, "BGREWRITEAOF", NONE);
    assert!(error_text(&reply).is_none(), "BGREWRITEAOF: {reply:?}");
    wait_until("the AOF rewrite to finish", Duration::from_secs(10), || {
        let info = server.info("persistence");
        info_field(&info, "aof_rewrite_in_progress").as_deref() == Some("0")
            && info_field(&info, "aof_rewrite_scheduled").as_deref() == Some("0")
            && aof_base(server) != before
    });
    assert_eq!(
        server
            .info_field("persistence", "aof_last_bgrewrite_status")
            .as_deref(),
        Some("ok")
    );
    aof_base(server).unwrap_or_else(|| panic!("no base file in the AOF manifest"))
}

/// With `appendfsync everysec` a reply can go out while its bytes still sit in the
/// server's AOF buffer: the write is postponed (up to 2 s) while a background fsync
/// runs. kill -9 loses only what is not yet written to the file (the kernel keeps the
/// rest), so wait until the buffer is empty and no fsync is pending.
fn wait_aof_written(server: &Server) {
    wait_until(
        "the AOF buffer to reach the file",
        Duration::from_secs(5),
        || {
            let info = server.info("persistence");
            info_field(&info, "aof_buffer_length").as_deref() == Some("0")
                && info_field(&info, "aof_pending_bio_fsync").as_deref() == Some("0")
        },
    );
}

// ---------------------------------------------------------------------------
// DUMP payloads (their format: model/src/rdb.rs)

/// A corrupt payload is refused with an error, creates nothing, and the server lives.
fn assert_refused(con: &mut Connection, payload: &[u8], what: &str) {
    let reply = restore(con, "victim", payload);
    let error =
        error_text(&reply).unwrap_or_else(|| panic!("RESTORE of {what} answered {reply:?}"));
    assert!(
        error.starts_with("ERR") && error.contains("Bad data format"),
        "RESTORE of {what}: {error}"
    );
    assert_eq!(
        text(call(con, "PING", NONE)),
        "PONG",
        "after RESTORE of {what}"
    );
    assert!(!exists(con, "victim"), "RESTORE of {what} created the key");
}

// ---------------------------------------------------------------------------
// DEBUG RELOAD, RDB

for_each_server!(debug_reload_keeps_leases_records_and_fences, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    let mut world = populate(&mut con);
    assert_eq!(call(&mut con, "DEBUG", "RELOAD"), Value::Okay);
    verify(&server, &mut con, &mut world, "after DEBUG RELOAD");
    write_more(&mut con, &mut world);
    assert_eq!(call(&mut con, "DEBUG", "RELOAD"), Value::Okay);
    verify(&server, &mut con, &mut world, "after a second DEBUG RELOAD");
});

for_each_server!(shutdown_save_and_restart_keep_everything, |flavor| {
    let mut server = Server::start_with(flavor, ServerOptions::new().config("save", "3600 1"));
    let mut con = server.client();
    let mut world = populate(&mut con);
    drop(con);
    server.restart();
    let mut con = server.client();
    verify(&server, &mut con, &mut world, "after SHUTDOWN and restart");
    write_more(&mut con, &mut world);
    drop(con);
    server.restart();
    let mut con = server.client();
    verify(&server, &mut con, &mut world, "after a second restart");
});

for_each_server!(explicit_save_then_crash_keeps_the_saved_state, |flavor| {
    let mut server = Server::start(flavor);
    let mut con = server.client();
    let mut world = populate(&mut con);
    assert_eq!(call(&mut con, "SAVE", NONE), Value::Okay);
    // Granted after the save and lost in the crash. Nothing on disk remembers its
    // fence: only the clock floor keeps later fences above it (the documented clock
    // assumption), which a restart on the same machine meets.
    let lost = grant(&mut con, 0, "lease:lost", 60_000, Some("token-lost"));
    drop(con);
    server.kill9();
    server.start_again();
    let mut con = server.client();
    assert_eq!(
        lease_info(&mut con, "lease:lost"),
        None,
        "a write after SAVE survived"
    );
    verify(&server, &mut con, &mut world, "after SAVE and kill -9");
    let again = acquire(&mut con, "lease:lost", 60_000, "token-again").expect("grant");
    assert!(
        again > lost.fence,
        "fence {again} after the lost {}",
        lost.fence
    );
});

for_each_server!(
    fence_sequence_survives_a_restart_with_no_lease_key_left,
    |flavor| {
        let mut server = Server::start(flavor);
        let mut con = server.client();
        let first = grant(&mut con, 0, "lease:first", 60_000, Some("t"));
        let template = dump(&mut con, "lease:first");

        let ahead = fence_ahead();
        let payload = lease_dump(&template, ahead, now_ms() + 60_000, b"from-afar").payload();
        assert_eq!(restore(&mut con, "lease:ahead", &payload), Value::Okay);
        assert!(lease_stat(&server, "fence_last") >= ahead);
        let next = grant(&mut con, 0, "lease:next", 60_000, Some("t"));
        assert!(
            next.fence > ahead,
            "{} after a restored {ahead}",
            next.fence
        );
        assert!(next.fence > first.fence);

        // No lease key is left to carry a fence: only the RDB aux field can.
        assert_eq!(release(&mut con, "lease:next", "t"), 1);
        assert_eq!(release(&mut con, "lease:first", "t"), 1);
        assert_eq!(int(call(&mut con, "DEL", "lease:ahead")), 1);
        assert_eq!(int(call(&mut con, "DBSIZE", NONE)), 0);
        assert_eq!(call(&mut con, "SAVE", NONE), Value::Okay);
        drop(con);
        server.kill9();
        server.start_again();

        let mut con = server.client();
        assert_eq!(int(call(&mut con, "DBSIZE", NONE)), 0);
        let last = lease_stat(&server, "fence_last");
        assert!(
            last >= next.fence,
            "lease_fence_last {last} after restart; {} was issued before",
            next.fence
        );
        for key in ["lease:first", "lease:next", "lease:other"] {
            let again = grant(&mut con, 0, key, 60_000, Some("t2"));
            assert!(
                again.fence > next.fence,
                "{key} granted fence {} after restart; {} was issued before",
                again.fence,
                next.fence
            );
        }
    }
);

for_each_server!(expired_lease_in_an_rdb_is_not_revived, |flavor| {
    let mut server = Server::start(flavor);
    let mut con = server.client();
    // One transaction, so the reaper cannot run between the expiry and the save: the RDB
    // holds `lease:expired` expired but not reaped, and `lease:lapsing` still live.
    let before = now_ms();
    let replies: Vec<Value> = redis::pipe()
        .atomic()
        .cmd("LEASE.ACQUIRE")
        .arg(("lease:lapsing", 1_000, "TOKEN", "t-lapsing"))
        .cmd("LEASE.ACQUIRE")
        .arg(("lease:expired", 1, "TOKEN", "t-expired"))
        .cmd("DEBUG")
        .arg(("SLEEP", "0.01"))
        .cmd("DEBUG")
        .arg("RELOAD")
        .query(&mut con)
        .unwrap_or_else(|e| panic!("MULTI ... DEBUG RELOAD failed: {e}"));
    let after = now_ms();
    let fences: Vec<u64> = replies[..2]
        .iter()
        .map(|r| match r {
            Value::Array(items) => match items.as_slice() {
                [_, Value::Int(f)] => *f as u64,
                other => panic!("LEASE.ACQUIRE in MULTI: {other:?}"),
            },
            other => panic!("LEASE.ACQUIRE in MULTI: {other:?}"),
        })
        .collect();
    assert_eq!(replies[3], Value::Okay, "DEBUG RELOAD");
    assert!(
        after < before + 1_000,
        "too slow: lease:lapsing expired already"
    );
    drop(con);
    server.kill9();
    // `lease:lapsing` expires while the server is down.
    let deadline = after + 1_000;
    wait_until(
        "lease:lapsing to pass its deadline",
        Duration::from_secs(5),
        || now_ms() > deadline,
    );
    server.start_again();

    let mut con = server.client();
    for (key, token) in [
        ("lease:expired", "t-expired"),
        ("lease:lapsing", "t-lapsing"),
    ] {
        if let Some(info) = lease_info(&mut con, key) {
            assert_eq!(info.state, "free", "{key} after restart: {info:?}");
            assert_eq!(info.ttl, -1, "{key} after restart: {info:?}");
        }
        assert_eq!(renew(&mut con, key, token, 60_000), 0, "{key} revived");
        assert_eq!(release(&mut con, key, token), 0, "{key} revived");
    }
    // Both were in the RDB, and the reaper deletes them rather than bringing them back.
    wait_until(
        "both expired leases to be reaped",
        Duration::from_secs(5),
        || lease_stat(&server, "expired") == 2,
    );
    for (key, old) in [("lease:expired", fences[1]), ("lease:lapsing", fences[0])] {
        assert!(!exists(&mut con, key), "{key} still exists after reaping");
        let fresh = acquire(&mut con, key, 60_000, "newcomer")
            .unwrap_or_else(|| panic!("{key} is not free after restart"));
        assert!(fresh > old, "{key}: fence {fresh} after {old}");
    }
});

// ---------------------------------------------------------------------------
// AOF

for_each_server!(aof_fsync_always_replays_after_kill9, |flavor| {
    let mut server = Server::start_with(flavor, aof_options("always"));
    let mut con = server.client();
    let mut world = populate(&mut con);
    drop(con);
    server.kill9();
    server.start_again();
    let mut con = server.client();
    verify(&server, &mut con, &mut world, "after AOF replay");
    write_more(&mut con, &mut world);
    drop(con);
    server.kill9();
    server.start_again();
    let mut con = server.client();
    verify(&server, &mut con, &mut world, "after a second AOF replay");
});

for_each_server!(aof_fsync_everysec_replays_after_kill9, |flavor| {
    let mut server = Server::start_with(flavor, aof_options("everysec"));
    let mut con = server.client();
    let mut world = populate(&mut con);
    wait_aof_written(&server);
    drop(con);
    server.kill9();
    server.start_again();
    let mut con = server.client();
    verify(&server, &mut con, &mut world, "after AOF replay");
    write_more(&mut con, &mut world);
    wait_aof_written(&server);
    drop(con);
    server.kill9();
    server.start_again();
    let mut con = server.client();
    verify(&server, &mut con, &mut world, "after a second AOF replay");
});

fn rewrite_then_crash(flavor: harness::Flavor, preamble: &str) {
    let options = aof_options("always").config("aof-use-rdb-preamble", preamble);
    let mut server = Server::start_with(flavor, options);
    let mut con = server.client();
    let mut world = populate(&mut con);
    let base = rewrite_aof(&server, &mut con);
    let contents = fs::read(&base).unwrap_or_else(|e| panic!("{}: {e}", base.display()));
    let has = |needle: &[u8]| contents.windows(needle.len()).any(|w| w == needle);
    if preamble == "yes" {
        assert!(base.to_string_lossy().ends_with(".base.rdb"), "{base:?}");
        assert!(contents.starts_with(b"REDIS") || contents.starts_with(b"VALKEY"));
    } else {
        // The rewrite speaks commands: the AOF client must be let through to the
        // internal LEASE.APPLY on every server, Redis 8 (where it is flagged internal)
        // included.
        assert!(base.to_string_lossy().ends_with(".base.aof"), "{base:?}");
        assert!(has(b"LEASE.APPLY"), "no LEASE.APPLY in {}", base.display());
        assert!(has(b"LEASE.FENCE"), "no LEASE.FENCE in {}", base.display());
    }
    write_more(&mut con, &mut world);
    drop(con);
    server.kill9();
    server.start_again();
    let mut con = server.client();
    verify(
        &server,
        &mut con,
        &mut world,
        "after rewrite, more writes and kill -9",
    );
    assert!(
        !server.log().contains("redis-lease: refusing"),
        "{}",
        server.log()
    );
}

for_each_server!(aof_rewrite_with_rdb_preamble_then_kill9, |flavor| {
    rewrite_then_crash(flavor, "yes");
});

for_each_server!(aof_rewrite_without_rdb_preamble_then_kill9, |flavor| {
    rewrite_then_crash(flavor, "no");
});

for_each_server!(
    lease_expiring_while_down_is_free_after_aof_replay,
    |flavor| {
        let mut server = Server::start_with(flavor, aof_options("always"));
        let mut con = server.client();
        let held = grant(&mut con, 0, "lease:lapsing", 1_500, Some("t"));
        drop(con);
        // Killed while the lease is live: the AOF has its grant and no DEL.
        server.kill9();
        assert!(
            now_ms() < held.earliest,
            "too slow: the lease expired before the kill"
        );
        wait_until(
            "the lease to pass its deadline",
            Duration::from_secs(5),
            || now_ms() > held.latest,
        );
        server.start_again();
        let mut con = server.client();
        if let Some(info) = lease_info(&mut con, "lease:lapsing") {
            assert_eq!(info.state, "free", "{info:?}");
            assert_eq!(info.fence, held.fence, "{info:?}");
        }
        assert_eq!(renew(&mut con, "lease:lapsing", "t", 60_000), 0);
        wait_until(
            "the expired lease to be reaped",
            Duration::from_secs(5),
            || lease_stat(&server, "expired") == 1,
        );
        let fresh = acquire(&mut con, "lease:lapsing", 60_000, "newcomer")
            .unwrap_or_else(|| panic!("lease:lapsing is not free after replay"));
        assert!(fresh > held.fence, "fence {fresh} after {}", held.fence);
    }
);

// Grants and renewals go to replicas and the AOF as `LEASE.APPLY key fence:deadline
// token`; earlier versions wrote `LEASE.APPLY key fence deadline token`, and AOF files
// (and masters) from them must still replay.
for_each_server!(aof_effects_in_the_earlier_form_replay, |flavor| {
    let mut server = Server::start_with(flavor, aof_options("always"));
    let mut con = server.client();
    let mut current = grant(&mut con, 0, "lease:current", 60_000, Some("t-current"));
    drop(con);
    server.stop();
    let incr = aof_file(&server, "i").expect("an incremental AOF file");
    let mut contents = fs::read(&incr).unwrap_or_else(|e| panic!("{}: {e}", incr.display()));
    let state = format!("{}:", current.fence);
    let has = |needle: &[u8]| contents.windows(needle.len()).any(|w| w == needle);
    assert!(
        has(b"LEASE.APPLY") && has(state.as_bytes()),
        "the grant is not in the AOF as `fence:deadline`: {}",
        String::from_utf8_lossy(&contents)
    );

    let (fence, deadline) = (fence_ahead(), now_ms() + 60_000);
    let earlier_form = |key: &str, fence: u64, deadline: u64, token: &str| {
        redis::cmd("LEASE.APPLY")
            .arg(key)
            .arg(fence)
            .arg(deadline)
            .arg(token)
            .get_packed_command()
    };
    contents.extend(earlier_form("lease:earlier", fence, deadline, "t-earlier"));
    // A free record with the highest fence: only its fence shows it was read.
    let highest = fence + 5;
    contents.extend(earlier_form("lease:freed", highest, 0, ""));
    fs::write(&incr, &contents).unwrap_or_else(|e| panic!("{}: {e}", incr.display()));
    server.start_again();

    let mut con = server.client();
    let mut earlier = Held {
        db: 0,
        key: "lease:earlier".into(),
        token: "t-earlier".into(),
        fence,
        ttl: 60_000,
        earliest: deadline,
        latest: deadline,
    };
    check_held(&mut con, &mut earlier, "replayed from the earlier form");
    check_held(&mut con, &mut current, "replayed from the current form");
    // Nobody waits on it, so the reaper deletes it once loaded; until then it is
    // free with its fence.
    if let Some(freed) = lease_info(&mut con, "lease:freed") {
        assert_eq!((freed.state.as_str(), freed.fence), ("free", highest));
    }
    assert!(lease_stat(&server, "fence_last") >= highest);
    let next = acquire(&mut con, "lease:next", 60_000, "t").expect("a grant");
    assert!(next > highest, "fence {next} after a replayed {highest}");
});

// The replay at startup runs each command outside the server's call path; a release
// replayed before a grant (the base file an RDB preamble, so the first LEASE command
// in the AOF is the release) once crashed the server mid-load.
for_each_server!(aof_replay_of_a_release_before_a_grant, |flavor| {
    let mut server = Server::start_with(flavor, aof_options("always"));
    let mut con = server.client();
    let gone = grant(&mut con, 0, "lease:gone", 60_000, Some("t-gone"));
    let base = rewrite_aof(&server, &mut con);
    assert!(base.to_string_lossy().ends_with(".base.rdb"), "{base:?}");
    assert_eq!(release(&mut con, "lease:gone", &gone.token), 1);
    let mut kept = grant(&mut con, 0, "lease:kept", 60_000, Some("t-kept"));
    renew_held(&mut con, &mut kept, 30_000);
    drop(con);
    server.kill9();
    server.start_again();
    let mut con = server.client();
    assert_eq!(
        lease_info(&mut con, "lease:gone"),
        None,
        "a replayed release"
    );
    check_held(&mut con, &mut kept, "after a release and a grant replayed");
});

// ---------------------------------------------------------------------------
// DUMP / RESTORE

/// A token LZF cannot shrink (no byte repeats), so DUMP stores it as it is and a cut
/// lands where the test expects.
fn incompressible_token() -> Vec<u8> {
    (0u8..100)
        .map(|i| i.wrapping_mul(7).wrapping_add(1))
        .collect()
}

for_each_server!(restore_of_a_truncated_payload_is_refused, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    let token = incompressible_token();
    let granted = call(
        &mut con,
        "LEASE.ACQUIRE",
        ("lease:src", 60_000, "TOKEN", &token[..]),
    );
    assert!(matches!(granted, Value::Array(_)), "{granted:?}");
    let fence_value = lease_stat(&server, "fence_last");
    assert_eq!(
        fenced(&mut con, "res:src", fence_value, NONE),
        Value::Int(fence_value as i64)
    );
    let dumps = [
        ("lease-key", dump(&mut con, "lease:src")),
        ("fence-rec", dump(&mut con, "res:src")),
    ];
    let lease_body = &dumps[0].1.body;
    assert!(
        lease_body.windows(token.len()).any(|w| w == &token[..]),
        "the token is not stored raw in {lease_body:?}"
    );
    let settings = flavor.sanitize_dump_payload_settings();
    let mut refused = 0;
    for &setting in settings {
        let sanitize = sanitize_dump_payload(&mut con, setting);
        for (kind, d) in &dumps {
            // Cut without fixing the checksum: the server itself refuses it.
            let mut unsigned = d.body[..d.body.len() - 1].to_vec();
            unsigned.extend_from_slice(&d.payload()[d.body.len()..]);
            let error = error_text(&restore(&mut con, "victim", &unsigned)).unwrap_or_default();
            assert!(
                error.contains("checksum"),
                "a bad checksum must be caught by the server first: {error}"
            );
            // With a valid checksum the cut body reaches the loader. RESTORE reads the
            // payload with its 10-byte trailer, so a value missing fewer than 11 bytes
            // may be completed by trailer bytes and load (as any byte string that
            // decodes would); from 11 missing bytes on, no reading can complete it.
            for cut in 0..d.body.len() {
                let what = format!(
                    "a {kind} cut to {cut} of {} bytes (sanitize-dump-payload {sanitize})",
                    d.body.len()
                );
                let payload = seal(&d.body[..cut], d.version);
                if d.body.len() - cut > 10 {
                    assert_refused(&mut con, &payload, &what);
                    refused += 1;
                    continue;
                }
                let reply = restore(&mut con, "victim", &payload);
                assert_eq!(text(call(&mut con, "PING", NONE)), "PONG", "after {what}");
                if error_text(&reply).is_none() {
                    assert_eq!(reply, Value::Okay, "{what}");
                    // Whatever it decoded to is a well-formed value of its type.
                    let kind_now = text(call(&mut con, "TYPE", "victim"));
                    assert_eq!(&kind_now, kind, "{what}");
                    if kind_now == "lease-key" {
                        assert!(lease_info(&mut con, "victim").is_some(), "{what}");
                    }
                    assert_eq!(int(call(&mut con, "DEL", "victim")), 1);
                }
            }
            // The untouched payload still loads: the test's framing is right.
            assert_eq!(restore(&mut con, "intact", &d.payload()), Value::Okay);
            assert_eq!(int(call(&mut con, "DEL", "intact")), 1);
        }
    }
    assert!(
        refused >= settings.len() * 100,
        "only {refused} cuts were checked strictly"
    );
    assert!(
        server.log().contains("redis-lease: refusing to load"),
        "the module never saw a cut payload:\n{}",
        server.log()
    );
    // The original keys are untouched.
    let info = lease_info(&mut con, "lease:src").expect("lease:src");
    assert_eq!(info.state, "held");
    assert_eq!(renew(&mut con, "lease:src", "wrong", 60_000), 0);
    let renewed = call(&mut con, "LEASE.RENEW", ("lease:src", &token[..], 60_000));
    assert_eq!(renewed, Value::Int(1));
    check_record(
        &mut con,
        "res:src",
        fence_value,
        "after the corrupt restores",
    );
});

for_each_server!(
    restore_of_an_unknown_encoding_version_is_refused,
    |flavor| {
        let server = Server::start(flavor);
        let mut con = server.client();
        acquire(&mut con, "lease:src", 60_000, "t").expect("grant");
        assert_eq!(fenced(&mut con, "res:src", 5, NONE), Value::Int(5));
        for &setting in flavor.sanitize_dump_payload_settings() {
            let sanitize = sanitize_dump_payload(&mut con, setting);
            for key in ["lease:src", "res:src"] {
                let d = dump(&mut con, key);
                let id = d.module_id();
                assert_eq!(id & 1023, 3, "{key} is saved with encoding version 3");
                for version in [0u64, 4, 1023] {
                    let changed = d.with_module_id((id & !1023) | version);
                    let what = format!(
                        "{key} as encoding version {version} (sanitize-dump-payload {sanitize})"
                    );
                    assert_refused(&mut con, &changed.payload(), &what);
                }
            }
        }
        assert!(
            server.log().contains("redis-lease: refusing to load"),
            "the module never logged refusing a payload:\n{}",
            server.log()
        );
    }
);

for_each_server!(restore_of_out_of_range_values_is_refused, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    acquire(&mut con, "lease:src", 60_000, "t").expect("grant");
    assert_eq!(fenced(&mut con, "res:src", 5, NONE), Value::Int(5));
    let lease = dump(&mut con, "lease:src");
    let record = dump(&mut con, "res:src");
    let live = now_ms() + 60_000;
    let limit = 1u64 << 53;

    // The test's encoder is right: a well-formed crafted value loads.
    let good = lease_dump(&lease, 12_345, live, b"crafted");
    assert_eq!(
        restore(&mut con, "lease:crafted", &good.payload()),
        Value::Okay
    );
    assert_eq!(
        lease_info(&mut con, "lease:crafted").map(|i| (i.state, i.fence)),
        Some(("held".to_string(), 12_345))
    );
    assert_eq!(renew(&mut con, "lease:crafted", "crafted", 60_000), 1);
    assert_eq!(
        restore(&mut con, "res:crafted", &record_dump(&record, 77).payload()),
        Value::Okay
    );
    check_record(&mut con, "res:crafted", 77, "a crafted record");

    let bad = [
        (
            "a lease fence of 2^53",
            lease_dump(&lease, limit, live, b"t"),
        ),
        (
            "a lease fence of 2^64-1",
            lease_dump(&lease, u64::MAX, live, b"t"),
        ),
        ("a holder with deadline 0", lease_dump(&lease, 9, 0, b"t")),
        (
            "a deadline far past 2^53/1024 ms",
            lease_dump(&lease, 9, u64::MAX, b"t"),
        ),
        (
            "a 257-byte token",
            lease_dump(&lease, 9, live, &[b'x'; 257]),
        ),
        ("a record fence of 2^53", record_dump(&record, limit)),
    ];
    for &setting in flavor.sanitize_dump_payload_settings() {
        if let Some(sanitize) = setting {
            assert_eq!(
                call(
                    &mut con,
                    "CONFIG",
                    ("SET", "sanitize-dump-payload", sanitize)
                ),
                Value::Okay
            );
        }
        for (what, d) in &bad {
            assert_refused(&mut con, &d.payload(), what);
        }
    }
    assert!(lease_stat(&server, "fence_last") < limit);
});

for_each_server!(dump_restore_round_trip_keeps_the_lease, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    let mut original = grant(&mut con, 0, "lease:src", 60_000, Some("token-src"));
    let highest = original.fence;
    assert_eq!(
        fenced(&mut con, "res:src", highest, NONE),
        Value::Int(highest as i64)
    );
    let_clock_advance(50);

    let lease = dump(&mut con, "lease:src");
    assert_eq!(
        restore(&mut con, "lease:copy", &lease.payload()),
        Value::Okay
    );
    let mut copy = Held {
        key: "lease:copy".to_string(),
        ..original.clone()
    };
    check_held(&mut con, &mut copy, "the restored copy");
    check_held(&mut con, &mut original, "the original");
    let record = dump(&mut con, "res:src");
    assert_eq!(
        restore(&mut con, "res:copy", &record.payload()),
        Value::Okay
    );
    check_record(&mut con, "res:copy", highest, "the restored record");
    // The restored key is a lease like any other: its holder releases it for good.
    assert_eq!(release(&mut con, "lease:copy", "token-src"), 1);
    assert!(!exists(&mut con, "lease:copy"));

    // A restored lease whose deadline comes soon is reaped like a granted one.
    let soon = lease_dump(&lease, original.fence, now_ms() + 200, b"token-soon");
    assert_eq!(
        restore(&mut con, "lease:soon", &soon.payload()),
        Value::Okay
    );
    wait_until(
        "the restored lease to be reaped",
        Duration::from_secs(5),
        || !exists(&mut con, "lease:soon"),
    );
    assert_eq!(lease_stat(&server, "expired"), 1);
});

for_each_server!(
    restore_into_a_fresh_server_raises_its_fence_sequence,
    |flavor| {
        let source = Server::start(flavor);
        let mut src = source.client();
        let mut held = grant(&mut src, 0, "lease:moved", 60_000, Some("token-moved"));
        let moved = dump(&mut src, "lease:moved");
        let ahead = fence_ahead();
        let far = lease_dump(&moved, ahead, now_ms() + 60_000, b"token-far");
        drop(src);
        drop(source);

        let target = Server::start(flavor);
        let mut con = target.client();
        assert_eq!(lease_stat(&target, "fence_last"), 0);
        assert_eq!(
            restore(&mut con, "lease:moved", &moved.payload()),
            Value::Okay
        );
        assert!(lease_stat(&target, "fence_last") >= held.fence);
        check_held(&mut con, &mut held, "restored on a fresh server");
        let next = acquire(&mut con, "lease:other", 60_000, "t").expect("grant");
        assert!(
            next > held.fence,
            "fence {next} after a restored {}",
            held.fence
        );

        assert_eq!(restore(&mut con, "lease:far", &far.payload()), Value::Okay);
        let last = lease_stat(&target, "fence_last");
        assert!(
            last >= ahead,
            "lease_fence_last {last} below the restored {ahead}"
        );
        for key in ["lease:new", "lease:other2"] {
            let next = acquire(&mut con, key, 60_000, "t").expect("grant");
            assert!(next > ahead, "{key}: fence {next} after a restored {ahead}");
        }
        // The restored holder can still act on its lease.
        assert_eq!(renew(&mut con, "lease:far", "token-far", 60_000), 1);
        assert_eq!(release(&mut con, "lease:far", "token-far"), 1);
        let again = acquire(&mut con, "lease:far", 60_000, "t").expect("grant");
        assert!(again > ahead);
    }
);
