//! Waking the clients blocked on a key: whether any wait, and the signal
//! that offers them the lease, now or shortly (`state::wake_later`, whose
//! timer is `background::waiters`').

use crate::keyspace::state;
use crate::rm::{self, api, Ctx, RString};

/// How soon a timer that found writes paused looks again: pauses end at a
/// time only the server knows, and expiry resumes within this of it.
pub const PAUSED_RETRY_MS: i64 = 10;

/// Whether clients wait for `key` in the current database.
pub fn has_waiters(ctx: Ctx, key: RString) -> bool {
    state::waiting_on(rm::selected_db(ctx), rm::bytes(&key))
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
