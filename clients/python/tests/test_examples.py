"""The examples run as they are, against each server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def run_example(name, server, *args):
    done = subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / name),
            "--url",
            f"redis://127.0.0.1:{server.port}/0",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_paused_worker_cannot_damage_the_resource(server):
    out = run_example("paused_worker.py", server)
    assert "the paused worker could not damage the report" in out
    assert "STALE fencing token" in out
    assert "must not happen" not in out


def test_sqlite_fencing(server, tmp_path):
    out = run_example("sqlite_fencing.py", server, "--db", str(tmp_path / "report.db"))
    assert "A: refused by SQLite" in out
    assert "report: 'final by B'" in out
