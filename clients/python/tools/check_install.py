"""Run by clients/python/test in a fresh venv where only the built wheel was installed:
the package imports from that venv (not from the checkout), its metadata carries the
version, the license expression and the license file."""

from __future__ import annotations

import importlib.metadata as metadata
import sys
from pathlib import Path

import redis_lease
import redis_lease.asyncio
import redis_lease.lock

installed = Path(redis_lease.__file__).resolve()
assert Path(sys.prefix).resolve() in installed.parents, f"imported from {installed}"
meta = metadata.metadata("redis-lease")
assert meta["Version"] == redis_lease.__version__, (meta["Version"], redis_lease.__version__)
assert meta["License-Expression"] == "BSD-3-Clause", meta["License-Expression"]
files = [str(f) for f in metadata.files("redis-lease") or []]
assert any(f.endswith("licenses/LICENSE") for f in files), files
assert any(f.endswith("redis_lease/py.typed") for f in files), files
for name in ("Leases", "Lock", "ReadWriteLock", "Semaphore", "NotConfirmed"):
    assert hasattr(redis_lease, name), name
assert redis_lease.asyncio.Leases is not redis_lease.Leases
print(f"redis-lease {meta['Version']} installed from the wheel: imports, metadata, LICENSE")
