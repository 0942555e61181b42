"""The ingest pipeline: dump directory -> archive.

Steps: detect the layout, scan names and graphs, then for every tensor not yet
in the run: read it (worker threads), hash it (xxh3-128), compute statistics
(unless cached for that content), store the payload once (dedup), and commit
catalog rows in batches.

Guarantees (issue 2, "Safety"):

* **Idempotent**: a tensor's identity in a run is ``(source_file, io, slot)``;
  a second ingest of the same dump into the same run adds nothing.
* **Changes noticed** (:mod:`dumpdb.ingestion.identity`): each row records its file's
  size and mtime; a file whose size or mtime differs is read and hashed, and one whose
  content changed refuses the ingest (:class:`~dumpdb.errors.SourceChanged`, nothing
  replaced) unless ``update``. Unchanged files are not read.
* **Resumable**: rows are committed only once their payload is written, in
  batches (one DuckDB transaction each). A kill at any point leaves the catalog
  consistent; re-running the same command ingests only what is missing. A
  payload written but not yet committed is merely unreferenced.
* **Errors lose nothing**: a file that cannot be read is recorded in
  ``ingest_errors`` with a one-line message and skipped; the rest goes on.
* **Source untouched**: dump files are only opened for reading.
"""

from __future__ import annotations

import contextlib
import contextvars
import fcntl
import json
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import BrokenExecutor, Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from dumpdb import __version__
from dumpdb.archive_dir import (
    CATALOG,
    check_marker,
    check_store_url,
    create_archive,
    default_archive_path,
    is_archive,
    open_tensor_store,
)
from dumpdb.catalog import DEFAULT_LOCK_TIMEOUT, Catalog, insert_arrow, schema
from dumpdb.catalog.locks import SHARED, store_lock
from dumpdb.catalog.payload_rows import record_payloads
from dumpdb.catalog.runstate import run_lock_path, touch
from dumpdb.dumpio import ReadBuffer, confine, reason
from dumpdb.errors import ArchiveError, DumpdbError, DumpFileError, SourceChanged, require_run
from dumpdb.ingestion import identity
from dumpdb.ingestion.ranges import check_ranges
from dumpdb.ingestion.statistics import estimate_rows, statistics_parts
from dumpdb.ingestion.stored_stats import StoredStats
from dumpdb.ingestion.workers import (
    PROCESS_MIN_BYTES,
    PROCESS_MIN_CORES,
    PROCESS_MIN_FILES,
    READ_BUFFER_MIN_BYTES,
    THREAD_BATCH_BYTES,
    Loaded,
    LoadTask,
    PayloadMemory,
    PayloadRef,
    batches,
    dask_executor,
    default_workers,
    load_batch,
    load_entry,
    one_line,
    process_pool,
    read_payload,
    tensor_row,
    write_payloads,
)
from dumpdb.layouts import DumpScan, Layout, TensorEntry, locate
from dumpdb.layouts.base import StatisticsFile, display_name, encodable
from dumpdb.layouts.mindspore_kit import duplicate_row
from dumpdb.progress import Reporter
from dumpdb.runtime import quiet_gc
from dumpdb.storage.codecs import check_compressor
from dumpdb.storage.store import BlobLocation, StoreWriter, TensorStore, payload_hash

# Catalog commits: each opens the catalog read-write (~20 ms alone, far more while
# reader threads hold the GIL), so commit by volume and time, not per pack. A
# kill loses at most this much work; the re-run redoes it.
COMMIT_ROWS = 5_000
COMMIT_SECONDS = 3.0
INFLIGHT_BYTES = 256 << 20
# csv text per streamed statistics batch (one commit each): ~60,000 rows of statistic.csv
STATISTIC_BATCH_BYTES = 8 << 20
INFLIGHT_COUNT = 64
THREAD_INFLIGHT_BYTES = 64 << 20  # reader threads: past INFLIGHT_COUNT files, more only while under this
# new payloads copied out of the reader threads' buffers live until their pack is written: at most
# INFLIGHT_BYTES being read plus the writer's buffered and in-flight packs; this much is recycled
PAYLOAD_MEMORY_BYTES = 384 << 20

# Arrow schemas of the rows this pipeline writes, from the catalog schema (the
# migrations); columns filled by a default (ids, timestamps) are left out. blobs/arrays
# rows are written by dumpdb.storage.payloads.
TENSOR_SCHEMA = schema.arrow_schema("tensors", exclude=("tensor_id", "pruned_at", "previous_hash", "updated_at"))
# The columns an 'ingest --update' replaces in a row whose source file changed (tensor_id stays).
_REPLACED_COLUMNS = tuple(c for c in TENSOR_SCHEMA.names if c not in ("run", "tensor_key"))
ERROR_SCHEMA = schema.arrow_schema("ingest_errors", exclude=("time",))


@dataclass
class IngestReport:
    """What one :func:`ingest` call did. Byte counts are bytes; ``seconds`` wall time."""

    run: str
    archive: Path
    layout: str
    source_path: str
    tensors_in_dump: int = 0
    tensors_added: int = 0
    tensors_skipped: int = 0  # already in the run (files not read unless their size or mtime changed)
    tensors_replaced: int = 0  # in the run, file changed, new content stored (update=True)
    payloads_filled: int = 0  # of them: statistics-only rows whose payload is readable now (stored by re-ingest)
    files_changed: list[tuple[str, str]] = field(default_factory=list)  # (source_file, what differs)
    deduplicated: int = 0  # added, payload already stored
    statistics_only: int = 0
    bytes_read: int = 0  # file bytes read from the dump
    bytes_in: int = 0  # payload bytes of the tensors added
    bytes_stored: int = 0  # compressed bytes written to the store
    errors: list[tuple[str, str]] = field(default_factory=list)
    seconds: float = 0.0
    status: str = "ingesting"
    interrupted: bool = False

    @property
    def ratio(self) -> float | None:
        """bytes_in / bytes_stored (None when nothing was stored)."""
        return self.bytes_in / self.bytes_stored if self.bytes_stored else None

    @property
    def ok(self) -> bool:
        """True if the ingest finished and no file failed (exit code 0)."""
        return not self.errors and not self.interrupted


# Per-run relations a scan provides whole (DumpScan attribute = table name);
# replaced as a unit when an interrupted run is resumed.
RELATION_SCHEMAS = {
    table: schema.arrow_schema(table)
    for table in ("ops", "execution_order", "graph_executions", "overflows", "call_stacks", "module_tree",
                  "msprobe_records")
}
RELATION_TABLES = tuple(RELATION_SCHEMAS)



def content_hash(array: np.ndarray) -> str:
    """xxh3-128 hex digest of an array's bytes (C order), the dedup key."""
    return payload_hash(array)


class _RunLock:
    """An exclusive per-run lock file (``locks/run-<sha1>.lock``), so two ingests
    of the same run never interleave. Released when the process ends."""

    def __init__(self, archive: Path, run: str):
        locks = archive / "locks"
        locks.mkdir(exist_ok=True)
        self.path = run_lock_path(archive, run)
        self.run = run
        self.fd: int | None = None

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self.fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(self.fd)
            raise ArchiveError(
                f"run {self.run!r} is being ingested by another dumpdb process (pid {holder}); "
                "wait for it to finish, or choose another --run") from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, str(os.getpid()).encode(), 0)
        return self

    def __exit__(self, *exc):
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)


def open_for_write(archive: Path, store: str | None, storage_options: dict | None) -> None:
    if not is_archive(archive):
        create_archive(archive, store, storage_options)  # refuses a non-empty directory that is not an archive
    check_marker(archive)
    check_store_url(archive, store)
    if not (os.access(archive, os.W_OK) and os.access(archive / CATALOG, os.W_OK)):
        raise ArchiveError(f"{archive}: archive is read-only; cannot ingest into it")


def ingest(
    dump_dir: str | os.PathLike,
    archive: str | os.PathLike | None = None,
    run: str | None = None,
    *,
    layout: str | None = None,
    workers: int | None = None,
    reporter: Reporter | None = None,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    on_wait: Callable[[str], None] | None = None,
    follow_symlinks: bool = False,
    update: bool = False,
    moved: bool = False,
    verify_hash: bool = False,
    store: str | None = None,
    storage_options: dict | None = None,
    scheduler: str | None = None,
    delta: bool = True,
    codec: str | None = None,
) -> IngestReport:
    """Ingest the dump at ``dump_dir`` into ``archive`` as run ``run``.

    ``archive`` defaults to ``$DUMPDB_ARCHIVE`` or ``./dumpdb.archive`` and is
    created if missing; ``run`` defaults to the dump directory's name;
    ``layout`` overrides auto-detection. Returns an :class:`IngestReport`
    (per-file problems are in ``report.errors``, not raised).

    Raises :class:`~dumpdb.errors.LayoutError` for a missing or unrecognised
    dump directory, :class:`~dumpdb.errors.ArchiveError` for an archive that
    cannot be written or a run name already used by another dump.
    KeyboardInterrupt stops reading, commits what is complete, and returns a
    report with ``interrupted=True``.

    A re-ingest into an existing run skips the files the run holds whose size and mtime
    are unchanged, without reading them; a file whose size or mtime changed is read and
    hashed, and if its content changed the ingest raises
    :class:`~dumpdb.errors.SourceChanged` (exit 1) naming every such file, having
    replaced nothing. ``update=True`` stores the new content instead: the row keeps its
    ``tensor_id`` and gets the new payload, statistics and file identity;
    ``previous_hash`` names the payload it replaced, which stays in the store (readable
    by hash) only until :meth:`~dumpdb.archive.Archive.gc` (unless another tensor uses it).

    ``moved=True`` continues run ``run`` from ``dump_dir`` although the run was ingested
    from another path: every file the run holds must be there with the same name and
    size (``verify_hash=True``: and the same content hash, which reads them all);
    otherwise :class:`~dumpdb.errors.SourceChanged` names them and nothing changes.
    The run's ``source_path`` becomes the new location.

    Dump files are read only if they are regular files (a FIFO, socket or device
    is refused before it is opened) and, unless ``follow_symlinks``, only if they
    lie inside ``dump_dir`` once symlinks are resolved (:mod:`dumpdb.dumpio`);
    each refused file is one line in ``report.errors``.

    ``store``: an ``s3://BUCKET/PREFIX`` URL for a new archive's tensor store (the catalog
    stays in ``archive``; later calls find the URL in the archive); given for an existing
    archive it must be the one remembered (ArchiveError otherwise). ``storage_options``:
    endpoint, credentials... over the ``AWS_*`` environment (:mod:`dumpdb.storage.remote`).
    StorageError when the store cannot be reached or written.
    ``workers``: worker processes that read, hash and compute statistics (default: the
    cores when there are at least 4, else in-process threads; a dump under 256 files and
    256 MB is read in-process; ``workers=1``: in-process). ``scheduler``: run the same worker function as tasks
    of the ``dask.distributed`` cluster at that address, or ``"local"`` for a
    ``LocalCluster`` of ``workers`` processes (needs ``dumpdb[dask]``). Either way this
    process alone stores payloads and commits rows, in dump order, so the catalog and
    the stored bytes do not depend on ``workers`` or ``scheduler``
    (:mod:`dumpdb.ingestion.workers`).

    ``delta``: a payload may be stored as the XOR of a similar earlier payload of the same
    pack when that compresses better (:mod:`dumpdb.storage.delta`; reads are unchanged);
    False stores every payload plain.

    ``codec``: the compressor of the archive's tensor store, ``"zstd"`` (the default: the
    smallest store) or ``"lz4"`` (made for reading: chunks decode 2-3x faster and payloads of
    4 MiB or more read about as fast as ``np.load``, for about 1.3x the bytes;
    :mod:`dumpdb.storage.codecs`, docs/storage-design.md); recorded in the store, so every
    later ingest uses it. None: the archive's (zstd for a new one). Given for an archive
    holding payloads of another codec: StorageError, nothing ingested.
    """
    options = IngestOptions(update=update, moved=moved, verify_hash=verify_hash, delta=delta,
                            follow_symlinks=follow_symlinks, workers=workers, scheduler=scheduler,
                            lock_timeout=lock_timeout, on_wait=on_wait)
    archive = Path(archive) if archive is not None else default_archive_path()
    if codec is not None:
        check_compressor(codec)  # before the archive is made
    start = prepare(dump_dir, archive, run, layout, options, reporter, store=store, storage_options=storage_options)
    if codec is not None:
        open_tensor_store(archive, False, storage_options).choose_compressor(codec)
    catalog = Catalog(archive / CATALOG, lock_timeout=lock_timeout, on_wait=on_wait)
    catalog.check(writable=True)
    with _RunLock(archive, start.run):
        def sink(report: IngestReport) -> CatalogSink:
            return CatalogSink(catalog, start.scan, start.layout, report, start.reporter, options,
                               heartbeat=run_lock_path(archive, start.run))
        return run_pipeline(start, sink, f"ingest of run {start.run!r}", storage_options)


@dataclass(frozen=True)
class IngestOptions:
    """How one ingest runs: :func:`ingest`'s keywords of the same names (``workers``,
    ``scheduler``: where the worker function runs, :class:`Executors`; ``lock_timeout`` in
    seconds, ``on_wait`` told each wait for a lock). Given to :class:`Pipeline` and its sink."""

    update: bool = False
    moved: bool = False
    verify_hash: bool = False
    delta: bool = True
    follow_symlinks: bool = False
    workers: int | None = None
    scheduler: str | None = None
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT
    on_wait: Callable[[str], None] | None = None


@dataclass
class Prepared:
    """A dump found and scanned for an archive ready to write (:func:`prepare`)."""

    dump_dir: Path
    archive: Path
    run: str
    layout: Layout
    source_path: str  # the dump's directory, resolved (the runs row's source_path)
    scan: DumpScan
    options: IngestOptions
    reporter: Reporter
    started: float  # time.monotonic() when the ingest began


def prepare(dump_dir: str | os.PathLike, archive: Path, run: str | None, layout: str | None,
            options: IngestOptions, reporter: Reporter | None, *, store: str | None = None,
            storage_options: dict | None = None, before_scan: Callable[[str], None] | None = None) -> Prepared:
    """The one prologue of ``ingest`` and ``ingest-worker``: find the dump (``layouts.locate``),
    name the run (default: the dump directory's name), refuse a read-only archive, scan the
    dump (confined to ``dump_dir``) and check its values fit the catalog's columns, then
    create the archive if missing (after the scan: a dump the layout refuses leaves no empty
    archive, issue 30). ``before_scan(run)``: a caller's check once the run is named.
    Raises LayoutError (no dump), DumpdbError (empty run name), ArchiveError (read-only or
    not an archive)."""
    started = time.monotonic()
    reporter = reporter or Reporter()
    dump_dir = Path(dump_dir)
    # The dump may sit below the given directory (detection at any depth): read it from where it is.
    found = locate(dump_dir, layout)
    run = run or dump_dir.resolve().name
    if not run.strip():
        raise DumpdbError("run name must not be empty")
    if is_archive(archive):
        open_for_write(archive, store, storage_options)  # a read-only archive is refused before the scan
    if before_scan is not None:
        before_scan(run)
    with confine(dump_dir, options.follow_symlinks):
        reporter.scanning(found.path)
        scan = found.layout.scan(found.path)
        check_ranges(scan, TENSOR_SCHEMA, RELATION_SCHEMAS)
    open_for_write(archive, store, storage_options)
    return Prepared(dump_dir, archive, run, found.layout, str(found.path.resolve()), scan, options, reporter,
                    started)


def run_pipeline(start: Prepared, sink: Callable[[IngestReport], IngestSink], lock_label: str,
                 storage_options: dict | None = None) -> IngestReport:
    """Run a :class:`Pipeline` over ``start``'s scan into ``sink(report)`` under the store lock
    (shared: gc must not delete payloads this ingest deduplicates against) and the dump's
    confinement; the report's ``seconds`` and the reporter's ``finish`` whatever happens."""
    options = start.options
    with store_lock(start.archive, SHARED, lock_label, timeout=options.lock_timeout, on_wait=options.on_wait), \
            confine(start.dump_dir, options.follow_symlinks):
        report = IngestReport(run=start.run, archive=start.archive, layout=start.layout.name,
                              source_path=start.source_path, tensors_in_dump=len(start.scan.entries))
        pipeline = Pipeline(open_tensor_store(start.archive, False, storage_options), start.layout, start.scan,
                            report, start.reporter, sink(report), options, str(start.dump_dir))
        try:
            with quiet_gc():
                pipeline.run()
        finally:
            report.seconds = time.monotonic() - start.started
            start.reporter.finish()
    return report


class Pipeline:
    """One ingest of one scanned dump into one run: the files read (by ``executor``: threads,
    worker processes or Dask tasks), deduplicated against ``known`` hashes, packed by the
    :class:`StoreWriter`, and their rows handed in batches, once their packs are durable, to
    ``sink`` (:class:`IngestSink`: the catalog, :class:`CatalogSink`, on a committer thread,
    one transaction in flight, in order; or a part's Parquet fragments,
    :class:`dumpdb.ingestion.parts.PartSink`). The data flow and the crash rules are in
    ARCHITECTURE.md."""

    def __init__(self, store: TensorStore, layout: Layout, scan: DumpScan, report: IngestReport,
                 reporter: Reporter, sink: IngestSink, options: IngestOptions, root: str):
        self.sink = sink
        self.options = options
        self.layout = layout
        self.scan = scan
        self.report = report
        self.reporter = reporter
        self.workers = max(1, min(4, (os.cpu_count() or 2) + 1))  # reader threads
        self.writer = StoreWriter(store)
        self.writer.delta = options.delta
        self.writer.resolve = read_payload  # a payload reference a worker's pool dropped: read here
        self.run_name = report.run
        self.known: set[str] = set()  # payload hashes durable in the store
        self.waiting: dict[str, list[dict]] = {}  # hash buffered in a pack -> rows waiting on it
        self.stats_cache: dict[tuple[str, str], dict] = {}
        self.stored_stats: StoredStats | None = None  # computed statistics of payloads stored before
        self.rows: list[dict] = []  # rows ready to commit
        self.blob_rows: list[BlobLocation] = []  # durable payloads, not yet in the catalog
        self.error_rows: list[dict] = []
        self.last_commit = time.monotonic()
        self.arrays: list = []  # arrays written, not yet in the catalog
        self.replacing: dict[str, str] = {}  # tensor_key -> content hash being replaced (update)
        self.tables: list[pa.Table] = []  # statistics-only rows (Arrow), not yet in the catalog
        self.done_seen: set[str] = set()  # keys of self.done met again while streaming a csv
        self.done: set[str] = set()  # tensor keys the run held when this ingest began
        # worker processes / Dask (None: threads here)
        self.executor: Executors | None = Executors(root, options.follow_symlinks, options.workers,
                                                    options.scheduler, options.on_wait)
        self.accepted = 0  # entries taken since the packs were last cut
        self.committer: ThreadPoolExecutor | None = None  # the commit thread (see _commit)
        self.in_commit: Future | None = None  # the commit in flight
        self.told: deque[tuple] = deque()  # reporter calls waiting for the commit in flight (_tell)
        self.local = threading.local()  # per reader thread: its ReadBuffer (_load)
        self.memory = PayloadMemory(PAYLOAD_MEMORY_BYTES)  # new payloads copied out of a ReadBuffer (_load)

    # -- setup ---------------------------------------------------------------
    def _hashes(self, entries: list[TensorEntry]) -> dict[str, tuple[str | None, str | None]]:
        """tensor_key -> (content hash, error) of ``entries``, read in worker threads (arrays dropped)."""
        def one(entry: TensorEntry) -> tuple[str, str | None, str | None]:
            item = self._load(entry, 0, stats=False)
            return entry.key, item.content_hash, item.error

        with ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="dumpdb-hash") as pool:
            futures = [pool.submit(contextvars.copy_context().run, one, e) for e in entries]
            return {key: (h, err) for key, h, err in (f.result() for f in futures)}

    def _begin(self) -> list[TensorEntry]:
        """The sink's start (:meth:`IngestSink.begin`): what to read, and what is already stored."""
        start = self.sink.begin(self._hashes)
        self.known, self.done, self.stored_stats = start.known, start.done, start.stored_stats
        self.replacing = start.replacing
        for source_file, message in self.scan.errors:
            self._error(source_file, message)
        return start.pending

    # -- main loop -----------------------------------------------------------
    def run(self) -> None:
        pending = self._begin()
        streamed = sum(estimate_rows(f) for f in self.scan.statistics_files)
        self.reporter.start(len(pending) + streamed, self.report.tensors_skipped)
        interrupted = False
        try:
            if pending:
                with (self.executor.open(pending) if self.executor else contextlib.nullcontext()) as pool:
                    if pool is None:
                        self._process(pending)
                    else:
                        inflight = self.writer.max_inflight
                        self._delegate_writes(pool)
                        try:
                            self._process_batches(pending, pool)
                            self._durable(self.writer.flush())  # the last packs, by the workers
                        finally:
                            self.writer.delegate = None
                            self.writer.max_inflight = inflight  # packs held here again: the usual bound
                            self.writer.wait()  # the pool's writes finish before the pool goes
            self._durable(self.writer.flush())
            self._commit()
            for sf in self.scan.statistics_files:
                self._statistics(sf)
            self._settle()
        except KeyboardInterrupt:
            interrupted = True
            self.report.interrupted = True
            # progress that waited for a commit no longer matters (errors are still told)
            self.told = deque(call for call in self.told if call[0] != "advance")
            # Keep what is complete: write buffered packs and commit their rows.
            self._durable(self.writer.flush())
            self._drop_committed()
            self._commit()
            self._settle()
        except DumpFileError:
            # A pack's writer reads its files again (workers.read_payload) and found one
            # changed or gone: keep what was committed, settle the run as
            # interrupted (the same command completes it), and raise the one-line error.
            self.report.interrupted = True
            self._abandon()
            try:
                self._finish(True)
            except Exception:  # noqa: BLE001 - the error raised below says what went wrong
                pass
            self.report.status = "interrupted"
            raise
        except OSError as exc:
            # Writing the store failed (disk full, archive unwritable): keep what was
            # committed, settle the run as interrupted, and say so in one line.
            self.report.interrupted = True
            self._abandon()
            try:
                self._finish(True)
            except Exception:  # noqa: BLE001 - the catalog may be on the same full disk
                pass
            self.report.status = "interrupted"
            where = exc.filename or self.writer.store.name
            raise ArchiveError(
                f"{where}: cannot write the archive: {exc.strerror or exc}; the {self.report.tensors_added} "
                "tensors committed so far are kept: free the problem and run the same command again; "
                f"{RECLAIM_HINT}") from exc
        finally:
            self._settle(raise_error=False)  # no-op unless leaving on an error: nothing writes after the locks go
            if self.committer is not None:
                self.committer.shutdown(wait=True)
            self.writer.close()
        self._finish(interrupted)
        if interrupted:
            self.report.status = "interrupted"

    def _statistics(self, sf: StatisticsFile) -> None:
        """Stream one statistics csv: each batch of rows is committed as one Arrow
        table (bounded memory, rows visible while the ingest goes on). Refused records and
        duplicate rows are one error line each, naming the csv and line."""
        seen: list[np.ndarray] = []  # sorted hashes of the keys of this file already taken
        try:
            for part in statistics_parts(sf, self.run_name, TENSOR_SCHEMA, self.layout.stats_label,
                                         STATISTIC_BATCH_BYTES):
                for message in part.errors:
                    self._error(sf.source_file, message)
                self.report.tensors_in_dump += part.table.num_rows + len(part.entries)
                table, duplicates = self._new_rows(part.table, seen, part.lines, sf.source_file)
                rows = []
                if part.entries:
                    mini = DumpScan(layout=self.layout.name, root=Path(sf.path), entries=part.entries)
                    check_ranges(mini, TENSOR_SCHEMA, {})
                    for source_file, message in mini.errors:
                        self._error(source_file, message)
                    fresh, more = self._new_rows(pa.table({"tensor_key": [e.key for e in mini.entries]}), seen,
                                           np.array([e.csv_line or 0 for e in mini.entries], dtype=np.int64),
                                           sf.source_file)
                    duplicates += more
                    keep = set(fresh["tensor_key"].to_pylist())
                    rows = [self._row(Loaded(e)) for e in mini.entries if e.key in keep]
                added = table.num_rows + len(rows)
                self.report.tensors_skipped += part.table.num_rows + len(part.entries) - added - duplicates
                self.report.statistics_only += added
                self.tables.append(table)
                self.rows.extend(rows)
                self._commit()
                self._tell("advance", part.records, 0)
        except (OSError, DumpdbError) as exc:
            self._error(sf.source_file, reason(exc, sf.path))

    def _new_rows(self, table: pa.Table, seen: list[np.ndarray], lines: np.ndarray,
                  where: str) -> tuple[pa.Table, int]:
        """``table`` without rows whose ``tensor_key`` the run already has: an earlier
        ingest's (skipped, counted as already there), or an earlier row of this file in this
        ingest (an earlier batch or this one: the first one wins, each later one is an error
        line, :func:`~dumpdb.layouts.mindspore_kit.duplicate_row`). ``lines``: the csv line of
        each row. ``seen`` holds sorted 64-bit hashes of the keys taken so far (8 bytes a
        row); a hash hit is checked against the catalog, so a collision never drops a row.
        Returns the kept rows and the number of duplicate rows refused."""
        keys = table["tensor_key"].to_pylist()
        hashes = np.fromiter((hash(k) for k in keys), dtype=np.int64, count=len(keys))
        hit = np.zeros(len(keys), dtype=bool)
        for chunk in seen:
            pos = np.searchsorted(chunk, hashes).clip(0, len(chunk) - 1)
            hit |= chunk[pos] == hashes
        committed: set[str] = set()
        if hit.any():
            committed = self._committed_keys([k for k, h in zip(keys, hit) if h])
        taken: set[str] = set()
        keep = np.ones(len(keys), dtype=bool)
        duplicates = 0
        for i, k in enumerate(keys):
            if self.done and k in self.done:
                keep[i] = False
                if k in self.done_seen:  # a second row of what an earlier ingest committed
                    self._error(where, duplicate_row(where, int(lines[i]), k.partition("#")[2]))
                    duplicates += 1
                self.done_seen.add(k)
            elif k in taken or (hit[i] and k in committed):
                keep[i] = False
                self._error(where, duplicate_row(where, int(lines[i]), k.partition("#")[2]))
                duplicates += 1
            else:
                taken.add(k)
        if keep.any():
            seen.append(np.sort(hashes[keep]))
            if len(seen) >= 8:  # few sorted runs: a lookup stays ~8 binary searches, not one per batch
                seen[:] = [np.sort(np.concatenate(seen))]
        return (table if keep.all() else table.filter(pa.array(keep))), duplicates

    def _committed_keys(self, candidates: list[str]) -> set[str]:
        """Which of ``candidates`` the run holds (earlier batches committed first)."""
        self._commit()
        self._settle()
        return self.sink.committed_keys(candidates)

    def _drop_committed(self) -> None:
        """A Ctrl-C that lands after a COMMIT but before the batch was cleared leaves rows
        that are already in the catalog: drop them so the recovery commit cannot add them twice."""
        self._settle(raise_error=False)
        if not (self.rows or self.error_rows):
            return
        self.rows, self.error_rows = self.sink.drop_committed(self.rows, self.error_rows)

    def _abandon(self) -> None:
        """After a store write failed: commit the rows whose payloads are durable (and
        the errors) if the catalog still accepts writes; drop everything else."""
        self.waiting.clear()
        try:
            self._settle(raise_error=False)
            self._commit()
            self._settle()
        except Exception:  # noqa: BLE001 - nothing more can be saved
            pass

    def _process(self, pending: list[TensorEntry]) -> None:
        """``pending`` on reader threads here, in the batches worker processes get (one
        task per batch, not per file: a tiny file's cost is mostly per-call overhead);
        results taken in dump order."""
        inflight: deque = deque()
        inflight_bytes = inflight_files = 0
        sizes = [e.size if e.size is not None else _file_size(e.path) for e in pending]
        tasks = batches(pending, sizes, THREAD_BATCH_BYTES)
        exhausted = False
        with ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="dumpdb-read") as pool:
            try:
                while True:
                    # in flight: INFLIGHT_COUNT files (as many as 64 batches of tiny ones while
                    # they hold under THREAD_INFLIGHT_BYTES), never more than INFLIGHT_BYTES
                    while not exhausted and (not inflight or (
                            len(inflight) < INFLIGHT_COUNT and inflight_bytes < INFLIGHT_BYTES
                            and (inflight_files < INFLIGHT_COUNT or inflight_bytes < THREAD_INFLIGHT_BYTES))):
                        batch = next(tasks, None)
                        if batch is None:
                            exhausted = True
                            break
                        # each worker call in a copy of this context: it carries the
                        # dump-directory confinement (dumpio.confine)
                        ctx = contextvars.copy_context()
                        nbytes = sum(batch[1])
                        inflight.append((pool.submit(ctx.run, self._load_many, batch[0], batch[1]), nbytes))
                        inflight_bytes += nbytes
                        inflight_files += len(batch[0])
                    if not inflight:
                        break
                    future, nbytes = inflight.popleft()
                    inflight_bytes -= nbytes
                    items = future.result()
                    inflight_files -= len(items)
                    for item in items:
                        self._accept(item)
                        self._progress()
            except BaseException:
                for future, _ in inflight:
                    future.cancel()
                raise

    def _delegate_writes(self, pool: Executor) -> None:
        """Worker processes on a local store write the packs too (:mod:`dumpdb.ingestion.workers`):
        results carry payload references, the packs are laid out here as always and each is
        written by a worker, so compression runs on every core and no payload byte passes
        through this process. Dask tasks (other machines maybe) and remote stores: arrays
        come back and this process writes."""
        store = self.writer.store
        if not store.capabilities.files or not isinstance(pool, ProcessPoolExecutor):
            return
        store_root = str(store.root)
        self.writer.delegate = lambda kind, args: pool.submit(write_payloads, store_root, kind, args)
        self.writer.max_inflight = max(self.writer.max_inflight, 2 * max(1, self.executor.count if self.executor
                                                                          else 1))

    def _load_many(self, entries: list[TensorEntry], sizes: list[int]) -> list[Loaded]:
        """Reader thread: :meth:`_load` of a batch, in order."""
        return [self._load(e, s) for e, s in zip(entries, sizes)]

    def _load(self, entry: TensorEntry, size: int, stats: bool = True) -> Loaded:
        """Reader thread: read, hash, statistics (unless not ``stats``; statistics of a
        payload stored before come from the catalog). Never raises for a bad file.
        Files are read into this thread's reused memory (``dumpio.ReadBuffer``): a payload
        whose content is stored or waiting for its pack comes back as a reference (nothing
        kept, nothing copied: 74 % of a real dump's bytes), others as a copy."""
        known = self.stored_stats.get if self.stored_stats is not None else None
        buffer = None
        # small files come from the allocator's free lists already: no faults to save, a copy to pay
        if self.executor is not None and size >= READ_BUFFER_MIN_BYTES:  # the root: a reference is readable
            buffer = getattr(self.local, "buffer", None)
            if buffer is None:
                buffer = self.local.buffer = ReadBuffer()
        return load_entry(self.layout, entry, size, self.stats_cache, stats=stats, known_stats=known,
                          buffer=buffer, stored=self._stored_ref, memory=self.memory)

    def _stored_ref(self, item: Loaded) -> PayloadRef | None:
        """Reader thread: a reference to ``item``'s payload if its content is durable or
        waiting for its pack (read-only looks at sets the main thread only adds to, while
        running: the main thread then takes it as a duplicate; if not, the writer reads the
        file again, checking the hash), else None."""
        h = item.content_hash
        if item.entry is None or item.array is None or h is None or not (h in self.known or h in self.waiting):
            return None
        assert self.executor is not None
        return PayloadRef(self.layout.name, self.executor.root, self.executor.follow_symlinks, item.entry,
                          item.file_bytes, h, item.array.dtype, tuple(item.array.shape))

    def _process_batches(self, pending: list[TensorEntry], pool: Executor) -> None:
        """``pending`` in batches on worker processes or Dask tasks; results taken in
        submission order (so stored bytes and rows do not depend on the workers)."""
        assert self.executor is not None
        sizes = [e.size if e.size is not None else _file_size(e.path) for e in pending]
        tasks = batches(pending, sizes)
        inflight: deque = deque()
        inflight_bytes = 0
        limit = 2 * max(1, self.executor.count) + 2
        exhausted = False
        try:
            while True:
                while not exhausted and (not inflight or (
                        len(inflight) < limit and inflight_bytes < INFLIGHT_BYTES)):
                    batch = next(tasks, None)
                    if batch is None:
                        exhausted = True
                        break
                    task = LoadTask(self.layout.name, self.executor.root, self.executor.follow_symlinks, *batch,
                                    keep_arrays=self.writer.delegate is None,
                                    row=(self.run_name, self.layout.stats_label, _ENTRY_COLUMNS))
                    nbytes = sum(batch[1])
                    inflight.append((pool.submit(load_batch, task), nbytes))
                    inflight_bytes += nbytes
                if not inflight:
                    break
                future, nbytes = inflight.popleft()
                inflight_bytes -= nbytes
                try:
                    items = future.result()
                except BrokenExecutor as exc:
                    raise DumpdbError(f"an ingest worker process died ({one_line(exc)}); what was committed "
                                      "stays: run the same command again") from None
                for item in items:
                    self._accept(item)
                    self._progress()
        except BaseException:
            for future, _ in inflight:
                future.cancel()
            raise

    def _accept(self, item: Loaded) -> None:
        entry = item.entry
        payload = item.payload  # the array, or a reference a worker process writes
        self.report.bytes_read += item.file_bytes if payload is not None else 0
        self._tell("advance", 1, item.file_bytes)
        if item.error:
            self._error(entry.source_file if entry is not None else "?", item.error)
            return
        row = self._row(item)
        if payload is None:  # statistics only
            self.report.statistics_only += 1
            self.rows.append(row)
            return
        self.report.bytes_in += payload.nbytes
        h = item.content_hash
        assert h is not None  # a loaded payload is hashed (workers.load_entry)
        if h in self.known:
            self.report.deduplicated += 1
            self.rows.append(row)
        elif h in self.waiting:
            self.report.deduplicated += 1
            self.waiting[h].append(row)
        else:
            self.waiting[h] = [row]
            self._durable(self.writer.add(h, payload))

    def _durable(self, locations: list[BlobLocation]) -> None:
        self.arrays.extend(self.writer.take_arrays())
        for loc in locations:
            self.known.add(loc.content_hash)
            self.blob_rows.append(loc)
            self.report.bytes_stored += loc.stored_bytes
            self.rows.extend(self.waiting.pop(loc.content_hash, ()))

    def _row(self, item: Loaded) -> dict:
        if item.row is not None:  # built by the worker (LoadTask.row)
            return item.row
        return tensor_row(item, self.run_name, self.layout.stats_label, _ENTRY_COLUMNS)

    def _error(self, source_file: str, message: str) -> None:
        self.report.errors.append((source_file, message))
        self.error_rows.append({"run": self.run_name, "source_file": source_file, "error": message})
        self._tell("error", source_file, message)

    # -- commits -------------------------------------------------------------
    def _progress(self) -> None:
        """After each entry: every COMMIT_ROWS entries write the partial packs (rows wait
        for their pack) and commit, so a query sees the run grow (issue 12); the cut
        depends only on the dump order, so packs are the same for any worker count. In
        between, rows whose packs became durable are committed every COMMIT_SECONDS."""
        self.accepted += 1
        if self.accepted >= COMMIT_ROWS:
            self.accepted = 0
            self._durable(self.writer.flush())
            self._commit()
        elif self._should_commit():
            self._commit()

    def _should_commit(self) -> bool:
        if not (self.rows or self.error_rows or self.tables):
            return False
        return len(self.rows) >= COMMIT_ROWS or time.monotonic() - self.last_commit >= COMMIT_SECONDS

    def _commit(self) -> None:
        """Hand the rows ready (payloads durable) to the sink as one batch: on the committer
        thread after the previous one finished (at most one in flight, in order) when the sink
        writes in the background, so the catalog's open, insert, COMMIT and checkpoint overlap
        reading and compressing instead of stopping them; here otherwise. Its error, if any, is
        raised here or by :meth:`_settle`."""
        self._settle()
        if not (self.rows or self.error_rows or self.arrays or self.blob_rows or self.tables):
            return
        # Rows whose payload is still in a pack buffer stay behind (self.waiting).
        new = [r for r in self.rows if r["tensor_key"] not in self.replacing]
        replaced = [r for r in self.rows if r["tensor_key"] in self.replacing]
        self.last_commit = time.monotonic()
        batch = Batch(self.blob_rows, self.arrays, new, replaced, self.tables, self.error_rows)
        if self.sink.background:
            if self.committer is None:
                self.committer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dumpdb-commit")
            # Submitted first, cleared after: a Ctrl-C before the submit leaves the batch here
            # for the recovery commit; one after it leaves rows that _drop_committed filters.
            self.in_commit = self.committer.submit(self._write, batch)
        else:
            self._write(batch)
        self.rows, self.blob_rows, self.error_rows, self.arrays, self.tables = [], [], [], [], []
        for r in replaced:
            self.replacing.pop(r["tensor_key"], None)

    def _write(self, batch: Batch) -> None:
        """One batch into the sink (the committer thread, or here); the report counts it."""
        self.sink.write(batch)
        self.report.tensors_added += len(batch.new) + sum(t.num_rows for t in batch.tables)
        self.report.tensors_replaced += len(batch.replaced)

    def _tell(self, what: str, *args: Any) -> None:
        """Call the reporter's ``what(*args)`` - never while a commit is in flight: a reporter
        (or anything it calls) may read the catalog, which this process cannot open while its
        committer thread holds it read-write. Meanwhile calls wait, in order; they are made
        once the commit is done."""
        future = self.in_commit
        if future is not None and not future.done():
            self.told.append((what, *args))  # one by one: a reporter may count its calls
            return
        self._told()
        getattr(self.reporter, what)(*args)

    def _told(self) -> None:
        """Make the reporter calls that waited for a commit (:meth:`_tell`)."""
        while self.told:
            what, *args = self.told.popleft()
            getattr(self.reporter, what)(*args)

    def _settle(self, raise_error: bool = True) -> None:
        """Wait for the commit in flight (if any); raise its error unless not ``raise_error``
        (cleanup after another error: the locks must not go while it still writes)."""
        future = self.in_commit
        if future is None:
            return
        try:
            future.result()  # a Ctrl-C here leaves it in flight: the next _settle waits again
        except Exception:
            self.in_commit = None
            if raise_error:
                raise
        self.in_commit = None
        self._told()

    def _finish(self, interrupted: bool) -> None:
        self._settle()
        self.report.status = self.sink.finish(interrupted)


@dataclass
class Batch:
    """The rows of one commit: payloads made durable since the last one (``blob_rows``,
    ``arrays``), ``tensors`` rows new to the run and those replacing a changed file's
    (``replaced``, ``update``), statistics-only rows streamed from csv files (``tables``,
    Arrow, ``TENSOR_SCHEMA``), and ``ingest_errors`` rows."""

    blob_rows: list[BlobLocation]
    arrays: list
    new: list[dict]
    replaced: list[dict]
    tables: list[pa.Table]
    error_rows: list[dict]


@dataclass
class Start:
    """What :meth:`IngestSink.begin` found: the entries to read, the content hashes the store
    holds (dedup), the tensor keys a streamed csv skips, statistics of stored payloads, and the
    keys whose payload this ingest replaces (key -> old content hash)."""

    pending: list[TensorEntry]
    known: set[str] = field(default_factory=set)
    done: set[str] = field(default_factory=set)
    stored_stats: StoredStats | None = None
    replacing: dict[str, str] = field(default_factory=dict)


class IngestSink(Protocol):
    """Where a :class:`Pipeline` puts a run's rows: the archive's catalog (:class:`CatalogSink`,
    ``dumpdb ingest``) or one part's Parquet fragments (``parts.PartSink``, ``ingest-worker``).

    ``background``: :meth:`write` may run on the committer thread while reading goes on.
    :meth:`begin` (``hash_of``: tensor_key -> (content hash, error) of entries, read by the
    pipeline) decides what to read; :meth:`write` takes each :class:`Batch` in order;
    :meth:`committed_keys` says which candidate tensor keys the run holds (batches written so
    far); :meth:`drop_committed` filters rows a commit interrupted by Ctrl-C already wrote;
    :meth:`finish` closes the run and returns its status."""

    background: bool

    def begin(self, hash_of: Callable[[list[TensorEntry]], dict[str, tuple[str | None, str | None]]]) -> Start: ...

    def write(self, batch: Batch) -> None: ...

    def committed_keys(self, candidates: list[str]) -> set[str]: ...

    def drop_committed(self, rows: list[dict], error_rows: list[dict]) -> tuple[list[dict], list[dict]]: ...

    def finish(self, interrupted: bool) -> str: ...


class CatalogSink:
    """An ingest's rows into the archive's DuckDB catalog, and the lifecycle of its ``runs``
    row: created (or, resumed, set ``ingesting`` and its relations replaced) by :meth:`begin`,
    settled ``complete`` / ``complete_with_errors`` / ``interrupted`` by :meth:`finish`. Each
    :meth:`write` is one transaction on the committer thread; ``heartbeat`` (the run lock file)
    is touched after each (:mod:`dumpdb.catalog.runstate`)."""

    background = True

    def __init__(self, catalog: Catalog, scan: DumpScan, layout: Layout, report: IngestReport,
                 reporter: Reporter, options: IngestOptions, heartbeat: Path | None = None):
        self.catalog = catalog
        self.scan = scan
        self.layout = layout
        self.report = report
        self.reporter = reporter
        self.options = options
        self.run_name = report.run
        self.heartbeat = heartbeat
        self.settled = False  # the run exists, complete (or with errors), at this path (set by _identity)
        self.held_keys: set[str] = set()  # tensor keys the run held when the ingest began

    def _identity(self, hash_of: Callable[[list[TensorEntry]], dict]) -> identity.IdentityPlan:
        """Check the files the run already holds (:mod:`dumpdb.ingestion.identity`) before
        anything is written; raise :class:`SourceChanged` for changed (or, moved, missing
        or different) files unless ``update`` takes the changes."""
        report = self.report
        with self.catalog.reader() as con:
            existing = con.execute("SELECT source_path, status FROM runs WHERE run = ?",
                                   [self.run_name]).fetchone()
            if existing is None:
                if self.options.moved:
                    require_run(con, self.run_name, report.archive, "--moved: ",
                                " to continue; drop --moved to ingest a new run")
                return identity.IdentityPlan()
            if existing[0] != report.source_path and not self.options.moved:
                raise ArchiveError(
                    f"run {self.run_name!r} already holds the dump at {existing[0]}; choose another --run for "
                    f"{report.source_path}, or pass --moved if that dump moved here")
            held = [identity.Held(*r) for r in con.execute(
                "SELECT tensor_key, source_file, source_size, source_mtime_ns, content_hash FROM tensors "
                "WHERE run = ?", [self.run_name]).fetchall()]
        self.settled = existing[1] not in ("ingesting", "interrupted") and existing[0] == report.source_path
        self.held_keys = {h.tensor_key for h in held}
        # --moved --verify-hash at the run's own path still checks every file it holds
        moved = self.options.moved and (existing[0] != report.source_path or self.options.verify_hash)
        found = identity.plan(held, self.scan.entries, moved=moved,
                              verify_hash=self.options.verify_hash, hash_of=hash_of)
        for source_file in found.missing:
            self.reporter.changed(source_file, f"missing at {report.source_path}")
        for source_file, detail in found.changed:
            self.reporter.changed(source_file, detail)
        report.files_changed = list(found.changed)
        if found.missing:
            raise SourceChanged(
                f"{report.source_path}: not the dump run {self.run_name!r} was ingested from "
                f"({existing[0]}): {_count(len(found.missing), 'file')} it holds missing"
                + (f", {len(found.changed)} different" if found.changed else "") + "; nothing changed",
                [(f, "missing") for f in found.missing] + found.changed)
        if found.changed and not self.options.update:
            how = "different at the new location" if existing[0] != report.source_path else "changed since run " \
                f"{self.run_name!r} ingested {'it' if len(found.changed) == 1 else 'them'}"
            raise SourceChanged(
                f"{report.source_path}: {_count(len(found.changed), 'file')} {how} (listed above); nothing "
                "replaced: pass --update to store the new content (the old payloads stay until 'dumpdb gc')",
                found.changed)
        return found

    def begin(self, hash_of: Callable[[list[TensorEntry]], dict[str, tuple[str | None, str | None]]]) -> Start:
        """Check the files the run holds (:meth:`_identity`), then in one transaction: the runs
        row made (or set ``ingesting`` again, its relations and errors replaced), the scan's
        relations inserted, the keys the run holds and the stored hashes read. Nothing to write
        (a complete run, every file unchanged): no transaction at all."""
        scan, report = self.scan, self.report
        found = self._identity(hash_of)
        start = Start([])
        if self.options.update:
            start.replacing = dict(found.replace)
        if found.fill:  # statistics-only rows whose payload is readable now (e.g. .pt once torch is installed)
            start.replacing.update(found.fill)
            report.payloads_filled = len(found.fill)
        # streamed statistics csv rows are not entries: only the normal path (self.done) skips the
        # committed ones; this early exit streamed them all again (issue 30: a re-ingest doubled them)
        if (self.settled and not found.touched and not start.replacing and not scan.errors
                and not scan.statistics_files and all(e.key in self.held_keys for e in scan.entries)):
            report.tensors_skipped = len(scan.entries)
            return start  # a complete run, every file unchanged: nothing to write (the catalog is not locked)
        with self.catalog.writer() as con:
            existing = next(iter(con.execute("SELECT source_path, status FROM runs WHERE run = ?",
                                             [self.run_name]).fetchall()), None)
            if existing and existing[0] != report.source_path:  # moved (checked by _identity)
                con.execute("UPDATE runs SET source_path = ? WHERE run = ?", [report.source_path, self.run_name])
            if found.touched:  # same content, new size/mtime: record them, so they are not read again
                con.register("_touched", pa.Table.from_pylist(found.touched, pa.schema(
                    [("tensor_key", pa.string()), ("source_size", pa.int64()), ("source_mtime_ns", pa.int64())])))
                try:
                    con.execute("UPDATE tensors SET source_size = t.source_size, source_mtime_ns = t.source_mtime_ns "
                                "FROM _touched t WHERE tensors.run = ? AND tensors.tensor_key = t.tensor_key",
                                [self.run_name])
                finally:
                    con.unregister("_touched")
            done = {k for (k,) in con.execute(
                "SELECT tensor_key FROM tensors WHERE run = ?", [self.run_name]).fetchall()}
            pending = [e for e in scan.entries if e.key not in done or e.key in start.replacing]
            report.tensors_skipped = len(scan.entries) - len(pending)
            if scan.statistics_files:
                start.done = done  # streamed files: skip what an earlier ingest committed
            if existing and not pending and not scan.errors and not scan.statistics_files:
                if existing[1] in ("ingesting", "interrupted"):
                    # everything was committed before the stop: settle the status
                    failed = con.execute("SELECT count(*) FROM ingest_errors WHERE run = ?",
                                         [self.run_name]).fetchall()[0][0]
                    con.execute("UPDATE runs SET status = ?, ingest_finished = ? WHERE run = ?",
                                ["complete_with_errors" if failed else "complete", datetime.now(), self.run_name])
                return start  # nothing to do
            start.known = {h for (h,) in con.execute("SELECT content_hash FROM blobs").fetchall()}
            start.stored_stats = StoredStats.load(con)  # stored payloads: statistics not computed again
            now = datetime.now()
            if existing:
                con.execute("UPDATE runs SET status = 'ingesting', ingest_finished = NULL, dumpdb_version = ? "
                            "WHERE run = ?", [__version__, self.run_name])
                for table in (*RELATION_SCHEMAS, "ingest_errors"):
                    con.execute(f"DELETE FROM {table} WHERE run = ?", [self.run_name])
            else:
                con.execute(
                    "INSERT INTO runs (run, source_path, layout, framework, framework_version, device_target, "
                    "dump_config, metadata, status, ingest_started, dumpdb_version) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'ingesting', ?, ?)",
                    [self.run_name, report.source_path, self.layout.name, scan.framework,
                     scan.framework_version, scan.device_target, json_or_none(scan.dump_config),
                     json.dumps(scan.metadata, default=str) if scan.metadata else None, now, __version__])
            for table, arrow in RELATION_SCHEMAS.items():
                rows = [{"run": self.run_name, **r} for r in getattr(scan, table)]
                insert_arrow(con, table, rows_table(rows, arrow))
        start.pending = pending
        return start

    def write(self, batch: Batch) -> None:
        """Committer thread: one transaction of blobs/arrays, tensors and ingest_errors rows."""
        with self.catalog.writer() as con:
            record_payloads(con, batch.blob_rows, batch.arrays, self.run_name)
            insert_arrow(con, "tensors", rows_table(batch.new, TENSOR_SCHEMA),
                         prefix="nextval('tensor_id_seq') AS tensor_id,")
            if batch.replaced:
                _replace_rows(con, self.run_name, rows_table(batch.replaced, TENSOR_SCHEMA))
            for table in batch.tables:
                insert_arrow(con, "tensors", table, prefix="nextval('tensor_id_seq') AS tensor_id,")
            insert_arrow(con, "ingest_errors", rows_table(batch.error_rows, ERROR_SCHEMA))
        if self.heartbeat is not None:
            touch(self.heartbeat)  # the last sign of life (dumpdb.catalog.runstate)

    def committed_keys(self, candidates: list[str]) -> set[str]:
        with self.catalog.reader() as con:
            return {k for (k,) in con.execute(
                "SELECT tensor_key FROM tensors WHERE run = ? AND tensor_key IN (SELECT unnest(?))",
                [self.run_name, candidates]).fetchall()}

    def drop_committed(self, rows: list[dict], error_rows: list[dict]) -> tuple[list[dict], list[dict]]:
        with self.catalog.reader() as con:
            keys = {k for (k,) in con.execute("SELECT tensor_key FROM tensors WHERE run = ?",
                                               [self.run_name]).fetchall()}
            failed = {f for (f,) in con.execute("SELECT source_file FROM ingest_errors WHERE run = ?",
                                                 [self.run_name]).fetchall()}
        return ([r for r in rows if r["tensor_key"] not in keys],
                [r for r in error_rows if r["source_file"] not in failed])

    def finish(self, interrupted: bool) -> str:
        """Settle the runs row's status (a run another process settled keeps its own); returns it."""
        status = "interrupted" if interrupted else ("complete_with_errors" if self.report.errors else "complete")
        with self.catalog.writer() as con:
            row = con.execute("SELECT status FROM runs WHERE run = ?", [self.run_name]).fetchone()
            if row and (row[0] in ("ingesting", "interrupted") or interrupted):
                con.execute("UPDATE runs SET status = ?, ingest_finished = ? WHERE run = ?",
                            [status, datetime.now(), self.run_name])
            elif row:
                status = row[0]
        return status


def _replace_rows(con, run: str, rows: pa.Table) -> None:
    """Give existing rows of ``run`` (matched by tensor_key) the content of ``rows``: new
    payload, statistics and file identity; ``previous_hash`` keeps the replaced content
    hash, ``updated_at`` says when; a pruned row is live again. ``tensor_id`` stays."""
    sets = ", ".join(f'"{c}" = u."{c}"' for c in _REPLACED_COLUMNS)
    con.register("_updated", rows)
    try:
        con.execute(f"UPDATE tensors SET previous_hash = tensors.content_hash, updated_at = ?, pruned_at = NULL, "
                    f"{sets} FROM _updated u WHERE tensors.run = ? AND tensors.tensor_key = u.tensor_key",
                    [datetime.now(), run])
    finally:
        con.unregister("_updated")


# what a failed write leaves and how to get the space back now (issue 30, item 15): gc keeps
# files younger than --grace (default 3600 s) so as not to delete a live writer's
RECLAIM_HINT = ("the shards this attempt wrote that no tensor refers to are reclaimed by 'dumpdb gc --grace 0' "
                "(now, with no other ingest or import running) or by 'dumpdb gc' after an hour")


def rows_table(rows: list[dict[str, Any]], arrow: pa.Schema) -> pa.Table:
    """``rows`` (dicts; a missing key is NULL) as a table of schema ``arrow``, built column
    by column: ``pa.Table.from_pylist`` costs ~35 us a row of ``tensors``' 47 columns,
    this ~3 us (a tiny-file ingest commits one row per file). A text holding a lone
    surrogate (a dump's JSON may: ``"\\ud800"`` is valid JSON) is written through
    :func:`~dumpdb.layouts.base.display_name` (escaped, injective), never an error."""
    columns = {name: [r.get(name) for r in rows] for name in arrow.names}
    try:
        return pa.Table.from_pydict(columns, arrow)
    except UnicodeEncodeError:
        return pa.Table.from_pydict({name: [_storable(v) for v in values] for name, values in columns.items()},
                                    arrow)


def _storable(value: Any) -> Any:
    """``value`` with every text in it valid UTF-8 (lone surrogates escaped by ``display_name``)."""
    if isinstance(value, str):
        return value if encodable(value) else display_name(value)
    if isinstance(value, list):
        return [_storable(v) for v in value]
    if isinstance(value, dict):
        return {_storable(k): _storable(v) for k, v in value.items()}
    return value


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


# tensors columns a TensorEntry carries under the same name (the rest are computed in _row).
_ENTRY_COLUMNS = tuple(c for c in TENSOR_SCHEMA.names if c in {f.name for f in dataclass_fields(TensorEntry)})




class Executors:
    """Where an ingest's worker function runs (see :func:`ingest`)."""

    def __init__(self, root: str, follow_symlinks: bool, workers: int | None, scheduler: str | None,
                 on_wait: Callable[[str], None] | None):
        self.root = root
        self.follow_symlinks = follow_symlinks
        self.workers = workers
        self.scheduler = scheduler
        self.on_wait = on_wait
        self.count = workers or default_workers()

    @contextlib.contextmanager
    def open(self, pending: list[TensorEntry]) -> Iterator[Executor | None]:
        """The executor for ``pending`` entries, or None to read on threads here."""
        files = [e for e in pending if e.path is not None]
        if self.scheduler and files:
            with dask_executor(self.scheduler, self.count, self.on_wait) as pool:
                yield pool
            return
        small = len(files) < PROCESS_MIN_FILES and sum(e.size or 0 for e in files) < PROCESS_MIN_BYTES
        # By default processes only where cores are left beside the ingesting process, which
        # alone compresses and commits: on 2 cores 2 worker processes ingested at 0.71x the
        # throughput of threads here (scripts/bench_scale.py) and 1.6x the time on a 0.5 GB dump.
        few_cores = self.count < PROCESS_MIN_CORES
        if self.count <= 1 or not files or (self.workers is None and (small or few_cores)):
            yield None
            return
        with process_pool(min(self.count, len(files))) as pool:
            yield pool


def _file_size(path: str | None) -> int:
    if path is None:
        return 0
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def json_or_none(text: str | None) -> str | None:
    if text is None:
        return None
    try:
        json.loads(text)
        return text
    except json.JSONDecodeError:
        return json.dumps(text)
