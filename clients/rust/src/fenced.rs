//! Fenced writes: sent once, on a connection of their own, their reply awaited no longer
//! than the lease's time left.
//!
//! A write that the client library retried, or queued through a reconnect, could run
//! after the lease is lost. So a fenced write never goes through anything that resends:
//! one request on a multiplexed connection opened for fenced writes (no response timeout
//! of its own: the lease's deadline is the bound), dropped after any failure so that the
//! next write starts on a fresh one.

use std::sync::Mutex;
use std::time::Duration;

use redis::{Cmd, RedisError, Value};

use crate::connection::{Conn, Connect};

/// Why a fenced write has no reply.
pub(crate) enum Unanswered {
    /// Nothing was sent (the connection could not be opened in time): it did not run.
    NotSent(RedisError),
    /// It was sent and no reply came in time, or the connection failed after: it may have
    /// run.
    Sent(RedisError),
}

/// The connection fenced writes go on, opened on first use.
#[derive(Default)]
pub(crate) struct FenceConn(Mutex<Option<Conn>>);

impl FenceConn {
    fn cached(&self) -> Option<Conn> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn store(&self, conn: Conn) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(conn);
    }

    /// Forgets the connection: the next write opens a new one. A reply still on its way
    /// on the old one is dropped with it.
    pub(crate) fn reset(&self) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    /// `cmd` sent once, its reply awaited at most `within` (`None`: no bound). The
    /// connection is the one for fenced writes (opened through `connect`), or `fallback`
    /// (the shared connection) when the client has no way to open one.
    pub(crate) async fn send_once(
        &self,
        connect: Option<&dyn Connect>,
        fallback: &Conn,
        cmd: &Cmd,
        within: Option<Duration>,
    ) -> Result<Result<Value, RedisError>, Unanswered> {
        let started = tokio::time::Instant::now();
        let bounded = |left: Option<Duration>| left.map(|l| l.saturating_sub(started.elapsed()));
        let mut conn = match (self.cached(), connect) {
            (Some(conn), _) => conn,
            (None, Some(connect)) => {
                let opening = connect.connect_blocking(None);
                let opened = match within {
                    Some(limit) => match tokio::time::timeout(limit, opening).await {
                        Ok(opened) => opened,
                        Err(_) => Err(timed_out("no connection before the lease's deadline")),
                    },
                    None => opening.await,
                };
                let conn = Conn::new(opened.map_err(Unanswered::NotSent)?);
                self.store(conn.clone());
                conn
            }
            (None, None) => fallback.clone(),
        };
        let request = cmd.query_async::<Value>(&mut conn);
        let reply = match bounded(within) {
            Some(left) => match tokio::time::timeout(left, request).await {
                Ok(reply) => reply,
                Err(_) => {
                    self.reset();
                    return Err(Unanswered::Sent(timed_out(
                        "no reply before the lease's deadline",
                    )));
                }
            },
            None => request.await,
        };
        match reply {
            Err(e) if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() => {
                self.reset();
                Err(Unanswered::Sent(e))
            }
            Err(e) if is_demoted(&e) => {
                // A replica now: the write did not run; the next one reconnects (to the
                // master the Sentinels name, on a Sentinel connection).
                self.reset();
                if let Some(connect) = connect {
                    connect.demoted();
                }
                Ok(Err(e))
            }
            reply => Ok(reply),
        }
    }
}

/// `READONLY`: the server was demoted to a replica. Nothing ran; for the watchdog and
/// fenced writes it is a lost connection, not an answer.
pub(crate) fn is_demoted(e: &RedisError) -> bool {
    e.code() == Some("READONLY")
}

fn timed_out(what: &'static str) -> RedisError {
    RedisError::from(std::io::Error::new(std::io::ErrorKind::TimedOut, what))
}

/// How long after a failed fenced write an opted-in retry waits: a tenth of the ttl,
/// from 5 to 250 ms (as the Python client).
pub(crate) fn retry_delay(ttl: Duration) -> Duration {
    (ttl / 10).clamp(Duration::from_millis(5), Duration::from_millis(250))
}
