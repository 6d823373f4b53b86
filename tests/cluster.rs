//! Leases on a real Redis Cluster / Valkey Cluster on loopback (see
//! `tests/harness/src/cluster.rs`): routing by key through a cluster client, CROSSSLOT and
//! MOVED for LEASE commands, a slot migration carrying live leases and a resource
//! record, manual failovers (default, FORCE, TAKEOVER), a master killed right after
//! granting, replicas serving `LEASE.INFO` after `READONLY`, and `WAIT` / `WAITAOF`
//! as the way to get a grant that survives a failover.

#[macro_use]
extern crate harness;

use std::collections::BTreeMap;
use std::time::Duration;

use harness::calls::{
    acquire, call, call_error, exists, int, release, renew, stale, strings, take, text, NONE,
};
use harness::cluster::{key_slot, keys_by_slot, Cluster, ClusterOptions};
use harness::lease::{lease_info, lease_stat, restore_fence_ahead};
use harness::{now_ms, repl_offset, wait_until, Flavor, Server};
use redis::{Connection, ConnectionLike, Value};

// ---------------------------------------------------------------------------
// Commands, on a node's own connection or through the cluster client

const LONG_TTL: u64 = 60_000;

fn held_with<C: ConnectionLike>(con: &mut C, key: &str, fence: u64) {
    let info = lease_info(con, key).unwrap_or_else(|| panic!("{key}: no lease"));
    assert_eq!(info.state, "held", "{key}: {info:?}");
    assert_eq!(info.fence, fence, "{key}: {info:?}");
    assert!(info.ttl > 0, "{key}: {info:?}");
}

/// Another token can neither renew nor release the lease on `key` (the holder's token
/// travelled with the lease; it was not lost or replaced on the way).
fn assert_not_holder<C: ConnectionLike>(con: &mut C, key: &str) {
    assert_eq!(
        renew(con, key, "intruder", LONG_TTL),
        0,
        "{key}: RENEW by another token"
    );
    assert_eq!(
        release(con, key, "intruder"),
        0,
        "{key}: RELEASE by another token"
    );
    assert_eq!(
        acquire(con, key, 1000, "intruder"),
        None,
        "{key}: ACQUIRE by another token"
    );
}

/// `MOVED <slot> 127.0.0.1:<port>` for `key` served by `owner`.
fn moved_to(key: &str, owner: &Server) -> String {
    format!("MOVED {} {}", key_slot(key.as_bytes()), owner.addr())
}

// ---------------------------------------------------------------------------
// 1. Routing

for_each_server!(thousand_leases_routed_by_a_cluster_client, |flavor| {
    let cluster = Cluster::start(flavor, 3, 0);
    let mut cc = cluster.client();
    let keys: Vec<String> = (0..1000).map(|i| format!("lease:{i}")).collect();
    let token = |i: usize| format!("token-{i}");

    let mut fences = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        fences.push(take(&mut cc, key, LONG_TTL, &token(i)));
    }
    // Each node issues from its own sequence: in grant order, its fences increase.
    let owners: Vec<usize> = keys.iter().map(|k| cluster.owner_of_key(k)).collect();
    let mut last_by_node = BTreeMap::new();
    for (i, &owner) in owners.iter().enumerate() {
        let last = last_by_node.entry(owner).or_insert(0u64);
        assert!(
            fences[i] > *last,
            "{}: fence {} after {}",
            keys[i],
            fences[i],
            last
        );
        *last = fences[i];
    }
    for (i, key) in keys.iter().enumerate() {
        held_with(&mut cc, key, fences[i]);
        assert_eq!(acquire(&mut cc, key, 1000, "intruder"), None, "{key}");
    }

    // Every key is on the node serving its slot, and only there.
    let mut expected: BTreeMap<usize, BTreeMap<u16, usize>> = BTreeMap::new();
    for (key, &owner) in keys.iter().zip(&owners) {
        *expected
            .entry(owner)
            .or_default()
            .entry(key_slot(key.as_bytes()))
            .or_insert(0) += 1;
    }
    assert_eq!(expected.len(), 3, "1,000 keys reach all three masters");
    for (n, node) in cluster.nodes.iter().enumerate() {
        let held = expected.remove(&n).unwrap_or_default();
        assert!(
            held.values().sum::<usize>() > 200,
            "node {n} holds {held:?}"
        );
        assert_eq!(keys_by_slot(node), held, "node {n}: keys by slot");
        assert_eq!(
            lease_stat(node, "keys"),
            held.values().sum::<usize>() as u64
        );
        assert_eq!(
            lease_stat(node, "grants"),
            held.values().sum::<usize>() as u64
        );
        let mut con = node.client();
        for (&slot, &count) in &held {
            let counted = int(call(&mut con, "CLUSTER", ("COUNTKEYSINSLOT", slot)));
            assert_eq!(counted, count as i64, "node {n} slot {slot}");
        }
    }
    let mut any = cluster.nodes[0].client();
    for key in keys.iter().step_by(37) {
        let slot = int(call(&mut any, "CLUSTER", ("KEYSLOT", key.as_str())));
        assert_eq!(
            slot,
            i64::from(key_slot(key.as_bytes())),
            "CLUSTER KEYSLOT {key}"
        );
    }

    for (i, key) in keys.iter().enumerate() {
        assert_eq!(renew(&mut cc, key, &token(i), LONG_TTL), 1, "{key}");
        assert_eq!(renew(&mut cc, key, "intruder", LONG_TTL), 0, "{key}");
    }
    for (i, key) in keys.iter().enumerate() {
        assert_eq!(release(&mut cc, key, "intruder"), 0, "{key}");
        assert_eq!(release(&mut cc, key, &token(i)), 1, "{key}");
        assert_eq!(lease_info(&mut cc, key), None, "{key}");
    }
    for node in &cluster.nodes {
        assert_eq!(int(call(&mut node.client(), "DBSIZE", NONE)), 0);
        assert_eq!(lease_stat(node, "keys"), 0);
    }

    // A hash tag keeps a lock, its resource record and the data it guards on one node.
    let mut cc = cluster.client();
    let f = take(&mut cc, "{x}lock", LONG_TTL, "holder");
    assert_eq!(
        call(&mut cc, "LEASE.FENCE", ("{x}res", f, "SET", "{x}data", "v")),
        Value::Okay
    );
    assert_eq!(
        call_error(
            &mut cc,
            "LEASE.FENCE",
            ("{x}res", f - 1, "SET", "{x}data", "w")
        ),
        stale(f - 1, f)
    );
    let owner = cluster.owner_of_key("{x}");
    for (n, node) in cluster.nodes.iter().enumerate() {
        let mut con = node.client();
        let here: i64 = int(call(&mut con, "DBSIZE", NONE));
        if n == owner {
            assert_eq!(here, 3, "node {n} serves {{x}}");
            assert_eq!(text(call(&mut con, "TYPE", "{x}lock")), "lease-key");
            assert_eq!(text(call(&mut con, "TYPE", "{x}res")), "fence-rec");
            assert_eq!(text(call(&mut con, "GET", "{x}data")), "v");
        } else {
            assert_eq!(here, 0, "node {n} does not serve {{x}}");
        }
    }
});

// ---------------------------------------------------------------------------
// 2. CROSSSLOT, COMMAND GETKEYS, MOVED

for_each_server!(fence_crossslot_getkeys_and_moved, |flavor| {
    let cluster = Cluster::start(flavor, 3, 0);
    let slot_a = key_slot(b"{a}");
    let owner = cluster.owner(slot_a);
    let elsewhere = (owner + 1) % 3;
    // Tag `b` hashes to another node, tag `c` to another slot of the same node.
    let b = cluster.tag_on(elsewhere, &[]);
    let c = cluster.tag_on(owner, &[slot_a]);
    let other_b = format!("{b}other");
    let other_c = format!("{c}other");
    let mut direct = cluster.nodes[owner].client();
    let mut cc = cluster.client();

    for inner_key in [&other_b, &other_c] {
        let args = ("{a}res", 1, "SET", inner_key.as_str(), "v");
        let on_node = call_error(&mut direct, "LEASE.FENCE", args);
        assert!(on_node.starts_with("CROSSSLOT"), "{inner_key}: {on_node}");
        let routed = call_error(&mut cc, "LEASE.FENCE", args);
        assert!(routed.starts_with("CROSSSLOT"), "{inner_key}: {routed}");
        let mset = ("{a}res", 1, "MSET", "{a}x", "1", inner_key.as_str(), "2");
        let on_node = call_error(&mut direct, "LEASE.FENCE", mset);
        assert!(on_node.starts_with("CROSSSLOT"), "{inner_key}: {on_node}");
    }
    // Nothing ran and nothing was recorded.
    assert!(!exists(&mut direct, "{a}res"));
    assert!(!exists(&mut direct, "{a}x"));
    assert!(!exists(&mut direct, &other_c));
    assert_eq!(call(&mut cc, "GET", other_b.as_str()), Value::Nil);

    // Inner keys in the resource's slot are fine, on the node and through the client.
    let f = take(&mut cc, "{a}lock", LONG_TTL, "holder");
    assert_eq!(
        call(
            &mut direct,
            "LEASE.FENCE",
            ("{a}res", f, "MSET", "{a}x", "1", "{a}y", "2")
        ),
        Value::Okay
    );
    assert_eq!(
        call(&mut cc, "LEASE.FENCE", ("{a}res", f, "INCR", "{a}x")),
        Value::Int(2)
    );
    assert_eq!(int(call(&mut cc, "LEASE.FENCE", ("{a}res", f))), f as i64);
    assert_eq!(
        call_error(
            &mut cc,
            "LEASE.FENCE",
            ("{a}res", f - 1, "SET", "{a}x", "0")
        ),
        stale(f - 1, f)
    );
    assert_eq!(text(call(&mut direct, "GET", "{a}x")), "2");

    // COMMAND GETKEYS reports the resource and every inner key, whatever their slots.
    let getkeys =
        |con: &mut Connection, args: &[&str]| strings(call(con, "COMMAND", ("GETKEYS", args)));
    assert_eq!(
        getkeys(
            &mut direct,
            &["LEASE.FENCE", "{a}res", "1", "SET", &other_b, "v"]
        ),
        vec!["{a}res".to_string(), other_b.clone()]
    );
    assert_eq!(
        getkeys(
            &mut direct,
            &[
                "LEASE.FENCE",
                "{a}res",
                "1",
                "MSET",
                "{a}x",
                "1",
                &other_c,
                "2"
            ]
        ),
        vec!["{a}res".to_string(), "{a}x".to_string(), other_c.clone()]
    );
    assert_eq!(
        getkeys(&mut direct, &["LEASE.FENCE", "{a}res", "1"]),
        vec!["{a}res"]
    );
    assert_eq!(
        getkeys(&mut direct, &["LEASE.ACQUIRE", "{a}lock", "1000"]),
        vec!["{a}lock"]
    );
    assert_eq!(
        getkeys(&mut direct, &["LEASE.RENEW", "{a}lock", "t", "1000"]),
        vec!["{a}lock"]
    );
    assert_eq!(
        getkeys(&mut direct, &["LEASE.RELEASE", "{a}lock", "t"]),
        vec!["{a}lock"]
    );
    assert_eq!(
        getkeys(&mut direct, &["LEASE.INFO", "{a}lock"]),
        vec!["{a}lock"]
    );

    // Every LEASE command sent to a node that does not serve its key is MOVED.
    let moved = moved_to("{a}lock", &cluster.nodes[owner]);
    let mut wrong = cluster.nodes[elsewhere].client();
    let sent: [(&str, Vec<String>); 5] = [
        ("LEASE.ACQUIRE", vec!["{a}lock".into(), "1000".into()]),
        (
            "LEASE.RENEW",
            vec!["{a}lock".into(), "holder".into(), "1000".into()],
        ),
        ("LEASE.RELEASE", vec!["{a}lock".into(), "holder".into()]),
        ("LEASE.INFO", vec!["{a}lock".into()]),
        (
            "LEASE.FENCE",
            vec![
                "{a}lock".into(),
                f.to_string(),
                "SET".into(),
                "{a}x".into(),
                "9".into(),
            ],
        ),
    ];
    for (name, args) in &sent {
        assert_eq!(call_error(&mut wrong, name, args), moved, "{name} {args:?}");
    }
    // The holder was not touched by any of them.
    held_with(&mut direct, "{a}lock", f);
    assert_eq!(text(call(&mut direct, "GET", "{a}x")), "2");
    assert_eq!(release(&mut cc, "{a}lock", "holder"), 1);
});

// ---------------------------------------------------------------------------
// 3. Slot migration

for_each_server!(
    slot_migration_keeps_leases_records_and_fence_order,
    |flavor| {
        let cluster = Cluster::start(flavor, 3, 0);
        let slot = key_slot(b"{m}");
        let from = cluster.owner(slot);
        let to = (from + 1) % 3;
        let (src, dst) = (&cluster.nodes[from], &cluster.nodes[to]);
        let mut s = src.client();
        let fa = take(&mut s, "{m}lease:a", LONG_TTL, "token-a");
        let fb = take(&mut s, "{m}lease:b", LONG_TTL, "token-b");
        // Short enough to expire on the destination within the test.
        let fs = take(&mut s, "{m}lease:short", 1_500, "token-s");
        let f_ahead = restore_fence_ahead(&mut s, "{m}lease:ahead", "{m}template", "token-ahead");
        assert_eq!(
            call(
                &mut s,
                "LEASE.FENCE",
                ("{m}res", fb, "SET", "{m}data", "v1")
            ),
            Value::Okay
        );
        let migrated = [fa, fb, fs, f_ahead];
        assert!(lease_stat(src, "fence_last") >= f_ahead);
        assert!(
            lease_stat(dst, "fence_last") < f_ahead,
            "the destination must not know the fence ahead before the migration"
        );
        let dst_leases_before = lease_stat(dst, "keys");

        let mut cc = cluster.client();
        let mut moved = cluster.migrate_slot(slot, to, |c, from, to| {
            // Keys gone, slot still MIGRATING: the source sends clients to the
            // destination with ASK, the destination serves them only after ASKING.
            let ask = format!("ASK {slot} {}", c.nodes[to].addr());
            let mut s = c.nodes[from].client();
            assert_eq!(call_error(&mut s, "LEASE.INFO", "{m}lease:a"), ask);
            assert_eq!(
                call_error(&mut s, "LEASE.ACQUIRE", ("{m}lease:new", 1000)),
                ask
            );
            let mut d = c.nodes[to].client();
            let moved_back = moved_to("{m}lease:a", &c.nodes[from]);
            assert_eq!(call_error(&mut d, "LEASE.INFO", "{m}lease:a"), moved_back);
            assert_eq!(call(&mut d, "ASKING", NONE), Value::Okay);
            held_with(&mut d, "{m}lease:a", fa);
        });
        moved.sort();
        assert_eq!(
            moved,
            [
                "{m}data",
                "{m}lease:a",
                "{m}lease:ahead",
                "{m}lease:b",
                "{m}lease:short",
                "{m}res"
            ]
        );
        assert_eq!(cluster.owner(slot), to);

        let mut d = dst.client();
        // Checked first: it expires 1.5 s after its grant.
        held_with(&mut d, "{m}lease:short", fs);
        assert_eq!(int(call(&mut s, "CLUSTER", ("COUNTKEYSINSLOT", slot))), 0);
        assert_eq!(int(call(&mut d, "CLUSTER", ("COUNTKEYSINSLOT", slot))), 6);
        assert_eq!(lease_stat(dst, "keys"), dst_leases_before + 4);
        assert_eq!(lease_stat(dst, "resource_keys"), 1);
        assert_eq!(text(call(&mut d, "TYPE", "{m}lease:a")), "lease-key");
        assert_eq!(text(call(&mut d, "TYPE", "{m}res")), "fence-rec");

        // The leases are still held, by the same tokens, with the same fences.
        for (key, token, fence) in [
            ("{m}lease:a", "token-a", fa),
            ("{m}lease:b", "token-b", fb),
            ("{m}lease:ahead", "token-ahead", f_ahead),
        ] {
            held_with(&mut d, key, fence);
            assert_not_holder(&mut d, key);
            assert_eq!(renew(&mut d, key, token, LONG_TTL), 1, "{key}");
            assert_eq!(acquire(&mut d, key, 1000, "other"), None, "{key}");
            assert_eq!(
                acquire(&mut d, key, LONG_TTL, token),
                Some(fence),
                "{key}: a retry"
            );
        }
        // The cluster client's slot map is stale: it follows MOVED.
        assert_eq!(renew(&mut cc, "{m}lease:b", "token-b", LONG_TTL), 1);
        held_with(&mut cc, "{m}lease:b", fb);

        // The record keeps its highest fence.
        assert_eq!(
            call_error(
                &mut d,
                "LEASE.FENCE",
                ("{m}res", fb - 1, "SET", "{m}data", "stale")
            ),
            stale(fb - 1, fb)
        );
        assert_eq!(
            call(&mut cc, "LEASE.FENCE", ("{m}res", fb, "GET", "{m}data")),
            Value::BulkString(b"v1".to_vec())
        );

        // The destination's sequence rose to the restored fences: its next grants, for a
        // migrated key after release and for any other key, are above all of them.
        let top = *migrated.iter().max().unwrap_or(&0);
        assert!(
            lease_stat(dst, "fence_last") >= top,
            "lease_fence_last below a restored fence"
        );
        assert_eq!(release(&mut d, "{m}lease:a", "token-a"), 1);
        let next = take(&mut d, "{m}lease:a", LONG_TTL, "token-a2");
        assert!(next > top, "{next} after migrated fences {migrated:?}");
        let other_key = format!("{}k", cluster.tag_on(to, &[slot]));
        let fresh = take(&mut d, &other_key, LONG_TTL, "t");
        assert!(fresh > next, "{fresh} after {next}");
        assert_eq!(
            call(
                &mut cc,
                "LEASE.FENCE",
                ("{m}res", next, "SET", "{m}data", "v2")
            ),
            Value::Okay
        );
        assert_eq!(
            call_error(
                &mut cc,
                "LEASE.FENCE",
                ("{m}res", fb, "SET", "{m}data", "v0")
            ),
            stale(fb, next)
        );

        // The destination reaps the migrated short lease; the source has nothing to reap.
        wait_until(
            "the destination to reap {m}lease:short",
            Duration::from_secs(5),
            || !exists(&mut d, "{m}lease:short"),
        );
        assert_eq!(lease_stat(dst, "expired"), 1);
        assert_eq!(lease_stat(src, "expired"), 0);
        assert_eq!(lease_stat(src, "keys"), 0);
    }
);

// ---------------------------------------------------------------------------
// 4. Manual failover

/// Leases granted on one shard, to check after it fails over.
struct Granted {
    key: String,
    token: String,
    fence: u64,
}

fn grant_on(con: &mut Connection, tag: &str, round: &str, n: usize) -> Vec<Granted> {
    (0..n)
        .map(|i| {
            let key = format!("{tag}lease:{round}:{i}");
            let token = format!("token-{round}-{i}");
            let fence = take(con, &key, LONG_TTL, &token);
            Granted { key, token, fence }
        })
        .collect()
}

/// After `new` took over from `old`: `new` is the primary for the module too, holds
/// every lease with its fence, lets the holders renew, and issues fences above every
/// fence `old` issued (`old_last`). Returns the new master's first fence.
/// `res_top` is the highest fence the resource record `<tag>res` accepted.
fn check_promoted(
    cluster: &Cluster,
    (new, old): (usize, usize),
    leases: &[Granted],
    old_last: u64,
    (tag, res_top): (&str, u64),
) -> u64 {
    let promoted = &cluster.nodes[new];
    assert_eq!(
        lease_stat(promoted, "role_primary"),
        1,
        "node {new} after promotion"
    );
    if cluster.nodes[old].is_running() {
        let demoted = &cluster.nodes[old];
        wait_until(
            "the old master to see itself as a replica",
            Duration::from_secs(5),
            || demoted.info_field("replication", "role").as_deref() == Some("slave"),
        );
        assert_eq!(
            lease_stat(demoted, "role_primary"),
            0,
            "node {old} after demotion"
        );
    }
    assert!(
        lease_stat(promoted, "fence_last") >= old_last,
        "the promoted node's sequence is below its old master's"
    );
    let mut con = promoted.client();
    for g in leases {
        held_with(&mut con, &g.key, g.fence);
        assert_not_holder(&mut con, &g.key);
        assert_eq!(renew(&mut con, &g.key, &g.token, LONG_TTL), 1, "{}", g.key);
    }
    let first = take(
        &mut con,
        &format!("{tag}after-{}", leases.len()),
        LONG_TTL,
        "t",
    );
    assert!(first > old_last, "first fence {first} after {old_last}");
    let top = leases.iter().map(|g| g.fence).max().unwrap_or(0);
    assert!(first > top);
    assert_eq!(
        call_error(&mut con, "LEASE.FENCE", (format!("{tag}res"), res_top - 1)),
        stale(res_top - 1, res_top),
        "the record came through the failover"
    );
    first
}

for_each_server!(
    manual_failover_default_force_takeover_keep_leases_and_fences,
    |flavor| {
        let cluster = Cluster::start(flavor, 3, 1);
        let m = 0;
        let r = cluster.replica_of(m);
        let tag = cluster.tag_on(m, &[]);
        let res = format!("{tag}res");
        let short = format!("{tag}short");
        let mut leases = Vec::new();

        // Round 1: CLUSTER FAILOVER (coordinated) on the replica.
        let mut con = cluster.nodes[m].client();
        leases.extend(grant_on(&mut con, &tag, "1", 5));
        let top = leases.iter().map(|g| g.fence).max().unwrap_or(0);
        assert_eq!(
            int(call(&mut con, "LEASE.FENCE", (res.as_str(), top))),
            top as i64
        );
        // It must outlive the failover (0.5 to 2 s here) and expire soon after, on the
        // new master.
        let fs = take(&mut con, &short, 5_000, "token-s");
        let old_last = lease_stat(&cluster.nodes[m], "fence_last");
        cluster.nodes[r].wait_for_sync(&cluster.nodes[m]);
        cluster.failover(r, None);
        assert!(cluster.is_master(r) && cluster.master_of(m) == Some(r));
        held_with(&mut cluster.nodes[r].client(), &short, fs);
        let first = check_promoted(&cluster, (r, m), &leases, old_last, (&tag, top));
        assert!(first > fs);
        let mut con = cluster.nodes[r].client();
        wait_until(
            "the new master to reap the short lease",
            Duration::from_secs(10),
            || !exists(&mut con, &short),
        );
        assert_eq!(lease_stat(&cluster.nodes[r], "expired"), 1);
        assert_eq!(
            lease_stat(&cluster.nodes[m], "expired"),
            0,
            "the old master reaped it"
        );
        cluster.nodes[m].wait_for_sync(&cluster.nodes[r]);
        let mut demoted = cluster.nodes[m].client();
        assert_eq!(call(&mut demoted, "READONLY", NONE), Value::Okay);
        assert!(!exists(&mut demoted, &short), "the reaper's DEL replicated");

        // Round 2: CLUSTER FAILOVER FORCE on the old master, now a replica.
        leases.extend(grant_on(&mut con, &tag, "2", 5));
        let old_last = lease_stat(&cluster.nodes[r], "fence_last");
        cluster.nodes[m].wait_for_sync(&cluster.nodes[r]);
        cluster.failover(m, Some("FORCE"));
        assert!(cluster.is_master(m) && cluster.master_of(r) == Some(m));
        check_promoted(&cluster, (m, r), &leases, old_last, (&tag, top));

        // Round 3: CLUSTER FAILOVER TAKEOVER (no vote) back to the other node.
        let mut con = cluster.nodes[m].client();
        leases.extend(grant_on(&mut con, &tag, "3", 5));
        let old_last = lease_stat(&cluster.nodes[m], "fence_last");
        cluster.nodes[r].wait_for_sync(&cluster.nodes[m]);
        cluster.failover(r, Some("TAKEOVER"));
        assert!(cluster.is_master(r) && cluster.master_of(m) == Some(r));
        check_promoted(&cluster, (r, m), &leases, old_last, (&tag, top));

        // Fences issued for one key kept rising through all three promotions.
        let mut con = cluster.nodes[r].client();
        let g = &leases[0];
        assert_eq!(release(&mut con, &g.key, &g.token), 1);
        let again = take(&mut con, &g.key, LONG_TTL, "token-again");
        assert!(again > fs && leases.iter().all(|g| again > g.fence));
    }
);

// ---------------------------------------------------------------------------
// 5. A master killed right after granting

/// What became of the grants a killed master made, on the replica promoted in its
/// place: `(kept, lost)`. A kept lease is held with its fence and its holder renews;
/// a lost one is missing, and granting it again gives a fence above the lost one.
fn survivors(promoted: &Server, grants: &[Granted]) -> (usize, usize) {
    let mut con = promoted.client();
    let (mut kept, mut lost) = (0, 0);
    let mut margin = u64::MAX;
    for g in grants {
        match lease_info(&mut con, &g.key) {
            Some(info) => {
                assert_eq!(info.state, "held", "{}: {info:?}", g.key);
                assert_eq!(info.fence, g.fence, "{}: {info:?}", g.key);
                assert_not_holder(&mut con, &g.key);
                assert_eq!(renew(&mut con, &g.key, &g.token, LONG_TTL), 1, "{}", g.key);
                kept += 1;
            }
            None => {
                // The lost grant's holder still believes it holds the lease: the new
                // holder's fence must be above the one it was given.
                let fence = take(&mut con, &g.key, LONG_TTL, "token-after-kill");
                assert!(
                    fence > g.fence,
                    "{}: granted again with fence {fence}, not above the lost {}",
                    g.key,
                    g.fence
                );
                margin = margin.min(fence - g.fence);
                lost += 1;
            }
        }
    }
    if lost > 0 {
        eprintln!(
            "{lost} lost grants granted again; smallest fence margin {margin} (~{} ms of clock)",
            margin / 1024
        );
    }
    (kept, lost)
}

fn wait_one(con: &mut Connection, timeout_ms: u64) -> i64 {
    int(call(con, "WAIT", (1, timeout_ms)))
}

for_each_server!(
    killed_master_loses_only_unreplicated_grants_fences_stay_ordered,
    |flavor| {
        let mut cluster = Cluster::start(flavor, 3, 1);

        // Shard 0: grants confirmed by WAIT, then grants made while the replica's link is
        // down (cut on the replica side; a wrong masterauth keeps it from coming back):
        // those cannot have reached the replica.
        let (m0, r0) = (0, cluster.replica_of(0));
        let tag0 = cluster.tag_on(m0, &[]);
        let mut con = cluster.nodes[m0].client();
        let mut waited = Vec::new();
        for i in 0..10 {
            let g = grant_on(&mut con, &tag0, &format!("w{i}"), 1);
            assert_eq!(wait_one(&mut con, 1000), 1, "WAIT after a grant");
            waited.extend(g);
        }
        let mut rcon = cluster.nodes[r0].client();
        assert_eq!(
            call(
                &mut rcon,
                "CONFIG",
                ("SET", "masterauth", "not-the-password")
            ),
            Value::Okay
        );
        assert!(int(call(&mut rcon, "CLIENT", ("KILL", "TYPE", "master"))) >= 1);
        wait_until(
            "the replica's master link to go down",
            Duration::from_secs(5),
            || {
                cluster.nodes[r0]
                    .info_field("replication", "master_link_status")
                    .as_deref()
                    == Some("down")
            },
        );
        let cut = grant_on(&mut con, &tag0, "cut", 50);
        assert_eq!(
            wait_one(&mut con, 100),
            0,
            "no replica acknowledges the grants"
        );
        let dead_last0 = lease_stat(&cluster.nodes[m0], "fence_last");

        // Shard 1: grants, then the kill at once, replication link up: a race.
        let (m1, r1) = (1, cluster.replica_of(1));
        let tag1 = cluster.tag_on(m1, &[]);
        let mut con1 = cluster.nodes[m1].client();
        let mut waited1 = Vec::new();
        for i in 0..10 {
            let g = grant_on(&mut con1, &tag1, &format!("w{i}"), 1);
            assert_eq!(wait_one(&mut con1, 1000), 1, "WAIT after a grant");
            waited1.extend(g);
        }
        let raced = grant_on(&mut con1, &tag1, "race", 200);
        let kill_time = now_ms();
        let dead_last1 = lease_stat(&cluster.nodes[m1], "fence_last");
        cluster.nodes[m1].kill9();
        cluster.nodes[m0].kill9();

        // Both at once: a shard whose master is flagged as failed makes the whole cluster
        // say cluster_state:fail, which a one-at-a-time wait would never see end.
        assert_eq!(
            call(&mut rcon, "CONFIG", ("SET", "masterauth", "")),
            Value::Okay
        );
        let old1 = cluster.begin_failover(r1, Some("TAKEOVER"));
        let old0 = cluster.begin_failover(r0, Some("TAKEOVER"));
        cluster.finish_failover(r1, old1);
        cluster.finish_failover(r0, old0);
        let (p0, p1) = (&cluster.nodes[r0], &cluster.nodes[r1]);
        assert_eq!(lease_stat(p0, "role_primary"), 1);
        assert_eq!(lease_stat(p1, "role_primary"), 1);

        // The replica never saw the cut grants: it knows no fence as high as theirs. Only
        // the clock floor (fence >= unix_ms * 1024) keeps its next fences above them.
        let cut_top = cut.iter().map(|g| g.fence).max().unwrap_or(0);
        assert!(
            lease_stat(p0, "fence_last") < cut_top,
            "a cut grant reached the replica"
        );
        assert!(now_ms() > kill_time, "the clock moved on");
        assert_eq!(
            survivors(p0, &waited),
            (waited.len(), 0),
            "grants confirmed by WAIT"
        );
        assert_eq!(
            survivors(p0, &cut),
            (0, cut.len()),
            "grants after the link was cut"
        );
        let next0 = take(&mut p0.client(), &format!("{tag0}next"), LONG_TTL, "t");
        assert!(
            next0 > dead_last0,
            "{next0} after the dead master's {dead_last0}"
        );

        assert_eq!(
            survivors(p1, &waited1),
            (waited1.len(), 0),
            "grants confirmed by WAIT"
        );
        let (kept, lost) = survivors(p1, &raced);
        let what = format!(
            "{flavor}: {} grants without WAIT, then kill -9",
            raced.len()
        );
        eprintln!("{what}: {kept} reached the replica, {lost} were lost");
        let next1 = take(&mut p1.client(), &format!("{tag1}next"), LONG_TTL, "t");
        assert!(
            next1 > dead_last1,
            "{next1} after the dead master's {dead_last1}"
        );

        // The cluster serves all slots again, through a new client.
        let mut cc = cluster.client();
        for g in &waited {
            assert_eq!(renew(&mut cc, &g.key, &g.token, LONG_TTL), 1, "{}", g.key);
        }
    }
);

// ---------------------------------------------------------------------------
// 6. Replicas

for_each_server!(
    replica_serves_lease_info_after_readonly_and_redirects_writes,
    |flavor| {
        let cluster = Cluster::start(flavor, 3, 1);
        let m = 0;
        let r = cluster.replica_of(m);
        let key = format!("{}lock", cluster.tag_on(m, &[]));
        let elsewhere = format!("{}lock", cluster.tag_on(1, &[]));
        let mut cc = cluster.client();
        let f = take(&mut cc, &key, LONG_TTL, "holder");
        take(&mut cc, &elsewhere, LONG_TTL, "holder");
        cluster.nodes[r].wait_for_sync(&cluster.nodes[m]);

        let master = &cluster.nodes[m];
        let moved = moved_to(&key, master);
        let mut rcon = cluster.nodes[r].client();
        assert_eq!(
            call_error(&mut rcon, "LEASE.INFO", key.as_str()),
            moved,
            "before READONLY"
        );
        assert_eq!(call(&mut rcon, "READONLY", NONE), Value::Okay);
        held_with(&mut rcon, &key, f);
        assert_eq!(lease_info(&mut rcon, &key).map(|i| i.waiters), Some(0));
        assert_eq!(
            lease_info(&mut rcon, &format!("{}none", cluster.tag_on(m, &[]))),
            None
        );
        // Another shard's key is not this replica's to serve.
        assert_eq!(
            call_error(&mut rcon, "LEASE.INFO", elsewhere.as_str()),
            moved_to(&elsewhere, &cluster.nodes[cluster.owner_of_key(&elsewhere)])
        );
        let writes: [(&str, Vec<String>); 5] = [
            ("LEASE.ACQUIRE", vec![key.clone(), "1000".into()]),
            (
                "LEASE.ACQUIRE",
                vec![key.clone(), "1000".into(), "TOKEN".into(), "holder".into()],
            ),
            (
                "LEASE.RENEW",
                vec![key.clone(), "holder".into(), "1000".into()],
            ),
            ("LEASE.RELEASE", vec![key.clone(), "holder".into()]),
            ("LEASE.FENCE", vec![key.clone(), f.to_string()]),
        ];
        for (name, args) in &writes {
            assert_eq!(
                call_error(&mut rcon, name, args),
                moved,
                "{name} {args:?} on a replica"
            );
        }
        // Back to the master by the cluster client; the replica follows.
        assert_eq!(renew(&mut cc, &key, "holder", LONG_TTL), 1);
        assert_eq!(release(&mut cc, &key, "holder"), 1);
        cluster.nodes[r].wait_for_sync(master);
        assert_eq!(lease_info(&mut rcon, &key), None);
        assert_eq!(call(&mut rcon, "READWRITE", NONE), Value::Okay);
        assert_eq!(
            call_error(&mut rcon, "LEASE.INFO", key.as_str()),
            moved,
            "after READWRITE"
        );
    }
);

// ---------------------------------------------------------------------------
// 7. WAIT and WAITAOF

fn has_waitaof(flavor: Flavor) -> bool {
    // WAITAOF came with Redis 7.2; Valkey forked from 7.2.
    !matches!(flavor, Flavor::Redis7)
}

for_each_server!(wait_and_waitaof_see_lease_commands_replicate, |flavor| {
    let cluster = Cluster::start_with(
        flavor,
        ClusterOptions::new(3, 1)
            .config("appendonly", "yes")
            .config("appendfsync", "always"),
    );
    let m = 0;
    let r = cluster.replica_of(m);
    let tag = cluster.tag_on(m, &[]);
    let (lock, res) = (format!("{tag}lock"), format!("{tag}res"));
    let (master, replica) = (&cluster.nodes[m], &cluster.nodes[r]);
    let mut con = master.client();

    let data = format!("{tag}data");
    let mut f = 0;
    let steps = [
        "LEASE.ACQUIRE",
        "LEASE.RENEW",
        "LEASE.FENCE",
        "LEASE.FENCE + SET",
        "LEASE.RELEASE",
    ];
    for name in steps {
        let before = repl_offset(master);
        match name {
            "LEASE.ACQUIRE" => f = take(&mut con, &lock, LONG_TTL, "holder"),
            "LEASE.RENEW" => assert_eq!(renew(&mut con, &lock, "holder", LONG_TTL), 1),
            "LEASE.FENCE" => {
                assert_eq!(int(call(&mut con, name, (res.as_str(), f))), f as i64)
            }
            "LEASE.FENCE + SET" => {
                let args = (res.as_str(), f, "SET", data.as_str(), "v");
                assert_eq!(call(&mut con, "LEASE.FENCE", args), Value::Okay)
            }
            _ => assert_eq!(release(&mut con, &lock, "holder"), 1),
        }
        let after = repl_offset(master);
        assert!(
            after > before,
            "{name} did not advance master_repl_offset ({before})"
        );
        assert_eq!(wait_one(&mut con, 1000), 1, "WAIT 1 1000 after {name}");
        let acked = replica
            .info_field("replication", "slave_repl_offset")
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("the replica has no slave_repl_offset"));
        assert!(
            acked >= after,
            "{name}: the replica is at {acked}, the master at {after}"
        );
        if has_waitaof(flavor) {
            let reply = call(&mut con, "WAITAOF", (1, 1, 1000));
            assert_eq!(
                reply,
                Value::Array(vec![Value::Int(1), Value::Int(1)]),
                "WAITAOF after {name}"
            );
        } else {
            // Redis 7.0 has no WAITAOF: only WAIT can confirm a grant reached a replica.
            let e = call_error(&mut con, "WAITAOF", (1, 1, 1000));
            assert!(e.starts_with("ERR unknown command"), "{e}");
        }
    }
    let mut rcon = replica.client();
    assert_eq!(call(&mut rcon, "READONLY", NONE), Value::Okay);
    assert_eq!(lease_info(&mut rcon, &lock), None);
    assert_eq!(text(call(&mut rcon, "GET", format!("{tag}data"))), "v");
    assert_eq!(text(call(&mut rcon, "TYPE", res.as_str())), "fence-rec");
});
