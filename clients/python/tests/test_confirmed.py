"""Confirmed grants (``replicas=``, ``waitaof=``) against a primary with a real replica:
WAIT in the same round trip as LEASE.ACQUIRE and every renewal; a replica stopped with
SIGSTOP shows the unconfirmed paths."""

from __future__ import annotations

import asyncio
import functools

import pytest
import redis.asyncio
from conftest import SERVERS
from servers import START_TIMEOUT, Server, wait_until
from test_sync import info, is_free

import redis_lease
from redis_lease import Leases, LockError, NotConfirmed, State
from redis_lease import asyncio as lease_asyncio


class Pair:
    """A primary and one replica, both with the module."""

    def __init__(self, name: str, binary: str) -> None:
        self.primary = Server(name, binary).start()
        self.replica = Server(name, binary, {"replicaof": f"127.0.0.1 {self.primary.port}"})
        try:
            self.replica.start()
            wait_until("the replica to sync", self.synced, timeout=START_TIMEOUT)
        except BaseException:
            self.stop()
            raise

    def synced(self) -> bool:
        """The replica's link is up and the primary counts its acknowledgement: a link
        the replica sees up can still be one the primary's WAIT does not count yet."""
        with self.replica.client() as r:
            if r.info("replication").get("master_link_status") != "up":
                return False
        with self.primary.client() as p:
            return p.execute_command("WAIT", 1, 500) >= 1

    def stop(self) -> None:
        self.replica.stop()
        self.primary.stop()


@pytest.fixture(scope="module", params=sorted(SERVERS))
def pair(request):
    p = Pair(request.param, SERVERS[request.param])
    try:
        yield p
    finally:
        p.stop()


@pytest.fixture
def primary(pair):
    client = pair.primary.client()
    yield client
    pair.replica.resume()
    wait_until("the replica to catch up", pair.synced)
    client.close()


def test_the_grant_and_every_renewal_are_confirmed(primary, key):
    # A second to confirm: on a loaded machine a replica's acknowledgement can take
    # longer than the default, and this test is about confirming, not about its speed.
    with Leases(primary, replicas=1, replica_timeout_ms=1000) as leases:
        lease = leases.acquire(key, 1500)
        assert lease.replicas == 1
        wait_until("three renewals", lambda: lease.renewals >= 3)
        assert lease.state is State.HELD
        assert lease.replicas == 1
        assert lease.release()


def test_a_renewal_no_replica_confirms_is_a_loss(pair, primary, key):
    with Leases(primary, replicas=1, replica_timeout_ms=50) as leases:
        lease = leases.acquire(key, 600)
        wait_until("a first renewal", lambda: lease.renewals >= 1)
        pair.replica.pause()
        assert lease.lost.wait(3)
        assert "not confirmed by 1 replica" in lease.reason
        assert lease.replicas == 0
        # The primary renewed it: it is the client that gave it up.
        assert info(primary, key)["state"] == "held"


def test_a_grant_no_replica_confirms_is_released(pair, primary, key):
    pair.replica.pause()
    with Leases(primary) as leases:
        with pytest.raises(NotConfirmed) as caught:
            leases.acquire(key, 5000, replicas=1, replica_timeout_ms=50)
        assert (caught.value.replicas, caught.value.needed) == (0, 1)
        assert is_free(primary, key)
        assert leases.held == []


def test_more_replicas_than_there_are(primary, key):
    with Leases(primary) as leases:
        with pytest.raises(NotConfirmed) as caught:
            leases.acquire(key, 5000, replicas=2, replica_timeout_ms=50)
        assert caught.value.replicas == 1
        assert is_free(primary, key)
        unconfirmed = leases.acquire(key, 5000)  # per acquire: none asked, none reported
        assert unconfirmed.replicas is None
        unconfirmed.release()


def test_the_lock_class_with_replicas(pair, primary, key):
    confirmed = functools.partial(redis_lease.Lock, replicas=1, replica_timeout=1.0)
    with primary.lock(key, lock_class=confirmed) as held:
        assert held.lease.replicas == 1
    pair.replica.pause()
    unconfirmed = functools.partial(redis_lease.Lock, replicas=1, replica_timeout=0.05)
    with pytest.raises(LockError, match="not confirmed"):
        primary.lock(key, lock_class=unconfirmed).acquire(blocking=False)
    assert is_free(primary, key)


def test_waitaof_confirms_the_primarys_fsync(pair, primary, key):
    try:
        primary.execute_command("WAITAOF", 0, 0, 1)
        has = True
    except redis.ResponseError as e:
        assert "unknown command" in str(e).lower()
        has = False
    if not has:
        # Redis 7.0 has no WAITAOF: the grant is not confirmed (the server's error
        # says why) and released.
        with Leases(primary, waitaof=True) as leases:
            with pytest.raises(NotConfirmed, match=r"(?i)unknown command") as caught:
                leases.acquire(key, 5000)
            assert caught.value.replicas is None
        assert is_free(primary, key)
        return
    with Leases(primary, waitaof=True) as leases:
        # appendonly is off: WAITAOF refuses, and the grant is released.
        with pytest.raises(NotConfirmed) as caught:
            leases.acquire(key, 5000)
        assert caught.value.replicas is None
        assert is_free(primary, key)
        primary.config_set("appendonly", "yes")
        primary.config_set("appendfsync", "always")
        try:
            wait_until(
                "the AOF to be on",
                lambda: (
                    primary.info("persistence")["aof_rewrite_in_progress"] == 0
                    and primary.info("persistence")["aof_enabled"] == 1
                ),
            )
            lease = leases.acquire(key, 600)
            assert lease.replicas == 0  # the replica keeps no AOF: only the primary's fsync
            wait_until("two renewals", lambda: lease.renewals >= 2)
            assert lease.state is State.HELD
            lease.release()
            # The replica keeps no AOF, so it never confirms an fsync.
            with pytest.raises(NotConfirmed):
                leases.acquire(key, 5000, replicas=1, replica_timeout_ms=50)
        finally:
            primary.config_set("appendonly", "no")


def test_asyncio_confirms_and_loses_an_unconfirmed_renewal(pair, key):
    async def scenario():
        client = redis.asyncio.Redis(host="127.0.0.1", port=pair.primary.port)
        leases = lease_asyncio.Leases(client, replicas=1, replica_timeout_ms=500)
        try:
            lease = await leases.acquire(key, 1500)
            assert lease.replicas == 1
            while lease.renewals < 2:
                await asyncio.sleep(0.01)
            assert lease.replicas == 1
            pair.replica.pause()
            await asyncio.wait_for(lease.lost.wait(), 5)
            assert "not confirmed" in lease.reason
            with pytest.raises(NotConfirmed):
                await leases.acquire(f"{key}:2", 5000)
        finally:
            pair.replica.resume()
            await leases.close()
            await client.aclose() if hasattr(client, "aclose") else await client.close()

    asyncio.run(scenario())
