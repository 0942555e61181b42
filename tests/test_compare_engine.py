"""Run-to-run comparison end to end on real dumps: d2 (fc2 in fp16, fc1 output through
bf16, extra Cast/Assign ops) against the fp32 baseline d1, same seed, iteration 0."""

from __future__ import annotations

import csv

import numpy as np
import pytest
from conftest import ms_case, npy_files, record_pools
from test_compare_report import assert_self_contained
from test_compare_report import parse as parse_html
from typer.testing import CliRunner

import dumpdb
from dumpdb.cli import app
from dumpdb.compare.engine import Selection, compare
from dumpdb.render.msprobe_csv import msprobe_columns


@pytest.fixture(scope="module")
def outcome(pair_archive):
    return compare(dumpdb.open(pair_archive), "fp16", "fp32", rules="msprobe")


def _names(case):
    return {p.name.split(".")[1] for p in npy_files(ms_case(case))}


def test_pairs_unmatched_and_order(outcome):
    d1, d2 = _names("d1_compare_fp32_iter0"), _names("d2_compare_fp16_bf16_iter0")
    r = outcome.results
    assert r.num_rows == outcome.summary["pairs"] > 0
    # every pair joins real tensors of both runs, one to one
    assert len(set(r["target_tensor_id"].to_pylist())) == r.num_rows
    assert len(set(r["bench_tensor_id"].to_pylist())) == r.num_rows
    unmatched = outcome.unmatched.to_pylist()
    extra = {u["name"] for u in unmatched if u["side"] == "bench"} | {u["name"] for u in unmatched if u["side"] == "target"}
    # the ops only d2 has (Cast/Assign inserted around fp16 kernels) are listed, not dropped
    only_d2 = {n for n in d2 - d1}
    assert only_d2 and only_d2 <= extra
    assert all(("Cast" in n or "Assign" in n) for n in only_d2)
    assert r["pair_index"].to_pylist() == list(range(r.num_rows))


def test_metrics_are_real(outcome, pair_archive):
    a = dumpdb.open(pair_archive)
    rows = outcome.results.to_pylist()
    same = [x for x in rows if x["mode"] == "tensor" and x["max_abs_err"] == 0.0]
    diff = [x for x in rows if x["mode"] == "tensor" and (x["max_abs_err"] or 0) > 0]
    assert same and diff
    for x in diff[:5]:
        t = a.tensor(x["target_tensor_id"]).astype(np.float64).ravel()
        b = a.tensor(x["bench_tensor_id"]).astype(np.float64).ravel()
        assert x["max_abs_err"] == pytest.approx(np.max(np.abs(t - b)), rel=1e-9)
        cos = t @ b / (np.linalg.norm(t) * np.linalg.norm(b))
        assert x["cosine"] == pytest.approx(cos, abs=1e-6)


def test_first_divergence_is_the_first_failing_output_in_execution_order(outcome):
    fd = outcome.first_divergence
    rows = outcome.results.to_pylist()
    failing = [x for x in rows if x["result"] == "error" and x["io"] == "output"]
    assert fd is not None and failing
    assert fd["pair_index"] == min(x["pair_index"] for x in failing)
    assert fd["scope_name"]
    # everything compared before it in that iteration did not fail
    assert all(x["result"] != "error" for x in rows if x["pair_index"] < fd["pair_index"] and x["io"] == "output")
    assert fd["path"] == list(dict.fromkeys(x["target_name"] for x in rows if x["pair_index"] < fd["pair_index"]))[-10:]


def test_first_difference_is_the_first_shared_tensor_that_differs(outcome, pair_archive):
    diff = outcome.summary["first_difference"]
    rows = outcome.results.to_pylist()
    assert diff is not None
    a = dumpdb.open(pair_archive)
    first = rows[diff["pair_index"]]
    t, b = a.tensor(first["target_tensor_id"]), a.tensor(first["bench_tensor_id"])
    assert t.dtype != b.dtype or t.shape != b.shape or t.tobytes() != b.tobytes()
    for x in rows[: diff["pair_index"]]:  # everything before it is bit-identical
        assert a.tensor(x["target_tensor_id"]).tobytes() == a.tensor(x["bench_tensor_id"]).tobytes()


def test_results_are_stored_and_joinable(outcome, pair_archive):
    a = dumpdb.open(pair_archive)
    cid = outcome.compare_id
    assert a.sql("SELECT pairs FROM compares WHERE compare_id = ?", [cid])["pairs"][0].as_py() == outcome.results.num_rows
    joined = a.sql("""SELECT count(*) AS n FROM compare_results c JOIN tensors t ON t.tensor_id = c.target_tensor_id
                      WHERE c.compare_id = ? AND t.run = 'fp16'""", [cid])
    assert joined["n"][0].as_py() == outcome.results.num_rows
    n_unmatched = a.sql("SELECT count(*) AS n FROM compare_unmatched WHERE compare_id = ?", [cid])["n"][0].as_py()
    assert n_unmatched == outcome.unmatched.num_rows


def test_statistics_mode_and_selection_errors(pair_archive):
    a = dumpdb.open(pair_archive)
    stats = compare(a, "fp16:0", "fp32:0", mode="statistics", store_results=False)
    assert set(stats.results["mode"].to_pylist()) == {"statistics"}
    assert stats.results["cosine"].null_count == stats.results.num_rows
    assert stats.results["max_diff"].null_count < stats.results.num_rows
    with pytest.raises(dumpdb.DumpdbError, match="no run 'nope'"):
        compare(a, "nope", "fp32")
    with pytest.raises(dumpdb.DumpdbError, match="no tensors in fp16 iteration 9"):
        compare(a, "fp16:9", "fp32")
    with pytest.raises(dumpdb.DumpdbError, match="bad selection"):
        Selection.parse("fp16:x")


def test_cli_compare_writes_csv_parquet_html(pair_archive, tmp_path):
    csv_path, html_path, pq_path = tmp_path / "r.csv", tmp_path / "r.html", tmp_path / "r.parquet"
    result = CliRunner().invoke(app, ["compare", "fp16", "fp32", "-a", str(pair_archive), "--csv", str(csv_path),
                                      "--html", str(html_path), "--parquet", str(pq_path)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "no departure beyond" in result.output and "unmatched" in result.output
    with open(csv_path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader)
        body = list(reader)
    assert tuple(header) == msprobe_columns(statistics=False)
    assert body and body[0][0].endswith((".output.0", ".input.0"))
    page, parsed = parse_html(html_path)  # every element closed in order, one html/body
    assert_self_contained(page, parsed)
    # plots, and the pair table (a datatable filled from its JSON; no static <table> when nothing departs)
    assert parsed.counts.get("svg", 0) >= 1 and any(d.get("id") == "pairs" for d in parsed.datatables)
    assert "<svg" in page and "http://cdn" not in page and "<script src" not in page
    import pyarrow.parquet as pq
    assert pq.read_table(pq_path).num_rows == len(body)
    fd = CliRunner().invoke(app, ["first-divergence", "fp16", "fp32", "-a", str(pair_archive), "--rules", "msprobe"])
    assert fd.exit_code == 1 and "first divergence" in fd.output and "source" in fd.output
    # precision-aware rules (default): fc2 in float16 and fc1 through bfloat16 is rounding, not a departure
    fd = CliRunner().invoke(app, ["first-divergence", "fp16", "fp32", "-a", str(pair_archive)])
    assert fd.exit_code == 0 and "no departure beyond float16 precision" in fd.output, fd.output


def test_same_run_compares_clean(pair_archive):
    same = compare(dumpdb.open(pair_archive), "fp32", "fp32", store_results=False)
    assert same.first_divergence is None and same.unmatched.num_rows == 0
    assert set(same.results["result"].to_pylist()) == {"pass"}


def _tiny_dump(root, arrays):
    it = root / "rank_0" / "Net" / "0" / "0"
    it.mkdir(parents=True)
    for i, (name, a) in enumerate(arrays.items()):
        np.save(it / f"Op.{name}.0.0.{1000 + i}.output.0.DefaultFormat.npy", a)


def test_first_difference_sees_bit_differences_msprobe_metrics_ignore(tmp_path):
    """+inf vs -inf at the same position passes msprobe's rules, and a shape change with the
    same bytes must not be hidden by the shared-payload shortcut (review findings)."""
    _tiny_dump(tmp_path / "a", {"x-op0": np.array([1, 2, np.inf, 4], np.float32),
                                "y-op0": np.arange(6, dtype=np.float32).reshape(2, 3)})
    _tiny_dump(tmp_path / "b", {"x-op0": np.array([1, 2, -np.inf, 4], np.float32),
                                "y-op0": np.arange(6, dtype=np.float32).reshape(3, 2)})
    archive = tmp_path / "a.dumpdb"
    dumpdb.ingest(tmp_path / "a", archive=archive, run="a")
    dumpdb.ingest(tmp_path / "b", archive=archive, run="b")
    out = compare(dumpdb.open(archive), "a", "b", store_results=False)
    rows = {r["target_name"]: r for r in out.results.to_pylist()}
    assert out.summary["first_difference"]["target_name"] == "x-op0"
    assert rows["y-op0"]["cosine"] is None and "shape" in rows["y-op0"]["err_message"]


def test_repeated_op_calls_are_judged_and_ordered_separately(tmp_path):
    """Real TensorDump case: 'x' is dumped by calls 0 and 4. Changing only call 4 must not make
    the bit-identical call 0 fail, and pairs follow the call order (review finding)."""
    import shutil

    from conftest import DATA

    src = DATA / "tensordump" / "j_tensordump_pynative"
    changed = tmp_path / "changed"
    shutil.copytree(src, changed)
    x4 = changed / "x_float32_4.npy"
    np.save(x4, np.load(x4) * 3 + 1)
    archive = tmp_path / "a.dumpdb"
    dumpdb.ingest(changed, archive=archive, run="changed")
    dumpdb.ingest(src, archive=archive, run="orig")
    out = compare(dumpdb.open(archive), "changed", "orig", store_results=False)
    rows = out.results.to_pylist()
    assert [r["call_index"] for r in rows] == sorted(r["call_index"] for r in rows)
    by_call = {r["call_index"]: r for r in rows if r["target_name"] == "x"}
    assert by_call[0]["result"] == "pass" and by_call[0]["max_abs_err"] == 0
    assert by_call[4]["max_abs_err"] > 0
    assert out.summary["first_difference"]["pair_index"] == by_call[4]["pair_index"]


def test_process_pool_path_gives_the_thread_path_results(pair_archive, monkeypatch):
    """Worker processes (taken for comparisons >= PROCESS_MIN_BYTES; forced here with a tiny
    threshold) compute exactly what the in-process thread computes."""
    import dumpdb.compare.engine as engine

    monkeypatch.setattr(engine, "SMALL_ELEMENTS", 0)  # every pair one by one (no batched path)
    a = dumpdb.open(pair_archive)
    one = compare(a, "fp16", "fp32", workers=1, store_results=False).results
    monkeypatch.setattr(engine, "PROCESS_MIN_BYTES", 1)
    import concurrent.futures  # the engine imports ProcessPoolExecutor from it when it starts one

    started = record_pools(monkeypatch, concurrent.futures, "ProcessPoolExecutor")
    many = compare(a, "fp16", "fp32", workers=2, store_results=False).results
    assert started == [2]  # the process pool really ran
    metrics = [c for c in ("cosine", "euc_dist", "max_abs_err", "max_rel_err", "one_thousandth_err_ratio",
                           "mean_abs_err", "rmse", "kl_divergence", "result", "err_message", "mode")]
    assert one.num_rows == many.num_rows > 50
    assert [repr(v) for c in metrics for v in many.column(c).to_pylist()] == \
        [repr(v) for c in metrics for v in one.column(c).to_pylist()]
    assert sum(m == "tensor" for m in many.column("mode").to_pylist()) > 50
