//! The rest of the server's surface, as a careless or hostile operator reaches it:
//! `MOVE` and `SWAPDB` of leases and records, the `OBJECT`, `TYPE`, `MEMORY` and
//! `DEBUG` commands a test suite or a tool sends (`RELOAD`, `DIGEST`, `SLEEP`,
//! `SET-ACTIVE-EXPIRE`, `PAUSE-CRON`, `CHANGE-REPL-ID`), client eviction and
//! `CLIENT NO-EVICT` with blocked waiters, `RESET` of a transaction and of tracking,
//! keyspace notifications during a write pause, `SHUTDOWN` with waiters, `CLIENT KILL`
//! of the head waiter and `FLUSHALL`. Every case on every server of the matrix; the
//! table of outcomes is in docs/src/proof/security.md ("The server's surface").

#[macro_use]
extern crate harness;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use harness::calls::{call, digest, info_on, int, release, renew, select, stale, take, text, NONE};
use harness::lease::{lease_info, lease_stat};
use harness::reply::{assert_ok, error_text, expect_error, granted};
use harness::waiter::Waiter;
use harness::{master_and_replica, wait_until, Flavor, Server, ServerOptions};
use redis::{Connection, PushKind, Value};

const MINUTE: u64 = 60_000;
const WAIT: Duration = Duration::from_secs(10);

fn digest_value(con: &mut Connection, key: &str) -> String {
    match call(con, "DEBUG", ("DIGEST-VALUE", key)) {
        Value::Array(items) if items.len() == 1 => text(items[0].clone()),
        other => panic!("DEBUG DIGEST-VALUE {key}: {other:?}"),
    }
}

/// The database `CLIENT INFO` says the connection has selected.
fn client_db(con: &mut Connection) -> i64 {
    let info = text(call(con, "CLIENT", "INFO"));
    info.split_whitespace()
        .find_map(|field| field.strip_prefix("db="))
        .and_then(|db| db.parse().ok())
        .unwrap_or_else(|| panic!("CLIENT INFO has no db: {info}"))
}

/// The server answers and its log has no crash report.
fn assert_alive(server: &Server) {
    assert_eq!(text(call(&mut server.client(), "PING", NONE)), "PONG");
    assert_no_crash(server);
}

fn assert_no_crash(server: &Server) {
    let log = server.log();
    assert!(
        !log.contains("BUG REPORT") && !log.contains("panicked"),
        "{} crashed or a callback panicked (its log follows the panic)",
        server.flavor
    );
}

// ---------------------------------------------------------------------------------------
// MOVE, SWAPDB, COPY ... DB
// ---------------------------------------------------------------------------------------

for_each_server!(move_takes_a_lease_and_a_record_to_another_db, |flavor| {
    let (primary, replica) = master_and_replica(flavor);
    let mut con = primary.client();
    let mut db1 = primary.client();
    select(&mut db1, 1);
    let fence = take(&mut con, "L", MINUTE, "a");
    call(&mut con, "LEASE.FENCE", ("R", fence));
    let queued = Waiter::block(&primary, "L", MINUTE, "w", 0, &[]);
    let before = lease_info(&mut con, "L").expect("L");
    let expired = lease_stat(&primary, "expired");
    take(&mut con, "S", 300, "s");
    for key in ["L", "R", "S"] {
        assert_eq!(int(call(&mut con, "MOVE", (key, 1))), 1, "MOVE {key} 1");
    }
    assert_eq!(client_db(&mut con), 0, "MOVE left its client in another db");
    // In db 1 the lease is the same grant, renewable by its token only; the record
    // still refuses an older fence.
    let moved = lease_info(&mut db1, "L").expect("L in db 1");
    assert_eq!((moved.state.as_str(), moved.fence), ("held", fence));
    assert!(moved.ttl <= before.ttl && moved.ttl > before.ttl - 5_000);
    assert_eq!(renew(&mut db1, "L", "w", MINUTE), 0);
    assert_eq!(call(&mut db1, "LEASE.ACQUIRE", ("L", MINUTE)), Value::Nil);
    assert_eq!(renew(&mut db1, "L", "a", MINUTE), 1);
    let reply = call(&mut db1, "LEASE.FENCE", ("R", fence - 1));
    assert_eq!(expect_error(&reply, "R in db 1"), stale(fence - 1, fence));
    // The name it left in db 0 went to the waiter there, with a higher fence.
    let reply = queued
        .answer("the waiter in db 0")
        .expect("the waiter's reply");
    let next = granted(&reply, "w").unwrap_or_else(|| panic!("{reply:?}"));
    assert!(next > fence, "{next} after {fence}");
    // MOVE onto an existing key is refused by the server; both stay as they were.
    call(&mut con, "LEASE.FENCE", ("R", 1));
    for key in ["L", "R"] {
        assert_eq!(
            int(call(&mut con, "MOVE", (key, 1))),
            0,
            "MOVE {key} onto a key"
        );
    }
    assert_eq!(renew(&mut con, "L", "w", MINUTE), 1);
    assert_eq!(renew(&mut db1, "L", "a", MINUTE), 1);
    let reply = call(&mut db1, "LEASE.FENCE", ("R", fence - 1));
    assert_eq!(expect_error(&reply, "R in db 1"), stale(fence - 1, fence));
    // The short lease kept its deadline: it is reaped in db 1.
    wait_until("S reaped in db 1", WAIT, || {
        lease_info(&mut db1, "S").is_none()
    });
    assert_eq!(lease_stat(&primary, "expired"), expired + 1);
    assert_eq!(lease_stat(&primary, "indexed_deadlines"), 2);
    replica.wait_for_sync(&primary);
    assert_eq!(digest(&primary), digest(&replica));
    assert_alive(&primary);
});

for_each_server!(swapdb_leases_expire_and_renew_in_their_new_db, |flavor| {
    let (primary, replica) = master_and_replica(flavor);
    let mut db0 = primary.client();
    let mut db1 = primary.client();
    select(&mut db1, 1);
    let expired = lease_stat(&primary, "expired");
    take(&mut db0, "short0", 300, "a");
    take(&mut db0, "long0", MINUTE, "k0");
    call(&mut db0, "LEASE.FENCE", ("R0", 10));
    take(&mut db1, "short1", 300, "b");
    take(&mut db1, "long1", MINUTE, "k1");
    call(&mut db1, "LEASE.FENCE", ("R1", 20));
    assert_ok(call(&mut db0, "SWAPDB", (0, 1)), "SWAPDB 0 1");
    // Each connection now sees the other db's keys.
    assert_eq!(renew(&mut db0, "long1", "k1", MINUTE), 1);
    assert_eq!(renew(&mut db1, "long0", "k0", MINUTE), 1);
    assert_eq!(renew(&mut db0, "long0", "k0", MINUTE), 0);
    let reply = call(&mut db0, "LEASE.FENCE", ("R1", 19));
    assert_eq!(expect_error(&reply, "R1 in db 0"), stale(19, 20));
    let reply = call(&mut db1, "LEASE.FENCE", ("R0", 9));
    assert_eq!(expect_error(&reply, "R0 in db 1"), stale(9, 10));
    // The short leases expire where they are now and are reaped there.
    wait_until("both short leases reaped", WAIT, || {
        lease_info(&mut db0, "short1").is_none() && lease_info(&mut db1, "short0").is_none()
    });
    assert_eq!(lease_stat(&primary, "expired"), expired + 2);
    assert_eq!(lease_stat(&primary, "indexed_deadlines"), 2);
    replica.wait_for_sync(&primary);
    assert_eq!(digest(&primary), digest(&replica));
    let mut rcon = replica.client();
    assert_eq!(lease_info(&mut rcon, "long1").expect("long1").state, "held");
    assert_alive(&primary);
});

for_each_server!(copy_to_another_db_and_the_client_db, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    call(&mut con, "LEASE.FENCE", ("R", 9));
    take(&mut con, "L", MINUTE, "a");
    assert_ok(call(&mut con, "SET", ("s", "x")), "SET s");
    // Valkey 8.1 runs the keyspace notification of `COPY ... DB n` for a module
    // subscribed to generic events through the caller's client, selecting db n on
    // it, and leaves it there (Valkey 9.1 does not); the module puts the client back
    // after MOVE only. Redis selects nothing.
    let left_in = |db: i64| if flavor == Flavor::Valkey8 { db } else { 0 };
    assert_eq!(int(call(&mut con, "COPY", ("R", "R", "DB", 2))), 1);
    assert_eq!(client_db(&mut con), left_in(2), "after COPY R R DB 2");
    select(&mut con, 0);
    assert_eq!(int(call(&mut con, "COPY", ("s", "s", "DB", 3))), 1);
    assert_eq!(client_db(&mut con), left_in(3), "after COPY s s DB 3");
    select(&mut con, 0);
    let reply = call(&mut con, "COPY", ("L", "L", "DB", 2));
    assert!(error_text(&reply).is_some(), "COPY of a lease: {reply:?}");
    assert_eq!(client_db(&mut con), 0, "after a refused COPY");
    select(&mut con, 2);
    assert_eq!(int(call(&mut con, "EXISTS", "L")), 0);
    let reply = call(&mut con, "LEASE.FENCE", ("R", 8));
    assert_eq!(expect_error(&reply, "the copy in db 2"), stale(8, 9));
    assert_alive(&server);
});

// ---------------------------------------------------------------------------------------
// OBJECT, TYPE, MEMORY
// ---------------------------------------------------------------------------------------

for_each_server!(object_type_and_memory_answer_on_lease_keys, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    take(&mut con, "L", MINUTE, "a");
    call(&mut con, "LEASE.FENCE", ("R", 7));
    assert_eq!(text(call(&mut con, "TYPE", "L")), "lease-key");
    assert_eq!(text(call(&mut con, "TYPE", "R")), "fence-rec");
    for key in ["L", "R"] {
        assert_eq!(text(call(&mut con, "OBJECT", ("ENCODING", key))), "raw");
        assert_eq!(int(call(&mut con, "OBJECT", ("REFCOUNT", key))), 1);
        assert!(int(call(&mut con, "OBJECT", ("IDLETIME", key))) >= 0);
        let reply = call(&mut con, "OBJECT", ("FREQ", key));
        assert!(
            expect_error(&reply, "OBJECT FREQ without LFU").contains("LFU"),
            "{reply:?}"
        );
        assert!(int(call(&mut con, "MEMORY", ("USAGE", key))) > 0);
        assert!(int(call(&mut con, "MEMORY", ("USAGE", key, "SAMPLES", 0))) > 0);
        let object = text(call(&mut con, "DEBUG", ("OBJECT", key)));
        assert!(
            object.starts_with("Value at:") && object.contains("encoding:raw"),
            "{object}"
        );
    }
    match call(&mut con, "OBJECT", "HELP") {
        Value::Array(lines) => assert!(!lines.is_empty()),
        other => panic!("OBJECT HELP: {other:?}"),
    }
    match call(&mut con, "SCAN", (0, "TYPE", "lease-key")) {
        Value::Array(items) => assert_eq!(
            items.get(1),
            Some(&Value::Array(vec![Value::BulkString(b"L".to_vec())]))
        ),
        other => panic!("SCAN TYPE lease-key: {other:?}"),
    }
    // With an LFU policy (no maxmemory: nothing is refused) the key has a frequency.
    call(
        &mut con,
        "CONFIG",
        ("SET", "maxmemory-policy", "allkeys-lfu"),
    );
    assert!(int(call(&mut con, "OBJECT", ("FREQ", "L"))) >= 0);
    call(
        &mut con,
        "CONFIG",
        ("SET", "maxmemory-policy", "noeviction"),
    );
    assert_eq!(renew(&mut con, "L", "a", MINUTE), 1);
    assert_alive(&server);
});

// ---------------------------------------------------------------------------------------
// DEBUG
// ---------------------------------------------------------------------------------------

for_each_server!(debug_reload_keeps_leases_waiters_and_fences, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    let fence = take(&mut con, "L", MINUTE, "a");
    call(&mut con, "LEASE.FENCE", ("R", fence));
    let queued = Waiter::block(&server, "L", MINUTE, "w", 0, &[]);
    let last = lease_stat(&server, "fence_last");
    let before = digest(&server);
    let lease_digest = digest_value(&mut con, "L");
    let record_digest = digest_value(&mut con, "R");
    assert_ok(call(&mut con, "DEBUG", "RELOAD"), "DEBUG RELOAD");
    assert_eq!(digest(&server), before);
    assert_eq!(digest_value(&mut con, "L"), lease_digest);
    assert_eq!(digest_value(&mut con, "R"), record_digest);
    // The lease is still the holder's, and its waiter still waits for it.
    let info = lease_info(&mut con, "L").expect("L");
    assert_eq!((info.state.as_str(), info.fence), ("held", fence));
    assert!(
        !queued.is_finished(),
        "the waiter was answered by the reload"
    );
    assert!(lease_stat(&server, "fence_last") >= last);
    let reply = call(&mut con, "LEASE.FENCE", ("R", fence - 1));
    assert_eq!(expect_error(&reply, "R"), stale(fence - 1, fence));
    assert!(take(&mut con, "next", MINUTE, "n") > last);
    assert_eq!(release(&mut con, "L", "a"), 1);
    let reply = queued.answer("the waiter").expect("the waiter's reply");
    assert!(granted(&reply, "w").is_some_and(|f| f > last), "{reply:?}");
    // DEBUG JMAP where the server has it (none of the matrix does: unknown subcommand).
    let jmap = call(&mut con, "DEBUG", "JMAP");
    if !error_text(&jmap).is_some_and(|e| e.contains("unknown subcommand")) {
        assert_eq!(lease_info(&mut con, "L").expect("L").state, "held");
    }
    assert_alive(&server);
});

for_each_server!(
    debug_reload_merge_never_brings_an_older_lease_back,
    |flavor| {
        // `DEBUG RELOAD NOSAVE NOFLUSH MERGE` loads the RDB on disk over the keyspace,
        // replacing every key of the same name: the older value over the newer one.
        let server = Server::start(flavor);
        let mut con = server.client();
        let old = take(&mut con, "L", MINUTE, "old");
        call(&mut con, "LEASE.FENCE", ("R", 100));
        assert_ok(call(&mut con, "SAVE", NONE), "SAVE");
        assert_eq!(release(&mut con, "L", "old"), 1);
        let new = take(&mut con, "L", MINUTE, "new");
        call(&mut con, "LEASE.FENCE", ("R", 200));
        let mut merge = redis::cmd("DEBUG");
        merge.arg(("RELOAD", "NOSAVE", "NOFLUSH", "MERGE"));
        let reply = redis::ConnectionLike::req_command(&mut server.client(), &merge);
        assert_no_crash(&server);
        assert_ok(
            reply.expect("DEBUG RELOAD ... MERGE"),
            "DEBUG RELOAD ... MERGE",
        );
        // Each broken rule is listed, so one run shows them all.
        let mut broken = Vec::new();
        let info = lease_info(&mut con, "L").expect("L");
        if info.fence < new {
            broken.push(format!(
                "L has the fence {} of grant {old}, not {new}",
                info.fence
            ));
        }
        if renew(&mut con, "L", "old", MINUTE) == 1 {
            broken.push("the old token holds L again".to_string());
        }
        let reply = call(&mut con, "LEASE.FENCE", ("R", 150));
        if error_text(&reply) != Some(stale(150, 200)) {
            broken.push(format!("R accepted 150 after 200: {reply:?}"));
        }
        assert!(broken.is_empty(), "{broken:?}");
    }
);

for_each_server!(debug_sleep_across_a_deadline, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    assert_ok(call(&mut con, "DEBUG", ("SLEEP", 0)), "DEBUG SLEEP 0");
    let first = take(&mut con, "L", 100, "a");
    take(&mut con, "M", 100, "m");
    let expired = lease_stat(&server, "expired");
    // Pipelined behind the sleep, the calls run before any timer: L is free though
    // nothing has reaped it, its holder cannot renew it, anyone may take it.
    let replies: Vec<Value> = redis::pipe()
        .cmd("DEBUG")
        .arg("SLEEP")
        .arg("0.3")
        .cmd("LEASE.INFO")
        .arg("L")
        .cmd("LEASE.RENEW")
        .arg("L")
        .arg("a")
        .arg(MINUTE)
        .cmd("LEASE.ACQUIRE")
        .arg("L")
        .arg(MINUTE)
        .arg("TOKEN")
        .arg("b")
        .query(&mut con)
        .unwrap_or_else(|e| panic!("DEBUG SLEEP pipeline: {e}"));
    assert_eq!(replies[0], Value::Okay);
    match &replies[1] {
        Value::Array(fields) => assert_eq!(
            fields.get(1),
            Some(&Value::BulkString(b"free".to_vec())),
            "{fields:?}"
        ),
        other => panic!("LEASE.INFO L after the sleep: {other:?}"),
    }
    assert_eq!(replies[2], Value::Int(0));
    assert!(granted(&replies[3], "b").is_some_and(|f| f > first));
    // M, which nobody touched, is reaped soon after.
    wait_until("M reaped", WAIT, || lease_info(&mut con, "M").is_none());
    assert_eq!(lease_stat(&server, "expired"), expired + 2);
    assert_alive(&server);
});

for_each_server!(
    active_expire_and_cron_off_do_not_stop_lease_expiry,
    |flavor| {
        let server = Server::start(flavor);
        let mut con = server.client();
        for (subcommand, off, on) in [("SET-ACTIVE-EXPIRE", 0, 1), ("PAUSE-CRON", 1, 0)] {
            let what = format!("DEBUG {subcommand} {off}");
            assert_ok(call(&mut con, "DEBUG", (subcommand, off)), &what);
            take(&mut con, "L", 100, "a");
            take(&mut con, "W", 300, "h");
            let queued = Waiter::block(&server, "W", MINUTE, "w", 0, &[]);
            assert_ok(call(&mut con, "SET", ("native", "v", "PX", 100)), "SET PX");
            let expired = lease_stat(&server, "expired");
            wait_until(&format!("L reaped with {what}"), WAIT, || {
                lease_info(&mut con, "L").is_none()
            });
            let reply = queued.answer("the waiter").expect("the waiter's reply");
            assert!(granted(&reply, "w").is_some(), "{what}: {reply:?}");
            assert_eq!(lease_stat(&server, "expired"), expired + 2, "{what}");
            if subcommand == "SET-ACTIVE-EXPIRE" {
                // The server's own expiry is off: its key is still in the keyspace.
                assert_eq!(int(call(&mut con, "DBSIZE", NONE)), 2, "{what}");
            }
            assert_ok(call(&mut con, "DEBUG", (subcommand, on)), &what);
            assert_ok(call(&mut con, "FLUSHALL", NONE), "FLUSHALL");
        }
        assert_alive(&server);
    }
);

for_each_server!(debug_change_repl_id_keeps_the_replica_in_step, |flavor| {
    let (primary, replica) = master_and_replica(flavor);
    let mut con = primary.client();
    let mut rcon = replica.client();
    let fence = take(&mut con, "L", MINUTE, "a");
    call(&mut con, "LEASE.FENCE", ("R", fence));
    replica.wait_for_sync(&primary);
    for key in ["L", "R"] {
        assert_eq!(digest_value(&mut con, key), digest_value(&mut rcon, key));
    }
    assert_ok(call(&mut con, "DEBUG", "CHANGE-REPL-ID"), "CHANGE-REPL-ID");
    take(&mut con, "M", MINUTE, "m");
    replica.wait_for_sync(&primary);
    assert_eq!(digest(&primary), digest(&replica));
    // The replica reconnects under the new id: a full sync brings every lease again.
    let full_syncs = || primary.info_field("stats", "sync_full");
    let before = full_syncs();
    assert!(int(call(&mut rcon, "CLIENT", ("KILL", "TYPE", "master"))) >= 1);
    wait_until("a full sync after the new id", WAIT, || {
        full_syncs() != before
            && replica
                .info_field("replication", "master_link_status")
                .is_some_and(|s| s == "up")
    });
    replica.wait_for_sync(&primary);
    assert_eq!(digest(&primary), digest(&replica));
    let info = lease_info(&mut rcon, "L").expect("L on the replica");
    assert_eq!((info.state.as_str(), info.fence), ("held", fence));
    // And on the replica itself.
    assert_ok(call(&mut rcon, "DEBUG", "CHANGE-REPL-ID"), "on the replica");
    assert_eq!(release(&mut con, "L", "a"), 1);
    replica.wait_for_sync(&primary);
    assert_eq!(digest(&primary), digest(&replica));
    assert_eq!(lease_info(&mut rcon, "L"), None);
    assert_alive(&primary);
    assert_alive(&replica);
});

// ---------------------------------------------------------------------------------------
// Clients: eviction, RESET, tracking, CLIENT KILL
// ---------------------------------------------------------------------------------------

for_each_server!(client_eviction_takes_only_evictable_waiters, |flavor| {
    let server = Server::start(flavor);
    let mut admin = server.client();
    assert_ok(call(&mut admin, "CLIENT", ("NO-EVICT", "on")), "NO-EVICT");
    // A key name of 100 kB: a waiter holds it in its arguments while it waits, which
    // makes it the biggest client and the first one evicted.
    let key = "k".repeat(100_000);
    take(&mut admin, &key, MINUTE, "holder");
    let evictable = Waiter::block(&server, &key, MINUTE, "evictable", 0, &[]);
    let kept = Waiter::block(
        &server,
        &key,
        MINUTE,
        "kept",
        0,
        &[&["CLIENT", "NO-EVICT", "on"]],
    );
    assert_ok(
        call(&mut admin, "CONFIG", ("SET", "maxmemory-clients", 1)),
        "maxmemory-clients",
    );
    wait_until("the evictable waiter evicted", WAIT, || {
        info_on(&mut admin, "lease", "lease_waiters") == 1
    });
    assert!(info_on(&mut admin, "stats", "evicted_clients") >= 1);
    call(&mut admin, "CONFIG", ("SET", "maxmemory-clients", 0));
    assert!(evictable.answer("the evicted waiter").is_err());
    let info = lease_info(&mut admin, &key).expect("the key");
    assert_eq!((info.state.as_str(), info.waiters), ("held", 1));
    assert_eq!(release(&mut admin, &key, "holder"), 1);
    let reply = kept.answer("the NO-EVICT waiter").expect("its reply");
    assert!(granted(&reply, "kept").is_some(), "{reply:?}");
    assert_alive(&server);
});

for_each_server!(reset_of_a_transaction_and_of_tracking, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    // RESET discards a transaction with queued acquires: nothing ran.
    assert_ok(call(&mut con, "MULTI", NONE), "MULTI");
    for args in [
        vec!["L", "60000", "TOKEN", "x"],
        vec!["L", "60000", "TOKEN", "y", "BLOCK", "0"],
    ] {
        let reply = call(&mut con, "LEASE.ACQUIRE", &args);
        assert_eq!(text(reply), "QUEUED");
    }
    assert_eq!(text(call(&mut con, "RESET", NONE)), "RESET");
    assert!(
        expect_error(&call(&mut con, "EXEC", NONE), "EXEC after RESET").contains("without MULTI")
    );
    assert_eq!(lease_info(&mut con, "L"), None);
    assert_eq!(lease_stat(&server, "grants"), 0);
    // Tracking: a grant and the reaper's deletion invalidate a tracked lease key.
    let mut tracked = server.client_resp3();
    let (pushes, received) = mpsc::channel();
    tracked.set_push_sender(pushes);
    assert_ok(call(&mut tracked, "CLIENT", ("TRACKING", "on")), "TRACKING");
    let invalidated = |tracked: &mut Connection, what: &str| {
        // Invalidations are written before the reply of any later command.
        call(tracked, "PING", NONE);
        let keys: Vec<Value> = received
            .try_iter()
            .filter(|p| p.kind == PushKind::Invalidate)
            .flat_map(|p| p.data)
            .collect();
        assert_eq!(
            keys,
            [Value::Array(vec![Value::BulkString(b"L".to_vec())])],
            "{what}"
        );
    };
    assert_eq!(lease_info(&mut tracked, "L"), None);
    take(&mut con, "L", 500, "a");
    invalidated(&mut tracked, "a grant");
    assert_eq!(lease_info(&mut tracked, "L").expect("L").state, "held");
    wait_until("L reaped", WAIT, || lease_info(&mut con, "L").is_none());
    invalidated(&mut tracked, "the reaper's deletion");
    lease_info(&mut tracked, "L");
    assert_eq!(text(call(&mut tracked, "RESET", NONE)), "RESET");
    match call(&mut tracked, "CLIENT", "TRACKINGINFO") {
        Value::Array(fields) => assert_eq!(
            fields.get(1),
            Some(&Value::Array(vec![Value::BulkString(b"off".to_vec())]))
        ),
        other => panic!("CLIENT TRACKINGINFO after RESET: {other:?}"),
    }
    take(&mut con, "L", MINUTE, "b");
    assert_eq!(lease_info(&mut tracked, "L").expect("L").state, "held");
    assert_alive(&server);
});

for_each_server!(client_kill_of_the_head_waiter_serves_the_next, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    let fence = take(&mut con, "L", MINUTE, "holder");
    let first = Waiter::block(&server, "L", MINUTE, "first", 0, &[]);
    let head = first.client_id;
    let second = Waiter::block(&server, "L", MINUTE, "second", 0, &[]);
    // In one pipeline, with no timer in between: the lease expires during the
    // sleep, so it is free with its head still blocked when the head is killed, and
    // a newcomer asks right after. (A newcomer before the kill would have the head
    // served at once: its ACQUIRE finds the lease expired and signals the key.)
    let replies: Vec<Value> = redis::pipe()
        .cmd("LEASE.RENEW")
        .arg("L")
        .arg("holder")
        .arg(100)
        .cmd("DEBUG")
        .arg("SLEEP")
        .arg("0.2")
        .cmd("LEASE.INFO")
        .arg("L")
        .cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(head)
        .cmd("LEASE.ACQUIRE")
        .arg("L")
        .arg(MINUTE)
        .arg("TOKEN")
        .arg("newcomer")
        .query(&mut con)
        .unwrap_or_else(|e| panic!("the pipeline: {e}"));
    assert_eq!(replies[0], Value::Int(1));
    match &replies[2] {
        Value::Array(fields) => assert_eq!(
            (fields.get(1), fields.get(7)),
            (
                Some(&Value::BulkString(b"free".to_vec())),
                Some(&Value::Int(2))
            ),
            "{fields:?}"
        ),
        other => panic!("LEASE.INFO L: {other:?}"),
    }
    assert_eq!(replies[3], Value::Int(1), "CLIENT KILL ID");
    assert_eq!(replies[4], Value::Nil, "the newcomer jumped the queue");
    assert!(first.answer("the killed head").is_err());
    let reply = second.answer("the next waiter").expect("its reply");
    assert!(
        granted(&reply, "second").is_some_and(|f| f > fence),
        "{reply:?}"
    );
    assert_eq!(lease_stat(&server, "waiters"), 0);
    assert_alive(&server);
});

// ---------------------------------------------------------------------------------------
// Keyspace notifications in a write pause
// ---------------------------------------------------------------------------------------

for_each_server!(no_lease_expire_event_while_writes_are_paused, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    let mut pauser = server.client();
    for classes in ["KEA", "KEd"] {
        call(
            &mut con,
            "CONFIG",
            ("SET", "notify-keyspace-events", classes),
        );
        let mut sub = server.client();
        let mut pubsub = sub.as_pubsub();
        pubsub.psubscribe("__key*@0__:*").expect("PSUBSCRIBE");
        pubsub.set_read_timeout(Some(WAIT)).expect("read timeout");
        // The grant and the pause in one pipeline: the lease expires 200 ms into
        // the pause, however slow the machine.
        let paused = Instant::now();
        let replies: Vec<Value> = redis::pipe()
            .cmd("LEASE.ACQUIRE")
            .arg("L")
            .arg(200)
            .arg("TOKEN")
            .arg("a")
            .cmd("CLIENT")
            .arg("PAUSE")
            .arg(500)
            .arg("WRITE")
            .query(&mut pauser)
            .unwrap_or_else(|e| panic!("ACQUIRE + CLIENT PAUSE: {e}"));
        assert!(granted(&replies[0], "a").is_some(), "{replies:?}");
        assert_eq!(replies[1], Value::Okay);
        for _ in 0..2 {
            let msg = pubsub.get_message().expect("the acquire events");
            let payload: String = msg.get_payload().expect("payload");
            assert!(
                msg.get_channel_name().ends_with("lease.acquire") || payload == "lease.acquire",
                "{classes}: {} {payload}",
                msg.get_channel_name()
            );
        }
        // Everything published until the expiry's keyevent, with when it came.
        let mut events = Vec::new();
        loop {
            let msg = pubsub.get_message().expect("the expiry's events");
            let payload: String = msg.get_payload().expect("payload");
            let channel = msg.get_channel_name().to_string();
            let done = channel == "__keyevent@0__:lease.expire";
            events.push((channel, payload, paused.elapsed()));
            if done {
                break;
            }
        }
        // The events of the same deletion are already sent; nothing else follows.
        pubsub
            .set_read_timeout(Some(Duration::from_millis(200)))
            .expect("read timeout");
        while let Ok(msg) = pubsub.get_message() {
            let payload: String = msg.get_payload().expect("payload");
            events.push((
                msg.get_channel_name().to_string(),
                payload,
                paused.elapsed(),
            ));
        }
        // The lease expires 200 ms in. The server times the pause from its cached
        // clock, which can be a little behind the moment the pipeline was sent:
        // the pause may end a few milliseconds before 500 ms on ours.
        assert!(
            events
                .iter()
                .all(|(_, _, at)| *at >= Duration::from_millis(450)),
            "{classes}: published during the pause: {events:?}"
        );
        let count = |channel: &str, payload: &str| {
            events
                .iter()
                .filter(|(c, p, _)| c == channel && p == payload)
                .count()
        };
        assert_eq!(count("__keyevent@0__:lease.expire", "L"), 1, "{events:?}");
        assert_eq!(count("__keyspace@0__:L", "lease.expire"), 1, "{events:?}");
        assert_eq!(lease_info(&mut con, "L"), None);
    }
    assert_alive(&server);
});

// ---------------------------------------------------------------------------------------
// SHUTDOWN, FLUSHALL
// ---------------------------------------------------------------------------------------

for_each_server!(shutdown_with_blocked_waiters_exits_cleanly, |flavor| {
    let mut server = Server::start_with(flavor, ServerOptions::new().config("save", "3600 1"));
    let mut con = server.client();
    let fence = take(&mut con, "L", MINUTE, "holder");
    call(&mut con, "LEASE.FENCE", ("R", fence));
    let waiters = [
        Waiter::block(&server, "L", MINUTE, "w1", 0, &[]),
        Waiter::block(&server, "L", MINUTE, "w2", 0, &[]),
    ];
    drop(con);
    server.shutdown(&[]);
    for w in waiters {
        assert!(w.answer("a waiter at SHUTDOWN").is_err());
    }
    assert_no_crash(&server);
    assert!(server.log().contains("ready to exit"), "{}", server.log());
    // The saved RDB has the lease, its record and the fence sequence.
    server.start_again();
    let mut con = server.client();
    let info = lease_info(&mut con, "L").expect("L after the restart");
    assert_eq!(
        (info.state.as_str(), info.fence, info.waiters),
        ("held", fence, 0)
    );
    assert_eq!(renew(&mut con, "L", "holder", MINUTE), 1);
    let reply = call(&mut con, "LEASE.FENCE", ("R", fence - 1));
    assert_eq!(expect_error(&reply, "R"), stale(fence - 1, fence));
    let later = take(&mut con, "unsaved", MINUTE, "u");
    assert!(later > fence);
    // SHUTDOWN NOSAVE: the same clean exit, and nothing saved.
    let queued = Waiter::block(&server, "L", MINUTE, "w3", 0, &[]);
    drop(con);
    server.shutdown(&["NOSAVE"]);
    assert!(queued.answer("a waiter at SHUTDOWN NOSAVE").is_err());
    assert_no_crash(&server);
    server.start_again();
    let mut con = server.client();
    assert_eq!(lease_info(&mut con, "unsaved"), None);
    assert_eq!(lease_info(&mut con, "L").expect("L").state, "held");
    assert!(take(&mut con, "after", MINUTE, "n") > later);
    assert_alive(&server);
});

for_each_server!(flushall_keeps_the_fence_sequence_rising, |flavor| {
    let (primary, replica) = master_and_replica(flavor);
    let mut con = primary.client();
    let mut fence = take(&mut con, "L", MINUTE, "a");
    for flush in [&["SYNC"], &["ASYNC"]] {
        call(&mut con, "LEASE.FENCE", ("R", fence));
        let last = lease_stat(&primary, "fence_last");
        assert_ok(call(&mut con, "FLUSHALL", flush), "FLUSHALL");
        assert!(lease_stat(&primary, "fence_last") >= last);
        assert_eq!(lease_info(&mut con, "L"), None);
        assert_eq!(renew(&mut con, "L", "a", MINUTE), 0);
        // The record went with the flush, as with DEL: any fence is accepted again.
        assert_eq!(int(call(&mut con, "LEASE.FENCE", ("R", 1))), 1);
        let next = take(&mut con, "L", MINUTE, "a");
        assert!(next > last, "FLUSHALL {flush:?}: {next} after {last}");
        fence = next;
    }
    replica.wait_for_sync(&primary);
    assert_eq!(digest(&primary), digest(&replica));
    assert!(lease_stat(&replica, "fence_last") >= fence);
    assert_alive(&primary);
});
