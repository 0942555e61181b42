"""Files a crashed writer leaves in a tensor store (local or object storage), found and reclaimed.

An ingest killed before its catalog commit leaves arrays no ``arrays`` row names and
``*.tmp-*`` shards (:class:`~dumpdb.storage.local.DurableLocalStore` writes through
temporary names); an import killed before its cleanup leaves its extraction
directory beside the store. ``gc`` and ``verify --repair`` remove them once older
than a grace period, so a writer's uncommitted files are never taken from under it.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dumpdb.storage.store import TensorStore


@dataclass(frozen=True)
class Leftover:
    """A file or array directory in the store that no catalog row refers to."""

    path: str  # relative to tensors.zarr (``../.dumpdb-import-*``: an import's extraction directory)
    kind: str  # 'array' (an uncommitted/orphan array) | 'temp' (a *.tmp-* shard, an import's directory)
    bytes: int
    age: float  # seconds since its newest file was written


# -- raw store access (kept in small helpers: the storage layer may re-route them) --
def _tree_stat(path: Path) -> tuple[int, float]:
    """(bytes, newest mtime) of a file or a directory tree."""
    if path.is_file():
        st = path.stat()
        return st.st_size, st.st_mtime
    total, newest = 0, path.stat().st_mtime
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.stat(os.path.join(dirpath, name))
            except OSError:
                continue
            total, newest = total + st.st_size, max(newest, st.st_mtime)
    return total, newest


def _array_dirs(root: Path) -> list[str]:
    """Every array directory the store layout has room for: ``packs/{dtype}/{id}`` and
    ``large/{hh}/{name}`` (see :mod:`dumpdb.storage.store`), as store-relative paths."""
    found: list[str] = []
    for top in ("packs", "large"):
        base = root / top
        if not base.is_dir():
            continue
        for middle in base.iterdir():
            if middle.is_dir():
                found.extend(f"{top}/{middle.name}/{leaf.name}" for leaf in middle.iterdir() if leaf.is_dir())
    return found


def _temp_files(root: Path) -> list[str]:
    """Store-relative paths of ``*.tmp-*`` files (shards written through a temporary name)."""
    return [p.relative_to(root).as_posix() for p in root.rglob("*.tmp-*") if p.is_file()]


def _remove(root: Path, rel: str) -> None:
    path = root / rel
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _stream_array_leftovers(store: TensorStore, known_arrays: set[str], now: float) -> list[Leftover]:
    """Arrays of a store without a directory tree (object storage) that ``known_arrays`` does
    not name, from its listing streamed page by page (10^6 objects: only the unknown arrays
    are held, never the listing). Object keys ``packs/{dtype}/{id}/...``, ``large/{hh}/{name}/...``."""
    found: dict[str, list[float]] = {}
    for top in ("packs", "large"):
        for key, size, mtime in store.objects.iter_meta(top):
            parts = key.split("/")
            if len(parts) < 4:
                continue  # the implicit groups' zarr.json
            rel = "/".join(parts[:3])
            if rel in known_arrays:
                continue
            entry = found.setdefault(rel, [0.0, 0.0])
            entry[0] += size or 0
            # no modification time from the store: as old as can be (gc holds the store lock, no writer runs)
            entry[1] = max(entry[1], mtime if mtime is not None else 0.0)
    return [Leftover(rel, "array", int(nbytes), max(0.0, now - newest)) for rel, (nbytes, newest) in found.items()]


def find_leftovers(root: Path | TensorStore, known_arrays: set[str]) -> list[Leftover]:
    """Arrays in the store at ``root`` that are not in ``known_arrays`` (the catalog's
    ``arrays``), and leftover temporary shards, with their size and age.

    ``root``: a local store's directory, or a :class:`~dumpdb.storage.store.TensorStore`
    (an object store's listing is streamed; it has no temporary names: a PUT or a
    multipart upload is visible whole or not at all)."""
    now = time.time()
    if not isinstance(root, Path):
        if not root.capabilities.files:
            return _stream_array_leftovers(root, known_arrays, now)
        assert root.root is not None  # a store of files has its directory
        root = root.root
    found = []
    for rel in _array_dirs(root):
        if rel not in known_arrays:
            nbytes, newest = _tree_stat(root / rel)
            found.append(Leftover(rel, "array", nbytes, max(0.0, now - newest)))
    for rel in _temp_files(root):  # inside a known array or not: never part of one
        nbytes, newest = _tree_stat(root / rel)
        found.append(Leftover(rel, "temp", nbytes, max(0.0, now - newest)))
    for work in root.parent.glob(".dumpdb-import-*"):  # an import killed before its cleanup
        nbytes, newest = _tree_stat(work)
        found.append(Leftover(f"../{work.name}", "temp", nbytes, max(0.0, now - newest)))
    return found


def reclaim_leftovers(root: Path | TensorStore, leftovers: list[Leftover], grace: float) -> tuple[int, int, int]:
    """Delete the leftovers older than ``grace`` seconds (``root`` as in :func:`find_leftovers`;
    a TensorStore must be writable). Returns (arrays, temp files deleted, kept because recent)."""
    arrays = temps = kept = 0
    for item in leftovers:
        if item.age < grace:
            kept += 1
            continue
        if isinstance(root, Path):
            _remove(root, item.path)
        elif root.capabilities.files:
            _remove(Path(str(root.root)), item.path)
        else:
            root.delete_array(item.path)
        if item.kind == "array":
            arrays += 1
        else:
            temps += 1
    return arrays, temps, kept
