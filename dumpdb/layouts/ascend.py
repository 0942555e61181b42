"""CANN / Ascend operator dumps: MindSpore asynchronous dumps, the TensorFlow
adapter and TorchAir (layouts ``mindspore-r1.2-async-pb``, ``ascend-async-pb``,
``ascend-async-npy``, ``cann-tf-adapter``, ``torchair-ge``).

Sources: seeds 000, 001, 003, 004 and reference formats.md section 3::

    seed 000 (MindSpore r1.2 asynchronous dump, layout mindspore-r1.2-async-pb)
    {path}/.metadata/data_dump.json
    {path}/{device_id}/{net_name}_graph_{graph_id}/{graph_id}/{iteration}/
        {op_type}.{op_name}.{task_id}.{timestamp}                  (protobuf container)
    {path}/{device_id}/graphs/ms_output_trace_code_graph_{graph_id}.{pb,ir}
    {path}/{device_id}/execution_order/ms_execution_order_graph_{graph_id}.csv

    seed 001 (MindSpore asynchronous dump; ascend-async-pb for file_format bin,
    ascend-async-npy for file_format npy)
    {path}/{time}/{device_id}/{model_name}/{model_id}/{iteration_id}/
    {path}/{step_id}/{time}/{device_id}/{model_name}/{model_id}/{iteration_id}/   (MS_ACL_DUMP_CFG_PATH)
    {path}/{step_id}/{time}/{device_id}/[{iteration_id}/]      (ACL dump, jit_level O0: no model
                                                                dirs; static-shape ops in {device_id})
        {op_type}.{op_name}.{task_id}.{stream_id}.{timestamp}                     (bin)
        {op_type}.{op_name}.{task_id}.{stream_id}.{timestamp}.{input_output_index}.{slot}.{format}.npy
        Opdebug.Node_OpDebug.{task_id}.{stream_id}.{timestamp}                    (bin overflow)
        Opdebug.Node_OpDebug.{task_id}.{stream_id}.{timestamp}.output.0.json      (npy overflow)
        statistic.csv, mapping.csv

    seed 003 (CANN TensorFlow adapter, cann-tf-adapter)
    {dump_path}/{time}/{deviceid}/{model_name}/{model_id}/{data_index}/
        {op_type}.{op_name}.{taskid}.{stream_id}.{timestamp}, mapping.csv

    seed 004 (TorchAir graph mode, torchair-ge)
    {dump_path}/worldsize{N}_global_rank{R}/{time}/{device_id}/{model_name}/{model_id}/{data_index}/
        dump_data "tensor": containers as above; dump_data "stats": csv statistics

``{time}`` is YYYYMMDDHHMMSS (seeds 003, 004); seed 004's own example
``2024112145738`` has 13 digits, so a time directory is 10 to 14 digits
starting with 19 or 20. Names had ``.``, ``/``, ``\\`` and spaces replaced by
``_``; over-long names are 32 random digits listed in ``mapping.csv``
(``random_name,original_name``). One container holds all inputs and outputs of
an op: each is a tensor keyed ``{source_file}#{io}.{slot}`` (see
:mod:`dumpdb.layouts.cann_pb`). Mapping: ``{step_id}`` -> step, ``{device_id}``
-> device_id, ``{model_name}``/``{model_id}`` -> model_name/model_id,
``{iteration_id}``/``{data_index}``/``{iteration}`` -> iteration; ``rank`` is
set only by TorchAir's ``global_rank{R}``.

Telling the layouts apart (names only; the first directories found decide):

* ``{net}_graph_{g}/{g}/`` under a device directory: mindspore-r1.2-async-pb;
* a time directory under ``worldsize{N}_global_rank{R}``: torchair-ge;
* otherwise, in the tensor directories under a time directory: ``.npy`` files,
  ``statistic.csv`` or overflow ``.json`` and no container: ascend-async-npy;
  containers with a ``{step_id}`` directory above ``{time}``, or with no model
  directories (O0), or with model directories not named ``ge_default_*``:
  ascend-async-pb; containers whose model directories are all GE's
  ``ge_default_{time}_{n}`` graphs (the names seeds 003 and 004 show):
  cann-tf-adapter. The last two have the same directory shape; ``--layout``
  overrides the guess and either reader reads both.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

from dumpdb.dumpio import read_dump_text, reason
from dumpdb.errors import DumpdbError, DumpFileError, LayoutError
from dumpdb.layouts import DumpScan, Layout, LoadedTensor, TensorEntry, cann_pb, register
from dumpdb.layouts import mindspore_kit as kit
from dumpdb.layouts.base import display_name, file_sizes, known_match, load_json, read_metadata_dir
from dumpdb.layouts.mindspore_kit import parse_tensor_name, read_mapping_csv, read_stats_csv
from dumpdb.npy import read_npy_declared

TIME_RE = re.compile(r"^(?:19|20)\d{8,12}$")
DIGITS_RE = re.compile(r"^\d+$")
WORLD_RE = re.compile(r"^worldsize(\d+)_global_rank(\d+)$")
NET_GRAPH_RE = re.compile(r"^(?P<net>.+)_graph_(?P<graph>\d+)$")
GE_MODEL_PREFIX = "ge_default_"

_BIN5_STRICT = re.compile(
    r"^(?P<op_type>[^.]+)\.(?P<op_name>[^.]+)\.(?P<task_id>\d+)\.(?P<stream_id>\d+)\.(?P<timestamp>\d+)$")
_BIN5_LOOSE = re.compile(
    r"^(?P<op_type>[^.]+)\.(?P<op_name>.+)\.(?P<task_id>\d+)\.(?P<stream_id>\d+)\.(?P<timestamp>\d+)$")
_BIN4_STRICT = re.compile(r"^(?P<op_type>[^.]+)\.(?P<op_name>[^.]+)\.(?P<task_id>\d+)\.(?P<timestamp>\d+)$")
_BIN4_LOOSE = re.compile(r"^(?P<op_type>[^.]+)\.(?P<op_name>.+)\.(?P<task_id>\d+)\.(?P<timestamp>\d+)$")
# seed 000: no stream_id; seeds 001/003/004: with stream_id. Each tries its own first.
_NAMES_R12 = (_BIN4_STRICT, _BIN5_STRICT, _BIN4_LOOSE)
_NAMES_GE = (_BIN5_STRICT, _BIN4_STRICT, _BIN5_LOOSE)
_NAME_R12 = "{op_type}.{op_name}.{task_id}.{timestamp}"
_NAME_GE = "{op_type}.{op_name}.{task_id}.{stream_id}.{timestamp}"
_OPDEBUG_JSON_RE = re.compile(
    r"^Opdebug\.Node_OpDebug\.(?P<task_id>\d+)\.(?P<stream_id>\d+)\.(?P<timestamp>\d+)\.output\.(?P<slot>\d+)\.json$")
OPDEBUG_TYPE, OPDEBUG_NAME = "Opdebug", "Node_OpDebug"
MAX_SEARCH_DEPTH = 4
DETECT_DIR_LIMIT = 64  # tensor directories a detect() looks into at most
MAX_METADATA_BYTES = 1 << 20


# -- directory helpers ------------------------------------------------------------------
def _subdirs(d: Path) -> list[Path]:
    try:
        with os.scandir(d) as it:
            return sorted(Path(e.path) for e in it if not e.name.startswith(".") and e.is_dir())
    except OSError:
        return []


def _digit_dirs(d: Path) -> list[Path]:
    return [p for p in _subdirs(d) if DIGITS_RE.match(p.name)]


def _files(d: Path) -> dict[str, int]:
    """``{name: size}`` of the regular files directly in ``d`` (hidden ones skipped)."""
    return {name: size for name, size in file_sizes(d).items() if not name.startswith(".")}


def _bfs(root: Path, is_anchor, max_depth: int = MAX_SEARCH_DEPTH, first_only: bool = False) -> list[Path]:
    """Directories at or below ``root`` (``max_depth`` levels) for which ``is_anchor`` holds;
    the search does not descend into an anchor."""
    found: list[Path] = []
    frontier = [root]
    for _ in range(max_depth + 1):
        nxt = []
        for d in frontier:
            if is_anchor(d):
                found.append(d)
                if first_only:
                    return found
                continue
            nxt.extend(_subdirs(d))
        frontier = nxt
        if not frontier:
            break
    return sorted(found)


def _is_time_dir(d: Path) -> bool:
    return bool(TIME_RE.match(d.name)) and bool(_digit_dirs(d))


def _is_net_graph_dir(d: Path) -> bool:
    """``{device_id}/{net_name}_graph_{graph_id}/`` holding ``{graph_id}/`` (seed 000). Not under a
    ``{time}`` directory: there ``{model_name}/{model_id}`` may look the same (``kernel_graph_1/1``)."""
    m = NET_GRAPH_RE.match(d.name)
    return (m is not None and DIGITS_RE.match(d.parent.name or "") is not None
            and not TIME_RE.match(d.parent.parent.name or "") and (d / m["graph"]).is_dir())


def _time_context(root: Path, time_dir: Path) -> dict:
    """Fields the directories above a ``{time}`` directory give: rank (TorchAir)
    or step (``{step_id}``, only when that directory is inside the ingested one)."""
    parent = time_dir.parent
    m = WORLD_RE.match(parent.name)
    if m:  # specific enough to read even above the ingested directory
        return {"rank": int(m.group(2)), "world_size": int(m.group(1))}
    if parent != root and root in parent.parents and DIGITS_RE.match(parent.name):
        return {"step": int(parent.name)}
    return {}


def _time_tree(time_dir: Path) -> Iterator[tuple[Path, dict]]:
    """Tensor directories under ``{time}``, with the fields their path gives.

    ``{device_id}/{model_name}/{model_id}/{iteration}/``; ``{device_id}/{iteration}/``
    and ``{device_id}/`` itself (jit_level O0: no model directories).
    """
    for dev in _digit_dirs(time_dir):
        base = {"device_id": int(dev.name)}
        yield dev, {**base, "o0": True}
        for child in _subdirs(dev):
            if DIGITS_RE.match(child.name):
                yield child, {**base, "iteration": int(child.name), "o0": True}
                continue
            for mid in _digit_dirs(child):
                for it in _digit_dirs(mid):
                    yield it, {**base, "model_name": child.name, "model_id": int(mid.name),
                               "iteration": int(it.name)}


def _r12_tree(ng_dir: Path) -> Iterator[tuple[Path, dict]]:
    """Tensor directories of one ``{net_name}_graph_{graph_id}`` directory (seed 000)."""
    m = known_match(NET_GRAPH_RE, ng_dir.name)
    base = {"device_id": int(ng_dir.parent.name), "net_name": m["net"]}
    for gdir in _digit_dirs(ng_dir):
        for it in _digit_dirs(gdir):
            yield it, {**base, "graph_id": int(gdir.name), "iteration": int(it.name)}


def _kind(name: str) -> str | None:
    """What a file in a tensor directory is, by its name only."""
    if name == "mapping.csv":
        return None
    if name.endswith(".npy"):
        return "npy"
    if name.endswith(".json"):
        return "npy" if _OPDEBUG_JSON_RE.match(name) else None
    if name == "statistic.csv":
        return "npy"
    if name.endswith(".csv"):
        return "csv"
    last = name.rsplit(".", 1)[-1]
    return "bin" if last.isdigit() else None  # containers end in {timestamp}, or are 32 random digits


def _dir_kinds(d: Path) -> set[str]:
    kinds: set[str] = set()
    try:
        with os.scandir(d) as it:
            for e in it:
                k = _kind(e.name)
                if k and e.is_file():
                    kinds.add(k)
                    if "bin" in kinds and "npy" in kinds:
                        break
    except OSError:
        pass
    return kinds


def _probe(root: Path) -> tuple[str, dict, set[str]] | None:
    """What the first tensor directory with dump files looks like: ``(family, context,
    kinds)`` with family 'r12' or 'time'; None when no such directory is found."""
    for ng in _bfs(root, _is_net_graph_dir, first_only=True):
        for n, (d, ctx) in enumerate(_r12_tree(ng)):
            if n >= DETECT_DIR_LIMIT:
                break
            kinds = _dir_kinds(d)
            if "bin" in kinds:
                return "r12", ctx, kinds
    looked = 0
    for time_dir in _bfs(root, _is_time_dir):
        up = _time_context(root, time_dir)
        for d, ctx in _time_tree(time_dir):
            looked += 1
            if looked > DETECT_DIR_LIMIT:
                return None
            kinds = _dir_kinds(d)
            if kinds:
                dev = time_dir / str(ctx["device_id"])
                models = {p.name for p in _subdirs(dev) if not DIGITS_RE.match(p.name)}
                return "time", {**up, **ctx, "models": models}, kinds
    return None


def _classify(root: Path) -> str | None:
    """The layout name of the dump at ``root`` (see the module docstring), or None."""
    probe = _probe(root)
    if probe is None:
        return None
    family, ctx, kinds = probe
    if family == "r12":
        return "mindspore-r1.2-async-pb"
    if "rank" in ctx:
        return "torchair-ge"
    if "bin" not in kinds:
        return "ascend-async-npy"  # .npy, statistic.csv, overflow .json or other statistics csv
    if "step" in ctx or ctx.get("o0"):
        return "ascend-async-pb"
    models = ctx.get("models") or set()
    if models and all(m.startswith(GE_MODEL_PREFIX) for m in models):
        return "cann-tf-adapter"
    return "ascend-async-pb"


# -- the readers ------------------------------------------------------------------------
class _CannLayout(Layout):
    """Shared scanning and loading of the CANN directory layouts."""

    framework: str | None = None
    names = _NAMES_GE
    name_pattern = _NAME_GE
    # One probe tells the five CANN layouts apart; detection calls it once per directory.
    classify = staticmethod(lambda root: _classify(Path(root)))

    def __init__(self) -> None:
        self._headers = cann_pb.HeaderCache()

    def detect(self, root: Path) -> bool:
        return _classify(Path(root)) == self.name

    # -- scan ------------------------------------------------------------------------
    def _tensor_dirs(self, root: Path) -> Iterator[tuple[Path, dict]]:
        for time_dir in _bfs(root, _is_time_dir):
            up = _time_context(root, time_dir)
            for d, ctx in _time_tree(time_dir):
                yield d, {**up, **ctx}

    def scan(self, root: Path) -> DumpScan:
        root = Path(root)
        scan = DumpScan(layout=self.name, root=root, framework=self.framework, device_target="Ascend")
        found = False
        world_sizes: set[int] = set()
        for d, ctx in self._tensor_dirs(root):
            found = True
            if "world_size" in ctx:
                world_sizes.add(ctx["world_size"])
            self._scan_dir(root, d, ctx, scan)
        if not found:
            raise LayoutError(f"{root}: no {self.name} dump found ({self.description})")
        if world_sizes:
            scan.metadata["world_size"] = sorted(world_sizes)[0] if len(world_sizes) == 1 else sorted(world_sizes)
        self._read_root_metadata(root, scan)
        scan.entries.sort(key=_entry_order)
        scan.overflows.sort(key=lambda r: (r["source_file"], r["slot"] or 0))
        return scan

    def _read_root_metadata(self, root: Path, scan: DumpScan) -> None:
        """JSON files at the top of the dump (ACL dump configs, seed 001) into ``metadata``."""
        try:
            names = sorted(n for n in os.listdir(root) if n.endswith(".json"))
        except OSError:
            return
        for name in names:
            path = root / name
            rel = display_name(name)
            try:
                if path.is_dir() or path.stat().st_size > MAX_METADATA_BYTES:
                    continue
                text = read_dump_text(path, rel, MAX_METADATA_BYTES)  # regular file inside the dump
            except OSError as exc:
                scan.errors.append((rel, f"cannot read metadata: {exc.strerror or exc}"))
                continue
            except DumpdbError as exc:
                scan.errors.append((rel, f"cannot read metadata: {reason(exc, rel)}"))
                continue
            try:
                scan.metadata[rel] = load_json(text, rel)
            except DumpdbError as exc:
                scan.errors.append((rel, reason(exc, rel)))

    def _parse_bin_name(self, name: str) -> dict | None:
        for pattern in self.names:
            m = pattern.match(name)
            if m:
                d = m.groupdict()
                return {
                    "op_type": d["op_type"], "op_name": d["op_name"], "task_id": int(d["task_id"]),
                    "stream_id": int(d["stream_id"]) if d.get("stream_id") is not None else None,
                    "timestamp": int(d["timestamp"]),
                }
        return None

    def _scan_dir(self, root: Path, d: Path, ctx: dict, scan: DumpScan) -> None:
        rel_dir = os.path.relpath(d, root)
        try:
            sizes = _files(d)
        except OSError as exc:
            scan.errors.append((display_name(rel_dir), f"cannot list directory: {exc.strerror or exc}"))
            return
        if not sizes:
            return
        fields = {k: ctx.get(k) for k in ("rank", "device_id", "step", "model_name", "model_id", "iteration",
                                          "net_name", "graph_id")}

        def src(name: str) -> str:
            return display_name(os.path.join(rel_dir, name))

        mapping: dict[str, str] = {}
        if "mapping.csv" in sizes:
            try:
                mapping = read_mapping_csv(d / "mapping.csv")
            except (OSError, DumpdbError) as exc:
                scan.errors.append((src("mapping.csv"), reason(exc, d / "mapping.csv")))
        stats = kit.StatisticJoin()
        npy_entries: list[TensorEntry] = []
        for name in sorted(sizes):
            original = mapping.get(name, name)
            kind = _kind(original) or _kind(name)
            if kind is None:
                continue
            source_file = src(name)
            path = d / name
            mapped_note = f"name from mapping.csv ({name})" if name in mapping else None
            if kind == "bin":
                if DIGITS_RE.match(name) and name not in mapping:
                    scan.errors.append((source_file, "file name is not listed in mapping.csv"))
                    continue
                self._scan_bin(path, source_file, original, sizes[name], fields, mapped_note, scan)
            elif original.endswith(".json"):
                self._scan_overflow_json(path, source_file, original, fields, scan)
            elif original.endswith(".npy"):
                parsed = parse_tensor_name(original)
                if parsed is None:
                    scan.errors.append((source_file, f"file name does not follow {kit.TENSOR_NAME_GRAMMAR}"))
                    continue
                parsed["op_name"] = display_name(parsed["op_name"])
                npy_entries.append(TensorEntry(source_file=source_file, path=str(path), size=sizes[name],
                                               note=mapped_note, **fields, **parsed))
            else:  # statistics csv
                refused: list[str] = []
                try:
                    rows = read_stats_csv(path, refused)
                except (OSError, DumpdbError) as exc:
                    scan.errors.append((source_file, reason(exc, path)))
                    continue
                scan.errors.extend((source_file, message) for message in refused)
                from_name = self._parse_bin_name(original[:-4]) if original != "statistic.csv" else None
                for row in rows:
                    for k, v in (from_name or {}).items():
                        if row.get(k) is None:
                            row[k] = v
                stats.add(source_file, rows, per_file=bool(from_name))
        # statistic.csv rows describe the .npy files of the directory; the rest are statistics only.
        for entry in npy_entries:
            stats.attach(entry)
            scan.entries.append(entry)
        scan.entries.extend(stats.statistics_only(**fields))
        scan.errors.extend(stats.errors)

    def _overflow_row(self, fields: dict, parsed: dict, slot: int, source_file: str, content: str) -> dict:
        return {
            "rank": fields.get("rank"), "device_id": fields.get("device_id"), "iteration": fields.get("iteration"),
            "op_type": parsed["op_type"], "op_name": parsed["op_name"], "task_id": parsed["task_id"],
            "stream_id": parsed["stream_id"], "timestamp": parsed["timestamp"], "slot": slot,
            "source_file": source_file, "content": content,
        }

    def _scan_bin(self, path: Path, source_file: str, original: str, size: int, fields: dict,
                  mapped_note: str | None, scan: DumpScan) -> None:
        parsed = self._parse_bin_name(original)
        if parsed is None:
            scan.errors.append((source_file, f"file name does not follow {self.name_pattern}"))
            return
        parsed["op_name"] = display_name(parsed["op_name"])
        if parsed["op_type"] == OPDEBUG_TYPE:
            try:
                records = cann_pb.read_overflow(path, source_file)
            except DumpFileError as exc:
                scan.errors.append((source_file, str(exc)))
                return
            for slot, content in records:
                scan.overflows.append(self._overflow_row(fields, parsed, slot, source_file, content))
            return
        try:
            header = cann_pb.read_header(path, source_file)
        except DumpFileError as exc:
            scan.errors.append((source_file, str(exc)))
            return
        if not header.tensors:
            scan.errors.append((source_file, f"header lists no inputs or outputs ({size} bytes); nothing to store"))
            return
        self._headers.put(str(path), header)
        notes = [n for n in (
            mapped_note,
            f"{header.trailing} bytes after the described data were not read" if header.trailing else None,
        ) if n]
        for t in header.tensors:
            note = "; ".join(notes + ([f"original op {display_name(t.original_op)}"] if t.original_op else []))
            scan.entries.append(TensorEntry(
                source_file=source_file, path=str(path), tensor_key=f"{source_file}#{t.io}.{t.slot}",
                **fields, **parsed, io=t.io, slot=t.slot, format=t.format, dtype_declared=t.dtype_name,
                shape_declared=t.shape, original_shape=t.original_shape, size=t.size, note=note or None,
            ))

    def _scan_overflow_json(self, path: Path, source_file: str, original: str, fields: dict,
                            scan: DumpScan) -> None:
        try:  # regular file inside the dump, bounded; deep nesting is one error
            text = read_dump_text(path, source_file, MAX_METADATA_BYTES)
            load_json(text, source_file)
        except DumpdbError as exc:
            scan.errors.append((source_file, reason(exc, source_file)))
            return
        m = _OPDEBUG_JSON_RE.match(original)
        if m is None:  # a .npy/.csv file that mapping.csv gives a .json name of no overflow record
            scan.errors.append((source_file, f"mapping.csv names it {display_name(original)!r}, which is not an "
                                             "Opdebug overflow record name (Opdebug.Node_OpDebug.*.output.N.json)"))
            return
        parsed = {"op_type": OPDEBUG_TYPE, "op_name": OPDEBUG_NAME, "task_id": int(m["task_id"]),
                  "stream_id": int(m["stream_id"]), "timestamp": int(m["timestamp"])}
        scan.overflows.append(self._overflow_row(fields, parsed, int(m["slot"]), source_file, text))

    # -- payloads ----------------------------------------------------------------------
    def load(self, entry: TensorEntry) -> LoadedTensor:
        """A container slot (``io``.``slot`` of the file), or an ``.npy`` file."""
        path = entry.payload_path()
        if path.endswith(".npy"):
            t = read_npy_declared(path, entry.source_file, entry.dtype_declared)
            return LoadedTensor(t.array, t.note)
        if entry.io is None or entry.slot is None:
            raise DumpFileError(f"{entry.source_file}: no io/slot to read from the container")
        array, note = self._headers.load(path, entry.io, entry.slot, entry.source_file)
        return LoadedTensor(array, note)


def _entry_order(e: TensorEntry) -> tuple:
    return (
        e.rank if e.rank is not None else -1, e.device_id if e.device_id is not None else -1,
        e.step if e.step is not None else -1, e.model_name or "", e.model_id if e.model_id is not None else -1,
        e.graph_id if e.graph_id is not None else -1, e.iteration if e.iteration is not None else -1,
        e.timestamp or 0, e.source_file, e.io != "input", e.slot if e.slot is not None else -1,
    )


@register
class MindSporeR12AsyncPb(_CannLayout):
    name = "mindspore-r1.2-async-pb"
    description = ("MindSpore r1.2 asynchronous dump: {device_id}/{net}_graph_{g}/{g}/{iteration}/"
                   "{op_type}.{op_name}.{task_id}.{timestamp} (protobuf containers)")
    document = "seed 000 (Asynchronous Dump Data Object Directory); reference formats.md 3.2-3.4"
    priority = 60
    framework = "MindSpore"
    names = _NAMES_R12
    name_pattern = _NAME_R12

    def _tensor_dirs(self, root: Path) -> Iterator[tuple[Path, dict]]:
        for ng in _bfs(root, _is_net_graph_dir):
            yield from _r12_tree(ng)

    def scan(self, root: Path) -> DumpScan:
        root = Path(root)
        scan = DumpScan(layout=self.name, root=root, framework=self.framework, device_target="Ascend")
        by_device: dict[Path, list[tuple[Path, dict]]] = {}
        for d, ctx in self._tensor_dirs(root):
            by_device.setdefault(d.parent.parent.parent, []).append((d, ctx))  # {device_id}/
        if not by_device:
            raise LayoutError(f"{root}: no {self.name} dump found ({self.description})")
        metadata_dirs = set()
        for dev_dir, dirs in sorted(by_device.items()):
            first = len(scan.entries)
            for d, ctx in dirs:
                self._scan_dir(root, d, ctx, scan)
            # graphs/ and execution_order/ sit in the device directory, as in the sync layout.
            graphs = kit.read_graphs(root, dev_dir, scan, rank=None, device_id=int(dev_dir.name))
            kit.link_entries(scan.entries[first:], graphs)
            if dev_dir != root:
                metadata_dirs.add(dev_dir.parent)  # {path}/.metadata/
        for top in sorted(metadata_dirs):
            texts = read_metadata_dir(root, top / ".metadata", scan)
            if "data_dump.json" in texts and scan.dump_config is None:
                scan.dump_config = texts["data_dump.json"]
        scan.entries.sort(key=_entry_order)
        return scan


@register
class AscendAsyncPb(_CannLayout):
    name = "ascend-async-pb"
    description = ("MindSpore Ascend asynchronous dump, file_format bin: [{step_id}/]{time}/{device_id}/"
                   "[{model_name}/{model_id}/]{iteration_id}/ protobuf containers")
    document = "seed 001 (异步Dump数据对象目录, 异步Dump数据文件介绍); reference formats.md 3.1-3.4"
    priority = 70
    framework = "MindSpore"


@register
class AscendAsyncNpy(_CannLayout):
    name = "ascend-async-npy"
    description = ("MindSpore Ascend asynchronous dump, file_format npy: [{step_id}/]{time}/{device_id}/"
                   "[{model_name}/{model_id}/]{iteration_id}/*.npy, statistic.csv, Opdebug *.json")
    document = "seed 001 (异步Dump, file_format npy; 同步Dump数据文件介绍 for names and statistic.csv)"
    priority = 80
    framework = "MindSpore"


@register
class CannTfAdapter(_CannLayout):
    name = "cann-tf-adapter"
    description = ("CANN TensorFlow adapter dump: {time}/{deviceid}/{model_name}/{model_id}/{data_index}/ "
                   "protobuf containers (model_name ge_default_*)")
    document = "seed 003 (Dump Data Generation, Table 1 Path format of a dump file); reference formats.md 3"
    priority = 90
    framework = "TensorFlow"


@register
class TorchAirGe(_CannLayout):
    name = "torchair-ge"
    description = ("TorchAir graph-mode dump: worldsize{N}_global_rank{R}/{time}/{device_id}/{model_name}/"
                   "{model_id}/{data_index}/ protobuf containers or csv statistics")
    document = "seed 004 (非dump_config_path配置项说明, dump_data stats); reference formats.md 3"
    priority = 100
    framework = "PyTorch"
