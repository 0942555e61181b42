"""CANN dump containers and overflow records written byte by byte from the documents,
sharing nothing with dumpdb's reader (no protobuf package, no dumpdb import).

Sources: reference formats.md 3.2 (container: uint64 LE header length, header, then the
inputs', outputs' and buffers' bytes in that order), 3.3 (``toolkit.dumpdata`` proto3
schema: field numbers and the ``OutputDataType`` / ``OutputFormat`` enum numbers), 3.4
(overflow record offsets); protobuf's wire format (varint keys ``field << 3 | wire_type``;
wire type 0 varint, 2 length-delimited; proto3 writes fields in number order, packs
repeated scalars, and omits fields at their default value).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import ml_dtypes
import numpy as np

# formats.md 3.3, OutputDataType: the numbers, and the enum's names (DT_ + name).
DATA_TYPE = {np.dtype("<f4"): 1, np.dtype("<f2"): 2, np.dtype("i1"): 3, np.dtype("u1"): 4, np.dtype("<i2"): 5,
             np.dtype("<u2"): 6, np.dtype("<i4"): 7, np.dtype("<i8"): 8, np.dtype("<u4"): 9, np.dtype("<u8"): 10,
             np.dtype("bool"): 11, np.dtype("<f8"): 12, np.dtype("<c8"): 16, np.dtype("<c16"): 17,
             np.dtype(ml_dtypes.bfloat16): 27}
DATA_TYPE_NAME = {1: "DT_FLOAT", 2: "DT_FLOAT16", 3: "DT_INT8", 4: "DT_UINT8", 5: "DT_INT16", 6: "DT_UINT16",
                  7: "DT_INT32", 8: "DT_INT64", 9: "DT_UINT32", 10: "DT_UINT64", 11: "DT_BOOL", 12: "DT_DOUBLE",
                  16: "DT_COMPLEX64", 17: "DT_COMPLEX128", 27: "DT_BF16"}
# formats.md 3.3, OutputFormat.
FORMAT = {"NCHW": 0, "NHWC": 1, "ND": 2, "NC1HWC0": 3, "FRACTAL_Z": 4, "HWCN": 16, "FRACTAL_NZ": 29,
          "NDC1HWC0": 32}

# Field numbers, formats.md 3.3.
DUMPDATA_VERSION, DUMPDATA_DUMP_TIME, DUMPDATA_OUTPUT, DUMPDATA_INPUT, DUMPDATA_BUFFER, DUMPDATA_OP_NAME = 1, 2, 3, 4, 5, 6
# OpOutput: data_type 1, format 2, shape 3, original_op 4, data 5, size 6, original_shape 7, sub_format 8
OUT_FIELDS = {"data_type": 1, "format": 2, "shape": 3, "original_op": 4, "size": 6, "original_shape": 7}
# OpInput: data_type 1, format 2, shape 3, data 4, size 5, original_shape 6, sub_format 7
IN_FIELDS = {"data_type": 1, "format": 2, "shape": 3, "size": 5, "original_shape": 6}
SHAPE_DIM = 1
ORIGINAL_OP_NAME = 1
BUFFER_TYPE, BUFFER_SIZE = 1, 3


def varint(n: int) -> bytes:
    assert n >= 0
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def key(field: int, wire_type: int) -> bytes:
    return varint(field << 3 | wire_type)


def v(field: int, value: int) -> bytes:
    """A varint field; proto3 omits a zero."""
    return key(field, 0) + varint(value) if value else b""


def ld(field: int, payload: bytes, *, keep_empty: bool = False) -> bytes:
    """A length-delimited field (string, bytes, sub-message, packed repeated)."""
    if not payload and not keep_empty:
        return b""
    return key(field, 2) + varint(len(payload)) + payload


def shape_message(dims: Sequence[int]) -> bytes:
    return ld(SHAPE_DIM, b"".join(varint(int(d)) for d in dims))  # packed repeated uint64


@dataclass
class Spec:
    """One input/output as the container holds it; overrides write lying headers."""

    array: np.ndarray
    format: str = "ND"
    original_shape: Sequence[int] | None = None
    data_type: int | None = None
    shape: Sequence[int] | None = None
    size: int | None = None
    original_op: str | None = None

    @property
    def data(self) -> bytes:
        return np.asarray(self.array).tobytes(order="C")

    @property
    def type_code(self) -> int:
        return self.data_type if self.data_type is not None else DATA_TYPE[np.asarray(self.array).dtype]


def tensor_message(spec: Spec, fields: dict) -> bytes:
    array = np.asarray(spec.array)
    shape = spec.shape if spec.shape is not None else array.shape
    out = v(fields["data_type"], spec.type_code) + v(fields["format"], FORMAT[spec.format])
    # a message field is written when set, even if empty (a 0-d shape: Shape{} -> "1a 00")
    out += ld(fields["shape"], shape_message(shape), keep_empty=True)
    if spec.original_op is not None and "original_op" in fields:
        out += ld(fields["original_op"], ld(ORIGINAL_OP_NAME, spec.original_op.encode()), keep_empty=True)
    out += v(fields["size"], spec.size if spec.size is not None else len(spec.data))
    if spec.original_shape is not None:
        out += ld(fields["original_shape"], shape_message(spec.original_shape), keep_empty=True)
    return out


def dump_header(inputs: Sequence[Spec], outputs: Sequence[Spec], buffers: Sequence[bytes] = (), *,
                version: str = "2.0", dump_time: int = 0, op_name: str = "") -> bytes:
    """Serialized ``DumpData``: fields in number order (version, dump_time, output, input,
    buffer, op_name), as proto3 writes them."""
    out = ld(DUMPDATA_VERSION, version.encode()) + v(DUMPDATA_DUMP_TIME, dump_time)
    for spec in outputs:
        out += ld(DUMPDATA_OUTPUT, tensor_message(spec, OUT_FIELDS), keep_empty=True)
    for spec in inputs:
        out += ld(DUMPDATA_INPUT, tensor_message(spec, IN_FIELDS), keep_empty=True)
    for raw in buffers:
        out += ld(DUMPDATA_BUFFER, v(BUFFER_TYPE, 0) + v(BUFFER_SIZE, len(raw)), keep_empty=True)
    return out + ld(DUMPDATA_OP_NAME, op_name.encode())


def _spec(x) -> Spec:
    return x if isinstance(x, Spec) else Spec(np.asarray(x))


def container(inputs: Sequence[Spec | np.ndarray] = (), outputs: Sequence[Spec | np.ndarray] = (),
              buffers: Sequence[bytes] = (), *, version: str = "2.0", dump_time: int = 0, op_name: str = "",
              trailing: bytes = b"") -> bytes:
    """formats.md 3.2: uint64 LE header length, the header, inputs' then outputs' then buffers' bytes."""
    ins, outs = [_spec(s) for s in inputs], [_spec(s) for s in outputs]
    header = dump_header(ins, outs, buffers, version=version, dump_time=dump_time, op_name=op_name)
    body = b"".join(s.data for s in ins) + b"".join(s.data for s in outs) + b"".join(buffers)
    return struct.pack("<Q", len(header)) + header + body + trailing


# formats.md 3.4: per output slot, little-endian uint64s. Info blocks: model_id, stream_id,
# task_id, task_type, pc_start, para_base. DHA info at 0 (128 B), L2 info at 128 (128 B),
# AI Core info at 256 (256 B), DHA status at 512 (256 B, first uint64), L2 status at 768
# (256 B), then AI Core kernel_code, block_idx, status at 1024.
INFO_ORDER = ("model_id", "stream_id", "task_id", "task_type", "pc_start", "para_base")
RECORD_SIZE = 1024 + 3 * 8


def overflow_record(dha: dict, l2: dict, core: dict) -> bytes:
    raw = bytearray(RECORD_SIZE)
    for offset, info in ((0, dha), (128, l2), (256, core)):
        struct.pack_into("<6Q", raw, offset, *(int(info[k]) for k in INFO_ORDER))
    struct.pack_into("<Q", raw, 512, int(dha["status"]))
    struct.pack_into("<Q", raw, 768, int(l2["status"]))
    struct.pack_into("<3Q", raw, 1024, int(core["kernel_code"]), int(core["block_idx"]), int(core["status"]))
    return bytes(raw)
