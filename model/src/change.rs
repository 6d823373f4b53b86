//! What one operation did to one lease key, as a value. The model decides
//! it here; `keyspace::commit` carries it out, and is the only code that
//! does: it replicates, moves the deadline and bound-hold indexes, the
//! counters and the gauge, notifies, and wakes waiters, always in the same
//! order. A command is then: parse, open, model, commit, reply.
//!
//! Nothing here allocates for the common case: a grant, a renewal or a
//! release of a hold with no session builds a `Change` on the stack. The
//! constructors are `#[inline]`: across the crate boundary, so that a
//! command builds its change in place rather than copying it through calls.

use std::ffi::CStr;

use crate::holds::{Binding, Grant, Hold, Refused, Sessions};
use crate::lease::{Acquire, Lease, Replaced};
use crate::notifications;

/// How replicas and the AOF learn of a change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Replicate {
    #[default]
    Nothing,
    /// The client's command itself, which means exactly this change where
    /// it is replayed (a `RELEASE` whose key goes, or whose other holds
    /// stay): cheaper than building an effect.
    Verbatim,
    /// The operation's token's hold (`effect::held`).
    Held,
    /// The key's whole state (`effect::whole`).
    Whole,
    /// The operation's token's hold is gone; the key stays.
    DropToken,
    /// What the reaper's look left of the key (`Change::settled`): the
    /// holds in `Ended::dropped` gone, then the lock-delay `Ended::delay`.
    Pruned,
    /// The key's deletion, as `DEL`: the reaper's, one `DEL` a batch.
    Deleted,
}

impl Replicate {
    /// Whether writing it reads the stored lease.
    #[inline]
    pub fn reads_lease(&self) -> bool {
        matches!(self, Replicate::Held | Replicate::Whole)
    }
}

/// A counter of `INFO lease` that a change moves by one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    Grants,
    WaiterGrants,
    Retries,
    Contended,
    Renewals,
    RenewalsRejected,
    Releases,
    ReleasesRejected,
    /// A lease key the reaper deleted at its deadline.
    Expired,
}

/// The key's entry in the deadline index (kept on a primary only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Index {
    #[default]
    Keep,
    /// A held lease without an entry gets one at its deadline.
    Ensure,
    /// The lease's entry, at this deadline, goes: the key is free or gone.
    Remove(u64),
    /// An entry at this time, for the reaper to look at the key again: a
    /// free lease left for a waiter that was then refused is deleted then
    /// if nobody waits.
    Recheck(u64),
    /// The key's entry is made anew: the one at `old` (if any) goes, the
    /// lease's next look is made exact and indexed, and a free lease kept
    /// for waiters gets a `recheck` entry.
    Reset {
        old: Option<u64>,
        recheck: Option<u64>,
    },
}

/// Whether the key's waiters are offered the lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Signal {
    #[default]
    Never,
    /// Offered if any wait.
    IfWaiting,
}

/// What becomes of the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fate {
    #[default]
    Stays,
    /// Deleted: no hold, no delay, nobody waiting.
    Deleted,
}

/// One change to one lease key. `Default` is "nothing happened". Small on
/// purpose: what only some changes carry (holds that ended, sessions) is in
/// `ended`, none on a plain grant, renewal or release.
#[derive(Debug, Default)]
pub struct Change {
    pub replicate: Replicate,
    pub count: Option<Count>,
    pub notify: Option<&'static CStr>,
    /// The shared holds on the key before and after: the gauge moves by the
    /// difference.
    pub shared: (usize, usize),
    pub index: Index,
    pub signal: Signal,
    pub fate: Fate,
    /// A session granted on this key that ended: its fence, and when.
    pub session_ended: Option<(u64, u64)>,
    pub ended: Option<Box<Ended>>,
}

/// Holds that ended and the session index's part of a change.
#[derive(Debug, Default)]
pub struct Ended {
    /// Holds a grant took over that had expired before the reaper reached
    /// them: counted and announced as expired, before the change's own
    /// notification.
    pub expired: usize,
    /// Lock-delays counted: those of holds taken over (run their course),
    /// or one the change started.
    pub delays: usize,
    /// Bound holds among them freed by their session's end.
    pub session_expiries: usize,
    /// Bindings gone with holds that ended.
    pub unbound: Vec<Binding>,
    /// A binding the change added.
    pub bound: Option<Binding>,
    /// Tokens of the holds the reaper found gone while the key stays
    /// (`Replicate::Pruned`).
    pub dropped: Vec<Box<[u8]>>,
    /// The key's lock-delay as the reaper left it, where it changed (0: it
    /// ran out).
    pub delay: Option<u64>,
}

impl Change {
    /// The change's `Ended`, made on first use.
    fn ended_mut(&mut self) -> &mut Ended {
        self.ended.get_or_insert_with(Box::default)
    }

    /// What an acquire's look at the key did before it granted or
    /// refused: `replaced` holds (not live) left it, and if the key's own
    /// grant was a session (`ending`: its fence and deadline, read before),
    /// that session ended at its deadline.
    #[inline(always)]
    pub fn took_over(replaced: &Replaced, ending: Option<(u64, u64)>) -> Change {
        let mut change = Change::default();
        if replaced.count == 0 {
            return change;
        }
        change.session_ended = ending;
        let ended = change.ended_mut();
        for (hold, at) in &replaced.holds {
            ended.delays += usize::from(hold.grant.delay_ms() > 0);
            if let Some(binding) = hold.grant.session() {
                ended.session_expiries += usize::from(*at < hold.grant.deadline_ms);
                ended.unbound.push(binding.clone());
            }
        }
        change
    }

    /// A grant (new or repeated) to the operation's token: indexed,
    /// replicated as that token's hold, announced; `expired` holds it took
    /// over before the reaper reached them are announced first; the new
    /// hold binds to `bound`.
    #[inline(always)]
    pub fn granted(mut self, count: Count, expired: usize, bound: Option<Binding>) -> Change {
        if expired > 0 || bound.is_some() {
            let ended = self.ended_mut();
            ended.expired = expired;
            ended.bound = bound;
        }
        Change {
            replicate: Replicate::Held,
            count: Some(count),
            notify: Some(notifications::ACQUIRE),
            index: Index::Ensure,
            ..self
        }
    }

    /// What an acquire's outcome changed, by a client (`by_waiter` false)
    /// or for a blocked client served at its turn: the holds its look at the
    /// key took over (`took_over`); a grant or a retry (`granted`, bound to
    /// `bound`); a busy key counted (a client's only); a refusal nothing.
    /// `shared` is the key's shared holds before and after.
    #[inline(always)]
    pub fn acquired(
        outcome: &Result<(Acquire, Replaced), Refused>,
        ending: Option<(u64, u64)>,
        bound: Option<Binding>,
        shared: (usize, usize),
        by_waiter: bool,
    ) -> Change {
        let Ok((acquired, replaced)) = outcome else {
            return Change {
                shared,
                ..Change::default()
            };
        };
        let change = Change {
            shared,
            ..Change::took_over(replaced, ending)
        };
        let (grant, retry) = match by_waiter {
            false => (Count::Grants, Count::Retries),
            true => (Count::WaiterGrants, Count::WaiterGrants),
        };
        match acquired {
            Acquire::Busy if by_waiter => change,
            Acquire::Busy => Change {
                count: Some(Count::Contended),
                ..change
            },
            Acquire::Granted { .. } => change.granted(grant, replaced.count, bound),
            Acquire::Retried { .. } => change.granted(retry, 0, None),
        }
    }

    /// A woken waiter refused at its turn (its session ended, its terms
    /// refused): the key it was woken for may be a free lease kept for it,
    /// which the reaper looks at again `now` (deleted if nobody waits).
    #[inline]
    pub fn waiter_refused(now: u64) -> Change {
        Change {
            index: Index::Recheck(now),
            ..Change::default()
        }
    }

    /// A refusal or a busy key: counted, nothing else.
    #[inline(always)]
    pub fn counted(count: Count) -> Change {
        Change {
            count: Some(count),
            ..Change::default()
        }
    }

    /// A renewal of the operation's token's hold; `reindex` when the new
    /// deadline falls before the key's index entry.
    #[inline(always)]
    pub fn renewed(reindex: bool) -> Change {
        Change {
            replicate: Replicate::Held,
            count: Some(Count::Renewals),
            notify: Some(notifications::RENEW),
            index: if reindex { Index::Ensure } else { Index::Keep },
            ..Change::default()
        }
    }

    /// A client's release of `released`, decided here:
    /// - other holds stay: the call itself is the effect, waiters are
    ///   offered what may now fit;
    /// - the key is empty and nobody waits: it goes, and the call itself is
    ///   its deletion where replayed;
    /// - the key is empty and clients wait: it stays, free, for the head of
    ///   the queue; replicated as the hold dropped (an extended key keeps
    ///   its terms) or the whole free state.
    ///
    /// The released hold's binding goes, and if it was a session its bound
    /// holds are free from `now`.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub fn released(
        released: &Grant,
        now: u64,
        holds_stay: bool,
        waiting: bool,
        extended: bool,
        mark: Option<u64>,
        shared: (usize, usize),
    ) -> Change {
        let mut change = Change {
            count: Some(Count::Releases),
            notify: Some(notifications::RELEASE),
            shared,
            session_ended: Some((released.fence, now)),
            ended: released
                .session()
                .map(|binding| unbinding(vec![binding.clone()], None))
                .unwrap_or_default(),
            ..Change::default()
        };
        if holds_stay {
            change.replicate = Replicate::Verbatim;
            change.signal = Signal::IfWaiting;
            return change;
        }
        change.index = mark.map_or(Index::Keep, Index::Remove);
        if waiting {
            change.replicate = match extended {
                true => Replicate::DropToken,
                false => Replicate::Whole,
            };
            change.signal = Signal::IfWaiting;
        } else {
            change.replicate = Replicate::Verbatim;
            change.fate = Fate::Deleted;
        }
        change
    }

    /// A release replayed from a master or the AOF: the `gone` holds went
    /// where it was decided; the key goes too unless `holds_stay`.
    #[inline]
    pub fn release_replayed(gone: &[Hold], holds_stay: bool, shared: (usize, usize)) -> Change {
        Change {
            replicate: Replicate::Verbatim,
            notify: Some(notifications::RELEASE),
            shared,
            fate: if holds_stay {
                Fate::Stays
            } else {
                Fate::Deleted
            },
            ended: unbinding(bindings(gone), None),
            ..Change::default()
        }
    }

    /// A master's or the AOF's `LEASE.APPLY`: the bindings of the holds it
    /// replaced or dropped leave the session index, a hold it set may join it; passed
    /// on as is (a replica's own AOF and its sub-replicas).
    #[inline]
    pub fn applied(
        unbound: Vec<Binding>,
        bound: Option<Binding>,
        shared: (usize, usize),
        index: bool,
    ) -> Change {
        Change {
            replicate: Replicate::Verbatim,
            shared,
            index: if index { Index::Ensure } else { Index::Keep },
            ended: unbinding(unbound, bound),
            ..Change::default()
        }
    }
}

impl Change {
    /// The reaper's look at an extended lease at `now`, its deadline due or
    /// a session it holds bound holds of ended. The holds that are not live
    /// go (announced and counted as expired, unbound; the key's own session
    /// grant among them ends its session); a lock-delay one of them starts
    /// is kept. A key left with no hold, no delay and nobody `waiting` is
    /// deleted; one that stays is replicated as what went and indexed anew,
    /// and its waiters are offered what is free (a free key kept for them is
    /// looked at again at `recheck_at`). `own_session` is the key's grant if
    /// it can be a session, read before.
    pub fn settled(
        lease: &mut Lease,
        now: u64,
        sessions: &mut impl Sessions,
        own_session: Option<(u64, u64)>,
        waiting: bool,
        recheck_at: u64,
    ) -> Change {
        let mark = lease.index_mark();
        let shared_before = lease.shared_holds();
        let delayed_before = lease.extended().map_or(0, |h| h.delayed_until());
        let gone = lease.prune(now, sessions);
        let delayed_until = lease.extended().map_or(0, |h| h.delayed_until());
        let has_holds = lease.extended().is_some_and(|h| !h.is_empty());
        let stays = has_holds || delayed_until > now || waiting;
        let mut change = Change {
            shared: (shared_before, lease.shared_holds()),
            ..Change::default()
        };
        if !gone.is_empty() {
            change.session_ended = own_session.and_then(|(fence, _)| {
                let (_, at) = gone.iter().find(|(h, _)| h.grant.fence == fence)?;
                Some((fence, *at))
            });
            let ended = change.ended_mut();
            ended.expired = gone.len();
            ended.session_expiries = gone
                .iter()
                .filter(|(h, at)| h.grant.session().is_some() && *at < h.grant.deadline_ms)
                .count();
            ended.unbound = gone
                .iter()
                .filter_map(|(h, _)| h.grant.session().cloned())
                .collect();
            if stays {
                ended.dropped = gone.into_iter().map(|(h, _)| h.token).collect();
            }
        }
        if delayed_until > delayed_before {
            let ended = change.ended_mut();
            ended.delays = 1;
            ended.delay = Some(delayed_until);
        } else if delayed_until < delayed_before && stays {
            // A delay that ended is forgotten, on replicas as here.
            change.ended_mut().delay = Some(delayed_until);
        }
        if !stays {
            // Its entry goes with the key; the unlink finds none to remove.
            lease.set_index_mark(None);
            return Change {
                replicate: Replicate::Deleted,
                index: mark.map_or(Index::Keep, Index::Remove),
                fate: Fate::Deleted,
                ..change
            };
        }
        let free = !has_holds && delayed_until <= now;
        Change {
            replicate: Replicate::Pruned,
            index: Index::Reset {
                old: mark,
                recheck: (waiting && free).then_some(recheck_at),
            },
            signal: if waiting {
                Signal::IfWaiting
            } else {
                Signal::Never
            },
            ..change
        }
    }

    /// The reaper's deletion of a compact lease at its deadline (`expired`)
    /// or of a free one nobody waits for any more.
    #[inline]
    pub fn reaped(expired: bool) -> Change {
        Change {
            replicate: Replicate::Deleted,
            count: expired.then_some(Count::Expired),
            notify: expired.then_some(notifications::EXPIRE),
            fate: Fate::Deleted,
            ..Change::default()
        }
    }

    /// A free or expired key with waiters: the head is offered it, and the
    /// key is looked at again at `recheck_at`.
    #[inline]
    pub fn offered(recheck_at: u64) -> Change {
        Change {
            index: Index::Recheck(recheck_at),
            signal: Signal::IfWaiting,
            ..Change::default()
        }
    }

    /// A live lease whose index entry was due (renewed since): it gets its
    /// one entry again, at its next look.
    #[inline]
    pub fn reindexed() -> Change {
        Change {
            index: Index::Reset {
                old: None,
                recheck: None,
            },
            ..Change::default()
        }
    }

    /// An event announced on the key, nothing else.
    #[inline]
    pub fn announced(event: &'static CStr) -> Change {
        Change {
            notify: Some(event),
            ..Change::default()
        }
    }
}

/// The session index's part of a change that only binds and unbinds: none
/// when there is nothing to do.
#[inline]
fn unbinding(unbound: Vec<Binding>, bound: Option<Binding>) -> Option<Box<Ended>> {
    (!unbound.is_empty() || bound.is_some()).then(|| {
        Box::new(Ended {
            unbound,
            bound,
            ..Ended::default()
        })
    })
}

/// The bindings of the bound holds among `holds`.
#[inline]
pub fn bindings(holds: &[Hold]) -> Vec<Binding> {
    holds
        .iter()
        .filter_map(|h| h.grant.session().cloned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::holds::Grant;

    fn grant(fence: u64, session: Option<&[u8]>) -> Grant {
        let binding = session.map(|k| Binding {
            key: k.into(),
            fence: 99,
        });
        Grant::with(fence, 5_000, None, binding, 0)
    }

    #[test]
    fn a_release_that_leaves_other_holds_is_the_command_itself() {
        let c = Change::released(&grant(3, None), 100, true, false, true, Some(5_000), (2, 1));
        assert_eq!(c.replicate, Replicate::Verbatim);
        assert_eq!(c.fate, Fate::Stays);
        assert_eq!(c.index, Index::Keep, "the other holds keep the entry");
        assert_eq!(
            c.signal,
            Signal::IfWaiting,
            "a freed place may fit a waiter"
        );
        assert_eq!(c.shared, (2, 1));
        assert_eq!(c.notify, Some(notifications::RELEASE));
    }

    #[test]
    fn a_release_of_the_last_hold_deletes_the_key_unless_clients_wait() {
        let alone = Change::released(
            &grant(3, None),
            100,
            false,
            false,
            false,
            Some(5_000),
            (0, 0),
        );
        assert_eq!(alone.fate, Fate::Deleted);
        assert_eq!(alone.replicate, Replicate::Verbatim);
        assert_eq!(alone.index, Index::Remove(5_000));
        assert_eq!(alone.signal, Signal::Never);

        let compact = Change::released(
            &grant(3, None),
            100,
            false,
            true,
            false,
            Some(5_000),
            (0, 0),
        );
        assert_eq!(
            compact.fate,
            Fate::Stays,
            "kept, free, for the head of the queue"
        );
        assert_eq!(compact.replicate, Replicate::Whole);
        assert_eq!(compact.signal, Signal::IfWaiting);

        let extended = Change::released(&grant(3, None), 100, false, true, true, None, (1, 0));
        assert_eq!(
            extended.replicate,
            Replicate::DropToken,
            "its terms stay with the key"
        );
        assert_eq!(extended.index, Index::Keep, "no entry to remove");
    }

    #[test]
    fn a_released_session_ends_and_a_bound_hold_unbinds() {
        let bound = Change::released(
            &grant(7, Some(b"s")),
            100,
            false,
            false,
            false,
            None,
            (0, 0),
        );
        let ended = bound.ended.as_deref().expect("sessions part");
        assert_eq!(ended.unbound.len(), 1);
        assert_eq!(&*ended.unbound[0].key, b"s");
        assert_eq!(bound.session_ended, Some((7, 100)));
        let plain = Change::released(&grant(7, None), 100, false, false, false, None, (0, 0));
        assert!(plain.ended.is_none());
        assert_eq!(
            plain.session_ended,
            Some((7, 100)),
            "a release may end a session"
        );
    }

    #[test]
    fn holds_taken_over_are_counted_by_kind() {
        let mut with_delay = grant(1, None);
        with_delay = Grant::with(with_delay.fence, 1_000, None, None, 500);
        let replaced = Replaced {
            count: 3,
            holds: vec![
                (
                    Hold {
                        token: b"a"[..].into(),
                        grant: with_delay,
                    },
                    1_000,
                ),
                // Freed by its session's end, before its own deadline.
                (
                    Hold {
                        token: b"b"[..].into(),
                        grant: grant(2, Some(b"s")),
                    },
                    4_000,
                ),
                // Bound, but past its own deadline.
                (
                    Hold {
                        token: b"c"[..].into(),
                        grant: grant(3, Some(b"s")),
                    },
                    6_000,
                ),
            ],
        };
        let c = Change::took_over(&replaced, Some((9, 2_000))).granted(Count::Grants, 3, None);
        let ended = c.ended.as_deref().expect("holds ended");
        assert_eq!(ended.delays, 1);
        assert_eq!(ended.session_expiries, 1);
        assert_eq!(ended.unbound.len(), 2);
        assert_eq!(c.session_ended, Some((9, 2_000)));
        assert_eq!(ended.expired, 3);
        assert_eq!(c.replicate, Replicate::Held);
        assert_eq!(c.index, Index::Ensure);
        // Nothing taken over: the key's session did not end here.
        let none = Replaced {
            count: 0,
            holds: Vec::new(),
        };
        assert!(Change::took_over(&none, Some((9, 2_000))).ended.is_none());
    }

    #[test]
    fn a_replayed_release_deletes_or_keeps_as_decided_on_the_master() {
        let gone = [Hold {
            token: b"a"[..].into(),
            grant: grant(2, Some(b"s")),
        }];
        let stays = Change::release_replayed(&gone, true, (2, 1));
        assert_eq!(
            (stays.fate, stays.replicate),
            (Fate::Stays, Replicate::Verbatim)
        );
        assert_eq!(stays.ended.as_deref().map(|e| e.unbound.len()), Some(1));
        let goes = Change::release_replayed(&gone, false, (1, 0));
        assert_eq!(goes.fate, Fate::Deleted);
        assert_eq!(goes.count, None, "counted where it was decided");
    }

    /// Two shared holds on a key, one with a 1 s ttl and one with 10 s,
    /// granted at `t`.
    fn two_shared(t: u64) -> Lease {
        use crate::holds::{Mode, Terms, Unbound};
        use crate::lease::{FenceSequence, Request};
        let mut fences = FenceSequence::new();
        let mut lease = Lease::default();
        let shared = Terms {
            mode: Mode::Shared,
            ..Terms::PLAIN
        };
        for (token, ttl) in [(&b"short"[..], 1_000), (&b"long"[..], 10_000)] {
            let request = Request {
                terms: shared,
                max_holders: 8,
                ..Request::plain(token, ttl, t)
            };
            let outcome = lease.acquire(request, &mut fences, &mut Unbound);
            assert!(matches!(outcome, Ok((Acquire::Granted { .. }, _))));
        }
        lease.set_index_mark(Some(t + 1_000));
        lease
    }

    #[test]
    fn the_reaper_drops_what_ran_out_and_keeps_the_rest() {
        use crate::holds::Unbound;
        let t = 1_700_000_000_000;
        let mut lease = two_shared(t);
        let c = Change::settled(&mut lease, t + 1_500, &mut Unbound, None, false, t + 1_600);
        assert_eq!(c.replicate, Replicate::Pruned);
        assert_eq!(c.fate, Fate::Stays);
        assert_eq!(c.shared, (2, 1));
        assert_eq!(
            c.index,
            Index::Reset {
                old: Some(t + 1_000),
                recheck: None
            }
        );
        let ended = c.ended.as_deref().expect("a hold ended");
        assert_eq!(ended.expired, 1);
        assert_eq!(ended.dropped, vec![Box::<[u8]>::from(&b"short"[..])]);
        assert_eq!(ended.delay, None);
        assert_eq!(c.signal, Signal::Never, "nobody waits");
    }

    #[test]
    fn the_reaper_deletes_a_key_left_empty_unless_clients_wait() {
        use crate::holds::Unbound;
        let t = 1_700_000_000_000;
        let mut lease = two_shared(t);
        let gone = Change::settled(&mut lease, t + 20_000, &mut Unbound, None, false, t);
        assert_eq!(
            (gone.fate, gone.replicate),
            (Fate::Deleted, Replicate::Deleted)
        );
        assert_eq!(gone.index, Index::Remove(t + 1_000));
        assert_eq!(
            lease.index_mark(),
            None,
            "the unlink finds no entry to remove"
        );
        assert!(gone
            .ended
            .as_deref()
            .is_some_and(|e| e.dropped.is_empty() && e.expired == 2));

        let mut lease = two_shared(t);
        let kept = Change::settled(&mut lease, t + 20_000, &mut Unbound, None, true, t + 20_100);
        assert_eq!(
            (kept.fate, kept.replicate),
            (Fate::Stays, Replicate::Pruned)
        );
        assert_eq!(
            kept.index,
            Index::Reset {
                old: Some(t + 1_000),
                recheck: Some(t + 20_100)
            },
            "free, kept for the head of the queue, looked at again"
        );
        assert_eq!(kept.signal, Signal::IfWaiting);
        assert_eq!(kept.ended.as_deref().map(|e| e.dropped.len()), Some(2));
    }

    #[test]
    fn the_reapers_compact_deletion_is_counted_only_when_it_expired() {
        let expired = Change::reaped(true);
        assert_eq!(
            (expired.count, expired.notify),
            (Some(Count::Expired), Some(notifications::EXPIRE))
        );
        let free = Change::reaped(false);
        assert_eq!((free.count, free.notify), (None, None));
        assert_eq!(
            (free.fate, free.replicate),
            (Fate::Deleted, Replicate::Deleted)
        );
    }
}
