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

import os
import re
from pathlib import Path

from dumpdb.dumpio import leaves_dump, reason
from dumpdb.errors import DumpdbError, LayoutError
from dumpdb.layouts import mindspore_kit as kit
from dumpdb.layouts import register
from dumpdb.layouts.base import (
    DumpScan,
    Layout,
    LoadedTensor,
    StatisticsFile,
    TensorEntry,
    display_name,
    file_sizes,
    find_dirs,
    known_match,
    read_metadata_dir,
)

# Re-exported: these moved to the shared kit (dumpdb.layouts.mindspore_kit).
from dumpdb.layouts.mindspore_kit import (  # noqa: F401
    TENSOR_NAME_RE,
    parse_tensor_name,
    read_mapping_csv,
    read_statistic_csv,
    statistic_key,
)
from dumpdb.npy import read_npy_declared

RANK_DIR_RE = re.compile(r"^rank_(\d+)$")
_SPECIAL_DIRS = {".dump_metadata", "graphs", "execution_order"}
_ASCII_DIGITS = re.compile(r"^[0-9]+$")
_INT32_MAX, _INT64_MAX = (1 << 31) - 1, (1 << 63) - 1
MAX_SEARCH_DEPTH = 4


def find_dump_roots(start: Path, max_depth: int = MAX_SEARCH_DEPTH) -> list[Path]:
    """Directories at or below ``start`` that directly contain ``rank_{id}`` dirs.

    A ``start`` that is itself a ``rank_{id}`` directory counts as its own root.
    Searches ``max_depth`` levels of directories (file names are not listed).
    """
    ranks = find_dirs(start, RANK_DIR_RE.match, max_depth)
    if ranks == [start]:
        return [start]
    return sorted({r.parent for r in ranks})


def _dir_number(name: str, limit: int) -> int | None:
    """``int(name)`` for an ASCII-digit name not above ``limit`` (catalog column range), else None."""
    if not _ASCII_DIGITS.match(name) or len(name) > 20:
        return None
    value = int(name)
    return value if value <= limit else None



@register
class MindSporeSync(Layout):
    name = "mindspore-sync"
    description = "MindSpore 2.x synchronous (e2e) dump: rank_{id}/{net}/{graph}/{iteration}/*.npy"
    document = "seed 001 (MindSpore Dump, 同步Dump), seed 002; corpus mindspore-cpu"
    priority = 20

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
        out: list[Path] = []
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
                key=lambda p: int(known_match(RANK_DIR_RE, p.name).group(1)),
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
        rank = int(known_match(RANK_DIR_RE, rank_dir.name).group(1))
        rel_rank = os.path.relpath(rank_dir, root)
        self._read_metadata(root, rank_dir, scan)
        graphs = kit.read_graphs(root, rank_dir, scan, rank=rank, device_id=None)
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
        deferred = [f for f in scan.statistics_files if f.fields.get("rank") == rank and not f.scopes]
        kit.link_entries(rank_entries, graphs, deferred)
        scan.entries.extend(rank_entries)

    def _read_metadata(self, root: Path, rank_dir: Path, scan: DumpScan) -> None:
        texts = read_metadata_dir(root, rank_dir / ".dump_metadata", scan)
        if "data_dump.json" in texts and scan.dump_config is None:
            scan.dump_config = texts["data_dump.json"]
        config = scan.metadata.get(display_name(os.path.relpath(rank_dir / ".dump_metadata" / "config.json", root)))
        if isinstance(config, dict):
            scan.framework_version = scan.framework_version or config.get("ms_version")
            scan.device_target = scan.device_target or config.get("device_target")

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
        csv_file = display_name(os.path.join(rel_dir, "statistic.csv"))
        statistics = None
        if "statistic.csv" in names:
            # every row not claimed by a tensor file is a statistics-only tensor; the ingest
            # streams the csv (bounded memory, issue 12 and issue 30 item 12)
            statistics = StatisticsFile(
                path=str(it_dir / "statistic.csv"), source_file=csv_file, size=sizes["statistic.csv"],
                fields={"rank": rank, "net_name": net_name, "graph_id": graph_id, "iteration": iteration})
        if statistics is not None and not mapping and not any(n.endswith(".npy") for n in names):
            scan.statistics_files.append(statistics)
            return entries
        directory = str(it_dir)  # os.path.join, not pathlib, per file: ~4 us a file less to scan
        for name in sorted(names):
            if not name.endswith(".npy"):
                continue
            original = mapping.get(name, name)
            source_file = display_name(os.path.join(rel_dir, name))
            fields = parse_tensor_name(original)
            if fields is None:
                scan.errors.append((source_file, f"file name does not follow {kit.TENSOR_NAME_GRAMMAR}"))
                continue
            entry = TensorEntry(
                source_file=source_file, path=os.path.join(directory, name), rank=rank, net_name=net_name,
                graph_id=graph_id, iteration=iteration, size=sizes[name], **fields,
            )
            if name in mapping:
                entry.note = f"name from mapping.csv ({name})"
            entries.append(entry)
        if statistics is not None:
            try:
                kit.claim_statistics(statistics, entries)
                scan.statistics_files.append(statistics)
            except (OSError, DumpdbError) as exc:
                scan.errors.append((csv_file, reason(exc, it_dir / "statistic.csv")))
        return entries

    # -- payloads ----------------------------------------------------------------
    def load(self, entry: TensorEntry) -> LoadedTensor:
        """Read the entry's ``.npy`` (see :mod:`dumpdb.npy` for the quirks handled)."""
        t = read_npy_declared(entry.payload_path(), entry.source_file, entry.dtype_declared)
        return LoadedTensor(t.array, t.note)
