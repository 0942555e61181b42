"""MindSpore r1.2 synchronous dump of raw ``.bin`` files (layout ``mindspore-r1.2-sync-bin``).

Source: seed 000 (MindSpore r1.2 "Using Dump in the Graph Mode", "Synchronous
Dump Data Object Directory" and "Introduction to Synchronous Dump Data File")::

    {path}/
        |-- {net_name}/
            |-- device_{device_id}/
                |-- iteration_{iteration}/
                    -- {op_name}_{input_output_index}_{shape}_{data_type}_{format}.bin
                |-- graphs/
                    ms_output_trace_code_graph_{graph_id}.pb
                    ms_output_trace_code_graph_{graph_id}.ir
                |-- execution_order/
                    ms_execution_order_graph_{graph_id}.csv
        |-- .metadata/
            data_dump.json

"When data dump is performed on the CPU, there is no directory level of
``device_id`` [...] and there are no ``graphs``, ``execution_order`` and
``.metadata`` directories": ``{path}/{net_name}/iteration_{iteration}/*.bin``.

File names, as the seed's worked example spells them::

    Default--network-WithLossCell--_backbone-AlexNet--conv3-Conv2d--Conv2D-op107_output_0_shape_32_12_13_13_16_Float16_NC1HWC0.bin

* ``operator_name``: the full scope name "replace ``/`` with ``--``". The
  catalog keeps ``op_name`` exactly as in the file; ``scope_name`` is set only
  when the name equals a scope of ``execution_order/`` or ``graphs/*.ir`` after
  the same replacement (never by reversing ``--`` alone: a scope segment may
  itself contain ``--``). A match also gives ``op_type`` (from the IR node) and
  ``graph_id`` (when the scope is in exactly one graph); otherwise they stay NULL
  (the file name has neither).
* ``input_output_index``: "``output_0`` means that the file is the data of the
  first output Tensor" -> ``io`` and ``slot``.
* ``shape``: ``shape_`` followed by the dimensions joined by ``_``
  (``shape_32_12_13_13_16``). MindSpore r1.2 writes ``shape_0`` for a scalar
  (``DumpMemToFile``: ``shape = shape + "_0"`` when the host shape is empty), so
  ``shape_0`` is read as a scalar when the file holds one element, as a
  zero-length 1-D tensor when it is empty.
* ``data_type``: the seed's example spells ``Float16``; MindSpore r1.2 itself
  writes ``TypeIdLabel`` names (``kNumberTypeFloat16``) when ``trans_flag`` is
  true. Both are accepted (``dtype_declared`` keeps the spelling).
* ``format``: the rest (``NC1HWC0``, ``DefaultFormat``, ``FRACTAL_NZ``...).
* Payload: raw little-endian bytes, "use ``numpy.fromfile`` to read the data and
  restore the ``data_type`` and ``shape``"; the byte count must equal
  prod(shape) x itemsize or the file is an error.

``device_{device_id}`` gives ``device_id`` (``rank`` stays NULL: r1.2 has no
rank), ``iteration_{n}`` gives ``iteration``; ``device_target`` is ``CPU`` for the
variant without ``device_{id}`` (the seed's rule), NULL otherwise.
``.metadata/data_dump.json`` is the dump config.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import numpy as np

from dumpdb.dtypes import from_dump_name
from dumpdb.dumpio import read_dump_bytes
from dumpdb.errors import DumpFileError, LayoutError
from dumpdb.layouts import mindspore_kit as kit
from dumpdb.layouts import register
from dumpdb.layouts.base import (
    DumpScan,
    Layout,
    LoadedTensor,
    TensorEntry,
    display_name,
    find_dirs,
    known_match,
    read_metadata_dir,
)

ITERATION_DIR_RE = re.compile(r"^iteration_(\d+)$")
DEVICE_DIR_RE = re.compile(r"^device_(\d+)$")
BIN_NAME_RE = re.compile(
    r"^(?P<op_name>.+)_(?P<io>input|output)_(?P<slot>\d+)_shape_(?P<shape>\d+(?:_\d+)*)"
    r"_(?P<dtype>[A-Za-z][A-Za-z0-9]*)_(?P<format>[A-Za-z0-9][A-Za-z0-9_]*)\.bin$"
)
NAME_GRAMMAR = "{op_name}_{input|output}_{index}_shape_{d0}_{d1}..._{data_type}_{format}.bin"
MAX_SEARCH_DEPTH = 4


def dump_dtype(name: str | None) -> np.dtype | None:
    """Numpy dtype of a r1.2 ``data_type`` (``Float16`` or ``kNumberTypeFloat16``); None if unknown."""
    if not name:
        return None
    return from_dump_name(name.removeprefix("kNumberType"))


def parse_bin_name(name: str) -> dict | None:
    """Fields of a r1.2 ``.bin`` file name, or None if it does not follow the grammar.

    ``shape_declared`` is the shape as written (``shape_0`` gives ``(0,)``; the
    scan decides scalar vs empty from the file size).
    """
    m = BIN_NAME_RE.match(name)
    if not m:
        return None
    return {
        "op_name": m["op_name"],
        "io": m["io"],
        "slot": int(m["slot"]),
        "shape_declared": tuple(int(d) for d in m["shape"].split("_")),
        "dtype_declared": m["dtype"],
        "format": m["format"],
    }


def find_iteration_dirs(start: Path, max_depth: int = MAX_SEARCH_DEPTH) -> list[Path]:
    """``iteration_{n}`` directories at or below ``start`` (``max_depth`` levels; hidden dirs skipped)."""
    return find_dirs(start, ITERATION_DIR_RE.match, max_depth)


@register
class MindSporeR12SyncBin(Layout):
    name = "mindspore-r1.2-sync-bin"
    description = ("MindSpore r1.2 synchronous dump: {net_name}/[device_{id}/]iteration_{n}/"
                   "{op_name}_{output_0}_shape_{dims}_{data_type}_{format}.bin")
    document = "seed 000 (MindSpore r1.2 Using Dump in the Graph Mode, Synchronous Dump)"
    priority = 50

    def detect(self, root: Path) -> bool:
        for it_dir in find_iteration_dirs(Path(root)):
            try:
                with os.scandir(it_dir) as listing:
                    for item in listing:
                        if item.name.endswith(".bin") and BIN_NAME_RE.match(item.name):
                            return True
            except OSError:
                continue
        return False

    def scan(self, root: Path) -> DumpScan:
        root = Path(root)
        it_dirs = find_iteration_dirs(root)
        if not it_dirs:
            raise LayoutError(f"{root}: no iteration_{{n}} directory found (looked {MAX_SEARCH_DEPTH} levels down)")
        scan = DumpScan(layout=self.name, root=root, framework="MindSpore")
        # Group by the directory holding iteration_{n}: device_{id} (GPU/Ascend) or {net_name} (CPU).
        holders: dict[Path, list[Path]] = {}
        for d in it_dirs:
            holders.setdefault(d.parent, []).append(d)
        meta_read: set[Path] = set()
        cpu_only = True
        for holder, dirs in sorted(holders.items()):
            dm = DEVICE_DIR_RE.match(holder.name)
            device_id = int(dm.group(1)) if dm else None
            net_dir = holder.parent if dm else holder
            cpu_only = cpu_only and dm is None
            path_dir = net_dir.parent
            if path_dir not in meta_read and _is_within(path_dir, root):
                meta_read.add(path_dir)
                texts = read_metadata_dir(root, path_dir / ".metadata", scan)
                if "data_dump.json" in texts and scan.dump_config is None:
                    scan.dump_config = texts["data_dump.json"]
            graphs = self._read_graphs(root, holder, scan, device_id) if dm else {}
            entries: list[TensorEntry] = []
            for it_dir in sorted(dirs, key=lambda p: int(known_match(ITERATION_DIR_RE, p.name).group(1))):
                entries.extend(self._scan_iteration(root, it_dir, net_dir.name, device_id, scan))
            self._link(entries, graphs)
            scan.entries.extend(entries)
        if cpu_only:
            scan.device_target = "CPU"
        scan.entries.sort(key=lambda e: (
            e.device_id if e.device_id is not None else -1, e.iteration if e.iteration is not None else -1,
            e.source_file))
        return scan

    # -- graphs ------------------------------------------------------------------
    @staticmethod
    def _read_graphs(root: Path, device_dir: Path, scan: DumpScan, device_id: int | None = None) -> dict[int, dict]:
        """{graph_id: {"scopes": set of scope names, "op_types": {scope: op_type}, "params": [...]}}
        from the device directory's graphs/ and execution_order/ (:func:`mindspore_kit.read_graphs`)."""
        read = kit.read_graphs(root, device_dir, scan, rank=None, device_id=device_id)
        return {g: {"scopes": set(read.ir_scopes.get(g, [])) | set(read.order.get(g, [])),
                    "op_types": read.op_types.get(g, {}), "params": read.params.get(g, [])}
                for g in read.graph_ids()}

    # -- tensor files ----------------------------------------------------------
    def _scan_iteration(self, root: Path, it_dir: Path, net_name: str, device_id: int | None,
                        scan: DumpScan) -> list[TensorEntry]:
        iteration = int(known_match(ITERATION_DIR_RE, it_dir.name).group(1))
        rel_dir = os.path.relpath(it_dir, root)
        entries: list[TensorEntry] = []
        try:
            with os.scandir(it_dir) as listing:
                items = sorted(
                    ((e.name, e) for e in listing if e.is_file(follow_symlinks=True)), key=lambda x: x[0])
        except OSError as exc:
            scan.errors.append((display_name(rel_dir), f"cannot list directory: {exc.strerror or exc}"))
            return entries
        for name, item in items:
            if not name.endswith(".bin"):
                continue
            source_file = display_name(os.path.normpath(os.path.join(rel_dir, name)))
            fields = parse_bin_name(name)
            if fields is None:
                scan.errors.append((source_file, f"file name does not follow {NAME_GRAMMAR}"))
                continue
            dtype = dump_dtype(fields["dtype_declared"])
            if dtype is None:
                scan.errors.append((source_file, f"unknown data type {fields['dtype_declared']!r} in the file name"))
                continue
            try:
                size = item.stat(follow_symlinks=True).st_size
            except OSError:
                size = None
            note = None
            if fields["shape_declared"] == (0,):
                # MindSpore r1.2 names a scalar "shape_0" (empty host shape).
                if size == dtype.itemsize:
                    fields["shape_declared"] = ()
                    note = "name says shape_0 and the file holds one element: a scalar"
            entries.append(TensorEntry(
                source_file=source_file, path=str(Path(it_dir) / name), net_name=display_name(net_name),
                iteration=iteration, device_id=device_id, size=size, note=note,
                **{**fields, "op_name": display_name(fields["op_name"])},
            ))
        return entries

    @staticmethod
    def _link(entries: list[TensorEntry], graphs: dict[int, dict]) -> None:
        """scope_name / op_type / graph_id by exact match of ``scope.replace('/', '--')``."""
        if not graphs:
            return
        flat: dict[str, set[str]] = {}
        where: dict[str, set[int]] = {}
        for g, info in graphs.items():
            for scope in info["scopes"]:
                flat.setdefault(scope.replace("/", "--"), set()).add(scope)
                where.setdefault(scope, set()).add(g)
        params: dict[str, set[int]] = {}
        for g, info in graphs.items():
            for p in info["params"]:
                params.setdefault(p, set()).add(g)
        for e in entries:
            scopes = flat.get(e.op_name or "")
            if scopes and len(scopes) == 1:
                scope = next(iter(scopes))
                e.scope_name = scope
                gs = where[scope]
                if len(gs) == 1:
                    e.graph_id = next(iter(gs))
                    e.op_type = graphs[e.graph_id]["op_types"].get(scope)
                else:
                    types = {graphs[g]["op_types"].get(scope) for g in gs} - {None}
                    e.op_type = types.pop() if len(types) == 1 else None
            elif e.op_name in params:
                # Parameter files are named by the parameter name (e.g. conv1.weight).
                e.scope_name = e.op_name
                if len(params[e.op_name]) == 1:
                    e.graph_id = next(iter(params[e.op_name]))

    # -- payloads ----------------------------------------------------------------
    def load(self, entry: TensorEntry) -> LoadedTensor:
        """Raw bytes with the dtype and shape of the file name (``numpy.fromfile``)."""
        dtype = dump_dtype(entry.dtype_declared)
        if dtype is None or entry.shape_declared is None:
            raise DumpFileError(f"{entry.source_file}: no data type/shape in the file name")
        raw = read_dump_bytes(entry.payload_path(), entry.source_file)  # regular file, at most its size
        dtype = dtype.newbyteorder("<")
        shape = tuple(entry.shape_declared)
        expected = math.prod(shape) * dtype.itemsize
        if len(raw) != expected:
            shown = "x".join(map(str, shape)) or "scalar"
            raise DumpFileError(
                f"{entry.source_file}: file is {len(raw)} bytes but its name says {entry.dtype_declared} "
                f"shape {shown} = {expected} bytes")
        return LoadedTensor(np.frombuffer(raw, dtype=dtype).reshape(shape))


def _is_within(path: Path, root: Path) -> bool:
    try:
        Path(path).resolve().relative_to(Path(root).resolve())
        return True
    except ValueError:
        return False
