//! Sessions and lock-delay beyond one server's memory, on each real server: a replica
//! in step (DEBUG DIGEST) through binds, session renewals, delays and session ends,
//! and seeing bound holds free at once; restarts from an RDB and from the AOF (with and
//! without the RDB preamble) keeping bindings, the session grant they belong to, and
//! delays; DUMP/RESTORE and MIGRATE of a session with its bound keys; the session key
//! as a key argument on a cluster (CROSSSLOT, hash tags); and a session expiring
//! inside `CLIENT PAUSE WRITE`. Single-server behaviour: tests/sessions.rs.

#[macro_use]
extern crate harness;

use std::fs;
use std::thread;
use std::time::{Duration, Instant};

use harness::calls::{
    acquire, call, call_error, config_set, digest, exists, info_on, int, release, renew, restore,
    strings, take, text, NONE,
};
use harness::cluster::{key_slot, Cluster};
use harness::evict::{arm, fill_until};
use harness::holds::holders;
use harness::lease::{lease_info, lease_stat, Info};
use harness::reply::{assert_ok, error_text, granted};
use harness::session::{
    assert_bound, assert_unheld, bind, bind_shared, bound_count, session_stats, take_with, unheld,
    SessionStats,
};
use harness::waiter::Waiter;
use harness::{attach, info_field, master_and_replica, wait_until, Flavor, Server, ServerOptions};
use redis::{Connection, Value};

const MINUTE: u64 = 60_000;
/// Long enough for anything a test waits on, short enough to fail fast.
const WAIT: Duration = Duration::from_secs(10);

fn info(con: &mut Connection, key: &str) -> Info {
    lease_info(con, key).unwrap_or_else(|| panic!("LEASE.INFO {key} is nil"))
}

/// Waits until `key` shows a lock-delay and `INFO lease` has counted `delays` of them.
fn wait_delayed(server: &Server, con: &mut Connection, key: &str, delays: u64) {
    wait_until(&format!("{key} to be delayed"), WAIT, || {
        lease_info(con, key).is_some_and(|i| i.state == "delayed")
            && lease_stat(server, "delays") >= delays
    });
}

fn dbsize(con: &mut Connection) -> i64 {
    int(call(con, "DBSIZE", NONE))
}

// ---------------------------------------------------------------------------------------
// Replication

/// The replica has caught up and agrees: same digest, same session gauges.
fn assert_in_step(master: &Server, replica: &Server, when: &str) {
    replica.wait_for_sync(master);
    assert_eq!(digest(master), digest(replica), "{when}: DEBUG DIGEST");
    for field in ["keys", "bound_holds", "sessions"] {
        assert_eq!(
            lease_stat(master, field),
            lease_stat(replica, field),
            "{when}: lease_{field} on master and replica"
        );
    }
}

for_each_server!(replica_in_step_through_bind_renew_delay_and_end, |flavor| {
    let (master, replica) = master_and_replica(flavor);
    let mut m = master.client();
    let mut r = replica.client();
    take(&mut m, "s", MINUTE, "st");
    let j0 = bind(&mut m, "j0", 0, "a", "s", "st");
    let j1 = bind(&mut m, "j1", MINUTE, "b", "s", "st");
    let sh = bind_shared(&mut m, "sh", MINUTE, "r1", "s", "st");
    let dd = take_with(
        &mut m,
        "dd",
        MINUTE,
        "c",
        &["SESSION", "s", "st", "DELAY", "1500"],
    );
    assert_in_step(&master, &replica, "after the binds");
    assert_bound(&mut r, "j0", j0, "s", "on the replica");
    assert_bound(&mut r, "j1", j1, "s", "on the replica");
    assert_bound(&mut r, "dd", dd, "s", "on the replica");
    let list = holders(&mut r, "sh");
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!((list[0].fence, list[0].session.as_deref()), (sh, Some("s")));
    assert_eq!(bound_count(&mut r, "s"), 4);

    // The session's renewal reaches the replica, and its ttl-0 hold follows it there.
    assert_eq!(renew(&mut m, "s", "st", 2 * MINUTE), 1);
    assert_in_step(&master, &replica, "after the session's renewal");
    let j0_on_replica = info(&mut r, "j0");
    assert!(j0_on_replica.ttl > MINUTE as i64, "{j0_on_replica:?}");

    // A lock-delay after an expiry.
    let delays = lease_stat(&master, "delays");
    take_with(&mut m, "d", 200, "x", &["DELAY", "1500"]);
    wait_delayed(&master, &mut m, "d", delays + 1);
    assert_in_step(&master, &replica, "during a delay");
    assert_eq!(info(&mut r, "d").state, "delayed");
    assert_eq!(acquire(&mut m, "d", MINUTE, "y"), None);
    wait_until("d's delay to end", WAIT, || {
        lease_info(&mut m, "d").map_or(true, |i| i.state == "free")
    });
    wait_until("the master to drop d", WAIT, || !exists(&mut m, "d"));
    assert_in_step(&master, &replica, "after the delay");

    // The session's end: free at once on the replica too, delayed where asked.
    assert_eq!(release(&mut m, "s", "st"), 1);
    replica.wait_for_sync(&master);
    for key in ["j0", "j1"] {
        assert_unheld(
            &mut r,
            key,
            "on the replica right after the session's release",
        );
    }
    assert_unheld(&mut r, "sh", "on the replica after the release");
    let dd_on_replica = info(&mut r, "dd");
    assert_eq!(dd_on_replica.state, "delayed", "{dd_on_replica:?}");
    wait_until("the master to reap the freed keys", WAIT, || {
        !exists(&mut m, "j0") && !exists(&mut m, "j1") && !exists(&mut m, "sh")
    });
    wait_until("dd's delay to end and dd to go", WAIT, || {
        !exists(&mut m, "dd")
    });
    assert_in_step(&master, &replica, "after the session's end");
    assert_eq!(dbsize(&mut r), 0);
});

for_each_server!(
    replica_sees_bound_holds_free_when_the_session_expires,
    |flavor| {
        // The master's reaper at 1 Hz: the replica must decide from the session's deadline
        // alone, before any deletion reaches it.
        let master = Server::start_with(flavor, ServerOptions::new().config("lease.reap-hz", "1"));
        let replica = Server::start(flavor);
        attach(&replica, &master);
        let mut m = master.client();
        let mut r = replica.client();
        take(&mut m, "s", 400, "st");
        bind(&mut m, "k", 0, "a", "s", "st");
        bind(&mut m, "k2", MINUTE, "b", "s", "st");
        replica.wait_for_sync(&master);
        assert_eq!(
            info(&mut r, "k").state,
            "held",
            "the setup outlasted the session"
        );
        wait_until("the session to expire on the replica", WAIT, || {
            let s = lease_info(&mut r, "s");
            if s.as_ref().is_some_and(|s| s.state == "held") {
                return false;
            }
            for key in ["k", "k2"] {
                let i = lease_info(&mut r, key);
                assert!(
                    unheld(&i),
                    "session {s:?} over on the replica, yet {key} is {i:?}"
                );
            }
            true
        });
        wait_until("the master to reap the freed keys", WAIT, || {
            !exists(&mut m, "k") && !exists(&mut m, "k2")
        });
        assert_in_step(&master, &replica, "after the reaping");
    }
);

// ---------------------------------------------------------------------------------------
// Restarts: RDB and AOF

/// What `populate` made, and what a restart must give back.
struct World {
    session: u64,
    j0: u64,
    j1: u64,
    sh: u64,
    d: u64,
    /// `j2`, bound after the AOF rewrite (or just later, for an RDB).
    j2: Option<u64>,
    /// `k2`, delayed by its session's end after the rewrite.
    k2: Option<u64>,
}

/// Session `s` with `j0` (ttl 0), `j1` (a minute), a shared hold on `sh`, all bound to
/// it; `d`, expired into a minute of lock-delay. Returns once the delay has started.
fn populate(server: &Server, con: &mut Connection) -> World {
    let session = take(con, "s", MINUTE, "st");
    let j0 = bind(con, "j0", 0, "a", "s", "st");
    let j1 = bind(con, "j1", MINUTE, "b", "s", "st");
    let sh = bind_shared(con, "sh", MINUTE, "r1", "s", "st");
    let delays = lease_stat(server, "delays");
    let d = take_with(con, "d", 100, "x", &["DELAY", "60000"]);
    wait_delayed(server, con, "d", delays + 1);
    World {
        session,
        j0,
        j1,
        sh,
        d,
        j2: None,
        k2: None,
    }
}

/// More of the same after a rewrite: `j2` bound with ttl 0, and `k2`, delayed for a
/// minute by the end of its session `s2`.
fn write_more(server: &Server, con: &mut Connection, world: &mut World) {
    world.j2 = Some(bind(con, "j2", 0, "e", "s", "st"));
    take(con, "s2", MINUTE, "st2");
    world.k2 = Some(take_with(
        con,
        "k2",
        MINUTE,
        "f",
        &["SESSION", "s2", "st2", "DELAY", "60000"],
    ));
    let delays = lease_stat(server, "delays");
    assert_eq!(release(con, "s2", "st2"), 1);
    wait_delayed(server, con, "k2", delays + 1);
    assert!(!exists(con, "s2"), "a released session nobody waits for");
}

/// What the server holds just before it goes down: nothing may change after this,
/// so the reaper is kept from writing by a pause of writes (reads still run).
struct Before {
    digest: String,
    stats: SessionStats,
    d_ttl: i64,
}

fn freeze(server: &Server, con: &mut Connection) -> Before {
    assert_ok(
        call(con, "CLIENT", ("PAUSE", 30_000, "WRITE")),
        "CLIENT PAUSE WRITE",
    );
    let digest = digest(server);
    let stats = session_stats(server);
    let d_ttl = info(con, "d").ttl;
    Before {
        digest,
        stats,
        d_ttl,
    }
}

/// The restarted server holds what `world` says, and its sessions still work.
fn verify(server: &Server, con: &mut Connection, world: &World, before: &Before, when: &str) {
    assert_eq!(digest(server), before.digest, "{when}: DEBUG DIGEST");
    // The session index is rebuilt by a scan after a load (its promptness:
    // `bound_is_reported_at_once_after_a_load`).
    wait_until("the session gauges to come back", WAIT, || {
        let stats = session_stats(server);
        stats.bound_holds == before.stats.bound_holds && stats.sessions == before.stats.sessions
    });

    let s = info(con, "s");
    assert_eq!(
        (s.state.as_str(), s.fence),
        ("held", world.session),
        "{when}: {s:?}"
    );
    let bound = 3 + i64::from(world.j2.is_some());
    assert_eq!(s.bound, bound, "{when}: {s:?}");
    let high = s.ttl;
    let j0 = assert_bound(con, "j0", world.j0, "s", when);
    assert!(
        j0.ttl <= high && j0.ttl > high - 1_000,
        "{when}: j0 {j0:?}, s {s:?}"
    );
    assert_bound(con, "j1", world.j1, "s", when);
    if let Some(j2) = world.j2 {
        assert_bound(con, "j2", j2, "s", when);
    }
    let list = holders(con, "sh");
    assert_eq!(list.len(), 1, "{when}: {list:?}");
    assert_eq!(
        (list[0].fence, list[0].session.as_deref()),
        (world.sh, Some("s"))
    );

    // The delays go on to the same moment.
    let d = info(con, "d");
    assert_eq!(
        (d.state.as_str(), d.fence),
        ("delayed", world.d),
        "{when}: {d:?}"
    );
    assert!(
        d.ttl > 0 && d.ttl <= before.d_ttl,
        "{when}: {d:?} after {}",
        before.d_ttl
    );
    assert_eq!(acquire(con, "d", MINUTE, "y"), None, "{when}: ACQUIRE d");
    if let Some(k2) = world.k2 {
        let k = info(con, "k2");
        assert_eq!(
            (k.state.as_str(), k.fence),
            ("delayed", k2),
            "{when}: {k:?}"
        );
        assert_eq!(acquire(con, "k2", MINUTE, "y"), None, "{when}: ACQUIRE k2");
    }

    // The session still keeps its holds, and still ends them.
    assert_eq!(renew(con, "s", "st", 2 * MINUTE), 1, "{when}: RENEW s");
    assert!(info(con, "j0").ttl > MINUTE as i64, "{when}: j0 follows s");
    let expiries = lease_stat(server, "session_expiries");
    assert_eq!(release(con, "s", "st"), 1, "{when}: RELEASE s");
    for key in ["j0", "j1"] {
        assert_unheld(con, key, &format!("{when}, after RELEASE s"));
    }
    assert_unheld(con, "sh", when);
    wait_until("the freed keys to be reaped", WAIT, || {
        !exists(con, "j0") && !exists(con, "j1") && !exists(con, "sh")
    });
    wait_until("INFO lease to count the session's end", WAIT, || {
        lease_stat(server, "session_expiries") == expiries + bound as u64
    });
}

for_each_server!(rdb_restart_keeps_bindings_and_delays, |flavor| {
    let mut server = Server::start(flavor);
    let mut con = server.client();
    let mut world = populate(&server, &mut con);
    write_more(&server, &mut con, &mut world);
    let before = freeze(&server, &mut con);
    assert_ok(call(&mut con, "SAVE", NONE), "SAVE");
    drop(con);
    server.kill9();
    server.start_again();
    let mut con = server.client();
    verify(&server, &mut con, &world, &before, "after an RDB restart");
});

for_each_server!(debug_reload_keeps_bindings_and_delays, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    let mut world = populate(&server, &mut con);
    write_more(&server, &mut con, &mut world);
    let before = freeze(&server, &mut con);
    assert_ok(call(&mut con, "CLIENT", "UNPAUSE"), "CLIENT UNPAUSE");
    assert_ok(call(&mut con, "DEBUG", "RELOAD"), "DEBUG RELOAD");
    verify(&server, &mut con, &world, &before, "after DEBUG RELOAD");
});

for_each_server!(bound_is_reported_at_once_after_a_load, |flavor| {
    // `bound` and the session gauges count live bound holds: right after a load as at
    // any other time (no reaper tick in between: one pipeline).
    let server = Server::start(flavor);
    let mut con = server.client();
    take(&mut con, "s", MINUTE, "st");
    bind(&mut con, "j0", 0, "a", "s", "st");
    bind(&mut con, "j1", MINUTE, "b", "s", "st");
    let replies: Vec<Value> = redis::pipe()
        .cmd("DEBUG")
        .arg("RELOAD")
        .cmd("LEASE.INFO")
        .arg("s")
        .cmd("INFO")
        .arg("lease")
        .query(&mut con)
        .expect("DEBUG RELOAD, LEASE.INFO s, INFO lease");
    let [reload, s, stats] = <[Value; 3]>::try_from(replies).expect("three replies");
    assert_ok(reload, "DEBUG RELOAD");
    let s = harness::lease::parse_info(s, "LEASE.INFO s").expect("s after the reload");
    let stats = text(stats);
    let field = |name: &str| info_field(&stats, name);
    assert_eq!(s.bound, 2, "LEASE.INFO s right after DEBUG RELOAD: {s:?}");
    assert_eq!(field("lease_bound_holds").as_deref(), Some("2"), "{stats}");
    assert_eq!(field("lease_sessions").as_deref(), Some("1"), "{stats}");
});

for_each_server!(a_replica_synced_with_bound_holds_reports_them, |flavor| {
    // A replica that receives the session and its holds in the full sync says what
    // the master says of them.
    let master = Server::start(flavor);
    let replica = Server::start(flavor);
    let mut m = master.client();
    take(&mut m, "s", MINUTE, "st");
    let j0 = bind(&mut m, "j0", 0, "a", "s", "st");
    bind_shared(&mut m, "sh", MINUTE, "r1", "s", "st");
    attach(&replica, &master);
    let mut r = replica.client();
    assert_bound(&mut r, "j0", j0, "s", "on the replica after the full sync");
    assert_eq!(holders(&mut r, "sh")[0].session.as_deref(), Some("s"));
    assert_eq!(bound_count(&mut r, "s"), 2, "LEASE.INFO s on the replica");
    assert_in_step(&master, &replica, "after the full sync");
    // The master's release frees them on the replica at once.
    assert_eq!(release(&mut m, "s", "st"), 1);
    replica.wait_for_sync(&master);
    assert_unheld(&mut r, "j0", "on the replica after the release");
    assert_unheld(&mut r, "sh", "on the replica after the release");
});

/// The base file the AOF manifest names.
fn aof_base(server: &Server) -> Option<std::path::PathBuf> {
    let dir = server.dir.join("appendonlydir");
    let manifest = fs::read_to_string(dir.join("appendonly.aof.manifest")).ok()?;
    manifest.lines().find_map(|line| {
        let words: Vec<&str> = line.split_whitespace().collect();
        let name = words.windows(2).find(|w| w[0] == "file")?[1];
        words
            .windows(2)
            .any(|w| w[0] == "type" && w[1] == "b")
            .then(|| dir.join(name))
    })
}

/// `BGREWRITEAOF`, and waits until the new base file is in the manifest.
fn rewrite_aof(server: &Server, con: &mut Connection) -> std::path::PathBuf {
    let before = aof_base(server);
    let reply = call(con, "BGREWRITEAOF", NONE);
    assert!(error_text(&reply).is_none(), "BGREWRITEAOF: {reply:?}");
    wait_until("the AOF rewrite to finish", WAIT, || {
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

/// Half the world before an AOF rewrite, half after, then kill -9 and a replay.
fn aof_restart(flavor: Flavor, preamble: &str) {
    let options = ServerOptions::new()
        .config("appendonly", "yes")
        .config("appendfsync", "always")
        .config("aof-use-rdb-preamble", preamble);
    let mut server = Server::start_with(flavor, options);
    let mut con = server.client();
    let mut world = populate(&server, &mut con);
    let base = rewrite_aof(&server, &mut con);
    let rdb_base = base.to_string_lossy().ends_with(".base.rdb");
    assert_eq!(rdb_base, preamble == "yes", "{base:?}");
    write_more(&server, &mut con, &mut world);
    let before = freeze(&server, &mut con);
    drop(con);
    server.kill9();
    server.start_again();
    let mut con = server.client();
    let when = format!("after an AOF replay (aof-use-rdb-preamble {preamble})");
    verify(&server, &mut con, &world, &before, &when);
    let log = server.log();
    assert!(!log.contains("redis-lease: refusing"), "{log}");
}

for_each_server!(aof_with_rdb_preamble_keeps_bindings_and_delays, |flavor| {
    aof_restart(flavor, "yes");
});

for_each_server!(
    aof_without_rdb_preamble_keeps_bindings_and_delays,
    |flavor| {
        aof_restart(flavor, "no");
    }
);

// ---------------------------------------------------------------------------------------
// DUMP / RESTORE and MIGRATE

const S: &str = "{w7}session";
const J1: &str = "{w7}job:1";
const J2: &str = "{w7}job:2";
const J3: &str = "{w7}job:3";
const D: &str = "{w7}delayed";

/// A session with a ttl-0 hold, a one-minute hold, a shared hold bound to it, and a
/// key in a lock-delay, all under one hash tag. The fences of `J1`, `J2`, `J3`, `D`.
fn tagged_world(server: &Server, con: &mut Connection) -> [u64; 4] {
    take(con, S, MINUTE, "st");
    let j1 = bind(con, J1, 0, "a", S, "st");
    let j2 = bind(con, J2, MINUTE, "b", S, "st");
    let j3 = bind_shared(con, J3, MINUTE, "r1", S, "st");
    let delays = lease_stat(server, "delays");
    let d = take_with(con, D, 100, "x", &["DELAY", "60000"]);
    wait_delayed(server, con, D, delays + 1);
    [j1, j2, j3, d]
}

/// The tagged world on `server`, arrived whole: bound, counted, delayed; then the
/// session ends there and frees its holds.
fn check_tagged_world(server: &Server, con: &mut Connection, fences: [u64; 4], when: &str) {
    let [j1, j2, j3, d] = fences;
    assert_bound(con, J1, j1, S, when);
    assert_bound(con, J2, j2, S, when);
    let list = holders(con, J3);
    assert_eq!(list.len(), 1, "{when}: {list:?}");
    assert_eq!((list[0].fence, list[0].session.as_deref()), (j3, Some(S)));
    assert_eq!(bound_count(con, S), 3, "{when}");
    let stats = session_stats(server);
    assert_eq!(
        (stats.bound_holds, stats.sessions),
        (3, 1),
        "{when}: {stats:?}"
    );
    let delayed = info(con, D);
    assert_eq!(
        (delayed.state.as_str(), delayed.fence),
        ("delayed", d),
        "{when}"
    );
    assert!(
        delayed.ttl > 0 && delayed.ttl <= MINUTE as i64,
        "{when}: {delayed:?}"
    );
    assert_eq!(acquire(con, D, MINUTE, "y"), None, "{when}");
    // The session token travelled: it renews, and its end frees the holds.
    assert_eq!(renew(con, S, "st", 2 * MINUTE), 1, "{when}: RENEW");
    assert!(
        info(con, J1).ttl > MINUTE as i64,
        "{when}: J1 follows the session"
    );
    assert_eq!(release(con, S, "st"), 1, "{when}: RELEASE");
    assert_unheld(con, J1, when);
    assert_unheld(con, J2, when);
    assert_unheld(con, J3, when);
    wait_until("the freed keys to be reaped", WAIT, || {
        !exists(con, J1) && !exists(con, J2) && !exists(con, J3)
    });
}

fn dump_payload(con: &mut Connection, key: &str) -> Vec<u8> {
    match call(con, "DUMP", key) {
        Value::BulkString(payload) => payload,
        other => panic!("DUMP {key} answered {other:?}"),
    }
}

for_each_server!(
    dump_restore_carries_a_session_and_its_bound_keys,
    |flavor| {
        let a = Server::start(flavor);
        let b = Server::start(flavor);
        let c = Server::start(flavor);
        let mut on_a = a.client();
        let fences = tagged_world(&a, &mut on_a);
        let payloads: Vec<(&str, Vec<u8>)> = [J1, J2, J3, D, S]
            .into_iter()
            .map(|key| (key, dump_payload(&mut on_a, key)))
            .collect();

        // Bound keys first, their session last: the bindings hold once it is there.
        let mut on_b = b.client();
        for (key, payload) in &payloads {
            assert_ok(restore(&mut on_b, key, payload), &format!("RESTORE {key}"));
        }
        check_tagged_world(&b, &mut on_b, fences, "after RESTORE on another server");

        // A bound key restored without its session holds nothing.
        let mut on_c = c.client();
        assert_ok(restore(&mut on_c, J1, &payloads[0].1), "RESTORE J1 alone");
        assert_unheld(&mut on_c, J1, "restored without its session");
        // A new grant of the session's key there is not the grant J1 was bound to.
        take(&mut on_c, S, MINUTE, "st");
        assert_unheld(&mut on_c, J1, "next to a new grant of its session");
        assert_eq!(bound_count(&mut on_c, S), 0);
        assert!(acquire(&mut on_c, J1, MINUTE, "other").is_some());

        // The originals are untouched.
        assert_bound(&mut on_a, J1, fences[0], S, "the original");
        assert_eq!(bound_count(&mut on_a, S), 3);
    }
);

for_each_server!(migrate_carries_a_session_and_its_bound_keys, |flavor| {
    let a = Server::start(flavor);
    let b = Server::start(flavor);
    let mut on_a = a.client();
    let fences = tagged_world(&a, &mut on_a);
    let reply = call(
        &mut on_a,
        "MIGRATE",
        ("127.0.0.1", b.port, "", 0, 5_000, "KEYS", S, J1, J2, J3, D),
    );
    assert_ok(reply, "MIGRATE");
    assert_eq!(dbsize(&mut on_a), 0);
    wait_until("the source's session gauges to reach 0", WAIT, || {
        let stats = session_stats(&a);
        stats.bound_holds == 0 && stats.sessions == 0
    });
    let mut on_b = b.client();
    check_tagged_world(&b, &mut on_b, fences, "after MIGRATE");
});

for_each_server!(
    migrating_the_session_key_alone_ends_the_session_on_the_source,
    |flavor| {
        let a = Server::start(flavor);
        let b = Server::start(flavor);
        let mut on_a = a.client();
        take(&mut on_a, S, MINUTE, "st");
        // A MIGRATE takes its session's group as it is when the command is
        // filtered, in MULTI when it is queued: queued before J1 is bound, it
        // takes the session key alone (tests/session_migrate.rs: the group).
        assert_ok(call(&mut on_a, "MULTI", NONE), "MULTI");
        let queued = call(
            &mut on_a,
            "MIGRATE",
            ("127.0.0.1", b.port, "", 0, 5_000, "KEYS", S),
        );
        assert_eq!(queued, Value::SimpleString("QUEUED".into()));
        bind(&mut a.client(), J1, 0, "a", S, "st");
        let w = Waiter::queue(&a, J1, MINUTE, "w", 10_000, 1);
        let Value::Array(mut replies) = call(&mut on_a, "EXEC", NONE) else {
            panic!("EXEC of the queued MIGRATE");
        };
        assert_ok(replies.remove(0), "MIGRATE of the session key");
        // The holds it leaves behind are free at once; their waiter is served.
        let j1 = lease_info(&mut on_a, J1);
        assert!(
            j1.as_ref()
                .is_some_and(|i| i.holders == 0 && i.session.is_none()),
            "J1 right after its session left: {j1:?}"
        );
        let (reply, _) = w.reply(Duration::from_secs(2), "the waiter on J1");
        assert!(
            granted(&reply, "w").is_some(),
            "the waiter on J1: {reply:?}"
        );
        // The session lives on where it went, with nothing bound to it there.
        let mut on_b = b.client();
        let s = info(&mut on_b, S);
        assert_eq!((s.state.as_str(), s.bound), ("held", 0), "{s:?}");
        assert_eq!(renew(&mut on_b, S, "st", MINUTE), 1);
        wait_until("the source's session gauges to reach 0", WAIT, || {
            let stats = session_stats(&a);
            stats.bound_holds == 0 && stats.sessions == 0
        });
    }
);

// ---------------------------------------------------------------------------------------
// Cluster

for_each_server!(cluster_session_key_in_another_slot_is_crossslot, |flavor| {
    let cluster = Cluster::start(flavor, 3, 0);
    let slot_a = key_slot(b"{a}");
    let owner = cluster.owner(slot_a);
    // Tag `b` hashes to another node, tag `c` to another slot of the same node.
    let b = cluster.tag_on((owner + 1) % 3, &[]);
    let c = cluster.tag_on(owner, &[slot_a]);
    let mut direct = cluster.nodes[owner].client();
    let mut cc = cluster.client();
    let other_node = format!("{b}session");
    let other_slot = format!("{c}session");
    take(&mut cc, &other_node, MINUTE, "st");
    take(&mut direct, &other_slot, MINUTE, "st");

    for session in [&other_node, &other_slot] {
        let args = (
            "{a}job",
            1_000,
            "TOKEN",
            "t",
            "SESSION",
            session.as_str(),
            "st",
        );
        let on_node = call_error(&mut direct, "LEASE.ACQUIRE", args);
        assert!(on_node.starts_with("CROSSSLOT"), "{session}: {on_node}");
        let routed = call_error(&mut cc, "LEASE.ACQUIRE", args);
        assert!(routed.starts_with("CROSSSLOT"), "{session}: {routed}");
    }
    assert!(!exists(&mut direct, "{a}job"));
    assert_eq!(
        strings(call(
            &mut direct,
            "COMMAND",
            (
                "GETKEYS",
                "LEASE.ACQUIRE",
                "{a}job",
                0,
                "SESSION",
                &other_node,
                "st"
            )
        )),
        ["{a}job", other_node.as_str()]
    );
});

for_each_server!(cluster_session_with_one_hash_tag_works, |flavor| {
    let cluster = Cluster::start(flavor, 3, 0);
    let owner = cluster.owner(key_slot(b"{a}"));
    let mut direct = cluster.nodes[owner].client();
    let mut cc = cluster.client();
    take(&mut cc, "{a}session", MINUTE, "st");
    let fence = bind(&mut cc, "{a}job", 0, "t", "{a}session", "st");
    assert_bound(&mut cc, "{a}job", fence, "{a}session", "bound on a cluster");
    assert_eq!(bound_count(&mut direct, "{a}session"), 1);
    assert_eq!(release(&mut cc, "{a}session", "st"), 1);
    assert_unheld(
        &mut direct,
        "{a}job",
        "after the session's release on a cluster",
    );
});

// ---------------------------------------------------------------------------------------
// CLIENT PAUSE WRITE

/// How long the pause lasts.
const PAUSE: Duration = Duration::from_millis(1_500);
/// The session's ttl: it ends inside the pause.
const SHORT_TTL: u64 = 300;

/// Bytes in the AOF's incremental files.
fn aof_bytes(server: &Server) -> u64 {
    let dir = server.dir.join("appendonlydir");
    let entries =
        fs::read_dir(&dir).unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()));
    entries
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".incr.aof"))
        .map(|e| e.metadata().map_or(0, |m| m.len()))
        .sum()
}

for_each_server!(
    a_session_expiring_in_a_write_pause_is_reaped_after_it,
    |flavor| {
        // Sleeping is the point here: time has to pass inside the pause.
        let options = ServerOptions::new()
            .config("appendonly", "yes")
            .config("appendfsync", "always");
        let master = Server::start_with(flavor, options);
        let replica = Server::start(flavor);
        attach(&replica, &master);
        let mut m = master.client();
        let mut r = replica.client();
        let live = take(&mut m, "live", MINUTE, "l");
        let expiries = lease_stat(&master, "session_expiries");

        let sent = Instant::now();
        take(&mut m, "s", SHORT_TTL, "st");
        let session_end = sent + Duration::from_millis(SHORT_TTL);
        for i in 0..5 {
            bind(&mut m, &format!("k{i}"), 0, "a", "s", "st");
        }
        let waiter = Waiter::queue(&master, "k0", MINUTE, "w", 10_000, 1);

        let paused_at = Instant::now();
        assert_ok(
            call(
                &mut m,
                "CLIENT",
                ("PAUSE", PAUSE.as_millis() as u64, "WRITE"),
            ),
            "CLIENT PAUSE",
        );
        let earliest_end = paused_at + PAUSE - Duration::from_millis(1);
        assert!(
            Instant::now() < session_end,
            "the setup outlasted the session"
        );
        let aof_at_pause = aof_bytes(&master);
        thread::sleep(
            (session_end + Duration::from_millis(300)).saturating_duration_since(Instant::now()),
        );

        let pong = text(call(&mut m, "PING", NONE));
        let k1_on_master = lease_info(&mut m, "k1");
        let k1_on_replica = lease_info(&mut r, "k1");
        let kept: Vec<bool> = (1..5).map(|i| exists(&mut m, &format!("k{i}"))).collect();
        let expiries_during = lease_stat(&master, "session_expiries");
        let aof_during = aof_bytes(&master);
        assert!(
            Instant::now() < earliest_end,
            "the observations came too late to be sure the pause was on"
        );
        assert_eq!(pong, "PONG");
        assert!(unheld(&k1_on_master), "k1 on the master: {k1_on_master:?}");
        assert!(
            unheld(&k1_on_replica),
            "k1 on the replica: {k1_on_replica:?}"
        );
        assert_eq!(kept, [true; 4], "keys deleted during the pause");
        assert_eq!(expiries_during, expiries, "reaped during the pause");
        assert_eq!(aof_during, aof_at_pause, "the AOF grew during the pause");
        waiter.assert_waiting("the waiter on k0 during the pause");

        let (reply, at) = waiter.reply(PAUSE + WAIT, "the waiter on k0");
        assert!(at >= earliest_end, "the waiter was served during the pause");
        assert!(granted(&reply, "w").is_some(), "the waiter: {reply:?}");
        wait_until(
            "the freed keys to be reaped after the pause",
            PAUSE + WAIT,
            || (1..5).all(|i| !exists(&mut m, &format!("k{i}"))),
        );
        assert_in_step(&master, &replica, "after the pause");
        let before = digest(&master);
        assert_ok(call(&mut m, "DEBUG", "LOADAOF"), "DEBUG LOADAOF");
        assert_eq!(digest(&master), before, "DEBUG DIGEST after DEBUG LOADAOF");
        let kept = info(&mut m, "live");
        assert_eq!((kept.state.as_str(), kept.fence), ("held", live));
        let log = master.log();
        assert!(
            !log.contains("panicked") && !log.contains("ASSERTION"),
            "the master's log reports a panic or an assertion:\n{log}"
        );
    }
);

// An evicted session put back by `lease.allkeys-eviction restore` did not end: its bound
// holds are live through the eviction and after it, the reaper leaves them, and the
// session still counts them. (Redis 7.0 has no post-notification jobs: no restore.)
for_each_server!(
    an_evicted_session_put_back_keeps_its_bound_holds,
    |flavor| {
        if flavor == Flavor::Redis7 {
            return;
        }
        let server = Server::start(flavor);
        let mut con = server.client();
        take_with(&mut con, "{e}s", 600_000, "st", &[]);
        let fences: Vec<u64> = (0..3)
            .map(|i| bind(&mut con, &format!("{{e}}j{i}"), 0, "jt", "{e}s", "st"))
            .collect();
        arm(&mut con, "restore");
        let evicted = fill_until(&mut con, |c| info_on(c, "lease", "lease_evicted") > 0);
        config_set(&mut con, "maxmemory", "0");
        assert!(evicted, "five rounds of writes never evicted a lease");
        assert_eq!(
            lease_stat(&server, "restored"),
            lease_stat(&server, "evicted")
        );
        // Three reaper ticks (10 Hz, the default): a session that had ended would have had
        // its bound keys reaped by the first. A window, not a guess at an event.
        thread::sleep(Duration::from_millis(300));
        for (i, fence) in fences.iter().enumerate() {
            assert_bound(
                &mut con,
                &format!("{{e}}j{i}"),
                *fence,
                "{e}s",
                "after the restore",
            );
        }
        assert_eq!(bound_count(&mut con, "{e}s"), 3);
        assert_eq!(session_stats(&server).session_expiries, 0);
        // And it still ends as a session does.
        assert_eq!(int(call(&mut con, "LEASE.RELEASE", ("{e}s", "st"))), 1);
        assert_unheld(&mut con, "{e}j0", "after the session's release");
    }
);

// Under `lease.allkeys-eviction allow`, a session lost to eviction ends: its bound holds
// are free at once and reaped.
for_each_server!(
    an_evicted_session_under_allow_frees_its_bound_holds,
    |flavor| {
        let server = Server::start(flavor);
        let mut con = server.client();
        take_with(&mut con, "{e}s", 600_000, "st", &[]);
        for i in 0..3 {
            bind(&mut con, &format!("{{e}}j{i}"), 0, "jt", "{e}s", "st");
        }
        arm(&mut con, "allow");
        let evicted = fill_until(&mut con, |c| !exists(c, "{e}s"));
        config_set(&mut con, "maxmemory", "0");
        assert!(evicted, "five rounds of writes never evicted the session");
        for i in 0..3 {
            let key = format!("{{e}}j{i}");
            if exists(&mut con, &key) {
                assert_unheld(&mut con, &key, "after the session's eviction");
            }
        }
        wait_until("the bound keys reaped", Duration::from_secs(5), || {
            (0..3).all(|i| !exists(&mut con, &format!("{{e}}j{i}")))
        });
    }
);
