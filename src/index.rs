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
use std::ptr::NonNull;

/// Deadlines and databases share one word: deadlines stay below 2^44 ms
/// (`lease::MAX_DEADLINE_MS` is about 2^43.2), databases below 2^20.
const DB_BITS: u32 = 20;
const DB_LIMIT: i32 = 1 << DB_BITS;

fn pack(deadline_ms: u64, db: i32) -> Option<u64> {
    let in_range = deadline_ms < 1 << (64 - DB_BITS) && (0..DB_LIMIT).contains(&db);
    in_range.then_some(deadline_ms << DB_BITS | db as u64)
}

/// A key name behind a thin pointer: a length prefix and the bytes, in one
/// allocation. Half the size of `Box<[u8]>` in every index entry, which
/// matters at a million leases.
pub struct ThinKey(NonNull<u8>);

// The allocation is owned, immutable and never shared.
unsafe impl Send for ThinKey {}
unsafe impl Sync for ThinKey {}

const LEN_BYTES: usize = std::mem::size_of::<u32>();

impl ThinKey {
    fn new(key: &[u8]) -> Self {
        // Redis keys are at most 512 MB, well inside u32.
        let len = u32::try_from(key.len()).unwrap_or(u32::MAX) as usize;
        let mut buf = Vec::with_capacity(LEN_BYTES + len);
        buf.extend_from_slice(&(len as u32).to_le_bytes());
        buf.extend_from_slice(&key[..len]);
        let raw = Box::into_raw(buf.into_boxed_slice()).cast::<u8>();
        // ok: Box::into_raw never returns null.
        Self(NonNull::new(raw).unwrap_or(NonNull::dangling()))
    }

    fn len(&self) -> usize {
        let mut len = [0u8; LEN_BYTES];
        // The first bytes of the allocation are the length, written by `new`.
        unsafe { std::ptr::copy_nonoverlapping(self.0.as_ptr(), len.as_mut_ptr(), LEN_BYTES) };
        u32::from_le_bytes(len) as usize
    }

    pub fn bytes(&self) -> &[u8] {
        unsafe { std::slice::from_raw_parts(self.0.as_ptr().add(LEN_BYTES), self.len()) }
    }
}

impl Drop for ThinKey {
    fn drop(&mut self) {
        let whole = std::ptr::slice_from_raw_parts_mut(self.0.as_ptr(), LEN_BYTES + self.len());
        // Rebuilds the box `new` leaked, with its original length.
        unsafe { drop(Box::from_raw(whole)) };
    }
}

/// One indexed lease key.
pub struct Entry {
    packed: u64,
    key: ThinKey,
}

impl Entry {
    pub fn deadline_ms(&self) -> u64 {
        self.packed >> DB_BITS
    }

    pub fn db(&self) -> i32 {
        (self.packed & (DB_LIMIT as u64 - 1)) as i32
    }

    pub fn key(&self) -> &[u8] {
        self.key.bytes()
    }
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entry")
            .field("deadline_ms", &self.deadline_ms())
            .field("db", &self.db())
            .field("key", &String::from_utf8_lossy(self.key()))
            .finish()
    }
}

/// Lets the set be searched with a borrowed key name, so that moving an entry
/// (every renewal does) allocates nothing.
///
/// Entries order by the packed deadline and database first, and by key name
/// only between equal words: reading a name follows a pointer to memory the
/// search has not touched, so a search through a million entries stays on
/// the tree's own nodes until it reaches the deadline it is after.
trait EntryRef {
    fn packed(&self) -> u64;
    fn key(&self) -> &[u8];

    fn order(&self, other: &dyn EntryRef) -> Ordering {
        self.packed()
            .cmp(&other.packed())
            .then_with(|| self.key().cmp(other.key()))
    }
}

impl EntryRef for Entry {
    fn packed(&self) -> u64 {
        self.packed
    }

    fn key(&self) -> &[u8] {
        self.key.bytes()
    }
}

impl EntryRef for (u64, &[u8]) {
    fn packed(&self) -> u64 {
        self.0
    }

    fn key(&self) -> &[u8] {
        self.1
    }
}

impl<'a> Borrow<dyn EntryRef + 'a> for Entry {
    fn borrow(&self) -> &(dyn EntryRef + 'a) {
        self
    }
}

impl PartialEq for dyn EntryRef + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.order(other).is_eq()
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
        self.order(other)
    }
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.order(other).is_eq()
    }
}

impl Eq for Entry {}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Entry {
    fn cmp(&self, other: &Self) -> Ordering {
        self.order(other)
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

    /// Indexes a key. A database past 2^20 is not indexed: its leases
    /// still expire (every command checks the deadline), they are only
    /// not reaped.
    pub fn insert(&mut self, deadline_ms: u64, db: i32, key: &[u8]) {
        let Some(packed) = pack(deadline_ms, db) else {
            return;
        };
        // One search: a duplicate is dropped by the set itself.
        self.entries.insert(Entry {
            packed,
            key: ThinKey::new(key),
        });
    }

    #[cfg(test)]
    pub fn contains(&self, deadline_ms: u64, db: i32, key: &[u8]) -> bool {
        pack(deadline_ms, db).is_some_and(|p| self.entries.contains(&(p, key) as &dyn EntryRef))
    }

    pub fn remove(&mut self, deadline_ms: u64, db: i32, key: &[u8]) -> bool {
        pack(deadline_ms, db).is_some_and(|p| self.entries.remove(&(p, key) as &dyn EntryRef))
    }

    /// Takes the earliest entry whose deadline is at or before `now_ms`.
    pub fn pop_due(&mut self, now_ms: u64) -> Option<Entry> {
        if self.entries.first()?.deadline_ms() <= now_ms {
            self.entries.pop_first()
        } else {
            None
        }
    }

    pub fn next_deadline(&self) -> Option<u64> {
        self.entries.first().map(Entry::deadline_ms)
    }

    /// `SWAPDB a b`: keys of one database now live in the other.
    pub fn swap_db(&mut self, a: i32, b: i32) {
        let (Some(_), Some(_)) = (pack(0, a), pack(0, b)) else {
            return;
        };
        let entries = std::mem::take(&mut self.entries);
        self.entries = entries
            .into_iter()
            .map(|mut e| {
                let db = e.db();
                let to = if db == a {
                    b
                } else if db == b {
                    a
                } else {
                    db
                };
                e.packed = (e.packed & !(DB_LIMIT as u64 - 1)) | to as u64;
                e
            })
            .collect();
    }

    /// Drops every entry of one database (`FLUSHDB`), or all (`db < 0`).
    pub fn flush(&mut self, db: i32) {
        if db < 0 {
            self.entries.clear();
        } else {
            self.entries.retain(|e| e.db() != db);
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
        assert_eq!(
            idx.pop_due(25).map(|e| e.key().to_vec()),
            Some(b"a".to_vec())
        );
        assert_eq!(
            idx.pop_due(25).map(|e| (e.db(), e.key().to_vec())),
            Some((1, b"b".to_vec()))
        );
        assert_eq!(idx.pop_due(25), None);
        assert_eq!(idx.next_deadline(), Some(30));
        assert_eq!(idx.pop_due(30).map(|e| e.deadline_ms()), Some(30));
        assert_eq!(idx.len(), 0);
    }

    #[test]
    fn inserting_twice_keeps_one_entry() {
        let mut idx = DeadlineIndex::new();
        idx.insert(10, 0, b"k");
        idx.insert(10, 0, b"k");
        idx.insert(50, 0, b"k");
        assert_eq!(idx.len(), 2, "one entry per (deadline, db, key)");
        assert!(idx.contains(10, 0, b"k") && idx.contains(50, 0, b"k"));
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
    fn thin_keys_hold_any_bytes() {
        let long = vec![0xffu8; 70_000];
        for key in [&b""[..], b"k", b"a\0b\r\n", &long] {
            let k = ThinKey::new(key);
            assert_eq!(k.bytes(), key);
        }
        assert_eq!(std::mem::size_of::<Entry>(), 16);
    }

    #[test]
    fn packing_keeps_deadline_and_database_apart() {
        let mut idx = DeadlineIndex::new();
        let far = crate::lease::MAX_DEADLINE_MS;
        idx.insert(far, DB_LIMIT - 1, b"k");
        let e = idx.pop_due(far).expect("due");
        assert_eq!((e.deadline_ms(), e.db()), (far, DB_LIMIT - 1));
        // out of range: not indexed, never wrongly packed
        idx.insert(10, DB_LIMIT, b"k");
        idx.insert(10, -1, b"k");
        assert_eq!(idx.len(), 0);
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
