"""What a run's ``status`` means now: is its ingesting process still there?

The catalog's ``runs.status`` is written by the ingest itself: ``ingesting`` when it
starts, ``complete`` / ``complete_with_errors`` / ``interrupted`` when it ends. A process
killed with ``kill -9`` (or a machine that lost power) never writes the end, so the
catalog alone cannot tell a run still being ingested from one whose ingest is gone.

The per-run ingest lock tells: every ingest holds ``locks/run-<sha1>.lock`` with
``flock(2)`` for its whole duration and writes its pid into it; the kernel drops the
flock when the process ends, however it ends. The ingest touches the file after every
catalog commit, so its mtime is the last sign of life (the process died between then
and the next commit, at most ``COMMIT_SECONDS`` later).

:func:`run_state` combines the two into what ``runs`` and ``show`` print.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shlex
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from dumpdb.catalog.locks import pid_alive


def run_lock_path(archive: str | os.PathLike, run: str) -> Path:
    """The per-run ingest lock file of ``run``: ``ARCHIVE/locks/run-<sha1(run)[:16]>.lock``."""
    return Path(archive) / "locks" / f"run-{hashlib.sha1(run.encode()).hexdigest()[:16]}.lock"


def touch(path: str | os.PathLike) -> None:
    """Mark a run lock file as alive now (its mtime); never raises (it only improves messages)."""
    try:
        os.utime(path)
    except OSError:
        pass


@dataclass(frozen=True)
class IngestProcess:
    """The process that last took a run's ingest lock: ``pid`` (None if it wrote none),
    ``alive`` (it still holds the lock), ``last_seen`` (the lock file's mtime: its start
    or its last commit, local time)."""

    pid: int | None
    alive: bool
    last_seen: datetime | None


def ingest_process(archive: str | os.PathLike, run: str) -> IngestProcess | None:
    """Who holds (or last held) the ingest lock of ``run``; None if no ingest ever took it.

    A recorded pid that no longer exists settles it; otherwise the lock is taken shared
    for an instant (never waiting) to learn whether that process still holds it."""
    path = run_lock_path(archive, run)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        raw = os.pread(fd, 32, 0).decode(errors="replace").strip()
        pid = int(raw) if raw.isdigit() else None
        last_seen = datetime.fromtimestamp(os.fstat(fd).st_mtime)
        if pid is not None and not pid_alive(pid):
            return IngestProcess(pid, False, last_seen)  # certain, and no probe that could race a new ingest
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return IngestProcess(pid, True, last_seen)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return IngestProcess(pid, False, last_seen)
    finally:
        os.close(fd)


def complete_command(run: str, source_path: str, archive: str | os.PathLike | None = None) -> str:
    """The shell command that completes (resumes) the ingest of ``run``."""
    where = f" -a {shlex.quote(str(archive))}" if archive is not None else ""
    return f"dumpdb ingest {shlex.quote(source_path)} --run {shlex.quote(run)}{where}"


def run_state(archive: str | os.PathLike, run: str, status: str, source_path: str,
              finished: datetime | None = None) -> tuple[str, str | None]:
    """``(state, command)`` of a run: the recorded ``status``, except that an ``ingesting``
    run whose process is gone reads ``interrupted (pid N gone since YYYY-MM-DD HH:MM:SS)``
    and an ``interrupted`` run reads ``interrupted (stopped YYYY-MM-DD HH:MM:SS)``;
    ``command`` is the ingest command that completes such a run (None for a complete
    run or one still being ingested)."""
    command = complete_command(run, source_path, archive)
    if status == "ingesting":
        proc = ingest_process(archive, run)
        if proc is not None and proc.alive:
            return (f"ingesting (pid {proc.pid})" if proc.pid else "ingesting"), None
        pid = f"pid {proc.pid}" if proc is not None and proc.pid else "its process"
        since = f" since {proc.last_seen:%Y-%m-%d %H:%M:%S}" if proc is not None and proc.last_seen else ""
        return f"interrupted ({pid} gone{since})", command
    if status == "interrupted":
        when = f" (stopped {finished:%Y-%m-%d %H:%M:%S})" if finished else ""
        return f"interrupted{when}", command
    return status, None
