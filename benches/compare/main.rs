//! Side-by-side benchmarks: redis-lease against the `SET NX PX` + Lua (EVALSHA) way, on
//! the same server, in the same run (issue 6).
//!
//! Run it with `scripts/bench [--quick]`; `scripts/bench --help` lists the options.
//! Every comparison starts its own server through the test harness (which builds the
//! module in release first), repeats the measurement `runs` times, and reports medians.
//!
//! - `cpu`: server CPU per call, `usec / calls` of `INFO commandstats` after
//!   `CONFIG RESETSTAT`, for each operation driven by pipelines of distinct keys. Each
//!   redis-lease step runs in turn with its Lua-way step, a pipeline at a time (leases in
//!   database 0, strings in database 1, same key names): on a shared machine both meet
//!   the same background load, so their ratio holds even when the absolute numbers move.
//! - `throughput`: acquire/release cycles per second, 8 clients, 16 commands per round
//!   trip, distinct keys per client.
//! - `memory`: `MEMORY USAGE` of one key and the `used_memory` delta per key over many
//!   leases vs `SET NX PX` strings with the same names and the same 32-character token.
//! - `expiry`: many leases (or `PX` strings) with one deadline; a probe client times
//!   PING round trips while the server deletes them, and DBSIZE is polled until 0.
//! - `curve`: server CPU per call with 1 to 1M live leases (and as many strings) present,
//!   the two ways in turn as in `cpu`.
//! - `shared` (benches/compare/shared.rs): shared holds (issue 16) against a sorted-set
//!   semaphore: server CPU per call among 1, 100 and 10,000 holds, pipelined throughput
//!   on one key, memory per hold. `--shared` runs only these and writes `shared.md` and
//!   `shared.svg`; `--memory` runs only the memory comparisons (exclusive leases and
//!   shared holds, 100,000 of each) and writes `memory.md`.
//! - `sessions` (benches/compare/sessions.rs): sessions (issue 17). N leases kept alive by
//!   one session (one `LEASE.RENEW` of it per period) against N `LEASE.RENEW`s per period
//!   (commands sent, their server CPU, the server process's CPU); a session with 100,000
//!   bound holds released, with the probe of `expiry` until every bound key is reaped
//!   (section d carries it next to the leases expiring together). `--sessions` runs only
//!   these, against as many leases expiring together, and writes `sessions.md` and
//!   `sessions.svg`.
//! - `stalls` (benches/compare/stalls.rs): the longest server step (issue 27) while
//!   1,000,000 holds are bound to a session, the session ends, 1,000,000 leases expire
//!   together (against as many `SET NX PX` strings) and eviction restores 100,000
//!   leases: a probe's worst PING and the server's latency monitor. `--stalls` runs only
//!   these and writes `stalls.md`.
//!
//! These are benchmarks, not tests: a missed target is reported, never an error. A wrong
//! reply (a grant refused, a release that released nothing) is an error: the numbers of a
//! bench that does not do what it says would mean nothing.

mod chart;
mod report;
mod sessions;
mod shared;
mod stalls;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use harness::resp::{decimal, encode, Conn, Reply};
use harness::workload::{
    acquire, drive, eval_release, eval_renew, is_one, key, load_scripts, release, renew,
    server_version, set_nx_px, token, Scripts, CHUNK, COUNTER_KEYS,
};
use harness::{Flavor, Server, ServerOptions};

/// TTL of leases and strings that must outlive a measurement.
const LONG_TTL: &[u8] = b"3600000";
/// TTL of the keys of one CPU group.
const GROUP_TTL: &[u8] = b"60000";

// ---------------------------------------------------------------------------------------
// Options

/// How much work each comparison does.
#[derive(Clone, Debug)]
pub struct Plan {
    pub quick: bool,
    pub runs: usize,
    /// Calls per operation in the CPU comparison.
    pub cpu_calls: usize,
    pub threads: usize,
    /// Commands per round trip in the throughput comparison.
    pub depth: usize,
    /// One measurement of one way.
    pub throughput_time: Duration,
    /// Measurements of each way per run, alternating.
    pub throughput_slices: usize,
    pub memory_keys: usize,
    pub expiry_keys: usize,
    pub curve_sizes: Vec<usize>,
    /// Calls per operation at each point of the curve.
    pub curve_calls: usize,
    /// Holds on the key among which one is acquired, renewed and released (shared).
    pub shared_sizes: Vec<usize>,
    /// Calls per operation at each shared size.
    pub shared_calls: usize,
    /// Holds in each memory layout (one key, and as many keys), and exclusive leases
    /// with `--memory`.
    pub hold_memory: usize,
    /// Leases kept alive, with a session and without (sessions).
    pub session_sizes: Vec<usize>,
    /// Their ttl, how often they are renewed, and how many times in a measurement.
    pub session_ttl: Duration,
    pub session_period: Duration,
    pub session_rounds: usize,
    /// Holds bound to the session whose end is measured.
    pub session_end_holds: usize,
    /// Holds bound, and leases and strings expiring, in each stall step.
    pub stall_keys: usize,
    /// Leases (and as many filler strings) of the eviction stall step.
    pub stall_evict_keys: usize,
}

impl Plan {
    fn full() -> Plan {
        Plan {
            quick: false,
            runs: 5,
            cpu_calls: 200_000,
            threads: 8,
            depth: 16,
            throughput_time: Duration::from_secs(1),
            throughput_slices: 3,
            memory_keys: 1_000_000,
            expiry_keys: 1_000_000,
            curve_sizes: vec![1, 1_000, 10_000, 100_000, 1_000_000],
            curve_calls: 100_000,
            shared_sizes: vec![1, 100, 10_000],
            shared_calls: 20_000,
            hold_memory: 100_000,
            session_sizes: vec![1, 100, 10_000],
            // The minute at ttl 30 s renewed every 10 s, compressed 10 times
            // (`--real-time` runs it as is): the same commands in a tenth of the time.
            session_ttl: Duration::from_secs(3),
            session_period: Duration::from_secs(1),
            session_rounds: 6,
            session_end_holds: 100_000,
            stall_keys: 1_000_000,
            stall_evict_keys: 100_000,
        }
    }

    fn quick() -> Plan {
        Plan {
            quick: true,
            runs: 1,
            cpu_calls: 10_000,
            threads: 8,
            depth: 16,
            throughput_time: Duration::from_millis(500),
            throughput_slices: 1,
            memory_keys: 20_000,
            expiry_keys: 20_000,
            curve_sizes: vec![1, 1_000, 10_000],
            curve_calls: 5_000,
            shared_sizes: vec![1, 100, 10_000],
            shared_calls: 2_000,
            hold_memory: 10_000,
            session_sizes: vec![1, 100, 1_000],
            session_ttl: Duration::from_millis(300),
            session_period: Duration::from_millis(100),
            session_rounds: 6,
            session_end_holds: 2_000,
            stall_keys: 20_000,
            stall_evict_keys: 5_000,
        }
    }
}

/// Which comparisons a run makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Every one: bench.md, bench.svg and shared.svg.
    All,
    /// Shared holds only: shared.md and shared.svg.
    Shared,
    /// Memory only, exclusive and shared: memory.md.
    Memory,
    /// Sessions only: sessions.md and sessions.svg.
    Sessions,
    /// The longest server step of large lease work: stalls.md.
    Stalls,
}

struct Options {
    mode: Mode,
    plan: Plan,
    flavors: Vec<Flavor>,
    out: PathBuf,
    note: Option<String>,
}

const USAGE: &str = "usage: scripts/bench [--quick] [--shared | --memory | --sessions [--real-time] [--session-holds N] | --stalls [--stall-keys N] [--stall-evict-keys N]] [--runs N] [--servers redis7,redis8,valkey8,valkey9 | --all-servers] [--out DIR] [--note TEXT]
  --quick        1 run of small sizes (CI smoke); writes to target/bench-quick/ unless --out
  --shared       only shared holds vs the sorted-set semaphore: shared.md, shared.svg
  --memory       only memory per exclusive lease and per shared hold: memory.md
  --sessions     only sessions: N leases kept alive by one session vs N renewals, and a
                 session with 100,000 bound holds ending: sessions.md, sessions.svg
  --session-holds N  holds bound to the session whose end is measured (default 100,000)
  --stalls       only the longest server step (probe and latency monitor): binding N
                 holds to a session, its end, N leases expiring vs N SET NX PX strings,
                 eviction restoring leases: stalls.md
  --stall-keys N holds bound and keys expiring in --stalls (default 1,000,000)
  --stall-evict-keys N  leases (and as many strings) of the eviction step (default 100,000)
  --real-time    keep-alive at ttl 30 s, a renewal every 10 s, for a minute (default:
                 compressed 10 times, ttl 3 s, every 1 s, for 6 s)
  --runs N       repeat every measurement N times (default 5, --quick 1)
  --servers LIST servers to measure, first one charted (default redis7)
  --all-servers  redis7,redis8,valkey8,valkey9
  --out DIR      where the reports and charts go (default docs/src/performance/reports/)
  --note TEXT    a line for bench.md (e.g. what else ran on the machine)";

fn parse_options() -> Options {
    let mut quick = false;
    let mut real_time = false;
    let mut mode = Mode::All;
    let mut benching = false;
    let mut runs = None;
    let mut session_holds = None;
    let mut stall_keys = None;
    let mut stall_evict_keys = None;
    let mut flavors = vec![Flavor::Redis7];
    let mut out = None;
    let mut note = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .unwrap_or_else(|| fail(&format!("{name} needs a value")))
        };
        match arg.as_str() {
            // cargo bench passes --bench to every bench binary; cargo test does not.
            "--bench" => benching = true,
            "--quick" => quick = true,
            "--shared" => mode = Mode::Shared,
            "--memory" => mode = Mode::Memory,
            "--sessions" => mode = Mode::Sessions,
            "--stalls" => mode = Mode::Stalls,
            "--real-time" => real_time = true,
            "--runs" => {
                let v = value("--runs");
                runs = Some(
                    v.parse::<usize>()
                        .ok()
                        .filter(|&n| n > 0)
                        .unwrap_or_else(|| fail(&format!("bad --runs {v:?}"))),
                );
            }
            "--session-holds" => {
                let v = value("--session-holds");
                session_holds = Some(
                    v.parse::<usize>()
                        .ok()
                        .filter(|&n| n > 0)
                        .unwrap_or_else(|| fail(&format!("bad --session-holds {v:?}"))),
                );
            }
            "--stall-keys" => {
                let v = value("--stall-keys");
                stall_keys = Some(
                    v.parse::<usize>()
                        .ok()
                        .filter(|&n| n > 0)
                        .unwrap_or_else(|| fail(&format!("bad --stall-keys {v:?}"))),
                );
            }
            "--stall-evict-keys" => {
                let v = value("--stall-evict-keys");
                stall_evict_keys = Some(
                    v.parse::<usize>()
                        .ok()
                        .filter(|&n| n > 0)
                        .unwrap_or_else(|| fail(&format!("bad --stall-evict-keys {v:?}"))),
                );
            }
            "--servers" => {
                flavors = value("--servers")
                    .split(',')
                    .map(|name| {
                        Flavor::from_name(name.trim())
                            .unwrap_or_else(|| fail(&format!("unknown server {name:?}")))
                    })
                    .collect();
            }
            "--all-servers" => flavors = Flavor::ALL.to_vec(),
            "--out" => out = Some(PathBuf::from(value("--out"))),
            "--note" => note = Some(value("--note")),
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => fail(&format!("unknown argument {other:?}")),
        }
    }
    if !benching && !quick {
        // Run as a test (`cargo test --benches`): the smoke, as criterion does.
        eprintln!("bench: not run by cargo bench: --quick");
        quick = true;
    }
    let mut plan = if quick { Plan::quick() } else { Plan::full() };
    if let Some(runs) = runs {
        plan.runs = runs;
    }
    if let Some(holds) = session_holds {
        plan.session_end_holds = holds;
    }
    if let Some(n) = stall_keys {
        plan.stall_keys = n;
    }
    if let Some(n) = stall_evict_keys {
        plan.stall_evict_keys = n;
    }
    if real_time {
        let scale = if quick { 100 } else { 10 };
        plan.session_ttl *= scale;
        plan.session_period *= scale;
    }
    let out = out.unwrap_or_else(|| {
        if quick {
            harness::repo_dir().join("target").join("bench-quick")
        } else {
            harness::repo_dir().join("docs/src/performance/reports")
        }
    });
    Options {
        mode,
        plan,
        flavors,
        out,
        note,
    }
}

fn fail(message: &str) -> ! {
    eprintln!("bench: {message}\n{USAGE}");
    std::process::exit(2);
}

// ---------------------------------------------------------------------------------------
// Results

/// The operations of the CPU comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    SetNxPx,
    EvalRenew,
    EvalRelease,
    Get,
    Incr,
    Acquire,
    AcquireGenerated,
    Renew,
    Release,
    Fence,
    // Shared holds and the sorted-set semaphore (not in `ALL`: benches/compare/shared.rs).
    SharedAcquire,
    SharedRenew,
    SharedRelease,
    SemAcquire,
    SemRenew,
    SemRelease,
}

impl Op {
    pub const ALL: [Op; 10] = [
        Op::SetNxPx,
        Op::EvalRenew,
        Op::EvalRelease,
        Op::Get,
        Op::Incr,
        Op::Acquire,
        Op::AcquireGenerated,
        Op::Renew,
        Op::Release,
        Op::Fence,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Op::SetNxPx => "SET key token NX PX ttl",
            Op::EvalRenew => "EVALSHA compare-and-pexpire",
            Op::EvalRelease => "EVALSHA compare-and-delete",
            Op::Get => "GET key",
            Op::Incr => "INCR counter",
            Op::Acquire => "LEASE.ACQUIRE key ttl TOKEN token",
            Op::AcquireGenerated => "LEASE.ACQUIRE key ttl (generated token)",
            Op::Renew => "LEASE.RENEW key token ttl",
            Op::Release => "LEASE.RELEASE key token",
            Op::Fence => "LEASE.FENCE resource fence",
            Op::SharedAcquire => "LEASE.ACQUIRE key ttl TOKEN token SHARED LIMIT n",
            Op::SharedRenew => "LEASE.RENEW key token ttl (shared hold)",
            Op::SharedRelease => "LEASE.RELEASE key token (shared hold)",
            Op::SemAcquire => "EVALSHA ZREMRANGEBYSCORE + ZCARD + ZADD",
            Op::SemRenew => "EVALSHA ZSCORE + ZADD XX",
            Op::SemRelease => "ZREM key token",
        }
    }

    /// The name in `INFO commandstats`.
    fn stat(self) -> &'static str {
        match self {
            Op::SetNxPx => "set",
            Op::EvalRenew | Op::EvalRelease => "evalsha",
            Op::Get => "get",
            Op::Incr => "incr",
            Op::Acquire | Op::AcquireGenerated | Op::SharedAcquire => "lease.acquire",
            Op::Renew | Op::SharedRenew => "lease.renew",
            Op::Release | Op::SharedRelease => "lease.release",
            Op::Fence => "lease.fence",
            Op::SemAcquire | Op::SemRenew => "evalsha",
            Op::SemRelease => "zrem",
        }
    }
}

/// The two ways to hold a lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Way {
    Native,
    Lua,
}

impl Way {
    pub fn label(self) -> &'static str {
        match self {
            Way::Native => "redis-lease",
            Way::Lua => "SET NX PX + Lua",
        }
    }

    /// The latency-monitor event of the server step that deletes expired keys.
    pub fn deletion_event(self) -> &'static str {
        match self {
            Way::Native => "lease-reap",
            Way::Lua => "expire-cycle",
        }
    }
}

/// One number measured once per run.
#[derive(Clone, Debug, Default)]
pub struct Samples(pub Vec<f64>);

impl Samples {
    pub fn push(&mut self, v: f64) {
        self.0.push(v);
    }

    pub fn median(&self) -> f64 {
        median(&self.0)
    }

    pub fn min(&self) -> f64 {
        self.0.iter().copied().fold(f64::INFINITY, f64::min)
    }

    pub fn max(&self) -> f64 {
        self.0.iter().copied().fold(f64::NEG_INFINITY, f64::max)
    }
}

pub fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

#[derive(Clone, Debug, Default)]
pub struct CpuResult {
    /// µs per call, per op, in `Op::ALL` order.
    pub usec: Vec<Samples>,
}

impl CpuResult {
    pub fn get(&self, op: Op) -> &Samples {
        let i = Op::ALL.iter().position(|&o| o == op).unwrap_or(0);
        &self.usec[i]
    }
}

#[derive(Clone, Debug, Default)]
pub struct ThroughputResult {
    /// Cycles per second.
    pub native: Samples,
    pub lua: Samples,
}

#[derive(Clone, Debug, Default)]
pub struct MemoryResult {
    pub keys: usize,
    /// `MEMORY USAGE` of one key, bytes.
    pub native_usage: Samples,
    pub lua_usage: Samples,
    /// `used_memory` delta divided by the number of keys.
    pub native_delta: Samples,
    pub lua_delta: Samples,
}

#[derive(Clone, Debug, Default)]
pub struct ExpiryWay {
    /// Probe round trips while the keys were being deleted, µs.
    pub max_us: Samples,
    pub p99_us: Samples,
    pub probes: Samples,
    /// Probe round trips on the same server before the deadline, µs.
    pub idle_max_us: Samples,
    pub idle_p99_us: Samples,
    /// From the common deadline until DBSIZE = 0, ms.
    pub drain_ms: Samples,
    /// The longest deletion step the server itself timed (`LATENCY LATEST`: the
    /// reaper's `lease-reap`, Redis's `expire-cycle`), ms; 0 when none reached 1 ms.
    pub server_step_ms: Samples,
    /// Over the same span: the server's time on a CPU, and runnable but waiting for one
    /// (the machine's other work), ms.
    pub server_cpu_ms: Samples,
    pub server_wait_ms: Samples,
}

impl ExpiryWay {
    fn push(&mut self, o: &ExpiryOutcome) {
        self.max_us.push(o.max_us);
        self.p99_us.push(o.p99_us);
        self.probes.push(o.probes as f64);
        self.idle_max_us.push(o.idle_max_us);
        self.idle_p99_us.push(o.idle_p99_us);
        self.drain_ms.push(o.drain_ms);
        self.server_step_ms.push(o.server_step_ms);
        self.server_cpu_ms.push(o.server_cpu_ms);
        self.server_wait_ms.push(o.server_wait_ms);
    }
}

#[derive(Clone, Debug, Default)]
pub struct ExpiryResult {
    pub keys: usize,
    pub native: ExpiryWay,
    pub lua: ExpiryWay,
}

#[derive(Clone, Debug, Default)]
pub struct CurvePoint {
    pub live: usize,
    pub acquire: Samples,
    pub renew: Samples,
    pub release: Samples,
    pub set_nx_px: Samples,
    pub eval_renew: Samples,
    pub eval_release: Samples,
}

#[derive(Clone, Debug, Default)]
pub struct CurveResult {
    pub points: Vec<CurvePoint>,
}

pub struct ServerResult {
    pub flavor: Flavor,
    pub version: String,
    pub cpu: CpuResult,
    pub throughput: ThroughputResult,
    pub memory: MemoryResult,
    pub expiry: ExpiryResult,
    pub curve: CurveResult,
    pub shared: shared::SharedResult,
    pub sessions: sessions::SessionResult,
}

// ---------------------------------------------------------------------------------------
// Clock, server counters, servers

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

struct CmdStat {
    calls: u64,
    usec: u64,
}

/// `cmdstat_<name>` of `INFO commandstats`.
fn cmdstat(conn: &mut Conn, name: &str) -> CmdStat {
    let info = conn.must(&["INFO", "commandstats"]).text();
    let prefix = format!("cmdstat_{name}:");
    let line = info
        .lines()
        .find(|l| l.len() > prefix.len() && l[..prefix.len()].eq_ignore_ascii_case(&prefix))
        .unwrap_or_else(|| panic!("INFO commandstats has no cmdstat_{name}:\n{info}"));
    let field = |f: &str| -> u64 {
        line[prefix.len()..]
            .split(',')
            .find_map(|kv| kv.strip_prefix(f)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {f} in {line}"))
    };
    CmdStat {
        calls: field("calls"),
        usec: field("usec"),
    }
}

/// Server µs per call of `op` over `n` commands made by `make`.
fn measure(
    conn: &mut Conn,
    op: Op,
    n: usize,
    make: impl FnMut(usize, &mut Vec<u8>),
    check: impl Fn(usize, &Reply) -> bool,
) -> f64 {
    conn.must(&["CONFIG", "RESETSTAT"]);
    drive(conn, n, op.label(), make, check);
    per_call(conn, op, n)
}

fn info_number(conn: &mut Conn, section: &str, field: &str) -> u64 {
    let info = conn.must(&["INFO", section]).text();
    harness::info_field(&info, field)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("INFO {section} has no numeric {field}"))
}

fn flushall(conn: &mut Conn) {
    conn.must(&["FLUSHALL"]);
}

fn connect(server: &Server) -> Conn {
    Conn::connect(server.port).unwrap_or_else(|e| {
        panic!(
            "cannot connect to {} on {}: {e}",
            server.flavor, server.port
        )
    })
}

fn start(flavor: Flavor) -> Server {
    // No persistence and no eviction: the harness defaults. Protected mode is fine on
    // loopback.
    Server::start_with(flavor, ServerOptions::new())
}

// ---------------------------------------------------------------------------------------
// a. Server CPU per call

/// Writes the command for index `i`.
type Make<'a> = Box<dyn FnMut(usize, &mut Vec<u8>) + 'a>;
/// Says whether the reply to command `i` is the expected one.
type Check<'a> = Box<dyn Fn(usize, &Reply) -> bool + 'a>;

/// One measured group of commands.
struct Group<'a> {
    op: Op,
    make: Make<'a>,
    check: Check<'a>,
}

impl<'a> Group<'a> {
    fn new(
        op: Op,
        make: impl FnMut(usize, &mut Vec<u8>) + 'a,
        check: impl Fn(usize, &Reply) -> bool + 'a,
    ) -> Self {
        Group {
            op,
            make: Box::new(make),
            check: Box::new(check),
        }
    }
}

/// Server µs per call of two groups of `n` commands each, the Lua way's on `lua`
/// (database 1) and redis-lease's on `native` (database 0), run a pipeline of `CHUNK` at
/// a time in turn, so that both meet the same background load on a shared machine.
fn measure_pair<'a>(
    lua: &mut Conn,
    mut lua_group: Group<'a>,
    native: &mut Conn,
    mut native_group: Group<'a>,
    n: usize,
) -> (f64, f64) {
    assert_ne!(lua_group.op.stat(), native_group.op.stat());
    lua.must(&["CONFIG", "RESETSTAT"]);
    let mut from = 0;
    let mut turn = 0;
    while from < n {
        let to = (from + CHUNK).min(n);
        for side in 0..2 {
            let (conn, g) = if (side + turn) % 2 == 0 {
                (&mut *lua, &mut lua_group)
            } else {
                (&mut *native, &mut native_group)
            };
            let (make, check) = (&mut g.make, &g.check);
            drive(
                conn,
                to - from,
                g.op.label(),
                |i, b| make(from + i, b),
                |i, r| check(from + i, r),
            );
        }
        from = to;
        turn += 1;
    }
    (
        per_call(lua, lua_group.op, n),
        per_call(lua, native_group.op, n),
    )
}

/// µs per call of `op` since the last `CONFIG RESETSTAT`, which must have counted `n`.
fn per_call(conn: &mut Conn, op: Op, n: usize) -> f64 {
    let stat = cmdstat(conn, op.stat());
    assert_eq!(
        stat.calls,
        n as u64,
        "{}: commandstats counted {} calls, the bench sent {n}",
        op.label(),
        stat.calls
    );
    stat.usec as f64 / stat.calls as f64
}

fn bench_cpu(flavor: Flavor, plan: &Plan) -> CpuResult {
    let server = start(flavor);
    let mut native = connect(&server);
    let mut lua = connect(&server);
    lua.must(&["SELECT", "1"]);
    let scripts = load_scripts(&mut lua);
    let n = plan.cpu_calls;
    let mut result = CpuResult {
        usec: vec![Samples::default(); Op::ALL.len()],
    };
    for run in 0..plan.runs {
        for (op, usec) in cpu_run(&mut lua, &mut native, &scripts, n) {
            let i = Op::ALL.iter().position(|&o| o == op).unwrap_or(0);
            result.usec[i].push(usec);
        }
        progress(&format!("cpu run {}/{} done", run + 1, plan.runs));
    }
    result
}

/// One run of every operation: each redis-lease step paired with its Lua-way step on the
/// same key names (strings in database 1, leases in database 0).
fn cpu_run(lua: &mut Conn, native: &mut Conn, scripts: &Scripts, n: usize) -> Vec<(Op, f64)> {
    flushall(lua);
    let k = |i| key("bench", i);
    let mut out = Vec::new();

    let (set, acq) = measure_pair(
        lua,
        Group::new(
            Op::SetNxPx,
            |i, b| set_nx_px(b, &k(i), &token(i), GROUP_TTL),
            |_, r| r.is_ok(),
        ),
        native,
        Group::new(
            Op::Acquire,
            |i, b| acquire(b, &k(i), &token(i), GROUP_TTL),
            |i, r| matches!(r, Reply::Array(Some(a)) if r.is_grant() && a[0].bulk() == Some(&token(i)[..])),
        ),
        n,
    );
    out.extend([(Op::SetNxPx, set), (Op::Acquire, acq)]);

    let get = measure(
        lua,
        Op::Get,
        n,
        |i, b| encode(b, &[b"GET", &k(i)]),
        |i, r| r.bulk() == Some(&token(i)[..]),
    );
    out.push((Op::Get, get));

    let (eval_renew_us, renew_us) = measure_pair(
        lua,
        Group::new(
            Op::EvalRenew,
            |i, b| eval_renew(b, &scripts.renew, &k(i), &token(i), GROUP_TTL),
            |_, r| is_one(r),
        ),
        native,
        Group::new(
            Op::Renew,
            |i, b| renew(b, &k(i), &token(i), GROUP_TTL),
            |_, r| is_one(r),
        ),
        n,
    );
    out.extend([(Op::EvalRenew, eval_renew_us), (Op::Renew, renew_us)]);

    let (eval_release_us, release_us) = measure_pair(
        lua,
        Group::new(
            Op::EvalRelease,
            |i, b| eval_release(b, &scripts.release, &k(i), &token(i)),
            |_, r| is_one(r),
        ),
        native,
        Group::new(
            Op::Release,
            |i, b| release(b, &k(i), &token(i)),
            |_, r| is_one(r),
        ),
        n,
    );
    out.extend([
        (Op::EvalRelease, eval_release_us),
        (Op::Release, release_us),
    ]);

    // Counters: INCR on 1024 counters vs LEASE.FENCE on 1024 resources, call i sending
    // fence i + 1 so that every fence is accepted.
    let c = |i: usize| key("counter", i % COUNTER_KEYS);
    let (incr, fence) = measure_pair(
        lua,
        Group::new(
            Op::Incr,
            |i, b| encode(b, &[b"INCR", &c(i)]),
            |i, r| r.int() == Some((i / COUNTER_KEYS + 1) as i64),
        ),
        native,
        Group::new(
            Op::Fence,
            |i, b| encode(b, &[b"LEASE.FENCE", &c(i), &decimal(i as u64 + 1)]),
            |i, r| r.int() == Some(i as i64 + 1),
        ),
        n,
    );
    out.extend([(Op::Incr, incr), (Op::Fence, fence)]);

    flushall(native);
    let generated = measure(
        native,
        Op::AcquireGenerated,
        n,
        |i, b| encode(b, &[b"LEASE.ACQUIRE", &k(i), GROUP_TTL]),
        |_, r| r.is_grant(),
    );
    out.push((Op::AcquireGenerated, generated));
    out
}

// ---------------------------------------------------------------------------------------
// b. Pipelined throughput of acquire/release cycles

fn bench_throughput(flavor: Flavor, plan: &Plan) -> ThroughputResult {
    let server = start(flavor);
    let mut conn = connect(&server);
    let scripts = load_scripts(&mut conn);
    let mut result = ThroughputResult::default();
    for run in 0..plan.runs {
        // Short slices of each way in turn: both meet the same background load.
        let (mut native, mut lua) = (0.0, 0.0);
        for slice in 0..plan.throughput_slices {
            let ways = if (run + slice) % 2 == 0 {
                [Way::Lua, Way::Native]
            } else {
                [Way::Native, Way::Lua]
            };
            for way in ways {
                flushall(&mut conn);
                let rate = throughput_run(&server, way, &scripts, plan);
                match way {
                    Way::Native => native += rate,
                    Way::Lua => lua += rate,
                }
            }
        }
        result.native.push(native / plan.throughput_slices as f64);
        result.lua.push(lua / plan.throughput_slices as f64);
        progress(&format!("throughput run {}/{} done", run + 1, plan.runs));
    }
    result
}

/// Cycles per second over all clients.
fn throughput_run(server: &Server, way: Way, scripts: &Scripts, plan: &Plan) -> f64 {
    let cycles_per_trip = plan.depth / 2;
    let barrier = Arc::new(Barrier::new(plan.threads));
    let handles: Vec<_> = (0..plan.threads)
        .map(|t| {
            let barrier = Arc::clone(&barrier);
            let release_sha = scripts.release.clone();
            let port = server.port;
            let duration = plan.throughput_time;
            thread::spawn(move || {
                let mut conn = Conn::connect(port)
                    .unwrap_or_else(|e| panic!("client {t} cannot connect: {e}"));
                let tok = token(1_000_000_000 + t);
                // One round trip: acquire and release each of the client's keys.
                let mut trip = Vec::new();
                for c in 0..cycles_per_trip {
                    let k = key(&format!("tp:{t}"), c);
                    match way {
                        Way::Native => {
                            acquire(&mut trip, &k, &tok, GROUP_TTL);
                            release(&mut trip, &k, &tok);
                        }
                        Way::Lua => {
                            set_nx_px(&mut trip, &k, &tok, GROUP_TTL);
                            eval_release(&mut trip, &release_sha, &k, &tok);
                        }
                    }
                }
                barrier.wait();
                let started = Instant::now();
                let end = started + duration;
                let mut cycles = 0u64;
                while Instant::now() < end {
                    conn.send(&trip)
                        .unwrap_or_else(|e| panic!("client {t}: {e}"));
                    for n in 0..2 * cycles_per_trip {
                        let r = conn.read().unwrap_or_else(|e| panic!("client {t}: {e}"));
                        let good = if n % 2 == 1 {
                            is_one(&r)
                        } else {
                            match way {
                                Way::Native => r.is_grant(),
                                Way::Lua => r.is_ok(),
                            }
                        };
                        if !good {
                            panic!("client {t} ({}): unexpected reply {r:?}", way.label());
                        }
                    }
                    cycles += cycles_per_trip as u64;
                }
                cycles as f64 / started.elapsed().as_secs_f64()
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| {
            h.join()
                .unwrap_or_else(|_| panic!("a client thread failed"))
        })
        .sum()
}

// ---------------------------------------------------------------------------------------
// c. Memory per live lease

fn bench_memory(flavor: Flavor, plan: &Plan) -> MemoryResult {
    let server = start(flavor);
    let mut conn = connect(&server);
    let mut result = MemoryResult {
        keys: plan.memory_keys,
        ..Default::default()
    };
    for run in 0..plan.runs {
        let ways = if run % 2 == 0 {
            [Way::Lua, Way::Native]
        } else {
            [Way::Native, Way::Lua]
        };
        for way in ways {
            let (usage, delta) = memory_run(&mut conn, way, plan.memory_keys);
            match way {
                Way::Native => {
                    result.native_usage.push(usage);
                    result.native_delta.push(delta);
                }
                Way::Lua => {
                    result.lua_usage.push(usage);
                    result.lua_delta.push(delta);
                }
            }
        }
        progress(&format!("memory run {}/{} done", run + 1, plan.runs));
    }
    flushall(&mut conn);
    result
}

/// `used_memory` once it has stopped moving (incremental rehashing, lazy frees).
fn settled_used_memory(conn: &mut Conn) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut last = info_number(conn, "memory", "used_memory");
    loop {
        thread::sleep(Duration::from_millis(100));
        let now = info_number(conn, "memory", "used_memory");
        if now == last || Instant::now() >= deadline {
            return now;
        }
        last = now;
    }
}

/// Key names of the memory comparisons: `m:00000000`…, 10 bytes (issue 27 states
/// memory per lease at this size).
pub const MEMORY_PREFIX: &str = "m";

/// (`MEMORY USAGE` of one key, `used_memory` delta per key).
fn memory_run(conn: &mut Conn, way: Way, n: usize) -> (f64, f64) {
    flushall(conn);
    let before = settled_used_memory(conn);
    fill(conn, way, MEMORY_PREFIX, 0, n, |_| LONG_TTL.to_vec());
    let after = settled_used_memory(conn);
    let usage = conn
        .call(&[
            b"MEMORY",
            b"USAGE",
            &key(MEMORY_PREFIX, 0),
            b"SAMPLES",
            b"0",
        ])
        .ok()
        .and_then(|r| r.int())
        .unwrap_or_else(|| panic!("MEMORY USAGE failed for {}", way.label()));
    flushall(conn);
    (usage as f64, (after as f64 - before as f64) / n as f64)
}

/// Creates keys `prefix:from..prefix:to` held by their own tokens, each with the TTL
/// `ttl(i)` gives: leases or `SET NX PX` strings.
fn fill(
    conn: &mut Conn,
    way: Way,
    prefix: &str,
    from: usize,
    to: usize,
    mut ttl: impl FnMut(usize) -> Vec<u8>,
) {
    let n = to - from;
    match way {
        Way::Native => drive(
            conn,
            n,
            "fill leases",
            |i, b| acquire(b, &key(prefix, from + i), &token(from + i), &ttl(i)),
            |_, r| r.is_grant(),
        ),
        Way::Lua => drive(
            conn,
            n,
            "fill strings",
            |i, b| set_nx_px(b, &key(prefix, from + i), &token(from + i), &ttl(i)),
            |_, r| r.is_ok(),
        ),
    }
}

// ---------------------------------------------------------------------------------------
// d. Many leases expiring together

fn bench_expiry(flavor: Flavor, plan: &Plan) -> ExpiryResult {
    // The latency monitor times each deletion step inside the server, apart from
    // what the machine adds to the probe's round trips.
    let options = ServerOptions::new().config("latency-monitor-threshold", "1");
    let server = Server::start_with(flavor, options);
    let mut conn = connect(&server);
    let n = plan.expiry_keys;
    let mut result = ExpiryResult {
        keys: n,
        ..Default::default()
    };
    // How long granting takes is learned from the previous run; the first run guesses
    // 10 µs per key, which is slow for this machine.
    let mut grant_estimate = Duration::from_micros(10 * n as u64);
    for run in 0..plan.runs {
        let ways = if run % 2 == 0 {
            [Way::Lua, Way::Native]
        } else {
            [Way::Native, Way::Lua]
        };
        for way in ways {
            let (outcome, took) = expiry_run(&server, &mut conn, way, n, grant_estimate);
            grant_estimate = grant_estimate.max(took.mul_f64(1.3));
            match way {
                Way::Native => result.native.push(&outcome),
                Way::Lua => result.lua.push(&outcome),
            }
        }
        progress(&format!("expiry run {}/{} done", run + 1, plan.runs));
    }
    result
}

struct ExpiryOutcome {
    max_us: f64,
    p99_us: f64,
    probes: usize,
    idle_max_us: f64,
    idle_p99_us: f64,
    drain_ms: f64,
    server_step_ms: f64,
    server_cpu_ms: f64,
    server_wait_ms: f64,
}

/// How long after the last grant the common deadline falls: the probe's idle baseline.
const EXPIRY_LEAD: Duration = Duration::from_millis(2000);
/// Longest the bench waits for DBSIZE to reach 0 after the deadline.
const DRAIN_LIMIT: Duration = Duration::from_secs(300);

/// Grants `n` keys that all expire at one deadline, then times probe round trips while
/// the server deletes them. Returns the outcome and how long granting took.
fn expiry_run(
    server: &Server,
    conn: &mut Conn,
    way: Way,
    n: usize,
    grant_estimate: Duration,
) -> (ExpiryOutcome, Duration) {
    let mut estimate = grant_estimate;
    for _attempt in 0..4 {
        flushall(conn);
        let grant_start = Instant::now();
        let deadline_ms = now_ms() + (estimate + EXPIRY_LEAD).as_millis() as u64;
        let mut late = false;
        fill(conn, way, "bench", 0, n, |_| {
            let left = deadline_ms.saturating_sub(now_ms());
            if left < 500 {
                late = true;
            }
            decimal(left.max(1))
        });
        let took = grant_start.elapsed();
        if late {
            // Granting ran into the deadline: keys would expire while others are still
            // being granted. Start again with more room.
            progress(&format!(
                "expiry: granting {n} keys took {took:?}, past the deadline; again"
            ));
            estimate = took.mul_f64(2.0);
            continue;
        }
        let left = deadline_ms.saturating_sub(now_ms());
        let deadline = Instant::now() + Duration::from_millis(left);
        latency_reset(conn);
        let mut outcome = probe_expiry(server, conn, deadline);
        outcome.server_step_ms = latency_max(conn, way.deletion_event());
        return (outcome, took);
    }
    panic!("expiry: could not grant {n} keys ahead of a common deadline");
}

/// Time between one probe's reply and the next PING. A probe that never pauses keeps
/// a core busy on a 2-core machine and mostly measures its own scheduling; this one
/// still lands several PINGs inside any 1 ms the server spends on one step.
const PROBE_GAP: Duration = Duration::from_micros(200);

fn latency_reset(conn: &mut Conn) {
    conn.call(&[b"LATENCY", b"RESET"])
        .unwrap_or_else(|e| panic!("LATENCY RESET: {e}"));
}

/// Every event of `LATENCY LATEST` and its largest sample since the last reset, ms.
pub fn latency_events(conn: &mut Conn) -> Vec<(String, f64)> {
    let reply = conn
        .call(&[b"LATENCY", b"LATEST"])
        .unwrap_or_else(|e| panic!("LATENCY LATEST: {e}"));
    let Reply::Array(Some(events)) = reply else {
        panic!("LATENCY LATEST: {reply:?}");
    };
    events
        .iter()
        .map(|e| match e {
            Reply::Array(Some(fields)) => match fields.as_slice() {
                [Reply::Bulk(Some(name)), _, _, max, ..] => (
                    String::from_utf8_lossy(name).into_owned(),
                    max.int().unwrap_or_else(|| panic!("LATENCY LATEST: {e:?}")) as f64,
                ),
                _ => panic!("LATENCY LATEST: {e:?}"),
            },
            _ => panic!("LATENCY LATEST: {e:?}"),
        })
        .collect()
}

/// The largest sample of `event` in `LATENCY LATEST`, ms; 0 if it has none.
fn latency_max(conn: &mut Conn, event: &str) -> f64 {
    latency_events(conn)
        .into_iter()
        .find(|(name, _)| name == event)
        .map_or(0.0, |(_, ms)| ms)
}

fn probe_expiry(server: &Server, conn: &mut Conn, deadline: Instant) -> ExpiryOutcome {
    probe_drain(server, conn, deadline, None)
}

/// A second connection that sends PING in a loop, `PROBE_GAP` after each reply, until
/// `stop`; returns when each was sent and its round trip, µs.
fn spawn_probe(server: &Server, stop: &Arc<AtomicBool>) -> thread::JoinHandle<Vec<(Instant, u32)>> {
    let stop = Arc::clone(stop);
    let port = server.port;
    thread::spawn(move || {
        let mut probe = Conn::connect(port).unwrap_or_else(|e| panic!("probe cannot connect: {e}"));
        let mut ping = Vec::new();
        encode(&mut ping, &[b"PING"]);
        let mut samples: Vec<(Instant, u32)> = Vec::with_capacity(1 << 20);
        while !stop.load(Ordering::Relaxed) {
            let sent = Instant::now();
            probe.send(&ping).unwrap_or_else(|e| panic!("probe: {e}"));
            let reply = probe.read().unwrap_or_else(|e| panic!("probe: {e}"));
            assert!(matches!(&reply, Reply::Status(s) if s == "PONG"));
            samples.push((sent, sent.elapsed().as_micros() as u32));
            thread::sleep(PROBE_GAP);
        }
        samples
    })
}

/// Times probe round trips from well before `deadline` until DBSIZE reaches 0 after it.
/// With `at_deadline`, the probe waits for the deadline and then calls it (what ends the
/// keys: a session's release) before it polls DBSIZE.
fn probe_drain(
    server: &Server,
    conn: &mut Conn,
    deadline: Instant,
    mut at_deadline: Option<&mut dyn FnMut(&mut Conn)>,
) -> ExpiryOutcome {
    let stop = Arc::new(AtomicBool::new(false));
    let probe = spawn_probe(server, &stop);
    // Poll DBSIZE every 5 ms once the deadline is near.
    let mut at_deadline_cpu = None;
    let drained_at = loop {
        let now = Instant::now();
        if now + Duration::from_millis(5) < deadline {
            thread::sleep(Duration::from_millis(5));
            continue;
        }
        if at_deadline_cpu.is_none() {
            if let Some(end) = at_deadline.take() {
                thread::sleep(deadline.saturating_duration_since(Instant::now()));
                at_deadline_cpu = Some(schedstat(server.pid));
                end(conn);
            } else {
                at_deadline_cpu = Some(schedstat(server.pid));
            }
        }
        let size = conn
            .call(&[b"DBSIZE"])
            .ok()
            .and_then(|r| r.int())
            .unwrap_or_else(|| panic!("DBSIZE failed"));
        if size == 0 {
            break Instant::now();
        }
        if now > deadline + DRAIN_LIMIT {
            stop.store(true, Ordering::Relaxed);
            panic!("{size} keys left {DRAIN_LIMIT:?} after their deadline");
        }
        thread::sleep(Duration::from_millis(5));
    };
    let at_drained = schedstat(server.pid);
    let (cpu_ms, wait_ms) = match (at_deadline_cpu.flatten(), at_drained) {
        (Some(a), Some(b)) => (
            b.0.saturating_sub(a.0) as f64 / 1e6,
            b.1.saturating_sub(a.1) as f64 / 1e6,
        ),
        _ => (f64::NAN, f64::NAN),
    };
    thread::sleep(Duration::from_millis(100));
    stop.store(true, Ordering::Relaxed);
    let samples = probe.join().unwrap_or_else(|_| panic!("the probe failed"));
    let window = |from: Instant, to: Instant| -> Vec<u32> {
        samples
            .iter()
            .filter(|(at, _)| *at >= from && *at <= to)
            .map(|&(_, rtt)| rtt)
            .collect()
    };
    let first = samples.first().map_or(deadline, |s| s.0);
    let idle = window(first, deadline - Duration::from_millis(10));
    let busy = window(deadline, drained_at);
    let (idle_max_us, idle_p99_us) = max_p99(&idle);
    let (max_us, p99_us) = max_p99(&busy);
    ExpiryOutcome {
        max_us,
        p99_us,
        probes: busy.len(),
        idle_max_us,
        idle_p99_us,
        drain_ms: drained_at.saturating_duration_since(deadline).as_secs_f64() * 1e3,
        server_step_ms: 0.0,
        server_cpu_ms: cpu_ms,
        server_wait_ms: wait_ms,
    }
}

/// (ns on a CPU, ns runnable but waiting for a CPU) of a process, from
/// `/proc/<pid>/schedstat`: how much of a latency the machine's other work explains.
fn schedstat(pid: u32) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/schedstat")).ok()?;
    let mut fields = text.split_whitespace().map(|f| f.parse::<u64>().ok());
    Some((fields.next()??, fields.next()??))
}

fn max_p99(rtts: &[u32]) -> (f64, f64) {
    if rtts.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let mut v = rtts.to_vec();
    v.sort_unstable();
    let p99 = v[((v.len() as f64 * 0.99).ceil() as usize).clamp(1, v.len()) - 1];
    (v[v.len() - 1] as f64, p99 as f64)
}

// ---------------------------------------------------------------------------------------
// e. Cost per operation from 1 to 1M live leases

fn bench_curve(flavor: Flavor, plan: &Plan) -> CurveResult {
    let server = start(flavor);
    let mut native = connect(&server);
    let mut lua = connect(&server);
    lua.must(&["SELECT", "1"]);
    let scripts = load_scripts(&mut lua);
    let mut result = CurveResult {
        points: plan
            .curve_sizes
            .iter()
            .map(|&live| CurvePoint {
                live,
                ..Default::default()
            })
            .collect(),
    };
    let m = plan.curve_calls;
    for run in 0..plan.runs {
        flushall(&mut native);
        let mut live = 0;
        for point in result.points.iter_mut() {
            fill(&mut native, Way::Native, "live", live, point.live, |_| {
                LONG_TTL.to_vec()
            });
            fill(&mut lua, Way::Lua, "live", live, point.live, |_| {
                LONG_TTL.to_vec()
            });
            live = point.live;
            curve_point(&mut lua, &mut native, &scripts, live, m, point);
        }
        progress(&format!("curve run {}/{} done", run + 1, plan.runs));
    }
    flushall(&mut native);
    result
}

/// With `live` leases in database 0 and `live` strings in database 1: `m` acquire/release
/// pairs on fresh keys (so the number of live keys stays put), then `m` renewals spread
/// over the live keys; both ways in turn, a pipeline at a time.
fn curve_point(
    lua: &mut Conn,
    native: &mut Conn,
    scripts: &Scripts,
    live: usize,
    m: usize,
    point: &mut CurvePoint,
) {
    lua.must(&["CONFIG", "RESETSTAT"]);
    let pairs = CHUNK / 2;
    let mut from = 0;
    let mut turn = 0;
    while from < m {
        let to = (from + pairs).min(m);
        for side in 0..2 {
            let way = if (side + turn) % 2 == 0 {
                Way::Lua
            } else {
                Way::Native
            };
            let conn = match way {
                Way::Lua => &mut *lua,
                Way::Native => &mut *native,
            };
            drive(
                conn,
                2 * (to - from),
                "curve acquire/release",
                |i, b| {
                    let j = from + i / 2;
                    let (k, t) = (key("fresh", j), token(j));
                    match (way, i % 2) {
                        (Way::Native, 0) => acquire(b, &k, &t, GROUP_TTL),
                        (Way::Native, _) => release(b, &k, &t),
                        (Way::Lua, 0) => set_nx_px(b, &k, &t, GROUP_TTL),
                        (Way::Lua, _) => eval_release(b, &scripts.release, &k, &t),
                    }
                },
                |i, r| match (way, i % 2) {
                    (Way::Native, 0) => r.is_grant(),
                    (Way::Lua, 0) => r.is_ok(),
                    _ => is_one(r),
                },
            );
        }
        from = to;
        turn += 1;
    }
    point.acquire.push(per_call(lua, Op::Acquire, m));
    point.release.push(per_call(lua, Op::Release, m));
    point.set_nx_px.push(per_call(lua, Op::SetNxPx, m));
    point.eval_release.push(per_call(lua, Op::EvalRelease, m));

    let live_key = |i: usize| key("live", i % live);
    let live_token = |i: usize| token(i % live);
    let (eval_renew_us, renew_us) = measure_pair(
        lua,
        Group::new(
            Op::EvalRenew,
            |i, b| eval_renew(b, &scripts.renew, &live_key(i), &live_token(i), LONG_TTL),
            |_, r| is_one(r),
        ),
        native,
        Group::new(
            Op::Renew,
            |i, b| renew(b, &live_key(i), &live_token(i), LONG_TTL),
            |_, r| is_one(r),
        ),
        m,
    );
    point.eval_renew.push(eval_renew_us);
    point.renew.push(renew_us);
}

// ---------------------------------------------------------------------------------------

fn progress(message: &str) {
    eprintln!("bench: {message}");
}

fn main() {
    let options = parse_options();
    let plan = &options.plan;
    let machine = report::Machine::probe(options.note.clone());
    progress(&format!(
        "{} run(s), servers: {}, load average at start: {}",
        plan.runs,
        options
            .flavors
            .iter()
            .map(|f| f.name())
            .collect::<Vec<_>>()
            .join(","),
        machine.load_start
    ));
    // Build the module once, before any timing starts.
    let module = harness::module_path();
    progress(&format!("module: {}", module.display()));
    let started = Instant::now();
    match options.mode {
        Mode::All => {}
        Mode::Sessions => return main_sessions(&options, machine, started),
        Mode::Stalls => return main_stalls(&options, machine, started),
        Mode::Shared | Mode::Memory => return main_shared(&options, machine, started),
    }
    let mut results = Vec::new();
    for &flavor in &options.flavors {
        let version = server_version(&start(flavor));
        progress(&format!("{flavor}: {version}"));
        let cpu = bench_cpu(flavor, plan);
        let throughput = bench_throughput(flavor, plan);
        let memory = bench_memory(flavor, plan);
        let expiry = bench_expiry(flavor, plan);
        let curve = bench_curve(flavor, plan);
        let shared = shared::bench(flavor, plan, true, false);
        let sessions = sessions::bench(flavor, plan, false);
        results.push(ServerResult {
            flavor,
            version,
            cpu,
            throughput,
            memory,
            expiry,
            curve,
            shared,
            sessions,
        });
    }
    let mut machine = machine;
    machine.finish(started.elapsed());
    let text = report::text(&results, plan, &machine);
    println!("{text}");
    std::fs::create_dir_all(&options.out)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", options.out.display()));
    let md = options.out.join("bench.md");
    let svg = options.out.join("bench.svg");
    write(&md, &report::markdown(&results, plan, &machine));
    write(&svg, &chart::svg(&results[0], plan, &machine));
    println!("wrote {} and {}", md.display(), svg.display());
    let first = &results[0];
    if first.shared.supported {
        let svg = options.out.join("shared.svg");
        write(
            &svg,
            &chart::shared_svg(&first.version, &first.shared, plan, &machine),
        );
        println!("wrote {}", svg.display());
    }
    if first.sessions.supported {
        let svg = options.out.join("sessions.svg");
        write(
            &svg,
            &chart::sessions_svg(&first.version, &first.sessions, plan, &machine),
        );
        println!("wrote {}", svg.display());
    }
}

fn write(path: &std::path::Path, contents: &str) {
    std::fs::write(path, contents)
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
}

/// `--shared` and `--memory`: only the shared-hold and memory comparisons.
fn main_shared(options: &Options, mut machine: report::Machine, started: Instant) {
    let plan = &options.plan;
    let mut results = Vec::new();
    for &flavor in &options.flavors {
        let version = server_version(&start(flavor));
        progress(&format!("{flavor}: {version}"));
        let shared = match options.mode {
            Mode::Memory => shared::bench(flavor, plan, false, true),
            _ => shared::bench(flavor, plan, true, false),
        };
        results.push(report::SharedServer {
            flavor,
            version,
            shared,
        });
    }
    machine.finish(started.elapsed());
    let md = report::shared_markdown(&results, options.mode, plan, &machine);
    println!("{md}");
    std::fs::create_dir_all(&options.out)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", options.out.display()));
    let name = match options.mode {
        Mode::Memory => "memory.md",
        _ => "shared.md",
    };
    let path = options.out.join(name);
    write(&path, &md);
    println!("wrote {}", path.display());
    let first = &results[0];
    if options.mode == Mode::Shared && first.shared.supported {
        let svg = options.out.join("shared.svg");
        write(
            &svg,
            &chart::shared_svg(&first.version, &first.shared, plan, &machine),
        );
        println!("wrote {}", svg.display());
    }
}

/// `--sessions`: only the session comparisons.
fn main_sessions(options: &Options, mut machine: report::Machine, started: Instant) {
    let plan = &options.plan;
    let mut results = Vec::new();
    for &flavor in &options.flavors {
        let version = server_version(&start(flavor));
        progress(&format!("{flavor}: {version}"));
        let sessions = sessions::bench(flavor, plan, true);
        results.push(report::SessionServer {
            flavor,
            version,
            sessions,
        });
    }
    machine.finish(started.elapsed());
    let md = report::sessions_markdown(&results, plan, &machine);
    println!("{md}");
    std::fs::create_dir_all(&options.out)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", options.out.display()));
    let path = options.out.join("sessions.md");
    write(&path, &md);
    println!("wrote {}", path.display());
    let first = &results[0];
    if first.sessions.supported {
        let svg = options.out.join("sessions.svg");
        write(
            &svg,
            &chart::sessions_svg(&first.version, &first.sessions, plan, &machine),
        );
        println!("wrote {}", svg.display());
    }
}

/// `--stalls`: only the longest server step of large lease work.
fn main_stalls(options: &Options, mut machine: report::Machine, started: Instant) {
    let plan = &options.plan;
    let mut results = Vec::new();
    for &flavor in &options.flavors {
        let version = server_version(&start(flavor));
        progress(&format!("{flavor}: {version}"));
        let stalls = stalls::bench(flavor, plan);
        results.push(stalls::StallServer {
            flavor,
            version,
            stalls,
        });
    }
    machine.finish(started.elapsed());
    let md = stalls::markdown(&results, plan, &machine);
    println!("{md}");
    std::fs::create_dir_all(&options.out)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", options.out.display()));
    let path = options.out.join("stalls.md");
    write(&path, &md);
    println!("wrote {}", path.display());
}
