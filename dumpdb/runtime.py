"""Process-wide tuning that the long commands (ingest, compare) share."""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import sys
from collections.abc import Iterator
from typing import Any


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


def quiet_exit() -> None:
    """At interpreter exit, skip the last full collection of the cyclic collector: every object
    still alive is frozen first (``gc.freeze``), so ``Py_FinalizeEx``'s collection has nothing to
    walk. A command that built a large result (a compare's 100,000 rows of Python objects) spent
    0.15-0.2 s of CPU there for nothing: the process ends and the operating system takes its
    memory back. Objects are still released by reference counting during finalization, so files
    and connections a command leaves open are closed as before. For the ``dumpdb`` process only
    (``dumpdb.__main__``), never in a library call."""
    atexit.register(gc.freeze)


# Arrow's memory pool of the dumpdb process (use_memory_pool): glibc's malloc, as numpy's and
# Python's memory already is (docs/statistics-compare.md, "Arrow's memory pool").
MEMORY_POOL = "system"
POOL_ENV = "ARROW_DEFAULT_MEMORY_POOL"  # Arrow's own variable, read once when pyarrow is imported
_POOLS = ("jemalloc", "mimalloc", "system")


def use_memory_pool(backend: str = MEMORY_POOL) -> str | None:
    """Make ``backend`` (``"system"``, ``"jemalloc"`` or ``"mimalloc"``) Arrow's memory pool in
    this process and in the processes it starts from now on: it sets ``ARROW_DEFAULT_MEMORY_POOL``,
    which pyarrow reads when it is imported (dumpdb's ingest and compare worker processes and a
    local Dask cluster's workers inherit it). Before pyarrow is imported, ``"system"`` (built
    into every pyarrow) goes through that variable alone and becomes Arrow's default for all
    its allocations, those of Arrow's C++ code included; otherwise the backend is checked
    against ``pyarrow.supported_memory_backends()`` and set with ``pyarrow.set_memory_pool``,
    which covers what pyarrow allocates (not the pools Arrow's C++ code takes by itself).
    Buffers allocated before the call stay in the pool they came from.

    Returns the backend set, or None where nothing changed: ``ARROW_DEFAULT_MEMORY_POOL`` set
    already (the user's choice wins), or ``backend`` not built into this pyarrow (e.g. jemalloc
    in Windows wheels: pyarrow's default stays, silently). Raises ``ValueError`` for another name.

    Why the system allocator: pyarrow's default, mimalloc, zeroes whole transparent huge pages
    again each time it reuses memory it purged (docs/statistics-compare.md, "Arrow's memory
    pool"). The ``dumpdb`` process calls this at start for the commands that build large Arrow
    tables (``dumpdb.__main__``); importing dumpdb as a library never does (a library does not
    change its host's allocator)."""
    if backend not in _POOLS:
        raise ValueError(f"unknown Arrow memory pool {backend!r}: one of {', '.join(_POOLS)}")
    if os.environ.get(POOL_ENV):
        return None
    if backend == "system" and "pyarrow" not in sys.modules:
        os.environ[POOL_ENV] = backend
        return backend
    import pyarrow as pa

    if backend not in pa.supported_memory_backends():
        return None
    pools = {"jemalloc": pa.jemalloc_memory_pool, "mimalloc": pa.mimalloc_memory_pool,
             "system": pa.system_memory_pool}
    pa.set_memory_pool(pools[backend]())
    os.environ[POOL_ENV] = backend
    return backend


_malloc_trim: Any = None


def release_free_memory() -> None:
    """Give the memory the process has freed back to the operating system: Arrow's pool in use
    (``release_unused``: jemalloc purges its arenas, mimalloc its pages; the system pool's
    memory, the ``dumpdb`` process's, is glibc's) and glibc's heaps (``malloc_trim(0)``;
    nothing where the C library has none, e.g. musl or macOS). Freed numpy arrays, Python
    objects and the system pool's Arrow buffers stay in glibc's heaps otherwise, and the next
    large allocations (a result table) come on top of them: in a statistics compare of 500,000
    pairs, 163 MB of such pages went back before the result table was built
    (docs/statistics-compare.md). Settles nothing else: malloc's settings are the caller's.
    Costs a walk of the heaps (milliseconds)."""
    global _malloc_trim
    import pyarrow as pa

    pa.default_memory_pool().release_unused()
    if _malloc_trim is None:
        from dumpdb.dumpio import libc

        _malloc_trim = getattr(libc(), "malloc_trim", False)
    if _malloc_trim:
        _malloc_trim(0)
