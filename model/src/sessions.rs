//! Which keys hold holds bound to which session: the index a session's end
//! is carried out with. Kept in step with every change of a bound hold (a
//! grant, an effect, a load, a key that arrives or leaves), bounded by the
//! holds it counts: an entry lives while a hold is bound to it.
//!
//! Every table here is a `Table`, which grows a shard at a time: binding
//! the millionth hold, or ending the session that has them, is a step as
//! short as binding the first.

use std::collections::VecDeque;

use crate::holds::Binding;
use crate::table::Table;

#[derive(Debug, Default)]
struct Bound {
    /// Holds bound to the session.
    total: u64,
    /// The keys that hold them, with how many each (empty once the
    /// session ended and its keys went to the reaper's queue).
    keys: Table<Box<[u8]>, u32>,
    /// When the session ended, once it has.
    ended_at: Option<u64>,
}

/// A session that ended, with the keys whose bound holds are to be
/// reaped, a batch at a time.
#[derive(Debug)]
pub struct Ended {
    pub db: i32,
    pub session: Box<[u8]>,
    fence: u64,
    /// Whether its `lease.session-end` was announced.
    pub announced: bool,
    /// As the index had them: moved, not copied, when the session ended.
    keys: Table<Box<[u8]>, u32>,
    /// The shard taken from `keys` last, not all handed out yet, sorted by
    /// key: a hold that leaves meanwhile is found by a binary search, not a
    /// scan of the shard (the reaper settles each key it took, and each
    /// asks).
    taken: Vec<(Box<[u8]>, u32)>,
}

impl Ended {
    /// Up to `n` keys to visit next; empty when done. A step takes at most
    /// one shard of the table, however many keys the session had.
    pub fn next_keys(&mut self, n: usize) -> Vec<Box<[u8]>> {
        if self.taken.is_empty() {
            if let Some(shard) = self.keys.take_shard() {
                self.taken = shard.into_iter().collect();
                self.taken.sort_unstable_by(|a, b| a.0.cmp(&b.0));
            }
        }
        let from = self.taken.len().saturating_sub(n);
        self.taken.drain(from..).map(|(k, _)| k).collect()
    }

    /// A hold on `key` left before the reaper reached it: one fewer to hand
    /// back if the session is revived.
    fn unbound(&mut self, key: &[u8]) {
        if let Some(n) = self.keys.get_mut(key) {
            *n -= 1;
            if *n == 0 {
                self.keys.remove(key);
            }
        } else if let Ok(at) = self.taken.binary_search_by(|(k, _)| (**k).cmp(key)) {
            self.taken[at].1 -= 1;
            if self.taken[at].1 == 0 {
                // Keeps the order the search needs.
                self.taken.remove(at);
            }
        }
    }

    /// The keys not handed out yet, with their counts: a revived session's.
    fn into_rest(self) -> Table<Box<[u8]>, u32> {
        let mut keys = self.keys;
        keys.extend(self.taken);
        keys
    }
}

/// A session key and what is bound to it.
type Named = (Box<[u8]>, Bound);

#[derive(Debug, Default)]
pub struct BoundIndex {
    /// By database and the session grant's fence (unique on the node but
    /// for keys restored from elsewhere), then the session key: a lookup
    /// copies nothing.
    sessions: Table<(i32, u64), Vec<Named>>,
    /// Entries of `sessions` that have not ended.
    live: usize,
    /// Sessions that ended with bound holds, for the reaper (primary).
    ended: VecDeque<Ended>,
    holds: u64,
    /// Session grants that ended here with holds bound to them: by
    /// database and session key, the highest such grant's fence. A lease
    /// value arriving under that name with that fence or a lower one is an
    /// ended session coming back (`RENAME` or `MOVE` back, `RESTORE` of its
    /// own `DUMP`) and arrives free.
    tombstones: Table<(i32, Box<[u8]>), u64>,
    /// The tombstones' keys, oldest first, to forget the oldest past
    /// `MAX_TOMBSTONES`.
    tombstone_order: VecDeque<(i32, Box<[u8]>)>,
}

/// How many ended session grants a node remembers: one per session key
/// name (a newer end on the same name replaces the older), so the workers
/// of an application that reuses its session names never reach it; past
/// it, the oldest names are forgotten.
pub const MAX_TOMBSTONES: usize = 100_000;

impl BoundIndex {
    fn find(&self, db: i32, session: &[u8], fence: u64) -> Option<&Bound> {
        let list = self.sessions.get(&(db, fence))?;
        list.iter().find(|(k, _)| **k == *session).map(|(_, b)| b)
    }

    fn find_mut(&mut self, db: i32, session: &[u8], fence: u64) -> Option<&mut Bound> {
        let list = self.sessions.get_mut(&(db, fence))?;
        list.iter_mut()
            .find(|(k, _)| **k == *session)
            .map(|(_, b)| b)
    }

    fn remove(&mut self, db: i32, session: &[u8], fence: u64) {
        if let Some(list) = self.sessions.get_mut(&(db, fence)) {
            let live = &mut self.live;
            list.retain(|(k, b)| {
                let gone = **k == *session;
                if gone && b.ended_at.is_none() {
                    *live -= 1;
                }
                !gone
            });
            if list.is_empty() {
                self.sessions.remove(&(db, fence));
            }
        }
    }

    /// A hold on `key` is bound to `binding`'s session.
    pub fn bind(&mut self, db: i32, key: &[u8], binding: &Binding) {
        let list = self
            .sessions
            .get_or_insert_with((db, binding.fence), Vec::new);
        let at = match list.iter().position(|(k, _)| *k == binding.key) {
            Some(at) => at,
            None => {
                list.push((binding.key.clone(), Bound::default()));
                self.live += 1;
                list.len() - 1
            }
        };
        // ok: `at` is an entry of the list, found or just pushed.
        let bound = &mut list[at].1;
        bound.total += 1;
        if bound.ended_at.is_none() {
            // One lookup: nearly every bind is of a key new to the session,
            // which needs its name copied anyway.
            *bound.keys.get_or_insert_with(key.into(), || 0) += 1;
        }
        self.holds += 1;
    }

    /// A hold on `key` bound to `binding`'s session is gone.
    pub fn unbind(&mut self, db: i32, key: &[u8], binding: &Binding) {
        let Some(bound) = self.find_mut(db, &binding.key, binding.fence) else {
            return;
        };
        let queued = match bound.keys.get_mut(key) {
            Some(n) => {
                *n -= 1;
                if *n == 0 {
                    bound.keys.remove(key);
                }
                false
            }
            // The session ended: its keys are in the reaper's queue.
            None => bound.ended_at.is_some(),
        };
        bound.total = bound.total.saturating_sub(1);
        let emptied = bound.total == 0;
        self.holds = self.holds.saturating_sub(1);
        if emptied {
            self.remove(db, &binding.key, binding.fence);
        }
        if queued {
            // Not handed back with the rest if the session is revived.
            let session = &*binding.key;
            if let Some(ended) = self
                .ended
                .iter_mut()
                .find(|e| e.db == db && &*e.session == session && e.fence == binding.fence)
            {
                ended.unbound(key);
            }
        }
    }

    /// Holds bound to a session that has not ended.
    pub fn bound_to(&self, db: i32, session: &[u8], fence: u64) -> u64 {
        self.find(db, session, fence)
            .filter(|b| b.ended_at.is_none())
            .map_or(0, |b| b.total)
    }

    /// When a session with bound holds ended, if it has.
    pub fn ended_at(&self, db: i32, session: &[u8], fence: u64) -> Option<u64> {
        self.find(db, session, fence)?.ended_at
    }

    /// The session ended at `at_ms`. With `queue`, its keys go to the
    /// reaper; returns the bound keys, if it had any (once: an end already
    /// noted is not noted again).
    pub fn end(
        &mut self,
        db: i32,
        session: &[u8],
        fence: u64,
        at_ms: u64,
        queue: bool,
    ) -> Option<&Table<Box<[u8]>, u32>> {
        // The field itself, not `find_mut`: `ended` is borrowed below.
        let (_, bound) = self
            .sessions
            .get_mut(&(db, fence))?
            .iter_mut()
            .find(|(k, _)| **k == *session)?;
        if bound.ended_at.is_some() {
            return None;
        }
        bound.ended_at = Some(at_ms);
        self.live -= 1;
        bury(
            &mut self.tombstones,
            &mut self.tombstone_order,
            db,
            session,
            fence,
        );
        if !queue {
            return Some(&bound.keys);
        }
        let keys = std::mem::take(&mut bound.keys);
        self.ended.push_back(Ended {
            db,
            session: session.into(),
            fence,
            announced: false,
            keys,
            taken: Vec::new(),
        });
        self.ended.back().map(|e| &e.keys)
    }

    /// The session's grant is back under its name with the same fence (an
    /// evicted session put back): it did not end after all. Keys the reaper
    /// has not been handed yet go back to the session.
    pub fn revive(&mut self, db: i32, session: &[u8], fence: u64) {
        let key = (db, Box::<[u8]>::from(session));
        if self.tombstones.get(&key) == Some(&fence) {
            self.tombstones.remove(&key);
        }
        let queued = self
            .ended
            .iter()
            .position(|e| e.db == db && &*e.session == session && e.fence == fence);
        let ended = queued.and_then(|at| self.ended.remove(at));
        let Some(bound) = self.find_mut(db, session, fence) else {
            return;
        };
        let was_ended = bound.ended_at.take().is_some();
        if let Some(ended) = ended {
            let rest = ended.into_rest();
            if bound.keys.is_empty() {
                bound.keys = rest;
            } else {
                // Holds bound since: both sets count.
                for (k, n) in rest {
                    *bound.keys.get_or_insert_with(k, || 0) += n;
                }
            }
        }
        if was_ended {
            self.live += 1;
        }
    }

    /// Whether a session grant on `session` with `fence` ended here with
    /// holds bound to it (or a later grant on that name did): a value
    /// bringing it back arrives free.
    pub fn is_buried(&self, db: i32, session: &[u8], fence: u64) -> bool {
        if self.tombstones.is_empty() {
            return false;
        }
        // A lookup by a borrowed name: the map's key is an owned pair.
        let key = (db, Box::<[u8]>::from(session));
        self.tombstones.get(&key).is_some_and(|&f| fence <= f)
    }

    /// The oldest ended session still to reap.
    pub fn next_ended(&mut self) -> Option<&mut Ended> {
        self.ended.front_mut()
    }

    pub fn finish_ended(&mut self) {
        self.ended.pop_front();
    }

    /// Sessions with bound holds that have not ended.
    pub fn sessions(&self) -> usize {
        self.live
    }

    /// Bound holds counted.
    pub fn holds(&self) -> u64 {
        self.holds
    }

    /// Forgets one database (`FLUSHDB`), or all (`None`: `FLUSHALL`).
    /// Tombstones stay: a flush before a load (`DEBUG RELOAD`, a full
    /// sync) brings the sessions back with their holds, which no arrival
    /// checks, and what a flush takes does not come back by itself.
    pub fn forget(&mut self, db: Option<i32>) {
        let keep = |d: i32| db.is_some_and(|f| f != d);
        self.sessions.retain(|(d, _), _| keep(*d));
        self.ended.retain(|e| keep(e.db));
        self.holds = self.sessions.values().flatten().map(|(_, b)| b.total).sum();
        self.live = (self.sessions.values().flatten())
            .filter(|(_, b)| b.ended_at.is_none())
            .count();
    }

    /// `SWAPDB a b`: the two databases trade their entries.
    pub fn swap(&mut self, a: i32, b: i32) {
        let swapped = |d: i32| match d {
            d if d == a => b,
            d if d == b => a,
            d => d,
        };
        self.sessions = std::mem::take(&mut self.sessions)
            .into_iter()
            .map(|((d, f), v)| ((swapped(d), f), v))
            .collect();
        for e in &mut self.ended {
            e.db = swapped(e.db);
        }
        self.tombstones = std::mem::take(&mut self.tombstones)
            .into_iter()
            .map(|((d, k), f)| ((swapped(d), k), f))
            .collect();
        for (d, _) in &mut self.tombstone_order {
            *d = swapped(*d);
        }
    }
}

/// Remembers that the session grant on `session` with `fence` ended (the
/// fields of `BoundIndex`, borrowed apart from its sessions).
fn bury(
    tombstones: &mut Table<(i32, Box<[u8]>), u64>,
    order: &mut VecDeque<(i32, Box<[u8]>)>,
    db: i32,
    session: &[u8],
    fence: u64,
) {
    let key = (db, Box::<[u8]>::from(session));
    match tombstones.get_mut(&key) {
        Some(f) => *f = (*f).max(fence),
        None => {
            order.push_back(key.clone());
            tombstones.insert(key, fence);
        }
    }
    while tombstones.len() > MAX_TOMBSTONES {
        let Some(oldest) = order.pop_front() else {
            break;
        };
        tombstones.remove(&oldest);
    }
    // Names forgotten by a revive stay in the order list until they come
    // up; it never holds more than twice the cap.
    if order.len() > 2 * MAX_TOMBSTONES {
        order.retain(|k| tombstones.contains_key(k));
    }
}

impl BoundIndex {
    /// The keys holding holds bound to the session granted on `session`
    /// with `fence` in `db`, while that session has not ended: what must
    /// move with it (a `MIGRATE` takes the group whole). Nothing once it
    /// ended (its keys went to the reaper) or with nothing bound.
    pub fn bound_keys(&self, db: i32, session: &[u8], fence: u64) -> impl Iterator<Item = &[u8]> {
        self.find(db, session, fence)
            .filter(|b| b.ended_at.is_none())
            .into_iter()
            .flat_map(|b| b.keys.keys().map(|k| &**k))
    }
}

/// What `LEASE.DEBUG CHECK` compares with the keyspace (`model::check`):
/// read-only copies, so the check holds no lock on the index while it
/// compares.
impl BoundIndex {
    /// Every entry: its session grant, its counts, whether it ended.
    pub fn audit(&self) -> Vec<crate::check::IndexedSession> {
        self.sessions
            .iter()
            .flat_map(|(&(db, fence), list)| {
                list.iter()
                    .map(move |(session, b)| crate::check::IndexedSession {
                        db,
                        session: session.clone(),
                        fence,
                        total: b.total,
                        keys: b.keys.iter().map(|(k, &n)| (k.clone(), n)).collect(),
                        ended: b.ended_at.is_some(),
                    })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(key: &[u8], fence: u64) -> Binding {
        Binding {
            key: key.into(),
            fence,
        }
    }

    #[test]
    fn binds_count_per_session_and_go_with_their_last_hold() {
        let mut index = BoundIndex::default();
        let s = session(b"s", 7);
        index.bind(0, b"a", &s);
        index.bind(0, b"a", &s);
        index.bind(0, b"b", &s);
        index.bind(1, b"a", &s);
        assert_eq!(index.bound_to(0, b"s", 7), 3);
        assert_eq!(index.bound_to(0, b"s", 8), 0);
        assert_eq!((index.sessions(), index.holds()), (2, 4));
        for key in [&b"a"[..], b"a", b"b"] {
            index.unbind(0, key, &s);
        }
        assert_eq!(index.bound_to(0, b"s", 7), 0);
        assert_eq!((index.sessions(), index.holds()), (1, 1));
        index.unbind(0, b"zz", &s);
        assert_eq!(index.holds(), 1);
    }

    #[test]
    fn an_end_queues_the_keys_once_and_hands_them_out_in_batches() {
        let mut index = BoundIndex::default();
        let s = session(b"s", 7);
        for i in 0..10u8 {
            index.bind(0, &[i], &s);
        }
        let keys = index.end(0, b"s", 7, 1000, true).map(Table::len);
        assert_eq!(keys, Some(10));
        assert!(index.end(0, b"s", 7, 2000, true).is_none(), "once");
        assert_eq!(index.ended_at(0, b"s", 7), Some(1000));
        assert_eq!(
            index.bound_to(0, b"s", 7),
            0,
            "an ended session binds nothing"
        );
        assert_eq!(index.sessions(), 0);
        let ended = index.next_ended().expect("queued");
        let mut seen = Vec::new();
        loop {
            let batch = ended.next_keys(4);
            if batch.is_empty() {
                break;
            }
            assert!(batch.len() <= 4);
            seen.extend(batch);
        }
        seen.sort();
        assert_eq!(
            seen,
            (0..10u8).map(|i| Box::from(&[i][..])).collect::<Vec<_>>()
        );
        index.finish_ended();
        assert!(index.next_ended().is_none());
        // The holds go as the reaper drops them; then the entry goes.
        for i in 0..10u8 {
            index.unbind(0, &[i], &s);
        }
        assert_eq!(index.ended_at(0, b"s", 7), None);
        assert_eq!(index.holds(), 0);
    }

    #[test]
    fn an_end_takes_a_shard_at_a_time_at_any_size() {
        // The old index turned the whole map into a list at the first
        // batch: 48 ms at 1,000,000 keys. Each batch now takes at most
        // one shard out of the table, at 1,000 keys as at 200,000.
        for n in [1_000u32, 200_000] {
            let mut index = BoundIndex::default();
            let s = session(b"s", 7);
            for i in 0..n {
                index.bind(0, &i.to_le_bytes(), &s);
            }
            index.end(0, b"s", 7, 1000, true);
            let ended = index.next_ended().expect("queued");
            let mut handed = 0;
            let mut most = 0;
            loop {
                let before = ended.keys.len();
                let batch = ended.next_keys(200);
                if batch.is_empty() {
                    break;
                }
                handed += batch.len();
                most = most.max(before - ended.keys.len());
            }
            assert_eq!(handed, n as usize);
            let bound = 4 * crate::table::SHARD_LOAD;
            assert!(
                most <= bound,
                "{n} keys: a batch moved {most} out of the table"
            );
        }
    }

    #[test]
    fn a_revived_session_takes_its_keys_back() {
        let mut index = BoundIndex::default();
        let s = session(b"s", 7);
        index.bind(0, b"a", &s);
        assert!(index.end(0, b"s", 7, 1000, true).is_some());
        index.revive(0, b"s", 7);
        assert!(index.next_ended().is_none(), "nothing left for the reaper");
        assert_eq!(index.bound_to(0, b"s", 7), 1);
        assert_eq!(index.ended_at(0, b"s", 7), None);
        // It can end again later.
        assert!(index.end(0, b"s", 7, 2000, true).is_some());
    }

    #[test]
    fn a_hold_gone_before_the_reaper_is_not_handed_back_on_revival() {
        let mut index = BoundIndex::default();
        let s = session(b"s", 7);
        for key in [&b"a"[..], b"b", b"b"] {
            index.bind(0, key, &s);
        }
        assert!(index.end(0, b"s", 7, 1000, true).is_some());
        // Released by their holders while the keys wait in the reaper's queue.
        index.unbind(0, b"a", &s);
        index.unbind(0, b"b", &s);
        index.revive(0, b"s", 7);
        assert_eq!(index.bound_to(0, b"s", 7), 1);
        let keys: Vec<&[u8]> = index.bound_keys(0, b"s", 7).collect();
        assert_eq!(keys, [&b"b"[..]], "a's only hold went; one of b's stays");
        // Also once the reaper was handed a batch (the keys out of the table).
        assert!(index.end(0, b"s", 7, 2000, true).is_some());
        let ended = index.next_ended().expect("queued");
        assert_eq!(ended.next_keys(0), Vec::<Box<[u8]>>::new());
        index.unbind(0, b"b", &s);
        index.revive(0, b"s", 7);
        assert_eq!(index.bound_keys(0, b"s", 7).count(), 0);
    }

    #[test]
    fn a_hold_gone_from_the_shard_the_reaper_took_is_not_handed_back() {
        let mut index = BoundIndex::default();
        let s = session(b"s", 7);
        let keys: Vec<Vec<u8>> = (0..100u8).map(|i| vec![b'k', i]).collect();
        for key in &keys {
            index.bind(0, key, &s);
        }
        assert!(index.end(0, b"s", 7, 1000, true).is_some());
        // The reaper takes the shard and is handed 10 keys; 90 wait in it.
        let handed = index.next_ended().expect("queued").next_keys(10);
        assert_eq!(handed.len(), 10);
        for key in &handed {
            index.unbind(0, key, &s);
        }
        // Holds released by their holders while their keys wait in the shard.
        let waiting: Vec<&Vec<u8>> = keys
            .iter()
            .filter(|k| !handed.iter().any(|h| **h == ***k))
            .collect();
        for key in waiting.iter().step_by(3) {
            index.unbind(0, key, &s);
        }
        index.revive(0, b"s", 7);
        let mut back: Vec<&[u8]> = index.bound_keys(0, b"s", 7).collect();
        back.sort();
        let mut expected: Vec<&[u8]> = waiting
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 3 != 0)
            .map(|(_, k)| k.as_slice())
            .collect();
        expected.sort();
        assert_eq!(back, expected);
        assert_eq!(index.bound_to(0, b"s", 7), expected.len() as u64);
    }

    #[test]
    fn an_ended_grant_is_remembered_by_name_and_fence() {
        let mut index = BoundIndex::default();
        let s = session(b"s", 7);
        index.bind(0, b"a", &s);
        assert!(!index.is_buried(0, b"s", 7), "live");
        assert!(index.end(0, b"s", 7, 1000, true).is_some());
        // That grant and older values of the name; not a newer grant, not
        // another name or database.
        assert!(index.is_buried(0, b"s", 7));
        assert!(index.is_buried(0, b"s", 6));
        assert!(!index.is_buried(0, b"s", 8));
        assert!(!index.is_buried(0, b"t", 7));
        assert!(!index.is_buried(1, b"s", 7));
        // Remembered after its holds are gone, and after a flush.
        index.unbind(0, b"a", &s);
        index.forget(None);
        assert!(index.is_buried(0, b"s", 7));
        // A later end on the name raises the fence; a swap moves it.
        let later = session(b"s", 9);
        index.bind(0, b"b", &later);
        index.end(0, b"s", 9, 2000, true);
        assert!(index.is_buried(0, b"s", 8));
        index.swap(0, 3);
        assert!(index.is_buried(3, b"s", 9) && !index.is_buried(0, b"s", 9));
    }

    #[test]
    fn a_session_without_bound_holds_leaves_no_tombstone() {
        let mut index = BoundIndex::default();
        assert!(index.end(0, b"s", 7, 1000, true).is_none());
        assert!(!index.is_buried(0, b"s", 7));
    }

    #[test]
    fn an_evicted_session_put_back_is_not_buried() {
        let mut index = BoundIndex::default();
        let s = session(b"s", 7);
        index.bind(0, b"a", &s);
        index.end(0, b"s", 7, 1000, true);
        index.revive(0, b"s", 7);
        assert!(!index.is_buried(0, b"s", 7));
    }

    #[test]
    fn tombstones_are_capped_oldest_first() {
        let mut index = BoundIndex::default();
        for i in 0..MAX_TOMBSTONES + 10 {
            let name = format!("s{i}");
            let s = session(name.as_bytes(), 1);
            index.bind(0, b"a", &s);
            index.end(0, name.as_bytes(), 1, 1000, false);
            index.unbind(0, b"a", &s);
        }
        assert!(!index.is_buried(0, b"s0", 1), "the oldest is forgotten");
        assert!(index.is_buried(0, b"s10", 1));
        let last = format!("s{}", MAX_TOMBSTONES + 9);
        assert!(index.is_buried(0, last.as_bytes(), 1));
        assert_eq!(index.tombstones.len(), MAX_TOMBSTONES);
    }

    #[test]
    fn flush_and_swap() {
        let mut index = BoundIndex::default();
        index.bind(0, b"a", &session(b"s", 1));
        index.bind(1, b"a", &session(b"s", 1));
        index.swap(0, 1);
        assert_eq!(index.bound_to(1, b"s", 1), 1);
        index.forget(Some(1));
        assert_eq!(
            (index.bound_to(1, b"s", 1), index.bound_to(0, b"s", 1)),
            (0, 1)
        );
        index.forget(None);
        assert_eq!(index.holds(), 0);
    }

    #[test]
    fn bound_keys_are_a_live_sessions_group() {
        let mut index = BoundIndex::default();
        let s = session(b"s", 7);
        index.bind(0, b"a", &s);
        index.bind(0, b"a", &s);
        index.bind(0, b"b", &s);
        index.bind(1, b"c", &s);
        index.bind(0, b"d", &session(b"other", 7));
        let keys = |index: &BoundIndex, db, name: &[u8], fence| {
            let mut keys: Vec<Vec<u8>> = index
                .bound_keys(db, name, fence)
                .map(<[u8]>::to_vec)
                .collect();
            keys.sort();
            keys
        };
        // (db, session, fence) -> its keys, each once.
        type Case = (i32, &'static [u8], u64, Vec<&'static [u8]>);
        let cases: [Case; 5] = [
            (0, b"s", 7, vec![b"a", b"b"]),
            (1, b"s", 7, vec![b"c"]),
            (0, b"other", 7, vec![b"d"]),
            (0, b"s", 8, vec![]),
            (2, b"s", 7, vec![]),
        ];
        for (db, name, fence, want) in cases {
            let want: Vec<Vec<u8>> = want.into_iter().map(<[u8]>::to_vec).collect();
            assert_eq!(keys(&index, db, name, fence), want, "{db} {name:?} {fence}");
        }
        // A key goes with its last bound hold.
        index.unbind(0, b"a", &s);
        assert_eq!(keys(&index, 0, b"s", 7), [b"a".to_vec(), b"b".to_vec()]);
        index.unbind(0, b"a", &s);
        assert_eq!(keys(&index, 0, b"s", 7), [b"b".to_vec()]);
        // An ended session has no group; one revived has it again.
        assert!(index.end(0, b"s", 7, 1000, true).is_some());
        assert!(keys(&index, 0, b"s", 7).is_empty());
        index.revive(0, b"s", 7);
        assert_eq!(keys(&index, 0, b"s", 7), [b"b".to_vec()]);
        assert!(index.end(0, b"s", 7, 2000, false).is_some());
        assert!(keys(&index, 0, b"s", 7).is_empty(), "ended, not queued");
    }
}

#[cfg(test)]
mod properties {
    use std::collections::HashSet;

    use super::*;

    use crate::testing::Gen;

    /// A session grant: database, name, fence.
    type Grant = (i32, Box<[u8]>, u64);

    /// The oracle: the live bound holds as a plain list (key and grant),
    /// the grants that ended, and the reaper's queue with the keys each
    /// ended grant had and those handed out so far.
    #[derive(Default)]
    struct Oracle {
        holds: Vec<(Box<[u8]>, Grant)>,
        ended: HashSet<Grant>,
        queue: VecDeque<(Grant, Keys, Keys)>,
    }

    type Keys = HashSet<Box<[u8]>>;

    impl Oracle {
        fn keys(&self, grant: &Grant) -> HashSet<Box<[u8]>> {
            let held = self.holds.iter().filter(|(_, g)| g == grant);
            held.map(|(k, _)| k.clone()).collect()
        }

        /// The reaper took `key` of `grant`: its holds go (settled free).
        fn reap(&mut self, index: &mut BoundIndex, key: &[u8], grant: &Grant) {
            let binding = binding(grant);
            while let Some(at) = (self.holds.iter()).position(|(k, g)| **k == *key && g == grant) {
                self.holds.swap_remove(at);
                index.unbind(grant.0, key, &binding);
            }
            if !self.holds.iter().any(|(_, g)| g == grant) {
                self.ended.remove(grant);
            }
        }
    }

    fn binding(grant: &Grant) -> Binding {
        Binding {
            key: grant.1.clone(),
            fence: grant.2,
        }
    }

    fn check(index: &BoundIndex, oracle: &Oracle, grants: &[Grant], seed: u64) {
        assert_eq!(index.holds(), oracle.holds.len() as u64, "seed {seed}");
        let live: HashSet<&Grant> = (oracle.holds.iter())
            .map(|(_, g)| g)
            .filter(|g| !oracle.ended.contains(*g))
            .collect();
        assert_eq!(index.sessions(), live.len(), "seed {seed}: live sessions");
        for grant in grants {
            let (db, name, fence) = (grant.0, &*grant.1, grant.2);
            let ended = oracle.ended.contains(grant);
            let count = oracle.holds.iter().filter(|(_, g)| g == grant).count();
            let want = if ended { 0 } else { count as u64 };
            assert_eq!(index.bound_to(db, name, fence), want, "seed {seed}");
            assert_eq!(
                index.ended_at(db, name, fence).is_some(),
                ended,
                "seed {seed}"
            );
            let keys: HashSet<Box<[u8]>> =
                index.bound_keys(db, name, fence).map(Box::from).collect();
            let want = if ended {
                HashSet::new()
            } else {
                oracle.keys(grant)
            };
            assert_eq!(keys, want, "seed {seed}: bound keys of {grant:?}");
        }
    }

    #[test]
    fn random_sessions_agree_with_a_plain_model() {
        for seed in 1..=30u64 {
            let mut g = Gen(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
            let mut index = BoundIndex::default();
            let mut oracle = Oracle::default();
            let grants: Vec<Grant> = (0..2)
                .flat_map(|db| {
                    (0..3).flat_map(move |s| {
                        (1..=2).map(move |f| (db, format!("s{s}").into_bytes().into(), f))
                    })
                })
                .collect();
            let space = [20, 3_000][seed as usize % 2];
            for step in 0..4_000 {
                let grant = grants[g.below(grants.len() as u64) as usize].clone();
                match g.below(20) {
                    // Holds are bound to live sessions only (an ACQUIRE
                    // names a live one).
                    0..=11 if !oracle.ended.contains(&grant) => {
                        let key: Box<[u8]> = format!("k{}", g.below(space)).into_bytes().into();
                        index.bind(grant.0, &key, &binding(&grant));
                        oracle.holds.push((key, grant));
                    }
                    // A live session's hold goes (an ended one's go by the
                    // reaper, below).
                    12..=14 if !oracle.holds.is_empty() => {
                        let at = g.below(oracle.holds.len() as u64) as usize;
                        if oracle.ended.contains(&oracle.holds[at].1) {
                            continue;
                        }
                        let (key, grant) = oracle.holds.swap_remove(at);
                        index.unbind(grant.0, &key, &binding(&grant));
                        if !oracle.holds.iter().any(|(_, g)| *g == grant) {
                            oracle.ended.remove(&grant);
                        }
                    }
                    15 => {
                        let keys = index.end(grant.0, &grant.1, grant.2, 1000, true);
                        let keys: Option<HashSet<Box<[u8]>>> =
                            keys.map(|t| t.keys().cloned().collect());
                        let bound = oracle.holds.iter().any(|(_, g)| *g == grant);
                        if bound && oracle.ended.insert(grant.clone()) {
                            let had = oracle.keys(&grant);
                            assert_eq!(keys.as_ref(), Some(&had), "seed {seed}");
                            oracle.queue.push_back((grant, had, HashSet::new()));
                        } else {
                            assert_eq!(keys, None, "seed {seed}: ended once, and bound");
                        }
                    }
                    16 => {
                        index.revive(grant.0, &grant.1, grant.2);
                        oracle.ended.remove(&grant);
                        oracle.queue.retain(|(g, _, _)| *g != grant);
                    }
                    _ => {
                        // A reaper step: a batch of the oldest ended grant.
                        let n = 1 + g.below(60) as usize;
                        let (batch, ended) = match index.next_ended() {
                            Some(e) => ((e.next_keys(n)), (e.db, e.session.clone(), e.fence)),
                            None => {
                                assert!(oracle.queue.is_empty(), "seed {seed}");
                                continue;
                            }
                        };
                        let Some((grant, had, handed)) = oracle.queue.front_mut() else {
                            panic!("seed {seed}: the index queued {ended:?}, the oracle none");
                        };
                        assert_eq!(*grant, ended, "seed {seed}: the oldest first");
                        assert!(batch.len() <= n, "seed {seed}");
                        for key in &batch {
                            assert!(had.contains(key), "seed {seed}: {key:?} was not bound");
                            assert!(handed.insert(key.clone()), "seed {seed}: {key:?} twice");
                        }
                        if batch.is_empty() {
                            assert_eq!(had, handed, "seed {seed}: every key handed out");
                            index.finish_ended();
                            oracle.queue.pop_front();
                        }
                        for key in batch {
                            oracle.reap(&mut index, &key, &ended);
                        }
                    }
                }
                if step % 50 == 0 {
                    check(&index, &oracle, &grants, seed);
                }
            }
            check(&index, &oracle, &grants, seed);
        }
    }
}
