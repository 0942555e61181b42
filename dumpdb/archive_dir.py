"""The archive directory on disk: its layout, marker, creation, checks and tensor store.

An archive is a directory::

    dumpdb.json      marker: format name and version, who created it
    catalog.duckdb   the catalog (see migrations/ and README "Catalog schema")
    tensors.zarr/    the tensor store (see dumpdb.storage.store), unless the marker's
                     ``store`` names an object-storage URL (``s3://BUCKET/PREFIX``,
                     see dumpdb.storage.remote): then the tensors live there
    locks/           per-run ingest locks (dumpdb.catalog.runstate)
    backups/         catalog copies made before migrations

Ingestion (:mod:`dumpdb.ingestion`) and archival (:mod:`dumpdb.archival`) use this module;
the query facade on top is :class:`dumpdb.archive.Archive`.
"""

from __future__ import annotations

import json
import os
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dumpdb import __version__
from dumpdb.catalog import Catalog
from dumpdb.errors import ArchiveError

if TYPE_CHECKING:
    from dumpdb.storage.store import TensorStore

MARKER = "dumpdb.json"
CATALOG = "catalog.duckdb"
STORE = "tensors.zarr"
FORMAT_NAME = "dumpdb-archive"
FORMAT_VERSION = 1
DEFAULT_ARCHIVE = "dumpdb.archive"


def default_archive_path() -> Path:
    """``$DUMPDB_ARCHIVE`` if set, else ``./dumpdb.archive``."""
    return Path(os.environ.get("DUMPDB_ARCHIVE") or DEFAULT_ARCHIVE)


def is_archive(path: Path) -> bool:
    """True if ``path`` is a directory holding a dumpdb archive marker (``dumpdb.json``)."""
    return (Path(path) / MARKER).is_file()


def store_config(path: Path) -> tuple[str | None, dict[str, str]]:
    """``(url, options)`` of the archive at ``path``'s tensor store as its marker records it:
    ``(None, {})`` for the local ``tensors.zarr``, else the ``s3://`` URL and the non-secret
    ``--storage-option`` values given at creation (credentials come from the environment)."""
    try:
        marker = json.loads((Path(path) / MARKER).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None, {}
    store = marker.get("store") or {}
    return store.get("url"), dict(store.get("options") or {})


def store_location(path: Path, storage_options: dict[str, Any] | None = None) -> tuple[str | Path, dict[str, Any]]:
    """``(location, options)`` of the archive at ``path``'s tensor store: its local
    ``tensors.zarr`` path with no options, or the object-store URL its marker names with the
    remembered options overlaid by ``storage_options``."""
    url, options = store_config(path)
    if url is None:
        return Path(path) / STORE, {}
    return url, {**options, **(storage_options or {})}


def open_tensor_store(path: Path, read_only: bool = True,
                      storage_options: dict[str, Any] | None = None) -> TensorStore:
    """The :class:`~dumpdb.storage.store.TensorStore` of the archive at ``path``
    (:func:`store_location`). Nothing is contacted until the first read."""
    from dumpdb.storage.store import TensorStore

    location, options = store_location(path, storage_options)
    return TensorStore(location, read_only=read_only, storage_options=options)


def check_store_url(path: Path, store: str | None) -> None:
    """Refuse ``store`` (a ``--store-url`` URL given for the existing archive at ``path``) unless
    it is the store the archive already has. Raises ArchiveError naming both."""
    if store is None:
        return
    from dumpdb.storage import backends

    url = store_config(path)[0]
    if url != backends.canonical(store):
        raise ArchiveError(f"{path}: its tensor store is {url or 'the local ' + STORE}, not {store}; "
                           "an archive keeps the store it was created with (omit --store-url)")


def create_archive(path: Path, store: str | None = None, storage_options: dict[str, Any] | None = None) -> None:
    """Create an empty archive at ``path`` (a new or empty directory).

    ``store``: an object-storage URL (``s3://BUCKET/PREFIX``) for the tensor store; the
    catalog stays in ``path`` (DuckDB writes its database file locally) and the marker
    remembers the URL and the non-secret ``storage_options``. None: ``path/tensors.zarr``.

    Raises ArchiveError if ``path`` is a non-empty directory that is not an
    archive, or cannot be created; StorageError if the store cannot be reached or
    already holds a tensor store.
    """
    from dumpdb.storage import backends

    url = backends.unfold(path)  # (a Path has folded the URL's '//')
    if url is not None:
        scheme = url.partition("://")[0]
        raise ArchiveError(f"{path}: an archive's catalog lives in a local directory; give --archive DIR "
                           f"with --store-url {scheme}://BUCKET/PREFIX for the tensors (formerly --store "
                           f"{scheme}://BUCKET/PREFIX; an {scheme}:// --archive is a bundle, opened read-only)")
    path = Path(path)
    if is_archive(path):
        return  # made meanwhile by a concurrent ingest
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise ArchiveError(f"{path}: exists and is not a dumpdb archive (no {MARKER}); refusing to write into it")
    from dumpdb.storage.store import TensorStore

    if store is not None:
        store = backends.canonical(store)  # StorageError for a malformed URL or an unknown scheme
        TensorStore.create(store, storage_options)  # first contact: an unreachable endpoint fails here

    # Built aside and renamed into place, so two ingests creating the same new archive
    # never see a half-made one: the loser of the rename finds a complete archive.
    tmp = path.parent / f".{path.name}.creating-{os.getpid()}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        Catalog(tmp / CATALOG).create()
        if store is None:
            TensorStore.create(tmp / STORE)
        (tmp / "locks").mkdir()
        marker: dict[str, Any] = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "created_by": f"dumpdb {__version__}",
        }
        if store is not None:
            marker["store"] = {"url": store, "options": backends.public_options(store, storage_options)}
        (tmp / MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
        try:
            os.rename(tmp, path)  # replaces an empty directory; fails if another process won
        except OSError:
            if not is_archive(path):
                raise
    except OSError as exc:
        raise ArchiveError(f"{path}: cannot create archive: {exc.strerror or exc}") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def check_marker(path: Path) -> None:
    """Check that ``path`` is an archive this dumpdb can open (its ``dumpdb.json`` marker).

    Raises ArchiveError (one line naming the path) when it does not exist, has no or an
    unreadable marker, or was written by a newer archive format.
    """
    if not path.exists():
        raise ArchiveError(f"{path}: no such archive (create one with 'dumpdb ingest DUMP_DIR --archive {path}')")
    if not is_archive(path):
        raise ArchiveError(f"{path}: not a dumpdb archive (no {MARKER})")
    try:
        marker = json.loads((path / MARKER).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ArchiveError(f"{path / MARKER}: unreadable archive marker: {exc}") from exc
    if marker.get("format") != FORMAT_NAME:
        raise ArchiveError(f"{path / MARKER}: not a dumpdb archive marker")
    if int(marker.get("format_version", 0)) > FORMAT_VERSION:
        raise ArchiveError(
            f"{path}: archive format version {marker.get('format_version')} is newer than "
            f"dumpdb {__version__} supports ({FORMAT_VERSION}); upgrade dumpdb"
        )
