//! fence_call: the command's reply, StaleFence from a stale holder's write, and the
//! scoped form treating StaleFence as a lost lease.

mod common;

use std::time::Duration;

use common::{key, Server};
use redis_lease_client::{Error, Leases, State};

/// Long enough that no renewal notices the DEL before the stale write does.
const TTL: Duration = Duration::from_secs(30);

for_each_server!(fence_call_runs_the_command, |flavor| {
    let server = Server::start(flavor);
    let mut admin = server.admin().await;
    let leases = Leases::connect(server.client()).await.unwrap();
    let lease = leases.acquire(key(flavor, "fenced"), TTL).await.unwrap();
    let hset = redis::cmd("HSET")
        .arg("report")
        .arg("total")
        .arg(42)
        .clone();
    let added: i64 = lease.fence_call("fence:report", &hset).await.unwrap();
    assert_eq!(added, 1);
    let total: i64 = redis::cmd("HGET")
        .arg("report")
        .arg("total")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(total, 42);
    // A refused inner command is an error, not a loss.
    let blpop = redis::cmd("BLPOP").arg("queue").arg(0).clone();
    let refused = lease.fence_call::<()>("fence:report", &blpop).await;
    assert!(matches!(refused, Err(Error::Redis(_))), "{refused:?}");
    assert_eq!(lease.state(), State::Held);
    lease.release().await.unwrap();
    assert!(matches!(
        lease.fence_call::<i64>("fence:report", &hset).await,
        Err(Error::LeaseLost { .. })
    ));
    leases.close().await;
});

for_each_server!(stale_fence_from_a_stale_holders_write, |flavor| {
    let server = Server::start(flavor);
    let mut admin = server.admin().await;
    let leases = Leases::connect(server.client()).await.unwrap();
    let k = key(flavor, "stale");
    let stale = leases.acquire(&k, TTL).await.unwrap();
    let set = |v: &str| redis::cmd("SET").arg("doc").arg(v).clone();
    stale
        .fence_call::<()>("fence:doc", &set("v1"))
        .await
        .unwrap();
    // The lease ends behind the holder's back; a new holder writes.
    let _: i64 = redis::cmd("DEL")
        .arg(&k)
        .query_async(&mut admin)
        .await
        .unwrap();
    let fresh = leases.acquire(&k, TTL).await.unwrap();
    assert!(fresh.fence() > stale.fence());
    fresh
        .fence_call::<()>("fence:doc", &set("v2"))
        .await
        .unwrap();
    let lost = stale.lost();
    match stale.fence_call::<()>("fence:doc", &set("v3")).await {
        Err(Error::StaleFence {
            resource,
            fence,
            highest,
        }) => {
            assert_eq!(resource, "fence:doc");
            assert_eq!(fence, stale.fence());
            assert_eq!(highest, fresh.fence());
        }
        other => panic!("expected StaleFence, got {other:?}"),
    }
    tokio::time::timeout(Duration::from_millis(10), lost)
        .await
        .expect("StaleFence fires the loss signal");
    assert_eq!(stale.state(), State::Lost);
    let doc: String = redis::cmd("GET")
        .arg("doc")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(doc, "v2");
    assert_eq!(fresh.state(), State::Held);
    leases.close().await;
});

for_each_server!(scoped_form_treats_stale_fence_as_lost, |flavor| {
    let server = Server::start(flavor);
    let mut admin = server.admin().await;
    let leases = Leases::connect(server.client()).await.unwrap();
    let other = Leases::connect(server.client()).await.unwrap();
    let k = key(flavor, "scoped-stale");
    for swallow in [false, true] {
        let result = leases
            .with_lease(&k, TTL, |lease| {
                let (admin, other, k) = (&mut admin, &other, k.clone());
                async move {
                    let _: i64 = redis::cmd("DEL").arg(&k).query_async(admin).await.unwrap();
                    let fresh = other.acquire(&k, TTL).await.unwrap();
                    let set = redis::cmd("SET").arg("doc").arg("fresh").clone();
                    fresh.fence_call::<()>("fence:doc", &set).await.unwrap();
                    fresh.release().await.unwrap();
                    let set = redis::cmd("SET").arg("doc").arg("stale").clone();
                    let write = lease.fence_call::<()>("fence:doc", &set).await;
                    assert!(matches!(write, Err(Error::StaleFence { .. })));
                    if swallow {
                        // Even a body that ignores the refusal ends in LeaseLost.
                        Ok(())
                    } else {
                        write
                    }
                }
            })
            .await;
        assert!(matches!(result, Err(Error::LeaseLost { .. })), "{result:?}");
    }
    leases.close().await;
    other.close().await;
});
