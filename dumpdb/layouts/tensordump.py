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

from dumpdb.layouts.base import LoadedTensor, TensorEntry, display_name, register
from dumpdb.layouts.flat_npy import FlatNpyLayout
from dumpdb.npy import read_npy_declared

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


@register
class MindSporeTensorDump(FlatNpyLayout):
    name = "mindspore-tensordump"
    description = "MindSpore ops.TensorDump files: {fileName}[_in]_{dtype}_{id}.npy"
    document = "MindSpore API mindspore.ops.TensorDump; reference formats.md section 4; corpus j_tensordump_pynative"
    priority = 40

    name_re = TENSORDUMP_NAME_RE
    grammar = NAME_GRAMMAR
    framework = "MindSpore"

    def parse_name(self, name: str) -> dict:
        fields = parse_tensordump_name(name)
        if fields is None:
            raise ValueError(f"file name does not follow {NAME_GRAMMAR}")
        if fields["call_index"] > _INT32_MAX:
            raise ValueError(f"id {fields['call_index']} in the file name is out of range")
        fields["op_name"] = display_name(fields["op_name"])
        return fields

    def sort_key(self, e: TensorEntry):
        return (os.path.dirname(e.source_file), e.call_index, e.source_file)

    def load(self, entry: TensorEntry) -> LoadedTensor:
        """The ``.npy`` (see :mod:`dumpdb.npy`); a note when the payload dtype differs from the name's."""
        t = read_npy_declared(entry.payload_path(), entry.source_file, entry.dtype_declared)
        return LoadedTensor(t.array, t.note)
