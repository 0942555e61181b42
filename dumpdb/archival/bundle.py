"""Export and import of runs as self-describing bundles.

A bundle is a directory (or the same tree in a ``.zip``, stored uncompressed)::

    manifest.json        format, dumpdb and schema versions, runs, tables, and the
                         byte size and sha256 of every other file
    catalog/<table>.parquet
                         the runs' rows of runs, tensors, ops, execution_order,
                         graph_executions, overflows, call_stacks, module_tree,
                         ingest_errors, plus blobs/arrays locating the payloads
    tensors.zarr/        Zarr v3 store with exactly the runs' live payloads, packed
                         and deduplicated like an archive's

Readable without dumpdb: the Parquet files with pyarrow or DuckDB, the payloads
with zarr (README "Reading a bundle without dumpdb"). :func:`import_bundle` checks
the whole bundle before it changes the archive (what it refuses:
:mod:`dumpdb.archival.bundle_check`), re-hashes every payload it will store, stores
only the payloads the archive lacks, and is idempotent (a run already imported is
skipped). :func:`export_runs` re-hashes every payload it writes and writes no bundle
if one is missing or altered.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import shutil
import signal
import tempfile
import threading
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import xxhash

from dumpdb import __version__
from dumpdb.archival import bundle_check as chk
from dumpdb.archival import bundle_readme
from dumpdb.catalog import insert_arrow, latest_version, schema
from dumpdb.catalog.locks import SHARED, archive_lock, pid_alive
from dumpdb.errors import BundleError, DumpdbError, PayloadCorrupt, PayloadMissing, require_run
from dumpdb.stats import STAT_COLUMNS

FORMAT = "dumpdb-bundle"
FORMAT_VERSION = 1
RUN_TABLES = tuple(schema.run_tables())  # per-run tables (dumpdb.catalog.schema), runs last


@dataclass
class ImportReport:
    """What :func:`import_bundle` did: runs imported/skipped, tensors, payloads stored/already present."""
    runs_imported: list[str] = field(default_factory=list)
    runs_skipped: list[str] = field(default_factory=list)
    tensors: int = 0
    payloads_added: int = 0
    payloads_present: int = 0


def export_runs(archive, runs: list[str], to: str | os.PathLike) -> Path:
    """Write ``runs`` of ``archive`` as a bundle at ``to`` (a ``.zip`` file if the name
    ends so, else a new directory). Returns the path. Raises DumpdbError for an unknown
    run or an existing destination, PayloadMissing / PayloadCorrupt (naming the shard
    and a tensor) for a payload whose shard is gone or whose bytes no longer hash to
    its content hash; nothing is written at ``to`` then."""
    from dumpdb.catalog.payload_rows import array_table, blob_table
    from dumpdb.storage.payloads import copy_payloads
    from dumpdb.storage.store import StoreWriter, TensorStore

    to = Path(to)
    if to.exists():
        raise DumpdbError(f"{to}: already exists; export writes a new bundle")
    if not runs:
        raise DumpdbError("export: name at least one run")
    as_zip = to.suffix.lower() == ".zip"
    parent = to.parent if to.parent.exists() else None
    _remove_dead_exports(parent)
    writer = work = None
    try:
        with _sigint_held():  # the directory and the name that removes it come together
            work = Path(tempfile.mkdtemp(prefix=f"{EXPORT_PREFIX}{os.getpid()}-", dir=parent))
        bundle = work / "bundle"
        (bundle / "catalog").mkdir(parents=True)
        with _sigint_held():  # zarr writes from its own thread: an interrupted call would go on writing
            TensorStore.create(bundle / "tensors.zarr")
        with archive.reader() as con:
            for run in runs:
                require_run(con, run, archive.path)
            tables = {t: con.sql(f"SELECT * FROM {t} WHERE run IN (SELECT unnest(?))", params=[runs])
                      .to_arrow_table() for t in RUN_TABLES}
            live = con.execute(
                "SELECT b.content_hash, b.array_path, b.elem_offset, b.elem_count, b.nbytes FROM blobs b "
                "WHERE b.content_hash IN (SELECT content_hash FROM tensors WHERE run IN (SELECT unnest(?)) "
                "AND pruned_at IS NULL) ORDER BY b.array_path, b.elem_offset", [runs]).fetchall()
        writer = StoreWriter(TensorStore(bundle / "tensors.zarr", read_only=False))
        nbytes_of = {row[0]: row[4] for row in live}
        locations = copy_payloads(  # each payload read once, re-hashed before it is written
            archive.store, writer, [row[:4] for row in live],
            read=lambda ref: _checked_archive_payload(archive, runs, *ref, nbytes_of[ref[0]]))
        arrays = writer.take_arrays()
        writer.close()
        writer = None
        tables["blobs"] = blob_table(locations).drop_columns(["first_run"])
        tables["arrays"] = array_table(arrays)
        for name, table in tables.items():
            pq.write_table(table, bundle / "catalog" / f"{name}.parquet", compression="zstd")
        files = {}
        for path in sorted(p for p in bundle.rglob("*") if p.is_file()):
            rel = path.relative_to(bundle).as_posix()
            files[rel] = {"bytes": path.stat().st_size, "sha256": chk.sha256(path)}
        manifest = {
            "format": FORMAT, "format_version": FORMAT_VERSION, "dumpdb_version": __version__,
            "schema_version": archive.schema_version,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "runs": runs,
            "tables": {n: {"file": f"catalog/{n}.parquet", "rows": t.num_rows} for n, t in tables.items()},
            "files": files,
        }
        readme = bundle_readme.render(runs, tables, dumpdb_version=__version__,
                                      schema_version=archive.schema_version, created=manifest["created"])
        readme_path = bundle / "README.md"
        readme_path.write_text(readme, encoding="utf-8")
        files["README.md"] = {"bytes": readme_path.stat().st_size, "sha256": chk.sha256(readme_path)}
        (bundle / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        if as_zip:
            tmp_zip = work / "bundle.zip"
            with zipfile.ZipFile(tmp_zip, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as z:
                z.write(bundle / "manifest.json", "manifest.json")
                for rel in sorted(files, key=lambda r: (r != "README.md", r)):
                    z.write(bundle / rel, rel)
            os.replace(tmp_zip, to)
        else:
            os.rename(bundle, to)
    finally:
        # Nothing partial stays, whatever stopped the export (an error, Ctrl-C at any phase):
        # the writer's threads are stopped first (they would write into the directory being
        # removed), and a second Ctrl-C waits until the removal is done.
        with _sigint_held():
            if writer is not None:
                writer.close()
            if work is not None:
                shutil.rmtree(work, ignore_errors=True)
    return to


EXPORT_PREFIX = ".dumpdb-export-"


@contextmanager
def _sigint_held() -> Iterator[None]:
    """Hold a Ctrl-C back for the block: steps that must finish (making or removing the work
    directory, a zarr call whose coroutine runs on zarr's own thread) finish, then the
    SIGINT handler that was in place runs (raising KeyboardInterrupt, as usual). A handler
    swap, not a signal mask: the kernel may deliver SIGINT to any thread. Only the main
    thread can; elsewhere the block runs as is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: got.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if got:
            if callable(previous):
                previous(signal.SIGINT, None)
            elif previous == signal.SIG_DFL:
                raise KeyboardInterrupt


def _remove_dead_exports(parent: Path | None) -> None:
    """Remove the work directories of exports whose process is gone (killed with SIGKILL,
    power cut): ``.dumpdb-export-<pid>-*`` beside the target whose pid is not running."""
    for path in (parent or Path(tempfile.gettempdir())).glob(f"{EXPORT_PREFIX}*"):
        pid = path.name[len(EXPORT_PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid() or pid_alive(int(pid)):
            continue  # ours, or another running export's work
        shutil.rmtree(path, ignore_errors=True)


def _checked_archive_payload(archive, runs: list[str], content_hash: str, array_path: str | None,
                             offset: int | None, count: int | None, nbytes: int) -> np.ndarray:
    """One payload of the archive for export, read through the store (a missing object is
    PayloadMissing, never zeros) and re-hashed; returns its bytes (flat, storage dtype).
    Raises PayloadMissing / PayloadCorrupt naming the array and a tensor that uses it: no
    bundle is written then (export writes aside and renames only when done)."""
    from dumpdb.storage.store import payload_hash

    def who() -> str:
        with archive.reader() as con:
            row = con.execute("SELECT run, op_name, io, slot FROM tensors WHERE content_hash = ? AND run IN "
                              "(SELECT unnest(?)) ORDER BY tensor_id LIMIT 1", [content_hash, runs]).fetchone()
        return f"run {row[0]} op {row[1]} {row[2]} slot {row[3]}" if row else f"payload {content_hash}"

    if array_path is None:
        return np.zeros(0, np.uint8)
    where = f"{archive.store.name}/{array_path}"
    try:
        data = archive.store.read_payload(array_path, offset, count or 0, content_hash)
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    except PayloadMissing as exc:
        raise PayloadMissing(f"{where}: shard missing; {who()} cannot be exported (no bundle written) ({exc})") \
            from exc
    except (PayloadCorrupt, OSError, ValueError, RuntimeError) as exc:
        raise PayloadCorrupt(f"{where}: unreadable ({exc}); {who()} cannot be exported (no bundle written)") from exc
    if raw.size != nbytes or payload_hash(raw) != content_hash:
        raise PayloadCorrupt(f"{where}: bytes of {who()} differ from the catalog's hash; no bundle written "
                             "(dumpdb verify lists every damaged tensor)")
    return data


# What reading a bundle can raise besides BundleError: all of it means "unreadable bundle".
_UNREADABLE = (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError,
               OverflowError, MemoryError, zipfile.BadZipFile, pa.ArrowException, zlib.error)


def _open_checked(path: Path, work: Path, max_bundle_size: int, archive_path: Path) -> tuple[Path, dict]:
    """The bundle's root directory and validated manifest; a ``.zip`` is checked from its
    central directory and extracted into ``work`` only then. See :mod:`.bundle_check`."""
    def manifest_of(raw: bytes) -> dict:
        return chk.read_manifest(raw, path, latest_version(), FORMAT, FORMAT_VERSION, RUN_TABLES + ("blobs", "arrays"))

    if not path.exists():
        raise BundleError(f"{path}: no such bundle")
    if path.is_dir():
        mpath = path / chk.MANIFEST
        if not mpath.is_file() or mpath.is_symlink():
            raise BundleError(f"{path}: no manifest.json; not a dumpdb bundle")
        with open(mpath, "rb") as f:
            manifest = manifest_of(f.read(chk.MAX_MANIFEST_BYTES + 1))
        chk.check_room(path, chk.declared_bytes(manifest), max_bundle_size, archive_path)
        chk.check_directory(path, manifest, path)
        return path, manifest
    if not path.is_file():  # a FIFO or device would block or never end
        raise BundleError(f"{path}: not a regular file or directory; not a dumpdb bundle")
    if not zipfile.is_zipfile(path):
        raise BundleError(f"{path}: not a dumpdb bundle (neither a directory nor a .zip)")
    with zipfile.ZipFile(path) as z:
        manifest = manifest_of(chk.zip_manifest(z, path))
        chk.check_zip_members(z, manifest, path)
        # twice the payloads: extracted here, then written to the archive
        chk.check_room(path, chk.declared_bytes(manifest), max_bundle_size, work)
        chk.check_room(path, 2 * chk.declared_bytes(manifest), 2 * max_bundle_size, work)
        chk.extract_checked(z, manifest, path, work)
    return work, manifest


_NEEDS = {"runs": ("run", "source_path"), "tensors": ("run", "content_hash", "nbytes", "dtype", "shape"),
          "blobs": ("content_hash", "nbytes", "array_path", "elem_offset", "elem_count"), "arrays": ("array_path",)}


# Arrow bytes a bundle table may take per byte of its Parquet file (a real export: 0.2-65;
# issue 30, item 14: a 620 KB file of 30M equal rows took 10 GB), and at least this much
TABLE_EXPANSION = 200
TABLE_MEMORY_FLOOR = 64 << 20


def _read_table(path: Path, name: str, meta: dict, source: Path) -> pa.Table:
    """A bundle table, read in batches with its rows and memory bounded before and while
    reading: the rows the manifest declares (the Parquet footer must say as many) and at
    most ``TABLE_EXPANSION`` times the file's size in memory. Raises BundleError."""
    pf = pq.ParquetFile(path)
    rows = pf.metadata.num_rows
    if "rows" in meta and rows != meta["rows"]:
        raise BundleError(f"{source}: table {name} has {rows} rows, the manifest says {meta['rows']}")
    budget = max(TABLE_MEMORY_FLOOR, TABLE_EXPANSION * path.stat().st_size)
    batches, used = [], 0
    for batch in pf.iter_batches(batch_size=65536):
        used += batch.nbytes
        if used > budget:
            raise BundleError(f"{source}: table {name} ({rows} rows) expands to more than {budget >> 20} MiB in "
                              f"memory ({TABLE_EXPANSION}x its {path.stat().st_size} bytes); not dumpdb's, refused")
        batches.append(batch)
    return pa.Table.from_batches(batches, schema=pf.schema_arrow)


def _read_tables(bundle: Path, manifest: dict, source: Path, columns: dict[str, set[str]]) -> dict[str, pa.Table]:
    tables = {}
    for name, meta in manifest["tables"].items():
        table = _read_table(bundle / meta["file"], name, meta, source)
        for col in _NEEDS.get(name, ("run",)):
            if col not in table.column_names:
                raise BundleError(f"{source}: table {name} lacks the column {col}")
        if name in RUN_TABLES:  # inserted as they are: every column must exist in the catalog
            chk.check_columns(name, table.column_names, columns.get(name, set()), source)
        tables[name] = table
    runs = tables["runs"]["run"].to_pylist()
    for run in manifest["runs"]:
        if runs.count(run) != 1:
            raise BundleError(f"{source}: run {run!r} of the manifest has {runs.count(run)} rows in runs.parquet")
    listed = set(manifest["runs"])
    for name, table in tables.items():  # rows of a run the manifest does not list were dropped silently
        if name in RUN_TABLES and "run" in table.column_names:
            others = sorted({r for r in pc.unique(table["run"]).to_pylist() if r not in listed}, key=str)
            if others:
                raise BundleError(f"{source}: table {name} holds rows of run {others[0]!r}, which the manifest does "
                                  f"not list (it lists {sorted(listed)}); refused")
    tensors = tables["tensors"]
    if "tensor_key" in tensors.column_names and tensors.num_rows:
        keys = tensors.group_by(["run", "tensor_key"]).aggregate([([], "count_all")])
        if keys.num_rows != tensors.num_rows:
            dup = keys.filter(pc.greater(keys["count_all"], 1)).slice(0, 1).to_pylist()[0]
            raise BundleError(f"{source}: tensors has {tensors.num_rows} rows for {keys.num_rows} tensors: run "
                              f"{dup['run']!r} tensor_key {dup['tensor_key']!r} appears {dup['count_all']} times; "
                              "refused")
    return tables


def _check_payloads(source: Path, bundle: Path, tensors: pa.Table, blobs: list[dict], arrays: set[str],
                    have: dict[str, int]) -> list[dict]:
    """Every payload the import would store, re-read from the bundle and re-hashed; every
    tensor's nbytes against its payload and its dtype x shape. Returns the blobs to store."""
    from dumpdb.storage.store import TensorStore

    by_hash: dict[str, dict] = {}
    for blob in blobs:
        h = blob["content_hash"]
        if not isinstance(h, str) or h in by_hash:
            raise BundleError(f"{source}: blobs has a missing or repeated content_hash {h!r}")
        for key in ("nbytes", "elem_offset", "elem_count"):
            v = blob[key]
            if v is not None and v < 0 or (key == "nbytes" and v is None):
                raise BundleError(f"{source}: blob {h}: {key} {v!r} is not a size")
        by_hash[h] = blob
    needed: dict[str, int] = {}
    stat_cols = [c for c in STAT_COLUMNS if c in tensors.column_names]
    cols = tensors.select(["content_hash", "nbytes", "dtype", "shape"] + stat_cols +
                          (["pruned_at"] if "pruned_at" in tensors.column_names else [])).to_pylist()
    rows_of: dict[str, list[dict]] = {}
    for row in cols:
        h = row["content_hash"]
        if h is None or row.get("pruned_at") is not None:
            continue
        blob_bytes = by_hash[h]["nbytes"] if h in by_hash else have.get(h)
        if blob_bytes is None:
            raise BundleError(f"{source}: a tensor references payload {h}, which neither the bundle nor the "
                              "archive holds")
        try:
            expected = chk.expected_nbytes(row["dtype"], row["shape"])
        except (TypeError, ValueError) as exc:
            raise BundleError(f"{source}: a tensor of payload {h} has a bad dtype or shape ({exc})") from None
        if row["nbytes"] != blob_bytes or (expected is not None and expected != blob_bytes):
            raise BundleError(f"{source}: a tensor of payload {h} says {row['nbytes']} bytes "
                              f"(dtype x shape: {expected}), its payload is {blob_bytes} bytes")
        needed[h] = blob_bytes
        rows_of.setdefault(h, []).append(row)
    todo = [by_hash[h] for h in needed if h not in have]
    store = TensorStore(bundle / "tensors.zarr")
    for blob in todo:
        data, data_type = _bundle_payload(source, bundle, store, blob, arrays)
        if data.size != blob["nbytes"] or xxhash.xxh3_128_hexdigest(data.data) != blob["content_hash"]:
            raise BundleError(f"{source}: payload {blob['content_hash']} in {blob['array_path']} does not hash to "
                              "its content_hash (altered bytes); nothing imported")
        for row in rows_of.get(blob["content_hash"], ()):
            _check_row_against_payload(source, row, data, data_type)
    return todo


def _check_row_against_payload(source: Path, row: dict, data: np.ndarray, data_type: str | None) -> None:
    """A tensors row's dtype and statistics against the payload it names (issue 30, item 14:
    a forged dtype or statistics was imported as is). The dtype must be one the payload's
    array stores (packs hold one storage dtype: ``dtypes.storage_dtype``); counts must be
    exact and min/max equal (relative 1e-6: a dump's own statistics are exact values of the
    tensor) to the payload's, read as that dtype and shape."""
    from dumpdb.dtypes import from_catalog_name, storage_dtype
    from dumpdb.stats import compute_stats

    h = row["content_hash"]
    try:
        dtype = from_catalog_name(str(row["dtype"]))
    except (TypeError, ValueError):
        raise BundleError(f"{source}: a tensor of payload {h} has the unknown dtype {row['dtype']!r}") from None
    stored = "bool" if dtype == np.bool_ else storage_dtype(dtype).name
    if data_type is not None and stored != data_type:
        raise BundleError(f"{source}: a tensor of payload {h} says dtype {row['dtype']}, its payload is stored as "
                          f"{data_type}; refused")
    if row["shape"] is None or not any(row.get(k) is not None for k in STAT_COLUMNS):
        return
    try:
        actual = compute_stats(data.view(dtype).reshape(row["shape"])).as_dict()
    except (TypeError, ValueError):
        return  # dtype x shape was checked against nbytes already
    for key in STAT_COLUMNS:
        said, real = row.get(key), actual[key]
        if said is None or real is None:
            continue
        if key in ("min", "max"):
            same = (math.isnan(said) and math.isnan(real)) or said == real or (
                math.isfinite(said) and math.isfinite(real) and math.isclose(said, real, rel_tol=1e-6))
        elif key in ("mean", "l2norm"):
            continue  # accumulated differently by each framework
        else:
            same = said == real
        if not same:
            raise BundleError(f"{source}: a tensor of payload {h} says {key} {said!r}, its payload's is {real!r} "
                              "(forged or altered statistics); refused")


def _bundle_payload(source: Path, bundle: Path, store, blob: dict, arrays: set[str]) -> tuple[np.ndarray, str | None]:
    """One blob's bytes from the bundle's store, as uint8, and its array's ``data_type``
    (None: an empty payload has no array), after bounding what reading it may allocate by
    its declared size."""
    if blob["array_path"] is None:
        if blob["nbytes"]:
            raise BundleError(f"{source}: payload {blob['content_hash']} of {blob['nbytes']} bytes has no array")
        return np.zeros(0, np.uint8), None
    array_path = chk.check_array_path(blob["array_path"], arrays, source)
    key = f"{array_path}/zarr.json"
    if store.objects.size(key) > 1 << 20:  # dumpdb writes a few hundred bytes
        raise BundleError(f"{source}: {array_path}/zarr.json is over 1 MiB; not dumpdb's")
    meta = json.loads(bytes(store.objects.get(key)))
    itemsize = np.dtype("bool" if meta["data_type"] == "bool" else meta["data_type"]).itemsize
    if blob["elem_offset"] is None:
        if math.prod(meta["shape"]) * itemsize != blob["nbytes"]:
            raise BundleError(f"{source}: array {array_path} holds {meta['shape']} x {itemsize} bytes, its blob says "
                              f"{blob['nbytes']}")
        data = np.asarray(store.array(array_path)[...])
    else:
        inner = meta["codecs"][0]["configuration"]["chunk_shape"][0]
        if inner * itemsize > 64 << 20 or (blob["elem_count"] or 0) * itemsize != blob["nbytes"]:
            raise BundleError(f"{source}: pack {array_path} or its blob {blob['content_hash']} declares "
                              "sizes dumpdb does not write")
        data = store.read_pack_range(array_path, blob["elem_offset"], blob["elem_count"] or 0)
    return np.ascontiguousarray(data).reshape(-1).view(np.uint8), str(meta["data_type"])


def import_bundle(archive, path: str | os.PathLike, rename: dict[str, str] | None = None, *,
                  max_bundle_size: int = chk.MAX_BUNDLE_BYTES) -> ImportReport:
    """Bring the runs of the bundle at ``path`` into ``archive``.

    Before anything enters the archive the bundle is checked whole
    (:mod:`dumpdb.archival.bundle_check`: manifest, confined paths, sizes and sha256
    of every file, zip bombs, ``max_bundle_size`` bytes at most, every payload
    re-hashed). A ``.zip`` is extracted inside the archive directory (never to
    ``/tmp``) and removed afterwards, whatever happens. A run name already in the
    archive is skipped if it is the same run (same source path and tensor count:
    importing twice adds nothing), else refused unless ``rename`` maps it to a new
    name. Payloads the archive already holds (same content hash) are not stored
    again. Holds the store lock shared (gc waits). Raises BundleError for a damaged,
    hostile or foreign bundle, DumpdbError for a name conflict.
    """
    path, rename = Path(path), dict(rename or {})
    with archive_lock(archive, SHARED, f"import of {path.name}"), import_work_dir(archive.path) as work:
        try:
            bundle, manifest = _open_checked(path, work, max_bundle_size, archive.path)
            plan = _plan(archive, bundle, manifest, path, rename)
        except DumpdbError:
            raise
        except _UNREADABLE as exc:
            text = (str(exc).splitlines() or [""])[0][:160]
            raise BundleError(f"{path}: unreadable bundle ({type(exc).__name__}: {text})") from exc
        if plan is None:
            return ImportReport(runs_skipped=[rename.get(r, r) for r in manifest["runs"]])
        return _store(archive, bundle, plan)


WORK_PREFIX = ".dumpdb-import-"
_WORK_LOCK = ".lock"  # inside a work directory: flocked by the import using it
STALE_UNLOCKED_SECONDS = 3600.0  # a work directory of a dumpdb without the lock file: left so long


@contextmanager
def import_work_dir(archive_path: Path) -> Iterator[Path]:
    """A new ``.dumpdb-import-*`` directory inside the archive (a ``.zip`` is extracted there,
    never to ``/tmp``), removed afterwards whatever happens. Its ``.lock`` file is held
    (``flock``) while the import runs; first, the directories of imports that died (killed:
    no cleanup ran) are removed - each whose lock can be taken, i.e. no live process holds
    it (issue 30, item 15: a killed import's directory stayed forever). A directory left by
    an older dumpdb (no lock file) is removed once an hour old."""
    remove_stale_work_dirs(archive_path)
    work = Path(tempfile.mkdtemp(prefix=WORK_PREFIX, dir=archive_path))
    lock = os.open(work / _WORK_LOCK, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        os.write(lock, f"{os.getpid()}\n".encode())
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)
        os.close(lock)


def remove_stale_work_dirs(archive_path: Path) -> list[str]:
    """Remove the ``.dumpdb-import-*`` directories no live import holds (see
    :func:`import_work_dir`); returns their names."""
    removed = []
    for work in Path(archive_path).glob(WORK_PREFIX + "*"):
        if not work.is_dir() or work.is_symlink():
            continue
        try:
            fd = os.open(work / _WORK_LOCK, os.O_RDWR)
        except FileNotFoundError:
            try:
                stale = datetime.now().timestamp() - work.stat().st_mtime > STALE_UNLOCKED_SECONDS
            except OSError:
                continue
            if stale:
                shutil.rmtree(work, ignore_errors=True)
                removed.append(work.name)
            continue
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # a live import holds it
            shutil.rmtree(work, ignore_errors=True)
            removed.append(work.name)
        finally:
            os.close(fd)
    return removed


@dataclass
class _Plan:
    report: ImportReport
    tables: dict
    wanted: set[str]
    first: dict[str, str]
    tensors: pa.Table
    blobs: list[dict]


def _plan(archive, bundle: Path, manifest: dict, path: Path, rename: dict[str, str]) -> _Plan | None:
    """Everything decided and checked before the archive is touched."""
    with archive.reader() as con:
        columns: dict[str, set[str]] = {}
        for table, column in con.execute("SELECT table_name, column_name FROM information_schema.columns "
                                         "WHERE table_schema = 'main'").fetchall():
            columns.setdefault(table, set()).add(column)
    tables = _read_tables(bundle, manifest, path, columns)
    report = ImportReport()
    todo = []
    with archive.reader() as con:
        for run in manifest["runs"]:
            new = rename.get(run, run)
            row = con.execute("SELECT source_path FROM runs WHERE run = ?", [new]).fetchone()
            mine = tables["runs"].filter(pc.equal(tables["runs"]["run"], run)).to_pylist()[0]
            n_bundle = tables["tensors"].filter(pc.equal(tables["tensors"]["run"], run)).num_rows
            if row is None:
                todo.append((run, new))
                continue
            n_have = con.execute("SELECT count(*) FROM tensors WHERE run = ?", [new]).fetchone()[0]
            if row[0] == mine["source_path"] and n_have == n_bundle:
                report.runs_skipped.append(new)
            else:
                raise DumpdbError(f"{path}: run {new!r} already exists in {archive.path} with other data; "
                                  f"import it under another name (--rename {run}=NEW)")
        have = dict(con.execute("SELECT content_hash, nbytes FROM blobs").fetchall())
    if not todo:
        return None
    wanted = {r for r, _ in todo}
    tensors = tables["tensors"].filter(pc.is_in(tables["tensors"]["run"], pa.array(list(wanted))))
    arrays = set(tables["arrays"]["array_path"].to_pylist())
    blobs = _check_payloads(path, bundle, tensors, tables["blobs"].to_pylist(), arrays, have)
    report.payloads_present = len({h for h in tensors["content_hash"].drop_null().to_pylist() if h in have})
    return _Plan(report, tables, wanted, {r: n for r, n in todo}, tensors, blobs)


def _store(archive, bundle: Path, plan: _Plan) -> ImportReport:
    """Write the checked payloads, then the rows, in one catalog transaction."""
    from dumpdb.catalog.payload_rows import record_payloads
    from dumpdb.storage.payloads import copy_payloads
    from dumpdb.storage.store import StoreWriter, TensorStore

    report, tables, wanted, first, tensors = plan.report, plan.tables, plan.wanted, plan.first, plan.tensors
    source = TensorStore(bundle / "tensors.zarr")
    writer = StoreWriter(archive.writable_store())
    try:
        locations = copy_payloads(source, writer, [(b["content_hash"], b["array_path"], b["elem_offset"],
                                                    b["elem_count"]) for b in plan.blobs])
        arrays = writer.take_arrays()
    finally:
        writer.close()
    report.payloads_added = len(locations)
    owner: dict[str, str] = {}  # payload -> the imported run that stores it (show(): bytes stored)
    for run, content_hash in zip(tensors["run"].to_pylist(), tensors["content_hash"].to_pylist()):
        if content_hash is not None:
            owner.setdefault(content_hash, first[run])
    with archive.catalog.writer() as con:
        record_payloads(con, locations, arrays, owner)
        for table in RUN_TABLES:
            rows = tables.get(table)
            if rows is None or rows.num_rows == 0:
                continue
            rows = rows.filter(pc.is_in(rows["run"], pa.array(list(wanted))))
            runs_col = pa.array([first[r] for r in rows["run"].to_pylist()], pa.string())
            rows = rows.set_column(rows.schema.get_field_index("run"), "run", runs_col)
            if table == "tensors":
                rows = rows.drop_columns(["tensor_id"])
                insert_arrow(con, table, rows, prefix="nextval('tensor_id_seq') AS tensor_id,")
            else:
                insert_arrow(con, table, rows)
    report.runs_imported = list(first.values())
    report.tensors = tensors.num_rows
    return report
