"""The ``exact`` alignment strategy as one DuckDB query (issue 13: statistics-only runs
of 500,000 tensors align without a Python loop per tensor).

:func:`align_exact` gives what :func:`dumpdb.compare.align.align` gives when ``exact`` is
the first strategy and no mapping is given, **whenever exact pairing leaves nothing for a
later strategy** (no tensor is left unpaired on both sides, or ``exact`` is the only
strategy) **and align()'s content check would doubt no pair** (:func:`_doubted`: a name
family with another op count on the two sides, or a pair of other shapes, dtypes or
statistics farther apart than ``align.LOOKS_WRONG`` while another bench tensor of the
target's kind fits it within ``align.FITS``); otherwise it returns None and the caller runs
:func:`~dumpdb.compare.align.align`, whose later strategies (normalized, sequence, order)
and content check are Python. Training dumps compared run to run (same model, same dump
settings) pair entirely by ``exact``.

The rule is align.py's ``exact``: same ``(group_by columns, op_name, io, slot, slot_path,
arg_name)`` with NULL equal to NULL, plus the element count for a name ending in a
MindSpore ``-opN`` counter (regular expression ``-op[0-9]+$`` in DuckDB's RE2, which is
Python's ``-op\\d+$`` for ASCII digits; ``\\n?`` before the end as Python's ``$`` allows);
within one key, the k-th target tensor in execution order pairs with the k-th bench
tensor, only if both sides hold the same number. Execution order is align.py's: iteration,
rank, graph_id, position, timestamp, tensor_id, NULLs last. Pairs come in target
execution order, unmatched tensors in their side's execution order, as ``align`` returns
them. ``tests/test_compare_align_sql.py`` checks it against ``align`` on the corpus and on
synthetic runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dumpdb.compare.align import (
    FITS,
    LOOKS_WRONG,
    NEIGHBOURS,
    PAIRS_SCHEMA,
    UNMATCHED_SCHEMA,
    Alignment,
    dtype_class,
    family_column,
)
from dumpdb.compare.columns import ints, row_positions

__all__ = ["align_exact", "exact_paired", "Measure"]

# exact_paired's measure: a query over the pairs' rows from (FROM clause, carried select
# items), and what receives its output
Measure = tuple[Callable[[str, Sequence[tuple[str, str]]], str], Callable[[pa.Table], None]]

_KEY = ("op_name", "size", "io", "slot", "slot_path", "arg_name")
_ORDER = ("iteration", "rank", "graph_id", "position", "timestamp", "tensor_id")
_CHECKED = ("op_type", "dtype", "l2norm", "mean", "min", "max")
# what the content check (_check_sql) reads of both sides' rows; dtype too where both have one (_checks)
CHECK_COLUMNS = ("shape", "graph_id", "op_type", "l2norm", "mean", "min", "max")
# every statistic of both tensors finite (each on its own: a sum of finite values can overflow)
_STATS = ("l2norm", "mean", "min", "max")
_FINITE = " AND ".join(f"isfinite({c})" for c in ("tl", "bl", "tm", "bm", "tn", "bn", "tx", "bx"))
_NEEDED = ("tensor_id", "op_name", "scope_name", "shape", "io", "slot", "slot_path", "arg_name", *_ORDER)
# every column exact_paired reads of a side (beside its group_by and keep columns), where the side has it
READ_COLUMNS = (*_NEEDED, *_CHECKED)


def _keyed_sql(name: str, group_by: Sequence[str], extra: Sequence[str] = ()) -> str:
    """CTE ``{name}_o``: each row's id, key (with ``size``), execution order columns and ``extra``."""
    # contains() first: every match of the expression holds '-op', and the substring test
    # spares the regular expression the names without it (most msprobe names)
    carried = ", ".join(f'"{k}"' for k in dict.fromkeys(("tensor_id", *group_by, *_KEY, *_ORDER, *extra))
                        if k != "size")
    return f"""
    {name}_o AS (
      SELECT {carried}, CASE WHEN op_name IS NOT NULL AND shape IS NOT NULL AND contains(op_name, '-op')
                          AND regexp_matches(op_name, '-op[0-9]+\\n?$')
                     THEN coalesce(list_aggregate(shape, 'product'), 1)::BIGINT END AS size
      FROM {name})"""


def _side_sql(name: str, group_by: Sequence[str]) -> str:
    # k: the rank in execution order within the key (one partitioned window, no global
    # sort); only the key, order and id columns go through the window operators (they
    # materialise every column they carry)
    keys = [*group_by, *_KEY]
    part = ", ".join(f'"{k}"' for k in keys)
    order = ", ".join(f'"{c}" ASC NULLS LAST' for c in _ORDER)
    return f"""{_keyed_sql(name, group_by)},
    {name}_k AS (
      SELECT tensor_id, {part}, row_number() OVER (PARTITION BY {part} ORDER BY {order}) AS k,
             count(*) OVER (PARTITION BY {part}) AS n
      FROM {name}_o)"""


def _sql(group_by: Sequence[str]) -> str:
    on = " AND ".join(f't."{k}" IS NOT DISTINCT FROM b."{k}"' for k in (*group_by, *_KEY))
    return f"""
    CREATE TEMP TABLE paired AS
    WITH {_side_sql("target", group_by)}, {_side_sql("bench", group_by)}
    SELECT t.tensor_id AS target_tensor_id, b.tensor_id AS bench_tensor_id
    FROM target_k t JOIN bench_k b ON {on} AND t.k = b.k AND t.n = b.n
    """


def _check_sql(dtype: bool) -> str:
    """Select-list ``wrong, other_op`` of a pair whose target row is ``t`` and bench row
    ``b`` (columns shape, l2norm, mean, min, max, graph_id, op_type; dtype if ``dtype``):
    ``wrong``, the pair looks wrong (other shape or dtype, align's form, a superset of its
    dtype class; or :func:`~dumpdb.compare.align.stat_distance`'s formula above
    :data:`~dumpdb.compare.align.LOOKS_WRONG`; NULL or non-finite: unknown, not wrong;
    both L2 norms 0 with other statistics: 1.0); ``other_op``, another graph_id or op_type
    (see :func:`_doubted`)."""
    wrong, other_op = _check_items(dtype)
    return f"{wrong} AS wrong, {other_op} AS other_op"


def _check_items(dtype: bool) -> tuple[str, str]:
    """The expressions of :func:`_check_sql`'s ``wrong`` and ``other_op``."""
    l2 = "greatest(abs(t.l2norm), abs(b.l2norm))"
    scale = f"({l2} / sqrt(greatest(coalesce(list_aggregate(t.shape, 'product'), 1), 1)))"
    finite = " AND ".join(f"isfinite({a}.{c})" for c in _STATS for a in "tb")
    other_dtype = " OR t.dtype IS DISTINCT FROM b.dtype" if dtype else ""
    return (f"""coalesce(t.shape IS DISTINCT FROM b.shape{other_dtype} OR (
                 {finite} AND CASE WHEN {l2} = 0
                   THEN (t.mean, t.min, t.max) IS DISTINCT FROM (b.mean, b.min, b.max)
                   ELSE greatest(abs(t.l2norm - b.l2norm) / {l2}, abs(t.mean - b.mean) / {scale},
                                 abs(t.min - b.min) / {scale}, abs(t.max - b.max) / {scale}) > {LOOKS_WRONG} END),
                 false)""",
            "t.graph_id IS DISTINCT FROM b.graph_id OR t.op_type IS DISTINCT FROM b.op_type")


def _checks(con: duckdb.DuckDBPyConnection) -> tuple[tuple[str, ...], bool] | None:
    """What :func:`_check_sql` reads and whether a dtype is on both sides, when both
    registered sides have op_type and the four statistics (the full content check of
    :func:`_doubted`); None otherwise."""
    have = [set(con.sql(f"SELECT * FROM {name} LIMIT 0").columns) for name in ("target", "bench")]
    read = CHECK_COLUMNS
    if not all(c in cols for c in read for cols in have):
        return None
    dtype = all("dtype" in cols for cols in have)
    return (*read, *(("dtype",) if dtype else ())), dtype


def _pair(con: duckdb.DuckDBPyConnection, group_by: Sequence[str], rows: tuple[int, int],
          check: bool = True) -> tuple[int, pa.Table | None]:
    """Temp table ``paired`` of the exact rule (module docstring); returns its number of
    rows and, when the one join below settles it, its two id columns (``target_tensor_id``,
    ``bench_tensor_id``, int64, unordered; None otherwise). ``rows``: the number of rows of
    target and bench.

    First one join of the two sides on the key, cut at ``min(rows) + 1`` rows (so that a
    key held by many tensors on both sides costs no product of their numbers). A key held
    by n_t target and n_b bench tensors (both at least 1) gives n_t * n_b joined rows with
    n_t distinct target and n_b distinct bench ids (a tensor has one key, ``tensor_id`` is
    unique on a side); summed over the keys, the row count equals both distinct counts only
    if every n_t * n_b = n_t = n_b, that is every key met on both sides is held once on
    each: then the rule pairs exactly the joined rows (keys held on one side only pair
    nothing either way), the usual case (msprobe record keys of one iteration), one hash
    join instead of a grouping per side and a join (about half the CPU on 500,000 pairs).
    Otherwise, when no key is held by two or more tensors on both sides, the rule pairs the
    keys held once on both sides (one grouping per side gives them, without the
    execution-order window); otherwise :func:`_sql`.

    The one join also gives each pair's ``wrong`` and ``other_op`` (:func:`_check_sql`)
    where :func:`_doubted` reads them (:func:`_checks`): its content check then needs no
    second join of the pairs with both sides. Not ``check``: the join carries the ids only
    (the caller gives the check columns another way: :func:`exact_paired`'s ``sides``)."""
    on = " AND ".join(f't."{k}" IS NOT DISTINCT FROM b."{k}"' for k in (*group_by, *_KEY))
    checks = _checks(con) if check else None
    read, check_items = (checks[0], f", {_check_sql(checks[1])}") if checks else ((), "")
    con.execute(f"""CREATE TEMP TABLE paired AS
                    WITH {_keyed_sql('target', group_by, read)}, {_keyed_sql('bench', group_by, read)}
                    SELECT t.tensor_id AS target_tensor_id, b.tensor_id AS bench_tensor_id{check_items}
                    FROM target_o t JOIN bench_o b ON {on} LIMIT {min(rows) + 1}""")
    # the ids fetched once (the caller reads them too) and their distinct counts taken in
    # numpy: a third of a count(DISTINCT) query over the table
    ids = con.sql("SELECT target_tensor_id, bench_tensor_id FROM paired").to_arrow_table()
    if ids.num_rows <= min(rows) and all(_distinct(ids.column(c)) for c in ids.column_names):
        return ids.num_rows, ids
    con.execute("DROP TABLE paired")
    sides = f"{_keyed_sql('target', group_by)}, {_keyed_sql('bench', group_by)}"
    keys = ", ".join(f'"{k}"' for k in (*group_by, *_KEY))
    once = ", ".join(f"""{side}_n AS (SELECT {keys}, count(*) AS n, any_value(tensor_id) AS tensor_id
                                  FROM {side}_o GROUP BY ALL)""" for side in ("target", "bench"))
    con.execute(f"""CREATE TEMP TABLE paired AS
                    WITH {sides}, {once}
                    SELECT t.tensor_id AS target_tensor_id, b.tensor_id AS bench_tensor_id, t.n
                    FROM target_n t JOIN bench_n b ON {on} AND t.n = b.n""")
    # a key held by as many tensors (two or more) on both sides: pairs in execution order
    if con.sql("SELECT coalesce(max(n), 1) > 1 FROM paired").fetchall()[0][0]:
        con.execute("DROP TABLE paired")
        con.execute(_sql(group_by))
    else:
        con.execute("ALTER TABLE paired DROP COLUMN n")
    return int(con.sql("SELECT count(*) FROM paired").fetchall()[0][0]), None


def _distinct(ids: pa.ChunkedArray) -> bool:
    """Are the ``ids`` (int64, no NULL: tensor ids) all different? A count per id when
    they span at most four times their number plus 1,024 (one ingest numbers a run's
    tensors from a sequence), else a sort."""
    v = ids.to_numpy()
    if v.size < 2:
        return True
    lowest = int(v.min())
    span = int(v.max()) - lowest + 1
    if span <= 4 * v.size + 1024:
        return int(np.bincount(v - lowest, minlength=span).max()) <= 1
    return int(np.unique(v).size) == v.size


def _unmatched_sql(side: str, column: str) -> str:
    order = ", ".join(f'"{c}" ASC NULLS LAST' for c in _ORDER)
    return f"""
    SELECT tensor_id, coalesce(op_name, scope_name) AS name, io, slot::INTEGER AS slot
    FROM {side} WHERE tensor_id NOT IN (SELECT {column} FROM paired)
    ORDER BY {order}
    """


def align_exact(target: pa.Table, bench: pa.Table, *, group_by: Sequence[str] = (),
                strategies: Sequence[str] = ("exact",),
                on_pairs: Callable[[pa.Table], None] | None = None) -> Alignment | None:
    """:func:`dumpdb.compare.align.align` of ``target``/``bench`` (catalog ``tensors`` rows
    with the columns align reads, ``shape`` a list of int64) when ``strategies`` (without
    ``mapping``: the caller has no mapping) start with ``exact`` and exact pairing settles
    every tensor it can (module docstring); None otherwise, and also when a column is
    missing (align treats a missing column as NULL; the caller then runs align).

    ``on_pairs(pairs)``, when given, is called once with the exact rule's pairs
    (``target_tensor_id``, ``bench_tensor_id``, int64, unordered) as soon as they are known,
    before the content check and the unmatched tensors: the compare engine starts reading
    and computing them while the rest of the alignment runs. Those pairs are what align()
    pairs by ``exact`` unless its content check takes some back (a doubted pair: then this
    returns None) or a mapping is given (then align_exact is not called).

    Returns an :class:`~dumpdb.compare.align.Alignment` whose ``pairs`` all have strategy
    ``exact``. Raises ValueError for a ``group_by`` column missing from a side (as align).
    """
    con = duckdb.connect()
    try:
        left = exact_paired(con, target, bench, group_by=group_by, strategies=strategies, on_pairs=on_pairs)
        if left is None:
            return None
        order = ", ".join(f't."{c}" ASC NULLS LAST' for c in _ORDER)
        pairs = con.sql("SELECT p.target_tensor_id, p.bench_tensor_id, 'exact' AS match_strategy, false AS realigned "
                        "FROM paired p "
                        f"JOIN target t ON t.tensor_id = p.target_tensor_id ORDER BY {order}").to_arrow_table()
    finally:
        con.close()
    return Alignment(pairs.cast(PAIRS_SCHEMA), *left)


def exact_paired(con: duckdb.DuckDBPyConnection, target: pa.Table, bench: pa.Table, *,
                 group_by: Sequence[str] = (), strategies: Sequence[str] = ("exact",),
                 keep: Sequence[str] = (),
                 on_pairs: Callable[[pa.Table], None] | None = None,
                 sides: Callable[[pa.Table], tuple[pa.Table, pa.Table]] | None = None,
                 measure: Measure | None = None,
                 ) -> tuple[pa.Table, pa.Table] | None:
    """The work of :func:`align_exact` on the DuckDB connection ``con``, left there for more
    queries: ``target`` and ``bench`` registered as relations of the same names (the
    columns align reads, plus ``keep``), and temp table ``paired`` (``target_tensor_id``,
    ``bench_tensor_id``; unordered: :func:`align_exact` orders the pairs by the target's
    execution order, iteration, rank, graph_id, position, timestamp, tensor_id). Returns
    the unmatched tensors of each side (:data:`~dumpdb.compare.align.UNMATCHED_SCHEMA`), or
    None where :func:`align_exact` gives None (nothing is then left on ``con``). Raises
    ValueError as align_exact. ``on_pairs``: as align_exact's.

    ``sides``, when given, is called at most once (not when the rule declines with rows
    left on both sides, nor when a side lacks what the check reads) with the pairs (``target_tensor_id``,
    ``bench_tensor_id``, unordered) and returns the pairs' target rows and bench rows (Arrow
    tables of ``target``'s and ``bench``'s columns, row k of each the k-th pair, in any
    order of the pairs; at least ``tensor_id`` and what the content check reads): the
    check (:func:`_check_sql`) is then computed over them side by side (a positional join)
    instead of carried through the pairing join (a caller that takes the pairs' rows anyway,
    :func:`~dumpdb.compare.stats_pairs.statistics_pairs`, saves the join's payload: about
    a third of its CPU).

    ``measure`` (with ``sides``): ``(query, done)``; ``query(source, keep)`` is run, a
    query over ``source`` (a FROM clause in which ``t`` and ``b`` are the rows ``sides``
    gave, row k of each the k-th pair, with ``tensor_id``, ``pair_index`` = k and the four
    statistics ``l2norm``, ``mean``, ``min``, ``max``: ``t.max`` is the target's max)
    carrying the ``keep`` select items (``(expression, output name)``: the two ids,
    ``pair_index``) among its output columns, one row per pair; ``done(table)`` receives
    its output (in any order of its rows). It runs while numpy computes the content check
    over the same rows (:func:`_checked_pairs`; :func:`~dumpdb.compare.stats_pairs.statistics_pairs`:
    the statistics metrics)."""
    run = [s for s in dict.fromkeys(strategies) if s != "mapping"]
    if not run or run[0] != "exact":
        return None
    for label, table in (("target", target), ("bench", bench)):
        missing = [c for c in group_by if c not in table.column_names]
        if missing:
            raise ValueError(f"group_by column(s) {', '.join(missing)} not in {label}")
        if any(c not in table.column_names for c in _NEEDED):
            return None
    cols = list(dict.fromkeys((*_NEEDED, *group_by)))
    for name, table in (("target", target), ("bench", bench)):
        extra = (*keep, *_CHECKED)  # what the content check reads (_doubted), where the table has it
        con.register(name, table.select(list(dict.fromkeys((*cols, *(c for c in extra if c in table.column_names))))))
    # the caller takes the pairs' rows (sides): the check needs no join, nor do pairs in place
    positional = _positional_pairs(target, bench, group_by) if sides is not None else None
    if positional is not None:
        con.register("positional_pairs", positional)
        con.execute("CREATE TEMP TABLE paired AS SELECT * FROM positional_pairs")
        con.unregister("positional_pairs")
        n, ids = positional.num_rows, positional
    else:
        n, ids = _pair(con, group_by, (target.num_rows, bench.num_rows), check=sides is None)
    # both sides with rows left and another strategy to try: declined below whatever the check
    # says, so the pairs' rows are not taken for it (pairs are one to one: n rows paired a side)
    declined = n < target.num_rows and n < bench.num_rows and len(run) > 1
    if ids is None and (on_pairs is not None or (sides is not None and not declined)):
        ids = con.sql("SELECT target_tensor_id, bench_tensor_id FROM paired").to_arrow_table()
    later: list[Callable[[], None]] = []  # the measure, running while the rest is done here
    try:
        checked = sides is not None and not declined and _checked_pairs(con, sides, ids, measure, later)
        if on_pairs is not None:
            on_pairs(ids)
        if declined:  # a later strategy may pair some of the rows left: align() decides
            _discard(con)
            return None
        # a side whose every row is paired has nothing left: no query (the usual case)
        left_t, left_b = (con.sql(_unmatched_sql(side, f"{side}_tensor_id")).to_arrow_table() if n < table.num_rows
                          else UNMATCHED_SCHEMA.empty_table() for side, table in (("target", target), ("bench", bench)))
        if _doubted(con, group_by, bench, all_paired=not left_t.num_rows and not left_b.num_rows, checked=checked,
                    target=target, bench_in_order=positional is not None):
            _discard(con)  # the content check doubts a pair: align() decides
            return None
        return left_t.cast(UNMATCHED_SCHEMA), left_b.cast(UNMATCHED_SCHEMA)
    finally:
        for step in later:
            step()


def _discard(con: duckdb.DuckDBPyConnection) -> None:
    """Nothing of :func:`exact_paired` left on ``con`` (it gives None): temp table ``paired``
    dropped, ``target`` and ``bench`` unregistered."""
    con.execute("DROP TABLE paired")
    con.unregister("target")
    con.unregister("bench")


def _checked_pairs(con: duckdb.DuckDBPyConnection, sides: Callable[[pa.Table], tuple[pa.Table, pa.Table]],
                   pairs: pa.Table, measure: Measure | None = None,
                   later: list[Callable[[], None]] | None = None) -> bool:
    """Temp table ``checked``: the pairs (``target_tensor_id``, ``bench_tensor_id``) whose
    ``wrong`` or ``other_op`` (:func:`_check_sql`, both columns kept) is true, computed over
    the pairs' rows that ``sides`` gives for ``pairs`` (the rows of temp table ``paired``;
    see :func:`exact_paired`), the rows :func:`_doubted` takes from :func:`_pair`'s join
    otherwise; returns True. False, nothing made, when a side lacks what the check reads
    (:func:`_checks`: :func:`_doubted` then joins). ``measure``: see :func:`exact_paired`.
    The check runs in numpy (:func:`_check_arrays`) while DuckDB runs the measure in a
    second thread, on a cursor of ``con`` (its own connection to the same database); the
    SQL (:func:`_check_sql`) only where numpy declines. ``later``, when given, receives
    the step that waits for the measure and hands its output to ``done`` (the caller runs
    it when it has done the rest of its work, also on an error: the measure's thread and
    cursor end there); otherwise that step runs before this returns."""
    checks = _checks(con)
    if checks is None:
        return False
    t, b = sides(pairs)
    read = ["tensor_id", *checks[0]]  # checks[0] holds dtype where the check reads it
    if t.num_rows != b.num_rows:  # a positional join would pad the shorter side with NULLs: no check
        raise ValueError(f"sides gave {t.num_rows} target rows and {b.num_rows} bench rows for the same pairs")
    # DuckDB computes the measure over the statistics alone in a second thread (off the GIL)
    # while numpy checks the pairs here, and while the caller goes on (later)
    steps = [] if later is None else later
    if measure is not None:
        helper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dumpdb-measure")
        cursor = con.cursor()
        measuring: list[Future] = []
        done = measure[1]
        steps.append(lambda: done(_finish(helper, cursor, measuring)))
        measured = ["tensor_id", *_STATS]
        tt = t.select(measured).append_column("pair_index", pa.array(np.arange(t.num_rows, dtype=np.int64)))
        # the pairs' rows side by side as one relation, each side a struct column (t, b: the
        # query's t.max reads field max of column t), row k the k-th pair: one scan that
        # DuckDB's threads share (a positional join of two relations runs on one thread)
        cursor.register("paired_rows", pa.table({"t": _struct(tt), "b": _struct(b.select(measured))}))
        sql = measure[0]("paired_rows", [("t.tensor_id", "target_tensor_id"), ("b.tensor_id", "bench_tensor_id"),
                                         ("t.pair_index", "pair_index")])
        measuring.append(helper.submit(lambda: cursor.sql(sql).to_arrow_table()))
    try:
        found = _check_arrays(t.select(read), b.select(read), checks[1])
        if found is None:
            con.register("paired_rows", pa.table({"t": _struct(t.select(read)), "b": _struct(b.select(read))}))
            try:
                con.execute(f"""CREATE TEMP TABLE checked AS SELECT * FROM (
                                  SELECT t.tensor_id AS target_tensor_id, b.tensor_id AS bench_tensor_id,
                                         {_check_sql(checks[1])}
                                  FROM paired_rows)
                                WHERE wrong OR other_op""")
            finally:
                con.unregister("paired_rows")
        else:
            wrong, other_op = found
            at = pa.array(np.flatnonzero(wrong | other_op))
            con.register("flagged", pa.table({"target_tensor_id": t.column("tensor_id").take(at),
                                              "bench_tensor_id": b.column("tensor_id").take(at),
                                              "wrong": pa.array(wrong).take(at),
                                              "other_op": pa.array(other_op).take(at)}))
            try:
                con.execute("CREATE TEMP TABLE checked AS SELECT * FROM flagged")
            finally:
                con.unregister("flagged")
    finally:
        if later is None:
            for step in steps:
                step()
    return True


def _finish(helper: ThreadPoolExecutor, cursor: duckdb.DuckDBPyConnection, measuring: list[Future]) -> pa.Table:
    """The measure's output (:func:`_checked_pairs`), its thread and cursor ended; raises
    what the measure raised (RuntimeError when it was not started: an error before)."""
    try:
        if not measuring:
            raise RuntimeError("the measure did not start")
        return measuring[0].result()
    finally:
        helper.shutdown()
        cursor.close()


def _check_arrays(t: pa.Table, b: pa.Table, dtype: bool) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`_check_sql`'s ``wrong`` and ``other_op`` (bool, one per row) of the pairs whose
    target rows are ``t`` and bench rows ``b`` (row k of each the k-th pair; columns as
    the SQL reads), in numpy, the values DuckDB gives: NULL equal to NULL, -0.0 equal to
    0.0, a NaN distance above every bound (DuckDB orders NaN last), the element count a
    DOUBLE product of the target shape's numbers in turn (1 for none). None when a shape
    holds a NULL number or the two sides' shapes or columns are of other types (the SQL
    decides)."""
    try:
        shape_distinct, count = _shape_check(_one(t.column("shape")), _one(b.column("shape")))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, TypeError):
        return None
    if shape_distinct is None:
        return None
    wrong = shape_distinct
    try:
        if dtype:
            wrong |= _is_distinct(t.column("dtype"), b.column("dtype"))
        other_op = _is_distinct(t.column("graph_id"), b.column("graph_id")) | \
            _is_distinct(t.column("op_type"), b.column("op_type"))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    stats = _STATS
    if any(side.schema.field(c).type != pa.float64() for c in stats for side in (t, b)):
        return None
    tl, tm, tn, tx = (_one(t.column(c)).to_numpy(zero_copy_only=False) for c in stats)
    bl, bm, bn, bx = (_one(b.column(c)).to_numpy(zero_copy_only=False) for c in stats)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        finite = np.isfinite(tl) & np.isfinite(bl) & np.isfinite(tm) & np.isfinite(bm) & \
            np.isfinite(tn) & np.isfinite(bn) & np.isfinite(tx) & np.isfinite(bx)
        l2 = np.maximum(np.abs(tl), np.abs(bl))
        scale = l2 / np.sqrt(count)
        far = np.maximum(np.maximum(np.abs(tl - bl) / l2, np.abs(tm - bm) / scale),
                         np.maximum(np.abs(tn - bn) / scale, np.abs(tx - bx) / scale))
        zero = l2 == 0
        stat_wrong = np.where(zero, (tm != bm) | (tn != bn) | (tx != bx), (far > LOOKS_WRONG) | np.isnan(far))
    wrong |= finite & stat_wrong
    return wrong, other_op


def _one(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """``column`` as one array (no copy of a column of one chunk)."""
    if isinstance(column, pa.ChunkedArray):
        return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    return column


def _is_distinct(a: pa.ChunkedArray, c: pa.ChunkedArray) -> np.ndarray:
    """``a IS DISTINCT FROM c`` row by row (bool)."""
    a, c = _one(a), _one(c)
    if a.type != c.type:
        a = a.cast(c.type)
    equal = pc.fill_null(pc.equal(a, c), False)
    same = pc.or_(equal, pc.and_(pc.is_null(a), pc.is_null(c)))
    return ~same.to_numpy(zero_copy_only=False)


def _shape_check(ts: pa.Array, bs: pa.Array) -> tuple[np.ndarray | None, np.ndarray]:
    """``t.shape IS DISTINCT FROM b.shape`` row by row (None for a NULL number in a shape, or
    shapes of other types) and ``greatest(coalesce(list_aggregate(t.shape, 'product'), 1),
    1)`` (float64: each number as a double multiplied in turn, 1 for a NULL or empty
    shape)."""
    n = len(ts)
    if ts.type != bs.type or not (pa.types.is_list(ts.type) or pa.types.is_large_list(ts.type)) \
            or not pa.types.is_integer(ts.type.value_type):
        return None, np.ones(n)
    tf, bf = pc.list_flatten(ts), pc.list_flatten(bs)
    if tf.null_count or bf.null_count:
        return None, np.ones(n)
    tv = ts.is_valid().to_numpy(zero_copy_only=False)
    bv = bs.is_valid().to_numpy(zero_copy_only=False)
    tlen = pc.fill_null(pc.list_value_length(ts), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    blen = pc.fill_null(pc.list_value_length(bs), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    tvals = tf.to_numpy(zero_copy_only=False)
    bvals = bf.to_numpy(zero_copy_only=False)
    distinct = (tv != bv) | (tlen != blen)
    tstart = np.concatenate(([0], np.cumsum(tlen)[:-1])) if n else np.zeros(0, np.int64)
    if not distinct.any():  # the flattened numbers line up row by row
        row = np.repeat(np.arange(n, dtype=np.int64), tlen)
        differs = tvals != bvals
    else:  # the numbers of the rows of equal lengths, each side's at its own place
        bstart = np.concatenate(([0], np.cumsum(blen)[:-1]))
        kept = np.where(distinct, 0, tlen)
        row = np.repeat(np.arange(n, dtype=np.int64), kept)
        within = np.arange(row.size, dtype=np.int64) - np.repeat(np.cumsum(kept) - kept, kept)
        differs = tvals[tstart[row] + within] != bvals[bstart[row] + within]
    distinct[row[differs]] = True
    count = np.ones(n)
    numbers = tvals.astype(np.float64)
    for j in range(int(tlen.max()) if n else 0):
        has = tlen > j
        count[has] *= numbers[tstart[has] + j]
    return distinct, np.maximum(count, 1.0)


def _struct(table: pa.Table) -> pa.StructArray:
    """``table``'s columns as one struct array (no copy of a column of one chunk: combine_chunks
    copies it)."""
    return pa.StructArray.from_arrays([_one(c) for c in table.columns], table.column_names)


def _doubted(con: duckdb.DuckDBPyConnection, group_by: Sequence[str], bench: pa.Table,
             all_paired: bool = False, checked: bool = False, target: pa.Table | None = None,
             bench_in_order: bool = False) -> bool:
    """Would align()'s content check take back some exact pairs? A cheap, conservative test
    on ``con`` (after the ``paired`` table is made): a name family
    (:func:`~dumpdb.compare.align.family`) holding paired ops has another number of ops on
    the two sides, or a pair looks wrong (other shape or dtype, or statistics distance
    above :data:`~dumpdb.compare.align.LOOKS_WRONG`) **and** a bench tensor like its
    target tensor might fit far better (:func:`_better_partner_may_exist`); then align()
    decides, with the full check. A pair that merely looks wrong (random statistics,
    a tensor of tiny L2 norm) is taken back by align() only when such a partner exists,
    and is listed as a suspect only then: without one, align() keeps every exact pair.

    ``all_paired``: no tensor of either side is left unpaired. When, besides, every pair's
    two tensors have the same ``graph_id`` and ``op_type`` (the key gives the same group
    columns and ``op_name``), each side holds the same set of ops, so every family has as
    many ops on both sides whatever :func:`~dumpdb.compare.align.family` gives: the family
    count is not needed (the usual run-to-run case; about a third of this test's CPU).
    ``bench``: the bench table registered on ``con`` (:func:`_better_partner_may_exist`).
    ``checked``: temp table ``checked`` holds the pairs that look wrong or are of another
    op (:func:`_checked_pairs`; dropped here), else they come from ``paired``. ``target``:
    the target table registered on ``con``, when given the partner search runs in numpy
    (:func:`_partner_fits`) where it can; ``bench_in_order``: ``bench``'s rows are in
    execution order (:func:`_positional_pairs` found them so)."""
    keys = list(group_by)  # ops counted per (graph, name): a counter is per graph
    have = {name: set(con.sql(f"SELECT * FROM {name} LIMIT 0").columns) for name in ("target", "bench")}
    if any("op_type" not in cols_ for cols_ in have.values()):
        return False
    stats = _STATS
    if not checked and not all(c in have[side] for c in stats for side in have):
        return _other_family_counts(con, keys) or \
            con.sql("SELECT count(*) FROM paired p JOIN target t ON t.tensor_id = p.target_tensor_id "
                    "JOIN bench b ON b.tensor_id = p.bench_tensor_id "
                    "WHERE t.shape IS DISTINCT FROM b.shape").fetchall()[0][0] > 0
    # pairs that look wrong or of another graph_id or op_type (_check_sql; other_op: see
    # all_paired): given by _checked_pairs, or by _pair's one join, else a join of the pairs
    # with both sides
    if checked:
        pass
    elif "wrong" in con.sql("SELECT * FROM paired LIMIT 0").columns:
        con.execute("CREATE TEMP TABLE checked AS SELECT target_tensor_id, bench_tensor_id, wrong, other_op "
                    "FROM paired WHERE wrong OR other_op")
    else:
        dtype = all("dtype" in have[side] for side in have)
        con.execute(f"""
            CREATE TEMP TABLE checked AS
            SELECT * FROM (
              SELECT p.target_tensor_id, p.bench_tensor_id, {_check_sql(dtype)}
              FROM paired p JOIN target t ON t.tensor_id = p.target_tensor_id
              JOIN bench b ON b.tensor_id = p.bench_tensor_id)
            WHERE wrong OR other_op""")
    try:
        if not all_paired or con.sql("SELECT count(*) FROM checked WHERE other_op").fetchall()[0][0]:
            if _other_family_counts(con, keys):
                return True
        con.execute("CREATE TEMP TABLE looks_wrong AS SELECT target_tensor_id, bench_tensor_id FROM checked "
                    "WHERE wrong")
    finally:
        con.execute("DROP TABLE checked")
    try:
        if target is not None:
            wrong = con.sql("SELECT target_tensor_id, bench_tensor_id FROM looks_wrong").to_arrow_table()
            if not wrong.num_rows:
                return False
            found = _partner_fits(target, bench, wrong, group_by, bench_in_order)
            if found is not None:
                return found
        return _better_partner_may_exist(con, group_by, bench)
    finally:
        con.execute("DROP TABLE looks_wrong")


def _other_family_counts(con: duckdb.DuckDBPyConnection, keys: Sequence[str]) -> bool:
    """Does a name family (:func:`~dumpdb.compare.align.family`, per ``keys`` group)
    holding a pair of temp table ``paired`` have another number of ops on the two sides?"""
    # the family of each distinct (op_type, op_name) of the two sides, computed once
    # (align.family, vectorised over the column): run-to-run dumps share their names, so
    # this is a third of the work of one family per op of each side and of the pairs
    names = con.sql("SELECT DISTINCT op_type, op_name FROM (SELECT op_type, op_name FROM target "
                    "UNION ALL SELECT op_type, op_name FROM bench) WHERE op_name IS NOT NULL").to_arrow_table()
    fams = pa.array(family_column(names.column("op_type").to_pylist(), names.column("op_name")), pa.string())
    con.register("families", names.append_column("family", fams).filter(fams.is_valid()))
    cols = ", ".join(f'"{k}"' for k in (*keys, "graph_id", "op_type", "op_name"))
    carried = "".join(f'o."{k}", ' for k in keys)
    fk = ", ".join(f'"{k}"' for k in (*keys, "family"))
    named = "JOIN families f ON f.op_type IS NOT DISTINCT FROM o.op_type AND f.op_name = o.op_name"
    # ops per family on each side: distinct (group, graph_id, op_type, op_name), the graph_id
    # then left out (ops per family over the graphs); compared for each family holding a pair
    ops = {side: f"SELECT {carried}f.family "
                 f"FROM (SELECT DISTINCT {cols} FROM {side} WHERE op_name IS NOT NULL) o {named}"
           for side in ("target", "bench")}
    tcols = ", ".join(f't."{k}"' for k in (*keys, "op_type", "op_name"))
    paired_ops = (f"SELECT DISTINCT {carried}f.family FROM "
                  f"(SELECT DISTINCT {tcols} FROM paired p JOIN target t ON t.tensor_id = p.target_tensor_id "
                  f"WHERE t.op_name IS NOT NULL) o {named}")
    on = " AND ".join(f'f."{k}" IS NOT DISTINCT FROM {{0}}."{k}"' for k in (*keys, "family"))
    try:
        if con.sql(f"""
            WITH ct AS (SELECT {fk}, count(*) AS n FROM ({ops["target"]}) GROUP BY ALL),
            cb AS (SELECT {fk}, count(*) AS n FROM ({ops["bench"]}) GROUP BY ALL),
            f AS ({paired_ops})
            SELECT count(*) FROM f LEFT JOIN ct ON {on.format("ct")} LEFT JOIN cb ON {on.format("cb")}
            WHERE ct.n IS DISTINCT FROM cb.n""").fetchall()[0][0]:
            return True
    finally:
        con.unregister("families")
    return False


def _better_partner_may_exist(con: duckdb.DuckDBPyConnection, group_by: Sequence[str],
                              bench: pa.Table) -> bool:
    """Might align()'s ``_better_partner`` find, for a pair in temp table ``looks_wrong``, a
    bench tensor other than its partner that fits the target tensor within
    :data:`~dumpdb.compare.align.FITS`? Only then can the content check take a pair back
    or list it as a suspect (align.py, content check). align looks among the bench tensors
    of the target's kind (group, graph, op type, leaf, dtype class, shape) in execution
    order, at the :data:`~dumpdb.compare.align.NEIGHBOURS` either side of the place of the
    pair's bench tensor; the same window here (the whole kind when the bench tensor is of
    another kind), with :func:`~dumpdb.compare.align.stat_distance`'s formula below
    ``FITS`` (conservative: align's bound is also below a quarter of the pair's distance;
    both L2 norms 0 count whatever the other statistics).

    ``bench``: the rows registered as ``bench``. Their
    rows' places in execution order are one int64 (:func:`_order_numbers`: the row number
    when the rows already come in that order, the usual case), their dtype classes a
    column beside them: the window orders by one integer and carries three (the bench
    tensor's id, kind and place) and numbers only the kinds of the pairs' target tensors,
    the statistics are joined to the candidates only, and the whole kind is searched only
    when some pair's bench tensor is of another kind (a count first)."""
    if not con.sql("SELECT count(*) FROM looks_wrong").fetchall()[0][0]:
        return False
    kind = (*group_by, "graph_id", "op_type", "io", "slot", "slot_path", "arg_name", "cls", "shape")
    read = list(dict.fromkeys(("tensor_id", *(k for k in kind if k != "cls"), "l2norm", "mean", "min", "max")))
    con.register("bench_k", bench.select(read).append_column("cls", _dtype_classes(bench))
                 .append_column("eo", pa.array(_order_numbers(bench))))
    part = ", ".join(f'"{k}"' for k in kind)

    def same(a: str, b: str) -> str:
        return " AND ".join(f'{a}."{k}" IS NOT DISTINCT FROM {b}."{k}"' for k in kind)
    # dtype class per dtype string of the target's rows in looks_wrong: align's rule (dtype_class)
    has_dtype = "dtype" in con.sql("SELECT * FROM target LIMIT 0").columns
    dtypes = sorted({r[0] for r in con.sql(
        "SELECT DISTINCT dtype FROM target WHERE tensor_id IN (SELECT target_tensor_id FROM looks_wrong)"
    ).fetchall()} - {None}) if has_dtype else []
    con.register("dtype_class", pa.table({"dtype": pa.array(dtypes, pa.string()),
                                          "cls": pa.array([dtype_class(d) for d in dtypes], pa.string())}))
    tread = ", ".join(f'x."{c}"' for c in read)
    classed_target = (f"SELECT {tread}, c.cls FROM target x LEFT JOIN dtype_class c ON c.dtype = x.dtype" if has_dtype
                      else f"SELECT {tread}, NULL::VARCHAR AS cls FROM target x")
    stats = _STATS
    # each kind numbered once (kid): the window and the candidate joins then partition and
    # join by one integer instead of the kind's columns (a list among them)
    try:
        con.execute(f"""
            CREATE TEMP TABLE partner_kinds AS SELECT *, row_number() OVER () AS kid
            FROM (SELECT DISTINCT {part} FROM bench_k)""")
        # the looks-wrong pairs' target tensors with their kinds; the bench tensors' places
        # only in those kinds (a partner of another kind is searched for in the target's kind)
        con.execute(f"""
            CREATE TEMP TABLE partner_targets AS
            SELECT x.tensor_id, x.shape, {", ".join(f"x.{c}" for c in stats)}, k.kid
            FROM ({classed_target}) x LEFT JOIN partner_kinds k ON {same("x", "k")}
            WHERE x.tensor_id IN (SELECT target_tensor_id FROM looks_wrong)""")
        # each bench tensor's place r in its kind's execution order (row_number() OVER
        # (PARTITION BY kid ORDER BY eo) - 1), numbered in numpy: the window's sort of every
        # row was most of this test's CPU
        places = con.sql(f"""
            SELECT b.tensor_id, k.kid, b.eo FROM bench_k b JOIN partner_kinds k ON {same("b", "k")}
            WHERE k.kid IN (SELECT kid FROM partner_targets)""").to_arrow_table()
        r = _places_in_kind(places.column("kid").to_numpy(), places.column("eo").to_numpy())
        con.register("places", pa.table({"tensor_id": places.column("tensor_id"), "kid": places.column("kid"),
                                         "r": r, "bucket": r // NEIGHBOURS}))
        try:
            con.execute("CREATE TEMP TABLE partner_places AS SELECT * FROM places")
        finally:
            con.unregister("places")
        con.execute("""
            CREATE TEMP TABLE partner_pairs AS
            SELECT x.*, w.bench_tensor_id AS partner, CASE WHEN x.kid = y.kid THEN y.r END AS pr
            FROM looks_wrong w JOIN partner_targets x ON x.tensor_id = w.target_tensor_id
            LEFT JOIN partner_places y ON y.tensor_id = w.bench_tensor_id""")
        fields = ("x.l2norm AS tl, s.l2norm AS bl, x.mean AS tm, s.mean AS bm, x.min AS tn, s.min AS bn, "
                  "x.max AS tx, s.max AS bx, greatest(abs(x.l2norm), abs(s.l2norm)) AS l2, "
                  "greatest(coalesce(list_aggregate(x.shape, 'product'), 1), 1) AS k")
        # of another kind: the whole kind (align bisects to a place in it); only when there is such a pair
        other = f"""
              UNION ALL
              SELECT {fields}
              FROM partner_pairs x JOIN partner_places y ON y.kid = x.kid JOIN bench_k s ON s.tensor_id = y.tensor_id
              WHERE x.pr IS NULL AND y.tensor_id <> x.partner""" if con.sql(
            "SELECT count(*) FROM partner_pairs WHERE pr IS NULL AND kid IS NOT NULL").fetchall()[0][0] else ""
        return con.sql(f"""
            WITH near AS (  -- the bench tensor is of the target's kind: the NEIGHBOURS either side of it
              SELECT x.*, unnest([x.pr // {NEIGHBOURS} - 1, x.pr // {NEIGHBOURS}, x.pr // {NEIGHBOURS} + 1])
                     AS bucket FROM partner_pairs x WHERE pr IS NOT NULL),
            cand AS (
              SELECT {fields}
              FROM near x JOIN partner_places y ON y.kid = x.kid AND y.bucket = x.bucket
              JOIN bench_k s ON s.tensor_id = y.tensor_id
              WHERE y.tensor_id <> x.partner AND y.r BETWEEN x.pr - {NEIGHBOURS} AND x.pr + {NEIGHBOURS}{other})
            SELECT count(*) FROM cand WHERE {_FINITE} AND (l2 = 0 OR greatest(
                abs(tl - bl) / l2, abs(tm - bm) / (l2 / sqrt(k)), abs(tn - bn) / (l2 / sqrt(k)),
                abs(tx - bx) / (l2 / sqrt(k))) < {FITS})""").fetchall()[0][0] > 0
    finally:
        for table in ("partner_pairs", "partner_places", "partner_targets", "partner_kinds"):
            con.execute(f"DROP TABLE IF EXISTS {table}")
        con.unregister("dtype_class")
        con.unregister("bench_k")


def _partner_fits(target: pa.Table, bench: pa.Table, wrong: pa.Table, group_by: Sequence[str],
                  bench_in_order: bool = False) -> bool | None:
    """:func:`_better_partner_may_exist` in numpy, the same answer: ``wrong`` holds the pairs
    that look wrong (``target_tensor_id``, ``bench_tensor_id``, int64, at least one), of
    the rows of ``target`` and ``bench`` (the tables registered on the connection). Each
    kind (group, graph, op type, leaf, dtype class, shape) one integer, from a dictionary
    encoding of each of its columns over the looks-wrong target rows and every bench row
    (exact values: a shape as the bytes of its numbers, NULL its own value, as IS NOT
    DISTINCT FROM); each bench row's place in its kind's execution order
    (:func:`_places_in_kind`); the candidates of a pair are the rows at the
    :data:`~dumpdb.compare.align.NEIGHBOURS` places either side of its bench tensor's
    (the whole kind when that tensor is of another kind), the pair's own bench tensor
    left out; one fits when all eight statistics are finite and both L2 norms are 0 or
    :func:`~dumpdb.compare.align.stat_distance`'s formula is below
    :data:`~dumpdb.compare.align.FITS` (NaN: not below, as DuckDB's greatest). The
    statistics and ids are read, not the relations: no registration, no temp table (the
    SQL's DISTINCT, join and four temp tables over every bench row were most of the
    content check's CPU on 500,000 pairs). None when a column does not encode (a type the
    two sides do not share, a shape of other than integers, statistics not float64) or the
    candidates are too many to enumerate: the SQL decides then. ``bench_in_order``: the
    bench rows are in execution order (their places numbered without a look)."""
    kind = (*group_by, "graph_id", "op_type", "io", "slot", "slot_path", "arg_name", "shape")
    stats = _STATS
    if any(c not in side.column_names for c in (*kind, *stats, "tensor_id") for side in (target, bench)):
        return None
    if any(side.schema.field(c).type != pa.float64() for c in stats for side in (target, bench)):
        return None
    try:
        rows = row_positions(target.column("tensor_id"), wrong.column("target_tensor_id"))
        partner = row_positions(bench.column("tensor_id"), wrong.column("bench_tensor_id"))
    except ValueError:
        return None
    m = rows.size
    x = target.select([c for c in dict.fromkeys((*kind, *stats, *(("dtype",) if "dtype" in target.column_names
                                                                    else ())))]).take(pa.array(rows))
    codes = np.zeros(m + bench.num_rows, np.int64)
    card = 1
    for t_col, b_col in [*((x.column(c), bench.column(c)) for c in kind), (_dtype_classes(x), _dtype_classes(bench))]:
        encoded = _encode(t_col, b_col)
        if encoded is None:
            return None
        code, n = encoded
        if card * n >= 1 << 62:  # renumber densely first: the combined number stays in int64
            codes, card = _dense(codes)
        codes = codes * n + code
        card *= n
    codes, _ = _dense(codes)
    kx, kb = codes[:m], codes[m:]
    cnt = np.bincount(kb, minlength=int(codes.max()) + 1)
    start = np.concatenate(([0], np.cumsum(cnt)[:-1]))
    r = _places_in_kind(kb, np.arange(kb.size, dtype=np.int64) if bench_in_order else _order_numbers(bench))
    at = np.empty(kb.size, np.int64)  # the bench row at each (kind, place), kinds one after the other
    at[start[kb] + r] = np.arange(kb.size, dtype=np.int64)
    same = kb[partner] == kx
    pr = r[partner]
    last = cnt[kx] - 1
    lo = np.where(same, np.maximum(pr - NEIGHBOURS, 0), 0)
    hi = np.where(same, np.minimum(pr + NEIGHBOURS, last), last)
    length = np.maximum(hi - lo + 1, 0)
    total = int(length.sum())
    if total > _MAX_CANDIDATES:
        return None
    pair = np.repeat(np.arange(m, dtype=np.int64), length)
    first = np.concatenate(([0], np.cumsum(length)[:-1]))
    cand = at[start[kx[pair]] + lo[pair] + np.arange(total, dtype=np.int64) - first[pair]]
    keep = cand != partner[pair]
    pair, cand = pair[keep], cand[keep]
    t = [x.column(c).to_numpy()[pair] for c in stats]
    b = [bench.column(c).to_numpy()[cand] for c in stats]
    finite = np.logical_and.reduce([np.isfinite(v) for v in (*t, *b)]) if pair.size else np.zeros(0, bool)
    # the element count of each target tensor as DuckDB's list_aggregate(shape, 'product'):
    # a DOUBLE product of its numbers in turn, NULL for no number (then 1), at least 1
    k = np.array([max(_product(s), 1.0) for s in x.column("shape").to_pylist()], np.float64)[pair]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        l2 = np.maximum(np.abs(t[0]), np.abs(b[0]))
        scale = l2 / np.sqrt(k)
        distance = np.maximum(np.maximum(np.abs(t[0] - b[0]) / l2, np.abs(t[1] - b[1]) / scale),
                              np.maximum(np.abs(t[2] - b[2]) / scale, np.abs(t[3] - b[3]) / scale))
        fits = finite & ((l2 == 0) | (distance < FITS))
    return bool(fits.any())


_MAX_CANDIDATES = 1 << 24  # _partner_fits: more candidate rows than this go to the SQL


def _product(shape: list | None) -> float:
    """DuckDB's ``coalesce(list_aggregate(shape, 'product'), 1)``: the numbers (NULLs left
    out) multiplied in turn as doubles; 1.0 for NULL or no number."""
    numbers = [float(v) for v in shape or () if v is not None]
    if not numbers:
        return 1.0
    out = 1.0
    for v in numbers:
        out *= v
    return out


def _encode(t_col: pa.ChunkedArray | pa.Array, b_col: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, int] | None:
    """One integer per value (int64, 0 up to the number returned beside them) of ``t_col``
    then ``b_col``, equal where the values are (NULL equal to NULL: IS NOT DISTINCT FROM);
    a list as the bytes of its numbers (a list of integers only). The bench column is
    dictionary-encoded in place, the few target values looked up in its dictionary (a
    value the bench lacks: one number beyond them, a kind without bench rows however
    many such values share it). None for columns of types that do not meet (the target's
    not cast to the bench's)."""
    t_arr = _one(t_col)
    b_arr = _one(b_col)
    try:
        if t_arr.type != b_arr.type:
            t_arr = t_arr.cast(b_arr.type)
        if pa.types.is_list(b_arr.type) or pa.types.is_large_list(b_arr.type):
            t_bytes, b_bytes = _list_bytes(t_arr), _list_bytes(b_arr)
            if t_bytes is None or b_bytes is None:
                return None
            t_arr, b_arr = t_bytes, b_bytes
        elif pa.types.is_floating(b_arr.type) or pa.types.is_nested(b_arr.type):
            return None  # NaN and nested values: not encoded here
        encoded = pc.dictionary_encode(b_arr, null_encoding="encode")
        found = pc.index_in(t_arr, value_set=encoded.dictionary, skip_nulls=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    n = len(encoded.dictionary)
    t_codes = pc.fill_null(found, n).to_numpy(zero_copy_only=False).astype(np.int64)
    return np.concatenate((t_codes, encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64))), n + 1


def _list_bytes(lists: pa.Array) -> pa.Array | None:
    """Each list of integers as the bytes of its numbers (large_binary; NULL for NULL, empty
    for empty: two lists equal exactly when their bytes are, for one value type); None
    for a NULL number in a list."""
    if not pa.types.is_integer(lists.type.value_type):
        return None
    flat = pc.list_flatten(lists)
    if flat.null_count:
        return None
    width = lists.type.value_type.bit_width // 8
    length = pc.fill_null(pc.list_value_length(lists), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    offsets = np.concatenate(([0], np.cumsum(length))) * width
    data = np.ascontiguousarray(flat.to_numpy(zero_copy_only=False))
    raw = pa.Array.from_buffers(pa.large_binary(), len(lists), [None, pa.py_buffer(offsets.astype(np.int64)),
                                                                pa.py_buffer(data.view(np.uint8))])
    return pc.if_else(lists.is_valid(), raw, pa.scalar(None, pa.large_binary()))


def _dense(codes: np.ndarray) -> tuple[np.ndarray, int]:
    """``codes`` (int64) renumbered 0 up in order of first appearance, and their number."""
    encoded = pc.dictionary_encode(pa.array(codes))
    return encoded.indices.to_numpy().astype(np.int64), len(encoded.dictionary)


def _places_in_kind(kid: np.ndarray, eo: np.ndarray) -> np.ndarray:
    """Each row's ``row_number() OVER (PARTITION BY kid ORDER BY eo) - 1`` (int64): its
    place among the rows of its ``kid`` in ``eo`` order (``kid``, ``eo``: int64 per row,
    ``eo`` unique and not negative, :func:`_order_numbers`). The rows put in ``eo`` order
    by their numbers (no sort), then grouped by ``kid`` keeping that order (a stable sort;
    a radix sort when the kinds fit 16 bits)."""
    n = kid.size
    if n == 0:
        return np.zeros(0, np.int64)
    at = np.full(int(eo.max()) + 1, -1, np.int64)
    at[eo] = np.arange(n, dtype=np.int64)
    rows = at[at >= 0]  # the rows in eo order
    k = kid[rows]
    small = k.astype(np.uint16) if int(k.min()) >= 0 and int(k.max()) < 1 << 16 else k
    grouped = rows[np.argsort(small, kind="stable")]  # by kid, in eo order within one
    kg = kid[grouped]
    starts = np.flatnonzero(np.concatenate(([True], kg[1:] != kg[:-1])))
    first = np.repeat(starts, np.diff(np.concatenate((starts, [n]))))
    out = np.empty(n, np.int64)
    out[grouped] = np.arange(n, dtype=np.int64) - first
    return out


def _dtype_classes(table: pa.Table) -> pa.Array:
    """:func:`~dumpdb.compare.align.dtype_class` of each row's ``dtype`` (string; NULL
    without one, or where the table has no dtype), computed once per distinct dtype."""
    if "dtype" not in table.column_names:
        return pa.nulls(table.num_rows, pa.string())
    enc = pc.dictionary_encode(_one(table.column("dtype")))
    classes = pa.array([dtype_class(d) for d in enc.dictionary.to_pylist()], pa.string())
    return pc.take(classes, enc.indices)


def _order_numbers(table: pa.Table) -> np.ndarray:
    """Each row's place (int64, 0 upwards) in align's execution order (``_ORDER``: iteration,
    rank, graph_id, position, timestamp, tensor_id, NULLs last). The row number itself when
    the rows already come in that order (one pass comparing each row with the next: the
    usual case, a run's tensors read as they were ingested), else from a sort
    (``tensor_id`` is unique on a side: the order is total either way) on the keys that
    differ between rows (a key of one value, or NULL, on every row orders nothing)."""
    n = table.num_rows
    keys = _order_keys(table)
    if _ascending(keys, n):
        return np.arange(n, dtype=np.int64)
    out = np.empty(n, np.int64)
    out[np.lexsort(keys[::-1])] = np.arange(n, dtype=np.int64)
    return out


def _order_keys(table: pa.Table) -> list[np.ndarray]:
    """Sort keys (int64, most significant first) of ``_ORDER``, NULLs last, leaving out a
    column of one value (or NULL) on every row: it orders nothing."""
    n = table.num_rows
    keys = []
    for c in _ORDER if n > 1 else ():
        arr = _one(table.column(c))
        if arr.null_count == n:
            continue  # NULL on every row: orders nothing
        if arr.null_count:
            keys.append((~arr.is_valid().to_numpy(zero_copy_only=False)).astype(np.int64))
        values = ints(arr, 0)
        if values.min() < values.max():  # one value on every row orders nothing either
            keys.append(values)
    return keys


def _ascending(keys: Sequence[np.ndarray], n: int) -> bool:
    """Does each of the ``n`` rows sort strictly before the next on ``keys``
    (:func:`_order_keys`)? One pass comparing each row with the next."""
    if n < 2:
        return True
    before = np.zeros(n - 1, bool)  # row i sorts before row i + 1 on the keys so far
    tied = np.ones(n - 1, bool)
    for k in keys:
        before |= tied & (k[:-1] < k[1:])
        tied &= k[:-1] == k[1:]
    return bool(before.all())


def _positional_pairs(target: pa.Table, bench: pa.Table, group_by: Sequence[str]) -> pa.Table | None:
    """The exact rule's pairs (``target_tensor_id``, ``bench_tensor_id``) without a join,
    when both sides hold as many rows, each already in execution order (``_ORDER``, row by
    row: :func:`_ascending`), and row i of the target has the key of row i of the bench
    (group columns, ``op_name``, ``io``, ``slot``, ``slot_path``, ``arg_name``, NULL equal
    to NULL; the shape too where the name holds ``-op``, so the element count ``size`` is
    equal where it counts): then each key is held at the same places on the two sides, its
    k-th tensor in execution order on one side is at the place of the k-th on the other,
    and the rule pairs row i with row i (two runs of one model dumped alike, their rows
    read in ingest order). None otherwise (the join decides), also for columns of types
    that do not compare."""
    n = target.num_rows
    if n != bench.num_rows or n == 0:
        return None
    if not all(_ascending(_order_keys(side), n) for side in (target, bench)):
        return None
    try:
        if not all(_same(target.column(c), bench.column(c))
                   for c in (*group_by, "op_name", "io", "slot", "slot_path", "arg_name")):
            return None
        # the shapes of every row equal (a few ms): no name scan for '-op' (40 ms on 500,000)
        if not _same_lists(target.column("shape"), bench.column("shape")):
            named = pc.fill_null(pc.match_substring(target.column("op_name"), "-op"), False)
            if pc.any(named).as_py() and not _same_lists(target.column("shape").filter(named),
                                                         bench.column("shape").filter(named)):
                return None
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError):
        return None
    return pa.table({"target_tensor_id": target.column("tensor_id"), "bench_tensor_id": bench.column("tensor_id")})


def _same(a: pa.ChunkedArray | pa.Array, b: pa.ChunkedArray | pa.Array) -> bool:
    """Equal row by row, NULL equal to NULL (SQL ``IS NOT DISTINCT FROM``)."""
    if len(a) != len(b):
        return False
    if a.null_count == len(a) and b.null_count == len(b):
        return True  # NULL on every row of both
    if not a.null_count and not b.null_count:
        return bool(pc.all(pc.equal(a, b)).as_py())
    equal = pc.fill_null(pc.equal(a, b), False)
    return bool(pc.all(pc.or_(equal, pc.and_(pc.is_null(a), pc.is_null(b)))).as_py())


def _same_lists(a: pa.ChunkedArray, b: pa.ChunkedArray) -> bool:
    """Lists (``shape``) equal row by row, NULL equal to NULL: the same lengths (NULL where
    the list is), then the same values in turn."""
    a, b = _one(a), _one(b)
    return _same(pc.list_value_length(a), pc.list_value_length(b)) and \
        _same(pc.list_flatten(a), pc.list_flatten(b))
