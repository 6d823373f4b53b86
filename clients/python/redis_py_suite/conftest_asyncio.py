"""Fixtures for redis-py's asyncio lock tests (``tests/test_asyncio/test_lock.py``),
run against ``redis_lease.asyncio.Lock``: the async ``r`` and ``create_redis`` that
redis-py's ``tests/test_asyncio/conftest.py`` provides, on the server of the parent
conftest. run.py copies this file as test_asyncio/conftest.py."""

from __future__ import annotations

import pytest
import pytest_asyncio
import redis.asyncio


async def _close(client):
    await client.flushdb()
    await (client.aclose() if hasattr(client, "aclose") else client.close())


@pytest_asyncio.fixture
async def create_redis(server):
    clients = []

    async def factory(flushdb=True, **kwargs):
        client = redis.asyncio.Redis(host="127.0.0.1", port=server.port, **kwargs)
        clients.append(client)
        return client

    yield factory
    for client in clients:
        await _close(client)


@pytest_asyncio.fixture
async def r(create_redis):
    return await create_redis()


def pytest_configure(config):
    config.addinivalue_line("markers", "onlynoncluster: redis-py's marker (one server here)")


@pytest.fixture(autouse=True)
def lease_lock_class(request, monkeypatch, server):
    """``get_lock`` passes ``lock_class=Lock``: make that ``redis_lease.asyncio.Lock``."""
    import redis_lease.asyncio

    if hasattr(request.module, "Lock"):
        monkeypatch.setattr(request.module, "Lock", redis_lease.asyncio.Lock)
        lock = request.module.TestLock().get_lock(redis.asyncio.Redis(), "k")
        assert lock.__class__ is redis_lease.asyncio.Lock
