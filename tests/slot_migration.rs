//! Valkey 9's atomic slot migration (`CLUSTER MIGRATESLOTS`) with the module loaded:
//! the module opts in, leases move with token, fence and deadline, records with their
//! highest fence, the destination's next grants are above every migrated fence and it
//! reaps what expires there, a waiter on the source is redirected (never granted on
//! the node its key left), and the destination's replica agrees. Valkey 9 only: the
//! other servers of the matrix have no atomic slot migration.

use std::thread;
use std::time::Duration;

use harness::calls::{call, int, renew, stale, take, text};
use harness::cluster::{key_slot, migrate_slot_atomically, Cluster};
use harness::lease::{lease_info, lease_stat};
use harness::reply::expect_error;
use harness::{wait_until, Flavor, Server};
use redis::Value;

const MINUTE: u64 = 60_000;
const WAIT: Duration = Duration::from_secs(20);

mod atomic_slot_migration_carries_leases_and_records {
    use super::*;

    /// Named for its server, as every per-server test is.
    #[test]
    fn valkey9() {
        run();
    }
}

fn run() {
    let cluster = Cluster::start(Flavor::Valkey9, 2, 1);
    let (from, to) = (0, 1);
    let tag = cluster.tag_on(from, &[]);
    let slot = key_slot(tag.as_bytes());
    let key = |name: &str| format!("{tag}{name}");
    let source = &cluster.nodes[from];
    let target = &cluster.nodes[to];
    let mut con = source.client();

    let held = take(&mut con, &key("held"), MINUTE, "h");
    let short = take(&mut con, &key("short"), 1_500, "s");
    let busy = take(&mut con, &key("busy"), MINUTE, "b");
    let highest = int(call(&mut con, "LEASE.FENCE", (key("res"), busy))) as u64;
    assert_eq!(highest, busy);
    // A client waits on the source for a lease that leaves with the slot.
    let mut waiter_con = source.client();
    let busy_key = key("busy");
    let waiter = thread::spawn(move || {
        call(
            &mut waiter_con,
            "LEASE.ACQUIRE",
            (&busy_key, MINUTE, "TOKEN", "w", "BLOCK", 0),
        )
    });
    wait_until("the waiter to block", WAIT, || {
        lease_stat(source, "waiters") == 1
    });

    migrate_slot_atomically(&cluster, slot, to);

    // The destination has every lease and the record, as they were.
    let mut tcon = target.client();
    let info = lease_info(&mut tcon, &key("held")).expect("held on the destination");
    assert_eq!((info.state.as_str(), info.fence), ("held", held));
    assert_eq!(renew(&mut tcon, &key("held"), "h", MINUTE), 1);
    assert_eq!(renew(&mut tcon, &key("held"), "x", MINUTE), 0);
    let reply = call(&mut tcon, "LEASE.FENCE", (key("res"), highest - 1));
    assert_eq!(
        expect_error(&reply, "a stale fence"),
        stale(highest - 1, highest)
    );
    // Its next grants are above every migrated fence.
    assert!(lease_stat(target, "fence_last") >= busy);
    assert_eq!(
        call(&mut tcon, "LEASE.RELEASE", (key("held"), "h")),
        Value::Int(1)
    );
    let next = take(&mut tcon, &key("held"), MINUTE, "n");
    assert!(next > busy, "{next} after {busy}");
    // It reaps what expires there.
    wait_until(
        "the short lease to be reaped on the destination",
        WAIT,
        || lease_info(&mut tcon, &key("short")).is_none(),
    );
    assert!(lease_stat(target, "expired") >= 1, "short was {short}");

    // The source kept nothing of the slot, and its waiter was sent on, not granted.
    let count = call(&mut con, "CLUSTER", ("COUNTKEYSINSLOT", slot));
    assert_eq!(count, Value::Int(0));
    wait_until("the waiter to be answered", WAIT, || waiter.is_finished());
    let reply = waiter.join().expect("the waiter's thread");
    let error = expect_error(&reply, "the waiter on the source");
    assert!(error.starts_with("MOVED"), "{error}");
    assert_eq!(lease_stat(source, "keys"), 0);

    // The destination's replica holds the same.
    let replica = &cluster.nodes[cluster.replica_of(to)];
    replica.wait_for_sync(target);
    let digest = |n: &Server| text(call(&mut n.client(), "DEBUG", "DIGEST"));
    assert_eq!(digest(replica), digest(target));
}

#[test]
fn atomic_slot_migration_is_offered_only_by_valkey_9() {
    // The option is Valkey 9's; on the other servers the module does not claim it.
    for flavor in [
        Flavor::Valkey9,
        Flavor::Valkey8,
        Flavor::Redis8,
        Flavor::Redis7,
    ] {
        let server = Server::start(flavor);
        let info = text(call(&mut server.client(), "INFO", "modules"));
        let claims = info.contains("handle-atomic-slot-migration");
        assert_eq!(claims, flavor == Flavor::Valkey9, "{flavor}: {info}");
    }
}
