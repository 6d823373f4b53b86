//! Release on every way out: a body's error, a dropped lease, close(). The options of
//! LEASE.ACQUIRE reach the server. No task is left after close().

mod common;

use std::time::Duration;

use common::{eventually, key, lease_info, lease_state, Server};
use redis_lease_client::{Error, Leases, State};

#[derive(Debug)]
enum AppError {
    Lease(Error),
    Boom,
}

impl From<Error> for AppError {
    fn from(e: Error) -> Self {
        AppError::Lease(e)
    }
}

for_each_server!(a_bodys_error_releases, |flavor| {
    let server = Server::start(flavor);
    let mut admin = server.admin().await;
    let leases = Leases::connect(server.client()).await.unwrap();
    let ttl = Duration::from_secs(30);
    let k = key(flavor, "boom");
    let result: Result<(), AppError> = leases
        .with_lease(&k, ttl, |lease| async move {
            assert_eq!(lease.state(), State::Held);
            Err(AppError::Boom)
        })
        .await;
    assert!(matches!(result, Err(AppError::Boom)), "{result:?}");
    // Released at once, not at the end of its 30 s.
    assert_ne!(lease_state(&mut admin, &k).await, "held");
    let again = leases.acquire(&k, ttl).await.unwrap();
    // A panic in the body unwinds through the scoped form: the lease is dropped and
    // released in the background.
    drop(again);
    eventually(Duration::from_secs(2), "released after the drop", || {
        let mut admin = admin.clone();
        let k = k.clone();
        async move { lease_state(&mut admin, &k).await != "held" }
    })
    .await;
    let panicked = tokio::spawn({
        let leases = leases.clone();
        let k = k.clone();
        async move {
            leases
                .with_lease(&k, ttl, |_| async {
                    panic!("the body panics");
                    #[allow(unreachable_code)]
                    Ok::<(), Error>(())
                })
                .await
        }
    })
    .await;
    assert!(panicked.is_err());
    eventually(Duration::from_secs(2), "released after the panic", || {
        let mut admin = admin.clone();
        let k = k.clone();
        async move { lease_state(&mut admin, &k).await != "held" }
    })
    .await;
    let result: Result<u32, AppError> = leases.with_lease(&k, ttl, |_| async { Ok(7) }).await;
    assert!(matches!(result, Ok(7)));
    // The client's errors reach the body's error type through From.
    let held = leases.acquire(&k, ttl).await.unwrap();
    let result: Result<u32, AppError> = leases.with_lease(&k, ttl, |_| async { Ok(7) }).await;
    assert!(
        matches!(result, Err(AppError::Lease(Error::NotAcquired { .. }))),
        "{result:?}"
    );
    held.release().await.unwrap();
    leases.close().await;
});

for_each_server!(dropping_a_lease_releases_it, |flavor| {
    let server = Server::start(flavor);
    let admin = server.admin().await;
    let leases = Leases::connect(server.client()).await.unwrap();
    let k = key(flavor, "dropped");
    let lease = leases.acquire(&k, Duration::from_secs(30)).await.unwrap();
    let clone = lease.clone();
    drop(lease);
    assert_eq!(clone.state(), State::Held, "held while a clone lives");
    drop(clone);
    eventually(Duration::from_secs(2), "released in the background", || {
        let mut admin = admin.clone();
        let k = k.clone();
        async move { lease_state(&mut admin, &k).await != "held" }
    })
    .await;
    assert_eq!(leases.live(), 0);
    leases.close().await;
});

for_each_server!(a_release_wins_over_a_renewal_it_races, |flavor| {
    // A renewal that reaches the server after the holder's release is answered 0: that
    // is the release's doing, not a loss (the watchdog's renewals race releases so).
    let server = Server::start(flavor);
    let leases = Leases::connect(server.client()).await.unwrap();
    for i in 0..20 {
        let lease = leases
            .acquire(key(flavor, &format!("race:{i}")), Duration::from_secs(30))
            .await
            .unwrap();
        let lost = lease.lost_token();
        let (released, renewed) = tokio::join!(lease.release(), lease.renew());
        assert!(released.is_ok(), "{released:?}");
        assert!(renewed.is_err());
        assert_eq!(lease.state(), State::Released);
        assert!(!lost.is_cancelled(), "no loss signalled");
    }
    leases.close().await;
});

for_each_server!(acquire_options_reach_the_server, |flavor| {
    let server = Server::start(flavor);
    let mut admin = server.admin().await;
    let leases = Leases::connect(server.client()).await.unwrap();
    let ttl = Duration::from_secs(30);
    // TOKEN: the same token again is the idempotent retry.
    let k = key(flavor, "token");
    let lease = leases.acquire(&k, ttl).token("my-token-1").await.unwrap();
    assert_eq!(lease.token(), "my-token-1");
    let retry = leases.acquire(&k, ttl).token("my-token-1").await.unwrap();
    assert_eq!(retry.fence(), lease.fence());
    drop(retry); // releases it: the same token is the same hold
    eventually(Duration::from_secs(2), "released", || {
        let mut admin = admin.clone();
        let k = k.clone();
        async move { lease_state(&mut admin, &k).await != "held" }
    })
    .await;
    // A generated token: 32 lowercase hex digits.
    let generated = leases.acquire(key(flavor, "generated"), ttl).await.unwrap();
    assert_eq!(generated.token().len(), 32);
    assert!(generated
        .token()
        .bytes()
        .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
    // SHARED LIMIT 2 and OWNER.
    let k = key(flavor, "semaphore");
    let a = leases.acquire(&k, ttl).limit(2).owner("a").await.unwrap();
    let b = leases.acquire(&k, ttl).limit(2).owner("b").await.unwrap();
    let third = leases.acquire(&k, ttl).limit(2).await;
    assert!(matches!(third, Err(Error::NotAcquired { .. })), "{third:?}");
    let holders: Vec<redis::Value> = redis::cmd("LEASE.HOLDERS")
        .arg(&k)
        .query_async(&mut admin)
        .await
        .unwrap();
    let owners: Vec<String> = holders
        .into_iter()
        .map(|holder| {
            let fields: Vec<redis::Value> = redis::from_redis_value(holder).unwrap();
            let at = fields
                .iter()
                .position(|f| *f == redis::Value::BulkString(b"owner".to_vec()))
                .unwrap();
            redis::from_redis_value(fields[at + 1].clone()).unwrap()
        })
        .collect();
    assert_eq!(owners, ["a", "b"]);
    assert_eq!(
        lease_info(&mut admin, &k, "mode").await,
        Some(redis::Value::BulkString(b"shared".to_vec()))
    );
    let exclusive = leases.acquire(&k, ttl).limit(2).await;
    assert!(
        matches!(exclusive, Err(Error::NotAcquired { .. })),
        "{exclusive:?}"
    );
    // The key keeps its limit while held: another (or none) is the server's error.
    let exclusive = leases.acquire(&k, ttl).await;
    match exclusive {
        Err(Error::Redis(e)) => assert!(e.to_string().contains("LIMIT does not match"), "{e}"),
        other => panic!("{other:?}"),
    }
    // Another mode for a held token is the server's error.
    let other_mode = leases.acquire(&k, ttl).token(a.token()).await;
    assert!(matches!(other_mode, Err(Error::Redis(_))), "{other_mode:?}");
    a.release().await.unwrap();
    b.release().await.unwrap();
    // DELAY: the key stays closed for the delay after the hold expires.
    let k = key(flavor, "delay");
    let short = Duration::from_millis(300);
    let delayed = leases
        .acquire(&k, short)
        .delay(Duration::from_millis(1_000))
        .max_renewals(0)
        .await
        .unwrap();
    tokio::time::timeout(short * 2, delayed.lost())
        .await
        .expect("expires");
    eventually(Duration::from_secs(1), "the lock-delay", || {
        let mut admin = admin.clone();
        let k = k.clone();
        async move { lease_state(&mut admin, &k).await == "delayed" }
    })
    .await;
    let during = leases.acquire(&k, short).await;
    assert!(
        matches!(during, Err(Error::NotAcquired { .. })),
        "{during:?}"
    );
    let after = leases
        .acquire(&k, short)
        .block(Duration::from_secs(3))
        .await
        .expect("granted when the delay ends");
    assert!(after.fence() > delayed.fence());
    leases.close().await;
});

for_each_server!(close_leaves_no_task, |flavor| {
    let server = Server::start(flavor);
    let runtime = tokio::runtime::Handle::current();
    // Every task on this test's runtime: none yet.
    let tasks = || runtime.metrics().num_alive_tasks();
    assert_eq!(tasks(), 0);
    let client = server.client();
    let leases =
        Leases::new(client.get_connection_manager().await.unwrap()).blocking_client(client.clone());
    assert_eq!(leases.tasks(), 0, "nothing runs before the first acquire");
    let ttl = Duration::from_millis(600);
    let kept = leases.acquire(key(flavor, "kept"), ttl).await.unwrap();
    let blocked = leases
        .acquire(key(flavor, "blocked"), ttl)
        .block(Duration::from_millis(100))
        .await
        .unwrap();
    drop(blocked); // a background release
    let session = leases.session(ttl).key(key(flavor, "s")).await.unwrap();
    let bound = leases
        .acquire(key(flavor, "bound"), Duration::ZERO)
        .session(&session)
        .await
        .unwrap();
    assert!(leases.tasks() >= 1, "the watchdog runs");
    eventually(ttl, "a renewal round", || async {
        leases.stats().rounds >= 1
    })
    .await;
    leases.close().await;
    assert_eq!(leases.tasks(), 0, "no task of the client after close()");
    for lease in [&kept, &bound, session.lease()] {
        assert_eq!(lease.state(), State::Lost, "{lease:?}");
    }
    let mut admin = server.admin().await;
    assert_ne!(lease_state(&mut admin, &key(flavor, "kept")).await, "held");
    drop(admin);
    let rounds = leases.stats().rounds;
    tokio::time::sleep(ttl / 2).await;
    assert_eq!(leases.stats().rounds, rounds, "no renewal after close()");
    let after = leases.acquire(key(flavor, "after"), ttl).await;
    assert!(matches!(after, Err(Error::Closed)), "{after:?}");
    leases.close().await;
    // With the handles dropped, nothing at all is left on the runtime: no task of the
    // client's, and redis-rs's connection tasks (the shared connection, the blocking
    // acquire's own) have ended with their connections.
    drop((kept, bound, session, leases, client));
    eventually(Duration::from_secs(2), "no task on the runtime", || async {
        tasks() == 0
    })
    .await;
});
