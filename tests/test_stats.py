"""Statistics equal numpy's float64 reference for every dtype and edge case."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dumpdb.dtypes import BFLOAT16
from dumpdb.stats import CHUNK, compute_stats


def reference(a: np.ndarray) -> dict:
    x = np.asarray(a)
    if x.dtype.kind == "b":
        x = x.astype(np.uint8)
    x = x.astype(np.float64).reshape(-1)
    with np.errstate(invalid="ignore", over="ignore"):
        return _reference(x)


def _reference(x: np.ndarray) -> dict:
    return {
        "min": float(np.min(x)), "max": float(np.max(x)), "mean": float(np.mean(x)),
        "l2norm": float(np.sqrt(np.sum(x * x))), "count": x.size,
        "nan_count": int(np.isnan(x).sum()), "pos_inf_count": int(np.isposinf(x).sum()),
        "neg_inf_count": int(np.isneginf(x).sum()), "zero_count": int((x == 0).sum()),
    }


def same(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b or math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-300)


rng = np.random.default_rng(7)
CASES = {
    "float32": rng.standard_normal((4, 6, 28, 28)).astype(np.float32),
    "float16": rng.standard_normal(5000).astype(np.float16),
    "bfloat16": rng.standard_normal(3000).astype(BFLOAT16),
    "float64": rng.standard_normal(100),
    "int32": rng.integers(-5, 5, 1000).astype(np.int32),
    "int64_scalar": np.array(0, dtype=np.int64),
    "bool_scalar": np.array(True),
    "bool": rng.random(100) > 0.3,
    "relu_sparse": np.maximum(rng.standard_normal(10000), 0).astype(np.float32),
    "with_inf": np.array([1.0, np.inf, -np.inf, 0.0, -0.0, 2.5], np.float32),
    "with_nan": np.array([1.0, np.nan, np.inf, 0.0], np.float32),
    "across_chunks": np.concatenate([np.ones(CHUNK, np.float32), [np.inf], -np.ones(5, np.float32)]),
    "nan_in_second_chunk": np.concatenate([np.ones(CHUNK, np.float16), [np.nan]]).astype(np.float16),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_stats_match_numpy(name):
    got = compute_stats(CASES[name]).as_dict()
    want = reference(CASES[name])
    for key, value in want.items():
        assert same(got[key], value), (name, key, got[key], value)


def test_empty_tensor():
    s = compute_stats(np.zeros((0, 3), np.float32))
    assert s.count == 0 and s.min is None and s.mean is None and s.zero_count == 0
    assert s.as_dict() == {"min": None, "max": None, "mean": None, "l2norm": None, "count": 0, "nan_count": 0,
                           "pos_inf_count": 0, "neg_inf_count": 0, "zero_count": 0}


def test_no_runtime_warnings_for_inf_nan_and_overflow():
    """inf - inf, NaN and float16 overflow are data here, not warnings a user should see."""
    import warnings

    cases = [np.array([np.inf, -np.inf, np.nan, 1.0], np.float32), np.array([60000, 60000], np.float16),
             np.array([np.inf, -np.inf], np.float64), np.array([1e308, 1e308], np.float64)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for a in cases:
            compute_stats(a)


def test_sums_accumulate_over_chunks():
    n = 2 * CHUNK + 7
    s = compute_stats(np.full(n, 2.0, np.float32))
    assert (s.mean, s.l2norm, s.zero_count) == (2.0, math.sqrt(4.0 * n), 0)
    a = np.ones(2 * CHUNK + 4, np.float16)
    a[[3, CHUNK + 3, 2 * CHUNK + 3]] = np.nan  # one NaN in each of three chunks
    assert compute_stats(a).nan_count == 3


def test_float64_accumulation_beats_float32():
    a = np.full(1 << 22, 0.1, np.float32)  # float32 accumulation drifts visibly here
    assert compute_stats(a).mean == pytest.approx(float(np.float32(0.1)), rel=1e-12)


@pytest.mark.parametrize("array, want", [
    # worked by hand from the module's definitions
    (np.array([3 + 4j, 0j, -6 - 8j], np.complex64),  # |x| = 5, 0, 10
     dict(min=0.0, max=10.0, mean=5.0, l2norm=math.sqrt(125), count=3, nan_count=0, pos_inf_count=0,
          neg_inf_count=0, zero_count=1)),
    (np.array([[True, False], [True, True]]),
     dict(min=0.0, max=1.0, mean=0.75, l2norm=math.sqrt(3), count=4, nan_count=0, pos_inf_count=0,
          neg_inf_count=0, zero_count=1)),
    (np.array([-2, 0, 0, 4, 3], np.int8),
     dict(min=-2.0, max=4.0, mean=1.0, l2norm=math.sqrt(29), count=5, nan_count=0, pos_inf_count=0,
          neg_inf_count=0, zero_count=2)),
    (np.array([-0.0, 0.5, np.inf, np.inf, -np.inf], np.float16),
     dict(min=-math.inf, max=math.inf, mean=math.nan, l2norm=math.inf, count=5, nan_count=0, pos_inf_count=2,
          neg_inf_count=1, zero_count=1)),
    (np.array([1.5, np.nan, -np.inf, 0.0], BFLOAT16),
     dict(min=math.nan, max=math.nan, mean=math.nan, l2norm=math.nan, count=4, nan_count=1, pos_inf_count=0,
          neg_inf_count=1, zero_count=1)),
    (np.array(250, np.uint8), dict(min=250.0, max=250.0, mean=250.0, l2norm=250.0, count=1, nan_count=0,
                                  pos_inf_count=0, neg_inf_count=0, zero_count=0)),
])
def test_stats_by_hand(array, want):
    got = compute_stats(array).as_dict()
    assert list(got) == ["min", "max", "mean", "l2norm", "count", "nan_count", "pos_inf_count", "neg_inf_count",
                         "zero_count"]
    for key, value in want.items():
        assert same(got[key], value), (key, got[key], value)
        assert type(got[key]) is type(value), (key, type(got[key]))


def test_counts_add_up_over_chunks():
    """NaN/Inf spread over three chunks; min/max from the NaN-free chunks would be wrong."""
    a = np.zeros(2 * CHUNK + 10, np.float32)
    a[5], a[CHUNK + 1], a[CHUNK + 2], a[2 * CHUNK + 3] = np.inf, -np.inf, 7.0, np.nan
    s = compute_stats(a)
    assert (s.count, s.nan_count, s.pos_inf_count, s.neg_inf_count, s.zero_count) == (
        2 * CHUNK + 10, 1, 1, 1, 2 * CHUNK + 10 - 4)
    assert math.isnan(s.min) and math.isnan(s.max) and math.isnan(s.mean) and math.isnan(s.l2norm)
    b = a.copy()
    b[2 * CHUNK + 3] = -3.0
    s = compute_stats(b)
    assert (s.min, s.max, s.nan_count) == (-math.inf, math.inf, 0) and math.isnan(s.mean)
