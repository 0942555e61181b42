"""Every wait says why: a command blocked by another process's lock prints one line naming
the holder and waits up to ``--wait SECONDS``, then exits 2 with that reason.

The holder is a real process holding a read-write DuckDB connection on the catalog; it
says it holds it through a pipe and lets go when told (no sleeps). The waiting command's
stderr is read from its pipe, line by line, with a bound.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ingest_runs, ms_case, private_copy

import dumpdb
from dumpdb.catalog.locks import EXCLUSIVE, store_lock
from dumpdb.catalog.waiting import duckdb_holder

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "300"}
BOUND = 120.0  # seconds: bounds reading a pipe, not a timing assertion
HOLD = ("import duckdb, sys; c = duckdb.connect(sys.argv[1]); print('locked', flush=True); "
        "sys.stdin.readline(); c.close()")


@pytest.fixture(scope="module")
def _archive_once(tmp_path_factory) -> Path:
    return ingest_runs(tmp_path_factory.mktemp("waits") / "a.dumpdb", c1="c1_inputs_kernels_iter")


@pytest.fixture
def archive(_archive_once, tmp_path) -> Path:
    """A private copy of one c1 ingest per module (the tests lock and change it)."""
    return private_copy(_archive_once, tmp_path)


@pytest.fixture
def holder(archive):
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(archive / "catalog.duckdb")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    yield proc
    if proc.poll() is None:
        proc.stdin.close()
        proc.wait(timeout=BOUND)


def _line(stream) -> str:
    """One line from a child's pipe, waiting at most BOUND seconds."""
    with selectors.DefaultSelector() as sel:
        sel.register(stream, selectors.EVENT_READ)
        assert sel.select(timeout=BOUND), "no line on the pipe"
    return stream.readline()


def test_a_held_connection_makes_sql_say_why_and_it_goes_on_waiting(archive, holder):
    proc = subprocess.Popen([sys.executable, "-m", "dumpdb", "sql", "-a", str(archive), "-f", "csv", "--wait", "300",
                             "SELECT count(*) AS n FROM tensors"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=ENV)
    try:
        line = _line(proc.stderr)
        assert line.startswith(f"waiting for the catalog lock held by another DuckDB connection (pid {holder.pid}: "
                               "python")
        assert "gives up after 300 s; --wait SECONDS changes it" in line
        holder.stdin.write("release\n")  # the holder lets go: the query goes on and answers
        holder.stdin.flush()
        out, err = proc.communicate(timeout=BOUND)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and out.splitlines() == ["n", "42"]
    assert err == ""  # the one line only


@pytest.mark.parametrize("args", [
    ["sql", "SELECT 1", "--wait", "1"],
    ["--wait", "1", "prune", "c1", "--keep-stats"],
    ["gc", "--wait=1"],
    ["rm", "c1", "--yes", "--wait", "1"],
    ["ingest", str(ms_case("f_long_names")), "--run", "f", "--wait", "1", "-q"],
    ["export", "c1", "--to", "{tmp}/c1.zip", "--wait", "1"],
], ids=["sql", "prune", "gc", "rm", "ingest", "export"])
def test_commands_give_up_after_wait_with_exit_2_naming_the_holder(archive, holder, tmp_path, args):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    done = subprocess.run([sys.executable, "-m", "dumpdb", *args, "-a", str(archive)], capture_output=True,
                          text=True, env=ENV, timeout=BOUND)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    who = f"another DuckDB connection (pid {holder.pid}: python"
    assert len(lines) == 2 and lines[0].startswith(f"waiting for the catalog lock held by {who}"), lines
    assert lines[1].startswith(f"error: {archive / 'catalog.duckdb'}: catalog is locked by another process: {who}")
    assert lines[1].endswith("gave up after 1 s (--wait SECONDS waits longer)")


def test_store_lock_held_by_a_dumpdb_process_is_named_with_what_it_does(archive):
    with store_lock(archive, EXCLUSIVE, "gc", timeout=5):
        done = subprocess.run([sys.executable, "-m", "dumpdb", "--wait", "1", "rm", "c1", "--yes", "-a", str(archive)],
                              capture_output=True, text=True, env=ENV, timeout=BOUND)
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and len(lines) == 2, lines
    assert lines[0].startswith(f"rm of run 'c1': waiting, archive in use by gc (pid {os.getpid()}, for ")
    assert lines[0].endswith("(gives up after 1 s; --wait SECONDS changes it)")
    assert lines[1].startswith(f"error: {archive}: archive in use by gc (pid {os.getpid()}, for ")
    assert "rm of run 'c1' gave up after 1 s (--wait SECONDS waits longer" in lines[1]
    assert dumpdb.open(archive).show("c1")["tensors"] == 42  # nothing removed


@pytest.mark.parametrize("args", [
    ["ingest-worker", str(ms_case("f_long_names")), "--part", "node1", "--run", "f", "-q"],
    ["commit"],
], ids=["ingest-worker", "commit"])
def test_parts_commands_honour_the_global_wait(archive, args):
    """``ingest-worker`` and ``commit`` give up after ``--wait`` too (they took the 120 s default)."""
    with store_lock(archive, EXCLUSIVE, "gc", timeout=5):
        done = subprocess.run([sys.executable, "-m", "dumpdb", *args, "--wait", "1", "-a", str(archive)],
                              capture_output=True, text=True, env=ENV, timeout=BOUND)
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and len(lines) == 2, lines
    assert lines[0].endswith("(gives up after 1 s; --wait SECONDS changes it)")
    assert lines[1].startswith(f"error: {archive}: archive in use by gc (pid {os.getpid()}, for ")
    assert "gave up after 1 s (--wait SECONDS waits longer" in lines[1]


def test_a_short_wait_says_nothing(archive):
    """A lock released before the notice delay (commits take milliseconds) prints no line."""
    said: list[str] = []
    a = dumpdb.open(archive, lock_timeout=30, on_wait=said.append)
    for _ in range(3):
        with a.catalog.writer():
            pass
        a.sql("SELECT 1")
    assert said == []


def test_holder_names_dumpdb_processes_other_connections_and_unknown_pids(archive, tmp_path):
    (tmp_path / "w.py").write_text("import sys\nprint('ready', flush=True)\nsys.stdin.readline()\n")
    waiting = [sys.executable, "w.py"]  # relative: the command line stays short enough to show whole
    other = subprocess.Popen(waiting, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    ours = subprocess.Popen([*waiting, "dumpdb", "sql"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            cwd=tmp_path)
    long = subprocess.Popen([*waiting, "x" * 80, "dumpdb", "ingest"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, cwd=tmp_path)
    try:
        # until a child runs its own program, /proc/PID/cmdline is still this process's
        # (between fork and exec): wait for each to say it runs
        for proc in (other, ours, long):
            assert proc.stdout.readline() == "ready\n"
        def error(pid: int) -> str:
            return f'IO Error: Could not set lock on file "x": Conflicting lock is held in /usr/bin/python3 (PID {pid}).'

        assert duckdb_holder(error(other.pid), archive).startswith(f"another DuckDB connection (pid {other.pid}: ")
        assert duckdb_holder(error(ours.pid), archive).startswith(f"dumpdb process (pid {ours.pid}: ")
        assert "dumpdb sql" in duckdb_holder(error(ours.pid), archive)
        assert duckdb_holder("IO Error: Could not set lock on file", archive) == "another DuckDB connection"
        # "dumpdb" past the shortened command line still tells a dumpdb process
        assert duckdb_holder(error(long.pid), archive).startswith(f"dumpdb process (pid {long.pid}: ")
        assert "dumpdb ingest" not in duckdb_holder(error(long.pid), archive)  # shown shortened
    finally:
        for proc in (other, ours, long):
            proc.stdin.close()
            proc.wait(timeout=BOUND)
            proc.stdout.close()


def test_wait_given_after_the_command_or_before_it_is_the_same(archive, holder):
    results = [subprocess.run([sys.executable, "-m", "dumpdb", *args, "-a", str(archive)], capture_output=True,
                              text=True, env=ENV, timeout=BOUND)
               for args in (["--wait", "0.5", "runs"], ["runs", "--wait=0.5"])]
    for done in results:
        assert done.returncode == 2 and "gave up after 0.5 s" in done.stderr


def test_wait_option_anywhere_and_without_a_value(archive):
    from typer.testing import CliRunner

    from dumpdb.cli import app

    runner = CliRunner()
    for args in (["--wait", "5", "sql"], ["sql", "--wait", "5"], ["sql", "--wait=5"]):
        done = runner.invoke(app, [*args, "-a", str(archive), "-f", "csv", "SELECT 42 AS n"])
        assert done.exit_code == 0 and done.stdout.splitlines() == ["n", "42"], (args, done.output)
    missing = runner.invoke(app, ["sql", "-a", str(archive), "SELECT 1", "--wait"])
    assert missing.exit_code == 2 and "Invalid value for '--wait'" in missing.output
    negative = runner.invoke(app, ["sql", "-a", str(archive), "SELECT 1", "--wait", "-1"])
    assert negative.exit_code == 2 and "--wait" in negative.output


def test_the_python_api_without_on_wait_logs_the_wait_as_a_warning(archive, holder, caplog):
    """``dumpdb.open(A)`` with no ``on_wait`` does not wait silently: the line naming the
    holder goes to the ``dumpdb`` logger (printed on stderr when logging is not set up)."""
    with caplog.at_level("WARNING", logger="dumpdb"), pytest.raises(dumpdb.errors.ArchiveError, match="gave up after 2 s"):
        dumpdb.open(archive, lock_timeout=2).sql("SELECT 1")
    said = [r for r in caplog.records if r.name == "dumpdb"]
    assert len(said) == 1 and said[0].levelname == "WARNING"
    assert said[0].getMessage().startswith(
        f"waiting for the catalog lock held by another DuckDB connection (pid {holder.pid}: python")


def test_the_store_lock_without_on_wait_logs_the_wait_as_a_warning(archive, caplog):
    with store_lock(archive, EXCLUSIVE, "gc", timeout=5), caplog.at_level("WARNING", logger="dumpdb"), \
            pytest.raises(dumpdb.errors.ArchiveError, match="archive in use by gc"):
        # a second holder in this process conflicts with the first (flock per open file)
        with store_lock(archive, EXCLUSIVE, "rm of run 'c1'", timeout=2):
            pass
    said = [r.getMessage() for r in caplog.records if r.name == "dumpdb"]
    assert len(said) == 1 and said[0].startswith(f"rm of run 'c1': waiting, archive in use by gc (pid {os.getpid()}")
