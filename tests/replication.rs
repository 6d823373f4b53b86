//! Leases and resource records on replicas: what a full sync and the replication
//! stream carry (absolute deadlines and fences, never a replica's own clock or random
//! source), that a replica refuses client writes yet reports expired leases as free,
//! and that a promoted replica keeps every lease, issues fences above everything its
//! old master issued and starts reaping.

#[macro_use]
extern crate harness;

use std::time::Duration;

use harness::calls::{
    acquire, call, call_error, digest, exists, fenced, get, int, release, renew, stale, take, text,
    NONE,
};
use harness::lease::{lease_info, lease_stat, restore_fence_ahead};
use harness::reply::{error_text, grant};
use harness::{attach, master_and_replica, now_ms, wait_until, Server, ServerOptions};
use redis::Value;

/// The replica has caught up, and says about each key what the master says: same
/// state and fence, a ttl within 100 ms (both run on this machine's clock); the whole
/// datasets hash the same.
fn assert_same(master: &Server, replica: &Server, keys: &[&str]) {
    replica.wait_for_sync(master);
    let mut m = master.client();
    let mut r = replica.client();
    for key in keys {
        let on_master = lease_info(&mut m, key);
        let on_replica = lease_info(&mut r, key);
        match (&on_master, &on_replica) {
            (None, None) => {}
            (Some(a), Some(b)) => {
                assert_eq!(a.state, b.state, "{key}: master {a:?}, replica {b:?}");
                assert_eq!(a.fence, b.fence, "{key}: master {a:?}, replica {b:?}");
                assert!(
                    (a.ttl - b.ttl).abs() <= 100,
                    "{key}: master {a:?}, replica {b:?}"
                );
            }
            _ => panic!("{key}: master {on_master:?}, replica {on_replica:?}"),
        }
    }
    assert_eq!(digest(master), digest(replica), "DEBUG DIGEST differs");
    for field in ["keys", "resource_keys"] {
        assert_eq!(
            lease_stat(master, field),
            lease_stat(replica, field),
            "INFO lease_{field}"
        );
    }
}

// ---------------------------------------------------------------------------

for_each_server!(replica_serves_lease_info_and_refuses_writes, |flavor| {
    let master = Server::start(flavor);
    let replica = Server::start(flavor);
    let mut m = master.client();
    let fa = take(&mut m, "lease:a", 60_000, "token-a");
    take(&mut m, "lease:b", 20_000, "token-b");
    assert_eq!(renew(&mut m, "lease:b", "token-b", 90_000), 1);
    take(&mut m, "lease:c", 60_000, "token-c");
    assert_eq!(release(&mut m, "lease:c", "token-c"), 1);
    assert_eq!(fenced(&mut m, "res", fa, ("SET", "data", "v")), Value::Okay);

    attach(&replica, &master);
    let keys = ["lease:a", "lease:b", "lease:c"];
    assert_same(&master, &replica, &keys);
    assert_eq!(lease_stat(&master, "role_primary"), 1);
    assert_eq!(lease_stat(&replica, "role_primary"), 0);

    let mut r = replica.client();
    let info = lease_info(&mut r, "lease:a").expect("lease:a on the replica");
    assert_eq!(info.state, "held");
    assert_eq!(info.fence, fa);
    assert_eq!(info.waiters, 0);
    assert_eq!(lease_info(&mut r, "lease:c"), None);
    assert_eq!(text(call(&mut r, "TYPE", "lease:a")), "lease-key");
    assert_eq!(text(call(&mut r, "TYPE", "res")), "fence-rec");
    assert_eq!(get(&mut r, "data").as_deref(), Some("v"));

    // Writes from clients are refused, whatever they would have done.
    let refused: [(&str, Vec<String>); 6] = [
        ("LEASE.ACQUIRE", vec!["lease:new".into(), "1000".into()]),
        (
            "LEASE.ACQUIRE",
            vec![
                "lease:a".into(),
                "1000".into(),
                "TOKEN".into(),
                "token-a".into(),
            ],
        ),
        (
            "LEASE.RENEW",
            vec!["lease:a".into(), "token-a".into(), "1000".into()],
        ),
        ("LEASE.RELEASE", vec!["lease:a".into(), "token-a".into()]),
        ("LEASE.FENCE", vec!["res".into(), (fa + 1).to_string()]),
        (
            "LEASE.FENCE",
            vec![
                "res".into(),
                (fa + 1).to_string(),
                "SET".into(),
                "data".into(),
                "w".into(),
            ],
        ),
    ];
    for (name, args) in &refused {
        let error = call_error(&mut r, name, args);
        assert!(
            error.starts_with("READONLY"),
            "{name} {args:?} on a replica: {error}"
        );
    }
    // The internal effect command is no way around it either.
    let forged = call(
        &mut r,
        "LEASE.APPLY",
        ("lease:a", fa + 1, now_ms() + 60_000, "forged"),
    );
    assert!(
        error_text(&forged).is_some(),
        "LEASE.APPLY from a client: {forged:?}"
    );
    assert_same(&master, &replica, &keys);
    assert_eq!(lease_info(&mut r, "lease:a").map(|i| i.fence), Some(fa));
    assert_eq!(get(&mut r, "data").as_deref(), Some("v"));
    assert_eq!(
        renew(&mut m, "lease:a", "token-a", 60_000),
        1,
        "the master's holder"
    );
});

for_each_server!(
    expired_lease_is_free_on_the_replica_before_the_master_reaps,
    |flavor| {
        let master = Server::start_with(flavor, ServerOptions::new().config("lease.reap-hz", "1"));
        let replica = Server::start(flavor);
        attach(&replica, &master);
        let mut m = master.client();
        let mut r = replica.client();
        // The grant's effect leaves for the replica with the grant's reply; the master is
        // then put to sleep at once, so it cannot reap (and send DEL) until the replica
        // has been seen past the deadline. It sleeps 900 ms beyond the deadline.
        let before = now_ms();
        let f = take(&mut m, "lease:short", 600, "t");
        let after = now_ms();
        let mut sleeper = master.client();
        sleeper
            .send_packed_command(
                &redis::cmd("DEBUG")
                    .arg("SLEEP")
                    .arg("1.5")
                    .get_packed_command(),
            )
            .unwrap_or_else(|e| panic!("DEBUG SLEEP: {e}"));
        // The master is asleep: wait on the replica alone.
        wait_until(
            "the grant to reach the replica",
            Duration::from_secs(2),
            || exists(&mut r, "lease:short"),
        );
        let info = lease_info(&mut r, "lease:short").expect("lease:short on the replica");
        if now_ms() < before + 600 {
            assert_eq!(info.state, "held", "before its deadline: {info:?}");
        }
        assert_eq!(info.fence, f, "{info:?}");

        wait_until("the lease deadline to pass", Duration::from_secs(5), || {
            now_ms() > after + 600
        });
        assert!(
            exists(&mut r, "lease:short"),
            "the master reaped during DEBUG SLEEP"
        );
        let info = lease_info(&mut r, "lease:short").expect("lease:short on the replica");
        assert_eq!(
            info.state, "free",
            "an expired lease on the replica: {info:?}"
        );
        assert_eq!(info.ttl, -1, "{info:?}");
        assert_eq!(info.fence, f, "{info:?}");
        let refused = call_error(&mut r, "LEASE.RENEW", ("lease:short", "t", 1000));
        assert!(refused.starts_with("READONLY"), "{refused}");

        let woke = sleeper
            .recv_response()
            .unwrap_or_else(|e| panic!("DEBUG SLEEP: {e}"));
        assert_eq!(woke, Value::Okay);
        drop(m);
        wait_until(
            "the master's reaper DEL to reach the replica",
            Duration::from_secs(5),
            || !exists(&mut r, "lease:short"),
        );
        assert_eq!(lease_stat(&master, "expired"), 1);
        assert_eq!(lease_stat(&replica, "expired"), 0, "a replica never reaps");
        assert_same(&master, &replica, &["lease:short"]);
    }
);

for_each_server!(fenced_writes_replicate, |flavor| {
    let (master, replica) = master_and_replica(flavor);
    let mut m = master.client();
    let mut r = replica.client();
    let f = take(&mut m, "lease", 60_000, "t");

    assert_eq!(fenced(&mut m, "res", f, ("SET", "data", "v1")), Value::Okay);
    assert_eq!(
        fenced(&mut m, "res", f, ("MSET", "x", "1", "y", "2")),
        Value::Okay
    );
    replica.wait_for_sync(&master);
    assert_eq!(get(&mut r, "data").as_deref(), Some("v1"));
    assert_eq!(get(&mut r, "x").as_deref(), Some("1"));
    assert_eq!(get(&mut r, "y").as_deref(), Some("2"));
    assert_eq!(text(call(&mut r, "TYPE", "res")), "fence-rec");
    assert_same(&master, &replica, &["lease"]);

    // A stale fence runs nothing, on either side.
    let reply = fenced(&mut m, "res", f - 1, ("SET", "data", "stale"));
    assert_eq!(error_text(&reply), Some(stale(f - 1, f)));
    // An inner command that fails records nothing, on either side.
    let reply = fenced(&mut m, "res", f + 10, ("INCR", "data"));
    assert!(
        error_text(&reply).is_some_and(|e| e.contains("not an integer")),
        "{reply:?}"
    );
    replica.wait_for_sync(&master);
    assert_eq!(get(&mut m, "data").as_deref(), Some("v1"));
    assert_eq!(get(&mut r, "data").as_deref(), Some("v1"));
    assert_same(&master, &replica, &["lease"]);
    let record_digest =
        |server: &Server| call(&mut server.client(), "DEBUG", ("DIGEST-VALUE", "res"));
    assert_eq!(record_digest(&master), record_digest(&replica));
    assert_eq!(
        error_text(&fenced(&mut m, "res", f - 1, NONE)),
        Some(stale(f - 1, f)),
        "the failed INCR must not have raised the record"
    );

    // A new holder's write moves the record on both.
    assert_eq!(release(&mut m, "lease", "t"), 1);
    let g = take(&mut m, "lease", 60_000, "t2");
    assert!(g > f);
    assert_eq!(fenced(&mut m, "res", g, ("SET", "data", "v2")), Value::Okay);
    assert_eq!(
        error_text(&fenced(&mut m, "res", f, ("SET", "data", "late"))),
        Some(stale(f, g))
    );
    replica.wait_for_sync(&master);
    assert_eq!(get(&mut r, "data").as_deref(), Some("v2"));
    assert_same(&master, &replica, &["lease"]);
    assert_eq!(record_digest(&master), record_digest(&replica));
});

for_each_server!(
    promoted_replica_keeps_leases_and_fences_stay_above,
    |flavor| {
        let (master, replica) = master_and_replica(flavor);
        let mut m = master.client();

        // The master's sequence jumps far above every clock floor; what it then issues the
        // replica can only know from the stream.
        let ahead = restore_fence_ahead(&mut m, "lease:ahead", "template", "token-ahead");
        let fx = take(&mut m, "lease:x", 60_000, "token-x");
        let fy = take(&mut m, "lease:y", 60_000, "token-y");
        assert!(ahead < fx && fx < fy, "{ahead} {fx} {fy}");
        assert_eq!(release(&mut m, "lease:y", "token-y"), 1);
        assert_eq!(int(call(&mut m, "DEL", "lease:ahead")), 1);
        let short_granted = now_ms();
        let fs = take(&mut m, "lease:short", 1_500, "token-short");
        let issued = lease_stat(&master, "fence_last");
        assert_eq!(issued, fs);
        assert_same(
            &master,
            &replica,
            &["lease:x", "lease:y", "lease:short", "lease:ahead"],
        );
        assert_eq!(lease_stat(&replica, "fence_last"), issued);

        let mut r = replica.client();
        assert_eq!(call(&mut r, "REPLICAOF", ("NO", "ONE")), Value::Okay);
        wait_until(
            "the replica to see itself primary",
            Duration::from_secs(5),
            || lease_stat(&replica, "role_primary") == 1,
        );
        assert!(
            now_ms() < short_granted + 1_500,
            "too slow: lease:short expired before the promotion"
        );
        assert!(
            exists(&mut r, "lease:short"),
            "lease:short was reaped before the promotion"
        );

        // Every lease is kept, with its holder.
        let info = lease_info(&mut r, "lease:x").expect("lease:x");
        assert_eq!((info.state.as_str(), info.fence), ("held", fx));
        assert_eq!(acquire(&mut r, "lease:x", 1_000, "someone-else"), None);
        assert_eq!(acquire(&mut r, "lease:x", 60_000, "token-x"), Some(fx));
        assert_eq!(renew(&mut r, "lease:x", "token-x", 60_000), 1);

        // New grants are above everything the old master issued.
        for key in ["lease:new", "lease:y", "lease:ahead"] {
            let f = take(&mut r, key, 60_000, "token-new");
            assert!(
                f > issued,
                "{key}: fence {f} on the promoted replica, {issued} issued before"
            );
        }

        // Its reaper runs now: the short lease the old master never reaped goes.
        wait_until(
            "the promoted replica to reap lease:short",
            Duration::from_secs(5),
            || !exists(&mut r, "lease:short"),
        );
        assert_eq!(lease_stat(&replica, "expired"), 1);
        let f = take(&mut r, "lease:short", 60_000, "token-new");
        assert!(f > issued, "lease:short: fence {f}, {issued} issued before");
        assert!(lease_stat(&replica, "indexed_deadlines") >= 1);
    }
);

for_each_server!(
    full_sync_partial_resync_and_stream_all_carry_leases,
    |flavor| {
        let master = Server::start(flavor);
        let first = Server::start(flavor);
        let second = Server::start(flavor);
        let mut m = master.client();

        // Data before the replica exists: a full sync.
        let ahead = restore_fence_ahead(&mut m, "lease:ahead", "template", "token-ahead");
        let fa = take(&mut m, "lease:a", 60_000, "token-a");
        assert!(fa > ahead);
        take(&mut m, "lease:b", 20_000, "token-b");
        assert_eq!(renew(&mut m, "lease:b", "token-b", 90_000), 1);
        take(&mut m, "lease:c", 60_000, "token-c");
        assert_eq!(release(&mut m, "lease:c", "token-c"), 1);
        assert_eq!(
            fenced(&mut m, "res", fa, ("SET", "data", "v1")),
            Value::Okay
        );
        // Only the RDB aux field carries the sequence once no key holds its top.
        let fd = take(&mut m, "lease:d", 60_000, "token-d");
        assert_eq!(release(&mut m, "lease:d", "token-d"), 1);
        assert_eq!(int(call(&mut m, "DEL", "lease:ahead")), 1);
        attach(&first, &master);
        let keys = [
            "lease:a",
            "lease:b",
            "lease:c",
            "lease:d",
            "lease:e",
            "lease:ahead",
        ];
        assert_same(&master, &first, &keys);
        assert_eq!(
            lease_stat(&first, "fence_last"),
            fd,
            "the full sync must carry the fence sequence"
        );

        // Writes after the attach: the stream.
        let fe = take(&mut m, "lease:e", 60_000, "token-e");
        assert_eq!(renew(&mut m, "lease:a", "token-a", 120_000), 1);
        assert_eq!(release(&mut m, "lease:b", "token-b"), 1);
        assert_eq!(
            fenced(&mut m, "res", fe, ("SET", "data", "v2")),
            Value::Okay
        );
        assert_same(&master, &first, &keys);
        assert_eq!(lease_stat(&first, "fence_last"), fe);

        // Writes while the link is down: a partial resync from the backlog.
        let partial_before: u64 = master
            .info_field("stats", "sync_partial_ok")
            .and_then(|v| v.parse().ok())
            .expect("sync_partial_ok");
        let mut on_first = first.client();
        let killed = int(call(&mut on_first, "CLIENT", ("KILL", "TYPE", "master")));
        assert_eq!(killed, 1, "CLIENT KILL TYPE master");
        let ff = take(&mut m, "lease:f", 60_000, "token-f");
        assert_eq!(release(&mut m, "lease:e", "token-e"), 1);
        assert_eq!(
            fenced(&mut m, "res", ff, ("SET", "data", "v3")),
            Value::Okay
        );
        wait_until("the replica to resync", Duration::from_secs(10), || {
            first
                .info_field("replication", "master_link_status")
                .is_some_and(|s| s == "up")
        });
        let keys = ["lease:a", "lease:b", "lease:e", "lease:f"];
        assert_same(&master, &first, &keys);
        let partial_after: u64 = master
            .info_field("stats", "sync_partial_ok")
            .and_then(|v| v.parse().ok())
            .expect("sync_partial_ok");
        assert!(partial_after > partial_before, "the resync was not partial");
        assert_eq!(get(&mut on_first, "data").as_deref(), Some("v3"));

        // A second replica attached now gets everything by full sync.
        attach(&second, &master);
        assert_same(&master, &second, &keys);
        assert_eq!(digest(&first), digest(&second));
        assert_eq!(lease_stat(&second, "fence_last"), ff);
    }
);

for_each_server!(
    replication_carries_absolute_deadlines_and_fences,
    |flavor| {
        let (master, replica) = master_and_replica(flavor);
        let mut m = master.client();
        let mut r = replica.client();

        // The effect reaches the replica only after the transaction ends, 400 ms after the
        // grant: a replica that computed the deadline from a relative ttl on arrival would
        // show 400 ms more than the master.
        let replies: Vec<Value> = redis::pipe()
            .atomic()
            .cmd("LEASE.ACQUIRE")
            .arg(("lease", 10_000, "TOKEN", "t"))
            .cmd("DEBUG")
            .arg(("SLEEP", "0.4"))
            .query(&mut m)
            .unwrap_or_else(|e| panic!("MULTI: {e}"));
        let (_, f) = grant(replies[0].clone(), "LEASE.ACQUIRE in MULTI").expect("granted");
        replica.wait_for_sync(&master);
        let on_master = lease_info(&mut m, "lease").expect("lease on the master");
        let on_replica = lease_info(&mut r, "lease").expect("lease on the replica");
        assert_eq!(on_master.fence, f);
        assert_eq!(on_replica.fence, f, "the replica's fence is the master's");
        assert!(
            (on_master.ttl - on_replica.ttl).abs() <= 100,
            "master ttl {} ms, replica ttl {} ms",
            on_master.ttl,
            on_replica.ttl
        );
        assert!(on_replica.ttl <= 9_650, "replica ttl {}", on_replica.ttl);

        // Renewals too.
        let _: Vec<Value> = redis::pipe()
            .atomic()
            .cmd("LEASE.RENEW")
            .arg(("lease", "t", 20_000))
            .cmd("DEBUG")
            .arg(("SLEEP", "0.4"))
            .query(&mut m)
            .unwrap_or_else(|e| panic!("MULTI: {e}"));
        replica.wait_for_sync(&master);
        let on_master = lease_info(&mut m, "lease").expect("lease on the master");
        let on_replica = lease_info(&mut r, "lease").expect("lease on the replica");
        assert_eq!(on_replica.fence, f);
        assert!(
            (on_master.ttl - on_replica.ttl).abs() <= 100,
            "after renew: master ttl {} ms, replica ttl {} ms",
            on_master.ttl,
            on_replica.ttl
        );
        assert!(on_replica.ttl <= 19_650, "replica ttl {}", on_replica.ttl);
        assert_eq!(digest(&master), digest(&replica));
    }
);

for_each_server!(multi_exec_and_eval_replicate, |flavor| {
    let (master, replica) = master_and_replica(flavor);
    let mut m = master.client();

    let replies: Vec<Value> = redis::pipe()
        .atomic()
        .cmd("LEASE.ACQUIRE")
        .arg(("m:1", 60_000))
        .cmd("LEASE.ACQUIRE")
        .arg(("m:2", 60_000, "TOKEN", "t2"))
        .cmd("LEASE.RENEW")
        .arg(("m:2", "t2", 90_000))
        .cmd("LEASE.FENCE")
        .arg(("res:m", 7, "SET", "m:data", "v"))
        .cmd("LEASE.ACQUIRE")
        .arg(("m:3", 60_000, "TOKEN", "t3"))
        .cmd("LEASE.RELEASE")
        .arg(("m:3", "t3"))
        .cmd("LEASE.ACQUIRE")
        .arg(("m:2", 60_000, "TOKEN", "intruder"))
        .query(&mut m)
        .unwrap_or_else(|e| panic!("MULTI: {e}"));
    assert_eq!(replies.len(), 7, "{replies:?}");
    let (token1, _) = grant(replies[0].clone(), "LEASE.ACQUIRE m:1").expect("granted");
    assert_eq!(token1.len(), 32);
    assert_eq!(replies[2], Value::Int(1));
    assert_eq!(replies[3], Value::Okay);
    assert_eq!(replies[5], Value::Int(1));
    assert_eq!(replies[6], Value::Nil);

    // A script with a generated token: the replica gets the token the master chose.
    let script = r#"
        local g = redis.call('LEASE.ACQUIRE', KEYS[1], 60000)
        redis.call('LEASE.FENCE', KEYS[2], g[2], 'SET', KEYS[3], g[1])
        redis.call('LEASE.RENEW', KEYS[1], g[1], 120000)
        local h = redis.call('LEASE.ACQUIRE', KEYS[4], 60000, 'TOKEN', 'x')
        redis.call('LEASE.RELEASE', KEYS[4], 'x')
        redis.call('LEASE.ACQUIRE', KEYS[4], 60000, 'TOKEN', 'y')
        return {g[1], g[2], h[2]}
    "#;
    let reply = call(&mut m, "EVAL", (script, 4, "e:1", "res:e", "e:data", "e:2"));
    let Value::Array(items) = reply else {
        panic!("EVAL answered {reply:?}");
    };
    let token = text(items[0].clone());
    let fence_e1 = int(items[1].clone()) as u64;
    assert_eq!(token.len(), 32);
    assert_eq!(get(&mut m, "e:data").as_deref(), Some(token.as_str()));

    let keys = ["m:1", "m:2", "m:3", "e:1", "e:2"];
    assert_same(&master, &replica, &keys);
    let mut r = replica.client();
    assert_eq!(get(&mut r, "e:data").as_deref(), Some(token.as_str()));
    assert_eq!(get(&mut r, "m:data").as_deref(), Some("v"));
    assert_eq!(lease_info(&mut r, "e:1").map(|i| i.fence), Some(fence_e1));
    assert_eq!(lease_info(&mut r, "m:3"), None);

    // The replicated tokens are the real ones: after a promotion they still work.
    assert_eq!(call(&mut r, "REPLICAOF", ("NO", "ONE")), Value::Okay);
    wait_until(
        "the replica to see itself primary",
        Duration::from_secs(5),
        || lease_stat(&replica, "role_primary") == 1,
    );
    assert_eq!(renew(&mut r, "e:1", &token, 60_000), 1);
    assert_eq!(renew(&mut r, "m:1", &token1, 60_000), 1);
    assert_eq!(release(&mut r, "e:2", "y"), 1);
});

for_each_server!(
    a_late_replica_applies_a_release_its_clock_calls_expired,
    |flavor| {
        // The replica is busy past the lease's deadline when the grant and the release
        // reach it: by its own clock the lease has expired, yet the release the master
        // made while it was live must delete the key there too.
        let (master, replica) = master_and_replica(flavor);
        let mut m = master.client();
        let mut r = replica.client();
        let mut probe = replica.client();
        probe
            .set_read_timeout(Some(Duration::from_millis(100)))
            .expect("probe read timeout");
        let busy = {
            let mut r2 = replica.client();
            std::thread::spawn(move || call(&mut r2, "DEBUG", ("SLEEP", "0.6")))
        };
        // The replica is inside the sleep once a PING goes unanswered.
        wait_until(
            "the replica to be inside DEBUG SLEEP",
            Duration::from_secs(5),
            || redis::cmd("PING").query::<String>(&mut probe).is_err(),
        );
        drop(probe);
        take(&mut m, "late", 200, "t");
        assert_eq!(release(&mut m, "late", "t"), 1);
        assert_eq!(busy.join().expect("DEBUG SLEEP thread"), Value::Okay);
        replica.wait_for_sync(&master);
        assert!(!exists(&mut r, "late"), "the replica kept a released lease");
        assert_same(&master, &replica, &["late"]);
    }
);

for_each_server!(
    leases_reaped_together_in_two_databases_go_on_the_replica_too,
    |flavor| {
        // The reaper replicates its deletions a batch at a time (one DEL per database
        // per batch): every reaped key must still go on the replica, from each database.
        let (master, replica) = master_and_replica(flavor);
        let mut m0 = master.client();
        let mut m3 = master.client();
        assert_eq!(call(&mut m3, "SELECT", 3), Value::Okay);
        for i in 0..150 {
            take(&mut m0, &format!("a:{i}"), 200, "t");
            take(&mut m3, &format!("b:{i}"), 200, "t");
        }
        assert_eq!(call(&mut m0, "SET", ("plain", "kept")), Value::Okay);
        wait_until(
            "the master to reap all 300 leases",
            Duration::from_secs(10),
            || lease_stat(&master, "expired") == 300,
        );
        replica.wait_for_sync(&master);
        let mut r0 = replica.client();
        let mut r3 = replica.client();
        assert_eq!(call(&mut r3, "SELECT", 3), Value::Okay);
        assert_eq!(
            int(call(&mut r0, "DBSIZE", &[] as &[&str])),
            1,
            "only the plain key"
        );
        assert_eq!(int(call(&mut r3, "DBSIZE", &[] as &[&str])), 0);
        assert_eq!(digest(&master), digest(&replica));
    }
);
