//! Sessions and lock-delay (contract version 2) on each real server:
//! `LEASE.ACQUIRE ... SESSION session-key session-token`, `ttl 0`, `LEASE.RENEW` of a
//! session and of a bound hold, every way a session ends (release, expiry, `DEL`,
//! overwrite, `RENAME`, `FLUSHALL`) freeing its bound holds at once, the reaper
//! deleting them and counting, the `lease.session-end` notification, waiters on bound
//! keys, `DELAY ms` after an expiry, and every error of both options with nothing
//! changed. Replication, persistence, DUMP/RESTORE, cluster and pauses:
//! tests/sessions_persistence.rs.
//!
//! "At once" is checked by the first command after the session's end, with the reaper
//! slowed to 1 Hz where it could otherwise hide the difference.

#[macro_use]
extern crate harness;

use std::time::{Duration, Instant};

use harness::calls::{
    acquire, acquire_cmd, call, config_set, digest, exists, int, release, renew, strings, take,
    text, NONE,
};
use harness::errors::TTL_ERR;
use harness::holds::{fence_ms, holders, Holder};
use harness::lease::{lease_info, lease_stat, wait_for_waiters, Info};
use harness::reply::{assert_ok, expect_error, granted};
use harness::session::{
    acquire_reply, assert_bound, assert_unheld, bind, bind_many, bind_shared, bound_count,
    no_session, session_stats, take_with, unheld, DELAY_ERR, DELAY_SHARED_ERR, NESTED_SESSION_ERR,
    OTHER_SESSION_ERR, SELF_BIND_ERR, SHARED_SESSION_ERR,
};
use harness::waiter::Waiter;
use harness::{now_ms, wait_until, Server, ServerOptions};
use redis::{Connection, Value};

const MINUTE: u64 = 60_000;
/// Long enough for anything a test waits on, short enough to fail fast.
const WAIT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------
// Servers and snapshots

/// A server whose reaper wakes once a second: a key freed by a session's end stays in
/// the keyspace long enough for the next command to see it free, not merely gone.
fn slow_reaper(flavor: harness::Flavor) -> Server {
    Server::start_with(flavor, ServerOptions::new().config("lease.reap-hz", "1"))
}

fn dbsize(con: &mut Connection) -> i64 {
    int(call(con, "DBSIZE", NONE))
}

/// What a refused command must leave as it was: the keys, the dataset's digest, what
/// LEASE.INFO and LEASE.HOLDERS say of some keys (ttls left out: they count down), and
/// the grant and waiter counts.
#[derive(Debug, PartialEq, Eq)]
struct Snapshot {
    dbsize: i64,
    digest: String,
    leases: Vec<(String, Option<Info>, Vec<Holder>)>,
    grants: u64,
    waiters: u64,
}

fn snapshot(server: &Server, con: &mut Connection, keys: &[&str]) -> Snapshot {
    let leases = keys
        .iter()
        .map(|key| {
            let info = lease_info(con, key).map(|mut i| {
                i.ttl = 0;
                i
            });
            let list = holders(con, key)
                .into_iter()
                .map(|mut h| {
                    h.ttl = 0;
                    h
                })
                .collect();
            (key.to_string(), info, list)
        })
        .collect();
    Snapshot {
        dbsize: dbsize(con),
        digest: digest(server),
        leases,
        grants: lease_stat(server, "grants"),
        waiters: lease_stat(server, "waiters"),
    }
}

/// Waits until `LEASE.INFO key` no longer shows a live hold (free, delayed or reaped).
fn wait_unheld(con: &mut Connection, key: &str) {
    wait_until(&format!("the hold on {key} to end"), WAIT, || {
        unheld(&lease_info(con, key))
    });
}

/// `LEASE.INFO key`, which must exist.
fn info(con: &mut Connection, key: &str) -> Info {
    lease_info(con, key).unwrap_or_else(|| panic!("LEASE.INFO {key} is nil"))
}

// ---------------------------------------------------------------------------------------
// Binding

for_each_server!(an_exclusive_hold_binds_to_a_session, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    let before = session_stats(&server);
    let session_fence = take(&mut con, "s", MINUTE, "st");
    let fence = bind(&mut con, "k", MINUTE, "a", "s", "st");
    assert!(fence > session_fence);

    let k = assert_bound(&mut con, "k", fence, "s", "after the bind");
    assert!(k.ttl <= MINUTE as i64, "{k:?}");
    assert_eq!((k.bound, k.owner.as_deref()), (0, None), "{k:?}");
    let s = info(&mut con, "s");
    assert_eq!(s.bound, 1, "LEASE.INFO s: {s:?}");
    assert_eq!(s.session, None, "the session itself is not bound: {s:?}");
    assert_eq!((s.fence, s.state.as_str()), (session_fence, "held"));

    let list = holders(&mut con, "k");
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(list[0].fence, fence);
    assert_eq!(list[0].mode, "exclusive");
    assert_eq!(list[0].session.as_deref(), Some("s"));
    assert!(list[0].ttl > 0 && list[0].ttl <= MINUTE as i64, "{list:?}");
    let session_list = holders(&mut con, "s");
    assert_eq!(session_list.len(), 1);
    assert_eq!(session_list[0].session, None);

    // The same in RESP3.
    let mut con3 = server.client_resp3();
    let k3 = info(&mut con3, "k");
    assert_eq!(k3.session.as_deref(), Some("s"));
    let list3 = holders(&mut con3, "k");
    assert_eq!(list3[0].session.as_deref(), Some("s"));

    // The idempotent retry repeats the grant, bound as before.
    assert_eq!(bind(&mut con, "k", MINUTE, "a", "s", "st"), fence);
    assert_eq!(bound_count(&mut con, "s"), 1);
    // Others are refused as by any exclusive hold.
    assert_eq!(acquire(&mut con, "k", MINUTE, "b"), None);
    assert_eq!(
        acquire_reply(&mut con, "k", MINUTE, "b", &["SHARED"]),
        Value::Nil
    );

    let after = session_stats(&server);
    assert_eq!(after.bound_holds, before.bound_holds + 1, "{after:?}");
    assert_eq!(after.sessions, before.sessions + 1, "{after:?}");

    // The bound hold releases as any other, and leaves the session alone.
    assert_eq!(release(&mut con, "k", "a"), 1);
    assert_unheld(&mut con, "k", "after its release");
    assert_eq!(bound_count(&mut con, "s"), 0);
    assert_eq!(info(&mut con, "s").state, "held");
    assert_eq!(renew(&mut con, "s", "st", MINUTE), 1);
});

for_each_server!(shared_holds_bind_to_a_session, |flavor| {
    let server = slow_reaper(flavor);
    let mut con = server.client();
    take(&mut con, "s", MINUTE, "st");
    let r1 = bind_shared(&mut con, "rw", MINUTE, "r1", "s", "st");
    let r2 = bind_shared(&mut con, "rw", 0, "r2", "s", "st");
    let r3 = take_with(&mut con, "rw", MINUTE, "r3", &["SHARED"]);

    let rw = info(&mut con, "rw");
    assert_eq!(rw.mode.as_deref(), Some("shared"), "{rw:?}");
    assert_eq!(rw.holders, 3, "{rw:?}");
    assert_eq!(rw.session, None, "`session` names an exclusive hold's only");
    assert_eq!(bound_count(&mut con, "s"), 2);
    let list = holders(&mut con, "rw");
    let seen: Vec<(u64, Option<&str>, &str)> = list
        .iter()
        .map(|h| (h.fence, h.session.as_deref(), h.mode.as_str()))
        .collect();
    assert_eq!(
        seen,
        [
            (r1, Some("s"), "shared"),
            (r2, Some("s"), "shared"),
            (r3, None, "shared")
        ]
    );
    assert_eq!(lease_stat(&server, "bound_holds"), 2);
    assert_eq!(lease_stat(&server, "sessions"), 1);

    // The session's end frees its two holds and leaves the unbound one.
    assert_eq!(release(&mut con, "s", "st"), 1);
    let rw = info(&mut con, "rw");
    assert_eq!((rw.state.as_str(), rw.holders), ("held", 1), "{rw:?}");
    let list = holders(&mut con, "rw");
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!((list[0].fence, list[0].session.as_deref()), (r3, None));
    assert_eq!(renew(&mut con, "rw", "r1", MINUTE), 0);
    assert_eq!(release(&mut con, "rw", "r2"), 0);
    assert_eq!(renew(&mut con, "rw", "r3", MINUTE), 1);
});

for_each_server!(session_errors_change_nothing, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    take(&mut con, "s", MINUTE, "st");
    take(&mut con, "s2", MINUTE, "st2");
    take_with(&mut con, "sh", MINUTE, "st", &["SHARED"]);
    bind(&mut con, "b", MINUTE, "bt", "s", "st");
    bind(&mut con, "k", MINUTE, "a", "s", "st");
    take(&mut con, "busy", MINUTE, "x");
    assert_ok(call(&mut con, "SET", ("str", "v")), "SET str");
    let keys = ["s", "s2", "sh", "b", "k", "busy", "new"];

    let cases: &[(&str, u64, &str, &[&str], &str)] = &[
        (
            "new",
            1000,
            "a",
            &["SESSION", "nosuch", "st"],
            &no_session("nosuch"),
        ),
        (
            "new",
            1000,
            "a",
            &["SESSION", "s", "wrong"],
            &no_session("s"),
        ),
        (
            "new",
            1000,
            "a",
            &["SHARED", "SESSION", "s", "wrong"],
            &no_session("s"),
        ),
        ("new", 0, "a", &["SESSION", "s", "wrong"], &no_session("s")),
        (
            "busy",
            1000,
            "a",
            &["SESSION", "s", "wrong"],
            &no_session("s"),
        ),
        (
            "new",
            1000,
            "a",
            &["SESSION", "sh", "st"],
            SHARED_SESSION_ERR,
        ),
        (
            "new",
            1000,
            "a",
            &["SESSION", "b", "bt"],
            NESTED_SESSION_ERR,
        ),
        ("new", 0, "a", &["SESSION", "b", "bt"], NESTED_SESSION_ERR),
        ("s", 1000, "st", &["SESSION", "s", "st"], SELF_BIND_ERR),
        (
            "k",
            MINUTE,
            "a",
            &["SESSION", "s2", "st2"],
            OTHER_SESSION_ERR,
        ),
        ("new", 0, "a", &[], TTL_ERR),
    ];
    for (key, ttl, token, words, expected) in cases {
        let what = format!(
            "LEASE.ACQUIRE {key} {ttl} TOKEN {token} {}",
            words.join(" ")
        );
        let before = snapshot(&server, &mut con, &keys);
        let reply = acquire_reply(&mut con, key, *ttl, token, words);
        assert_eq!(expect_error(&reply, &what), *expected, "{what}");
        assert_eq!(snapshot(&server, &mut con, &keys), before, "{what}");
    }

    // Malformed SESSION options: an ERR that changes nothing (the wording is the
    // parser's).
    let malformed: &[&[&str]] = &[
        &["SESSION"],
        &["SESSION", "s"],
        &["SESSION", "s", "st", "SESSION", "s", "st"],
        &["SESSION", "s", ""],
        &["SESSION", "str", "st"],
    ];
    for words in malformed {
        let what = format!("LEASE.ACQUIRE new 1000 TOKEN a {words:?}");
        let before = snapshot(&server, &mut con, &keys);
        let reply = acquire_reply(&mut con, "new", 1000, "a", words);
        let error = expect_error(&reply, &what);
        assert!(
            error.starts_with("ERR") || error.starts_with("WRONGTYPE"),
            "{what}: {error}"
        );
        assert_eq!(snapshot(&server, &mut con, &keys), before, "{what}");
    }
    assert_eq!(text(call(&mut con, "GET", "str")), "v");
});

for_each_server!(an_expired_session_binds_nothing, |flavor| {
    let server = slow_reaper(flavor);
    let mut con = server.client();
    take(&mut con, "gone", 50, "gt");
    wait_unheld(&mut con, "gone");
    let grants = lease_stat(&server, "grants");
    // Expired but perhaps not reaped: either way it is no session.
    let reply = acquire_reply(&mut con, "new", 1000, "a", &["SESSION", "gone", "gt"]);
    assert_eq!(expect_error(&reply, "SESSION gone"), no_session("gone"));
    assert!(!exists(&mut con, "new"));
    assert_eq!(lease_stat(&server, "grants"), grants);
    assert_eq!(lease_stat(&server, "bound_holds"), 0);
    // A released session is no session either.
    take(&mut con, "rel", MINUTE, "rt");
    assert_eq!(release(&mut con, "rel", "rt"), 1);
    let reply = acquire_reply(&mut con, "new", 1000, "a", &["SESSION", "rel", "rt"]);
    assert_eq!(expect_error(&reply, "SESSION rel"), no_session("rel"));
    assert!(!exists(&mut con, "new"));
});

for_each_server!(
    a_blocking_acquire_with_a_dead_session_fails_at_once,
    |flavor| {
        let server = Server::start(flavor);
        let mut con = server.client();
        take(&mut con, "busy", MINUTE, "x");
        take(&mut con, "s", MINUTE, "st");
        let sent = Instant::now();
        let reply = acquire_reply(
            &mut con,
            "busy",
            MINUTE,
            "w",
            &["BLOCK", "3000", "SESSION", "s", "wrong"],
        );
        let took = sent.elapsed();
        assert_eq!(expect_error(&reply, "blocking ACQUIRE"), no_session("s"));
        assert!(
            took < Duration::from_millis(1500),
            "answered after {took:?}"
        );
        assert_eq!(lease_stat(&server, "waiters"), 0);
        assert_eq!(info(&mut con, "busy").waiters, 0);
    }
);

for_each_server!(ttl_zero_lives_as_long_as_its_session, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    take(&mut con, "s", 30_000, "st");
    let fence = bind(&mut con, "k", 0, "a", "s", "st");

    // The hold's ttl is the session's, read on either side of it.
    let high = info(&mut con, "s").ttl;
    let k = assert_bound(&mut con, "k", fence, "s", "ttl 0");
    let list = holders(&mut con, "k");
    let low = info(&mut con, "s").ttl;
    assert!(
        (low..=high).contains(&k.ttl),
        "k {k:?}, session {low}..={high}"
    );
    assert_eq!(list.len(), 1);
    assert!(
        (low..=high).contains(&list[0].ttl),
        "{list:?}, {low}..={high}"
    );
    assert_eq!(list[0].session.as_deref(), Some("s"));

    // It follows the session's renewal.
    assert_eq!(renew(&mut con, "s", "st", MINUTE), 1);
    let k = info(&mut con, "k");
    assert!(
        k.ttl > 30_000 && k.ttl <= MINUTE as i64,
        "after the session's renewal to a minute: {k:?}"
    );
    // The idempotent retry with ttl 0.
    assert_eq!(bind(&mut con, "k", 0, "a", "s", "st"), fence);

    // Without a session ttl 0 stays an error, and creates nothing.
    let reply = acquire_reply(&mut con, "k2", 0, "b", &[]);
    assert_eq!(expect_error(&reply, "ttl 0 alone"), TTL_ERR);
    assert!(!exists(&mut con, "k2"));

    // RENEW 0: on a bound hold it drops the hold's own deadline ...
    let own = bind(&mut con, "k3", 5_000, "c", "s", "st");
    assert!(info(&mut con, "k3").ttl <= 5_000);
    assert_eq!(renew(&mut con, "k3", "c", 0), 1);
    let k3 = assert_bound(&mut con, "k3", own, "s", "after RENEW 0");
    assert!(
        k3.ttl > 30_000,
        "k3 lives as long as the session now: {k3:?}"
    );
    // ... and a bound hold renewed with a ttl has one again.
    assert_eq!(renew(&mut con, "k3", "c", 5_000), 1);
    assert!(info(&mut con, "k3").ttl <= 5_000);

    // RENEW 0 of an unbound hold is the ttl error, and leaves it alone.
    take(&mut con, "plain", MINUTE, "p");
    let reply = call(&mut con, "LEASE.RENEW", ("plain", "p", 0));
    assert_eq!(expect_error(&reply, "RENEW plain p 0"), TTL_ERR);
    let plain = info(&mut con, "plain");
    assert!(plain.ttl > MINUTE as i64 - 10_000, "{plain:?}");
    assert_eq!(plain.session, None);
});

for_each_server!(a_bound_hold_never_outlives_its_session, |flavor| {
    // `ttl` is "ms until no hold is left": a hold bound to a session that ends in 5 s
    // is gone in 5 s, whatever its own deadline.
    let server = Server::start(flavor);
    let mut con = server.client();
    take(&mut con, "s", 5_000, "st");
    bind(&mut con, "k", MINUTE, "a", "s", "st");
    let k = info(&mut con, "k");
    assert!(k.ttl > 0 && k.ttl <= 5_000, "{k:?}");
    let list = holders(&mut con, "k");
    assert!(list[0].ttl > 0 && list[0].ttl <= 5_000, "{list:?}");
});

// ---------------------------------------------------------------------------------------
// Every way a session ends frees its holds at once

/// The fences of the holds `bound_world` makes.
struct Bound {
    exclusive: u64,
    zero: u64,
    shared: u64,
    unbound: u64,
}

/// Session `s` (token `st`, `session_ttl`) with an exclusive hold on `e` (own ttl a
/// minute), a ttl-0 hold on `z`, a shared hold on `sh` bound to `s` and another
/// shared hold there that is not bound, and a ttl-0 hold on `q` that nobody touches
/// after the session's end: its deletion shows the reaper has been through.
fn bound_world(con: &mut Connection, session_ttl: u64) -> Bound {
    take(con, "s", session_ttl, "st");
    let world = Bound {
        exclusive: bind(con, "e", MINUTE, "a", "s", "st"),
        zero: bind(con, "z", 0, "b", "s", "st"),
        shared: bind_shared(con, "sh", MINUTE, "r1", "s", "st"),
        unbound: take_with(con, "sh", MINUTE, "r2", &["SHARED"]),
    };
    bind(con, "q", 0, "c", "s", "st");
    assert_eq!(bound_count(con, "s"), 4);
    world
}

/// Right after the session ended: the bound holds are free, the unbound one is not,
/// their tokens renew and release nothing, and others get the keys with higher fences.
fn assert_freed(con: &mut Connection, world: &Bound, when: &str) {
    assert_unheld(con, "e", when);
    assert_unheld(con, "z", when);
    let sh = info(con, "sh");
    assert_eq!(
        (sh.state.as_str(), sh.holders),
        ("held", 1),
        "{when}: {sh:?}"
    );
    let list = holders(con, "sh");
    assert_eq!(list.len(), 1, "{when}: {list:?}");
    assert_eq!(list[0].fence, world.unbound, "{when}");
    assert_eq!(renew(con, "e", "a", MINUTE), 0, "{when}: RENEW e");
    assert_eq!(release(con, "z", "b"), 0, "{when}: RELEASE z");
    assert_eq!(renew(con, "sh", "r1", MINUTE), 0, "{when}: RENEW sh r1");
    let newest = world.exclusive.max(world.zero).max(world.shared);
    let e = acquire(con, "e", MINUTE, "other")
        .unwrap_or_else(|| panic!("{when}: ACQUIRE e by another token"));
    let z = acquire(con, "z", MINUTE, "other")
        .unwrap_or_else(|| panic!("{when}: ACQUIRE z by another token"));
    assert!(
        e > newest && z > e,
        "{when}: fences {e}, {z} after {newest}"
    );
    take_with(con, "sh", MINUTE, "r3", &["SHARED"]);
}

/// Builds the world, ends the session with `end`, and checks at once.
fn session_end_frees(flavor: harness::Flavor, what: &str, end: fn(&mut Connection)) {
    let server = slow_reaper(flavor);
    let mut con = server.client();
    let world = bound_world(&mut con, MINUTE);
    end(&mut con);
    assert_freed(&mut con, &world, what);
    assert_taken_over_survive(&server, &mut con, what);
}

/// Once the reaper has dealt with the freed holds, the grants `assert_freed` made on
/// their keys are still there.
fn assert_taken_over_survive(server: &Server, con: &mut Connection, when: &str) {
    config_set(con, "lease.reap-hz", "10");
    wait_until("the reaper to delete q", WAIT, || !exists(con, "q"));
    wait_until("the reaper to drop the freed bound holds", WAIT, || {
        lease_stat(server, "bound_holds") == 0
    });
    assert_throughout(
        SURVIVAL_WINDOW,
        "the grants made after the session's end",
        || {
            for key in ["e", "z", "sh"] {
                let i = lease_info(con, key);
                assert!(
                    i.as_ref()
                        .is_some_and(|i| i.state == "held" && i.session.is_none()),
                    "{when}, reaper at work: {key}: {i:?}"
                );
            }
            assert_eq!(holders(con, "sh").len(), 2, "{when}, reaper at work: sh");
            true
        },
    );
}

/// How long a lease that nothing may delete is watched: ten reaper ticks at the
/// default `lease.reap-hz`. A negative needs time to pass: no event marks the moment
/// a wrong deletion would have come.
const SURVIVAL_WINDOW: Duration = Duration::from_secs(1);

/// Checks `f` every 10 ms for `window`; each check must hold.
fn assert_throughout(window: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let until = Instant::now() + window;
    while Instant::now() < until {
        assert!(f(), "{what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

for_each_server!(session_release_frees_bound_holds_at_once, |flavor| {
    session_end_frees(flavor, "after RELEASE s", |con| {
        assert_eq!(release(con, "s", "st"), 1);
        assert_eq!(bound_count(con, "s"), 0);
    });
});

for_each_server!(session_del_frees_bound_holds_at_once, |flavor| {
    session_end_frees(flavor, "after DEL s", |con| {
        assert_eq!(int(call(con, "DEL", "s")), 1);
    });
});

for_each_server!(session_unlink_frees_bound_holds_at_once, |flavor| {
    session_end_frees(flavor, "after UNLINK s", |con| {
        assert_eq!(int(call(con, "UNLINK", "s")), 1);
    });
});

for_each_server!(session_overwrite_frees_bound_holds_at_once, |flavor| {
    session_end_frees(flavor, "after SET s", |con| {
        assert_ok(call(con, "SET", ("s", "string")), "SET s");
    });
});

for_each_server!(session_rename_away_frees_bound_holds_at_once, |flavor| {
    session_end_frees(flavor, "after RENAME s", |con| {
        assert_ok(call(con, "RENAME", ("s", "s-renamed")), "RENAME s");
        assert!(!exists(con, "s"));
    });
});

for_each_server!(session_expiry_frees_bound_holds_at_once, |flavor| {
    let server = slow_reaper(flavor);
    let mut con = server.client();
    let world = bound_world(&mut con, 300);
    assert_eq!(
        info(&mut con, "e").state,
        "held",
        "the setup outlasted the session"
    );
    // The first command that sees the session over sees its holds free too.
    wait_until("the session to expire", WAIT, || {
        let s = lease_info(&mut con, "s");
        if s.as_ref().is_some_and(|s| s.state == "held") {
            return false;
        }
        let e = lease_info(&mut con, "e");
        assert!(unheld(&e), "session {s:?} over, yet e is {e:?}");
        true
    });
    assert_freed(&mut con, &world, "after the session expired");
    assert_taken_over_survive(&server, &mut con, "after the session expired");
});

for_each_server!(flushall_clears_sessions_and_bound_holds, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    let world = bound_world(&mut con, MINUTE);
    assert_eq!(lease_stat(&server, "bound_holds"), 4);
    assert_ok(call(&mut con, "FLUSHALL", NONE), "FLUSHALL");
    for key in ["s", "e", "z", "sh"] {
        assert_eq!(lease_info(&mut con, key), None, "{key} after FLUSHALL");
        assert!(holders(&mut con, key).is_empty());
    }
    wait_until("the session gauges to reach 0", WAIT, || {
        lease_stat(&server, "bound_holds") == 0 && lease_stat(&server, "sessions") == 0
    });
    // The same names again: a new session, new holds, nothing of the old ones.
    let s = take(&mut con, "s", MINUTE, "st");
    assert!(s > world.shared);
    let e = bind(&mut con, "e", MINUTE, "a", "s", "st");
    assert_eq!(bound_count(&mut con, "s"), 1);
    assert_eq!(lease_stat(&server, "bound_holds"), 1);
    assert_eq!(release(&mut con, "s", "st"), 1);
    assert_unheld(&mut con, "e", "after the new session's release");
    assert!(e > s);
    wait_until("the reaper to delete e", WAIT, || !exists(&mut con, "e"));
    assert_eq!(text(call(&mut con, "PING", NONE)), "PONG");
});

for_each_server!(
    a_session_acquired_again_does_not_revive_old_holds,
    |flavor| {
        let server = slow_reaper(flavor);
        let mut con = server.client();

        // Released, then taken again by the same token.
        let first = take(&mut con, "s", MINUTE, "st");
        let old = bind(&mut con, "e", MINUTE, "a", "s", "st");
        bind(&mut con, "z", 0, "b", "s", "st");
        assert_eq!(release(&mut con, "s", "st"), 1);
        let second = take(&mut con, "s", MINUTE, "st");
        assert!(second > first);
        assert_unheld(&mut con, "e", "after the session was taken again");
        assert_unheld(&mut con, "z", "after the session was taken again");
        assert_eq!(bound_count(&mut con, "s"), 0);
        assert_eq!(renew(&mut con, "e", "a", MINUTE), 0);
        // Asking again binds a new hold (a new fence), not the old one.
        let new = bind(&mut con, "e", MINUTE, "a", "s", "st");
        assert!(new > second && new > old, "{new} after {old}");
        assert_eq!(bound_count(&mut con, "s"), 1);

        // Expired, then taken over by the same token before the reaper comes.
        take(&mut con, "x", 300, "xt");
        bind(&mut con, "y", 0, "c", "x", "xt");
        wait_until("session x to expire", WAIT, || {
            lease_info(&mut con, "x").map_or(true, |i| i.state != "held")
        });
        take(&mut con, "x", MINUTE, "xt");
        assert_unheld(&mut con, "y", "after x was taken over");
        assert_eq!(bound_count(&mut con, "x"), 0);
        assert_eq!(release(&mut con, "y", "c"), 0);
    }
);

for_each_server!(session_renew_keeps_a_thousand_bound_holds_alive, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    let granted_at = Instant::now();
    // Long enough for the thousand bound acquires on a loaded machine; the renewals
    // below then keep it alive past that first deadline.
    take(&mut con, "s", 3_000, "st");
    bind_many(&mut con, "job:", 1_000, 0, "t", "s", "st");
    bind(&mut con, "own", 1_500, "o", "s", "st");
    assert_eq!(bound_count(&mut con, "s"), 1_001);
    assert_eq!(lease_stat(&server, "bound_holds"), 1_001);

    // One RENEW of the session at a time, well past its first deadline.
    let until = granted_at + Duration::from_millis(5_000);
    let mut renewals = 0;
    while Instant::now() < until {
        assert_eq!(
            renew(&mut con, "s", "st", 1_000),
            1,
            "RENEW s after {renewals} renewals: the test stalled past the session's ttl"
        );
        renewals += 1;
        let j = info(&mut con, "job:500");
        assert_eq!(j.state, "held", "{j:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Every ttl-0 hold is alive, the one with its own 1.5 s deadline is not.
    let mut pipe = redis::pipe();
    for i in 0..1_000 {
        pipe.cmd("LEASE.INFO").arg(format!("job:{i}"));
    }
    let replies: Vec<Value> = pipe.query(&mut con).expect("1,000 LEASE.INFO");
    for (i, r) in replies.into_iter().enumerate() {
        let what = format!("LEASE.INFO job:{i}");
        let j = harness::lease::parse_info(r, &what).unwrap_or_else(|| panic!("{what}: nil"));
        assert_eq!(j.state, "held", "{what}: {j:?}");
        assert_eq!(j.session.as_deref(), Some("s"), "{what}");
    }
    assert_unheld(&mut con, "own", "past its own deadline");
    assert_eq!(bound_count(&mut con, "s"), 1_000);

    assert_eq!(release(&mut con, "s", "st"), 1);
    assert_unheld(&mut con, "job:0", "after the session's release");
    assert_unheld(&mut con, "job:999", "after the session's release");
    wait_until("the reaper to delete 1,000 freed keys", WAIT, || {
        dbsize(&mut con) == 0
    });
});

for_each_server!(
    a_key_granted_after_its_session_ended_survives_the_reaper,
    |flavor| {
        // The reaper's clean-up of an ended session visits every key that had a hold bound
        // to it; a key granted afresh in between holds a live lease it must leave alone.
        let server = Server::start(flavor);
        let mut con = server.client();
        take(&mut con, "s", MINUTE, "st");
        bind(&mut con, "e", MINUTE, "a", "s", "st");
        bind(&mut con, "z", 0, "b", "s", "st");
        bind(&mut con, "q", 0, "c", "s", "st");
        assert_eq!(release(&mut con, "s", "st"), 1);
        let fe = take(&mut con, "e", MINUTE, "other");
        let fz = take_with(&mut con, "z", MINUTE, "other", &["SHARED"]);
        wait_until("the reaper to delete q", WAIT, || !exists(&mut con, "q"));
        assert_throughout(SURVIVAL_WINDOW, "e and z granted afresh", || {
            let e = lease_info(&mut con, "e");
            assert!(
                e.as_ref()
                    .is_some_and(|i| i.state == "held" && i.fence == fe),
                "the exclusive lease granted on e after the session's end: {e:?}"
            );
            let z = lease_info(&mut con, "z");
            assert!(
                z.as_ref()
                    .is_some_and(|i| i.state == "held" && i.fence == fz),
                "the shared lease granted on z after the session's end: {z:?}"
            );
            true
        });
        assert_eq!(renew(&mut con, "e", "other", MINUTE), 1);
    }
);

// ---------------------------------------------------------------------------------------
// The reaper, INFO and notifications

for_each_server!(
    reaper_deletes_bound_keys_and_counts_the_session_end,
    |flavor| {
        let server = Server::start(flavor);
        let mut con = server.client();
        let before = session_stats(&server);
        take(&mut con, "s", MINUTE, "st");
        bind(&mut con, "j0", 0, "a", "s", "st");
        bind(&mut con, "j1", MINUTE, "a", "s", "st");
        bind_shared(&mut con, "sh", MINUTE, "r1", "s", "st");
        bind_shared(&mut con, "sh", 0, "r2", "s", "st");
        take(&mut con, "s2", MINUTE, "st2");
        bind(&mut con, "other", 0, "a", "s2", "st2");
        let bound = session_stats(&server);
        assert_eq!(bound.bound_holds, before.bound_holds + 5, "{bound:?}");
        assert_eq!(bound.sessions, before.sessions + 2, "{bound:?}");
        assert_eq!(bound.session_expiries, before.session_expiries);
        assert_eq!(bound_count(&mut con, "s"), 4);

        assert_eq!(release(&mut con, "s", "st"), 1);
        wait_until("the reaper to delete the freed keys", WAIT, || {
            !exists(&mut con, "j0") && !exists(&mut con, "j1") && !exists(&mut con, "sh")
        });
        assert!(
            !exists(&mut con, "s"),
            "a released session nobody waits for"
        );
        wait_until("INFO lease to count the session's end", WAIT, || {
            session_stats(&server).session_expiries == before.session_expiries + 4
        });
        let after = session_stats(&server);
        assert_eq!(after.bound_holds, before.bound_holds + 1, "{after:?}");
        assert_eq!(after.sessions, before.sessions + 1, "{after:?}");
        // The other session and its hold are untouched.
        assert_eq!(info(&mut con, "other").session.as_deref(), Some("s2"));
        assert_eq!(bound_count(&mut con, "s2"), 1);
        assert_eq!(lease_stat(&server, "keys"), 2);
    }
);

/// Reads `(event, key)` notifications until `(event, key)` of `last` arrives.
fn events_until(pubsub: &mut redis::PubSub, last: (&str, &str)) -> Vec<(String, String)> {
    let mut seen = Vec::new();
    loop {
        let msg = pubsub
            .get_message()
            .unwrap_or_else(|e| panic!("no notification after {seen:?}: {e}"));
        let payload: String = msg.get_payload().expect("payload");
        let event = msg
            .get_channel_name()
            .rsplit(':')
            .next()
            .unwrap_or("")
            .to_string();
        let done = event == last.0 && payload == last.1;
        seen.push((event, payload));
        if done {
            return seen;
        }
    }
}

fn count(events: &[(String, String)], event: &str, key: &str) -> usize {
    events
        .iter()
        .filter(|(e, k)| e == event && k == key)
        .count()
}

for_each_server!(session_end_is_notified, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    config_set(&mut con, "notify-keyspace-events", "Ed");
    let mut sub = server.client();
    let mut pubsub = sub.as_pubsub();
    pubsub.set_read_timeout(Some(WAIT)).expect("read timeout");
    pubsub
        .psubscribe("__keyevent@0__:lease.*")
        .expect("PSUBSCRIBE");

    // Released with a bound hold, after a session with none. The reaper announces
    // the end when it takes up the session's holds: within a tick, not in the
    // release's own reply.
    take(&mut con, "s", MINUTE, "st");
    bind(&mut con, "k", 0, "a", "s", "st");
    take(&mut con, "lone", MINUTE, "lt");
    assert_eq!(release(&mut con, "lone", "lt"), 1);
    assert_eq!(release(&mut con, "s", "st"), 1);
    let events = events_until(&mut pubsub, ("lease.session-end", "s"));
    assert_eq!(count(&events, "lease.release", "s"), 1, "{events:?}");
    assert_eq!(count(&events, "lease.session-end", "lone"), 0, "{events:?}");
    // Announced once, on the session key only.
    take(&mut con, "marker", MINUTE, "m");
    let events = events_until(&mut pubsub, ("lease.acquire", "marker"));
    assert_eq!(count(&events, "lease.session-end", "s"), 0, "{events:?}");
    assert_eq!(count(&events, "lease.session-end", "k"), 0, "{events:?}");
    assert_eq!(count(&events, "lease.session-end", "lone"), 0, "{events:?}");

    // Expired with a bound hold.
    take(&mut con, "s2", 200, "st2");
    bind(&mut con, "k2", 0, "a", "s2", "st2");
    let events = events_until(&mut pubsub, ("lease.session-end", "s2"));
    assert_eq!(count(&events, "lease.expire", "s2"), 1, "{events:?}");
    assert_eq!(count(&events, "lease.release", "s2"), 0, "{events:?}");
});

// ---------------------------------------------------------------------------------------
// Waiters

/// `LEASE.ACQUIRE key ttl TOKEN token BLOCK block` plus `words`, sent from a waiter
/// that the server counts as the `position`th of `key` when this returns.
fn queue_with(
    server: &Server,
    key: &str,
    ttl: u64,
    token: &str,
    block: u64,
    words: &[&str],
    position: i64,
) -> Waiter {
    let mut c = acquire_cmd(key, ttl, Some(token), Some(block));
    for word in words {
        c.arg(*word);
    }
    let waiter = Waiter::send(server, &[], c);
    wait_for_waiters(&mut server.client(), key, position);
    waiter
}

/// The fence a waiter was granted; panics on anything else.
fn waiter_fence(reply: &Value, token: &str, what: &str) -> u64 {
    granted(reply, token).unwrap_or_else(|| panic!("{what}: expected a grant, got {reply:?}"))
}

for_each_server!(
    a_waiter_on_a_bound_key_is_served_soon_after_the_session_release,
    |flavor| {
        let server = Server::start(flavor);
        let mut con = server.client();
        take(&mut con, "s", MINUTE, "st");
        let bound = bind(&mut con, "k", 10_000, "a", "s", "st");
        let own_deadline = fence_ms(bound) + 10_000;
        let w = Waiter::queue(&server, "k", MINUTE, "w", 20_000, 1);

        let released_ms = now_ms();
        assert_eq!(release(&mut con, "s", "st"), 1);
        let (reply, _) = w.reply(Duration::from_secs(2), "the waiter on k");
        let fence = waiter_fence(&reply, "w", "the waiter on k");
        let late = fence_ms(fence).saturating_sub(released_ms);
        eprintln!("{flavor}: waiter served {late} ms after the session's release (server clock)");
        assert!(
            fence_ms(fence) + 5_000 < own_deadline,
            "served near k's own deadline"
        );
        assert!(late <= 1_000, "served {late} ms after the release");
        let k = info(&mut con, "k");
        assert_eq!((k.state.as_str(), k.fence, k.waiters), ("held", fence, 0));
        assert_eq!(k.session, None, "the waiter asked for no session");
    }
);

for_each_server!(
    a_waiter_on_a_bound_key_is_served_soon_after_the_session_expires,
    |flavor| {
        let server = Server::start(flavor);
        let mut con = server.client();
        let session = take(&mut con, "s", 500, "st");
        let session_deadline = fence_ms(session) + 500;
        let bound = bind(&mut con, "k", 10_000, "a", "s", "st");
        let own_deadline = fence_ms(bound) + 10_000;
        let w = Waiter::queue(&server, "k", MINUTE, "w", 20_000, 1);
        assert!(
            now_ms() < session_deadline,
            "the setup outlasted the session"
        );

        let (reply, _) = w.reply(Duration::from_secs(3), "the waiter on k");
        let fence = waiter_fence(&reply, "w", "the waiter on k");
        assert!(
            fence_ms(fence) >= session_deadline,
            "granted at {} before the session's deadline {session_deadline}",
            fence_ms(fence)
        );
        let late = fence_ms(fence) - session_deadline;
        eprintln!("{flavor}: waiter served {late} ms after the session's deadline (server clock)");
        assert!(late <= 1_000, "served {late} ms after the session expired");
        assert!(
            fence_ms(fence) + 5_000 < own_deadline,
            "served near k's own deadline"
        );
    }
);

for_each_server!(
    a_blocked_acquire_whose_session_ended_gets_no_live_session,
    |flavor| {
        let server = Server::start(flavor);
        let mut con = server.client();
        take(&mut con, "k", MINUTE, "x");
        take(&mut con, "s", MINUTE, "st");
        let w1 = queue_with(
            &server,
            "k",
            MINUTE,
            "w1",
            10_000,
            &["SESSION", "s", "st"],
            1,
        );
        let w2 = Waiter::queue(&server, "k", MINUTE, "w2", 10_000, 2);

        // w1's session ends before its turn; then its turn comes.
        assert_eq!(release(&mut con, "s", "st"), 1);
        assert_eq!(release(&mut con, "k", "x"), 1);
        let (reply, _) = w1.reply(Duration::from_secs(5), "w1");
        assert_eq!(expect_error(&reply, "w1"), no_session("s"));
        // The queue goes on: w2 is served, and w1 holds nothing.
        let (reply, _) = w2.reply(Duration::from_secs(5), "w2");
        let fence = waiter_fence(&reply, "w2", "w2");
        let k = info(&mut con, "k");
        assert_eq!((k.state.as_str(), k.fence, k.holders), ("held", fence, 1));
        assert_eq!((k.session, k.waiters), (None, 0));
        assert_eq!(holders(&mut con, "k").len(), 1);
        assert_eq!(release(&mut con, "k", "w1"), 0);
    }
);

for_each_server!(
    a_lone_waiter_refused_for_its_session_leaves_no_key_behind,
    |flavor| {
        // The chaos finding (chaos/tests/findings/woken-waiter-without-session.md):
        // the free lease a release keeps for its only waiter must be reaped when that
        // waiter is refused at its turn, not left out of the deadline index forever.
        let server = Server::start(flavor);
        let mut con = server.client();
        take(&mut con, "k", MINUTE, "x");
        take(&mut con, "s", MINUTE, "st");
        let w1 = queue_with(
            &server,
            "k",
            MINUTE,
            "w1",
            10_000,
            &["SESSION", "s", "st"],
            1,
        );
        assert_eq!(release(&mut con, "s", "st"), 1);
        assert_eq!(release(&mut con, "k", "x"), 1);
        let (reply, _) = w1.reply(Duration::from_secs(5), "w1");
        assert_eq!(expect_error(&reply, "w1"), no_session("s"));
        wait_until("the free lease left for w1 to be reaped", WAIT, || {
            !exists(&mut con, "k")
        });
        assert_eq!(lease_stat(&server, "keys"), 0);
    }
);

for_each_server!(
    a_blocked_acquire_with_a_live_session_is_granted_bound,
    |flavor| {
        let server = Server::start(flavor);
        let mut con = server.client();
        take(&mut con, "k", MINUTE, "x");
        take(&mut con, "s", MINUTE, "st");
        let w = queue_with(&server, "k", 0, "w", 10_000, &["SESSION", "s", "st"], 1);
        assert_eq!(release(&mut con, "k", "x"), 1);
        let (reply, _) = w.reply(Duration::from_secs(5), "w");
        let fence = waiter_fence(&reply, "w", "w");
        assert_bound(&mut con, "k", fence, "s", "the waiter's grant");
        assert_eq!(bound_count(&mut con, "s"), 1);
        // Bound indeed: the session's end frees it.
        assert_eq!(release(&mut con, "s", "st"), 1);
        assert_unheld(&mut con, "k", "after the session's release");
    }
);

/// Ends the session on the key it is given.
type SessionEnd = fn(&mut Connection, &str);

for_each_server!(
    waiters_on_bound_keys_are_served_after_every_kind_of_session_end,
    |flavor| {
        let server = Server::start(flavor);
        let mut con = server.client();
        let ends: [(&str, SessionEnd); 5] = [
            ("DEL", |con, s| assert_eq!(int(call(con, "DEL", s)), 1)),
            ("UNLINK", |con, s| {
                assert_eq!(int(call(con, "UNLINK", s)), 1)
            }),
            ("SET", |con, s| assert_ok(call(con, "SET", (s, "x")), "SET")),
            ("RENAME", |con, s| {
                assert_ok(call(con, "RENAME", (s, format!("{s}-renamed"))), "RENAME")
            }),
            ("MOVE", |con, s| {
                assert_eq!(int(call(con, "MOVE", (s, 1))), 1)
            }),
        ];
        for (how, end) in ends {
            let (s, k) = (format!("s-{how}"), format!("k-{how}"));
            take(&mut con, &s, MINUTE, "st");
            bind(&mut con, &k, 10_000, "a", &s, "st");
            let w = Waiter::queue(&server, &k, MINUTE, "w", 20_000, 1);
            let ended_ms = now_ms();
            end(&mut con, &s);
            let (reply, _) = w.reply(Duration::from_secs(2), &format!("the waiter after {how}"));
            let fence = waiter_fence(&reply, "w", how);
            let late = fence_ms(fence).saturating_sub(ended_ms);
            assert!(
                late <= 1_000,
                "{how}: served {late} ms after the session's end"
            );
            let i = info(&mut con, &k);
            assert_eq!(
                (i.state.as_str(), i.fence, i.session),
                ("held", fence, None),
                "{how}"
            );
        }
    }
);

// ---------------------------------------------------------------------------------------
// DELAY

for_each_server!(delay_keeps_an_expired_key_ungrantable, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    let delays = lease_stat(&server, "delays");
    let fa = take_with(&mut con, "k", 300, "a", &["DELAY", "1500"]);
    let free_at = fence_ms(fa) + 300 + 1_500;

    wait_until("k to be delayed", WAIT, || {
        lease_info(&mut con, "k").is_some_and(|i| i.state == "delayed")
    });
    let before = now_ms();
    let k = info(&mut con, "k");
    let after = now_ms();
    assert_eq!(k.state, "delayed", "{k:?}");
    assert_eq!((k.fence, k.waiters, k.holders), (fa, 0, 0), "{k:?}");
    assert_eq!((k.mode.as_deref(), k.session.as_deref()), (None, None));
    assert!(k.ttl > 0 && k.ttl <= 1_500, "{k:?}");
    // ttl counts to the delay's end, which starts at the hold's deadline.
    let low = free_at as i64 - after as i64 - 1;
    let high = free_at as i64 - before as i64 + 150;
    assert!(
        (low..=high).contains(&k.ttl),
        "ttl {} outside {low}..={high}",
        k.ttl
    );
    assert!(holders(&mut con, "k").is_empty());

    // Nobody gets it, in either mode; the old holder cannot renew it back.
    assert_eq!(acquire(&mut con, "k", 1_000, "b"), None);
    assert_eq!(
        acquire_reply(&mut con, "k", 1_000, "b", &["SHARED"]),
        Value::Nil
    );
    assert_eq!(acquire(&mut con, "k", 1_000, "a"), None, "the old token");
    assert_eq!(renew(&mut con, "k", "a", 1_000), 0);
    assert_eq!(release(&mut con, "k", "a"), 0);
    wait_until("lease_delays to count the delay", WAIT, || {
        lease_stat(&server, "delays") == delays + 1
    });

    let mut got = None;
    wait_until("k to be grantable after the delay", WAIT, || {
        got = acquire(&mut con, "k", MINUTE, "b");
        got.is_some()
    });
    let fb = got.unwrap_or_default();
    assert!(
        fence_ms(fb) >= free_at,
        "granted at {} before the delay's end {free_at}",
        fence_ms(fb)
    );
    assert!(
        fence_ms(fb) <= free_at + 1_000,
        "granted {} ms late",
        fence_ms(fb) - free_at
    );
    let k = info(&mut con, "k");
    assert_eq!((k.state.as_str(), k.fence), ("held", fb));
});

for_each_server!(release_starts_no_delay, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    let delays = lease_stat(&server, "delays");
    take_with(&mut con, "k", MINUTE, "a", &["DELAY", "60000"]);
    assert_eq!(release(&mut con, "k", "a"), 1);
    assert!(acquire(&mut con, "k", MINUTE, "b").is_some());
    assert_eq!(info(&mut con, "k").state, "held");
    // A bound hold with a delay, released on its own: no delay either.
    take(&mut con, "s", MINUTE, "st");
    take_with(
        &mut con,
        "j",
        MINUTE,
        "a",
        &["SESSION", "s", "st", "DELAY", "60000"],
    );
    assert_eq!(release(&mut con, "j", "a"), 1);
    assert!(acquire(&mut con, "j", MINUTE, "b").is_some());
    assert_eq!(lease_stat(&server, "delays"), delays);
});

for_each_server!(delay_zero_starts_no_delay, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    let fa = take_with(&mut con, "k", 200, "a", &["DELAY", "0"]);
    let mut got = None;
    wait_until("k to be grantable after its expiry", WAIT, || {
        let state = lease_info(&mut con, "k").map(|i| i.state);
        assert_ne!(state.as_deref(), Some("delayed"), "DELAY 0");
        got = acquire(&mut con, "k", MINUTE, "b");
        got.is_some()
    });
    let fb = got.unwrap_or_default();
    assert!(fence_ms(fb) >= fence_ms(fa) + 200);
    assert!(fence_ms(fb) <= fence_ms(fa) + 200 + 1_000);
});

for_each_server!(delay_errors_change_nothing, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    take(&mut con, "held", MINUTE, "h");
    let keys = ["held", "k"];
    let cases: &[(&[&str], &str)] = &[
        (&["SHARED", "DELAY", "10"], DELAY_SHARED_ERR),
        (&["DELAY", "10", "SHARED"], DELAY_SHARED_ERR),
        (&["SHARED", "LIMIT", "2", "DELAY", "0"], DELAY_SHARED_ERR),
        (&["DELAY", "-1"], DELAY_ERR),
        (&["DELAY", "1099511627777"], DELAY_ERR),
        (&["DELAY", "abc"], DELAY_ERR),
        (&["DELAY", "1.5"], DELAY_ERR),
        (&["DELAY", ""], DELAY_ERR),
    ];
    for (words, expected) in cases {
        for key in keys {
            let what = format!("LEASE.ACQUIRE {key} 1000 TOKEN a {words:?}");
            let before = snapshot(&server, &mut con, &keys);
            let reply = acquire_reply(&mut con, key, 1_000, "a", words);
            assert_eq!(expect_error(&reply, &what), *expected, "{what}");
            assert_eq!(snapshot(&server, &mut con, &keys), before, "{what}");
        }
    }
    let malformed: &[&[&str]] = &[&["DELAY"], &["DELAY", "5", "DELAY", "5"]];
    for words in malformed {
        let what = format!("LEASE.ACQUIRE k 1000 TOKEN a {words:?}");
        let before = snapshot(&server, &mut con, &keys);
        let reply = acquire_reply(&mut con, "k", 1_000, "a", words);
        let error = expect_error(&reply, &what);
        assert!(error.starts_with("ERR"), "{what}: {error}");
        assert_eq!(snapshot(&server, &mut con, &keys), before, "{what}");
    }
    // The largest delay is accepted.
    take_with(&mut con, "k", 1_000, "a", &["DELAY", "1099511627776"]);
});

for_each_server!(waiters_keep_their_place_through_a_delay, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    let fa = take_with(&mut con, "k", 300, "a", &["DELAY", "1000"]);
    let free_at = fence_ms(fa) + 300 + 1_000;
    let w1 = Waiter::queue(&server, "k", MINUTE, "w1", 10_000, 1);
    let w2 = Waiter::queue(&server, "k", MINUTE, "w2", 10_000, 2);
    assert!(now_ms() + 200 < free_at, "the setup outlasted the delay");

    wait_until("k to be delayed", WAIT, || {
        lease_info(&mut con, "k").is_some_and(|i| i.state == "delayed")
    });
    let k = info(&mut con, "k");
    assert_eq!(k.waiters, 2, "{k:?}");
    assert_eq!(acquire(&mut con, "k", MINUTE, "newcomer"), None);
    w1.assert_waiting("w1 during the delay");

    let (reply, _) = w1.reply(Duration::from_secs(5), "w1");
    let f1 = waiter_fence(&reply, "w1", "w1");
    assert!(
        fence_ms(f1) >= free_at,
        "w1 granted at {} before the delay's end {free_at}",
        fence_ms(f1)
    );
    assert!(
        fence_ms(f1) <= free_at + 1_000,
        "w1 served {} ms late",
        fence_ms(f1) - free_at
    );
    w2.assert_waiting("w2 while w1 holds k");
    assert_eq!(acquire(&mut con, "k", MINUTE, "newcomer"), None);
    assert_eq!(release(&mut con, "k", "w1"), 1);
    let (reply, _) = w2.reply(Duration::from_secs(5), "w2");
    let f2 = waiter_fence(&reply, "w2", "w2");
    assert!(f2 > f1);
});

for_each_server!(delay_after_a_session_end, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    let delays = lease_stat(&server, "delays");
    take(&mut con, "s", MINUTE, "st");
    take_with(
        &mut con,
        "k",
        MINUTE,
        "a",
        &["SESSION", "s", "st", "DELAY", "1000"],
    );
    take_with(
        &mut con,
        "z",
        0,
        "a",
        &["DELAY", "1000", "SESSION", "s", "st"],
    );

    let released_ms = now_ms();
    assert_eq!(release(&mut con, "s", "st"), 1);
    for key in ["k", "z"] {
        let i = info(&mut con, key);
        assert_eq!(
            i.state, "delayed",
            "{key} right after the session's end: {i:?}"
        );
        assert!(i.ttl > 0 && i.ttl <= 1_000, "{key}: {i:?}");
        assert_eq!(acquire(&mut con, key, MINUTE, "b"), None, "{key}");
    }
    wait_until("lease_delays to count two delays", WAIT, || {
        lease_stat(&server, "delays") == delays + 2
    });
    let mut got = None;
    wait_until("k to be grantable after the delay", WAIT, || {
        got = acquire(&mut con, "k", MINUTE, "b");
        got.is_some()
    });
    let fb = got.unwrap_or_default();
    assert!(
        fence_ms(fb) >= released_ms + 1_000,
        "granted at {} before the delay could end ({} + 1000)",
        fence_ms(fb),
        released_ms
    );
});

// ---------------------------------------------------------------------------------------
// Key specs

for_each_server!(getkeys_lists_the_session_key, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    let getkeys =
        |con: &mut Connection, args: &[&str]| strings(call(con, "COMMAND", ("GETKEYS", args)));
    assert_eq!(
        getkeys(
            &mut con,
            &["LEASE.ACQUIRE", "k", "1000", "SESSION", "s", "t"]
        ),
        ["k", "s"]
    );
    assert_eq!(
        getkeys(
            &mut con,
            &[
                "LEASE.ACQUIRE",
                "k",
                "0",
                "TOKEN",
                "a",
                "SHARED",
                "SESSION",
                "s",
                "t",
                "OWNER",
                "o"
            ]
        ),
        ["k", "s"]
    );
    assert_eq!(
        getkeys(
            &mut con,
            &["LEASE.ACQUIRE", "k", "1000", "TOKEN", "a", "DELAY", "5"]
        ),
        ["k"]
    );
});

for_each_server!(getkeys_is_not_fooled_by_a_token_named_session, |flavor| {
    // A token or owner label may be any bytes, the word SESSION included: the session
    // key is the argument after the SESSION option, not after the first such word.
    let server = Server::start(flavor);
    let mut con = server.client();
    let getkeys =
        |con: &mut Connection, args: &[&str]| strings(call(con, "COMMAND", ("GETKEYS", args)));
    assert_eq!(
        getkeys(
            &mut con,
            &[
                "LEASE.ACQUIRE",
                "k",
                "1000",
                "TOKEN",
                "SESSION",
                "SESSION",
                "s",
                "t"
            ]
        ),
        ["k", "s"]
    );
    assert_eq!(
        getkeys(
            &mut con,
            &["LEASE.ACQUIRE", "k", "1000", "OWNER", "SESSION"]
        ),
        ["k"]
    );
});

// ---------------------------------------------------------------------------------------
// Scale (not timed)

for_each_server!(
    ten_thousand_bound_holds_are_reaped_while_the_server_answers,
    |flavor| {
        let server = Server::start(flavor);
        let mut con = server.client();
        let before = session_stats(&server);
        take(&mut con, "s", MINUTE, "st");
        bind_many(&mut con, "b:", 10_000, 0, "t", "s", "st");
        assert_eq!(bound_count(&mut con, "s"), 10_000);
        assert_eq!(
            lease_stat(&server, "bound_holds"),
            before.bound_holds + 10_000
        );

        assert_eq!(release(&mut con, "s", "st"), 1);
        for key in ["b:0", "b:5000", "b:9999"] {
            assert_unheld(&mut con, key, "right after the session's release");
        }

        // A probe's PING is answered while the reaper works through the keys.
        let mut probe = server.client();
        let mut answered_while_reaping = 0;
        wait_until(
            "the reaper to delete 10,000 freed keys",
            Duration::from_secs(60),
            || {
                assert_eq!(text(call(&mut probe, "PING", NONE)), "PONG");
                let left = dbsize(&mut probe);
                if left > 0 {
                    answered_while_reaping += 1;
                }
                left == 0
            },
        );
        assert!(
            answered_while_reaping > 0,
            "the keys went before any PING was answered"
        );
        let after = session_stats(&server);
        assert_eq!(
            after.session_expiries,
            before.session_expiries + 10_000,
            "{after:?}"
        );
        assert_eq!(after.bound_holds, before.bound_holds, "{after:?}");
        assert_eq!(after.sessions, before.sessions, "{after:?}");
    }
);
