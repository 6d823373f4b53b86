//! The loss signal: an admin DEL, another holder taking the key after the server slept,
//! a holder paused past its lease. Signalled within ttl/3; the scoped form returns
//! LeaseLost even when the body did not look.

mod common;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{eventually, key, lease_info, Server};
use redis_lease_client::{Error, Leases, State};

/// A third of the ttl, plus what a reply and a timer take on a busy 2-core machine.
fn within_a_third(ttl: Duration) -> Duration {
    ttl / 3 + Duration::from_millis(100)
}

for_each_server!(lost_after_admin_del, |flavor| {
    let server = Server::start(flavor);
    let mut admin = server.admin().await;
    let leases = Leases::connect(server.client()).await.unwrap();
    let ttl = Duration::from_millis(900);
    let k = key(flavor, "del");
    let lease = leases.acquire(&k, ttl).await.unwrap();
    let token = lease.lost_token();
    let deleted = Instant::now();
    let _: i64 = redis::cmd("DEL")
        .arg(&k)
        .query_async(&mut admin)
        .await
        .unwrap();
    tokio::time::timeout(within_a_third(ttl), lease.lost())
        .await
        .unwrap_or_else(|_| panic!("not lost within ttl/3 of the DEL"));
    assert!(deleted.elapsed() <= within_a_third(ttl));
    assert!(token.is_cancelled(), "the token fires with the future");
    assert_eq!(lease.state(), State::Lost);
    assert!(matches!(lease.check(), Err(Error::LeaseLost { .. })));
    assert!(matches!(lease.renew().await, Err(Error::LeaseLost { .. })));
    assert!(matches!(
        lease.release().await,
        Err(Error::LeaseLost { .. })
    ));
    leases.close().await;
});

for_each_server!(scoped_form_returns_lost_after_admin_del, |flavor| {
    let server = Server::start(flavor);
    let mut admin = server.admin().await;
    let leases = Leases::connect(server.client()).await.unwrap();
    let ttl = Duration::from_millis(900);
    let k = key(flavor, "scoped-del");
    let result = leases
        .with_lease(&k, ttl, |lease| {
            let admin = &mut admin;
            let k = k.clone();
            async move {
                let _: i64 = redis::cmd("DEL").arg(&k).query_async(admin).await.unwrap();
                // The body does not look at the lease; it just works past the next renewal.
                let lost_by = Instant::now() + within_a_third(ttl);
                while lease.state() != State::Lost {
                    assert!(Instant::now() < lost_by, "not lost within ttl/3");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Ok::<_, Error>("done")
            }
        })
        .await;
    assert!(
        matches!(result, Err(Error::LeaseLost { ref key }) if *key == k),
        "{result:?}"
    );
    leases.close().await;
});

for_each_server!(
    lost_when_another_holder_takes_it_after_debug_sleep,
    |flavor| {
        let server = Server::start(flavor);
        let mut admin = server.admin().await;
        let holder = Leases::connect(server.client()).await.unwrap();
        let other = Leases::connect(server.client()).await.unwrap();
        let ttl = Duration::from_millis(600);
        let k = key(flavor, "sleep");
        let first = holder.acquire(&k, ttl).await.unwrap();
        // The server sleeps past the lease; its renewal waits unanswered.
        let sleeper = tokio::spawn(async move {
            let _: () = redis::cmd("DEBUG")
                .arg("SLEEP")
                .arg("1.2")
                .query_async(&mut admin)
                .await
                .unwrap();
        });
        eventually(ttl, "the renewal to go unanswered", || async {
            first.state() != State::Held
        })
        .await;
        let taker = {
            let k = k.clone();
            tokio::spawn(async move {
                let second = other.acquire(&k, ttl).block(Duration::from_secs(10)).await;
                (Instant::now(), second, other)
            })
        };
        tokio::time::timeout(ttl * 2, first.lost())
            .await
            .expect("lost");
        let lost_at = Instant::now();
        let (taken_at, second, other) = taker.await.unwrap();
        let second = second.expect("the other holder takes it when the server wakes");
        sleeper.await.unwrap();
        // Signalled before the other holder had it, or at most ttl/3 after.
        assert!(
            lost_at <= taken_at + within_a_third(ttl),
            "lost {:?} after the other holder took it",
            lost_at - taken_at
        );
        assert!(second.fence() > first.fence());
        assert_eq!(first.state(), State::Lost);
        assert_eq!(second.state(), State::Held);
        second.release().await.unwrap();
        holder.close().await;
        other.close().await;
    }
);

for_each_server!(scoped_form_returns_lost_after_debug_sleep, |flavor| {
    let server = Server::start(flavor);
    let mut admin = server.admin().await;
    let leases = Leases::connect(server.client()).await.unwrap();
    let ttl = Duration::from_millis(600);
    let k = key(flavor, "scoped-sleep");
    let result = leases
        .with_lease(&k, ttl, |_lease| async move {
            // The server stops past the lease while the body works.
            let _: () = redis::cmd("DEBUG")
                .arg("SLEEP")
                .arg("1.0")
                .query_async(&mut admin)
                .await
                .unwrap();
            Ok::<_, Error>(())
        })
        .await;
    assert!(matches!(result, Err(Error::LeaseLost { .. })), "{result:?}");
    leases.close().await;
});

for_each_server!(paused_holder_is_lost_and_cannot_write, |flavor| {
    // The seed scenario: a worker stops (a GC pause, a stalled VM) with its watchdog,
    // another takes the key and writes; the worker wakes and its write is refused.
    let server = Server::start(flavor);
    let mut admin = server.admin().await;
    let ttl = Duration::from_millis(600);
    let k = key(flavor, "paused");
    let resource = format!("fence:{k}");
    let (holding_tx, holding_rx) = mpsc::channel::<u64>();
    let (resume_tx, resume_rx) = mpsc::channel::<()>();
    let worker = {
        let client = server.client();
        let raw = server.client();
        let (k, resource) = (k.clone(), resource.clone());
        std::thread::spawn(move || {
            // A runtime of its own, one thread: blocking it stops the worker and its
            // watchdog alike.
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let leases = Leases::connect(client).await.unwrap();
                let result = leases
                    .with_lease(&k, ttl, |lease| async move {
                        let set = redis::cmd("SET").arg("doc").arg("worker-1").clone();
                        lease.fence_call::<()>(&resource, &set).await?;
                        holding_tx.send(lease.fence()).unwrap();
                        resume_rx.recv().unwrap(); // paused, watchdog and all
                                                   // Awake: past its deadline the lease reads as lost at once, and
                                                   // fence_call sends nothing.
                        assert_eq!(lease.state(), State::Lost);
                        let set = redis::cmd("SET").arg("doc").arg("worker-2").clone();
                        let write = lease.fence_call::<()>(&resource, &set).await;
                        assert!(matches!(write, Err(Error::LeaseLost { .. })), "{write:?}");
                        // A write already on its way when the pause began reaches the
                        // server anyway: the fence refuses it there.
                        let mut conn = raw.get_multiplexed_async_connection().await?;
                        let late: redis::RedisResult<()> = redis::cmd("LEASE.FENCE")
                            .arg(&resource)
                            .arg(lease.fence())
                            .arg("SET")
                            .arg("doc")
                            .arg("worker-2")
                            .query_async(&mut conn)
                            .await;
                        let late = late.unwrap_err();
                        assert_eq!(late.code(), Some("STALE"), "{late}");
                        write
                    })
                    .await;
                leases.close().await;
                result
            })
        })
    };
    let worker_fence = tokio::task::spawn_blocking(move || holding_rx.recv().unwrap())
        .await
        .unwrap();
    let other = Leases::connect(server.client()).await.unwrap();
    let second = other
        .acquire(&k, ttl)
        .block(Duration::from_secs(10))
        .await
        .expect("the key, once the paused worker's lease expires");
    assert!(second.fence() > worker_fence);
    let set = redis::cmd("SET").arg("doc").arg("second").clone();
    second.fence_call::<()>(&resource, &set).await.unwrap();
    resume_tx.send(()).unwrap();
    let result = tokio::task::spawn_blocking(move || worker.join().unwrap())
        .await
        .unwrap();
    assert!(matches!(result, Err(Error::LeaseLost { .. })), "{result:?}");
    let doc: String = redis::cmd("GET")
        .arg("doc")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(doc, "second", "the paused worker's write never landed");
    assert!(lease_info(&mut admin, &k, "state").await.is_some());
    second.release().await.unwrap();
    other.close().await;
});
