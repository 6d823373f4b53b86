use std::future::Future;
use std::ops::Deref;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use redis::{Arg, Cmd, FromRedisValue};
use tokio_util::sync::CancellationToken;

use crate::confirm::{self, Confirm, Confirmed};
use crate::error::{stale_fence, Error, Result};
use crate::fenced::{is_demoted, retry_delay, Unanswered};
use crate::leases::Shared;

/// Where a lease stands, as this client knows it.
///
/// ```text
///              acquire
///                 │
///                 ▼        renewal failed (no answer, error)
///   ┌────────► HELD ───────────────────────────► SUSPENDED
///   │           │  ▲                                │  │
///   │           │  └──── renewal answered 1 ────────┘  │
///   │           │                                      │ deadline passed
///   │           │ renewal answered 0, STALE fence,     │ (as last confirmed)
///   │           │ session ended, deadline passed,      │
///   │           │ close()                              ▼
///   │           └────────────────────────────────────► LOST
///   │
///   └── release() / drop / scoped form's end, from HELD or SUSPENDED ──► RELEASED
/// ```
///
/// `Lost` and `Released` are final: a lease never comes back from either. A deadline
/// that has passed reads as `Lost` at once, even before the watchdog has run (say, when
/// the whole process was paused).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum State {
    /// Held, its deadline confirmed by the server.
    Held,
    /// The last renewal went unanswered (connection error, timeout, a server error):
    /// perhaps still held, until the deadline last confirmed, measured on this
    /// machine's monotonic clock from when the confirming request was sent. The
    /// watchdog keeps trying; a renewal answered `1` makes it [`State::Held`] again, the
    /// deadline passing makes it [`State::Lost`].
    Suspended,
    /// Ended without its holder releasing it. The loss signal has fired.
    Lost,
    /// Released by its holder (`release()`, dropped, the end of a scoped form).
    Released,
}

impl State {
    /// Held or suspended: the lease may still be live.
    pub fn is_live(self) -> bool {
        matches!(self, State::Held | State::Suspended)
    }
}

/// Optional caps on how long the watchdog keeps a lease: past them it stops renewing,
/// and the lease is lost at its deadline.
#[derive(Copy, Clone, Debug, Default)]
pub(crate) struct Caps {
    pub(crate) max_renewals: Option<u64>,
    pub(crate) max_hold: Option<Duration>,
}

/// The watchdog's and the holder's view of one lease.
pub(crate) struct Sched {
    state: State,
    /// When the lease ends unless renewed: the send time of the last request the server
    /// confirmed, plus the ttl. None for a hold bound to a session with ttl 0.
    pub(crate) deadline: Option<Instant>,
    /// When the watchdog renews it next.
    pub(crate) next_renew: Instant,
    /// A renewal of the watchdog's is on its way.
    pub(crate) in_flight: bool,
    /// Renewals the watchdog had confirmed.
    pub(crate) renewals: u64,
    /// A `LEASE.RELEASE` of the holder's is on its way: a renewal answered `0` meanwhile
    /// is that release's doing, not a loss, and nothing more is renewed.
    pub(crate) releasing: bool,
    /// What the server reported for the last confirmed grant or renewal.
    pub(crate) confirmed: Option<Confirmed>,
}

pub(crate) struct Core {
    pub(crate) id: u64,
    pub(crate) key: String,
    pub(crate) token: String,
    pub(crate) fence: u64,
    /// Zero for a hold bound to a session that lives exactly as long as it.
    pub(crate) ttl: Duration,
    pub(crate) acquired_at: Instant,
    pub(crate) caps: Caps,
    /// The session this hold is bound to.
    pub(crate) session: Option<Arc<Core>>,
    /// How many copies each renewal must reach.
    pub(crate) confirm: Option<Confirm>,
    /// A fenced write of this lease ended in `WriteIndeterminate`: the scoped form then
    /// returns the body's error (that one, usually) rather than `LeaseLost`.
    pub(crate) indeterminate: std::sync::atomic::AtomicBool,
    /// Fires when the lease is lost. A bound hold's is a child of its session's `ends`.
    lost: CancellationToken,
    /// Fires when the lease is lost or released: the end of every hold bound to it, if it
    /// is a session.
    pub(crate) ends: CancellationToken,
    sched: Mutex<Sched>,
}

impl Core {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        id: u64,
        key: String,
        token: String,
        fence: u64,
        ttl: Duration,
        sent: Instant,
        caps: Caps,
        session: Option<Arc<Core>>,
        confirm: Option<Confirm>,
    ) -> Core {
        let lost = match &session {
            Some(s) => s.ends.child_token(),
            None => CancellationToken::new(),
        };
        let ends = lost.child_token();
        Core {
            id,
            key,
            token,
            fence,
            ttl,
            acquired_at: sent,
            caps,
            session,
            confirm,
            indeterminate: std::sync::atomic::AtomicBool::new(false),
            lost,
            ends,
            sched: Mutex::new(Sched {
                state: State::Held,
                deadline: (!ttl.is_zero()).then(|| sent + ttl),
                next_renew: sent + period(ttl),
                in_flight: false,
                renewals: 0,
                releasing: false,
                confirmed: None,
            }),
        }
    }

    pub(crate) fn sched(&self) -> MutexGuard<'_, Sched> {
        // A panic while holding the lock leaves plain data behind: go on with it.
        self.sched.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The state as of now: a deadline that has passed is a loss even before the
    /// watchdog has run (after a pause of the whole process, say).
    pub(crate) fn state(&self) -> State {
        let (own, deadline) = {
            let sched = self.sched();
            (sched.state, sched.deadline)
        };
        if !own.is_live() {
            return own;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            self.mark_lost();
            return self.sched().state;
        }
        // First the session's (which may find its own deadline passed, and so end this
        // hold through `lost`).
        let session = self.session.as_ref().map(|s| s.state());
        if self.lost.is_cancelled() {
            return State::Lost;
        }
        if session == Some(State::Suspended) {
            return State::Suspended;
        }
        own
    }

    /// Whether the watchdog renews this lease itself (a bound hold with ttl 0 lives as
    /// long as its session, which the watchdog renews).
    pub(crate) fn renewable(&self) -> bool {
        !self.ttl.is_zero()
    }

    /// Whether a caps stops the watchdog from renewing at `now`.
    pub(crate) fn capped(&self, sched: &Sched, now: Instant) -> bool {
        if let Some(max) = self.caps.max_renewals {
            if sched.renewals >= max {
                return true;
            }
        }
        if let Some(max) = self.caps.max_hold {
            // A renewal sent now would carry the deadline past the cap.
            if now + self.ttl > self.acquired_at + max {
                return true;
            }
        }
        false
    }

    pub(crate) fn mark_lost(&self) {
        let mut sched = self.sched();
        let was_live = sched.state.is_live();
        if was_live {
            sched.state = State::Lost;
        }
        drop(sched);
        if was_live {
            self.lost.cancel();
        }
    }

    /// Released by its holder; false if it had already ended.
    pub(crate) fn mark_released(&self) -> bool {
        if !self.state().is_live() {
            return false;
        }
        let mut sched = self.sched();
        if !sched.state.is_live() {
            return false;
        }
        sched.state = State::Released;
        drop(sched);
        self.ends.cancel();
        true
    }

    /// A renewal answered `0`: lost, unless the holder's release got there first.
    pub(crate) fn renewal_refused(&self) {
        if !self.sched().releasing {
            self.mark_lost();
        }
    }

    fn set_releasing(&self, releasing: bool) {
        self.sched().releasing = releasing;
    }

    /// The server renewed it in answer to a request sent at `sent`.
    pub(crate) fn confirm(&self, sent: Instant, by_watchdog: bool) {
        let mut sched = self.sched();
        if sched.state == State::Suspended {
            sched.state = State::Held;
        }
        if !self.ttl.is_zero() {
            let deadline = sent + self.ttl;
            sched.deadline = Some(sched.deadline.map_or(deadline, |d| d.max(deadline)));
        }
        if by_watchdog {
            sched.renewals += 1;
            sched.next_renew = sent + period(self.ttl);
        }
    }

    pub(crate) fn set_confirmed(&self, confirmed: Option<Confirmed>) {
        self.sched().confirmed = confirmed;
    }

    /// A renewal went unanswered: suspended until the deadline, retried at `retry_at`.
    pub(crate) fn suspend(&self, retry_at: Instant) {
        let mut sched = self.sched();
        if sched.state == State::Held {
            sched.state = State::Suspended;
        }
        sched.next_renew = retry_at;
    }

    /// The deadline as last confirmed; a bound hold with ttl 0 has its session's.
    fn deadline(&self) -> Option<Instant> {
        match self.sched().deadline {
            Some(d) => Some(d),
            None => self.session.as_ref().and_then(|s| s.deadline()),
        }
    }
}

/// A lease held through [`Leases`](crate::Leases).
///
/// Cheap to clone; every clone is the same lease (ownership is the token, not a task:
/// any task may renew, release or fence with it). The watchdog renews it until it is
/// released or lost. When the last clone is dropped while it is still held, it is
/// released in the background (a task on the runtime it was acquired on; nothing
/// blocks).
#[derive(Clone)]
pub struct Lease {
    handle: Arc<Handle>,
}

struct Handle {
    core: Arc<Core>,
    shared: Arc<Shared>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        if self.core.mark_released() {
            self.shared.forget(self.core.id);
            self.shared
                .release_in_background(self.core.key.clone(), self.core.token.clone());
        }
    }
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token: it is the capability to release.
        f.debug_struct("Lease")
            .field("key", &self.key())
            .field("fence", &self.fence())
            .field("state", &self.state())
            .finish()
    }
}

impl Lease {
    pub(crate) fn new(core: Arc<Core>, shared: Arc<Shared>) -> Lease {
        Lease {
            handle: Arc::new(Handle { core, shared }),
        }
    }

    fn core(&self) -> &Core {
        &self.handle.core
    }

    /// The lease key.
    pub fn key(&self) -> &str {
        &self.core().key
    }

    /// The token that holds the lease (32 lowercase hex digits unless one was given).
    pub fn token(&self) -> &str {
        &self.core().token
    }

    /// The fence of this grant: higher than every fence issued for the key before it
    /// (below 2^53). Carry it to every write of the protected resource.
    pub fn fence(&self) -> u64 {
        self.core().fence
    }

    /// The ttl the lease is renewed with (zero: bound to a session, no deadline of its
    /// own).
    pub fn ttl(&self) -> Duration {
        self.core().ttl
    }

    /// Where the lease stands now.
    pub fn state(&self) -> State {
        self.core().state()
    }

    /// `Err(LeaseLost)` unless the lease is held or suspended.
    pub fn check(&self) -> Result<()> {
        if self.state().is_live() {
            Ok(())
        } else {
            Err(self.lost_error())
        }
    }

    /// How long until the deadline last confirmed (zero once it has passed; for a bound
    /// hold with ttl 0 its session's).
    pub fn remaining(&self) -> Option<Duration> {
        self.core()
            .deadline()
            .map(|d| d.saturating_duration_since(Instant::now()))
    }

    /// How many copies the server reported for the last grant or renewal, when the lease
    /// is confirmed ([`Confirm`]); None otherwise.
    pub fn confirmed(&self) -> Option<Confirmed> {
        self.core().sched().confirmed
    }

    /// Renewals the watchdog has had confirmed.
    pub fn renewals(&self) -> u64 {
        self.core().sched().renewals
    }

    /// Resolves when the lease is lost (at once if it already is). Never resolves for a
    /// lease that is released instead. `'static`: it may be moved into another task or a
    /// `select!`.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.core().lost.clone().cancelled_owned()
    }

    /// The loss signal as a [`CancellationToken`], cancelled when the lease is lost: hand
    /// it to code that already stops on one. (A child token: cancelling it does not
    /// touch the lease.)
    pub fn lost_token(&self) -> CancellationToken {
        self.core().lost.child_token()
    }

    /// Renews now (the watchdog does this by itself at ttl/3): `Err(LeaseLost)` if the
    /// server answers `0`.
    pub async fn renew(&self) -> Result<()> {
        self.check()?;
        let core = self.core();
        let mut conn = self.handle.shared.conn.clone();
        let sent = Instant::now();
        let renew = renew_cmd(&core.key, &core.token, core.ttl);
        let cap = Some(period(core.ttl) / 2);
        let (renewed, confirmed): (i64, _) =
            confirm::query(&mut conn, &renew, core.confirm.as_ref(), cap).await?;
        if renewed != 1 {
            core.renewal_refused();
            return Err(self.lost_error());
        }
        match (&core.confirm, confirmed) {
            (Some(confirm), Some(Ok(confirmed))) if !confirm.met(&confirmed) => {
                // Renewed on the primary only: as good as lost there on a failover.
                core.mark_lost();
                self.handle
                    .shared
                    .release_in_background(core.key.clone(), core.token.clone());
                Err(self.lost_error())
            }
            (Some(_), Some(Err(e))) => Err(Error::Redis(e)),
            (_, confirmed) => {
                core.confirm(sent, false);
                core.set_confirmed(confirmed.and_then(|c| c.ok()));
                self.check()
            }
        }
    }

    /// Releases the lease. `Ok` if it was held (or already released); `Err(LeaseLost)`
    /// if it had been lost (a `LEASE.RELEASE` is still sent, in case the server holds it
    /// a little longer than this client counted). On a connection error the lease stays
    /// as it was: release again, or drop it to release in the background.
    pub async fn release(&self) -> Result<()> {
        let core = self.core();
        let was = self.state();
        if was == State::Released {
            return Ok(());
        }
        let mut conn = self.handle.shared.conn.clone();
        // Until the reply: a renewal answered 0 meanwhile is this release's doing. If
        // the reply never comes (an error, this future dropped), the watchdog takes the
        // lease back.
        core.set_releasing(true);
        let releasing = Releasing { core, done: false };
        let released: redis::RedisResult<i64> = redis::cmd("LEASE.RELEASE")
            .arg(&core.key)
            .arg(&core.token)
            .query_async(&mut conn)
            .await;
        releasing.finish(released.is_ok());
        match released {
            Ok(1) if was.is_live() && core.mark_released() => {
                self.handle.shared.forget(core.id);
                Ok(())
            }
            Ok(_) => {
                core.mark_lost();
                self.handle.shared.forget(core.id);
                Err(self.lost_error())
            }
            Err(_) if was == State::Lost => Err(self.lost_error()),
            Err(e) => Err(Error::Redis(e)),
        }
    }

    /// Runs `command` on the server only if this lease's fence is still the newest the
    /// `resource` has seen: `LEASE.FENCE resource fence command...`, in one atomic step.
    ///
    /// - A newer fence accepted there is `Err(StaleFence)` (refused: nothing ran), and
    ///   the lease counts as lost (the loss signal fires; a scoped form returns
    ///   `LeaseLost`).
    /// - A lease known lost or released sends nothing: `Err(LeaseLost)`.
    /// - The write is sent **once**, on a connection kept for fenced writes (no
    ///   client-side retry, no reconnect that resends), and its reply is awaited **no
    ///   longer than the lease's time left** ([`Lease::remaining`]). No reply by then, or
    ///   the connection failing after it was sent, is `Err(WriteIndeterminate)`: it may
    ///   have run (a stalled server runs it when it wakes), or not. The lease is then
    ///   suspended (the watchdog tries a renewal at once) and lost when its deadline
    ///   passes: a write that waited until the deadline returns with the lease lost.
    /// - `READONLY` (the server is a replica now) did not run: `Err(Redis)`, the lease
    ///   suspended until a renewal reaches the master.
    ///
    /// In a cluster `resource` and the command's keys must share a slot (hash tags).
    ///
    /// ```no_run
    /// # async fn f(lease: &redis_lease_client::Lease) -> redis_lease_client::Result<()> {
    /// let added: i64 = lease
    ///     .fence_call("fence:report", redis::cmd("HSET").arg("report").arg("total").arg(42))
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn fence_call<T: FromRedisValue>(&self, resource: &str, command: &Cmd) -> Result<T> {
        self.fence_call_retrying(resource, command, 0).await
    }

    /// [`Lease::fence_call`], sent again up to `retries` more times when it went
    /// unanswered: each after a tenth of the ttl (5 to 250 ms), on a new connection, and
    /// only while the lease is held or suspended, before its deadline. For a command that
    /// is safe to run twice (`SET` of a value, not `INCR` or `RPUSH`): an attempt that
    /// went unanswered may have run. `WriteIndeterminate { attempts }` counts the sends.
    pub async fn fence_call_retrying<T: FromRedisValue>(
        &self,
        resource: &str,
        command: &Cmd,
        retries: u32,
    ) -> Result<T> {
        self.check()?;
        let core = self.core();
        let mut cmd = redis::cmd("LEASE.FENCE");
        cmd.arg(resource).arg(core.fence);
        for arg in command.args_iter() {
            if let Arg::Simple(bytes) = arg {
                cmd.arg(bytes);
            }
        }
        let shared = &self.handle.shared;
        let mut attempts = 0u32;
        let mut retries = retries;
        let mut redirects = 0;
        loop {
            if !self.state().is_live() {
                return Err(if attempts > 0 {
                    self.indeterminate(resource, attempts)
                } else {
                    self.lost_error()
                });
            }
            let failure = match shared.send_fenced(&cmd, self.remaining()).await {
                Ok(Ok(reply)) => {
                    return T::from_redis_value(reply).map_err(|e| Error::Redis(e.into()))
                }
                Ok(Err(e)) => {
                    if let Some(stale) = stale_fence(&e, resource) {
                        core.mark_lost();
                        return Err(stale);
                    }
                    if is_demoted(&e) {
                        self.write_failed();
                    }
                    // Refused by a node that no longer serves the slot: it did not run. The
                    // cluster connection has learnt the new owner; a few hops at most.
                    if matches!(e.code(), Some("MOVED" | "ASK")) && redirects < MAX_REDIRECTS {
                        redirects += 1;
                        continue;
                    }
                    return Err(Error::Redis(e));
                }
                Err(failure) => failure,
            };
            self.write_failed();
            let error = match failure {
                Unanswered::Sent(e) => {
                    attempts += 1;
                    e
                }
                Unanswered::NotSent(e) => e,
            };
            if retries == 0 {
                if attempts > 0 {
                    return Err(self.indeterminate(resource, attempts));
                }
                return Err(if self.state().is_live() {
                    Error::Redis(error)
                } else {
                    self.lost_error()
                });
            }
            retries -= 1;
            let pause = retry_delay(core.ttl);
            tokio::time::sleep(self.remaining().map_or(pause, |left| pause.min(left))).await;
        }
    }

    /// A fenced write went unanswered: suspended until the watchdog confirms a renewal,
    /// which it tries at once (the session's, for a hold that has no deadline of its
    /// own).
    fn write_failed(&self) {
        let core = self.core();
        let target = match &core.session {
            Some(session) if !core.renewable() => session,
            _ => &self.handle.core,
        };
        target.suspend(Instant::now());
        self.handle.shared.wake.notify_one();
    }

    fn indeterminate(&self, resource: &str, attempts: u32) -> Error {
        self.core()
            .indeterminate
            .store(true, std::sync::atomic::Ordering::Relaxed);
        Error::WriteIndeterminate {
            resource: resource.to_string(),
            fence: self.fence(),
            attempts,
        }
    }

    pub(crate) fn core_arc(&self) -> &Arc<Core> {
        &self.handle.core
    }

    pub(crate) fn lost_error(&self) -> Error {
        Error::LeaseLost {
            key: self.core().key.clone(),
        }
    }
}

/// Clears a release's mark on a lease unless its reply came.
struct Releasing<'a> {
    core: &'a Core,
    done: bool,
}

impl Releasing<'_> {
    fn finish(mut self, answered: bool) {
        self.done = answered;
    }
}

impl Drop for Releasing<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.core.set_releasing(false);
        }
    }
}

/// A session: an exclusive lease whose renewal keeps every hold bound to it alive
/// (`acquire(...).session(&session)`, with ttl zero for holds without a deadline of their
/// own). The watchdog renews the session, not the holds. Releasing, dropping or losing
/// the session ends every hold bound to it: they become [`State::Lost`].
///
/// Dereferences to its [`Lease`].
#[derive(Clone, Debug)]
pub struct Session {
    lease: Lease,
}

impl Session {
    pub(crate) fn new(lease: Lease) -> Session {
        Session { lease }
    }

    /// The session as a plain lease.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }
}

impl Deref for Session {
    type Target = Lease;

    fn deref(&self) -> &Lease {
        &self.lease
    }
}

/// How often the watchdog renews a lease: a third of its ttl (at least a millisecond,
/// so that an absurdly short ttl does not spin the watchdog).
pub(crate) fn period(ttl: Duration) -> Duration {
    (ttl / 3).max(Duration::from_millis(1))
}

/// How many `MOVED` / `ASK` replies a fenced write follows before giving up.
const MAX_REDIRECTS: u32 = 4;

/// `LEASE.RENEW key token ttl`.
pub(crate) fn renew_cmd(key: &str, token: &str, ttl: Duration) -> Cmd {
    let mut cmd = redis::cmd("LEASE.RENEW");
    cmd.arg(key).arg(token).arg(ttl_ms(ttl));
    cmd
}

/// A duration as the module's milliseconds.
pub(crate) fn ttl_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
