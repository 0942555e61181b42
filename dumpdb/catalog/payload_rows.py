"""The catalog rows of stored payloads: ``blobs`` (where each content hash lives) and
``arrays`` (each written pack or large array), built from what a
:class:`~dumpdb.storage.store.StoreWriter` reports (``BlobLocation``, ``ArrayInfo``) and
recorded inside a caller's write transaction. Ingest, commit of parts, import, export and gc
use them; storage itself writes no catalog row. Rows are committed only after the objects they
name are durable (a StoreWriter returns a location only then), so the catalog never references
a missing payload.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa

from dumpdb.catalog import schema
from dumpdb.catalog.connection import insert_arrow

# blobs/arrays rows as the catalog schema (the migrations) defines them; created_at is a default.
BLOB_SCHEMA = schema.arrow_schema("blobs", exclude=("created_at",))
ARRAY_SCHEMA = schema.arrow_schema("arrays", exclude=("created_at",))


def blob_table(locations: Iterable[Any], first_run: str | Mapping[str, str] | None = None) -> pa.Table:
    """``blobs`` rows for ``locations`` (:class:`~dumpdb.storage.store.BlobLocation`);
    ``first_run`` is one run for all, or a map content hash -> run (missing: NULL)."""
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


def array_table(arrays: Iterable[Any]) -> pa.Table:
    """``arrays`` rows for ``arrays`` (:class:`~dumpdb.storage.store.ArrayInfo`: ``row()``)."""
    return pa.Table.from_pylist([a.row() for a in arrays], ARRAY_SCHEMA)


def record_payloads(con: Any, locations: Iterable[Any], arrays: Iterable[Any],
                    first_run: str | Mapping[str, str] | None = None, *, relocate: bool = False) -> None:
    """Record written payloads in the catalog (inside the caller's write transaction
    ``con``): ``arrays`` rows, then ``blobs`` rows.

    New payloads are inserted (a hash already present keeps its row); with
    ``relocate`` (gc moving live payloads into a new pack) the existing ``blobs``
    rows are pointed at the new location instead.
    """
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
