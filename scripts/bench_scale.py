#!/usr/bin/env python3
"""Benchmark ingest scale-out (issue 12): synthetic MindSpore dumps of R ranks x I iterations.

Cases (``--case``, repeatable; default all):

* ``stats``: statistics-only dump, ``--rows`` statistic.csv rows in all (split over ranks and
  iterations), ingested, side by side with DuckDB ``read_csv`` of the same files into a table.
* ``tiny``: ``--files`` tiny tensor files (a few hundred bytes each), ingested with
  ``--workers 1`` and 2, side by side with ``tar`` of the dump.
* ``tensors``: ``--size-mb`` of float32 tensors, ingested with ``--workers 1``, 2 and
  ``--scheduler local``, side by side with ``tar | zstd -T2``.
* ``compare`` (issue 29): an 8-rank pair of runs (``--compare-ranks``; simulated ranks of the real
  MindSpore LeNet5 pair of the corpus, ``--target``/``--bench``: rank r's floating-point
  payloads scaled by 1 + r/1024) ingested into a local SeaweedFS S3 store
  (``weed server -s3``, ``-master.volumeSizeLimitMB=64``, an ``-s3.config`` identity), then
  ``dumpdb compare`` run locally and with ``--scheduler local -j 2`` (a 2-worker
  LocalCluster whose workers read S3 themselves), the same rows; beside them the figures of
  ARCHITECTURE.md's cost model (the fixed part measured by a ``--mode statistics`` compare
  that reads no payload, the cluster's start by starting one): its prediction of the
  cluster compare's time against the measured one.

Every ingest runs ``python -m dumpdb ingest`` in a fresh archive; peak RSS is the largest of
the process and its workers, CPU the user + system seconds of the process and its workers
(``wait4``). The machine is shared and noisy: the ratios, measured in the same run, are the
figures to read, not the seconds; on a loaded machine the CPU seconds say what a quiet one
would give (wall >= CPU / cores).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

CORPUS = Path("/work/shared/corpus/mindspore-cpu")
HEADER = ("Op Type,Op Name,Task ID,Stream ID,Timestamp,IO,Slot,Data Size,Data Type,Shape,Max Value,Min Value,"
          "Avg Value,Count,Negative Zero Count,Positive Zero Count,NaN Count,Negative Inf Count,"
          "Positive Inf Count,Zero Count\n")


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", action="append", choices=("stats", "tiny", "tensors", "compare"),
                   help="cases to run (default stats, tiny, tensors)")
    p.add_argument("--target", type=Path, default=CORPUS / "d2_compare_fp16_bf16",
                   help="compare case: the real dump whose ranks are simulated (target)")
    p.add_argument("--bench", type=Path, default=CORPUS / "d1_compare_fp32", help="compare case: bench dump")
    p.add_argument("--compare-ranks", type=int, default=8, help="compare case: simulated ranks (default 8)")
    p.add_argument("--ranks", type=int, default=2, help="rank directories R (default 2)")
    p.add_argument("--iterations", type=int, default=2, help="iteration directories per rank I (default 2)")
    p.add_argument("--rows", type=int, default=1_000_000, help="statistic.csv rows in all (default 10^6)")
    p.add_argument("--files", type=int, default=100_000, help="tiny tensor files in all (default 100,000)")
    p.add_argument("--size-mb", type=float, default=512, help="tensor payload of the 'tensors' case, MB")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="worker counts to try (default 1 2)")
    p.add_argument("--dask", action="store_true", help="also --scheduler local in the 'tensors' case")
    p.add_argument("--out", type=Path, help="work directory (default: a temporary one, removed)")
    return p.parse_args()


def run(cmd: list[str], **kw) -> tuple[float, float, float]:
    """(seconds, peak RSS MB, CPU seconds (user + system) of the command and its waited-for children)."""
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **kw)
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - t
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    code = os.waitstatus_to_exitcode(status)
    if code not in (0,):
        raise SystemExit(f"{' '.join(cmd[:6])}...: exit {code}\n{err[-2000:]}")
    return elapsed, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime


def shell(cmd: str) -> tuple[float, float, float]:
    return run(["bash", "-o", "pipefail", "-c", cmd])


def ingest(dump: Path, work: Path, *extra: str) -> tuple[float, float, float]:
    archive = work / f"archive-{time.monotonic_ns()}"
    try:
        return run([sys.executable, "-m", "dumpdb", "ingest", str(dump), "--archive", str(archive), "-q", *extra])
    finally:
        shutil.rmtree(archive, ignore_errors=True)


def it_dirs(root: Path, ranks: int, iterations: int) -> list[Path]:
    dirs = []
    for r in range(ranks):
        (root / f"rank_{r}" / ".dump_metadata").mkdir(parents=True, exist_ok=True)
        for i in range(iterations):
            d = root / f"rank_{r}" / "Net" / "0" / str(i)
            d.mkdir(parents=True, exist_ok=True)
            dirs.append(d)
    return dirs


def make_stats(root: Path, ranks: int, iterations: int, rows: int) -> list[Path]:
    files = []
    dirs = it_dirs(root, ranks, iterations)
    per = rows // len(dirs)
    for k, d in enumerate(dirs):
        path = d / "statistic.csv"
        with open(path, "w") as f:
            f.write(HEADER)
            for i in range(per):
                f.write(f"MatMul,Default/network-Net/MatMul-op{i},{i % 65536},0,{1_700_000_000_000_000 + i},"
                        f"{'input' if i % 2 else 'output'},{i % 3},4096,float32,\"(32,32)\",{i * 0.5},{-i * 0.25},"
                        f"{i * 0.01},1024,0,0,0,0,0,{(i + k) % 7}\n")
        files.append(path)
    return files


def make_tensors(root: Path, ranks: int, iterations: int, files: int, nbytes: int) -> int:
    rng = np.random.default_rng(0)
    dirs = it_dirs(root, ranks, iterations)
    per = max(1, files // len(dirs))
    n = max(1, nbytes // 4)
    total = 0
    for d in dirs:
        for i in range(per):
            arr = rng.standard_normal(n).astype(np.float32)
            np.save(d / f"Add.Default_network-Net_Add-op{i}.0.0.{1_700_000_000_000_000 + i}.output.0.DefaultFormat"
                        f".Float32.npy", arr)
            total += arr.nbytes
    return total


def report(name: str, base: tuple[float, float, float], base_name: str,
           rows: list[tuple[str, tuple[float, float, float]]], units: float, unit: str) -> None:
    print(f"\n== {name}")
    print(f"  {base_name:<28} {base[0]:8.2f} s  peak {base[1]:7.0f} MB  cpu {base[2]:7.2f} s")
    for label, (secs, rss, cpu) in rows:
        print(f"  {label:<28} {secs:8.2f} s  peak {rss:7.0f} MB  cpu {cpu:7.2f} s  {units / secs:12,.0f} {unit}/s  "
              f"{secs / base[0]:6.2f}x {base_name}")


def simulate_ranks(src: Path, out: Path, ranks: int) -> int:
    """``src``'s rank_0 copied as rank_0..rank_{ranks-1}; rank r's floating-point .npy payloads
    scaled by 1 + r/1024 (each rank its own content; bfloat16 files, which numpy cannot
    parse, stay as they are). Returns the payload bytes written."""
    total = 0
    for r in range(ranks):
        dst = out / f"rank_{r}"
        shutil.copytree(src / "rank_0", dst)
        for f in dst.rglob("*.npy"):
            total += f.stat().st_size
            if r == 0:
                continue
            try:
                a = np.load(f)
            except ValueError:
                continue
            if a.dtype.kind == "f":
                with np.errstate(all="ignore"):
                    np.save(f, (a * (1 + r / 1024)).astype(a.dtype))
    return total


def compare_case(args, work: Path) -> None:
    """The ``compare`` case (module docstring)."""
    from dumpdb.storage.testing import seaweedfs_server

    nbytes = sum(simulate_ranks(src, work / name, args.compare_ranks) for name, src in (("target", args.target),
                                                                               ("bench", args.bench)))
    files = sum(1 for _ in work.rglob("*.npy"))
    with seaweedfs_server(work / "weed") as s3:
        env = {**os.environ, **s3.env()}
        url = f"s3://{s3.bucket()}/archive"
        archive = work / "archive"
        for run_name in ("target", "bench"):
            run([sys.executable, "-m", "dumpdb", "ingest", str(work / run_name), "-a", str(archive), "--run", run_name,
                 "-q", "--store", url], env=env)
        objects = sum(page.get("KeyCount", 0) for page in s3.client().get_paginator("list_objects_v2").paginate(
            Bucket=url.split("/")[2]))
        base = [sys.executable, "-m", "dumpdb", "compare", "target", "bench", "-a", str(archive), "--no-store",
                "--show", "0"]
        fixed = run([*base, "--mode", "statistics"], env=env)
        start = run([sys.executable, "-c", "from dumpdb.cluster import dask_client\n"
                     "with dask_client('local', 2) as c: c.submit(int, 1).result()"], env=env)
        imports = run([sys.executable, "-c", "import dumpdb.compare.engine, dumpdb.compare.distributed"], env=env)
        local = run(base, env=env)
        cluster = run([*base, "--scheduler", "local", "-j", "2"], env=env)
    payload = local[0] - fixed[0]  # the local compare's payload part: reads and metrics
    cores = os.cpu_count() or 1
    predicted = fixed[0] + start[0] + payload / min(2, cores)
    print(f"compare: {args.compare_ranks} simulated ranks x 2 runs, {files} files, {nbytes / 1e6:.0f} MB of .npy, "
          f"{objects} S3 objects (SeaweedFS)")
    print(f"  local compare                  {local[0]:7.2f} s  cpu {local[2]:6.2f} s  peak {local[1]:5.0f} MB")
    print(f"  --scheduler local -j 2         {cluster[0]:7.2f} s  cpu {cluster[2]:6.2f} s  peak {cluster[1]:5.0f} MB"
          f"  = {cluster[0] / local[0]:.2f}x the local compare's time")
    print(f"  model, wall: fixed (--mode statistics) {fixed[0]:.2f} s + cluster start {start[0]:.2f} s + payload "
          f"part {payload:.2f} s / min(2 workers, {cores} cores) = {predicted:.2f} s predicted, "
          f"{cluster[0]:.2f} s measured ({cluster[0] / predicted:.2f}x the prediction)")
    predicted_cpu = local[2] + start[2] + 2 * imports[2]
    print(f"  model, cpu: local {local[2]:.2f} s + cluster start {start[2]:.2f} s + 2 workers x engine imports "
          f"{imports[2]:.2f} s = {predicted_cpu:.2f} s predicted, {cluster[2]:.2f} s measured "
          f"({cluster[2] / predicted_cpu:.2f}x the prediction)")


def main() -> None:
    args = parse_args()
    cases = args.case or ["stats", "tiny", "tensors"]
    work = args.out or Path(tempfile.mkdtemp(prefix="bench-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"cores {os.cpu_count()}, R={args.ranks} ranks x I={args.iterations} iterations, work dir {work}")
    try:
        if "stats" in cases:
            dump = work / "stats"
            files = make_stats(dump, args.ranks, args.iterations, args.rows)
            glob = str(dump / "rank_*" / "Net" / "0" / "*" / "statistic.csv")
            duck = run([sys.executable, "-c", "import duckdb, sys; c = duckdb.connect(); c.execute("
                        "\"CREATE TABLE t AS SELECT * FROM read_csv(?, header=true)\", [sys.argv[1]]); "
                        "print(c.execute('SELECT count(*) FROM t').fetchone())", glob])
            rows = [(f"dumpdb ingest --workers {n}", ingest(dump, work, "--workers", str(n))) for n in args.workers[:1]]
            size = sum(f.stat().st_size for f in files)
            report(f"statistics-only, {args.rows:,} rows, {size / 1e6:.0f} MB csv", duck, "duckdb read_csv",
                   rows, args.rows, "rows")
            shutil.rmtree(dump)
        if "tiny" in cases:
            dump = work / "tiny"
            make_tensors(dump, args.ranks, args.iterations, args.files, 64)
            tar = shell(f"tar -cf {work}/tiny.tar -C {dump} . && rm {work}/tiny.tar")
            rows = [(f"dumpdb ingest --workers {n}", ingest(dump, work, "--workers", str(n))) for n in args.workers]
            report(f"{args.files:,} tiny tensor files", tar, "tar", rows, args.files, "files")
            shutil.rmtree(dump)
        if "tensors" in cases:
            dump = work / "tensors"
            nfiles = max(1, int(args.size_mb * 1e6 / (1 << 20)))
            total = make_tensors(dump, args.ranks, args.iterations, nfiles, 1 << 20)
            tar = shell(f"tar -cf - -C {dump} . | zstd -q -T2 -3 > {work}/t.tar.zst && rm {work}/t.tar.zst")
            rows = [(f"dumpdb ingest --workers {n}", ingest(dump, work, "--workers", str(n))) for n in args.workers]
            if args.dask:
                rows.append(("dumpdb ingest --scheduler local",
                             ingest(dump, work, "--scheduler", "local", "--workers", "2")))
            report(f"tensors, {total / 1e6:.0f} MB in {nfiles} files", tar, "tar | zstd -T2", rows, total / 1e6, "MB")
            if len(rows) >= 2:
                print(f"  2 workers vs 1: {rows[0][1][0] / rows[1][1][0]:.2f}x the throughput")
            shutil.rmtree(dump)
        if "compare" in cases:
            compare_case(args, work / "compare")
    finally:
        if args.out is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
