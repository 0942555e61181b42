"""The compare engine: select, align, stream tensors, compute metrics, judge, store.

``compare(archive, "fp16:0", "fp32:0")`` pairs the tensors of two selections (a
run, optionally one iteration and rank of it), computes every metric of
:mod:`dumpdb.compare.metrics` per pair, applies msprobe's verdict rules per op
(:mod:`dumpdb.compare.verdict`), stores the result as one ``compares`` row plus
``compare_results`` / ``compare_unmatched`` rows, and returns the results as an
Arrow table.

Memory stays bounded: pairs are read from the store a few at a time (at most
``INFLIGHT_BYTES`` of payload in flight), metrics are computed in chunks, and a
payload shared by both sides (same content hash: unchanged parameters, identical
activations) is read once. Large pairs run on one worker thread per core (``workers``);
worker processes only where the GIL would bind: more than ``THREAD_MAX_WORKERS`` workers
on a comparison of ``PROCESS_MIN_BYTES_MANY`` or more, or any comparison of
``PROCESS_MIN_BYTES`` or more (see :func:`_pool`). A large pair whose two payloads
(hashes, dtypes, shapes) an earlier pair already compared takes that pair's metrics.

Fast paths (issue 13), each giving what the pair-by-pair path gives (tests/test_compare_fast.py,
tests/test_compare_stats_sql.py, tests/test_compare_align_sql.py):

* a pair whose payloads have the same content hash, dtype and shape, with dumpdb's own
  NaN/Inf counts in the catalog, is not read: :func:`~dumpdb.compare.metrics.identical_metrics`;
* pairs of at most ``SMALL_ELEMENTS`` elements a side (without plug-in metrics) are read in
  storage order, a batch at a time (``TensorStore.read_many``: views of each pack chunk,
  decoded once), and computed ``BATCH_ELEMENTS`` at a time by
  :func:`~dumpdb.compare.metrics.tensor_metrics_batch` (bit for bit the per-pair values);
* a large pair of the same two payloads (hashes, dtypes, shapes, catalog ranges) as an
  earlier one takes its metrics (tests/test_compare_large.py);
* a large pair whose extremes the catalog gives is cut into segments of
  ``metrics.SEGMENT_CHUNKS`` chunks that the worker threads compute at once, folded in chunk
  order (:func:`~dumpdb.compare.metrics.split_pair`: tensor_metrics' bits; the next pairs
  are read meanwhile, up to ``INFLIGHT_BYTES``);
* statistics-mode metrics of all pairs are one DuckDB query
  (:func:`~dumpdb.compare.stats_sql.statistics_metrics`);
* when every pair is compared by its statistics (``mode="statistics"``, or ``auto`` with a
  side without payloads) and no mapping is given, alignment, both sides' rows and the
  metrics come from one DuckDB connection (:func:`~dumpdb.compare.stats_pairs.statistics_pairs`;
  ``statistics`` mode also selects no payload columns) and the tensor store is not opened;
  msprobe's verdicts and the precision rules then run over columns as for any compare;
* without a mapping, the ``exact`` strategy runs as one DuckDB query
  (:func:`~dumpdb.compare.align_sql.align_exact`) and align() only when later strategies
  have tensors left to pair;
* the large pairs that query finds start on the worker threads while the rest of the
  alignment runs (:class:`_EarlyPairs`: results kept by payload, taken only for a final
  pair of the same payloads; tests/test_compare_large.py).

Results as columns (issue 13): the pairs stay Arrow tables from selection to stored result
(:func:`_pair_sides`: both sides' rows in target execution order,
:func:`~dumpdb.compare.columns.execution_order`); computed metrics land in a
:class:`~dumpdb.compare.columns.ResultColumns` (one float64 array and validity mask per
metric, one message array); msprobe's verdicts
(:func:`~dumpdb.compare.verdict.op_results_columns`) and the precision rules
(:func:`~dumpdb.compare.precision.judge_precision_columns`) run over those columns; the
summary counts them. A dict per pair remains only where it is inherent: large pairs
computed one at a time in the pool (and every tensor pair when a plug-in metric needs both
arrays), and the precision rules' departing inputs and cancellation candidates
(tests/test_compare_columns.py: the same tables as the pair-by-pair code).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections import defaultdict, deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from threadpoolctl import threadpool_limits

from dumpdb import __version__
from dumpdb.catalog import insert_arrow
from dumpdb.compare import kernel, registry
from dumpdb.compare.align import Alignment, align, load_mapping
from dumpdb.compare.align_sql import align_exact
from dumpdb.compare.choices import MODES, RULES, STRATEGIES
from dumpdb.compare.columns import (
    ResultColumns,
    Shapes,
    execution_keys,
    execution_order,
    filled,
    floats,
    group_codes,
    ints,
    join_messages,
    row_positions,
    run_ranks,
    string_codes,
    strings,
    truthy,
)
from dumpdb.compare.metrics import (
    STAT_METRICS,
    STATS,
    TENSOR_METRICS,
    MetricColumns,
    SplitPair,
    identical_metrics,
    split_pair,
    tensor_metrics,
    tensor_metrics_batch,
)
from dumpdb.compare.precision import NOISE, PrecisionRules, judge_precision_columns, name_masks
from dumpdb.compare.precision import Columns as PrecisionColumns
from dumpdb.compare.stats_pairs import ORDER_KEYS, statistics_pairs
from dumpdb.compare.stats_sql import statistics_metrics
from dumpdb.compare.verdict import Columns as VerdictColumns
from dumpdb.compare.verdict import Thresholds, op_results_columns
from dumpdb.dtypes import from_catalog_name
from dumpdb.errors import DumpdbError
from dumpdb.runtime import quiet_gc, release_free_memory
from dumpdb.storage.sizes import MEDIUM_CHUNK_BYTES

# Payload bytes of the large pairs queued at once. On the thread path a queued pair is read
# as soon as a thread is free, while the segments of the pairs read before it wait behind it
# in the pool's queue: the whole budget is read ahead. 256 MiB put the conv-net pair's peak
# RSS at 0.87-0.97 GB (the 1 GB goal of issue 29) and about 0.7 GB of first-touch page faults
# (clear_page) into its CPU; 128 MiB: 0.68 GB, a quarter fewer faults, the same CPU and wall
# time within noise (docs/compare-kernel.md). Still two pairs of 2 x 32 MiB payloads in
# flight, as the Transformer pair's largest.
INFLIGHT_BYTES = 128 << 20
# Pairs of at most SMALL_ELEMENTS elements a side are read in storage order and computed
# BATCH_ELEMENTS at a time by metrics.tensor_metrics_batch (segment reductions: ~10 us a
# pair instead of ~0.3 ms for tensor_metrics' ~60 numpy calls).
SMALL_ELEMENTS = 1 << 16
BATCH_ELEMENTS = 1 << 19

# Compares of at most this many pairs store their rows while the precision rules run
# (_verdicts_and_precision); larger ones after them. The insert beside the rules adds to the
# rules' peak what DuckDB holds (the row groups it builds uncompressed, then the blocks it
# wrote) and the stored columns: at 100,000 pairs the process peak rose from ~330 to ~395
# MB (~0.65 KB a pair), at 500,000 from ~910 to ~1040 MB, over issue 29's 1000 MiB. A
# memory limit on the writer is no way out: below a row group (122,880 rows) it fails a
# compare whose last row group stays in the transaction (100,000 pairs at 24 MB: out of
# memory), above it the 500,000-pair peak still rose by 60-90 MB (docs/statistics-compare.md).
# The bound is a memory budget in pairs: ~0.65 KB a pair more on a peak of ~1.5 KB a pair
# (+ ~0.2 GB) stays under 1000 MiB up to ~380,000 pairs; 250,000 leaves room for wider rows.
STORE_BESIDE_ROWS = 250_000

# Columns of compare_results (migrations/003_compare.sql), in table order.
RESULT_COLUMNS = (
    "compare_id", "pair_index", "target_tensor_id", "bench_tensor_id", "target_name", "bench_name",
    "io", "slot", "match_strategy", "mode", *TENSOR_METRICS, *STAT_METRICS, "result", "err_message",
)
# Context the returned table carries besides the stored columns (for reports and CSV export).
CONTEXT_COLUMNS = (
    "iteration", "rank", "graph_id", "call_index", "op_type", "scope_name", "position", "timestamp",
    "target_content_hash", "bench_content_hash", "target_dtype", "bench_dtype",
    "target_shape", "bench_shape", "target_max", "target_min", "target_mean", "target_l2norm",
    "bench_max", "bench_min", "bench_mean", "bench_l2norm", "target_requires_grad",
    "bench_requires_grad", "code_file", "code_line", "code_text", "target_source_file",
    # precision-aware rules (dumpdb.compare.precision)
    "target_dtype_declared", "bench_dtype_declared", "scaled_err", "precision_floor", "precision_ratio",
    "precision_dtype", "precision_result", "precision_reason",
    # alignment evidence (dumpdb.compare.align, dumpdb.compare.args)
    "realigned", "arg_diff",
)


def _plugin_metrics() -> tuple[str, ...]:
    """Registered plug-in metrics (dumpdb.compare.registry): returned, not stored."""
    registry.load_plugins()
    return registry.names(builtin=False)

# select_rows' one-thread queries, one at a time in a process (_one_thread_rows), and their
# Arrow batch size: every row in one batch
_ONE_THREAD = threading.Lock()
_ONE_BATCH = 1 << 40
# the payload location each row gets from blobs, and its type there
_BLOB_COLUMNS = {"array_path": "VARCHAR", "elem_offset": "BIGINT", "elem_count": "BIGINT"}
_SELECT_SQL = """
SELECT t.tensor_id, t.run, t.rank, t.device_id, t.graph_id, t.iteration, t.op_type, t.op_name,
       t.scope_name, t.io, t.slot, t.arg_name, t.slot_path, t.direction, t.timestamp, t.dtype,
       t.dtype_declared,
       t.shape, t.nbytes, t.content_hash, t.min, t.max, t.mean, t.l2norm, t.requires_grad,
       t.nan_count, t.pos_inf_count, t.neg_inf_count, t.stats_source, t.call_index, t.tensor_key,
       t.source_file, {blob_columns},
       e.position, o.code_file, o.code_line, o.code_text
FROM tensors t
{blob_join}
LEFT JOIN execution_order e ON e.run = t.run AND e.rank IS NOT DISTINCT FROM t.rank
     AND e.device_id IS NOT DISTINCT FROM t.device_id AND e.graph_id IS NOT DISTINCT FROM t.graph_id
     AND e.scope_name = t.scope_name
LEFT JOIN ops o ON o.run = t.run AND o.rank IS NOT DISTINCT FROM t.rank
     AND o.device_id IS NOT DISTINCT FROM t.device_id AND o.graph_id IS NOT DISTINCT FROM t.graph_id
     AND o.scope_name = t.scope_name
WHERE {where}
"""


@dataclass(frozen=True)
class Selection:
    """One side of a comparison: a run, optionally one iteration and one rank.

    Written ``RUN``, ``RUN:ITERATION`` or ``RUN:ITERATION:RANK`` on the command
    line (an empty field means "all": ``RUN::1`` is rank 1 of every iteration).
    """

    run: str
    iteration: int | None = None
    rank: int | None = None

    @classmethod
    def parse(cls, spec: str | Selection, iteration: int | None = None, rank: int | None = None) -> Selection:
        """Parse ``RUN[:ITERATION[:RANK]]``; ``iteration``/``rank`` fill fields the spec leaves open.

        Raises DumpdbError for a malformed spec.
        """
        if isinstance(spec, Selection):
            sel = spec
        else:
            parts = spec.split(":")
            if not parts[0] or len(parts) > 3:
                raise DumpdbError(f"bad selection {spec!r}: write RUN, RUN:ITERATION or RUN:ITERATION:RANK")
            try:
                nums = [int(p) if p != "" else None for p in parts[1:]] + [None, None]
            except ValueError:
                raise DumpdbError(f"bad selection {spec!r}: ITERATION and RANK must be integers") from None
            sel = cls(parts[0], nums[0], nums[1])
        return cls(sel.run, sel.iteration if sel.iteration is not None else iteration,
                   sel.rank if sel.rank is not None else rank)

    def where(self) -> tuple[str, list]:
        """SQL condition and parameters selecting this run, iteration and rank (a rankless dump is rank 0)."""
        conds = ["t.run = ?"]
        params: list[Any] = [self.run]
        for column, value in (("iteration", self.iteration), ("rank", self.rank)):
            if value is not None:  # rank 0 includes a dump without ranks (msprobe proc<PID>)
                conds.append("t.iteration = ?" if column == "iteration" else "coalesce(t.rank, 0) = ?")
                params.append(value)
        return " AND ".join(conds), params

    def describe(self) -> str:
        """``run iteration N rank R`` as messages print the selection."""
        parts = [self.run]
        if self.iteration is not None:
            parts.append(f"iteration {self.iteration}")
        if self.rank is not None:
            parts.append(f"rank {self.rank}")
        return " ".join(parts)


@dataclass
class CompareOutcome:
    """What :func:`compare` returns: results (Arrow, one row per pair, in target
    execution order), unmatched tensors, the summary, and the first divergence."""

    compare_id: int | None
    results: pa.Table
    unmatched: pa.Table
    summary: dict[str, Any]
    first_divergence: dict[str, Any] | None = field(default=None)


def select_rows(con, sel: Selection, drop: Sequence[str] = ()) -> pa.Table:
    """The ``tensors`` rows of a selection with what compare needs beside them (blob
    location, execution-order position, code line), as Arrow, without the columns ``drop``.
    Raises DumpdbError for an unknown run or an empty selection."""
    return select_sides(con, [(sel, drop)])[0]


def select_sides(con, sides: Sequence[tuple[Selection, Sequence[str]]]) -> list[pa.Table]:
    """:func:`select_rows` of each (selection, drop) of ``sides``, their queries run at once
    (:func:`_one_thread_rows`). Raises DumpdbError as select_rows, for the first side in
    ``sides``' order without rows."""
    queries = []
    for sel, drop in sides:
        where, params = sel.where()
        if set(_BLOB_COLUMNS) <= set(drop):  # no payload location read (statistics): no join with blobs
            query = _SELECT_SQL.format(where=where, blob_join="", blob_columns=", ".join(
                f"NULL::{kind} AS {name}" for name, kind in _BLOB_COLUMNS.items()))
        else:
            query = _SELECT_SQL.format(where=where, blob_join="LEFT JOIN blobs b ON b.content_hash = t.content_hash",
                                       blob_columns=", ".join(f"b.{name}" for name in _BLOB_COLUMNS))
        if drop:
            query = f"SELECT * EXCLUDE ({', '.join(drop)}) FROM ({query})"
        queries.append((query, params))
    tables = _one_thread_rows(con, queries)
    for (sel, _), table in zip(sides, tables):
        if table.num_rows == 0:
            known = con.execute("SELECT count(*) FROM runs WHERE run = ?", [sel.run]).fetchone()[0]
            if not known:
                from dumpdb.errors import no_such_run

                raise no_such_run(sel.run, "the archive", con)
            raise DumpdbError(f"no tensors in {sel.describe()}")
    return tables


def _one_thread_rows(con, queries: Sequence[tuple[str, list]]) -> list[pa.Table]:
    """The rows of each (query, params) of ``queries``, each on one DuckDB thread
    (select_sides), one Arrow chunk a column and usually in the catalog's row order (a
    run's ingest order, usually its execution order; a join DuckDB turns around may not
    keep it: stats_pairs._by_id checks), where a parallel run's threads hand their parts
    back out of order as several chunks: the compare would then copy every column into
    order (stats_pairs._by_id; engine._one_chunk). The queries run at once, each on its own
    cursor of ``con`` from its own Python thread (DuckDB releases the GIL): a compare's two
    sides on two cores; a query a cursor cannot run (a relation registered on ``con``
    alone: an exported bundle's tables, archival.remote_bundle) runs on ``con`` after. A
    column of more than 2 GiB of text, which one Arrow string array cannot hold, comes in
    DuckDB's own batches. The thread count is the DuckDB instance's, shared by every
    connection to the catalog in this process: set back after, one call at a time (another
    query meanwhile runs on one thread); a connection whose configuration is locked runs
    the queries one after the other as they are."""
    import duckdb

    def rows(cursor, query: str, params: list) -> pa.Table:
        try:
            return cursor.sql(query, params=params).to_arrow_table(batch_size=_ONE_BATCH)
        except duckdb.InvalidInputException as exc:
            if "string size" not in str(exc):
                raise
            return cursor.sql(query, params=params).to_arrow_table()

    def beside(cursor, query: str, params: list) -> pa.Table | None:
        try:
            return rows(cursor, query, params)
        except duckdb.CatalogException:
            return None  # not visible to a cursor: run on con after

    with _ONE_THREAD:
        try:
            threads = int(con.sql("SELECT current_setting('threads')").fetchall()[0][0])
            con.execute("SET threads = 1")
        except duckdb.Error:
            return [con.sql(query, params=params).to_arrow_table() for query, params in queries]
        cursors: list = []
        try:
            cursors.extend(con.cursor() for _ in queries[1:])
            if not cursors:
                return [rows(con, *queries[0])]
            with ThreadPoolExecutor(max_workers=len(cursors), thread_name_prefix="dumpdb-compare-select") as pool:
                later = [pool.submit(beside, cursor, *query) for cursor, query in zip(cursors, queries[1:])]
                first = rows(con, *queries[0])
                found = [f.result() for f in later]
            return [first, *(table if table is not None else rows(con, *query)
                             for table, query in zip(found, queries[1:]))]
        finally:
            for cursor in cursors:
                cursor.close()
            con.execute(f"SET threads = {threads}")


def _proc_as_rank0(rows: pa.Table, other: pa.Table) -> pa.Table:
    """``rows`` with rank 0 for rank NULL when ``rows`` has no rank at all and ``other`` has."""
    if rows.column("rank").null_count == rows.num_rows and other.column("rank").null_count < other.num_rows:
        i = rows.column_names.index("rank")
        return rows.set_column(i, "rank", pa.array([0] * rows.num_rows, rows.schema.field("rank").type))
    return rows


def _group_by(target: Selection, bench: Selection) -> tuple[str, ...]:
    """Columns a pair must agree on: iteration unless each side picked its own,
    rank likewise (comparing run A with run B step by step and rank by rank)."""
    cols = []
    if target.iteration is None or bench.iteration is None:
        cols.append("iteration")
    if target.rank is None or bench.rank is None:
        cols.append("rank")
    return tuple(cols)


_LOC_KEYS = ("array_path", "elem_offset", "elem_count", "dtype", "shape", "content_hash")


def _loc(row: dict) -> tuple:
    """What a worker needs to read one payload (small and picklable)."""
    return tuple(row[k] for k in _LOC_KEYS)


def _exact_range(row: dict) -> tuple[float, float] | None:
    """(min, max) when dumpdb computed them and the tensor has no NaN/Inf: then they are
    exactly the extremes the metrics' first pass would find. Statistics a dump supplied
    (statistic.csv, dump.json) may come from lower-precision device arithmetic: not used."""
    if row["stats_source"] != "computed" or row["nan_count"] or row["pos_inf_count"] or row["neg_inf_count"]:
        return None
    if row["min"] is None or row["max"] is None:
        return None
    return row["min"], row["max"]


def _ranges(t: dict, b: dict):
    rt, rb = _exact_range(t), _exact_range(b)
    return (*rt, *rb) if rt and rb else None


def _read(store, loc: tuple) -> np.ndarray:
    array_path, offset, count, dtype, shape, content_hash = loc
    return store.read(array_path, offset, count or 0, from_catalog_name(dtype), tuple(shape), content_hash)


def _read_many(store, locs: list[tuple]) -> list[np.ndarray]:
    """The payloads at ``locs`` (read-only arrays, TensorStore.read_many), in order."""
    dtypes: dict[str, np.dtype] = {}
    for loc in locs:
        if loc[3] not in dtypes:
            dtypes[loc[3]] = from_catalog_name(loc[3])
    return store.read_many([(loc[0], loc[1], loc[2] or 0, dtypes[loc[3]], tuple(loc[4]), loc[5]) for loc in locs])


def _same_payload(t: tuple, b: tuple) -> bool:
    """Whether the two sides' locations (:func:`_loc`) are one payload: same hash, dtype, shape."""
    return t[5] == b[5] and t[3] == b[3] and list(t[4]) == list(b[4])


def _read_pair_writable(store, t: tuple, b: tuple) -> tuple[np.ndarray, np.ndarray]:
    """Both payloads of a pair as new, writable arrays (for plug-in metrics, worker processes
    and cluster tasks); a payload both sides share (:func:`_same_payload`) is read once."""
    a = _read(store, t)
    return a, a if _same_payload(t, b) else _read(store, b)


def _read_pair(store, t: tuple, b: tuple) -> tuple[np.ndarray, np.ndarray]:
    """Both payloads of a large pair for the worker threads, read-only
    (:meth:`~dumpdb.storage.store.TensorStore.read_many`): a payload lying in one pack chunk is
    a view of the store's chunk cache, not a copy into a new array (the Transformer pair's
    compare copied ~0.78 GB of its 1.74 GB so); a payload both sides share (same hash, dtype,
    shape) is read once. The metrics read any array as read-only (kernel._readonly), so they
    are the same bits; a view holds its whole chunk while the pair is in flight
    (:func:`_held_bytes`)."""
    if _same_payload(t, b):
        a = _read_many(store, [t])[0]
        return a, a
    a, c = _read_many(store, [t, b])
    return a, c


def _plain_bytes(x: dict, y: dict) -> int:
    """Memory a large pair in flight holds when both payloads are read as new arrays
    (:func:`_read_pair_writable`): their bytes."""
    return (x["nbytes"] or 0) + (y["nbytes"] or 0)


def _held_bytes(x: dict, y: dict) -> int:
    """Memory a large pair in flight may hold when read by :func:`_pair_in_thread`
    (``INFLIGHT_BYTES`` counts it): its payload bytes, each pack payload counted as at least
    a 4 MiB pack chunk it may lie in and hold (:func:`_read_pair`: a view of the chunk cache;
    a payload in a pack of smaller chunks is over-counted, which is safe)."""
    return sum(max(row["nbytes"] or 0, MEDIUM_CHUNK_BYTES) if row["elem_offset"] is not None else row["nbytes"] or 0
               for row in (x, y))


def _pair_metrics(store, t: tuple, b: tuple, ranges=None) -> tuple[dict, str | None]:
    """Metrics of one pair, read and computed here (:func:`_read_pair_writable`, :func:`_metrics_of`)."""
    return _metrics_of(*_read_pair_writable(store, t, b), ranges)


class _Segments:
    """A pair computed as :class:`~dumpdb.compare.metrics.SplitPair` segment tasks on the pool."""

    def __init__(self, split: SplitPair, futures: list) -> None:
        self.split, self.futures = split, futures

    def result(self) -> tuple[dict, str | None]:
        return self.split.finish([f.result() for f in self.futures])


def _pair_in_thread(pool, store, t: tuple, b: tuple, ranges) -> tuple[dict, str | None] | _Segments:
    """A worker thread's task for one large pair: read it; a pair whose extremes the catalog
    gives (:func:`_ranges`) and split_pair accepts is cut into segments queued on ``pool``
    (both cores work on one big pair; folded in chunk order: tensor_metrics' bits), any
    other pair computed here. Never waits on the pool (no deadlock): the caller folds."""
    a, c = _read_pair(store, t, b)
    split = split_pair(a, c, ranges) if ranges is not None else None
    if split is None:
        return _metrics_of(a, c, ranges)
    return _Segments(split, [pool.submit(task) for task in split.tasks()])


def _metrics_of(a: np.ndarray, c: np.ndarray, ranges=None) -> tuple[dict, str | None]:
    """:func:`~dumpdb.compare.metrics.tensor_metrics` of a pair, plus ``flat_euc_dist`` and
    the plug-in metrics."""
    metrics, message = tensor_metrics(a, c, ranges=ranges)
    if a.shape != c.shape and a.size == c.size and a.size:
        # a reshape on one side only (AMP adds some): the precision rules compare the values
        # in C order; msprobe's columns keep their shape-mismatch None
        metrics["flat_euc_dist"] = tensor_metrics(a.reshape(-1), c.reshape(-1))[0]["euc_dist"]
    for m in registry.metrics("tensor", builtin=False):
        try:
            metrics[m.name] = m.function(a, c) if a.shape == c.shape else None  # type: ignore[misc]
        except (ValueError, TypeError, ArithmeticError) as exc:
            metrics[m.name] = None
            message = "; ".join(x for x in (message, f"{m.name}: {exc}") if x)
    return metrics, message


# Worker processes: numpy releases the GIL inside each operation; the metrics make ~40
# calls per 64 Ki-element chunk (~0.6 ms of work, ~0.1 ms holding the GIL), so threads
# scale on a few cores once BLAS is held to one thread, without the ~1.5-3 s a forkserver
# pool takes to start (imports in each worker) and without reading a payload in another
# process. Processes remain for comparisons so large that the GIL share would bind.
_WORKER_STORE = None


def _init_worker(zstore, verify: bool = True) -> None:
    global _WORKER_STORE
    from dumpdb.storage.store import TensorStore

    # The metrics' dot products run on cache-sized chunks: BLAS threads only
    # contend with the other workers (measured: 2 processes 13 s -> 3 s).
    threadpool_limits(1, user_api="blas")
    registry.load_plugins()
    _WORKER_STORE = TensorStore(zstore, read_only=True, verify=verify)  # the parent's opt-out, if any


def _pair_metrics_in_worker(t: tuple, b: tuple, ranges=None) -> tuple[dict, str | None]:
    return _pair_metrics(_WORKER_STORE, t, b, ranges)


PROCESS_MIN_BYTES = 16 << 30  # below this, worker threads finish before worker processes would have started
THREAD_MAX_WORKERS = 4  # ~1/6 of the metrics' time holds the GIL: threads stop scaling beyond a few
PROCESS_MIN_BYTES_MANY = 64 << 20  # with more workers than that, processes from this size on


@quiet_gc()  # the whole compare (a statistics compare builds 10^5 rows of Python objects), not only tensor work
def compare(archive, target: str | Selection, bench: str | Selection, *, iteration: int | None = None,
            rank: int | None = None, mapping: str | os.PathLike | Mapping[str, str] | None = None,
            strategies: Sequence[str] = STRATEGIES, thresholds: Thresholds | None = None,
            mode: str = "auto", workers: int | None = None, store_results: bool = True,
            progress: Callable[[int, int], None] | None = None, bench_rank: int | None = None,
            rules: str = "precision", precision: PrecisionRules | None = None,
            scheduler: str | None = None) -> CompareOutcome:
    """Compare two selections of an archive (see module docstring).

    ``target``/``bench``: ``RUN[:ITERATION[:RANK]]`` or :class:`Selection`;
    ``iteration``/``rank`` apply to both sides where the spec leaves them open;
    ``bench_rank`` overrides ``rank`` on the bench side (1-card baseline vs one rank of an
    8-card run). A single-process dump without a rank (msprobe ``proc<PID>``) is rank 0
    when the other side has ranks (msprobe names ``rank{R}`` only once torch.distributed
    is initialised, formats.md 1.2).
    ``mapping``: a mapping file (CSV or YAML, see :func:`~dumpdb.compare.align.load_mapping`)
    or a dict target name -> bench name. ``mode``: ``auto`` (tensor metrics where
    both payloads exist, statistics otherwise), ``tensor`` or ``statistics``.
    ``progress(done, total)`` is called as pairs finish. ``rules``: ``precision``
    (default: :mod:`dumpdb.compare.precision`, tuned by ``precision``) or ``msprobe``
    (msprobe's verdicts, column ``result``) decide the summary counts and the first
    divergence; both are always computed (``result`` and ``precision_result``), and the
    msprobe CSV always carries msprobe's. ``scheduler``: read and compute the payloads on
    the ``dask.distributed`` cluster at that address, or ``"local"`` (a LocalCluster of
    ``workers`` processes): the same rows, bit for bit (:mod:`dumpdb.compare.distributed`).

    Returns a :class:`CompareOutcome`; with ``store_results`` the comparison is
    also stored (``compares``, ``compare_results``, ``compare_unmatched``).
    Raises DumpdbError for an unknown run, an empty selection or a bad mode.
    """
    if mode not in MODES:
        raise DumpdbError(f"unknown compare mode {mode!r}: use auto, tensor or statistics")
    if rules not in RULES:
        raise DumpdbError(f"unknown rules {rules!r}: use precision or msprobe")
    thresholds = thresholds or Thresholds()
    tsel = Selection.parse(target, iteration, rank)
    bsel = Selection.parse(bench, iteration, rank if bench_rank is None else bench_rank)
    try:
        mapping_dict = load_mapping(os.fspath(mapping)) if isinstance(mapping, (str, os.PathLike)) else mapping
    except (OSError, ValueError) as exc:
        raise DumpdbError(f"mapping file: {exc}") from exc
    with archive.reader() as con:
        if bench_rank is not None and tsel.rank is None and not con.execute(
                "SELECT count(*) FROM tensors WHERE run = ? AND rank IS NOT NULL", [tsel.run]).fetchall()[0][0]:
            tsel = Selection(tsel.run, tsel.iteration, 0)  # a rankless target is rank 0 vs the bench's rank
        drop = _NOT_READ_BY_STATISTICS if mode == "statistics" else ()
        trows, brows = select_sides(con, [(tsel, drop), (bsel, (*drop, *_TARGET_ONLY))])
    trows, brows = _proc_as_rank0(trows, brows), _proc_as_rank0(brows, trows)
    # every pair compared by its statistics: no payload is read, whatever pairs
    statistics_only = mode == "statistics" or (mode == "auto" and (
        trows.column("content_hash").null_count == trows.num_rows
        or brows.column("content_hash").null_count == brows.num_rows))
    if not statistics_only and scheduler is None:
        # numba and the kernel load (~1 CPU s, mostly holding the GIL) while DuckDB aligns and
        # the first payloads are read (both release it), not after them on the first pair
        kernel.preload()
    stats = None
    alignment: Alignment | None
    early: _EarlyPairs | None = None
    try:
        if statistics_only and not mapping_dict:  # align, sides and metrics in DuckDB (stats_pairs)
            stats = statistics_pairs(trows, brows, group_by=_group_by(tsel, bsel), strategies=strategies,
                                     target_columns=_SIDE_COLUMNS[0], bench_columns=_SIDE_COLUMNS[1])
        if stats is not None:
            alignment, t, b, metrics = stats
            strategy = _one_chunk(alignment.pairs.column("match_strategy"))
        else:
            # the exact strategy in SQL when it settles the alignment (align_sql), else align();
            # not again when statistics_pairs just found it does not (align gives the same pairs)
            tried = statistics_only and not mapping_dict
            if not (mapping_dict or tried or statistics_only or scheduler is not None or mode == "statistics"):
                # the exact pairs go to the worker threads as soon as the SQL finds them, while the
                # content check and align() run (_EarlyPairs: results by payload, so the same bits)
                early = _EarlyPairs(archive, trows, brows, workers)
            alignment = None if mapping_dict or tried else align_exact(
                trows, brows, group_by=_group_by(tsel, bsel), strategies=strategies,
                on_pairs=early.start if early is not None else None)
            if alignment is None:
                alignment = align(trows, brows, group_by=_group_by(tsel, bsel), mapping=mapping_dict,
                                  strategies=strategies)
    except BaseException as exc:
        if early is not None:
            early.close()
        if isinstance(exc, ValueError):
            raise DumpdbError(f"compare: {exc}") from exc
        raise
    try:
        if stats is None:
            t, b, strategy, realigned = _pair_sides(trows, brows, alignment.pairs)
        else:
            realigned = _one_chunk(alignment.pairs.column("realigned"))
        trows_names, brows_names = _leaf_names(trows, alignment.suspects, ("target_tensor_id",)), \
            _leaf_names(brows, alignment.suspects, ("bench_tensor_id", "better_bench_tensor_id"))
        # what the precision rules' producers need of the whole target selection (nothing when
        # no target tensor has a payload: no input then has a producer); the rest goes
        trows = trows.select(["tensor_id", "io", "content_hash", "op_name", "iteration", "rank", "graph_id", "position",
                              "timestamp", "call_index", "slot"])
        if trows.column("content_hash").null_count == trows.num_rows:
            trows = trows.schema.empty_table()  # not a slice: that would keep the whole columns alive
        del brows
        release_free_memory()
        arg_diff = None
        if stats is not None:
            res = _statistics_columns(stats[3], progress)
            del stats, metrics
        elif mode == "statistics" or (mode == "auto" and not (_valid(t.column("content_hash"))
                                                               & _valid(b.column("content_hash"))).any()):
            res = _compute_statistics_only(t, b, progress)  # no payload to read: the store is not opened
        else:
            # the arg_diff column (catalog queries, DuckDB: off the GIL) while the payloads are compared
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="dumpdb-compare-args") as side, quiet_gc():
                arg_diff = side.submit(_arg_diff, archive, tsel, bsel, t, b)
                res = _compute(archive, t, b, mode, workers, progress, scheduler, early)
    finally:
        if early is not None:
            early.close()  # what it started and nobody took (all pairs identical, or an error)
    kernel.wait_preload()  # loaded by now unless no pair needed it (all identical, statistics)
    view = _view(t, b, strategy, res)
    view.context["realigned"] = realigned
    view.context["arg_diff"] = arg_diff.result() if arg_diff is not None else _arg_diff(archive, tsel, bsel, t, b)
    unmatched = pa.concat_tables([
        alignment.unmatched_target.append_column("side", pa.array(["target"] * alignment.unmatched_target.num_rows)),
        alignment.unmatched_bench.append_column("side", pa.array(["bench"] * alignment.unmatched_bench.num_rows)),
    ], promote_options="default")
    recorded = {  # what the compares row records, known before any verdict
        "mode": _overall_mode(view.mode),
        "unmatched_target": alignment.unmatched_target.num_rows,
        "unmatched_bench": alignment.unmatched_bench.num_rows,
        "strategies": {s: int(pc.sum(pc.equal(strategy, s)).as_py() or 0) for s in strategies},
        "thresholds": thresholds.__dict__ if hasattr(thresholds, "__dict__") else str(thresholds),
    }
    storing = _Storing(archive, tsel, bsel, unmatched, recorded, mapping) if store_results else None
    departure, stored = _verdicts_and_precision(view, trows, thresholds, precision or PrecisionRules(), storing)
    column = view.result if rules == "msprobe" else view.precision["precision_result"]
    summary = {
        "target": tsel.describe(), "bench": bsel.describe(), "pairs": view.n,
        "mode": recorded["mode"],
        "rules": rules,
        **{k: int(np.count_nonzero(column == k)) for k in ("pass", "warning", "error")},
        "noise": int(np.count_nonzero(view.precision["precision_result"] == NOISE)),
        "msprobe_result": {k: int(np.count_nonzero(view.result == k)) for k in ("pass", "warning", "error")},
        "precision_dtype": _lowest_dtype(view.precision["precision_dtype"]),
        "unmatched_target": recorded["unmatched_target"],
        "unmatched_bench": recorded["unmatched_bench"],
        "strategies": recorded["strategies"],
        "realigned": int(pc.sum(realigned).as_py() or 0),
        "suspected_mispairs": _suspected(alignment.suspects, trows_names, brows_names),
        "arg_diffs": _arg_diff_ops(view),
        "thresholds": recorded["thresholds"],
        "dumpdb_version": __version__,
    }
    release_free_memory()  # what the rules freed, before the result table comes on top
    results = _result_table(view, stored)
    del view, res, t, b, stored  # the Arrow table is the result from here on
    compare_id = storing.compare_id if storing is not None else None
    summary["compare_id"] = compare_id
    results = results.set_column(results.column_names.index("compare_id"), "compare_id",
                                 pa.array([compare_id] * results.num_rows, pa.int64()))
    outcome = CompareOutcome(compare_id, results, unmatched, summary)
    outcome.first_divergence = first_divergence_of(results) if rules == "msprobe" else \
        _departure_report(results, departure, sides=_sides_note(tsel, bsel))
    _add_containers(archive, tsel.run, outcome.first_divergence)
    summary["first_difference"] = first_difference_of(results)
    return outcome


_ARG_DIFF_KEYS = ("target_name", "bench_name", "rank", "iteration", "bench_rank", "bench_iteration", "scope_name",
                  "bench_scope_name", "graph_id", "bench_graph_id")


def _arg_diff(archive, tsel: Selection, bsel: Selection, t: pa.Table, b: pa.Table) -> pa.Array:
    """The ``arg_diff`` column of the pairs ``t[i]``/``b[i]``
    (:func:`dumpdb.compare.args.arg_diff_column`): NULL where no scalar argument is recorded
    or the two calls' scalars agree. Reads only the pairs' names and the catalog (no metric)."""
    from dumpdb.compare.args import arg_diff_column

    sides = (t, b)
    ctx = {key: _one_chunk(sides[side].column(column)) for key, side, column in _ROW_FIELDS if key in _ARG_DIFF_KEYS}
    with archive.reader() as con:
        col = arg_diff_column(con, tsel.run, bsel.run, ctx)
    return pa.nulls(t.num_rows, pa.string()) if col is None else pa.array(col, pa.string())


def _arg_diff_ops(view: _View) -> list[dict]:
    """Each compared op whose scalar arguments differ, once, in execution order: target
    name, bench name, ``arg_diff``."""
    col = view.context["arg_diff"]
    if col.null_count == view.n:
        return []
    out: dict[tuple, dict] = {}
    at = np.flatnonzero(pc.is_valid(col).to_numpy(zero_copy_only=False))
    tn, bn = view.context["target_name"], view.context["bench_name"]
    for i in at.tolist():
        key = (tn[i].as_py(), bn[i].as_py())
        out.setdefault(key, {"target": key[0], "bench": key[1], "arg_diff": col[i].as_py()})
    return list(out.values())


def _leaf_names(rows: pa.Table, suspects: pa.Table, columns: Sequence[str]) -> dict[int, str]:
    """tensor_id -> ``op_name io slot`` of the rows the suspects name in ``columns``."""
    if not suspects.num_rows:
        return {}
    ids = pa.concat_arrays([suspects.column(c).combine_chunks() for c in columns])
    found = rows.filter(pc.is_in(rows.column("tensor_id"), ids)).select(["tensor_id", "op_name", "io", "slot"])
    return {r["tensor_id"]: f"{r['op_name']} {r['io']} {r['slot']}" for r in found.to_pylist()}


def _suspected(suspects: pa.Table, target_names: dict, bench_names: dict) -> list[dict]:
    """The alignment's suspected mispairs (:attr:`~dumpdb.compare.align.Alignment.suspects`)
    by name, for the summary: target, bench, the better bench partner, both distances."""
    return [{"target": target_names.get(r["target_tensor_id"]), "bench": bench_names.get(r["bench_tensor_id"]),
             "better_bench": bench_names.get(r["better_bench_tensor_id"]),
             "distance": r["distance"], "better_distance": r["better_distance"]} for r in suspects.to_pylist()]


def _overall_mode(modes: np.ndarray) -> str:
    found = {str(m) for m in set(modes.tolist())}
    return found.pop() if len(found) == 1 else ("mixed" if found else "none")


def _pair_sides(trows: pa.Table, brows: pa.Table,
                pairs: pa.Table) -> tuple[pa.Table, pa.Table, pa.Array, pa.Array]:
    """Both sides' rows of the aligned pairs (``pairs``: target_tensor_id, bench_tensor_id,
    match_strategy, realigned), their strategies and realigned flags, in target execution
    order (:func:`~dumpdb.compare.columns.execution_order` over the paired target rows)."""
    tpos = row_positions(trows.column("tensor_id"), pairs.column("target_tensor_id"))
    bpos = row_positions(brows.column("tensor_id"), pairs.column("bench_tensor_id"))
    order = execution_order(trows.select(list(ORDER_KEYS)).take(tpos))

    def rows(table: pa.Table, at: np.ndarray, side: int) -> pa.Table:
        # only the columns results and metrics read (a bench side needs few)
        table = table.select([c for c in table.column_names if c in _SIDE_COLUMNS[side]])
        # pairs that already come in the side's own row order (run against run): no copy
        if at.size == table.num_rows and np.array_equal(at, np.arange(at.size)):
            return table
        return table.take(at)

    return rows(trows, tpos[order], 0), rows(brows, bpos[order], 1), \
        pairs.column("match_strategy").combine_chunks().take(order), \
        pairs.column("realigned").combine_chunks().take(order)


def _pool(archive, tensor_bytes: int, mode, workers: int):
    """``workers`` worker processes (each pair read and computed whole in one) where the GIL
    would bind, ``workers`` threads otherwise (a pair read by one, then its segments on all:
    :func:`_pair_in_thread`). The same bits either way. Returns (pool, submit(t, b) -> future,
    held(t, b) -> bytes a submitted pair may hold in memory until it is done: :func:`_held_bytes`
    where the threads read chunk-cache views, :func:`_plain_bytes` else)."""
    if mode == "statistics":
        tensor_bytes = 0
    many = workers > THREAD_MAX_WORKERS and tensor_bytes >= PROCESS_MIN_BYTES_MANY
    if workers > 1 and (tensor_bytes >= PROCESS_MIN_BYTES or many):
        import multiprocessing  # here: only a tensor compare with worker processes loads it (~40 ms)
        from concurrent.futures import ProcessPoolExecutor

        ctx = multiprocessing.get_context("forkserver")
        pool: Executor = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init_worker,
                                   initargs=(archive.store.zstore, archive.store.verify))
        return pool, lambda t, b: pool.submit(_pair_metrics_in_worker, _loc(t), _loc(b), _ranges(t, b)), _plain_bytes
    pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="dumpdb-compare")
    store = archive.store
    if registry.metrics("tensor", builtin=False):  # plug-ins see each pair whole
        return pool, lambda t, b: pool.submit(_pair_metrics, store, _loc(t), _loc(b), _ranges(t, b)), _plain_bytes
    return pool, lambda t, b: pool.submit(_pair_in_thread, pool, store, _loc(t), _loc(b), _ranges(t, b)), _held_bytes


_NO_PAYLOAD = "no payload on one side: statistics compared instead"


def _compute(archive, t: pa.Table, b: pa.Table, mode: str, workers, progress,
             scheduler: str | None = None, early: _EarlyPairs | None = None) -> ResultColumns:
    """Metric columns of the pairs ``t[i]``/``b[i]`` (plus ``mode`` per pair in
    ``res.mode``): statistics pairs in one DuckDB query, identical payloads from the
    definitions, small pairs batched, the rest one by one in a pool (``early``'s, when the
    exact pairs were started during the alignment)."""
    n = t.num_rows
    res = ResultColumns(n, (*TENSOR_METRICS, *STAT_METRICS, "flat_euc_dist", *_plugin_metrics()))
    workers = workers or os.cpu_count() or 2
    fast = not registry.metrics("tensor", builtin=False)  # plug-ins need both arrays of every pair
    tensor = np.zeros(n, bool) if mode == "statistics" else \
        _valid(t.column("content_hash")) & _valid(b.column("content_hash"))
    res.mode = np.where(tensor, "tensor", "statistics").astype(object)
    if mode == "tensor":
        res.message[~tensor] = _NO_PAYLOAD
    statistics = np.flatnonzero(~tensor)
    pending = np.flatnonzero(tensor)
    settled = np.zeros(pending.size, bool)
    if fast and pending.size:
        cols = ["content_hash", "dtype", "shape", "stats_source", "nan_count", "pos_inf_count", "neg_inf_count"]
        same = _identical(t.select(cols).take(pending), b.select(cols).take(pending))
        if same is not None:
            settled, metrics = same
            rows = pending[settled]
            for name in TENSOR_METRICS:
                values = metrics.values[name][settled]
                res.put(rows, name, values, ~np.isnan(values))
            res.note(rows, metrics.message[settled])
    done = int(np.count_nonzero(settled))
    pending = pending[~settled]
    small_mask, sizes = _small_pairs(t.select(_SMALL_KEYS).take(pending), b.select(_SMALL_KEYS).take(pending))
    if not fast:
        small_mask[:] = False
    small, large = pending[small_mask], pending[~small_mask]
    done += _compute_statistics(t, b, statistics, res)
    if progress and done:
        progress(done, n)
    small_sizes = sizes[small_mask]
    if scheduler is not None and (small.size or large.size):
        _compute_remote(archive, scheduler, workers, t, b, small, small_sizes, large, fast, res, done, progress)
        return res
    if not large.size:
        with threadpool_limits(1, user_api="blas"):  # as the per-pair paths: the same BLAS sums, bit for bit
            _compute_small(archive.store, t, b, small, small_sizes, res, done, progress)
        return res
    # the small pairs on a thread of their own while the large ones run (the small path's
    # time then overlaps the pool's instead of leaving the cores idle before it)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="dumpdb-compare-small") as helper, \
            threadpool_limits(1, user_api="blas"):
        smalls = helper.submit(lambda: list(_small_batches(archive.store, t, b, small, small_sizes)))
        if early is not None and early.started and fast:
            done = early.finish(t, b, large, res, done, progress)
        else:
            done = _compute_large(archive, t, b, large, mode, workers, fast, res, done, progress)
        for rows, metrics in smalls.result():
            _put_small(res, rows, metrics)
            done += rows.size
    if progress and small.size:
        progress(done, n)
    return res


def _compute_large(archive, t: pa.Table, b: pa.Table, large: np.ndarray, mode: str, workers: int, fast: bool,
                   res: ResultColumns, done: int, progress) -> int:
    """The pairs ``large`` one by one on the pool (:func:`_pool`), into ``res``; repeats of a
    pair computed once. Returns ``done``."""
    n = res.n
    todo, repeats = _plan_large(t, b, large, fast)
    computed: dict[int, tuple[dict, str | None]] = {}
    tensor_bytes = sum(_plain_bytes(x, y) for _, x, y in todo)
    pool, submit, held = _pool(archive, tensor_bytes, mode, workers)
    with pool:
        inflight: deque = deque()
        inflight_bytes = 0
        for i, x, y in todo:
            size = held(x, y)
            while inflight and inflight_bytes + size > INFLIGHT_BYTES:
                inflight_bytes -= _finish(inflight.popleft(), res, computed)
                done += 1
                if progress:
                    progress(done, n)
            inflight.append((i, size, submit(x, y)))
            inflight_bytes += size
        while inflight:
            _finish(inflight.popleft(), res, computed)
            done += 1
            if progress:
                progress(done, n)
    return _put_repeats(res, repeats, computed, done, n, progress)


def _put_repeats(res: ResultColumns, repeats, computed: dict, done: int, n: int, progress) -> int:
    """The rows of the pairs whose payloads repeat a computed pair's (``repeats``: (row,
    lead row) from :func:`_plan_large`) take the lead's metrics; returns ``done`` counting them."""
    for i, lead in repeats:
        res.put_row(i, *computed[lead])
    done += len(repeats)
    if progress and repeats:
        progress(done, n)
    return done


class _EarlyPairs:
    """The large pairs of the ``exact`` strategy, read and computed on the worker threads
    from the moment :func:`~dumpdb.compare.align_sql.align_exact` finds them, while its
    content check, align() and the planning run on the main thread (issue 29: ~0.6 s of
    alignment before the pair loop, the second core idle).

    A result is kept under its :func:`_pair_key` (both payloads, dtypes, shapes and the
    catalog ranges: everything a large pair's metrics depend on), and
    :meth:`finish` takes a final pair's metrics from there only for a pair of the same key:
    the same inputs to the same :func:`_pair_in_thread`, so the same bits whatever the
    alignment decides later. A pair the content check or a later strategy re-pairs is then
    computed as any pair; the early one is dropped (wasted work, never a wrong row).

    Only on the thread path without plug-in metrics (:func:`_pool`'s threads; with
    ``PROCESS_MIN_BYTES`` or more of exact pairs, or more than ``THREAD_MAX_WORKERS``
    workers, nothing starts early and :func:`_compute_large` runs as before). One driver
    thread submits the pairs in storage order with at most ``INFLIGHT_BYTES`` of payload in
    flight, as _compute_large does; :meth:`finish` merges the pairs it has not seen into
    those not started yet, in one storage order.
    :meth:`start` then waits for numba's load (:func:`~dumpdb.compare.kernel.wait_preload`)
    before the alignment goes on: both hold the GIL, and the workers need the kernel, not
    the rest of the alignment (a first compare that compiles the kernel aligns after it)."""

    def __init__(self, archive, trows: pa.Table, brows: pa.Table, workers: int | None) -> None:
        self.archive, self.trows, self.brows = archive, trows, brows
        self.workers = workers or os.cpu_count() or 2
        self.started = False
        self._pool: ThreadPoolExecutor | None = None
        self._thread: threading.Thread | None = None
        # (key, target row, bench row, bytes) in storage order; the driver has submitted those
        # before _next; finish() merges the pairs it adds into the rest and sets _closed
        self._pending: list[tuple] = []
        self._next = 0
        self._closed = False
        self._results: dict[tuple, tuple[dict, str | None] | BaseException] = {}
        self._landed: list[tuple] = []  # keys in the order their results came
        self._failed: BaseException | None = None  # the driver itself failed (opening the store)
        self._seen: set[tuple] = set()  # keys handed to the driver
        self._cond = threading.Condition()
        self._stop = False

    def start(self, pairs: pa.Table) -> None:
        """Start the large pairs among ``pairs`` (target_tensor_id, bench_tensor_id) that may
        need reading: both payloads stored, not the same bytes, more than ``SMALL_ELEMENTS``
        elements or other shapes (:func:`_compute`'s split)."""
        if registry.metrics("tensor", builtin=False) or self.workers > THREAD_MAX_WORKERS:
            return
        # the pairs' rows in pair order, split as _compute splits them (_small_pairs)
        keys = ["tensor_id", *_LOC_KEYS, "nbytes", "stats_source", "nan_count", "pos_inf_count", "neg_inf_count",
                "min", "max"]
        t = self.trows.select(keys).take(pc.index_in(pairs.column("target_tensor_id"), self.trows.column("tensor_id")))
        b = self.brows.select(keys).take(pc.index_in(pairs.column("bench_tensor_id"), self.brows.column("tensor_id")))
        small, _ = _small_pairs(t, b)
        # the pairs read here, before any row goes to Python: both payloads stored, not the same
        # bytes (_identical settles most such pairs unread; two NULL hashes count as the same, as
        # Python's ==), not a small pair (the batched path)
        th, bh = t.column("content_hash"), b.column("content_hash")
        same = pc.fill_null(pc.equal(th, bh), False).to_numpy(zero_copy_only=False) \
            | (~_valid(th) & ~_valid(bh))
        large = pa.array(_valid(t.column("array_path")) & _valid(b.column("array_path")) & ~same & ~small)
        items, seen = [], set()
        for x, y in zip(t.filter(large).to_pylist(), b.filter(large).to_pylist()):
            key = _pair_key(x, y)
            if key not in seen:
                seen.add(key)
                items.append((key, x, y, _plain_bytes(x, y)))
        if not items:
            return
        if sum(item[3] for item in items) >= PROCESS_MIN_BYTES:
            return  # worker processes: _compute_large
        items.sort(key=lambda item: _storage_order((0, item[1], item[2])))
        self._seen = seen
        self._pending = items
        self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="dumpdb-compare")
        self._thread = threading.Thread(target=self._drive, name="dumpdb-compare-early", daemon=True)
        self.started = True
        self._thread.start()
        # The workers can read now but compute nothing before numba is loaded (kernel.preload,
        # ~0.7 CPU s holding the GIL); the rest of the alignment (content check, align(): ~0.6
        # CPU s, also mostly holding it) would share the GIL with that load and delay the
        # kernel by as much. It runs after the load instead, beside the pair loop, whose
        # reading and kernel release the GIL.
        kernel.wait_preload()

    def _drive(self) -> None:
        try:
            self._submit_all()
        except BaseException as exc:  # raised by finish
            with self._cond:
                self._failed = exc
                self._cond.notify_all()

    def _submit_all(self) -> None:
        """Submit the pending pairs in order, at most INFLIGHT_BYTES in flight, and keep each
        result (or its exception) under its key, until :meth:`finish` closed the list and all
        are submitted, or :meth:`close`."""
        store = self.archive.store  # opened here, off the main thread (zarr's import: ~0.3 s)
        assert self._pool is not None
        inflight: deque = deque()
        inflight_bytes = 0
        while True:
            with self._cond:
                while not (self._stop or self._next < len(self._pending) or self._closed or inflight):
                    self._cond.wait()
                if self._stop:
                    break
                item = None
                if self._next < len(self._pending):
                    item = self._pending[self._next]
                    self._next += 1
                elif self._closed:
                    break
            if item is None:  # nothing new yet: land what is in flight
                inflight_bytes -= self._land(inflight.popleft())
                continue
            key, x, y, _ = item
            size = _held_bytes(x, y)
            while inflight and inflight_bytes + size > INFLIGHT_BYTES:
                inflight_bytes -= self._land(inflight.popleft())
            inflight.append((key, size, self._pool.submit(_pair_in_thread, self._pool, store, _loc(x), _loc(y),
                                                          _ranges(x, y))))
            inflight_bytes += size
        while inflight:
            self._land(inflight.popleft())

    def _land(self, item) -> int:
        key, size, future = item
        try:
            found = future.result()
            one: tuple[dict, str | None] | BaseException = found.result() if isinstance(found, _Segments) else found
        except BaseException as exc:  # raised where a final pair asks for it (finish)
            one = exc
        with self._cond:
            self._results[key] = one
            self._landed.append(key)
            self._cond.notify_all()
        return size

    def finish(self, t: pa.Table, b: pa.Table, large: np.ndarray, res: ResultColumns, done: int, progress) -> int:
        """:func:`_compute_large` with the early results: the final large pairs whose key the
        driver has are taken from it (waiting for them), the others handed to it now.
        Returns ``done``."""
        n = res.n
        todo, repeats = _plan_large(t, b, large, True)  # one pair per key: repeats take its metrics
        rows = {_pair_key(x, y): i for i, x, y in todo}
        rest = [(key, x, y, _plain_bytes(x, y))
                for key, (_, x, y) in zip(rows, todo) if key not in self._seen]
        computed: dict[int, tuple[dict, str | None]] = {}
        with self._cond:
            # the pairs not started yet and the new ones in one storage order: a new pair
            # lying among the exact ones reads its pack chunks while they are in the store's
            # chunk cache (at the end, the Transformer pair decoded 450 MB more: 1.23x)
            tail = self._pending[self._next:] + rest
            tail.sort(key=lambda item: _storage_order((0, item[1], item[2])))
            self._pending[self._next:] = tail
            self._closed = True
            self._cond.notify_all()
        waiting, seen = set(rows), 0
        while waiting:
            with self._cond:
                while seen == len(self._landed) and self._failed is None:
                    self._cond.wait()
                if self._failed is not None and seen == len(self._landed):
                    raise self._failed
                ready = [k for k in self._landed[seen:] if k in waiting]
                seen = len(self._landed)
            for key in ready:
                waiting.discard(key)
                one = self._results[key]
                if isinstance(one, BaseException):
                    raise one
                computed[rows[key]] = one
                res.put_row(rows[key], *one)
                done += 1
            if progress:
                progress(done, n)
        return _put_repeats(res, repeats, computed, done, n, progress)

    def close(self) -> None:
        """Stop the driver (what it has in flight finishes) and the worker threads."""
        if not self.started:
            return
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        assert self._thread is not None and self._pool is not None
        self._thread.join()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.started = False


def _plan_large(t: pa.Table, b: pa.Table, large: np.ndarray, fast: bool) -> tuple[list, list]:
    """The large pairs to compute, ``[(row, target row dict, bench row dict)]``, and the
    repeats ``[(row, the row computed for it)]``: pairs of the same two payloads (dtype,
    shape, ranges) are computed once (``fast``: no plug-in metric needs every pair);
    repeated layers and unchanged parameters make most large pairs of a training dump repeats."""
    keys = (*_LOC_KEYS, "nbytes", "stats_source", "nan_count", "pos_inf_count", "neg_inf_count", "min", "max")
    tl, bl = (side.select(list(keys)).take(large).to_pylist() for side in (t, b))  # dicts: large pairs only
    leaders: dict[tuple, int] = {}
    repeats: list[tuple[int, int]] = []  # (pair, the pair computed for it)
    todo = []
    for i, x, y in zip(large.tolist(), tl, bl):
        lead = leaders.setdefault(_pair_key(x, y), i) if fast else i
        if lead == i:
            todo.append((i, x, y))
        else:
            repeats.append((i, lead))
    todo.sort(key=_storage_order)
    return todo, repeats


def _storage_order(item: tuple[int, dict, dict]) -> tuple:
    """Where a pair's target payload lies (pack or array, offset), then its bench payload's:
    computing the pairs in this order rather than execution order reads each pack chunk
    while it is in the store's chunk cache. Payloads of 256 KiB - 16 MiB share 4 MiB chunks;
    in execution order the 64 MiB cache lost them between neighbours, and the Transformer
    pair decoded every pack chunk about 6 times (5.3 GB decoded for 0.87 GB stored; issue 29).
    Results land by row, so the order changes no value."""
    _, x, y = item
    return (x["array_path"] or "", x["elem_offset"] or 0, y["array_path"] or "", y["elem_offset"] or 0)


def _compute_remote(archive, scheduler: str, workers, t: pa.Table, b: pa.Table, small: np.ndarray,
                    small_sizes: np.ndarray, large: np.ndarray, fast: bool, res: ResultColumns, done: int,
                    progress) -> None:
    """The small and large pairs' payload work on a dask cluster
    (:func:`dumpdb.compare.distributed.compare_pairs`), into ``res``; repeats of a large pair
    take its metrics here, as in :func:`_compute_large`."""
    from dumpdb.compare.distributed import compare_pairs

    n = res.n
    todo, repeats = _plan_large(t, b, large, fast)
    at = pa.array(small, pa.int64())
    small_bytes = ints(t.column("nbytes").take(at), 0) + ints(b.column("nbytes").take(at), 0)
    jobs = [(i, _loc(x), _loc(y), _ranges(x, y), _plain_bytes(x, y)) for i, x, y in todo]
    computed: dict[int, tuple[dict, str | None]] = {}
    locs = (t.select(list(_LOC_KEYS)), b.select(list(_LOC_KEYS)))
    for kind, rows, found in compare_pairs(archive, scheduler, workers, *locs, small, small_sizes, small_bytes, jobs,
                                           small_pairs_metrics, large_pairs_metrics):
        if kind == "small":
            for local, metrics in found:
                _put_small(res, rows[local], metrics)
        else:
            for i, one in zip(rows.tolist(), found):
                computed[i] = one
                res.put_row(i, *one)
        done += rows.size
        if progress:
            progress(done, n)
    _put_repeats(res, repeats, computed, done, n, progress)


def small_pairs_metrics(store, t: pa.Table, b: pa.Table, sizes: np.ndarray) -> list[tuple[np.ndarray, MetricColumns]]:
    """Metrics of the small pairs ``t[i]``/``b[i]`` (payload locations: ``array_path``,
    ``elem_offset``, ``elem_count``, ``dtype``, ``shape``, ``content_hash``; ``sizes[i]``
    elements a side) read from ``store``, as the local engine computes them: ``[(positions,
    MetricColumns)]`` per batch. A cluster task (:mod:`dumpdb.compare.distributed`)."""
    with threadpool_limits(1, user_api="blas"):  # as the local path: the same sums, bit for bit
        return list(_small_batches(store, t, b, np.arange(t.num_rows), sizes))


def large_pairs_metrics(store, pairs: list[tuple]) -> list[tuple[dict, str | None]]:
    """``(metrics, err_message)`` of each ``(target loc, bench loc, ranges)`` pair, each read
    whole from ``store`` and computed by :func:`_metrics_of` (tensor_metrics and the plug-ins:
    the bits of the local engine's segments). A cluster task (:mod:`dumpdb.compare.distributed`)."""
    registry.load_plugins()
    with threadpool_limits(1, user_api="blas"):
        return [_pair_metrics(store, t, b, ranges) for t, b, ranges in pairs]


def _pair_key(x: dict, y: dict) -> tuple:
    """What a large pair's metrics depend on: both payloads (content hash, dtype, shape)
    and the ranges the first pass may take from the catalog (:func:`_ranges`)."""
    def shape(row: dict) -> tuple | None:
        return None if row["shape"] is None else tuple(row["shape"])  # NULL is not the 0-d shape ()

    return (x["content_hash"], x["dtype"], shape(x), y["content_hash"], y["dtype"], shape(y), _ranges(x, y))


_SMALL_KEYS = ["shape", "array_path"]


def _small_pairs(t: pa.Table, b: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """Which pairs ``t[i]``/``b[i]`` (tables with ``_SMALL_KEYS``) take the batched small
    path: both payloads stored, the same known shape, at most ``SMALL_ELEMENTS`` elements;
    and the target's element counts (0 where its shape is NULL). The one home of the split
    that :func:`_compute` and :meth:`_EarlyPairs.start` both make."""
    tshape, bshape = Shapes(t.column("shape")), Shapes(b.column("shape"))
    mask = tshape.equal(bshape) & (tshape.size <= SMALL_ELEMENTS) \
        & _valid(t.column("array_path")) & _valid(b.column("array_path"))
    return mask, tshape.size


def _valid(col) -> np.ndarray:
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    return arr.is_valid().to_numpy(zero_copy_only=False)


def _compute_statistics(t: pa.Table, b: pa.Table, statistics: np.ndarray, res: ResultColumns) -> int:
    """Statistics-mode metrics of the pairs ``statistics`` in one DuckDB query
    (stats_sql.statistics_metrics), into ``res``. Returns how many."""
    if not statistics.size:
        return 0
    at = pa.array(statistics, pa.int64())
    cols = ["tensor_id", *STATS]
    ts, bs = t.select(cols).take(at), b.select(cols).take(at)
    index = pa.table({"pair_index": at, "target_tensor_id": ts.column("tensor_id"),
                      "bench_tensor_id": bs.column("tensor_id")})
    out = statistics_metrics(index, ts, bs)
    rows = ints(out.column("pair_index"), -1)
    for name in STAT_METRICS:
        res.put(rows, name, *floats(out.column(name)))
    res.note(rows, strings(out.column("err_message")))
    return int(statistics.size)


def _compute_statistics_only(t: pa.Table, b: pa.Table, progress) -> ResultColumns:
    """What :func:`_compute` gives when every pair is compared by its statistics (mode
    ``statistics``, or ``auto`` without a payload on both sides of any pair): the metrics
    of all pairs in one DuckDB query (stats_sql.statistics_metrics), without the tensor
    paths (nor opening the tensor store)."""
    cols = ["tensor_id", *STATS]
    index = pa.table({"pair_index": pa.array(np.arange(t.num_rows, dtype=np.int64)),
                      "target_tensor_id": t.column("tensor_id"), "bench_tensor_id": b.column("tensor_id")})
    return _statistics_columns(statistics_metrics(index, t.select(cols), b.select(cols)), progress)


def _statistics_columns(metrics: pa.Table, progress) -> ResultColumns:
    """The result columns of pairs all in statistics mode from their metrics (row i: pair i;
    the :data:`STAT_METRICS` columns and ``err_message`` of stats_sql)."""
    n = metrics.num_rows
    res = ResultColumns(n, (*TENSOR_METRICS, *STAT_METRICS, "flat_euc_dist", *_plugin_metrics()))
    res.mode = filled(n, "statistics")
    rows = np.arange(n)
    for name in STAT_METRICS:
        res.put(rows, name, *floats(metrics.column(name)))
    res.message = strings(metrics.column("err_message"))
    if progress and n:
        progress(n, n)
    return res


def _identical(t: pa.Table, b: pa.Table) -> tuple[np.ndarray, MetricColumns] | None:
    """Which pairs ``t[i]``/``b[i]`` have payloads that are the same bytes (content hash,
    dtype and shape equal) with the catalog's NaN/Inf counts dumpdb's own, and their
    metrics from the definitions (metrics.identical_metrics, once per distinct dtype,
    shape and NaN/Inf count): (mask, metric columns of all rows). None when no pair is."""
    n = t.num_rows
    th, bh = t.column("content_hash"), b.column("content_hash")
    mask = pc.fill_null(pc.equal(th, bh), False).to_numpy(zero_copy_only=False)
    tdt, bdt = t.column("dtype"), b.column("dtype")
    same_dtype = pc.fill_null(pc.equal(tdt, bdt), False).to_numpy(zero_copy_only=False) | \
        (~_valid(tdt) & ~_valid(bdt))
    tshape = Shapes(t.column("shape"))
    mask &= same_dtype & tshape.equal(Shapes(b.column("shape")))
    mask &= pc.fill_null(pc.equal(t.column("stats_source"), "computed"), False).to_numpy(zero_copy_only=False)
    nonfinite = np.zeros(n, np.int64)
    for c in ("nan_count", "pos_inf_count", "neg_inf_count"):
        mask &= _valid(t.column(c))
        nonfinite += ints(t.column(c), 0)
    if not mask.any():
        return None
    metrics = MetricColumns(n)
    cand = np.flatnonzero(mask)
    dtypes = strings(tdt)
    codes = group_codes([string_codes(tdt)[cand], nonfinite[cand], tshape.ndim[cand], *tshape.dims[cand].T])
    _, first = np.unique(codes, return_index=True)
    for k, r in zip(range(len(first)), cand[first].tolist()):
        found = identical_metrics(tshape.shape(r) or (), from_catalog_name(dtypes[r]), int(nonfinite[r]))
        rows = cand[codes == k]
        if found is None:
            mask[rows] = False
            continue
        values, message = found
        for name in TENSOR_METRICS:
            v = values.get(name)
            metrics.values[name][rows] = np.nan if v is None else v
        metrics.message[rows] = message
    return mask, metrics


def _compute_small(store, t: pa.Table, b: pa.Table, small: np.ndarray, sizes: np.ndarray, res: ResultColumns,
                   done: int, progress) -> int:
    """Small pairs in batches (:func:`_small_batches`) into ``res``. Returns ``done``."""
    for rows, metrics in _small_batches(store, t, b, small, sizes):
        _put_small(res, rows, metrics)
        done += rows.size
        if progress:
            progress(done, res.n)
    return done


def _put_small(res: ResultColumns, rows: np.ndarray, metrics: MetricColumns) -> None:
    for name in TENSOR_METRICS:
        values = metrics.values[name]
        res.put(rows, name, values, ~np.isnan(values))
    res.note(rows, metrics.message)


def _small_batches(store, t: pa.Table, b: pa.Table, small: np.ndarray, sizes: np.ndarray):
    """Small pairs in batches: payloads read in storage order (pack, offset: the chunk
    cache serves neighbours), metrics by tensor_metrics_batch (columns). Yields
    ``(pair rows, MetricColumns)`` per batch."""
    if not small.size:
        return
    at = pa.array(small, pa.int64())
    order = pc.sort_indices(pa.table({"p": t.column("array_path").take(at),
                                      "o": pc.fill_null(t.column("elem_offset").take(at), 0)}),
                            sort_keys=[("p", "ascending"), ("o", "ascending")]).to_numpy()
    small, sizes = small[order], sizes[order]
    at = pa.array(small, pa.int64())
    tl, bl = (list(zip(*(side.column(k).take(at).to_pylist() for k in _LOC_KEYS))) for side in (t, b))
    start = 0
    cum = np.cumsum(2 * sizes)
    while start < len(small):
        # as many pairs as fit BATCH_ELEMENTS (at least one)
        base = cum[start - 1] if start else 0
        end = int(np.searchsorted(cum, base + BATCH_ELEMENTS, side="left")) + 1
        end = min(max(end, start + 1), len(small))
        # one read_many per batch (views of each pack chunk, decoded once); a payload both
        # sides share (same hash, dtype, shape) is read once
        own = [k for k in range(start, end) if tl[k] != bl[k]]
        found = _read_many(store, [*tl[start:end], *(bl[k] for k in own)])
        targets, benches = found[:end - start], found[:end - start]
        for k, c in zip(own, found[end - start:]):
            benches[k - start] = c
        yield small[start:end], tensor_metrics_batch(targets, benches)
        start = end


def _finish(item, res: ResultColumns, computed: dict[int, tuple[dict, str | None]]) -> int:
    i, size, future = item
    found = future.result()
    computed[i] = metrics, message = found.result() if isinstance(found, _Segments) else found
    res.put_row(i, metrics, message)
    return size


# (result column, pair side 0 target / 1 bench, tensors column) copied into every result row
_ROW_FIELDS = (
    ("target_tensor_id", 0, "tensor_id"), ("bench_tensor_id", 1, "tensor_id"), ("target_name", 0, "op_name"),
    ("bench_name", 1, "op_name"), ("io", 0, "io"), ("slot", 0, "slot"), ("iteration", 0, "iteration"),
    ("rank", 0, "rank"), ("graph_id", 0, "graph_id"), ("call_index", 0, "call_index"),
    ("timestamp", 0, "timestamp"), ("target_content_hash", 0, "content_hash"),
    ("bench_content_hash", 1, "content_hash"), ("op_type", 0, "op_type"), ("scope_name", 0, "scope_name"),
    ("position", 0, "position"), ("target_dtype", 0, "dtype"), ("bench_dtype", 1, "dtype"),
    ("target_shape", 0, "shape"), ("bench_shape", 1, "shape"), ("target_dtype_declared", 0, "dtype_declared"),
    ("bench_dtype_declared", 1, "dtype_declared"), ("target_requires_grad", 0, "requires_grad"),
    ("bench_requires_grad", 1, "requires_grad"), ("code_file", 0, "code_file"), ("code_line", 0, "code_line"),
    ("bench_rank", 1, "rank"), ("bench_iteration", 1, "iteration"), ("bench_scope_name", 1, "scope_name"),
    ("bench_graph_id", 1, "graph_id"),
    ("code_text", 0, "code_text"), ("target_source_file", 0, "source_file"),
    *((f"{side}_{k}", n, k) for n, side in enumerate(("target", "bench")) for k in ("max", "min", "mean", "l2norm")),
)


# Selected columns nothing reads in statistics mode (payload locations and counts, keys).
_NOT_READ_BY_STATISTICS = ("run", "device_id", "tensor_key", "nbytes", "stats_source", "nan_count", "pos_inf_count",
                           "neg_inf_count", "array_path", "elem_offset", "elem_count")
# Columns only the target side's rows are read for (the result table's source line; _ROW_FIELDS)
_TARGET_ONLY = ("code_file", "code_line", "code_text", "source_file")
# Columns of each side's rows the metrics and the result table read.
_COMPUTE_COLUMNS = (*_LOC_KEYS, "tensor_id", "nbytes", "stats_source", "nan_count", "pos_inf_count", "neg_inf_count",
                    *STATS)
_SIDE_COLUMNS = tuple(frozenset((*_COMPUTE_COLUMNS, *(column for _, s, column in _ROW_FIELDS if s == side)))
                      for side in (0, 1))


class _View:
    """The pairs as result columns: ``context[name]`` (Arrow, the _ROW_FIELDS), ``strategy``,
    ``res`` (computed metrics, messages and modes), then ``result``/``err_message`` (msprobe
    verdicts) and ``precision`` (the precision columns)."""

    def __init__(self, t: pa.Table, b: pa.Table, strategy: pa.Array, res: ResultColumns) -> None:
        self.n = t.num_rows
        sides = (t, b)
        self.context = {key: _one_chunk(sides[side].column(column)) for key, side, column in _ROW_FIELDS}
        self.strategy = strategy
        self.res = res
        self.mode = res.mode
        self.result = np.full(self.n, None, dtype=object)
        self.err_message: np.ndarray | pa.Array = res.message
        self.precision: dict[str, np.ndarray] = {}
        self._shapes: dict[str, Shapes] = {}
        self._floats: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._ops: np.ndarray | None = None
        # the verdicts and the precision rules may read the view in two threads at once
        # (_verdicts_and_precision): each cached column is computed once, by whichever asks first
        self._cache_lock = threading.Lock()

    def shapes(self, name: str) -> Shapes:
        with self._cache_lock:
            if name not in self._shapes:
                self._shapes[name] = Shapes(self.context[name])
            return self._shapes[name]

    def numbers(self, names) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """(values, valid) of computed metrics and numeric context columns (read only: the
        context columns are converted once, for the verdicts and the rules alike, as the
        metrics' arrays are shared)."""
        values, valid = {}, {}
        for k in names:
            if k in self.res.names:
                values[k], valid[k] = self.res.column(k)
            else:
                with self._cache_lock:
                    if k not in self._floats:
                        self._floats[k] = floats(self.context[k])
                    values[k], valid[k] = self._floats[k]
        return values, valid

    def forget_numbers(self) -> None:
        """Drop the converted context columns :meth:`numbers` keeps (before the result table
        is built beside the view); a later call converts them again."""
        with self._cache_lock:
            self._floats.clear()

    def op_codes(self) -> np.ndarray:
        """One code per op call: iteration, rank, graph_id, call_index, target name (NULL equal to NULL)."""
        with self._cache_lock:
            if self._ops is None:
                keys = [ints(self.context[k], _NULL_KEY) for k in ("iteration", "rank", "graph_id", "call_index")]
                self._ops = group_codes([*keys, string_codes(self.context["target_name"])])
            return self._ops


_NULL_KEY = np.iinfo(np.int64).min


def _one_chunk(col: pa.ChunkedArray) -> pa.Array:
    """The column as one array (no copy when it is one chunk already)."""
    return col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()


def _view(t: pa.Table, b: pa.Table, strategy: pa.Array, res: ResultColumns) -> _View:
    return _View(t, b, strategy, res)


def _string_array(col: pa.Array) -> pa.Array:
    """A text column as one Arrow string array (the verdicts read names as Arrow)."""
    return col if col.type == pa.string() else col.cast(pa.string())


def _verdicts_and_precision(view: _View, trows: pa.Table, thresholds: Thresholds, rules: PrecisionRules,
                            storing: _Storing | None = None) -> tuple[dict | None, dict[str, pa.Array]]:
    """msprobe's verdicts (``view.result``, ``view.err_message``: :func:`_judge`) and the
    precision columns (:func:`_judge_precision`); with ``storing``, the compare stored too.
    Returns (the first departure, the stored columns: :func:`_stored_columns`, the result
    table's, or {} without ``storing``).

    The stored columns (:data:`RESULT_COLUMNS`: the pairs, their metrics, msprobe's
    verdicts) read nothing of the precision rules: ``storing`` inserts them in a thread as
    soon as the verdicts are done, while the rules run (DuckDB releases the GIL), in a
    transaction committed only once the rules have succeeded; when they raise, it is
    rolled back: a compare that fails stores nothing (:class:`_Storing`). A compare of more
    than :data:`STORE_BESIDE_ROWS` pairs inserts them once the rules are done (memory).

    When every pair is compared by its statistics the verdicts run in that thread too,
    beside the rules (much of either is numpy and Arrow work, which releases the GIL),
    after computing what the rules read of the names (``precision.name_masks``). The
    precision rules then get the metrics' messages, not the verdicts' joined onto them: they
    read a message only on a tensor-mode row (``precision.Columns.err_message``: the nan/inf
    mismatch note), so the result is the same. The verdicts and the store write nothing to
    the view and never read ``view.precision``, which the rules set meanwhile; the view's
    cached columns (op codes, shapes) are computed once, by the first thread to ask
    (:class:`_View`); the verdicts are set on it once both are done (``err_message`` then
    as an Arrow string array, the result table's column). With a tensor pair, the verdicts
    first: that pair's precision reads their messages."""
    statistics = bool(np.all(view.mode == "statistics"))
    beside = storing is not None and view.n <= STORE_BESIDE_ROWS

    def verdicts() -> tuple[np.ndarray, pa.Array]:
        # the messages as the result table's Arrow column, made here, off the main thread:
        # 500,000 Python strings of reasons freed while the precision rules still run
        result, messages = _judge(view, thresholds)
        out = result, _text_array(messages)
        del messages
        # what this thread freed stays in its own glibc heap, which the main thread's
        # allocations do not reuse: given back now (at 500,000 pairs the precision rules'
        # peak was ~70 MB higher without)
        release_free_memory()
        return out

    def store(judged: tuple[np.ndarray, np.ndarray | pa.Array]) -> dict[str, pa.Array]:
        columns = _stored_columns(view, *judged)
        assert storing is not None
        storing.insert(view.n, columns)
        return columns

    with contextlib.ExitStack() as stack:
        if storing is not None:
            stack.push(storing.reheld)  # last: once the insert is over
        side = stack.enter_context(ThreadPoolExecutor(max_workers=1, thread_name_prefix="dumpdb-compare-verdicts"))
        # before the executor's exit (which waits for the insert): it lets the insert end
        decide = stack.enter_context(storing) if storing is not None else None
        saved = None
        if statistics:
            # first what the rules read of the names (Arrow's text kernels: no GIL held), while
            # the rules convert their other columns; then the verdicts, then the store
            masks = side.submit(name_masks, *(_string_array(view.context[k])
                                              for k in ("target_name", "scope_name", "op_type")))
            judged = side.submit(verdicts)
            if beside:
                saved = side.submit(lambda: store(judged.result()))
            departure = _judge_precision(view, trows, rules, masks.result)
            view.result, view.err_message = judged.result()
        else:  # a tensor pair's precision reads the verdicts' messages
            view.result, view.err_message = _judge(view, thresholds)
            if beside:
                saved = side.submit(store, (view.result, view.err_message))
            departure = _judge_precision(view, trows, rules)
        if decide is not None:
            decide()  # the rules succeeded: the insert commits
            if saved is None:  # a large compare: its insert after the rules' peak (STORE_BESIDE_ROWS)
                release_free_memory()
                saved = side.submit(store, (view.result, view.err_message))
        columns = saved.result() if saved is not None else {}
    return departure, columns


def _judge(view: _View, thresholds: Thresholds) -> tuple[np.ndarray, np.ndarray]:
    """msprobe's verdicts per op call (verdict.op_results_columns): (result, err_message)."""
    io = view.context["io"]
    names = ("cosine", "one_thousandth_err_ratio", "max_abs_err", "l2norm_rel_diff", "target_max", "target_min",
             "bench_max", "bench_min", "target_requires_grad", "bench_requires_grad")
    values, valid = view.numbers(names)
    columns = VerdictColumns(
        group=view.op_codes(), output=pc.fill_null(pc.equal(io, "output"), False).to_numpy(zero_copy_only=False),
        statistics=view.mode == "statistics", target_name=_string_array(view.context["target_name"]),
        bench_name=_string_array(view.context["bench_name"]),
        target_dtype=_string_array(view.context["target_dtype"]),
        bench_dtype=_string_array(view.context["bench_dtype"]), err_message=view.err_message, values=values,
        valid=valid, target_shape=view.shapes("target_shape"), bench_shape=view.shapes("bench_shape"))
    result, reason = op_results_columns(columns, thresholds)
    # numpy's stub has no None among where's scalars; None is an object array's NULL
    add = np.where((result != "pass") & truthy(reason), reason, None)  # type: ignore[call-overload]
    return result, join_messages(view.err_message, add)


def _judge_precision(view: _View, trows: pa.Table, rules: PrecisionRules,
                     masks: Callable[[], tuple] | None = None) -> dict | None:
    """Precision columns on ``view`` (dumpdb.compare.precision) and the first departure.
    Producers of inputs: every target output (compared or not) by content hash. The
    alignment's ``arg_diff`` column (scalar arguments that differ), when the pairs carry
    it, is evidence the rules read. ``masks``: ``precision.Columns.name_masks`` (computed
    by the rules otherwise)."""
    n = view.n
    ctx = view.context
    it, rank, ts = ctx["iteration"], ctx["rank"], ctx["timestamp"]
    run_rank = run_ranks(it, rank, ts)
    order, producers, inputs_of = _producers(trows, ints(ctx["target_tensor_id"], -1),
                                             ctx["target_content_hash"].null_count < n)
    values, valid = view.numbers(("flat_euc_dist", "euc_dist", "max_abs_err", "l2norm_diff", "bench_l2norm",
                                  "target_max", "target_min", "bench_max", "bench_min", "target_l2norm"))
    where = group_codes([ints(it, _NULL_KEY), ints(rank, _NULL_KEY)])
    arg_diff = getattr(view, "arg_diff", None)
    if arg_diff is None and "arg_diff" in ctx and ctx["arg_diff"].null_count < n:
        arg_diff = strings(ctx["arg_diff"])  # all NULL: no scalar argument differs, as None says
    ts_values, ts_valid = floats(ts)
    # the op codes and shapes, which the verdicts' thread also reads, are asked for last: that
    # thread may have computed them meanwhile (after the name masks) while these conversions ran
    columns = PrecisionColumns(
        where=where, run_rank=run_rank,
        output=pc.fill_null(pc.equal(ctx["io"], "output"), False).to_numpy(zero_copy_only=False),
        statistics=view.mode == "statistics", order=order, values=values, valid=valid,
        target_dtype=strings(ctx["target_dtype"]), bench_dtype=strings(ctx["bench_dtype"]),
        target_dtype_declared=strings(ctx["target_dtype_declared"]),
        bench_dtype_declared=strings(ctx["bench_dtype_declared"]), err_message=view.err_message,
        target_content_hash=strings(ctx["target_content_hash"]), io=ctx["io"], slot=ctx["slot"],
        bench_content_hash=strings(ctx["bench_content_hash"]),
        producers=producers, inputs_of=inputs_of,
        op_type=strings(ctx["op_type"]), arg_diff=arg_diff, iteration=ints(it, -1),
        timestamp=np.where(ts_valid, ts_values, np.nan),
        arrow={k: _string_array(ctx[k]) for k in ("target_name", "scope_name", "op_type", "target_dtype",
                                                   "bench_dtype", "target_dtype_declared", "bench_dtype_declared")},
        name_masks=masks, group=view.op_codes(), target_shape=view.shapes("target_shape"),
        bench_shape=view.shapes("bench_shape"))
    view.precision, departure = judge_precision_columns(columns, rules)
    view.forget_numbers()  # the rules are done with them; the verdicts hold what they took
    return departure


def _producers(trows: pa.Table, pair_tids: np.ndarray, needed: bool):
    """(order, producers, inputs_of) of :class:`~dumpdb.compare.precision.Columns`: each
    pair's target tensor's place among all target tensors in the producers' order
    (timestamp, NULLs last, then execution order), the function finding the target outputs
    with some content hashes, and the one giving the input tensors (content hash, order) of
    the op call whose output has a given order. Not ``needed`` (no pair's target has a
    content hash, so no input has a producer): zeros and functions finding none, without
    sorting the target rows."""
    if not needed:
        return np.zeros(pair_tids.size, np.int64), lambda hashes: {}, lambda k: []
    # the producers' order over all target tensors: timestamp (NULLs last), then execution order
    tts = trows.column("timestamp")
    keys = execution_keys(trows)
    by = np.lexsort([*keys[::-1], ints(tts, 0), (~_valid(tts)).astype(np.int64)])
    order_of = np.empty(trows.num_rows, np.int64)
    order_of[by] = np.arange(trows.num_rows)
    tids = ints(trows.column("tensor_id"), -1)
    sorter = np.argsort(tids, kind="stable")
    order = order_of[sorter[np.searchsorted(tids, pair_tids, sorter=sorter)]]

    def producers(hashes: set) -> dict[str, list]:
        hashes = hashes - {None}
        outputs = trows.filter(pc.and_(pc.fill_null(pc.equal(trows.column("io"), "output"), False),
                                       pc.is_in(trows.column("content_hash"), pa.array(sorted(hashes), pa.string()))))
        rows = ints(outputs.column("tensor_id"), -1)
        found: dict[str, list] = defaultdict(list)
        at = sorter[np.searchsorted(tids, rows, sorter=sorter)]
        done = pc.is_in(outputs.column("tensor_id"), pa.array(pair_tids)).to_numpy(zero_copy_only=False)
        for h, name, k, c in zip(outputs.column("content_hash").to_pylist(), outputs.column("op_name").to_pylist(),
                                 order_of[at].tolist(), done.tolist()):
            found[h].append((k, name, c))
        for v in found.values():
            v.sort(key=lambda p: p[0])
        return found

    calls: dict[tuple, list[tuple[str, int]]] = {}  # built on the first call: few inputs need it

    def inputs_of(k: int) -> list[tuple[str, int]]:
        """(content hash, order) of the inputs of the op call (iteration, rank, op name,
        call index) whose output tensor has order ``k``."""
        if not calls:
            cols = [trows.column(c).to_pylist() for c in ("iteration", "rank", "op_name", "call_index", "io",
                                                           "content_hash")]
            for i, (it, rk, name, ci, io, h) in enumerate(zip(*cols)):
                key = (it, rk, name, ci)
                calls.setdefault(key, [])
                if io == "input" and h is not None:
                    calls[key].append((h, int(order_of[i])))
            calls[("at",)] = []  # built, even when empty
            at_order = np.empty(trows.num_rows, np.int64)
            at_order[order_of] = np.arange(trows.num_rows)
            calls_key.extend(zip(*cols[:4]))
            calls_at.append(at_order)
        if not 0 <= k < trows.num_rows:
            return []
        return calls.get(calls_key[int(calls_at[0][k])], [])

    calls_key: list[tuple] = []
    calls_at: list[np.ndarray] = []

    return order, producers, inputs_of


def _lowest_dtype(dtypes: np.ndarray) -> str | None:
    """The lowest precision any pair was judged at (for "no departure beyond float16")."""
    from dumpdb.compare.precision import dtype_floor

    found = {d for d in dtypes.tolist() if d}
    return max(found, key=lambda d: dtype_floor(d, 1, 1.0) or 0.0, default=None)


def _stored_columns(view: _View, result: np.ndarray | pa.Array,
                    err_message: np.ndarray | pa.Array) -> dict[str, pa.Array]:
    """The :data:`RESULT_COLUMNS` the store inserts, as Arrow arrays, with msprobe's
    verdicts ``result`` and ``err_message`` (object arrays of str/None, or Arrow string
    arrays): the rows ``compare_results`` stores. No ``compare_id`` (the insert gives it)
    and no metric never written (NULL: the column's default). Reads the view and never
    changes it (the precision rules may be reading it meanwhile), and allocates little
    beside them: a metric's array holds the view's values, not a copy (its validity bitmap
    packed by numpy, not Arrow's pool, which keeps what it frees); ``mode`` all
    ``statistics`` is a dictionary array of one value (DuckDB stores the text). The
    types are the result table's (:func:`_result_schema`) but ``mode``'s."""
    types = _result_schema()
    out: dict[str, pa.Array] = {}
    for name in RESULT_COLUMNS[1:]:
        kind = types.field(name).type
        if name == "pair_index":
            arr = pa.array(np.arange(view.n, dtype=np.int64))
        elif name == "match_strategy":
            arr = view.strategy
        elif name == "mode":
            arr = _modes(view.mode)
        elif name == "result":
            arr = _text_array(result)
        elif name == "err_message":
            arr = _text_array(err_message)
        elif name in view.res.values:
            arr = _masked(view.res.values[name], view.res.valid[name])
        elif name in view.res.names:
            continue  # never written: NULL (the insert's default; no array of n NULLs made)
        else:
            arr = view.context[name]
        out[name] = arr.cast(kind) if arr.type != kind and not pa.types.is_dictionary(arr.type) else arr
    return out


def _masked(values: np.ndarray, valid: np.ndarray) -> pa.Array:
    """float64 ``values`` as Arrow, NULL where not ``valid`` (as ``pa.array(values,
    mask=~valid)``): the data is ``values``' own buffer, the validity bitmap numpy's."""
    bitmap = np.packbits(valid, bitorder="little")
    return pa.Array.from_buffers(pa.float64(), len(values), [pa.py_buffer(bitmap), pa.py_buffer(values)])


def _modes(modes: np.ndarray) -> pa.Array:
    """The ``mode`` column: all ``statistics`` as a dictionary array of that one value
    (one byte a row); else as text."""
    if len(modes) and bool(np.all(modes == "statistics")):
        return pa.DictionaryArray.from_arrays(pa.array(np.zeros(len(modes), np.int8)), pa.array(["statistics"]))
    return _text_array(modes)


def _result_table(view: _View, stored: Mapping[str, pa.Array] | None = None) -> pa.Table:
    """The result table (_result_schema) from the view's columns and ``stored`` (the
    columns :func:`_stored_columns` made of it, taken as they are); each numpy column is
    dropped from the view once converted (the table and the view are not both whole)."""
    schema = _result_schema()
    stored = stored or {}
    n = view.n
    arrays = []
    for f in schema:
        name = f.name
        if name in stored and stored[name].type == f.type:
            arr = stored[name]
            if name in view.res.values:  # the table holds them now
                del view.res.values[name], view.res.valid[name]
        elif name == "compare_id":
            arr = pa.nulls(n, pa.int64())
        elif name == "pair_index":
            arr = pa.array(np.arange(n, dtype=np.int64))
        elif name == "match_strategy":
            arr = view.strategy
        elif name == "mode":
            arr = _text_array(view.mode)
        elif name == "result":
            arr = _text_array(view.result)
            del view.result  # written: its memory goes back now
        elif name == "err_message":
            arr = _text_array(view.err_message)
            del view.err_message
        elif name in view.res.names:
            arr = view.res.arrow(name)
        elif name in ("scaled_err", "precision_floor", "precision_ratio"):
            arr = pa.array(view.precision.pop(name), pa.float64(), mask=~view.precision.pop(f"{name}_valid"))
        elif name in view.precision:
            arr = _text_array(view.precision.pop(name))
        elif name in view.context:
            arr = view.context[name]
        else:
            arr = pa.nulls(n, f.type)
        arrays.append(arr.cast(f.type) if arr.type != f.type else arr)
    return pa.Table.from_arrays(arrays, schema=schema)


def _text_array(values: np.ndarray | pa.Array) -> pa.Array:
    """An object array of str/None as an Arrow string array (an Arrow array, the precision
    reasons, as it is). Arrow converts the object array in C: 2x to 16x faster than coding
    the values through a Python dict first (100k verdicts, 500k dtypes or mostly-NULL
    messages), whatever the distinct count."""
    return values if isinstance(values, pa.Array) else pa.array(values, pa.string())


def _result_schema() -> pa.Schema:
    ints = {"compare_id", "pair_index", "target_tensor_id", "bench_tensor_id", "iteration", "position",
            "timestamp"}
    small = {"slot", "rank", "code_line", "graph_id", "call_index"}
    strings = {"target_name", "bench_name", "io", "match_strategy", "mode", "result", "err_message", "op_type",
               "scope_name", "target_dtype", "bench_dtype", "code_file", "code_text", "target_source_file",
               "target_content_hash", "bench_content_hash", "precision_dtype", "precision_result",
               "precision_reason", "target_dtype_declared", "bench_dtype_declared", "arg_diff"}
    fields = []
    for c in (*RESULT_COLUMNS, *CONTEXT_COLUMNS, *_plugin_metrics()):
        if c in ints:
            t = pa.int64()
        elif c in small:
            t = pa.int32()
        elif c in strings:
            t = pa.string()
        elif c.endswith("_shape"):
            t = pa.list_(pa.int64())
        elif c.endswith("requires_grad") or c == "realigned":
            t = pa.bool_()
        else:
            t = pa.float64()
        fields.append((c, t))
    return pa.schema(fields)


class _Storing:
    """A compare's rows stored from a thread beside the precision rules, committed only
    once the caller decides so (one home for what a compare stores: ``compares``,
    ``compare_results``, ``compare_unmatched``, in one transaction).

    ``with storing as decide:`` closes the read-only connection the archive holds (DuckDB:
    no write while this process holds one); inside, :meth:`insert` (another thread) opens
    the writer, inserts the rows and waits; ``decide()`` lets it commit. Leaving the block
    without ``decide()``, or with an exception after it (the rules raised, Ctrl-C), lets it
    roll back: nothing stored, and a wait for the catalog's lock ends at its next retry.
    :meth:`reheld` opens the held connection again; ``compare_id`` is the stored compare's once
    :meth:`insert` has returned."""

    def __init__(self, archive, tsel: Selection, bsel: Selection, unmatched: pa.Table, recorded: dict,
                 mapping) -> None:
        self.archive, self.tsel, self.bsel, self.unmatched, self.recorded = archive, tsel, bsel, unmatched, recorded
        self.options = {"strategies": recorded["strategies"], "thresholds": recorded["thresholds"],
                        "mapping": str(mapping) if isinstance(mapping, (str, os.PathLike)) else bool(mapping)}
        self.compare_id: int | None = None
        self._decided = threading.Event()
        self._keep = False
        self._held = False

    def __enter__(self) -> Callable[[], None]:
        self._held = self.archive.holding
        if self._held:
            self.archive.close()
        return self._commit

    def _commit(self) -> None:
        self._keep = True
        self._decided.set()

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is not None:  # raised or interrupted, after decide() too: the insert rolls back
            self._keep = False
        self._decided.set()  # without _commit: the insert rolls back
        # (the executor's exit, after this one, waits for the insert to finish)

    def _dropped(self) -> bool:
        """Decided against keeping the rows: a wait for the catalog's lock ends now."""
        return self._decided.is_set() and not self._keep

    def reheld(self, exc_type, *exc) -> bool:
        """ExitStack exit callback: the archive's connection held again, as on entry; when
        an error is on its way out, a failure to do so does not replace it."""
        if self._held:
            self._held = False
            try:
                self.archive.__enter__()
            except Exception:
                if exc_type is None:
                    raise
        return False

    def insert(self, n: int, columns: Mapping[str, pa.Array]) -> None:
        """Store the compare: its ``compares`` row, the ``n`` pairs' ``columns`` (all of
        :data:`RESULT_COLUMNS` but ``compare_id``) and the unmatched tensors; committed
        once decided, else rolled back (raises :class:`_NotKept` then)."""
        with self.archive.catalog.writer(stop=self._dropped) as con:
            compare_id = _insert(con, self.tsel, self.bsel, n, columns, self.unmatched, self.recorded,
                                 self.options)
            self._decided.wait()
            if not self._keep:
                raise _NotKept
        self.compare_id = compare_id


class _NotKept(Exception):
    """The rows :class:`_Storing` inserted were rolled back: the compare failed."""


def _insert(con, tsel: Selection, bsel: Selection, n: int, columns: Mapping[str, pa.Array], unmatched: pa.Table,
            recorded: dict, options: dict) -> int:
    compare_id = con.execute("SELECT nextval('compare_id_seq')").fetchone()[0]
    con.execute(
        "INSERT INTO compares (compare_id, target_run, bench_run, target_selection, bench_selection, mode, "
        "options, pairs, unmatched_target, unmatched_bench, dumpdb_version) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
        [compare_id, tsel.run, bsel.run, tsel.describe(), bsel.describe(), recorded["mode"],
         json.dumps(options, default=str), n, recorded["unmatched_target"], recorded["unmatched_bench"],
         __version__])
    stored = pa.table(dict(columns))
    insert_arrow(con, "compare_results", stored, prefix=f"{int(compare_id)}::BIGINT AS compare_id,")
    if unmatched.num_rows:
        um = unmatched.select(["side", "tensor_id", "name", "io", "slot"])
        um = um.append_column("compare_id", pa.array([compare_id] * um.num_rows, pa.int64()))
        insert_arrow(con, "compare_unmatched", um)
    return compare_id


def _differs(r: dict) -> bool:
    if r["target_dtype"] != r["bench_dtype"] or r["target_shape"] != r["bench_shape"]:
        return True
    if r["target_content_hash"] is not None and r["bench_content_hash"] is not None:
        return r["target_content_hash"] != r["bench_content_hash"]  # bit for bit (-0.0 vs 0.0 too)
    if r["mode"] == "tensor":
        return r["max_abs_err"] is None or r["max_abs_err"] != 0
    return any(r[k] not in (0, 0.0) for k in ("max_diff", "min_diff", "mean_diff", "l2norm_diff"))


def first_difference_of(results: pa.Table) -> dict[str, Any] | None:
    """The first pair, in target execution order, whose tensors are not identical
    (values, dtype or shape; statistics in statistics mode), whatever the verdict;
    None when every pair is identical. Keys: pair_index, target_name, scope_name,
    io, slot, iteration, position, max_abs_err, cosine, result."""
    keys = ("pair_index", "target_name", "scope_name", "op_type", "io", "slot", "iteration", "position",
            "max_abs_err", "cosine", "result", "target_dtype", "bench_dtype", "code_line", "code_text")
    needed = (*keys, "target_shape", "bench_shape", "target_content_hash", "bench_content_hash", "mode",
              "max_diff", "min_diff", "mean_diff", "l2norm_diff")
    for batch in results.select(list(dict.fromkeys(needed))).to_batches(max_chunksize=4096):
        for r in batch.to_pylist():  # a few columns, batch by batch: stops at the first difference
            if _differs(r):
                return {k: r[k] for k in keys}
    return None


def first_divergence_of(results: pa.Table, context: int = 10) -> dict[str, Any] | None:
    """The first pair, in target execution order (then timestamp), whose result is
    'error', preferring outputs (an op's output failing the rule); with the
    ``context`` compared ops before it in the same iteration and rank as ``path``.
    None when every pair passes (or warns)."""
    light = results.select(["pair_index", "result", "io"]).to_pylist()
    failing = [i for i, r in enumerate(light) if r["result"] == "error" and r["io"] == "output"] or \
              [i for i, r in enumerate(light) if r["result"] == "error"]
    if not failing:
        return None
    at = min(failing, key=lambda i: light[i]["pair_index"])
    first = results.slice(at, 1).to_pylist()[0]
    before = [r for r in results.select(["pair_index", "iteration", "rank", "target_name"]).to_pylist()
              if r["pair_index"] < first["pair_index"] and r["iteration"] == first["iteration"]
              and r["rank"] == first["rank"]]
    ops = _ops_path(before)
    return {
        **{k: first[k] for k in ("pair_index", "target_name", "bench_name", "scope_name", "op_type", "io", "slot",
                                 "iteration", "rank", "position", "result", "err_message", "code_file",
                                 "code_line", "code_text", "target_tensor_id", "bench_tensor_id",
                                 *TENSOR_METRICS, *STAT_METRICS)},
        # the align step's columns: absent from compare_results rows stored before they existed
        "arg_diff": first.get("arg_diff"), "realigned": first.get("realigned"),
        "path": ops[-context:],
    }


def _departure_report(results: pa.Table, departure: dict | None, context: int = 10,
                      sides: str | None = None) -> dict[str, Any] | None:
    """first_divergence_of's dict for the precision rules' first departing op, plus
    ``inputs``/``outputs`` (errors side by side), ``origin_op`` (an op only the target
    has that produced a departing input), ``rules``, ``phase``, ``ranks`` (the first
    departing op of each iteration and rank, the one that ran first across ranks first),
    ``phases`` ({forward|backward|optimizer: its first departing op}; each of these a
    :func:`_brief` dict) and ``sides`` (a note when nothing says which side is wrong)."""
    if departure is None:
        return None
    row = departure["row"]
    first = results.slice(row["pair_index"], 1).to_pylist()[0]
    before = [r for r in results.slice(0, first["pair_index"]).select(["iteration", "rank", "target_name"]).to_pylist()
              if r["iteration"] == first["iteration"] and r["rank"] == first["rank"]]
    ops = _ops_path(before)
    ranks = [_brief(results, d) for d in departure.get("ranks", ())]
    return {
        **{k: first[k] for k in ("pair_index", "target_name", "bench_name", "scope_name", "op_type", "io", "slot",
                                 "iteration", "rank", "position", "code_file", "code_line", "code_text",
                                 "target_tensor_id", "bench_tensor_id", "scaled_err", "precision_floor",
                                 "precision_ratio", "precision_dtype", "arg_diff", "realigned", *TENSOR_METRICS,
                                 *STAT_METRICS)},
        "result": first["precision_result"], "err_message": first["precision_reason"],
        "origin_op": departure["origin_op"], "inputs": departure["inputs"], "outputs": departure["outputs"],
        "rules": "precision", "path": ops[-context:],
        "phase": ranks[0]["phase"] if ranks else None, "ranks": ranks,
        "phases": {k: _brief(results, d) for k, d in departure.get("phases", {}).items()},
        "sides": sides,
    }


def _brief(results: pa.Table, d: dict) -> dict[str, Any]:
    """A departing op in a few fields: pair_index, phase, iteration, rank, position,
    target_name, op_type, io, slot, result, reason."""
    r = results.slice(d["pair_index"], 1).select(
        ["pair_index", "iteration", "rank", "position", "target_name", "op_type", "io", "slot", "precision_result",
         "precision_reason"]).to_pylist()[0]
    return {"pair_index": r["pair_index"], "phase": d.get("phase"), "iteration": r["iteration"], "rank": r["rank"],
            "position": r["position"], "target_name": r["target_name"], "op_type": r["op_type"], "io": r["io"],
            "slot": r["slot"], "result": r["precision_result"], "reason": r["precision_reason"]}


def _add_containers(archive, run: str, fd: dict | None) -> None:
    """Name the module/cell each reported op ran in (``container``): the parent of its
    ``ops.node`` path (msprobe: construct.json's module chain, ``Module.blocks.2.Block.
    forward.0/Tensor.__mul__.2.forward``); a container is reported as the scope of the op
    that departs, never as the departure (precision module docstring, "Containers")."""
    if fd is None:
        return
    entries = [fd, *fd.get("ranks", ()), *fd.get("phases", {}).values()]
    names = sorted({e["target_name"] for e in entries if e.get("target_name")})
    if not names:
        return
    with archive.reader() as con:
        found = con.execute("SELECT scope_name, rank, node FROM ops WHERE run = ? AND node LIKE '%/%' AND "
                            "scope_name IN (SELECT unnest(?::VARCHAR[]))", [run, names]).fetchall()
    nodes = {(scope, rank): node.rsplit("/", 1)[0] for scope, rank, node in found}
    for e in entries:
        e["container"] = nodes.get((e.get("target_name"), e.get("rank")))


def _sides_note(tsel: Selection, bsel: Selection) -> str | None:
    """A note when two single ranks are compared one against one (two ranks of one run, or
    a --bench-rank other than the target's): either may be the one that is wrong."""
    if tsel.rank is None or bsel.rank is None or tsel.rank == bsel.rank:
        return None
    if tsel.run == bsel.run:
        return (f"rank {tsel.rank} compared with rank {bsel.rank} of the same run: nothing says which side is wrong; "
                "the departure may be on either rank")
    return (f"rank {tsel.rank} of {tsel.run} compared with rank {bsel.rank} of {bsel.run}: if {bsel.run} is not a "
            "known-good baseline, nothing says which side is wrong")


def _ops_path(before: list[dict]) -> list[str]:
    """The target op names of ``before`` in order, consecutive repeats (an op's several
    slots) once: the ops a divergence report lists before the first departing op."""
    ops: list[str] = []
    for r in before:
        if not ops or ops[-1] != r["target_name"]:
            ops.append(r["target_name"])
    return ops
