//! `LEASE.RENEW key token ttl`.

use std::os::raw::c_int;

use crate::keyspace::commit::{commit, On};
use crate::keyspace::sessions::Lookup;
use crate::keyspace::wire::Wire;
use crate::model::args::{check_token, parse_ttl_or_zero};
use crate::model::change::{Change, Count};
use crate::model::error;
use crate::model::lease::Renew;
use crate::rm::{self, Ctx, Key, RString};

use super::{command, lease_in, second_argument, writable};

/// `LEASE.RENEW key token ttl`
pub extern "C" fn renew_command(ctx: Ctx, argv: *mut RString, argc: c_int) -> c_int {
    command("LEASE.RENEW", ctx, argv, argc, renew, second_argument)
}

fn renew(ctx: Ctx, args: &[RString]) -> c_int {
    if !writable(ctx) {
        return rm::reply_error(ctx, error::READONLY);
    }
    let [_, key_name, token_arg, ttl] = args else {
        return rm::reply_error(
            ctx,
            c"ERR wrong number of arguments for 'lease.renew' command",
        );
    };
    // A ttl of 0 is for a bound hold: checked once the hold is found.
    let parsed =
        check_token(rm::bytes(token_arg)).and_then(|t| Ok((t, parse_ttl_or_zero(rm::bytes(ttl))?)));
    let (token, ttl_ms) = match parsed {
        Ok(p) => p,
        Err(e) => return rm::reply_error(ctx, e),
    };
    let Some(mut key) = Key::open_write(ctx, *key_name) else {
        return rm::reply_error(ctx, error::INTERNAL);
    };
    let lease = match lease_in(&mut key) {
        Ok(lease) => lease,
        Err(e) => return rm::reply_error(ctx, e),
    };
    // No key, an expired lease or another holder's: refused alike.
    let Some(lease) = lease else {
        commit(
            ctx,
            *key_name,
            On::Key(&mut key),
            None,
            Change::counted(Count::RenewalsRejected),
        );
        return rm::reply_integer(ctx, 0);
    };
    let mark = lease.index_mark();
    let now = rm::now_ms();
    match lease.renew(token, ttl_ms, now, &mut Lookup::new(ctx, now)) {
        Renew::Renewed => {}
        Renew::NotHeld => {
            commit(
                ctx,
                *key_name,
                On::Key(&mut key),
                None,
                Change::counted(Count::RenewalsRejected),
            );
            return rm::reply_integer(ctx, 0);
        }
        Renew::ZeroTtlUnbound => return rm::reply_error(ctx, error::TTL),
    }
    // A renewal to a shorter ttl moves the deadline before the lease's
    // index entry, which would reach its expiry (and its waiters) late.
    let reindex = mark.is_some_and(|at| lease.deadline().is_some_and(|d| d < at));
    let token = Wire::Arg(*token_arg);
    commit(
        ctx,
        *key_name,
        On::Lease(lease),
        Some(token),
        Change::renewed(reindex),
    );
    rm::reply_integer(ctx, 1)
}
