//! Shared holds (version 2 of the contract: `SHARED [LIMIT n]`, `OWNER`, the ten-field
//! `LEASE.INFO`, `LEASE.HOLDERS`) on each real server: grants and refusals in both
//! modes, retries, the limit and its errors, `lease.max-holders`, owners, renew and
//! release per token, expiry and reaping of single holds, first come first served
//! across modes, keyspace notifications, the `lease_shared_holds` gauge and eviction.
//! Persistence, replication, DUMP/RESTORE/MIGRATE and clusters: tests/shared_persistence.rs.
//!
//! The exact behaviour and error strings: /work/notes/design16.md (the spec's
//! "Version 2" with SESSION and DELAY left for later).

#[macro_use]
extern crate harness;

use std::io::Write;
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

use harness::calls::{
    call, config_get, config_set, describe, exists, info_on, int, key_type, release, renew, send,
    strings, text, NONE,
};
use harness::errors::{
    limit_mismatch, LIMIT_ERR, MAX_HOLDERS_ERR, OTHER_MODE_ERR, OWNER_ERR, WRONGTYPE,
};
use harness::evict::{arm, fill_until};
use harness::holds::{
    assert_no_token, assert_refused, assert_refused_with, fence_ms, granted_to, holder_fences,
    holders, holds_still, info_of, parse_holders, queue, snapshot, Acquire, HOLDER_FIELDS, WAIT,
};
use harness::lease::{lease_info, lease_stat, parse_info, wait_for_waiters, Info, INFO_FIELDS};
use harness::reply::{assert_ok, error_text, expect_error, grant};
use harness::{wait_until, Flavor, Server};
use redis::{Connection, Value};

const MINUTE: u64 = 60_000;

fn arity(command: &str) -> String {
    format!("ERR wrong number of arguments for '{command}' command")
}

/// `LEASE.ACQUIRE key` followed by the words of `rest`, as sent by a client that types
/// them; `''` stands for an empty argument.
fn acquire_line(key: &str, rest: &str) -> redis::Cmd {
    let mut c = redis::cmd("LEASE.ACQUIRE");
    c.arg(key);
    for word in rest.split_whitespace() {
        match word {
            "''" => c.arg(""),
            w => c.arg(w),
        };
    }
    c
}

/// A malformed option list: an `ERR` error (a syntax error, or one naming the option).
fn is_option_error(e: &str) -> bool {
    e.starts_with("ERR ")
}

// ---------------------------------------------------------------------------------------
// Grants
// ---------------------------------------------------------------------------------------

for_each_server!(
    shared_holders_coexist_each_with_its_token_and_fence,
    |flavor| {
        let server = Server::start(flavor);
        let mut con = server.client();

        let mut fences: Vec<u64> = ["r1", "r2", "r3"]
            .iter()
            .map(|t| Acquire::shared("k", MINUTE).token(t).take(&mut con))
            .collect();
        let (generated, f4) = Acquire::shared("k", MINUTE)
            .grant(&mut con)
            .expect("a fourth shared hold with a generated token");
        assert_eq!(generated.len(), 32, "generated token {generated:?}");
        assert!(
            generated
                .iter()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b)),
            "a generated token is lowercase hex: {generated:?}"
        );
        fences.push(f4);
        assert!(
            fences.windows(2).all(|w| w[0] < w[1]),
            "every grant takes a new, higher fence: {fences:?}"
        );

        let i = info_of(&mut con, "k");
        assert_eq!(i.state, "held", "{i:?}");
        assert_eq!(i.mode.as_deref(), Some("shared"), "{i:?}");
        assert_eq!(i.holders, 4, "{i:?}");
        assert_eq!(i.fence, f4, "the last fence issued for the key: {i:?}");
        assert_eq!(
            (
                i.waiters,
                i.limit,
                i.owner.clone(),
                i.session.clone(),
                i.bound
            ),
            (0, None, None, None, 0),
            "{i:?}"
        );
        assert!(i.ttl > 50_000 && i.ttl <= MINUTE as i64, "{i:?}");

        let listed = holders(&mut con, "k");
        assert_eq!(
            listed.iter().map(|h| h.fence).collect::<Vec<_>>(),
            fences,
            "{listed:?}"
        );
        for h in &listed {
            assert_eq!(h.mode, "shared", "{h:?}");
            assert_eq!((h.owner.as_deref(), h.session.as_deref()), (None, None));
            assert!(h.ttl > 50_000 && h.ttl <= MINUTE as i64, "{h:?}");
        }

        // Each token is a capability of its own.
        assert_eq!(renew(&mut con, "k", "r2", MINUTE), 1);
        assert_eq!(renew(&mut con, "k", &generated, MINUTE), 1);
        assert_eq!(renew(&mut con, "k", "r9", MINUTE), 0);

        // One node-wide sequence: grants on other keys and in either mode interleave.
        let fx = Acquire::exclusive("x", MINUTE).token("w").take(&mut con);
        assert!(fx > f4, "{fx} after {f4}");
        let f5 = Acquire::shared("k", MINUTE).token("r5").take(&mut con);
        assert!(f5 > fx, "{f5} after {fx}");
        assert_eq!(lease_stat(&server, "keys"), 2);
        assert_eq!(info_of(&mut con, "k").holders, 5);
    }
);

for_each_server!(exclusive_and_shared_holds_exclude_each_other, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    let watched = ["rw"];

    Acquire::shared("rw", MINUTE).token("r1").take(&mut con);
    Acquire::shared("rw", MINUTE).token("r2").take(&mut con);
    let contended = lease_stat(&server, "acquires_contended");
    let before = snapshot(&mut con, &watched);
    Acquire::exclusive("rw", MINUTE)
        .token("w")
        .refused(&mut con);
    Acquire::exclusive("rw", MINUTE).refused(&mut con);
    assert_eq!(before, snapshot(&mut con, &watched), "a refused writer");
    assert_eq!(lease_stat(&server, "acquires_contended"), contended + 2);

    // One reader left still keeps the writer out.
    assert_eq!(release(&mut con, "rw", "r1"), 1);
    Acquire::exclusive("rw", MINUTE)
        .token("w")
        .refused(&mut con);
    assert_eq!(release(&mut con, "rw", "r2"), 1);
    assert!(!exists(&mut con, "rw"), "no hold and no waiter: deleted");

    let fw = Acquire::exclusive("rw", MINUTE).token("w").take(&mut con);
    let i = info_of(&mut con, "rw");
    assert_eq!(
        (i.mode.as_deref(), i.holders, i.limit),
        (Some("exclusive"), 1, None),
        "{i:?}"
    );
    let before = snapshot(&mut con, &watched);
    Acquire::shared("rw", MINUTE).token("r3").refused(&mut con);
    Acquire::shared("rw", MINUTE).refused(&mut con);
    assert_eq!(before, snapshot(&mut con, &watched), "a refused reader");

    assert_eq!(release(&mut con, "rw", "w"), 1);
    let f3 = Acquire::shared("rw", MINUTE).token("r3").take(&mut con);
    assert!(f3 > fw, "{f3} after {fw}");
});

for_each_server!(
    a_retry_in_the_same_mode_renews_and_repeats_the_grant,
    |flavor| {
        let server = Server::start(flavor);
        let mut con = server.client();

        let f1 = Acquire::shared("k", 2_000).token("r1").take(&mut con);
        let f2 = Acquire::shared("k", MINUTE).token("r2").take(&mut con);
        let (grants, retries) = (
            lease_stat(&server, "grants"),
            lease_stat(&server, "retries"),
        );
        let again = Acquire::shared("k", MINUTE).token("r1").grant(&mut con);
        assert_eq!(again, Some((b"r1".to_vec(), f1)), "the same [token, fence]");
        let listed = holders(&mut con, "k");
        assert_eq!(
            listed.iter().map(|h| h.fence).collect::<Vec<_>>(),
            [f1, f2],
            "a retry keeps its place: {listed:?}"
        );
        assert!(
            listed[0].ttl > 50_000,
            "the retry renewed the deadline: {listed:?}"
        );
        assert_eq!(
            lease_stat(&server, "grants"),
            grants,
            "a retry is not a grant"
        );
        assert_eq!(lease_stat(&server, "retries"), retries + 1);
        assert_eq!(info_of(&mut con, "k").fence, f2, "no new fence issued");

        // With a limit: the same limit stated again.
        let fl = Acquire::shared("sem", 2_000)
            .token("p")
            .limit(2)
            .take(&mut con);
        let again = Acquire::shared("sem", MINUTE)
            .token("p")
            .limit(2)
            .fence(&mut con);
        assert_eq!(again, Some(fl));
        assert!(holders(&mut con, "sem")[0].ttl > 50_000);

        // Exclusive, with an owner.
        let fe = Acquire::exclusive("ex", 2_000)
            .token("w")
            .owner("writer")
            .take(&mut con);
        let again = Acquire::exclusive("ex", MINUTE)
            .token("w")
            .owner("writer")
            .fence(&mut con);
        assert_eq!(again, Some(fe));
        let i = info_of(&mut con, "ex");
        assert!(i.ttl > 50_000, "{i:?}");
        assert_eq!(i.owner.as_deref(), Some("writer"));
        assert_eq!(i.holders, 1);
    }
);

for_each_server!(the_same_token_in_the_other_mode_is_an_error, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    Acquire::shared("rw", MINUTE).token("r1").take(&mut con);
    Acquire::shared("rw", MINUTE).token("r2").take(&mut con);
    Acquire::exclusive("ex", MINUTE).token("w").take(&mut con);
    Acquire::shared("sem", MINUTE)
        .token("p")
        .limit(3)
        .take(&mut con);
    let watched = ["rw", "ex", "sem"];

    let cases = [
        Acquire::exclusive("rw", MINUTE).token("r1"),
        Acquire::shared("ex", MINUTE).token("w"),
        // The mode is checked before the limit: each of these states another limit too.
        Acquire::exclusive("sem", MINUTE).token("p"),
        Acquire::shared("ex", MINUTE).token("w").limit(2),
        Acquire::exclusive("rw", MINUTE).token("r2").owner("o"),
    ];
    for case in &cases {
        assert_refused(&mut con, &watched, &case.cmd(), OTHER_MODE_ERR);
    }
    // With BLOCK the error comes at once; nothing waits.
    let asked = Instant::now();
    assert_refused(
        &mut con,
        &watched,
        &Acquire::exclusive("rw", MINUTE)
            .token("r1")
            .block(3_000)
            .cmd(),
        OTHER_MODE_ERR,
    );
    assert!(asked.elapsed() < Duration::from_secs(2), "it waited");
    assert_eq!(info_of(&mut con, "rw").waiters, 0);

    // The holds are as they were.
    for (key, token) in [("rw", "r1"), ("rw", "r2"), ("ex", "w"), ("sem", "p")] {
        assert_eq!(renew(&mut con, key, token, MINUTE), 1, "{key} {token}");
    }
});

// ---------------------------------------------------------------------------------------
// LIMIT and lease.max-holders
// ---------------------------------------------------------------------------------------

for_each_server!(a_full_limit_answers_nil, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    let sem = |t: &str| Acquire::shared("sem", MINUTE).token(t).limit(2);

    sem("a").take(&mut con);
    let fb = sem("b").take(&mut con);
    let before = snapshot(&mut con, &["sem"]);
    sem("c").refused(&mut con);
    sem("c").block(50).refused(&mut con);
    assert_eq!(before, snapshot(&mut con, &["sem"]));
    let i = info_of(&mut con, "sem");
    assert_eq!(
        (i.mode.as_deref(), i.holders, i.limit),
        (Some("shared"), 2, Some(2)),
        "{i:?}"
    );

    assert_eq!(release(&mut con, "sem", "a"), 1);
    let fc = sem("c").take(&mut con);
    assert!(fc > fb);
    assert_eq!(holder_fences(&mut con, "sem"), [fb, fc]);
    sem("d").refused(&mut con);

    // LIMIT 1: one shared hold at a time.
    let one = |t: &str| Acquire::shared("one", MINUTE).token(t).limit(1);
    one("x").take(&mut con);
    one("y").refused(&mut con);
    assert_eq!(info_of(&mut con, "one").limit, Some(1));
});

for_each_server!(limit_and_option_errors_change_nothing, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    Acquire::shared("sem", 30_000)
        .token("a")
        .limit(3)
        .take(&mut con);
    let watched = ["sem", "new"];

    // The LIMIT value: out of range or not an integer.
    for rest in [
        "1000 SHARED LIMIT 0",
        "1000 SHARED LIMIT 1000001",
        "1000 SHARED LIMIT -1",
        "1000 SHARED LIMIT x",
        "1000 SHARED LIMIT 2.5",
        "1000 SHARED LIMIT ''",
        "1000 SHARED LIMIT 18446744073709551616",
        "1000 TOKEN t SHARED LIMIT 0 OWNER o",
    ] {
        for key in ["new", "sem"] {
            assert_refused(&mut con, &watched, &acquire_line(key, rest), LIMIT_ERR);
        }
    }
    // The holder's own retry with a bad limit renews nothing either.
    assert_refused(
        &mut con,
        &watched,
        &acquire_line("sem", "60000 TOKEN a SHARED LIMIT 0"),
        LIMIT_ERR,
    );

    // A LIMIT with no value, not right after SHARED, or without SHARED; a repeated
    // option.
    for rest in [
        "1000 SHARED LIMIT",
        "1000 LIMIT 3",
        "1000 LIMIT 3 SHARED",
        "1000 SHARED TOKEN t LIMIT 3",
        "1000 SHARED OWNER o LIMIT 3",
        "1000 TOKEN t LIMIT 3",
    ] {
        for key in ["new", "sem"] {
            assert_refused_with(
                &mut con,
                &watched,
                &acquire_line(key, rest),
                "an ERR error",
                is_option_error,
            );
        }
    }
    for rest in [
        "1000 SHARED SHARED",
        "1000 SHARED LIMIT 3 LIMIT 3",
        "1000 SHARED LIMIT 3 SHARED LIMIT 3",
        "1000 SHARED LIMIT 3 SHARED",
        "1000 TOKEN a SHARED TOKEN a",
        "1000 OWNER o SHARED OWNER o",
        "1000 OWNER o OWNER o",
        "1000 owner o OWNER p",
        "1000 SHARED BLOCK 1 BLOCK 1",
        "1000 SHARED OWNER",
        "1000 SHARED BOGUS",
        "1000 SHARED 3",
        "1000 SHARED LIMIT 3 extra",
    ] {
        for key in ["new", "sem"] {
            assert_refused_with(
                &mut con,
                &watched,
                &acquire_line(key, rest),
                "an ERR error",
                is_option_error,
            );
        }
    }
    // The holder's retry in a refused command renewed nothing.
    let listed = holders(&mut con, "sem");
    assert_eq!(listed.len(), 1);
    assert!(listed[0].ttl <= 30_000, "{listed:?}");

    // Both ends of the range are accepted; option names are case-insensitive and the
    // options come in any order.
    Acquire::shared("lo", MINUTE)
        .token("t")
        .limit(1)
        .take(&mut con);
    Acquire::shared("hi", MINUTE)
        .token("t")
        .limit(1_000_000)
        .take(&mut con);
    assert_eq!(info_of(&mut con, "hi").limit, Some(1_000_000));
    for (key, rest) in [
        ("any1", "1000 shared limit 4 token t owner o"),
        ("any2", "1000 OWNER o SHARED LIMIT 4 BLOCK 10 TOKEN t"),
        ("any3", "1000 Owner o Token t Shared Limit 4"),
    ] {
        let c = acquire_line(key, rest);
        let got = grant(send(&mut con, &c), &describe(&c));
        assert_eq!(got.map(|(t, _)| t), Some(b"t".to_vec()), "{}", describe(&c));
        let i = info_of(&mut con, key);
        assert_eq!(
            (i.mode.as_deref(), i.limit),
            (Some("shared"), Some(4)),
            "{key}: {i:?}"
        );
        assert_eq!(holders(&mut con, key)[0].owner.as_deref(), Some("o"));
    }
});

for_each_server!(a_limit_that_does_not_match_is_an_error, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    Acquire::shared("sem", MINUTE)
        .token("a")
        .limit(3)
        .take(&mut con);
    Acquire::shared("rw", MINUTE).token("r").take(&mut con);
    Acquire::exclusive("ex", MINUTE).token("w").take(&mut con);
    let watched = ["sem", "rw", "ex"];

    let cases = [
        // Another limit.
        (Acquire::shared("sem", MINUTE).token("b").limit(4), Some(3)),
        (Acquire::shared("sem", MINUTE).token("b").limit(2), Some(3)),
        // None where the key has one: shared, and exclusive (which states none).
        (Acquire::shared("sem", MINUTE).token("b"), Some(3)),
        (Acquire::exclusive("sem", MINUTE).token("b"), Some(3)),
        (Acquire::exclusive("sem", MINUTE), Some(3)),
        // One where the key has none: shared and exclusive holders.
        (Acquire::shared("rw", MINUTE).token("b").limit(2), None),
        (Acquire::shared("ex", MINUTE).token("b").limit(2), None),
        // The holder's own retry with another limit.
        (Acquire::shared("sem", MINUTE).token("a").limit(4), Some(3)),
        (Acquire::shared("rw", MINUTE).token("r").limit(1), None),
    ];
    for (case, limit) in &cases {
        assert_refused(&mut con, &watched, &case.cmd(), &limit_mismatch(*limit));
    }
    // With BLOCK: at once, not after waiting.
    let asked = Instant::now();
    assert_refused(
        &mut con,
        &watched,
        &Acquire::shared("sem", MINUTE)
            .token("b")
            .limit(4)
            .block(3_000)
            .cmd(),
        &limit_mismatch(Some(3)),
    );
    assert_refused(
        &mut con,
        &watched,
        &Acquire::shared("ex", MINUTE)
            .token("b")
            .limit(4)
            .block(0)
            .cmd(),
        &limit_mismatch(None),
    );
    assert!(asked.elapsed() < Duration::from_secs(2), "it waited");

    // The matching forms are granted, or nil where the key is busy.
    Acquire::shared("sem", MINUTE)
        .token("b")
        .limit(3)
        .take(&mut con);
    Acquire::shared("rw", MINUTE).token("b").take(&mut con);
    Acquire::shared("ex", MINUTE).token("b").refused(&mut con);
    Acquire::exclusive("rw", MINUTE)
        .token("c")
        .refused(&mut con);
});

for_each_server!(the_limit_is_forgotten_once_no_hold_is_left, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();

    // Released.
    Acquire::shared("sem", MINUTE)
        .token("a")
        .limit(3)
        .take(&mut con);
    Acquire::shared("sem", MINUTE)
        .token("b")
        .limit(3)
        .take(&mut con);
    assert_eq!(release(&mut con, "sem", "a"), 1);
    let e = Acquire::shared("sem", MINUTE)
        .token("c")
        .limit(5)
        .error(&mut con);
    assert_eq!(e, limit_mismatch(Some(3)), "one hold left: remembered");
    assert_eq!(release(&mut con, "sem", "b"), 1);
    assert_eq!(lease_info(&mut con, "sem"), None);
    Acquire::shared("sem", MINUTE)
        .token("c")
        .limit(5)
        .take(&mut con);
    assert_eq!(info_of(&mut con, "sem").limit, Some(5));
    assert_eq!(release(&mut con, "sem", "c"), 1);
    Acquire::exclusive("sem", MINUTE).token("w").take(&mut con);
    assert_eq!(info_of(&mut con, "sem").limit, None);
    assert_eq!(release(&mut con, "sem", "w"), 1);

    // Expired and not reaped yet: one transaction, so the reaper cannot run between
    // the expiry and the next grant.
    let replies: Vec<Value> = redis::pipe()
        .atomic()
        .add_command(Acquire::shared("exp", 1).token("a").limit(2).cmd())
        .cmd("DEBUG")
        .arg(("SLEEP", "0.01"))
        .add_command(Acquire::shared("exp", MINUTE).token("b").limit(7).cmd())
        .cmd("LEASE.INFO")
        .arg("exp")
        .add_command(Acquire::shared("exp2", 1).token("a").limit(2).cmd())
        .cmd("DEBUG")
        .arg(("SLEEP", "0.01"))
        .add_command(Acquire::exclusive("exp2", MINUTE).token("w").cmd())
        .query(&mut con)
        .unwrap_or_else(|e| panic!("MULTI: {e}"));
    assert!(grant(replies[0].clone(), "exp a").is_some());
    assert!(
        grant(replies[2].clone(), "exp b, another limit after the expiry").is_some(),
        "{replies:?}"
    );
    let i = parse_info(replies[3].clone(), "LEASE.INFO exp").expect("exp");
    assert_eq!((i.holders, i.limit), (1, Some(7)), "{i:?}");
    assert!(grant(replies[4].clone(), "exp2 a").is_some());
    assert!(
        grant(replies[6].clone(), "exp2 w, exclusive after the expiry").is_some(),
        "{replies:?}"
    );
});

for_each_server!(
    a_blocking_shared_acquire_at_max_holders_waits_its_turn,
    |flavor| {
        // Without BLOCK the cap is an error; with BLOCK the caller takes its place in the
        // queue, first come first served, and gets the first room a hold leaves.
        let server = Server::start(flavor);
        let mut con = server.client();
        config_set(&mut con, "lease.max-holders", "2");
        let rw = |t: &str| Acquire::shared("rw", MINUTE).token(t);
        rw("a").take(&mut con);
        rw("b").take(&mut con);
        assert_refused(&mut con, &["rw"], &rw("c").cmd(), MAX_HOLDERS_ERR);
        let waiter = queue(&server, &rw("c").block(10_000), 1);
        waiter.assert_waiting("c at the cap");
        // Nobody passes the waiter while it waits: a later caller gets nil.
        rw("d").refused(&mut con);
        assert_eq!(release(&mut con, "rw", "a"), 1);
        granted_to(waiter, "c", "c once a holds ends");
        assert_eq!(info_of(&mut con, "rw").holders, 2);
    }
);

for_each_server!(max_holders_caps_the_holds_of_one_key, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    assert_eq!(config_get(&mut con, "lease.max-holders"), "10000");
    config_set(&mut con, "lease.max-holders", "3");
    assert_eq!(config_get(&mut con, "lease.max-holders"), "3");

    let rw = |t: &str| Acquire::shared("rw", MINUTE).token(t);
    let fa = rw("a").take(&mut con);
    rw("b").take(&mut con);
    rw("c").take(&mut con);
    assert_refused(&mut con, &["rw"], &rw("d").cmd(), MAX_HOLDERS_ERR);
    assert_refused(
        &mut con,
        &["rw"],
        &Acquire::shared("rw", MINUTE).cmd(),
        MAX_HOLDERS_ERR,
    );
    // A holder's retry is not a new hold.
    assert_eq!(rw("a").fence(&mut con), Some(fa));

    // Also under a LIMIT above the cap; a LIMIT below it answers nil when full.
    let sem = |t: &str| Acquire::shared("sem", MINUTE).token(t).limit(5);
    for t in ["a", "b", "c"] {
        sem(t).take(&mut con);
    }
    assert_refused(&mut con, &["sem"], &sem("d").cmd(), MAX_HOLDERS_ERR);
    let small = |t: &str| Acquire::shared("small", MINUTE).token(t).limit(2);
    small("a").take(&mut con);
    small("b").take(&mut con);
    small("c").refused(&mut con);

    // Out of range: refused, the setting stays.
    for bad in ["0", "1000001", "-1", "x"] {
        let reply = call(&mut con, "CONFIG", ("SET", "lease.max-holders", bad));
        assert!(
            error_text(&reply).is_some(),
            "CONFIG SET lease.max-holders {bad}: {reply:?}"
        );
    }
    assert_eq!(config_get(&mut con, "lease.max-holders"), "3");

    // Room again after a release, and after raising the cap.
    assert_eq!(release(&mut con, "rw", "a"), 1);
    rw("d").take(&mut con);
    assert_refused(&mut con, &["rw"], &rw("e").cmd(), MAX_HOLDERS_ERR);
    config_set(&mut con, "lease.max-holders", "1000000");
    rw("e").take(&mut con);
    sem("d").take(&mut con);
    assert_eq!(info_of(&mut con, "rw").holders, 4);
});

// ---------------------------------------------------------------------------------------
// OWNER
// ---------------------------------------------------------------------------------------

for_each_server!(owner_labels_are_checked_and_shown, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    Acquire::shared("rw", MINUTE).token("r").take(&mut con);
    let watched = ["rw", "new"];

    let too_long = vec![b'o'; 129];
    let bad: [&[u8]; 8] = [
        b"",
        &too_long,
        b"host\n7",
        b"host\r",
        b"\x00",
        b"tab\there",
        b"del\x7f",
        b"\x1b[31m",
    ];
    for label in bad {
        for acquire in [
            Acquire::exclusive("new", MINUTE).token("t").owner(label),
            Acquire::shared("new", MINUTE).token("t").owner(label),
            Acquire::shared("rw", MINUTE).token("r2").owner(label),
            // The holder's retry: no renewal either.
            Acquire::shared("rw", MINUTE).token("r").owner(label),
        ] {
            assert_refused(&mut con, &watched, &acquire.cmd(), OWNER_ERR);
        }
    }

    // 128 bytes, spaces and non-ASCII text are labels.
    let longest = "o".repeat(128);
    Acquire::exclusive("ex", MINUTE)
        .token("w")
        .owner(&longest)
        .take(&mut con);
    let i = info_of(&mut con, "ex");
    assert_eq!(i.owner.as_deref(), Some(longest.as_str()), "{i:?}");
    assert_eq!(
        holders(&mut con, "ex")[0].owner.as_deref(),
        Some(longest.as_str())
    );

    Acquire::shared("rw", MINUTE)
        .token("r2")
        .owner("host-7 pid 4242")
        .take(&mut con);
    Acquire::shared("rw", MINUTE)
        .token("r3")
        .owner("hôte-8 «job»")
        .take(&mut con);
    let owners: Vec<Option<String>> = holders(&mut con, "rw")
        .into_iter()
        .map(|h| h.owner)
        .collect();
    assert_eq!(
        owners,
        [
            None,
            Some("host-7 pid 4242".to_string()),
            Some("hôte-8 «job»".to_string())
        ]
    );
    // LEASE.INFO's owner is the exclusive holder's label: none on a shared key.
    assert_eq!(info_of(&mut con, "rw").owner, None);

    // The label grants nothing: it is not a token.
    assert_eq!(renew(&mut con, "rw", "host-7 pid 4242", MINUTE), 0);
    assert_eq!(release(&mut con, "ex", &longest), 0);
});

// ---------------------------------------------------------------------------------------
// RENEW and RELEASE per token, expiry, reaping
// ---------------------------------------------------------------------------------------

for_each_server!(renew_and_release_act_on_one_shared_hold, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    let fa = Acquire::shared("k", 30_000).token("a").take(&mut con);
    let fb = Acquire::shared("k", 30_000).token("b").take(&mut con);
    let fc = Acquire::shared("k", 30_000).token("c").take(&mut con);
    let stats = |s: &Server| {
        [
            "renewals",
            "renewals_rejected",
            "releases",
            "releases_rejected",
        ]
        .map(|f| lease_stat(s, f))
    };
    let before = stats(&server);

    assert_eq!(renew(&mut con, "k", "b", MINUTE), 1);
    let listed = holders(&mut con, "k");
    assert!(listed[1].ttl > 50_000, "b renewed: {listed:?}");
    assert!(
        listed[0].ttl <= 30_000 && listed[2].ttl <= 30_000,
        "a and c untouched: {listed:?}"
    );
    assert_eq!(renew(&mut con, "k", "z", MINUTE), 0);
    assert_eq!(release(&mut con, "k", "z"), 0);

    assert_eq!(release(&mut con, "k", "b"), 1);
    assert_eq!(holder_fences(&mut con, "k"), [fa, fc]);
    assert_eq!(renew(&mut con, "k", "b", MINUTE), 0, "a released hold");
    assert_eq!(release(&mut con, "k", "b"), 0);
    let i = info_of(&mut con, "k");
    assert_eq!((i.holders, i.mode.as_deref()), (2, Some("shared")), "{i:?}");

    // The key's fence is the last one issued, whichever hold ends.
    assert_eq!(release(&mut con, "k", "c"), 1);
    assert_eq!(info_of(&mut con, "k").fence, fc);
    assert_eq!(holder_fences(&mut con, "k"), [fa]);
    assert_eq!(renew(&mut con, "k", "a", MINUTE), 1);
    assert_eq!(release(&mut con, "k", "a"), 1);
    assert!(!exists(&mut con, "k"), "the last hold released: deleted");
    assert_eq!(lease_info(&mut con, "k"), None);
    assert!(holders(&mut con, "k").is_empty());

    let after = stats(&server);
    assert_eq!(
        after,
        [before[0] + 2, before[1] + 2, before[2] + 3, before[3] + 2],
        "renewals, renewals_rejected, releases, releases_rejected"
    );
    let fresh = Acquire::shared("k", MINUTE).token("a").take(&mut con);
    assert!(fresh > fc && fc > fb && fb > fa);
});

for_each_server!(expiry_of_one_shared_hold_leaves_the_others, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    config_set(&mut con, "lease.reap-hz", "100");
    let fa = Acquire::shared("k", 500).token("a").take(&mut con);
    let fb = Acquire::shared("k", MINUTE).token("b").take(&mut con);
    assert_eq!(holder_fences(&mut con, "k"), [fa, fb]);

    wait_until("a's hold to expire", WAIT, || {
        holder_fences(&mut con, "k") == [fb]
    });
    assert_eq!(
        renew(&mut con, "k", "a", MINUTE),
        0,
        "an expiry is never revived"
    );
    assert_eq!(release(&mut con, "k", "a"), 0);
    let i = info_of(&mut con, "k");
    assert_eq!(
        (i.state.as_str(), i.holders, i.mode.as_deref(), i.fence),
        ("held", 1, Some("shared"), fb),
        "{i:?}"
    );
    assert!(i.ttl > 50_000, "the ttl is b's: {i:?}");
    wait_until("the reaper to drop a's hold", WAIT, || {
        lease_stat(&server, "expired") == 1
    });
    assert!(exists(&mut con, "k"), "b still holds the key");
    assert_eq!(lease_stat(&server, "shared_holds"), 1);
    assert_eq!(renew(&mut con, "k", "b", MINUTE), 1);
    let fc = Acquire::shared("k", MINUTE).token("c").take(&mut con);
    assert!(fc > fb);
    assert_eq!(holder_fences(&mut con, "k"), [fb, fc]);
});

for_each_server!(the_reaper_deletes_a_key_once_every_hold_expired, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    config_set(&mut con, "lease.reap-hz", "100");
    let mut last = 0;
    for (t, ttl) in [("a", 400), ("b", 700), ("c", 1_000)] {
        last = Acquire::shared("k", ttl).token(t).take(&mut con);
    }
    for t in ["a", "b"] {
        Acquire::shared("sem", 500).token(t).limit(2).take(&mut con);
    }
    assert_eq!(lease_stat(&server, "shared_holds"), 5);

    let mut seen = vec![3];
    wait_until("the reaper to delete both keys", WAIT, || {
        let n = holders(&mut con, "k").len();
        if seen.last() != Some(&n) {
            seen.push(n);
        }
        !exists(&mut con, "k") && !exists(&mut con, "sem")
    });
    assert!(
        seen.windows(2).all(|w| w[0] > w[1]),
        "holds of k seen over time: {seen:?}"
    );
    assert_eq!(lease_stat(&server, "expired"), 5, "one expiry per hold");
    assert_eq!(lease_stat(&server, "keys"), 0);
    assert_eq!(lease_stat(&server, "shared_holds"), 0);
    wait_until("the deadline index to empty", WAIT, || {
        lease_stat(&server, "indexed_deadlines") == 0
    });
    let fresh = Acquire::exclusive("k", MINUTE).token("w").take(&mut con);
    assert!(fresh > last);
});

// ---------------------------------------------------------------------------------------
// LEASE.INFO and LEASE.HOLDERS
// ---------------------------------------------------------------------------------------

/// Both protocols, with a name for messages.
fn protocols(server: &Server) -> [(&'static str, Connection); 2] {
    [("resp2", server.client()), ("resp3", server.client_resp3())]
}

/// The reply is a flat array (RESP2) or a map (RESP3) of `n` fields.
fn assert_shape(proto: &str, reply: &Value, n: usize, what: &str) {
    match (proto, reply) {
        ("resp2", Value::Array(items)) => assert_eq!(items.len(), 2 * n, "{what}: {reply:?}"),
        ("resp3", Value::Map(pairs)) => assert_eq!(pairs.len(), n, "{what}: {reply:?}"),
        _ => panic!("{what} over {proto}: {reply:?}"),
    }
}

for_each_server!(lease_info_has_ten_fields_in_order, |flavor| {
    let server = Server::start(flavor);
    for (proto, mut con) in protocols(&server) {
        let key = |name: &str| format!("{proto}:{name}");
        let secret: &[u8] = b"secret-token-of-the-writer";
        let readers: [&[u8]; 2] = [b"secret-token-reader-1", b"secret-token-reader-2"];
        let tokens = [secret, readers[0], readers[1]];

        assert_eq!(call(&mut con, "LEASE.INFO", key("missing")), Value::Nil);

        let fe = Acquire::exclusive(&key("ex"), MINUTE)
            .token(secret)
            .owner("writer@host-1")
            .take(&mut con);
        let reply = call(&mut con, "LEASE.INFO", key("ex"));
        assert_shape(
            proto,
            &reply,
            INFO_FIELDS.len(),
            "LEASE.INFO of an exclusive key",
        );
        assert_no_token(&reply, &tokens, "LEASE.INFO");
        let i = parse_info(reply, "LEASE.INFO ex").expect("ex");
        assert_eq!(
            (
                i.state.as_str(),
                i.fence,
                i.waiters,
                i.mode.as_deref(),
                i.holders,
                i.limit,
                i.owner.as_deref(),
                i.session.as_deref(),
                i.bound
            ),
            (
                "held",
                fe,
                0,
                Some("exclusive"),
                1,
                None,
                Some("writer@host-1"),
                None,
                0
            ),
            "{proto}: {i:?}"
        );
        assert!(i.ttl > 50_000 && i.ttl <= MINUTE as i64, "{i:?}");

        Acquire::shared(&key("sem"), 10_000)
            .token(readers[0])
            .limit(3)
            .owner("reader-1")
            .take(&mut con);
        let fs = Acquire::shared(&key("sem"), MINUTE)
            .token(readers[1])
            .limit(3)
            .owner("reader-2")
            .take(&mut con);
        let reply = call(&mut con, "LEASE.INFO", key("sem"));
        assert_shape(
            proto,
            &reply,
            INFO_FIELDS.len(),
            "LEASE.INFO of a shared key",
        );
        assert_no_token(&reply, &tokens, "LEASE.INFO");
        let i = parse_info(reply, "LEASE.INFO sem").expect("sem");
        assert_eq!(
            (
                i.state.as_str(),
                i.fence,
                i.waiters,
                i.mode.as_deref(),
                i.holders,
                i.limit,
                i.owner.as_deref(),
                i.session.as_deref(),
                i.bound
            ),
            ("held", fs, 0, Some("shared"), 2, Some(3), None, None, 0),
            "{proto}: {i:?}"
        );
        assert!(i.ttl > 50_000, "until no hold is left: {i:?}");

        Acquire::shared(&key("rw"), MINUTE)
            .token(readers[0])
            .take(&mut con);
        let i = info_of(&mut con, &key("rw"));
        assert_eq!(
            (i.mode.as_deref(), i.limit, i.holders),
            (Some("shared"), None, 1)
        );

        // Free: expired, not reaped yet (one transaction keeps the reaper out).
        let replies: Vec<Value> = redis::pipe()
            .atomic()
            .add_command(
                Acquire::shared(&key("free"), 1)
                    .token(readers[1])
                    .limit(2)
                    .owner("gone")
                    .cmd(),
            )
            .cmd("DEBUG")
            .arg(("SLEEP", "0.01"))
            .cmd("LEASE.INFO")
            .arg(key("free"))
            .query(&mut con)
            .unwrap_or_else(|e| panic!("MULTI: {e}"));
        let (_, ff) = grant(replies[0].clone(), "free").expect("granted");
        assert_shape(
            proto,
            &replies[2],
            INFO_FIELDS.len(),
            "LEASE.INFO of a free key",
        );
        assert_no_token(&replies[2], &tokens, "LEASE.INFO");
        let i = parse_info(replies[2].clone(), "LEASE.INFO free").expect("free");
        assert_eq!(
            i,
            Info {
                state: "free".into(),
                ttl: -1,
                fence: ff,
                waiters: 0,
                mode: None,
                holders: 0,
                limit: None,
                owner: None,
                session: None,
                bound: 0,
                fields: INFO_FIELDS.map(String::from).to_vec(),
            },
            "{proto}"
        );
    }
});

for_each_server!(lease_info_ttl_lasts_until_no_hold_is_left, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    Acquire::shared("k", 5_000).token("a").take(&mut con);
    Acquire::shared("k", MINUTE).token("b").take(&mut con);
    let ttl = info_of(&mut con, "k").ttl;
    assert!(
        ttl > 55_000 && ttl <= MINUTE as i64,
        "the longest hold: {ttl}"
    );
    assert_eq!(release(&mut con, "k", "b"), 1);
    let ttl = info_of(&mut con, "k").ttl;
    assert!(ttl > 0 && ttl <= 5_000, "a's hold alone: {ttl}");
    assert_eq!(renew(&mut con, "k", "a", 30_000), 1);
    let ttl = info_of(&mut con, "k").ttl;
    assert!(ttl > 25_000 && ttl <= 30_000, "a renewed: {ttl}");
    Acquire::shared("k", 10_000).token("c").take(&mut con);
    let ttl = info_of(&mut con, "k").ttl;
    assert!(ttl > 25_000 && ttl <= 30_000, "a shorter hold added: {ttl}");
});

for_each_server!(lease_holders_lists_every_live_hold_oldest_first, |flavor| {
    let server = Server::start(flavor);
    for (proto, mut con) in protocols(&server) {
        let key = |name: &str| format!("{proto}:{name}");
        let tokens: [&[u8]; 4] = [
            b"secret-holder-x",
            b"secret-holder-y",
            b"secret-holder-z",
            b"secret-holder-w",
        ];
        let k = key("rw");
        let fx = Acquire::shared(&k, MINUTE)
            .token(tokens[0])
            .owner("r-x")
            .take(&mut con);
        let fy = Acquire::shared(&k, 30_000).token(tokens[1]).take(&mut con);
        let fz = Acquire::shared(&k, 45_000)
            .token(tokens[2])
            .owner("r-z")
            .take(&mut con);
        // A retry and a renewal keep each hold's place.
        assert_eq!(
            Acquire::shared(&k, 10_000)
                .token(tokens[0])
                .owner("r-x")
                .fence(&mut con),
            Some(fx)
        );
        assert_eq!(renew(&mut con, &k, tokens[1], 90_000), 1);

        let reply = call(&mut con, "LEASE.HOLDERS", &k);
        assert_no_token(&reply, &tokens, "LEASE.HOLDERS");
        match &reply {
            Value::Array(entries) => {
                assert_eq!(entries.len(), 3, "{reply:?}");
                for e in entries {
                    assert_shape(proto, e, HOLDER_FIELDS.len(), "a LEASE.HOLDERS entry");
                }
            }
            other => panic!("LEASE.HOLDERS over {proto}: {other:?}"),
        }
        let listed = parse_holders(reply, "LEASE.HOLDERS");
        let shown: Vec<(u64, &str, Option<&str>, Option<&str>)> = listed
            .iter()
            .map(|h| {
                (
                    h.fence,
                    h.mode.as_str(),
                    h.owner.as_deref(),
                    h.session.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            shown,
            [
                (fx, "shared", Some("r-x"), None),
                (fy, "shared", None, None),
                (fz, "shared", Some("r-z"), None)
            ],
            "{proto}"
        );
        let ttls: Vec<i64> = listed.iter().map(|h| h.ttl).collect();
        assert!(ttls[0] > 5_000 && ttls[0] <= 10_000, "{ttls:?}");
        assert!(ttls[1] > 85_000 && ttls[1] <= 90_000, "{ttls:?}");
        assert!(ttls[2] > 40_000 && ttls[2] <= 45_000, "{ttls:?}");

        assert_eq!(release(&mut con, &k, tokens[1]), 1);
        let fw = Acquire::shared(&k, MINUTE).token(tokens[3]).take(&mut con);
        assert_eq!(holder_fences(&mut con, &k), [fx, fz, fw]);

        let e = key("ex");
        let fe = Acquire::exclusive(&e, MINUTE)
            .token(tokens[0])
            .owner("the writer")
            .take(&mut con);
        let listed = holders(&mut con, &e);
        assert_eq!(listed.len(), 1);
        assert_eq!(
            (
                listed[0].fence,
                listed[0].mode.as_str(),
                listed[0].owner.as_deref()
            ),
            (fe, "exclusive", Some("the writer"))
        );

        // No key, and a key with no live hold: an empty array.
        assert_eq!(
            call(&mut con, "LEASE.HOLDERS", key("missing")),
            Value::Array(vec![])
        );
        let replies: Vec<Value> = redis::pipe()
            .atomic()
            .add_command(Acquire::shared(&key("free"), 1).token("t").cmd())
            .cmd("DEBUG")
            .arg(("SLEEP", "0.01"))
            .cmd("LEASE.HOLDERS")
            .arg(key("free"))
            .query(&mut con)
            .unwrap_or_else(|e| panic!("MULTI: {e}"));
        assert!(grant(replies[0].clone(), "free").is_some());
        assert_eq!(
            replies[2],
            Value::Array(vec![]),
            "{proto}: only an expired hold"
        );

        // Other types.
        assert_ok(call(&mut con, "SET", (key("str"), "v")), "SET");
        assert_eq!(
            expect_error(&call(&mut con, "LEASE.HOLDERS", key("str")), "HOLDERS str"),
            WRONGTYPE
        );
        assert_eq!(
            int(call(&mut con, "LEASE.FENCE", (key("res"), 5))),
            5,
            "a resource record"
        );
        assert_eq!(
            expect_error(&call(&mut con, "LEASE.HOLDERS", key("res")), "HOLDERS res"),
            WRONGTYPE
        );
        // Arity.
        assert_eq!(
            expect_error(&call(&mut con, "LEASE.HOLDERS", NONE), "HOLDERS"),
            arity("lease.holders")
        );
        assert_eq!(
            expect_error(&call(&mut con, "LEASE.HOLDERS", (&k, &e)), "HOLDERS a b"),
            arity("lease.holders")
        );
    }
});

for_each_server!(lease_holders_is_readonly_with_a_key_spec, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();

    let reply = call(&mut con, "COMMAND", ("INFO", "LEASE.HOLDERS"));
    let Value::Array(entries) = reply else {
        panic!("COMMAND INFO LEASE.HOLDERS: {reply:?}");
    };
    let Some(Value::Array(entry)) = entries.into_iter().next() else {
        panic!("COMMAND INFO LEASE.HOLDERS: no entry");
    };
    assert_eq!(text(entry[0].clone()).to_ascii_lowercase(), "lease.holders");
    assert_eq!(entry[1], Value::Int(2), "arity");
    let flags = strings(entry[2].clone());
    assert!(flags.iter().any(|f| f == "readonly"), "{flags:?}");
    assert!(
        !flags.iter().any(|f| f == "write" || f == "denyoom"),
        "{flags:?}"
    );
    assert_eq!(
        entry[3..6].to_vec(),
        [Value::Int(1), Value::Int(1), Value::Int(1)],
        "first key, last key, step"
    );

    let getkeys = |con: &mut Connection, args: &[&str]| -> Vec<String> {
        strings(call(con, "COMMAND", ("GETKEYS", args)))
    };
    assert_eq!(getkeys(&mut con, &["LEASE.HOLDERS", "k"]), ["k"]);
    assert_eq!(
        getkeys(
            &mut con,
            &[
                "LEASE.ACQUIRE",
                "k",
                "100",
                "TOKEN",
                "t",
                "SHARED",
                "LIMIT",
                "3",
                "OWNER",
                "o",
                "BLOCK",
                "5"
            ]
        ),
        ["k"]
    );

    // A user who may only read a key may list its holders, not take a hold.
    assert_ok(
        call(
            &mut con,
            "ACL",
            (
                "SETUSER", "reader", "on", ">pw", "+@all", "%R~ro:*", "~rw:*",
            ),
        ),
        "ACL SETUSER",
    );
    Acquire::shared("ro:k", MINUTE).token("t").take(&mut con);
    let mut reader = harness::calls::login(&server, "reader");
    assert_eq!(holders(&mut reader, "ro:k").len(), 1);
    assert_eq!(info_of(&mut reader, "ro:k").holders, 1);
    let refused = Acquire::shared("ro:k", MINUTE)
        .token("u")
        .error(&mut reader);
    assert!(refused.starts_with("NOPERM"), "{refused}");
    assert_eq!(info_of(&mut con, "ro:k").holders, 1);
});

// ---------------------------------------------------------------------------------------
// BLOCK: first come, first served across modes
// ---------------------------------------------------------------------------------------

for_each_server!(
    a_shared_head_is_served_with_the_shared_waiters_behind_it,
    |flavor| {
        let server = Server::start(flavor);
        let mut con = server.client();
        let fx = Acquire::exclusive("k", MINUTE).token("x").take(&mut con);
        let s1 = queue(
            &server,
            &Acquire::shared("k", MINUTE)
                .token("s1")
                .owner("reader-1")
                .block(0),
            1,
        );
        let s2 = queue(
            &server,
            &Acquire::shared("k", MINUTE).token("s2").block(0),
            2,
        );
        let e1 = queue(
            &server,
            &Acquire::exclusive("k", MINUTE)
                .token("e1")
                .owner("writer")
                .block(0),
            3,
        );
        let s3 = queue(
            &server,
            &Acquire::shared("k", MINUTE).token("s3").block(0),
            4,
        );

        assert_eq!(release(&mut con, "k", "x"), 1);
        let f1 = granted_to(s1, "s1", "the shared head");
        let f2 = granted_to(s2, "s2", "the shared waiter right behind the head");
        assert!(fx < f1 && f1 < f2, "{fx} {f1} {f2}");
        let i = info_of(&mut con, "k");
        assert_eq!(
            (i.mode.as_deref(), i.holders, i.waiters),
            (Some("shared"), 2, 2),
            "the writer and the reader behind it still wait: {i:?}"
        );
        e1.assert_waiting("the writer behind two readers");
        s3.assert_waiting("a reader behind a waiting writer");
        assert_eq!(
            holds_still(&mut con, "k"),
            [
                (f1, "shared".to_string(), Some("reader-1".to_string())),
                (f2, "shared".to_string(), None)
            ]
        );

        assert_eq!(release(&mut con, "k", "s1"), 1);
        let i = info_of(&mut con, "k");
        assert_eq!((i.holders, i.waiters), (1, 2), "{i:?}");
        e1.assert_waiting("the writer while one reader holds");
        assert_eq!(release(&mut con, "k", "s2"), 1);
        let fe = granted_to(e1, "e1", "the writer once no hold is left");
        assert!(fe > f2);
        let i = info_of(&mut con, "k");
        assert_eq!(
            (
                i.mode.as_deref(),
                i.holders,
                i.waiters,
                i.owner.as_deref(),
                i.fence
            ),
            (Some("exclusive"), 1, 1, Some("writer"), fe),
            "{i:?}"
        );
        s3.assert_waiting("a reader behind the writer that now holds");

        assert_eq!(release(&mut con, "k", "e1"), 1);
        let f3 = granted_to(s3, "s3", "the last reader");
        assert!(f3 > fe);
        assert_eq!(release(&mut con, "k", "s3"), 1);
        assert!(!exists(&mut con, "k"));
        assert_eq!(lease_stat(&server, "waiters"), 0);
    }
);

for_each_server!(shared_waiters_are_served_while_the_limit_allows, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    let sem = |t: &str| Acquire::shared("sem", MINUTE).token(t).limit(3);
    for t in ["a", "b", "c"] {
        sem(t).take(&mut con);
    }
    let waiting: Vec<_> = ["d", "e", "f", "g"]
        .iter()
        .enumerate()
        .map(|(i, t)| queue(&server, &sem(t).block(0), i as i64 + 1))
        .collect();
    let mut waiting = waiting.into_iter();
    let (d, e, f, g) = (
        waiting.next().unwrap(),
        waiting.next().unwrap(),
        waiting.next().unwrap(),
        waiting.next().unwrap(),
    );

    // Three permits come free at once: the three first waiters are served together.
    let replies: Vec<Value> = redis::pipe()
        .atomic()
        .cmd("LEASE.RELEASE")
        .arg(("sem", "a"))
        .cmd("LEASE.RELEASE")
        .arg(("sem", "b"))
        .cmd("LEASE.RELEASE")
        .arg(("sem", "c"))
        .query(&mut con)
        .unwrap_or_else(|e| panic!("MULTI: {e}"));
    assert_eq!(replies, [Value::Int(1), Value::Int(1), Value::Int(1)]);
    let fd = granted_to(d, "d", "the first waiter");
    let fe = granted_to(e, "e", "the second waiter");
    let ff = granted_to(f, "f", "the third waiter");
    assert!(fd < fe && fe < ff, "served in order: {fd} {fe} {ff}");
    let i = info_of(&mut con, "sem");
    assert_eq!((i.holders, i.waiters, i.limit), (3, 1, Some(3)), "{i:?}");
    g.assert_waiting("the fourth waiter with every permit taken");

    assert_eq!(release(&mut con, "sem", "e"), 1);
    let fg = granted_to(g, "g", "the fourth waiter");
    assert!(fg > ff);
    assert_eq!(holder_fences(&mut con, "sem"), [fd, ff, fg]);
});

for_each_server!(an_exclusive_head_waits_until_no_hold_is_left, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    for t in ["a", "b", "c"] {
        Acquire::shared("k", MINUTE).token(t).take(&mut con);
    }
    let fc = info_of(&mut con, "k").fence;
    let w = queue(
        &server,
        &Acquire::exclusive("k", MINUTE).token("w").block(0),
        1,
    );
    for (t, left) in [("a", 2), ("b", 1)] {
        assert_eq!(release(&mut con, "k", t), 1);
        let i = info_of(&mut con, "k");
        assert_eq!((i.holders, i.waiters), (left, 1), "{i:?}");
        w.assert_waiting(&format!("the writer with {left} readers left"));
    }
    assert_eq!(renew(&mut con, "k", "c", MINUTE), 1);
    w.assert_waiting("the writer after the last reader renewed");
    assert_eq!(release(&mut con, "k", "c"), 1);
    let fw = granted_to(w, "w", "the writer");
    assert!(fw > fc);
    let i = info_of(&mut con, "k");
    assert_eq!(
        (i.mode.as_deref(), i.holders, i.waiters),
        (Some("exclusive"), 1, 0)
    );
});

for_each_server!(readers_do_not_starve_a_waiting_writer, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    let fa = Acquire::shared("k", MINUTE).token("a").take(&mut con);
    let w = queue(
        &server,
        &Acquire::exclusive("k", MINUTE).token("w").block(0),
        1,
    );

    // A stream of new readers gets nil, not a hold ahead of the writer.
    for i in 0..20 {
        Acquire::shared("k", MINUTE)
            .token(format!("r{i}"))
            .refused(&mut con);
    }
    Acquire::shared("k", MINUTE).refused(&mut con);
    // A reader that blocks queues behind the writer and times out there.
    let asked = Instant::now();
    Acquire::shared("k", MINUTE)
        .token("late")
        .block(200)
        .refused(&mut con);
    assert!(asked.elapsed() >= Duration::from_millis(190));
    // The holder's own retry is not a new hold: it is renewed.
    assert_eq!(
        Acquire::shared("k", MINUTE).token("a").fence(&mut con),
        Some(fa)
    );
    let i = info_of(&mut con, "k");
    assert_eq!((i.holders, i.waiters), (1, 1), "{i:?}");
    w.assert_waiting("the writer");

    assert_eq!(release(&mut con, "k", "a"), 1);
    let fw = granted_to(w, "w", "the writer");
    assert!(fw > fa);
});

for_each_server!(
    the_expiry_of_a_hold_serves_the_queue_at_its_deadline,
    |flavor| {
        let server = Server::start(flavor);
        let mut con = server.client();

        // A reader's hold expires; the writer behind it is served at its deadline.
        let fa = Acquire::shared("k", 300).token("a").take(&mut con);
        let w = queue(
            &server,
            &Acquire::exclusive("k", MINUTE).token("w").block(5_000),
            1,
        );
        let fw = granted_to(w, "w", "the writer after the reader's hold expired");
        let (deadline, served) = (fence_ms(fa) + 300, fence_ms(fw));
        assert!(
            served >= deadline,
            "served at {served} ms, before the deadline {deadline}"
        );
        assert!(
            served - deadline <= 150,
            "served {} ms late",
            served - deadline
        );

        // A permit of a semaphore expires; the waiter is served at its deadline.
        let fb = Acquire::shared("sem", 300)
            .token("b")
            .limit(1)
            .take(&mut con);
        let s = queue(
            &server,
            &Acquire::shared("sem", MINUTE)
                .token("s")
                .limit(1)
                .block(5_000),
            1,
        );
        let fs = granted_to(s, "s", "the waiter after the permit expired");
        let (deadline, served) = (fence_ms(fb) + 300, fence_ms(fs));
        assert!(
            served >= deadline,
            "served at {served} ms, before the deadline {deadline}"
        );
        assert!(
            served - deadline <= 150,
            "served {} ms late",
            served - deadline
        );

        // Two reads: the writer waits for the later deadline, not the first.
        let f1 = Acquire::shared("two", 300).token("r1").take(&mut con);
        let f2 = Acquire::shared("two", 700).token("r2").take(&mut con);
        let w = queue(
            &server,
            &Acquire::exclusive("two", MINUTE).token("w").block(5_000),
            1,
        );
        let fw = granted_to(w, "w", "the writer after both reads expired");
        let first = fence_ms(f1) + 300;
        let (deadline, served) = (fence_ms(f2) + 700, fence_ms(fw));
        assert!(
            served >= deadline,
            "served at {served} ms, before the second read's deadline {deadline} (first {first})"
        );
        assert!(
            served - deadline <= 150,
            "served {} ms late",
            served - deadline
        );

        // The earliest read released: the later one's deadline still serves the writer.
        Acquire::shared("rel", 200).token("r1").take(&mut con);
        let f2 = Acquire::shared("rel", 600).token("r2").take(&mut con);
        let w = queue(
            &server,
            &Acquire::exclusive("rel", MINUTE).token("w").block(5_000),
            1,
        );
        assert_eq!(release(&mut con, "rel", "r1"), 1);
        let fw = granted_to(w, "w", "the writer after the remaining read expired");
        let (deadline, served) = (fence_ms(f2) + 600, fence_ms(fw));
        assert!(
            served >= deadline,
            "served at {served} ms, before the remaining read's deadline {deadline}"
        );
        assert!(
            served - deadline <= 150,
            "served {} ms late",
            served - deadline
        );
    }
);

// ---------------------------------------------------------------------------------------
// Notifications and INFO
// ---------------------------------------------------------------------------------------

for_each_server!(keyspace_notifications_for_shared_holds, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    config_set(&mut con, "notify-keyspace-events", "Ed");
    config_set(&mut con, "lease.reap-hz", "100");
    let mut sub = server.client();
    let mut pubsub = sub.as_pubsub();
    pubsub.set_read_timeout(Some(WAIT)).unwrap();
    pubsub.psubscribe("__keyevent@0__:lease.*").unwrap();

    Acquire::shared("nk", MINUTE).token("a").take(&mut con);
    Acquire::shared("nk", MINUTE)
        .token("b")
        .owner("o")
        .take(&mut con);
    assert_eq!(renew(&mut con, "nk", "a", MINUTE), 1);
    assert_eq!(release(&mut con, "nk", "a"), 1);
    // Refusals notify nothing.
    Acquire::exclusive("nk", MINUTE)
        .token("w")
        .refused(&mut con);
    Acquire::shared("nk", MINUTE)
        .token("c")
        .limit(2)
        .error(&mut con);
    Acquire::exclusive("nk", MINUTE).token("b").error(&mut con);
    assert_eq!(renew(&mut con, "nk", "a", MINUTE), 0);
    assert_eq!(release(&mut con, "nk", "a"), 0);
    // One hold of two expires.
    Acquire::shared("ek", 50).token("x1").take(&mut con);
    Acquire::shared("ek", MINUTE).token("x2").take(&mut con);
    wait_until("x1's hold to be reaped", WAIT, || {
        lease_stat(&server, "expired") == 1
    });
    assert_eq!(release(&mut con, "nk", "b"), 1);

    let expected = [
        ("lease.acquire", "nk"),
        ("lease.acquire", "nk"),
        ("lease.renew", "nk"),
        ("lease.release", "nk"),
        ("lease.acquire", "ek"),
        ("lease.acquire", "ek"),
        ("lease.expire", "ek"),
        ("lease.release", "nk"),
    ];
    let mut seen = Vec::new();
    for _ in expected {
        let msg = pubsub
            .get_message()
            .unwrap_or_else(|e| panic!("no notification after {seen:?}: {e}"));
        let payload: String = msg.get_payload().unwrap();
        seen.push((msg.get_channel_name().to_string(), payload));
    }
    let expected: Vec<(String, String)> = expected
        .iter()
        .map(|(event, key)| (format!("__keyevent@0__:{event}"), key.to_string()))
        .collect();
    assert_eq!(seen, expected);
    // Nothing more: a marker published now is the next message.
    assert_eq!(
        int(call(
            &mut con,
            "PUBLISH",
            ("__keyevent@0__:lease.marker", "end")
        )),
        1
    );
    let msg = pubsub.get_message().expect("the marker");
    assert_eq!(msg.get_channel_name(), "__keyevent@0__:lease.marker");
});

for_each_server!(info_lease_counts_shared_holds, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    config_set(&mut con, "lease.reap-hz", "100");
    let gauge = || lease_stat(&server, "shared_holds");
    assert_eq!(gauge(), 0);

    for t in ["a", "b", "c"] {
        Acquire::shared("k1", MINUTE).token(t).take(&mut con);
    }
    for t in ["a", "b"] {
        Acquire::shared("k2", MINUTE)
            .token(t)
            .limit(2)
            .take(&mut con);
    }
    assert_eq!(gauge(), 5);
    Acquire::exclusive("k3", MINUTE).token("w").take(&mut con);
    assert_eq!(gauge(), 5, "an exclusive hold is not shared");
    Acquire::shared("k1", MINUTE).token("a").take(&mut con);
    assert_eq!(gauge(), 5, "a retry is not a new hold");
    Acquire::shared("k2", MINUTE)
        .token("c")
        .limit(2)
        .refused(&mut con);
    assert_eq!(gauge(), 5);

    assert_eq!(release(&mut con, "k1", "a"), 1);
    assert_eq!(gauge(), 4);
    Acquire::shared("k1", 500).token("short").take(&mut con);
    assert_eq!(gauge(), 5);
    wait_until("the short hold to be reaped", WAIT, || gauge() == 4);
    assert_eq!(lease_stat(&server, "expired"), 1);
    assert_eq!(int(call(&mut con, "DEL", "k2")), 1);
    assert_eq!(gauge(), 2, "DEL of a key with two shared holds");
    assert_eq!(release(&mut con, "k3", "w"), 1);
    Acquire::shared("k3", MINUTE).token("r").take(&mut con);
    assert_eq!(gauge(), 3, "a shared hold after an exclusive one");
    assert_ok(call(&mut con, "FLUSHALL", NONE), "FLUSHALL");
    // Valkey 9 flushes lazily by default (lazyfree-lazy-user-flush): the values, and the
    // holds they count, are freed in the background.
    wait_until("FLUSHALL to free the values", WAIT, || gauge() == 0);
    assert_eq!(lease_stat(&server, "keys"), 0);
});

// ---------------------------------------------------------------------------------------
// Eviction (as tests/eviction.rs, for a key with shared holds)
// ---------------------------------------------------------------------------------------

const EVICTION_REFUSED: &str = "ERR lease refused: maxmemory-policy";
const EVICTION_WARNING: &str = "redis-lease: maxmemory eviction deleted the";

/// A key with three shared holds (two with owners) under LIMIT 5, made under
/// `noeviction`; their fences and owners.
fn seed_shared(con: &mut Connection) -> Vec<(u64, String, Option<String>)> {
    assert_eq!(config_get(con, "maxmemory-policy"), "noeviction");
    for (t, owner) in [
        ("r1", Some("reader-1")),
        ("r2", None),
        ("r3", Some("reader-3")),
    ] {
        let mut a = Acquire::shared("lock:rw", 600_000).token(t).limit(5);
        if let Some(o) = owner {
            a = a.owner(o);
        }
        a.take(con);
    }
    holds_still(con, "lock:rw")
}

fn eviction_warnings(server: &Server) -> Vec<String> {
    server
        .log()
        .lines()
        .filter(|l| l.contains(EVICTION_WARNING))
        .map(str::to_string)
        .collect()
}

for_each_server!(eviction_refuse_grants_no_shared_hold, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    let seeded = seed_shared(&mut con);
    arm(&mut con, "refuse");
    let refused = lease_stat(&server, "acquires_refused_for_eviction");
    for a in [
        Acquire::shared("lock:rw", MINUTE).token("r4").limit(5),
        Acquire::shared("lock:new", MINUTE).token("r"),
        Acquire::shared("lock:new", MINUTE).token("r").limit(2),
    ] {
        let e = a.error(&mut con);
        assert!(e.starts_with(EVICTION_REFUSED), "`{}`: {e}", a.what());
    }
    assert_eq!(
        lease_stat(&server, "acquires_refused_for_eviction"),
        refused + 3
    );
    assert_eq!(key_type(&mut con, "lock:new"), "none");
    assert_eq!(holds_still(&mut con, "lock:rw"), seeded);
    // Holders still renew and release.
    assert_eq!(renew(&mut con, "lock:rw", "r1", 600_000), 1);
    assert_eq!(release(&mut con, "lock:rw", "r3"), 1);
    assert_eq!(info_of(&mut con, "lock:rw").holders, 2);
    assert_eq!(lease_stat(&server, "shared_holds"), 2);
});

for_each_server!(eviction_restore_puts_every_shared_hold_back, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    let seeded = seed_shared(&mut con);
    let granted = Instant::now();
    if flavor == Flavor::Redis7 {
        // No post-notification jobs on Redis 7.0: the mode is refused at CONFIG SET.
        let reply = call(
            &mut con,
            "CONFIG",
            ("SET", "lease.allkeys-eviction", "restore"),
        );
        let e = expect_error(&reply, "CONFIG SET lease.allkeys-eviction restore");
        assert!(e.contains("post-notification jobs"), "{e}");
        return;
    }
    arm(&mut con, "restore");
    let evicted = fill_until(&mut con, |c| info_on(c, "lease", "lease_evicted") > 0);
    config_set(&mut con, "maxmemory", "0");
    assert!(evicted, "five rounds of writes never evicted lock:rw");
    assert!(info_on(&mut con, "stats", "evicted_keys") > 0);

    assert_eq!(
        lease_stat(&server, "restored"),
        lease_stat(&server, "evicted")
    );
    assert_eq!(
        holds_still(&mut con, "lock:rw"),
        seeded,
        "every hold, as it was"
    );
    let waited = granted.elapsed().as_millis() as i64;
    for h in holders(&mut con, "lock:rw") {
        assert!(
            h.ttl > 0 && h.ttl <= 600_000 - waited + 5,
            "a restore keeps the deadline: {h:?} after {waited} ms"
        );
    }
    let i = info_of(&mut con, "lock:rw");
    assert_eq!(
        (i.mode.as_deref(), i.holders, i.limit),
        (Some("shared"), 3, Some(5)),
        "{i:?}"
    );
    assert_eq!(lease_stat(&server, "shared_holds"), 3);
    assert!(
        eviction_warnings(&server).is_empty(),
        "restore logs no loss"
    );
    for t in ["r1", "r2", "r3"] {
        assert_eq!(renew(&mut con, "lock:rw", t, 600_000), 1, "{t}");
    }
    assert_eq!(
        Acquire::exclusive("lock:rw", MINUTE)
            .token("w")
            .error(&mut con),
        limit_mismatch(Some(5)),
        "an exclusive ask states no limit"
    );
    assert_eq!(
        Acquire::shared("lock:rw", MINUTE)
            .token("r4")
            .limit(6)
            .error(&mut con),
        limit_mismatch(Some(5))
    );
    Acquire::shared("lock:rw", MINUTE)
        .token("r4")
        .limit(5)
        .take(&mut con);
});

for_each_server!(eviction_allow_counts_and_logs_a_lost_shared_key, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    let seeded = seed_shared(&mut con);
    let top = seeded.iter().map(|h| h.0).max().unwrap_or(0);
    arm(&mut con, "allow");
    Acquire::shared("lock:rw", 600_000)
        .token("r4")
        .limit(5)
        .take(&mut con);
    let gone = fill_until(&mut con, |c| !exists(c, "lock:rw"));
    config_set(&mut con, "maxmemory", "0");
    assert!(gone, "five rounds of writes never evicted lock:rw");

    let counted = lease_stat(&server, "evicted");
    assert!(
        counted == 1 || counted == 4,
        "one key of four holds lost: lease_evicted {counted}"
    );
    let warnings = eviction_warnings(&server);
    assert!(
        warnings.iter().any(|w| w.contains("key 'lock:rw'")),
        "no warning names lock:rw: {warnings:?}"
    );
    assert_eq!(lease_stat(&server, "restored"), 0);
    assert_eq!(lease_stat(&server, "shared_holds"), 0);
    assert_eq!(lease_stat(&server, "keys"), 0);
    for t in ["r1", "r2", "r3", "r4"] {
        assert_eq!(renew(&mut con, "lock:rw", t, MINUTE), 0, "{t}");
    }
    let fresh = Acquire::shared("lock:rw", MINUTE)
        .token("n")
        .limit(2)
        .take(&mut con);
    assert!(fresh > top);
});

// ---------------------------------------------------------------------------------------
// The queue when its head leaves, and the key's life around the holds
// ---------------------------------------------------------------------------------------

/// `acquire` (which must block) on a bare socket the test can close; returns once
/// `LEASE.INFO` counts it as the `position`th waiter.
fn raw_waiter(server: &Server, acquire: &Acquire, position: i64) -> TcpStream {
    let mut stream = TcpStream::connect(("127.0.0.1", server.port))
        .unwrap_or_else(|e| panic!("cannot connect to {}: {e}", server.flavor));
    stream
        .write_all(&acquire.cmd().get_packed_command())
        .unwrap_or_else(|e| panic!("cannot send on a raw socket: {e}"));
    wait_for_waiters(&mut server.client(), &acquire.key, position);
    stream
}

for_each_server!(
    a_writer_leaving_the_head_lets_the_readers_behind_it_in,
    |flavor| {
        let server = Server::start(flavor);
        let mut con = server.client();
        for how in ["timeout", "CLIENT UNBLOCK", "disconnect"] {
            let key = format!("k:{how}");
            let fa = Acquire::shared(&key, MINUTE).token("a").take(&mut con);
            let writer = Acquire::exclusive(&key, MINUTE).token("w");
            let reader = Acquire::shared(&key, MINUTE).token("r").block(0);
            let left = match how {
                "timeout" => {
                    let w = queue(&server, &writer.clone().block(300), 1);
                    let r = queue(&server, &reader, 2);
                    let (reply, at) = w.reply(WAIT, "the writer's timeout");
                    assert_eq!(reply, Value::Nil, "{how}");
                    (r, at)
                }
                "CLIENT UNBLOCK" => {
                    let w = queue(&server, &writer.clone().block(0), 1);
                    let r = queue(&server, &reader, 2);
                    let unblocked = call(&mut con, "CLIENT", ("UNBLOCK", w.client_id));
                    assert_eq!(unblocked, Value::Int(1), "{how}");
                    let (reply, at) = w.reply(WAIT, "the unblocked writer");
                    assert_eq!(reply, Value::Nil, "{how}");
                    (r, at)
                }
                _ => {
                    let w = raw_waiter(&server, &writer.clone().block(0), 1);
                    let r = queue(&server, &reader, 2);
                    w.shutdown(Shutdown::Both).expect("shutdown");
                    drop(w);
                    (r, Instant::now())
                }
            };
            let (r, gone) = left;
            // The reader is now the head, and a reader's hold is all there is: it is
            // served without waiting for a's hold to end.
            let (reply, at) = r.reply(WAIT, &format!("the reader after the writer's {how}"));
            let (token, fr) = grant(reply, how).unwrap_or_else(|| panic!("{how}: nil"));
            assert_eq!(token, b"r");
            assert!(fr > fa, "{how}");
            assert!(
                at.saturating_duration_since(gone) < Duration::from_secs(1),
                "{how}: the reader was served {:?} after the writer left",
                at.saturating_duration_since(gone)
            );
            let i = info_of(&mut con, &key);
            assert_eq!((i.holders, i.waiters), (2, 0), "{how}: {i:?}");
        }
        assert_eq!(lease_stat(&server, "waiters"), 0);
    }
);

for_each_server!(
    del_and_overwrite_answer_a_shared_group_of_waiters,
    |flavor| {
        let server = Server::start(flavor);
        let mut con = server.client();

        // DEL: the readers at the head are served together; the writer behind them waits.
        let fx = Acquire::exclusive("k", MINUTE).token("x").take(&mut con);
        let s1 = queue(
            &server,
            &Acquire::shared("k", MINUTE).token("s1").block(0),
            1,
        );
        let s2 = queue(
            &server,
            &Acquire::shared("k", MINUTE).token("s2").block(0),
            2,
        );
        let e = queue(
            &server,
            &Acquire::exclusive("k", MINUTE).token("e").block(0),
            3,
        );
        assert_eq!(int(call(&mut con, "DEL", "k")), 1);
        let f1 = granted_to(s1, "s1", "the first reader after DEL");
        let f2 = granted_to(s2, "s2", "the second reader after DEL");
        assert!(fx < f1 && f1 < f2);
        let i = info_of(&mut con, "k");
        assert_eq!((i.holders, i.waiters), (2, 1), "{i:?}");
        e.assert_waiting("the writer behind the readers");
        assert_eq!(
            renew(&mut con, "k", "x", MINUTE),
            0,
            "x's hold went with DEL"
        );
        assert_eq!(lease_stat(&server, "shared_holds"), 2);

        // Overwritten by a string: every waiter is answered WRONGTYPE, every hold is gone.
        let w2 = queue(
            &server,
            &Acquire::exclusive("k", MINUTE).token("e2").block(0),
            2,
        );
        assert_ok(call(&mut con, "SET", ("k", "v")), "SET over a shared key");
        for (w, name) in [(e, "e"), (w2, "e2")] {
            let (reply, _) = w.reply(WAIT, name);
            let error = expect_error(&reply, name);
            assert!(error.starts_with("WRONGTYPE"), "{name}: {error}");
        }
        assert_eq!(lease_stat(&server, "shared_holds"), 0);
        assert_eq!(lease_stat(&server, "keys"), 0);
        assert_eq!(lease_stat(&server, "waiters"), 0);
    }
);

for_each_server!(
    keyspace_commands_keep_the_shared_holds_and_the_gauge,
    |flavor| {
        let server = Server::start(flavor);
        let mut con = server.client();
        let gauge = || lease_stat(&server, "shared_holds");
        for t in ["a", "b", "c"] {
            Acquire::shared("k", MINUTE)
                .token(t)
                .limit(4)
                .owner(format!("owner-{t}"))
                .take(&mut con);
        }
        let shape = holds_still(&mut con, "k");
        assert_eq!(gauge(), 3);

        // COPY of a lease is refused, as in version 1.
        assert!(error_text(&call(&mut con, "COPY", ("k", "k2"))).is_some());
        assert_eq!(gauge(), 3);
        assert!(!exists(&mut con, "k2"));

        assert_ok(call(&mut con, "RENAME", ("k", "k2")), "RENAME");
        assert_eq!(holds_still(&mut con, "k2"), shape, "after RENAME");
        assert_eq!(renew(&mut con, "k2", "b", MINUTE), 1);
        assert_eq!(gauge(), 3);
        assert_eq!(int(call(&mut con, "MOVE", ("k2", 1))), 1);
        assert_eq!(gauge(), 3);
        assert_ok(call(&mut con, "SWAPDB", (0, 1)), "SWAPDB");
        assert_eq!(holds_still(&mut con, "k2"), shape, "after MOVE and SWAPDB");
        assert_eq!(info_of(&mut con, "k2").limit, Some(4));
        assert_eq!(gauge(), 3);

        // RESTORE REPLACE with a key of one hold: the gauge drops by the two replaced.
        Acquire::shared("one", MINUTE).token("o").take(&mut con);
        let payload = harness::lease::dump(&mut con, "one").payload();
        assert_eq!(gauge(), 4);
        assert_ok(
            call(&mut con, "RESTORE", ("k2", 0, &payload[..], "REPLACE")),
            "RESTORE REPLACE",
        );
        assert_eq!(gauge(), 2);
        assert_eq!(
            renew(&mut con, "k2", "a", MINUTE),
            0,
            "a's hold was replaced"
        );
        assert_eq!(renew(&mut con, "k2", "o", MINUTE), 1);

        // Overwritten, unlinked, flushed.
        assert_ok(call(&mut con, "SET", ("one", "v")), "SET");
        assert_eq!(gauge(), 1);
        assert_eq!(int(call(&mut con, "UNLINK", "k2")), 1);
        wait_until("UNLINK to free the value", WAIT, || gauge() == 0);
        for t in ["a", "b"] {
            Acquire::shared("f", MINUTE).token(t).take(&mut con);
        }
        assert_eq!(gauge(), 2);
        assert_ok(call(&mut con, "FLUSHDB", "ASYNC"), "FLUSHDB ASYNC");
        wait_until("FLUSHDB ASYNC to free the values", WAIT, || gauge() == 0);
        assert_eq!(lease_stat(&server, "keys"), 0);
    }
);

for_each_server!(a_thousand_shared_holds_on_one_key, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    config_set(&mut con, "lease.reap-hz", "100");
    config_set(&mut con, "lease.reap-batch", "100");
    Acquire::shared("k", MINUTE).token("t0").take(&mut con);
    let one = int(call(&mut con, "MEMORY", ("USAGE", "k")));

    let mut pipe = redis::pipe();
    for i in 1..1_000 {
        pipe.add_command(
            Acquire::shared("k", 1_000)
                .token(format!("t{i}"))
                .owner(format!("worker-{i}"))
                .cmd(),
        );
    }
    let replies: Vec<Value> = pipe.query(&mut con).expect("999 acquires");
    let mut fences = Vec::new();
    for (i, r) in replies.into_iter().enumerate() {
        let (_, f) = grant(r, "a pipelined shared acquire")
            .unwrap_or_else(|| panic!("acquire {} answered nil", i + 1));
        fences.push(f);
    }
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "fences rise");
    let listed = holders(&mut con, "k");
    assert_eq!(listed.len(), 1_000);
    assert_eq!(
        listed[1..].iter().map(|h| h.fence).collect::<Vec<_>>(),
        fences
    );
    assert_eq!(listed[999].owner.as_deref(), Some("worker-999"));
    let many = int(call(&mut con, "MEMORY", ("USAGE", "k")));
    assert!(
        many > one + 999 * 8,
        "MEMORY USAGE counts the holds: {one} bytes with one, {many} with a thousand"
    );
    assert_eq!(lease_stat(&server, "shared_holds"), 1_000);

    // They expire together; the reaper takes them in batches; t0 stays.
    wait_until("999 holds to be reaped", WAIT, || {
        lease_stat(&server, "expired") == 999
    });
    assert_eq!(holders(&mut con, "k").len(), 1);
    assert_eq!(lease_stat(&server, "shared_holds"), 1);
    assert_eq!(renew(&mut con, "k", "t0", MINUTE), 1);
    assert_eq!(renew(&mut con, "k", "t5", MINUTE), 0);
});

for_each_server!(
    an_expiring_writer_hands_over_to_a_group_of_readers,
    |flavor| {
        let server = Server::start(flavor);
        let mut con = server.client();
        let fx = Acquire::exclusive("k", 300).token("x").take(&mut con);
        let r1 = queue(
            &server,
            &Acquire::shared("k", MINUTE).token("r1").block(5_000),
            1,
        );
        let r2 = queue(
            &server,
            &Acquire::shared("k", MINUTE).token("r2").block(5_000),
            2,
        );
        let f1 = granted_to(r1, "r1", "the first reader at the writer's deadline");
        let f2 = granted_to(r2, "r2", "the second reader at the writer's deadline");
        let deadline = fence_ms(fx) + 300;
        for f in [f1, f2] {
            let served = fence_ms(f);
            assert!(
                served >= deadline,
                "served at {served}, deadline {deadline}"
            );
            assert!(
                served - deadline <= 150,
                "served {} ms late",
                served - deadline
            );
        }
        let i = info_of(&mut con, "k");
        assert_eq!(
            (i.mode.as_deref(), i.holders, i.waiters),
            (Some("shared"), 2, 0)
        );
    }
);

for_each_server!(shared_acquires_in_transactions_and_scripts, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    Acquire::exclusive("busy", MINUTE).token("x").take(&mut con);

    // MULTI: BLOCK does not block; each grant takes its own rising fence. Sent one by
    // one, so that EXEC's array keeps the error reply in its place.
    assert_ok(call(&mut con, "MULTI", NONE), "MULTI");
    for a in [
        Acquire::shared("m", MINUTE).token("a"),
        Acquire::shared("m", MINUTE).token("b").owner("o"),
        Acquire::shared("m", MINUTE),
        Acquire::shared("busy", MINUTE).token("c").block(0),
        Acquire::exclusive("m", MINUTE).token("a"),
    ] {
        assert_eq!(text(a.send(&mut con)), "QUEUED");
    }
    let replies = match call(&mut con, "EXEC", NONE) {
        Value::Array(replies) => replies,
        other => panic!("EXEC: {other:?}"),
    };
    assert_eq!(replies.len(), 5, "{replies:?}");
    let fences: Vec<u64> = replies[..3]
        .iter()
        .map(|r| grant(r.clone(), "in MULTI").expect("granted").1)
        .collect();
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
    assert_eq!(replies[3], Value::Nil, "BLOCK inside MULTI does not block");
    assert_eq!(
        expect_error(&replies[4], "the other mode in MULTI"),
        OTHER_MODE_ERR
    );
    assert_eq!(holder_fences(&mut con, "m"), fences);

    // A script: a semaphore taken to its limit.
    let script = r#"
        local got = {}
        for i = 1, 4 do
            local g = redis.call('LEASE.ACQUIRE', KEYS[1], 60000, 'TOKEN', 'p' .. i,
                'SHARED', 'LIMIT', 3, 'OWNER', 'lua')
            if g then got[#got + 1] = g[2] else got[#got + 1] = 0 end
        end
        return got
    "#;
    let reply = call(&mut con, "EVAL", (script, 1, "sem"));
    let Value::Array(items) = reply else {
        panic!("EVAL: {reply:?}");
    };
    let got: Vec<i64> = items.into_iter().map(int).collect();
    assert!(got[0] > 0 && got[0] < got[1] && got[1] < got[2], "{got:?}");
    assert_eq!(got[3], 0, "the fourth permit of three: nil");
    let i = info_of(&mut con, "sem");
    assert_eq!((i.holders, i.limit), (3, Some(3)));
    assert!(holders(&mut con, "sem")
        .iter()
        .all(|h| h.owner.as_deref() == Some("lua")));
});

for_each_server!(a_flush_or_swap_serves_a_shared_group_of_waiters, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    let ops: [&[&str]; 3] = [&["FLUSHALL"], &["FLUSHDB", "ASYNC"], &["SWAPDB", "0", "1"]];
    for op in ops {
        let what = op.join(" ");
        let fx = Acquire::exclusive("k", MINUTE).token("x").take(&mut con);
        let s1 = queue(
            &server,
            &Acquire::shared("k", MINUTE).token("s1").block(0),
            1,
        );
        let s2 = queue(
            &server,
            &Acquire::shared("k", MINUTE).token("s2").block(0),
            2,
        );
        let e = queue(
            &server,
            &Acquire::exclusive("k", MINUTE).token("e").block(0),
            3,
        );
        call(&mut con, op[0], &op[1..]);
        let f1 = granted_to(s1, "s1", &format!("the first reader after {what}"));
        let f2 = granted_to(s2, "s2", &format!("the second reader after {what}"));
        assert!(fx < f1 && f1 < f2, "{what}");
        let i = info_of(&mut con, "k");
        assert_eq!((i.holders, i.waiters), (2, 1), "{what}: {i:?}");
        e.assert_waiting(&format!("the writer after {what}"));
        assert_eq!(release(&mut con, "k", "s1"), 1);
        assert_eq!(release(&mut con, "k", "s2"), 1);
        granted_to(e, "e", &format!("the writer after {what}"));
        assert_ok(call(&mut con, "FLUSHALL", "SYNC"), "FLUSHALL SYNC");
        wait_until("every lease value freed", WAIT, || {
            lease_stat(&server, "keys") == 0
        });
        assert_eq!(lease_stat(&server, "shared_holds"), 0, "{what}");
    }
});

for_each_server!(
    a_reader_leaving_the_middle_of_a_group_is_skipped,
    |flavor| {
        let server = Server::start(flavor);
        let mut con = server.client();
        Acquire::exclusive("k", MINUTE).token("x").take(&mut con);
        let s1 = queue(
            &server,
            &Acquire::shared("k", MINUTE).token("s1").block(0),
            1,
        );
        let s2 = queue(
            &server,
            &Acquire::shared("k", MINUTE).token("s2").block(0),
            2,
        );
        let s3 = queue(
            &server,
            &Acquire::shared("k", MINUTE).token("s3").block(0),
            3,
        );
        let s4 = raw_waiter(
            &server,
            &Acquire::shared("k", MINUTE).token("s4").block(0),
            4,
        );
        let s5 = queue(
            &server,
            &Acquire::shared("k", MINUTE).token("s5").block(0),
            5,
        );
        assert_eq!(
            call(&mut con, "CLIENT", ("UNBLOCK", s2.client_id)),
            Value::Int(1)
        );
        assert_eq!(s2.reply(WAIT, "s2 unblocked").0, Value::Nil);
        s4.shutdown(Shutdown::Both).expect("shutdown");
        drop(s4);
        wait_for_waiters(&mut con, "k", 3);
        assert_eq!(release(&mut con, "k", "x"), 1);
        let fences = [
            granted_to(s1, "s1", "s1"),
            granted_to(s3, "s3", "s3"),
            granted_to(s5, "s5", "s5"),
        ];
        assert_eq!(holder_fences(&mut con, "k"), fences);
        let i = info_of(&mut con, "k");
        assert_eq!((i.holders, i.waiters), (3, 0), "{i:?}");
        assert_eq!(lease_stat(&server, "waiters"), 0);
    }
);

for_each_server!(grants_to_waiters_are_notified, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    config_set(&mut con, "notify-keyspace-events", "Ed");
    Acquire::exclusive("k", MINUTE).token("x").take(&mut con);
    let s1 = queue(
        &server,
        &Acquire::shared("k", MINUTE).token("s1").block(0),
        1,
    );
    let s2 = queue(
        &server,
        &Acquire::shared("k", MINUTE).token("s2").block(0),
        2,
    );
    let mut sub = server.client();
    let mut pubsub = sub.as_pubsub();
    pubsub.set_read_timeout(Some(WAIT)).unwrap();
    pubsub.psubscribe("__keyevent@0__:lease.*").unwrap();
    assert_eq!(release(&mut con, "k", "x"), 1);
    granted_to(s1, "s1", "s1");
    granted_to(s2, "s2", "s2");
    let mut seen = Vec::new();
    for _ in 0..3 {
        let msg = pubsub
            .get_message()
            .unwrap_or_else(|e| panic!("no notification after {seen:?}: {e}"));
        let payload: String = msg.get_payload().unwrap();
        seen.push((msg.get_channel_name().to_string(), payload));
    }
    let expected: Vec<(String, String)> = ["lease.release", "lease.acquire", "lease.acquire"]
        .iter()
        .map(|e| (format!("__keyevent@0__:{e}"), "k".to_string()))
        .collect();
    assert_eq!(seen, expected);
});

for_each_server!(eviction_restore_keeps_the_queue_of_a_shared_key, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    if flavor == Flavor::Redis7 {
        // No post-notification jobs on Redis 7.0: the mode is refused at CONFIG SET.
        let reply = call(
            &mut con,
            "CONFIG",
            ("SET", "lease.allkeys-eviction", "restore"),
        );
        let e = expect_error(&reply, "CONFIG SET lease.allkeys-eviction restore");
        assert!(e.contains("post-notification jobs"), "{e}");
        return;
    }
    let f1 = Acquire::shared("lock:q", 600_000)
        .token("q1")
        .take(&mut con);
    let f2 = Acquire::shared("lock:q", 600_000)
        .token("q2")
        .owner("reader-2")
        .take(&mut con);
    let seeded = holds_still(&mut con, "lock:q");
    let w = queue(
        &server,
        &Acquire::exclusive("lock:q", MINUTE).token("w").block(0),
        1,
    );
    arm(&mut con, "restore");
    let evicted = fill_until(&mut con, |c| info_on(c, "lease", "lease_evicted") > 0);
    config_set(&mut con, "maxmemory", "0");
    assert!(evicted, "five rounds of writes never evicted lock:q");
    assert_eq!(
        lease_stat(&server, "restored"),
        lease_stat(&server, "evicted")
    );

    // The holds are back, and the writer still waits behind them: an eviction that was
    // undone is not a DEL that hands the key to the queue.
    assert_eq!(holds_still(&mut con, "lock:q"), seeded);
    let i = info_of(&mut con, "lock:q");
    assert_eq!((i.holders, i.waiters), (2, 1), "{i:?}");
    w.assert_waiting("the writer after the eviction was undone");
    assert_eq!(release(&mut con, "lock:q", "q1"), 1);
    w.assert_waiting("the writer with one reader left");
    assert_eq!(release(&mut con, "lock:q", "q2"), 1);
    let fw = granted_to(w, "w", "the writer once both readers released");
    assert!(fw > f1 && fw > f2);
});
