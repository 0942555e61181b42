#!/usr/bin/env python3
"""Benchmark ingest scale-out (issue 12): synthetic MindSpore dumps of R ranks x I iterations.

Cases (``--case``, repeatable; default all):

* ``stats``: statistics-only dump, ``--rows`` statistic.csv rows in all (split over ranks and
  iterations), ingested, side by side with DuckDB ``read_csv`` of the same files into a table.
* ``tiny``: ``--files`` tiny tensor files (a few hundred bytes each), ingested with
  ``--workers 1`` and 2, side by side with ``tar`` of the dump.
* ``tensors``: ``--size-mb`` of float32 tensors, ingested with ``--workers 1``, 2 and
  ``--scheduler local``, side by side with ``tar | zstd -T2``.

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

HEADER = ("Op Type,Op Name,Task ID,Stream ID,Timestamp,IO,Slot,Data Size,Data Type,Shape,Max Value,Min Value,"
          "Avg Value,Count,Negative Zero Count,Positive Zero Count,NaN Count,Negative Inf Count,"
          "Positive Inf Count,Zero Count\n")


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", action="append", choices=("stats", "tiny", "tensors"), help="cases to run (default all)")
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
    finally:
        if args.out is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
