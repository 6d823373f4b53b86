//! Confirmed grants: `WAIT` (or `WAITAOF`) in the same pipeline as the `LEASE.ACQUIRE`
//! or `LEASE.RENEW` it confirms.
//!
//! Never after the reply: a `WAIT` sent on its own once the grant's reply is in can
//! confirm a grant that a role change has already lost (the replication offset it waits
//! for may be the new primary's). In one pipeline the server runs the two back to back
//! on one connection, so the `WAIT` counts the replicas that have the grant.

use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Cmd, FromRedisValue, Pipeline, RedisError, RedisResult, Value};

use crate::lease::ttl_ms;

/// How many copies a grant and each renewal must reach before this client counts them:
/// per [`Leases`](crate::Leases) ([`Leases::confirm`](crate::Leases::confirm)) or per
/// acquire ([`Acquire::confirm`](crate::Acquire::confirm)).
///
/// A grant that is not confirmed in time is released and the acquire fails with
/// [`Error::NotConfirmed`](crate::Error::NotConfirmed); a renewal that is not confirmed
/// is a **loss** (the lease's signal fires, and it is released). What was confirmed is
/// [`Lease::confirmed`](crate::Lease::confirmed).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Confirm {
    replicas: u32,
    /// `WAITAOF numlocal`: `Some(0)` or `Some(1)`; None sends `WAIT`.
    local: Option<u32>,
    timeout: Duration,
}

/// How many copies the server reported for the last grant or renewal.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Confirmed {
    /// Replicas that acknowledged it (`WAIT`), or that fsynced it to their AOF
    /// (`WAITAOF`).
    pub replicas: u32,
    /// With `WAITAOF`: 1 if the primary fsynced it to its own AOF.
    pub local: Option<u32>,
}

impl Confirm {
    /// `WAIT replicas timeout`: at least `replicas` replicas acknowledged the grant (and
    /// each renewal) within `timeout`. Keep `timeout` well under a third of the ttl: a
    /// renewal round waits no longer than that, so the `WAIT` is given at most half of
    /// it (and at least 1 ms: `WAIT 0` would wait for ever).
    pub fn replicas(replicas: u32, timeout: Duration) -> Confirm {
        Confirm {
            replicas,
            local: None,
            timeout,
        }
    }

    /// `WAITAOF local replicas timeout` (Redis 7.2+, Valkey 8+; the server needs
    /// `appendonly yes` for `local`): the primary fsynced the grant to its AOF (`local`
    /// 1) and at least `replicas` replicas did to theirs. `local` is 0 or 1.
    pub fn aof(local: bool, replicas: u32, timeout: Duration) -> Confirm {
        Confirm {
            replicas,
            local: Some(u32::from(local)),
            timeout,
        }
    }

    /// Adds the confirming command to `pipe`, waiting at most `cap` (see
    /// [`Confirm::replicas`]).
    pub(crate) fn append(&self, pipe: &mut Pipeline, cap: Option<Duration>) {
        let timeout = cap
            .map_or(self.timeout, |cap| self.timeout.min(cap))
            .max(Duration::from_millis(1));
        match self.local {
            None => pipe.cmd("WAIT").arg(self.replicas).arg(ttl_ms(timeout)),
            Some(local) => pipe
                .cmd("WAITAOF")
                .arg(local)
                .arg(self.replicas)
                .arg(ttl_ms(timeout)),
        };
    }

    /// The confirming command's reply, read.
    pub(crate) fn read(&self, reply: RedisResult<Value>) -> RedisResult<Confirmed> {
        let reply = reply?;
        match self.local {
            None => Ok(Confirmed {
                replicas: u32::from_redis_value(reply)?,
                local: None,
            }),
            Some(_) => {
                let (local, replicas) = <(u32, u32)>::from_redis_value(reply)?;
                Ok(Confirmed {
                    replicas,
                    local: Some(local),
                })
            }
        }
    }

    /// Whether `confirmed` is as many copies as asked for.
    pub(crate) fn met(&self, confirmed: &Confirmed) -> bool {
        confirmed.replicas >= self.replicas
            && confirmed.local.unwrap_or(0) >= self.local.unwrap_or(0)
    }
}

/// `cmd` and, with `confirm`, its confirmation, in one pipeline: the command's reply and
/// what was confirmed.
pub(crate) async fn query<T: FromRedisValue>(
    conn: &mut impl ConnectionLike,
    cmd: &Cmd,
    confirm: Option<&Confirm>,
    cap: Option<Duration>,
) -> RedisResult<(T, Option<RedisResult<Confirmed>>)> {
    let Some(confirm) = confirm else {
        return Ok((cmd.query_async(conn).await?, None));
    };
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    pipe.add_command(cmd.clone());
    confirm.append(&mut pipe, cap);
    let mut replies: Vec<RedisResult<Value>> = pipe.query_async(conn).await?;
    if replies.len() != 2 {
        return Err(RedisError::from((
            redis::ErrorKind::Parse,
            "a pipeline of two commands answered otherwise",
        )));
    }
    let waited = replies.pop().unwrap_or_else(|| Ok(Value::Nil));
    let reply = replies.pop().unwrap_or_else(|| Ok(Value::Nil))?;
    Ok((T::from_redis_value(reply)?, Some(confirm.read(waited))))
}
