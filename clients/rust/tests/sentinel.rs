//! Sentinel as a topology: a primary and a replica with the module, three Sentinels
//! (quorum 2, down after 1 s), started for each test. The watchdog renews on the master
//! the Sentinels name, follows a failover to the new one, and signals the loss when the
//! lease did not survive it.

mod common;

use std::time::{Duration, Instant};

use common::{command_calls, eventually, key, lease_fence, lease_state, SentinelSet, MASTER_NAME};
use redis_lease_client::{Error, Leases, SentinelConnection, State};

/// Outlives the gap a `SENTINEL FAILOVER` leaves between the last renewal the replica
/// received and the first the new primary can get (about a second).
const SURVIVING_TTL: Duration = Duration::from_secs(5);
/// Shorter than down-after-milliseconds (1 s): with the primary killed, no server can
/// renew it before its deadline, whatever the timing.
const DOOMED_TTL: Duration = Duration::from_millis(600);

async fn renews_on(set: &SentinelSet, port: u16) -> u64 {
    command_calls(&mut set.node(port).admin().await, "lease.renew").await
}

/// `WAIT 1 1000` on the user's connection: whether the replica has every write so far.
async fn replicas_acked(conn: &mut SentinelConnection) -> i64 {
    redis::cmd("WAIT")
        .arg(1)
        .arg(1000)
        .query_async(conn)
        .await
        .unwrap()
}

async fn reset_stats(set: &SentinelSet, port: u16) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut set.node(port).admin().await)
        .await
        .unwrap();
}

for_each_server!(renewed_through_sentinel_and_across_a_failover, |flavor| {
    let _serial = common::one_sentinel_set_at_a_time().await;
    let set = SentinelSet::start(flavor).await;
    let conn = SentinelConnection::connect(set.addresses(), MASTER_NAME)
        .await
        .unwrap();
    let leases = Leases::connect_sentinel(conn.clone());
    let old = set.primary_port().await.unwrap();
    assert_eq!(conn.master(), Some(("127.0.0.1".to_string(), old)));

    // Renewed every ttl/3 on the primary the Sentinels name.
    let ttl = Duration::from_millis(300);
    reset_stats(&set, old).await;
    let short = leases.acquire(key(flavor, "short"), ttl).await.unwrap();
    tokio::time::sleep(ttl * 7 / 2).await;
    assert_eq!(short.state(), State::Held);
    assert!(short.renewals() >= 6, "{} renewals", short.renewals());
    assert!(renews_on(&set, old).await >= 6);
    short.release().await.unwrap();

    let k = key(flavor, "failover");
    let lease = leases.acquire(&k, SURVIVING_TTL).await.unwrap();
    // The user's own commands go through the same connection. (Not a confirmed lease:
    // right after the failover the new primary has no replica to confirm renewals.)
    let mut mine = conn.clone();
    assert_eq!(
        replicas_acked(&mut mine).await,
        1,
        "the replica has the grant"
    );
    let new = set.failover().await;
    let failed_over_at = Instant::now();
    assert_ne!(new, old);
    reset_stats(&set, new).await;
    // The watchdog renews on the new primary within a few renewal intervals of the
    // Sentinels naming it: well within the ttl, which a watchdog stuck on the old
    // primary (still accepting writes until Sentinel reconfigures it) would let pass.
    eventually(SURVIVING_TTL, "two renewals on the new primary", || async {
        renews_on(&set, new).await >= 2
    })
    .await;
    assert!(failed_over_at.elapsed() < SURVIVING_TTL);
    assert_eq!(lease.state(), State::Held);
    let mut on_new = set.node(new).admin().await;
    assert_eq!(lease_state(&mut on_new, &k).await, "held");
    assert_eq!(lease_fence(&mut on_new, &k).await, lease.fence());
    assert_eq!(conn.master(), Some(("127.0.0.1".to_string(), new)));
    // The user's commands follow as well.
    let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(&mut mine).await.unwrap();
    assert_eq!(
        role.first(),
        Some(&redis::Value::BulkString(b"master".to_vec()))
    );
    lease.release().await.unwrap();
    leases.close().await;
});

for_each_server!(
    lost_when_the_primary_dies_before_a_replica_can_take_over,
    |flavor| {
        let _serial = common::one_sentinel_set_at_a_time().await;
        let mut set = SentinelSet::start(flavor).await;
        let conn = SentinelConnection::connect(set.addresses(), MASTER_NAME)
            .await
            .unwrap();
        let leases = Leases::connect_sentinel(conn.clone());
        let k = key(flavor, "doomed");
        let lease = leases.acquire(&k, DOOMED_TTL).await.unwrap();
        let mut mine = conn.clone();
        assert_eq!(replicas_acked(&mut mine).await, 1);
        eventually(
            Duration::from_secs(2),
            "renewals through Sentinel",
            || async { lease.renewals() >= 2 },
        )
        .await;
        let old = set.primary_port().await.unwrap();
        set.node_mut(old).kill();
        let left = lease.remaining().unwrap();
        let killed_at = Instant::now();
        tokio::time::timeout(Duration::from_secs(3), lease.lost())
            .await
            .expect("lost at its deadline");
        // At the deadline (a margin for a loaded machine), not later.
        assert!(killed_at.elapsed() <= left + Duration::from_millis(300));
        assert_eq!(lease.state(), State::Lost);
        let new = set.wait_new_primary(old).await;
        // The new primary had the lease (replicated); its deadline passed there too.
        let mut on_new = set.node(new).admin().await;
        let state = lease_state(&mut on_new, &k).await;
        assert!(state == "free" || state == "none", "{state}");
        // The same client, through the Sentinels, now reaches the new primary.
        let start = Instant::now();
        let successor = loop {
            match leases.acquire(&k, DOOMED_TTL).await {
                Ok(lease) => break lease,
                Err(Error::Redis(e)) if start.elapsed() < Duration::from_secs(10) => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("no acquire on the new primary: {e}"),
            }
        };
        assert!(successor.fence() > lease.fence());
        eventually(
            Duration::from_secs(2),
            "renewals on the new primary",
            || async { successor.renewals() >= 1 },
        )
        .await;
        successor.release().await.unwrap();
        leases.close().await;
    }
);
