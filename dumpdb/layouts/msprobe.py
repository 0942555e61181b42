"""msprobe ("PrecisionDebugger") dump of PyTorch or MindSpore (layout ``msprobe``).

Sources: reference formats.md section 1 (msprobe 26.2.0, ``msprobe/core/dump/service.py``
``create_dirs`` / ``_create_default_dirs``, ``pytorch_processor``) and the real dumps of
corpus ``msprobe-torch-cpu`` (statistics / md5 / tensor tasks, L0 / L1 / mix, 2-rank gloo)::

    {dump_path}/[pynative/]step{N}/
        rank{R}/ | proc{PID}/        rank{R} once torch.distributed is initialised, else proc{PID}
            dump.json                per-op records (below)
            stack.json               {"<id>": [[op names sharing the stack], [frame lines]]}
                                     (older msprobe: {"<op name>": [frame lines]})
            construct.json           {node: parent module node | null}  ({} for L1)
            dump_tensor_data/        task=tensor: {data_name} files (.pt PyTorch, .npy MindSpore)
    {dump_path}/../config.json       (the msprobe config, when kept beside the dump: corpus cases)

``dump.json`` = ``{"task", "level", "framework", "dump_data_dir", "data": {record key: record}}``.

Record keys (formats.md 1.3 "Key grammar"):

* API:    ``{Prefix}.{api}.{call_index}.{forward|backward}``  e.g. ``Functional.conv2d.0.forward``
  (the api may hold dots: ``Aten.add.Tensor.0.forward``);
* module: ``{Module|Cell}.{attr.path}.{Class}.{forward|backward}.{call_index}``
  e.g. ``Module.mlp.0.Linear.forward.0``;
* parameter gradients: ``{Module|Cell}.{attr.path}.{Class}.parameters_grad.{call_index}``.

Mapping to :class:`TensorEntry` (one entry per **tensor leaf**):

==================  ==========================================================================
``op_name``         the full record key (also ``scope_name``)
``op_type``         API: the key without call index and direction (``Functional.conv2d``,
                    ``Tensor.add_``, ``Aten.add.Tensor``); module: prefix + class
                    (``Module.Conv2d``, ``Cell.Dense``); unparsable key: None (+ note)
``direction``       ``forward`` / ``backward``; None for ``parameters_grad``
``call_index``      the key's call index
``io``              forward ``input_args`` + ``input_kwargs`` -> ``input``; ``output`` ->
                    ``output``; ``parameters`` -> ``parameter``; backward ``input`` (gradients
                    w.r.t. the outputs) -> ``input``; backward ``output`` (gradients w.r.t. the
                    inputs) -> ``output``; a ``parameters_grad`` record -> ``parameter_grad``
``slot``            top-level list index (``input_args``, ``output``, backward ``input`` /
                    ``output``); None for kwargs, parameters and parameter gradients
``arg_name``        keyword name (``input_kwargs``) or parameter name (``parameters``,
                    ``parameters_grad``); None for positional leaves
``slot_path``       the leaf's full path inside its section, list indices and dict keys joined
                    by ``.``: ``0``, ``0.1`` (nested tuple), ``alpha``, ``weight``, ``weight.0``
                    (``parameters_grad`` holds a list per parameter)
``iteration/step``  N of ``step{N}``
``rank``            R of ``rank{R}``; None under ``proc{PID}``
``dtype_declared``  the leaf's ``dtype`` as written (``torch.float32``)
``shape_declared``  the leaf's ``shape``
``stats``           ``Max/Min/Mean/Norm`` -> ``max/min/mean/l2norm`` (bool tensors: Max = any,
                    Min = all, stored 1.0 / 0.0); null values are left out
``checksum``        the leaf's ``md5`` field: 8 hex digits = CRC32 of the raw bytes
                    (summary_mode md5, ``checksum_algo`` ``crc32``); ``0x`` + 16 hex digits =
                    summary_mode xor (``xor64``); 32 hex digits (a real MD5) -> ``md5``
``path``            ``dump_tensor_data/{data_name}`` when the leaf has a ``data_name``
                    (``source_file`` = that file); else None: statistics only, ``source_file``
                    = the dump.json
``tensor_key``      ``{dump.json source_file}#{tensor name}``, the tensor name as msprobe forms
                    data names: ``{key}.input.{slot_path}``, ``{key}.output.{slot_path}``,
                    ``{key}.parameters.{name}``, ``{key}.{name}`` for a parameter gradient
                    (``.{i}`` appended for the i-th gradient of a parameter, i > 0)
==================  ==========================================================================

A tensor leaf is a dict whose ``type`` ends in ``Tensor`` / ``Parameter`` (``torch.Tensor``,
``mindspore.Tensor``) or that has both ``dtype`` and ``shape``. Non-tensor leaves (``int``,
``float``, ``bool``, ``str``, ``slice``, ... ``{"type", "value"}`` and ``null``) are not
tensors: no ``tensors`` row. Every record is also kept whole, in dump order, as a
``msprobe_records`` row (non-tensor leaves included: msprobe's compare CSV has rows for
them, :mod:`dumpdb.render.msprobe_rows`).

``stack.json`` -> ``call_stacks`` rows, ``construct.json`` -> ``module_tree`` rows, per
rank and step. ``scope_name`` = the record key; ``execution_order`` (position = place in
dump.json) and ``ops`` (source line from stack.json, module path from construct.json in
``node``) rows per rank and key (:meth:`MsprobeDump._order_and_ops`). ``debug.json``
(level debug) and ``kernel_config_*.json`` (level L2, whose output is a CANN dump) are not read by this layout.

Payloads: ``.npy`` through :func:`dumpdb.npy.read_npy`; ``.pt`` through ``torch.load``
(optional dependency ``dumpdb[torch]``, imported only when a ``.pt`` is read). Without
PyTorch a ``.pt`` tensor keeps its ``dump.json`` statistics, its payload is not stored
(``content_hash`` NULL, ``note`` says why) and the scan issues one
:class:`~dumpdb.errors.DumpdbWarning` for the whole dump (issue 16).
"""

from __future__ import annotations

import functools
import json
import os
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from dumpdb.dtypes import BFLOAT16, dtype_name, from_dump_name
from dumpdb.dumpio import MAX_TEXT_BYTES, read_dump_text, reason
from dumpdb.errors import DumpdbError, DumpdbWarning, DumpFileError, LayoutError, shown
from dumpdb.layouts import DumpScan, Layout, LoadedTensor, TensorEntry, register
from dumpdb.layouts.base import display_name, file_sizes, known_match, load_json
from dumpdb.npy import read_npy

STEP_DIR_RE = re.compile(r"^step(\d+)$")
RANK_DIR_RE = re.compile(r"^(?:rank(\d+)|proc(\d+))$")
MODE_DIRS = ("pynative",)  # msprobe MindSpore PyNative-graph mode: {dump_path}/pynative/step{N}
DATA_DIR = "dump_tensor_data"
MAX_JSON_BYTES = MAX_TEXT_BYTES  # dump.json of a long run is large; bounded all the same
MAX_SEARCH_DEPTH = 3  # directory levels searched below the given directory for step{N}/

_STATS = {"Max": "max", "Min": "min", "Mean": "mean", "Norm": "l2norm"}
_DIRECTIONS = ("forward", "backward")
_MODULE_PREFIXES = ("Module", "Cell")
_NO_DATA = (None, "", "-1")
_CRC32_RE = re.compile(r"^[0-9a-fA-F]{8}$")
_XOR_RE = re.compile(r"^0x[0-9a-fA-F]{16}$")
_MD5_RE = re.compile(r"^[0-9a-fA-F]{32}$")


# -- names -------------------------------------------------------------------
def parse_record_key(key: str) -> dict | None:
    """``op_type``, ``direction``, ``call_index`` and ``kind`` ('api' | 'module' |
    'parameters_grad') of a dump.json record key, or None if it follows no known form."""
    parts = key.split(".")
    if len(parts) < 3:
        return None
    prefix = parts[0]
    if prefix in _MODULE_PREFIXES and len(parts) >= 4 and parts[-1].isdigit():
        if parts[-2] == "parameters_grad":
            return {"op_type": f"{prefix}.{parts[-3]}", "direction": None,
                    "call_index": int(parts[-1]), "kind": "parameters_grad"}
        if parts[-2] in _DIRECTIONS:
            return {"op_type": f"{prefix}.{parts[-3]}", "direction": parts[-2],
                    "call_index": int(parts[-1]), "kind": "module"}
    if parts[-1] in _DIRECTIONS and parts[-2].isdigit():
        return {"op_type": ".".join(parts[:-2]), "direction": parts[-1],
                "call_index": int(parts[-2]), "kind": "api"}
    return None


def is_tensor_leaf(value: Any) -> bool:
    """True for a dump.json tensor leaf (see module docstring)."""
    if not isinstance(value, dict):
        return False
    kind = value.get("type")
    if isinstance(kind, str) and (kind.endswith("Tensor") or kind.endswith("Parameter")):
        return True
    return "dtype" in value and "shape" in value


# Bounds of dump.json text (issue 30, item 12): a record key is an API or module name with a
# call index (real ones: under 200 characters; 64 Ki leaves room for generated names, and a
# 10 kB hostile name must still reach `dumpdb serve` as text), a leaf's text fields (dtype, md5,
# data_name) are short; a record (every argument of one call, as JSON) is kept whole for msprobe's CSV.
MAX_KEY_CHARS = 65536
MAX_FIELD_CHARS = 4096
MAX_RECORD_CHARS = 16 << 20


def _oversized(key: str, record_text: str) -> str | None:
    """What is over its bound in one dump.json record (its key, its JSON text), or None."""
    if len(key) > MAX_KEY_CHARS:
        return f"record key of {len(key)} characters (over {MAX_KEY_CHARS})"
    if len(record_text) > MAX_RECORD_CHARS:
        return f"record of {len(record_text)} characters of JSON (over {MAX_RECORD_CHARS})"
    return None


def checksum_algo(value: str) -> str | None:
    """Algorithm of a leaf's ``md5`` field by its form (formats.md 1.3), None if unknown."""
    if _CRC32_RE.match(value):
        return "crc32"
    if _XOR_RE.match(value):
        return "xor64"
    if _MD5_RE.match(value):
        return "md5"
    return None


def _stat(value: Any) -> float | None:
    if value is None or isinstance(value, (dict, list)):
        return None
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):  # an integer beyond float range
        return None


def _walk(value: Any, path: tuple) -> Iterator[tuple[tuple, Any]]:
    """(path, leaf) of every tensor leaf under ``value``; dict keys and list indices in ``path``."""
    if is_tensor_leaf(value):
        yield path, value
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _walk(item, path + (i,))
    elif isinstance(value, dict) and "type" not in value:
        for k, item in value.items():
            yield from _walk(item, path + (str(k),))


def scalar_args(record: dict) -> dict[str, Any]:
    """The non-tensor arguments a forward dump.json record holds: ``input_args`` leaves by
    position (``input.4``; nested: ``input.1.0``) and ``input_kwargs`` by name
    (``input.dim``), each the leaf's ``value`` (``{"type": "float", "value": 1e-05}``: a
    LayerNorm epsilon; a softmax scale; ``torch.Size`` and slices as their value lists).
    Tensor leaves, ``None`` arguments and leaves without a ``value`` are left out.
    Source: msprobe 26.2 dump.json (reference formats.md 1.3, seed layouts)."""
    out: dict[str, Any] = {}

    def walk(value: Any, path: str) -> None:
        if is_tensor_leaf(value):
            return
        if isinstance(value, dict) and isinstance(value.get("type"), str):
            if "value" in value:
                out[path] = value["value"]
        elif isinstance(value, list):
            for i, item in enumerate(value):
                walk(item, f"{path}.{i}")
        elif isinstance(value, dict):
            for k, item in value.items():
                walk(item, f"{path}.{k}")

    for section in ("input_args", "input_kwargs"):
        value = record.get(section)
        if isinstance(value, (list, dict)):
            walk(value, "input")
    return out


def may_hold_scalar(text: str) -> bool:
    """Whether the JSON text of a dump.json record may hold a scalar argument: it holds the
    key ``"value"`` (every leaf :func:`scalar_args` keeps has one; the other way round the
    text may also hold it as a string, hence "may"). Written to ``msprobe_records.has_scalar``
    at ingest (schema 11), so that compare knows a record holds no scalar without its text;
    the catalog's SQL for rows without it (``dumpdb.compare.args``, migration 011) is the
    same substring test."""
    return '"value"' in text


def record_leaves(key: str, record: dict) -> Iterator[dict]:
    """Tensor leaves of one dump.json record with their catalog position.

    Yields dicts: ``leaf``, ``io``, ``slot``, ``arg_name``, ``slot_path``, ``name`` (the
    msprobe tensor name, see module docstring) and ``note`` (None or why the section is odd).
    """
    parsed = parse_record_key(key)
    if parsed is not None and parsed["kind"] == "parameters_grad":
        for param, value in record.items():
            for path, leaf in _walk(value, (str(param),)):
                tail = path[1:]  # msprobe lists the gradient(s) of each parameter
                name = f"{key}.{param}" + ("" if tail in ((), (0,)) else "." + ".".join(map(str, tail)))
                yield {"leaf": leaf, "io": "parameter_grad", "slot": None, "arg_name": str(param),
                       "slot_path": ".".join(str(p) for p in path), "name": name, "note": None}
        return
    backward = parsed is not None and parsed["direction"] == "backward"
    for section, value in record.items():
        note = None
        if section in ("input_args", "input") and isinstance(value, list):
            io, named, io_name = "input", False, "input"
        elif section == "output" and isinstance(value, list):
            io, named, io_name = "output", False, "output"
        elif section == "input_kwargs" and isinstance(value, dict) and not backward:
            io, named, io_name = "input", True, "input"
        elif section == "parameters" and isinstance(value, dict) and not backward:
            io, named, io_name = "parameter", True, "parameters"
        else:
            io, named, io_name = None, True, section
            note = f"section {section!r} of record {key} is not one msprobe documents"
        for path, leaf in _walk(value, ()):  # a list section: path starts with the index
            slot_path = ".".join(str(p) for p in path)
            yield {
                "leaf": leaf, "io": io,
                "slot": path[0] if path and isinstance(path[0], int) and not named else None,
                "arg_name": str(path[0]) if path and named else None,
                "slot_path": slot_path or None,
                "name": f"{key}.{io_name}" + (f".{slot_path}" if slot_path else ""),
                "note": note,
            }


def _declared_dtype(name: str | None) -> np.dtype | None:
    """Numpy dtype of a dump.json dtype (``torch.float32``, ``mindspore.float32``, ``Float32``)."""
    if not isinstance(name, str):
        return None
    return from_dump_name(name.rsplit(".", 1)[-1])


# -- directory search ------------------------------------------------------------
def _subdirs(d: Path) -> list[os.DirEntry]:
    try:
        with os.scandir(d) as it:
            return [e for e in it if e.is_dir(follow_symlinks=True)]
    except OSError:
        return []


def _is_rank_dir(d: Path) -> bool:
    # lexists, not is_file: a FIFO or dangling dump.json is reported by the scan, not skipped
    return bool(RANK_DIR_RE.match(d.name)) and os.path.lexists(d / "dump.json")


def _rank_dirs_of_step(step_dir: Path) -> list[Path]:
    return sorted((Path(e.path) for e in _subdirs(step_dir) if RANK_DIR_RE.match(e.name)
                   and os.path.lexists(os.path.join(e.path, "dump.json"))), key=_rank_sort_key)


def _rank_sort_key(p: Path) -> tuple:
    m = known_match(RANK_DIR_RE, p.name)
    return (0, int(m.group(1)), p.name) if m.group(1) is not None else (1, int(m.group(2)), p.name)


def _step_dirs(subdirs: list[os.DirEntry], first_only: bool = False) -> list[Path]:
    """The ``step{N}`` dirs among ``subdirs`` (and in a ``pynative`` mode dir among them)
    that hold a rank/proc dir with a dump.json."""
    out = []
    for e in subdirs:
        if STEP_DIR_RE.match(e.name):
            if _rank_dirs_of_step(Path(e.path)):
                out.append(Path(e.path))
        elif e.name in MODE_DIRS:
            out.extend(_step_dirs(_subdirs(Path(e.path)), first_only))
        if out and first_only:
            break
    return out


def find_rank_dirs(start: Path, max_depth: int = MAX_SEARCH_DEPTH, first_only: bool = False
                   ) -> list[tuple[Path, list[Path]]]:
    """``[(dump_path dir, [rank/proc dirs])]`` at or below ``start``.

    ``start`` may be a rank/proc dir (holding dump.json), a ``step{N}`` dir, the
    msprobe ``dump_path`` (holding ``step{N}``) or up to ``max_depth`` levels above it.
    Only directory names are listed, plus a stat of each candidate ``dump.json``.
    """
    if _is_rank_dir(start):
        return [(start.parent.parent if STEP_DIR_RE.match(start.parent.name) else start.parent, [start])]
    if STEP_DIR_RE.match(start.name):
        ranks = _rank_dirs_of_step(start)
        if ranks:
            return [(start.parent, ranks)]
    found: list[tuple[Path, list[Path]]] = []
    frontier = [start]
    for _ in range(max_depth + 1):
        nxt: list[Path] = []
        for d in frontier:
            subdirs = _subdirs(d)
            steps = _step_dirs(subdirs, first_only)
            if steps:
                if first_only:
                    return [(d, [])]
                ranks = [r for s in sorted(steps, key=_step_sort_key) for r in _rank_dirs_of_step(s)]
                found.append((d, ranks))
                continue
            nxt.extend(Path(e.path) for e in subdirs if not e.name.startswith("."))
        frontier = sorted(nxt)
    return found


def _step_sort_key(p: Path) -> tuple:
    return (p.parent.name in MODE_DIRS, int(known_match(STEP_DIR_RE, p.name).group(1)))


_FRAME_RE = re.compile(r"^File (?P<file>.*), line (?P<line>\d+), in (?P<func>[^,]*),\s*\n?\s*(?P<text>.*)$", re.S)
_LIBRARY_DIRS = ("site-packages", "dist-packages")


def user_frame(frames: list[str]) -> tuple[str, int, str] | None:
    """(file, line, source text) of the innermost stack.json frame in the user's own code:
    the first frame (msprobe lists the innermost first) whose file is not under
    site-/dist-packages, else the outermost frame. None if no frame parses."""
    parsed = []
    for frame in frames:
        m = _FRAME_RE.match(frame)
        if m:
            parsed.append((m["file"], int(m["line"]), m["text"].strip()))
    for p in parsed:
        if not any(d in p[0] for d in _LIBRARY_DIRS):
            return p
    return parsed[-1] if parsed else None


def module_path(key: str, parent_of) -> str | None:
    """``Module.a.A.forward.0/Module.a.b.B.forward.0/key``: the chain of construct.json
    parents of ``key``, outermost first; None when ``key`` has no parent."""
    chain = [key]
    node = parent_of(key)
    while node is not None and node not in chain and len(chain) < 256:
        chain.append(node)
        node = parent_of(node)
    return "/".join(reversed(chain)) if len(chain) > 1 else None


# -- the layout ----------------------------------------------------------------------
@register
class MsprobeDump(Layout):
    name = "msprobe"
    description = "msprobe (PrecisionDebugger) dump: step{N}/rank{R}|proc{PID}/dump.json [+ dump_tensor_data/]"
    document = "reference formats.md section 1 (msprobe 26.2.0); corpus msprobe-torch-cpu"
    priority = 30
    stats_label = "dump.json"
    _pt_not_stored = 0  # .pt payloads left out by the current scan (no PyTorch)

    def detect(self, root: Path) -> bool:
        return bool(find_rank_dirs(Path(root), first_only=True))

    def scan(self, root: Path) -> DumpScan:
        root = Path(root)
        found = find_rank_dirs(root)
        if not found:
            raise LayoutError(f"{root}: no step{{N}}/rank{{R}}|proc{{PID}}/dump.json found "
                              f"(looked {MAX_SEARCH_DEPTH} levels down)")
        if len(found) > 1:
            shown = ", ".join(os.path.relpath(d, root) for d, _ in found[:5])
            raise LayoutError(
                f"{root}: holds {len(found)} separate msprobe dumps ({shown}{', ...' if len(found) > 5 else ''}); "
                "ingest them one at a time")
        dump_path, rank_dirs = found[0]
        scan = DumpScan(layout=self.name, root=root)
        self._pt_not_stored = 0
        self._read_config(root, dump_path, scan)
        for rank_dir in rank_dirs:
            self._scan_rank_dir(root, rank_dir, scan)
        self._order_and_ops(scan)
        if self._pt_not_stored:
            # One line for the whole dump, not one per file: the statistics are kept (issue 16).
            warnings.warn(f"{root}: {self._pt_not_stored} .pt payloads not stored (statistics from dump.json "
                          "kept): reading .pt tensors needs PyTorch: pip install 'dumpdb[torch]', then ingest the "
                          "same dump again (same --run) to store them",
                          DumpdbWarning, stacklevel=2)
        return scan

    # -- execution order, source lines, module path ------------------------------
    @staticmethod
    def _order_and_ops(scan: DumpScan) -> None:
        """``execution_order`` and ``ops`` rows per rank, keyed by the record key (``scope_name``).

        Position = the order of records in dump.json, which msprobe appends as the ops run
        (formats.md 1.3); steps repeat the same keys (call indices restart every step), so
        a key keeps the position of its first step and keys new in a later step follow.
        ``ops.code_*`` come from the op's stack.json frames (the innermost frame outside
        site-/dist-packages, i.e. the user's line), ``ops.node`` is the op's module path
        from construct.json (outermost module first, joined by ``/``).
        """
        order: dict[Any, dict[str, int]] = {}
        for r in sorted(scan.msprobe_records, key=lambda r: (-1 if r["iteration"] is None else r["iteration"],
                                                              r["position"])):
            keys = order.setdefault(r["rank"], {})
            keys.setdefault(r["op_name"], len(keys))
        stacks: dict[tuple, list[str]] = {}
        for st in scan.call_stacks:
            stacks.setdefault((st["rank"], st["op_name"]), st["frames"])
        parents: dict[tuple, str | None] = {}
        for node in scan.module_tree:
            parents.setdefault((node["rank"], node["node"]), node["parent"])
        for rank, keys in order.items():
            for key, position in keys.items():
                scan.execution_order.append({"rank": rank, "device_id": None, "graph_id": None,
                                             "position": position, "scope_name": key})
                frames = stacks.get((rank, key))
                path = module_path(key, lambda n, r=rank: parents.get((r, n)))
                if frames is None and path is None:
                    continue
                code = user_frame(frames or [])
                parsed = parse_record_key(key)
                scan.ops.append({"rank": rank, "device_id": None, "graph_id": None, "scope_name": key,
                                 "op_type": parsed["op_type"] if parsed else None, "node": path,
                                 "code_file": code[0] if code else None, "code_line": code[1] if code else None,
                                 "code_text": code[2] if code else None, "code_trace": frames})

    # -- metadata --------------------------------------------------------------
    def _read_config(self, root: Path, dump_path: Path, scan: DumpScan) -> None:
        """The msprobe config.json kept in ``dump_path`` or beside it (corpus cases)."""
        for d in (dump_path, dump_path.parent):
            path = d / "config.json"
            if not path.is_file():
                continue
            rel = display_name(os.path.relpath(path, root))
            try:  # read on purpose from beside the dump: not confined to it, still regular + bounded
                text = read_dump_text(path, rel, MAX_JSON_BYTES, confined=(d != dump_path.parent))
                config = load_json(text, rel)
            except DumpdbError as exc:
                scan.errors.append((rel, f"cannot read msprobe config: {reason(exc, rel)}"))
                return
            if isinstance(config, dict) and ("task" in config or "level" in config or "dump_path" in config):
                scan.dump_config = text
                scan.metadata["config.json"] = config
                scan.metadata["config_file"] = rel
                return

    def _scan_rank_dir(self, root: Path, rank_dir: Path, scan: DumpScan) -> None:
        m = known_match(RANK_DIR_RE, rank_dir.name)
        rank = int(m.group(1)) if m.group(1) is not None else None
        sm = STEP_DIR_RE.match(rank_dir.parent.name)
        step = int(sm.group(1)) if sm else None
        rel_dir = os.path.relpath(rank_dir, root)
        rel = lambda name: display_name(os.path.normpath(os.path.join(rel_dir, name)))  # noqa: E731
        dump_json = rel("dump.json")
        try:  # regular file inside the dump, bounded; deep nesting is one error (dumpdb.dumpio)
            dump = load_json(read_dump_text(rank_dir / "dump.json", dump_json, MAX_JSON_BYTES), dump_json)
        except DumpdbError as exc:
            scan.errors.append((dump_json, reason(exc, dump_json)))
            return
        if not isinstance(dump, dict) or not isinstance(dump.get("data"), dict):
            scan.errors.append((dump_json, "not an msprobe dump.json (no \"data\" object)"))
            return
        if scan.framework is None and isinstance(dump.get("framework"), str):
            scan.framework = dump["framework"]
        for k in ("task", "level"):
            if k in dump:
                scan.metadata.setdefault(k, dump[k])
        data_dir = rank_dir / DATA_DIR
        sizes: dict[str, int] = {}
        if data_dir.is_dir():
            try:
                sizes = file_sizes(data_dir)
            except OSError as exc:
                scan.errors.append((rel(DATA_DIR), f"cannot list directory: {exc.strerror or exc}"))
        seen: set[str] = set()
        for position, (key, record) in enumerate(dump["data"].items()):
            text = json.dumps(record)
            too_big = _oversized(key, text)
            if too_big:  # issue 30, item 12: a 100 MB key or md5 took gigabytes and failed the ingest
                scan.errors.append((dump_json, f"{shown(display_name(key[:80]))}...: {too_big}; record skipped"))
                continue
            # kept whole and in dump order: msprobe's CSV rows (non-tensor arguments too)
            # and its execution order come from here
            scan.msprobe_records.append({"rank": rank, "iteration": step, "position": position,
                                         "op_name": key, "record": text, "has_scalar": may_hold_scalar(text)})
            if not isinstance(record, dict):
                continue
            parsed = parse_record_key(key)
            try:
                items = list(record_leaves(key, record))
            except RecursionError:  # nesting just under json's own limit
                scan.errors.append((dump_json, f"{shown(key[:80])}: record nested too deeply; skipped"))
                continue
            for item in items:
                long_field = next((f for f, v in item["leaf"].items() if isinstance(v, str)
                                   and len(v) > MAX_FIELD_CHARS), None) if isinstance(item["leaf"], dict) else None
                if long_field is not None:
                    scan.errors.append((dump_json, f"{shown(display_name(key[:200]))} "
                                        f"{shown(item['name'][:200])}: field "
                                        f"{long_field!r} of {len(item['leaf'][long_field])} characters (over "
                                        f"{MAX_FIELD_CHARS}); tensor skipped"))
                    continue
                entry = self._entry(item, key, parsed, rank=rank, step=step, dump_json=dump_json,
                                    rank_dir=rank_dir, rel=rel, sizes=sizes, scan=scan)
                if entry.key in seen:  # never two rows with one identity
                    n = 2
                    while f"{entry.key}~{n}" in seen:
                        n += 1
                    entry.tensor_key = f"{entry.key}~{n}"
                    entry.note = "; ".join(filter(None, (entry.note, "tensor name repeated in dump.json")))
                seen.add(entry.key)
                scan.entries.append(entry)
        self._read_stacks(rank_dir, rel("stack.json"), rank, step, scan)
        self._read_construct(rank_dir, rel("construct.json"), rank, step, scan)

    def _entry(self, item: dict, key: str, parsed: dict | None, *, rank, step, dump_json: str,
               rank_dir: Path, rel, sizes: dict[str, int], scan: DumpScan) -> TensorEntry:
        leaf = item["leaf"]
        notes = [n for n in (item["note"],) if n]
        if parsed is None:
            notes.append("record key does not follow the msprobe key grammar")
        stats = {field: v for src, field in _STATS.items() if (v := _stat(leaf.get(src))) is not None}
        checksum = algo = None
        md5 = leaf.get("md5")
        if isinstance(md5, str) and md5:
            checksum, algo = md5, checksum_algo(md5)
            if algo is None:
                notes.append("md5 field in an unknown form")
        shape = leaf.get("shape")
        shape_declared = None
        if isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
            shape_declared = tuple(shape)
        requires_grad = leaf.get("requires_grad")
        entry = TensorEntry(
            source_file=dump_json, path=None, tensor_key=f"{dump_json}#{item['name']}",
            rank=rank, iteration=step, step=step,
            op_type=parsed["op_type"] if parsed else None, op_name=key, scope_name=key,
            direction=parsed["direction"] if parsed else None,
            call_index=parsed["call_index"] if parsed else None,
            io=item["io"], slot=item["slot"], arg_name=item["arg_name"], slot_path=item["slot_path"],
            dtype_declared=leaf.get("dtype") if isinstance(leaf.get("dtype"), str) else None,
            shape_declared=shape_declared, stats=stats or None,
            checksum=checksum, checksum_algo=algo,
            requires_grad=requires_grad if isinstance(requires_grad, bool) else None,
        )
        data_name = leaf.get("data_name")
        if data_name not in _NO_DATA:
            data_name = str(data_name)
            file_rel = rel(os.path.join(DATA_DIR, data_name))
            if os.path.basename(data_name) != data_name or data_name in (".", ".."):
                scan.errors.append((dump_json, f"{shown(key)}: data_name {data_name!r} is not a file name; "
                                               "statistics from dump.json kept"))
            elif data_name not in sizes:
                scan.errors.append((file_rel, f"missing: dump.json ({shown(key)}) names it; statistics from "
                                              "dump.json kept"))
                notes.append(f"payload file {DATA_DIR}/{data_name} missing")
            elif data_name.lower().endswith(".pt") and not torch_available():
                entry.source_file = file_rel  # path stays None: statistics only, counted for one warning
                notes.append("payload not stored: reading .pt needs PyTorch (pip install 'dumpdb[torch]')")
                self._pt_not_stored += 1
            else:
                entry.source_file = file_rel
                entry.path = str(rank_dir / DATA_DIR / data_name)
                entry.size = sizes[data_name]
        entry.note = "; ".join(notes) or None
        return entry

    # -- stack.json / construct.json ----------------------------------------------------
    @staticmethod
    def _read_json(path: Path, rel: str, scan: DumpScan) -> Any:
        if not os.path.lexists(path):  # a FIFO or dangling link is reported, not skipped
            return None
        try:
            return load_json(read_dump_text(path, rel, MAX_JSON_BYTES), rel)
        except DumpdbError as exc:
            scan.errors.append((rel, reason(exc, rel)))
        return None

    def _read_stacks(self, rank_dir: Path, rel: str, rank, step, scan: DumpScan) -> None:
        stacks = self._read_json(rank_dir / "stack.json", rel, scan)
        if stacks is None:
            return
        if not isinstance(stacks, dict):
            scan.errors.append((rel, "not a JSON object"))
            return
        bad = 0
        for stack_id, value in stacks.items():
            if (isinstance(value, list) and len(value) == 2 and isinstance(value[0], list)
                    and isinstance(value[1], list)):
                names, frames = value  # msprobe 26: {"id": [[names], [frames]]}
            elif isinstance(value, list) and all(isinstance(x, str) for x in value):
                names, frames = [stack_id], value  # older msprobe: {"op name": [frames]}
            else:
                bad += 1
                continue
            frames = [str(x) for x in frames]
            for name in names:
                scan.call_stacks.append({"rank": rank, "iteration": step, "stack_id": str(stack_id),
                                         "op_name": str(name), "frames": frames})
        if bad:
            scan.errors.append((rel, f"{bad} entr{'y' if bad == 1 else 'ies'} in neither "
                                     "{id: [[op names], [frames]]} nor {op name: [frames]} form; skipped"))

    def _read_construct(self, rank_dir: Path, rel: str, rank, step, scan: DumpScan) -> None:
        tree = self._read_json(rank_dir / "construct.json", rel, scan)
        if tree is None:
            return
        if not isinstance(tree, dict):
            scan.errors.append((rel, "not a JSON object"))
            return
        bad = 0
        for node, parent in tree.items():
            if parent is not None and not isinstance(parent, str):
                bad += 1
                continue
            scan.module_tree.append({"rank": rank, "iteration": step, "node": node, "parent": parent})
        if bad:
            scan.errors.append((rel, f"{bad} node(s) whose parent is not a name or null; skipped"))

    # -- payloads --------------------------------------------------------------------
    def load(self, entry: TensorEntry) -> LoadedTensor:
        """Read ``dump_tensor_data/{data_name}``: ``.npy`` or ``.pt``, bit for bit."""
        if entry.path is None:
            raise DumpFileError(f"{entry.source_file}: statistics only, no payload")
        suffix = os.path.splitext(entry.path)[1].lower()
        notes = []
        if suffix == ".npy":
            t = read_npy(entry.path, where=entry.source_file)
            array = t.array
            if t.note:
                notes.append(t.note)
        elif suffix == ".pt":
            array = load_pt(entry.path, entry.source_file)
        else:
            raise DumpFileError(f"{entry.source_file}: unknown tensor file type {suffix or '(none)'!r} "
                                "(msprobe writes .pt or .npy)")
        declared = _declared_dtype(entry.dtype_declared)
        if declared is not None and declared != array.dtype:
            notes.append(f"dump.json declares {entry.dtype_declared}, payload is {dtype_name(array.dtype)}")
        if entry.shape_declared is not None and tuple(entry.shape_declared) != array.shape:
            notes.append(f"dump.json declares shape {list(entry.shape_declared)}, payload is {list(array.shape)}")
        return LoadedTensor(array, "; ".join(notes) or None)


@functools.cache
def torch_available() -> bool:
    """True if ``import torch`` works (tried once, only when a dump holds ``.pt`` files)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def load_pt(path: str | os.PathLike, where: str) -> np.ndarray:
    """The tensor of a ``torch.save``d file as a numpy array holding the same bytes.

    bfloat16 comes back as ``ml_dtypes.bfloat16``. Raises :class:`DumpFileError` (message
    starting with ``where``) when torch is missing, the file is not a saved tensor, or its
    dtype has no numpy equivalent the archive stores.
    """
    try:
        import torch
    except ImportError:
        raise DumpFileError(f"{where}: reading .pt tensors needs PyTorch: pip install 'dumpdb[torch]'") from None
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise DumpFileError(f"{where}: no such file") from None
    except Exception as exc:  # torch raises RuntimeError, pickle errors, zipfile errors...
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise DumpFileError(f"{where}: not a readable torch.save file ({type(exc).__name__}: {first[:200]})") from None
    if not isinstance(obj, torch.Tensor):
        raise DumpFileError(f"{where}: holds a {type(obj).__name__}, not a tensor")
    t = obj.detach()
    if t.layout != torch.strided or t.is_quantized:
        raise DumpFileError(f"{where}: {t.layout} / {t.dtype} tensors are not supported (dense tensors only)")
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        array = t.view(torch.int16).numpy().view(BFLOAT16)
    else:
        try:
            array = t.numpy()
        except (TypeError, RuntimeError) as exc:
            raise DumpFileError(f"{where}: dtype {t.dtype} has no numpy equivalent the archive stores "
                                f"({str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__})") from None
    if array.dtype.kind not in "biufc" and array.dtype != BFLOAT16:
        raise DumpFileError(f"{where}: dtype {t.dtype} is not a numeric tensor dumpdb stores")
    return array
