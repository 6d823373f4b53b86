//! Leases that expire while the server pauses writes: `CLIENT PAUSE WRITE` and `ALL`,
//! `FAILOVER`, a manual `CLUSTER FAILOVER`, and eviction held off by a pause.
//!
//! While writes are paused the server asserts that nothing reaches its replicas or its
//! AOF. A module timer that deleted an expired lease crashed the primary then
//! (`propagatePendingCommands` from `moduleTimerHandler`), and so did the grant to a
//! waiter that the timer woke (from `handleClientsBlockedOnKeys`). Here a
//! lease's deadline passes inside a pause whose bounds the test knows, with an AOF or
//! a replica attached: the server stays up, reports the lease free, writes nothing,
//! and reaps it or serves its waiter once the pause ends, with replicas and the AOF
//! in step.
//!
//! Sleeping is the point of these tests: time has to pass inside the pause. Every
//! other wait polls with a deadline. An observation meant to be made during the
//! pause is checked to have finished before the pause could have ended.

#[macro_use]
extern crate harness;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use harness::calls::{call, digest, int, take, text, NONE};
use harness::cluster::{Cluster, ClusterOptions};
use harness::lease::{lease_info, lease_stat, waiters};
use harness::reply::{assert_ok, error_text, granted};
use harness::session::{bind, session_stats};
use harness::waiter::{raw_blocked_acquire, Waiter};
use harness::{info_number, join, master_and_replica, wait_until, Flavor, Server, ServerOptions};
use redis::{Connection, Value};

/// How long each `CLIENT PAUSE` lasts.
const PAUSE: Duration = Duration::from_millis(1_500);
/// The ttl of a lease meant to expire inside a pause.
const SHORT_TTL: u64 = 300;
/// Past a deadline, how long the reaper (it wakes at the next deadline) is given to
/// act on it before the test looks.
const REAPER_SLACK: Duration = Duration::from_millis(200);
/// How long after a pause ends the reaper and the waiters get to catch up.
const RESUME_TIMEOUT: Duration = Duration::from_secs(5);
const LONG_TTL: u64 = 60_000;

// ---------------------------------------------------------------------------
// Commands

/// When a lease expires, as the test can bound it: no earlier than its ttl after the
/// grant was asked for, no later than its ttl after the grant came back.
#[derive(Clone, Copy, Debug)]
struct Deadline {
    earliest: Instant,
    latest: Instant,
}

/// `take` of a lease meant to expire soon: its fence and its deadline.
fn grant_short(con: &mut Connection, key: &str, ttl: u64, token: &str) -> (u64, Deadline) {
    let ttl_d = Duration::from_millis(ttl);
    let earliest = Instant::now() + ttl_d;
    let fence = take(con, key, ttl, token);
    let latest = Instant::now() + ttl_d;
    (fence, Deadline { earliest, latest })
}

/// Leases on `keys` with ttls from 200 ms up in steps of 5 ms, one after another: the
/// span of their deadlines.
fn grant_expiring(con: &mut Connection, keys: &[String]) -> Deadline {
    let mut span: Option<Deadline> = None;
    for (i, key) in keys.iter().enumerate() {
        let (_, d) = grant_short(con, key, 200 + 5 * i as u64, "a");
        span = Some(Deadline {
            earliest: span.map_or(d.earliest, |s| s.earliest),
            latest: d.latest,
        });
    }
    span.unwrap_or_else(|| panic!("no keys to grant"))
}

/// Panics unless something that began by `began_by` began before `deadline`: a test
/// whose setup outlasted its lease proves nothing about a lease expiring in a pause.
fn assert_before(began_by: Instant, deadline: &Deadline, what: &str) {
    assert!(
        began_by < deadline.earliest,
        "{what} began after the lease could have expired: the setup was too slow for this test"
    );
}

fn role(server: &Server) -> String {
    server
        .info_field("replication", "role")
        .unwrap_or_else(|| panic!("{} INFO replication has no role", server.flavor))
}

/// The state `LEASE.INFO` reports, "nil" for no record.
fn state(con: &mut Connection, key: &str) -> String {
    lease_info(con, key).map_or_else(|| "nil".to_string(), |i| i.state)
}

/// AOF on, written at every command: with `everysec` the server may postpone a
/// write while a background fsync runs, and the grant made before the pause would
/// reach the file during it.
fn aof_server(flavor: Flavor) -> Server {
    Server::start_with(
        flavor,
        ServerOptions::new()
            .config("appendonly", "yes")
            .config("appendfsync", "always"),
    )
}

/// Bytes in the AOF's incremental files: what the server has written since its last
/// rewrite.
fn aof_bytes(server: &Server) -> u64 {
    let dir = server.dir.join("appendonlydir");
    let entries =
        std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()));
    entries
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".incr.aof"))
        .map(|e| e.metadata().map_or(0, |m| m.len()))
        .sum()
}

/// Replica and master agree on everything, once the replica has caught up.
fn assert_in_step(master: &Server, replica: &Server) {
    replica.wait_for_sync(master);
    assert_eq!(
        digest(master),
        digest(replica),
        "DEBUG DIGEST differs between master and replica"
    );
}

// ---------------------------------------------------------------------------
// Time

fn sleep_until(at: Instant) {
    let now = Instant::now();
    if at > now {
        thread::sleep(at - now);
    }
}

/// A `CLIENT PAUSE` in force. The server ends it `PAUSE` after it ran the command, so
/// no earlier than `PAUSE` after the test sent it, less the millisecond its clock
/// rounds down.
struct Pause {
    /// The server has run `CLIENT PAUSE` by then.
    began_by: Instant,
    earliest_end: Instant,
}

impl Pause {
    fn start(server: &Server, mode: &str) -> Pause {
        let mut con = server.client();
        let sent = Instant::now();
        let ms = PAUSE.as_millis() as u64;
        assert_ok(
            call(&mut con, "CLIENT", ("PAUSE", ms, mode)),
            "CLIENT PAUSE",
        );
        Pause {
            began_by: Instant::now(),
            earliest_end: sent + PAUSE - Duration::from_millis(1),
        }
    }

    /// Panics unless the observations made so far were made while the pause was
    /// certainly on: otherwise they prove nothing about it.
    fn assert_still_on(&self, what: &str) {
        assert!(
            Instant::now() < self.earliest_end,
            "{what} was observed too late to be sure the pause was still on: the machine is \
             too slow for this test"
        );
    }
}

// ---------------------------------------------------------------------------
// A server that stops answering (blocked clients: tests/harness/src/waiter.rs)

/// Sends `DEBUG SLEEP` for `sleep` to `server` from a thread and returns once the
/// server has stopped answering: it runs nothing, its timers, replication and cluster
/// bus included, until no earlier than `sleep` after the returned instant. The handle
/// joins when the sleep is over.
fn put_to_sleep(server: &Server, sleep: Duration) -> (Instant, JoinHandle<()>) {
    let mut con = server.client();
    let mut probe = TcpStream::connect(("127.0.0.1", server.port))
        .unwrap_or_else(|e| panic!("cannot connect to {}: {e}", server.flavor));
    let sent = Instant::now();
    let seconds = format!("{:.3}", sleep.as_secs_f64());
    let handle = thread::spawn(move || {
        let reply = call(&mut con, "DEBUG", ("SLEEP", seconds.as_str()));
        assert_ok(reply, "DEBUG SLEEP");
    });
    probe
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap_or_else(|e| panic!("cannot set a read timeout: {e}"));
    wait_until(
        &format!("{} to sleep", server.flavor),
        Duration::from_secs(5),
        || {
            probe
                .write_all(b"*1\r\n$4\r\nPING\r\n")
                .unwrap_or_else(|e| panic!("cannot send PING: {e}"));
            let mut pong = [0u8; 7];
            match probe.read_exact(&mut pong) {
                Ok(()) => false,
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock) => true,
                Err(e) if matches!(e.kind(), std::io::ErrorKind::TimedOut) => true,
                Err(e) => panic!("PING probe failed: {e}"),
            }
        },
    );
    (sent, handle)
}

// ---------------------------------------------------------------------------
// 1. AOF on, CLIENT PAUSE WRITE and ALL

for_each_server!(
    aof_lease_expiring_in_a_write_pause_is_reaped_after_it,
    |flavor| {
        let server = aof_server(flavor);
        let mut con = server.client();
        let live = take(&mut con, "live", LONG_TTL, "l");
        let expired_before = lease_stat(&server, "expired");
        let (first, deadline) = grant_short(&mut con, "e", SHORT_TTL, "a");

        let pause = Pause::start(&server, "WRITE");
        assert_before(pause.began_by, &deadline, "the pause");
        let aof_at_pause = aof_bytes(&server);
        sleep_until(deadline.latest + REAPER_SLACK);
        let pong = text(call(&mut con, "PING", NONE));
        let expired_during = lease_stat(&server, "expired");
        let state_during = state(&mut con, "e");
        let aof_during = aof_bytes(&server);
        pause.assert_still_on("the expired lease");
        assert_eq!(pong, "PONG");
        assert_eq!(expired_during, expired_before, "reaped during the pause");
        assert_eq!(state_during, "free", "LEASE.INFO e past its deadline");
        assert_eq!(aof_during, aof_at_pause, "the AOF grew during the pause");

        wait_until(
            "the expired lease to be reaped after the pause",
            PAUSE + RESUME_TIMEOUT,
            || lease_info(&mut con, "e").is_none(),
        );
        assert!(Instant::now() >= pause.earliest_end);
        assert_eq!(lease_stat(&server, "expired"), expired_before + 1);

        // The AOF, replayed, says the same.
        let before = digest(&server);
        assert_ok(call(&mut con, "DEBUG", "LOADAOF"), "DEBUG LOADAOF");
        assert_eq!(digest(&server), before, "DEBUG DIGEST after DEBUG LOADAOF");
        assert_eq!(lease_info(&mut con, "e"), None);
        let kept = lease_info(&mut con, "live").expect("the live lease after LOADAOF");
        assert_eq!((kept.state.as_str(), kept.fence), ("held", live));
        assert!(take(&mut con, "e", LONG_TTL, "b") > first);
    }
);

for_each_server!(
    aof_lease_expiring_in_an_all_pause_is_reaped_after_it,
    |flavor| {
        let mut server = aof_server(flavor);
        let mut con = server.client();
        let live = take(&mut con, "live", LONG_TTL, "l");
        let expired_before = lease_stat(&server, "expired");
        let (first, deadline) = grant_short(&mut con, "e", SHORT_TTL, "a");

        // Under ALL no client command runs until the pause ends; the AOF on disk is what
        // can be watched during it.
        let pause = Pause::start(&server, "ALL");
        assert_before(pause.began_by, &deadline, "the pause");
        let aof_at_pause = aof_bytes(&server);
        sleep_until(deadline.latest + REAPER_SLACK);
        let aof_during = aof_bytes(&server);
        pause.assert_still_on("the AOF");
        assert_eq!(aof_during, aof_at_pause, "the AOF grew during the pause");

        // This INFO, on a connection made before the pause (a new one would time out in
        // its handshake), waits for the pause to end: the server lived through it.
        let info = text(call(&mut con, "INFO", "server"));
        assert!(Instant::now() >= pause.earliest_end);
        assert_eq!(
            harness::info_field(&info, "process_id"),
            Some(server.pid.to_string())
        );
        wait_until(
            "the expired lease to be reaped after the pause",
            RESUME_TIMEOUT,
            || lease_info(&mut con, "e").is_none(),
        );
        assert_eq!(lease_stat(&server, "expired"), expired_before + 1);

        // A restart replays the AOF to the same state.
        let before = digest(&server);
        server.restart();
        let mut con = server.client();
        assert_eq!(digest(&server), before, "DEBUG DIGEST after a restart");
        assert_eq!(lease_info(&mut con, "e"), None);
        let kept = lease_info(&mut con, "live").expect("the live lease after a restart");
        assert_eq!((kept.state.as_str(), kept.fence), ("held", live));
        assert!(take(&mut con, "e", LONG_TTL, "b") > first);
    }
);

// ---------------------------------------------------------------------------
// 2. A replica instead of the AOF

for_each_server!(
    replica_stays_in_step_when_a_lease_expires_in_a_write_pause,
    |flavor| {
        let (master, replica) = master_and_replica(flavor);
        let mut m = master.client();
        let mut r = replica.client();
        let live = take(&mut m, "live", LONG_TTL, "l");
        let expired_before = lease_stat(&master, "expired");
        let (_, deadline) = grant_short(&mut m, "e", SHORT_TTL, "a");

        let pause = Pause::start(&master, "WRITE");
        assert_before(pause.began_by, &deadline, "the pause");
        sleep_until(deadline.latest + REAPER_SLACK);
        let pong = text(call(&mut m, "PING", NONE));
        let expired_during = lease_stat(&master, "expired");
        let on_master = state(&mut m, "e");
        let on_replica = state(&mut r, "e");
        pause.assert_still_on("the expired lease");
        assert_eq!(pong, "PONG");
        assert_eq!(expired_during, expired_before, "reaped during the pause");
        assert_eq!(on_master, "free", "LEASE.INFO e on the master");
        assert_eq!(on_replica, "free", "LEASE.INFO e on the replica");

        wait_until(
            "the expired lease to be reaped after the pause",
            PAUSE + RESUME_TIMEOUT,
            || lease_info(&mut m, "e").is_none(),
        );
        assert_eq!(lease_stat(&master, "expired"), expired_before + 1);
        assert_in_step(&master, &replica);
        assert_eq!(lease_info(&mut r, "e"), None);
        let kept = lease_info(&mut r, "live").expect("the live lease on the replica");
        assert_eq!((kept.state.as_str(), kept.fence), ("held", live));
    }
);

// ---------------------------------------------------------------------------
// 3. A waiter is handed the lease when the pause ends

for_each_server!(
    waiter_gets_a_lease_that_expired_in_a_pause_after_it,
    |flavor| {
        let (master, replica) = master_and_replica(flavor);
        let mut m = master.client();
        let (first, deadline) = grant_short(&mut m, "w", SHORT_TTL, "a");
        let waiter = Waiter::queue(&master, "w", 10_000, "b", 0, 1);

        let pause = Pause::start(&master, "WRITE");
        assert_before(pause.began_by, &deadline, "the pause");
        sleep_until(deadline.latest + REAPER_SLACK);
        let during = lease_info(&mut m, "w").expect("w during the pause");
        waiter.assert_waiting("the waiter during the pause");
        pause.assert_still_on("the waiter");
        assert_eq!((during.state.as_str(), during.waiters), ("free", 1));

        let (reply, at) = waiter.reply(PAUSE + RESUME_TIMEOUT, "the waiter after the pause");
        assert!(
            at >= pause.earliest_end,
            "the waiter was served {:?} before the pause could end",
            pause.earliest_end - at
        );
        let second = granted(&reply, "b")
            .unwrap_or_else(|| panic!("the waiter's LEASE.ACQUIRE answered {reply:?}"));
        assert!(
            second > first,
            "fence {second} after the pause, {first} before"
        );
        assert_in_step(&master, &replica);
        let mut r = replica.client();
        let on_replica = lease_info(&mut r, "w").expect("w on the replica");
        assert_eq!(
            (on_replica.state.as_str(), on_replica.fence),
            ("held", second)
        );
    }
);

// ---------------------------------------------------------------------------
// 4. The head of the queue leaves during the pause

for_each_server!(
    next_waiter_is_served_after_the_head_leaves_in_a_pause,
    |flavor| {
        let (master, replica) = master_and_replica(flavor);
        let mut m = master.client();
        // The head leaves by CLIENT UNBLOCK (u), by closing its connection (c), by
        // its BLOCK timeout (t), each after its lease's deadline and inside the pause.
        // Six waiters take a while to set up: the leases get twice the usual ttl.
        let grants: Vec<(u64, Deadline)> = ["u", "c", "t"]
            .iter()
            .map(|key| grant_short(&mut m, key, 2 * SHORT_TTL, "a"))
            .collect();
        let first: Vec<u64> = grants.iter().map(|(fence, _)| *fence).collect();
        let deadline = Deadline {
            earliest: grants[0].1.earliest,
            latest: grants[2].1.latest,
        };
        let head_u = Waiter::queue(&master, "u", 10_000, "h", 0, 1);
        let next_u = Waiter::queue(&master, "u", 10_000, "n", 0, 2);
        let head_c = raw_blocked_acquire(&master, "c", "h", 1);
        let next_c = Waiter::queue(&master, "c", 10_000, "n", 0, 2);
        // Times out 900 ms after it blocked: past the deadline, well inside the pause.
        let head_t = Waiter::queue(&master, "t", 10_000, "h", 900, 1);
        let next_t = Waiter::queue(&master, "t", 10_000, "n", 0, 2);

        let pause = Pause::start(&master, "WRITE");
        assert_before(pause.began_by, &deadline, "the pause");
        sleep_until(deadline.latest + REAPER_SLACK);
        let unblocked = int(call(&mut m, "CLIENT", ("UNBLOCK", head_u.client_id)));
        head_c
            .shutdown(Shutdown::Both)
            .unwrap_or_else(|e| panic!("cannot close the head's socket: {e}"));
        drop(head_c);
        let (u_reply, _) = head_u.reply(PAUSE + RESUME_TIMEOUT, "the unblocked head");
        let (t_reply, t_at) = head_t.reply(PAUSE + RESUME_TIMEOUT, "the timed-out head");
        for key in ["u", "c", "t"] {
            wait_until(
                &format!("{key}'s head to leave the queue"),
                Duration::from_secs(1),
                || waiters(&mut m, key) == 1,
            );
        }
        let expired_during = lease_stat(&master, "expired");
        let states: Vec<String> = ["u", "c", "t"].iter().map(|k| state(&mut m, k)).collect();
        for (key, next) in [("u", &next_u), ("c", &next_c), ("t", &next_t)] {
            next.assert_waiting(&format!("{key}'s second waiter during the pause"));
        }
        pause.assert_still_on("the queues");
        assert_eq!(unblocked, 1, "CLIENT UNBLOCK of u's head");
        assert_eq!(u_reply, Value::Nil, "the unblocked head's reply");
        assert_eq!(t_reply, Value::Nil, "the timed-out head's reply");
        assert!(
            t_at > deadline.latest,
            "t's head timed out before the lease expired"
        );
        assert_eq!(states, ["free", "free", "free"]);
        assert_eq!(expired_during, 0);

        for ((key, next), first) in [("u", next_u), ("c", next_c), ("t", next_t)]
            .into_iter()
            .zip(first)
        {
            let (reply, at) = next.reply(PAUSE + RESUME_TIMEOUT, &format!("{key}'s second waiter"));
            assert!(
                at >= pause.earliest_end,
                "{key} was served during the pause"
            );
            let fence = granted(&reply, "n")
                .unwrap_or_else(|| panic!("{key}'s second waiter answered {reply:?}"));
            assert!(fence > first, "{key}: fence {fence} after, {first} before");
        }
        assert_in_step(&master, &replica);
        let text = master.log();
        assert!(
            !text.contains("panicked") && !text.contains("ASSERTION"),
            "the master's log reports a panic or an assertion:\n{text}"
        );
    }
);

// ---------------------------------------------------------------------------
// 5. FAILOVER

for_each_server!(
    failover_with_leases_expiring_in_its_pause_swaps_roles,
    |flavor| {
        let (old, new) = master_and_replica(flavor);
        let mut o = old.client();
        let live = take(&mut o, "live", LONG_TTL, "l");
        new.wait_for_sync(&old);

        // FAILOVER pauses writes until the replica has acknowledged everything; asleep
        // it acknowledges nothing, so the pause outlives the short leases, and a
        // waiter's (w). Awake again, the replica acknowledges from its once-a-second
        // replication cron, up to a second later: the FAILOVER timeout leaves room for
        // that (with 1.5 s of sleep and TIMEOUT 2000 the failover aborts, "Replica
        // never caught up before timeout").
        let sleep = Duration::from_millis(1_000);
        let (slept, sleeper) = put_to_sleep(&new, sleep);
        let (_, w_deadline) = grant_short(&mut o, "w", SHORT_TTL, "a");
        let waiter = Waiter::queue(&old, "w", 10_000, "b", 0, 1);
        // A session ending in the pause, with a ttl-0 hold and one with a deadline
        // of its own bound to it.
        let (_, session_deadline) = grant_short(&mut o, "sess", SHORT_TTL, "st");
        bind(&mut o, "b0", 0, "x", "sess", "st");
        bind(&mut o, "b1", LONG_TTL, "y", "sess", "st");
        let short: Vec<String> = (0..20).map(|i| format!("s{i}")).collect();
        let span = grant_expiring(&mut o, &short);
        assert_ok(call(&mut o, "FAILOVER", ("TIMEOUT", 5_000)), "FAILOVER");
        let began_by = Instant::now();
        assert_before(began_by, &span, "FAILOVER");
        assert_before(began_by, &w_deadline, "FAILOVER");
        assert_before(began_by, &session_deadline, "FAILOVER");
        sleep_until(span.latest.max(w_deadline.latest) + REAPER_SLACK);
        let failover_state = old.info_field("replication", "master_failover_state");
        let states: Vec<String> = short.iter().map(|k| state(&mut o, k)).collect();
        let w_during = lease_info(&mut o, "w").expect("w during the failover");
        let bound_during: Vec<i64> = ["b0", "b1"]
            .iter()
            .map(|k| lease_info(&mut o, k).map_or(-1, |i| i.holders))
            .collect();
        let expired_during = lease_stat(&old, "expired");
        assert!(
            Instant::now() < slept + sleep,
            "observed after the replica woke: the machine is too slow for this test"
        );
        // Free at once though nothing could be written: the session's deadline passed.
        assert_eq!(bound_during, [0, 0], "b0, b1 holders during the failover");
        assert_eq!(failover_state.as_deref(), Some("waiting-for-sync"));
        assert!(states.iter().all(|s| s == "free"), "{states:?}");
        assert_eq!((w_during.state.as_str(), w_during.waiters), ("free", 1));
        assert_eq!(expired_during, 0);
        waiter.assert_waiting("the waiter during the failover");
        join(sleeper);
        // A primary turned replica unblocks its blocked clients with an error: the
        // waiter was never served by the old primary.
        let (got, _) = waiter.outcome(PAUSE + RESUME_TIMEOUT, "the waiter on the old primary");
        let got = got.unwrap_or_else(|e| panic!("the waiter's connection failed: {e}"));
        let error = error_text(&got).unwrap_or_default();
        assert!(error.starts_with("UNBLOCKED"), "the waiter got {got:?}");

        wait_until("the roles to swap", Duration::from_secs(10), || {
            role(&new) == "master" && role(&old) == "slave"
        });
        let mut n = new.client();
        wait_until(
            "the new primary to reap the expired leases",
            RESUME_TIMEOUT,
            || {
                lease_info(&mut n, "w").is_none()
                    && short.iter().all(|k| lease_info(&mut n, k).is_none())
                    && ["sess", "b0", "b1"]
                        .iter()
                        .all(|k| lease_info(&mut n, k).is_none())
            },
        );
        for node in [&new, &old] {
            wait_until("the session gauges at 0", RESUME_TIMEOUT, || {
                let stats = session_stats(node);
                (stats.bound_holds, stats.sessions) == (0, 0)
            });
        }
        assert_eq!(lease_stat(&new, "expired"), short.len() as u64 + 4);
        let kept = lease_info(&mut n, "live").expect("the live lease on the new primary");
        assert_eq!((kept.state.as_str(), kept.fence), ("held", live));
        wait_until(
            "the old primary's link to the new one",
            Duration::from_secs(10),
            || {
                old.info_field("replication", "master_link_status")
                    .as_deref()
                    == Some("up")
            },
        );
        assert_in_step(&new, &old);
        // The replica goes first: a primary's SHUTDOWN waits for its replicas' next
        // acknowledgement, up to a second.
        drop(old);
    }
);

// ---------------------------------------------------------------------------
// 6. A manual cluster failover

for_each_server!(
    cluster_failover_with_leases_expiring_in_its_pause_completes,
    |flavor| {
        // Masters 0 and 1, replica 2 of master 0 (and 3 of master 1). Manual failover
        // pauses writes on master 0 until replica 2 wins a vote of both masters;
        // master 1 asleep keeps the vote, and so the pause, open.
        let cluster = Cluster::start_with(flavor, ClusterOptions::new(2, 1));
        let (master, replica) = (0, 2);
        assert_eq!(cluster.master_of(replica), Some(master));
        let tag = cluster.tag_on(master, &[]);
        let node = &cluster.nodes[master];
        let mut con = node.client();
        let live_key = format!("{tag}:live");
        let live = take(&mut con, &live_key, LONG_TTL, "l");

        // Under half the node timeout, so no node takes master 1 for failing.
        let sleep = Duration::from_millis(1_000);
        let (slept, sleeper) = put_to_sleep(&cluster.nodes[1], sleep);
        let w_key = format!("{tag}:w");
        let (_, w_deadline) = grant_short(&mut con, &w_key, SHORT_TTL, "a");
        let waiter = Waiter::queue(node, &w_key, 10_000, "b", 0, 1);
        let session_keys = [0, 1, 2].map(|i| format!("{tag}:sess{i}"));
        let [sess, b0, b1] = &session_keys;
        let (_, session_deadline) = grant_short(&mut con, sess, SHORT_TTL, "st");
        bind(&mut con, b0, 0, "x", sess, "st");
        bind(&mut con, b1, LONG_TTL, "y", sess, "st");
        let short: Vec<String> = (0..20).map(|i| format!("{tag}:s{i}")).collect();
        let span = grant_expiring(&mut con, &short);
        let old = cluster.begin_failover(replica, None);
        let began_by = Instant::now();
        assert_before(began_by, &span, "CLUSTER FAILOVER");
        assert_before(began_by, &w_deadline, "CLUSTER FAILOVER");
        assert_before(began_by, &session_deadline, "CLUSTER FAILOVER");
        sleep_until(span.latest.max(w_deadline.latest) + REAPER_SLACK);
        let old_role = role(node);
        let states: Vec<String> = short.iter().map(|k| state(&mut con, k)).collect();
        let w_during = lease_info(&mut con, &w_key).expect("w during the failover");
        let bound_during: Vec<i64> = [b0, b1]
            .iter()
            .map(|k| lease_info(&mut con, k).map_or(-1, |i| i.holders))
            .collect();
        let expired_during = lease_stat(node, "expired");
        assert!(
            Instant::now() < slept + sleep,
            "observed after master 1 woke: the machine is too slow for this test"
        );
        assert_eq!(bound_during, [0, 0], "bound holders during the failover");
        assert_eq!(old_role, "master", "master 0 before the vote");
        // Expired yet neither reaped nor handed over: the reaper saw writes paused.
        assert!(states.iter().all(|s| s == "free"), "{states:?}");
        assert_eq!((w_during.state.as_str(), w_during.waiters), ("free", 1));
        assert_eq!(expired_during, 0);
        waiter.assert_waiting("the waiter during the failover");
        join(sleeper);

        cluster.finish_failover(replica, old);
        let (got, _) = waiter.outcome(PAUSE + RESUME_TIMEOUT, "the waiter on the old master");
        let got = got.unwrap_or_else(|e| panic!("the waiter's connection failed: {e}"));
        let error = error_text(&got).unwrap_or_default();
        // Demoted, the old master answers its blocked clients as the server does:
        // Valkey 9 redirects them to the new master, the others unblock them.
        let answer = if flavor == Flavor::Valkey9 {
            "MOVED"
        } else {
            "UNBLOCKED"
        };
        assert!(error.starts_with(answer), "the waiter got {got:?}");
        assert_eq!(cluster.master_of(master), Some(replica));
        assert_eq!(role(node), "slave");
        let promoted = &cluster.nodes[replica];
        let mut p = promoted.client();
        wait_until(
            "the promoted replica to reap the expired leases",
            RESUME_TIMEOUT,
            || {
                lease_info(&mut p, &w_key).is_none()
                    && short.iter().all(|k| lease_info(&mut p, k).is_none())
                    && session_keys.iter().all(|k| lease_info(&mut p, k).is_none())
            },
        );
        for n in [promoted, node] {
            wait_until("the session gauges at 0", RESUME_TIMEOUT, || {
                let stats = session_stats(n);
                (stats.bound_holds, stats.sessions) == (0, 0)
            });
        }
        let kept = lease_info(&mut p, &live_key).expect("the live lease after failover");
        assert_eq!((kept.state.as_str(), kept.fence), ("held", live));
        assert_in_step(promoted, node);
    }
);

// ---------------------------------------------------------------------------
// 7. Eviction held off by a pause

for_each_server!(
    eviction_waits_out_a_write_pause_and_keeps_a_live_lease,
    |flavor| {
        let server = aof_server(flavor);
        let mut con = server.client();
        if flavor == Flavor::Redis7 {
            // `restore` needs post-notification jobs (7.2.4+): refused here.
            let reply = call(
                &mut con,
                "CONFIG",
                ("SET", "lease.allkeys-eviction", "restore"),
            );
            let refused = error_text(&reply).unwrap_or_default();
            assert!(
                refused.contains("post-notification jobs"),
                "CONFIG SET lease.allkeys-eviction restore answered {reply:?}"
            );
            eprintln!(
                "SKIPPED on {flavor}: lease.allkeys-eviction restore needs post-notification \
                 jobs, which Redis 7.0 does not have"
            );
            return;
        }
        assert_ok(
            call(
                &mut con,
                "CONFIG",
                (
                    "SET",
                    "maxmemory-policy",
                    "allkeys-lru",
                    "lease.allkeys-eviction",
                    "restore",
                ),
            ),
            "CONFIG SET",
        );
        let live = take(&mut con, "live", LONG_TTL, "l");
        let base: u64 = server
            .info_field("memory", "used_memory")
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("INFO memory has no used_memory"));
        let mut fill = redis::pipe();
        for i in 0..3_000 {
            fill.cmd("SET")
                .arg(format!("fill:{i}"))
                .arg(vec![b'x'; 1024])
                .ignore();
        }
        let () = fill
            .query(&mut con)
            .unwrap_or_else(|e| panic!("the fill failed: {e}"));
        let evicted_before = info_number(&server, "stats", "evicted_keys");
        let (_, deadline) = grant_short(&mut con, "e", SHORT_TTL, "a");
        let keys = int(call(&mut con, "DBSIZE", NONE));

        // Over maxmemory inside the pause: the server evicts nothing until it ends.
        let pause = Pause::start(&server, "WRITE");
        assert_before(pause.began_by, &deadline, "the pause");
        let maxmemory = (base + 1024 * 1024).to_string();
        assert_ok(
            call(&mut con, "CONFIG", ("SET", "maxmemory", maxmemory.as_str())),
            "CONFIG SET maxmemory",
        );
        sleep_until(deadline.latest + REAPER_SLACK);
        let keys_during = int(call(&mut con, "DBSIZE", NONE));
        let evicted_during = info_number(&server, "stats", "evicted_keys");
        let state_during = state(&mut con, "e");
        pause.assert_still_on("the keyspace");
        assert_eq!(keys_during, keys, "keys evicted during the pause");
        assert_eq!(evicted_during, evicted_before);
        assert_eq!(state_during, "free");

        wait_until(
            "eviction and the reaper to resume after the pause",
            PAUSE + RESUME_TIMEOUT,
            || {
                // Eviction runs before a command.
                let _ = call(&mut con, "PING", NONE);
                info_number(&server, "stats", "evicted_keys") > evicted_before
                    && lease_info(&mut con, "e").is_none()
            },
        );
        let kept = lease_info(&mut con, "live").expect("the live lease after eviction");
        assert_eq!((kept.state.as_str(), kept.fence), ("held", live));
        eprintln!(
            "{flavor}: evicted_keys={} lease_evicted={} lease_restored={}",
            info_number(&server, "stats", "evicted_keys"),
            lease_stat(&server, "evicted"),
            lease_stat(&server, "restored"),
        );
    }
);
