"""Process-wide tuning that the long commands (ingest, compare) share."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def quiet_gc(threshold: int = 50_000) -> Iterator[None]:
    """Python's cyclic garbage collector made cheap for the block, restored after (also on
    error): the objects alive at its start (imports, the scan, the catalog rows) are frozen
    out of every collection (``gc.freeze``) and the youngest generation is collected every
    ``threshold`` allocations instead of 700. An ingest and a tensor compare allocate many
    short-lived dicts and arrays and almost no cycles, so the default collections were pure
    cost walking the long-lived objects (ARCHITECTURE.md, "Ingest"). Objects are still
    collected, only less often."""
    before = gc.get_threshold()
    # a process that froze objects itself (a pre-fork server, an ingest in another thread)
    # keeps its freeze: unfreeze() would thaw its objects too
    freeze = gc.get_freeze_count() == 0
    if freeze:
        gc.freeze()
    gc.set_threshold(max(threshold, before[0]), *before[1:])
    try:
        yield
    finally:
        if gc.get_threshold()[0] == max(threshold, before[0]):  # not changed meanwhile (another ingest's)
            gc.set_threshold(*before)
        if freeze:
            gc.unfreeze()
