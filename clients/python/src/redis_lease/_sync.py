"""The sync client: ``Leases`` over a redis-py ``Redis`` or ``RedisCluster``."""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from types import TracebackType
from typing import Any, Callable, Dict, List, Optional, Tuple, Type, TypeVar, cast

from redis.backoff import NoBackoff
from redis.connection import Connection, SSLConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.retry import Retry
from redis.sentinel import MasterNotFoundError, SentinelManagedConnection

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
    as_text,
    batch_timeout,
    check_ttl,
    confirm_commands,
    confirmations,
    grant_fence,
    is_demoted,
    is_stale,
    is_wrongtype,
    moved_error,
    new_token,
    redirect_of,
    renew_commands,
    retry_delay,
    stale_fence,
    unconfirmed_grant,
)
from ._errors import LeaseLost, NotAcquired, WriteIndeterminate
from ._named import ReadWriteLock, Semaphore

__all__ = ["Lease", "Leases", "Session"]

_clock = time.monotonic
F = TypeVar("F", bound=Callable[..., Any])


def _is_cluster(client: Any) -> bool:
    return hasattr(client, "get_node_from_key") and hasattr(client, "nodes_manager")


def _pause(delay: float, left: Optional[float]) -> None:
    time.sleep(delay if left is None else min(delay, max(left, 0.0)))


class Lease(LeaseCore):
    """One hold on a key, renewed by its ``Leases``'s watchdog until released or lost.

    Any thread may use it: the token is the ownership, not the thread that acquired it.
    As a context manager it releases on exit, and raises :class:`LeaseLost` when the lease
    was lost while the body ran (a :class:`StaleFence` from the body counts as lost).
    """

    def __init__(self, owner: Leases, *args: Any) -> None:
        #: Set once the lease is lost (never when it is released). Wait on it, or poll it.
        self.lost = threading.Event()
        super().__init__(owner, *args)

    def _fire_lost(self) -> None:
        self.lost.set()

    @property
    def state(self) -> State:
        """``held``, ``suspended``, ``lost`` or ``released`` (see :class:`State`)."""
        with self._owner._lock:
            self._refresh(_clock())
            return self._state

    @property
    def reason(self) -> Optional[str]:
        """Why the lease was lost (None while it is not)."""
        return self._reason

    @property
    def deadline_in(self) -> Optional[float]:
        """Seconds until the deadline last confirmed, on this machine's monotonic clock
        (None for a hold bound to a session that has none)."""
        with self._owner._lock:
            return self._deadline_in(_clock())

    def check(self) -> None:
        """Raise :class:`LeaseLost` unless the lease is held or suspended. Cheap (no
        round trip): call it between steps of the work."""
        with self._owner._lock:
            self._refresh(_clock())
            if self._state not in ACTIVE:
                raise self._lost_error()

    def renew(self, ttl_ms: Optional[int] = None) -> None:
        """Renew now (the watchdog does it on its own; this is for a caller that wants a
        confirmation before a step). ``ttl_ms`` replaces the lease's ttl. Raises
        :class:`LeaseLost` when the server says the token no longer holds the key."""
        self.check()
        ttl = self.ttl_ms if ttl_ms is None else check_ttl(ttl_ms, self.bound)
        sent_at = _clock()
        command = ("LEASE.RENEW", self.key, self.token, ttl)
        reply, waited = self._owner._call(self.key, command, self._confirm_with)
        if isinstance(reply, BaseException) and not is_wrongtype(reply):
            raise reply
        with self._owner._lock:
            if ttl_ms is not None:
                self._retune(ttl, sent_at)
            Tracker.apply([(self, ttl)], [reply], sent_at, _clock(), [waited])
            if self._state not in ACTIVE:
                raise self._lost_error()

    def release(self) -> bool:
        """Release the hold (a session: every hold bound to it too). True if the server
        still had it; False if it was already lost (the state is then ``lost``) or
        released. On a connection error the error propagates and the lease is no longer
        renewed: it ends at its deadline."""
        with self._owner._lock:
            if self._state not in ACTIVE:
                return False
            self._renewing = False
        try:
            reply = self._owner.client.execute_command("LEASE.RELEASE", self.key, self.token)
        except ResponseError as e:
            if not is_wrongtype(e):  # WRONGTYPE: the key was overwritten, the hold is gone
                with self._owner._lock:
                    self._owner._wake()
                raise
            reply = 0
        except Exception:
            with self._owner._lock:
                self._owner._wake()
            raise
        with self._owner._lock:
            if reply in (1, b"1", "1"):
                self._end_released()
                return True
            self._lose("the release found the token no longer holding the key")
            return False

    def fence_call(self, resource: KeyT, *args: Any, retries: int = 0) -> Any:
        """``LEASE.FENCE resource fence *args``: run the command only if no later holder
        has written through ``resource``, in one atomic step; without a command, raise
        the resource's fence to this one. Returns the command's reply.

        The write is sent once, over a connection of this client's own, and its reply
        awaited no longer than the lease's time left. Raises :class:`StaleFence` (and the
        lease becomes ``lost``) when the resource already accepted a higher fence;
        :class:`LeaseLost` without sending when the lease is known to be lost;
        :class:`WriteIndeterminate` when it was sent and no reply came in time or the
        connection failed after sending (the lease is then ``suspended``, or ``lost``
        once its deadline has passed): it may have run, and may still run on the server
        it reached, but this call never sends it again. A connection error before anything
        was sent propagates as redis-py raised it (the write did not run).

        ``retries``: how many more times to send it after such a failure, each on a new
        connection, while the lease is still held or suspended and within its deadline.
        Only for a command that is safe to run twice (a retry after an unanswered attempt
        can make it run twice)."""
        self.check()
        owner = self._owner
        command = ("LEASE.FENCE", resource, self.fence, *args)
        sent = 0
        cause: Optional[BaseException] = None
        while True:
            with owner._lock:
                self._refresh(_clock())
                if self._state not in ACTIVE:
                    if sent:
                        raise self._indeterminate(resource, sent) from cause
                    raise self._lost_error()
                left = self._deadline_in(_clock())
            try:
                return owner._fence_once(resource, command, left)
            except ResponseError as e:
                if not is_stale(e):
                    raise
                error = stale_fence(e, self, resource)
                with owner._lock:
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
                _pause(retry_delay(self.ttl_ms), self._deadline_in(_clock()))

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
        """A fenced write went unanswered: the server may not be answering, so the lease
        is suspended (lost at its deadline) until the watchdog confirms a renewal, which
        it tries at once. A hold that lives by its session suspends the session."""
        with self._owner._lock:
            target: LeaseCore = self
            if not self._renewing and self.session is not None:
                target = self.session
            target._unconfirmed(_clock())
            self._refresh(_clock())
            self._owner._wake()

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        was_lost = self.state is State.LOST
        try:
            self.release()
        except Exception:
            if exc is None:
                raise
        if exc is not None and isinstance(exc, (LeaseLost, WriteIndeterminate)):
            return  # the body's own LeaseLost (StaleFence) or WriteIndeterminate says it
        if was_lost or self._state is State.LOST:
            raise self._lost_error() from exc

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} key={self.key!r} fence={self.fence} state={self._state.value}>"
        )


class Session(Lease):
    """A session: an exclusive lease on its own key that keeps every hold bound to it
    alive with one renewal. ``leases.acquire(key, 0, session=s)`` binds a hold to it;
    releasing or losing the session ends them all."""

    @property
    def holds(self) -> List[Lease]:
        """The holds bound to this session that are still held or suspended."""
        with self._owner._lock:
            return [h for h in self._bound.values() if isinstance(h, Lease)]


def _set_timeout(conn: Any, timeout: Optional[float]) -> None:
    conn.socket_timeout = timeout
    conn.socket_connect_timeout = timeout
    sock = getattr(conn, "_sock", None)
    if sock is not None:
        sock.settimeout(timeout)


def _connected(conn: Any) -> bool:
    return getattr(conn, "_sock", None) is not None


def _connection_settings(pool: Any) -> Tuple[Any, Dict[str, Any]]:
    """The class and arguments of a connection like the pool's (credentials, TLS, db,
    protocol, decoding), with no retries and no health checks: one call is one attempt,
    its time bounded by the caller."""
    kwargs = dict(pool.connection_kwargs)
    # Belongs to the user's pool (redis-py 6+): these connections are not part of it.
    kwargs.pop("maint_notifications_pool_handler", None)
    kwargs.pop("connection_pool", None)
    kwargs["retry"] = Retry(NoBackoff(), 0)
    kwargs["health_check_interval"] = 0
    cls = pool.connection_class
    if issubclass(cls, SentinelManagedConnection):
        # Dialled at the address the Sentinels name (see _Sentinels), as a plain
        # connection: redis-py 8's send_packed_command connects through
        # connect_check_health(), which skips SentinelManagedConnection.connect() (the
        # override that asks the Sentinels), and such a connection dials localhost:6379.
        cls = SSLConnection if issubclass(cls, SSLConnection) else Connection
    return cls, kwargs


class _Sentinels:
    """Which server the Sentinels of a ``Sentinel(...).master_for(name)`` pool name as the
    master, decided as redis-py's ``discover_master`` does (the first Sentinel that names
    a master it does not see down, with enough other Sentinels in view; it then goes
    first), but over connections of this client's own, each call bounded by a timeout: a
    Sentinel that does not answer costs at most the time left, never a hung watchdog."""

    def __init__(self, pool: Any) -> None:
        manager = pool.sentinel_manager
        self.service = pool.service_name
        self.min_other = int(getattr(manager, "min_other_sentinels", 0) or 0)
        self.force_ip = getattr(manager, "_force_master_ip", None)
        # The watchdog and the threads of fenced writes ask through the same connections.
        self._lock = threading.Lock()
        self.conns = []
        for sentinel in manager.sentinels:
            cls, kwargs = _connection_settings(sentinel.connection_pool)
            self.conns.append(cls(**kwargs))

    def master(self, timeout: float) -> Optional[Tuple[str, int]]:
        """The master's (host, port), or None when no Sentinel names one in time."""
        deadline = _clock() + timeout
        if not self._lock.acquire(timeout=timeout):
            return None
        try:
            return self._ask(deadline)
        finally:
            self._lock.release()

    def _ask(self, deadline: float) -> Optional[Tuple[str, int]]:
        for i, conn in enumerate(self.conns):
            left = deadline - _clock()
            if left <= 0:
                return None
            _set_timeout(conn, left)
            try:
                conn.send_command("SENTINEL", "MASTER", self.service, check_health=False)
                reply = conn.read_response()
            except ResponseError:  # this Sentinel does not know the name
                continue
            except Exception:
                conn.disconnect()
                continue
            address = self._address(reply)
            if address is not None:
                if i:
                    self.conns.insert(0, self.conns.pop(i))
                return address
        return None

    def _address(self, reply: Any) -> Optional[Tuple[str, int]]:
        if isinstance(reply, dict):
            pairs = list(reply.items())
        elif isinstance(reply, (list, tuple)):
            pairs = list(zip(reply[::2], reply[1::2]))
        else:
            return None
        fields = {as_text(k): v for k, v in pairs}
        flags = set(as_text(fields.get("flags", "")).split(","))
        if "master" not in flags or "s_down" in flags or "o_down" in flags:
            return None
        try:
            if int(fields.get("num-other-sentinels", 0)) < self.min_other:
                return None
            host = self.force_ip if self.force_ip is not None else as_text(fields["ip"])
            return host, int(fields["port"])
        except (KeyError, ValueError):
            return None

    def close(self) -> None:
        with self._lock:
            for conn in self.conns:
                conn.disconnect()


class _Endpoint:
    """How this client reaches one server besides the user's pool: the watchdog's link
    (one connection, used by its thread alone) and the connections of fenced writes (any
    thread; reused while they work, dropped on any failure). On a Sentinel pool the
    address is the master the Sentinels name, asked again before every renewal batch, so
    the renewals and the fenced writes follow a failover within one renewal interval
    (a demoted master goes on accepting writes until Sentinel reconfigures it, ~10 s)."""

    def __init__(self, pool: Any) -> None:
        self.cls, self.kwargs = _connection_settings(pool)
        sentinel = issubclass(pool.connection_class, SentinelManagedConnection)
        self.sentinels = _Sentinels(pool) if sentinel else None
        #: Sentinel: the master last named (None before the first answer).
        self.address: Optional[Tuple[str, int]] = None
        self.default_timeout: Optional[float] = self.kwargs.get("socket_timeout")
        self.link = _Link(self)
        self._idle: List[Tuple[Any, Any]] = []
        self._lock = threading.Lock()

    def locate(self, timeout: float) -> None:
        """Sentinel: ask again which server is the master (keep the last answer when no
        Sentinel gives one: the server last named is still the best guess)."""
        if self.sentinels is not None:
            found = self.sentinels.master(timeout)
            if found is not None:
                self.address = found

    def connection(self) -> Any:
        """A new, unconnected connection to the server this endpoint stands for now."""
        if self.sentinels is None:
            return self.cls(**self.kwargs)
        if self.address is None:
            raise MasterNotFoundError("no Sentinel named a master in time")
        host, port = self.address
        return self.cls(**{**self.kwargs, "host": host, "port": port})

    def take(self) -> Tuple[Any, Any]:
        """A connection for one fenced write, and the address it is for."""
        with self._lock:
            while self._idle:
                conn, address = self._idle.pop()
                if address == self.address and _idle_clean(conn):
                    return conn, address
                conn.disconnect()
        return self.connection(), self.address

    def give(self, conn: Any, address: Any) -> None:
        with self._lock:
            if address == self.address and _connected(conn):
                self._idle.append((conn, address))
                return
        conn.disconnect()

    def close(self) -> None:
        self.link.close()
        with self._lock:
            idle, self._idle = self._idle, []
        for conn, _address in idle:
            conn.disconnect()
        if self.sentinels is not None:
            self.sentinels.close()


def _idle_clean(conn: Any) -> bool:
    """An idle connection with nothing to read (an EOF or a stray reply says the server
    closed it, or something is out of step): a write sent on a closed connection would be
    reported indeterminate when it surely did not run."""
    try:
        return _connected(conn) and not conn.can_read(timeout=0)
    except Exception:
        return False


class _Link:
    """The watchdog's own connection to one server: no retries, and a timeout set per
    batch, so a server that stops answering turns into ``suspended`` and then ``lost``
    on time instead of hanging the watchdog. A ``READONLY`` reply (a master demoted under
    it) is a connection loss, not an answer: the connection is dropped and the next batch
    goes where the Sentinels say."""

    def __init__(self, endpoint: _Endpoint) -> None:
        self.endpoint = endpoint
        self.conn: Any = None
        self.address: Any = None

    def call(self, commands: List[Tuple[Any, ...]], timeout: float) -> List[Any]:
        endpoint = self.endpoint
        deadline = _clock() + timeout
        if endpoint.sentinels is not None:
            # Half the time at most: the renewals need the rest.
            endpoint.locate(timeout / 2)
            if self.conn is not None and self.address != endpoint.address:
                self.close()
        replies: List[Any] = []
        try:
            if self.conn is None:
                self.conn = endpoint.connection()
                self.address = endpoint.address
            conn = self.conn
            _set_timeout(conn, max(deadline - _clock(), 0.001))
            conn.send_packed_command(conn.pack_commands(commands), check_health=False)
            for _ in commands:
                try:
                    replies.append(conn.read_response())
                except ResponseError as e:
                    if is_demoted(e):
                        raise RedisConnectionError(f"{self.address} is a replica now: {e}") from e
                    replies.append(e)
            return replies
        except Exception as e:
            self.close()
            return replies + [e] * (len(commands) - len(replies))

    def close(self) -> None:
        if self.conn is not None:
            self.conn.disconnect()
        self.conn = None
        self.address = None


class Leases:
    """Acquires leases on one redis-py client (``redis.Redis`` or ``redis.RedisCluster``)
    and keeps them with one watchdog thread, started with the first lease and stopped by
    :meth:`close`.

    ``max_hold_ms`` and ``max_renewals`` cap how long the watchdog keeps a lease (each
    ``acquire`` may override them): past the cap it stops renewing, and the lease ends at
    its deadline (``lost``).

    ``replicas`` (and ``replica_timeout_ms``, default 100) ask for confirmed grants:
    ``WAIT replicas timeout`` goes in the same pipelined round trip as each
    ``LEASE.ACQUIRE`` and each renewal. A grant too few replicas acknowledged is released
    and raises :class:`NotConfirmed`; such a renewal makes the lease ``lost``.
    ``waitaof=True`` sends ``WAITAOF 1 replicas timeout`` instead: the primary's own
    fsync confirms too (Redis 7.2+ and Valkey, with ``appendonly yes``; Redis 7.0 has no
    WAITAOF and answers an error). Each ``acquire`` may override them.
    """

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
        Confirm.of(replicas, replica_timeout_ms, waitaof)  # checks the values now
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._tracker = Tracker()
        self._thread: Optional[threading.Thread] = None
        self._closed = False
        self._endpoints: Dict[Any, _Endpoint] = {}
        self._endpoints_lock = threading.Lock()
        # The watchdog thread ends when no lease is left, and the next lease starts
        # another (redis_lease.Lock's shared Leases, which nobody closes).
        self._stop_when_idle = False
        #: Renewal batches sent (one pipelined round trip per server each).
        self.batches = 0

    # -- acquiring ---------------------------------------------------------------------

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
    ) -> Lease:
        """``LEASE.ACQUIRE`` with these options; a :class:`Lease` the watchdog renews at
        ttl/3. Raises :class:`NotAcquired` on nil (after ``block_ms`` too). With
        ``session``, ``ttl_ms`` may be 0: the hold then lives exactly as long as the
        session and the watchdog renews only the session. ``replicas``,
        ``replica_timeout_ms`` and ``waitaof`` override the client's (see
        :class:`Leases`); :class:`NotConfirmed` when too few replicas confirmed."""
        confirm = self._confirm(replicas, replica_timeout_ms, waitaof)
        return self._acquire(
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

    def _confirm(
        self, replicas: Optional[int], timeout_ms: Optional[int], aof: Optional[bool]
    ) -> Optional[Confirm]:
        return Confirm.of(
            self.replicas if replicas is None else replicas,
            self.replica_timeout_ms if timeout_ms is None else timeout_ms,
            self.waitaof if aof is None else aof,
        )

    def locked(self, key: KeyT, ttl_ms: int, **options: Any) -> Callable[[F], F]:
        """A decorator: the function runs holding the lease (``with
        leases.acquire(key, ttl_ms, **options)``); :class:`NotAcquired` when it is not
        granted, :class:`LeaseLost` when it was lost while the function ran.

            @leases.locked("lock:nightly", 60_000, block_ms=0)
            def nightly(): ...
        """

        def decorate(fn: F) -> F:
            @functools.wraps(fn)
            def held(*args: Any, **kwargs: Any) -> Any:
                with self.acquire(key, ttl_ms, **options):
                    return fn(*args, **kwargs)

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
    ) -> Session:
        """A :class:`Session` on ``key`` (default ``lease:session:<token>``; in a cluster
        pass a key with the hash tag of the keys you will bind, e.g.
        ``{worker7}session``)."""
        token = token or new_token()
        key = key if key is not None else f"lease:session:{token}"
        confirm = self._confirm(None, None, None)
        return self._acquire(
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

    def _acquire(
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
            reply, waited = self._call(key, tuple(args), confirm)
            if isinstance(reply, BaseException):
                raise reply
        except ResponseError:
            raise
        except Exception:
            # The grant may have happened with its reply lost: the token is ours alone,
            # so releasing it undoes exactly that, or nothing.
            self._release_quietly(key, token)
            raise
        fence = grant_fence(reply, key)
        if fence is None:
            raise NotAcquired(key, block_ms)
        if confirm is not None and not confirm.met(waited):
            self._release_quietly(key, token)
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
        # A grant after a long BLOCK: its deadline counts from the grant, which is later
        # than the request; confirm it with a renewal sent now.
        if _clock() - sent_at > lease._interval and ttl_ms:
            renew_at = _clock()
            try:
                renewed, waited = self._call(key, ("LEASE.RENEW", key, token, ttl_ms), confirm)
            except Exception as e:
                renewed, waited = e, e
            with self._lock:
                Tracker.apply(
                    [(lease, ttl_ms)],
                    [renewed],
                    renew_at,
                    _clock(),
                    [waited],
                )
                lease._renewals = 0
        with self._lock:
            if lease._state not in ACTIVE:
                raise lease._lost_error()
            self._track(lease)
        return lease

    def _call(
        self, key: KeyT, command: Tuple[Any, ...], confirm: Optional[Confirm]
    ) -> Tuple[Any, Any]:
        """The command's reply (or its ResponseError) and, with ``confirm``, the reply of
        the WAIT/WAITAOF sent after it in the same pipelined round trip to the server
        that holds ``key`` (else None)."""
        if confirm is None:
            try:
                return self.client.execute_command(*command), None
            except ResponseError as e:
                return e, None
        client = self.client
        if _is_cluster(client):
            client = client.get_redis_connection(client.get_node_from_key(key))
        pipe = client.pipeline(transaction=False)
        pipe.execute_command(*command)
        pipe.execute_command(*confirm.command())
        reply, waited = pipe.execute(raise_on_error=False)
        return reply, waited

    def _release_quietly(self, key: KeyT, token: KeyT) -> None:
        # Best effort: without it the hold ends at its ttl.
        with contextlib.suppress(Exception):
            self.client.execute_command("LEASE.RELEASE", key, token)

    def _release_all(self, leases: List[LeaseCore]) -> None:
        if not leases:
            return
        try:
            pipe = self.client.pipeline(transaction=False)
            for lease in leases:
                pipe.execute_command("LEASE.RELEASE", lease.key, lease.token)
            pipe.execute(raise_on_error=False)
        except Exception:
            pass

    # -- the watchdog ------------------------------------------------------------------

    def _track(self, lease: Lease) -> None:
        if self._closed:
            return
        self._tracker.add(lease)
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="redis-lease-watchdog", daemon=True
            )
            self._thread.start()
        self._cond.notify_all()

    def _forget(self, lease: LeaseCore) -> None:
        # Called with the lock held.
        self._tracker.discard(lease)
        if self._stop_when_idle and not self._tracker:
            self._cond.notify_all()

    def _wake(self) -> None:
        self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._closed:
                    return
                now = _clock()
                self._tracker.expire(now)
                if self._stop_when_idle and not self._tracker:
                    # Under the lock: a new watchdog cannot start before this is done.
                    self._thread = None
                    with self._endpoints_lock:
                        for endpoint in self._endpoints.values():
                            endpoint.close()  # reconnects on next use
                    return
                batch = self._tracker.due(now)
                if not batch:
                    wake = self._tracker.next_wake()
                    self._cond.wait(None if wake == float("inf") else max(wake - now, 0.0))
                    continue
                timeout = batch_timeout(batch, self._tracker, now)
            sent_at = _clock()
            waited: List[Any] = [None] * len(batch)
            try:
                replies = self._send(batch, timeout, waited)
            except Exception as e:  # never let the watchdog die: count it as unanswered
                replies = [e] * len(batch)
            with self._cond:
                self.batches += 1
                Tracker.apply(batch, replies, sent_at, _clock(), waited)

    def _send(self, batch: Batch, timeout: float, waited: List[Any]) -> List[Any]:
        """One pipelined round trip per server; a reply (or exception) per renewal, and in
        ``waited`` the WAIT/WAITAOF reply that confirms each (confirmed grants)."""
        groups: Dict[Any, List[int]] = {}
        replies: List[Any] = [None] * len(batch)
        for i, (lease, _ttl) in enumerate(batch):
            try:
                node = self._node_for(lease.key)
            except Exception as e:
                replies[i] = e
                continue
            groups.setdefault(node, []).append(i)
        commands = renew_commands(batch)
        for node, indexes in groups.items():
            link = self._endpoint(node).link
            # WAIT gets most of the batch's time, the renewals' own round trip the rest.
            waits = confirm_commands([batch[i][0] for i in indexes], int(timeout * 800))
            answers = link.call([commands[i] for i in indexes] + waits, timeout)
            confirmed = confirmations(
                [batch[i][0] for i in indexes], waits, answers[len(indexes) :]
            )
            for i, wait in zip(indexes, confirmed):
                waited[i] = wait
            for i, answer in zip(indexes, answers):
                replies[i] = answer
                moved = moved_error(answer)
                if moved is not None:
                    self._note_redirect(moved)
        return replies

    def _node_for(self, key: KeyT) -> Any:
        if not _is_cluster(self.client):
            return None
        # Through the nodes manager: it applies a redirect noted by _note_redirect
        # (RedisCluster.get_node_from_key reads the slot table directly in redis-py 5).
        manager = self.client.nodes_manager
        return manager.get_node_from_slot(self.client.keyslot(key)).name

    def _endpoint(self, node: Any) -> _Endpoint:
        with self._endpoints_lock:
            endpoint = self._endpoints.get(node)
            if endpoint is None:
                if node is None:
                    pool = self.client.connection_pool
                else:
                    cluster_node = self.client.get_node(node_name=node)
                    if cluster_node is None:
                        raise RedisConnectionError(f"no cluster node {node}")
                    pool = self.client.get_redis_connection(cluster_node).connection_pool
                endpoint = self._endpoints[node] = _Endpoint(pool)
            return endpoint

    # -- fenced writes -----------------------------------------------------------------

    def _fence_once(
        self, resource: KeyT, command: Tuple[Any, ...], timeout: Optional[float]
    ) -> Any:
        """Send one fenced write and read its reply, within ``timeout`` seconds (None: the
        client's socket_timeout), on a connection of this client's own. In a cluster a
        MOVED or ASK reply (the write did not run) is followed, a few hops at most. A
        failure on the connection raises Unanswered, saying whether anything was sent."""
        start = _clock()
        try:
            node = self._node_for(resource)
        except Exception as e:
            raise Unanswered(e, sent=False) from e
        asking = False
        for _hop in range(4):
            try:
                endpoint = self._endpoint(node)
            except Exception as e:
                raise Unanswered(e, sent=False) from e
            limit = endpoint.default_timeout if timeout is None else timeout
            deadline = None if limit is None else start + limit

            def left(deadline: Optional[float] = deadline) -> Optional[float]:
                return None if deadline is None else max(deadline - _clock(), 0.001)

            if endpoint.sentinels is not None and endpoint.address is None:
                endpoint.locate(left() or 1.0)
            sent = False
            try:
                conn, address = endpoint.take()
            except Exception as e:
                raise Unanswered(e, sent=False) from e
            try:
                _set_timeout(conn, left())
                if not _connected(conn):
                    conn.connect()
                    _set_timeout(conn, left())
                commands = [("ASKING",), command] if asking else [command]
                sent = True
                conn.send_packed_command(conn.pack_commands(commands), check_health=False)
                if asking:
                    conn.read_response()
                reply = conn.read_response()
            except ResponseError as e:
                if is_demoted(e):
                    # Refused, so it did not run; the next attempt asks the Sentinels.
                    conn.disconnect()
                    if endpoint.address == address:
                        endpoint.address = None
                    raise Unanswered(e, sent=False) from e
                endpoint.give(conn, address)
                redirect = redirect_of(e)
                if redirect is None or node is None:
                    raise
                asking, target = redirect
                moved = None if asking else moved_error(e)
                if moved is not None:
                    self._note_redirect(moved)
                node = target
                continue
            except Exception as e:
                conn.disconnect()
                raise Unanswered(e, sent=sent) from e
            endpoint.give(conn, address)
            return reply
        raise ResponseError(f"too many redirects for the fenced write to {resource!r}")

    def _note_redirect(self, error: Exception) -> None:
        # Let the cluster client learn the new slot owner, as its own commands would
        # (redis-py 7+: move_slot; before: update_moved_exception, applied lazily).
        manager = getattr(self.client, "nodes_manager", None)
        update = getattr(manager, "move_slot", None) or getattr(
            manager, "update_moved_exception", None
        )
        if update is not None:
            # A stale slot map only costs another retry.
            with contextlib.suppress(Exception):
                update(error)

    # -- closing -----------------------------------------------------------------------

    def close(self) -> None:
        """Stop the watchdog and wait for its thread to end. Leases still held are
        released (best effort, one round trip each) and become ``lost``: their holder can
        no longer count on them, and their ``lost`` event fires."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
            remaining = list(self._tracker.leases.values())
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        self._release_all([lease for lease in remaining if lease._state in ACTIVE])
        with self._lock:
            for lease in remaining:
                lease._lose("Leases.close() was called while it was held")
        with self._endpoints_lock:
            endpoints = list(self._endpoints.values())
            self._endpoints.clear()
        for endpoint in endpoints:
            endpoint.close()

    def __enter__(self) -> Leases:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def held(self) -> List[Lease]:
        """The leases this watchdog keeps (held or suspended)."""
        with self._lock:
            return [lease for lease in self._tracker.leases.values() if isinstance(lease, Lease)]

    @property
    def watchdog(self) -> Optional[threading.Thread]:
        """The watchdog thread (None before the first lease and after close())."""
        thread = self._thread
        return thread if thread is not None and thread.is_alive() else None
