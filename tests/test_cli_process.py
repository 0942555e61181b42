"""The real `dumpdb` process (issue 30, item 3): what a shell user sees and the exit code
a script reads. `| head` is not "found" (exit 1), Ctrl-C during a query is `interrupted`
and 130, a usage error is one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ms_case

import dumpdb

ROOT = Path(__file__).resolve().parent.parent


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("DUMPDB_DEBUG", None)
    return env


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli_process") / "a.dumpdb"
    assert dumpdb.ingest(ms_case("c1_inputs_kernels_iter"), archive=path, run="c1").ok
    return path


@pytest.mark.parametrize("fmt", ["table", "csv"])
def test_a_reader_that_goes_away_is_not_found(archive, fmt):
    """`dumpdb sql ... | head -1`: the reader closes the pipe; rich's own handler exited 1."""
    proc = subprocess.Popen([sys.executable, "-m", "dumpdb", "sql", "-a", str(archive), "-f", fmt,
                             "SELECT t.*, r.range AS k FROM tensors t, range(300) r"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()  # what head does after its line
    err = proc.stderr.read().decode()
    code = proc.wait(timeout=120)
    assert first and code == 0, (code, err)
    assert "Traceback" not in err and "error" not in err.lower()


@pytest.mark.parametrize("args", [["runs", "--bogus"], ["compare"], ["nosuch"], ["--bogus", "runs"]])
def test_a_usage_error_is_one_line(args):
    proc = subprocess.run([sys.executable, "-m", "dumpdb", *args], capture_output=True, text=True, env=_env(),
                          timeout=120)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(lines) == 1 and lines[0].startswith("error: ") and "--help" in lines[0], proc.stderr


# Ctrl-C during a running `dumpdb sql` query (interrupted, exit 130) is tested on the real
# sandboxed query in tests/test_hostile_input.py::test_ctrl_c_stops_a_running_sql_command_with_exit_130.


# What `dumpdb compare --mode statistics` imports and how many times it opens the catalog,
# seen from inside the real process: dumpdb.__main__.main() run by a wrapper that counts
# duckdb.connect calls and lists the modules loaded once the command has ended.
_COMPARE_PROCESS = """
import json, sys
import duckdb
files = []
connect = duckdb.connect
def counted(database=":memory:", *args, **kwargs):
    if str(database).endswith("catalog.duckdb"):
        files.append(kwargs.get("read_only", False))
    return connect(database, *args, **kwargs)
duckdb.connect = counted
sys.argv = ["dumpdb", *sys.argv[1:]]
from dumpdb.__main__ import main
try:
    main()
    code = 0
except SystemExit as exc:
    code = exc.code
lazy = ("zarr", "numcodecs", "dumpdb.storage.store", "dumpdb.archival.remote_bundle")
print(json.dumps([code, files, sorted(m for m in lazy if m in sys.modules)]))
"""


@pytest.fixture(scope="module")
def statistics_archive(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli_process_stats") / "s.dumpdb"
    for run in ("target", "bench"):
        assert dumpdb.ingest(ROOT / "tests" / "data" / "msprobe" / "statistics_mix_md5", archive=path, run=run).ok
    return path


@pytest.mark.parametrize("store", ["--no-store", "--store"])
def test_a_statistics_compare_reads_no_payload_module_and_opens_the_catalog_once(statistics_archive, store):
    """A statistics compare never reads a payload: the tensor store and its codecs (zarr,
    numcodecs) are not imported. It holds one read-only catalog connection for the whole
    command (the one that checked the schema), where it opened one per block of queries;
    storing the results closes it for the one read-write connection and opens it again."""
    proc = subprocess.run([sys.executable, "-c", _COMPARE_PROCESS, "compare", "target", "bench",
                           "-a", str(statistics_archive), "--mode", "statistics", store],
                          capture_output=True, text=True, env=_env(), timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    code, files, loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert code == 0 and "pairs" in proc.stdout
    assert loaded == []
    assert files == ([True] if store == "--no-store" else [True, False, True])
