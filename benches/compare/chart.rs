//! `bench.svg`: the comparisons of one server as a hand-written SVG (no plotting crate):
//! server CPU per call, the cost-vs-live-keys curve, throughput, memory, probe latency
//! during mass expiry, and the targets' verdicts. `shared.svg`: shared holds against the
//! sorted-set semaphore (cost among 1 to 10,000 holds, throughput, memory per hold).
//! `sessions.svg`: N leases kept alive by one session against a RENEW per lease, and a
//! session's end against as many leases expiring together.

use std::fmt::Write as _;

use crate::report::{self, count, Machine};
use crate::sessions::SessionResult;
use crate::shared::SharedResult;
use crate::{Op, Plan, ServerResult};

const WIDTH: f64 = 1000.0;
const HEIGHT: f64 = 1000.0;
const LUA: &str = "#d9822b";
const NATIVE: &str = "#2f6db5";
/// A baseline (nothing sent), third to the two ways.
const BASE: &str = "#8a9099";
const COLORS: [&str; 3] = [LUA, NATIVE, BASE];
const FONT: &str = "font-family=\"Helvetica, Arial, sans-serif\"";

struct Bar {
    series: usize,
    value: f64,
    text: String,
}

struct Group {
    label: String,
    bars: Vec<Bar>,
}

fn group(label: &str, lua: f64, native: f64, fmt: impl Fn(f64) -> String) -> Group {
    Group {
        label: label.to_string(),
        bars: vec![
            Bar {
                series: 0,
                value: lua,
                text: fmt(lua),
            },
            Bar {
                series: 1,
                value: native,
                text: fmt(native),
            },
        ],
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn text(s: &mut String, x: f64, y: f64, size: f64, anchor: &str, extra: &str, body: &str) {
    let _ = writeln!(
        s,
        "<text x=\"{x:.1}\" y=\"{y:.1}\" font-size=\"{size}\" text-anchor=\"{anchor}\" {extra}>{}</text>",
        esc(body)
    );
}

fn panel(s: &mut String, x: f64, y: f64, w: f64, h: f64, title: &str) {
    let _ = writeln!(
        s,
        "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{w:.1}\" height=\"{h:.1}\" fill=\"#fff\" stroke=\"#d0d4da\" rx=\"6\"/>"
    );
    text(
        s,
        x + 12.0,
        y + 22.0,
        14.0,
        "start",
        "font-weight=\"bold\" fill=\"#222\"",
        title,
    );
}

/// Horizontal grouped bars, one colour per series; `target` draws a dashed line.
#[allow(clippy::too_many_arguments)]
fn hbars(
    s: &mut String,
    x: f64,
    y: f64,
    w: f64,
    h: f64,
    title: &str,
    groups: &[Group],
    label_w: f64,
    target: Option<(f64, &str)>,
) {
    panel(s, x, y, w, h, title);
    let top = y + 36.0;
    let bottom = y + h - 12.0;
    let left = x + label_w;
    let room = w - label_w - 80.0;
    let max = groups
        .iter()
        .flat_map(|g| g.bars.iter().map(|b| b.value))
        .chain(target.map(|t| t.0))
        .filter(|v| v.is_finite())
        .fold(0.0_f64, f64::max)
        .max(1e-9);
    let scale = room / max;
    let group_h = (bottom - top) / groups.len().max(1) as f64;
    for (gi, g) in groups.iter().enumerate() {
        let gy = top + gi as f64 * group_h;
        let k = g.bars.len().max(1) as f64;
        let bar_h = ((group_h - 10.0) / k).min(20.0);
        let first = gy + (group_h - k * bar_h) / 2.0;
        text(
            s,
            left - 8.0,
            gy + group_h / 2.0 + 4.0,
            12.0,
            "end",
            "fill=\"#333\"",
            &g.label,
        );
        for (bi, b) in g.bars.iter().enumerate() {
            let by = first + bi as f64 * bar_h;
            let len = if b.value.is_finite() {
                (b.value * scale).max(1.0)
            } else {
                0.0
            };
            let _ = writeln!(
                s,
                "<rect x=\"{left:.1}\" y=\"{by:.1}\" width=\"{len:.1}\" height=\"{:.1}\" fill=\"{}\"/>",
                bar_h - 3.0,
                COLORS[b.series % COLORS.len()]
            );
            text(
                s,
                left + len + 4.0,
                by + bar_h / 2.0 + 2.5,
                11.0,
                "start",
                "fill=\"#333\"",
                &b.text,
            );
        }
    }
    let _ = writeln!(
        s,
        "<line x1=\"{left:.1}\" y1=\"{top:.1}\" x2=\"{left:.1}\" y2=\"{bottom:.1}\" stroke=\"#888\"/>"
    );
    if let Some((value, label)) = target {
        let tx = left + value * scale;
        let _ = writeln!(
            s,
            "<line x1=\"{tx:.1}\" y1=\"{top:.1}\" x2=\"{tx:.1}\" y2=\"{bottom:.1}\" stroke=\"#c0392b\" stroke-dasharray=\"4 3\"/>"
        );
        text(
            s,
            tx + 3.0,
            top - 2.0,
            10.0,
            "start",
            "fill=\"#c0392b\"",
            label,
        );
    }
}

struct Series {
    name: String,
    color: &'static str,
    dashed: bool,
    values: Vec<f64>,
}

/// A value axis step of 1, 2, 2.5 or 5 times a power of ten.
fn nice_step(range: f64, ticks: f64) -> f64 {
    let raw = (range / ticks).max(1e-9);
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|&v| v >= raw)
        .unwrap_or(10.0 * mag)
}

fn short(n: usize) -> String {
    match n {
        n if n >= 1_000_000 && n % 1_000_000 == 0 => format!("{}M", n / 1_000_000),
        n if n >= 1_000 && n % 1_000 == 0 => format!("{}k", n / 1_000),
        n => n.to_string(),
    }
}

/// Lines over a logarithmic x axis.
#[allow(clippy::too_many_arguments)]
fn lines(
    s: &mut String,
    x: f64,
    y: f64,
    w: f64,
    h: f64,
    title: &str,
    xs: &[usize],
    series: &[Series],
    x_label: &str,
    y_label: &str,
) {
    panel(s, x, y, w, h, title);
    let left = x + 52.0;
    let right = x + w - 20.0;
    let top = y + 84.0;
    let bottom = y + h - 44.0;
    let ymax_raw = series
        .iter()
        .flat_map(|s| s.values.iter().copied())
        .filter(|v| v.is_finite())
        .fold(0.0_f64, f64::max)
        .max(1e-9);
    let step = nice_step(ymax_raw * 1.1, 5.0);
    let ymax = (ymax_raw * 1.1 / step).ceil() * step;
    let lx = |v: usize| -> f64 {
        let lo = (*xs.first().unwrap_or(&1)).max(1) as f64;
        let hi = (*xs.last().unwrap_or(&1)).max(1) as f64;
        if hi <= lo {
            return (left + right) / 2.0;
        }
        left + ((v.max(1) as f64).log10() - lo.log10()) / (hi.log10() - lo.log10()) * (right - left)
    };
    let ly = |v: f64| bottom - v / ymax * (bottom - top);
    let mut t = 0.0;
    while t <= ymax + step / 2.0 {
        let yy = ly(t);
        let _ = writeln!(
            s,
            "<line x1=\"{left:.1}\" y1=\"{yy:.1}\" x2=\"{right:.1}\" y2=\"{yy:.1}\" stroke=\"#e6e8eb\"/>"
        );
        text(
            s,
            left - 6.0,
            yy + 4.0,
            11.0,
            "end",
            "fill=\"#555\"",
            &format!("{t:.1}"),
        );
        t += step;
    }
    for &v in xs {
        let xx = lx(v);
        let _ = writeln!(
            s,
            "<line x1=\"{xx:.1}\" y1=\"{bottom:.1}\" x2=\"{xx:.1}\" y2=\"{:.1}\" stroke=\"#888\"/>",
            bottom + 4.0
        );
        text(
            s,
            xx,
            bottom + 17.0,
            11.0,
            "middle",
            "fill=\"#555\"",
            &short(v),
        );
    }
    text(
        s,
        (left + right) / 2.0,
        bottom + 34.0,
        11.0,
        "middle",
        "fill=\"#555\"",
        x_label,
    );
    let _ = writeln!(
        s,
        "<line x1=\"{left:.1}\" y1=\"{bottom:.1}\" x2=\"{right:.1}\" y2=\"{bottom:.1}\" stroke=\"#888\"/>"
    );
    text(
        s,
        x + 12.0,
        top - 8.0,
        11.0,
        "start",
        "fill=\"#555\"",
        y_label,
    );
    for (i, se) in series.iter().enumerate() {
        let dash = if se.dashed {
            " stroke-dasharray=\"6 4\""
        } else {
            ""
        };
        let points: Vec<String> = xs
            .iter()
            .zip(&se.values)
            .filter(|(_, v)| v.is_finite())
            .map(|(&xv, &yv)| format!("{:.1},{:.1}", lx(xv), ly(yv)))
            .collect();
        let _ = writeln!(
            s,
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"{dash}/>",
            points.join(" "),
            se.color
        );
        for p in &points {
            let (px, py) = p.split_once(',').unwrap_or(("0", "0"));
            let _ = writeln!(
                s,
                "<circle cx=\"{px}\" cy=\"{py}\" r=\"3\" fill=\"{}\"/>",
                se.color
            );
        }
        // Legend: two columns under the title.
        let lx0 = x + 14.0 + (i % 2) as f64 * (w / 2.0);
        let ly0 = y + 42.0 + (i / 2) as f64 * 16.0;
        let _ = writeln!(
            s,
            "<line x1=\"{lx0:.1}\" y1=\"{ly0:.1}\" x2=\"{:.1}\" y2=\"{ly0:.1}\" stroke=\"{}\" stroke-width=\"2\"{dash}/>",
            lx0 + 22.0,
            se.color
        );
        text(
            s,
            lx0 + 28.0,
            ly0 + 4.0,
            11.0,
            "start",
            "fill=\"#333\"",
            &se.name,
        );
    }
}

pub fn svg(r: &ServerResult, plan: &Plan, machine: &Machine) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" {FONT}>"
    );
    let _ = writeln!(s, "<rect width=\"100%\" height=\"100%\" fill=\"#f6f7f9\"/>");
    text(
        &mut s,
        20.0,
        30.0,
        19.0,
        "start",
        "font-weight=\"bold\" fill=\"#111\"",
        "redis-lease vs SET NX PX + Lua, same server, same run",
    );
    text(
        &mut s,
        20.0,
        50.0,
        12.0,
        "start",
        "fill=\"#555\"",
        &format!(
            "{} · {} × {} · median of {} run(s){} · {}",
            r.version,
            machine.cores,
            machine.cpu_model,
            plan.runs,
            if plan.quick { " (quick smoke)" } else { "" },
            machine.date
        ),
    );
    // Legend for the bar charts.
    for (i, (color, name)) in [
        (
            LUA,
            "SET NX PX + Lua (INCR for fence; Redis expiry for PX keys)",
        ),
        (NATIVE, "redis-lease"),
    ]
    .iter()
    .enumerate()
    {
        let lx = 20.0 + i as f64 * 420.0;
        let _ = writeln!(
            s,
            "<rect x=\"{lx}\" y=\"62\" width=\"14\" height=\"12\" fill=\"{color}\"/>"
        );
        text(
            &mut s,
            lx + 20.0,
            73.0,
            12.0,
            "start",
            "fill=\"#333\"",
            name,
        );
    }

    let c = &r.cpu;
    let us = |v: f64| format!("{v:.2} µs");
    let (nc, lc) = report::cycle_medians(r);
    let cpu_groups = vec![
        group(
            "acquire",
            c.get(Op::SetNxPx).median(),
            c.get(Op::Acquire).median(),
            us,
        ),
        group(
            "renew",
            c.get(Op::EvalRenew).median(),
            c.get(Op::Renew).median(),
            us,
        ),
        group(
            "release",
            c.get(Op::EvalRelease).median(),
            c.get(Op::Release).median(),
            us,
        ),
        group("full cycle", lc, nc, us),
        group(
            "fence vs INCR",
            c.get(Op::Incr).median(),
            c.get(Op::Fence).median(),
            us,
        ),
    ];
    hbars(
        &mut s,
        20.0,
        90.0,
        470.0,
        360.0,
        "Server CPU per call (INFO commandstats)",
        &cpu_groups,
        100.0,
        None,
    );

    let pts = &r.curve.points;
    let xs: Vec<usize> = pts.iter().map(|p| p.live).collect();
    let col = |f: fn(&crate::CurvePoint) -> f64| pts.iter().map(f).collect::<Vec<_>>();
    let series = vec![
        Series {
            name: "LEASE.ACQUIRE".into(),
            color: NATIVE,
            dashed: false,
            values: col(|p| p.acquire.median()),
        },
        Series {
            name: "SET NX PX".into(),
            color: LUA,
            dashed: false,
            values: col(|p| p.set_nx_px.median()),
        },
        Series {
            name: "LEASE.RENEW".into(),
            color: NATIVE,
            dashed: true,
            values: col(|p| p.renew.median()),
        },
        Series {
            name: "EVALSHA compare-and-pexpire".into(),
            color: LUA,
            dashed: true,
            values: col(|p| p.eval_renew.median()),
        },
    ];
    lines(
        &mut s,
        510.0,
        90.0,
        470.0,
        360.0,
        "Server CPU per call vs live keys",
        &xs,
        &series,
        "live leases / SET NX PX keys (log scale)",
        "µs per call",
    );

    let t = &r.throughput;
    let per_s = |v: f64| format!("{}/s", count(v));
    hbars(
        &mut s,
        20.0,
        470.0,
        470.0,
        150.0,
        &format!(
            "Acquire/release cycles/s ({} clients, pipeline {})",
            plan.threads, plan.depth
        ),
        &[group("cycles/s", t.lua.median(), t.native.median(), per_s)],
        100.0,
        None,
    );

    let m = &r.memory;
    let bytes = |v: f64| format!("{v:.0} B");
    hbars(
        &mut s,
        510.0,
        470.0,
        470.0,
        150.0,
        &format!("Memory per live key ({} keys)", count(m.keys as f64)),
        &[
            group(
                "MEMORY USAGE",
                m.lua_usage.median(),
                m.native_usage.median(),
                bytes,
            ),
            group(
                "used_memory Δ",
                m.lua_delta.median(),
                m.native_delta.median(),
                bytes,
            ),
        ],
        110.0,
        None,
    );

    let e = &r.expiry;
    let ms = |v: f64| format!("{v:.2} ms");
    hbars(
        &mut s,
        20.0,
        640.0,
        470.0,
        340.0,
        &format!(
            "PING round trip while {} keys expire together",
            count(e.keys as f64)
        ),
        &[
            group(
                "worst, deleting",
                report::worst(&e.lua.max_us) / 1e3,
                report::worst(&e.native.max_us) / 1e3,
                ms,
            ),
            group(
                "p99, deleting",
                e.lua.p99_us.median() / 1e3,
                e.native.p99_us.median() / 1e3,
                ms,
            ),
            group(
                "max, before",
                e.lua.idle_max_us.median() / 1e3,
                e.native.idle_max_us.median() / 1e3,
                ms,
            ),
        ],
        110.0,
        Some((2.0, "target 2 ms")),
    );

    panel(&mut s, 510.0, 640.0, 470.0, 340.0, "Targets of issue 6");
    for (i, target) in report::targets(r).iter().enumerate() {
        let yy = 686.0 + i as f64 * 29.0;
        let (mark, color) = if target.pass {
            ("PASS", "#1e8449")
        } else {
            ("FAIL", "#c0392b")
        };
        text(
            &mut s,
            522.0,
            yy,
            11.0,
            "start",
            &format!("font-weight=\"bold\" fill=\"{color}\""),
            mark,
        );
        text(
            &mut s,
            560.0,
            yy,
            11.0,
            "start",
            "fill=\"#222\"",
            target.short,
        );
        text(
            &mut s,
            560.0,
            yy + 12.0,
            10.0,
            "start",
            "fill=\"#666\"",
            &format!("{}  (goal {})", target.measured, target.goal),
        );
    }
    let _ = writeln!(s, "</svg>");
    s
}

/// `shared.svg`: one server's shared-hold comparisons (the README's chart of issue 16).
pub fn shared_svg(version: &str, r: &SharedResult, plan: &Plan, machine: &Machine) -> String {
    const H: f64 = 740.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{H}\" viewBox=\"0 0 {WIDTH} {H}\" {FONT}>"
    );
    let _ = writeln!(s, "<rect width=\"100%\" height=\"100%\" fill=\"#f6f7f9\"/>");
    text(
        &mut s,
        20.0,
        30.0,
        19.0,
        "start",
        "font-weight=\"bold\" fill=\"#111\"",
        "Shared holds: redis-lease SHARED vs a sorted-set semaphore, same server, same run",
    );
    text(
        &mut s,
        20.0,
        50.0,
        12.0,
        "start",
        "fill=\"#555\"",
        &format!(
            "{} · {} × {} · median of {} run(s){} · {}",
            version,
            machine.cores,
            machine.cpu_model,
            plan.runs,
            if plan.quick { " (quick smoke)" } else { "" },
            machine.date
        ),
    );
    for (i, (color, name)) in [
        (
            LUA,
            "sorted set + Lua: EVALSHA ZREMRANGEBYSCORE+ZCARD+ZADD, EVALSHA ZSCORE+ZADD XX, ZREM",
        ),
        (NATIVE, "redis-lease: ACQUIRE … SHARED, RENEW, RELEASE"),
    ]
    .iter()
    .enumerate()
    {
        let lx = 20.0 + i as f64 * 660.0;
        let _ = writeln!(
            s,
            "<rect x=\"{lx}\" y=\"62\" width=\"14\" height=\"12\" fill=\"{color}\"/>"
        );
        text(
            &mut s,
            lx + 20.0,
            73.0,
            11.0,
            "start",
            "fill=\"#333\"",
            name,
        );
    }

    let holds = |n: usize| format!("{} hold{}", count(n as f64), if n == 1 { "" } else { "s" });
    let xs: Vec<usize> = r.cpu.iter().map(|p| p.holds).collect();
    let col = |f: fn(&crate::shared::CpuPoint) -> f64| r.cpu.iter().map(f).collect::<Vec<_>>();
    let series = vec![
        Series {
            name: "LEASE.RENEW".into(),
            color: NATIVE,
            dashed: false,
            values: col(|p| p.renew.median()),
        },
        Series {
            name: "EVALSHA ZSCORE + ZADD XX".into(),
            color: LUA,
            dashed: false,
            values: col(|p| p.sem_renew.median()),
        },
        Series {
            name: "LEASE.RELEASE".into(),
            color: NATIVE,
            dashed: true,
            values: col(|p| p.release.median()),
        },
        Series {
            name: "ZREM".into(),
            color: LUA,
            dashed: true,
            values: col(|p| p.sem_release.median()),
        },
    ];
    lines(
        &mut s,
        20.0,
        90.0,
        470.0,
        310.0,
        "Renew and release of one hold: server CPU per call",
        &xs,
        &series,
        "holds on the key (log scale)",
        "µs per call",
    );

    let us = |v: f64| format!("{v:.2} µs");
    let cycles: Vec<Group> = r
        .cpu
        .iter()
        .map(|p| {
            let (native, sem) = p.cycle();
            group(&holds(p.holds), sem, native, us)
        })
        .collect();
    hbars(
        &mut s,
        510.0,
        90.0,
        470.0,
        310.0,
        "Acquire + renew + release: server CPU per cycle",
        &cycles,
        100.0,
        None,
    );

    let per_s = |v: f64| format!("{}/s", count(v));
    let tp: Vec<Group> = r
        .throughput
        .iter()
        .map(|p| {
            group(
                &format!(
                    "{} other{}",
                    count(p.holds as f64),
                    if p.holds == 1 { "" } else { "s" }
                ),
                p.sem.median(),
                p.native.median(),
                per_s,
            )
        })
        .collect();
    hbars(
        &mut s,
        20.0,
        420.0,
        470.0,
        300.0,
        &format!(
            "Cycles/s on one key ({} clients, {} cycles per trip)",
            plan.threads,
            (plan.depth / 3).max(1)
        ),
        &tp,
        100.0,
        None,
    );

    let bytes = |v: f64| format!("{v:.1} B");
    let mut mem = Vec::new();
    for m in &r.memory {
        let layout = if m.keys == 1 {
            format!("1 key × {}", short(m.holds_per_key))
        } else {
            format!("{} keys × 1", short(m.keys))
        };
        mem.push(group(
            &format!("{layout}: used_memory Δ"),
            m.sem_delta.median(),
            m.native_delta.median(),
            bytes,
        ));
        mem.push(group(
            &format!("{layout}: USAGE"),
            m.sem_usage.median(),
            m.native_usage.median(),
            bytes,
        ));
    }
    hbars(
        &mut s,
        510.0,
        420.0,
        470.0,
        300.0,
        "Memory per hold, bytes",
        &mem,
        175.0,
        None,
    );
    let _ = writeln!(s, "</svg>");
    s
}

/// `sessions.svg`: one server's session comparisons (the README's chart of issue 17).
pub fn sessions_svg(version: &str, r: &SessionResult, plan: &Plan, machine: &Machine) -> String {
    const H: f64 = 770.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{H}\" viewBox=\"0 0 {WIDTH} {H}\" {FONT}>"
    );
    let _ = writeln!(s, "<rect width=\"100%\" height=\"100%\" fill=\"#f6f7f9\"/>");
    text(
        &mut s,
        20.0,
        30.0,
        19.0,
        "start",
        "font-weight=\"bold\" fill=\"#111\"",
        "Sessions: one keepalive for N leases, and the end of one",
    );
    text(
        &mut s,
        20.0,
        50.0,
        12.0,
        "start",
        "fill=\"#555\"",
        &format!(
            "{} · {} × {} · median of {} run(s){} · {} · keep-alive: {}",
            version,
            machine.cores,
            machine.cpu_model,
            plan.runs,
            if plan.quick { " (quick smoke)" } else { "" },
            machine.date,
            report::keepalive_timing(plan)
        ),
    );
    for (i, (color, name)) in [
        (LUA, "a RENEW per lease (ordinary leases)"),
        (NATIVE, "one session (holds bound with ttl 0)"),
        (BASE, "nothing sent (baseline)"),
    ]
    .iter()
    .enumerate()
    {
        let lx = 20.0 + i as f64 * 330.0;
        let _ = writeln!(
            s,
            "<rect x=\"{lx}\" y=\"62\" width=\"14\" height=\"12\" fill=\"{color}\"/>"
        );
        text(
            &mut s,
            lx + 20.0,
            73.0,
            11.0,
            "start",
            "fill=\"#333\"",
            name,
        );
    }

    let xs: Vec<usize> = r.keepalive.iter().map(|p| p.leases).collect();
    let col =
        |f: fn(&crate::sessions::KeepPoint) -> f64| r.keepalive.iter().map(f).collect::<Vec<_>>();
    let idle = r.idle.cpu_ms.median();
    let cpu = vec![
        Series {
            name: "a RENEW per lease".into(),
            color: LUA,
            dashed: false,
            values: col(|p| p.each.cpu_ms.median()),
        },
        Series {
            name: "one session".into(),
            color: NATIVE,
            dashed: false,
            values: col(|p| p.session.cpu_ms.median()),
        },
        Series {
            name: "nothing sent".into(),
            color: BASE,
            dashed: true,
            values: xs.iter().map(|_| idle).collect(),
        },
    ];
    lines(
        &mut s,
        20.0,
        90.0,
        470.0,
        310.0,
        "Server process CPU while keeping N leases alive",
        &xs,
        &cpu,
        "leases kept alive (log scale)",
        "ms (used_cpu_sys + used_cpu_user)",
    );

    let commands: Vec<Group> = r
        .keepalive
        .iter()
        .map(|p| {
            group(
                &format!(
                    "{} lease{}",
                    count(p.leases as f64),
                    if p.leases == 1 { "" } else { "s" }
                ),
                p.each.commands.median(),
                p.session.commands.median(),
                count,
            )
        })
        .collect();
    hbars(
        &mut s,
        510.0,
        90.0,
        470.0,
        310.0,
        "Commands sent to keep N leases alive",
        &commands,
        100.0,
        None,
    );

    let e = &r.end;
    let ms = |v: f64| format!("{v:.2} ms");
    let pair = |label: &str, f: fn(&crate::ExpiryWay) -> f64, fmt: &dyn Fn(f64) -> String| {
        let leases = e.leases.as_ref().map_or(f64::NAN, f);
        let session = f(&e.session);
        Group {
            label: label.to_string(),
            bars: vec![
                Bar {
                    series: 0,
                    value: leases,
                    text: if leases.is_finite() {
                        fmt(leases)
                    } else {
                        String::new()
                    },
                },
                Bar {
                    series: 1,
                    value: session,
                    text: fmt(session),
                },
            ],
        }
    };
    let holds = count(e.holds as f64);
    for (i, (color, name)) in [
        (LUA, format!("{holds} leases expiring together")),
        (
            NATIVE,
            format!("a session with {holds} bound holds released"),
        ),
    ]
    .iter()
    .enumerate()
    {
        let lx = 20.0 + i as f64 * 330.0;
        let _ = writeln!(
            s,
            "<rect x=\"{lx}\" y=\"420\" width=\"14\" height=\"12\" fill=\"{color}\"/>"
        );
        text(
            &mut s,
            lx + 20.0,
            431.0,
            11.0,
            "start",
            "fill=\"#333\"",
            name,
        );
    }
    hbars(
        &mut s,
        20.0,
        450.0,
        470.0,
        300.0,
        "PING round trip while the keys are deleted",
        &[
            pair("worst, deleting", |w| report::worst(&w.max_us) / 1e3, &ms),
            pair("p99, deleting", |w| w.p99_us.median() / 1e3, &ms),
            pair("max, before", |w| w.idle_max_us.median() / 1e3, &ms),
        ],
        110.0,
        None,
    );
    let secs = |v: f64| format!("{v:.2} s");
    hbars(
        &mut s,
        510.0,
        450.0,
        470.0,
        300.0,
        &format!("Until all {holds} keys are deleted"),
        &[
            pair("→ DBSIZE 0", |w| w.drain_ms.median() / 1e3, &secs),
            pair("server CPU", |w| w.server_cpu_ms.median() / 1e3, &secs),
        ],
        110.0,
        None,
    );
    let _ = writeln!(s, "</svg>");
    s
}
