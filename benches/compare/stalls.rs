//! Stalls (issue 27, "No server step over 2 ms at any N"): the longest pause the server
//! makes while it does a large amount of lease work at once, seen two ways: the worst
//! round trip of a probe client sending PING throughout (`spawn_probe`), and the steps
//! the server itself timed (its latency monitor, `latency-monitor-threshold 1`: the
//! reaper's `lease-reap`, `command`, `fast-command`, `expire-cycle`, `eviction-cycle`
//! and whatever else reached 1 ms).
//!
//! - `binding`: `stall_keys` holds bound to one session (ttl 0), pipelined; how long
//!   binding them took.
//! - `session end`: that session released at a deadline; the time until every bound key
//!   is deleted (DBSIZE 0).
//! - `expiry`: `stall_keys` leases with one deadline against as many `SET NX PX`
//!   strings with one deadline (section d's `expiry_run`, both ways in turn), the time
//!   from the deadline until DBSIZE is 0 for each, and their ratio.
//! - `eviction restore`: `stall_evict_keys` live leases, then as many filler strings
//!   (newer, so `allkeys-lru` takes the leases first), then `maxmemory` lowered to half
//!   the fillers' memory under what is used, with `lease.allkeys-eviction restore`: the
//!   time until memory is under the limit and every evicted lease is written back, how
//!   many were, and that every lease is still held by its token after. Redis 7.0 has no
//!   post-notification jobs: `restore` is refused there, and the report says so.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::report::{count, quick_banner, times, Machine};
use crate::{
    connect, expiry_run, fill, flushall, info_number, latency_events, latency_reset, max_p99,
    probe_drain, progress, settled_used_memory, spawn_probe, Plan, Samples, Way, DRAIN_LIMIT,
    EXPIRY_LEAD, LONG_TTL,
};
use harness::resp::{encode, Conn, Reply};
use harness::workload::{
    acquire, acquire_bound, drive, is_one, key, renew, supports_sessions, token,
};
use harness::{Flavor, Server, ServerOptions};

const SESSION_KEY: &[u8] = b"stall:session";
/// Bytes of each filler string of the eviction step.
const FILLER_LEN: usize = 512;
/// The bounds: no server step over 2 ms; leases clear within 1.2× the strings.
const STEP_GOAL_MS: f64 = 2.0;
const CLEAR_GOAL: f64 = 1.2;
/// Commands at least this slow are kept by `SLOWLOG` during a step, µs.
const SLOWLOG_US: &str = "2000";
const SLOWEST_KEPT: usize = 3;
/// Latency events that time no work of the server's: `module-acquire-GIL` is the main
/// thread taking the modules' lock after each sleep of its event loop (and firing the
/// after-sleep event, to which this module does not listen). The module runs no thread
/// that could hold it, so a sample there is the server's thread waiting for a CPU: the
/// machine, which the probe sees too. Listed, never taken as the longest server step.
const MACHINE_EVENTS: [&str; 1] = ["module-acquire-GIL"];

/// One step over the runs.
#[derive(Clone, Debug, Default)]
pub struct Step {
    pub n: usize,
    /// The probe's worst and 99th-percentile round trip over the step, µs.
    pub probe_max_us: Samples,
    pub probe_p99_us: Samples,
    pub probes: Samples,
    /// The largest sample of each latency-monitor event, over all runs, ms (whole ms,
    /// as the server truncates them).
    pub events: BTreeMap<String, f64>,
    /// How long the step took, ms: binding every hold; from the release or the deadline
    /// until every key is deleted; from lowering `maxmemory` until eviction is done.
    pub time_ms: Samples,
    /// The slowest commands of the step over all runs (`SLOWLOG`, 2 ms and more): µs
    /// and the command, its arguments cut short.
    pub slowest: Vec<(u64, String)>,
}

impl Step {
    fn new(n: usize) -> Step {
        Step {
            n,
            ..Default::default()
        }
    }

    fn record(&mut self, probe: (f64, f64, usize), events: Vec<(String, f64)>, time_ms: f64) {
        self.probe_max_us.push(probe.0);
        self.probe_p99_us.push(probe.1);
        self.probes.push(probe.2 as f64);
        for (name, ms) in events {
            let worst = self.events.entry(name).or_insert(0.0);
            *worst = worst.max(ms);
        }
        self.time_ms.push(time_ms);
    }

    /// Adds the commands `SLOWLOG` kept since `slowlog_reset`, keeping the slowest few.
    fn record_slowlog(&mut self, conn: &mut Conn) {
        self.slowest.extend(slowlog(conn));
        self.slowest.sort_by_key(|&(us, _)| std::cmp::Reverse(us));
        self.slowest.truncate(SLOWEST_KEPT);
    }

    /// The longest step of work the server timed and its event, if any reached 1 ms.
    pub fn worst_event(&self) -> Option<(&str, f64)> {
        self.events
            .iter()
            .filter(|(name, _)| !MACHINE_EVENTS.contains(&name.as_str()))
            .map(|(name, &ms)| (name.as_str(), ms))
            .max_by(|a, b| a.1.total_cmp(&b.1))
    }

    pub fn worst_event_ms(&self) -> f64 {
        self.worst_event().map_or(0.0, |(_, ms)| ms)
    }
}

/// The eviction step, where the server can restore evicted leases.
#[derive(Clone, Debug, Default)]
pub struct Eviction {
    pub step: Step,
    pub fillers: usize,
    /// `used_memory` once full, and the `maxmemory` it was then lowered to, bytes.
    pub full_bytes: Samples,
    pub maxmemory: Samples,
    /// `evicted_keys` of `INFO stats`, `lease_evicted` and `lease_restored` of `INFO
    /// lease`, over the step.
    pub evicted_keys: Samples,
    pub leases_evicted: Samples,
    pub leases_restored: Samples,
    /// Leases not held by their token after the step (each RENEWed by it).
    pub leases_lost: Samples,
}

#[derive(Clone, Debug)]
pub struct StallResult {
    /// As many `SET NX PX` strings written the same way: the anchor for binding.
    pub string_fill: Step,
    pub binding: Step,
    pub session_end: Step,
    pub lease_expiry: Step,
    pub string_expiry: Step,
    /// `Err`: why the eviction step could not run on this server (the server's answer).
    pub eviction: Result<Eviction, String>,
}

/// The stall measurements on `flavor`, one server for all of them.
pub fn bench(flavor: Flavor, plan: &Plan) -> StallResult {
    let options = ServerOptions::new().config("latency-monitor-threshold", "1");
    let server = Server::start_with(flavor, options);
    let mut conn = connect(&server);
    assert!(
        supports_sessions(&mut conn),
        "{flavor}: the module has no LEASE.ACQUIRE ... SESSION"
    );
    let n = plan.stall_keys;
    let mut result = StallResult {
        string_fill: Step::new(n),
        binding: Step::new(n),
        session_end: Step::new(n),
        lease_expiry: Step::new(n),
        string_expiry: Step::new(n),
        eviction: Ok(Eviction {
            step: Step::new(plan.stall_evict_keys),
            fillers: plan.stall_evict_keys,
            ..Default::default()
        }),
    };
    let mut grant_estimate = Duration::from_micros(10 * n as u64);
    for run in 0..plan.runs {
        session_run(&server, &mut conn, n, &mut result);
        progress(&format!("{flavor}: stalls run {}: session done", run + 1));
        let ways = if run % 2 == 0 {
            [Way::Lua, Way::Native]
        } else {
            [Way::Native, Way::Lua]
        };
        for way in ways {
            let (outcome, took) = expiry_run(&server, &mut conn, way, n, grant_estimate);
            grant_estimate = grant_estimate.max(took.mul_f64(1.3));
            let into = match way {
                Way::Native => &mut result.lease_expiry,
                Way::Lua => &mut result.string_expiry,
            };
            into.record(
                (outcome.max_us, outcome.p99_us, outcome.probes),
                latency_events(&mut conn),
                outcome.drain_ms,
            );
        }
        flushall(&mut conn);
        progress(&format!("{flavor}: stalls run {}: expiry done", run + 1));
        if let Ok(eviction) = result.eviction.as_mut() {
            if let Err(refused) = eviction_run(&server, &mut conn, eviction) {
                progress(&format!(
                    "{flavor}: eviction restore not available: {refused}"
                ));
                result.eviction = Err(refused);
            }
        }
        progress(&format!(
            "{flavor}: stalls run {}/{} done",
            run + 1,
            plan.runs
        ));
    }
    flushall(&mut conn);
    result
}

/// Empties `SLOWLOG`, which keeps every command of `SLOWLOG_US` or more from now on.
fn slowlog_reset(conn: &mut Conn) {
    conn.must(&["CONFIG", "SET", "slowlog-log-slower-than", SLOWLOG_US]);
    conn.must(&["CONFIG", "SET", "slowlog-max-len", "1024"]);
    conn.must(&["SLOWLOG", "RESET"]);
}

/// The commands `SLOWLOG` kept: µs, and the command with its first arguments.
fn slowlog(conn: &mut Conn) -> Vec<(u64, String)> {
    let reply = conn
        .call(&[b"SLOWLOG", b"GET", b"1024"])
        .unwrap_or_else(|e| panic!("SLOWLOG GET: {e}"));
    let Reply::Array(Some(entries)) = reply else {
        panic!("SLOWLOG GET: {reply:?}");
    };
    entries
        .iter()
        .map(|entry| {
            let Reply::Array(Some(fields)) = entry else {
                panic!("SLOWLOG GET: {entry:?}");
            };
            let us = fields
                .get(2)
                .and_then(Reply::int)
                .unwrap_or_else(|| panic!("SLOWLOG GET: {entry:?}"));
            let args = match fields.get(3) {
                Some(Reply::Array(Some(args))) => args
                    .iter()
                    .take(3)
                    .map(|a| String::from_utf8_lossy(a.bulk().unwrap_or(b"?")).into_owned())
                    .collect::<Vec<_>>()
                    .join(" "),
                _ => panic!("SLOWLOG GET: {entry:?}"),
            };
            (us as u64, args)
        })
        .collect()
}

/// Runs `work` while the probe sends PING; returns what it returned, the probe's worst
/// and 99th-percentile round trips, µs, and how many it sent.
fn probed<T>(server: &Server, work: impl FnOnce() -> T) -> (T, (f64, f64, usize)) {
    let stop = Arc::new(AtomicBool::new(false));
    let probe = spawn_probe(server, &stop);
    let done = work();
    stop.store(true, Ordering::Relaxed);
    let samples = probe.join().unwrap_or_else(|_| panic!("the probe failed"));
    let rtts: Vec<u32> = samples.into_iter().map(|(_, rtt)| rtt).collect();
    let (max_us, p99_us) = max_p99(&rtts);
    (done, (max_us, p99_us, rtts.len()))
}

/// FLUSHALL, and then wait until the server has freed what it held: Valkey frees a
/// flushed keyspace in a background thread by default (`lazyfree-lazy-user-flush`),
/// which would otherwise run during the next step, on a machine of two cores.
fn emptied(conn: &mut Conn) {
    flushall(conn);
    let deadline = Instant::now() + DRAIN_LIMIT;
    while info_number(conn, "memory", "lazyfree_pending_objects") > 0 {
        assert!(
            Instant::now() < deadline,
            "the flushed keyspace not freed after {DRAIN_LIMIT:?}"
        );
        thread::sleep(Duration::from_millis(5));
    }
}

fn lease_counter(conn: &mut Conn, field: &str) -> u64 {
    info_number(conn, "lease", &format!("lease_{field}"))
}

/// Binds `n` holds to a session, then releases it at a deadline and waits until every
/// bound key is deleted.
fn session_run(server: &Server, conn: &mut Conn, n: usize, result: &mut StallResult) {
    // The anchor: as many strings written the same way, a pipeline at a time.
    emptied(conn);
    latency_reset(conn);
    slowlog_reset(conn);
    let (took, probe) = probed(server, || {
        let started = Instant::now();
        fill(conn, Way::Lua, "stall", 0, n, |_| LONG_TTL.to_vec());
        started.elapsed()
    });
    let events = latency_events(conn);
    result
        .string_fill
        .record(probe, events, took.as_secs_f64() * 1e3);
    result.string_fill.record_slowlog(conn);

    emptied(conn);
    let st = token(3_000_000_000);
    drive(
        conn,
        1,
        "the session",
        |_, b| acquire(b, SESSION_KEY, &st, LONG_TTL),
        |_, r| r.is_grant(),
    );
    latency_reset(conn);
    slowlog_reset(conn);
    let (took, probe) = probed(server, || {
        let started = Instant::now();
        drive(
            conn,
            n,
            "bind the holds to the session",
            |i, b| acquire_bound(b, &key("stall", i), &token(i), b"0", SESSION_KEY, &st),
            |_, r| r.is_grant(),
        );
        started.elapsed()
    });
    let events = latency_events(conn);
    assert_eq!(
        lease_counter(conn, "bound_holds"),
        n as u64,
        "holds bound to the session"
    );
    result
        .binding
        .record(probe, events, took.as_secs_f64() * 1e3);
    result.binding.record_slowlog(conn);

    latency_reset(conn);
    slowlog_reset(conn);
    let deadline = Instant::now() + EXPIRY_LEAD;
    let mut release = |c: &mut Conn| {
        let reply = c
            .call(&[b"LEASE.RELEASE", SESSION_KEY, &st])
            .unwrap_or_else(|e| panic!("LEASE.RELEASE of the session: {e}"));
        assert!(is_one(&reply), "LEASE.RELEASE of the session: {reply:?}");
    };
    let outcome = probe_drain(server, conn, deadline, Some(&mut release));
    let events = latency_events(conn);
    assert_eq!(
        lease_counter(conn, "bound_holds"),
        0,
        "bound holds left after the session's end"
    );
    result.session_end.record(
        (outcome.max_us, outcome.p99_us, outcome.probes),
        events,
        outcome.drain_ms,
    );
    result.session_end.record_slowlog(conn);
}

fn config_set(conn: &mut Conn, name: &str, value: &str) {
    conn.must(&["CONFIG", "SET", name, value]);
}

/// Fills the server with leases and then newer strings, lowers `maxmemory` under
/// `allkeys-lru` with `lease.allkeys-eviction restore`, and waits until eviction is done.
/// `Err` with the server's answer when it refuses `restore`.
fn eviction_run(server: &Server, conn: &mut Conn, into: &mut Eviction) -> Result<(), String> {
    let n = into.step.n;
    emptied(conn);
    config_set(conn, "maxmemory", "0");
    config_set(conn, "maxmemory-policy", "noeviction");
    match conn.call(&[b"CONFIG", b"SET", b"lease.allkeys-eviction", b"restore"]) {
        Ok(Reply::Error(e)) => return Err(e),
        Ok(r) if r.is_ok() => {}
        other => panic!("CONFIG SET lease.allkeys-eviction restore: {other:?}"),
    }
    fill(conn, Way::Native, "evict", 0, n, |_| LONG_TTL.to_vec());
    let with_leases = settled_used_memory(conn);
    let filler = vec![b'f'; FILLER_LEN];
    drive(
        conn,
        into.fillers,
        "filler strings",
        |i, b| encode(b, &[b"SET", &key("filler", i), &filler]),
        |_, r| r.is_ok(),
    );
    let full = settled_used_memory(conn);
    let limit = full - (full - with_leases) / 2;
    // Armed with room to spare first: the module starts listening for evictions from a
    // timer once the policy can take its keys.
    config_set(conn, "maxmemory", &(2 * full).to_string());
    config_set(conn, "maxmemory-policy", "allkeys-lru");
    thread::sleep(Duration::from_millis(200));
    let evicted_keys = info_number(conn, "stats", "evicted_keys");
    let leases_evicted = lease_counter(conn, "evicted");
    let leases_restored = lease_counter(conn, "restored");
    latency_reset(conn);
    slowlog_reset(conn);

    let stop = Arc::new(AtomicBool::new(false));
    let probe = spawn_probe(server, &stop);
    thread::sleep(Duration::from_millis(100));
    let started = Instant::now();
    config_set(conn, "maxmemory", &limit.to_string());
    let took = loop {
        let used = info_number(conn, "memory", "used_memory");
        let evicted = lease_counter(conn, "evicted") - leases_evicted;
        let restored = lease_counter(conn, "restored") - leases_restored;
        if used <= limit && evicted == restored {
            break started.elapsed();
        }
        if started.elapsed() > DRAIN_LIMIT {
            stop.store(true, Ordering::Relaxed);
            panic!(
                "eviction not done {DRAIN_LIMIT:?} after maxmemory {limit}: used_memory \
                 {used}, {evicted} leases evicted, {restored} restored"
            );
        }
        thread::sleep(Duration::from_millis(5));
    };
    let done = Instant::now();
    thread::sleep(Duration::from_millis(100));
    stop.store(true, Ordering::Relaxed);
    let samples = probe.join().unwrap_or_else(|_| panic!("the probe failed"));
    let busy: Vec<u32> = samples
        .iter()
        .filter(|(at, _)| *at >= started && *at <= done)
        .map(|&(_, rtt)| rtt)
        .collect();
    let (max_us, p99_us) = max_p99(&busy);
    let events = latency_events(conn);

    config_set(conn, "maxmemory", "0");
    config_set(conn, "maxmemory-policy", "noeviction");
    config_set(conn, "lease.allkeys-eviction", "refuse");
    let evicted_keys = info_number(conn, "stats", "evicted_keys") - evicted_keys;
    let leases_evicted = lease_counter(conn, "evicted") - leases_evicted;
    let leases_restored = lease_counter(conn, "restored") - leases_restored;
    // Every lease still held by its own token: a RENEW by it answers 1.
    let held = std::cell::Cell::new(0usize);
    drive(
        conn,
        n,
        "renew every lease after eviction",
        |i, b| renew(b, &key("evict", i), &token(i), LONG_TTL),
        |_, r| {
            held.set(held.get() + usize::from(is_one(r)));
            matches!(r, Reply::Int(0 | 1))
        },
    );
    let lost = n - held.get();
    let gauge = lease_counter(conn, "keys");
    assert_eq!(
        gauge,
        held.get() as u64,
        "lease_keys after eviction against the leases a RENEW found"
    );
    if leases_evicted == 0 {
        progress(&format!(
            "eviction: {evicted_keys} keys evicted, none of them a lease: nothing to restore"
        ));
    }
    into.step.record(
        (max_us, p99_us, busy.len()),
        events,
        took.as_secs_f64() * 1e3,
    );
    into.step.record_slowlog(conn);
    into.full_bytes.push(full as f64);
    into.maxmemory.push(limit as f64);
    into.evicted_keys.push(evicted_keys as f64);
    into.leases_evicted.push(leases_evicted as f64);
    into.leases_restored.push(leases_restored as f64);
    into.leases_lost.push(lost as f64);
    flushall(conn);
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The report

/// One server's stall results.
pub struct StallServer {
    pub flavor: Flavor,
    pub version: String,
    pub stalls: StallResult,
}

fn ms(us: f64) -> String {
    format!("{:.2}", us / 1e3)
}

/// `median (min–max)` when there is more than one run.
fn spread(s: &Samples, decimals: usize) -> String {
    if s.0.len() > 1 {
        format!(
            "{:.*} ({:.*}–{:.*})",
            decimals,
            s.median(),
            decimals,
            s.min(),
            decimals,
            s.max()
        )
    } else {
        format!("{:.*}", decimals, s.median())
    }
}

/// `spread` of counts, with thousands separators.
fn spread_count(s: &Samples) -> String {
    if s.0.len() > 1 {
        format!(
            "{} ({}–{})",
            count(s.median()),
            count(s.min()),
            count(s.max())
        )
    } else {
        count(s.median())
    }
}

fn verdict(pass: bool) -> &'static str {
    if pass {
        "PASS"
    } else {
        "FAIL"
    }
}

/// The longest server step as `3 (lease-reap)`, or `< 1` when none reached 1 ms.
fn worst_event_cell(step: &Step) -> String {
    match step.worst_event() {
        Some((name, ms)) => format!("{ms:.0} (`{name}`)"),
        None => "< 1".to_string(),
    }
}

/// Every event that reached 1 ms with its largest sample.
fn events_cell(step: &Step) -> String {
    if step.events.is_empty() {
        return "none".to_string();
    }
    step.events
        .iter()
        .map(|(name, ms)| format!("`{name}` {ms:.0}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A server step under 2 ms: the monitor truncates to whole ms, so a reading of 2 is a
/// step of 2.0 to 2.99 ms and does not pass.
fn step_passes(step: &Step) -> bool {
    step.worst_event_ms() < STEP_GOAL_MS
}

fn probe_passes(step: &Step) -> bool {
    step.probe_max_us.max() <= STEP_GOAL_MS * 1e3
}

fn clear_ratio(r: &StallResult) -> f64 {
    r.lease_expiry.time_ms.median() / r.string_expiry.time_ms.median()
}

/// One line of a server's table.
struct Row<'a> {
    name: &'static str,
    step: &'a Step,
    /// The step's time over the strings' (the leases' expiry).
    ratio: Option<f64>,
    /// The strings' expiry: what the leases are held to, not a goal of its own.
    anchor: bool,
}

/// The steps of one server, the eviction's when it ran.
fn steps(r: &StallResult) -> Vec<Row<'_>> {
    let row = |name, step| Row {
        name,
        step,
        ratio: None,
        anchor: false,
    };
    let mut out = vec![
        Row {
            anchor: true,
            ..row("`SET NX PX` strings written the same way", &r.string_fill)
        },
        row("binding holds to one session", &r.binding),
        row("session end (bound holds deleted)", &r.session_end),
        Row {
            ratio: Some(clear_ratio(r)),
            ..row("leases expiring at one deadline", &r.lease_expiry)
        },
        Row {
            anchor: true,
            ..row(
                "`SET NX PX` strings expiring at one deadline",
                &r.string_expiry,
            )
        },
    ];
    if let Ok(e) = &r.eviction {
        out.push(row("eviction restore", &e.step));
    }
    out
}

pub fn markdown(results: &[StallServer], plan: &Plan, machine: &Machine) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# Stalls: the longest server step at 1M\n");
    let _ = writeln!(
        out,
        "Written by `scripts/bench --stalls{}` on {}; do not edit by hand. Every step on \
         the same server in the same run, on servers started by the bench with \
         `latency-monitor-threshold 1`; times are medians (min–max) of {} runs, the worst \
         probe and the longest server step the worst over all runs. Machine: {} × {}, \
         {:.0} GiB, Linux {}; load average {} at start, {} at end; {:.0} s.\n",
        if plan.quick { " --quick" } else { "" },
        machine.date,
        plan.runs,
        machine.cores,
        machine.cpu_model,
        machine.mem_gib,
        machine.kernel,
        machine.load_start,
        machine.load_end,
        machine.elapsed.as_secs_f64()
    );
    quick_banner(&mut out, plan.quick);
    if let Some(note) = &machine.note {
        let _ = writeln!(out, "Note: {note}\n");
    }
    let n = count(plan.stall_keys as f64);
    let ne = count(plan.stall_evict_keys as f64);
    let _ = writeln!(
        out,
        "Each step is seen two ways. A probe client sends `PING` throughout, 200 µs after \
         each reply: its worst round trip is the longest a client waited, the machine's \
         own scheduling included (two cores shared with other work). The server's latency \
         monitor records every step of its own that took 1 ms or more, under the event's \
         name (the module's reaper ticks as `lease-reap`, a command as `command` or \
         `fast-command`, Redis's active expiry as `expire-cycle`, eviction as \
         `eviction-cycle`, ...), in whole ms, truncated: a reading of 2 is a step of 2.0 \
         to 2.99 ms, so the goal of no step over 2 ms passes at a reading of 1 or none. \
         `module-acquire-GIL` is listed but not taken as a server step: it times the \
         server's thread taking the modules' lock after each sleep, which no thread of \
         this module holds, so a sample there is the thread waiting for a CPU.\n\n\
         - binding: {n} holds bound to one session (`LEASE.ACQUIRE key 0 TOKEN t SESSION \
         s st`), pipelined 1,000 at a time; time = binding them all. The anchor: as many \
         `SET key token NX PX 3600000` written the same way on the emptied server just \
         before (the server's own dictionaries grow as much).\n\
         - session end: that session released (`LEASE.RELEASE`) 2 s after the last bind; \
         time = from the release until every bound key is deleted (DBSIZE 0).\n\
         - expiry: {n} leases with one deadline, and as many `SET NX PX` strings with \
         one deadline, in turn (which goes first alternates between runs); time = from the deadline until \
         DBSIZE 0; ratio = the leases' time over the strings'.\n\
         - eviction restore: {ne} live leases, then {ne} strings of {FILLER_LEN} bytes \
         (newer, so `allkeys-lru` takes leases first); `lease.allkeys-eviction restore`, \
         `maxmemory-policy allkeys-lru`, then `maxmemory` lowered to half the strings' \
         memory under what is used; time = from lowering it until `used_memory` is under \
         it and every evicted lease is written back. After, every lease is renewed by its \
         own token: a lease not held by it is lost. Redis 7.2.4+ and Valkey only.\n"
    );

    // Goals, one column per server.
    let _ = write!(out, "| Goal (issue 27) |");
    for r in results {
        let _ = write!(out, " {} |", r.version);
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "|---|{}", "---|".repeat(results.len()));
    let goal_row = |out: &mut String, label: &str, cell: &dyn Fn(&StallResult) -> String| {
        let _ = write!(out, "| {label} |");
        for r in results {
            let _ = write!(out, " {} |", cell(&r.stalls));
        }
        let _ = writeln!(out);
    };
    let step_cell = |step: &Step| {
        format!(
            "{} **{}**, probe {} ms",
            worst_event_cell(step),
            verdict(step_passes(step)),
            ms(step.probe_max_us.max())
        )
    };
    goal_row(
        &mut out,
        &format!("binding {n} holds: no server step over 2 ms"),
        &|r| step_cell(&r.binding),
    );
    goal_row(
        &mut out,
        &format!("session end, {n} bound holds: no server step over 2 ms"),
        &|r| step_cell(&r.session_end),
    );
    goal_row(
        &mut out,
        &format!("{n} leases expiring: no server step over 2 ms"),
        &|r| step_cell(&r.lease_expiry),
    );
    goal_row(
        &mut out,
        &format!("eviction restore, {ne} leases: no server step over 2 ms"),
        &|r| match &r.eviction {
            Ok(e) => step_cell(&e.step),
            Err(_) => "not available".to_string(),
        },
    );
    goal_row(
        &mut out,
        &format!("{n} leases clear within 1.2× as many `SET NX PX` strings"),
        &|r| {
            let ratio = clear_ratio(r);
            format!("{} **{}**", times(ratio), verdict(ratio <= CLEAR_GOAL))
        },
    );
    let anchor_cell = |step: &Step| {
        format!(
            "{}, probe {} ms",
            worst_event_cell(step),
            ms(step.probe_max_us.max())
        )
    };
    goal_row(
        &mut out,
        &format!("for comparison: {n} `SET NX PX` strings written"),
        &|r| anchor_cell(&r.string_fill),
    );
    goal_row(
        &mut out,
        &format!("for comparison: {n} `SET NX PX` strings expiring"),
        &|r| anchor_cell(&r.string_expiry),
    );
    let _ = writeln!(
        out,
        "\nEach cell: the longest server step, ms (its event), and the worst probe round \
         trip, ms. The worst probe round trip is within 2 ms in {} of the {} lease steps.\n",
        results
            .iter()
            .flat_map(|r| steps(&r.stalls))
            .filter(|row| !row.anchor && probe_passes(row.step))
            .count(),
        results
            .iter()
            .flat_map(|r| steps(&r.stalls))
            .filter(|row| !row.anchor)
            .count()
    );

    for r in results {
        server_section(&mut out, r);
    }
    out
}

fn server_section(out: &mut String, r: &StallServer) {
    let s = &r.stalls;
    let _ = writeln!(out, "## {} (`{}`)\n", r.version, r.flavor);
    let _ = writeln!(
        out,
        "| Step | N | worst probe, ms | probe p99, ms | longest server step, ms | every event ≥ 1 ms, worst ms | time, ms | vs `SET NX PX` strings | goal ≤ 2 ms step, ≤ 1.2× |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---|---|---:|---:|---|");
    for row in steps(s) {
        let step = row.step;
        let mut goal = verdict(step_passes(step)).to_string();
        if let Some(ratio) = row.ratio {
            goal = format!("{goal}, {}", verdict(ratio <= CLEAR_GOAL));
        }
        if row.anchor {
            goal = "(the anchor)".to_string();
        }
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {goal} |",
            row.name,
            count(step.n as f64),
            ms(step.probe_max_us.max()),
            ms(step.probe_p99_us.median()),
            worst_event_cell(step),
            events_cell(step),
            spread(&step.time_ms, 0),
            row.ratio.map_or(String::new(), times),
        );
    }
    let slow: Vec<String> = steps(s)
        .iter()
        .filter(|row| !row.step.slowest.is_empty())
        .map(|row| {
            let list = row
                .step
                .slowest
                .iter()
                .map(|(us, cmd)| format!("{:.1} ms `{cmd}`", *us as f64 / 1e3))
                .collect::<Vec<_>>()
                .join(", ");
            format!("{}: {list}", row.name)
        })
        .collect();
    if !slow.is_empty() {
        let _ = writeln!(
            out,
            "\nThe slowest commands (`SLOWLOG`, 2 ms and more, up to {SLOWEST_KEPT} a step, \
             kept in the writing, binding, session end and eviction steps; the command and \
             its first two arguments):\n"
        );
        for line in slow {
            let _ = writeln!(out, "- {line}");
        }
    }
    match &s.eviction {
        Ok(e) => {
            let _ = writeln!(
                out,
                "\nEviction restore: `used_memory` {} MB once full, `maxmemory` lowered to {} \
                 MB; keys evicted {}, leases among them {}, written back {}, leases lost \
                 (not held by their token after) {} (medians). The LRU clock \
                 counts whole seconds, so a lease written back looks hardly newer than \
                 the strings and can be evicted again: leases evicted can outnumber the \
                 leases.{}",
                spread(
                    &Samples(e.full_bytes.0.iter().map(|b| b / 1e6).collect()),
                    1
                ),
                spread(&Samples(e.maxmemory.0.iter().map(|b| b / 1e6).collect()), 1),
                spread_count(&e.evicted_keys),
                spread_count(&e.leases_evicted),
                spread_count(&e.leases_restored),
                spread_count(&e.leases_lost),
                if e.leases_evicted.max() == 0.0 {
                    " No lease was evicted: the step measured eviction of strings only."
                } else {
                    ""
                }
            );
        }
        Err(refused) => {
            let _ = writeln!(
                out,
                "\nEviction restore: not available on this server (`CONFIG SET \
                 lease.allkeys-eviction restore`: `{refused}`)."
            );
        }
    }
    out.push('\n');
}
