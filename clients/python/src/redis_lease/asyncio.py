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
import functools
import inspect
import math
import time
from types import TracebackType
from typing import Any, Callable, Dict, Generator, List, Optional, Tuple, Type, TypeVar, cast

from redis.asyncio.connection import Connection, SSLConnection
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import SentinelManagedConnection
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from ._core import (
    ACTIVE,
    Batch,
    Confirm,
    KeyT,
    LeaseCore,
    State,
    Tracker,
    Unanswered,
    acquire_args,
    batch_timeout,
    check_ttl,
    confirm_commands,
    confirmations,
    grant_fence,
    is_demoted,
    is_stale,
    is_wrongtype,
    new_token,
    redirect_of,
    renew_commands,
    retry_delay,
    stale_fence,
    unconfirmed_grant,
)
from ._errors import (
    LeaseError,
    LeaseLost,
    NotAcquired,
    NotConfirmed,
    StaleFence,
    WriteIndeterminate,
)
from ._named import ReadWriteLock, Semaphore

__all__ = [
    "Lease",
    "LeaseError",
    "LeaseLost",
    "Leases",
    "Lock",
    "NotAcquired",
    "NotConfirmed",
    "ReadWriteLock",
    "Semaphore",
    "Session",
    "StaleFence",
    "State",
    "WriteIndeterminate",
]

_clock = time.monotonic
F = TypeVar("F", bound=Callable[..., Any])


async def _pause(delay: float, left: Optional[float]) -> None:
    await asyncio.sleep(delay if left is None else min(delay, max(left, 0.0)))


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
        command = ("LEASE.RENEW", self.key, self.token, ttl)
        reply, waited = await self._owner._call(self.key, command, self._confirm_with)
        if isinstance(reply, BaseException) and not is_wrongtype(reply):
            raise reply
        if ttl_ms is not None:
            self._retune(ttl, sent_at)
        Tracker.apply([(self, ttl)], [reply], sent_at, _clock(), [waited])
        if self._state not in ACTIVE:
            raise self._lost_error()

    async def release(self) -> bool:
        """Release the hold; True if the server still had it (see the sync ``release``)."""
        if self._state not in ACTIVE:
            return False
        self._renewing = False
        try:
            reply = await self._owner.client.execute_command("LEASE.RELEASE", self.key, self.token)
        except ResponseError as e:
            if not is_wrongtype(e):  # WRONGTYPE: the key was overwritten, the hold is gone
                self._owner._wake()
                raise
            reply = 0
        except BaseException:
            self._owner._wake()
            raise
        if reply in (1, b"1", "1"):
            self._end_released()
            return True
        self._lose("the release found the token no longer holding the key")
        return False

    async def fence_call(self, resource: KeyT, *args: Any, retries: int = 0) -> Any:
        """``LEASE.FENCE resource fence *args``, sent once on a connection of this
        client's own with its reply awaited no longer than the lease's time left (see the
        sync ``fence_call``): :class:`StaleFence` (the lease becomes ``lost``) when a
        later holder has written through ``resource``; :class:`WriteIndeterminate` when
        it was sent and no reply came in time (it may have run; it is not sent again
        unless ``retries`` asks for it, for a command safe to run twice)."""
        self.check()
        command = ("LEASE.FENCE", resource, self.fence, *args)
        sent = 0
        cause: Optional[BaseException] = None
        while True:
            self._refresh(_clock())
            if self._state not in ACTIVE:
                if sent:
                    raise self._indeterminate(resource, sent) from cause
                raise self._lost_error()
            left = self._deadline_in(_clock())
            try:
                return await self._owner._fence_once(resource, command, left)
            except ResponseError as e:
                if not is_stale(e):
                    raise
                error = stale_fence(e, self, resource)
                self._lose(f"a later holder wrote to {resource!r}")
                raise error from None
            except Unanswered as failure:
                self._write_failed()
                if failure.sent:
                    sent += 1
                    cause = failure.error
                if retries <= 0:
                    if sent:
                        raise self._indeterminate(resource, sent) from cause
                    if self.state not in ACTIVE:
                        raise self._lost_error() from failure.error
                    raise failure.error from None
                retries -= 1
                # As the watchdog after a failed renewal: ttl/10, from 5 to 250 ms.
                await _pause(retry_delay(self.ttl_ms), self._deadline_in(_clock()))

    def _indeterminate(self, resource: KeyT, attempts: int) -> WriteIndeterminate:
        return WriteIndeterminate(
            f"fenced write to {resource!r} (fence {self.fence}) got no reply before the "
            f"lease's deadline or lost its connection: it may or may not have run",
            self,
            resource,
            self.fence,
            attempts,
        )

    def _write_failed(self) -> None:
        """Suspended until the watchdog confirms a renewal, which it tries at once."""
        target: LeaseCore = self
        if not self._renewing and self.session is not None:
            target = self.session
        target._unconfirmed(_clock())
        self._refresh(_clock())
        self._owner._wake()

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
        if exc is not None and isinstance(exc, (LeaseLost, WriteIndeterminate)):
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
    in one pipeline (per node on a cluster), each bounded by ``asyncio.wait_for``.
    ``replicas``, ``replica_timeout_ms`` and ``waitaof`` ask for confirmed grants, as in
    the sync client (not on a cluster client here: its pipeline would not send WAIT to the
    key's node)."""

    def __init__(
        self,
        client: Any,
        *,
        max_hold_ms: Optional[int] = None,
        max_renewals: Optional[int] = None,
        replicas: Optional[int] = None,
        replica_timeout_ms: Optional[int] = None,
        waitaof: bool = False,
    ) -> None:
        self.client = client
        self.max_hold_ms = max_hold_ms
        self.max_renewals = max_renewals
        self.replicas = replicas
        self.replica_timeout_ms = replica_timeout_ms
        self.waitaof = waitaof
        self._confirm(None, None, None)  # checks the values now
        self._tracker = Tracker()
        self._task: Optional[asyncio.Task[None]] = None
        self._waiter: Optional[asyncio.Future[None]] = None
        self._closed = False
        # Fenced writes' own connections, idle: per cluster node name (None otherwise).
        self._idle: Dict[Any, List[Tuple[Any, Any]]] = {}
        # A fenced write met READONLY: ask the Sentinels before the next one.
        self._master_stale = False
        # The watchdog task ends when no lease is left, and the next lease starts
        # another (redis_lease.asyncio.Lock's shared Leases, which nobody closes).
        self._stop_when_idle = False
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
        replicas: Optional[int] = None,
        replica_timeout_ms: Optional[int] = None,
        waitaof: Optional[bool] = None,
    ) -> _Acquiring:
        """``await leases.acquire(...)`` → :class:`Lease`, or
        ``async with leases.acquire(...) as lease``. Raises :class:`NotAcquired` on nil,
        :class:`NotConfirmed` when too few replicas confirmed the grant."""
        confirm = self._confirm(replicas, replica_timeout_ms, waitaof)
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
                confirm,
            )
        )

    def _confirm(
        self, replicas: Optional[int], timeout_ms: Optional[int], aof: Optional[bool]
    ) -> Optional[Confirm]:
        confirm = Confirm.of(
            self.replicas if replicas is None else replicas,
            self.replica_timeout_ms if timeout_ms is None else timeout_ms,
            self.waitaof if aof is None else aof,
        )
        if confirm is not None and _is_cluster(self.client):
            raise ValueError("confirmed grants need the sync client on a cluster")
        return confirm

    def locked(self, key: KeyT, ttl_ms: int, **options: Any) -> Callable[[F], F]:
        """A decorator: the coroutine function runs holding the lease (``async with
        leases.acquire(key, ttl_ms, **options)``); :class:`NotAcquired` when it is not
        granted, :class:`LeaseLost` when it was lost while the function ran.

            @leases.locked("lock:nightly", 60_000, block_ms=0)
            async def nightly(): ...
        """

        def decorate(fn: F) -> F:
            if not inspect.iscoroutinefunction(fn):
                raise TypeError("redis_lease.asyncio: locked() decorates coroutine functions")

            @functools.wraps(fn)
            async def held(*args: Any, **kwargs: Any) -> Any:
                async with self.acquire(key, ttl_ms, **options):
                    return await fn(*args, **kwargs)

            return cast(F, held)

        return decorate

    def rwlock(self, key: KeyT, ttl_ms: int, **options: Any) -> ReadWriteLock:
        """A :class:`ReadWriteLock` on ``key``: ``read()`` shared, ``write()`` exclusive
        (``options``: ``Leases.acquire``'s, for every hold)."""
        return ReadWriteLock(self, key, ttl_ms, **options)

    def semaphore(self, key: KeyT, permits: int, ttl_ms: int, **options: Any) -> Semaphore:
        """A :class:`Semaphore` with ``permits`` on ``key``: ``acquire()`` takes one."""
        return Semaphore(self, key, permits, ttl_ms, **options)

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
        confirm = self._confirm(None, None, None)
        return _Acquiring(
            self._acquire(
                Session,
                key,
                ttl_ms,
                block_ms,
                token,
                False,
                None,
                None,
                owner,
                None,
                None,
                None,
                confirm,
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
        confirm: Optional[Confirm],
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
            reply, waited = await self._call(key, tuple(args), confirm)
            if isinstance(reply, BaseException):
                raise reply
        except ResponseError:
            raise
        except BaseException:
            await self._release_quietly(key, token)
            raise
        fence = grant_fence(reply, key)
        if fence is None:
            raise NotAcquired(key, block_ms)
        if confirm is not None and not confirm.met(waited):
            await self._release_quietly(key, token)
            raise unconfirmed_grant(key, confirm, waited)
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
        if confirm is not None:
            lease._confirm_with = confirm
            lease._replicas = confirm.count(waited)
        if _clock() - sent_at > lease._interval and ttl_ms:
            renew_at = _clock()
            try:
                renewed, waited = await self._call(
                    key, ("LEASE.RENEW", key, token, ttl_ms), confirm
                )
            except Exception as e:
                renewed, waited = e, e
            Tracker.apply([(lease, ttl_ms)], [renewed], renew_at, _clock(), [waited])
            lease._renewals = 0
        if lease._state not in ACTIVE:
            raise lease._lost_error()
        self._track(lease)
        return lease

    async def _call(
        self, key: KeyT, command: Tuple[Any, ...], confirm: Optional[Confirm]
    ) -> Tuple[Any, Any]:
        """The command's reply (or its ResponseError) and, with ``confirm``, the reply of
        the WAIT/WAITAOF sent after it in the same pipelined round trip (else None)."""
        del key  # one server: confirmed grants are refused on a cluster client
        if confirm is None:
            try:
                return await self.client.execute_command(*command), None
            except ResponseError as e:
                return e, None
        pipe = self.client.pipeline(transaction=False)
        pipe.execute_command(*command)
        pipe.execute_command(*confirm.command())
        reply, waited = await pipe.execute(raise_on_error=False)
        return reply, waited

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
        if self._stop_when_idle and not self._tracker:
            self._wake()

    def _wake(self) -> None:
        if self._waiter is not None:
            _resolve(self._waiter)

    async def _run(self) -> None:
        while not self._closed:
            now = _clock()
            self._tracker.expire(now)
            if self._stop_when_idle and not self._tracker:
                self._task = None  # the next lease starts another
                await self._drop_idle()
                return
            batch = self._tracker.due(now)
            if not batch:
                wake = self._tracker.next_wake()
                await self._sleep(None if math.isinf(wake) else max(wake - now, 0.0))
                continue
            timeout = batch_timeout(batch, self._tracker, now)
            sent_at = _clock()
            waited: List[Any] = [None] * len(batch)
            try:
                await self._locate(timeout / 2)
                left = max(timeout - (_clock() - sent_at), 0.001)
                replies = await self._send(batch, left, waited)
            except Exception as e:  # never let the watchdog die: count it as unanswered
                replies = [e] * len(batch)
            self.batches += 1
            Tracker.apply(batch, replies, sent_at, _clock(), waited)

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

    def _sentinel_pool(self) -> Any:
        pool = getattr(self.client, "connection_pool", None)
        if pool is not None and hasattr(pool, "get_master_address") and pool.is_master:
            return pool
        return None

    async def _locate(self, timeout: float) -> None:
        """On a Sentinel pool, ask the Sentinels which server is the master before each
        batch (redis-py's own discovery, bounded here by ``timeout``). When it changed,
        redis-py drops the pool's idle connections, so this batch and the client's next
        commands go to the new master: a demoted master goes on accepting writes until
        Sentinel reconfigures it (~10 s), and its connections would otherwise stay."""
        pool = self._sentinel_pool()
        if pool is None:
            return
        request = await _within(pool.get_master_address(), timeout)
        if request is not None:
            # Read, so a failed discovery is not reported as never retrieved; no
            # answer leaves the master last named, still the best guess.
            request.exception()

    async def _send(self, batch: Batch, timeout: float, waited: List[Any]) -> List[Any]:
        """One pipeline (per node on a cluster), its replies awaited at most ``timeout``
        seconds; then it is cancelled (redis-py drops the connection) and every renewal
        in it counts as unanswered. ``waited`` receives, per renewal, the WAIT/WAITAOF
        reply that confirms it (confirmed grants; never on a cluster)."""
        commands = renew_commands(batch)
        leases = [lease for lease, _ttl in batch]
        # WAIT gets most of the batch's time, the renewals' own round trip the rest.
        waits = confirm_commands(leases, int(timeout * 800))
        pipe = self.client.pipeline(transaction=False)
        for command in commands + waits:
            pipe.execute_command(*command)
        request = await _within(pipe.execute(raise_on_error=False), timeout)
        if request is None:
            return [asyncio.TimeoutError("no reply in time")] * len(commands)
        error = request.exception()
        if error is not None:
            return [error] * len(commands)
        replies = list(request.result())
        waited[:] = confirmations(leases, waits, replies[len(commands) :])
        return replies[: len(commands)]

    # -- fenced writes -----------------------------------------------------------------

    async def _fence_once(
        self, resource: KeyT, command: Tuple[Any, ...], timeout: Optional[float]
    ) -> Any:
        """One fenced write on a connection of this client's own, its reply awaited at
        most ``timeout`` seconds (None: the client's socket_timeout); then it is cancelled
        and its connection dropped. Raises Unanswered (saying whether anything was sent)
        for a failure on the connection, the server's error for an error reply."""
        progress = {"sent": False}
        attempt = asyncio.ensure_future(self._fence_attempt(resource, command, progress))
        if timeout is None:
            timeout = self._default_timeout()
        try:
            done, _ = await asyncio.wait({attempt}, timeout=timeout)
        except asyncio.CancelledError:
            attempt.cancel()
            raise
        if not done:
            attempt.cancel()
            with contextlib.suppress(BaseException):
                await attempt
            error = asyncio.TimeoutError("no reply before the lease's deadline")
            raise Unanswered(error, progress["sent"])
        return attempt.result()

    def _default_timeout(self) -> Optional[float]:
        pool = getattr(self.client, "connection_pool", None)
        kwargs = getattr(pool, "connection_kwargs", None) or {}
        return kwargs.get("socket_timeout")

    async def _fence_attempt(
        self, resource: KeyT, command: Tuple[Any, ...], progress: Dict[str, bool]
    ) -> Any:
        cluster = _is_cluster(self.client)
        try:
            node = self.client.get_node_from_key(resource).name if cluster else None
        except Exception as e:
            raise Unanswered(e, sent=False) from e
        asking = False
        for _hop in range(4):
            try:
                conn, address = await self._take(node)
            except Exception as e:
                raise Unanswered(e, sent=False) from e
            try:
                if not conn.is_connected:
                    await conn.connect()
                commands = [("ASKING",), command] if asking else [command]
                progress["sent"] = True
                await conn.send_packed_command(conn.pack_commands(commands), check_health=False)
                if asking:
                    await conn.read_response()
                reply = await conn.read_response()
            except ResponseError as e:
                if is_demoted(e):
                    # Refused, so it did not run; the next attempt asks the Sentinels.
                    await conn.disconnect(nowait=True)
                    self._master_stale = True
                    raise Unanswered(e, sent=False) from e
                self._give(node, conn, address)
                redirect = redirect_of(e)
                if redirect is None or not cluster:
                    raise
                asking, node = redirect
                progress["sent"] = False  # refused: it did not run there
                continue
            except BaseException as e:
                await conn.disconnect(nowait=True)
                if isinstance(e, Exception):
                    raise Unanswered(e, sent=progress["sent"]) from e
                raise
            self._give(node, conn, address)
            return reply
        raise ResponseError(f"too many redirects for the fenced write to {resource!r}")

    async def _take(self, node: Any) -> Tuple[Any, Any]:
        """An idle connection for ``node`` (None: the client's own server), or a new one;
        with the address it is for (a Sentinel pool's master, else None)."""
        address = None
        pool = self._sentinel_pool()
        if node is None and pool is not None:
            address = None if self._master_stale else pool.master_address
            if address is None:
                address = await pool.get_master_address()
                self._master_stale = False
        idle = self._idle.setdefault(node, [])
        while idle:
            conn, at = idle.pop()
            if at == address and conn.is_connected and not await _has_data(conn):
                return conn, at
            await conn.disconnect(nowait=True)
        if node is None:
            source = self.client.connection_pool
            cls, kwargs = source.connection_class, dict(source.connection_kwargs)
        else:
            host, _, port = node.rpartition(":")
            cluster_node = self.client.get_node(host=host, port=int(port))
            if cluster_node is None:
                raise RedisConnectionError(f"no cluster node {node}")
            cls, kwargs = cluster_node.connection_class, dict(cluster_node.connection_kwargs)
            kwargs.update(host=host, port=int(port))
        if issubclass(cls, SentinelManagedConnection):
            # A plain connection to the master named: redis-py 8's send_packed_command
            # would skip the Sentinel override of connect().
            cls = SSLConnection if issubclass(cls, SSLConnection) else Connection
            kwargs.update(host=address[0], port=address[1])  # type: ignore[index]
        kwargs.pop("connection_pool", None)
        kwargs.pop("maint_notifications_pool_handler", None)
        kwargs["retry"] = Retry(NoBackoff(), 0)
        kwargs["health_check_interval"] = 0
        return cls(**kwargs), address

    def _give(self, node: Any, conn: Any, address: Any) -> None:
        self._idle.setdefault(node, []).append((conn, address))

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
        await self._drop_idle()

    async def _drop_idle(self) -> None:
        """Disconnect the fenced writes' idle connections."""
        idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn, _address in conns:
                with contextlib.suppress(Exception):
                    await conn.disconnect()

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


def _is_cluster(client: Any) -> bool:
    return hasattr(client, "get_node_from_key") and hasattr(client, "nodes_manager")


async def _has_data(conn: Any) -> bool:
    """An idle connection with something to read (an EOF: the server closed it; a stray
    reply) is not reused: a write sent on it would be reported indeterminate when it
    surely did not run."""
    # can_read from redis-py 8 on; can_read_destructive before (deprecated in 8).
    probe = getattr(conn, "can_read", None) or conn.can_read_destructive
    try:
        return bool(await probe())
    except Exception:
        return True


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


async def _within(awaitable: Any, timeout: float) -> Optional[asyncio.Future[Any]]:
    """Runs ``awaitable`` for at most ``timeout`` seconds: the finished task, or None
    once it has been cancelled (and awaited, so nothing of it runs on)."""
    task = asyncio.ensure_future(awaitable)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if done:
        return task
    task.cancel()
    with contextlib.suppress(BaseException):
        await task
    return None


# Last: redis_lease.asyncio.Lock builds on this module's Leases.
from ._aiolock import Lock  # noqa: E402
