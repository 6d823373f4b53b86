from __future__ import annotations

import itertools
import os
import threading

import pytest
from servers import SERVERS_ENV_HINT, Cluster, SentinelSet, selected, started

SERVERS = selected()
if not SERVERS:
    raise RuntimeError(f"no server to test on: {SERVERS_ENV_HINT}")

# Cluster tests start three nodes each: by default on every selected server;
# LEASE_CLUSTER_SERVERS (a comma list) narrows it.
_cluster_only = [n for n in os.environ.get("LEASE_CLUSTER_SERVERS", "").split(",") if n]
CLUSTER_SERVERS = {n: p for n, p in SERVERS.items() if not _cluster_only or n in _cluster_only}
# Sentinel tests start five processes each (two data nodes, three Sentinels) and own them:
# a failover leaves them changed. LEASE_SENTINEL_SERVERS narrows them as above.
_sentinel_only = [n for n in os.environ.get("LEASE_SENTINEL_SERVERS", "").split(",") if n]
SENTINEL_SERVERS = {n: p for n, p in SERVERS.items() if not _sentinel_only or n in _sentinel_only}

_ids = itertools.count()


@pytest.fixture(scope="session", params=sorted(SERVERS))
def server(request):
    with started(request.param, SERVERS[request.param]) as srv:
        yield srv


@pytest.fixture(scope="session", params=sorted(CLUSTER_SERVERS))
def cluster(request):
    c = Cluster(request.param, CLUSTER_SERVERS[request.param]).start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(params=sorted(SENTINEL_SERVERS))
def sentinels(request):
    topology = SentinelSet(request.param, SENTINEL_SERVERS[request.param]).start()
    try:
        yield topology
    finally:
        topology.stop()


@pytest.fixture
def r(server):
    client = server.client()
    yield client
    server.resume()
    client.close()


@pytest.fixture
def key(request):
    """A key of its own for each test."""
    return f"lock:{request.node.name}:{next(_ids)}"


def watchdog_threads():
    return [t for t in threading.enumerate() if t.name == "redis-lease-watchdog"]
