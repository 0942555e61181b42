#!/usr/bin/env python3
"""Benchmark `dumpdb ingest` against `tar -I 'zstd -T2 -3'` on a MindSpore 2.x sync dump.

Generates a deterministic synthetic dump (see reference/performance.md, "Synthetic corpus"),
warms the page cache, then times A = dumpdb ingest and B = tar+zstd alternately (A B A B ...).
With --cold, the dump's pages are dropped from the page cache before each timed run instead
(posix_fadvise DONTNEED per file: no root needed), as for a dump read for the first time.
The machine is noisy, so the figures that matter are the ratios, not the seconds.
Exit status is non-zero only when a subprocess fails; a missed target is only reported.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

GB = 1e9
MIN_BYTES, MAX_BYTES = 4, 8 << 20
# file-name dtype: (numpy dtype, target share of bytes, share of tensor count)
DTYPES = {"Float32": (np.float32, 0.70, 0.69), "Float16": (np.float16, 0.28, 0.26), "Int32": (np.int32, 0.02, 0.05)}
VALUE_KINDS = (("normal", 0.4), ("relu", 0.3), ("const", 0.1), ("grad", 0.2))
FROZEN_SHARE, REUSE_SHARE, NONFINITE_SHARE = 0.30, 0.25, 0.01
OPS = (("Conv2D", "Conv2d"), ("BatchNorm", "BatchNorm2d"), ("ReLU", "ReLU"), ("MaxPool", "MaxPool2d"),
       ("MatMul", "Dense"), ("BiasAdd", "Dense"), ("Add", "Add"), ("ReluGrad", "ReLU"),
       ("Conv2DBackpropInput", "Conv2d"), ("Conv2DBackpropFilter", "Conv2d"), ("ApplyMomentum", None))
PARAM_KINDS = ("conv_weight", "bn_gamma", "bn_beta", "bn_moving_mean", "bn_moving_variance", "fc_bias")
TARGET_TIME, TARGET_SIZE = 1.5, 0.30  # issue 13: store <= 0.30x of tar | zstd -3


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size-gb", type=float, default=1.0, metavar="GB", help="total .npy payload to generate, GB (1e9 B); default 1.0")
    p.add_argument("--iterations", type=int, default=3, metavar="N", help="iteration directories to generate (default 3)")
    p.add_argument("--out", type=Path, default=Path("bench-out"), metavar="DIR", help="work directory (default ./bench-out)")
    p.add_argument("--dump", type=Path, metavar="DIR", help="benchmark this existing dump directory instead of generating one")
    p.add_argument("--repeats", type=int, default=2, metavar="N", help="number of A/B (ingest/tar) pairs (default 2)")
    p.add_argument("--keep", action="store_true", help="keep generated files (default: delete them at the end)")
    p.add_argument("--seed", type=int, default=0, metavar="N", help="generator seed (default 0)")
    p.add_argument("--workers", type=int, metavar="N", help="reader threads, passed to 'dumpdb ingest -j'")
    p.add_argument("--cold", action="store_true",
                   help="drop the dump from the page cache before each timed run (default: warm it once)")
    args = p.parse_args()
    if args.size_gb <= 0 or args.iterations < 1 or args.repeats < 1:
        p.error("--size-gb must be > 0, --iterations and --repeats >= 1")
    return args


def plan_iteration(rng: np.random.Generator, budget: int) -> list[dict]:
    """Tensor specs of one iteration: op inputs/outputs plus ~30 % frozen Parameter tensors.

    About 25 % of op inputs point ("src") at an earlier output; payload bytes sum to ``budget``.
    """
    specs: list[dict] = []
    assigned = dict.fromkeys(DTYPES, 0)
    counters: dict[str, int] = {}
    outputs: list[int] = []
    left = budget

    def new(role: str, **name) -> None:
        nonlocal left
        size = min(left, int(math.exp(rng.uniform(math.log(MIN_BYTES), math.log(MAX_BYTES)))))
        total = sum(assigned.values()) + size
        names = list(DTYPES)
        if size >= 1 << 20:  # the large tensors carry the bytes: give them to the dtypes below their byte share
            weights = np.array([max(0.0, DTYPES[d][1] * total - assigned[d]) + 1e-9 for d in names])
        else:
            weights = np.array([DTYPES[d][2] for d in names])
        dname = names[rng.choice(len(names), p=weights / weights.sum())]
        itemsize = np.dtype(DTYPES[dname][0]).itemsize
        n = max(1, size // itemsize)
        kind = "labels" if dname == "Int32" else VALUE_KINDS[rng.choice(4, p=[w for _, w in VALUE_KINDS])][0]
        assigned[dname] += n * itemsize
        left -= n * itemsize
        specs.append({"role": role, "dtype": dname, "n": n, "kind": kind, "seed": len(specs),
                      "nonfinite": kind != "labels" and rng.random() < NONFINITE_SHARE, **name})

    while left > 0:
        op_type, cell = OPS[rng.integers(len(OPS))]
        k = counters[op_type] = counters.get(op_type, -1) + 1
        layer = rng.integers(1, 5)
        if cell is None:
            scope = f"Default/optimizer-Momentum/{op_type}-op{k}"
        elif "Grad" in op_type or "Backprop" in op_type:
            scope = f"Gradients/Default/network-WithLossCell/_backbone-Net/layer{layer}-{cell}/{op_type}-op{k}"
        else:
            scope = f"Default/network-WithLossCell/_backbone-Net/layer{layer}-{cell}/{op_type}-op{k}"
        base = {"op_type": op_type, "op_name": scope.replace("/", "_")}
        for slot in range(int(rng.integers(1, 3))):
            if left <= 0:
                break
            src = outputs[-1 - rng.integers(min(8, len(outputs)))] if outputs and rng.random() < REUSE_SHARE else None
            if src is not None and specs[src]["n"] * np.dtype(DTYPES[specs[src]["dtype"]][0]).itemsize <= left:
                specs.append({**specs[src], "role": "input", "slot": slot, "src": src, **base})
                left -= specs[src]["n"] * np.dtype(DTYPES[specs[src]["dtype"]][0]).itemsize
            else:
                new("input", slot=slot, **base)
        if left > 0:
            new("output", slot=0, **base)
            outputs.append(len(specs) - 1)
        n_ops = sum(1 for s in specs if s["role"] != "param")
        while left > 0 and (len(specs) - n_ops) < FROZEN_SHARE / (1 - FROZEN_SHARE) * n_ops:
            i = len(specs) - n_ops
            prefix = "moments_" if i % 4 == 3 else ""  # optimizer state next to the weights
            new("param", op_type="Parameter", slot=0,
                op_name=f"{prefix}layer{i // len(PARAM_KINDS)}_{PARAM_KINDS[i % len(PARAM_KINDS)]}")
    return specs


def make_shape(rng: np.random.Generator, n: int) -> tuple[int, ...]:
    """A plausible 1-D, 2-D (N, features) or 4-D (N, C, H, W) shape with exactly ``n`` elements."""
    divisors = [d for d in (1, 2, 3, 4, 8, 16, 32, 64, 128, 256, 512) if n % d == 0 and n // d >= 4]
    if n < 64 or not divisors or rng.random() < 0.2:
        return (n,)
    first = int(rng.choice(divisors))
    rest = n // first
    if rng.random() < 0.5:
        return (first, rest)
    c = max(d for d in (1, 2, 3, 4, 8, 16, 32, 64) if rest % d == 0)
    hw = rest // c
    h = max(d for d in range(1, math.isqrt(hw) + 1) if hw % d == 0) if hw < 1 << 22 else 1
    return (first, c, h, hw // h)


def make_array(spec: dict, seed: int, it: int) -> np.ndarray:
    """Deterministic content for one tensor spec (the same in every iteration when it is frozen)."""
    rng = np.random.default_rng([seed, 0 if spec["role"] == "param" else it + 1, spec["seed"]])
    n, kind, dtype = spec["n"], spec["kind"], DTYPES[spec["dtype"]][0]
    if kind == "labels":
        x = rng.integers(0, int(rng.choice([10, 100, 1000, 50000])), n, dtype=np.int32)
    elif kind == "const":
        x = np.full(n, rng.choice([0.0, 1.0, 0.5, -1e4, 1e-3]), dtype=np.float32)
        idx = rng.integers(0, n, max(1, n // 100))
        x[idx] += rng.standard_normal(idx.size, dtype=np.float32) * 1e-3
    else:
        x = rng.standard_normal(n, dtype=np.float32)
        if kind == "relu":  # shift so 50-93 % fall below zero, then clamp
            x -= statistics.NormalDist().inv_cdf(rng.uniform(0.50, 0.93))
            np.maximum(x, 0, out=x)
        elif kind == "grad":  # scale mixture of normals: heavy tails, small magnitude
            x *= np.exp(rng.standard_normal(n, dtype=np.float32) * 1.5)
            x *= np.float32(10 ** rng.uniform(-6, -3))
        x *= np.float32(10 ** rng.uniform(-1.5, 0.7)) if kind != "grad" else np.float32(1)
        if spec["nonfinite"]:
            x[rng.integers(0, n, rng.integers(1, 6))] = rng.choice([np.nan, np.inf, -np.inf])
    return x.astype(dtype, copy=False).reshape(make_shape(rng, n))


def generate(out: Path, size_gb: float, iterations: int, seed: int) -> tuple[int, int]:
    """Write the dump under ``out/dump``. Returns (file count, payload bytes)."""
    rank = out / "dump" / "rank_0"
    (rank / ".dump_metadata").mkdir(parents=True)
    (rank / ".dump_metadata" / "config.json").write_text(json.dumps({"device_target": "CPU", "ms_version": "2.10.0"},
                                                                    separators=(",", ":")))
    specs = plan_iteration(np.random.default_rng(seed), int(size_gb * GB / iterations))
    stamp, tick = 1_795_336_652_543_735, np.random.default_rng([seed, 99])
    reused = {s["src"] for s in specs if "src" in s}
    frozen: dict[int, tuple[Path, int]] = {}  # Parameter tensors: written once, then copied byte for byte
    files = payload = 0
    for it in range(iterations):
        folder = rank / "Net" / "0" / str(it)
        folder.mkdir(parents=True)
        made: dict[int, np.ndarray] = {}  # outputs that a later input repeats
        for i, s in enumerate(specs):
            stamp += int(tick.integers(20, 400))
            io = "input" if s["role"] == "input" else "output"
            path = folder / f"{s['op_type']}.{s['op_name']}.0.0.{stamp}.{io}.{s['slot']}.DefaultFormat.{s['dtype']}.npy"
            if i in frozen:
                shutil.copyfile(frozen[i][0], path)
                payload += frozen[i][1]
            else:
                arr = made[s["src"]] if "src" in s else make_array(s, seed, it)
                np.save(path, arr)
                payload += arr.nbytes
                if i in reused:
                    made[i] = arr
                if s["role"] == "param":
                    frozen[i] = (path, arr.nbytes)
            files += 1
    return files, payload


def npy_payload(dump: Path) -> tuple[int, int]:
    """(file count, payload bytes) of the .npy files of an existing dump."""
    files = payload = 0
    for path in dump.rglob("*.npy"):
        files += 1
        try:
            payload += np.load(path, mmap_mode="r").nbytes
        except (ValueError, OSError):
            payload += path.stat().st_size
    return files, payload


def tree_size(path: Path) -> tuple[int, int]:
    """(total bytes, file count) of the regular files under ``path``."""
    sizes = [p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink()]
    return sum(sizes), len(sizes)


def evict(dump: Path) -> int:
    """Drop the dump's clean pages from the page cache (``posix_fadvise(DONTNEED)`` per
    file, after a sync so none is dirty); returns the number of files."""
    os.sync()
    count = 0
    for path in dump.rglob("*"):
        if path.is_file() and not path.is_symlink():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
            count += 1
    return count


def timed(cmd: list[str], log: Path) -> tuple[float, int, float]:
    """Run ``cmd`` (output to ``log``); return (wall seconds, peak RSS KiB, CPU seconds: user +
    system of it and its waited-for children). Exit if it fails."""
    os.sync()  # do not bill this run for the previous run's writeback
    with open(log, "wb") as f:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, "COLUMNS": "200"})
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - t0
    proc.returncode = code = os.waitstatus_to_exitcode(status)
    if code != 0:
        sys.exit(f"FAILED (exit {code}): {' '.join(cmd)}\n{log.read_text(errors='replace')[-4000:]}")
    # wait4's usage includes the descendants the process waited for (tar's zstd, ingest's workers)
    return seconds, usage.ru_maxrss, usage.ru_utime + usage.ru_stime


def per(values: list[float], fmt: str = "{:.2f}") -> str:
    """Comma-separated per-run values."""
    return ", ".join(fmt.format(v) for v in values)


def verdict(value: float, target: float) -> str:
    """PASS when ``value`` is at or below ``target``, else MISS."""
    return "PASS" if value <= target else "MISS"


def remove(path: Path) -> None:
    """Delete a file or directory tree; a missing path is fine."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def find_dumpdb() -> str:
    """Path of the dumpdb console script (next to this Python first, then $PATH)."""
    here = Path(sys.executable).parent / "dumpdb"
    found = str(here) if here.exists() else shutil.which("dumpdb")
    if not found:
        sys.exit("dumpdb CLI not found")
    return found


def main() -> None:
    """Generate (or take) a dump, warm the cache, run the A/B pairs, print the report."""
    args = parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    for old in [out / "dump.tar.zst", *out.glob("archive-*")]:
        remove(old)
    if args.dump:
        dump = args.dump.resolve()
        files, payload = npy_payload(dump)
    else:
        dump = out / "dump"
        remove(dump)
        t0 = time.perf_counter()
        files, payload = generate(out, args.size_gb, args.iterations, args.seed)
        print(f"generated {files} files, {payload / GB:.3f} GB in {time.perf_counter() - t0:.1f} s")
    subprocess.run(["find", str(dump), "-type", "f", "-exec", "cat", "{}", "+"],
                   stdout=subprocess.DEVNULL, check=True)
    dumpdb, tarball = find_dumpdb(), out / "dump.tar.zst"
    subprocess.run([dumpdb, "--version"], stdout=subprocess.DEVNULL, check=True)  # warm dumpdb's imports too
    jobs = ["-j", str(args.workers)] if args.workers else []
    tar_cmd = ["tar", "-I", "zstd -T2 -3", "-cf", str(tarball), "-C", str(dump.parent), dump.name]
    ingest_s, tar_s, rss, sizes, ingest_cpu, tar_cpu = [], [], [], [], [], []
    for i in range(args.repeats):
        archive = out / f"archive-{i}"
        if args.cold:
            evict(dump)
        sec, kib, cpu = timed([dumpdb, "ingest", str(dump), "--archive", str(archive), "--run", "bench", "-q", *jobs],
                         out / "ingest.log")
        ingest_s.append(sec)
        ingest_cpu.append(cpu)
        rss.append(kib / 1024)
        sizes.append(tree_size(archive))
        if i < args.repeats - 1:
            remove(archive)
        tarball.unlink(missing_ok=True)
        if args.cold:
            evict(dump)
        sec, _, cpu = timed(tar_cmd, out / "tar.log")
        tar_s.append(sec)
        tar_cpu.append(cpu)
        print(f"pair {i + 1}: ingest {ingest_s[-1]:7.2f} s (CPU {ingest_cpu[-1]:.2f} s)   tar+zstd {tar_s[-1]:7.2f} s "
              f"(CPU {tar_cpu[-1]:.2f} s)   ratio {ingest_s[-1] / tar_s[-1]:.2f}   peak RSS {rss[-1]:.0f} MB", flush=True)
    summary = (out / "ingest.log").read_text(errors="replace").strip()
    tar_bytes = tarball.stat().st_size
    arch_bytes, arch_files = sizes[-1]
    t_ratio = statistics.median(a / b for a, b in zip(ingest_s, tar_s))
    s_ratio = arch_bytes / tar_bytes
    source = f"existing dump {dump}" if args.dump else f"generated {dump}, seed {args.seed}"
    source += ", page cache dropped before each run" if args.cold else ", page cache warm"
    rows = [
        ("dump files (.npy)", f"{files}"),
        ("dump payload", f"{payload / GB:.3f} GB (all files: {tree_size(dump)[0] / GB:.3f} GB)"),
        ("ingest s (median)", f"{statistics.median(ingest_s):.2f}   per pair: {per(ingest_s)}"),
        ("tar+zstd s (median)", f"{statistics.median(tar_s):.2f}   per pair: {per(tar_s)}"),
        ("CPU s (median)", f"ingest {statistics.median(ingest_cpu):.2f}, tar+zstd {statistics.median(tar_cpu):.2f}, "
                           f"ratio {statistics.median(a / b for a, b in zip(ingest_cpu, tar_cpu)):.3f}"),
        ("ingest / tar time", f"{t_ratio:.3f}   median of pairwise ratios, target <= {TARGET_TIME}: "
                              f"{verdict(t_ratio, TARGET_TIME)}"),
        ("archive size", f"{arch_bytes / GB:.4f} GB in {arch_files} files (per run: {per([b / GB for b, _ in sizes], '{:.4f}')})"),
        ("tar.zst size", f"{tar_bytes / GB:.4f} GB"),
        ("archive / tar.zst size", f"{s_ratio:.3f}   target <= {TARGET_SIZE}: {verdict(s_ratio, TARGET_SIZE)}"),
        ("compression", f"payload / archive {payload / arch_bytes:.2f}x, payload / tar.zst {payload / tar_bytes:.2f}x"),
        ("ingest throughput", f"{payload / GB / statistics.median(ingest_s):.3f} GB/s (payload / median ingest time)"),
        ("peak ingest RSS", f"{max(rss):.0f} MB (per run: {per(rss, '{:.0f}')})"),
    ]
    print(f"\n== dumpdb ingest benchmark: {source} ==")
    print("\n".join(f"{label:<24}{value}" for label, value in rows))
    print("last ingest said:\n  " + summary.replace("\n", "\n  "))
    if args.keep:
        print(f"kept: {out}")
    else:
        for path in ([] if args.dump else [dump]) + [tarball, *out.glob("archive-*"), out / "ingest.log", out / "tar.log"]:
            remove(path)
        if not any(out.iterdir()):
            out.rmdir()


if __name__ == "__main__":
    main()
