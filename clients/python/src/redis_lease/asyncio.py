"""The asyncio client: ``Leases`` over ``redis.asyncio.Redis`` or
``redis.asyncio.RedisCluster``, with the names of the sync one.

    leases = Leases(redis.asyncio.Redis())
    async with leases.acquire("lock:report", 10_000) as lease:
        await lease.fence_call("fence:report", "HSET", "report", "total", 42)
    await leases.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from types import TracebackType
from typing import Any, Generator, List, Optional, Type

from redis.exceptions import ResponseError

from ._core import (
    ACTIVE,
    Batch,
    KeyT,
    LeaseCore,
    State,
    Tracker,
    acquire_args,
    batch_timeout,
    check_ttl,
    grant_fence,
    is_stale,
    new_token,
    renew_commands,
    stale_fence,
)
from ._errors import LeaseError, LeaseLost, NotAcquired, StaleFence

__all__ = [
    "Lease",
    "LeaseError",
    "LeaseLost",
    "Leases",
    "NotAcquired",
    "Session",
    "StaleFence",
    "State",
]

_clock = time.monotonic


class Lease(LeaseCore):
    """One hold on a key, renewed by its ``Leases``'s watchdog task until released or
    lost. ``async with lease:`` releases on exit and raises :class:`LeaseLost` when the
    lease was lost while the body ran."""

    def __init__(self, owner: Leases, *args: Any) -> None:
        #: Set once the lease is lost (never when it is released).
        self.lost = asyncio.Event()
        super().__init__(owner, *args)

    def _fire_lost(self) -> None:
        self.lost.set()

    @property
    def state(self) -> State:
        """``held``, ``suspended``, ``lost`` or ``released`` (see :class:`State`)."""
        self._refresh(_clock())
        return self._state

    @property
    def reason(self) -> Optional[str]:
        return self._reason

    @property
    def deadline_in(self) -> Optional[float]:
        return self._deadline_in(_clock())

    def check(self) -> None:
        """Raise :class:`LeaseLost` unless the lease is held or suspended (no round trip)."""
        self._refresh(_clock())
        if self._state not in ACTIVE:
            raise self._lost_error()

    async def renew(self, ttl_ms: Optional[int] = None) -> None:
        """Renew now; raises :class:`LeaseLost` when the token no longer holds the key."""
        self.check()
        ttl = self.ttl_ms if ttl_ms is None else check_ttl(ttl_ms, self.bound)
        sent_at = _clock()
        reply = await self._owner.client.execute_command("LEASE.RENEW", self.key, self.token, ttl)
        if ttl_ms is not None:
            self.ttl_ms = ttl
            self._interval = ttl / 1000 / 3
            self._renewing = ttl > 0
        Tracker.apply([(self, ttl)], [reply], sent_at, _clock())
        if self._state not in ACTIVE:
            raise self._lost_error()

    async def release(self) -> bool:
        """Release the hold; True if the server still had it (see the sync ``release``)."""
        if self._state not in ACTIVE:
            return False
        self._renewing = False
        try:
            reply = await self._owner.client.execute_command("LEASE.RELEASE", self.key, self.token)
        except BaseException:
            self._owner._wake()
            raise
        if reply in (1, b"1", "1"):
            self._end_released()
            return True
        self._lose("the release found the token no longer holding the key")
        return False

    async def fence_call(self, resource: KeyT, *args: Any) -> Any:
        """``LEASE.FENCE resource fence *args``; raises :class:`StaleFence` (the lease
        becomes ``lost``) when a later holder has written through ``resource``."""
        self.check()
        try:
            return await self._owner.client.execute_command(
                "LEASE.FENCE", resource, self.fence, *args
            )
        except ResponseError as e:
            if not is_stale(e):
                raise
            error = stale_fence(e, self, resource)
            self._lose(f"a later holder wrote to {resource!r}")
            raise error from None

    async def __aenter__(self) -> Lease:
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        was_lost = self.state is State.LOST
        try:
            await self.release()
        except Exception:
            if exc is None:
                raise
        if exc is not None and isinstance(exc, LeaseLost):
            return
        if was_lost or self._state is State.LOST:
            raise self._lost_error() from exc

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} key={self.key!r} fence={self.fence} state={self._state.value}>"
        )


class Session(Lease):
    """A session: one keepalive for every hold bound to it (see the sync ``Session``)."""

    @property
    def holds(self) -> List[Lease]:
        return [h for h in self._bound.values() if isinstance(h, Lease)]


class _Acquiring:
    """What ``Leases.acquire`` returns: await it for the :class:`Lease`, or use it in
    ``async with`` to hold the lease for the body."""

    def __init__(self, coro: Any) -> None:
        self._coro = coro
        self._lease: Optional[Lease] = None

    def __await__(self) -> Generator[Any, None, Any]:
        return self._coro.__await__()

    async def __aenter__(self) -> Any:
        self._lease = await self._coro
        return self._lease

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        assert self._lease is not None
        await self._lease.__aexit__(exc_type, exc, tb)


class Leases:
    """Acquires leases on one ``redis.asyncio`` client and keeps them with one watchdog
    task (started with the first lease, ended by :meth:`close`). Renewals due together go
    in one pipeline (per node on a cluster), each bounded by ``asyncio.wait_for``."""

    def __init__(
        self,
        client: Any,
        *,
        max_hold_ms: Optional[int] = None,
        max_renewals: Optional[int] = None,
    ) -> None:
        self.client = client
        self.max_hold_ms = max_hold_ms
        self.max_renewals = max_renewals
        self._tracker = Tracker()
        self._task: Optional[asyncio.Task[None]] = None
        self._waiter: Optional[asyncio.Future[None]] = None
        self._closed = False
        #: Renewal batches sent.
        self.batches = 0

    def acquire(
        self,
        key: KeyT,
        ttl_ms: int,
        *,
        block_ms: Optional[int] = None,
        token: Optional[KeyT] = None,
        shared: bool = False,
        limit: Optional[int] = None,
        session: Optional[Session] = None,
        owner: Optional[KeyT] = None,
        delay_ms: Optional[int] = None,
        max_hold_ms: Optional[int] = None,
        max_renewals: Optional[int] = None,
    ) -> _Acquiring:
        """``await leases.acquire(...)`` → :class:`Lease`, or
        ``async with leases.acquire(...) as lease``. Raises :class:`NotAcquired` on nil."""
        return _Acquiring(
            self._acquire(
                Lease,
                key,
                ttl_ms,
                block_ms,
                token,
                shared,
                limit,
                session,
                owner,
                delay_ms,
                max_hold_ms,
                max_renewals,
            )
        )

    def session(
        self,
        ttl_ms: int,
        key: Optional[KeyT] = None,
        *,
        block_ms: Optional[int] = None,
        token: Optional[KeyT] = None,
        owner: Optional[KeyT] = None,
    ) -> _Acquiring:
        """``await leases.session(ttl_ms)`` → :class:`Session` (or ``async with``)."""
        token = token or new_token()
        key = key if key is not None else f"lease:session:{token}"
        return _Acquiring(
            self._acquire(
                Session, key, ttl_ms, block_ms, token, False, None, None, owner, None, None, None
            )
        )

    async def _acquire(
        self,
        cls: Type[Lease],
        key: KeyT,
        ttl_ms: int,
        block_ms: Optional[int],
        token: Optional[KeyT],
        shared: bool,
        limit: Optional[int],
        session: Optional[Session],
        owner: Optional[KeyT],
        delay_ms: Optional[int],
        max_hold_ms: Optional[int],
        max_renewals: Optional[int],
    ) -> Any:
        if self._closed:
            raise RuntimeError("Leases is closed")
        check_ttl(ttl_ms, session is not None)
        if session is not None:
            if session._owner is not self:
                raise ValueError("the session belongs to another Leases")
            session.check()
        token = token if token is not None else new_token()
        bind = (session.key, session.token) if session is not None else None
        args = acquire_args(key, ttl_ms, token, block_ms, shared, limit, bind, owner, delay_ms)
        sent_at = _clock()
        try:
            reply = await self.client.execute_command(*args)
        except ResponseError:
            raise
        except BaseException:
            await self._release_quietly(key, token)
            raise
        fence = grant_fence(reply, key)
        if fence is None:
            raise NotAcquired(key, block_ms)
        lease = cls(
            self,
            key,
            token,
            fence,
            ttl_ms,
            sent_at,
            session,
            self.max_hold_ms if max_hold_ms is None else max_hold_ms,
            self.max_renewals if max_renewals is None else max_renewals,
        )
        if _clock() - sent_at > lease._interval and ttl_ms:
            renew_at = _clock()
            try:
                renewed = await self.client.execute_command("LEASE.RENEW", key, token, ttl_ms)
            except Exception as e:
                renewed = e
            Tracker.apply([(lease, ttl_ms)], [renewed], renew_at, _clock())
            lease._renewals = 0
        if lease._state not in ACTIVE:
            raise lease._lost_error()
        self._track(lease)
        return lease

    async def _release_quietly(self, key: KeyT, token: KeyT) -> None:
        # Best effort: without it the hold ends at its ttl.
        with contextlib.suppress(Exception):
            await asyncio.shield(self.client.execute_command("LEASE.RELEASE", key, token))

    # -- the watchdog ------------------------------------------------------------------

    def _track(self, lease: Lease) -> None:
        if self._closed:
            return
        self._tracker.add(lease)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        self._wake()

    def _forget(self, lease: LeaseCore) -> None:
        self._tracker.discard(lease)

    def _wake(self) -> None:
        if self._waiter is not None:
            _resolve(self._waiter)

    async def _run(self) -> None:
        while not self._closed:
            now = _clock()
            self._tracker.expire(now)
            batch = self._tracker.due(now)
            if not batch:
                wake = self._tracker.next_wake()
                await self._sleep(None if math.isinf(wake) else max(wake - now, 0.0))
                continue
            timeout = batch_timeout(batch, self._tracker, now)
            sent_at = _clock()
            try:
                replies = await self._send(batch, timeout)
            except Exception as e:  # never let the watchdog die: count it as unanswered
                replies = [e] * len(batch)
            self.batches += 1
            Tracker.apply(batch, replies, sent_at, _clock())

    async def _sleep(self, timeout: Optional[float]) -> None:
        """Until ``timeout`` passes or ``_wake()``. A plain future rather than
        ``wait_for``, which before Python 3.12 can swallow the task's cancellation."""
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = None if timeout is None else loop.call_later(timeout, _resolve, waiter)
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    async def _send(self, batch: Batch, timeout: float) -> List[Any]:
        """One pipeline (per node on a cluster), its replies awaited at most ``timeout``
        seconds; then it is cancelled (redis-py drops the connection) and every renewal
        in it counts as unanswered."""
        commands = renew_commands(batch)
        pipe = self.client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        request = asyncio.ensure_future(pipe.execute(raise_on_error=False))
        try:
            done, _ = await asyncio.wait({request}, timeout=timeout)
        except asyncio.CancelledError:
            request.cancel()
            raise
        if not done:
            request.cancel()
            with contextlib.suppress(BaseException):
                await request
            return [asyncio.TimeoutError("no reply in time")] * len(commands)
        error = request.exception()
        if error is not None:
            return [error] * len(commands)
        return list(request.result())

    # -- closing -----------------------------------------------------------------------

    async def close(self) -> None:
        """Stop the watchdog task and wait for it. Leases still held are released (best
        effort, one pipeline) and become ``lost``."""
        if self._closed:
            return
        self._closed = True
        task = self._task
        self._task = None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        remaining = [lease for lease in self._tracker.leases.values() if lease._active()]
        if remaining:
            try:
                pipe = self.client.pipeline(transaction=False)
                for lease in remaining:
                    pipe.execute_command("LEASE.RELEASE", lease.key, lease.token)
                await pipe.execute(raise_on_error=False)
            except Exception:
                pass
        for lease in remaining:
            lease._lose("Leases.close() was called while it was held")

    aclose = close

    async def __aenter__(self) -> Leases:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def held(self) -> List[Lease]:
        return [lease for lease in self._tracker.leases.values() if isinstance(lease, Lease)]

    @property
    def watchdog(self) -> Optional[asyncio.Task[None]]:
        """The watchdog task (None before the first lease and after close())."""
        task = self._task
        return task if task is not None and not task.done() else None


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
