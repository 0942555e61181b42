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
*explained* when ``err_out <= growth * max(err_in) + margin * floor_out``. The growth
allowance is calibrated per op type, direction (forward/backward) and dtype from clean pairs
(``precision_growth.json`` in this package, written by ``scripts/calibrate_precision.py``:
a safety factor over the largest growth clean pairs of that kind showed; docs/precision.md
gives the data and the rule); a statistics-mode pair (whose error is only a lower bound,
so growth ratios mean less) and an op type the table does not know get ``growth`` (default 16:
LayerNorm, softmax and the matrix products of a Transformer amplify relative errors by less
on real fp16-vs-fp32 pairs). So a LayerNorm whose error grows 3.5x where clean LayerNorms
grow ~1.0x departs. Per row, the precision result is:

``pass``     no departure;
``noise``    both sides are rounding noise (below): the error says nothing, never departs;
``warning``  departs, explained by its inputs (error propagated from earlier ops; an
             integer/bool result, e.g. a comparison, of inputs that carry any error);
             every departing row of a module/cell record (below);
``error``    departs and not explained: the op's output when its inputs do not explain it;
             an input when no compared op produced it (a parameter or data input, or the
             output of an op only the target has: an inserted op, named in the reason,
             unless its error is within ``CAST_ROUNDINGS`` unit roundoffs of the target's
             own lowest precision: the Casts a mixed-precision run inserts);
             the outputs of an op call whose recorded scalar arguments differ (``arg_diff``,
             when the alignment gives that column: ``eps: 1e-05 -> 0.1``).

Noise
=====
A tensor that is zero in exact arithmetic (a sum or gradient whose terms cancel: the bias
gradient of an attention key projection, since softmax ignores a per-query constant) holds
only rounding noise on both sides, of the size of one rounding of the operands that
cancelled (Higham sec. 1.7); its relative error is meaningless. A departing row is
``noise`` when its two sides disagree by half or more (``err >= 0.5``) and both sides' RMS
(bench RMS x (1 + err) bounds the target's) is at most ``noise`` (default 4) x ``u_w`` x the
op's scale, where the op's scale is the largest bench RMS among the *other* tensors of its
op call and ``u_w`` the unit roundoff of the working precision: the lowest-precision float
any pair of the compare was judged at (a bfloat16-autocast run's float32 gradients are
computed in bfloat16). Where its op's inputs count its error (the largest input error, the
running largest earlier error), a noise row counts by its absolute error over the op's
scale. A tensor without such a scale (a per-parameter ``all_reduce``) is noise when each
side's RMS is within ``noise`` x its own run's unit roundoff x the largest RMS of its
iteration and rank, the ratio of the sides' RMS within 8x of the ratio of the runs' unit
roundoffs (1 for two runs of one precision: a rewrite's or another rank's summation order)
and the sides disagree by half or more; a collective's output is noise when its inputs on
every rank are noise or do not depart.

Exact context
=============
Rounding needs an operation: a tensor no op computed (a parameter, a data input) is the
same bits in two runs that hold the same values, and an op of bitwise-equal inputs gives
bitwise-equal outputs (the same kernel on the same CPU). So an input row whose sides differ
at all (``err > 0``, within the margin or not) while every earlier tensor of its iteration
and rank is bitwise equal (the running largest earlier error is 0, no NaN/Inf before),
both sides of one float dtype and no target op (compared or not) produced its bytes, is
where the departure starts: an ``error`` (a changed parameter or data input, however
small: an fp32 weight scaled by 1 + 1e-6 differs by 18 x the float32 floor). An input an
op produced is left to the rules above (a rewrite's own rounding).

Inputs no compared op explains
==============================
A departing input that no target op produced, in the forward pass, is a copy the dump left
out (an unrecorded view, transpose or cast) of an earlier tensor, or a parameter or data
input: it is explained by the running largest earlier error only within ``LEAF_GROWTH``
(2.5: clean pairs showed at most 1.0x), not ``growth``; a bfloat16 run's fc1 weight scaled
by 2.7x the clean noise departs there. An input an op only the target has produced (a
swapped activation, a rewrite's ops by hand, a cast) is judged, whether or not it exceeds
the margin, by the error of that op's own inputs (followed back through the target's ops
only it has, at most ``CHAIN_DEPTH``): it departs beyond ``CHAIN_GROWTH`` (2.5) x that error +
``CHAIN_ROUNDINGS`` x floor (a silu in place of a gelu in bfloat16: 0.168 against its
input's 0.0047, under the margin's 64 x 2^-8 = 0.25 and the 16 x largest earlier error),
unless it is a cast within ``CAST_ROUNDINGS``. The op named as where such a departure
starts (``origin_op``) is the first of a chain of one-input ops only the target has (the
two Casts MindSpore O2 puts before a weight's MatMul: the first one).

Collectives and misattributed records
=====================================
A collective's output (``all_reduce``, ``all_gather``, ``reduce_scatter``, ``broadcast``,
``all_to_all``; ``columns.collectives``) combines every rank's input of the same call (same
iteration and op name): its inputs' error is the largest over all ranks, so rank 0's
``all_reduce`` of rank 1's changed gradient is propagated, not a departure of rank 0. A
backward record's output ``k`` is the gradient of its forward record's input ``k`` and has
its shape; a departing output pair of different shapes where one side keeps that and the
other does not (the fp32 run's ``x.float()`` of a float32 tensor returns ``x``: msprobe's
backward hook then records the preceding op's gradients) is not comparable: a ``warning``.

Backward records
================
An msprobe backward record ``X.backward`` (inputs: the gradients of ``X.forward``'s
outputs; outputs: those of its inputs) computes with the tensors autograd saved from
``X.forward``: its inputs and outputs. Its inputs' error is the larger of its own inputs'
and its forward call's inputs'. Where that forward input differs (error ``e > 0``), an
element within the error of a kink (relu's zero, max-pool's tie, a clamp's bound) may
take the other branch in the target, and that element's gradient differs by up to the
largest incoming gradient ``G``: the elementwise backward output (the shape of an incoming
gradient) of a piecewise-linear op (``KINKED``: relu, leaky_relu, hardtanh, clamp, abs...)
of ``N`` elements may also differ by
``sqrt(k) x G`` with ``k = max(1, ceil(N e))`` (docs/precision.md: a bfloat16 relu
backward of 32 elements at error 0.3 whose incoming gradient is at 0.0028 and whose
forward input, at 0.005, flipped one element's sign).

Not comparable
==============
An in-place optimizer kernel updates its inputs (``var``, ``m``, ``v``); MindSpore's CPU
dump writes an in-place kernel's inputs after it ran (quirk 6 of
``shared/corpus/mindspore-cpu/README.md``: ApplyMomentum's input 0 holds the updated
value), and the *output* files of AdamWeightDecay hold device buffers it never wrote,
reused across calls: an fp16-O2 run's ``AdamWeightDecay-op11`` outputs the bytes of
``-op10``'s input 8. Every optimizer-phase output of an op type some call of which outputs
bytes an earlier op call of its iteration and rank held (not its own inputs', not a
constant) is *not comparable*: a ``warning`` naming this, never a departure, and its error
does not count as anyone's input error. The inputs are compared as they are.

Containers
==========
Module and cell records (msprobe levels L0 and mix: ``Module.*``, ``Cell.*``; not their
``parameters_grad`` records) hold what the ops inside them computed, at the container's
boundary dtype: they are never an ``error`` (a departing row becomes a ``warning`` naming
its reason) and do not raise the running largest earlier error; the op inside that departs
is the answer.

The producer of an input is the last target op output (not a module/cell record: it holds a
copy of what an op inside computed) before it with the same content hash (MindSpore dumps an
op's input as the bytes its producer wrote). A compared producer explains
a departing input only if its own pair carries the error (the input's error within growth x
the largest error of a compared output holding those bytes + margin x floor): when the
producer's output matches the bench but the input does not, the op reads other data than
the bench's op (a residual add dropped), and the input is where the departure starts. Ops are taken in the order
they ran (dump timestamps, else execution order: ``columns.run_order``). The first
departure is the first op with an ``error`` row in each iteration and rank; across ranks,
the one that ran first (timestamps when every rank has them, else the place in its own
rank's order), not the lowest rank number; per phase (``columns.phases``: forward,
backward, optimizer) the same.
"""

from __future__ import annotations

import bisect
import functools
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import ml_dtypes
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dumpdb.compare.columns import (
    BACKWARD,
    OPTIMIZER,
    PHASES,
    Shapes,
    Texts,
    collectives,
    containers,
    filled,
    group_codes,
    keys,
    nonempty,
    phase_marks,
    phases,
    replaced,
    string_codes,
    strings,
    truthy,
    unique_keys,
)
from dumpdb.compare.metrics import MSG_NAN_INF_MISMATCH

# None as a 0-d object array, for np.equal/np.not_equal over object columns (numpy's stubs take no None
# operand; the comparison is the same)
_NONE = np.array(None, dtype=object)

__all__ = ["PrecisionRules", "dtype_floor", "lowest_precision", "Columns", "judge_precision_columns",
           "first_departures", "growth_table", "target_unit", "CAST_ROUNDINGS", "RESULTS", "NOISE"]

PASS, WARNING, ERROR, NOISE = "pass", "warning", "error", "noise"
RESULTS = (PASS, WARNING, ERROR, NOISE)  # precision_result values

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


# an input an op only the target has produced is explained by the target's own precision
# when its error is within this many unit roundoffs of the target's lowest float: a cast
# rounds once (relative L2 error <= u, Higham Thm 2.2); one more for a value rounded in that
# precision before the cast
CAST_ROUNDINGS = 2.0
# an input no recorded op produced (an unrecorded view, transpose or cast of an earlier
# tensor) in the forward pass carries one earlier error at most this many times: clean
# pairs showed at most 1.0x the largest earlier error (153 such forward inputs of the 135
# clean and rewritten pairs of docs/divergence_eval.md's 329; up to 1.44x in backward and
# optimizer, which keep the growth default; docs/precision.md)
LEAF_GROWTH = 2.5
# an input an op only the target has produced (a swapped activation, a rewrite's ops by
# hand, a cast) is explained by the error of that op's own inputs (found back through
# the target's ops only it has, at most CHAIN_DEPTH of them) x growth, plus this many
# roundings of its dtype (one per op of a norm written by hand, nine ops, and margin)
CHAIN_ROUNDINGS = 16.0
CHAIN_DEPTH = 12
# ...and grows that error at most this many times. Ops only the target has are never
# compared, so the per-op-type table (GROWTH_TABLE) has no entry for them: this is their own
# allowance, calibrated as the table's are (2 x the largest growth clean pairs showed, at
# least 2): the clean and rewritten pairs of docs/divergence_eval.md's 329 and held-out 121
# showed 3 such inputs beyond a cast's rounding, at 0.99 to 1.13x (docs/precision.md); 16
# (the growth default) let a gelu or leaky_relu in place of a relu pass (0044, 0058)
CHAIN_GROWTH = 2.5
GROWTH_TABLE = "precision_growth.json"  # the calibrated allowances, in this package (scripts/calibrate_precision.py)


@functools.lru_cache(maxsize=1)
def growth_table() -> dict[str, float]:
    """The packaged calibrated growth allowances: ``"op_type|direction|dtype"`` -> factor
    (``direction`` forward or backward, ``dtype`` the pair's lower precision), read from
    ``dumpdb/compare/precision_growth.json`` (written by ``scripts/calibrate_precision.py``
    from clean pairs; docs/precision.md). Empty when the file is absent."""
    try:
        text = resources.files("dumpdb.compare").joinpath(GROWTH_TABLE).read_text()
    except (FileNotFoundError, OSError):
        return {}
    return {k: float(v["allowance"]) for k, v in json.loads(text)["growth"].items()}


def growth_key(op_type: str | None, phase: str | None, dtype: str | None) -> str:
    """The growth table's key of an op: ``op_type|forward|dtype`` or ``op_type|backward|dtype``
    (an optimizer op is a forward computation)."""
    return f"{op_type}|{'backward' if phase == BACKWARD else 'forward'}|{dtype}"


@dataclass(frozen=True)
class PrecisionRules:
    """``margin``: a pair departs when its error exceeds ``margin`` x the precision floor;
    ``growth``: how much an op may amplify its inputs' relative error when ``table`` has no
    allowance for its op type, direction and dtype; ``table``: calibrated allowances
    (:func:`growth_key` -> factor; None: the packaged :func:`growth_table`, ``{}``: none);
    ``noise``: a pair whose both sides' RMS is within ``noise`` x the working precision's
    unit roundoff x its op's scale is rounding noise (module docstring)."""

    margin: float = 64.0
    growth: float = 16.0
    noise: float = 4.0
    table: Mapping[str, float] | None = field(default=None, compare=False, hash=False)

    def allowances(self) -> Mapping[str, float]:
        """The calibrated allowances in force."""
        return growth_table() if self.table is None else self.table

    def growth_of(self, op_type: np.ndarray, phase: np.ndarray, dtype: np.ndarray) -> np.ndarray:
        """Each row's growth allowance (float64): the table's entry for its op type, phase
        direction and dtype, else ``growth``. Object arrays in, one lookup per distinct key."""
        table = self.allowances()
        if not table or not len(op_type):
            return np.full(len(op_type), self.growth)
        direction = np.where(np.equal(phase, BACKWARD).astype(bool), "backward", "forward").astype(object)
        enc = pc.dictionary_encode(keys(op_type, direction, dtype))  # growth_key's text of every row
        found = np.array([table.get(k, self.growth) for k in enc.dictionary.to_pylist()], np.float64)
        return found[enc.indices.to_numpy(zero_copy_only=False)]


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


def _objects(values) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


# -- the same judgment over columns (the compare engine: no dict per pair) -------------------

_NUMBERS = ("flat_euc_dist", "euc_dist", "max_abs_err", "l2norm_diff", "bench_l2norm", "target_max", "target_min",
            "bench_max", "bench_min")
_TEXTS = ("target_dtype", "bench_dtype", "target_dtype_declared", "bench_dtype_declared", "err_message",
          "target_content_hash")
_DTYPES = ("target_dtype", "bench_dtype", "target_dtype_declared", "bench_dtype_declared")
OUTPUT_COLUMNS = ("scaled_err", "precision_floor", "precision_ratio", "precision_dtype", "precision_result",
                  "precision_reason")


@dataclass(kw_only=True, eq=False, repr=False)
class Columns:
    """What :func:`judge_precision_columns` reads, one entry per result row (numpy):
    ``group`` (int64 op-call code: same iteration, rank, graph_id, call_index and target
    name), ``where`` (int64 code of the row's (iteration, rank)), ``run_rank`` (int64: the
    row's place in :func:`dumpdb.compare.columns.run_order`), ``output`` (bool: io is 'output'), ``statistics``
    (bool: the row's mode), ``order`` (int64: the target tensor's place among all target
    tensors in the producers' order), ``values``/``valid`` (float64 and validity) of
    ``flat_euc_dist``, ``euc_dist``, ``max_abs_err``, ``l2norm_diff``, ``bench_l2norm``,
    ``target_max``/``min``, ``bench_max``/``min``; object arrays ``target_dtype``,
    ``bench_dtype``, ``target_dtype_declared``, ``bench_dtype_declared``, ``err_message``,
    ``target_content_hash``; ``io``, ``slot`` (object arrays or Arrow arrays: read at the
    first departure's rows only); ``target_shape``/``bench_shape``
    (:class:`dumpdb.compare.columns.Shapes`); ``producers``: a function from a set of
    content hashes to {hash: [(order rank, op name, compared)]} of the target's output
    tensors with those hashes (every target op, compared or not; ascending order ranks:
    the tensor's place in the target's execution order).

    Optional (absent: the rules that read them do not apply): object arrays
    ``target_name``, ``scope_name``, ``op_type`` (phases, containers, the growth table;
    each may come instead as an Arrow string array in ``arrow``, which the rules read as
    it is: 500,000 distinct names are 80 MB as Python strings),
    ``arg_diff`` (the alignment's scalar-argument difference, None where they agree);
    ``iteration`` (int64) and ``timestamp`` (float64, NaN where NULL) for the order across
    ranks; ``inputs_of``: a function from a target op's order rank to its input tensors,
    [(content hash, order rank of the call)] (the rules that follow an input back through
    ops only the target has); ``bench_content_hash`` (object array: the bench tensor's
    payload hash, for the in-place optimizer outputs rule on the bench side); ``name_masks``
    (a function giving :func:`name_masks` of the rows' texts, which the caller computes
    beside the rules; computed here otherwise)."""

    group: np.ndarray
    where: np.ndarray
    run_rank: np.ndarray
    output: np.ndarray
    statistics: np.ndarray
    order: np.ndarray
    values: dict[str, np.ndarray]
    valid: dict[str, np.ndarray]
    target_dtype: np.ndarray
    bench_dtype: np.ndarray
    target_dtype_declared: np.ndarray
    bench_dtype_declared: np.ndarray
    err_message: np.ndarray
    target_content_hash: np.ndarray
    io: np.ndarray | pa.Array  # read at a few rows only (the first departure's op): Arrow as it is
    slot: np.ndarray | pa.Array
    target_shape: Shapes
    bench_shape: Shapes
    producers: Callable[[set[str]], Mapping[str, list[tuple[int, str | None, bool]]]]
    target_name: np.ndarray | None = None
    scope_name: np.ndarray | None = None
    op_type: np.ndarray | None = None
    arg_diff: np.ndarray | None = None
    iteration: np.ndarray | None = None
    timestamp: np.ndarray | None = None
    inputs_of: Callable[[int], list[tuple[str, int]]] | None = None
    bench_content_hash: np.ndarray | None = None
    # target_name, scope_name, op_type (and the dtype columns) as Arrow string arrays where
    # the caller holds them (the same values as the object arrays, or for the names in their
    # place): the rules that match text
    # in Arrow then read them without converting the object arrays back (0.25 s of CPU for
    # 500,000 rows), and names given only here are never made Python strings
    arrow: Mapping[str, pa.Array] = field(default_factory=dict)
    # name_masks(target_name, scope_name, op_type) of these rows' texts where the caller
    # computes them beside the rules (the engine: in the verdicts' thread), as a function
    # giving them once they are there
    name_masks: Callable[[], tuple[np.ndarray, tuple[np.ndarray, np.ndarray], np.ndarray]] | None = None

    def text(self, name: str) -> pa.Array:
        """A text column (``target_name``, ``scope_name``, ``op_type``, a dtype column) as an
        Arrow string array: ``arrow``'s where given, else the object array converted (all
        NULL where the caller gave neither form)."""
        if name in self.arrow:
            return self.arrow[name]
        return pa.array(_optional(self, name, len(self.group)), pa.string())

    def objects(self, name: str) -> np.ndarray:
        """``target_name``, ``scope_name`` or ``op_type`` as an object array (None for NULL),
        converted from ``arrow`` when the caller gave only that form."""
        if getattr(self, name, None) is None and name in self.arrow:
            return strings(self.arrow[name])
        return _optional(self, name, len(self.group))

    def row(self, i: int) -> dict:
        """Row ``i`` as a dict, as :func:`_pair_error` reads it (None for NULL)."""
        r: dict[str, Any] = {k: (float(self.values[k][i]) if self.valid[k][i] else None) for k in _NUMBERS}
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


def _errors_columns(c: Columns) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, Texts]:
    """:func:`_pair_error` of every row: (err, err valid, floor, floor valid, dtype, reason);
    vectorised, with the rows it settles by a special case (a reshape, NaN/Inf only on the
    target side or at different positions) computed by _pair_error itself."""
    n = len(c.group)
    err, err_ok = np.full(n, np.nan), np.zeros(n, bool)
    floor, floor_ok = np.full(n, np.nan), np.zeros(n, bool)
    low = np.full(n, None, dtype=object)
    reason = np.full(n, None, dtype=object)
    dtypes = tuple(getattr(c, k) for k in _DTYPES)
    codes, found = np.zeros(n, np.int64), []
    if n:  # _dtype_rule once per distinct combination (codes 0 upwards: the first row of each)
        codes = group_codes([string_codes(c.text(k)) for k in _DTYPES])
        first, _ = unique_keys(codes)
        found = [_dtype_rule(*(col[i] for col in dtypes)) for i in first.tolist()]
        if len(found) == 1:  # one combination (most compares): every row the same objects
            low.fill(found[0][0])
            reason.fill(found[0][1])
        else:
            low[:] = np.array([f[0] for f in found] + [None], dtype=object)[:-1][codes]
            reason[:] = np.array([f[1] for f in found] + [None], dtype=object)[:-1][codes]
    ts, bs = c.target_shape, c.bench_shape
    nan_inf = np.zeros(n, bool)
    has = np.flatnonzero(np.not_equal(c.err_message, _NONE).astype(bool))  # most rows have no message
    nan_inf[has] = [isinstance(m, str) and MSG_NAN_INF_MISMATCH in m for m in c.err_message[has].tolist()]
    special = (ts.valid & bs.valid & ~ts.equal(bs)) | (_side_nonfinite(c, "target") & ~_side_nonfinite(c, "bench")) \
        | (~c.statistics & nan_inf)
    structural = np.array([f[1] is not None for f in found], bool)[codes]  # a dtype rule's reason
    simple = ~special & ~structural
    low[structural & ~special] = None

    def num(k: str) -> tuple[np.ndarray, np.ndarray]:
        return c.values[k], c.valid[k] & ~np.isnan(c.values[k])

    euc_v, euc_ok = num("euc_dist")
    mae_v, mae_ok = num("max_abs_err")
    l2d_v, l2d_ok = num("l2norm_diff")
    if c.statistics.all():  # every pair by its statistics: the L2 norms' difference alone
        euc, euc_ok = np.abs(l2d_v), l2d_ok
    else:
        euc = np.where(c.statistics, np.abs(l2d_v), np.where(euc_ok, euc_v, mae_v))
        euc_ok = np.where(c.statistics, l2d_ok, euc_ok | mae_ok)
    l2_v, l2_ok = num("bench_l2norm")
    size = np.where(bs.valid, bs.size, 1).astype(np.float64)
    # (kind: 0 none, 1 exact, 2 float; eps; smallest subnormal) of each combination's dtype,
    # spread to the simple rows (their dtype is their combination's)
    kinds = [(1, 0.0, 0.0) if d is not None and d.startswith(_EXACT) else
             (2, *_FLOATS[d]) if d in _FLOATS else (0, 0.0, 0.0) for d in (f[0] for f in found)]
    if len(kinds) == 1:  # one combination: its values where simple (no per-row lookup)
        kind = np.where(simple, np.int8(kinds[0][0]), np.int8(0))
        eps = np.where(simple, kinds[0][1], 0.0)
        sub = np.where(simple, kinds[0][2], 0.0)
    else:
        kind = np.where(simple, np.array([k[0] for k in kinds], np.int8)[codes], 0).astype(np.int8)
        eps = np.where(simple, np.array([k[1] for k in kinds], np.float64)[codes], 0.0)
        sub = np.where(simple, np.array([k[2] for k in kinds], np.float64)[codes], 0.0)
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
    texts = Texts(n)
    written = structural.copy()  # the rows with a reason: the dtype rules', then _pair_error's
    at = np.flatnonzero(special)
    written[at] = [r is not None for r in reason[at].tolist()]
    at = np.flatnonzero(written)
    texts[at] = reason[at]
    return err, err_ok, floor, floor_ok, low, texts


def name_masks(target_name: pa.Array, scope_name: pa.Array,
               op_type: pa.Array) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray], np.ndarray]:
    """What the rules read of the rows' texts (Arrow string arrays, one element per row):
    (:func:`~dumpdb.compare.columns.containers` of op type and name, bool per row;
    :func:`~dumpdb.compare.columns.phase_marks` of name and scope; the
    :func:`~dumpdb.compare.columns.collectives` among the op types, bool per row). Arrow's
    text kernels alone (no GIL held meanwhile): the engine runs this in a second thread."""
    # a few distinct op types: each tested once
    op_types = pc.dictionary_encode(op_type.combine_chunks() if isinstance(op_type, pa.ChunkedArray) else op_type)
    return containers(op_types, target_name), phase_marks(target_name, scope_name), collectives(op_types)


def judge_precision_columns(c: Columns, rules: PrecisionRules = PrecisionRules(),
                            ) -> tuple[dict[str, np.ndarray], dict[str, Any] | None]:
    """The precision rules (module docstring) over columns (:class:`Columns`): the one
    implementation (``tests/precision_rows.py`` wraps it for rows of dicts).

    Returns ({column: array} for ``scaled_err``, ``precision_floor``, ``precision_ratio``
    (float64, NaN where None, with ``<name>_valid`` masks) and ``precision_dtype``,
    ``precision_result``, ``precision_reason``, ``origin_op``, ``phase`` (object arrays),
    ``inputs_error`` and ``growth`` (float64: the error of each row's op's inputs and the
    growth allowance its output is judged with),
    the first departure (:func:`first_departures`)). The per-row error, floor and ratio,
    the running state of each iteration and rank (the largest earlier error, an earlier
    NaN/Inf) and the branches judging a departing row are array operations; Python runs
    only for rows :func:`_pair_error` settles by a special case (a reshape, NaN/Inf on one
    side), for the producers of departing inputs and to write the reasons."""
    n = len(c.group)
    err, err_ok, floor, floor_ok, low, reason = _errors_columns(c)
    ratio, ratio_ok = np.full(n, np.nan), err_ok & floor_ok
    with np.errstate(all="ignore"):
        r = np.where((floor == 0) & (err > 0), np.inf, np.where(err == 0, 0.0, err / floor))
    ratio[ratio_ok] = r[ratio_ok]
    departs = reason.present() | (ratio_ok & (ratio > rules.margin))
    result = filled(n, PASS)
    origin = np.full(n, None, dtype=object)
    op_types = c.objects("op_type")
    text = [c.text(k) for k in ("target_name", "scope_name", "op_type")]  # converted once
    container, marks, collective = c.name_masks() if c.name_masks is not None else name_masks(*text)
    phase = phases(text[0], text[1], c.where, c.run_rank, marks)
    # outputs of in-place optimizer kernels hold buffers the kernel never wrote (module
    # docstring, "Not comparable"): never a departure, and their error counts for nothing
    stale = _stale_outputs(c, op_types, phase) & departs & ~container
    departs = departs & ~stale
    out = {"scaled_err": err, "scaled_err_valid": err_ok, "precision_floor": floor, "precision_floor_valid": floor_ok,
           "precision_ratio": ratio, "precision_ratio_valid": ratio_ok, "precision_dtype": low,
           "precision_result": result, "precision_reason": reason, "origin_op": origin, "phase": phase}
    if n == 0:
        out["precision_reason"] = reason.arrow()
        return out, None
    g = c.group
    groups = int(g.max()) + 1
    none = ~reason.present()
    # rounding noise (module docstring, "Noise"): both sides far below the op's own scale
    noise, scale, u_w = _noise_columns(c, departs & none & ~container, g, groups, err, err_ok, low, rules)
    signature, step_scale, ratio_u = _signature_noise(c, departs & none & ~container & ~noise, err, err_ok, rules)
    with np.errstate(all="ignore"):
        rms = c.values["bench_l2norm"] / np.sqrt(np.maximum(c.bench_shape.size, 1).astype(np.float64))
        # what a noise row stands for in its op's error: its absolute error over the op's scale
        eff = np.where(noise, err * rms / scale, np.where(signature, err * rms / step_scale, err))
    signature_rows = signature
    noise = noise | signature
    call = _collective_calls(c, text[0], collective)
    coll_noise, coll_scale = _collective_noise(c, call, departs & none & ~container & ~noise, departs & ~noise, noise)
    with np.errstate(all="ignore"):
        eff = np.where(coll_noise, err * rms / coll_scale, eff)
    noise = noise | coll_noise
    departs_ = departs & ~noise
    # groups in the order their first row runs; each (iteration, rank)'s running state
    first_run = np.full(groups, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(first_run, g, c.run_rank)
    where = np.zeros(groups, np.int64)
    where[g] = c.where
    inputs = ~c.output
    # a container repeats its ops' errors; a stale buffer is no one's error
    finite = np.where(err_ok & np.isfinite(eff) & ~container & ~stale, eff, 0.0)
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
    np.maximum.at(worst, g[inputs], np.where(err_ok, eff, 0.0)[inputs])
    worst_in = np.where(has_in, worst, upstream)
    if (call >= 0).any():  # a collective's output combines every rank's input of the same call
        worst_in = _across_ranks(g, groups, call, worst_in, has_in)
    for k in np.unique(g[inputs & err_ok & np.isnan(err)]).tolist():  # Python's max, NaN and all
        idx = np.flatnonzero((g == k) & inputs)
        idx = idx[np.argsort(c.run_rank[idx], kind="stable")]
        worst_in[k] = max((float(eff[i]) if err_ok[i] else 0.0 for i in idx.tolist()), default=0.0)
    # a backward record's saved forward tensors are inputs of its computation too (module
    # docstring, "Backward records"): its forward call's input error counts, and elements of
    # the forward input within that error of a kink may switch branch
    fwd_in, kink, flips = _backward_of_forward(c, text[0], op_types, g, groups, worst, has_in)
    worst_in = np.maximum(worst_in, fwd_in)
    # the table holds tensor-mode growth (relative Euclidean errors); a statistics-mode error
    # is a lower bound (| ||x|| - ||y|| |), so its ratios say less: the default there
    growth = np.full(n, rules.growth)
    tensor = np.flatnonzero(~c.statistics)  # the table looked up for tensor-mode rows only
    if tensor.size == n:
        growth = rules.growth_of(text[2], phase, low)
    elif tensor.size:
        growth[tensor] = rules.growth_of(text[2].take(pa.array(tensor)), phase[tensor], low[tensor])
    # departing outputs (module docstring, "Error growth"), each branch a mask: propagated
    # (within growth x the inputs' error + margin x floor), an exact-dtype result of inexact
    # inputs, NaN/Inf propagated, cancellation, else error
    wi, before = worst_in[g], inf_before[g]
    out["inputs_error"], out["growth"] = wi, growth  # what the growth rule read (scripts/calibrate_precision.py)
    dep_out = departs_ & c.output
    with np.errstate(invalid="ignore"):
        bound = growth * wi + rules.margin * np.where(floor_ok, floor, 0.0)
        b1 = dep_out & none & err_ok & (err <= bound)
        switched = dep_out & ~b1 & none & err_ok & ~c.statistics & (err <= bound + kink)
        b1 = b1 | switched
        b2 = dep_out & ~b1 & none & floor_ok & (floor == 0) & (wi > 0)
        b3 = dep_out & ~b1 & ~b2 & err_ok & np.isinf(err) & ((wi == np.inf) | before)
    rest = dep_out & ~b1 & ~b2 & ~b3
    # the rest: explained by cancellation (an op with inputs, no structural reason), else error
    cancel = _cancellation_columns(c, rest & none & has_in[g], g, groups, eff, err, err_ok, floor, floor_ok, growth,
                                   rules)
    fails = rest & ~cancel
    at = np.flatnonzero(b1)
    reason[at] = _format(f"error {{:.3g}} propagated: within {{:.3g}} x the inputs' {{:.3g}} + {rules.margin:g} "
                         "x floor", err[at], growth[at], wi[at])
    at = np.flatnonzero(switched)
    reason[at] = _format(f"error {{:.3g}} propagated: within {{:.3g}} x the inputs' {{:.3g}} + {rules.margin:g} x "
                         "floor + {:.3g} for {:d} element(s) of the forward input (error {:.3g}) switching branch at a "
                         "kink", err[at], growth[at], wi[at], kink[at], flips[at], fwd_in[g[at]])
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
    reason[at] = _format("departs: error {} = {} x the {} floor, inputs' error {:.3g}, growth allowed {:.3g}",
                         _fmts(err[at], err_ok[at]), _fmts(ratio[at], ratio_ok[at]), low[at], wi[at], growth[at])
    unit = target_unit(c.target_dtype, c.target_dtype_declared)
    # an input that differs at all while everything before it in its iteration and rank is
    # bitwise equal, both sides of one float dtype (module docstring, "Exact context")
    with np.errstate(invalid="ignore"):
        exact = inputs & ~departs_ & ~noise & none & ~container & err_ok & np.isfinite(err) & (err > 0) \
            & (upstream[g] == 0) & ~inf_before[g] & _same_texts(c, "target_dtype", "bench_dtype") \
            & _among(low, _FLOATS)
        chain = inputs & ~departs_ & ~noise & none & ~container & err_ok & np.isfinite(err) & floor_ok \
            & (err > CHAIN_ROUNDINGS * floor)
    _judge_inputs_columns(c, departs_ & inputs, g, err, err_ok, floor_ok, floor, ratio, ratio_ok, upstream,
                          inf_before, result, reason, origin, rules, unit, container, exact, chain,
                          np.equal(phase, "forward").astype(bool))
    at = np.flatnonzero(signature_rows)
    result[at] = NOISE
    reason[at] = _format("rounding noise: each side at its own run's rounding level (target / bench RMS {:.3g}, "
                         "unit roundoffs {:.3g}); error {:.3g} says nothing", c.values["target_l2norm"][at] /
                         c.values["bench_l2norm"][at], np.full(at.size, ratio_u), err[at])
    at = np.flatnonzero(coll_noise)
    result[at] = NOISE
    reason[at] = _format("rounding noise: a collective's result of rank inputs that are rounding noise (or equal); "
                         "error {:.3g} says nothing", err[at])
    at = np.flatnonzero(noise & ~signature_rows & ~coll_noise)
    result[at] = NOISE
    reason[at] = _format("rounding noise: both sides within {:g} x u({}) x the op's scale (bench RMS {:.3g} of "
                         "{:.3g}); error {:.3g} says nothing", np.full(at.size, rules.noise),
                         np.full(at.size, u_w[1], dtype=object), rms[at], scale[at], err[at])
    at = np.flatnonzero(stale)
    result[at] = WARNING
    reason[at] = _format("not comparable: an output of the in-place optimizer kernel {} holds the bytes of an "
                         "earlier tensor of its run, so its output buffers are not what the kernel computed (it "
                         "updates its inputs in place); error {:.3g} says nothing", op_types[at], err[at])
    _arg_diff_columns(c, g, groups, result, reason)
    _misattributed_backward(c, text[0], result, reason)
    at = np.flatnonzero(container)
    at = at[np.not_equal(result[at], PASS).astype(bool)]  # the containers' results only
    result[at] = WARNING
    reason[at] = _format("module/cell record, judged by the ops inside it ({})", reason[at])
    out["precision_reason"] = reason.arrow()
    return out, first_departures(c, out)


# piecewise-linear functions: their derivative jumps at a kink (the op type's last dotted
# part, an in-place ``_`` dropped: ``Functional.relu``, ``Tensor.clamp_``, ``Torch.abs``)
KINKED = frozenset({"relu", "relu6", "leaky_relu", "prelu", "rrelu", "hardtanh", "hardsigmoid", "hardswish",
                    "hardshrink", "softshrink", "threshold", "clamp", "clamp_min", "clamp_max", "clip", "abs"})


def _kinked(op_types: np.ndarray) -> np.ndarray:
    """Per row: its op type is a piecewise-linear function (:data:`KINKED`)."""
    found = {t: isinstance(t, str) and t.rpartition(".")[2].rstrip("_") in KINKED for t in set(op_types.tolist())}
    return np.array([found[t] for t in op_types.tolist()], bool)


def _backward_of_forward(c: Columns, names: pa.Array, op_types: np.ndarray, g: np.ndarray, groups: int,
                         worst: np.ndarray, has_in: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(per op call: the error of its forward call's inputs, 0 for others; per row: the
    kink allowance of a backward output, 0 for others; per row: the elements it counts) of
    msprobe backward records (module docstring, "Backward records"). ``X.backward``'s
    forward call is ``X.forward`` of the same iteration and rank (:func:`_forward_name`);
    its inputs (``worst``: each call's largest input error, ``has_in``: it has inputs) are
    the tensors autograd saved for the backward. The kink allowance of an output of ``N``
    elements of a piecewise-linear op (:data:`KINKED`: relu, leaky_relu, clamp, abs...)
    whose forward input error is ``e > 0`` and which has the shape of one of the record's
    inputs (elementwise: one incoming gradient element per output element):
    ``sqrt(k) x G / ||out||`` with
    ``k = max(1, ceil(N e))`` elements switching branch (an element flips when the forward
    input's error reaches its distance from the kink: relu's mask, max-pool's argmax, a
    clamp; a fraction ~``e`` of the elements for values whose density at the kink is at
    most ``1 / (2 rms)``, as a normal's ``0.4 / rms``) and ``G`` the largest |value| of the
    incoming gradients of that shape (the bench's ``max`` / ``min``): a switched element's
    gradient differs by at most that."""
    n = len(g)
    fwd_in, kink, flips = np.zeros(groups), np.zeros(n), np.zeros(n, np.int64)
    first = np.full(groups, -1, np.int64)
    first[g[::-1]] = np.arange(n)[::-1]  # one row per call (its first)
    reps = first[first >= 0]
    rep_names = names.take(pa.array(reps))  # each call's name (its first row's)

    def named(part: str) -> np.ndarray:
        return pc.fill_null(pc.match_substring(rep_names, part), False).to_numpy(zero_copy_only=False)
    is_backward = named(".backward")
    if not is_backward.any():
        return fwd_in, kink, flips
    is_forward = named(".forward")
    forward = {(int(c.where[i]), name): int(g[i])
               for i, name in zip(reps[is_forward].tolist(), rep_names.filter(is_forward).to_pylist())}
    for i, name in zip(reps[is_backward].tolist(), rep_names.filter(is_backward).to_pylist()):
        f = forward.get((int(c.where[i]), _forward_name(name)))
        if f is not None and has_in[f]:
            fwd_in[g[i]] = worst[f]
    e = fwd_in[g]
    rows = c.output & (e > 0) & np.isfinite(e)
    if not rows.any():
        return fwd_in, kink, flips
    rows &= _kinked(op_types)
    # the incoming gradient of the output's own shape (an elementwise op: one incoming
    # element per output element) and its largest |value|, bench side
    bs = c.bench_shape
    with np.errstate(invalid="ignore"):
        mag = np.fmax(np.abs(c.values["bench_max"]), np.abs(c.values["bench_min"]))
    incoming: dict = {}
    wanted = set(g[rows].tolist())
    for j in np.flatnonzero(~c.output & c.valid["bench_max"] & c.valid["bench_min"] & np.isfinite(mag) & bs.valid
                            & np.isin(g, list(wanted))).tolist():
        key = (int(g[j]), bs.shape(j))
        incoming[key] = max(incoming.get(key, 0.0), float(mag[j]))
    top = np.zeros(n)
    for i in np.flatnonzero(rows & bs.valid).tolist():
        top[i] = incoming.get((int(g[i]), bs.shape(i)), 0.0)
    size = np.maximum(bs.size, 1).astype(np.float64)
    with np.errstate(invalid="ignore"):
        k = np.maximum(1.0, np.ceil(size * np.where(rows, e, 0.0)))
        l2 = c.values["bench_l2norm"]
        ok = rows & bs.valid & c.valid["bench_l2norm"] & (l2 > 0) & (top > 0)
        kink[ok] = (np.sqrt(k) * top / l2)[ok]
    flips[ok] = k[ok].astype(np.int64)
    return fwd_in, kink, flips


def _stale_outputs(c: Columns, op_types: np.ndarray, phase: np.ndarray) -> np.ndarray:
    """The output rows of in-place optimizer kernels whose output buffers were never
    written (module docstring, "Not comparable"): every optimizer-phase output row of an op
    type some call of which, on either side, outputs bytes (payload content hash) that a
    tensor of another op call of its iteration and rank held before it ran (an output of
    an earlier op, not a module
    or cell record, or an input of an earlier op call: bytes that existed before the call,
    so it did not compute them), bytes that are not among that call's own inputs (an
    in-place update dumped after the kernel ran holds its own input 0's bytes: quirk 6 of
    the MindSpore CPU corpus README, ``shared/corpus/mindspore-cpu/README.md``) and not a
    constant tensor (max == min: zeros are everywhere). MindSpore 2.10 CPU's
    ``AdamWeightDecay`` updates ``var``, ``m`` and ``v`` in place; its dumped outputs are
    reused device buffers: an fp16-O2 run's ``AdamWeightDecay-op11`` and ``-op12`` outputs
    hold the bytes of ``-op10``'s input 8 (a gradient) and of a ``LayerNormGrad`` output,
    and the fp32 run's ``-op10`` to ``-op12`` outputs are one tensor. Bool mask over rows."""
    n = len(c.group)
    out = np.zeros(n, bool)
    candidates = np.zeros(n, bool)
    at = np.flatnonzero(c.output)  # the object compares on the output rows only
    candidates[at] = np.equal(phase[at], OPTIMIZER).astype(bool) & np.not_equal(op_types[at], _NONE).astype(bool)
    if not candidates.any():
        return out
    g = c.group
    names = c.objects("target_name")  # a few optimizer outputs: as Python strings only here
    boxed = containers(pa.array(op_types, pa.string()), c.text("target_name"))
    start = np.full(int(g.max()) + 1, np.iinfo(np.int64).max, np.int64)  # when each op call ran
    np.minimum.at(start, g, c.run_rank)
    evidence: set = set()
    for side, hashes in (("target", c.target_content_hash), ("bench", getattr(c, "bench_content_hash", None))):
        if hashes is None:
            continue
        vmax, vmin = c.values[f"{side}_max"], c.values[f"{side}_min"]
        constant = c.valid[f"{side}_max"] & c.valid[f"{side}_min"] & (vmax == vmin)
        known = np.not_equal(hashes, _NONE).astype(bool) & ~boxed
        # per (iteration, rank) and hash: one process's tensors (data-parallel ranks hold
        # equal bytes: an all_reduce's result), when the earliest op call holding it ran
        code = np.where(known, group_codes([c.where, string_codes(pa.array(hashes, pa.string()))]), 0)
        first = np.full(int(code.max()) + 1, np.iinfo(np.int64).max, np.int64)
        np.minimum.at(first, code[known], start[g[known]])
        earlier = np.flatnonzero(candidates & known & ~constant & (first[code] < start[g])).tolist()
        own: dict = {}  # op call -> its input hashes on this side
        for i in np.flatnonzero(known & ~c.output & np.isin(g, g[candidates])).tolist():
            own.setdefault(int(g[i]), set()).add(hashes[i])
        found = [i for i in earlier if hashes[i] not in own.get(int(g[i]), ())]
        rows = [i for i in np.flatnonzero(candidates & known & ~constant).tolist()
                if hashes[i] not in own.get(int(g[i]), ())]
        if side == "target":  # every target op's outputs, compared or not, in the target's order
            seen = set(found)
            rest = [i for i in rows if i not in seen and op_types[i] not in evidence]
            made = c.producers({hashes[i] for i in rest}) if rest else {}
            listed = sorted({p[1] for v in made.values() for p in v if p[1] is not None})
            record = set(np.array(listed, dtype=object)[containers(_objects(listed), _objects(listed))].tolist()) \
                if listed else set()
            found += [i for i in rest if any(p[0] < int(c.order[i]) and p[1] != names[i] and p[1] not in record
                                             for p in made.get(hashes[i], []))]
        evidence |= {op_types[i] for i in found}
    if evidence:
        out = candidates & np.isin(op_types, sorted(evidence))
    return out


def _forward_name(name: str) -> str:
    """The forward record of an msprobe backward record: the last ``.backward`` becomes
    ``.forward`` (``Tensor.float.0.backward``, ``Module.fc.Linear.backward.0``)."""
    head, _, tail = name.rpartition(".backward")
    return f"{head}.forward{tail}"


def _misattributed_backward(c: Columns, names: pa.Array, result: np.ndarray, reason: Texts) -> None:
    """A backward record's outputs are the gradients of its op's inputs, so each has the
    shape of one of that op's forward inputs (msprobe's data_dump: ``X.backward`` output k is
    the gradient of ``X.forward`` input k). A departing output pair whose shapes differ, where
    one side's record keeps that rule and the other side's breaks it, compares two different
    things: the breaking side's hook caught another op's backward (an op that returned its
    input unchanged has no autograd node of its own; ``x.float()`` of a float32 tensor in the
    fp32 run, where the autocast run's ``float()`` is a real cast: its ``Tensor.float.0.
    backward`` holds the preceding linear's gradients). Such a row is a ``warning`` naming
    this, never a departure (rows changed in place)."""
    n = len(c.group)
    ts, bs = c.target_shape, c.bench_shape
    cand_rows = np.flatnonzero(c.output & ts.valid & bs.valid & ~ts.equal(bs))
    cand = cand_rows[np.equal(result[cand_rows], ERROR).astype(bool)].tolist()  # compared where shapes differ
    if not cand:
        return
    text = names.to_pylist() if n else []
    cand = [i for i in cand if isinstance(text[i], str) and ".backward" in text[i]]
    if not cand:
        return
    wanted = {_forward_name(text[i]) for i in cand}
    rows = np.flatnonzero(pc.is_in(names, value_set=pa.array(sorted(wanted), pa.string()))
                          .fill_null(False).to_numpy(zero_copy_only=False) & ~c.output)
    inputs: dict[tuple, tuple[set, set]] = {}
    for j in rows.tolist():
        t_in, b_in = inputs.setdefault((int(c.where[j]), text[j]), (set(), set()))
        t_in.add(ts.shape(j))
        b_in.add(bs.shape(j))
    for i in cand:
        found = inputs.get((int(c.where[i]), _forward_name(text[i])))
        if found is None:
            continue
        t_ok, b_ok = ts.shape(i) in found[0], bs.shape(i) in found[1]
        if t_ok == b_ok:
            continue
        side, shape, fwd = ("bench", bs.text(i), found[1]) if t_ok else ("target", ts.text(i), found[0])
        shapes = ", ".join(str(list(x)) for x in sorted(x for x in fwd if x is not None))
        result[i] = WARNING
        reason[i] = (f"not comparable: the {side}'s {text[i]} output has shape {shape}, none of its forward "
                     f"inputs' ({shapes}): that side's "
                     "record holds another op's gradients (an op that returned its input unchanged has no "
                     f"backward of its own); {reason.get(i)}")


def _optional(c: Columns, name: str, n: int) -> np.ndarray:
    """An optional :class:`Columns` object column (all None when the producer gave none)."""
    v = getattr(c, name, None)
    return np.full(n, None, dtype=object) if v is None else v


def _noise_columns(c: Columns, rows_mask: np.ndarray, g: np.ndarray, groups: int, err, err_ok, low,
                   rules: PrecisionRules) -> tuple[np.ndarray, np.ndarray, tuple[float, str | None]]:
    """(noise mask, the op's bench-side scale per row, (u, dtype) of the working precision)
    (module docstring, "Noise"). The op's scale of a row, per side: the largest RMS among
    the *other* rows of its op call on that side (NaN when it has none; the target side's
    RMS from ``target_l2norm`` when the columns have it, else bench RMS x (1 + err), an
    upper bound). The working precision: the lowest-precision float any pair was judged at
    (a mixed-precision run's float32 tensors carry its low-precision rounding: a float32
    gradient computed in bfloat16)."""
    floats = [d for d in set(low.tolist()) if d in _FLOATS]
    dtype = max(floats, key=lambda d: _FLOATS[d][0], default=None)
    u = _FLOATS[dtype][0] / 2 if dtype is not None else 0.0
    size = np.sqrt(np.maximum(c.bench_shape.size, 1).astype(np.float64))
    with np.errstate(all="ignore"):
        rms_b = c.values["bench_l2norm"] / size
        t_ok = c.valid.get("target_l2norm")
        rms_t = np.where(t_ok, c.values["target_l2norm"] / size, rms_b * (1 + err)) if t_ok is not None \
            else rms_b * (1 + err)
    known = c.valid["bench_l2norm"] & c.bench_shape.valid & np.isfinite(rms_b) & np.isfinite(rms_t)
    scale_b, scale_t = _other_max(g, groups, rms_b, known), _other_max(g, groups, rms_t, known)
    with np.errstate(all="ignore"):
        noise = rows_mask & known & err_ok & np.isfinite(err) & (err >= 0.5) & (scale_b > 0) & (scale_t > 0) \
            & (rms_b <= rules.noise * u * scale_b) & (rms_t <= rules.noise * u * scale_t)
    return noise, scale_b, (u, dtype)


def _signature_noise(c: Columns, rows_mask: np.ndarray, err, err_ok, rules: PrecisionRules,
                     ) -> tuple[np.ndarray, np.ndarray, float]:
    """(noise mask, each row's step scale, u_target / u_bench) of the second noise test
    (module docstring, "Noise"): a tensor that is rounding noise in both runs holds values
    proportional to each run's unit roundoff (each the lowest-precision float of its side):
    its sides disagree by half or more, their RMS ratio is within 8x of the roundoffs' ratio
    (1 when both runs have the same precision: a rewrite's or a rank's other summation
    order), and each side's RMS is at most ``noise`` x its unit roundoff x the largest RMS of
    its iteration and rank on that side (an overflow or a blown-up tensor is the largest
    itself). It needs no other tensor in the op call: a parameter gradient's per-parameter
    ``all_reduce`` has none."""
    n = len(c.group)
    none = np.zeros(n, bool), np.full(n, np.nan), 1.0
    t_ok = c.valid.get("target_l2norm")
    if t_ok is None or not rows_mask.any():
        return none

    def unit(dtypes: np.ndarray) -> float:
        found = [_FLOATS[d][0] / 2 for d in set(dtypes.tolist()) if d in _FLOATS]
        return max(found, default=0.0)

    u_t, u_b = unit(c.target_dtype), unit(c.bench_dtype)
    if not (u_t > 0 and u_b > 0):
        return none
    size = np.sqrt(np.maximum(c.bench_shape.size, 1).astype(np.float64))
    with np.errstate(all="ignore"):
        rms_b = c.values["bench_l2norm"] / size
        rms_t = c.values["target_l2norm"] / size
    known_b = c.valid["bench_l2norm"] & c.bench_shape.valid & np.isfinite(rms_b)
    known_t = t_ok & c.bench_shape.valid & np.isfinite(rms_t)
    places = int(c.where.max()) + 1
    top_b, top_t = np.zeros(places), np.zeros(places)
    np.maximum.at(top_b, c.where[known_b], rms_b[known_b])
    np.maximum.at(top_t, c.where[known_t], rms_t[known_t])
    q = u_t / u_b
    with np.errstate(all="ignore"):
        r = rms_t / rms_b
        out = rows_mask & known_b & known_t & err_ok & np.isfinite(err) & (err >= 0.5) & (rms_b > 0) \
            & (r >= q / 8) & (r <= q * 8) & (rms_b <= rules.noise * u_b * top_b[c.where]) \
            & (rms_t <= rules.noise * u_t * top_t[c.where])
    return out, top_b[c.where], q


def _collective_calls(c: Columns, names: pa.Array, collective: np.ndarray) -> np.ndarray:
    """Per row, a code shared by the rows of one collective call on every rank (same
    iteration and op name: data-parallel ranks issue the same collectives in the same
    order, msprobe numbers them alike); -1 for rows of other ops."""
    call = np.full(len(c.group), -1, np.int64)
    if not collective.any():
        return call
    iteration = getattr(c, "iteration", None)
    it = np.zeros(len(c.group), np.int64) if iteration is None else iteration
    codes = group_codes([it, string_codes(names)])
    call[collective] = codes[collective]
    return call


def _across_ranks(g: np.ndarray, groups: int, call: np.ndarray, worst_in: np.ndarray, has_in: np.ndarray,
                  ) -> np.ndarray:
    """``worst_in`` (per op call) with each collective call that has inputs given the
    largest input error of that call on every rank: rank 0's all_reduce output carries
    rank 1's input error."""
    gcall = np.full(groups, -1, np.int64)
    gcall[g] = call
    at = (gcall >= 0) & has_in
    top = np.zeros(int(gcall.max()) + 1)
    np.fmax.at(top, gcall[at], worst_in[at])
    out = worst_in.copy()
    out[at] = top[gcall[at]]
    return out


def _collective_noise(c: Columns, call: np.ndarray, rows_mask: np.ndarray, departing: np.ndarray,
                      noise: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mask, scale): the departing output rows (``rows_mask``) of collective calls whose
    inputs, on every rank, are rounding noise or do not depart, with at least one noise: a
    sum or gather of noise is noise (its relative error, diluted by the ranks whose input is
    equal, can fall below the noise tests' 0.5). The scale its error counts by (as a noise
    row's absolute error): the largest bench RMS of its iteration and rank."""
    out = np.zeros(len(call), bool)
    coll = call >= 0
    if not (coll & rows_mask & c.output).any():
        return out, np.ones(len(call))
    size = int(call.max()) + 1
    inputs = coll & ~c.output
    bad = np.bincount(call[inputs & departing], minlength=size) > 0
    some = np.bincount(call[inputs & noise], minlength=size) > 0
    at = coll & rows_mask & c.output
    out[at] = some[call[at]] & ~bad[call[at]]
    size_ = np.sqrt(np.maximum(c.bench_shape.size, 1).astype(np.float64))
    with np.errstate(all="ignore"):
        rms = c.values["bench_l2norm"] / size_
    known = c.valid["bench_l2norm"] & c.bench_shape.valid & np.isfinite(rms)
    top = np.zeros(int(c.where.max()) + 1)
    np.maximum.at(top, c.where[known], rms[known])
    out &= (top[c.where] > 0) & known
    return out, np.where(top[c.where] > 0, top[c.where], 1.0)


def _other_max(g: np.ndarray, groups: int, values: np.ndarray, known: np.ndarray) -> np.ndarray:
    """Per row, the largest known value among the *other* rows of its group (NaN: none)."""
    val = np.where(known, values, -1.0)  # known values are finite: no NaN among them
    top1, top2 = np.full(groups, -1.0), np.full(groups, -1.0)
    np.maximum.at(top1, g, val)
    is_top = known & (val == top1[g])
    holder = np.zeros(len(g), bool)  # one row per group holds the top; the others see it
    at = np.flatnonzero(is_top)
    first, _ = unique_keys(g[at])
    holder[at[first]] = True
    np.maximum.at(top2, g, np.where(holder, -1.0, val))  # -1 leaves top2 as it is
    out = top1[g]
    out[holder] = top2[g[holder]]
    return np.where(out > 0, out, np.nan)


def _arg_diff_columns(c: Columns, g: np.ndarray, groups: int, result: np.ndarray, reason: Texts) -> None:
    """An op call whose recorded scalar arguments differ (``arg_diff``, the align step's
    column: NULL when they agree, else e.g. ``eps: 1e-05 -> 0.1``) departs: its output rows
    (its rows when it has no output) become errors naming the difference."""
    diff = getattr(c, "arg_diff", None)
    if diff is None:
        return
    has = truthy(diff)
    if not has.any():
        return
    text = np.full(groups, None, dtype=object)
    for i in np.flatnonzero(has).tolist():
        text[g[i]] = text[g[i]] or diff[i]
    marked = np.not_equal(text, _NONE).astype(bool)
    outputs = np.bincount(g[c.output], minlength=groups) > 0
    rows = marked[g] & (c.output | ~outputs[g])
    at = np.flatnonzero(rows)
    reason[at] = [f"scalar arguments differ ({t})" + (f"; {r}" if r else "")
                  for t, r in zip(text[g[at]].tolist(), reason[at].to_pylist())]
    result[at] = ERROR


def _format(template: str, *columns) -> pa.Array:
    """``template.format(*values)`` of each row of some columns (numpy: floats as Python
    floats, objects as they are; Arrow string arrays: NULL as ``None``), as an Arrow
    ``large_string`` array (no Python str per row).

    Each field's column is formatted once per distinct value (``format(value, spec)``,
    what ``str.format`` does for a field without conversion), the row's pieces are taken
    from those few texts and joined by Arrow: a reason template over 100,000 rows repeats
    few distinct values."""
    n = len(columns[0]) if columns else 0
    fields = _template_fields(template)
    if fields is None or len(fields) - 1 != len(columns) or not n:
        return pa.array([template.format(*v) for v in zip(*(_values(col) for col in columns))], pa.large_string())
    pieces: list = []
    for k, (col, (spec, literal)) in enumerate(zip(columns, fields[1:])):
        lead = fields[0] if k == 0 else ""
        if isinstance(col, (pa.Array, pa.ChunkedArray)) and spec == "" and pa.types.is_large_string(col.type):
            pieces.extend(p for p in (lead, col.fill_null("None"), literal) if not isinstance(p, str) or p)
            continue
        if isinstance(col, (pa.Array, pa.ChunkedArray)):
            col = _objects(col.to_pylist())
        if col.dtype == object:
            inverse, distinct = _object_codes(col)
            names = [lead + format(v, spec) + literal for v in distinct]
        else:  # numbers: format the distinct values (floats by their bits: -0.0 is not 0.0), then index
            first, inverse = _distinct(col, spec)
            names = [lead + format(v, spec) + literal for v in col[first].tolist()]
        # a field of one text on every row (a growth allowance) is literal text: one array
        # fewer to take and join
        pieces.append(names[0] if len(names) == 1 else pa.array(names, pa.large_string()).take(pa.array(inverse)))
    joined: list = []  # literal texts next to each other as one
    for p in pieces:
        if isinstance(p, str) and joined and isinstance(joined[-1], str):
            joined[-1] += p
        else:
            joined.append(p)
    if len(joined) == 1:
        return pa.repeat(pa.scalar(joined[0], pa.large_string()), n) if isinstance(joined[0], str) else joined[0]
    return pc.binary_join_element_wise(*(pa.scalar(p, pa.large_string()) if isinstance(p, str) else p
                                         for p in joined), pa.scalar("", pa.large_string()))


def _object_codes(col: np.ndarray) -> tuple[np.ndarray, list]:
    """(each row's code, the distinct values by code) of an object column: by Arrow's
    dictionary encoding when every value is a str or None (Arrow's inference says so: a
    bytes or number value makes it another type or fails), else by a dict over the values."""
    try:
        arr = pa.array(col, from_pandas=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        arr = None
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if arr is not None and pa.types.is_null(arr.type):
        return np.zeros(len(col), np.int64), [None]
    if arr is not None and (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        enc = pc.dictionary_encode(arr)
        distinct = enc.dictionary.to_pylist()
        codes = enc.indices
        if codes.null_count:
            codes = pc.fill_null(codes, len(distinct))
            distinct.append(None)
        return codes.to_numpy(zero_copy_only=False).astype(np.int64), distinct
    memo: dict = {}
    inverse = np.array([memo.setdefault(v, len(memo)) for v in col.tolist()], np.int64)
    return inverse, list(memo)


def _among(col: np.ndarray, values) -> np.ndarray:
    """``np.isin(col, list(values))`` of an object column of hashable values: compared
    only to the values it holds (np.isin compares every row to every value)."""
    out = np.zeros(len(col), bool)
    present = set(col.tolist())
    for v in values:
        if v in present:
            out |= np.equal(col, v).astype(bool)
    return out


def _values(col) -> list:
    """A numpy or Arrow column as a Python list."""
    return col.to_pylist() if isinstance(col, (pa.Array, pa.ChunkedArray)) else col.tolist()


def _distinct(col: np.ndarray, spec: str) -> tuple[np.ndarray, np.ndarray]:
    """(first, inverse) of the values of a numeric column that format alike under ``spec``:
    ``col[first]`` are one value per group, ``inverse`` each row's group.

    Floats are grouped by their bits (``-0.0`` is not ``0.0``), except under a ``.Ng`` spec:
    there a finite value of normal size is grouped by its sign, decimal exponent and N
    significant digits rounded (the 100,000 distinct errors of a statistics compare format
    as a few thousand texts); a value whose scaled mantissa lies within 1e-6 of a rounding
    tie (where float64 scaling could round it the other way) is grouped by its bits."""
    bits = np.ascontiguousarray(col)
    if bits.dtype.kind == "f":
        bits = bits.view(f"u{bits.dtype.itemsize}")
    if len(bits) > 1:
        # runs of one value (the inputs' error of an op's rows, a growth allowance): grouped
        # by their first rows alone. A group's first row starts a run, so ``first`` is the same
        head = np.empty(len(bits), bool)
        head[0] = True
        np.not_equal(bits[1:], bits[:-1], out=head[1:])
        heads = np.flatnonzero(head)
        if heads.size <= len(bits) // 2:
            first, inverse = _distinct(col[heads], spec)
            return heads[first], inverse[np.cumsum(head) - 1]
    digits = int(spec[1:-1]) if len(spec) > 2 and spec[0] == "." and spec[-1] == "g" and spec[1:-1].isdigit() else 0
    if col.dtype.kind != "f" or not 1 <= digits <= 8:
        return unique_keys(bits)
    v = np.abs(col, dtype=np.float64)
    low, high = 10.0 ** (digits - 1), 10.0 ** digits
    # the same arithmetic as the plain expressions, with fewer temporaries (each a fresh
    # 500,000-row array): NaN and inf fail both bounds, the two exponent corrections exclude
    # each other (high > low)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        regular = (v > 1e-290) & (v < 1e290)
        e = np.log10(np.where(regular, v, 1.0))
        np.floor(e, out=e)
        m = np.power(10.0, digits - 1 - e)
        m *= v
        e += m >= high  # log10 off by one near a power of ten
        e -= m < low
        np.power(10.0, digits - 1 - e, out=m)
        m *= v
        tie = m - np.floor(m)
        tie -= 0.5
        np.abs(tie, out=tie)
        regular &= m >= low
        regular &= m < high
        regular &= tie > 1e-6
    rows = np.flatnonzero(regular)
    r = np.floor(m[rows] + 0.5).astype(np.int64)  # low <= r <= high
    exp = e[rows].astype(np.int64)
    # (exponent, rounded digits, sign) as one integer, in that order (|e| < 291: a narrow
    # range of keys, numbered by unique_keys without sorting the rows)
    key = ((exp - (int(exp.min()) if rows.size else 0)) * (int(high) - int(low) + 1) + (r - int(low))) * 2 \
        + np.signbit(col[rows])
    inverse = np.empty(len(col), np.int64)
    firsts, groups = [], 0
    for at, k in ((rows, key), (np.flatnonzero(~regular), bits[~regular])):
        if at.size:
            f, inv = unique_keys(k)
            firsts.append(at[f])
            inverse[at] = inv + groups
            groups += len(f)
    return np.concatenate(firsts), inverse


@functools.cache
def _template_fields(template: str) -> tuple | None:
    """(leading text, (spec, text after), ...) of a template of automatically numbered
    fields without conversion; None for any other template (then str.format row by row)."""
    import string

    texts, specs = [""], []  # texts[k]: the literal text before field k (the last: after every field)
    for literal, name, spec, conversion in string.Formatter().parse(template):
        texts[-1] += literal
        if name is None:  # literal text only ("{{" / "}}" split it)
            continue
        if name != "" or conversion is not None or "{" in (spec or ""):
            return None
        specs.append(spec or "")
        texts.append("")
    fields: list = [texts[0], *zip(specs, texts[1:])]
    return tuple(fields)


def _fmts(values: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """:func:`_fmt` of each value (``n/a`` where not valid), as an object array."""
    out = np.empty(len(values), dtype=object)
    out[:] = [f"{v:.3g}" if ok else "n/a" for v, ok in zip(values.tolist(), valid.tolist())]
    return out


def _cancellation_columns(c: Columns, rows_mask: np.ndarray, g: np.ndarray, groups: int, eff, err, err_ok, floor,
                          floor_ok, growth: np.ndarray, rules: PrecisionRules) -> np.ndarray:
    """Which of the departing output rows ``rows_mask`` cancellation explains (an output much
    smaller than its inputs, a mean of centred values or a difference of near-equal ones,
    inherits their *absolute* error; Higham sec. 1.7): the output's RMS (bench L2 norm /
    sqrt(elements)) below 1 % of the largest input RMS of its op, and its RMS error within
    growth x the inputs' largest RMS error + margin x floor x that input RMS. ``eff``: each
    row's error as its op's inputs count it (a noise row's absolute error over its op's
    scale); ``growth``: each row's allowance."""
    out = np.zeros(len(g), bool)
    if not rows_mask.any():
        return out
    shape = c.bench_shape
    l2, l2_ok = c.values["bench_l2norm"], c.valid["bench_l2norm"] & ~np.isnan(c.values["bench_l2norm"])
    with np.errstate(all="ignore"):
        rms = l2 / np.sqrt(np.maximum(shape.size, 1).astype(np.float64))
        known = l2_ok & shape.valid
        finite = err_ok & np.isfinite(err)
        use = ~c.output & known & finite & np.isfinite(eff)  # the inputs that count
        in_rms, in_err = np.zeros(groups), np.zeros(groups)
        np.fmax.at(in_rms, g[use], rms[use])  # fmax: a NaN product is skipped, as Python's max(in_err, nan)
        np.fmax.at(in_err, g[use], (eff * rms)[use])
        gi_rms, gi_err = in_rms[g], in_err[g]
        u = np.where(floor_ok, floor, 0.0)
        out = rows_mask & known & finite & (gi_rms != 0) & ~(rms >= 0.01 * gi_rms) \
            & (err * rms <= growth * gi_err + rules.margin * u * gi_rms)
    return out


def target_unit(dtypes, declared) -> tuple[float, str | None]:
    """(unit roundoff, dtype) of the lowest-precision float a side holds or declares (a
    MindSpore CPU file declared Float16 whose payload is float32 was computed in float16);
    (0.0, None) without floats. Object arrays (or lists) of catalog dtype names and declared
    dtypes."""
    found = {d for d in _distinct_objects(dtypes) if d in _FLOATS}
    found |= {_DECLARED.get(str(d).lower()) for d in _distinct_objects(declared) if d} - {None}
    dtype = max(found, key=lambda d: _FLOATS[d][0], default=None)
    return (_FLOATS[dtype][0] / 2, dtype) if dtype is not None else (0.0, None)


def _distinct_objects(values) -> set:
    """The set of an object array's (or a list's) elements; an array through ``tolist``
    (``list()`` of a 500,000-row array walks it element by element: ~3x slower)."""
    return set(values.tolist() if isinstance(values, np.ndarray) else list(values))


def _judge_inputs_columns(c: Columns, rows_mask, g, err, err_ok, floor_ok, floor, ratio, ratio_ok, upstream,
                          inf_before, result, reason, origin, rules: PrecisionRules,
                          unit: tuple[float, str | None] = (0.0, None), boxed_rows: np.ndarray | None = None,
                          exact: np.ndarray | None = None, chain: np.ndarray | None = None,
                          forward: np.ndarray | None = None) -> None:
    """The departing input rows ``rows_mask``: explained (warning) when a compared op
    produced its bytes, or when NaN/Inf or an earlier compared tensor's error explains it
    (the producer is a cast or an op the dump or the alignment left out); otherwise the
    input is where the departure starts (error; ``origin`` names the producer an op only
    the target has). The producer of each (the last target output with its content hash
    before it) is looked up per row, the branches are masks. ``exact``: input rows within
    the margin that differ where everything before them is bitwise equal; those no op of the
    target produced (a parameter or data input) depart, the others are left as they are."""
    n = len(g)
    exact = np.zeros(n, bool) if exact is None else exact & ~rows_mask
    chain = np.zeros(n, bool) if chain is None or getattr(c, "inputs_of", None) is None else chain & ~rows_mask
    forward = np.zeros(n, bool) if forward is None else forward
    extra = exact | chain
    rows_mask = rows_mask | extra
    rows = np.flatnonzero(rows_mask)
    if not rows.size:
        return
    if boxed_rows is None:
        boxed_rows = np.zeros(len(g), bool)
    hashes = set(c.target_content_hash[rows][np.not_equal(c.target_content_hash[rows], _NONE).astype(bool)].tolist())
    producers = c.producers(hashes) if hashes else {}
    # a module/cell record holds a copy of what an op inside it computed: the producer is
    # that op (a block whose residual add was dropped: its module output holds the bytes of
    # the last op inside, which matches the bench, and the next norm reads other data)
    listed = sorted({p[1] for v in producers.values() for p in v if p[1] is not None})
    if listed:
        boxed = set(np.array(listed, dtype=object)[containers(_objects(listed), _objects(listed))].tolist())
        if boxed:
            producers = {h: kept for h, v in producers.items() if (kept := [p for p in v if p[1] not in boxed])}
    name = np.full(len(g), None, dtype=object)
    has, compared = np.zeros(len(g), bool), np.zeros(len(g), bool)
    made_at = np.full(len(g), -1, np.int64)  # the producer's output order
    if producers:
        keys = {h: [p[0] for p in v] for h, v in producers.items()}
        for i in rows.tolist():
            h = c.target_content_hash[i]
            if h in producers:
                k = bisect.bisect_left(keys[h], int(c.order[i]))  # producers strictly before the input
                if k:
                    made_at[i], name[i], compared[i] = producers[h][k - 1]
                    has[i] = True
    up, before = upstream[g], inf_before[g]
    none = ~reason.nonempty()
    changed_leaf = exact & ~has
    at = np.flatnonzero(changed_leaf)
    reason[at] = _format("input differs (error {:.3g} = {:.3g} x floor) where every earlier tensor of its iteration "
                         "and rank is bitwise equal, both sides {}; no op produced it (a changed parameter or data "
                         "input)", err[at], ratio[at], c.target_dtype[at])
    result[at] = ERROR
    # an op only the target has produced it: judged by the error of that op's own inputs
    by_new = (rows_mask & ~exact) & has & ~compared & none & err_ok & np.isfinite(err)
    src = np.full(len(g), np.nan)
    ops = np.zeros(len(g), np.int64)
    if by_new.any() and getattr(c, "inputs_of", None) is not None:
        src_of = _SourceErrors(c, err, err_ok, boxed_rows)
        for i in np.flatnonzero(by_new).tolist():
            src[i] = src_of(int(made_at[i]), CHAIN_DEPTH)
            ops[i] = src_of.ops.get(int(made_at[i]), 1)
    known = by_new & ~np.isnan(src)
    with np.errstate(invalid="ignore"):
        chain_bound = CHAIN_GROWTH * np.where(known, src, 0.0) + CHAIN_ROUNDINGS * np.where(floor_ok, floor, 0.0)
        chain_ok = known & (err <= chain_bound)
        cast = err_ok & (err <= CAST_ROUNDINGS * unit[0])
    at = np.flatnonzero(chain & known & ~chain_ok & ~cast)
    reason[at] = _format(f"input departs: error {{:.3g}} = {{:.3g}} x floor, beyond {CHAIN_GROWTH:g} x the error "
                         f"{{:.3g}} of the inputs of {{}}, an op only the target has, + {CHAIN_ROUNDINGS:g} x floor",
                         err[at], ratio[at], src[at], name[at])
    result[at] = ERROR
    origin[at] = name[at]
    rows_mask = rows_mask & ~extra
    # a compared producer explains the input only if its own pair carries the error: when its
    # output matches the bench but this input does not, the op reads other data than the
    # bench's op (a residual add dropped: LayerNorm reads the block's output alone)
    carried = np.full(len(g), np.inf)
    judged = rows_mask & has & compared & none & err_ok & np.isfinite(err)
    if judged.any():
        want = {c.target_content_hash[i] for i in np.flatnonzero(judged).tolist()}
        outs = np.flatnonzero(c.output & err_ok & np.isfinite(err) & ~boxed_rows)  # ops, not their containers
        best: dict = {}
        for i in outs.tolist():
            h = c.target_content_hash[i]
            if h in want:
                best[h] = max(best.get(h, 0.0), float(err[i]))
        for i in np.flatnonzero(judged).tolist():
            carried[i] = best.get(c.target_content_hash[i], np.inf)
    with np.errstate(invalid="ignore"):
        unexplained = judged & (err > rules.growth * carried + rules.margin * np.where(floor_ok, floor, 0.0))
    a1 = rows_mask & has & compared & ~unexplained
    with np.errstate(invalid="ignore"):
        a2 = rows_mask & ~a1 & err_ok & np.isinf(err) & before
        # no producer in the forward pass: a copy the dump left out (LEAF_GROWTH); an op only
        # the target has, whose inputs' error is known: that error (chain_ok)
        allowed = np.where(forward & ~has, LEAF_GROWTH, rules.growth)
        a3 = rows_mask & ~a1 & ~a2 & ~reason.present() & err_ok & \
            np.where(known, chain_ok & ~cast, err <= allowed * up + rules.margin * np.where(floor_ok, floor, 0.0))
    # an op only the target has produced it (an AMP run's Cast) and its error is within the
    # target's own lowest precision: rounding of that precision, not a departure beyond it
    with np.errstate(invalid="ignore"):
        a5 = rows_mask & ~a1 & ~a2 & ~a3 & has & ~compared & none & err_ok & (err <= CAST_ROUNDINGS * unit[0])
    a4 = rows_mask & ~a1 & ~a2 & ~a3 & ~a5
    at = np.flatnonzero(a5)
    reason[at] = _format(f"input error {{:.3g}} within {CAST_ROUNDINGS:g} x the target's {unit[1]} unit roundoff after "
                         "{}, an op only the target has (a cast of a mixed-precision run)", err[at], name[at])
    at = np.flatnonzero(a1 & none)
    reason[at] = _format("input error propagated from {}", name[at])
    at = np.flatnonzero(a2)
    what = reason[at]
    what = replaced(what, ~nonempty(what), "nan/inf")
    reason[at] = _format("{}: propagated from earlier nan/inf", what)
    at = np.flatnonzero(a3)
    if has[at].any():
        produced = _format(" (produced by {})", name[at])
        produced = replaced(produced, ~has[at], "")
        reason[at] = _format("input error {:.3g} within {:.3g} x the largest earlier error {:.3g}{}",
                             err[at], allowed[at], up[at], produced)
    else:  # no producer named (no content hashes: a statistics compare): nothing to append
        reason[at] = _format("input error {:.3g} within {:.3g} x the largest earlier error {:.3g}",
                             err[at], allowed[at], up[at])
    at = np.flatnonzero(a3 & known)
    reason[at] = _format(f"input error {{:.3g}} within {CHAIN_GROWTH:g} x the error {{:.3g}} of the inputs of {{}}, "
                         f"an op only the target has, + {CHAIN_ROUNDINGS:g} x floor", err[at], src[at], name[at])
    at = np.flatnonzero(a4)
    what = reason[at]
    blank = ~nonempty(what)
    what = replaced(what, blank, _format("input departs: error {} = {} x floor",
                                         _fmts(err[at][blank], err_ok[at][blank]),
                                         _fmts(ratio[at][blank], ratio_ok[at][blank])))
    by = has[at]
    what = pc.if_else(pa.array(known[at], pa.bool_()),
                      _format("{}, beyond the error {:.3g} of its producer's inputs", what, src[at]), what)
    reason[at] = pc.if_else(pa.array(by, pa.bool_()),
                            _format("{}; produced by {}, an op only the target has", what, name[at]),
                            _format("{}; no compared op produced it (parameter or data input)", what))
    mismatch = at[compared[at]]
    reason[mismatch] = _format("{}; produced by {}, whose compared output does not carry this error: the op reads "
                               "other data than the bench's", what.filter(pa.array(compared[at], pa.bool_())),
                               name[mismatch])
    by = by & ~compared[at]
    origin[at[by]] = name[at[by]]
    if by.any() and getattr(c, "inputs_of", None) is not None:  # the first of a chain of one-input ops
        for i in at[by].tolist():
            origin[i] = _first_of_chain(c, int(made_at[i]), name[i])
    result[a1 | a2 | a3 | a5] = WARNING
    result[a4] = ERROR


def _no_inputs(k: int) -> list[tuple[str, int]]:
    """``inputs_of`` of rows built without it: no op's inputs are known."""
    return []


def _first_of_chain(c: Columns, k: int, name: str) -> str:
    """The first op of a chain of one-input ops only the target has that ends at the op
    ``name`` (output order ``k``): the Casts a mixed-precision run puts between a parameter
    and its consumer (MindSpore O2: a weight cast twice), whose first one is the parameter's
    first consumer. ``name`` itself when its one input is not made by such an op."""
    inputs_of = c.inputs_of or _no_inputs
    for _ in range(CHAIN_DEPTH):
        ins = inputs_of(k)
        if len(ins) != 1:
            break
        h, at = ins[0]
        before = [p for p in c.producers({h}).get(h, []) if p[0] < at]
        if not before or before[-1][2] or before[-1][1] is None:
            break
        k, name = int(before[-1][0]), before[-1][1]
    return name


class _SourceErrors:
    """The error of the inputs of a target op only the target has (the largest over its
    inputs): an input some compared op's output holds (same content hash) has that output's
    error; one produced by another op only the target has, that op's (recursively, at most
    ``depth`` ops back); NaN when unknown (an input no op produced, a parameter of a norm
    written by hand, or a compared output without an error)."""

    def __init__(self, c: Columns, err: np.ndarray, err_ok: np.ndarray, boxed: np.ndarray) -> None:
        self.c = c
        self.out_err: dict[str, float] = {}
        for i in np.flatnonzero(c.output & err_ok & np.isfinite(err) & ~boxed).tolist():
            h = c.target_content_hash[i]
            if h is not None:
                self.out_err[h] = max(self.out_err.get(h, 0.0), float(err[i]))
        self.memo: dict[int, float] = {}
        self.ops: dict[int, int] = {}  # the ops only the target has on the longest path back to a compared output

    def __call__(self, k: int, depth: int) -> float:
        if k in self.memo:
            return self.memo[k]
        self.memo[k] = math.nan  # a cycle is unknown
        self.ops[k] = 1
        ins = (self.c.inputs_of or _no_inputs)(k)
        worst = math.nan if not ins else 0.0
        producers = self.c.producers({h for h, _ in ins} - set(self.out_err)) if ins else {}
        for h, at in ins:
            if h in self.out_err:
                worst = max(worst, self.out_err[h])
                continue
            before = [p for p in producers.get(h, []) if p[0] < at]
            if not before or before[-1][2] or depth <= 0:  # no producer, compared without error, too deep
                worst = math.nan
                break
            e = self(int(before[-1][0]), depth - 1)
            if math.isnan(e):
                worst = e
                break
            worst = max(worst, e)
            self.ops[k] = max(self.ops[k], 1 + self.ops.get(int(before[-1][0]), 1))
        self.memo[k] = worst
        return worst



def _runs(values: np.ndarray) -> tuple[list[int], list[int]]:
    """(starts, ends) of the runs of equal values of a sorted array."""
    if values.size == 0:
        return [], []
    cut = np.flatnonzero(values[1:] != values[:-1]) + 1
    return [0, *cut.tolist()], [*cut.tolist(), int(values.size)]


def _cross_rank_order(c: Columns, rows: np.ndarray) -> np.ndarray:
    """``rows`` (row numbers, at most one per iteration and rank) sorted by when they ran
    across ranks: iteration, then the dump timestamp when every one of them has one (ranks
    of one host share a clock), else the row's place in its own rank's run order (ranks
    of a data-parallel run execute the same op sequence), then rank order."""
    n = len(c.group)
    iteration = getattr(c, "iteration", None)
    it = np.zeros(n, np.int64) if iteration is None else iteration
    ts = getattr(c, "timestamp", None)
    start = np.full(int(c.where.max()) + 1, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(start, c.where, c.run_rank)
    step = (c.run_rank - start[c.where]).astype(np.float64)
    when = step[rows]
    if ts is not None and rows.size and not np.isnan(ts[rows]).any():
        when = ts[rows]
    return rows[np.lexsort((c.run_rank[rows], when, it[rows]))]


def _firsts(c: Columns, rows: np.ndarray) -> np.ndarray:
    """The first of ``rows`` (row numbers) in each iteration and rank (by run order),
    in :func:`_cross_rank_order`."""
    if not rows.size:
        return rows
    rows = rows[np.argsort(c.run_rank[rows], kind="stable")]
    _, at = np.unique(c.where[rows], return_index=True)
    return _cross_rank_order(c, rows[at])


def first_departures(c: Columns, out: dict[str, np.ndarray]) -> dict[str, Any] | None:
    """The first departing op: the first op call with a precision ``error`` row in each
    iteration and rank (by run order), and among those the one that ran first across ranks
    (:func:`_cross_rank_order`: not the lowest rank number). None when nothing departs.

    Keys: ``row`` ({``pair_index``: its first error output, else its first error row;
    ``origin_op``}), ``origin_op``, ``inputs``/``outputs`` (its rows: {io, slot,
    scaled_err, floor, ratio, target_dtype, bench_dtype, result, reason}), ``ranks`` (the
    first departing row of each iteration and rank, in cross-rank order, as {pair_index:
    row number, phase}) and ``phases`` ({phase: {pair_index, phase}: the first departing
    row of that phase (columns.PHASES), found the same way}).
    """
    result = out["precision_result"]
    failing = np.flatnonzero(result == ERROR)
    if not failing.size:
        return None
    per_rank = [_pick(c, out, int(i)) for i in _firsts(c, failing).tolist()]  # row numbers
    phase = out["phase"]
    by_phase = {}
    for name in [p for p in PHASES if p in set(phase[failing].tolist())]:
        firsts = _firsts(c, failing[phase[failing] == name])
        by_phase[name] = _pick(c, out, int(firsts[0]))

    def value(name: str, i: int):
        return float(out[name][i]) if out[f"{name}_valid"][i] else None

    def side(i: int) -> dict:
        return {"io": _text_at(c.io, i), "slot": _text_at(c.slot, i), "scaled_err": value("scaled_err", i),
                "floor": value("precision_floor", i), "ratio": value("precision_ratio", i),
                "target_dtype": c.target_dtype[i], "bench_dtype": c.bench_dtype[i],
                "result": result[i], "reason": _text_at(out["precision_reason"], i)}

    pick = per_rank[0]
    group = np.flatnonzero(c.group == c.group[pick]).tolist()
    return {"row": {"pair_index": pick, "origin_op": out["origin_op"][pick]}, "origin_op": out["origin_op"][pick],
            "inputs": [side(i) for i in group if not c.output[i]],
            "outputs": [side(i) for i in group if c.output[i]],
            "ranks": [{"pair_index": i, "phase": phase[i]} for i in per_rank],
            "phases": {k: {"pair_index": i, "phase": k} for k, i in by_phase.items()}}


def _same_texts(c: Columns, a: str, b: str) -> np.ndarray:
    """``np.equal`` of two text columns of ``c`` (None equal to None), per row: by Arrow's
    kernels where ``c.arrow`` holds both (the same values), else over the object arrays."""
    if a in c.arrow and b in c.arrow:
        x, y = c.arrow[a], c.arrow[b]
        same = pc.or_(pc.fill_null(pc.equal(x, y), False), pc.and_(x.is_null(), y.is_null()))
        return same.to_numpy(zero_copy_only=False)
    return np.equal(getattr(c, a), getattr(c, b)).astype(bool)


def _text_at(texts, i: int):
    """Element ``i`` of a column (an Arrow array or an object array) as a Python object."""
    return texts[i].as_py() if isinstance(texts, pa.Array) else texts[i]


def _pick(c: Columns, out: dict[str, np.ndarray], row: int) -> int:
    """The row a departing op is reported by: its first error output, else ``row``."""
    group = np.flatnonzero(c.group == c.group[row]).tolist()
    return next((i for i in group if c.output[i] and out["precision_result"][i] == ERROR), row)
