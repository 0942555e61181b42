"""The benchmark scripts of issues 11-13 run end to end at tiny sizes and print their
ratio lines (the figures themselves are never asserted: timings belong to the scripts)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import ms_case

REPO = Path(__file__).resolve().parents[1]


def _run(*args: str, cwd: Path) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    env.pop("DUMPDB_ARCHIVE", None)
    proc = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout


def test_bench_read_prints_each_target_line(tmp_path):
    out = _run(str(REPO / "scripts" / "bench_read.py"), "--dump", str(ms_case("c1_inputs_kernels_iter")),
               "--samples", "20", "--large", "1", "--runs", "1", "--repeats", "1", cwd=tmp_path)
    for label in ("small p99 open, no with", "small p99 with", "large: worst ratio", "cli / duckdb",
                  "a.sql() open once", "a.sql() with", "the kept connection", "check small: on / off",
                  "check large: on / off"):
        assert label in out, out
    assert "np.load" in out and "target" in out


def test_bench_store_compares_local_disk_and_an_s3_server(tmp_path):
    out = _run(str(REPO / "scripts" / "bench_store.py"), "--ingest", str(ms_case("c1_inputs_kernels_iter")),
               "--server", "moto", "--repeats", "1", "--small", "5", "--large-mb", "1", cwd=tmp_path)
    assert "ingest throughput moto/local:" in out, out
    assert "local dir besides the catalog / payload bytes (moto):" in out, out


def test_bench_codecs_ranks_candidates_per_dtype(tmp_path):
    out = _run(str(REPO / "scripts" / "bench_codecs.py"), str(ms_case("c1_inputs_kernels_iter")),
               "--max-mb", "1", cwd=tmp_path)
    assert "size/zstd-1" in out and "blosc-zstd1-shuffle" in out and "<f4" in out, out
    assert "read/raw" in out, out  # which codec costs more than it saves on read-heavy data


def test_bench_delta_prints_sizes_times_and_read_cost_against_plain(tmp_path):
    out = _run(str(REPO / "scripts" / "bench_delta.py"), "--dump", str(ms_case("e1_nan_inf_overflow")),
               "--out", str(tmp_path / "w"), "--repeats", "1", "--reads", "1", cwd=tmp_path)
    for label in ("stored bytes delta", "ratio delta/plain", "delta payloads", "ingest s plain / delta",
                  "read delta / plain", "np.load"):
        assert label in out, out


def test_bench_align_content_check_against_the_exact_join(tmp_path):
    out = _run(str(REPO / "scripts" / "bench_align.py"), "2000", "--content-only", cwd=tmp_path)
    assert "baseline (plain exact join, dict): 2000 pairs" in out, out
    assert "align, equal runs:" in out and "re-aligned 0" in out, out
    assert "align, LayerNorm by hand at call 100:" in out and "x the join" in out, out
