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

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from dumpdb.compare.metrics import MSG_NAN_INF_MISMATCH

__all__ = ["PrecisionRules", "dtype_floor", "judge_precision", "first_departure", "lowest_precision"]

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
    low = lowest_precision(tdt, bdt)
    if low is None:
        if tdt != bdt:
            return None, None, None, f"dtypes differ (target {tdt}, bench {bdt}) and are not two floats"
        low = tdt
    # A file declared Float16 whose payload is float32 (real MindSpore 2.10 CPU quirk) was
    # computed in float16: the declared dtype sets the floor when it is lower.
    for declared in (r.get("target_dtype_declared"), r.get("bench_dtype_declared")):
        d = _DECLARED.get((declared or "").lower())
        if d is not None and low in _FLOATS:
            low = lowest_precision(low, d)
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


def judge_precision(rows: list[dict], producers: dict[str, list[tuple[tuple, str, bool]]] | None = None,
                    rules: PrecisionRules = PrecisionRules()) -> None:
    """Add the precision columns to each result row (dicts, in execution order):
    ``scaled_err`` (relative Euclidean error), ``precision_floor``, ``precision_ratio``
    (err / floor), ``precision_dtype`` (the lower-precision dtype), ``precision_result``
    (pass / warning / error) and ``precision_reason``.

    ``producers``: content hash -> [(order key, op name, compared)] of the target's output
    tensors (every target op, compared or not), to find the op that produced an input.
    Rows are grouped by op call as the msprobe verdicts are; see the module docstring.
    """
    ops: dict[tuple, list[dict]] = defaultdict(list)
    for r in sorted(rows, key=run_order):
        err, floor, low, structural = _pair_error(r)
        ratio = None
        if err is not None and floor is not None:
            ratio = math.inf if floor == 0 and err > 0 else (0.0 if err == 0 else err / floor)
        r.update(scaled_err=err, precision_floor=floor, precision_ratio=ratio, precision_dtype=low,
                 precision_result=PASS, precision_reason=structural)
        r["_departs"] = structural is not None or (ratio is not None and ratio > rules.margin)
        ops[(r["iteration"], r["rank"], r["graph_id"], r["call_index"], r["target_name"])].append(r)
    # Ops dumped without inputs (input_output: 2): the largest error of any earlier compared
    # output of the iteration stands in for their inputs' error (never blames a propagated one).
    upstream: dict[tuple, float] = {}
    upstream_inf: dict[tuple, bool] = {}  # an earlier op already holds nan/inf the bench lacks
    for group in ops.values():
        inputs = [r for r in group if r["io"] != "output"]
        outputs = [r for r in group if r["io"] == "output"]
        where = (group[0]["iteration"], group[0]["rank"])
        inf_before = upstream_inf.get(where, False)
        if any(r["scaled_err"] is not None and math.isinf(r["scaled_err"]) for r in group):
            upstream_inf[where] = True
        for r in inputs:
            if r["_departs"]:
                _judge_input(r, producers, rules, upstream.get(where, 0.0), inf_before)
        upstream[where] = max([upstream.get(where, 0.0), *(_finite(r["scaled_err"]) for r in inputs)])
        if inputs:
            worst_in = max((r["scaled_err"] or 0.0 for r in inputs), default=0.0)
        else:
            worst_in = upstream.get(where, 0.0)
        upstream[where] = max([upstream.get(where, 0.0), *(_finite(r["scaled_err"]) for r in outputs)])
        for r in outputs:
            if not r["_departs"]:
                continue
            bound = rules.growth * worst_in + rules.margin * (r["precision_floor"] or 0.0)
            err = r["scaled_err"]
            if r["precision_reason"] is None and err is not None and err <= bound:
                r["precision_result"] = WARNING
                r["precision_reason"] = (f"error {err:.3g} propagated: within {rules.growth:g} x the inputs' "
                                         f"{worst_in:.3g} + {rules.margin:g} x floor")
            elif r["precision_reason"] is None and r["precision_floor"] == 0 and worst_in > 0:
                # an integer/bool result of inexact inputs (a comparison, an argmax mask):
                # rounding of the inputs decides ties, so any input error can flip elements
                r["precision_result"] = WARNING
                r["precision_reason"] = (f"exact-dtype result of inputs with error {worst_in:.3g}: "
                                         "rounding decides its ties")
            elif err is not None and math.isinf(err) and (worst_in == math.inf or inf_before):
                r["precision_result"] = WARNING
                r["precision_reason"] = f"{r['precision_reason']}: propagated from earlier nan/inf"
            elif r["precision_reason"] is None and _cancellation(r, inputs, rules):
                r["precision_result"] = WARNING
                r["precision_reason"] = (f"error {_fmt(err)} relative to a result far smaller than the inputs "
                                         "(cancellation): within the inputs' absolute error")
            else:
                r["precision_result"] = ERROR
                if r["precision_reason"] is None:
                    r["precision_reason"] = (f"departs: error {_fmt(err)} = {_fmt(r['precision_ratio'])} x the "
                                             f"{r['precision_dtype']} floor, inputs' error {worst_in:.3g}")
    for r in rows:
        r.pop("_departs", None)


def _rms(l2, shape) -> float | None:
    l2 = _num(l2)
    if l2 is None or shape is None:
        return None
    return l2 / math.sqrt(max(math.prod(shape), 1))


def _cancellation(r: dict, inputs: list[dict], rules: PrecisionRules) -> bool:
    """An output much smaller than its inputs (a mean of centred values, a difference of
    near-equal ones) inherits their *absolute* error: explained when its RMS error stays
    within growth x the inputs' RMS error + margin x u x the inputs' RMS (Higham sec. 1.7)."""
    out_rms, in_rms = _rms(r.get("bench_l2norm"), r.get("bench_shape")), 0.0
    in_err = 0.0
    for x in inputs:
        rms = _rms(x.get("bench_l2norm"), x.get("bench_shape"))
        if rms is None or x.get("scaled_err") is None or not math.isfinite(x["scaled_err"]):
            continue
        in_rms = max(in_rms, rms)
        in_err = max(in_err, x["scaled_err"] * rms)
    err = r.get("scaled_err")
    if out_rms is None or err is None or not math.isfinite(err) or in_rms == 0 or out_rms >= 0.01 * in_rms:
        return False
    u = (r.get("precision_floor") or 0.0)
    return err * out_rms <= rules.growth * in_err + rules.margin * u * in_rms


def run_order(r: dict) -> tuple:
    """The order ops really ran: dump timestamps where the dump has them (MindSpore CPU runs
    ops in another order than ``execution_order`` lists them), then the pair order."""
    ts = r.get("timestamp")
    return (r["iteration"] is None, r["iteration"] or 0, r["rank"] or 0, ts is None, ts or 0, r["pair_index"])


def _finite(v) -> float:
    return v if v is not None and math.isfinite(v) else 0.0


def _fmt(v) -> str:
    return "n/a" if v is None else f"{v:.3g}"


def _judge_input(r: dict, producers, rules: PrecisionRules, upstream: float, inf_before: bool = False) -> None:
    """A departing input: explained when a compared op produced its bytes, or when an
    earlier compared tensor's error explains it (the producer is a cast or an op the dump
    or the alignment left out); otherwise the input is where the departure starts."""
    producer = None
    h = r.get("target_content_hash")
    if producers and h in producers:
        before = [p for p in producers[h] if p[0] < r["_order"]] if r.get("_order") is not None else producers[h]
        producer = before[-1] if before else None
    if producer is not None and producer[2]:
        r["precision_result"] = WARNING
        r["precision_reason"] = r["precision_reason"] or f"input error propagated from {producer[1]}"
        return
    err = r["scaled_err"]
    if err is not None and math.isinf(err) and inf_before:
        r["precision_result"] = WARNING
        r["precision_reason"] = f"{r['precision_reason'] or 'nan/inf'}: propagated from earlier nan/inf"
        return
    if r["precision_reason"] is None and err is not None and \
            err <= rules.growth * upstream + rules.margin * (r["precision_floor"] or 0.0):
        r["precision_result"] = WARNING
        r["precision_reason"] = (f"input error {err:.3g} within {rules.growth:g} x the largest earlier error "
                                 f"{upstream:.3g}" + (f" (produced by {producer[1]})" if producer else ""))
        return
    r["precision_result"] = ERROR
    what = r["precision_reason"] or \
        f"input departs: error {_fmt(r['scaled_err'])} = {_fmt(r['precision_ratio'])} x floor"
    if producer is not None:
        r["precision_reason"] = f"{what}; produced by {producer[1]}, an op only the target has"
        r["origin_op"] = producer[1]
    else:
        r["precision_reason"] = f"{what}; no compared op produced it (parameter or data input)"


def first_departure(rows: list[dict]) -> dict[str, Any] | None:
    """The first op (by :func:`run_order`) with a precision ``error`` row: its rows as
    ``inputs``/``outputs`` lists of {io, slot, err, floor, ratio, dtypes, result, reason}.
    None when nothing departs beyond precision."""
    failing = [r for r in rows if r.get("precision_result") == ERROR]
    if not failing:
        return None
    first = min(failing, key=run_order)
    key = (first["iteration"], first["rank"], first["graph_id"], first["call_index"], first["target_name"])
    group = [r for r in rows if (r["iteration"], r["rank"], r["graph_id"], r["call_index"], r["target_name"]) == key]
    out = next((r for r in group if r["io"] == "output" and r["precision_result"] == ERROR), first)

    def side(r: dict) -> dict:
        return {"io": r["io"], "slot": r["slot"], "scaled_err": r["scaled_err"], "floor": r["precision_floor"],
                "ratio": r["precision_ratio"], "target_dtype": r["target_dtype"], "bench_dtype": r["bench_dtype"],
                "result": r["precision_result"], "reason": r["precision_reason"]}

    return {"row": out, "origin_op": out.get("origin_op"),
            "inputs": [side(r) for r in group if r["io"] != "output"],
            "outputs": [side(r) for r in group if r["io"] == "output"]}
