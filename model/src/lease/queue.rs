//! Clients blocked in `LEASE.ACQUIRE ... BLOCK`, queued per key name and
//! database.

use std::collections::{HashMap, VecDeque};

/// Clients blocked in `LEASE.ACQUIRE ... BLOCK`, first come first served,
/// per key name and database.
///
/// Waiters wait for a key *name*, as `BLPOP` does: the queue outlives a
/// `DEL` of the key and a new lease under the same name, so it lives beside
/// the keyspace rather than inside a lease value.
#[derive(Debug, Default)]
pub struct WaitQueues {
    by_db: HashMap<i32, HashMap<Box<[u8]>, VecDeque<u64>>>,
    next_id: u64,
    total: usize,
}

impl WaitQueues {
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Waiters on all keys.
    #[inline]
    pub fn total(&self) -> usize {
        self.total
    }

    /// Queues a new waiter at the back and returns its id.
    pub fn enqueue(&mut self, db: i32, key: &[u8]) -> u64 {
        self.next_id += 1;
        let queue = self
            .by_db
            .entry(db)
            .or_default()
            .entry(key.into())
            .or_default();
        queue.push_back(self.next_id);
        self.total += 1;
        self.next_id
    }

    #[inline]
    pub fn head(&self, db: i32, key: &[u8]) -> Option<u64> {
        self.queue(db, key).and_then(|q| q.front().copied())
    }

    #[inline]
    pub fn len(&self, db: i32, key: &[u8]) -> usize {
        self.queue(db, key).map_or(0, VecDeque::len)
    }

    #[inline]
    fn queue(&self, db: i32, key: &[u8]) -> Option<&VecDeque<u64>> {
        if self.total == 0 {
            return None;
        }
        self.by_db.get(&db)?.get(key)
    }

    /// Every key with waiters in database `db`, or in all (`db < 0`).
    #[inline]
    pub fn keys(&self, db: i32) -> Vec<(i32, Box<[u8]>)> {
        self.by_db
            .iter()
            .filter(|(&d, _)| db < 0 || d == db)
            .flat_map(|(&d, keys)| keys.keys().map(move |k| (d, k.clone())))
            .collect()
    }

    /// Takes a waiter out, wherever it is in its queue.
    pub fn remove(&mut self, db: i32, key: &[u8], id: u64) -> bool {
        let Some(keys) = self.by_db.get_mut(&db) else {
            return false;
        };
        let Some(queue) = keys.get_mut(key) else {
            return false;
        };
        let Some(pos) = queue.iter().position(|&w| w == id) else {
            return false;
        };
        queue.remove(pos);
        self.total -= 1;
        if queue.is_empty() {
            keys.remove(key);
            if keys.is_empty() {
                self.by_db.remove(&db);
            }
        }
        true
    }
}

/// What `LEASE.DEBUG CHECK` reads (`model::check`), and, in a
/// `fault-injection` build, a way to make it wrong on purpose.
impl WaitQueues {
    /// Every key's queue: database, key name, waiters in it.
    #[inline]
    pub fn queues(&self) -> impl Iterator<Item = (i32, &[u8], usize)> + '_ {
        self.by_db
            .iter()
            .flat_map(|(&db, keys)| keys.iter().map(move |(k, q)| (db, &**k, q.len())))
    }

    /// Miscounts the waiters by one (`LEASE.DEBUG CORRUPT waiters`).
    #[cfg(feature = "fault-injection")]
    #[inline]
    pub fn miscount(&mut self) {
        self.total += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_queues_list_their_keys_per_database() {
        let mut queues = WaitQueues::default();
        queues.enqueue(0, b"a");
        queues.enqueue(0, b"a");
        queues.enqueue(0, b"b");
        let gone = queues.enqueue(3, b"c");
        queues.enqueue(5, b"d");
        let mut keys = queues.keys(0);
        keys.sort();
        assert_eq!(keys, vec![(0, b"a"[..].into()), (0, b"b"[..].into())]);
        assert_eq!(queues.keys(3), vec![(3, b"c"[..].into())]);
        assert_eq!(queues.keys(-1).len(), 4);
        queues.remove(3, b"c", gone);
        assert!(queues.keys(3).is_empty());
        assert!(queues.keys(9).is_empty());
    }

    #[test]
    fn wait_queues_are_fifo_per_key_and_database() {
        let mut q = WaitQueues::default();
        let a = q.enqueue(0, b"k");
        let b = q.enqueue(0, b"k");
        let c = q.enqueue(0, b"k");
        let other_db = q.enqueue(1, b"k");
        assert_eq!(q.len(0, b"k"), 3);
        assert_eq!(q.head(0, b"k"), Some(a));
        assert_eq!(q.head(1, b"k"), Some(other_db));
        // a waiter leaving from the middle keeps the order of the rest
        assert!(q.remove(0, b"k", b));
        assert!(!q.remove(0, b"k", b), "removal is idempotent");
        assert!(q.remove(0, b"k", a));
        assert_eq!(q.head(0, b"k"), Some(c));
        assert!(q.remove(0, b"k", c));
        assert_eq!(q.head(0, b"k"), None);
        assert_eq!(q.len(0, b"k"), 0);
        assert_eq!(q.total(), 1);
        assert!(q.remove(1, b"k", other_db));
        assert!(q.is_empty());
    }
}
