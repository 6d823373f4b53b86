//! `LEASE.RELEASE key token`.

use std::os::raw::c_int;

use crate::keyspace::commit::{commit, On};
use crate::keyspace::sessions::Lookup;
use crate::keyspace::wake;
use crate::keyspace::wire::Wire;
use crate::model::args::check_token;
use crate::model::change::{Change, Count};
use crate::model::error;
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
        let stays = lease.stays_after_release();
        let shared = (shared_before, lease.shared_holds());
        let change = Change::release_replayed(&gone, stays, shared);
        commit(ctx, *key_name, On::Key(&mut key), None, change);
        return rm::reply_integer(ctx, 1);
    }
    let now = rm::now_ms();
    let Some(lease) = lease else {
        commit(
            ctx,
            *key_name,
            On::Key(&mut key),
            None,
            Change::counted(Count::ReleasesRejected),
        );
        return rm::reply_integer(ctx, 0);
    };
    let mark = lease.index_mark();
    let shared_before = lease.shared_holds();
    let Some(released) = lease.release(token, now, &mut Lookup::new(ctx, now)) else {
        commit(
            ctx,
            *key_name,
            On::Key(&mut key),
            None,
            Change::counted(Count::ReleasesRejected),
        );
        return rm::reply_integer(ctx, 0);
    };
    let stays = lease.stays_after_release();
    let waiting = wake::has_waiters(ctx, *key_name);
    let shared = (shared_before, lease.shared_holds());
    let change = Change::released(
        &released,
        now,
        stays,
        waiting,
        lease.is_extended(),
        mark,
        shared,
    );
    commit(
        ctx,
        *key_name,
        On::Key(&mut key),
        Some(Wire::Bytes(token)),
        change,
    );
    rm::reply_integer(ctx, 1)
}
