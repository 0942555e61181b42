"""Benchmark of the sequence alignment: two op sequences of N ops per side (default 10^5)
that differ by inserted ops (casts, reshapes: 2 %) and removed ops (2 %), with realistic
repetition (layers repeat the same op types, scopes per layer). Prints the time of
:func:`dumpdb.compare.sequence.diff` on the tokens and of :func:`dumpdb.compare.align.align`
with the ``sequence`` strategy alone and after ``exact`` and ``normalized`` on one tensor
(output 0) per op, and the pairs found.

Usage: python scripts/bench_align.py [N]
"""

from __future__ import annotations

import random
import sys
import time

import pyarrow as pa

from dumpdb.compare.align import align
from dumpdb.compare.sequence import diff

OPS = ("MatMul", "BiasAdd", "Add", "LayerNorm", "Softmax", "Transpose", "Reshape", "Mul", "GeLU", "Div")


def sequences(n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    bench = [f"Default/net-LM/layers-{i // 40}/{OPS[rng.randrange(len(OPS))]}-op{i}" for i in range(n)]
    target = []
    for name in bench:
        if rng.random() < 0.02:
            continue  # removed on the target side
        if rng.random() < 0.02:
            target.append(name.rsplit("/", 1)[0] + "/Reshape-op99999")  # inserted
        target.append(name.replace("net-LM", "net-_OutputTo32/_backbone-LM"))
    return target, bench


def table(names: list[str], start: int) -> pa.Table:
    return pa.table({"tensor_id": list(range(start, start + len(names))),
                     "op_type": [n.rsplit("/", 1)[1].split("-")[0] for n in names], "op_name": names,
                     "io": ["output"] * len(names), "slot": [0] * len(names), "position": list(range(len(names)))})


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    target, bench = sequences(n)
    key = [t.replace("net-_OutputTo32/_backbone-LM", "net-LM").rsplit("-op", 1)[0] for t in target]
    bkey = [b.rsplit("-op", 1)[0] for b in bench]
    t0 = time.perf_counter()
    pairs = diff(key, bkey)
    t1 = time.perf_counter()
    print(f"diff: {len(key)} x {len(bkey)} tokens -> {len(pairs)} pairs in {t1 - t0:.2f} s")
    tt, bt = table(target, 1), table(bench, 10 * n)
    t0 = time.perf_counter()
    alone = align(tt, bt, strategies=("sequence",))
    t1 = time.perf_counter()
    print(f"align (sequence alone): {tt.num_rows} x {bt.num_rows} tensors in {t1 - t0:.2f} s: "
          f"{alone.counts()['sequence']} pairs")
    t0 = time.perf_counter()
    al = align(tt, bt, strategies=("exact", "normalized", "sequence"))
    t1 = time.perf_counter()
    c = al.counts()
    print(f"align (exact, normalized, sequence): {tt.num_rows} x {bt.num_rows} tensors in {t1 - t0:.2f} s: "
          f"sequence {c['sequence']}, unmatched target {c['unmatched_target']}, bench {c['unmatched_bench']}")


if __name__ == "__main__":
    main()
