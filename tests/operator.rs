//! What the server's own commands do to leases and records (issue 14): a Redis TTL
//! never stays on them, `RESTORE`/`RENAME`/`COPY ... REPLACE` never lower a fence nor
//! bring an older holder back, one client-chosen fence cannot end the grants of a node,
//! a writable replica refuses lease writes, waiters are answered when a flush, a swap or
//! an overwrite takes their key (Redis 7.0 too), module arguments are range-checked,
//! and the smaller edges: COPY of a lease, crafted payloads, `lease.expire` on a
//! takeover, index entries of keys that left, nil arrays, bare container commands in
//! LEASE.FENCE. Every case on every server of the matrix.

#[macro_use]
extern crate harness;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use harness::calls::{call, digest, int, pttl, release, renew, stale, take};
use harness::lease::{dump, lease_dump, lease_info, lease_stat};
use harness::reply::{assert_ok, error_text, expect_error, granted, FENCE_LIMIT};
use harness::waiter::Waiter;
use harness::{
    free_port, master_and_replica, module_path, now_ms, wait_until, Server, ServerOptions,
};
use redis::{Connection, Value};

const MINUTE: u64 = 60_000;
const MAX_TTL: u64 = 1 << 40;
/// `MAX_AHEAD` in model/src/lease/fence.rs: how far above its clock floor anything observed may
/// carry a node's fence sequence.
const MAX_AHEAD: u64 = 30 * 86_400_000 * 1024;
const WAIT: Duration = Duration::from_secs(10);
const READONLY: &str = "READONLY You can't write against a read only replica.";

// ---------------------------------------------------------------------------------------
// Redis TTLs
// ---------------------------------------------------------------------------------------

for_each_server!(a_redis_ttl_never_stays_on_a_lease_or_record, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    take(&mut con, "L", MINUTE, "a");
    assert_eq!(int(call(&mut con, "LEASE.FENCE", ("R", 100))), 100);
    let at = now_ms() + 300;
    let ways: [(&str, Vec<String>); 4] = [
        ("EXPIRE", vec!["1".into()]),
        ("PEXPIRE", vec!["300".into()]),
        ("EXPIREAT", vec![(at / 1000 + 1).to_string()]),
        ("PEXPIREAT", vec![at.to_string()]),
    ];
    for (command, args) in &ways {
        for key in ["L", "R"] {
            // The server answers as it always does, and the very next command sees
            // no TTL.
            assert_eq!(
                int(call(&mut con, command, (key, args))),
                1,
                "{command} {key}"
            );
            assert_eq!(pttl(&mut con, key), -1, "PTTL {key} after {command}");
        }
    }
    // Past every TTL that was asked for, both are there: the lease still held by its
    // token, the record still refusing an older fence.
    thread::sleep(Duration::from_millis(1_100));
    assert_eq!(renew(&mut con, "L", "a", MINUTE), 1);
    let stale_reply = call(&mut con, "LEASE.FENCE", ("R", 99));
    assert_eq!(expect_error(&stale_reply, "a stale fence"), stale(99, 100));
    assert!(
        error_text(&call(
            &mut con,
            "LEASE.ACQUIRE",
            ("L", MINUTE, "TOKEN", "b")
        ))
        .is_none()
            && lease_info(&mut con, "L").is_some_and(|i| i.state == "held"),
    );
    // RESTORE with a TTL, and a TTL carried into a transaction by RESTORE then RENAME:
    // gone once the command (or EXEC) is done.
    let payload = dump(&mut con, "R").payload();
    assert_ok(
        call(&mut con, "RESTORE", ("R2", 5_000, &payload[..])),
        "RESTORE with a TTL",
    );
    assert_eq!(pttl(&mut con, "R2"), -1);
    let lease_dump = dump(&mut con, "L").payload();
    assert_ok(call(&mut con, "MULTI", Vec::<String>::new()), "MULTI");
    call(&mut con, "RESTORE", ("tmp", 5_000, &lease_dump[..]));
    call(&mut con, "RENAME", ("tmp", "L2"));
    call(&mut con, "MOVE", ("L2", 1));
    let exec = call(&mut con, "EXEC", Vec::<String>::new());
    assert_eq!(int(call(&mut con, "EXISTS", "L2")), 0, "{exec:?}");
    assert_ok(call(&mut con, "SELECT", 1), "SELECT 1");
    assert_eq!(pttl(&mut con, "L2"), -1);
    assert_eq!(renew(&mut con, "L2", "a", MINUTE), 1);
});

for_each_server!(
    a_ttl_set_on_the_primary_is_gone_on_replica_and_aof,
    |flavor| {
        let options = ServerOptions::new()
            .config("appendonly", "yes")
            .config("appendfsync", "always");
        let mut primary = Server::start_with(flavor, options);
        let replica = Server::start(flavor);
        replica.replicaof(&primary);
        let mut con = primary.client();
        take(&mut con, "L", MINUTE, "a");
        call(&mut con, "LEASE.FENCE", ("R", 7));
        call(&mut con, "PEXPIRE", ("L", 400));
        call(&mut con, "EXPIRE", ("R", 1));
        replica.wait_for_sync(&primary);
        let mut rcon = replica.client();
        assert_eq!(pttl(&mut rcon, "L"), -1, "replica PTTL L");
        assert_eq!(pttl(&mut rcon, "R"), -1, "replica PTTL R");
        assert_eq!(digest(&primary), digest(&replica));
        // The AOF replays the TTL and its removal alike.
        drop(con);
        primary.restart();
        let mut con = primary.client();
        assert_eq!(pttl(&mut con, "L"), -1, "PTTL L after the AOF");
        assert_eq!(pttl(&mut con, "R"), -1, "PTTL R after the AOF");
        thread::sleep(Duration::from_millis(1_100));
        assert_eq!(renew(&mut con, "L", "a", MINUTE), 1);
    }
);

// ---------------------------------------------------------------------------------------
// Older values over newer ones
// ---------------------------------------------------------------------------------------

for_each_server!(restore_replace_never_lowers_a_fence, |flavor| {
    let (primary, replica) = master_and_replica(flavor);
    let mut con = primary.client();

    // A record: an older highest restored over a newer one keeps the newer.
    call(&mut con, "LEASE.FENCE", ("R", 100));
    let old_record = dump(&mut con, "R").payload();
    call(&mut con, "LEASE.FENCE", ("R", 200));
    assert_ok(
        call(&mut con, "RESTORE", ("R", 0, &old_record[..], "REPLACE")),
        "RESTORE REPLACE of a record",
    );
    let reply = call(&mut con, "LEASE.FENCE", ("R", 150, "SET", "data", "stale"));
    assert_eq!(expect_error(&reply, "fence 150"), stale(150, 200));
    assert_eq!(call(&mut con, "GET", "data"), Value::Nil);
    // A newer one restored over an older one is taken as it is.
    call(&mut con, "LEASE.FENCE", ("R3", 300));
    let newer_record = dump(&mut con, "R3").payload();
    call(&mut con, "RESTORE", ("R", 0, &newer_record[..], "REPLACE"));
    let reply = call(&mut con, "LEASE.FENCE", ("R", 250));
    assert_eq!(expect_error(&reply, "fence 250"), stale(250, 300));

    // A lease: an older grant restored over a newer one comes back free, with the
    // newer fence; neither token holds it.
    let first = take(&mut con, "L", MINUTE, "old");
    let old_lease = dump(&mut con, "L").payload();
    assert_eq!(release(&mut con, "L", "old"), 1);
    let second = take(&mut con, "L", MINUTE, "new");
    assert!(second > first);
    assert_ok(
        call(&mut con, "RESTORE", ("L", 0, &old_lease[..], "REPLACE")),
        "RESTORE REPLACE of a lease",
    );
    let info = lease_info(&mut con, "L").expect("L");
    assert_eq!((info.state.as_str(), info.fence), ("free", second));
    assert_eq!(
        renew(&mut con, "L", "old", MINUTE),
        0,
        "the old token is back"
    );
    let third = take(&mut con, "L", MINUTE, "next");
    assert!(third > second, "{third} after {second}");

    // RENAME and COPY ... REPLACE onto an existing key follow the same rule.
    call(&mut con, "LEASE.FENCE", ("low", 10));
    call(&mut con, "LEASE.FENCE", ("high", 500));
    assert_ok(call(&mut con, "RENAME", ("low", "high")), "RENAME low high");
    let reply = call(&mut con, "LEASE.FENCE", ("high", 20));
    assert_eq!(expect_error(&reply, "after RENAME"), stale(20, 500));
    call(&mut con, "LEASE.FENCE", ("low", 10));
    assert_eq!(int(call(&mut con, "COPY", ("low", "high", "REPLACE"))), 1);
    let reply = call(&mut con, "LEASE.FENCE", ("high", 20));
    assert_eq!(expect_error(&reply, "after COPY REPLACE"), stale(20, 500));
    take(&mut con, "older", MINUTE, "x");
    let newer = take(&mut con, "newer", MINUTE, "y");
    assert_ok(
        call(&mut con, "RENAME", ("older", "newer")),
        "RENAME leases",
    );
    let info = lease_info(&mut con, "newer").expect("newer");
    assert_eq!((info.state.as_str(), info.fence), ("free", newer));
    assert_eq!(renew(&mut con, "newer", "x", MINUTE), 0);

    // Every node applied the same rule to the same values.
    replica.wait_for_sync(&primary);
    assert_eq!(digest(&primary), digest(&replica));
    // A DEL, then a RESTORE, is a new key: the dump comes back as it was.
    call(&mut con, "DEL", "R");
    call(&mut con, "RESTORE", ("R", 0, &old_record[..]));
    assert_eq!(int(call(&mut con, "LEASE.FENCE", ("R", 100))), 100);
});

// ---------------------------------------------------------------------------------------
// Fences a client chose
// ---------------------------------------------------------------------------------------

for_each_server!(one_client_fence_cannot_end_the_grants_of_a_node, |flavor| {
    let a = Server::start(flavor);
    let mut b = Server::start_with(flavor, ServerOptions::new().config("save", "3600 1"));
    let mut acon = a.client();
    let mut bcon = b.client();
    let top = FENCE_LIMIT - 1;
    assert_eq!(int(call(&mut acon, "LEASE.FENCE", ("R", top))), top as i64);
    take(&mut bcon, "before", MINUTE, "t");
    // MIGRATE and DUMP/RESTORE carry the record to node B.
    let reply = call(
        &mut acon,
        "MIGRATE",
        ("127.0.0.1", b.port, "R", 0, 5_000, "COPY"),
    );
    assert_ok(reply, "MIGRATE R");
    let payload = dump(&mut acon, "R").payload();
    assert_ok(
        call(&mut bcon, "RESTORE", ("R2", 0, &payload[..])),
        "RESTORE R2",
    );
    // A crafted lease with a fence one below the limit, too.
    let template = dump(&mut bcon, "before");
    let crafted = lease_dump(&template, top - 1, 0, b"").payload();
    assert_ok(
        call(&mut bcon, "RESTORE", ("crafted", 0, &crafted[..])),
        "RESTORE of a free lease near 2^53",
    );
    let ceiling = now_ms() * 1024 + MAX_AHEAD;
    let check = |server: &Server, when: &str| {
        let con = &mut server.client();
        let last = lease_stat(server, "fence_last");
        assert!(last <= ceiling + MINUTE * 1024, "{when}: fence_last {last}");
        let mut fences = Vec::new();
        for i in 0..3 {
            fences.push(take(con, &format!("k{when}{i}"), MINUTE, "t"));
        }
        assert!(fences.windows(2).all(|w| w[0] < w[1]), "{when}: {fences:?}");
        assert!(fences.iter().all(|&f| f < top - 1), "{when}: {fences:?}");
    };
    check(&b, "after-restore");
    // The crafted key's own next grant is above its fence; other keys are unaffected.
    assert_eq!(take(&mut bcon, "crafted", MINUTE, "c"), top);
    check(&b, "after-crafted");
    // FLUSHALL and a restart keep the node granting.
    assert_ok(
        call(&mut bcon, "FLUSHALL", Vec::<String>::new()),
        "FLUSHALL",
    );
    check(&b, "after-flushall");
    drop(bcon);
    b.restart();
    check(&b, "after-restart");
});

// ---------------------------------------------------------------------------------------
// Writable replicas
// ---------------------------------------------------------------------------------------

for_each_server!(a_writable_replica_refuses_lease_writes, |flavor| {
    let primary = Server::start(flavor);
    let replica = Server::start_with(
        flavor,
        ServerOptions::new().config("replica-read-only", "no"),
    );
    replica.replicaof(&primary);
    let mut con = primary.client();
    let mut rcon = replica.client();
    let fence = take(&mut con, "L", MINUTE, "a");
    call(&mut con, "LEASE.FENCE", ("R", fence));
    replica.wait_for_sync(&primary);
    let before = digest(&replica);
    let refused: [(&str, Vec<String>); 7] = [
        ("LEASE.ACQUIRE", vec!["new".into(), "1000".into()]),
        (
            "LEASE.ACQUIRE",
            vec!["L".into(), "1000".into(), "TOKEN".into(), "a".into()],
        ),
        ("LEASE.RENEW", vec!["L".into(), "a".into(), "1000".into()]),
        ("LEASE.RELEASE", vec!["L".into(), "a".into()]),
        ("LEASE.FENCE", vec!["R".into(), (fence + 1).to_string()]),
        (
            "LEASE.FENCE",
            vec![
                "R2".into(),
                "5".into(),
                "SET".into(),
                "x".into(),
                "1".into(),
            ],
        ),
        ("LEASE.APPLY", vec!["L".into(), "1:1".into(), "t".into()]),
    ];
    for (command, args) in &refused {
        let reply = call(&mut rcon, command, args);
        let error = expect_error(&reply, &format!("{command} {args:?} on the replica"));
        if *command == "LEASE.APPLY" {
            // Hidden altogether where the server has internal commands (Redis 8).
            assert!(
                error.starts_with("ERR LEASE.APPLY") || error.starts_with("ERR unknown command"),
                "{error}"
            );
        } else {
            assert_eq!(error, READONLY, "{command} {args:?}");
        }
    }
    // Its own keys are still writable, reads of leases still answer, and nothing of
    // the leases changed.
    assert_ok(call(&mut rcon, "SET", ("own", "1")), "SET on the replica");
    call(&mut rcon, "DEL", "own");
    assert_eq!(lease_info(&mut rcon, "L").expect("L").state, "held");
    assert_eq!(digest(&replica), before);
    // The primary's effects still arrive.
    assert_eq!(release(&mut con, "L", "a"), 1);
    replica.wait_for_sync(&primary);
    assert_eq!(lease_info(&mut rcon, "L"), None);
});

// ---------------------------------------------------------------------------------------
// Waiters whose key is flushed, swapped or overwritten
// ---------------------------------------------------------------------------------------

fn answered(server: &Server, waiter: Waiter, what: &str) -> Value {
    let (reply, _) = waiter.reply(WAIT, &format!("the waiter after {what}"));
    // The reply can reach the client before the server frees the waiter's
    // place in the queue (after the reply, in the same event-loop turn).
    wait_until(&format!("no waiter counted after {what}"), WAIT, || {
        lease_stat(server, "waiters") == 0
    });
    reply
}

for_each_server!(
    waiters_are_answered_when_their_key_is_flushed_or_swapped,
    |flavor| {
        let server = Server::start(flavor);
        let mut con = server.client();
        let ops: [&[&str]; 5] = [
            &["FLUSHALL"],
            &["FLUSHALL", "ASYNC"],
            &["FLUSHDB"],
            &["FLUSHDB", "ASYNC"],
            &["SWAPDB", "0", "1"],
        ];
        for op in ops {
            let what = op.join(" ");
            let fence = take(&mut con, "L", MINUTE, "holder");
            let waiter = Waiter::block(&server, "L", 10_000, "waiter", 0, &[]);
            call(&mut con, op[0], &op[1..]);
            let reply = answered(&server, waiter, &what);
            assert!(granted(&reply, "waiter").is_some(), "{what}: {reply:?}");
            // The waiter holds the key now, above the fence it had.
            let info = lease_info(&mut con, "L").expect("L");
            assert_eq!(info.state, "held", "{what}");
            assert!(info.fence > fence, "{what}");
            assert_eq!(release(&mut con, "L", "waiter"), 1, "{what}");
            call(&mut con, "FLUSHALL", "SYNC");
            // The values of an earlier FLUSHALL ASYNC may still be freed in the
            // background.
            wait_until("every lease value freed", WAIT, || {
                lease_stat(&server, "keys") == 0
            });
        }
    }
);

for_each_server!(
    waiters_are_answered_when_their_key_is_overwritten,
    |flavor| {
        let server = Server::start(flavor);
        let mut con = server.client();
        assert_ok(call(&mut con, "SET", ("s", "x")), "SET s");
        let string_dump = dump(&mut con, "s").payload();
        let ops: [&[&str]; 4] = [
            &["SET", "L", "x"],
            &["RENAME", "s", "L"],
            &["COPY", "s", "L", "REPLACE"],
            &["LEASE.FENCE", "R", "1", "SET", "L", "x"],
        ];
        for op in ops {
            let what = op.join(" ");
            take(&mut con, "L", MINUTE, "holder");
            let waiter = Waiter::block(&server, "L", 10_000, "waiter", 0, &[]);
            call(&mut con, op[0], &op[1..]);
            let reply = answered(&server, waiter, &what);
            let error = expect_error(&reply, &what);
            assert!(error.starts_with("WRONGTYPE"), "{what}: {error}");
            call(&mut con, "DEL", "L");
            call(&mut con, "SET", ("s", "x"));
            // The name takes new leases at once.
            take(&mut con, "L", MINUTE, "next");
            call(&mut con, "DEL", "L");
        }
        take(&mut con, "L", MINUTE, "holder");
        let waiter = Waiter::block(&server, "L", 10_000, "waiter", 0, &[]);
        call(&mut con, "RESTORE", ("L", 0, &string_dump[..], "REPLACE"));
        let reply = answered(&server, waiter, "RESTORE REPLACE");
        assert!(expect_error(&reply, "RESTORE").starts_with("WRONGTYPE"));
    }
);

// ---------------------------------------------------------------------------------------
// Module arguments
// ---------------------------------------------------------------------------------------

/// Starts the server with `loadmodule <module> <args>` and expects it to exit: returns
/// what it printed.
fn refused_start(server: &Server, args: &[&str]) -> String {
    let mut command = Command::new(server.flavor.binary());
    command
        .arg("--port")
        .arg(free_port().to_string())
        .args(["--bind", "127.0.0.1", "--save", ""])
        .arg("--dir")
        .arg(&server.dir)
        .arg("--loadmodule")
        .arg(module_path())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().expect("spawn the server");
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            assert!(!status.success(), "{args:?}: exit {status}");
            let mut out = String::new();
            child
                .stdout
                .take()
                .expect("stdout")
                .read_to_string(&mut out)
                .ok();
            child
                .stderr
                .take()
                .expect("stderr")
                .read_to_string(&mut out)
                .ok();
            return out;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{} started with loadmodule arguments {args:?}",
                server.flavor
            );
        }
        thread::sleep(Duration::from_millis(10));
    }
}

for_each_server!(
    module_arguments_are_checked_as_config_set_checks_them,
    |flavor| {
        // A running server of the flavor, for its directory and binary.
        let server = Server::start_with(flavor, ServerOptions::without_module());
        let restore_ok = flavor != harness::Flavor::Redis7;
        let cases: Vec<(Vec<&str>, &str)> = vec![
            (
                vec!["reap-hz", "0"],
                "'reap-hz' must be an integer from 1 to 1000, not '0'",
            ),
            (
                vec!["reap-hz", "-1"],
                "'reap-hz' must be an integer from 1 to 1000, not '-1'",
            ),
            (
                vec!["reap-hz", "99999999"],
                "'reap-hz' must be an integer from 1 to 1000",
            ),
            (
                vec!["reap-hz", "abc"],
                "'reap-hz' must be an integer from 1 to 1000, not 'abc'",
            ),
            (
                vec!["reap-batch", "0"],
                "'reap-batch' must be an integer from 1 to 100000, not '0'",
            ),
            (
                vec!["max-waiters", "0"],
                "'max-waiters' must be an integer from 1 to 1000000, not '0'",
            ),
            (
                vec!["allkeys-eviction", "sometimes"],
                "must be one of refuse, restore, allow",
            ),
            (vec!["reap-hz", "1\nfake log line"], "not '1?fake log line'"),
        ];
        for (args, names) in &cases {
            let out = refused_start(&server, args);
            assert!(out.contains(names), "{args:?}: {out}");
            assert!(!out.contains("\nfake log line"), "{args:?}: {out}");
        }
        if restore_ok {
            // Accepted where the server has post-notification jobs.
            let started = Server::start_with(
                flavor,
                ServerOptions::new()
                    .module_arg("allkeys-eviction")
                    .module_arg("restore"),
            );
            let mut con = started.client();
            let value = call(&mut con, "CONFIG", ("GET", "lease.allkeys-eviction"));
            assert_eq!(
                value,
                Value::Array(vec![
                    Value::BulkString(b"lease.allkeys-eviction".to_vec()),
                    Value::BulkString(b"restore".to_vec()),
                ])
            );
        } else {
            let out = refused_start(&server, &["allkeys-eviction", "restore"]);
            assert!(out.contains("needs post-notification jobs"), "{out}");
        }
    }
);

// ---------------------------------------------------------------------------------------
// Smaller edges
// ---------------------------------------------------------------------------------------

for_each_server!(
    copy_of_a_lease_is_refused_and_of_a_record_allowed,
    |flavor| {
        let server = Server::start(flavor);
        let mut con = server.client();
        take(&mut con, "L", MINUTE, "a");
        let before = digest(&server);
        let reply = call(&mut con, "COPY", ("L", "L2"));
        assert!(error_text(&reply).is_some(), "COPY of a lease: {reply:?}");
        assert_eq!(int(call(&mut con, "EXISTS", "L2")), 0);
        assert_eq!(digest(&server), before);
        call(&mut con, "LEASE.FENCE", ("R", 9));
        assert_eq!(int(call(&mut con, "COPY", ("R", "R2"))), 1);
        let reply = call(&mut con, "LEASE.FENCE", ("R2", 8));
        assert_eq!(expect_error(&reply, "R2"), stale(8, 9));
    }
);

for_each_server!(crafted_deadlines_are_refused, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    take(&mut con, "template", MINUTE, "t");
    let template = dump(&mut con, "template");
    let cases: [(&str, Vec<u8>); 2] = [
        (
            "a deadline past now + 2^40",
            lease_dump(&template, 5, now_ms() + MAX_TTL + MINUTE, b"t").payload(),
        ),
        (
            "a deadline with an empty token",
            lease_dump(&template, 5, now_ms() + MINUTE, b"").payload(),
        ),
    ];
    for (what, payload) in cases {
        let reply = call(&mut con, "RESTORE", ("victim", 0, &payload[..]));
        let error = expect_error(&reply, what);
        assert!(error.contains("Bad data format"), "{what}: {error}");
        assert_eq!(int(call(&mut con, "EXISTS", "victim")), 0, "{what}");
    }
    // The longest ttl itself still restores.
    let longest = lease_dump(&template, 5, now_ms() + MAX_TTL - MINUTE, b"t").payload();
    assert_ok(
        call(&mut con, "RESTORE", ("ok", 0, &longest[..])),
        "longest ttl",
    );
});

for_each_server!(
    an_expiry_taken_over_is_announced_as_lease_expire,
    |flavor| {
        let server = Server::start(flavor);
        let mut con = server.client();
        // The reaper stays away: at 1 Hz it would delete an expired lease nobody waits for
        // before the takeover below, and that is the other path.
        call(&mut con, "CONFIG", ("SET", "lease.reap-hz", 1));
        let mut sub = server.client();
        call(&mut sub, "CONFIG", ("SET", "notify-keyspace-events", "KEd"));
        let mut pubsub = sub.as_pubsub();
        pubsub
            .psubscribe("__keyevent@0__:lease.*")
            .expect("PSUBSCRIBE");
        pubsub.set_read_timeout(Some(WAIT)).expect("read timeout");
        let expired = lease_stat(&server, "expired");
        // An ACQUIRE that takes over an expired, unreaped lease.
        take(&mut con, "x", 50, "a");
        thread::sleep(Duration::from_millis(80));
        take(&mut con, "x", MINUTE, "b");
        let mut events = Vec::new();
        while events.len() < 3 {
            let msg = pubsub.get_message().expect("a keyspace event");
            let payload: String = msg.get_payload().expect("payload");
            events.push((msg.get_channel_name().to_string(), payload));
        }
        let names: Vec<&str> = events
            .iter()
            .map(|(c, _)| c.rsplit(':').next().unwrap_or(""))
            .collect();
        assert_eq!(
            names,
            ["lease.acquire", "lease.expire", "lease.acquire"],
            "{events:?}"
        );
        assert_eq!(lease_stat(&server, "expired"), expired + 1);
    }
);

for_each_server!(index_entries_leave_with_their_keys, |flavor| {
    let a = Server::start(flavor);
    let b = Server::start(flavor);
    let mut con = a.client();
    for i in 0..20 {
        take(&mut con, &format!("k{i}"), MINUTE, "t");
    }
    let indexed = |s: &Server| lease_stat(s, "indexed_deadlines");
    assert_eq!(indexed(&a), 20);
    call(&mut con, "DEL", ("k0", "k1", "k2"));
    call(&mut con, "UNLINK", "k3");
    assert_ok(
        call(
            &mut con,
            "MIGRATE",
            ("127.0.0.1", b.port, "", 0, 5_000, "KEYS", "k4", "k5"),
        ),
        "MIGRATE",
    );
    call(&mut con, "SET", ("k6", "overwritten"));
    assert_eq!(lease_stat(&a, "keys"), 13);
    assert_eq!(indexed(&a), 13, "index entries of keys that left");
    assert_eq!(indexed(&b), 2);
});

/// One raw RESP2 exchange: the exact bytes of the reply.
fn raw_reply(server: &Server, command: &[&str], read_for: Duration) -> Vec<u8> {
    let mut stream = TcpStream::connect(server.addr()).expect("connect");
    stream.set_read_timeout(Some(read_for)).expect("timeout");
    let mut request = format!("*{}\r\n", command.len());
    for arg in command {
        request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    stream.write_all(request.as_bytes()).expect("write");
    let mut reply = Vec::new();
    let mut buf = [0u8; 256];
    while !reply.ends_with(b"\r\n") {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => reply.extend_from_slice(&buf[..n]),
            Err(e) => panic!("{command:?}: no reply ({e}), so far {reply:?}"),
        }
    }
    reply
}

for_each_server!(busy_and_timed_out_acquires_reply_a_null_array, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    take(&mut con, "L", MINUTE, "a");
    let busy = raw_reply(&server, &["LEASE.ACQUIRE", "L", "1000"], WAIT);
    assert_eq!(busy, b"*-1\r\n", "busy: {}", String::from_utf8_lossy(&busy));
    let timed_out = raw_reply(
        &server,
        &["LEASE.ACQUIRE", "L", "1000", "BLOCK", "50"],
        WAIT,
    );
    assert_eq!(
        timed_out,
        b"*-1\r\n",
        "timeout: {}",
        String::from_utf8_lossy(&timed_out)
    );
    // As BLPOP replies.
    let blpop = raw_reply(&server, &["BLPOP", "list", "0.05"], WAIT);
    assert_eq!(blpop, b"*-1\r\n");
});

for_each_server!(
    a_container_command_without_subcommand_runs_in_fence,
    |flavor| {
        let server = Server::start(flavor);
        let mut con = server.client();
        let reply = call(&mut con, "LEASE.FENCE", ("R", 5, "COMMAND", "COUNT"));
        let count = int(reply);
        assert!(count > 100, "{count}");
        let reply = call(&mut con, "LEASE.FENCE", ("R", 5, "COMMAND"));
        match reply {
            Value::Array(commands) => assert_eq!(commands.len() as i64, count),
            other => panic!("LEASE.FENCE R 5 COMMAND: {other:?}"),
        }
    }
);

for_each_server!(a_replica_with_aof_keeps_what_its_primary_sent, |flavor| {
    let primary = Server::start(flavor);
    let options = ServerOptions::new()
        .config("appendonly", "yes")
        .config("appendfsync", "always");
    let mut replica = Server::start_with(flavor, options);
    replica.replicaof(&primary);
    let mut con = primary.client();
    take(&mut con, "held", MINUTE, "a");
    take(&mut con, "released", MINUTE, "a");
    assert_eq!(release(&mut con, "released", "a"), 1);
    take(&mut con, "renewed", MINUTE, "a");
    assert_eq!(renew(&mut con, "renewed", "a", 2 * MINUTE), 1);
    call(&mut con, "LEASE.FENCE", ("R", 7));
    replica.wait_for_sync(&primary);
    let before = digest(&replica);
    assert_eq!(before, digest(&primary));
    // The replica's own AOF alone rebuilds what it had (its primary is gone).
    drop(con);
    drop(primary);
    replica.restart();
    assert_eq!(digest(&replica), before);
    let mut rcon = replica.client();
    assert_eq!(lease_info(&mut rcon, "held").expect("held").state, "held");
    assert_eq!(lease_info(&mut rcon, "released"), None);
});

for_each_server!(a_lease_expiry_aborts_exec_as_a_key_expiry_does, |flavor| {
    // AOF on: a reaper that wrote while writes are paused would crash the server.
    let server = Server::start_with(flavor, ServerOptions::new().config("appendonly", "yes"));
    let mut con = server.client();
    let mut pauser = server.client();
    // Three transactions watch: a lease that expires, a native key with PX that
    // expires, and a lease that is renewed and stays live.
    take(&mut con, "expiring", 200, "t");
    assert_ok(call(&mut con, "SET", ("native", "v", "PX", 200)), "SET PX");
    take(&mut con, "renewed", 200, "t");
    // (A renewal after WATCH is a change of the key: it would abort that EXEC.)
    assert_eq!(renew(&mut con, "renewed", "t", MINUTE), 1);
    let mut watchers: Vec<(&str, Connection)> = Vec::new();
    for key in ["expiring", "native", "renewed"] {
        let mut w = server.client();
        assert_ok(call(&mut w, "WATCH", key), "WATCH");
        assert_ok(call(&mut w, "MULTI", Vec::<String>::new()), "MULTI");
        call(&mut w, "SET", (format!("written-{key}"), 1));
        watchers.push((key, w));
    }
    // Writes paused past the deadlines: the reaper may not delete anything, so
    // only EXEC itself can see that the lease expired.
    assert_ok(
        call(&mut pauser, "CLIENT", ("PAUSE", 500, "WRITE")),
        "CLIENT PAUSE",
    );
    thread::sleep(Duration::from_millis(300));
    let mut outcomes = Vec::new();
    for (key, mut w) in watchers {
        // Waits for the pause to end.
        let reply = call(&mut w, "EXEC", Vec::<String>::new());
        outcomes.push((key, reply == Value::Nil));
    }
    assert_eq!(
        outcomes,
        [("expiring", true), ("native", true), ("renewed", false)],
        "(watched key, EXEC aborted)"
    );
    assert_eq!(int(call(&mut con, "EXISTS", "written-renewed")), 1);
    assert_eq!(int(call(&mut con, "EXISTS", "written-expiring")), 0);
});

for_each_server!(a_renewal_to_a_shorter_ttl_expires_on_time, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    take(&mut con, "L", MINUTE, "a");
    assert_eq!(renew(&mut con, "L", "a", 300), 1);
    let waiter = Waiter::block(&server, "L", 10_000, "waiter", 0, &[]);
    // Served at the new deadline, not a minute later.
    let reply = answered(&server, waiter, "the shortened lease's deadline");
    assert!(granted(&reply, "waiter").is_some(), "{reply:?}");
    assert_eq!(lease_stat(&server, "expired"), 1);
    // And without a waiter the reaper deletes it at its deadline.
    take(&mut con, "M", MINUTE, "a");
    assert_eq!(renew(&mut con, "M", "a", 200), 1);
    wait_until("M to be reaped", Duration::from_secs(2), || {
        lease_info(&mut con, "M").is_none()
    });
});
