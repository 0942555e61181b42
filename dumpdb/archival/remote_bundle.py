"""Bundles on object storage: export to ``s3://``, import from ``s3://``, and read one in place.

A bundle at ``s3://BUCKET/PREFIX`` is the same tree as a bundle directory
(:mod:`dumpdb.archival.bundle`): ``PREFIX/manifest.json``, ``PREFIX/catalog/*.parquet``,
``PREFIX/tensors.zarr/...``, one object per file.

* :func:`export_to_url` writes the bundle aside on local disk (the export checks every
  payload), uploads every file, and the manifest **last**: a bundle is visible (has a
  manifest) only once all its objects exist. An existing bundle at the URL is refused.
* :func:`import_from_url` reads the manifest (bounded), checks it as an import does,
  downloads exactly the files it lists (each no larger than declared) into the archive
  directory, and imports that copy with every check of a local import (sizes, sha256,
  payload hashes); the copy is removed afterwards.
* :class:`BundleCatalog` (``dumpdb.open("s3://...")``, ``dumpdb sql --archive s3://...``): the
  catalog source of an :class:`dumpdb.archive.Archive`,
  read-only, nothing copied. SQL runs in DuckDB over the bundle's Parquet files read
  through ``pyarrow.fs.S3FileSystem`` (Arrow datasets registered as DuckDB views; the
  httpfs extension is not used), tensors through the bundle's ``tensors.zarr`` on S3.
  A team keeps one bucket of bundles and everyone queries it without copying.

Endpoint and credentials as for stores (:mod:`dumpdb.storage.backends`, S3: :mod:`dumpdb.storage.remote`).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb

from dumpdb.archival import bundle_check as chk
from dumpdb.catalog.locations import LocationIndex
from dumpdb.errors import ArchiveError, BundleError, DumpdbError, PayloadMissing, StorageError
from dumpdb.storage import backends


def _objects(url: str, options: dict[str, Any] | None, read_only: bool):
    from dumpdb.storage.objects import ObjectStore

    return ObjectStore(backends.open_store(url, options, read_only=read_only), url, backends.endpoint(url, options))


def export_to_url(archive, runs: list[str], url: str, storage_options: dict[str, Any] | None = None) -> str:
    """Write ``runs`` of ``archive`` as a bundle at ``url`` (``s3://BUCKET/PREFIX``). Returns the
    URL. Raises DumpdbError if a bundle is there already, StorageError if the store cannot be
    reached, and what :func:`dumpdb.archival.bundle.export_runs` raises (nothing is uploaded then)."""
    from dumpdb.archival.bundle import export_runs

    url = backends.canonical(url)
    objects = _objects(url, storage_options, read_only=False)
    if objects.exists(chk.MANIFEST):
        raise DumpdbError(f"{url}: already holds a bundle; export writes a new bundle")
    work = Path(tempfile.mkdtemp(prefix=".dumpdb-export-", dir=archive.path if isinstance(archive.path, Path)
                                 else None))
    try:
        bundle = export_runs(archive, runs, work / "bundle")
        files = sorted(p for p in bundle.rglob("*") if p.is_file() and p.name != chk.MANIFEST)
        for path in files:
            objects.set(path.relative_to(bundle).as_posix(), _file_parts(path))
        objects.set(chk.MANIFEST, (bundle / chk.MANIFEST).read_bytes())  # last: the bundle is complete
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return url


def _file_parts(path: Path, block: int = 8 << 20) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while chunk := f.read(block):
            yield chunk


def _manifest(objects, url: str) -> dict:
    from dumpdb.archival.bundle import FORMAT, FORMAT_VERSION, RUN_TABLES
    from dumpdb.catalog import latest_version

    try:
        size = objects.size(chk.MANIFEST)
    except PayloadMissing:
        raise BundleError(f"{url}: no manifest.json; not a dumpdb bundle") from None
    if size > chk.MAX_MANIFEST_BYTES:
        raise BundleError(f"{url}: manifest.json is {size} bytes; a manifest is at most "
                          f"{chk.MAX_MANIFEST_BYTES >> 20} MiB")
    return chk.read_manifest(bytes(objects.get(chk.MANIFEST)), Path(url), latest_version(), FORMAT,
                             FORMAT_VERSION, RUN_TABLES + ("blobs", "arrays"))


def fetch_bundle(url: str, dest: Path, max_bundle_size: int = chk.MAX_BUNDLE_BYTES,
                 storage_options: dict[str, Any] | None = None) -> Path:
    """Download the bundle at ``url`` into the new directory ``dest``: the manifest, then
    exactly the files it lists, each refused if its object is larger than declared.
    Returns ``dest``. Raises BundleError (foreign/oversized/inconsistent bundle),
    StorageError (unreachable store)."""
    url = backends.canonical(url)
    objects = _objects(url, storage_options, read_only=True)
    manifest = _manifest(objects, url)
    dest.mkdir(parents=True)
    chk.check_room(Path(url), chk.declared_bytes(manifest), max_bundle_size, dest)
    for rel, meta in manifest["files"].items():
        try:
            size = objects.size(rel)
        except PayloadMissing:
            raise BundleError(f"{url}: {rel} listed in the manifest is missing") from None
        if size != meta["bytes"]:
            raise BundleError(f"{url}: {rel} is {size} bytes, the manifest says {meta['bytes']}")
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "wb") as f:
            for lo in range(0, size, 16 << 20):
                f.write(objects.get(rel, lo, min(lo + (16 << 20), size)))
    (dest / chk.MANIFEST).write_bytes(bytes(objects.get(chk.MANIFEST)))
    return dest


def import_from_url(archive, url: str, rename: dict[str, str] | None = None, *,
                    max_bundle_size: int = chk.MAX_BUNDLE_BYTES, storage_options: dict[str, Any] | None = None):
    """Import the bundle at ``url`` into ``archive`` (:func:`fetch_bundle` into the archive
    directory, then :func:`dumpdb.archival.bundle.import_bundle` with all its checks; the copy
    is removed whatever happens). Returns its ImportReport."""
    from dumpdb.archival.bundle import import_bundle, import_work_dir

    with import_work_dir(archive.path) as work:  # removed whatever happens; a killed one by the next import
        bundle = fetch_bundle(url, work / "bundle", max_bundle_size, storage_options)
        return import_bundle(archive, bundle, rename, max_bundle_size=max_bundle_size)


class BundleCatalog:
    """The catalog source (:class:`dumpdb.archive.CatalogSource`) of a bundle on object
    storage opened read-only in place (``dumpdb.open("s3://B/P")``).

    Queries (``sql``, ``runs``, ``show``, ``tensor``, ``tensors``, compare reads...) see the
    bundle's tables (runs, tensors, blobs, arrays, ops, ...) as DuckDB views over its Parquet
    objects, scanned through the storage backend's ``pyarrow.fs`` filesystem; tensors are read from its
    ``tensors.zarr`` on S3. Anything that writes raises ArchiveError (import the bundle to
    change it). Raises BundleError when ``url`` holds no bundle, StorageError when the store
    cannot be reached.
    """

    writable = False

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None):
        self.url = backends.canonical(url)
        self.path = self.url  # messages name the URL
        self.storage_options = dict(storage_options or {})
        self.manifest = _manifest(_objects(self.url, self.storage_options, read_only=True), self.url)
        self.schema_version = int(self.manifest["schema_version"])
        self.refusal = f"{self.url}: a bundle opened in place is read-only; import it to change it"
        self._fs: tuple[Any, str] | None = None  # (pyarrow filesystem, base path), made on first use

    @property
    def catalog(self) -> Any:
        """Refused: a bundle opened in place has no catalog to write (``compare --no-store``
        compares without storing; import the bundle to keep results). ArchiveError."""
        raise ArchiveError(f"{self.url}: a bundle opened in place is read-only (compare --no-store, or import "
                           "it to store results)")

    @property
    def store_url(self) -> str | None:
        """The bundle's tensor store URL."""
        return f"{self.url}/tensors.zarr"

    def open_store(self, read_only: bool, storage_options: dict[str, Any]) -> Any:
        """The bundle's ``tensors.zarr`` on object storage (a read-only TensorStore)."""
        from dumpdb.storage.store import TensorStore

        return TensorStore(f"{self.url}/tensors.zarr", read_only=True, storage_options=storage_options)

    def locations(self, reader: Any) -> LocationIndex:
        """The payload locations of the bundle's tensors, loaded once (a bundle never changes)."""
        return LocationIndex(None, reader)

    def prepare(self, con: duckdb.DuckDBPyConnection) -> None:
        """Register the bundle's tables as views of ``con`` (Arrow datasets over its Parquet
        objects; the httpfs extension is not used)."""
        import pyarrow.dataset as ds

        if self._fs is None:
            self._fs = backends.backend(self.url).filesystem(self.url, self.storage_options)
        fs, base = self._fs
        for name, meta in self.manifest["tables"].items():
            path = f"{base}/{meta['file']}".replace("//", "/")
            try:
                dataset = ds.dataset(path, filesystem=fs, format="parquet")
            except OSError as exc:
                raise StorageError(f"{self.url}/{meta['file']} at {backends.endpoint(self.url, self.storage_options)}: "
                                   f"cannot read: {str(exc).splitlines()[0]}") from exc
            con.register(f"_{name}_arrow", dataset)
            con.execute(f'CREATE VIEW "{name}" AS SELECT * FROM "_{name}_arrow"')

    def attach(self, con: duckdb.DuckDBPyConnection) -> None:
        """Nothing to attach: the views :meth:`prepare` made stay (a bundle never changes)."""

    def detach(self, con: duckdb.DuckDBPyConnection) -> None:
        """Nothing to detach (see :meth:`attach`)."""

    def connect(self) -> duckdb.DuckDBPyConnection:
        """A plain in-memory connection whose views are the bundle's tables."""
        con = duckdb.connect(":memory:")
        try:
            self.prepare(con)
        except BaseException:
            con.close()
            raise
        return con

    @contextmanager
    def reader(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A connection whose views are the bundle's tables, closed after the block."""
        con = self.connect()
        try:
            yield con
        finally:
            con.close()
