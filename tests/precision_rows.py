"""Row-by-row wrappers of dumpdb's precision rules, for tests (issue 26: test-only row
wrappers live in tests/): :func:`judge_precision` and :func:`first_departure` take result rows
as dicts, turn them into :class:`dumpdb.compare.precision.Columns` and call the one
implementation, :func:`dumpdb.compare.precision.judge_precision_columns` /
:func:`~dumpdb.compare.precision.first_departures`. (``compare_reference.py`` is the
independent row-by-row oracle; these only adapt dumpdb's own code to rows.)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from dumpdb.compare.columns import Shapes, phases, run_order
from dumpdb.compare.precision import (
    ERROR,
    Columns,
    PrecisionRules,
    first_departures,
    judge_precision_columns,
)

NUMBERS = ("flat_euc_dist", "euc_dist", "max_abs_err", "l2norm_diff", "bench_l2norm", "target_max", "target_min",
           "bench_max", "bench_min", "target_l2norm")
TEXTS = ("target_dtype", "bench_dtype", "target_dtype_declared", "bench_dtype_declared", "err_message",
         "target_content_hash", "io", "slot")
OPTIONAL = ("target_name", "scope_name", "op_type", "arg_diff", "bench_content_hash")


def _objects(values) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def _codes(keys: list[tuple]) -> np.ndarray:
    """One code per distinct key (Python equality: None equal to None)."""
    index: dict = {}
    return np.array([index.setdefault(k, len(index)) for k in keys], np.int64)


def columns_of(rows: list[dict], producers: dict[str, list] | None = None) -> Columns:
    """:class:`Columns` of result rows (dicts); the optional columns where any row has the key."""
    n = len(rows)
    ranked = sorted(range(n), key=lambda i: run_order(rows[i]))
    run_rank = np.empty(n, np.int64)
    run_rank[ranked] = np.arange(n)
    values = {k: np.array([np.nan if r.get(k) is None else float(r[k]) for r in rows], np.float64) for k in NUMBERS}
    valid = {k: np.array([r.get(k) is not None for r in rows], bool) for k in NUMBERS}
    found = producers or {}
    optional = {k: _objects([r.get(k) for r in rows]) for k in OPTIONAL if any(k in r for r in rows)}
    return Columns(
        group=_codes([(r["iteration"], r["rank"], r["graph_id"], r["call_index"], r["target_name"]) for r in rows]),
        where=_codes([(r["iteration"], r["rank"]) for r in rows]), run_rank=run_rank,
        output=np.array([r.get("io") == "output" for r in rows], bool),
        statistics=np.array([r.get("mode") != "tensor" for r in rows], bool),
        order=np.array([np.iinfo(np.int64).max if r.get("_order") is None else r["_order"] for r in rows], np.int64),
        values=values, valid=valid, **{k: _objects([r.get(k) for r in rows]) for k in TEXTS},
        **{k: Shapes(pa.array([None if r.get(k) is None else list(r[k]) for r in rows], pa.list_(pa.int64())))
           for k in ("target_shape", "bench_shape")},
        producers=lambda hashes: {h: found[h] for h in hashes if h in found},
        iteration=np.array([-1 if r["iteration"] is None else r["iteration"] for r in rows], np.int64),
        timestamp=np.array([np.nan if r.get("timestamp") is None else float(r["timestamp"]) for r in rows]),
        **optional)


def judge_precision(rows: list[dict], producers: dict[str, list[tuple[int, str, bool]]] | None = None,
                    rules: PrecisionRules = PrecisionRules()) -> None:
    """Add the precision columns to each result row (dicts): ``scaled_err``,
    ``precision_floor``, ``precision_ratio``, ``precision_dtype``, ``precision_result``,
    ``precision_reason`` (and ``origin_op`` where an op only the target has produced an
    input), as :func:`judge_precision_columns` computes them over these rows' columns."""
    if not rows:
        return
    out, _ = judge_precision_columns(columns_of(rows, producers), rules)
    for i, r in enumerate(rows):
        for name in ("scaled_err", "precision_floor", "precision_ratio"):
            r[name] = float(out[name][i]) if out[f"{name}_valid"][i] else None
        r.update(precision_dtype=out["precision_dtype"][i], precision_result=out["precision_result"][i],
                 precision_reason=out["precision_reason"][i].as_py())
        if out["origin_op"][i] is not None:
            r["origin_op"] = out["origin_op"][i]


def first_departure(rows: list[dict]) -> dict[str, Any] | None:
    """:func:`first_departures` of rows judged by :func:`judge_precision`, with ``row`` the
    reported row itself (a dict), ``ranks`` the reported rows' ``pair_index`` list and
    ``phases`` {phase: ``pair_index``}."""
    if not any(r.get("precision_result") == ERROR for r in rows):
        return None
    c = columns_of(rows)
    out: dict[str, np.ndarray] = {k: _objects([r.get(k) for r in rows])
                                  for k in ("precision_result", "precision_reason", "origin_op")}
    for name in ("scaled_err", "precision_floor", "precision_ratio"):
        out[name] = np.array([np.nan if r.get(name) is None else float(r[name]) for r in rows], np.float64)
        out[f"{name}_valid"] = np.array([r.get(name) is not None for r in rows], bool)
    out["phase"] = phases(_objects([r.get("target_name") for r in rows]),
                          _objects([r.get("scope_name") for r in rows]), c.where, c.run_rank)
    found = first_departures(c, out)
    assert found is not None
    row = rows[found["row"]["pair_index"]]
    return {**found, "row": row, "origin_op": row.get("origin_op"),
            "ranks": [rows[d["pair_index"]]["pair_index"] for d in found["ranks"]],
            "phases": {p: rows[d["pair_index"]]["pair_index"] for p, d in found["phases"].items()}}
