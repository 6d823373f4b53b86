"""Run redis-py's own lock tests against ``redis_lease.Lock``.

Fetches the redis-py sdist of REDIS_PY_VERSION from PyPI (pip download), checks its
sha256, takes ``tests/test_lock.py`` and ``tests/test_asyncio/test_lock.py`` out of it
(the second against ``redis_lease.asyncio.Lock``), removes the statements that read the lock
key as a string or its Redis TTL (LEFT_OUT: a lease key is a module type with no Redis
TTL, so GET/TTL/PTTL/PEXPIRE on it do not mean what they mean for redis-py's string key),
deselects the tests that count the sleeps of redis-py's polling loop (DESELECTED), and
runs the rest with pytest and this folder's conftest.py. Nothing of redis-py's is
committed: the file is fetched and filtered at every run. Arguments go to pytest.
"""

from __future__ import annotations

import ast
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import List, Tuple

REDIS_PY_VERSION = "8.1.0"
SDIST_SHA256 = "6e1a19beef9225c83efd689c7e6b7da2d5215b1f42cd13b7fc3714d0a09c7b25"
# redis-py's test file -> where it goes in the suite, and the conftest beside it.
TEST_FILES = {
    "tests/test_lock.py": ("test_lock.py", "conftest.py"),
    "tests/test_asyncio/test_lock.py": ("test_asyncio/test_lock.py", "conftest_asyncio.py"),
}

HERE = Path(__file__).resolve().parent
CACHE = HERE.parent / ".redis-py-suite"

# The redis-py client methods that read or set the key's value or Redis TTL.
KEY_READS = {"get", "ttl", "pttl", "pexpire"}

# (test, statement) for every statement removed, and why: this list must match what the
# filter removes, so a new redis-py version that adds such a statement fails the run
# until it is reviewed here.
LEFT_OUT: List[Tuple[str, str]] = [
    ("test_lock.py::test_lock", "assert r.get('foo') == lock.local.token"),
    ("test_lock.py::test_lock", "assert r.ttl('foo') == -1"),
    ("test_lock.py::test_lock", "assert r.get('foo') is None"),
    ("test_lock.py::_test_lock_token", "assert r.get('foo') == b'test'"),
    ("test_lock.py::_test_lock_token", "assert r.ttl('foo') == -1"),
    ("test_lock.py::_test_lock_token", "assert r.get('foo') is None"),
    ("test_lock.py::test_timeout", "assert 8 < r.ttl('foo') <= 10"),
    ("test_lock.py::test_float_timeout", "assert 8 < r.pttl('foo') <= 9500"),
    ("test_lock.py::test_context_manager", "assert r.get('foo') == lock.local.token"),
    ("test_lock.py::test_context_manager", "assert r.get('foo') is None"),
    ("test_lock.py::test_extend_lock", "assert 8000 < r.pttl('foo') <= 10000"),
    ("test_lock.py::test_extend_lock", "assert 16000 < r.pttl('foo') <= 20000"),
    ("test_lock.py::test_extend_lock_replace_ttl", "assert 8000 < r.pttl('foo') <= 10000"),
    ("test_lock.py::test_extend_lock_replace_ttl", "assert 8000 < r.pttl('foo') <= 10000"),
    ("test_lock.py::test_extend_lock_float", "assert 10000 < r.pttl('foo') <= 10500"),
    ("test_lock.py::test_extend_lock_float", "old_ttl = r.pttl('foo')"),
    (
        "test_lock.py::test_extend_lock_float",
        "assert old_ttl + 10000 < r.pttl('foo') <= old_ttl + 10500",
    ),
    ("test_lock.py::test_reacquire_lock", "assert r.pexpire('foo', 5000)"),
    ("test_lock.py::test_reacquire_lock", "assert r.pttl('foo') <= 5000"),
    ("test_lock.py::test_reacquire_lock", "assert 8000 < r.pttl('foo') <= 10000"),
    ("test_asyncio/test_lock.py::test_lock", "assert await r.get('foo') == lock.local.token"),
    ("test_asyncio/test_lock.py::test_lock", "assert await r.ttl('foo') == -1"),
    ("test_asyncio/test_lock.py::test_lock", "assert await r.get('foo') is None"),
    ("test_asyncio/test_lock.py::_test_lock_token", "assert await r.get('foo') == b'test'"),
    ("test_asyncio/test_lock.py::_test_lock_token", "assert await r.ttl('foo') == -1"),
    ("test_asyncio/test_lock.py::_test_lock_token", "assert await r.get('foo') is None"),
    ("test_asyncio/test_lock.py::test_timeout", "assert 8 < await r.ttl('foo') <= 10"),
    ("test_asyncio/test_lock.py::test_float_timeout", "assert 8 < await r.pttl('foo') <= 9500"),
    (
        "test_asyncio/test_lock.py::test_context_manager",
        "assert await r.get('foo') == lock.local.token",
    ),
    ("test_asyncio/test_lock.py::test_context_manager", "assert await r.get('foo') is None"),
    ("test_asyncio/test_lock.py::test_extend_lock", "assert 8000 < await r.pttl('foo') <= 10000"),
    ("test_asyncio/test_lock.py::test_extend_lock", "assert 16000 < await r.pttl('foo') <= 20000"),
    (
        "test_asyncio/test_lock.py::test_extend_lock_replace_ttl",
        "assert 8000 < await r.pttl('foo') <= 10000",
    ),
    (
        "test_asyncio/test_lock.py::test_extend_lock_replace_ttl",
        "assert 8000 < await r.pttl('foo') <= 10000",
    ),
    (
        "test_asyncio/test_lock.py::test_extend_lock_float",
        "assert 10000 < await r.pttl('foo') <= 10500",
    ),
    ("test_asyncio/test_lock.py::test_extend_lock_float", "old_ttl = await r.pttl('foo')"),
    (
        "test_asyncio/test_lock.py::test_extend_lock_float",
        "assert old_ttl + 10000 < await r.pttl('foo') <= old_ttl + 10500",
    ),
    ("test_asyncio/test_lock.py::test_reacquire_lock", "assert await r.pexpire('foo', 5000)"),
    ("test_asyncio/test_lock.py::test_reacquire_lock", "assert await r.pttl('foo') <= 5000"),
    (
        "test_asyncio/test_lock.py::test_reacquire_lock",
        "assert 8000 < await r.pttl('foo') <= 10000",
    ),
]

# Whole tests not run, and why.
DESELECTED = {
    "test_lock.py::TestLock::test_blocking_timeout": "polling",
    "test_lock.py::TestLock::test_context_manager_blocking_timeout": "polling",
    "test_lock.py::TestLock::test_high_sleep_small_blocking_timeout": "polling",
    "test_asyncio/test_lock.py::TestLock::test_blocking_timeout": "polling",
    "test_asyncio/test_lock.py::TestLock::test_high_sleep_small_blocking_timeout": "polling",
}
# "polling": the test replaces redis-py's private clock (redis.lock.mod_time; in asyncio
# the module's asyncio) and asserts the exact sleeps of redis-py's retry loop (SET NX,
# sleep, SET NX...). The adapter has no such loop: a blocking acquire waits on the
# server (LEASE.ACQUIRE BLOCK), in the module's first-come-first-served queue, and
# ``sleep`` is unused.


def fetch_sdist() -> Path:
    name = f"redis-{REDIS_PY_VERSION}.tar.gz"
    sdist = CACHE / name
    if not sdist.is_file():
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--disable-pip-version-check",
                "--no-deps",
                "--no-binary",
                ":all:",
                f"redis=={REDIS_PY_VERSION}",
                "-d",
                str(CACHE),
            ],
            check=True,
        )
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        sdist.unlink()
        raise SystemExit(f"{name}: sha256 {digest}, expected {SDIST_SHA256}")
    return sdist


class _Filter(ast.NodeTransformer):
    """Drops the statements that call r.get/ttl/pttl/pexpire, noting each."""

    def __init__(self) -> None:
        self.removed: List[Tuple[str, str]] = []
        self.function = ""

    def generic_visit(self, node: ast.AST) -> ast.AST:
        super().generic_visit(node)
        if hasattr(node, "body") and isinstance(node.body, list) and not node.body:
            node.body = [ast.Pass()]  # a block whose statements were all removed
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> ast.AST:
        outer, self.function = self.function, node.name
        self.generic_visit(node)
        self.function = outer
        return node

    visit_AsyncFunctionDef = visit_FunctionDef

    def _reads_key(self, node: ast.AST) -> bool:
        return any(
            isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and isinstance(n.func.value, ast.Name)
            and n.func.value.id == "r"
            and n.func.attr in KEY_READS
            for n in ast.walk(node)
        )

    def _statement(self, node: ast.stmt) -> ast.stmt | None:
        if self._reads_key(node):
            self.removed.append((self.function, ast.unparse(node)))
            return None
        return node

    visit_Assert = _statement
    visit_Assign = _statement
    visit_Expr = _statement


def filtered(source: str) -> Tuple[str, List[Tuple[str, str]]]:
    f = _Filter()
    tree = ast.fix_missing_locations(f.visit(ast.parse(source)))
    return ast.unparse(tree), f.removed


def main(args: List[str]) -> int:
    sdist = fetch_sdist()
    suite = CACHE / "redis_py_lock_tests"
    shutil.rmtree(suite, ignore_errors=True)
    suite.mkdir(parents=True)
    removed: List[Tuple[str, str]] = []
    with tarfile.open(sdist) as tar:
        for path, (target, conftest) in TEST_FILES.items():
            member = tar.extractfile(f"redis-{REDIS_PY_VERSION}/{path}")
            assert member is not None, path
            source, dropped = filtered(member.read().decode())
            removed += [(f"{target}::{test}", statement) for test, statement in dropped]
            folder = (suite / target).parent
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "__init__.py").write_text("")
            shutil.copy(HERE / conftest, folder / "conftest.py")
            (suite / target).write_text(source)
    if removed != LEFT_OUT:
        print("the filter removed other statements than LEFT_OUT lists:", file=sys.stderr)
        for entry in removed:
            print(f"  {entry!r}", file=sys.stderr)
        return 1
    print(f"redis-py {REDIS_PY_VERSION} lock tests: {len(removed)} statements left out,")
    print(f"{len(DESELECTED)} tests deselected (see clients/python/redis_py_suite/run.py)")
    # By name: parametrized node ids end with the server's name.
    names = " or ".join(sorted({test.rsplit("::", 1)[1] for test in DESELECTED}))
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-k", f"not ({names})"]
    # As redis-py's own configuration.
    command += ["-o", "asyncio_mode=auto", "-o", "asyncio_default_fixture_loop_scope=function"]
    env = {**os.environ, "LEASE_PY_TESTS": str(HERE.parent / "tests")}
    return subprocess.run([*command, *args, suite.name], cwd=CACHE, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
