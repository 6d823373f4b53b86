//! A session moves with its bound keys, in one MIGRATE: the module's command filter
//! closes every `MIGRATE`'s key list over the session groups on the node (a session
//! with holds bound to it takes its bound keys; a bound key takes its session and the
//! session's other bound keys; until closed). Without that, a MIGRATE in batches
//! (`redis-cli --cluster reshard`, `CLUSTER GETKEYSINSLOT` then `MIGRATE ... KEYS` a
//! batch at a time) splits a group: the source ends the session when its key leaves
//! and frees (and reaps) the holds still there, or the target reaps the bound keys that
//! arrived before their session; and `LEASE.RENEW` of the session answers 1 on the
//! target with holds missing. Here, on each server: batches between two standalone
//! servers in both orders, the single-key form, `COPY`, shared holds bound to two
//! sessions, the client's database and `MULTI`, a cluster slot resharded by
//! `Cluster::migrate_slot` and by `redis-cli --cluster reshard`, and (Valkey 9) an
//! atomic slot migration.

#[macro_use]
extern crate harness;

use std::process::Command;
use std::time::Duration;

use harness::calls::{call, exists, int, renew, select, strings, take, text, NONE};
use harness::cluster::{key_slot, migrate_slot_atomically, Cluster};
use harness::holds::{holder_fences, holders};
use harness::lease::{lease_info, lease_stat};
use harness::reply::error_text;
use harness::session::{assert_bound, bind, bind_many, bind_shared, bound_count, session_stats};
use harness::waiter::Waiter;
use harness::{wait_until, Flavor, Server};
use redis::{Connection, ConnectionLike, Value};

const MINUTE: u64 = 60_000;
const WAIT: Duration = Duration::from_secs(20);

const S: &str = "{w}sess";
const ST: &str = "st";

fn job(i: usize) -> String {
    format!("{{w}}job{i}")
}

/// The session `S` and `n` holds bound to it with no deadline of their own,
/// `{w}job1..n` (token `t<i>`): each key with its fence.
fn session_world(con: &mut Connection, n: usize) -> Vec<(String, u64)> {
    take(con, S, MINUTE, ST);
    (1..=n)
        .map(|i| {
            let key = job(i);
            let fence = bind(con, &key, 0, &format!("t{i}"), S, ST);
            (key, fence)
        })
        .collect()
}

/// `MIGRATE 127.0.0.1 port "" db 5000 [words...] KEYS keys...`, reply as sent.
fn migrate_keys<C: ConnectionLike>(
    con: &mut C,
    port: u16,
    db: i64,
    words: &[&str],
    keys: &[String],
) -> Value {
    let mut cmd = redis::cmd("MIGRATE");
    cmd.arg("127.0.0.1").arg(port).arg("").arg(db).arg(5_000);
    for w in words {
        cmd.arg(*w);
    }
    cmd.arg("KEYS");
    for k in keys {
        cmd.arg(k.as_str());
    }
    con.req_command(&cmd)
        .unwrap_or_else(|e| panic!("MIGRATE: the connection failed: {e}"))
}

/// OK, or NOKEY when every key it names has already gone (with its group).
fn assert_migrated(reply: Value, what: &str) {
    let fine = matches!(&reply, Value::Okay)
        || matches!(&reply, Value::SimpleString(s) if s == "OK" || s == "NOKEY");
    assert!(fine, "{what}: {reply:?}");
}

/// Waits until `server`'s reaper has ticked `n` times from now: each tick is seen by
/// a lease of 1 ms that it deletes.
fn wait_ticks(server: &Server, n: usize) {
    let mut con = server.client();
    for i in 0..n {
        let marker = format!("tick-marker:{i}");
        take(&mut con, &marker, 1, "m");
        wait_until("a reaper tick", WAIT, || !exists(&mut con, &marker));
    }
}

fn dbsize(con: &mut Connection) -> i64 {
    int(call(con, "DBSIZE", NONE))
}

/// The whole group on `server`: every hold held by its fence and bound to `session`,
/// the session's `bound` count and the node's gauges right, and the session renews.
fn assert_group_here(
    server: &Server,
    con: &mut Connection,
    session: &str,
    keys: &[(String, u64)],
    when: &str,
) {
    for (key, fence) in keys {
        assert_bound(con, key, *fence, session, when);
    }
    assert_eq!(bound_count(con, session), keys.len() as i64, "{when}");
    let stats = session_stats(server);
    assert_eq!(
        (stats.bound_holds, stats.sessions),
        (keys.len() as u64, 1),
        "{when}: {stats:?}"
    );
    assert_eq!(
        renew(con, session, ST, MINUTE),
        1,
        "{when}: LEASE.RENEW {session}"
    );
}

/// Nothing of the group is left on `server`, and its session gauges reach 0.
fn assert_group_gone(server: &Server, con: &mut Connection, keys: &[(String, u64)], when: &str) {
    assert!(!exists(con, S), "{when}: {S} on the source");
    for (key, _) in keys {
        assert!(!exists(con, key), "{when}: {key} on the source");
    }
    wait_until(
        &format!("{when}: the source's session gauges to reach 0"),
        WAIT,
        || {
            let stats = session_stats(server);
            stats.bound_holds == 0 && stats.sessions == 0
        },
    );
}

fn names(keys: &[(String, u64)]) -> Vec<String> {
    keys.iter().map(|(k, _)| k.clone()).collect()
}

// ---------------------------------------------------------------------------------------
// 1. Batches between two standalone servers

for_each_server!(a_batch_with_the_session_takes_the_whole_group, |flavor| {
    let a = Server::start(flavor);
    let b = Server::start(flavor);
    let mut on_a = a.client();
    let world = session_world(&mut on_a, 15);
    let mut first = vec![S.to_string()];
    first.extend(names(&world[..9]));
    assert_migrated(migrate_keys(&mut on_a, b.port, 0, &[], &first), "batch 1");
    // Time for the source to end the session and reap what it left behind, if it did.
    wait_ticks(&a, 3);
    wait_ticks(&b, 3);
    let second = names(&world[9..]);
    assert_migrated(migrate_keys(&mut on_a, b.port, 0, &[], &second), "batch 2");
    let mut on_b = b.client();
    assert_group_here(&b, &mut on_b, S, &world, "on the target");
    assert_group_gone(&a, &mut on_a, &world, "after both batches");
    assert_eq!(dbsize(&mut on_a), 0);
});

for_each_server!(a_batch_of_bound_keys_takes_their_session_along, |flavor| {
    let a = Server::start(flavor);
    let b = Server::start(flavor);
    let mut on_a = a.client();
    let world = session_world(&mut on_a, 15);
    let first = names(&world[..9]);
    assert_migrated(migrate_keys(&mut on_a, b.port, 0, &[], &first), "batch 1");
    // Time for the target to reap bound keys that came without their session, if
    // they did.
    wait_ticks(&a, 3);
    wait_ticks(&b, 3);
    let mut second = vec![S.to_string()];
    second.extend(names(&world[9..]));
    assert_migrated(migrate_keys(&mut on_a, b.port, 0, &[], &second), "batch 2");
    let mut on_b = b.client();
    assert_group_here(&b, &mut on_b, S, &world, "on the target");
    assert_group_gone(&a, &mut on_a, &world, "after both batches");
    assert_eq!(dbsize(&mut on_a), 0);
});

// ---------------------------------------------------------------------------------------
// 2. The single-key form

for_each_server!(the_single_key_form_moves_the_whole_group, |flavor| {
    let a = Server::start(flavor);
    let b = Server::start(flavor);
    let mut on_a = a.client();
    let mut on_b = b.client();
    let world = session_world(&mut on_a, 15);
    // The session's key alone...
    let reply = call(&mut on_a, "MIGRATE", ("127.0.0.1", b.port, S, 0, 5_000));
    assert_migrated(reply, "MIGRATE of the session key");
    assert_group_here(&b, &mut on_b, S, &world, "on the target");
    assert_group_gone(&a, &mut on_a, &world, "after the session key's MIGRATE");
    // ...and back by one of its bound keys, whole again, to a third node.
    let c = Server::start(flavor);
    let mut on_c = c.client();
    let reply = call(
        &mut on_b,
        "MIGRATE",
        ("127.0.0.1", c.port, job(7), 0, 5_000),
    );
    assert_migrated(reply, "MIGRATE of a bound key");
    assert_group_here(&c, &mut on_c, S, &world, "on the third node");
    assert_group_gone(&b, &mut on_b, &world, "after the bound key's MIGRATE");
    // Back to the node it first left, the session grant arrives ended: it ended
    // there once, and a node never takes an ended session back
    // (tests/session_returns.rs). Its holder learns it at its next renewal.
    let reply = call(&mut on_c, "MIGRATE", ("127.0.0.1", a.port, S, 0, 5_000));
    assert_migrated(reply, "MIGRATE back to the first node");
    assert_group_gone(&c, &mut on_c, &world, "after the MIGRATE back");
    assert_eq!(
        renew(&mut on_a, S, ST, MINUTE),
        0,
        "RENEW back on the first node"
    );
    for (key, _) in &world {
        assert!(
            !lease_info(&mut on_a, key).is_some_and(|i| i.holders > 0),
            "{key} back on the first node"
        );
    }
    wait_until("the first node's session gauges at 0", WAIT, || {
        let stats = session_stats(&a);
        stats.bound_holds == 0 && stats.sessions == 0
    });
});

// ---------------------------------------------------------------------------------------
// 3. A cluster slot resharded in batches

/// A session with `n` bound holds in one slot of node `from`, under `tag`: the keys
/// with their holders' fences.
struct ClusterGroup {
    session: String,
    keys: Vec<(String, Vec<u64>)>,
}

fn cluster_group(node: &Server, tag: &str, n: usize) -> ClusterGroup {
    let mut con = node.client();
    let session = format!("{tag}sess");
    take(&mut con, &session, 10 * MINUTE, ST);
    let prefix = format!("{tag}job");
    bind_many(&mut con, &prefix, n, 0, "t", &session, ST);
    let keys = (0..n)
        .map(|i| {
            let key = format!("{prefix}{i}");
            let fences = holder_fences(&mut con, &key);
            assert_eq!(fences.len(), 1, "{key}");
            (key, fences)
        })
        .collect();
    assert_eq!(bound_count(&mut con, &session), n as i64);
    ClusterGroup { session, keys }
}

/// Clients blocked on bound keys of the group on `node`: those `CLUSTER GETKEYSINSLOT`
/// lists after the session (the ones a batch after the session's would leave behind,
/// freed), else the last one it lists.
fn block_on_late_keys(node: &Server, slot: u16, group: &ClusterGroup) -> Vec<Waiter> {
    let listed = strings(call(
        &mut node.client(),
        "CLUSTER",
        ("GETKEYSINSLOT", slot, 10_000),
    ));
    let at = listed.iter().position(|k| *k == group.session);
    let mut late: Vec<&String> = match at {
        Some(at) => listed[at + 1..].iter().collect(),
        None => Vec::new(),
    };
    if late.is_empty() {
        late = listed.iter().rev().take(1).collect();
    }
    let picked = [late.first(), late.get(late.len() / 2), late.last()];
    let mut keys: Vec<&String> = picked.into_iter().flatten().copied().collect();
    keys.dedup();
    keys.iter()
        .enumerate()
        .map(|(i, key)| Waiter::block(node, key, MINUTE, &format!("w{i}"), 0, &[]))
        .collect()
}

/// After the slot moved: the target has the session and every bound hold, with the
/// same fences, bound and renewable; the source nothing; each waiter on the source was
/// sent on, never granted there.
fn check_cluster_moved(
    cluster: &Cluster,
    (from, to): (usize, usize),
    slot: u16,
    group: &ClusterGroup,
    waiters: Vec<Waiter>,
) {
    let source = &cluster.nodes[from];
    let target = &cluster.nodes[to];
    let mut t = target.client();
    for (key, fences) in &group.keys {
        assert_bound(&mut t, key, fences[0], &group.session, "on the target");
        assert_eq!(&holder_fences(&mut t, key), fences, "{key}: LEASE.HOLDERS");
    }
    let n = group.keys.len();
    assert_eq!(bound_count(&mut t, &group.session), n as i64);
    let stats = session_stats(target);
    assert_eq!((stats.bound_holds, stats.sessions), (n as u64, 1));
    assert_eq!(renew(&mut t, &group.session, ST, MINUTE), 1, "RENEW");
    let mut s = source.client();
    assert_eq!(int(call(&mut s, "CLUSTER", ("COUNTKEYSINSLOT", slot))), 0);
    for (i, waiter) in waiters.into_iter().enumerate() {
        let what = format!("waiter w{i} on the source");
        let answer = match waiter.answer(&what) {
            Ok(reply) => match error_text(&reply) {
                Some(e) => e,
                None => panic!("{what}: answered {reply:?}, not sent on"),
            },
            Err(e) => e.to_string(),
        };
        assert!(
            answer.starts_with("MOVED") || answer.starts_with("ASK"),
            "{what}: {answer}"
        );
    }
    wait_until("the source's session gauges to reach 0", WAIT, || {
        let stats = session_stats(source);
        stats.bound_holds == 0 && stats.sessions == 0
    });
    assert_eq!(lease_stat(source, "keys"), 0);
}

/// Bound keys: more than a batch of 100 (`Cluster::migrate_slot`) or of 10
/// (`redis-cli`), so the group spans batches.
const CLUSTER_BOUND: usize = 250;

for_each_server!(a_resharded_slot_keeps_its_session_groups, |flavor| {
    let cluster = Cluster::start(flavor, 2, 0);
    let (from, to) = (0, 1);
    let tag = cluster.tag_on(from, &[]);
    let slot = key_slot(tag.as_bytes());
    let group = cluster_group(&cluster.nodes[from], &tag, CLUSTER_BOUND);
    let waiters = block_on_late_keys(&cluster.nodes[from], slot, &group);
    let moved = cluster.migrate_slot(slot, to, |_, _, _| {});
    assert_eq!(moved.len(), CLUSTER_BOUND + 1, "keys moved");
    assert_eq!(cluster.owner(slot), to);
    check_cluster_moved(&cluster, (from, to), slot, &group, waiters);
});

/// `redis-cli`: `LEASE_REDIS_CLI`, or Debian's.
fn redis_cli() -> String {
    match std::env::var("LEASE_REDIS_CLI") {
        Ok(path) if !path.is_empty() => path,
        _ => "/usr/bin/redis-cli".to_string(),
    }
}

for_each_server!(redis_cli_reshard_keeps_session_groups, |flavor| {
    let cluster = Cluster::start(flavor, 2, 0);
    let (from, to) = (0, 1);
    // A tag in one of the first slots: redis-cli moves a node's slots from its
    // lowest, so `slot + 1` slots carry it (the others are empty).
    let ranges = cluster.slots_of(from);
    let (tag, slot) = (0..100_000)
        .map(|n| format!("{{t{n}}}"))
        .map(|tag| {
            let slot = key_slot(tag.as_bytes());
            (tag, slot)
        })
        .find(|(_, slot)| *slot < 16 && ranges.iter().any(|&(lo, hi)| lo <= *slot && *slot <= hi))
        .unwrap_or_else(|| panic!("no hash tag in the first slots of node {from}"));
    let group = cluster_group(&cluster.nodes[from], &tag, CLUSTER_BOUND);
    let waiters = block_on_late_keys(&cluster.nodes[from], slot, &group);
    let output = Command::new(redis_cli())
        .args([
            "--cluster",
            "reshard",
            &cluster.nodes[from].addr(),
            "--cluster-from",
            &cluster.ids[from],
            "--cluster-to",
            &cluster.ids[to],
            "--cluster-slots",
            &(slot + 1).to_string(),
            "--cluster-yes",
        ])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", redis_cli()));
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "redis-cli --cluster reshard: {said}"
    );
    assert!(
        !said.contains("[ERR]"),
        "redis-cli --cluster reshard: {said}"
    );
    wait_until("every node to see the slot moved", WAIT, || {
        cluster.owner(slot) == to
    });
    cluster.wait_stable();
    check_cluster_moved(&cluster, (from, to), slot, &group, waiters);
});

// ---------------------------------------------------------------------------------------
// 4. Valkey 9's atomic slot migration

mod atomic_slot_migration_keeps_session_groups {
    use super::*;

    /// Named for its server, as every per-server test is.
    #[test]
    fn valkey9() {
        let cluster = Cluster::start(Flavor::Valkey9, 2, 0);
        let (from, to) = (0, 1);
        let tag = cluster.tag_on(from, &[]);
        let slot = key_slot(tag.as_bytes());
        let group = cluster_group(&cluster.nodes[from], &tag, CLUSTER_BOUND);
        let waiters = block_on_late_keys(&cluster.nodes[from], slot, &group);
        migrate_slot_atomically(&cluster, slot, to);
        wait_until("every node to see the slot moved", WAIT, || {
            cluster.owner(slot) == to
        });
        check_cluster_moved(&cluster, (from, to), slot, &group, waiters);
    }
}

// ---------------------------------------------------------------------------------------
// 5. COPY

for_each_server!(a_copy_takes_the_group_and_leaves_it, |flavor| {
    let a = Server::start(flavor);
    let b = Server::start(flavor);
    let mut on_a = a.client();
    let mut on_b = b.client();
    let world = session_world(&mut on_a, 15);
    let reply = migrate_keys(&mut on_a, b.port, 0, &["COPY"], &[S.to_string()]);
    assert_migrated(reply, "MIGRATE COPY of the session key");
    // Both sides hold everything: a copy is the operator's choice.
    assert_group_here(&b, &mut on_b, S, &world, "the copy");
    assert_group_here(&a, &mut on_a, S, &world, "the original");
});

// ---------------------------------------------------------------------------------------
// 6. Shared holds bound to two sessions

for_each_server!(a_key_bound_to_two_sessions_takes_both_groups, |flavor| {
    let a = Server::start(flavor);
    let b = Server::start(flavor);
    let mut on_a = a.client();
    let (s1, s2, s3) = ("{w}s1", "{w}s2", "{w}s3");
    take(&mut on_a, s1, MINUTE, "st1");
    take(&mut on_a, s2, MINUTE, "st2");
    take(&mut on_a, s3, MINUTE, "st3");
    let bound_to = |con: &mut Connection, prefix: &str, session: &str, token: &str| {
        (1..=3)
            .map(|i| {
                let key = format!("{{w}}{prefix}{i}");
                let fence = bind(con, &key, 0, &format!("{prefix}{i}"), session, token);
                (key, fence)
            })
            .collect::<Vec<_>>()
    };
    let ones = bound_to(&mut on_a, "one", s1, "st1");
    let twos = bound_to(&mut on_a, "two", s2, "st2");
    let threes = bound_to(&mut on_a, "three", s3, "st3");
    // The key both groups share: a reader bound to each session.
    let both = "{w}both";
    let r1 = bind_shared(&mut on_a, both, 0, "r1", s1, "st1");
    let r2 = bind_shared(&mut on_a, both, 0, "r2", s2, "st2");
    let plain = take(&mut on_a, "{w}plain", MINUTE, "p");

    // One of s1's keys: s1, its keys, the shared key, s2 (bound there), s2's keys.
    let reply = migrate_keys(&mut on_a, b.port, 0, &[], &[ones[0].0.clone()]);
    assert_migrated(reply, "MIGRATE of one bound key");
    let mut on_b = b.client();
    for (session, token, keys) in [(s1, "st1", &ones), (s2, "st2", &twos)] {
        for (key, fence) in keys.iter() {
            assert_bound(&mut on_b, key, *fence, session, "on the target");
        }
        assert_eq!(bound_count(&mut on_b, session), 4, "{session}");
        assert_eq!(renew(&mut on_b, session, token, MINUTE), 1, "{session}");
    }
    let list = holders(&mut on_b, both);
    let shared: Vec<(u64, Option<&str>)> = list
        .iter()
        .map(|h| (h.fence, h.session.as_deref()))
        .collect();
    assert_eq!(shared, [(r1, Some(s1)), (r2, Some(s2))]);
    let stats = session_stats(&b);
    assert_eq!((stats.bound_holds, stats.sessions), (8, 2), "{stats:?}");

    // s3's group and the plain lease stayed where they were.
    for (key, fence) in &threes {
        assert_bound(&mut on_a, key, *fence, s3, "left on the source");
    }
    assert_eq!(renew(&mut on_a, s3, "st3", MINUTE), 1);
    assert_eq!(holder_fences(&mut on_a, "{w}plain"), [plain]);
    for key in [s1, s2, both] {
        assert!(!exists(&mut on_a, key), "{key} left the source");
    }
    wait_until("the source's gauges to count s3 alone", WAIT, || {
        let stats = session_stats(&a);
        (stats.bound_holds, stats.sessions) == (3, 1)
    });
});

// ---------------------------------------------------------------------------------------
// The client's database, and MULTI

for_each_server!(the_group_is_the_one_in_the_clients_database, |flavor| {
    let a = Server::start(flavor);
    let b = Server::start(flavor);
    let mut on_a = a.client();
    // Same names in database 0: not the group, and not moved.
    assert_eq!(call(&mut on_a, "SET", (job(2), "db0")), Value::Okay);
    let decoy = take(&mut on_a, &job(3), MINUTE, "d");
    select(&mut on_a, 3);
    let world = session_world(&mut on_a, 5);
    // Queued in MULTI: the filter sees it when it is queued.
    assert_eq!(call(&mut on_a, "MULTI", NONE), Value::Okay);
    let queued = call(&mut on_a, "MIGRATE", ("127.0.0.1", b.port, S, 3, 5_000));
    assert!(
        matches!(&queued, Value::SimpleString(s) if s == "QUEUED"),
        "{queued:?}"
    );
    let replies = call(&mut on_a, "EXEC", NONE);
    let Value::Array(replies) = replies else {
        panic!("EXEC: {replies:?}");
    };
    assert_migrated(replies[0].clone(), "MIGRATE in MULTI");
    let mut on_b = b.client();
    select(&mut on_b, 3);
    if flavor == Flavor::Redis7 {
        // Redis 7.0 does not name the client to a filter, and database 0 holds keys
        // too: the database is unknown, and the MIGRATE moves what it names (the
        // documented limit), rather than names of keys of another database.
        assert!(exists(&mut on_b, S), "the session on the target");
        assert_eq!(bound_count(&mut on_b, S), 0);
        for (key, _) in &world {
            assert!(exists(&mut on_a, key), "{key} stayed on the source");
            assert!(!exists(&mut on_b, key), "{key} did not move");
        }
    } else {
        assert_group_here(&b, &mut on_b, S, &world, "db 3 of the target");
        assert_eq!(dbsize(&mut on_a), 0, "db 3 of the source");
    }
    select(&mut on_a, 0);
    assert_eq!(
        text(call(&mut on_a, "GET", job(2))),
        "db0",
        "db 0 untouched"
    );
    assert_eq!(holder_fences(&mut on_a, &job(3)), [decoy]);
    select(&mut on_b, 0);
    assert_eq!(dbsize(&mut on_b), 0, "db 0 of the target");
});
