"""Scalar arguments as evidence: the ``arg_diff`` column of a comparison (issue 26).

A dump that records an op call's non-tensor arguments lets a compare say *why* an op
departs: msprobe's dump.json keeps ``input_args`` / ``input_kwargs`` scalars (a softmax
scale 0.0625 against 0.25, a LayerNorm epsilon 0.1 against 1e-05), read from the
``msprobe_records`` table with :func:`dumpdb.layouts.msprobe.scalar_args`; a MindSpore
dump's IR text gives each node's constant scalar arguments (``F32(1e-05)``), kept in
``ops.scalar_args`` (:func:`dumpdb.layouts.mindspore_ir.scalar_args`).

:func:`arg_diff` writes the difference of two calls' scalars as a short text,
``input.4: 1e-05 -> 0.1`` (bench value first, then the target's, as a change from the
baseline), several joined by ``; `` (at most :data:`MAX_ITEMS`, then ``(+N more)``); None
when they agree. A scalar only one side records reads ``-`` on the other side. Values are
compared as dumped (``1e-05`` and ``1e-05`` agree; ``1`` and ``1.0`` do too).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["MAX_ITEMS", "arg_diff", "arg_diff_column"]

MAX_ITEMS = 3


def _same(x: Any, y: Any) -> bool:
    if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
        return True
    if isinstance(x, bool) != isinstance(y, bool):  # True == 1 in Python; not as arguments
        return False
    return bool(x == y)


def _text(v: Any) -> str:
    return "-" if v is _MISSING else json.dumps(v) if isinstance(v, (str, list, dict)) else str(v)


_MISSING = object()


def arg_diff(target: Mapping[str, Any], bench: Mapping[str, Any]) -> str | None:
    """``name: bench -> target`` for each scalar argument that differs (module docstring);
    None when every recorded scalar agrees."""
    items = []
    for name in dict.fromkeys((*bench, *target)):
        t, b = target.get(name, _MISSING), bench.get(name, _MISSING)
        if t is _MISSING or b is _MISSING or not _same(t, b):
            items.append(f"{name}: {_text(b)} -> {_text(t)}")
    if not items:
        return None
    more = len(items) - MAX_ITEMS
    return "; ".join(items[:MAX_ITEMS]) + (f" (+{more} more)" if more > 0 else "")


# a record without the text "value" has no scalar leaf (scalar_args keeps only leaves with a
# "value" key): {} without sending or parsing it (most records of a statistics dump). The
# catalog keeps that test's answer per record (has_scalar, schema 11: written at ingest by
# dumpdb.layouts.msprobe.may_hold_scalar, by this expression for older rows); a row without
# it (NULL: a part an older ingest-worker wrote; or no such column) is tested on its text here.
_TEXT_HAS_VALUE = "coalesce(contains(record, '\"value\"'), false)"


def _has_scalar_column(con) -> bool:
    """Whether ``con``'s ``msprobe_records`` has the ``has_scalar`` column (schema 11)."""
    return "has_scalar" in {d[0] for d in con.execute("SELECT * FROM msprobe_records LIMIT 0").description}


def _has_value(has_column: bool) -> str:
    """The SQL test "may hold a scalar leaf" of an ``msprobe_records`` row, where the table
    has the ``has_scalar`` column (:func:`_has_scalar_column`) or not."""
    return f"coalesce(has_scalar, {_TEXT_HAS_VALUE})" if has_column else _TEXT_HAS_VALUE


def _scalar_counts(con, runs: list[str], has_column: bool) -> tuple[int, int]:
    """(records, records that may hold a scalar leaf) of ``runs``: from ``has_scalar``
    (``has_column``: :func:`_has_scalar_column`) without reading the records' text (0.005 s
    against 0.3 s on 500,000 records), the text only of the rows where it is NULL."""
    if not has_column:
        n, hit = con.execute(f"SELECT count(*), count(*) FILTER (WHERE {_TEXT_HAS_VALUE}) FROM msprobe_records "
                             "WHERE run IN (?, ?)", runs).fetchall()[0]
        return int(n), int(hit)
    n, hit, unknown = con.execute("SELECT count(*), count(*) FILTER (WHERE has_scalar), "
                                  "count(*) FILTER (WHERE has_scalar IS NULL) FROM msprobe_records "
                                  "WHERE run IN (?, ?)", runs).fetchall()[0]
    if unknown:
        hit += con.execute(f"SELECT count(*) FILTER (WHERE {_TEXT_HAS_VALUE}) FROM msprobe_records "
                           "WHERE run IN (?, ?) AND has_scalar IS NULL", runs).fetchall()[0][0]
    return int(n), int(hit)


def _records(con, run: str, names: list[str], has_value: str, bare: bool = False) -> dict[tuple, dict[str, Any]]:
    """(rank, iteration, op_name) -> scalar arguments of ``run``'s msprobe records named in
    ``names`` that hold a scalar leaf (``has_value``: the SQL test, :func:`_has_value`;
    ``bare``: ``{}`` for each of the others instead)."""
    if bare:
        return {(rank, iteration, op_name): {} for rank, iteration, op_name in con.execute(
            f"SELECT rank, iteration, op_name FROM msprobe_records WHERE run = ? AND NOT {has_value} "
            "AND op_name IN (SELECT unnest(?))", [run, names]).fetchall()}
    rows = con.execute(f"SELECT rank, iteration, op_name, record FROM msprobe_records WHERE run = ? AND {has_value} "
                       "AND op_name IN (SELECT unnest(?))", [run, names]).fetchall()
    if not rows:
        return {}
    # imported here: importing the layouts imports every layout module, which a compare
    # whose records hold no scalar never needs
    from dumpdb.layouts.msprobe import scalar_args

    out = {}
    for rank, iteration, op_name, record in rows:
        try:
            parsed = json.loads(record) if record else None
        except ValueError:
            parsed = None
        out[(rank, iteration, op_name)] = scalar_args(parsed) if isinstance(parsed, dict) else {}
    return out


def _ir_args(con, run: str, scopes: list[str]) -> dict[tuple, dict[str, Any]]:
    """(rank, graph_id, scope_name) -> constant scalar arguments of ``run``'s IR nodes
    (``ops.scalar_args``, dumpdb.layouts.mindspore_ir.scalar_args)."""
    rows = con.execute("SELECT rank, graph_id, scope_name, scalar_args FROM ops WHERE run = ? "
                       "AND scope_name IN (SELECT unnest(?))", [run, scopes]).fetchall()
    out: dict[tuple, dict[str, Any]] = {}
    for rank, graph_id, scope, args in rows:
        if args is None:  # not recorded (a run ingested before migration 010): unknown, not "none"
            continue
        try:
            parsed = json.loads(args) if args else {}
        except ValueError:
            continue
        if isinstance(parsed, dict):
            out[(rank, graph_id, scope)] = parsed
    return out


class _PairColumns:
    """:func:`arg_diff_column`'s ``pairs`` read as lists, each converted once when first needed
    (an Arrow array's ``to_pylist`` makes 10^5 Python objects)."""

    def __init__(self, pairs: Mapping[str, Any]):
        self.pairs = pairs
        self.lists: dict[str, list] = {}

    def __getitem__(self, key: str) -> list:
        if key not in self.lists:
            value = self.pairs[key]
            self.lists[key] = value.to_pylist() if hasattr(value, "to_pylist") else list(value)
        return self.lists[key]

    def names(self, key: str) -> list:
        """The distinct non-null values of column ``key``, sorted."""
        value = self.pairs[key]
        if hasattr(value, "unique") and key not in self.lists:  # an Arrow array: distinct values in C
            return sorted(x for x in value.unique().to_pylist() if x is not None)
        return sorted({x for x in self[key] if x is not None})


def arg_diff_column(con, target_run: str, bench_run: str, pairs: Mapping[str, list]) -> np.ndarray | None:
    """``arg_diff`` of each compared pair (an object array of str/None, one per pair), or
    None when neither run records scalar arguments (the column is then NULL).

    ``con``: a catalog connection. ``pairs``: per-pair lists ``target_name``,
    ``bench_name``, ``rank``, ``iteration``, ``bench_rank``, ``bench_iteration`` (msprobe:
    the records' keys) and ``scope_name``, ``bench_scope_name``, ``graph_id``,
    ``bench_graph_id`` (MindSpore: the IR node of each side, ``ops.scalar_args``), each a
    list or an Arrow array (read only where needed: a statistics dump whose records hold no
    scalar reads the names alone). A pair whose op has no record or node on either side gets None."""
    col = _PairColumns(pairs)
    n = len(pairs["target_name"])
    out = np.full(n, None, dtype=object)
    has_column = _has_scalar_column(con)  # the catalog's schema: asked once
    records, with_scalar = _scalar_counts(con, [target_run, bench_run], has_column)
    if records and not with_scalar:
        # no record of either run holds a scalar (a statistics dump): every pair's is None,
        # without reading the pairs' names (what _records would find: nothing)
        return out
    if records:
        tnames, bnames = col.names("target_name"), col.names("bench_name")
        has_value = _has_value(has_column)
        trec, brec = _records(con, target_run, tnames, has_value), _records(con, bench_run, bnames, has_value)
        if not trec and not brec:
            # no record of either run holds a scalar (a statistics dump): every pair's is None
            # (arg_diff of two empty records, or a side without a record), nothing more to read
            return out
        # the records without scalars count as {}: against a side's recorded scalars they differ
        trec = {**_records(con, target_run, tnames, has_value, bare=True), **trec}
        brec = {**_records(con, bench_run, bnames, has_value, bare=True), **brec}
        tkeys = list(zip(col["rank"], col["iteration"], col["target_name"]))
        bkeys = list(zip(col["bench_rank"], col["bench_iteration"], col["bench_name"]))
    else:
        nodes = con.execute("SELECT count(*) FROM ops WHERE run IN (?, ?) AND scalar_args IS NOT NULL",
                            [target_run, bench_run]).fetchone()[0]
        if not nodes:
            return None
        trec = _ir_args(con, target_run, col.names("scope_name"))
        brec = _ir_args(con, bench_run, col.names("bench_scope_name"))
        tkeys = list(zip(col["rank"], col["graph_id"], col["scope_name"]))
        bkeys = list(zip(col["bench_rank"], col["bench_graph_id"], col["bench_scope_name"]))
    cache: dict[tuple, str | None] = {}
    for i, key in enumerate(zip(tkeys, bkeys)):
        if key not in cache:
            t, b = trec.get(key[0]), brec.get(key[1])
            cache[key] = None if t is None or b is None else arg_diff(t, b)
        out[i] = cache[key]
    return out
