"""Named types over shared holds (ReadWriteLock, Semaphore) and the ``locked``
decorator, sync and asyncio, against a real server."""

from __future__ import annotations

import asyncio
import threading

import pytest
import redis.asyncio
from servers import wait_until
from test_sync import info, is_free

from redis_lease import LeaseLost, Leases, NotAcquired, ReadWriteLock, Semaphore, State
from redis_lease import asyncio as lease_asyncio


@pytest.fixture
def leases(r):
    ls = Leases(r)
    yield ls
    ls.close()


def test_readers_share_and_a_writer_excludes_them(r, leases, key):
    rw = leases.rwlock(key, 5000)
    assert isinstance(rw, ReadWriteLock)
    first, second = rw.read(), rw.read()
    assert first.fence < second.fence
    assert info(r, key)["mode"] == "shared"
    assert info(r, key)["holders"] == 2
    with pytest.raises(NotAcquired):
        rw.write()
    first.release()
    second.release()
    with rw.write() as writer:
        assert info(r, key)["mode"] == "exclusive"
        assert writer.fence > second.fence
        with pytest.raises(NotAcquired):
            rw.read()
    assert is_free(r, key)


def test_a_waiting_writer_is_not_starved_by_new_readers(r, leases, key):
    rw = leases.rwlock(key, 5000)
    reader = rw.read()
    other = Leases(r)
    try:
        got = []
        writer = threading.Thread(target=lambda: got.append(rw.write(block_ms=5000)))
        writer.start()
        wait_until("the writer to queue", lambda: info(r, key)["waiters"] == 1)
        with pytest.raises(NotAcquired):
            other.acquire(key, 5000, shared=True)  # a new reader queues behind the writer
        reader.release()
        writer.join(5)
        assert got and got[0].state is State.HELD
        got[0].release()
    finally:
        other.close()


def test_a_semaphore_grants_its_permits_and_no_more(r, leases, key):
    pool = leases.semaphore(key, 2, 5000)
    assert isinstance(pool, Semaphore)
    a, b = pool.acquire(), pool.acquire()
    assert info(r, key)["limit"] == 2
    with pytest.raises(NotAcquired):
        pool.acquire()
    a.release()
    with pool.acquire() as c:
        assert c.fence > b.fence
    b.release()
    with pytest.raises(ValueError):
        leases.semaphore(key, 0, 5000)


def test_the_locked_decorator_holds_while_the_function_runs(r, leases, key):
    @leases.locked(key, 5000)
    def work(x):
        assert info(r, key)["state"] == "held"
        return x * 2

    assert work(21) == 42
    assert work.__name__ == "work"
    assert is_free(r, key)

    other = leases.acquire(key, 5000)
    with pytest.raises(NotAcquired):
        work(1)
    other.release()

    @leases.locked(key, 5000)
    def loses_it():
        r.delete(key)
        leases.held[0].lost.wait(5)

    with pytest.raises(LeaseLost):
        loses_it()


def test_asyncio_named_types_and_decorator(server, key):
    async def scenario():
        client = redis.asyncio.Redis(host="127.0.0.1", port=server.port, decode_responses=True)
        leases = lease_asyncio.Leases(client)
        try:
            rw = leases.rwlock(key, 5000)
            async with rw.read() as reader:
                assert reader.state is State.HELD
                with pytest.raises(NotAcquired):
                    await rw.write()
            pool = leases.semaphore(f"{key}:pool", 1, 5000)
            held = await pool.acquire()
            with pytest.raises(NotAcquired):
                await pool.acquire()
            await held.release()

            @leases.locked(key, 5000)
            async def work():
                return await client.execute_command("LEASE.INFO", key)

            reply = await work()
            assert (reply if isinstance(reply, dict) else dict(zip(reply[::2], reply[1::2])))[
                "state"
            ] == "held"
            with pytest.raises(TypeError):
                leases.locked(key, 5000)(lambda: None)
        finally:
            await leases.close()
            await client.aclose() if hasattr(client, "aclose") else await client.close()

    asyncio.run(scenario())
