"""The exceptions of redis_lease (the same classes for the sync and the asyncio API)."""

from __future__ import annotations

from typing import Any, Optional


class LeaseError(Exception):
    """Base class of every redis_lease exception."""


class NotAcquired(LeaseError):
    """LEASE.ACQUIRE answered nil: the key is held, full, delayed or waited for (with
    ``block_ms``: still so when the wait ended)."""

    def __init__(self, key: Any, block_ms: Optional[int] = None) -> None:
        self.key = key
        self.block_ms = block_ms
        waited = "" if block_ms is None else f" within {block_ms} ms"
        super().__init__(f"lease on {key!r} not acquired{waited}")


class NotConfirmed(LeaseError):
    """A grant asked for confirmation (``replicas=``, ``waitaof=``) and too few replicas
    acknowledged it in time (or the primary's fsync was not confirmed): the grant was
    released, as it might not survive a failover. ``replicas`` is how many acknowledged
    (None when WAIT/WAITAOF answered an error), ``needed`` how many were asked for."""

    def __init__(self, message: str, key: Any, replicas: Optional[int], needed: int) -> None:
        super().__init__(message)
        self.key = key
        self.replicas = replicas
        self.needed = needed


class LeaseLost(LeaseError):
    """The lease is no longer held by this token, or may not be: do not act on it.

    ``lease`` is the lease that was lost (None when not known), ``reason`` a short text.
    """

    def __init__(self, message: str, lease: Any = None, reason: Optional[str] = None) -> None:
        super().__init__(message)
        self.lease = lease
        self.reason = reason or message


class StaleFence(LeaseLost):
    """LEASE.FENCE refused the write: the resource already accepted a higher fence, so a
    later holder of the lease has written to it. Nothing ran. A subclass of
    :class:`LeaseLost`: the lease that carried the fence is treated as lost."""

    def __init__(
        self,
        message: str,
        lease: Any = None,
        resource: Any = None,
        fence: Optional[int] = None,
        highest: Optional[int] = None,
    ) -> None:
        super().__init__(message, lease, "stale fence")
        self.resource = resource
        self.fence = fence
        self.highest = highest


class WriteIndeterminate(LeaseError):
    """A fenced write (``fence_call``) was sent and no reply came before the lease's
    deadline, or the connection failed after it was sent: it may have run once (on the
    server it reached, even after this exception), or not at all. It is never sent again
    unless the call asked for retries. Nothing is known of the lease by this alone: see
    its ``state`` (``suspended`` until a renewal confirms it, ``lost`` once its deadline
    has passed).

    ``lease``, ``resource`` and ``fence`` are those of the write; ``attempts`` how many
    times it was sent; the error that ended the last attempt is ``__cause__``.
    """

    def __init__(
        self,
        message: str,
        lease: Any = None,
        resource: Any = None,
        fence: Optional[int] = None,
        attempts: int = 1,
    ) -> None:
        super().__init__(message)
        self.lease = lease
        self.resource = resource
        self.fence = fence
        self.attempts = attempts
