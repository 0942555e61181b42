"""Kill-point launcher: run ``python -m MODULE ARGS...`` and SIGKILL it at its N-th I/O event.

Independent of dumpdb's internals: the events are counted by a ``sys.addaudithook``
hook (files opened inside the watched directories, renames, replaces, removals,
``os.fsync``) and by wrapping DuckDB's transaction commit (``commit()`` and
``execute("COMMIT")``), before and after it runs. Only the main process counts (a
forked worker inherits the hook but neither counts nor kills).

Environment:

``CRASHKIT_WATCH``
    ``os.pathsep``-separated directories; an ``open`` counts only inside them.
``CRASHKIT_KILL_AT``
    kill at this event number (1-based); 0 or unset: never kill.
``CRASHKIT_SIGNAL``
    the signal sent at that event: ``KILL`` (default) or ``INT`` (Ctrl-C).
``CRASHKIT_COUNT_FILE``
    write the number of events seen (and their kinds, one per line) here on exit.
``CRASHKIT_SET``
    ``module.ATTR=int;...``: module constants set before the command runs (tiny packs,
    commit after every batch: more kill points in a small dump).

Usage: ``python tests/crashkit.py -m dumpdb ingest DIR --archive A``.
"""

from __future__ import annotations

import importlib
import os
import random
import runpy
import signal
import sys

_EVENTS = {"open", "os.rename", "os.replace", "os.remove", "os.rmdir", "shutil.rmtree", "os.truncate"}


class _Counter:
    def __init__(self) -> None:
        self.pid = os.getpid()
        self.kill_at = int(os.environ.get("CRASHKIT_KILL_AT") or 0)
        self.signal = getattr(signal, "SIG" + os.environ.get("CRASHKIT_SIGNAL", "KILL"))
        self.watch = [os.path.realpath(p) for p in os.environ.get("CRASHKIT_WATCH", "").split(os.pathsep) if p]
        self.kinds: list[str] = []
        self.active = True

    def event(self, kind: str) -> None:
        if not self.active or os.getpid() != self.pid:
            return
        self.kinds.append(kind)
        if len(self.kinds) == self.kill_at:
            os.kill(self.pid, self.signal)

    def watched(self, path) -> bool:
        if isinstance(path, int) or path is None:
            return False
        try:
            p = os.path.realpath(os.fsdecode(path))
        except (TypeError, ValueError):
            return False
        return any(p == w or p.startswith(w + os.sep) for w in self.watch)

    def audit(self, name: str, args: tuple) -> None:
        if name not in _EVENTS or not self.active:
            return
        if name == "open":
            path, mode, flags = args
            writing = (mode is not None and any(c in mode for c in "wax+")) or (
                flags is not None and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
            if self.watched(path):
                self.event("open-write" if writing else "open-read")
            return
        self.event(name)


def _wrap_fsync(counter: _Counter) -> None:
    real = os.fsync

    def fsync(fd):
        counter.event("fsync-before")
        real(fd)
        counter.event("fsync-after")

    os.fsync = fsync


def _wrap_duckdb(counter: _Counter) -> None:
    import duckdb

    cls = duckdb.DuckDBPyConnection
    real_commit, real_execute = cls.commit, cls.execute

    def commit(self, *args, **kwargs):
        counter.event("commit-before")
        result = real_commit(self, *args, **kwargs)
        counter.event("commit-after")
        return result

    def execute(self, query, *args, **kwargs):
        is_commit = isinstance(query, str) and query.strip().rstrip(";").upper() in ("COMMIT", "END",
                                                                                     "COMMIT TRANSACTION")
        if is_commit:
            counter.event("commit-before")
        result = real_execute(self, query, *args, **kwargs)
        if is_commit:
            counter.event("commit-after")
        return result

    cls.commit, cls.execute = commit, execute


def _apply_settings(spec: str) -> None:
    for item in filter(None, (s.strip() for s in spec.split(";"))):
        target, value = item.split("=", 1)
        module_name, attr = target.rsplit(".", 1)
        module = importlib.import_module(module_name)
        if not hasattr(module, attr):  # moved by a refactoring: the kill points are coarser, still valid
            print(f"crashkit: {target} does not exist; not set", file=sys.stderr)
            continue
        setattr(module, attr, type(getattr(module, attr))(value))


def kill_points(count_file: str | os.PathLike, points: int, salt: str, head: float = 1.0) -> list[int]:
    """Pick ``points`` kill points (1-based event numbers) from a count pass's file.

    Stratified by event kind: first one event of every kind the command showed (a commit,
    an fsync, a rename, a write...: each is a different moment of the crash protocol), in
    a seeded order, then more events at random. So a few points already kill the command
    at every kind of moment; ``DUMPDB_CRASH_POINTS`` (a factor) and ``DUMPDB_CRASH_SEED``
    widen or move the schedule. ``head`` keeps the points within the first share of the
    events (for commands whose count varies a little from run to run with thread timing).
    """
    seed = os.environ.get("DUMPDB_CRASH_SEED", "20")
    k = max(1, round(points * float(os.environ.get("DUMPDB_CRASH_POINTS", "1"))))
    lines = open(count_file).read().split()
    total = max(1, int(int(lines[0]) * head))
    kinds = lines[1:total + 1]
    if total <= k:  # a short command: every event is a kill point
        return list(range(1, total + 1))
    rng = random.Random(f"{seed}:{salt}")
    by_kind: dict[str, list[int]] = {}
    for i, kind in enumerate(kinds, start=1):
        by_kind.setdefault(kind, []).append(i)
    chosen = [rng.choice(by_kind[kind]) for kind in sorted(by_kind)]
    rng.shuffle(chosen)
    chosen = chosen[:k]
    rest = sorted(set(range(1, total + 1)) - set(chosen))
    chosen += rng.sample(rest, k - len(chosen))
    return sorted(chosen)


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[1] != "-m":
        sys.exit("usage: crashkit.py -m MODULE ARGS...")
    module, args = sys.argv[2], sys.argv[3:]
    counter = _Counter()
    counter.active = False  # imports and settings are not kill points
    _apply_settings(os.environ.get("CRASHKIT_SET", ""))
    _wrap_fsync(counter)
    _wrap_duckdb(counter)
    sys.addaudithook(counter.audit)
    sys.argv = [module, *args]
    code = 0
    counter.active = True
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        counter.active = False
        out = os.environ.get("CRASHKIT_COUNT_FILE")
        if out:
            with open(out, "w") as f:
                f.write("\n".join([str(len(counter.kinds)), *counter.kinds]) + "\n")
    sys.exit(code)


if __name__ == "__main__":
    main()
