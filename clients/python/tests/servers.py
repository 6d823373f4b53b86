"""Real servers for the tests: each in its own temp dir on a free loopback port, with the
redis-lease module loaded, stopped by pid.

The servers are the repo's test matrix, tests/servers.txt: each binary comes from the
server's variable there (LEASE_REDIS7_SERVER ...); the suite runs on every one that is set
(LEASE_SERVERS, a comma list of names, narrows it). With none set it uses each server
installed where scripts/install-deps puts it. The module is LEASE_MODULE, else
<repo>/target/release/libredis_lease.so.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional

import redis

REPO = Path(__file__).resolve().parents[3]
START_TIMEOUT = 10.0
STOP_TIMEOUT = 10.0


def read_matrix() -> Dict[str, tuple]:
    """name -> (variable, default binary) for each server of tests/servers.txt: its
    fields are name, variable, source, platform, binary (absolute, or relative to
    target/test-servers) and label."""
    flavors = {}
    for line in (REPO / "tests/servers.txt").read_text().splitlines():
        fields = line.split(None, 5)
        if not fields or fields[0].startswith("#"):
            continue
        name, var, binary = fields[0], fields[1], fields[4]
        flavors[name] = (var, str(REPO / "target/test-servers" / binary))
    return flavors


FLAVORS: Dict[str, tuple] = read_matrix()

SERVERS_ENV_HINT = f"set {' or '.join(var for var, _ in FLAVORS.values())} (see tests/servers.py)"


def selected() -> Dict[str, str]:
    """name -> server binary, for every server the suite runs on."""
    chosen = {name: os.environ.get(var, "") for name, (var, _) in FLAVORS.items()}
    chosen = {name: path for name, path in chosen.items() if path}
    if not chosen:
        chosen = {name: path for name, (_, path) in FLAVORS.items() if Path(path).is_file()}
    only = os.environ.get("LEASE_SERVERS", "").strip()
    if only:
        names = [n.strip() for n in only.split(",") if n.strip()]
        chosen = {n: p for n, p in chosen.items() if n in names}
    return chosen


def module_path() -> str:
    path = os.environ.get("LEASE_MODULE") or str(REPO / "target/release/libredis_lease.so")
    if not Path(path).is_file():
        raise RuntimeError(
            f"module not found at {path}: set LEASE_MODULE or run "
            "`cargo build --release --lib` in the repo root"
        )
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(
    what: str, condition: Callable[[], object], timeout: float = 5.0, interval: float = 0.005
) -> object:
    """Poll ``condition`` until it returns something true; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


class Server:
    def __init__(
        self,
        name: str,
        binary: str,
        config: Optional[Dict[str, str]] = None,
        port: int = 0,
    ) -> None:
        self.name = name
        self.binary = binary
        self.config = dict(config or {})
        self.dir = tempfile.mkdtemp(prefix=f"redis-lease-py-{name}-")
        self.port = port
        self.proc: Optional[subprocess.Popen] = None
        self.stopped = False

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> Server:
        last = ""
        fixed = bool(self.port)  # a restart keeps its port: clients and Sentinels know it
        for _ in range(5):
            if not fixed:
                self.port = free_port()
            args = [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                self.dir,
                "--save",
                "",
                "--appendonly",
                "no",
                "--enable-debug-command",
                "local",
                "--loadmodule",
                module_path(),
            ]
            for name, value in self.config.items():
                args += [f"--{name}", *value.split()]
            log = open(os.path.join(self.dir, "server.log"), "ab")  # noqa: SIM115
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=self.dir)
            log.close()
            if self._wait_ready():
                return self
            last = self.log()
            self._kill()
            if "Address already in use" not in last:
                break
        raise RuntimeError(f"{self.name} did not start:\n{last[-4000:]}")

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                return False
            try:
                with redis.Redis(port=self.port, socket_timeout=1) as r:
                    if r.ping():
                        return True
            except redis.ConnectionError:
                pass
            except redis.ResponseError as e:  # LOADING
                if "LOADING" not in str(e):
                    raise
            time.sleep(0.02)
        return False

    def log(self) -> str:
        try:
            return Path(self.dir, "server.log").read_text(errors="replace")
        except OSError:
            return ""

    def client(self, **kwargs: object) -> redis.Redis:
        kwargs.setdefault("decode_responses", True)
        return redis.Redis(host="127.0.0.1", port=self.port, **kwargs)

    def pause(self) -> None:
        """SIGSTOP: the server takes connections (the kernel does) but never answers."""
        os.kill(self.pid, signal.SIGSTOP)
        self.stopped = True

    def resume(self) -> None:
        if self.stopped:
            os.kill(self.pid, signal.SIGCONT)
            self.stopped = False

    def commandstat(self, r: redis.Redis, command: str) -> int:
        stats = r.info("commandstats")
        entry = stats.get(f"cmdstat_{command}")
        return int(entry["calls"]) if entry else 0

    def _kill(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def crash(self) -> None:
        """SIGKILL, as a crash or an OOM kill would (a stopped server dies stopped: what
        is unread in its sockets is never read); the directory stays, and start() brings
        the server back on the same port."""
        self._kill()
        self.stopped = False
        self.proc = None

    def stop(self) -> None:
        """Stop by pid: SIGCONT if paused, SIGTERM, SIGKILL after a grace period; the
        directory goes too (also after a crash() that was not followed by a start())."""
        if self.proc is None:
            shutil.rmtree(self.dir, ignore_errors=True)
            return
        self.resume()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def started(name: str, binary: str) -> Iterator[Server]:
    """A server of the matrix for the block's duration, stopped by pid after it."""
    srv = Server(name, binary).start()
    try:
        yield srv
    finally:
        srv.stop()


CLUSTER_SLOTS = 16384


class Cluster:
    """Three masters (no replicas), slots split in three, joined with CLUSTER MEET."""

    def __init__(self, name: str, binary: str, masters: int = 3) -> None:
        self.name = name
        self.nodes: List[Server] = []
        for _ in range(masters):
            self.nodes.append(
                Server(
                    name,
                    binary,
                    {
                        "cluster-enabled": "yes",
                        "cluster-config-file": "nodes.conf",
                        "cluster-node-timeout": "2000",
                        "cluster-port": str(free_port()),
                    },
                )
            )

    def start(self) -> Cluster:
        try:
            for node in self.nodes:
                node.start()
            self._form()
        except BaseException:
            self.stop()
            raise
        return self

    def _form(self) -> None:
        clients = [n.client() for n in self.nodes]
        count = len(self.nodes)
        for i, r in enumerate(clients):
            r.execute_command("CLUSTER", "SET-CONFIG-EPOCH", i + 1)
            lo = i * CLUSTER_SLOTS // count
            hi = (i + 1) * CLUSTER_SLOTS // count - 1
            r.execute_command("CLUSTER", "ADDSLOTSRANGE", lo, hi)
        for node in self.nodes[1:]:
            clients[0].execute_command(
                "CLUSTER", "MEET", "127.0.0.1", node.port, node.config["cluster-port"]
            )

        def agreed() -> bool:
            for r in clients:
                info = r.execute_command("CLUSTER", "INFO")
                if "cluster_state:ok" not in info or f"cluster_known_nodes:{count}" not in info:
                    return False
                slots = r.execute_command("CLUSTER", "SLOTS")
                if len(slots) != count:
                    return False
            return True

        wait_until(f"{self.name} cluster to agree", agreed, timeout=30, interval=0.05)
        for r in clients:
            r.close()

    def client(self, **kwargs: object) -> redis.RedisCluster:
        kwargs.setdefault("decode_responses", True)
        return redis.RedisCluster(host="127.0.0.1", port=self.nodes[0].port, **kwargs)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


MASTER_NAME = "m"
# A primary silent this long is down (subjectively; objectively once two agree).
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 3000


class SentinelProcess:
    """One Sentinel (``<binary> sentinel.conf --sentinel``): the data binary in Sentinel
    mode, without the module (Sentinel mode holds no data and ignores loadmodule)."""

    def __init__(self, name: str, binary: str, primary_port: int) -> None:
        self.name = name
        self.binary = binary
        self.dir = tempfile.mkdtemp(prefix=f"redis-lease-py-{name}-sentinel-")
        self.port = free_port()
        self.proc: Optional[subprocess.Popen] = None
        conf = [
            f"port {self.port}",
            "bind 127.0.0.1",
            f"dir {self.dir}",
            "logfile server.log",
            f"sentinel monitor {MASTER_NAME} 127.0.0.1 {primary_port} 2",
            f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}",
            f"sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}",
        ]
        Path(self.dir, "sentinel.conf").write_text("\n".join(conf) + "\n")

    def start(self) -> SentinelProcess:
        self.proc = subprocess.Popen(
            [self.binary, os.path.join(self.dir, "sentinel.conf"), "--sentinel"],
            cwd=self.dir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(f"Sentinel on {self.port}", self._answers, timeout=START_TIMEOUT)
        return self

    def _answers(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"Sentinel exited:\n{self.log()[-4000:]}")
        try:
            with self.client() as r:
                return bool(r.ping())
        except redis.ConnectionError:
            return False

    def client(self) -> redis.Redis:
        return redis.Redis(
            host="127.0.0.1", port=self.port, decode_responses=True, socket_timeout=2
        )

    def master(self) -> Dict[str, str]:
        """SENTINEL MASTER as a dict of strings (parsed by some redis-py versions only)."""
        with self.client() as r:
            reply = r.execute_command("SENTINEL", "MASTER", MASTER_NAME)
        if not isinstance(reply, dict):
            reply = dict(zip(reply[::2], reply[1::2]))
        return {k: str(v) for k, v in reply.items()}

    def log(self) -> str:
        try:
            return Path(self.dir, "server.log").read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(STOP_TIMEOUT)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)


class SentinelSet:
    """A primary and a replica, both with the module, watched by three Sentinels
    (quorum 2, down after 1 s) under the name ``m``."""

    def __init__(self, name: str, binary: str) -> None:
        self.name = name
        self.binary = binary
        self.nodes: List[Server] = []
        self.sentinels: List[SentinelProcess] = []

    def start(self) -> SentinelSet:
        try:
            # Either node may be the primary later: both sync a replica at once.
            config = {"repl-diskless-sync-delay": "0"}
            # Each is listed before it starts, so that stop() cleans up after a failure.
            primary = Server(self.name, self.binary, config)
            self.nodes.append(primary)
            primary.start()
            config = {**config, "replicaof": f"127.0.0.1 {primary.port}"}
            replica = Server(self.name, self.binary, config)
            self.nodes.append(replica)
            replica.start()
            wait_until("the replica to sync", self._synced, timeout=START_TIMEOUT)
            for _ in range(3):
                sentinel = SentinelProcess(self.name, self.binary, primary.port)
                self.sentinels.append(sentinel)
                sentinel.start()
            wait_until("the Sentinels to agree", self.settled, timeout=30, interval=0.05)
        except BaseException:
            self.stop()
            raise
        return self

    def _synced(self) -> bool:
        with self.nodes[1].client() as r:
            return r.info("replication").get("master_link_status") == "up"

    def settled(self) -> bool:
        """Every Sentinel names the same primary, sees it up with its replica and the two
        other Sentinels, and no failover is under way."""
        seen = set()
        for s in self.sentinels:
            try:
                m = s.master()
            except redis.RedisError:
                return False
            if m.get("flags") != "master" or m.get("num-slaves") != "1":
                return False
            if m.get("num-other-sentinels") != "2":
                return False
            seen.add(int(m["port"]))
        return len(seen) == 1

    def primary_port(self) -> int:
        """The primary as the Sentinels see it (the first that answers)."""
        return int(self.sentinels[0].master()["port"])

    def node(self, port: int) -> Server:
        return next(n for n in self.nodes if n.port == port)

    @property
    def primary(self) -> Server:
        return self.node(self.primary_port())

    def addresses(self) -> List[tuple]:
        return [("127.0.0.1", s.port) for s in self.sentinels]

    def failover(self) -> Server:
        """SENTINEL FAILOVER, then wait until the other node is the primary and says so
        itself; returns it."""
        old = self.primary_port()
        with self.sentinels[0].client() as r:
            r.execute_command("SENTINEL", "FAILOVER", MASTER_NAME)
        new = self.wait_new_primary(old)
        return new

    def wait_new_primary(self, old: int, timeout: float = 20) -> Server:
        def promoted() -> Optional[int]:
            port = self.primary_port()
            if port == old:
                return None
            with self.node(port).client() as r:
                return port if r.info("replication")["role"] == "master" else None

        return self.node(int(wait_until("a new primary", promoted, timeout=timeout)))  # type: ignore[arg-type]

    def logs(self) -> str:
        parts = [f"--- {n.name} :{n.port}\n{n.log()[-3000:]}" for n in self.nodes]
        parts += [f"--- sentinel :{s.port}\n{s.log()[-3000:]}" for s in self.sentinels]
        return "\n".join(parts)

    def stop(self) -> None:
        for s in self.sentinels:
            s.stop()
        for n in self.nodes:
            n.stop()


def unread_at(port: int) -> int:
    """The most bytes waiting unread in one connection accepted on ``port`` (from
    /proc/net/tcp): a stopped server's clients' requests, sent and not yet read."""
    most = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, queues = fields[1], fields[3], fields[4]
            if state != "01" or int(local.rsplit(":", 1)[1], 16) != port:
                continue
            most = max(most, int(queues.split(":")[1], 16))
    return most
