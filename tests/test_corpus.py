"""Acceptance over the full real corpus (shared/corpus/mindspore-cpu), when it is beside
the repository as in CI. The same features are tested on tests/data without it; this
module checks every real case end to end through the CLI."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import file_count, npy_payload
from typer.testing import CliRunner

import dumpdb
from dumpdb.cli import app

CORPUS = Path(os.environ.get("DUMPDB_CORPUS", Path(__file__).resolve().parents[2] / "shared" / "corpus"))
MS = CORPUS / "mindspore-cpu"
CASES = sorted(p.name for p in MS.iterdir() if p.is_dir() and not p.name.startswith("_")
               and p.name != "j_tensordump_pynative") if MS.is_dir() else []

pytestmark = pytest.mark.skipif(not CASES, reason=f"real corpus not found at {MS} (set DUMPDB_CORPUS)")


@pytest.fixture(scope="module")
def corpus_archive(tmp_path_factory):
    archive = tmp_path_factory.mktemp("corpus") / "corpus.dumpdb"
    runner = CliRunner()
    for case in CASES:
        result = runner.invoke(app, ["ingest", str(MS / case), "--archive", str(archive), "--run", case, "-q"])
        assert result.exit_code == 0, (case, result.output)
    return archive


@pytest.mark.parametrize("case", CASES)
def test_case_ingests_every_file_bit_exact(corpus_archive, case):
    root = MS / case
    files = sorted(root.rglob("*.npy"))
    a = dumpdb.open(corpus_archive)
    n = a.sql("SELECT count(*) AS n FROM tensors WHERE run = ?", [case])["n"][0].as_py()
    assert n == len(files)
    with a:
        for row, array in a.tensors("SELECT tensor_id, source_file FROM tensors WHERE run = ?", [case]):
            descr, shape, payload = npy_payload(root / row["source_file"])
            assert array.shape == shape and np.ascontiguousarray(array).tobytes() == payload


def test_a_tensor_all_is_few_files_and_idempotent(tmp_path):
    archive = tmp_path / "a.dumpdb"
    first = dumpdb.ingest(MS / "a_tensor_all", archive=archive, run="a")
    assert first.ok and first.tensors_added == 641
    files = file_count(archive)
    assert files < 100
    again = dumpdb.ingest(MS / "a_tensor_all", archive=archive, run="a")
    assert again.tensors_added == 0 and file_count(archive) == files
    info = dumpdb.open(archive).show("a")
    assert info["graphs"] == [0, 1] and info["iterations"] == [0, 1, 2, 3]
    assert dumpdb.open(archive).sql("SELECT count(*) AS n FROM tensors WHERE scope_name IS NULL")["n"][0].as_py() == 0


def test_compare_d2_against_d1_names_the_difference_and_unmatched_casts(corpus_archive, tmp_path):
    """Issue 4 acceptance on the full real cases: fc2 in fp16 and fc1 through bf16 (d2)
    against the fp32 baseline (d1), compared in a copy of the module's corpus archive (the
    compare stores its results there; the other runs in it are no part of the pair)."""
    archive = tmp_path / "cmp.dumpdb"
    shutil.copytree(corpus_archive, archive)
    html = tmp_path / "report.html"
    result = CliRunner().invoke(app, ["compare", "d2_compare_fp16_bf16", "d1_compare_fp32", "-a", str(archive),
                                      "--html", str(html), "--show", "0"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    # precision-aware rules (default): fc2 in float16, fc1 through bfloat16 is rounding, not a departure
    assert "first difference" in result.output and "no departure beyond" in result.output
    msprobe = CliRunner().invoke(app, ["compare", "d2_compare_fp16_bf16", "d1_compare_fp32", "-a", str(archive),
                                       "--show", "0", "--no-store", "--rules", "msprobe"], catch_exceptions=False)
    assert msprobe.exit_code == 0 and "first divergence" in msprobe.output
    from dumpdb.compare.engine import compare

    outcome = compare(dumpdb.open(archive), "d2_compare_fp16_bf16", "d1_compare_fp32", store_results=False)
    only_d2 = {p.name.split(".")[1] for p in (MS / "d2_compare_fp16_bf16").rglob("*.npy")} - \
              {p.name.split(".")[1] for p in (MS / "d1_compare_fp32").rglob("*.npy")}
    unmatched = {u["name"] for u in outcome.unmatched.to_pylist() if u["side"] == "target"}
    assert only_d2 and only_d2 <= unmatched
    assert all("Cast" in n or "Assign" in n for n in only_d2)
    diff = outcome.summary["first_difference"]
    assert diff is not None and diff["target_name"] in result.output
    page = html.read_text()
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page and diff["target_name"] in page


def test_export_real_run_to_zip_import_verify_bit_exact(corpus_archive, tmp_path):
    """Issue 5 acceptance: a real corpus run to .zip, into a fresh archive, verify clean, bit-exact
    (exported from the module's corpus archive, which holds it as run a_tensor_all)."""
    src = MS / "a_tensor_all"
    bundle = dumpdb.open(corpus_archive).export("a_tensor_all", tmp_path / "a.zip")
    fresh = tmp_path / "fresh.dumpdb"
    result = CliRunner().invoke(app, ["import", str(bundle), "-a", str(fresh)])
    assert result.exit_code == 0, result.output
    b = dumpdb.open(fresh)
    assert b.verify().ok
    with b:
        rows = list(b.tensors("SELECT tensor_id, source_file FROM tensors"))
    assert len(rows) == 641
    for row, array in rows:
        assert np.ascontiguousarray(array).tobytes() == npy_payload(src / row["source_file"])[2]
