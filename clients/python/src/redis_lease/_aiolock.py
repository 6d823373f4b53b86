"""``redis_lease.asyncio.Lock``: redis-py's asyncio ``Lock`` interface over a lease, for
``r.lock(name, timeout=..., lock_class=redis_lease.asyncio.Lock)`` with a
``redis.asyncio`` client. The same lease underneath as ``redis_lease.Lock`` (see
``redis_lease.lock``), renewed by the client's asyncio watchdog task."""

from __future__ import annotations

from types import TracebackType
from typing import Any, Optional, Type, Union

from redis.exceptions import ResponseError

from ._core import ACTIVE, is_wrongtype
from ._errors import LeaseLost, NotAcquired
from .lock import LockError, Number, _LockBase

__all__ = ["Lock"]


class Lock(_LockBase):
    """A lock with redis-py's ``redis.asyncio.lock.Lock`` interface, backed by a lease:
    the sync :class:`redis_lease.Lock`'s behaviour, with coroutines."""

    async def __aenter__(self) -> Lock:
        if await self.acquire():
            return self
        raise LockError("Unable to acquire lock within the time specified", lock_name=self.name)

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc_value: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        try:
            await self.release()
        except LockError:
            if self.raise_on_release_error:
                raise

    async def acquire(
        self,
        blocking: Optional[bool] = None,
        blocking_timeout: Optional[Number] = None,
        token: Optional[Union[str, bytes]] = None,
    ) -> bool:
        """Take the lock: True once held (see the sync ``acquire``)."""
        encoded = self._token(token)
        for block_ms in self._waits(blocking, blocking_timeout):
            try:
                lease = await self.leases.acquire(**self._acquire_options(encoded, block_ms))
            except NotAcquired:
                continue
            except Exception as e:
                refused = self._refused(e)
                if refused is e:
                    raise
                raise refused from e
            return self._granted(encoded, lease)
        return False

    async def locked(self) -> bool:
        """True if anyone holds the lock, or the key holds another type."""
        try:
            reply = await self.redis.execute_command("LEASE.INFO", self.name)
        except ResponseError as e:
            if is_wrongtype(e):
                return True
            raise
        return self._locked_by_reply(reply)

    async def owned(self) -> bool:
        """True if this lock holds it (``LEASE.INFO``: held, with this hold's fence)."""
        lease = self.local.lease
        if lease is None or lease.state not in ACTIVE:
            return False
        try:
            reply = await self.redis.execute_command("LEASE.INFO", self.name)
        except ResponseError as e:
            if is_wrongtype(e):
                return False
            raise
        return self._owned_by_reply(lease, reply)

    async def release(self) -> None:
        """Release the lock. ``LockError`` if this lock does not hold it here,
        ``LockNotOwnedError`` if it was held and no longer is. Cancelled before it
        runs, it leaves the lock held here, to be released again."""
        lease = self._take_for_release()
        if not await lease.release():
            raise self._not_owned("release")

    async def extend(self, additional_time: Number, replace_ttl: bool = False) -> bool:
        """Add ``additional_time`` seconds to the time left (``replace_ttl``: make it the
        time left). Only for a lock with ``timeout``."""
        lease = self._held("extend")
        ttl_ms = self._extended_ttl(lease, additional_time, replace_ttl)
        return await self._renew(lease, ttl_ms, "extend")

    async def reacquire(self) -> bool:
        """Reset the time left to ``timeout``. Only for a lock with ``timeout``."""
        return await self._renew(self._held("reacquire"), self._timeout_ms(), "reacquire")

    async def _renew(self, lease: Any, ttl_ms: int, verb: str) -> bool:
        try:
            await lease.renew(ttl_ms)
        except LeaseLost as e:
            raise self._not_owned(verb) from e
        return True
