"""scripts/chaos: stands up each configuration (server × topology), runs the workers under
random faults, reads the resources' final state, and checks the history.

`--minutes` is the whole run's time under faults, divided evenly among the
configurations; the set-up, the final read and the check come on top.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import redis
from redis.cluster import key_slot

from . import checker, report
from .nemesis import Log, Nemesis, NodeWatcher, Observer, Pauser
from .network import Filter, worker_host
from .topology import SERVERS, ClusterTopology, SentinelTopology, Topology, server_binary

TOPOLOGIES = {"sentinel": SentinelTopology, "cluster": ClusterTopology}


def tags_for(topology: Topology) -> list[str]:
    """The hash tags of the contended leases: four on one primary, or two per shard."""
    if topology.kind == "sentinel":
        return ["r0", "r1", "r2", "r3"]
    starts = [int(s) for s in topology.shards()] + [16384]
    tags, i = [], 0
    for lo, hi in itertools.pairwise(starts):
        found = []
        while len(found) < 2:
            tag = f"r{i}"
            i += 1
            if lo <= key_slot(f"lease:{{{tag}}}".encode()) < hi:
                found.append(tag)
        tags += found
    return tags


def contended_slots(topology: Topology, tags: list[str]) -> list[int]:
    """The slots of the contended leases, which the nemesis may migrate (a cluster's;
    never a shard's first slot, by which the observer names the shard)."""
    if topology.kind != "cluster":
        return []
    firsts = {int(s) for s in topology.shards()}
    slots = {key_slot(f"lease:{{{tag}}}".encode()) for tag in tags}
    return sorted(slots - firsts)


def init_sqlite(path: Path, tags: list[str]) -> None:
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("CREATE TABLE resource (name TEXT PRIMARY KEY, fence INTEGER NOT NULL)")
        db.execute(
            "CREATE TABLE writes (id INTEGER PRIMARY KEY, name TEXT, fence INTEGER, value TEXT)"
        )
        db.executemany("INSERT INTO resource VALUES (?, 0)", [(t,) for t in tags])


def final_state(topology: Topology, observer: Observer, tags: list[str], db_path: Path) -> list:
    events = []
    now = time.time()
    for tag in tags:
        log_key = f"log:{{{tag}}}"
        if topology.kind == "sentinel":
            addr = observer.primary(topology.shards()[0])
        else:
            slot = key_slot(log_key.encode())
            addr = next(a for lo, hi, a in topology.slot_map() if lo <= slot <= hi)
        with topology.node_by_addr(addr).client(5.0) as conn:
            entries = conn.lrange(log_key, 0, -1)
        parsed = []
        for entry in entries:
            fence, _, value = entry.partition("|")
            parsed.append([int(fence), value])
        events.append(
            {
                "type": "resource_log",
                "proc": "final",
                "t": now,
                "kind": "redis",
                "resource": f"res:{{{tag}}}",
                "node": addr,
                "entries": parsed,
            }
        )
    with sqlite3.connect(db_path) as db:
        for tag in tags:
            rows = db.execute(
                "SELECT fence, value FROM writes WHERE name = ? ORDER BY id", (tag,)
            ).fetchall()
            events.append(
                {
                    "type": "resource_log",
                    "proc": "final",
                    "t": now,
                    "kind": "sqlite",
                    "resource": tag,
                    "entries": [list(r) for r in rows],
                }
            )
    return events


def self_check(topology: Topology) -> list[str]:
    """``LEASE.DEBUG CHECK`` on every data node once the faults are over: the module's
    own indexes and gauges agree with its keyspace on each, primary or replica. A node
    gets a few seconds to finish the work the faults left (a replica catching up, the
    reaper after a pause); a disagreement that outlasts them fails the run."""
    problems = []
    for node in topology.nodes:
        last = ""
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            try:
                with node.client(5.0) as conn:
                    conn.execute_command("LEASE.DEBUG", "CHECK")
                last = ""
                break
            except redis.RedisError as e:
                last = str(e)
                time.sleep(0.2)
        if last:
            problems.append(f"LEASE.DEBUG CHECK on {node.addr}: {last}")
    return problems


def network_filter(log: Log) -> Filter | None:
    """The run's nftables table, or None (and why, in the history) when nftables cannot
    filter here: then the deck holds no network fault."""
    net = Filter()
    try:
        net.setup()
    except (OSError, RuntimeError) as err:
        print(f"no network faults: {err}", flush=True)
        log.add({"type": "no_network_faults", "proc": "run", "t": time.time(), "error": str(err)})
        return None
    return net


def plant(topology: Topology, what: str, rng: random.Random) -> dict:
    """``LEASE.DEBUG CORRUPT <what>`` on one data node, chosen at random, once the faults
    are over: a fault-injection build breaks one of its own structures the way a bug
    would, and `self_check` must then fail the run (scripts/chaos --self-test)."""
    node = rng.choice(topology.nodes)
    with node.client(5.0) as conn:
        conn.execute_command("LEASE.DEBUG", "CORRUPT", *what.split())
    return {"type": "planted", "proc": "run", "t": time.time(), "node": node.addr, "what": what}


def worker_ends(name: str, events: list[dict], status: int | None, t: float) -> list[dict]:
    """The worker's exit, and each operation it invoked and never completed because it was
    killed, recorded as indeterminate. A worker that exited by itself completed all of
    them: the checker reports any it did not."""
    completed = {e.get("n") for e in events if e.get("type") not in ("invoke", "worker_end")}
    unfinished = []
    if status != 0:
        for e in events:
            if e.get("type") == "invoke" and e.get("n") not in completed:
                fields = {k: v for k, v in e.items() if k not in ("type", "op")}
                unfinished.append(
                    {
                        **fields,
                        "type": e.get("op"),
                        "result": "error",
                        "error": f"no reply: the worker exited with {status}",
                        "unfinished": True,
                        "t1": None,
                    }
                )
    return [
        *unfinished,
        {"type": "worker_exit", "proc": "run", "worker": name, "status": status, "t": t},
    ]


def run_one(server: str, kind: str, seconds: float, args, index: int, out: Path):
    name = f"{server}-{kind}"
    directory = out / name
    rng = random.Random(args.seed * 1000 + index)
    topology = TOPOLOGIES[kind](
        server_binary(server), args.module, args.base_port + index * 100, directory / "servers"
    )
    print(f"== {name}: {seconds:.0f} s under faults, {args.workers} workers", flush=True)
    log = Log()
    workers: dict[str, subprocess.Popen] = {}
    # Faults of the harness itself (a worker that crashed): the run fails on any.
    failed: list[str] = []
    observer = watcher = None
    net = network_filter(log)
    try:
        topology.start()
        directory.mkdir(parents=True, exist_ok=True)
        tags = tags_for(topology)
        db_path = directory / "resources.sqlite"
        db_path.unlink(missing_ok=True)
        init_sqlite(db_path, tags)
        observer = Observer(topology, log)
        observer.poll()
        observer.start()
        watcher = NodeWatcher(topology, log)
        watcher.poll()
        watcher.start()
        if kind == "sentinel":
            seeds = topology.sentinel_addrs()
        else:
            seeds = [(n.host, n.port) for n in topology.nodes]
        start = time.time()
        until = start + seconds
        for i in range(args.workers):
            history = directory / f"w{i}.jsonl"
            history.unlink(missing_ok=True)
            config = {
                "id": i,
                "topology": kind,
                "seeds": seeds,
                "tags": tags,
                "sqlite": str(db_path),
                "history": str(history),
                "until": until,
                "seed": rng.getrandbits(32),
                "replicas": topology.replicas_per_primary,
                "careful": i % 2 == 0,
                "source": worker_host(topology.base_port, i),
            }
            workers[f"w{i}"] = subprocess.Popen(
                [sys.executable, "-m", "lease_chaos.worker", json.dumps(config)],
                cwd=Path(__file__).resolve().parent.parent,
            )
        pauser = Pauser(workers, log, random.Random(rng.getrandbits(32)), until)
        nemesis = Nemesis(
            topology,
            observer,
            log,
            random.Random(rng.getrandbits(32)),
            until,
            net,
            [worker_host(topology.base_port, i) for i in range(args.workers)],
            contended_slots(topology, tags),
        )
        pauser.start()
        nemesis.start()
        nemesis.join()
        pauser.join()
        pauser.resume_all()
        for name_, proc in workers.items():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                failed.append(f"worker {name_} did not stop by itself")
            if proc.returncode not in (0, -9):
                failed.append(f"worker {name_} exited with {proc.returncode}")
        end = time.time()
        if nemesis.error is not None:
            raise RuntimeError(f"the nemesis failed: {nemesis.error!r}") from nemesis.error
        # Heal: every server up, the cluster or Sentinel settled, then read the final state.
        clock = topology.clock_node()
        if clock is not None:
            clock.set_clock(0)
        for node in topology.all_processes():
            if not node.alive():
                node.start()
        nemesis.settle()
        observer.poll()
        final = final_state(topology, observer, tags, db_path)
        if args.plant:
            log.add(plant(topology, args.plant, rng))
        failed += self_check(topology)
    finally:
        for thread in (observer, watcher):
            if thread is not None:
                thread.stopping.set()
                thread.join()
        for proc in workers.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        crashes = topology.crash_lines()
        topology.stop()
        if net is not None:
            net.teardown()
    events = [
        {
            "type": "run",
            "proc": "run",
            "format": checker.FORMAT,
            "server": server,
            "topology": kind,
            "t0": start,
            "t1": end,
            "workers": args.workers,
            "replicas": topology.replicas_per_primary,
            "seed": args.seed,
            "tags": tags,
        }
    ]
    for i in range(args.workers):
        path = directory / f"w{i}.jsonl"
        mine = []
        if path.exists():
            mine = [json.loads(line) for line in path.read_text().splitlines() if line]
        status = workers[f"w{i}"].returncode if f"w{i}" in workers else None
        events += mine + worker_ends(f"w{i}", mine, status, end)
    events += log.events + final
    events += [
        {"type": "crash_log", "proc": "observer", "t": end, "node": node, "line": line}
        for node, line in crashes
    ]
    events.sort(key=lambda e: e.get("t0", e.get("t", 0)))
    history = directory / "history.jsonl"
    with history.open("w") as f:
        for event in events:
            f.write(json.dumps(event, separators=(",", ":")) + "\n")
    result = checker.check(events)
    label = f"{server} {kind}"
    print(report.summary_table([(label, result)]), flush=True)
    for violation in result.violations[:20]:
        print(f"VIOLATION ({violation.rule}): {violation.message}", flush=True)
    print(f"history: {history}", flush=True)
    for line in failed:
        print(f"{name}: {line}", flush=True)
    return label, result, events, failed


def main(argv=None) -> int:
    # SIGTERM unwinds like Ctrl-C, so every server and worker started is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(prog="scripts/chaos", description=__doc__)
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--minutes", type=float, help="time under faults, all configurations")
    length.add_argument("--seconds", type=float, help="the same in seconds")
    parser.add_argument(
        "--servers", default=",".join(SERVERS), help=f"comma-separated, of {', '.join(SERVERS)}"
    )
    parser.add_argument(
        "--topologies", default="sentinel,cluster", help="comma-separated: sentinel, cluster"
    )
    parser.add_argument("--workers", type=int, default=16, help="worker processes (16)")
    parser.add_argument(
        "--seed", type=int, default=int(time.time()), help="the faults' and workload's choices"
    )
    parser.add_argument("--module", required=True, help="the module to load (.so)")
    parser.add_argument("--out", type=Path, default=Path("target/chaos"), help="output folder")
    parser.add_argument(
        "--base-port",
        type=int,
        default=20000,
        help="first port; each configuration takes the next 100 (keep it below 22768: a "
        "cluster bus port is 10000 above, below the kernel's ephemeral range)",
    )
    parser.add_argument("--chart", type=Path, help="also write the timeline SVG here")
    parser.add_argument("--summary", type=Path, help="also write the summary table here")
    parser.add_argument(
        "--expect-failovers", type=int, default=0, help="fail unless at least this many, in all"
    )
    parser.add_argument(
        "--expect-partitions", type=int, default=0, help="fail unless this many partitions"
    )
    parser.add_argument(
        "--expect-pauses", type=int, default=0, help="fail unless this many worker pauses"
    )
    parser.add_argument(
        "--plant",
        metavar="WHAT",
        help="after the faults, LEASE.DEBUG CORRUPT WHAT on one data node (a fault-injection "
        "build of the module): the run must then fail its LEASE.DEBUG CHECK",
    )
    args = parser.parse_args(argv)
    total = args.seconds if args.seconds is not None else (args.minutes or 1) * 60
    servers = [s for s in args.servers.split(",") if s]
    kinds = [k for k in args.topologies.split(",") if k]
    for server in servers:
        if server not in SERVERS:
            parser.error(f"unknown server {server} (known: {', '.join(SERVERS)})")
    for kind in kinds:
        if kind not in TOPOLOGIES:
            parser.error(f"unknown topology {kind} (known: {', '.join(TOPOLOGIES)})")
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    configs = [(s, k) for s in servers for k in kinds]
    each = total / len(configs)
    # Absolute: each server runs in its own folder and is given paths below this one.
    out = args.out.resolve() / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    print(f"scripts/chaos: seed {args.seed}, output in {out}", flush=True)
    results, histories, harness = [], [], []
    for index, (server, kind) in enumerate(configs):
        name, result, events, failed = run_one(server, kind, each, args, index, out)
        results.append((name, result))
        histories.append((name, events))
        harness += [f"{name}: {line}" for line in failed]
    table = report.summary_table(results)
    print("\n" + table, flush=True)
    (out / "summary.md").write_text(table + "\n")
    report.timeline_svg(histories, out / "timeline.svg")
    if args.chart:
        report.timeline_svg(histories, args.chart)
    if args.summary:
        args.summary.write_text(table + "\n")
    violations = sum(len(r.violations) for _, r in results)
    failovers = sum(r.counts["failovers"] for _, r in results)
    pauses = sum(r.counts["faults_pause_worker"] for _, r in results)
    partitions = sum(r.counts["partitions"] for _, r in results)
    print(
        f"violations: {violations}, failovers: {failovers}, partitions: {partitions}, "
        f"worker pauses: {pauses}",
        flush=True,
    )
    short = []
    if partitions < args.expect_partitions:
        short.append(f"{partitions} partitions, fewer than the {args.expect_partitions} expected")
    if failovers < args.expect_failovers:
        short.append(f"{failovers} failovers, fewer than the {args.expect_failovers} expected")
    if pauses < args.expect_pauses:
        short.append(f"{pauses} worker pauses, fewer than the {args.expect_pauses} expected")
    for line in short + harness:
        print(f"scripts/chaos: {line}", flush=True)
    return 1 if violations or short or harness else 0


if __name__ == "__main__":
    sys.exit(main())
