"""The sync client against a real server (each test runs on every selected server)."""

from __future__ import annotations

import threading
import time

import pytest
import redis
from conftest import watchdog_threads
from servers import Server, wait_until

from redis_lease import LeaseLost, Leases, NotAcquired, StaleFence, State


@pytest.fixture
def leases(r):
    ls = Leases(r)
    yield ls
    ls.close()


def info(r, key):
    reply = r.execute_command("LEASE.INFO", key)
    if reply is None or isinstance(reply, dict):
        return reply
    return dict(zip(reply[::2], reply[1::2]))


def is_free(r, key):
    now = info(r, key)
    return now is None or now["state"] == "free"


def test_held_past_three_ttls_while_the_body_sleeps(r, leases, key):
    ttl = 300
    with leases.acquire(key, ttl) as lease:
        fence = lease.fence
        start = time.monotonic()
        time.sleep(3.5 * ttl / 1000)  # the body's work, three and a half ttls long
        assert time.monotonic() - start > 3 * ttl / 1000
        assert lease.state is State.HELD
        assert not lease.lost.is_set()
        assert lease.renewals >= 6  # every ttl/3
        now = info(r, key)
        assert now["state"] == "held"
        assert now["fence"] == fence == lease.fence
    assert lease.state is State.RELEASED
    assert is_free(r, key)


def test_lost_within_a_third_of_the_ttl_after_an_admin_del(r, leases, key):
    ttl = 600
    lease = leases.acquire(key, ttl)
    wait_until("a first renewal", lambda: lease.renewals >= 1)
    r.delete(key)
    deleted = time.monotonic()
    assert lease.lost.wait(timeout=2)
    took = time.monotonic() - deleted
    assert took <= ttl / 3 / 1000 + 0.1, f"noticed {took:.3f} s after the DEL"
    assert lease.state is State.LOST
    with pytest.raises(LeaseLost):
        lease.check()
    with pytest.raises(LeaseLost):
        lease.fence_call("fence:" + key, "SET", "x", "1")
    assert r.get("x") is None


def test_scoped_form_raises_lease_lost_even_if_the_body_did_not_notice(r, leases, key):
    ttl = 600
    with pytest.raises(LeaseLost) as raised, leases.acquire(key, ttl):
        r.delete(key)
        # The body never looks at the lease; it works until the watchdog has sent
        # its next renewal batch (the one that finds the key gone).
        seen = leases.batches
        wait_until("a renewal round", lambda: leases.batches >= seen + 1)
    assert "lost" in str(raised.value)


def test_taken_by_another_holder_after_a_debug_sleep(server, r, leases, key):
    ttl = 600
    resource = "fence:" + key
    admin = server.client()
    other = Leases(server.client())
    try:
        with pytest.raises(LeaseLost), leases.acquire(key, ttl) as lease:
            wait_until("a first renewal", lambda: lease.renewals >= 1)
            # The server stops answering for twice the ttl: the holder's renewal times
            # out (suspended) and the deadline it last confirmed passes (lost).
            sleeper = threading.Thread(target=admin.execute_command, args=("DEBUG", "SLEEP", "1.2"))
            sleeper.start()
            try:
                wait_until("the server to sleep", lambda: lease.state is State.SUSPENDED, timeout=2)
                assert lease.lost.wait(timeout=2)
                # The next holder queues up while the server sleeps and gets the key
                # as soon as it wakes.
                successor = other.acquire(key, 5_000, block_ms=5_000)
            finally:
                sleeper.join()
            assert successor.fence > lease.fence
            assert successor.fence_call(resource, "SET", key + ":doc", "successor") in (
                "OK",
                True,
            )
            # The holder knows it lost the lease: fence_call refuses without sending,
            # and the resource would refuse the write anyway.
            with pytest.raises(LeaseLost):
                lease.fence_call(resource, "SET", key + ":doc", "stale")
            with pytest.raises(redis.ResponseError, match=r"^STALE"):
                r.execute_command(
                    "LEASE.FENCE", resource, lease.fence, "SET", key + ":doc", "stale"
                )
        assert r.get(key + ":doc") == "successor"
        successor.release()
    finally:
        other.close()
        admin.close()


def test_a_body_exception_releases(r, leases, key):
    with pytest.raises(ValueError, match="boom"), leases.acquire(key, 10_000) as lease:
        assert info(r, key)["state"] == "held"
        raise ValueError("boom")
    assert lease.state is State.RELEASED
    assert not lease.lost.is_set()
    assert is_free(r, key)
    again = leases.acquire(key, 10_000)  # free at once, not after the ttl
    again.release()


def test_block_hands_over_between_two_clients(server, r, leases, key):
    other = Leases(server.client())
    try:
        first = leases.acquire(key, 10_000)
        got = {}

        def wait_for_it():
            got["lease"] = other.acquire(key, 10_000, block_ms=5_000)
            got["at"] = time.monotonic()

        waiter = threading.Thread(target=wait_for_it)
        waiter.start()
        wait_until("the waiter to queue", lambda: info(r, key)["waiters"] == 1)
        released_at = time.monotonic()
        assert first.release() is True
        waiter.join(5)
        second = got["lease"]
        assert got["at"] - released_at < 1.0
        assert second.fence > first.fence
        assert second.state is State.HELD
        assert first.state is State.RELEASED
        second.release()
    finally:
        other.close()


def test_block_times_out_with_not_acquired(server, r, leases, key):
    holder = leases.acquire(key, 10_000)
    other = Leases(server.client())
    try:
        start = time.monotonic()
        with pytest.raises(NotAcquired) as raised:
            other.acquire(key, 10_000, block_ms=200)
        assert time.monotonic() - start >= 0.19
        assert raised.value.key == key
        assert raised.value.block_ms == 200
        with pytest.raises(NotAcquired):  # noqa: SIM117
            with other.acquire(key, 10_000):
                pytest.fail("the body ran without the lease")
    finally:
        holder.release()
        other.close()


def test_stale_fence_from_a_stale_holders_write(r, leases, key):
    resource = "fence:" + key
    doc = key + ":doc"
    stale = leases.acquire(key, 60_000)
    stale.fence_call(resource, "SET", doc, "first")
    r.delete(key)  # the lease ends behind the holder's back (an admin, a failover)
    successor = leases.acquire(key, 60_000)
    successor.fence_call(resource, "SET", doc, "second")
    # The stale holder has not heard yet (its next renewal is 20 s away): its write is
    # refused at the resource, atomically, and the lease becomes lost.
    assert stale.state is State.HELD
    with pytest.raises(StaleFence) as raised:
        stale.fence_call(resource, "SET", doc, "late")
    assert raised.value.fence == stale.fence
    assert raised.value.highest == successor.fence
    assert isinstance(raised.value, LeaseLost)
    assert stale.state is State.LOST
    assert stale.lost.is_set()
    assert r.get(doc) == "second"
    # In the scoped form the StaleFence propagates (a LeaseLost), and the lease is gone.
    successor.release()
    with pytest.raises(StaleFence), leases.acquire(key, 60_000) as lease:
        r.execute_command("LEASE.FENCE", resource, lease.fence + 1)
        lease.fence_call(resource, "SET", doc, "never")
    assert r.get(doc) == "second"


def test_a_thousand_leases_cost_one_pipelined_batch_per_interval(server, r, leases, key):
    ttl = 900
    interval = ttl / 3 / 1000
    held = [leases.acquire(f"{key}:{i}", ttl) for i in range(1000)]
    # Leases acquired over a few hundred ms settle into one batch within an interval.
    time.sleep(2 * interval)
    r.config_resetstat()
    batches = leases.batches
    start = time.monotonic()
    time.sleep(5 * interval)
    elapsed = time.monotonic() - start
    renewals = server.commandstat(r, "lease.renew")
    sent = leases.batches - batches
    rounds = int(elapsed / interval) + 1
    assert sent <= rounds, f"{sent} batches in {elapsed:.2f} s"
    assert renewals <= 1000 * rounds, f"{renewals} renewals in {elapsed:.2f} s"
    assert renewals >= 1000 * (rounds - 2)
    assert all(lease.state is State.HELD for lease in held)
    pipe = r.pipeline(transaction=False)
    for lease in held:
        pipe.execute_command("LEASE.INFO", lease.key)
    for lease, reply in zip(held, pipe.execute()):
        assert info_of(reply)["fence"] == lease.fence
    for lease in held:
        lease.release()


def info_of(reply):
    if isinstance(reply, dict):
        return reply
    return dict(zip(reply[::2], reply[1::2]))


def test_a_session_keeps_a_thousand_leases_with_one_renewal(server, r, leases, key):
    ttl = 900
    interval = ttl / 3 / 1000
    session = leases.session(ttl, f"{{{key}}}session")
    held = [leases.acquire(f"{{{key}}}job:{i}", 0, session=session) for i in range(1000)]
    r.config_resetstat()
    start = time.monotonic()
    time.sleep(4 * interval + ttl / 1000)  # longer than the ttl: renewal needed
    elapsed = time.monotonic() - start
    renewals = server.commandstat(r, "lease.renew")
    assert 1 <= renewals <= int(elapsed / interval) + 1
    assert session.state is State.HELD
    assert all(lease.state is State.HELD for lease in held)
    assert len(session.holds) == 1000
    assert info(r, session.key)["bound"] == 1000
    assert info(r, held[-1].key)["state"] == "held"
    # Losing the session loses every hold bound to it, at the next renewal.
    r.delete(session.key)
    assert session.lost.wait(2)
    assert all(lease.lost.is_set() for lease in held)
    assert "session" in held[0].reason
    assert is_free(r, held[0].key)


def test_releasing_a_session_releases_its_holds(r, leases, key):
    with leases.session(5_000, f"{{{key}}}session") as session:
        a = leases.acquire(f"{{{key}}}a", 0, session=session)
        b = leases.acquire(f"{{{key}}}b", 5_000, session=session, owner="worker-b")
        assert info(r, a.key)["session"] == session.key
        assert info(r, b.key)["owner"] == "worker-b"
    assert session.state is State.RELEASED
    assert a.state is State.RELEASED and b.state is State.RELEASED
    assert is_free(r, a.key)


def test_no_thread_left_after_close(server):
    before = len(watchdog_threads())
    client = server.client()
    leases = Leases(client)
    assert leases.watchdog is None  # started with the first lease
    held = [leases.acquire(f"lock:close:{i}", 5_000) for i in range(3)]
    assert leases.watchdog is not None
    assert len(watchdog_threads()) == before + 1
    leases.close()
    assert leases.watchdog is None
    assert len(watchdog_threads()) == before
    assert all(lease.state is State.LOST and lease.lost.is_set() for lease in held)
    # close() released them on the server.
    assert all(is_free(client, lease.key) for lease in held)
    with pytest.raises(RuntimeError):
        leases.acquire("lock:close:after", 5_000)
    client.close()


def test_suspended_then_lost_while_the_server_is_stopped(server, r, leases, key):
    ttl = 600
    lease = leases.acquire(key, ttl)
    wait_until("a first renewal", lambda: lease.renewals >= 1)
    server.pause()
    try:
        wait_until("suspended", lambda: lease.state is not State.HELD, timeout=2)
        assert lease.state is State.SUSPENDED
        assert not lease.lost.is_set()
        left = lease.deadline_in
        assert 0 < left <= ttl / 1000
        seen = time.monotonic()
        assert lease.lost.wait(timeout=2)
        took = time.monotonic() - seen
        # Lost at the deadline last confirmed: not before it, and soon after.
        assert left - 0.02 <= took <= left + 0.15, (left, took)
        assert lease.state is State.LOST
    finally:
        server.resume()
    # Never back from lost, even now that the server answers again.
    wait_until("the server back", lambda: r.ping())
    seen = leases.batches
    time.sleep(ttl / 1000 / 2)
    assert lease.state is State.LOST
    assert leases.batches == seen  # nothing left to renew


def test_suspended_comes_back_to_held_before_the_deadline(server, r, leases, key):
    ttl = 900
    lease = leases.acquire(key, ttl)
    wait_until("a first renewal", lambda: lease.renewals >= 1)
    renewals = lease.renewals
    server.pause()
    try:
        wait_until("suspended", lambda: lease.state is State.SUSPENDED, timeout=2)
    finally:
        server.resume()
    wait_until("held again", lambda: lease.state is State.HELD, timeout=2)
    assert lease.renewals > renewals
    assert not lease.lost.is_set()
    assert info(r, key)["fence"] == lease.fence
    lease.release()


def test_acquire_options_reach_the_server(r, leases, key):
    readers = [leases.acquire(key, 5_000, shared=True, limit=2, owner=f"r{i}") for i in range(2)]
    assert info(r, key)["mode"] == "shared"
    assert info(r, key)["limit"] == 2
    with pytest.raises(NotAcquired):
        leases.acquire(key, 5_000, shared=True, limit=2)
    holders = r.execute_command("LEASE.HOLDERS", key)
    owners = [info_of(h)["owner"] for h in holders]
    assert owners == ["r0", "r1"]
    for reader in readers:
        reader.release()
    # An idempotent retry with the client's own token: same fence.
    first = leases.acquire(key, 5_000, token="my-token", delay_ms=0)
    again = leases.acquire(key, 5_000, token="my-token")
    assert again.fence == first.fence
    assert first.token == "my-token"
    again.release()
    assert first.release() is False  # the same hold, already released


def test_explicit_renew_and_release(r, leases, key):
    lease = leases.acquire(key, 5_000)
    lease.renew(20_000)
    assert info(r, key)["ttl"] > 10_000
    assert lease.release() is True
    assert lease.release() is False
    with pytest.raises(LeaseLost):
        lease.renew()
    lost = leases.acquire(key, 5_000)
    r.delete(key)
    with pytest.raises(LeaseLost):
        lost.renew()
    assert lost.state is State.LOST


def test_caps_stop_renewing_and_the_lease_ends_at_its_deadline(r, leases, key):
    capped = leases.acquire(key, 300, max_renewals=2)
    assert capped.lost.wait(timeout=3)
    assert capped.renewals == 2
    assert "deadline" in capped.reason
    held_for = leases.acquire(key + ":hold", 300, max_hold_ms=500)
    start = time.monotonic()
    assert held_for.lost.wait(timeout=3)
    assert 0.45 <= time.monotonic() - start + 0.05 <= 0.9


def test_a_key_overwritten_with_another_type_is_lost(r, leases, key):
    lease = leases.acquire(key, 600)
    r.set(key, "not a lease")
    assert lease.lost.wait(2)
    assert "answered" in lease.reason or "WRONGTYPE" in lease.reason


def test_readonly_from_a_demoted_server_is_a_lost_connection_not_an_answer(server, key):
    """A server made a replica under a held lease answers the renewals READONLY: the
    watchdog counts that as a lost connection (suspended, a new connection for the next
    try, as it would to find a new master), never as an answer, and the lease is lost at
    its deadline, not at the first READONLY."""
    primary = Server(server.name, server.binary).start()
    demoted = Server(server.name, server.binary).start()
    admin = demoted.client()
    client = demoted.client()
    leases = Leases(client)
    try:
        ttl = 900
        lease = leases.acquire(key, ttl)
        wait_until("a first renewal", lambda: lease.renewals >= 1)
        admin.execute_command("REPLICAOF", "127.0.0.1", primary.port)
        connections = int(admin.info("stats")["total_connections_received"])
        wait_until("suspended", lambda: lease.state is State.SUSPENDED, timeout=2)
        # Each retry opens a new connection: the READONLY one was dropped.
        wait_until(
            "reconnections",
            lambda: int(admin.info("stats")["total_connections_received"]) >= connections + 2,
            timeout=2,
        )
        assert lease.lost.wait(timeout=2)
        assert "deadline" in lease.reason
    finally:
        leases.close()
        client.close()
        admin.close()
        demoted.stop()
        primary.stop()
