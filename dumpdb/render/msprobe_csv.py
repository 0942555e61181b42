"""Exporting compare results: msprobe-compatible CSV and Parquet.

The CSV uses msprobe ``compare``'s result columns (reference formats.md 2.1, "Result
columns (real CSV header, tensor mode)"; statistics mode replaces the six tensor
metrics by the eight statistics columns), so ``msprobe merge_result`` and scripts
written for msprobe keep working. Parquet keeps every column dumpdb computed.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import pyarrow as pa

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
    parts = [op_name or "", _IO_NAMES.get(io or "", io or "")]
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
    return (*_HEAD, *metrics, *_TAIL_STATS, *(_END[:-1] if statistics else _END))  # Data_name: tensor mode only


def write_msprobe_csv(results: pa.Table, path: str | Path, archive=None) -> Path:
    """Write ``results`` (:func:`dumpdb.compare.engine.compare` output) as msprobe's CSV.

    With ``archive`` (a :class:`dumpdb.Archive`) and two msprobe runs, the file is
    msprobe 26.x's own ``compare_result`` CSV (:func:`msprobe_rows_csv`: every dump.json
    entry, msprobe's cells, row order and ``\\n`` line ends). Otherwise (other layouts):
    tensor-mode columns when any pair was compared on payloads, else statistics columns;
    relative errors in statistics mode as percentages (``"12.5%"``) and missing values as
    ``N/A``. Returns the path.
    """
    if archive is not None and results.num_rows and msprobe_rows_csv(archive, results, path):
        return Path(path)
    rows = results.to_pylist()
    statistics = all(r["mode"] == "statistics" for r in rows) if rows else False
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")  # pandas to_csv's line end, as msprobe writes
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
                r["result"], r["err_message"] or "", stack,
                *(() if statistics else (r.get("target_source_file") or "N/A",)),
            ])
    return path


def _sides(archive, results: pa.Table) -> list[tuple]:
    """(target run, rank, iteration, bench run, rank, iteration) of the compared pairs, in order."""
    ids_t = [i for i in results["target_tensor_id"].to_pylist() if i is not None]
    ids_b = [i for i in results["bench_tensor_id"].to_pylist() if i is not None]
    if not ids_t or not ids_b:
        return []
    q = "SELECT tensor_id, run, rank, iteration FROM tensors WHERE tensor_id IN (SELECT unnest($ids))"
    t = {r["tensor_id"]: r for r in archive.sql(q, {"ids": ids_t}).to_pylist()}
    b = {r["tensor_id"]: r for r in archive.sql(q, {"ids": ids_b}).to_pylist()}
    seen: dict[tuple, None] = {}
    for ti, bi in zip(results["target_tensor_id"].to_pylist(), results["bench_tensor_id"].to_pylist()):
        if ti in t and bi in b:
            x, y = t[ti], b[bi]
            seen.setdefault((x["run"], x["rank"], x["iteration"], y["run"], y["rank"], y["iteration"]), None)
    return sorted(seen, key=lambda k: (k[2] if k[2] is not None else -1, k[1] if k[1] is not None else -1))


def _records(archive, run: str, rank, iteration) -> list[tuple[str, Any]]:
    rows = archive.sql(
        "SELECT op_name, record FROM msprobe_records WHERE run = $run AND rank IS NOT DISTINCT FROM $rank "
        "AND iteration IS NOT DISTINCT FROM $it ORDER BY position", {"run": run, "rank": rank, "it": iteration})
    return [(r["op_name"], json.loads(r["record"]) if r["record"] else None) for r in rows.to_pylist()]


def _mode(archive, run: str, records: list[tuple[str, Any]]) -> str:
    meta = archive.sql("SELECT metadata FROM runs WHERE run = $run", {"run": run}).to_pylist()
    task = json.loads(meta[0]["metadata"] or "{}").get("task") if meta else None
    if task == "tensor":
        return "tensor"
    text = json.dumps([r for _, r in records[:50]])
    return "md5" if '"md5"' in text else "statistics"


def msprobe_rows_csv(archive, results: pa.Table, path: str | Path) -> bool:
    """Write msprobe's own ``compare_result`` CSV for two msprobe runs (False: not msprobe).

    Several target ranks: one file per rank, as msprobe does, named ``{stem}_rank{R}{suffix}``
    beside ``path`` (``path`` itself is not written); steps follow each other in a file.

    Rows: every leaf of every target dump.json record in dump order (non-tensor arguments
    and ``None`` gradients included), matched to the bench by msprobe's tensor name;
    cells, verdicts and messages as msprobe 26.2 writes them
    (:mod:`dumpdb.render.msprobe_rows`); ``NPU_Stack_Info`` from stack.json; line ends
    ``\\n`` (pandas ``to_csv``). Tensor metrics are dumpdb's, rounded like msprobe's.
    """
    from dumpdb.render.msprobe_rows import build_rows, header

    sides = _sides(archive, results)
    if not sides:
        return False
    ids = [i for c in ("target_tensor_id", "bench_tensor_id") for i in results[c].to_pylist() if i is not None]
    keys = {r["tensor_id"]: r["tensor_key"] for r in archive.sql(
        "SELECT tensor_id, tensor_key FROM tensors WHERE tensor_id IN (SELECT unnest($ids))", {"ids": ids}).to_pylist()}
    # msprobe's tensor name is unique within one rank and step only: key by those too (a
    # multi-rank compare would otherwise give rank 0's rows another rank's metrics)
    metrics: dict[tuple, dict[str, tuple[str, dict]]] = {}
    for r in results.to_pylist():
        key, bkey = keys.get(r["target_tensor_id"]), keys.get(r["bench_tensor_id"])
        if key and "#" in key and bkey and "#" in bkey:
            metrics.setdefault((r["rank"], r["iteration"]), {})[key.split("#", 1)[1]] = (bkey.split("#", 1)[1], r)
    by_rank: dict[Any, list[list]] = {}
    mode = None
    for t_run, t_rank, t_it, b_run, b_rank, b_it in sides:
        target = _records(archive, t_run, t_rank, t_it)
        bench = _records(archive, b_run, b_rank, b_it)
        if not target or not bench:
            return False
        mode = mode or _mode(archive, t_run, target)
        stacks = {r["op_name"]: list(r["frames"]) for r in archive.sql(
            "SELECT op_name, any_value(frames) AS frames FROM call_stacks WHERE run = $run "
            "AND rank IS NOT DISTINCT FROM $rank AND iteration IS NOT DISTINCT FROM $it GROUP BY op_name",
            {"run": t_run, "rank": t_rank, "it": t_it}).to_pylist()}
        compute = _pair_metrics(archive, (t_run, t_rank, t_it), (b_run, b_rank, b_it)) if mode == "tensor" else None
        by_rank.setdefault(t_rank, []).extend(build_rows(mode, target, bench, stacks, metrics.get((t_rank, t_it), {}),
                                                         compute))
    path = Path(path)
    for rank, rows in by_rank.items():
        # msprobe writes one compare_result_rank{R}_*.csv per rank: so do we, beside ``path``
        out = path if len(by_rank) == 1 else path.with_name(f"{path.stem}_rank{rank}{path.suffix}")
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f, lineterminator="\n")
            w.writerow(header(mode or "statistics"))
            w.writerows(rows)
    return True


def _pair_metrics(archive, target: tuple, bench: tuple):
    """``compute(target name, bench name)`` for :func:`~dumpdb.render.msprobe_rows.build_rows`:
    the tensor metrics (:func:`dumpdb.compare.metrics.tensor_metrics`) of two msprobe tensors
    of (run, rank, iteration) ``target`` / ``bench`` by their msprobe tensor names, for a
    pair msprobe matches by name that dumpdb's alignment paired otherwise; None when either
    has no payload."""
    from dumpdb.compare.metrics import tensor_metrics

    def ids(run, rank, it) -> dict[str, int]:
        rows = archive.sql("SELECT tensor_id, tensor_key FROM tensors WHERE run = $run AND rank IS NOT DISTINCT FROM "
                           "$rank AND iteration IS NOT DISTINCT FROM $it AND content_hash IS NOT NULL",
                           {"run": run, "rank": rank, "it": it}).to_pylist()
        return {r["tensor_key"].split("#", 1)[1]: r["tensor_id"] for r in rows if "#" in (r["tensor_key"] or "")}

    found: dict[str, dict[str, int]] = {}

    def compute(tname: str, bname: str) -> dict | None:
        if not found:
            found["t"], found["b"] = ids(*target), ids(*bench)
        ti, bi = found["t"].get(tname), found["b"].get(bname)
        if ti is None or bi is None:
            return None
        return tensor_metrics(archive.tensor(ti), archive.tensor(bi))[0]

    return compute


def write_parquet(results: pa.Table, path: str | Path) -> Path:
    """Write every result column as zstd Parquet (parent directories created). Returns the path."""
    import pyarrow.parquet as pq  # here: every compare imports this module, few write Parquet (~40 ms)

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(results, path, compression="zstd")
    return Path(path)
