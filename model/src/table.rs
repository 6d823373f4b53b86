//! A hash map that never resizes in one go: the index tables a million
//! holds can fill (the keys bound to a session, the sessions, the ended
//! sessions' names) without a step that grows with them.
//!
//! A `HashMap` doubles its table when it fills, moving every entry in one
//! operation: 917,000 bound holds took one ACQUIRE 150–190 ms. Here the
//! entries live in shards of a few hundred, picked by a hash of the key;
//! past an average of `SHARD_LOAD` entries a shard, one more shard is split
//! off (linear hashing: shards split in turn, one per crossing of the load,
//! each into itself and one new shard). No operation touches more than one
//! shard's entries, whatever the size: a shard's own growth moves its
//! entries only, a split moves one shard's, and the list of shards is a few
//! thousand pointers at a million entries. Lookups stay one hash and one
//! shard probe.
//!
//! Draining (a session's end hands its keys to the reaper) takes a shard at
//! a time, from the last, so the table a drain leaves is a table still.

use std::borrow::Borrow;
use std::collections::hash_map::{Entry, RandomState};
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};

/// Entries per shard on average before the next shard splits: shards hold
/// from about this many to twice as many (one about to split), so the most
/// entries one step moves is a few times this, at any size.
pub const SHARD_LOAD: usize = 512;

#[derive(Debug)]
pub struct Table<K, V> {
    /// Picks the shard: a fast hash with a seed random per table (set
    /// with the first entry). The shards hash with SipHash of their own,
    /// random too, so a set of names chosen to collide costs no lookup
    /// more than a probe; at worst (a seed guessed) they crowd one shard,
    /// whose growth is then the one-go resize a `HashMap` always has.
    route: Route,
    /// `2^level + split` shards once the first entry arrives.
    shards: Vec<HashMap<K, V>>,
    /// A round of splits starts with `2^level` shards and ends with twice
    /// as many.
    level: u32,
    /// The next shard to split, below `2^level`.
    split: usize,
    len: usize,
    /// Shards from here on are empty (may be lower: a hint for draining).
    filled: usize,
    /// The most entries the last insert can have moved.
    step: usize,
}

impl<K, V> Default for Table<K, V> {
    fn default() -> Self {
        Self {
            route: Route(0),
            shards: Vec::new(),
            level: 0,
            split: 0,
            len: 0,
            filled: 0,
            step: 0,
        }
    }
}

impl<K: Hash + Eq, V> Table<K, V> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The shard of a key whose route hash is `hash`: its low `level` bits,
    /// or one bit more where the shard they name has split this round.
    fn shard_of(&self, hash: u64) -> usize {
        let low = hash as usize & ((1 << self.level) - 1);
        if low < self.split {
            hash as usize & ((1 << (self.level + 1)) - 1)
        } else {
            low
        }
    }

    fn find<Q>(&self, key: &Q) -> Option<&HashMap<K, V>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if self.shards.is_empty() {
            return None;
        }
        self.shards.get(self.shard_of(self.route.hash_one(key)))
    }

    fn find_mut<Q>(&mut self, key: &Q) -> Option<&mut HashMap<K, V>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if self.shards.is_empty() {
            return None;
        }
        let at = self.shard_of(self.route.hash_one(key));
        self.shards.get_mut(at)
    }

    pub fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.find(key)?.get(key)
    }

    pub fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.find_mut(key)?.get_mut(key)
    }

    pub fn contains_key<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.find(key).is_some_and(|s| s.contains_key(key))
    }

    pub fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let removed = self.find_mut(key)?.remove(key);
        if removed.is_some() {
            self.len -= 1;
        }
        removed
    }

    /// The shard `key` goes in, after a split if one more entry would
    /// pass the load; and the count an insert there adds to.
    fn shard_for_insert(&mut self, key: &K) -> (&mut HashMap<K, V>, &mut usize) {
        self.step = 0;
        if self.route.0 == 0 {
            self.route = Route::seeded();
        }
        if !self.shards.is_empty() && self.len >= self.shards.len() * SHARD_LOAD {
            self.split_one();
        }
        let at = self.shard_of(self.route.hash_one(key));
        if at >= self.shards.len() {
            // The first entry: `shard_of` names shard 0 of none.
            self.shards.resize_with(at + 1, HashMap::new);
        }
        self.filled = self.filled.max(at + 1);
        let shard = &mut self.shards[at];
        // A shard's own growth moves the entries it has.
        self.step += shard.len();
        (shard, &mut self.len)
    }

    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        let (shard, len) = self.shard_for_insert(&key);
        let old = shard.insert(key, value);
        if old.is_none() {
            *len += 1;
        }
        old
    }

    /// The value under `key`, inserted by `make` if there is none.
    pub fn get_or_insert_with(&mut self, key: K, make: impl FnOnce() -> V) -> &mut V {
        let (shard, len) = self.shard_for_insert(&key);
        match shard.entry(key) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => {
                *len += 1;
                e.insert(make())
            }
        }
    }

    /// Splits the next shard in turn into itself and a new last shard, by
    /// the next bit of each key's route hash.
    fn split_one(&mut self) {
        let from = self.split;
        let bit = 1 << self.level;
        let old = std::mem::take(&mut self.shards[from]);
        self.step += old.len();
        let mut stay = HashMap::with_capacity(old.len() / 2);
        let mut go = HashMap::with_capacity(old.len() / 2);
        for (k, v) in old {
            match self.route.hash_one(&k) as usize & bit {
                0 => stay.insert(k, v),
                _ => go.insert(k, v),
            };
        }
        self.shards[from] = stay;
        // The new shard is `from + 2^level`: the list's next place.
        self.shards.push(go);
        self.filled = self.shards.len();
        self.split += 1;
        if self.split == bit {
            self.level += 1;
            self.split = 0;
        }
    }

    /// The most entries the last insert can have moved: those of a shard
    /// it split and of the shard it went into (which may have grown).
    /// Bounded by the shards' size, not the table's.
    pub fn last_step(&self) -> usize {
        self.step
    }

    /// The entries of the last shard that has any, taken out: what a drain
    /// takes in one step. What stays is a table still; `None` when empty.
    pub fn take_shard(&mut self) -> Option<HashMap<K, V>> {
        while self.filled > 0 {
            let shard = self.shards.get_mut(self.filled - 1)?;
            if shard.is_empty() {
                self.filled -= 1;
                continue;
            }
            let taken = std::mem::take(shard);
            self.len -= taken.len();
            return Some(taken);
        }
        None
    }

    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.shards.iter().flat_map(HashMap::iter)
    }

    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.iter().map(|(k, _)| k)
    }

    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.iter().map(|(_, v)| v)
    }

    pub fn retain(&mut self, mut keep: impl FnMut(&K, &mut V) -> bool) {
        for shard in &mut self.shards {
            shard.retain(&mut keep);
        }
        self.len = self.shards.iter().map(HashMap::len).sum();
    }
}

/// The route hash: FxHash's word-at-a-time multiply (rustc's hasher) from
/// a random seed, and a final mix (MurmurHash3's) so that the low bits
/// that pick a shard depend on every bit of the key. A fifth of SipHash's
/// instructions; the shards' SipHash guards the lookups.
#[derive(Debug, Clone, Copy)]
struct Route(u64);

const ROUTE_K: u64 = 0x517c_c1b7_2722_0a95;

impl Route {
    fn seeded() -> Self {
        // Never 0: the mark of a table not seeded yet.
        Route(RandomState::new().hash_one(0x5eed_u64) | 1)
    }

    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(ROUTE_K);
    }
}

impl Hasher for Route {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            // The length in the top byte: "a" and "a\0" differ.
            self.add(u64::from_le_bytes(word) ^ (rest.len() as u64) << 56);
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.add(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }

    fn finish(&self) -> u64 {
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^ h >> 33
    }
}

impl BuildHasher for Route {
    type Hasher = Route;

    fn build_hasher(&self) -> Route {
        *self
    }
}

impl<K: Hash + Eq, V> Extend<(K, V)> for Table<K, V> {
    fn extend<I: IntoIterator<Item = (K, V)>>(&mut self, entries: I) {
        for (k, v) in entries {
            self.insert(k, v);
        }
    }
}

impl<K: Hash + Eq, V> FromIterator<(K, V)> for Table<K, V> {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(entries: I) -> Self {
        let mut table = Self::new();
        table.extend(entries);
        table
    }
}

impl<K, V> IntoIterator for Table<K, V> {
    type Item = (K, V);
    type IntoIter = std::iter::Flatten<std::vec::IntoIter<HashMap<K, V>>>;

    fn into_iter(self) -> Self::IntoIter {
        self.shards.into_iter().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The operations are the same every run (the routes are not: each
    // table hashes at random, as in the module).
    use crate::testing::Gen;

    fn key(i: u64) -> Box<[u8]> {
        format!("key:{i}").into_bytes().into()
    }

    /// Compares every entry both ways: same length, same pairs.
    fn same(table: &Table<Box<[u8]>, u32>, oracle: &HashMap<Box<[u8]>, u32>, seed: u64) {
        assert_eq!(table.len(), oracle.len(), "seed {seed}: len");
        assert_eq!(table.iter().count(), oracle.len(), "seed {seed}: entries");
        for (k, v) in oracle {
            assert_eq!(table.get(&**k), Some(v), "seed {seed}: {k:?}");
        }
    }

    #[test]
    fn random_operations_agree_with_a_hash_map() {
        for seed in 1..=40u64 {
            let mut g = Gen(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
            let mut table: Table<Box<[u8]>, u32> = Table::new();
            let mut oracle: HashMap<Box<[u8]>, u32> = HashMap::new();
            // Key spaces from a few keys (the same ones over and over) to
            // more than the operations (mostly new ones), so that tables
            // both churn in place and grow through several rounds of splits.
            let space = [4, 300, 5_000, 100_000][seed as usize % 4];
            for step in 0..6_000 {
                let k = key(g.below(space));
                match g.below(10) {
                    0..=3 => {
                        let v = g.next() as u32;
                        assert_eq!(table.insert(k.clone(), v), oracle.insert(k, v));
                    }
                    4 => {
                        let v = table.get_or_insert_with(k.clone(), || 7);
                        *v = v.wrapping_add(1);
                        let o = oracle.entry(k).or_insert(7);
                        *o = o.wrapping_add(1);
                    }
                    5 | 6 => assert_eq!(table.remove(&*k), oracle.remove(&k)),
                    7 => {
                        if let (Some(v), Some(o)) = (table.get_mut(&*k), oracle.get_mut(&k)) {
                            *v ^= 0xff;
                            *o ^= 0xff;
                        }
                        assert_eq!(table.get(&*k), oracle.get(&k));
                    }
                    8 => assert_eq!(table.contains_key(&*k), oracle.contains_key(&k)),
                    _ => {
                        // Take a shard now and then, and put it back: a
                        // drain stopped by a revive.
                        if g.below(50) == 0 {
                            if let Some(shard) = table.take_shard() {
                                assert!(shard.iter().all(|(k, v)| oracle.get(k) == Some(v)));
                                assert_eq!(table.len() + shard.len(), oracle.len());
                                table.extend(shard);
                            }
                        }
                    }
                }
                if step % 1_000 == 0 {
                    same(&table, &oracle, seed);
                }
            }
            same(&table, &oracle, seed);
            let cut = g.next() as u32;
            table.retain(|_, v| *v > cut);
            oracle.retain(|_, v| *v > cut);
            same(&table, &oracle, seed);
            let rebuilt: Table<Box<[u8]>, u32> = table.into_iter().collect();
            same(&rebuilt, &oracle, seed);
        }
    }

    #[test]
    fn a_drain_takes_every_entry_once_a_shard_at_a_time() {
        let mut table: Table<Box<[u8]>, u32> = (0..20_000).map(|i| (key(i), i as u32)).collect();
        let mut seen = 0;
        while let Some(shard) = table.take_shard() {
            assert!(!shard.is_empty());
            assert!(shard.len() <= 4 * SHARD_LOAD, "a shard of {}", shard.len());
            for (k, v) in shard {
                assert_eq!(k, key(u64::from(v)));
                seen += 1;
            }
            assert_eq!(table.len(), 20_000 - seen);
        }
        assert_eq!(seen, 20_000);
        assert!(table.is_empty() && table.take_shard().is_none());
        // Drained, it is an empty table that takes entries again.
        table.insert(key(1), 1);
        assert_eq!(table.get(&*key(1)), Some(&1));
    }

    /// The worst step of inserting `n` entries: the most entries one
    /// insert can have moved.
    fn worst_step(n: u64) -> usize {
        let mut table = Table::new();
        (0..n)
            .map(|i| {
                table.insert(key(i), 0u32);
                table.last_step()
            })
            .max()
            .unwrap_or(0)
    }

    #[test]
    fn the_worst_step_does_not_grow_with_the_table() {
        // A `HashMap`'s worst step is its size (all of it moves at a
        // doubling); here it is about four shards' load at any size. The
        // bound leaves room for the spread of a random hash: the largest
        // of a few thousand shards stays well within it.
        let small = worst_step(10_000);
        let large = worst_step(1_000_000);
        assert!(small <= 6 * SHARD_LOAD, "10k entries: a step of {small}");
        assert!(large <= 6 * SHARD_LOAD, "1M entries: a step of {large}");
        assert!(
            large <= 2 * small,
            "the worst step grew with the table: {small} at 10k, {large} at 1M"
        );
    }
}
