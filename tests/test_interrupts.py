"""Nothing left behind: Ctrl-C at any moment is one line and exit 130; an interrupted export
removes its partial bundle; ``ingest -a PATH`` says when it creates an archive.

The SIGINTs are real signals to real ``dumpdb`` processes, synchronised on what the process
itself writes (the export's work directory and files in it) or does (importing a module:
a meta-path hook in the child sends the signal at that moment), never on a sleep.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ms_case
from typer.testing import CliRunner

import dumpdb
from dumpdb.cli import app

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
BOUND = 120.0  # seconds: a bound on waiting for the child, not a timing assertion

# The child: a hook sends SIGINT to the process when `target` is first imported, then the
# dumpdb entry point runs with the given arguments.
CHILD = r"""
import importlib.abc, os, signal, sys
target = sys.argv[1]
class Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target_=None):
        if name == target:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None
sys.meta_path.insert(0, Hook())
sys.argv = ["dumpdb", *sys.argv[2:]]
from dumpdb.__main__ import main
main()
print("not interrupted", file=sys.stderr)
"""


@pytest.fixture(scope="module")
def three_runs(tmp_path_factory) -> Path:
    archive = tmp_path_factory.mktemp("interrupts") / "a.dumpdb"
    for case in ("e1_nan_inf_overflow", "c1_inputs_kernels_iter", "d2_compare_fp16_bf16_iter0"):
        assert dumpdb.ingest(ms_case(case), archive=archive, run=case).ok
    return archive


@pytest.mark.parametrize("module", ["typer", "dumpdb.cli", "dumpdb.archive", "duckdb", "rich.console"])
def test_ctrl_c_at_any_moment_of_start_up_is_one_line_and_exit_130(three_runs, module):
    # typer, dumpdb.cli: while the CLI loads; the others inside the command (a hook that
    # never fires leaves stderr empty: the assertion below fails then)
    child = subprocess.run([sys.executable, "-c", CHILD, module, "sql", "-a", str(three_runs),
                            "SELECT count(*) FROM tensors"], capture_output=True, text=True, env=ENV,
                           timeout=BOUND)
    assert child.stderr == "interrupted\n", child.stderr
    assert child.returncode == 130


def _wait_for(predicate, proc: subprocess.Popen) -> None:
    """Poll (no sleep) until ``predicate()`` or the process ends; bounded."""
    deadline = time.monotonic() + BOUND
    while not predicate():
        assert proc.poll() is None, "export ended before the moment to interrupt it"
        assert time.monotonic() < deadline
        os.sched_yield()


@pytest.mark.parametrize("phase", ["start", "payloads", "catalog"])
@pytest.mark.parametrize("suffix", [".zip", ""])
def test_export_interrupted_at_any_phase_leaves_nothing(three_runs, tmp_path, phase, suffix):
    out = tmp_path / "out"
    out.mkdir()
    target = out / f"bundle{suffix}"
    proc = subprocess.Popen([sys.executable, "-m", "dumpdb", "export", "e1_nan_inf_overflow",
                             "c1_inputs_kernels_iter", "d2_compare_fp16_bf16_iter0", "--to", str(target),
                             "-a", str(three_runs)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=ENV)
    try:
        work: list[Path] = []

        def work_dir() -> bool:
            work.extend(p for p in out.iterdir() if p.name.startswith(".dumpdb-export-"))
            return bool(work)

        _wait_for(work_dir, proc)
        marker = {"start": None, "payloads": "bundle/tensors.zarr/packs",
                  "catalog": "bundle/catalog/tensors.parquet"}[phase]
        if marker is not None:
            _wait_for(lambda: (work[0] / marker).exists(), proc)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=BOUND)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert err.splitlines()[-1] == "interrupted" and "Traceback" not in err
    assert list(out.iterdir()) == []  # no hidden work directory, no partial bundle


def test_export_removes_work_directories_of_dead_exports(three_runs, tmp_path):
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = tmp_path / f".dumpdb-export-{int(child.stdout)}-abcd1234"  # its process is gone
    (dead / "bundle").mkdir(parents=True)
    alive = tmp_path / f".dumpdb-export-{os.getppid()}-efgh5678"  # a running process's
    alive.mkdir()
    dumpdb.open(three_runs).export("c1_inputs_kernels_iter", tmp_path / "c1.zip")
    assert not dead.exists() and alive.exists() and (tmp_path / "c1.zip").is_file()


def test_ingest_says_it_created_the_archive_and_no_create_refuses(tmp_path):
    runner = CliRunner()
    typo = tmp_path / "archvie"
    refused = runner.invoke(app, ["ingest", str(ms_case("f_long_names")), "-a", str(typo), "--no-create", "-q"])
    assert refused.exit_code == 2
    assert f"{typo}: no such archive; --no-create refuses to make one" in refused.output
    assert not typo.exists()
    created = runner.invoke(app, ["ingest", str(ms_case("f_long_names")), "-a", str(typo), "-q"])
    assert created.exit_code == 0 and f"created archive {typo}" in created.output
    again = runner.invoke(app, ["ingest", str(ms_case("f_long_names")), "-a", str(typo), "--no-create", "-q"])
    assert again.exit_code == 0 and "created archive" not in again.output
    assert "0 added, 66 already there" in again.output
