"""A worker that protects one job with a lease and fences its writes.

Run scripts/start in another terminal, then: python3 examples/worker.py
Needs redis-py (pip install redis).
"""
import time

import redis

r = redis.Redis(host="127.0.0.1", port=6379, decode_responses=True)

# Take the lease for 10 s. None means someone else holds it.
grant = r.execute_command("LEASE.ACQUIRE", "lock:report", 10_000)
if grant is None:
    raise SystemExit("report job is running elsewhere")
token, fence = grant

try:
    for step in range(3):
        time.sleep(0.1)  # the work
        # Every write to the protected resource carries the fence: a holder
        # whose lease expired (and was taken over) is rejected here.
        r.execute_command(
            "LEASE.FENCE", "fence:report", fence,
            "HSET", "report", f"step{step}", "done",
        )
        # Keep the lease while working; 0 means it was lost: stop.
        if r.execute_command("LEASE.RENEW", "lock:report", token, 10_000) == 0:
            raise SystemExit("lease lost; stopping without further writes")
finally:
    r.execute_command("LEASE.RELEASE", "lock:report", token)

print("report written under fence", fence)
