//! The deadline index: which lease keys fall due when, so the reaper finds
//! expired leases without scanning the keyspace.
//!
//! The index is a hint, not the truth. Keys change under it (`DEL`, `RENAME`,
//! `FLUSHALL`, a renewal the index missed), so the reaper re-reads each key it
//! pops and acts only on what the key itself says. What the index must never
//! do is miss a live lease for good: every place a lease key appears on a
//! master inserts it.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::collections::BTreeSet;

/// One indexed lease key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Entry {
    pub deadline_ms: u64,
    pub db: i32,
    pub key: Box<[u8]>,
}

/// Lets the set be searched with a borrowed key name, so that moving an entry
/// (every renewal does) allocates nothing.
trait EntryRef {
    fn parts(&self) -> (u64, i32, &[u8]);
}

impl EntryRef for Entry {
    fn parts(&self) -> (u64, i32, &[u8]) {
        (self.deadline_ms, self.db, &self.key)
    }
}

impl EntryRef for (u64, i32, &[u8]) {
    fn parts(&self) -> (u64, i32, &[u8]) {
        *self
    }
}

impl<'a> Borrow<dyn EntryRef + 'a> for Entry {
    fn borrow(&self) -> &(dyn EntryRef + 'a) {
        self
    }
}

impl PartialEq for dyn EntryRef + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}

impl Eq for dyn EntryRef + '_ {}

impl PartialOrd for dyn EntryRef + '_ {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for dyn EntryRef + '_ {
    fn cmp(&self, other: &Self) -> Ordering {
        self.parts().cmp(&other.parts())
    }
}

#[derive(Debug, Default)]
pub struct DeadlineIndex {
    entries: BTreeSet<Entry>,
}

impl DeadlineIndex {
    pub const fn new() -> Self {
        Self {
            entries: BTreeSet::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn clear(&mut self) {
        self.entries.clear();
    }

    pub fn insert(&mut self, deadline_ms: u64, db: i32, key: &[u8]) {
        if !self.contains(deadline_ms, db, key) {
            self.entries.insert(Entry {
                deadline_ms,
                db,
                key: key.into(),
            });
        }
    }

    pub fn contains(&self, deadline_ms: u64, db: i32, key: &[u8]) -> bool {
        self.entries
            .contains(&(deadline_ms, db, key) as &dyn EntryRef)
    }

    pub fn remove(&mut self, deadline_ms: u64, db: i32, key: &[u8]) -> bool {
        self.entries
            .remove(&(deadline_ms, db, key) as &dyn EntryRef)
    }

    /// Moves a key from one deadline to another, reusing its entry.
    pub fn reschedule(&mut self, from_ms: u64, to_ms: u64, db: i32, key: &[u8]) {
        if from_ms == to_ms {
            return self.insert(to_ms, db, key);
        }
        match self.entries.take(&(from_ms, db, key) as &dyn EntryRef) {
            Some(mut entry) => {
                entry.deadline_ms = to_ms;
                self.entries.insert(entry);
            }
            None => self.insert(to_ms, db, key),
        }
    }

    /// Takes the earliest entry whose deadline is at or before `now_ms`.
    pub fn pop_due(&mut self, now_ms: u64) -> Option<Entry> {
        if self.entries.first()?.deadline_ms <= now_ms {
            self.entries.pop_first()
        } else {
            None
        }
    }

    pub fn next_deadline(&self) -> Option<u64> {
        self.entries.first().map(|e| e.deadline_ms)
    }

    /// `SWAPDB a b`: keys of one database now live in the other.
    pub fn swap_db(&mut self, a: i32, b: i32) {
        let entries = std::mem::take(&mut self.entries);
        self.entries = entries
            .into_iter()
            .map(|mut e| {
                if e.db == a {
                    e.db = b;
                } else if e.db == b {
                    e.db = a;
                }
                e
            })
            .collect();
    }

    /// Drops every entry of one database (`FLUSHDB`), or all (`db < 0`).
    pub fn flush(&mut self, db: i32) {
        if db < 0 {
            self.entries.clear();
        } else {
            self.entries.retain(|e| e.db != db);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pops_due_entries_in_deadline_order() {
        let mut idx = DeadlineIndex::new();
        idx.insert(30, 0, b"c");
        idx.insert(10, 0, b"a");
        idx.insert(20, 1, b"b");
        assert_eq!(idx.pop_due(5), None);
        assert_eq!(idx.pop_due(25).map(|e| e.key), Some(b"a"[..].into()));
        assert_eq!(
            idx.pop_due(25).map(|e| (e.db, e.key)),
            Some((1, b"b"[..].into()))
        );
        assert_eq!(idx.pop_due(25), None);
        assert_eq!(idx.next_deadline(), Some(30));
        assert_eq!(idx.pop_due(30).map(|e| e.deadline_ms), Some(30));
        assert_eq!(idx.len(), 0);
    }

    #[test]
    fn reschedule_moves_one_entry() {
        let mut idx = DeadlineIndex::new();
        idx.insert(10, 0, b"k");
        idx.reschedule(10, 50, 0, b"k");
        assert_eq!(idx.len(), 1);
        assert!(idx.contains(50, 0, b"k"));
        assert_eq!(idx.pop_due(49), None);
        // an entry the index never had is inserted
        idx.reschedule(7, 60, 0, b"other");
        assert!(idx.contains(60, 0, b"other"));
        // rescheduling to the same deadline keeps one entry
        idx.reschedule(60, 60, 0, b"other");
        assert_eq!(idx.len(), 2);
    }

    #[test]
    fn same_key_in_two_databases_is_two_entries() {
        let mut idx = DeadlineIndex::new();
        idx.insert(10, 0, b"k");
        idx.insert(10, 3, b"k");
        idx.insert(10, 3, b"k");
        assert_eq!(idx.len(), 2);
        assert!(idx.remove(10, 3, b"k"));
        assert!(!idx.remove(10, 3, b"k"));
        assert!(idx.contains(10, 0, b"k"));
    }

    #[test]
    fn swap_and_flush_databases() {
        let mut idx = DeadlineIndex::new();
        idx.insert(10, 0, b"a");
        idx.insert(10, 1, b"b");
        idx.insert(10, 2, b"c");
        idx.swap_db(0, 1);
        assert!(idx.contains(10, 1, b"a"));
        assert!(idx.contains(10, 0, b"b"));
        idx.flush(2);
        assert_eq!(idx.len(), 2);
        idx.flush(-1);
        assert_eq!(idx.len(), 0);
    }
}
