"""Analysis across the ranks of one run: which ranks agree, which one departs, which went bad first.

::

    from dumpdb.checks.ranks import rank_groups, first_bad_across_ranks
    groups = rank_groups(archive, "train")           # one row per rank (pyarrow.Table)
    bad = first_bad_across_ranks(archive, "train")   # one row per rank with a NaN/Inf, first first

**Fingerprints** (:func:`rank_groups`). Every tensor of a rank is reduced to a *key*
(iteration, op name, io, slot / argument path, direction) and a *value*: the payload's
``content_hash`` when there is a payload, else the dump's own checksum (msprobe md5 mode's
CRC32), else the statistics (max, min, mean, l2norm, rounded to 12 significant digits,
since the dump's own statistics are printed decimals). A rank's **sequence** fingerprint
hashes its keys in execution order (plus dtype and shape); its **data** fingerprint hashes
keys and values. Ranks with the same data fingerprint form a group; data-parallel ranks fed
the same batch collapse into one group, ranks fed different batches share the sequence
group only (tensor-parallel ranks usually differ in both: shapes differ). The reference is
the largest data group (ties: the one holding the lowest rank); every other rank gets the
first tensor, in execution order, where it departs from the reference group's lowest rank:
a key present on one side only (the op sequence departs), or the same key with another value.

Execution order = ``execution_order.position`` (msprobe: dump.json order; MindSpore: the
graph's order), then ``timestamp``, then io (inputs first), slot, ``tensor_id``.

**Sharing**: ``shared_bytes`` = payload bytes of the rank whose content is also stored for
another rank of the run (dedup stores it once).

**First bad rank** (:func:`first_bad_across_ranks`): every rank's first tensor with NaN or
+-Inf in execution order; ranks are ordered by its iteration, then by the dump ``timestamp``
when every such tensor has one (MindSpore, CANN), else by execution position, so the first
row is the rank that went bad first, with its op and source line; the other ranks' first
bad op follows.
"""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from typing import Any

import pyarrow as pa

_TENSORS_SQL = """
SELECT t.tensor_id, t.rank, t.iteration, t.op_name, t.scope_name, t.io, t.slot, t.slot_path, t.arg_name,
       t.direction, t.dtype, t.shape, t.nbytes, t.content_hash, t.checksum, t.max, t.min, t.mean, t.l2norm,
       t.nan_count, t.pos_inf_count, t.neg_inf_count, t.timestamp, e.position, o.code_file, o.code_line,
       o.code_text
FROM tensors t
LEFT JOIN (SELECT rank, device_id, graph_id, scope_name, min(position) AS position FROM execution_order
           WHERE run = $run GROUP BY ALL) e
     ON e.rank IS NOT DISTINCT FROM t.rank AND e.device_id IS NOT DISTINCT FROM t.device_id
     AND e.graph_id IS NOT DISTINCT FROM t.graph_id AND e.scope_name = t.scope_name
LEFT JOIN (SELECT rank, device_id, graph_id, scope_name, any_value(code_file) AS code_file,
                  any_value(code_line) AS code_line, any_value(code_text) AS code_text
           FROM ops WHERE run = $run GROUP BY ALL) o
     ON o.rank IS NOT DISTINCT FROM t.rank AND o.device_id IS NOT DISTINCT FROM t.device_id
     AND o.graph_id IS NOT DISTINCT FROM t.graph_id AND o.scope_name = t.scope_name
WHERE t.run = $run {where}
ORDER BY t.rank NULLS FIRST, t.iteration NULLS FIRST, e.position NULLS LAST, t.timestamp NULLS LAST,
         CASE t.io WHEN 'input' THEN 0 WHEN 'parameter' THEN 1 WHEN 'output' THEN 2 ELSE 3 END,
         t.slot NULLS LAST, t.tensor_id
"""

GROUP_SCHEMA = pa.schema([
    ("rank", pa.int32()), ("group", pa.int32()), ("group_ranks", pa.list_(pa.int32())),
    ("sequence_group", pa.int32()), ("reference", pa.bool_()), ("tensors", pa.int64()),
    ("payload_bytes", pa.int64()), ("shared_bytes", pa.int64()), ("data_fingerprint", pa.string()),
    ("sequence_fingerprint", pa.string()), ("reference_rank", pa.int32()), ("departs_at", pa.string()),
    ("first_diff_iteration", pa.int64()), ("first_diff_position", pa.int64()), ("first_diff_op", pa.string()),
    ("first_diff_io", pa.string()), ("first_diff_slot", pa.string()), ("first_diff_code_file", pa.string()),
    ("first_diff_code_line", pa.int32()), ("first_diff_code_text", pa.string()),
])


def _key(r: dict) -> tuple:
    slot = r["slot_path"] if r["slot_path"] is not None else r["slot"]
    return (r["iteration"], r["op_name"] or r["scope_name"], r["io"], slot, r["arg_name"], r["direction"])


def _value(r: dict) -> Any:
    if r["content_hash"] is not None:
        return r["content_hash"]
    if r["checksum"] is not None:
        return r["checksum"]
    return tuple(None if r[k] is None else float(f"{r[k]:.12g}") for k in ("max", "min", "mean", "l2norm"))


def _digest(items) -> str:
    h = hashlib.sha256()
    for item in items:
        h.update(repr(item).encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


_ALL = object()  # every rank


def _rank_rows(archive, run: str, iteration: int | None, bad_only: bool = False,
               rank: Any = _ALL) -> dict[Any, list[dict]]:
    archive.require_run(run)
    where = ("" if iteration is None else "AND t.iteration = $it") + (f" AND {_BAD}" if bad_only else "") + \
        ("" if rank is _ALL else " AND t.rank IS NOT DISTINCT FROM $rank")
    params: dict[str, Any] = {"run": run}
    if iteration is not None:
        params["it"] = iteration
    if rank is not _ALL:
        params["rank"] = rank
    by_rank: dict[Any, list[dict]] = defaultdict(list)
    for r in archive.sql(_TENSORS_SQL.format(where=where), params).to_pylist():
        by_rank[r["rank"]].append(r)
    return by_rank


def _first_departure(mine: list[dict], ref: list[dict]) -> tuple[dict, str] | None:
    """First tensor of ``mine`` (execution order) that the reference lacks or holds with
    another value; or the first reference tensor ``mine`` lacks. (row, 'value' | 'sequence')."""
    ref_by_key = {_key(r): r for r in ref}
    mine_keys = {_key(r) for r in mine}
    for a, b in zip(mine, ref):
        if _key(a) != _key(b):
            # the sequences part here: report the tensor that is on one side only
            if _key(a) not in ref_by_key:
                return a, "sequence"
            if _key(b) not in mine_keys:
                return b, "sequence"
        other = ref_by_key.get(_key(a))
        if other is None:
            return a, "sequence"
        if _value(a) != _value(other):
            return a, "value"
    for r in mine[len(ref):]:
        if _key(r) not in ref_by_key:
            return r, "sequence"
    for r in ref[len(mine):]:
        if _key(r) not in mine_keys:
            return r, "sequence"
    return None


def rank_groups(archive, run: str, *, iteration: int | None = None, scheduler: str | None = None,
                workers: int | None = None) -> pa.Table:
    """Group the ranks of ``run`` by fingerprint (module docstring), one row per rank.

    Columns (:data:`GROUP_SCHEMA`): ``rank`` (NULL for a ``proc<PID>`` dump), ``group``
    (1 = the reference group, the largest), ``group_ranks``, ``sequence_group``,
    ``reference``, ``tensors``, ``payload_bytes`` / ``shared_bytes`` (bytes; shared = same
    payload stored for another rank too), the two fingerprints (16 hex digits of sha256),
    and for ranks outside the reference group the ``reference_rank`` compared with,
    ``departs_at`` ('value': same op, other data; 'sequence': an op on one side only) and the
    first differing tensor: ``first_diff_iteration``, ``first_diff_position`` (execution
    position), ``first_diff_op``, ``first_diff_io``, ``first_diff_slot`` and its source line
    (``first_diff_code_*``). ``iteration`` restricts to one iteration/step.
    ``scheduler``: each rank's rows are read and fingerprinted by a task of the
    ``dask.distributed`` cluster at that address, or ``"local"`` (``workers`` processes),
    then each odd rank's departure by another; the workers open the catalog read-only at the
    archive's path (a shared file system). The same table.
    Raises :class:`RunNotFound` for an unknown run.
    """
    if scheduler is not None:
        return _rank_groups_on(archive, run, iteration, scheduler, workers)
    by_rank = _rank_rows(archive, run, iteration)
    summaries = {k: _summary(tensors) for k, tensors in by_rank.items()}
    ref, odd = _reference(summaries)
    return _grouped(summaries, ref, {k: _first_departure(by_rank[k], by_rank[ref]) for k in odd})


def _summary(tensors: list[dict]) -> dict[str, Any]:
    """One rank's fingerprints, tensor count and payload bytes per content hash."""
    per_hash: dict[str, int] = defaultdict(int)
    for r in tensors:
        if r["content_hash"] is not None:
            per_hash[r["content_hash"]] += r["nbytes"] or 0
    return {"data_fp": _digest((_key(r), _value(r)) for r in tensors),
            "seq_fp": _digest((_key(r), r["dtype"], tuple(r["shape"] or ())) for r in tensors),
            "tensors": len(tensors), "per_hash": dict(per_hash)}


def _reference(summaries: dict[Any, dict]) -> tuple[Any, list]:
    """(the reference rank: the lowest of the largest data group, the ranks outside that group)."""
    ranks = sorted(summaries, key=lambda r: -1 if r is None else r)
    sizes = Counter(summaries[k]["data_fp"] for k in ranks)
    if not ranks:
        return None, []
    ref = min(ranks, key=lambda k: (-sizes[summaries[k]["data_fp"]], ranks.index(k)))
    return ref, [k for k in ranks if summaries[k]["data_fp"] != summaries[ref]["data_fp"]]


def _grouped(summaries: dict[Any, dict], ref_rank: Any, departures: dict[Any, tuple[dict, str] | None]) -> pa.Table:
    """The :data:`GROUP_SCHEMA` table from each rank's :func:`_summary`, the reference rank
    and the :func:`_first_departure` of each rank outside its group (:func:`_reference`)."""
    ranks = sorted(summaries, key=lambda r: -1 if r is None else r)
    data_fp = {k: summaries[k]["data_fp"] for k in ranks}
    seq_fp = {k: summaries[k]["seq_fp"] for k in ranks}
    hash_ranks: dict[str, int] = Counter(h for k in ranks for h in summaries[k]["per_hash"])
    sizes = Counter(data_fp.values())
    order = sorted(dict.fromkeys(data_fp[k] for k in ranks), key=lambda fp: -sizes[fp])  # stable: lowest rank
    group_no = {fp: i + 1 for i, fp in enumerate(order)}
    seq_no = {fp: i + 1 for i, fp in enumerate(dict.fromkeys(seq_fp[k] for k in ranks))}
    members = {fp: [k for k in ranks if data_fp[k] == fp] for fp in order}
    rows = []
    for k in ranks:
        per_hash = summaries[k]["per_hash"]
        row: dict[str, Any] = {
            "rank": k, "group": group_no[data_fp[k]], "group_ranks": members[data_fp[k]],
            "sequence_group": seq_no[seq_fp[k]], "reference": data_fp[k] == order[0],
            "tensors": summaries[k]["tensors"], "payload_bytes": sum(per_hash.values()),
            "shared_bytes": sum(v for h, v in per_hash.items() if hash_ranks[h] > 1),
            "data_fingerprint": data_fp[k], "sequence_fingerprint": seq_fp[k],
        }
        if data_fp[k] != order[0]:
            found = departures[k]
            row["reference_rank"] = ref_rank
            if found is not None:
                r, kind = found
                slot = r["slot_path"] if r["slot_path"] is not None else r["slot"]
                row.update(departs_at=kind, first_diff_iteration=r["iteration"], first_diff_position=r["position"],
                           first_diff_op=r["op_name"] or r["scope_name"], first_diff_io=r["io"],
                           first_diff_slot=None if slot is None else str(slot), first_diff_code_file=r["code_file"],
                           first_diff_code_line=r["code_line"], first_diff_code_text=r["code_text"])
        rows.append(row)
    return pa.Table.from_pylist(rows, GROUP_SCHEMA)


def rank_summary_task(path: str, run: str, iteration: int | None, rank: Any) -> dict[str, Any]:
    """A cluster task: :func:`_summary` of one rank, read from the archive at ``path``."""
    import dumpdb

    with dumpdb.open(path) as archive:
        return _summary(_rank_rows(archive, run, iteration, rank=rank).get(rank, []))


def rank_departure_task(path: str, run: str, iteration: int | None, rank: Any, ref: Any) -> tuple[dict, str] | None:
    """A cluster task: :func:`_first_departure` of ``rank`` from ``ref``, read at ``path``."""
    import dumpdb

    with dumpdb.open(path) as archive:
        mine = _rank_rows(archive, run, iteration, rank=rank).get(rank, [])
        return _first_departure(mine, _rank_rows(archive, run, iteration, rank=ref).get(ref, []))


def _rank_groups_on(archive, run: str, iteration: int | None, scheduler: str, workers: int | None) -> pa.Table:
    from dumpdb.cluster import dask_client, workers_for

    path = str(archive.path)
    archive.require_run(run)
    where, params = ("", {"run": run}) if iteration is None else ("AND iteration = $it", {"run": run, "it": iteration})
    ranks = archive.sql(f"SELECT DISTINCT rank FROM tensors WHERE run = $run {where}", params).column("rank")
    with dask_client(scheduler, workers_for(workers)) as client:
        futures = {k: client.submit(rank_summary_task, path, run, iteration, k, pure=False)
                   for k in ranks.to_pylist()}
        summaries = {k: f.result() for k, f in futures.items()}
        ref, odd = _reference(summaries)
        departures = {k: client.submit(rank_departure_task, path, run, iteration, k, ref, pure=False) for k in odd}
        return _grouped(summaries, ref, {k: f.result() for k, f in departures.items()})


_BAD = """(coalesce(t.nan_count, 0) + coalesce(t.pos_inf_count, 0) + coalesce(t.neg_inf_count, 0) > 0
    OR (t.nan_count IS NULL AND (isnan(t.max) OR isnan(t.min) OR isinf(t.max) OR isinf(t.min))))"""

FIRST_BAD_SCHEMA = pa.schema([
    ("order", pa.int32()), ("rank", pa.int32()), ("iteration", pa.int64()), ("position", pa.int64()),
    ("timestamp", pa.int64()), ("op_name", pa.string()), ("io", pa.string()), ("slot", pa.string()),
    ("tensor_id", pa.int64()), ("nan_count", pa.int64()), ("inf_count", pa.int64()), ("max", pa.float64()),
    ("min", pa.float64()), ("code_file", pa.string()), ("code_line", pa.int32()), ("code_text", pa.string()),
])


def first_bad_across_ranks(archive, run: str, *, iteration: int | None = None) -> pa.Table:
    """Each rank's first tensor holding NaN or +-Inf, the rank that went bad first on top.

    A tensor is bad when its ``nan_count``/``pos_inf_count``/``neg_inf_count`` say so, or,
    for statistics-only dumps without counts (msprobe statistics), when its ``max`` or
    ``min`` is NaN or +-Inf (msprobe's own InfNanErrChecker reads the same two values).
    A rank's first bad tensor is the first in execution order (module docstring); ranks are
    ordered by that tensor's iteration, then its ``timestamp`` when every rank's has one
    (MindSpore, CANN: microseconds), else its execution ``position``.

    One row per bad rank (:data:`FIRST_BAD_SCHEMA`): ``order`` (1 = went bad first),
    ``rank``, ``iteration``, ``position``, ``timestamp``, ``op_name``, ``io``, ``slot``,
    ``tensor_id``, ``nan_count``, ``inf_count`` (NULL when the dump has no counts), ``max``,
    ``min`` and the op's source line ``code_*``. Raises :class:`RunNotFound`.
    """
    by_rank = _rank_rows(archive, run, iteration, bad_only=True)
    first = [tensors[0] for tensors in by_rank.values() if tensors]
    use_ts = bool(first) and all(r["timestamp"] is not None for r in first)

    def when(r: dict) -> tuple:
        at = r["timestamp"] if use_ts else r["position"]
        return (-1 if r["iteration"] is None else r["iteration"], at is None, at or 0,
                -1 if r["rank"] is None else r["rank"])

    rows = []
    for i, r in enumerate(sorted(first, key=when)):
        slot = r["slot_path"] if r["slot_path"] is not None else r["slot"]
        counts = (r["nan_count"], r["pos_inf_count"], r["neg_inf_count"])
        rows.append({"order": i + 1, "rank": r["rank"], "iteration": r["iteration"], "position": r["position"],
                     "timestamp": r["timestamp"], "op_name": r["op_name"] or r["scope_name"], "io": r["io"],
                     "slot": None if slot is None else str(slot), "tensor_id": r["tensor_id"],
                     "nan_count": counts[0], "inf_count": None if counts[1] is None else counts[1] + (counts[2] or 0),
                     "max": r["max"], "min": r["min"], "code_file": r["code_file"], "code_line": r["code_line"],
                     "code_text": r["code_text"]})
    return pa.Table.from_pylist(rows, FIRST_BAD_SCHEMA)


GRID_SCHEMA = pa.schema([
    ("op_index", pa.int32()), ("iteration", pa.int64()), ("op_name", pa.string()), ("rank", pa.int32()),
    ("state", pa.string()), ("tensors", pa.int32()),
])


def rank_op_grid(archive, run: str, *, iteration: int | None = None, max_ops: int = 5000) -> tuple[pa.Table, int]:
    """A rank x op grid of ``run``: for each op (iteration, op name; in the execution order
    of the module docstring, ops of the lowest rank first) and each rank, whether the rank's
    tensors of that op agree with the rank majority. A rank's op value is its tensors' keys
    and values (the fingerprints' rule, module docstring); the majority is the value most
    ranks holding the op have (ties: the one of the lowest rank).

    Returns ``(grid, ops)``: one row per op and rank (:data:`GRID_SCHEMA`): ``op_index``
    (0-based column), ``iteration``, ``op_name``, ``rank``, ``state`` ('agree', 'departs':
    another value than the majority, 'missing': the op is absent from this rank) and
    ``tensors``, for the first ``max_ops`` ops; and the run's number of ops.
    Raises :class:`RunNotFound`."""
    by_rank = _rank_rows(archive, run, iteration)
    ranks = sorted(by_rank, key=lambda r: -1 if r is None else r)
    per_op: dict[tuple, dict[Any, list[dict]]] = {}
    for k in ranks:
        for r in by_rank[k]:
            per_op.setdefault((r["iteration"], r["op_name"] or r["scope_name"]), {}).setdefault(k, []).append(r)
    rows = []
    for index, ((it, name), held) in enumerate(per_op.items()):
        if index >= max_ops:
            break
        values = {k: _digest((_key(r), _value(r)) for r in tensors) for k, tensors in held.items()}
        majority = Counter(values.values()).most_common(1)[0][0]
        for k in ranks:
            state = "missing" if k not in values else ("agree" if values[k] == majority else "departs")
            rows.append({"op_index": index, "iteration": it, "op_name": name, "rank": k, "state": state,
                         "tensors": len(held.get(k, ()))})
    return pa.Table.from_pylist(rows, GRID_SCHEMA), len(per_op)
