//! The bench's report: the machine it ran on, each target's verdict, and the tables,
//! as markdown (printed, and written to `bench.md`).

use std::fmt::Write as _;
use std::time::Duration;

use crate::sessions::SessionResult;
use crate::shared::SharedResult;
use crate::{ExpiryWay, Mode, Op, Plan, Samples, ServerResult};
use harness::Flavor;

/// What the numbers were measured on.
pub struct Machine {
    pub cpu_model: String,
    pub cores: usize,
    pub mem_gib: f64,
    pub kernel: String,
    pub date: String,
    /// `/proc/loadavg` before the bench put any load on the machine, and after.
    pub load_start: String,
    pub load_end: String,
    pub elapsed: Duration,
    pub note: Option<String>,
}

impl Machine {
    pub fn probe(note: Option<String>) -> Machine {
        let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
        let cpuinfo = read("/proc/cpuinfo");
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == "model name").then(|| v.trim().to_string())
            })
            .unwrap_or_else(|| "unknown".to_string());
        let mem_kib: f64 = read("/proc/meminfo")
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0.0);
        let date = std::process::Command::new("date")
            .args(["-u", "+%Y-%m-%d %H:%M UTC"])
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        Machine {
            cpu_model,
            cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
            mem_gib: mem_kib / 1024.0 / 1024.0,
            kernel: read("/proc/sys/kernel/osrelease").trim().to_string(),
            date,
            // scripts/bench reads it before it builds anything.
            load_start: std::env::var("LEASE_BENCH_LOAD_START")
                .ok()
                .filter(|l| !l.trim().is_empty())
                .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
                .unwrap_or_else(loadavg),
            load_end: String::new(),
            elapsed: Duration::ZERO,
            note,
        }
    }

    pub fn finish(&mut self, elapsed: Duration) {
        self.load_end = loadavg();
        self.elapsed = elapsed;
    }
}

/// The three load averages of `/proc/loadavg`.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// One target of issue 6 and how it fared.
pub struct Target {
    pub name: &'static str,
    /// The name in the chart.
    pub short: &'static str,
    pub measured: String,
    pub goal: &'static str,
    pub pass: bool,
}

fn ratio(a: f64, b: f64) -> f64 {
    a / b
}

/// Growth of a curve: the median at the largest size over the median at the smallest.
pub fn growth(first: &Samples, last: &Samples) -> f64 {
    ratio(last.median(), first.median())
}

pub fn cycle_medians(r: &ServerResult) -> (f64, f64) {
    let c = &r.cpu;
    let native =
        c.get(Op::Acquire).median() + c.get(Op::Renew).median() + c.get(Op::Release).median();
    let lua = c.get(Op::SetNxPx).median()
        + c.get(Op::EvalRenew).median()
        + c.get(Op::EvalRelease).median();
    (native, lua)
}

/// Worst probe round trip over all runs, µs.
pub fn worst(s: &Samples) -> f64 {
    s.max()
}

pub fn targets(r: &ServerResult) -> Vec<Target> {
    let c = &r.cpu;
    let (native_cycle, lua_cycle) = cycle_medians(r);
    let cycle = ratio(native_cycle, lua_cycle);
    let acq = ratio(c.get(Op::Acquire).median(), c.get(Op::SetNxPx).median());
    let fence = ratio(c.get(Op::Fence).median(), c.get(Op::Incr).median());
    let tp = ratio(r.throughput.native.median(), r.throughput.lua.median());
    let m = &r.memory;
    let usage = ratio(m.native_usage.median(), m.lua_usage.median());
    let delta = ratio(m.native_delta.median(), m.lua_delta.median());
    let e = &r.expiry.native;
    let max_ms = worst(&e.max_us) / 1e3;
    let mut out = vec![
        Target {
            name: "Full cycle ACQUIRE+RENEW+RELEASE vs SET NX PX + EVALSHA renew + EVALSHA release (server CPU)",
            short: "Full cycle CPU vs the Lua way",
            measured: format!("{:.2} / {:.2} µs = {}", native_cycle, lua_cycle, times(cycle)),
            goal: "≤ 0.40×",
            pass: cycle <= 0.40,
        },
        Target {
            name: "LEASE.ACQUIRE vs SET NX PX (server CPU)",
            short: "ACQUIRE CPU vs SET NX PX",
            measured: format!(
                "{:.2} / {:.2} µs = {}",
                c.get(Op::Acquire).median(),
                c.get(Op::SetNxPx).median(),
                times(acq)
            ),
            goal: "≤ 1.2×",
            pass: acq <= 1.2,
        },
        Target {
            name: "LEASE.FENCE (no inner command) vs INCR (server CPU)",
            short: "FENCE CPU vs INCR",
            measured: format!(
                "{:.2} / {:.2} µs = {}",
                c.get(Op::Fence).median(),
                c.get(Op::Incr).median(),
                times(fence)
            ),
            goal: "≤ 1.2×",
            pass: fence <= 1.2,
        },
        Target {
            name: "Pipelined acquire/release cycles per second vs the Lua way",
            short: "Pipelined cycles/s vs the Lua way",
            measured: format!(
                "{} / {} = {}",
                count(r.throughput.native.median()),
                count(r.throughput.lua.median()),
                times(tp)
            ),
            goal: "≥ 1.8×",
            pass: tp >= 1.8,
        },
        Target {
            name: "Memory per live lease: MEMORY USAGE vs SET NX PX string",
            short: "MEMORY USAGE vs a SET NX PX string",
            measured: format!(
                "{:.0} / {:.0} B = {}",
                m.native_usage.median(),
                m.lua_usage.median(),
                times(usage)
            ),
            goal: "≤ 1.3×",
            pass: usage <= 1.3,
        },
        Target {
            name: "Memory per live lease: used_memory delta vs SET NX PX strings",
            short: "used_memory per key vs strings",
            measured: format!(
                "{:.1} / {:.1} B = {}",
                m.native_delta.median(),
                m.lua_delta.median(),
                times(delta)
            ),
            goal: "≤ 1.3×",
            pass: delta <= 1.3,
        },
        Target {
            name: "Leases expiring together: worst probe round trip while reaped",
            short: "Worst probe round trip, mass expiry",
            measured: format!(
                "{:.2} ms (p99 {:.2} ms) over {} keys",
                max_ms,
                e.p99_us.median() / 1e3,
                count(r.expiry.keys as f64)
            ),
            goal: "< 2 ms",
            pass: max_ms < 2.0,
        },
        Target {
            name: "Leases expiring together: all deleted in bounded time",
            short: "All expired leases deleted",
            measured: format!(
                "DBSIZE 0 after {:.2} s (median; worst {:.2} s)",
                e.drain_ms.median() / 1e3,
                e.drain_ms.max() / 1e3
            ),
            goal: "bounded",
            pass: e.drain_ms.max().is_finite(),
        },
    ];
    let pts = &r.curve.points;
    if let (Some(first), Some(last)) = (pts.first(), pts.last()) {
        let span = format!(
            "{} → {} live",
            count(first.live as f64),
            count(last.live as f64)
        );
        let acq_g = growth(&first.acquire, &last.acquire);
        let ren_g = growth(&first.renew, &last.renew);
        out.push(Target {
            name: "Flat cost: LEASE.ACQUIRE from fewest to most live leases",
            short: "ACQUIRE cost flat in live leases",
            measured: format!(
                "{span}: {} (SET NX PX: {})",
                times(acq_g),
                times(growth(&first.set_nx_px, &last.set_nx_px))
            ),
            goal: "≤ 1.25× growth",
            pass: acq_g <= 1.25,
        });
        out.push(Target {
            name: "Flat cost: LEASE.RENEW from fewest to most live leases",
            short: "RENEW cost flat in live leases",
            measured: format!(
                "{span}: {} (EVALSHA renew: {})",
                times(ren_g),
                times(growth(&first.eval_renew, &last.eval_renew))
            ),
            goal: "≤ 1.25× growth",
            pass: ren_g <= 1.25,
        });
    }
    out
}

pub fn times(x: f64) -> String {
    format!("{x:.2}×")
}

/// `1234567` as `1,234,567`.
pub fn count(x: f64) -> String {
    let n = x.round() as i64;
    let digits = n.abs().to_string();
    let mut out = String::new();
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    if n < 0 {
        format!("-{out}")
    } else {
        out
    }
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

fn verdict(pass: bool) -> &'static str {
    if pass {
        "PASS"
    } else {
        "FAIL"
    }
}

/// The tables for one server.
fn server_tables(out: &mut String, r: &ServerResult, plan: &Plan) {
    let runs = plan.runs;
    let c = &r.cpu;
    let _ = writeln!(out, "### Targets\n");
    let _ = writeln!(
        out,
        "| Target | Measured (medians of {runs} runs) | Goal | Result |"
    );
    let _ = writeln!(out, "|---|---|---|---|");
    for t in targets(r) {
        let _ = writeln!(
            out,
            "| {} | {} | {} | **{}** |",
            t.name,
            t.measured,
            t.goal,
            verdict(t.pass)
        );
    }
    let _ = writeln!(
        out,
        "\nRatios are redis-lease over the Lua way (or INCR). Growth is the cost with the most \
         live leases over the cost with one; the Lua way's growth on the same server shows \
         what Redis's own keyspace costs at that size. `MEMORY USAGE` counts what the module's \
         `mem_usage` callback reports; the `used_memory` delta counts everything the keys \
         cost, the module's deadline index included. Probe maxima include the scheduler \
         delays of a shared machine: compare them with the probe before the deadline and with \
         the server's wait for a CPU in table d."
    );

    let _ = writeln!(
        out,
        "\n### a. Server CPU per call\n\n`usec / calls` from `INFO commandstats` after `CONFIG RESETSTAT`, \
         {} calls per operation in pipelines of 1000, distinct keys (`bench:00000000`…), \
         32-hex-character tokens. Each redis-lease step runs in turn with its Lua-way \
         step, a pipeline at a time, on the same key names (leases in database 0, strings \
         in database 1), so both meet the same background load. µs per call: median \
         (min–max) of {runs} runs.\n",
        count(plan.cpu_calls as f64)
    );
    let _ = writeln!(
        out,
        "| Step | SET NX PX + Lua | µs | redis-lease | µs | ratio |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|");
    let pairs = [
        ("acquire", Op::SetNxPx, Op::Acquire),
        ("renew", Op::EvalRenew, Op::Renew),
        ("release", Op::EvalRelease, Op::Release),
    ];
    for (step, lua, native) in pairs {
        let _ = writeln!(
            out,
            "| {step} | `{}` | {} | `{}` | {} | {} |",
            lua.label(),
            spread(c.get(lua), 2),
            native.label(),
            spread(c.get(native), 2),
            times(ratio(c.get(native).median(), c.get(lua).median()))
        );
    }
    let (nc, lc) = cycle_medians(r);
    let _ = writeln!(
        out,
        "| **full cycle** | sum of the three | {lc:.2} | sum of the three | {nc:.2} | **{}** |",
        times(ratio(nc, lc))
    );
    let _ = writeln!(
        out,
        "| fence | `{}` | {} | `{}` | {} | {} |",
        Op::Incr.label(),
        spread(c.get(Op::Incr), 2),
        Op::Fence.label(),
        spread(c.get(Op::Fence), 2),
        times(ratio(c.get(Op::Fence).median(), c.get(Op::Incr).median()))
    );
    let _ = writeln!(
        out,
        "| acquire, token made by the server | | | `{}` | {} | {} vs SET NX PX |",
        Op::AcquireGenerated.label(),
        spread(c.get(Op::AcquireGenerated), 2),
        times(ratio(
            c.get(Op::AcquireGenerated).median(),
            c.get(Op::SetNxPx).median()
        ))
    );
    let _ = writeln!(
        out,
        "| reference | `{}` | {} | | | |",
        Op::Get.label(),
        spread(c.get(Op::Get), 2)
    );

    let t = &r.throughput;
    let _ = writeln!(
        out,
        "\n### b. Pipelined throughput\n\n{} client threads, {} commands per round trip \
         ({} acquire/release cycles on the client's own keys); each run alternates {} \
         slice(s) of {:.1} s of each way. Cycles per second over all clients: median \
         (min–max) of {runs} runs. The clients run on the same {} cores as the server.\n",
        plan.threads,
        plan.depth,
        plan.depth / 2,
        plan.throughput_slices,
        plan.throughput_time.as_secs_f64(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let _ = writeln!(out, "| Way | Cycle | cycles/s |");
    let _ = writeln!(out, "|---|---|---|");
    let _ = writeln!(
        out,
        "| SET NX PX + Lua | `SET NX PX` then `EVALSHA` compare-and-delete | {} |",
        spread_count(&t.lua)
    );
    let _ = writeln!(
        out,
        "| redis-lease | `LEASE.ACQUIRE … TOKEN` then `LEASE.RELEASE` | {} |",
        spread_count(&t.native)
    );
    let _ = writeln!(
        out,
        "| **ratio** | | **{}** |",
        times(ratio(t.native.median(), t.lua.median()))
    );

    let m = &r.memory;
    let _ = writeln!(
        out,
        "\n### c. Memory per live key\n\n{} keys with the same 10-byte names (`m:00000000`…) \
         and the same 32-character tokens, TTL 1 h; `MEMORY USAGE key SAMPLES 0` of one key, \
         and the `used_memory` delta over all keys divided by their number (this includes \
         the keyspace and expires dictionaries and the module's deadline index). Bytes: \
         median (min–max) of {runs} runs.\n",
        count(m.keys as f64)
    );
    let _ = writeln!(out, "| Measure | SET NX PX string | lease | ratio |");
    let _ = writeln!(out, "|---|---|---|---|");
    let _ = writeln!(
        out,
        "| `MEMORY USAGE` | {} | {} | {} |",
        spread(&m.lua_usage, 0),
        spread(&m.native_usage, 0),
        times(ratio(m.native_usage.median(), m.lua_usage.median()))
    );
    let _ = writeln!(
        out,
        "| `used_memory` delta per key | {} | {} | {} |",
        spread(&m.lua_delta, 1),
        spread(&m.native_delta, 1),
        times(ratio(m.native_delta.median(), m.lua_delta.median()))
    );

    let e = &r.expiry;
    let _ = writeln!(
        out,
        "\n### d. {} keys expiring together\n\nAll keys get one deadline (the TTL of each \
         is computed as it is sent); the deadline falls {:.0} s after the last one is \
         granted. A probe client times PING round trips, waiting {:.1} ms after each reply \
         (like `redis-cli --latency`, which waits 10 ms); DBSIZE is polled every 5 ms; the \
         server's own longest deletion step comes from its latency monitor \
         (`latency-monitor-threshold` 1: the reaper's `lease-reap`, Redis's \
         `expire-cycle`; whole milliseconds, 0 = none reached 1 ms), its time on and waiting \
         for a CPU from `/proc/<pid>/schedstat`. \"While deleting\" is from the deadline until DBSIZE = 0; \
         \"before\" is the same probe on the same server in the seconds before the \
         deadline. Leases are deleted by the module's reaper (`lease.reap-hz` 10, \
         `lease.reap-batch` 1000 and 1 ms a tick, defaults); strings by Redis's own active expiry. \
         Milliseconds; worst = the largest over {runs} runs, others median (min–max).\n",
        count(e.keys as f64),
        crate::EXPIRY_LEAD.as_secs_f64(),
        crate::PROBE_GAP.as_secs_f64() * 1e3
    );
    let mut columns = vec![
        ("leases (redis-lease)".to_string(), &e.native),
        ("`PX` strings (Redis)".to_string(), &e.lua),
    ];
    let end = &r.sessions.end;
    if r.sessions.supported {
        columns.push((
            format!(
                "a session with {} bound holds released (redis-lease)",
                count(end.holds as f64)
            ),
            &end.session,
        ));
    }
    expiry_rows(out, &columns);
    if r.sessions.supported {
        let _ = writeln!(
            out,
            "\nThe session's column: {} holds bound with ttl 0 to one session, which is \
             released at the deadline (`LEASE.RELEASE`: {} µs round trip, {} µs of server \
             CPU, medians); \"while deleting\" runs from the release until DBSIZE = 0, the \
             bound keys deleted by the reaper in batches of `lease.reap-batch`. More in \
             [sessions.md](sessions.md).",
            count(end.holds as f64),
            spread(&end.release_rtt_us, 0),
            spread(&end.release_us, 0)
        );
    }

    let pts = &r.curve.points;
    let _ = writeln!(
        out,
        "\n### e. Server CPU per call vs live keys\n\nWith N live leases (database 0) and N \
         `SET NX PX` strings (database 1) held, {} acquire/release pairs on fresh keys (so N \
         stays put) and {} renewals spread over the N live keys, the two ways in turn a \
         pipeline at a time. µs per call, median of {runs} runs; the last row is the largest \
         size over the smallest.\n",
        count(plan.curve_calls as f64),
        count(plan.curve_calls as f64)
    );
    let _ = writeln!(
        out,
        "| live keys | LEASE.ACQUIRE | LEASE.RENEW | LEASE.RELEASE | SET NX PX | EVALSHA renew | EVALSHA release |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|");
    for p in pts {
        let _ = writeln!(
            out,
            "| {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            count(p.live as f64),
            p.acquire.median(),
            p.renew.median(),
            p.release.median(),
            p.set_nx_px.median(),
            p.eval_renew.median(),
            p.eval_release.median()
        );
    }
    if let (Some(f), Some(l)) = (pts.first(), pts.last()) {
        let _ = writeln!(
            out,
            "| **growth** | {} | {} | {} | {} | {} | {} |",
            times(growth(&f.acquire, &l.acquire)),
            times(growth(&f.renew, &l.renew)),
            times(growth(&f.release, &l.release)),
            times(growth(&f.set_nx_px, &l.set_nx_px)),
            times(growth(&f.eval_renew, &l.eval_renew)),
            times(growth(&f.eval_release, &l.eval_release))
        );
    }
    shared_tables(out, &r.shared, plan, "f", "g", "h");
    session_tables(out, &r.sessions, plan, "i", None);
}

/// The rows of a mass-expiry table, one column per way: (header, measurements).
fn expiry_rows(out: &mut String, columns: &[(String, &ExpiryWay)]) {
    let _ = write!(out, "| Measure |");
    for (name, _) in columns {
        let _ = write!(out, " {name} |");
    }
    let _ = write!(out, "\n|---|");
    for _ in columns {
        let _ = write!(out, "---|");
    }
    out.push('\n');
    let ms = |s: &Samples| Samples(s.0.iter().map(|v| v / 1e3).collect());
    type Cell = fn(&ExpiryWay, &dyn Fn(&Samples) -> Samples) -> String;
    let rows: [(&str, Cell); 10] = [
        ("probe round trip while deleting, worst", |w, _| {
            format!("**{:.2}**", worst(&w.max_us) / 1e3)
        }),
        ("probe round trip while deleting, max", |w, ms| {
            spread(&ms(&w.max_us), 2)
        }),
        ("probe round trip while deleting, p99", |w, ms| {
            spread(&ms(&w.p99_us), 2)
        }),
        ("probe round trip before the deadline, max", |w, ms| {
            spread(&ms(&w.idle_max_us), 2)
        }),
        ("probe round trip before the deadline, p99", |w, ms| {
            spread(&ms(&w.idle_p99_us), 2)
        }),
        (
            "longest deletion step timed by the server (LATENCY), worst",
            |w, _| format!("{:.0}", w.server_step_ms.max()),
        ),
        ("probes while deleting", |w, _| count(w.probes.median())),
        ("deadline → DBSIZE 0", |w, _| spread(&w.drain_ms, 0)),
        ("server on a CPU in that time", |w, _| {
            spread(&w.server_cpu_ms, 0)
        }),
        (
            "server runnable but waiting for a CPU in that time",
            |w, _| spread(&w.server_wait_ms, 0),
        ),
    ];
    for (label, cell) in rows {
        let _ = write!(out, "| {label} |");
        for (_, way) in columns {
            let _ = write!(out, " {} |", cell(way, &ms));
        }
        out.push('\n');
    }
}

/// One server's session results (`--sessions`).
pub struct SessionServer {
    pub flavor: Flavor,
    pub version: String,
    pub sessions: SessionResult,
}

/// How the keep-alive was timed: `ttl 3 s, renewed every 1 s, 6 times (6 s)`.
pub fn keepalive_timing(plan: &Plan) -> String {
    let secs = |d: std::time::Duration| {
        let s = d.as_secs_f64();
        if s >= 1.0 {
            format!("{s:.0} s")
        } else {
            format!("{:.0} ms", s * 1e3)
        }
    };
    format!(
        "ttl {}, renewed every {}, {} times ({})",
        secs(plan.session_ttl),
        secs(plan.session_period),
        plan.session_rounds,
        secs(plan.session_period * plan.session_rounds as u32)
    )
}

/// The session sections: the keep-alive as `keep`, and, with `end`, the session's end
/// against as many leases expiring together.
pub fn session_tables(
    out: &mut String,
    sr: &SessionResult,
    plan: &Plan,
    keep: &str,
    end: Option<&str>,
) {
    let runs = plan.runs;
    if !sr.supported {
        let _ = writeln!(
            out,
            "\n### Sessions\n\nNot measured: this module has no `LEASE.ACQUIRE … SESSION` \
             (before issue 17)."
        );
        return;
    }
    let most = sr.keepalive.iter().map(|p| p.leases).max().unwrap_or(0);
    let compressed = plan.session_period < std::time::Duration::from_secs(10);
    let _ = writeln!(
        out,
        "\n### {keep}. Keeping N leases alive: one session vs a RENEW per lease\n\n\
         N leases kept alive at {timing}{scale}. One session: the N holds bound with ttl 0 \
         (`LEASE.ACQUIRE key 0 SESSION session token`) to a session of that ttl, one \
         `LEASE.RENEW` of the session per period. A RENEW per lease: N leases of that ttl, \
         N `LEASE.RENEW`s per period in one pipeline. The two one after the other on one \
         server, the set-up (acquiring, binding) before the span and not counted; every \
         reply is checked, and at the end every bound hold is still live (`bound` of \
         `LEASE.INFO` of the session). Commands sent over the span; their server CPU \
         (`usec` of `lease.renew` in `INFO commandstats`, after `CONFIG RESETSTAT`), ms; \
         the server process's CPU (`used_cpu_sys` + `used_cpu_user` of `INFO cpu` before \
         and after: the commands, their reading and replies, the reaper's ticks and the \
         server's cron), ms. The baseline: the same span with {most_n} leases of 1 h held \
         and nothing sent. Median (min–max) of {runs} runs.\n",
        timing = keepalive_timing(plan),
        scale = if compressed && !plan.quick {
            ": the issue's minute at ttl 30 s with a renewal every 10 s, compressed ten \
             times (the same commands in a tenth of the time, so a tenth of the idle cost; \
             `scripts/bench --sessions --real-time` runs the minute)"
        } else {
            ""
        },
        most_n = count(most as f64),
    );
    let _ = writeln!(
        out,
        "| leases | commands: one session | commands: a RENEW per lease | RENEW CPU, ms: one session | RENEW CPU, ms: a RENEW per lease | process CPU, ms: one session | process CPU, ms: a RENEW per lease | process CPU, per lease over session |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|");
    for p in &sr.keepalive {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | **{}** |",
            count(p.leases as f64),
            count(p.session.commands.median()),
            count(p.each.commands.median()),
            spread(&p.session.renew_ms, 3),
            spread(&p.each.renew_ms, 3),
            spread(&p.session.cpu_ms, 1),
            spread(&p.each.cpu_ms, 1),
            times(ratio(p.each.cpu_ms.median(), p.session.cpu_ms.median()))
        );
    }
    let _ = writeln!(
        out,
        "| baseline: nothing sent | 0 | 0 | | | {} | | |",
        spread(&sr.idle.cpu_ms, 1)
    );
    let Some(letter) = end else {
        return;
    };
    let e = &sr.end;
    let _ = writeln!(
        out,
        "\n### {letter}. A session with {holds} bound holds ending\n\n\
         {holds} holds bound with ttl 0 to one session (`lease.reap-hz` 10, \
         `lease.reap-batch` 1000 and 1 ms a tick, the defaults), the session released by `LEASE.RELEASE` \
         at the deadline; against {holds} leases expiring together at one deadline \
         (as section d of [bench.md](bench.md), which has 1,000,000), the two in turn on \
         the same server. A probe client times PING round trips, waiting {gap:.1} ms after \
         each reply; DBSIZE is polled every 5 ms; \"while deleting\" runs from the release \
         (or the deadline) until DBSIZE = 0, \"before\" is the same probe in the {lead:.0} s \
         before. The server's longest reaper tick comes from its latency monitor \
         (`latency-monitor-threshold` 1, `lease-reap`; whole ms, 0 = none reached 1 ms), \
         its time on and waiting for a CPU from `/proc/<pid>/schedstat`. Milliseconds; \
         worst = the largest over {runs} runs, others median (min–max).\n",
        holds = count(e.holds as f64),
        gap = crate::PROBE_GAP.as_secs_f64() * 1e3,
        lead = crate::EXPIRY_LEAD.as_secs_f64(),
    );
    let mut columns = vec![(
        format!("session released, {} bound holds", count(e.holds as f64)),
        &e.session,
    )];
    if let Some(leases) = &e.leases {
        columns.push((
            format!("{} leases expiring together", count(e.holds as f64)),
            leases,
        ));
    }
    expiry_rows(out, &columns);
    let _ = writeln!(
        out,
        "\nThe `LEASE.RELEASE` of the session: {} µs round trip as the client saw it, {} µs \
         of server CPU (`INFO commandstats`), median (min–max).",
        spread(&e.release_rtt_us, 0),
        spread(&e.release_us, 0)
    );
    let _ = writeln!(
        out,
        "\nBinding the {} holds (pipelined `LEASE.ACQUIRE … SESSION`), probed the same way: \
         worst round trip {} ms (99th percentile {} ms); the server's longest command \
         (`command` or `fast-command` of its latency monitor) {} ms, worst over the runs.",
        count(e.holds as f64),
        format_args!("{:.1}", e.bind_max_us.max() / 1e3),
        format_args!("{:.2}", e.bind_p99_us.median() / 1e3),
        e.bind_step_ms.max(),
    );
}

/// `sessions.md` (`--sessions`).
pub fn sessions_markdown(results: &[SessionServer], plan: &Plan, machine: &Machine) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Sessions: what one keepalive saves, what an end costs\n"
    );
    let _ = writeln!(
        out,
        "Written by `scripts/bench --sessions{}` on {}; do not edit by hand. Every \
         comparison on the same server in the same run, on servers started by the bench; \
         medians of {} runs. Machine: {} × {}, {:.0} GiB, Linux {}; load average {} at \
         start, {} at end; {:.0} s.\n",
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
    if results.first().is_some_and(|r| r.sessions.supported) {
        let _ = writeln!(out, "![Charts of the comparisons](sessions.svg)\n");
    }
    for r in results {
        let _ = writeln!(out, "## {} (`{}`)", r.version, r.flavor);
        session_tables(&mut out, &r.sessions, plan, "a", Some("b"));
        out.push('\n');
    }
    out
}

/// One server's shared-hold results (`--shared`, `--memory`).
pub struct SharedServer {
    pub flavor: Flavor,
    pub version: String,
    pub shared: SharedResult,
}

/// The shared-hold sections, lettered as given; nothing measured says so.
pub fn shared_tables(
    out: &mut String,
    sh: &SharedResult,
    plan: &Plan,
    cpu: &str,
    tp: &str,
    mem: &str,
) {
    let runs = plan.runs;
    if let Some(m) = &sh.exclusive {
        let _ = writeln!(
            out,
            "\n### Memory per exclusive lease\n\n{} keys (10-byte names, `m:00000000`…), 32-character \
             tokens, TTL 1 h: `MEMORY USAGE key SAMPLES 0` of one key and the `used_memory` \
             delta over all keys divided by their number (the keyspace and expires \
             dictionaries and the module's deadline index included), against `SET NX PX` \
             strings with the same names and tokens. Bytes: median (min–max) of {runs} runs.\n",
            count(m.keys as f64)
        );
        let _ = writeln!(
            out,
            "| Measure | SET NX PX string | exclusive lease | ratio |"
        );
        let _ = writeln!(out, "|---|---|---|---|");
        let _ = writeln!(
            out,
            "| `MEMORY USAGE` | {} | {} | {} |",
            spread(&m.lua_usage, 0),
            spread(&m.native_usage, 0),
            times(ratio(m.native_usage.median(), m.lua_usage.median()))
        );
        let _ = writeln!(
            out,
            "| `used_memory` delta per key | {} | {} | {} |",
            spread(&m.lua_delta, 1),
            spread(&m.native_delta, 1),
            times(ratio(m.native_delta.median(), m.lua_delta.median()))
        );
    }
    if !sh.supported {
        let _ = writeln!(
            out,
            "\n### Shared holds\n\nNot measured: this module has no `LEASE.ACQUIRE … SHARED` \
             (before issue 16)."
        );
        return;
    }
    let limit = count(crate::shared::LIMIT as f64);
    if !sh.cpu.is_empty() {
        let _ = writeln!(
            out,
            "\n### {cpu}. Shared holds vs a sorted-set semaphore: server CPU per call\n\n\
             One hold acquired, renewed and released by token among N holds on its key: \
             `LEASE.ACQUIRE key ttl TOKEN token SHARED LIMIT {limit}` / `LEASE.RENEW` / \
             `LEASE.RELEASE` (database 0) against the semaphore built the usual way, a \
             sorted set of tokens scored by deadline (database 1): acquire = `EVALSHA` of \
             `TIME`, `ZREMRANGEBYSCORE key -inf now`, `ZCARD`, `ZADD` when under the limit; \
             renew = `EVALSHA` of `ZSCORE` (present and not expired), `ZADD XX`; release = \
             `ZREM`. {} calls per operation at each N, on keys that hold 90% of N before \
             the acquires add the last 10% (at least one hold per key; with N = 1 each key \
             has only the hold measured: the acquire creates it, the release deletes it); \
             the renewals and releases pick holds spread evenly over each key's holds, old \
             and new. The two ways in turn a pipeline at a time. µs per call, median of \
             {runs} runs; ratios are redis-lease over the semaphore; growth is the largest N \
             over N = 1. A sorted set of up to 128 members is a listpack (the default \
             `zset-max-listpack-entries`), a skiplist beyond.\n",
            count(plan.shared_calls as f64)
        );
        let _ = writeln!(
            out,
            "| holds on the key | ACQUIRE SHARED | semaphore acquire | ratio | RENEW | semaphore renew | ratio | RELEASE | `ZREM` | ratio | full cycle ratio |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|");
        for p in &sh.cpu {
            let (nc, sc) = p.cycle();
            let _ = writeln!(
                out,
                "| {} | {:.2} | {:.2} | {} | {:.2} | {:.2} | {} | {:.2} | {:.2} | {} | **{}** |",
                count(p.holds as f64),
                p.acquire.median(),
                p.sem_acquire.median(),
                times(ratio(p.acquire.median(), p.sem_acquire.median())),
                p.renew.median(),
                p.sem_renew.median(),
                times(ratio(p.renew.median(), p.sem_renew.median())),
                p.release.median(),
                p.sem_release.median(),
                times(ratio(p.release.median(), p.sem_release.median())),
                times(ratio(nc, sc))
            );
        }
        if let (Some(f), Some(l)) = (sh.cpu.first(), sh.cpu.last()) {
            let g = |a: &Samples, b: &Samples| times(growth(a, b));
            let _ = writeln!(
                out,
                "| **growth** | {} | {} | | {} | {} | | {} | {} | | |",
                g(&f.acquire, &l.acquire),
                g(&f.sem_acquire, &l.sem_acquire),
                g(&f.renew, &l.renew),
                g(&f.sem_renew, &l.sem_renew),
                g(&f.release, &l.release),
                g(&f.sem_release, &l.sem_release)
            );
        }
    }
    if !sh.throughput.is_empty() {
        let _ = writeln!(
            out,
            "\n### {tp}. Shared holds vs a sorted-set semaphore: pipelined throughput\n\n\
             {} client threads on one key that already holds N other holds (limit {limit} \
             both ways), each sending {} acquire/renew/release cycles per round trip with \
             tokens of its own; each run alternates {} slice(s) of {:.1} s of each way. \
             Cycles per second over all clients: median (min–max) of {runs} runs.\n",
            plan.threads,
            (plan.depth / 3).max(1),
            plan.throughput_slices,
            plan.throughput_time.as_secs_f64()
        );
        let _ = writeln!(
            out,
            "| other holds on the key | sorted set + Lua, cycles/s | redis-lease SHARED, cycles/s | ratio |"
        );
        let _ = writeln!(out, "|---|---|---|---|");
        for p in &sh.throughput {
            let _ = writeln!(
                out,
                "| {} | {} | {} | **{}** |",
                count(p.holds as f64),
                spread_count(&p.sem),
                spread_count(&p.native),
                times(ratio(p.native.median(), p.sem.median()))
            );
        }
    }
    if !sh.memory.is_empty() {
        let _ = writeln!(
            out,
            "\n### {mem}. Memory per shared hold\n\n`used_memory` delta over all holds (after it \
             settles) divided by the number of holds, and `MEMORY USAGE key SAMPLES 0` of one \
             key divided by its holds: redis-lease shared holds (`lease.max-holders` raised \
             to {limit}) against the sorted-set semaphore, 32-character tokens, TTL 1 h. \
             Bytes per hold: median (min–max) of {runs} runs.\n"
        );
        let _ = writeln!(
            out,
            "| Layout | Measure | sorted set + Lua | redis-lease SHARED | ratio |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|");
        for m in &sh.memory {
            let layout = format!(
                "{} key{} × {} hold{}",
                count(m.keys as f64),
                if m.keys == 1 { "" } else { "s" },
                count(m.holds_per_key as f64),
                if m.holds_per_key == 1 { "" } else { "s" }
            );
            let _ = writeln!(
                out,
                "| {layout} | `used_memory` delta per hold | {} | {} | **{}** |",
                spread(&m.sem_delta, 1),
                spread(&m.native_delta, 1),
                times(ratio(m.native_delta.median(), m.sem_delta.median()))
            );
            let _ = writeln!(
                out,
                "| {layout} | `MEMORY USAGE` per hold | {} | {} | {} |",
                spread(&m.sem_usage, 1),
                spread(&m.native_usage, 1),
                times(ratio(m.native_usage.median(), m.sem_usage.median()))
            );
        }
    }
}

/// One table of every server's memory medians (`memory.md`), bytes.
/// A table header with one column per server, and a last column `last` when given.
/// The line every report of a `--quick` run carries under its title.
pub fn quick_banner(out: &mut String, quick: bool) {
    if quick {
        let _ = writeln!(
            out,
            "**Quick run (CI smoke): one run at small sizes. These numbers are not the \
             benchmark.**\n"
        );
    }
}

fn server_header(out: &mut String, first: &str, results: &[SharedServer], last: Option<&str>) {
    let _ = write!(out, "| {first} |");
    for r in results {
        let _ = write!(out, " {} |", r.version);
    }
    if let Some(last) = last {
        let _ = write!(out, " {last} |");
    }
    let _ = write!(out, "\n|---|");
    for _ in results {
        let _ = write!(out, "---:|");
    }
    if last.is_some() {
        out.push_str("---|");
    }
    out.push('\n');
}

fn memory_summary(out: &mut String, results: &[SharedServer]) {
    server_header(out, "Bytes (medians)", results, None);
    type Pick = fn(&SharedResult) -> Option<f64>;
    let mut rows: Vec<(String, Pick)> = vec![
        ("exclusive lease, `MEMORY USAGE`".into(), |s| {
            s.exclusive.as_ref().map(|m| m.native_usage.median())
        }),
        (
            "exclusive lease, `used_memory` delta per lease".into(),
            |s| s.exclusive.as_ref().map(|m| m.native_delta.median()),
        ),
        ("`SET NX PX` string, `MEMORY USAGE`".into(), |s| {
            s.exclusive.as_ref().map(|m| m.lua_usage.median())
        }),
        (
            "`SET NX PX` string, `used_memory` delta per key".into(),
            |s| s.exclusive.as_ref().map(|m| m.lua_delta.median()),
        ),
    ];
    let layouts = results
        .iter()
        .find(|r| r.shared.supported)
        .map(|r| r.shared.memory.clone())
        .unwrap_or_default();
    let picks: [[Pick; 2]; 2] = [
        [
            |s| s.memory.first().map(|m| m.native_delta.median()),
            |s| s.memory.first().map(|m| m.sem_delta.median()),
        ],
        [
            |s| s.memory.get(1).map(|m| m.native_delta.median()),
            |s| s.memory.get(1).map(|m| m.sem_delta.median()),
        ],
    ];
    let zset_keys = layouts
        .iter()
        .find(|m| m.holds_per_key == 1)
        .map_or(0, |m| m.keys);
    for (m, [native, sem]) in layouts.iter().zip(picks) {
        let layout = format!(
            "{} key{} × {} hold{}",
            count(m.keys as f64),
            if m.keys == 1 { "" } else { "s" },
            count(m.holds_per_key as f64),
            if m.holds_per_key == 1 { "" } else { "s" }
        );
        rows.push((
            format!("shared hold, `used_memory` delta per hold, {layout}"),
            native,
        ));
        rows.push((
            format!("sorted-set semaphore, `used_memory` delta per hold, {layout}"),
            sem,
        ));
    }
    rows.push((
        format!(
            "one-member sorted set + `PEXPIRE`, `used_memory` delta per key, {} keys",
            count(zset_keys as f64)
        ),
        |s| {
            s.memory
                .iter()
                .find(|m| m.holds_per_key == 1)
                .map(|m| m.zset_delta.median())
        },
    ));
    for (label, pick) in rows {
        let _ = write!(out, "| {label} |");
        for r in results {
            match pick(&r.shared) {
                Some(v) if v.is_finite() => {
                    let _ = write!(out, " {v:.1} |");
                }
                _ => {
                    let _ = write!(out, " n/a |");
                }
            }
        }
        out.push('\n');
    }
    out.push('\n');
    memory_goals(out, results);
}

/// Issue 27's memory goals beside the measured ratios of `used_memory` deltas.
fn memory_goals(out: &mut String, results: &[SharedServer]) {
    server_header(
        out,
        "Ratio of `used_memory` deltas (medians)",
        results,
        Some("Goal (issue 27)"),
    );
    type Ratio = fn(&SharedResult) -> Option<f64>;
    let rows: [(&str, Ratio, &str); 2] = [
        (
            "exclusive lease over a `SET NX PX` string lock",
            |s| {
                s.exclusive
                    .as_ref()
                    .map(|m| m.native_delta.median() / m.lua_delta.median())
            },
            "≤ 1.0",
        ),
        (
            "one shared hold per key over a one-member sorted set + `PEXPIRE`",
            |s| {
                s.memory
                    .iter()
                    .find(|m| m.holds_per_key == 1)
                    .map(|m| m.native_delta.median() / m.zset_delta.median())
            },
            "≤ 1.2",
        ),
    ];
    for (label, pick, goal) in rows {
        let _ = write!(out, "| {label} |");
        for r in results {
            match pick(&r.shared) {
                Some(v) if v.is_finite() => {
                    let _ = write!(out, " {v:.2}× |");
                }
                _ => {
                    let _ = write!(out, " n/a |");
                }
            }
        }
        let _ = writeln!(out, " {goal} |");
    }
    out.push('\n');
}

/// `shared.md` (`--shared`) or `memory.md` (`--memory`).
pub fn shared_markdown(
    results: &[SharedServer],
    mode: Mode,
    plan: &Plan,
    machine: &Machine,
) -> String {
    let mut out = String::new();
    let (title, flag) = match mode {
        Mode::Memory => ("Memory: exclusive leases and shared holds", "--memory"),
        _ => ("Shared holds vs a sorted-set semaphore", "--shared"),
    };
    let _ = writeln!(out, "# {title}\n");
    let _ = writeln!(
        out,
        "Written by `scripts/bench {flag}{}` on {}; do not edit by hand. Both ways on the \
         same server in the same run, on servers started by the bench; medians of {} runs. \
         Machine: {} × {}, {:.0} GiB, Linux {}; load average {} at start, {} at end; {:.0} s.\n",
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
    if mode == Mode::Memory {
        memory_summary(&mut out, results);
    }
    if mode == Mode::Shared && results.first().is_some_and(|r| r.shared.supported) {
        let _ = writeln!(out, "![Charts of the comparisons](shared.svg)\n");
    }
    for r in results {
        let _ = writeln!(out, "## {} (`{}`)", r.version, r.flavor);
        shared_tables(&mut out, &r.shared, plan, "a", "b", "c");
        out.push('\n');
    }
    out
}

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

fn servers_line(results: &[ServerResult]) -> String {
    results
        .iter()
        .map(|r| format!("{} (`{}`)", r.version, r.flavor))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What is printed at the end of a run: every server's tables.
pub fn text(results: &[ServerResult], plan: &Plan, machine: &Machine) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n{} runs on {} × {}, load average {} at start, {} at end; {:.0} s",
        plan.runs,
        machine.cores,
        machine.cpu_model,
        machine.load_start,
        machine.load_end,
        machine.elapsed.as_secs_f64()
    );
    for r in results {
        let _ = writeln!(out, "\n## {}\n", r.version);
        server_tables(&mut out, r, plan);
    }
    out
}

/// `bench.md`: the machine, the command, every server's tables and the chart.
pub fn markdown(results: &[ServerResult], plan: &Plan, machine: &Machine) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# Benchmarks: redis-lease vs `SET NX PX` + Lua\n");
    let _ = writeln!(
        out,
        "Written by `scripts/bench{}` on {}; do not edit by hand. Every comparison runs both \
         ways on the same server in the same run, each on a server of its own started by the \
         bench; medians of {} runs.\n",
        if plan.quick { " --quick" } else { "" },
        machine.date,
        plan.runs
    );
    quick_banner(&mut out, plan.quick);
    let _ = writeln!(out, "![Charts of the comparisons](bench.svg)\n");
    let _ = writeln!(out, "## Machine\n");
    let _ = writeln!(
        out,
        "- CPU: {} × {} (`nproc` {})",
        machine.cores, machine.cpu_model, machine.cores
    );
    let _ = writeln!(
        out,
        "- Memory: {:.0} GiB; Linux {}",
        machine.mem_gib, machine.kernel
    );
    let _ = writeln!(out, "- Servers: {}", servers_line(results));
    let _ = writeln!(
        out,
        "- Load average (1, 5, 15 min) at start {}, at end {}; the bench took {:.0} s",
        machine.load_start,
        machine.load_end,
        machine.elapsed.as_secs_f64()
    );
    if let Some(note) = &machine.note {
        let _ = writeln!(out, "- Note: {note}");
    }
    let _ = writeln!(
        out,
        "- Server CPU per call is what `INFO commandstats` counts inside the command \
         (parsing and network I/O excluded); throughput and probe latency include the \
         clients, which share the machine's cores with the server."
    );
    let _ = writeln!(
        out,
        "\nReproduce: `scripts/bench` (this report, into `docs/src/performance/reports/`), `scripts/bench --quick` \
         (smoke, into `target/bench-quick/`), `scripts/bench --all-servers` (also Redis 8.2, \
         Valkey 8.1 and Valkey 9.1). Criterion micro benches of the pure core: `cargo bench --bench core`.\n"
    );
    for r in results {
        let _ = writeln!(out, "## {}\n", r.version);
        server_tables(&mut out, r, plan);
        out.push('\n');
    }
    out
}
