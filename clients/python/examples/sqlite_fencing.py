"""Fencing a resource that is not Redis: a SQLite table.

The row stores the fence of the last write it accepted, and every write is one UPDATE
that compares it in the same statement:

    UPDATE report SET body = ?, fence = ? WHERE id = ? AND fence <= ?

A holder whose lease expired and was taken over carries a lower fence than the holder
that wrote after it: its UPDATE matches no row and changes nothing, however late it
arrives. (``fence <= ?`` rather than ``<``: the same holder writes many times.)

    python examples/sqlite_fencing.py [--url redis://127.0.0.1:6379/0] [--db report.db]
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
from pathlib import Path

import redis

from redis_lease import Lease, Leases, StaleFence


def fenced_update(db: sqlite3.Connection, lease: Lease, row: int, body: str) -> None:
    """Write ``body`` if no later holder of the lease has written to the row."""
    with db:  # one transaction
        cursor = db.execute(
            "UPDATE report SET body = ?, fence = ? WHERE id = ? AND fence <= ?",
            (body, lease.fence, row, lease.fence),
        )
    if cursor.rowcount == 0:
        (highest,) = db.execute("SELECT fence FROM report WHERE id = ?", (row,)).fetchone()
        raise StaleFence(
            f"fence {lease.fence} is older than {highest}", lease, "report", lease.fence, highest
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--db", default=str(Path(tempfile.mkdtemp()) / "report.db"))
    args = parser.parse_args()

    db = sqlite3.connect(args.db)
    db.execute(
        "CREATE TABLE IF NOT EXISTS report (id INTEGER PRIMARY KEY, body TEXT, "
        "fence INTEGER NOT NULL)"
    )
    db.execute("INSERT OR REPLACE INTO report VALUES (1, '', 0)")
    db.commit()

    r = redis.Redis.from_url(args.url, decode_responses=True)
    r.delete("lock:sqlite-report")
    with Leases(r) as slow, Leases(r) as fast:
        # Worker A stops renewing after its grant (max_renewals=0 stands for a worker
        # stuck in a pause): its lease ends after 300 ms.
        a = slow.acquire("lock:sqlite-report", 300, max_renewals=0, owner="worker-a")
        fenced_update(db, a, 1, "draft by A")
        print(f"A (fence {a.fence}): wrote the draft")
        # Worker B waits for the lock and gets it when A's lease expires.
        with fast.acquire("lock:sqlite-report", 10_000, block_ms=5_000, owner="worker-b") as b:
            fenced_update(db, b, 1, "final by B")
            print(f"B (fence {b.fence}): wrote the final report")
            # A wakes up and writes as if it still held the lock: no check of its own,
            # only the fence in the UPDATE.
            try:
                fenced_update(db, a, 1, "late overwrite by A")
                print("A: overwrote the report (this must not happen)")
            except StaleFence as e:
                print(f"A: refused by SQLite: {e}")
    body, fence = db.execute("SELECT body, fence FROM report WHERE id = 1").fetchone()
    print(f"report: {body!r} (fence {fence})")
    return 0 if body == "final by B" else 1


if __name__ == "__main__":
    sys.exit(main())
