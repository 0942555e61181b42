"""Copying payloads into a store and recording them in the catalog: the one
primitive ingest, import, export and gc share.

A payload is stored under its content hash (xxh3-128 of its bytes,
:func:`~dumpdb.storage.store.payload_hash`). Writing one yields a
:class:`~dumpdb.storage.store.BlobLocation` (pack + element offset, or a large
array's path) and, per written array, an :class:`~dumpdb.storage.store.ArrayInfo`;
they become ``blobs`` and ``arrays`` rows. Rows are committed only after the
objects they name are durable (:class:`~dumpdb.storage.store.StoreWriter`
returns a location only then), so the catalog never references a missing payload.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from dumpdb.catalog import schema
from dumpdb.storage.store import ArrayInfo, BlobLocation, StoreWriter, TensorStore

# blobs/arrays rows as the catalog schema (the migrations) defines them; created_at is a default.
BLOB_SCHEMA = schema.arrow_schema("blobs", exclude=("created_at",))
ARRAY_SCHEMA = schema.arrow_schema("arrays", exclude=("created_at",))

BlobRef = tuple[str, str | None, int | None, int | None]  # content_hash, array_path, elem_offset, elem_count


def copy_payloads(source: TensorStore, writer: StoreWriter, blobs: Iterable[BlobRef],
                  read: Callable[[BlobRef], np.ndarray] | None = None) -> list[BlobLocation]:
    """Copy each stored payload ``(content_hash, array_path, elem_offset, elem_count)``
    of ``source`` into ``writer``'s store, bit for bit; flushes and returns the new
    locations (one per payload, in write order). The arrays written are in
    ``writer.take_arrays()``. ``read`` replaces the plain read of one payload (export
    passes one that also re-hashes it and names the tensor on failure: each payload is
    read once). Raises PayloadMissing/PayloadCorrupt/ValueError for a damaged source
    payload, OSError when writing fails."""
    locations: list[BlobLocation] = []
    for ref in blobs:
        content_hash, array_path, offset, count = ref
        data = read(ref) if read is not None else source.read_payload(array_path, offset, count or 0, content_hash)
        locations.extend(writer.add(content_hash, data))
    locations.extend(writer.flush())
    return locations


def blob_table(locations: Iterable[BlobLocation], first_run: str | Mapping[str, str] | None = None) -> pa.Table:
    """``blobs`` rows for ``locations``; ``first_run`` is one run for all, or a map
    content hash -> run (missing: NULL)."""
    locations = list(locations)
    # column lists, not a dict per row: pa.Table.from_pylist costs ~35 us a row (a tiny-file
    # ingest writes one blob per file), building columns ~3 us
    columns: dict[str, list[Any]] = {
        "content_hash": [loc.content_hash for loc in locations],
        "nbytes": [loc.nbytes for loc in locations],
        "array_path": [loc.array_path for loc in locations],
        "elem_offset": [loc.elem_offset for loc in locations],
        "elem_count": [loc.elem_count for loc in locations],
        "stored_bytes": [loc.stored_bytes for loc in locations],
        "first_run": [first_run.get(loc.content_hash) for loc in locations] if isinstance(first_run, Mapping)
        else [first_run] * len(locations),
        "base_hash": [loc.base_hash for loc in locations],
    }
    assert set(columns) == set(BLOB_SCHEMA.names), "blobs columns changed: update blob_table"
    return pa.Table.from_pydict({name: columns[name] for name in BLOB_SCHEMA.names}, BLOB_SCHEMA)


def array_table(arrays: Iterable[ArrayInfo]) -> pa.Table:
    """``arrays`` rows for ``arrays``."""
    return pa.Table.from_pylist([a.row() for a in arrays], ARRAY_SCHEMA)


def record_payloads(con: Any, locations: Iterable[BlobLocation], arrays: Iterable[ArrayInfo],
                    first_run: str | Mapping[str, str] | None = None, *, relocate: bool = False) -> None:
    """Record written payloads in the catalog (inside the caller's write transaction
    ``con``): ``arrays`` rows, then ``blobs`` rows.

    New payloads are inserted (a hash already present keeps its row); with
    ``relocate`` (gc moving live payloads into a new pack) the existing ``blobs``
    rows are pointed at the new location instead.
    """
    from dumpdb.catalog import insert_arrow

    insert_arrow(con, "arrays", array_table(arrays))
    blobs = blob_table(locations, first_run)
    if not relocate:
        insert_arrow(con, "blobs", blobs, ignore_conflicts=True)
        return
    if blobs.num_rows == 0:
        return
    con.register("_dumpdb_moved", blobs)
    try:
        con.execute("UPDATE blobs SET array_path = m.array_path, elem_offset = m.elem_offset, "
                    "elem_count = m.elem_count, stored_bytes = m.stored_bytes, base_hash = m.base_hash "
                    "FROM _dumpdb_moved m WHERE blobs.content_hash = m.content_hash")
    finally:
        con.unregister("_dumpdb_moved")
