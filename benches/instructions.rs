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
//! Usage: `cargo bench --bench instructions -- [--servers LIST] [--calls N] [--out FILE]`
//! (`scripts/instructions` installs valgrind and the servers, then runs this).

#[path = "../tests/common/mod.rs"]
mod common;
// Shared with the compare bench, which uses all of them.
#[allow(dead_code)]
#[path = "support/resp.rs"]
mod resp;
#[allow(dead_code)]
#[path = "support/workload.rs"]
mod workload;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{Flavor, Server, ServerOptions};
use resp::{decimal, encode, Conn};
use workload::{
    acquire, drive, eval_release, eval_renew, is_one, key, load_scripts, release, renew,
    server_version, set_nx_px, token, Scripts, CHUNK, COUNTER_KEYS,
};

const TTL: &[u8] = b"3600000";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Step {
    Acquire,
    Renew,
    Release,
    SetNxPx,
    EvalRenew,
    EvalRelease,
    Incr,
    Fence,
}

impl Step {
    /// In the order they run: each way's renewals and releases find its grants.
    const ALL: [Step; 8] = [
        Step::Acquire,
        Step::Renew,
        Step::Release,
        Step::SetNxPx,
        Step::EvalRenew,
        Step::EvalRelease,
        Step::Incr,
        Step::Fence,
    ];

    fn label(self) -> &'static str {
        match self {
            Step::Acquire => "LEASE.ACQUIRE key ttl TOKEN token",
            Step::Renew => "LEASE.RENEW key token ttl",
            Step::Release => "LEASE.RELEASE key token",
            Step::SetNxPx => "SET key token NX PX ttl",
            Step::EvalRenew => "EVALSHA compare-and-pexpire",
            Step::EvalRelease => "EVALSHA compare-and-delete",
            Step::Incr => "INCR counter",
            Step::Fence => "LEASE.FENCE resource fence",
        }
    }

    fn db(self) -> &'static str {
        match self {
            Step::SetNxPx | Step::EvalRenew | Step::EvalRelease | Step::Incr => "1",
            _ => "0",
        }
    }
}

/// A bound on a ratio of instructions per call, redis-lease over the Lua way, for each
/// server (in `Flavor::ALL` order: their allocators and module APIs differ).
struct Bound {
    what: &'static str,
    native: &'static [Step],
    lua: &'static [Step],
    max: [f64; Flavor::ALL.len()],
}

impl Bound {
    fn max(&self, flavor: Flavor) -> f64 {
        let at = Flavor::ALL.iter().position(|&f| f == flavor).unwrap_or(0);
        self.max[at]
    }
}

/// About 5% above the most each server counted in four runs (docs/instructions.md):
/// a second key open or an `RM_Call` on a hot path crosses them; the spread between
/// runs (under 1% for most steps, up to 4% for a few, as incremental rehashing and the
/// allocator's state fall differently) does not. Lower them when a change makes a
/// command cheaper.
const BOUNDS: &[Bound] = &[
    Bound {
        what: "full cycle vs SET NX PX + EVALSHA renew + EVALSHA release",
        native: &[Step::Acquire, Step::Renew, Step::Release],
        lua: &[Step::SetNxPx, Step::EvalRenew, Step::EvalRelease],
        max: [0.46, 0.43, 0.54, 0.46],
    },
    Bound {
        what: "LEASE.ACQUIRE vs SET NX PX",
        native: &[Step::Acquire],
        lua: &[Step::SetNxPx],
        max: [1.57, 1.49, 1.83, 1.76],
    },
    Bound {
        what: "LEASE.RENEW vs EVALSHA compare-and-pexpire",
        native: &[Step::Renew],
        lua: &[Step::EvalRenew],
        max: [0.28, 0.26, 0.32, 0.28],
    },
    Bound {
        what: "LEASE.RELEASE vs EVALSHA compare-and-delete",
        native: &[Step::Release],
        lua: &[Step::EvalRelease],
        max: [0.28, 0.28, 0.34, 0.28],
    },
    Bound {
        what: "LEASE.FENCE vs INCR",
        native: &[Step::Fence],
        lua: &[Step::Incr],
        // Valkey 9's INCR counted 1,761 to 1,892 between runs (FENCE 2,569
        // every time): the bound sits above the lowest INCR. Redis 7.0's
        // FENCE counted 2,246 to 2,341 over builds of this stop (a resource
        // record's first store is half of the spread), ratio up to 1.32.
        max: [1.38, 1.38, 1.61, 1.53],
    },
];

struct Options {
    flavors: Vec<Flavor>,
    calls: usize,
    out: Option<PathBuf>,
}

const USAGE: &str = "usage: cargo bench --bench instructions -- [--servers redis7,redis8,valkey8,valkey9] [--calls N] [--out FILE]
  --servers LIST  servers to count on (default all four)
  --calls N       commands per step (default 20000)
  --out FILE      also write the tables as markdown to FILE";

fn fail(message: &str) -> ! {
    eprintln!("instructions: {message}\n{USAGE}");
    std::process::exit(2);
}

fn parse_options() -> Options {
    let mut options = Options {
        flavors: Flavor::ALL.to_vec(),
        calls: 20_000,
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
        let dir = common::repo_dir()
            .join("target")
            .join("instructions")
            .join(flavor.name());
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        let mut options = ServerOptions::new();
        options.launcher = vec![
            "valgrind".into(),
            "--tool=callgrind".into(),
            // Plain names and positions: the dump is read below, line by line.
            "--compress-strings=no".into(),
            "--compress-pos=no".into(),
            format!("--callgrind-out-file={}/callgrind.%p", dir.display()),
        ];
        let server = Server::start_with(flavor, options);
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

    /// Dumps the counters and reads them: instructions per top-level `call()`, checking
    /// that the server ran exactly `calls` commands since the last zero.
    fn per_call(&mut self, calls: usize) -> f64 {
        self.control("-d");
        self.dumps += 1;
        let path = self
            .dir
            .join(format!("callgrind.{}.{}", self.server.pid, self.dumps));
        let dump = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        let (cost, counted) = call_cost(&dump, &path);
        if counted != calls as u64 {
            panic!(
                "{}: {counted} commands ran where {calls} were sent",
                path.display()
            );
        }
        cost as f64 / calls as f64
    }
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

/// Sends step `step`'s `n` commands, checking every reply.
fn run_step(conn: &mut Conn, step: Step, n: usize, scripts: &Scripts) {
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
        Step::Fence => drive(
            conn,
            n,
            what,
            |i, b| encode(b, &[b"LEASE.FENCE", &counter(i), &decimal(i as u64 + 1)]),
            |_, r| r.int().is_some(),
        ),
    }
}

struct Counts {
    flavor: Flavor,
    version: String,
    per_call: Vec<(Step, f64)>,
}

impl Counts {
    fn sum(&self, steps: &[Step]) -> f64 {
        steps
            .iter()
            .map(|s| {
                self.per_call
                    .iter()
                    .find(|(step, _)| step == s)
                    .map_or(f64::NAN, |&(_, v)| v)
            })
            .sum()
    }

    fn ratio(&self, bound: &Bound) -> f64 {
        self.sum(bound.native) / self.sum(bound.lua)
    }
}

fn count(flavor: Flavor, n: usize) -> Counts {
    let mut counted = Counted::start(flavor);
    let mut conn = Conn::connect(counted.server.port)
        .unwrap_or_else(|e| panic!("cannot connect to {flavor}: {e}"));
    let version = server_version(&counted.server);
    let scripts = load_scripts(&mut conn);
    let mut per_call = Vec::new();
    for step in Step::ALL {
        conn.must(&["SELECT", step.db()]);
        counted.zero();
        run_step(&mut conn, step, n, &scripts);
        let ir = counted.per_call(n);
        eprintln!(
            "instructions: {flavor} {:<36} {ir:>8.0} per call",
            step.label()
        );
        per_call.push((step, ir));
    }
    Counts {
        flavor,
        version,
        per_call,
    }
}

fn report(all: &[Counts], n: usize) -> (String, bool) {
    let mut md = String::new();
    let mut ok = true;
    let _ = writeln!(
        md,
        "# Instructions per command: redis-lease vs `SET NX PX` + Lua\n\n\
         Written by `scripts/instructions`; do not edit by hand. Each server runs under \
         callgrind; each step is {n} commands in pipelines of {CHUNK}, on distinct keys \
         with 32-hex-character tokens (`INCR` and `LEASE.FENCE` on {COUNTER_KEYS} counters \
         and resources), every reply checked. A command's cost is the inclusive cost of \
         the server's `call()` (the command, what it replicates, the server's bookkeeping; \
         not parsing the request or writing to the socket), divided by the number of \
         commands, which is checked against the number of times `call()` was entered. \
         `scripts/test` fails when a ratio is over its bound (in parentheses); the bounds \
         are in `benches/instructions.rs`. Server time per call, which the targets of \
         issue 6 are about, is in [bench.md](bench.md).\n"
    );
    let _ = write!(md, "| Command |");
    for c in all {
        let _ = write!(md, " {} |", c.version);
    }
    let _ = write!(md, "\n|---|");
    for _ in all {
        let _ = write!(md, "---:|");
    }
    md.push('\n');
    for step in Step::ALL {
        let _ = write!(md, "| `{}` |", step.label());
        for c in all {
            let _ = write!(md, " {:.0} |", c.sum(&[step]));
        }
        md.push('\n');
    }
    let _ = write!(md, "\n| Ratio, redis-lease over the Lua way (bound) |");
    for c in all {
        let _ = write!(md, " {} |", c.version);
    }
    let _ = write!(md, "\n|---|");
    for _ in all {
        let _ = write!(md, "---:|");
    }
    md.push('\n');
    for bound in BOUNDS {
        let _ = write!(md, "| {} |", bound.what);
        for c in all {
            let (r, max) = (c.ratio(bound), bound.max(c.flavor));
            let within = r <= max;
            ok &= within;
            let over = if within { "" } else { " **over**" };
            let _ = write!(md, " {r:.3} (≤ {max:.2}){over} |");
            if !within {
                eprintln!(
                    "instructions: {}: {} is {r:.3}, over its bound {max:.2}",
                    c.flavor, bound.what
                );
            }
        }
        md.push('\n');
    }
    (md, ok)
}

fn main() {
    let options = parse_options();
    let all: Vec<Counts> = options
        .flavors
        .iter()
        .map(|&f| count(f, options.calls))
        .collect();
    let (md, ok) = report(&all, options.calls);
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
