"""The sync client: ``Leases`` over a redis-py ``Redis`` or ``RedisCluster``."""

from __future__ import annotations

import contextlib
import threading
import time
from types import TracebackType
from typing import Any, Dict, List, Optional, Tuple, Type

from redis.backoff import NoBackoff
from redis.exceptions import MovedError, ResponseError
from redis.retry import Retry

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
from ._errors import LeaseLost, NotAcquired

__all__ = ["Lease", "Leases", "Session"]

_clock = time.monotonic


def _is_cluster(client: Any) -> bool:
    return hasattr(client, "get_node_from_key") and hasattr(client, "nodes_manager")


def _moved(reply: Any) -> Optional[MovedError]:
    """The redirect in a reply: a MovedError, or (when the connection was set up without
    redis-py's cluster parser, as in redis-py 5) a plain ``MOVED slot host:port`` error."""
    if isinstance(reply, MovedError):
        return reply
    if isinstance(reply, ResponseError) and str(reply).startswith("MOVED "):
        try:
            return MovedError(str(reply)[len("MOVED ") :])
        except (ValueError, IndexError):
            return None
    return None


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
        reply = self._owner.client.execute_command("LEASE.RENEW", self.key, self.token, ttl)
        with self._owner._lock:
            if ttl_ms is not None:
                self._set_ttl(ttl)
            Tracker.apply([(self, ttl)], [reply], sent_at, _clock())
            if self._state not in ACTIVE:
                raise self._lost_error()

    def _set_ttl(self, ttl: int) -> None:
        self.ttl_ms = ttl
        self._interval = ttl / 1000 / 3
        self._renewing = ttl > 0

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

    def fence_call(self, resource: KeyT, *args: Any) -> Any:
        """``LEASE.FENCE resource fence *args``: run the command only if no later holder
        has written through ``resource``, in one atomic step; without a command, raise
        the resource's fence to this one. Returns the command's reply. Raises
        :class:`StaleFence` (and the lease becomes ``lost``) when the resource already
        accepted a higher fence; :class:`LeaseLost` without sending when the lease is
        known to be lost."""
        self.check()
        try:
            return self._owner.client.execute_command("LEASE.FENCE", resource, self.fence, *args)
        except ResponseError as e:
            if not is_stale(e):
                raise
            error = stale_fence(e, self, resource)
            with self._owner._lock:
                self._lose(f"a later holder wrote to {resource!r}")
            raise error from None

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
        if exc is not None and isinstance(exc, LeaseLost):
            return  # the body's own LeaseLost (or StaleFence) says it already
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


class _Link:
    """The watchdog's own connection to one server: no retries, and a timeout set per
    batch, so a server that stops answering turns into ``suspended`` and then ``lost``
    on time instead of hanging the watchdog."""

    def __init__(self, pool: Any) -> None:
        kwargs = dict(pool.connection_kwargs)
        # Belongs to the user's pool (redis-py 6+): the link is not part of that pool.
        kwargs.pop("maint_notifications_pool_handler", None)
        kwargs["retry"] = Retry(NoBackoff(), 0)
        kwargs["health_check_interval"] = 0
        self.conn = pool.connection_class(**kwargs)

    def call(self, commands: List[Tuple[Any, ...]], timeout: float) -> List[Any]:
        conn = self.conn
        conn.socket_timeout = timeout
        conn.socket_connect_timeout = timeout
        sock = getattr(conn, "_sock", None)
        if sock is not None:
            sock.settimeout(timeout)
        try:
            conn.send_packed_command(conn.pack_commands(commands), check_health=False)
            replies: List[Any] = []
            for _ in commands:
                try:
                    replies.append(conn.read_response())
                except ResponseError as e:
                    replies.append(e)
            return replies
        except Exception as e:
            conn.disconnect()
            return [e] * len(commands)

    def close(self) -> None:
        self.conn.disconnect()


class Leases:
    """Acquires leases on one redis-py client (``redis.Redis`` or ``redis.RedisCluster``)
    and keeps them with one watchdog thread, started with the first lease and stopped by
    :meth:`close`.

    ``max_hold_ms`` and ``max_renewals`` cap how long the watchdog keeps a lease (each
    ``acquire`` may override them): past the cap it stops renewing, and the lease ends at
    its deadline (``lost``).
    """

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
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._tracker = Tracker()
        self._thread: Optional[threading.Thread] = None
        self._closed = False
        self._links: Dict[Any, _Link] = {}
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
    ) -> Lease:
        """``LEASE.ACQUIRE`` with these options; a :class:`Lease` the watchdog renews at
        ttl/3. Raises :class:`NotAcquired` on nil (after ``block_ms`` too). With
        ``session``, ``ttl_ms`` may be 0: the hold then lives exactly as long as the
        session and the watchdog renews only the session."""
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
        )

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
        return self._acquire(
            Session, key, ttl_ms, block_ms, token, False, None, None, owner, None, None, None
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
            reply = self.client.execute_command(*args)
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
        # A grant after a long BLOCK: its deadline counts from the grant, which is later
        # than the request; confirm it with a renewal sent now.
        if _clock() - sent_at > lease._interval and ttl_ms:
            renew_at = _clock()
            try:
                renewed = self.client.execute_command("LEASE.RENEW", key, token, ttl_ms)
            except Exception as e:
                renewed = e
            with self._lock:
                Tracker.apply([(lease, ttl_ms)], [renewed], renew_at, _clock())
                lease._renewals = 0
        with self._lock:
            if lease._state not in ACTIVE:
                raise lease._lost_error()
            self._track(lease)
        return lease

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
        self._tracker.discard(lease)

    def _wake(self) -> None:
        self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._closed:
                    return
                now = _clock()
                self._tracker.expire(now)
                batch = self._tracker.due(now)
                if not batch:
                    wake = self._tracker.next_wake()
                    self._cond.wait(None if wake == float("inf") else max(wake - now, 0.0))
                    continue
                timeout = batch_timeout(batch, self._tracker, now)
            sent_at = _clock()
            try:
                replies = self._send(batch, timeout)
            except Exception as e:  # never let the watchdog die: count it as unanswered
                replies = [e] * len(batch)
            with self._cond:
                self.batches += 1
                Tracker.apply(batch, replies, sent_at, _clock())

    def _send(self, batch: Batch, timeout: float) -> List[Any]:
        """One pipelined round trip per server; a reply (or exception) per renewal."""
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
            link = self._link(node)
            answers = link.call([commands[i] for i in indexes], timeout)
            for i, answer in zip(indexes, answers):
                replies[i] = answer
                moved = _moved(answer)
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

    def _link(self, node: Any) -> _Link:
        link = self._links.get(node)
        if link is None:
            if node is None:
                pool = self.client.connection_pool
            else:
                cluster_node = self.client.get_node(node_name=node)
                pool = self.client.get_redis_connection(cluster_node).connection_pool
            link = self._links[node] = _Link(pool)
        return link

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
        for link in self._links.values():
            link.close()
        self._links.clear()

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
