"""Benchmark of the sequence alignment: two op sequences of N ops per side (default 10^5)
that differ by inserted ops (casts, reshapes: 2 %) and removed ops (2 %), with realistic
repetition (layers repeat the same op types, scopes per layer). Prints the time of
:func:`dumpdb.compare.sequence.diff` on the tokens and of :func:`dumpdb.compare.align.align`
with the ``sequence`` strategy alone and after ``exact`` and ``normalized`` on one tensor
(output 0) per op, and the pairs found.

Then the content check (issue 26): msprobe-style call names (``Tensor.__add__.K.forward``,
per-API counters) with catalog statistics, N ops per side, against a baseline measured in
the same run, the plain exact join (a dict from name to row, the pairs it gives):
``align`` (exact, normalized, sequence) on two equal runs (every name pair checked, none
taken back) and on a rewrite (target computes one op by 9 calls near the start, so every
later counter of those APIs shifts: their families are re-aligned by sequence).

Usage: python scripts/bench_align.py [N] [--content-only]   (N first: 100000 by default)

First divergence of two real steps (issue 26: "two real 2 GB steps within 2x the time of
today's"): ``--first-divergence ARCHIVE TARGET BENCH --baseline CHECKOUT [--baseline-archive
ARCHIVE] [--rounds K]`` runs ``dumpdb first-divergence TARGET BENCH`` as a subprocess with
this checkout's dumpdb and with the baseline checkout's (``PYTHONPATH``), alternating, K
rounds (default 2), and prints the wall and CPU time (the child's user + system) of each and
their ratio. The baseline reads ``--baseline-archive`` (default ARCHIVE): an older dumpdb may
not open an archive a newer one migrated, so ingest the same dumps into one archive per
code. Nothing else runs in that mode.
"""

from __future__ import annotations

import os
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa

from dumpdb.compare.align import align
from dumpdb.compare.align_sql import align_exact
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


def first_divergence(argv: list[str]) -> None:
    """The --first-divergence mode (module docstring)."""
    import argparse

    ap = argparse.ArgumentParser(prog="bench_align.py --first-divergence")
    ap.add_argument("archive", type=Path)
    ap.add_argument("target")
    ap.add_argument("bench")
    ap.add_argument("--baseline", type=Path, required=True, help="a checkout of the baseline dumpdb")
    ap.add_argument("--baseline-archive", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    here = Path(__file__).resolve().parent.parent
    codes = {"this": (here, args.archive), "baseline": (args.baseline.resolve(), args.baseline_archive or args.archive)}
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in codes}
    for r in range(args.rounds):
        for label in (("baseline", "this") if r % 2 == 0 else ("this", "baseline")):
            src, archive = codes[label]
            env = dict(os.environ, PYTHONPATH=str(src))
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "dumpdb", "first-divergence", "-a", str(archive),
                                   args.target, args.bench], env=env, capture_output=True, text=True)
            wall = time.perf_counter() - t0
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
            if done.returncode not in (0, 1):
                sys.exit(f"{label} first-divergence failed (exit {done.returncode}): {done.stderr.strip()[-500:]}")
            first = done.stdout.splitlines()[0] if done.stdout else ""
            times[label].append((wall, cpu))
            print(f"round {r + 1} {label:8s} ({src}): {wall:.1f} s wall, CPU {cpu:.1f} s: {first}")
    best = {k: (min(w for w, _ in v), min(c for _, c in v)) for k, v in times.items()}
    print(f"first-divergence {args.target} vs {args.bench}: best wall {best['this'][0]:.1f} s against "
          f"{best['baseline'][0]:.1f} s = {best['this'][0] / best['baseline'][0]:.2f}x; best CPU "
          f"{best['this'][1]:.1f} s against {best['baseline'][1]:.1f} s = {best['this'][1] / best['baseline'][1]:.2f}x")


def main() -> None:
    if "--first-divergence" in sys.argv:
        first_divergence([a for a in sys.argv[1:] if a != "--first-divergence"])
        return
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    if "--content-only" in sys.argv:
        content(n)
        return
    target, bench = sequences(n)
    key = [t.replace("net-_OutputTo32/_backbone-LM", "net-LM").rsplit("-op", 1)[0] for t in target]
    bkey = [b.rsplit("-op", 1)[0] for b in bench]
    t0, c0 = time.perf_counter(), time.process_time()
    pairs = diff(key, bkey)
    base, cbase = time.perf_counter() - t0, time.process_time() - c0
    print(f"diff (the baseline here): {len(key)} x {len(bkey)} tokens -> {len(pairs)} pairs in {base:.2f} s "
          f"(CPU {cbase:.2f} s)")
    tt, bt = table(target, 1), table(bench, 10 * n)
    t0, c0 = time.perf_counter(), time.process_time()
    alone = align(tt, bt, strategies=("sequence",))
    dt, ct = time.perf_counter() - t0, time.process_time() - c0
    print(f"align (sequence alone): {tt.num_rows} x {bt.num_rows} tensors in {dt:.2f} s ({dt / base:.1f}x the diff), "
          f"CPU {ct:.2f} s ({ct / cbase:.1f}x): {alone.counts()['sequence']} pairs")
    t0, c0 = time.perf_counter(), time.process_time()
    al = align(tt, bt, strategies=("exact", "normalized", "sequence"))
    dt, ct = time.perf_counter() - t0, time.process_time() - c0
    c = al.counts()
    print(f"align (exact, normalized, sequence): {tt.num_rows} x {bt.num_rows} tensors in {dt:.2f} s "
          f"({dt / base:.1f}x the diff), CPU {ct:.2f} s ({ct / cbase:.1f}x): "
          f"sequence {c['sequence']}, unmatched target {c['unmatched_target']}, bench {c['unmatched_bench']}")

    content(n)


APIS = ("Tensor.__add__", "Functional.linear", "Tensor.__mul__", "Functional.layer_norm", "Torch.softmax",
        "Tensor.transpose", "Functional.gelu", "Tensor.view")
REWRITE = ("Tensor.mean", "Tensor.__sub__", "Tensor.__mul__", "Tensor.mean", "Tensor.__add__", "Torch.sqrt",
           "Tensor.__truediv__", "Tensor.__mul__", "Tensor.__add__")


def msprobe_run(n: int, rewrite_at: int | None, seed: int = 1) -> pa.Table:
    """n ops (one output tensor each) with per-API counters and statistics; ``rewrite_at``:
    the layer_norm there is replaced by the 9 calls of a hand-written LayerNorm."""
    rng = random.Random(seed)
    count: dict[str, int] = {}
    rows: dict[str, list] = {k: [] for k in ("tensor_id", "op_type", "op_name", "io", "slot", "shape", "dtype",
                                             "l2norm", "mean", "min", "max")}

    def add(api: str, stats: tuple) -> None:
        k = count.get(api, 0)
        count[api] = k + 1
        for key, v in zip(rows, (len(rows["tensor_id"]), api, f"{api}.{k}.forward", "output", 0, [8, 64],
                                 "float32", *stats)):
            rows[key].append(v)

    for i in range(n):
        api = APIS[rng.randrange(len(APIS))]
        stats = (rng.uniform(1, 50), rng.uniform(-1, 1), rng.uniform(-9, -2), rng.uniform(2, 9))
        if i == rewrite_at:
            for j, part in enumerate(REWRITE):
                add(part, (10.0 + j, 0.1 * j, -3.0 - j, 3.0 + j))
            continue
        add(api, stats)
    n_rows = len(rows["tensor_id"])
    for c in ("scope_name", "slot_path", "arg_name", "iteration", "rank", "graph_id", "timestamp"):
        rows[c] = [None] * n_rows
    rows["position"] = list(range(n_rows))
    return pa.table(rows)


def content(n: int) -> None:
    bench = msprobe_run(n, None)
    same = msprobe_run(n, None)
    rewrite = msprobe_run(n, 100)

    def exact_join(t: pa.Table, b: pa.Table) -> int:
        where = dict(zip(b.column("op_name").to_pylist(), range(b.num_rows)))
        return sum(1 for name in t.column("op_name").to_pylist() if name in where)

    # wall time and CPU time of this process (the CPU ratio is the steadier one on a shared machine)
    t0, c0 = time.perf_counter(), time.process_time()
    joined = exact_join(same, bench)
    base, cbase = time.perf_counter() - t0, time.process_time() - c0
    print(f"content check, {n} msprobe calls a side; baseline (plain exact join, dict): {joined} pairs in "
          f"{base:.2f} s (CPU {cbase:.2f} s)")

    def timed(label: str, what: str, run) -> object:
        t0, c0 = time.perf_counter(), time.process_time()
        out = run()
        dt, ct = time.perf_counter() - t0, time.process_time() - c0
        print(f"  {label}: {dt:.2f} s ({dt / base:.0f}x the join), CPU {ct:.2f} s ({ct / cbase:.0f}x): {what(out)}")
        return out

    for label, target in (("equal runs", same), ("LayerNorm by hand at call 100", rewrite)):
        def what(al) -> str:
            c = al.counts()
            return (f"exact {c['exact']}, sequence {c['sequence']}, "
                    f"re-aligned {sum(al.pairs.column('realigned').to_pylist())}, suspects {al.suspects.num_rows}")
        timed(f"align, {label}", what,
              lambda target=target: align(target, bench, strategies=("exact", "normalized", "sequence")))
    timed("align_exact (SQL, with its content check), equal runs",
          lambda sql: "settled" if sql is not None else "declined",
          lambda: align_exact(same, bench, strategies=("exact", "normalized", "sequence")))


if __name__ == "__main__":
    main()
