//! The watchdog: leases held past their ttl, one pipelined round per ttl/3, suspended
//! then lost when the server stops answering.

mod common;

use std::future::IntoFuture;
use std::time::{Duration, Instant};

use common::{eventually, key, lease_fence, lease_state, renew_calls, Server};
use futures_util::future::join_all;
use redis_lease_client::{Error, Leases, State, WatchdogStats};

for_each_server!(held_past_three_ttls, |flavor| {
    let server = Server::start(flavor);
    let mut admin = server.admin().await;
    let leases = Leases::connect(server.client()).await.unwrap();
    let ttl = Duration::from_millis(600);
    let k = key(flavor, "held");
    let before = renew_calls(&mut admin).await;
    let fence = leases
        .with_lease(&k, ttl, |lease| {
            let admin = &mut admin;
            let k = k.clone();
            async move {
                // The body works (sleeps) for three ttls without touching the lease.
                tokio::time::sleep(ttl * 3 + ttl / 6).await;
                assert_eq!(lease.state(), State::Held);
                assert_eq!(lease_state(admin, &k).await, "held");
                assert_eq!(lease_fence(admin, &k).await, lease.fence(), "same grant");
                assert!(lease.renewals() >= 7, "renewed {} times", lease.renewals());
                Ok::<_, Error>(lease.fence())
            }
        })
        .await
        .unwrap();
    assert!(fence > 0);
    assert!(renew_calls(&mut admin).await - before >= 7);
    assert_ne!(
        lease_state(&mut admin, &k).await,
        "held",
        "released at the end"
    );
    leases.close().await;
});

for_each_server!(thousand_leases_one_round_per_third, |flavor| {
    let server = Server::start(flavor);
    let mut admin = server.admin().await;
    let leases = Leases::connect(server.client()).await.unwrap();
    let ttl = Duration::from_millis(900);
    let n = 1_000;
    let keys: Vec<String> = (0..n).map(|i| key(flavor, &format!("many:{i}"))).collect();
    let held: Vec<_> = join_all(keys.iter().map(|k| leases.acquire(k, ttl).into_future()))
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    // Grants spread over some milliseconds fall into one round after the first period.
    let aligned = leases.stats().rounds + 2;
    eventually(ttl * 3, "two renewal rounds", || async {
        leases.stats().rounds >= aligned
    })
    .await;
    let (stats0, calls0) = settled(&leases, &mut admin).await;
    let window = ttl * 3;
    let start = Instant::now();
    tokio::time::sleep(window).await;
    let (stats1, calls1) = settled(&leases, &mut admin).await;
    let elapsed = start.elapsed();
    let periods = elapsed.as_secs_f64() / (ttl / 3).as_secs_f64();
    let rounds = stats1.rounds - stats0.rounds;
    let renewals = calls1 - calls0;
    // At most one round per ttl/3 (plus the one the window may cut), each renewing all.
    assert!(
        rounds as f64 <= periods.floor() + 1.0,
        "{rounds} rounds in {elapsed:?}"
    );
    assert!(
        rounds as f64 >= periods.floor() - 1.0,
        "{rounds} rounds in {elapsed:?}"
    );
    assert_eq!(
        stats1.pipelines - stats0.pipelines,
        rounds,
        "one pipeline a round"
    );
    assert_eq!(
        renewals,
        stats1.renewals - stats0.renewals,
        "the server saw them all"
    );
    assert!(
        renewals <= n * rounds,
        "{renewals} renewals in {rounds} rounds"
    );
    assert!(
        renewals >= n * (rounds - 1),
        "{renewals} renewals in {rounds} rounds"
    );
    assert!(held.iter().all(|l| l.state() == State::Held));
    assert_eq!(leases.live(), n as usize);
    leases.close().await;
    assert!(
        held.iter().all(|l| l.state() == State::Lost),
        "close() loses held leases"
    );
    assert_ne!(
        lease_state(&mut admin, &keys[0]).await,
        "held",
        "and releases them"
    );
});

/// The watchdog's counters and the server's count of `LEASE.RENEW` calls, read when the
/// server has answered every renewal sent (not while a round is on its way).
async fn settled(
    leases: &Leases,
    admin: &mut redis::aio::MultiplexedConnection,
) -> (WatchdogStats, u64) {
    let start = Instant::now();
    loop {
        let stats = leases.stats();
        let calls = renew_calls(admin).await;
        if calls == stats.renewals && leases.stats() == stats {
            return (stats, calls);
        }
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{calls} calls, {stats:?}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

for_each_server!(suspended_then_lost_when_the_server_stops, |flavor| {
    let server = Server::start(flavor);
    let leases = Leases::connect(server.client()).await.unwrap();
    let ttl = Duration::from_millis(600);
    let lease = leases.acquire(key(flavor, "frozen"), ttl).await.unwrap();
    eventually(ttl, "a renewal", || async { lease.renewals() >= 1 }).await;
    let frozen = Instant::now();
    server.freeze();
    let remaining = lease.remaining().unwrap();
    eventually(ttl, "suspended", || async {
        lease.state() == State::Suspended
    })
    .await;
    let suspended = frozen.elapsed();
    assert!(
        suspended < remaining,
        "suspended at {suspended:?}, before the deadline"
    );
    tokio::time::timeout(ttl * 2, lease.lost())
        .await
        .expect("lost");
    let lost = frozen.elapsed();
    assert_eq!(lease.state(), State::Lost);
    // Lost at the deadline last confirmed, not before (5 ms: timer granularity).
    assert!(
        lost + Duration::from_millis(5) >= remaining,
        "lost at {lost:?}, deadline {remaining:?}"
    );
    assert!(
        lost <= remaining + Duration::from_millis(150),
        "lost at {lost:?}, deadline {remaining:?}"
    );
    server.thaw();
    // The server answers again (the renewals queued while it was stopped come too late);
    // the lease stays lost.
    let mut admin = server.admin().await;
    let _: String = redis::cmd("PING").query_async(&mut admin).await.unwrap();
    let rounds = leases.stats().rounds;
    tokio::time::sleep(ttl / 2).await;
    assert_eq!(leases.stats().rounds, rounds, "nothing left to renew");
    assert_eq!(lease.state(), State::Lost);
    assert!(matches!(
        lease.release().await,
        Err(Error::LeaseLost { .. })
    ));
    leases.close().await;
});

for_each_server!(caps_stop_the_renewals, |flavor| {
    let server = Server::start(flavor);
    let leases = Leases::connect(server.client()).await.unwrap();
    let ttl = Duration::from_millis(300);
    let start = Instant::now();
    let capped = leases
        .acquire(key(flavor, "max-renewals"), ttl)
        .max_renewals(2)
        .await
        .unwrap();
    let held = leases
        .acquire(key(flavor, "max-hold"), ttl)
        .max_hold(Duration::from_millis(700))
        .await
        .unwrap();
    tokio::time::timeout(ttl * 4, capped.lost())
        .await
        .expect("lost after 2 renewals");
    assert_eq!(capped.renewals(), 2);
    tokio::time::timeout(ttl * 4, held.lost())
        .await
        .expect("lost within max_hold");
    assert!(start.elapsed() <= Duration::from_millis(700) + ttl / 3);
    leases.close().await;
});
