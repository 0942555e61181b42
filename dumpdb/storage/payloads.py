"""Copying payloads into a store: the one primitive import, export and gc share
(their ``blobs``/``arrays`` rows: :mod:`dumpdb.catalog.payload_rows`).

A payload is stored under its content hash (xxh3-128 of its bytes,
:func:`~dumpdb.storage.store.payload_hash`). Writing one yields a
:class:`~dumpdb.storage.store.BlobLocation` (pack + element offset, or a large
array's path) and, per written array, an :class:`~dumpdb.storage.store.ArrayInfo`;
they become ``blobs`` and ``arrays`` rows. Rows are committed only after the
objects they name are durable (:class:`~dumpdb.storage.store.StoreWriter`
returns a location only then), so the catalog never references a missing payload.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from dumpdb.storage.store import BlobLocation, StoreWriter, TensorStore

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
