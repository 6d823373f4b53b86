//! The cluster client: three masters, keys on every one, hash tags for what belongs
//! together (a session and its holds, a resource and the keys its write touches).

mod common;

use std::collections::HashSet;
use std::future::IntoFuture;
use std::time::Duration;

use common::{
    command_calls, fenced_write_across_a_restart, held_again_and_renewed, key, lease_state, slot,
    Cluster,
};
use futures_util::future::join_all;
use redis::cluster::ClusterClientBuilder;
use redis_lease_client::{Error, Leases, State};

for_each_server!(cluster_with_hash_tags, |flavor| {
    let cluster = Cluster::start(flavor).await;
    let leases = Leases::connect_cluster(cluster.client()).await.unwrap();
    let ttl = Duration::from_millis(600);
    let keys: Vec<String> = (0..30)
        .map(|i| format!("{{job{i}}}{}", key(flavor, "lock")))
        .collect();
    let nodes: HashSet<u16> = keys.iter().map(|k| cluster.node_for(k).port).collect();
    assert_eq!(nodes.len(), 3, "keys on every master");
    let held: Vec<_> = join_all(keys.iter().map(|k| leases.acquire(k, ttl).into_future()))
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    let session = leases.session(ttl).key("{worker7}session").await.unwrap();
    let bound: Vec<_> = join_all((0..50).map(|i| {
        leases
            .acquire(format!("{{worker7}}job:{i}"), Duration::ZERO)
            .session(&session)
            .into_future()
    }))
    .await
    .into_iter()
    .map(|r| r.unwrap())
    .collect();
    // Past three ttls: every lease renewed on its own node, one pipeline per slot.
    tokio::time::sleep(ttl * 3 + ttl / 6).await;
    assert!(held.iter().all(|l| l.state() == State::Held));
    assert!(held.iter().all(|l| l.renewals() >= 7));
    assert!(bound.iter().all(|l| l.state() == State::Held));
    let stats = leases.stats();
    assert!(stats.pipelines > stats.rounds, "{stats:?}");
    assert_eq!(stats.failures, 0, "{stats:?}");
    for k in keys
        .iter()
        .take(5)
        .chain(["{worker7}job:0".to_string()].iter())
    {
        let mut admin = cluster.node_for(k).admin().await;
        assert_eq!(lease_state(&mut admin, k).await, "held", "{k}");
    }
    // A fenced write: the resource and the written key share the lock's hash tag.
    let lease = &held[0];
    let set = redis::cmd("SET").arg("{job0}doc").arg("v1").clone();
    lease.fence_call::<()>("{job0}fence", &set).await.unwrap();
    let mut admin = cluster.node_for("{job0}doc").admin().await;
    let doc: String = redis::cmd("GET")
        .arg("{job0}doc")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(doc, "v1");
    // A hold bound to a session in another slot is CROSSSLOT.
    assert_ne!(slot(b"{other}job"), slot(b"{worker7}session"));
    match leases
        .acquire("{other}job", Duration::ZERO)
        .session(&session)
        .await
    {
        Err(Error::Redis(e)) => assert_eq!(e.code(), Some("CROSSSLOT"), "{e}"),
        other => panic!("{other:?}"),
    }
    // BLOCK hands over in the cluster too.
    let other = Leases::connect_cluster(cluster.client()).await.unwrap();
    let waiter = {
        let k = keys[1].clone();
        tokio::spawn(async move {
            let lease = other.acquire(&k, ttl).block(Duration::from_secs(10)).await;
            (lease, other)
        })
    };
    let mut admin = cluster.node_for(&keys[1]).admin().await;
    common::eventually(Duration::from_secs(5), "a waiter", || {
        let mut admin = admin.clone();
        let k = keys[1].clone();
        async move {
            common::lease_info(&mut admin, &k, "waiters").await == Some(redis::Value::Int(1))
        }
    })
    .await;
    held[1].release().await.unwrap();
    let (handed, other) = waiter.await.unwrap();
    let handed = handed.expect("handed over");
    assert!(handed.fence() > held[1].fence());
    assert_eq!(lease_state(&mut admin, &keys[1]).await, "held");
    session.release().await.unwrap();
    assert!(bound.iter().all(|l| l.state() == State::Lost));
    leases.close().await;
    other.close().await;
    assert!(held.iter().skip(2).all(|l| l.state() == State::Lost));
});

for_each_server!(
    cluster_fenced_write_is_not_resent_across_a_node_restart,
    |flavor| {
        // Durable nodes: the lease and the resource record survive the restart.
        let mut cluster =
            Cluster::start_with(flavor, &[("appendonly", "yes"), ("appendfsync", "always")]).await;
        let nodes: Vec<String> = cluster.nodes.iter().map(|n| n.url()).collect();
        // Fenced writes through a cluster client without retries: never resent. (With
        // the default client, 16 retries, this test fails: the write runs on the
        // restarted node.)
        let fenced = ClusterClientBuilder::new(nodes).retries(0).build().unwrap();
        let leases = Leases::connect_cluster(cluster.client())
            .await
            .unwrap()
            .fenced_writes_client(fenced);
        let k = format!("{{w}}{}", key(flavor, "restart"));
        let resource = format!("{{w}}fence:{k}");
        let log = format!("{{w}}log:{k}");
        let lease = leases.acquire(&k, Duration::from_secs(5)).await.unwrap();
        let _: u64 = lease
            .fence_call(&resource, &redis::Cmd::new())
            .await
            .unwrap();
        let write = redis::cmd("RPUSH").arg(&log).arg("x".repeat(2000)).clone();
        let node = cluster.node_for_mut(&k);
        let outcome = fenced_write_across_a_restart(node, &lease, &resource, write, 0).await;
        assert!(
            matches!(outcome, Err(Error::WriteIndeterminate { attempts: 1, .. })),
            "{outcome:?}"
        );
        held_again_and_renewed(&lease).await;
        // Never sent again: the restarted node ran no fenced write, the list is empty.
        let mut admin = cluster.node_for(&k).admin().await;
        assert_eq!(command_calls(&mut admin, "lease.fence").await, 0);
        let len: i64 = redis::cmd("LLEN")
            .arg(&log)
            .query_async(&mut admin)
            .await
            .unwrap();
        assert_eq!(len, 0);
        lease.release().await.unwrap();
        leases.close().await;
    }
);
