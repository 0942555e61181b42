"""Statistics-mode pairs inside DuckDB (issue 13): alignment, both sides' rows and the
statistics metrics of every pair in one DuckDB connection, no Arrow round trip per step.

:func:`statistics_pairs` is what the engine's separate steps give for a comparison whose
pairs are all compared by their statistics (``--mode statistics``, or a side without any
payload) and aligned by ``exact`` alone: each side's rows in ``tensor_id`` order (as
:func:`~dumpdb.compare.engine.select_rows` gives them), :func:`~dumpdb.compare.align_sql.exact_paired`
pairs them (row i with row i when the two sides hold the same keys in the same execution
order, else the same query as :func:`~dumpdb.compare.align_sql.align_exact`), each pair's
two rows are found by position (``tensor_id`` is unique on a side), put in the target's
execution order (:func:`~dumpdb.compare.columns.execution_order` over the paired target
rows' keys, the engine's one rule) and taken once (no copy when they are the rows in
place): one query over them side by side computes the alignment's content check
(``exact_paired``'s ``sides``: the pairing carries the two ids only) and the metrics
(``exact_paired``'s ``measure``; :func:`~dumpdb.compare.stats_sql.statistics_sql`, the
rules of :func:`dumpdb.compare.metrics.stats_metrics`), returning the columns the engine
reads in that order. ``tests/test_compare_stats_sql.py`` and ``tests/test_compare_columns.py``
check the engine's result tables through this path against the step-by-step path and the
per-pair rules.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from concurrent.futures import ThreadPoolExecutor

import duckdb
import numpy as np
import pyarrow as pa

from dumpdb.compare.align import PAIRS_SCHEMA, Alignment
from dumpdb.compare.align_sql import CHECK_COLUMNS, READ_COLUMNS, exact_paired
from dumpdb.compare.columns import ORDER_KEYS, execution_order, row_positions
from dumpdb.compare.metrics import STAT_METRICS
from dumpdb.compare.stats_sql import statistics_sql

__all__ = ["statistics_pairs", "ORDER_KEYS"]



def statistics_pairs(target: pa.Table, bench: pa.Table, *, group_by: Sequence[str] = (),
                     strategies: Sequence[str] = ("exact",), target_columns: Collection[str] = (),
                     bench_columns: Collection[str] = ()) -> tuple[Alignment, pa.Table, pa.Table, pa.Table] | None:
    """Pairs of ``target``/``bench`` (catalog ``tensors`` rows as the engine selects them)
    by the ``exact`` strategy, with each pair's rows and statistics metrics (module
    docstring); None when :func:`~dumpdb.compare.align_sql.align_exact` gives None (a
    later strategy could pair what exact leaves, or a column align reads is missing).

    Returns (alignment, t, b, metrics), all in the target's execution order, one row per
    pair: the :class:`~dumpdb.compare.align.Alignment` (its pairs in that order), ``t`` and
    ``b`` (the ``target_columns`` / ``bench_columns`` the sides have, as selected: types
    unchanged), ``metrics`` (the eight :data:`~dumpdb.compare.metrics.STAT_METRICS`
    float64 columns, NULL where ``stats_metrics`` gives None, and ``err_message``, NULL or
    msprobe's "double-check" note). Raises ValueError for a ``group_by`` column missing
    from a side.
    """
    tcols = [c for c in dict.fromkeys(target_columns) if c in target.column_names]
    bcols = [c for c in dict.fromkeys(bench_columns) if c in bench.column_names]
    if any(c not in target.column_names for c in ORDER_KEYS):
        return None
    stats = [c for c in ("max", "min", "mean", "l2norm") if c in target.column_names and c in bench.column_names]
    checked = [c for c in _CHECK_COLUMNS if c in target.column_names and c in bench.column_names]
    if len(stats) < 4:
        return None
    # each side's rows in tensor_id order (a run's ingest order, usually its execution order),
    # one chunk a column: as engine.select_rows gives them (no copy), else copied once; the
    # pairs are then usually the rows in place: the pairing (align_sql._positional_pairs),
    # the orders and the rows taken need no sort or copy
    target, bench = (_by_id(table.select([c for c in dict.fromkeys((*cols, *checked, *stats, *ORDER_KEYS, *group_by,
                                                                    *READ_COLUMNS)) if c in table.column_names]))
                     for table, cols in ((target, tcols), (bench, bcols)))
    taken: list[pa.Table] = []
    helper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dumpdb-compare-order")
    # the execution order of every target row, sorted while DuckDB pairs them (numpy and
    # Arrow: off the GIL); the pairs' order when every target row is paired (_pairs_order).
    # A bench side with fewer rows cannot pair them all: not sorted then
    everything = helper.submit(execution_order, target.select(list(ORDER_KEYS))) \
        if target.num_rows <= bench.num_rows else None

    def sides(paired: pa.Table) -> tuple[pa.Table, pa.Table]:
        # each pair's two rows by position (tensor_id is unique on each side), put in the
        # target's execution order (execution_order sorts in full: tensor_id, its last key,
        # is unique, so the order the pairs come in does not matter); the rows taken once,
        # for the content check (exact_paired's sides), the metrics and the engine
        at = [row_positions(table.column("tensor_id"), paired.column(f"{side}_tensor_id"))
              for side, table in (("target", target), ("bench", bench))]
        order = _pairs_order(at[0], everything.result() if everything is not None else None)
        if order is None:
            order = execution_order(_take(target.select(list(ORDER_KEYS)), at[0]))
        # the bench side's rows in a second thread while this one takes the target's: Arrow
        # copies them without the GIL (each side's own table, rows and columns: no shared write)
        bench_rows = helper.submit(_take, bench.select(list(dict.fromkeys((*bcols, *checked, *stats)))),
                                   at[1][order])
        target_rows = _take(target.select(list(dict.fromkeys((*tcols, *checked, *stats)))), at[0][order])
        taken[:] = [target_rows, bench_rows.result()]
        return taken[0], taken[1]

    # the metrics computed in the content check's one pass over the pairs' rows, side by side
    # (exact_paired's measure), no ORDER BY (a sort of every row: DuckDB keeps a scan's row
    # order; checked below, sorted only if not)
    measured: list[pa.Table] = []
    con = duckdb.connect()
    try:
        left = exact_paired(con, target, bench, group_by=group_by, strategies=strategies, keep=stats, sides=sides,
                            measure=(lambda source, keep: statistics_sql(source, keep, None), measured.append))
        if left is None:
            return None
        if not taken:  # a side without what the content check reads: exact_paired did not ask
            sides(con.sql("SELECT target_tensor_id, bench_tensor_id FROM paired").to_arrow_table())
        n = taken[0].num_rows
        if not measured:
            # the two sides' statistics side by side, row k of each the k-th pair (a positional
            # join: no join by id in DuckDB)
            for name, table in (("t_stats", taken[0]), ("b_stats", taken[1])):
                con.register(name, table.select(stats).add_column(0, "pair_index",
                                                                  pa.array(np.arange(n, dtype=np.int64))))
            measured.append(con.sql(statistics_sql("t_stats t POSITIONAL JOIN b_stats b",
                                                   [("t.pair_index", "pair_index")], None)).to_arrow_table())
        out = measured.pop()
    finally:
        con.close()
        helper.shutdown(cancel_futures=True)
    t, b = taken[0].select(tcols), taken[1].select(bcols)
    del taken[:]
    at = out.column("pair_index").to_numpy()
    if not np.array_equal(at, np.arange(n, dtype=np.int64)):
        out = out.take(pa.array(np.argsort(at, kind="stable")))
    metrics = out.select([*STAT_METRICS, "err_message"])
    pairs = pa.table({"target_tensor_id": t.column("tensor_id"), "bench_tensor_id": b.column("tensor_id"),
                      "match_strategy": pa.repeat(pa.scalar("exact"), n),
                      "realigned": pa.repeat(pa.scalar(False), n)}).cast(PAIRS_SCHEMA)
    return Alignment(pairs, *left), t, b, metrics


def _pairs_order(rows: np.ndarray, everything: np.ndarray | None) -> np.ndarray | None:
    """The permutation putting the pairs in their target rows' execution order, from
    ``everything`` (:func:`~dumpdb.compare.columns.execution_order` of all the target
    rows) when the pairs' target rows ``rows`` (int64, one per pair) are every target row
    once: then the paired rows are the rows ``everything`` sorted, whose keys (a graph's
    start is its rows' first timestamp) are theirs, and the order is the one
    ``execution_order`` of the paired rows gives (a total order: tensor_id, its last key,
    is unique). None otherwise (some row unpaired, or ``everything`` not given)."""
    if everything is None or rows.size != everything.size:
        return None
    pair_of = np.full(rows.size, -1, np.int64)  # the pair holding each target row
    pair_of[rows] = np.arange(rows.size, dtype=np.int64)
    if int(pair_of.min(initial=0)) < 0:  # a row in no pair (another in two): not every row once
        return None
    return pair_of[everything]


def _by_id(table: pa.Table) -> pa.Table:
    """``table`` with its rows in ``tensor_id`` order (int64, unique, no NULL), one chunk a
    column: as it is when it already is so; else one copy (:func:`_take` of the rows a
    stable sort of the ids gives: a few runs of consecutive rows, as a parallel DuckDB
    query returns them, go as slices)."""
    if "tensor_id" not in table.column_names:  # not a side exact_paired pairs: it declines
        return table
    ids = table.column("tensor_id").to_numpy()
    if ids.size > 1 and not bool((ids[1:] > ids[:-1]).all()):
        return _take(table, np.argsort(ids, kind="stable"))
    return table if all(c.num_chunks <= 1 for c in table.columns) else table.combine_chunks()


def _take(table: pa.Table, rows: np.ndarray) -> pa.Table:
    """``table.take(rows)`` (``rows``: int64 row numbers), one chunk per column. When
    ``rows`` are at most :data:`_RUNS` runs of consecutive rows covering nine tenths of the
    table or more (the pairs nearly in the side's row order, every row paired: the usual
    run-to-run case), slices of ``table`` concatenated into one chunk each (a copy of
    whole buffers, no gather per element: 0.1-0.5 CPU s against take's 0.8-1.1 for the
    target's 33 columns at 500,000 pairs). One chunk, as take gives: the engine reads each
    column as one array (a second copy otherwise, with the side's rows still alive)."""
    n = rows.size
    if n == table.num_rows and (n == 0 or (int(rows[0]) == 0 and bool((np.diff(rows) == 1).all()))) and \
            all(c.num_chunks == 1 for c in table.columns):
        return table  # the rows in place (_by_id): no copy
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1 if n else np.zeros(0, np.int64)
    if n == 0 or breaks.size >= _RUNS or 10 * n < 9 * table.num_rows:
        return table.take(pa.array(rows, pa.int64()))
    starts = np.concatenate(([0], breaks))
    ends = np.concatenate((breaks, [n]))
    return pa.concat_tables([table.slice(int(rows[s]), int(e - s)) for s, e in zip(starts, ends)]).combine_chunks()


# what exact_paired's content check reads of the pairs' rows (align_sql._check_sql), where both sides have it
_CHECK_COLUMNS = ("tensor_id", *CHECK_COLUMNS, "dtype")

_RUNS = 64  # _take: at most this many runs of consecutive rows go as slices
