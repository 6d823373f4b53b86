//! The effects of a state change, in one place: index the deadline,
//! replicate absolute values, notify, wake waiters. Commands and background
//! work (waiters, the reaper, eviction restore, server events) call these
//! rather than each other.
//!
//! Every effect is replicated with absolute values (`LEASE.APPLY key ...`,
//! the forms of `model::effect`, written by `send`; `DEL key`; `LEASE.FENCE
//! resource fence`), so replicas and AOF replay never consult their own
//! clock or random source.

use std::os::raw::c_void;

use crate::keyspace::state;
use crate::keyspace::types;
use crate::keyspace::wire::{send, Sink};
use crate::model::effect::{self, Effect};
use crate::model::lease::Lease;
use crate::rm::{self, api, Ctx, Key, OwnedString, RString};

/// How soon a timer that found writes paused looks again: pauses end at a
/// time only the server knows, and expiry resumes within this of it.
pub const PAUSED_RETRY_MS: i64 = 10;

/// Propagates a lease's whole state (`effect::whole`).
pub fn replicate_lease(ctx: Ctx, key: RString, lease: &Lease) {
    effect::whole(lease, |e| send(Sink::Replicate(ctx), key, e));
}

/// `LEASE.APPLY key DELAY until`: no grant on the key before `until`.
pub fn replicate_delay(ctx: Ctx, key: RString, until_ms: u64) {
    send::<&[u8]>(Sink::Replicate(ctx), key, &Effect::Delay(until_ms));
}

/// `LEASE.APPLY key DROP token [token ...]`: these holds of an extended
/// lease are gone (released or expired); the key stays.
pub fn replicate_drop<'a>(ctx: Ctx, key: RString, tokens: impl Iterator<Item = &'a [u8]>) {
    let tokens: Vec<&[u8]> = tokens.collect();
    if !tokens.is_empty() {
        send(Sink::Replicate(ctx), key, &Effect::Drop(tokens));
    }
}

/// Propagates a resource record's highest fence as `LEASE.FENCE`.
pub fn replicate_record(ctx: Ctx, resource: RString, highest: u64) {
    // SAFETY: `ctx` and `resource` are valid by the handle rule; the format
    // `sl` takes the module string and the i64 passed.
    unsafe {
        api!(RedisModule_Replicate)(
            ctx,
            c"LEASE.FENCE".as_ptr(),
            c"sl".as_ptr(),
            resource,
            highest as i64,
        )
    };
}

/// Whether clients wait for `key` in the current database.
pub fn has_waiters(ctx: Ctx, key: RString) -> bool {
    let waiters = state::waiters();
    !waiters.is_empty() && waiters.len(rm::selected_db(ctx), rm::bytes(&key)) > 0
}

pub fn waiters_on(ctx: Ctx, key: RString) -> usize {
    state::waiters().len(rm::selected_db(ctx), rm::bytes(&key))
}

/// Tells the waiters on `key` that the lease may be free.
pub fn signal(ctx: Ctx, key: RString) {
    // SAFETY: `ctx` and `key` are valid by the handle rule; Redis retains
    // the key name it queues.
    unsafe { api!(RedisModule_SignalKeyAsReady)(ctx, key) };
}

/// Asks for `key`'s waiters to be offered the lease again shortly (see
/// `state::wake_later`).
pub fn resignal_later(ctx: Ctx, db: i32, key: &[u8]) {
    state::wake_later(ctx, db, key);
}

/// Makes `resignal_tick` the timer `state::wake_later` arms; at load.
pub fn install_waker() {
    state::set_waker(resignal_tick);
}

/// # Safety
/// `ctx` is a timer callback's context, valid for the call.
unsafe extern "C" fn resignal_tick(ctx: Ctx, _data: *mut c_void) {
    if rm::writes_paused() {
        // Serving a waiter writes: try again once the pause ends.
        // SAFETY: `ctx` is this timer's context; the new timer carries no
        // data, and its callback is this function, of a module that is
        // never unloaded.
        unsafe {
            api!(RedisModule_CreateTimer)(
                ctx,
                PAUSED_RETRY_MS,
                Some(resignal_tick),
                std::ptr::null_mut(),
            )
        };
        return;
    }
    rm::guard("waiter resignal", || (), || resignal(ctx));
}

fn resignal(ctx: Ctx) {
    let pending = state::take_wakes();
    for (db, key) in pending {
        if state::waiters().len(db, &key) == 0 || !rm::select_db(ctx, db) {
            continue;
        }
        let name = OwnedString::new(ctx, &key);
        if let Some(mut open) = Key::open_write(ctx, name.as_ptr()) {
            if open.is_empty() && !serves_slot_of(ctx, name.as_ptr()) {
                // Migrated away: the server redirects its waiters.
                continue;
            }
            if open.is_empty() {
                // The key vanished under its waiters. Blocked clients are
                // served only on keys that exist (Redis 7.0), so put a free
                // lease record there for the head of the queue to take; the
                // reaper deletes it if the queue empties first.
                let lease = types::store_lease(&mut open, Lease::default());
                replicate_lease(ctx, name.as_ptr(), lease);
                state::index().insert(rm::now_ms(), db, &key);
            }
        }
        signal(ctx, name.as_ptr());
    }
}

/// Whether this node serves `key`'s slot and is not migrating it away:
/// always outside cluster mode. Read from `CLUSTER KEYSLOT` and this node's
/// line of `CLUSTER NODES`, so only for rare paths (a waiter whose key
/// vanished).
pub fn serves_slot_of(ctx: Ctx, key: RString) -> bool {
    if !state::is_cluster() {
        return true;
    }
    // SAFETY: `ctx` and `key` are valid by the handle rule; the format `cs`
    // takes the NUL-terminated string and the module string passed.
    let slot = unsafe {
        api!(RedisModule_Call)(
            ctx,
            c"CLUSTER".as_ptr(),
            c"cs".as_ptr(),
            c"KEYSLOT".as_ptr(),
            key,
        )
    };
    if slot.is_null() {
        return false;
    }
    // SAFETY: `slot` is a live reply (not null, not yet freed); one that is
    // no integer answers 0.
    let slot_number = unsafe { api!(RedisModule_CallReplyInteger)(slot) };
    // SAFETY: `slot` came from RedisModule_Call and is freed once, here.
    unsafe { api!(RedisModule_FreeCallReply)(slot) };
    // SAFETY: `ctx` is valid by the handle rule; the format `c` takes the
    // one NUL-terminated string passed.
    let nodes = unsafe {
        api!(RedisModule_Call)(ctx, c"CLUSTER".as_ptr(), c"c".as_ptr(), c"NODES".as_ptr())
    };
    if nodes.is_null() {
        return false;
    }
    let mut len = 0usize;
    // SAFETY: `nodes` is live until freed below; a reply that is no string
    // answers null.
    let ptr = unsafe { api!(RedisModule_CallReplyStringPtr)(nodes, &mut len) };
    let serves = !ptr.is_null() && {
        // SAFETY: Redis gave `len` bytes at `ptr`, inside `nodes`, which is
        // freed only after this block.
        let text = unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) };
        let text = String::from_utf8_lossy(text);
        text.lines()
            .find(|l| l.split(' ').nth(2).is_some_and(|f| f.contains("myself")))
            .is_some_and(|myself| slot_served(myself, slot_number))
    };
    // SAFETY: `nodes` came from RedisModule_Call and is freed once, here;
    // `serves` borrows nothing from it.
    unsafe { api!(RedisModule_FreeCallReply)(nodes) };
    serves
}

/// Whether a `CLUSTER NODES` line lists `slot` among its own and not as
/// migrating (`[slot->-id]`).
fn slot_served(line: &str, slot: i64) -> bool {
    let mut owned = false;
    for field in line.split(' ').skip(8) {
        if let Some(inner) = field.strip_prefix('[') {
            let migrating = inner
                .split_once("->-")
                .and_then(|(s, _)| s.parse::<i64>().ok());
            if migrating == Some(slot) {
                return false;
            }
            continue;
        }
        let (lo, hi) = field.split_once('-').unwrap_or((field, field));
        if let (Ok(lo), Ok(hi)) = (lo.parse::<i64>(), hi.parse::<i64>()) {
            owned |= lo <= slot && slot <= hi;
        }
    }
    owned
}

#[cfg(test)]
mod tests {
    use super::slot_served;

    #[test]
    fn cluster_nodes_slots_are_read_with_migrations() {
        let line = "id 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460 7000 [5461->-other] [9000-<-other]";
        // (slot, served)
        let cases = [
            (0, true),
            (5460, true),
            (5461, false),
            (7000, true),
            (7001, false),
            (9000, false),
            (16383, false),
        ];
        for (slot, served) in cases {
            assert_eq!(slot_served(line, slot), served, "slot {slot}");
        }
        let migrating_owned = "id a myself,master - 0 0 1 connected 0-100 [50->-other]";
        assert!(!slot_served(migrating_owned, 50));
        assert!(slot_served(migrating_owned, 51));
    }
}
