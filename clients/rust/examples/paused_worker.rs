//! The seed scenario: a worker paused past its lease cannot damage the resource.
//!
//! Worker A takes `lock:report`, writes step 1 of the report through the fence, then
//! stops for three ttls (a stop-the-world pause: its thread, runtime and watchdog all
//! stand still). Its lease runs out; worker B, blocked on the key, gets it with a higher
//! fence and writes the report. A wakes: a write of A's that was on its way when the
//! pause began reaches the server and is refused there (`STALE`: the fence), A's next
//! write is not even sent (its lease reads as lost), and A's scoped form ends in
//! `LeaseLost`.
//!
//! Needs a server with the module: `scripts/start` at the repo root, then
//! `cargo run -p redis-lease-client --example paused_worker` (`REDIS_URL` to point
//! elsewhere).

use std::time::{Duration, Instant};

use redis_lease_client::{Error, Leases};

const LOCK: &str = "lock:report";
const RESOURCE: &str = "fence:report";
const TTL: Duration = Duration::from_secs(1);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    let client = redis::Client::open(url)?;
    let started = Instant::now();
    let log = move |who: &str, what: String| {
        println!("{:>6} ms  {who}: {what}", started.elapsed().as_millis())
    };

    let mut admin = client.get_connection()?;
    redis::cmd("DEL")
        .arg(LOCK)
        .arg(RESOURCE)
        .arg("report")
        .exec(&mut admin)?;

    // Worker A on a thread and runtime of its own, so that its pause stops its
    // watchdog too, as a real process pause would.
    let worker_a = {
        let client = client.clone();
        let raw = client.clone();
        std::thread::spawn(move || -> Result<(), String> {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                let leases = Leases::connect(client).await.map_err(|e| e.to_string())?;
                let result = leases
                    .with_lease(LOCK, TTL, |lease| async move {
                        log("A", format!("holds {LOCK} with fence {}", lease.fence()));
                        let step = redis::cmd("HSET")
                            .arg("report")
                            .arg("step1")
                            .arg("A")
                            .clone();
                        lease.fence_call::<i64>(RESOURCE, &step).await?;
                        log("A", "wrote step1".into());
                        log(
                            "A",
                            format!("pauses for {:?} (GC, swap, a stalled VM)", TTL * 3),
                        );
                        std::thread::sleep(TTL * 3);
                        log("A", format!("wakes; its lease is {:?}", lease.state()));
                        // A write that was on its way when the pause began (sent, not yet
                        // processed) reaches the server only now, with A's fence: refused.
                        let mut conn = raw.get_multiplexed_async_connection().await?;
                        let in_flight: redis::RedisResult<i64> = redis::cmd("LEASE.FENCE")
                            .arg(RESOURCE)
                            .arg(lease.fence())
                            .arg("HSET")
                            .arg("report")
                            .arg("total")
                            .arg("A's stale total")
                            .query_async(&mut conn)
                            .await;
                        match &in_flight {
                            Err(e) => log("A", format!("its in-flight write is refused: {e}")),
                            Ok(_) => log("A", "its in-flight write went through?!".into()),
                        }
                        // The next write through the client is not even sent.
                        let step = redis::cmd("HSET")
                            .arg("report")
                            .arg("total")
                            .arg("A's stale total")
                            .clone();
                        let next = lease.fence_call::<i64>(RESOURCE, &step).await;
                        log("A", format!("its next write: {next:?}"));
                        next.map(|_| ())
                    })
                    .await;
                log("A", format!("with_lease returned {result:?}"));
                leases.close().await;
                match result {
                    Err(Error::LeaseLost { .. }) => Ok(()),
                    other => Err(format!("A should have lost its lease: {other:?}")),
                }
            })
        })
    };

    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        // Let A go first.
        while !redis::cmd("EXISTS").arg(LOCK).query::<bool>(&mut admin)? {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let leases = Leases::connect(client.clone()).await?;
        log("B", format!("waits for {LOCK}"));
        let lease = leases
            .acquire(LOCK, TTL)
            .block(Duration::from_secs(10))
            .await?;
        log("B", format!("holds {LOCK} with fence {}", lease.fence()));
        for (field, value) in [("step1", "B"), ("total", "42")] {
            let write = redis::cmd("HSET")
                .arg("report")
                .arg(field)
                .arg(value)
                .clone();
            lease.fence_call::<i64>(RESOURCE, &write).await?;
        }
        log("B", "wrote the report".into());
        lease.release().await?;
        leases.close().await;
        Ok::<_, Box<dyn std::error::Error>>(())
    })?;

    worker_a.join().expect("worker A")?;
    let report: Vec<(String, String)> = redis::cmd("HGETALL").arg("report").query(&mut admin)?;
    println!("report: {report:?}");
    assert!(
        report.contains(&("total".into(), "42".into())),
        "A's stale write landed"
    );
    println!("the paused worker could not damage the report");
    Ok(())
}
