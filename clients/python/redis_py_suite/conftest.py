"""Fixtures for redis-py's own lock tests, run against ``redis_lease.Lock``: the
``r`` client and ``_get_client`` that redis-py's ``tests/conftest.py`` provides, on real
servers with the module loaded (tests/servers.py, the same matrix as the client's suite),
and every ``get_lock`` of the test classes pointed at ``redis_lease.Lock``.

run.py copies this file beside the test files it fetches and filters.
"""

from __future__ import annotations

import os
import sys

import pytest
import redis

import redis_lease

sys.path.insert(0, os.environ["LEASE_PY_TESTS"])
from servers import SERVERS_ENV_HINT, selected, started

SERVERS = selected()
if not SERVERS:
    raise RuntimeError(f"no server to test on: {SERVERS_ENV_HINT}")


@pytest.fixture(scope="session", params=sorted(SERVERS))
def server(request):
    with started(request.param, SERVERS[request.param]) as srv:
        yield srv


def _get_client(cls, request, single_connection_client=False, flushdb=True, **kwargs):
    """A client of the server under test (redis-py's conftest has the same name and
    arguments); its db is flushed after the test."""
    server = request.getfixturevalue("server")
    client = cls(host="127.0.0.1", port=server.port, **kwargs)

    def teardown():
        if flushdb:
            client.flushdb()
        client.close()

    request.addfinalizer(teardown)
    return client


@pytest.fixture
def r(request, server):
    return _get_client(redis.Redis, request)


@pytest.fixture(autouse=True)
def lease_lock_class(request, monkeypatch, server):
    """redis-py's ``get_lock`` passes ``lock_class=Lock``, the name imported into the test
    module: make that name ``redis_lease.Lock``. (It uses ``server``, so that every test
    runs on each server and ``_get_client`` finds it.)"""
    if hasattr(request.module, "Lock"):
        monkeypatch.setattr(request.module, "Lock", redis_lease.Lock)
        assert request.module.TestLock().get_lock(redis.Redis(), "k").__class__ is redis_lease.Lock
