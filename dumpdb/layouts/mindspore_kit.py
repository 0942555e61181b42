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

from dumpdb.dumpio import MAX_TEXT_BYTES, open_dump_file, read_dump_bytes, reason
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
    "l2 norm value": "l2norm",  # CANN (mstt AclDumpDataProcessor.cpp kStatsHeaderL2Norm)
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
    "index": "slot",  # CANN (mstt AclDumpDataProcessor.cpp kStatsHeaderId); Slot wins when both are there
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


def read_statistic_csv(path: Path, errors: list[str] | None = None) -> list[dict]:
    """Rows of a statistic.csv, keyed by catalog names, parsed by header names, in file order.

    The rows :func:`statistic_batches` reads (the one statistic.csv parser), as
    :func:`statistic_row` dicts, for callers that want every row at once (Ascend's small
    per-directory csv files). Extra and reordered columns are tolerated; a missing key column
    gives None. Each row: the key fields (op_type, op_name, task_id, stream_id, timestamp, io,
    slot), ``dtype``/``shape``/``format`` as written, ``stats`` (catalog statistic columns
    present), ``checksum``/``checksum_algo`` and ``line``. A statistic that is not a number (or
    a count that is not a non-negative integer: ``nan``, ``1e400``, ``-3``) is kept as its text,
    which the ingest reports as one error line and ignores
    (:func:`dumpdb.ingestion.ranges.check_ranges`). Records the parser refused (an over-long
    line, a broken quote) add one message each to ``errors``.
    Raises :class:`~dumpdb.errors.DumpFileError` for a FIFO/device or an unreadable file.
    """
    rows: list[dict] = []
    for batch in statistic_batches(path, str(path)):
        rows.extend(batch_rows(batch))
        if errors is not None:
            errors.extend(batch.refused)
    rows.sort(key=lambda r: r["line"])
    return rows


def batch_rows(batch: StatisticBatch) -> list[dict]:
    """Every record of ``batch`` as a :func:`statistic_row` dict (with ``line``), the columnar
    ones converted back (shape a tuple, statistics present in ``stats``)."""
    out = list(batch.rows)
    stat_fields = list(_CSV_STATS.values())
    for r in batch.table.to_pylist():
        row = {k: r[k] for k in ("op_type", "op_name", "task_id", "stream_id", "timestamp", "io", "slot", "format",
                                 "checksum", "checksum_algo", "line")}
        row["dtype"] = r["dtype_declared"]
        row["shape"] = tuple(r["shape_declared"]) if r["shape_declared"] is not None else None
        row["stats"] = {f: r[f] for f in stat_fields if r[f] is not None}
        out.append(row)
    return out


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


def read_stats_csv(path: Path, errors: list[str] | None = None) -> list[dict]:
    """Rows of a statistics csv (CANN, TorchAir): :func:`read_statistic_csv`, whose header map
    also knows the CANN spellings ``Index`` for the slot and ``L2 Norm Value`` (mstt
    AclDumpDataProcessor.cpp kStatsHeaderId / kStatsHeaderL2Norm)."""
    return read_statistic_csv(path, errors)


# -- statistic.csv joined to the tensor files of a directory ---------------------------
IDENTITY_FIELDS = ("op_type", "op_name", "task_id", "stream_id", "timestamp", "io", "slot")


def row_identity(parts: Sequence) -> str:
    """The identity of a statistic.csv row or tensor file as text: (op_type, op_name, task_id,
    stream_id, timestamp, io, slot) joined by ``.``, None as empty (the part of
    :func:`statistic_key` after ``#``)."""
    return ".".join("" if p is None else str(p) for p in parts)


def dict_identity(row: dict) -> str:
    """:func:`row_identity` of a :func:`statistic_row` dict."""
    return row_identity([row.get(k) for k in IDENTITY_FIELDS])


def _entry_identity(e: TensorEntry) -> str:
    return row_identity([getattr(e, k) for k in IDENTITY_FIELDS])


def table_identities(table: pa.Table) -> pa.Array:
    """:func:`row_identity` of each row of a :class:`StatisticBatch` table."""
    parts = [pc.fill_null(pc.cast(table[c], pa.string()), "") for c in IDENTITY_FIELDS]
    return pc.binary_join_element_wise(*parts, ".")


def duplicate_row(where: str, line: int | None, identity: str) -> str:
    """The one error line for a statistics csv row whose identity an earlier row of the same
    file already gave. The rule, for every statistics csv path: the first row is kept, every
    later one refused. Source: seed 001 (同步Dump数据文件介绍) "每个张量一行" - one row per
    tensor - and the tensor file name is made of the same fields
    (``{op_type}.{op_name}.{task_id}.{stream_id}.{timestamp}.{io}.{slot}``), so a second row
    can only describe the same tensor again; keeping the first agrees with what a resumed
    ingest has already committed."""
    at = f" line {line}" if line else ""
    return (f"{where}{at}: a second row for {identity[:300]} (seed 001: one row per tensor); "
            "row skipped, the first one is kept")


class StatisticJoin:
    """The statistics csv rows of one tensor directory, matched to its tensor files.

    A row describes the tensor file with the same (op_type, op_name, task_id,
    stream_id, timestamp, io, slot) (seed 001: statistic.csv lists every tensor of
    the directory); :meth:`attach` gives that file the row's statistics and checksum.
    Rows no file claimed become statistics-only entries (:meth:`statistics_only`).
    A second row of the same identity in one file is refused (:func:`duplicate_row`,
    in ``errors`` as ``(source_file, message)``).
    """

    def __init__(self) -> None:
        self._rows: dict[tuple, tuple[str, dict]] = {}
        self.errors: list[tuple[str, str]] = []

    def add(self, source_file: str, rows: list[dict], per_file: bool = False) -> None:
        """Rows read from ``source_file`` (in file order). ``per_file``: the rows only describe
        tensors named after that file (per-op csv statistics of TorchAir/CANN), never a
        tensor file of the directory."""
        for row in rows:
            ident = dict_identity(row)
            key = (source_file, ident) if per_file else (ident,)
            if key in self._rows and self._rows[key][0] == source_file:
                self.errors.append((source_file, duplicate_row(source_file, row.get("line"), ident)))
                continue
            self._rows[key] = (source_file, row)

    def attach(self, entry: TensorEntry) -> None:
        """Give ``entry`` the statistics and checksum of its row, if there is one."""
        hit = self._rows.pop((_entry_identity(entry),), None)
        if hit is not None:
            _give(entry, hit[1])

    def statistics_only(self, **fields) -> list[TensorEntry]:
        """Entries for the rows no tensor file claimed (``path`` None, ``tensor_key`` from
        :func:`statistic_key`); ``fields`` are the directory's (rank, iteration, ...)."""
        return [statistics_entry(source_file, row, fields) for source_file, row in self._rows.values()]


def _give(entry: TensorEntry, row: dict) -> None:
    entry.stats = row["stats"] or None
    entry.checksum, entry.checksum_algo = row["checksum"], row["checksum_algo"]


def statistics_entry(source_file: str, row: dict, fields: dict) -> TensorEntry:
    """A statistics-only entry for a :func:`statistic_row` dict of ``source_file``."""
    return TensorEntry(
        source_file=source_file, path=None, tensor_key=statistic_key(source_file, row), **fields,
        op_type=row.get("op_type"), op_name=row.get("op_name"), task_id=row.get("task_id"),
        stream_id=row.get("stream_id"), timestamp=row.get("timestamp"), io=row.get("io"),
        slot=row.get("slot"), format=row.get("format"), dtype_declared=row.get("dtype"),
        shape_declared=row.get("shape"), stats=row["stats"] or None,
        checksum=row["checksum"], checksum_algo=row["checksum_algo"], csv_line=row.get("line"),
    )


def claim_statistics(sf: StatisticsFile, entries: list[TensorEntry]) -> None:
    """Give each tensor file ``entries`` of a directory the statistics of its row in the
    directory's statistic.csv ``sf`` (the first row of its identity), reading the csv in
    batches (:func:`statistic_batches`, bounded memory: issue 30 item 12), and set
    ``sf.claimed`` so the ingest streams the other rows as statistics-only tensors.
    Later rows of a claimed identity, and every refused record, are reported when the
    ingest streams the file. Raises :class:`~dumpdb.errors.DumpFileError` for a file that
    cannot be read."""
    by_identity = {_entry_identity(e): e for e in entries}
    sf.claimed = frozenset(by_identity)
    if not by_identity:
        return
    wanted = pa.array(list(by_identity), pa.string())
    given: set[str] = set()
    for batch in statistic_batches(Path(sf.path), sf.source_file):
        hit = pc.is_in(table_identities(batch.table), wanted)
        matched = StatisticBatch(batch.table.filter(hit), [r for r in batch.rows
                                                         if dict_identity(r) in by_identity], 0)
        for row in sorted(batch_rows(matched), key=lambda r: r["line"]):
            ident = dict_identity(row)
            if ident not in given:
                given.add(ident)
                _give(by_identity[ident], row)


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
    catalog statistic columns (double / int64), ``checksum, checksum_algo``,
    ``has_stats`` (bool: the record had at least one statistic) and ``line`` (int64: the
    file line the record starts on, the header being line 1), with exactly the values
    :func:`statistic_row` gives. ``rows``: records the columnar path does not decide
    (unusual spellings, out-of-range values, short or long records), as
    :func:`statistic_row` dicts with ``line``, so every rule stays in one place.
    ``refused``: one message per record that is not a csv record at all (an over-long
    line, a broken quote), naming its line.
    """

    table: pa.Table
    rows: list[dict]
    records: int  # csv records this batch covers (blank and refused ones included)
    refused: list[str] = field(default_factory=list)


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


# A statistic.csv line longer than this is refused (one error line naming it) and never held
# whole: MindSpore's longest cells are op names, which it shortens for file names at 255 bytes
# but writes whole here (seed 001, mapping.csv); 1 MiB is 4,000 times that.
MAX_STATISTIC_LINE_CHARS = 1 << 20
# one cell may span lines (quoted): bounded too, so a never-closed quote costs at most this
_MAX_CELL_CHARS = 16 << 20


def _csv_field_limit() -> None:
    # the csv module's limit is process-wide; only ever raised (131,072 would refuse a long op name)
    if csv.field_size_limit() < _MAX_CELL_CHARS:
        csv.field_size_limit(_MAX_CELL_CHARS)


_LINE_RE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


def _physical_lines(chunk: bytes) -> int:
    """Lines of ``chunk`` (CR, LF or CRLF ends; a last line without an end counts)."""
    n = chunk.count(b"\n") + chunk.count(b"\r") - chunk.count(b"\r\n")
    return n + (1 if chunk and chunk[-1:] not in (b"\n", b"\r") else 0)


def _line_ends_at(buf: bytes, end: int) -> int:
    """The index just past the last line end in ``buf[:end]``, or 0 (a CR as the very last
    byte of ``buf`` may be half of a CRLF: not an end yet)."""
    i = max(buf.rfind(b"\n", 0, end), buf.rfind(b"\r", 0, end))
    if i >= 0 and buf[i:i + 1] == b"\r" and i + 1 == len(buf):
        return _line_ends_at(buf, i)
    return i + 1


def _safe_cut(buf: bytes, end: int) -> int:
    """Where ``buf`` can be cut between two records, at most at ``end``: past the last line end
    with an even number of quote characters before it (not inside a quoted cell); 0 if none."""
    for _ in range(64):
        cut = _line_ends_at(buf, end)
        if cut <= 0:
            return 0
        if buf.count(b'"', 0, cut) % 2 == 0:
            return cut
        end = cut - 1
    return 0


def _is_utf8(data: bytes) -> bool:
    if data.isascii():
        return True
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


class _Parser:
    """The records of one statistic.csv after its header, chunk by chunk (see
    :func:`statistic_batches`): each chunk ends at a record boundary; Arrow's csv reader
    takes a chunk whose every line is one well-formed record (the usual file), the csv
    module the rest, record by record, so every record gets its exact line."""

    def __init__(self, where: str, cols: list[str]) -> None:
        self.where, self.cols = where, cols
        self.index = {name: i for i, name in enumerate(cols)}  # the last of equal names, as dict(zip())
        self.names = [f"c{i}" for i in range(len(cols))]

    def chunk(self, chunk: bytes, first_line: int) -> StatisticBatch:
        lines = _physical_lines(chunk)
        fast = self._fast(chunk, first_line, lines)
        return fast if fast is not None else self._slow(chunk, first_line, lines)

    def _fast(self, chunk: bytes, first_line: int, lines: int) -> StatisticBatch | None:
        if b"\x00" in chunk or not self.cols or not _is_utf8(chunk):
            # undecodable bytes go record by record anyway (pyarrow refuses them in a string
            # column); checked first because pyarrow cannot hand such a row to ``odd``: the
            # handler would fail inside pyarrow, which only prints that failure
            return None
        invalid: list[object] = []

        def odd(row) -> str:
            invalid.append(row)
            return "skip"

        try:
            table = pacsv.read_csv(io.BytesIO(chunk), read_options=pacsv.ReadOptions(
                column_names=self.names, block_size=1 << 20),
                parse_options=pacsv.ParseOptions(newlines_in_values=True, invalid_row_handler=odd),
                convert_options=pacsv.ConvertOptions(column_types={n: pa.string() for n in self.names},
                                                     strings_can_be_null=False, quoted_strings_can_be_null=False))
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # undecodable bytes, a broken quote: record by record
            return None
        if invalid or table.num_rows != lines:  # blank lines, odd records or cells across lines
            return None
        if len(chunk) > MAX_STATISTIC_LINE_CHARS:
            widths = [pc.binary_length(c) for c in table.columns]
            total = widths[0]
            for w in widths[1:]:
                total = pc.add(total, w)
            if (pc.max(total).as_py() or 0) + len(self.cols) > MAX_STATISTIC_LINE_CHARS:
                return None  # an over-long line: refused record by record
        batch = pa.RecordBatch.from_arrays([c.combine_chunks() for c in table.columns], names=self.names) \
            if table.num_rows else batch_empty(len(self.cols))
        starts = pa.array(range(first_line, first_line + table.num_rows), pa.int64())
        out = _convert(batch, self.cols, self.index, [], starts)
        out.records = lines
        return out

    def _slow(self, chunk: bytes, first_line: int, lines: int) -> StatisticBatch:
        text = chunk.decode("utf-8", errors="replace").replace("\x00", "")
        physical = _LINE_RE.findall(text)
        refused: list[str] = []
        for i, line in enumerate(physical):
            if len(line) > MAX_STATISTIC_LINE_CHARS:
                refused.append(f"{self.where} line {first_line + i}: longer than {MAX_STATISTIC_LINE_CHARS:,} "
                               "characters; row skipped")
                physical[i] = "\n"
        reader = csv.reader(physical)
        records: list[list[str]] = []
        starts: list[int] = []
        rows: list[dict] = []
        ncols = len(self.cols)
        while True:
            start = first_line + reader.line_num
            try:
                rec = next(reader)
            except StopIteration:
                break
            except csv.Error as exc:
                refused.append(f"{self.where} line {start}: not a csv record ({exc}); row skipped")
                continue
            if len(rec) == ncols:
                records.append(rec)
                starts.append(start)
            elif rec:
                row = statistic_row(self.cols, rec)
                if row is not None:
                    row["line"] = start
                    rows.append(row)
        batch = pa.RecordBatch.from_arrays([pa.array(c, pa.string()) for c in zip(*records)], names=self.names) \
            if records else batch_empty(ncols)
        out = _convert(batch, self.cols, self.index, rows, pa.array(starts, pa.int64()))
        out.records = lines
        out.refused = refused
        return out


def statistic_batches(path: str | os.PathLike, where: str,
                      block_bytes: int = STATISTIC_BATCH_BYTES) -> Iterator[StatisticBatch]:
    """A statistic.csv, about ``block_bytes`` of text per batch, so memory does not grow with
    the file (issue 12): the one statistic.csv parser (issue 30, item 10), for a csv beside
    tensor files and for a statistics-only dump alike. Values as :func:`statistic_row` gives
    them (see :class:`StatisticBatch`).

    Rules (sources: seed 001 同步Dump数据文件介绍, columns and "每个张量一行"; corpus
    mindspore-cpu README, column titles): UTF-8 (a byte-order mark dropped, UTF-16 refused:
    :func:`check_statistic_encoding`); a line ends at CR, LF or CRLF; the first line is the
    header, matched by name (:func:`statistic_columns`); a line over
    :data:`MAX_STATISTIC_LINE_CHARS` or a record the csv grammar refuses is one ``refused``
    message naming the file and line, and the rest is read. The text is cut into chunks at
    record boundaries (a line end outside quotes); memory holds one chunk.

    Raises :class:`~dumpdb.errors.DumpFileError` for a FIFO/device, a file outside the
    dump, an unreadable file, or one whose header line is over-long or not csv.
    """
    _csv_field_limit()
    fd = open_dump_file(path, where)
    with os.fdopen(fd, "rb") as raw:
        try:
            head = raw.read(MAX_STATISTIC_LINE_CHARS + 2)
            check_statistic_encoding(head, where)
            header_end = _line_ends_at(head, len(head)) if len(head) > MAX_STATISTIC_LINE_CHARS else len(head)
            first = _LINE_RE.match(head.decode("utf-8", errors="replace"))
            if first is None or not head:
                return
            line = first.group(0)
            if len(line) > MAX_STATISTIC_LINE_CHARS or header_end == 0:
                raise DumpFileError(f"{where}: header line longer than {MAX_STATISTIC_LINE_CHARS:,} characters; "
                                    "not a statistic.csv")
            try:
                header = next(csv.reader([line.replace("\x00", "")]), None)
            except csv.Error as exc:
                raise DumpFileError(f"{where}: not a readable csv header: {exc}") from None
            if not header:
                return
            parser = _Parser(where, statistic_columns(header))
            buf = head[_header_bytes(head):]
            line_no = 2
            eof = False
            skipping = False  # inside an over-long line without an end yet
            while True:
                while not eof and len(buf) < block_bytes:
                    more = raw.read(block_bytes)
                    eof = not more
                    buf += more
                if not buf:
                    return
                if skipping:  # the rest of an over-long line, already refused
                    cut = _first_line_end(buf)
                    if cut <= 0:
                        buf = b""
                        if eof:
                            return
                        more = raw.read(block_bytes)
                        eof = not more
                        buf = more
                        continue
                    buf, skipping = buf[cut:], False
                    line_no += 1
                    continue
                if eof and len(buf) <= block_bytes:
                    cut = len(buf)
                else:  # about block_bytes a chunk, cut at a record boundary
                    cut = _safe_cut(buf, min(len(buf), block_bytes)) or _safe_cut(buf, len(buf))
                    if cut <= 0 and eof:
                        cut = len(buf)
                if cut <= 0:
                    if len(buf) < block_bytes + 2 * MAX_STATISTIC_LINE_CHARS:
                        more = raw.read(block_bytes)
                        eof = not more
                        buf += more
                        continue
                    cut = _first_line_end(buf)  # no record boundary: a broken quote or an over-long line
                    if cut <= 0 or cut > MAX_STATISTIC_LINE_CHARS + 2:
                        batch = StatisticBatch(_convert(batch_empty(len(parser.cols)), parser.cols, parser.index, [],
                                                        pa.array([], pa.int64())).table, [], 1)
                        batch.refused = [f"{where} line {line_no}: longer than {MAX_STATISTIC_LINE_CHARS:,} "
                                         "characters; row skipped"]
                        yield batch
                        if cut <= 0:
                            buf, skipping = b"", True
                        else:
                            buf = buf[cut:]
                            line_no += 1
                        continue
                chunk, buf = buf[:cut], buf[cut:]
                batch = parser.chunk(chunk, line_no)
                line_no += batch.records  # its physical lines
                yield batch
        except OSError as exc:
            raise DumpFileError(f"{where}: cannot read: {exc.strerror or exc}") from None


def _first_line_end(buf: bytes) -> int:
    """The index just past the first line end of ``buf`` (CRLF whole), or 0."""
    ends = [i for i in (buf.find(b"\n"), buf.find(b"\r")) if i >= 0]
    if not ends:
        return 0
    i = min(ends)
    return i + 2 if buf[i:i + 2] == b"\r\n" else i + 1


def _header_bytes(head: bytes) -> int:
    """Bytes of the first line of ``head`` (its end included)."""
    return _first_line_end(head) or len(head)


def batch_empty(ncols: int) -> pa.RecordBatch:
    """A record batch of ``ncols`` text columns and no rows."""
    return pa.RecordBatch.from_arrays([pa.array([], pa.string())] * ncols, names=[f"c{i}" for i in range(ncols)])


_STAT_FLOATS = ("max value", "min value", "avg value", "l2norm value")
_STAT_TEXT = ("op type", "op name", "format", "data type")


def _python_rows(batch: pa.RecordBatch, cols: list[str], mask: list[bool], lines: pa.Array) -> list[dict]:
    cells = [c.to_pylist() for c in batch.columns]
    starts = lines.to_pylist()
    out = []
    for i in range(batch.num_rows):
        if mask[i]:
            row = statistic_row(cols, [c[i] for c in cells])
            if row is not None:
                row["line"] = starts[i]
                out.append(row)
    return out


def _convert(batch: pa.RecordBatch, cols: list[str], index: dict[str, int], rows: list[dict],
             lines: pa.Array) -> StatisticBatch:
    """The records of ``batch`` (text cells, as many as ``cols``; ``lines``: their first lines)
    as a :class:`StatisticBatch`, ``rows`` added to those it leaves to :func:`statistic_row`."""
    n = batch.num_rows
    text = [pc.utf8_trim_whitespace(c) for c in batch.columns]
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
    slot_col = "slot" if "slot" in index or "index" not in index else "index"  # as _CSV_KEYS' order
    for col, field_ in (("task id", "task_id"), ("stream id", "stream_id"), ("timestamp", "timestamp"),
                        (slot_col, "slot")):
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
            out.setdefault(field_, pa.nulls(n, pa.int64() if field_.endswith("count") else pa.float64()))
            continue
        if field_.endswith("count"):
            value, b = _parse(arr, _COUNT_RE, pa.int64(), strip=r"\.0*$")
        else:
            value, b = _parse(arr, _FLOAT_RE, pa.float64())
        bad = pc.or_(bad, b)
        has_stats = pc.or_(has_stats, pc.is_valid(value))
        out[field_] = pc.coalesce(value, out[field_]) if field_ in out else value  # the last spelling given
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
        "has_stats": has_stats, "line": lines,
    }).filter(keep_rows)
    odd_mask = pc.and_(bad, pc.invert(blank)).to_pylist()
    if any(odd_mask):
        rows = rows + _python_rows(batch, cols, odd_mask, lines)
    return StatisticBatch(table, rows, n)
