//! The one commit path: carries out a `model::change::Change` on a lease
//! key. Nothing else under src/ replicates a lease change, moves the
//! deadline or bound-hold index for one, moves the counters or the shared
//! gauge, sends a lease's keyspace notification or wakes its waiters
//! (`scripts/layers` checks it). Always in this order: counters and gauge;
//! session index; deadline index; the key's fate; replication; the
//! notifications; the waiters.

use crate::keyspace::effects;
use crate::keyspace::sessions;
use crate::keyspace::state::{self, STATS};
use crate::keyspace::types;
use crate::keyspace::wire::{send, Sink, Wire};
use crate::model::change::{Change, Count, Fate, Index, Replicate, Signal};
use crate::model::effect::{self, Effect, Held};
use crate::model::lease::Lease;
use crate::model::notifications;
use crate::rm::{self, Ctx, Key, RString, Slot};

/// Carries out `change` on the lease key `name`, open in `key`; `token` is
/// the operation's (a grant's, a renewal's, a release's), which
/// `Replicate::Held` and `Replicate::DropToken` name.
pub fn commit(ctx: Ctx, name: RString, key: &mut Key, token: Option<Wire>, change: Change) {
    match change.count {
        Some(Count::WaiterGrants) => {
            state::bump(&STATS.grants);
            state::bump(&STATS.waiter_grants);
        }
        Some(count) => state::bump(counter(count)),
        None => {}
    }
    state::shared_holds_moved(change.shared.0, change.shared.1);
    let db = rm::selected_db(ctx);
    let key_bytes = rm::bytes(&name);
    if sessions::any_bound() || change.bound.is_some() {
        sessions::unbind_each(db, key_bytes, &change.unbound);
        if let Some((fence, at)) = change.session_ended {
            sessions::ended(ctx, db, key_bytes, fence, at);
        }
        if let Some(binding) = &change.bound {
            sessions::bind(db, key_bytes, binding);
        }
    }
    if change.delays > 0 {
        state::add(&STATS.delays, change.delays as u64);
    }
    sessions::count_session_expiries(change.session_expiries);
    match change.index {
        Index::Keep => {}
        Index::Ensure => {
            if let Some(lease) = lease_of(key) {
                state::index_lease(db, key_bytes, lease);
            }
        }
        Index::Remove(at) => {
            if state::is_primary() {
                state::index().remove(at, db, key_bytes);
            }
        }
    }
    if change.fate == Fate::Deleted {
        types::delete(key);
    }
    replicate(ctx, name, key, token, change.replicate);
    if change.expired > 0 {
        // Holds a grant took over before the reaper reached them: announced
        // and counted here, as the reaper would have.
        state::add(&STATS.expired, change.expired as u64);
        rm::notify(ctx, notifications::EXPIRE, name);
    }
    if let Some(event) = change.notify {
        rm::notify(ctx, event, name);
    }
    if change.signal == Signal::IfWaiting && effects::has_waiters(ctx, name) {
        effects::signal(ctx, name);
    }
}

fn replicate(ctx: Ctx, name: RString, key: &mut Key, token: Option<Wire>, how: Replicate) {
    let sink = Sink::Replicate(ctx);
    match (how, token) {
        (Replicate::Nothing, _) => {}
        (Replicate::Verbatim, _) => rm::replicate_verbatim(ctx),
        (Replicate::Held, Some(token)) => {
            if let Some(lease) = lease_of(key) {
                match effect::held(lease, token) {
                    Held::One(e) => send(sink, name, &e),
                    Held::Whole => effect::whole(lease, |e| send(sink, name, e)),
                    Held::Nothing => {}
                }
            }
        }
        (Replicate::Whole, _) => {
            if let Some(lease) = lease_of(key) {
                effect::whole(lease, |e| send(sink, name, e));
            }
        }
        (Replicate::DropToken, Some(token)) => send(sink, name, &Effect::Drop(vec![token])),
        (Replicate::Held | Replicate::DropToken, None) => {
            debug_assert!(
                false,
                "{how:?} names the operation's token, and there is none"
            );
        }
    }
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
