#!/usr/bin/env python3
"""Benchmark `dumpdb compare`: throughput (GB/s of tensor data compared) and peak memory.

Generates two MindSpore-layout runs with the ingest benchmark's realistic generator
(scripts/bench_ingest.py): run "bench" as generated, run "target" the same dump with
every floating-point tensor perturbed (x * (1 + 1e-3 * noise), so no pair can take
the identical-payload shortcut and every pair reads both tensors), ingests both into
one archive, then times `dumpdb compare target bench` in its own process and reads its
peak RSS. Baseline in the same run: `cat` of both dumps (read speed of the machine
now), so the ratio compare-time / cat-time is comparable across noisy runs.

    python scripts/bench_compare.py --size-gb 2.0       # issue 4: two 2 GB runs
    python scripts/bench_compare.py --size-gb 0.1 --keep --out /tmp/bc
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_ingest  # noqa: E402  (the shared dump generator)

GB = 1e9
TARGET_GBPS = 0.3
TARGET_PEAK_MB = 1000


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size-gb", type=float, default=2.0, help="payload of EACH run (default 2.0)")
    p.add_argument("--iterations", type=int, default=2, help="iterations per run (default 2)")
    p.add_argument("--out", type=Path, default=Path("bench-out-compare"), help="work directory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=None, help="passed to dumpdb compare -j")
    p.add_argument("--keep", action="store_true", help="keep the generated dumps and archive")
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


def _tree_rss_kib(root: int) -> int:
    """Sum of VmRSS over ``root`` and all its descendants (compare's worker processes)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
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
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += rss.get(pid, 0)
        stack.extend(children.get(pid, []))
    return total


def timed(cmd: list[str], log: Path) -> tuple[float, int]:
    """(wall seconds, peak RSS KiB of the whole process tree, sampled every 50 ms) of
    ``cmd``; exits if it fails."""
    with open(log, "w") as f:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, _tree_rss_kib(proc.pid))
            time.sleep(0.05)
        wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)} (see {log})")
    return wall, peak


def main() -> None:
    args = parse_args()
    out = args.out.resolve()
    bench_ingest.remove(out)
    out.mkdir(parents=True)
    dumpdb = bench_ingest.find_dumpdb()
    t0 = time.perf_counter()
    files, payload = bench_ingest.generate(out / "bench", args.size_gb, args.iterations, args.seed)
    perturb(out / "bench" / "dump", out / "target" / "dump", args.seed + 1)
    print(f"generated 2 runs x {files} files, {payload / GB:.3f} GB each, in {time.perf_counter() - t0:.1f} s")
    archive = out / "archive.dumpdb"
    for run in ("bench", "target"):
        wall, _ = timed([dumpdb, "ingest", str(out / run / "dump"), "-a", str(archive), "--run", run, "-q"],
                        out / f"ingest-{run}.log")
        print(f"ingest {run}: {wall:.1f} s")
    os.sync()
    cat = ["sh", "-c", f"find '{out / 'bench'}' '{out / 'target'}' -name '*.npy' -print0 | xargs -0 cat > /dev/null"]
    cat_s, _ = timed(cat, out / "cat.log")
    cmd = [dumpdb, "compare", "target", "bench", "-a", str(archive), "--show", "0",
           "--csv", str(out / "compare.csv")]
    if args.workers:
        cmd += ["-j", str(args.workers)]
    wall, rss_kib = timed(cmd, out / "compare.log")
    both = 2 * payload / GB / wall  # tensor bytes of both runs that went through the comparison
    per_run = payload / GB / wall
    peak_mb = rss_kib / 1024
    print((out / "compare.log").read_text().strip().splitlines()[0])
    print(f"\n== dumpdb compare benchmark: 2 runs x {payload / GB:.3f} GB, {files} tensor pairs ==")
    print(f"cat of both dumps       {cat_s:.2f} s (baseline read, same run)")
    print(f"compare                 {wall:.2f} s  ({wall / cat_s:.1f}x cat)")
    print(f"throughput              {both:.3f} GB/s of tensor data compared (both runs' bytes / time); "
          f"{per_run:.3f} GB/s per run   target >= {TARGET_GBPS}: {'PASS' if both >= TARGET_GBPS else 'MISS'}"
          f" (per run: {'PASS' if per_run >= TARGET_GBPS else 'MISS'})")
    print(f"peak compare RSS        {peak_mb:.0f} MB (all processes together)   target < {TARGET_PEAK_MB} MB: "
          f"{'PASS' if peak_mb < TARGET_PEAK_MB else 'MISS'}")
    if not args.keep:
        bench_ingest.remove(out)


if __name__ == "__main__":
    main()
