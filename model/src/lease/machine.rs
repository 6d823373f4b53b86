//! The lease state machine: a grant asked on its terms, a renewal, a
//! release, the reaper's pruning, and the effects a master decided applied
//! on a replica. Time comes in as `now_ms`; sessions are read through the
//! `Sessions` the caller passes; fences come from the node's sequence.

use crate::holds::{Binding, Grant, Hold, Mode, Refused, Sessions, Terms, NO_DEADLINE};

use super::fence::{FenceExhausted, FenceSequence};
use super::packed::Lease;
use super::token::Holder;

/// What `Lease::acquire` decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquire {
    /// A new grant with a new fence.
    Granted { fence: u64 },
    /// The same token asked again while holding: deadline moved, same fence.
    Retried { fence: u64 },
    /// Held by another token, or free with waiters queued ahead of the caller.
    Busy,
}

/// A grant asked for: `token` for `ttl_ms` on `terms` at `now_ms`, and
/// what the wait queue says of the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request<'a> {
    pub token: &'a [u8],
    /// 0 (with a session): no deadline of its own.
    pub ttl_ms: u64,
    pub terms: Terms<'a>,
    pub now_ms: u64,
    /// Clients wait for this key: its limit stays while they do, even with
    /// no hold left.
    pub waiting: bool,
    /// One of them is ahead of this caller, who then gets `Busy` for a hold
    /// the queue is owed.
    pub queue_ahead: bool,
    /// The most live holds a key may have (`lease.max-holders`).
    pub max_holders: usize,
}

impl<'a> Request<'a> {
    /// An exclusive grant on version 1's terms, nobody waiting, no cap.
    #[inline]
    pub const fn plain(token: &'a [u8], ttl_ms: u64, now_ms: u64) -> Self {
        Self {
            token,
            ttl_ms,
            terms: Terms::PLAIN,
            now_ms,
            waiting: false,
            queue_ahead: false,
            max_holders: usize::MAX,
        }
    }
}

/// The holds a grant replaced because they were not live: counted and
/// announced as expiries, and unbound from their sessions.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Replaced {
    pub count: usize,
    /// Each with when it ended (empty for a compact lease's holder).
    pub holds: Vec<(Hold, u64)>,
}

impl Replaced {
    fn compact(replaced: bool) -> Self {
        Self {
            count: usize::from(replaced),
            holds: Vec::new(),
        }
    }

    fn ended(holds: Vec<Hold>, now_ms: u64, sessions: &mut impl Sessions) -> Self {
        let holds: Vec<(Hold, u64)> = holds
            .into_iter()
            .map(|h| {
                let at = h.grant.ended_at(now_ms, sessions).unwrap_or(now_ms);
                (h, at)
            })
            .collect();
        Self {
            count: holds.len(),
            holds,
        }
    }
}

/// What `Lease::renew` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renew {
    Renewed,
    /// No live hold of that token: refused, as version 1 refuses.
    NotHeld,
    /// A ttl of 0 for a hold bound to no session: an error.
    ZeroTtlUnbound,
}

impl Lease {
    /// The earliest deadline of any hold after `deadline` moved to a new one.
    #[inline]
    fn lower_earliest(&mut self, deadline_ms: u64) {
        if deadline_ms == NO_DEADLINE {
            return;
        }
        let earliest = self.deadline_ms();
        if earliest == 0 || deadline_ms < earliest {
            self.set_deadline(deadline_ms);
        }
    }

    /// Grants a hold on the terms asked (mode, limit, owner, session,
    /// delay), or repeats the grant to a token that holds it; a caller
    /// behind the queue, a key held otherwise, full or in a lock-delay gets
    /// `Busy`. Also returns the holds that were not live and the grant
    /// replaced. A refusal or `Busy` leaves the lease exactly as it was.
    pub fn acquire(
        &mut self,
        request: Request<'_>,
        fences: &mut FenceSequence,
        sessions: &mut impl Sessions,
    ) -> Result<(Acquire, Replaced), Refused> {
        let Request {
            token,
            ttl_ms,
            terms,
            now_ms,
            waiting,
            queue_ahead,
            max_holders,
        } = request;
        let deadline_ms = match ttl_ms {
            0 => NO_DEADLINE,
            ttl => now_ms.saturating_add(ttl),
        };
        if !self.is_extended() && terms.is_plain() {
            // A grant over a holder is a grant over an expired one.
            let had_holder = self.deadline().is_some();
            return self
                .acquire_compact(token, ttl_ms, now_ms, queue_ahead, fences)
                .map(|a| {
                    let replaced = had_holder && matches!(a, Acquire::Granted { .. });
                    (a, Replaced::compact(replaced))
                })
                .map_err(|_| Refused::FenceExhausted);
        }
        let binding = terms.session.map(|(key, fence)| Binding {
            key: key.into(),
            fence,
        });
        // What the key is, read alike from either form: decided before any
        // change, so a refusal or a busy key is left exactly as it was.
        let (mode, limit, live, own, delayed) = match self.extended() {
            None => {
                let live = now_ms < self.deadline_ms();
                let own = (live && self.holds(token)).then(|| (self.fence(), None));
                (Mode::Exclusive, None, usize::from(live), own, false)
            }
            Some(holds) => {
                let own = holds
                    .get(token)
                    .filter(|g| g.is_live(now_ms, sessions))
                    .map(|g| (g.fence, g.session().cloned()));
                let live = holds.live(now_ms, self.deadline_ms(), sessions);
                let delayed = now_ms < holds.delay_end(now_ms, sessions);
                (holds.mode(), holds.limit(), live, own, delayed)
            }
        };
        if let Some((fence, bound_to)) = own {
            if mode != terms.mode {
                return Err(Refused::OtherMode);
            }
            if limit != terms.limit {
                return Err(Refused::LimitMismatch(limit));
            }
            if binding.is_some() && binding != bound_to {
                return Err(Refused::OtherSession);
            }
            if ttl_ms == 0 && bound_to.is_none() {
                return Err(Refused::NoDeadlineUnbound);
            }
            self.extend();
            if let Some(holds) = self.extended_mut() {
                if let Some(mut grant) = holds.get(token).cloned() {
                    grant.deadline_ms = deadline_ms;
                    if let Some(owner) = terms.owner {
                        grant.set_owner(owner);
                    }
                    holds.insert(token, grant);
                }
            }
            self.lower_earliest(deadline_ms);
            return Ok((Acquire::Retried { fence }, Replaced::default()));
        }
        if (live > 0 || waiting) && limit != terms.limit {
            return Err(Refused::LimitMismatch(limit));
        }
        let room = terms.limit.map_or(usize::MAX, |n| n as usize);
        let busy = queue_ahead
            || delayed
            || (live > 0 && (mode == Mode::Exclusive || terms.mode == Mode::Exclusive))
            || live >= room;
        if busy {
            return Ok((Acquire::Busy, Replaced::default()));
        }
        if live >= max_holders {
            return Err(Refused::TooManyHolders);
        }
        let fence = fences
            .next(self.fence(), now_ms)
            .map_err(|_| Refused::FenceExhausted)?;
        self.extend();
        // ok: `extend` just made the holds.
        let Some(holds) = self.extended_mut() else {
            return Ok((Acquire::Busy, Replaced::default()));
        };
        let replaced = match terms.mode {
            Mode::Exclusive => holds.clear(),
            Mode::Shared => holds
                .remove(token)
                .map(|grant| Hold {
                    token: token.into(),
                    grant,
                })
                .into_iter()
                .collect(),
        };
        let replaced = Replaced::ended(replaced, now_ms, sessions);
        holds.set_delayed_until(0);
        if terms.is_plain() {
            // Nothing beyond what version 1 keeps: back to the compact form.
            self.set_fence(fence);
            self.set_holder(token, deadline_ms);
            return Ok((Acquire::Granted { fence }, replaced));
        }
        holds.set_terms(terms.mode, terms.limit);
        let grant = Grant::with(
            fence,
            deadline_ms,
            terms.owner.map(Into::into),
            binding,
            terms.delay_ms,
        );
        holds.insert(token, grant);
        // An exclusive hold is the only one: the next look is its deadline
        // (none for a hold that lives as long as its session). A shared one
        // only lowers it, without a walk over the others.
        let exclusive = terms.mode == Mode::Exclusive;
        let next = exclusive.then(|| Self::next_look(holds));
        self.set_fence(fence);
        match next {
            Some(next) => self.set_deadline(next),
            None => self.lower_earliest(deadline_ms),
        }
        Ok((Acquire::Granted { fence }, replaced))
    }

    /// A plain grant on a compact lease (version 1's path, the hot one):
    /// to `token` for `ttl_ms`, or again to its current holder.
    fn acquire_compact(
        &mut self,
        token: &[u8],
        ttl_ms: u64,
        now_ms: u64,
        queue_ahead: bool,
        fences: &mut FenceSequence,
    ) -> Result<Acquire, FenceExhausted> {
        let deadline_ms = now_ms.saturating_add(ttl_ms);
        if now_ms < self.deadline_ms() {
            if !self.holds(token) {
                return Ok(Acquire::Busy);
            }
            self.set_deadline(deadline_ms);
            return Ok(Acquire::Retried {
                fence: self.fence(),
            });
        }
        if queue_ahead {
            return Ok(Acquire::Busy);
        }
        let fence = fences.next(self.fence(), now_ms)?;
        self.set_fence(fence);
        self.set_holder(token, deadline_ms);
        Ok(Acquire::Granted { fence })
    }

    /// Moves the deadline of a live hold of `token` to `now + ttl` (a
    /// `ttl_ms` of 0: no deadline of its own, for a bound hold). Never
    /// revives a hold that is not live.
    #[inline]
    pub fn renew(
        &mut self,
        token: &[u8],
        ttl_ms: u64,
        now_ms: u64,
        sessions: &mut impl Sessions,
    ) -> Renew {
        let Some(holds) = self.extended_mut() else {
            if ttl_ms == 0 {
                return match self.held_by(token, now_ms) {
                    true => Renew::ZeroTtlUnbound,
                    false => Renew::NotHeld,
                };
            }
            return match self.renew_compact(token, ttl_ms, now_ms) {
                true => Renew::Renewed,
                false => Renew::NotHeld,
            };
        };
        let deadline_ms = match ttl_ms {
            0 => NO_DEADLINE,
            ttl => now_ms.saturating_add(ttl),
        };
        // One lookup of the token: the deadline moves in place (nothing else
        // of the hold changes, so the table's counts stay right).
        let Some(grant) = holds.get_mut(token) else {
            return Renew::NotHeld;
        };
        if !grant.is_live(now_ms, sessions) {
            return Renew::NotHeld;
        }
        if ttl_ms == 0 && grant.session().is_none() {
            return Renew::ZeroTtlUnbound;
        }
        grant.deadline_ms = deadline_ms;
        self.lower_earliest(deadline_ms);
        Renew::Renewed
    }

    /// Moves the deadline of a live compact lease held by `token` to
    /// `now + ttl`. Never revives an expired one.
    #[inline]
    fn renew_compact(&mut self, token: &[u8], ttl_ms: u64, now_ms: u64) -> bool {
        let held = self.held_by(token, now_ms);
        if held {
            self.set_deadline(now_ms.saturating_add(ttl_ms));
        }
        held
    }

    /// Ends the live hold of `token`, other holds staying; returns it.
    #[inline]
    pub fn release(
        &mut self,
        token: &[u8],
        now_ms: u64,
        sessions: &mut impl Sessions,
    ) -> Option<Grant> {
        if let Some(holds) = self.extended_mut() {
            let held = holds
                .get(token)
                .is_some_and(|g| g.is_live(now_ms, sessions));
            let gone = held.then(|| holds.remove(token)).flatten();
            if holds.is_empty() {
                let next = Self::next_look(holds);
                self.set_deadline(next);
            }
            return gone;
        }
        let held = self.held_by(token, now_ms);
        if held {
            let grant = Grant::new(self.fence(), self.deadline_ms());
            self.set_holder(&[], 0);
            return Some(grant);
        }
        None
    }

    /// Removes every hold of an extended lease that is not live (its own
    /// deadline passed, or its session ended); returns them with when each
    /// ended. The next look is then exact again.
    pub fn prune(&mut self, now_ms: u64, sessions: &mut impl Sessions) -> Vec<(Hold, u64)> {
        let Some(holds) = self.extended_mut() else {
            return Vec::new();
        };
        let ended = holds.prune(now_ms, sessions);
        if holds.delayed_until() <= now_ms {
            holds.set_delayed_until(0);
        }
        let next = Self::next_look(holds);
        self.set_deadline(next);
        ended
    }

    /// Makes an extended lease's next look exact again: a release or a
    /// renewal of the hold that had the earliest deadline leaves an earlier
    /// one, which costs only a look too soon, until this.
    #[inline]
    pub fn refresh_earliest(&mut self) {
        if let Some(holds) = self.extended() {
            let next = Self::next_look(holds);
            self.set_deadline(next);
        }
    }

    /// Overwrites the state with values decided elsewhere (a master's effect,
    /// an AOF entry). The fence sequence must have observed `fence` already.
    #[inline]
    pub fn apply(&mut self, holder: Option<Holder>, fence: u64) {
        self.set_fence(fence);
        match holder {
            Some(h) => self.set_holder(&h.token, h.deadline_ms),
            None => self.set_holder(&[], 0),
        }
    }

    /// A master's effect: `token`'s hold is `grant`, on the key's terms
    /// `mode` and `limit` (an exclusive hold is the only one). Returns the
    /// holds it replaced.
    pub fn apply_hold(
        &mut self,
        token: &[u8],
        grant: Grant,
        mode: Mode,
        limit: Option<u32>,
    ) -> Vec<Hold> {
        self.extend();
        let fence = self.fence().max(grant.fence);
        let deadline_ms = grant.deadline_ms;
        let mut replaced = Vec::new();
        if let Some(holds) = self.extended_mut() {
            if mode == Mode::Exclusive {
                // Every hold goes, the token's own too (its binding with it).
                replaced = holds.clear();
            }
            holds.set_terms(mode, limit);
            holds.set_delayed_until(0);
            if let Some(old) = holds.insert(token, grant) {
                replaced.push(Hold {
                    token: token.into(),
                    grant: old,
                });
            }
        }
        self.set_fence(fence);
        if mode == Mode::Exclusive {
            self.set_deadline(if deadline_ms == NO_DEADLINE {
                0
            } else {
                deadline_ms
            });
        } else {
            self.lower_earliest(deadline_ms);
        }
        replaced
    }

    /// A master's effect: these holds are gone (released or ended); returns
    /// them.
    pub fn apply_drop<'a>(&mut self, tokens: impl IntoIterator<Item = &'a [u8]>) -> Vec<Hold> {
        let Some(holds) = self.extended_mut() else {
            return Vec::new();
        };
        let gone: Vec<Hold> = tokens
            .into_iter()
            .filter_map(|token| {
                holds.remove(token).map(|grant| Hold {
                    token: token.into(),
                    grant,
                })
            })
            .collect();
        if holds.is_empty() {
            let next = Self::next_look(holds);
            self.set_deadline(next);
        }
        gone
    }

    /// A master's effect: no grant before `until_ms` (a lock-delay).
    pub fn apply_delay(&mut self, until_ms: u64) {
        if until_ms == 0 && !self.is_extended() {
            return;
        }
        self.extend();
        if let Some(holds) = self.extended_mut() {
            holds.set_delayed_until(until_ms);
            let next = Self::next_look(holds);
            self.set_deadline(next);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{acquire, granted, key_with, on, renew, shared, SHARED, T0};
    use super::*;
    use crate::holds::Unbound;
    use crate::lease::{State, FENCES_PER_MS, FENCE_LIMIT, MAX_TTL_MS};

    #[test]
    fn grant_on_free_key_issues_fence_and_deadline() {
        let mut seq = FenceSequence::new();
        let mut lease = Lease::default();
        let fence = granted(acquire(&mut lease, b"a", 1000, T0, false, &mut seq));
        assert_eq!(fence, T0 * FENCES_PER_MS);
        assert_eq!(lease.fence(), fence);
        assert_eq!(lease.state(T0, &mut Unbound), State::Held { ttl_ms: 1000 });
        assert!(lease.is_live(T0, &mut Unbound));
        assert_eq!(lease.deadline(), Some(T0 + 1000));
    }

    #[test]
    fn idempotent_retry_keeps_fence_and_moves_deadline() {
        let mut seq = FenceSequence::new();
        let mut lease = Lease::default();
        let fence = granted(acquire(&mut lease, b"a", 1000, T0, false, &mut seq));
        let again = acquire(&mut lease, b"a", 5000, T0 + 400, false, &mut seq);
        assert_eq!(again, Ok(Acquire::Retried { fence }));
        assert_eq!(
            lease.state(T0 + 400, &mut Unbound),
            State::Held { ttl_ms: 5000 }
        );
        assert_eq!(seq.last(), fence, "a retry issues no fence");
    }

    #[test]
    fn other_token_is_busy_while_live() {
        let mut seq = FenceSequence::new();
        let mut lease = Lease::default();
        granted(acquire(&mut lease, b"a", 1000, T0, false, &mut seq));
        for now in [T0, T0 + 1, T0 + 999] {
            assert_eq!(
                acquire(&mut lease, b"b", 1000, now, false, &mut seq),
                Ok(Acquire::Busy)
            );
        }
    }

    #[test]
    fn expiry_happens_at_the_exact_deadline() {
        let mut seq = FenceSequence::new();
        let mut lease = Lease::default();
        let first = granted(acquire(&mut lease, b"a", 1000, T0, false, &mut seq));
        assert_eq!(
            lease.state(T0 + 999, &mut Unbound),
            State::Held { ttl_ms: 1 }
        );
        assert_eq!(lease.state(T0 + 1000, &mut Unbound), State::Free);
        assert!(!renew(&mut lease, b"a", 1000, T0 + 1000), "never revives");
        assert!(lease.release(b"a", T0 + 1000, &mut Unbound).is_none());
        let second = granted(acquire(&mut lease, b"b", 1000, T0 + 1000, false, &mut seq));
        assert!(second > first);
    }

    #[test]
    fn renew_table() {
        // (token, at, expect)
        let cases: &[(&[u8], u64, bool)] = &[
            (b"a", T0, true),
            (b"a", T0 + 999, true),
            (b"a", T0 + 1000, false),
            (b"b", T0, false),
            (b"", T0, false),
            (b"aa", T0, false),
        ];
        for &(token, at, expect) in cases {
            let mut seq = FenceSequence::new();
            let mut lease = Lease::default();
            let fence = granted(acquire(&mut lease, b"a", 1000, T0, false, &mut seq));
            assert_eq!(
                renew(&mut lease, token, 300, at),
                expect,
                "{token:?} at {at}"
            );
            let want = if expect {
                State::Held { ttl_ms: 300 }
            } else if at < T0 + 1000 {
                State::Held {
                    ttl_ms: T0 + 1000 - at,
                }
            } else {
                State::Free
            };
            assert_eq!(lease.state(at, &mut Unbound), want);
            assert_eq!(lease.fence(), fence, "renew keeps the fence");
        }
    }

    #[test]
    fn release_only_by_the_live_holder() {
        let mut seq = FenceSequence::new();
        let mut lease = Lease::default();
        granted(acquire(&mut lease, b"a", 1000, T0, false, &mut seq));
        assert!(lease.release(b"b", T0 + 1, &mut Unbound).is_none());
        assert_eq!(
            lease.state(T0 + 1, &mut Unbound),
            State::Held { ttl_ms: 999 }
        );
        assert!(lease.release(b"a", T0 + 1, &mut Unbound).is_some());
        assert_eq!(lease.state(T0 + 1, &mut Unbound), State::Free);
        assert!(
            lease.release(b"a", T0 + 2, &mut Unbound).is_none(),
            "a second release is a no-op"
        );
    }

    #[test]
    fn fences_rise_across_release_expiry_and_new_keys() {
        let mut seq = FenceSequence::new();
        let mut fences = Vec::new();
        let mut lease = Lease::default();
        fences.push(granted(acquire(&mut lease, b"a", 10, T0, false, &mut seq)));
        assert!(lease.release(b"a", T0, &mut Unbound).is_some());
        fences.push(granted(acquire(&mut lease, b"b", 10, T0, false, &mut seq)));
        // expiry
        fences.push(granted(acquire(
            &mut lease,
            b"c",
            10,
            T0 + 10,
            false,
            &mut seq,
        )));
        // the key was deleted: a new record starts from fence 0
        let mut fresh = Lease::default();
        fences.push(granted(acquire(
            &mut fresh,
            b"d",
            10,
            T0 + 10,
            false,
            &mut seq,
        )));
        // the clock went backwards: the sequence still rises
        let mut other = Lease::default();
        fences.push(granted(acquire(
            &mut other,
            b"e",
            10,
            T0 - 60_000,
            false,
            &mut seq,
        )));
        assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
        assert!(fences.iter().all(|&f| f < FENCE_LIMIT));
    }

    #[test]
    fn a_free_lease_goes_to_the_queue_first() {
        let mut seq = FenceSequence::new();
        let mut lease = Lease::default();
        granted(acquire(&mut lease, b"a", 1000, T0, false, &mut seq));
        // the holder's retry is not a queue jump
        assert!(matches!(
            acquire(&mut lease, b"a", 1000, T0 + 1, true, &mut seq),
            Ok(Acquire::Retried { .. })
        ));
        assert!(lease.release(b"a", T0 + 1, &mut Unbound).is_some());
        assert_eq!(
            acquire(&mut lease, b"late", 1000, T0 + 1, true, &mut seq),
            Ok(Acquire::Busy),
            "no jumping the queue"
        );
        granted(acquire(&mut lease, b"head", 1000, T0 + 1, false, &mut seq));
    }

    #[test]
    fn deadline_saturates_instead_of_wrapping() {
        let mut seq = FenceSequence::new();
        let mut lease = Lease::default();
        granted(acquire(&mut lease, b"a", MAX_TTL_MS, T0, false, &mut seq));
        assert_eq!(
            lease.state(T0, &mut Unbound),
            State::Held { ttl_ms: MAX_TTL_MS }
        );
    }

    #[test]
    fn mode_by_state_table() {
        use Acquire::{Busy, Granted, Retried};
        type Case = (
            &'static str,
            Vec<(&'static [u8], Terms<'static>)>,
            &'static [u8],
            Terms<'static>,
            fn(&Result<Acquire, Refused>) -> bool,
        );
        let cases: Vec<Case> = vec![
            ("shared on free", vec![], b"a", SHARED, |r| {
                matches!(r, Ok(Granted { .. }))
            }),
            (
                "shared beside shared",
                vec![(b"a", SHARED)],
                b"b",
                SHARED,
                |r| matches!(r, Ok(Granted { .. })),
            ),
            (
                "exclusive beside shared",
                vec![(b"a", SHARED)],
                b"b",
                Terms::PLAIN,
                |r| matches!(r, Ok(Busy)),
            ),
            (
                "shared beside exclusive",
                vec![(b"a", Terms::PLAIN)],
                b"b",
                SHARED,
                |r| matches!(r, Ok(Busy)),
            ),
            (
                "limit full",
                vec![(b"a", shared(2)), (b"b", shared(2))],
                b"c",
                shared(2),
                |r| matches!(r, Ok(Busy)),
            ),
            (
                "limit room",
                vec![(b"a", shared(2))],
                b"c",
                shared(2),
                |r| matches!(r, Ok(Granted { .. })),
            ),
            ("retry shared", vec![(b"a", SHARED)], b"a", SHARED, |r| {
                matches!(r, Ok(Retried { .. }))
            }),
            (
                "other mode, shared holder",
                vec![(b"a", SHARED)],
                b"a",
                Terms::PLAIN,
                |r| *r == Err(Refused::OtherMode),
            ),
            (
                "other mode, exclusive holder",
                vec![(b"a", Terms::PLAIN)],
                b"a",
                SHARED,
                |r| *r == Err(Refused::OtherMode),
            ),
            (
                "another limit",
                vec![(b"a", shared(2))],
                b"b",
                shared(3),
                |r| *r == Err(Refused::LimitMismatch(Some(2))),
            ),
            (
                "no limit where one is",
                vec![(b"a", shared(2))],
                b"b",
                SHARED,
                |r| *r == Err(Refused::LimitMismatch(Some(2))),
            ),
            (
                "exclusive where a limit is",
                vec![(b"a", shared(2))],
                b"b",
                Terms::PLAIN,
                |r| *r == Err(Refused::LimitMismatch(Some(2))),
            ),
            (
                "a limit where none is",
                vec![(b"a", SHARED)],
                b"b",
                shared(2),
                |r| *r == Err(Refused::LimitMismatch(None)),
            ),
            (
                "a limit on an exclusive key",
                vec![(b"a", Terms::PLAIN)],
                b"b",
                shared(2),
                |r| *r == Err(Refused::LimitMismatch(None)),
            ),
        ];
        for (name, before, token, terms, expect) in cases {
            let mut fences = FenceSequence::new();
            let mut lease = key_with(&before, &mut fences);
            let snapshot = lease.clone();
            let got = on(&mut lease, token, terms, T0 + 1, &mut fences);
            assert!(expect(&got), "{name}: {got:?}");
            if !matches!(got, Ok(Granted { .. }) | Ok(Retried { .. })) {
                assert_eq!(lease, snapshot, "{name}: a refusal changes nothing");
            }
        }
    }

    #[test]
    fn every_hold_has_its_own_rising_fence_and_deadline() {
        let mut fences = FenceSequence::new();
        let mut lease = Lease::default();
        let mut seen = Vec::new();
        for (i, token) in [&b"a"[..], b"b", b"c"].into_iter().enumerate() {
            let now = T0 + i as u64;
            let fence = match on(&mut lease, token, SHARED, now, &mut fences) {
                Ok(Acquire::Granted { fence }) => fence,
                other => panic!("{other:?}"),
            };
            seen.push(fence);
        }
        assert!(seen.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(lease.fence(), seen[2]);
        let holds = lease.live_holds(T0 + 10, &mut Unbound);
        assert_eq!(holds.iter().map(|h| h.fence).collect::<Vec<_>>(), seen);
        assert_eq!(holds[1].deadline_ms, T0 + 1 + 1000);
        // The retry keeps its fence and moves only its own deadline.
        assert_eq!(
            on(&mut lease, b"a", SHARED, T0 + 500, &mut fences),
            Ok(Acquire::Retried { fence: seen[0] })
        );
        let holds = lease.live_holds(T0 + 10, &mut Unbound);
        assert_eq!(holds[0].deadline_ms, T0 + 1500);
        assert_eq!(holds[1].deadline_ms, T0 + 1001);
        assert_eq!(
            lease.state(T0 + 10, &mut Unbound),
            State::Held { ttl_ms: 1490 }
        );
    }

    #[test]
    fn renew_and_release_act_on_one_hold() {
        let mut fences = FenceSequence::new();
        let mut lease = key_with(&[(b"a", SHARED), (b"b", SHARED)], &mut fences);
        assert!(renew(&mut lease, b"a", 5000, T0 + 100));
        assert!(!renew(&mut lease, b"zz", 5000, T0 + 100));
        assert!(lease.release(b"b", T0 + 100, &mut Unbound).is_some());
        assert!(lease.release(b"b", T0 + 100, &mut Unbound).is_none());
        assert_eq!(lease.view(T0 + 100, &mut Unbound).holders, 1);
        // b is gone; a lives to T0 + 5100.
        assert!(!renew(&mut lease, b"b", 10, T0 + 200));
        assert!(lease.is_live(T0 + 5099, &mut Unbound));
        assert!(!lease.is_live(T0 + 5100, &mut Unbound));
        assert!(!renew(&mut lease, b"a", 10, T0 + 5100), "never revives");
        assert!(lease.release(b"a", T0 + 5099, &mut Unbound).is_some());
        assert_eq!(lease.deadline(), None);
    }

    #[test]
    fn expired_holds_free_their_place_and_the_reaper_takes_them() {
        let mut fences = FenceSequence::new();
        let mut lease = key_with(&[(b"a", shared(2))], &mut fences);
        assert!(renew(&mut lease, b"a", 10, T0));
        assert!(matches!(
            on(&mut lease, b"b", shared(2), T0 + 1, &mut fences),
            Ok(Acquire::Granted { .. })
        ));
        assert_eq!(lease.view(T0 + 5, &mut Unbound).holders, 2);
        assert_eq!(lease.deadline(), Some(T0 + 10), "the earliest deadline");
        assert!(lease.has_expired_hold(T0 + 10));
        assert_eq!(lease.view(T0 + 10, &mut Unbound).holders, 1);
        // The expired hold makes room at once, before any reaping.
        assert!(matches!(
            on(&mut lease, b"c", shared(2), T0 + 10, &mut fences),
            Ok(Acquire::Granted { .. })
        ));
        let pruned = lease.prune(T0 + 10, &mut Unbound);
        assert_eq!(pruned.len(), 1);
        assert_eq!((&*pruned[0].0.token, pruned[0].1), (&b"a"[..], T0 + 10));
        assert_eq!(lease.deadline(), Some(T0 + 1001));
        assert!(!lease.has_expired_hold(T0 + 10));
        // Once no hold is live the key forgets its limit and mode.
        assert!(matches!(
            on(&mut lease, b"d", shared(9), T0 + 3000, &mut fences),
            Ok(Acquire::Granted { .. })
        ));
        assert_eq!(lease.view(T0 + 3000, &mut Unbound).limit, Some(9));
    }

    #[test]
    fn the_earliest_deadline_is_made_exact_again() {
        let mut fences = FenceSequence::new();
        let mut lease = key_with(&[(b"a", SHARED), (b"b", SHARED)], &mut fences);
        assert!(renew(&mut lease, b"a", 10, T0));
        assert!(renew(&mut lease, b"b", 5000, T0));
        assert!(lease.release(b"a", T0 + 1, &mut Unbound).is_some());
        // Left at a's deadline: a look too soon, never too late.
        assert_eq!(lease.deadline(), Some(T0 + 10));
        assert!(!lease.has_expired_hold(T0 + 10));
        lease.refresh_earliest();
        assert_eq!(lease.deadline(), Some(T0 + 5000));
    }

    #[test]
    fn queue_and_caps() {
        let mut fences = FenceSequence::new();
        let mut lease = key_with(&[(b"a", SHARED)], &mut fences);
        let snapshot = lease.clone();
        // A waiter ahead: no new hold, shared or not; a retry still renews.
        let ahead = |lease: &mut Lease, token: &[u8], fences: &mut FenceSequence| {
            let request = Request {
                terms: SHARED,
                waiting: true,
                queue_ahead: true,
                ..Request::plain(token, 1000, T0 + 1)
            };
            lease.acquire(request, fences, &mut Unbound).map(|(a, _)| a)
        };
        assert_eq!(ahead(&mut lease, b"b", &mut fences), Ok(Acquire::Busy));
        assert_eq!(lease, snapshot);
        assert!(matches!(
            ahead(&mut lease, b"a", &mut fences),
            Ok(Acquire::Retried { .. })
        ));
        let capped = Request {
            terms: SHARED,
            max_holders: 1,
            ..Request::plain(b"c", 1000, T0 + 1)
        };
        assert_eq!(
            lease.acquire(capped, &mut fences, &mut Unbound),
            Err(Refused::TooManyHolders)
        );
        // The limit is kept while clients wait, even with no hold left.
        let mut lease = key_with(&[(b"a", shared(2))], &mut fences);
        assert!(lease.release(b"a", T0 + 1, &mut Unbound).is_some());
        let waiting = Request {
            terms: SHARED,
            waiting: true,
            max_holders: 10,
            ..Request::plain(b"w", 1000, T0 + 2)
        };
        assert_eq!(
            lease.acquire(waiting, &mut fences, &mut Unbound),
            Err(Refused::LimitMismatch(Some(2)))
        );
        let waiting = Request {
            terms: shared(2),
            ..waiting
        };
        assert!(matches!(
            lease.acquire(waiting, &mut fences, &mut Unbound),
            Ok((Acquire::Granted { .. }, _))
        ));
    }

    #[test]
    fn an_exclusive_grant_replaces_expired_holds_and_goes_back_to_compact() {
        let mut fences = FenceSequence::new();
        let mut lease = key_with(&[(b"a", SHARED), (b"b", SHARED)], &mut fences);
        let after = T0 + 1000;
        let plain = Request {
            max_holders: 10,
            ..Request::plain(b"x", 50, after)
        };
        let got = lease.acquire(plain, &mut fences, &mut Unbound);
        assert!(matches!(
            got,
            Ok((Acquire::Granted { .. }, Replaced { count: 2, .. }))
        ));
        assert!(!lease.is_extended());
        assert_eq!(lease.shared_holds(), 0);
        let owned = Request {
            terms: Terms {
                owner: Some(b"host-1"),
                ..Terms::PLAIN
            },
            ..Request::plain(b"y", 50, after + 50)
        };
        let got = lease.acquire(owned, &mut fences, &mut Unbound);
        assert!(matches!(
            got,
            Ok((Acquire::Granted { .. }, Replaced { count: 1, .. }))
        ));
        assert!(lease.is_extended());
        assert_eq!(
            lease.view(after + 50, &mut Unbound).owner,
            Some(&b"host-1"[..])
        );
        assert_eq!(
            lease.view(after + 50, &mut Unbound).mode,
            Some(Mode::Exclusive)
        );
    }

    #[test]
    fn a_replica_applies_holds_to_the_same_state() {
        let mut fences = FenceSequence::new();
        let master = key_with(&[(b"a", shared(3)), (b"b", shared(3))], &mut fences);
        let mut replica = Lease::default();
        let whole = master.persisted_holds().expect("extended");
        for hold in whole.holds {
            replica.apply_hold(&hold.token, hold.grant, whole.mode, whole.limit);
        }
        assert_eq!(replica, master);
        let mut master = master;
        assert!(master.release(b"a", T0 + 1, &mut Unbound).is_some());
        replica.apply_drop([&b"a"[..]]);
        assert_eq!(replica, master);
        // An exclusive hold is the only one.
        let grant = Grant::new(master.fence() + 1, T0 + 99);
        replica.apply_hold(b"x", grant, Mode::Exclusive, None);
        assert_eq!(replica.live_holds(T0, &mut Unbound).len(), 1);
        assert_eq!(replica.fence(), master.fence() + 1);
        // The version 1 form puts the compact lease back.
        replica.apply(None, 7);
        assert!(!replica.is_extended());
    }
}
