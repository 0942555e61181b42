"""The compare engine's fast paths (issue 13): small pairs batched through
``metrics.tensor_metrics_batch`` and identical payloads short-cut from the definitions
(``metrics.identical_metrics``) give what ``metrics.tensor_metrics`` computes pair by pair."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import dumpdb
import dumpdb.compare.engine as engine
from dumpdb.compare.engine import compare
from dumpdb.compare.metrics import (
    MSG_NAN_INF_ZEROED,
    TENSOR_METRICS,
    identical_metrics,
    tensor_metrics,
    tensor_metrics_batch,
)
from dumpdb.storage.store import TensorStore


def _same(a, b) -> bool:
    """Bit for bit (NaN never reaches a result: it becomes None)."""
    return repr(a) == repr(b)


def _pairs(seed: int):
    """Small pairs of every supported dtype, with zeros, constant tensors, bench zeros,
    NaN/Inf at shared and at different positions, mixed dtypes, shape mismatches."""
    rng = np.random.default_rng(seed)
    dtypes = [np.float32, np.float16, np.float64, ml_dtypes.bfloat16, np.int32, np.int8, np.uint8, np.bool_]
    targets, benches = [], []
    for k in range(600):
        n = int(rng.integers(1, 300))
        x = rng.standard_normal(n) * 10 ** rng.uniform(-3, 3)
        y = x * (1 + 1e-3 * rng.standard_normal(n))
        if k % 7 == 0:
            x[: n // 2] = 0
        if k % 9 == 0:
            y[:] = 0
        if k % 11 == 0:
            x[:] = y[:] = 0
        if k % 13 == 0:
            x[0] = y[0] = np.nan
        if k % 17 == 0:
            x[-1] = np.inf
        if k % 19 == 0:
            x[:] = 2.5
        dt = dtypes[k % len(dtypes)]
        with np.errstate(invalid="ignore", over="ignore"):
            t = x.astype(dt)
            b = y.astype(dt if k % 5 else np.float32)
        if k % 23 == 0 and n % 2 == 0:
            t = t.reshape(2, -1)
        if k % 29 == 0:
            b = b[: max(1, n - 1)]
        targets.append(t)
        benches.append(b)
    return targets, benches


@pytest.mark.parametrize("seed", [0, 1])
def test_batch_equals_one_by_one(seed):
    targets, benches = _pairs(seed)
    batched = tensor_metrics_batch(targets, benches)
    for k, (t, b) in enumerate(zip(targets, benches)):
        metrics, message = tensor_metrics(t, b)
        got, got_message = batched[k]
        assert got_message == message, (k, t.dtype, b.dtype)
        bad = [name for name in TENSOR_METRICS if not _same(got[name], metrics[name])]
        assert not bad, (k, t.dtype, b.dtype, {n: (got[n], metrics[n]) for n in bad})


def test_batch_all_zero_cosine_follows_msprobe():
    """msprobe alg_cosine_similarity: both sides all zero -> 1.0; one side -> None + message."""
    zero, one = np.zeros(8, np.float32), np.ones(8, np.float32)
    (both, m1), (tz, m2), (bz, m3) = tensor_metrics_batch([zero, zero, one], [zero, one, zero])
    assert both["cosine"] == 1.0 and m1 is None
    assert tz["cosine"] is None and "target is all zero" in m2
    assert bz["cosine"] is None and "bench is all zero" in m3


@pytest.mark.parametrize("array", [
    np.arange(12, dtype=np.float32).reshape(3, 4) - 5,
    np.zeros(16, np.float16),                       # msprobe: both norms 0 -> cosine 1
    np.array([1.0, np.nan, -np.inf, 4.0], np.float32),
    np.array([3.0], np.float64),                    # one element: no cosine
    np.array(2.0, np.float32),                      # 0-d: no cosine, euc_dist, ratios
    np.array([0, 1, 1, 0], np.bool_),
    np.arange(10, dtype=np.int64),
    (np.arange(64, dtype=np.float32) / 7).astype(ml_dtypes.bfloat16),
    np.zeros((0, 3), np.float32),
])
def test_identical_metrics_are_the_computed_ones(array):
    nonfinite = int(np.count_nonzero(~np.isfinite(array.astype(np.float64))))
    got, message = identical_metrics(array.shape, array.dtype, nonfinite)
    want, want_message = tensor_metrics(array, array.copy())
    assert message == want_message
    for name in TENSOR_METRICS:
        if name == "cosine" and want[name] is not None:
            assert got[name] == 1.0 and want[name] == pytest.approx(1.0, abs=1e-15)
        else:
            assert got[name] == want[name], name


def test_identical_metrics_leaves_a_nonfinite_scalar_to_the_computation():
    assert identical_metrics((), np.dtype(np.float32), 1) is None
    assert "NaN" in tensor_metrics(np.array(np.nan), np.array(np.nan))[1]



def test_engine_batched_results_equal_one_by_one(pair_archive, monkeypatch):
    """Real dumps (fp16/bf16 vs fp32): the default engine batches small pairs; with
    SMALL_ELEMENTS 0 every pair goes through tensor_metrics alone. The same rows, bit for bit."""
    calls = []
    real = engine.tensor_metrics_batch

    def recording(targets, benches):
        calls.append(len(targets))
        return real(targets, benches)

    monkeypatch.setattr(engine, "tensor_metrics_batch", recording)
    a = dumpdb.open(pair_archive)
    fast = compare(a, "fp16", "fp32", store_results=False).results.to_pylist()
    assert sum(calls) >= 20  # the batched path really ran
    monkeypatch.setattr(engine, "SMALL_ELEMENTS", 0)
    calls.clear()
    slow = compare(a, "fp16", "fp32", store_results=False).results.to_pylist()
    assert sum(calls) == 0
    assert len(fast) == len(slow) > 50
    for f, s in zip(fast, slow):
        for key in ("target_tensor_id", "bench_tensor_id", "mode", "result", "precision_result", "err_message"):
            assert f[key] == s[key], (key, f["target_name"])
        for name in TENSOR_METRICS:
            assert _same(f[name], s[name]), (name, f["target_name"], f[name], s[name])


def test_engine_short_cuts_identical_payloads_without_reading(pair_archive, monkeypatch):
    """fp32 against itself: every pair has equal content hashes, so no payload is read,
    and the metrics are the definitions' (cosine 1, errors 0, ratios 1)."""
    def no_read(*args, **kwargs):
        raise AssertionError("a payload was read")

    a = dumpdb.open(pair_archive)
    computed = {r["target_tensor_id"]: r for r in compare(a, "fp32", "fp32", store_results=False,
                                                          mode="tensor").results.to_pylist()}
    monkeypatch.setattr(TensorStore, "read", no_read)
    rows = compare(a, "fp32", "fp32", store_results=False, mode="tensor").results.to_pylist()
    assert len(rows) > 50 and {r["mode"] for r in rows} == {"tensor"}
    for r in rows:
        assert r["max_abs_err"] == 0 and r["euc_dist"] in (0.0, None) and r["kl_divergence"] == 0.0
        assert r["cosine"] in (1.0, None)
        assert r["err_message"] == computed[r["target_tensor_id"]]["err_message"]
    assert any(r["cosine"] == 1.0 for r in rows)


def test_engine_short_cut_notes_shared_nan_inf(tmp_path):
    it = tmp_path / "d" / "rank_0" / "Net" / "0" / "0"
    it.mkdir(parents=True)
    np.save(it / "Op.x-op0.0.0.1000.output.0.DefaultFormat.npy", np.array([1, np.nan, 3, np.inf], np.float32))
    archive = tmp_path / "a.dumpdb"
    for run in ("a", "b"):
        dumpdb.ingest(tmp_path / "d", archive=archive, run=run)
    (row,) = compare(dumpdb.open(archive), "a", "b", store_results=False).results.to_pylist()
    assert row["cosine"] == 1.0 and row["max_abs_err"] == 0.0 and MSG_NAN_INF_ZEROED in row["err_message"]
    assert not math.isnan(row["rmse"])


def test_engine_starts_loading_the_kernel_before_it_aligns(pair_archive, monkeypatch):
    """A tensor compare starts kernel.preload() (numba and the kernel load in a background
    thread) before the alignment's DuckDB queries, and waits for it before returning; a
    statistics compare starts none (it computes no tensor metric)."""
    from dumpdb.compare import kernel

    events = []
    real_align = engine.align_exact
    monkeypatch.setattr(kernel, "preload", lambda: events.append("preload"))
    monkeypatch.setattr(kernel, "wait_preload", lambda: events.append("wait"))
    monkeypatch.setattr(engine, "align_exact", lambda *a, **k: events.append("align") or real_align(*a, **k))
    a = dumpdb.open(pair_archive)
    assert compare(a, "fp16", "fp32", store_results=False).results.num_rows > 50
    assert events == ["preload", "align", "wait"]
    events.clear()
    compare(a, "fp16", "fp32", store_results=False, mode="statistics")
    assert "preload" not in events
