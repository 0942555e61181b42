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
activations) is read once. Metrics run on a thread pool with one worker per
core: worker processes for comparisons of 64 MB or more (the metrics make thousands
of short numpy calls per tensor, so threads would serialise on the GIL), one thread
below that.

Fast paths (issue 13), each giving what the pair-by-pair path gives (tests/test_compare_fast.py,
tests/test_compare_stats_sql.py, tests/test_compare_align_sql.py):

* a pair whose payloads have the same content hash, dtype and shape, with dumpdb's own
  NaN/Inf counts in the catalog, is not read: :func:`~dumpdb.compare.metrics.identical_metrics`;
* pairs of at most ``SMALL_ELEMENTS`` elements a side (without plug-in metrics) are read in
  storage order and computed ``BATCH_ELEMENTS`` at a time by
  :func:`~dumpdb.compare.metrics.tensor_metrics_batch` (bit for bit the per-pair values);
* statistics-mode metrics of all pairs are one DuckDB query
  (:func:`~dumpdb.compare.stats_sql.statistics_metrics`);
* without a mapping, the ``exact`` strategy runs as one DuckDB query
  (:func:`~dumpdb.compare.align_sql.align_exact`) and align() only when later strategies
  have tensors left to pair.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
from collections import defaultdict, deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from threadpoolctl import threadpool_limits

from dumpdb import __version__
from dumpdb.catalog import insert_arrow
from dumpdb.compare import registry
from dumpdb.compare.align import STRATEGIES, align, load_mapping
from dumpdb.compare.align_sql import align_exact
from dumpdb.compare.metrics import (
    STAT_METRICS,
    STATS,
    TENSOR_METRICS,
    identical_metrics,
    tensor_metrics,
    tensor_metrics_batch,
)
from dumpdb.compare.precision import PrecisionRules, first_departure, judge_precision
from dumpdb.compare.stats_sql import statistics_metrics
from dumpdb.compare.verdict import Thresholds, op_results
from dumpdb.dtypes import from_catalog_name
from dumpdb.errors import DumpdbError

INFLIGHT_BYTES = 256 << 20
# Pairs of at most SMALL_ELEMENTS elements a side are read in storage order and computed
# BATCH_ELEMENTS at a time by metrics.tensor_metrics_batch (segment reductions: ~10 us a
# pair instead of ~0.3 ms for tensor_metrics' ~60 numpy calls).
SMALL_ELEMENTS = 1 << 16
BATCH_ELEMENTS = 1 << 19

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
)
RULES = ("precision", "msprobe")


def _plugin_metrics() -> tuple[str, ...]:
    """Registered plug-in metrics (dumpdb.compare.registry): returned, not stored."""
    registry.load_plugins()
    return registry.names(builtin=False)

_SELECT_SQL = """
SELECT t.tensor_id, t.run, t.rank, t.device_id, t.graph_id, t.iteration, t.op_type, t.op_name,
       t.scope_name, t.io, t.slot, t.arg_name, t.slot_path, t.direction, t.timestamp, t.dtype,
       t.dtype_declared,
       t.shape, t.nbytes, t.content_hash, t.min, t.max, t.mean, t.l2norm, t.requires_grad,
       t.nan_count, t.pos_inf_count, t.neg_inf_count, t.stats_source, t.call_index, t.tensor_key,
       t.source_file, b.array_path, b.elem_offset, b.elem_count,
       e.position, o.code_file, o.code_line, o.code_text
FROM tensors t
LEFT JOIN blobs b ON b.content_hash = t.content_hash
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
        conds, params = ["t.run = ?"], [self.run]
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


def select_rows(con, sel: Selection) -> pa.Table:
    """The ``tensors`` rows of a selection with what compare needs beside them (blob
    location, execution-order position, code line), as Arrow. Raises DumpdbError for an
    unknown run or an empty selection."""
    where, params = sel.where()
    table = con.sql(_SELECT_SQL.format(where=where), params=params).to_arrow_table()
    if table.num_rows == 0:
        known = con.execute("SELECT count(*) FROM runs WHERE run = ?", [sel.run]).fetchone()[0]
        if not known:
            raise DumpdbError(f"no run {sel.run!r} in the archive")
        raise DumpdbError(f"no tensors in {sel.describe()}")
    return table


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


_IO_ORDER = {"input": 0, "parameter": 1, "output": 2, "parameter_grad": 3}


def _pair_orders(rows: list[dict]) -> dict[int, tuple]:
    """Execution-order sort keys of target rows: iteration, rank, then graphs in the order
    they ran (their first timestamp in that iteration), position in the graph, timestamp,
    call index, inputs before outputs, slot, tensor_id (the key scan uses too)."""
    starts: dict[tuple, int] = {}
    for r in rows:
        key = (r["iteration"], r["rank"], r["graph_id"])
        ts = r["timestamp"] if r["timestamp"] is not None else 0
        starts[key] = min(starts.get(key, ts), ts)

    def n(v, default=-1):
        return default if v is None else v

    return {r["tensor_id"]: (
        n(r["iteration"]), n(r["rank"]), starts[(r["iteration"], r["rank"], r["graph_id"])], n(r["graph_id"]),
        r["position"] is None, n(r["position"], 0), n(r["timestamp"], 0), n(r["call_index"]),
        _IO_ORDER.get(r["io"], 9), n(r["slot"]), r["tensor_id"],
    ) for r in rows}


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
    array_path, offset, count, dtype, shape, _ = loc
    return store.read(array_path, offset, count or 0, from_catalog_name(dtype), tuple(shape))


def _pair_metrics(store, t: tuple, b: tuple, ranges=None) -> tuple[dict, str | None]:
    """Metrics of one pair; a payload both sides share (same hash and dtype) is read once."""
    a = _read(store, t)
    c = a if t[5] == b[5] and t[3] == b[3] and list(t[4]) == list(b[4]) else _read(store, b)
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


# Worker processes: numpy releases the GIL inside each operation, but the metrics make
# thousands of short calls per tensor, so threads serialise on the GIL (measured: two
# threads slower than one). Processes scale; each opens the store once.
_WORKER_STORE = None


def _init_worker(zstore) -> None:
    global _WORKER_STORE
    from dumpdb.storage.store import TensorStore

    # The metrics' dot products run on cache-sized chunks: BLAS threads only
    # contend with the other workers (measured: 2 processes 13 s -> 3 s).
    threadpool_limits(1, user_api="blas")
    registry.load_plugins()
    _WORKER_STORE = TensorStore(zstore, read_only=True)


def _pair_metrics_in_worker(t: tuple, b: tuple, ranges=None) -> tuple[dict, str | None]:
    return _pair_metrics(_WORKER_STORE, t, b, ranges)


PROCESS_MIN_BYTES = 64 << 20  # below this, starting worker processes costs more than it saves


def compare(archive, target: str | Selection, bench: str | Selection, *, iteration: int | None = None,
            rank: int | None = None, mapping: str | os.PathLike | Mapping[str, str] | None = None,
            strategies: Sequence[str] = STRATEGIES, thresholds: Thresholds | None = None,
            mode: str = "auto", workers: int | None = None, store_results: bool = True,
            progress: Callable[[int, int], None] | None = None, bench_rank: int | None = None,
            rules: str = "precision", precision: PrecisionRules | None = None) -> CompareOutcome:
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
    msprobe CSV always carries msprobe's.

    Returns a :class:`CompareOutcome`; with ``store_results`` the comparison is
    also stored (``compares``, ``compare_results``, ``compare_unmatched``).
    Raises DumpdbError for an unknown run, an empty selection or a bad mode.
    """
    if mode not in ("auto", "tensor", "statistics"):
        raise DumpdbError(f"unknown compare mode {mode!r}: use auto, tensor or statistics")
    if rules not in RULES:
        raise DumpdbError(f"unknown rules {rules!r}: use precision or msprobe")
    thresholds = thresholds or Thresholds()
    tsel = Selection.parse(target, iteration, rank)
    bsel = Selection.parse(bench, iteration, rank if bench_rank is None else bench_rank)
    try:
        mapping_dict = load_mapping(mapping) if isinstance(mapping, (str, os.PathLike)) else mapping
    except (OSError, ValueError) as exc:
        raise DumpdbError(f"mapping file: {exc}") from exc
    with archive.reader() as con:
        if bench_rank is not None and tsel.rank is None and not con.execute(
                "SELECT count(*) FROM tensors WHERE run = ? AND rank IS NOT NULL", [tsel.run]).fetchall()[0][0]:
            tsel = Selection(tsel.run, tsel.iteration, 0)  # a rankless target is rank 0 vs the bench's rank
        trows, brows = select_rows(con, tsel), select_rows(con, bsel)
    trows, brows = _proc_as_rank0(trows, brows), _proc_as_rank0(brows, trows)
    try:
        # the exact strategy in SQL when it settles the alignment (align_sql), else align()
        alignment = None if mapping_dict else align_exact(trows, brows, group_by=_group_by(tsel, bsel),
                                                          strategies=strategies)
        if alignment is None:
            alignment = align(trows, brows, group_by=_group_by(tsel, bsel), mapping=mapping_dict,
                              strategies=strategies)
    except ValueError as exc:
        raise DumpdbError(f"compare: {exc}") from exc
    target_rows = trows.to_pylist()
    tby = {r["tensor_id"]: r for r in target_rows}
    bby = {r["tensor_id"]: r for r in brows.to_pylist()}
    pairs = [(tby[p["target_tensor_id"]], bby[p["bench_tensor_id"]], p["match_strategy"])
             for p in alignment.pairs.to_pylist()]
    order = _pair_orders([p[0] for p in pairs])
    pairs.sort(key=lambda p: order[p[0]["tensor_id"]])
    rows = _compute(archive, pairs, mode, workers, progress)
    _judge(rows, thresholds)
    departure = _judge_precision(rows, target_rows, precision or PrecisionRules())
    column = "result" if rules == "msprobe" else "precision_result"
    unmatched = pa.concat_tables([
        alignment.unmatched_target.append_column("side", pa.array(["target"] * alignment.unmatched_target.num_rows)),
        alignment.unmatched_bench.append_column("side", pa.array(["bench"] * alignment.unmatched_bench.num_rows)),
    ], promote_options="default")
    summary = {
        "target": tsel.describe(), "bench": bsel.describe(), "pairs": len(rows),
        "mode": _overall_mode(rows),
        "rules": rules,
        "pass": sum(r[column] == "pass" for r in rows), "warning": sum(r[column] == "warning" for r in rows),
        "error": sum(r[column] == "error" for r in rows),
        "msprobe_result": {k: sum(r["result"] == k for r in rows) for k in ("pass", "warning", "error")},
        "precision_dtype": _lowest_dtype(rows),
        "unmatched_target": alignment.unmatched_target.num_rows,
        "unmatched_bench": alignment.unmatched_bench.num_rows,
        "strategies": {s: sum(r["match_strategy"] == s for r in rows) for s in strategies},
        "thresholds": thresholds.__dict__ if hasattr(thresholds, "__dict__") else str(thresholds),
        "dumpdb_version": __version__,
    }
    results = pa.Table.from_pylist(rows, schema=_result_schema())
    del rows, pairs, target_rows, tby, bby  # the Arrow table is the result from here on
    compare_id = _store(archive, tsel, bsel, results, unmatched, summary, mapping) if store_results else None
    summary["compare_id"] = compare_id
    results = results.set_column(results.column_names.index("compare_id"), "compare_id",
                                 pa.array([compare_id] * results.num_rows, pa.int64()))
    outcome = CompareOutcome(compare_id, results, unmatched, summary)
    outcome.first_divergence = first_divergence_of(results) if rules == "msprobe" else \
        _departure_report(results, departure)
    summary["first_difference"] = first_difference_of(results)
    return outcome


def _overall_mode(rows: list[dict]) -> str:
    modes = {r["mode"] for r in rows}
    return modes.pop() if len(modes) == 1 else ("mixed" if modes else "none")


def _pool(archive, pairs, mode, workers: int):
    """Worker processes for big comparisons, one thread otherwise."""
    tensor_bytes = sum((t["nbytes"] or 0) + (b["nbytes"] or 0) for t, b, _ in pairs) if mode != "statistics" else 0
    if workers > 1 and tensor_bytes >= PROCESS_MIN_BYTES:
        ctx = multiprocessing.get_context("forkserver")
        pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init_worker,
                                   initargs=(archive.store.zstore,))
        return pool, lambda t, b: pool.submit(_pair_metrics_in_worker, _loc(t), _loc(b), _ranges(t, b))
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dumpdb-compare")
    store = archive.store
    return pool, lambda t, b: pool.submit(_pair_metrics, store, _loc(t), _loc(b), _ranges(t, b))


def _compute(archive, pairs, mode, workers, progress) -> list[dict]:
    rows: list[dict] = [None] * len(pairs)  # type: ignore[list-item]
    done = 0
    workers = workers or os.cpu_count() or 2
    fast = not registry.metrics("tensor", builtin=False)  # plug-ins need both arrays of every pair
    small: list[int] = []
    large = []
    statistics: list[int] = []
    template = _row_template()
    for i, (t, b, strategy) in enumerate(pairs):
        row = _base_row(i, t, b, strategy, template)
        rows[i] = row
        tensor_mode = mode != "statistics" and t["content_hash"] is not None and b["content_hash"] is not None
        if mode == "tensor" and not tensor_mode:
            row["err_message"] = "no payload on one side: statistics compared instead"
        if not tensor_mode:
            row["mode"] = "statistics"
            statistics.append(i)
            continue
        row["mode"] = "tensor"
        same = _identical(t, b) if fast else None
        if same is not None:
            row.update(same[0])
            row["err_message"] = _join(row["err_message"], same[1])
            done += 1
        elif fast and _is_small(t, b):
            small.append(i)
        else:
            large.append(i)
    done += _compute_statistics(pairs, rows, statistics)
    if progress and done:
        progress(done, len(pairs))
    with threadpool_limits(1, user_api="blas"):  # as the per-pair paths: the same BLAS sums, bit for bit
        done = _compute_small(archive.store, pairs, rows, small, done, progress)
    if not large:
        return rows
    pool, submit = _pool(archive, [pairs[i] for i in large], mode, workers)
    with pool, threadpool_limits(1, user_api="blas"):
        inflight: deque = deque()
        inflight_bytes = 0
        for i in large:
            t, b, _ = pairs[i]
            size = (t["nbytes"] or 0) + (b["nbytes"] or 0)
            while inflight and inflight_bytes + size > INFLIGHT_BYTES:
                inflight_bytes -= _finish(inflight.popleft(), rows)
                done += 1
                if progress:
                    progress(done, len(pairs))
            inflight.append((i, size, submit(t, b)))
            inflight_bytes += size
        while inflight:
            _finish(inflight.popleft(), rows)
            done += 1
            if progress:
                progress(done, len(pairs))
    return rows


def _compute_statistics(pairs, rows: list[dict], statistics: list[int]) -> int:
    """Statistics-mode metrics of the pairs ``statistics`` in one DuckDB query
    (stats_sql.statistics_metrics). Returns how many."""
    if not statistics:
        return 0
    sides = []
    for side in (0, 1):
        cols = {"tensor_id": pa.array([pairs[i][side]["tensor_id"] for i in statistics], pa.int64())}
        for k in STATS:
            cols[k] = pa.array([pairs[i][side][k] for i in statistics], pa.float64())
        sides.append(pa.table(cols))
    index = pa.table({"pair_index": pa.array(statistics, pa.int64()),
                      "target_tensor_id": sides[0].column("tensor_id"),
                      "bench_tensor_id": sides[1].column("tensor_id")})
    out = statistics_metrics(index, sides[0], sides[1])
    names = list(STAT_METRICS)
    columns = [out.column(c).to_pylist() for c in ("pair_index", *names, "err_message")]
    for i, *values, message in zip(*columns):
        row = rows[i]
        row.update(zip(names, values))
        row["err_message"] = _join(row["err_message"], message)
    return len(statistics)


def _identical(t: dict, b: dict) -> tuple[dict, str | None] | None:
    """Metrics of a pair whose payloads are the same bytes (content hash, dtype and shape
    equal), from the definitions (metrics.identical_metrics), when the catalog's NaN/Inf
    counts are dumpdb's own; None otherwise (then the payload is read once)."""
    if t["content_hash"] != b["content_hash"] or t["dtype"] != b["dtype"] or t["shape"] != b["shape"]:
        return None
    if t["stats_source"] != "computed" or t["shape"] is None:
        return None
    counts = (t["nan_count"], t["pos_inf_count"], t["neg_inf_count"])
    if any(c is None for c in counts):
        return None
    return identical_metrics(tuple(t["shape"]), from_catalog_name(t["dtype"]), sum(counts))


def _elements(row: dict) -> int | None:
    shape = row["shape"]
    return None if shape is None else math.prod(shape)


def _is_small(t: dict, b: dict) -> bool:
    n = _elements(t)
    return n is not None and t["shape"] == b["shape"] and n <= SMALL_ELEMENTS and t["array_path"] is not None \
        and b["array_path"] is not None


def _compute_small(store, pairs, rows: list[dict], small: list[int], done: int, progress) -> int:
    """Small pairs in batches: payloads read in storage order (pack, offset: the chunk
    cache serves neighbours), metrics by tensor_metrics_batch. Returns ``done``."""
    small.sort(key=lambda i: (pairs[i][0]["array_path"], pairs[i][0]["elem_offset"] or 0))
    start = 0
    while start < len(small):
        end, elements = start, 0
        while end < len(small) and (end == start or elements < BATCH_ELEMENTS):
            elements += 2 * (_elements(pairs[small[end]][0]) or 0)
            end += 1
        batch = small[start:end]
        targets = [_read(store, _loc(pairs[i][0])) for i in batch]
        # a payload both sides share (same hash, dtype, shape) is read once
        benches = [a if _loc(pairs[i][0]) == _loc(pairs[i][1]) else _read(store, _loc(pairs[i][1]))
                   for a, i in zip(targets, batch)]
        for i, (metrics, message) in zip(batch, tensor_metrics_batch(targets, benches)):
            rows[i].update(metrics)
            rows[i]["err_message"] = _join(rows[i]["err_message"], message)
        done += len(batch)
        if progress:
            progress(done, len(pairs))
        start = end
    return done


def _finish(item, rows) -> int:
    i, size, future = item
    metrics, message = future.result()
    rows[i].update(metrics)
    rows[i]["err_message"] = _join(rows[i]["err_message"], message)
    # statistics differences are cheap and useful in tensor mode too
    return size


def _join(a: str | None, b: str | None) -> str | None:
    return "; ".join(x for x in (a, b) if x) or None


# (row key, pair side 0 target / 1 bench, tensors column) copied into every result row
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
    ("code_text", 0, "code_text"), ("target_source_file", 0, "source_file"),
    *((f"{side}_{k}", n, k) for n, side in enumerate(("target", "bench")) for k in ("max", "min", "mean", "l2norm")),
)


def _base_row(i: int, t: dict, b: dict, strategy: str, template: dict | None = None) -> dict:
    """A result row of pair ``i``: every column None, then the pair's context.
    ``template``: :func:`_row_template` (given by callers building many rows)."""
    row = (template or _row_template()).copy()
    sides = (t, b)
    for key, side, column in _ROW_FIELDS:
        row[key] = sides[side][column]
    row["pair_index"] = i
    row["match_strategy"] = strategy
    return row


def _row_template() -> dict:
    return dict.fromkeys((*RESULT_COLUMNS, *CONTEXT_COLUMNS, *_plugin_metrics()))


def _judge(rows: list[dict], thresholds: Thresholds) -> None:
    """msprobe's verdicts per op: rows grouped by (iteration, rank, target op)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        # one op call: the same name can run in several graphs or calls of one iteration
        groups[(r["iteration"], r["rank"], r["graph_id"], r["call_index"], r["target_name"])].append(r)
    for group in groups.values():
        mode = "statistics" if all(r["mode"] == "statistics" for r in group) else "tensor"
        views = [{**r, "dtype": (r["target_dtype"], r["bench_dtype"]), "shape": (r["target_shape"], r["bench_shape"])}
                 for r in group]
        for r, (result, reason) in zip(group, op_results(views, thresholds, mode=mode)):
            r["result"] = result
            if reason and result != "pass":
                r["err_message"] = _join(r["err_message"], reason)


def _result_schema() -> pa.Schema:
    ints = {"compare_id", "pair_index", "target_tensor_id", "bench_tensor_id", "iteration", "position",
            "timestamp"}
    small = {"slot", "rank", "code_line", "graph_id", "call_index"}
    strings = {"target_name", "bench_name", "io", "match_strategy", "mode", "result", "err_message", "op_type",
               "scope_name", "target_dtype", "bench_dtype", "code_file", "code_text", "target_source_file",
               "target_content_hash", "bench_content_hash", "precision_dtype", "precision_result",
               "precision_reason", "target_dtype_declared", "bench_dtype_declared"}
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
        elif c.endswith("requires_grad"):
            t = pa.bool_()
        else:
            t = pa.float64()
        fields.append((c, t))
    return pa.schema(fields)


def _store(archive, tsel: Selection, bsel: Selection, rows: pa.Table, unmatched: pa.Table,
           summary: dict, mapping) -> int:
    options = {"strategies": summary["strategies"], "thresholds": summary["thresholds"],
               "mapping": str(mapping) if isinstance(mapping, (str, os.PathLike)) else bool(mapping)}
    held = archive.holding
    if held:
        archive.close()  # DuckDB: this process cannot write while it holds a read-only connection
    try:
        return _insert(archive, tsel, bsel, rows, unmatched, summary, options)
    finally:
        if held:
            archive.__enter__()


def _insert(archive, tsel, bsel, rows, unmatched, summary, options) -> int:
    with archive.catalog.writer() as con:
        compare_id = con.execute("SELECT nextval('compare_id_seq')").fetchone()[0]
        con.execute(
            "INSERT INTO compares (compare_id, target_run, bench_run, target_selection, bench_selection, mode, "
            "options, pairs, unmatched_target, unmatched_bench, dumpdb_version) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            [compare_id, tsel.run, bsel.run, tsel.describe(), bsel.describe(), summary["mode"],
             json.dumps(options, default=str), rows.num_rows, summary["unmatched_target"],
             summary["unmatched_bench"], __version__])
        stored = rows.select(list(RESULT_COLUMNS))
        stored = stored.set_column(0, "compare_id", pa.array([compare_id] * stored.num_rows, pa.int64()))
        insert_arrow(con, "compare_results", stored)
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
        "path": ops[-context:],
    }


def _judge_precision(rows: list[dict], target_rows: list[dict], rules: PrecisionRules) -> dict | None:
    """Precision columns on ``rows`` (dumpdb.compare.precision) and the first departure.
    Producers of inputs: every target output (compared or not) by content hash."""
    pair_order = _pair_orders(target_rows)
    order = {t["tensor_id"]: (t["timestamp"] is None, t["timestamp"] or 0, pair_order[t["tensor_id"]])
             for t in target_rows}
    compared = {r["target_tensor_id"] for r in rows}
    producers: dict[str, list] = defaultdict(list)
    for t in target_rows:
        if t["io"] == "output" and t["content_hash"] is not None:
            producers[t["content_hash"]].append((order[t["tensor_id"]], t["op_name"], t["tensor_id"] in compared))
    for v in producers.values():
        v.sort(key=lambda p: p[0])
    for r in rows:
        r["_order"] = order[r["target_tensor_id"]]
    judge_precision(rows, producers, rules)
    departure = first_departure(rows)
    for r in rows:
        r.pop("_order", None)
        r.pop("origin_op", None)
    return departure


def _lowest_dtype(rows: list[dict]) -> str | None:
    """The lowest precision any pair was judged at (for "no departure beyond float16")."""
    from dumpdb.compare.precision import dtype_floor

    dtypes = {r["precision_dtype"] for r in rows if r.get("precision_dtype")}
    return max(dtypes, key=lambda d: dtype_floor(d, 1, 1.0) or 0.0, default=None)


def _departure_report(results: pa.Table, departure: dict | None, context: int = 10) -> dict[str, Any] | None:
    """first_divergence_of's dict for the precision rules' first departing op, plus
    ``inputs``/``outputs`` (errors side by side), ``origin_op`` (an op only the target
    has that produced a departing input) and ``rules``."""
    if departure is None:
        return None
    row = departure["row"]
    first = results.slice(row["pair_index"], 1).to_pylist()[0]
    before = [r for r in results.slice(0, first["pair_index"]).select(["iteration", "rank", "target_name"]).to_pylist()
              if r["iteration"] == first["iteration"] and r["rank"] == first["rank"]]
    ops = _ops_path(before)
    return {
        **{k: first[k] for k in ("pair_index", "target_name", "bench_name", "scope_name", "op_type", "io", "slot",
                                 "iteration", "rank", "position", "code_file", "code_line", "code_text",
                                 "target_tensor_id", "bench_tensor_id", "scaled_err", "precision_floor",
                                 "precision_ratio", "precision_dtype", *TENSOR_METRICS, *STAT_METRICS)},
        "result": first["precision_result"], "err_message": first["precision_reason"],
        "origin_op": departure["origin_op"], "inputs": departure["inputs"], "outputs": departure["outputs"],
        "rules": "precision", "path": ops[-context:],
    }


def _ops_path(before: list[dict]) -> list[str]:
    """The target op names of ``before`` in order, consecutive repeats (an op's several
    slots) once: the ops a divergence report lists before the first departing op."""
    ops: list[str] = []
    for r in before:
        if not ops or ops[-1] != r["target_name"]:
            ops.append(r["target_name"])
    return ops
