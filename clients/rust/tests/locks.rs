//! The named types: a read/write lock and a semaphore over shared holds; a `Lease` is
//! the guard (dropping the last clone releases it in the background), the closure forms
//! release on the way out.

mod common;

use std::time::Duration;

use common::{eventually, key, Server};
use redis_lease_client::{Error, Leases, State};

const TTL: Duration = Duration::from_secs(5);

for_each_server!(read_write_lock, |flavor| {
    let server = Server::start(flavor);
    let leases = Leases::connect(server.client()).await.unwrap();
    let lock = leases.read_write_lock(key(flavor, "rw"));
    // Two readers at once, each with its own fence.
    let r1 = lock.read(TTL).await.unwrap();
    let r2 = lock.read(TTL).await.unwrap();
    assert!(r2.fence() > r1.fence());
    assert!(matches!(
        lock.write(TTL).await,
        Err(Error::NotAcquired { .. })
    ));
    // A writer waits; a new reader cannot jump the queue ahead of it.
    let writer = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.write(TTL).block(Duration::from_secs(10)).await })
    };
    eventually(Duration::from_secs(5), "the writer queued", || async {
        matches!(lock.read(TTL).await, Err(Error::NotAcquired { .. }))
    })
    .await;
    r1.release().await.unwrap();
    // The guard: dropping the last clone releases it (in the background).
    drop(r2);
    let w = writer.await.unwrap().unwrap();
    assert_eq!(w.state(), State::Held);
    assert!(w.fence() > r1.fence());
    assert!(matches!(
        lock.read(TTL).await,
        Err(Error::NotAcquired { .. })
    ));
    w.release().await.unwrap();
    // The closure forms release on the way out.
    let got = lock
        .with_write(TTL, |w| async move {
            assert_eq!(w.state(), State::Held);
            Ok::<_, Error>(7)
        })
        .await
        .unwrap();
    assert_eq!(got, 7);
    let both = lock
        .with_read(TTL, |_r| async {
            // Another reader may join while this one holds.
            let other = lock.read(TTL).await?;
            other.release().await?;
            Ok::<_, Error>(())
        })
        .await;
    assert!(both.is_ok(), "{both:?}");
    let w = lock.write(TTL).await.unwrap();
    w.release().await.unwrap();
    leases.close().await;
});

for_each_server!(semaphore, |flavor| {
    let server = Server::start(flavor);
    let leases = Leases::connect(server.client()).await.unwrap();
    let k = key(flavor, "sem");
    let sem = leases.semaphore(&k, 2);
    assert_eq!(sem.permits(), 2);
    let a = sem.acquire(TTL).await.unwrap();
    let b = sem.acquire(TTL).await.unwrap();
    assert!(matches!(
        sem.acquire(TTL).await,
        Err(Error::NotAcquired { .. })
    ));
    // Another number of permits for the same key is refused by the server.
    let other = leases.semaphore(&k, 3);
    assert!(matches!(other.acquire(TTL).await, Err(Error::Redis(_))));
    // Dropping a guard frees its permit (released in the background).
    drop(a);
    let c = {
        let start = std::time::Instant::now();
        loop {
            match sem.acquire(TTL).await {
                Ok(c) => break c,
                Err(Error::NotAcquired { .. }) if start.elapsed() < Duration::from_secs(5) => {
                    tokio::time::sleep(Duration::from_millis(10)).await
                }
                Err(e) => panic!("the dropped permit was not released: {e}"),
            }
        }
    };
    b.release().await.unwrap();
    c.release().await.unwrap();
    let got = sem
        .with_permit(TTL, |permit| async move {
            assert_eq!(permit.state(), State::Held);
            Ok::<_, Error>("done")
        })
        .await
        .unwrap();
    assert_eq!(got, "done");
    // Both permits free again after the closure.
    let a = sem.acquire(TTL).await.unwrap();
    let b = sem.acquire(TTL).await.unwrap();
    a.release().await.unwrap();
    b.release().await.unwrap();
    leases.close().await;
});
