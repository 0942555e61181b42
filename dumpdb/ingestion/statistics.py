"""Statistics csv files streamed into ``tensors`` rows as Arrow tables (issue 12).

A statistics-only dump (``saved_data: "statistic"``) is one ``statistic.csv`` per
iteration directory, possibly 10^7 rows; beside tensor files (``saved_data: "full"``) its
rows that no tensor file claimed are statistics-only tensors too (issue 30 item 12: a
10^6-row file there took 2 GB and failed the ingest). The layout leaves each such file as a
:class:`~dumpdb.layouts.base.StatisticsFile`; this module turns it, batch by batch
(:func:`dumpdb.layouts.mindspore_kit.statistic_batches`, Arrow's CSV reader), into
``tensors`` rows with the values the per-entry path would give (same ``tensor_key``,
``stats_source``, ``scope_name``, declared ``dtype``/``shape``), without one Python
object per row. Records the columnar path does not decide come back as
:class:`~dumpdb.layouts.base.TensorEntry` objects for the ordinary path (range checks,
one error line each).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dumpdb.dtypes import dtype_name, from_dump_name
from dumpdb.layouts import mindspore_kit as kit
from dumpdb.layouts.base import StatisticsFile, TensorEntry


@dataclass
class StatisticsPart:
    """One batch of a statistics file: ``table`` rows in the ``tensors`` Arrow schema given
    to :func:`statistics_parts` (not yet deduplicated), ``lines`` their csv lines (int64
    numpy array), ``entries`` for the per-entry path, ``records`` csv records covered,
    ``errors`` one message per refused record (naming the file and line)."""

    table: pa.Table
    lines: np.ndarray
    entries: list[TensorEntry]
    records: int
    errors: list[str]


def estimate_rows(sf: StatisticsFile) -> int:
    """Rough number of records of ``sf`` (for a progress total): its size over the mean
    length of its first lines; 0 if unreadable. Never raises."""
    try:
        with open(sf.path, "rb") as f:
            head = f.read(1 << 16)
    except OSError:
        return 0
    lines = max(head.count(b"\n"), head.count(b"\r"))
    if lines <= 1:
        return max(0, lines)
    return max(1, int(sf.size / (len(head) / lines)) - 1)


def _dtype_names(declared: pa.Array) -> pa.Array:
    distinct = pc.unique(declared).to_pylist()
    names = []
    for d in distinct:
        dt = from_dump_name(d)
        names.append(dtype_name(dt) if dt is not None else None)
    return pc.take(pa.array(names, pa.string()), pc.index_in(declared, pa.array(distinct, pa.string())))


def _lookup(keys: pa.Array, mapping: dict[str, str]) -> pa.Array:
    if not mapping:
        return pa.nulls(len(keys), pa.string())
    names = list(mapping)
    return pc.take(pa.array([mapping[n] for n in names], pa.string()), pc.index_in(keys, pa.array(names, pa.string())))


def tensor_keys(source_file: str, table: pa.Table) -> pa.Array:
    """``tensor_key`` of each row, as :func:`dumpdb.layouts.mindspore_kit.statistic_key`
    (csv file, ``#``, the identity fields joined by ``.``, None as empty)."""
    return pc.binary_join_element_wise(pa.scalar(source_file + "#"), kit.table_identities(table), "")


def _unclaimed(sf: StatisticsFile, batch: kit.StatisticBatch, given: set[str],
               errors: list[str]) -> tuple[pa.Table, list[dict]]:
    """``batch`` without the rows the tensor files beside ``sf`` claimed: the first row of a
    claimed identity gave that file its statistics (:func:`~dumpdb.layouts.mindspore_kit.claim_statistics`);
    a later one is a duplicate (:func:`~dumpdb.layouts.mindspore_kit.duplicate_row`, in ``errors``).
    ``given``: claimed identities met so far in the file."""
    if not sf.claimed:
        return batch.table, batch.rows
    wanted = pa.array(sorted(sf.claimed), pa.string())
    hit = pc.fill_null(pc.is_in(kit.table_identities(batch.table), wanted), False)
    rows = [r for r in batch.rows if kit.dict_identity(r) not in sf.claimed]
    claimed = [r for r in batch.rows if kit.dict_identity(r) in sf.claimed]
    if not pc.any(hit).as_py() and not claimed:
        return batch.table, rows
    claimed += kit.batch_rows(kit.StatisticBatch(batch.table.filter(hit), [], 0))
    for r in sorted(claimed, key=lambda r: r["line"]):
        ident = kit.dict_identity(r)
        if ident in given:
            errors.append(kit.duplicate_row(sf.source_file, r["line"], ident))
        given.add(ident)
    return batch.table.filter(pc.invert(hit)), rows


def statistics_parts(sf: StatisticsFile, run: str, schema: pa.Schema, stats_label: str,
                     block_bytes: int = kit.STATISTIC_BATCH_BYTES) -> Iterator[StatisticsPart]:
    """``sf`` as :class:`StatisticsPart` batches of about ``block_bytes`` of csv text (the rows
    of ``sf.claimed`` left out).

    ``schema``: the ``tensors`` Arrow schema of the rows (columns it lacks are not
    produced); ``stats_label``: the layout's ``stats_source`` for rows with statistics.
    Raises :class:`~dumpdb.errors.DumpFileError` for a file that cannot be read.
    """
    fields = sf.fields
    given: set[str] = set()
    for batch in kit.statistic_batches(sf.path, sf.source_file, block_bytes):
        errors = list(batch.refused)
        t, odd = _unclaimed(sf, batch, given, errors)
        n = t.num_rows
        is_param = pc.fill_null(pc.equal(t["op_type"], "Parameter"), False)
        scope = pc.if_else(is_param, _lookup(t["op_name"], sf.params), _lookup(t["op_name"], sf.scopes))
        columns: dict[str, pa.Array] = {
            "run": pa.array(np.full(n, run, dtype=object), pa.string()),
            "source_file": pa.array(np.full(n, sf.source_file, dtype=object), pa.string()),
            "scope_name": scope,
            "dtype": _dtype_names(t["dtype_declared"]),
            "shape": t["shape_declared"],
            "stats_source": pc.if_else(t["has_stats"], pa.scalar(stats_label), pa.scalar(None, pa.string())),
            "tensor_key": tensor_keys(sf.source_file, t),
        }
        for name, value in fields.items():
            columns[name] = pa.array([value] * n, schema.field(name).type)
        for name in t.column_names:
            if name not in ("has_stats", "shape_declared", "line") and name in schema.names:
                columns[name] = t[name]
        arrays = [columns[f.name].cast(f.type) if f.name in columns else pa.nulls(n, f.type) for f in schema]
        table = pa.Table.from_arrays(arrays, schema=schema)
        entries = [kit.statistics_entry(sf.source_file, row, fields) for row in odd]
        for e in entries:
            e.scope_name = (sf.params if e.op_type == "Parameter" else sf.scopes).get(e.op_name or "")
        lines = np.asarray(t["line"].to_numpy(zero_copy_only=False), dtype=np.int64)
        yield StatisticsPart(table, lines, entries, batch.records, errors)
