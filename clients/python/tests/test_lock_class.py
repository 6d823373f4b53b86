"""redis_lease.Lock as redis-py's lock_class, beyond redis-py's own lock tests (which
redis_py_suite/run.py runs against it): what the lease adds underneath."""

from __future__ import annotations

import asyncio
import functools
import threading
import time

import pytest
import redis
import redis.asyncio
from servers import wait_until
from test_sync import info

import redis_lease
import redis_lease.asyncio
from redis_lease import Lock, LockError, LockNotOwnedError, State


def lock(r, key, **kwargs):
    return r.lock(key, lock_class=Lock, **kwargs)


def test_errors_are_redis_pys():
    assert issubclass(LockError, redis.exceptions.LockError)
    assert issubclass(LockNotOwnedError, redis.exceptions.LockNotOwnedError)
    assert issubclass(LockNotOwnedError, LockError)
    assert issubclass(LockError, redis_lease.LeaseError)


def test_each_hold_has_a_higher_fence(r, key):
    first = lock(r, key)
    assert first.fence is None
    assert first.acquire(blocking=False)
    fence = first.fence
    assert info(r, key)["fence"] == fence
    first.release()
    assert first.fence is None
    second = lock(r, key)
    assert second.acquire(blocking=False)
    assert second.fence > fence
    second.release()


def test_without_timeout_the_watchdog_keeps_it_past_its_lease_ttl(r, key):
    # A ttl long enough for a loaded machine: a renewal every 250 ms.
    with r.lock(key, lock_class=functools.partial(Lock, lease_ttl=0.75)) as held:
        time.sleep(2.4)  # more than three lease ttls
        assert held.owned()
        assert held.lease.renewals >= 3
        assert held.lease.state is State.HELD


def test_with_timeout_it_expires_unless_extended(r, key):
    expiring = lock(r, key, timeout=0.3)
    assert expiring.acquire(blocking=False)
    assert expiring.lease.lost.wait(2)
    wait_until("the server to free it", lambda: not expiring.locked())
    with pytest.raises(LockNotOwnedError):
        expiring.release()

    extended = lock(r, key, timeout=0.3)
    assert extended.acquire(blocking=False)
    assert extended.extend(2)
    assert extended.lease.deadline_in > 1.5
    time.sleep(0.5)
    assert extended.owned()
    assert extended.reacquire()
    assert extended.lease.deadline_in <= 0.3
    extended.release()
    # The client's shared watchdog thread ends once no lock is held.
    wait_until("the watchdog to end", lambda: redis_lease.lock.leases_for(r).watchdog is None)


def test_a_blocked_acquire_is_served_when_the_holder_releases(r, key):
    holder = lock(r, key)
    assert holder.acquire(blocking=False)
    got = []
    waiter = threading.Thread(target=lambda: got.append(lock(r, key).acquire(blocking_timeout=5)))
    waiter.start()
    wait_until("the waiter to queue", lambda: info(r, key)["waiters"] == 1)
    holder.release()
    waiter.join(5)
    assert got == [True]


def test_owned_is_false_once_another_holder_has_it(r, key):
    first = lock(r, key, timeout=0.2)
    assert first.acquire(blocking=False)
    second = lock(r, key)
    assert second.acquire(blocking_timeout=2)  # after the first expired
    assert not first.owned()
    assert second.owned()
    with pytest.raises(LockNotOwnedError):
        first.release()
    assert second.locked()
    second.release()


def test_another_thread_cannot_release_a_thread_local_lock(r, key):
    shared = lock(r, key)
    assert shared.acquire(blocking=False)
    errors = []

    def release():
        try:
            shared.release()
        except LockError as e:
            errors.append(e)

    t = threading.Thread(target=release)
    t.start()
    t.join()
    assert len(errors) == 1 and not isinstance(errors[0], LockNotOwnedError)
    assert shared.owned()
    shared.release()


def test_a_fenced_write_through_the_lock(r, key):
    with lock(r, key) as held:
        assert held.lease.fence_call(f"{key}:resource", "SET", f"{key}:value", "v") in ("OK", b"OK")
    assert r.get(f"{key}:value") == "v"


def test_a_wait_longer_than_the_socket_timeout_waits_in_steps(server, key):
    # redis-py's lock waits as long as it takes by default; so does this one, in
    # steps within the client's socket timeout instead of ending in a TimeoutError.
    short = server.client(socket_timeout=0.5)
    try:
        holder = lock(short, key, timeout=1.5)
        assert holder.acquire(blocking=False)
        waiter = lock(short, key)
        start = time.monotonic()
        assert waiter.acquire()  # after the holder's 1.5 s, three socket timeouts
        assert time.monotonic() - start >= 1.0
        assert waiter.owned()
        waiter.release()
    finally:
        short.close()


def test_the_asyncio_lock_class(server, key):
    async def scenario():
        client = redis.asyncio.Redis(host="127.0.0.1", port=server.port)
        try:
            # A ttl long enough for a loaded machine: a renewal every 250 ms.
            lock_class = functools.partial(redis_lease.asyncio.Lock, lease_ttl=0.75)
            async with client.lock(key, lock_class=lock_class) as held:
                assert isinstance(held, redis_lease.asyncio.Lock)
                fence = held.fence
                await asyncio.sleep(2.4)  # more than three lease ttls: the task renews
                assert await held.owned()
                assert held.lease.renewals >= 3
                other = client.lock(key, lock_class=redis_lease.asyncio.Lock)
                assert not await other.acquire(blocking_timeout=0.2)
            assert not await held.locked()
            expiring = client.lock(key, timeout=0.3, lock_class=redis_lease.asyncio.Lock)
            assert await expiring.acquire(blocking=False)
            assert expiring.fence > fence
            assert await expiring.extend(1)
            assert expiring.lease.deadline_in > 0.9
            await asyncio.wait_for(expiring.lease.lost.wait(), 5)
            with pytest.raises(LockNotOwnedError):
                await expiring.release()
            # The shared watchdog task ends once no lock is held.
            leases = redis_lease.lock.leases_for(client)
            await asyncio.sleep(0.05)
            assert leases.watchdog is None
        finally:
            await client.aclose() if hasattr(client, "aclose") else await client.close()

    asyncio.run(scenario())
