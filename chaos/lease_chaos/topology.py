"""The servers a chaos run stands up: three data nodes and three Sentinels, or a cluster
of three masters with one replica each. Every data node loads the module; every process
listens on a loopback address of its own (see network.py) and is a child of this process,
so its exit is seen at once.

Sentinel processes load no module: Sentinel mode ignores `loadmodule` (it holds no data).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .network import HARNESS, data_host, sentinel_host

# Built by scripts/chaos from chaos/clockshift.c; steps one node's wall clock.
CLOCKSHIFT_LIB = os.environ.get("CHAOS_CLOCKSHIFT", "")
# Built by scripts/chaos from chaos/fsyncfail.c; makes one node's fsync fail.
FSYNCFAIL_LIB = os.environ.get("CHAOS_FSYNCFAIL", "")
# The size of each data node's tmpfs, when it can have one: the AOF of a run is a few MB.
DISK_MB = 64
MASTER_NAME = "mymaster"
HOST = HARNESS

# Sentinel: a primary that does not answer for 1 s is down; a failover may restart after
# twice the failover timeout, so this bounds how often one can follow another.
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 2000
# Cluster: a master silent for this long is failed over by its replica.
NODE_TIMEOUT_MS = 1000


@dataclass
class Node:
    """One server process: a data node or a Sentinel."""

    name: str
    binary: str
    port: int
    dir: Path
    config: list[str]
    sentinel: bool = False
    shifted_clock: bool = False
    # Its data folder is a tmpfs of its own, which the nemesis may fill.
    own_disk: bool = False
    # Its own loopback address, which it binds and sends from (see network.py).
    host: str = HOST
    proc: subprocess.Popen | None = None
    pids: list[int] = field(default_factory=list)

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def conf_path(self) -> Path:
        return self.dir / ("sentinel.conf" if self.sentinel else "redis.conf")

    @property
    def log_path(self) -> Path:
        return self.dir / "server.log"

    @property
    def clock_file(self) -> Path:
        return self.dir / "clock-offset"

    def write_config(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.conf_path.write_text("\n".join(self.config) + "\n")

    @property
    def data_dir(self) -> Path:
        return self.dir / "data"

    @property
    def fsync_fail_file(self) -> Path:
        """While it exists, the server's fsync() fails (see chaos/fsyncfail.c)."""
        return self.dir / "fsync-fails"

    def start(self) -> None:
        """Starts the process from its config file (which Sentinel may have rewritten)."""
        env = dict(os.environ)
        preload = []
        if self.shifted_clock:
            if not self.clock_file.exists():
                self.clock_file.write_text("0\n")
            preload.append(CLOCKSHIFT_LIB)
            env.update(CLOCKSHIFT_FILE=str(self.clock_file))
        if FSYNCFAIL_LIB and not self.sentinel:
            preload.append(FSYNCFAIL_LIB)
            env.update(FSYNCFAIL_FILE=str(self.fsync_fail_file))
        if preload:
            env.update(LD_PRELOAD=" ".join(preload))
        args = [self.binary, str(self.conf_path)]
        if self.sentinel:
            args.append("--sentinel")
        self.proc = subprocess.Popen(
            args,
            cwd=self.dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.pids.append(self.proc.pid)
        wait_until(lambda: self.ping(), 10, f"{self.name} ({self.addr}) to answer")

    def client(self, timeout: float = 1.0) -> redis.Redis:
        return redis.Redis(
            host=self.host,
            port=self.port,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            decode_responses=True,
            retry=no_retry(),
        )

    def ping(self) -> bool:
        try:
            with self.client(0.5) as conn:
                return bool(conn.ping())
        except redis.RedisError:
            return False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.proc.pid, sig)

    def kill(self) -> int:
        """kill -9; returns the pid killed. The exit is reaped by `exit_status`."""
        pid = self.proc.pid
        os.kill(pid, signal.SIGKILL)
        self.proc.wait()
        return pid

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            self.proc.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()

    def set_clock(self, offset_s: float) -> None:
        """Steps this node's wall clock to `offset_s` from the machine's, and returns once
        the server's TIME shows it (clockshift reads the file again within 100 ms)."""
        self.clock_file.write_text(f"{offset_s:+.3f}\n")
        wait_until(lambda: self._clock_reads(offset_s), 5, f"{self.name}'s clock to step")

    def _clock_reads(self, offset_s: float) -> bool:
        try:
            with self.client(0.5) as conn:
                seconds, micros = conn.time()
        except redis.RedisError:
            return False
        return abs(seconds + micros / 1e6 - time.time() - offset_s) < 0.05


def mount_tmpfs(path: Path, size_mb: int) -> bool:
    """Mounts a tmpfs of `size_mb` on `path`; False when this machine does not let us."""
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(path)],
        capture_output=True,
        check=False,
    )
    return done.returncode == 0


def unmount(path: Path) -> None:
    subprocess.run(["umount", str(path)], capture_output=True, check=False)


def mounts_under(folder: Path) -> list[Path]:
    """Mount points below `folder` (left by a run that was killed)."""
    prefix = str(folder.resolve()) + "/"
    with open("/proc/mounts") as f:
        points = [line.split()[1] for line in f]
    return [Path(p) for p in points if p.startswith(prefix)]


def no_retry() -> Retry:
    """redis-py retries a command that timed out (ten times, from 6.0): one call must be
    one attempt, so a stopped server costs one timeout and a history shows what was sent."""
    return Retry(NoBackoff(), 0)


def wait_until(probe, timeout: float, what: str, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(interval)


def data_config(host: str, port: int, directory: Path, module: str, extra: list[str]) -> list[str]:
    return [
        f"port {port}",
        f"bind {host}",
        f"bind-source-addr {host}",
        "protected-mode no",
        # The data (the AOF) in a folder of its own, which may be a small tmpfs that the
        # nemesis fills; the config, the log and the cluster's node table stay outside it.
        f"dir {directory / 'data'}",
        f"logfile {directory / 'server.log'}",
        f"loadmodule {module}",
        "enable-debug-command yes",
        "save ''",
        "appendonly yes",
        "appendfsync everysec",
        "repl-diskless-sync yes",
        "repl-diskless-sync-delay 0",
        "repl-diskless-load disabled",
        # A replica that lost its primary for longer than this would refuse reads; the
        # workers only read the primary.
        "repl-timeout 5",
        *extra,
    ]


class Topology:
    """The common part: data nodes, start/stop, logs, exits."""

    kind = ""
    replicas_per_primary = 0

    def __init__(self, binary: str, module: str, base_port: int, workdir: Path):
        self.binary = binary
        self.module = module
        self.base_port = base_port
        self.workdir = workdir
        self.nodes: list[Node] = []
        self.sentinels: list[Node] = []

    def all_processes(self) -> list[Node]:
        return self.nodes + self.sentinels

    def node_by_addr(self, addr: str) -> Node | None:
        return next((n for n in self.nodes if n.addr == addr), None)

    def clock_node(self) -> Node | None:
        return next((n for n in self.nodes if n.shifted_clock), None)

    def stop(self) -> None:
        for node in self.all_processes():
            node.stop()
        for node in self.nodes:
            if node.own_disk:
                unmount(node.data_dir)
                node.own_disk = False

    def crash_lines(self) -> list[tuple[str, str]]:
        """Lines of a crash report in any data node's log."""
        markers = ("crashed by signal", "ASSERTION FAILED", "Guru Meditation", "panicked")
        found = []
        for node in self.nodes:
            if not node.log_path.exists():
                continue
            for line in node.log_path.read_text(errors="replace").splitlines():
                if any(m in line for m in markers):
                    found.append((node.addr, line.strip()))
        return found

    def start_data_nodes(self, count: int, extra, clock_index: int) -> None:
        """Writes the configs of `count` data nodes (`extra(i)`: node i's own lines) and
        starts them; node `clock_index` gets the clock that can be stepped."""
        for i in range(count):
            port = self.base_port + i
            directory = self.workdir / f"n{i}"
            host = data_host(self.base_port, i)
            node = Node(
                f"n{i}",
                self.binary,
                port,
                directory,
                data_config(host, port, directory, self.module, extra(i)),
                shifted_clock=bool(CLOCKSHIFT_LIB) and i == clock_index,
                host=host,
            )
            node.write_config()
            node.data_dir.mkdir()
            node.own_disk = mount_tmpfs(node.data_dir, DISK_MB)
            self.nodes.append(node)
        for node in self.nodes:
            node.start()

    def fresh_dir(self) -> None:
        for path in mounts_under(self.workdir):
            unmount(path)
        if self.workdir.exists():
            shutil.rmtree(self.workdir)
        self.workdir.mkdir(parents=True)


class SentinelTopology(Topology):
    """A primary, two replicas and three Sentinels (quorum 2)."""

    kind = "sentinel"
    replicas_per_primary = 2

    def start(self) -> None:
        self.fresh_dir()
        primary_port = self.base_port
        self.start_data_nodes(
            3,
            lambda i: (
                [] if i == 0 else [f"replicaof {data_host(self.base_port, 0)} {primary_port}"]
            ),
            clock_index=2,
        )
        wait_until(lambda: leads(self.nodes[0], 2), 20, "replicas to sync")
        for i in range(3):
            port = self.base_port + 10 + i
            directory = self.workdir / f"s{i}"
            host = sentinel_host(self.base_port, i)
            node = Node(
                f"s{i}",
                self.binary,
                port,
                directory,
                [
                    f"port {port}",
                    f"bind {host}",
                    f"bind-source-addr {host}",
                    f"sentinel announce-ip {host}",
                    f"dir {directory}",
                    "logfile server.log",
                    f"sentinel monitor {MASTER_NAME} {data_host(self.base_port, 0)} {primary_port} 2",
                    f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}",
                    f"sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}",
                    f"sentinel parallel-syncs {MASTER_NAME} 2",
                ],
                sentinel=True,
                host=host,
            )
            node.write_config()
            self.sentinels.append(node)
            node.start()
        wait_until(self._sentinels_ready, 20, "Sentinels to find each other and the replicas")

    def _sentinels_ready(self) -> bool:
        try:
            for s in self.sentinels:
                with s.client() as conn:
                    fields = sentinel_master(conn)
                    if int(fields["num-slaves"]) < 2 or int(fields["num-other-sentinels"]) < 2:
                        return False
            return True
        except redis.RedisError:
            return False

    def sentinel_addrs(self) -> list[tuple[str, int]]:
        return [(s.host, s.port) for s in self.sentinels]

    def shards(self) -> list[str]:
        return [MASTER_NAME]

    def primaries(self) -> dict[str, tuple[str, int]]:
        """The primary by the Sentinel with the highest configuration epoch that answers:
        {shard: (addr, epoch)}."""
        best = None
        for s in self.sentinels:
            if not s.alive():
                continue
            try:
                with s.client(0.3) as conn:
                    fields = sentinel_master(conn)
            except redis.RedisError:
                continue
            epoch = int(fields.get("config-epoch", 0))
            addr = f"{fields['ip']}:{fields['port']}"
            if best is None or epoch > best[1]:
                best = (addr, epoch)
        return {MASTER_NAME: best} if best else {}

    def replicas_of(self, shard: str, primary: str) -> list[Node]:
        return [n for n in self.nodes if n.addr != primary]

    def settled(self) -> bool:
        """Every Sentinel names the same primary, sees it up with both replicas and no
        failover in progress, and the primary has both replicas online."""
        views = set()
        for s in self.sentinels:
            try:
                with s.client(0.3) as conn:
                    fields = sentinel_master(conn)
            except redis.RedisError:
                return False
            if fields.get("flags") not in ("master", ["master"]) or int(fields["num-slaves"]) < 2:
                return False
            views.add(f"{fields['ip']}:{fields['port']}")
        if len(views) != 1:
            return False
        return leads(self.node_by_addr(views.pop()), 2)


class ClusterTopology(Topology):
    """Three masters with one replica each, automatic failover on."""

    kind = "cluster"
    replicas_per_primary = 1

    def start(self) -> None:
        self.fresh_dir()
        extra = [
            "cluster-enabled yes",
            f"cluster-node-timeout {NODE_TIMEOUT_MS}",
            # A replica is always eligible: the test wants failovers to happen.
            "cluster-replica-validity-factor 0",
            "cluster-allow-replica-migration no",
            "cluster-require-full-coverage no",
        ]
        self.start_data_nodes(
            6,
            lambda i: [
                *extra,
                f"cluster-announce-ip {data_host(self.base_port, i)}",
                f"cluster-config-file {self.workdir / f'n{i}' / 'nodes.conf'}",
            ],
            clock_index=4,
        )
        masters, replicas = self.nodes[:3], self.nodes[3:]
        ranges = [(0, 5460), (5461, 10922), (10923, 16383)]
        for node, (lo, hi) in zip(masters, ranges):
            with node.client() as conn:
                conn.execute_command("CLUSTER", "ADDSLOTSRANGE", lo, hi)
        for node in self.nodes[1:]:
            with node.client() as conn:
                conn.execute_command("CLUSTER", "MEET", self.nodes[0].host, self.nodes[0].port)
        wait_until(lambda: self._all_known(6), 20, "every node to know every other")
        for master, replica in zip(masters, replicas):
            master_id = self._my_id(master)
            command = ("CLUSTER", "REPLICATE", master_id)
            with replica.client() as conn:
                wait_until(
                    lambda conn=conn, command=command: _try(lambda: conn.execute_command(*command)),
                    10,
                    f"{replica.name} to replicate {master.name}",
                )
        wait_until(self.settled, 30, "the cluster to be ok with every replica in sync")

    def _my_id(self, node: Node) -> str:
        with node.client() as conn:
            return conn.execute_command("CLUSTER", "MYID")

    def _all_known(self, count: int) -> bool:
        try:
            for node in self.nodes:
                with node.client() as conn:
                    nodes = conn.execute_command("CLUSTER", "NODES")
                lines = [line for line in as_str(nodes).splitlines() if line.strip()]
                if len(lines) < count or any("handshake" in line for line in lines):
                    return False
            return True
        except redis.RedisError:
            return False

    def shards(self) -> list[str]:
        return ["0", "5461", "10923"]

    def _views(self) -> list[list[list[str]]]:
        views = []
        for node in self.nodes:
            if not node.alive():
                continue
            try:
                with node.client(0.3) as conn:
                    text = as_str(conn.execute_command("CLUSTER", "NODES"))
            except redis.RedisError:
                continue
            views.append([line.split() for line in text.splitlines() if line.strip()])
        return views

    def primaries(self) -> dict[str, tuple[str, int]]:
        """Per shard, the master that claims its first slot with the highest configuration
        epoch in any answering node's view (the cluster's own rule for a conflict)."""
        best: dict[str, tuple[str, int]] = {}
        for view in self._views():
            for parts in view:
                flags = parts[2].split(",")
                if "master" not in flags or "fail" in flags or "noaddr" in flags:
                    continue
                addr = parts[1].split("@")[0]
                epoch = int(parts[6])
                for shard in self.shards():
                    better = shard not in best or epoch > best[shard][1]
                    if better and _owns(parts[8:], int(shard)):
                        best[shard] = (addr, epoch)
        return best

    def replicas_of(self, shard: str, primary: str) -> list[Node]:
        index = self.shards().index(shard)
        pair = [self.nodes[index], self.nodes[index + 3]]
        return [n for n in pair if n.addr != primary]

    def settled(self) -> bool:
        """Every shard has a live master that says the cluster is ok and has its replica
        online."""
        current = self.primaries()
        if len(current) != 3:
            return False
        for addr, _epoch in current.values():
            node = self.node_by_addr(addr)
            if not leads(node, 1):
                return False
            try:
                with node.client(0.5) as conn:
                    state = as_str(conn.execute_command("CLUSTER", "INFO"))
            except redis.RedisError:
                return False
            if "cluster_state:ok" not in state:
                return False
        return True

    def can_migrate_atomically(self) -> bool:
        """Whether the servers have Valkey 9's `CLUSTER MIGRATESLOTS`."""
        try:
            with self.nodes[0].client(1.0) as conn:
                conn.execute_command("CLUSTER", "GETSLOTMIGRATIONS")
            return True
        except redis.RedisError:
            return False

    def move_slot(self, slot: int, source: Node, target: Node, atomic: bool) -> int:
        """Moves `slot` from master `source` to master `target`; returns how many keys
        it held. Waits for `target`'s replica to have them before it returns, so the
        next fault's failover keeps them."""
        with source.client(5.0) as conn:
            count = int(conn.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot))
        target_id = self._my_id(target)
        if atomic:
            with source.client(5.0) as conn:
                conn.execute_command(
                    "CLUSTER", "MIGRATESLOTS", "SLOTSRANGE", slot, slot, "NODE", target_id
                )
            wait_until(
                lambda: self._migration_done(source) and self._owner(slot) == target.addr,
                20,
                f"slot {slot} to move",
            )
        else:
            with target.client(5.0) as conn:
                conn.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", self._my_id(source))
            with source.client(5.0) as conn:
                conn.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
                while keys := conn.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 4):
                    conn.execute_command(
                        "MIGRATE", target.host, target.port, "", 0, 5000, "KEYS", *keys
                    )
            for node in [target, source] + [n for n in self.nodes if n not in (target, source)]:
                with node.client(5.0) as conn:
                    try:
                        conn.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
                    except redis.ResponseError:
                        # A replica refuses SETSLOT: it learns from its master.
                        pass
        with target.client(2.0) as conn:
            offset = conn.info("replication")["master_repl_offset"]
        wait_until(lambda: leads(target, 1, offset), 10, f"{target.name}'s replica to catch up")
        return count

    def _owner(self, slot: int) -> str | None:
        return next((a for lo, hi, a in self.slot_map() if lo <= slot <= hi), None)

    def _migration_done(self, source: Node) -> bool:
        with source.client(2.0) as conn:
            jobs = conn.execute_command("CLUSTER", "GETSLOTMIGRATIONS")
        if not jobs:
            return False
        last = jobs[-1]
        fields = last if isinstance(last, dict) else dict(zip(last[::2], last[1::2]))
        state = as_str(fields.get("state", ""))
        if state in ("failed", "cancelled"):
            raise redis.ResponseError(f"the slot migration {state}: {fields.get('message')}")
        return state == "success"

    def slot_map(self) -> list[tuple[int, int, str]]:
        for node in self.nodes:
            if not node.alive():
                continue
            try:
                with node.client(0.5) as conn:
                    slots = conn.execute_command("CLUSTER", "SLOTS")
            except redis.RedisError:
                continue
            return parse_slots(slots)
        return []


def leads(node: Node | None, replicas: int, offset: int = 0) -> bool:
    """`node` is up, a primary, with `replicas` replicas online, each at replication
    `offset` or past it."""
    if node is None or not node.alive():
        return False
    try:
        with node.client(0.5) as conn:
            info = conn.info("replication")
    except redis.RedisError:
        return False
    return (
        info.get("role") == "master"
        and info.get("connected_slaves") == replicas
        and all(info.get(f"slave{i}", {}).get("state") == "online" for i in range(replicas))
        and all(info.get(f"slave{i}", {}).get("offset", -1) >= offset for i in range(replicas))
    )


def parse_slots(reply) -> list[tuple[int, int, str]]:
    """CLUSTER SLOTS as (first slot, last slot, primary's host:port)."""
    return [(int(s[0]), int(s[1]), f"{as_str(s[2][0])}:{s[2][1]}") for s in reply]


def sentinel_master(conn: redis.Redis) -> dict:
    """SENTINEL MASTER as a dict (redis-py parses it into one; older versions do not)."""
    reply = conn.execute_command("SENTINEL", "MASTER", MASTER_NAME)
    if isinstance(reply, dict):
        return reply
    return dict(zip(reply[::2], reply[1::2]))


def _owns(slot_fields: list[str], slot: int) -> bool:
    for item in slot_fields:
        if item.startswith("["):
            continue
        lo, _, hi = item.partition("-")
        if int(lo) <= slot <= int(hi or lo):
            return True
    return False


def as_str(value) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _try(call) -> bool:
    try:
        call()
        return True
    except redis.RedisError:
        return False


# The servers of the repo's test matrix (tests/servers.txt) the runs use by default.
RUN_ON = ("redis7", "redis8", "valkey9")


def read_matrix(names: tuple[str, ...]) -> dict[str, str]:
    """Each of `names` in tests/servers.txt (fields: name, variable, source, platform,
    binary, label) as its run name, from its label ("Redis 7.0" runs as redis-7.0), ->
    the variable that holds its binary (scripts/chaos sets it)."""
    matrix = Path(__file__).resolve().parents[2] / "tests" / "servers.txt"
    found = {}
    for line in matrix.read_text().splitlines():
        fields = line.split(None, 5)
        if len(fields) == 6 and fields[0] in names:
            found[fields[0]] = (fields[5].strip().lower().replace(" ", "-"), fields[1])
    missing = [n for n in names if n not in found]
    if missing:
        raise SystemExit(f"{matrix}: no server named {', '.join(missing)}")
    return dict(found[n] for n in names)


SERVERS = read_matrix(RUN_ON)


def server_binary(server: str) -> str:
    path = os.environ.get(SERVERS[server])
    if not path or not Path(path).exists():
        raise SystemExit(f"{server}: set {SERVERS[server]} to its server binary")
    return path
