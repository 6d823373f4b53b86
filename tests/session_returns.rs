//! The session invariant (contract version 2.1) on each real server: `LEASE.RENEW
//! session-key token` answers 1 only if every hold bound to that session grant, and not
//! released by its own holder, is still held. A session grant that ended on a node stays
//! ended there, whatever brings a value with its name and fence back: `RENAME` away and
//! back, `MOVE` to another database and back, `DEL` and `RESTORE` of its own `DUMP`,
//! `RESTORE ... REPLACE` over itself, `COPY` back. And every end of a bound hold is a key
//! change: `WATCH` aborts, waiters are served, the reaper deletes, the gauges agree, in or
//! out of a write pause.
//!
//! Batch-wise `MIGRATE`, resharding and atomic slot migration: tests/session_migrate.rs.

#[macro_use]
extern crate harness;

use std::thread;
use std::time::Duration;

use harness::calls::{call, config_set, digest, exists, int, release, renew, select, take, NONE};
use harness::lease::{lease_info, lease_stat};
use harness::reply::{assert_ok, granted};
use harness::session::{bind, bound_count, session_stats};
use harness::waiter::Waiter;
use harness::{wait_until, Server, ServerOptions};
use redis::{Connection, Value};

const MINUTE: u64 = 60_000;
const WAIT: Duration = Duration::from_secs(10);

/// Session `s` (token `st`) with ttl-0 holds on `j1` and `j2`, a waiter queued on `j1`;
/// returns the session's fence and the waiter.
fn session_with_waiter(server: &Server, con: &mut Connection) -> (u64, Waiter) {
    let fence = take(con, "s", MINUTE, "st");
    bind(con, "j1", 0, "a", "s", "st");
    bind(con, "j2", 0, "b", "s", "st");
    let waiter = Waiter::queue(server, "j1", MINUTE, "w", 0, 1);
    (fence, waiter)
}

/// The waiter must have been granted `j1`, the key whose hold the session's end freed.
fn assert_served(waiter: Waiter, when: &str) {
    let (reply, _) = waiter.reply(WAIT, &format!("the waiter on j1 {when}"));
    assert!(granted(&reply, "w").is_some(), "{when}: {reply:?}");
}

/// After the session grant with `fence` came back under its name: it is free with its
/// fence, its token renews and releases nothing, nothing is bound to it, `j1` is the
/// waiter's, and the reaper deletes `j2`.
fn assert_stays_ended(server: &Server, con: &mut Connection, fence: u64, when: &str) {
    let s = lease_info(con, "s").unwrap_or_else(|| panic!("{when}: LEASE.INFO s is nil"));
    assert_eq!(
        (s.state.as_str(), s.fence, s.bound),
        ("free", fence, 0),
        "{when}: LEASE.INFO s = {s:?}"
    );
    assert_eq!(renew(con, "s", "st", MINUTE), 0, "{when}: RENEW s");
    let j1 = lease_info(con, "j1").unwrap_or_else(|| panic!("{when}: LEASE.INFO j1 is nil"));
    assert_eq!(
        (j1.state.as_str(), j1.session.as_deref()),
        ("held", None),
        "{when}: j1 = {j1:?}"
    );
    assert_eq!(renew(con, "j1", "a", MINUTE), 0, "{when}: RENEW j1 a");
    wait_until(&format!("{when}: the reaper to delete j2"), WAIT, || {
        !exists(con, "j2")
    });
    wait_until(&format!("{when}: the session gauges"), WAIT, || {
        let stats = session_stats(server);
        stats.bound_holds == 0 && stats.sessions == 0
    });
    // The next grant of the session key is a new session, above the old fence.
    let again = take(con, "s", MINUTE, "st2");
    assert!(again > fence, "{when}: {again} after {fence}");
    assert_eq!(bound_count(con, "s"), 0, "{when}");
}

fn dump(con: &mut Connection, key: &str) -> Vec<u8> {
    match call(con, "DUMP", key) {
        Value::BulkString(payload) => payload,
        other => panic!("DUMP {key} answered {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------
// A session key that leaves and comes back

for_each_server!(a_session_renamed_away_and_back_stays_ended, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    let (fence, waiter) = session_with_waiter(&server, &mut con);
    assert_ok(call(&mut con, "RENAME", ("s", "tmp")), "RENAME s tmp");
    assert_served(waiter, "after RENAME s tmp");
    assert_ok(call(&mut con, "RENAME", ("tmp", "s")), "RENAME tmp s");
    assert_stays_ended(&server, &mut con, fence, "after RENAME away and back");
});

for_each_server!(
    a_session_moved_to_another_db_and_back_stays_ended,
    |flavor| {
        let server = Server::start(flavor);
        let mut con = server.client();
        let (fence, waiter) = session_with_waiter(&server, &mut con);
        assert_eq!(int(call(&mut con, "MOVE", ("s", 1))), 1, "MOVE s 1");
        assert_served(waiter, "after MOVE s 1");
        select(&mut con, 1);
        assert_eq!(int(call(&mut con, "MOVE", ("s", 0))), 1, "MOVE s 0");
        select(&mut con, 0);
        assert_stays_ended(&server, &mut con, fence, "after MOVE away and back");
    }
);

for_each_server!(a_session_restored_from_its_own_dump_stays_ended, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    let (fence, waiter) = session_with_waiter(&server, &mut con);
    let payload = dump(&mut con, "s");
    assert_eq!(int(call(&mut con, "DEL", "s")), 1);
    assert_served(waiter, "after DEL s");
    assert_ok(
        call(&mut con, "RESTORE", ("s", 0, payload.as_slice())),
        "RESTORE s",
    );
    assert_stays_ended(&server, &mut con, fence, "after DEL and RESTORE");
});

for_each_server!(
    a_session_restored_after_its_holds_were_reaped_stays_ended,
    |flavor| {
        let server = Server::start(flavor);
        let mut con = server.client();
        let fence = take(&mut con, "s", MINUTE, "st");
        bind(&mut con, "j1", 0, "a", "s", "st");
        let payload = dump(&mut con, "s");
        assert_eq!(int(call(&mut con, "DEL", "s")), 1);
        wait_until("the reaper to delete j1", WAIT, || !exists(&mut con, "j1"));
        assert_ok(
            call(&mut con, "RESTORE", ("s", 0, payload.as_slice())),
            "RESTORE s",
        );
        let s = lease_info(&mut con, "s").expect("s");
        assert_eq!((s.state.as_str(), s.fence), ("free", fence), "{s:?}");
        assert_eq!(renew(&mut con, "s", "st", MINUTE), 0, "RENEW s");
    }
);

for_each_server!(
    a_session_restored_over_itself_ends_on_every_node,
    |flavor| {
        let primary = Server::start(flavor);
        let replica = Server::start(flavor);
        replica.replicaof(&primary);
        let mut con = primary.client();
        let fence = take(&mut con, "s", MINUTE, "st");
        bind(&mut con, "j1", 0, "a", "s", "st");
        let waiter = Waiter::queue(&primary, "j1", MINUTE, "w", 0, 1);
        let payload = dump(&mut con, "s");
        assert_ok(
            call(&mut con, "RESTORE", ("s", 0, payload.as_slice(), "REPLACE")),
            "RESTORE s REPLACE",
        );
        assert_served(waiter, "after RESTORE REPLACE");
        assert_eq!(renew(&mut con, "s", "st", MINUTE), 0, "RENEW s");
        replica.wait_for_sync(&primary);
        let mut rcon = replica.client();
        // Free with its fence on both, or already reaped (nobody waits for it).
        for (node, con) in [("primary", &mut con), ("replica", &mut rcon)] {
            if let Some(s) = lease_info(con, "s") {
                assert_eq!(
                    (s.state.as_str(), s.fence, s.bound),
                    ("free", fence, 0),
                    "{node}: {s:?}"
                );
            }
        }
        assert_eq!(digest(&primary), digest(&replica));
        wait_until("both nodes' session gauges at 0", WAIT, || {
            let (p, r) = (session_stats(&primary), session_stats(&replica));
            (p.bound_holds, p.sessions, r.bound_holds, r.sessions) == (0, 0, 0, 0)
        });
    }
);

for_each_server!(a_session_cannot_be_copied_aside, |flavor| {
    // COPY of a lease is refused: no second value of a grant can be kept aside to
    // bring an ended session back.
    let server = Server::start(flavor);
    let mut con = server.client();
    take(&mut con, "s", MINUTE, "st");
    bind(&mut con, "j1", 0, "a", "s", "st");
    let reply = call(&mut con, "COPY", ("s", "tmp"));
    assert!(
        harness::reply::error_text(&reply).is_some(),
        "COPY s tmp: {reply:?}"
    );
    assert!(!exists(&mut con, "tmp"));
    assert_eq!(renew(&mut con, "s", "st", MINUTE), 1);
    assert_eq!(bound_count(&mut con, "s"), 1);
});

// ---------------------------------------------------------------------------------------
// The next session after one came back

for_each_server!(a_session_after_a_return_binds_and_ends_in_full, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    let (_, waiter) = session_with_waiter(&server, &mut con);
    assert_ok(call(&mut con, "RENAME", ("s", "tmp")), "RENAME s tmp");
    assert_served(waiter, "after RENAME s tmp");
    assert_ok(call(&mut con, "RENAME", ("tmp", "s")), "RENAME tmp s");
    assert_eq!(int(call(&mut con, "DEL", "s")), 1);
    // A new session on the same key: what is bound to it is counted, and its end is
    // carried out in full.
    config_set(&mut con, "notify-keyspace-events", "Ed");
    let mut sub = server.client();
    let mut pubsub = sub.as_pubsub();
    pubsub.set_read_timeout(Some(WAIT)).expect("read timeout");
    pubsub
        .subscribe("__keyevent@0__:lease.session-end")
        .expect("SUBSCRIBE");
    take(&mut con, "s", MINUTE, "st2");
    bind(&mut con, "j3", 0, "c", "s", "st2");
    bind(&mut con, "j4", 0, "d", "s", "st2");
    assert_eq!(bound_count(&mut con, "s"), 2);
    assert_eq!(session_stats(&server).sessions, 1);
    let waiter = Waiter::queue(&server, "j3", MINUTE, "w3", 0, 1);
    assert_eq!(release(&mut con, "s", "st2"), 1);
    let (reply, _) = waiter.reply(WAIT, "the waiter on j3");
    assert!(granted(&reply, "w3").is_some(), "{reply:?}");
    wait_until("the reaper to delete j4", WAIT, || !exists(&mut con, "j4"));
    let msg = pubsub.get_message().expect("lease.session-end");
    let payload: String = msg.get_payload().expect("payload");
    assert_eq!(payload, "s");
});

// ---------------------------------------------------------------------------------------
// WATCH

/// A client that watches `key` and has queued a write; `EXEC` tells whether it ran.
fn watching(server: &Server, key: &str) -> Connection {
    let mut w = server.client();
    assert_ok(call(&mut w, "WATCH", key), "WATCH");
    assert_ok(call(&mut w, "MULTI", NONE), "MULTI");
    call(&mut w, "SET", (format!("written-{key}"), 1));
    w
}

fn exec_aborted(w: &mut Connection) -> bool {
    call(w, "EXEC", NONE) == Value::Nil
}

for_each_server!(
    a_session_release_aborts_exec_watching_a_bound_key,
    |flavor| {
        let server = Server::start(flavor);
        let mut con = server.client();
        take(&mut con, "s", MINUTE, "st");
        bind(&mut con, "j1", 0, "a", "s", "st");
        bind(&mut con, "j2", MINUTE, "b", "s", "st");
        take(&mut con, "other", MINUTE, "o");
        let mut w1 = watching(&server, "j1");
        let mut w2 = watching(&server, "j2");
        let mut untouched = watching(&server, "other");
        assert_eq!(release(&mut con, "s", "st"), 1);
        assert_eq!(lease_info(&mut con, "j1").map(|i| i.holders), Some(0));
        assert!(exec_aborted(&mut w1), "EXEC watching j1 ran");
        assert!(exec_aborted(&mut w2), "EXEC watching j2 ran");
        assert!(!exec_aborted(&mut untouched), "EXEC watching other aborted");
    }
);

for_each_server!(
    a_session_expiry_aborts_exec_watching_a_bound_key,
    |flavor| {
        let server = Server::start(flavor);
        let mut con = server.client();
        config_set(&mut con, "notify-keyspace-events", "Ed");
        let mut sub = server.client();
        let mut pubsub = sub.as_pubsub();
        pubsub.set_read_timeout(Some(WAIT)).expect("read timeout");
        pubsub
            .psubscribe("__keyevent@0__:lease.*")
            .expect("PSUBSCRIBE");
        take(&mut con, "s", 300, "st");
        bind(&mut con, "j1", 0, "a", "s", "st");
        let mut w = watching(&server, "j1");
        wait_until("the session to expire", WAIT, || {
            !lease_info(&mut con, "j1").is_some_and(|i| i.holders > 0)
        });
        assert!(exec_aborted(&mut w), "EXEC watching j1 ran");
        // The bound key's end is announced like any expiry, and the session's end too.
        let mut seen = Vec::new();
        while !(seen.contains(&("lease.expire".to_string(), "j1".to_string()))
            && seen.contains(&("lease.session-end".to_string(), "s".to_string())))
        {
            let msg = pubsub
                .get_message()
                .unwrap_or_else(|e| panic!("after {seen:?}: {e}"));
            let event = msg.get_channel_name().rsplit(':').next().unwrap_or("");
            seen.push((event.to_string(), msg.get_payload().expect("payload")));
        }
    }
);

for_each_server!(
    a_session_expiry_in_a_write_pause_aborts_exec_and_leaves_no_entry,
    |flavor| {
        let server = Server::start_with(flavor, ServerOptions::new().config("appendonly", "yes"));
        let mut con = server.client();
        let mut pauser = server.client();
        take(&mut con, "s", 300, "st");
        bind(&mut con, "j1", 0, "a", "s", "st");
        // A bound hold with a deadline of its own has an index entry there.
        bind(&mut con, "j2", MINUTE, "b", "s", "st");
        let mut w = watching(&server, "j1");
        assert_ok(
            call(&mut pauser, "CLIENT", ("PAUSE", 800, "WRITE")),
            "CLIENT PAUSE",
        );
        thread::sleep(Duration::from_millis(500));
        // Waits for the pause to end.
        assert!(exec_aborted(&mut w), "EXEC watching j1 ran");
        wait_until("the reaper to delete s and j1", WAIT, || {
            lease_stat(&server, "keys") == 0
        });
        // Within a few reaper ticks, not at j2's own deadline a minute away.
        wait_until(
            "the deadline index to empty",
            Duration::from_secs(2),
            || lease_stat(&server, "indexed_deadlines") == 0,
        );
        let stats = session_stats(&server);
        assert_eq!((stats.bound_holds, stats.sessions), (0, 0), "{stats:?}");
    }
);

for_each_server!(
    a_session_release_in_multi_frees_bound_keys_for_later_commands,
    |flavor| {
        let server = Server::start(flavor);
        let mut con = server.client();
        take(&mut con, "s", MINUTE, "st");
        bind(&mut con, "j1", 0, "a", "s", "st");
        let mut w = watching(&server, "j1");
        let mut tx = server.client();
        assert_ok(call(&mut tx, "MULTI", NONE), "MULTI");
        call(&mut tx, "LEASE.RELEASE", ("s", "st"));
        call(&mut tx, "LEASE.INFO", "j1");
        call(&mut tx, "EXEC", NONE);
        assert!(exec_aborted(&mut w), "EXEC watching j1 ran");
        assert!(!lease_info(&mut con, "j1").is_some_and(|i| i.holders > 0));
    }
);

// ---------------------------------------------------------------------------------------
// Eviction

for_each_server!(
    volatile_lru_never_takes_a_session_or_its_bound_keys,
    |flavor| {
        let server = Server::start(flavor);
        let mut con = server.client();
        take(&mut con, "s", MINUTE, "st");
        for i in 0..20 {
            bind(&mut con, &format!("j{i}"), 0, "a", "s", "st");
        }
        config_set(&mut con, "maxmemory", "20mb");
        config_set(&mut con, "maxmemory-policy", "volatile-lru");
        // Cache keys with a TTL, 1 KB each, until the server has evicted some of them.
        let value = vec![b'v'; 1024];
        let evicted = || harness::info_number(&server, "stats", "evicted_keys");
        let mut batch = 0;
        while evicted() == 0 {
            assert!(batch < 200, "nothing evicted after {batch} batches");
            let mut pipe = redis::pipe();
            for i in 0..500 {
                pipe.cmd("SET")
                    .arg(format!("cache:{batch}:{i}"))
                    .arg(&value[..])
                    .arg("EX")
                    .arg(3600)
                    .ignore();
            }
            pipe.query::<()>(&mut con)
                .unwrap_or_else(|e| panic!("fill batch {batch}: {e}"));
            batch += 1;
        }
        assert_eq!(renew(&mut con, "s", "st", MINUTE), 1, "RENEW s");
        assert_eq!(bound_count(&mut con, "s"), 20);
        for i in 0..20 {
            let j = lease_info(&mut con, &format!("j{i}")).expect("a bound key");
            assert_eq!((j.state.as_str(), j.holders), ("held", 1), "j{i}: {j:?}");
        }
        assert_eq!(lease_stat(&server, "evicted"), 0);
        let stats = session_stats(&server);
        assert_eq!((stats.bound_holds, stats.sessions), (20, 1), "{stats:?}");
    }
);

// ---------------------------------------------------------------------------------------
// A bound key that arrives without its session

for_each_server!(
    a_bound_key_arriving_without_its_session_is_settled_at_once,
    |flavor| {
        let a = Server::start(flavor);
        let b = Server::start(flavor);
        let mut on_a = a.client();
        take(&mut on_a, "s", MINUTE, "st");
        bind(&mut on_a, "j", MINUTE, "a", "s", "st");
        let payload = dump(&mut on_a, "j");
        let mut on_b = b.client();
        assert_ok(
            call(&mut on_b, "RESTORE", ("j", 0, payload.as_slice())),
            "RESTORE j",
        );
        // Free at once, and deleted by the reaper within a few ticks, not at the hold's
        // own deadline a minute away.
        assert!(!lease_info(&mut on_b, "j").is_some_and(|i| i.holders > 0));
        wait_until("the reaper to delete j", Duration::from_secs(2), || {
            !exists(&mut on_b, "j")
        });
        wait_until("b's gauges at 0", WAIT, || {
            let stats = session_stats(&b);
            stats.bound_holds == 0 && lease_stat(&b, "indexed_deadlines") == 0
        });
    }
);

// ---------------------------------------------------------------------------------------
// What the module costs other commands: its command filter and key events are on only
// while it holds something, and a client that turned tracking on while they were off is
// still told when a session's end frees the key it read.

fn module_flag(server: &Server, field: &str) -> String {
    server
        .info_field("lease", &format!("lease_{field}"))
        .unwrap_or_else(|| panic!("INFO lease has no lease_{field}"))
}

for_each_server!(
    the_filter_is_on_only_while_lease_keys_exist_and_tracking_survives_it,
    |flavor| {
        let server = Server::start(flavor);
        let mut con = server.client();
        assert_eq!(
            module_flag(&server, "command_filter"),
            "0",
            "a fresh server"
        );
        assert_eq!(module_flag(&server, "key_events"), "0", "a fresh server");
        assert_eq!(int(call(&mut con, "LEASE.FENCE", ("R", 7))), 7);
        assert_eq!(module_flag(&server, "key_events"), "1", "a record");
        assert_eq!(module_flag(&server, "command_filter"), "0", "a record");
        take(&mut con, "L", MINUTE, "a");
        assert_eq!(module_flag(&server, "command_filter"), "1", "a lease key");
        assert_eq!(release(&mut con, "L", "a"), 1);
        wait_until(
            "the filter to come off after 10 s without a lease key",
            Duration::from_secs(30),
            || module_flag(&server, "command_filter") == "0",
        );
        assert_eq!(
            module_flag(&server, "key_events"),
            "1",
            "never unsubscribed"
        );

        // Tracking turned on while the filter is off.
        let mut tracked = server.client_resp3();
        let (pushes, received) = std::sync::mpsc::channel();
        tracked.set_push_sender(pushes);
        assert_ok(call(&mut tracked, "CLIENT", ("TRACKING", "on")), "TRACKING");
        take(&mut con, "s", MINUTE, "st");
        assert_eq!(module_flag(&server, "command_filter"), "1", "armed again");
        bind(&mut con, "j1", 0, "a", "s", "st");
        assert_eq!(lease_info(&mut tracked, "j1").map(|i| i.holders), Some(1));
        call(&mut tracked, "PING", NONE);
        received.try_iter().for_each(drop);
        assert_eq!(release(&mut con, "s", "st"), 1);
        // Invalidations are written before the reply of any later command.
        call(&mut tracked, "PING", NONE);
        let keys: Vec<Value> = received
            .try_iter()
            .filter(|p| p.kind == redis::PushKind::Invalidate)
            .flat_map(|p| p.data)
            .collect();
        assert_eq!(
            keys,
            [Value::Array(vec![Value::BulkString(b"j1".to_vec())])],
            "the session's end freed j1, which the tracking client read"
        );
        assert_eq!(lease_info(&mut con, "j1").map(|i| i.holders), Some(0));
    }
);
