//! The seed scenario: a worker paused past its lease cannot damage the resource.
//!
//! Worker A takes `lock:report`, writes step 1 of the report through the fence, then
//! stops for three ttls (a stop-the-world pause: its thread, runtime and watchdog all
//! stand still). Its lease runs out; worker B, blocked on the key, gets it with a higher
//! fence and writes the report. A wakes and writes as if it still held the lease: the
//! server refuses the write (`StaleFence`), and A's scoped form ends in `LeaseLost`.
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
                        let step = redis::cmd("HSET")
                            .arg("report")
                            .arg("total")
                            .arg("A's stale total")
                            .clone();
                        match lease.fence_call::<i64>(RESOURCE, &step).await {
                            Err(e @ Error::StaleFence { .. }) => {
                                log("A", format!("write refused: {e}"));
                                Err(e)
                            }
                            other => {
                                log("A", format!("write went through?! {other:?}"));
                                other.map(|_| ())
                            }
                        }
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
