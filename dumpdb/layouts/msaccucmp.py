"""``.npy`` files converted by CANN ``msaccucmp.py convert`` (layout ``msaccucmp-npy``).

Sources: seed 000 (MindSpore r1.2, "Asynchronous Dump Data Analysis Sample")
and seed 001 (异步Dump数据分析样例): ``msaccucmp.py convert -d {dump file} -out
{dir} -f NCHW -t npy`` writes one ``.npy`` per input/output of the operator::

    {dump file name}.{input|output}.{index}.{d0}x{d1}x....npy
    BNTrainingUpdate.Default_network-...-op5489.137.1608983934774491.input.0.30x1024x17x17.npy   (seed 000)
    Conv2D.Default_network-...-op12.2.7.161243956333802.input.0.32x256x13x13.npy                  (seed 001)

where the dump file name is ``{op_type}.{op_name}.{task_id}.{timestamp}``
(seed 000, r1.2: "``Add.Default_Add-op1.2.161243956333802``") or
``{op_type}.{op_name}.{task_id}.{stream_id}.{timestamp}`` (seed 001): the
stream id is optional. "If '.', '/', '\\', and spaces appear in ``op_type``
and ``op_name``, they will be converted to underscores", so neither holds a dot
and the name splits on dots unambiguously. Older msaccucmp wrote no shape part
(``{dump file name}.{input|output}.{index}.npy``, reference formats.md 3.1);
an empty shape part (``...output.0..npy``) is read as a scalar.

The shape in the name must equal the ``.npy`` header's (a mismatch is a
:class:`DumpFileError` naming the file); the dtype comes from the header (the
name has none: ``dtype_declared`` NULL). ``format`` is NULL: the ``-f`` option
is not in the name. ``task_id``, ``stream_id`` (NULL when absent) and
``timestamp`` come from the name; files are found in the directory given and
below (``source_file`` relative to it).
"""

from __future__ import annotations

import re

from dumpdb.errors import DumpFileError
from dumpdb.layouts.base import LoadedTensor, TensorEntry, display_name, register
from dumpdb.layouts.flat_npy import FlatNpyLayout
from dumpdb.npy import read_npy

MSACCUCMP_NAME_RE = re.compile(
    r"^(?P<op_type>[^.]+)\.(?P<op_name>[^.]+)\.(?P<task_id>\d+)(?:\.(?P<stream_id>\d+))?\.(?P<timestamp>\d+)"
    r"\.(?P<io>input|output)\.(?P<slot>\d+)(?:\.(?P<shape>\d+(?:x\d+)*|))?\.npy$"
)
NAME_GRAMMAR = "{op_type}.{op_name}.{task_id}[.{stream_id}].{timestamp}.{input|output}.{index}[.{d0}x{d1}x...].npy"


def parse_msaccucmp_name(name: str) -> dict | None:
    """Fields of a converted file name, or None if it does not follow the grammar."""
    m = MSACCUCMP_NAME_RE.match(name)
    if not m:
        return None
    shape = m["shape"]
    return {
        "op_type": m["op_type"],
        "op_name": m["op_name"],
        "task_id": int(m["task_id"]),
        "stream_id": int(m["stream_id"]) if m["stream_id"] is not None else None,
        "timestamp": int(m["timestamp"]),
        "io": m["io"],
        "slot": int(m["slot"]),
        "shape_declared": None if shape is None else tuple(int(d) for d in shape.split("x") if d),
    }


@register
class MsaccucmpNpy(FlatNpyLayout):
    name = "msaccucmp-npy"
    description = ("CANN msaccucmp convert output: {op_type}.{op_name}.{task_id}[.{stream_id}].{timestamp}"
                   ".{input|output}.{index}.{d0}x{d1}x....npy")
    document = "seed 000 and seed 001 (Asynchronous Dump Data Analysis Sample: msaccucmp.py convert)"
    priority = 1000  # flat .npy names only: tried last

    name_re = MSACCUCMP_NAME_RE
    grammar = NAME_GRAMMAR

    def parse_name(self, name: str) -> dict:
        fields = parse_msaccucmp_name(name)
        if fields is None:
            raise ValueError(f"file name does not follow {NAME_GRAMMAR}")
        fields["op_name"] = display_name(fields["op_name"])
        fields["op_type"] = display_name(fields["op_type"])
        return fields

    def sort_key(self, e: TensorEntry):
        return (e.timestamp or 0, e.op_name or "", e.io or "", e.slot or 0, e.source_file)

    def load(self, entry: TensorEntry) -> LoadedTensor:
        """The ``.npy``; its header shape must equal the shape in the name."""
        t = read_npy(entry.payload_path(), where=entry.source_file)
        if entry.shape_declared is not None and tuple(t.array.shape) != tuple(entry.shape_declared):
            named = "x".join(map(str, entry.shape_declared)) or "(scalar)"
            raise DumpFileError(
                f"{entry.source_file}: file name says shape {named} but the .npy header says "
                f"{tuple(t.array.shape)}")
        return LoadedTensor(t.array, t.note)
