//! The commit path: carries out a `model::change::Change` on a lease key,
//! always in this order: counters and gauge; session index; deadline index;
//! the key's fate; replication; the notifications; the waiters.
//!
//! ACQUIRE, RENEW, RELEASE (a client's and a replayed one), LEASE.APPLY, the
//! blocked waiter's turn and the reaper (a due key, a session's end) go
//! through it; the reaper's deletions through `commit_reaped`, one `DEL` a
//! batch. What happens to values as wholes and to the whole keyspace is
//! the other half, `values.rs`. `scripts/layers` fails on any replication,
//! AOF rewrite record, index or gauge edit, notification or WATCH touch
//! outside this folder.

pub mod values;

use crate::keyspace::sessions;
use crate::keyspace::state::{self, STATS};
use crate::keyspace::types;
use crate::keyspace::wake;
use crate::keyspace::wire::{send, Sink, Wire};
use crate::model::change::{Change, Count, Fate, Index, Signal};
use crate::model::effect::{self, Emitted};
use crate::model::lease::Lease;
use crate::model::notifications;
use crate::rm::{self, Ctx, Key, OwnedString, RString, Slot};

/// What a change is carried out on: the stored lease, where the caller
/// holds it (no second lookup), or the open key (a change that deletes it,
/// or one that reads no lease).
pub enum On<'a> {
    Lease(&'a mut Lease),
    Key(&'a mut Key),
    /// A key not open: a change that reads and writes no value.
    Name,
}

/// Carries out `change` on the lease key `name`; `token` is the
/// operation's (a grant's, a renewal's, a release's), which
/// `Replicate::Held` and `Replicate::DropToken` name.
pub fn commit(ctx: Ctx, name: RString, on: On<'_>, token: Option<Wire>, change: Change) {
    if carry_out(ctx, name, on, token, change) {
        rm::replicate_del(ctx, &[name]);
    }
}

/// The reaper's deletions, replicated as one `DEL` per database per batch
/// rather than one per key: the replicas and the AOF see the same
/// deletions, at a fraction of the cost of propagating each.
#[derive(Default)]
pub struct Deletions {
    db: i32,
    names: Vec<OwnedString>,
}

impl Deletions {
    /// Replicates the batch's `DEL`.
    pub fn flush(&mut self, ctx: Ctx) {
        if self.names.is_empty() || !rm::select_db(ctx, self.db) {
            self.names.clear();
            return;
        }
        let keys: Vec<RString> = self.names.iter().map(OwnedString::as_ptr).collect();
        if state::is_cluster() {
            // Each key on its own: a slot being exported (Valkey's atomic
            // slot migration) takes only commands within one slot.
            keys.iter().for_each(|k| rm::replicate_del(ctx, &[*k]));
        } else {
            rm::replicate_del(ctx, &keys);
        }
        self.names.clear();
    }
}

/// `commit` for the reaper: a deletion joins `batch` (in the selected
/// database, `db`), replicated when the batch is flushed.
pub fn commit_reaped(
    ctx: Ctx,
    db: i32,
    name: OwnedString,
    on: On<'_>,
    change: Change,
    batch: &mut Deletions,
) {
    if carry_out(ctx, name.as_ptr(), on, None, change) {
        if batch.db != db {
            batch.flush(ctx);
            batch.db = db;
            rm::select_db(ctx, db);
        }
        batch.names.push(name);
    }
}

/// Carries out `change`; returns whether the key's `DEL` is still to be
/// replicated (`Replicate::Deleted`), which the caller does, at once or in
/// a batch.
fn carry_out(ctx: Ctx, name: RString, on: On<'_>, token: Option<Wire>, change: Change) -> bool {
    match change.count {
        Some(Count::WaiterGrants) => {
            state::bump(&STATS.grants);
            state::bump(&STATS.waiter_grants);
        }
        Some(count) => state::bump(counter(count)),
        None => {}
    }
    if change.shared.0 != change.shared.1 {
        state::shared_holds_moved(change.shared.0, change.shared.1);
    }
    // The key's database and name, read only if a step needs them.
    let at = || (rm::selected_db(ctx), rm::bytes(&name));
    let bound = change.ended.as_deref().and_then(|e| e.bound.as_ref());
    let unbound = change.ended.as_deref().map_or(&[][..], |e| &e.unbound[..]);
    let unbinds = !unbound.is_empty() || change.session_ended.is_some();
    if (unbinds && sessions::any_bound()) || bound.is_some() {
        let (db, key_bytes) = at();
        sessions::unbind_each(db, key_bytes, unbound);
        if let Some((fence, at)) = change.session_ended {
            sessions::ended(ctx, db, key_bytes, fence, at);
        }
        if let Some(binding) = bound {
            sessions::bind(db, key_bytes, binding);
        }
    }
    if let Some(ended) = change.ended.as_deref() {
        if ended.delays > 0 {
            state::add(&STATS.delays, ended.delays as u64);
        }
        if ended.session_expiries > 0 {
            sessions::count_session_expiries(ended.session_expiries);
        }
    }
    let primary = state::is_primary();
    let mut recheck = None;
    match change.index {
        Index::Remove(deadline)
        | Index::Reset {
            old: Some(deadline),
            ..
        } if primary => {
            let (db, key_bytes) = at();
            state::index().remove(deadline, db, key_bytes);
        }
        _ => {}
    }
    match change.index {
        Index::Recheck(when)
        | Index::Reset {
            recheck: Some(when),
            ..
        } if primary => {
            recheck = Some(when);
        }
        _ => {}
    }
    let reindex = matches!(change.index, Index::Ensure | Index::Reset { .. }) && primary;
    let (mut lease, key) = match on {
        On::Lease(lease) => (Some(lease), None),
        On::Key(key) => (None, Some(key)),
        On::Name => (None, None),
    };
    match (change.fate, key) {
        (Fate::Deleted, Some(key)) => types::delete(key),
        (Fate::Deleted, None) => debug_assert!(false, "a change that deletes the key is given it"),
        (Fate::Stays, Some(key)) if reindex || change.replicate.reads_lease() => {
            lease = lease_of(key);
        }
        (Fate::Stays, _) => {}
    }
    if reindex {
        if let Some(lease) = lease.as_deref_mut() {
            if matches!(change.index, Index::Reset { .. }) {
                lease.set_index_mark(None);
                lease.refresh_earliest();
            }
            let (db, key_bytes) = at();
            state::index_lease(db, key_bytes, lease);
        }
    }
    if let Some(when) = recheck {
        let (db, key_bytes) = at();
        state::index().insert(when, db, key_bytes);
    }
    let deleted = replicate(ctx, name, lease.as_deref(), token, &change);
    let expired = change.ended.as_deref().map_or(0, |e| e.expired);
    if expired > 0 {
        // Holds a grant took over before the reaper reached them: announced
        // and counted here, as the reaper would have.
        state::add(&STATS.expired, expired as u64);
        rm::notify(ctx, notifications::EXPIRE, name);
    }
    if let Some(event) = change.notify {
        rm::notify(ctx, event, name);
    }
    if change.signal == Signal::IfWaiting && wake::has_waiters(ctx, name) {
        wake::signal(ctx, name);
    }
    deleted
}

/// Writes what `change` replicates (`effect::replicated`, the one
/// mapping), but for a deletion: returns whether it is owed.
#[inline(always)]
fn replicate(
    ctx: Ctx,
    name: RString,
    lease: Option<&Lease>,
    token: Option<Wire>,
    change: &Change,
) -> bool {
    let sink = Sink::Replicate(ctx);
    let mut deleted = false;
    effect::replicated(change, lease, token, |emitted| match emitted {
        Emitted::Token(e) => send(sink, name, &e),
        Emitted::Stored(e) => send(sink, name, e),
        Emitted::Verbatim => rm::replicate_verbatim(ctx),
        Emitted::Deleted => deleted = true,
    });
    deleted
}

fn lease_of(key: &mut Key) -> Option<&mut Lease> {
    match key.value::<Lease>() {
        Slot::Ours(lease) => Some(lease),
        _ => None,
    }
}

fn counter(count: Count) -> &'static std::sync::atomic::AtomicU64 {
    match count {
        Count::Grants | Count::WaiterGrants => &STATS.grants,
        Count::Retries => &STATS.retries,
        Count::Contended => &STATS.contended,
        Count::Renewals => &STATS.renewals,
        Count::RenewalsRejected => &STATS.renewals_rejected,
        Count::Releases => &STATS.releases,
        Count::ReleasesRejected => &STATS.releases_rejected,
        Count::Expired => &STATS.expired,
    }
}
