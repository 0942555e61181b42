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
alone decides what is stored where (dedup, packs cut in dump order) and commits rows:
the catalog and the stored bytes are therefore the same whatever the executor and the
number of workers (``tests/test_scale.py``).

Worker processes on a local store also write the packs of payloads of 256 KiB or more
and the large arrays (:func:`write_payloads`): their results carry a :class:`PayloadRef`
instead of such an array, the ingesting process lays out the packs as always and hands
each one back to the pool, whose worker reads its files again (page cache), checks each
content hash, compresses and writes the shard. Those bytes never pass through the
ingesting process: it dedupes, lays out and commits, so N workers scale on N cores
(compression is most of an ingest's CPU). Smaller payloads come back whole (a second
read of a tiny file costs more than sending it) and their packs are written by the
ingesting process. A worker never writes the catalog.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import operator
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from dumpdb.dtypes import dtype_name, from_dump_name
from dumpdb.dumpio import ReadBuffer, check_dump_file, confine, confined, libc, reading_into
from dumpdb.errors import DumpdbError, DumpFileError
from dumpdb.layouts import Layout, TensorEntry, get_layout
from dumpdb.layouts.base import display_name, encodable
from dumpdb.stats import STAT_COLUMNS, compute_stats
from dumpdb.storage.store import MEDIUM_BYTES, StoreWriter, TensorStore, payload_hash

# A batch sent to a worker: at most this many files / bytes (one huge rank or iteration
# directory is spread over every worker: work is split by file batches, in dump order).
BATCH_FILES = 64
BATCH_BYTES = 32 << 20
# Reader threads of the ingesting process take batches of at most this many bytes: large
# files one by one (reading, compressing and writing overlap), tiny ones 64 at a time.
THREAD_BATCH_BYTES = 4 << 20
# Below this many files (and bytes) a default ingest reads in-process: no processes.
PROCESS_MIN_FILES = 256
PROCESS_MIN_BYTES = 256 << 20
# Default worker processes only from this many cores: the ingesting process compresses and
# commits alone, so on fewer cores processes compete with it (2 cores: 0.71x of threads).
PROCESS_MIN_CORES = 4
# Files from this size are read into the reading thread's reused ReadBuffer (dumpio: no page
# faults per file; O_DIRECT when the page cache does not hold the file): reader threads of the
# ingesting process and worker processes alike. Small files come from the allocator's free
# lists already: no faults to save, a copy to pay.
READ_BUFFER_MIN_BYTES = 256 << 10


@dataclass(slots=True)  # slots: pickled as a tuple, ~3x faster than a dict-backed dataclass
class Loaded:
    """One entry after :func:`load_entry`: ``array`` (None: statistics only or failed),
    its xxh3-128 ``content_hash``, computed ``stats`` (catalog statistic columns, only
    those the dump did not give), ``file_bytes`` read, ``error`` (one line) or ``note``.
    ``entry`` is None once its ``row`` holds it all (a worker's result, sent back)."""

    entry: TensorEntry | None
    array: np.ndarray | None = None
    note: str | None = None
    content_hash: str | None = None
    stats: dict[str, Any] | None = None
    file_bytes: int = 0
    error: str | None = None
    source: tuple[int, int] | None = None  # (st_size, st_mtime_ns) of the file, taken before reading
    ref: PayloadRef | None = None  # the payload by reference (``array`` dropped: LoadTask.keep_arrays False)
    row: dict[str, Any] | None = None  # its ``tensors`` row, when the worker built it (LoadTask.row)

    @property
    def payload(self) -> np.ndarray | PayloadRef | None:
        """The payload (array or reference; None: statistics only or failed)."""
        return self.array if self.array is not None else self.ref


@dataclass
class PayloadRef:
    """A payload by reference: the dump file of ``entry`` (read with ``layout`` inside the
    dump at ``root``), whose content hash, dtype and shape a worker found. Written by
    :func:`write_payloads` (or :func:`read_payload`) where it is read again; the content
    hash is checked then, so a file changed in between is refused, not stored."""

    layout: str
    root: str
    follow_symlinks: bool
    entry: TensorEntry
    size: int
    content_hash: str
    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        """Payload bytes (dtype x shape)."""
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


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
    keep_arrays: bool = True  # False: results carry a PayloadRef (the workers write the payloads)
    row: tuple[str, str, tuple[str, ...]] | None = None  # (run, stats label, entry columns): build rows here


class PayloadMemory:
    """Memory recycled for the payloads reader threads copy out of their
    :class:`~dumpdb.dumpio.ReadBuffer` (new content, kept until its pack is written).

    A fresh array per payload costs the kernel a zeroed page for every page touched
    (``perf`` of the conv-net ingest: half of the 16 % of its CPU the kernel spent in
    ``clear_page``; issue 29): a block whose payload was written and dropped is reused
    instead. A block is free when nothing refers to it any more: every array made from it
    (the payload, the writer's flat views) holds a reference to it, so its reference count
    says so (CPython; elsewhere every copy is fresh memory). Memory: at most ``limit_bytes``
    of blocks are kept (free or in use); past that a copy is fresh memory as before.
    Thread-safe. Copies are C order, as ``ndarray.copy()``."""

    ROUND = 64 << 10  # block sizes are multiples of this; a block takes payloads of half its size up

    def __init__(self, limit_bytes: int):
        self.limit_bytes = limit_bytes
        self.blocks: list[np.ndarray] = []  # uint8, owned here
        self.held = 0  # bytes of self.blocks
        self.reused = 0  # copies made into a block that held an earlier payload
        self.lock = threading.Lock()
        self.recycle = hasattr(sys, "getrefcount")
        # the count of a block only this list holds, measured the way _take measures (an
        # interpreter may or may not count getrefcount's own argument)
        self.free_count = self._count([np.empty(1, np.uint8)], 0) if self.recycle else 0

    def copy(self, array: np.ndarray) -> np.ndarray:
        """A C-order copy of ``array`` (in a free block when one fits)."""
        n = array.nbytes
        block = self._take(n) if self.recycle and n and not array.dtype.hasobject else None
        if block is None:
            return array.copy()
        out = block[:n].view(array.dtype).reshape(array.shape)
        np.copyto(out, array, casting="no")
        return out

    @staticmethod
    def _count(blocks: list[np.ndarray], i: int) -> int:
        """The reference count of ``blocks[i]``: :attr:`free_count` when nothing else holds it."""
        return sys.getrefcount(blocks[i])

    def _take(self, n: int) -> np.ndarray | None:
        with self.lock:
            best = -1
            for i in range(len(self.blocks)):
                size = self.blocks[i].nbytes
                if n <= size <= 2 * n + self.ROUND and self._count(self.blocks, i) == self.free_count and (
                        best < 0 or size < self.blocks[best].nbytes):
                    best = i
            if best >= 0:
                self.reused += 1
                return self.blocks[best]
            size = -(-n // self.ROUND) * self.ROUND
            while self.held + size > self.limit_bytes:  # room for a new block: drop free ones that do not fit
                free = [i for i in range(len(self.blocks)) if self._count(self.blocks, i) == self.free_count]
                if not free:
                    return None
                self.held -= self.blocks.pop(free[0]).nbytes
            block = np.empty(size, np.uint8)
            self.blocks.append(block)
            self.held += size
            return block


def _batch_ref(task: LoadTask, item: Loaded) -> PayloadRef | None:
    """:func:`load_batch` without ``task.keep_arrays``: a reference to ``item``'s payload
    when it is ``MEDIUM_BYTES`` or more (small payloads come back whole: reading them again
    costs more than sending them, and their packs are cheap to compress), else None."""
    if item.array is None or item.content_hash is None or item.entry is None or item.array.nbytes < MEDIUM_BYTES:
        return None
    return PayloadRef(task.layout, task.root, task.follow_symlinks, item.entry, item.file_bytes,
                      item.content_hash, item.array.dtype, tuple(item.array.shape))


def one_line(exc: BaseException) -> str:
    """``exc`` as one line of at most 300 characters."""
    text = " ".join(str(exc).split())
    return text[:300] + ("..." if len(text) > 300 else "")


def load_entry(layout: Layout, entry: TensorEntry, size: int,
               stats_cache: dict[tuple[str, str], dict] | None = None, *, stats: bool = True,
               known_stats: Callable[[str, str], dict[str, Any] | None] | None = None,
               keep_array: bool | None = None, buffer: ReadBuffer | None = None,
               stored: Callable[[Loaded], PayloadRef | None] | None = None,
               memory: PayloadMemory | None = None) -> Loaded:
    """Read, hash and (where the dump gave none) compute statistics of one entry.

    Never raises for a bad file: its problem is ``Loaded.error`` (one line naming it).
    Must run inside :func:`dumpdb.dumpio.confine` of the dump directory. ``stats_cache``
    maps (content hash, dtype) to statistics already computed (equal payloads);
    ``known_stats(content_hash, dtype)`` gives those of a payload the archive holds
    (:class:`~dumpdb.ingestion.stored_stats.StoredStats`), None when it has none.
    ``stats=False``: only the hash (the array is dropped unless ``keep_array``).
    ``Loaded.source`` is the file's (size, mtime) taken before reading
    (:mod:`dumpdb.ingestion.identity`).

    ``buffer``: read the file into this reused memory (:class:`~dumpdb.dumpio.ReadBuffer`:
    no page faults per file) where the layout can; an array kept is then copied out of it,
    unless ``stored(item)`` gives a :class:`PayloadRef` for it (its content is stored or
    about to be: most of a training dump's bytes), which replaces the array; a copy goes
    into ``memory``'s recycled blocks when given.
    """
    item = Loaded(entry, file_bytes=size)
    if entry.path is None:
        return item
    try:
        # every layout's payload: a regular file inside the dump, before any open; its
        # (size, mtime) from that same stat (one stat a file: the tiny-file path's cost)
        st = check_dump_file(entry.path, entry.source_file)
        item.source = (st.st_size, st.st_mtime_ns)
        if buffer is None:
            loaded = layout.load(entry)
        else:
            buffer.used = False
            with reading_into(buffer):
                loaded = layout.load(entry)
    except DumpdbError as exc:
        item.error = str(exc)
        return item
    except Exception as exc:  # noqa: BLE001 - a hostile file must not stop the ingest
        item.error = f"{entry.source_file}: {type(exc).__name__}: {one_line(exc)}"
        return item
    try:
        return _hash_and_stats(item, loaded, stats_cache, stats, known_stats, keep_array, buffer, stored, memory)
    except DumpdbError as exc:
        item.error = f"{entry.source_file}: {one_line(exc)}"
    except Exception as exc:  # noqa: BLE001 - an array the statistics cannot take is this file's error
        item.error = f"{entry.source_file}: {dtype_name(loaded.array.dtype)} payload: {type(exc).__name__}: " \
                     f"{one_line(exc)}"
    item.array = item.content_hash = item.stats = None
    return item


def _hash_and_stats(item: Loaded, loaded: Any, stats_cache: dict[tuple[str, str], dict] | None, stats: bool,
                    known_stats: Callable[[str, str], dict[str, Any] | None] | None, keep_array: bool | None,
                    buffer: ReadBuffer | None, stored: Callable[[Loaded], PayloadRef | None] | None,
                    memory: PayloadMemory | None = None) -> Loaded:
    """:func:`load_entry` after the read: the content hash and (unless the dump gave them)
    the statistics of ``loaded.array``."""
    entry = item.entry
    assert entry is not None
    item.array, item.note = loaded.array, loaded.note
    item.content_hash = payload_hash(loaded.array)
    if not stats:
        if not keep_array:
            item.array = None  # only the hash was asked for
        return _own(item, buffer, None, memory)
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
    return _own(item, buffer, stored, memory)


def _own(item: Loaded, buffer: ReadBuffer | None, stored: Callable[[Loaded], PayloadRef | None] | None,
         memory: PayloadMemory | None = None) -> Loaded:
    """``item`` with no array left in ``buffer`` (read into it): the array becomes
    ``stored``'s reference when that knows the content, else a copy (in ``memory``)."""
    if buffer is None or not buffer.used or item.array is None:
        return item
    ref = stored(item) if stored is not None and item.content_hash is not None else None
    if ref is not None:
        item.ref, item.array = ref, None
    else:
        # C order; the buffer is read into again next time
        item.array = memory.copy(item.array) if memory is not None else item.array.copy()
    return item


_CACHE: dict[tuple[str, str], dict] = {}  # per worker process: statistics by content
_LOCAL = threading.local()  # per worker thread (a process's, or a Dask worker's threads): its ReadBuffer


def load_batch(task: LoadTask) -> list[Loaded]:
    """The worker function: :func:`load_entry` for each entry of ``task``, in order.
    Runs in a worker process or a Dask task; reads the dump, never the archive. Files of
    ``READ_BUFFER_MIN_BYTES`` or more are read into the thread's reused
    :class:`~dumpdb.dumpio.ReadBuffer` (``O_DIRECT`` when the page cache does not hold
    them, as the reader threads of the ingesting process). Without ``task.keep_arrays``
    each payload of ``MEDIUM_BYTES`` or more (packs of 4 MiB chunks, large arrays) comes
    back as a :class:`PayloadRef`; other payloads read into the buffer come back as a copy."""
    layout = get_layout(task.layout)
    if len(_CACHE) > 100_000:
        _CACHE.clear()
    buffer = getattr(_LOCAL, "buffer", None)
    if buffer is None:
        buffer = _LOCAL.buffer = ReadBuffer()
    stored = None if task.keep_arrays else functools.partial(_batch_ref, task)
    with confine(task.root, task.follow_symlinks):
        items = [load_entry(layout, e, s, _CACHE, buffer=buffer if s >= READ_BUFFER_MIN_BYTES else None,
                            stored=stored) for e, s in zip(task.entries, task.sizes)]
    if task.row is not None:  # the rows too: the ingesting process only dedupes and commits
        run, label, columns = task.row
        for item in items:
            if not item.error:
                item.row = tensor_row(item, run, label, columns)
    if stored is not None:
        for item in items:  # payloads a layout read into new memory (not into the buffer)
            ref = stored(item)
            if ref is not None:
                item.ref, item.array = ref, None
    for item in items:
        if item.row is not None and item.ref is None:
            # the row holds entry, statistics, note and file identity: not sent twice
            item.entry = item.stats = item.note = item.source = None
    return items


# tensors columns a reader may leave undecodable bytes in
TEXT_FIELDS = ("source_file", "tensor_key", "op_type", "op_name", "scope_name", "net_name", "model_name",
               "format", "dtype_declared", "arg_name", "note")
_DTYPE_NAMES: dict[np.dtype, str] = {}
_TEXT_VALUES = operator.attrgetter(*TEXT_FIELDS)
_GETTERS: dict[tuple[str, ...], Callable[[Any], tuple]] = {}


def _columns_getter(columns: tuple[str, ...]) -> Callable[[Any], tuple]:
    """A function giving the tuple of ``columns`` of an object (attrgetter of several names)."""
    if len(columns) > 1:
        return operator.attrgetter(*columns)
    return lambda obj: tuple(getattr(obj, c) for c in columns)


def _dtype_name(dtype: np.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = dtype_name(dtype)
    return name


def tensor_row(item: Loaded, run: str, stats_label: str, entry_columns: tuple[str, ...]) -> dict[str, Any]:
    """The ``tensors`` row of a loaded entry of run ``run`` (columns ``entry_columns`` as the
    layout named them, then dtype, shape, nbytes, content hash, statistics - the computed
    ones under the dump's own, ``stats_source`` from ``stats_label`` - note, key and file
    identity). Undecodable bytes in a name are kept visible (``display_name``), not fatal."""
    e = item.entry
    if e is None:
        raise ValueError("tensor_row: the entry was dropped (its row was built already)")
    for name, value in zip(TEXT_FIELDS, _TEXT_VALUES(e)):
        # layouts write file names through display_name already (not a fixed point: only once)
        if value is not None and not value.isascii() and not encodable(value):
            setattr(e, name, display_name(value))
    computed = item.stats
    source = "computed" if computed else None
    if e.stats:
        stats: dict[str, Any] = dict(computed or {})
        stats.update({k: v for k, v in e.stats.items() if v is not None})
        source = stats_label if not computed else f"{stats_label}+computed"
    else:
        stats = computed or {}
    payload = item.payload
    dtype: str | None
    shape: list[Any] | None
    if payload is not None:
        dtype, shape, nbytes = _dtype_name(payload.dtype), list(payload.shape), payload.nbytes
    else:
        declared = from_dump_name(e.dtype_declared)
        dtype = _dtype_name(declared) if declared is not None else None
        shape = list(e.shape_declared) if e.shape_declared is not None else None
        nbytes = None
    notes = "; ".join(n for n in (e.note, item.note) if n) or None
    getter = _GETTERS.get(entry_columns)
    if getter is None:
        getter = _GETTERS[entry_columns] = _columns_getter(entry_columns)
    row = dict(zip(entry_columns, getter(e)))  # one C call for ~30 columns, not a getattr each
    for k in STAT_COLUMNS:
        row[k] = stats.get(k)
    row["run"], row["dtype"], row["shape"], row["nbytes"] = run, dtype, shape, nbytes
    row["content_hash"], row["stats_source"], row["note"], row["tensor_key"] = item.content_hash, source, notes, e.key
    row["source_size"], row["source_mtime_ns"] = item.source if item.source else (None, None)
    row["original_shape"] = list(e.original_shape) if e.original_shape is not None else None
    return row


def read_payload(ref: PayloadRef) -> np.ndarray:
    """The payload ``ref`` names, read again (:func:`load_entry`, hash only). Raises
    :class:`~dumpdb.errors.DumpFileError` naming the file if it cannot be read any more or its
    content hash changed since the first read (a file rewritten during the ingest)."""
    with contextlib.ExitStack() as stack:
        if not confined(ref.root):  # a whole pack's files are read inside one confinement
            stack.enter_context(confine(ref.root, ref.follow_symlinks))
        item = load_entry(get_layout(ref.layout), ref.entry, ref.size, stats=False, keep_array=True)
    if item.error:
        raise DumpFileError(f"{item.error} (read again to store it)")
    if item.content_hash != ref.content_hash or item.array is None:
        raise DumpFileError(f"{ref.entry.source_file}: changed while being ingested (content hash differs from "
                          "the first read); run the same command again")
    return item.array


# Per worker process: a writer of the archive's store (one per store root), serial codec.
_WRITERS: dict[str, StoreWriter] = {}


def write_payloads(store_root: str, kind: str, args: tuple) -> Any:
    """The worker function of a delegated store write (:class:`StoreWriter`'s ``delegate``):
    ``kind`` "pack": ``args`` (storage dtype str, chunk bytes, [(content hash, PayloadRef)],
    delta coding on or off) -> :meth:`StoreWriter.write_pack`; "large": (content hash, PayloadRef) ->
    :meth:`StoreWriter.write_large`, into the local store at ``store_root``. Each payload is
    read again and its hash checked (:func:`read_payload`)."""
    writer = _WRITERS.get(store_root)
    if writer is None:
        # this worker's own core: chunks compressed on this thread's one codec thread
        writer = _WRITERS[store_root] = StoreWriter(TensorStore(store_root, read_only=False), codec_threads=1)
    if kind == "pack":
        dtype, chunk_bytes, refs, delta = args
        with confine(refs[0][1].root, refs[0][1].follow_symlinks):  # one for the pack: directories checked once
            parts = [(h, np.ascontiguousarray(read_payload(r)).reshape(-1).view(dtype)) for h, r in refs]
        return writer.write_pack(dtype, chunk_bytes, parts, delta)
    content_hash, ref = args
    return writer.write_large(content_hash, read_payload(ref))


def batches(entries: list[TensorEntry], sizes: list[int],
            max_bytes: int | None = None) -> Iterator[tuple[list[TensorEntry], list[int]]]:
    """``entries`` (dump order) cut into batches of at most :data:`BATCH_FILES` files and
    about ``max_bytes`` (default :data:`BATCH_BYTES`) bytes."""
    cur: list[TensorEntry] = []
    cur_sizes: list[int] = []
    total = 0
    limit = BATCH_BYTES if max_bytes is None else max_bytes
    for e, s in zip(entries, sizes):
        if cur and (len(cur) >= BATCH_FILES or total + s > limit):
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
        libc().prctl(1, signal.SIGKILL, 0, 0, 0)
    except AttributeError:  # no C library, or none with prctl (not Linux)
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
    """A ``concurrent.futures`` executor over :func:`dumpdb.cluster.dask_client` (the
    cluster at ``scheduler``, or ``"local"``: ``workers`` worker processes started here).
    Workers of a remote cluster must see the dump directory at the same path."""
    from dumpdb.cluster import dask_client

    with dask_client(scheduler, workers, on_start) as client:
        yield client.get_executor(pure=False)
