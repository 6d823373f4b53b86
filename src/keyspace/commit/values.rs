//! The commit path's other half: what happens to values as wholes (they
//! load, arrive, come back, leave, are rewritten into the AOF) and to the
//! whole keyspace (flushes, `SWAPDB`, a rebuilt index). No operation's
//! `Change`, but the same consequences, carried out here, so that no file
//! outside `commit/` replicates, moves an index or the gauge, or notifies.
//! The module types' callbacks call this half; the first half calls them
//! (a deletion), so this half does not call the first.

use redis_module::raw;

use crate::keyspace::sessions;
use crate::keyspace::state;
use crate::keyspace::wire::{self, send, Sink};
use crate::model::effect;
use crate::model::lease::Lease;
use crate::model::notifications;
use crate::rm::{self, Ctx, RString};

/// A lease value decoded by a load, a full sync or a `RESTORE`: counted in
/// the gauge; its bound holds join the session index when it is a load of
/// `db` (a `RESTORE`'s value is bound when it arrives, `lease_arrived`).
pub fn lease_loaded(loading: Option<(i32, &[u8])>, lease: &Lease) {
    state::shared_holds_moved(0, lease.shared_holds());
    if let Some((db, key)) = loading {
        sessions::bind_all(db, key, lease);
    }
}

/// A lease value freed.
pub fn lease_freed(lease: &Lease) {
    state::shared_holds_moved(lease.shared_holds(), 0);
}

/// A lease value leaving `key` (any deletion, the module's or the
/// server's): its index entry and bound holds go, and if it is a session,
/// the session ends with it (at its deadline, if that passed first).
pub fn lease_unlinked(db: i32, key: &[u8], lease: &Lease) {
    if let (Some(at), true) = (lease.index_mark(), state::is_primary()) {
        state::index().remove(at, db, key);
    }
    if sessions::any_bound() {
        sessions::unbind_all(db, key, lease);
        if let Some((fence, deadline)) = sessions::session_grant(lease) {
            let at = deadline.min(rm::now_ms());
            sessions::ended(rm::module_ctx(), db, key, fence, at);
        }
    }
}

/// A lease value arrived under `key` (`RENAME`, `MOVE`, `COPY`, `RESTORE`,
/// `MIGRATE`): an ended session coming back arrives free; its bound holds
/// join the index; a primary indexes it, at its deadline, and at `now` too
/// when it is free or has bound holds (their session may have ended, or
/// not be here yet: the reaper settles it now, not at its holds' own
/// deadlines).
pub fn lease_arrived(db: i32, key: &[u8], lease: &mut Lease, now: u64) {
    let shared = lease.shared_holds();
    if sessions::arrives_ended(db, key, lease) {
        state::shared_holds_moved(shared, 0);
    }
    // A new name: whatever the lease's mark says is about the old one.
    lease.set_index_mark(None);
    sessions::bind_all(db, key, lease);
    if lease.deadline().is_some() {
        state::index_lease(db, key, lease);
    }
    let bound = lease.bound_holds() > 0;
    if (bound || lease.deadline().is_none()) && state::is_primary() {
        state::index().insert(now, db, key);
    }
}

/// An evicted lease put back under `name`: it is the value it was, so
/// gauge, session index and deadline index take it back (a session it
/// granted did not end), and replicas, which deleted it with the eviction,
/// get it whole.
pub fn lease_restored(ctx: Ctx, name: RString, lease: &mut Lease) {
    let (db, key) = (rm::selected_db(ctx), rm::bytes(&name));
    state::shared_holds_moved(0, lease.shared_holds());
    sessions::revived(db, key, lease);
    sessions::bind_all(db, key, lease);
    replicate_whole(ctx, name, lease);
    state::index_lease(db, key, lease);
}

/// A free lease stored for the waiters of a key that vanished under them:
/// replicated whole, and looked at by the reaper at once (deleted if the
/// queue is gone by then).
pub fn kept_for_waiters(ctx: Ctx, name: RString, lease: &Lease) {
    replicate_whole(ctx, name, lease);
    if state::is_primary() {
        state::index().insert(rm::now_ms(), rm::selected_db(ctx), rm::bytes(&name));
    }
}

/// How a resource record's new highest fence reaches replicas.
pub enum Record {
    /// As `LEASE.FENCE resource highest`.
    Highest(u64),
    /// As the client's command itself, which records exactly that.
    Verbatim,
}

/// A resource record took a new highest fence (`announce`: by a command,
/// announced as `lease.fence`), or came back from an eviction.
pub fn record_written(ctx: Ctx, resource: RString, how: Record, announce: bool) {
    match how {
        Record::Highest(highest) => wire::send_record(Sink::Replicate(ctx), resource, highest),
        Record::Verbatim => rm::replicate_verbatim(ctx),
    }
    if announce {
        rm::notify(ctx, notifications::FENCE, resource);
    }
}

/// A lease key or record lost a Redis TTL it must not have.
pub fn persisted(ctx: Ctx, name: RString) {
    rm::replicate_persist(ctx, name);
}

/// The deadline index starts over (a replica keeps none; a rebuild scan
/// refills it).
pub fn index_cleared() {
    state::index().clear();
}

/// A lease found by the rebuild scan, due at `due`.
pub fn scanned(db: i32, key: &[u8], due: u64) {
    state::index().insert(due, db, key);
}

/// `FLUSHDB` of `db`, or `FLUSHALL` (`db` < 0).
pub fn flushed(db: i32) {
    state::index().flush(db);
    sessions::forget((db >= 0).then_some(db));
}

/// `SWAPDB a b`.
pub fn swapped(a: i32, b: i32) {
    state::index().swap_db(a, b);
    sessions::swap(a, b);
}

/// A lease past its deadline that the reaper has not reached yet, touched
/// before an `EXEC` as its deletion will touch it; a session's bound keys
/// with it (`session`: its grant's fence).
pub fn expiring_touched(ctx: Ctx, name: RString, session: Option<u64>) {
    rm::touch(ctx, name);
    if let Some(fence) = session {
        sessions::touch_expiring(ctx, rm::selected_db(ctx), rm::bytes(&name), fence);
    }
}

/// Replicates `lease` whole (`effect::whole`).
fn replicate_whole(ctx: Ctx, name: RString, lease: &Lease) {
    effect::whole(lease, |e| send(Sink::Replicate(ctx), name, e));
}

/// A lease in an AOF rewrite: its whole state, as replication writes it
/// (`effect::whole`).
pub fn lease_rewritten(aof: *mut raw::RedisModuleIO, key: RString, lease: &Lease) {
    effect::whole(lease, |e| send(Sink::Rewrite(aof), key, e));
}

/// A resource record in an AOF rewrite: `LEASE.FENCE resource highest`.
pub fn record_rewritten(aof: *mut raw::RedisModuleIO, key: RString, highest: u64) {
    wire::send_record(Sink::Rewrite(aof), key, highest);
}
