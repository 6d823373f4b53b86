//! Holds beyond one unlabelled exclusive holder: shared holds (read/write
//! leases, semaphores) and labelled holds (`OWNER`). A lease key keeps its
//! compact form (`Lease`, 32 bytes) until a grant needs more; then its value
//! points to a `Holds`.
//!
//! Pure logic on an injected clock, as `lease/`. Every hold has its own
//! token, fence, deadline and label, and may be bound to a session (another
//! key's exclusive lease, identified by its fence); the key has one mode for
//! all its holds, the limit it was created with, and the end of a lock-delay.
//!
//! Whether a session is live is asked of a `Sessions`: the glue answers from
//! the session's key, so a session's end frees its bound holds at once,
//! before anything visits them.

use std::collections::HashMap;

/// The most shared holders `LIMIT` may allow.
pub const MAX_LIMIT: u64 = 1_000_000;
/// The longest `OWNER` label, in bytes.
pub const MAX_OWNER_LEN: usize = 128;
/// Up to this many holds are kept in a list searched in order (less memory
/// and fewer instructions than a hash table at these sizes); more go to a
/// table keyed by token, so one hold's RENEW or RELEASE among ten thousand
/// costs what it costs among one.
const FEW: usize = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Exclusive,
    Shared,
}

/// A hold's own deadline when it has none: it lives as long as its session.
pub const NO_DEADLINE: u64 = u64::MAX;

/// The session a hold is bound to: the session key's grant with this fence.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Binding {
    pub key: Box<[u8]>,
    pub fence: u64,
}

/// What a session's key says of one of its grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionState {
    Live {
        deadline_ms: u64,
    },
    /// Ended at this time (0: long enough ago that no delay runs from it).
    Ended {
        at_ms: u64,
    },
}

/// Answers whether sessions are live (the glue looks at their keys).
pub trait Sessions {
    fn state(&mut self, binding: &Binding) -> SessionState;
}

/// For holds known to be unbound, and where no key can be read: every
/// session counts as live.
pub struct Unbound;

impl Sessions for Unbound {
    #[inline]
    fn state(&mut self, _: &Binding) -> SessionState {
        SessionState::Live {
            deadline_ms: NO_DEADLINE,
        }
    }
}

/// What few holds carry: a label, a session, a lock-delay.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct Extra {
    owner: Option<Box<[u8]>>,
    session: Option<Binding>,
    delay_ms: u64,
}

/// One hold's state besides its token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub fence: u64,
    /// Absolute unix ms; the hold is live while `now_ms < deadline_ms` (and
    /// its session is). `NO_DEADLINE` for a bound hold without one.
    pub deadline_ms: u64,
    extra: Option<Box<Extra>>,
}

impl Grant {
    pub fn new(fence: u64, deadline_ms: u64) -> Self {
        Self {
            fence,
            deadline_ms,
            extra: None,
        }
    }

    pub fn with(
        fence: u64,
        deadline_ms: u64,
        owner: Option<Box<[u8]>>,
        session: Option<Binding>,
        delay_ms: u64,
    ) -> Self {
        let extra = Extra {
            owner,
            session,
            delay_ms,
        };
        Self {
            fence,
            deadline_ms,
            extra: (extra != Extra::default()).then(|| Box::new(extra)),
        }
    }

    #[inline]
    pub fn owner(&self) -> Option<&[u8]> {
        self.extra.as_ref()?.owner.as_deref()
    }

    #[inline]
    pub fn session(&self) -> Option<&Binding> {
        self.extra.as_ref()?.session.as_ref()
    }

    #[inline]
    pub fn delay_ms(&self) -> u64 {
        self.extra.as_ref().map_or(0, |e| e.delay_ms)
    }

    #[inline]
    pub fn set_owner(&mut self, owner: &[u8]) {
        self.extra.get_or_insert_with(Box::default).owner = Some(owner.into());
    }

    /// Whether its own deadline is still ahead (its session aside).
    #[inline]
    pub fn own_live(&self, now_ms: u64) -> bool {
        now_ms < self.deadline_ms
    }

    #[inline]
    pub fn is_live(&self, now_ms: u64, sessions: &mut impl Sessions) -> bool {
        self.until(now_ms, sessions).is_some()
    }

    /// When a live hold ends as things stand: its own deadline or its
    /// session's, whichever comes first; `None` when it is not live.
    pub fn until(&self, now_ms: u64, sessions: &mut impl Sessions) -> Option<u64> {
        if !self.own_live(now_ms) {
            return None;
        }
        match self.session().map(|b| sessions.state(b)) {
            None => Some(self.deadline_ms),
            Some(SessionState::Live { deadline_ms }) => Some(self.deadline_ms.min(deadline_ms)),
            Some(SessionState::Ended { .. }) => None,
        }
    }

    /// When a hold that is not live ended: its own deadline, or its
    /// session's end if that came first.
    pub fn ended_at(&self, now_ms: u64, sessions: &mut impl Sessions) -> Option<u64> {
        let own = (!self.own_live(now_ms)).then_some(self.deadline_ms);
        let session = match self.session().map(|b| sessions.state(b)) {
            Some(SessionState::Ended { at_ms }) => Some(at_ms),
            _ => None,
        };
        match (own, session) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// A hold as it arrives from outside (an effect, an RDB value) or as it is
/// persisted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    pub token: Box<[u8]>,
    pub grant: Grant,
}

#[derive(Debug, Clone)]
enum Table {
    Few(Vec<Hold>),
    /// Boxed: a key with a few holds pays for a pointer, not a table's 48
    /// bytes (the lint's extra allocation is the point).
    #[allow(clippy::box_collection)]
    Many(Box<HashMap<Box<[u8]>, Grant>>),
}

/// The holds of one key.
#[derive(Debug, Clone)]
pub struct Holds {
    mode: Mode,
    /// The most shared holders at once; `None`: bounded by the config only.
    limit: Option<u32>,
    table: Table,
    /// Holds bound to a session: while none is, a hold is live exactly
    /// while its own deadline is ahead, and counting them reads nothing.
    bound: u32,
    /// No grant before this (unix ms, 0: none): a lock-delay that began
    /// when an exclusive hold with `DELAY` expired and was removed.
    delayed_until: u64,
}

/// What an acquire asks for beyond token and ttl.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Terms<'a> {
    pub mode: Mode,
    pub limit: Option<u32>,
    pub owner: Option<&'a [u8]>,
    /// The session to bind to, its grant's fence resolved by the caller.
    pub session: Option<(&'a [u8], u64)>,
    /// `DELAY ms` (exclusive only; 0: none).
    pub delay_ms: u64,
}

impl Terms<'_> {
    /// An exclusive grant without a label: what version 1 grants.
    pub const PLAIN: Terms<'static> = Terms {
        mode: Mode::Exclusive,
        limit: None,
        owner: None,
        session: None,
        delay_ms: 0,
    };

    #[inline]
    pub fn is_plain(&self) -> bool {
        *self == Self::PLAIN
    }
}

/// Why an acquire was refused with an error (not a nil): nothing changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The token holds this key in the other mode.
    OtherMode,
    /// The key has holders or waiters and another limit (shown).
    LimitMismatch(Option<u32>),
    /// Granting would pass `lease.max-holders`.
    TooManyHolders,
    /// The token's hold is bound to another session than the one named.
    OtherSession,
    /// A ttl of 0 for a hold bound to no session.
    NoDeadlineUnbound,
    /// The fence sequence would pass 2^53.
    FenceExhausted,
}

impl Default for Holds {
    fn default() -> Self {
        Self::new(Mode::Exclusive, None)
    }
}

impl Holds {
    pub fn new(mode: Mode, limit: Option<u32>) -> Self {
        Self {
            mode,
            limit,
            table: Table::Few(Vec::new()),
            bound: 0,
            delayed_until: 0,
        }
    }

    /// How many holds are bound to a session.
    #[inline]
    pub fn bound(&self) -> usize {
        self.bound as usize
    }

    #[inline]
    pub fn delayed_until(&self) -> u64 {
        self.delayed_until
    }

    #[inline]
    pub fn set_delayed_until(&mut self, until_ms: u64) {
        self.delayed_until = until_ms;
    }

    #[inline]
    pub fn mode(&self) -> Mode {
        self.mode
    }

    #[inline]
    pub fn limit(&self) -> Option<u32> {
        self.limit
    }

    #[inline]
    pub fn set_terms(&mut self, mode: Mode, limit: Option<u32>) {
        self.mode = mode;
        self.limit = limit;
    }

    /// Holds stored, live or expired.
    #[inline]
    pub fn len(&self) -> usize {
        match &self.table {
            Table::Few(list) => list.len(),
            Table::Many(map) => map.len(),
        }
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    #[inline]
    pub fn get(&self, token: &[u8]) -> Option<&Grant> {
        match &self.table {
            Table::Few(list) => list.iter().find(|h| *h.token == *token).map(|h| &h.grant),
            Table::Many(map) => map.get(token),
        }
    }

    /// `token`'s hold, to change its deadline or label (not its session:
    /// `insert` keeps the count of bound holds).
    #[inline]
    pub fn get_mut(&mut self, token: &[u8]) -> Option<&mut Grant> {
        match &mut self.table {
            Table::Few(list) => list
                .iter_mut()
                .find(|h| *h.token == *token)
                .map(|h| &mut h.grant),
            Table::Many(map) => map.get_mut(token),
        }
    }

    /// Every hold, in no particular order.
    #[inline]
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &Grant)> {
        let (few, many) = match &self.table {
            Table::Few(list) => (Some(list.iter().map(|h| (&*h.token, &h.grant))), None),
            Table::Many(map) => (None, Some(map.iter().map(|(t, g)| (&**t, g)))),
        };
        few.into_iter().flatten().chain(many.into_iter().flatten())
    }

    /// Every hold, oldest grant first (fences rise with every grant).
    #[inline]
    pub fn by_grant(&self) -> Vec<(&[u8], &Grant)> {
        let mut all: Vec<_> = self.iter().collect();
        all.sort_unstable_by_key(|(_, g)| g.fence);
        all
    }

    /// Sets `token`'s hold, replacing any it had (returned).
    pub fn insert(&mut self, token: &[u8], grant: Grant) -> Option<Grant> {
        let binds = u32::from(grant.session().is_some());
        if let Some(existing) = self.get_mut(token) {
            let unbinds = u32::from(existing.session().is_some());
            let old = std::mem::replace(existing, grant);
            self.bound = self.bound + binds - unbinds;
            return Some(old);
        }
        self.bound += binds;
        match &mut self.table {
            Table::Few(list) if list.len() < FEW => {
                // One hold at a time: a lease with one labelled holder keeps
                // room for one.
                list.reserve_exact(1);
                list.push(Hold {
                    token: token.into(),
                    grant,
                });
            }
            Table::Few(list) => {
                let mut map: HashMap<Box<[u8]>, Grant> = std::mem::take(list)
                    .into_iter()
                    .map(|h| (h.token, h.grant))
                    .collect();
                map.insert(token.into(), grant);
                self.table = Table::Many(Box::new(map));
            }
            Table::Many(map) => {
                map.insert(token.into(), grant);
            }
        }
        None
    }

    /// Removes `token`'s hold, live or not; returns it.
    pub fn remove(&mut self, token: &[u8]) -> Option<Grant> {
        let removed = match &mut self.table {
            Table::Few(list) => {
                let at = list.iter().position(|h| *h.token == *token)?;
                Some(list.swap_remove(at).grant)
            }
            Table::Many(map) => map.remove(token),
        };
        if removed.as_ref().is_some_and(|g| g.session().is_some()) {
            self.bound -= 1;
        }
        if matches!(&self.table, Table::Many(map) if map.len() <= FEW / 2) {
            // Back to the list: the holds move, nothing is copied, and the
            // count of bound ones stays what it is.
            let bound = self.bound;
            self.table = Table::Few(self.clear());
            self.bound = bound;
        }
        removed
    }

    /// Removes every hold; returns them.
    pub fn clear(&mut self) -> Vec<Hold> {
        let table = std::mem::replace(&mut self.table, Table::Few(Vec::new()));
        self.bound = 0;
        match table {
            Table::Few(list) => list,
            Table::Many(map) => map
                .into_iter()
                .map(|(token, grant)| Hold { token, grant })
                .collect::<Vec<_>>(),
        }
    }

    /// Removes every hold that is not live; returns them with when each
    /// ended. An exclusive hold with a lock-delay that ended starts the
    /// key's delay.
    pub fn prune(&mut self, now_ms: u64, sessions: &mut impl Sessions) -> Vec<(Hold, u64)> {
        let ended: Vec<(Box<[u8]>, u64)> = self
            .iter()
            .filter_map(|(t, g)| g.ended_at(now_ms, sessions).map(|at| (t.into(), at)))
            .collect();
        let mut gone = Vec::with_capacity(ended.len());
        for (token, at) in ended {
            if let Some(grant) = self.remove(&token) {
                self.start_delay(&grant, at);
                gone.push((Hold { token, grant }, at));
            }
        }
        gone
    }

    /// A hold with `DELAY` that ended at `at_ms` keeps the key from any
    /// grant until `at_ms + delay`.
    #[inline]
    pub fn start_delay(&mut self, grant: &Grant, at_ms: u64) {
        if grant.delay_ms() > 0 {
            let until = at_ms.saturating_add(grant.delay_ms());
            self.delayed_until = self.delayed_until.max(until);
        }
    }

    /// Until when no grant may be made (unix ms): the key's delay, or that
    /// of an exclusive hold with `DELAY` that ended and is not removed yet.
    pub fn delay_end(&self, now_ms: u64, sessions: &mut impl Sessions) -> u64 {
        let mut until = self.delayed_until;
        if self.mode == Mode::Exclusive {
            for (_, g) in self.iter().filter(|(_, g)| g.delay_ms() > 0) {
                if let Some(at) = g.ended_at(now_ms, sessions) {
                    until = until.max(at.saturating_add(g.delay_ms()));
                }
            }
        }
        until
    }

    /// The earliest own deadline of any hold, live or not (holds that live
    /// as long as their session have none).
    #[inline]
    pub fn earliest(&self) -> Option<u64> {
        self.iter()
            .map(|(_, g)| g.deadline_ms)
            .filter(|&d| d != NO_DEADLINE)
            .min()
    }

    /// Live holds at `now_ms`; `earliest` is a deadline no hold is before,
    /// so when it is still ahead and no hold is bound, every hold is live
    /// and nothing is read.
    #[inline]
    pub fn live(&self, now_ms: u64, earliest: u64, sessions: &mut impl Sessions) -> usize {
        if now_ms < earliest && self.bound == 0 {
            return self.len();
        }
        self.iter()
            .filter(|(_, g)| g.is_live(now_ms, sessions))
            .count()
    }

    /// When the last live hold ends as things stand.
    #[inline]
    pub fn latest_live(&self, now_ms: u64, sessions: &mut impl Sessions) -> Option<u64> {
        self.iter()
            .filter_map(|(_, g)| g.until(now_ms, sessions))
            .max()
    }

    /// Bytes owned beyond the `Holds` itself.
    pub fn heap_size(&self) -> usize {
        let owned = |token: &[u8], g: &Grant| {
            let extra = g.extra.as_ref().map_or(0, |e| {
                std::mem::size_of::<Extra>()
                    + e.owner.as_ref().map_or(0, |o| o.len())
                    + e.session.as_ref().map_or(0, |b| b.key.len())
            });
            token.len() + extra
        };
        match &self.table {
            Table::Few(list) => {
                list.capacity() * std::mem::size_of::<Hold>()
                    + list
                        .iter()
                        .map(|h| owned(&h.token, &h.grant))
                        .sum::<usize>()
            }
            Table::Many(map) => {
                // hashbrown: one control byte per bucket besides the entry.
                let entry = std::mem::size_of::<(Box<[u8]>, Grant)>() + 1;
                map.capacity() * entry + map.iter().map(|(t, g)| owned(t, g)).sum::<usize>()
            }
        }
    }
}

/// Checks an `OWNER` label: 1 to 128 bytes, no control characters.
pub fn valid_owner(label: &[u8]) -> bool {
    (1..=MAX_OWNER_LEN).contains(&label.len()) && !label.iter().any(|&b| b < 0x20 || b == 0x7f)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(fence: u64, deadline_ms: u64) -> Grant {
        Grant::new(fence, deadline_ms)
    }

    #[test]
    fn the_table_moves_between_its_forms_and_keeps_every_hold() {
        let mut holds = Holds::new(Mode::Shared, None);
        for i in 0..100u64 {
            holds.insert(format!("t{i}").as_bytes(), grant(i + 1, 1000 + i));
            assert_eq!(holds.len() as u64, i + 1);
        }
        assert!(matches!(holds.table, Table::Many(_)));
        for i in 0..100u64 {
            assert_eq!(
                holds.get(format!("t{i}").as_bytes()).map(|g| g.fence),
                Some(i + 1)
            );
        }
        for i in 0..98u64 {
            assert!(holds.remove(format!("t{i}").as_bytes()).is_some());
        }
        assert!(matches!(holds.table, Table::Few(_)));
        assert_eq!(holds.len(), 2);
        assert!(holds.remove(b"t0").is_none());
        let order: Vec<u64> = holds.by_grant().iter().map(|(_, g)| g.fence).collect();
        assert_eq!(order, vec![99, 100]);
    }

    #[test]
    fn insert_replaces_the_same_tokens_hold() {
        let mut holds = Holds::default();
        holds.insert(b"a", grant(1, 10));
        holds.insert(b"a", grant(2, 20));
        assert_eq!(holds.len(), 1);
        assert_eq!(holds.get(b"a"), Some(&grant(2, 20)));
    }

    #[test]
    fn prune_takes_exactly_the_expired() {
        let mut holds = Holds::new(Mode::Shared, Some(5));
        holds.insert(b"a", grant(1, 100));
        holds.insert(b"b", grant(2, 200));
        holds.insert(b"c", grant(3, 101));
        assert_eq!(holds.live(100, 100, &mut Unbound), 2);
        assert_eq!(holds.live(99, 100, &mut Unbound), 3);
        let mut gone: Vec<_> = holds
            .prune(101, &mut Unbound)
            .into_iter()
            .map(|(h, at)| (h.token, at))
            .collect();
        gone.sort();
        assert_eq!(
            gone,
            vec![(Box::from(&b"a"[..]), 100), (Box::from(&b"c"[..]), 101)]
        );
        assert_eq!(holds.earliest(), Some(200));
        assert_eq!(holds.latest_live(150, &mut Unbound), Some(200));
        assert_eq!(holds.latest_live(200, &mut Unbound), None);
    }

    #[test]
    fn owner_labels() {
        assert!(valid_owner(b"host-1:4242"));
        assert!(valid_owner(&[b'x'; 128]));
        assert!(valid_owner("работник".as_bytes()));
        assert!(!valid_owner(b""));
        assert!(!valid_owner(&[b'x'; 129]));
        assert!(!valid_owner(b"a\nb"));
        assert!(!valid_owner(b"a\x7fb"));
    }
}
