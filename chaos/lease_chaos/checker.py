"""Checks a chaos history (the format of chaos/HISTORY.md) for the rules (a) to (i).

    python -m lease_chaos.checker target/chaos/<run>/<config>/history.jsonl[.gz] ...

prints, for each history, what each rule judged, what it exempted and why, what it could
not judge in that history (a history recorded before a field existed lacks it), and the
violations; exits 1 if any history has a violation. Every rule is a sweep over sorted or
indexed events, so a history of half a million events checks in seconds.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import sys
from bisect import bisect_left, bisect_right
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

# The history format the harness writes (the run header's `format`; 1 when absent).
# 2 added invocations, worker exits, the nodes' replication identities, WAIT on fenced
# operations, reads told apart from registers, and the fence SQLite held when it refused.
FORMAT = 2

RULES = ("a", "b", "c", "d", "e", "f", "g", "h", "i")
RULE_NAMES = {
    "a": "final logs",
    "b": "fences increase",
    "c": "confirmed holds survive",
    "d": "no crash",
    "e": "paused holders",
    "f": "mutual exclusion",
    "g": "fences never go down",
    "h": "stale replies are true",
    "i": "history complete",
}
FAULT_KINDS = (
    "pause_worker",
    "pause_primary",
    "kill_primary",
    "client_pause",
    "debug_sleep",
    "manual_failover",
    "kill_sentinel",
    "kill_sentinels",
    "clock_step",
    "clock_step_failover",
    "pause_replica",
    "kill_replica",
    "kill_rewrite",
    "disk_full",
    "fsync_fail",
    "partition_primary",
    "partition_minority",
    "partition_one_way",
    "partition_replica",
    "packet_loss",
    "overlap",
    "migrate_slot",
)
# Faults that cut links between processes (packet loss is not counted as one).
PARTITION_KINDS = frozenset(k for k in FAULT_KINDS if k.startswith("partition_"))
# Faults that kill a data node, which then restarts from its own files (`fsync_fail` when
# the primary stays read-only after it).
DATA_KILLS = frozenset({"kill_primary", "kill_replica", "kill_rewrite", "fsync_fail"})
# Faults whose `pids` or `pid` are server exits they caused.
KILLS = DATA_KILLS | {"kill_sentinel", "kill_sentinels"}
# The observer polls, so a change of primary is logged a little after it happens: rule (c)
# trusts a node's answer only when it was primary this long before and after it, and a
# history without the nodes' own replication identities (format 1) takes a node's data as
# possibly replaced from this long before it was seen promoted.
PRIMARY_MARGIN_S = 1.0
# The clock assumption of rules (c) and (f): the nodes share this machine's clock, except
# the one whose clock a `clock_step` moves, and a deadline is whole milliseconds.
CLOCK_MARGIN_S = 0.05

WORKER_OPS = frozenset({"acquire", "renew", "release", "write", "abandon"})
STALE_REPLY = re.compile(r"STALE fencing token (\d+) is older than (\d+)")

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
    # LEASE.FENCE: the module checks the fence. SQLite: the application's own
    # `UPDATE ... WHERE fence <= ?` does, so what it accepts proves nothing about the module.
    "fenced_writes_accepted_redis",
    "registers_accepted_redis",
    "reads_accepted_redis",
    "stale_rejected_redis",
    "fenced_writes_accepted_sqlite",
    "registers_accepted_sqlite",
    "stale_rejected_sqlite",
    "fenced_indeterminate",
    "failovers",
    "partitions",
    "worker_pauses_past_ttls",
    *(f"faults_{kind}" for kind in FAULT_KINDS),
    # (a)
    "a_entries_redis",
    "a_entries_sqlite",
    "a_confirmed_kept",
    "redis_writes_lost",
    # (b)
    "b_judged",
    "b_proved",
    "b_exempt_unconfirmed",
    "b_not_durable",
    # (c)
    "c_checked",
    "c_checked_bound",
    "c_exempt_clock",
    "c_exempt_not_primary",
    "c_session_unknown",
    "renews_on_new_primary",
    "confirmed_renewed_on_new_primary",
    # (d)
    "server_exits",
    "server_exits_injected",
    "crash_logs",
    # (e)
    "workers_paused_past_lease",
    "paused_abandoned",
    "paused_rejected",
    "paused_late_unopposed",
    "paused_indeterminate",
    "paused_session_unknown",
    # (f)
    "f_holds_judged",
    "f_holds_unconfirmed",
    "f_exempt_clock",
    # (g)
    "g_judged_redis",
    "g_judged_redis_node",
    "g_judged_sqlite",
    "g_exempt_unconfirmed",
    "g_exempt_unkept",
    # (h)
    "h_judged_redis",
    "h_judged_sqlite",
    "h_unjudged_sqlite",
    # (i)
    "i_ops_judged",
    "i_ops_unfinished",
    "i_logs_judged",
    "violations",
    *(f"violations_{rule}" for rule in RULES),
)

# What each rule judged, what it exempted and why: the checker's output and the report.
RULE_COUNTS: dict[str, tuple[tuple[str, str], ...]] = {
    "a": (
        ("a_entries_redis", "final log entries judged, redis (LEASE.FENCE)"),
        ("a_entries_sqlite", "final log entries judged, sqlite (its own check)"),
        ("a_confirmed_kept", "confirmed redis writes found kept"),
        ("redis_writes_lost", "exempt: unconfirmed redis writes lost in a failover"),
    ),
    "b": (
        ("b_judged", "grants judged against an earlier confirmed grant"),
        ("b_proved", "  of all grants: confirmed only by a later renewal"),
        ("b_exempt_unconfirmed", "exempt: unconfirmed grants below a confirmed fence"),
        ("b_not_durable", "not judged: grants never confirmed"),
    ),
    "c": (
        ("c_checked", "renewals judged within a confirmed life"),
        ("c_checked_bound", "  of them: of holds bound to a session"),
        ("c_exempt_clock", "exempt: answered 0 after a clock step"),
        ("c_exempt_not_primary", "exempt: answered 0 by a node not primary throughout"),
        ("c_session_unknown", "bound holds whose session the history does not show"),
    ),
    "d": (
        ("server_exits_injected", "server exits matched to an injected kill"),
        ("crash_logs", "crash reports in server logs"),
    ),
    "e": (
        ("workers_paused_past_lease", "leases that ran out while their worker was paused"),
        ("paused_abandoned", "  stopped"),
        ("paused_rejected", "  refused"),
        ("paused_late_unopposed", "  late, unopposed"),
        ("paused_indeterminate", "  indeterminate"),
        ("paused_session_unknown", "not judged: session not in the history"),
    ),
    "f": (
        ("f_holds_judged", "confirmed holds judged"),
        ("f_holds_unconfirmed", "not judged: holds never confirmed"),
        ("f_exempt_clock", "exempt: overlapping pairs after a clock step"),
    ),
    "g": (
        ("g_judged_redis", "accepted fenced operations judged, redis (LEASE.FENCE)"),
        ("g_judged_redis_node", "  of them: also against their own node's earlier ones"),
        ("g_judged_sqlite", "accepted fenced operations judged, sqlite (its own check)"),
        ("g_exempt_unconfirmed", "exempt: below an unconfirmed fence of another primary"),
        ("g_exempt_unkept", "exempt: below a confirmed fence, unconfirmed and not kept"),
    ),
    "h": (
        ("h_judged_redis", "STALE replies judged, redis"),
        ("h_judged_sqlite", "stale refusals judged, sqlite"),
        ("h_unjudged_sqlite", "not judged: sqlite refusals without the fence it held"),
    ),
    "i": (
        ("i_ops_judged", "operations matched to their invocation"),
        ("i_ops_unfinished", "  of them: recorded indeterminate, their worker killed"),
        ("i_logs_judged", "final logs found"),
    ),
}


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
    # Per rule, what the history does not record and the rule therefore could not judge.
    not_judged: dict[str, list[str]] = field(default_factory=dict)

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
    _check_confirmed_holds(history, counts, violations)
    _check_crashes(history, counts, violations)
    _check_paused_holders(history, logs, counts, violations)
    _check_mutual_exclusion(history, counts, violations)
    _check_fence_order(history, counts, violations)
    _check_stale_replies(history, counts, violations)
    _check_complete(history, counts, violations)
    _count_operations(history, counts)
    counts["violations"] = len(violations)
    for v in violations:
        counts[f"violations_{v.rule}"] += 1
    return Result(
        violations=violations, counts=counts, run=history.run, not_judged=history.not_judged
    )


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


def has_value(w: dict) -> bool:
    """A fenced write that appends a value, not a register or a read."""
    return w.get("value") is not None


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

    def promotions(self) -> dict[str, list[float]]:
        """When each node was seen becoming primary (after the first observation)."""
        seen: dict[str, list[float]] = defaultdict(list)
        for t, _shard, node in self.failovers():
            seen[node].append(t)
        return seen

    def held_throughout(self, shard, node: str, t0: float, t1: float) -> bool:
        """The last observation at or before t0 names node, and none in (t0, t1] another."""
        times = self._times.get(str(shard))
        if not times:
            return False
        i = bisect_right(times, t0) - 1
        if i < 0 or self._nodes[str(shard)][i] != node:
            return False
        return i + 1 == len(times) or times[i + 1] > t1


@dataclass(eq=False)
class Grant:
    """One grant of a lease: a token on a key with one fence, from the acquire answered with
    it (later acquires of the token answered with the same fence are its idempotent
    retries) to its first release. `live_until`: the grant was certainly live, in the data
    that survives every failover, from its acquire's completion until then; `witness` is
    the operation that shows it (for a hold bound to a session, maybe the session's)."""

    acquire: dict
    ops: list[dict] = field(default_factory=list)
    ended: float = math.inf
    session: Grant | None = None
    durable: bool = False
    proved: bool = False
    live_until: float = -math.inf
    witness: dict | None = None

    @property
    def key(self):
        return self.acquire.get("key")

    @property
    def token(self):
        return self.acquire.get("token")

    @property
    def fence(self):
        return self.acquire.get("fence")

    @property
    def proc(self):
        return self.acquire.get("proc")

    @property
    def exclusive(self) -> bool:
        return self.acquire.get("mode", "x") != "s"

    @property
    def bound(self) -> bool:
        return is_session_bound(self.acquire)


class _History:
    def __init__(self, events: list[dict]):
        self.run = next((e for e in events if e.get("type") == "run"), {})
        self.format = int(self.run.get("format", 1))
        self.t0 = self.run.get("t0")
        if self.t0 is None:
            self.t0 = min((start(e) for e in events if "t0" in e or "t" in e), default=0.0)
        self.ops = sorted((e for e in events if e.get("type") in WORKER_OPS), key=start)
        self.invokes = [e for e in events if e.get("type") == "invoke"]
        self.worker_ends = {e.get("proc"): e for e in events if e.get("type") == "worker_end"}
        self.worker_exits = {e.get("worker"): e for e in events if e.get("type") == "worker_exit"}
        self.faults = sorted((e for e in events if e.get("type") == "fault"), key=start)
        self.primaries = Primaries(events)
        self.node_states = sorted((e for e in events if e.get("type") == "node"), key=start)
        self.observations = [e for e in events if e.get("type") in ("server_exit", "crash_log")]
        self.resource_logs = [e for e in events if e.get("type") == "resource_log"]
        self.logs = {(e.get("kind"), e.get("resource")): e for e in self.resource_logs}
        self.not_judged: dict[str, list[str]] = defaultdict(list)
        # A hold is a token on a key; its operations in invocation order. Writes are the
        # worker's, under its current grant, so they carry the same key and token.
        self.holds: dict[tuple, list[dict]] = defaultdict(list)
        self.holds_on: dict[str, list[tuple]] = defaultdict(list)
        for e in self.ops:
            hold = (e.get("key"), e.get("token"))
            if hold not in self.holds:
                self.holds_on[hold[0]].append(hold)
            self.holds[hold].append(e)
        self.grants = _grants(self)
        self.grant_of: dict[int, Grant] = {id(e): g for g in self.grants for e in g.ops}

    def at(self, t: float | None) -> str:
        """A time as the seconds since the run started, as the report's timeline shows it."""
        return "?" if t is None else f"{t - self.t0:.3f}s"

    def clock_stepped(self, shard, t0: float, t1: float) -> bool:
        """A node of `shard` had its clock stepped at some time in [t0, t1]. A deadline is
        set by the granting primary's clock and judged by the reading primary's: a step
        either way between the two moves it (a step back, then the correction forward,
        shortens every lease granted during the step)."""
        return any(
            f.get("kind") in ("clock_step", "clock_step_failover")
            and (f.get("detail") or {}).get("shard") == shard
            and (f.get("detail") or {}).get("offset_s", 0) != 0
            and start(f) <= t1
            and (f.get("t1") is None or f["t1"] >= t0)
            for f in self.faults
        )


# --- grants, and how long each was certainly live ------------------------------------


def _grants(h: _History) -> list[Grant]:
    grants: list[Grant] = []
    for ops in h.holds.values():
        current = None
        for e in ops:
            kind, res = e["type"], result(e)
            if kind not in ("acquire", "renew", "release"):
                continue
            if kind == "acquire" and res == "ok":
                retry = current is not None and current.fence == e.get("fence")
                if not retry or current.ended < math.inf:
                    current = Grant(e)
                    grants.append(current)
            if current is None:
                continue
            current.ops.append(e)
            if kind == "release":
                current.ended = min(current.ended, e["t0"])
    # Sessions first: a bound hold lives as long as the session grant it was bound to,
    # the worker's latest grant of that session key invoked before the hold's acquire.
    sessions: dict[tuple, list[Grant]] = defaultdict(list)
    for g in grants:
        if not g.bound:
            _settle(g)
            sessions[(g.key, g.proc)].append(g)
    for found in sessions.values():
        found.sort(key=lambda g: g.acquire["t0"])
    for g in grants:
        if g.bound:
            found = sessions.get((g.acquire.get("session"), g.proc), [])
            i = bisect_left([s.acquire["t0"] for s in found], g.acquire["t0"]) - 1
            g.session = found[i] if i >= 0 else None
            _settle(g)
    return grants


def _settle(g: Grant) -> None:
    """How long g was certainly live in the surviving data. Each acquire answered ok or
    renew answered 1 that WAIT confirmed (every replica has it, so every failover keeps
    it) shows g live when it ran, which was at or after its invocation, and sets a
    deadline at least its invocation + ttl. A lease is never revived, so a renewal
    confirmed later also shows g live all the time before it: it proves a grant that was
    not confirmed when it was made."""
    direct, deadline = (-math.inf, None), (-math.inf, None)
    for e in g.ops:
        if e["t0"] >= g.ended:
            break
        answered = (e["type"], result(e)) in (("acquire", "ok"), ("renew", "1"))
        if not (answered and is_confirmed(e)):
            continue
        g.durable = True
        direct = max(direct, (e["t0"], e), key=lambda w: w[0])
        if e.get("ttl"):
            deadline = max(deadline, (e["t0"] + e["ttl"] / 1000, e), key=lambda w: w[0])
    g.proved = g.durable and not any(
        e["type"] == "acquire" and result(e) == "ok" and is_confirmed(e) for e in g.ops
    )
    if not g.durable:
        return
    live = max(direct, deadline, key=lambda w: w[0])
    if g.bound:
        # Live while its own deadline (none with ttl 0) and its session grant both are.
        own = (math.inf, None) if not g.acquire.get("ttl") else deadline
        if g.session is not None and g.session.durable:
            session = (g.session.live_until, g.session.witness)
            via = min(own, session, key=lambda w: w[0])
        else:
            via = (-math.inf, None)
        live = max(direct, via, key=lambda w: w[0])
    g.live_until, g.witness = min(live[0], g.ended), live[1]


# --- counts of what happened ---------------------------------------------------------


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
        elif res == "ok":
            resource = e.get("kind")
            what = "fenced_writes" if has_value(e) else "reads" if e.get("read") else "registers"
            if resource == "sqlite" and what == "reads":
                what = "registers"
            counts[f"{what}_accepted_{resource}"] = counts.get(f"{what}_accepted_{resource}", 0) + 1
        elif res == "stale":
            counts[f"stale_rejected_{e.get('kind')}"] = (
                counts.get(f"stale_rejected_{e.get('kind')}", 0) + 1
            )
        elif res == "error":
            counts["fenced_indeterminate"] += 1
    counts["failovers"] = len(h.primaries.failovers())
    for f in h.faults:
        counts[f"faults_{f.get('kind')}"] = counts.get(f"faults_{f.get('kind')}", 0) + 1
        counts["partitions"] += f.get("kind") in PARTITION_KINDS
        counts["worker_pauses_past_ttls"] += bool((f.get("detail") or {}).get("longer_than_ttls"))
    for g in h.grants:
        counts["b_proved"] += g.proved


def describe(w: dict) -> str:
    if has_value(w):
        return f"write {w['value']!r}"
    return "read" if w.get("read") else "register"


# --- (a) final logs ------------------------------------------------------------------


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
        if w["type"] == "write" and has_value(w)
    }
    logs: dict[tuple[str, str], dict[str, _Placed]] = {}
    for log in h.resource_logs:
        where = (log.get("kind"), log.get("resource"))
        placed: dict[str, _Placed] = {}
        highest: tuple[int, str] | None = None
        for position, (fence, value) in enumerate(log.get("entries") or []):
            fence = int(fence)
            counts[f"a_entries_{where[0]}"] = counts.get(f"a_entries_{where[0]}", 0) + 1
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

    confirmations = False
    for w in writes.values():
        if result(w) != "ok":
            continue
        where = (w.get("kind"), w.get("resource"))
        kept = w["value"] in logs.get(where, {})
        confirmations |= w.get("acked") is not None
        if where[0] == "sqlite" and not kept:
            out.append(
                Violation(
                    "a",
                    f"sqlite {where[1]}: {w.get('proc')}'s write {w['value']!r} fence "
                    f"{w.get('fence')} answered ok at {h.at(end(w))} is not in the log",
                    [w],
                )
            )
        elif where[0] == "redis" and where in logs and is_confirmed(w):
            if kept:
                counts["a_confirmed_kept"] += 1
            else:
                out.append(
                    Violation(
                        "a",
                        f"redis {where[1]}: {w.get('proc')}'s write {w['value']!r} fence "
                        f"{w.get('fence')} answered ok and confirmed by {w.get('acked')} "
                        f"replicas at {h.at(end(w))} is not in the final log",
                        [w],
                    )
                )
        elif where[0] == "redis" and where in logs and not kept:
            # Allowed: acknowledged, unconfirmed, by a primary that was failed over before
            # it replicated the write; WAIT exists to expose exactly that.
            counts["redis_writes_lost"] += 1
    if writes and not confirmations:
        h.not_judged["a"].append(
            "whether confirmed redis writes are kept: no fenced write records a WAIT (format 1)"
        )
    return logs


# --- (b) fences increase -------------------------------------------------------------


class _TopTwoTokens:
    """The grants with the highest fence of the two best-ranked distinct tokens."""

    def __init__(self):
        self.first: Grant | None = None
        self.second: Grant | None = None

    def add(self, g: Grant) -> None:
        first, second = self.first, self.second
        if first is None:
            self.first = g
        elif g.token == first.token:
            if g.fence > first.fence:
                self.first = g
        elif g.fence > first.fence:
            # second drops out: it is either g's own token, with a lower fence, or below first.
            self.first, self.second = g, first
        elif second is None or g.fence > second.fence:
            self.second = g

    def best_other_than(self, token) -> Grant | None:
        if self.first is not None and self.first.token != token:
            return self.first
        return self.second


def _check_fences(h: _History, counts: dict, out: list[Violation]) -> None:
    """Every acquire answered ok (an idempotent retry too: the key then still had that
    fence) whose grant is confirmed, by WAIT or by a renewal WAIT confirmed later, is above
    every confirmed grant of another token on the key that completed before it began."""
    acquires: dict[str, list[tuple[dict, Grant]]] = defaultdict(list)
    for g in h.grants:
        counts["b_not_durable"] += not g.durable
        for e in g.ops:
            if e["type"] == "acquire" and result(e) == "ok":
                acquires[g.key].append((e, g))
    for key, pairs in acquires.items():
        pairs.sort(key=lambda p: p[0]["t0"])
        durable = sorted((p for p in pairs if p[1].durable), key=lambda p: end(p[0]))
        seen = _TopTwoTokens()
        i = 0
        for b, grant in pairs:
            while i < len(durable) and end(durable[i][0]) < b["t0"]:
                seen.add(durable[i][1])
                i += 1
            a = seen.best_other_than(grant.token)
            if a is None:
                continue
            counts["b_judged"] += grant.durable
            if b["fence"] > a.fence:
                continue
            if not grant.durable:
                # Granted by a node no replica followed: a primary that was failed over
                # and has not heard yet. Its grants are the ones WAIT exists to expose.
                counts["b_exempt_unconfirmed"] += 1
                continue
            how = "confirmed" if not a.proved else "confirmed (by a later renewal)"
            out.append(
                Violation(
                    "b",
                    f"{key}: {b.get('proc')} granted token {b['token']} fence {b['fence']} "
                    f"at {h.at(b['t0'])} after {a.proc}'s {how} grant of token "
                    f"{a.token} fence {a.fence} completed at {h.at(end(a.acquire))}",
                    [a.acquire, b],
                )
            )


# --- (c) confirmed holds survive -----------------------------------------------------


def _check_confirmed_holds(h: _History, counts: dict, out: list[Violation]) -> None:
    """A renew answered 0 by a node primary throughout the call, while the grant was
    certainly live (before its confirmed deadline, or before a confirmed renewal answered
    1 later; for a hold bound to a session, while that session grant was), is a lost
    confirmed hold."""
    for g in h.grants:
        if g.bound and (g.session is None or not g.session.durable):
            counts["c_session_unknown"] += g.session is None
        renewed_elsewhere = False
        for e in g.ops:
            if e["type"] != "renew" or result(e) not in ("0", "1") or e["t0"] >= g.ended:
                continue
            if result(e) == "1" and e.get("node") != g.acquire.get("node"):
                counts["renews_on_new_primary"] += 1
                renewed_elsewhere |= is_confirmed(g.acquire)
            if not end(e) < g.live_until:
                continue
            if not _answered_by_primary(h, e):
                counts["c_exempt_not_primary"] += result(e) == "0"
                continue
            counts["c_checked"] += 1
            counts["c_checked_bound"] += g.bound
            if result(e) == "1":
                continue
            w = g.witness
            window = (min(w["t0"], e["t0"]), max(end(w), end(e)))
            if h.clock_stepped(e.get("shard"), *window):
                counts["c_exempt_clock"] += 1
            else:
                out.append(_lost_hold(h, g, e))
        counts["confirmed_renewed_on_new_primary"] += renewed_elsewhere


def _answered_by_primary(h: _History, e: dict) -> bool:
    return h.primaries.held_throughout(
        e.get("shard"), e.get("node"), e["t0"] - PRIMARY_MARGIN_S, end(e) + PRIMARY_MARGIN_S
    )


def _shown_live(h: _History, g: Grant) -> str:
    w = g.witness
    if w is None:
        return "?"
    whose = "its" if w.get("key") == g.key else f"its session {w.get('key')}'s"
    return f"{whose} {w['type']} at {h.at(w['t0'])}"


def _lost_hold(h: _History, g: Grant, e: dict) -> Violation:
    return Violation(
        "c",
        f"{g.key}: {e.get('proc')}'s token {g.token} was confirmed live until "
        f"{h.at(g.live_until)} by {_shown_live(h, g)}, but {e.get('node')}, primary of "
        f"{e.get('shard')} throughout, answered its renew 0 at {h.at(e['t0'])}..{h.at(end(e))}",
        [g.witness, e],
    )


# --- (d) no crash --------------------------------------------------------------------


def killed_pids(f: dict) -> set[str]:
    detail = f.get("detail") or {}
    return {str(p) for p in [detail.get("pid"), *(detail.get("pids") or [])] if p is not None}


def _check_crashes(h: _History, counts: dict, out: list[Violation]) -> None:
    kills = [f for f in h.faults if f.get("kind") in KILLS]
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
                if e.get("node") in str(f.get("target")).split(",")
                and str(e.get("pid")) in killed_pids(f)
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
                    f"{h.at(e['t'])}, and no injected kill killed it",
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


# --- (f) mutual exclusion ------------------------------------------------------------


def _check_mutual_exclusion(h: _History, counts: dict, out: list[Violation]) -> None:
    """Two confirmed grants of different tokens on one key, one of them exclusive, are
    never both certainly live at the same moment: each from its acquire's completion
    until it was certainly live (see `_settle`), less the clock margin, and until its
    first release was invoked."""
    spans: dict[str, list[tuple[float, float, Grant]]] = defaultdict(list)
    for g in h.grants:
        if not g.durable:
            counts["f_holds_unconfirmed"] += 1
            continue
        began, until = end(g.acquire), g.live_until - CLOCK_MARGIN_S
        if until > began:
            counts["f_holds_judged"] += 1
            spans[g.key].append((began, until, g))
    for key, found in spans.items():
        found.sort(key=lambda s: s[0])
        live: list[tuple[float, float, Grant]] = []
        for began, until, b in found:
            live = [s for s in live if s[1] > began]
            for _, a_until, a in live:
                if a.token == b.token or not (a.exclusive or b.exclusive):
                    continue
                overlap = (began, min(a_until, until))
                shown = [x for g in (a, b) for x in (g.acquire, g.witness) if x is not None]
                if h.clock_stepped(b.acquire.get("shard"), min(x["t0"] for x in shown), overlap[1]):
                    counts["f_exempt_clock"] += 1
                    continue
                out.append(
                    Violation(
                        "f",
                        f"{key}: {a.proc}'s {_mode(a)} token {a.token} fence {a.fence}, "
                        f"granted by {h.at(end(a.acquire))} and confirmed "
                        f"live until {h.at(a.live_until)} by {_shown_live(h, a)}, and "
                        f"{b.proc}'s {_mode(b)} token {b.token} fence {b.fence}, granted by "
                        f"{h.at(end(b.acquire))} and confirmed live until "
                        f"{h.at(b.live_until)} by {_shown_live(h, b)}, were both held "
                        f"{h.at(overlap[0])}..{h.at(overlap[1])}",
                        [a.acquire, b.acquire],
                    )
                )
            live.append((began, until, b))


def _mode(g: Grant) -> str:
    return "exclusive" if g.exclusive else "shared"


# --- (g) fences never go down --------------------------------------------------------


def _check_fence_order(h: _History, counts: dict, out: list[Violation]) -> None:
    """On each resource, no fenced operation (write, register or read) is accepted below a
    fence accepted before it was invoked:
    - by the same node, with no restart or change of role of that node in between (its
      data is then the same data, whose record only rises);
    - by any node, when the earlier one was confirmed by WAIT (every replica has its
      record, so every later primary has it) and the later one was confirmed too, or is
      in the final log;
    - for the SQLite file, ever (one file; this judges the application's check).
    Below an unconfirmed fence of another primary is allowed and counted: that fence was
    accepted by a primary that lost the failover, and was lost with it."""
    kept = {
        where: {value for _, value in log.get("entries") or []} for where, log in h.logs.items()
    }
    accepted: dict[tuple, list[dict]] = defaultdict(list)
    for w in h.ops:
        if w["type"] != "write":
            continue
        where = (w.get("kind"), w.get("resource"))
        in_log = has_value(w) and w["value"] in kept.get(where, ())
        if result(w) == "ok" or in_log:
            accepted[where].append(w)
    resets = _node_resets(h)
    for where, ops in accepted.items():
        in_log = kept.get(where, set())
        ok = [x for x in ops if result(x) == "ok"]
        if where[0] == "sqlite":
            counts["g_judged_sqlite"] += len(ops)
            for y, x in _higher_before(ok, ops, lambda _: 0, lambda _: 0):
                out.append(_went_down(h, where, y, x, "in the same file"))
            continue
        counts["g_judged_redis"] += len(ops)
        flagged: set[int] = set()
        on_node = [y for y in ops if y.get("node") and result(y) == "ok"]
        counts["g_judged_redis_node"] += len(on_node)
        for y, x in _higher_before(
            on_node,
            on_node,
            lambda x: (x["node"], resets.ended_by(x["node"], x["t0"])),
            lambda y: (y["node"], resets.begun_before(y["node"], end(y))),
        ):
            flagged.add(id(y))
            out.append(_went_down(h, where, y, x, f"by the same node, {resets.how}"))
        confirmed = [x for x in ok if is_confirmed(x)]
        for y, x in _higher_before(confirmed, ops, lambda _: 0, lambda _: 0):
            if id(y) in flagged:
                continue
            flagged.add(id(y))
            if is_confirmed(y) or (has_value(y) and y["value"] in in_log):
                how = "confirmed" if is_confirmed(y) else "kept in the final log"
                out.append(_went_down(h, where, y, x, f"after it was confirmed; this one {how}"))
            else:
                counts["g_exempt_unkept"] += 1
        for y, _x in _higher_before(ok, ops, lambda _: 0, lambda _: 0):
            counts["g_exempt_unconfirmed"] += id(y) not in flagged
    if not h.node_states and accepted:
        h.not_judged["g"].append(
            "a node's data taken as unchanged unless it was seen promoted or killed: the "
            "history has no replication identities of the nodes (format 1)"
        )


class _Resets:
    """When each node's data may have been replaced: a restart, or a change of role or of
    replication ID, each as an interval (a, b] it happened in. Format 2 has the nodes'
    replication identities as the observer polled them; format 1 only the observer's
    promotions (taken as possibly up to PRIMARY_MARGIN_S before they were seen) and the
    kills."""

    def __init__(self, spans: dict[str, list[tuple[float, float]]], how: str):
        self.began = {node: sorted(a for a, _ in s) for node, s in spans.items()}
        self.ended = {node: sorted(b for _, b in s) for node, s in spans.items()}
        self.how = how

    def ended_by(self, node: str, t: float) -> int:
        return bisect_right(self.ended.get(node, []), t)

    def begun_before(self, node: str, t: float) -> int:
        # Two operations are on the same data when no reset (a, b] has a < later.t1 and
        # b > earlier.t0: then the count begun before the one equals that ended by the other.
        return bisect_left(self.began.get(node, []), t)


def _node_resets(h: _History) -> _Resets:
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for f in h.faults:
        if f.get("kind") in DATA_KILLS and killed_pids(f):
            spans[f.get("target")].append((start(f), end(f)))
    if h.node_states:
        last: dict[str, dict] = {}
        for e in h.node_states:
            node = e.get("node")
            before = last.get(node)
            if before is None:
                spans[node].append((-math.inf, e["t"]))
            else:
                since = e.get("since")
                spans[node].append((before["t"] if since is None else since, e["t"]))
            last[node] = e
        how = "with no restart or change of its role or replication ID between"
    else:
        for node, times in h.primaries.promotions().items():
            spans[node] += [(t - PRIMARY_MARGIN_S, t) for t in times]
        how = "not seen promoted or killed between"
    return _Resets(spans, how)


def _higher_before(xs: list[dict], ys: list[dict], group_x, group_y):
    """Each y with the x of its group of the highest fence among those completed before y
    was invoked, where that fence is above y's."""
    by_group: dict = defaultdict(list)
    for x in xs:
        by_group[group_x(x)].append(x)
    queries: dict = defaultdict(list)
    for y in ys:
        queries[group_y(y)].append(y)
    for group, asked in queries.items():
        done = sorted(by_group.get(group, []), key=end)
        i, best = 0, None
        for y in sorted(asked, key=lambda e: e["t0"]):
            while i < len(done) and end(done[i]) < y["t0"]:
                if best is None or done[i]["fence"] > best["fence"]:
                    best = done[i]
                i += 1
            if best is not None and best["fence"] > y["fence"]:
                yield y, best


def _went_down(h: _History, where: tuple, y: dict, x: dict, how: str) -> Violation:
    def who(e: dict) -> str:
        node = f" by {e['node']}" if e.get("node") else ""
        return (
            f"{e.get('proc')}'s {describe(e)} fence {e['fence']} accepted{node} "
            f"{h.at(e['t0'])}..{h.at(end(e))}"
        )

    return Violation("g", f"{where[0]} {where[1]}: {who(y)}, below {who(x)}, {how}", [x, y])


# --- (h) stale replies are true ------------------------------------------------------


def _check_stale_replies(h: _History, counts: dict, out: list[Violation]) -> None:
    """A refusal as stale names the resource's highest fence (redis: `STALE fencing token
    <fence> is older than <highest>`; sqlite: the fence its row held): that fence is above
    the one refused, and some holder presented it to that resource (an operation answered
    ok or indeterminate) before the refusal completed."""
    presented: dict[tuple, list[float]] = defaultdict(list)
    for w in h.ops:
        if w["type"] == "write" and result(w) in ("ok", "error"):
            presented[(w.get("kind"), w.get("resource"), w.get("fence"))].append(w["t0"])
    for times in presented.values():
        times.sort()
    for w in h.ops:
        if w["type"] != "write" or result(w) != "stale":
            continue
        kind, resource = w.get("kind"), w.get("resource")
        if kind == "redis":
            named = STALE_REPLY.match(w.get("error") or "")
            if named is None:
                out.append(
                    Violation(
                        "h",
                        f"redis {resource}: {w.get('proc')}'s {describe(w)} fence "
                        f"{w.get('fence')} was answered stale with {w.get('error')!r}",
                        [w],
                    )
                )
                continue
            refused, highest = int(named[1]), int(named[2])
        elif w.get("highest") is None:
            counts["h_unjudged_sqlite"] += 1
            continue
        else:
            refused, highest = w.get("fence"), int(w["highest"])
        counts[f"h_judged_{kind}"] = counts.get(f"h_judged_{kind}", 0) + 1
        why = None
        if refused != w.get("fence"):
            why = f"names fence {refused}, not the {w.get('fence')} it was sent"
        elif highest <= refused:
            why = f"names {highest} as the highest, which is not above it"
        elif bisect_left(presented.get((kind, resource, highest), []), end(w)) == 0:
            why = f"names {highest} as the highest, which no holder had presented to it"
        if why is not None:
            out.append(
                Violation(
                    "h",
                    f"{kind} {resource}: the refusal of {w.get('proc')}'s {describe(w)} fence "
                    f"{w.get('fence')} at {h.at(w['t0'])}..{h.at(end(w))} {why}",
                    [w],
                )
            )
    if counts["h_unjudged_sqlite"]:
        h.not_judged["h"].append(
            f"{counts['h_unjudged_sqlite']} sqlite refusals: the history does not record the "
            "fence SQLite held (format 1)"
        )


# --- (i) history complete ------------------------------------------------------------


def _check_complete(h: _History, counts: dict, out: list[Violation]) -> None:
    """Every resource of the run has its final logs; every operation a worker invoked
    completed, or was recorded as indeterminate when its worker was killed; no operation
    is missing from a worker's numbered sequence."""
    tags = h.run.get("tags")
    if tags is None:
        h.not_judged["i"].append("final logs: the run header lists no resources")
    else:
        for tag in tags:
            for where in (("redis", f"res:{{{tag}}}"), ("sqlite", tag)):
                if where in h.logs:
                    counts["i_logs_judged"] += 1
                else:
                    out.append(
                        Violation("i", f"no final log of the {where[0]} resource {where[1]}")
                    )
    if h.format < 2:
        h.not_judged["i"].append(
            "operations: the history records no invocations or worker exits (format 1)"
        )
        return

    def missing(what: str, events=()) -> None:
        out.append(Violation("i", what, list(events)))

    invoked: dict[str, dict[int, dict]] = defaultdict(dict)
    for e in h.invokes:
        invoked[e.get("proc")][e.get("n")] = e
    done: dict[str, dict[int, dict]] = defaultdict(dict)
    for e in h.ops:
        n = e.get("n")
        if n is None:
            missing(f"{e.get('proc')}'s {e['type']} at {h.at(e['t0'])} has no sequence number", [e])
        elif n in done[e.get("proc")]:
            missing(f"{e.get('proc')}'s operation #{n} is in the history twice", [e])
        else:
            done[e.get("proc")][n] = e
    workers = [f"w{i}" for i in range(int(h.run.get("workers") or 0))]
    for worker in sorted(set(workers) | set(invoked) | set(done), key=str):
        exit_ = h.worker_exits.get(worker)
        if exit_ is None:
            missing(f"{worker}: no exit of the worker recorded")
        ending = h.worker_ends.get(worker)
        if ending is None and exit_ is not None and exit_.get("status") == 0:
            missing(f"{worker} exited 0, and its last record (worker_end) is missing")
        mine, asked = done.get(worker, {}), invoked.get(worker, {})
        for n, e in sorted(asked.items()):
            if n not in mine:
                missing(
                    f"{worker}'s {e.get('op')} #{n} invoked at {h.at(e['t0'])} has no "
                    "completion, and is not recorded as indeterminate",
                    [e],
                )
        for n, e in sorted(mine.items()):
            if e["type"] != "abandon" and n not in asked:
                missing(f"{worker}'s {e['type']} #{n} at {h.at(e['t0'])} was never invoked", [e])
        count = ending.get("ops") if ending is not None else max([*mine, *asked], default=-1) + 1
        gaps = sorted(set(range(count)) - set(mine) - set(asked))
        if gaps:
            shown = ", ".join(f"#{n}" for n in gaps[:5]) + (" ..." if len(gaps) > 5 else "")
            missing(f"{worker}: {len(gaps)} operations missing from the history ({shown})")
        counts["i_ops_judged"] += len(mine)
        counts["i_ops_unfinished"] += sum(bool(e.get("unfinished")) for e in mine.values())


# --- command line --------------------------------------------------------------------

SHOWN_PER_RULE = 20


def format_result(name: str, res: Result) -> str:
    ruled = {k for entries in RULE_COUNTS.values() for k, _ in entries}
    general = [k for k in res.counts if k not in ruled and not k.startswith("violations")]
    width = max(map(len, general))
    lines = [f"{name} (history format {res.run.get('format', 1)})"]
    lines += [f"  {k:<{width}}  {res.counts[k]:>9,}" for k in general]
    for rule in RULES:
        found = [v for v in res.violations if v.rule == rule]
        lines.append(f"  ({rule}) {RULE_NAMES[rule]}: {len(found)} violations")
        lines += [
            f"      {label:<60}  {res.counts.get(k, 0):>9,}" for k, label in RULE_COUNTS[rule]
        ]
        lines += [f"      not judged: {why}" for why in res.not_judged.get(rule, [])]
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
