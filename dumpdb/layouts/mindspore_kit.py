"""The small kit the MindSpore-family layouts share: tensor file names, ``mapping.csv``,
``statistic.csv`` (read, and joined to the tensor files of a directory), and a device
or rank directory's ``graphs/`` and ``execution_order/`` (IR nodes, kernel order, the
iterations each graph ran), linked to tensors by scope name.

Used by ``mindspore-sync``, ``statistic-only``, ``mindspore-r1.2-sync-bin`` and the
Ascend/CANN readers (:mod:`dumpdb.layouts.ascend`), so no layout calls another's
methods. Sources: seed 001 (同步Dump数据文件介绍: names, statistic.csv, mapping.csv),
seed 000 (r1.2 graphs/ and execution_order/), corpus mindspore-cpu README; the IR
and execution-order file grammars are in :mod:`dumpdb.layouts.mindspore_ir`.
"""

from __future__ import annotations

import csv
import io
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from dumpdb.dumpio import MAX_TEXT_BYTES, read_dump_bytes, read_dump_text, reason
from dumpdb.errors import DumpdbError, DumpFileError
from dumpdb.layouts import mindspore_ir as ir
from dumpdb.layouts.base import DumpScan, TensorEntry, display_name

TENSOR_NAME_RE = re.compile(
    r"^(?P<op_type>[^.]+)\.(?P<op_name>.+)\.(?P<task_id>\d+)\.(?P<stream_id>\d+)\.(?P<timestamp>\d+)"
    r"\.(?P<io>input|output)\.(?P<slot>\d+)\.(?P<format>[A-Za-z0-9_]+)(?:\.(?P<dtype>[A-Za-z0-9_]+))?\.npy$"
)
TENSOR_NAME_GRAMMAR = ("{op_type}.{op_name}.{task_id}.{stream_id}.{timestamp}.{input|output}.{slot}.{format}"
                       "[.{dtype}].npy")
EXECUTION_ORDER_RE = re.compile(r"^ms_execution_order_graph_(\d+)\.csv$")
GLOBAL_EXECUTION_ORDER_RE = re.compile(r"^ms_global_execution_order_graph_(\d+)\.csv$")
IR_RE = re.compile(r"^ms_output_trace_code_graph_(\d+)\.ir$")
_INT32_MAX = (1 << 31) - 1  # catalog INTEGER columns (code_line)

# statistic.csv header -> catalog statistic column (seed 001 and corpus README:
# "Max Value, Min Value, Avg Value, Count, Negative Zero Count, Positive Zero
# Count, NaN Count, Negative Inf Count, Positive Inf Count, Zero Count, MD5,
# L2Norm Value"). Matched case-insensitively; unknown columns are ignored.
_CSV_STATS = {
    "max value": "max",
    "min value": "min",
    "avg value": "mean",
    "l2norm value": "l2norm",
    "count": "count",
    "nan count": "nan_count",
    "positive inf count": "pos_inf_count",
    "negative inf count": "neg_inf_count",
    "zero count": "zero_count",
}
_CSV_KEYS = {
    "op type": "op_type",
    "op name": "op_name",
    "task id": "task_id",
    "stream id": "stream_id",
    "timestamp": "timestamp",
    "io": "io",
    "input/output": "io",
    "slot": "slot",
    "data type": "dtype",
    "shape": "shape",
    "format": "format",
}
_CSV_CHECKSUMS = {"md5": "md5", "md5 value": "md5", "sha1": "sha1", "sha1 value": "sha1"}


def _int(text: str | None) -> int | None:
    if text is None or text == "":
        return None
    try:
        return int(text)
    except ValueError:
        try:
            return int(float(text))
        except (ValueError, OverflowError):  # 'nan', '1e400'
            return None


def _float(text: str | None) -> float | None:
    if text is None or text.strip() == "":
        return None
    try:
        return float(text)
    except ValueError:
        return None


def read_mapping_csv(path: Path) -> dict[str, str]:
    """``{hashed file name: original file name}`` from a mapping.csv (no header)."""
    mapping: dict[str, str] = {}
    raw = read_dump_bytes(path, str(path), MAX_TEXT_BYTES)  # regular file, bounded (dumpdb.dumpio)
    text = raw.replace(b"\x00", b"").decode("utf-8", errors="surrogateescape")
    try:
        for row in csv.reader(io.StringIO(text, newline="")):
            if len(row) >= 2 and row[0].strip():
                mapping[row[0].strip()] = ",".join(row[1:]).strip()
    except csv.Error as exc:
        raise DumpFileError(f"{path}: not a readable csv: {exc}") from None
    return mapping


def read_statistic_csv(path: Path) -> list[dict]:
    """Rows of a statistic.csv, keyed by catalog names, parsed by header names.

    Extra and reordered columns are tolerated; a missing key column gives
    None. Each row: the key fields (op_type, op_name, task_id, stream_id,
    timestamp, io, slot), ``dtype``/``shape``/``format`` as written, ``stats``
    (catalog statistic columns present) and ``checksum``/``checksum_algo``.
    A statistic that is not a number (or a count that is not a non-negative
    integer: ``nan``, ``1e400``, ``-3``) is kept as its text, which the ingest
    reports as one error line and ignores (:func:`dumpdb.ingestion.ranges.check_ranges`).
    Raises :class:`~dumpdb.errors.DumpFileError` for a FIFO/device or an unreadable file.
    """
    rows: list[dict] = []
    text = read_dump_text(path, str(path))
    reader = csv.reader(io.StringIO(text.replace("\x00", ""), newline=""))
    try:
        header = next(reader, None)
        if not header:
            return rows
        cols = [h.strip().lower() for h in header]
        for rec in reader:
            if not rec or all(not c.strip() for c in rec):
                continue
            values = dict(zip(cols, (c.strip() for c in rec)))
            row: dict = {field: values.get(col) for col, field in _CSV_KEYS.items() if col in values}
            for num in ("task_id", "stream_id", "timestamp", "slot"):
                row[num] = _int(row.get(num))
            io_ = (row.get("io") or "").lower()
            row["io"] = io_ if io_ in ("input", "output") else None
            stats: dict = {}
            for col, field in _CSV_STATS.items():
                if col in values and values[col] != "":
                    v = _float(values[col])
                    if field.endswith("count"):
                        # a count is a non-negative integer; anything else stays text (reported)
                        if v is not None and math.isfinite(v) and v == int(v) and v >= 0:
                            stats[field] = int(v)
                        else:
                            stats[field] = values[col]
                    else:
                        stats[field] = v if v is not None else values[col]
            if "zero_count" not in stats and {"negative zero count", "positive zero count"} <= values.keys():
                neg, pos = _int(values["negative zero count"]), _int(values["positive zero count"])
                if neg is not None and pos is not None:
                    stats["zero_count"] = neg + pos
            row["stats"] = stats
            row["checksum"] = row["checksum_algo"] = None
            for col, algo in _CSV_CHECKSUMS.items():
                if values.get(col):
                    row["checksum"], row["checksum_algo"] = values[col], algo
                    break
            if row.get("shape"):
                row["shape"] = tuple(int(d) for d in re.findall(r"\d{1,19}", row["shape"]))
            rows.append(row)
    except csv.Error as exc:
        raise DumpFileError(f"{path}: not a readable csv: {exc}") from None
    return rows


def statistic_key(csv_file: str, row: dict) -> str:
    """``tensor_key`` of a statistics-only row: the csv plus the row's identity fields
    (the same formula migration 002 uses for older archives)."""
    parts = (row.get("op_type"), row.get("op_name"), row.get("task_id"), row.get("stream_id"),
             row.get("timestamp"), row.get("io"), row.get("slot"))
    return csv_file + "#" + ".".join("" if p is None else str(p) for p in parts)


def parse_tensor_name(name: str) -> dict | None:
    """Fields of a tensor file name, or None if it does not follow the pattern."""
    m = TENSOR_NAME_RE.match(name)
    if not m:
        return None
    d = m.groupdict()
    return {
        "op_type": display_name(d["op_type"]),
        "op_name": display_name(d["op_name"]),
        "task_id": int(d["task_id"]),
        "stream_id": int(d["stream_id"]),
        "timestamp": int(d["timestamp"]),
        "io": d["io"],
        "slot": int(d["slot"]),
        "format": d["format"],
        "dtype_declared": d["dtype"],
    }


def read_stats_csv(path: Path) -> list[dict]:
    """Rows of a statistics csv: :func:`read_statistic_csv` (MindSpore's statistic.csv
    headers) plus the CANN spellings it does not know: ``Index`` for the slot and
    ``L2 Norm Value`` (mstt AclDumpDataProcessor.cpp kStatsHeaderId / kStatsHeaderL2Norm)."""
    rows = read_statistic_csv(path)
    text = read_dump_text(path, str(path)).replace("\x00", "")  # regular file, bounded
    try:
        reader = csv.reader(io.StringIO(text, newline=""))
        header = next(reader, None) or []
        cols = [h.strip().lower() for h in header]
        if not ({"index", "l2 norm value"} & set(cols)):
            return rows
        raw = [rec for rec in reader if rec and any(c.strip() for c in rec)]
    except csv.Error as exc:
        raise DumpFileError(f"{path}: not a readable csv: {exc}") from None
    for row, rec in zip(rows, raw):
        values = dict(zip(cols, (c.strip() for c in rec)))
        if row.get("slot") is None and "index" in values:
            row["slot"] = _int(values["index"])
        if "l2 norm value" in values and row["stats"].get("l2norm") is None:
            row["stats"]["l2norm"] = _float(values["l2 norm value"])
    return rows




# -- statistic.csv joined to the tensor files of a directory ---------------------------
def _row_identity(row: dict) -> tuple:
    return (row.get("op_type"), row.get("op_name"), row.get("task_id"), row.get("stream_id"),
            row.get("timestamp"), row.get("io"), row.get("slot"))


def _entry_identity(e: TensorEntry) -> tuple:
    return (e.op_type, e.op_name, e.task_id, e.stream_id, e.timestamp, e.io, e.slot)


class StatisticJoin:
    """The statistics csv rows of one tensor directory, matched to its tensor files.

    A row describes the tensor file with the same (op_type, op_name, task_id,
    stream_id, timestamp, io, slot) (seed 001: statistic.csv lists every tensor of
    the directory); :meth:`attach` gives that file the row's statistics and checksum.
    Rows no file claimed become statistics-only entries (:meth:`statistics_only`).
    """

    def __init__(self) -> None:
        self._rows: dict[tuple, tuple[str, dict]] = {}

    def add(self, source_file: str, rows: list[dict], per_file: bool = False) -> None:
        """Rows read from ``source_file``. ``per_file``: the rows only describe tensors
        named after that file (per-op csv statistics of TorchAir/CANN), never a
        tensor file of the directory."""
        for row in rows:
            key = _row_identity(row)
            self._rows[(source_file, *key) if per_file else key] = (source_file, row)

    def attach(self, entry: TensorEntry) -> None:
        """Give ``entry`` the statistics and checksum of its row, if there is one."""
        hit = self._rows.pop(_entry_identity(entry), None)
        if hit is not None:
            row = hit[1]
            entry.stats = row["stats"] or None
            entry.checksum, entry.checksum_algo = row["checksum"], row["checksum_algo"]

    def statistics_only(self, **fields) -> list[TensorEntry]:
        """Entries for the rows no tensor file claimed (``path`` None, ``tensor_key`` from
        :func:`statistic_key`); ``fields`` are the directory's (rank, iteration, ...)."""
        return [TensorEntry(
            source_file=source_file, path=None, tensor_key=statistic_key(source_file, row), **fields,
            op_type=row.get("op_type"), op_name=row.get("op_name"), task_id=row.get("task_id"),
            stream_id=row.get("stream_id"), timestamp=row.get("timestamp"), io=row.get("io"),
            slot=row.get("slot"), format=row.get("format"), dtype_declared=row.get("dtype"),
            shape_declared=row.get("shape"), stats=row["stats"] or None,
            checksum=row["checksum"], checksum_algo=row["checksum_algo"],
        ) for source_file, row in self._rows.values()]


# -- graphs/ and execution_order/ of a rank or device directory ------------------------
@dataclass
class Graphs:
    """What ``graphs/*.ir`` and ``execution_order/*.csv`` of one directory say, per graph_id.

    ``order``: kernel scope names in execution order; ``ir_scopes``: scope names of the
    IR nodes (also Load, UpdateState, ... nodes); ``op_types``: IR op type by scope;
    ``params``: parameter names of the IR.
    """

    order: dict[int, list[str]] = field(default_factory=dict)
    ir_scopes: dict[int, list[str]] = field(default_factory=dict)
    op_types: dict[int, dict[str, str]] = field(default_factory=dict)
    params: dict[int, list[str]] = field(default_factory=dict)

    def graph_ids(self) -> list[int]:
        return sorted(set(self.order) | set(self.ir_scopes) | set(self.params))

    def scopes(self, graph_id: int | None) -> list[str]:
        """Kernels come from the execution order; the IR is used only where no order exists."""
        if graph_id is None:
            return []
        return self.order[graph_id] if graph_id in self.order else self.ir_scopes.get(graph_id, [])


def read_graphs(root: Path, directory: Path, scan: DumpScan, *, rank: int | None,
                device_id: int | None) -> Graphs:
    """Read ``directory/graphs/ms_output_trace_code_graph_{g}.ir`` and
    ``directory/execution_order/ms_[global_]execution_order_graph_{g}.csv``.

    Rows go to ``scan.ops``, ``scan.execution_order`` and ``scan.graph_executions``
    with ``rank`` and ``device_id``; unreadable files to ``scan.errors`` (path
    relative to ``root``). Returns what the linking of tensors to scopes needs.
    """
    graphs = Graphs()
    graphs_dir = directory / "graphs"
    if graphs_dir.is_dir():
        for path in sorted(graphs_dir.iterdir()):
            m = IR_RE.match(path.name)
            if not m:
                continue
            g = int(m.group(1))
            rel_ir = display_name(os.path.relpath(path, root))
            try:
                nodes, params = ir.parse_ir(path)
            except (OSError, DumpdbError) as exc:
                scan.errors.append((rel_ir, f"cannot read IR: {reason(exc, path)}"))
                continue
            absurd = [n for n in nodes if n["code_line"] is not None and not 0 <= n["code_line"] <= _INT32_MAX]
            for n in absurd:
                n["code_line"] = None
            if absurd:
                scan.errors.append((rel_ir, f"{len(absurd)} source line number(s) out of range; "
                                    "code_line left NULL for those ops"))
            graphs.params[g] = params
            graphs.ir_scopes[g] = [n["scope_name"] for n in nodes if n["scope_name"]]
            types = graphs.op_types.setdefault(g, {})
            for n in nodes:
                scan.ops.append({"rank": rank, "device_id": device_id, "graph_id": g, **n})
                if n["scope_name"]:
                    types.setdefault(n["scope_name"], n["op_type"])
    eo_dir = directory / "execution_order"
    if eo_dir.is_dir():
        for path in sorted(eo_dir.iterdir()):
            rel = display_name(os.path.relpath(path, root))
            m, gm = EXECUTION_ORDER_RE.match(path.name), GLOBAL_EXECUTION_ORDER_RE.match(path.name)
            try:
                if m:
                    g = int(m.group(1))
                    order = ir.read_execution_order(path)
                    garbled = [i for i, s in enumerate(order) if ir.garbled_scope(s)]
                    if garbled:
                        scan.errors.append((rel, f"{len(garbled)} garbled line(s) (binary data, not a scope "
                                            f"name), first at line {garbled[0] + 2}; skipped"))
                        order = [s for s in order if not ir.garbled_scope(s)]
                    graphs.order[g] = order
                    scan.execution_order.extend(
                        {"rank": rank, "device_id": device_id, "graph_id": g, "position": i, "scope_name": s}
                        for i, s in enumerate(order))
                elif gm:
                    g = int(gm.group(1))
                    scan.graph_executions.extend(
                        {"rank": rank, "device_id": device_id, "graph_id": g, "iteration": it}
                        for it in ir.read_global_execution_order(path))
            except (OSError, DumpdbError) as exc:
                scan.errors.append((rel, f"cannot read execution order: {reason(exc, path)}"))
    return graphs


def link_entries(entries: list[TensorEntry], graphs: Graphs) -> None:
    """Set ``scope_name`` of 2.x-style entries (op names with ``/`` -> ``_``) by matching
    their op names to the graph's scopes (:func:`mindspore_ir.link_scopes`); Parameter
    files are named ``Parameter.{name with '.' -> '_'}`` (corpus README)."""
    by_graph: dict[int | None, list[TensorEntry]] = {}
    for e in entries:
        by_graph.setdefault(e.graph_id, []).append(e)
    for g, group in by_graph.items():
        ops = [e.op_name for e in group if e.op_type != "Parameter" and e.op_name]
        links = ir.link_scopes(ops, graphs.scopes(g))
        params: dict[str, str] = {}
        for p in graphs.params.get(g, []) if g is not None else []:
            params.setdefault(p.replace(".", "_"), p)
        for e in group:
            if e.op_type == "Parameter":
                e.scope_name = params.get(e.op_name or "")
            else:
                e.scope_name = links.get(e.op_name or "")
