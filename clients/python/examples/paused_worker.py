"""The seed scenario: a worker paused past its lease cannot damage the resource.

Worker A takes lock:report and writes part 1 of the report through the lease's fence.
Then its whole process stops (SIGSTOP here; a GC pause, a swapped-out VM, a laptop lid in
real life): its watchdog thread stops with it, so nothing renews the lease, and the
server lets it expire. Worker B, blocked on the same lock, gets it with a higher fence and
writes the report. When A wakes up it carries on where it was, and tries to write part 2:

- its client refuses at once: the deadline it last confirmed has passed (LeaseLost);
- and had it not known (the pause could fall between that check and the write reaching
  the server), the resource refuses the stale fence itself: LEASE.FENCE answers STALE.

Run against a server with the module loaded (scripts/start in the repo root):

    python examples/paused_worker.py [--url redis://127.0.0.1:6379/0]

It exits 0 when the report holds B's writes only.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

import redis

from redis_lease import LeaseLost, Leases, StaleFence

LOCK, FENCE, REPORT = "lock:report", "fence:report", "report"
TTL_MS = 1_000


def worker_a(url: str) -> None:
    r = redis.Redis.from_url(url, decode_responses=True)
    leases = Leases(r)
    lease = leases.acquire(LOCK, TTL_MS, owner="worker-a")
    lease.fence_call(FENCE, "HSET", REPORT, "part1", "A")
    print(f"A: holds {LOCK} with fence {lease.fence}, wrote part 1", flush=True)
    print("A: about to write part 2", flush=True)
    sys.stdin.readline()  # <- the process is stopped here, then continued
    try:
        lease.fence_call(FENCE, "HSET", REPORT, "part2", "A (late)")
        print("A: wrote part 2 (this must not happen)", flush=True)
    except StaleFence as e:
        print(f"A: the resource refused part 2: {e}", flush=True)
    except LeaseLost as e:
        print(f"A: the client refused part 2: {e}", flush=True)
    # Had the client not known: the resource checks the fence in the same atomic step.
    try:
        r.execute_command("LEASE.FENCE", FENCE, lease.fence, "HSET", REPORT, "part2", "A (late)")
        print("A: the resource took the late write (this must not happen)", flush=True)
    except redis.ResponseError as e:
        print(f"A: sent anyway, the resource answered: {e}", flush=True)
    leases.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--worker-a", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker_a:
        worker_a(args.url)
        return 0

    r = redis.Redis.from_url(args.url, decode_responses=True)
    r.delete(LOCK, FENCE, REPORT)
    a = subprocess.Popen(
        [sys.executable, __file__, "--worker-a", "--url", args.url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert a.stdin is not None and a.stdout is not None
    for line in a.stdout:
        print(line, end="")
        if line.startswith("A: about to write part 2"):
            break
    os.kill(a.pid, signal.SIGSTOP)
    print(f"-- worker A (pid {a.pid}) is paused")

    with Leases(r) as leases:
        started = time.monotonic()
        # Waits in the server's queue; granted the moment A's lease expires.
        with leases.acquire(LOCK, TTL_MS, block_ms=10_000, owner="worker-b") as lease:
            waited = time.monotonic() - started
            print(f"B: got {LOCK} after {waited:.2f} s, fence {lease.fence}")
            lease.fence_call(FENCE, "HSET", REPORT, "part1", "B", "part2", "B")
            print("B: wrote parts 1 and 2")

    os.kill(a.pid, signal.SIGCONT)
    print(f"-- worker A (pid {a.pid}) continues")
    a.stdin.write("\n")
    a.stdin.flush()
    for line in a.stdout:
        print(line, end="")
    a.wait(10)

    report = r.hgetall(REPORT)
    print(f"report: {report}")
    if report == {"part1": "B", "part2": "B"}:
        print("the paused worker could not damage the report")
        return 0
    print("the report was damaged")
    return 1


if __name__ == "__main__":
    sys.exit(main())
