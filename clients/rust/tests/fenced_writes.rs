//! A fenced write is sent once and waited for no longer than the lease's time left: a
//! server that stalls or restarts while it is in flight makes it indeterminate
//! (`WriteIndeterminate`, not a refusal, not a plain timeout) by the lease's deadline,
//! and nothing sends it again afterwards, unless the call asked for retries.

mod common;

use std::time::{Duration, Instant};

use common::{
    command_calls, eventually, fenced_write_across_a_restart, held_again_and_renewed, key, Server,
};
use redis_lease_client::{Error, Leases, State};

/// Big enough to stand out among a stopped server's unread bytes (a renewal is under 100).
fn body() -> String {
    "x".repeat(2000)
}

async fn list(server: &Server, key: &str) -> Vec<String> {
    let mut admin = server.admin().await;
    redis::cmd("LRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .query_async(&mut admin)
        .await
        .unwrap()
}

async fn fence_calls(server: &Server) -> u64 {
    command_calls(&mut server.admin().await, "lease.fence").await
}

async fn reset_stats(server: &Server) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut server.admin().await)
        .await
        .unwrap();
}

for_each_server!(
    write_to_a_stalled_server_is_indeterminate_by_the_deadline,
    |flavor| {
        let server = Server::start(flavor);
        let leases = Leases::connect(server.client()).await.unwrap();
        let ttl = Duration::from_millis(600);
        let k = key(flavor, "stalled");
        let log = format!("{k}:log");
        let lease = leases.acquire(&k, ttl).await.unwrap();
        // The fenced writes' connection is open before the stall (a stall before anything
        // was sent would be no indeterminate write: nothing would have run).
        let _: u64 = lease
            .fence_call(&format!("fence:{k}"), &redis::Cmd::new())
            .await
            .unwrap();
        eventually(Duration::from_secs(3), "a first renewal", || async {
            lease.renewals() >= 1
        })
        .await;
        reset_stats(&server).await;
        server.freeze();
        let left = lease.remaining().unwrap();
        let started = Instant::now();
        let write = redis::cmd("RPUSH").arg(&log).arg(body()).clone();
        let outcome = lease.fence_call::<i64>(&format!("fence:{k}"), &write).await;
        let took = started.elapsed();
        let state = lease.state();
        server.thaw();
        match outcome {
            Err(Error::WriteIndeterminate {
                attempts, fence, ..
            }) => {
                assert_eq!(attempts, 1);
                assert_eq!(fence, lease.fence());
            }
            other => panic!("expected WriteIndeterminate, got {other:?}"),
        }
        // It waited until the deadline, not past it (margin for a loaded machine), and the
        // lease was lost by then: the loss signal had fired when the call returned.
        assert!(
            took <= left + Duration::from_millis(500),
            "{took:?} vs {left:?}"
        );
        assert_eq!(state, State::Lost);
        tokio::time::timeout(Duration::from_millis(1), lease.lost())
            .await
            .expect("the loss signal fired");
        // The request was in the stopped server's socket when the client gave up: it runs once
        // the server wakes (it was sent before the loss), and only once: nothing resends it.
        eventually(Duration::from_secs(5), "the late write", || async {
            fence_calls(&server).await >= 1
        })
        .await;
        tokio::time::sleep(ttl * 2).await;
        assert_eq!(fence_calls(&server).await, 1);
        assert_eq!(list(&server, &log).await, vec![body()]);
        // A lost lease sends nothing more.
        assert!(matches!(
            lease.fence_call::<i64>(&format!("fence:{k}"), &write).await,
            Err(Error::LeaseLost { .. })
        ));
        assert_eq!(fence_calls(&server).await, 1);
        leases.close().await;
    }
);

/// A lease with time to spare; the server stops with the fenced write unread in its
/// socket, is killed and restarted from its AOF (the lease and the resource record
/// survive; the write never ran). Returns the write's outcome.
async fn write_across_a_restart(
    server: &mut Server,
    leases: &Leases,
    k: &str,
    retries: u32,
) -> (redis_lease_client::Lease, redis_lease_client::Result<i64>) {
    let lease = leases.acquire(k, Duration::from_secs(5)).await.unwrap();
    // The record exists, with this lease's fence, before the restart.
    let _: u64 = lease
        .fence_call(&format!("fence:{k}"), &redis::Cmd::new())
        .await
        .unwrap();
    eventually(Duration::from_secs(5), "a first renewal", || async {
        lease.renewals() >= 1
    })
    .await;
    let write = redis::cmd("RPUSH")
        .arg(format!("{k}:log"))
        .arg(body())
        .clone();
    let outcome =
        fenced_write_across_a_restart(server, &lease, &format!("fence:{k}"), write, retries).await;
    (lease, outcome)
}

fn durable(flavor: common::Flavor) -> Server {
    Server::start_with(flavor, &[("appendonly", "yes"), ("appendfsync", "always")])
}

for_each_server!(
    restart_during_a_fenced_write_is_indeterminate_and_not_resent,
    |flavor| {
        let mut server = durable(flavor);
        let leases = Leases::connect(server.client()).await.unwrap();
        let k = key(flavor, "restart");
        let (lease, outcome) = write_across_a_restart(&mut server, &leases, &k, 0).await;
        assert!(
            matches!(outcome, Err(Error::WriteIndeterminate { attempts: 1, .. })),
            "{outcome:?}"
        );
        // The lease survived the restart: suspended by the failed write, held again once
        // the watchdog's renewal is confirmed; well past several renewals, the write was
        // never sent again.
        held_again_and_renewed(&lease).await;
        assert_eq!(fence_calls(&server).await, 0);
        assert!(list(&server, &format!("{k}:log")).await.is_empty());
        lease.release().await.unwrap();
        leases.close().await;
    }
);

for_each_server!(retries_resend_a_fenced_write_only_when_asked, |flavor| {
    let mut server = durable(flavor);
    let leases = Leases::connect(server.client()).await.unwrap();
    let k = key(flavor, "retried");
    // Each retry waits 250 ms (a tenth of the ttl, at most 250 ms): twenty leave the
    // restarted server time to answer.
    let (lease, outcome) = write_across_a_restart(&mut server, &leases, &k, 20).await;
    assert_eq!(outcome.unwrap(), 1);
    assert_eq!(fence_calls(&server).await, 1);
    assert_eq!(list(&server, &format!("{k}:log")).await, vec![body()]);
    eventually(Duration::from_secs(4), "held again", || async {
        lease.state() == State::Held
    })
    .await;
    lease.release().await.unwrap();
    leases.close().await;
});

for_each_server!(scoped_form_passes_an_indeterminate_write_on, |flavor| {
    let server = Server::start(flavor);
    let leases = Leases::connect(server.client()).await.unwrap();
    let k = key(flavor, "scoped");
    let resource = format!("fence:{k}");
    let result = leases
        .with_lease(&k, Duration::from_millis(600), |lease| {
            let server = &server;
            let resource = resource.clone();
            async move {
                let _: u64 = lease.fence_call(&resource, &redis::Cmd::new()).await?;
                server.freeze();
                let write = redis::cmd("SET").arg("x").arg(1).clone();
                let outcome = lease.fence_call::<()>(&resource, &write).await;
                server.thaw();
                outcome
            }
        })
        .await;
    // Not LeaseLost, though the lease was lost by the time the write gave up.
    assert!(
        matches!(result, Err(Error::WriteIndeterminate { attempts: 1, .. })),
        "{result:?}"
    );
    leases.close().await;
});
