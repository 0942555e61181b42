"""Statistics of payloads the archive already holds, so an ingest skips recomputing them.

Most bytes of a training dump repeat earlier ones (63 % on a real ResNet dump: frozen
parameters, an op's input that is the previous op's output, the same weights in the
next iteration's run). A repeated payload is never compressed or written again (the
``blobs`` dedup); :class:`StoredStats` also spares its statistics: the statistics dumpdb
computed (``stats_source = 'computed'``) for a ``(content_hash, dtype)`` are a function of
those bytes read as that dtype (:func:`dumpdb.stats.compute_stats`), so they are taken
from the catalog instead of computed again. Statistics a dump supplied itself
(``statistic.csv``...) are never reused this way.

Memory: about 100 bytes per distinct stored payload (Arrow columns, hashes as a sorted
fixed-width numpy array for the lookup).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dumpdb.stats import STAT_COLUMNS

_SQL = f"""
SELECT content_hash, dtype, {', '.join(f'"{c}"' for c in STAT_COLUMNS)}
FROM tensors
WHERE content_hash IS NOT NULL AND dtype IS NOT NULL AND stats_source = 'computed'
QUALIFY row_number() OVER (PARTITION BY content_hash, dtype ORDER BY tensor_id) = 1
ORDER BY content_hash, dtype
"""


class StoredStats:
    """Computed statistics of the archive's payloads by ``(content_hash, dtype)``.

    Build with :meth:`load` from a catalog connection (any: read-only or the ingest's
    writer); :meth:`get` is thread-safe (read-only after loading).
    """

    def __init__(self, hashes: np.ndarray, dtypes: list[str], columns: dict[str, tuple[np.ndarray, np.ndarray]]):
        self._hashes = hashes
        self._dtypes = dtypes
        self._columns = columns  # name -> (values, null mask)

    @classmethod
    def load(cls, con: Any) -> StoredStats:
        """Read them from the catalog (``con``: a DuckDB connection)."""
        import pyarrow.compute as pc

        table = con.sql(_SQL).to_arrow_table()
        hashes = np.array(table.column("content_hash").to_pylist(), dtype="S32")
        columns = {}
        for c in STAT_COLUMNS:
            col = table.column(c)
            nulls = np.asarray(pc.is_null(col).to_numpy(zero_copy_only=False), dtype=bool)
            columns[c] = (np.asarray(col.fill_null(0).to_numpy()), nulls)
        return cls(hashes, table.column("dtype").to_pylist(), columns)

    def __len__(self) -> int:
        return len(self._dtypes)

    def get(self, content_hash: str, dtype: str) -> dict[str, Any] | None:
        """The statistics (a dict of ``STAT_COLUMNS``) computed for this payload read as
        ``dtype`` (catalog dtype name), or None when the archive has none."""
        key = content_hash.encode("ascii", "replace")
        i = int(self._hashes.searchsorted(key))
        while i < len(self._dtypes) and self._hashes[i] == key:
            if self._dtypes[i] == dtype:
                return {c: None if nulls[i] else values[i].item() for c, (values, nulls) in self._columns.items()}
            i += 1
        return None
