"""The README's blocks marked ``<!-- runnable -->`` run as they are (pointed at the
server under test), exit 0, leave no watchdog thread and no unclosed client behind."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCK = re.compile(r"<!-- runnable -->\n```python\n(.*?)```", re.S)

# Run after the block: its clients are closed (no pooled connection left open) and no
# watchdog thread is left (the one behind redis_lease.Lock ends once no lock is held).
AFTER = """
import gc, threading, time
import redis.connection
deadline = time.monotonic() + 5
while any(t.name == "redis-lease-watchdog" for t in threading.enumerate()):
    assert time.monotonic() < deadline, "a watchdog thread is still running"
    time.sleep(0.01)
gc.collect()
base = getattr(redis.connection, "AbstractConnection", redis.connection.Connection)
left = [c for c in gc.get_objects() if isinstance(c, base) and getattr(c, "_sock", None)]
assert not left, f"{len(left)} connection(s) left open"
"""


def blocks():
    found = BLOCK.findall(README.read_text())
    assert len(found) >= 4
    return found


@pytest.mark.parametrize("index", range(len(blocks())))
def test_readme_block_runs_and_cleans_up(server, index):
    code = blocks()[index]
    for client in ("redis.Redis()", "redis.asyncio.Redis()"):
        code = code.replace(client, f"{client[:-1]}port={server.port})")
    assert f"port={server.port}" in code
    done = subprocess.run(
        # Unclosed asyncio clients and sockets warn ResourceWarning: make it fail.
        [sys.executable, "-X", "dev", "-W", "error::ResourceWarning", "-c", code + AFTER],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ResourceWarning" not in done.stderr, done.stderr
