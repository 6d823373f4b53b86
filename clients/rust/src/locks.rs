//! Named types over the module's shared holds: a read/write lock (`SHARED` readers, an
//! exclusive writer) and a semaphore (`SHARED LIMIT permits`).
//!
//! Each hands out [`Lease`]s, which are the guards: renewed by the watchdog while held,
//! released by [`Lease::release`], or in the background when the last clone is dropped.
//! The closure forms (`with_read`, `with_write`, `with_permit`) release on every way out
//! and return `Err(LeaseLost)` if the hold was lost while the body ran, as
//! [`Leases::with_lease`] does.

use std::future::Future;
use std::time::Duration;

use crate::error::Error;
use crate::lease::Lease;
use crate::leases::{Acquire, Leases};

/// A read/write lock on one key: many readers at once, or one writer.
///
/// Waiting (`.block(timeout)` on the acquire) is first come, first served across both
/// kinds, and a reader that does not wait never takes a hold a writer is queued for: a
/// steady stream of readers cannot starve a waiting writer.
///
/// ```no_run
/// # use std::time::Duration;
/// # async fn f(leases: redis_lease_client::Leases) -> redis_lease_client::Result<()> {
/// let lock = leases.read_write_lock("lock:catalog");
/// let reader = lock.read(Duration::from_secs(10)).await?; // a guard: a Lease
/// // ... read ...
/// reader.release().await?;
/// lock.with_write(Duration::from_secs(10), |writer| async move {
///     writer
///         .fence_call::<()>("fence:catalog", redis::cmd("SET").arg("catalog").arg("v2"))
///         .await
/// })
/// .await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ReadWriteLock {
    leases: Leases,
    key: String,
}

impl ReadWriteLock {
    pub(crate) fn new(leases: Leases, key: String) -> ReadWriteLock {
        ReadWriteLock { leases, key }
    }

    /// The lock's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// A read hold (`SHARED`): an [`Acquire`] to set options on (`.block(timeout)`) and
    /// await. `Err(NotAcquired)` while a writer holds the key or waits for it.
    pub fn read(&self, ttl: Duration) -> Acquire<'_> {
        self.leases.acquire(self.key.clone(), ttl).shared()
    }

    /// The write hold (exclusive). `Err(NotAcquired)` while any hold is live.
    pub fn write(&self, ttl: Duration) -> Acquire<'_> {
        self.leases.acquire(self.key.clone(), ttl)
    }

    /// Runs `body` under a read hold, then releases it (see [`Leases::with_lease`]).
    pub async fn with_read<F, Fut, T, E>(&self, ttl: Duration, body: F) -> Result<T, E>
    where
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: From<Error>,
    {
        self.read(ttl).with_lease(body).await
    }

    /// Runs `body` under the write hold, then releases it (see [`Leases::with_lease`]).
    pub async fn with_write<F, Fut, T, E>(&self, ttl: Duration, body: F) -> Result<T, E>
    where
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: From<Error>,
    {
        self.write(ttl).with_lease(body).await
    }
}

/// A semaphore: at most `permits` holds of one key at once (`SHARED LIMIT permits`).
///
/// Everyone using the key must state the same number of permits while it has holders or
/// waiters: another number is the server's `ERR LIMIT does not match` (`Error::Redis`).
///
/// ```no_run
/// # use std::time::Duration;
/// # async fn f(leases: redis_lease_client::Leases) -> redis_lease_client::Result<()> {
/// let pool = leases.semaphore("sem:exports", 4);
/// let permit = pool.acquire(Duration::from_secs(30)).block(Duration::from_secs(5)).await?;
/// // ... one of at most four exports ...
/// drop(permit); // released in the background
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Semaphore {
    leases: Leases,
    key: String,
    permits: u32,
}

impl Semaphore {
    pub(crate) fn new(leases: Leases, key: String, permits: u32) -> Semaphore {
        Semaphore {
            leases,
            key,
            permits,
        }
    }

    /// The semaphore's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// How many holds it allows at once.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// One permit: an [`Acquire`] to set options on (`.block(timeout)`) and await.
    /// `Err(NotAcquired)` while every permit is held (or waited for).
    pub fn acquire(&self, ttl: Duration) -> Acquire<'_> {
        self.leases
            .acquire(self.key.clone(), ttl)
            .limit(self.permits)
    }

    /// Runs `body` holding a permit, then releases it (see [`Leases::with_lease`]).
    pub async fn with_permit<F, Fut, T, E>(&self, ttl: Duration, body: F) -> Result<T, E>
    where
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: From<Error>,
    {
        self.acquire(ttl).with_lease(body).await
    }
}
