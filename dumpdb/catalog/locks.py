"""The archive's store lock: ``gc`` excludes every process that may add references.

Why: an ingest (or import) reads which payloads the archive already holds and then,
seconds to hours later, commits rows that reference them (deduplication). If ``gc``
ran in between - say after ``dumpdb rm`` of a run with the same payloads - it would
delete exactly the payloads the new run is about to reference, and every tensor of
the new run would be lost.

So every operation that adds or removes references (ingest, import, rm, prune)
holds ``locks/store.lock`` *shared* for its whole duration, and ``gc`` /
``verify --repair`` (which delete files) hold it *exclusive*. The lock is an
``flock(2)`` on the file, so it goes away with the process that held it (``kill -9``
included): there are no stale locks to break. Each holder also writes a small
record ``locks/holders/<pid>-<id>.json`` (what, pid, since) so a waiting process can
say who holds the archive and for how long.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from dumpdb.catalog.waiting import one_line, told
from dumpdb.errors import ArchiveError

SHARED = "shared"
EXCLUSIVE = "exclusive"


def pid_alive(pid: int) -> bool:
    """True if a process ``pid`` exists on this machine (one of another user counts;
    a pid beyond the kernel's range does not)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        return True
    return True


def holders(archive: Path) -> list[dict]:
    """Records of the live processes holding the store lock of ``archive``:
    dicts with ``what``, ``pid``, ``mode``, ``since`` (ISO time) and ``age`` (seconds)."""
    found = []
    now = datetime.now(timezone.utc)
    for path in sorted((Path(archive) / "locks" / "holders").glob("*.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            pid = int(record["pid"])
            since = datetime.fromisoformat(record["since"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # being written or removed right now
        if not pid_alive(pid):
            continue  # left by a killed process; its flock is gone with it
        found.append({**record, "age": max(0.0, (now - since).total_seconds())})
    return found


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def describe_holders(archive: Path) -> str:
    """One phrase naming who holds the store lock, e.g.
    ``ingest of run 'a' (pid 812, for 14 s)``; "another dumpdb process" if unknown."""
    found = holders(archive)
    if not found:
        return "another dumpdb process"
    return ", ".join(f"{one_line(str(h.get('what', 'dumpdb')))} (pid {h['pid']}, for {_age(h['age'])})"
                     for h in found)


@contextmanager
def store_lock(archive: str | os.PathLike, mode: str, what: str, *, timeout: float,
               on_wait: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold the store lock of ``archive`` (``SHARED`` or ``EXCLUSIVE``) for the block.

    ``what`` names the operation for other processes' messages. Waits up to
    ``timeout`` seconds for a conflicting holder, calling ``on_wait`` once with a
    line naming it (without one: a WARNING on the ``dumpdb`` logger); then raises
    :class:`ArchiveError` naming it. The lock is not
    re-entrant across modes: take it once per operation.
    """
    archive = Path(archive)
    on_wait = told(on_wait)
    locks = archive / "locks"
    try:
        (locks / "holders").mkdir(parents=True, exist_ok=True)
        fd = os.open(locks / "store.lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise ArchiveError(f"{locks}: cannot take the archive's store lock: {exc.strerror or exc}") from exc
    record = locks / "holders" / f"{os.getpid()}-{uuid.uuid4().hex[:8]}.json"
    try:
        # The turnstile makes waiting fair: whoever waits for the store lock holds it, so
        # a gc run in a loop cannot starve an ingest (nor a stream of ingests a gc).
        turnstile = os.open(locks / "store.turnstile", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            deadline = time.monotonic() + timeout
            waited = _acquire(turnstile, fcntl.LOCK_EX, deadline, archive, what, on_wait, timeout, False)
            _acquire(fd, fcntl.LOCK_EX if mode == EXCLUSIVE else fcntl.LOCK_SH, deadline, archive, what,
                     on_wait, timeout, waited)
        finally:
            os.close(turnstile)
        try:
            record.write_text(json.dumps({
                "what": what, "pid": os.getpid(), "mode": mode,
                "since": datetime.now(timezone.utc).isoformat(timespec="seconds")}), encoding="utf-8")
        except OSError:
            pass  # the record only improves messages; the flock is what excludes
        try:
            yield
        finally:
            record.unlink(missing_ok=True)
            if mode == EXCLUSIVE:
                _drop_dead_records(locks / "holders")
    finally:
        os.close(fd)  # releases the flock


def _acquire(fd: int, flag: int, deadline: float, archive: Path, what: str,
             on_wait: Callable[[str], None] | None, timeout: float, warned: bool) -> bool:
    """flock ``fd`` with ``flag``, polling until ``deadline`` (:class:`~dumpdb.catalog.waiting.Waiter`:
    one line after ~1 s, ArchiveError at the deadline). Returns whether it said it waited."""
    from dumpdb.catalog.waiting import Waiter

    waiter = Waiter(max(0.0, deadline - time.monotonic()), None if warned else on_wait)
    waiter.timeout = timeout  # messages give the whole wait, not what is left of it
    while True:
        try:
            fcntl.flock(fd, flag | fcntl.LOCK_NB)
            return warned or waiter.told
        except BlockingIOError:
            waiter.again(
                lambda: f"{what}: waiting, archive in use by {describe_holders(archive)} ({waiter.limit()})",
                lambda: f"{archive}: archive in use by {describe_holders(archive)}; {what} gave up after "
                        f"{timeout:g} s (--wait SECONDS waits longer, or try again when it has finished)")


def _drop_dead_records(folder: Path) -> None:
    """Remove holder records of processes that are gone (killed while holding)."""
    for path in folder.glob("*.json"):
        try:
            pid = int(path.name.split("-", 1)[0])
        except ValueError:
            continue
        if pid != os.getpid() and not pid_alive(pid):
            path.unlink(missing_ok=True)


def archive_lock(archive, mode: str, what: str):
    """:func:`store_lock` for an open :class:`~dumpdb.archive.Archive`: its lock timeout
    and its ``on_wait`` (the CLI prints the waiting line)."""
    return store_lock(archive.path, mode, what, timeout=archive.catalog.lock_timeout,
                      on_wait=archive.catalog.on_wait)
