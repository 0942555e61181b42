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
every file against the manifest before it changes the archive, stores only the
payloads the archive lacks, and is idempotent (a run already imported is skipped).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import zipfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dumpdb import __version__
from dumpdb.catalog import insert_arrow, latest_version, schema
from dumpdb.errors import DumpdbError

FORMAT = "dumpdb-bundle"
FORMAT_VERSION = 1


@dataclass
class ImportReport:
    runs_imported: list[str] = field(default_factory=list)
    runs_skipped: list[str] = field(default_factory=list)
    tensors: int = 0
    payloads_added: int = 0
    payloads_present: int = 0


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def export_runs(archive, runs: list[str], to: str | os.PathLike) -> Path:
    """Write ``runs`` of ``archive`` as a bundle at ``to`` (a ``.zip`` file if the name
    ends so, else a new directory). Returns the path. Raises DumpdbError for an unknown
    run or an existing destination."""
    from dumpdb.storage.payloads import array_table, blob_table, copy_payloads
    from dumpdb.storage.store import StoreWriter, TensorStore

    to = Path(to)
    if to.exists():
        raise DumpdbError(f"{to}: already exists; export writes a new bundle")
    if not runs:
        raise DumpdbError("export: name at least one run")
    as_zip = to.suffix.lower() == ".zip"
    work = Path(tempfile.mkdtemp(prefix=".dumpdb-export-", dir=to.parent if to.parent.exists() else None))
    try:
        bundle = work / "bundle"
        (bundle / "catalog").mkdir(parents=True)
        TensorStore.create(bundle / "tensors.zarr")
        with archive.reader() as con:
            known = {r[0] for r in con.execute("SELECT run FROM runs").fetchall()}
            missing = [r for r in runs if r not in known]
            if missing:
                raise DumpdbError(f"no run {missing[0]!r} in {archive.path} (runs: {', '.join(sorted(known))})")
            tables = {t: con.sql(f"SELECT * FROM {t} WHERE run IN (SELECT unnest(?))", params=[runs])
                      .to_arrow_table() for t in schema.run_tables()}
            live = con.execute(
                "SELECT b.content_hash, b.array_path, b.elem_offset, b.elem_count, b.nbytes FROM blobs b "
                "WHERE b.content_hash IN (SELECT content_hash FROM tensors WHERE run IN (SELECT unnest(?)) "
                "AND pruned_at IS NULL) ORDER BY b.array_path, b.elem_offset", [runs]).fetchall()
        writer = StoreWriter(TensorStore(bundle / "tensors.zarr", read_only=False))
        locations = copy_payloads(archive.store, writer, [row[:4] for row in live])
        arrays = writer.take_arrays()
        writer.close()
        tables["blobs"] = blob_table(locations).drop_columns(["first_run"])
        tables["arrays"] = array_table(arrays)
        for name, table in tables.items():
            pq.write_table(table, bundle / "catalog" / f"{name}.parquet", compression="zstd")
        files = {}
        for path in sorted(p for p in bundle.rglob("*") if p.is_file()):
            rel = path.relative_to(bundle).as_posix()
            files[rel] = {"bytes": path.stat().st_size, "sha256": _sha256(path)}
        manifest = {
            "format": FORMAT, "format_version": FORMAT_VERSION, "dumpdb_version": __version__,
            "schema_version": archive.schema_version,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "runs": runs,
            "tables": {n: {"file": f"catalog/{n}.parquet", "rows": t.num_rows} for n, t in tables.items()},
            "files": files,
        }
        (bundle / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        if as_zip:
            tmp_zip = work / "bundle.zip"
            with zipfile.ZipFile(tmp_zip, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as z:
                z.write(bundle / "manifest.json", "manifest.json")
                for rel in files:
                    z.write(bundle / rel, rel)
            os.replace(tmp_zip, to)
        else:
            os.rename(bundle, to)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return to


def _open_bundle(path: Path, work: Path) -> Path:
    if path.is_dir():
        return path
    if not zipfile.is_zipfile(path):
        raise DumpdbError(f"{path}: not a dumpdb bundle (neither a directory nor a .zip)")
    with zipfile.ZipFile(path) as z:
        for name in z.namelist():
            if name.startswith("/") or ".." in Path(name).parts:
                raise DumpdbError(f"{path}: unsafe member name {name!r}")
        z.extractall(work)
    return work


def _check(bundle: Path, source: Path) -> dict:
    try:
        manifest = json.loads((bundle / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise DumpdbError(f"{source}: no readable manifest.json ({exc})") from exc
    if manifest.get("format") != FORMAT:
        raise DumpdbError(f"{source}: manifest is not a {FORMAT} manifest")
    newer_schema = int(manifest.get("schema_version", 0)) > latest_version()
    if int(manifest.get("format_version", 0)) > FORMAT_VERSION or newer_schema:
        raise DumpdbError(
            f"{source}: bundle written by a newer dumpdb ({manifest.get('dumpdb_version')}); upgrade dumpdb")
    for rel, meta in manifest["files"].items():
        path = bundle / rel
        if not path.is_file():
            raise DumpdbError(f"{source}: {rel} is missing")
        if path.stat().st_size != meta["bytes"] or _sha256(path) != meta["sha256"]:
            raise DumpdbError(f"{source}: {rel} is damaged (size or sha256 differs from the manifest)")
    return manifest


def import_bundle(archive, path: str | os.PathLike, rename: dict[str, str] | None = None) -> ImportReport:
    """Bring the runs of the bundle at ``path`` into ``archive``.

    Every file is checked against the manifest first. A run name already in the
    archive is skipped if it is the same run (same source path and tensor count:
    importing twice adds nothing), else refused unless ``rename`` maps it to a new
    name. Payloads the archive already holds (same content hash) are not stored
    again. Raises DumpdbError for a damaged or foreign bundle or a name conflict.
    """
    from dumpdb.storage.payloads import copy_payloads, record_payloads
    from dumpdb.storage.store import StoreWriter, TensorStore

    path, rename = Path(path), dict(rename or {})
    with tempfile.TemporaryDirectory(prefix=".dumpdb-import-") as tmp:
        bundle = _open_bundle(path, Path(tmp))
        manifest = _check(bundle, path)
        tables = {n: pq.read_table(bundle / meta["file"]) for n, meta in manifest["tables"].items()}
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
            have = {h for (h,) in con.execute("SELECT content_hash FROM blobs").fetchall()}
        if not todo:
            return report
        wanted = {r for r, _ in todo}
        tensors = tables["tensors"].filter(pc.is_in(tables["tensors"]["run"], pa.array(list(wanted))))
        needed = set(tensors.column("content_hash").drop_null().to_pylist())
        source = TensorStore(bundle / "tensors.zarr")
        writer = StoreWriter(archive.writable_store())
        todo_blobs = []
        for blob in tables["blobs"].to_pylist():
            if blob["content_hash"] not in needed:
                continue
            if blob["content_hash"] in have:
                report.payloads_present += 1
                continue
            todo_blobs.append((blob["content_hash"], blob["array_path"], blob["elem_offset"], blob["elem_count"]))
        locations = copy_payloads(source, writer, todo_blobs)
        arrays = writer.take_arrays()
        writer.close()
        report.payloads_added = len(locations)
        first = {r: rename.get(r, r) for r in wanted}
        owner: dict[str, str] = {}  # payload -> the imported run that stores it (show(): bytes stored)
        for run, content_hash in zip(tensors["run"].to_pylist(), tensors["content_hash"].to_pylist()):
            if content_hash is not None:
                owner.setdefault(content_hash, first[run])
        with archive.catalog.writer() as con:
            record_payloads(con, locations, arrays, owner)
            for table in schema.run_tables():
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
        report.runs_imported = [first[r] for r, _ in todo]
        report.tensors = tensors.num_rows
    return report
