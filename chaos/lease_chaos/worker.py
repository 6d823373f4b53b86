"""One chaos worker: a process that takes leases and writes under them, logging every
operation with the time it was invoked and the time it completed.

A job: acquire a lease on one of a few keys (exclusive, shared, or bound to the worker's
session), confirm it with a WAIT in the same pipeline, register its fence with both
resources at once, then do one to three steps of work (6 to 14 in a long job), each a
write to the SQLite resource and one through LEASE.FENCE (a fenced read for a shared
holder), renewing as it goes, and release. Every LEASE.FENCE is confirmed by a WAIT in its
pipeline too. A careful worker renews before each write and stops when the renewal says
the lease is gone; a naive one writes first and relies on the resources rejecting a stale
fence. The nemesis may SIGSTOP the process anywhere.

Each operation is numbered and logged twice: an `invoke` line before it is sent, and the
operation with its outcome when it completes, so the history shows an operation whose
worker was killed before it completed.

Run as `python -m lease_chaos.worker '<json config>'`.
"""

from __future__ import annotations

import json
import random
import sqlite3
import sys
import time
from dataclasses import dataclass

import redis
from redis.cluster import key_slot
from redis.sentinel import Sentinel

from .network import leave_from
from .topology import MASTER_NAME, no_retry, parse_slots

# Socket timeout of every command; BLOCK waits stay below it.
TIMEOUT_S = 2.5
BLOCK_MS = 1000
WAIT_MS = 200
TTLS_MS = (1500, 3000, 6000)
# A quarter of the jobs are long: they hold across a failover, so a grant confirmed on
# one primary is renewed on the next.
LONG_TTL_MS = 10000
LONG_STEPS = (6, 14)
SESSION_TTL_MS = 3000

# Errors after which the connection's node may no longer be the primary for the key.
ROUTING_ERRORS = ("READONLY", "MOVED", "ASK", "CLUSTERDOWN", "LOADING", "MASTERDOWN", "TRYAGAIN")
ROUTING_EXCEPTIONS = (
    redis.exceptions.ReadOnlyError,
    redis.exceptions.BusyLoadingError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
    redis.exceptions.MovedError,
    redis.exceptions.AskError,
    redis.exceptions.MasterDownError,
)


class Unreachable(Exception):
    """The command's outcome is unknown: the node did not answer or is not the primary."""


class Refused(Exception):
    """The node answered the command with an error (such as STALE): nothing was done."""

    def __init__(self, node: str, shard: str, error: redis.ResponseError):
        super().__init__(str(error))
        self.node, self.shard = node, shard


class Router:
    """Finds the primary for a key and keeps a client per primary."""

    def __init__(self, config: dict):
        self.kind = config["topology"]
        self.seeds = [tuple(a) for a in config["seeds"]]
        self.conns: dict[str, redis.Redis] = {}
        self.slots: list[tuple[int, int, str]] = []
        self.sentinel = (
            Sentinel(
                self.seeds,
                sentinel_kwargs={
                    "socket_timeout": 0.5,
                    "socket_connect_timeout": 0.5,
                    "retry": no_retry(),
                },
            )
            if self.kind == "sentinel"
            else None
        )
        self.master: str | None = None

    def route(self, key: str) -> tuple[str, str]:
        """(node address, shard) of the primary for `key`."""
        if self.kind == "sentinel":
            if self.master is None:
                try:
                    host, port = self.sentinel.discover_master(MASTER_NAME)
                except redis.RedisError as err:
                    raise Unreachable(f"no primary from Sentinel: {err}") from err
                self.master = f"{host}:{port}"
            return self.master, MASTER_NAME
        if not self.slots:
            self._load_slots()
        slot = key_slot(key.encode())
        for lo, hi, addr in self.slots:
            if lo <= slot <= hi:
                return addr, str(lo)
        self.slots = []
        raise Unreachable(f"no node serves slot {slot}")

    def _load_slots(self) -> None:
        for host, port in self.seeds:
            try:
                with redis.Redis(
                    host=host, port=port, socket_timeout=0.5, retry=no_retry()
                ) as conn:
                    reply = conn.execute_command("CLUSTER", "SLOTS")
            except redis.RedisError:
                continue
            self.slots = parse_slots(reply)
            return
        raise Unreachable("no cluster node answered CLUSTER SLOTS")

    def conn(self, addr: str) -> redis.Redis:
        if addr not in self.conns:
            host, port = addr.split(":")
            self.conns[addr] = redis.Redis(
                host=host,
                port=int(port),
                socket_timeout=TIMEOUT_S,
                socket_connect_timeout=1.0,
                retry=no_retry(),
            )
        return self.conns[addr]

    def forget(self, addr: str) -> None:
        """Drops the connection and the routing that led to it."""
        conn = self.conns.pop(addr, None)
        if conn is not None:
            try:
                conn.close()
            except redis.RedisError:
                pass
        self.master = None
        self.slots = []


@dataclass
class Session:
    key: str
    token: str
    ttl: int
    renewed_at: float = 0.0  # monotonic time of the last request that kept it

    def due(self) -> bool:
        return time.monotonic() - self.renewed_at > self.ttl / 3000

    def expired(self) -> bool:
        return time.monotonic() - self.renewed_at > self.ttl / 1000


class Worker:
    def __init__(self, config: dict):
        self.config = config
        self.name = f"w{config['id']}"
        self.rng = random.Random(config["seed"])
        self.router = Router(config)
        self.need = config["replicas"]
        self.careful = config["careful"]
        self.tags = config["tags"]
        self.history = open(config["history"], "a", buffering=1)  # noqa: SIM115 - for the process's life
        self.db = sqlite3.connect(config["sqlite"], timeout=2.0, isolation_level=None)
        self.sessions: dict[str, Session] = {}
        self.seq = 0
        self.n = 0  # operations numbered in the order invoked

    # --- history ------------------------------------------------------------
    def log(self, event: dict) -> dict:
        event["proc"] = self.name
        self.history.write(json.dumps(event, separators=(",", ":")) + "\n")
        return event

    def invoke(self, kind: str, fields: dict) -> dict:
        """Numbers an operation and logs its invocation; returns its event, to be logged
        when it completes."""
        event = {"type": kind, **fields, "n": self.n, "t0": time.time()}
        self.n += 1
        self.log({**event, "type": "invoke", "op": kind})
        return event

    def token(self) -> str:
        return f"{self.rng.getrandbits(128):032x}"

    # --- one command against the primary of a key --------------------------
    def call(self, key: str, *args, wait: bool = False):
        """Runs one command on the key's primary; returns (reply, node, shard, acked).
        Raises Unreachable when the outcome is unknown, Refused when the node answered an
        error."""
        addr, shard = self.router.route(key)
        conn = self.router.conn(addr)
        acked = None
        try:
            if wait:
                reply, acked = self.confirmed(conn, args)
            else:
                reply = conn.execute_command(*args)
        except redis.ResponseError as err:
            if isinstance(err, ROUTING_EXCEPTIONS) or str(err).startswith(ROUTING_ERRORS):
                self.router.forget(addr)
                raise Unreachable(f"{addr}: {err}") from err
            raise Refused(addr, shard, err) from err
        except redis.RedisError as err:
            self.router.forget(addr)
            raise Unreachable(f"{addr}: {type(err).__name__}: {err}") from err
        if wait and (acked is None or acked < self.need):
            # Unconfirmed: this node may be a primary that was failed over and has not
            # heard yet. Ask Sentinel or the cluster again before the next call.
            self.router.forget(addr)
        return reply, addr, shard, acked

    def confirmed(self, conn: redis.Redis, args) -> tuple:
        """The command and `WAIT` in one round trip: (reply, replicas that acknowledged,
        or None). The server runs the WAIT right after the command (for a blocked
        ACQUIRE, right after the grant). A WAIT sent after reading the reply can run after
        the node was demoted and promoted again; it then measures the new replication
        stream and confirms a grant the node lost when it was demoted."""
        pipe = conn.pipeline(transaction=False)
        pipe.execute_command(*args)
        pipe.execute_command("WAIT", self.need, WAIT_MS)
        reply, acked = pipe.execute(raise_on_error=False)
        if isinstance(reply, Exception):
            raise reply
        return reply, None if isinstance(acked, Exception) else int(acked)

    def op(self, kind: str, key: str, args: list, fields: dict, wait: bool = False) -> dict:
        """Runs a command and logs it as one event of `kind`."""
        event = self.invoke(kind, {"key": key, **fields})
        try:
            reply, node, shard, acked = self.call(key, *args, wait=wait)
            event.update(node=node, shard=shard, reply=reply, acked=acked, need=self.need)
        except Unreachable as err:
            event.update(reply=None, error=str(err), node=None, shard=None)
            time.sleep(self.rng.uniform(0.05, 0.2))
        except Refused as err:
            event.update(reply=None, error=str(err), node=err.node, shard=err.shard, refused=True)
        event["t1"] = time.time()
        return event

    # --- lease operations ---------------------------------------------------
    def acquire(self, key: str, ttl: int, token: str, *, shared=False, session=None):
        args = ["LEASE.ACQUIRE", key, ttl, "TOKEN", token, "BLOCK", BLOCK_MS, "OWNER", self.name]
        if shared:
            args += ["SHARED"]
        if session is not None:
            args += ["SESSION", session.key, session.token]
        fields = {
            "token": token,
            "ttl": ttl,
            "mode": "s" if shared else "x",
            "session": session.key if session else None,
            "block": BLOCK_MS,
        }
        for _attempt in range(2):
            event = self.op("acquire", key, args, fields, wait=True)
            reply = event.pop("reply")
            if "error" in event:
                event["result"] = "error"
                self.log(event)
                if event.get("refused"):
                    return None
                continue  # the same token again: the idempotent retry
            if reply is None:
                event["result"] = "nil"
                self.log(event)
                return None
            event.update(result="ok", fence=int(reply[1]))
            self.log(event)
            return event
        return None

    def renew(self, key: str, token: str, ttl: int) -> int | None:
        event = self.op(
            "renew", key, ["LEASE.RENEW", key, token, ttl], {"token": token, "ttl": ttl}, wait=True
        )
        reply = event.pop("reply")
        event["result"] = "error" if "error" in event else int(reply)
        if event["result"] != 1:
            event["acked"] = None
        self.log(event)
        return None if event["result"] == "error" else event["result"]

    def release(self, key: str, token: str) -> None:
        event = self.op("release", key, ["LEASE.RELEASE", key, token], {"token": token})
        reply = event.pop("reply")
        event["result"] = "error" if "error" in event else int(reply)
        self.log(event)

    def abandon(self, key: str, token: str, reason: str) -> None:
        # Numbered with the operations, though nothing is sent: a gap shows a lost line.
        now = time.time()
        self.log(
            {
                "type": "abandon",
                "key": key,
                "token": token,
                "reason": reason,
                "n": self.n,
                "t0": now,
                "t1": now,
            }
        )
        self.n += 1

    # --- resources ----------------------------------------------------------
    def write_redis(
        self, tag: str, key: str, token: str, fence: int, value: str | None, read: bool = False
    ) -> str:
        """A fenced write (RPUSH of the value), or without a value a fenced LLEN: the
        register right after a grant, or a shared holder's read."""
        resource = f"res:{{{tag}}}"
        if value is None:
            args = ["LEASE.FENCE", resource, fence, "LLEN", f"log:{{{tag}}}"]
        else:
            args = ["LEASE.FENCE", resource, fence, "RPUSH", f"log:{{{tag}}}", f"{fence}|{value}"]
        fields = {
            "kind": "redis",
            "resource": resource,
            "token": token,
            "fence": fence,
            "value": value,
            "register": value is None and not read,
            "read": read,
        }
        # Logged under the lease's key, the grant it writes under; the resource, its log
        # and the lease share a hash tag, so one primary serves all three. Confirmed like
        # a grant: the checker holds every later primary to a confirmed fence.
        event = self.op("write", key, args, fields, wait=True)
        event.pop("reply")
        error = event.get("error", "")
        if error.startswith("STALE"):
            event["result"] = "stale"
        else:
            event["result"] = "error" if error else "ok"
        self.log(event)
        return event["result"]

    def write_sqlite(self, tag: str, key: str, token: str, fence: int, value: str | None) -> str:
        event = self.invoke(
            "write",
            {
                "kind": "sqlite",
                "resource": tag,
                "key": key,
                "token": token,
                "fence": fence,
                "value": value,
                "register": value is None,
                "read": False,
                "node": None,
                "shard": None,
            },
        )
        try:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                updated = self.db.execute(
                    "UPDATE resource SET fence = ? WHERE name = ? AND fence <= ?",
                    (fence, tag, fence),
                ).rowcount
                if updated == 1 and value is not None:
                    self.db.execute(
                        "INSERT INTO writes (name, fence, value) VALUES (?, ?, ?)",
                        (tag, fence, value),
                    )
                elif updated != 1:
                    # The fence that refused it, as LEASE.FENCE's STALE error names it.
                    (event["highest"],) = self.db.execute(
                        "SELECT fence FROM resource WHERE name = ?", (tag,)
                    ).fetchone()
                self.db.execute("COMMIT" if updated == 1 else "ROLLBACK")
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            event["result"] = "ok" if updated == 1 else "stale"
        except sqlite3.Error as err:
            event.update(result="error", error=str(err))
        event["t1"] = time.time()
        self.log(event)
        return event["result"]

    # --- sessions -----------------------------------------------------------
    def session_for(self, tag: str) -> Session | None:
        """The worker's live session on `tag`'s slot, acquired or renewed as needed."""
        session = self.sessions.get(tag)
        if session is not None and session.expired():
            self.abandon(session.key, session.token, "session deadline passed")
            session = None
        if session is None:
            session = Session(f"sess:{{{tag}}}:{self.name}", self.token(), SESSION_TTL_MS)
            started = time.monotonic()
            if self.acquire(session.key, session.ttl, session.token) is None:
                self.sessions.pop(tag, None)
                return None
            session.renewed_at = started
            self.sessions[tag] = session
        elif session.due():
            started = time.monotonic()
            if self.renew(session.key, session.token, session.ttl) == 1:
                session.renewed_at = started
            else:
                self.sessions.pop(tag, None)
                return None
        return session

    # --- the workload -------------------------------------------------------
    def keep(self, key: str, token: str, ttl: int, held_since: float) -> tuple[float, bool]:
        """Renews the grant: (when the lease was last known renewed, whether it is lost).
        A renewal answered 0 ends the job's work under it; an error leaves it unknown."""
        before = time.monotonic()
        answer = self.renew(key, token, ttl)
        if answer == 0:
            self.abandon(key, token, "renew answered 0")
            return held_since, True
        return (before if answer == 1 else held_since), False

    def job(self) -> None:
        tag = self.rng.choice(self.tags)
        key = f"lease:{{{tag}}}"
        roll = self.rng.random()
        shared = roll < 0.2
        session = None
        long = self.rng.random() < 0.25
        ttl = LONG_TTL_MS if long else self.rng.choice(TTLS_MS)
        if not shared and roll > 0.75:
            session = self.session_for(tag)
            if session is None:
                return
            ttl = 0
        token = self.token()
        started = time.monotonic()
        grant = self.acquire(key, ttl, token, shared=shared, session=session)
        if grant is None:
            time.sleep(self.rng.uniform(0.01, 0.1))
            return
        fence = grant["fence"]
        held_since = started
        self.write_redis(tag, key, token, fence, None)
        if not shared:
            self.write_sqlite(tag, key, token, fence, None)
        lost = False
        for _step in range(self.rng.randint(*LONG_STEPS) if long else self.rng.randint(1, 3)):
            time.sleep(self.rng.uniform(0.05, 0.4))
            if session is not None:
                if self.session_for(tag) is not session:
                    self.abandon(key, token, "session lost")
                    lost = True
                    break
            elif self.careful and time.monotonic() - held_since > ttl / 1000:
                self.abandon(key, token, "deadline passed")
                lost = True
                break
            if self.careful:
                held_since, lost = self.keep(key, token, ttl, held_since)
                if lost:
                    break
            self.seq += 1
            value = f"{self.name}:{self.seq}"
            if shared:
                self.write_redis(tag, key, token, fence, None, read=True)
            else:
                self.write_sqlite(tag, key, token, fence, value)
                self.write_redis(tag, key, token, fence, value)
            if not self.careful:
                held_since, lost = self.keep(key, token, ttl, held_since)
                if lost:
                    break
        if not lost:
            self.release(key, token)

    def run(self) -> None:
        until = self.config["until"]
        while time.time() < until:
            self.job()
        for session in self.sessions.values():
            self.release(session.key, session.token)
        # The last line: how many operations the history must hold for this worker.
        self.log({"type": "worker_end", "t": time.time(), "ops": self.n})


def main() -> None:
    config = json.loads(sys.argv[1])
    if config.get("source"):
        leave_from(config["source"])
    Worker(config).run()


if __name__ == "__main__":
    main()
