"""Statistics-mode compare metrics as one DuckDB query over the catalog's statistics.

:func:`statistics_metrics` computes :data:`~dumpdb.compare.metrics.STAT_METRICS` and the
magnitude message for every statistics-mode pair at once: the pairs (an Arrow table of
``pair_index``, ``target_tensor_id``, ``bench_tensor_id``) joined to the two sides'
``tensors`` rows (``max``, ``min``, ``mean``, ``l2norm``: the columns the engine selected
from the catalog), each difference a column expression. No Python per pair.

The rules are generated from :data:`dumpdb.compare.stats_spec.CASES`, the one table that
:func:`dumpdb.compare.metrics.stats_metrics` also follows (msprobe's ``calc_summary_diff`` /
``get_rela_diff_summary_mode``; DuckDB's floating-point differences from Python, NaN = NaN
true, NaN above every number, are in that module's condition forms). DuckDB 1.x+ doubles
follow IEEE 754 otherwise (``1e308 * 10`` is ``inf``, not an error). ``tests/test_compare_stats_sql.py``
checks the query against ``stats_metrics`` pair by pair on the corpus statistics dumps and
on synthetic statistics with NaN, +-Inf, zeros, -0.0 and missing values.
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb
import pyarrow as pa

from dumpdb.compare.metrics import MSG_STATS_MAGNITUDE, STAT_METRICS, STATS
from dumpdb.compare.stats_spec import sql_stat

__all__ = ["statistics_metrics", "statistics_sql", "STATISTICS_SQL"]


def _stat_sql(name: str) -> str:
    """Columns ``{name}_diff``, ``{name}_rel_diff`` and flag ``{name}_flag`` of one statistic
    (generated from dumpdb.compare.stats_spec.CASES, the rules stats_metrics also follows)."""
    return "\n    " + sql_stat(name, f"t.{name}", f"b.{name}")


_PREFIX, _SUFFIX = MSG_STATS_MAGNITUDE.split("{names}")

def statistics_sql(source: str, keep: Sequence[tuple[str, str]] = (("p.pair_index", "pair_index"),),
                   order_by: str | None = "pair_index") -> str:
    """The query computing the :data:`STAT_METRICS` columns and ``err_message`` of each pair
    of ``source`` (a FROM clause in which aliases ``t`` and ``b`` are the target's and the
    bench's rows of a pair, with ``max``, ``min``, ``mean``, ``l2norm``), carrying the
    ``keep`` select items through (``(expression, output name)``, in that order, before the
    metrics), ordered by ``order_by`` (an expression over the output names; None: no ORDER BY,
    the caller checks the order it needs)."""
    carried = ", ".join(f'{expr} AS "{name}"' for expr, name in keep)
    names = ", ".join(f'"{name}"' for _, name in keep)
    flags = " OR ".join(f"{s}_flag" for s in STATS)
    which = ", ".join(f"CASE WHEN {s}_flag THEN '{s}' END" for s in STATS)
    return f"""
WITH d AS (
  SELECT {carried}, {", ".join(_stat_sql(s) for s in STATS)}
  FROM {source}
)
SELECT {names}, {", ".join(STAT_METRICS)},
       CASE WHEN {flags} THEN '{_PREFIX}' || concat_ws(', ', {which}) || '{_SUFFIX}' END AS err_message
FROM d{f" ORDER BY {order_by}" if order_by is not None else ""}
"""


# Over relations ``pairs`` (pair_index, target_tensor_id, bench_tensor_id), ``target`` and
# ``bench`` (tensor_id plus the four statistics).
STATISTICS_SQL = statistics_sql("pairs p JOIN target t ON t.tensor_id = p.target_tensor_id "
                                "JOIN bench b ON b.tensor_id = p.bench_tensor_id")


def statistics_metrics(pairs: pa.Table, target: pa.Table, bench: pa.Table) -> pa.Table:
    """Statistics-mode metrics of many pairs in one DuckDB query (module docstring).

    ``pairs``: ``pair_index`` (int64, unique), ``target_tensor_id``, ``bench_tensor_id``;
    ``target``/``bench``: catalog ``tensors`` rows with ``tensor_id`` and ``max``, ``min``,
    ``mean``, ``l2norm`` (float64, NULL where the dump gave none). Every pair's ids must be
    in ``target``/``bench``.

    Returns an Arrow table ordered by ``pair_index``: ``pair_index``, the eight
    :data:`STAT_METRICS` columns (float64, NULL where ``stats_metrics`` gives None) and
    ``err_message`` (string, NULL or msprobe's "double-check" note), equal value for value
    to :func:`dumpdb.compare.metrics.stats_metrics` on each pair. Raises ValueError when a
    pair names a tensor that is not in ``target``/``bench``.
    """
    cols = ["tensor_id", *STATS]
    con = duckdb.connect()
    try:
        con.register("pairs", pairs.select(["pair_index", "target_tensor_id", "bench_tensor_id"]))
        con.register("target", target.select(cols))
        con.register("bench", bench.select(cols))
        out = con.sql(STATISTICS_SQL).to_arrow_table()
    finally:
        con.close()
    if out.num_rows != pairs.num_rows:
        raise ValueError(f"statistics_metrics: {pairs.num_rows - out.num_rows} pair(s) name a tensor_id "
                         "missing from target/bench")
    return out
