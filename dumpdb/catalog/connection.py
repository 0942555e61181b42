"""The DuckDB catalog of an archive: schema migrations and connections.

Concurrency model. DuckDB lets one process hold a database file read-write, or
several hold it read-only, never both (a writer's lock blocks readers and a
reader's lock blocks writers). So dumpdb never keeps the catalog open longer
than one operation: a query opens a read-only connection and closes it (``with
archive:`` and ``Archive(hold=True)`` keep one for a block of queries: the CLI's
statistics compare, about a second); an
ingest opens a read-write connection per commit (tens of milliseconds). A
connection that meets another process's lock retries with backoff until
``lock_timeout`` seconds have passed, then raises :class:`ArchiveError`.

Schema. ``migrations/NNN_name.sql`` files are applied in numeric order and
recorded in ``schema_version``: to an existing catalog each in its own transaction,
to a new one all in one (or copied from a cached template, see ``create``). An archive whose
schema is older is upgraded on open (after copying the catalog to
``backups/``); one that is newer than this dumpdb knows raises
:class:`CatalogVersionError`.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb

from dumpdb import __version__
from dumpdb.catalog import cache as disk_cache
from dumpdb.catalog.cache import migrations_key
from dumpdb.catalog.migrations import Migration, latest_version, load_migrations
from dumpdb.errors import ArchiveError, CatalogCorrupt, CatalogVersionError, StorageError

if TYPE_CHECKING:
    import pyarrow as pa

DEFAULT_LOCK_TIMEOUT = float(os.environ.get("DUMPDB_LOCK_TIMEOUT", "120"))

# DuckDB 2 writes a storage format DuckDB 1.x cannot read by default; the DuckDB CLI
# and most libraries users have are 1.x. A catalog is created with this storage
# version (DuckDB's `storage_compatibility_version` setting, docs: "Storage
# versions and format") so every DuckDB >= 1.4 opens it. Checked by
# tests/test_cli_duckdb1.py with the latest duckdb<2 from PyPI.
STORAGE_COMPATIBILITY = "v1.4.0"
# The storage version number a file of that format carries in its header (DuckDB's main
# header: checksum u64, "DUCK", version u64). DuckDB 2's own default is 999, which 1.x
# refuses ("version number 999"): catalogs made before STORAGE_COMPATIBILITY was set, and
# the schema-v1 archive in tests/data, have it (issue 30).
PORTABLE_STORAGE_NUMBER = 67


class CatalogTruncated(CatalogCorrupt):
    """The catalog file is shorter than the blocks its header counts in use."""


def storage_number(path: Path) -> int | None:
    """The storage version number in a DuckDB file's header; None if it is not one."""
    try:
        with open(path, "rb") as f:
            head = f.read(20)
    except OSError:
        return None
    if len(head) < 20 or head[8:12] != b"DUCK":
        return None
    return int.from_bytes(head[12:20], "little")


def is_lock_error(exc: Exception) -> bool:
    """True if a DuckDB error says another process holds the catalog's file lock (DuckDB 2.x wording)."""
    text = str(exc).lower()
    return "lock" in text and ("conflicting" in text or "could not set" in text)


_CORRUPT = ("not a valid duckdb database", "could not read enough bytes", "corrupt database",
            "corrupted", "serialization error")


def _catalog_error(path: Path, exc: Exception, strict: bool = False) -> Exception:
    """One-line DumpdbError for a DuckDB error on the catalog file: a full disk is a
    StorageError, a damaged file CatalogCorrupt. With ``strict`` (errors of queries, not
    of opening) anything else is returned unchanged: a bad query is not a bad file."""
    text = str(exc)
    first = text.splitlines()[0] if text else type(exc).__name__
    low = text.lower()
    if "no space left" in low or "disk quota" in low or "file too large" in low:
        return StorageError(f"{path}: cannot write the catalog: {first}; what was committed before is kept")
    if any(k in low for k in _CORRUPT) or not strict:
        return CatalogCorrupt(f"{path}: catalog is damaged, DuckDB cannot read it ({first}); "
                              "restore it from backups/ or a bundle")
    return exc


def _row_counts(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """Rows of every table, as recorded in the catalog summary at each commit."""
    names = [r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main' "
                                       "ORDER BY table_name").fetchall()]
    if not names:
        return {}
    query = " UNION ALL ".join(f"SELECT '{n}', count(*) FROM \"{n}\"" for n in names)
    return {n: c for n, c in con.execute(query).fetchall()}


SUMMARY = "catalog.summary.json"


def write_summary(path: Path, counts: dict[str, int], pending: bool = False) -> None:
    """Record ``counts`` beside the catalog (``catalog.summary.json``), atomically.

    ``dumpdb verify`` compares the catalog's row counts with it: a catalog rolled back,
    replaced or partly lost since the last commit shows. Written twice per commit, so a
    process killed between the two leaves a summary that still tells the truth: before
    COMMIT with ``pending`` (the counts about to be committed, and under ``"before"`` the
    last committed ones: the catalog holds one or the other), after COMMIT plain.
    Best effort: if it cannot be written (full disk), the old summary is removed rather
    than left stale.
    """
    target = path.parent / SUMMARY
    tmp = path.parent / f".{SUMMARY}.tmp-{os.getpid()}"
    record: dict = {"committed": datetime.now().isoformat(timespec="seconds"), "dumpdb_version": __version__,
                    "rows": counts}
    if pending:
        last = read_summary(path)
        record["before"] = None if last is None or "before" in last else last["rows"]
    try:
        tmp.write_text(json.dumps(record), encoding="utf-8")
        os.replace(tmp, target)
    except OSError:
        tmp.unlink(missing_ok=True)
        try:
            target.unlink(missing_ok=True)
        except OSError:
            pass


def read_summary(path: Path) -> dict | None:
    """The summary recorded at the last commit, or None (none yet, or unreadable)."""
    try:
        data = json.loads((path.parent / SUMMARY).read_text(encoding="utf-8"))
        return data if isinstance(data, dict) and isinstance(data.get("rows"), dict) else None
    except (OSError, ValueError):
        return None


def expected_tables() -> set[str]:
    """Tables the migrations create (what a current catalog must have)."""
    found: set[str] = set()
    for mig in load_migrations():
        found.update(m.lower() for m in re.findall(r"CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)", mig.sql, re.I))
    return found


class Catalog:
    """The ``catalog.duckdb`` file of one archive.

    ``on_wait(message)`` is called once per connection attempt that has to wait
    for another process's lock (the CLI prints it); without one the line goes to the
    ``dumpdb`` logger as a WARNING (:func:`dumpdb.catalog.waiting.told`).
    """

    def __init__(
        self,
        path: Path,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
        on_wait: Callable[[str], None] | None = None,
    ):
        self.path = Path(path)
        self.lock_timeout = lock_timeout
        from dumpdb.catalog.waiting import told
        self.on_wait = told(on_wait)
        self.applied: list[Migration] = []  # migrations this object applied (on check or migrate)

    # -- connections -------------------------------------------------------
    def connect(self, read_only: bool, stop: Callable[[], bool] | None = None) -> duckdb.DuckDBPyConnection:
        """A new connection to the catalog file (the caller closes it), waiting up to
        ``lock_timeout`` seconds for a lock another process holds (``on_wait`` is told
        once), or until ``stop()`` is True (asked before each retry). Raises ArchiveError
        when it cannot be opened, the wait times out or is stopped. Prefer :meth:`reader`
        / :meth:`writer`, which hold it for one block only."""
        from dumpdb.catalog.waiting import Waiter, duckdb_holder

        waiter = Waiter(self.lock_timeout, self.on_wait, stop)
        while True:
            try:
                config: dict[str, str | bool | int | float | list[str]] = (
                    {} if read_only else {"storage_compatibility_version": STORAGE_COMPATIBILITY})
                return duckdb.connect(str(self.path), read_only=read_only, config=config)
            except duckdb.Error as exc:
                if not is_lock_error(exc):
                    raise _catalog_error(self.path, exc) from exc
                holder = duckdb_holder(exc, self.path.parent)
                waiter.again(
                    lambda: f"waiting for the catalog lock held by {holder} ({waiter.limit()})",  # noqa: B023
                    lambda: f"{self.path}: catalog is locked by another process: {holder}; gave up after "  # noqa: B023
                            f"{self.lock_timeout:g} s (--wait SECONDS waits longer)")

    @contextmanager
    def reader(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A read-only connection, closed on exit."""
        con = self.connect(read_only=True)
        try:
            with self.errors_mapped():
                yield con
        finally:
            con.close()

    @contextmanager
    def errors_mapped(self) -> Iterator[None]:
        """DuckDB errors that mean a damaged catalog or a full disk become
        CatalogCorrupt / StorageError (one line); others pass unchanged."""
        try:
            yield
        except duckdb.Error as exc:
            mapped = _catalog_error(self.path, exc, strict=True)
            if mapped is exc:
                raise
            raise mapped from exc

    @contextmanager
    def writer(self, stop: Callable[[], bool] | None = None) -> Iterator[duckdb.DuckDBPyConnection]:
        """A read-write connection inside one transaction (``stop``: as :meth:`connect`'s,
        for the wait for the lock).

        Commits on normal exit, rolls back if the block raises; always closes.
        """
        con = self.connect(read_only=False, stop=stop)
        try:
            with self.errors_mapped():
                con.execute("BEGIN TRANSACTION")
                try:
                    yield con
                    counts = _row_counts(con)
                except BaseException:
                    try:
                        con.execute("ROLLBACK")
                    except duckdb.Error:
                        pass  # the transaction is gone already (e.g. failed on a full disk)
                    raise
                # Still holding the only read-write connection: no other commit can come between.
                write_summary(self.path, counts, pending=True)  # killed past COMMIT: still true
                con.execute("COMMIT")
                write_summary(self.path, counts)
        finally:
            con.close()

    # -- schema ------------------------------------------------------------
    @staticmethod
    def schema_version(con: duckdb.DuckDBPyConnection) -> int:
        """Applied schema version; 0 for an empty database."""
        exists = one(con, "SELECT count(*) FROM information_schema.tables WHERE table_name = 'schema_version'")[0]
        if not exists:
            return 0
        return one(con, "SELECT coalesce(max(version), 0) FROM schema_version")[0]

    def check_intact(self, con: duckdb.DuckDBPyConnection) -> None:
        """Raise :class:`CatalogCorrupt` if the catalog file is shorter than the blocks in use
        its header counts (issue 30, item 15: a half-truncated catalog opened, ``prune`` wrote
        into it and ``migrate`` said "schema is current"; DuckDB reads a missing block only
        when a query reaches it). Used, not total, blocks: DuckDB truncates free blocks at the
        file's end and still counts them. Costs one ``PRAGMA database_size`` and one ``stat``."""
        name = one(con, "SELECT current_database()")[0]
        sizes = {r[0]: (int(r[2]), int(r[4])) for r in con.execute("PRAGMA database_size").fetchall()}
        if name not in sizes:
            return
        block_size, used_blocks = sizes[name]
        try:
            size = self.path.stat().st_size
        except OSError:
            return
        if size < block_size * used_blocks:
            raise CatalogTruncated(f"{self.path}: catalog is damaged: the file has {size} bytes but its header counts "
                                 f"{used_blocks} blocks of {block_size} bytes in use ({block_size * used_blocks} "
                                 "bytes): truncated; nothing was changed; restore it from backups/ or a bundle")

    def create(self) -> None:
        """Create a new catalog file with every migration applied.

        A new file has nothing to protect, so all migrations run in one transaction
        (several times faster than one commit each). The result is a pure function of
        the migrations, kept as a template in the user's cache
        (:mod:`dumpdb.catalog.cache`): later archives start as a copy of it.
        """
        if self.path.exists():
            raise ArchiveError(f"{self.path}: catalog already exists")
        migrations = load_migrations()
        name = f"catalog-{migrations_key(STORAGE_COMPATIBILITY)}.duckdb"
        template = disk_cache.get(name)
        if template is not None:
            with open(self.path, "xb") as f:
                f.write(template)
                f.flush()
                os.fsync(f.fileno())
            con = self.connect(read_only=False)
            try:  # the rows say when and by what this catalog was made, not its template
                con.execute("UPDATE schema_version SET applied_at = current_timestamp, dumpdb_version = ?",
                            [__version__])
            finally:
                con.close()
        else:
            con = self.connect(read_only=False)
            try:
                con.execute("BEGIN TRANSACTION")
                for mig in migrations:
                    con.execute(mig.sql)
                    con.execute("INSERT INTO schema_version (version, name, dumpdb_version) VALUES (?, ?, ?)",
                                [mig.version, mig.name, __version__])
                con.execute("COMMIT")
            finally:
                con.close()  # checkpoints: the file alone holds the catalog
            if not self.path.with_name(self.path.name + ".wal").exists():
                disk_cache.put(name, self.path.read_bytes())
        # Nothing but the migrations' own rows: what verify compares later commits with.
        write_summary(self.path, {t: 0 for t in expected_tables()} | {"schema_version": len(migrations)})

    def _checked_version(self, latest: int, keep: bool = False) -> tuple[int, duckdb.DuckDBPyConnection | None]:
        """The schema version, the file checked intact and, when current, complete; with
        ``keep`` and a current schema, the read-only connection that checked it, still open
        (else None: closed, as :meth:`reader` closes it)."""
        con = self.connect(read_only=True)
        try:
            with self.errors_mapped():
                self.check_intact(con)
                current = self.schema_version(con)
                if current == 0:
                    raise CatalogCorrupt(f"{self.path}: catalog has no schema_version table (damaged or not "
                                         "dumpdb's); restore it from backups/ or a bundle")
                if current == latest:
                    missing = expected_tables() - {r[0] for r in con.execute(
                        "SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main'").fetchall()}
                    if missing:
                        raise CatalogCorrupt(f"{self.path}: catalog lacks the table(s) {', '.join(sorted(missing))} "
                                             "(damaged); restore it from backups/ or a bundle")
        except BaseException:
            con.close()
            raise
        if keep and current == latest:
            return current, con
        con.close()
        return current, None

    def _wait_for_migration(self) -> None:
        """Return once no process holds the migrate lock (none held or no lock file: at once)."""
        try:
            with open(self.path.parent / "locks" / "migrate.lock", "rb") as lock:
                fcntl.flock(lock.fileno(), fcntl.LOCK_SH)
        except OSError:
            return

    def check(self, writable: bool) -> int:
        """Make sure the schema is current; upgrade it if older.

        Returns the schema version. Raises :class:`CatalogVersionError` when the
        catalog is newer than this dumpdb, or older and ``writable`` is False.
        """
        return self.checked(writable)[0]

    def checked(self, writable: bool, keep: bool = False) -> tuple[int, duckdb.DuckDBPyConnection | None]:
        """:meth:`check`, and with ``keep`` the read-only connection that read the schema
        version, still open for the caller's queries (the caller closes it; one connect fewer
        than check, then :meth:`reader`), or None when none is left: the schema was upgraded,
        or the file rewritten in the portable format (:meth:`make_portable` writes it, which
        this process cannot while it holds a read-only connection). Errors as :meth:`check`."""
        latest = latest_version()
        for attempt in range(5):
            try:
                current, kept = self._checked_version(latest, keep)
                break
            except CatalogTruncated:
                # The file may have been replaced since the reader opened it (another
                # process's migration or portable rewrite renames a new file into place):
                # judge it again once no migration holds the lock; a real truncation stays.
                if attempt == 4:
                    raise
                self._wait_for_migration()
                time.sleep(0.1 * (attempt + 1))
        if current == latest:
            if writable:
                number = storage_number(self.path)
                if kept is not None and number is not None and number > PORTABLE_STORAGE_NUMBER:
                    kept.close()  # make_portable rewrites the file
                    kept = None
                self.make_portable()
            return current, kept
        if current > latest:
            raise CatalogVersionError(
                f"{self.path}: catalog schema version {current} is newer than this dumpdb "
                f"{__version__} knows (up to {latest}); upgrade dumpdb"
            )
        if not writable:
            raise CatalogVersionError(
                f"{self.path}: catalog schema version {current} needs upgrading to {latest}, "
                "but the archive is read-only; run 'dumpdb migrate' with write access"
            )
        self.migrate()
        self.make_portable()
        return latest, None

    def make_portable(self) -> bool:
        """Rewrite the catalog in the storage format DuckDB >= 1.4 reads
        (``STORAGE_COMPATIBILITY``) if its file has a newer one; True if it was rewritten.

        A migration changes the schema in place and keeps the file's format, so an archive
        from before that setting (DuckDB 2's default format) stayed unreadable to DuckDB 1.x
        (issue 30). The copy (``COPY FROM DATABASE``: tables, rows, sequences with their
        values, constraints, comments) is made while this process holds the only
        read-write connection, written beside the catalog, fsynced and renamed over it:
        a crash leaves the old file whole.
        """
        number = storage_number(self.path)
        if number is None or number <= PORTABLE_STORAGE_NUMBER:
            return False
        tmp = self.path.with_name(f"{self.path.name}.portable-{os.getpid()}")
        # under the migrate lock, like a migration: a process opening the archive meanwhile
        # waits for it before it judges the file (check's truncation re-check)
        try:
            (self.path.parent / "locks").mkdir(exist_ok=True)
            lock = open(self.path.parent / "locks" / "migrate.lock", "a+")  # noqa: SIM115
        except OSError:
            lock = None
        try:
            if lock is not None:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            return self._rewrite_portable(tmp)
        finally:
            if lock is not None:
                lock.close()

    def _rewrite_portable(self, tmp: Path) -> bool:
        con = self.connect(read_only=False)
        try:
            with self.errors_mapped():
                number = storage_number(self.path)  # another process may have done it meanwhile
                if number is None or number <= PORTABLE_STORAGE_NUMBER:
                    return False
                tmp.unlink(missing_ok=True)
                con.execute("CHECKPOINT")
                name = con.execute("SELECT current_database()").fetchone()[0]  # type: ignore[index]
                con.execute(f"ATTACH '{_sql_text(tmp)}' AS dumpdb_portable (STORAGE_VERSION '{STORAGE_COMPATIBILITY}')")
                try:
                    con.execute(f'COPY FROM DATABASE "{name}" TO dumpdb_portable')
                finally:
                    con.execute("DETACH dumpdb_portable")
                with open(tmp, "rb+") as f:
                    os.fsync(f.fileno())
                os.replace(tmp, self.path)
                dir_fd = os.open(self.path.parent, os.O_RDONLY)
                try:
                    os.fsync(dir_fd)
                finally:
                    os.close(dir_fd)
                return True
        finally:
            con.close()
            tmp.unlink(missing_ok=True)

    def migrate(self) -> list[Migration]:
        """Apply pending migrations, backing the catalog up first. Returns those applied.

        Two processes opening an old archive at once must not both migrate: the
        work happens under an exclusive lock file, and the version is read again
        once the lock is held (the loser finds nothing left to do).
        """
        locks = self.path.parent / "locks"
        locks.mkdir(exist_ok=True)
        with open(locks / "migrate.lock", "a+") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                with self.reader() as con:
                    self.check_intact(con)
                    current = self.schema_version(con)
                if current == 0:
                    raise CatalogCorrupt(f"{self.path}: catalog has no schema_version table (damaged or not "
                                         "dumpdb's); nothing migrated; restore it from backups/ or a bundle")
                pending = [m for m in load_migrations() if m.version > current]
                if not pending:
                    return []
                backups = self.path.parent / "backups"
                backups.mkdir(exist_ok=True)
                stamp = datetime.now().strftime("%Y%m%dT%H%M%S")
                shutil.copy2(self.path, backups / f"catalog-v{current}-{stamp}.duckdb")
                applied = self._apply(from_version=current)
                self.applied += applied
                return applied
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def _apply(self, from_version: int) -> list[Migration]:
        applied = []
        for mig in load_migrations():
            if mig.version <= from_version:
                continue
            with self.writer() as con:
                if self.schema_version(con) >= mig.version:
                    continue  # applied meanwhile by another process
                con.execute(mig.sql)
                con.execute(
                    "INSERT INTO schema_version (version, name, dumpdb_version) VALUES (?, ?, ?)",
                    [mig.version, mig.name, __version__],
                )
            applied.append(mig)
        return applied


def one(con: duckdb.DuckDBPyConnection, sql: str, params: list | None = None) -> tuple[Any, ...]:
    """The row of a query that returns exactly one (an aggregate, ``SELECT count(*) ...``).

    Raises CatalogCorrupt when it returns none (the catalog lacks what the query reads)."""
    row = con.execute(sql, params or []).fetchone()
    if row is None:
        raise CatalogCorrupt(f"query returned no row: {sql}")
    return row


def insert_arrow(
    con: duckdb.DuckDBPyConnection,
    table: str,
    rows: pa.Table,
    prefix: str = "",
    ignore_conflicts: bool = False,
) -> None:
    """Insert an Arrow table into ``table``, matching columns by name.

    ``prefix`` is extra select items placed before ``*`` (e.g.
    ``"nextval('tensor_id_seq') AS tensor_id,"``). ``ignore_conflicts`` skips
    rows whose primary key exists (``INSERT OR IGNORE``). Never row by row: one
    ``INSERT ... SELECT`` over the registered Arrow table (reference
    performance.md e.: ~120x faster than executemany).
    """
    if rows.num_rows == 0:
        return
    name = f"_dumpdb_batch_{table}"
    con.register(name, rows)
    try:
        verb = "INSERT OR IGNORE INTO" if ignore_conflicts else "INSERT INTO"
        con.execute(f"{verb} {table} BY NAME SELECT {prefix} * FROM {name}")
    finally:
        con.unregister(name)


def _sql_text(path: Path) -> str:
    """``path`` inside a single-quoted SQL string."""
    return str(path).replace("'", "''")
