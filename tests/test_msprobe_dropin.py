"""dumpdb compare --csv against real msprobe 26.2.0 compare CSVs (tests/data/msprobe_oracle).

Each oracle case is a pair of real msprobe dumps (bf16-autocast target, fp32 bench) and the
CSV msprobe wrote for them. dumpdb ingests both, compares, and its CSV must equal msprobe's:
same header, same rows in the same order, every string cell identical, numbers within
display rounding; byte for byte where no dumpdb-computed float is involved (statistics and
md5 modes, and tensor mode on these pairs).

The byte-identity holds on any processor (issue 26, item 9): msprobe's ``EucDist`` is printed
with 17 significant digits and comes from OpenBLAS ``ddot``, whose summation order depends on
the kernel OpenBLAS picks for the CPU (``OPENBLAS_CORETYPE``); dumpdb does not call BLAS for
any metric but sums in one fixed order (``dumpdb.compare.kernel``, the order of the SSE2
``ddot`` that made these CSVs), so the CSV is the same bytes whatever BLAS kernel numpy would
use. We chose this over running msprobe live in the test because a live msprobe would itself
print the BLAS kernel's digits of the machine, so the comparison would need dumpdb to follow
that BLAS again, and the frozen CSVs stay the oracle. Checked with ``OPENBLAS_CORETYPE`` unset,
``Haswell``, ``Sandybridge`` and ``Prescott`` (before: only ``Prescott`` passed on an AVX2 CPU).
"""

from __future__ import annotations

import csv
import importlib.util
import json
import math
from pathlib import Path

import pytest

import dumpdb
from dumpdb.render.msprobe_csv import write_msprobe_csv

ORACLE = Path(__file__).parent / "data" / "msprobe_oracle"
REWRITE = Path(__file__).parent / "data" / "msprobe_rewrite"
CASES = ("tensor_L1", "statistics_L1", "md5_L1", "statistics_mix", "statistics_L0", "tensor_mix")


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    path = tmp_path_factory.mktemp("oracle") / "a.dumpdb"
    for case in CASES:
        for variant in ("fp32", "bf16"):
            report = dumpdb.ingest(ORACLE / case / variant / "dump", archive=path, run=f"{case}_{variant}")
            assert report.ok, report.errors
    assert dumpdb.ingest(ORACLE / "naninf_L1" / "dump", archive=path, run="naninf_L1").ok
    for case in ("handln", "none"):  # unequal op sequences (tests/data/msprobe_rewrite)
        assert dumpdb.ingest(REWRITE / case / "dump", archive=path, run=f"rewrite_{case}").ok
    return dumpdb.open(path)


def _oracle(case: str) -> Path:
    (found,) = (ORACLE / case).glob("compare_result_*.csv")
    return found


PAIRS = {case: (f"{case}_bf16", f"{case}_fp32") for case in CASES}
# The tensor_* (and msprobe_rewrite) dumps hold their payloads as .pt files: without PyTorch they ingest
# statistics-only and msprobe's tensor metrics (cosine, errors) have nothing to compare.
_NO_TORCH = importlib.util.find_spec("torch") is None
_NEEDS_TORCH = pytest.mark.skipif(_NO_TORCH, reason="the tensor_* cases' payloads are .pt files: reading them needs "
                                                    "PyTorch (pip install 'dumpdb[torch]'; .ci/run installs it)")


def _cases(names) -> list:
    """``names`` as parameters, the tensor_* ones skipped without PyTorch (naming why)."""
    return [pytest.param(n, marks=_NEEDS_TORCH) if n.startswith(("tensor_", "rewrite_")) else n for n in names]


# target with modules (mix) against a bench without them (L1): rows with no bench
PAIRS["unmatched_mix_vs_L1"] = ("statistics_mix_bf16", "statistics_L1_fp32")
# NaN and +-Inf statistics (edited dump.json) against the real fp32 run
PAIRS["naninf_L1"] = ("naninf_L1", "statistics_L1_fp32")
# unequal op sequences in tensor mode: a LayerNorm by hand shifts the call counters. msprobe
# matches backward calls by their backward call order; rows without a bench and tensors of
# other shapes get 'unsupported' / 'shape unmatched'; pairs dumpdb re-aligned get msprobe's
# name-matched metrics
PAIRS["rewrite_handln_L1"] = ("rewrite_handln", "rewrite_none")


def _ours(archive, case: str, tmp_path: Path) -> Path:
    results = archive.compare(*PAIRS[case])
    return write_msprobe_csv(results, tmp_path / f"{case}.csv", archive=archive)


def _number(cell: str) -> float | None:
    try:
        return float(cell)
    except ValueError:
        return None


@pytest.mark.parametrize("case", _cases(PAIRS))
def test_csv_equals_msprobe_cell_by_cell(archive, case, tmp_path):
    ours = list(csv.reader(open(_ours(archive, case, tmp_path), newline="", encoding="utf-8")))
    theirs = list(csv.reader(open(_oracle(case), newline="", encoding="utf-8")))
    assert ours[0] == theirs[0]  # header: msprobe's columns in msprobe's order, nothing extra
    assert [r[0] for r in ours] == [r[0] for r in theirs]  # every dump.json entry, msprobe's order
    header = theirs[0]
    for mine, ref in zip(ours[1:], theirs[1:]):
        assert len(mine) == len(ref)
        for col, a, b in zip(header, mine, ref):
            x, y = _number(a), _number(b)
            if x is not None and y is not None and not (math.isnan(x) or math.isnan(y)):
                assert x == pytest.approx(y, rel=1e-6, abs=1e-9), (ref[0], col, a, b)
            else:
                assert a == b, (ref[0], col, a, b)


@pytest.mark.parametrize("case", _cases(PAIRS))
def test_csv_byte_identical(archive, case, tmp_path):
    # statistics and md5 cells come from dump.json; tensor metrics are dumpdb's, formatted
    # like msprobe's (12-decimal rounding) so they agree to the byte on these pairs too
    assert _ours(archive, case, tmp_path).read_bytes() == _oracle(case).read_bytes()


def test_non_tensor_and_none_rows_are_msprobe_tokens(archive, tmp_path):
    rows = {r["NPU Name"]: r for r in csv.DictReader(open(_ours(archive, "tensor_L1", tmp_path), newline=""))}
    alpha = rows["Tensor.add_.0.forward.input.alpha"]
    assert (alpha["NPU Dtype"], alpha["Cosine"], alpha["NPU max"]) == ("<class 'float'>", "unsupported", "-0.1")
    none_grad = rows["Functional.conv2d.0.backward.output.0"]
    assert (none_grad["NPU Dtype"], none_grad["NPU max"], none_grad["Data_name"]) == ("N/A", "None", "['-1', '-1']")
    first = rows["Functional.conv2d.0.forward.input.0"]
    assert first["NPU_Stack_Info"].startswith("['File ") and first["Err_message"] == "[]"


# -- execution order of msprobe runs (dump.json order) ------------------------------------
def _dump_json(case: str, variant: str) -> dict:
    (path,) = (ORACLE / case / variant / "dump").glob("step0/*/dump.json")
    return json.loads(path.read_text())["data"]


def test_execution_order_is_dump_json_order(archive):
    keys = list(_dump_json("statistics_mix", "bf16"))
    got = archive.sql("SELECT scope_name FROM execution_order WHERE run = 'statistics_mix_bf16' ORDER BY position")
    assert got["scope_name"].to_pylist() == keys


def test_first_divergence_names_op_position_source_and_module_path(archive):
    fd = archive.first_divergence("statistics_mix_bf16", "statistics_mix_fp32", rules="msprobe")
    # msprobe's rules: autocast makes conv2d's output bfloat16, a dtype error at the first op of the step
    assert (fd["target_name"], fd["position"], fd["io"]) == ("Functional.conv2d.0.forward", 0, "output")
    assert fd["code_file"].endswith("_worker.py") and fd["code_line"] == 19
    assert "self.conv(x)" in fd["code_text"]
    node = archive.sql("SELECT node FROM ops WHERE run = 'statistics_mix_bf16' "
                       "AND scope_name = 'Functional.linear.0.forward'")["node"].to_pylist()
    assert node == ["Module.mlp.Sequential.forward.0/Module.mlp.0.Linear.forward.0/Functional.linear.0.forward"]


# -- compare DIR DIR: one step, like msprobe -----------------------------------------------
def test_compare_two_msprobe_dump_dirs_writes_msprobe_csv(tmp_path):
    from typer.testing import CliRunner

    from dumpdb.cli import app

    case = ORACLE / "statistics_L1"
    out = tmp_path / "result.csv"
    res = CliRunner().invoke(app, ["compare", str(case / "bf16" / "dump"), str(case / "fp32" / "dump"),
                                   "--csv", str(out), "--show", "0"], env={"COLUMNS": "200", "DUMPDB_ARCHIVE": None})
    assert res.exit_code == 0, res.output
    assert "target-dump iteration 0 vs bench-dump iteration 0" in res.output and "pairs" in res.output
    assert out.read_bytes() == _oracle("statistics_L1").read_bytes()


def test_compare_two_mindspore_dump_dirs_into_a_kept_archive(tmp_path):
    from typer.testing import CliRunner

    from dumpdb.cli import app

    ms = Path(__file__).parent / "data" / "mindspore"
    res = CliRunner().invoke(app, ["compare", str(ms / "d2_compare_fp16_bf16_iter0"), str(ms / "d1_compare_fp32_iter0"),
                                   "--archive", str(tmp_path / "kept"), "--show", "0"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "d2_compare_fp16_bf16_iter0 iteration 0 vs d1_compare_fp32_iter0 iteration 0 (tensor): 66 pairs" in res.output
    kept = dumpdb.open(tmp_path / "kept")
    assert sorted(kept.sql("SELECT run FROM runs")["run"].to_pylist()) == ["d1_compare_fp32_iter0",
                                                                          "d2_compare_fp16_bf16_iter0"]
    assert kept.sql("SELECT count(*) AS n FROM compares")["n"].to_pylist() == [1]


def test_two_ranks_one_csv_per_rank_like_msprobe(tmp_path):
    gloo = Path(__file__).parent / "data" / "msprobe" / "statistics_mix_2rank_gloo" / "dump"
    assert dumpdb.ingest(gloo, archive=tmp_path / "a", run="gloo").ok
    a = dumpdb.open(tmp_path / "a")
    results = a.compare("gloo:1", "gloo:0")  # step 1 against step 0, rank by rank
    write_msprobe_csv(results, tmp_path / "out" / "compare_result.csv", archive=a)
    assert not (tmp_path / "out" / "compare_result.csv").exists()
    for rank in (0, 1):
        (theirs,) = (ORACLE / "gloo_2rank_step1_vs_step0").glob(f"compare_result_rank{rank}_*.csv")
        ours = tmp_path / "out" / f"compare_result_rank{rank}.csv"
        assert ours.read_bytes() == theirs.read_bytes()


@_NEEDS_TORCH
def test_two_ranks_tensor_mode_each_rank_has_its_own_metrics(tmp_path):
    """Tensor mode, 2 ranks: each rank's CSV carries that rank's metrics (they were keyed by
    msprobe's tensor name alone, so rank 0's file had rank 1's metrics)."""
    gloo = Path(__file__).parent / "data" / "msprobe" / "tensor_L1_2rank_gloo" / "dump"
    assert dumpdb.ingest(gloo, archive=tmp_path / "a", run="gloo").ok
    a = dumpdb.open(tmp_path / "a")
    results = a.compare("gloo:1", "gloo:0")
    write_msprobe_csv(results, tmp_path / "out" / "compare_result.csv", archive=a)
    for rank in (0, 1):
        (theirs,) = (ORACLE / "tensor_2rank_step1_vs_step0").glob(f"compare_result_rank{rank}_*.csv")
        ours = list(csv.reader(open(tmp_path / "out" / f"compare_result_rank{rank}.csv", newline="")))
        ref = list(csv.reader(open(theirs, newline="")))
        assert len(ours) == len(ref)
        for mine, want in zip(ours, ref):
            for a_, b_ in zip(mine, want):
                x, y = _number(a_), _number(b_)
                if x is not None and y is not None and not (math.isnan(x) or math.isnan(y)):
                    assert x == pytest.approx(y, rel=1e-6, abs=1e-9), (rank, want[0], a_, b_)
                else:
                    assert a_ == b_, (rank, want[0], a_, b_)


@pytest.mark.parametrize("case", _cases(("statistics_L1", "tensor_L1")))
def test_fallback_writer_has_msprobe_header_and_line_ends(archive, case, tmp_path):
    # without the archive (other layouts, or runs ingested before msprobe_records) the
    # writer works from the results alone: same header and "\n" line ends as msprobe's
    out = write_msprobe_csv(archive.compare(*PAIRS[case]), tmp_path / "r.csv")
    ours, theirs = out.read_bytes(), _oracle(case).read_bytes()
    assert ours.split(b"\n", 1)[0] == theirs.split(b"\n", 1)[0]
    assert b"\r\n" not in ours


def test_records_travel_in_bundles(archive, tmp_path):
    bundle = archive.export(["md5_L1_bf16", "md5_L1_fp32"], tmp_path / "md5.zip")
    other = tmp_path / "other.dumpdb"
    dumpdb.ingest(ORACLE / "statistics_L0" / "fp32" / "dump", archive=other, run="unrelated")  # an existing archive
    dumpdb.open(other).import_bundle(bundle)
    b = dumpdb.open(other)
    out = write_msprobe_csv(b.compare("md5_L1_bf16", "md5_L1_fp32"), tmp_path / "r.csv", archive=b)
    assert out.read_bytes() == _oracle("md5_L1").read_bytes()
    b.remove_run("md5_L1_bf16")
    left = b.sql("SELECT DISTINCT run FROM msprobe_records ORDER BY run")["run"].to_pylist()
    assert left == ["md5_L1_fp32", "unrelated"]


def test_compare_two_step_dirs_of_a_2rank_run_like_msprobe_cli(tmp_path):
    # msprobe compare -tp dump/step1 -gp dump/step0: one CSV per rank, step against step
    from typer.testing import CliRunner

    from dumpdb.cli import app

    gloo = Path(__file__).parent / "data" / "msprobe" / "statistics_mix_2rank_gloo" / "dump"
    out = tmp_path / "compare_result.csv"
    res = CliRunner().invoke(app, ["compare", str(gloo / "step1"), str(gloo / "step0"), "--csv", str(out),
                                   "--show", "0"], env={"COLUMNS": "200", "DUMPDB_ARCHIVE": None})
    assert res.exit_code == 0, res.output
    assert "step1 iteration 1 vs step0 iteration 0" in res.output
    for rank in (0, 1):
        (theirs,) = (ORACLE / "gloo_2rank_step1_vs_step0").glob(f"compare_result_rank{rank}_*.csv")
        assert (tmp_path / f"compare_result_rank{rank}.csv").read_bytes() == theirs.read_bytes()
