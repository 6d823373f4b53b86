//! The deadline index: which lease keys fall due when, so the reaper finds
//! expired leases without scanning the keyspace.
//!
//! The index is a hint, not the truth. Keys change under it (`DEL`, `RENAME`,
//! `FLUSHALL`, a renewal the index missed), so the reaper re-reads each key it
//! pops and acts only on what the key itself says. What the index must never
//! do is miss a live lease for good: every place a lease key appears on a
//! master inserts it.
//!
//! One ordered set per database. An entry is 16 bytes: a word with the
//! deadline and a 20-bit hash of the key name, and a thin pointer to the
//! name. Entries order by that word and by name only when the words are
//! equal, so a search follows no name pointer unless two keys share both a
//! deadline and a hash: leases granted in the same millisecond (hundreds, in
//! a busy second) stay apart without touching memory outside the tree.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::collections::BTreeSet;
use std::ptr::NonNull;

/// Deadlines stay below 2^44 ms (`lease::MAX_DEADLINE_MS` is about 2^43.2);
/// the low bits of the word hold the key's hash.
const HASH_BITS: u32 = 20;
const HASH_MASK: u64 = (1 << HASH_BITS) - 1;

/// FNV-1a, folded to `HASH_BITS`: only breaks ties between keys that fall
/// due in the same millisecond, so quality beyond spreading them is wasted.
fn key_hash(key: &[u8]) -> u64 {
    let h = key.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    (h ^ (h >> HASH_BITS) ^ (h >> (2 * HASH_BITS))) & HASH_MASK
}

fn pack(deadline_ms: u64, key: &[u8]) -> Option<u64> {
    (deadline_ms < 1 << (64 - HASH_BITS)).then(|| deadline_ms << HASH_BITS | key_hash(key))
}

/// A key name behind a thin pointer: a length prefix and the bytes, in one
/// allocation. Half the size of `Box<[u8]>` in every index entry, which
/// matters at a million leases.
///
/// The prefix is one byte for names under 255 bytes (nearly all), else a
/// 255 marker and four bytes: a 15-byte name then fits a 16-byte
/// allocation.
pub struct ThinKey(NonNull<u8>);

// SAFETY: a ThinKey owns its allocation alone (as a `Box<[u8]>` would),
// never writes it after `new` and frees it in `drop`: moving it to another
// thread moves that ownership.
unsafe impl Send for ThinKey {}
// SAFETY: shared, it is only read (`bytes`, `layout`), never written.
unsafe impl Sync for ThinKey {}

const LONG_NAME: u8 = u8::MAX;
const LONG_PREFIX: usize = 1 + std::mem::size_of::<u32>();

impl ThinKey {
    fn new(key: &[u8]) -> Self {
        // Redis keys are at most 512 MB, well inside u32.
        let len = u32::try_from(key.len()).unwrap_or(u32::MAX) as usize;
        let short = u8::try_from(len).ok().filter(|&l| l != LONG_NAME);
        // Exactly the size the box keeps, so turning it into one does not
        // reallocate.
        let mut buf = Vec::with_capacity(short.map_or(LONG_PREFIX, |_| 1) + len);
        match short {
            Some(short) => buf.push(short),
            None => {
                buf.push(LONG_NAME);
                buf.extend_from_slice(&(len as u32).to_le_bytes());
            }
        }
        buf.extend_from_slice(&key[..len]);
        let raw = Box::into_raw(buf.into_boxed_slice()).cast::<u8>();
        // ok: Box::into_raw never returns null.
        Self(NonNull::new(raw).unwrap_or(NonNull::dangling()))
    }

    /// The prefix's size and the name's length, read from the prefix `new`
    /// wrote at the start of the allocation.
    fn layout(&self) -> (usize, usize) {
        // SAFETY: `self.0` points at the allocation `new` made, at least one
        // byte (the prefix), initialized and alive until `drop`.
        let first = unsafe { *self.0.as_ptr() };
        if first != LONG_NAME {
            return (1, usize::from(first));
        }
        let mut len = [0u8; 4];
        // SAFETY: a LONG_NAME marker is followed by the four length bytes
        // `new` wrote, inside the allocation; `len` is a separate local.
        unsafe { std::ptr::copy_nonoverlapping(self.0.as_ptr().add(1), len.as_mut_ptr(), 4) };
        (LONG_PREFIX, u32::from_le_bytes(len) as usize)
    }

    pub fn bytes(&self) -> &[u8] {
        let (prefix, len) = self.layout();
        // SAFETY: `new` wrote the `len` name bytes right after the `prefix`
        // bytes, in one allocation of `prefix + len` bytes that lives, unchanged,
        // until `drop`, which the borrow of `self` keeps away.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr().add(prefix), len) }
    }
}

impl Drop for ThinKey {
    fn drop(&mut self) {
        let (prefix, len) = self.layout();
        let whole = std::ptr::slice_from_raw_parts_mut(self.0.as_ptr(), prefix + len);
        // Rebuilds the box `new` leaked, with its original length.
        // SAFETY: `whole` is exactly the `Box<[u8]>` `new` turned into a raw
        // pointer (same address and length), freed only here, once.
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
        self.packed >> HASH_BITS
    }

    pub fn key(&self) -> &[u8] {
        self.key.bytes()
    }
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entry")
            .field("deadline_ms", &self.deadline_ms())
            .field("key", &String::from_utf8_lossy(self.key()))
            .finish()
    }
}

/// Lets a set be searched with a borrowed key name, so that removing an
/// entry allocates nothing.
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

/// An entry taken off the index by the reaper.
#[derive(Debug)]
pub struct Due {
    db: i32,
    entry: Entry,
}

impl Due {
    pub fn db(&self) -> i32 {
        self.db
    }

    pub fn deadline_ms(&self) -> u64 {
        self.entry.deadline_ms()
    }

    pub fn key(&self) -> &[u8] {
        self.entry.key()
    }
}

#[derive(Debug, Default)]
pub struct DeadlineIndex {
    /// The databases that have entries, each with its own set: few in
    /// practice, so finding the earliest deadline is a short walk.
    dbs: Vec<(i32, BTreeSet<Entry>)>,
    len: usize,
}

impl DeadlineIndex {
    pub const fn new() -> Self {
        Self {
            dbs: Vec::new(),
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn clear(&mut self) {
        self.dbs.clear();
        self.len = 0;
    }

    fn set(&self, db: i32) -> Option<&BTreeSet<Entry>> {
        self.dbs.iter().find(|(d, _)| *d == db).map(|(_, s)| s)
    }

    fn set_mut(&mut self, db: i32) -> Option<&mut BTreeSet<Entry>> {
        self.dbs.iter_mut().find(|(d, _)| *d == db).map(|(_, s)| s)
    }

    /// Indexes a key; `false` if it was already there at that deadline (or
    /// the deadline is past what the index can hold, which no lease has).
    pub fn insert(&mut self, deadline_ms: u64, db: i32, key: &[u8]) -> bool {
        let Some(packed) = pack(deadline_ms, key) else {
            return false;
        };
        let entry = Entry {
            packed,
            key: ThinKey::new(key),
        };
        let i = match self.dbs.iter().position(|(d, _)| *d == db) {
            Some(i) => i,
            None => {
                self.dbs.push((db, BTreeSet::new()));
                self.dbs.len() - 1
            }
        };
        // One search: a duplicate is dropped by the set itself.
        // ok: `i` is a position found in, or just pushed onto, `dbs`.
        let inserted = self.dbs[i].1.insert(entry);
        self.len += usize::from(inserted);
        inserted
    }

    pub fn contains(&self, deadline_ms: u64, db: i32, key: &[u8]) -> bool {
        let (Some(packed), Some(set)) = (pack(deadline_ms, key), self.set(db)) else {
            return false;
        };
        set.contains(&(packed, key) as &dyn EntryRef)
    }

    pub fn remove(&mut self, deadline_ms: u64, db: i32, key: &[u8]) -> bool {
        let (Some(packed), Some(set)) = (pack(deadline_ms, key), self.set_mut(db)) else {
            return false;
        };
        let removed = set.remove(&(packed, key) as &dyn EntryRef);
        self.len -= usize::from(removed);
        removed
    }

    /// The database whose first entry falls due first.
    fn earliest(&self) -> Option<(usize, u64)> {
        self.dbs
            .iter()
            .enumerate()
            .filter_map(|(i, (_, set))| set.first().map(|e| (i, e.deadline_ms())))
            .min_by_key(|&(_, deadline)| deadline)
    }

    /// Takes the earliest entry whose deadline is at or before `now_ms`.
    pub fn pop_due(&mut self, now_ms: u64) -> Option<Due> {
        let (i, deadline) = self.earliest()?;
        if deadline > now_ms {
            return None;
        }
        // ok: `earliest` returns a position in `dbs`.
        let (db, set) = &mut self.dbs[i];
        let db = *db;
        let entry = set.pop_first()?;
        if set.is_empty() {
            self.dbs.swap_remove(i);
        }
        self.len -= 1;
        Some(Due { db, entry })
    }

    /// Up to `limit` entries due at `now_ms`, left in place: `(db, key)`.
    pub fn due(&self, now_ms: u64, limit: usize) -> Vec<(i32, Vec<u8>)> {
        self.dbs
            .iter()
            .flat_map(|(db, set)| {
                set.iter()
                    .take_while(move |e| e.deadline_ms() <= now_ms)
                    .map(move |e| (*db, e.key().to_vec()))
            })
            .take(limit)
            .collect()
    }

    pub fn next_deadline(&self) -> Option<u64> {
        self.earliest().map(|(_, deadline)| deadline)
    }

    /// `SWAPDB a b`: keys of one database now live in the other.
    pub fn swap_db(&mut self, a: i32, b: i32) {
        for (db, _) in &mut self.dbs {
            if *db == a {
                *db = b;
            } else if *db == b {
                *db = a;
            }
        }
    }

    /// Drops every entry of one database (`FLUSHDB`), or all (`db < 0`).
    pub fn flush(&mut self, db: i32) {
        if db < 0 {
            self.clear();
        } else if let Some(i) = self.dbs.iter().position(|(d, _)| *d == db) {
            let (_, set) = self.dbs.swap_remove(i);
            self.len -= set.len();
        }
    }
}

/// What `LEASE.DEBUG CHECK` reads (`model::check`).
impl DeadlineIndex {
    /// Every entry: database, deadline, key name.
    pub fn entries(&self) -> impl Iterator<Item = (i32, u64, &[u8])> + '_ {
        self.dbs
            .iter()
            .flat_map(|(db, set)| set.iter().map(move |e| (*db, e.deadline_ms(), e.key())))
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
        assert!(idx.pop_due(5).is_none());
        assert_eq!(
            idx.pop_due(25).map(|e| e.key().to_vec()),
            Some(b"a".to_vec())
        );
        assert_eq!(
            idx.pop_due(25).map(|e| (e.db(), e.key().to_vec())),
            Some((1, b"b".to_vec()))
        );
        assert!(idx.pop_due(25).is_none());
        assert_eq!(idx.next_deadline(), Some(30));
        assert_eq!(idx.pop_due(30).map(|e| e.deadline_ms()), Some(30));
        assert_eq!(idx.len(), 0);
    }

    #[test]
    fn due_entries_are_listed_in_place() {
        let mut idx = DeadlineIndex::new();
        idx.insert(10, 0, b"a");
        idx.insert(20, 0, b"b");
        idx.insert(30, 0, b"c");
        idx.insert(15, 2, b"d");
        let mut due = idx.due(20, 10);
        due.sort();
        assert_eq!(
            due,
            vec![(0, b"a".to_vec()), (0, b"b".to_vec()), (2, b"d".to_vec())]
        );
        assert_eq!(idx.len(), 4, "nothing taken");
        assert_eq!(idx.due(20, 1).len(), 1);
        assert!(idx.due(9, 10).is_empty());
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
        let edge: Vec<Vec<u8>> = (253..=256).map(|n| vec![0xff; n]).collect();
        let mut keys = vec![&b""[..], b"k", b"a\0b\r\n", &long];
        keys.extend(edge.iter().map(Vec::as_slice));
        for key in keys {
            let k = ThinKey::new(key);
            assert_eq!(k.bytes(), key);
        }
        assert_eq!(std::mem::size_of::<Entry>(), 16);
    }

    #[test]
    fn far_deadlines_and_any_database() {
        let mut idx = DeadlineIndex::new();
        let far = crate::lease::MAX_DEADLINE_MS;
        assert!(idx.insert(far, i32::MAX, b"k"));
        let e = idx.pop_due(far).expect("due");
        assert_eq!((e.deadline_ms(), e.db()), (far, i32::MAX));
        // past what any lease can hold: refused, never wrongly packed
        assert!(!idx.insert(1 << 44, 0, b"k"));
        assert_eq!(idx.len(), 0);
    }

    #[test]
    fn keys_due_in_one_millisecond_stay_apart() {
        // Enough keys that 20-bit hashes collide (birthday bound ~1,200):
        // ties on the word fall back to the names.
        let keys: Vec<Vec<u8>> = (0..20_000).map(|i| format!("k:{i}").into_bytes()).collect();
        let hashes: std::collections::HashSet<u64> = keys.iter().map(|k| key_hash(k)).collect();
        assert!(hashes.len() < keys.len(), "the test needs a collision");
        let mut idx = DeadlineIndex::new();
        for k in &keys {
            assert!(idx.insert(7, 0, k));
        }
        assert_eq!(idx.len(), keys.len());
        for k in keys.iter().step_by(2) {
            assert!(idx.remove(7, 0, k));
        }
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(idx.contains(7, 0, k), i % 2 == 1);
        }
        let mut popped = 0;
        while let Some(e) = idx.pop_due(7) {
            assert_eq!(e.deadline_ms(), 7);
            popped += 1;
        }
        assert_eq!((popped, idx.len()), (keys.len() / 2, 0));
    }

    #[test]
    fn pops_across_databases_in_deadline_order() {
        let mut idx = DeadlineIndex::new();
        idx.insert(30, 5, b"x");
        idx.insert(10, 9, b"y");
        idx.insert(20, 0, b"z");
        let order: Vec<(u64, i32)> = std::iter::from_fn(|| idx.pop_due(100))
            .map(|e| (e.deadline_ms(), e.db()))
            .collect();
        assert_eq!(order, [(10, 9), (20, 0), (30, 5)]);
        assert_eq!(idx.next_deadline(), None);
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
        assert!(idx.contains(10, 2, b"c"));
        idx.flush(2);
        assert_eq!(idx.len(), 2);
        assert!(!idx.contains(10, 2, b"c"));
        idx.flush(-1);
        assert_eq!(idx.len(), 0);
    }
}
