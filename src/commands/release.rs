//! `LEASE.RELEASE key token`.

use std::os::raw::c_int;

use crate::keyspace::effects;
use crate::keyspace::effects::replicate_lease;
use crate::keyspace::sessions::{self, Lookup};
use crate::keyspace::state::{self, STATS};
use crate::keyspace::types;
use crate::model::args::check_token;
use crate::model::error;
use crate::model::notifications;
use crate::rm::{self, Ctx, Key, RString};

use super::{command, from_master_or_aof, lease_in, second_argument, writable};

/// `LEASE.RELEASE key token`
pub extern "C" fn release_command(ctx: Ctx, argv: *mut RString, argc: c_int) -> c_int {
    command("LEASE.RELEASE", ctx, argv, argc, release, second_argument)
}

fn release(ctx: Ctx, args: &[RString]) -> c_int {
    if !writable(ctx) {
        return rm::reply_error(ctx, error::READONLY);
    }
    let [_, key_name, token] = args else {
        return rm::reply_error(
            ctx,
            c"ERR wrong number of arguments for 'lease.release' command",
        );
    };
    let token = match check_token(rm::bytes(token)) {
        Ok(t) => t,
        Err(e) => return rm::reply_error(ctx, e),
    };
    let Some(mut key) = Key::open_write(ctx, *key_name) else {
        return rm::reply_error(ctx, error::INTERNAL);
    };
    let lease = match lease_in(&mut key) {
        Ok(lease) => lease,
        Err(e) => return rm::reply_error(ctx, e),
    };
    if from_master_or_aof(ctx) {
        // The effect of a release where it was decided: the token's hold is
        // gone, and the key with it unless other holds stay; applied as that,
        // whatever this node's clock says of the deadline.
        let Some(lease) = lease else {
            return rm::reply_integer(ctx, 0);
        };
        let shared_before = lease.shared_holds();
        let gone = lease.apply_drop([token]);
        state::shared_holds_moved(shared_before, lease.shared_holds());
        sessions::unbind(rm::selected_db(ctx), rm::bytes(key_name), &gone);
        if lease.extended().is_some_and(|h| !h.is_empty()) {
            rm::replicate_verbatim(ctx);
            rm::notify(ctx, notifications::RELEASE, *key_name);
            return rm::reply_integer(ctx, 1);
        }
        types::delete(&mut key);
        drop(key);
        // Into this node's own AOF: a module command is written there only
        // when it replicates itself.
        rm::replicate_verbatim(ctx);
        rm::notify(ctx, notifications::RELEASE, *key_name);
        return rm::reply_integer(ctx, 1);
    }
    let now = rm::now_ms();
    let Some(lease) = lease else {
        state::bump(&STATS.releases_rejected);
        return rm::reply_integer(ctx, 0);
    };
    let mark = lease.index_mark();
    let shared_before = lease.shared_holds();
    let Some(released) = lease.release(token, now, &mut Lookup::new(ctx, now)) else {
        state::bump(&STATS.releases_rejected);
        return rm::reply_integer(ctx, 0);
    };
    state::bump(&STATS.releases);
    state::shared_holds_moved(shared_before, lease.shared_holds());
    if sessions::any_bound() {
        let db = rm::selected_db(ctx);
        if let Some(binding) = released.session() {
            sessions::unbind_one(db, rm::bytes(key_name), binding);
        }
        // A session released: its bound holds are free from now on.
        sessions::ended(ctx, db, rm::bytes(key_name), released.fence, now);
    }
    if lease.extended().is_some_and(|h| !h.is_empty()) {
        // Other holds stay, and their index entry with them. Replicas and
        // the AOF apply the call itself as this token's hold gone (cheaper
        // than building a `LEASE.APPLY ... DROP`).
        rm::replicate_verbatim(ctx);
        if effects::has_waiters(ctx, *key_name) {
            effects::signal(ctx, *key_name);
        }
        rm::notify(ctx, notifications::RELEASE, *key_name);
        return rm::reply_integer(ctx, 1);
    }
    if let (Some(at), true) = (mark, state::is_primary()) {
        state::index().remove(at, rm::selected_db(ctx), rm::bytes(key_name));
    }
    if !effects::has_waiters(ctx, *key_name) {
        types::delete(&mut key);
        // Replicas and the AOF replay the call itself as this deletion,
        // which costs less than building a `DEL` to send instead.
        rm::replicate_verbatim(ctx);
    } else {
        // The key stays, free, for the first waiter, who is served before
        // any other client's command runs.
        if lease.is_extended() {
            // Its terms (the limit) stay with it while clients wait.
            effects::replicate_drop(ctx, *key_name, std::iter::once(token));
        } else {
            replicate_lease(ctx, *key_name, lease);
        }
        effects::signal(ctx, *key_name);
    }
    rm::notify(ctx, notifications::RELEASE, *key_name);
    rm::reply_integer(ctx, 1)
}
