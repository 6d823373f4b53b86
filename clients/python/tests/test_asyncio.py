"""The asyncio client against a real server (each test runs on every selected server)."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio

from redis_lease import LeaseLost, NotAcquired, StaleFence, State
from redis_lease.asyncio import Leases


def run(coro):
    return asyncio.run(coro)


def client(server):
    return redis.asyncio.Redis(host="127.0.0.1", port=server.port, decode_responses=True)


def as_map(reply):
    if reply is None or isinstance(reply, dict):
        return reply
    return dict(zip(reply[::2], reply[1::2]))


async def info(r, key):
    return as_map(await r.execute_command("LEASE.INFO", key))


async def is_free(r, key):
    now = await info(r, key)
    return now is None or now["state"] == "free"


async def poll(what, condition, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.005)


class Env:
    """An asyncio client and its Leases, closed (and checked for leftovers) at the end."""

    def __init__(self, server):
        self.server = server

    async def __aenter__(self):
        self.r = client(self.server)
        self.leases = Leases(self.r)
        return self

    async def __aexit__(self, *exc):
        await self.leases.close()
        assert self.leases.watchdog is None
        await self.r.aclose() if hasattr(self.r, "aclose") else await self.r.close()


def test_held_past_three_ttls_while_the_body_sleeps(server, key):
    async def main():
        async with Env(server) as env:
            ttl = 300
            async with env.leases.acquire(key, ttl) as lease:
                await asyncio.sleep(3.5 * ttl / 1000)
                assert lease.state is State.HELD
                assert lease.renewals >= 6
                assert (await info(env.r, key))["fence"] == lease.fence
            assert lease.state is State.RELEASED
            assert await is_free(env.r, key)

    run(main())


def test_lost_after_an_admin_del_and_the_scoped_form_raises(server, key):
    async def main():
        async with Env(server) as env:
            ttl = 600
            with pytest.raises(LeaseLost):
                async with env.leases.acquire(key, ttl) as lease:
                    await poll("a first renewal", lambda: lease.renewals >= 1)
                    await env.r.delete(key)
                    deleted = time.monotonic()
                    await asyncio.wait_for(lease.lost.wait(), 2)
                    took = time.monotonic() - deleted
                    assert took <= ttl / 3 / 1000 + 0.1, took
                    # The body goes on as if nothing happened; leaving it raises.
            assert lease.state is State.LOST

    run(main())


def test_a_body_exception_releases(server, key):
    async def main():
        async with Env(server) as env:
            with pytest.raises(ValueError, match="boom"):
                async with env.leases.acquire(key, 10_000) as lease:
                    raise ValueError("boom")
            assert lease.state is State.RELEASED
            assert not lease.lost.is_set()
            assert await is_free(env.r, key)

    run(main())


def test_block_hands_over_between_two_clients(server, key):
    async def main():
        async with Env(server) as a, Env(server) as b:
            first = await a.leases.acquire(key, 10_000)
            waiting = asyncio.ensure_future(b.leases.acquire(key, 10_000, block_ms=5_000))
            deadline = time.monotonic() + 5
            while (await info(a.r, key))["waiters"] != 1:
                assert time.monotonic() < deadline, "the waiter never queued"
                await asyncio.sleep(0.005)
            released_at = time.monotonic()
            assert await first.release() is True
            second = await asyncio.wait_for(waiting, 5)
            assert time.monotonic() - released_at < 1.0
            assert second.fence > first.fence
            await second.release()
            holder = await a.leases.acquire(key, 10_000)
            try:
                with pytest.raises(NotAcquired):
                    await b.leases.acquire(key, 10_000, block_ms=100)
                with pytest.raises(NotAcquired):
                    async with b.leases.acquire(key, 10_000):
                        pytest.fail("the body ran without the lease")
            finally:
                await holder.release()

    run(main())


def test_stale_fence_from_a_stale_holders_write(server, key):
    async def main():
        async with Env(server) as env:
            resource, doc = "fence:" + key, key + ":doc"
            stale = await env.leases.acquire(key, 60_000)
            await env.r.delete(key)
            successor = await env.leases.acquire(key, 60_000)
            await successor.fence_call(resource, "SET", doc, "second")
            assert stale.state is State.HELD  # it has not heard yet
            with pytest.raises(StaleFence) as raised:
                await stale.fence_call(resource, "SET", doc, "late")
            assert raised.value.highest == successor.fence
            assert stale.state is State.LOST and stale.lost.is_set()
            assert await env.r.get(doc) == "second"
            await successor.release()

    run(main())


def test_a_thousand_leases_cost_one_pipelined_batch_per_interval(server, key):
    async def main():
        async with Env(server) as env:
            ttl = 900
            interval = ttl / 3 / 1000
            held = [await env.leases.acquire(f"{key}:{i}", ttl) for i in range(1000)]
            await asyncio.sleep(2 * interval)
            await env.r.config_resetstat()
            batches = env.leases.batches
            start = time.monotonic()
            await asyncio.sleep(5 * interval)
            elapsed = time.monotonic() - start
            stats = await env.r.info("commandstats")
            renewals = int(stats.get("cmdstat_lease.renew", {}).get("calls", 0))
            rounds = int(elapsed / interval) + 1
            assert env.leases.batches - batches <= rounds
            assert 1000 * (rounds - 2) <= renewals <= 1000 * rounds, (renewals, elapsed)
            assert all(lease.state is State.HELD for lease in held)

    run(main())


def test_a_session_keeps_a_thousand_leases_with_one_renewal(server, key):
    async def main():
        async with Env(server) as env:
            ttl = 900
            interval = ttl / 3 / 1000
            session = await env.leases.session(ttl, f"{{{key}}}session")
            held = [
                await env.leases.acquire(f"{{{key}}}job:{i}", 0, session=session)
                for i in range(1000)
            ]
            await env.r.config_resetstat()
            start = time.monotonic()
            await asyncio.sleep(4 * interval + ttl / 1000)
            elapsed = time.monotonic() - start
            stats = await env.r.info("commandstats")
            renewals = int(stats.get("cmdstat_lease.renew", {}).get("calls", 0))
            assert 1 <= renewals <= int(elapsed / interval) + 1
            assert all(lease.state is State.HELD for lease in held)
            assert (await info(env.r, session.key))["bound"] == 1000
            await session.release()
            assert all(lease.state is State.RELEASED for lease in held)
            assert await is_free(env.r, held[0].key)

    run(main())


def test_no_task_left_after_close(server):
    async def main():
        r = client(server)
        leases = Leases(r)
        held = [await leases.acquire(f"lock:aclose:{i}", 5_000) for i in range(3)]
        task = leases.watchdog
        assert task is not None and not task.done()
        others = {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}
        assert others == {task}
        await leases.close()
        assert task.done()
        assert leases.watchdog is None
        assert {t for t in asyncio.all_tasks() if t is not asyncio.current_task()} == set()
        assert all(lease.state is State.LOST for lease in held)
        assert all([await is_free(r, lease.key) for lease in held])
        await r.aclose() if hasattr(r, "aclose") else await r.close()

    run(main())


def test_suspended_then_lost_while_the_server_is_stopped(server, key):
    async def main():
        async with Env(server) as env:
            ttl = 600
            lease = await env.leases.acquire(key, ttl)
            await poll("a first renewal", lambda: lease.renewals >= 1)
            server.pause()
            try:
                await poll("suspended", lambda: lease.state is not State.HELD, timeout=2)
                assert lease.state is State.SUSPENDED
                left = lease.deadline_in
                seen = time.monotonic()
                await asyncio.wait_for(lease.lost.wait(), 2)
                took = time.monotonic() - seen
                assert left - 0.02 <= took <= left + 0.15, (left, took)
            finally:
                server.resume()
            await asyncio.sleep(ttl / 1000 / 2)
            assert lease.state is State.LOST

    run(main())
