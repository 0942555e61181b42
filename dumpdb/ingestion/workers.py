"""The ingest's worker function and the executors that run it (issue 12).

The CPU work of an ingest - read a dump file, parse it, hash the payload (xxh3-128),
compute statistics - is :func:`load_entry`. It runs

* in the ingesting process, on reader threads (``workers=1``, and small dumps by
  default: starting processes costs more than it saves),
* in ``N`` worker processes (``workers=N``; default the number of cores when there are at
  least ``PROCESS_MIN_CORES``, else threads in the ingesting process),
* or as tasks of a ``dask.distributed`` cluster (``scheduler=ADDRESS`` or ``"local"``),

always as :func:`load_batch` over a :class:`LoadTask` (a batch of entries of one dump,
picklable). Results come back to the ingesting process *in submission order*, which
alone stores payloads and commits rows: the catalog and the stored bytes are therefore
the same whatever the executor and the number of workers (``tests/test_scale.py``).
A worker never writes the archive.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from dumpdb.dtypes import dtype_name
from dumpdb.dumpio import check_dump_file, confine
from dumpdb.errors import DumpdbError
from dumpdb.layouts import Layout, TensorEntry, get_layout
from dumpdb.stats import STAT_COLUMNS, compute_stats
from dumpdb.storage.store import payload_hash

# A batch sent to a worker: at most this many files / bytes (one huge rank or iteration
# directory is spread over every worker: work is split by file batches, in dump order).
BATCH_FILES = 64
BATCH_BYTES = 32 << 20
# Below this many files (and bytes) a default ingest reads in-process: no processes.
PROCESS_MIN_FILES = 256
PROCESS_MIN_BYTES = 256 << 20
# Default worker processes only from this many cores: the ingesting process compresses and
# commits alone, so on fewer cores processes compete with it (2 cores: 0.71x of threads).
PROCESS_MIN_CORES = 4


@dataclass
class Loaded:
    """One entry after :func:`load_entry`: ``array`` (None: statistics only or failed),
    its xxh3-128 ``content_hash``, computed ``stats`` (catalog statistic columns, only
    those the dump did not give), ``file_bytes`` read, ``error`` (one line) or ``note``."""

    entry: TensorEntry
    array: np.ndarray | None = None
    note: str | None = None
    content_hash: str | None = None
    stats: dict[str, Any] | None = None
    file_bytes: int = 0
    error: str | None = None
    source: tuple[int, int] | None = None  # (st_size, st_mtime_ns) of the file, taken before reading


@dataclass
class LoadTask:
    """A batch of entries of one dump for :func:`load_batch`: ``layout`` (its name),
    ``root`` (the dump directory, for confinement), ``follow_symlinks``, ``entries`` and
    their file ``sizes`` (bytes)."""

    layout: str
    root: str
    follow_symlinks: bool
    entries: list[TensorEntry]
    sizes: list[int]


def one_line(exc: BaseException) -> str:
    """``exc`` as one line of at most 300 characters."""
    text = " ".join(str(exc).split())
    return text[:300] + ("..." if len(text) > 300 else "")


def load_entry(layout: Layout, entry: TensorEntry, size: int,
               stats_cache: dict[tuple[str, str], dict] | None = None, *, stats: bool = True,
               known_stats: Callable[[str, str], dict[str, Any] | None] | None = None) -> Loaded:
    """Read, hash and (where the dump gave none) compute statistics of one entry.

    Never raises for a bad file: its problem is ``Loaded.error`` (one line naming it).
    Must run inside :func:`dumpdb.dumpio.confine` of the dump directory. ``stats_cache``
    maps (content hash, dtype) to statistics already computed (equal payloads);
    ``known_stats(content_hash, dtype)`` gives those of a payload the archive holds
    (:class:`~dumpdb.ingestion.stored_stats.StoredStats`), None when it has none.
    ``stats=False``: only the hash (the array is dropped). ``Loaded.source`` is the
    file's (size, mtime) taken before reading (:mod:`dumpdb.ingestion.identity`).
    """
    item = Loaded(entry, file_bytes=size)
    if entry.path is None:
        return item
    try:
        # every layout's payload: a regular file inside the dump, before any open; its
        # (size, mtime) from that same stat (one stat a file: the tiny-file path's cost)
        st = check_dump_file(entry.path, entry.source_file)
        item.source = (st.st_size, st.st_mtime_ns)
        loaded = layout.load(entry)
    except DumpdbError as exc:
        item.error = str(exc)
        return item
    except Exception as exc:  # noqa: BLE001 - a hostile file must not stop the ingest
        item.error = f"{entry.source_file}: {type(exc).__name__}: {one_line(exc)}"
        return item
    item.array, item.note = loaded.array, loaded.note
    item.content_hash = payload_hash(loaded.array)
    if not stats:
        item.array = None  # only the hash was asked for
        return item
    have = set(entry.stats or ())
    if not set(STAT_COLUMNS) <= have:
        key = (item.content_hash, loaded.array.dtype.str)
        found = stats_cache.get(key) if stats_cache is not None else None
        if found is None and known_stats is not None:
            found = known_stats(item.content_hash, dtype_name(loaded.array.dtype))
        if found is None:
            found = compute_stats(loaded.array).as_dict()
            if stats_cache is not None:
                stats_cache[key] = found
        item.stats = found
    return item


_CACHE: dict[tuple[str, str], dict] = {}  # per worker process: statistics by content


def load_batch(task: LoadTask) -> list[Loaded]:
    """The worker function: :func:`load_entry` for each entry of ``task``, in order.
    Runs in a worker process or a Dask task; reads the dump, never the archive."""
    layout = get_layout(task.layout)
    if len(_CACHE) > 100_000:
        _CACHE.clear()
    with confine(task.root, task.follow_symlinks):
        return [load_entry(layout, e, s, _CACHE) for e, s in zip(task.entries, task.sizes)]


def batches(entries: list[TensorEntry], sizes: list[int]) -> Iterator[tuple[list[TensorEntry], list[int]]]:
    """``entries`` (dump order) cut into batches of at most :data:`BATCH_FILES` files and
    about :data:`BATCH_BYTES` bytes."""
    cur: list[TensorEntry] = []
    cur_sizes: list[int] = []
    total = 0
    for e, s in zip(entries, sizes):
        if cur and (len(cur) >= BATCH_FILES or total + s > BATCH_BYTES):
            yield cur, cur_sizes
            cur, cur_sizes, total = [], [], 0
        cur.append(e)
        cur_sizes.append(s)
        total += s
    if cur:
        yield cur, cur_sizes


def default_workers() -> int:
    """The number of cores this process may use (``os.sched_getaffinity``)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def _worker_start(parent: int) -> None:
    # Ctrl-C goes to the whole process group: the ingesting process handles it (commits
    # what is complete, then stops the pool); a worker just finishes its batch.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A worker dies with the ingesting process (kill -9 included): it holds the pool's
    # pipes, so an orphan would keep them open - and whoever waits on them - forever.
    # Linux prctl(PR_SET_PDEATHSIG, SIGKILL); elsewhere the pool's own shutdown applies.
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the ingesting process died before prctl took effect
        os.kill(os.getpid(), signal.SIGKILL)


@contextmanager
def process_pool(workers: int) -> Iterator[Executor]:
    """``workers`` fresh worker processes (``spawn``: no copy of the ingesting process's
    threads, locks or DuckDB connection)."""
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_worker_start, initargs=(os.getpid(),))
    try:
        yield pool
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


@contextmanager
def dask_executor(scheduler: str, workers: int, on_start: Callable[[str], None] | None = None) -> Iterator[Executor]:
    """A ``concurrent.futures`` executor over a ``dask.distributed`` cluster: the one at
    ``scheduler`` (``tcp://host:8786``), or with ``"local"`` a ``LocalCluster`` of
    ``workers`` single-threaded worker processes started here and stopped at the end.

    Workers of a remote cluster must see the dump directory at the same path. Raises
    :class:`~dumpdb.errors.DumpdbError` if ``dask.distributed`` is not installed
    (``pip install 'dumpdb[dask]'``) or the scheduler cannot be reached.
    """
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise DumpdbError("--scheduler needs dask.distributed: pip install 'dumpdb[dask]'") from None
    cluster = None
    try:
        if scheduler == "local":
            cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                   host="127.0.0.1", dashboard_address=None)
            client = Client(cluster)
        else:
            client = Client(scheduler, timeout=30)
    except (OSError, TimeoutError) as exc:
        if cluster is not None:
            cluster.close()
        raise DumpdbError(f"dask scheduler {scheduler}: cannot connect: {one_line(exc)}") from None
    if on_start is not None:
        on_start(f"dask: {len(client.scheduler_info().get('workers', {}))} workers at {client.scheduler.address}")
    try:
        yield client.get_executor(pure=False)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
