//! `LEASE.DEBUG CHECK` (the contract, version 2.1): `OK` on a primary and its replica
//! after a mixed workload, transient moments included; an error naming each structure
//! a `fault-injection` build corrupts on purpose (`LEASE.DEBUG CORRUPT`, see
//! src/commands/debug.rs), so that every rule is seen failing once; never a token in
//! the reply; admin only, never in a script, arity and unknown subcommands refused.
//!
//! Every other test file runs the check too, on each server it drops
//! (tests/harness/src/lib.rs, `Drop for Server`).

#[macro_use]
extern crate harness;

use std::time::Duration;

use harness::calls::{
    call, call_error, exists, info_on, int, login, restore, select, take, take_many, text, NONE,
};
use harness::holds::WAIT;
use harness::lease::{dump, lease_dump, lease_stat};
use harness::reply::{assert_ok, error_text};
use harness::session::{bind, bind_shared, take_with};
use harness::waiter::Waiter;
use harness::{
    attach, debug_module_path, master_and_replica, now_ms, wait_until, Flavor, Server,
    ServerOptions,
};
use redis::{Connection, Value};

const MINUTE: u64 = 60_000;

/// Every token the workloads use: none may show in a check's reply.
const TOKENS: &[&str] = &[
    "tok-exclusive",
    "tok-session",
    "tok-session-2",
    "tok-bound",
    "tok-shared-1",
    "tok-shared-2",
    "tok-short",
    "tok-delay",
    "tok-ended",
    "tok-lone",
    "tok-waiter",
    "tok-db3",
    "tok-restored",
    "tok-flushed",
];

/// `LEASE.DEBUG CHECK`'s reply: `Ok` or the error's text.
fn check(con: &mut Connection) -> Result<(), String> {
    match call(con, "LEASE.DEBUG", "CHECK") {
        Value::Okay => Ok(()),
        other => Err(error_text(&other).unwrap_or_else(|| format!("{other:?}"))),
    }
}

fn assert_clean(con: &mut Connection, what: &str) {
    if let Err(e) = check(con) {
        panic!("LEASE.DEBUG CHECK {what}: {e}");
    }
}

/// The error a check must answer, with no token in it.
fn problems(con: &mut Connection, what: &str) -> String {
    let e = check(con).expect_err(what);
    assert!(e.starts_with("ERR lease check: "), "{what}: {e}");
    for token in TOKENS {
        assert!(!e.contains(token), "{what}: the reply shows {token}: {e}");
    }
    e
}

/// A server that loads the `fault-injection` build (`LEASE.DEBUG CORRUPT`), with
/// `args` after the module path; its structures are broken on purpose, so no check
/// runs when it is dropped.
fn faulty(flavor: Flavor, args: &str) -> Server {
    let module = debug_module_path("faults", "fault-injection");
    let line = format!("{} {args}", module.display());
    Server::start_with(
        flavor,
        ServerOptions::without_module()
            .config("loadmodule", line.trim())
            .without_final_check(),
    )
}

fn corrupt(con: &mut Connection, what: &[&str]) {
    assert_ok(
        call(con, "LEASE.DEBUG", ("CORRUPT", what)),
        &format!("CORRUPT {what:?}"),
    );
}

/// Exclusive, labelled, shared and bound holds, sessions (one with a single bound
/// hold, one released so that its holds are reaped), records, a lease that expires
/// and one that starts a lock-delay, a waiter, keys in databases 0 and 3, a restored
/// lease that expired before it arrived, a bound key moved where its session is not,
/// and a database flushed `ASYNC`. Returns the blocked waiter.
fn workload(server: &Server, con: &mut Connection) -> Waiter {
    take_with(con, "ex", MINUTE, "tok-exclusive", &["OWNER", "worker-1"]);
    take(con, "sess", MINUTE, "tok-session");
    bind(con, "b0", 0, "tok-bound", "sess", "tok-session");
    bind(con, "b1", MINUTE, "tok-bound", "sess", "tok-session");
    bind_shared(con, "b2", 0, "tok-bound", "sess", "tok-session");
    take(con, "lone", MINUTE, "tok-lone");
    bind(con, "lone-b", 0, "tok-lone", "lone", "tok-lone");
    take_with(con, "sh", MINUTE, "tok-shared-1", &["SHARED", "LIMIT", "3"]);
    take_with(con, "sh", MINUTE, "tok-shared-2", &["SHARED", "LIMIT", "3"]);
    assert_eq!(int(call(con, "LEASE.FENCE", ("rec", 5))), 5);
    take(con, "short", 50, "tok-short");
    take_with(con, "dl", 50, "tok-delay", &["DELAY", "300"]);
    take(con, "ended", MINUTE, "tok-ended");
    for i in 0..3 {
        bind(
            con,
            &format!("ended-{i}"),
            0,
            "tok-ended",
            "ended",
            "tok-ended",
        );
    }
    assert_eq!(int(call(con, "LEASE.RELEASE", ("ended", "tok-ended"))), 1);
    // A lease that expired before it arrived: indexed at its past deadline, taken at
    // the reaper's next tick.
    take(con, "template", MINUTE, "t");
    let template = dump(con, "template");
    assert_eq!(int(call(con, "DEL", "template")), 1);
    let expired = lease_dump(&template, 7, now_ms() - 10_000, b"tok-restored");
    assert_ok(restore(con, "restored", &expired.payload()), "RESTORE");
    // A bound key moved where its session is not: freed at the reaper's next tick.
    take(con, "mover", MINUTE, "tok-session-2");
    bind(con, "moved", 0, "tok-bound", "mover", "tok-session-2");
    assert_eq!(int(call(con, "MOVE", ("moved", 5))), 1);
    select(con, 3);
    take(con, "x3", MINUTE, "tok-db3");
    take(con, "s3", MINUTE, "tok-db3");
    bind(con, "y3", MINUTE, "tok-bound", "s3", "tok-db3");
    assert_eq!(int(call(con, "LEASE.FENCE", ("rec3", 9))), 9);
    select(con, 7);
    for i in 0..200 {
        take(con, &format!("f{i}"), MINUTE, "tok-flushed");
    }
    assert_ok(call(con, "FLUSHDB", "ASYNC"), "FLUSHDB ASYNC");
    select(con, 0);
    Waiter::block(server, "ex", MINUTE, "tok-waiter", 30_000, &[])
}

// A primary and its replica agree with themselves at every moment of a mixed workload:
// right after it (expiries, a session's end and arrivals not yet handled by the reaper,
// a lazy free under way, a waiter queued), and once the reaper has done its work.
for_each_server!(
    clean_after_a_mixed_workload_on_primary_and_replica,
    |flavor| {
        let (master, replica) = master_and_replica(flavor);
        let mut m = master.client();
        let mut r = replica.client();
        assert_clean(&mut m, "on an empty primary");
        assert_clean(&mut r, "on an empty replica");
        let waiter = workload(&master, &mut m);
        assert_clean(&mut m, "right after the workload");
        replica.wait_for_sync(&master);
        assert_clean(&mut r, "on the replica right after the workload");
        wait_until(
            "the reaper to handle the expiries, the ended session and the arrivals",
            WAIT,
            || {
                !exists(&mut m, "short")
                    && !exists(&mut m, "ended-0")
                    && !exists(&mut m, "restored")
            },
        );
        assert_clean(&mut m, "after the reaper's work");
        replica.wait_for_sync(&master);
        assert_clean(&mut r, "on the replica after the reaper's work");
        // The waiter is served by the release, and the check agrees again.
        assert_eq!(
            int(call(&mut m, "LEASE.RELEASE", ("ex", "tok-exclusive"))),
            1
        );
        let (reply, _) = waiter.reply(WAIT, "the waiter on ex");
        assert!(matches!(reply, Value::Array(_)), "{reply:?}");
        assert_clean(&mut m, "after the waiter's grant");
        // A session ended during a write pause: expired, not yet handled, on both.
        take(&mut m, "paused-s", 100, "tok-session");
        bind(
            &mut m,
            "paused-b",
            0,
            "tok-bound",
            "paused-s",
            "tok-session",
        );
        replica.wait_for_sync(&master);
        assert_ok(
            call(&mut m, "CLIENT", ("PAUSE", 1_000, "WRITE")),
            "CLIENT PAUSE",
        );
        std::thread::sleep(Duration::from_millis(300));
        assert_clean(&mut m, "with a session expired inside a write pause");
        assert_clean(&mut r, "on the replica, the session expired");
        assert_ok(call(&mut m, "CLIENT", "UNPAUSE"), "CLIENT UNPAUSE");
        assert_clean(&mut m, "right after the pause");
        // A replica promoted: its index is rebuilt by a scan, and checked meanwhile.
        assert_ok(call(&mut r, "REPLICAOF", ("NO", "ONE")), "REPLICAOF NO ONE");
        assert_clean(&mut r, "on the promoted replica");
        wait_until("the promoted replica's index", WAIT, || {
            lease_stat(&replica, "indexed_deadlines") > 0
        });
        assert_clean(&mut r, "on the promoted replica, indexed");
    }
);

// Each structure corrupted on purpose, on a fresh server after the same workload: the
// check names it, and shows no token.
for_each_server!(each_corrupted_structure_is_named, |flavor| {
    let cases: &[(&[&str], &str)] = &[
        (&["lease-keys"], "gauge lease_keys is "),
        (&["resource-keys"], "gauge lease_resource_keys is "),
        (&["shared-holds"], "gauge lease_shared_holds is "),
        (
            &["waiters"],
            "waiter queues count 2 waiters, their queues hold 1",
        ),
        (
            &["index-drop", "ex"],
            "deadline index misses lease 0:\"ex\" (due at ",
        ),
        (
            &["bound-drop", "lone-b"],
            "bound-hold index misses session 0:\"lone\" fence ",
        ),
        (
            &["bound-again", "b0"],
            "bound-hold index counts 4 holds for session 0:\"sess\"",
        ),
        (
            &["bound-ghost", "sess"],
            "bound-hold index has session 0:\"sess\" fence 1 with 1 holds, none stored",
        ),
    ];
    for (what, expected) in cases {
        let server = faulty(flavor, "");
        let mut con = server.client();
        let waiter = workload(&server, &mut con);
        assert_clean(&mut con, "before the corruption");
        // While a lazy free runs, a gauge above the keyspace's count is its doing.
        wait_until("the lazy free of FLUSHDB ASYNC", WAIT, || {
            info_on(&mut con, "memory", "lazyfree_pending_objects") == 0
        });
        corrupt(&mut con, what);
        let e = problems(&mut con, &format!("after CORRUPT {what:?}"));
        assert!(e.contains(expected), "CORRUPT {what:?}: {e}");
        drop(waiter);
    }
});

// An index entry the reaper leaves due: with a reaper that panics at every tick (it
// never sweeps after the load), an entry due ten seconds ago is reported once the
// reaper has been held up for a period and the grace (2 s); with a working reaper the
// same entry is one that arrived since its last sweep, taken at its next tick.
for_each_server!(a_due_entry_left_by_the_reaper_is_named, |flavor| {
    let stuck = faulty(flavor, "inject-panic reaper");
    let mut con = stuck.client();
    take(&mut con, "ex", MINUTE, "tok-exclusive");
    assert_clean(&mut con, "with nothing due");
    corrupt(&mut con, &["index-stale", "ghost", "10000"]);
    wait_until("the check to name the entry left due", WAIT, || {
        check(&mut con).is_err()
    });
    let e = problems(&mut con, "an entry due 10 s ago, the reaper stuck");
    assert!(
        e.contains("deadline index entry 0:\"ghost\" due ")
            && e.contains(" ms ago was left by the reaper (last sweep "),
        "{e}"
    );

    let working = faulty(flavor, "");
    let mut con = working.client();
    take(&mut con, "ex", MINUTE, "tok-exclusive");
    corrupt(&mut con, &["index-stale", "ghost", "10000"]);
    assert_clean(&mut con, "an entry due 10 s ago, just arrived");
    wait_until("the reaper to take the entry", WAIT, || {
        lease_stat(&working, "indexed_deadlines") == 1
    });
    assert_clean(&mut con, "once the reaper took it");
});

// A backlog the reaper takes over many ticks (each stops at its batch or its time):
// the check holds at every step (a tick that stops early loses no entry: a lease
// without one is named) and every key goes.
for_each_server!(
    a_backlog_over_many_ticks_checks_clean_at_every_step,
    |flavor| {
        let options = ServerOptions::new().config("lease.reap-batch", "20");
        let server = Server::start_with(flavor, options);
        let mut con = server.client();
        const N: usize = 4_000;
        take_many(&mut con, "backlog", N, 300, "tok-backlog");
        assert_ok(call(&mut con, "DEBUG", ("SLEEP", "0.4")), "DEBUG SLEEP");
        let mut midway = 0;
        let give_up = std::time::Instant::now() + WAIT;
        loop {
            let left = int(call(&mut con, "DBSIZE", NONE));
            assert!(
                std::time::Instant::now() < give_up,
                "{left} keys still there after {WAIT:?}"
            );
            assert_clean(&mut con, &format!("with {left} of {N} keys left to reap"));
            if left == 0 {
                break;
            }
            if (left as usize) < N {
                midway += 1;
            }
        }
        // 200 ticks of 20 keys, a millisecond or more apart: many checks fall among them.
        assert!(
            midway >= 10,
            "only {midway} checks while the backlog was reaped"
        );
        assert_eq!(lease_stat(&server, "expired"), N as u64);
    }
);

// A replica keeps no deadline index: an entry put there is named.
for_each_server!(an_index_on_a_replica_is_named, |flavor| {
    let master = faulty(flavor, "");
    let replica = faulty(flavor, "");
    attach(&replica, &master);
    let mut m = master.client();
    let mut r = replica.client();
    take(&mut m, "ex", MINUTE, "tok-exclusive");
    replica.wait_for_sync(&master);
    assert_clean(&mut r, "on the replica");
    corrupt(&mut r, &["index-stale", "ex", "0"]);
    let e = problems(&mut r, "a replica with an index entry");
    assert!(
        e.contains("deadline index on a replica holds 1 entries"),
        "{e}"
    );
    assert_clean(&mut m, "on the primary");
});

// A session that is live again after its entry ended (the session invariant) is named:
// RENAME of the session key away and back.
for_each_server!(a_session_live_again_after_its_end_is_named, |flavor| {
    let server = Server::start_with(flavor, ServerOptions::new().without_final_check());
    let mut con = server.client();
    take(&mut con, "s", MINUTE, "tok-session");
    bind(&mut con, "k", 0, "tok-bound", "s", "tok-session");
    assert_clean(&mut con, "with the session bound");
    assert_ok(call(&mut con, "RENAME", ("s", "elsewhere")), "RENAME away");
    assert_ok(call(&mut con, "RENAME", ("elsewhere", "s")), "RENAME back");
    // Whether the module keeps the invariant or not, the check says what it finds:
    // the session ended (its holds free), or the check names the entry.
    match check(&mut con) {
        Ok(()) => assert!(exists(&mut con, "s"), "the session key is back"),
        Err(e) => assert!(
            e.contains("bound-hold index marks session 0:\"s\" fence ")
                && e.contains(" ended, but it is live"),
            "{e}"
        ),
    }
});

// Admin, slow, never in a script; arity and unknown subcommands refused with an error
// naming the problem; `CORRUPT` exists only in a fault-injection build.
for_each_server!(
    an_admin_command_refused_in_scripts_and_for_bad_arguments,
    |flavor| {
        let server = Server::start(flavor);
        let mut con = server.client();
        let e = call_error(
            &mut con,
            "EVAL",
            ("return redis.call('LEASE.DEBUG','CHECK')", 0),
        );
        assert!(e.contains("not allowed from script"), "{e}");
        let e = call_error(&mut con, "LEASE.DEBUG", NONE);
        assert!(
            e.starts_with("ERR wrong number of arguments for 'lease.debug"),
            "{e}"
        );
        let e = call_error(&mut con, "LEASE.DEBUG", ("CHECK", "extra"));
        assert_eq!(
            e,
            "ERR wrong number of arguments for 'lease.debug|check' command"
        );
        let e = call_error(&mut con, "LEASE.DEBUG", "NOPE");
        assert_eq!(
            e,
            "ERR unknown subcommand \"NOPE\" for 'lease.debug' (CHECK is the only one)"
        );
        let e = call_error(&mut con, "LEASE.DEBUG", ("CORRUPT", "lease-keys"));
        assert!(e.starts_with("ERR unknown subcommand \"CORRUPT\""), "{e}");
        let e = call_error(&mut con, "LEASE.FENCE", ("r", 1, "LEASE.DEBUG", "CHECK"));
        assert!(e.starts_with("ERR LEASE.FENCE"), "{e}");
        assert_eq!(text(call(&mut con, "LEASE.DEBUG", "check")), "OK");

        // COMMAND INFO: admin, noscript; no key.
        let info = call(&mut con, "COMMAND", ("INFO", "lease.debug"));
        let Value::Array(entries) = info else {
            panic!("COMMAND INFO lease.debug: {info:?}")
        };
        let Some(Value::Array(entry)) = entries.into_iter().next() else {
            panic!("COMMAND INFO lease.debug: no entry")
        };
        let words = |v: &Value| -> Vec<String> {
            match v {
                Value::Array(items) | Value::Set(items) => items
                    .iter()
                    .map(|i| harness::reply::text(i.clone(), "word"))
                    .collect(),
                other => panic!("{other:?}"),
            }
        };
        let flags = words(&entry[2]);
        for flag in ["admin", "noscript"] {
            assert!(flags.iter().any(|f| f == flag), "{flags:?}");
        }
        assert_eq!(int(entry[3].clone()), 0, "first key: none");
        let categories = words(&entry[6]);
        if flavor == Flavor::Redis7 {
            // No API for module command categories on 7.0 (docs/src/proof/security.md).
            assert_eq!(categories, Vec::<String>::new());
        } else {
            for category in ["@admin", "@slow", "@dangerous"] {
                assert!(categories.iter().any(|c| c == category), "{categories:?}");
            }
            // Not in @lease, which lock clients are given.
            assert!(!categories.iter().any(|c| c == "@lease"), "{categories:?}");
            // So a user without @admin may not run it.
            assert_ok(
                call(
                    &mut con,
                    "ACL",
                    (
                        "SETUSER", "operator", "on", "nopass", "+@all", "-@admin", "~*",
                    ),
                ),
                "ACL SETUSER",
            );
            let mut operator = login(&server, "operator");
            let e = call_error(&mut operator, "LEASE.DEBUG", "CHECK");
            assert!(e.starts_with("NOPERM"), "{e}");
            // Nor a lock client, given +@lease.
            assert_ok(
                call(
                    &mut con,
                    "ACL",
                    ("SETUSER", "client", "on", "nopass", "+@lease", "~*"),
                ),
                "ACL SETUSER",
            );
            let mut client = login(&server, "client");
            let e = call_error(&mut client, "LEASE.DEBUG", "CHECK");
            assert!(e.starts_with("NOPERM"), "a +@lease user: {e}");
        }
    }
);
