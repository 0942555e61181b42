"""The SQL sandbox's bounds: where DuckDB spills, how much memory and how many threads a
query may use, how long it may run, and stopping it on Ctrl-C (issue 30, item 13).

``dumpdb sql`` / :meth:`dumpdb.Archive.sql` run in their own in-memory DuckDB instance with
file access disabled (:func:`lock_down`). DuckDB's defaults leave that
instance open and unbounded in ways this module closes:

* temporary files: DuckDB spills to ``.tmp/`` under the *current directory* and puts that
  directory on its allowed list, so ``COPY ... TO``, ``read_text`` and ``glob`` worked on
  files there. The sandbox spills into a private directory (``mkdtemp``, mode 0700) made
  for its instance and removed with it (:class:`PrivateTemp`);
* memory: DuckDB's default limit is 80 % of the machine's RAM (one query reached 17.7 GB).
  The sandbox's is :data:`DEFAULT_MEMORY_LIMIT` (``$DUMPDB_SQL_MEMORY_LIMIT``,
  ``--memory-limit``); DuckDB spills beyond it or fails the query with "Out of Memory";
* threads: :data:`DEFAULT_THREADS` (``$DUMPDB_SQL_THREADS``, ``--threads``);
* Ctrl-C and timeouts: the query runs on a helper thread while the calling thread waits
  in short steps, so a Ctrl-C (:exc:`KeyboardInterrupt`) or the statement timeout
  (``timeout`` seconds) reaches it at once; it then interrupts DuckDB
  (``DuckDBPyConnection.interrupt``), waits for the query to stop and raises
  (:func:`run_interruptible`). Without this an 8-way cross join ignored Ctrl-C for minutes;
* table functions that read files (``read_blob``, ``read_text``, ``glob``, ``read_csv``...)
  and a string used as a table (``FROM 'file'``) are refused before the query runs
  (:func:`refuse_file_functions`): the instance may open the catalog file itself (to
  attach it), so ``read_blob`` of it used to return the catalog's bytes.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from dumpdb.errors import DumpdbError

DEFAULT_MEMORY_LIMIT = "2GB"
DEFAULT_THREADS = 2
_STEP = 0.05  # seconds between the waiting thread's checks for Ctrl-C and the deadline

T = TypeVar("T")


class QueryTimeout(DumpdbError):
    """A sandboxed query ran past its statement timeout and was stopped."""


@dataclass(frozen=True)
class SqlLimits:
    """Bounds of a sandboxed query. ``memory_limit``: DuckDB's memory limit (``"2GB"``,
    ``"512MB"``); ``threads``: DuckDB's worker threads; ``timeout``: seconds a statement
    may run (None: no limit). Defaults: :data:`DEFAULT_MEMORY_LIMIT` and
    :data:`DEFAULT_THREADS`, overridden by ``$DUMPDB_SQL_MEMORY_LIMIT`` /
    ``$DUMPDB_SQL_THREADS`` (:meth:`from_env`)."""

    memory_limit: str = DEFAULT_MEMORY_LIMIT
    threads: int = DEFAULT_THREADS
    timeout: float | None = None

    @classmethod
    def from_env(cls, memory_limit: str | None = None, threads: int | None = None,
                 timeout: float | None = None) -> SqlLimits:
        """The limits given, else the environment's, else the defaults. Raises DumpdbError
        for a bad value (a memory limit DuckDB cannot read, threads < 1, timeout <= 0)."""
        memory = memory_limit or os.environ.get("DUMPDB_SQL_MEMORY_LIMIT") or DEFAULT_MEMORY_LIMIT
        env_threads = os.environ.get("DUMPDB_SQL_THREADS")
        if threads is None and env_threads:
            try:
                threads = int(env_threads)
            except ValueError:
                raise DumpdbError(f"DUMPDB_SQL_THREADS={env_threads!r}: give a whole number of threads") from None
        limits = cls(memory.strip(), DEFAULT_THREADS if threads is None else threads, timeout)
        limits.check()
        return limits

    def check(self) -> None:
        if not re.fullmatch(r"\d+(\.\d+)?\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)", self.memory_limit, re.IGNORECASE):
            raise DumpdbError(f"SQL memory limit {self.memory_limit!r}: write a size such as 512MB or 2GB")
        if self.threads < 1:
            raise DumpdbError(f"SQL threads {self.threads}: give at least 1")
        if self.timeout is not None and not self.timeout > 0:
            raise DumpdbError(f"SQL timeout {self.timeout}: give a number of seconds above 0")


class PrivateTemp:
    """A private directory (mode 0700, outside the current directory and any path the
    sandbox may open) for one DuckDB instance's spill files; :meth:`remove` deletes it,
    only in the process that made it (a forked child's copy of the object leaves it)."""

    def __init__(self) -> None:
        self.path = tempfile.mkdtemp(prefix="dumpdb-sql-")
        self._pid = os.getpid()

    def remove(self) -> None:
        if os.getpid() == self._pid:
            shutil.rmtree(self.path, ignore_errors=True)


def configure(con: Any, limits: SqlLimits, temp: PrivateTemp) -> None:
    """Apply ``limits`` and the private spill directory to a new sandbox instance (before
    its configuration is locked)."""
    con.execute(f"SET temp_directory = '{temp.path}'")
    con.execute(f"SET memory_limit = '{limits.memory_limit}'")
    con.execute(f"SET threads = {int(limits.threads)}")


# table functions that read files (DuckDB 1.4-2.0 core and its autoloaded readers), and a
# string literal used as a table (a replacement scan reads the file it names)
_FILE_FUNCTIONS = re.compile(
    r"\b(read_blob|read_text|glob|read_csv(?:_auto)?|sniff_csv|read_parquet|parquet_scan|parquet_\w{1,20}"
    r"|read_json(?:_auto|_objects(?:_auto)?)?|read_ndjson(?:_auto|_objects)?|read_xlsx|read_duckdb"
    r"|iceberg_\w{1,20}|delta_scan|st_read)\s*\(|\b(?:from|join)\s*(')", re.IGNORECASE)


def refuse_file_functions(query: str) -> None:
    """Refuse a sandboxed query that calls a table function reading files or reads a file
    named by a string (``FROM 'x.csv'``). Raises DumpdbError ("SQL refused: Cannot access
    file ..."). A linear scan of the text (one regex, no backtracking over it)."""
    m = _FILE_FUNCTIONS.search(query)
    if m is None:
        return
    what = f"{m.group(1)}()" if m.group(1) else "a file named as a table"
    raise DumpdbError(f"SQL refused: Cannot access file: {what} reads files, which dumpdb sql does not do "
                      "(--allow-files / allow_files=True permits file access)")


def run_interruptible(con: Any, work: Callable[[], T], timeout: float | None = None) -> T:
    """``work()`` (a DuckDB query's execution on ``con``) on a helper thread, the calling
    thread waiting in steps of 50 ms: a Ctrl-C there interrupts the query
    (``con.interrupt()``), waits for it to stop and re-raises :exc:`KeyboardInterrupt`; past
    ``timeout`` seconds it interrupts it and raises :class:`QueryTimeout`. Errors of
    ``work`` are re-raised as they are."""
    box: dict[str, Any] = {}
    done = threading.Event()

    def target() -> None:
        try:
            box["value"] = work()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            box["error"] = exc
        finally:
            done.set()

    thread = threading.Thread(target=target, name="dumpdb-sql", daemon=True)
    thread.start()
    waited = 0.0
    try:
        while not done.wait(_STEP):
            waited += _STEP
            if timeout is not None and waited >= timeout:
                _stop(con, done)
                raise QueryTimeout(f"SQL stopped: the query ran past the statement timeout of {timeout:g} s "
                                   "(--timeout SECONDS)")
    except KeyboardInterrupt:
        _stop(con, done)
        raise
    if "error" in box:
        raise box["error"]
    return box["value"]


def _stop(con: Any, done: threading.Event) -> None:
    """Interrupt ``con``'s running query and wait (a few seconds at most) for it to end."""
    for _ in range(100):
        try:
            con.interrupt()
        except Exception:  # noqa: BLE001 - a closed connection: nothing runs
            return
        if done.wait(0.05):
            return


def lock_down(con: Any) -> None:
    """Sandbox a query connection (README "Safety"): no file or network access from SQL
    (``COPY ... TO``, ``read_csv``, ``ATTACH`` refused) and no ``SET`` to undo it."""
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
