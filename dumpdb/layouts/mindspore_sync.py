"""MindSpore 2.x synchronous dump (layout ``mindspore-sync``).

Sources: seed 001 (同步Dump数据对象目录 / 同步Dump数据文件介绍), seed 002
(rank_{rank_id} layout) and the real CPU dumps of corpus ``mindspore-cpu``::

    {path}/rank_{rank_id}/
        .dump_metadata/{config.json, data_dump.json, ...}
        {net_name}/{graph_id}/{iteration_id}/
            {op_type}.{op_name}.{task_id}.{stream_id}.{timestamp}.{input|output}.{slot}.{format}[.{dtype}].npy
            statistic.csv      (saved_data statistic/full)
            mapping.csv        (names too long for the file system: "{hash}.npy,{original name}")
        {net_name}/{graph_id}/constants/Parameter.data-{data_id}.0.0.{timestamp}.output.0.DefaultFormat[.{dtype}].npy
        graphs/ms_output_trace_code_graph_{graph_id}.{ir,pb}
        execution_order/ms_execution_order_graph_{graph_id}.csv
        execution_order/ms_global_execution_order_graph_{graph_id}.csv
"""

from __future__ import annotations

import csv
import io
import math
import os
import re
from pathlib import Path

from dumpdb.dumpio import MAX_TEXT_BYTES, leaves_dump, read_dump_bytes, read_dump_text, reason
from dumpdb.errors import DumpdbError, DumpFileError, LayoutError
from dumpdb.layouts import mindspore_ir as ir
from dumpdb.layouts.base import (
    DumpScan,
    Layout,
    LoadedTensor,
    TensorEntry,
    display_name,
    file_sizes,
    find_dirs,
    read_metadata_dir,
)
from dumpdb.npy import read_npy_declared

RANK_DIR_RE = re.compile(r"^rank_(\d+)$")
TENSOR_NAME_RE = re.compile(
    r"^(?P<op_type>[^.]+)\.(?P<op_name>.+)\.(?P<task_id>\d+)\.(?P<stream_id>\d+)\.(?P<timestamp>\d+)"
    r"\.(?P<io>input|output)\.(?P<slot>\d+)\.(?P<format>[A-Za-z0-9_]+)(?:\.(?P<dtype>[A-Za-z0-9_]+))?\.npy$"
)
_EO_RE = re.compile(r"^ms_execution_order_graph_(\d+)\.csv$")
_GEO_RE = re.compile(r"^ms_global_execution_order_graph_(\d+)\.csv$")
_IR_RE = re.compile(r"^ms_output_trace_code_graph_(\d+)\.ir$")
_SPECIAL_DIRS = {".dump_metadata", "graphs", "execution_order"}
_ASCII_DIGITS = re.compile(r"^[0-9]+$")
_INT32_MAX, _INT64_MAX = (1 << 31) - 1, (1 << 63) - 1
MAX_SEARCH_DEPTH = 4

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


def find_dump_roots(start: Path, max_depth: int = MAX_SEARCH_DEPTH) -> list[Path]:
    """Directories at or below ``start`` that directly contain ``rank_{id}`` dirs.

    A ``start`` that is itself a ``rank_{id}`` directory counts as its own root.
    Searches ``max_depth`` levels of directories (file names are not listed).
    """
    ranks = find_dirs(start, RANK_DIR_RE.match, max_depth)
    if ranks == [start]:
        return [start]
    return sorted({r.parent for r in ranks})


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


def _dir_number(name: str, limit: int) -> int | None:
    """``int(name)`` for an ASCII-digit name not above ``limit`` (catalog column range), else None."""
    if not _ASCII_DIGITS.match(name) or len(name) > 20:
        return None
    value = int(name)
    return value if value <= limit else None


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


class MindSporeSync(Layout):
    name = "mindspore-sync"
    description = "MindSpore 2.x synchronous (e2e) dump: rank_{id}/{net}/{graph}/{iteration}/*.npy"
    document = "seed 001 (MindSpore Dump, 同步Dump), seed 002; corpus mindspore-cpu"

    def detect(self, root: Path) -> bool:
        for dump_root in find_dump_roots(root):
            rank_dirs = [dump_root] if RANK_DIR_RE.match(dump_root.name) else [
                dump_root / e for e in os.listdir(dump_root) if RANK_DIR_RE.match(e)
            ]
            for rank_dir in rank_dirs:
                if any(
                    (rank_dir / s).is_dir() for s in (".dump_metadata", "execution_order", "graphs")
                ) or self._net_dirs(rank_dir):
                    return True
        return False

    @staticmethod
    def _net_dirs(rank_dir: Path) -> list[Path]:
        out = []
        try:
            with os.scandir(rank_dir) as entries:
                candidates = [e.path for e in entries
                              if e.is_dir(follow_symlinks=False) and e.name not in _SPECIAL_DIRS]
        except OSError:
            return out
        for path in candidates:
            try:
                with os.scandir(path) as graphs:
                    if any(g.is_dir() and g.name.isdigit() for g in graphs):
                        out.append(Path(path))
            except OSError:
                continue
        return sorted(out)

    def scan(self, root: Path) -> DumpScan:
        root = Path(root)
        roots = find_dump_roots(root)
        if not roots:
            raise LayoutError(f"{root}: no rank_{{rank_id}} directory found (looked {MAX_SEARCH_DEPTH} levels down)")
        if len(roots) > 1:
            shown = ", ".join(str(r.relative_to(root)) for r in roots[:5])
            raise LayoutError(
                f"{root}: holds {len(roots)} separate dumps ({shown}{', ...' if len(roots) > 5 else ''}); "
                "ingest them one at a time"
            )
        dump_root = roots[0]
        scan = DumpScan(layout=self.name, root=root, framework="MindSpore")
        if RANK_DIR_RE.match(dump_root.name):
            rank_dirs = [dump_root]
        else:
            rank_dirs = sorted(
                (dump_root / n for n in os.listdir(dump_root) if RANK_DIR_RE.match(n)),
                key=lambda p: int(RANK_DIR_RE.match(p.name).group(1)),
            )
        for rank_dir in rank_dirs:
            self._scan_rank(root, rank_dir, scan)
        scan.entries.sort(key=lambda e: (
            e.rank if e.rank is not None else -1, e.graph_id if e.graph_id is not None else -1,
            e.iteration if e.iteration is not None else -1, e.timestamp or 0, e.source_file,
        ))
        return scan

    # -- one rank ------------------------------------------------------------
    def _scan_rank(self, root: Path, rank_dir: Path, scan: DumpScan) -> None:
        rank = int(RANK_DIR_RE.match(rank_dir.name).group(1))
        rel_rank = os.path.relpath(rank_dir, root)
        self._read_metadata(root, rank_dir, scan)
        scopes_by_graph, params_by_graph = self._read_graphs(root, rank_dir, rank, scan)
        rank_entries: list[TensorEntry] = []
        for net_dir in self._net_dirs(rank_dir):
            net_name = net_dir.name
            for graph_dir in sorted(net_dir.iterdir()):
                if not graph_dir.is_dir():
                    continue
                graph_id = _dir_number(graph_dir.name, _INT32_MAX)
                if graph_id is None:
                    if _ASCII_DIGITS.match(graph_dir.name):
                        scan.errors.append((display_name(os.path.join(rel_rank, net_name, graph_dir.name)),
                                            f"graph_id {graph_dir.name[:40]} is out of range; directory not read"))
                    continue
                for it_dir in sorted(graph_dir.iterdir()):
                    if not it_dir.is_dir():
                        continue
                    rel_dir = os.path.join(rel_rank, net_name, graph_dir.name, it_dir.name)
                    outside = leaves_dump(it_dir)
                    if outside is not None:  # one line for the directory, not one per file
                        scan.errors.append((display_name(rel_dir), f"symlink leads outside the dump directory "
                                            f"(to {outside}); not followed (--follow-symlinks allows it)"))
                        continue
                    iteration = _dir_number(it_dir.name, _INT64_MAX)
                    if it_dir.name == "constants":
                        iteration = None
                    elif iteration is None:
                        # seed 001: {graph_id}/{iteration_id}/ and constants/ only
                        what = ("iteration_id out of range" if _ASCII_DIGITS.match(it_dir.name)
                                else "not an iteration directory ({iteration_id} or constants)")
                        scan.errors.append((display_name(rel_dir), f"{what}; its files were not read"))
                        continue
                    rank_entries.extend(self._scan_tensor_dir(
                        it_dir, rel_dir, rank, net_name, graph_id, iteration, scan))
        self._link(rank_entries, scopes_by_graph, params_by_graph)
        scan.entries.extend(rank_entries)

    def _read_metadata(self, root: Path, rank_dir: Path, scan: DumpScan) -> None:
        texts = read_metadata_dir(root, rank_dir / ".dump_metadata", scan)
        if "data_dump.json" in texts and scan.dump_config is None:
            scan.dump_config = texts["data_dump.json"]
        config = scan.metadata.get(display_name(os.path.relpath(rank_dir / ".dump_metadata" / "config.json", root)))
        if isinstance(config, dict):
            scan.framework_version = scan.framework_version or config.get("ms_version")
            scan.device_target = scan.device_target or config.get("device_target")

    def _read_graphs(self, root: Path, rank_dir: Path, rank: int, scan: DumpScan):
        scopes_by_graph: dict[int, list[str]] = {}
        params_by_graph: dict[int, list[str]] = {}
        ir_scopes: dict[int, list[str]] = {}
        graphs_dir = rank_dir / "graphs"
        if graphs_dir.is_dir():
            for path in sorted(graphs_dir.iterdir()):
                m = _IR_RE.match(path.name)
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
                params_by_graph[g] = params
                ir_scopes[g] = [n["scope_name"] for n in nodes if n["scope_name"]]
                for n in nodes:
                    scan.ops.append({"rank": rank, "graph_id": g, **n})
        eo_dir = rank_dir / "execution_order"
        if eo_dir.is_dir():
            for path in sorted(eo_dir.iterdir()):
                rel = display_name(os.path.relpath(path, root))
                m, gm = _EO_RE.match(path.name), _GEO_RE.match(path.name)
                try:
                    if m:
                        g = int(m.group(1))
                        order = ir.read_execution_order(path)
                        garbled = [i for i, s in enumerate(order) if ir.garbled_scope(s)]
                        if garbled:
                            scan.errors.append((rel, f"{len(garbled)} garbled line(s) (binary data, not a scope "
                                                f"name), first at line {garbled[0] + 2}; skipped"))
                            order = [s for s in order if not ir.garbled_scope(s)]
                        scopes_by_graph[g] = order
                        scan.execution_order.extend(
                            {"rank": rank, "graph_id": g, "position": i, "scope_name": s}
                            for i, s in enumerate(order)
                        )
                    elif gm:
                        g = int(gm.group(1))
                        scan.graph_executions.extend(
                            {"rank": rank, "graph_id": g, "iteration": it}
                            for it in ir.read_global_execution_order(path)
                        )
                except (OSError, DumpdbError) as exc:
                    scan.errors.append((rel, f"cannot read execution order: {reason(exc, path)}"))
        for g, scopes in ir_scopes.items():
            # Kernels come from the execution order; the IR also has Load,
            # UpdateState, ... nodes. Use the IR only where no order exists.
            scopes_by_graph.setdefault(g, scopes)
        return scopes_by_graph, params_by_graph

    def _scan_tensor_dir(self, it_dir: Path, rel_dir: str, rank: int, net_name: str,
                         graph_id: int, iteration: int | None, scan: DumpScan) -> list[TensorEntry]:
        entries: list[TensorEntry] = []
        try:
            sizes = file_sizes(it_dir)
        except OSError as exc:
            scan.errors.append((rel_dir, f"cannot list directory: {exc.strerror or exc}"))
            return entries
        names = list(sizes)
        mapping: dict[str, str] = {}
        if "mapping.csv" in names:
            try:
                mapping = read_mapping_csv(it_dir / "mapping.csv")
            except (OSError, DumpdbError) as exc:
                scan.errors.append((display_name(os.path.join(rel_dir, "mapping.csv")),
                                    reason(exc, it_dir / "mapping.csv")))
        csv_rows: dict[tuple, dict] = {}
        if "statistic.csv" in names:
            try:
                for row in read_statistic_csv(it_dir / "statistic.csv"):
                    key = (row.get("op_type"), row.get("op_name"), row.get("task_id"),
                           row.get("stream_id"), row.get("timestamp"), row.get("io"), row.get("slot"))
                    csv_rows[key] = row
            except (OSError, DumpdbError) as exc:
                scan.errors.append((display_name(os.path.join(rel_dir, "statistic.csv")),
                                    reason(exc, it_dir / "statistic.csv")))
        for name in sorted(names):
            if not name.endswith(".npy"):
                continue
            original = mapping.get(name, name)
            source_file = display_name(os.path.join(rel_dir, name))
            fields = parse_tensor_name(original)
            if fields is None:
                scan.errors.append((source_file, "file name does not follow "
                                    "{op_type}.{op_name}.{task_id}.{stream_id}.{timestamp}.{input|output}.{slot}.{format}[.{dtype}].npy"))
                continue
            entry = TensorEntry(
                source_file=source_file, path=str(it_dir / name), rank=rank, net_name=net_name,
                graph_id=graph_id, iteration=iteration, size=sizes[name], **fields,
            )
            if name in mapping:
                entry.note = f"name from mapping.csv ({name})"
            row = csv_rows.pop((entry.op_type, entry.op_name, entry.task_id, entry.stream_id,
                                entry.timestamp, entry.io, entry.slot), None)
            if row is not None:
                entry.stats = row["stats"] or None
                entry.checksum, entry.checksum_algo = row["checksum"], row["checksum_algo"]
            entries.append(entry)
        # statistic.csv rows without a tensor file: statistics-only tensors.
        csv_file = display_name(os.path.join(rel_dir, "statistic.csv"))
        for row in csv_rows.values():
            entries.append(TensorEntry(
                source_file=csv_file, path=None, tensor_key=statistic_key(csv_file, row),
                rank=rank, net_name=net_name, graph_id=graph_id, iteration=iteration,
                op_type=row.get("op_type"), op_name=row.get("op_name"), task_id=row.get("task_id"),
                stream_id=row.get("stream_id"), timestamp=row.get("timestamp"), io=row.get("io"),
                slot=row.get("slot"), format=row.get("format"), dtype_declared=row.get("dtype"),
                shape_declared=row.get("shape"), stats=row["stats"] or None,
                checksum=row["checksum"], checksum_algo=row["checksum_algo"],
            ))
        return entries

    @staticmethod
    def _link(entries: list[TensorEntry], scopes_by_graph: dict[int, list[str]],
              params_by_graph: dict[int, list[str]]) -> None:
        by_graph: dict[int | None, list[TensorEntry]] = {}
        for e in entries:
            by_graph.setdefault(e.graph_id, []).append(e)
        for g, group in by_graph.items():
            ops = [e.op_name for e in group if e.op_type != "Parameter" and e.op_name]
            links = ir.link_scopes(ops, scopes_by_graph.get(g, []))
            # Parameter files: Parameter.{name with '.' -> '_'} (corpus README).
            params = {}
            for p in params_by_graph.get(g, []):
                params.setdefault(p.replace(".", "_"), p)
            for e in group:
                if e.op_type == "Parameter":
                    e.scope_name = params.get(e.op_name)
                else:
                    e.scope_name = links.get(e.op_name)

    # -- payloads ----------------------------------------------------------------
    def load(self, entry: TensorEntry) -> LoadedTensor:
        """Read the entry's ``.npy`` (see :mod:`dumpdb.npy` for the quirks handled)."""
        t = read_npy_declared(entry.path, entry.source_file, entry.dtype_declared)
        return LoadedTensor(t.array, t.note)
