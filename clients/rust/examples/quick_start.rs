use std::time::Duration;

use redis_lease_client::{Error, Lease, Leases};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    let leases = Leases::connect(redis::Client::open(url)?).await?;

    // Scoped: acquired, renewed while the body runs, released at the end.
    let total = leases
        .with_lease("lock:report", Duration::from_secs(10), |lease| async move {
            // Every write to the protected resource carries the fence.
            let write = redis::cmd("HSET")
                .arg("report")
                .arg("total")
                .arg(42)
                .clone();
            lease.fence_call::<i64>("fence:report", &write).await?;
            Ok::<_, Error>(42)
        })
        .await?; // Err(NotAcquired) if held elsewhere, Err(LeaseLost) if lost meanwhile
    println!("wrote total {total}");

    // By hand, waiting up to 5 s for the key.
    let lease = leases
        .acquire("lock:job", Duration::from_secs(30))
        .block(Duration::from_secs(5))
        .owner("worker-7")
        .await?;
    tokio::select! {
        () = lease.lost() => eprintln!("lost {}: stop, do not write", lease.key()),
        result = do_the_work(&lease) => {
            result?;
            lease.release().await?;
        }
    }

    // A semaphore: at most 4 holders of "sem:exports" at once.
    let exports = leases.semaphore("sem:exports", 4);
    let done = exports
        .with_permit(Duration::from_secs(10), |_permit| async {
            Ok::<_, Error>("exported")
        })
        .await?;
    println!("{done}");

    leases.close().await; // stops the watchdog; no task left
    Ok(())
}

async fn do_the_work(lease: &Lease) -> Result<(), Error> {
    let step = redis::cmd("SET").arg("job:state").arg("done").clone();
    lease.fence_call::<()>("fence:job", &step).await?;
    println!("job done with fence {}", lease.fence());
    Ok(())
}
