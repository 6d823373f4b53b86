"""Python client for the redis-lease module: leases renewed by one watchdog, a loss
signal the code can wait on, and fencing tokens carried to every write.

    import redis
    from redis_lease import Leases

    leases = Leases(redis.Redis())
    with leases.acquire("lock:report", 10_000) as lease:
        lease.fence_call("fence:report", "HSET", "report", "total", 42)
    leases.close()

``redis_lease.asyncio`` has the same names for ``redis.asyncio``.
"""

from ._core import State
from ._errors import (
    LeaseError,
    LeaseLost,
    NotAcquired,
    NotConfirmed,
    StaleFence,
    WriteIndeterminate,
)
from ._named import ReadWriteLock, Semaphore
from ._sync import Lease, Leases, Session
from .lock import Lock, LockError, LockNotOwnedError

__all__ = [
    "Lease",
    "LeaseError",
    "LeaseLost",
    "Leases",
    "Lock",
    "LockError",
    "LockNotOwnedError",
    "NotAcquired",
    "NotConfirmed",
    "ReadWriteLock",
    "Semaphore",
    "Session",
    "StaleFence",
    "State",
    "WriteIndeterminate",
]

__version__ = "0.1.0"
