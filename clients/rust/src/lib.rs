//! Async client for the redis-lease module: leases with fencing tokens, renewed by one
//! watchdog task, with a loss signal the code can wait on.
//!
//! ```no_run
//! use std::time::Duration;
//! use redis_lease_client::{Leases, Error};
//!
//! # async fn run() -> Result<(), Error> {
//! let leases = Leases::connect(redis::Client::open("redis://127.0.0.1/")?).await?;
//!
//! // Scoped: released at the end; Err(LeaseLost) if it was lost while the body ran.
//! leases
//!     .with_lease("lock:report", Duration::from_secs(10), |lease| async move {
//!         let write = redis::cmd("HSET").arg("report").arg("total").arg(42).clone();
//!         lease.fence_call::<i64>("fence:report", &write).await?;
//!         Ok::<_, Error>(())
//!     })
//!     .await?;
//!
//! // By hand: renewed by the watchdog until released (or dropped: released in the
//! // background).
//! let lease = leases.acquire("lock:job", Duration::from_secs(5)).block(Duration::from_secs(2)).await?;
//! tokio::select! {
//!     () = lease.lost() => eprintln!("lost {}; stopping", lease.key()),
//!     () = tokio::time::sleep(Duration::from_secs(1)) => lease.release().await?,
//! }
//! leases.close().await;
//! # Ok(()) }
//! ```
//!
//! A lease is [`State::Held`], [`State::Suspended`] (its renewal went unanswered: still
//! held until its deadline as last confirmed), [`State::Lost`] or [`State::Released`];
//! see [`State`] for the diagram.
//!
//! - Topologies: a server ([`Leases::connect`]), a cluster ([`Leases::connect_cluster`]),
//!   Sentinel ([`Leases::connect_sentinel`] with a [`SentinelConnection`], asked for the
//!   master before every renewal round).
//! - Fenced writes ([`Lease::fence_call`]) are sent once and wait no longer than the
//!   lease's time left: no reply in time is [`Error::WriteIndeterminate`], never resent
//!   unless asked ([`Lease::fence_call_retrying`]).
//! - Confirmed grants ([`Confirm`]): `WAIT` or `WAITAOF` in the same pipeline as the
//!   acquire and every renewal; an unconfirmed renewal is a loss.
//! - Named types: [`ReadWriteLock`] and [`Semaphore`]; a [`Lease`] is the guard
//!   (dropping its last clone releases it in the background).
//!
//! The README has the rest.

#![warn(missing_docs)]

mod confirm;
mod connection;
mod error;
mod fenced;
mod lease;
mod leases;
mod locks;
mod sentinel;
mod watchdog;

pub use confirm::{Confirm, Confirmed};
pub use connection::{Connect, Connection};
pub use error::{Error, Result};
pub use lease::{Lease, Session, State};
pub use leases::{Acquire, Leases, SessionBuilder, WatchdogStats};
pub use locks::{ReadWriteLock, Semaphore};
pub use sentinel::SentinelConnection;
pub use tokio_util::sync::CancellationToken;
