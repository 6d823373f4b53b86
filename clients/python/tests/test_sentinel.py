"""Both clients on ``Sentinel(...).master_for(...)``: a primary and a replica with the
module, three Sentinels (quorum 2, down after 1 s), started for each test (a failover
changes them). The watchdog must renew on the master the Sentinels name, follow a
failover to the new one, and signal the loss when the lease did not survive it."""

from __future__ import annotations

import asyncio
import time

import redis
import redis.asyncio
import redis.asyncio.sentinel
import redis.sentinel
from servers import MASTER_NAME, wait_until

from redis_lease import Leases, State
from redis_lease import asyncio as lease_asyncio

# Long enough to outlive the gap a SENTINEL FAILOVER leaves between the last renewal the
# replica received and the first one the new primary can get (about a second here).
SURVIVING_TTL = 5_000
# Shorter than down-after-milliseconds (1 s): with the primary killed, no server can
# renew it before its deadline, whatever the timing.
DOOMED_TTL = 600


def as_map(reply):
    if reply is None or isinstance(reply, dict):
        return reply
    return dict(zip(reply[::2], reply[1::2]))


def is_free(info):
    return info is None or info["state"] == "free"  # None: expired and reaped


def info_on(node, key):
    with node.client() as r:
        return as_map(r.execute_command("LEASE.INFO", key))


def renews_on(node):
    with node.client() as r:
        return node.commandstat(r, "lease.renew")


def reset_stats(node):
    with node.client() as r:
        r.config_resetstat()


def sync_master(topology):
    sentinel = redis.sentinel.Sentinel(topology.addresses(), sentinel_kwargs={"socket_timeout": 1})
    return sentinel.master_for(MASTER_NAME, decode_responses=True, socket_timeout=2)


def async_master(topology):
    sentinel = redis.asyncio.sentinel.Sentinel(
        topology.addresses(), sentinel_kwargs={"socket_timeout": 1}
    )
    return sentinel.master_for(MASTER_NAME, decode_responses=True, socket_timeout=2)


def check_renewed_past_three_ttls(topology, lease, ttl):
    """Called after 3.5 ttls: held, renewed every ttl/3, on the primary the Sentinels
    name (the lease would have been lost at its first deadline otherwise)."""
    assert lease.state is State.HELD, lease.reason
    assert not lease.lost.is_set()
    assert lease.renewals >= 6
    assert renews_on(topology.primary) >= 6
    assert info_on(topology.primary, lease.key)["state"] == "held"


def check_followed_to(new, lease, failed_over_at):
    """After a SENTINEL FAILOVER: the watchdog renews on the new primary, within one
    renewal interval of the Sentinels naming it (well within the lease's ttl, which a
    watchdog stuck on the old primary would let pass there)."""
    interval = lease.ttl_ms / 3 / 1000
    wait_until("two renewals on the new primary", lambda: renews_on(new) >= 2, timeout=3 * interval)
    took = time.monotonic() - failed_over_at
    assert took < lease.ttl_ms / 1000, f"first renewals on the new primary after {took:.2f} s"
    assert lease.state is State.HELD, lease.reason
    now = info_on(new, lease.key)
    assert now["state"] == "held"
    assert now["fence"] == lease.fence
    assert now["ttl"] > lease.ttl_ms - 2 * interval * 1000


def test_sync_renewed_through_sentinel_and_across_a_failover(sentinels, key):
    r = sync_master(sentinels)
    try:
        with Leases(r) as leases:
            ttl = 300
            reset_stats(sentinels.primary)
            short = leases.acquire(key + ":short", ttl)
            time.sleep(3.5 * ttl / 1000)
            check_renewed_past_three_ttls(sentinels, short, ttl)
            short.release()

            lease = leases.acquire(key, SURVIVING_TTL)
            assert r.execute_command("WAIT", 1, 1000) == 1  # the replica has it
            old = sentinels.primary
            new = sentinels.failover()
            failed_over_at = time.monotonic()
            reset_stats(new)
            check_followed_to(new, lease, failed_over_at)
            assert new.port != old.port
            assert lease.release() is True
    finally:
        r.close()


def test_sync_lost_when_the_primary_dies_before_a_replica_can_take_over(sentinels, key):
    r = sync_master(sentinels)
    try:
        with Leases(r) as leases:
            lease = leases.acquire(key, DOOMED_TTL)
            assert r.execute_command("WAIT", 1, 1000) == 1
            wait_until("renewals through Sentinel", lambda: lease.renewals >= 2, timeout=2)
            old = sentinels.primary
            old.crash()
            left = lease.deadline_in
            killed_at = time.monotonic()
            assert lease.lost.wait(timeout=3)
            took = time.monotonic() - killed_at
            assert took <= left + 0.15, (left, took)
            assert lease.state is State.LOST
            assert "deadline" in lease.reason
            new = sentinels.wait_new_primary(old.port)
            # The new primary had the lease (replicated); its deadline passed there too.
            assert is_free(info_on(new, key))
            # The same client, through Sentinel, now reaches the new primary.
            successor = wait_until(
                "an acquire on the new primary", lambda: try_acquire(leases, key)
            )
            assert successor.fence > lease.fence
            wait_until("renewals on the new primary", lambda: successor.renewals >= 1)
            successor.release()
    finally:
        r.close()


def try_acquire(leases, key):
    try:
        return leases.acquire(key, DOOMED_TTL)
    except redis.ConnectionError:
        return None


def test_async_renewed_through_sentinel_and_across_a_failover(sentinels, key):
    async def main():
        r = async_master(sentinels)
        try:
            async with lease_asyncio.Leases(r) as leases:
                ttl = 300
                reset_stats(sentinels.primary)
                short = await leases.acquire(key + ":short", ttl)
                await asyncio.sleep(3.5 * ttl / 1000)
                check_renewed_past_three_ttls(sentinels, short, ttl)
                await short.release()

                lease = await leases.acquire(key, SURVIVING_TTL)
                assert await r.execute_command("WAIT", 1, 1000) == 1
                # The failover is driven from a thread: the loop keeps the watchdog going.
                new = await asyncio.to_thread(sentinels.failover)
                failed_over_at = time.monotonic()
                reset_stats(new)
                await asyncio.to_thread(check_followed_to, new, lease, failed_over_at)
                assert await lease.release() is True
        finally:
            await r.aclose() if hasattr(r, "aclose") else await r.close()

    asyncio.run(main())


def test_async_lost_when_the_primary_dies_before_a_replica_can_take_over(sentinels, key):
    async def main():
        r = async_master(sentinels)
        try:
            async with lease_asyncio.Leases(r) as leases:
                lease = await leases.acquire(key, DOOMED_TTL)
                assert await r.execute_command("WAIT", 1, 1000) == 1
                deadline = time.monotonic() + 2
                while lease.renewals < 2:
                    assert time.monotonic() < deadline, "no renewals through Sentinel"
                    await asyncio.sleep(0.01)
                old = sentinels.primary
                old.crash()
                left = lease.deadline_in
                killed_at = time.monotonic()
                await asyncio.wait_for(lease.lost.wait(), 3)
                took = time.monotonic() - killed_at
                assert took <= left + 0.15, (left, took)
                assert "deadline" in lease.reason
                new = await asyncio.to_thread(sentinels.wait_new_primary, old.port)
                assert is_free(info_on(new, key))
                deadline = time.monotonic() + 10
                while True:
                    try:
                        successor = await leases.acquire(key, DOOMED_TTL)
                        break
                    except redis.ConnectionError:
                        assert time.monotonic() < deadline, "no acquire on the new primary"
                        await asyncio.sleep(0.05)
                assert successor.fence > lease.fence
                await successor.release()
        finally:
            await r.aclose() if hasattr(r, "aclose") else await r.close()

    asyncio.run(main())
