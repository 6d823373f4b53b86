"""``redis_lease.Lock``: redis-py's ``Lock`` interface over a lease, for
``r.lock(name, timeout=..., lock_class=redis_lease.Lock)``.

The constructor, ``acquire``, ``release``, ``extend``, ``reacquire``, ``locked``,
``owned``, the context manager and the exceptions (subclasses of redis-py's
``LockError`` and ``LockNotOwnedError``) are redis-py's. Underneath, each hold is a
:class:`~redis_lease.Lease`: a lock without ``timeout`` is renewed by the client's
watchdog until released (redis-py's never expires at all), a lock with ``timeout``
expires after it unless extended (as redis-py's), a blocking ``acquire`` waits in the
module's first-come-first-served queue instead of polling, and :attr:`Lock.fence` is the
fencing token of the current hold. Options redis-py's ``lock()`` does not pass go
through ``functools.partial``::

    lock_class = functools.partial(redis_lease.Lock, lease_ttl=10, replicas=1)
    with r.lock("report", lock_class=lock_class) as lock:
        lock.lease.fence_call("fence:report", "SET", "report", "done")
"""

from __future__ import annotations

import math
import threading
import time
import weakref
from types import SimpleNamespace, TracebackType
from typing import Any, Dict, Iterator, Optional, Type, Union

from redis.exceptions import LockError as RedisLockError
from redis.exceptions import LockNotOwnedError as RedisLockNotOwnedError
from redis.exceptions import ResponseError

from ._core import ACTIVE, info_fields, is_wrongtype, new_token
from ._errors import LeaseError, LeaseLost, NotAcquired, NotConfirmed
from ._sync import Lease, Leases

__all__ = ["Lock", "LockError", "LockNotOwnedError", "leases_for"]

Number = Union[int, float]

#: The ttl of a lock without ``timeout``: renewed by the watchdog every third of it.
DEFAULT_LEASE_TTL = 30.0


class LockError(RedisLockError, LeaseError):
    """redis-py's ``LockError`` (a ``ValueError`` too), raised by :class:`Lock`."""

    def __init__(self, message: Optional[str] = None, lock_name: Any = None) -> None:
        # Set here: redis-py 5's LockError takes no lock_name.
        Exception.__init__(self, message)
        self.message = message
        self.lock_name = lock_name


class LockNotOwnedError(RedisLockNotOwnedError, LockError):
    """redis-py's ``LockNotOwnedError``: the lock is no longer held by this token."""


# One Leases (one watchdog) per client object. It refers to the client weakly, so the
# registry does not keep a client alive; the sync Leases closes when the client goes.
# Its watchdog (thread or task) runs only while a lock is held.
_registry: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_registry_lock = threading.Lock()


def leases_for(client: Any) -> Any:
    """The ``Leases`` that :class:`Lock` (or ``redis_lease.asyncio.Lock``) uses for this
    redis-py client: one per client object, created on first use."""
    with _registry_lock:
        leases = _registry.get(client)
        if leases is None:
            if _is_asyncio(client):
                from .asyncio import Leases as AsyncLeases

                leases = AsyncLeases(weakref.proxy(client))
            else:
                leases = Leases(weakref.proxy(client))
                weakref.finalize(client, leases.close)
            leases._stop_when_idle = True  # no watchdog is left once no lock is held
            _registry[client] = leases
        return leases


def _is_asyncio(client: Any) -> bool:
    return type(client).__module__.startswith("redis.asyncio")


class _Local(threading.local):
    # Class attributes: every thread starts with no token and no lease.
    token: Optional[bytes] = None
    lease: Optional[Lease] = None


def _socket_timeout(client: Any) -> Optional[float]:
    """The client's socket timeout in seconds (None: none, or not known)."""
    pool = getattr(client, "connection_pool", None)
    if pool is None:  # RedisCluster
        pool = getattr(client, "nodes_manager", None)
    kwargs = getattr(pool, "connection_kwargs", None) or {}
    timeout = kwargs.get("socket_timeout")
    return float(timeout) if timeout else None


def _ms(seconds: Number, what: str) -> int:
    ms = int(seconds * 1000)
    if ms < 1:
        raise LockError(f"{what} must be at least 1 ms")
    return ms


class _LockBase:
    """What the sync and the asyncio ``Lock`` share: redis-py's constructor, the state
    of the current hold (``local``), and every decision that needs no round trip."""

    def __init__(
        self,
        redis: Any,
        name: Any,
        timeout: Optional[Number] = None,
        sleep: Number = 0.1,
        blocking: bool = True,
        blocking_timeout: Optional[Number] = None,
        thread_local: bool = True,
        raise_on_release_error: bool = True,
        *,
        lease_ttl: Number = DEFAULT_LEASE_TTL,
        replicas: Optional[int] = None,
        replica_timeout: Optional[Number] = None,
        owner: Optional[Union[str, bytes]] = None,
    ) -> None:
        self.redis = redis
        self.name = name
        self.timeout = timeout
        #: Accepted for redis-py's signature; unused: a blocking acquire waits on the
        #: server (LEASE.ACQUIRE BLOCK), first come first served, instead of polling.
        self.sleep = sleep
        self.blocking = blocking
        self.blocking_timeout = blocking_timeout
        self.thread_local = bool(thread_local)
        self.raise_on_release_error = raise_on_release_error
        self.lease_ttl = lease_ttl
        self.replicas = replicas
        self.replica_timeout = replica_timeout
        self.owner = owner
        self.local: Any = _Local() if self.thread_local else SimpleNamespace(token=None, lease=None)
        if timeout is not None:
            _ms(timeout, "timeout")
        self.leases = leases_for(redis)

    @property
    def lease(self) -> Any:
        """The current hold (None when not held here): ``lock.lease.fence_call(...)``
        sends a fenced write, ``lock.lease.lost`` is set if the lease is lost."""
        return self.local.lease

    @property
    def fence(self) -> Optional[int]:
        """The fencing token of the current hold (None when not held here)."""
        lease = self.local.lease
        return None if lease is None else lease.fence

    def _token(self, token: Optional[Union[str, bytes]]) -> bytes:
        return self.redis.get_encoder().encode(token if token is not None else new_token())

    def _waits(
        self, blocking: Optional[bool], blocking_timeout: Optional[Number]
    ) -> Iterator[Optional[int]]:
        """The BLOCK of each attempt (None: no wait), until the wait is over. A wait
        longer than the client's socket timeout would end in a TimeoutError: it goes in
        steps within it (each step joins the queue again, at its end)."""
        if blocking is None:
            blocking = self.blocking
        if blocking_timeout is None:
            blocking_timeout = self.blocking_timeout
        if not blocking:
            yield None
            return
        stop = time.monotonic() + (math.inf if blocking_timeout is None else blocking_timeout)
        step = _socket_timeout(self.redis)
        step_ms = None if step is None else max(int(step * 1000 * 0.8), 1)
        while True:
            left = stop - time.monotonic()
            if math.isinf(left):
                yield 0 if step_ms is None else step_ms  # BLOCK 0: no end
            elif left * 1000 >= 1:
                yield int(left * 1000) if step_ms is None else min(int(left * 1000), step_ms)
            else:
                yield None  # a last try without waiting
                return

    def _acquire_options(self, token: bytes, block_ms: Optional[int]) -> Dict[str, Any]:
        if self.timeout is None:
            ttl_ms, renewals = _ms(self.lease_ttl, "lease_ttl"), None
        else:
            ttl_ms, renewals = _ms(self.timeout, "timeout"), 0
        replica_timeout = self.replica_timeout
        return {
            "key": self.name,
            "ttl_ms": ttl_ms,
            "token": token,
            "block_ms": block_ms,
            "owner": self.owner,
            "max_renewals": renewals,
            "replicas": self.replicas,
            "replica_timeout_ms": None
            if replica_timeout is None
            else _ms(replica_timeout, "replica_timeout"),
        }

    def _refused(self, error: Exception) -> Exception:
        """The LockError for an acquire that failed with ``error`` (returned as is when
        it is not the lock's business)."""
        if isinstance(error, ResponseError) and is_wrongtype(error):
            return LockError(
                f"{self.name!r} holds a value of another type: {error}", lock_name=self.name
            )
        if isinstance(error, (LeaseLost, NotConfirmed)):  # too few replicas, or lost at once
            return LockError(str(error), lock_name=self.name)
        return error

    def _granted(self, token: bytes, lease: Any) -> bool:
        self.local.token = token
        self.local.lease = lease
        return True

    def _take_for_release(self) -> Any:
        lease = self.local.lease
        if self.local.token is None or lease is None:
            raise LockError(
                "Cannot release a lock that's not owned or is already unlocked.",
                lock_name=self.name,
            )
        self.local.token = None
        self.local.lease = None
        return lease

    def _not_owned(self, verb: str) -> LockNotOwnedError:
        return LockNotOwnedError(
            f"Cannot {verb} a lock that's no longer owned", lock_name=self.name
        )

    def _held(self, verb: str) -> Any:
        lease = self.local.lease
        if self.local.token is None or lease is None:
            raise LockError(f"Cannot {verb} an unlocked lock", lock_name=self.name)
        if self.timeout is None:
            raise LockError(f"Cannot {verb} a lock with no timeout", lock_name=self.name)
        return lease

    def _extended_ttl(self, lease: Any, additional_time: Number, replace_ttl: bool) -> int:
        if replace_ttl:
            return _ms(additional_time, "additional_time")
        left = lease.deadline_in or 0.0
        return _ms(max(left, 0.0) + additional_time, "the extended time")

    def _timeout_ms(self) -> int:
        assert self.timeout is not None
        return _ms(self.timeout, "timeout")

    @staticmethod
    def _locked_by_reply(reply: Any) -> bool:
        return reply is not None and info_fields(reply).get("state") != "free"

    @staticmethod
    def _owned_by_reply(lease: Any, reply: Any) -> bool:
        if reply is None:
            return False
        fields = info_fields(reply)
        return fields.get("state") == "held" and fields.get("fence") == lease.fence

    def __repr__(self) -> str:
        return f"<{type(self).__name__} name={self.name!r} fence={self.fence}>"


class Lock(_LockBase):
    """A lock with redis-py's ``Lock`` interface, backed by a lease (see the module's
    documentation). ``lease_ttl`` (seconds), ``replicas``, ``replica_timeout`` and
    ``owner`` are extras, keyword-only: the lease's ttl when ``timeout`` is None, the
    replicas that must confirm the grant and each renewal (``WAIT``), and the label
    ``LEASE.INFO`` shows."""

    def __enter__(self) -> Lock:
        if self.acquire():
            return self
        raise LockError("Unable to acquire lock within the time specified", lock_name=self.name)

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc_value: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        try:
            self.release()
        except LockError:
            if self.raise_on_release_error:
                raise

    def acquire(
        self,
        sleep: Optional[Number] = None,
        blocking: Optional[bool] = None,
        blocking_timeout: Optional[Number] = None,
        token: Optional[Union[str, bytes]] = None,
    ) -> bool:
        """Take the lock: True once held. ``blocking=False`` tries once;
        ``blocking_timeout`` (seconds) bounds the wait, None waits as long as it takes.
        ``token`` is the holder's token (default: 128 random bits)."""
        del sleep  # see self.sleep
        encoded = self._token(token)
        for block_ms in self._waits(blocking, blocking_timeout):
            try:
                lease = self.leases.acquire(**self._acquire_options(encoded, block_ms))
            except NotAcquired:
                continue
            except Exception as e:
                refused = self._refused(e)
                if refused is e:
                    raise
                raise refused from e
            return self._granted(encoded, lease)
        return False

    def locked(self) -> bool:
        """True if anyone holds the lock (``LEASE.INFO``: held, or in a lock-delay) or the
        key holds another type."""
        try:
            return self._locked_by_reply(self.redis.execute_command("LEASE.INFO", self.name))
        except ResponseError as e:
            if is_wrongtype(e):
                return True
            raise

    def owned(self) -> bool:
        """True if this lock holds it: held here, and ``LEASE.INFO`` shows an exclusive
        hold with this hold's fence (the token is never shown; a fence is issued once)."""
        lease: Optional[Lease] = self.local.lease
        if lease is None or lease.state not in ACTIVE:
            return False
        try:
            return self._owned_by_reply(lease, self.redis.execute_command("LEASE.INFO", self.name))
        except ResponseError as e:
            if is_wrongtype(e):
                return False
            raise

    def release(self) -> None:
        """Release the lock. ``LockError`` if this lock does not hold it here,
        ``LockNotOwnedError`` if it was held and no longer is (expired or taken)."""
        if not self._take_for_release().release():
            raise self._not_owned("release")

    def extend(self, additional_time: Number, replace_ttl: bool = False) -> bool:
        """Add ``additional_time`` seconds to the time left (``replace_ttl``: make it the
        time left). Only for a lock with ``timeout``."""
        lease = self._held("extend")
        return self._renew(lease, self._extended_ttl(lease, additional_time, replace_ttl), "extend")

    def reacquire(self) -> bool:
        """Reset the time left to ``timeout``. Only for a lock with ``timeout``."""
        return self._renew(self._held("reacquire"), self._timeout_ms(), "reacquire")

    def _renew(self, lease: Lease, ttl_ms: int, verb: str) -> bool:
        try:
            lease.renew(ttl_ms)
        except LeaseLost as e:
            raise self._not_owned(verb) from e
        return True
