#!/usr/bin/env python3
"""A timeline of one ``dumpdb compare``: which thread ran which phase when, and its CPU.

Runs the compare in this process (``dumpdb.cli``, the arguments after ``--``), with

* wrappers around the compare's phases (imports, selection, alignment, the kernel's load,
  each pair read, each segment the kernel computes, the small pairs' batches, verdicts,
  precision rules, ``arg_diff``, containers): per thread and phase, the calls, wall seconds,
  thread CPU seconds and the first start / last end (seconds from this script's start);
* a sampler thread reading every thread's on-CPU time (``/proc/self/task/*/schedstat``)
  and the process's resident memory (``/proc/self/statm``) every 10 ms: per bucket
  (``TIMELINE_BUCKET`` seconds, 0.1 by default), the cores busy, the highest RSS and each
  thread's share with the phase it was in;
* per thread, how long it had a task during the pair loop (``_compute``): a worker that
  waits for work, or in ``kernel.compiled()`` for numba, shows here.

The critical path is read off the phase table: what the main thread does before the pair
loop (imports, alignment) is serial; the loop's work is shared by the worker threads. On a
shared machine the wall seconds stretch with the load; the thread CPU seconds do not (much).
Used for issue 29's fourth round (docs/compare-kernel.md)::

    PYTHONPATH=. python scripts/compare_timeline.py -- compare RUN_A RUN_B -a ARCHIVE --no-store --show 0

Where ``PYTHONDONTWRITEBYTECODE`` is set (as in this project's shared environment), every
process compiles dumpdb's modules from source, ~0.25 CPU s of the imports that an installed
dumpdb (byte-compiled by pip) does not pay; run with ``PYTHONPYCACHEPREFIX=DIR`` and without
``PYTHONDONTWRITEBYTECODE``, once untimed, as ``bench_compare.py`` does.
"""

from __future__ import annotations

import collections
import functools
import os
import sys
import threading
import time

T0 = time.perf_counter()
EVENTS: list[tuple[int, int, str, float, float, float, float]] = []  # tid, depth, label, t0, t1, cpu0, cpu1
NAMES: dict[int, str] = {}  # native thread id -> thread name
SAMPLES: list[tuple[float, dict[int, int]]] = []  # (t, {tid: on-CPU ns})
RSS: list[tuple[float, int]] = []  # (t, resident bytes)
PAGE = os.sysconf("SC_PAGE_SIZE")
_stop = threading.Event()
_local = threading.local()


def _started_before() -> float:
    """Seconds between the process's start and this script's first line (10 ms resolution)."""
    with open("/proc/self/stat") as f:
        start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


def _sample() -> None:
    me = threading.get_native_id()
    while not _stop.is_set():
        t = time.perf_counter() - T0
        cpu = {}
        for tid in os.listdir("/proc/self/task"):
            if int(tid) == me:
                continue
            try:
                with open(f"/proc/self/task/{tid}/schedstat") as f:
                    cpu[int(tid)] = int(f.read().split()[0])
            except OSError:  # the thread ended meanwhile
                pass
        SAMPLES.append((t, cpu))
        with open("/proc/self/statm") as f:
            RSS.append((t, int(f.read().split()[1]) * PAGE))
        time.sleep(0.01)


def wrap(owner, name: str, label: str | None = None) -> None:
    """Record every call of ``owner.name`` (nested calls keep their depth)."""
    f = getattr(owner, name)
    label = label or name

    @functools.wraps(f)
    def recorded(*args, **kwargs):
        depth = getattr(_local, "depth", 0)
        _local.depth = depth + 1
        tid = threading.get_native_id()
        NAMES.setdefault(tid, threading.current_thread().name)
        t, c = time.perf_counter() - T0, time.thread_time()
        try:
            return f(*args, **kwargs)
        finally:
            EVENTS.append((tid, depth, label, t, time.perf_counter() - T0, c, time.thread_time()))
            _local.depth = depth

    setattr(owner, name, recorded)


def _record(label: str, t: float, c: float) -> None:
    EVENTS.append((threading.get_native_id(), 0, label, t, time.perf_counter() - T0, c, time.thread_time()))


def instrument() -> None:
    """Import the compare's modules (timed) and wrap its phases."""
    t, c = time.perf_counter() - T0, time.thread_time()
    import dumpdb.cli  # noqa: F401

    _record("import dumpdb.cli", t, c)
    t, c = time.perf_counter() - T0, time.thread_time()
    import dumpdb.archive  # noqa: F401
    import dumpdb.compare.engine as engine
    import dumpdb.storage.store as store
    from dumpdb.compare import kernel, metrics

    _record("import archive/engine/store", t, c)
    for name in ("select_rows", "align", "align_exact", "_pair_sides", "_view", "_arg_diff", "_judge",
                 "_judge_precision", "_result_table", "_store", "first_divergence_of", "_departure_report",
                 "_compute", "_compute_large", "_plan_large", "_identical", "_compute_statistics", "_add_containers",
                 "first_difference_of", "_pair_in_thread", "_read_pair", "_read_many", "_put_small", "_finish",
                 "statistics_pairs", "_statistics_columns", "_proc_as_rank0", "release_free_memory",
                 "_verdicts_and_precision"):
        if hasattr(engine, name):
            wrap(engine, name)
    from dumpdb.compare import stats_pairs

    for name in ("_take", "exact_paired", "execution_order"):  # the statistics compare's pairing
        if hasattr(stats_pairs, name):
            wrap(stats_pairs, name)
    for name in ("_kernel_rows", "_kernel_segments", "tensor_metrics", "_batch_group"):
        wrap(metrics, name)
    wrap(metrics.SplitPair, "_segment", "segment")
    wrap(metrics.SplitPair, "finish", "split.finish")
    wrap(kernel, "compiled", "kernel.compiled")
    wrap(kernel, "wait_preload", "kernel.wait_preload")
    if hasattr(engine, "_EarlyPairs"):  # the exact pairs started during the alignment
        wrap(engine._EarlyPairs, "start", "early.start")
        wrap(engine._EarlyPairs, "finish", "early.finish")
    for name in ("read", "read_many"):
        wrap(store.TensorStore, name, f"store.{name}")
    wrap(store, "decode_frame", "decode")


def report(started: float, end: float, bucket: float, out) -> None:
    """The phase table, the buckets and the pair loop's busy times (to ``out``)."""
    print(f"\n== timeline (s from script start; the interpreter started {started:.2f} s before) ==", file=out)
    print(f"process ~{started + end:.2f} s wall, {sum(os.times()[:2]):.2f} s CPU", file=out)
    agg: dict[tuple[str, str], list] = collections.defaultdict(lambda: [0, 0.0, 0.0, 1e9, 0.0, 9])
    for tid, depth, label, a, b, c0, c1 in EVENTS:
        g = agg[(NAMES.get(tid, str(tid)), label)]
        g[0] += 1
        g[1] += b - a
        g[2] += c1 - c0
        g[3], g[4], g[5] = min(g[3], a), max(g[4], b), min(g[5], depth)
    print(f"{'thread':24s} {'phase':30s} {'calls':>6s} {'wall':>7s} {'cpu':>7s} {'from':>6s} {'to':>6s}", file=out)
    for (thread, label), (n, wall, cpu, a, b, depth) in sorted(agg.items(), key=lambda kv: (kv[0][0], kv[1][3])):
        print(f"{thread:24s} {'  ' * depth + label:30s} {n:6d} {wall:7.2f} {cpu:7.2f} {a:6.2f} {b:6.2f}", file=out)

    tids = sorted({tid for _, cpu in SAMPLES for tid in cpu})
    short = {tid: NAMES.get(tid, "?").replace("dumpdb-compare-", "").replace("dumpdb-compare", "w")[:14]
             for tid in tids}
    nb = int(end / bucket) + 1
    busy: dict[int, list[float]] = collections.defaultdict(lambda: [0.0] * nb)
    prev: dict[int, int] = {}
    for t, cpu in SAMPLES:
        k = min(int(t / bucket), nb - 1)
        for tid, ns in cpu.items():
            if tid in prev:
                busy[tid][k] += (ns - prev[tid]) / 1e9
            prev[tid] = ns
    phase: dict[int, list] = collections.defaultdict(lambda: [collections.Counter() for _ in range(nb)])
    for tid, depth, label, a, b, _, _ in EVENTS:
        k = int(a / bucket)
        while k < nb and k * bucket < b:
            lo, hi = max(a, k * bucket), min(b, (k + 1) * bucket)
            if hi > lo:
                phase[tid][k][(depth, label)] += hi - lo
            k += 1

    def top(counter) -> str:  # the deepest phase covering a good part of the bucket
        if not counter:
            return ""
        return max(counter.items(), key=lambda kv: (kv[1] > bucket * 0.3, kv[0][0], kv[1]))[0][1]

    rss = [0] * nb
    for t, b in RSS:
        k = min(int(t / bucket), nb - 1)
        rss[k] = max(rss[k], b)
    shown = [tid for tid in tids if sum(busy[tid]) > 0.05]
    print("\n t(s)  cores  RSS MB | " + " | ".join(f"{short[t]:>22s}" for t in shown), file=out)
    for k in range(nb):
        cells = []
        for t in shown:
            share = busy[t][k] / bucket
            cells.append(f"{top(phase[t][k])[:16]:>16s} {share:4.0%}" if share > 0.02 or phase[t][k] else " " * 22)
        print(f"{k * bucket:5.1f} {sum(busy[t][k] for t in tids) / bucket:5.2f} {rss[k] / 2**20:7.0f} | "
              + " | ".join(cells), file=out)

    loop = [e for e in EVENTS if e[2] == "_compute"]
    if loop:
        a0, b0 = loop[0][3], loop[0][4]
        print(f"\npair loop (_compute) {a0:.2f}-{b0:.2f} s: how long each thread had a task", file=out)
        for tid in tids:
            spans = sorted((a, b) for t_, depth, label, a, b, _, _ in EVENTS
                           if t_ == tid and depth == 0 and b > a0 and a < b0 and label not in ("_compute", "cli (all)"))
            had, until = 0.0, a0
            for a, b in spans:
                a, b = max(a, until), min(b, b0)
                if b > a:
                    had += b - a
                    until = b
            if had:
                print(f"  {short[tid]:14s} {had:6.2f} s of {b0 - a0:.2f} s", file=out)


def entry_point(command: str) -> None:
    """What the ``dumpdb`` command does for ``command`` before it imports the CLI
    (:mod:`dumpdb.__main__`: the pandas probe of the ingest commands and compare, numba's
    BLAS probe of compare), where the checkout has it (an older one may not)."""
    t, c = time.perf_counter() - T0, time.thread_time()
    import dumpdb.__main__ as entry

    if command in getattr(entry, "NO_PANDAS_COMMANDS", ()):
        entry.skip_pandas_probe()
    if command in getattr(entry, "NO_BLAS_PROBE_COMMANDS", ()):
        entry.skip_blas_probe()
        if hasattr(entry, "skip_numba_extras"):
            entry.skip_numba_extras()
    _record("dumpdb entry point", t, c)


def main() -> None:
    started = _started_before()
    sampler = threading.Thread(target=_sample, daemon=True)
    sampler.start()
    NAMES[threading.get_native_id()] = "main"
    sys.argv = ["dumpdb", *(sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else sys.argv[1:])]
    entry_point(sys.argv[1] if len(sys.argv) > 1 else "")
    instrument()
    import dumpdb.cli as cli

    t, c = time.perf_counter() - T0, time.thread_time()
    try:
        cli.main()
    except SystemExit:
        pass
    _record("cli (all)", t, c)
    end = time.perf_counter() - T0
    _stop.set()
    sampler.join()
    report(started, end, float(os.environ.get("TIMELINE_BUCKET", "0.1")), sys.stderr)


if __name__ == "__main__":
    main()
