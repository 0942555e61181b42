"""The Python query API over an archive: :class:`Archive` and :func:`open`.

The directory itself (layout, marker, creation, checks, the tensor store) is
:mod:`dumpdb.archive_dir`; its names are re-exported here.

Queries go through DuckDB and come back as Arrow tables (``Archive.sql``);
tensors come back as numpy arrays (``Archive.tensor``, ``Archive.tensors``).
Each call opens the catalog read-only and closes it again, so other processes
can ingest meanwhile; ``with archive:`` keeps one read connection for a block of
calls (faster, but it holds off writers until the block ends).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import duckdb

from dumpdb.archive_dir import (  # re-exported: the archive directory's names stay reachable here
    CATALOG,
    DEFAULT_ARCHIVE,
    FORMAT_NAME,
    FORMAT_VERSION,
    MARKER,
    STORE,
    check_marker,
    check_store_url,
    create_archive,
    default_archive_path,
    is_archive,
    open_tensor_store,
    store_config,
)
from dumpdb.catalog import DEFAULT_LOCK_TIMEOUT, Catalog, one
from dumpdb.catalog.locations import LocationIndex, TensorLocation
from dumpdb.errors import (
    ArchiveError,
    DumpdbError,
    PayloadCorrupt,
    PayloadMissing,
    TensorNotFound,
    no_such_run,
    require_run,
)
from dumpdb.sql_sandbox import PrivateTemp, SqlLimits, configure, lock_down, refuse_file_functions, run_interruptible

if TYPE_CHECKING:  # numpy and pyarrow are imported where used: a query CLI starts without them
    import numpy as np
    import pyarrow as pa

    from dumpdb.storage.store import TensorStore

__all__ = ["CATALOG", "DEFAULT_ARCHIVE", "FORMAT_NAME", "FORMAT_VERSION", "MARKER", "STORE", "Archive",
           "CatalogFile", "CatalogSource", "check_marker", "check_store_url", "create_archive",
           "default_archive_path", "is_archive", "lock_down", "open", "open_tensor_store", "store_config"]

# Per-run tensor counts (README "Run state"): stored + statistics_only + pruned = tensors.
_STORED = "content_hash IS NOT NULL AND pruned_at IS NULL"
_COUNTS_SQL = (f"count(tensor_id) FILTER ({_STORED}) AS stored, "
               "count(tensor_id) FILTER (content_hash IS NULL) AS statistics_only, "
               "count(tensor_id) FILTER (pruned_at IS NOT NULL) AS pruned, max(pruned_at) AS pruned_at, "
               f"CAST(coalesce(sum(nbytes) FILTER ({_STORED}), 0) AS BIGINT) AS bytes_in, "
               "CAST(coalesce(sum(nbytes) FILTER (pruned_at IS NOT NULL), 0) AS BIGINT) AS bytes_pruned")

_TENSOR_LOCATION_SQL = """
SELECT t.tensor_id, t.dtype, t.shape, t.nbytes, t.content_hash, t.source_file,
       b.array_path, b.elem_offset, b.elem_count, b.content_hash IS NOT NULL AS stored,
       t.format, t.original_shape, t.original_format, t.pruned_at, t.run, t.op_name, t.io, t.slot
FROM tensors t LEFT JOIN blobs b ON b.content_hash = t.content_hash
"""


def _sql_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


_ATTACH_TYPES = ("ATTACH", "DETACH")

# DuckDB instances inherited through fork(): never used, never closed (see Archive._query_instance)
_FORKED_INSTANCES: list[Any] = []


T = TypeVar("T")


def _remove_temps(temps: dict[int, PrivateTemp]) -> None:
    for temp in temps.values():
        temp.remove()
    temps.clear()


# the catalog's own tables and views (Archive.tables, Archive.columns)
_TABLES_SQL = """
SELECT table_name AS "table", 'table' AS kind, estimated_size, comment FROM duckdb_tables()
WHERE database_name = current_database() AND schema_name = 'main' AND NOT internal AND NOT temporary
UNION ALL
SELECT view_name, 'view', NULL, comment FROM duckdb_views()
WHERE database_name = current_database() AND schema_name = 'main' AND NOT internal AND NOT temporary
ORDER BY 1
"""


def _sql_identifier(name: str) -> str:
    """``name`` as a quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def _refuse_attach(query: str) -> None:
    """Refuse ATTACH/DETACH in a sandboxed query (README "Safety"): the sandbox may open
    the catalog file itself (``allowed_paths``), so a query must not detach it and attach
    it again writable. Unparsable SQL goes on to DuckDB, which reports the syntax error."""
    try:
        statements = duckdb.extract_statements(query)
    except duckdb.Error:
        return
    for statement in statements:
        kind = statement.type.name
        if kind in _ATTACH_TYPES:
            raise DumpdbError(f"SQL refused: {kind} is disabled: dumpdb sql reads the archive's catalog "
                              "only (--allow-files / allow_files=True permits file access)")


class CatalogSource(Protocol):
    """Where an :class:`Archive`'s catalog comes from: the archive directory's DuckDB file
    (:class:`CatalogFile`) or a bundle's Parquet files as DuckDB views
    (:class:`dumpdb.archival.remote_bundle.BundleCatalog`). The facade is the same over both.

    ``path`` names it in messages; ``refusal`` is None for a writable source, else the
    one-line reason every write is refused (:class:`ArchiveError`)."""

    @property
    def path(self) -> Path | str: ...

    @property
    def schema_version(self) -> int: ...

    @property
    def refusal(self) -> str | None: ...

    @property
    def catalog(self) -> Catalog: ...  # the writable Catalog; ArchiveError when there is none

    @property
    def writable(self) -> bool: ...

    def connect(self) -> duckdb.DuckDBPyConnection: ...  # a plain read-only connection, caller closes

    def reader(self) -> AbstractContextManager[duckdb.DuckDBPyConnection]: ...  # one for a block

    def prepare(self, con: duckdb.DuckDBPyConnection) -> None: ...  # a new sandbox instance, before lock_down

    def attach(self, con: duckdb.DuckDBPyConnection) -> None: ...  # make the catalog the instance's default

    def detach(self, con: duckdb.DuckDBPyConnection) -> None: ...  # after a query on a kept instance

    def locations(self, reader: Callable[[], Any]) -> LocationIndex: ...

    def open_store(self, read_only: bool, storage_options: dict[str, Any]) -> TensorStore: ...

    @property
    def store_url(self) -> str | None: ...


class CatalogFile:
    """The catalog source of an archive directory: its ``catalog.duckdb`` (checked, and
    upgraded when writable, on construction), attached READ_ONLY to sandbox instances for one
    query at a time. Raises ArchiveError (not an archive) and CatalogVersionError (newer)."""

    refusal: str | None = None

    def __init__(self, path: Path, lock_timeout: float = DEFAULT_LOCK_TIMEOUT, on_wait: Any = None,
                 keep: bool = False):
        self.path = Path(path)
        check_marker(self.path)
        self._catalog = Catalog(self.path / CATALOG, lock_timeout=lock_timeout, on_wait=on_wait)
        # keep: the connection that checked the schema, for the caller (take_kept)
        self.schema_version, self._kept = self._catalog.checked(writable=self.writable, keep=keep)

    def take_kept(self) -> duckdb.DuckDBPyConnection | None:
        """The read-only connection the schema check used, when made with ``keep`` and one
        is left (:meth:`Catalog.checked`), else None; the caller closes it. Once only."""
        kept, self._kept = self._kept, None
        return kept

    def errors_mapped(self) -> AbstractContextManager[None]:
        """DuckDB errors of a block of queries that mean a damaged catalog or a full disk as
        :meth:`reader`'s (CatalogCorrupt, StorageError: one line); others pass unchanged."""
        return self._catalog.errors_mapped()

    @property
    def catalog(self) -> Catalog:
        """The archive's :class:`~dumpdb.catalog.Catalog`."""
        return self._catalog

    @property
    def writable(self) -> bool:
        """True if this process may write the archive (directory and catalog writable)."""
        return os.access(self.path, os.W_OK) and os.access(self.path / CATALOG, os.W_OK)

    def connect(self) -> duckdb.DuckDBPyConnection:
        """A read-only connection to the catalog file (waits for a writer's lock)."""
        return self._catalog.connect(read_only=True)

    def reader(self) -> AbstractContextManager[duckdb.DuckDBPyConnection]:
        """:meth:`Catalog.reader`: a read-only connection for one block."""
        return self._catalog.reader()

    def prepare(self, con: duckdb.DuckDBPyConnection) -> None:
        """Let the sandbox instance open only the catalog and the WAL files DuckDB 2 may read
        when it attaches one a writer left."""
        paths = ", ".join(_sql_literal(f"{self._catalog.path}{suffix}")
                          for suffix in ("", ".wal", ".wal.checkpoint", ".wal.recovery"))
        con.execute(f"SET allowed_paths = [{paths}]")

    def attach(self, con: duckdb.DuckDBPyConnection) -> None:
        """ATTACH the catalog READ_ONLY as ``catalog`` and make it the default database,
        waiting (``lock_timeout``) while another process holds it for writing."""
        from dumpdb.catalog.connection import is_lock_error
        from dumpdb.catalog.waiting import Waiter, duckdb_holder

        catalog = self._catalog
        waiter = Waiter(catalog.lock_timeout, catalog.on_wait)
        while True:
            try:
                con.execute(f"ATTACH {_sql_literal(str(catalog.path))} AS catalog (READ_ONLY)")
                break
            except duckdb.Error as exc:
                if not is_lock_error(exc):
                    raise ArchiveError(f"{catalog.path}: cannot open catalog: "
                                       f"{str(exc).splitlines()[0]}") from exc
                holder = duckdb_holder(exc, self.path)
                waiter.again(  # another process commits: wait as Catalog.connect does
                    lambda: f"waiting for the catalog lock held by {holder} ({waiter.limit()})",  # noqa: B023
                    lambda: f"{catalog.path}: catalog is locked by another process: {holder}; "  # noqa: B023
                            f"gave up after {catalog.lock_timeout:g} s (--wait SECONDS waits longer)")
        con.execute("USE catalog")

    def detach(self, con: duckdb.DuckDBPyConnection) -> None:
        """DETACH the catalog: a kept instance holds no lock between queries."""
        con.execute("USE memory")
        con.execute("DETACH catalog")

    def locations(self, reader: Callable[[], Any]) -> LocationIndex:
        """The location index, reloaded when the catalog file changes."""
        return LocationIndex(self._catalog.path, reader)

    def open_store(self, read_only: bool, storage_options: dict[str, Any]) -> TensorStore:
        """:func:`~dumpdb.archive_dir.open_tensor_store` of the directory."""
        return open_tensor_store(self.path, read_only, storage_options)

    @property
    def store_url(self) -> str | None:
        """The object-storage URL of the tensor store, or None for the local ``tensors.zarr``."""
        return store_config(self.path)[0]


class Archive:
    """An open archive. Create with :func:`dumpdb.open`.

    ``path`` is an archive directory, or an object-storage URL of a bundle opened read-only
    in place (``s3://BUCKET/PREFIX``: :class:`dumpdb.archival.remote_bundle.BundleCatalog`;
    every write raises ArchiveError); ``source`` gives the catalog source explicitly.

    Raises :class:`ArchiveError` if ``path`` is not an archive, and
    :class:`~dumpdb.errors.CatalogVersionError` if its schema is newer than
    this dumpdb (an older one is upgraded when the archive is writable).

    ``verify_reads`` (default True): every payload read (``tensor``, ``tensors``, compare,
    scan) is hashed again and checked against its ``content_hash``; False opts out (the
    CLI's ``--no-verify``). A mismatch raises :class:`~dumpdb.errors.PayloadCorrupt`.

    ``hold`` (default False): open holding a read-only catalog connection, as inside ``with
    archive:`` (:attr:`holding`; :meth:`close` or the ``with`` block's end releases it), the
    connection that checked the schema when one is left: one DuckDB connect instead of two
    for the open and the first query, and none for the later ones. It holds off other
    processes' writes until released (the CLI holds it for a statistics compare, about a
    second).
    """

    # bounds of sql()'s sandbox (memory, threads, statement timeout): None = SqlLimits.from_env()
    sql_limits: SqlLimits | None = None
    verify_reads = True

    def __init__(self, path: str | os.PathLike, *, lock_timeout: float = DEFAULT_LOCK_TIMEOUT, on_wait=None,
                 storage_options: dict[str, Any] | None = None, sql_limits: SqlLimits | None = None,
                 verify_reads: bool = True, source: CatalogSource | None = None, hold: bool = False):
        self.verify_reads = verify_reads
        if sql_limits is not None:
            sql_limits.check()
            self.sql_limits = sql_limits
        self._temps: dict[int, PrivateTemp] = {}  # spill directory of each sandbox instance, by id()
        weakref.finalize(self, _remove_temps, self._temps)  # an Archive dropped without close()
        self.storage_options = dict(storage_options or {})  # secrets allowed: never stored or printed
        if source is None:
            from dumpdb.storage.backends import is_url  # (no zarr import: sql starts fast)

            if is_url(path):  # an object-storage URL: a bundle
                from dumpdb.archival.remote_bundle import BundleCatalog

                source = BundleCatalog(str(path), self.storage_options)
            else:
                source = CatalogFile(Path(path), lock_timeout, on_wait, keep=hold)
        self.source: CatalogSource = source
        self.path: Path = source.path  # type: ignore[assignment]  # a bundle's URL: messages name it
        self.schema_version: int = source.schema_version
        self._store: TensorStore | None = None  # opened on first tensor read: zarr costs ~0.2 s to import
        self._held: duckdb.DuckDBPyConnection | None = None
        self._held_sandbox: duckdb.DuckDBPyConnection | None = None  # sql()'s, while held
        self._query_db: duckdb.DuckDBPyConnection | None = None  # sql()'s DuckDB instance, kept (see _sandbox)
        self._query_lock = threading.Lock()
        self._query_pid = os.getpid()  # whose instance _query_db is (see _query_instance)
        self._locations: LocationIndex | None = None  # tensor_id -> payload location, loaded on first read
        if hold:  # as `with archive:` entered, on the connection that checked the schema when it is left
            take = getattr(source, "take_kept", None)
            self._held = take() if take is not None else None
            self.__enter__()

    def __repr__(self) -> str:
        return f"<dumpdb.Archive {str(self.path)!r}>"

    @property
    def catalog(self) -> Catalog:
        """The writable :class:`~dumpdb.catalog.Catalog` (ArchiveError for a bundle opened in place)."""
        return self.source.catalog

    def refuse_writes(self) -> None:
        """Raise ArchiveError if this archive cannot be changed (a bundle opened in place)."""
        if self.source.refusal is not None:
            raise ArchiveError(self.source.refusal)

    @property
    def store(self) -> TensorStore:
        """The :class:`~dumpdb.storage.store.TensorStore` (read-only), opened on first use."""
        if self._store is None:
            self._store = self.source.open_store(True, self.storage_options)
            self._store.verify = self.verify_reads
        return self._store

    @property
    def store_url(self) -> str | None:
        """The object-storage URL of the tensor store, or None for the local ``tensors.zarr``."""
        return self.source.store_url

    def writable_store(self) -> TensorStore:
        """A :class:`~dumpdb.storage.store.TensorStore` open for writing (for a
        :class:`~dumpdb.storage.store.StoreWriter`; gc, import). Its writes are
        durable when they return (:mod:`dumpdb.storage.local`; an object store's PUT).
        ArchiveError for a bundle opened in place."""
        self.refuse_writes()
        return self.source.open_store(False, self.storage_options)

    @property
    def writable(self) -> bool:
        """True if this process may write the archive (directory and catalog writable)."""
        return self.source.writable

    # -- connections -------------------------------------------------------
    def __enter__(self) -> Archive:
        if self._held is None:
            self._held = self.source.connect()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Release the connections this object keeps: the one ``with archive:`` holds and
        the query instance :meth:`sql` keeps between calls (it holds no catalog lock)."""
        if self._held is not None:
            self._held.close()
            self._held = None
        if self._held_sandbox is not None:
            self._close_instance(self._held_sandbox)
            self._held_sandbox = None
        if self._query_db is not None:
            self._close_instance(self._query_db)
            self._query_db = None

    @property
    def holding(self) -> bool:
        """True inside ``with archive:`` (a read-only catalog connection is held open)."""
        return self._held is not None

    @contextmanager
    def reader(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A read-only catalog connection for a block of queries: the one ``with
        archive:`` holds, else a new one closed when the block ends. Raises
        ArchiveError if the catalog stays locked past ``lock_timeout``."""
        if self._held is not None:
            mapped = getattr(self.source, "errors_mapped", None)
            with mapped() if mapped is not None else nullcontext():
                yield self._held
        else:
            with self.source.reader() as con:
                yield con

    # -- queries -----------------------------------------------------------
    def sql(self, query: str, params: list | dict | None = None, *, allow_files: bool = False,
            timeout: float | None = None) -> pa.Table:
        """Run a SQL query on the catalog (read-only) and return a ``pyarrow.Table``.

        Relations: runs, tensors, blobs, arrays, ops, execution_order,
        graph_executions, ingest_errors, schema_version (README "Catalog
        schema"). Raises :class:`DumpdbError` with DuckDB's message on a bad
        query or an attempt to write.

        Sandboxed (README "Safety"): the query runs in its own DuckDB instance
        with the catalog attached read-only, ``enable_external_access = false``
        and ``lock_configuration = true``, so ``COPY ... TO``, ``read_csv`` /
        ``read_text`` / ``read_parquet`` of files, ``ATTACH``, ``INSTALL`` and
        ``LOAD`` fail (:class:`DumpdbError` saying file access is disabled).
        ``allow_files=True`` lifts this for a user who wants DuckDB to read or
        write files (the catalog itself stays read-only).

        Bounded (:mod:`dumpdb.sql_sandbox`, issue 30 item 13): spill files in a private
        directory, DuckDB's memory limit and threads from :attr:`sql_limits` (default 2GB
        and 2 threads, ``$DUMPDB_SQL_MEMORY_LIMIT`` / ``$DUMPDB_SQL_THREADS``), ``timeout``
        seconds per query (default :attr:`sql_limits`'s, none) after which it is stopped
        (:class:`~dumpdb.sql_sandbox.QueryTimeout`). A Ctrl-C stops the running query and
        raises :exc:`KeyboardInterrupt` at once.
        """
        import pyarrow as pa

        return self._run_query(query, params, allow_files, timeout,
                               lambda rel: rel.to_arrow_table() if rel is not None else pa.table({}))

    def frame(self, query: str, params: list | dict | None = None, *, library: str = "pandas",
              allow_files: bool = False) -> Any:
        """The result of :meth:`sql` as a data frame: ``library="pandas"`` (a
        ``pandas.DataFrame``) or ``"polars"`` (a ``polars.DataFrame``), columns and types as
        Arrow gives them. Both come with ``pip install 'dumpdb[frames]'``; without the library
        raises :class:`DumpdbError` saying so. Errors of the query as :meth:`sql`."""
        if library not in ("pandas", "polars"):
            raise DumpdbError(f"frame(library={library!r}): use 'pandas' or 'polars'")
        import importlib

        try:
            module = importlib.import_module(library)
        except ImportError:
            raise DumpdbError(f"frame(library={library!r}) needs {library}, which is not installed: "
                              "pip install 'dumpdb[frames]'") from None
        table = self.sql(query, params, allow_files=allow_files)
        return table.to_pandas() if library == "pandas" else module.from_arrow(table)

    def sql_rows(self, query: str, params: list | dict | None = None, *, allow_files: bool = False,
                 timeout: float | None = None) -> tuple[list[str], list[tuple]]:
        """Like :meth:`sql`, as (column names, rows of Python values): no pyarrow or
        numpy import, so the ``dumpdb sql`` command starts fast. Same sandbox, bounds and errors."""
        return self._run_query(query, params, allow_files, timeout,
                               lambda rel: (list(rel.columns), rel.fetchall()) if rel is not None else ([], []))

    def _limits(self) -> SqlLimits:
        return self.sql_limits if self.sql_limits is not None else SqlLimits.from_env()

    def _run_query(self, query: str, params: list | dict | None, allow_files: bool, timeout: float | None,
                   fetch: Callable[[Any], T]) -> T:
        """``fetch`` of ``query``'s relation, the query planned and run on a helper thread
        (:func:`~dumpdb.sql_sandbox.run_interruptible`: Ctrl-C and ``timeout`` stop it)."""
        if timeout is None:
            timeout = self._limits().timeout
        elif not timeout > 0:
            raise DumpdbError(f"SQL timeout {timeout}: give a number of seconds above 0")
        with self._connection_for(query, allow_files) as con:
            return run_interruptible(con, lambda: self._fetch(con, query, params, fetch), timeout)

    @contextmanager
    def _connection_for(self, query: str, allow_files: bool) -> Iterator[Any]:
        if not allow_files:
            _refuse_attach(query)
            refuse_file_functions(query)
        with (self.reader() if allow_files else self._sandbox()) as con:
            yield con

    @staticmethod
    def _fetch(con: Any, query: str, params: list | dict | None, fetch: Callable[[Any], T]) -> T:
        """``fetch(con.sql(query))`` with DuckDB's errors as one-line :class:`DumpdbError`."""
        try:
            return fetch(con.sql(query, params=params))
        except duckdb.PermissionException as exc:
            first = " ".join(str(exc).split())
            raise DumpdbError(f"SQL refused: {first}; dumpdb sql reads the catalog only "
                              "(--allow-files / allow_files=True permits file access)") from exc
        except duckdb.InterruptException:
            raise
        except duckdb.Error as exc:
            if "configuration has been locked" in str(exc):
                raise DumpdbError(f"SQL refused: {' '.join(str(exc).split())}; settings cannot be "
                                  "changed in dumpdb sql (--allow-files lifts the sandbox)") from exc
            if "Out of Memory" in str(exc):
                raise DumpdbError(f"SQL error: {' '.join(str(exc).split())[:300]} (the sandbox's memory limit "
                                  "is --memory-limit / $DUMPDB_SQL_MEMORY_LIMIT)") from exc
            raise DumpdbError(f"SQL error: {str(exc).strip()}") from exc

    @contextmanager
    def _sandbox(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A private in-memory DuckDB with the catalog attached READ_ONLY as the default
        database, file access disabled and the configuration locked: its own instance, so
        the settings never reach other connections of this process.

        Inside ``with archive:`` one such connection is kept for the block. Outside, the
        instance is kept between calls (creating one costs tens of milliseconds; attaching
        the catalog to a live one about a millisecond) and the catalog is attached for the
        one query, then detached: no lock is held between calls, so other processes can
        commit, and every query sees the last commit. The instance may attach only the
        catalog and its WAL (``allowed_paths``); ``ATTACH``/``DETACH`` in a query are
        refused before it runs (:func:`_refuse_attach`), and while the catalog is attached
        DuckDB refuses a ``COPY ... TO`` either file. Waits for a catalog lock like
        :meth:`Catalog.reader`."""
        if self._held is not None:
            if self._held_sandbox is None:
                self._held_sandbox = self._open_sandbox()
            yield self._held_sandbox
            return
        with self._query_instance() as con:
            yield con

    @contextmanager
    def _query_instance(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """The kept query instance with the catalog attached for one query (see :meth:`_sandbox`)."""
        if self._query_pid != os.getpid():
            # a forked child (e.g. a DataLoader worker): the parent's DuckDB instance and lock
            # are copies it must not use; it makes its own. The copy is kept referenced, never
            # closed: closing it here would tear down threads that exist only in the parent
            # (measured: the child dies of SIGSEGV).
            _FORKED_INSTANCES.append(self._query_db)
            self._query_db, self._query_lock, self._query_pid = None, threading.Lock(), os.getpid()
        with self._query_lock:
            if self._query_db is None:
                self._query_db = self._locked_instance()
            con = self._query_db
            self.source.attach(con)
            try:
                yield con
            finally:
                try:
                    self.source.detach(con)
                except Exception:  # noqa: BLE001 - e.g. "Query interrupted" after a Ctrl-C: the
                    # first error (or the KeyboardInterrupt) is the one to report; start anew
                    self._query_db = None
                    self._close_instance(con)

    def _open_sandbox(self) -> duckdb.DuckDBPyConnection:
        con = self._locked_instance()
        try:
            self.source.attach(con)
        except BaseException:
            self._close_instance(con)
            raise
        return con

    def _close_instance(self, con: duckdb.DuckDBPyConnection) -> None:
        """Close a sandbox instance and remove its private spill directory."""
        con.close()
        temp = getattr(self, "_temps", {}).pop(id(con), None)
        if temp is not None:
            temp.remove()

    def _locked_instance(self) -> duckdb.DuckDBPyConnection:
        """A new in-memory DuckDB that may open only the catalog (:meth:`CatalogSource.prepare`),
        with its configuration locked (README "Safety")."""
        con = duckdb.connect(":memory:")
        temp = PrivateTemp()
        self._temps[id(con)] = temp
        try:
            self.source.prepare(con)
            configure(con, self._limits(), temp)  # private spill directory, memory and threads
            lock_down(con)
        except BaseException:
            self._close_instance(con)
            raise
        return con

    def runs(self) -> pa.Table:
        """One row per run (in ingest order) with what happened to its tensors.

        Columns: ``run``, ``status`` (as recorded), ``state`` (the status as it is now:
        an ``ingesting`` run whose process is gone reads ``interrupted (pid N gone since
        ...)``, see :func:`dumpdb.catalog.runstate.run_state`), ``complete_command`` (the
        ingest command that completes an interrupted run, else null), ``layout``,
        ``framework``, ``framework_version``; counts ``tensors`` = ``stored`` +
        ``statistics_only`` + ``pruned`` (README "Run state"), ``failed`` (files in
        ``ingest_errors``), ``pruned_at`` (the last prune); ``bytes_in`` (payload bytes of
        the stored tensors), ``bytes_pruned`` (of the pruned ones); ``ingest_started``,
        ``ingest_finished``, ``source_path``.
        """
        import pyarrow as pa

        table = self.sql(f"""
            SELECT r.run, r.status, r.layout, r.framework, r.framework_version,
                   count(t.tensor_id) AS tensors, {_COUNTS_SQL},
                   (SELECT count(*) FROM ingest_errors e WHERE e.run = r.run) AS failed,
                   r.ingest_started, r.ingest_finished, r.source_path
            FROM runs r LEFT JOIN tensors t USING (run)
            GROUP BY ALL ORDER BY r.ingest_started""")
        states = [self._state(r) for r in table.select(
            ["run", "status", "source_path", "ingest_finished"]).to_pylist()]
        table = table.add_column(2, "state", pa.array([s for s, _ in states], pa.string()))
        return table.add_column(3, "complete_command", pa.array([c for _, c in states], pa.string()))

    def _state(self, row: dict) -> tuple[str, str | None]:
        from dumpdb.catalog.runstate import run_state

        return run_state(self.path, row["run"], row["status"], row["source_path"], row["ingest_finished"])

    def show(self, run: str) -> dict[str, Any]:
        """Summary of one run: metadata, ranks, graphs, iterations, counts and bytes.

        Counts (README "Run state"; they add up): ``tensors`` = ``stored`` (payload
        in the store) + ``statistics_only`` (the dump had no payload) + ``pruned``
        (payload dropped by prune; ``pruned_first``/``pruned_last`` say when);
        ``stored`` = ``payloads_stored`` (payloads this run stored first) +
        ``deduplicated`` (tensors whose payload was already stored, by another tensor of
        the run or another run); ``distinct_payloads`` the distinct payloads of the
        stored tensors; ``errors`` (also ``failed``) the files that did not ingest
        (``ingest_errors``: no tensor row). ``state`` / ``complete_command`` as in
        :meth:`runs`.

        Bytes: ``bytes_in`` payload bytes of the stored tensors, ``bytes_pruned`` of the
        pruned ones; ``bytes_stored`` the compressed bytes of the payloads this run
        stored first that are still in the store, ``bytes_reclaimable`` those of them no
        tensor uses any more (``gc`` frees them); ``ratio`` = bytes_in / bytes_stored
        (None when nothing is stored). Raises :class:`DumpdbError` for an unknown run.
        """
        with self.reader() as con:
            meta = con.sql("SELECT * FROM runs WHERE run = ?", params=[run]).to_arrow_table().to_pylist()
            if not meta:
                raise no_such_run(run, self.path, con)
            info = meta[0]
            agg = con.execute(
                f"""
                SELECT count(*), {_COUNTS_SQL}, min(pruned_at), count(DISTINCT content_hash) FILTER ({_STORED}),
                       list(DISTINCT rank ORDER BY rank), list(DISTINCT graph_id ORDER BY graph_id),
                       list(DISTINCT iteration ORDER BY iteration)
                FROM tensors WHERE run = ?
                """,
                [run],
            ).fetchone()
            live = f"(SELECT content_hash FROM tensors WHERE run = ? AND {_STORED})"
            first = con.execute(
                f"SELECT count(*) FILTER (content_hash IN {live}), coalesce(sum(stored_bytes), 0), "
                "coalesce(sum(stored_bytes) FILTER (content_hash NOT IN (SELECT content_hash FROM tensors "
                "WHERE content_hash IS NOT NULL AND pruned_at IS NULL)), 0) FROM blobs WHERE first_run = ?",
                [run, run]).fetchone()
            errors = one(con, "SELECT count(*) FROM ingest_errors WHERE run = ?", [run])[0]
        assert agg is not None and first is not None  # aggregates: always one row
        (tensors, stored, statistics_only, pruned, pruned_last, bytes_in, bytes_pruned, pruned_first, distinct,
         ranks, graphs, iterations) = agg
        state, command = self._state(info)
        info.update(
            state=state,
            complete_command=command,
            tensors=tensors,
            stored=stored,
            statistics_only=statistics_only,
            pruned=pruned,
            pruned_first=pruned_first,
            pruned_last=pruned_last,
            distinct_payloads=distinct,
            payloads_stored=first[0],
            deduplicated=stored - first[0],
            bytes_in=bytes_in,
            bytes_pruned=bytes_pruned,
            bytes_stored=first[1],
            bytes_reclaimable=first[2],
            ratio=(bytes_in / first[1]) if first[1] else None,
            # list() over no rows is NULL: a run with 0 tensors has no ranks, graphs, iterations
            ranks=[r for r in ranks or () if r is not None],
            graphs=[g for g in graphs or () if g is not None],
            iterations=[i for i in iterations or () if i is not None],
            errors=errors,
            failed=errors,
        )
        return info

    # -- tensors -----------------------------------------------------------
    def tensor(self, tensor_id: int | None = None, *, run: str | None = None, iteration: int | None = None,
               op_name: str | None = None, io: str = "output", slot: int = 0, rank: int | None = 0,
               graph_id: int | None = None, host_format: bool = False, verify: bool | None = None) -> np.ndarray:
        """The payload of one tensor as a numpy array, bit for bit as dumped.

        By id: ``tensor(17)``. By key: ``tensor(run="fp32", iteration=0,
        op_name="Default/.../Conv2D-op0", io="output", slot=0)`` (``run`` only when the
        archive holds more than one run, else a :class:`DumpdbError` lists them); ``op_name``
        may be the file-name form or the scope name (with ``/``); ``rank`` also
        matches tensors of layouts that record no rank (NULL); ``slot=None``
        matches tensors without a slot (msprobe kwargs and parameters). The dtype is
        the catalog ``dtype`` (bfloat16 as ``ml_dtypes.bfloat16``), the shape
        the catalog ``shape``.

        ``host_format=True`` converts a tensor dumped in a device format
        (``format`` NC1HWC0, FRACTAL_Z, FRACTAL_NZ; CANN dumps) to its host
        layout and ``original_shape`` (see :mod:`dumpdb.formats`); tensors already
        in a host format come back unchanged.

        The bytes read are hashed again (xxh3-128) and compared with the tensor's
        ``content_hash`` (a damaged shard never comes back silently); ``verify=False``
        skips that (None: the archive's ``verify_reads``, True by default).

        Raises :class:`TensorNotFound` when nothing (or more than one tensor)
        matches, :class:`DumpdbError` when only statistics were dumped or a
        device format cannot be converted, :class:`PayloadMissing` when the stored
        bytes are gone and :class:`PayloadCorrupt` when their length or hash is
        wrong (both name run, op_name, io and slot).
        """
        if tensor_id is None:
            tensor_id = self.find_tensor_id(run=run, iteration=iteration, op_name=op_name, io=io,
                                            slot=slot, rank=rank, graph_id=graph_id)
        return self._read_located(int(tensor_id), self.locations.get(int(tensor_id)), host_format, verify)

    @property
    def locations(self) -> LocationIndex:
        """The in-memory index of every tensor's payload location
        (:class:`~dumpdb.catalog.locations.LocationIndex`): reads by ``tensor_id`` need no
        catalog query, and it reloads itself after any commit to the catalog."""
        if self._locations is None:
            self._locations = self.source.locations(self.reader)
        return self._locations

    def _read_located(self, tensor_id: int, loc: TensorLocation | None, host_format: bool,
                      verify: bool | None) -> np.ndarray:
        """Read a tensor from its indexed location. Anything but a readable payload read
        cleanly (unknown id, statistics only, pruned, missing or damaged bytes) goes the
        full way: the catalog row with the file and key that messages name."""
        if loc is not None and loc.readable:
            try:
                return self._read((tensor_id, loc.dtype, loc.shape, loc.nbytes, loc.content_hash, None,
                                   loc.array_path, loc.elem_offset, loc.elem_count, loc.stored, loc.format,
                                   loc.original_shape, loc.original_format, loc.pruned_at, None, None, None, None),
                                  host_format, verify)
            except DumpdbError:
                pass  # raised again below, with the names of the tensor
        with self.reader() as con:
            rows = con.execute(_TENSOR_LOCATION_SQL + " WHERE t.tensor_id = ?", [tensor_id]).fetchall()
        if not rows:
            raise TensorNotFound(f"no tensor with tensor_id {tensor_id} in {self.path}")
        return self._read(rows[0], host_format, verify)

    def find_tensor_id(self, *, run: str | None, iteration: int | None, op_name: str | None,
                       io: str = "output", slot: int = 0, rank: int | None = 0,
                       graph_id: int | None = None) -> int:
        """The ``tensor_id`` of the one tensor matching the key (see :meth:`tensor`).

        ``run`` may be left out when the archive holds exactly one run; with several, a
        :class:`DumpdbError` lists them. Raises TypeError without ``op_name``."""
        if op_name is None:
            raise TypeError("tensor() needs a tensor_id, or op_name= (plus run= when the archive holds "
                            "several runs, iteration=, io=, slot=)")
        if run is None:
            run = self.only_run()
        conds = ["run = ?", "(op_name = ? OR scope_name = ?)", "io = ?", "slot IS NOT DISTINCT FROM ?"]
        params: list[Any] = [run, op_name, op_name, io, slot]
        for column, value in (("iteration", iteration), ("graph_id", graph_id)):
            if value is not None:
                conds.append(f"{column} = ?")
                params.append(value)
        if rank is not None:
            # Layouts without ranks (CANN device dirs, r1.2, TensorDump) have rank NULL.
            conds.append("(rank = ? OR rank IS NULL)")
            params.append(rank)
        with self.reader() as con:
            rows = con.execute(
                "SELECT tensor_id, graph_id, iteration, rank FROM tensors WHERE "
                + " AND ".join(conds) + " ORDER BY tensor_id LIMIT 6",
                params,
            ).fetchall()
        key = f"run={run!r} iteration={iteration} op_name={op_name!r} io={io} slot={slot} rank={rank}" + (
            f" graph_id={graph_id}" if graph_id is not None else "")
        if not rows:
            raise TensorNotFound(f"no tensor matches {key} in {self.path}")
        if len(rows) > 1:
            where = ", ".join(f"(graph_id={g}, iteration={i}, rank={r})" for _, g, i, r in rows[:5])
            raise TensorNotFound(f"{len(rows) if len(rows) < 6 else 'several'} tensors match {key}: {where}; "
                                 "narrow it with iteration=, graph_id= or rank=")
        return rows[0][0]

    def require_run(self, run: str) -> None:
        """Raise :class:`~dumpdb.errors.RunNotFound` (listing the runs there are) unless the
        archive has a run named ``run`` (:func:`dumpdb.errors.require_run`)."""
        with self.reader() as con:
            require_run(con, run, self.path)

    def only_run(self) -> str:
        """The name of the archive's one run (what ``run=`` defaults to). Raises
        :class:`DumpdbError` naming the runs when there are several, or none."""
        with self.reader() as con:
            names = [r[0] for r in con.execute("SELECT run FROM runs ORDER BY run LIMIT 11").fetchall()]
        if len(names) == 1:
            return names[0]
        if not names:
            raise DumpdbError(f"{self.path}: no runs yet; nothing to read")
        shown = ", ".join(repr(n) for n in names[:10]) + (", ..." if len(names) > 10 else "")
        raise DumpdbError(f"{self.path} holds several runs ({shown}): say which with run=")

    def tensors(self, query: str, params: list | None = None, *,
                host_format: bool = False, verify: bool | None = None
                ) -> Iterator[tuple[dict[str, Any], np.ndarray | None]]:
        """Yield ``(row, array)`` for each row of ``query`` (which must return ``tensor_id``).

        Rows come in the query's order as dicts of its columns; ``array`` is
        None for statistics-only and pruned tensors. Payloads are read in batches of
        up to ``READ_BATCH_ROWS`` rows / ``READ_BATCH_BYTES`` bytes, each batch in storage
        order (pack, offset: every chunk decoded once) and the next batch read ahead on
        a background thread while this one is consumed; memory stays bounded by about
        two batches (or the largest tensor). ``host_format`` and ``verify`` as in
        :meth:`tensor`; an error reading a tensor is raised when its row is reached.
        """
        import pyarrow as pa

        table = self.sql(query, params)
        if "tensor_id" not in table.column_names:
            raise DumpdbError("tensors(query): the query must return a tensor_id column")
        ids = table.column("tensor_id").cast(pa.int64()).to_pylist()
        locations = list(self.locations.many([int(t) if t is not None else -1 for t in ids]))
        rows = (row for batch in table.to_batches() for row in batch.to_pylist())
        yield from _read_ahead(self._read_located, self.path, ids, locations, rows, host_format, verify)

    # -- the catalog's tables ------------------------------------------------------
    def tables(self) -> pa.Table:
        """The catalog's tables and views: ``table``, ``kind`` ('table' | 'view'), ``rows``
        (exact counts) and ``comment`` (what each holds, from the migrations), by name."""
        import pyarrow as pa

        _, found = self.sql_rows(_TABLES_SQL)
        counts: dict[int, int] = {}
        if found:
            counts = dict(self.sql_rows(" UNION ALL ".join(
                f"SELECT {i} AS i, count(*) AS n FROM {_sql_identifier(name)}"
                for i, (name, *_rest) in enumerate(found)))[1])
        return pa.table({"table": [r[0] for r in found], "kind": [r[1] for r in found],
                         "rows": pa.array([counts[i] for i in range(len(found))], pa.int64()),
                         "comment": [r[3] or None for r in found]})

    def columns(self, table: str | None = None) -> pa.Table:
        """Columns of ``table`` (default: every table): ``table``, ``column``, ``type`` and
        ``comment`` (DuckDB's column comments), in table then column order. Raises
        DumpdbError naming the tables for an unknown ``table``."""
        where = "AND table_name = $table" if table else ""
        result = self.sql(
            'SELECT table_name AS "table", column_name AS "column", data_type AS type, '
            "nullif(comment, '') AS comment FROM duckdb_columns() WHERE database_name = current_database() "
            f"AND schema_name = 'main' AND NOT internal {where} ORDER BY table_name, column_index",
            {"table": table} if table else None)
        if table and result.num_rows == 0:
            _, known = self.sql_rows(_TABLES_SQL)
            raise DumpdbError(f"no table {table!r} in the catalog (tables: {', '.join(r[0] for r in known)})")
        return result

    def migrate(self) -> list:
        """Bring the catalog's schema up to date (done on open when the archive is writable;
        a copy goes to ``backups/`` first). Returns the migrations applied by this object,
        on open or now (:class:`~dumpdb.catalog.migrations.Migration`: ``version``, ``name``)."""
        self.refuse_writes()
        self.catalog.migrate()
        return list(self.catalog.applied)

    # -- ingest ------------------------------------------------------------------
    def ingest(self, dump_dir: str | os.PathLike, run: str | None = None, **options):
        """Ingest the dump at ``dump_dir`` as run ``run`` into this archive; returns an
        :class:`~dumpdb.ingestion.pipeline.IngestReport`. Options are
        :func:`dumpdb.ingestion.pipeline.ingest`'s (layout, workers, scheduler, reporter,
        follow_symlinks, update, moved, verify_hash, delta); this archive's lock wait and
        storage options are used. ``dumpdb.ingest`` also creates a missing archive."""
        from dumpdb.ingestion.pipeline import ingest

        self.refuse_writes()
        catalog = self.catalog
        options.setdefault("lock_timeout", catalog.lock_timeout)
        options.setdefault("on_wait", catalog.on_wait)
        options.setdefault("storage_options", self.storage_options or None)
        return ingest(dump_dir, self.path, run, **options)

    def step_pair(self, target_run: str, bench_run: str) -> tuple[str, str]:
        """The selections to compare two runs by: ``RUN:ITERATION`` each when both runs hold
        exactly one iteration (a step-1 dump against a step-0 one is paired step for step, as
        msprobe does), else the run names."""
        its = [[r[0] for r in self.sql_rows("SELECT DISTINCT iteration FROM tensors WHERE run = $run",
                                            {"run": name})[1]] for name in (target_run, bench_run)]
        if all(len(i) == 1 and i[0] is not None for i in its):
            return f"{target_run}:{its[0][0]}", f"{bench_run}:{its[1][0]}"
        return target_run, bench_run

    # -- comparison ------------------------------------------------------------
    def comparison(self, target: str, bench: str, *, scheduler: str | None = None, **options):
        """The whole outcome of a compare (:class:`~dumpdb.compare.engine.CompareOutcome`:
        ``summary``, ``results``, ``unmatched``, ``first_divergence``); arguments as
        :meth:`compare` (``progress(done, total)`` too)."""
        from dumpdb.compare.engine import compare

        return compare(self, target, bench, scheduler=scheduler, **options)

    def compare(self, target: str, bench: str, *, scheduler: str | None = None, **options) -> pa.Table:
        """Compare two selections (``RUN[:ITERATION[:RANK]]``) tensor by tensor.

        Returns one row per aligned pair, in target execution order, with every
        metric of :mod:`dumpdb.compare.metrics`, the verdict and context columns;
        the comparison is stored in ``compares``/``compare_results`` (its
        ``compare_id`` is in the rows). Options are those of
        :func:`dumpdb.compare.engine.compare` (iteration, rank, mapping,
        strategies, thresholds, mode, workers, store_results). ``scheduler``: the payloads
        read and compared on the dask cluster at that address or ``"local"``, the same rows.
        """
        return self.comparison(target, bench, scheduler=scheduler, **options).results

    def first_divergence(self, target: str, bench: str, *, scheduler: str | None = None,
                         **options) -> dict[str, Any] | None:
        """The first op, in the order ops ran, that departs beyond its dtypes' precision
        and is not explained by its inputs' errors (``rules="msprobe"``: the first output
        failing msprobe's rules): scope name, source line, metrics, ``inputs``/``outputs``
        errors, and ``path``: the ops compared before it. None when nothing departs.
        Options as :meth:`compare` (:func:`dumpdb.compare.engine.compare`), ``scheduler`` too."""
        return self.comparison(target, bench, scheduler=scheduler, **options).first_divergence

    def scan(self, run: str, checks=None, *, scheduler: str | None = None, **options) -> pa.Table:
        """Run checks (first NaN/Inf, fp16 overflow, all-zero, MindInsight watch
        conditions) over one run; see :func:`dumpdb.checks.scan.scan` (``scheduler``: the
        payloads it reads, read on the dask cluster at that address or ``"local"``)."""
        from dumpdb.checks.scan import scan

        return scan(self, run, checks, scheduler=scheduler, **options)

    def ranks(self, run: str, *, iteration: int | None = None, scheduler: str | None = None,
              workers: int | None = None) -> pa.Table:
        """The ranks of ``run`` grouped by fingerprint, one row per rank, with where each odd
        group departs; see :func:`dumpdb.checks.ranks.rank_groups`."""
        from dumpdb.checks.ranks import rank_groups

        return rank_groups(self, run, iteration=iteration, scheduler=scheduler, workers=workers)

    def first_bad_rank(self, run: str, *, iteration: int | None = None) -> pa.Table:
        """Each rank's first NaN/Inf tensor, the rank that went bad first on top; see
        :func:`dumpdb.checks.ranks.first_bad_across_ranks`."""
        from dumpdb.checks.ranks import first_bad_across_ranks

        return first_bad_across_ranks(self, run, iteration=iteration)

    def serve(self, host: str = "127.0.0.1", port: int = 8765, open_browser: bool = False) -> None:
        """Browse this archive in a web browser until Ctrl-C: a local, read-only web
        application (runs, model trees, compares, tensors, ranks, SQL; ``docs/serve.md``),
        the URL said on stderr. See :func:`dumpdb.serve.serve` (DumpdbError without the
        ``serve`` extra or when the port cannot be bound)."""
        from dumpdb.serve import serve

        serve(self, host, port, open_browser)

    # -- maintenance -------------------------------------------------------------
    def prune(self, run: str, iterations: str | None = None, ranks: str | None = None) -> int:
        """Drop payloads of ``run`` (MindSpore iteration / rank spec like ``"0|5-8"``), keep
        rows and statistics; returns tensors pruned. A range the run has none of raises
        DumpdbError naming what it has. See :func:`dumpdb.archival.maintenance.prune`."""
        from dumpdb.archival.maintenance import prune

        self.refuse_writes()
        return prune(self, run, iterations, ranks)

    def remove_run(self, run: str) -> int:
        """Delete a run's rows; returns tensors removed (space: :meth:`gc`)."""
        from dumpdb.archival.maintenance import remove_run

        self.refuse_writes()
        return remove_run(self, run)

    def gc(self, compact_below: float = 0.5, **options):
        """Reclaim store space no live tensor uses (``grace`` seconds for uncommitted
        files); returns a GcReport. See :func:`dumpdb.archival.maintenance.gc`."""
        from dumpdb.archival.maintenance import gc

        self.refuse_writes()
        return gc(self, compact_below, **options)

    def export(self, runs: list[str] | str, to: str | os.PathLike) -> Path | str:
        """Write runs as a self-describing bundle (directory, or ``.zip``, or ``s3://BUCKET/PREFIX``:
        :mod:`dumpdb.archival.remote_bundle`); see :mod:`dumpdb.archival.bundle`. Returns where."""
        from dumpdb.storage.backends import is_url

        runs = [runs] if isinstance(runs, str) else list(runs)
        if is_url(to):
            from dumpdb.archival.remote_bundle import export_to_url

            return export_to_url(self, runs, str(to), self.storage_options)
        from dumpdb.archival.bundle import export_runs

        return export_runs(self, runs, to)

    def import_bundle(self, path: str | os.PathLike, rename: dict[str, str] | None = None, **options):
        """Bring a bundle's runs in (checked whole before the archive changes, idempotent;
        ``max_bundle_size`` bytes); ``path`` may be ``s3://BUCKET/PREFIX``. See
        :mod:`dumpdb.archival.bundle` and :mod:`dumpdb.archival.remote_bundle`."""
        from dumpdb.storage.backends import is_url

        self.refuse_writes()
        if is_url(path):
            from dumpdb.archival.remote_bundle import import_from_url

            return import_from_url(self, str(path), rename, storage_options=self.storage_options, **options)
        from dumpdb.archival.bundle import import_bundle

        return import_bundle(self, path, rename, **options)

    def verify(self, run: str | None = None, **options):
        """Check the catalog and every tensor -> payload reference, re-read and re-hash stored
        payloads, list orphans; see :func:`dumpdb.archival.verify.verify` (``sample``
        fraction, ``seed``, ``progress``, ``repair``, ``grace``). Returns a VerifyReport."""
        from dumpdb.archival.verify import verify

        if self.source.refusal is not None:  # verify a bundle by importing it: every file is checked then
            raise ArchiveError(f"{self.path}: verify an S3 bundle by importing it (dumpdb import {self.path})")
        return verify(self, run, **options)

    def _read(self, loc: tuple, host_format: bool = False, verify: bool | None = None) -> np.ndarray:
        (tensor_id, dtype, shape, nbytes, content_hash, source_file, array_path, offset, count, stored,
         fmt, original_shape, original_format, pruned_at, run, op_name, io, slot) = loc
        if content_hash is None:
            raise DumpdbError(
                f"tensor {tensor_id} ({source_file}): only statistics were dumped, there is no payload")
        if pruned_at is not None:
            raise DumpdbError(f"tensor {tensor_id} ({source_file}): payload pruned on {pruned_at:%Y-%m-%d %H:%M} "
                              "(dumpdb prune --keep-stats); its statistics are still in the catalog")
        if not stored:
            raise DumpdbError(f"tensor {tensor_id} ({source_file}): payload {content_hash} is not in the store")
        from dumpdb.dtypes import from_catalog_name

        try:
            array = self.store.read(array_path, offset, count or 0, from_catalog_name(dtype), tuple(shape),
                                    content_hash=content_hash, verify=verify)
        except (PayloadMissing, PayloadCorrupt, ValueError) as exc:
            what = f"tensor {tensor_id} (run={run!r} op_name={op_name!r} io={io} slot={slot})"
            cls = PayloadMissing if isinstance(exc, PayloadMissing) else PayloadCorrupt
            raise cls(f"{what}: payload {content_hash}: {exc}") from exc
        if host_format and original_shape is not None:
            from dumpdb.formats import to_host

            try:
                array = to_host(array, fmt, tuple(original_shape), original_format)
            except ValueError as exc:
                raise DumpdbError(f"tensor {tensor_id} ({source_file}): {exc}") from exc
        return array


READ_BATCH_ROWS = 256
READ_BATCH_BYTES = 64 << 20


def _read_ahead(read_located: Any, path: Path, ids: list, locations: list[TensorLocation | None],
                rows: Iterator[dict], host_format: bool,
                verify: bool | None) -> Iterator[tuple[dict[str, Any], np.ndarray | None]]:
    """``(row, array)`` in query order, payloads read batch by batch in storage order,
    one batch ahead on a background thread (see :meth:`Archive.tensors`);
    ``read_located`` is :meth:`Archive._read_located` of the archive at ``path``."""
    from concurrent.futures import ThreadPoolExecutor

    batches: list[list[int]] = []  # positions in the query's order
    current: list[int] = []
    size = 0
    for pos, loc in enumerate(locations):
        current.append(pos)
        size += (loc.nbytes or 0) if loc is not None else 0
        if len(current) >= READ_BATCH_ROWS or size >= READ_BATCH_BYTES:
            batches.append(current)
            current, size = [], 0
    if current:
        batches.append(current)

    def read(batch: list[int]) -> dict[int, Any]:
        """Payloads (or the exception reading one raised) of a batch, by position."""
        out: dict[int, Any] = {}
        order = sorted(batch, key=lambda p: _storage_key(locations[p]))
        for pos in order:
            loc = locations[pos]
            if ids[pos] is None:
                out[pos] = TensorNotFound(f"no tensor with tensor_id None in {path}")
            elif loc is not None and not (loc.content_hash is not None and loc.pruned_at is None):
                out[pos] = None  # statistics only or pruned: no payload
            else:
                try:
                    out[pos] = read_located(int(ids[pos]), loc, host_format, verify)
                except DumpdbError as exc:
                    out[pos] = exc
        return out

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="dumpdb-readahead") as pool:
        pending = pool.submit(read, batches[0]) if batches else None
        for i, batch in enumerate(batches):
            assert pending is not None
            payloads = pending.result()
            pending = pool.submit(read, batches[i + 1]) if i + 1 < len(batches) else None
            for pos in batch:
                row = next(rows)
                value = payloads.pop(pos)
                if isinstance(value, BaseException):
                    if pending is not None:
                        pending.cancel()
                    raise value
                yield row, value


def _storage_key(loc: TensorLocation | None) -> tuple[str, int]:
    """Sort key putting reads in storage order: by array, then offset in it."""
    if loc is None or loc.array_path is None:
        return ("", 0)
    return (loc.array_path, loc.elem_offset or 0)


def open(path: str | os.PathLike | None = None, **kwargs) -> Archive:  # noqa: A001
    """Open the archive at ``path`` (default ``$DUMPDB_ARCHIVE`` or ``./dumpdb.archive``).

    Keyword arguments go to :class:`Archive` (``lock_timeout`` seconds,
    ``on_wait`` callback, ``storage_options`` for an object-storage store). Raises
    :class:`ArchiveError` if it is not an archive. ``path`` ``s3://BUCKET/PREFIX`` opens the
    bundle there read-only in place (:class:`dumpdb.archival.remote_bundle.BundleCatalog`).
    """
    return Archive(path if path is not None else default_archive_path(), **kwargs)
