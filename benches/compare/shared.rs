//! Shared holds (issue 16) against a semaphore built the usual way: a sorted set of
//! tokens scored by deadline, `EVALSHA` of `ZREMRANGEBYSCORE` expired + `ZCARD` + `ZADD`
//! to acquire, `EVALSHA` of `ZSCORE` + `ZADD XX` to renew, `ZREM` to release. Both ways
//! on the same server in the same run, as the rest of the compare bench.
//!
//! - `cpu`: server CPU per call of acquire, renew and release of one hold among 1, 100
//!   and 10,000 holds on its key (`workload::Layout` places the holds), the two ways in
//!   turn a pipeline at a time (redis-lease in database 0, sorted sets in database 1).
//! - `throughput`: acquire/renew/release cycles per second, all clients on one key that
//!   already holds 1, 100 or 10,000 other holds.
//! - `memory`: `used_memory` delta and `MEMORY USAGE` per hold, 100,000 holds on one key
//!   and 100,000 keys with one hold each (`lease.max-holders` raised for it), the latter
//!   also against a one-member sorted set with `PEXPIRE` per key; with `--memory`,
//!   1,000,000 exclusive leases against `SET NX PX` strings as well (10-byte names).

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Instant;

use crate::{
    connect, flushall, measure_pair, memory_run, progress, settled_used_memory, start, Group,
    MemoryResult, Op, Plan, Samples, Way, LONG_TTL, MEMORY_PREFIX,
};
use harness::resp::{decimal, encode, Conn, Reply};
use harness::workload::{
    acquire_shared, drive, is_one, key, load_sem_scripts, release, renew, sem_acquire, sem_release,
    sem_renew, supports_shared, token, Layout, SemScripts,
};
use harness::{Flavor, Server};

/// The limit both ways state, and `lease.max-holders` on the bench's servers: room for
/// the largest layout (100,000 holds on one key) and the throughput's background holds
/// plus every client's.
pub const LIMIT: usize = 100_000;

fn limit_arg() -> Vec<u8> {
    LIMIT.to_string().into_bytes()
}

/// The two ways to hold a permit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Native,
    Sem,
}

impl Kind {
    pub fn label(self) -> &'static str {
        match self {
            Kind::Native => "redis-lease SHARED",
            Kind::Sem => "sorted set + Lua",
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct CpuPoint {
    /// Holds on the key.
    pub holds: usize,
    pub acquire: Samples,
    pub renew: Samples,
    pub release: Samples,
    pub sem_acquire: Samples,
    pub sem_renew: Samples,
    pub sem_release: Samples,
}

impl CpuPoint {
    pub fn cycle(&self) -> (f64, f64) {
        (
            self.acquire.median() + self.renew.median() + self.release.median(),
            self.sem_acquire.median() + self.sem_renew.median() + self.sem_release.median(),
        )
    }
}

#[derive(Clone, Debug, Default)]
pub struct ThroughputPoint {
    /// Holds on the key besides the clients'.
    pub holds: usize,
    /// Acquire/renew/release cycles per second.
    pub native: Samples,
    pub sem: Samples,
}

/// Bytes per hold of one layout, both ways.
#[derive(Clone, Debug, Default)]
pub struct HoldMemory {
    pub keys: usize,
    pub holds_per_key: usize,
    /// `used_memory` delta over all holds, per hold.
    pub native_delta: Samples,
    pub sem_delta: Samples,
    /// `MEMORY USAGE key SAMPLES 0` of one key, per hold.
    pub native_usage: Samples,
    pub sem_usage: Samples,
    /// With one hold per key: a one-member sorted set with `PEXPIRE` per key, the
    /// `used_memory` delta per key (issue 27's measure for one shared hold).
    pub zset_delta: Samples,
}

#[derive(Clone, Debug, Default)]
pub struct SharedResult {
    /// False when the module has no `SHARED` (before issue 16): nothing shared was run.
    pub supported: bool,
    pub cpu: Vec<CpuPoint>,
    pub throughput: Vec<ThroughputPoint>,
    /// One key with many holds, then many keys with one hold each.
    pub memory: Vec<HoldMemory>,
    /// Exclusive leases vs `SET NX PX` strings (`--memory` only).
    pub exclusive: Option<MemoryResult>,
}

/// A server for the shared benches: `lease.max-holders` raised to `LIMIT` (set after
/// start, so the same code starts a module without the config; it is not needed then).
fn start_shared(flavor: Flavor) -> (Server, bool) {
    let server = start(flavor);
    let mut conn = connect(&server);
    let supported = supports_shared(&mut conn);
    if supported {
        conn.must(&["CONFIG", "SET", "lease.max-holders", &LIMIT.to_string()]);
    }
    (server, supported)
}

/// Sections f, g and h of the bench (and, with `exclusive`, section c at the memory size).
pub fn bench(flavor: Flavor, plan: &Plan, cpu: bool, exclusive: bool) -> SharedResult {
    let (server, supported) = start_shared(flavor);
    drop(server);
    let mut result = SharedResult {
        supported,
        ..Default::default()
    };
    if exclusive {
        result.exclusive = Some(exclusive_memory(flavor, plan));
    }
    if !supported {
        progress(&format!(
            "{flavor}: the module has no LEASE.ACQUIRE ... SHARED: shared holds not measured"
        ));
        return result;
    }
    if cpu {
        result.cpu = bench_cpu(flavor, plan);
        result.throughput = bench_throughput(flavor, plan);
    }
    result.memory = bench_memory(flavor, plan);
    result
}

// ---------------------------------------------------------------------------------------
// f. Server CPU per call among 1, 100, 10,000 holds

fn bench_cpu(flavor: Flavor, plan: &Plan) -> Vec<CpuPoint> {
    let (server, _) = start_shared(flavor);
    let mut native = connect(&server);
    let mut sem = connect(&server);
    sem.must(&["SELECT", "1"]);
    let scripts = load_sem_scripts(&mut sem);
    let mut points: Vec<CpuPoint> = plan
        .shared_sizes
        .iter()
        .map(|&holds| CpuPoint {
            holds,
            ..Default::default()
        })
        .collect();
    for run in 0..plan.runs {
        for point in points.iter_mut() {
            flushall(&mut native);
            let layout = Layout::new("cpu", point.holds, plan.shared_calls);
            cpu_point(&mut sem, &mut native, &scripts, &layout, point);
        }
        progress(&format!("shared cpu run {}/{} done", run + 1, plan.runs));
    }
    flushall(&mut native);
    points
}

/// Acquires of the holds `at(i)` gives, either way, every reply checked.
pub fn acquires<'a>(
    kind: Kind,
    layout: &'a Layout,
    scripts: &'a SemScripts,
    ttl: &'a [u8],
    at: impl Fn(usize) -> (usize, usize) + Copy + 'a,
) -> Group<'a> {
    let limit = limit_arg();
    match kind {
        Kind::Native => Group::new(
            Op::SharedAcquire,
            move |i, b| {
                let (k, h) = at(i);
                acquire_shared(b, &layout.key(k), &layout.token(k, h), ttl, &limit)
            },
            move |i, r| {
                let (k, h) = at(i);
                matches!(r, Reply::Array(Some(a))
                    if r.is_grant() && a[0].bulk() == Some(&layout.token(k, h)[..]))
            },
        ),
        Kind::Sem => Group::new(
            Op::SemAcquire,
            move |i, b| {
                let (k, h) = at(i);
                sem_acquire(
                    b,
                    &scripts.acquire,
                    &layout.key(k),
                    &layout.token(k, h),
                    ttl,
                    &limit,
                )
            },
            |_, r| is_one(r),
        ),
    }
}

/// Sends a group's `n` commands as they come (for filling keys).
fn send_all(conn: &mut Conn, mut g: Group, n: usize) {
    let what = g.op.label();
    let (make, check) = (&mut g.make, &g.check);
    drive(conn, n, what, make, check);
}

fn cpu_point(
    sem: &mut Conn,
    native: &mut Conn,
    scripts: &SemScripts,
    layout: &Layout,
    point: &mut CpuPoint,
) {
    let n = layout.calls();
    let fill = layout.keys * layout.filler();
    let filled = |i| layout.filled(i);
    send_all(
        native,
        acquires(Kind::Native, layout, scripts, LONG_TTL, filled),
        fill,
    );
    send_all(
        sem,
        acquires(Kind::Sem, layout, scripts, LONG_TTL, filled),
        fill,
    );

    let acquired = |i| layout.acquired(i);
    let (s, l) = measure_pair(
        sem,
        acquires(Kind::Sem, layout, scripts, LONG_TTL, acquired),
        native,
        acquires(Kind::Native, layout, scripts, LONG_TTL, acquired),
        n,
    );
    point.sem_acquire.push(s);
    point.acquire.push(l);

    let renewed = |i| {
        let (k, h) = layout.renewed(i);
        (layout.key(k), layout.token(k, h))
    };
    let (s, l) = measure_pair(
        sem,
        Group::new(
            Op::SemRenew,
            |i, b| {
                let (k, t) = renewed(i);
                sem_renew(b, &scripts.renew, &k, &t, LONG_TTL)
            },
            |_, r| is_one(r),
        ),
        native,
        Group::new(
            Op::SharedRenew,
            |i, b| {
                let (k, t) = renewed(i);
                renew(b, &k, &t, LONG_TTL)
            },
            |_, r| is_one(r),
        ),
        n,
    );
    point.sem_renew.push(s);
    point.renew.push(l);

    let released = |i| {
        let (k, h) = layout.released(i);
        (layout.key(k), layout.token(k, h))
    };
    let (s, l) = measure_pair(
        sem,
        Group::new(
            Op::SemRelease,
            |i, b| {
                let (k, t) = released(i);
                sem_release(b, &k, &t)
            },
            |_, r| is_one(r),
        ),
        native,
        Group::new(
            Op::SharedRelease,
            |i, b| {
                let (k, t) = released(i);
                release(b, &k, &t)
            },
            |_, r| is_one(r),
        ),
        n,
    );
    point.sem_release.push(s);
    point.release.push(l);
}

// ---------------------------------------------------------------------------------------
// g. Pipelined throughput on one key

fn bench_throughput(flavor: Flavor, plan: &Plan) -> Vec<ThroughputPoint> {
    let (server, _) = start_shared(flavor);
    let mut conn = connect(&server);
    let scripts = load_sem_scripts(&mut conn);
    let mut points: Vec<ThroughputPoint> = plan
        .shared_sizes
        .iter()
        .map(|&holds| ThroughputPoint {
            holds,
            ..Default::default()
        })
        .collect();
    for run in 0..plan.runs {
        for point in points.iter_mut() {
            let (mut native, mut sem) = (0.0, 0.0);
            for slice in 0..plan.throughput_slices {
                let kinds = if (run + slice) % 2 == 0 {
                    [Kind::Sem, Kind::Native]
                } else {
                    [Kind::Native, Kind::Sem]
                };
                for kind in kinds {
                    flushall(&mut conn);
                    // The background holds, one key of its own.
                    let layout = Layout::new("tp", point.holds + 1, 1);
                    let background = |i| (0, i);
                    send_all(
                        &mut conn,
                        acquires(kind, &layout, &scripts, LONG_TTL, background),
                        point.holds,
                    );
                    let rate = throughput_run(&server, kind, &scripts, &layout.key(0), plan);
                    match kind {
                        Kind::Native => native += rate,
                        Kind::Sem => sem += rate,
                    }
                }
            }
            point.native.push(native / plan.throughput_slices as f64);
            point.sem.push(sem / plan.throughput_slices as f64);
        }
        progress(&format!(
            "shared throughput run {}/{} done",
            run + 1,
            plan.runs
        ));
    }
    flushall(&mut conn);
    points
}

/// Acquire/renew/release cycles per second over all clients, all on key `k`.
fn throughput_run(server: &Server, kind: Kind, scripts: &SemScripts, k: &[u8], plan: &Plan) -> f64 {
    let cycles_per_trip = (plan.depth / 3).max(1);
    let barrier = Arc::new(Barrier::new(plan.threads));
    let handles: Vec<_> = (0..plan.threads)
        .map(|t| {
            let barrier = Arc::clone(&barrier);
            let (acquire_sha, renew_sha) = (scripts.acquire.clone(), scripts.renew.clone());
            let port = server.port;
            let duration = plan.throughput_time;
            let k = k.to_vec();
            thread::spawn(move || {
                let mut conn = Conn::connect(port)
                    .unwrap_or_else(|e| panic!("client {t} cannot connect: {e}"));
                let limit = limit_arg();
                // One round trip: acquire, renew and release one hold at a time.
                let mut trip = Vec::new();
                for c in 0..cycles_per_trip {
                    let tok = token(2_000_000_000 + t * 1000 + c);
                    match kind {
                        Kind::Native => {
                            acquire_shared(&mut trip, &k, &tok, LONG_TTL, &limit);
                            renew(&mut trip, &k, &tok, LONG_TTL);
                            release(&mut trip, &k, &tok);
                        }
                        Kind::Sem => {
                            sem_acquire(&mut trip, &acquire_sha, &k, &tok, LONG_TTL, &limit);
                            sem_renew(&mut trip, &renew_sha, &k, &tok, LONG_TTL);
                            sem_release(&mut trip, &k, &tok);
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
                    for n in 0..3 * cycles_per_trip {
                        let r = conn.read().unwrap_or_else(|e| panic!("client {t}: {e}"));
                        let good = if n % 3 == 0 && kind == Kind::Native {
                            r.is_grant()
                        } else {
                            is_one(&r)
                        };
                        if !good {
                            panic!("client {t} ({}): unexpected reply {r:?}", kind.label());
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
// h. Memory per hold

fn bench_memory(flavor: Flavor, plan: &Plan) -> Vec<HoldMemory> {
    let (server, _) = start_shared(flavor);
    let mut conn = connect(&server);
    let scripts = load_sem_scripts(&mut conn);
    let n = plan.hold_memory;
    // (keys, holds per key): all on one key, then one on each key.
    let mut layouts = [(1, n), (n, 1)].map(|(keys, holds_per_key)| HoldMemory {
        keys,
        holds_per_key,
        ..Default::default()
    });
    for run in 0..plan.runs {
        for m in layouts.iter_mut() {
            let kinds = if run % 2 == 0 {
                [Kind::Sem, Kind::Native]
            } else {
                [Kind::Native, Kind::Sem]
            };
            if m.holds_per_key == 1 {
                m.zset_delta.push(zset_memory_run(&mut conn, m.keys));
            }
            for kind in kinds {
                let (delta, usage) =
                    hold_memory_run(&mut conn, kind, &scripts, m.keys, m.holds_per_key);
                match kind {
                    Kind::Native => {
                        m.native_delta.push(delta);
                        m.native_usage.push(usage);
                    }
                    Kind::Sem => {
                        m.sem_delta.push(delta);
                        m.sem_usage.push(usage);
                    }
                }
            }
        }
        progress(&format!("shared memory run {}/{} done", run + 1, plan.runs));
    }
    flushall(&mut conn);
    layouts.to_vec()
}

/// (`used_memory` delta per hold, `MEMORY USAGE` of the first key per hold on it).
fn hold_memory_run(
    conn: &mut Conn,
    kind: Kind,
    scripts: &SemScripts,
    keys: usize,
    per_key: usize,
) -> (f64, f64) {
    flushall(conn);
    let before = settled_used_memory(conn);
    // Holds go round the keys, as in every shared layout: key i % keys, hold i / keys.
    let k = |i: usize| key(MEMORY_PREFIX, i % keys);
    let t = |i: usize| token(i);
    let limit = limit_arg();
    let n = keys * per_key;
    match kind {
        Kind::Native => drive(
            conn,
            n,
            "fill shared holds",
            |i, b| acquire_shared(b, &k(i), &t(i), LONG_TTL, &limit),
            |_, r| r.is_grant(),
        ),
        Kind::Sem => drive(
            conn,
            n,
            "fill semaphores",
            |i, b| sem_acquire(b, &scripts.acquire, &k(i), &t(i), LONG_TTL, &limit),
            |_, r| is_one(r),
        ),
    }
    let after = settled_used_memory(conn);
    let usage = conn
        .call(&[b"MEMORY", b"USAGE", &k(0), b"SAMPLES", b"0"])
        .ok()
        .and_then(|r| r.int())
        .unwrap_or_else(|| panic!("MEMORY USAGE failed for {}", kind.label()));
    flushall(conn);
    (
        (after as f64 - before as f64) / n as f64,
        usage as f64 / per_key as f64,
    )
}

/// `used_memory` delta per key of `keys` one-member sorted sets, each member a token
/// scored by its deadline, each key with `PEXPIRE` (what a shared hold per key is
/// compared with: a semaphore of one that the server expires whole).
fn zset_memory_run(conn: &mut Conn, keys: usize) -> f64 {
    flushall(conn);
    let before = settled_used_memory(conn);
    let deadline = decimal(harness::now_ms() + 3_600_000);
    drive(
        conn,
        2 * keys,
        "fill one-member sorted sets",
        |j, b| {
            let i = j / 2;
            if j % 2 == 0 {
                encode(b, &[b"ZADD", &key(MEMORY_PREFIX, i), &deadline, &token(i)]);
            } else {
                encode(b, &[b"PEXPIRE", &key(MEMORY_PREFIX, i), LONG_TTL]);
            }
        },
        |_, r| is_one(r),
    );
    let after = settled_used_memory(conn);
    flushall(conn);
    (after as f64 - before as f64) / keys as f64
}

/// Section c at the memory mode's size: exclusive leases vs `SET NX PX` strings.
fn exclusive_memory(flavor: Flavor, plan: &Plan) -> MemoryResult {
    let server = start(flavor);
    let mut conn = connect(&server);
    let n = plan.memory_keys;
    let mut result = MemoryResult {
        keys: n,
        ..Default::default()
    };
    for run in 0..plan.runs {
        let ways = if run % 2 == 0 {
            [Way::Lua, Way::Native]
        } else {
            [Way::Native, Way::Lua]
        };
        for way in ways {
            let (usage, delta) = memory_run(&mut conn, way, n);
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
        progress(&format!(
            "exclusive memory run {}/{} done",
            run + 1,
            plan.runs
        ));
    }
    flushall(&mut conn);
    result
}
