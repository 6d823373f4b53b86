"""The checker proves (a) to (i) of HISTORY.md: a clean history passes with the expected
counts, and each doctored one fails with the rule it breaks named.

Histories are written in code, times in seconds since the run started. The `doctor_*`
functions break any history (a synthetic run here, a recorded one in histories/) the
same generic way, so a recorded run can be checked clean and then doctored.
"""

from __future__ import annotations

import bisect
import functools
import gzip
import itertools
import json
import math
import random
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

import pytest

from lease_chaos import checker, report

T0 = 1_700_000_000.0
P1, P2 = "127.0.0.1:7001", "127.0.0.1:7002"
SHARD = "mymaster"
HISTORIES = Path(__file__).parent / "histories"


# --- events ---------------------------------------------------------------------------


def run(t1=60.0, **fields):
    return {
        "type": "run",
        "proc": "observer",
        "server": "redis-7.0",
        "topology": "sentinel",
        "t0": T0,
        "t1": T0 + t1,
        "workers": 6,
        "replicas": 2,
        "seed": 1,
        **fields,
    }


def op(type_, worker, key, t0, t1=None, *, node=P1, shard=SHARD, **fields):
    return {
        "type": type_,
        "proc": worker,
        "t0": T0 + t0,
        "t1": T0 + (t0 + 0.01 if t1 is None else t1),
        "node": node,
        "shard": shard,
        "key": key,
        **fields,
    }


def acquire(
    worker, key, token, fence, t0, t1=None, *, ttl=5000, acked=2, need=2, result="ok", **fields
):
    fields.setdefault("session", None)
    fields.setdefault("mode", "x")
    return op(
        "acquire",
        worker,
        key,
        t0,
        t1,
        token=token,
        ttl=ttl,
        block=None,
        result=result,
        fence=fence if result == "ok" else None,
        acked=acked,
        need=need,
        **fields,
    )


def renew(worker, key, token, t0, t1=None, *, result=1, ttl=5000, acked=2, need=2, **fields):
    return op(
        "renew",
        worker,
        key,
        t0,
        t1,
        token=token,
        ttl=ttl,
        result=result,
        acked=acked,
        need=need,
        **fields,
    )


def release(worker, key, token, t0, t1=None, *, result=1, **fields):
    return op("release", worker, key, t0, t1, token=token, result=result, **fields)


def write(worker, key, token, fence, value, t0, t1=None, *, kind, resource, result="ok", **fields):
    fields.setdefault("register", False)
    if result == "stale" and kind == "redis":
        fields.setdefault("error", f"STALE fencing token {fence} is older than {fields['highest']}")
        del fields["highest"]
    return op(
        "write",
        worker,
        key,
        t0,
        t1,
        token=token,
        fence=fence,
        value=value,
        kind=kind,
        resource=resource,
        result=result,
        **fields,
    )


def abandon(worker, key, token, t0, reason="deadline passed", **fields):
    return op("abandon", worker, key, t0, token=token, reason=reason, **fields)


def primary(t, node, shard=SHARD):
    return {"type": "primary", "proc": "observer", "t": T0 + t, "shard": shard, "node": node}


def fault(kind, target, t0, t1, **detail):
    return {
        "type": "fault",
        "proc": "nemesis",
        "kind": kind,
        "target": target,
        "t0": T0 + t0,
        "t1": T0 + t1,
        "detail": detail,
    }


def server_exit(t, node, pid, status=-9):
    return {
        "type": "server_exit",
        "proc": "observer",
        "t": T0 + t,
        "node": node,
        "pid": pid,
        "status": status,
    }


def crash_log(t, node, line):
    return {"type": "crash_log", "proc": "observer", "t": T0 + t, "node": node, "line": line}


def resource_log(kind, resource, entries):
    return {
        "type": "resource_log",
        "proc": "final",
        "kind": kind,
        "resource": resource,
        "entries": [list(e) for e in entries],
    }


def by_time(events):
    return sorted(events, key=checker.start)


def find(events, **fields):
    """The one event with all these fields (times relative to the run's start)."""
    found = [e for e in events if all(e.get(k) == v for k, v in fields.items())]
    assert len(found) == 1, (fields, found)
    return found[0]


def rules(res):
    return sorted(res.rules())


# --- a clean history ------------------------------------------------------------------


def clean_history():
    """Two workers take turns on k1 across a failover; three are paused past their lease
    on k2, k3 and k4 (rejected, abandoned, late but unopposed); a primary is killed."""
    return by_time(
        [
            run(t1=12.0),
            primary(0.0, P1),
            acquire("w1", "k1", "a1", 10, 1.0),
            write("w1", "k1", "a1", 10, None, 1.02, kind="sqlite", resource="s1", register=True),
            write("w1", "k1", "a1", 10, "w1:1", 1.05, kind="redis", resource="r1"),
            acquire("w2", "k1", "b0", None, 1.2, result="nil"),
            renew("w1", "k1", "a1", 1.5),
            write("w1", "k1", "a1", 10, "w1:2", 1.6, kind="sqlite", resource="s1"),
            release("w1", "k1", "a1", 2.0),
            acquire("w2", "k1", "b1", 11, 2.5),
            write("w2", "k1", "b1", 11, "w2:1", 2.6, kind="redis", resource="r1"),
            fault("manual_failover", SHARD, 2.9, 3.1),
            primary(3.0, P2),
            renew("w2", "k1", "b1", 4.5, node=P2),
            write("w2", "k1", "b1", 11, "w2:2", 4.6, kind="sqlite", resource="s1", node=P2),
            release("w2", "k1", "b1", 4.8, node=P2),
            # w3 is paused past its lease, w4 takes k2 over, w3's late write is rejected.
            acquire("w3", "k2", "c1", 20, 5.0, ttl=1000, node=P2),
            write("w3", "k2", "c1", 20, "w3:1", 5.1, kind="redis", resource="r2", node=P2),
            fault("pause_worker", "w3", 5.2, 8.0),
            acquire("w4", "k2", "d1", 21, 6.5, node=P2),
            write("w4", "k2", "d1", 21, "w4:1", 6.6, kind="redis", resource="r2", node=P2),
            release("w4", "k2", "d1", 6.7, node=P2),
            write(
                "w3",
                "k2",
                "c1",
                20,
                "w3:2",
                8.1,
                kind="redis",
                resource="r2",
                node=P2,
                result="stale",
                highest=21,
            ),
            abandon("w3", "k2", "c1", 8.2),
            # w5 is paused past its lease and abandons it without writing.
            acquire("w5", "k3", "e1", 30, 5.0, ttl=1000, node=P2),
            fault("pause_worker", "w5", 5.2, 8.0),
            abandon("w5", "k3", "e1", 8.1),
            # w6 (an unconfirmed grant) writes late, but nobody took k4 meanwhile.
            acquire("w6", "k4", "f1", 40, 5.0, ttl=1000, node=P2, acked=1),
            fault("pause_worker", "6", 5.2, 8.0),
            write("w6", "k4", "f1", 40, "w6:1", 8.1, kind="sqlite", resource="s4", node=P2),
            fault("kill_primary", P1, 9.0, 9.5, pid=4242),
            server_exit(9.01, P1, 4242),
            fault("clock_step", P2, 10.0, 11.0, offset_s=5),
            resource_log("redis", "r1", [(10, "w1:1"), (11, "w2:1")]),
            resource_log("sqlite", "s1", [(10, "w1:2"), (11, "w2:2")]),
            resource_log("redis", "r2", [(20, "w3:1"), (21, "w4:1")]),
            resource_log("sqlite", "s4", [(40, "w6:1")]),
        ]
    )


CLEAN_COUNTS = {
    "grants": 6,
    "confirmed_grants": 5,
    "acquires_nil": 1,
    "renewals": 2,
    "fenced_writes_accepted_redis": 4,
    "fenced_writes_accepted_sqlite": 3,
    "registers_accepted_sqlite": 1,
    "stale_rejected_redis": 1,
    "fenced_indeterminate": 0,
    "redis_writes_lost": 0,
    "failovers": 1,
    "faults_pause_worker": 3,
    "faults_manual_failover": 1,
    "faults_kill_primary": 1,
    "faults_clock_step": 1,
    "faults_client_pause": 0,
    "workers_paused_past_lease": 3,
    "paused_abandoned": 1,
    "paused_rejected": 1,
    "paused_late_unopposed": 1,
    "confirmed_renewed_on_new_primary": 1,
    "renews_on_new_primary": 1,
    "c_checked": 2,
    "c_exempt_clock": 0,
    "server_exits_injected": 1,
    "f_holds_judged": 5,
    "f_holds_unconfirmed": 1,
    "g_judged_redis": 4,
    "g_judged_sqlite": 4,
    "h_judged_redis": 1,
    "violations": 0,
}


def test_clean_history_passes_with_its_counts():
    res = checker.check(clean_history())
    assert res.violations == []
    assert {k: res.counts[k] for k in CLEAN_COUNTS} == CLEAN_COUNTS
    assert res.run["server"] == "redis-7.0"


def test_load_reads_jsonl_and_gzip(tmp_path):
    events = clean_history()
    text = "".join(json.dumps(e) + "\n" for e in events)
    (tmp_path / "history.jsonl").write_text(text + "\n")
    with gzip.open(tmp_path / "history.jsonl.gz", "wt") as f:
        f.write(text)
    assert checker.load(tmp_path / "history.jsonl") == events
    assert checker.load(str(tmp_path / "history.jsonl.gz")) == events


def test_main_exits_1_on_a_violation(tmp_path, capsys):
    clean, bad = tmp_path / "clean.jsonl", tmp_path / "bad.jsonl"
    clean.write_text("".join(json.dumps(e) + "\n" for e in clean_history()))
    doctored = clean_history() + [crash_log(11.5, P2, "=== REDIS BUG REPORT START ===")]
    bad.write_text("".join(json.dumps(e) + "\n" for e in doctored))
    assert checker.main([str(clean)]) == 0
    assert checker.main([str(clean), str(bad)]) == 1
    out = capsys.readouterr().out
    assert "violations of (d) no crash: 1" in out
    assert "REDIS BUG REPORT" in out


# --- (a) no stale write ---------------------------------------------------------------


def replace_log(events, resource, entries):
    log = find(events, type="resource_log", resource=resource)
    log["entries"] = [list(e) for e in entries]
    return events


def test_a_stale_write_accepted_in_a_redis_log():
    events = clean_history()
    find(events, value="w3:2")["result"] = "ok"
    replace_log(events, "r2", [(20, "w3:1"), (21, "w4:1"), (20, "w3:2")])
    res = checker.check(events)
    assert "a" in res.rules()
    [stale] = [v for v in res.violations if v.rule == "a"]
    assert "'w3:2' fence 20 accepted after 'w4:1' fence 21" in stale.message
    assert find(events, value="w3:2") in stale.events


def test_a_stale_write_accepted_in_a_sqlite_log():
    events = clean_history()
    replace_log(events, "s1", [(11, "w2:2"), (10, "w1:2")])
    res = checker.check(events)
    assert rules(res) == ["a"]
    assert "sqlite s1: entry 1 'w1:2' fence 10 accepted after 'w2:2' fence 11" in str(
        res.violations[0]
    )


def test_a_fences_may_repeat_in_a_log():
    events = clean_history()
    events.append(write("w2", "k1", "b1", 11, "w2:3", 4.7, kind="redis", resource="r1"))
    replace_log(events, "r1", [(10, "w1:1"), (11, "w2:1"), (11, "w2:3")])
    assert checker.check(events).ok


@pytest.mark.parametrize(
    "entry, why",
    [
        ((11, "w9:9"), "no write of the history"),
        ((20, "w3:2"), "answered stale"),  # a rejected write, in the log all the same
        ((12, "w2:1"), "fence 11 answered ok"),  # the value of another fence
        ((11, "w2:2"), "no write of the history"),  # another resource's write
    ],
)
def test_a_phantom_entry(entry, why):
    # w3:2 was written to r2, the other entries' values to r1 (w2:2 only to sqlite s1).
    if entry[1] == "w3:2":
        events = replace_log(clean_history(), "r2", [(20, "w3:1"), (21, "w4:1"), entry])
    else:
        events = replace_log(clean_history(), "r1", [(10, "w1:1"), (11, "w2:1"), entry])
    res = checker.check(events)
    assert "a" in res.rules()
    phantoms = [v for v in res.violations if "phantom" in v.message]
    assert len(phantoms) == 1 and why in phantoms[0].message


def test_a_indeterminate_write_may_be_in_the_log():
    events = clean_history()
    find(events, value="w2:1")["result"] = "error"
    assert checker.check(events).ok


def test_a_sqlite_ok_write_missing_from_its_log():
    events = replace_log(clean_history(), "s1", [(10, "w1:2")])
    res = checker.check(events)
    assert rules(res) == ["a"]
    assert "'w2:2' fence 11 answered ok at 4.610s is not in the log" in res.violations[0].message


def test_a_redis_ok_write_lost_in_a_failover_is_allowed():
    events = replace_log(clean_history(), "r1", [(11, "w2:1")])
    res = checker.check(events)
    assert res.ok
    assert res.counts["redis_writes_lost"] == 1


# --- (b) fences increase --------------------------------------------------------------


def test_b_fence_going_down_after_a_confirmed_grant():
    events = clean_history()
    find(events, type="acquire", token="d1")["fence"] = 19
    res = checker.check(events)
    assert rules(res) == ["b"]
    assert res.violations[0].message == (
        "k2: w4 granted token d1 fence 19 at 6.500s after w3's confirmed grant of token c1 "
        "fence 20 completed at 5.010s"
    )


def test_b_equal_fence_of_another_token_is_a_violation():
    events = clean_history()
    find(events, type="acquire", token="b1")["fence"] = 10
    assert rules(checker.check(events)) == ["b"]


def test_b_after_an_unconfirmed_grant_passes():
    events = clean_history()
    find(events, type="acquire", token="d1")["fence"] = 19
    find(events, type="acquire", token="c1")["acked"] = 1
    assert checker.check(events).ok


def test_b_unconfirmed_grant_below_a_confirmed_fence_is_exempt_and_counted():
    # A failed-over primary that has not heard yet grants from its own sequence; no
    # replica follows it, so WAIT shows the grant unconfirmed.
    events = clean_history()
    acq = find(events, type="acquire", token="d1")
    acq["fence"], acq["acked"] = 19, 0
    res = checker.check(events)
    assert res.ok
    assert res.counts["b_exempt_unconfirmed"] == 1


def test_b_overlapping_grants_are_not_compared():
    # B was invoked before A completed: A's grant may not have happened yet when B's did.
    events = clean_history()
    acq = find(events, type="acquire", token="d1")
    acq["fence"], acq["t0"] = 19, T0 + 5.005
    assert checker.check(events).ok


def test_b_same_token_retry_repeats_its_fence():
    events = clean_history()
    events.append(acquire("w1", "k1", "a1", 10, 1.3))
    res = checker.check(by_time(events))
    assert res.ok
    assert res.counts["grants"] == CLEAN_COUNTS["grants"] + 1


def test_b_compares_with_the_best_fence_of_another_token():
    # Two confirmed tokens: a retry of the best one does not hide the other from B.
    events = by_time(
        [
            primary(0.0, P1),
            acquire("w1", "k", "x", 5, 1.0),
            acquire("w2", "k", "y", 9, 2.0),
            acquire("w2", "k", "y", 9, 3.0),
            acquire("w2", "k", "y", 9, 4.0),
            acquire("w1", "k", "x", 5, 4.0),  # x again: compared with y, fails
        ]
    )
    res = checker.check(events)
    # x's retry at 4.0 says x still held k, inside y's confirmed hold: (f) as well.
    assert rules(res) == ["b", "f"]
    [down] = [v for v in res.violations if v.rule == "b"]
    assert "token x fence 5" in down.message
    assert "token y fence 9" in down.message


# --- (c) confirmed grants survive -----------------------------------------------------


def lost_after_failover(**changes):
    """w2's grant of k1 was confirmed until 7.5s; the new primary answers its renew 0, and
    w2 does not release it."""
    events = clean_history()
    events.remove(find(events, type="release", token="b1"))
    r = find(events, type="renew", token="b1")
    r.update(result=0, **changes)
    return events


def test_c_confirmed_grant_lost_after_a_failover():
    res = checker.check(lost_after_failover())
    assert rules(res) == ["c"]
    assert res.violations[0].message == (
        "k1: w2's token b1 was confirmed live until 7.500s by its acquire at 2.500s, but "
        f"{P2}, primary of {SHARD} throughout, answered its renew 0 at 4.500s..4.510s"
    )
    assert res.counts["c_checked"] == 2


def test_c_renew_answered_by_a_stale_old_primary_passes():
    assert checker.check(lost_after_failover(node=P1)).ok


def test_c_renew_too_close_to_a_failover_passes():
    events = lost_after_failover(t0=T0 + 3.5, t1=T0 + 3.51)
    res = checker.check(events)
    assert res.ok
    assert res.counts["c_checked"] == 1


def test_c_renew_after_a_release_passes():
    events = lost_after_failover()
    events.append(release("w2", "k1", "b1", 4.0, node=P2, result="error"))
    res = checker.check(by_time(events))
    assert res.ok


def test_c_renew_after_the_deadline_passes():
    assert checker.check(lost_after_failover(t0=T0 + 7.45, t1=T0 + 7.55)).ok


def test_c_confirmed_renew_extends_the_deadline():
    events = lost_after_failover(t0=T0 + 8.0, t1=T0 + 8.01)
    events.append(renew("w2", "k1", "b1", 4.2, node=P2))  # confirmed until 9.2s
    assert rules(checker.check(by_time(events))) == ["c"]
    events[-1]["acked"] = 1
    assert checker.check(by_time(events)).ok


@pytest.mark.parametrize("offset", [30, -2], ids=["ahead", "behind-then-corrected"])
def test_c_renew_after_a_clock_step_passes(offset):
    events = lost_after_failover()
    events.append(fault("clock_step", P2, 4.0, 4.505, offset_s=offset, shard=SHARD))
    res = checker.check(by_time(events))
    assert res.ok
    assert res.counts["c_exempt_clock"] == 1


@pytest.mark.parametrize(
    "shard, offset, window",
    [("other", 30, (4.0, 5.0)), (SHARD, 30, (4.6, 5.0)), (SHARD, 0, (4.0, 5.0))],
    ids=["other-shard", "not-overlapping", "no-offset"],
)
def test_c_other_clock_steps_do_not_exempt(shard, offset, window):
    events = lost_after_failover()
    events.append(fault("clock_step", P2, *window, offset_s=offset, shard=shard))
    assert rules(checker.check(by_time(events))) == ["c"]


def test_c_unconfirmed_grant_lost_passes():
    events = lost_after_failover()
    find(events, type="acquire", token="b1")["acked"] = None
    assert checker.check(events).ok


def test_c_bound_hold_of_a_session_not_in_the_history_is_judged_by_its_own_confirmations():
    # Its session's life is unknown: only its own confirmed answers show it live, and the
    # acquire at 2.5s shows nothing after 2.5s.
    events = lost_after_failover()
    find(events, type="acquire", token="b1")["session"] = "{w2}session"
    res = checker.check(events)
    assert res.ok
    assert res.counts["c_session_unknown"] == 1


# --- (d) no crash ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "exit_",
    [server_exit(9.2, P1, 4343), server_exit(9.2, P2, 4242), server_exit(8.9, P1, 4242)],
    ids=["other-pid", "other-node", "before-the-kill"],
)
def test_d_server_exit_without_a_matching_kill(exit_):
    events = clean_history()
    events.remove(find(events, type="server_exit"))
    res = checker.check(by_time([*events, exit_]))
    assert rules(res) == ["d"]
    assert "no injected kill killed it" in res.violations[0].message


@pytest.mark.parametrize(
    "kill",
    [
        fault("kill_replica", P2, 5.0, 7.0, pid=5151),
        fault("kill_rewrite", P2, 5.0, 7.0, pid=5151, rewriting=True),
        fault("kill_sentinels", f"127.0.3.1:7010,{P2}", 5.0, 7.0, pids=[6161, 5151]),
    ],
    ids=["replica", "during-a-rewrite", "sentinels"],
)
def test_d_exits_of_the_new_kills_are_injected(kill):
    # Each kind of kill accounts for the exit it caused, and for no other pid.
    events = clean_history()
    res = checker.check(by_time([*events, kill, server_exit(5.5, P2, 5151)]))
    assert res.ok, res.violations
    assert res.counts["server_exits_injected"] == 2
    res = checker.check(by_time([*events, kill, server_exit(5.5, P2, 5152)]))
    assert rules(res) == ["d"]


def test_d_crash_log():
    res = checker.check(clean_history() + [crash_log(11.5, P2, "Guru Meditation: panic")])
    assert rules(res) == ["d"]
    assert res.violations[0].message == f"{P2} logged a crash at 11.500s: Guru Meditation: panic"


# --- (e) paused holders ---------------------------------------------------------------


def test_e_paused_write_accepted_after_a_higher_fence():
    events = clean_history()
    find(events, value="w3:2")["result"] = "ok"
    replace_log(events, "r2", [(20, "w3:1"), (21, "w4:1"), (20, "w3:2")])
    res = checker.check(events)
    # Accepted after w4's fence 21 on the same node: (g) too.
    assert rules(res) == ["a", "e", "g"]
    [paused] = [v for v in res.violations if v.rule == "e"]
    assert paused.message == (
        "w3 paused 5.200s..8.000s past its lease on k2 (token c1, deadline at most 6.010s) "
        "then wrote 'w3:2' fence 20 at 8.100s, accepted at redis r2 entry 2 after 'w4:1' "
        "fence 21"
    )
    assert res.counts["paused_rejected"] == 0


def test_e_pause_within_the_lease_is_not_classified():
    events = clean_history()
    for token in ("c1", "e1", "f1"):
        find(events, type="acquire", token=token)["ttl"] = 5000
    res = checker.check(events)
    assert res.counts["workers_paused_past_lease"] == 0
    # w3's confirmed hold now lasts until 10s, and w4 was granted k2 at 6.5s.
    assert rules(res) == ["f"]


def test_e_renew_before_the_pause_moves_the_deadline():
    events = clean_history()
    events.append(renew("w5", "k3", "e1", 5.1, node=P2, ttl=5000))
    res = checker.check(by_time(events))
    assert res.counts["workers_paused_past_lease"] == 2
    assert res.counts["paused_abandoned"] == 0


def test_e_grant_released_before_the_pause_is_not_held():
    events = clean_history()
    events.append(release("w6", "k4", "f1", 5.1, node=P2))
    res = checker.check(by_time(events))
    assert res.counts["workers_paused_past_lease"] == 2
    assert res.counts["paused_late_unopposed"] == 0


def test_e_indeterminate_writes_only():
    events = clean_history()
    find(events, value="w3:2")["result"] = "error"
    res = checker.check(events)
    assert res.ok
    assert res.counts["paused_indeterminate"] == 1
    assert res.counts["paused_rejected"] == 0


def session_pause(session_ttl=1000):
    """w7 holds k5 bound to its session {w7}s, and is paused past the session's ttl; w8
    takes k5 meanwhile."""
    return by_time(
        [
            run(t1=12.0),
            primary(0.0, P1),
            acquire("w7", "{w7}s", "s7", 50, 1.0, ttl=session_ttl),
            acquire("w7", "k5", "g1", 51, 1.1, ttl=0, session="{w7}s"),
            fault("pause_worker", "w7", 1.2, 4.0),
            acquire("w8", "k5", "h1", 52, 3.0, ttl=1000),
            write("w8", "k5", "h1", 52, None, 3.1, kind="redis", resource="r5", register=True),
            write(
                "w7",
                "k5",
                "g1",
                51,
                "w7:1",
                4.1,
                kind="redis",
                resource="r5",
                result="stale",
                highest=52,
            ),
            abandon("w7", "k5", "g1", 4.2),
            resource_log("redis", "r5", []),
        ]
    )


def test_e_session_bound_hold_uses_its_session_deadline():
    res = checker.check(session_pause())
    assert res.ok
    # The session itself and the hold bound to it: both past their lease.
    assert res.counts["workers_paused_past_lease"] == 2
    assert res.counts["paused_rejected"] == 1
    assert res.counts["paused_abandoned"] == 1
    assert checker.check(session_pause(session_ttl=10_000)).counts["workers_paused_past_lease"] == 0


def test_e_session_bound_hold_of_an_unknown_session_is_counted_apart():
    events = [e for e in session_pause() if e.get("token") != "s7"]
    res = checker.check(events)
    assert res.counts["paused_session_unknown"] == 1
    assert res.counts["workers_paused_past_lease"] == 0


# --- (a) confirmed writes are kept ----------------------------------------------------


def test_a_confirmed_redis_write_missing_from_the_final_log():
    events = replace_log(clean_history(), "r1", [(11, "w2:1")])
    find(events, value="w1:1").update(acked=2, need=2)
    res = checker.check(events)
    assert rules(res) == ["a"]
    assert "'w1:1' fence 10 answered ok and confirmed by 2 replicas" in res.violations[0].message
    find(events, value="w1:1")["acked"] = 1  # unconfirmed: lost in a failover, counted
    res = checker.check(events)
    assert res.ok and res.counts["redis_writes_lost"] == 1


# --- (b) counting grants a later renewal confirmed ------------------------------------


def test_b_grant_confirmed_by_a_later_renewal_is_judged():
    # c1's grant was not confirmed by its WAIT, but a renewal WAIT confirmed shows it was
    # granted in the data that survives: d1 after it must be above it.
    events = clean_history()
    find(events, type="acquire", token="c1")["acked"] = 1
    events.append(renew("w3", "k2", "c1", 5.1, node=P2, ttl=1000))
    find(events, type="acquire", token="d1")["fence"] = 19
    res = checker.check(by_time(events))
    assert rules(res) == ["b"]
    assert "after w3's confirmed (by a later renewal) grant of token c1 fence 20" in str(
        res.violations[0]
    )
    assert res.counts["b_proved"] == 1


# --- (c) bound holds and sessions -----------------------------------------------------


def bound_hold(*extra):
    """w2's session {w2}s (ttl 3s, confirmed at 1.0s) and its hold on k bound to it (ttl 0,
    confirmed at 1.5s), renewed at 2.5s; everything released at 6.0s."""
    return by_time(
        [
            run(t1=8.0),
            primary(0.0, P1),
            acquire("w2", "{w2}s", "s1", 100, 1.0, ttl=3000),
            acquire("w2", "{w2}k", "h1", 101, 1.5, ttl=0, session="{w2}s"),
            renew("w2", "{w2}k", "h1", 2.5, ttl=0),
            release("w2", "{w2}k", "h1", 6.0),
            release("w2", "{w2}s", "s1", 6.1),
            *extra,
        ]
    )


def test_c_bound_hold_lost_while_its_session_was_confirmed():
    events = bound_hold()
    find(events, type="renew", token="h1")["result"] = 0
    res = checker.check(events)
    assert rules(res) == ["c"]
    assert res.violations[0].message == (
        "{w2}k: w2's token h1 was confirmed live until 4.000s by its session {w2}s's acquire "
        f"at 1.000s, but {P1}, primary of {SHARD} throughout, answered its renew 0 at "
        "2.500s..2.510s"
    )
    assert res.counts["c_checked_bound"] == 1


def test_c_bound_hold_after_its_session_ran_out_passes():
    events = bound_hold()
    r = find(events, type="renew", token="h1")
    r.update(result=0, t0=T0 + 4.5, t1=T0 + 4.51)
    assert checker.check(events).ok


def test_c_session_renewed_after_its_bound_hold_was_lost():
    # The session invariant: the session's renewal answered 1 at 5.0s says every hold bound
    # to it was still held, but its hold was answered 0 at 4.5s.
    events = bound_hold(renew("w2", "{w2}s", "s1", 5.0, ttl=3000))
    r = find(events, type="renew", token="h1")
    r.update(result=0, t0=T0 + 4.5, t1=T0 + 4.51)
    res = checker.check(events)
    assert rules(res) == ["c"]
    assert "confirmed live until 6.000s by its session {w2}s's renew at 5.000s" in str(
        res.violations[0]
    )


def test_c_unconfirmed_grant_renewed_after_it_was_answered_lost():
    # Never revived: a renewal confirmed at 3.0s shows the grant was live at 2.0s.
    events = lost_after_failover()
    find(events, type="acquire", token="b1")["acked"] = 1
    events.append(renew("w2", "k1", "b1", 6.0, node=P2))
    res = checker.check(by_time(events))
    assert rules(res) == ["c"]
    assert "by its renew at 6.000s" in res.violations[0].message


# --- (f) mutual exclusion -------------------------------------------------------------


def two_holds(b_at=3.5, *, a=None, b=None, extra=()):
    """w1 holds k from 1.0s (ttl 5s) until it releases it at 3.0s; w2 is granted k at b_at
    and releases it 0.5s later."""
    return by_time(
        [
            run(t1=10.0),
            primary(0.0, P1),
            acquire("w1", "k", "a", 100, 1.0, **(a or {})),
            release("w1", "k", "a", 3.0),
            acquire("w2", "k", "b", 200, b_at, **(b or {})),
            release("w2", "k", "b", b_at + 0.5),
            *extra,
        ]
    )


def test_f_two_confirmed_exclusive_holds_at_once():
    assert checker.check(two_holds()).ok
    res = checker.check(two_holds(2.0))
    assert rules(res) == ["f"]
    assert res.violations[0].message == (
        "k: w1's exclusive token a fence 100, granted by 1.010s and confirmed live until "
        "3.000s by its acquire at 1.000s, and w2's exclusive token b fence 200, granted by "
        "2.010s and confirmed live until 2.500s by its acquire at 2.000s, were both held "
        "2.010s..2.450s"
    )
    assert res.counts["f_holds_judged"] == 2


def test_f_shared_holds_may_overlap_but_not_with_an_exclusive_one():
    assert checker.check(two_holds(2.0, a={"mode": "s"}, b={"mode": "s"})).ok
    assert rules(checker.check(two_holds(2.0, a={"mode": "s"}))) == ["f"]


def test_f_unconfirmed_hold_is_not_judged():
    res = checker.check(two_holds(2.0, b={"acked": 1}))
    assert res.ok
    assert res.counts["f_holds_unconfirmed"] == 1


def test_f_hold_confirmed_by_a_later_renewal_is_judged():
    res = checker.check(two_holds(2.0, a={"acked": 1}, extra=[renew("w1", "k", "a", 2.6)]))
    assert rules(res) == ["f"]
    assert "confirmed live until 3.000s by its renew at 2.600s" in res.violations[0].message


def test_f_deadline_and_the_clock_margin():
    a = {"ttl": 1500}  # confirmed live until 2.5s
    assert checker.check(two_holds(2.55, a=a)).ok
    assert rules(checker.check(two_holds(2.4, a=a))) == ["f"]


def test_f_clock_step_exempts():
    step = fault("clock_step", P1, 1.5, 2.2, offset_s=2, shard=SHARD)
    res = checker.check(two_holds(2.0, extra=[step]))
    assert res.ok
    assert res.counts["f_exempt_clock"] == 1


def test_f_hold_bound_to_a_session_lives_as_long_as_the_session():
    session = [
        acquire("w1", "{w1}s", "s", 90, 0.5, ttl=1000),
        renew("w1", "{w1}s", "s", 1.2, ttl=1000),  # the session confirmed until 2.2s
    ]
    a = {"ttl": 0, "session": "{w1}s"}
    assert checker.check(two_holds(2.3, a=a, extra=session)).ok
    res = checker.check(two_holds(2.0, a=a, extra=session))
    assert rules(res) == ["f"]
    assert "confirmed live until 2.200s by its session {w1}s's renew at 1.200s" in str(
        res.violations[0]
    )


# --- (g) fences never go down ---------------------------------------------------------


def fenced(*extra):
    """w1 (fence 100) registers and writes r and s; w2 (fence 200) then does the same. All
    on P1; the redis writes and the sqlite ones are in their final logs."""
    events = [
        run(t1=10.0),
        primary(0.0, P1),
        acquire("w1", "k", "a", 100, 1.0),
        acquire("w2", "k", "b", 200, 2.0),
    ]
    for worker, token, fence, t in (("w1", "a", 100, 1.0), ("w2", "b", 200, 2.0)):
        for kind, resource in (("redis", "r"), ("sqlite", "s")):
            events += [
                write(
                    worker,
                    "k",
                    token,
                    fence,
                    None,
                    t + 0.1,
                    kind=kind,
                    resource=resource,
                    register=True,
                ),
                write(
                    worker, "k", token, fence, f"{worker}:1", t + 0.2, kind=kind, resource=resource
                ),
            ]
    events += [
        release("w1", "k", "a", 1.9),
        release("w2", "k", "b", 2.9),
        resource_log("redis", "r", [(100, "w1:1"), (200, "w2:1")]),
        resource_log("sqlite", "s", [(100, "w1:1"), (200, "w2:1")]),
        *extra,
    ]
    return by_time(events)


def late(kind="redis", **fields):
    """w1's write of fence 100 accepted at 2.15s, after w2's register of fence 200."""
    resource = "r" if kind == "redis" else "s"
    return write("w1", "k", "a", 100, "w1:2", 2.15, kind=kind, resource=resource, **fields)


def test_g_write_accepted_after_a_newer_register_on_the_same_node():
    assert checker.check(fenced()).ok
    res = checker.check(fenced(late()))
    assert rules(res) == ["g"]
    assert res.violations[0].message == (
        f"redis r: w1's write 'w1:2' fence 100 accepted by {P1} 2.150s..2.160s, below w2's "
        f"register fence 200 accepted by {P1} 2.100s..2.110s, by the same node, not seen "
        "promoted or killed between"
    )


def test_g_a_read_raises_the_fence_too():
    events = fenced(late())
    find(events, type="write", kind="redis", token="b", register=True).update(
        register=False, read=True
    )
    assert "below w2's read fence 200" in str(checker.check(events).violations[0])


def test_g_sqlite_is_judged_as_the_application():
    events = replace_log(fenced(late("sqlite")), "s", [(100, "w1:1"), (100, "w1:2"), (200, "w2:1")])
    res = checker.check(events)
    assert rules(res) == ["g"]
    assert res.violations[0].message.endswith("in the same file")
    assert res.counts["g_judged_sqlite"] == 5


def test_g_below_an_unconfirmed_fence_of_another_primary_is_counted():
    # A split brain: P1 accepted fence 200 and lost the failover, unconfirmed; P2 then
    # accepted w1's fence 100.
    res = checker.check(fenced(late(node=P2)))
    assert res.ok
    assert res.counts["g_exempt_unconfirmed"] == 1


@pytest.mark.parametrize(
    "fields, violation",
    [({}, []), ({"acked": 2}, ["a", "g"]), ({"kept": True}, ["g"])],
    ids=["unconfirmed-lost", "confirmed", "kept"],
)
def test_g_below_a_confirmed_fence_on_another_node(fields, violation):
    # Confirmed, and not kept, it breaks (a) as well.
    events = fenced(late(node=P2, acked=fields.get("acked", 1), need=2))
    find(events, type="write", kind="redis", token="b", register=True).update(acked=2, need=2)
    if fields.get("kept"):
        replace_log(events, "r", [(100, "w1:1"), (100, "w1:2"), (200, "w2:1")])
    res = checker.check(events)
    assert rules(res) == violation
    assert res.counts["g_exempt_unkept"] == (0 if violation else 1)


@pytest.mark.parametrize(
    "change",
    [
        [primary(1.5, P2), primary(2.12, P1)],
        [fault("kill_primary", P1, 2.11, 2.14, pid=7), server_exit(2.12, P1, 7)],
    ],
    ids=["promoted-again", "restarted"],
)
def test_g_same_node_after_a_restart_or_promotion_is_another_primary(change):
    # Its data may have been replaced: judged as another node's.
    res = checker.check(fenced(late(), *change))
    assert res.ok
    assert res.counts["g_exempt_unconfirmed"] == 1


def node(t, addr, replid, since=None, role="master", run_id="r1"):
    return {
        "type": "node",
        "proc": "observer",
        "t": T0 + t,
        "since": None if since is None else T0 + since,
        "node": addr,
        "run_id": run_id,
        "role": role,
        "replid": replid,
    }


def test_g_uses_the_nodes_replication_identities_where_recorded():
    states = [node(0.0, P1, "x")]
    res = checker.check(fenced(late(), *states))
    assert rules(res) == ["g"]
    assert "with no restart or change of its role or replication ID between" in str(
        res.violations[0]
    )
    assert "g" not in res.not_judged
    # P1 was demoted and promoted again between the two: another replication ID.
    states.append(node(2.13, P1, "y", since=2.12))
    assert checker.check(fenced(late(), *states)).ok


# --- (h) stale replies are true -------------------------------------------------------


def stale(kind="redis", **fields):
    resource = "r" if kind == "redis" else "s"
    fields.setdefault("highest", 200)
    return write(
        "w1", "k", "a", 100, "w1:2", 2.5, kind=kind, resource=resource, result="stale", **fields
    )


def test_h_stale_reply_names_a_presented_higher_fence():
    res = checker.check(fenced(stale(), stale("sqlite")))
    assert res.ok
    assert (res.counts["h_judged_redis"], res.counts["h_judged_sqlite"]) == (1, 1)


@pytest.mark.parametrize(
    "fields, why",
    [
        ({"highest": 150}, "names 150 as the highest, which no holder had presented to it"),
        ({"highest": 100}, "names 100 as the highest, which is not above it"),
        ({"error": "STALE fencing token 99 is older than 200"}, "names fence 99, not the 100"),
        ({"error": "ERR something else"}, "was answered stale with 'ERR something else'"),
    ],
    ids=["unpresented", "not-above", "other-fence", "unreadable"],
)
def test_h_untrue_stale_reply(fields, why):
    res = checker.check(fenced(stale(**fields)))
    assert rules(res) == ["h"]
    assert why in res.violations[0].message


def test_h_register_dropped_while_a_stale_reply_cites_its_fence():
    events = fenced(stale())
    events.remove(find(events, type="write", kind="redis", token="b", register=True))
    events.remove(find(events, type="write", kind="redis", value="w2:1"))
    events.remove(find(events, type="resource_log", resource="r"))
    res = checker.check(events + [resource_log("redis", "r", [(100, "w1:1")])])
    assert rules(res) == ["h"]


def test_h_sqlite_refusal_without_the_fence_it_held_is_not_judged_and_said():
    events = fenced(stale("sqlite"))
    del find(events, result="stale")["highest"]
    res = checker.check(events)
    assert res.ok
    assert res.counts["h_unjudged_sqlite"] == 1
    assert "format 1" in res.not_judged["h"][0]


# --- (i) history complete -------------------------------------------------------------


def as_format_2(events):
    """The history as the harness records it now: each worker's operations numbered, each
    invoked, each worker's last record and exit, and the header's format."""
    out, counts = [], defaultdict(int)
    for e in by_time(events):
        if e.get("type") in checker.WORKER_OPS:
            e = {**e, "n": counts[e["proc"]]}
            counts[e["proc"]] += 1
            if e["type"] != "abandon":
                out.append({**e, "type": "invoke", "op": e["type"]})
        out.append(e)
    header = find(out, type="run")
    workers = max(int(w[1:]) for w in counts) + 1
    out[out.index(header)] = {**header, "format": 2, "workers": workers}
    t = header["t1"]
    for worker in (f"w{i}" for i in range(workers)):
        out.append({"type": "worker_end", "proc": worker, "t": t, "ops": counts[worker]})
        out.append({"type": "worker_exit", "proc": "run", "worker": worker, "status": 0, "t": t})
    return out


def test_i_final_log_missing():
    events = fenced(find(fenced(), type="run") | {"tags": ["x"]})
    events = [e for e in events if not (e.get("type") == "run" and "tags" not in e)]
    res = checker.check(events)
    assert rules(res) == ["i"]
    assert [v.message for v in res.violations] == [
        "no final log of the redis resource res:{x}",
        "no final log of the sqlite resource x",
    ]


def test_i_format_1_operations_are_not_judged_and_said():
    res = checker.check(clean_history())
    assert res.ok
    assert any("no invocations" in why for why in res.not_judged["i"])


def test_i_complete_format_2_history():
    res = checker.check(as_format_2(clean_history()))
    assert res.ok
    assert res.counts["i_ops_judged"] == len(
        [e for e in clean_history() if "proc" in e and e["proc"].startswith("w")]
    )
    assert not any("operations" in why for why in res.not_judged["i"])


def test_i_completion_dropped():
    events = as_format_2(clean_history())
    events.remove(find(events, type="renew", token="a1"))
    res = checker.check(events)
    assert rules(res) == ["i"]
    assert res.violations[0].message == (
        "w1's renew #3 invoked at 1.500s has no completion, and is not recorded as indeterminate"
    )


def test_i_operation_dropped_with_its_invocation():
    events = as_format_2(clean_history())
    events = [e for e in events if e.get("token") != "a1" or e.get("op", e["type"]) != "renew"]
    res = checker.check(events)
    assert rules(res) == ["i"]
    assert res.violations[0].message == "w1: 1 operations missing from the history (#3)"


def test_i_unfinished_operation_of_a_killed_worker_is_indeterminate():
    events = as_format_2(clean_history())
    renewal = find(events, type="renew", token="a1")
    events[events.index(renewal)] = {
        **renewal,
        "result": "error",
        "t1": None,
        "unfinished": True,
        "error": "no reply",
    }
    exit_ = find(events, type="worker_exit", worker="w1")
    events[events.index(exit_)] = {**exit_, "status": -9}
    events.remove(find(events, type="worker_end", proc="w1"))
    res = checker.check(events)
    assert res.ok
    assert res.counts["i_ops_unfinished"] == 1


@pytest.mark.parametrize(
    "drop, why",
    [
        ({"type": "worker_exit", "worker": "w2"}, "w2: no exit of the worker recorded"),
        ({"type": "worker_end", "proc": "w2"}, "w2 exited 0, and its last record"),
    ],
    ids=["exit", "end"],
)
def test_i_worker_records_missing(drop, why):
    events = as_format_2(clean_history())
    events.remove(find(events, **drop))
    res = checker.check(events)
    assert rules(res) == ["i"]
    assert why in res.violations[0].message


def test_i_operation_without_a_number():
    events = as_format_2(clean_history())
    events.append(acquire("w1", "k9", "z", 5, 11.0))
    assert "has no sequence number" in checker.check(events).violations[0].message


# --- doctoring any history ------------------------------------------------------------


def _replaced(events, old, new):
    """A copy of events with one event replaced; the others are shared, not copied, so a
    recorded history of half a million events is doctored in a moment."""
    out = list(events)
    out[next(i for i, e in enumerate(events) if e is old)] = new
    return out


def doctor_stale_write(events, kind="redis"):
    """A write with the lowest fence of a `kind` log, written again (accepted) at the end of
    that log, after a higher fence: breaks (a)."""
    for log in (e for e in events if e.get("type") == "resource_log" and e["kind"] == kind):
        entries = log["entries"]
        if not entries or max(f for f, _ in entries) <= entries[0][0]:
            continue
        fence, value = entries[0]
        first = next(e for e in events if e.get("type") == "write" and e.get("value") == value)
        last = max(checker.end(e) for e in events if e.get("type") == "write")
        again = {
            **first,
            "value": f"{value}:doctored",
            "t0": last + 0.01,
            "t1": last + 0.02,
            "result": "ok",
        }
        doctored_log = {**log, "entries": [*entries, [fence, again["value"]]]}
        return [*_replaced(events, log, doctored_log), again]
    raise LookupError(f"no {kind} log with two fences")


def doctor_fence_down(events):
    """The first grant after a confirmed grant of another token on its key gets a fence one
    below it: breaks (b)."""
    confirmed = {}
    for e in sorted((e for e in events if e.get("type") == "acquire"), key=checker.start):
        if e.get("result") != "ok":
            continue
        a = confirmed.get(e["key"])
        late = a is not None and a["token"] != e["token"] and a["t1"] < e["t0"]
        if late and checker.is_confirmed(e):
            return _replaced(events, e, {**e, "fence": a["fence"] - 1})
        if checker.is_confirmed(e):
            confirmed[e["key"]] = e
    raise LookupError("no grant after a confirmed grant of another token")


def doctor_lost_confirmed_grant(events):
    """A renew answered 1 by the primary before its token's confirmed deadline is answered 0
    instead (one by a primary other than the granting node if there is one): breaks (c)."""
    primaries = checker.Primaries(events)
    history = checker._History(events)
    holds = defaultdict(list)
    for e in sorted(events, key=checker.start):
        if e.get("type") in ("acquire", "renew", "release"):
            holds[(e["key"], e["token"])].append(e)
    found = []
    for ops in holds.values():
        if any(e["type"] == "acquire" and e.get("session") is not None for e in ops):
            continue
        deadline, granted_by, confirming = None, None, None
        for e in ops:
            if e["type"] == "release":
                deadline = None
            elif (
                e["type"] == "renew"
                and str(e["result"]) == "1"
                and deadline is not None
                and e["t1"] < deadline
                and not history.clock_stepped(e["shard"], confirming["t0"], e["t1"])
                and primaries.held_throughout(e["shard"], e["node"], e["t0"] - 1, e["t1"] + 1)
            ):
                found.append((e["node"] == granted_by, e))
            confirmed = e["type"] != "release" and str(e["result"]) in ("ok", "1")
            extends = confirmed and checker.is_confirmed(e) and e.get("ttl")
            if extends and (deadline is None or e["t0"] + e["ttl"] / 1000 > deadline):
                deadline, confirming = e["t0"] + e["ttl"] / 1000, e
            if e["type"] == "acquire" and e["result"] == "ok":
                granted_by = e["node"]
    if not found:
        raise LookupError("no renew within a confirmed deadline")
    _, r = min(found, key=lambda f: f[0])
    return _replaced(events, r, {**r, "result": 0 if isinstance(r["result"], int) else "0"})


DOCTORS = {
    "stale-redis-write": (doctor_stale_write, "a"),
    "stale-sqlite-write": (lambda events: doctor_stale_write(events, "sqlite"), "a"),
    "fence-down": (doctor_fence_down, "b"),
    "lost-confirmed-grant": (doctor_lost_confirmed_grant, "c"),
}


def simulate(seed=1, rounds=120, workers=5, keys=3):
    """A consistent history of workers taking turns on a few keys of one Sentinel shard:
    most grants confirmed, a failover in the middle of a hold, a worker paused past its
    lease every 40 rounds whose late write is rejected, a primary killed."""
    rng = random.Random(seed)
    values = itertools.count()
    fences = itertools.count(1_000)
    node, t = P1, 0.5
    events = [primary(0.0, P1)]
    logs = defaultdict(list)

    def hold(w, key, t, ttl=2000, acked=2):
        token, fence = f"{w}-{next(values)}", next(fences)
        events.append(acquire(w, key, token, fence, t, t + 0.005, ttl=ttl, node=node, acked=acked))
        return token, fence

    def put(w, key, token, fence, kind, t, result="ok", **fields):
        value = f"{w}:{next(values)}"
        events.append(
            write(
                w,
                key,
                token,
                fence,
                value,
                t,
                t + 0.005,
                kind=kind,
                node=node,
                resource=f"{kind[0]}-{key}",
                result=result,
                **fields,
            )
        )
        if result == "ok":
            logs[(kind, f"{kind[0]}-{key}")].append([fence, value])

    for i in range(rounds):
        w, other = rng.sample([f"w{n}" for n in range(workers)], 2)
        key = f"k{rng.randrange(keys)}"
        if i % 40 == 30:
            token, fence = hold(w, key, t, ttl=500)
            put(w, key, token, fence, "redis", t + 0.01)
            events.append(fault("pause_worker", w, t + 0.05, t + 1.5))
            token2, fence2 = hold(other, key, t + 0.8)
            put(other, key, token2, fence2, "redis", t + 0.81)
            events.append(release(other, key, token2, t + 0.9, node=node))
            put(w, key, token, fence, "redis", t + 1.51, result="stale", highest=fence2)
            events.append(abandon(w, key, token, t + 1.52, node=node))
            t += 1.6
            continue
        token, fence = hold(w, key, t, acked=rng.choice([2, 2, 2, 1]))
        if rng.random() < 0.3:
            events.append(
                acquire(other, key, "-", None, t + 0.01, t + 0.015, result="nil", node=node)
            )
        put(w, key, token, fence, "redis", t + 0.02)
        if i == rounds // 2:
            events.append(fault("manual_failover", SHARD, t + 0.05, t + 0.2))
            node = P2
            events.append(primary(t + 0.1, node))
            t += 1.2
        events.append(renew(w, key, token, t + 0.3, t + 0.305, ttl=2000, node=node))
        put(w, key, token, fence, "sqlite", t + 0.31)
        events.append(release(w, key, token, t + 0.4, t + 0.405, node=node))
        t += rng.uniform(0.41, 0.6)
    events.append(fault("kill_primary", P1, t, t + 0.5, pid=777))
    events.append(server_exit(t + 0.01, P1, 777))
    events.append(run(t1=t + 1))
    for (kind, resource), entries in logs.items():
        events.append(resource_log(kind, resource, entries))
    return by_time(events)


def test_simulated_history_is_clean():
    res = checker.check(simulate())
    assert res.violations == []
    counts = res.counts
    assert counts["grants"] > 100 and counts["confirmed_grants"] < counts["grants"]
    assert counts["stale_rejected_redis"] == counts["paused_rejected"] == 3
    assert counts["confirmed_renewed_on_new_primary"] in (0, 1)
    assert counts["failovers"] == 1 and counts["server_exits_injected"] == 1
    assert counts["c_checked"] > 50


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("name", DOCTORS)
def test_doctors_break_a_simulated_history(name, seed):
    doctor, rule = DOCTORS[name]
    events = simulate(seed)
    doctored = doctor(events)
    assert checker.check(events).ok, "doctoring must not change the history it was given"
    assert rule in checker.check(doctored).rules()


def assert_clean_and_each_doctoring_caught(name, events):
    res = checker.check(events)
    assert res.violations == [], checker.format_result(name, res)
    for doctoring, (doctor, rule) in DOCTORS.items():
        try:
            doctored = doctor(events)
        except LookupError as missing:
            pytest.fail(f"{name}, {doctoring}: {missing}")
        assert rule in checker.check(doctored).rules(), f"{name}, {doctoring}"


def test_a_history_loaded_from_gzip_is_checked_and_doctored(tmp_path):
    path = tmp_path / "history.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(e) + "\n" for e in simulate(seed=5))
    assert_clean_and_each_doctoring_caught(path.name, checker.load(path))


RECORDED = sorted(HISTORIES.glob("*.jsonl.gz"))
FINDING = Path(__file__).parent / "findings" / "wait-after-role-change.jsonl.gz"


@functools.cache
def _load_recorded(path: Path) -> tuple[dict, ...]:
    return tuple(checker.load(path))


def load_recorded(path: Path) -> list[dict]:
    """A recorded history, read once per test run; doctors copy what they change."""
    return list(_load_recorded(path))


@pytest.mark.skipif(not RECORDED, reason="no recorded history in tests/histories")
@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.name)
def test_recorded_history_is_clean_and_each_doctoring_is_caught(path):
    assert_clean_and_each_doctoring_caught(path.name, load_recorded(path))


def test_a_large_history_checks_in_seconds():
    events = simulate(seed=4, rounds=12_000, workers=20, keys=50)
    assert len(events) > 50_000
    started = time.monotonic()
    res = checker.check(events)
    assert res.ok
    assert time.monotonic() - started < 10


# --- planted violations: each kind of the review's table, in every recorded history ---
#
# An independent review planted violations by hand into real recorded histories, and the
# checker accepted them all. Each `plant_*` below plants one kind at up to POSITIONS places
# spread over a history, each a copy of the history (the other events shared), and each
# copy must be rejected by the rule named for that kind; the history as recorded passes.

POSITIONS = 10
# A short recorded run may offer fewer places for a kind (few STALE replies, or failovers
# in the 15 s of a 30 s run's configuration): several, then.
SEVERAL = 3
# A planted operation is put where no sign of a change of its node's data (a promotion,
# a kill, a change of role or replication ID) is this near.
QUIET_S = 1.5


def spread(found: list, count: int = POSITIONS) -> list:
    """count of found, spread evenly over them (all of them when fewer)."""
    if len(found) <= count:
        return list(found)
    return [found[i * len(found) // count] for i in range(count)]


def changed(events, added=(), removed=(), replaced=()):
    """A copy of events with some added, some removed and some replaced (by identity)."""
    gone = {id(e) for e in removed}
    swap = {id(old): new for old, new in replaced}
    return [swap.get(id(e), e) for e in events if id(e) not in gone] + list(added)


class Recorded:
    """A recorded history and what the doctors need to know of it."""

    def __init__(self, events):
        self.events = events
        self.h = checker._History(events)
        self.workers = int(self.h.run.get("workers") or 16)
        # When each node's data may have changed, as intervals.
        self.changes = defaultdict(list)
        for e in events:
            kind = e.get("type")
            if kind == "primary" or kind == "server_exit":
                self.changes[e["node"]].append((e["t"], e["t"]))
            elif kind == "node":
                self.changes[e["node"]].append((e.get("since") or -math.inf, e["t"]))
            elif kind == "fault" and e.get("kind") == "kill_primary":
                self.changes[e["target"]].append((e["t0"], e["t1"]))
        self.grants_on = defaultdict(list)
        for g in self.h.grants:
            self.grants_on[g.key].append(g)
        self.writes = {
            (w.get("kind"), w.get("resource"), w["value"]): w
            for w in self.h.ops
            if w["type"] == "write" and w.get("value") is not None
        }

    def quiet(self, node, t0, t1) -> bool:
        return not any(
            a <= t1 + QUIET_S and b >= t0 - QUIET_S for a, b in self.changes.get(node, ())
        )

    def older_writer(self, key, fence, before):
        """The exclusive grant on key with the highest fence below `fence`, granted before
        `before`: the holder a newer grant took the key from."""
        older = [
            g
            for g in self.grants_on[key]
            if g.exclusive and g.fence < fence and checker.end(g.acquire) < before
        ]
        return max(older, key=lambda g: g.fence, default=None)

    def other_worker(self, worker: str) -> str:
        return f"w{(int(worker[1:]) + 1) % self.workers}"


@functools.cache
def recorded(path: Path) -> Recorded:
    return Recorded(load_recorded(path))


def _written_by(rec, older, like, t0, i, **fields):
    """The older holder's write of its older fence, accepted where `like` was."""
    write = {
        **like,
        "proc": older.proc,
        "key": older.key,
        "token": older.token,
        "fence": older.fence,
        "value": f"{older.proc}:planted-{i}",
        "register": False,
        "read": False,
        "result": "ok",
        "t0": t0,
        "t1": t0 + 0.002,
        **fields,
    }
    for kept_out in ("n", "error", "highest", "refused"):
        write.pop(kept_out, None)
    return write


def _in_log(rec, log, write, node):
    """The log with `write` put where the real-time order puts it, if the entries around
    that place were accepted by `node` (so the node's data there is the data that
    survived); None otherwise."""
    entries = log["entries"]
    kind, resource = log["kind"], log["resource"]
    written = [rec.writes.get((kind, resource, value)) for _, value in entries]
    at = next(
        (i for i, w in enumerate(written) if w is not None and w["t0"] > write["t1"]),
        len(entries),
    )
    around = [w for w in written[max(at - 1, 0) : at + 1] if w is not None]
    if node is not None and any(w.get("node") != node for w in around):
        return None
    return {**log, "entries": [*entries[:at], [write["fence"], write["value"]], *entries[at:]]}


def plant_stale_write_after_register(rec, kind="redis"):
    """A stale write accepted right after a newer holder's register: for registers (the
    first fenced operation of an exclusive grant) accepted on `kind` resources, the
    previous holder's write with its older fence, accepted by the same node 1 ms after.
    The register raised the fence with no value, so the final log alone cannot show it."""
    h, found = rec.h, []
    for g in h.grants:
        first = next(
            (
                w
                for w in h.holds[(g.key, g.token)]
                if w["type"] == "write" and w.get("kind") == kind and w.get("fence") == g.fence
            ),
            None,
        )
        if not g.exclusive or first is None or first.get("value") is not None:
            continue
        older = rec.older_writer(g.key, g.fence, first["t0"])
        if checker.result(first) != "ok" or older is None:
            continue
        if kind == "redis" and not rec.quiet(first["node"], first["t0"], first["t1"] + 0.01):
            continue
        found.append((first, older))
    plants = []
    for i, (register, older) in enumerate(spread(found)):
        stale = _written_by(rec, older, register, register["t1"] + 0.001, i)
        log = rec.h.logs[(kind, register["resource"])]
        kept = _in_log(rec, log, stale, register.get("node"))
        if kept is None:
            stale["acked"] = None  # lost with its node's data: not confirmed either
            plants.append(changed(rec.events, added=[stale]))
        else:
            plants.append(changed(rec.events, added=[stale], replaced=[(log, kept)]))
    return plants


def plant_older_fence_then_lost(rec):
    """The same primary accepts an older fence after a newer one, then that write is lost
    in a failover: for operations accepted by a primary less than 5 s before it was failed
    over, the previous holder's write with its older fence, accepted by that primary 1 ms
    after, unconfirmed, and in no final log."""
    h, found = rec.h, []
    times, nodes = h.primaries._times, h.primaries._nodes
    for w in h.ops:
        if w["type"] != "write" or w.get("kind") != "redis" or checker.result(w) != "ok":
            continue
        shard, node = str(w.get("shard")), w.get("node")
        i = bisect.bisect_right(times.get(shard, []), w["t1"])
        if i == 0 or i == len(times[shard]) or nodes[shard][i - 1] != node:
            continue
        if not (w["t1"] + 0.05 < times[shard][i] < w["t1"] + 5):
            continue  # no failover of this primary soon after
        older = rec.older_writer(w["key"], w["fence"], w["t0"])
        if older is None or not rec.quiet(node, w["t0"], w["t1"] + 0.01):
            continue
        found.append((w, older))
    return [
        changed(rec.events, added=[_written_by(rec, older, w, w["t1"] + 0.001, i, acked=None)])
        for i, (w, older) in enumerate(spread(found))
    ]


def plant_overlapping_grants(rec):
    """Two confirmed grants of different tokens on one key, overlapping in real time: for
    confirmed exclusive grants certainly live for at least 0.5 s, another worker's grant
    of the key (fence one above), confirmed, 0.1 s into it, released 0.2 s later."""
    found = []
    for g in rec.h.grants:
        began, until = checker.end(g.acquire), g.live_until - checker.CLOCK_MARGIN_S
        if not (g.durable and g.exclusive and until - began >= 0.5):
            continue
        above = [o.fence for o in rec.grants_on[g.key] if o.fence > g.fence]
        if above and min(above) <= g.fence + 1:
            continue  # no fence free between this grant and the next
        if rec.h.clock_stepped(g.acquire.get("shard"), g.acquire["t0"] - 1, until + 1):
            continue
        found.append(g)
    plants = []
    for i, g in enumerate(spread(found)):
        began, worker = checker.end(g.acquire), rec.other_worker(g.proc)
        where = {"key": g.key, "node": g.acquire.get("node"), "shard": g.acquire.get("shard")}
        need = g.acquire.get("need") or 1
        plants.append(
            changed(
                rec.events,
                added=[
                    acquire(
                        worker,
                        "",
                        f"planted{i}",
                        g.fence + 1,
                        0,
                        ttl=1500,
                        acked=need,
                        need=need,
                    )
                    | where
                    | {"block": 1000, "t0": began + 0.1, "t1": began + 0.105},
                    release(worker, "", f"planted{i}", 0)
                    | where
                    | {"t0": began + 0.3, "t1": began + 0.301},
                ],
            )
        )
    return plants


def plant_register_dropped(rec):
    """A register dropped from the history while a later STALE reply cites its fence: for
    redis refusals whose named fence only one operation, a register, had presented
    before, that register removed (and its invocation, if recorded)."""
    h = rec.h
    presented = defaultdict(list)
    for w in h.ops:
        if w["type"] == "write" and checker.result(w) in ("ok", "error"):
            presented[(w.get("kind"), w.get("resource"), w.get("fence"))].append(w)
    found = {}
    for z in h.ops:
        named = checker.STALE_REPLY.match(z.get("error") or "")
        if z["type"] != "write" or checker.result(z) != "stale" or named is None:
            continue
        before = [
            w
            for w in presented[(z["kind"], z["resource"], int(named[2]))]
            if w["t0"] < checker.end(z)
        ]
        if len(before) == 1 and before[0].get("value") is None:
            found[id(before[0])] = before[0]
    plants = []
    for register in spread(list(found.values())):
        invoked = [
            e
            for e in h.invokes
            if e.get("proc") == register["proc"] and e.get("n") == register.get("n")
        ]
        plants.append(changed(rec.events, removed=[register, *invoked]))
    return plants


def plant_final_log_dropped(rec):
    """A resource's final Redis log dropped from the history: each one in turn."""
    return [
        changed(rec.events, removed=[log])
        for log in rec.h.resource_logs
        if log.get("kind") == "redis"
    ]


PLANTED = {
    "stale-write-after-register": (plant_stale_write_after_register, "g"),
    "stale-sqlite-write-after-register": (
        lambda rec: plant_stale_write_after_register(rec, "sqlite"),
        "g",
    ),
    "older-fence-on-one-primary-then-lost": (plant_older_fence_then_lost, "g"),
    "overlapping-confirmed-grants": (plant_overlapping_grants, "f"),
    "register-dropped-stale-cites-it": (plant_register_dropped, "h"),
    "final-redis-log-dropped": (plant_final_log_dropped, "i"),
}


def caught(rec, kind) -> tuple[int, int, list[str]]:
    """How many planted copies the checker rejected by the kind's rule, of how many, and
    which other rules it named too."""
    plant, rule = PLANTED[kind]
    copies = plant(rec)
    also = set()
    hits = 0
    for copy in copies:
        named = checker.check(copy).rules()
        hits += rule in named
        also |= named - {rule}
    return hits, len(copies), sorted(also)


@pytest.mark.skipif(not RECORDED, reason="no recorded history in tests/histories")
@pytest.mark.parametrize("kind", PLANTED)
@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.name)
def test_planted_violation_is_caught_by_its_rule(path, kind):
    rec = recorded(path)
    assert checker.check(rec.events).ok
    hits, planted, _also = caught(rec, kind)
    if kind == "final-redis-log-dropped":
        assert planted == len(rec.h.run["tags"])
    else:
        assert planted >= SEVERAL, f"{path.name}: only {planted} places to plant {kind}"
    assert hits == planted, f"{path.name}, {kind}: caught {hits} of {planted}"


def test_planted_finding_without_the_victims_renewal_is_caught_by_mutual_exclusion():
    """The WAIT finding with w2's renewal answered 0 removed: (c) has nothing left to
    judge, but w2's confirmed grant and w15's were both held (f)."""
    events = load_recorded(FINDING)
    (lost,) = [v for v in checker.check(events).violations if v.rule == "c"]
    res = checker.check(changed(events, removed=[lost.events[1]]))
    assert "c" not in res.rules()
    assert "f" in res.rules()


def test_plants_do_not_change_the_history_they_were_given():
    rec = Recorded(simulate(seed=6, rounds=300))
    before = [dict(e) for e in rec.events]
    for plant, _rule in PLANTED.values():
        plant(rec)
    assert rec.events == before


# --- report ---------------------------------------------------------------------------


def test_summary_table_has_a_column_per_configuration_and_a_total():
    clean, sim = checker.check(clean_history()), checker.check(simulate())
    table = report.summary_table([("redis-7.0 sentinel", clean), ("valkey-9.1 cluster", sim)])
    lines = table.splitlines()
    assert lines[0] == "| | redis-7.0 sentinel | valkey-9.1 cluster | total |"
    grants = next(line for line in lines if line.startswith("| grants "))
    total = clean.counts["grants"] + sim.counts["grants"]
    confirmed, proved = sim.counts["confirmed_grants"], sim.counts["b_proved"]
    assert proved > 0  # the simulator's unconfirmed grants are renewed with WAIT
    assert grants == (
        "| grants (confirmed by WAIT / only by a later renewal) | 6 (5 / 0) | "
        f"{sim.counts['grants']:,} ({confirmed:,} / {proved}) | "
        f"{total:,} ({5 + confirmed:,} / {proved}) |"
    )
    paused = (
        "| (e) leases run out while their worker was paused (stopped / refused / late, unopposed) |"
    )
    assert f"{paused} 3 (1 / 1 / 1) |" in table
    # The module and the application are counted apart, never summed.
    assert "| the module accepted, LEASE.FENCE: writes / registers / reads | 4 / 0 / 0 |" in table
    assert "| the application accepted, SQLite: writes / registers | 3 / 1 |" in table
    assert "| faults: kill_primary | 1 | 1 | 2 |" in table
    rows = [line for line in lines if line.startswith("|")]
    assert rows[-1] == "| violations | 0 | 0 | 0 |"
    # What a history could not be judged by is said under the table.
    assert "- redis-7.0 sentinel: (i) history complete: operations:" in table


def test_timeline_svg_is_well_formed_and_shows_each_configuration(tmp_path):
    path = tmp_path / "timeline.svg"
    report.timeline_svg(
        [("redis-7.0 sentinel", clean_history()), ("redis-8.2 sentinel", simulate())], path
    )
    root = ET.parse(path).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert any("redis-7.0 sentinel" in t for t in texts)
    assert any("redis-8.2 sentinel" in t for t in texts)
    assert "pause_worker" in texts and "clock_step" in texts
    # The clean history's panel states its counts: 6 grants, 1 stale write, 1 failover.
    assert any("6 grants" in t and "1 stale" in t and "1 failover" in t for t in texts)
    assert path.stat().st_size < 60_000


# --- what the checker found --------------------------------------------------------


def test_finding_wait_sent_after_a_role_change_confirms_a_lost_grant():
    """A real run's history (trimmed to 75 s..100 s, writes and final logs left out). w2
    sent its blocked ACQUIRE to a primary that was then stopped and failed over; resumed,
    that node granted it while it still thought itself primary, was demoted, and later
    promoted again. w2, itself paused meanwhile, read the grant and only then sent WAIT 1,
    which measured the node's new replication stream and answered 1. The grant had been
    lost at the demotion: its renew was answered 0 before its deadline (c), and w15 held
    the key meanwhile (f). The workers now send WAIT in the same round trip as the command
    it confirms. Trimmed, the history lacks its final logs (i)."""
    res = checker.check(load_recorded(FINDING))
    assert res.rules() == {"c", "f", "i"}
    (lost,) = [v for v in res.violations if v.rule == "c"]
    assert "w2's token 917b5d6cdb956e34015ea3f688a8aefb" in lost.message
    assert "127.0.0.1:20103, primary of 0 throughout, answered its renew 0" in lost.message
    acquire_event, renew_event = lost.events
    assert acquire_event["acked"] == 1 and acquire_event["t1"] - acquire_event["t0"] > 5
    assert renew_event["result"] == 0 and renew_event["t1"] < acquire_event["t0"] + 10
    (both,) = [v for v in res.violations if v.rule == "f"]
    assert "w15's exclusive token" in both.message and "w2's exclusive token" in both.message
    assert all(v.message.startswith("no final log") for v in res.violations if v.rule == "i")
