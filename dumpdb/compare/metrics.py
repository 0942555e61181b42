"""Per-pair comparison metrics: msprobe ``compare`` and msaccucmp definitions.

Reference: ``shared/reference/formats.md`` section 2, checked against the code of
mindstudio-probe 26.2.0 (the ``msprobe`` wheel). ``target`` is the side under test
(msprobe "NPU", msaccucmp "my output"), ``bench`` the ground truth. Below, ``x`` is
target and ``y`` bench, both flattened in C order and converted to float64, ``N`` the
element count, ``eps64 = finfo(float64).eps`` and ``eps32 = finfo(float32).eps``.

Tensor mode, :func:`tensor_metrics`
===================================

msprobe metrics (``msprobe/core/compare/algorithm/builtin_algorithm/alg_*.py`` and the
helpers of ``msprobe/core/compare/utils.py``):

``cosine`` (``alg_cosine_similarity.py``)
    ``sum(x*y) / (sqrt(sum(x*x)) * sqrt(sum(y*y)))``. Both norms ``<= eps64`` -> 1.0;
    only one of them ``<= eps64`` -> None ("all zero" message); a NaN result -> None.
    Not computed (None) for 0-d tensors and tensors of one element (``validate_numpy``).
    msprobe rounds a cosine above 0.9999 to 6 decimals for display; we store the value
    unrounded (the rounding moves it by at most 5e-7 and carries no meaning) but clip it
    to [-1, 1], which is what msprobe's 12-decimal ``format_value`` does to the
    1 +- 1e-16 that float64 rounding can produce.
``euc_dist`` (``alg_euclidean_distance.py``)
    ``sqrt(sum((x - y)**2))``. None for 0-d tensors.
``max_abs_err`` (``alg_max_absolute_error.py``)
    ``max(|x - y|)``; a NaN result -> None with a message.
``max_rel_err`` (``alg_max_relative_error.py``, ``utils.get_relative_err``)
    ``max(|(n - b) / b|)`` evaluated in ``rt = result_type(dt(x), dt(y), float32)``
    where ``dt`` is the input dtype if it is float16/32/64 (msprobe's ``FLOAT_TYPE``),
    float64 for integers and bool, and float32 for the ml_dtypes low-precision floats
    (bfloat16, float8...: msprobe's torch reader converts those to float32 before it
    compares). ``n``/``b`` are x/y cast to ``rt``; where ``b == 0`` both get
    ``+finfo(rt).eps`` before the division. This is msprobe's MaxRelativeErr, which is
    not msaccucmp's (see below); msaccucmp's is not stored.
``one_thousandth_err_ratio`` / ``five_thousandths_err_ratio``
    (``alg_one_thousand_error.py``, ``alg_five_thousand_error.py``,
    ``utils.calc_relative_err_ratio``): ``count(r < 0.001) / N`` and
    ``count(r < 0.005) / N`` with ``r`` the element-wise relative error of
    ``max_rel_err`` (compared in ``rt``, as numpy 2 compares a float32 array with a
    Python float). None for 0-d tensors.

msaccucmp metrics (``msprobe/msaccucmp/algorithm_manager/builtin_algorithm/alg_*.py``):

``mean_abs_err`` (``alg_MeanAbsoluteError.py``)        ``sum(|x - y|) / N``
``rmse`` (``alg_RootMeanSquareError.py``)              ``sqrt(sum((x - y)**2) / N)``
``rel_euc_dist`` (``alg_RelativeEuclideanDistance.py``)
    ``sqrt(sum((x - y)**2) / sum(y**2))``; 0.0 when ``sqrt(sum(y**2)) <= eps64``.
``accumulated_rel_err`` (``alg_AccumulatedRelativeError.py``)
    ``sum(|x/y - 1|)`` over the elements with ``|y| > eps64`` (the others count 0).
``mean_rel_err`` (``alg_MeanRelativeError.py``)
    ``accumulated_rel_err / N`` (elements with ``|y| <= eps64`` count 0 but are in N).
``kl_divergence`` (``alg_KullbackLeiblerDivergence.py``)
    each side is min-max normalised, ``v = (x - min(x)) / (max(x) - min(x))`` (``v = x``
    when max == min), clamped ``v = max(v, eps32)``, turned into ``p = v / sum(v)``;
    ``KL = sum(p_x * log(p_x / p_y))``, set to 0.0 when ``|KL| < eps64``. Computed from
    two passes over the chunks (min/max first) as
    ``KL = sum(v_x * log(v_x / v_y)) / S_x + log(S_y / S_x)`` with ``S = sum(v)``, which
    is the same quantity.

msaccucmp's own MaxRelativeError (``alg_MaxRelativeError.py``) is ``max(|x/y - 1|)``
over ``|y| > eps64`` (0 elsewhere): unlike msprobe's it ignores bench zeros instead of
adding eps to both sides, and it computes in float32. ``max_rel_err`` stores msprobe's.
msaccucmp's CosineSimilarity and MaxAbsoluteError are msprobe's up to the zero rules;
``cosine`` and ``max_abs_err`` follow msprobe.

Precision: msprobe converts to float64 (``flatten_numpy``) and so do we. msaccucmp casts
its inputs to float32 and computes in float32 (``AlgorithmManager.compare``); we apply
its formulas to the float64 values with float64 accumulation instead. On the real pairs
of ``tests/data/compare/goldens.json`` we equal msaccucmp's functions fed float64 to
1e-15 and msaccucmp as it runs (float32) to 1e-4 relative: its float32 ``x/y - 1``
cancels (up to 5e-5 relative off on accumulated_rel_err), and its squares overflow to
inf/NaN above ~1.8e19 (rmse, rel_euc_dist, kl_divergence of overflowing runs) where
ours stay finite. msaccucmp refuses bool inputs (NaN for all but cosine and relative
Euclidean distance); we compute every metric on bool as 0/1, like msprobe.

float16 and bfloat16 pairs are widened to float64 too, not computed in float32. Widening
is exact and cheap next to the metrics themselves: CPU per element of a 4 Mi-element pair,
one thread, numpy 2 (``tensor_metrics``, median of 5): float32 10.2 ns, float16 13.1 ns,
bfloat16 10.3 ns, so float32 arithmetic could save at most the ~3 ns float16 -> float64
conversion; it would also move the last digits of cosine, euc_dist and the relative
errors away from msprobe's (which computes these in float64, ``flatten_numpy``), and the
msprobe CSV dumpdb writes is checked byte for byte against msprobe's own.

Checks, in msprobe's order (``ValidateTensor.check_tensor`` in
``msprobe/core/compare/npy_compare.py``):

1. target empty -> all None, message;
2. shapes differ -> all None, message;
3. 0-d tensor -> cosine, euc_dist and both ratios None, message; msprobe's chain stops
   here for 0-d tensors, so there is no NaN/Inf pre-check: a NaN metric becomes None.
   msprobe evaluates ``|x - y|`` of a 0-d pair in the input dtype; we use float64;
4. NaN/Inf: a position is invalid when the value is NaN or +-Inf. If the NaN masks
   and the Inf masks are equal on both sides, invalid values are set to 0 on both
   sides before any metric (message says so); otherwise all None, message;
5. dtypes differ -> metrics computed, message.

msprobe's readers ``np.squeeze`` every tensor before these checks, so in its CSV a
tensor of one element is 0-d (no euc_dist, no ratios); we judge the array as given:
shape ``(1,)`` or ``(1, 1)`` gets everything but the cosine (``validate_numpy``'s rule).

Computation: the compiled kernel of :mod:`dumpdb.compare.kernel` (numba) computes every
accumulator of a chunk in one pass over both tensors, reading float32/float64/integer/bool
data in place (the metric pass reads float16 as its bits and widens each block of it in
the kernel; bfloat16 and float8 chunks are first widened to float32, exactly);
without numba (or with ``DUMPDB_METRICS_KERNEL=numpy``) the numpy form below does the same
arithmetic. Both sum in the kernel's fixed 8-lane order, never through BLAS, whose order
depends on the processor; the last bits this moves against dumpdb's earlier np.dot/pairwise
sums, and why the order matches msprobe's CSVs, are in that module's docstring.

Memory: the tensors are read in chunks of ``chunk`` elements (two passes); every
temporary is O(chunk): four float64 work arrays allocated once per call plus a few
chunk-sized masks and float32/longdouble copies (peak measured at 5.5 x 8 x ``chunk``
bytes: 176 MiB for the default 4 Mi elements, whatever the tensor size; the compiled kernel
needs no chunk-sized work array but for the float32 copy of a non-native chunk). Sums, dot
products, maxima and counts are accumulated in float64/int. Arrays that are not
C-contiguous are cut along their leading axes into blocks of at most ``chunk`` elements.

Statistics mode (``stats_sql.py``)
==================================

From the catalog statistics of each side (max, min, mean, l2norm), as msprobe's
statistics compare (``msprobe/core/compare/acc_compare.py`` ``calc_summary_diff`` and
``msprobe/core/compare/utils.py`` ``get_rela_diff_summary_mode``):

``X_diff = target_X - bench_X``; ``X_rel_diff = |X_diff / bench_X|`` as a **fraction**
(msprobe writes the percentage string ``|diff/bench|*100 %``; a fraction is what its
checkers compare against after ``str2float``). A side's value missing -> None; equal
values (both NaN, or the same Inf included) -> diff 0.0; exactly one NaN -> None;
Inf involved -> diff is +-Inf and rel_diff +Inf; ``bench_X == 0`` -> rel_diff None
(``N/A`` of ``get_rela_diff_summary_mode``; the pandas path of 26.2.0 writes ``inf`` when
target is not 0, and ``0`` for equal values, where we also give None if both are 0).
When some ``|diff| / (max(|target|, |bench|) + 1e-10) > 0.5`` the
message asks for a double check (msprobe's warning ``Need double check api
accuracy.``); it does not set a verdict.
These rules are one table, :data:`dumpdb.compare.stats_spec.CASES`: this function and the
DuckDB query of :mod:`dumpdb.compare.stats_sql` are generated from it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import ml_dtypes
import numpy as np

from dumpdb.compare import kernel, registry

# The built-in metrics of the registry (dumpdb.compare.registry), in stored column order.
TENSOR_METRICS = registry.names("tensor", builtin=True)
STAT_METRICS = registry.names("statistics", builtin=True)

STATS = ("max", "min", "mean", "l2norm")

# msprobe CompareConst / Const and msaccucmp ConstManager values.
EPS64 = float(np.finfo(np.float64).eps)     # Const.FLOAT_EPSILON, ConstManager.FLOAT_EPSILON
EPS32 = float(np.finfo(np.float32).eps)     # alg_KullbackLeiblerDivergence.FLOAT_EPSILON
THOUSAND_RATIO_THRESHOLD = 0.001
FIVE_THOUSAND_RATIO_THRESHOLD = 0.005

# Elements per pass: about 10 float64 work arrays of this size stay in the CPU cache
# (measured: 64 Ki runs ~25 % faster than 1 Mi and bounds scratch to ~5 MiB).
DEFAULT_CHUNK = 1 << 16

# Messages (also matched by dumpdb.compare.verdict).
MSG_EMPTY = "empty tensor: nothing to compare"
MSG_SHAPE = "shape mismatch: target {t} vs bench {b}; metrics not computed"
MSG_SCALAR = "0-d tensor: cosine, euc_dist and the error ratios are not computed"
MSG_ONE_ELEMENT = "tensor of one element: cosine is not computed"
MSG_NAN_INF_MISMATCH = "nan/inf positions differ between target and bench; metrics not computed"
MSG_NAN_INF_ZEROED = "nan/inf at the same positions in target and bench were set to 0 before computing"
MSG_DTYPE = "dtype mismatch: target {t} vs bench {b}; metrics computed anyway"
MSG_COMPLEX = "complex tensors are not supported; metrics not computed"
MSG_COS_TARGET_ZERO = "cosine undefined: target is all zero"
MSG_COS_BENCH_ZERO = "cosine undefined: bench is all zero"
MSG_METRIC_NAN = "{name} is NaN (the data holds nan/inf)"
MSG_STATS_MAGNITUDE = ("statistics differ by more than half their magnitude ({names}); "
                       "double-check accuracy")

# msprobe CompareConst.FLOAT_TYPE: these dtypes keep their precision in get_relative_err.
_MSPROBE_FLOAT_TYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64),
                        np.dtype(np.longdouble))


def _is_ml_float(dtype: np.dtype) -> bool:
    """True for ml_dtypes floating types (bfloat16, float8_*, float6_*, float4_*)."""
    if dtype.kind != "V":
        return False
    try:
        ml_dtypes.finfo(dtype)
    except (ValueError, TypeError, KeyError):
        return False
    return True


def _check_dtype(dtype: np.dtype) -> str | None:
    """None if supported, a message for complex; TypeError for non-numeric dtypes."""
    if dtype.kind == "c":
        return MSG_COMPLEX
    if dtype.kind in "biuf" or _is_ml_float(dtype):
        return None
    raise TypeError(f"tensor_metrics: unsupported dtype {dtype} (numeric dtypes only)")


def _rel_dtype(dtype: np.dtype) -> np.dtype:
    """Dtype a side has when msprobe's get_relative_err picks the computation type."""
    if dtype in _MSPROBE_FLOAT_TYPES:
        return dtype
    if _is_ml_float(dtype):
        return np.dtype(np.float32)
    return np.dtype(np.float64)


def _may_hold_nan_inf(dtype: np.dtype) -> bool:
    return dtype.kind == "f" or _is_ml_float(dtype)


def _blocks(shape: tuple[int, ...], chunk: int, prefix: tuple = ()) -> Iterator[tuple]:
    """Index tuples cutting an array of ``shape`` (no zero dimension) into blocks of
    consecutive C-order elements, each of at most ``chunk`` elements."""
    inner = math.prod(shape[1:])
    if inner <= chunk:
        step = max(1, chunk // max(inner, 1))
        for i in range(0, shape[0], step):
            yield prefix + (slice(i, min(i + step, shape[0])),)
    else:
        for i in range(shape[0]):
            yield from _blocks(shape[1:], chunk, prefix + (i,))


def _chunk_pairs(t: np.ndarray, b: np.ndarray, chunk: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Aligned 1-D chunks (original dtypes) of two arrays of the same shape, C order."""
    if t.ndim == 0:
        yield t.reshape(1), b.reshape(1)
        return
    if t.flags.c_contiguous and b.flags.c_contiguous:
        ft, fb = t.reshape(-1), b.reshape(-1)
        for s in range(0, ft.size, chunk):
            yield ft[s:s + chunk], fb[s:s + chunk]
        return
    for idx in _blocks(t.shape, chunk):
        yield t[idx].reshape(-1), b[idx].reshape(-1)


class _Buffers:
    """float64 work arrays of ``chunk`` elements, allocated once per call and reused."""

    def __init__(self, chunk: int, total: int) -> None:
        n = min(chunk, total)
        self.x = np.empty(n, np.float64)
        self.y = np.empty(n, np.float64)
        self.w1 = np.empty(n, np.float64)
        self.w2 = np.empty(n, np.float64)
        self.m1 = np.empty(n, np.bool_)
        self.m2 = np.empty(n, np.bool_)
        self._eps32: np.ndarray | None = None
        self._rel: dict[np.dtype, tuple[np.ndarray, ...]] = {}  # (n, b, extra) of each dtype

    def rel(self, dtype: np.dtype, size: int, extra: bool = False):
        """Work arrays of ``dtype`` (msprobe's relative-error type, usually float32):
        the pair (n, b), or with ``extra`` a third one."""
        arrays = self._rel.get(dtype)
        if arrays is None:
            arrays = self._rel[dtype] = tuple(np.empty(self.x.size, dtype) for _ in range(3))
        if extra:
            return arrays[2][:size]
        return arrays[0][:size], arrays[1][:size]

    def eps32(self, size: int) -> np.ndarray:
        """EPS32 in every element: np.maximum against an array runs ~2x its speed against a
        scalar (numpy 2's scalar path; the same exact maximum)."""
        if self._eps32 is None:
            self._eps32 = np.full(self.x.size, EPS32)
        return self._eps32[:size]

    def load(self, tc: np.ndarray, bc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The chunk pair as float64 (bool -> 0/1) in the x/y buffers."""
        x, y = self.x[:tc.size], self.y[:bc.size]
        np.copyto(x, tc, casting="unsafe")
        np.copyto(y, bc, casting="unsafe")
        return x, y


class _Acc:
    """float64 accumulators of the second pass."""

    def __init__(self) -> None:
        self.dot = self.xx = self.yy = self.dd = self.abs_sum = 0.0
        self.max_abs = -math.inf
        self.max_rel = -math.inf
        self.cnt1 = self.cnt5 = 0
        self.acc_rel = 0.0
        self.kl_sx = self.kl_sy = self.kl_t = 0.0


def tensor_metrics(target: np.ndarray, bench: np.ndarray, chunk: int = DEFAULT_CHUNK,
                   ranges: tuple[float, float, float, float] | None = None,
                   ) -> tuple[dict[str, float | None], str | None]:
    """All :data:`TENSOR_METRICS` of one tensor pair (formulas: module docstring).

    ``target`` and ``bench`` are numpy arrays (any shape, any numeric dtype: bool,
    integers, float16/32/64, ml_dtypes bfloat16/float8); they are never modified and
    need not be contiguous. ``chunk`` (>= 1) is the number of elements processed at a
    time: extra memory is O(chunk) (about 5.5 float64 arrays of ``chunk`` elements)
    whatever the tensor size.

    ``ranges`` = (target min, target max, bench min, bench max), when the caller
    knows both tensors hold no NaN/Inf and their exact extremes (dumpdb's catalog
    statistics): the first pass over the data (NaN/Inf positions, min/max for KL)
    is then skipped, which halves the reading and conversion work.

    Returns ``(metrics, err_message)``: ``metrics`` maps every name of
    :data:`TENSOR_METRICS` to a Python float (may be +-inf) or None where the metric
    does not apply; ``err_message`` is None or "; "-joined notes:

    * target empty, shapes differ, NaN/Inf at different positions, complex dtype:
      every metric None;
    * 0-d: cosine, euc_dist, the two ratios None (others computed, no NaN/Inf
      pre-check); one element: cosine None;
    * NaN/Inf at the same positions: set to 0 on both sides, metrics computed, noted;
    * dtypes differ: metrics computed, noted;
    * cosine with one side all zero, or any metric that comes out NaN: that metric None.

    Raises ValueError if ``chunk < 1`` and TypeError for non-numeric dtypes.
    """
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    t = np.asarray(target)
    b = np.asarray(bench)
    metrics: dict[str, float | None] = dict.fromkeys(TENSOR_METRICS)
    msgs: list[str] = []

    bad = _check_dtype(t.dtype) or _check_dtype(b.dtype)
    if bad:
        return metrics, bad
    if t.size == 0:
        return metrics, MSG_EMPTY
    if t.shape != b.shape:
        return metrics, MSG_SHAPE.format(t=t.shape, b=b.shape)

    scalar = t.ndim == 0
    if scalar:
        msgs.append(MSG_SCALAR)
    elif t.size == 1:
        msgs.append(MSG_ONE_ELEMENT)

    rel = _RelErr(t.dtype, b.dtype)
    known = ranges is not None and not scalar and all(math.isfinite(v) for v in ranges)
    if not scalar and _kernel_takes(rel):
        return _kernel_metrics(t, b, chunk, ranges if known else None, rel, metrics, msgs)

    buf = _Buffers(chunk, t.size)
    # Pass 1: NaN/Inf positions (not for 0-d, as msprobe) and min/max for KL.
    check_invalid = not scalar and (_may_hold_nan_inf(t.dtype) or _may_hold_nan_inf(b.dtype))
    has_invalid = False
    xmin = ymin = math.inf
    xmax = ymax = -math.inf
    if known and ranges is not None:
        xmin, xmax, ymin, ymax = (float(v) for v in ranges)
    with np.errstate(all="ignore"):
        for tc, bc in ([] if known else _chunk_pairs(t, b, chunk)):
            x, y = buf.load(tc, bc)
            if check_invalid:
                xbad, ybad = ~np.isfinite(x), ~np.isfinite(y)
                if xbad.any() or ybad.any():
                    # msprobe's rule: same NaN and same Inf positions (an Inf's sign is not
                    # compared, as in msprobe; dumpdb's "first difference" still sees it)
                    if not (np.array_equal(np.isnan(x), np.isnan(y))
                            and np.array_equal(np.isinf(x), np.isinf(y))):
                        return dict.fromkeys(TENSOR_METRICS), MSG_NAN_INF_MISMATCH
                    has_invalid = True
                    x[xbad] = 0.0
                    y[xbad] = 0.0
            # np.minimum/np.maximum propagate NaN (only 0-d pairs can still hold one).
            xmin, xmax = float(np.minimum(xmin, x.min())), float(np.maximum(xmax, x.max()))
            ymin, ymax = float(np.minimum(ymin, y.min())), float(np.maximum(ymax, y.max()))
    if has_invalid:
        msgs.append(MSG_NAN_INF_ZEROED)
    if t.dtype != b.dtype:
        msgs.append(MSG_DTYPE.format(t=t.dtype, b=b.dtype))

    kl = (xmin, xmax - xmin, ymin, ymax - ymin)

    # Pass 2: every accumulation.
    acc = _Acc()
    with np.errstate(all="ignore"):
        for tc, bc in _chunk_pairs(t, b, chunk):
            x, y = buf.load(tc, bc)
            if has_invalid:
                xbad = ~np.isfinite(x)  # same positions on both sides (pass 1)
                x[xbad] = 0.0
                y[xbad] = 0.0
            _accumulate(acc, x, y, tc, bc, rel, kl, buf)

    _finish(metrics, msgs, acc, t.size, scalar)
    return metrics, "; ".join(msgs) if msgs else None


def _kernel_takes(rel: _RelErr) -> bool:
    """True when the compiled kernel computes this dtype pair (msprobe's relative-error type
    float32 or float64; a longdouble side stays with numpy)."""
    return kernel.AVAILABLE and rel.rt in (np.dtype(np.float32), np.dtype(np.float64))


def _native(a: np.ndarray) -> np.ndarray:
    """A 1-D chunk as the kernel reads it (kernel.NATIVE): float16 and the ml_dtypes floats as
    float32, integers and bool as float64 (both exact, as buf.load widens them), float32 and
    float64 unchanged."""
    if a.dtype in kernel.NATIVE:
        return a
    if a.dtype.kind in "biu":
        return a.astype(np.float64)
    if a.dtype == np.float16:  # numpy's cast is a scalar loop (npy_halfbits_to_floatbits): 4 % of a compare
        out = np.empty(a.size, np.float32)
        kernel.compiled().half_to_float32(np.ascontiguousarray(a).reshape(-1).view(np.uint16), out, out.view(np.uint32))
        return out
    return a.astype(np.float32)


def _kernel_side(a: np.ndarray) -> np.ndarray:
    """A 1-D chunk as the kernel's metric pass (kernel.chunk_rows) reads it: float16 as its
    uint16 bits, which the kernel widens block by block in its cache-sized scratch
    (kernel._widen_any: no chunk-sized float32 copy, whose allocation and extra pass cost
    0.2-0.5 CPU s on the 3 GB fp16 Transformer run), any other dtype as :func:`_native`."""
    if a.dtype == np.float16:
        return np.ascontiguousarray(a).reshape(-1).view(np.uint16)
    return _native(a)


def _kernel_parts(t: np.ndarray, b: np.ndarray, chunk: int,
                  halves: bool = False) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
    """``(x, y, part_chunk)``: 1-D runs of the pair in C order that the kernel cuts into chunks
    of ``part_chunk`` elements; the whole pair at once when both are C-contiguous and of a
    kernel dtype, else :func:`_chunk_pairs`' chunks one by one (converted). ``halves``: float16
    as its uint16 bits (:func:`_kernel_side`: for kernel.chunk_rows, not kernel.scan)."""
    side = _kernel_side if halves else _native
    kinds = kernel.NATIVE | {np.dtype(np.float16)} if halves else kernel.NATIVE
    if t.flags.c_contiguous and b.flags.c_contiguous and t.dtype in kinds and b.dtype in kinds:
        yield side(t.reshape(-1)), side(b.reshape(-1)), chunk
        return
    for tc, bc in _chunk_pairs(t, b, chunk):
        yield side(tc), side(bc), max(tc.size, 1)


def _kernel_rows(x: np.ndarray, y: np.ndarray, part_chunk: int, zero_invalid: bool, rel: _RelErr,
                 kl: tuple[float, float, float, float]) -> np.ndarray:
    """kernel.chunk_rows of one part: a ``(n_chunks, 13)`` float64 array."""
    rows = np.empty((-(-x.size // part_chunk), len(kernel.FIELDS)))
    xmin, xrange_, ymin, yrange = kl
    kernel.compiled().chunk_rows(x, y, part_chunk, rows, zero_invalid, rel.rt == np.float32, float(rel.eps),
                      float(THOUSAND_RATIO_THRESHOLD), float(FIVE_THOUSAND_RATIO_THRESHOLD),
                      xmin, xrange_, ymin, yrange)
    return rows


def _acc_of(a: np.ndarray) -> _Acc:
    """An :class:`_Acc` from the kernel's folded accumulators (kernel.FIELDS order)."""
    acc = _Acc()
    (acc.dot, acc.xx, acc.yy, acc.dd, acc.abs_sum, acc.max_abs, acc.max_rel, cnt1, cnt5, acc.acc_rel,
     acc.kl_sx, acc.kl_sy, acc.kl_t) = a.tolist()
    acc.cnt1, acc.cnt5 = int(cnt1), int(cnt5)
    return acc


def _kernel_metrics(t: np.ndarray, b: np.ndarray, chunk: int, ranges, rel: _RelErr,
                    metrics: dict[str, float | None], msgs: list[str]):
    """tensor_metrics of a pair (at least 1-d, checks passed) by the compiled kernel."""
    has_invalid = False
    if ranges is None:
        check_invalid = _may_hold_nan_inf(t.dtype) or _may_hold_nan_inf(b.dtype)
        xmin = ymin = math.inf
        xmax = ymax = -math.inf
        for x, y, _ in _kernel_parts(t, b, chunk):
            status, x0, x1, y0, y1 = kernel.compiled().scan(x, y, check_invalid)
            if status == 2:
                return dict.fromkeys(TENSOR_METRICS), MSG_NAN_INF_MISMATCH
            has_invalid = has_invalid or status == 1
            xmin, xmax, ymin, ymax = min(xmin, x0), max(xmax, x1), min(ymin, y0), max(ymax, y1)
    else:
        xmin, xmax, ymin, ymax = (float(v) for v in ranges)
    if has_invalid:
        msgs.append(MSG_NAN_INF_ZEROED)
    if t.dtype != b.dtype:
        msgs.append(MSG_DTYPE.format(t=t.dtype, b=b.dtype))
    kl = (xmin, xmax - xmin, ymin, ymax - ymin)
    acc = kernel.new_acc()
    for x, y, part_chunk in _kernel_parts(t, b, chunk, halves=True):
        kernel.compiled().fold_rows(acc, _kernel_rows(x, y, part_chunk, has_invalid, rel, kl))
    _finish(metrics, msgs, _acc_of(acc), t.size, False)
    return metrics, "; ".join(msgs) if msgs else None


class _RelErr:
    """msprobe get_relative_err's computation type and constants for a dtype pair."""

    def __init__(self, tdt: np.dtype, bdt: np.dtype) -> None:
        self.rt = np.result_type(_rel_dtype(tdt), _rel_dtype(bdt), np.float32)
        self.eps = np.finfo(self.rt).eps
        # numpy 2 compares an rt array with a Python float in rt (NEP 50), as msprobe does
        self.thr1 = self.rt.type(THOUSAND_RATIO_THRESHOLD)
        self.thr5 = self.rt.type(FIVE_THOUSAND_RATIO_THRESHOLD)
        # a longdouble side must not go through float64
        ld = np.dtype(np.longdouble)
        self.from_source = self.rt == ld and ld != np.dtype(np.float64) and ld in (tdt, bdt)


def _accumulate(acc: _Acc, x: np.ndarray, y: np.ndarray, tc: np.ndarray, bc: np.ndarray,
                rel: _RelErr, kl: tuple[float, float, float, float], buf: _Buffers) -> None:
    """One chunk into the accumulators. Overwrites x, y and the work buffers."""
    w1, w2 = buf.w1[:x.size], buf.w2[:x.size]

    # msprobe cosine / euc_dist / max_abs_err; msaccucmp mean_abs_err / rmse / rel_euc_dist.
    # Sums in dumpdb.compare.kernel's lane order (not np.dot: its BLAS order depends on the CPU).
    acc.dot += _lane_dot(x, y, w1)
    acc.xx += _lane_dot(x, x, w1)
    acc.yy += _lane_dot(y, y, w1)
    d = np.subtract(x, y, out=w1)
    acc.dd += _lane_dot(d, d, w2)
    np.abs(d, out=d)
    acc.abs_sum += kernel.lane_sum(d)
    acc.max_abs = float(np.maximum(acc.max_abs, d.max()))  # NaN propagates

    # msprobe get_relative_err: in rt, eps added to both sides where bench == 0.
    if rel.rt == np.float64:
        n, bb = w1, w2
        np.copyto(n, x)
        np.copyto(bb, y)
    elif rel.from_source:
        n, bb = tc.astype(rel.rt), bc.astype(rel.rt)
        nbad = ~np.isfinite(n)
        n[nbad] = 0
        bb[nbad] = 0
    else:
        n, bb = buf.rel(rel.rt, x.size)
        np.copyto(n, x, casting="unsafe")  # exact: x holds the source values widened
        np.copyto(bb, y, casting="unsafe")
    # eps added where bench == 0, as arithmetic on the 0/1 mask: numpy's masked
    # paths (fancy indexing, where=) run ~25x slower, and ReLU outputs have dense zero masks
    zero = np.equal(bb, 0, out=buf.m1[:x.size])
    if zero.any():
        add = np.multiply(zero, rel.eps, out=buf.rel(rel.rt, x.size, extra=True))
        n += add
        bb += add
    n -= bb
    n /= bb
    r = np.abs(n, out=n)
    acc.max_rel = float(np.maximum(acc.max_rel, r.max()))  # NaN propagates
    acc.cnt1 += int(np.count_nonzero(np.less(r, rel.thr1, out=zero)))
    acc.cnt5 += int(np.count_nonzero(np.less(r, rel.thr5, out=zero)))
    del n, bb, r, zero

    # msaccucmp relative errors: np.where(|y| > eps64, |x/y - 1|, 0) (a NaN bench, 0-d
    # only, counts 0). np.where is a vectorised select; masked assignment is not.
    valid = np.greater(np.abs(y, out=w2), EPS64, out=buf.m1[:x.size])
    if valid.all():
        q = np.divide(x, y, out=w1)
        q -= 1.0
        np.abs(q, out=q)
    elif x.size > 1 and not np.isnan(y).any():
        # y + 1 where |y| <= eps: a finite quotient there, zeroed by the mask after
        den = np.add(y, np.logical_not(valid, out=buf.m2[:x.size]), out=w2)
        q = np.divide(x, den, out=w1)
        q -= 1.0
        np.abs(q, out=q)
        q *= valid
    else:  # 0-d or a NaN bench: the exact np.where form
        q = np.divide(x, np.where(valid, y, 1.0), out=w1)
        q -= 1.0
        np.abs(q, out=q)
        q = np.where(valid, q, 0.0)
    acc.acc_rel += kernel.lane_sum(q)

    # msaccucmp KL: min-max normalise with the global min/max, clamp at eps32 (in place).
    xmin, xrange_, ymin, yrange = kl
    if xrange_ != 0:
        x -= xmin
        x /= xrange_
    if yrange != 0:
        y -= ymin
        y /= yrange
    eps32 = buf.eps32(x.size)
    np.maximum(x, eps32, out=x)
    np.maximum(y, eps32, out=y)
    acc.kl_sx += kernel.lane_sum(x)
    acc.kl_sy += kernel.lane_sum(y)
    ratio = kernel.log_numpy(np.divide(x, y, out=w1))
    acc.kl_t += _lane_dot(x, ratio, w2)


def _lane_dot(u: np.ndarray, v: np.ndarray, out: np.ndarray) -> float:
    """sum(u * v) in the kernel's order (products rounded first); ``out`` is scratch."""
    return kernel.lane_sum(np.multiply(u, v, out=out))


def _finish(metrics: dict, msgs: list[str], acc: _Acc, n_total: int, scalar: bool) -> None:
    one_element = n_total == 1
    with np.errstate(all="ignore"):
        # cosine (msprobe): unsupported for 0-d and one element.
        if not scalar and not one_element:
            a_norm, b_norm = math.sqrt(acc.xx), math.sqrt(acc.yy)
            if a_norm <= EPS64 and b_norm <= EPS64:
                metrics["cosine"] = 1.0
            elif a_norm <= EPS64:
                msgs.append(MSG_COS_TARGET_ZERO)
            elif b_norm <= EPS64:
                msgs.append(MSG_COS_BENCH_ZERO)
            else:
                cos = float(np.float64(acc.dot) / (np.float64(a_norm) * np.float64(b_norm)))
                metrics["cosine"] = cos if math.isnan(cos) else min(1.0, max(-1.0, cos))
        if not scalar:
            metrics["euc_dist"] = math.sqrt(acc.dd)
            metrics["one_thousandth_err_ratio"] = acc.cnt1 / n_total
            metrics["five_thousandths_err_ratio"] = acc.cnt5 / n_total
        metrics["max_abs_err"] = acc.max_abs
        metrics["max_rel_err"] = acc.max_rel

        # msaccucmp
        metrics["mean_abs_err"] = acc.abs_sum / n_total
        metrics["rmse"] = math.sqrt(acc.dd / n_total)
        metrics["rel_euc_dist"] = 0.0 if math.sqrt(acc.yy) <= EPS64 else math.sqrt(acc.dd / acc.yy)
        metrics["accumulated_rel_err"] = acc.acc_rel
        metrics["mean_rel_err"] = acc.acc_rel / n_total
        kl = float(np.float64(acc.kl_t) / np.float64(acc.kl_sx)
                   + np.log(np.float64(acc.kl_sy) / np.float64(acc.kl_sx)))
        metrics["kl_divergence"] = 0.0 if abs(kl) < EPS64 else kl

    for name in TENSOR_METRICS:
        v = metrics[name]
        if v is not None and math.isnan(v):
            metrics[name] = None
            msgs.append(MSG_METRIC_NAN.format(name=name))


# ---------------------------------------------------------------------------
# One large pair on several threads (dumpdb.compare.engine's large-pair path)
# ---------------------------------------------------------------------------

# Chunks a segment of a split pair holds: 16 x 64 Ki elements, ~5-10 ms of work a task.
SEGMENT_CHUNKS = 16


class SplitPair:
    """:func:`tensor_metrics` of one pair cut into segments that may run at the same time
    (worker threads sharing the two arrays: nothing is copied or read twice).

    Made by :func:`split_pair` for a pair whose ``ranges`` are known (no first pass: see
    :func:`tensor_metrics`). ``tasks()`` are callables, one per segment of
    ``SEGMENT_CHUNKS`` chunks, each returning its chunks' accumulators (one small object
    per chunk, :func:`_accumulate` on a fresh :class:`_Acc`); :meth:`finish` folds them in
    chunk order with the additions and maxima tensor_metrics makes chunk after chunk, so
    the result is tensor_metrics' bit for bit (a float64 sum that starts at +0.0 never is
    -0.0, so adding a chunk's ``0.0 + v`` equals adding ``v``; a maximum of one chunk is its
    ``max()``). Memory: per running task the O(chunk) work buffers of tensor_metrics.
    """

    def __init__(self, t: np.ndarray, b: np.ndarray, ranges: tuple[float, float, float, float],
                 chunk: int, msgs: list[str]) -> None:
        self.size = t.size
        self.msgs = msgs
        self.chunk = chunk
        self.rel = _RelErr(t.dtype, b.dtype)
        xmin, xmax, ymin, ymax = (float(v) for v in ranges)
        self.kl = (xmin, xmax - xmin, ymin, ymax - ymin)
        self.chunks = list(_chunk_pairs(t, b, chunk))
        self.compiled = _kernel_takes(self.rel)

    def tasks(self, segment: int | None = None) -> list:
        """One callable per ``segment`` (default :data:`SEGMENT_CHUNKS`) consecutive chunks
        (at least one task)."""
        segment = segment or SEGMENT_CHUNKS
        return [lambda s=s: self._segment(s, s + segment) for s in range(0, len(self.chunks), segment)]

    def _segment(self, start: int, end: int) -> list[_Acc] | np.ndarray:
        if self.compiled:  # one row of kernel accumulators per chunk
            return np.concatenate([_kernel_rows(_kernel_side(tc), _kernel_side(bc), max(tc.size, 1), False, self.rel,
                                                self.kl)
                                   for tc, bc in self.chunks[start:end]])
        buf = _Buffers(self.chunk, self.size)
        found = []
        with np.errstate(all="ignore"):
            for tc, bc in self.chunks[start:end]:
                x, y = buf.load(tc, bc)
                acc = _Acc()
                _accumulate(acc, x, y, tc, bc, self.rel, self.kl, buf)
                found.append(acc)
        return found

    def finish(self, parts: list) -> tuple[dict[str, float | None], str | None]:
        """``(metrics, err_message)`` from every task's result, in task order."""
        acc = _Acc()
        if self.compiled:
            folded = kernel.new_acc()
            for part in parts:
                kernel.compiled().fold_rows(folded, part)
            acc = _acc_of(folded)
            parts = []
        for part in parts:
            for c in part:
                acc.dot += c.dot
                acc.xx += c.xx
                acc.yy += c.yy
                acc.dd += c.dd
                acc.abs_sum += c.abs_sum
                acc.max_abs = float(np.maximum(acc.max_abs, c.max_abs))  # NaN propagates
                acc.max_rel = float(np.maximum(acc.max_rel, c.max_rel))
                acc.cnt1 += c.cnt1
                acc.cnt5 += c.cnt5
                acc.acc_rel += c.acc_rel
                acc.kl_sx += c.kl_sx
                acc.kl_sy += c.kl_sy
                acc.kl_t += c.kl_t
        metrics: dict[str, float | None] = dict.fromkeys(TENSOR_METRICS)
        msgs = list(self.msgs)
        _finish(metrics, msgs, acc, self.size, False)
        return metrics, "; ".join(msgs) if msgs else None


def split_pair(target: np.ndarray, bench: np.ndarray, ranges: tuple[float, float, float, float] | None,
               chunk: int = DEFAULT_CHUNK) -> SplitPair | None:
    """A :class:`SplitPair` for ``target``/``bench``, or None when :func:`tensor_metrics`
    must take the pair whole: ``ranges`` unknown or not finite (the first pass looks for
    NaN/Inf and the extremes), a 0-d pair, or one its checks settle (complex or
    non-numeric dtype, empty, shapes that differ). ``ranges`` as in tensor_metrics: the
    caller vouches that neither side holds NaN/Inf and that these are the exact extremes.
    Raises ValueError if ``chunk < 1``."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    t, b = np.asarray(target), np.asarray(bench)
    if ranges is None or not all(math.isfinite(v) for v in ranges) or t.ndim == 0:
        return None
    try:
        if _check_dtype(t.dtype) or _check_dtype(b.dtype):
            return None
    except TypeError:
        return None
    if t.size == 0 or t.shape != b.shape:
        return None
    msgs = [MSG_ONE_ELEMENT] if t.size == 1 else []
    if t.dtype != b.dtype:
        msgs.append(MSG_DTYPE.format(t=t.dtype, b=b.dtype))
    return SplitPair(t, b, ranges, chunk, msgs)


# ---------------------------------------------------------------------------
# Identical payloads and many small pairs at once (dumpdb.compare.engine's fast paths)
# ---------------------------------------------------------------------------

def identical_metrics(shape: tuple[int, ...] | list[int], dtype: np.dtype | str,
                      nonfinite: int) -> tuple[dict[str, float | None], str | None] | None:
    """:func:`tensor_metrics` of a pair whose two payloads are byte for byte the same
    (same content hash, dtype and shape), from the definitions, without reading them.

    ``shape``/``dtype`` of either side, ``nonfinite`` the count of NaN and +-Inf elements
    (the catalog's ``nan_count + pos_inf_count + neg_inf_count``). x == y everywhere, so
    (module docstring's formulas; msprobe's rules for the zero and NaN cases):
    cosine 1.0 (msprobe: both norms <= eps64 also give 1.0, and msprobe shows any cosine
    above 0.9999 rounded to 6 decimals, so the 1 - 2**-52 that float64 rounding can give
    for ``dot(x, x) / |x|**2`` is 1.0 there too), euc_dist, max_abs_err, max_rel_err
    (``eps - eps``, zero where bench is 0), mean_abs_err, rmse, rel_euc_dist,
    accumulated/mean relative error and kl_divergence 0.0, both error ratios 1.0 (every
    relative error is 0 < 0.001). NaN/Inf are then at the same positions on both sides:
    msprobe zeroes them first (message). 0-d, one element, empty and complex pairs keep
    :func:`tensor_metrics`' messages and Nones.

    Returns ``(metrics, err_message)`` as :func:`tensor_metrics`, or None where the
    definition does not settle it (a 0-d NaN/Inf: msprobe then computes ``x - x`` = NaN;
    non-numeric dtype): the caller computes those.
    """
    dtype = np.dtype(dtype)
    try:
        bad = _check_dtype(dtype)
    except TypeError:
        return None
    metrics: dict[str, float | None] = dict.fromkeys(TENSOR_METRICS)
    if bad:
        return metrics, bad
    size = math.prod(shape)
    if size == 0:
        return metrics, MSG_EMPTY
    scalar = len(shape) == 0
    if scalar and nonfinite:
        return None
    msgs = [MSG_SCALAR] if scalar else ([MSG_ONE_ELEMENT] if size == 1 else [])
    if nonfinite and not scalar:
        msgs.append(MSG_NAN_INF_ZEROED)
    zero = ("max_abs_err", "max_rel_err", "mean_abs_err", "rmse", "rel_euc_dist", "accumulated_rel_err",
            "mean_rel_err", "kl_divergence")
    metrics.update(dict.fromkeys(zero, 0.0))
    if not scalar:
        metrics.update(euc_dist=0.0, one_thousandth_err_ratio=1.0, five_thousandths_err_ratio=1.0)
        if size > 1:
            metrics["cosine"] = 1.0
    return metrics, "; ".join(msgs) if msgs else None


def batchable(dtype: np.dtype, shape: tuple[int, ...] | list[int]) -> bool:
    """True when a pair of this dtype and shape (both sides) may go through
    :func:`tensor_metrics_batch`: at least 1-d, two elements or more, a supported
    non-complex dtype. (NaN/Inf are checked there: such pairs are computed one by one.)"""
    if len(shape) == 0 or math.prod(shape) < 2 or dtype.kind == "c" or dtype == np.dtype(np.longdouble):
        return False
    try:
        return _check_dtype(dtype) is None
    except TypeError:
        return False


class MetricColumns:
    """Tensor metrics of ``n`` pairs as columns (what :func:`tensor_metrics_batch` returns);
    also a sequence of ``(metrics, err_message)`` per pair, as :func:`tensor_metrics` gives.

    ``values[name]``: float64 array of length ``n`` per :data:`TENSOR_METRICS` name, NaN
    where :func:`tensor_metrics` gives None (a NaN metric is None there: every NaN becomes a
    message); ``message``: object array of the ``err_message`` strings (None where none).
    """

    def __init__(self, n: int) -> None:
        self.values = {name: np.full(n, np.nan) for name in TENSOR_METRICS}
        self.message = np.full(n, None, dtype=object)

    def put(self, i: int, metrics: dict[str, float | None], message: str | None) -> None:
        """Pair ``i``'s metrics as :func:`tensor_metrics` returns them."""
        for name in TENSOR_METRICS:
            v = metrics.get(name)
            self.values[name][i] = np.nan if v is None else v
        self.message[i] = message

    def __len__(self) -> int:
        return len(self.message)

    def __getitem__(self, i: int) -> tuple[dict[str, float | None], str | None]:
        """Pair ``i`` as :func:`tensor_metrics` returns it (None for NaN)."""
        return ({name: None if math.isnan(v := float(self.values[name][i])) else v for name in TENSOR_METRICS},
                self.message[i])


def tensor_metrics_batch(targets: list[np.ndarray], benches: list[np.ndarray]) -> MetricColumns:
    """:func:`tensor_metrics` of many (small) pairs at once: ``targets[i]`` vs ``benches[i]``.

    The same results as :func:`tensor_metrics` on each pair, bit for bit (the compiled
    kernel folds each pair's chunks as tensor_metrics does; the numpy form for pairs of at
    most :data:`DEFAULT_CHUNK` elements, one chunk there; tested): the pairs of one dtype
    pair are concatenated and converted to float64 once, every element-wise step of the
    module docstring runs once over the concatenation, maxima and counts are segment
    reductions and sums/dot products the same numpy calls per segment, so a pair costs
    about ten short calls on slices instead of ~60 numpy calls on its own arrays.
    Memory: about ten float64 arrays of the concatenated size (the engine batches
    ``BATCH_ELEMENTS``). Pairs that are not
    :func:`batchable` (0-d, one element, complex, shapes that differ) or hold a NaN/Inf on
    either side go through :func:`tensor_metrics` one by one (its messages, its rules).

    Returns a :class:`MetricColumns` (one entry per pair, in order; ``result[i]`` is pair
    ``i``'s ``(metrics, err_message)``): no dict per pair but for the pairs computed one by
    one. Raises TypeError for a non-numeric dtype (as :func:`tensor_metrics`).
    """
    if len(targets) != len(benches):
        raise ValueError("tensor_metrics_batch: targets and benches differ in length")
    out = MetricColumns(len(targets))
    groups: dict[tuple[np.dtype, np.dtype], list[int]] = {}
    fits: dict[tuple, bool] = {}  # batchable() per (target dtype, bench dtype, shape)

    def both(t: np.ndarray, b: np.ndarray) -> bool:
        key = (t.dtype, b.dtype, t.shape)
        found = fits.get(key)
        if found is None:
            found = fits[key] = batchable(t.dtype, t.shape) and batchable(b.dtype, b.shape)
        return found

    for i, (t, b) in enumerate(zip(targets, benches)):
        if t.shape == b.shape and both(t, b):
            groups.setdefault((t.dtype, b.dtype), []).append(i)
        else:
            out.put(i, *tensor_metrics(t, b))
    for (tdt, bdt), idx in groups.items():
        _batch_group(targets, benches, idx, tdt, bdt, out)
    return out


def _batch_group(targets: list[np.ndarray], benches: list[np.ndarray], idx: list[int],
                 tdt: np.dtype, bdt: np.dtype, out: MetricColumns) -> None:
    """The pairs ``idx`` (all of dtypes ``tdt``/``bdt``) into ``out``."""
    sizes = np.fromiter((targets[i].size for i in idx), np.int64, len(idx))
    starts = np.zeros(len(idx), np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    x = np.empty(int(sizes.sum()), np.float64)
    y = np.empty_like(x)
    np.copyto(x, np.concatenate([targets[i].reshape(-1) for i in idx]), casting="unsafe")
    np.copyto(y, np.concatenate([benches[i].reshape(-1) for i in idx]), casting="unsafe")
    if (_may_hold_nan_inf(tdt) or _may_hold_nan_inf(bdt)) and not _kernel_takes(_RelErr(tdt, bdt)):
        finite = np.isfinite(x)
        finite &= np.isfinite(y)
        good = np.logical_and.reduceat(finite, starts)
        if not good.all():
            for k in np.flatnonzero(~good).tolist():
                out.put(idx[k], *tensor_metrics(targets[idx[k]], benches[idx[k]]))
            keep = [i for i, g in zip(idx, good.tolist()) if g]
            if keep:
                _batch_group(targets, benches, keep, tdt, bdt, out)
            return
    rel = _RelErr(tdt, bdt)
    if _kernel_takes(rel):
        sums, status = _kernel_segments(x, y, starts, sizes, rel)
        if status.any():  # NaN/Inf: computed one by one (tensor_metrics' messages and rules)
            for k in np.flatnonzero(status).tolist():
                out.put(idx[k], *tensor_metrics(targets[idx[k]], benches[idx[k]]))
            keep = [i for i, st in zip(idx, status.tolist()) if not st]
            if keep:
                _batch_group(targets, benches, keep, tdt, bdt, out)
            return
    else:
        with np.errstate(all="ignore"):
            sums = _segment_sums(x, y, starts, sizes, rel)
    dtype_msg = MSG_DTYPE.format(t=tdt, b=bdt) if tdt != bdt else None
    with np.errstate(all="ignore"):
        columns, notes = _finish_columns(sums, sizes)
    at = np.asarray(idx, np.int64)
    for name in TENSOR_METRICS:  # NaN only where a note says the metric is None
        out.values[name][at] = columns[name]
    out.message[at] = dtype_msg
    for k, msgs in notes.items():
        out.message[idx[k]] = "; ".join([dtype_msg, *msgs] if dtype_msg else msgs) or None


def _finish_columns(acc: dict[str, np.ndarray], sizes: np.ndarray) -> tuple[dict[str, np.ndarray], dict]:
    """:func:`_finish` over columns of accumulators (pairs of two elements or more, at
    least 1-d). Returns the metric columns (NaN where the metric is None) and, for the
    rows that need them, their messages (cosine of an all-zero side, NaN metrics)."""
    n = sizes.astype(np.float64)
    a_norm, b_norm = np.sqrt(acc["xx"]), np.sqrt(acc["yy"])
    cos = np.clip(acc["dot"] / (a_norm * b_norm), -1.0, 1.0)  # NaN stays NaN
    a_zero, b_zero = a_norm <= EPS64, b_norm <= EPS64
    cos[a_zero & b_zero] = 1.0
    cos[a_zero ^ b_zero] = np.nan
    kl = acc["kl_t"] / acc["kl_sx"] + np.log(acc["kl_sy"] / acc["kl_sx"])
    kl[np.abs(kl) < EPS64] = 0.0
    cols = {
        "cosine": cos, "euc_dist": np.sqrt(acc["dd"]), "max_abs_err": acc["max_abs"],
        "max_rel_err": acc["max_rel"], "one_thousandth_err_ratio": acc["cnt1"] / n,
        "five_thousandths_err_ratio": acc["cnt5"] / n, "mean_abs_err": acc["abs_sum"] / n,
        "rmse": np.sqrt(acc["dd"] / n), "rel_euc_dist": np.where(b_zero, 0.0, np.sqrt(acc["dd"] / acc["yy"])),
        "accumulated_rel_err": acc["acc_rel"], "mean_rel_err": acc["acc_rel"] / n, "kl_divergence": kl,
    }
    notes: dict[int, list[str]] = {}
    for k in np.flatnonzero(a_zero ^ b_zero).tolist():
        notes[k] = [MSG_COS_TARGET_ZERO if a_zero[k] else MSG_COS_BENCH_ZERO]
    for name in TENSOR_METRICS:
        bad = np.isnan(cols[name])
        if name == "cosine":
            bad &= ~(a_zero ^ b_zero)
        for k in np.flatnonzero(bad).tolist():
            notes.setdefault(k, []).append(MSG_METRIC_NAN.format(name=name))
    for k in np.flatnonzero(a_zero ^ b_zero).tolist():
        notes.setdefault(k, [])
    return cols, notes


def _kernel_segments(x: np.ndarray, y: np.ndarray, starts: np.ndarray, sizes: np.ndarray,
                     rel: _RelErr) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """kernel.segment_rows of the concatenated pairs: the accumulator columns (as
    :func:`_segment_sums`) and each segment's scan status (non-zero: NaN/Inf in it)."""
    rows = np.empty((len(starts), len(kernel.FIELDS)))
    status = np.zeros(len(starts), np.int64)
    kernel.compiled().segment_rows(x, y, starts, sizes, DEFAULT_CHUNK, rows, status, rel.rt == np.float32,
                        float(rel.eps), float(THOUSAND_RATIO_THRESHOLD), float(FIVE_THOUSAND_RATIO_THRESHOLD))
    return {name: rows[:, k] for k, name in enumerate(kernel.FIELDS)}, status


def _segment_sums(x: np.ndarray, y: np.ndarray, starts: np.ndarray, sizes: np.ndarray,
                  rel: _RelErr) -> dict[str, np.ndarray]:
    """Every accumulator of :class:`_Acc` for each segment ``[starts[k], starts[k] + sizes[k])``
    of the float64 arrays x (target) and y (bench): :func:`_accumulate`'s arithmetic on
    the whole concatenation, element-wise results reduced per segment. Overwrites x and y.

    Maxima and counts are segment reductions (``reduceat``: exact in any order). Sums and
    dot products are taken per segment in the kernel's lane order, as :func:`_accumulate`
    takes them on a chunk (``kernel.lane_sum``), so a pair of at most
    :data:`DEFAULT_CHUNK` elements gets the same bits as from :func:`tensor_metrics`
    (msprobe's CSV is compared byte for byte)."""
    bounds = list(zip(starts.tolist(), (starts + sizes).tolist()))
    m = len(bounds)

    def dots(u: np.ndarray, v: np.ndarray) -> np.ndarray:
        return sums(u * v)

    def sums(u: np.ndarray) -> np.ndarray:
        return np.fromiter((kernel.lane_sum(u[i:j]) for i, j in bounds), np.float64, m)

    acc = {"dot": dots(x, y), "xx": dots(x, x), "yy": dots(y, y)}
    d = x - y
    acc["dd"] = dots(d, d)
    np.abs(d, out=d)
    acc["abs_sum"] = sums(d)
    acc["max_abs"] = np.maximum.reduceat(d, starts)

    # msprobe get_relative_err in rt, eps added to both sides where bench == 0
    n, bb = x.astype(rel.rt), y.astype(rel.rt)
    zero = bb == 0
    if zero.any():
        eps = zero * rel.rt.type(rel.eps)
        n += eps
        bb += eps
    n -= bb
    n /= bb
    r = np.abs(n, out=n)
    acc["max_rel"] = np.maximum.reduceat(r, starts).astype(np.float64)
    acc["cnt1"] = np.add.reduceat(r < rel.thr1, starts, dtype=np.int64)
    acc["cnt5"] = np.add.reduceat(r < rel.thr5, starts, dtype=np.int64)
    del n, bb, r, zero

    # msaccucmp relative errors: |x/y - 1| where |y| > eps64, else 0
    valid = np.abs(y) > EPS64
    q = np.divide(x, np.where(valid, y, 1.0), out=d)
    q -= 1.0
    np.abs(q, out=q)
    q *= valid
    acc["acc_rel"] = sums(q)

    # msaccucmp KL: per-segment min-max normalisation, clamp at eps32
    for v, name in ((x, "kl_sx"), (y, "kl_sy")):
        lo = np.minimum.reduceat(v, starts)
        span = np.maximum.reduceat(v, starts) - lo
        flat = span == 0  # left as is (the module docstring's v = x when max == min)
        lo[flat] = 0.0
        span[flat] = 1.0
        v -= np.repeat(lo, sizes)
        v /= np.repeat(span, sizes)
        np.maximum(v, EPS32, out=v)
        acc[name] = sums(v)
    ratio = kernel.log_numpy(np.divide(x, y, out=d))
    acc["kl_t"] = dots(x, ratio)
    return acc
