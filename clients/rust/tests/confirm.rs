//! Confirmed grants: `WAIT` (or `WAITAOF`) in the same pipeline as the `LEASE.ACQUIRE`
//! and every renewal. A grant not confirmed is refused and released; a renewal not
//! confirmed is a loss. On a primary with one replica.

mod common;

use std::time::Duration;

use common::{eventually, key, lease_state, start_replica, Server};
use redis_lease_client::{Confirm, Error, Leases, State};

/// A primary, its replica, and leases on the primary confirming with `WAIT 1 wait`.
async fn replicated(flavor: common::Flavor, wait: Duration) -> (Server, Server, Leases) {
    let primary = Server::start(flavor);
    let replica = start_replica(flavor, &primary).await;
    let leases = Leases::connect(primary.client())
        .await
        .unwrap()
        .confirm(Confirm::replicas(1, wait));
    (primary, replica, leases)
}

async fn free_on(server: &Server, k: &str) -> bool {
    let state = lease_state(&mut server.admin().await, k).await;
    state == "free" || state == "none"
}

for_each_server!(grant_and_renewals_confirmed_by_the_replica, |flavor| {
    let (_primary, replica, leases) = replicated(flavor, Duration::from_millis(200)).await;
    let ttl = Duration::from_millis(900);
    let k = key(flavor, "confirmed");
    let lease = leases.acquire(&k, ttl).await.unwrap();
    assert_eq!(lease.confirmed().map(|c| c.replicas), Some(1));
    // Confirmed: the replica has it already, no waiting.
    assert_eq!(lease_state(&mut replica.admin().await, &k).await, "held");
    eventually(ttl * 3, "three confirmed renewals", || async {
        lease.renewals() >= 3
    })
    .await;
    assert_eq!(lease.state(), State::Held);
    assert_eq!(lease.confirmed().map(|c| c.replicas), Some(1));
    lease.renew().await.unwrap();
    assert_eq!(lease.confirmed().map(|c| c.replicas), Some(1));
    lease.release().await.unwrap();
    leases.close().await;
});

for_each_server!(unconfirmed_renewal_is_a_loss, |flavor| {
    let (primary, replica, leases) = replicated(flavor, Duration::from_millis(100)).await;
    let ttl = Duration::from_millis(900);
    let k = key(flavor, "unconfirmed-renewal");
    let lease = leases.acquire(&k, ttl).await.unwrap();
    replica.freeze();
    // The next renewal is answered 1 by the primary, but no replica acknowledges it.
    tokio::time::timeout(ttl, lease.lost())
        .await
        .expect("lost at the first unconfirmed renewal, before the deadline");
    assert_eq!(lease.state(), State::Lost);
    // And released on the primary, which still held it.
    eventually(Duration::from_secs(2), "released on the primary", || {
        free_on(&primary, &k)
    })
    .await;
    replica.thaw();
    leases.close().await;
});

for_each_server!(unconfirmed_grant_is_refused_and_released, |flavor| {
    let primary = Server::start(flavor);
    let replica = start_replica(flavor, &primary).await;
    // No confirmation for the client; per acquire.
    let leases = Leases::connect(primary.client()).await.unwrap();
    let ttl = Duration::from_secs(5);
    let k = key(flavor, "unconfirmed-grant");
    // Two replicas asked for, one there.
    let two = Confirm::replicas(2, Duration::from_millis(100));
    match leases.acquire(&k, ttl).confirm(two).await {
        Err(Error::NotConfirmed { confirmed, .. }) => assert_eq!(confirmed.replicas, 1),
        other => panic!("expected NotConfirmed, got {other:?}"),
    }
    eventually(Duration::from_secs(2), "released", || free_on(&primary, &k)).await;
    replica.freeze();
    let one = Confirm::replicas(1, Duration::from_millis(100));
    match leases.acquire(&k, ttl).confirm(one).await {
        Err(Error::NotConfirmed { confirmed, .. }) => assert_eq!(confirmed.replicas, 0),
        other => panic!("expected NotConfirmed, got {other:?}"),
    }
    eventually(Duration::from_secs(2), "released", || free_on(&primary, &k)).await;
    // Without confirmation the same acquire is granted (the replica is not needed).
    let lease = leases.acquire(&k, ttl).await.unwrap();
    assert_eq!(lease.confirmed(), None);
    lease.release().await.unwrap();
    replica.thaw();
    leases.close().await;
});

for_each_server!(
    local_fsync_confirmed_where_the_server_has_waitaof,
    |flavor| {
        let primary =
            Server::start_with(flavor, &[("appendonly", "yes"), ("appendfsync", "always")]);
        let mut admin = primary.admin().await;
        let info: Vec<redis::Value> = redis::cmd("COMMAND")
            .arg("INFO")
            .arg("WAITAOF")
            .query_async(&mut admin)
            .await
            .unwrap();
        let has_waitaof = !matches!(info.first(), None | Some(redis::Value::Nil));
        let leases = Leases::connect(primary.client()).await.unwrap();
        let k = key(flavor, "waitaof");
        let fsynced = Confirm::aof(true, 0, Duration::from_millis(500));
        let ttl = Duration::from_millis(900);
        let acquired = leases.acquire(&k, ttl).confirm(fsynced).await;
        if has_waitaof {
            let lease = acquired.unwrap();
            let confirmed = lease.confirmed().unwrap();
            assert_eq!((confirmed.local, confirmed.replicas), (Some(1), 0));
            eventually(ttl * 2, "two confirmed renewals", || async {
                lease.renewals() >= 2
            })
            .await;
            assert_eq!(lease.state(), State::Held);
            lease.release().await.unwrap();
        } else {
            // Redis 7.0: no WAITAOF. The server's error, and the grant released.
            assert!(matches!(acquired, Err(Error::Redis(_))), "{acquired:?}");
            eventually(Duration::from_secs(2), "released", || free_on(&primary, &k)).await;
        }
        leases.close().await;
    }
);
