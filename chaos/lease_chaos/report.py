"""The chaos run's report: a Markdown table of the checker's counts per configuration (what
happened, then what each rule judged, exempted and why, and what it could not judge), and
one SVG timeline with a panel per configuration (grants and rejected writes per second,
faults, failovers). Hand-written SVG, aggregated per second, so it stays small.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from xml.sax.saxutils import escape

from lease_chaos.checker import (
    FAULT_KINDS,
    RULE_NAMES,
    RULES,
    Primaries,
    Result,
    end,
    result,
    start,
)

# Each row: a label, the counts it shows, and how: BREAKDOWN shows the first count, then the
# others in parentheses as parts of it; PARTS shows each count on its own, "a / b / c". The
# module (LEASE.FENCE) and the application (SQLite's own `WHERE fence <= ?`) are counted
# apart: what SQLite accepts proves nothing about the module.
BREAKDOWN, PARTS = False, True
ROWS = (
    (
        "grants (confirmed by WAIT / only by a later renewal)",
        ("grants", "confirmed_grants", "b_proved"),
        BREAKDOWN,
    ),
    (
        "the module accepted, LEASE.FENCE: writes / registers / reads",
        ("fenced_writes_accepted_redis", "registers_accepted_redis", "reads_accepted_redis"),
        PARTS,
    ),
    ("the module refused as stale", ("stale_rejected_redis",), BREAKDOWN),
    (
        "the application accepted, SQLite: writes / registers",
        ("fenced_writes_accepted_sqlite", "registers_accepted_sqlite"),
        PARTS,
    ),
    ("the application refused as stale", ("stale_rejected_sqlite",), BREAKDOWN),
    ("failovers", ("failovers",), BREAKDOWN),
    ("partitions (faults that cut links)", ("partitions",), BREAKDOWN),
    (
        "worker pauses (longer than the longest ttl)",
        ("faults_pause_worker", "worker_pauses_past_ttls"),
        BREAKDOWN,
    ),
    (
        "(a) final log entries judged: module / application",
        ("a_entries_redis", "a_entries_sqlite"),
        PARTS,
    ),
    (
        "(a) confirmed module writes kept / exempt: unconfirmed ones lost in a failover",
        ("a_confirmed_kept", "redis_writes_lost"),
        PARTS,
    ),
    (
        "(b) grants judged (exempt: unconfirmed, below a confirmed fence / never confirmed)",
        ("b_judged", "b_exempt_unconfirmed", "b_not_durable"),
        BREAKDOWN,
    ),
    (
        "(c) renewals judged (bound / exempt: clock stepped / exempt: not primary throughout)",
        ("c_checked", "c_checked_bound", "c_exempt_clock", "c_exempt_not_primary"),
        BREAKDOWN,
    ),
    (
        "(c) confirmed grants renewed on a new primary",
        ("confirmed_renewed_on_new_primary",),
        BREAKDOWN,
    ),
    (
        "(d) server exits matched to an injected kill / crash reports",
        ("server_exits_injected", "crash_logs"),
        PARTS,
    ),
    (
        "(e) leases run out while their worker was paused (stopped / refused / late, unopposed)",
        (
            "workers_paused_past_lease",
            "paused_abandoned",
            "paused_rejected",
            "paused_late_unopposed",
        ),
        BREAKDOWN,
    ),
    (
        "(f) confirmed holds judged (not judged: never confirmed / exempt pairs: clock stepped)",
        ("f_holds_judged", "f_holds_unconfirmed", "f_exempt_clock"),
        BREAKDOWN,
    ),
    (
        "(g) operations judged, module (exempt: split brain / below a confirmed fence, lost)",
        ("g_judged_redis", "g_exempt_unconfirmed", "g_exempt_unkept"),
        BREAKDOWN,
    ),
    ("(g) operations judged, application", ("g_judged_sqlite",), BREAKDOWN),
    (
        "(h) stale refusals judged: module / application / application, not judged",
        ("h_judged_redis", "h_judged_sqlite", "h_unjudged_sqlite"),
        PARTS,
    ),
    (
        "(i) operations matched to their invocation (recorded indeterminate: worker killed)",
        ("i_ops_judged", "i_ops_unfinished"),
        BREAKDOWN,
    ),
    ("(i) final logs found", ("i_logs_judged",), BREAKDOWN),
)


def summary_table(results: list[tuple[str, Result]]) -> str:
    kinds = list(FAULT_KINDS)
    for _, res in results:
        kinds += [
            k.removeprefix("faults_")
            for k in res.counts
            if k.startswith("faults_") and k.removeprefix("faults_") not in kinds
        ]
    rows = [
        *ROWS,
        *((f"faults: {kind}", (f"faults_{kind}",), BREAKDOWN) for kind in kinds),
        (
            "violations by rule: " + " / ".join(f"({r})" for r in RULES),
            tuple(f"violations_{r}" for r in RULES),
            PARTS,
        ),
        ("violations", ("violations",), BREAKDOWN),
    ]
    names = [name for name, _ in results]
    lines = [
        "| | " + " | ".join(names) + " | total |",
        "|---|" + "---:|" * (len(names) + 1),
    ]
    for label, keys, parts in rows:
        columns = [[res.counts.get(k, 0) for k in keys] for _, res in results]
        total = [sum(c[i] for c in columns) for i in range(len(keys))]
        cells = [_cell(values, parts) for values in [*columns, total]]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    notes = [
        f"- {name}: ({rule}) {RULE_NAMES[rule]}: {why}"
        for name, res in results
        for rule in RULES
        for why in res.not_judged.get(rule, [])
    ]
    if notes:
        lines += ["", "Not judged, for want of a record in the history:", *notes]
    return "\n".join(lines)


def _cell(values: list[int], parts: bool) -> str:
    if parts:
        return " / ".join(f"{v:,}" for v in values)
    first, *parts = values
    if not parts:
        return f"{first:,}"
    return f"{first:,} (" + " / ".join(f"{p:,}" for p in parts) + ")"


# --- timeline ------------------------------------------------------------------------

WIDTH = 1000
LEFT, RIGHT = 130, 50
PLOT = WIDTH - LEFT - RIGHT
TOP = 44
TITLE, CHART, LANE, AXIS, GAP = 40, 130, 11, 30, 16
FONT = "font-family:sans-serif;font-size:11px"
GRANTS, STALE, FAILOVER = "#1f5fa8", "#d62728", "#333"
FAULT_COLOURS = {
    "pause_worker": "#ff7f0e",
    "pause_primary": "#9467bd",
    "kill_primary": "#8c564b",
    "client_pause": "#e377c2",
    "debug_sleep": "#bcbd22",
    "manual_failover": "#17becf",
    "kill_sentinel": "#7f7f7f",
    "clock_step": "#2ca02c",
}


def timeline_svg(histories: list[tuple[str, list[dict]]], path: str | Path) -> str:
    """Writes the timeline of every configuration to path and returns the SVG text."""
    kinds = list(FAULT_COLOURS)
    for _, events in histories:
        kinds += sorted(
            {e.get("kind") for e in events if e.get("type") == "fault"} - set(kinds) - {None}
        )
    panel = TITLE + CHART + 8 + LANE * len(kinds) + AXIS + GAP
    height = TOP + panel * len(histories)
    svg = _tag(
        "svg",
        xmlns="http://www.w3.org/2000/svg",
        width=WIDTH,
        height=height,
        viewBox=f"0 0 {WIDTH} {height}",
        style=FONT,
    )
    out = [
        svg.removesuffix("/>") + ">",
        _tag("rect", width=WIDTH, height=height, fill="white"),
        _tag("text", "Chaos timeline", x=10, y=18, style="font-size:15px;font-weight:bold"),
        *_legend(),
    ]
    for i, (name, events) in enumerate(histories):
        out += _panel(name, events, kinds, TOP + i * panel)
    out.append("</svg>")
    svg = "\n".join(out) + "\n"
    Path(path).write_text(svg, encoding="utf-8")
    return svg


def _tag(name: str, text: str | None = None, **attributes) -> str:
    """One SVG element; attribute names are written with hyphens for underscores."""
    written = " ".join(
        f'{k.rstrip("_").replace("_", "-")}="{_number(v) if isinstance(v, float) else v}"'
        for k, v in attributes.items()
    )
    if text is None:
        return f"<{name} {written}/>"
    return f"<{name} {written}>{escape(text)}</{name}>"


def _number(v: float) -> str:
    return f"{v:.1f}".removesuffix(".0")


def _legend() -> list[str]:
    x, y = LEFT, 34
    return [
        _tag("path", d=f"M{x} {y - 4}h24", stroke=GRANTS, stroke_width=2),
        _tag("text", "grants per second", x=x + 30, y=y),
        _tag("rect", x=x + 150, y=y - 9, width=10, height=10, fill=STALE),
        _tag("text", "stale writes rejected per second (right axis)", x=x + 166, y=y),
        _tag("path", d=f"M{x + 440} {y - 11}v14", stroke=FAILOVER, stroke_dasharray="3 2"),
        _tag("text", "failover", x=x + 446, y=y),
        _tag("text", "faults: coloured spans from injection to heal", x=x + 510, y=y),
    ]


def _panel(name: str, events: list[dict], kinds: list[str], top: float) -> list[str]:
    run = next((e for e in events if e.get("type") == "run"), {})
    timed = [e for e in events if "t0" in e or "t" in e]
    t0 = run.get("t0", min((start(e) for e in timed), default=0.0))
    seconds = max(1, math.ceil(max([run.get("t1", t0), *(end(e) for e in timed)]) - t0))
    # A bin per second, or per few seconds when a run is longer than the plot is wide.
    step = math.ceil(seconds / PLOT)
    granted, grants = _per_second(
        (end(e) - t0 for e in events if e.get("type") == "acquire" and result(e) == "ok"),
        seconds,
        step,
    )
    rejected, stale = _per_second(
        (end(e) - t0 for e in events if e.get("type") == "write" and result(e) == "stale"),
        seconds,
        step,
    )
    faults = [e for e in events if e.get("type") == "fault"]
    failovers = Primaries(events).failovers()

    def x(t: float) -> float:
        return LEFT + PLOT * min(max(t - t0, 0.0), seconds) / seconds

    chart_top = top + TITLE
    chart_bottom = chart_top + CHART
    strip_top = chart_bottom + 8
    strip_bottom = strip_top + LANE * len(kinds)
    grant_ticks, stale_ticks = _ticks(max(grants)), _ticks(max(stale))

    def y(value: float, ticks: list[float]) -> float:
        return chart_bottom - CHART * value / ticks[-1]

    stats = " · ".join(
        [
            _several(granted, "grant"),
            _several(rejected, "stale write") + " rejected",
            _several(len(failovers), "failover"),
            _several(len(faults), "fault"),
            f"{seconds:,} s",
        ]
    )
    middle = chart_top + CHART / 2
    out = [
        _tag("text", name, x=10, y=top + 16, style="font-size:13px;font-weight:bold"),
        _tag("text", stats, x=10, y=top + 31, fill="#555"),
        _tag("rect", x=LEFT, y=chart_top, width=PLOT, height=CHART, fill="#fafafa", stroke="#ccc"),
        _tag(
            "text",
            "grants/s",
            transform=f"translate({LEFT - 36} {middle}) rotate(-90)",
            text_anchor="middle",
            fill=GRANTS,
        ),
        _tag(
            "text",
            "stale/s",
            transform=f"translate({WIDTH - 12} {middle}) rotate(-90)",
            text_anchor="middle",
            fill=STALE,
        ),
    ]
    for tick in grant_ticks:
        at = y(tick, grant_ticks)
        out.append(_tag("path", d=f"M{LEFT - 4} {_number(at)}h{PLOT + 4}", stroke="#e4e4e4"))
        out.append(_tag("text", f"{tick:g}", x=LEFT - 7, y=at + 4, text_anchor="end", fill=GRANTS))
    for tick in stale_ticks:
        out.append(
            _tag("text", f"{tick:g}", x=LEFT + PLOT + 6, y=y(tick, stale_ticks) + 4, fill=STALE)
        )

    # One path for all the bars and one polyline for the line: a few elements per panel
    # however long the run.
    width = _number(max(PLOT * step / seconds, 1.5))
    bars = "".join(
        f"M{_number(x(t0 + i * step))} {chart_bottom}h{width}V{_number(y(n, stale_ticks))}h-{width}Z"
        for i, n in enumerate(stale)
        if n
    )
    if bars:
        out.append(_tag("path", d=bars, fill=STALE, fill_opacity=0.75))
    points = " ".join(
        f"{_number(x(t0 + (i + 0.5) * step))},{_number(y(n, grant_ticks))}"
        for i, n in enumerate(grants)
    )
    out.append(_tag("polyline", points=points, fill="none", stroke=GRANTS, stroke_width=1.5))

    for lane, kind in enumerate(kinds):
        lane_y = strip_top + lane * LANE
        colour = FAULT_COLOURS.get(kind, "#000")
        spans = "".join(
            f"M{_number(x(start(f)))} {lane_y + 1}"
            f"h{_number(max(x(end(f)) - x(start(f)), 2.0))}v{LANE - 2}H{_number(x(start(f)))}Z"
            for f in faults
            if f.get("kind") == kind
        )
        shade = "#f4f4f4" if lane % 2 else "#fbfbfb"
        out += [
            _tag("rect", x=LEFT, y=lane_y, width=PLOT, height=LANE, fill=shade),
            _tag("rect", x=LEFT - 14, y=lane_y + 2, width=8, height=LANE - 4, fill=colour),
            _tag(
                "text",
                kind,
                x=LEFT - 18,
                y=lane_y + LANE - 2,
                text_anchor="end",
                style="font-size:10px",
            ),
        ]
        if spans:
            out.append(_tag("path", d=spans, fill=colour))

    if failovers:
        lines = "".join(f"M{_number(x(t))} {chart_top}V{strip_bottom}" for t, _, _ in failovers)
        out.append(_tag("path", d=lines, stroke=FAILOVER, stroke_dasharray="4 3"))

    for tick in (t for t in _ticks(seconds, count=10) if t <= seconds):
        at = x(t0 + tick)
        out.append(_tag("path", d=f"M{_number(at)} {strip_bottom}v4", stroke="#555"))
        out.append(_tag("text", f"{tick:g}", x=at, y=strip_bottom + 15, text_anchor="middle"))
    out.append(
        _tag(
            "text",
            "seconds since the run started",
            x=LEFT + PLOT,
            y=strip_bottom + 27,
            text_anchor="end",
            fill="#555",
        )
    )
    return out


def _several(n: int, thing: str) -> str:
    return f"{n:,} {thing}" + ("" if n == 1 else "s")


def _per_second(offsets, seconds: int, step: int) -> tuple[int, list[float]]:
    """How many events there are, and how many per second in each bin of step seconds."""
    counts = Counter(min(max(int(t), 0), seconds - 1) // step for t in offsets)
    return counts.total(), [counts[i] / step for i in range(math.ceil(seconds / step))]


def _ticks(maximum: float, count: int = 4) -> list[float]:
    """Round tick values from 0 to at least maximum, about count of them."""
    rough = max(maximum, 1) / count
    magnitude = 10 ** math.floor(math.log10(rough))
    # Every series counts whole events or seconds: no fractional ticks.
    step = max(1, next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= rough))
    return [i * step for i in range(math.ceil(max(maximum, 1) / step) + 1)]
