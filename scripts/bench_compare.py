#!/usr/bin/env python3
"""Benchmark `dumpdb compare`: tensor throughput, tiny-pair fixed cost, statistics compare.

Three scenarios, each timed as a whole `dumpdb compare` process (wall time and peak RSS of
the process tree, workers included) against a baseline measured in the same run:

* ``tensor``: two tensor dumps compared pair by pair. By default two runs of the ingest
  benchmark's generator (scripts/bench_ingest.py), the target with every floating tensor
  perturbed so no pair takes the identical-payload shortcut; ``--dump-a``/``--dump-b``
  compare two real dumps instead (e.g. two ``make_big_dump.sh`` runs with different
  ``--seed``). Baseline: ``cat`` of both dumps' ``.npy`` files. Figure: GB/s per run
  (one run's tensor bytes / compare time).
  One more compare, untimed, runs the kernel's numpy form (``DUMPDB_METRICS_KERNEL=numpy``)
  and must store the same ``compare_results`` rows as the compiled kernel (issue 29: results
  identical to the numpy path; ``--no-numpy-check`` skips it).
* ``tiny``: ``--tiny-pairs`` (default 131,000) pairs of tiny float32 tensors (4-64
  elements) in two MindSpore-layout dumps. Baseline: ``cat`` of the same files. Figures:
  compare time, per-pair cost, peak RSS.
* ``stats``: ``--stat-pairs`` (default 500,000) pairs of statistics-only tensors in two
  msprobe statistics dumps (``dump.json``). Baseline: one DuckDB query joining the two
  runs' statistics in the same archive and computing the four differences and relative
  differences (its own process, read-only). Figures: compare time / join time, peak RSS,
  and CPU seconds (user + system) against the join's (less sensitive to other processes
  sharing the cores; ``--repeat N`` gives medians of N runs, the join timed before each), and
  the CPU seconds of a process that only imports the CLI and the compare engine (the
  fixed part of every compare process; the join's process imports duckdb alone).

    python scripts/bench_compare.py                          # all three, defaults
    python scripts/bench_compare.py --only tiny --tiny-pairs 20000
    python scripts/bench_compare.py --only tensor --dump-a /tmp/big/run1 --dump-b /tmp/big/run2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_ingest  # noqa: E402  (the shared dump generator)

GB = 1e9
TARGET_GBPS = 1.0          # issue 13: tensor compare per run
TARGET_TINY_S = 15.0       # issue 13: 131,000 tiny pairs
TARGET_PEAK_MB = 1000
TARGET_STATS_RATIO = 5.0   # issue 13: statistics compare vs one DuckDB join


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", choices=("tensor", "tiny", "stats"), action="append",
                   help="run only these scenarios (repeatable; default all)")
    p.add_argument("--size-gb", type=float, default=2.0, help="generated tensor dump: payload of EACH run")
    p.add_argument("--iterations", type=int, default=2, help="generated tensor dump: iterations per run")
    p.add_argument("--dump-a", type=Path, help="tensor scenario: a real dump (the bench side)")
    p.add_argument("--dump-b", type=Path, help="tensor scenario: a real dump (the target side)")
    p.add_argument("--tiny-pairs", type=int, default=131_000)
    p.add_argument("--stat-pairs", type=int, default=500_000)
    p.add_argument("--out", type=Path, default=Path("bench-out-compare"), help="work directory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=None, help="passed to dumpdb compare -j")
    p.add_argument("--keep", action="store_true", help="keep the generated dumps and archives")
    p.add_argument("--reuse", action="store_true",
                   help="reuse the dumps and archives a --keep run left in --out (skip generating and ingesting)")
    p.add_argument("--tensor-archive", type=Path,
                   help="tensor scenario: an archive that already holds both runs (see --runs); with --dump-a/-b "
                        "for the cat baseline and the byte count")
    p.add_argument("--runs", default="target,bench", help="tensor scenario: TARGET,BENCH run names")
    p.add_argument("--repeat", type=int, default=1,
                   help="run each compare this many times (before and after alternating) and report the medians "
                        "(other processes sharing the cores make single runs noisy)")
    p.add_argument("--no-numpy-check", dest="numpy_check", action="store_false",
                   help="tensor scenario: skip the one untimed compare with the kernel's numpy form "
                        "(DUMPDB_METRICS_KERNEL=numpy) whose compare_results must equal the compiled kernel's")
    p.add_argument("--before", type=Path,
                   help="a checkout of dumpdb before the change: each compare also runs with PYTHONPATH=BEFORE "
                        "on the same archive (before/after in one session)")
    return p.parse_args()


def perturb(src: Path, dst: Path, seed: int) -> None:
    """Copy the dump at ``src`` to ``dst`` with every floating tensor slightly changed."""
    rng = np.random.default_rng(seed)
    for path in sorted(src.rglob("*")):
        out = dst / path.relative_to(src)
        if path.is_dir():
            out.mkdir(parents=True, exist_ok=True)
            continue
        out.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix != ".npy":
            shutil.copyfile(path, out)
            continue
        a = np.load(path)
        if a.dtype.kind == "f" and a.size:
            noise = rng.standard_normal(a.size, dtype=np.float32).reshape(a.shape)
            with np.errstate(invalid="ignore", over="ignore"):
                a = (a * (1 + 1e-3 * noise)).astype(a.dtype)
        np.save(out, a)


def tiny_dump(out: Path, pairs: int, seed: int, perturbed: bool) -> int:
    """A MindSpore e2e dump (one iteration) of ``pairs`` tiny float32 tensors (4-64
    elements, one output per op). Returns the payload bytes."""
    rank = out / "rank_0"
    (rank / ".dump_metadata").mkdir(parents=True)
    (rank / ".dump_metadata" / "config.json").write_text('{"device_target":"CPU","ms_version":"2.10.0"}')
    folder = rank / "Net" / "0" / "0"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    noise = np.random.default_rng(seed + 1)
    sizes = rng.integers(4, 65, pairs)
    payload = 0
    stamp = 1_795_336_652_543_735
    for k in range(pairs):
        x = rng.standard_normal(int(sizes[k]), dtype=np.float32)
        if perturbed:
            x = (x * (1 + 1e-3 * noise.standard_normal(x.size, dtype=np.float32))).astype(np.float32)
        stamp += 17
        name = f"Default_network-WithLossCell__backbone-Net_layer{k % 7}-Dense_MatMul-op{k}"
        np.save(folder / f"MatMul.{name}.0.0.{stamp}.output.0.DefaultFormat.Float32.npy", x)
        payload += x.nbytes
    return payload


def stats_dump(out: Path, pairs: int, seed: int, perturbed: bool) -> None:
    """An msprobe PyTorch statistics dump (L1, one step, one process) of ``pairs``
    statistics-only tensors: ``pairs // 2`` API calls with one input and one output."""
    proc = out / "step0" / "proc1000"
    proc.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    calls = pairs // 2
    stats = rng.standard_normal((calls, 2, 4))
    stats[..., 3] = np.abs(stats[..., 3]) * 10
    if perturbed:
        stats *= 1 + 1e-3 * np.random.default_rng(seed + 1).standard_normal(stats.shape)
    apis = ("relu", "linear", "gelu", "softmax", "layer_norm", "dropout", "add", "matmul")
    data = {}
    for k in range(calls):
        def t(s):
            return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [4, 16], "Max": float(s[0]),
                    "Min": float(s[1]), "Mean": float(s[2]), "Norm": float(s[3]), "requires_grad": False}
        data[f"Functional.{apis[k % len(apis)]}.{k // len(apis)}.forward"] = {
            "input_args": [t(stats[k, 0])], "input_kwargs": {}, "output": [t(stats[k, 1])]}
    doc = {"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None, "data": data}
    (proc / "dump.json").write_text(json.dumps(doc, separators=(",", ":")))
    (proc / "stack.json").write_text("{}")
    (proc / "construct.json").write_text("{}")


def _tree_rss_kib(root: int) -> int:
    """Sum of VmRSS over ``root`` and all its descendants (compare's worker processes), or
    ``root``'s own VmHWM (its peak RSS since it started) if that is larger."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    hwm = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        pid = int(entry)
        children.setdefault(int(fields.get("PPid", "0").strip()), []).append(pid)
        rss[pid] = int(fields.get("VmRSS", "0 kB").split()[0])
        if pid == root:
            hwm = int(fields.get("VmHWM", "0 kB").split()[0])
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += rss.get(pid, 0)
        stack.extend(children.get(pid, []))
    return max(total, hwm)


# CPU seconds (user + system, the process and the children it waited for) of the last
# timed() command: less sensitive than wall time to other processes sharing the cores.
LAST_CPU = {"seconds": 0.0}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(cmd: list[str], log: Path, env: dict | None = None) -> tuple[float, int]:
    """(wall seconds, peak RSS KiB) of ``cmd`` (its CPU seconds in ``LAST_CPU``); exits if it
    fails. Sampled every 50 ms: the larger of the whole process tree's RSS (worker processes
    counted together) and the process's own high-water mark (``VmHWM``, its exact peak so far:
    a threads-only compare's peak between two samples is not missed)."""
    cpu0 = _children_cpu()
    with open(log, "w") as f:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, _tree_rss_kib(proc.pid))
            time.sleep(0.05)
        wall = time.perf_counter() - start
    LAST_CPU["seconds"] = _children_cpu() - cpu0
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)} (see {log})")
    return wall, peak


def version_env(path: str, out: Path) -> dict[str, str]:
    """The environment of a timed Python process: ``PYTHONPATH=path``, and bytecode read from
    and written to ``out/pycache`` (``PYTHONPYCACHEPREFIX``; ``PYTHONDONTWRITEBYTECODE``
    dropped). An installed dumpdb runs from bytecode compiled at install; a checkout whose
    ``__pycache__`` cannot be written (``PYTHONDONTWRITEBYTECODE=1``) or is stale compiles
    its modules in every process (0.1-0.4 s of CPU, more for the larger checkout), which is
    no cost of the compare. The first, untimed run of each command fills the cache."""
    env = {**os.environ, "PYTHONPATH": path, "PYTHONPYCACHEPREFIX": str(out / "pycache")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def cat_seconds(dirs: list[Path], log: Path) -> float:
    """Wall time of ``cat`` of every ``.npy`` (and ``.json``) file below ``dirs`` (page cache as it is)."""
    os.sync()
    roots = " ".join(f"'{d}'" for d in dirs)
    cmd = ["sh", "-c", f"find {roots} \\( -name '*.npy' -o -name '*.json' \\) -print0 | xargs -0 cat > /dev/null"]
    return timed(cmd, log)[0]


def ingest(dumpdb: str, dump: Path, archive: Path, run: str, out: Path) -> float:
    wall, _ = timed([dumpdb, "ingest", str(dump), "-a", str(archive), "--run", run, "-q"], out / f"ingest-{run}.log")
    print(f"  ingest {run}: {wall:.1f} s")
    return wall


def compare_cmd(args, dumpdb: str, archive: Path, runs: tuple[str, str], *extra: str) -> list[str]:
    """The ``dumpdb compare`` command line every timed or checking compare runs."""
    cmd = [dumpdb, "compare", *runs, "-a", str(archive), "--show", "0", *extra]
    return cmd + (["-j", str(args.workers)] if args.workers else [])


def compare(args, dumpdb: str, archive: Path, out: Path, name: str, *extra: str,
            runs: tuple[str, str] = ("target", "bench"), baseline: list[str] | None = None,
            ) -> list[tuple[str, float, float]]:
    """[(label, wall s, peak MB)] of ``dumpdb compare`` (before, if --before, then now): the
    medians of ``--repeat`` runs each. ``baseline``: a command timed before each repetition
    (the same load for both), its medians first as label ``baseline``."""
    cmd = compare_cmd(args, dumpdb, archive, runs, *extra)
    versions = ([("before", str(args.before.resolve()))] if args.before else []) + \
        [("after", os.environ.get("PYTHONPATH", ""))]
    measured: dict[str, list[tuple[float, float, float]]] = {label: [] for label, _ in versions}
    if baseline:
        measured = {"baseline": [], **measured}
        timed(baseline, out / f"{name}-baseline.log", version_env(os.environ.get("PYTHONPATH", ""), out))
    for label, path in versions:  # untimed: fills the bytecode cache (version_env)
        timed(cmd, out / f"compare-{name}-{label}.log", version_env(path, out))
    for k in range(max(args.repeat, 1)):
        if baseline:
            wall, rss_kib = timed(baseline, out / f"{name}-baseline.log",
                                  version_env(os.environ.get("PYTHONPATH", ""), out))
            print(f"  baseline (run {k + 1}): {wall:.2f} s (cpu {LAST_CPU['seconds']:.2f} s), {rss_kib / 1024:.0f} MB")
            measured["baseline"].append((wall, rss_kib / 1024, LAST_CPU["seconds"]))
        for label, path in versions:
            env = version_env(path, out)
            log = out / f"compare-{name}-{label}.log"
            wall, rss_kib = timed(cmd, log, env)
            lines = log.read_text().strip().splitlines()
            print(f"  {label} (run {k + 1}): {wall:.2f} s (cpu {LAST_CPU['seconds']:.2f} s), {rss_kib / 1024:.0f} MB: "
                  f"{lines[0] if lines else ''}")
            measured[label].append((wall, rss_kib / 1024, LAST_CPU["seconds"]))
    found = []
    for label in measured:
        walls, peaks, cpus = zip(*measured[label])
        CPU_MEDIAN[label] = float(np.median(cpus))
        found.append((label, float(np.median(walls)), float(np.median(peaks))))
    return found


CPU_MEDIAN: dict[str, float] = {}  # label -> median CPU seconds of compare()'s last runs


def mark(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def tensor_scenario(args, dumpdb: str, out: Path) -> list[str]:
    print("== tensor compare ==")
    runs = tuple(args.runs.split(","))
    if args.dump_a and args.dump_b:
        bench_dir, target_dir = args.dump_a.resolve(), args.dump_b.resolve()
        _, payload = bench_ingest.npy_payload(target_dir)
    else:
        bench_dir, target_dir = out / "bench" / "dump", out / "target" / "dump"
        if not args.reuse:
            files, _ = bench_ingest.generate(out / "bench", args.size_gb, args.iterations, args.seed)
            perturb(out / "bench" / "dump", out / "target" / "dump", args.seed + 1)
            print(f"  generated 2 runs x {files} files")
        _, payload = bench_ingest.npy_payload(target_dir)
    archive = args.tensor_archive.resolve() if args.tensor_archive else out / "tensor.dumpdb"
    if not args.tensor_archive and not args.reuse:
        ingest(dumpdb, bench_dir, archive, runs[1], out)
        ingest(dumpdb, target_dir, archive, runs[0], out)
    cat_s = cat_seconds([bench_dir, target_dir], out / "cat-tensor.log")
    lines = [f"tensor: {payload / GB:.2f} GB per run; cat of both dumps {cat_s:.2f} s (baseline: "
             f"{payload / GB / cat_s:.2f} GB/s per run)"]
    found = compare(args, dumpdb, archive, out, "tensor", runs=runs)  # type: ignore[arg-type]
    if args.before:  # a faster compare with other results is no result (SystemExit if they differ)
        lines.append(same_rows(archive / "catalog.duckdb", out, "tensor"))
    if args.numpy_check:  # issue 29: the compiled kernel's results are the numpy path's
        env = {**version_env(os.environ.get("PYTHONPATH", ""), out), "DUMPDB_METRICS_KERNEL": "numpy"}
        wall, _ = timed(compare_cmd(args, dumpdb, archive, runs), out / "compare-tensor-numpy.log", env)
        print(f"  numpy path (untimed check): {wall:.2f} s (cpu {LAST_CPU['seconds']:.2f} s)")
        lines.append(same_rows(archive / "catalog.duckdb", out, "tensor", ("after", "numpy")))
    for label, wall, peak in found:
        per_run = payload / GB / wall
        cpu = CPU_MEDIAN[label]  # CPU seconds: less moved than wall time by other processes' load
        before = CPU_MEDIAN.get("before")
        vs = f" = {cpu / before:.2f}x before" if label == "after" and before else ""
        lines.append(
            f"tensor {label}: {wall:.2f} s = {wall / cat_s:.1f}x cat; {per_run:.3f} GB/s per run; cpu {cpu:.2f} s{vs}   "
            f"target >= {TARGET_GBPS}: {mark(per_run >= TARGET_GBPS)}; peak RSS {peak:.0f} MB "
            f"(target <= {TARGET_PEAK_MB}: {mark(peak <= TARGET_PEAK_MB)})")
    return lines


def make_runs(dumpdb: str, out: Path, name: str, archive: Path, make_dump) -> None:
    """Generate the bench and the (perturbed) target dump ``out/NAME-bench``, ``out/NAME-target``
    with ``make_dump(directory, perturbed)`` and ingest both into ``archive`` as runs bench, target."""
    t0 = time.perf_counter()
    make_dump(out / f"{name}-bench", False)
    make_dump(out / f"{name}-target", True)
    print(f"  generated in {time.perf_counter() - t0:.1f} s")
    ingest(dumpdb, out / f"{name}-bench", archive, "bench", out)
    ingest(dumpdb, out / f"{name}-target", archive, "target", out)


def tiny_scenario(args, dumpdb: str, out: Path) -> list[str]:
    print(f"== {args.tiny_pairs} tiny pairs ==")
    archive = out / "tiny.dumpdb"
    if not args.reuse:
        make_runs(dumpdb, out, "tiny", archive, lambda d, perturbed: tiny_dump(d, args.tiny_pairs, args.seed,
                                                                                perturbed=perturbed))
    cat_s = cat_seconds([out / "tiny-bench", out / "tiny-target"], out / "cat-tiny.log")
    lines = [f"tiny: {args.tiny_pairs} pairs; cat of the files {cat_s:.2f} s (baseline)"]
    for label, wall, peak in compare(args, dumpdb, archive, out, "tiny"):
        scaled = wall * 131_000 / args.tiny_pairs
        lines.append(
            f"tiny {label}: {wall:.2f} s = {wall / cat_s:.1f}x cat ({1e3 * wall / args.tiny_pairs:.3f} ms/pair; "
            f"{scaled:.1f} s scaled to 131,000)   target <= {TARGET_TINY_S} s: {mark(scaled <= TARGET_TINY_S)}; "
            f"peak RSS {peak:.0f} MB (target <= {TARGET_PEAK_MB}: {mark(peak <= TARGET_PEAK_MB)})")
    return lines


JOIN_SQL = """
COPY (
WITH t AS (SELECT * FROM tensors WHERE run = 'target'), b AS (SELECT * FROM tensors WHERE run = 'bench')
SELECT t.tensor_id, b.tensor_id,
       t.max - b.max, abs((t.max - b.max) / nullif(b.max, 0)),
       t.min - b.min, abs((t.min - b.min) / nullif(b.min, 0)),
       t.mean - b.mean, abs((t.mean - b.mean) / nullif(b.mean, 0)),
       t.l2norm - b.l2norm, abs((t.l2norm - b.l2norm) / nullif(b.l2norm, 0))
FROM t JOIN b ON t.op_name = b.op_name AND t.io = b.io AND t.slot IS NOT DISTINCT FROM b.slot
    AND t.iteration IS NOT DISTINCT FROM b.iteration AND t.rank IS NOT DISTINCT FROM b.rank
) TO '{out}' (FORMAT parquet)
"""


def stats_scenario(args, dumpdb: str, out: Path) -> list[str]:
    print(f"== {args.stat_pairs} statistics pairs ==")
    archive = out / "stats.dumpdb"
    if not args.reuse:
        make_runs(dumpdb, out, "stats", archive, lambda d, perturbed: stats_dump(d, args.stat_pairs, args.seed,
                                                                                  perturbed=perturbed))
    catalog = archive / "catalog.duckdb"
    join = [sys.executable, "-c",
            "import duckdb, sys; con = duckdb.connect(sys.argv[1], read_only=True); con.execute(sys.argv[2])",
            str(catalog), JOIN_SQL.format(out=out / "join.parquet")]
    found = compare(args, dumpdb, archive, out, "stats", "--mode", "statistics", baseline=join)
    _, join_s, join_peak = found.pop(0)
    median = f" (medians of {args.repeat} runs)" if args.repeat > 1 else ""
    join_cpu = CPU_MEDIAN["baseline"]
    lines = [f"stats: {args.stat_pairs} pairs; one DuckDB join {join_s:.2f} s (cpu {join_cpu:.2f} s), peak "
             f"{join_peak:.0f} MB (baseline){median}"]
    startup = startup_cpu(args, out)
    if args.before:
        lines.append(same_rows(catalog, out, "stats"))
    for label, wall, peak in found:
        ratio = wall / join_s
        cpu = CPU_MEDIAN[label]
        lines.append(
            f"stats {label}: {wall:.2f} s = {ratio:.1f}x the join   target <= {TARGET_STATS_RATIO}x: "
            f"{mark(ratio <= TARGET_STATS_RATIO)}; cpu {cpu:.2f} s = {cpu / join_cpu:.1f}x the join's; peak RSS "
            f"{peak:.0f} MB (target <= {TARGET_PEAK_MB}: {mark(peak <= TARGET_PEAK_MB)}); of which importing "
            f"the CLI and the compare engine (no work) cpu {startup[label]:.2f} s")
    return lines


def same_rows(catalog: Path, out: Path, name: str, labels: tuple[str, str] = ("before", "after")) -> str:
    """Whether the last compares of two versions (``labels``: before and after, or after and
    the kernel's numpy form) stored the same ``compare_results`` rows:
    every column but ``compare_id`` of every row, ``EXCEPT ALL`` both ways (doubles as DuckDB
    compares them: NaN equals NaN, -0.0 equals 0.0; reason strings and verdicts too) and the same counts.
    The compare ids come from each version's log (its first line, ``compare N: ...``).
    Raises SystemExit when they differ: a faster compare with other results is no result."""
    import duckdb

    ids = {}
    for label in labels:
        first = (out / f"compare-{name}-{label}.log").read_text().split(":", 1)[0].split()
        ids[label] = int(first[1])
    con = duckdb.connect(str(catalog), read_only=True)
    try:
        cols = ", ".join(f'"{c}"' for c in (r[0] for r in con.execute(
            "SELECT column_name FROM duckdb_columns() WHERE table_name = 'compare_results' "
            "AND column_name <> 'compare_id' ORDER BY column_index").fetchall()))
        sel = f"SELECT {cols} FROM compare_results WHERE compare_id = ?"
        counts = [con.execute(f"SELECT count(*) FROM ({sel})", [i]).fetchone()[0] for i in ids.values()]
        first, second = (ids[label] for label in labels)
        extra = [con.execute(f"SELECT count(*) FROM ({sel} EXCEPT ALL {sel})", [a, b]).fetchone()[0]
                 for a, b in ((first, second), (second, first))]
    finally:
        con.close()
    one, two = labels
    verdict = f"{name}: compare_results of {one} (compare {ids[one]}) and {two} (compare {ids[two]}): " \
              f"{counts[0]} and {counts[1]} rows, {extra[0]} only {one}, {extra[1]} only {two} (EXCEPT ALL, " \
              "every column but compare_id)"
    print(verdict)
    if counts[0] != counts[1] or any(extra):
        raise SystemExit(f"DIFFERENT RESULTS: {verdict}")
    return verdict + ": identical"


def startup_cpu(args, out: Path) -> dict[str, float]:
    """Median CPU seconds of a process that only imports ``dumpdb.cli`` and the compare
    engine, per version (before, after): the fixed part of a compare process, which the
    join's process (``import duckdb``) pays little of."""
    versions = ([("before", str(args.before.resolve()))] if args.before else []) + \
        [("after", os.environ.get("PYTHONPATH", ""))]
    cpus: dict[str, list[float]] = {label: [] for label, _ in versions}
    for _ in range(max(args.repeat, 1)):
        for label, path in versions:
            timed([sys.executable, "-c", "import dumpdb.cli, dumpdb.compare.engine"], out / f"startup-{label}.log",
                  version_env(path, out))
            cpus[label].append(LAST_CPU["seconds"])
    return {label: float(np.median(v)) for label, v in cpus.items()}


def main() -> None:
    args = parse_args()
    out = args.out.resolve()
    if not args.reuse:
        bench_ingest.remove(out)
    out.mkdir(parents=True, exist_ok=True)
    dumpdb = bench_ingest.find_dumpdb()
    only = args.only or ["tensor", "tiny", "stats"]
    lines: list[str] = []
    for name, fn in (("tensor", tensor_scenario), ("tiny", tiny_scenario), ("stats", stats_scenario)):
        if name in only:
            lines += fn(args, dumpdb, out)
    print("\n== dumpdb compare benchmark ==")
    print("\n".join(lines))
    if not args.keep and not args.reuse:
        bench_ingest.remove(out)


if __name__ == "__main__":
    main()
