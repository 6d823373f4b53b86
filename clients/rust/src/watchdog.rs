//! The one renewal task of a `Leases`.
//!
//! Each lease is due for renewal a third of its ttl after the send time of its last
//! confirmed renewal (or of its grant). When the earliest lease falls due, the watchdog
//! sends one round: every lease due by then or within a sixth of its ttl (half its
//! period), in one pipeline (one per hash slot on a cluster, all at once). The leases of
//! a round are due again together, and two groups of one ttl, at most a period apart,
//! merge at the next round (the later one is within half a period of the earlier, or
//! the earlier within half a period of the later's turn): a thousand leases of one ttl
//! cost one round per ttl/3.
//!
//! A reply of `1` confirms the deadline (send time + ttl); `0` (or `WRONGTYPE`: the key
//! was overwritten) is lost at once. A round that fails or is not answered within a
//! third of the shortest ttl in it suspends its leases and is retried an eighth of a ttl
//! later; a lease whose deadline passes is lost, whatever is still on its way. Losses go
//! by this machine's monotonic clock, from when the confirming request was sent, which
//! is never later than the server's own deadline.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use futures_util::stream::{FuturesUnordered, StreamExt};
use std::collections::HashMap;

use redis::{FromRedisValue, RedisResult, Value};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::confirm::Confirm;
use crate::connection::Conn;
use crate::lease::{period, renew_cmd, Core};
use crate::leases::{groups, Shared, Stats};

/// The least time between two tries of a failing renewal.
const MIN_RETRY: Duration = Duration::from_millis(10);
/// How long the watchdog sleeps with nothing to do (a new lease wakes it).
const IDLE: Duration = Duration::from_secs(3600);

pub(crate) async fn run(
    shared: Weak<Shared>,
    stop: CancellationToken,
    wake: Arc<Notify>,
    stats: Arc<Stats>,
) {
    let mut rounds = FuturesUnordered::new();
    loop {
        let next = {
            let Some(shared) = shared.upgrade() else {
                break;
            };
            let now = Instant::now();
            let (due, next) = collect(&shared, now);
            if !due.is_empty() {
                rounds.push(round(shared.conn.clone(), due, Arc::clone(&stats)));
            }
            next
        };
        let sleep = tokio::time::sleep_until(next.unwrap_or_else(|| Instant::now() + IDLE).into());
        tokio::select! {
            biased;
            () = stop.cancelled() => break,
            Some(()) = rounds.next(), if !rounds.is_empty() => {}
            () = wake.notified() => {}
            () = sleep => {}
        }
    }
}

/// Drops ended leases, loses those past their deadline, and takes the round due now;
/// also when to look again.
fn collect(shared: &Shared, now: Instant) -> (Vec<Arc<Core>>, Option<Instant>) {
    let mut next: Option<Instant> = None;
    let mut soon = Vec::new();
    let mut any_due = false;
    let mut earliest = |t: Instant| next = Some(next.map_or(t, |n: Instant| n.min(t)));
    let mut registry = shared.registry();
    registry.leases.retain(|_, core| {
        if !core.state().is_live() {
            return false;
        }
        if !core.renewable() {
            return true;
        }
        let sched = core.sched();
        let Some(deadline) = sched.deadline else {
            return true;
        };
        if now >= deadline {
            drop(sched);
            core.mark_lost();
            return false;
        }
        earliest(deadline);
        if sched.in_flight || sched.releasing || core.capped(&sched, now) {
            return true;
        }
        if sched.next_renew <= now {
            any_due = true;
        }
        if sched.next_renew <= now + core.ttl / 6 {
            soon.push(Arc::clone(core));
        } else {
            earliest(sched.next_renew);
        }
        true
    });
    drop(registry);
    if !any_due {
        for core in &soon {
            earliest(core.sched().next_renew);
        }
        return (Vec::new(), next);
    }
    for core in &soon {
        core.sched().in_flight = true;
    }
    (soon, next)
}

/// One round of renewals, sent at once.
async fn round(conn: Conn, due: Vec<Arc<Core>>, stats: Arc<Stats>) {
    let timeout = due
        .iter()
        .map(|c| period(c.ttl))
        .min()
        .unwrap_or(MIN_RETRY)
        .max(MIN_RETRY);
    let renewals = due.len() as u64;
    // One pipeline per confirmation setting (its WAIT ends it), and per slot.
    let mut by_confirm: HashMap<Option<Confirm>, Vec<Arc<Core>>> = HashMap::new();
    for core in due {
        by_confirm.entry(core.confirm).or_default().push(core);
    }
    let groups: Vec<(Option<Confirm>, Vec<Arc<Core>>)> = by_confirm
        .into_iter()
        .flat_map(|(confirm, cores)| {
            groups(&conn, cores)
                .into_iter()
                .map(move |group| (confirm, group))
        })
        .collect();
    stats.update(|s| {
        s.rounds += 1;
        s.pipelines += groups.len() as u64;
        s.renewals += renewals;
    });
    let sends = groups.into_iter().map(|(confirm, group)| {
        let mut conn = conn.clone();
        let stats = Arc::clone(&stats);
        async move {
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            for core in &group {
                pipe.add_command(renew_cmd(&core.key, &core.token, core.ttl));
            }
            if let Some(confirm) = &confirm {
                // In the same pipeline, never after the replies (see confirm.rs); half
                // the round's time at most, so that its reply comes within the round.
                confirm.append(&mut pipe, Some(timeout / 2));
            }
            let expected = group.len() + usize::from(confirm.is_some());
            // Before asking where the master is: the deadline counts from here at the latest.
            let sent = Instant::now();
            let replies = tokio::time::timeout(timeout, async {
                conn.locate(timeout).await;
                pipe.query_async::<Vec<RedisResult<Value>>>(&mut conn).await
            })
            .await;
            match replies {
                Ok(Ok(mut replies)) if replies.len() == expected => {
                    let confirmed = match &confirm {
                        Some(confirm) => {
                            let waited = replies.pop().unwrap_or(Ok(Value::Nil));
                            Some((confirm, confirm.read(waited)))
                        }
                        None => None,
                    };
                    let mut unconfirmed = Vec::new();
                    for (core, reply) in group.iter().zip(replies) {
                        match reply.and_then(|v| i64::from_redis_value(v).map_err(Into::into)) {
                            Ok(1) => match &confirmed {
                                None => core.confirm(sent, true),
                                Some((confirm, Ok(copies))) if confirm.met(copies) => {
                                    core.confirm(sent, true);
                                    core.set_confirmed(Some(*copies));
                                }
                                // Renewed on the primary alone: a failover now would
                                // lose it, so it counts as lost.
                                Some((_, Ok(_))) => {
                                    core.mark_lost();
                                    unconfirmed.push(Arc::clone(core));
                                }
                                // The WAIT itself failed: no answer on the copies.
                                Some((_, Err(_))) => core.suspend(retry_at(core)),
                            },
                            Ok(_) => core.renewal_refused(),
                            // The key now holds another type: the lease is gone.
                            Err(e) if e.code() == Some("WRONGTYPE") => core.renewal_refused(),
                            Err(_) => core.suspend(retry_at(core)),
                        }
                        core.sched().in_flight = false;
                    }
                    if !unconfirmed.is_empty() {
                        release(&mut conn, &unconfirmed, timeout).await;
                    }
                }
                _ => {
                    stats.update(|s| s.failures += 1);
                    for core in &group {
                        core.suspend(retry_at(core));
                        core.sched().in_flight = false;
                    }
                }
            }
        }
    });
    futures_util::future::join_all(sends).await;
}

/// Releases leases this client counts as lost but the server may still hold.
async fn release(conn: &mut Conn, cores: &[Arc<Core>], within: Duration) {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for core in cores {
        pipe.cmd("LEASE.RELEASE").arg(&core.key).arg(&core.token);
    }
    let _ = tokio::time::timeout(within, pipe.query_async::<Vec<RedisResult<i64>>>(conn)).await;
}

fn retry_at(core: &Core) -> Instant {
    Instant::now() + (core.ttl / 8).max(MIN_RETRY)
}
