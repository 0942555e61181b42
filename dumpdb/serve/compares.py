"""The compare view of ``dumpdb serve``: a stored compare (``compares`` / ``compare_results``)
or a new one run through :func:`dumpdb.compare.engine.compare` with ``store_results=False``
(serving never writes the archive), held in memory as one Arrow table of pairs and unmatched
tensors with both sides' tree paths (:data:`dumpdb.serve.queries.PATHS_SQL`).

The two trees, the error plot and the filters are DuckDB queries over that table, on a private
in-memory DuckDB with file access disabled (:func:`dumpdb.sql_sandbox.lock_down`).

Verdicts: a new compare shows the precision rules' ``precision_result`` and plots ``scaled_err``
(relative Euclidean error) against ``precision_floor`` (:mod:`dumpdb.compare.precision`); a
stored compare keeps msprobe's ``result`` only, so it shows that and plots ``rel_euc_dist``
without a floor. The first departure is the engine's (``first_divergence``; for a stored compare
:func:`dumpdb.compare.engine.first_divergence_of` over the stored rows); per-phase and per-rank
firsts are shown when the engine's report carries them (any list or dict of reports with a
``pair_index``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import duckdb
import pyarrow as pa

from dumpdb.errors import DumpdbError
from dumpdb.serve.queries import MAX_CHILDREN, PATHS_SQL, QUERY_TIMEOUT, clamp

SEVERITY = {"pass": 0, "warning": 1, "error": 2}
PLOT_POINTS = 2000


class CompareView:
    """One compare, in memory: ``pairs`` (Arrow: ``kind`` 'pair' / 'inserted' (target only) /
    'removed' (bench only), ``pair_index``, ``t_id``/``b_id``, ``t_path``/``b_path``,
    ``t_op``/``b_op``, ``verdict``, ``sev`` (0 pass, 1 warning, 2 error), ``err``, ``floor``,
    ``op_type``, ``io``, ``slot``, ``iteration``, ``rank``, ``phase``), ``summary`` and
    ``firsts`` (the first departures: overall, then per phase / rank when reported)."""

    def __init__(self, key: dict[str, Any], pairs: pa.Table, summary: dict[str, Any],
                 firsts: list[dict[str, Any]], verdict_rule: str, error_metric: str) -> None:
        self.key, self.pairs, self.summary, self.firsts = key, pairs, summary, firsts
        self.verdict_rule, self.error_metric = verdict_rule, error_metric
        self._lock = threading.Lock()
        self._con = duckdb.connect(":memory:")
        from dumpdb.sql_sandbox import lock_down

        self._con.register("pairs", pairs)
        lock_down(self._con)
        for f in firsts:  # where each first departure sits in the two trees
            found = self.query("SELECT t_path, b_path, t_op, b_op FROM pairs WHERE pair_index = $i LIMIT 1",
                               {"i": f["pair_index"]})
            f.update(found[0] if found else {})

    def query(self, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        with self._lock:
            return self._con.sql(sql, params=params).to_arrow_table().to_pylist()

    def close(self) -> None:
        self._con.close()


_FILTER = ("($verdict IS NULL OR verdict = $verdict) AND ($op_type IS NULL OR op_type = $op_type) "
           "AND ($phase IS NULL OR phase = $phase) AND ($rank IS NULL OR rank = $rank)")

_CHILDREN = """
WITH side AS (
    SELECT *, {path} AS path, {other} AS other, {opcol} AS op FROM pairs WHERE {path} IS NOT NULL AND {filter}
), below AS (
    SELECT *, CASE WHEN $prefix = '' THEN path ELSE substr(path, length($prefix) + 2) END AS rest FROM side
    WHERE $prefix = '' OR starts_with(path, $prefix || '/')
)
SELECT split_part(rest, '/', 1) AS name, count(*) FILTER (kind = 'pair') AS pairs,
       count(*) FILTER (kind = 'inserted') AS inserted, count(*) FILTER (kind = 'removed') AS removed,
       max(sev) AS worst, bool_or(contains(rest, '/')) AS has_children,
       any_value(op) FILTER (NOT contains(rest, '/')) AS op,
       any_value(op_type) FILTER (NOT contains(rest, '/')) AS op_type,
       min(other) AS other_lo, max(other) AS other_hi, list_distinct(list(pair_index) FILTER
       (list_contains($firsts, pair_index))) AS firsts, max(err) AS max_err
FROM below GROUP BY 1 ORDER BY min(coalesce(pair_index, order_key)) LIMIT $limit OFFSET $offset
"""


def _common_path(lo: str | None, hi: str | None) -> str | None:
    """The longest common ``/``-prefix of the lexicographically smallest and largest paths of a
    set: the common prefix of the whole set (the aligned node of the other tree)."""
    if lo is None or hi is None:
        return None
    n = 0
    for a, b in zip(lo, hi):
        if a != b:
            break
        n += 1
    if n == len(lo) == len(hi):
        return lo
    cut = lo[:n]
    if n < len(lo) and lo[n] == "/" and (n == len(hi) or hi[n] == "/"):
        return cut
    return cut[:cut.rfind("/")] if "/" in cut else None


def filters_of(params: dict[str, Any]) -> dict[str, Any]:
    rank = params.get("rank")
    return {"verdict": params.get("verdict") or None, "op_type": params.get("op_type") or None,
            "phase": params.get("phase") or None, "rank": int(rank) if rank not in (None, "") else None}


def children(view: CompareView, side: str, path: str, filters: dict[str, Any], *, limit: int | None = None,
             offset: int = 0) -> dict[str, Any]:
    """Children of node ``path`` of one side's tree (``target`` or ``bench``): per node its
    ``pairs``, ``inserted`` / ``removed`` tensors (only one side has), ``worst`` severity,
    ``link`` (the aligned node of the other tree: the common path of its partners), ``firsts``
    (first departures below it) and ``max_err``."""
    if side not in ("target", "bench"):
        raise DumpdbError(f"side must be target or bench, not {side!r}")
    t, b = ("t", "b") if side == "target" else ("b", "t")
    limit = clamp(limit, 500, MAX_CHILDREN)
    sql = _CHILDREN.format(path=f"{t}_path", other=f"{b}_path", opcol=f"{t}_op", filter=_FILTER)
    rows = view.query(sql, {"prefix": path, "limit": limit + 1, "offset": max(0, int(offset)),
                            "firsts": [f["pair_index"] for f in view.firsts], **filters})
    for r in rows:
        r["path"] = f"{path}/{r['name']}" if path else r["name"]
        r["link"] = _common_path(r.pop("other_lo"), r.pop("other_hi"))
    return {"side": side, "path": path, "children": rows[:limit], "more": len(rows) > limit}


def plot(view: CompareView, filters: dict[str, Any]) -> dict[str, Any]:
    """The error along execution order (pair index), at most :data:`PLOT_POINTS` points:
    each the largest error (and the smallest floor, the worst severity) of its bucket of pairs."""
    n = view.pairs.num_rows or 1
    rows = view.query(f"""
        SELECT min(pair_index) AS x, max(err) AS err, min(floor) AS floor, max(sev) AS sev
        FROM pairs WHERE kind = 'pair' AND {_FILTER}
        GROUP BY pair_index * {PLOT_POINTS} // {n} ORDER BY x""", filters)
    return {"metric": view.error_metric, "points": rows, "pairs": view.summary.get("pairs")}


def pairs_of(view: CompareView, side: str, op: str, limit: int | None = None) -> dict[str, Any]:
    """The pairs (and unmatched tensors) of one op of one side, for the op panel."""
    col = "t_op" if side == "target" else "b_op"
    rows = view.query(f"SELECT * EXCLUDE (order_key) FROM pairs WHERE {col} = $op ORDER BY pair_index, order_key "
                      "LIMIT $limit", {"op": op, "limit": clamp(limit, 200, MAX_CHILDREN)})
    return {"side": side, "op": op, "pairs": rows}


def options(view: CompareView) -> dict[str, list]:
    """The values each filter can take (verdicts, op types, phases, ranks)."""
    out = {}
    for col in ("verdict", "op_type", "phase", "rank"):
        out[col] = [r["v"] for r in view.query(
            f"SELECT DISTINCT {col} AS v FROM pairs WHERE {col} IS NOT NULL ORDER BY 1 LIMIT 500", {})]
    return out


# -- building a view -------------------------------------------------------------------------------------------
def _paths(archive, run: str) -> pa.Table:
    return archive.sql(PATHS_SQL + " SELECT tensor_id, path, op, direction FROM paths", {"run": run},
                       timeout=QUERY_TIMEOUT * 6)


def _firsts(report: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The first departures a first-divergence report names: the report itself ('overall'),
    then any list / dict of reports in it that carry a ``pair_index`` (per phase, per rank)."""
    if not report:
        return []
    out = [{"label": "overall", **{k: report.get(k) for k in ("pair_index", "target_name", "bench_name",
                                                                "io", "slot", "rank", "iteration", "result")}}]
    for key, value in report.items():
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for label, item in items:
            if isinstance(item, dict) and isinstance(item.get("pair_index"), int):
                out.append({"label": f"{key} {label}" if isinstance(label, str) else
                            f"{key} {item.get('phase') or item.get('rank') or label}",
                            **{k: item.get(k) for k in ("pair_index", "target_name", "bench_name", "io", "slot",
                                                        "rank", "iteration", "result")}})
    seen, unique = set(), []
    for f in out:
        if (f["label"], f["pair_index"]) not in seen:
            seen.add((f["label"], f["pair_index"]))
            unique.append(f)
    return unique


def _assemble(archive, target_run: str, bench_run: str, results: pa.Table, unmatched: pa.Table,
              verdict: str, err: str, floor: str | None) -> pa.Table:
    """The view's table from compare rows and unmatched rows (both with tensor ids)."""
    con = duckdb.connect(":memory:")
    try:
        con.register("results", results)
        con.register("unmatched", unmatched)
        con.register("tp", _paths(archive, target_run))
        con.register("bp", _paths(archive, bench_run))
        floor_sql = f"r.{floor}" if floor else "CAST(NULL AS DOUBLE)"
        return con.sql(f"""
            SELECT 'pair' AS kind, r.pair_index, r.pair_index AS order_key, r.target_tensor_id AS t_id,
                   r.bench_tensor_id AS b_id, tp.path AS t_path, bp.path AS b_path, tp.op AS t_op, bp.op AS b_op,
                   r.{verdict} AS verdict, CASE r.{verdict} WHEN 'pass' THEN 0 WHEN 'warning' THEN 1
                   WHEN 'error' THEN 2 END AS sev, CAST(r.{err} AS DOUBLE) AS err, {floor_sql} AS floor,
                   r.op_type, r.io, CAST(r.slot AS INTEGER) AS slot, r.iteration, CAST(r.rank AS INTEGER) AS rank,
                   coalesce(tp.direction, bp.direction) AS phase
            FROM results r LEFT JOIN tp ON tp.tensor_id = r.target_tensor_id
                           LEFT JOIN bp ON bp.tensor_id = r.bench_tensor_id
            UNION ALL
            SELECT CASE u.side WHEN 'target' THEN 'inserted' ELSE 'removed' END, NULL, 1e15 + row_number() OVER (),
                   CASE u.side WHEN 'target' THEN u.tensor_id END, CASE u.side WHEN 'bench' THEN u.tensor_id END,
                   CASE u.side WHEN 'target' THEN tp.path END, CASE u.side WHEN 'bench' THEN bp.path END,
                   CASE u.side WHEN 'target' THEN tp.op END, CASE u.side WHEN 'bench' THEN bp.op END,
                   NULL, NULL, NULL, NULL, NULL, u.io, CAST(u.slot AS INTEGER), NULL, NULL,
                   coalesce(tp.direction, bp.direction)
            FROM unmatched u LEFT JOIN tp ON u.side = 'target' AND tp.tensor_id = u.tensor_id
                             LEFT JOIN bp ON u.side = 'bench' AND bp.tensor_id = u.tensor_id
        """).to_arrow_table()
    finally:
        con.close()


def new_view(archive, target: str, bench: str, *, iteration: int | None = None,
             rank: int | None = None) -> CompareView:
    """Compare two selections (``RUN[:ITERATION[:RANK]]``) with the default precision rules,
    without storing the result."""
    from dumpdb.compare.engine import Selection, compare

    outcome = compare(archive, target, bench, iteration=iteration, rank=rank, store_results=False)
    results = outcome.results
    unmatched = outcome.unmatched.select(["side", "tensor_id", "io", "slot"]) if outcome.unmatched.num_rows else \
        pa.table({"side": pa.array([], pa.string()), "tensor_id": pa.array([], pa.int64()),
                  "io": pa.array([], pa.string()), "slot": pa.array([], pa.int32())})
    pairs = _assemble(archive, Selection.parse(target).run, Selection.parse(bench).run, results, unmatched,
                      "precision_result", "scaled_err", "precision_floor")
    key = {"target": target, "bench": bench, "iteration": iteration, "rank": rank}
    return CompareView(key, pairs, outcome.summary, _firsts(outcome.first_divergence), "precision", "scaled_err")


_STORED_SQL = """
SELECT r.*, t.iteration, t.rank, t.graph_id, t.op_type, t.scope_name, NULL::BIGINT AS position,
       NULL::VARCHAR AS code_file, NULL::INTEGER AS code_line, NULL::VARCHAR AS code_text
FROM compare_results r LEFT JOIN tensors t ON t.tensor_id = r.target_tensor_id
WHERE r.compare_id = $id ORDER BY r.pair_index
"""


def stored_view(archive, compare_id: int) -> CompareView:
    """A compare stored in the catalog (``compares``, ``compare_results``,
    ``compare_unmatched``); DumpdbError naming the stored ids for an unknown one."""
    from dumpdb.compare.engine import first_divergence_of

    head = archive.sql("SELECT * FROM compares WHERE compare_id = $id", {"id": int(compare_id)},
                       timeout=QUERY_TIMEOUT).to_pylist()
    if not head:
        known = [r["compare_id"] for r in archive.sql(
            "SELECT compare_id FROM compares ORDER BY compare_id DESC LIMIT 10").to_pylist()]
        raise DumpdbError(f"no stored compare {compare_id} in {archive.path} (latest: {known or 'none'})")
    info = head[0]
    results = archive.sql(_STORED_SQL, {"id": int(compare_id)}, timeout=QUERY_TIMEOUT * 6)
    unmatched = archive.sql("SELECT side, tensor_id, io, CAST(slot AS INTEGER) AS slot FROM compare_unmatched "
                            "WHERE compare_id = $id", {"id": int(compare_id)}, timeout=QUERY_TIMEOUT * 6)
    pairs = _assemble(archive, info["target_run"], info["bench_run"], results, unmatched,
                      "result", "rel_euc_dist", None)
    counts = {k: 0 for k in SEVERITY}
    for r in results.group_by("result").aggregate([("pair_index", "count")]).to_pylist():
        if r["result"] in counts:
            counts[r["result"]] = r["pair_index_count"]
    summary = {"target": info["target_selection"], "bench": info["bench_selection"], "pairs": info["pairs"],
               "mode": info["mode"], "rules": "msprobe (stored)", **counts,
               "unmatched_target": info["unmatched_target"], "unmatched_bench": info["unmatched_bench"],
               "compare_id": info["compare_id"], "created_at": info["created_at"]}
    report = first_divergence_of(results) if results.num_rows else None
    return CompareView({"id": int(compare_id)}, pairs, summary, _firsts(report), "msprobe", "rel_euc_dist")


def stored_list(archive, limit: int = 200) -> list[dict[str, Any]]:
    return archive.sql("SELECT compare_id, target_selection, bench_selection, mode, pairs, unmatched_target, "
                       f"unmatched_bench, created_at FROM compares ORDER BY compare_id DESC LIMIT {int(limit)}",
                       timeout=QUERY_TIMEOUT).to_pylist()


class ViewCache:
    """The last few compare views (a new compare costs seconds; a view's memory is its table)."""

    def __init__(self, size: int = 4) -> None:
        self.size = size
        self._views: OrderedDict[tuple, CompareView] = OrderedDict()
        self._lock = threading.Lock()
        self._building: dict[tuple, threading.Lock] = {}

    def get(self, archive, params: dict[str, Any]) -> CompareView:
        """The view a request names: ``id`` (stored) or ``target`` + ``bench`` (new;
        ``iteration``, ``rank`` optional)."""
        if params.get("id"):
            key: tuple = ("id", int(params["id"]))
        elif params.get("target") and params.get("bench"):
            it, rk = params.get("iteration"), params.get("rank_sel")
            key = ("new", params["target"], params["bench"], int(it) if it not in (None, "") else None,
                   int(rk) if rk not in (None, "") else None)
        else:
            raise DumpdbError("name a compare: id=N (stored) or target=RUN&bench=RUN")
        with self._lock:
            view = self._views.get(key)
            if view is not None:
                self._views.move_to_end(key)
                return view
            building = self._building.setdefault(key, threading.Lock())
        with building:  # one build per key; others wait for it
            with self._lock:
                if key in self._views:
                    return self._views[key]
            view = stored_view(archive, key[1]) if key[0] == "id" else \
                new_view(archive, key[1], key[2], iteration=key[3], rank=key[4])
            with self._lock:
                self._views[key] = view
                self._building.pop(key, None)
                while len(self._views) > self.size:  # not closed: a request may still read it (GC closes it)
                    self._views.popitem(last=False)
        return view
