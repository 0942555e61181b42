"""What the pages of ``dumpdb serve`` show, as JSON-ready dicts: runs, a run's model tree,
search, an op's tensors, a tensor's or a pair's heatmap and histogram, the rank grid, SQL.

Every catalog read goes through :meth:`dumpdb.Archive.sql` (the sandbox of ``dumpdb sql``:
a short-lived read-only attach per query, so an ingest into the archive is never blocked for
longer than one query) with a time limit; every result is bounded in rows (``limit``
arguments, clamped) and a tensor result in bytes (heatmaps are downsampled, downloads
capped). Names arrive from requests as query parameters and are only ever bound as SQL
parameters: no request value reaches the file system.

The model tree (issue 28): a tensor's *path* is its MindSpore scope name split at ``/``
(``Default/network-.../conv1-Conv2d/Conv2D-op5``); for a run with msprobe's construct.json
(``module_tree``) it is the chain of its op's parent modules down to the op
(``Module.mlp.Sequential.forward.0/Module.mlp.0.Linear.forward.0/Functional.linear.0.forward``);
otherwise its op name, top-level. A node aggregates every tensor below it.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import pyarrow as pa

from dumpdb.errors import DumpdbError

QUERY_TIMEOUT = 10.0  # seconds a catalog query of a page may run (Archive.sql(timeout=))
MAX_CHILDREN = 2000  # rows of one tree / compare-tree request
MAX_SEARCH = 200
MAX_TENSOR_ROWS = 2000
MAX_HEATMAP_SIDE = 1024  # cells per heatmap side: <= 4 MiB of float32 per response
MAX_BINS = 512
MAX_READ_BYTES = 1 << 30  # a payload larger than this is not read for a heatmap / histogram
MAX_DOWNLOAD_BYTES = 512 << 20  # a .npy download larger than this is refused


def clamp(value: int | None, default: int, top: int, bottom: int = 1) -> int:
    """``value`` (a request parameter) bounded to ``[bottom, top]``; ``default`` when None."""
    return default if value is None else max(bottom, min(int(value), top))


def rows_of(table: pa.Table) -> list[dict[str, Any]]:
    return table.to_pylist()


# -- runs ----------------------------------------------------------------------------------------------
def runs(archive) -> list[dict[str, Any]]:
    """``Archive.runs()`` (state, layout, counts, bytes, dates) plus each run's ranks and
    iterations counts."""
    table = archive.runs()
    extra = {r["run"]: r for r in rows_of(archive.sql(
        "SELECT run, count(DISTINCT rank) AS ranks, count(DISTINCT iteration) AS iterations, "
        "count(DISTINCT coalesce(scope_name, op_name)) AS ops FROM tensors GROUP BY run", timeout=QUERY_TIMEOUT))}
    out = []
    for r in rows_of(table):
        e = extra.get(r["run"], {})
        r.update(ranks=e.get("ranks", 0), iterations=e.get("iterations", 0), ops=e.get("ops", 0))
        out.append(r)
    return out


def check_run(archive, run: str) -> None:
    """RunNotFound (listing the runs) unless the archive has ``run``."""
    archive.require_run(run)


# -- the model tree ---------------------------------------------------------------------------------------
# The tensors of run $run with their tree path (module docstring). The module chain is a
# recursive walk of module_tree from its roots, bounded in depth (a cycle in a hostile
# construct.json ends there); a node with several parents (ranks) takes the first path.
PATHS_SQL = """
WITH RECURSIVE edges AS (SELECT DISTINCT node, parent FROM module_tree WHERE run = $run),
chain(node, path, depth) AS (
    SELECT node, node, 0 FROM edges WHERE parent IS NULL
    UNION ALL
    SELECT e.node, c.path || '/' || e.node, c.depth + 1 FROM edges e JOIN chain c ON e.parent = c.node
    WHERE c.depth < 64
),
modules AS (SELECT node, min(path) AS path FROM chain GROUP BY node),
positions AS (SELECT scope_name, min(position) AS position FROM execution_order WHERE run = $run GROUP BY 1),
overflowed AS (SELECT DISTINCT op_name FROM overflows WHERE run = $run),
paths AS (
    SELECT t.*, coalesce(m.path, t.scope_name, t.op_name) AS path, coalesce(t.scope_name, t.op_name) AS op,
           p.position, o.op_name IS NOT NULL AS overflow
    FROM tensors t
    LEFT JOIN modules m ON m.node = t.op_name
    LEFT JOIN positions p ON p.scope_name = t.scope_name
    LEFT JOIN overflowed o ON o.op_name = t.op_name
    WHERE t.run = $run
)
"""

# NaN / Inf of a tensor: its counts, else (statistics-only dumps without counts) its max/min.
NAN = "coalesce(nan_count > 0, isnan(max) OR isnan(min), false)"
INF = "coalesce(pos_inf_count + neg_inf_count > 0, isinf(max) OR isinf(min), false)"

CHILDREN_SQL = PATHS_SQL + f""",
below AS (
    SELECT *, CASE WHEN $prefix = '' THEN path ELSE substr(path, length($prefix) + 2) END AS rest FROM paths
    WHERE $prefix = '' OR starts_with(path, $prefix || '/')
)
SELECT split_part(rest, '/', 1) AS name, count(*) AS tensors, count(DISTINCT path) AS ops,
       bool_or(contains(rest, '/')) AS has_children,
       any_value(op) FILTER (NOT contains(rest, '/')) AS op,
       any_value(op_type) FILTER (NOT contains(rest, '/')) AS op_type,
       count_if({NAN}) AS nan_tensors, count_if({INF}) AS inf_tensors, count_if(overflow) AS overflow_tensors,
       min(min) AS min, max(max) AS max, min(position) AS position
FROM below GROUP BY 1 ORDER BY min(position) NULLS LAST, min(tensor_id) LIMIT $limit OFFSET $offset
"""

SEARCH_SQL = PATHS_SQL + """
SELECT path, any_value(op) AS op, any_value(op_type) AS op_type, count(*) AS tensors FROM paths
WHERE contains(lower(path), lower($q)) GROUP BY path ORDER BY min(position) NULLS LAST, min(tensor_id) LIMIT $limit
"""


def children(archive, run: str, path: str = "", *, limit: int | None = None, offset: int = 0) -> dict[str, Any]:
    """The children of tree node ``path`` ('' = the root) of ``run``, in execution order:
    ``name`` (the path segment), ``path``, ``tensors``, ``ops`` (distinct ops below),
    ``has_children``, ``op`` / ``op_type`` when the node is itself an op, ``nan_tensors`` /
    ``inf_tensors`` / ``overflow_tensors`` (tensors holding NaN, +-Inf, or of an op in the
    dump's overflow records), ``min`` / ``max`` (over the tensors' statistics). At most
    ``limit`` rows from ``offset``; ``more`` says whether rows were left. RunNotFound."""
    check_run(archive, run)
    limit = clamp(limit, 500, MAX_CHILDREN)
    rows = rows_of(archive.sql(CHILDREN_SQL, {"run": run, "prefix": path, "limit": limit + 1,
                                              "offset": max(0, int(offset))}, timeout=QUERY_TIMEOUT))
    for r in rows:
        r["path"] = f"{path}/{r['name']}" if path else r["name"]
    return {"run": run, "path": path, "children": rows[:limit], "more": len(rows) > limit, "offset": offset}


def search(archive, run: str, q: str, *, limit: int | None = None) -> dict[str, Any]:
    """Ops of ``run`` whose tree path contains ``q`` (case-insensitive), in execution
    order, at most ``limit``: ``path``, ``op``, ``op_type``, ``tensors``."""
    check_run(archive, run)
    limit = clamp(limit, 100, MAX_SEARCH)
    if not q:
        return {"run": run, "q": q, "matches": [], "more": False}
    rows = rows_of(archive.sql(SEARCH_SQL, {"run": run, "q": q, "limit": limit + 1}, timeout=QUERY_TIMEOUT))
    return {"run": run, "q": q, "matches": rows[:limit], "more": len(rows) > limit}


# -- an op and its tensors ----------------------------------------------------------------------------------
TENSOR_COLUMNS = ("tensor_id, run, rank, iteration, graph_id, op_type, op_name, scope_name, io, slot, arg_name, "
                  "direction, dtype, shape, format, nbytes, content_hash IS NOT NULL AND pruned_at IS NULL AS stored, "
                  "min, max, mean, l2norm, count, nan_count, pos_inf_count, neg_inf_count, zero_count, "
                  "stats_source, source_file")


def op(archive, run: str, name: str, *, limit: int | None = None) -> dict[str, Any]:
    """An op of ``run`` (its scope name or op name): its tensors (every iteration and rank,
    at most ``limit``), its source line and call stack (``ops``; msprobe ``call_stacks``)."""
    check_run(archive, run)
    limit = clamp(limit, 500, MAX_TENSOR_ROWS)
    params = {"run": run, "name": name, "limit": limit + 1}
    tensors = rows_of(archive.sql(
        f"SELECT {TENSOR_COLUMNS} FROM tensors WHERE run = $run AND (scope_name = $name OR op_name = $name) "
        "ORDER BY rank NULLS FIRST, iteration, CASE io WHEN 'input' THEN 0 WHEN 'parameter' THEN 1 ELSE 2 END, "
        "slot, tensor_id LIMIT $limit", params, timeout=QUERY_TIMEOUT))
    source = rows_of(archive.sql(
        "SELECT op_type, ir_op_type, code_file, code_line, code_text, code_trace, input_shapes, input_dtypes, "
        "output_shapes, output_dtypes FROM ops WHERE run = $run AND scope_name = $name LIMIT 1",
        {"run": run, "name": name}, timeout=QUERY_TIMEOUT))
    stacks = rows_of(archive.sql(
        "SELECT rank, iteration, frames FROM call_stacks WHERE run = $run AND op_name = $name LIMIT 4",
        {"run": run, "name": name}, timeout=QUERY_TIMEOUT))
    if not tensors:
        raise DumpdbError(f"no op {name!r} in run {run!r}")
    return {"run": run, "op": name, "tensors": tensors[:limit], "more": len(tensors) > limit,
            "source": source[0] if source else None, "stacks": stacks}


def tensor_info(archive, tensor_id: int) -> dict[str, Any]:
    """The catalog row of one tensor (TensorNotFound for an unknown id)."""
    from dumpdb.errors import TensorNotFound

    rows = rows_of(archive.sql(f"SELECT {TENSOR_COLUMNS} FROM tensors WHERE tensor_id = $id",
                               {"id": int(tensor_id)}, timeout=QUERY_TIMEOUT))
    if not rows:
        raise TensorNotFound(f"no tensor with tensor_id {tensor_id} in {archive.path}")
    return rows[0]


# -- tensor pictures ------------------------------------------------------------------------------------------
def read(archive, tensor_id: int, cap: int = MAX_READ_BYTES) -> np.ndarray:
    """The payload of ``tensor_id`` (host format), refused above ``cap`` bytes."""
    loc = archive.locations.get(int(tensor_id))
    if loc is not None and (loc.nbytes or 0) > cap:
        raise DumpdbError(f"tensor {tensor_id}: {loc.nbytes} bytes is more than dumpdb serve reads ({cap})")
    return archive.tensor(int(tensor_id), host_format=True)


def as_float(a: np.ndarray) -> np.ndarray:
    """``a`` as a float array for pictures: float64 stays, everything else float32
    (float16/bfloat16/ints/bool widened; complex as its modulus)."""
    if np.iscomplexobj(a):
        a = np.abs(a)
    if a.dtype == np.float64:
        return a
    if a.dtype == np.float32:
        return a
    return a.astype(np.float32)


def grid(a: np.ndarray) -> np.ndarray:
    """A 2-D view of ``a``: the last axis as columns, all others folded into rows (a 0-d or
    1-d tensor is one row)."""
    if a.ndim == 0:
        return a.reshape(1, 1)
    if a.ndim == 1:
        return a.reshape(1, -1)
    return a.reshape(-1, a.shape[-1])


def _reduce(m: np.ndarray, axis: int, cells: int, how: str) -> np.ndarray:
    """``m`` reduced along ``axis`` (0 or 1) to about ``cells`` blocks of ``ceil(n / cells)``
    elements (the last block takes the rest): whole blocks through a reshape (one vectorised
    reduction, ~10x faster than ``ufunc.reduceat`` over 16M elements), the rest apart. 'mean'
    gives block means, 'max' block maxima."""
    n = m.shape[axis]
    block = -(-n // max(1, min(cells, n)))
    full = n // block * block
    head = m[:full] if axis == 0 else m[:, :full]
    tail = m[full:] if axis == 0 else m[:, full:]
    shaped = head.reshape(full // block, block, -1) if axis == 0 else head.reshape(m.shape[0], full // block, block)
    inner = 1 if axis == 0 else 2
    if how == "max":
        parts = [shaped.max(axis=inner)]
        if tail.shape[axis]:
            parts.append(tail.max(axis=axis, keepdims=True))
    else:
        parts = [shaped.sum(axis=inner) / block]
        if tail.shape[axis]:
            parts.append(tail.sum(axis=axis, keepdims=True) / tail.shape[axis])
    return np.concatenate(parts, axis=axis) if len(parts) > 1 else parts[0]


def downsample(m: np.ndarray, height: int, width: int, how: str = "mean") -> np.ndarray:
    """Reduce the 2-D ``m`` to at most about ``height`` x ``width`` cells, each the ``how``
    ('mean' or 'max') of its block of rows and columns (equal blocks, the last row / column of
    blocks taking the rest); NaN and Inf propagate (a block holding one shows it)."""
    return _reduce(_reduce(m, 1, width, how), 0, height, how)


def heatmap_of(values: np.ndarray, height: int | None, width: int | None, how: str) -> dict[str, Any]:
    """The downsampled heatmap of ``values`` as JSON: ``rows``/``cols`` (cells),
    ``source_rows``/``source_cols`` (the 2-D view's size), ``reduce``, ``min``/``max`` over the
    finite cells, ``data``: base64 of the cells as little-endian float32, row by row."""
    m = grid(values)
    cells = downsample(m, clamp(height, 256, MAX_HEATMAP_SIDE), clamp(width, 256, MAX_HEATMAP_SIDE), how)
    cells32 = cells.astype("<f4")
    finite = cells32[np.isfinite(cells32)]
    return {"rows": int(cells.shape[0]), "cols": int(cells.shape[1]), "source_rows": int(m.shape[0]),
            "source_cols": int(m.shape[1]), "reduce": how,
            "min": float(finite.min()) if finite.size else None, "max": float(finite.max()) if finite.size else None,
            "data": base64.b64encode(cells32.tobytes()).decode("ascii")}


def histogram_of(values: np.ndarray, bins: int | None) -> dict[str, Any]:
    """A histogram of the finite values of ``values``: ``edges`` (bins + 1), ``counts``,
    and ``nan`` / ``pos_inf`` / ``neg_inf`` counts beside it."""
    flat = values.reshape(-1)
    finite = np.isfinite(flat)
    all_finite = bool(finite.all())
    vals = flat if all_finite else flat[finite]
    nan = 0 if all_finite else int(np.isnan(flat).sum())
    pos = 0 if all_finite else int(np.isposinf(flat).sum())
    counts, edges = (np.histogram(vals, bins=clamp(bins, 64, MAX_BINS)) if vals.size
                     else (np.zeros(0, np.int64), np.zeros(0)))
    return {"edges": [float(e) for e in edges], "counts": [int(c) for c in counts], "values": int(flat.size),
            "nan": nan, "pos_inf": pos, "neg_inf": int(flat.size - vals.size - nan - pos)}


def tensor_heatmap(archive, tensor_id: int, height: int | None = None, width: int | None = None) -> dict[str, Any]:
    """A tensor's heatmap (block means, see :func:`heatmap_of`) plus its shape and dtype."""
    a = read(archive, tensor_id)
    return {"tensor_id": int(tensor_id), "shape": list(a.shape), "dtype": str(a.dtype),
            **heatmap_of(as_float(a), height, width, "mean")}


def tensor_histogram(archive, tensor_id: int, bins: int | None = None) -> dict[str, Any]:
    a = read(archive, tensor_id)
    return {"tensor_id": int(tensor_id), **histogram_of(as_float(a), bins)}


def pair_difference(archive, target: int, bench: int) -> np.ndarray:
    """``target - bench`` elementwise (float32, float64 if either side is float64). Two shapes
    of the same element count are compared in C order (as compare does); other shapes raise
    DumpdbError naming both."""
    t, b = as_float(read(archive, target)), as_float(read(archive, bench))
    if t.size != b.size:
        raise DumpdbError(f"tensors {target} and {bench} have shapes {list(t.shape)} and {list(b.shape)}: "
                          "no elementwise difference")
    dtype = np.float64 if np.float64 in (t.dtype, b.dtype) else np.float32
    out: np.ndarray = np.subtract(t.astype(dtype, copy=False), b.astype(dtype, copy=False).reshape(t.shape))
    return out


def pair_heatmap(archive, target: int, bench: int, height: int | None = None,
                 width: int | None = None) -> dict[str, Any]:
    """The difference heatmap of a pair: each cell the largest ``|target - bench|`` of its
    block (a block where one side is NaN shows NaN)."""
    d = pair_difference(archive, target, bench)
    return {"target": int(target), "bench": int(bench), "shape": list(d.shape),
            **heatmap_of(np.abs(d), height, width, "max")}


def pair_histogram(archive, target: int, bench: int, bins: int | None = None) -> dict[str, Any]:
    """The histogram of ``target - bench``."""
    return {"target": int(target), "bench": int(bench), **histogram_of(pair_difference(archive, target, bench), bins)}


def npy_bytes(archive, tensor_id: int) -> bytes:
    """The tensor as a ``.npy`` file (bit for bit as dumped, catalog dtype and shape),
    refused above :data:`MAX_DOWNLOAD_BYTES`."""
    import io

    a = read(archive, tensor_id, MAX_DOWNLOAD_BYTES)
    out = io.BytesIO()
    np.save(out, a, allow_pickle=False)
    return out.getvalue()


# -- ranks ---------------------------------------------------------------------------------------------------
def ranks(archive, run: str, iteration: int | None = None, max_ops: int | None = None) -> dict[str, Any]:
    """The rank x op grid of ``run`` (:func:`dumpdb.checks.ranks.rank_op_grid`) and the rank
    groups (:func:`dumpdb.checks.ranks.rank_groups`)."""
    from dumpdb.checks.ranks import rank_groups, rank_op_grid

    grid_rows, total = rank_op_grid(archive, run, iteration=iteration, max_ops=clamp(max_ops, 2000, 5000))
    ops: list[dict[str, Any]] = []
    ranks_seen: list[Any] = []
    cells: dict[str, list[str]] = {}
    for r in rows_of(grid_rows):
        if r["op_index"] == len(ops):
            ops.append({"op_name": r["op_name"], "iteration": r["iteration"]})
        key = str(r["rank"])
        if key not in cells:
            cells[key] = []
            ranks_seen.append(r["rank"])
        cells[key].append(r["state"])
    return {"run": run, "ranks": ranks_seen, "ops": ops, "ops_total": total,
            "cells": [cells[str(k)] for k in ranks_seen], "groups": rows_of(rank_groups(archive, run,
                                                                                         iteration=iteration))}


# -- SQL -------------------------------------------------------------------------------------------------------
MAX_PAGE = 1000
MAX_EXPORT_ROWS = 1_000_000


def _bounded_query(query: str) -> tuple[str, bool]:
    """``query`` wrapped so that LIMIT/OFFSET can be added (a single SELECT-like statement),
    or as is (PRAGMA, DESCRIBE, SHOW, EXPLAIN; their results are small) and False."""
    import duckdb

    try:
        statements = duckdb.extract_statements(query)
    except duckdb.Error:
        return query, False
    if len(statements) != 1:
        raise DumpdbError(f"give one SQL statement (got {len(statements)})")
    if statements[0].type.name == "SELECT":
        return f"SELECT * FROM ({query.strip().rstrip(';')}) AS q", True
    return query, False


def sql_page(archive, query: str, page: int = 0, page_size: int | None = None) -> dict[str, Any]:
    """One page of ``query``'s rows through :meth:`Archive.sql` (the ``dumpdb sql`` sandbox,
    time-limited): ``columns``, ``rows`` (lists), ``page``, ``more``."""
    if not query.strip():
        raise DumpdbError("empty query")
    size = clamp(page_size, 100, MAX_PAGE)
    page = max(0, int(page))
    wrapped, pageable = _bounded_query(query)
    if pageable:
        table = archive.sql(f"{wrapped} LIMIT {size + 1} OFFSET {page * size}", timeout=QUERY_TIMEOUT)
    else:
        table = archive.sql(wrapped, timeout=QUERY_TIMEOUT).slice(page * size, size + 1)
    more = table.num_rows > size
    table = table.slice(0, size)
    return {"query": query, "columns": table.column_names, "rows": [list(r.values()) for r in table.to_pylist()],
            "page": page, "page_size": size, "more": more}


def sql_export(archive, query: str, fmt: str) -> tuple[bytes, str]:
    """``query``'s rows (at most :data:`MAX_EXPORT_ROWS`) as ``csv``, ``json`` or ``parquet``
    bytes, with the media type."""
    if fmt not in ("csv", "json", "parquet"):
        raise DumpdbError(f"unknown format {fmt!r}: csv, json or parquet")
    if not query.strip():
        raise DumpdbError("empty query")
    wrapped, pageable = _bounded_query(query)
    table = archive.sql(f"{wrapped} LIMIT {MAX_EXPORT_ROWS}" if pageable else wrapped, timeout=QUERY_TIMEOUT)
    table = table.slice(0, MAX_EXPORT_ROWS)
    if fmt == "parquet":
        import io

        import pyarrow.parquet as pq

        out = io.BytesIO()
        pq.write_table(table, out, compression="zstd")
        return out.getvalue(), "application/vnd.apache.parquet"
    from dumpdb.render.tables import as_text

    return as_text(table, fmt).encode("utf-8"), "text/csv" if fmt == "csv" else "application/json"


