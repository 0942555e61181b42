"""dumpdb.compare.metrics and dumpdb.compare.verdict against msprobe's own definitions.

Reference values: ``tests/data/compare/goldens.json``, written by
``scripts/make_metric_goldens.py`` with mindstudio-probe 26.2.0's own functions
(msprobe ``ValidateTensor`` + ``compare_ops_apply``; msaccucmp ``alg_*.compare``) on real
tensor pairs of tests/data (msprobe tensor_mix step0/step1 and perturbed copies,
MindSpore d1 fp32 vs d2 fp16/bf16, MindSpore e1 NaN/Inf). Here the same inputs are
rebuilt (CRC32-checked) and recomputed with dumpdb.
"""

from __future__ import annotations

import importlib.util
import json
import math
import tracemalloc
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from compare_reference import stats_metrics
from verdict_rows import op_results

from dumpdb.compare import metrics as M
from dumpdb.compare.metrics import STAT_METRICS, TENSOR_METRICS, tensor_metrics
from dumpdb.compare.verdict import Thresholds, worst

ROOT = Path(__file__).resolve().parent.parent
GOLDENS = ROOT / "tests" / "data" / "compare" / "goldens.json"
BF16 = np.dtype(ml_dtypes.bfloat16)
TOL = 1e-6


def _script():
    spec = importlib.util.spec_from_file_location("make_metric_goldens",
                                                  ROOT / "scripts" / "make_metric_goldens.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def goldens():
    pytest.importorskip("torch", reason="the msprobe goldens are checked against torch's own functions: pip install torch (.ci/run installs the CPU wheel)")
    doc = json.loads(GOLDENS.read_text())
    g = _script()
    files = [f"{doc['dirs'][d]}/{name}" for d, name in doc["files"]]
    cache: dict[str, np.ndarray] = {}

    def array(side: dict) -> np.ndarray:
        path = files[side["file"]]
        if path not in cache:
            cache[path] = g.load(path)
        a = g.derive(cache[path], side["recipe"])
        assert g.crc(a) == side["crc32"], f"{path} {side['recipe']}: input differs from the golden's"
        return a

    out = []
    for p in doc["pairs"]:
        t, b = array(p["target"]), array(p["bench"])
        ours, msg = tensor_metrics(t, b)
        out.append((p, t, b, ours, msg))
    return doc, out


def _close(ours: float | None, ref, tol: float) -> bool:
    if isinstance(ref, str) or ref is None or (isinstance(ref, float) and math.isnan(ref)):
        return ours is None  # msprobe 'unsupported' / 'Nan' / 'N/A' / msaccucmp NaN
    if ours is None:
        return False
    if math.isinf(ref) or math.isinf(ours):
        return ours == ref
    return abs(ours - ref) <= tol * max(1.0, abs(ref))


# ----------------------------------------------------------------------- goldens (msprobe's own code)

def test_goldens_cover_the_cases(goldens):
    doc, pairs = goldens
    assert doc["mindstudio_probe_version"] == "26.2.0"
    assert len(pairs) >= 250
    kinds = {p["id"].split(":", 1)[1] for p, *_ in pairs}
    assert {"msprobe:step0-vs-step1", "msprobe:perturbed", "msprobe:same-shape", "msprobe:bf16-vs-fp32",
            "mindspore:d1-vs-d2", "mindspore:e1-it0-vs-it1", "mindspore:e1-it1-input-vs-output"} <= kinds
    msgs = [m or "" for *_, m in pairs]
    assert any(M.MSG_NAN_INF_MISMATCH in m for m in msgs)
    assert any(M.MSG_NAN_INF_ZEROED in m for m in msgs)
    assert any(M.MSG_SCALAR in m for m in msgs)
    assert any(M.MSG_ONE_ELEMENT in m for m in msgs)
    assert any(M.MSG_COS_BENCH_ZERO in m for m in msgs)
    assert any("dtype mismatch: target float32 vs bench float16" in m for m in msgs)
    # fc2 of the fp16/bf16 run really differs from the fp32 baseline (and flows into fc3, grads)
    d1d2 = [o for p, _, _, o, _ in pairs if p["id"].endswith("d1-vs-d2") and o["cosine"] is not None]
    assert any(o["one_thousandth_err_ratio"] < 0.5 for o in d1d2) and any(o["max_abs_err"] > 4e-4 for o in d1d2)
    assert any(o["max_abs_err"] == 0 for o in d1d2)  # and the fp32 parts upstream are bit-identical


def test_msprobe_metrics_equal_msprobe(goldens):
    doc, pairs = goldens
    cols = doc["msprobe_columns"]
    bad = []
    for p, _, _, ours, _ in pairs:
        for name, ref in zip(cols, p["msprobe"]):
            if not _close(ours[name], ref, TOL):
                bad.append((p["id"], name, ref, ours[name]))
    assert not bad, bad[:10]


def test_msaccucmp_metrics_equal_msaccucmp(goldens):
    """msaccucmp's functions on float64 inputs: 1e-6 (dumpdb computes msaccucmp's formulas
    in float64). On float32 inputs, as msaccucmp itself runs, the float32 arithmetic of the
    tool is off by up to ~1e-4 relative (x/y - 1 cancels) and overflows above ~1e19
    (squares): compared loosely, and only where the tool's result is finite."""
    doc, pairs = goldens
    cols = doc["msaccucmp_columns"]
    bad, checked32 = [], 0
    for p, _, _, ours, _ in pairs:
        if "msaccucmp_f64" not in p:  # msprobe refused the pair: dumpdb computes nothing either
            assert all(ours[n] is None for n in cols), p["id"]
            continue
        for name, ref64, ref32 in zip(cols, p["msaccucmp_f64"], p["msaccucmp"]):
            if not _close(ours[name], ref64, TOL):
                bad.append((p["id"], name, ref64, ours[name]))
            if isinstance(ref32, float) and math.isfinite(ref32) and ours[name] is not None:
                checked32 += 1
                if abs(ours[name] - ref32) > 1e-4 * max(1.0, abs(ref32)):
                    bad.append((p["id"], name + " (float32)", ref32, ours[name]))
    assert not bad, bad[:10]
    assert checked32 > 1000


def test_messages_follow_msprobe(goldens):
    doc, pairs = goldens
    for p, _, _, _ours, msg in pairs:
        ref = doc["messages"][p["msprobe_err_msg"]]
        msg = msg or ""
        assert ("inf or nan" in ref and "do not match" in ref) == (M.MSG_NAN_INF_MISMATCH in msg), p["id"]
        assert ("0-d tensor" in ref) == (M.MSG_SCALAR in msg), p["id"]
        assert ("length 1" in ref) == (M.MSG_ONE_ELEMENT in msg), p["id"]
        if "Dtype of NPU and bench" in ref:
            assert "dtype mismatch" in msg, p["id"]


def test_chunked_equals_unchunked_on_real_pairs(goldens):
    _, pairs = goldens
    small_pairs = [x for x in pairs if x[1].size <= 2000]
    assert len(small_pairs) > 150
    for p, t, b, ours, msg in small_pairs:
        small, msg7 = tensor_metrics(t, b, chunk=7)
        assert msg7 == msg
        for name in TENSOR_METRICS:
            assert _close(small[name], ours[name], 1e-12), (p["id"], name)


# ----------------------------------------------------------------------- edge cases

def _rand(shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _reference(x, y):
    """Straightforward float64 transcription (whole arrays, no chunks) for the edge tests."""
    x, y = np.asarray(x), np.asarray(y)
    # msprobe get_relative_err: float16/32/64 keep their type, the rest goes to float64
    rt = np.result_type(*(d if d.kind == "f" else np.float64 for d in (x.dtype, y.dtype)), np.float32)
    x = x.reshape(-1).astype(np.float64)
    y = y.reshape(-1).astype(np.float64)
    n, b = x.astype(rt), y.astype(rt)
    zero = b == 0
    n[zero] += np.finfo(rt).eps
    b[zero] += np.finfo(rt).eps
    r = np.abs((n - b) / b)
    keep = np.abs(y) > M.EPS64
    acc = float(np.abs(x[keep] / y[keep] - 1).sum())

    def norm01(v):
        rng = v.max() - v.min()
        return np.maximum((v - v.min()) / rng if rng else v, M.EPS32)

    px, py = norm01(x), norm01(y)
    px, py = px / px.sum(), py / py.sum()
    kl = float((px * np.log(px / py)).sum())
    return {
        "cosine": float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y))),
        "euc_dist": float(np.linalg.norm(x - y)), "max_abs_err": float(np.abs(x - y).max()),
        "max_rel_err": float(r.max()), "one_thousandth_err_ratio": float((r < 0.001).mean()),
        "five_thousandths_err_ratio": float((r < 0.005).mean()), "mean_abs_err": float(np.abs(x - y).mean()),
        "rmse": float(np.sqrt(((x - y) ** 2).mean())),
        "rel_euc_dist": float(np.sqrt(((x - y) ** 2).sum() / (y ** 2).sum())),
        "accumulated_rel_err": acc, "mean_rel_err": acc / x.size,
        "kl_divergence": 0.0 if abs(kl) < M.EPS64 else kl,
    }


def _assert_metrics(got: dict, want: dict, tol=1e-12):
    assert set(got) == set(TENSOR_METRICS)
    for k, v in want.items():
        assert _close(got[k], v, tol), (k, got[k], v)


def test_identical_tensors():
    a = _rand((5, 7))
    m, msg = tensor_metrics(a, a.copy())
    assert msg is None
    _assert_metrics(m, {"cosine": 1.0, "euc_dist": 0.0, "max_abs_err": 0.0, "max_rel_err": 0.0,
                        "one_thousandth_err_ratio": 1.0, "five_thousandths_err_ratio": 1.0,
                        "mean_abs_err": 0.0, "rmse": 0.0, "rel_euc_dist": 0.0, "accumulated_rel_err": 0.0,
                        "mean_rel_err": 0.0, "kl_divergence": 0.0})


def test_matches_plain_transcription_with_bench_zeros():
    a = _rand((40, 3), seed=1)
    b = (a * (1 + 3e-3 * np.sin(np.arange(a.size)).reshape(a.shape))).astype(np.float32)
    b[::5, 1] = 0
    m, msg = tensor_metrics(a, b)
    assert msg is None
    _assert_metrics(m, _reference(a, b), 1e-12)


def test_all_zero_vs_all_zero():
    m, msg = tensor_metrics(np.zeros((3, 4), np.float32), np.zeros((3, 4), np.float32))
    assert msg is None
    _assert_metrics(m, {"cosine": 1.0, "euc_dist": 0.0, "max_abs_err": 0.0, "max_rel_err": 0.0,
                        "one_thousandth_err_ratio": 1.0, "rel_euc_dist": 0.0, "accumulated_rel_err": 0.0,
                        "kl_divergence": 0.0})


def test_zero_vs_nonzero():
    z, o = np.zeros(4, np.float32), np.array([1, 2, -3, 4], np.float32)
    m, msg = tensor_metrics(z, o)
    assert m["cosine"] is None and msg == M.MSG_COS_TARGET_ZERO
    _assert_metrics(m, {"max_abs_err": 4.0, "mean_abs_err": 2.5, "rel_euc_dist": 1.0,
                        "accumulated_rel_err": 4.0, "max_rel_err": 1.0})
    m, msg = tensor_metrics(o, z)
    assert m["cosine"] is None and msg == M.MSG_COS_BENCH_ZERO
    # bench 0: eps(float32) added to both sides -> |x| / eps, computed in float32
    eps = np.float32(np.finfo(np.float32).eps)
    want = max(float(abs(((v + eps) - eps) / eps)) for v in o)
    assert m["max_rel_err"] == want
    assert m["accumulated_rel_err"] == 0.0 and m["rel_euc_dist"] == 0.0  # |y| <= eps64: msaccucmp's 0


def test_nan_inf_at_same_positions_are_zeroed():
    a = np.array([[1.0, np.nan, np.inf], [2.0, -np.inf, 3.0]], np.float32)
    b = np.array([[1.5, np.nan, -np.inf], [2.0, np.inf, 2.5]], np.float32)  # +-inf: same isinf mask
    keep_a, keep_b = a.copy(), b.copy()
    m, msg = tensor_metrics(a, b)
    assert msg == M.MSG_NAN_INF_ZEROED
    za, zb = np.nan_to_num(a, nan=0, posinf=0, neginf=0), np.nan_to_num(b, nan=0, posinf=0, neginf=0)
    m0, msg0 = tensor_metrics(za, zb)
    assert msg0 is None and m == m0
    _assert_metrics(m, _reference(za, zb))
    np.testing.assert_array_equal(a, keep_a)  # inputs untouched
    np.testing.assert_array_equal(b, keep_b)


def test_nan_inf_at_different_positions():
    a = np.array([1.0, np.nan, 3.0], np.float32)
    for b in (np.array([1.0, 2.0, np.nan], np.float32), np.array([1.0, np.inf, 3.0], np.float32),
              np.array([1.0, 2.0, 3.0], np.float32)):
        m, msg = tensor_metrics(a, b)
        assert msg == M.MSG_NAN_INF_MISMATCH
        assert all(v is None for v in m.values())
    # found in a later chunk too
    a = np.zeros(100, np.float32)
    b = a.copy()
    b[97] = np.inf
    assert tensor_metrics(a, b, chunk=8)[1] == M.MSG_NAN_INF_MISMATCH


def test_shape_mismatch():
    m, msg = tensor_metrics(np.zeros((2, 3)), np.zeros((3, 2)))
    assert all(v is None for v in m.values())
    assert msg == M.MSG_SHAPE.format(t=(2, 3), b=(3, 2))


def test_dtype_mismatch_is_computed_with_message():
    a = _rand((6, 5), seed=2)
    b = (a * np.float32(1.001)).astype(np.float16)
    m, msg = tensor_metrics(a, b)
    assert msg == "dtype mismatch: target float32 vs bench float16; metrics computed anyway"
    _assert_metrics(m, _reference(a, b))  # relative error in result_type(f32, f16, f32) = float32


def test_bool():
    a = np.array([[True, False, True], [False, False, True]])
    b = np.array([[True, True, True], [False, False, False]])
    m, msg = tensor_metrics(a, b)
    assert msg is None
    m64, _ = tensor_metrics(a.astype(np.float64), b.astype(np.float64))
    assert m == m64
    _assert_metrics(m, {"max_abs_err": 1.0, "mean_abs_err": 2 / 6, "cosine": 2 / math.sqrt(3 * 3)})


def test_bfloat16():
    a = _rand((9, 4), seed=3)
    b = (a * 1.01).astype(np.float32)
    ab, bb = a.astype(BF16), b.astype(BF16)
    m, msg = tensor_metrics(ab, bb)
    assert msg is None
    m32, _ = tensor_metrics(ab.astype(np.float32), bb.astype(np.float32))
    assert m == m32  # bfloat16 relative error in float32, as msprobe reads bfloat16
    m, msg = tensor_metrics(ab, b)
    assert msg.startswith("dtype mismatch: target bfloat16 vs bench float32")
    _assert_metrics(m, _reference(ab.astype(np.float32), b))


def test_integers():
    a = np.arange(12, dtype=np.int64).reshape(3, 4)
    b = a.copy()
    b[1, 1] += 1
    m, msg = tensor_metrics(a, b)
    assert msg is None
    _assert_metrics(m, _reference(a, b))  # ints go to float64, relative error in float64


def test_zero_d():
    m, msg = tensor_metrics(np.array(3.0, np.float32), np.array(2.0, np.float32))
    assert msg == M.MSG_SCALAR
    for k in ("cosine", "euc_dist", "one_thousandth_err_ratio", "five_thousandths_err_ratio"):
        assert m[k] is None
    _assert_metrics(m, {"max_abs_err": 1.0, "max_rel_err": 0.5, "mean_abs_err": 1.0, "rmse": 1.0,
                        "rel_euc_dist": 0.5, "accumulated_rel_err": 0.5, "mean_rel_err": 0.5,
                        "kl_divergence": 0.0})
    # no NaN/Inf pre-check for 0-d (msprobe's chain stops at the 0-d check): NaN -> None
    m, msg = tensor_metrics(np.array(np.nan, np.float32), np.array(np.nan, np.float32))
    assert m["max_abs_err"] is None and m["max_rel_err"] is None
    assert M.MSG_METRIC_NAN.format(name="max_abs_err") in msg
    m, _ = tensor_metrics(np.array(np.inf), np.array(1.0))
    assert m["max_abs_err"] == math.inf


def test_one_element():
    m, msg = tensor_metrics(np.array([3.0], np.float32), np.array([2.0], np.float32))
    assert msg == M.MSG_ONE_ELEMENT
    assert m["cosine"] is None
    _assert_metrics(m, {"euc_dist": 1.0, "max_abs_err": 1.0, "max_rel_err": 0.5,
                        "one_thousandth_err_ratio": 0.0, "rel_euc_dist": 0.5})
    m, msg = tensor_metrics(np.ones((1, 1)), np.ones((1, 1)))
    assert m["cosine"] is None and m["euc_dist"] == 0.0


def test_empty_complex_and_bad_arguments():
    m, msg = tensor_metrics(np.zeros((0, 3)), np.zeros((0, 3)))
    assert msg == M.MSG_EMPTY and all(v is None for v in m.values())
    m, msg = tensor_metrics(np.ones(3, np.complex64), np.ones(3, np.complex64))
    assert msg == M.MSG_COMPLEX and all(v is None for v in m.values())
    with pytest.raises(TypeError):
        tensor_metrics(np.array(["a", "b"]), np.array(["a", "b"]))
    with pytest.raises(ValueError):
        tensor_metrics(np.ones(3), np.ones(3), chunk=0)


def test_chunked_equals_unchunked():
    a = _rand((33, 17), seed=4)
    b = (a + 1e-3 * _rand((33, 17), seed=5)).astype(np.float32)
    b[3, 4] = 0
    a[7, 2] = b[7, 2] = np.nan
    a[20, 1] = b[20, 1] = np.inf
    full, msg = tensor_metrics(a, b)
    for chunk in (7, 1, 16, 17, 1000):
        part, msg2 = tensor_metrics(a, b, chunk=chunk)
        assert msg2 == msg
        _assert_metrics(part, full, 1e-12)
    # not C-contiguous: cut along the leading axes, same values
    at, bt = a.T, b.T
    assert not at.flags.c_contiguous
    ref, _ = tensor_metrics(np.ascontiguousarray(at), np.ascontiguousarray(bt))
    for chunk in (7, 5, 40, 1 << 22):
        _assert_metrics(tensor_metrics(at, bt, chunk=chunk)[0], ref, 1e-12)
    _assert_metrics(tensor_metrics(a[:, ::2], b[:, ::2], chunk=7)[0],
                    tensor_metrics(a[:, ::2].copy(), b[:, ::2].copy())[0], 1e-12)


def test_memory_is_bounded_by_chunk():
    n = 1 << 20  # 4 MiB per float32 tensor, 8 MiB as float64
    a = _rand(n, seed=6)
    b = a * np.float32(1.0001)
    chunk = 1 << 13
    tracemalloc.start()
    try:
        tensor_metrics(a, b, chunk=chunk)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * 8 * chunk + (1 << 18), peak  # ~6 float64 chunks (measured 5.5), not O(tensor)


# ----------------------------------------------------------------------- statistics mode

def test_stats_metrics():
    t = {"max": 3.0, "min": -1.0, "mean": 0.5, "l2norm": 10.0}
    b = {"max": 2.0, "min": 0.0, "mean": 0.5, "l2norm": 8.0}
    m, msg = stats_metrics(t, b)
    assert set(m) == set(STAT_METRICS)
    assert m["max_diff"] == 1.0 and m["max_rel_diff"] == 0.5  # a fraction, not 50 (%)
    assert m["min_diff"] == -1.0 and m["min_rel_diff"] is None  # bench 0: msprobe's N/A
    assert m["mean_diff"] == 0.0 and m["mean_rel_diff"] == 0.0
    assert m["l2norm_diff"] == 2.0 and m["l2norm_rel_diff"] == 0.25
    # |diff| / (max(|t|, |b|) + 1e-10) > 0.5: min (1 / 1)
    assert msg == M.MSG_STATS_MAGNITUDE.format(names="min")


def test_stats_metrics_missing_nan_inf():
    nan, inf = float("nan"), float("inf")
    m, msg = stats_metrics({"max": None, "min": nan, "mean": nan, "l2norm": inf},
                           {"max": 1.0, "min": 2.0, "mean": nan, "l2norm": 4.0})
    assert m["max_diff"] is None and m["max_rel_diff"] is None  # missing
    assert m["min_diff"] is None and m["min_rel_diff"] is None  # one NaN: msprobe 'Nan'
    assert m["mean_diff"] == 0.0 and m["mean_rel_diff"] == 0.0  # both NaN: equal for msprobe
    assert m["l2norm_diff"] == inf and m["l2norm_rel_diff"] == inf
    assert msg is None  # inf / inf is NaN: no magnitude warning (as msprobe)
    m, msg = stats_metrics({}, {"max": 1})
    assert all(v is None for v in m.values()) and msg is None
    m, _ = stats_metrics({"max": 0.0, "l2norm": 1.0}, {"max": 0.0, "l2norm": 1.0})
    assert m["max_diff"] == 0.0 and m["max_rel_diff"] is None and m["l2norm_rel_diff"] == 0.0


# ----------------------------------------------------------------------- verdicts

def _row(io, slot=0, **kw):
    r = {"io": io, "slot": slot, "target_dtype": "float32", "bench_dtype": "float32",
         "target_shape": [2, 3], "bench_shape": [2, 3], "target_max": 1.0, "target_min": -1.0,
         "bench_max": 1.0, "bench_min": -1.0, "cosine": 1.0, "max_abs_err": 0.0,
         "one_thousandth_err_ratio": 1.0, "l2norm_rel_diff": 0.0}
    r.update(kw)
    return r


def _levels(rows, **kw):
    return [lvl for lvl, _ in op_results(rows, **kw)]


def test_verdict_pass():
    rows = [_row("input"), _row("input", 1), _row("output")]
    assert op_results(rows) == [("pass", None)] * 3
    assert op_results(rows, mode="statistics") == [("pass", None)] * 3


def test_inf_nan_checker():
    rows = [_row("input"), _row("output", target_max=float("inf"))]
    res = op_results(rows)
    assert res[0] == ("pass", None) and res[1][0] == "error" and "nan or inf" in res[1][1]
    assert _levels(rows, mode="statistics") == ["pass", "error"]
    # bench has it too: ignored
    rows[1]["bench_min"] = float("nan")
    assert _levels(rows) == ["pass", "pass"]


def test_one_thousandth_checker_uses_the_code_threshold():
    rows = [_row("input", one_thousandth_err_ratio=0.95), _row("output", one_thousandth_err_ratio=0.05),
            _row("output", 1, one_thousandth_err_ratio=1.0)]
    assert _levels(rows) == ["pass", "error", "pass"]  # flags the op's first output
    rows[1]["one_thousandth_err_ratio"] = 0.3  # < 0.6 of the docstring, not < 0.1 of the code
    assert _levels(rows) == ["pass", "pass", "pass"]
    assert _levels(rows, thresholds=Thresholds(one_thousandth_output=0.6)) == ["pass", "error", "pass"]
    rows[0]["one_thousandth_err_ratio"] = 0.5  # inputs already bad: not the op's fault
    rows[1]["one_thousandth_err_ratio"] = 0.05
    assert _levels(rows) == ["pass", "pass", "pass"]


def test_dtype_and_shape_checkers():
    rows = [_row("input", bench_dtype="float16"), _row("output", bench_shape=[3, 2])]
    res = op_results(rows)
    assert res[0][0] == "error" and "dtypes differ" in res[0][1]
    assert res[1][0] == "error" and "shapes differ" in res[1][1]
    assert _levels(rows, mode="statistics") == ["error", "error"]
    # engine form: (target, bench) pairs; fused qkv projections skip the dtype check
    rows = [{"io": "output", "dtype": ("float32", "bfloat16"), "shape": ([4], [4]), "bench_name": "x.qkv_proj"}]
    assert _levels(rows, mode="statistics") == ["pass"]
    rows[0]["bench_name"] = "x.proj"
    assert _levels(rows, mode="statistics") == ["error"]


def test_requires_grad_checker():
    rows = [_row("input", target_requires_grad=True, bench_requires_grad=False), _row("output")]
    assert _levels(rows) == ["error", "pass"]


def test_cosine_warn_checker():
    rows = [_row("input", cosine=0.99), _row("output", cosine=0.85, max_abs_err=1e-4)]
    res = op_results(rows)
    assert res[1][0] == "warning" and "cosine drops" in res[1][1]
    assert _levels(rows, thresholds=Thresholds(cosine_warn_drop=0.2)) == ["pass", "pass"]
    rows[0]["cosine"] = None  # unsupported input cosine: msprobe's default 1.0
    assert _levels(rows) == ["pass", "warning"]


def test_relative_err_and_warn_checkers():
    rows = [_row("input", l2norm_rel_diff=0.01), _row("output", l2norm_rel_diff=0.6),
            _row("output", 1, l2norm_rel_diff=0.7)]
    res = op_results(rows, mode="statistics")
    assert [r[0] for r in res] == ["pass", "error", "error"]
    assert "warning" in res[1][1]  # 0.7 / 0.01 > 10: RelativeWarnChecker on the first output too
    rows = [_row("input", l2norm_rel_diff=0.05), _row("output", l2norm_rel_diff=0.4)]
    assert _levels(rows, mode="statistics") == ["pass", "pass"]  # 8x the input's, <= 0.5
    assert _levels(rows, mode="statistics", thresholds=Thresholds(rel_warn_ratio=5)) == ["pass", "warning"]
    assert _levels(rows, mode="statistics", thresholds=Thresholds(rel_err_output=0.3)) == ["pass", "error"]
    rows = [_row("input", l2norm_rel_diff=0.0), _row("output", l2norm_rel_diff=0.2)]
    assert _levels(rows, mode="statistics") == ["pass", "warning"]  # input 0, output > 0.1
    rows = [_row("input", l2norm_rel_diff=0.2), _row("output", l2norm_rel_diff=0.9)]
    assert _levels(rows, mode="statistics") == ["pass", "pass"]  # inputs already >= 0.1, 4.5x
    # tensor-mode checkers do not run in statistics mode and vice versa
    rows = [_row("input", cosine=0.99), _row("output", cosine=0.5, l2norm_rel_diff=0.0)]
    assert _levels(rows, mode="statistics") == ["pass", "pass"]


def test_outputs_only_ops_get_a_verdict():
    good = _row("output", cosine=0.9995, max_abs_err=5e-4)
    ms_rule = _row("output", 1, cosine=0.98, max_abs_err=0.002, one_thousandth_err_ratio=0.5)
    big = _row("output", 2, cosine=0.999, max_abs_err=1.5, one_thousandth_err_ratio=0.5)
    res = op_results([good, ms_rule, big])
    assert [r[0] for r in res] == ["pass", "error", "error"]
    assert "accuracy not reached" in res[1][1]
    # msprobe's own checkers already judge outputs-only ops (min input defaults to 1.0)
    low = _row("output", cosine=0.85, max_abs_err=5e-4, one_thousandth_err_ratio=0.05)
    res = op_results([low])
    assert res[0][0] == "error" and "One Thousandth" in res[0][1] and "cosine drops" in res[0][1]
    # NaN/Inf at different positions: metrics None, msprobe's N/A -> "No"
    nan_row = _row("output", cosine=None, max_abs_err=None, one_thousandth_err_ratio=None,
                   err_message=M.MSG_NAN_INF_MISMATCH)
    assert _levels([nan_row]) == ["error"]
    # cosine undefined (zero side / 0-d): only max_abs_err > 1 counts
    assert _levels([_row("output", cosine=None, max_abs_err=0.5)]) == ["pass"]
    assert _levels([_row("output", cosine=None, max_abs_err=2.0)]) == ["error"]
    # configurable, and not applied when the op has inputs
    assert _levels([ms_rule], thresholds=Thresholds(cosine_error=0.95)) == ["pass"]
    assert _levels([_row("input"), ms_rule]) == ["pass", "pass"]


def test_ignore_lists_and_modes():
    rows = [_row("input", target_name="Tensor.to.0.forward", bench_dtype="float16"),
            _row("output", target_name="Tensor.to.0.forward", target_max=float("nan"))]
    assert _levels(rows) == ["pass", "pass"]  # msprobe ignores 'to' entirely
    rows = [_row("input", target_name="Distributed.all_to_all_single.0.forward", bench_dtype="float16"),
            _row("output", target_name="Distributed.all_to_all_single.0.forward", bench_dtype="float16",
                 one_thousandth_err_ratio=0.0)]
    assert _levels(rows) == ["pass", "error"]  # per-row checks on outputs only, no op-level rule
    assert "One Thousandth" not in op_results(rows)[1][1]
    with pytest.raises(ValueError):
        op_results(rows, mode="md5")


def test_worst():
    assert worst([]) == "pass"
    assert worst(["pass", "warning"]) == "warning"
    assert worst(["warning", "error", "pass"]) == "error"


def test_known_ranges_skip_the_first_pass_with_identical_results():
    """The engine passes catalog min/max of NaN/Inf-free tensors: results must not change."""
    rng = np.random.default_rng(3)
    for dtype in (np.float32, np.float16, np.float64):
        t = np.maximum(rng.standard_normal((37, 101)), 0).astype(dtype)
        b = (t.astype(np.float64) * (1 + 1e-3 * rng.standard_normal(t.shape))).astype(dtype)
        ranges = (float(t.min()), float(t.max()), float(b.min()), float(b.max()))
        plain, msg1 = tensor_metrics(t, b, chunk=1000)
        fast, msg2 = tensor_metrics(t, b, chunk=1000, ranges=ranges)
        assert plain == fast and msg1 == msg2


# Worked by hand from the definitions (reference formats.md 2.1 msprobe, 2.2 msaccucmp) for
# target n = [1, 2, 3, 4], bench b = [1, 2, 2, 5]: n - b = [0, 0, 1, -1], |(n - b) / b| =
# [0, 0, 1/2, 1/5], n.b = 31, |n|^2 = 30, |b|^2 = 34. KL: min-max to [0, 1/3, 2/3, 1] and
# [0, 1/4, 1/4, 1], zeros clamped to eps(float32), each divided by its sum.
_EPS32 = float(np.finfo(np.float32).eps)
_P = [v / (2 + _EPS32) for v in (_EPS32, 1 / 3, 2 / 3, 1)]
_Q = [v / (1.5 + _EPS32) for v in (_EPS32, 1 / 4, 1 / 4, 1)]
HAND = {
    "cosine": 31 / math.sqrt(30 * 34),
    "euc_dist": math.sqrt(2),
    "max_abs_err": 1.0,
    "max_rel_err": 0.5,
    "one_thousandth_err_ratio": 0.5,  # two of four elements below 0.001
    "five_thousandths_err_ratio": 0.5,
    "mean_abs_err": 0.5,
    "rmse": math.sqrt(0.5),
    "rel_euc_dist": math.sqrt(2 / 34),
    "accumulated_rel_err": 0.5 + 0.2,
    "mean_rel_err": 0.7 / 4,
    "kl_divergence": sum(p * math.log(p / q) for p, q in zip(_P, _Q)),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, BF16, np.int32])
def test_every_metric_equals_the_hand_calculation(dtype):
    n = np.array([1, 2, 3, 4]).astype(dtype)  # exact in every one of these dtypes
    b = np.array([1, 2, 2, 5]).astype(dtype)
    m, msg = tensor_metrics(n, b)
    assert msg is None
    assert set(HAND) == set(TENSOR_METRICS)
    _assert_metrics(m, HAND, 1e-6)  # msprobe's relative error runs in float32


def test_bool_metrics_by_hand():
    # as 0/1: n = [1,0,1,0,0,1], b = [1,1,1,0,0,0]: n - b = [0,-1,0,0,0,1], n.b = 2, |n| = |b| = sqrt(3)
    n = np.array([True, False, True, False, False, True])
    b = np.array([True, True, True, False, False, False])
    m, _ = tensor_metrics(n, b)
    _assert_metrics(m, {"cosine": 2 / 3, "euc_dist": math.sqrt(2), "max_abs_err": 1.0, "mean_abs_err": 2 / 6,
                        "rmse": math.sqrt(2 / 6), "rel_euc_dist": math.sqrt(2 / 3)})


# ----------------------------------------------------------------------- mutation survivors

def test_stats_magnitude_rule_at_its_edges():
    """msprobe's rule is a strict ``|diff| / (max(|t|, |b|) + 1e-10) > 0.5``; several
    flagged statistics are named comma-separated. Worked by hand: max 1e-10 vs 0 gives
    1e-10 / 2e-10 = 0.5 exactly (not flagged); min 3 vs 1 gives 2 / 3 (flagged);
    l2norm 5 vs 1 gives 4 / 5 (flagged)."""
    m, msg = stats_metrics({"max": 1e-10, "min": 3.0, "mean": 1.0, "l2norm": 5.0},
                           {"max": 0.0, "min": 1.0, "mean": 1.0, "l2norm": 1.0})
    assert m["max_diff"] == 1e-10 and m["max_rel_diff"] is None  # bench 0: N/A
    assert msg == ("statistics differ by more than half their magnitude (min, l2norm); "
                   "double-check accuracy")


def test_stats_bool_values_count_as_missing():
    """A bool statistic is not a number (``_stat_value``): that statistic is not compared."""
    m, msg = stats_metrics({"max": True, "min": np.bool_(False), "mean": 2.0},
                           {"max": 1.0, "min": 0.0, "mean": 2.0})
    assert m["max_diff"] is None and m["max_rel_diff"] is None
    assert m["min_diff"] is None and m["min_rel_diff"] is None
    assert m["mean_diff"] == 0.0 and msg is None


def test_non_contiguous_input_with_one_element_chunks():
    """Strided views are cut into blocks of at most ``chunk`` elements, down to one."""
    t = np.arange(1.0, 13.0).reshape(3, 4)[:, ::2]  # [[1, 3], [5, 7], [9, 11]], not contiguous
    b = t + np.array([[0.0, 1.0], [0.0, 0.0], [-1.0, 0.0]])
    assert not t.flags.c_contiguous
    m, msg = tensor_metrics(t, b, chunk=1)
    assert msg is None
    # by hand: x - y = [0, -1, 0, 0, 1, 0]
    assert m["max_abs_err"] == 1.0 and m["mean_abs_err"] == 2 / 6
    assert m["euc_dist"] == pytest.approx(math.sqrt(2), rel=1e-15)
    m1, _ = tensor_metrics(t[:, 0], b[:, 0], chunk=1)  # 1-D strided: [1, 5, 9] vs [1, 5, 8]
    assert m1["max_abs_err"] == 1.0 and m1["max_rel_err"] == pytest.approx(1 / 8, rel=1e-6)


def test_nan_on_one_side_only_with_an_integer_bench():
    """The NaN/Inf check runs when either side is floating (msprobe's rule compares the
    NaN and Inf positions of both sides): a float NaN against an integer bench is a
    position mismatch, every metric None, not a NaN metric."""
    t = np.array([1.0, np.nan, 3.0], np.float32)
    b = np.array([1, 2, 3], np.int32)
    m, msg = tensor_metrics(t, b)
    assert all(v is None for v in m.values())
    assert msg == "nan/inf positions differ between target and bench; metrics not computed"
    m, msg = tensor_metrics(b, t)  # and the other way round
    assert all(v is None for v in m.values()) and msg.startswith("nan/inf positions differ")


def test_cosine_nan_from_overflowing_sums_is_none():
    """1e200 squared overflows float64: sum(x*y) and both norms are inf, inf / inf is NaN,
    and a NaN cosine is None (msprobe's rule), never clamped into [-1, 1]."""
    t = np.array([1e200, 1e200])
    m, msg = tensor_metrics(t, t.copy())
    assert m["cosine"] is None
    assert "cosine is NaN" in msg
    assert m["max_abs_err"] == 0.0 and m["euc_dist"] == 0.0


@pytest.mark.skipif(np.dtype(np.longdouble) == np.dtype(np.float64),
                    reason="longdouble is float64 on this platform: no separate longdouble path")
def test_longdouble_inputs_by_hand():
    """longdouble keeps its precision in msprobe's relative error (FLOAT_TYPE): computed
    from the source values, not through float64. Same hand values as float64."""
    n = np.array([1, 2, 3, 4], np.longdouble)
    b = np.array([1, 2, 2, 5], np.longdouble)
    m, msg = tensor_metrics(n, b)
    assert msg is None
    _assert_metrics(m, HAND, 1e-6)
    # a bench zero: eps(longdouble) added to both sides, |(0 + e) - (0 + e)| / e = 0 there
    m, _ = tensor_metrics(np.array([0, 1], np.longdouble), np.array([0, 2], np.longdouble))
    assert m["max_rel_err"] == 0.5 and m["one_thousandth_err_ratio"] == 0.5


@pytest.mark.skipif(np.finfo(np.longdouble).nmant < 60,
                    reason="longdouble has no more mantissa bits than float64 on this platform")
def test_longdouble_relative_error_keeps_bits_float64_drops():
    """bench 1 + 2**-60 is exact in longdouble (63+ mantissa bits) and rounds to 1 in
    float64: msprobe's relative error in longdouble sees 2**-60 / (1 + 2**-60)."""
    one = np.longdouble(1)
    b = np.array([one + np.longdouble(2) ** -60, one], np.longdouble)
    t = np.array([one, one], np.longdouble)
    m, _ = tensor_metrics(t, b)
    assert m["max_rel_err"] == pytest.approx(2.0 ** -60, rel=1e-9, abs=0)
