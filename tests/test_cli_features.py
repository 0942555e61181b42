"""Each README feature on the command line, with a test of its own; answers are read from
``--format csv/json`` or the files written (tables are for people and change layout)."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import ms_case, npy_files
from test_compare_report import parse as parse_html
from typer.testing import CliRunner

import dumpdb
from dumpdb.cli import app

REPO = Path(__file__).resolve().parents[1]
CRASHKIT = Path(__file__).with_name("crashkit.py")


def cli(*args: str, code: int = 0):
    result = CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code == code, (args, result.exit_code, result.output)
    return result


def csv_rows(text: str) -> list[dict]:
    return list(csv.DictReader(io.StringIO(text)))


def _env(**extra) -> dict:
    env = {**os.environ, **extra}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env.pop("DUMPDB_ARCHIVE", None)
    return env


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> Path:
    archive = tmp_path_factory.mktemp("features") / "a.dumpdb"
    for case, run in (("d1_compare_fp32_iter0", "fp32"), ("d2_compare_fp16_bf16_iter0", "fp16"),
                      ("c1_inputs_kernels_iter", "c1"), ("e1_nan_inf_overflow", "e1")):
        assert dumpdb.ingest(ms_case(case), archive=archive, run=run).ok
    return archive


# -- ingest ---------------------------------------------------------------------------
def test_layout_option_overrides_detection(tmp_path):
    archive = tmp_path / "a.dumpdb"
    cli("ingest", ms_case("c1_inputs_kernels_iter"), "-a", archive, "--layout", "mindspore-sync", "-q")
    assert dumpdb.open(archive).runs()["layout"].to_pylist() == ["mindspore-sync"]
    # a layout that does not fit the dump: exit 2, one line naming what is wrong
    wrong = CliRunner().invoke(app, ["ingest", str(ms_case("f_long_names")), "-a", str(tmp_path / "b.dumpdb"),
                                     "--layout", "msprobe", "-q"])
    # the dump is scanned before the archive is made: a refused dump leaves none (issue 30)
    assert wrong.exit_code == 2 and wrong.output.startswith("error: ") and wrong.output.count("\n") == 1
    assert "f_long_names" in wrong.output and not (tmp_path / "b.dumpdb").exists()
    bad = CliRunner().invoke(app, ["ingest", str(ms_case("f_long_names")), "-a", str(tmp_path / "b.dumpdb"),
                                   "--layout", "no-such-layout"])
    assert bad.exit_code == 2 and "no-such-layout" in bad.output


def test_sigint_exits_130_and_the_rerun_completes(tmp_path):
    """Ctrl-C (SIGINT right after a catalog commit midway, sent by the process to itself: no timing)."""
    archive = tmp_path / "a.dumpdb"
    src = ms_case("d2_compare_fp16_bf16_iter0")
    count = tmp_path / "events"
    args = [sys.executable, str(CRASHKIT), "-m", "dumpdb", "ingest", str(src), "-a", str(archive), "--run", "d2", "-q"]
    settings = "dumpdb.storage.store.PACK_BYTES=131072;dumpdb.ingestion.pipeline.COMMIT_SECONDS=0"
    probe_args = [*args[:5], str(src), "-a", str(tmp_path / "probe.dumpdb"), "--run", "d2", "-q"]
    probe = subprocess.run(probe_args,
                           env=_env(CRASHKIT_WATCH=str(tmp_path / "probe.dumpdb"), CRASHKIT_SET=settings,
                                    CRASHKIT_COUNT_FILE=str(count)), capture_output=True, text=True, timeout=300)
    assert probe.returncode == 0, probe.stderr
    kinds = count.read_text().split()[1:]
    commits = [i for i, k in enumerate(kinds, 1) if k == "commit-after"]
    middle_commit = commits[len(commits) // 2]  # after the archive's creation, before the last batch
    proc = subprocess.run(args, env=_env(CRASHKIT_WATCH=str(archive), CRASHKIT_SET=settings,
                                         CRASHKIT_KILL_AT=str(middle_commit), CRASHKIT_SIGNAL="INT"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 130, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    a = dumpdb.open(archive)
    assert a.runs()["status"].to_pylist() == ["interrupted"]
    kept = a.sql("SELECT count(*) AS n FROM tensors")["n"][0].as_py()
    assert 0 < kept < len(npy_files(src))
    # the interrupt is the process's; the run that completes it needs no process of its own
    cli("ingest", src, "-a", archive, "--run", "d2", "-q")
    assert dumpdb.open(archive).show("d2")["status"] == "complete"
    assert a.sql("SELECT count(*) AS n FROM tensors")["n"][0].as_py() == len(npy_files(src))


def test_default_archive_is_dumpdb_archive_in_the_working_directory(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "dumpdb", "ingest", str(ms_case("c1_inputs_kernels_iter")), "-q"],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert dumpdb.open(tmp_path / "dumpdb.archive").runs()["run"].to_pylist() == ["c1_inputs_kernels_iter"]


# -- sql --------------------------------------------------------------------------------
def test_sql_json_writes_nan_and_inf_as_strings(pair):
    out = cli("sql", "-a", pair, "-f", "json",
              "SELECT 'nan'::DOUBLE AS a, 'inf'::DOUBLE AS b, '-inf'::DOUBLE AS c, 1.5::DOUBLE AS d").stdout
    data = json.loads(out)  # strict JSON: a bare NaN/Infinity would not parse here ...
    rows = data if isinstance(data, list) else data["rows"]
    assert rows == [{"a": "nan", "b": "inf", "c": "-inf", "d": 1.5}]
    json.loads(out, parse_constant=lambda c: pytest.fail(f"bare {c} in JSON"))  # ... nor this way


def test_sql_max_rows(pair):
    query = "SELECT 'row' || i AS v FROM range(10) t(i) ORDER BY i"
    shown = cli("sql", "-a", pair, "--max-rows", "3", query).stdout
    assert all(f"row{i}" in shown for i in range(3)) and not any(f"row{i}" in shown for i in range(3, 10))
    every = cli("sql", "-a", pair, "--max-rows", "0", query).stdout
    assert all(f"row{i}" in every for i in range(10))


# -- scan ---------------------------------------------------------------------------------
def test_scan_cli_checks_list_and_html(pair, tmp_path):
    listed = subprocess.run([sys.executable, "-m", "dumpdb", "scan", "e1", "-a", str(pair), "--list"],
                            env=_env(COLUMNS="400"), capture_output=True, text=True, timeout=120).stdout
    for name in ("nan", "inf", "fp16_overflow", "all_zero", "tensor_too_large", "tensor_unchanged",
                 "tensor_change_above_threshold", "tensor_change_below_threshold"):
        assert name in listed
    html = tmp_path / "scan.html"
    out = subprocess.run([sys.executable, "-m", "dumpdb", "scan", "e1", "-a", str(pair), "-c", "nan", "-c", "inf",
                          "--html", str(html)], env=_env(COLUMNS="400"), capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stderr  # hits found (exit codes: README "Command line")
    out = out.stdout
    # e1 (README sample): first Inf in iteration 0, first NaN in iteration 1
    assert "inf" in out and "nan" in out
    text, parsed = parse_html(html)
    assert text.startswith("<!DOCTYPE html>") and parsed.counts.get("table", 0) >= 1
    hits = dumpdb.open(pair).scan("e1", ["nan", "inf"])
    got = {(r["check"], r["iteration"]) for r in hits.to_pylist()}
    assert ("inf", 0) in got and ("nan", 1) in got and ("nan", 0) not in got
    # the hits are real: every named tensor holds what the check says
    with dumpdb.open(pair) as a:
        for r in hits.to_pylist():
            x = a.tensor(r["tensor_id"])
            assert (x != x).any() if r["check"] == "nan" else (abs(x) == float("inf")).any()
    param = cli("scan", "c1", "-a", pair, "-c", "tensor_too_large:max_gt=1e30").stdout
    assert "no hits" in param


# -- compare ------------------------------------------------------------------------------
def test_first_divergence_api_matches_the_engine(pair):
    from dumpdb.compare.engine import compare

    a = dumpdb.open(pair)
    # msprobe's rules (the precision rules find no departure in this LeNet pair)
    fd = a.first_divergence("fp16", "fp32", rules="msprobe")
    assert isinstance(fd, dict) and fd
    engine = compare(a, "fp16", "fp32", store_results=False, rules="msprobe").first_divergence
    assert fd["pair_index"] == engine["pair_index"] and fd["target_name"] == engine["target_name"]
    assert fd["result"] == "error" and fd["target_tensor_id"] and fd["bench_tensor_id"]
    # fp16 against fp32: the first op failing msprobe's rules is a float16 tensor against float32
    t = a.sql("SELECT dtype, run FROM tensors WHERE tensor_id = ?", [fd["target_tensor_id"]]).to_pylist()[0]
    b = a.sql("SELECT dtype, run FROM tensors WHERE tensor_id = ?", [fd["bench_tensor_id"]]).to_pylist()[0]
    assert (t["run"], b["run"]) == ("fp16", "fp32") and "dtype" in fd["err_message"]
    assert a.first_divergence("fp32", "fp32", rules="msprobe") is None
    assert a.first_divergence("fp16", "fp32") is None  # default: no departure beyond float16 precision


def test_compare_iteration_selections_on_the_command_line(pair, tmp_path):
    out = tmp_path / "r.parquet"
    cli("compare", "c1:3", "c1:0", "-a", pair, "--parquet", out, "--no-store")
    t = pq.read_table(out).to_pylist()
    a = dumpdb.open(pair)
    its = {r["tensor_id"]: r["iteration"] for r in a.sql("SELECT tensor_id, iteration FROM tensors").to_pylist()}
    assert len(t) == 14 and {(its[r["target_tensor_id"]], its[r["bench_tensor_id"]]) for r in t} == {(3, 0)}


def test_compare_mapping_file(pair, tmp_path):
    """A CSV mapping target,bench pairs names nothing else would pair: c1's iteration 0 against
    itself with two op names swapped."""
    a = dumpdb.open(pair)
    names = sorted({r["op_name"] for r in a.sql("SELECT op_name FROM tensors WHERE run = 'c1' AND op_type = 'Conv2D'")
                    .to_pylist()})
    assert len(names) == 2
    mapping = tmp_path / "map.csv"
    mapping.write_text(f"target,bench\n{names[0]},{names[1]}\n{names[1]},{names[0]}\n")
    out = tmp_path / "r.parquet"
    cli("compare", "c1:0", "c1:0", "-a", pair, "--mapping", mapping, "--parquet", out, "--no-store")
    rows = pq.read_table(out).to_pylist()
    mapped = [(r["target_name"], r["bench_name"]) for r in rows if r["match_strategy"] == "mapping"]
    assert sorted(set(mapped)) == sorted({(names[0], names[1]), (names[1], names[0])})


def test_compare_threshold_option_changes_the_verdicts(pair, tmp_path):
    def errors(*thresholds: str) -> tuple[int, int]:
        out = tmp_path / "r.parquet"
        args = ["compare", "fp16", "fp32", "-a", pair, "--parquet", out, "--no-store"]
        for t in thresholds:
            args += ["-t", t]
        cli(*args)
        results = pq.read_table(out).column("result").to_pylist()
        return results.count("error"), len(results)

    default, n = errors()
    # strict: every output must have cosine >= 1.1 -> everything compared errs
    strict, _ = errors("cosine_error=1.1", "max_abs_err_error=-1", "cosine_error_max=1.1")
    lenient, _ = errors("cosine_error=-2", "max_abs_err_error=1e9", "cosine_error_max=-2", "max_abs_err_error_max=1e9")
    # dtype mismatches (float16 vs float32) err whatever the thresholds: lenient keeps those
    assert lenient <= default < strict <= n
    bad = CliRunner().invoke(app, ["compare", "fp16", "fp32", "-a", str(pair), "-t", "nonsense=1"])
    assert bad.exit_code == 2 and "nonsense" in bad.output


def test_a_payload_shared_by_both_sides_is_read_once(pair, monkeypatch):
    import dumpdb.compare.engine as engine

    reads = []
    real, real_many = engine._read, engine._read_many

    def counting(store, loc):
        reads.append(loc)
        return real(store, loc)

    def counting_many(store, locs):  # small pairs: one batch read of many payloads
        reads.extend(locs)
        return real_many(store, locs)

    monkeypatch.setattr(engine, "_read", counting)
    monkeypatch.setattr(engine, "_read_many", counting_many)
    out = engine.compare(dumpdb.open(pair), "c1", "c1", workers=1, store_results=False)
    pairs = out.results.num_rows
    assert pairs == 42 and all(r["max_abs_err"] == 0 for r in out.results.to_pylist())
    assert reads == []  # equal content hashes: metrics from the definitions, nothing read
    monkeypatch.setattr(engine, "_identical", lambda t, b: None)  # as when NaN/Inf counts are unknown
    out = engine.compare(dumpdb.open(pair), "c1", "c1", workers=1, store_results=False)
    assert all(r["max_abs_err"] == 0 for r in out.results.to_pylist())
    # every pair's two sides are one payload: one read per pair, not two
    assert 0 < len(reads) <= pairs


# -- archival on the command line ---------------------------------------------------------
def test_export_import_rename_and_verify_sample_on_the_command_line(pair, tmp_path):
    bundle = tmp_path / "c1.zip"
    cli("export", "c1", "-a", pair, "--to", bundle)
    other = tmp_path / "other.dumpdb"
    cli("import", bundle, "--archive", other)
    cli("import", bundle, "--archive", other)  # idempotent
    cli("import", bundle, "--archive", other, "--rename", "c1=c1-copy")
    a = dumpdb.open(other)
    assert sorted(a.runs()["run"].to_pylist()) == ["c1", "c1-copy"]
    counts = {r["run"]: r["n"] for r in a.sql("SELECT run, count(*) AS n FROM tensors GROUP BY run").to_pylist()}
    assert counts == {"c1": 42, "c1-copy": 42}
    with a:
        for row, array in a.tensors("SELECT tensor_id, source_file FROM tensors WHERE run = 'c1-copy'"):
            raw = (ms_case("c1_inputs_kernels_iter") / row["source_file"]).read_bytes()
            assert raw.endswith(array.tobytes())
    v = cli("verify", "c1-copy", "-a", other, "--sample", "0.5", "--seed", "3")
    assert "ok" in v.stdout
    full = a.verify("c1-copy")
    sampled = a.verify("c1-copy", sample=0.5, seed=3)
    assert sampled.ok and 0 < sampled.blobs_checked < full.blobs_checked
    assert math.isclose(sampled.blobs_checked / full.blobs_checked, 0.5, abs_tol=0.35)
