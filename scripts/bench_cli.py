"""Start-up cost of the CLI: `dumpdb sql -a A "SELECT 1"` against plain DuckDB doing the same.

Both are whole processes (interpreter start, imports, opening the catalog read-only,
one query), run alternately so a busy machine slows both alike; the median of each is
compared. Issue 16 asks for a ratio <= 2.5 (wall clock). The CPU time (user + system) of
each process is reported too: on a machine shared with other work it varies far less.

    python scripts/bench_cli.py [--runs 15] [--archive A]

Without ``--archive`` a small archive is made from tests/data (one MindSpore case).
Prints both medians and the ratio; `python -X importtime -m dumpdb sql ...` shows
where the time goes.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _elapsed(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one process."""
    t0, c0 = time.perf_counter(), _cpu()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env, cwd=ROOT)
    return time.perf_counter() - t0, _cpu() - c0


def measure(archive: Path, runs: int, env: dict[str, str]) -> tuple[float, float, float, float]:
    """Medians over ``runs`` alternated processes, after one warm-up each: wall and CPU
    seconds of ``dumpdb sql -a ARCHIVE "SELECT 1"`` and of python + duckdb doing the same,
    as (cli wall, plain wall, cli CPU, plain CPU)."""
    cli = [sys.executable, "-m", "dumpdb", "sql", "-a", str(archive), "SELECT 1"]
    plain = [sys.executable, "-c", "import duckdb; duckdb.connect("
             f"{str(archive / 'catalog.duckdb')!r}, read_only=True).sql('SELECT 1').fetchall()"]
    _elapsed(cli, env), _elapsed(plain, env)  # warm the page cache
    cli_s, plain_s = [], []
    for _ in range(runs):
        cli_s.append(_elapsed(cli, env))
        plain_s.append(_elapsed(plain, env))
    return (statistics.median(t for t, _ in cli_s), statistics.median(t for t, _ in plain_s),
            statistics.median(u for _, u in cli_s), statistics.median(u for _, u in plain_s))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="processes of each kind (default 15)")
    parser.add_argument("--archive", type=Path, help="archive to query (default: one made from tests/data)")
    args = parser.parse_args()
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with tempfile.TemporaryDirectory() as tmp:
        archive = args.archive
        if archive is None:
            archive = Path(tmp) / "bench.dumpdb"
            subprocess.run([sys.executable, "-m", "dumpdb", "ingest", "-q", "-a", str(archive),
                            str(ROOT / "tests/data/mindspore/c1_inputs_kernels_iter")],
                           check=True, env=env, cwd=ROOT, stderr=subprocess.DEVNULL)
        c, p, cc, pc = measure(archive, args.runs, env)
    print(f"dumpdb sql SELECT 1: median {c * 1000:.0f} ms wall, {cc * 1000:.0f} ms CPU over {args.runs} runs")
    print(f"python + duckdb    : median {p * 1000:.0f} ms wall, {pc * 1000:.0f} ms CPU")
    print(f"ratio {c / p:.2f} wall, {cc / pc:.2f} CPU (target <= 2.5)")

if __name__ == "__main__":
    main()
