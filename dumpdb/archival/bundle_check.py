"""Checking a bundle before anything of it enters an archive (a bundle may be hostile).

What :func:`dumpdb.archival.bundle.import_bundle` refuses, each with one
:class:`~dumpdb.errors.BundleError` line naming the bundle and the problem:

* a manifest that is not the JSON object dumpdb writes (wrong types, missing keys,
  negative sizes, bad hashes, unknown tables, more than :data:`MAX_MANIFEST_BYTES`);
* any path (manifest ``files``, table files, zip members, ``blobs.array_path``) that
  is absolute, has a ``..`` or empty part, a backslash or a NUL, or leaves the bundle
  through a symlink: everything read is confined to the bundle;
* files present but not in the manifest, or in the manifest but absent (an empty
  ``"files": {}`` does not skip the check: it makes every file unexpected);
* a ``.zip`` whose declared sizes exceed ``max_bundle_size`` or the free space, or
  whose members are compressed more than :data:`MAX_RATIO` : 1 (a zip bomb), checked
  from the central directory *before* anything is extracted; symlink members;
* any size or sha256 that differs from the manifest, any table whose columns the
  archive's catalog does not have;
* a payload whose bytes, re-read and re-hashed (xxh3-128), differ from its
  ``content_hash`` or its size, and a tensor whose ``nbytes`` differs from its
  payload's or from ``shape x itemsize``: a re-signed manifest cannot smuggle
  altered bytes under a trusted hash (issue 14).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import stat
import zipfile
from pathlib import Path

from dumpdb.errors import BundleError, shown

MAX_BUNDLE_BYTES = 1 << 40  # 1 TiB: default of --max-bundle-size
MAX_MANIFEST_BYTES = 64 << 20
MAX_RATIO = 100  # dumpdb stores zip members uncompressed (ratio ~1); payloads are zstd already
_RATIO_FLOOR = 1 << 20  # members smaller than this may compress as they like
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_ARRAY_PATH = re.compile(r"^(packs|large)/[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
REQUIRED_TABLES = ("runs", "tensors", "blobs", "arrays")
MANIFEST = "manifest.json"


def safe_relpath(rel: object, source: Path, what: str) -> str:
    """``rel`` if it is a plain relative POSIX path inside the bundle, else BundleError."""
    if not isinstance(rel, str) or not rel:
        raise BundleError(f"{source}: {what} {rel!r} is not a path")
    if "\\" in rel or "\x00" in rel or rel.startswith("/") or re.match(r"^[A-Za-z]:", rel):
        raise BundleError(f"{source}: {what} {rel!r} is not a relative path inside the bundle")
    if not rel.isprintable():  # a newline or other control character: no file dumpdb exports has one
        raise BundleError(f"{source}: {what} {rel!r} holds a control character")
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise BundleError(f"{source}: {what} {rel!r} leaves the bundle or is not normalised")
    return rel


def _int(value: object, source: Path, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BundleError(f"{source}: manifest {what} must be a non-negative integer, not {value!r}")
    return value


def read_manifest(text: bytes, source: Path, latest_schema: int, format_name: str, format_version: int,
                  known_tables: tuple[str, ...]) -> dict:
    """Parse and validate ``manifest.json``. Returns it, with ``files`` and ``tables``
    checked (types, sizes, hashes, confined paths, tables listed as files)."""
    if len(text) > MAX_MANIFEST_BYTES:
        raise BundleError(f"{source}: manifest.json is {len(text)} bytes; a manifest is at most "
                          f"{MAX_MANIFEST_BYTES >> 20} MiB")
    try:
        manifest = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise BundleError(f"{source}: manifest.json is not valid JSON ({str(exc).splitlines()[0][:120]})") from None
    if not isinstance(manifest, dict):
        raise BundleError(f"{source}: manifest.json is not a JSON object")
    if manifest.get("format") != format_name:
        raise BundleError(f"{source}: manifest is not a {format_name} manifest")
    for key in ("format_version", "schema_version", "runs", "tables", "files"):
        if key not in manifest:
            raise BundleError(f"{source}: manifest lacks {key!r}")
    version, schema = _int(manifest["format_version"], source, "format_version"), \
        _int(manifest["schema_version"], source, "schema_version")
    if version > format_version or schema > latest_schema:
        raise BundleError(f"{source}: bundle written by a newer dumpdb ({manifest.get('dumpdb_version')}); "
                          "upgrade dumpdb")
    runs = manifest["runs"]
    if not isinstance(runs, list) or not runs or not all(isinstance(r, str) and r.strip() for r in runs) \
            or len(set(runs)) != len(runs):
        raise BundleError(f"{source}: manifest 'runs' must be a list of distinct run names, not {runs!r:.80}")
    files = manifest["files"]
    if not isinstance(files, dict):
        raise BundleError(f"{source}: manifest 'files' must be an object (path -> bytes, sha256)")
    for rel, meta in files.items():
        safe_relpath(rel, source, "file")
        if rel == MANIFEST:
            raise BundleError(f"{source}: the manifest cannot list itself")
        if not isinstance(meta, dict) or "bytes" not in meta or "sha256" not in meta:
            raise BundleError(f"{source}: manifest entry for {rel} needs 'bytes' and 'sha256'")
        _int(meta["bytes"], source, f"bytes of {rel}")
        if not isinstance(meta["sha256"], str) or not _SHA256.match(meta["sha256"]):
            raise BundleError(f"{source}: manifest sha256 of {rel} is not 64 hex digits")
    tables = manifest["tables"]
    if not isinstance(tables, dict):
        raise BundleError(f"{source}: manifest 'tables' must be an object (table -> file, rows)")
    for name, meta in tables.items():
        if name not in known_tables:
            raise BundleError(f"{source}: manifest names an unknown table {name!r}")
        if not isinstance(meta, dict) or "file" not in meta:
            raise BundleError(f"{source}: manifest entry of table {name} needs 'file'")
        rel = safe_relpath(meta["file"], source, f"file of table {name}")
        if rel not in files:
            raise BundleError(f"{source}: table {name}'s file {rel} is not among the manifest's files")
        if "rows" in meta:
            _int(meta["rows"], source, f"rows of table {name}")
    missing = [t for t in REQUIRED_TABLES if t not in tables]
    if missing:
        raise BundleError(f"{source}: manifest lacks the table(s) {', '.join(missing)}")
    return manifest


def declared_bytes(manifest: dict) -> int:
    """Bytes the manifest declares for all the bundle's files (its ``files`` sizes), checked before extraction."""
    return sum(meta["bytes"] for meta in manifest["files"].values())


def check_room(source: Path, total: int, max_bytes: int, where: Path) -> None:
    """Refuse a bundle larger than ``max_bytes`` or than the free space at ``where``."""
    if total > max_bytes:
        raise BundleError(f"{source}: bundle declares {total} bytes, more than --max-bundle-size {max_bytes}")
    try:
        free = shutil.disk_usage(where).free
    except OSError:
        return
    if total > free:
        raise BundleError(f"{source}: bundle declares {total} bytes; only {free} bytes free at {where}")


# -- zip bundles: everything decided from the central directory, before extraction --
def zip_manifest(z: zipfile.ZipFile, source: Path) -> bytes:
    """The bytes of the zip's manifest.json (bounded), after checking every member name."""
    names = set()
    for info in z.infolist():
        name = info.filename
        if info.is_dir():
            safe_relpath(name.rstrip("/"), source, "zip member")
            continue
        safe_relpath(name, source, "zip member")
        if info.flag_bits & 0x1:  # zipfile would ask for a password (RuntimeError): refuse it plainly
            raise BundleError(f"{source}: zip member {name!r} is encrypted; dumpdb bundles are not")
        if name in names:
            raise BundleError(f"{source}: zip member {name!r} appears twice")
        names.add(name)
        if stat.S_ISLNK(info.external_attr >> 16):
            raise BundleError(f"{source}: zip member {name!r} is a symlink; bundles hold regular files only")
    if MANIFEST not in names:
        raise BundleError(f"{source}: no manifest.json in the zip; not a dumpdb bundle")
    info = z.getinfo(MANIFEST)
    if info.file_size > MAX_MANIFEST_BYTES:
        raise BundleError(f"{source}: manifest.json is {info.file_size} bytes; a manifest is at most "
                          f"{MAX_MANIFEST_BYTES >> 20} MiB")
    with z.open(info) as f:
        return f.read(MAX_MANIFEST_BYTES + 1)


def check_zip_members(z: zipfile.ZipFile, manifest: dict, source: Path) -> None:
    """Members equal the manifest's files, with the declared sizes and sane ratios."""
    files = manifest["files"]
    members = {i.filename: i for i in z.infolist() if not i.is_dir() and i.filename != MANIFEST}
    _same_sets(set(members), set(files), source)
    for name, info in members.items():
        if info.file_size != files[name]["bytes"]:
            raise BundleError(f"{source}: zip member {name} is {info.file_size} bytes, the manifest says "
                              f"{files[name]['bytes']}")
        if info.file_size > _RATIO_FLOOR and info.file_size > MAX_RATIO * max(info.compress_size, 1):
            raise BundleError(f"{source}: zip member {name} expands {info.file_size / max(info.compress_size, 1):.0f}"
                              f" times (more than {MAX_RATIO}); refusing a zip bomb")


def extract_checked(z: zipfile.ZipFile, manifest: dict, source: Path, work: Path) -> None:
    """Extract the manifest's files into ``work``, each at most its declared size and
    with its declared sha256 (checked while copying)."""
    for rel, meta in manifest["files"].items():
        target = work / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        h, written = hashlib.sha256(), 0
        with z.open(rel) as src, open(target, "wb") as dst:
            while block := src.read(min(1 << 20, meta["bytes"] - written + 1)):
                written += len(block)
                if written > meta["bytes"]:
                    raise BundleError(f"{source}: zip member {rel} holds more than its declared {meta['bytes']} bytes")
                h.update(block)
                dst.write(block)
        _compare(rel, written, h.hexdigest(), meta, source)
    (work / MANIFEST).write_bytes(json.dumps(manifest).encode())


# -- directory bundles: read in place, confined ---------------------------------
def check_directory(bundle: Path, manifest: dict, source: Path) -> None:
    """Every regular file of the directory is in the manifest and vice versa (no
    symlinks, nothing else), with the declared size and sha256."""
    present: set[str] = set()
    for dirpath, dirs, names in os.walk(bundle):
        for name in dirs + names:
            path = Path(dirpath) / name
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                raise BundleError(f"{source}: {path.relative_to(bundle)} is a symlink; bundles hold regular files only")
            if name in names and not stat.S_ISREG(st.st_mode):
                raise BundleError(f"{source}: {path.relative_to(bundle)} is not a regular file")
        present.update((Path(dirpath) / n).relative_to(bundle).as_posix() for n in names)
    present.discard(MANIFEST)
    _same_sets(present, set(manifest["files"]), source)
    for rel, meta in manifest["files"].items():
        path = bundle / rel
        size = path.stat().st_size
        if size != meta["bytes"]:
            _compare(rel, size, "", meta, source)
        _compare(rel, size, sha256(path), meta, source)


def sha256(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks (the manifest's per-file checksum)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _same_sets(present: set[str], listed: set[str], source: Path) -> None:
    extra, missing = sorted(present - listed), sorted(listed - present)
    if missing:
        raise BundleError(f"{source}: {missing[0]} is missing ({len(missing)} file(s) of the manifest absent)")
    if extra:
        raise BundleError(f"{source}: {shown(extra[0])} is not in the manifest ({len(extra)} unlisted file(s)); "
                          "refusing files nobody vouched for")


def _compare(rel: str, size: int, digest: str, meta: dict, source: Path) -> None:
    if size != meta["bytes"] or digest != meta["sha256"]:
        raise BundleError(f"{source}: {rel} is damaged (size or sha256 differs from the manifest)")


# -- catalog rows ----------------------------------------------------------------
def check_array_path(array_path: object, arrays: set[str], source: Path) -> str:
    """A blob's ``array_path``: the store layout's form and one of the bundle's arrays."""
    if not isinstance(array_path, str) or not _ARRAY_PATH.match(array_path) or ".." in array_path.split("/"):
        raise BundleError(f"{source}: blobs.array_path {array_path!r} is not a path of the bundle's tensor store")
    if array_path not in arrays:
        raise BundleError(f"{source}: blobs.array_path {array_path} is not among the bundle's arrays")
    return array_path


def check_columns(table: str, names: list[str], allowed: set[str], source: Path) -> None:
    """Raise BundleError naming the table and columns of a bundle table that the catalog does not have."""
    unknown = [n for n in names if n not in allowed]
    if unknown:
        raise BundleError(f"{source}: table {table} has column(s) {', '.join(unknown[:3])} the catalog does not")


def expected_nbytes(dtype: object, shape: object) -> int | None:
    """``prod(shape) x itemsize`` of a catalog row, None when either is NULL."""
    from dumpdb.dtypes import from_catalog_name

    if dtype is None or shape is None:
        return None
    if not isinstance(shape, list) or any(not isinstance(d, int) or d < 0 for d in shape):
        raise ValueError(f"shape {shape!r} is not a list of sizes")
    return math.prod(shape) * from_catalog_name(str(dtype)).itemsize
