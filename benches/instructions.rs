//! Instructions per command: redis-lease against the `SET NX PX` + Lua (EVALSHA) way,
//! counted by callgrind inside the server (issue 6).
//!
//! `scripts/bench` measures what the targets are about, server time per call, but on a
//! shared two-core machine that moves by tens of percent from run to run. The
//! instructions a command executes do not: the same commands on the same server count
//! the same to under 1% for most steps, a few percent for some (incremental rehashing
//! and the allocator's state fall differently). So this is the check CI runs on every
//! change:
//! `scripts/test` runs it on each server and fails when a ratio crosses its bound. The
//! bounds guard what has been reached; they are not the targets.
//!
//! Each server runs under `valgrind --tool=callgrind`. For each step the counters are
//! zeroed, `n` commands are sent in pipelines (every reply checked), and the counters
//! are dumped. A command's cost is the inclusive cost of the server's `call()`: the
//! command, what it replicates, the server's bookkeeping around it; not reading the
//! request or writing the reply to the socket. Both ways are counted the same way, one
//! step after the other, on the same server: leases in database 0, strings in database 1.
//!
//! Shared holds (issue 16) are counted the same way against a semaphore built the usual
//! way, a sorted set of tokens scored by deadline (`EVALSHA` of `ZREMRANGEBYSCORE`
//! expired, `ZCARD`, `ZADD` to acquire; `ZSCORE` then `ZADD XX` to renew; `ZREM` to
//! release): one hold acquired, renewed and released among 1, 100 and 10,000 holds on its
//! key. CI also checks that RENEW and RELEASE of one shared hold among 10,000 count at
//! most twice what they count with the hold alone.
//!
//! Sessions (issue 17) are counted last: `LEASE.RENEW` of a session with no hold bound to
//! it and with 100,000 bound (ttl 0), and `LEASE.ACQUIRE … SESSION` against a plain
//! `LEASE.ACQUIRE`, both on fresh keys. The 100,000 holds are bound with callgrind's
//! instrumentation off (set-up, not counted, and several times faster so). CI checks that
//! the session's RENEW with 100,000 bound holds counts at most 5% more than with none, and
//! that an ACQUIRE with SESSION counts at most 1.5 times a plain one.
//!
//! Issue 27 adds three things. The servers' own compare-and-set commands, where a server
//! has them (found by trying them): `SET key token IFEQ token PX ttl` to renew and
//! `DELIFEQ key token` (or Redis 8.4's `DELEX key IFEQ token`) to release, counted like
//! the rest, and ratios of redis-lease over them. Beside each `call()` count, the whole
//! process's count for the step per command (parsing, command filters, replies; the
//! servers' clock-driven timers left out). And the tax on other commands: the same
//! binary without the module and with it, idle and among 100,000 live leases, counting
//! `PING`, `GET`, `SET`, `SET PX`, `DEL`, `INCR`, `EXPIRE` and a transaction of them.
//! CI holds every ratio at today's figure plus a margin; the report states the issue's
//! goal beside each.
//!
//! Usage: `cargo bench --bench instructions -- [--servers LIST] [--calls N]
//! [--shared-calls N] [--session-calls N] [--tax-calls N] [--out FILE]` (`scripts/instructions` installs
//! valgrind and the servers, then runs this).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use harness::resp::{decimal, encode, Conn, Reply};
use harness::workload::{
    acquire, acquire_bound, acquire_shared, drive, eval_release, eval_renew, is_one, key,
    load_scripts, load_sem_scripts, release, renew, sem_acquire, sem_release, sem_renew,
    server_version, set_nx_px, supports_sessions, supports_shared, token, Layout, Scripts,
    SemScripts, CHUNK, COUNTER_KEYS,
};
use harness::{Flavor, Server, ServerOptions};

const TTL: &[u8] = b"3600000";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Step {
    Acquire,
    Renew,
    Release,
    SetNxPx,
    EvalRenew,
    EvalRelease,
    SetIfeqPx,
    DelIfeq,
    Incr,
    Fence,
    FenceIncr,
}

impl Step {
    /// In the order they run: each way's renewals and releases find its grants.
    const ALL: [Step; 11] = [
        Step::Acquire,
        Step::Renew,
        Step::Release,
        Step::SetNxPx,
        Step::EvalRenew,
        Step::EvalRelease,
        Step::SetIfeqPx,
        Step::DelIfeq,
        Step::Incr,
        Step::Fence,
        Step::FenceIncr,
    ];

    fn label(self) -> &'static str {
        match self {
            Step::Acquire => "LEASE.ACQUIRE key ttl TOKEN token",
            Step::Renew => "LEASE.RENEW key token ttl",
            Step::Release => "LEASE.RELEASE key token",
            Step::SetNxPx => "SET key token NX PX ttl",
            Step::EvalRenew => "EVALSHA compare-and-pexpire",
            Step::EvalRelease => "EVALSHA compare-and-delete",
            Step::SetIfeqPx => "SET key token IFEQ token PX ttl",
            Step::DelIfeq => "DELIFEQ key token",
            Step::Incr => "INCR counter",
            Step::Fence => "LEASE.FENCE resource fence",
            Step::FenceIncr => "LEASE.FENCE resource fence INCR counter",
        }
    }

    fn db(self) -> &'static str {
        match self {
            Step::SetNxPx
            | Step::EvalRenew
            | Step::EvalRelease
            | Step::SetIfeqPx
            | Step::DelIfeq
            | Step::Incr => "1",
            _ => "0",
        }
    }

    /// Why the step is not counted on a server without `natives`, or `None` when it is.
    fn missing(self, natives: Natives) -> Option<&'static str> {
        match self {
            Step::SetIfeqPx if !natives.set_ifeq => Some("no `SET … IFEQ`"),
            Step::DelIfeq if natives.del_ifeq.is_none() => Some("no `DELIFEQ` or `DELEX … IFEQ`"),
            _ => None,
        }
    }
}

/// The server's own compare-and-set commands, where it has them: `SET key value IFEQ
/// old` (Valkey 8.1, Redis 8.4) and compare-and-delete as `DELIFEQ key value` (Valkey
/// 9.0) or `DELEX key IFEQ value` (Redis 8.4). Found by trying them, not from the
/// version string.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Natives {
    set_ifeq: bool,
    del_ifeq: Option<DelIfeq>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum DelIfeq {
    /// `DELIFEQ key value`.
    Delifeq,
    /// `DELEX key IFEQ value`.
    Delex,
}

impl DelIfeq {
    fn args<'a>(self, k: &'a [u8], t: &'a [u8]) -> Vec<&'a [u8]> {
        match self {
            DelIfeq::Delifeq => vec![b"DELIFEQ", k, t],
            DelIfeq::Delex => vec![b"DELEX", k, b"IFEQ", t],
        }
    }
}

/// Tries each native on a scratch key of the current database, and deletes it after.
fn natives(conn: &mut Conn) -> Natives {
    let (k, t): (&[u8], &[u8]) = (b"native:probe", b"probe-token");
    let mut call = |args: &[&[u8]]| {
        conn.call(args)
            .unwrap_or_else(|e| panic!("probing the natives: {e}"))
    };
    assert!(call(&[b"SET", k, t]).is_ok(), "SET of the probe key");
    let set_ifeq = call(&[b"SET", k, t, b"IFEQ", t, b"PX", TTL]).is_ok();
    let mut del_ifeq = None;
    for form in [DelIfeq::Delifeq, DelIfeq::Delex] {
        assert!(call(&[b"SET", k, t]).is_ok(), "SET of the probe key");
        if call(&form.args(k, t)).int() == Some(1) {
            del_ifeq = Some(form);
            break;
        }
    }
    call(&[b"DEL", k]);
    Natives { set_ifeq, del_ifeq }
}

/// No bound: the server has not the native the ratio is over.
const NO_NATIVE: f64 = f64::NAN;

/// A bound on a ratio of instructions per call in `call()`, redis-lease over another way
/// (the Lua recipe or the server's own commands), for each server (in `Flavor::ALL`
/// order: their allocators and module APIs differ). `NO_NATIVE` where the server lacks
/// a native command of `other`; the check fails when a server has it after all, or
/// loses it.
struct Bound {
    what: &'static str,
    lease: &'static [Step],
    other: &'static [Step],
    max: [f64; Flavor::ALL.len()],
    /// Issue 27's goal for this ratio, where it has one.
    goal: &'static str,
}

impl Bound {
    fn max(&self, flavor: Flavor) -> f64 {
        let at = Flavor::ALL.iter().position(|&f| f == flavor).unwrap_or(0);
        self.max[at]
    }
}

/// About 5% above the most each server counted in four runs (docs/src/performance/reports/instructions.md):
/// a second key open or an `RM_Call` on a hot path crosses them; the spread between
/// runs (under 1% for most steps, up to 4% for a few, as incremental rehashing and the
/// allocator's state fall differently) does not. Lower them when a change makes a
/// command cheaper. They hold the current state, not issue 27's goals, which the
/// `goal` column states.
const BOUNDS: &[Bound] = &[
    Bound {
        what: "full cycle vs SET NX PX + EVALSHA renew + EVALSHA release",
        lease: &[Step::Acquire, Step::Renew, Step::Release],
        other: &[Step::SetNxPx, Step::EvalRenew, Step::EvalRelease],
        // Raised from [0.46, 0.43, 0.54, 0.46] with the one commit path (a change
        // built as a value, then carried out): +1 to 4% on ACQUIRE and RELEASE,
        // measured in the closing note of the commit-path issue. The performance
        // issue's targets (cycle at or under the native trio) are far below these.
        max: [0.475, 0.44, 0.55, 0.47],
        goal: "≤ 0.35 on all four",
    },
    Bound {
        what: "full cycle vs SET NX PX + SET IFEQ PX + DELIFEQ",
        lease: &[Step::Acquire, Step::Renew, Step::Release],
        other: &[Step::SetNxPx, Step::SetIfeqPx, Step::DelIfeq],
        // Measured 1.416 on Valkey 9.1 (Valkey 8.1 has no DELIFEQ, Redis 8.2 and 7.0
        // neither native); about 4% above.
        max: [NO_NATIVE, NO_NATIVE, NO_NATIVE, 1.47],
        goal: "≤ 1.0 on Valkey 9.1, call() and whole",
    },
    Bound {
        what: "LEASE.ACQUIRE vs SET NX PX",
        lease: &[Step::Acquire],
        other: &[Step::SetNxPx],
        // Raised from [1.57, 1.49, 1.83, 1.76] with the one commit path (above).
        // Redis 8.2 counted 1.510 and 1.523 in two clean-clone runs of the same
        // code: its bound was 0.5% above the second, now 2.4% as the others.
        max: [1.61, 1.56, 1.87, 1.80],
        goal: "≤ 1.2 where the server has the natives",
    },
    Bound {
        what: "LEASE.RENEW vs SET IFEQ PX",
        lease: &[Step::Renew],
        other: &[Step::SetIfeqPx],
        // Measured 1.121 and 1.094.
        max: [NO_NATIVE, NO_NATIVE, 1.17, 1.14],
        goal: "≤ 1.0 where the server has it",
    },
    Bound {
        what: "LEASE.RELEASE vs DELIFEQ",
        lease: &[Step::Release],
        other: &[Step::DelIfeq],
        // Measured 1.334.
        max: [NO_NATIVE, NO_NATIVE, NO_NATIVE, 1.39],
        goal: "≤ 1.0 where the server has it",
    },
    Bound {
        what: "LEASE.RENEW vs EVALSHA compare-and-pexpire",
        lease: &[Step::Renew],
        other: &[Step::EvalRenew],
        max: [0.28, 0.26, 0.32, 0.28],
        goal: "",
    },
    Bound {
        what: "LEASE.RELEASE vs EVALSHA compare-and-delete",
        lease: &[Step::Release],
        other: &[Step::EvalRelease],
        max: [0.28, 0.28, 0.34, 0.28],
        goal: "",
    },
    Bound {
        what: "LEASE.FENCE vs INCR",
        lease: &[Step::Fence],
        other: &[Step::Incr],
        // Valkey 9's INCR counted 1,761 to 1,892 between runs (FENCE 2,569
        // every time): the bound sits above the lowest INCR. Redis 7.0's
        // FENCE counted 2,246 to 2,341 over builds of this stop (a resource
        // record's first store is half of the spread), ratio up to 1.32.
        max: [1.38, 1.38, 1.61, 1.53],
        goal: "≤ 1.1",
    },
    Bound {
        what: "LEASE.FENCE … INCR vs INCR",
        lease: &[Step::FenceIncr],
        other: &[Step::Incr],
        // Measured 6.67, 6.21, 7.48, 7.00: the inner command runs through
        // `RM_Call`. About 6% above, INCR moving by up to 7% between runs (above).
        max: [7.1, 6.6, 7.95, 7.6],
        goal: "≤ 3.0",
    },
];

// ---------------------------------------------------------------------------------------
// Shared holds (issue 16) against the sorted-set semaphore

/// Holds on one key among which one hold is acquired, renewed and released.
const SHARED_SIZES: [usize; 3] = [1, 100, 10_000];
/// The limit both ways state: a semaphore of 10,000 permits (`lease.max-holders`'s
/// default, so the bench needs no configuration).
const SHARED_LIMIT: &[u8] = b"10000";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum SharedOp {
    Acquire,
    Renew,
    Release,
    SemAcquire,
    SemRenew,
    SemRelease,
}

impl SharedOp {
    /// In the order they run at each size.
    const ALL: [SharedOp; 6] = [
        SharedOp::Acquire,
        SharedOp::Renew,
        SharedOp::Release,
        SharedOp::SemAcquire,
        SharedOp::SemRenew,
        SharedOp::SemRelease,
    ];

    fn label(self) -> &'static str {
        match self {
            SharedOp::Acquire => "LEASE.ACQUIRE key ttl TOKEN token SHARED LIMIT n",
            SharedOp::Renew => "LEASE.RENEW key token ttl (shared hold)",
            SharedOp::Release => "LEASE.RELEASE key token (shared hold)",
            SharedOp::SemAcquire => "EVALSHA ZREMRANGEBYSCORE + ZCARD + ZADD",
            SharedOp::SemRenew => "EVALSHA ZSCORE + ZADD XX",
            SharedOp::SemRelease => "ZREM key token",
        }
    }

    fn db(self) -> &'static str {
        match self {
            SharedOp::SemAcquire | SharedOp::SemRenew | SharedOp::SemRelease => "1",
            _ => "0",
        }
    }

    /// The semaphore's step that does what this redis-lease step does.
    fn sem(self) -> SharedOp {
        match self {
            SharedOp::Acquire => SharedOp::SemAcquire,
            SharedOp::Renew => SharedOp::SemRenew,
            SharedOp::Release => SharedOp::SemRelease,
            other => other,
        }
    }
}

/// Acquires either way: the counted step, or (not `counted`) the fill before it.
fn shared_acquires(
    conn: &mut Conn,
    layout: &Layout,
    native: bool,
    sem: &SemScripts,
    counted: bool,
) {
    let (n, what) = match (counted, native) {
        (true, true) => (layout.calls(), SharedOp::Acquire.label()),
        (true, false) => (layout.calls(), SharedOp::SemAcquire.label()),
        (false, _) => (layout.keys * layout.filler(), "fill shared holds"),
    };
    let at = |i| match counted {
        true => layout.acquired(i),
        false => layout.filled(i),
    };
    let (k, t) = (|i| layout.key(at(i).0), |i| layout.token(at(i).0, at(i).1));
    if native {
        drive(
            conn,
            n,
            what,
            |i, b| acquire_shared(b, &k(i), &t(i), TTL, SHARED_LIMIT),
            |i, r| matches!(r, Reply::Array(Some(a)) if r.is_grant() && a[0].bulk() == Some(&t(i)[..])),
        );
    } else if counted {
        drive(
            conn,
            n,
            what,
            |i, b| sem_acquire(b, &sem.acquire, &k(i), &t(i), TTL, SHARED_LIMIT),
            |_, r| is_one(r),
        );
    } else {
        // The fill, uncounted: the members the script would add, without running it
        // under callgrind 9,000 times a size (deadlines from this clock, an hour out).
        let deadline = decimal(now_ms() + 3_600_000);
        drive(
            conn,
            n,
            what,
            |i, b| encode(b, &[b"ZADD", &k(i), &deadline, &t(i)]),
            |_, r| is_one(r),
        );
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Sends the `layout.calls()` commands of one shared step, checking every reply.
fn run_shared_step(conn: &mut Conn, op: SharedOp, layout: &Layout, sem: &SemScripts) {
    let n = layout.calls();
    let what = op.label();
    let renewed = |i| {
        let (k, h) = layout.renewed(i);
        (layout.key(k), layout.token(k, h))
    };
    let released = |i| {
        let (k, h) = layout.released(i);
        (layout.key(k), layout.token(k, h))
    };
    match op {
        SharedOp::Acquire | SharedOp::SemAcquire => {
            shared_acquires(conn, layout, op == SharedOp::Acquire, sem, true)
        }
        SharedOp::Renew => drive(
            conn,
            n,
            what,
            |i, b| {
                let (k, t) = renewed(i);
                renew(b, &k, &t, TTL)
            },
            |_, r| is_one(r),
        ),
        SharedOp::SemRenew => drive(
            conn,
            n,
            what,
            |i, b| {
                let (k, t) = renewed(i);
                sem_renew(b, &sem.renew, &k, &t, TTL)
            },
            |_, r| is_one(r),
        ),
        SharedOp::Release => drive(
            conn,
            n,
            what,
            |i, b| {
                let (k, t) = released(i);
                release(b, &k, &t)
            },
            |_, r| is_one(r),
        ),
        SharedOp::SemRelease => drive(
            conn,
            n,
            what,
            |i, b| {
                let (k, t) = released(i);
                sem_release(b, &k, &t)
            },
            |_, r| is_one(r),
        ),
    }
}

/// A bound on the growth of a shared step: instructions per call with one hold among the
/// most over the same with the hold alone (issue 16: at most 2x for RENEW and RELEASE).
struct Growth {
    op: SharedOp,
    max: f64,
}

const GROWTH_BOUNDS: &[Growth] = &[
    // Not in the targets, but what it reached first (0.81 to 0.86: with one
    // hold ACQUIRE creates the key): a scan of every hold on a grant crosses it.
    Growth {
        op: SharedOp::Acquire,
        max: 2.0,
    },
    Growth {
        op: SharedOp::Renew,
        max: 2.0,
    },
    Growth {
        op: SharedOp::Release,
        max: 2.0,
    },
];

// ---------------------------------------------------------------------------------------
// Sessions (issue 17)

/// Holds bound to the session when its RENEW is counted the second time.
const BOUND_HOLDS: usize = 100_000;
/// The session every bound hold of this section is bound to, and its token.
const SESSION_KEY: &[u8] = b"session:bench";

fn session_token() -> [u8; 32] {
    token(1 << 42)
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum SessionOp {
    /// `LEASE.RENEW` of the session before any hold is bound to it.
    RenewAlone,
    /// A plain `LEASE.ACQUIRE` of a fresh key, before any hold is bound on the server.
    Acquire,
    /// `LEASE.ACQUIRE` of a fresh key bound to the session with ttl 0.
    AcquireBound,
    /// `LEASE.RENEW` of the session with `BOUND_HOLDS` holds bound to it.
    RenewBound,
    /// A plain `LEASE.ACQUIRE` of a fresh key while `BOUND_HOLDS` holds are bound on the
    /// server (not checked: what sessions cost the commands that do not use them).
    AcquireAmongBound,
}

impl SessionOp {
    /// In the order they run.
    const ALL: [SessionOp; 5] = [
        SessionOp::RenewAlone,
        SessionOp::Acquire,
        SessionOp::AcquireBound,
        SessionOp::RenewBound,
        SessionOp::AcquireAmongBound,
    ];

    fn label(self) -> &'static str {
        match self {
            SessionOp::RenewAlone => "LEASE.RENEW session token ttl, 0 bound holds",
            SessionOp::Acquire => "LEASE.ACQUIRE key ttl TOKEN token",
            SessionOp::AcquireBound => "LEASE.ACQUIRE key 0 TOKEN token SESSION session token",
            SessionOp::RenewBound => "LEASE.RENEW session token ttl, 100,000 bound holds",
            SessionOp::AcquireAmongBound => {
                "LEASE.ACQUIRE key ttl TOKEN token, 100,000 holds bound on the server"
            }
        }
    }
}

/// A bound on the ratio of two session steps' instructions per call.
struct SessionBound {
    what: &'static str,
    over: SessionOp,
    base: SessionOp,
    max: f64,
}

/// Issue 17: one RENEW keeps every bound hold alive, O(1) in their number; binding a hold
/// costs at most half as much again as a plain grant.
const SESSION_BOUNDS: &[SessionBound] = &[
    SessionBound {
        what: "RENEW of a session, 100,000 bound holds over 0",
        over: SessionOp::RenewBound,
        base: SessionOp::RenewAlone,
        max: 1.05,
    },
    SessionBound {
        what: "ACQUIRE with SESSION (ttl 0) over a plain ACQUIRE",
        over: SessionOp::AcquireBound,
        base: SessionOp::Acquire,
        max: 1.5,
    },
];

/// Sends the `n` commands of one session step, checking every reply.
fn run_session_step(conn: &mut Conn, op: SessionOp, n: usize) {
    let st = session_token();
    match op {
        SessionOp::RenewAlone | SessionOp::RenewBound => drive(
            conn,
            n,
            op.label(),
            |_, b| renew(b, SESSION_KEY, &st, TTL),
            |_, r| is_one(r),
        ),
        _ => session_acquires(conn, op, op.prefix(), 0, n, op.label()),
    }
}

impl SessionOp {
    /// The keys an acquire step takes (`prefix:00000000`...).
    fn prefix(self) -> &'static str {
        match self {
            SessionOp::Acquire => "sa",
            SessionOp::AcquireBound => "sb",
            SessionOp::AcquireAmongBound => "sc",
            SessionOp::RenewAlone | SessionOp::RenewBound => "",
        }
    }

    fn acquires(self) -> bool {
        !self.prefix().is_empty()
    }
}

/// Acquires keys `prefix:from..prefix:to` as step `op` does: plainly, or bound to the
/// session with ttl 0.
fn session_acquires(
    conn: &mut Conn,
    op: SessionOp,
    prefix: &str,
    from: usize,
    to: usize,
    what: &str,
) {
    let st = session_token();
    let bound = op == SessionOp::AcquireBound;
    drive(
        conn,
        to - from,
        what,
        |i, b| {
            let (k, t) = (key(prefix, from + i), token(from + i));
            if bound {
                acquire_bound(b, &k, &t, b"0", SESSION_KEY, &st)
            } else {
                acquire(b, &k, &t, TTL)
            }
        },
        |i, r| matches!(r, Reply::Array(Some(a)) if r.is_grant() && a[0].bulk() == Some(&token(from + i)[..])),
    );
}

/// Before an acquire step: `n` acquires of the same kind on other keys, released again.
/// The counted step then finds the allocator as a server whose keys come and go has it
/// (freed blocks of each size to reuse), for the plain and the bound grant alike, rather
/// than growing it from wherever the step before left it.
fn warm_up(conn: &mut Conn, op: SessionOp, n: usize) {
    let prefix = format!("w{}", op.prefix());
    session_acquires(conn, op, &prefix, 0, n, "warm-up acquires");
    drive(
        conn,
        n,
        "warm-up releases",
        |i, b| release(b, &key(&prefix, i), &token(i)),
        |_, r| is_one(r),
    );
}

/// The session steps, on an empty database 0: (step, instructions per call).
fn count_sessions(counted: &mut Counted, conn: &mut Conn, n: usize) -> Vec<(SessionOp, f64)> {
    conn.must(&["SELECT", "0"]);
    conn.must(&["FLUSHDB"]);
    let mut buf = Vec::new();
    acquire(&mut buf, SESSION_KEY, &session_token(), TTL);
    conn.send(&buf)
        .unwrap_or_else(|e| panic!("session: cannot send: {e}"));
    let reply = conn
        .read()
        .unwrap_or_else(|e| panic!("session: cannot read: {e}"));
    assert!(reply.is_grant(), "the session's ACQUIRE: {reply:?}");
    let mut out = Vec::new();
    for op in SessionOp::ALL {
        if op == SessionOp::RenewBound {
            // The rest of the bound holds: set-up, with the instrumentation off.
            counted.instrument(false);
            let bound = SessionOp::AcquireBound;
            let prefix = bound.prefix();
            session_acquires(
                conn,
                bound,
                prefix,
                n,
                BOUND_HOLDS.max(n),
                "bind the session's other holds",
            );
            counted.instrument(true);
            let bound = session_bound(conn);
            assert_eq!(
                bound,
                BOUND_HOLDS.max(n) as i64,
                "holds bound to the session"
            );
        }
        if op.acquires() {
            warm_up(conn, op, n);
        }
        counted.zero();
        run_session_step(conn, op, n);
        let ir = counted.per_call(n).call;
        eprintln!(
            "instructions: {} {:<72} {ir:>8.0} per call",
            counted.server.flavor,
            op.label()
        );
        out.push((op, ir));
    }
    conn.must(&["FLUSHDB"]);
    out
}

/// `bound` of `LEASE.INFO` of the session.
fn session_bound(conn: &mut Conn) -> i64 {
    let reply = conn
        .call(&[b"LEASE.INFO", SESSION_KEY])
        .unwrap_or_else(|e| panic!("LEASE.INFO of the session: {e}"));
    let Reply::Array(Some(fields)) = &reply else {
        panic!("LEASE.INFO of the session: {reply:?}");
    };
    fields
        .chunks(2)
        .find(|f| f[0].bulk() == Some(&b"bound"[..]))
        .and_then(|f| f.get(1)?.int())
        .unwrap_or_else(|| panic!("LEASE.INFO of the session has no bound: {reply:?}"))
}

// ---------------------------------------------------------------------------------------
// The tax on other commands (issue 27)
//
// What loading the module costs the commands it has nothing to do with: the servers'
// own `PING`, `GET`, `SET`, `SET PX`, `DEL`, `INCR`, `EXPIRE` and a transaction of them.
//
// The same server binary runs twice under callgrind: without the module, and with it.
// Each runs the steps twice in a database of their own (`TAX_DB`): first with nothing
// else in the server (the module idle), then, after `FLUSHDB`, again; between the two
// the server with the module gets `LIVE_LEASES` exclusive leases of an hour in
// database 0 (granted with the instrumentation off), the server without it nothing.
// The ratio of each step, with the module over without, is the tax, whole-process (the
// issue's measure: the command filter runs before `call()`) and in `call()` (the
// keyspace events the module subscribes to run inside it).

/// Live leases in the server with the module during the second pass.
const LIVE_LEASES: usize = 100_000;
/// The database the steps run in, apart from the leases' database 0.
const TAX_DB: &str = "9";
/// `EXPIRE`'s seconds, the same deadline as `TTL`'s milliseconds.
const EXPIRE_SECONDS: &[u8] = b"3600";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum TaxOp {
    Set,
    Get,
    SetPx,
    Expire,
    Incr,
    Del,
    Ping,
    Multi,
}

impl TaxOp {
    /// In the order they run: `SET` creates the keys the next steps read, expire and
    /// delete.
    const ALL: [TaxOp; 8] = [
        TaxOp::Set,
        TaxOp::Get,
        TaxOp::SetPx,
        TaxOp::Expire,
        TaxOp::Incr,
        TaxOp::Del,
        TaxOp::Ping,
        TaxOp::Multi,
    ];

    fn label(self) -> &'static str {
        match self {
            TaxOp::Set => "SET key value",
            TaxOp::Get => "GET key",
            TaxOp::SetPx => "SET key value PX ttl",
            TaxOp::Expire => "EXPIRE key seconds",
            TaxOp::Incr => "INCR counter",
            TaxOp::Del => "DEL key",
            TaxOp::Ping => "PING",
            TaxOp::Multi => "MULTI, the seven above, EXEC",
        }
    }
}

/// The commands of a transaction, in order, between `MULTI` and `EXEC`.
const IN_MULTI: [TaxOp; 7] = [
    TaxOp::Set,
    TaxOp::Get,
    TaxOp::SetPx,
    TaxOp::Expire,
    TaxOp::Incr,
    TaxOp::Del,
    TaxOp::Ping,
];

/// Writes `op` for index `i` on `prefix`'s keys (a transaction's are its own).
fn encode_op(b: &mut Vec<u8>, op: TaxOp, prefix: &str, i: usize) {
    let (k, v) = (key(prefix, i), token(i));
    let counter = key("tc", i % COUNTER_KEYS);
    match op {
        TaxOp::Set => encode(b, &[b"SET", &k, &v]),
        TaxOp::Get => encode(b, &[b"GET", &k]),
        TaxOp::SetPx => encode(b, &[b"SET", &k, &v, b"PX", TTL]),
        TaxOp::Expire => encode(b, &[b"EXPIRE", &k, EXPIRE_SECONDS]),
        TaxOp::Incr => encode(b, &[b"INCR", &counter]),
        TaxOp::Del => encode(b, &[b"DEL", &k]),
        TaxOp::Ping => encode(b, &[b"PING"]),
        TaxOp::Multi => {
            encode(b, &[b"MULTI"]);
            for inner in IN_MULTI {
                encode_op(b, inner, prefix, i);
            }
            encode(b, &[b"EXEC"]);
        }
    }
}

/// Whether `r` is `op`'s reply for index `i` run alone (each key exists from `SET` to
/// `DEL`).
fn expected(op: TaxOp, i: usize, r: &Reply) -> bool {
    match op {
        TaxOp::Set | TaxOp::SetPx => r.is_ok(),
        TaxOp::Get => r.bulk() == Some(&token(i)[..]),
        TaxOp::Expire | TaxOp::Del => r.int() == Some(1),
        TaxOp::Incr => r.int().is_some(),
        TaxOp::Ping => matches!(r, Reply::Status(s) if s == "PONG"),
        TaxOp::Multi => match r {
            Reply::Array(Some(replies)) => {
                replies.len() == IN_MULTI.len()
                    && IN_MULTI
                        .iter()
                        .zip(replies)
                        .all(|(&inner, r)| expected(inner, i, r))
            }
            _ => false,
        },
    }
}

/// How many of `op` a step of `n` sends: a transaction is nine commands, so a quarter
/// as many of them.
fn units(op: TaxOp, n: usize) -> usize {
    match op {
        TaxOp::Multi => n / 4,
        _ => n,
    }
}

/// Sends `n` of `op`, checking every reply (a transaction's `QUEUED`s too).
fn run(conn: &mut Conn, op: TaxOp, n: usize) {
    if op != TaxOp::Multi {
        return drive(
            conn,
            n,
            op.label(),
            |i, b| encode_op(b, op, "tx", i),
            |i, r| expected(op, i, r),
        );
    }
    // One reply per command: MULTI's OK, a QUEUED for each inner command, EXEC's array.
    let per = IN_MULTI.len() + 2;
    drive(
        conn,
        n * per,
        op.label(),
        |j, b| {
            if j % per == 0 {
                encode_op(b, op, "tm", j / per);
            }
        },
        |j, r| match j % per {
            0 => r.is_ok(),
            at if at == per - 1 => expected(op, j / per, r),
            _ => matches!(r, Reply::Status(s) if s == "QUEUED"),
        },
    );
}

/// The server with the module (`true`) or without, and the pass: idle (`false`) or
/// among live leases.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Run {
    module: bool,
    live: bool,
}

struct Tax {
    counts: Vec<(Run, TaxOp, Cost)>,
}

impl Tax {
    fn cost(&self, run: Run, op: TaxOp) -> Cost {
        self.counts
            .iter()
            .find(|&&(r, o, _)| r == run && o == op)
            .map_or(Cost::MISSING, |&(_, _, c)| c)
    }

    /// With the module over without it, idle or among live leases.
    fn ratio(&self, op: TaxOp, live: bool) -> Cost {
        let with = self.cost(Run { module: true, live }, op);
        let without = self.cost(
            Run {
                module: false,
                live,
            },
            op,
        );
        with.over(without)
    }
}

/// Counts the tax steps on `flavor`, `n` of each (transactions: `n` transactions).
fn count_tax(flavor: Flavor, n: usize) -> Tax {
    let mut counts = Vec::new();
    for module in [false, true] {
        let (name, options) = match module {
            true => ("tax-module", ServerOptions::new()),
            false => ("tax-plain", ServerOptions::without_module()),
        };
        let mut counted = Counted::start_in(flavor, &format!("{}-{name}", flavor.name()), options);
        let mut conn = Conn::connect(counted.server.port)
            .unwrap_or_else(|e| panic!("cannot connect to {flavor}: {e}"));
        for live in [false, true] {
            if live {
                conn.must(&["FLUSHDB"]);
                if module {
                    grant_live_leases(&mut counted, &mut conn);
                }
            }
            conn.must(&["SELECT", TAX_DB]);
            for op in TaxOp::ALL {
                counted.zero();
                run(&mut conn, op, units(op, n));
                let calls = if op == TaxOp::Multi { 2 } else { 1 };
                let cost = counted.per_unit(units(op, n), calls);
                eprintln!(
                    "instructions: {flavor} tax, {}{}: {:<30} {:>8.0} per call, {:>8.0} whole-process",
                    if module { "module" } else { "no module" },
                    if live { ", live leases" } else { "" },
                    op.label(),
                    cost.call,
                    cost.whole
                );
                counts.push((Run { module, live }, op, cost));
            }
        }
    }
    Tax { counts }
}

/// `LIVE_LEASES` exclusive leases of an hour in database 0, granted with the
/// instrumentation off (set-up, not counted), then checked to be there.
fn grant_live_leases(counted: &mut Counted, conn: &mut Conn) {
    conn.must(&["SELECT", "0"]);
    counted.instrument(false);
    drive(
        conn,
        LIVE_LEASES,
        "grant the live leases",
        |i, b| acquire(b, &key("live", i), &token(i), TTL),
        |_, r| r.is_grant(),
    );
    counted.instrument(true);
    let keys = conn.must(&["DBSIZE"]).int();
    assert_eq!(keys, Some(LIVE_LEASES as i64), "live leases in database 0");
}

/// A bound on the tax of one step, with the module over without, idle and among live
/// leases alike, whole-process and in `call()`, for each server (in `Flavor::ALL`
/// order).
struct TaxBound {
    op: TaxOp,
    whole: [f64; Flavor::ALL.len()],
    call: [f64; Flavor::ALL.len()],
}

/// The tax while the module holds nothing: it has no command filter and no key-event
/// subscription then, so no command calls into it, and what is left is noise: a
/// whole-process count's (how many commands each read of the socket finds), and up to 5%
/// in `call()` (Valkey 9.1's `SET PX` measured 1.048 once).
const IDLE_TAX_WHOLE: f64 = 1.10;
const IDLE_TAX_CALL: f64 = 1.10;

/// Today's taxes plus a margin: the current state, held so that it gets no worse, not
/// issue 27's goal (at most 1.01 whole-process on every step). Each is the largest of
/// both passes' ratios over two runs of the four servers at this commit, plus 0.08
/// whole-process and 0.07 in `call()`. Whole-process counts of cheap commands move more
/// between runs than `call()`'s (Redis 7.0's `DEL` tax 1.10 to 1.21, `PING` 1.06 to
/// 1.13): how many commands each read of the socket finds depends on timing, and the
/// event loop's cost per pass falls on fewer or more commands. Lower them as the tax
/// goes down.
const TAX_BOUNDS: &[TaxBound] = &[
    TaxBound {
        op: TaxOp::Set,
        whole: [1.19, 1.14, 1.12, 1.14],
        call: [1.13, 1.12, 1.09, 1.16],
    },
    TaxBound {
        op: TaxOp::Get,
        whole: [1.14, 1.15, 1.14, 1.12],
        call: [1.12, 1.12, 1.09, 1.08],
    },
    TaxBound {
        op: TaxOp::SetPx,
        whole: [1.23, 1.25, 1.20, 1.17],
        call: [1.27, 1.29, 1.24, 1.22],
    },
    TaxBound {
        op: TaxOp::Expire,
        whole: [1.27, 1.32, 1.21, 1.20],
        call: [1.37, 1.41, 1.29, 1.32],
    },
    TaxBound {
        op: TaxOp::Incr,
        whole: [1.16, 1.15, 1.14, 1.15],
        call: [1.12, 1.13, 1.11, 1.14],
    },
    TaxBound {
        op: TaxOp::Del,
        whole: [1.29, 1.31, 1.20, 1.18],
        call: [1.37, 1.36, 1.23, 1.28],
    },
    TaxBound {
        op: TaxOp::Ping,
        whole: [1.21, 1.19, 1.15, 1.15],
        call: [1.10, 1.12, 1.08, 1.21],
    },
    TaxBound {
        op: TaxOp::Multi,
        whole: [1.18, 1.19, 1.15, 1.16],
        call: [1.19, 1.21, 1.14, 1.17],
    },
];

/// The tax tables; false when a ratio is over its bound.
fn tax_report(md: &mut String, all: &[Counts], n: usize) -> bool {
    let mut ok = true;
    let _ = writeln!(
        md,
        "\n## The tax on other commands\n\n\
         The same server binary run twice under callgrind, without the module and with \
         it; each runs the steps below, {n} of each ({multi} transactions, counted per \
         transaction) on distinct keys of database {TAX_DB} with 32-byte \
         values (`INCR` on {COUNTER_KEYS} counters), first with nothing else in the \
         server (the module idle), then after `FLUSHDB` again, once the server with \
         the module holds {live} exclusive leases of an hour in database 0 (granted \
         with callgrind's instrumentation off). Whole-process counts (timers aside, as \
         above), then `call()`'s, per command.\n\n\
         Issue 27's goal: a tax of at most 1% (a ratio of at most 1.01, whole-process), \
         idle and with {live} leases live, on all four servers. The bounds (in \
         parentheses, `TAX_BOUNDS` in `benches/instructions.rs`, each for both \
         passes) hold today's figures plus a margin so that the tax can only go down; \
         they are not the goal.\n",
        live = thousands(LIVE_LEASES),
        multi = units(TaxOp::Multi, n),
    );
    let passes = [
        (false, "no module", "module idle"),
        (true, "no module, second pass", "module, live leases"),
    ];
    header(md, "Command: whole process [call()]", all);
    for op in TaxOp::ALL {
        for (live, without, with) in passes {
            for (module, what) in [(false, without), (true, with)] {
                let _ = write!(md, "| `{}`, {what} |", op.label());
                for c in all {
                    let cost = c.tax.cost(Run { module, live }, op);
                    let _ = write!(md, " {:.0} [{:.0}] |", cost.whole, cost.call);
                }
                md.push('\n');
            }
        }
    }
    md.push('\n');
    header(
        md,
        "Tax, with the module over without: whole process [call()] (bounds)",
        all,
    );
    for op in TaxOp::ALL {
        let bound = TAX_BOUNDS.iter().find(|b| b.op == op);
        for (live, what) in [(false, "idle"), (true, "live leases")] {
            let _ = write!(md, "| `{}`, {what} |", op.label());
            for c in all {
                let r = c.tax.ratio(op, live);
                let at = Flavor::ALL.iter().position(|&f| f == c.flavor).unwrap_or(0);
                let (whole, call) =
                    bound.map_or((f64::NAN, f64::NAN), |b| (b.whole[at], b.call[at]));
                let (whole, call) = match live {
                    false => (whole.min(IDLE_TAX_WHOLE), call.min(IDLE_TAX_CALL)),
                    true => (whole, call),
                };
                let within = r.whole <= whole && r.call <= call;
                ok &= within;
                let over = if within { "" } else { " **over**" };
                let _ = write!(
                    md,
                    " {:.3} [{:.3}] (≤ {whole:.2} [{call:.2}]){over} |",
                    r.whole, r.call
                );
                if !within {
                    eprintln!(
                        "instructions: {}: the tax on {} ({what}) is {:.3} whole-process, {:.3} in call(), over its bounds {whole:.2}, {call:.2}",
                        c.flavor,
                        op.label(),
                        r.whole,
                        r.call
                    );
                }
            }
            md.push('\n');
        }
    }
    ok
}

struct Options {
    flavors: Vec<Flavor>,
    calls: usize,
    shared_calls: usize,
    session_calls: usize,
    tax_calls: usize,
    out: Option<PathBuf>,
}

const USAGE: &str = "usage: cargo bench --bench instructions -- [--servers redis7,redis8,valkey8,valkey9] [--calls N] [--shared-calls N] [--session-calls N] [--out FILE]
  --servers LIST     servers to count on (default all four)
  --calls N          commands per step (default 20000)
  --shared-calls N   commands per shared-hold step at each size (default 1000)
  --session-calls N  commands per session step (default 2000)
  --tax-calls N      commands per step of the tax table (default 1000)
  --out FILE         also write the tables as markdown to FILE";

fn fail(message: &str) -> ! {
    eprintln!("instructions: {message}\n{USAGE}");
    std::process::exit(2);
}

fn parse_options() -> Options {
    let mut options = Options {
        flavors: Flavor::ALL.to_vec(),
        calls: 20_000,
        shared_calls: 1000,
        session_calls: 2000,
        tax_calls: 1000,
        out: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .unwrap_or_else(|| fail(&format!("{name} needs a value")))
        };
        match arg.as_str() {
            "--bench" => {}
            "--servers" => {
                options.flavors = value("--servers")
                    .split(',')
                    .map(|name| {
                        Flavor::from_name(name.trim())
                            .unwrap_or_else(|| fail(&format!("unknown server {name:?}")))
                    })
                    .collect();
            }
            "--calls" => {
                let v = value("--calls");
                options.calls = v
                    .parse::<usize>()
                    .ok()
                    .filter(|&n| n >= COUNTER_KEYS)
                    .unwrap_or_else(|| {
                        fail(&format!("bad --calls {v:?} (at least {COUNTER_KEYS})"))
                    });
            }
            "--shared-calls" => {
                let v = value("--shared-calls");
                options.shared_calls = v
                    .parse::<usize>()
                    .ok()
                    .filter(|&n| n >= 100)
                    .unwrap_or_else(|| fail(&format!("bad --shared-calls {v:?} (at least 100)")));
            }
            "--session-calls" => {
                let v = value("--session-calls");
                options.session_calls = v
                    .parse::<usize>()
                    .ok()
                    .filter(|&n| n >= 100)
                    .unwrap_or_else(|| fail(&format!("bad --session-calls {v:?} (at least 100)")));
            }
            "--tax-calls" => {
                let v = value("--tax-calls");
                options.tax_calls = v
                    .parse::<usize>()
                    .ok()
                    .filter(|&n| n >= 400)
                    .unwrap_or_else(|| fail(&format!("bad --tax-calls {v:?} (at least 400)")));
            }
            "--out" => options.out = Some(PathBuf::from(value("--out"))),
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => fail(&format!("unknown argument {other:?}")),
        }
    }
    options
}

/// A server running under callgrind, and the dumps taken of it.
struct Counted {
    server: Server,
    dir: PathBuf,
    dumps: usize,
}

impl Counted {
    fn start(flavor: Flavor) -> Counted {
        Counted::start_in(flavor, flavor.name(), ServerOptions::new())
    }

    /// A server started with `options` (the launcher is callgrind's), its dumps in
    /// `target/instructions/<dir>`.
    fn start_in(flavor: Flavor, dir: &str, mut options: ServerOptions) -> Counted {
        let dir = harness::repo_dir()
            .join("target")
            .join("instructions")
            .join(dir);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        options.launcher = vec![
            "valgrind".into(),
            "--tool=callgrind".into(),
            // Plain names and positions: the dump is read below, line by line.
            "--compress-strings=no".into(),
            "--compress-pos=no".into(),
            format!("--callgrind-out-file={}/callgrind.%p", dir.display()),
        ];
        let server = start_patiently(flavor, options);
        Counted {
            server,
            dir,
            dumps: 0,
        }
    }

    fn control(&self, what: &str) {
        let status = Command::new("callgrind_control")
            .arg(what)
            .arg(self.server.pid.to_string())
            .output()
            .unwrap_or_else(|e| panic!("cannot run callgrind_control: {e}"));
        let said = String::from_utf8_lossy(&status.stdout);
        if !status.status.success() || !said.contains("OK") {
            panic!("callgrind_control {what} {}: {said}", self.server.pid);
        }
    }

    /// Zeroes the counters.
    fn zero(&self) {
        self.control("-z");
    }

    /// Switches the instrumentation off (set-up that is not counted runs several times
    /// faster without it) or back on. Both happen between commands, and counting starts
    /// with a `zero` after it is back on.
    fn instrument(&self, on: bool) {
        self.control(if on { "--instr=on" } else { "--instr=off" });
    }

    /// Dumps the counters and reads them: instructions per top-level `call()`, checking
    /// that the server ran exactly `calls` commands since the last zero.
    fn per_call(&mut self, calls: usize) -> Cost {
        self.per_unit(calls, 1)
    }

    /// Dumps the counters and reads them, per unit of work: the inclusive cost of
    /// `call()` and the whole process's count since the last zero, each divided by
    /// `units`, checking that `call()` was entered from outside itself exactly
    /// `units * calls_per_unit` times (a `MULTI … EXEC` enters it twice: the commands
    /// queued in between run inside `EXEC`'s).
    fn per_unit(&mut self, units: usize, calls_per_unit: usize) -> Cost {
        self.control("-d");
        self.dumps += 1;
        let path = self
            .dir
            .join(format!("callgrind.{}.{}", self.server.pid, self.dumps));
        let dump = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        let (cost, counted) = call_cost(&dump, &path);
        let calls = units * calls_per_unit;
        if counted != calls as u64 {
            panic!(
                "{}: {counted} commands ran where {calls} were sent",
                path.display()
            );
        }
        let whole = summary(&dump, &path) - callee_cost(&dump, TIMERS, &path);
        Cost {
            call: cost as f64 / units as f64,
            whole: whole as f64 / units as f64,
        }
    }
}

/// Starts the server, trying again when it does not answer in the harness's start
/// time: under valgrind on a loaded two-core machine its start-up can take that long.
fn start_patiently(flavor: Flavor, options: ServerOptions) -> Server {
    const ATTEMPTS: usize = 3;
    for attempt in 1.. {
        let options = options.clone();
        match std::panic::catch_unwind(|| Server::start_with(flavor, options)) {
            Ok(server) => return server,
            Err(e) if attempt < ATTEMPTS => {
                let why = e
                    .downcast_ref::<String>()
                    .map_or("", |s| s.lines().next().unwrap_or(""));
                eprintln!("instructions: {flavor} did not start ({why}), trying again");
            }
            Err(e) => std::panic::resume_unwind(e),
        }
    }
    unreachable!("the loop returns or panics")
}

/// Instructions per command (or per unit of work, such as a transaction), counted two
/// ways in one step.
#[derive(Clone, Copy, Debug)]
struct Cost {
    /// The inclusive cost of the server's `call()`: the command itself, what it
    /// replicates, the server's bookkeeping around it.
    call: f64,
    /// Everything the process ran during the step but its timers (`TIMERS`):
    /// reading and parsing the requests, command filters, `call()`, writing the
    /// replies, the event loop.
    whole: f64,
}

impl Cost {
    const MISSING: Cost = Cost {
        call: f64::NAN,
        whole: f64::NAN,
    };

    fn plus(self, other: Cost) -> Cost {
        Cost {
            call: self.call + other.call,
            whole: self.whole + other.whole,
        }
    }

    fn over(self, base: Cost) -> Cost {
        Cost {
            call: self.call / base.call,
            whole: self.whole / base.whole,
        }
    }
}

/// The servers' timers. They run by the clock, not per command, so how much of them
/// falls in a step depends on how long it takes under callgrind on a shared machine
/// (their cost in a step of a few thousand cheap commands moves a whole-process count
/// by up to 10%): the whole-process count leaves them out.
const TIMERS: &[&str] = &["serverCron", "moduleTimerHandler", "clientsTimeProc"];

/// The inclusive cost of every call to one of `names` from outside them, in a callgrind
/// dump written with `--compress-strings=no --compress-pos=no`: the cost line after
/// each such `calls=` line.
fn callee_cost(dump: &str, names: &[&str], path: &Path) -> u64 {
    let (mut caller_is_one, mut callee_is_one, mut after_calls) = (false, false, false);
    let mut cost = 0u64;
    for line in dump.lines() {
        if let Some(name) = line.strip_prefix("fn=") {
            caller_is_one = names.contains(&name);
        } else if let Some(name) = line.strip_prefix("cfn=") {
            callee_is_one = names.contains(&name);
        } else if line.starts_with("calls=") {
            after_calls = true;
        } else if after_calls {
            if callee_is_one && !caller_is_one {
                cost += line
                    .split_whitespace()
                    .nth(1)
                    .and_then(|f| f.parse::<u64>().ok())
                    .unwrap_or_else(|| panic!("{}: cannot read {line:?}", path.display()));
            }
            after_calls = false;
        }
    }
    cost
}

/// The process's instruction count in a callgrind dump: its `summary:` line, every
/// event since the counters were last zeroed.
fn summary(dump: &str, path: &Path) -> u64 {
    dump.lines()
        .find_map(|l| l.strip_prefix("summary:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{}: no summary line", path.display()))
}

/// The inclusive instruction count of the function `call` in a callgrind dump written
/// with `--compress-strings=no --compress-pos=no`, and how many times it was entered
/// from outside itself (a script's commands enter it again, as `call'2`, inside).
///
/// Under `fn=call`, a cost line is the function's own cost, except the line after a
/// `calls=` line, which is the inclusive cost of that call.
fn call_cost(dump: &str, path: &Path) -> (u64, u64) {
    let mut in_call = false;
    let mut callee_is_call = false;
    let mut after_calls = false;
    let (mut cost, mut entered) = (0u64, 0u64);
    let number = |field: Option<&str>, line: &str| -> u64 {
        field
            .and_then(|f| f.parse().ok())
            .unwrap_or_else(|| panic!("{}: cannot read {line:?}", path.display()))
    };
    for line in dump.lines() {
        if let Some(name) = line.strip_prefix("fn=") {
            in_call = name == "call";
        } else if let Some(name) = line.strip_prefix("cfn=") {
            callee_is_call = name == "call";
        } else if let Some(rest) = line.strip_prefix("calls=") {
            if callee_is_call && !in_call {
                entered += number(rest.split_whitespace().next(), line);
            }
            after_calls = true;
        } else if line.starts_with(|c: char| c.is_ascii_digit() || c == '+' || c == '-') {
            if in_call {
                cost += number(line.split_whitespace().nth(1), line);
            }
            after_calls = false;
        } else if after_calls {
            panic!("{}: no cost after a calls= line", path.display());
        }
    }
    (cost, entered)
}

/// The keys of the native steps: `SET … IFEQ` renews them, `DELIFEQ` deletes them.
fn native_key(i: usize) -> Vec<u8> {
    key("na", i)
}

/// What a step needs in place before its counters are zeroed: the native renewal finds
/// `SET NX PX` grants on its keys (the same command as the counted `SET NX PX` step, on
/// keys of their own).
fn prepare_step(conn: &mut Conn, step: Step, n: usize) {
    if step == Step::SetIfeqPx {
        drive(
            conn,
            n,
            "SET NX PX for the native renewal",
            |i, b| set_nx_px(b, &native_key(i), &token(i), TTL),
            |_, r| r.is_ok(),
        );
    }
}

/// Sends step `step`'s `n` commands, checking every reply.
fn run_step(conn: &mut Conn, step: Step, n: usize, scripts: &Scripts, natives: Natives) {
    let k = |i: usize| key("ir", i);
    // The Lua way on names no lease ever had, as a server that runs both on
    // different keys sees it: the module's cost on other keys' TTLs (the
    // `expire` notification) is charged to the module's side only there.
    let lua = |i: usize| key("lu", i);
    let counter = |i: usize| key("counter", i % COUNTER_KEYS);
    let what = step.label();
    match step {
        Step::Acquire => drive(
            conn,
            n,
            what,
            |i, b| acquire(b, &k(i), &token(i), TTL),
            |_, r| r.is_grant(),
        ),
        Step::Renew => drive(
            conn,
            n,
            what,
            |i, b| renew(b, &k(i), &token(i), TTL),
            |_, r| is_one(r),
        ),
        Step::Release => drive(
            conn,
            n,
            what,
            |i, b| release(b, &k(i), &token(i)),
            |_, r| is_one(r),
        ),
        Step::SetNxPx => drive(
            conn,
            n,
            what,
            |i, b| set_nx_px(b, &lua(i), &token(i), TTL),
            |_, r| r.is_ok(),
        ),
        Step::EvalRenew => drive(
            conn,
            n,
            what,
            |i, b| eval_renew(b, &scripts.renew, &lua(i), &token(i), TTL),
            |_, r| is_one(r),
        ),
        Step::EvalRelease => drive(
            conn,
            n,
            what,
            |i, b| eval_release(b, &scripts.release, &lua(i), &token(i)),
            |_, r| is_one(r),
        ),
        Step::Incr => drive(
            conn,
            n,
            what,
            |i, b| encode(b, &[b"INCR", &counter(i)]),
            |_, r| r.int().is_some(),
        ),
        Step::SetIfeqPx => drive(
            conn,
            n,
            what,
            |i, b| {
                let (k, t) = (native_key(i), token(i));
                encode(b, &[b"SET", &k, &t, b"IFEQ", &t, b"PX", TTL])
            },
            |_, r| r.is_ok(),
        ),
        Step::DelIfeq => {
            let form = natives
                .del_ifeq
                .unwrap_or_else(|| panic!("{what}: the server has no compare-and-delete"));
            drive(
                conn,
                n,
                what,
                |i, b| encode(b, &form.args(&native_key(i), &token(i))),
                |_, r| is_one(r),
            )
        }
        Step::Fence => drive(
            conn,
            n,
            what,
            |i, b| encode(b, &[b"LEASE.FENCE", &counter(i), &decimal(i as u64 + 1)]),
            |_, r| r.int().is_some(),
        ),
        // Resources and counters of their own, so the fences start over and the
        // counters are fresh as `INCR counter`'s were.
        Step::FenceIncr => drive(
            conn,
            n,
            what,
            |i, b| {
                let (resource, inner) = (key("fr", i % COUNTER_KEYS), key("fx", i % COUNTER_KEYS));
                encode(
                    b,
                    &[
                        b"LEASE.FENCE",
                        &resource,
                        &decimal(i as u64 + 1),
                        b"INCR",
                        &inner,
                    ],
                )
            },
            |_, r| r.int().is_some(),
        ),
    }
}

struct Counts {
    flavor: Flavor,
    version: String,
    natives: Natives,
    /// (step, its cost per call); a step the server cannot run is absent.
    per_call: Vec<(Step, Cost)>,
    /// (step, holds on the key, instructions per call).
    shared: Vec<(SharedOp, usize, f64)>,
    /// (step, instructions per call); empty without sessions (before issue 17).
    sessions: Vec<(SessionOp, f64)>,
    tax: Tax,
}

impl Counts {
    /// The steps' costs summed; NaN when one of them was not counted.
    fn sum(&self, steps: &[Step]) -> Cost {
        steps.iter().fold(
            Cost {
                call: 0.0,
                whole: 0.0,
            },
            |sum, s| {
                let cost = self
                    .per_call
                    .iter()
                    .find(|(step, _)| step == s)
                    .map_or(Cost::MISSING, |&(_, c)| c);
                sum.plus(cost)
            },
        )
    }

    fn ratio(&self, bound: &Bound) -> Cost {
        self.sum(bound.lease).over(self.sum(bound.other))
    }

    /// Why `bound`'s ratio is not counted on this server, or `None` when it is.
    fn missing(&self, bound: &Bound) -> Option<&'static str> {
        bound
            .other
            .iter()
            .find_map(|step| step.missing(self.natives))
    }

    fn shared(&self, op: SharedOp, size: usize) -> f64 {
        self.shared
            .iter()
            .find(|&&(o, s, _)| o == op && s == size)
            .map_or(f64::NAN, |&(_, _, v)| v)
    }

    fn session(&self, op: SessionOp) -> f64 {
        self.sessions
            .iter()
            .find(|&&(o, _)| o == op)
            .map_or(f64::NAN, |&(_, v)| v)
    }

    /// Instructions per call among the most holds over the same with the hold alone.
    fn growth(&self, op: SharedOp) -> f64 {
        let (first, last) = (SHARED_SIZES[0], SHARED_SIZES[SHARED_SIZES.len() - 1]);
        self.shared(op, last) / self.shared(op, first)
    }
}

fn count(flavor: Flavor, options: &Options) -> Counts {
    let (n, shared_calls, session_calls) =
        (options.calls, options.shared_calls, options.session_calls);
    let mut counted = Counted::start(flavor);
    let mut conn = Conn::connect(counted.server.port)
        .unwrap_or_else(|e| panic!("cannot connect to {flavor}: {e}"));
    let version = server_version(&counted.server);
    let scripts = load_scripts(&mut conn);
    conn.must(&["SELECT", "1"]);
    let natives = natives(&mut conn);
    let mut per_call = Vec::new();
    for step in Step::ALL {
        if let Some(why) = step.missing(natives) {
            eprintln!(
                "instructions: {flavor} {:<40} not counted: {why}",
                step.label()
            );
            continue;
        }
        conn.must(&["SELECT", step.db()]);
        prepare_step(&mut conn, step, n);
        counted.zero();
        run_step(&mut conn, step, n, &scripts, natives);
        let ir = counted.per_call(n);
        eprintln!(
            "instructions: {flavor} {:<40} {:>8.0} per call, {:>8.0} whole-process",
            step.label(),
            ir.call,
            ir.whole
        );
        per_call.push((step, ir));
    }
    // Shared holds after every exclusive step, which counts as it did before them.
    let sem = load_sem_scripts(&mut conn);
    let mut shared = Vec::new();
    conn.must(&["SELECT", "0"]);
    let sizes: &[usize] = if supports_shared(&mut conn) {
        &SHARED_SIZES
    } else {
        eprintln!("instructions: {flavor}: the module has no SHARED (before issue 16): shared holds not counted");
        &[]
    };
    for &size in sizes {
        let layout = Layout::new("shared", size, shared_calls);
        for native in [true, false] {
            let db = if native { "0" } else { "1" };
            conn.must(&["SELECT", db]);
            shared_acquires(&mut conn, &layout, native, &sem, false);
            for op in SharedOp::ALL
                .into_iter()
                .filter(|op| (op.db() == "0") == native)
            {
                counted.zero();
                run_shared_step(&mut conn, op, &layout, &sem);
                let ir = counted.per_call(layout.calls()).call;
                eprintln!(
                    "instructions: {flavor} {:<48} {size:>6} holds {ir:>8.0} per call",
                    op.label()
                );
                shared.push((op, size, ir));
            }
            conn.must(&["FLUSHDB"]);
        }
    }
    // Sessions last: their 100,000 bound holds would weigh on every step after them.
    conn.must(&["SELECT", "0"]);
    let sessions = if supports_sessions(&mut conn) {
        count_sessions(&mut counted, &mut conn, session_calls)
    } else {
        eprintln!("instructions: {flavor}: the module has no SESSION (before issue 17): sessions not counted");
        Vec::new()
    };
    drop(conn);
    drop(counted);
    let started = std::time::Instant::now();
    let tax = count_tax(flavor, options.tax_calls);
    eprintln!(
        "instructions: {flavor}: the tax table took {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Counts {
        flavor,
        version,
        natives,
        per_call,
        shared,
        sessions,
        tax,
    }
}

fn report(all: &[Counts], options: &Options) -> (String, bool) {
    let (n, shared_calls) = (options.calls, options.shared_calls);
    let mut md = String::new();
    let mut ok = true;
    let _ = writeln!(
        md,
        "# Instructions per command: redis-lease vs the server's own commands and Lua\n\n\
         Written by `scripts/instructions`; do not edit by hand. Each server runs under \
         callgrind; each step is {n} commands in pipelines of {CHUNK}, on distinct keys \
         with 32-hex-character tokens (`INCR` and `LEASE.FENCE` on {COUNTER_KEYS} counters \
         and resources), every reply checked. A command's cost is the inclusive cost of \
         the server's `call()` (the command, what it replicates, the server's bookkeeping; \
         not parsing the request or writing to the socket), divided by the number of \
         commands, which is checked against the number of times `call()` was entered. \
         In brackets, the whole process's count for the step divided by the commands: \
         reading and parsing the requests, command filters, `call()`, writing the \
         replies, the event loop; less the servers' timers (`serverCron`, the modules' \
         timers, Valkey 9's `clientsTimeProc`), which run by the clock, not per command, \
         and so fall into a step as much as callgrind's speed on a shared machine lets \
         them. The natives, `SET key token IFEQ token PX \
         ttl` (Valkey 8.1+, Redis 8.4+) and compare-and-delete (`DELIFEQ key token` on \
         Valkey 9.0+, `DELEX key IFEQ token` on Redis 8.4+, counted in the same row), are \
         found by trying them on each server; the table says where a server has none. \
         The module is loaded throughout, so the servers' own commands pay its tax \
         (below) here too. Server time per call is in [bench.md](bench.md).\n"
    );
    header(&mut md, "Command: call() [whole process]", all);
    for step in Step::ALL {
        let _ = write!(md, "| `{}` |", step.label());
        for c in all {
            match step.missing(c.natives) {
                Some(why) => {
                    let _ = write!(md, " {why} |");
                }
                None => {
                    let cost = c.sum(&[step]);
                    let _ = write!(md, " {:.0} [{:.0}] |", cost.call, cost.whole);
                }
            }
        }
        md.push('\n');
    }
    let _ = writeln!(
        md,
        "\n`scripts/test` fails when a ratio of `call()` counts is over its bound (in \
         parentheses; the bounds are in `benches/instructions.rs`). The bounds hold what \
         has been reached, today's figures plus a few percent, so that nothing gets \
         slower unnoticed; issue 27's goals, in the last column, are where they are to \
         be lowered to.\n"
    );
    header_with(
        &mut md,
        "Ratio, redis-lease over: call() [whole process] (bound)",
        all,
        Some("Goal (issue 27)"),
    );
    for bound in BOUNDS {
        let _ = write!(md, "| {} |", bound.what);
        for c in all {
            let (cell, within) = bound_cell(c, bound);
            ok &= within;
            let _ = write!(md, " {cell} |");
        }
        let _ = writeln!(md, " {} |", bound.goal);
    }
    ok &= shared_report(&mut md, all, shared_calls);
    ok &= session_report(&mut md, all, options.session_calls);
    ok &= tax_report(&mut md, all, options.tax_calls);
    (md, ok)
}

/// One ratio's cell, and whether it holds: within its bound, or not counted on a
/// server that has no native for it and no bound there.
fn bound_cell(c: &Counts, bound: &Bound) -> (String, bool) {
    let max = bound.max(c.flavor);
    let fail = |why: String| {
        eprintln!("instructions: {}: {}: {why}", c.flavor, bound.what);
        (format!("{why} **fails**"), false)
    };
    match (c.missing(bound), max.is_nan()) {
        (Some(why), true) => (why.to_string(), true),
        (Some(why), false) => fail(format!("{why}, but a bound of {max:.2} is set")),
        (None, true) => {
            let r = c.ratio(bound);
            fail(format!("{:.3}, counted but no bound set", r.call))
        }
        (None, false) => {
            let r = c.ratio(bound);
            let within = r.call <= max;
            let cell = format!("{:.3} [{:.3}] (≤ {max:.2})", r.call, r.whole);
            if within {
                (cell, true)
            } else {
                eprintln!(
                    "instructions: {}: {} is {:.3}, over its bound {max:.2}",
                    c.flavor, bound.what, r.call
                );
                (format!("{cell} **over**"), false)
            }
        }
    }
}

/// A table header with one column per server.
fn header(md: &mut String, first: &str, all: &[Counts]) {
    header_with(md, first, all, None);
}

/// A table header with one column per server, and a last column `last` when given.
fn header_with(md: &mut String, first: &str, all: &[Counts], last: Option<&str>) {
    let _ = write!(md, "| {first} |");
    for c in all {
        let _ = write!(md, " {} |", c.version);
    }
    if let Some(last) = last {
        let _ = write!(md, " {last} |");
    }
    let _ = write!(md, "\n|---|");
    for _ in all {
        let _ = write!(md, "---:|");
    }
    if last.is_some() {
        md.push_str("---|");
    }
    md.push('\n');
}

fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// The shared-hold tables; false when a growth is over its bound.
fn shared_report(md: &mut String, all: &[Counts], shared_calls: usize) -> bool {
    let mut ok = true;
    if all.iter().any(|c| c.shared.is_empty()) {
        let _ = writeln!(
            md,
            "\nShared holds not counted: the module has no `SHARED` (before issue 16)."
        );
        return ok;
    }
    let sizes = SHARED_SIZES.map(thousands).join(", ");
    let _ = writeln!(
        md,
        "\n## Shared holds vs a sorted-set semaphore\n\n\
         One hold acquired, renewed and released by token among {sizes} holds on its key, \
         both ways on the same server after the steps above: `LEASE.ACQUIRE … SHARED LIMIT \
         {limit}` against the semaphore built the usual way, a sorted set of tokens scored \
         by deadline (acquire: `EVALSHA` of `TIME`, `ZREMRANGEBYSCORE` the expired, \
         `ZCARD`, `ZADD`; renew: `EVALSHA` of `ZSCORE`, `TIME`, `ZADD XX`; release: \
         `ZREM`), {limit} permits. About {shared_calls} commands per step at each size: the \
         keys hold 90% of the size before the steps; the acquire step takes the last 10% \
         (at least one hold per key), the renew step renews as many holds spread evenly \
         over each key's holds, old and new, the release step releases as many others, \
         also spread. With one hold the key has only the hold measured: ACQUIRE creates \
         the key and RELEASE deletes it. A sorted set of up to 128 members is a listpack \
         (the servers' default `zset-max-listpack-entries`), so at 1 and 100 holds the \
         semaphore is a listpack and at 10,000 a skiplist.\n",
        limit = std::str::from_utf8(SHARED_LIMIT).unwrap_or("?"),
    );
    header(md, "Command, holds on the key", all);
    for op in SharedOp::ALL {
        for size in SHARED_SIZES {
            let _ = write!(md, "| `{}`, {} |", op.label(), thousands(size));
            for c in all {
                let _ = write!(md, " {:.0} |", c.shared(op, size));
            }
            md.push('\n');
        }
    }
    md.push('\n');
    header(
        md,
        &format!(
            "Growth, {} holds over 1 (bound)",
            thousands(SHARED_SIZES[SHARED_SIZES.len() - 1])
        ),
        all,
    );
    for op in SharedOp::ALL {
        let bound = GROWTH_BOUNDS.iter().find(|g| g.op == op);
        let _ = write!(md, "| `{}` |", op.label());
        for c in all {
            let g = c.growth(op);
            match bound {
                Some(b) => {
                    let within = g <= b.max;
                    ok &= within;
                    let over = if within { "" } else { " **over**" };
                    let _ = write!(md, " {g:.3} (≤ {:.2}){over} |", b.max);
                    if !within {
                        eprintln!(
                            "instructions: {}: {} grows {g:.3}x from 1 hold to {}, over its bound {:.2}",
                            c.flavor,
                            op.label(),
                            SHARED_SIZES[SHARED_SIZES.len() - 1],
                            b.max
                        );
                    }
                }
                None => {
                    let _ = write!(md, " {g:.3} |");
                }
            }
        }
        md.push('\n');
    }
    md.push('\n');
    header(md, "Ratio, shared hold over the semaphore, holds", all);
    for size in SHARED_SIZES {
        for op in [SharedOp::Acquire, SharedOp::Renew, SharedOp::Release] {
            let _ = write!(
                md,
                "| {} vs {}, {} |",
                op.label().split(' ').next().unwrap_or(""),
                op.sem().label().split(" (").next().unwrap_or(""),
                thousands(size)
            );
            for c in all {
                let _ = write!(
                    md,
                    " {:.3} |",
                    c.shared(op, size) / c.shared(op.sem(), size)
                );
            }
            md.push('\n');
        }
        let _ = write!(md, "| full cycle, {} |", thousands(size));
        for c in all {
            let sum = |ops: [SharedOp; 3]| ops.iter().map(|&o| c.shared(o, size)).sum::<f64>();
            let native = sum([SharedOp::Acquire, SharedOp::Renew, SharedOp::Release]);
            let sem = sum([
                SharedOp::SemAcquire,
                SharedOp::SemRenew,
                SharedOp::SemRelease,
            ]);
            let _ = write!(md, " {:.3} |", native / sem);
        }
        md.push('\n');
    }
    ok
}

/// The session tables; false when a ratio is over its bound.
fn session_report(md: &mut String, all: &[Counts], calls: usize) -> bool {
    let mut ok = true;
    if all.iter().any(|c| c.sessions.is_empty()) {
        let _ = writeln!(
            md,
            "\nSessions not counted: the module has no `SESSION` (before issue 17)."
        );
        return ok;
    }
    let _ = writeln!(
        md,
        "\n## Sessions\n\n\
         In an empty database after the steps above, {calls} commands per step, in this \
         order: `LEASE.RENEW` of a session (an exclusive lease, 1 h) with no hold bound to \
         it; a plain `LEASE.ACQUIRE` of fresh keys; `LEASE.ACQUIRE` of fresh keys bound to \
         the session with ttl 0 (`SESSION`); then, once {bound} holds are bound to the \
         session (the rest bound with callgrind's instrumentation off, not counted), \
         `LEASE.RENEW` of the session again and a plain `LEASE.ACQUIRE` of fresh keys again. \
         32-hex-character tokens throughout. Before each ACQUIRE step, as many acquires of \
         the same kind on other keys are made and released, uncounted, so that each finds \
         the allocator with freed blocks to reuse, as on a server whose keys come and go. \
         The plain ACQUIRE before any hold is bound on the server takes version 1's compact \
         path; once one is, every grant also looks at whether the key it replaces was a \
         session.\n",
        bound = thousands(BOUND_HOLDS),
    );
    header(md, "Command", all);
    for op in SessionOp::ALL {
        let _ = write!(md, "| `{}` |", op.label());
        for c in all {
            let _ = write!(md, " {:.0} |", c.session(op));
        }
        md.push('\n');
    }
    md.push('\n');
    header(md, "Ratio (bound)", all);
    let ratios: [(&str, SessionOp, SessionOp); 3] = [
        (
            "RENEW of a session, 100,000 bound holds over 0",
            SessionOp::RenewBound,
            SessionOp::RenewAlone,
        ),
        (
            "ACQUIRE with SESSION (ttl 0) over a plain ACQUIRE",
            SessionOp::AcquireBound,
            SessionOp::Acquire,
        ),
        (
            "plain ACQUIRE, 100,000 holds bound on the server over none",
            SessionOp::AcquireAmongBound,
            SessionOp::Acquire,
        ),
    ];
    for (what, over, base) in ratios {
        let bound = SESSION_BOUNDS
            .iter()
            .find(|b| b.over == over && b.base == base);
        let _ = write!(md, "| {what} |");
        for c in all {
            let r = c.session(over) / c.session(base);
            match bound {
                Some(b) => {
                    let within = r <= b.max;
                    ok &= within;
                    let over = if within { "" } else { " **over**" };
                    let _ = write!(md, " {r:.3} (≤ {:.2}){over} |", b.max);
                    if !within {
                        eprintln!(
                            "instructions: {}: {} is {r:.3}, over its bound {:.2}",
                            c.flavor, b.what, b.max
                        );
                    }
                }
                None => {
                    let _ = write!(md, " {r:.3} |");
                }
            }
        }
        md.push('\n');
    }
    ok
}

fn main() {
    let options = parse_options();
    let all: Vec<Counts> = options
        .flavors
        .iter()
        .map(|&f| count(f, &options))
        .collect();
    let (md, ok) = report(&all, &options);
    println!("{md}");
    if let Some(out) = &options.out {
        std::fs::write(out, &md).unwrap_or_else(|e| panic!("cannot write {}: {e}", out.display()));
        println!("wrote {}", out.display());
    }
    if !ok {
        eprintln!("instructions: a ratio is over its bound");
        std::process::exit(1);
    }
}
