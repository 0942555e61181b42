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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from dumpdb.dumpio import MAX_TEXT_BYTES, open_dump_file, read_dump_bytes, read_dump_text, reason
from dumpdb.errors import DumpdbError, DumpFileError
from dumpdb.layouts import mindspore_ir as ir
from dumpdb.layouts.base import DumpScan, StatisticsFile, TensorEntry, display_name

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
    raw = read_dump_bytes(path, str(path), MAX_TEXT_BYTES)  # regular file, bounded (dumpdb.dumpio)
    check_statistic_encoding(raw, str(path))
    text = raw.decode("utf-8", errors="replace")
    reader = csv.reader(io.StringIO(text.replace("\x00", ""), newline=""))
    try:
        header = next(reader, None)
        if not header:
            return rows
        cols = statistic_columns(header)
        for rec in reader:
            row = statistic_row(cols, rec)
            if row is not None:
                rows.append(row)
    except csv.Error as exc:
        raise DumpFileError(f"{path}: not a readable csv: {exc}") from None
    return rows


def statistic_columns(header: list[str]) -> list[str]:
    """A statistic.csv header as the lower-case names :func:`statistic_row` matches (a UTF-8
    byte-order mark before the first name dropped: Excel writes one, and it hid the ``Op Type``
    column, issue 30 item 10)."""
    return [h.strip().lstrip("\ufeff").strip().lower() for h in header]


def check_statistic_encoding(head: bytes, where: str) -> None:
    """Refuse a statistic.csv that is UTF-16 (a byte-order mark ``FF FE`` / ``FE FF``, or a
    NUL in every other byte of its first line): read as UTF-8 its header names were garbage,
    so every row became an extra statistics-only tensor (issue 30, item 10). MindSpore writes
    UTF-8. Raises :class:`~dumpdb.errors.DumpFileError`."""
    first = head[:4096]
    odd_nuls = first[1::2].count(0) if len(first) >= 8 else 0
    even_nuls = first[0::2].count(0) if len(first) >= 8 else 0
    if first[:2] in (b"\xff\xfe", b"\xfe\xff") or max(odd_nuls, even_nuls) * 4 > len(first):
        raise DumpFileError(f"{where}: statistic.csv is UTF-16 encoded; MindSpore writes UTF-8: "
                            "convert it (iconv -f UTF-16 -t UTF-8) and ingest again; its rows were not read")


# a Shape cell: "(2, 3)", "[2,3]", "(4,)", "()"; non-negative decimal sizes only
_SHAPE_CELL_RE = re.compile(r"[(\[]?\s*((?:\d{1,19}\s*,\s*)*\d{1,19})?\s*,?\s*[)\]]?")


def parse_shape_cell(text: str) -> tuple[int, ...] | None:
    """The sizes of a statistic.csv ``Shape`` cell, or None if it is not a shape (a sign,
    a decimal point, an exponent, letters: ``(-1,4)``, ``(2.5,4)``, ``(4e3,)`` were read as
    ``[1,4]``, ``[2,5,4]``, ``[4,3]``, issue 30 item 10). The one rule of both statistic.csv
    readers; linear (no nested repetition over the same text)."""
    m = _SHAPE_CELL_RE.fullmatch(text.strip())
    if m is None:
        return None
    dims = m.group(1)
    return tuple(int(d) for d in dims.split(",")) if dims else ()


def statistic_row(cols: list[str], rec: list[str]) -> dict | None:
    """One statistic.csv record (cells under ``cols``) as :func:`read_statistic_csv` returns
    it; None for a blank record. Cells beyond the header are ignored, missing ones absent."""
    if not rec or all(not c.strip() for c in rec):
        return None
    values = dict(zip(cols, (c.strip() for c in rec)))
    row: dict = {field: values.get(col) for col, field in _CSV_KEYS.items() if col in values}
    for num in ("task_id", "stream_id", "timestamp", "slot"):
        row[num] = _int(row.get(num))
    io_ = (row.get("io") or "").lower()
    row["io"] = io_ if io_ in ("input", "output") else None
    stats: dict = {}
    for col, stat in _CSV_STATS.items():
        if col in values and values[col] != "":
            v = _float(values[col])
            if stat.endswith("count"):
                # a count is a non-negative integer; anything else stays text (reported)
                if v is not None and math.isfinite(v) and v == int(v) and v >= 0:
                    stats[stat] = int(v)
                else:
                    stats[stat] = values[col]
            else:
                stats[stat] = v if v is not None else values[col]
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
        shape = parse_shape_cell(row["shape"])
        if shape is not None:
            row["shape"] = shape  # else kept as text: the ingest reports the row and skips it
    return row


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


def link_entries(entries: list[TensorEntry], graphs: Graphs, files: Sequence[StatisticsFile] = ()) -> None:
    """Set ``scope_name`` of 2.x-style entries (op names with ``/`` -> ``_``) by matching
    their op names to the graph's scopes (:func:`mindspore_ir.link_scopes`); Parameter
    files are named ``Parameter.{name with '.' -> '_'}`` (corpus README). The op names of
    streamed statistics ``files`` of the same directory tree take part in the matching
    (it pairs names by group) and each file gets its ``scopes`` / ``params`` maps."""
    by_graph: dict[int | None, list[TensorEntry]] = {}
    for e in entries:
        by_graph.setdefault(e.graph_id, []).append(e)
    files_by_graph: dict[int | None, list[tuple[StatisticsFile, set[str], set[str]]]] = {}
    for f in files:
        g = f.fields.get("graph_id")
        if not graphs.scopes(g) and not (graphs.params.get(g) if g is not None else None):
            continue  # nothing to link to: no need to read the csv's names now
        by_graph.setdefault(g, [])
        files_by_graph.setdefault(g, []).append((f, *statistic_op_names(Path(f.path), f.source_file)))
    for g, group in by_graph.items():
        ops = [e.op_name for e in group if e.op_type != "Parameter" and e.op_name]
        for _f, names, _p in files_by_graph.get(g, []):
            ops.extend(n for n in names if n)
        links = ir.link_scopes(ops, graphs.scopes(g))
        params: dict[str, str] = {}
        for p in graphs.params.get(g, []) if g is not None else []:
            params.setdefault(p.replace(".", "_"), p)
        for e in group:
            if e.op_type == "Parameter":
                e.scope_name = params.get(e.op_name or "")
            else:
                e.scope_name = links.get(e.op_name or "")
        for f, names, param_names in files_by_graph.get(g, []):
            f.scopes = {n: links[n] for n in names if n in links}
            f.params = {n: params[n] for n in param_names if n in params}


def statistic_op_names(path: Path, where: str) -> tuple[set[str], set[str]]:
    """(op names of non-Parameter rows, op names of Parameter rows) of a statistic.csv,
    read in batches (:func:`statistic_batches`); an unreadable file gives two empty sets
    (the ingest reports it when it streams the file)."""
    names: set[str] = set()
    params: set[str] = set()
    try:
        for b in statistic_batches(path, where):
            is_param = pc.fill_null(pc.equal(b.table["op_type"], "Parameter"), False)
            params.update(x for x in pc.unique(b.table["op_name"].filter(is_param)).to_pylist() if x)
            names.update(x for x in pc.unique(b.table["op_name"].filter(pc.invert(is_param))).to_pylist() if x)
            for r in b.rows:
                (params if r.get("op_type") == "Parameter" else names).add(r.get("op_name") or "")
    except (OSError, DumpdbError):
        pass
    return names - {""}, params - {""}


# -- statistic.csv as Arrow batches (statistics-only directories, issue 12) ------------
_INT_RE = r"^[+-]?[0-9]{1,18}$"
_COUNT_RE = r"^\+?[0-9]{1,15}(\.0*)?$"
_FLOAT_RE = r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]{1,2})?$"
_INT32 = 1 << 31
STATISTIC_BATCH_BYTES = 8 << 20


@dataclass
class StatisticBatch:
    """Part of a statistic.csv read column-wise (:func:`statistic_batches`).

    ``table``: one row per record, columns ``op_type, op_name, task_id, stream_id,
    timestamp, io, slot, format, dtype_declared, shape_declared`` (list<int64>), the
    catalog statistic columns (double / int64), ``checksum, checksum_algo`` and
    ``has_stats`` (bool: the record had at least one statistic), with exactly the values
    :func:`statistic_row` gives. ``rows``: records the columnar path does not decide
    (unusual spellings, out-of-range values, undecodable bytes, short or long records),
    as :func:`statistic_row` dicts, so every rule stays in one place.
    """

    table: pa.Table
    rows: list[dict]
    records: int  # csv records this batch covers (blank ones included)


def _col(batch: pa.RecordBatch, index: dict[str, int], name: str) -> pa.Array | None:
    i = index.get(name)
    return None if i is None else batch.column(i)


def _empty_to_null(arr: pa.Array) -> pa.Array:
    return pc.if_else(pc.equal(arr, ""), pa.scalar(None, arr.type), arr)


def _parse(arr: pa.Array, pattern: str, to: pa.DataType, strip: str | None = None) -> tuple[pa.Array, pa.Array]:
    """(values, bad): ``arr`` (trimmed text, '' = absent) cast to ``to`` where it matches
    ``pattern``; ``bad`` marks non-empty cells that do not match."""
    value = _empty_to_null(arr)
    ok = pc.match_substring_regex(value, pattern)
    bad = pc.fill_null(pc.invert(ok), False)
    text = pc.if_else(ok, value, pa.scalar(None, pa.string()))
    if strip is not None:
        text = pc.replace_substring_regex(text, strip, "")
    return pc.cast(text, to), bad


def _python_rows(batch: pa.RecordBatch, cols: list[str], mask: list[bool] | None) -> list[dict]:
    cells = [c.to_pylist() for c in batch.columns]
    out = []
    for i in range(batch.num_rows):
        if mask is not None and not mask[i]:
            continue
        rec = [(c[i] or b"").decode("utf-8", errors="replace").replace("\x00", "") for c in cells]
        row = statistic_row(cols, rec)
        if row is not None:
            out.append(row)
    return out


def statistic_batches(path: Path, where: str, block_bytes: int = STATISTIC_BATCH_BYTES) -> Iterator[StatisticBatch]:
    """A statistic.csv read by Arrow's streaming CSV reader, about ``block_bytes`` of text
    per batch, so memory does not grow with the file (issue 12). Values as
    :func:`read_statistic_csv` gives them (see :class:`StatisticBatch`).

    Raises :class:`~dumpdb.errors.DumpFileError` for a FIFO/device, a file outside the
    dump, an unreadable file or one that is not a csv (no header).
    """
    fd = open_dump_file(path, where)
    with os.fdopen(fd, "rb") as f:
        head = f.readline(1 << 20)
        check_statistic_encoding(head, where)
        try:
            header = next(csv.reader([head.decode("utf-8", errors="replace").replace("\x00", "")]), None)
        except csv.Error as exc:
            raise DumpFileError(f"{where}: not a readable csv: {exc}") from None
        if not header:
            return
        cols = statistic_columns(header)
        index = {name: i for i, name in enumerate(cols)}  # the last of equal names, as dict(zip())
        names = [f"c{i}" for i in range(len(cols))]
        odd: list[bytes] = []

        def invalid(row) -> str:  # a record with more or fewer cells than the header
            odd.append(row.text.encode("utf-8", errors="surrogateescape") if isinstance(row.text, str) else row.text)
            return "skip"

        try:
            reader = pacsv.open_csv(
                f, read_options=pacsv.ReadOptions(column_names=names, block_size=block_bytes),
                parse_options=pacsv.ParseOptions(newlines_in_values=True, invalid_row_handler=invalid),
                convert_options=pacsv.ConvertOptions(column_types={n: pa.binary() for n in names},
                                                     strings_can_be_null=False, quoted_strings_can_be_null=False))
        except pa.ArrowInvalid as exc:
            if "Empty CSV file" in str(exc):
                return
            raise DumpFileError(f"{where}: not a readable csv: {' '.join(str(exc).split())[:200]}") from None
        while True:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                break
            except pa.ArrowInvalid as exc:
                raise DumpFileError(f"{where}: not a readable csv: {' '.join(str(exc).split())[:200]}") from None
            rows = []
            if odd:
                text = b"\n".join(odd).decode("utf-8", errors="replace").replace("\x00", "")
                odd.clear()
                rows = [r for rec in csv.reader(io.StringIO(text, newline=""))
                        if (r := statistic_row(cols, rec)) is not None]
            yield _convert(batch, cols, index, rows)
        if odd:
            text = b"\n".join(odd).decode("utf-8", errors="replace").replace("\x00", "")
            rows = [r for rec in csv.reader(io.StringIO(text, newline=""))
                    if (r := statistic_row(cols, rec)) is not None]
            yield StatisticBatch(_convert(batch_empty(len(cols)), cols, index, []).table, rows, len(odd))


def batch_empty(ncols: int) -> pa.RecordBatch:
    """A record batch of ``ncols`` binary columns and no rows."""
    return pa.RecordBatch.from_arrays([pa.array([], pa.binary())] * ncols, names=[f"c{i}" for i in range(ncols)])


_STAT_FLOATS = ("max value", "min value", "avg value", "l2norm value")
_STAT_TEXT = ("op type", "op name", "format", "data type")


def _convert(batch: pa.RecordBatch, cols: list[str], index: dict[str, int], rows: list[dict]) -> StatisticBatch:
    n = batch.num_rows
    try:
        text = [pc.utf8_trim_whitespace(pc.cast(c, pa.string())) for c in batch.columns]
        if any(pc.any(pc.match_substring(t, "\x00")).as_py() for t in text):
            raise ValueError("NUL byte")
    except (pa.ArrowInvalid, ValueError):  # undecodable bytes or NULs: the per-record rules
        return StatisticBatch(_empty_table(), rows + _python_rows(batch, cols, None), n)
    tb = pa.RecordBatch.from_arrays(text, names=[f"c{i}" for i in range(len(text))])
    blank = pa.array([True] * n) if n else pa.array([], pa.bool_())
    for t in text:
        blank = pc.and_(blank, pc.equal(t, ""))
    bad = pa.array([False] * n, pa.bool_())
    out: dict[str, pa.Array] = {}
    null_str = pa.nulls(n, pa.string())
    for col, field_ in _CSV_KEYS.items():  # as statistic_row: the last header spelling present wins
        if col in index and field_ not in ("io", "task_id", "stream_id", "timestamp", "slot"):
            out[field_] = tb.column(index[col])
    for col in ("op_type", "op_name", "format", "dtype", "shape"):
        out.setdefault(col, null_str)
    for col, field_ in (("task id", "task_id"), ("stream id", "stream_id"), ("timestamp", "timestamp"),
                        ("slot", "slot")):
        arr = _col(tb, index, col)
        if arr is None:
            out[field_] = pa.nulls(n, pa.int64())
            continue
        value, b = _parse(arr, _INT_RE, pa.int64())
        bad = pc.or_(bad, b)
        if field_ == "slot":
            bad = pc.or_(bad, pc.fill_null(pc.greater_equal(pc.abs(value), _INT32), False))
        out[field_] = value
    io_col = "input/output" if "input/output" in index and index["input/output"] > index.get("io", -1) else "io"
    arr = _col(tb, index, io_col)
    if arr is None:
        out["io"] = null_str
    else:
        low = pc.utf8_lower(arr)
        out["io"] = pc.if_else(pc.is_in(low, pa.array(["input", "output"])), low, null_str)
        bad = pc.or_(bad, pc.invert(pc.string_is_ascii(arr)))
    has_stats = pa.array([False] * n, pa.bool_())
    for col, field_ in _CSV_STATS.items():
        arr = _col(tb, index, col)
        if arr is None:
            out[field_] = pa.nulls(n, pa.int64() if field_.endswith("count") else pa.float64())
            continue
        if field_.endswith("count"):
            value, b = _parse(arr, _COUNT_RE, pa.int64(), strip=r"\.0*$")
        else:
            value, b = _parse(arr, _FLOAT_RE, pa.float64())
        bad = pc.or_(bad, b)
        has_stats = pc.or_(has_stats, pc.is_valid(value))
        out[field_] = value
    if "zero count" not in index and "negative zero count" in index and "positive zero count" in index:
        neg, b1 = _parse(tb.column(index["negative zero count"]), _INT_RE, pa.int64())
        pos, b2 = _parse(tb.column(index["positive zero count"]), _INT_RE, pa.int64())
        total = pc.add(neg, pos)
        bad = pc.or_(pc.or_(bad, b1), pc.or_(b2, pc.fill_null(pc.less(total, 0), False)))
        has_stats = pc.or_(has_stats, pc.is_valid(total))
        out["zero_count"] = total
    checksum, algo = null_str, null_str
    for col, name in reversed(list(_CSV_CHECKSUMS.items())):  # the first non-empty one wins
        arr = _col(tb, index, col)
        if arr is not None:
            hit = pc.not_equal(arr, "")
            checksum = pc.if_else(hit, arr, checksum)
            algo = pc.if_else(hit, pa.scalar(name), algo)
    shape = out.pop("shape")
    if "shape" in index:
        # '' is kept as text by statistic_row (reported); non-ASCII digits and runs of 19+
        # digits follow the per-record rules
        # shapes repeat: parsed once per distinct text, by statistic_row's rule; '' is kept
        # as text there (reported), a dimension beyond int64 too: those records go per-record
        distinct = pc.unique(shape).to_pylist()
        parsed = [parse_shape_cell(t) if t else None for t in distinct]
        odd_shape = [p is None or any(d >= 1 << 63 for d in p) for p in parsed]
        pos = pc.index_in(shape, pa.array(distinct, pa.string()))
        bad = pc.or_(bad, pc.take(pa.array(odd_shape, pa.bool_()), pos))
        shape = pc.take(pa.array([None if o or p is None else list(p) for p, o in zip(parsed, odd_shape)],
                                 pa.list_(pa.int64())), pos)
    else:
        shape = pa.nulls(n, pa.list_(pa.int64()))
    keep_rows = pc.invert(pc.or_(blank, bad))
    table = pa.table({
        "op_type": out["op_type"], "op_name": out["op_name"], "task_id": out["task_id"],
        "stream_id": out["stream_id"], "timestamp": out["timestamp"], "io": out["io"], "slot": out["slot"],
        "format": out["format"], "dtype_declared": out["dtype"], "shape_declared": shape,
        **{f: out[f] for f in _CSV_STATS.values()}, "checksum": checksum, "checksum_algo": algo,
        "has_stats": has_stats,
    }).filter(keep_rows)
    odd_mask = pc.and_(bad, pc.invert(blank)).to_pylist()
    if any(odd_mask):
        rows = rows + _python_rows(batch, cols, odd_mask)
    return StatisticBatch(table, rows, n)


def _empty_table() -> pa.Table:
    return _convert(batch_empty(0), [], {}, []).table
