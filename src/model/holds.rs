//! Holds beyond one unlabelled exclusive holder: shared holds (read/write
//! leases, semaphores) and labelled holds (`OWNER`). A lease key keeps its
//! compact form (`Lease`, 32 bytes) until a grant needs more; then its value
//! points to a `Holds`.
//!
//! Pure logic on an injected clock, as `lease.rs`. Every hold has its own
//! token, fence, deadline and label; the key has one mode for all its holds
//! and the limit it was created with.

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

/// One hold's state besides its token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub fence: u64,
    /// Absolute unix ms; the hold is live while `now_ms < deadline_ms`.
    pub deadline_ms: u64,
    pub owner: Option<Box<[u8]>>,
}

impl Grant {
    pub fn is_live(&self, now_ms: u64) -> bool {
        now_ms < self.deadline_ms
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
    Many(HashMap<Box<[u8]>, Grant>),
}

/// The holds of one key.
#[derive(Debug, Clone)]
pub struct Holds {
    mode: Mode,
    /// The most shared holders at once; `None`: bounded by the config only.
    limit: Option<u32>,
    table: Table,
}

/// What an acquire asks for beyond token and ttl.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Terms<'a> {
    pub mode: Mode,
    pub limit: Option<u32>,
    pub owner: Option<&'a [u8]>,
}

impl Terms<'_> {
    /// An exclusive grant without a label: what version 1 grants.
    pub const PLAIN: Terms<'static> = Terms {
        mode: Mode::Exclusive,
        limit: None,
        owner: None,
    };

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
        }
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    pub fn limit(&self) -> Option<u32> {
        self.limit
    }

    pub fn set_terms(&mut self, mode: Mode, limit: Option<u32>) {
        self.mode = mode;
        self.limit = limit;
    }

    /// Holds stored, live or expired.
    pub fn len(&self) -> usize {
        match &self.table {
            Table::Few(list) => list.len(),
            Table::Many(map) => map.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn get(&self, token: &[u8]) -> Option<&Grant> {
        match &self.table {
            Table::Few(list) => list.iter().find(|h| *h.token == *token).map(|h| &h.grant),
            Table::Many(map) => map.get(token),
        }
    }

    fn get_mut(&mut self, token: &[u8]) -> Option<&mut Grant> {
        match &mut self.table {
            Table::Few(list) => list
                .iter_mut()
                .find(|h| *h.token == *token)
                .map(|h| &mut h.grant),
            Table::Many(map) => map.get_mut(token),
        }
    }

    /// Every hold, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &Grant)> {
        let (few, many) = match &self.table {
            Table::Few(list) => (Some(list.iter().map(|h| (&*h.token, &h.grant))), None),
            Table::Many(map) => (None, Some(map.iter().map(|(t, g)| (&**t, g)))),
        };
        few.into_iter().flatten().chain(many.into_iter().flatten())
    }

    /// Every hold, oldest grant first (fences rise with every grant).
    pub fn by_grant(&self) -> Vec<(&[u8], &Grant)> {
        let mut all: Vec<_> = self.iter().collect();
        all.sort_unstable_by_key(|(_, g)| g.fence);
        all
    }

    /// Sets `token`'s hold, replacing any it had.
    pub fn insert(&mut self, token: &[u8], grant: Grant) {
        if let Some(existing) = self.get_mut(token) {
            *existing = grant;
            return;
        }
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
                self.table = Table::Many(map);
            }
            Table::Many(map) => {
                map.insert(token.into(), grant);
            }
        }
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
        if let Table::Many(map) = &self.table {
            if map.len() <= FEW / 2 {
                let list = map
                    .iter()
                    .map(|(t, g)| Hold {
                        token: t.clone(),
                        grant: g.clone(),
                    })
                    .collect();
                self.table = Table::Few(list);
            }
        }
        removed
    }

    pub fn clear(&mut self) {
        self.table = Table::Few(Vec::new());
    }

    /// Removes every hold whose deadline has passed; returns their tokens.
    pub fn prune(&mut self, now_ms: u64) -> Vec<Box<[u8]>> {
        let expired: Vec<Box<[u8]>> = self
            .iter()
            .filter(|(_, g)| !g.is_live(now_ms))
            .map(|(t, _)| t.into())
            .collect();
        for token in &expired {
            self.remove(token);
        }
        expired
    }

    /// The earliest deadline of any hold, live or not.
    pub fn earliest(&self) -> Option<u64> {
        self.iter().map(|(_, g)| g.deadline_ms).min()
    }

    /// Live holds at `now_ms`; `earliest` is a deadline no hold is before,
    /// so when it is still ahead every hold is live and nothing is read.
    pub fn live(&self, now_ms: u64, earliest: u64) -> usize {
        if now_ms < earliest {
            return self.len();
        }
        self.iter().filter(|(_, g)| g.is_live(now_ms)).count()
    }

    /// The latest deadline of a live hold.
    pub fn latest_live(&self, now_ms: u64) -> Option<u64> {
        self.iter()
            .map(|(_, g)| g.deadline_ms)
            .filter(|&d| now_ms < d)
            .max()
    }

    /// Bytes owned beyond the `Holds` itself.
    pub fn heap_size(&self) -> usize {
        let owned = |token: &[u8], g: &Grant| token.len() + g.owner.as_ref().map_or(0, |o| o.len());
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
        Grant {
            fence,
            deadline_ms,
            owner: None,
        }
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
        assert_eq!(holds.live(100, 100), 2);
        assert_eq!(holds.live(99, 100), 3);
        let mut gone = holds.prune(101);
        gone.sort();
        assert_eq!(gone, vec![Box::from(&b"a"[..]), Box::from(&b"c"[..])]);
        assert_eq!(holds.earliest(), Some(200));
        assert_eq!(holds.latest_live(150), Some(200));
        assert_eq!(holds.latest_live(200), None);
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
