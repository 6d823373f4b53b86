//! What may be read of a lease without changing it: its state and ttl,
//! `LEASE.INFO`'s and `LEASE.HOLDERS`' fields, whether it is live or owes
//! the reaper a look, what it says as a session, its bindings, and its
//! holds as persisted. Never the token.

use crate::holds::{Binding, Grant, Hold, Holds, Mode, SessionState, Sessions};

use super::packed::Lease;

/// What a caller may see of a lease: never the token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// `ttl_ms`: until no hold is left.
    Held {
        ttl_ms: u64,
    },
    /// No hold, and no grant for `ttl_ms` (a lock-delay).
    Delayed {
        ttl_ms: u64,
    },
    Free,
}

/// `LEASE.INFO`'s fields beyond state and ttl.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct View<'a> {
    /// `None` when free.
    pub mode: Option<Mode>,
    pub holders: usize,
    pub limit: Option<u32>,
    /// The exclusive holder's label.
    pub owner: Option<&'a [u8]>,
    /// The session key the exclusive hold is bound to.
    pub session: Option<&'a [u8]>,
}

/// One live hold as `LEASE.HOLDERS` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveHold<'a> {
    pub fence: u64,
    /// When it ends as things stand (its own deadline or its session's).
    pub deadline_ms: u64,
    pub mode: Mode,
    pub owner: Option<&'a [u8]>,
    pub session: Option<&'a [u8]>,
}

/// Why a lease cannot be a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotSession {
    NoLiveSession,
    Shared,
    Bound,
}

/// An extended lease as persisted and replicated whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Persisted {
    pub mode: Mode,
    pub limit: Option<u32>,
    pub delayed_until: u64,
    pub holds: Vec<Hold>,
}

impl Lease {
    /// Whether any hold is live at `now_ms`.
    #[inline]
    pub fn is_live(&self, now_ms: u64, sessions: &mut impl Sessions) -> bool {
        match self.extended() {
            None => now_ms < self.deadline_ms(),
            Some(holds) => holds.live(now_ms, self.deadline_ms(), sessions) > 0,
        }
    }

    /// Whether a hold's deadline (or a lock-delay's end) has passed without
    /// its being dealt with: what the reaper is for. Bound holds whose
    /// session ended are the session's reaping, not this.
    #[inline]
    pub fn has_expired_hold(&self, now_ms: u64) -> bool {
        let deadline = self.deadline_ms();
        deadline != 0
            && now_ms >= deadline
            && self.extended().map_or(true, |h| {
                h.iter().any(|(_, g)| !g.own_live(now_ms))
                    || (h.delayed_until() != 0 && now_ms >= h.delayed_until())
            })
    }

    /// Until when a lock-delay keeps the key from any grant, if it does.
    #[inline]
    pub fn delayed(&self, now_ms: u64, sessions: &mut impl Sessions) -> Option<u64> {
        let holds = self.extended()?;
        Some(holds.delay_end(now_ms, sessions)).filter(|&until| now_ms < until)
    }

    /// Held (until no hold is left), in a lock-delay, or free, at `now_ms`.
    pub fn state(&self, now_ms: u64, sessions: &mut impl Sessions) -> State {
        let last = match self.extended() {
            None => Some(self.deadline_ms()).filter(|&d| now_ms < d),
            Some(holds) => holds.latest_live(now_ms, sessions),
        };
        match last {
            Some(deadline) => State::Held {
                ttl_ms: deadline - now_ms,
            },
            None => match self.delayed(now_ms, sessions) {
                Some(until) => State::Delayed {
                    ttl_ms: until - now_ms,
                },
                None => State::Free,
            },
        }
    }

    /// What `LEASE.INFO` shows beyond state and ttl.
    pub fn view(&self, now_ms: u64, sessions: &mut impl Sessions) -> View<'_> {
        match self.extended() {
            None => {
                let live = now_ms < self.deadline_ms();
                View {
                    mode: live.then_some(Mode::Exclusive),
                    holders: usize::from(live),
                    limit: None,
                    owner: None,
                    session: None,
                }
            }
            Some(holds) => {
                let holders = holds.live(now_ms, self.deadline_ms(), sessions);
                let exclusive = match holds.mode() {
                    Mode::Exclusive if holders > 0 => holds
                        .iter()
                        .find(|(_, g)| g.is_live(now_ms, sessions))
                        .map(|(_, g)| g),
                    _ => None,
                };
                View {
                    mode: (holders > 0).then_some(holds.mode()),
                    holders,
                    limit: holds.limit(),
                    owner: exclusive.and_then(Grant::owner),
                    session: exclusive.and_then(|g| g.session()).map(|b| &*b.key),
                }
            }
        }
    }

    /// The live holds, oldest grant first.
    pub fn live_holds(&self, now_ms: u64, sessions: &mut impl Sessions) -> Vec<LiveHold<'_>> {
        match self.extended() {
            None => self
                .holder()
                .filter(|h| now_ms < h.deadline_ms)
                .map(|h| LiveHold {
                    fence: self.fence(),
                    deadline_ms: h.deadline_ms,
                    mode: Mode::Exclusive,
                    owner: None,
                    session: None,
                })
                .into_iter()
                .collect(),
            Some(holds) => holds
                .by_grant()
                .into_iter()
                .filter_map(|(_, g)| {
                    let until = g.until(now_ms, sessions)?;
                    Some(LiveHold {
                        fence: g.fence,
                        deadline_ms: until,
                        mode: holds.mode(),
                        owner: g.owner(),
                        session: g.session().map(|b| &*b.key),
                    })
                })
                .collect(),
        }
    }

    /// Stored shared holds, live or not (the `lease_shared_holds` gauge).
    #[inline]
    pub fn shared_holds(&self) -> usize {
        self.extended()
            .filter(|h| h.mode() == Mode::Shared)
            .map_or(0, Holds::len)
    }

    /// Stored holds bound to a session (the `lease_bound_holds` gauge).
    #[inline]
    pub fn bound_holds(&self) -> usize {
        self.extended().map_or(0, Holds::bound)
    }

    /// What a session's key says of its grant with `fence`: live (until
    /// when), ended (when), or `None` when the key has no grant with that
    /// fence any more.
    pub fn session_state(&self, fence: u64, now_ms: u64) -> Option<SessionState> {
        let deadline = match self.extended() {
            None => self.holder().filter(|_| self.fence() == fence)?.deadline_ms,
            Some(holds) => {
                let (_, g) = holds.iter().find(|(_, g)| g.fence == fence)?;
                if holds.mode() != Mode::Exclusive || g.session().is_some() {
                    return None;
                }
                g.deadline_ms
            }
        };
        Some(if now_ms < deadline {
            SessionState::Live {
                deadline_ms: deadline,
            }
        } else {
            SessionState::Ended { at_ms: deadline }
        })
    }

    /// Whether `token` holds a live exclusive hold fit to be a session:
    /// its fence, or why not.
    pub fn as_session(&self, token: &[u8], now_ms: u64) -> Result<u64, NotSession> {
        match self.extended() {
            None if self.held_by(token, now_ms) => Ok(self.fence()),
            None => Err(NotSession::NoLiveSession),
            Some(holds) => {
                let grant = holds
                    .get(token)
                    .filter(|g| g.own_live(now_ms))
                    .ok_or(NotSession::NoLiveSession)?;
                if holds.mode() == Mode::Shared {
                    Err(NotSession::Shared)
                } else if grant.session().is_some() {
                    Err(NotSession::Bound)
                } else {
                    Ok(grant.fence)
                }
            }
        }
    }

    /// Whether the key stays after a release: an extended lease while it
    /// keeps any hold, live or not; a compact lease's one holder is gone
    /// with its release.
    #[inline]
    pub fn stays_after_release(&self) -> bool {
        self.extended().is_some_and(|h| !h.is_empty())
    }

    /// The session bindings of the lease's bound holds: none, and no
    /// allocation, for a lease without one.
    #[inline]
    pub fn bindings(&self) -> Vec<Binding> {
        match self.extended().filter(|_| self.bound_holds() > 0) {
            None => Vec::new(),
            Some(holds) => holds
                .iter()
                .filter_map(|(_, g)| g.session().cloned())
                .collect(),
        }
    }

    /// Every hold, for persistence: `None` for a compact lease (whose
    /// holder is `persisted_holder`).
    pub fn persisted_holds(&self) -> Option<Persisted> {
        let holds = self.extended()?;
        let list = holds
            .by_grant()
            .into_iter()
            .map(|(t, g)| Hold {
                token: t.into(),
                grant: g.clone(),
            })
            .collect();
        Some(Persisted {
            mode: holds.mode(),
            limit: holds.limit(),
            delayed_until: holds.delayed_until(),
            holds: list,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{acquire, granted, key_with, on, shared, SHARED, T0};
    use super::*;
    use crate::holds::{Terms, Unbound};
    use crate::lease::FenceSequence;

    /// What each read says of a lease in each state it can be in.
    #[test]
    fn every_read_by_state_table() {
        const OWNED: Terms<'static> = Terms {
            owner: Some(b"host-1"),
            ..Terms::PLAIN
        };
        const DELAYED: Terms<'static> = Terms {
            delay_ms: 500,
            ..Terms::PLAIN
        };
        // (name, the lease, read at, state, mode, holders, owner, expired hold)
        type Case = (
            &'static str,
            fn(&mut FenceSequence) -> Lease,
            u64,
            State,
            Option<Mode>,
            usize,
            Option<&'static [u8]>,
            bool,
        );
        let cases: Vec<Case> = vec![
            (
                "free",
                |_| Lease::default(),
                T0,
                State::Free,
                None,
                0,
                None,
                false,
            ),
            (
                "held",
                |f| key_with(&[(b"a", Terms::PLAIN)], f),
                T0 + 1,
                State::Held { ttl_ms: 999 },
                Some(Mode::Exclusive),
                1,
                None,
                false,
            ),
            (
                "held, at its deadline",
                |f| key_with(&[(b"a", Terms::PLAIN)], f),
                T0 + 1000,
                State::Free,
                None,
                0,
                None,
                true,
            ),
            (
                "two shared holds",
                |f| key_with(&[(b"a", shared(3)), (b"b", shared(3))], f),
                T0 + 10,
                State::Held { ttl_ms: 990 },
                Some(Mode::Shared),
                2,
                None,
                false,
            ),
            (
                "labelled",
                |f| key_with(&[(b"a", OWNED)], f),
                T0 + 10,
                State::Held { ttl_ms: 990 },
                Some(Mode::Exclusive),
                1,
                Some(b"host-1"),
                false,
            ),
            (
                "in its lock-delay",
                |f| key_with(&[(b"a", DELAYED)], f),
                T0 + 1200,
                State::Delayed { ttl_ms: 300 },
                None,
                0,
                None,
                true,
            ),
        ];
        for (name, make, at, state, mode, holders, owner, expired) in cases {
            let lease = make(&mut FenceSequence::new());
            assert_eq!(lease.state(at, &mut Unbound), state, "{name}");
            let view = lease.view(at, &mut Unbound);
            assert_eq!(
                (view.mode, view.holders, view.owner),
                (mode, holders, owner),
                "{name}"
            );
            assert_eq!(lease.is_live(at, &mut Unbound), holders > 0, "{name}");
            assert_eq!(lease.has_expired_hold(at), expired, "{name}");
            let live = lease.live_holds(at, &mut Unbound);
            assert_eq!(live.len(), holders, "{name}");
            assert!(live.iter().all(|h| at < h.deadline_ms), "{name}");
            let delay = matches!(state, State::Delayed { .. });
            assert_eq!(lease.delayed(at, &mut Unbound).is_some(), delay, "{name}");
        }
    }

    #[test]
    fn the_key_stays_after_a_release_while_holds_are_left() {
        let mut fences = FenceSequence::new();
        let mut compact = Lease::default();
        granted(acquire(&mut compact, b"a", 1000, T0, false, &mut fences));
        assert!(compact.release(b"a", T0, &mut Unbound).is_some());
        assert!(!compact.stays_after_release());
        let mut two = key_with(&[(b"a", SHARED), (b"b", SHARED)], &mut fences);
        assert!(two.release(b"a", T0, &mut Unbound).is_some());
        assert!(two.stays_after_release(), "b is left");
        assert!(two.release(b"b", T0, &mut Unbound).is_some());
        assert!(!two.stays_after_release());
        // An expired hold not yet reaped still keeps the key.
        let mut expired = key_with(&[(b"a", SHARED)], &mut fences);
        granted(on(&mut expired, b"b", SHARED, T0 + 500, &mut fences));
        assert!(expired.release(b"b", T0 + 1000, &mut Unbound).is_some());
        assert!(expired.stays_after_release());
    }

    #[test]
    fn a_session_is_a_live_unbound_exclusive_hold() {
        let mut fences = FenceSequence::new();
        let compact = key_with(&[(b"s", Terms::PLAIN)], &mut fences);
        let fence = compact.fence();
        assert_eq!(compact.as_session(b"s", T0), Ok(fence));
        assert_eq!(compact.as_session(b"x", T0), Err(NotSession::NoLiveSession));
        assert_eq!(
            compact.as_session(b"s", T0 + 1000),
            Err(NotSession::NoLiveSession)
        );
        assert_eq!(
            compact.session_state(fence, T0),
            Some(SessionState::Live {
                deadline_ms: T0 + 1000
            })
        );
        assert_eq!(
            compact.session_state(fence, T0 + 1000),
            Some(SessionState::Ended { at_ms: T0 + 1000 })
        );
        assert_eq!(compact.session_state(fence + 1, T0), None);
        let shared = key_with(&[(b"s", SHARED)], &mut fences);
        assert_eq!(shared.as_session(b"s", T0), Err(NotSession::Shared));
    }
}
