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
their last bits, because a sum of ``n`` terms taken in another order moves by up to about
``n * 2**-53`` times the sum of the absolute terms. Measured on the MindSpore Transformer pair
(fp16 O2 vs fp32, one step, 2,164 computed pairs; ``make_big_dump.sh``): at most 2e-14
relative on every summed metric; at msprobe's 12 printed decimals 2 of 1,536 cosines and 2 of
1,697 Euclidean distances end one unit apart (values on a rounding boundary, as msprobe's own
print moves between CPUs); ``kl_divergence`` at most 2.4e-13 absolute, which is up to 8.5e-6
relative where the KL is near 1e-8 (its formula subtracts two terms of order 1). Maxima and
counts are exact in any order and unchanged.

``kl_divergence`` takes the logarithm of each ``v_x / v_y`` by fdlibm's formula written out
here (:func:`log_numpy`, :func:`_log_block`: plain IEEE operations, so the same bits on every
CPU and in both forms, and vectorisable; error below 1 ulp, tested against libm). Before, it
was numpy's ``np.log`` (libm's on AVX2, numpy's own vector log with AVX512F): a term moves by at
most an ulp, the KL sum in its last one or two bits.
"""

from __future__ import annotations

import atexit
import importlib.util
import math
import os
import threading
import time
from types import ModuleType

try:
    import fcntl
except ImportError:  # Windows: no flock; each process compiles what it misses, as numba alone does
    fcntl = None  # type: ignore[assignment]

import numpy as np

# Accumulators of one chunk, in the order of a row of the kernel's output.
FIELDS = ("dot", "xx", "yy", "dd", "abs_sum", "max_abs", "max_rel", "cnt1", "cnt5", "acc_rel",
          "kl_sx", "kl_sy", "kl_t")
LANES = 8

# numba is a dependency; the numpy form stays for platforms without a wheel of it. It is
# imported (and the kernel compiled) on the first call of :func:`compiled`, not with this
# module: ``import numba`` takes about a second, which every CLI call that never compares
# tensors would pay.
HAVE_NUMBA = importlib.util.find_spec("numba") is not None
AVAILABLE = HAVE_NUMBA and os.environ.get("DUMPDB_METRICS_KERNEL", "numba") != "numpy"

# dtypes the kernel reads directly; others are converted chunk by chunk first: bfloat16 and
# float8 (and float16 for scan) to float32, integers and bool to float64 (exact but for integers
# beyond 2**53, which every form widens to float64 alike). chunk_rows also takes float16 as its
# uint16 bits (_widen_any). A few compiled signatures, not forty.
NATIVE = frozenset((np.dtype(np.float32), np.dtype(np.float64)))

def _readonly(a: np.ndarray) -> np.ndarray:
    """``a`` as the compiled functions take every input array: 1-D, C-contiguous, aligned (a
    copy only when ``a`` is not) and read-only (``a`` itself when it is all that, else a view:
    the caller's flags are unchanged). numba compiles a signature per array type, and
    writeable, layout and alignment are part of it: a caller's writeable arrays and another's
    read-only ones (a payload read from a buffer) would each compile every kernel function
    again, about a second each."""
    f = a.flags
    if not (f.c_contiguous and f.aligned):
        a = np.ascontiguousarray(a)
        if not a.flags.aligned:  # ascontiguousarray keeps a misaligned contiguous array as it is
            a = a.copy()
    elif not f.writeable and a.ndim == 1:
        return a
    a = a.reshape(-1)  # a new array object (a view, as a is contiguous): flags of its own
    a.flags.writeable = False
    return a


def _empty(dtype) -> np.ndarray:
    a = np.empty(0, dtype)
    a.flags.writeable = False
    return a


# The stand-ins for the two dtypes a side of chunk_rows does not have (_side).
_NONE64, _NONE32, _NONE16 = _empty(np.float64), _empty(np.float32), _empty(np.uint16)


def _side(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """One side of :func:`chunk_rows` as its compiled form takes it, ``(float64, float32,
    uint16, kind)``: the side (:func:`_readonly`; float16 as its uint16 bits) in the slot of
    its dtype, empty arrays in the other two, and ``kind`` 0, 1 or 2 naming the slot
    (:func:`_widen_any`), so that one compiled signature serves every dtype pair. Raises
    ValueError for another dtype."""
    a = _readonly(a)
    code = a.dtype.char
    if code == "d":
        return a, _NONE32, _NONE16, 0
    if code == "f":
        return _NONE64, a, _NONE16, 1
    if code == "H":
        return _NONE64, _NONE32, a, 2
    if code == "e":
        return _NONE64, _NONE32, a.view(np.uint16), 2
    raise ValueError(f"the tensor kernel reads float64, float32 and float16 (or its uint16 bits), not {a.dtype}")


EPS64 = float(np.finfo(np.float64).eps)
EPS32 = float(np.finfo(np.float32).eps)


def _fold(lanes):
    return ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]))


# fdlibm's e_log.c (Sun Microsystems, 1993): log(1 + f) = f - hfsq + s * (hfsq + R), with
# s = f / (2 + f) and R a polynomial in s**2; error below 1 ulp.
LN2_HI = 6.93147180369123816490e-01
LN2_LO = 1.90821492927058770002e-10
LG1, LG2, LG3, LG4 = 6.666666666666735130e-01, 3.999999999940941908e-01, 2.857142874366239149e-01, \
    2.222219843214978396e-01
LG5, LG6, LG7 = 1.818357216161805012e-01, 1.531383769920937332e-01, 1.479819860511658591e-01
SQRT2 = 1.4142135623730951
_MANTISSA = 0x000FFFFFFFFFFFFF
_ONE_BITS = 0x3FF0000000000000
_INF_BITS = 0x7FF0000000000000
# Elements per block of a chunk: the per-element terms of a block (16 float64 rows, 32 KiB) stay in L1.
BLOCK = 256
# Rows of the (WORK_ROWS, BLOCK) float64 scratch of _chunk: 0-8 the summed terms (lane order of
# the sums: dot xx yy dd abs_sum acc_rel kl_sx kl_sy kl_t), 9 the relative errors, 10 v_x / v_y,
# 11 its log, 12 scratch, 13 the mantissas for the log, 14-15 the block's x and y as float64.
WORK_ROWS = 16

# Every loop below is written for LLVM's loop vectoriser (numba compiles with it on; its SLP
# vectoriser is off): one simple loop per step over the block's float64 rows, selects instead
# of branches, no call inside. Vectorising a loop does not change a single rounding (each
# element is computed alone, no fused multiply-add without ``fastmath``); what fixes the
# sums' bits is the lane order of ``_lanes8`` and ``_fold``, which the code spells out.


def _widen(x, out):
    """out[i] = float64(x[i]) (exact)."""
    for i in range(x.shape[0]):
        out[i] = np.float64(x[i])


def _widen_any(x64, x32, x16, kind, b0, m, out, hf, hb):
    """out[:m] = float64 of elements [b0, b0 + m) of one side (exact): ``x64``, ``x32`` or
    ``x16`` as ``kind`` is 0, 1 or 2 (:func:`_side`); float16 bits (``x16``, uint16) are
    widened by :func:`half_to_float32` into ``hf`` (float32 scratch of at least ``m``
    elements; ``hb`` its uint32 view) and then to float64, with no chunk-sized float32 copy
    made first. A run-time choice per block, so one compiled :func:`_chunk` serves every dtype
    pair (a compiled signature per pair cost about a second each of cold compiling)."""
    if kind == 0:
        _widen(x64[b0:b0 + m], out)
    elif kind == 1:
        _widen(x32[b0:b0 + m], out)
    else:
        _half_to_float32(x16[b0:b0 + m], hf[:m], hb[:m])
        _widen(hf[:m], out)


def _zero_invalid(xw, yw, m):
    """NaN/Inf positions of xw set to 0 in xw and yw (the same positions on both sides,
    checked before: msprobe's rule)."""
    for i in range(m):
        ok = np.isfinite(xw[i])
        xw[i] = xw[i] if ok else 0.0
        yw[i] = yw[i] if ok else 0.0


def _terms(xw, yw, m, xmin, xrange, ymin, yrange, t_dot, t_xx, t_yy, t_dd, t_abs, t_q, t_vx, t_vy, ratio):
    """Per-element terms of m elements: products, |d|, msaccucmp's |x/y - 1| (0 where
    |y| <= eps64), the KL's clamped normalised values and their ratio. A range of 0 comes in
    as min 0, range 1 (then (v - 0) / 1 == v exactly: the values as they are)."""
    for i in range(m):
        xv = xw[i]
        yv = yw[i]
        d = xv - yv
        t_dot[i] = xv * yv
        t_xx[i] = xv * xv
        t_yy[i] = yv * yv
        t_dd[i] = d * d
        t_abs[i] = abs(d)
        valid = abs(yv) > 2.220446049250313e-16
        q = abs(xv / (yv if valid else 1.0) - 1.0)
        t_q[i] = q if valid else 0.0
        vx = (xv - xmin) / xrange
        vx = 1.1920928955078125e-07 if vx < 1.1920928955078125e-07 else vx
        vy = (yv - ymin) / yrange
        vy = 1.1920928955078125e-07 if vy < 1.1920928955078125e-07 else vy
        t_vx[i] = vx
        t_vy[i] = vy
        ratio[i] = vx / vy


def _rel32(xw, yw, m, eps, thr1, thr5, rel):
    """msprobe get_relative_err in float32 (eps added to both sides where bench == 0) into
    rel (as float64); returns the counts below thr1 and thr5."""
    eps32 = np.float32(eps)
    t1 = np.float32(thr1)
    t5 = np.float32(thr5)
    c1 = 0
    c5 = 0
    for i in range(m):
        n = np.float32(xw[i])
        b = np.float32(yw[i])
        z = b == 0
        n = n + eps32 if z else n
        b = b + eps32 if z else b
        r = abs((n - b) / b)
        c1 += 1 if r < t1 else 0
        c5 += 1 if r < t5 else 0
        rel[i] = np.float64(r)
    return c1, c5


def _rel64(xw, yw, m, eps, thr1, thr5, rel):
    """:func:`_rel32` in float64."""
    c1 = 0
    c5 = 0
    for i in range(m):
        n = xw[i]
        b = yw[i]
        z = b == 0
        n = n + eps if z else n
        b = b + eps if z else b
        r = abs((n - b) / b)
        c1 += 1 if r < thr1 else 0
        c5 += 1 if r < thr5 else 0
        rel[i] = r
    return c1, c5


def _log_block(q, qi, mi, mf, out, m):
    """out[:m] = log(q[:m]) by fdlibm's formula (pure IEEE arithmetic, the same bits on any
    CPU and in :func:`log_numpy`); qi is q's int64 view, mi/mf one scratch row's int64/float64
    views. Zero, subnormal, Inf and NaN inputs go to libm's log (a second loop, only when the
    block holds one)."""
    for i in range(m):
        mi[i] = (qi[i] & _MANTISSA) | _ONE_BITS
    special = 0
    for i in range(m):
        bits = qi[i]
        e = np.int32((bits >> 52) & 0x7FF)
        special |= (e == 0) | (e == 0x7FF)
        k = np.float64(np.int32(bits >> 52) - 1023)  # int32: a conversion AVX2 vectorises
        mm = mf[i]
        big = mm > SQRT2
        mm = mm * 0.5 if big else mm
        k = k + 1.0 if big else k
        f = mm - 1.0
        s = f / (2.0 + f)
        z = s * s
        w = z * z
        r = z * (LG1 + w * (LG3 + w * (LG5 + w * LG7))) + w * (LG2 + w * (LG4 + w * LG6))
        hfsq = 0.5 * f * f
        out[i] = k * LN2_HI - ((hfsq - (s * (hfsq + r) + k * LN2_LO)) - f)
    if special:
        for i in range(m):
            e = (qi[i] >> 52) & 0x7FF
            if e == 0 or e == 0x7FF:
                out[i] = math.log(q[i])


def log_numpy(q: np.ndarray) -> np.ndarray:
    """:func:`_log_block`'s log of a float64 array, in numpy (the same operations, so the
    same bits; positive normal values by the formula, the rest by np.log)."""
    bits = q.view(np.int64)
    k = ((bits >> 52) - 1023).astype(np.float64)
    mm = ((bits & _MANTISSA) | _ONE_BITS).view(np.float64)
    big = mm > SQRT2
    mm = np.where(big, mm * 0.5, mm)
    k = np.where(big, k + 1.0, k)
    f = mm - 1.0
    s = f / (2.0 + f)
    z = s * s
    w = z * z
    r = z * (LG1 + w * (LG3 + w * (LG5 + w * LG7))) + w * (LG2 + w * (LG4 + w * LG6))
    hfsq = 0.5 * f * f
    out = k * LN2_HI - ((hfsq - (s * (hfsq + r) + k * LN2_LO)) - f)
    e = (bits >> 52) & 0x7FF
    special = (e == 0) | (e == 0x7FF)
    if special.any():
        with np.errstate(all="ignore"):
            out[special] = np.log(q[special])
    return out


def half_to_float32(h: np.ndarray, out: np.ndarray, out_bits: np.ndarray) -> None:
    """out = float16 values of the bits ``h`` (uint16, 1-D) as float32, exactly as numpy's
    cast (``out_bits``: out's uint32 view): :func:`_half_to_float32`, compiled once
    (``h`` passed read-only, :func:`_readonly`)."""
    _half_to_float32(_readonly(h), out, out_bits)


def _half_to_float32(h, out, out_bits):
    """out = float16 values of the bits ``h`` (uint16, 1-D) as float32, exactly as numpy's cast
    (``out_bits``: out's uint32 view). Bits of a finite half shifted into place read as a
    float32 2**112 times too small (subnormal halves as float32 subnormals), so one exact
    multiplication by 2**112 scales every one; Inf and NaN get the all-ones exponent and keep
    their mantissa bits (numpy's ``npy_halfbits_to_floatbits``); then the sign. Vectorised
    (numpy's own cast is a scalar loop)."""
    for i in range(h.shape[0]):
        out_bits[i] = np.uint32(h[i] & 0x7FFF) << np.uint32(13)
    scale = np.float32(5.192296858534828e+33)  # 2**112
    for i in range(h.shape[0]):
        out[i] = out[i] * scale
    for i in range(h.shape[0]):
        b = np.uint32(h[i])
        em = b & np.uint32(0x7FFF)
        v = (np.uint32(0x7F800000) | ((em & np.uint32(0x3FF)) << np.uint32(13))) if em >= np.uint32(0x7C00) \
            else out_bits[i]
        out_bits[i] = v | ((b & np.uint32(0x8000)) << np.uint32(16))


def _product(u, v, out, m):
    """out[i] = u[i] * v[i]."""
    for i in range(m):
        out[i] = u[i] * v[i]


def _lanes8(w, m8, lanes):
    """lanes[j] += w[i0 + j] for every i0 < m8 step 8, in order (eight scalars in registers)."""
    l0, l1, l2, l3, l4, l5, l6, l7 = lanes[0], lanes[1], lanes[2], lanes[3], lanes[4], lanes[5], lanes[6], lanes[7]
    for i0 in range(0, m8, 8):
        l0 += w[i0]
        l1 += w[i0 + 1]
        l2 += w[i0 + 2]
        l3 += w[i0 + 3]
        l4 += w[i0 + 4]
        l5 += w[i0 + 5]
        l6 += w[i0 + 6]
        l7 += w[i0 + 7]
    lanes[0], lanes[1], lanes[2], lanes[3], lanes[4], lanes[5], lanes[6], lanes[7] = l0, l1, l2, l3, l4, l5, l6, l7


def _lanes8x9(work, m8, lanes):
    """:func:`_lanes8` of the first nine rows of ``work`` into the rows of ``lanes`` (9, 8):
    :func:`compiled` puts :func:`_lanes8x9_intrinsic`'s loop here, or the scalar
    :func:`_lanes8x9_scalar` where that cannot be built (:func:`_vector_lanes`)."""
    _lanes8x9_scalar(work, m8, lanes)


def _lanes8x9_scalar(work, m8, lanes):
    """:func:`_lanes8x9` as scalar additions.

    The intrinsic does the same additions in the same order, lane by lane, but four lanes to
    a vector instruction and the nine rows in one loop. Written as scalars, the 72 lane sums
    of a block step are 72 scalar additions: numba's loop vectoriser cannot take them (a
    reduction it may not reorder) and it leaves LLVM's SLP vectoriser off (numba issue
    8705), so they cost ~1.7 ns an element, a sixth of the kernel; as 18 vector additions
    ~0.6 ns."""
    for k in range(9):
        _lanes8(work[k], m8, lanes[k])


def _lanes8x9_intrinsic():
    """:func:`_lanes8x9` as a numba intrinsic (imports numba): for ``i0`` in ``range(0, m8,
    8)``, ``lanes[k, 0:4] += work[k, i0:i0 + 4]`` and ``lanes[k, 4:8] += work[k, i0 + 4:i0 +
    8]`` for k < 9, as LLVM ``fadd <4 x double>`` without fast-math flags: each lane is the
    IEEE sum of its elements in element order, bit for bit :func:`_lanes8`'s (tested through
    the kernel's sums in ``tests/test_compare_kernel.py``). ``work``: float64, 2-D, C order,
    at least 9 rows of at least ``m8`` elements (m8 a multiple of 8); ``lanes``: float64
    (9, 8), C order."""
    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.extending import intrinsic

    def fits(a):
        return isinstance(a, types.Array) and a.dtype == types.float64 and a.ndim == 2 and a.layout == "C"

    @intrinsic
    def lanes8x9(typingctx, work, m8, lanes):
        if not (fits(work) and fits(lanes) and isinstance(m8, types.Integer)):
            return None
        sig = types.void(work, m8, lanes)

        def codegen(context, builder, sig, args):
            warr = context.make_array(sig.args[0])(context, builder, args[0])
            larr = context.make_array(sig.args[2])(context, builder, args[2])
            intp = context.get_value_type(types.intp)
            vec = ir.VectorType(ir.DoubleType(), 4)
            vptr = vec.as_pointer()
            m8v = context.cast(builder, args[1], sig.args[1], types.intp)
            row = builder.sdiv(cgutils.unpack_tuple(builder, warr.strides, 2)[0], ir.Constant(intp, 8))

            def lane_ptr(k, h):
                return builder.bitcast(builder.gep(larr.data, [ir.Constant(intp, 8 * k + 4 * h)]), vptr)

            rows, accs = [], []
            for k in range(9):
                rows.append(builder.gep(warr.data, [builder.mul(row, ir.Constant(intp, k))]))
                for h in range(2):
                    acc = cgutils.alloca_once(builder, vec)  # promoted to a register by LLVM
                    builder.store(builder.load(lane_ptr(k, h), align=8), acc)
                    accs.append(acc)
            with cgutils.for_range_slice(builder, ir.Constant(intp, 0), m8v, ir.Constant(intp, 8), intp) as (i, _):
                for k in range(9):
                    for h in range(2):
                        at = builder.add(i, ir.Constant(intp, 4 * h))
                        v = builder.load(builder.bitcast(builder.gep(rows[k], [at]), vptr), align=8)
                        acc = accs[2 * k + h]
                        builder.store(builder.fadd(builder.load(acc), v), acc)
            for k in range(9):
                for h in range(2):
                    builder.store(builder.load(accs[2 * k + h]), lane_ptr(k, h), align=8)
            return context.get_dummy_value()

        return sig, codegen

    return lanes8x9


def _max_bits(wi, m, top):
    """The largest int64 bit pattern of m float64 values >= +0.0 or NaN (|d| and relative
    errors): their bits order as the values do (+0.0 < ... < +inf < NaN), so an integer
    maximum (exact, vectorised) finds the largest value, or a NaN when there is one."""
    for i in range(m):
        b = wi[i]
        top = b if b > top else top
    return top


def _bits_value(bits, scratch, iscratch):
    """The float64 whose bits are ``bits`` (NaN for any NaN pattern); scratch: one float64
    element and its int64 view."""
    if bits > _INF_BITS:
        return np.nan
    iscratch[0] = bits
    return scratch[0]


def _chunk(x64, x32, x16, xk, y64, y32, y16, yk, s, e, row, zero_invalid, rt32, eps, thr1, thr5, xmin, xrange,
           ymin, yrange, work, iwork):
    """Accumulators of elements [s, e) of x and y (each side as :func:`_side` gives it) into
    ``row`` (FIELDS order). ``work`` is float64 scratch
    ``(WORK_ROWS, BLOCK)``, ``iwork`` its int64 view."""
    lanes = np.zeros((9, 8))  # dot xx yy dd abs_sum acc_rel kl_sx kl_sy kl_t
    top_abs = np.int64(-1)  # max_abs, max_rel as bits (_max_bits)
    top_rel = np.int64(-1)
    cnt1 = 0
    cnt5 = 0
    if xrange == 0:  # v = x when max == min: (x - 0) / 1 is x, exactly
        xmin = 0.0
        xrange = 1.0
    if yrange == 0:
        ymin = 0.0
        yrange = 1.0
    n8 = s + (e - s) // 8 * 8
    xw = work[14]
    yw = work[15]
    hf = np.empty(BLOCK, np.float32)  # a float16 block as float32 (_widen_any)
    hb = hf.view(np.uint32)
    for b0 in range(s, e, BLOCK):
        m = min(e, b0 + BLOCK) - b0
        _widen_any(x64, x32, x16, xk, b0, m, xw, hf, hb)
        _widen_any(y64, y32, y16, yk, b0, m, yw, hf, hb)
        if zero_invalid:  # NaN/Inf at the same positions on both sides (checked before)
            _zero_invalid(xw, yw, m)
        _terms(xw, yw, m, xmin, xrange, ymin, yrange, work[0], work[1], work[2], work[3], work[4], work[5],
               work[6], work[7], work[10])
        if rt32:
            c1, c5 = _rel32(xw, yw, m, eps, thr1, thr5, work[9])
        else:
            c1, c5 = _rel64(xw, yw, m, eps, thr1, thr5, work[9])
        cnt1 += c1
        cnt5 += c5
        _log_block(work[10], iwork[10], iwork[13], work[13], work[11], m)
        _product(work[6], work[11], work[8], m)
        # lanes: element i of the chunk into lane (i - s) % 8
        m8 = min(m, n8 - b0) if n8 > b0 else 0
        _lanes8x9(work, m8, lanes)
        top_abs = _max_bits(iwork[4], m, top_abs)
        top_rel = _max_bits(iwork[9], m, top_rel)
        if b0 + m == e:  # the last block: fold, then the elements after the last full 8
            for k in range(9):
                row_k = _fold(lanes[k])
                for i in range(m8, m):
                    row_k += work[k, i]
                lanes[k, 0] = row_k
    row[0] = lanes[0, 0]
    row[1] = lanes[1, 0]
    row[2] = lanes[2, 0]
    row[3] = lanes[3, 0]
    row[4] = lanes[4, 0]
    row[5] = _bits_value(top_abs, work[12], iwork[12])
    row[6] = _bits_value(top_rel, work[12], iwork[12])
    row[7] = cnt1
    row[8] = cnt5
    row[9] = lanes[5, 0]
    row[10] = lanes[6, 0]
    row[11] = lanes[7, 0]
    row[12] = lanes[8, 0]


def chunk_rows(x: np.ndarray, y: np.ndarray, chunk: int, out: np.ndarray, zero_invalid: bool, rt32: bool,
               eps: float, thr1: float, thr5: float, xmin: float, xrange: float, ymin: float,
               yrange: float) -> None:
    """One row of accumulators per chunk of ``chunk`` elements of the 1-D arrays x and y
    (same length; float32 or float64, :data:`NATIVE`, or float16, or uint16 holding float16
    bits, widened block by block: :func:`_widen_any`) into ``out`` (float64, ``(n_chunks,
    13)``).

    ``zero_invalid``: set NaN/Inf positions (the same on both sides, checked before) to 0;
    ``rt32``: msprobe's relative error in float32 (else float64) with ``eps``/``thr1``/``thr5``
    its epsilon and thresholds; ``xmin``, ``xrange``, ``ymin``, ``yrange``: the KL
    normalisation (a range of 0 leaves the values as they are). The GIL is released. Raises
    ValueError for another dtype. One compiled signature for every dtype pair (:func:`_side`)."""
    _chunk_rows(*_side(x), *_side(y), x.size, chunk, out, bool(zero_invalid), bool(rt32), float(eps), float(thr1),
                float(thr5), float(xmin), float(xrange), float(ymin), float(yrange))


def _chunk_rows(x64, x32, x16, xk, y64, y32, y16, yk, n, chunk, out, zero_invalid, rt32, eps, thr1, thr5, xmin,
                xrange, ymin, yrange):
    """:func:`chunk_rows` of the sides as :func:`_side` gives them, ``n`` elements."""
    work = np.zeros((WORK_ROWS, BLOCK))
    iwork = work.view(np.int64)
    for c in range(out.shape[0]):
        s = c * chunk
        _chunk(x64, x32, x16, xk, y64, y32, y16, yk, s, min(n, s + chunk), out[c], zero_invalid, rt32, eps, thr1, thr5,
               xmin, xrange, ymin, yrange, work, iwork)


def scan(x: np.ndarray, y: np.ndarray, check_invalid: bool) -> tuple[int, float, float, float, float]:
    """:func:`_scan` of two 1-D float32 or float64 arrays, passed read-only and C-contiguous
    (:func:`_readonly`: one compiled signature per dtype pair, whether or not the caller's
    arrays are writeable)."""
    return _scan(_readonly(x), _readonly(y), bool(check_invalid))


def _scan(x, y, check_invalid):
    """First pass over two 1-D arrays of the same length: ``(status, xmin, xmax, ymin, ymax)``
    with status 0 (all finite), 1 (NaN/Inf at the same positions on both sides: msprobe
    zeroes them; min/max are of the zeroed values) or 2 (NaN or Inf positions differ: no
    metrics). Without ``check_invalid`` (integer dtypes) status is 0.

    :func:`scan_scalar` gives the definition; this is its result, bit for bit, in one
    branch-free pass the loop vectoriser takes (the element-by-element loop with an early
    return was not vectorised: 1.7-1.9 ns an element, about a fifth of the metric pass that
    follows): :func:`_scan_block` keeps one running minimum and maximum per position of a
    block and flags a non-finite value; a pair that holds one is scanned again by
    :func:`scan_scalar` (status 1 or 2 and the zeroed extremes are its rules). The extremes
    of finite values do not depend on the order they are visited in, but for the sign of a
    zero: the element-by-element ``<`` keeps the first zero it meets, so a zero extreme is
    taken from the first zero of the array (:func:`_first_zero`)."""
    n = x.shape[0]
    acc = np.empty((4, BLOCK))  # per position: min x, max x, min y, max y
    for i in range(BLOCK):
        acc[0, i] = np.inf
        acc[1, i] = -np.inf
        acc[2, i] = np.inf
        acc[3, i] = -np.inf
    nxt = acc.copy()
    for b0 in range(0, n, BLOCK):
        m = min(n, b0 + BLOCK) - b0
        bad = _scan_block(x[b0:b0 + m], y[b0:b0 + m], acc, nxt)
        if m < BLOCK:  # positions the block did not reach keep their extremes
            nxt[:, m:] = acc[:, m:]
        acc, nxt = nxt, acc
        if bad and check_invalid:
            return _scan_scalar(x, y, check_invalid)
    xmin = _min_of(acc[0])
    xmax = _max_of(acc[1])
    ymin = _min_of(acc[2])
    ymax = _max_of(acc[3])
    if xmin == 0:
        xmin = _first_zero(x)
    if xmax == 0:
        xmax = _first_zero(x)
    if ymin == 0:
        ymin = _first_zero(y)
    if ymax == 0:
        ymax = _first_zero(y)
    return 0, xmin, xmax, ymin, ymax


def _scan_block(x, y, acc, out):
    """One block's running extremes per position: ``out[0, i] = min(acc[0, i], x[i])``, then
    max x, min y, max y (selects, which compile to vminpd/vmaxpd; written to another array than
    the one read, as a store of the value just loaded would become a masked store, slower
    than the scalar loop); returns True when x or y holds a NaN or an Inf (``v - v`` is 0 for
    every finite ``v`` and NaN for the others)."""
    bad = False
    for i in range(x.shape[0]):
        xv = np.float64(x[i])
        yv = np.float64(y[i])
        bad |= ((xv - xv) != 0.0) | ((yv - yv) != 0.0)
        a = acc[0, i]
        out[0, i] = xv if xv < a else a
        a = acc[1, i]
        out[1, i] = xv if xv > a else a
        a = acc[2, i]
        out[2, i] = yv if yv < a else a
        a = acc[3, i]
        out[3, i] = yv if yv > a else a
    return bad


def _min_of(a):
    m = np.inf
    for i in range(a.shape[0]):
        m = a[i] if a[i] < m else m
    return m


def _max_of(a):
    m = -np.inf
    for i in range(a.shape[0]):
        m = a[i] if a[i] > m else m
    return m


def _first_zero(x):
    """The first element of x equal to 0 (+0.0 or -0.0), as float64 (called when x holds one)."""
    for i in range(x.shape[0]):
        if x[i] == 0:
            return np.float64(x[i])
    return np.float64(0.0)


def scan_scalar(x: np.ndarray, y: np.ndarray, check_invalid: bool) -> tuple[int, float, float, float, float]:
    """:func:`_scan_scalar` of two 1-D float32 or float64 arrays (read-only, as :func:`scan`)."""
    return _scan_scalar(_readonly(x), _readonly(y), bool(check_invalid))


def _scan_scalar(x, y, check_invalid):
    """:func:`scan` element by element (its definition, and its path for arrays that hold a
    NaN or an Inf): ``(status, xmin, xmax, ymin, ymax)``
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
                xv = np.float64(0.0)
                yv = np.float64(0.0)
        if xv < xmin:
            xmin = xv
        if xv > xmax:
            xmax = xv
        if yv < ymin:
            ymin = yv
        if yv > ymax:
            ymax = yv
    return status, xmin, xmax, ymin, ymax


def segment_rows(x: np.ndarray, y: np.ndarray, starts: np.ndarray, sizes: np.ndarray, chunk: int,
                 out: np.ndarray, status: np.ndarray, rt32: bool, eps: float, thr1: float, thr5: float) -> None:
    """:func:`scan` then :func:`chunk_rows` for each segment ``k`` (``[starts[k], starts[k] +
    sizes[k])`` of the float64 1-D arrays x and y), its chunks folded in order into ``out[k]``
    (float64, ``(n_segments, 13)``); ``status[k]`` is the segment's scan status (a segment
    with status 2 or 1 is left for the caller to compute alone). The GIL is released."""
    xs, ys = _side(x), _side(y)
    if xs[3] != 0 or ys[3] != 0:
        raise ValueError(f"segment_rows takes float64 arrays, not {x.dtype} and {y.dtype}")
    # the dtype codes, check_invalid and zero_invalid as arguments, not constants: a literal 0,
    # True or False in the compiled code would compile _scan and _chunk once more for it
    _segment_rows(*xs, *ys, starts, sizes, chunk, out, status, True, False, bool(rt32), float(eps),
                  float(thr1), float(thr5))


def _segment_rows(x, x32, x16, xk, y, y32, y16, yk, starts, sizes, chunk, out, status, check_invalid, zero_invalid,
                  rt32, eps, thr1, thr5):
    """:func:`segment_rows` of the float64 sides as :func:`_side` gives them."""
    row = np.zeros(13)
    work = np.zeros((WORK_ROWS, BLOCK))
    iwork = work.view(np.int64)
    for k in range(starts.shape[0]):
        s = starts[k]
        e = s + sizes[k]
        st, xmin, xmax, ymin, ymax = _scan(x[s:e], y[s:e], check_invalid)
        status[k] = st
        if st != 0:
            continue
        acc = out[k]
        for f in range(13):
            acc[f] = 0.0
        acc[5] = -np.inf
        acc[6] = -np.inf
        for c in range(s, e, chunk):
            _chunk(x, x32, x16, xk, y, y32, y16, yk, c, min(e, c + chunk), row, zero_invalid, rt32, eps, thr1, thr5,
                   xmin, xmax - xmin, ymin, ymax - ymin, work, iwork)
            fold_row(acc, row)


def fold_row(acc, row):
    """``acc`` += one chunk's ``row``: sums added, maxima with NaN propagated (np.maximum)."""
    for f in (0, 1, 2, 3, 4, 7, 8, 9, 10, 11, 12):
        acc[f] += row[f]
    for f in (5, 6):
        if acc[f] != acc[f] or row[f] != row[f]:
            acc[f] = np.nan
        elif row[f] > acc[f]:
            acc[f] = row[f]


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


# The functions numba compiles, callers before callees or not: numba looks each callee up in
# this module's namespace when it compiles the caller, on its first call.
# The public names chunk_rows, scan, scan_scalar, segment_rows and half_to_float32 stay
# Python: each passes its arrays in the one form its compiled function takes (_side, _readonly).
_COMPILED = ("_half_to_float32", "_fold", "_widen", "_widen_any", "_zero_invalid", "_terms", "_rel32", "_rel64",
             "_log_block", "_product", "_lanes8", "_lanes8x9_scalar", "_max_bits", "_bits_value", "_chunk",
             "_chunk_rows", "_scan", "_segment_rows", "fold_row", "fold_rows", "_scan_scalar", "_scan_block",
             "_min_of", "_max_of", "_first_zero")
_compile_lock = threading.Lock()
_compiled: ModuleType | None = None


def _lanes_probe(work, m8, lanes):
    """Calls :data:`_lanes8x9` (whatever the namespace holds): compiled once to check the
    intrinsic against the scalar lane sums (:func:`_vector_lanes`)."""
    _lanes8x9(work, m8, lanes)


def _vector_lanes(numba: ModuleType) -> bool:
    """Put :func:`_lanes8x9_intrinsic`'s loop in place of :func:`_lanes8x9` when this numba and
    llvmlite build it and it gives :func:`_lanes8`'s bits on a probe (signed zeros, sums that
    round, a NaN, an Inf); otherwise keep the scalar loop, compiled. The intrinsic is written
    against llvmlite's IR builder, which a future release may change: a failure there costs
    ~1.1 ns an element of speed, never a compare."""
    namespace = globals()
    rng = np.random.default_rng(29)
    work = rng.standard_normal((9, 64)) * np.array([1e-300, 1.0, 1e16, 3.0, -0.0, 1e300, 7.0, 1.0, 2.0])[:, None]
    work[2, 5] = np.nan
    work[3, 9] = np.inf
    expect = np.zeros((9, 8))
    expect[4] = -0.0
    got = expect.copy()
    for k in range(9):
        _lanes8(work[k], 64, expect[k])  # Python or compiled: IEEE double additions, the same bits
    try:
        namespace["_lanes8x9"] = _lanes8x9_intrinsic()
        _one_compiler(numba.njit(cache=True, nogil=True)(_lanes_probe))(work, 64, got)
        if got.tobytes() == expect.tobytes():
            return True
    except Exception:  # noqa: BLE001  # any failure to build or run the intrinsic: the scalar loop serves
        pass
    namespace["_lanes8x9"] = namespace["_lanes8x9_scalar"]
    return False


# Seconds a process that needs a new signature waits for another process compiling into the same
# cache directory before compiling itself (a holder stuck, not dead: a dead one's flock is gone).
COMPILE_WAIT = 120.0
# The lock file, in numba's cache directory of this module (``__pycache__`` beside it, numba's
# user cache directory when that is read-only, or ``NUMBA_CACHE_DIR``).
COMPILE_LOCK = "dumpdb-kernel.compile.lock"
# This process's compile state, changed only under numba's global compiler lock: the depth of
# kernel compiles under way (a function compiles or loads the kernel functions it calls inside
# its own compile), the descriptor of the lock file while this process holds it, and whether a wait
# timed out (then this process stops waiting and compiles what it misses).
_lock_state: dict = {"depth": 0, "fd": None, "gave_up": False}


def _take_compile_lock(directory: str) -> bool:
    """Hold the exclusive flock of ``directory``/:data:`COMPILE_LOCK`, waiting at most
    :data:`COMPILE_WAIT` seconds for another process that holds it. False when it cannot be
    had (no fcntl, a directory where the file cannot be made, a filesystem without flock, the
    wait timed out): the caller compiles anyway, as numba alone does."""
    if fcntl is None or _lock_state["gave_up"]:
        return False
    try:
        fd = os.open(os.path.join(directory, COMPILE_LOCK), os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        return False
    deadline = time.monotonic() + COMPILE_WAIT
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another process compiles: wait for it, then load what it saved
            if time.monotonic() < deadline:
                time.sleep(0.05)
                continue
            _lock_state["gave_up"] = True
        except OSError:
            pass
        else:
            _lock_state["fd"] = fd
            return True
        os.close(fd)
        return False


def _release_compile_lock() -> None:
    fd = _lock_state["fd"]
    if fd is not None:
        _lock_state["fd"] = None
        os.close(fd)  # closing the only descriptor of the open file releases its flock


def _one_compiler(dispatcher):
    """``dispatcher`` (a numba ``njit(cache=True)`` function of this module) made to compile
    one process at a time per cache directory: its outermost compile (the first call with a
    new signature: a load from numba's cache or, on a miss, a compile and a save) runs holding
    an exclusive flock on :data:`COMPILE_LOCK` there, so a second process starting on an empty
    cache waits and then loads the first one's result instead of compiling the same signature
    itself (each xdist worker, each worker process of a compare, each CLI call started
    together). A holder killed mid-compile loses its flock with its life; one that holds it
    longer than :data:`COMPILE_WAIT` seconds is not waited for. Uses the dispatcher's
    ``compile`` and ``stats.cache_path``: where a numba release lacks them, the dispatcher is
    returned as it is (each process compiles its misses)."""
    compile_ = getattr(dispatcher, "compile", None)
    directory = getattr(getattr(dispatcher, "stats", None), "cache_path", None)
    if fcntl is None or compile_ is None or not isinstance(directory, str):
        return dispatcher
    from numba.core.compiler_lock import global_compiler_lock

    def compile(sig):
        with global_compiler_lock:  # numba's (re-entrant): the one lock of every compile in a process
            if not _lock_state["depth"] and _lock_state["fd"] is None:
                _take_compile_lock(directory)  # not had (timeout, no flock): compile anyway
            _lock_state["depth"] += 1
            try:
                return compile_(sig)  # loads from the cache when the holder before us saved it
            finally:
                _lock_state["depth"] -= 1
                if not _lock_state["depth"]:
                    _release_compile_lock()

    dispatcher.compile = compile
    return dispatcher


def compiled() -> ModuleType:
    """This module with its kernel functions (:func:`chunk_rows`, :func:`scan`,
    :func:`segment_rows`, :func:`fold_rows`, ...) compiled by numba: numba is imported on the
    first call (about a second), each function compiled on its first call with a new dtype
    signature (a few seconds, then cached beside the module; one process at a time per cache
    directory compiles, the others wait and load its result: :func:`_one_compiler`). Raises
    ImportError without numba (see :data:`AVAILABLE`)."""
    global _compiled
    if _compiled is None:
        with _compile_lock:
            if _compiled is None:
                import numba

                namespace = globals()
                for name in _COMPILED:
                    namespace[name] = _one_compiler(
                        numba.njit(cache=True, nogil=True, error_model="numpy")(namespace[name]))
                _vector_lanes(numba)  # after: its fallback is the compiled _lanes8x9_scalar
                _compiled = importlib.import_module(__name__)
    return _compiled


_preloader: threading.Thread | None = None


def preload() -> None:
    """Start :func:`compiled` in a background thread (once a process; nothing when numba is
    not used, :data:`AVAILABLE` False, or the kernel is loaded already), so that importing
    numba and loading the kernel from its cache (about 1 CPU s, mostly holding the GIL) runs
    while the caller waits on work that releases the GIL: DuckDB queries, reading and
    decoding payloads. A later :func:`compiled` waits for it (its lock), then returns the
    loaded kernel. A failure in the background is dropped there: :func:`compiled` then finds
    the kernel not loaded, loads it in its own thread and raises there. The thread compiles no
    signature of its own (only the lane-sum probe, cached like the rest): a signature the
    compare never calls would cost seconds of compiling on a first run. The process waits
    for the thread at exit (:func:`wait_preload`, registered with ``atexit``), also when the
    caller failed before waiting for it itself: a daemon thread stopped in the middle of an
    import at interpreter shutdown is not safe."""
    global _preloader
    if not AVAILABLE or _compiled is not None or _preloader is not None:
        return
    thread = threading.Thread(target=_preload, name="dumpdb-kernel-load", daemon=True)
    _preloader = thread
    thread.start()
    atexit.register(wait_preload)


def _preload() -> None:
    try:
        compiled()
    except Exception:  # noqa: BLE001  # compiled() in the caller's thread raises it again, where it is handled
        pass


def wait_preload() -> None:
    """Wait until a :func:`preload` thread has finished (at once when none was started)."""
    thread = _preloader
    if thread is not None:
        thread.join()
