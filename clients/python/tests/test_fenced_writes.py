"""A fenced write is sent once and waited for no longer than the lease's time left: a
server that stalls or restarts while it is in flight makes it indeterminate
(WriteIndeterminate) by the lease's deadline, and no retry sends it again afterwards,
unless the call asked for retries."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import redis.asyncio
from servers import Server, unread_at, wait_until

from redis_lease import Leases, State, WriteIndeterminate
from redis_lease import asyncio as lease_asyncio

# The written value: big enough that the request stands out among the unread bytes of a
# stopped server (a renewal is under 100 bytes).
BODY = "x" * 2000


def calls(node, command):
    with node.client() as r:
        return node.commandstat(r, command)


def stall_client(server):
    """redis-py's defaults but a 2 s socket timeout (8.x: 5 s): a client-side retry, if
    any, fires within the stall below."""
    return server.client(socket_timeout=2)


def test_sync_write_to_a_stalled_server_is_indeterminate_by_the_deadline_and_never_resent(
    server, r, key
):
    ttl = 600
    log = key + ":log"
    client = stall_client(server)
    leases = Leases(client)
    try:
        lease = leases.acquire(key, ttl)
        # The write's connection is open and in use already (a stall before anything was
        # sent would be no indeterminate write: the client raises LeaseLost, nothing ran).
        lease.fence_call("fence:" + key)
        wait_until("a first renewal", lambda: lease.renewals >= 1)
        r.config_resetstat()
        server.pause()
        # The server answers nothing for 3 s (a DEBUG SLEEP, a stop-the-world pause): past
        # the lease's deadline and past the client's socket timeout.
        resume = threading.Timer(3.0, server.resume)
        resume.start()
        try:
            left = lease.deadline_in
            start = time.monotonic()
            with pytest.raises(WriteIndeterminate) as raised:
                lease.fence_call("fence:" + key, "RPUSH", log, BODY)
            took = time.monotonic() - start
        finally:
            resume.join()
        assert took <= left + 0.15, (left, took)
        assert raised.value.lease is lease
        assert raised.value.attempts == 1
        assert lease.state is State.LOST
        assert lease.lost.is_set()
        # The request was in the stopped server's socket when the client gave up: it runs
        # once the server wakes (it was sent before the loss), and only once.
        wait_until("the late write", lambda: calls(server, "lease.fence") >= 1)
        assert r.lrange(log, 0, -1) == [BODY]
        assert calls(server, "lease.fence") == 1
    finally:
        leases.close()
        client.close()


def test_async_write_to_a_stalled_server_is_indeterminate_by_the_deadline_and_never_resent(
    server, r, key
):
    ttl = 600
    log = key + ":log"

    async def main():
        client = redis.asyncio.Redis(
            host="127.0.0.1", port=server.port, decode_responses=True, socket_timeout=2
        )
        async with lease_asyncio.Leases(client) as leases:
            lease = await leases.acquire(key, ttl)
            await lease.fence_call("fence:" + key)
            while lease.renewals < 1:
                await asyncio.sleep(0.01)
            r.config_resetstat()
            server.pause()
            resume = threading.Timer(3.0, server.resume)
            resume.start()
            try:
                left = lease.deadline_in
                start = time.monotonic()
                with pytest.raises(WriteIndeterminate) as raised:
                    await lease.fence_call("fence:" + key, "RPUSH", log, BODY)
                took = time.monotonic() - start
            finally:
                await asyncio.to_thread(resume.join)
            assert took <= left + 0.15, (left, took)
            assert raised.value.attempts == 1
            assert lease.state is State.LOST
            assert lease.lost.is_set()
        await client.aclose() if hasattr(client, "aclose") else await client.close()

    asyncio.run(main())
    wait_until("the late write", lambda: calls(server, "lease.fence") >= 1)
    assert r.lrange(log, 0, -1) == [BODY]
    assert calls(server, "lease.fence") == 1


@pytest.fixture
def durable(server):
    """A server of the same flavor that keeps its data across a crash (AOF, fsync on
    every write), owned by the test."""
    node = Server(server.name, server.binary, {"appendonly": "yes", "appendfsync": "always"})
    node.start()
    yield node
    node.stop()


def write_across_a_restart(node, key, retries):
    """A lease with time to spare; the server stops with the fenced write unread in its
    socket, is killed and restarted (the lease and the resource record survive on disk,
    the write never ran). Returns the call's reply or exception, and the lease."""
    client = node.client(socket_timeout=2)
    leases = Leases(client)
    lease = leases.acquire(key, 5_000)
    lease.fence_call("fence:" + key)  # the record exists before; its fence is ours
    wait_until("a first renewal", lambda: lease.renewals >= 1, timeout=3)
    outcome = {}
    options = {"retries": retries} if retries else {}  # the default is no retry

    def write():
        try:
            outcome["reply"] = lease.fence_call(
                "fence:" + key, "RPUSH", key + ":log", BODY, **options
            )
        except Exception as e:
            outcome["error"] = e

    node.pause()
    writer = threading.Thread(target=write)
    writer.start()
    try:
        wait_until("the write in the stopped server's socket", lambda: unread_at(node.port) > 1000)
        node.crash()
        node.start()
    finally:
        node.resume()
        writer.join(10)
    return outcome, lease, leases, client


def test_sync_server_restart_during_a_fenced_write_is_indeterminate_and_not_resent(durable, key):
    outcome, lease, leases, client = write_across_a_restart(durable, key, retries=0)
    try:
        assert isinstance(outcome.get("error"), WriteIndeterminate), outcome
        assert outcome["error"].attempts == 1
        # The lease survived the restart: suspended by the failed write, then held again
        # when the watchdog's renewal is confirmed.
        wait_until("held again", lambda: lease.state is State.HELD, timeout=3)
        assert calls(durable, "lease.fence") == 0
        with durable.client() as r:
            assert r.lrange(key + ":log", 0, -1) == []
    finally:
        leases.close()
        client.close()


def test_sync_retries_resend_a_fenced_write_only_when_asked(durable, key):
    # Each retry waits 250 ms (a tenth of the ttl, at most 250 ms): ten of them leave the
    # restarted server time to answer.
    outcome, lease, leases, client = write_across_a_restart(durable, key, retries=10)
    try:
        assert outcome == {"reply": 1}, outcome
        assert calls(durable, "lease.fence") == 1
        with durable.client() as r:
            assert r.lrange(key + ":log", 0, -1) == [BODY]
        wait_until("held again", lambda: lease.state is State.HELD, timeout=3)
    finally:
        leases.close()
        client.close()


def test_async_server_restart_during_a_fenced_write_is_indeterminate_and_not_resent(durable, key):
    async def main():
        client = redis.asyncio.Redis(
            host="127.0.0.1", port=durable.port, decode_responses=True, socket_timeout=2
        )
        async with lease_asyncio.Leases(client) as leases:
            lease = await leases.acquire(key, 5_000)
            await lease.fence_call("fence:" + key)
            durable.pause()
            write = asyncio.ensure_future(
                lease.fence_call("fence:" + key, "RPUSH", key + ":log", BODY)
            )
            try:
                deadline = time.monotonic() + 5
                while unread_at(durable.port) <= 1000:
                    assert time.monotonic() < deadline, "the write never reached the socket"
                    await asyncio.sleep(0.005)
                durable.crash()
                await asyncio.to_thread(durable.start)
            finally:
                durable.resume()
            with pytest.raises(WriteIndeterminate):
                await write
            deadline = time.monotonic() + 3
            while lease.state is not State.HELD:
                assert time.monotonic() < deadline, lease.state
                await asyncio.sleep(0.01)
        await client.aclose() if hasattr(client, "aclose") else await client.close()

    asyncio.run(main())
    assert calls(durable, "lease.fence") == 0
    with durable.client() as r:
        assert r.lrange(key + ":log", 0, -1) == []
