"""Schema migrations: the numbered ``migrations/NNN_name.sql`` files.

They are applied in numeric order, each in its own transaction, and recorded in
``schema_version`` (see :mod:`dumpdb.catalog.connection` for when).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from dumpdb.errors import ArchiveError

_MIGRATION_RE = re.compile(r"^(\d+)_([A-Za-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    path: Path

    @property
    def sql(self) -> str:
        """The migration's SQL text."""
        return _read(self.path)


@cache
def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def migrations_dir() -> Path:
    """Where the numbered ``.sql`` migrations are.

    Installed wheels carry them as ``dumpdb/migrations``; a source checkout
    (editable install) has them at the repository top level.
    """
    package = Path(__file__).resolve().parent.parent  # dumpdb/
    for candidate in (package / "migrations", package.parent / "migrations"):
        if candidate.is_dir():
            return candidate
    raise ArchiveError(f"{package}: dumpdb installation lacks its migrations/ directory")


def load_migrations(directory: Path | None = None) -> list[Migration]:
    """All migrations, sorted by version. Raises ArchiveError on a gap or duplicate.

    Read once per directory and process: every catalog open asks (version checks,
    expected tables), and the files do not change under a running dumpdb.
    """
    return list(_load(directory or migrations_dir()))


@cache
def _load(directory: Path) -> tuple[Migration, ...]:
    found = []
    for path in directory.iterdir():
        m = _MIGRATION_RE.match(path.name)
        if m:
            found.append(Migration(int(m.group(1)), m.group(2), path))
    found.sort(key=lambda mig: mig.version)
    for expected, mig in enumerate(found, start=1):
        if mig.version != expected:
            raise ArchiveError(f"{mig.path}: migration numbers must run 1, 2, 3... (expected {expected})")
    return tuple(found)


def latest_version() -> int:
    """The highest migration number this dumpdb ships (the schema version it writes)."""
    return load_migrations()[-1].version
