"""The partitions' machinery (lease_chaos/network.py) on this machine's loopback: a cut
drops exactly the links it names, heals by its handles, and a worker's connections
leave from its own address. Needs root and nftables, which scripts/install-deps
installs; where the kernel refuses, these tests are skipped with its reason, and a run
deals no network fault and says why."""

from __future__ import annotations

import os
import shutil
import socket

import pytest
import redis.connection

from lease_chaos import network


def refusal() -> str | None:
    """Why this machine cannot cut links (the run then deals no network fault)."""
    if os.geteuid() != 0:
        return "needs root"
    if shutil.which("nft") is None:
        return "needs nftables (scripts/install-deps installs it)"
    f = network.Filter()
    try:
        f.setup()
    except RuntimeError as err:
        return f"nftables cannot filter here: {err}"
    finally:
        f.teardown()
    return None


REFUSAL = refusal()
pytestmark = pytest.mark.skipif(REFUSAL is not None, reason=REFUSAL or "")

SERVER = network.data_host(25000, 0)
NEAR, FAR = network.worker_host(25000, 0), network.worker_host(25000, 1)


@pytest.fixture
def listener():
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((SERVER, 0))
    sock.listen(16)
    yield sock
    sock.close()


@pytest.fixture
def net():
    f = network.Filter()
    f.setup()
    yield f
    f.teardown()


def reaches(listener: socket.socket, source: str) -> bool:
    """Whether a connection from `source` to the listener completes within 0.5 s."""
    client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    client.settimeout(0.5)
    try:
        client.bind((source, 0))
        client.connect(listener.getsockname())
    except OSError:
        return False
    finally:
        client.close()
    accepted, _ = listener.accept()
    accepted.close()
    return True


def test_a_cut_drops_only_the_links_it_names_and_heals(listener, net):
    assert reaches(listener, NEAR) and reaches(listener, FAR)
    handles = net.cut([NEAR], [SERVER])
    assert not reaches(listener, NEAR)
    assert reaches(listener, FAR)
    assert reaches(listener, network.HARNESS)
    net.heal(handles)
    assert reaches(listener, NEAR)


def test_one_way_stops_the_connection_both_ways(listener, net):
    # Only packets from the server to NEAR are dropped: NEAR's SYN arrives, the answer
    # does not, so the connection never completes.
    handles = net.cut([SERVER], [NEAR])
    assert not reaches(listener, NEAR)
    assert reaches(listener, FAR)
    net.heal(handles)
    assert reaches(listener, NEAR)


def test_overlapping_cuts_heal_independently(listener, net):
    first = net.split([SERVER], [NEAR])
    second = net.split([SERVER], [NEAR, FAR])
    net.heal(second)
    assert not reaches(listener, NEAR)
    assert reaches(listener, FAR)
    net.heal(first)
    assert reaches(listener, NEAR)


def test_random_loss_at_99_percent_drops_nearly_every_connection(listener, net):
    handles = net.split([SERVER], [NEAR], loss_pct=99)
    assert sum(reaches(listener, NEAR) for _ in range(3)) < 3
    net.heal(handles)
    assert all(reaches(listener, NEAR) for _ in range(3))


def test_a_workers_connections_leave_from_its_address(listener):
    original = redis.connection.Connection._connect
    try:
        network.leave_from(NEAR)
        conn = redis.connection.Connection(host=SERVER, port=listener.getsockname()[1])
        sock = conn._connect()
        try:
            assert sock.getsockname()[0] == NEAR
        finally:
            sock.close()
    finally:
        redis.connection.Connection._connect = original
