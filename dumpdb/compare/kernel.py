"""The fused tensor-metric kernel: every accumulator of a pair in one pass, compiled with numba.

:func:`dumpdb.compare.metrics.tensor_metrics` (and its split and batch forms) call this module
when numba imports (:data:`AVAILABLE`); otherwise, or with ``DUMPDB_METRICS_KERNEL=numpy`` in
the environment, they run their numpy form, which gives the same bits (tested in
``tests/test_compare_kernel.py``; ``kl_divergence`` to 1e-12, see below).

Summation order (the one definition both forms follow, :data:`LANES`): within a chunk, element
``i`` goes to lane ``i % 8`` of each sum, the lanes start at +0.0 and are added in element
order; the lanes of the first ``8 * (n // 8)`` elements are folded as
``((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))`` and the last ``n % 8`` elements are then
added one by one; products are rounded before they are added (no fused multiply-add:
numba/LLVM contract ``a * b + c`` only under ``fastmath``, which is not used). Chunks are
folded in chunk order by the caller. The order is fixed by the code, not by the processor:
numpy's ``np.dot`` calls OpenBLAS, whose ``ddot`` kernel is chosen at run time by CPU type
(``OPENBLAS_CORETYPE``) and sums in a different order on each, so msprobe's ``EucDist``
(``np.linalg.norm`` of the difference, printed with 17 significant digits) moves in its 17th
digit from one machine to another. This 8-lane order is the order of the SSE2 ``ddot`` kernel
that produced the msprobe 26.2.0 CSVs of ``tests/data/msprobe_oracle`` (all 135 Euclidean
distances there equal it, and 6 of them differ from the AVX2 kernel's and from numpy's
pairwise ``sum``), so those CSVs are reproduced byte for byte on any processor.

Difference from dumpdb before this kernel (numpy ``np.dot`` for dot products, numpy's pairwise
``sum`` for the other sums): ``cosine``, ``euc_dist``, ``rmse``, ``rel_euc_dist``,
``mean_abs_err``, ``accumulated_rel_err``, ``mean_rel_err`` and ``kl_divergence`` may differ in
their last bits (a sum of ``n`` terms in another order moves by at most ``n * 2**-53`` times
the sum of the absolute terms; measured on the Transformer fp16/fp32 pair, scripts/
bench_compare.py: at most a few units in the 16th significant digit, never in a digit msprobe
prints but the 17th of ``EucDist``). Maxima and counts are exact in any order and unchanged.

``kl_divergence`` uses libm's ``log`` per element (numpy's ``np.log`` calls the same function
on processors without AVX512F; with AVX512F numpy has its own vector ``log``, which may differ
by one unit in the last place): the numpy form agrees to about 1e-12 relative there.
"""

from __future__ import annotations

import math
import os

import numpy as np

# Accumulators of one chunk, in the order of a row of the kernel's output.
FIELDS = ("dot", "xx", "yy", "dd", "abs_sum", "max_abs", "max_rel", "cnt1", "cnt5", "acc_rel",
          "kl_sx", "kl_sy", "kl_t")
LANES = 8

try:  # numba is a dependency; the numpy form stays for platforms without a wheel of it
    import numba
except ImportError:  # pragma: no cover - exercised by DUMPDB_METRICS_KERNEL=numpy
    numba = None

AVAILABLE = numba is not None and os.environ.get("DUMPDB_METRICS_KERNEL", "numba") != "numpy"

# dtypes the kernel reads directly (bool as a uint8 view); others are converted to float32
# chunk by chunk first (float16, bfloat16, float8: exact in float32).
NATIVE = frozenset(np.dtype(t) for t in (np.float32, np.float64, np.int8, np.int16, np.int32, np.int64,
                                         np.uint8, np.uint16, np.uint32, np.uint64))

EPS64 = float(np.finfo(np.float64).eps)
EPS32 = float(np.finfo(np.float32).eps)


def _jit(fn):
    if numba is None:
        return fn
    return numba.njit(cache=True, nogil=True, error_model="numpy")(fn)


@_jit
def _fold(lanes):
    return ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]))


@_jit
def _chunk(x, y, s, e, row, zero_invalid, rt32, eps, thr1, thr5, xmin, xrange, ymin, yrange):
    """Accumulators of elements [s, e) of x and y into ``row`` (FIELDS order)."""
    lanes = np.zeros((9, 8))  # dot xx yy dd abs_sum acc_rel kl_sx kl_sy kl_t
    tail = np.zeros(9)
    max_abs = -np.inf
    max_rel = -np.inf
    nan_abs = False
    nan_rel = False
    cnt1 = 0
    cnt5 = 0
    eps32 = np.float32(eps)
    thr1_32 = np.float32(thr1)
    thr5_32 = np.float32(thr5)
    n8 = s + (e - s) // 8 * 8
    for i in range(s, e):
        xv = np.float64(x[i])
        yv = np.float64(y[i])
        if zero_invalid and not np.isfinite(xv):  # NaN/Inf at the same positions on both sides
            xv = 0.0
            yv = 0.0
        d = xv - yv
        ad = abs(d)
        if rt32:
            n32 = np.float32(xv)
            b32 = np.float32(yv)
            if b32 == 0:
                n32 = n32 + eps32
                b32 = b32 + eps32
            r32 = abs((n32 - b32) / b32)
            if r32 < thr1_32:
                cnt1 += 1
            if r32 < thr5_32:
                cnt5 += 1
            r = np.float64(r32)
        else:
            nv = xv
            bv = yv
            if bv == 0:
                nv = nv + eps
                bv = bv + eps
            r = abs((nv - bv) / bv)
            if r < thr1:
                cnt1 += 1
            if r < thr5:
                cnt5 += 1
        if ad != ad:
            nan_abs = True
        elif ad > max_abs:
            max_abs = ad
        if r != r:
            nan_rel = True
        elif r > max_rel:
            max_rel = r
        q = 0.0
        if abs(yv) > 2.220446049250313e-16:
            q = abs(xv / yv - 1.0)
        vx = xv
        if xrange != 0:
            vx = (xv - xmin) / xrange
        if vx < 1.1920928955078125e-07:
            vx = 1.1920928955078125e-07
        vy = yv
        if yrange != 0:
            vy = (yv - ymin) / yrange
        if vy < 1.1920928955078125e-07:
            vy = 1.1920928955078125e-07
        t = vx * math.log(vx / vy)
        if i < n8:
            j = (i - s) & 7
            lanes[0, j] += xv * yv
            lanes[1, j] += xv * xv
            lanes[2, j] += yv * yv
            lanes[3, j] += d * d
            lanes[4, j] += ad
            lanes[5, j] += q
            lanes[6, j] += vx
            lanes[7, j] += vy
            lanes[8, j] += t
        else:
            if i == n8:
                for k in range(9):
                    tail[k] = _fold(lanes[k])
            tail[0] += xv * yv
            tail[1] += xv * xv
            tail[2] += yv * yv
            tail[3] += d * d
            tail[4] += ad
            tail[5] += q
            tail[6] += vx
            tail[7] += vy
            tail[8] += t
    if n8 == e:
        for k in range(9):
            tail[k] = _fold(lanes[k])
    row[0] = tail[0]
    row[1] = tail[1]
    row[2] = tail[2]
    row[3] = tail[3]
    row[4] = tail[4]
    row[5] = np.nan if nan_abs else max_abs
    row[6] = np.nan if nan_rel else max_rel
    row[7] = cnt1
    row[8] = cnt5
    row[9] = tail[5]
    row[10] = tail[6]
    row[11] = tail[7]
    row[12] = tail[8]


@_jit
def chunk_rows(x, y, chunk, out, zero_invalid, rt32, eps, thr1, thr5, xmin, xrange, ymin, yrange):
    """One row of accumulators per chunk of ``chunk`` elements of the 1-D arrays x and y
    (same length; any dtype of :data:`NATIVE`) into ``out`` (float64, ``(n_chunks, 13)``).

    ``zero_invalid``: set NaN/Inf positions (the same on both sides, checked before) to 0;
    ``rt32``: msprobe's relative error in float32 (else float64) with ``eps``/``thr1``/``thr5``
    its epsilon and thresholds; ``xmin``, ``xrange``, ``ymin``, ``yrange``: the KL
    normalisation (a range of 0 leaves the values as they are). The GIL is released."""
    n = x.shape[0]
    for c in range(out.shape[0]):
        s = c * chunk
        _chunk(x, y, s, min(n, s + chunk), out[c], zero_invalid, rt32, eps, thr1, thr5,
               xmin, xrange, ymin, yrange)


@_jit
def scan(x, y, check_invalid):
    """First pass over two 1-D arrays of the same length: ``(status, xmin, xmax, ymin, ymax)``
    with status 0 (all finite), 1 (NaN/Inf at the same positions on both sides: msprobe
    zeroes them; min/max are of the zeroed values) or 2 (NaN or Inf positions differ: no
    metrics). Without ``check_invalid`` (integer dtypes) status is 0."""
    xmin = np.inf
    xmax = -np.inf
    ymin = np.inf
    ymax = -np.inf
    status = 0
    for i in range(x.shape[0]):
        xv = np.float64(x[i])
        yv = np.float64(y[i])
        if check_invalid:
            xb = not np.isfinite(xv)
            yb = not np.isfinite(yv)
            if xb or yb:
                if np.isnan(xv) != np.isnan(yv) or np.isinf(xv) != np.isinf(yv):
                    return 2, xmin, xmax, ymin, ymax
                status = 1
                xv = 0.0
                yv = 0.0
        if xv < xmin:
            xmin = xv
        if xv > xmax:
            xmax = xv
        if yv < ymin:
            ymin = yv
        if yv > ymax:
            ymax = yv
    return status, xmin, xmax, ymin, ymax


@_jit
def segment_rows(x, y, starts, sizes, chunk, out, status, rt32, eps, thr1, thr5):
    """:func:`scan` then :func:`chunk_rows` for each segment ``k`` (``[starts[k], starts[k] +
    sizes[k])`` of the 1-D arrays x and y), its chunks folded in order into ``out[k]``
    (float64, ``(n_segments, 13)``); ``status[k]`` is the segment's scan status (a segment
    with status 2 or 1 is left for the caller to compute alone). The GIL is released."""
    row = np.zeros(13)
    for k in range(starts.shape[0]):
        s = starts[k]
        e = s + sizes[k]
        st, xmin, xmax, ymin, ymax = scan(x[s:e], y[s:e], True)
        status[k] = st
        if st != 0:
            continue
        acc = out[k]
        for f in range(13):
            acc[f] = 0.0
        acc[5] = -np.inf
        acc[6] = -np.inf
        for c in range(s, e, chunk):
            _chunk(x, y, c, min(e, c + chunk), row, False, rt32, eps, thr1, thr5,
                   xmin, xmax - xmin, ymin, ymax - ymin)
            fold_row(acc, row)


@_jit
def fold_row(acc, row):
    """``acc`` += one chunk's ``row``: sums added, maxima with NaN propagated (np.maximum)."""
    for f in (0, 1, 2, 3, 4, 7, 8, 9, 10, 11, 12):
        acc[f] += row[f]
    for f in (5, 6):
        if acc[f] != acc[f] or row[f] != row[f]:
            acc[f] = np.nan
        elif row[f] > acc[f]:
            acc[f] = row[f]


@_jit
def fold_rows(acc, rows):
    """:func:`fold_row` of every row of ``rows``, in order."""
    for c in range(rows.shape[0]):
        fold_row(acc, rows[c])


def new_acc() -> np.ndarray:
    """Accumulators before the first chunk: sums +0.0, maxima -inf (FIELDS order)."""
    acc = np.zeros(len(FIELDS))
    acc[5] = acc[6] = -np.inf
    return acc


def lane_sum(w: np.ndarray) -> float:
    """The kernel's sum of the float64 1-D array ``w``, in numpy (module docstring's order)."""
    n8 = w.size // LANES * LANES
    total = _fold_py(np.add.reduce(w[:n8].reshape(-1, LANES), axis=0)) if n8 else 0.0
    for v in w[n8:].tolist():
        total += v
    return total


def _fold_py(lanes: np.ndarray) -> float:
    a = lanes.tolist()
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))
