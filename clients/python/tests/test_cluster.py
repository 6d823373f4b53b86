"""Both clients on a three-master cluster, with redis-py's RedisCluster: keys, resources
and sessions share a slot through hash tags; the watchdog sends one pipeline per node."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio
from redis.exceptions import RedisClusterException, ResponseError
from servers import wait_until

from redis_lease import LeaseLost, Leases, StaleFence, State
from redis_lease.asyncio import Leases as AsyncLeases


def tags_on_every_node(rc):
    """One hash tag per master, so each test touches all three."""
    found = {}
    for i in range(1000):
        tag = f"t{i}"
        found.setdefault(rc.get_node_from_key(f"{{{tag}}}").name, tag)
        if len(found) == 3:
            return list(found.values())
    raise AssertionError("no tag for some node")


def node_of(cluster, rc, key):
    name = rc.get_node_from_key(key).name
    return next(n for n in cluster.nodes if name.endswith(f":{n.port}"))


def as_map(reply):
    if reply is None or isinstance(reply, dict):
        return reply
    return dict(zip(reply[::2], reply[1::2]))


@pytest.fixture
def rc(cluster):
    client = cluster.client()
    yield client
    for node in cluster.nodes:
        node.resume()
    client.close()


def test_cluster_leases_on_every_node_renewed_and_fenced(cluster, rc):
    tags = tags_on_every_node(rc)
    ttl = 300
    with Leases(rc) as leases:
        held = [leases.acquire(f"{{{tag}}}lock", ttl) for tag in tags]
        for node in cluster.nodes:
            node.client().config_resetstat()
        time.sleep(3.5 * ttl / 1000)
        assert all(lease.state is State.HELD for lease in held)
        assert all(lease.renewals >= 6 for lease in held)
        for lease in held:
            node = node_of(cluster, rc, lease.key)
            # Each node saw the renewals of its own key only.
            assert node.commandstat(node.client(), "lease.renew") >= 6
            assert as_map(rc.execute_command("LEASE.INFO", lease.key))["fence"] == lease.fence
        # Fenced writes go to the node of the resource's slot (same tag as the lock).
        for tag, lease in zip(tags, held):
            assert lease.fence_call(f"{{{tag}}}fence", "SET", f"{{{tag}}}doc", "v") == "OK"
        rc.delete(held[1].key)
        assert held[1].lost.wait(1)
        assert held[0].state is State.HELD and held[2].state is State.HELD
        # A holder that has not noticed yet (next renewal far away) writes too late.
        stale = leases.acquire(f"{{{tags[1]}}}slow", 60_000)
        rc.delete(stale.key)
        successor = leases.acquire(stale.key, 60_000)
        successor.fence_call(f"{{{tags[1]}}}fence", "SET", f"{{{tags[1]}}}doc", "w")
        with pytest.raises(StaleFence):
            stale.fence_call(f"{{{tags[1]}}}fence", "SET", f"{{{tags[1]}}}doc", "stale")
        assert rc.get(f"{{{tags[1]}}}doc") == "w"


def test_cluster_session_with_hash_tags(cluster, rc):
    tags = tags_on_every_node(rc)
    ttl = 600
    with Leases(rc) as leases:
        session = leases.session(ttl, f"{{{tags[0]}}}session")
        jobs = [leases.acquire(f"{{{tags[0]}}}job:{i}", 0, session=session) for i in range(50)]
        # A key in another slot cannot be bound to it: redis-py refuses it before sending
        # (the module's key specs declare the session key).
        with pytest.raises((RedisClusterException, ResponseError)):
            leases.acquire(f"{{{tags[1]}}}job", 0, session=session)
        start = time.monotonic()
        wait_until("two ttls", lambda: time.monotonic() - start > 2 * ttl / 1000, timeout=3)
        assert all(job.state is State.HELD for job in jobs)
        assert as_map(rc.execute_command("LEASE.INFO", session.key))["bound"] == 50
        assert all(job.renewals == 0 for job in jobs)
        session.release()
        assert all(job.state is State.RELEASED for job in jobs)


def test_cluster_a_stopped_node_loses_only_its_leases(cluster, rc):
    tags = tags_on_every_node(rc)
    ttl = 600
    leases = Leases(rc)
    try:
        held = [leases.acquire(f"{{{tag}}}lock", ttl) for tag in tags]
        wait_until("a renewal", lambda: all(lease.renewals >= 1 for lease in held))
        stopped = node_of(cluster, rc, held[0].key)
        stopped.pause()
        try:
            wait_until("suspended", lambda: held[0].state is State.SUSPENDED, timeout=2)
            assert held[0].lost.wait(2)
            assert held[1].state is State.HELD and held[2].state is State.HELD
        finally:
            stopped.resume()
        with pytest.raises(LeaseLost):
            held[0].check()
    finally:
        leases.close()
    assert all(lease.state is State.LOST for lease in held)


def test_cluster_asyncio(cluster):
    async def main():
        rc = redis.asyncio.RedisCluster(
            host="127.0.0.1", port=cluster.nodes[0].port, decode_responses=True
        )
        sync = cluster.client()
        tags = tags_on_every_node(sync)
        sync.close()
        leases = AsyncLeases(rc)
        ttl = 300
        try:
            held = [await leases.acquire(f"{{{tag}}}alock", ttl) for tag in tags]
            await asyncio.sleep(3.5 * ttl / 1000)
            assert all(lease.state is State.HELD for lease in held)
            assert all(lease.renewals >= 6 for lease in held)
            for tag, lease in zip(tags, held):
                await lease.fence_call(f"{{{tag}}}afence", "SET", f"{{{tag}}}adoc", "v")
            async with await leases.session(ttl, f"{{{tags[2]}}}asession") as session:
                job = await leases.acquire(f"{{{tags[2]}}}ajob", 0, session=session)
                await asyncio.sleep(2 * ttl / 1000)
                assert job.state is State.HELD
            assert job.state is State.RELEASED
            await rc.delete(held[0].key)
            await asyncio.wait_for(held[0].lost.wait(), 1)
        finally:
            await leases.close()
            await rc.aclose() if hasattr(rc, "aclose") else await rc.close()
        assert leases.watchdog is None

    asyncio.run(main())


def test_cluster_a_lease_follows_its_slot_to_another_node(cluster, rc):
    """Slot migration: the watchdog's renewal meets MOVED, learns the new owner and
    renews there; the lease stays held with its fence. A fenced write during the
    migration follows ASK to the importing node, and one after it reaches the new owner
    (following MOVED if the slot table has not learnt it yet): a redirect did not run,
    so following it is no retry."""
    tags = tags_on_every_node(rc)
    ttl = 900
    key = f"{{{tags[0]}}}moving"
    with Leases(rc) as leases:
        lease = leases.acquire(key, ttl)
        wait_until("a renewal", lambda: lease.renewals >= 1)
        slot = rc.keyslot(key)
        source = node_of(cluster, rc, key)
        target = next(n for n in cluster.nodes if n is not source)
        src, dst = source.client(), target.client()
        src_id = src.execute_command("CLUSTER", "MYID")
        dst_id = dst.execute_command("CLUSTER", "MYID")
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
        src.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", key)
        resource, doc = key + ":fence", key + ":doc"  # new keys: the source has neither
        # A new record: not on the migrating node, so ASK sends it to the importing one.
        # (A fenced command with keys of its own would get TRYAGAIN there, raised as is.)
        assert lease.fence_call(resource) == lease.fence
        for node in cluster.nodes:
            node.client().execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        assert dst.exists(resource) == 1
        assert lease.fence_call(resource, "SET", doc, "after") in ("OK", True)
        assert dst.get(doc) == "after"
        moved_at = lease.renewals
        wait_until("renewals on the new node", lambda: lease.renewals >= moved_at + 3, timeout=3)
        assert lease.state is State.HELD
        assert as_map(dst.execute_command("LEASE.INFO", key))["fence"] == lease.fence
        assert lease.release() is True
