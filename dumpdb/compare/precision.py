"""Precision-aware judgment: does a pair differ by more than rounding explains, and which op
starts it (the default rules of ``compare``'s summary, ``first-divergence`` and the HTML).

The model
=========
For a pair (target ``x``, bench ``y``, ``N`` elements) the *error* is the relative Euclidean
distance ``err = ||x - y||_2 / ||y||_2`` (``euc_dist`` over the bench's catalog ``l2norm``):
one number per tensor that near-zero elements cannot dominate, unlike an element-wise
relative error (msprobe's MaxRelativeErr is dominated by the smallest |y|).

The *precision floor* is the error that rounding to the lower-precision side's dtype ``p``
alone gives. IEEE 754 rounding to nearest gives ``|fl(v) - v| <= u |v|`` for ``v`` in the
normal range, with the unit roundoff ``u = eps_p / 2``, and ``<= s_p / 2`` below it (``s_p`` =
smallest subnormal: gradual underflow and flush to zero) (Higham, *Accuracy and Stability of
Numerical Algorithms*, 2nd ed., sec. 2.1 and Thm 2.2). Summed over the elements::

    ||x - y|| <= u ||y|| + (s_p / 2) sqrt(N),   so   floor = u + (s_p / 2) sqrt(N) / ||y||

with ``eps`` and ``s`` of float16 (2^-10, 2^-24), bfloat16 (2^-7, 2^-133), float32 (2^-23,
2^-149), float64 (2^-52, 2^-1074) (``numpy.finfo`` / ``ml_dtypes.finfo``). Integers and bool
are exact (floor 0). ``ratio = err / floor`` is the error in units of that floor.

A pair **departs** when ``ratio > margin`` (default 64: the floor is one rounding; a
kernel's own arithmetic adds up to ~sqrt(n) roundings for an n-term reduction with random
rounding errors (Higham sec. 2.8, Higham & Mary 2019), n up to a few thousand here). A dtype
difference between two floats is expected (the lower one sets the floor), not an error;
any other dtype difference, a shape difference (two shapes of the same element count, a
reshape only one side has, are compared in C order), or NaN/Inf at different positions
departs.

Error growth: which op breaks the run
=====================================
Operators pass their inputs' errors on, amplified (a condition number). An op's output is
*explained* when ``err_out <= growth * max(err_in) + margin * floor_out`` (growth default
16: LayerNorm, softmax and the matrix products of a Transformer amplify relative errors by
less on real fp16-vs-fp32 pairs; exp/log of large arguments can amplify more, raise
``growth`` then). Per row, the precision result is:

``pass``     no departure;
``warning``  departs, explained by its inputs (error propagated from earlier ops; an
             integer/bool result, e.g. a comparison, of inputs that carry any error);
``error``    departs and not explained: the op's output when its inputs do not explain it;
             an input when no compared op produced it (a parameter or data input, or the
             output of an op only the target has: an inserted op, named in the reason).

The producer of an input is the last target output before it with the same content hash
(MindSpore dumps an op's input as the bytes its producer wrote). Ops are taken in the order
they ran (dump timestamps, else execution order); ``first_departure`` is the first op with an
``error`` row.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
import pyarrow as pa

from dumpdb.compare.columns import Shapes, group_codes, string_codes
from dumpdb.compare.metrics import MSG_NAN_INF_MISMATCH

__all__ = ["PrecisionRules", "dtype_floor", "judge_precision", "first_departure", "lowest_precision",
           "Columns", "judge_precision_columns"]

PASS, WARNING, ERROR = "pass", "warning", "error"

# (eps, smallest subnormal) per float dtype name, as the catalog names dtypes.
_FLOATS: dict[str, tuple[float, float]] = {}
for _name, _info in (("float16", np.finfo(np.float16)), ("float32", np.finfo(np.float32)),
                     ("float64", np.finfo(np.float64)), ("bfloat16", ml_dtypes.finfo(ml_dtypes.bfloat16))):
    _FLOATS[_name] = (float(_info.eps), float(_info.smallest_subnormal))
_NORMAL_MIN = {"float16": float(np.finfo(np.float16).smallest_normal),
               "bfloat16": float(ml_dtypes.finfo(ml_dtypes.bfloat16).smallest_normal),
               "float32": float(np.finfo(np.float32).smallest_normal)}
_MAX = {"float16": float(np.finfo(np.float16).max), "bfloat16": float(ml_dtypes.finfo(ml_dtypes.bfloat16).max),
        "float32": float(np.finfo(np.float32).max)}
_EXACT = ("int", "uint", "bool")
_DECLARED = {"float16": "float16", "bfloat16": "bfloat16", "float32": "float32", "float64": "float64",
             "fp16": "float16", "bf16": "bfloat16", "half": "float16"}


@dataclass(frozen=True)
class PrecisionRules:
    """``margin``: a pair departs when its error exceeds ``margin`` x the precision floor;
    ``growth``: how much an op may amplify its inputs' relative error (module docstring)."""

    margin: float = 64.0
    growth: float = 16.0


def lowest_precision(a: str | None, b: str | None) -> str | None:
    """The lower-precision float dtype of a pair (larger eps), None unless both are floats
    dumpdb knows (float16, bfloat16, float32, float64)."""
    if a not in _FLOATS or b not in _FLOATS:
        return None
    return a if _FLOATS[a][0] >= _FLOATS[b][0] else b


def dtype_floor(dtype: str | None, n: int, bench_l2: float) -> float | None:
    """Relative error rounding to ``dtype`` explains for ``n`` elements of L2 norm
    ``bench_l2``: ``eps/2 + (smallest_subnormal/2) sqrt(n) / bench_l2`` (inf when
    ``bench_l2`` is 0); 0.0 for integer/bool dtypes; None for unknown dtypes."""
    if dtype is None:
        return None
    if dtype.startswith(_EXACT):
        return 0.0
    if dtype not in _FLOATS:
        return None
    eps, sub = _FLOATS[dtype]
    if not bench_l2 > 0:
        return math.inf
    return eps / 2 + (sub / 2) * math.sqrt(max(n, 1)) / bench_l2


def _num(v) -> float | None:
    if v is None:
        return None
    f = float(v)
    return None if math.isnan(f) else f


def _pair_error(r: dict) -> tuple[float | None, float | None, str | None, str | None]:
    """(err, floor, dtype, reason for a structural departure) of one result row."""
    tdt, bdt = r.get("target_dtype"), r.get("bench_dtype")
    flat = None
    if r.get("target_shape") is not None and r.get("bench_shape") is not None \
            and list(r["target_shape"]) != list(r["bench_shape"]):
        flat = _num(r.get("flat_euc_dist"))
        if flat is None or math.prod(r["target_shape"]) != math.prod(r["bench_shape"]):
            return None, None, None, f"shapes differ (target {r['target_shape']}, bench {r['bench_shape']})"
    low, reason = _dtype_rule(tdt, bdt, r.get("target_dtype_declared"), r.get("bench_dtype_declared"))
    if reason is not None:
        return None, None, None, reason
    if _nonfinite(r, "target") and not _nonfinite(r, "bench"):
        return math.inf, None, low, _nan_inf_reason(r, low)
    n = math.prod(r.get("bench_shape") or []) if r.get("bench_shape") is not None else 1
    bench_l2 = _num(r.get("bench_l2norm"))
    if r.get("mode") == "tensor":
        msg = r.get("err_message") or ""
        if MSG_NAN_INF_MISMATCH in msg:
            return math.inf, None, low, _nan_inf_reason(r, low)
        euc = _num(r.get("euc_dist")) if flat is None else flat
        if euc is None:  # 0-d
            mae = _num(r.get("max_abs_err"))
            euc = mae
    else:  # statistics: | ||x|| - ||y|| | <= ||x - y||, a lower bound of the error
        norm_diff = _num(r.get("l2norm_diff"))
        euc = None if norm_diff is None else abs(norm_diff)
    if euc is None or bench_l2 is None:
        return None, None, low, None
    floor = dtype_floor(low, n, bench_l2)
    if floor is None:
        return None, None, low, None
    if bench_l2 > 0:
        err = euc / bench_l2
    else:
        err = 0.0 if euc == 0 else math.inf
        if euc and math.isinf(floor):  # bench all zero: absolute floor of the subnormals
            sub = _FLOATS.get(low or "", (0.0, 0.0))[1] / 2 * math.sqrt(max(n, 1))
            err, floor = euc, sub
    return err, floor, low, None


def _dtype_rule(tdt: str | None, bdt: str | None, tdecl: str | None, bdecl: str | None,
                ) -> tuple[str | None, str | None]:
    """(the dtype whose precision sets the floor, reason when the dtypes alone depart)."""
    low = lowest_precision(tdt, bdt)
    if low is None:
        if tdt != bdt:
            return None, f"dtypes differ (target {tdt}, bench {bdt}) and are not two floats"
        low = tdt
    # A file declared Float16 whose payload is float32 (real MindSpore 2.10 CPU quirk) was
    # computed in float16: the declared dtype sets the floor when it is lower.
    for declared in (tdecl, bdecl):
        d = _DECLARED.get((declared or "").lower())
        if d is not None and low in _FLOATS:
            low = lowest_precision(low, d)
    return low, None


def _nonfinite(r: dict, side: str) -> bool:
    vals = (_num(r.get(f"{side}_max")), _num(r.get(f"{side}_min")))
    return any(v is not None and math.isinf(v) for v in vals) or \
        any(r.get(f"{side}_{k}") is not None and math.isnan(float(r[f"{side}_{k}"])) for k in ("max", "min"))


def _nan_inf_reason(r: dict, low: str | None) -> str:
    tmax = max(abs(_num(r.get("target_max")) or 0.0), abs(_num(r.get("target_min")) or 0.0))
    bmax = max(abs(_num(r.get("bench_max")) or 0.0), abs(_num(r.get("bench_min")) or 0.0))
    limit = _MAX.get(r.get("target_dtype") or "")
    if math.isinf(tmax) and math.isfinite(bmax) and limit is not None:
        return (f"overflow: target {r.get('target_dtype')} holds inf/nan where bench's largest |value| is "
                f"{bmax:.6g} (float max {limit:.6g})")
    return "nan/inf at different positions in target and bench"


def judge_precision(rows: list[dict], producers: dict[str, list[tuple[int, str, bool]]] | None = None,
                    rules: PrecisionRules = PrecisionRules()) -> None:
    """Add the precision columns to each result row (dicts, in execution order):
    ``scaled_err`` (relative Euclidean error), ``precision_floor``, ``precision_ratio``
    (err / floor), ``precision_dtype`` (the lower-precision dtype), ``precision_result``
    (pass / warning / error) and ``precision_reason`` (and ``origin_op`` on an input row
    an op only the target has produced).

    ``producers``: content hash -> [(order rank, op name, compared)] of the target's output
    tensors (every target op, compared or not; the rank an int, the tensor's place in the
    target's execution order), to find the op that produced an input (a row's ``_order``
    rank, an int, if any, limits it to producers before it). Rows are grouped
    by op call as the msprobe verdicts are; see the module docstring. The rows become
    :class:`Columns` and :func:`judge_precision_columns` judges them: the rules live there only.
    """
    if not rows:
        return
    out, _ = judge_precision_columns(_columns_of(rows, producers), rules)
    for i, r in enumerate(rows):
        for name in ("scaled_err", "precision_floor", "precision_ratio"):
            r[name] = float(out[name][i]) if out[f"{name}_valid"][i] else None
        r.update(precision_dtype=out["precision_dtype"][i], precision_result=out["precision_result"][i],
                 precision_reason=out["precision_reason"][i])
        if out["origin_op"][i] is not None:
            r["origin_op"] = out["origin_op"][i]


def _objects(values) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def _codes(keys: list[tuple]) -> np.ndarray:
    """One code per distinct key (Python equality: None equal to None)."""
    index: dict = {}
    return np.array([index.setdefault(k, len(index)) for k in keys], np.int64)


def _columns_of(rows: list[dict], producers: dict[str, list] | None = None) -> Columns:
    """:class:`Columns` of result rows (dicts as :func:`judge_precision` takes them)."""
    n = len(rows)
    ranked = sorted(range(n), key=lambda i: run_order(rows[i]))
    run_rank = np.empty(n, np.int64)
    run_rank[ranked] = np.arange(n)
    values = {k: np.array([np.nan if r.get(k) is None else float(r[k]) for r in rows], np.float64) for k in _NUMBERS}
    valid = {k: np.array([r.get(k) is not None for r in rows], bool) for k in _NUMBERS}
    found = producers or {}
    return Columns(
        group=_codes([(r["iteration"], r["rank"], r["graph_id"], r["call_index"], r["target_name"]) for r in rows]),
        where=_codes([(r["iteration"], r["rank"]) for r in rows]), run_rank=run_rank,
        output=np.array([r.get("io") == "output" for r in rows], bool),
        statistics=np.array([r.get("mode") != "tensor" for r in rows], bool),
        order=np.array([np.iinfo(np.int64).max if r.get("_order") is None else r["_order"] for r in rows], np.int64),
        values=values, valid=valid, **{k: _objects([r.get(k) for r in rows]) for k in (*_TEXTS, "io", "slot")},
        **{k: Shapes(pa.array([None if r.get(k) is None else list(r[k]) for r in rows], pa.list_(pa.int64())))
           for k in ("target_shape", "bench_shape")},
        producers=lambda hashes: {h: found[h] for h in hashes if h in found})


def run_order(r: dict) -> tuple:
    """The order ops really ran: dump timestamps where the dump has them (MindSpore CPU runs
    ops in another order than ``execution_order`` lists them), then the pair order."""
    ts = r.get("timestamp")
    return (r["iteration"] is None, r["iteration"] or 0, r["rank"] or 0, ts is None, ts or 0, r["pair_index"])


def _fmt(v) -> str:
    return "n/a" if v is None else f"{v:.3g}"


def first_departure(rows: list[dict]) -> dict[str, Any] | None:
    """The first op (by :func:`run_order`) with a precision ``error`` row: its rows as
    ``inputs``/``outputs`` lists of {io, slot, err, floor, ratio, dtypes, result, reason},
    ``row`` (its first error output, else its first error row) and ``origin_op``. None when
    nothing departs beyond precision. ``rows``: judged by :func:`judge_precision`; found by
    the engine's rule (``_first_departure_columns``) over their columns."""
    if not any(r.get("precision_result") == ERROR for r in rows):
        return None
    out: dict[str, np.ndarray] = {k: _objects([r.get(k) for r in rows])
                                  for k in ("precision_result", "precision_reason", "origin_op")}
    for name in ("scaled_err", "precision_floor", "precision_ratio"):
        out[name] = np.array([np.nan if r.get(name) is None else float(r[name]) for r in rows], np.float64)
        out[f"{name}_valid"] = np.array([r.get(name) is not None for r in rows], bool)
    found = _first_departure_columns(_columns_of(rows), out, out["scaled_err_valid"])
    assert found is not None
    row = rows[found["row"]["pair_index"]]
    return {**found, "row": row, "origin_op": row.get("origin_op")}


# -- the same judgment over columns (the compare engine: no dict per pair) -------------------

_NUMBERS = ("flat_euc_dist", "euc_dist", "max_abs_err", "l2norm_diff", "bench_l2norm", "target_max", "target_min",
            "bench_max", "bench_min")
_TEXTS = ("target_dtype", "bench_dtype", "target_dtype_declared", "bench_dtype_declared", "err_message",
          "target_content_hash")
OUTPUT_COLUMNS = ("scaled_err", "precision_floor", "precision_ratio", "precision_dtype", "precision_result",
                  "precision_reason")


class Columns:
    """What :func:`judge_precision_columns` reads, one entry per result row (numpy):
    ``group`` (int64 op-call code: same iteration, rank, graph_id, call_index and target
    name), ``where`` (int64 code of the row's (iteration, rank)), ``run_rank`` (int64: the
    row's place in :func:`run_order`), ``output`` (bool: io is 'output'), ``statistics``
    (bool: the row's mode), ``order`` (int64: the target tensor's place among all target
    tensors in the producers' order), ``values``/``valid`` (float64 and validity) of
    ``flat_euc_dist``, ``euc_dist``, ``max_abs_err``, ``l2norm_diff``, ``bench_l2norm``,
    ``target_max``/``min``, ``bench_max``/``min``; object arrays ``target_dtype``,
    ``bench_dtype``, ``target_dtype_declared``, ``bench_dtype_declared``, ``err_message``,
    ``target_content_hash``, ``io``, ``slot``; ``target_shape``/``bench_shape``
    (:class:`dumpdb.compare.columns.Shapes`); ``producers``: a function from a set of
    content hashes to :func:`judge_precision`'s ``producers`` for those hashes."""

    def __init__(self, **kw) -> None:
        self.__dict__.update(kw)

    def row(self, i: int) -> dict:
        """Row ``i`` as the dicts :func:`judge_precision` judges (None for NULL)."""
        r = {k: (float(self.values[k][i]) if self.valid[k][i] else None) for k in _NUMBERS}
        r.update({k: getattr(self, k)[i] for k in _TEXTS})
        for side in ("target", "bench"):
            shape = getattr(self, f"{side}_shape").shape(i)
            r[f"{side}_shape"] = None if shape is None else list(shape)
        r["mode"] = "statistics" if self.statistics[i] else "tensor"
        r["_order"] = int(self.order[i])
        return r


def _side_nonfinite(c: Columns, side: str) -> np.ndarray:
    out = np.zeros(len(c.group), bool)
    for k in ("max", "min"):
        out |= c.valid[f"{side}_{k}"] & ~np.isfinite(c.values[f"{side}_{k}"])
    return out


def _errors_columns(c: Columns) -> tuple[np.ndarray, ...]:
    """:func:`_pair_error` of every row: (err, err valid, floor, floor valid, dtype, reason);
    vectorised, with the rows it settles by a special case (a reshape, NaN/Inf only on the
    target side or at different positions) computed by _pair_error itself."""
    n = len(c.group)
    err, err_ok = np.full(n, np.nan), np.zeros(n, bool)
    floor, floor_ok = np.full(n, np.nan), np.zeros(n, bool)
    low = np.full(n, None, dtype=object)
    reason = np.full(n, None, dtype=object)
    dtypes = (c.target_dtype, c.bench_dtype, c.target_dtype_declared, c.bench_dtype_declared)
    if n:  # _dtype_rule once per distinct combination
        codes = group_codes([string_codes(pa.array(col.tolist())) for col in dtypes])
        _, first = np.unique(codes, return_index=True)
        found = [_dtype_rule(*(col[i] for col in dtypes)) for i in first.tolist()]
        low[:] = np.array([f[0] for f in found] + [None], dtype=object)[:-1][codes]
        reason[:] = np.array([f[1] for f in found] + [None], dtype=object)[:-1][codes]
    ts, bs = c.target_shape, c.bench_shape
    nan_inf = np.zeros(n, bool)
    has = np.flatnonzero(np.not_equal(c.err_message, None).astype(bool))  # most rows have no message
    nan_inf[has] = [isinstance(m, str) and MSG_NAN_INF_MISMATCH in m for m in c.err_message[has].tolist()]
    special = (ts.valid & bs.valid & ~ts.equal(bs)) | (_side_nonfinite(c, "target") & ~_side_nonfinite(c, "bench")) \
        | (~c.statistics & nan_inf)
    structural = np.not_equal(reason, None)
    simple = ~special & ~structural
    low[structural & ~special] = None

    def num(k: str) -> tuple[np.ndarray, np.ndarray]:
        return c.values[k], c.valid[k] & ~np.isnan(c.values[k])

    euc_v, euc_ok = num("euc_dist")
    mae_v, mae_ok = num("max_abs_err")
    l2d_v, l2d_ok = num("l2norm_diff")
    euc = np.where(c.statistics, np.abs(l2d_v), np.where(euc_ok, euc_v, mae_v))
    euc_ok = np.where(c.statistics, l2d_ok, euc_ok | mae_ok)
    l2_v, l2_ok = num("bench_l2norm")
    size = np.where(bs.valid, bs.size, 1).astype(np.float64)
    kinds = {d: (1, 0.0, 0.0) if d is not None and d.startswith(_EXACT) else
             (2, *_FLOATS[d]) if d in _FLOATS else (0, 0.0, 0.0) for d in set(low[simple].tolist())}
    kind = np.zeros(n, np.int8)
    eps, sub = np.zeros(n), np.zeros(n)
    for d, (k, e, s) in kinds.items():
        at = simple & (low == d).astype(bool) if d is not None else simple & np.equal(low, None).astype(bool)
        kind[at], eps[at], sub[at] = k, e, s
    go = simple & euc_ok & l2_ok & (kind > 0)
    with np.errstate(all="ignore"):
        positive = l2_v > 0
        fl = np.where(kind == 1, 0.0, np.where(positive, eps / 2 + (sub / 2) * np.sqrt(np.maximum(size, 1)) / l2_v,
                                               np.inf))
        e = np.where(positive, euc / l2_v, np.where(euc == 0, 0.0, np.inf))
        tiny = ~positive & (euc != 0) & np.isinf(fl)
        e = np.where(tiny, euc, e)
        fl = np.where(tiny, (sub / 2) * np.sqrt(np.maximum(size, 1)), fl)
    err[go], err_ok[go], floor[go], floor_ok[go] = e[go], True, fl[go], True
    for i in np.flatnonzero(special).tolist():
        e1, f1, low[i], reason[i] = _pair_error(c.row(i))
        if e1 is not None:
            err[i], err_ok[i] = e1, True
        if f1 is not None:
            floor[i], floor_ok[i] = f1, True
    return err, err_ok, floor, floor_ok, low, reason


def judge_precision_columns(c: Columns, rules: PrecisionRules = PrecisionRules(),
                            ) -> tuple[dict[str, np.ndarray], dict[str, Any] | None]:
    """The precision rules (module docstring) over columns (:class:`Columns`): the one
    implementation, which :func:`judge_precision` and :func:`first_departure` call for rows.

    Returns ({column: array} for ``scaled_err``, ``precision_floor``, ``precision_ratio``
    (float64, NaN where None, with ``<name>_valid`` masks) and ``precision_dtype``,
    ``precision_result``, ``precision_reason``, ``origin_op`` (object arrays), the first
    departure (as :func:`first_departure`, its ``row`` a dict with ``pair_index`` = row
    number and ``origin_op``)). The per-row error, floor and ratio, the running state of
    each iteration and rank (the largest earlier error, an earlier NaN/Inf) and the
    branches judging a departing row are array operations; Python runs only for rows
    :func:`_pair_error` settles by a special case (a reshape, NaN/Inf on one side), for the
    producers of departing inputs and to write the reasons."""
    n = len(c.group)
    err, err_ok, floor, floor_ok, low, reason = _errors_columns(c)
    ratio, ratio_ok = np.full(n, np.nan), err_ok & floor_ok
    with np.errstate(all="ignore"):
        r = np.where((floor == 0) & (err > 0), np.inf, np.where(err == 0, 0.0, err / floor))
    ratio[ratio_ok] = r[ratio_ok]
    departs = np.not_equal(reason, None) | (ratio_ok & (ratio > rules.margin))
    result = np.full(n, PASS, dtype=object)
    origin = np.full(n, None, dtype=object)
    out = {"scaled_err": err, "scaled_err_valid": err_ok, "precision_floor": floor, "precision_floor_valid": floor_ok,
           "precision_ratio": ratio, "precision_ratio_valid": ratio_ok, "precision_dtype": low,
           "precision_result": result, "precision_reason": reason, "origin_op": origin}
    if n == 0:
        return out, None
    g = c.group
    groups = int(g.max()) + 1
    # groups in the order their first row runs; each (iteration, rank)'s running state
    first_run = np.full(groups, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(first_run, g, c.run_rank)
    where = np.zeros(groups, np.int64)
    where[g] = c.where
    inputs = ~c.output
    finite = np.where(err_ok & np.isfinite(err), err, 0.0)
    gmax = np.zeros(groups)
    np.maximum.at(gmax, g, finite)
    ginf = np.zeros(groups, bool)
    ginf[g[err_ok & np.isinf(err)]] = True
    upstream, inf_before = np.zeros(groups), np.zeros(groups, bool)
    seq = np.lexsort((first_run, where))
    w_seq = where[seq]
    for lo, hi in zip(*_runs(w_seq)):
        part = seq[lo:hi]
        m = np.maximum.accumulate(gmax[part])
        upstream[part[1:]] = m[:-1]
        anyinf = np.logical_or.accumulate(ginf[part])
        inf_before[part[1:]] = anyinf[:-1]
    has_in = np.bincount(g[inputs], minlength=groups) > 0
    worst = np.zeros(groups)
    np.maximum.at(worst, g[inputs], np.where(err_ok, err, 0.0)[inputs])
    worst_in = np.where(has_in, worst, upstream)
    for k in np.unique(g[inputs & err_ok & np.isnan(err)]).tolist():  # Python's max, NaN and all
        idx = np.flatnonzero((g == k) & inputs)
        idx = idx[np.argsort(c.run_rank[idx], kind="stable")]
        worst_in[k] = max((float(err[i]) if err_ok[i] else 0.0 for i in idx.tolist()), default=0.0)
    # departing outputs (module docstring, "Error growth"), each branch a mask: propagated
    # (within growth x the inputs' error + margin x floor), an exact-dtype result of inexact
    # inputs, NaN/Inf propagated, cancellation, else error
    wi, before = worst_in[g], inf_before[g]
    none = np.equal(reason, None).astype(bool)
    dep_out = departs & c.output
    with np.errstate(invalid="ignore"):
        bound = rules.growth * wi + rules.margin * np.where(floor_ok, floor, 0.0)
        b1 = dep_out & none & err_ok & (err <= bound)
        b2 = dep_out & ~b1 & none & floor_ok & (floor == 0) & (wi > 0)
        b3 = dep_out & ~b1 & ~b2 & err_ok & np.isinf(err) & ((wi == np.inf) | before)
    rest = dep_out & ~b1 & ~b2 & ~b3
    # the rest: explained by cancellation (an op with inputs, no structural reason), else error
    cancel = _cancellation_columns(c, rest & none & has_in[g], g, groups, err, err_ok, floor, floor_ok, rules)
    fails = rest & ~cancel
    at = np.flatnonzero(b1)
    reason[at] = _format(f"error {{:.3g}} propagated: within {rules.growth:g} x the inputs' {{:.3g}} + "
                         f"{rules.margin:g} x floor", err[at], wi[at])
    at = np.flatnonzero(b2)
    reason[at] = _format("exact-dtype result of inputs with error {:.3g}: rounding decides its ties", wi[at])
    at = np.flatnonzero(b3)
    reason[at] = _format("{}: propagated from earlier nan/inf", reason[at])
    at = np.flatnonzero(cancel)
    reason[at] = _format("error {} relative to a result far smaller than the inputs (cancellation): within the "
                         "inputs' absolute error", _fmts(err[at], err_ok[at]))
    result[b1 | b2 | b3 | cancel] = WARNING
    result[fails] = ERROR
    at = np.flatnonzero(fails & none)
    reason[at] = _format("departs: error {} = {} x the {} floor, inputs' error {:.3g}", _fmts(err[at], err_ok[at]),
                         _fmts(ratio[at], ratio_ok[at]), low[at], wi[at])
    _judge_inputs_columns(c, departs & inputs, g, err, err_ok, floor_ok, floor, ratio, ratio_ok, upstream,
                          inf_before, result, reason, origin, rules)
    return out, _first_departure_columns(c, out, err_ok)


def _format(template: str, *columns: np.ndarray) -> np.ndarray:
    """``template.format(*values)`` of each row of some columns (numpy: floats as Python
    floats, objects as they are), as an object array."""
    out = np.empty(len(columns[0]) if columns else 0, dtype=object)
    out[:] = [template.format(*v) for v in zip(*(col.tolist() for col in columns))]
    return out


def _fmts(values: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """:func:`_fmt` of each value (``n/a`` where not valid), as an object array."""
    out = np.empty(len(values), dtype=object)
    out[:] = [f"{v:.3g}" if ok else "n/a" for v, ok in zip(values.tolist(), valid.tolist())]
    return out


def _cancellation_columns(c: Columns, rows_mask: np.ndarray, g: np.ndarray, groups: int, err, err_ok, floor,
                          floor_ok, rules: PrecisionRules) -> np.ndarray:
    """Which of the departing output rows ``rows_mask`` cancellation explains (an output much
    smaller than its inputs, a mean of centred values or a difference of near-equal ones,
    inherits their *absolute* error; Higham sec. 1.7): the output's RMS (bench L2 norm /
    sqrt(elements)) below 1 % of the largest input RMS of its op, and its RMS error within
    growth x the inputs' largest RMS error + margin x floor x that input RMS."""
    out = np.zeros(len(g), bool)
    if not rows_mask.any():
        return out
    shape = c.bench_shape
    l2, l2_ok = c.values["bench_l2norm"], c.valid["bench_l2norm"] & ~np.isnan(c.values["bench_l2norm"])
    with np.errstate(all="ignore"):
        rms = l2 / np.sqrt(np.maximum(shape.size, 1).astype(np.float64))
        known = l2_ok & shape.valid
        finite = err_ok & np.isfinite(err)
        use = ~c.output & known & finite  # the inputs that count
        in_rms, in_err = np.zeros(groups), np.zeros(groups)
        np.fmax.at(in_rms, g[use], rms[use])  # fmax: a NaN product is skipped, as Python's max(in_err, nan)
        np.fmax.at(in_err, g[use], (err * rms)[use])
        gi_rms, gi_err = in_rms[g], in_err[g]
        u = np.where(floor_ok, floor, 0.0)
        out = rows_mask & known & finite & (gi_rms != 0) & ~(rms >= 0.01 * gi_rms) \
            & (err * rms <= rules.growth * gi_err + rules.margin * u * gi_rms)
    return out


def _judge_inputs_columns(c: Columns, rows_mask, g, err, err_ok, floor_ok, floor, ratio, ratio_ok, upstream,
                          inf_before, result, reason, origin, rules: PrecisionRules) -> None:
    """The departing input rows ``rows_mask``: explained (warning) when a compared op
    produced its bytes, or when NaN/Inf or an earlier compared tensor's error explains it
    (the producer is a cast or an op the dump or the alignment left out); otherwise the
    input is where the departure starts (error; ``origin`` names the producer an op only
    the target has). The producer of each (the last target output with its content hash
    before it) is looked up per row, the branches are masks."""
    rows = np.flatnonzero(rows_mask)
    if not rows.size:
        return
    hashes = {c.target_content_hash[i] for i in rows.tolist()} - {None}
    producers = c.producers(hashes) if hashes else {}
    name = np.full(len(g), None, dtype=object)
    has, compared = np.zeros(len(g), bool), np.zeros(len(g), bool)
    if producers:
        keys = {h: [p[0] for p in v] for h, v in producers.items()}
        for i in rows.tolist():
            h = c.target_content_hash[i]
            if h in producers:
                k = bisect.bisect_left(keys[h], int(c.order[i]))  # producers strictly before the input
                if k:
                    _, name[i], compared[i] = producers[h][k - 1]
                    has[i] = True
    up, before = upstream[g], inf_before[g]
    none = ~truthy_mask(reason)
    a1 = rows_mask & has & compared
    with np.errstate(invalid="ignore"):
        a2 = rows_mask & ~a1 & err_ok & np.isinf(err) & before
        a3 = rows_mask & ~a1 & ~a2 & np.equal(reason, None).astype(bool) & err_ok & \
            (err <= rules.growth * up + rules.margin * np.where(floor_ok, floor, 0.0))
    a4 = rows_mask & ~a1 & ~a2 & ~a3
    at = np.flatnonzero(a1 & none)
    reason[at] = _format("input error propagated from {}", name[at])
    at = np.flatnonzero(a2)
    what = reason[at]
    what[~truthy_mask(what)] = "nan/inf"
    reason[at] = _format("{}: propagated from earlier nan/inf", what)
    at = np.flatnonzero(a3)
    produced = _format(" (produced by {})", name[at])
    produced[~has[at]] = ""
    reason[at] = _format(f"input error {{:.3g}} within {rules.growth:g} x the largest earlier error {{:.3g}}{{}}",
                         err[at], up[at], produced)
    at = np.flatnonzero(a4)
    what = reason[at]
    blank = ~truthy_mask(what)
    what[blank] = _format("input departs: error {} = {} x floor", _fmts(err[at][blank], err_ok[at][blank]),
                          _fmts(ratio[at][blank], ratio_ok[at][blank]))
    by = has[at]
    reason[at] = np.where(by, _format("{}; produced by {}, an op only the target has", what, name[at]),
                          _format("{}; no compared op produced it (parameter or data input)", what))
    origin[at[by]] = name[at[by]]
    result[a1 | a2 | a3] = WARNING
    result[a4] = ERROR


def truthy_mask(values: np.ndarray) -> np.ndarray:
    """bool(v) per element of an object array."""
    if values.size == 0:
        return np.zeros(0, bool)
    return np.frompyfunc(bool, 1, 1)(values).astype(bool)


def _runs(values: np.ndarray) -> tuple[list[int], list[int]]:
    """(starts, ends) of the runs of equal values of a sorted array."""
    if values.size == 0:
        return [], []
    cut = np.flatnonzero(values[1:] != values[:-1]) + 1
    return [0, *cut.tolist()], [*cut.tolist(), int(values.size)]


def _first_departure_columns(c: Columns, out: dict[str, np.ndarray], err_ok) -> dict[str, Any] | None:
    failing = np.flatnonzero(out["precision_result"] == ERROR)
    if not failing.size:
        return None
    first = int(failing[np.argmin(c.run_rank[failing])])
    group = np.flatnonzero(c.group == c.group[first]).tolist()
    pick = next((i for i in group if c.output[i] and out["precision_result"][i] == ERROR), first)

    def value(name: str, i: int):
        return float(out[name][i]) if out[f"{name}_valid"][i] else None

    def side(i: int) -> dict:
        return {"io": c.io[i], "slot": c.slot[i], "scaled_err": value("scaled_err", i),
                "floor": value("precision_floor", i), "ratio": value("precision_ratio", i),
                "target_dtype": c.target_dtype[i], "bench_dtype": c.bench_dtype[i],
                "result": out["precision_result"][i], "reason": out["precision_reason"][i]}

    return {"row": {"pair_index": pick, "origin_op": out["origin_op"][pick]}, "origin_op": out["origin_op"][pick],
            "inputs": [side(i) for i in group if not c.output[i]],
            "outputs": [side(i) for i in group if c.output[i]]}
