"""Many nodes, one archive: ``ingest-worker`` writes parts, ``commit`` adds them (issue 12).

Protocol (also in ARCHITECTURE.md):

1. A node that sees only its own ranks runs :func:`ingest_worker` (``dumpdb ingest-worker
   DUMP --archive A --part NAME --run R``). It reads the catalog once, read-only: the run's
   tensor keys already committed and a snapshot of the content hashes the store holds
   (cross-worker dedup starts from it). It never writes the DuckDB file.
2. It stores payloads in the archive's store exactly as an ingest does (packs written
   whole, temp + fsync + rename) and writes its catalog rows as Parquet fragments
   ``A/parts/<run key>/<part>/<table>-NNNNN.parquet`` (``tensors``, ``blobs``, ``arrays``,
   ``ingest_errors`` every commit interval; the run's relations at the end), each made
   durable before it is named.
3. Last, ``manifest.json``: every fragment with its table, rows and sha256, and the
   ``runs`` row. A part without a manifest is unfinished: the same command again starts
   it over (its packs are unreferenced, ``gc`` reclaims them).
4. :func:`commit_parts` (``dumpdb commit --archive A``; the only writer of the DuckDB file)
   validates each manifest (fragments present, sizes, sha256, row counts, columns the
   catalog has) and commits each part in one DuckDB transaction, idempotently: tensors
   whose key the run has, blobs whose hash is known, arrays known, relation and error
   rows already there are skipped. A payload two workers stored at once thus keeps the
   first ``blobs`` row committed; the other copy is in a pack no blob refers to, which
   ``gc`` compacts or deletes. Then the part directory is removed (a crash before that:
   the next commit finds nothing new in it and removes it).
5. Workers hold the store lock shared, like an ingest, so ``gc`` (exclusive) never runs
   while a worker may reference payloads it has not committed. On a file system whose
   ``flock`` does not reach other nodes, run ``gc`` only when no worker runs: its grace
   period (young files are kept) is the remaining safety net.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from dumpdb import __version__
from dumpdb.archival.bundle_check import sha256
from dumpdb.archive_dir import CATALOG
from dumpdb.catalog import DEFAULT_LOCK_TIMEOUT, Catalog, insert_arrow, schema
from dumpdb.catalog.locks import SHARED, store_lock
from dumpdb.catalog.payload_rows import array_table, blob_table
from dumpdb.errors import ArchiveError, DumpdbError
from dumpdb.ingestion import pipeline as pl
from dumpdb.layouts import DumpScan, Layout, TensorEntry, locate
from dumpdb.progress import Reporter
from dumpdb.storage.local import durable_put

PARTS = "parts"
MANIFEST = "manifest.json"
FORMAT = "dumpdb-part/1"
_PART_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_FRAGMENT_RE = re.compile(r"^[a-z_]+-[0-9]{5}\.parquet$")
_TABLES = ("tensors", "blobs", "arrays", "ingest_errors", *pl.RELATION_TABLES)


def run_key(run: str) -> str:
    """The directory name of ``run`` under ``parts/`` (any run name is safe as a path)."""
    return hashlib.sha1(run.encode()).hexdigest()[:16]


def part_dir(archive: Path, run: str, part: str) -> Path:
    """Where ingest-worker writes part ``part`` of ``run``."""
    return Path(archive) / PARTS / run_key(run) / part


class PartSink:
    """An ingest's rows as Parquet fragments of one part (``ingest-worker``; protocol: the
    module docstring), for :class:`~dumpdb.ingestion.pipeline.Pipeline`. Written here, in
    order (no committer thread): each fragment fsynced and renamed into place; the manifest
    last, by :meth:`finish`. It never writes the catalog."""

    background = False

    def __init__(self, catalog: Catalog, scan: DumpScan, layout: Layout, report: pl.IngestReport,
                 directory: Path, part: str):
        self.catalog = catalog
        self.scan = scan
        self.layout = layout
        self.report = report
        self.run_name = report.run
        self.directory = directory
        self.part = part
        self.fragments: list[dict[str, Any]] = []
        self.seq = 0
        self.done: set[str] = set()  # tensor keys the run had committed when this part began

    def begin(self, hash_of: Callable[[list[TensorEntry]], dict[str, tuple[str | None, str | None]]]) -> pl.Start:
        """The catalog read once, read-only: the run's committed keys (skipped) and the stored
        content hashes this worker's dedup starts from. ``hash_of`` is not needed: a part
        never replaces a committed row (``--update``/``--moved`` are refused)."""
        with self.catalog.reader() as con:  # read-only: the snapshot this worker starts from
            self.done = {k for (k,) in con.execute(
                "SELECT tensor_key FROM tensors WHERE run = ?", [self.run_name]).fetchall()}
            known = {h for (h,) in con.execute("SELECT content_hash FROM blobs").fetchall()}
        pending = [e for e in self.scan.entries if e.key not in self.done]
        self.report.tensors_skipped = len(self.scan.entries) - len(pending)
        return pl.Start(pending, known=known, done=self.done)

    def _fragment(self, table: str, rows: pa.Table) -> None:
        if rows.num_rows == 0:
            return
        self.seq += 1
        path = self.directory / f"{table}-{self.seq:05d}.parquet"
        sink = pa.BufferOutputStream()
        pq.write_table(rows, sink)
        data = sink.getvalue().to_pybytes()
        durable_put(path, [data], path.parent)  # fsynced, renamed into place
        self.fragments.append({"file": path.name, "table": table, "rows": rows.num_rows, "bytes": len(data),
                               "sha256": hashlib.sha256(data).hexdigest()})

    def write(self, batch: pl.Batch) -> None:
        self._fragment("arrays", array_table(batch.arrays))
        self._fragment("blobs", blob_table(batch.blob_rows, self.run_name))
        for t in [pl.rows_table(batch.new + batch.replaced, pl.TENSOR_SCHEMA), *batch.tables]:
            self._fragment("tensors", t)
        self._fragment("ingest_errors", pl.rows_table(batch.error_rows, pl.ERROR_SCHEMA))

    def committed_keys(self, candidates: list[str]) -> set[str]:
        wanted = set(candidates)
        found: set[str] = set()
        for f in self.fragments:
            if f["table"] == "tensors":
                keys = pq.read_table(self.directory / f["file"], columns=["tensor_key"])["tensor_key"]
                found.update(k for k in keys.to_pylist() if k in wanted)
        return found | (wanted & self.done)

    def drop_committed(self, rows: list[dict], error_rows: list[dict]) -> tuple[list[dict], list[dict]]:
        return rows, error_rows  # a fragment, once written, is final; its rows were cleared with it

    def finish(self, interrupted: bool) -> str:
        """The relations' fragments, then the manifest (status ``written``); ``interrupted``:
        no manifest (the part is unfinished: the same command starts it over)."""
        if interrupted:
            return "interrupted"
        report, scan = self.report, self.scan
        for table, arrow in pl.RELATION_SCHEMAS.items():
            rows = [{"run": self.run_name, **r} for r in getattr(scan, table)]
            self._fragment(table, pl.rows_table(rows, arrow))
        manifest = {
            "format": FORMAT, "run": self.run_name, "part": self.part, "dumpdb_version": __version__,
            "written": datetime.now().isoformat(timespec="seconds"),
            "runs_row": {"run": self.run_name, "source_path": report.source_path, "layout": self.layout.name,
                         "framework": scan.framework, "framework_version": scan.framework_version,
                         "device_target": scan.device_target, "dump_config": pl.json_or_none(scan.dump_config),
                         "metadata": json.dumps(scan.metadata, default=str) if scan.metadata else None},
            "tensors": report.tensors_added, "errors": len(report.errors), "fragments": self.fragments,
        }
        durable_put(self.directory / MANIFEST, [json.dumps(manifest, indent=1).encode()], self.directory)
        return "written"


def ingest_worker(
    dump_dir: str | os.PathLike,
    archive: str | os.PathLike,
    part: str,
    run: str | None = None,
    *,
    layout: str | None = None,
    workers: int | None = None,
    scheduler: str | None = None,
    reporter: Reporter | None = None,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    on_wait: Callable[[str], None] | None = None,
    follow_symlinks: bool = False,
    storage_options: dict | None = None,
    update: bool = False,
    moved: bool = False,
) -> pl.IngestReport:
    """Ingest the dump at ``dump_dir`` (a node's own ranks) as part ``part`` of run ``run``
    into ``archive`` without writing its catalog (see the module docstring's protocol).

    ``archive`` is created if missing (once the dump is found and scanned, as by ingest);
    ``part``: letters, digits, ``._-`` (e.g. ``node3``); ``run`` defaults to the dump
    directory's name. The other options are :func:`dumpdb.ingestion.pipeline.ingest`'s
    (``storage_options``: for an archive whose store is on object storage, overlaying what it
    remembers) except ``update`` and ``moved``, which are refused: a part only adds rows, and
    ``commit`` never replaces a committed one (``dumpdb ingest --update``/``--moved`` does).
    Returns an :class:`~dumpdb.ingestion.pipeline.IngestReport` with status ``written`` (or
    ``already written``). Raises :class:`~dumpdb.errors.ArchiveError` for a bad part name,
    :class:`~dumpdb.errors.DumpdbError` for ``update``/``moved``,
    :class:`~dumpdb.errors.LayoutError` for no dump.
    """
    for flag, given in (("--update", update), ("--moved", moved)):
        if given:
            raise DumpdbError(f"ingest-worker {flag}: a part only adds tensors and 'dumpdb commit' never replaces "
                              f"a committed row; run 'dumpdb ingest {flag}' for that run instead")
    if not _PART_RE.match(part):
        raise ArchiveError(f"--part {part!r}: use 1-100 letters, digits, '.', '_' or '-' (e.g. node3)")
    options = pl.IngestOptions(follow_symlinks=follow_symlinks, workers=workers, scheduler=scheduler,
                               lock_timeout=lock_timeout, on_wait=on_wait)
    archive = Path(archive)
    written: list[str] = []

    def already_written(run_name: str) -> None:
        if (part_dir(archive, run_name, part) / MANIFEST).is_file():  # waiting for `dumpdb commit`
            written.append(run_name)
            raise _AlreadyWritten

    try:
        # the README's sequence (ingest-worker on each node, then one commit) starts from no
        # archive: the first worker makes it, as ingest does (nodes racing to: each finds it made)
        start = pl.prepare(dump_dir, archive, run, layout, options, reporter, storage_options=storage_options,
                           before_scan=already_written)
    except _AlreadyWritten:
        found = locate(Path(dump_dir), layout)
        report = pl.IngestReport(run=written[0], archive=archive, layout=found.layout.name,
                                 source_path=str(found.path.resolve()))
        report.status = "already written"
        return report
    directory = part_dir(archive, start.run, part)
    catalog = Catalog(archive / CATALOG, lock_timeout=lock_timeout, on_wait=on_wait)

    def sink(report: pl.IngestReport) -> PartSink:
        if directory.exists():  # an unfinished attempt: its fragments go, its packs are left for gc
            shutil.rmtree(directory)
        directory.mkdir(parents=True)
        return PartSink(catalog, start.scan, start.layout, report, directory, part)

    return pl.run_pipeline(start, sink, f"ingest-worker of run {start.run!r} part {part!r}", storage_options)


class _AlreadyWritten(Exception):
    """The part has its manifest: nothing to do until 'dumpdb commit' (ingest_worker)."""


class StalePart(ArchiveError):
    """A part refers to payloads the store no longer holds: it must be written again."""


@dataclass
class CommitReport:
    """What :func:`commit_parts` did: parts committed (``(run, part, tensors added)``),
    parts refused (``(manifest path, reason)``) and unfinished part directories seen."""

    committed: list[tuple[str, str, int]] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)
    unfinished: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True if no manifest was refused."""
        return not self.refused


def _validate(directory: Path, columns: dict[str, set[str]]) -> dict:
    """The manifest of ``directory`` if every fragment is there, whole and of a known table;
    raises ArchiveError naming the file and what is wrong."""
    path = directory / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ArchiveError(f"{path}: unreadable manifest: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ArchiveError(f"{path}: not a {FORMAT} manifest")
    for key in ("run", "part", "runs_row", "fragments"):
        if key not in manifest:
            raise ArchiveError(f"{path}: manifest lacks {key!r}")
    if run_key(str(manifest["run"])) != directory.parent.name or manifest["part"] != directory.name:
        raise ArchiveError(f"{path}: names run {manifest['run']!r} part {manifest['part']!r}, not this directory")
    for f in manifest["fragments"]:
        name, table = str(f.get("file", "")), f.get("table")
        if not _FRAGMENT_RE.match(name) or table not in _TABLES:
            raise ArchiveError(f"{path}: fragment {name!r} of table {table!r} is not one dumpdb writes")
        frag = directory / name
        if not frag.is_file() or frag.stat().st_size != f.get("bytes"):
            raise ArchiveError(f"{frag}: missing or not {f.get('bytes')} bytes as the manifest says")
        if sha256(frag) != f.get("sha256"):
            raise ArchiveError(f"{frag}: sha256 differs from the manifest (damaged or replaced)")
        meta = pq.read_metadata(frag)
        if meta.num_rows != f.get("rows"):
            raise ArchiveError(f"{frag}: {meta.num_rows} rows, the manifest says {f.get('rows')}")
        extra = set(meta.schema.to_arrow_schema().names) - columns[table]
        if extra:
            raise ArchiveError(f"{frag}: columns {sorted(extra)} are not in the catalog's {table}")
    return manifest


def _commit_part(con, directory: Path, manifest: dict) -> int:
    run = manifest["run"]
    row = manifest["runs_row"]
    if con.execute("SELECT count(*) FROM runs WHERE run = ?", [run]).fetchall()[0][0] == 0:
        run_cols = ["run", "source_path", "layout", "framework", "framework_version", "device_target",
                "dump_config", "metadata"]
        con.execute(f"INSERT INTO runs ({', '.join(run_cols)}, status, ingest_started, dumpdb_version) "
                    f"VALUES ({', '.join('?' * len(run_cols))}, 'ingesting', ?, ?)",
                    [row.get(c) for c in run_cols] + [datetime.now(), __version__])
    elif row.get("metadata"):  # each node read its own ranks' metadata files: the run has them all
        (old,) = con.execute("SELECT metadata FROM runs WHERE run = ?", [run]).fetchall()[0]
        merged = {**(json.loads(old) if old else {}), **json.loads(row["metadata"])}
        con.execute("UPDATE runs SET metadata = ? WHERE run = ?", [json.dumps(merged, default=str), run])
    before = con.execute("SELECT count(*) FROM tensors WHERE run = ?", [run]).fetchall()[0][0]
    order = {t: i for i, t in enumerate(("arrays", "blobs", "tensors", "ingest_errors"))}
    for f in sorted(manifest["fragments"], key=lambda f: (order.get(f["table"], 9), f["file"])):
        table, rows = f["table"], pq.read_table(directory / f["file"])
        if table in ("arrays", "blobs"):  # a payload stored twice: the first row committed stays
            insert_arrow(con, table, rows, ignore_conflicts=True)
            continue
        name = "_dumpdb_part"
        con.register(name, rows)
        try:
            cols = ", ".join(f'"{c}"' for c in rows.column_names)
            if table == "tensors":
                con.execute(f"INSERT INTO tensors BY NAME SELECT nextval('tensor_id_seq') AS tensor_id, * "
                            f"FROM {name} WHERE tensor_key NOT IN (SELECT tensor_key FROM tensors WHERE run = ?)",
                            [run])
            else:  # relations and errors: rows already there (a commit that died after COMMIT) are skipped
                con.execute(f"INSERT INTO {table} ({cols}) SELECT {cols} FROM {name} "
                            f"EXCEPT ALL SELECT {cols} FROM {table} WHERE run = ?", [run])
        finally:
            con.unregister(name)
    # A payload the worker deduplicated against (its snapshot) must still be stored: gc may
    # have removed a dead run's payloads between the worker's end and this commit.
    missing = con.execute("SELECT count(DISTINCT t.content_hash) FROM tensors t LEFT JOIN blobs b "
                          "USING (content_hash) WHERE t.run = ? AND t.content_hash IS NOT NULL "
                          "AND b.content_hash IS NULL", [run]).fetchall()[0][0]
    if missing:
        raise StalePart(f"{directory / MANIFEST}: {missing} payload(s) the part deduplicated against were "
                        "removed (gc) before this commit; run its ingest-worker again")
    after = con.execute("SELECT count(*) FROM tensors WHERE run = ?", [run]).fetchall()[0][0]
    failed = con.execute("SELECT count(*) FROM ingest_errors WHERE run = ?", [run]).fetchall()[0][0]
    con.execute("UPDATE runs SET status = ?, ingest_finished = ? WHERE run = ?",
                ["complete_with_errors" if failed else "complete", datetime.now(), run])
    return after - before


def commit_parts(archive: str | os.PathLike, run: str | None = None, *,
                 lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
                 on_wait: Callable[[str], None] | None = None) -> CommitReport:
    """Commit every finished part under ``archive/parts`` (only run ``run``'s if given), one
    DuckDB transaction per part, then remove its directory (protocol: module docstring).

    Creates an empty archive at ``archive`` if there is none (so workers can start). A part
    whose manifest does not validate is refused (named in ``CommitReport.refused``) and
    left in place; the others are committed. Raises
    :class:`~dumpdb.errors.ArchiveError` if the archive cannot be written.
    """
    archive = Path(archive)
    pl.open_for_write(archive, None, None)  # a new archive: local store (ingest --store makes an S3 one)
    catalog = Catalog(archive / CATALOG, lock_timeout=lock_timeout, on_wait=on_wait)
    catalog.check(writable=True)
    report = CommitReport()
    root = archive / PARTS
    columns = {t: set(schema.arrow_schema(t).names) for t in _TABLES}
    runs = [root / run_key(run)] if run is not None else sorted(p for p in root.glob("*") if p.is_dir())
    with store_lock(archive, SHARED, "commit of ingest parts", timeout=lock_timeout, on_wait=on_wait):
        for run_dir in runs:
            for directory in sorted(p for p in run_dir.glob("*") if p.is_dir()):
                if not (directory / MANIFEST).is_file():
                    report.unfinished.append(str(directory))
                    continue
                try:
                    manifest = _validate(directory, columns)
                except ArchiveError as exc:
                    report.refused.append((str(directory / MANIFEST), str(exc)))
                    continue
                try:
                    with catalog.writer() as con:  # rolled back if the part is stale
                        added = _commit_part(con, directory, manifest)
                except StalePart as exc:
                    # the same ingest-worker command writes the part again (no manifest: unfinished)
                    (directory / MANIFEST).unlink()
                    report.refused.append((str(directory / MANIFEST), str(exc)))
                    continue
                report.committed.append((manifest["run"], manifest["part"], added))
                shutil.rmtree(directory)  # committed: a crash before this, and the next commit adds nothing
            if run_dir.is_dir() and not any(run_dir.iterdir()):
                run_dir.rmdir()
    return report
