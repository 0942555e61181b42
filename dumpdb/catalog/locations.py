"""Where every tensor's payload is, held in memory: reads by ``tensor_id`` without a query.

Opening a DuckDB connection costs 20-55 ms and a catalog query about 1-3 ms, far more
than reading a small tensor (a ranged read and a 256 KiB decode). And an archive must
not hold its catalog open: DuckDB lets one process write a file or several read it,
never both, and ingest / gc of other processes must be able to commit meanwhile. So
:class:`LocationIndex` loads the location of every tensor (``tensors`` joined to
``blobs``) in one query, keeps it as Arrow columns (about 80 bytes per tensor), and
before each use checks with three ``stat`` calls (a few microseconds) whether the
catalog changed since: the catalog file, DuckDB's write-ahead log ``<catalog>.wal``
(a commit appends to it, a checkpoint rewrites the catalog file) and dumpdb's commit
summary ``catalog.summary.json`` (replaced at every dumpdb commit). Any change of size,
modification time or inode reloads the index on the next lookup; a lookup therefore
never answers from a catalog older than the one on disk when it started.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import duckdb
    import numpy as np
    import pyarrow as pa

LOCATION_SQL = """
SELECT t.tensor_id, t.dtype, t.shape, t.nbytes, t.content_hash, b.array_path, b.elem_offset, b.elem_count,
       b.content_hash IS NOT NULL AS stored, t.format, t.original_shape, t.original_format, t.pruned_at
FROM tensors t LEFT JOIN blobs b ON b.content_hash = t.content_hash
ORDER BY t.tensor_id
"""


class TensorLocation(NamedTuple):
    """One tensor's payload location (a row of :data:`LOCATION_SQL`).

    ``array_path`` None with ``stored``: an empty payload; ``elem_offset`` None: a large
    array of its own; ``content_hash`` None: statistics only; ``pruned_at`` set: pruned.
    """

    tensor_id: int
    dtype: str | None
    shape: list[int] | None
    nbytes: int | None
    content_hash: str | None
    array_path: str | None
    elem_offset: int | None
    elem_count: int | None
    stored: bool
    format: str | None
    original_shape: list[int] | None
    original_format: str | None
    pruned_at: Any

    @property
    def readable(self) -> bool:
        """True if the payload is in the store (not statistics-only, pruned or missing)."""
        return self.content_hash is not None and self.pruned_at is None and self.stored


def catalog_stamp(catalog_path: Path) -> tuple:
    """(size, mtime_ns, inode) of the catalog file, its ``.wal`` and ``catalog.summary.json``
    (None for a missing one): changes whenever a commit lands."""
    out: list[tuple[int, int, int] | None] = []
    for path in (catalog_path, Path(f"{catalog_path}.wal"), catalog_path.parent / "catalog.summary.json"):
        try:
            st = os.stat(path)
        except FileNotFoundError:
            out.append(None)
        else:
            out.append((st.st_size, st.st_mtime_ns, st.st_ino))
    return tuple(out)


class LocationIndex:
    """Every tensor's :class:`TensorLocation`, loaded on first use and again after the
    catalog changed (see the module docstring).

    ``reader`` gives a read-only catalog connection for one block (``Archive.reader``).
    ``catalog_path`` None: a catalog that never changes (a bundle read in place), loaded once.
    Thread-safe. Raises what ``reader`` raises (ArchiveError when the catalog stays locked).
    """

    def __init__(self, catalog_path: Path | None,
                 reader: Callable[[], AbstractContextManager[duckdb.DuckDBPyConnection]]):
        self.catalog_path = None if catalog_path is None else Path(catalog_path)
        self._reader = reader
        self._lock = threading.Lock()
        self._stamp: tuple | None = None
        self._ids: np.ndarray | None = None
        self._table: pa.Table | None = None
        self._columns: list[Any] = []
        self.loads = 0  # how many times the index was (re)loaded

    def _current(self) -> tuple[np.ndarray, list[Any]]:
        stamp = () if self.catalog_path is None else catalog_stamp(self.catalog_path)
        with self._lock:
            if stamp != self._stamp or self._ids is None:
                self._load()
                self._stamp = stamp  # taken before the load: a commit meanwhile reloads next time
            assert self._ids is not None
            return self._ids, self._columns

    def _load(self) -> None:
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        with self._reader() as con:
            table = con.sql(LOCATION_SQL).to_arrow_table()
        columns = []
        for name in table.column_names:
            col = table.column(name).combine_chunks()
            if pa.types.is_string(col.type) and name in ("dtype", "array_path", "format", "original_format"):
                col = pc.dictionary_encode(col)  # a few distinct values over many tensors
            columns.append(col)
        self._ids = np.asarray(table.column("tensor_id").to_numpy(zero_copy_only=False), dtype=np.int64)
        self._columns = columns
        self.loads += 1

    def get(self, tensor_id: int) -> TensorLocation | None:
        """The location of ``tensor_id``, None if the catalog has no such tensor."""
        ids, columns = self._current()
        i = int(ids.searchsorted(tensor_id))
        if i >= len(ids) or int(ids[i]) != tensor_id:
            return None
        return TensorLocation(*(col[i].as_py() for col in columns))

    def many(self, tensor_ids: list[int]) -> Iterator[TensorLocation | None]:
        """:meth:`get` for each of ``tensor_ids`` (one freshness check for all)."""
        ids, columns = self._current()
        for tid in tensor_ids:
            i = int(ids.searchsorted(tid))
            yield TensorLocation(*(col[i].as_py() for col in columns)) \
                if i < len(ids) and int(ids[i]) == tid else None
