"""Tensor statistics computed at ingest (when the dump has no statistic.csv).

Definitions (all accumulated in float64, NaN-propagating like numpy):

==============  ===============================================================
``min``/``max`` ``np.min``/``np.max`` of the values (NaN if any NaN)
``mean``        sum / count (NaN if any NaN; +-inf if an inf and no NaN)
``l2norm``      sqrt(sum(x**2))
``count``       number of elements
``nan_count``   elements that are NaN
``pos_inf_count`` / ``neg_inf_count``  elements equal to +inf / -inf
``zero_count``  elements equal to 0 (+0.0 and -0.0; False for bool)
==============  ===============================================================

bool tensors count as 0/1; complex tensors use ``abs(x)``; bfloat16 and
float16 are widened in chunks so memory stays bounded (reference
performance.md b.: float16 statistics are the slow part, widen in 1 Mi chunks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

CHUNK = 1 << 20  # elements per pass; bounds the float64 scratch to 8 MiB

STAT_COLUMNS = (
    "min", "max", "mean", "l2norm", "count",
    "nan_count", "pos_inf_count", "neg_inf_count", "zero_count",
)


@dataclass(frozen=True)
class TensorStats:
    """Statistics of one tensor; floats are None for an empty tensor."""

    min: float | None
    max: float | None
    mean: float | None
    l2norm: float | None
    count: int
    nan_count: int
    pos_inf_count: int
    neg_inf_count: int
    zero_count: int

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in STAT_COLUMNS}


def compute_stats(array: np.ndarray) -> TensorStats:
    """Statistics of ``array`` (any shape, any numeric dtype incl. bfloat16).

    Returns a :class:`TensorStats`; never raises for numeric input.
    """
    flat = np.asarray(array).reshape(-1)
    n = int(flat.size)
    if n == 0:
        return TensorStats(None, None, None, None, 0, 0, 0, 0, 0)
    if flat.dtype.kind == "b":
        flat = flat.view(np.uint8)
    elif flat.dtype.kind == "c":
        flat = np.abs(flat)
    floating = flat.dtype.kind == "f" or flat.dtype.name == "bfloat16"
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf and overflow are expected
        return _accumulate(flat, n, floating)


def _accumulate(flat: np.ndarray, n: int, floating: bool) -> TensorStats:
    lo, hi = math.inf, -math.inf
    total = 0.0
    squares = 0.0
    nonzero = nans = pinf = ninf = 0
    has_nan = False
    narrow = floating and flat.dtype.itemsize < 4
    scratch = np.empty(min(n, CHUNK), np.float32) if narrow else None
    for start in range(0, n, CHUNK):
        x = flat[start : start + CHUNK]
        if scratch is not None:  # float16/bfloat16: numpy is slow on them, widen once into scratch
            x = scratch[: x.size]
            np.copyto(x, flat[start : start + CHUNK], casting="unsafe")
        cmin, cmax = x.min(), x.max()
        nonzero += int(np.count_nonzero(x))
        if floating and not (np.isfinite(cmin) and np.isfinite(cmax)):
            c_nan = int(np.count_nonzero(np.isnan(x)))
            nans += c_nan
            pinf += int(np.count_nonzero(x == np.inf))
            ninf += int(np.count_nonzero(x == -np.inf))
            has_nan = has_nan or c_nan > 0
        if not has_nan:
            lo = min(lo, float(cmin))
            hi = max(hi, float(cmax))
        # float64 accumulation without materialising a float64 copy of the chunk
        total += float(np.add.reduce(x, dtype=np.float64))
        squares += float(np.einsum("i,i->", x, x, dtype=np.float64))
    if has_nan:
        lo = hi = mean = l2 = math.nan
    else:
        mean = total / n
        l2 = math.sqrt(squares)
    # count_nonzero counts NaN as non-zero, so zero = n - nonzero holds.
    return TensorStats(lo, hi, mean, l2, n, nans, pinf, ninf, n - nonzero)
