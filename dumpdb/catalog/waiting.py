"""Waiting for another process: the one loop every lock wait of dumpdb goes through.

Whatever blocks - the archive's store lock (:mod:`dumpdb.catalog.locks`) or DuckDB's
file lock on ``catalog.duckdb`` (another process holds it read-write, or read-only while
we want to write) - the waiting process polls with backoff, and:

* after :data:`NOTICE_AFTER` seconds (1 s; half the timeout if that is shorter) calls
  ``on_wait`` **once** with a line naming what holds it (the CLI prints it on stderr):
  a dumpdb process (its pid, command and what it does) or another DuckDB connection
  (pid and command when DuckDB's error names the pid). A caller that passes no
  ``on_wait`` (the Python API's default) gets the line as a WARNING on the ``dumpdb``
  logger instead (:func:`told`), which Python prints on stderr when logging is not
  configured: a script never hangs without a word;
* gives up after ``timeout`` seconds (``--wait SECONDS`` in the CLI; default
  ``$DUMPDB_LOCK_TIMEOUT`` or 120 s) with :class:`~dumpdb.errors.ArchiveError`
  (exit 2) naming the holder.

Commits take tens of milliseconds: a wait shorter than the notice delay says nothing.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

from dumpdb.errors import ArchiveError

NOTICE_AFTER = 1.0
_PID = re.compile(r"\(PID (\d+)\)")
LOG = logging.getLogger("dumpdb")


def told(on_wait: Callable[[str], None] | None) -> Callable[[str], None]:
    """``on_wait``, or when it is None a function logging the line as a WARNING on the
    ``dumpdb`` logger (what the Python API does by default)."""
    return on_wait if on_wait is not None else LOG.warning


class Waiter:
    """One wait of at most ``timeout`` seconds; :meth:`again` after each failed attempt."""

    def __init__(self, timeout: float, on_wait: Callable[[str], None] | None = None,
                 stop: Callable[[], bool] | None = None):
        self.timeout = timeout
        self.on_wait = on_wait
        self.stop = stop  # asked before each wait: True ends it at once (the caller no longer needs it)
        self.started = time.monotonic()
        self.notice_at = self.started + min(NOTICE_AFTER, timeout / 2)
        self.deadline = self.started + timeout
        self.delay = 0.02
        self.told = False

    def again(self, waiting: Callable[[], str], gave_up: Callable[[], str]) -> None:
        """Sleep before the next attempt. ``waiting()`` is the line for ``on_wait`` (asked
        once, after the notice delay); at the deadline raises ArchiveError(``gave_up()``), and
        when ``stop()`` says so ArchiveError("... no longer needed")."""
        now = time.monotonic()
        if self.stop is not None and self.stop():
            raise ArchiveError(f"{waiting()}: no longer needed, stopped")
        if now >= self.deadline:
            raise ArchiveError(gave_up())
        if not self.told and now >= self.notice_at and self.on_wait is not None:
            self.told = True
            self.on_wait(waiting())
        # Polling a lock held by another process (neither flock with a timeout nor DuckDB
        # can wait for it); the backoff keeps it cheap.
        time.sleep(max(0.0, min(self.delay, self.deadline - now)))
        self.delay = min(self.delay * 2, 0.5)

    def limit(self) -> str:
        """How the wait is bounded, for messages: ``gives up after 120 s; --wait SECONDS changes it``."""
        return f"gives up after {self.timeout:g} s; --wait SECONDS changes it"


def _args_of(pid: int) -> list[str] | None:
    """The arguments of process ``pid`` (from ``/proc``); None if unreadable or empty."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a] or None


def one_line(text: str) -> str:
    """``text`` as one line of printable characters: whitespace runs (newlines of a
    ``python -c '...'`` holder, tabs) become one space, other control characters ``?``."""
    return "".join(c if c.isprintable() else "?" for c in " ".join(text.split()))


def command_of(pid: int) -> str | None:
    """The command line of process ``pid`` (from ``/proc``) on one line (:func:`one_line`:
    the lock-wait line stays one line, issue 30), shortened to 60 characters; None if
    unreadable."""
    args = _args_of(pid)
    if args is None:
        return None
    text = one_line(" ".join([os.path.basename(args[0]), *args[1:]]))
    return text if len(text) <= 60 else text[:57] + "..."


def _runs_dumpdb(args: list[str] | None) -> bool:
    """True for ``dumpdb ...`` (the console script) and ``python -m dumpdb ...``: an
    argument that is the program itself, not one that merely names an archive
    (``a.dumpdb``), and wherever it stands in a long command line."""
    return args is not None and any(os.path.basename(a) == "dumpdb" for a in args)


def _dumpdb_record(archive: Path, pid: int) -> str | None:
    """What a dumpdb process ``pid`` said it does in the archive's store-lock records."""
    for path in (archive / "locks" / "holders").glob(f"{pid}-*.json"):
        try:
            return one_line(str(json.loads(path.read_text(encoding="utf-8"))["what"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def duckdb_holder(error: Exception | str, archive: Path) -> str:
    """Who holds the catalog file, from DuckDB's lock error (which names the pid when it
    can): ``dumpdb process (pid 812: dumpdb ingest ...; ingest of run 'a')``,
    ``another DuckDB connection (pid 77: python3 hold.py)``, or ``another DuckDB
    connection`` when no pid is named."""
    found = _PID.search(str(error))
    if not found:
        return "another DuckDB connection"
    pid = int(found.group(1))
    if pid == os.getpid():
        return f"another DuckDB connection of this process (pid {pid})"
    command = command_of(pid)
    what = _dumpdb_record(Path(archive), pid)
    if what is not None or _runs_dumpdb(_args_of(pid)):
        detail = "; ".join(x for x in (command, what) if x)
        return f"dumpdb process (pid {pid}{': ' + detail if detail else ''})"
    return f"another DuckDB connection (pid {pid}{': ' + command if command else ''})"
