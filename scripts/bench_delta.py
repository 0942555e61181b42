#!/usr/bin/env python3
"""Delta coding (issue 13, ``dumpdb/storage/delta.py``): what it saves and what it costs.

Ingests ``DUMP`` twice, alternately plain (``delta=False``, the baseline) and with delta
coding (the default), ``--repeats`` times each, and prints in the same run:

* stored bytes of each archive (store + catalog) and their ratio, and how many payloads
  (and payload bytes) went in as deltas;
* ingest wall time of each (median) and their ratio;
* read cost: every tensor stored as a delta in the one archive read by ``tensor_id`` from a
  freshly opened archive, against the same tensors (same source files) read from the plain
  archive and against ``np.load`` of the source files; ns per byte, medians over
  ``--reads`` passes, each pass alternating the three.

The figures are this machine's, now: compare ratios, not seconds.

    python scripts/bench_delta.py --dump DIR [--out DIR] [--repeats 2] [--reads 3]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time
from pathlib import Path

import numpy as np

import dumpdb


def tree_bytes(path: Path) -> int:
    """Bytes of every file below ``path``."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def ingest(dump: Path, archive: Path, delta: bool) -> float:
    """Seconds to ingest ``dump`` into a new ``archive``."""
    shutil.rmtree(archive, ignore_errors=True)
    t0 = time.perf_counter()
    report = dumpdb.ingest(dump, archive=archive, run="bench", delta=delta)
    took = time.perf_counter() - t0
    if not report.ok:
        raise SystemExit(f"ingest of {dump} failed: {report.errors[:3]}")
    return took


def read_pass(archive: Path, ids: list[int]) -> float:
    """Seconds to read ``ids`` from ``archive`` opened afresh."""
    a = dumpdb.open(archive)
    with a:
        a.tensor(ids[0])  # the location index and the first pack's metadata: not what is measured
        t0 = time.perf_counter()
        for tid in ids:
            a.tensor(tid)
        return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dump", type=Path, required=True, help="dump directory to ingest")
    p.add_argument("--out", type=Path, default=Path("bench-delta"), help="work directory (default ./bench-delta)")
    p.add_argument("--repeats", type=int, default=2, help="ingests of each kind, alternating (default 2)")
    p.add_argument("--reads", type=int, default=3, help="read passes (default 3)")
    p.add_argument("--keep", action="store_true", help="keep the archives")
    args = p.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    plain, coded = out / "plain.dumpdb", out / "delta.dumpdb"
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.repeats):
        for delta in (False, True):
            times[delta].append(ingest(args.dump, coded if delta else plain, delta))
    sizes = {False: tree_bytes(plain), True: tree_bytes(coded)}
    a = dumpdb.open(coded)
    source = Path(a.sql("SELECT source_path FROM runs WHERE run = 'bench'").to_pylist()[0]["source_path"])
    rows = a.sql("SELECT t.tensor_id, t.source_file, t.nbytes FROM tensors t JOIN blobs b USING (content_hash) "
                 "WHERE b.base_hash IS NOT NULL ORDER BY t.tensor_id").to_pylist()
    counts = a.sql("SELECT count(*) AS n, coalesce(sum(nbytes), 0) AS bytes FROM blobs "
                   "WHERE base_hash IS NOT NULL").to_pylist()[0]
    print(f"\n== delta coding: {args.dump} ==")
    print(f"stored bytes plain         {sizes[False] / 1e6:10.2f} MB  (store + catalog)")
    print(f"stored bytes delta         {sizes[True] / 1e6:10.2f} MB  ratio delta/plain {sizes[True] / sizes[False]:.4f}")
    print(f"delta payloads             {counts['n']} ({int(counts['bytes']) / 1e6:.2f} MB of payload)")
    print(f"ingest s plain / delta     {statistics.median(times[False]):.2f} / {statistics.median(times[True]):.2f}"
          f"  ratio delta/plain {statistics.median(times[True]) / statistics.median(times[False]):.3f}")
    if rows:
        by_file = {r["source_file"]: r["tensor_id"] for r in dumpdb.open(plain).sql(
            "SELECT tensor_id, source_file FROM tensors").to_pylist()}
        ids = [r["tensor_id"] for r in rows]
        plain_ids = [by_file[r["source_file"]] for r in rows]
        files = [source / r["source_file"] for r in rows]
        nbytes = sum(r["nbytes"] for r in rows)
        cost: dict[str, list[float]] = {"delta": [], "plain": [], "np.load": []}
        for _ in range(args.reads):
            cost["delta"].append(read_pass(coded, ids))
            cost["plain"].append(read_pass(plain, plain_ids))
            t0 = time.perf_counter()
            for f in files:
                np.load(f)
            cost["np.load"].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) / nbytes * 1e9 for k, v in cost.items()}
        print(f"read {len(ids)} delta tensors ({nbytes / 1e6:.2f} MB): ns/byte delta {med['delta']:.2f}, "
              f"same tensors plain {med['plain']:.2f}, np.load {med['np.load']:.2f}")
        print(f"read delta / plain          {med['delta'] / med['plain']:.2f}   "
              f"delta / np.load {med['delta'] / med['np.load']:.2f}")
    else:
        print("read: no payload stored as a delta in this dump")
    if not args.keep:
        shutil.rmtree(plain, ignore_errors=True)
        shutil.rmtree(coded, ignore_errors=True)


if __name__ == "__main__":
    main()
