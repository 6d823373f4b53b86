"""Named types over LEASE.ACQUIRE's shared holds, for the sync and the asyncio client
alike: each method returns what ``Leases.acquire`` returns (a ``Lease``, or with
``redis_lease.asyncio`` an awaitable that is also an ``async with`` context)."""

from __future__ import annotations

from typing import Any, Dict

from ._core import KeyT, check_ttl

__all__ = ["ReadWriteLock", "Semaphore"]


class ReadWriteLock:
    """Many readers or one writer on ``key``: ``read()`` is a shared hold, ``write()`` an
    exclusive one. Waiting (``block_ms``) is first come, first served across both, so a
    stream of readers cannot starve a waiting writer. Every hold has its own fence.

        rw = leases.rwlock("doc:7", 10_000)
        with rw.read() as lease: ...
        with rw.write(block_ms=5_000) as lease: ...
    """

    def __init__(self, leases: Any, key: KeyT, ttl_ms: int, **options: Any) -> None:
        check_ttl(ttl_ms, "session" in options)
        self.leases = leases
        self.key = key
        self.ttl_ms = ttl_ms
        self.options: Dict[str, Any] = options

    def read(self, **options: Any) -> Any:
        """A shared hold (``options`` as ``Leases.acquire``'s, over the lock's own)."""
        return self.leases.acquire(
            self.key, self.ttl_ms, **{**self.options, **options}, shared=True
        )

    def write(self, **options: Any) -> Any:
        """The exclusive hold: granted when no reader or writer holds the key."""
        return self.leases.acquire(self.key, self.ttl_ms, **{**self.options, **options})

    def __repr__(self) -> str:
        return f"<{type(self).__name__} key={self.key!r}>"


class Semaphore:
    """At most ``permits`` holders of ``key`` at once (``SHARED LIMIT permits``): each
    ``acquire()`` takes one permit, released with its lease. Every holder must state the
    same number of permits (the module refuses another one while the key has holders).

        pool = leases.semaphore("gpu", 4, 30_000)
        with pool.acquire(block_ms=10_000) as lease: ...
    """

    def __init__(self, leases: Any, key: KeyT, permits: int, ttl_ms: int, **options: Any) -> None:
        if isinstance(permits, bool) or not isinstance(permits, int) or permits < 1:
            raise ValueError("permits must be an int >= 1")
        check_ttl(ttl_ms, "session" in options)
        self.leases = leases
        self.key = key
        self.permits = permits
        self.ttl_ms = ttl_ms
        self.options: Dict[str, Any] = options

    def acquire(self, **options: Any) -> Any:
        """One permit (``options`` as ``Leases.acquire``'s, over the semaphore's own)."""
        return self.leases.acquire(
            self.key, self.ttl_ms, **{**self.options, **options}, shared=True, limit=self.permits
        )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} key={self.key!r} permits={self.permits}>"
