//! Sessions: one renewal keeps a thousand bound leases; the session's end ends them.

mod common;

use std::future::IntoFuture;
use std::time::{Duration, Instant};

use common::{eventually, key, lease_state, renew_calls, Server};
use futures_util::future::join_all;
use redis_lease_client::{Leases, State};

for_each_server!(session_keeps_a_thousand_leases_with_one_renewal, |flavor| {
    let server = Server::start(flavor);
    let mut admin = server.admin().await;
    let leases = Leases::connect(server.client()).await.unwrap();
    let ttl = Duration::from_millis(600);
    let session = leases
        .session(ttl)
        .key(key(flavor, "session"))
        .owner("worker-7")
        .await
        .unwrap();
    let n = 1_000;
    let keys: Vec<String> = (0..n).map(|i| key(flavor, &format!("bound:{i}"))).collect();
    // ttl zero: no deadline of their own, alive exactly as long as the session.
    let bound: Vec<_> = join_all(keys.iter().map(|k| {
        leases
            .acquire(k, Duration::ZERO)
            .session(&session)
            .into_future()
    }))
    .await
    .into_iter()
    .map(|r| r.unwrap())
    .collect();
    let calls0 = renew_calls(&mut admin).await;
    let start = Instant::now();
    tokio::time::sleep(ttl * 3).await;
    let calls = renew_calls(&mut admin).await - calls0;
    let periods = start.elapsed().as_secs_f64() / (ttl / 3).as_secs_f64();
    // Only the session is renewed: one command per ttl/3.
    assert!(calls as f64 <= periods.floor() + 1.0, "{calls} renewals");
    assert!(calls as f64 >= periods.floor() - 2.0, "{calls} renewals");
    assert!(bound.iter().all(|l| l.state() == State::Held));
    let mut pipe = redis::pipe();
    for k in &keys {
        pipe.cmd("LEASE.INFO").arg(k);
    }
    let infos: Vec<redis::Value> = pipe.query_async(&mut admin).await.unwrap();
    let held = infos
        .iter()
        .filter(|v| format!("{v:?}").contains("held"))
        .count();
    assert_eq!(held, n, "every bound lease held on the server");
    // Releasing the session frees them all: lost, to their holder.
    session.release().await.unwrap();
    assert!(bound.iter().all(|l| l.state() == State::Lost));
    tokio::time::timeout(Duration::from_millis(10), bound[0].lost())
        .await
        .expect("signalled");
    eventually(Duration::from_secs(2), "bound keys free", || {
        let mut admin = admin.clone();
        let k = keys[n - 1].clone();
        async move { lease_state(&mut admin, &k).await != "held" }
    })
    .await;
    assert_eq!(leases.live(), 0);
    leases.close().await;
});

for_each_server!(session_lost_loses_its_leases, |flavor| {
    let server = Server::start(flavor);
    let mut admin = server.admin().await;
    let leases = Leases::connect(server.client()).await.unwrap();
    let ttl = Duration::from_millis(900);
    let session_key = key(flavor, "session-del");
    let session = leases.session(ttl).key(&session_key).await.unwrap();
    let bound = leases
        .acquire(key(flavor, "bound-del"), Duration::ZERO)
        .session(&session)
        .await
        .unwrap();
    // A bound lease with a ttl of its own is renewed as well, and still ends with it.
    let own_ttl = leases
        .acquire(key(flavor, "bound-ttl"), ttl)
        .session(&session)
        .await
        .unwrap();
    // A bound lease without a ttl of its own has its session's deadline.
    let (bound_left, session_left) = (bound.remaining().unwrap(), session.remaining().unwrap());
    assert!(session_left <= bound_left && bound_left - session_left < Duration::from_millis(5));
    let deleted = Instant::now();
    let _: i64 = redis::cmd("DEL")
        .arg(&session_key)
        .query_async(&mut admin)
        .await
        .unwrap();
    tokio::time::timeout(ttl / 3 + Duration::from_millis(100), bound.lost())
        .await
        .expect("the bound lease is lost with its session");
    assert!(deleted.elapsed() <= ttl / 3 + Duration::from_millis(100));
    assert_eq!(session.state(), State::Lost);
    assert_eq!(bound.state(), State::Lost);
    assert_eq!(own_ttl.state(), State::Lost);
    let result = leases
        .acquire(key(flavor, "late"), Duration::ZERO)
        .session(&session)
        .await;
    assert!(result.is_err(), "no binding to an ended session");
    leases.close().await;
});
