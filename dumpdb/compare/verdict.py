"""pass / warning / error verdicts over the compared tensors of one op.

A port of msprobe's result checkers (mindstudio-probe 26.2.0,
``msprobe/core/compare/indicator_analysis/algorithm.py``, driven by ``calculator.py`` and
``api_data.py``; reference ``formats.md`` 2.1). msprobe groups the rows of one API or
module (here: one target op), splits them into *inputs* (every row that is not an output:
``input``, ``parameters``, ``parameters_grad``...) and *outputs* (``io == 'output'``),
starts every row at ``pass`` and lets each checker raise rows; a row keeps the worst level
any checker gave it, and every checker that fires adds its reason. As in msprobe's CSV
(``calculate_excel_result_df``), the level is per row: checkers that judge the op as a
whole flag its first output row. :func:`worst` gives the op's overall level (msprobe's
``calculate_result``).

Checkers (``min_in`` / ``min_out`` = smallest value over the input / output rows, 1.0 if
there is none; ``max_*`` = largest absolute value, 0.0 if none; None and NaN are skipped):

Tensor mode (msprobe ``TENSOR_CHECKERS``, in its order):

``InfNanErrChecker`` (error, each row)
    target max or min is NaN/+-Inf while bench max and min are finite.
``OneThousandthErrChecker`` (error, first output)
    ``min_in(one_thousandth_err_ratio) > one_thousandth_input`` (0.9) and
    ``min_out(...) < one_thousandth_output`` (0.1). msprobe's docstring and message say
    0.6; its code compares with 0.1, which we follow.
``RequiresGradErrChecker`` (error, each row)
    ``target_requires_grad != bench_requires_grad`` when both are known.
``DTypeErrChecker`` (error, each row)
    dtypes differ; skipped when the bench name contains ``qkv`` or ``gate_up``
    (msprobe's fused projections).
``ShapeErrChecker`` (error, each row)
    shapes differ.
``CosineWarnChecker`` (warning, first output)
    ``min_in(cosine) > cosine_warn_input`` (0.9) and
    ``min_in(cosine) - min_out(cosine) > cosine_warn_drop`` (0.1).

Statistics mode (msprobe ``STATISTICS_CHECKERS``): ``InfNanErrChecker``,
``RelativeErrChecker``, ``RequiresGradErrChecker``, ``DTypeErrChecker``,
``ShapeErrChecker``, ``RelativeWarnChecker``:

``RelativeErrChecker`` (error, each offending output)
    ``max_in(l2norm_rel_diff) < rel_err_input`` (0.1) and the output's
    ``|l2norm_rel_diff| > rel_err_output`` (0.5). Relative diffs are fractions
    (:mod:`dumpdb.compare.stats_sql`), which is what msprobe compares after
    turning its percent strings into numbers; a missing one counts 0.
``RelativeWarnChecker`` (warning, first output)
    ``max_out(l2norm_rel_diff) / max_in(...) > rel_warn_ratio`` (10), or, when
    ``max_in == 0``, ``max_out > rel_warn_zero_input`` (0.1).

msprobe's ``ParametersErrChecker`` (error, each input row of an op checked whole: a scalar
argument whose value differs) and its md5 mode (a CRC-32 that differs is an error, a
missing one a warning; that checker alone) run when the columns carry them (optional
``parameter``/``parameter_differs`` and ``md5_target``/``md5_bench``: the msprobe CSV,
:mod:`dumpdb.render.msprobe_rows`, which also gives ``rel_row``, the per-row L2-norm
relative diff as msprobe's RelativeErrChecker reads its cell); dumpdb's compare judges
tensors only. :func:`msprobe_results` gives msprobe's own message texts. The ignore lists
apply when the rows carry the op name (``target_name``; msprobe's rule reads the second
dot-separated field of the first input's name): ops ``empty``, ``empty_like``, ``numpy``, ``to``, ``__setitem__``,
``empty_with_format``, ``new_empty_strided``, ``new_empty``, ``empty_strided`` get no
check; communication ops ``_reduce_scatter_base``, ``_all_gather_base``,
``all_to_all_single``, ``batch_isend_irecv`` only the per-row checks on their outputs.

Ops with outputs only (MindSpore graph dumps, Parameters): msprobe's own rules already
judge them, since with no input ``min_in`` is 1.0 and ``max_in`` 0.0 - an output whose
One Thousandth ratio is < 0.1 is an error, one whose cosine is < 0.9 a warning, one whose
L2-norm relative diff is > 0.5 an error (statistics). In tensor mode we add, for each output
row of such an op, msprobe's MindSpore graph-compare rule "Accuracy Reached or Not"
(``msprobe/core/compare/multiprocessing_compute.py`` ``check_accuracy``): **error** when
``(cosine < cosine_error and max_abs_err > max_abs_err_error) or cosine < cosine_error_max
or max_abs_err > max_abs_err_error_max`` (0.99, 0.001, 0.9, 1: ``CompareConst``
``COS_THRESHOLD``, ``MAX_ABS_ERR_THRESHOLD``, ``COS_MAX_THRESHOLD``,
``MAX_ABS_ERR_MAX_THRESHOLD``). Where the cosine is None (one side all zero, 0-d or
one-element tensors) only ``max_abs_err > max_abs_err_error_max`` applies (msprobe turns
its ``Nan`` cosine into NaN, which fails every comparison), and where max_abs_err is None
only ``cosine < cosine_error_max``; NaN/Inf at different positions
(metrics None, message :data:`dumpdb.compare.metrics.MSG_NAN_INF_MISMATCH`) is an error,
as msprobe's ``N/A`` is "No". To switch the rule off, set ``cosine_error`` and
``cosine_error_max`` to -2 and both ``max_abs_err_*`` to ``inf``.

The rules run over columns (:class:`Columns`, :func:`op_results_columns`: the engine's
result columns; the msprobe CSV's cells); missing values skip the checks that need them.
A row-by-row wrapper for tests is ``tests/verdict_rows.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dumpdb.compare.columns import Shapes, unique_keys
from dumpdb.compare.metrics import MSG_NAN_INF_MISMATCH

PASS, WARNING, ERROR = "pass", "warning", "error"
_RANK = {PASS: 0, WARNING: 1, ERROR: 2}

# msprobe ApiIndicatorCalculator ignore sets (indicator_analysis/calculator.py).
ALL_IGNORE = frozenset({"empty", "empty_like", "numpy", "to", "__setitem__", "empty_with_format",
                        "new_empty_strided", "new_empty", "empty_strided"})
INPUT_IGNORE = frozenset({"_reduce_scatter_base", "_all_gather_base", "all_to_all_single",
                          "batch_isend_irecv"})
MODES = ("tensor", "statistics")
# a fused projection's bench name: "qkv" or "gate_up" anywhere in it (one RE2 scan for both)
_FUSED = "qkv|gate_up"
# an op name whose second dot-separated field is one of the ignored ops' (RE2)
_IGNORED = r"^[^.]*\.(?:" + "|".join(sorted(ALL_IGNORE | INPUT_IGNORE)) + r")(?:\.|$)"


@dataclass(frozen=True)
class Thresholds:
    """Verdict thresholds; defaults are msprobe 26.2.0's (checker constants and
    ``CompareConst``). All are floats so they can be set from the command line."""

    one_thousandth_input: float = 0.9      # OneThousandthErrChecker.input_threshold
    one_thousandth_output: float = 0.1     # OneThousandthErrChecker.output_threshold (code, not docstring)
    cosine_warn_input: float = 0.9         # CosineWarnChecker.input_threshold
    cosine_warn_drop: float = 0.1          # CosineWarnChecker.output_threshold
    rel_err_input: float = 0.1             # RelativeErrChecker.in_threshold
    rel_err_output: float = 0.5            # RelativeErrChecker.out_threshold
    rel_warn_ratio: float = 10.0           # RelativeWarnChecker.threshold
    rel_warn_zero_input: float = 0.1       # RelativeWarnChecker, output bound when the input's is 0
    cosine_error: float = 0.99             # CompareConst.COS_THRESHOLD (outputs-only ops)
    max_abs_err_error: float = 0.001       # CompareConst.MAX_ABS_ERR_THRESHOLD
    cosine_error_max: float = 0.9          # CompareConst.COS_MAX_THRESHOLD
    max_abs_err_error_max: float = 1.0     # CompareConst.MAX_ABS_ERR_MAX_THRESHOLD


def worst(results: list[str]) -> str:
    """The worst of some levels (``error`` > ``warning`` > ``pass``); ``pass`` if empty."""
    return max(results, key=_RANK.__getitem__, default=PASS)


def _num(v) -> float | None:
    """A metric as float; None for missing, non-numeric (msprobe's strings) and NaN."""
    if v is None or isinstance(v, (bool, str)):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def _inf_or_nan(v) -> bool:
    """msprobe indicator_analysis.utils.is_inf_or_nan (also for ints and numpy floats)."""
    if isinstance(v, str):
        return v.strip().lower() in ("inf", "-inf", "nan")
    if v is None or isinstance(v, bool):
        return False
    try:
        return not math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


def _pair(row: dict, name: str):
    """(target, bench) of a per-side attribute: target_X/bench_X, else X as a pair."""
    if f"target_{name}" in row or f"bench_{name}" in row:
        return row.get(f"target_{name}"), row.get(f"bench_{name}")
    v = row.get(name)
    if isinstance(v, (tuple, list)) and len(v) == 2:
        return v[0], v[1]
    return None, None


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.6g}"


@dataclass(kw_only=True, eq=False, repr=False)
class Columns:
    """The columns :func:`op_results_columns` reads, one entry per result row (numpy; the
    engine's result columns): ``group`` (int64 op code: rows of one op share it),
    ``output`` (bool: ``io == 'output'``), ``statistics`` (bool: the row's mode),
    ``target_name``/``bench_name``/``target_dtype``/``bench_dtype``/``err_message``
    (object arrays, None for NULL; the names and dtypes may also be Arrow string arrays),
    ``values``/``valid`` (float64 values and validity of
    ``cosine``, ``one_thousandth_err_ratio``, ``max_abs_err``, ``l2norm_rel_diff``,
    ``target_max``, ``target_min``, ``bench_max``, ``bench_min``, ``target_requires_grad``,
    ``bench_requires_grad`` (1.0 / 0.0)), ``target_shape``/``bench_shape``
    (:class:`dumpdb.compare.columns.Shapes`). Optional (None: their checkers do not run; the
    msprobe CSV, :mod:`dumpdb.render.msprobe_rows`): ``parameter``/``parameter_differs``
    (bool), ``md5_target``/``md5_bench`` (object), ``rel_row`` (float64)."""

    group: np.ndarray
    output: np.ndarray
    statistics: np.ndarray
    target_name: np.ndarray | pa.Array
    bench_name: np.ndarray | pa.Array
    target_dtype: np.ndarray | pa.Array
    bench_dtype: np.ndarray | pa.Array
    err_message: np.ndarray
    values: dict[str, np.ndarray]
    valid: dict[str, np.ndarray]
    target_shape: Shapes
    bench_shape: Shapes
    parameter: np.ndarray | None = None
    parameter_differs: np.ndarray | None = None
    md5_target: np.ndarray | None = None
    md5_bench: np.ndarray | None = None
    rel_row: np.ndarray | None = None


def _texts(*columns) -> list[pa.Array] | None:
    """Object arrays of str/None (or Arrow string arrays, kept) as Arrow strings; None
    when one holds anything else."""
    try:
        return [col if isinstance(col, pa.Array) else pa.array(col, pa.string()) for col in columns]
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return None


def _objects(col) -> np.ndarray | list:
    """A text column as Python objects (an Arrow array as its list)."""
    return col.to_pylist() if isinstance(col, pa.Array) else col


def _at(col, rows: np.ndarray) -> list:
    """Rows ``rows`` of a text column (object array or Arrow array) as Python objects."""
    if isinstance(col, pa.Array):
        return col.take(pa.array(rows, pa.int64())).to_pylist()
    return [col[i] for i in rows.tolist()]


def _mask(values) -> np.ndarray:
    """An Arrow boolean result as numpy, NULL -> False."""
    return pc.fill_null(values, False).to_numpy(zero_copy_only=False)


def _name_class(name) -> int:
    """0 (check all), 1 (ignore the op), 2 (outputs' per-row checks only): :func:`_ignore`."""
    if not isinstance(name, str):
        return 0
    parts = name.split(".")
    if len(parts) < 2:
        return 0
    return 1 if parts[1] in ALL_IGNORE else 2 if parts[1] in INPUT_IGNORE else 0


def op_results_columns(c: Columns, thresholds: Thresholds = Thresholds()) -> tuple[np.ndarray, np.ndarray]:
    """The verdict of every row of every op at once, over columns (:class:`Columns`): each
    op's mode is ``statistics`` when all its rows are, else ``tensor`` (as the engine
    judges). Returns (result, reason): object arrays per row, result ``'pass'``,
    ``'warning'`` or ``'error'``, reason None or the "; "-joined reasons of the checkers
    that fired on the row (the checkers in msprobe's order; Python only for the rows a
    checker flags, to write their reasons)."""
    n = len(c.group)
    if n == 0:
        return np.zeros(0, object), np.zeros(0, object)
    levels, fired = _checks(c, thresholds)
    names = np.array([PASS, WARNING, ERROR], dtype=object)
    reasons: dict[int, list[str]] = {}
    for _, rows, level, why in fired:
        label = names[level]
        for k, i in enumerate(rows.tolist()):
            reasons.setdefault(i, []).append(f"{label}: {why if isinstance(why, str) else why[k]}")
    reason = np.full(n, None, dtype=object)
    for i, texts in reasons.items():
        reason[i] = "; ".join(texts)
    return names[levels], reason


# msprobe 26.2's Err_message text of each checker (indicator_analysis/algorithm.py), as its
# compare CSV writes them (dumpdb.render.msprobe_rows)
MSPROBE_MESSAGES = {
    "inf_nan": "error: There is nan/inf/-inf in the maximum or minimum value of NPU.",
    "one_thousandth": "error: The input/parameters of One Thousandth Err Ratio > 0.9 while the output < 0.6.",
    "relative_err": "error: The NormRelativeErr of output is greater than 0.5.",
    "requires_grad": "error: The Required_Grad of NPU and Bench are inconsistent",
    "parameters": "error: The scalar parameters of NPU and Bench are inconsistent.",
    "dtype": "error: The dtype of NPU and Bench are inconsistent.",
    "shape": "error: The shape of NPU and Bench are inconsistent.",
    "cosine_warn": "warning: The input/parameters of Cosine > 0.9, and input/parameters - output > 0.1",
    "relative_warn": "warning: The norm relative error of output is 10 times that of input.",
    "md5_missing": "warning: The parameter of NPU does not match the bench.",
    "md5_differs": "error: The CRC-32 value of NPU differs from that of the bench.",
}


def msprobe_results(c: Columns, thresholds: Thresholds = Thresholds()) -> tuple[list[str], list[list[str]]]:
    """The verdicts of :func:`op_results_columns` with msprobe's texts: per row its result
    and the list of msprobe's messages of the checkers that fired on it
    (:data:`MSPROBE_MESSAGES`, in checker order). msprobe's CSV judges API records, so
    the MindSpore outputs-only rule is off (thresholds as the module docstring says)."""
    th = replace(thresholds, cosine_error=-2.0, cosine_error_max=-2.0, max_abs_err_error=math.inf,
                 max_abs_err_error_max=math.inf)
    n = len(c.group)
    msgs: list[list[str]] = [[] for _ in range(n)]
    if n == 0:
        return [], msgs
    levels, fired = _checks(c, th)
    for checker, rows, _, _ in fired:
        for i in rows.tolist():
            msgs[i].append(MSPROBE_MESSAGES[checker])
    return np.array([PASS, WARNING, ERROR], dtype=object)[levels].tolist(), msgs


def _checks(c: Columns, th: Thresholds) -> tuple[np.ndarray, list[tuple[str, np.ndarray, int, list[str] | str]]]:
    """The checkers over columns: (level per row, 0 pass / 1 warning / 2 error; and what
    fired: (checker, rows, level, reason or one reason per row), in checker order)."""
    g = c.group
    n = len(g)
    groups = int(g.max()) + 1
    out = c.output
    has_in = np.bincount(g[~out], minlength=groups) > 0
    has_out = np.bincount(g[out], minlength=groups) > 0
    stats_group = np.bincount(g[~c.statistics], minlength=groups) == 0
    first_out = np.full(groups, -1, np.int64)
    out_rows = np.flatnonzero(out)
    at, _ = unique_keys(g[out_rows])  # each op's first output row
    first_out[g[out_rows[at]]] = out_rows[at]
    # msprobe's ignore lists by the op's name (the first input's; one name per op here)
    names = _texts(c.target_name)
    if names is not None:  # the second dot-separated field, as _ignore reads it
        # first one scan for the names whose second field is an ignored op's (few, most
        # often none: extracting every row's field was the verdicts' costliest kernel)
        name_class = np.zeros(n, np.int8)
        at = np.flatnonzero(_mask(pc.match_substring_regex(names[0], _IGNORED)))
        if at.size:
            field = pc.struct_field(pc.extract_regex(names[0].take(pa.array(at)), r"^[^.]*\.(?P<f>[^.]*)"), [0])
            name_class[at] = np.where(_mask(pc.is_in(field, pa.array(sorted(ALL_IGNORE)))), 1,
                                      np.where(_mask(pc.is_in(field, pa.array(sorted(INPUT_IGNORE)))), 2, 0))
    else:
        cache: dict = {}
        for x in _objects(c.target_name):
            if x not in cache:
                cache[x] = _name_class(x)
        name_class = np.fromiter(map(cache.__getitem__, _objects(c.target_name)), np.int8, n)
    ignore = np.zeros(groups, np.int8)
    ignore[g[~out]] = name_class[~out]
    ignore[~has_in] = 0
    row_ignore = ignore[g]
    per_row = (row_ignore == 0) | ((row_ignore == 2) & out)
    whole = ignore == 0
    levels = np.zeros(n, np.int8)
    fired: list[tuple[str, np.ndarray, int, list[str] | str]] = []
    checker = ""

    def flag(rows: np.ndarray, level: int, reasons) -> None:
        if rows.size:
            levels[rows] = np.maximum(levels[rows], level)
            fired.append((checker, rows, level, reasons))

    tm, bm = c.md5_target, c.md5_bench
    if tm is not None and bm is not None:  # msprobe's md5 mode: the CRC-32 checker alone
        missing = ("N/A", "Nan", "")
        for i in np.flatnonzero(per_row).tolist():
            if tm[i] != bm[i]:
                checker = "md5_missing" if tm[i] in missing or bm[i] in missing else "md5_differs"
                flag(np.array([i]), 1 if checker == "md5_missing" else 2,
                     "target and bench md5 differ" if checker == "md5_differs" else "no md5 to compare")
        return levels, fired

    def num(name: str) -> tuple[np.ndarray, np.ndarray]:
        v = c.values[name]
        return v, c.valid[name] & ~np.isnan(v)

    def extreme(name: str, rows: np.ndarray, smallest: bool) -> np.ndarray:
        v, ok = num(name)
        acc = np.full(groups, 1.0 if smallest else 0.0)
        sel = rows & ok
        (np.minimum if smallest else np.maximum).at(acc, g[sel], v[sel])
        # Python's min/max keep the first of equal values: the sign of a zero result is the
        # first zero's (min) or the start value's +0.0 (max)
        zero = np.flatnonzero(acc == 0)
        if zero.size:
            if smallest:
                rows_ = np.flatnonzero(sel & (v == 0) & (acc[g] == 0))
                ug, first = np.unique(g[rows_], return_index=True)
                acc[ug] = v[rows_[first]]
            else:
                acc[zero] = 0.0
        return acc

    def bad(name: str) -> np.ndarray:
        return c.valid[name] & ~np.isfinite(c.values[name])

    tensor_group = ~stats_group
    checker = "inf_nan"  # InfNanErrChecker
    flag(np.flatnonzero(per_row & ~(bad("bench_max") | bad("bench_min")) & (bad("target_max") | bad("target_min"))),
         2, "target max/min is nan or inf while bench's are finite")
    checker = "one_thousandth"  # OneThousandthErrChecker (tensor)
    min_in = extreme("one_thousandth_err_ratio", ~out, True)
    min_out = extreme("one_thousandth_err_ratio", out, True)
    hit = np.flatnonzero(tensor_group & whole & has_out & (min_in > th.one_thousandth_input)
                         & (min_out < th.one_thousandth_output))
    flag(first_out[hit], 2, [f"One Thousandth Err Ratio is {float(min_out[k]):.6g} on the outputs while above "
                             f"{th.one_thousandth_input:g} on the inputs (output limit {th.one_thousandth_output:g})"
                             for k in hit.tolist()])
    checker = "relative_err"  # RelativeErrChecker (statistics)
    rel_max_in = np.abs(extreme("l2norm_rel_diff", ~out, False))
    rel = c.rel_row  # msprobe's CSV reads its cells twice: see msprobe_rows
    if rel is None:
        rel_v, rel_ok = num("l2norm_rel_diff")
        rel = np.where(rel_ok, rel_v, 0.0)
    with np.errstate(invalid="ignore"):
        rows = np.flatnonzero(out & stats_group[g] & whole[g] & (rel_max_in[g] < th.rel_err_input)
                              & (np.abs(rel) > th.rel_err_output))
    flag(rows, 2, [f"output L2-norm relative diff {float(rel[i]):.6g} > {th.rel_err_output:g} "
                   f"while the inputs' stay below {th.rel_err_input:g}" for i in rows.tolist()])
    checker = "requires_grad"  # RequiresGradErrChecker
    tg, bg = c.values["target_requires_grad"], c.values["bench_requires_grad"]
    rows = np.flatnonzero(per_row & c.valid["target_requires_grad"] & c.valid["bench_requires_grad"] & (tg != bg))
    flag(rows, 2, [f"requires_grad differs (target {bool(tg[i])}, bench {bool(bg[i])})" for i in rows.tolist()])
    parameter, parameter_differs = c.parameter, c.parameter_differs
    if parameter is not None and parameter_differs is not None:  # ParametersErrChecker: a scalar argument differs
        checker = "parameters"
        rows = np.flatnonzero(whole[g] & ~out & parameter & parameter_differs)
        flag(rows, 2, "scalar argument differs")
    checker = "dtype"  # DTypeErrChecker
    td, bd = c.target_dtype, c.bench_dtype
    texts = _texts(c.bench_name, td, bd)
    if texts is not None:  # all strings or None: Arrow kernels
        bench_name, tda, bda = texts
        fused = _mask(pc.match_substring_regex(bench_name, _FUSED))
        known = _mask(pc.and_(pc.not_equal(tda, ""), pc.not_equal(bda, "")))
        differ = per_row & ~fused & known & _mask(pc.not_equal(tda, bda))
    else:
        fused = np.fromiter((isinstance(x, str) and ("qkv" in x or "gate_up" in x) for x in _objects(c.bench_name)),
                            bool, n)
        td, bd = _objects(td), _objects(bd)
        known = np.fromiter((bool(x) and bool(y) for x, y in zip(td, bd)), bool, n)
        differ = np.zeros(n, bool)
        sel = np.flatnonzero(per_row & ~fused & known)
        differ[sel] = np.fromiter((str(td[i]) != str(bd[i]) for i in sel.tolist()), bool, sel.size)
    rows = np.flatnonzero(differ)
    flag(rows, 2, [f"dtypes differ (target {t}, bench {b})" for t, b in zip(_at(td, rows), _at(bd, rows))])
    checker = "shape"  # ShapeErrChecker
    ts, bs = c.target_shape, c.bench_shape
    rows = np.flatnonzero(per_row & ts.valid & bs.valid & ~ts.equal(bs))
    flag(rows, 2, [f"shapes differ (target {ts.text(i)}, bench {bs.text(i)})" for i in rows.tolist()])
    checker = "cosine_warn"  # CosineWarnChecker (tensor)
    cos_in = extreme("cosine", ~out, True)
    cos_out = extreme("cosine", out, True)
    with np.errstate(invalid="ignore"):
        drop = cos_in - cos_out
    hit = np.flatnonzero(tensor_group & whole & has_out & (cos_in > th.cosine_warn_input)
                         & (drop > th.cosine_warn_drop))
    flag(first_out[hit], 1, [f"cosine drops from {float(cos_in[k]):.6g} (inputs) to {float(cos_out[k]):.6g} "
                             f"(outputs), more than {th.cosine_warn_drop:g}" for k in hit.tolist()])
    checker = "accuracy"
    _accuracy_columns(c, np.flatnonzero(out & (tensor_group & ~has_in)[g]), th, flag)
    checker = "relative_warn"  # RelativeWarnChecker (statistics)
    rel_max_out = np.abs(extreme("l2norm_rel_diff", out, False))
    cand = stats_group & whole & has_out
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = rel_max_out / np.where(rel_max_in == 0, 1.0, rel_max_in)
    zero_in = np.flatnonzero(cand & (rel_max_in == 0) & (rel_max_out > th.rel_warn_zero_input))
    ratio_hit = np.flatnonzero(cand & (rel_max_in != 0) & (ratio > th.rel_warn_ratio))
    warn = np.sort(np.concatenate([zero_in, ratio_hit]))
    flag(first_out[warn], 1, [
        f"output L2-norm relative diff {float(rel_max_out[k]):.6g} > {th.rel_warn_zero_input:g} while the inputs' is 0"
        if rel_max_in[k] == 0 else
        f"output L2-norm relative diff {float(rel_max_out[k]):.6g} is more than {th.rel_warn_ratio:g} times the "
        f"inputs' {float(rel_max_in[k]):.6g}" for k in warn.tolist()])
    return levels, fired


def _accuracy_columns(c: Columns, rows: np.ndarray, th: Thresholds, flag) -> None:
    """:func:`_outputs_only_accuracy` over the output rows ``rows`` of ops without inputs."""
    cos_v, cos_ok = c.values["cosine"][rows], c.valid["cosine"][rows] & ~np.isnan(c.values["cosine"][rows])
    mae_v, mae_ok = c.values["max_abs_err"][rows], c.valid["max_abs_err"][rows] & \
        ~np.isnan(c.values["max_abs_err"][rows])
    with np.errstate(invalid="ignore"):
        both = ((cos_v < th.cosine_error) & (mae_v > th.max_abs_err_error)) | (cos_v < th.cosine_error_max) \
            | (mae_v > th.max_abs_err_error_max)
        bad = np.where(cos_ok & mae_ok, both,
                       np.where(mae_ok, mae_v > th.max_abs_err_error_max, cos_ok & (cos_v < th.cosine_error_max)))
    none = ~cos_ok & ~mae_ok
    msgs = c.err_message[rows]
    nan_inf = np.fromiter((none[k] and isinstance(m, str) and MSG_NAN_INF_MISMATCH in m
                           for k, m in enumerate(msgs)), bool, rows.size)
    hit = np.flatnonzero((bad & ~none) | nan_inf)
    texts = []
    for k in hit.tolist():
        if none[k]:
            texts.append("accuracy not reached: nan/inf positions differ")
            continue
        cos = float(cos_v[k]) if cos_ok[k] else None
        mae = float(mae_v[k]) if mae_ok[k] else None
        texts.append(f"accuracy not reached (cosine {_fmt(cos)}, max_abs_err {_fmt(mae)}; "
                     f"rule: cosine < {th.cosine_error:g} and max_abs_err > {th.max_abs_err_error:g}, "
                     f"or cosine < {th.cosine_error_max:g}, or max_abs_err > {th.max_abs_err_error_max:g})")
    flag(rows[hit], 2, texts)
