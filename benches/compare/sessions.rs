//! Sessions (issue 17): what one keepalive saves, and what a session's end costs.
//!
//! - `keepalive`: N leases kept alive for `session_rounds` periods at ttl
//!   `session_ttl`, renewed every `session_period`, three ways on one server, one after
//!   the other in each run: bound to one session with ttl 0 and one `LEASE.RENEW` of the
//!   session per period; N leases of their own and N `LEASE.RENEW`s per period (one
//!   pipeline); and, as the baseline, nothing sent while the largest N leases of 1 h are
//!   held. For each: the commands sent, their server CPU (`usec` of `INFO commandstats`
//!   after `CONFIG RESETSTAT`) and the server process's CPU (`used_cpu_sys` +
//!   `used_cpu_user` of `INFO cpu`: the reaper's ticks, the server's cron and the network
//!   as well) over the span.
//! - `end`: a session with `session_end_holds` bound holds (ttl 0) released: the
//!   probe of `expiry` (PING round trips) from before the release until every bound key
//!   is reaped (DBSIZE 0), the reaper's longest tick (`lease-reap`), the RELEASE's own
//!   round trip and server CPU; with `--sessions`, against as many leases expiring
//!   together on the same server, the two in turn. Binding the holds is probed too:
//!   the worst PING round trip while they are bound, and the server's longest command
//!   (`command` and `fast-command` of its latency monitor).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::{
    cmdstat, connect, expiry_run, flushall, latency_max, latency_reset, max_p99, probe_drain,
    progress, spawn_probe, start, ExpiryOutcome, ExpiryWay, Plan, Samples, Way, EXPIRY_LEAD,
    LONG_TTL,
};
use harness::resp::{decimal, Conn, Reply};
use harness::workload::{
    acquire, acquire_bound, drive, is_one, key, renew, supports_sessions, token,
};
use harness::{Flavor, Server, ServerOptions};

/// The session both measurements hold.
const SESSION_KEY: &[u8] = b"bench:session";

fn session_token() -> [u8; 32] {
    token(3_000_000_000)
}

/// The ways to keep N leases alive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keep {
    /// Nothing sent: the largest N leases held with a ttl of 1 h (the baseline).
    Idle,
    /// N holds bound to one session with ttl 0, one RENEW of the session per period.
    Session,
    /// N leases, N RENEWs per period.
    Each,
}

impl Keep {
    pub fn label(self) -> &'static str {
        match self {
            Keep::Idle => "nothing sent",
            Keep::Session => "one session",
            Keep::Each => "a RENEW per lease",
        }
    }
}

/// One way of keeping the leases alive, over the runs.
#[derive(Clone, Debug, Default)]
pub struct KeepWay {
    /// Commands sent over the span (the renewals).
    pub commands: Samples,
    /// Server CPU of those commands, `INFO commandstats`, ms.
    pub renew_ms: Samples,
    /// The server process's CPU over the span, `used_cpu_sys` + `used_cpu_user`, ms.
    pub cpu_ms: Samples,
}

#[derive(Clone, Debug, Default)]
pub struct KeepPoint {
    pub leases: usize,
    pub session: KeepWay,
    pub each: KeepWay,
}

#[derive(Clone, Debug, Default)]
pub struct SessionEnd {
    pub holds: usize,
    /// From the release of the session until its bound keys are all deleted.
    pub session: ExpiryWay,
    /// As many leases expiring together (`--sessions` only; section d has its own).
    pub leases: Option<ExpiryWay>,
    /// The RELEASE of the session: round trip as the client saw it, and its server CPU
    /// (`INFO commandstats`), µs.
    pub release_rtt_us: Samples,
    pub release_us: Samples,
    /// Binding the holds: the probe's worst and 99th-percentile round trip, µs, and the
    /// server's longest command, ms (whole ms, 0 = none reached 1 ms).
    pub bind_max_us: Samples,
    pub bind_p99_us: Samples,
    pub bind_step_ms: Samples,
}

#[derive(Clone, Debug, Default)]
pub struct SessionResult {
    /// False when the module has no `SESSION` (before issue 17): nothing was run.
    pub supported: bool,
    pub keepalive: Vec<KeepPoint>,
    /// Nothing sent, the largest N leases held.
    pub idle: KeepWay,
    pub end: SessionEnd,
}

/// The session benches on `flavor`; with `compare_expiry`, the session's end alternates
/// with as many leases expiring together.
pub fn bench(flavor: Flavor, plan: &Plan, compare_expiry: bool) -> SessionResult {
    let supported = {
        let server = start(flavor);
        supports_sessions(&mut connect(&server))
    };
    let mut result = SessionResult {
        supported,
        ..Default::default()
    };
    if !supported {
        progress(&format!(
            "{flavor}: the module has no LEASE.ACQUIRE ... SESSION: sessions not measured"
        ));
        return result;
    }
    let (keepalive, idle) = bench_keepalive(flavor, plan);
    result.keepalive = keepalive;
    result.idle = idle;
    result.end = bench_end(flavor, plan, compare_expiry);
    result
}

// ---------------------------------------------------------------------------------------
// i. Keeping N leases alive

fn bench_keepalive(flavor: Flavor, plan: &Plan) -> (Vec<KeepPoint>, KeepWay) {
    let server = start(flavor);
    let mut conn = connect(&server);
    let mut points: Vec<KeepPoint> = plan
        .session_sizes
        .iter()
        .map(|&leases| KeepPoint {
            leases,
            ..Default::default()
        })
        .collect();
    let mut idle = KeepWay::default();
    let most = plan.session_sizes.iter().copied().max().unwrap_or(1);
    for run in 0..plan.runs {
        for point in points.iter_mut() {
            let ways = if run % 2 == 0 {
                [Keep::Each, Keep::Session]
            } else {
                [Keep::Session, Keep::Each]
            };
            for way in ways {
                let into = match way {
                    Keep::Session => &mut point.session,
                    _ => &mut point.each,
                };
                keepalive_run(&mut conn, way, point.leases, plan, into);
            }
        }
        keepalive_run(&mut conn, Keep::Idle, most, plan, &mut idle);
        progress(&format!(
            "session keepalive run {}/{} done",
            run + 1,
            plan.runs
        ));
    }
    flushall(&mut conn);
    (points, idle)
}

/// `used_cpu_sys` + `used_cpu_user` of the server process, ms.
fn process_cpu_ms(conn: &mut Conn) -> f64 {
    let info = conn.must(&["INFO", "cpu"]).text();
    let field = |f: &str| -> f64 {
        harness::info_field(&info, f)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("INFO cpu has no {f}"))
    };
    (field("used_cpu_sys") + field("used_cpu_user")) * 1e3
}

/// Keeps `n` leases alive one way for `session_rounds` periods, and records it.
fn keepalive_run(conn: &mut Conn, way: Keep, n: usize, plan: &Plan, into: &mut KeepWay) {
    flushall(conn);
    let ttl = decimal(plan.session_ttl.as_millis() as u64);
    let st = session_token();
    let k = |i: usize| key("keep", i);
    match way {
        Keep::Session => {
            drive(
                conn,
                1,
                "the session",
                |_, b| acquire(b, SESSION_KEY, &st, &ttl),
                |_, r| r.is_grant(),
            );
            drive(
                conn,
                n,
                "bind the leases to the session",
                |i, b| acquire_bound(b, &k(i), &token(i), b"0", SESSION_KEY, &st),
                |_, r| r.is_grant(),
            );
        }
        Keep::Each | Keep::Idle => {
            let ttl: &[u8] = if way == Keep::Idle { LONG_TTL } else { &ttl };
            drive(
                conn,
                n,
                "the leases",
                |i, b| acquire(b, &k(i), &token(i), ttl),
                |_, r| r.is_grant(),
            );
        }
    }
    conn.must(&["CONFIG", "RESETSTAT"]);
    let cpu_before = process_cpu_ms(conn);
    let started = Instant::now();
    let mut sent = 0;
    for round in 1..=plan.session_rounds {
        let at = started + plan.session_period * round as u32;
        thread::sleep(at.saturating_duration_since(Instant::now()));
        let what = "keepalive renewals";
        match way {
            Keep::Session => {
                drive(
                    conn,
                    1,
                    what,
                    |_, b| renew(b, SESSION_KEY, &st, &ttl),
                    |_, r| is_one(r),
                );
                sent += 1;
            }
            Keep::Each => {
                drive(
                    conn,
                    n,
                    what,
                    |i, b| renew(b, &k(i), &token(i), &ttl),
                    |_, r| is_one(r),
                );
                sent += n;
            }
            Keep::Idle => {}
        }
    }
    let cpu_ms = process_cpu_ms(conn) - cpu_before;
    let renew_ms = if sent > 0 {
        let stat = cmdstat(conn, "lease.renew");
        assert_eq!(
            stat.calls,
            sent as u64,
            "keepalive ({}): commandstats counted {} renewals, the bench sent {sent}",
            way.label(),
            stat.calls
        );
        stat.usec as f64 / 1e3
    } else {
        0.0
    };
    if way == Keep::Session {
        // Every bound hold is still live: the session kept them.
        let bound = session_bound(conn);
        assert_eq!(bound, n as i64, "holds still bound to the session");
    }
    into.commands.push(sent as f64);
    into.renew_ms.push(renew_ms);
    into.cpu_ms.push(cpu_ms);
}

/// `bound` of `LEASE.INFO` of the session: its live bound holds.
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
// j. A session's end

fn bench_end(flavor: Flavor, plan: &Plan, compare_expiry: bool) -> SessionEnd {
    // As `bench_expiry`: the latency monitor times the reaper's ticks.
    let options = ServerOptions::new().config("latency-monitor-threshold", "1");
    let server = Server::start_with(flavor, options);
    let mut conn = connect(&server);
    let n = plan.session_end_holds;
    let mut result = SessionEnd {
        holds: n,
        leases: compare_expiry.then(ExpiryWay::default),
        ..Default::default()
    };
    let mut grant_estimate = Duration::from_micros(10 * n as u64);
    for run in 0..plan.runs {
        let session_first = run % 2 == 1 || !compare_expiry;
        for session in [session_first, !session_first] {
            if session {
                let (bind, outcome, rtt_us, release_us) = end_run(&server, &mut conn, n);
                result.bind_max_us.push(bind.0);
                result.bind_p99_us.push(bind.1);
                result.bind_step_ms.push(bind.2);
                result.session.push(&outcome);
                result.release_rtt_us.push(rtt_us);
                result.release_us.push(release_us);
            } else if let Some(leases) = result.leases.as_mut() {
                let (outcome, took) =
                    expiry_run(&server, &mut conn, Way::Native, n, grant_estimate);
                grant_estimate = grant_estimate.max(took.mul_f64(1.3));
                leases.push(&outcome);
            }
            if !compare_expiry {
                break;
            }
        }
        progress(&format!("session end run {}/{} done", run + 1, plan.runs));
    }
    flushall(&mut conn);
    result
}

/// Binds `n` holds to a session, releases it at a deadline, and times the probe until
/// every bound key is deleted. Returns the binding's probe (worst and 99th-percentile
/// round trip, µs) and longest command (ms), that, and the RELEASE's round trip and
/// server CPU, µs.
fn end_run(
    server: &Server,
    conn: &mut Conn,
    n: usize,
) -> ((f64, f64, f64), ExpiryOutcome, f64, f64) {
    flushall(conn);
    let st = session_token();
    drive(
        conn,
        1,
        "the session",
        |_, b| acquire(b, SESSION_KEY, &st, LONG_TTL),
        |_, r| r.is_grant(),
    );
    latency_reset(conn);
    let ((), bind_max_us, bind_p99_us) = probed(server, || {
        drive(
            conn,
            n,
            "bind the holds to the session",
            |i, b| acquire_bound(b, &key("end", i), &token(i), b"0", SESSION_KEY, &st),
            |_, r| r.is_grant(),
        )
    });
    let bind_step_ms = latency_max(conn, "command").max(latency_max(conn, "fast-command"));
    assert_eq!(session_bound(conn), n as i64, "holds bound to the session");
    conn.must(&["CONFIG", "RESETSTAT"]);
    latency_reset(conn);
    let deadline = Instant::now() + EXPIRY_LEAD;
    let mut rtt_us = f64::NAN;
    let mut release = |c: &mut Conn| {
        let sent = Instant::now();
        let reply = c
            .call(&[b"LEASE.RELEASE", SESSION_KEY, &st])
            .unwrap_or_else(|e| panic!("LEASE.RELEASE of the session: {e}"));
        rtt_us = sent.elapsed().as_secs_f64() * 1e6;
        assert!(is_one(&reply), "LEASE.RELEASE of the session: {reply:?}");
    };
    let mut outcome = probe_drain(server, conn, deadline, Some(&mut release));
    outcome.server_step_ms = latency_max(conn, Way::Native.deletion_event());
    let stat = cmdstat(conn, "lease.release");
    assert_eq!(stat.calls, 1, "commandstats: one LEASE.RELEASE");
    let bind = (bind_max_us, bind_p99_us, bind_step_ms);
    (bind, outcome, rtt_us, stat.usec as f64)
}

/// Runs `work` while a second connection sends PING in a loop (`spawn_probe`); returns
/// what it returned and the probe's worst and 99th-percentile round trips, µs.
fn probed<T>(server: &Server, work: impl FnOnce() -> T) -> (T, f64, f64) {
    let stop = Arc::new(AtomicBool::new(false));
    let probe = spawn_probe(server, &stop);
    let done = work();
    stop.store(true, Ordering::Relaxed);
    let samples = probe.join().unwrap_or_else(|_| panic!("the probe failed"));
    let rtts: Vec<u32> = samples.into_iter().map(|(_, rtt)| rtt).collect();
    let (max_us, p99_us) = max_p99(&rtts);
    (done, max_us, p99_us)
}
