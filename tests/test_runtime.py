"""dumpdb.runtime: memory a long command has freed goes back to the operating system; Arrow's
memory pool of the dumpdb process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow as pa
import pytest

from dumpdb import runtime
from dumpdb.dumpio import libc


def _has_malloc_trim() -> bool:
    return hasattr(libc(), "malloc_trim")


@pytest.mark.skipif(not sys.platform.startswith("linux") or not _has_malloc_trim(),
                    reason="malloc_trim is glibc's; elsewhere release_free_memory only releases Arrow's pool")
def test_freed_heap_memory_goes_back_to_the_system():
    # a fresh interpreter: its heap holds only what this script frees. 2,000 arrays of 96 KiB
    # (below glibc's mmap threshold: they come from the heap), all freed but the last, which
    # keeps the heap's top in use so that free() alone cannot shrink it
    script = (
        "import os, numpy as np\n"
        "from dumpdb.runtime import release_free_memory\n"
        "def rss():\n"
        "    with open('/proc/self/statm') as f: return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')\n"
        "held = [np.ones(96 << 7) for _ in range(2000)]\n"
        "last = held[-1]; del held\n"
        "before = rss(); release_free_memory(); after = rss()\n"
        "print(before - after)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) > 100 << 20  # of ~190 MB freed



# Arrow's memory pool (runtime.use_memory_pool): the dumpdb process and its workers take the
# system allocator; the user's ARROW_DEFAULT_MEMORY_POOL wins; a library import changes nothing.

_POOL_REPORT = (
    "import json, runpy, sys\n"
    "sys.argv = ['dumpdb'] + sys.argv[1:]\n"
    "try:\n"
    "    runpy.run_module('dumpdb', run_name='__main__')\n"
    "except SystemExit:\n"
    "    pass\n"
    "import pyarrow as pa\n"
    "from dumpdb.ingestion.workers import process_pool\n"
    "with process_pool(1) as pool:\n"  # dumpdb's ingest workers (spawn): a fresh interpreter
    "    worker = pool.submit(eval, \"__import__('pyarrow').default_memory_pool().backend_name\").result()\n"
    "print(json.dumps([pa.default_memory_pool().backend_name, worker]))\n"
)


def _pools(args: list[str], **env: str) -> list[str]:
    """[the process's Arrow pool, a worker's] after ``python -m dumpdb ARGS`` ran in a fresh
    interpreter (without the caller's ARROW_DEFAULT_MEMORY_POOL unless given in ``env``)."""
    base = {k: v for k, v in os.environ.items() if k != runtime.POOL_ENV}
    out = subprocess.run([sys.executable, "-c", _POOL_REPORT, *args], capture_output=True, text=True, timeout=300,
                         env={**base, "PYTHONPATH": os.pathsep.join(sys.path), **env})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _fresh_default_pool() -> str:
    out = subprocess.run([sys.executable, "-c", "import pyarrow as pa; print(pa.default_memory_pool().backend_name)"],
                         capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in os.environ.items() if k != runtime.POOL_ENV})
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_dumpdb_process_and_its_workers_take_the_system_pool():
    assert runtime.MEMORY_POOL == "system"
    assert _pools(["compare", "--help"]) == ["system", "system"]
    assert _pools(["ingest", "--help"]) == ["system", "system"]
    # root options before the command (their values too) do not hide it
    assert _pools(["--debug", "--wait", "5", "compare", "--help"]) == ["system", "system"]


def test_the_command_behind_root_options():
    from typer.main import get_command

    from dumpdb.__main__ import ROOT_OPTIONS_WITH_VALUE, command
    from dumpdb.cli import app

    # the hand list is the root options that take a value (a new one must join it)
    taking = {name for p in get_command(app).params if not getattr(p, "is_flag", False)
              for name in p.opts if name.startswith("--")}
    assert set(ROOT_OPTIONS_WITH_VALUE) == taking

    assert command(["compare", "a", "b"]) == "compare"
    assert command(["--debug", "--wait", "5", "--storage-option", "k=v", "first-divergence", "x"]) == \
        "first-divergence"
    assert command(["--wait=5", "scan"]) == "scan"
    assert command(["--version"]) is None and command([]) is None


def test_a_command_without_arrow_work_keeps_pyarrows_default_pool():
    default = _fresh_default_pool()
    assert _pools(["--help"]) == [default, default]


@pytest.mark.skipif("jemalloc" not in pa.supported_memory_backends(), reason="this pyarrow has no jemalloc")
def test_the_users_arrow_default_memory_pool_wins():
    assert _pools(["compare", "--help"], ARROW_DEFAULT_MEMORY_POOL="jemalloc") == ["jemalloc", "jemalloc"]


def test_importing_dumpdb_as_a_library_changes_no_pool():
    script = ("import json, os\n"
              "import dumpdb, dumpdb.cli, dumpdb.compare.engine, dumpdb.ingestion.pipeline\n"
              "import pyarrow as pa\n"
              f"print(json.dumps([pa.default_memory_pool().backend_name, os.environ.get({runtime.POOL_ENV!r})]))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         env={**{k: v for k, v in os.environ.items() if k != runtime.POOL_ENV},
                              "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [_fresh_default_pool(), None]


def test_use_memory_pool_after_pyarrows_import_sets_pyarrows_pool_and_the_workers_variable(monkeypatch):
    # "" counts as unset; setenv (not delenv, which records nothing when the variable is
    # absent) also takes back what use_memory_pool sets, for the tests after this one
    monkeypatch.setenv(runtime.POOL_ENV, "")
    before = pa.default_memory_pool()
    try:
        assert runtime.use_memory_pool("system") == "system"
        assert pa.default_memory_pool().backend_name == "system"
        assert os.environ[runtime.POOL_ENV] == "system"
    finally:
        pa.set_memory_pool(before)


def test_a_backend_this_pyarrow_lacks_leaves_the_default_silently(monkeypatch):
    monkeypatch.delenv(runtime.POOL_ENV, raising=False)
    monkeypatch.setattr(pa, "supported_memory_backends", lambda: ["mimalloc", "system"])
    before = pa.default_memory_pool().backend_name
    assert runtime.use_memory_pool("jemalloc") is None
    assert pa.default_memory_pool().backend_name == before
    assert runtime.POOL_ENV not in os.environ
    monkeypatch.setenv(runtime.POOL_ENV, "mimalloc")  # the user's: kept, whatever dumpdb would choose
    assert runtime.use_memory_pool("system") is None
    assert pa.default_memory_pool().backend_name == before
    with pytest.raises(ValueError, match="unknown Arrow memory pool"):
        runtime.use_memory_pool("tcmalloc")
