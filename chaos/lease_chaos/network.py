"""Network partitions on loopback, by address.

Every process of a run has a loopback address of its own (127.0.0.0/8 is all loopback):
each server binds its own and sends from it (`bind-source-addr`, and the cluster bus
announces it), and each worker connects from its own (`leave_from`). An nftables table of
this run then drops packets by source and destination address, which cuts exactly the
links wanted; the harness itself talks from 127.0.0.1, which no rule names, so it always
sees every process.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading

import redis.connection

HARNESS = "127.0.0.1"


def host(base_port: int, role: int, i: int) -> str:
    """The address of process `i` of a role (2: data node, 3: Sentinel, 4: worker) in
    the configuration whose ports start at `base_port`: 127.<its hundred of ports>.<role>.
    <i + 1>, so runs on other ports never share an address, nor a cut."""
    return f"127.{base_port // 100 % 256}.{role}.{i + 1}"


def data_host(base_port: int, i: int) -> str:
    return host(base_port, 2, i)


def sentinel_host(base_port: int, i: int) -> str:
    return host(base_port, 3, i)


def worker_host(base_port: int, i: int) -> str:
    return host(base_port, 4, i)


def leave_from(source: str) -> None:
    """Every redis-py connection this process opens leaves from `source` (a worker's own
    address)."""

    def connect(conn: redis.connection.Connection) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.bind((source, 0))
            sock.settimeout(conn.socket_connect_timeout)
            sock.connect((conn.host, conn.port))
            sock.settimeout(conn.socket_timeout)
        except OSError:
            sock.close()
            raise
        return sock

    redis.connection.Connection._connect = connect


class Filter:
    """One nftables table, `lease_chaos_<pid>`, whose input chain drops what the rules
    say. Each cut is a handful of rules, removed by their handles when it heals, so cuts
    of overlapping faults come and go independently."""

    def __init__(self):
        self.table = f"lease_chaos_{os.getpid()}"
        self.lock = threading.Lock()
        self.ready = False

    def _nft(self, *args: str) -> str:
        done = subprocess.run(["nft", *args], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"nft {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def setup(self) -> None:
        """Creates the table (again, empty); raises when nftables cannot filter here."""
        self.teardown()
        self._nft("add", "table", "ip", self.table)
        self._nft(
            "add",
            "chain",
            "ip",
            self.table,
            "input",
            "{ type filter hook input priority 0 ; policy accept ; }",
        )
        self.ready = True

    def teardown(self) -> None:
        subprocess.run(
            ["nft", "delete", "table", "ip", self.table], capture_output=True, check=False
        )
        self.ready = False

    def cut(self, sources: list[str], targets: list[str], loss_pct: int = 100) -> list[str]:
        """Drops packets from any of `sources` to any of `targets` (`loss_pct` percent of
        them, at random, below 100); returns the rules' handles for `heal`."""
        if not sources or not targets:
            return []
        rule = [
            "ip",
            "saddr",
            "{ " + ", ".join(sources) + " }",
            "ip",
            "daddr",
            "{ " + ", ".join(targets) + " }",
        ]
        if loss_pct < 100:
            rule += ["numgen", "random", "mod", "100", "<", str(loss_pct)]
        with self.lock:
            out = self._nft(
                "--echo", "--handle", "add", "rule", "ip", self.table, "input", *rule, "drop"
            )
        # "... drop # handle 3", then a "# new generation" line.
        handle = out.split("# handle", 1)[1].split()[0]
        return [handle]

    def split(self, side_a: list[str], side_b: list[str], loss_pct: int = 100) -> list[str]:
        """Both ways between the two sides."""
        return self.cut(side_a, side_b, loss_pct) + self.cut(side_b, side_a, loss_pct)

    def heal(self, handles: list[str]) -> None:
        with self.lock:
            for handle in handles:
                self._nft("delete", "rule", "ip", self.table, "input", "handle", handle)
