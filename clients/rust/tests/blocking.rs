//! BLOCK: handing a lease over between two clients, a wait that ends first, and the
//! watchdog going on while a wait blocks.

mod common;

use std::time::{Duration, Instant};

use common::{eventually, key, lease_info, Server};
use redis_lease_client::{Error, Leases, State};

for_each_server!(block_hands_over_between_two_clients, |flavor| {
    let server = Server::start(flavor);
    let mut admin = server.admin().await;
    let first = Leases::connect(server.client()).await.unwrap();
    let second = Leases::connect(server.client()).await.unwrap();
    let ttl = Duration::from_millis(900);
    let k = key(flavor, "handover");
    let held = first.acquire(&k, ttl).await.unwrap();
    let waiter = {
        let k = k.clone();
        tokio::spawn(async move {
            let lease = second
                .acquire(&k, ttl)
                .block(Duration::from_secs(10))
                .owner("second")
                .await;
            (Instant::now(), lease, second)
        })
    };
    eventually(Duration::from_secs(5), "the second client waiting", || {
        let mut admin = admin.clone();
        let k = k.clone();
        async move { lease_info(&mut admin, &k, "waiters").await == Some(redis::Value::Int(1)) }
    })
    .await;
    // Held across more than a ttl while the other waits.
    tokio::time::sleep(ttl + ttl / 3).await;
    assert_eq!(held.state(), State::Held);
    assert!(!waiter.is_finished());
    let released = Instant::now();
    held.release().await.unwrap();
    let (granted, lease, second) = waiter.await.unwrap();
    let lease = lease.expect("handed over");
    assert!(
        granted - released < Duration::from_millis(250),
        "handed over after {:?}",
        granted - released
    );
    assert!(lease.fence() > held.fence());
    let owner: String =
        redis::from_redis_value(lease_info(&mut admin, &k, "owner").await.unwrap()).unwrap();
    assert_eq!(owner, "second");
    // The new holder's watchdog keeps it.
    tokio::time::sleep(ttl + ttl / 3).await;
    assert_eq!(lease.state(), State::Held);
    assert!(lease.renewals() >= 2);
    lease.release().await.unwrap();
    first.close().await;
    second.close().await;
});

for_each_server!(block_ends_in_not_acquired, |flavor| {
    let server = Server::start(flavor);
    let leases = Leases::connect(server.client()).await.unwrap();
    let ttl = Duration::from_millis(900);
    let k = key(flavor, "timeout");
    let held = leases.acquire(&k, ttl).await.unwrap();
    let start = Instant::now();
    let wait = Duration::from_millis(300);
    let result = leases.acquire(&k, ttl).block(wait).await;
    assert!(
        matches!(result, Err(Error::NotAcquired { .. })),
        "{result:?}"
    );
    assert!(start.elapsed() >= wait);
    // Without BLOCK: at once.
    let result = leases.acquire(&k, ttl).await;
    assert!(
        matches!(result, Err(Error::NotAcquired { .. })),
        "{result:?}"
    );
    let result = leases
        // The body would answer Closed: it never runs.
        .with_lease(&k, ttl, |_| async { Err::<(), _>(Error::Closed) })
        .await;
    assert!(
        matches!(result, Err(Error::NotAcquired { .. })),
        "{result:?}"
    );
    held.release().await.unwrap();
    leases.close().await;
});

for_each_server!(watchdog_goes_on_while_a_wait_blocks, |flavor| {
    let server = Server::start(flavor);
    let leases = Leases::connect(server.client()).await.unwrap();
    let other = Leases::connect(server.client()).await.unwrap();
    let ttl = Duration::from_millis(600);
    let kept = leases.acquire(key(flavor, "kept"), ttl).await.unwrap();
    let busy = other.acquire(key(flavor, "busy"), ttl).await.unwrap();
    // Blocks for four ttls on its own connection; the renewals of `kept` go on.
    let result = leases
        .acquire(key(flavor, "busy"), ttl)
        .block(ttl * 4)
        .await;
    assert!(
        matches!(result, Err(Error::NotAcquired { .. })),
        "{result:?}"
    );
    assert_eq!(kept.state(), State::Held);
    assert!(kept.renewals() >= 8, "{} renewals", kept.renewals());
    // A Leases on a bare connection has none to block on.
    let bare = Leases::new(server.client().get_connection_manager().await.unwrap());
    let result = bare.acquire(key(flavor, "busy"), ttl).block(ttl).await;
    assert!(
        matches!(result, Err(Error::NoBlockingConnection)),
        "{result:?}"
    );
    drop(busy);
    leases.close().await;
    other.close().await;
    bare.close().await;
});
