"""Checks a chaos history (the format of chaos/HISTORY.md) for the properties (a) to (e).

    python -m lease_chaos.checker target/chaos/<run>/<config>/history.jsonl[.gz] ...

prints the counts and the violations of each history and exits 1 if any has a violation.
Every rule is a sweep over sorted or indexed events, so a history of half a million events
checks in seconds.
"""

from __future__ import annotations

import gzip
import json
import math
import sys
from bisect import bisect_right
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

RULES = ("a", "b", "c", "d", "e")
RULE_NAMES = {
    "a": "no stale write",
    "b": "fences increase",
    "c": "confirmed grants survive",
    "d": "no crash",
    "e": "paused holders",
}
FAULT_KINDS = (
    "pause_worker",
    "pause_primary",
    "kill_primary",
    "client_pause",
    "debug_sleep",
    "manual_failover",
    "kill_sentinel",
    "clock_step",
)
# Rule (c) trusts a node's answer only when it was primary this long before and after it:
# the observer polls, so a failover is logged a little after it happens.
PRIMARY_MARGIN_S = 1.0

WORKER_OPS = frozenset({"acquire", "renew", "release", "write", "abandon"})
COUNT_KEYS = (
    "events",
    "grants",
    "confirmed_grants",
    "acquires_nil",
    "acquires_indeterminate",
    "renewals",
    "renewals_confirmed",
    "renewals_rejected",
    "releases",
    "abandons",
    "fenced_writes_accepted",
    "fenced_writes_accepted_redis",
    "fenced_writes_accepted_sqlite",
    "registers_accepted",
    "stale_writes_rejected",
    "writes_indeterminate",
    "redis_writes_lost",
    "failovers",
    *(f"faults_{kind}" for kind in FAULT_KINDS),
    "workers_paused_past_lease",
    "paused_abandoned",
    "paused_rejected",
    "paused_late_unopposed",
    "paused_indeterminate",
    "paused_session_unknown",
    "confirmed_renewed_on_new_primary",
    "renews_on_new_primary",
    "c_checked",
    "c_exempt_clock",
    "b_exempt_unconfirmed",
    "server_exits",
    "server_exits_injected",
    "crash_logs",
    "violations",
    *(f"violations_{rule}" for rule in RULES),
)


@dataclass
class Violation:
    rule: str
    message: str
    events: list[dict] = field(default_factory=list)

    def __str__(self) -> str:
        return f"({self.rule}) {self.message}"


@dataclass
class Result:
    violations: list[Violation]
    counts: dict[str, int]
    run: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    def rules(self) -> set[str]:
        return {v.rule for v in self.violations}


def load(path: str | Path) -> list[dict]:
    """The events of a history.jsonl or history.jsonl.gz, in file order."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def check(events: list[dict]) -> Result:
    history = _History(events)
    counts = dict.fromkeys(COUNT_KEYS, 0)
    counts["events"] = len(events)
    violations: list[Violation] = []
    logs = _check_resources(history, counts, violations)
    _check_fences(history, counts, violations)
    _check_confirmed_grants(history, counts, violations)
    _check_crashes(history, counts, violations)
    _check_paused_holders(history, logs, counts, violations)
    _count_operations(history, counts)
    counts["violations"] = len(violations)
    for v in violations:
        counts[f"violations_{v.rule}"] += 1
    return Result(violations=violations, counts=counts, run=history.run)


# --- the index every rule reads ------------------------------------------------------


def start(e: dict) -> float:
    return e["t0"] if "t0" in e else e.get("t", 0.0)


def end(e: dict) -> float:
    t1 = e.get("t1")
    return start(e) if t1 is None else t1


def result(e: dict) -> str:
    # Renews and releases answer integers; tolerate "1" as well as 1.
    return str(e.get("result"))


def is_confirmed(e: dict) -> bool:
    acked, need = e.get("acked"), e.get("need")
    return acked is not None and need is not None and acked >= need


def is_session_bound(e: dict) -> bool:
    return e.get("session") is not None or not e.get("ttl")


def worker_name(target) -> str:
    target = str(target)
    return f"w{target}" if target.isdigit() else target


class Primaries:
    """Who was primary of each shard when, from the observer's `primary` events."""

    def __init__(self, events: list[dict]):
        changes: dict[str, list[tuple[float, str]]] = defaultdict(list)
        observed = sorted((e for e in events if e.get("type") == "primary"), key=start)
        for e in observed:
            shard = changes[str(e["shard"])]
            if not shard or shard[-1][1] != e["node"]:
                shard.append((e["t"], e["node"]))
        self._times = {shard: [t for t, _ in c] for shard, c in changes.items()}
        self._nodes = {shard: [n for _, n in c] for shard, c in changes.items()}

    def failovers(self) -> list[tuple[float, str, str]]:
        """Each change of primary after the first observation: (t, shard, new primary)."""
        return sorted(
            (t, shard, node)
            for shard, times in self._times.items()
            for t, node in zip(times[1:], self._nodes[shard][1:], strict=True)
        )

    def held_throughout(self, shard, node: str, t0: float, t1: float) -> bool:
        """The last observation at or before t0 names node, and none in (t0, t1] another."""
        times = self._times.get(str(shard))
        if not times:
            return False
        i = bisect_right(times, t0) - 1
        if i < 0 or self._nodes[str(shard)][i] != node:
            return False
        return i + 1 == len(times) or times[i + 1] > t1


class _History:
    def __init__(self, events: list[dict]):
        self.run = next((e for e in events if e.get("type") == "run"), {})
        self.t0 = self.run.get("t0")
        if self.t0 is None:
            self.t0 = min((start(e) for e in events if "t0" in e or "t" in e), default=0.0)
        self.ops = sorted((e for e in events if e.get("type") in WORKER_OPS), key=start)
        self.faults = sorted((e for e in events if e.get("type") == "fault"), key=start)
        self.primaries = Primaries(events)
        self.observations = [e for e in events if e.get("type") in ("server_exit", "crash_log")]
        self.resource_logs = [e for e in events if e.get("type") == "resource_log"]
        # A hold is a token on a key; its operations in invocation order. Writes are the
        # worker's, under its current grant, so they carry the same key and token.
        self.holds: dict[tuple, list[dict]] = defaultdict(list)
        self.holds_on: dict[str, list[tuple]] = defaultdict(list)
        for e in self.ops:
            hold = (e.get("key"), e.get("token"))
            if hold not in self.holds:
                self.holds_on[hold[0]].append(hold)
            self.holds[hold].append(e)

    def at(self, t: float | None) -> str:
        """A time as the seconds since the run started, as the report's timeline shows it."""
        return "?" if t is None else f"{t - self.t0:.3f}s"

    def clock_stepped(self, shard, t0: float, t1: float) -> bool:
        """A node of `shard` had its clock stepped at some time in [t0, t1]. A deadline is
        set by the granting primary's clock and judged by the reading primary's: a step
        either way between the two moves it (a step back, then the correction forward,
        shortens every lease granted during the step)."""
        return any(
            f.get("kind") == "clock_step"
            and (f.get("detail") or {}).get("shard") == shard
            and (f.get("detail") or {}).get("offset_s", 0) != 0
            and start(f) <= t1
            and (f.get("t1") is None or f["t1"] >= t0)
            for f in self.faults
        )


def _count_operations(h: _History, counts: dict) -> None:
    for e in h.ops:
        kind, res = e["type"], result(e)
        if kind == "acquire":
            if res == "ok":
                counts["grants"] += 1
                counts["confirmed_grants"] += is_confirmed(e)
            elif res == "error":
                counts["acquires_indeterminate"] += 1
            else:
                counts["acquires_nil"] += 1
        elif kind == "renew":
            if res == "1":
                counts["renewals"] += 1
                counts["renewals_confirmed"] += is_confirmed(e)
            elif res == "0":
                counts["renewals_rejected"] += 1
        elif kind == "release":
            counts["releases"] += 1
        elif kind == "abandon":
            counts["abandons"] += 1
        elif res == "ok" and e.get("register"):
            counts["registers_accepted"] += 1
        elif res == "ok":
            counts["fenced_writes_accepted"] += 1
            counts[f"fenced_writes_accepted_{e.get('kind')}"] = (
                counts.get(f"fenced_writes_accepted_{e.get('kind')}", 0) + 1
            )
        elif res == "stale":
            counts["stale_writes_rejected"] += 1
        elif res == "error":
            counts["writes_indeterminate"] += 1
    counts["failovers"] = len(h.primaries.failovers())
    for f in h.faults:
        counts[f"faults_{f.get('kind')}"] = counts.get(f"faults_{f.get('kind')}", 0) + 1


# --- (a) no stale write --------------------------------------------------------------


@dataclass
class _Placed:
    """Where a value sits in its resource's log, and the highest entry accepted before it."""

    position: int
    fence: int
    higher_before: tuple[int, str] | None


def _check_resources(h: _History, counts: dict, out: list[Violation]) -> dict:
    # A worker may write one value to both resources: a value is unique per resource.
    writes = {
        (w.get("kind"), w.get("resource"), w["value"]): w
        for w in h.ops
        if w["type"] == "write" and not w.get("register")
    }
    logs: dict[tuple[str, str], dict[str, _Placed]] = {}
    for log in h.resource_logs:
        where = (log.get("kind"), log.get("resource"))
        placed: dict[str, _Placed] = {}
        highest: tuple[int, str] | None = None
        for position, (fence, value) in enumerate(log.get("entries") or []):
            fence = int(fence)
            w = writes.get((*where, value))
            higher = highest if highest is not None and highest[0] > fence else None
            if higher is not None:
                out.append(
                    Violation(
                        "a",
                        f"{where[0]} {where[1]}: entry {position} {value!r} fence {fence} "
                        f"accepted after {higher[1]!r} fence {higher[0]}"
                        + (f" (written by {w.get('proc')} at {h.at(w['t0'])})" if w else ""),
                        [log] + [e for e in (writes.get((*where, higher[1])), w) if e is not None],
                    )
                )
            if w is None:
                out.append(
                    Violation(
                        "a",
                        f"{where[0]} {where[1]}: entry {position} {value!r} fence {fence} "
                        "is no write of the history (phantom)",
                        [log],
                    )
                )
            elif result(w) not in ("ok", "error") or w.get("fence") != fence:
                out.append(
                    Violation(
                        "a",
                        f"{where[0]} {where[1]}: entry {position} {value!r} fence {fence} "
                        f"is {w.get('proc')}'s write to {w.get('kind')} {w.get('resource')} "
                        f"fence {w.get('fence')} answered {result(w)} (phantom)",
                        [log, w],
                    )
                )
            placed[value] = _Placed(position, fence, higher)
            if highest is None or fence > highest[0]:
                highest = (fence, value)
        logs[where] = placed

    for w in writes.values():
        if result(w) != "ok":
            continue
        where = (w.get("kind"), w.get("resource"))
        if where[0] == "sqlite" and w["value"] not in logs.get(where, {}):
            out.append(
                Violation(
                    "a",
                    f"sqlite {where[1]}: {w.get('proc')}'s write {w['value']!r} fence "
                    f"{w.get('fence')} answered ok at {h.at(end(w))} is not in the log",
                    [w],
                )
            )
        elif where[0] == "redis" and where in logs and w["value"] not in logs[where]:
            # Allowed: acknowledged by a primary that was failed over before replicating.
            counts["redis_writes_lost"] += 1
    return logs


# --- (b) fences increase -------------------------------------------------------------


class _TopTwoTokens:
    """The confirmed grants with the highest fence of the two best-ranked distinct tokens."""

    def __init__(self):
        self.first: dict | None = None
        self.second: dict | None = None

    def add(self, g: dict) -> None:
        first, second = self.first, self.second
        if first is None:
            self.first = g
        elif g["token"] == first["token"]:
            if g["fence"] > first["fence"]:
                self.first = g
        elif g["fence"] > first["fence"]:
            # second drops out: it is either g's own token, with a lower fence, or below first.
            self.first, self.second = g, first
        elif second is None or g["fence"] > second["fence"]:
            self.second = g

    def best_other_than(self, token) -> dict | None:
        if self.first is not None and self.first["token"] != token:
            return self.first
        return self.second


def _check_fences(h: _History, counts: dict, out: list[Violation]) -> None:
    grants: dict[str, list[dict]] = defaultdict(list)
    for e in h.ops:
        if e["type"] == "acquire" and result(e) == "ok":
            grants[e.get("key")].append(e)
    for key, by_start in grants.items():
        confirmed = sorted((g for g in by_start if is_confirmed(g)), key=end)
        seen = _TopTwoTokens()
        i = 0
        for b in by_start:
            while i < len(confirmed) and end(confirmed[i]) < b["t0"]:
                seen.add(confirmed[i])
                i += 1
            a = seen.best_other_than(b["token"])
            if a is None or b["fence"] > a["fence"]:
                continue
            if not is_confirmed(b):
                # Granted by a node no replica followed: a primary that was failed over
                # and has not heard yet. Its grants are the ones WAIT exists to expose.
                counts["b_exempt_unconfirmed"] += 1
                continue
            out.append(
                Violation(
                    "b",
                    f"{key}: {b.get('proc')} granted token {b['token']} fence {b['fence']} "
                    f"at {h.at(b['t0'])} after {a.get('proc')}'s confirmed grant of token "
                    f"{a['token']} fence {a['fence']} completed at {h.at(end(a))}",
                    [a, b],
                )
            )


# --- (c) confirmed grants survive ----------------------------------------------------


def _check_confirmed_grants(h: _History, counts: dict, out: list[Violation]) -> None:
    for (key, token), ops in h.holds.items():
        # A hold bound to a session lives as long as the session: its own ttl says nothing.
        judged = not any(e["type"] == "acquire" and is_session_bound(e) for e in ops)
        deadline, confirming = -math.inf, None
        grant, renewed_elsewhere = None, False
        for e in ops:
            kind, res = e["type"], result(e)
            if kind == "release":
                deadline, confirming = -math.inf, None
            elif kind == "renew" and res in ("0", "1"):
                if res == "1" and grant is not None and e.get("node") != grant.get("node"):
                    counts["renews_on_new_primary"] += 1
                    renewed_elsewhere |= is_confirmed(grant)
                if judged and end(e) < deadline and _answered_by_primary(h, e):
                    counts["c_checked"] += 1
                    if res == "0" and h.clock_stepped(e.get("shard"), confirming["t0"], end(e)):
                        counts["c_exempt_clock"] += 1
                    elif res == "0":
                        out.append(_lost_grant(h, key, token, deadline, confirming, e))
            if kind == "acquire" and res == "ok":
                grant = e
            extends = (kind, res) in (("acquire", "ok"), ("renew", "1")) and is_confirmed(e)
            ttl = e.get("ttl") or 0
            if extends and ttl > 0 and e["t0"] + ttl / 1000 > deadline:
                deadline, confirming = e["t0"] + ttl / 1000, e
        counts["confirmed_renewed_on_new_primary"] += renewed_elsewhere


def _answered_by_primary(h: _History, e: dict) -> bool:
    return h.primaries.held_throughout(
        e.get("shard"), e.get("node"), e["t0"] - PRIMARY_MARGIN_S, end(e) + PRIMARY_MARGIN_S
    )


def _lost_grant(h: _History, key, token, deadline: float, confirming: dict, e: dict) -> Violation:
    return Violation(
        "c",
        f"{key}: {e.get('proc')}'s token {token} was confirmed until {h.at(deadline)} by its "
        f"{confirming['type']} at {h.at(confirming['t0'])}, but {e.get('node')}, primary of "
        f"{e.get('shard')} throughout, answered its renew 0 at {h.at(e['t0'])}..{h.at(end(e))}",
        [confirming, e],
    )


# --- (d) no crash --------------------------------------------------------------------


def _check_crashes(h: _History, counts: dict, out: list[Violation]) -> None:
    kills = [f for f in h.faults if f.get("kind") in ("kill_primary", "kill_sentinel")]
    for e in h.observations:
        if e["type"] == "crash_log":
            counts["crash_logs"] += 1
            out.append(
                Violation(
                    "d",
                    f"{e.get('node')} logged a crash at {h.at(e.get('t'))}: {e.get('line')}",
                    [e],
                )
            )
            continue
        counts["server_exits"] += 1
        kill = next(
            (
                f
                for f in kills
                if f.get("target") == e.get("node")
                and str((f.get("detail") or {}).get("pid")) == str(e.get("pid"))
                and start(f) <= e["t"]
            ),
            None,
        )
        if kill is not None:
            counts["server_exits_injected"] += 1
        else:
            out.append(
                Violation(
                    "d",
                    f"{e.get('node')} pid {e.get('pid')} exited with {e.get('status')} at "
                    f"{h.at(e['t'])}, and no kill_primary fault killed it",
                    [e],
                )
            )


# --- (e) paused holders --------------------------------------------------------------


def _held_at(ops: list[dict], t: float) -> tuple[dict, list[dict]] | None:
    """The grant a hold had at t (its last ok acquire before t, neither released nor
    abandoned before t) and its acquires and renews since that grant, or None."""
    grant, since = None, []
    for e in ops:
        if e["t0"] >= t:
            break
        if e["type"] in ("release", "abandon"):
            grant, since = None, []
        elif e["type"] == "acquire" and result(e) == "ok":
            grant, since = e, [e]
        elif e["type"] in ("acquire", "renew") and grant is not None:
            since.append(e)
    return None if grant is None else (grant, since)


def _deadline(since: list[dict]) -> float | None:
    """The latest moment the server may still hold the grant: each ok/1 answer extends it
    to at most its completion + ttl. An indeterminate answer may have extended it too."""
    ends = [
        end(e) + e["ttl"] / 1000
        for e in since
        if result(e) in ("ok", "1", "error") and e.get("ttl")
    ]
    return max(ends, default=None)


def _check_paused_holders(h: _History, logs: dict, counts: dict, out: list[Violation]) -> None:
    pauses = [f for f in h.faults if f.get("kind") == "pause_worker"]
    for pause, holds in _holds_at_pauses(h, pauses):
        paused, resumed = start(pause), end(pause)
        for hold in holds:
            held = _held_at(h.holds[hold], paused)
            if held is None:
                continue
            grant, since = held
            deadline = _deadline(since) if grant.get("ttl") else None
            if grant.get("session") is not None:
                session = _session_of(h, grant, paused)
                if session is None:
                    counts["paused_session_unknown"] += 1
                    continue
                if session is False:
                    continue
                deadline = session if deadline is None else min(deadline, session)
            if deadline is None or deadline >= resumed:
                continue
            counts["workers_paused_past_lease"] += 1
            _classify_paused(h, logs, pause, grant, deadline, counts, out)


def _holds_at_pauses(h: _History, pauses: list[dict]):
    """Each pause with the holds its worker may have had when it was paused: one sweep per
    worker over the moments its holds began and ended, not a scan of all its holds per
    pause."""
    changes: dict[str, list[tuple[float, bool, tuple]]] = defaultdict(list)
    for hold, ops in h.holds.items():
        holder = None
        for e in ops:
            if e["type"] == "acquire" and result(e) == "ok" and holder is None:
                holder = e.get("proc")
                changes[holder].append((e["t0"], True, hold))
            elif e["type"] in ("release", "abandon") and holder is not None:
                changes[holder].append((e["t0"], False, hold))
                holder = None
    for worker in changes.values():
        worker.sort(key=lambda change: change[0])
    swept: dict[str, tuple[int, set]] = {}
    for pause in sorted(pauses, key=start):
        worker = worker_name(pause.get("target"))
        done, holding = swept.get(worker, (0, set()))
        mine = changes.get(worker, [])
        while done < len(mine) and mine[done][0] < start(pause):
            _, began, hold = mine[done]
            (holding.add if began else holding.discard)(hold)
            done += 1
        swept[worker] = (done, holding)
        yield pause, sorted(holding, key=str)


def _session_of(h: _History, grant: dict, paused: float) -> float | bool | None:
    """The deadline of the session a bound grant was bound to, as of the pause; False when
    that session had ended before it, None when the history does not show the session."""
    worker = grant.get("proc")
    bound_to = None
    for hold in h.holds_on.get(grant["session"], ()):
        for e in h.holds[hold]:
            if (
                e["type"] == "acquire"
                and result(e) == "ok"
                and e.get("proc") == worker
                and e["t0"] < end(grant)
                and (bound_to is None or e["t0"] > bound_to["t0"])
            ):
                bound_to = e
    if bound_to is None:
        return None
    held = _held_at(h.holds[(bound_to.get("key"), bound_to.get("token"))], paused)
    if held is None or held[0] is not bound_to:
        return False
    return _deadline(held[1])


def _classify_paused(
    h: _History,
    logs: dict,
    pause: dict,
    grant: dict,
    deadline: float,
    counts: dict,
    out: list[Violation],
) -> None:
    # A stopped worker completes nothing, so whatever completed after the pause began was
    # sent or answered after it resumed.
    writes = [
        e
        for e in h.holds[(grant.get("key"), grant.get("token"))]
        if e["type"] == "write" and e.get("fence") == grant["fence"] and end(e) > start(pause)
    ]
    if not writes:
        counts["paused_abandoned"] += 1
        return
    accepted = stale = 0
    opposed = []
    for w in writes:
        placed = logs.get((w.get("kind"), w.get("resource")), {}).get(w.get("value"))
        if result(w) == "stale":
            stale += 1
        elif result(w) == "ok" or placed is not None:
            accepted += 1
            if placed is not None and placed.higher_before is not None:
                opposed.append((w, placed))
    for w, placed in opposed:
        fence, value = placed.higher_before
        out.append(
            Violation(
                "e",
                f"{w.get('proc')} paused {h.at(start(pause))}..{h.at(end(pause))} past its "
                f"lease on {grant.get('key')} (token {grant['token']}, deadline at most "
                f"{h.at(deadline)}) then wrote {w['value']!r} fence {w['fence']} at "
                f"{h.at(w['t0'])}, accepted at {w.get('kind')} {w.get('resource')} entry "
                f"{placed.position} after {value!r} fence {fence}",
                [pause, grant, w],
            )
        )
    if opposed:
        return
    if accepted:
        counts["paused_late_unopposed"] += 1
    elif stale:
        counts["paused_rejected"] += 1
    else:
        counts["paused_indeterminate"] += 1


# --- command line --------------------------------------------------------------------

SHOWN_PER_RULE = 20


def format_result(name: str, res: Result) -> str:
    width = max(map(len, res.counts))
    lines = [name, *(f"  {k:<{width}}  {v:>9,}" for k, v in res.counts.items())]
    for rule in RULES:
        found = [v for v in res.violations if v.rule == rule]
        if found:
            lines.append(f"  violations of ({rule}) {RULE_NAMES[rule]}: {len(found)}")
            lines += [f"    {v.message}" for v in found[:SHOWN_PER_RULE]]
            if len(found) > SHOWN_PER_RULE:
                lines.append(f"    ... and {len(found) - SHOWN_PER_RULE} more")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    paths = sys.argv[1:] if argv is None else argv
    if not paths:
        print("usage: python -m lease_chaos.checker history.jsonl[.gz] ...", file=sys.stderr)
        return 2
    failed = False
    for path in paths:
        res = check(load(path))
        print(format_result(path, res))
        failed |= not res.ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
