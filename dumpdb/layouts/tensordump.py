"""MindSpore ``ops.TensorDump`` / ``ops.tensordump`` files (layout ``mindspore-tensordump``).

Sources: the MindSpore API page of ``mindspore.ops.TensorDump`` (reference
formats.md section 4: "``ops.TensorDump`` writes ``{file}_{dtype}_{id}.npy``
(``_in_`` variant for input side)") and the real case
``corpus/mindspore-cpu/j_tensordump_pynative`` (MindSpore 2.10, PyNative, CPU;
README "Options tried": "files ``{name}_{dtype}_{counter}.npy`` with lowercase
numpy dtype names")::

    {dir}/
        {fileName}_{dtype}_{id}.npy        input_output 'out' (default): OpA's output
        {fileName}_in_{dtype}_{id}.npy     input_output 'in': OpB's input ("fileName_dumpMode_dtype_id.npy")

* ``fileName``: the ``file`` argument's last path component, chosen by the user
  and free to contain ``_`` (``x_fp16_float16_2.npy`` is ``x_fp16``), so names
  are parsed from the right: ``_{id}.npy``, then a known dtype name, then an
  optional ``_in``. Caveat: with 'out' a user name ending in ``_in`` reads as the
  'in' form; the two are indistinguishable by name.
* ``dtype``: "the original data type"; bfloat16 is saved as float32 (the
  catalog then has dtype float32, dtype_declared bfloat16 and a note).
* ``id``: "an auto-incrementing ID", one counter for every TensorDump call of
  the process (the real case: x_0, x_relu_1, x_fp16_2, x_int_3, x_4). Stored as
  ``call_index``: it orders the calls; it is not a per-name count (the second
  dump of ``x`` has ``call_index`` 4).

Catalog fields: ``op_name`` = fileName, ``io`` = 'output' ('out' form) or
'input' ('in' form), ``dtype_declared`` = the dtype part; ``slot``,
``iteration``, ``timestamp``, ``rank``: NULL (the names carry none of them).
Older MindSpore (<= 2.4) wrote ``{id}_{fileName}.npy`` without a dtype; that
form is not read (too generic to detect).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from dumpdb.dtypes import from_dump_name
from dumpdb.errors import LayoutError
from dumpdb.layouts.base import DumpScan, Layout, LoadedTensor, TensorEntry, display_name
from dumpdb.npy import describe_dtype_mismatch, read_npy

# dtype names TensorDump writes (numpy-style, lowercase in the real case).
TENSORDUMP_DTYPES = (
    "bool", "int4", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "bfloat16", "complex64", "complex128",
    "float8_e4m3fn", "float8_e5m2", "hifloat8",
)
_DTYPE_ALT = "|".join(sorted(TENSORDUMP_DTYPES, key=len, reverse=True))
TENSORDUMP_NAME_RE = re.compile(
    rf"^(?P<name>.+?)(?P<mode>_in)?_(?P<dtype>{_DTYPE_ALT})_(?P<id>\d+)\.npy$", re.IGNORECASE)
NAME_GRAMMAR = "{fileName}[_in]_{dtype}_{id}.npy"
_INT32_MAX = 2**31 - 1


def parse_tensordump_name(name: str) -> dict | None:
    """Fields of a TensorDump file name (parsed from the right), or None."""
    m = TENSORDUMP_NAME_RE.match(name)
    if not m:
        return None
    return {
        "op_name": m["name"],
        "io": "input" if m["mode"] else "output",
        "dtype_declared": m["dtype"],
        "call_index": int(m["id"]),
    }


def top_npy_names(root: Path) -> list[str]:
    """Names of the ``.npy`` files directly in ``root``; if none, those one level down."""
    def listing(d: Path) -> tuple[list[str], list[Path]]:
        files, dirs = [], []
        try:
            with os.scandir(d) as it:
                for e in it:
                    if e.name.startswith("."):
                        continue
                    if e.is_dir(follow_symlinks=False):
                        dirs.append(Path(e.path))
                    elif e.name.endswith(".npy"):
                        files.append(e.name)
        except OSError:
            pass
        return files, dirs

    files, dirs = listing(Path(root))
    if files:
        return files
    out: list[str] = []
    for d in dirs:
        out.extend(listing(d)[0])
    return out


def walk_npy(root: Path):
    """(directory, sorted .npy names) for every directory under ``root`` (hidden ones skipped)."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        names = sorted(f for f in filenames if f.endswith(".npy"))
        if names:
            yield Path(dirpath), names


class MindSporeTensorDump(Layout):
    name = "mindspore-tensordump"
    description = "MindSpore ops.TensorDump files: {fileName}[_in]_{dtype}_{id}.npy"
    document = "MindSpore API mindspore.ops.TensorDump; reference formats.md section 4; corpus j_tensordump_pynative"

    def detect(self, root: Path) -> bool:
        """Most ``.npy`` files at the top (or one level down) follow the TensorDump name."""
        names = top_npy_names(Path(root))
        matched = sum(1 for n in names if TENSORDUMP_NAME_RE.match(n))
        return matched > 0 and 2 * matched >= len(names)

    def scan(self, root: Path) -> DumpScan:
        root = Path(root)
        if not root.is_dir():
            raise LayoutError(f"{root}: not a directory")
        scan = DumpScan(layout=self.name, root=root, framework="MindSpore")
        for directory, names in walk_npy(root):
            for name in names:
                path = directory / name
                source_file = display_name(os.path.relpath(path, root))
                fields = parse_tensordump_name(name)
                if fields is None:
                    scan.errors.append((source_file, f"file name does not follow {NAME_GRAMMAR}"))
                    continue
                if fields["call_index"] > _INT32_MAX:
                    scan.errors.append((source_file, f"id {fields['call_index']} in the file name is out of range"))
                    continue
                try:
                    size = path.stat().st_size
                except OSError:
                    size = None
                fields["op_name"] = display_name(fields["op_name"])
                scan.entries.append(TensorEntry(source_file=source_file, path=str(path), size=size, **fields))
        scan.entries.sort(key=lambda e: (os.path.dirname(e.source_file), e.call_index, e.source_file))
        return scan

    def load(self, entry: TensorEntry) -> LoadedTensor:
        """The ``.npy`` (see :mod:`dumpdb.npy`); a note when the payload dtype differs from the name's."""
        t = read_npy(entry.path, where=entry.source_file)
        notes = [n for n in (t.note, describe_dtype_mismatch(
            from_dump_name(entry.dtype_declared), entry.dtype_declared, t.array.dtype)) if n]
        if t.note and "float32" in t.note:
            notes = [t.note]
        return LoadedTensor(t.array, "; ".join(notes) or None)
