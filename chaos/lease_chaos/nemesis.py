"""Faults, injected at random and bounded in count and time, and the observer that records
who is primary and which server exited.

Faults on servers run one at a time, each after the topology has settled (one agreed
primary per shard, every replica online), so a kill is never followed by a restart that
would bring back data the failover superseded. Worker pauses run beside them.
"""

from __future__ import annotations

import errno
import os
import random
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import ClassVar

import redis

from .network import Filter
from .topology import FSYNCFAIL_LIB, MASTER_NAME, Node, Topology, wait_until

# How long a primary stays stopped, at most, when no failover follows.
FAILOVER_WAIT_S = 10.0
# How long a killed primary stays down, at most, waiting for the failover.
KILLED_WAIT_S = 30.0
SETTLE_WAIT_S = 30.0
# How long a partition that should cause a failover holds, at most, waiting for it.
PARTITION_WAIT_S = 15.0
# The kinds that cut links (see network.py); the run counts them as partitions.
PARTITIONS = (
    "partition_primary",
    "partition_minority",
    "partition_one_way",
    "partition_replica",
)
NETWORK_FAULTS = (*PARTITIONS, "packet_loss")
# Faults that may overlap one network fault or two, dealt together as an `overlap`. Not
# the disk faults: a node demoted while its AOF cannot be written panics as a replica
# ("Replica was unable to write command to disk"), by the servers' design.
PROCESS_FAULTS = (
    "pause_primary",
    "kill_primary",
    "manual_failover",
    "client_pause",
    "debug_sleep",
    "pause_replica",
    "kill_replica",
)


def fill(fd: int) -> None:
    """Writes to `fd` until its file system is full to the last page (the server keeps
    writing meanwhile, so a size measured first would be stale)."""
    for chunk in (1 << 20, 4096):
        block = bytes(chunk)
        while True:
            try:
                os.write(fd, block)
            except OSError as err:
                if err.errno != errno.ENOSPC:
                    raise
                break


@dataclass
class Log:
    """Events of one thread; the run merges them."""

    events: list = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, event: dict) -> dict:
        with self.lock:
            self.events.append(event)
        return event


class Observer(threading.Thread):
    """Every 200 ms: the primary of each shard by the highest configuration epoch, and
    any server process that exited."""

    def __init__(self, topology: Topology, log: Log):
        super().__init__(daemon=True)
        self.topology = topology
        self.log = log
        self.current: dict[str, str] = {}
        self.exited: set[int] = set()
        self.stopping = threading.Event()

    def primary(self, shard: str) -> str | None:
        return self.current.get(shard)

    def poll(self) -> None:
        now = time.time()
        for shard, (addr, epoch) in self.topology.primaries().items():
            if self.current.get(shard) != addr:
                self.current[shard] = addr
                self.log.add(
                    {
                        "type": "primary",
                        "proc": "observer",
                        "t": now,
                        "shard": shard,
                        "node": addr,
                        "epoch": epoch,
                    }
                )
        for node in self.topology.all_processes():
            if node.proc is None or node.proc.pid in self.exited:
                continue
            status = node.proc.poll()
            if status is not None:
                self.exited.add(node.proc.pid)
                self.log.add(
                    {
                        "type": "server_exit",
                        "proc": "observer",
                        "t": time.time(),
                        "node": node.addr,
                        "pid": node.proc.pid,
                        "status": status,
                    }
                )

    def run(self) -> None:
        while not self.stopping.is_set():
            self.poll()
            time.sleep(0.2)


class NodeWatcher(threading.Thread):
    """Every 200 ms, each data node's run ID, role and replication ID, logged when they
    change. Between two changes a node holds the same data: a restart changes the run ID,
    and a promotion, a demotion or a resync the replication ID. The checker holds each
    node's resources to their own record between changes (rule (g)); it runs beside the
    Observer so a stopped node's timeouts do not delay the primary's."""

    def __init__(self, topology: Topology, log: Log):
        super().__init__(daemon=True)
        self.topology = topology
        self.log = log
        # addr -> (run ID, role, replication ID), and when it was last asked and had it.
        self.seen: dict[str, tuple[tuple, float]] = {}
        self.stopping = threading.Event()

    def poll(self) -> None:
        for node in self.topology.nodes:
            if not node.alive():
                continue
            asked = time.time()
            try:
                with node.client(0.3) as conn:
                    info = conn.info("server", "replication")
            except redis.RedisError:
                continue
            state = (info.get("run_id"), info.get("role"), info.get("master_replid"))
            before = self.seen.get(node.addr)
            if before is None or before[0] != state:
                # The change came after the last answer with the old state (so after that
                # question was asked) and before this answer.
                self.log.add(
                    {
                        "type": "node",
                        "proc": "observer",
                        "t": time.time(),
                        "since": None if before is None else before[1],
                        "node": node.addr,
                        "run_id": state[0],
                        "role": state[1],
                        "replid": state[2],
                    }
                )
            self.seen[node.addr] = (state, asked)

    def run(self) -> None:
        while not self.stopping.is_set():
            self.poll()
            time.sleep(0.2)


class Pauser(threading.Thread):
    """SIGSTOP/SIGCONT of workers: pauses longer than the shorter ttls, as a GC pause or
    a swapped-out process would be. At most a quarter of the workers at once."""

    def __init__(self, workers: dict[str, object], log: Log, rng: random.Random, until: float):
        super().__init__(daemon=True)
        self.workers = workers  # name -> Popen
        self.log = log
        self.rng = rng
        self.until = until
        self.paused: dict[str, float] = {}
        self.faults: dict[str, dict] = {}
        self.lock = threading.Lock()

    def resume(self, name: str) -> None:
        with self.lock:
            if name not in self.paused:
                return
            del self.paused[name]
            fault = self.faults.pop(name)
            proc = self.workers[name]
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
            fault["t1"] = time.time()
            self.log.add(fault)

    def resume_all(self) -> None:
        for name in list(self.paused):
            self.resume(name)

    def run(self) -> None:
        while time.time() < self.until:
            time.sleep(self.rng.uniform(0.3, 0.9))
            now = time.time()
            for name, resume_at in list(self.paused.items()):
                if now >= resume_at:
                    self.resume(name)
            if len(self.paused) >= max(1, len(self.workers) // 4):
                continue
            name = self.rng.choice([n for n in self.workers if n not in self.paused])
            proc = self.workers[name]
            if proc.poll() is not None:
                continue
            # One pause in ten outlasts the longest ttl (a long job's 10 s).
            long = self.rng.random() < 0.1
            length = self.rng.uniform(10.5, 14.0) if long else self.rng.uniform(1.6, 4.5)
            with self.lock:
                proc.send_signal(signal.SIGSTOP)
                self.paused[name] = time.time() + length
                self.faults[name] = {
                    "type": "fault",
                    "proc": "nemesis",
                    "kind": "pause_worker",
                    "target": name,
                    "t0": time.time(),
                    "detail": {"seconds": round(length, 3), "longer_than_ttls": long},
                }
        self.resume_all()


class Nemesis(threading.Thread):
    """Server faults, one at a time."""

    # How many of each kind go in a deck of faults; the nemesis deals a shuffled deck and
    # deals a new one when it is empty, so every kind comes up in every configuration.
    DECK: ClassVar[dict[str, int]] = {
        "pause_primary": 2,
        "kill_primary": 1,
        "manual_failover": 1,
        "client_pause": 1,
        "debug_sleep": 1,
        "kill_sentinel": 1,
        "kill_sentinels": 1,
        "clock_step": 1,
        "clock_step_failover": 1,
        "pause_replica": 1,
        "kill_replica": 1,
        "kill_rewrite": 1,
        "disk_full": 1,
        "fsync_fail": 1,
        "partition_primary": 3,
        "partition_minority": 2,
        "partition_one_way": 2,
        "partition_replica": 2,
        "packet_loss": 1,
        "overlap": 2,
        "migrate_slot": 2,
    }
    QUIET_S: ClassVar[dict[str, tuple[float, float]]] = {
        "sentinel": (3.0, 6.0),
        "cluster": (0.5, 1.5),
    }

    def __init__(
        self,
        topology: Topology,
        observer: Observer,
        log: Log,
        rng: random.Random,
        until: float,
        net: Filter | None = None,
        clients: list[str] = (),
        slots: list[int] = (),
    ):
        super().__init__(daemon=True)
        self.slots = list(slots)  # the contended leases' slots (a cluster's)
        self.net = net  # None: no network faults (nftables cannot filter here)
        self.clients = list(clients)  # the workers' addresses
        self.topology = topology
        self.observer = observer
        self.log = log
        self.rng = rng
        self.until = until
        self.error: BaseException | None = None
        self.deck: list[str] = []

    def fault(self, kind: str, target: str, t0: float, **detail) -> dict:
        if threading.current_thread() is not self:
            detail["overlap"] = True
        return self.log.add(
            {
                "type": "fault",
                "proc": "nemesis",
                "kind": kind,
                "target": target,
                "t0": t0,
                "t1": time.time(),
                "detail": detail,
            }
        )

    def primary_node(self, shard: str) -> Node | None:
        addr = self.observer.primary(shard)
        return self.topology.node_by_addr(addr) if addr else None

    def wait_failover(self, shard: str, old: str, timeout: float = FAILOVER_WAIT_S) -> bool:
        try:
            wait_until(
                lambda: (self.observer.primary(shard) or old) != old, timeout, "a failover", 0.05
            )
            return True
        except TimeoutError:
            return False

    def settle(self) -> bool:
        """Waits for the topology to settle; False (and logged) when it did not in time.
        Sentinel can take tens of seconds to untangle failovers that overlapped."""
        t0 = time.time()
        try:
            wait_until(self.topology.settled, SETTLE_WAIT_S, "the topology to settle", 0.2)
            return True
        except TimeoutError:
            self.log.add({"type": "settle_timeout", "proc": "nemesis", "t0": t0, "t1": time.time()})
            return False

    # --- the faults ---------------------------------------------------------
    def pause_primary(self, shard: str, node: Node) -> None:
        """SIGSTOP until another node is primary, then SIGCONT: the old primary comes
        back believing it still is one, until Sentinel or the cluster demotes it."""
        t0 = time.time()
        node.signal(signal.SIGSTOP)
        failed_over = self.wait_failover(shard, node.addr)
        node.signal(signal.SIGCONT)
        self.fault("pause_primary", node.addr, t0, shard=shard, failed_over=failed_over)

    def kill_primary(self, shard: str, node: Node) -> None:
        """kill -9, then a restart from its own files once another node is primary."""
        t0 = time.time()
        pid = node.kill()
        # Restarted before the failover, it would come back as primary from an AOF up to a
        # second old, and its replicas would drop what WAIT confirmed: wait longer.
        failed_over = self.wait_failover(shard, node.addr, KILLED_WAIT_S)
        node.start()
        self.fault("kill_primary", node.addr, t0, shard=shard, pid=pid, failed_over=failed_over)

    def failover(self, shard: str, node: Node) -> None:
        """Asks for a failover of `node`, the primary of `shard`."""
        if self.topology.kind == "sentinel":
            sentinel = self.rng.choice([s for s in self.topology.sentinels if s.alive()])
            with sentinel.client(2.0) as conn:
                conn.execute_command("SENTINEL", "FAILOVER", MASTER_NAME)
        else:
            replica = self.topology.replicas_of(shard, node.addr)[0]
            with replica.client(2.0) as conn:
                conn.execute_command("CLUSTER", "FAILOVER")

    def manual_failover(self, shard: str, node: Node) -> None:
        t0 = time.time()
        self.failover(shard, node)
        failed_over = self.wait_failover(shard, node.addr)
        self.fault("manual_failover", node.addr, t0, shard=shard, failed_over=failed_over)

    def client_pause(self, shard: str, node: Node) -> None:
        ms = self.rng.randint(500, 2000)
        t0 = time.time()
        with node.client(2.0) as conn:
            conn.execute_command("CLIENT", "PAUSE", ms, "WRITE")
        time.sleep(ms / 1000)
        self.fault("client_pause", node.addr, t0, shard=shard, ms=ms)

    def debug_sleep(self, shard: str, node: Node) -> None:
        """A stall shorter than the failure detector's timeout."""
        seconds = round(self.rng.uniform(0.2, 0.8), 3)
        t0 = time.time()
        with node.client(seconds + 3) as conn:
            conn.execute_command("DEBUG", "SLEEP", seconds)
        self.fault("debug_sleep", node.addr, t0, shard=shard, seconds=seconds)

    def kill_sentinel(self, shard: str, node: Node) -> None:
        sentinel = self.rng.choice(self.topology.sentinels)
        t0 = time.time()
        pid = sentinel.kill()
        time.sleep(self.rng.uniform(1.0, 3.0))
        sentinel.start()
        self.fault("kill_sentinel", sentinel.addr, t0, pid=pid)

    def clock_step(self, shard: str, node: Node) -> None:
        clock_node = self.topology.clock_node()
        offset = round(self.rng.choice((1, -1)) * self.rng.uniform(1.0, 3.0), 3)
        t0 = time.time()
        clock_node.set_clock(offset)
        time.sleep(self.rng.uniform(2.0, 5.0))
        clock_node.set_clock(0)
        shard_of = self.shard_of(clock_node)
        self.fault("clock_step", clock_node.addr, t0, offset_s=offset, shard=shard_of)

    def replica(self, shard: str, primary: Node) -> Node:
        return self.rng.choice(self.topology.replicas_of(shard, primary.addr))

    def pause_replica(self, shard: str, node: Node) -> None:
        """SIGSTOP a replica past the failure detector's timeout, then SIGCONT."""
        replica = self.replica(shard, node)
        seconds = round(self.rng.uniform(1.0, 4.0), 3)
        t0 = time.time()
        replica.signal(signal.SIGSTOP)
        time.sleep(seconds)
        replica.signal(signal.SIGCONT)
        self.fault("pause_replica", replica.addr, t0, shard=shard, seconds=seconds)

    def kill_replica(self, shard: str, node: Node) -> None:
        """kill -9 a replica, and a restart from its own files a moment later."""
        replica = self.replica(shard, node)
        t0 = time.time()
        pid = replica.kill()
        time.sleep(self.rng.uniform(1.0, 4.0))
        replica.start()
        self.fault("kill_replica", replica.addr, t0, shard=shard, pid=pid)

    def kill_rewrite(self, shard: str, node: Node) -> None:
        """kill -9 a replica while it rewrites its AOF, and a restart from what the
        rewrite left."""
        replica = self.replica(shard, node)
        t0 = time.time()
        with replica.client(2.0) as conn:
            conn.execute_command("BGREWRITEAOF")
            time.sleep(self.rng.uniform(0.0, 0.05))
            rewriting = bool(conn.info("persistence").get("aof_rewrite_in_progress"))
        pid = replica.kill()
        time.sleep(self.rng.uniform(0.5, 2.0))
        replica.start()
        self.fault("kill_rewrite", replica.addr, t0, shard=shard, pid=pid, rewriting=rewriting)

    def kill_sentinels(self, shard: str, node: Node) -> None:
        """A majority of the Sentinels killed at once: no failover can be agreed."""
        victims = self.rng.sample(self.topology.sentinels, 2)
        t0 = time.time()
        pids = [s.kill() for s in victims if s.alive()]
        time.sleep(self.rng.uniform(2.0, 5.0))
        for s in victims:
            s.start()
        self.fault("kill_sentinels", ",".join(s.addr for s in victims), t0, pids=pids)

    def clock_step_failover(self, shard: str, node: Node) -> None:
        """The stepped clock's node, a replica, is stepped and then made primary: its
        clock judges every deadline granted by the old one."""
        clock_node = self.topology.clock_node()
        clock_shard = self.shard_of(clock_node)
        primary = self.primary_node(clock_shard)
        if primary is None or primary is clock_node:
            self.clock_step(shard, node)
            return
        offset = round(self.rng.choice((1, -1)) * self.rng.uniform(1.0, 3.0), 3)
        t0 = time.time()
        clock_node.set_clock(offset)
        time.sleep(self.rng.uniform(0.5, 1.5))
        if self.topology.kind == "sentinel":
            # Sentinel picks the replica itself: the other one is made ineligible.
            others = [n for n in self.topology.replicas_of(clock_shard, primary.addr)]
            others = [n for n in others if n is not clock_node]
            for other in others:
                with other.client(2.0) as conn:
                    conn.execute_command("CONFIG", "SET", "replica-priority", 0)
            try:
                sentinel = self.rng.choice([s for s in self.topology.sentinels if s.alive()])
                with sentinel.client(2.0) as conn:
                    conn.execute_command("SENTINEL", "FAILOVER", MASTER_NAME)
                failed_over = self.wait_failover(clock_shard, primary.addr)
            finally:
                for other in others:
                    with other.client(2.0) as conn:
                        conn.execute_command("CONFIG", "SET", "replica-priority", 100)
        else:
            with clock_node.client(2.0) as conn:
                conn.execute_command("CLUSTER", "FAILOVER")
            failed_over = self.wait_failover(clock_shard, primary.addr)
        promoted = self.observer.primary(clock_shard) == clock_node.addr
        time.sleep(self.rng.uniform(1.0, 3.0))
        clock_node.set_clock(0)
        self.fault(
            "clock_step_failover",
            clock_node.addr,
            t0,
            offset_s=offset,
            shard=clock_shard,
            failed_over=failed_over,
            promoted=promoted,
        )

    # --- disk faults ---------------------------------------------------------
    def aof_failing(self, node: Node) -> bool:
        """Whether the node says its last AOF write or fsync failed."""
        try:
            with node.client(1.0) as conn:
                return conn.info("persistence").get("aof_last_write_status") == "err"
        except redis.RedisError:
            return False

    def disk_full(self, shard: str, node: Node) -> None:
        """The primary's data folder (a tmpfs of its own) filled to the last byte for a
        few seconds: its AOF writes fail and it refuses writes until they succeed."""
        filler = node.data_dir / "filler"
        seconds = round(self.rng.uniform(2.0, 6.0), 3)
        t0 = time.time()
        fd = os.open(filler, os.O_CREAT | os.O_WRONLY, 0o600)
        try:
            fill(fd)
            time.sleep(seconds)
            failing = self.aof_failing(node)
        finally:
            os.close(fd)
            filler.unlink()
        # A write cut short by the full disk can leave the AOF unloadable after a later
        # kill -9 (Redis 7.0 refused to start from it, "Bad file format"): as an operator
        # would, rewrite it once the disk has room again.
        rewritten = self.rewrite_aof(node)
        self.fault(
            "disk_full",
            node.addr,
            t0,
            shard=shard,
            seconds=seconds,
            aof_failed=failing,
            aof_rewritten=rewritten,
        )

    def rewrite_aof(self, node: Node) -> bool:
        """BGREWRITEAOF, and whether it finished within 10 s."""

        def done() -> bool:
            with node.client(2.0) as conn:
                info = conn.info("persistence")
            busy = info.get("aof_rewrite_in_progress") or info.get("aof_rewrite_scheduled")
            return not busy and info.get("aof_last_bgrewrite_status") == "ok"

        self.recovers(node, 3.0)
        with node.client(2.0) as conn:
            conn.execute_command("BGREWRITEAOF")
        try:
            wait_until(done, 10, "the AOF rewrite", 0.1)
            return True
        except TimeoutError:
            return False

    def fsync_fail(self, shard: str, node: Node) -> None:
        """The primary's fsync() fails with EIO for a few seconds (chaos/fsyncfail.c)."""
        seconds = round(self.rng.uniform(2.0, 6.0), 3)
        t0 = time.time()
        node.fsync_fail_file.touch()
        try:
            time.sleep(seconds)
            failing = self.aof_failing(node)
        finally:
            node.fsync_fail_file.unlink()
        # Redis 7.0, 8.2 and Valkey 9.1 alike refuse writes after a failed background
        # fsync until one succeeds, and with writes refused under `everysec` none is
        # tried: the primary stays read-only, and demoted it would panic at the first
        # write its new primary sends. The way out is a restart from its files: kill -9,
        # a failover, then the restart, as for `kill_primary`.
        stuck = failing and not self.recovers(node, 3.0)
        pid = failed_over = None
        if stuck:
            pid = node.kill()
            failed_over = self.wait_failover(shard, node.addr, KILLED_WAIT_S)
            node.start()
        self.fault(
            "fsync_fail",
            node.addr,
            t0,
            shard=shard,
            seconds=seconds,
            aof_failed=failing,
            stuck=stuck,
            pid=pid,
            failed_over=failed_over,
        )

    def recovers(self, node: Node, within: float) -> bool:
        try:
            wait_until(lambda: not self.aof_failing(node), within, "the AOF to recover", 0.2)
            return True
        except TimeoutError:
            return False

    # --- slot migration (a cluster's) ---------------------------------------
    def migrate_slot(self, shard: str, node: Node) -> None:
        """The slot of a contended lease, with its resource, log and the holds bound in
        it, moved from its master to another while workers hold leases there, then moved
        back: `MIGRATE` in batches, or Valkey 9's atomic `CLUSTER MIGRATESLOTS` where the
        server has it (half the time)."""
        owner = {addr: [] for _, (addr, _) in self.topology.primaries().items()}
        for lo, hi, addr in self.topology.slot_map():
            for slot in self.slots:
                if lo <= slot <= hi and addr in owner:
                    owner[addr].append(slot)
        source = node
        slot = self.rng.choice(owner.get(node.addr) or self.slots)
        others = [a for a in owner if a != source.addr]
        target = self.topology.node_by_addr(self.rng.choice(others))
        atomic = self.topology.can_migrate_atomically() and self.rng.random() < 0.5
        t0 = time.time()
        moved = self.topology.move_slot(slot, source, target, atomic)
        time.sleep(self.rng.uniform(1.0, 4.0))
        back = self.topology.move_slot(slot, target, source, atomic)
        self.fault(
            "migrate_slot",
            source.addr,
            t0,
            shard=shard,
            slot=slot,
            to=target.addr,
            atomic=atomic,
            keys_moved=moved,
            keys_moved_back=back,
        )

    # --- network faults (network.py) ---------------------------------------
    def everyone_but(self, *nodes: Node) -> list[str]:
        return [n.host for n in self.topology.all_processes() if n not in nodes]

    def split_clients(self) -> tuple[list[str], list[str]]:
        """The workers' addresses in two: about a third with the minority."""
        clients = list(self.clients)
        self.rng.shuffle(clients)
        near = max(1, len(clients) // 3)
        return clients[:near], clients[near:]

    def _partition(
        self, kind: str, shard: str, node: Node, side_a: list[Node], failover: bool = True
    ):
        """`side_a` (with `node`, the primary) and a third of the workers cut off from
        everything else, until a failover elsewhere (when the other side can fail over),
        then a moment more of both sides serving, then healed."""
        near, far = self.split_clients()
        a_hosts = [n.host for n in side_a] + near
        b_hosts = self.everyone_but(*side_a) + far
        t0 = time.time()
        handles = self.net.split(a_hosts, b_hosts)
        try:
            if failover:
                failed_over = self.wait_failover(shard, node.addr, PARTITION_WAIT_S)
            else:
                time.sleep(self.rng.uniform(3.0, 8.0))
                failed_over = self.observer.primary(shard) != node.addr
            time.sleep(self.rng.uniform(0.5, 2.0))
        finally:
            self.net.heal(handles)
        self.fault(
            kind,
            node.addr,
            t0,
            shard=shard,
            side_a=a_hosts,
            side_b=b_hosts,
            failed_over=failed_over,
        )

    def partition_primary(self, shard: str, node: Node) -> None:
        """The classic split brain: the primary and some workers on one side, its
        replicas, the Sentinels (or every other cluster node) and the other workers on
        the other."""
        self._partition("partition_primary", shard, node, [node])

    def partition_minority(self, shard: str, node: Node) -> None:
        """Sentinels, or cluster nodes, split into a minority and a majority: the primary
        with one Sentinel (or with one other cluster node) on the minority side. The
        majority fails the primary over unless it lacks the primary's replica, or (in a
        cluster) a majority of the masters."""
        if self.topology.kind == "sentinel":
            extra = self.rng.choice(self.topology.sentinels)
            failover = True
        else:
            extra = self.rng.choice([n for n in self.topology.nodes if n is not node])
            masters = {addr for addr, _ in self.topology.primaries().values()}
            ours = self.topology.replicas_of(shard, node.addr)
            failover = extra.addr not in masters and extra not in ours
        self._partition("partition_minority", shard, node, [node, extra], failover)

    def partition_one_way(self, shard: str, node: Node) -> None:
        """Packets from the primary to everyone else dropped, or from everyone else to
        it; the other way still flows (TCP then stalls both ways on its connections)."""
        outgoing = self.rng.random() < 0.5
        others = self.everyone_but(node) + self.clients
        seconds = round(self.rng.uniform(2.0, 6.0), 3)
        t0 = time.time()
        if outgoing:
            handles = self.net.cut([node.host], others)
        else:
            handles = self.net.cut(others, [node.host])
        try:
            time.sleep(seconds)
        finally:
            self.net.heal(handles)
        direction = "from" if outgoing else "to"
        self.fault("partition_one_way", node.addr, t0, shard=shard, direction=direction)

    def partition_replica(self, shard: str, node: Node) -> None:
        """A replica cut off from every other process and every worker."""
        replica = self.replica(shard, node)
        seconds = round(self.rng.uniform(2.0, 6.0), 3)
        t0 = time.time()
        handles = self.net.split([replica.host], self.everyone_but(replica) + self.clients)
        try:
            time.sleep(seconds)
        finally:
            self.net.heal(handles)
        self.fault("partition_replica", replica.addr, t0, shard=shard, seconds=seconds)

    def packet_loss(self, shard: str, node: Node) -> None:
        """A share of the packets to and from the primary dropped at random."""
        pct = self.rng.randint(10, 40)
        seconds = round(self.rng.uniform(3.0, 8.0), 3)
        t0 = time.time()
        handles = self.net.split([node.host], self.everyone_but(node) + self.clients, pct)
        try:
            time.sleep(seconds)
        finally:
            self.net.heal(handles)
        self.fault("packet_loss", node.addr, t0, shard=shard, percent=pct, seconds=seconds)

    def overlap(self, shard: str, node: Node) -> None:
        """A fault on a process and one or two network faults, at once."""
        kinds = [self.rng.choice(self.applicable(PROCESS_FAULTS))]
        kinds += self.rng.sample(self.applicable(NETWORK_FAULTS), self.rng.randint(1, 2))
        t0 = time.time()
        threads = []
        for kind in kinds:
            thread = threading.Thread(target=self.attempt, args=(kind, shard, node), daemon=True)
            thread.start()
            threads.append(thread)
            time.sleep(self.rng.uniform(0.0, 1.0))
        for thread in threads:
            thread.join()
        self.fault("overlap", node.addr, t0, shard=shard, kinds=kinds)

    def shard_of(self, node: Node) -> str:
        shards = self.topology.shards()
        if len(shards) == 1:
            return shards[0]
        return shards[self.topology.nodes.index(node) % len(shards)]

    # --- the loop -----------------------------------------------------------
    def applicable(self, kinds) -> list[str]:
        """Those of `kinds` this configuration can inject."""
        out = []
        for kind in kinds:
            if kind in ("kill_sentinel", "kill_sentinels") and self.topology.kind != "sentinel":
                continue
            if kind.startswith("clock_step") and self.topology.clock_node() is None:
                continue
            if (kind in NETWORK_FAULTS or kind == "overlap") and self.net is None:
                continue
            if kind == "disk_full" and not all(n.own_disk for n in self.topology.nodes):
                continue
            if kind == "fsync_fail" and not FSYNCFAIL_LIB:
                continue
            if kind == "migrate_slot" and not self.slots:
                continue
            out.append(kind)
        return out

    def choose(self) -> str:
        if not self.deck:
            kinds = self.applicable(self.DECK)
            self.deck = [kind for kind in kinds for _ in range(self.DECK[kind])]
            self.rng.shuffle(self.deck)
        return self.deck.pop()

    def attempt(self, kind: str, shard: str, node: Node) -> None:
        """One fault; its own command failing (the node changed role meanwhile) is logged
        as not injected, anything else fails the run."""
        try:
            getattr(self, kind)(shard, node)
        except redis.RedisError as err:
            self.log.add(
                {
                    "type": "fault_skipped",
                    "proc": "nemesis",
                    "kind": kind,
                    "t": time.time(),
                    "error": str(err),
                }
            )
        except Exception as err:  # noqa: BLE001 - the run reports it and fails
            self.error = err

    def run(self) -> None:
        try:
            while time.time() < self.until:
                if not self.settle():
                    continue
                # Quiet, with every replica following: grants confirmed by all replicas,
                # which the next failover must keep. Sentinel takes about 10 s to turn a
                # returning old primary into a replica; the quiet time after that gives
                # its grants a window to be confirmed in.
                time.sleep(self.rng.uniform(*self.QUIET_S[self.topology.kind]))
                if time.time() >= self.until:
                    break
                shard = self.rng.choice(self.topology.shards())
                node = self.primary_node(shard)
                if node is None or not node.alive():
                    continue
                self.attempt(self.choose(), shard, node)
                if self.error is not None:
                    return
        except Exception as err:  # noqa: BLE001 - the run reports it and fails
            self.error = err
