"""Row-by-row wrapper of dumpdb's msprobe verdict rules, for tests (issue 26: test-only row
wrappers live in tests/): :func:`op_results` takes the compared tensors of one op as dicts,
turns them into :class:`dumpdb.compare.verdict.Columns` and calls the one implementation,
:func:`dumpdb.compare.verdict.op_results_columns`. (``compare_reference.py`` is the
independent row-by-row oracle; this only adapts dumpdb's own code to rows.)
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

from dumpdb.compare.columns import Shapes
from dumpdb.compare.verdict import MODES, Columns, Thresholds, _inf_or_nan, _num, _pair, op_results_columns

__all__ = ["op_results"]

_NUMBERS = ("cosine", "one_thousandth_err_ratio", "max_abs_err", "l2norm_rel_diff", "target_max", "target_min",
            "bench_max", "bench_min", "target_requires_grad", "bench_requires_grad")


def _number(v) -> float:
    """A row's metric as float64 for :class:`Columns` (NaN where not a number: None, bool,
    strings other than msprobe's inf/nan)."""
    if v is None or isinstance(v, bool):
        return math.nan
    if isinstance(v, str):
        return float(v.strip().lower()) if v.strip().lower() in ("inf", "-inf", "nan") else math.nan
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def _extremum(v) -> tuple[float, bool]:
    """A max/min as (value, valid): msprobe's inf/nan strings count (as ``is_inf_or_nan`` reads them)."""
    if isinstance(v, str) or (v is not None and not isinstance(v, bool)):
        x = _number(v)
        return x, not math.isnan(x) or _inf_or_nan(v)
    return math.nan, False


def _shape_list(s) -> list[int] | None:
    """A shape as a list of ints: lists/tuples, or text such as ``[2, 3]``; None if unknown."""
    if s is None:
        return None
    if isinstance(s, (list, tuple)):
        return [int(d) for d in s]
    text = str(s).replace(" ", "").strip("[]()")
    return [int(d) for d in text.split(",") if d] if text else []


def op_results(rows: list[dict], thresholds: Thresholds = Thresholds(),
               mode: str = "tensor") -> list[tuple[str, str | None]]:
    """Verdict of each row of one op (rows: the compared tensors of one target op).

    ``mode`` is ``'tensor'`` or ``'statistics'`` (which checkers run; module docstring).
    Returns, in row order, ``(result, reason)`` with result ``'pass'``, ``'warning'`` or
    ``'error'`` and reason None or the "; "-joined reasons of the checkers that fired on
    the row. Raises ValueError for an unknown mode.

    The rows' values become :class:`~dumpdb.compare.verdict.Columns` of one op and
    :func:`~dumpdb.compare.verdict.op_results_columns` judges them: the rules live there only.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    n = len(rows)
    if n == 0:
        return []
    values = {k: np.full(n, np.nan) for k in _NUMBERS}
    valid = {k: np.zeros(n, bool) for k in _NUMBERS}
    sides: dict[str, list] = {k: [] for k in ("target_dtype", "bench_dtype", "target_shape", "bench_shape")}
    for i, r in enumerate(rows):
        for k in ("cosine", "one_thousandth_err_ratio", "max_abs_err", "l2norm_rel_diff"):
            v = _num(r.get(k))  # None for missing, non-numeric (msprobe's strings) and NaN
            values[k][i], valid[k][i] = (math.nan, False) if v is None else (v, True)
        for k in ("target_max", "target_min", "bench_max", "bench_min"):
            values[k][i], valid[k][i] = _extremum(r.get(k))
        for name in ("requires_grad", "dtype", "shape"):
            t, b = _pair(r, name)
            if name == "requires_grad":
                for side, v in (("target", t), ("bench", b)):
                    if v is not None:
                        values[f"{side}_requires_grad"][i], valid[f"{side}_requires_grad"][i] = float(bool(v)), True
            else:
                sides[f"target_{name}"].append(t if name == "dtype" else _shape_list(t))
                sides[f"bench_{name}"].append(b if name == "dtype" else _shape_list(b))

    def objects(values) -> np.ndarray:
        out = np.empty(n, dtype=object)
        out[:] = list(values)
        return out

    columns = Columns(
        group=np.zeros(n, np.int64), output=np.array([r.get("io") == "output" for r in rows], bool),
        statistics=np.full(n, mode == "statistics"), target_name=objects(r.get("target_name") for r in rows),
        bench_name=objects(r.get("bench_name") for r in rows), target_dtype=objects(sides["target_dtype"]),
        bench_dtype=objects(sides["bench_dtype"]), err_message=objects(r.get("err_message") for r in rows),
        values=values, valid=valid, target_shape=Shapes(pa.array(sides["target_shape"], pa.list_(pa.int64()))),
        bench_shape=Shapes(pa.array(sides["bench_shape"], pa.list_(pa.int64()))))
    result, reason = op_results_columns(columns, thresholds)
    return list(zip(result.tolist(), reason.tolist()))
