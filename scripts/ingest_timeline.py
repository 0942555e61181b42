#!/usr/bin/env python3
"""A timeline of one ``dumpdb ingest``: where the wall time goes and when a core sits idle.

Runs the ingest in this process (``dumpdb.cli``), with

* a sampler thread reading every thread's CPU time (``/proc/self/task/*/stat``) every
  ``--tick`` seconds: per bucket, the cores busy and which threads used them;
* wrappers around the ingest's phases (imports, locate, catalog open/check, scan, begin,
  per-file load / hash / statistics, pack and large-array writes, compression, shard
  writes, fsyncs, commits, finish, close), summed per phase: calls, wall seconds, and
  thread CPU seconds spent inside them.

Prints the phase table, then the timeline (one line a bucket: cores busy as a bar, the main
thread's phase). Worker processes (``--workers N`` >= 2) are not sampled: it is a tool for
the in-process path (the default on fewer than 4 cores). Figures are for the machine as it
is at that moment (it is shared: read them next to ``scripts/bench_ingest.py``'s ratios).

    python scripts/ingest_timeline.py DUMP [--archive DIR] [ingest options, e.g. --workers 1]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

T0 = time.perf_counter()
CLK = os.sysconf("SC_CLK_TCK")


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dump", type=Path, help="dump directory to ingest")
    p.add_argument("--archive", type=Path, help="archive (default: a temporary one, removed)")
    p.add_argument("--tick", type=float, default=0.1, help="sampling period, seconds (default 0.1)")
    p.add_argument("--set", action="append", default=[], metavar="MODULE.NAME=VALUE",
                   help="set a module or class attribute first (a Python literal), to compare settings, "
                        "e.g. dumpdb.storage.local.DurableLocalStore.parallel_writes=2")
    p.add_argument("--quiet-timeline", action="store_true", help="print only the phase table")
    args, extra = p.parse_known_args()
    args.extra = [a for a in extra if a != "--"]  # the rest: 'dumpdb ingest' options
    return args


class Recorder:
    """Phase intervals (per thread) and CPU samples (per thread)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0])
        self.main_phase: list[tuple[float, str]] = []  # (time, phase) of the main thread
        self.local = threading.local()
        self.samples: list[tuple[float, dict[int, float]]] = []
        self.stop = threading.Event()

    def wrap(self, owner: object, name: str, label: str) -> None:
        """Replace ``owner.name`` with a wrapper that records ``label``."""
        fn = getattr(owner, name)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            stack = getattr(self.local, "stack", None)
            if stack is None:
                stack = self.local.stack = []
            main = threading.current_thread() is threading.main_thread()
            stack.append(label)
            if main:
                self.main_phase.append((time.perf_counter() - T0, label))
            w0, c0 = time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                w, c = time.perf_counter() - w0, time.thread_time() - c0
                stack.pop()
                if main:
                    self.main_phase.append((time.perf_counter() - T0, stack[-1] if stack else "other"))
                if label not in stack:  # recursion counted once
                    with self.lock:
                        entry = self.calls[label]
                        entry[0] += 1
                        entry[1] += w
                        entry[2] += c

        setattr(owner, name, wrapper)

    def sample(self, tick: float) -> None:
        """Sampler thread: CPU seconds of every thread of this process, every ``tick``."""
        task = Path("/proc/self/task")
        while not self.stop.wait(tick):
            now = time.perf_counter() - T0
            cpu: dict[int, float] = {}
            for t in task.iterdir():
                with contextlib.suppress(OSError, ValueError, IndexError):
                    fields = (t / "stat").read_text().rsplit(")", 1)[1].split()
                    cpu[int(t.name)] = (int(fields[11]) + int(fields[12])) / CLK
            self.samples.append((now, cpu))


def instrument(rec: Recorder) -> None:
    """Wrap the ingest's phases (the names are the modules' as of issue 12)."""
    import dumpdb.archive as archive
    import dumpdb.catalog.connection as connection
    import dumpdb.ingestion.pipeline as pipeline
    import dumpdb.ingestion.workers as workers
    import dumpdb.storage.local as local
    import dumpdb.storage.shard as shard
    import dumpdb.storage.store as store

    rec.wrap(pipeline, "locate", "locate")
    import dumpdb.layouts as layouts

    for kind in {type(lay) for lay in layouts.LAYOUTS}:
        if "scan" in vars(kind):
            rec.wrap(kind, "scan", "scan (layout)")
    rec.wrap(pipeline, "check_ranges", "scan: check_ranges")
    rec.wrap(pipeline.CatalogSink, "_identity", "begin: identity check")
    rec.wrap(pipeline.StoredStats, "load", "begin: stored statistics")
    rec.wrap(pipeline, "open_for_write", "archive open/create")
    rec.wrap(connection.Catalog, "check", "catalog open/migrate/check")
    rec.wrap(pipeline.Pipeline, "_begin", "begin (identity, runs row, known hashes)")
    rec.wrap(pipeline.Pipeline, "_process", "read loop (threads)")
    rec.wrap(pipeline.Pipeline, "_accept", "accept (dedup, pack buffer)")
    rec.wrap(pipeline.Pipeline, "_commit", "commit")
    rec.wrap(pipeline.Pipeline, "_finish", "finish (runs status)")
    rec.wrap(pipeline, "record_payloads", "commit: blobs/arrays rows")
    rec.wrap(pipeline, "insert_arrow", "commit: insert_arrow")
    rec.wrap(pipeline, "rows_table", "commit: rows_table")
    rec.wrap(pipeline, "load_entry", "load_entry (read+hash+stats)")
    rec.wrap(workers, "payload_hash", "xxh3 hash")
    rec.wrap(workers, "compute_stats", "statistics")
    rec.wrap(store.StoreWriter, "flush", "writer.flush (wait)")
    rec.wrap(store.StoreWriter, "close", "writer.close")
    rec.wrap(store.StoreWriter, "_collect", "writer: wait for a write")
    rec.wrap(store.StoreWriter, "_write_pack", "write pack")
    rec.wrap(store.StoreWriter, "_write_large", "write large")
    rec.wrap(store.StoreWriter, "_create", "zarr create_array (zarr.json)")
    rec.wrap(store, "encode_chunks", "compress pack chunks")
    rec.wrap(store, "write_shard", "write shard")
    rec.wrap(shard, "write_shard", "write shard")
    rec.wrap(local, "durable_put", "durable_put (write+fsync+rename)")
    rec.wrap(local, "fsync_dir", "fsync dir")
    rec.wrap(os, "fsync", "fsync")
    rec.wrap(archive, "open_tensor_store", "open tensor store")


def setting(item: str) -> None:
    """Apply one ``--set MODULE.NAME=VALUE`` (the longest importable module prefix)."""
    import ast
    import importlib

    target, _, value = item.partition("=")
    parts = target.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:-1]:
            obj = getattr(obj, name)
        setattr(obj, parts[-1], ast.literal_eval(value))
        return
    raise SystemExit(f"--set {item}: no module in {target!r}")


def main() -> None:
    """Import, instrument, ingest, print."""
    args = parse_args()
    rec = Recorder()
    sampler = threading.Thread(target=rec.sample, args=(args.tick,), daemon=True)
    sampler.start()
    t_import = time.perf_counter()
    import dumpdb.cli as cli

    instrument(rec)
    for item in args.set:
        setting(item)
    imported = time.perf_counter() - t_import
    work = Path(tempfile.mkdtemp(prefix="dumpdb-timeline-")) if args.archive is None else None
    archive = args.archive or (work / "archive")  # type: ignore[operator]
    cmd = ["ingest", str(args.dump), "--archive", str(archive), "--run", "timeline", "-q", *args.extra]
    t_ingest = time.perf_counter() - T0
    try:
        try:
            cli.app(cmd, standalone_mode=False)
        except SystemExit as exc:
            if exc.code not in (0, None):
                raise
    finally:
        rec.stop.set()
        sampler.join()
        end = time.perf_counter() - T0
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)
    report(rec, imported, t_ingest, end, args)


def report(rec: Recorder, imported: float, t_ingest: float, end: float, args: argparse.Namespace) -> None:
    """Print the phase table and the timeline."""
    seen: dict[int, tuple[float, float]] = {}  # thread -> (first, last) CPU seen (ended threads kept)
    for _, cpu in rec.samples:
        for k, v in cpu.items():
            seen[k] = (seen.get(k, (v, v))[0] if rec.samples[0][1].get(k) is not None else 0.0, v)
    total_cpu = sum(b - a for a, b in seen.values())
    print(f"imports (dumpdb.cli, lazy): {imported:.2f} s; ingest from {t_ingest:.2f} s to {end:.2f} s "
          f"(wall {end - t_ingest:.2f} s); process CPU sampled {total_cpu:.2f} s; "
          f"cores used {total_cpu / max(1e-9, end - t_ingest):.2f} of {os.cpu_count()}")
    print(f"\n{'phase':<42}{'calls':>8}{'wall s':>9}{'CPU s':>8}")
    for label, (n, w, c) in sorted(rec.calls.items(), key=lambda kv: -kv[1][1]):
        print(f"{label:<42}{int(n):>8}{w:>9.2f}{c:>8.2f}")
    if args.quiet_timeline or len(rec.samples) < 2:
        return
    print(f"\ntimeline (every {args.tick:g} s: cores busy, main thread's phase; '#' = 0.1 core)")
    phases = rec.main_phase
    j, phase = 0, "startup"
    idle = collections.Counter()
    for (t0, a), (t1, b) in zip(rec.samples, rec.samples[1:]):
        used = sum(v - a.get(k, 0.0) for k, v in b.items()) / (t1 - t0)
        while j < len(phases) and phases[j][0] <= t1:
            phase = phases[j][1]
            j += 1
        idle[phase] += max(0.0, (os.cpu_count() or 2) - used) * (t1 - t0)
        print(f"{t1:6.2f} {used:4.2f} {'#' * round(used * 10):<22} {phase}")
    print("\ncore-seconds idle while the main thread was in each phase:")
    for phase, s in idle.most_common():
        print(f"  {phase:<42}{s:6.2f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
