//! Sessions in the keyspace: whether a bound hold's session is live (read
//! from the session's key), the bound-hold index kept in step with every
//! change, and a session's end noted wherever it happens.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::keyspace::state::{self, STATS};
use crate::model::error::{self, Message};
use crate::model::holds::{Binding, SessionState, Sessions};
use crate::model::lease::{Lease, NotSession};
use crate::model::sessions::BoundIndex;
use crate::rm::{self, Ctx, Key, OwnedString, RString, Slot};

/// Answers for bound holds in the selected database by looking at their
/// session keys, each once per command. Costs nothing until asked: the
/// leases without bound holds never ask.
pub struct Lookup {
    ctx: Ctx,
    now_ms: u64,
    seen: Option<HashMap<Binding, SessionState>>,
}

impl Lookup {
    pub fn new(ctx: Ctx, now_ms: u64) -> Self {
        Self {
            ctx,
            now_ms,
            seen: None,
        }
    }

    fn look(&self, binding: &Binding) -> SessionState {
        let name = OwnedString::new(self.ctx, &binding.key);
        let found = Key::open_read(self.ctx, name.as_ptr()).and_then(|mut key| {
            match key.value::<Lease>() {
                Slot::Ours(lease) => lease.session_state(binding.fence, self.now_ms),
                _ => None,
            }
        });
        found.unwrap_or_else(|| {
            let at_ms = state::bound()
                .ended_at(rm::selected_db(self.ctx), &binding.key, binding.fence)
                .unwrap_or(0);
            SessionState::Ended { at_ms }
        })
    }
}

impl Sessions for Lookup {
    fn state(&mut self, binding: &Binding) -> SessionState {
        if let Some(known) = self.seen.as_ref().and_then(|seen| seen.get(binding)) {
            return *known;
        }
        let found = self.look(binding);
        self.seen
            .get_or_insert_with(HashMap::new)
            .insert(binding.clone(), found);
        found
    }
}

/// Whether any hold is bound to a session on this node: until one is,
/// nothing here costs the commands more than this read.
static ANY_BOUND: AtomicBool = AtomicBool::new(false);

pub fn any_bound() -> bool {
    ANY_BOUND.load(Ordering::Relaxed)
}

fn note_count(index: &BoundIndex) {
    ANY_BOUND.store(index.holds() > 0, Ordering::Relaxed);
}

/// The bound holds of these bindings on `key` are gone.
pub fn unbind_each(db: i32, key: &[u8], bindings: &[Binding]) {
    unbind_bindings(db, key, bindings.iter());
}

/// Each binding's hold on `key` leaves the index, under one lock; no lock
/// for none.
fn unbind_bindings<'a>(db: i32, key: &[u8], bindings: impl Iterator<Item = &'a Binding>) {
    let mut bound = bindings.peekable();
    if bound.peek().is_none() {
        return;
    }
    let mut index = state::bound();
    bound.for_each(|binding| index.unbind(db, key, binding));
    note_count(&index);
}

/// `binding`'s session has one more hold bound, on `key`.
pub fn bind(db: i32, key: &[u8], binding: &Binding) {
    let mut index = state::bound();
    index.bind(db, key, binding);
    note_count(&index);
}

/// Forgets a database's bound holds (`FLUSHDB`), or all (`FLUSHALL`).
pub fn forget(db: Option<i32>) {
    let mut index = state::bound();
    index.forget(db);
    note_count(&index);
}

/// Every bound hold of a lease value arriving on `key` (a load, a key that
/// arrived, an eviction put back).
pub fn bind_all(db: i32, key: &[u8], lease: &Lease) {
    each_binding(lease, |index, binding| index.bind(db, key, binding));
}

/// Every bound hold of a lease value leaving `key` (unlink).
pub fn unbind_all(db: i32, key: &[u8], lease: &Lease) {
    each_binding(lease, |index, binding| index.unbind(db, key, binding));
}

/// `change` for each of a lease value's bindings, under one lock of the
/// index; nothing for a value without bound holds.
fn each_binding(lease: &Lease, mut change: impl FnMut(&mut BoundIndex, &Binding)) {
    let Some(holds) = lease.extended().filter(|_| lease.bound_holds() > 0) else {
        return;
    };
    let mut index = state::bound();
    for binding in holds.iter().filter_map(|(_, g)| g.session()) {
        change(&mut index, binding);
    }
    note_count(&index);
}

/// The session granted on `key` with `fence` ended at `at_ms` (released,
/// expired, deleted, overwritten, moved away). Its bound holds are free
/// from now on by `Lookup`; here the end is noted (and remembered, so the
/// grant cannot come back), every bound key is touched for `WATCH` as the
/// change it is, clients waiting on bound keys are offered them at once,
/// and on a primary the keys go to the reaper. Safe from any callback: it
/// notes, touches and queues; it writes nothing.
pub fn ended(ctx: Ctx, db: i32, key: &[u8], fence: u64, at_ms: u64) {
    if !any_bound() {
        return;
    }
    let queue = state::is_primary();
    let waiting = {
        let waiters = state::waiters();
        if waiters.is_empty() {
            Vec::new()
        } else {
            waiters.keys(db)
        }
    };
    let mut woken = Vec::new();
    let bound: Vec<Box<[u8]>> = {
        let mut index = state::bound();
        let Some(keys) = index.end(db, key, fence, at_ms, queue) else {
            return;
        };
        for (d, k) in waiting {
            if keys.contains_key(&k) {
                woken.push((d, k));
            }
        }
        match watched() {
            true => keys.keys().cloned().collect(),
            false => Vec::new(),
        }
    };
    touch_all(ctx, db, &bound);
    for (d, k) in woken {
        state::wake_later(ctx, d, &k);
    }
}

/// Whether a client has used `WATCH` or client tracking on this node since
/// the module loaded: until one has, nobody can see a key touched, and a
/// session's end skips touching its bound keys (about 0.4 µs a key: 40 ms
/// for a session with 100,000 bound holds).
static WATCHED: AtomicBool = AtomicBool::new(false);

pub fn watched() -> bool {
    WATCHED.load(Ordering::Relaxed)
}

/// A client sent `WATCH` or `CLIENT TRACKING` (the command filter sees it
/// before the server runs it): from now on, ends touch their keys.
pub fn note_watched() {
    WATCHED.store(true, Ordering::Relaxed);
}

/// Touches each of `keys` in `db` for `WATCH` and client tracking.
fn touch_all(ctx: Ctx, db: i32, keys: &[Box<[u8]>]) {
    if keys.is_empty() || !watched() {
        return;
    }
    rm::in_db(ctx, db, || {
        for k in keys {
            let name = OwnedString::new(ctx, k);
            rm::touch(ctx, name.as_ptr());
        }
    });
}

/// The keys bound to the live session grant on `key` with `fence`, touched
/// for `WATCH`: the grant's deadline has passed and nothing has ended it
/// yet (the reaper waits out a write pause), but an `EXEC` must see its
/// holds as changed, as it sees the session key itself.
pub fn touch_expiring(ctx: Ctx, db: i32, key: &[u8], fence: u64) {
    if !any_bound() || !watched() {
        return;
    }
    let keys: Vec<Box<[u8]>> = state::bound()
        .bound_keys(db, key, fence)
        .map(Box::from)
        .collect();
    touch_all(ctx, db, &keys);
}

/// A lease value arriving under `key` (`RENAME`, `MOVE`, `RESTORE`,
/// `MIGRATE`): if its fence is that of a session grant which ended here
/// with holds bound to it, or older, it is that ended session (or an older
/// value of the name) coming back, and it arrives free with its fence
/// (returns true).
pub fn arrives_ended(db: i32, key: &[u8], lease: &mut Lease) -> bool {
    if !state::bound().is_buried(db, key, lease.fence()) {
        return false;
    }
    // Not in the session index yet: a value is bound when it has arrived.
    lease.apply(None, lease.fence());
    true
}

/// `SWAPDB a b`: the bound holds of each database are the other's.
pub fn swap(a: i32, b: i32) {
    state::bound().swap(a, b);
}

/// A session's lease put back under its name (eviction restore): if it is
/// the grant that ended when it was removed, it did not end.
pub fn revived(db: i32, key: &[u8], lease: &Lease) {
    if let Some((fence, _)) = session_grant(lease).filter(|_| any_bound()) {
        state::bound().revive(db, key, fence);
    }
}

/// A lease value's session grant, if it can be one: its fence and
/// deadline.
pub fn session_grant(lease: &Lease) -> Option<(u64, u64)> {
    match lease.extended() {
        None => lease.deadline().map(|d| (lease.fence(), d)),
        Some(holds) => {
            let mut all = holds.iter();
            let (_, grant) = all.next()?;
            let single = all.next().is_none();
            let exclusive = holds.mode() == crate::model::holds::Mode::Exclusive;
            (single && exclusive && grant.session().is_none())
                .then_some((grant.fence, grant.deadline_ms))
        }
    }
}

/// Counts the bound holds a session's end freed.
pub fn count_session_expiries(n: usize) {
    state::add(&STATS.session_expiries, n as u64);
}

/// The session an ACQUIRE names: the fence of `session_token`'s live
/// exclusive grant on `session`, or the error to answer.
pub fn resolve(
    ctx: Ctx,
    key: RString,
    session: RString,
    session_token: &[u8],
    now_ms: u64,
) -> Result<u64, Message> {
    if rm::bytes(&key) == rm::bytes(&session) {
        return Err(Message::Fixed(error::SESSION_SELF));
    }
    let no_session = || Message::Formatted(error::no_live_session(rm::bytes(&session)));
    let mut open = Key::open_read(ctx, session).ok_or_else(no_session)?;
    let Slot::Ours(lease) = open.value::<Lease>() else {
        return Err(no_session());
    };
    lease
        .as_session(session_token, now_ms)
        .map_err(|why| match why {
            NotSession::NoLiveSession => no_session(),
            NotSession::Shared => Message::Fixed(error::SESSION_SHARED),
            NotSession::Bound => Message::Fixed(error::SESSION_BOUND),
        })
}
