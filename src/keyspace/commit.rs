//! The commit path: carries out a `model::change::Change` on a lease key,
//! always in this order: counters and gauge; session index; deadline index;
//! the key's fate; replication; the notifications; the waiters.
//!
//! ACQUIRE, RENEW, RELEASE (a client's and a replayed one), LEASE.APPLY and
//! the blocked waiter's turn go through it. The reaper, eviction restore,
//! server events and resource records still carry out their effects
//! themselves (`effects.rs`); until they move here, `scripts/layers` cannot
//! hold every such call to this file.

use crate::keyspace::effects;
use crate::keyspace::sessions;
use crate::keyspace::state::{self, STATS};
use crate::keyspace::types;
use crate::keyspace::wire::{send, Sink, Wire};
use crate::model::change::{Change, Count, Fate, Index, Replicate, Signal};
use crate::model::effect::{self, Emitted};
use crate::model::lease::Lease;
use crate::model::notifications;
use crate::rm::{self, Ctx, Key, RString, Slot};

/// What a change is carried out on: the stored lease, where the caller
/// holds it (no second lookup), or the open key (a change that deletes it,
/// or one that reads no lease).
pub enum On<'a> {
    Lease(&'a mut Lease),
    Key(&'a mut Key),
}

/// Carries out `change` on the lease key `name`; `token` is the
/// operation's (a grant's, a renewal's, a release's), which
/// `Replicate::Held` and `Replicate::DropToken` name.
pub fn commit(ctx: Ctx, name: RString, on: On<'_>, token: Option<Wire>, change: Change) {
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
    match change.index {
        Index::Remove(deadline) if state::is_primary() => {
            let (db, key_bytes) = at();
            state::index().remove(deadline, db, key_bytes);
        }
        Index::Recheck(when) if state::is_primary() => {
            let (db, key_bytes) = at();
            state::index().insert(when, db, key_bytes);
        }
        _ => {}
    }
    let ensure = change.index == Index::Ensure && state::is_primary();
    let (mut lease, key) = match on {
        On::Lease(lease) => (Some(lease), None),
        On::Key(key) => (None, Some(key)),
    };
    match (change.fate, key) {
        (Fate::Deleted, Some(key)) => types::delete(key),
        (Fate::Deleted, None) => debug_assert!(false, "a change that deletes the key is given it"),
        (Fate::Stays, Some(key)) if ensure || change.replicate.reads_lease() => {
            lease = lease_of(key);
        }
        (Fate::Stays, _) => {}
    }
    if ensure {
        if let Some(lease) = lease.as_deref_mut() {
            let (db, key_bytes) = at();
            state::index_lease(db, key_bytes, lease);
        }
    }
    replicate(ctx, name, lease.as_deref(), token, &change.replicate);
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
    if change.signal == Signal::IfWaiting && effects::has_waiters(ctx, name) {
        effects::signal(ctx, name);
    }
}

/// Writes what `how` replicates (`effect::replicated`, the one mapping).
#[inline(always)]
fn replicate(ctx: Ctx, name: RString, lease: Option<&Lease>, token: Option<Wire>, how: &Replicate) {
    let sink = Sink::Replicate(ctx);
    effect::replicated(how, lease, token, |emitted| match emitted {
        Emitted::Token(e) => send(sink, name, &e),
        Emitted::Stored(e) => send(sink, name, e),
        Emitted::Verbatim => rm::replicate_verbatim(ctx),
    });
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
    }
}
