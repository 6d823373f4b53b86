use std::collections::HashMap;
use std::future::{Future, IntoFuture};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use redis::aio::ConnectionManager;
use redis::cluster::ClusterClient;
use redis::{RedisError, RedisResult};
use tokio::runtime::Handle as Runtime;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::confirm::{self, Confirm, Confirmed};
use crate::connection::{key_slot, Conn, Connect, Connection};
use crate::error::{Error, Result};
use crate::fenced::{FenceConn, Unanswered};
use crate::lease::{period, renew_cmd, ttl_ms, Caps, Core, Lease, Session};
use crate::locks::{ReadWriteLock, Semaphore};
use crate::sentinel::SentinelConnection;
use crate::watchdog;

/// How long a release sent in the background (a dropped lease, `close()`) may take.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);
/// How much longer than its `BLOCK` wait a blocking acquire's connection waits for the
/// reply.
const BLOCK_SLACK: Duration = Duration::from_secs(5);

/// The lease client: one per application (or per connection), cheap to clone.
///
/// Acquires leases on the connection it was given, and runs **one watchdog task** (for
/// all its clones) that renews every held lease at a third of its ttl, pipelining the
/// renewals that fall due together. See the crate docs for the states a lease goes
/// through.
#[derive(Clone)]
pub struct Leases {
    shared: Arc<Shared>,
}

/// What a `Leases`, its clones and its leases share. The watchdog holds it weakly: it
/// ends when the last handle is gone (or at `close()`).
pub(crate) struct Shared {
    pub(crate) conn: Conn,
    blocking: OnceLock<Box<dyn Connect>>,
    /// Where fenced writes open their connection, when not through `blocking`.
    fencing: OnceLock<Box<dyn Connect>>,
    registry: Mutex<Registry>,
    next_id: AtomicU64,
    pub(crate) wake: Arc<Notify>,
    stop: CancellationToken,
    tasks: TaskTracker,
    runtime: OnceLock<Runtime>,
    pub(crate) stats: Arc<Stats>,
    fenced: FenceConn,
    confirm: OnceLock<Confirm>,
}

#[derive(Default)]
pub(crate) struct Registry {
    closed: bool,
    pub(crate) leases: HashMap<u64, Arc<Core>>,
}

/// Counters of the watchdog's work, under one lock so that a reading is one moment's.
#[derive(Default, Debug)]
pub(crate) struct Stats(Mutex<WatchdogStats>);

impl Stats {
    pub(crate) fn update(&self, f: impl FnOnce(&mut WatchdogStats)) {
        f(&mut self.0.lock().unwrap_or_else(|e| e.into_inner()));
    }

    fn get(&self) -> WatchdogStats {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What the watchdog has sent so far ([`Leases::stats`]).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WatchdogStats {
    /// Renewal rounds: each sends every renewal due (or due within a sixth of its ttl)
    /// at once.
    pub rounds: u64,
    /// Pipelines those rounds sent: one per round, or on a cluster one per hash slot.
    pub pipelines: u64,
    /// `LEASE.RENEW` commands sent.
    pub renewals: u64,
    /// Pipelines that failed or went unanswered in time (their leases were suspended).
    pub failures: u64,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Shared {
    pub(crate) fn registry(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// No longer watched (released or lost).
    pub(crate) fn forget(&self, id: u64) {
        self.registry().leases.remove(&id);
    }

    /// The watchdog, started on the first acquire (a runtime is running then).
    fn start(self: &Arc<Self>) {
        let runtime = match Runtime::try_current() {
            Ok(runtime) => runtime,
            Err(_) => return,
        };
        if self.runtime.set(runtime.clone()).is_ok() {
            self.tasks.spawn_on(
                watchdog::run(
                    Arc::downgrade(self),
                    self.stop.clone(),
                    Arc::clone(&self.wake),
                    Arc::clone(&self.stats),
                ),
                &runtime,
            );
        }
    }

    /// One fenced write, sent once (see [`Lease::fence_call`]).
    pub(crate) async fn send_fenced(
        &self,
        cmd: &redis::Cmd,
        within: Option<Duration>,
    ) -> std::result::Result<RedisResult<redis::Value>, Unanswered> {
        let connect = self
            .fencing
            .get()
            .or_else(|| self.blocking.get())
            .map(|c| &**c);
        self.fenced
            .send_once(connect, &self.conn, cmd, within)
            .await
    }

    /// `LEASE.RELEASE key token` in a task of its own, never waited for here.
    pub(crate) fn release_in_background(&self, key: String, token: String) {
        let Some(runtime) = self.runtime.get() else {
            return;
        };
        let mut conn = self.conn.clone();
        // A runtime that is shutting down refuses the task: the lease then expires.
        self.tasks.spawn_on(
            async move {
                let mut cmd = redis::cmd("LEASE.RELEASE");
                cmd.arg(&key).arg(&token);
                let release = cmd.query_async::<i64>(&mut conn);
                let _ = tokio::time::timeout(RELEASE_TIMEOUT, release).await;
            },
            runtime,
        );
    }
}

impl Leases {
    /// Leases on `conn`: a [`ConnectionManager`], a `MultiplexedConnection` or a cluster
    /// `ClusterConnection`. Blocking acquires need [`Leases::blocking_client`] too (or
    /// build with [`Leases::connect`] / [`Leases::connect_cluster`]).
    pub fn new(conn: impl Connection) -> Leases {
        Leases {
            shared: Arc::new(Shared {
                conn: Conn::new(Box::new(conn)),
                blocking: OnceLock::new(),
                fencing: OnceLock::new(),
                registry: Mutex::new(Registry::default()),
                next_id: AtomicU64::new(1),
                wake: Arc::new(Notify::new()),
                stop: CancellationToken::new(),
                tasks: TaskTracker::new(),
                runtime: OnceLock::new(),
                stats: Arc::new(Stats::default()),
                fenced: FenceConn::default(),
                confirm: OnceLock::new(),
            }),
        }
    }

    /// Where blocking acquires ([`Acquire::block`]) open their connection: a
    /// [`redis::Client`] or a [`ClusterClient`] for the same server. (A blocked command
    /// would hold up the watchdog's renewals on the shared connection.) Set once; a
    /// second call is ignored.
    pub fn blocking_client(self, client: impl Connect) -> Leases {
        let _ = self.shared.blocking.set(Box::new(client));
        self
    }

    /// Where fenced writes ([`Lease::fence_call`]) open their connection, instead of the
    /// blocking client. For a cluster: a [`ClusterClient`] built with
    /// `ClusterClientBuilder::retries(0)`. A cluster connection resends a request whose
    /// connection failed as often as its client's retries allow (16 by default), and a
    /// fenced write must not be resent behind the caller's back; without retries a
    /// `MOVED` or `ASK` comes back as a reply (the write did not run), and `fence_call`
    /// sends it again itself, at most 4 times. Set once; a second call is ignored.
    pub fn fenced_writes_client(self, client: impl Connect) -> Leases {
        let _ = self.shared.fencing.set(Box::new(client));
        self
    }

    /// Confirm every grant and renewal of this client ([`Confirm`]: `WAIT` or `WAITAOF`
    /// in the same pipeline), unless an acquire says otherwise ([`Acquire::confirm`]).
    /// Set once; a second call is ignored.
    pub fn confirm(self, confirm: Confirm) -> Leases {
        let _ = self.shared.confirm.set(confirm);
        self
    }

    /// Leases on a [`ConnectionManager`] for `client`, with `client` for blocking
    /// acquires.
    pub async fn connect(client: redis::Client) -> RedisResult<Leases> {
        let conn = ConnectionManager::new(client.clone()).await?;
        Ok(Leases::new(conn).blocking_client(client))
    }

    /// Leases on a cluster connection from `client`, with `client` for blocking
    /// acquires. Keys bound together (a session and its holds, a resource and the keys
    /// its fenced command writes) must share a hash slot: use hash tags, `{job7}lock`.
    /// Give fenced writes a client without retries ([`Leases::fenced_writes_client`]),
    /// or a write whose node fails may be resent by the cluster connection.
    pub async fn connect_cluster(client: ClusterClient) -> RedisResult<Leases> {
        let conn = client.get_async_connection().await?;
        Ok(Leases::new(conn).blocking_client(client))
    }

    /// Leases on the master a set of Sentinels name ([`SentinelConnection`]), which the
    /// watchdog asks again before every renewal round: the renewals follow a failover.
    /// Blocking acquires and fenced writes open their connections to the master named
    /// last.
    pub fn connect_sentinel(conn: SentinelConnection) -> Leases {
        Leases::new(conn.clone()).blocking_client(conn)
    }

    /// Starts an acquire of `key` for `ttl` (whole milliseconds; zero only with
    /// [`Acquire::session`]). Await it for a [`Lease`], or call
    /// [`Acquire::with_lease`].
    pub fn acquire(&self, key: impl Into<String>, ttl: Duration) -> Acquire<'_> {
        Acquire {
            leases: self,
            key: key.into(),
            ttl,
            block: None,
            token: None,
            shared: false,
            limit: None,
            session: None,
            owner: None,
            delay: None,
            caps: Caps::default(),
            confirm: None,
        }
    }

    /// Acquires `key`, runs `body` with the lease, then releases it, whatever the body
    /// returned. `Err(NotAcquired)` if the key is held; `Err(LeaseLost)` if the lease was
    /// lost while the body ran (a `StaleFence` from [`Lease::fence_call`] counts), even
    /// if the body did not notice and returned `Ok`; else the body's result.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn f(leases: redis_lease_client::Leases) -> redis_lease_client::Result<()> {
    /// leases
    ///     .with_lease("lock:report", Duration::from_secs(10), |lease| async move {
    ///         let cmd = redis::cmd("SET").arg("report").arg("done").clone();
    ///         lease.fence_call::<()>("fence:report", &cmd).await
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn with_lease<F, Fut, T, E>(
        &self,
        key: impl Into<String>,
        ttl: Duration,
        body: F,
    ) -> std::result::Result<T, E>
    where
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = std::result::Result<T, E>>,
        E: From<Error>,
    {
        self.acquire(key, ttl).with_lease(body).await
    }

    /// A read/write lock on `key` ([`ReadWriteLock`]: `read()` shared, `write()`
    /// exclusive).
    pub fn read_write_lock(&self, key: impl Into<String>) -> ReadWriteLock {
        ReadWriteLock::new(self.clone(), key.into())
    }

    /// A semaphore of `permits` holds on `key` ([`Semaphore`]).
    pub fn semaphore(&self, key: impl Into<String>, permits: u32) -> Semaphore {
        Semaphore::new(self.clone(), key.into(), permits)
    }

    /// Starts an acquire of a session for `ttl`: a lease that holds bound with
    /// [`Acquire::session`] live as long as (the watchdog renews the session alone).
    pub fn session(&self, ttl: Duration) -> SessionBuilder<'_> {
        SessionBuilder {
            acquire: self.acquire(String::new(), ttl),
        }
    }

    /// Counters of the watchdog's work.
    pub fn stats(&self) -> WatchdogStats {
        self.shared.stats.get()
    }

    /// Tasks of this client still running: the watchdog (from the first acquire until
    /// `close()`) and releases sent in the background. Zero after `close()`.
    pub fn tasks(&self) -> usize {
        self.shared.tasks.len()
    }

    /// Leases held or suspended.
    pub fn live(&self) -> usize {
        self.shared
            .registry()
            .leases
            .values()
            .filter(|c| c.state().is_live())
            .count()
    }

    /// Stops the watchdog and every task of this client, and refuses further acquires
    /// (`Err(Closed)`). A lease still held is lost (its signal fires; a scoped form
    /// returns `LeaseLost`) and released on the server. Returns once no task of the
    /// client is left (the watchdog, background releases). Closing again does nothing.
    pub async fn close(&self) {
        let shared = &self.shared;
        let live: Vec<Arc<Core>> = {
            let mut registry = shared.registry();
            registry.closed = true;
            registry.leases.drain().map(|(_, core)| core).collect()
        };
        let live: Vec<Arc<Core>> = live.into_iter().filter(|c| c.state().is_live()).collect();
        for core in &live {
            core.mark_lost();
        }
        if !live.is_empty() {
            let releases = groups(&shared.conn, live).into_iter().map(|group| {
                let mut conn = shared.conn.clone();
                async move {
                    let mut pipe = redis::pipe();
                    pipe.ignore_errors();
                    for core in &group {
                        pipe.cmd("LEASE.RELEASE").arg(&core.key).arg(&core.token);
                    }
                    let release = pipe.query_async::<Vec<RedisResult<i64>>>(&mut conn);
                    let _ = tokio::time::timeout(RELEASE_TIMEOUT, release).await;
                }
            });
            futures_util::future::join_all(releases).await;
        }
        shared.stop.cancel();
        shared.tasks.close();
        shared.tasks.wait().await;
    }

    fn register(&self, core: &Arc<Core>) -> bool {
        let mut registry = self.shared.registry();
        if registry.closed {
            return false;
        }
        registry.leases.insert(core.id, Arc::clone(core));
        drop(registry);
        self.shared.wake.notify_one();
        true
    }
}

/// The renewals or releases of `cores`, split into the pipelines `conn` can take: one,
/// or one per hash slot on a cluster.
pub(crate) fn groups(conn: &Conn, cores: Vec<Arc<Core>>) -> Vec<Vec<Arc<Core>>> {
    if !conn.is_cluster() {
        return vec![cores];
    }
    let mut by_slot: HashMap<u16, Vec<Arc<Core>>> = HashMap::new();
    for core in cores {
        by_slot
            .entry(key_slot(core.key.as_bytes()))
            .or_default()
            .push(core);
    }
    by_slot.into_values().collect()
}

/// An acquire being set up: `leases.acquire(key, ttl)`, then options, then `.await`
/// (or [`Acquire::with_lease`]).
#[must_use = "an acquire does nothing until awaited"]
pub struct Acquire<'a> {
    leases: &'a Leases,
    key: String,
    ttl: Duration,
    block: Option<Duration>,
    token: Option<String>,
    shared: bool,
    limit: Option<u32>,
    session: Option<Arc<Core>>,
    owner: Option<String>,
    delay: Option<Duration>,
    caps: Caps,
    confirm: Option<Confirm>,
}

impl<'a> Acquire<'a> {
    /// Confirm this grant and each of its renewals ([`Confirm`]), instead of the
    /// client's setting ([`Leases::confirm`]).
    pub fn confirm(mut self, confirm: Confirm) -> Self {
        self.confirm = Some(confirm);
        self
    }

    /// Wait up to `timeout` for the key (`BLOCK`), first come first served; zero waits
    /// for ever. `Err(NotAcquired)` if the wait ends first. Runs on a connection of its
    /// own ([`Leases::blocking_client`]).
    pub fn block(mut self, timeout: Duration) -> Self {
        self.block = Some(timeout);
        self
    }

    /// Acquire with this token instead of a random 128-bit one. The same token asking
    /// again is the idempotent retry: the same fence, the deadline renewed.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// A shared hold (`SHARED`): many at once, while no exclusive one is live.
    pub fn shared(mut self) -> Self {
        self.shared = true;
        self
    }

    /// At most `n` shared holds at once (`SHARED LIMIT n`, a semaphore); implies
    /// [`Acquire::shared`].
    pub fn limit(mut self, n: u32) -> Self {
        self.shared = true;
        self.limit = Some(n);
        self
    }

    /// Bind the hold to `session` (`SESSION`): it lives while the session does (and, with
    /// a non-zero ttl, while its own deadline has not passed: the watchdog then renews
    /// it as well). In a cluster the key and the session key must share a slot.
    pub fn session(mut self, session: &Session) -> Self {
        self.session = Some(Arc::clone(session.lease().core_arc()));
        self
    }

    /// A label for the holder, shown by `LEASE.INFO` and `LEASE.HOLDERS` (`OWNER`).
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }

    /// Lock-delay (`DELAY`): if this exclusive hold expires rather than being released,
    /// nobody gets the key until `delay` after.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self
    }

    /// The watchdog renews the lease at most `n` times; after that it runs out at its
    /// deadline (lost).
    pub fn max_renewals(mut self, n: u64) -> Self {
        self.caps.max_renewals = Some(n);
        self
    }

    /// The watchdog never renews the lease past `max` after it was acquired: it is lost
    /// at the last deadline that stays within.
    pub fn max_hold(mut self, max: Duration) -> Self {
        self.caps.max_hold = Some(max);
        self
    }

    /// Acquires, runs `body` with the lease, releases it: see [`Leases::with_lease`].
    pub async fn with_lease<F, Fut, T, E>(self, body: F) -> std::result::Result<T, E>
    where
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = std::result::Result<T, E>>,
        E: From<Error>,
    {
        let lease = self.await?;
        let result = body(lease.clone()).await;
        if !lease.state().is_live() && lease.state() != crate::State::Released {
            // The server may hold it a moment longer than counted here: let it go.
            let _ = lease.release().await;
            // A write whose outcome is unknown says more than the loss that followed it.
            let indeterminate = lease.core_arc().indeterminate.load(Ordering::Relaxed);
            if indeterminate && result.is_err() {
                return result;
            }
            return Err(lease.lost_error().into());
        }
        match lease.release().await {
            Err(lost @ Error::LeaseLost { .. }) => Err(lost.into()),
            // A connection error: the lease is released in the background when `lease`,
            // the last handle unless the body kept one, is dropped below.
            Ok(()) | Err(_) => result,
        }
    }

    fn command(&self, token: &str) -> redis::Cmd {
        let mut cmd = redis::cmd("LEASE.ACQUIRE");
        cmd.arg(&self.key)
            .arg(ttl_ms(self.ttl))
            .arg("TOKEN")
            .arg(token);
        if let Some(block) = self.block {
            cmd.arg("BLOCK").arg(ttl_ms(block));
        }
        if self.shared {
            cmd.arg("SHARED");
            if let Some(limit) = self.limit {
                cmd.arg("LIMIT").arg(limit);
            }
        }
        if let Some(session) = &self.session {
            cmd.arg("SESSION").arg(&session.key).arg(&session.token);
        }
        if let Some(owner) = &self.owner {
            cmd.arg("OWNER").arg(owner);
        }
        if let Some(delay) = self.delay {
            cmd.arg("DELAY").arg(ttl_ms(delay));
        }
        cmd
    }

    async fn run(self, token: Option<String>) -> Result<Lease> {
        let leases = self.leases;
        let shared = &leases.shared;
        if shared.registry().closed {
            return Err(Error::Closed);
        }
        shared.start();
        let token = token.unwrap_or_else(random_token);
        let cmd = self.command(&token);
        // Whatever happens from here (an error, this future dropped while it waits), a
        // grant that may have been made is released: the token is known.
        let mut pending = PendingGrant {
            shared,
            key: self.key.clone(),
            token: token.clone(),
            armed: true,
        };
        let confirm = self.confirm.or_else(|| shared.confirm.get().copied());
        let mut sent = Instant::now();
        type Granted = (Option<(String, u64)>, Option<RedisResult<Confirmed>>);
        let reply: RedisResult<Granted> = match self.block {
            None => {
                let mut conn = shared.conn.clone();
                let cap = Some(period(self.ttl) / 2);
                match confirm::query(&mut conn, &cmd, confirm.as_ref(), cap).await {
                    // A lost reply: the same token again is the idempotent retry.
                    Err(e) if transient(&e) => {
                        sent = Instant::now();
                        confirm::query(&mut conn, &cmd, confirm.as_ref(), cap).await
                    }
                    reply => reply,
                }
            }
            Some(block) => {
                let Some(connect) = shared.blocking.get() else {
                    pending.armed = false;
                    return Err(Error::NoBlockingConnection);
                };
                let timeout = (!block.is_zero()).then(|| block + BLOCK_SLACK);
                match connect.connect_blocking(timeout).await {
                    // The WAIT runs when the wait has ended, right after the grant.
                    Ok(conn) => {
                        confirm::query(&mut Conn::new(conn), &cmd, confirm.as_ref(), None).await
                    }
                    Err(e) => Err(e),
                }
            }
        };
        let (reply, mut confirmed) = match reply {
            Ok(reply) => reply,
            Err(e) => {
                pending.armed = transient(&e);
                return Err(Error::Redis(e));
            }
        };
        let Some((_, fence)) = reply else {
            pending.armed = false;
            return Err(Error::NotAcquired { key: self.key });
        };
        if self.block.is_some() {
            // The grant came when the wait ended, somewhere between sending and the
            // reply: a renewal sent now dates the deadline.
            sent = Instant::now();
            let mut conn = shared.conn.clone();
            let renew = renew_cmd(&self.key, &token, self.ttl);
            let cap = Some(period(self.ttl) / 2);
            let (renewed, again): (i64, _) =
                confirm::query(&mut conn, &renew, confirm.as_ref(), cap).await?;
            if renewed != 1 {
                pending.armed = false;
                return Err(Error::LeaseLost { key: self.key });
            }
            confirmed = again;
        }
        let confirmed = match (confirm, confirmed) {
            (Some(confirm), Some(Ok(confirmed))) if confirm.met(&confirmed) => Some(confirmed),
            (Some(_), Some(Ok(confirmed))) => {
                // Granted, not confirmed: released (by `pending`) and refused.
                return Err(Error::NotConfirmed {
                    key: self.key,
                    confirmed,
                });
            }
            (Some(_), Some(Err(e))) => return Err(Error::Redis(e)),
            _ => None,
        };
        pending.armed = false;
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        let core = Arc::new(Core::new(
            id,
            self.key.clone(),
            token,
            fence,
            self.ttl,
            sent,
            self.caps,
            self.session.clone(),
            confirm,
        ));
        core.set_confirmed(confirmed);
        let lease = Lease::new(Arc::clone(&core), Arc::clone(shared));
        if !leases.register(&core) {
            // close() ran meanwhile: this grant is lost with the others.
            core.mark_lost();
            shared.release_in_background(core.key.clone(), core.token.clone());
            return Err(Error::Closed);
        }
        Ok(lease)
    }
}

impl<'a> IntoFuture for Acquire<'a> {
    type Output = Result<Lease>;
    type IntoFuture = BoxFuture<'a, Result<Lease>>;

    fn into_future(mut self) -> Self::IntoFuture {
        let token = self.token.take();
        Box::pin(self.run(token))
    }
}

/// A session being set up: `leases.session(ttl)`, then options, then `.await`.
#[must_use = "a session acquire does nothing until awaited"]
pub struct SessionBuilder<'a> {
    acquire: Acquire<'a>,
}

impl<'a> SessionBuilder<'a> {
    /// The session key (default: `lease-session:<token>`). In a cluster, give it the hash
    /// tag of the keys bound to it: `{worker7}session`.
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.acquire.key = key.into();
        self
    }

    /// Acquire the session with this token.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.acquire.token = Some(token.into());
        self
    }

    /// See [`Acquire::owner`].
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.acquire = self.acquire.owner(owner);
        self
    }

    /// See [`Acquire::block`].
    pub fn block(mut self, timeout: Duration) -> Self {
        self.acquire = self.acquire.block(timeout);
        self
    }

    /// See [`Acquire::max_renewals`].
    pub fn max_renewals(mut self, n: u64) -> Self {
        self.acquire = self.acquire.max_renewals(n);
        self
    }

    /// See [`Acquire::max_hold`].
    pub fn max_hold(mut self, max: Duration) -> Self {
        self.acquire = self.acquire.max_hold(max);
        self
    }
}

impl<'a> IntoFuture for SessionBuilder<'a> {
    type Output = Result<Session>;
    type IntoFuture = BoxFuture<'a, Result<Session>>;

    fn into_future(self) -> Self::IntoFuture {
        let mut acquire = self.acquire;
        let token = acquire.token.take().unwrap_or_else(random_token);
        if acquire.key.is_empty() {
            acquire.key = format!("lease-session:{token}");
        }
        Box::pin(async move { acquire.run(Some(token)).await.map(Session::new) })
    }
}

/// Releases a grant whose acquire did not finish (an error, or the future dropped).
struct PendingGrant<'a> {
    shared: &'a Arc<Shared>,
    key: String,
    token: String,
    armed: bool,
}

impl Drop for PendingGrant<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.shared.release_in_background(
                std::mem::take(&mut self.key),
                std::mem::take(&mut self.token),
            );
        }
    }
}

/// An error after which the command may or may not have run: the connection, not the
/// server, failed.
fn transient(e: &RedisError) -> bool {
    e.is_io_error() || e.is_timeout() || e.is_connection_dropped()
}

/// 128 random bits as 32 lowercase hex digits.
fn random_token() -> String {
    format!("{:032x}", rand::random::<u128>())
}
