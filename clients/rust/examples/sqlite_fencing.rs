//! Fencing a resource that is not Redis: a SQLite table.
//!
//! The table keeps, with each row, the fence of the last write. Every write is one
//! statement that checks it: `UPDATE ... SET ..., fence = ?1 WHERE id = ?2 AND fence <= ?1`.
//! A writer whose lease was taken over carries an older fence than the row has seen, so
//! its update matches no row: nothing changes, and it learns it lost the lease.
//!
//! Worker A writes, pauses past its lease, B takes the lease and writes, A wakes and
//! its write changes nothing. Needs a server with the module (`scripts/start` at the
//! repo root), then `cargo run -p redis-lease-client --example sqlite_fencing`
//! (`REDIS_URL` to point elsewhere).

use std::time::Duration;

use redis_lease_client::{Lease, Leases};
use rusqlite::{params, Connection};

const LOCK: &str = "lock:sqlite-report";
const TTL: Duration = Duration::from_millis(500);

/// One fenced write. Whether it went in: false once a newer holder has written the row
/// (this holder's lease is then gone; stop).
fn write_total(db: &Connection, lease: &Lease, total: i64) -> rusqlite::Result<bool> {
    // Fences are below 2^53: they fit SQLite's 64-bit INTEGER.
    let fence = i64::try_from(lease.fence()).expect("fences are below 2^53");
    let changed = db.execute(
        "UPDATE reports SET total = ?2, fence = ?1 WHERE id = 1 AND fence <= ?1",
        params![fence, total],
    )?;
    Ok(changed == 1)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    let client = redis::Client::open(url)?;
    redis::cmd("DEL")
        .arg(LOCK)
        .exec(&mut client.get_connection()?)?;

    let db = Connection::open_in_memory()?;
    db.execute_batch(
        "CREATE TABLE reports (id INTEGER PRIMARY KEY, total INTEGER, fence INTEGER NOT NULL);
         INSERT INTO reports VALUES (1, 0, 0);",
    )?;

    let a = Leases::connect(client.clone()).await?;
    let b = Leases::connect(client.clone()).await?;

    // A holds the lease and writes, with renewals capped so that, as if it had stalled,
    // the lease runs out while A still has it in hand.
    let lease_a = a.acquire(LOCK, TTL).max_renewals(0).await?;
    assert!(write_total(&db, &lease_a, 10)?);
    println!("A (fence {}) wrote total = 10", lease_a.fence());

    // B waits for the lease, gets it when A's runs out, and writes.
    let lease_b = b.acquire(LOCK, TTL).block(Duration::from_secs(5)).await?;
    assert!(write_total(&db, &lease_b, 42)?);
    println!("B (fence {}) wrote total = 42", lease_b.fence());

    // A, late, writes as if it still held the lease: the row refuses it.
    if write_total(&db, &lease_a, 13)? {
        panic!("a stale write went through");
    }
    println!(
        "A's late write changed nothing (its lease: {:?})",
        lease_a.state()
    );
    lease_b.release().await?;

    let (total, fence): (i64, i64) =
        db.query_row("SELECT total, fence FROM reports WHERE id = 1", [], |row| {
            Ok((row.get(0)?, row.get(1)?))
        })?;
    println!("row: total = {total}, fence = {fence}");
    assert_eq!(total, 42);
    a.close().await;
    b.close().await;
    Ok(())
}
