"""The dumpdb command line, run in-process through typer's runner."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
from conftest import ms_case
from typer.testing import CliRunner

from dumpdb.cli import app

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def test_ingest_sql_runs_show(tmp_path):
    archive = tmp_path / "lenet.dumpdb"
    r = invoke("ingest", ms_case("c1_inputs_kernels_iter"), "--archive", archive, "--run", "fp32-baseline")
    assert r.exit_code == 0, r.output
    assert "42 added" in r.output and "ratio" in r.output
    r = invoke("sql", "--archive", archive, "--format", "csv",
               "SELECT iteration, count(*) AS n FROM tensors GROUP BY ALL ORDER BY iteration")
    assert r.exit_code == 0
    assert r.stdout.splitlines() == ['iteration,n', "0,14", "2,14", "3,14"]
    r = invoke("sql", "-a", archive, "-f", "json", "SELECT shape, max FROM tensors WHERE op_type='MatMul' AND slot=2 LIMIT 1")
    assert json.loads(r.stdout) == [{"shape": [], "max": 0.0}]
    out = tmp_path / "t.parquet"
    r = invoke("sql", "-a", archive, "-f", "parquet", "-o", out, "SELECT * FROM tensors")
    assert r.exit_code == 0 and pq.read_table(out).num_rows == 42
    r = invoke("sql", "-a", archive, "SELECT op_type, count(*) AS n FROM tensors GROUP BY ALL")
    assert r.exit_code == 0 and "Conv2D" in r.stdout and "rows" in r.stdout
    r = invoke("runs", "--archive", archive)
    assert r.exit_code == 0 and "fp32-baseline" in r.stdout
    r = invoke("show", "fp32-baseline", "--archive", archive)
    assert r.exit_code == 0 and "0, 2, 3" in r.stdout and "bytes stored" in r.stdout


def test_errors_are_one_line_with_exit_code_2(tmp_path):
    r = invoke("ingest", tmp_path / "missing", "--archive", tmp_path / "a")
    assert r.exit_code == 2 and "no such directory" in r.output and "Traceback" not in r.output
    (tmp_path / "empty").mkdir()
    r = invoke("ingest", tmp_path / "empty", "--archive", tmp_path / "a")
    assert r.exit_code == 2 and "not a dump dumpdb recognises" in r.output
    r = invoke("sql", "--archive", tmp_path / "nowhere", "SELECT 1")
    assert r.exit_code == 2 and "no such archive" in r.output
    r = invoke("sql", "--archive", tmp_path / "nowhere", "-f", "parquet", "SELECT 1")
    assert r.exit_code == 2 and "needs --output" in r.output


def test_failed_files_give_exit_code_1(tmp_path, case_copy):
    src = case_copy("c1_inputs_kernels_iter")
    bad = sorted(src.rglob("*.npy"))[0]
    bad.write_bytes(bad.read_bytes()[:40])
    r = invoke("ingest", src, "--archive", tmp_path / "a")
    assert r.exit_code == 1
    assert "1 file(s) failed" in r.output and bad.name in r.output


def test_layouts_and_version():
    r = invoke("layouts")
    assert r.exit_code == 0 and "mindspore-sync" in r.stdout and "Dump功能调试" in r.stdout
    r = invoke("--version")
    assert r.exit_code == 0 and r.stdout.startswith("dumpdb ")
