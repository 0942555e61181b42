"""Exporting compare results: msprobe-compatible CSV and Parquet.

The CSV uses msprobe ``compare``'s result columns (reference formats.md 2.1, "Result
columns (real CSV header, tensor mode)"; statistics mode replaces the six tensor
metrics by the eight statistics columns), so ``msprobe merge_result`` and scripts
written for msprobe keep working. Parquet keeps every column dumpdb computed.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from dumpdb.compare import registry

_HEAD = ("NPU Name", "Bench Name", "NPU Dtype", "Bench Dtype", "NPU Tensor Shape", "Bench Tensor Shape",
         "NPU Requires_grad", "Bench Requires_grad")


def _columns(kind: str) -> tuple[tuple[str, str, bool], ...]:
    """(msprobe header, result column, as percent) of the registry's metrics of ``kind``
    that msprobe's CSV has, in registry order."""
    return tuple((m.msprobe_column, m.name, m.csv_percent) for m in registry.metrics(kind)
                 if m.msprobe_column is not None)


_TAIL_STATS = ("NPU max", "NPU min", "NPU mean", "NPU l2norm", "Bench max", "Bench min", "Bench mean", "Bench l2norm")
_END = ("Requires_grad Consistent", "Result", "Err_message", "NPU_Stack_Info", "Data_name")

_IO_NAMES = {"parameter": "parameters", "parameter_grad": "parameters_grad"}


def leaf_name(op_name: str | None, io: str | None, slot, slot_path: str | None = None) -> str:
    """msprobe's row name ``{op}.{input|output|parameters|parameters_grad}.{i}[.{j}]``."""
    index = slot_path if slot_path is not None else ("" if slot is None else str(slot))
    parts = [op_name or "", _IO_NAMES.get(io, io or "")]
    return ".".join(p for p in (*parts, index) if p != "")


def _num(v):
    if v is None:
        return "N/A"
    if isinstance(v, float) and math.isnan(v):
        return "Nan"
    return v


def _pct(v):
    return "N/A" if v is None else f"{v * 100}%"


def msprobe_columns(statistics: bool) -> tuple[str, ...]:
    """msprobe compare_result CSV header (reference formats.md 2.1), tensor or statistics mode."""
    metrics = tuple(header for header, _, _ in _columns("statistics" if statistics else "tensor"))
    return (*_HEAD, *metrics, *_TAIL_STATS, *_END)


def write_msprobe_csv(results: pa.Table, path: str | Path) -> Path:
    """Write ``results`` (:func:`dumpdb.compare.engine.compare` output) as msprobe's CSV.

    Tensor-mode columns when any pair was compared on payloads, else statistics
    columns; relative errors in statistics mode as percentages (``"12.5%"``) and
    missing values as ``N/A``, as msprobe writes them. Returns the path.
    """
    rows = results.to_pylist()
    statistics = all(r["mode"] == "statistics" for r in rows) if rows else False
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(msprobe_columns(statistics))
        for r in rows:
            name_t = leaf_name(r["target_name"], r["io"], r["slot"])
            name_b = leaf_name(r["bench_name"], r["io"], r["slot"])
            metrics = [_pct(r.get(c)) if pct else _num(r.get(c))
                       for _, c, pct in _columns("statistics" if statistics else "tensor")]
            stack = f"{r['code_file']}:{r['code_line']} {r['code_text']}" if r.get("code_file") else "N/A"
            rg_t, rg_b = r.get("target_requires_grad"), r.get("bench_requires_grad")
            w.writerow([
                name_t, name_b, r["target_dtype"], r["bench_dtype"], r["target_shape"], r["bench_shape"],
                _num(rg_t), _num(rg_b), *metrics,
                *(_num(r[f"target_{k}"]) for k in ("max", "min", "mean", "l2norm")),
                *(_num(r[f"bench_{k}"]) for k in ("max", "min", "mean", "l2norm")),
                "N/A" if rg_t is None or rg_b is None else rg_t == rg_b,
                r["result"], r["err_message"] or "", stack, r.get("target_source_file") or "N/A",
            ])
    return path


def write_parquet(results: pa.Table, path: str | Path) -> Path:
    """Write every result column as zstd Parquet (parent directories created). Returns the path."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(results, path, compression="zstd")
    return Path(path)
