"""What the migrations produce, kept between processes: the derived schema and an
empty catalog file.

Applying the migrations costs about 0.2 s (migration 006 alone issues ~200
``COMMENT ON`` statements) and every process needs the schema, every new archive an
empty catalog. Both are pure functions of the migration files and the DuckDB and
pyarrow versions, so they are computed once and kept in the user's cache directory
(``$DUMPDB_CACHE_DIR``, else ``$XDG_CACHE_HOME/dumpdb``, else ``~/.cache/dumpdb``)
under a key hashing all of those. The migrations stay the one source: a cache entry
is only ever written from them, and a changed migration changes the key.

The cache is an optimisation, never a requirement: an unwritable or damaged cache
is ignored (entries carry their own checksum) and the work is done in-process.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from functools import cache
from pathlib import Path

__all__ = ["cache_dir", "get", "migrations_key", "put"]


def cache_dir() -> Path:
    """Where cache entries live (not created here)."""
    explicit = os.environ.get("DUMPDB_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "dumpdb"


@cache
def _key(directory: Path, extra: str) -> str:
    import duckdb
    import pyarrow

    from dumpdb.catalog.migrations import load_migrations

    h = hashlib.sha256(f"duckdb {duckdb.__version__} pyarrow {pyarrow.__version__} {extra}\n".encode())
    for mig in load_migrations(directory):
        h.update(f"{mig.version} {mig.name}\n".encode())
        h.update(mig.sql.encode("utf-8"))
    return h.hexdigest()[:32]


def migrations_key(extra: str = "") -> str:
    """A key that changes whenever the migrations (or DuckDB, pyarrow, ``extra``) do."""
    from dumpdb.catalog.migrations import migrations_dir

    return _key(migrations_dir(), extra)


def get(name: str) -> bytes | None:
    """The bytes stored under ``name``, or None (absent, unreadable or damaged)."""
    try:
        data = (cache_dir() / name).read_bytes()
    except OSError:
        return None
    digest, sep, body = data.partition(b"\n")
    if not sep or hashlib.sha256(body).hexdigest().encode() != digest:
        return None
    return body


def put(name: str, body: bytes) -> None:
    """Store ``body`` under ``name`` atomically (temp + rename); silently does nothing
    when the cache directory cannot be written."""
    directory = cache_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=directory)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(hashlib.sha256(body).hexdigest().encode() + b"\n" + body)
            os.replace(tmp, directory / name)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError:
        pass
