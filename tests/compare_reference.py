"""A reference for the compare rules, row by row: msprobe's verdict checkers and the
precision rules as they were written before issue 13 moved them onto columns (dumpdb's
``verdict.op_results_columns`` and ``precision.judge_precision_columns`` are now the one
implementation). tests/test_compare_columns.py checks the column code against this one on
generated rows that reach every checker and branch; not used by dumpdb itself.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from typing import Any

import ml_dtypes
import numpy as np

from dumpdb.compare.columns import run_order
from dumpdb.compare.metrics import MSG_NAN_INF_MISMATCH, MSG_STATS_MAGNITUDE, STAT_METRICS, STATS
from dumpdb.compare.precision import CAST_ROUNDINGS, LEAF_GROWTH, PrecisionRules, _pair_error, target_unit
from dumpdb.compare.stats_spec import python_stat
from dumpdb.compare.verdict import (  # _inf_or_nan, _num, _pair: input conversions, not rules: dumpdb's own
    ALL_IGNORE,
    ERROR,
    INPUT_IGNORE,
    MODES,
    PASS,
    WARNING,
    Thresholds,
    _inf_or_nan,
    _num,
    _pair,
)

_RANK = {PASS: 0, WARNING: 1, ERROR: 2}
NOISE = "noise"
_FLOAT_EPS = {"float16": float(np.finfo(np.float16).eps), "bfloat16": float(ml_dtypes.finfo(ml_dtypes.bfloat16).eps),
              "float32": float(np.finfo(np.float32).eps), "float64": float(np.finfo(np.float64).eps)}


# -- msprobe's verdicts (dumpdb.compare.verdict's module docstring) ----------------------------

def _shape(s):
    if s is None:
        return None
    if isinstance(s, (list, tuple)):
        return tuple(int(d) for d in s)
    return str(s).replace(" ", "")


class _Verdicts:
    def __init__(self, rows: list[dict]):
        self.levels = [PASS] * len(rows)
        self.reasons: list[list[str]] = [[] for _ in rows]

    def flag(self, i: int, level: str, reason: str) -> None:
        if _RANK[level] > _RANK[self.levels[i]]:
            self.levels[i] = level
        self.reasons[i].append(f"{level}: {reason}")


def _ignore(rows: list[dict], inputs: list[int]) -> str | None:
    if not inputs:
        return None
    name = rows[inputs[0]].get("target_name")
    if not isinstance(name, str):
        return None
    parts = name.split(".")
    if len(parts) < 2:
        return None
    if parts[1] in ALL_IGNORE:
        return "all"
    if parts[1] in INPUT_IGNORE:
        return "input"
    return None


def _extreme(rows: list[dict], idx: list[int], key: str, smallest: bool) -> float:
    """msprobe ApiData.get_min_or_max_value: min (default 1.0) or max (default 0.0)."""
    value = 1.0 if smallest else 0.0
    for i in idx:
        v = _num(rows[i].get(key))
        if v is not None:
            value = min(value, v) if smallest else max(value, v)
    return value


def op_results(rows: list[dict], thresholds: Thresholds = Thresholds(),
               mode: str = "tensor") -> list[tuple[str, str | None]]:
    """Verdict of each row of one op (rows: the compared tensors of one target op).

    ``mode`` is ``'tensor'`` or ``'statistics'`` (which checkers run; module docstring).
    Returns, in row order, ``(result, reason)`` with result ``'pass'``, ``'warning'`` or
    ``'error'`` and reason None or the "; "-joined reasons of the checkers that fired on
    the row. Raises ValueError for an unknown mode.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    th = thresholds
    v = _Verdicts(rows)
    inputs = [i for i, r in enumerate(rows) if r.get("io") != "output"]
    outputs = [i for i, r in enumerate(rows) if r.get("io") == "output"]
    ignore = _ignore(rows, inputs)
    per_row = [] if ignore == "all" else outputs if ignore == "input" else inputs + outputs
    whole_op = ignore is None

    _inf_nan(rows, per_row, v)
    if mode == "tensor":
        if whole_op and outputs:
            min_in = _extreme(rows, inputs, "one_thousandth_err_ratio", True)
            min_out = _extreme(rows, outputs, "one_thousandth_err_ratio", True)
            if min_in > th.one_thousandth_input and min_out < th.one_thousandth_output:
                v.flag(outputs[0], ERROR,
                       f"One Thousandth Err Ratio is {min_out:.6g} on the outputs while above "
                       f"{th.one_thousandth_input:g} on the inputs (output limit {th.one_thousandth_output:g})")
    else:
        if whole_op:
            max_in = abs(_extreme(rows, inputs, "l2norm_rel_diff", False))
            if max_in < th.rel_err_input:
                for i in outputs:
                    rel = _num(rows[i].get("l2norm_rel_diff")) or 0.0
                    if abs(rel) > th.rel_err_output:
                        v.flag(i, ERROR, f"output L2-norm relative diff {rel:.6g} > {th.rel_err_output:g} "
                                         f"while the inputs' stay below {th.rel_err_input:g}")
    _requires_grad(rows, per_row, v)
    _dtype(rows, per_row, v)
    _shapes(rows, per_row, v)
    if mode == "tensor":
        if whole_op and outputs:
            min_in = _extreme(rows, inputs, "cosine", True)
            min_out = _extreme(rows, outputs, "cosine", True)
            if min_in > th.cosine_warn_input and min_in - min_out > th.cosine_warn_drop:
                v.flag(outputs[0], WARNING,
                       f"cosine drops from {min_in:.6g} (inputs) to {min_out:.6g} (outputs), "
                       f"more than {th.cosine_warn_drop:g}")
        if not inputs:
            _outputs_only_accuracy(rows, outputs, th, v)
    else:
        if whole_op and outputs:
            max_in = abs(_extreme(rows, inputs, "l2norm_rel_diff", False))
            max_out = abs(_extreme(rows, outputs, "l2norm_rel_diff", False))
            if max_in == 0:
                if max_out > th.rel_warn_zero_input:
                    v.flag(outputs[0], WARNING, f"output L2-norm relative diff {max_out:.6g} > "
                                                f"{th.rel_warn_zero_input:g} while the inputs' is 0")
            elif max_out / max_in > th.rel_warn_ratio:
                v.flag(outputs[0], WARNING, f"output L2-norm relative diff {max_out:.6g} is more than "
                                            f"{th.rel_warn_ratio:g} times the inputs' {max_in:.6g}")
    return [(level, "; ".join(r) if r else None) for level, r in zip(v.levels, v.reasons)]


def _inf_nan(rows: list[dict], idx: list[int], v: _Verdicts) -> None:
    for i in idx:
        r = rows[i]
        if _inf_or_nan(r.get("bench_max")) or _inf_or_nan(r.get("bench_min")):
            continue
        if _inf_or_nan(r.get("target_max")) or _inf_or_nan(r.get("target_min")):
            v.flag(i, ERROR, "target max/min is nan or inf while bench's are finite")


def _requires_grad(rows: list[dict], idx: list[int], v: _Verdicts) -> None:
    for i in idx:
        t, b = _pair(rows[i], "requires_grad")
        if t is None or b is None:
            continue
        if t != b:
            v.flag(i, ERROR, f"requires_grad differs (target {t}, bench {b})")


def _dtype(rows: list[dict], idx: list[int], v: _Verdicts) -> None:
    for i in idx:
        r = rows[i]
        bench_name = r.get("bench_name")
        if isinstance(bench_name, str) and ("qkv" in bench_name or "gate_up" in bench_name):
            continue
        t, b = _pair(r, "dtype")
        if not t or not b:
            continue
        if str(t) != str(b):
            v.flag(i, ERROR, f"dtypes differ (target {t}, bench {b})")


def _shapes(rows: list[dict], idx: list[int], v: _Verdicts) -> None:
    for i in idx:
        t, b = _pair(rows[i], "shape")
        if t is None or b is None:
            continue
        ts, bs = _shape(t), _shape(b)
        if ts != bs:
            v.flag(i, ERROR, f"shapes differ (target {t}, bench {b})")


def _outputs_only_accuracy(rows: list[dict], outputs: list[int], th: Thresholds, v: _Verdicts) -> None:
    for i in outputs:
        r = rows[i]
        cos, mae = _num(r.get("cosine")), _num(r.get("max_abs_err"))
        if cos is None and mae is None:
            msg = r.get("err_message")
            if isinstance(msg, str) and MSG_NAN_INF_MISMATCH in msg:
                v.flag(i, ERROR, "accuracy not reached: nan/inf positions differ")
            continue
        if cos is None:
            bad = mae > th.max_abs_err_error_max
        elif mae is None:
            bad = cos < th.cosine_error_max
        else:
            bad = ((cos < th.cosine_error and mae > th.max_abs_err_error)
                   or cos < th.cosine_error_max or mae > th.max_abs_err_error_max)
        if bad:
            v.flag(i, ERROR, f"accuracy not reached (cosine {_fmt_verdict(cos)}, max_abs_err {_fmt_verdict(mae)}; "
                             f"rule: cosine < {th.cosine_error:g} and max_abs_err > {th.max_abs_err_error:g}, "
                             f"or cosine < {th.cosine_error_max:g}, or max_abs_err > {th.max_abs_err_error_max:g})")


def _fmt_verdict(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.6g}"


# -- the precision rules (dumpdb.compare.precision's module docstring) --------------------------

def _num_precision(v) -> float | None:
    if v is None:
        return None
    f = float(v)
    return None if math.isnan(f) else f


_CONTAINERS = ("Module.", "Cell.")


def _phase_of(r: dict, last_backward: dict) -> str:
    name, scope = r.get("target_name") or "", r.get("scope_name") or ""
    if ".backward" in name or ".parameters_grad." in name or "Gradients/" in scope:
        return "backward"
    key = (r["iteration"], r["rank"])
    if "optimizer" in scope.lower() or (key in last_backward and run_order(r) > last_backward[key]):
        return "optimizer"
    return "forward"


def _container(r: dict) -> bool:
    t = r.get("op_type")
    return isinstance(t, str) and t.startswith(_CONTAINERS) and ".parameters_grad." not in (r.get("target_name") or "")


def _rms_of(r: dict, key: str) -> float | None:
    return _rms(r.get(key), r.get("bench_shape"))


def judge_precision(rows: list[dict], producers: dict[str, list[tuple[tuple, str, bool]]] | None = None,
                    rules: PrecisionRules = PrecisionRules()) -> None:
    """Add the precision columns to each result row (dicts, in execution order):
    ``scaled_err`` (relative Euclidean error), ``precision_floor``, ``precision_ratio``
    (err / floor), ``precision_dtype`` (the lower-precision dtype), ``precision_result``
    (pass / noise / warning / error) and ``precision_reason``.

    ``producers``: content hash -> [(order key, op name, compared)] of the target's output
    tensors (every target op, compared or not), to find the op that produced an input.
    Rows are grouped by op call as the msprobe verdicts are; see the module docstring.
    """
    ops: dict[tuple, list[dict]] = defaultdict(list)
    last_backward: dict[tuple, tuple] = {}
    for r in sorted(rows, key=run_order):
        err, floor, low, structural = _pair_error(r)
        ratio = None
        if err is not None and floor is not None:
            ratio = math.inf if floor == 0 and err > 0 else (0.0 if err == 0 else err / floor)
        r.update(scaled_err=err, precision_floor=floor, precision_ratio=ratio, precision_dtype=low,
                 precision_result=PASS, precision_reason=structural)
        r["_departs"] = structural is not None or (ratio is not None and ratio > rules.margin)
        ops[(r["iteration"], r["rank"], r["graph_id"], r["call_index"], r["target_name"])].append(r)
        name, scope = r.get("target_name") or "", r.get("scope_name") or ""
        if ".backward" in name or ".parameters_grad." in name or "Gradients/" in scope:
            last_backward[(r["iteration"], r["rank"])] = run_order(r)
    for r in rows:
        r["_phase"] = _phase_of(r, last_backward)
    _stale(rows, ops, producers)
    # the working precision: the lowest-precision float any pair was judged at
    floats = [_FLOAT_EPS[r["precision_dtype"]] for r in rows if r["precision_dtype"] in _FLOAT_EPS]
    u_w = max(floats, default=0.0) / 2
    w_dtype = next((d for d, e in _FLOAT_EPS.items() if e / 2 == u_w), None) if floats else None
    for group in ops.values():
        _noise(group, u_w, w_dtype, rules)
    _signature(rows, rules)
    unit = target_unit([r.get("target_dtype") for r in rows], [r.get("target_dtype_declared") for r in rows])
    call_max = _collectives(rows, ops)
    forward_inputs: dict[tuple, tuple[list, list]] = defaultdict(lambda: ([], []))
    for r in rows:
        if r["io"] != "output" and r.get("target_name"):
            t_in, b_in = forward_inputs[(r["iteration"], r["rank"], r["target_name"])]
            t_in.append(_shape(r.get("target_shape")))
            b_in.append(_shape(r.get("bench_shape")))
    carried_by: dict = {}  # content hash -> the largest finite error of a compared output holding it
    for r in rows:
        e = r["scaled_err"]
        if r["io"] == "output" and e is not None and math.isfinite(e) and r.get("target_content_hash") is not None \
                and not _container(r):
            carried_by[r["target_content_hash"]] = max(carried_by.get(r["target_content_hash"], 0.0), e)
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
            if r["_departs"] and not r.get("_noise"):
                _judge_input(r, producers, rules, upstream.get(where, 0.0), inf_before, carried_by, unit,
                             r["_phase"] == "forward")
            elif _exact_context(r, upstream.get(where, 0.0), inf_before) and _producer(r, producers) is None:
                r["precision_result"] = ERROR
                r["precision_reason"] = (
                    f"input differs (error {r['scaled_err']:.3g} = {r['precision_ratio']:.3g} x floor) where every "
                    f"earlier tensor of its iteration and rank is bitwise equal, both sides {r.get('target_dtype')}; "
                    "no op produced it (a changed parameter or data input)")
        counted = [r for r in group if not _container(r) and not r.get("_stale")]
        upstream[where] = max([upstream.get(where, 0.0), *(_finite(_eff(r)) for r in inputs if r in counted)])
        if inputs:
            worst_in = max((_eff(r) or 0.0 for r in inputs), default=0.0)
            key = _call_key(group[0])
            if key in call_max:  # a collective: every rank's inputs of the call
                worst_in = call_max[key]
        else:
            worst_in = upstream.get(where, 0.0)
        upstream[where] = max([upstream.get(where, 0.0), *(_finite(_eff(r)) for r in outputs if r in counted)])
        for r in outputs:
            if r["_departs"] and not r.get("_noise"):
                _judge_output(r, inputs, worst_in, inf_before, rules)
        for r in group:
            if r.get("_coll"):
                r["precision_result"] = NOISE
                r["precision_reason"] = (f"rounding noise: a collective's result of rank inputs that are rounding "
                                         f"noise (or equal); error {r['scaled_err']:.3g} says nothing")
            elif r.get("_sig"):
                r["precision_result"] = NOISE
                r["precision_reason"] = (f"rounding noise: each side at its own run's rounding level (target / bench "
                                         f"RMS {r['target_l2norm'] / r['bench_l2norm']:.3g}, unit roundoffs "
                                         f"{r['_q']:.3g}); error {r['scaled_err']:.3g} says nothing")
            elif r.get("_noise"):
                r["precision_result"] = NOISE
                r["precision_reason"] = (f"rounding noise: both sides within {rules.noise:g} x u({w_dtype}) x the op's "
                                         f"scale (bench RMS {_rms_of(r, 'bench_l2norm'):.3g} of {r['_scale']:.3g}); "
                                         f"error {r['scaled_err']:.3g} says nothing")
        for r in group:
            if r.get("_stale"):
                e = r["scaled_err"]
                r["precision_result"] = WARNING
                r["precision_reason"] = (
                    f"not comparable: an output of the in-place optimizer kernel {r['op_type']} holds the bytes of an "
                    "earlier tensor of its run, so its output buffers are not what the kernel computed (it updates "
                    f"its inputs in place); error {math.nan if e is None else e:.3g} says nothing")
        diff = next((r.get("arg_diff") for r in group if r.get("arg_diff")), None)
        if diff:
            for r in (outputs or group):
                old = r["precision_reason"]
                r["precision_result"] = ERROR
                r["precision_reason"] = f"scalar arguments differ ({diff})" + (f"; {old}" if old else "")
        for r in outputs:
            _misattributed(r, forward_inputs)
        for r in group:
            if _container(r) and r["precision_result"] != PASS:
                r["precision_result"] = WARNING
                r["precision_reason"] = f"module/cell record, judged by the ops inside it ({r['precision_reason']})"
    for r in rows:
        for k in ("_departs", "_noise", "_scale", "_eff", "_phase", "_sig", "_q", "_coll", "_stale"):
            r.pop(k, None)


def _stale(rows: list[dict], ops: dict, producers: dict | None) -> None:
    """Mark ``_stale`` the departing outputs of in-place optimizer kernels whose dumped
    output buffers hold bytes that existed before the call ran (row by row; the rule and
    its source are in ``precision._stale_outputs``)."""
    start = {k: min(run_order(r) for r in g) for k, g in ops.items()}
    key_of = {id(r): k for k, g in ops.items() for r in g}

    def known(r: dict, h) -> bool:
        return h is not None and not _container(r)

    evidence: set = set()
    for side in ("target", "bench"):
        hashes = {id(r): r.get(f"{side}_content_hash") for r in rows}
        if all(h is None for h in hashes.values()):
            continue
        first: dict = {}
        for r in rows:
            h = hashes[id(r)]
            if known(r, h):
                w = (r["iteration"], r["rank"], h)
                first[w] = min(first.get(w, (math.inf,)), start[key_of[id(r)]])
        own: dict = defaultdict(set)
        for r in rows:
            if r["io"] != "output" and known(r, hashes[id(r)]):
                own[key_of[id(r)]].add(hashes[id(r)])
        found, rest = [], []
        for r in rows:
            h = hashes[id(r)]
            vmax, vmin = r.get(f"{side}_max"), r.get(f"{side}_min")
            if not (r["io"] == "output" and r["_phase"] == "optimizer" and r.get("op_type") is not None
                    and known(r, h) and not (vmax is not None and vmin is not None and vmax == vmin)
                    and h not in own[key_of[id(r)]]):
                continue
            k = key_of[id(r)]
            (found if first[(r["iteration"], r["rank"], h)] < start[k] else rest).append(r)
        if side == "target":
            for r in rest:
                if r["op_type"] in evidence:
                    continue
                for order, name, _compared in (producers or {}).get(r["target_content_hash"], []):
                    if order < r["_order"] and name != r.get("target_name") \
                            and not _container({"op_type": name, "target_name": name}):
                        found.append(r)
                        break
        evidence |= {r["op_type"] for r in found}
    for r in rows:
        if r["io"] == "output" and r["_phase"] == "optimizer" and r.get("op_type") in evidence and r["_departs"] \
                and not _container(r):
            r["_stale"], r["_departs"] = True, False


_COLLECTIVE = re.compile(r"(^|[._])(hcom)?(all_?reduce|all_?gather\w*|reduce_?scatter\w*|broadcast|all_?to_?all\w*)$",
                         re.IGNORECASE)


def _call_key(r: dict) -> tuple | None:
    """A collective call on every rank: (iteration, op name); None for other ops."""
    if not _COLLECTIVE.search(r.get("op_type") or ""):
        return None
    return (r["iteration"] or 0, r["target_name"])


def _collectives(rows: list[dict], ops: dict) -> dict:
    """Mark the departing outputs of collective calls whose inputs on every rank are noise
    or do not depart (one noise at least) as noise; return each collective call's largest
    input error over its ranks (calls with inputs)."""
    calls: dict = defaultdict(list)
    for group in ops.values():
        key = _call_key(group[0])
        if key is not None:
            calls[key].append(group)
    top: dict = {}
    for r in rows:
        rb = _rms_of(r, "bench_l2norm")
        if rb is not None and math.isfinite(rb):
            where = (r["iteration"], r["rank"])
            top[where] = max(top.get(where, 0.0), rb)
    call_max = {}
    for key, groups in calls.items():
        inputs = [r for grp in groups for r in grp if r["io"] != "output"]
        bad = any(r["_departs"] and not r.get("_noise") for r in inputs)
        some = any(r.get("_noise") for r in inputs)
        worsts = [max((_eff(r) or 0.0 for r in grp if r["io"] != "output"), default=0.0)
                  for grp in groups if any(r["io"] != "output" for r in grp)]
        if worsts:
            call_max[key] = max(w for w in worsts if not math.isnan(w)) if any(not math.isnan(w) for w in worsts) \
                else 0.0
        if not some or bad:
            continue
        for grp in groups:
            for r in grp:
                rb, e = _rms_of(r, "bench_l2norm"), r["scaled_err"]
                t = top.get((r["iteration"], r["rank"]), 0.0)
                if r["io"] == "output" and r["_departs"] and r["precision_reason"] is None and not _container(r) \
                        and not r.get("_noise") and rb is not None and math.isfinite(rb) and t > 0:
                    r["_noise"], r["_coll"], r["_eff"] = True, True, e * rb / t
    return call_max


def _misattributed(r: dict, forward_inputs: dict) -> None:
    """A backward output pair of different shapes where one side's record holds no gradient
    of its op's forward inputs (its shape is none of theirs) and the other's does."""
    name = r.get("target_name") or ""
    ts, bs = _shape(r.get("target_shape")), _shape(r.get("bench_shape"))
    if r["precision_result"] != ERROR or ".backward" not in name or ts is None or bs is None or ts == bs:
        return
    head, _, tail = name.rpartition(".backward")
    found = forward_inputs.get((r["iteration"], r["rank"], f"{head}.forward{tail}"))
    if found is None:
        return
    t_ok, b_ok = ts in found[0], bs in found[1]
    if t_ok == b_ok:
        return
    side, shape, fwd = ("bench", bs, found[1]) if t_ok else ("target", ts, found[0])
    r["precision_result"] = WARNING
    r["precision_reason"] = (f"not comparable: the {side}'s {name} output has shape {list(shape)}, none of its forward "
                             f"inputs' ({', '.join(str(list(x)) for x in sorted({x for x in fwd if x is not None}))}): "
                             "that side's record holds another op's gradients (an op that returned its input unchanged "
                             f"has no backward of its own); {r['precision_reason']}")


def _eff(r: dict) -> float | None:
    """A row's error as its op's inputs count it: a noise row's absolute error over its op's scale."""
    return r["_eff"] if r.get("_noise") else r["scaled_err"]


def _noise(group: list[dict], u_w: float, w_dtype, rules: PrecisionRules) -> None:
    """Mark the departing rows of an op call that are rounding noise on both sides."""
    def sides(r):
        rb = _rms_of(r, "bench_l2norm")
        if rb is None or r["scaled_err"] is None or not math.isfinite(r["scaled_err"]):
            return None
        rt = _rms_of(r, "target_l2norm") if r.get("target_l2norm") is not None else rb * (1 + r["scaled_err"])
        return (rb, rt) if math.isfinite(rb) and math.isfinite(rt) else None
    for r in group:
        if not r["_departs"] or r["precision_reason"] is not None or _container(r):
            continue
        mine = sides(r)
        if mine is None or r["scaled_err"] < 0.5:
            continue
        others = [s for x in group if x is not r and (s := _known_sides(x, sides)) is not None]
        if not others:
            continue
        sb, st = max(o[0] for o in others), max(o[1] for o in others)
        if sb > 0 and st > 0 and mine[0] <= rules.noise * u_w * sb and mine[1] <= rules.noise * u_w * st:
            r["_noise"], r["_scale"] = True, sb
            r["_eff"] = r["scaled_err"] * mine[0] / sb


def _signature(rows: list[dict], rules: PrecisionRules) -> None:
    """Mark the departing rows of a mixed-precision pair that are rounding noise in each run."""
    def unit(key):
        return max((_FLOAT_EPS[r[key]] / 2 for r in rows if r[key] in _FLOAT_EPS), default=0.0)
    u_t, u_b = unit("target_dtype"), unit("bench_dtype")
    if not (u_t > 0 and u_b > 0):
        return
    top: dict = {}
    for r in rows:
        rb, rt = _rms_of(r, "bench_l2norm"), _rms_of(r, "target_l2norm")
        where = (r["iteration"], r["rank"])
        tb, tt = top.get(where, (0.0, 0.0))
        top[where] = (max(tb, rb) if rb is not None and math.isfinite(rb) else tb,
                      max(tt, rt) if rt is not None and math.isfinite(rt) else tt)
    q = u_t / u_b
    for r in rows:
        if not r["_departs"] or r["precision_reason"] is not None or _container(r) or r.get("_noise"):
            continue
        rb, rt, e = _rms_of(r, "bench_l2norm"), _rms_of(r, "target_l2norm"), r["scaled_err"]
        if rb is None or rt is None or e is None or not (math.isfinite(rb) and math.isfinite(rt) and math.isfinite(e)):
            continue
        tb, tt = top[(r["iteration"], r["rank"])]
        if e >= 0.5 and rb > 0 and q / 8 <= rt / rb <= q * 8 and rb <= rules.noise * u_b * tb \
                and rt <= rules.noise * u_t * tt:
            r["_noise"], r["_sig"], r["_q"], r["_eff"] = True, True, q, e * rb / tb


def _known_sides(x: dict, sides):
    """(bench RMS, target RMS) of a row whose bench norm and shape are known (its error may be anything)."""
    rb = _rms_of(x, "bench_l2norm")
    if rb is None or not math.isfinite(rb):
        return None
    if x.get("target_l2norm") is not None:
        rt = _rms_of(x, "target_l2norm")
    else:
        e = x["scaled_err"]
        rt = rb * (1 + e) if e is not None else math.nan
    return None if rt is None or not math.isfinite(rt) else (rb, rt)


def _growth(r: dict, rules: PrecisionRules) -> float:
    """The growth allowance of a row's op: the calibrated table's entry for its op type,
    direction and dtype, else the default."""
    if r.get("mode") != "tensor":  # statistics: the error is a lower bound
        return rules.growth
    direction = "backward" if r["_phase"] == "backward" else "forward"
    return rules.allowances().get(f"{r.get('op_type')}|{direction}|{r['precision_dtype']}", rules.growth)


def _judge_output(r: dict, inputs: list[dict], worst_in: float, inf_before: bool, rules: PrecisionRules) -> None:
    """A departing output row: explained by its inputs' error ``worst_in`` (warning) or not (error)."""
    growth = _growth(r, rules)
    bound = growth * worst_in + rules.margin * (r["precision_floor"] or 0.0)
    err = r["scaled_err"]
    if r["precision_reason"] is None and err is not None and err <= bound:
        r["precision_result"] = WARNING
        r["precision_reason"] = (f"error {err:.3g} propagated: within {growth:.3g} x the inputs' "
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
    elif r["precision_reason"] is None and _cancellation(r, inputs, rules, growth):
        r["precision_result"] = WARNING
        r["precision_reason"] = (f"error {_fmt_precision(err)} relative to a result far smaller than the inputs "
                                 "(cancellation): within the inputs' absolute error")
    else:
        r["precision_result"] = ERROR
        if r["precision_reason"] is None:
            r["precision_reason"] = (f"departs: error {_fmt_precision(err)} = {_fmt_precision(r['precision_ratio'])} x the "
                                     f"{r['precision_dtype']} floor, inputs' error {worst_in:.3g}, growth allowed "
                                     f"{growth:.3g}")


def _rms(l2, shape) -> float | None:
    l2 = _num_precision(l2)
    if l2 is None or shape is None:
        return None
    return l2 / math.sqrt(max(math.prod(shape), 1))


def _cancellation(r: dict, inputs: list[dict], rules: PrecisionRules, growth: float) -> bool:
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
        in_err = max(in_err, _eff(x) * rms)
    err = r.get("scaled_err")
    if out_rms is None or err is None or not math.isfinite(err) or in_rms == 0 or out_rms >= 0.01 * in_rms:
        return False
    u = (r.get("precision_floor") or 0.0)
    return err * out_rms <= growth * in_err + rules.margin * u * in_rms


def _finite(v) -> float:
    return v if v is not None and math.isfinite(v) else 0.0


def _fmt_precision(v) -> str:
    return "n/a" if v is None else f"{v:.3g}"


def _producer(r: dict, producers):
    """The last target op (not a module/cell record) before ``r`` that output its bytes."""
    h = r.get("target_content_hash")
    if producers and h in producers:
        ops = [p for p in producers[h] if not _container({"op_type": p[1], "target_name": p[1]})]
        before = [p for p in ops if p[0] < r["_order"]] if r.get("_order") is not None else ops
        return before[-1] if before else None
    return None


def _exact_context(r: dict, upstream: float, inf_before: bool) -> bool:
    """An input within the margin that differs where every earlier tensor of its iteration
    and rank is bitwise equal, both sides one float dtype (precision.py, "Exact context")."""
    err = r["scaled_err"]
    return not r.get("_noise") and not r.get("_sig") and not r.get("_coll") and r["precision_reason"] is None \
        and not _container(r) and err is not None and math.isfinite(err) and err > 0 and upstream == 0 \
        and not inf_before and r.get("target_dtype") == r.get("bench_dtype") and r["precision_dtype"] in _FLOAT_EPS


def _judge_input(r: dict, producers, rules: PrecisionRules, upstream: float, inf_before: bool = False,
                 carried_by: dict | None = None, unit: tuple = (0.0, None), forward: bool = False) -> None:
    """A departing input: explained when a compared op produced its bytes, or when an
    earlier compared tensor's error explains it (the producer is a cast or an op the dump
    or the alignment left out; in the forward pass, an input no op produced within
    LEAF_GROWTH x it); otherwise the input is where the departure starts."""
    carried_by = carried_by or {}
    h = r.get("target_content_hash")
    producer = _producer(r, producers)
    err = r["scaled_err"]
    if producer is not None and producer[2]:
        # the producer's compared output must carry the error (else the op reads other data)
        carried = carried_by.get(h, math.inf)
        judged = r["precision_reason"] is None and err is not None and math.isfinite(err)
        if not (judged and err > rules.growth * carried + rules.margin * (r["precision_floor"] or 0.0)):
            r["precision_result"] = WARNING
            r["precision_reason"] = r["precision_reason"] or f"input error propagated from {producer[1]}"
            return
    if err is not None and math.isinf(err) and inf_before:
        r["precision_result"] = WARNING
        r["precision_reason"] = f"{r['precision_reason'] or 'nan/inf'}: propagated from earlier nan/inf"
        return
    allowed = LEAF_GROWTH if forward and producer is None else rules.growth
    if r["precision_reason"] is None and err is not None and \
            err <= allowed * upstream + rules.margin * (r["precision_floor"] or 0.0):
        r["precision_result"] = WARNING
        r["precision_reason"] = (f"input error {err:.3g} within {allowed:.3g} x the largest earlier error "
                                 f"{upstream:.3g}" + (f" (produced by {producer[1]})" if producer else ""))
        return
    if producer is not None and not producer[2] and r["precision_reason"] is None and err is not None \
            and err <= CAST_ROUNDINGS * unit[0]:
        r["precision_result"] = WARNING
        r["precision_reason"] = (f"input error {err:.3g} within {CAST_ROUNDINGS:g} x the target's {unit[1]} unit "
                                 f"roundoff after {producer[1]}, an op only the target has (a cast of a mixed-precision "
                                 "run)")
        return
    r["precision_result"] = ERROR
    what = r["precision_reason"] or \
        f"input departs: error {_fmt_precision(r['scaled_err'])} = {_fmt_precision(r['precision_ratio'])} x floor"
    if producer is not None and producer[2]:
        r["precision_reason"] = (f"{what}; produced by {producer[1]}, whose compared output does not carry this "
                                 "error: the op reads other data than the bench's")
    elif producer is not None:
        r["precision_reason"] = f"{what}; produced by {producer[1]}, an op only the target has"
        r["origin_op"] = producer[1]
    else:
        r["precision_reason"] = f"{what}; no compared op produced it (parameter or data input)"


def first_departure(rows: list[dict]) -> dict[str, Any] | None:
    """The first op with a precision ``error`` row: the first (by :func:`run_order`) of each
    iteration and rank, then across ranks the one that ran first (iteration, then timestamp
    when every one has one, else its place among its own rank's rows), its rows as
    ``inputs``/``outputs`` lists of {io, slot, err, floor, ratio, dtypes, result, reason}.
    None when nothing departs beyond precision."""
    failing = [r for r in rows if r.get("precision_result") == ERROR]
    if not failing:
        return None

    def key(r):
        return (r["iteration"], r["rank"], r["graph_id"], r["call_index"], r["target_name"])

    def pick(first):
        group = [r for r in rows if key(r) == key(first)]
        return next((r for r in group if r["io"] == "output" and r["precision_result"] == ERROR), first)

    def firsts(cands):
        per: dict = {}
        for r in sorted(cands, key=run_order):
            per.setdefault((r["iteration"], r["rank"]), r)
        ranked = sorted(rows, key=run_order)
        start: dict = {}
        for k, r in enumerate(ranked):
            start.setdefault((r["iteration"], r["rank"]), k)
        place = {id(r): k - start[(r["iteration"], r["rank"])] for k, r in enumerate(ranked)}
        chosen = list(per.values())
        use_ts = all(r.get("timestamp") is not None for r in chosen)
        return sorted(chosen, key=lambda r: (-1 if r["iteration"] is None else r["iteration"],
                                             r["timestamp"] if use_ts else place[id(r)], run_order(r)))

    per_rank = [pick(r) for r in firsts(failing)]
    last_backward: dict = {}
    for r in sorted(rows, key=run_order):
        name, scope = r.get("target_name") or "", r.get("scope_name") or ""
        if ".backward" in name or ".parameters_grad." in name or "Gradients/" in scope:
            last_backward[(r["iteration"], r["rank"])] = run_order(r)
    phase = {id(r): _phase_of(r, last_backward) for r in rows}
    phases = {p: pick(firsts([r for r in failing if phase[id(r)] == p])[0])["pair_index"]
              for p in ("forward", "backward", "optimizer") if any(phase[id(r)] == p for r in failing)}
    out = per_rank[0]
    group = [r for r in rows if key(r) == key(out)]

    def side(r: dict) -> dict:
        return {"io": r["io"], "slot": r["slot"], "scaled_err": r["scaled_err"], "floor": r["precision_floor"],
                "ratio": r["precision_ratio"], "target_dtype": r["target_dtype"], "bench_dtype": r["bench_dtype"],
                "result": r["precision_result"], "reason": r["precision_reason"]}

    return {"row": out, "origin_op": out.get("origin_op"),
            "inputs": [side(r) for r in group if r["io"] != "output"],
            "outputs": [side(r) for r in group if r["io"] == "output"],
            "ranks": [r["pair_index"] for r in per_rank], "phases": phases}


# -- statistics mode, pair by pair (the engine computes it in SQL: dumpdb.compare.stats_sql) --
def _stat_value(v) -> float | None:
    """A catalog statistic as float; None for missing/non-numeric (bool is not numeric)."""
    if v is None or isinstance(v, (bool, np.bool_)):
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def stats_metrics(target: dict, bench: dict) -> tuple[dict[str, float | None], str | None]:
    """Statistics-mode differences of one pair (:data:`STAT_METRICS`).

    ``target`` and ``bench`` are dicts with keys ``max``, ``min``, ``mean``,
    ``l2norm`` (missing keys, None, and non-numeric values count as missing; NaN and
    +-Inf are values). For each statistic X: ``X_diff = target - bench`` and
    ``X_rel_diff = |X_diff / bench|`` as a fraction (not percent); rules for missing,
    equal, NaN, Inf and zero bench values in :mod:`dumpdb.compare.metrics`' docstring.

    Returns ``(metrics, err_message)``: ``err_message`` is None, or says which
    statistics differ by more than half their magnitude (msprobe's 0.5 rule).
    """
    metrics: dict[str, float | None] = dict.fromkeys(STAT_METRICS)
    flagged: list[str] = []
    for name in STATS:  # the rules: dumpdb.compare.stats_spec.CASES (also the SQL form's)
        diff, rel, flag = python_stat(_stat_value(target.get(name)), _stat_value(bench.get(name)))
        metrics[f"{name}_diff"], metrics[f"{name}_rel_diff"] = diff, rel
        if flag:
            flagged.append(name)
    msg = MSG_STATS_MAGNITUDE.format(names=", ".join(flagged)) if flagged else None
    return metrics, msg
