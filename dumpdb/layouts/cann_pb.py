"""The CANN operator dump container (``.bin``-style files with a protobuf header).

Written by CANN/GE for MindSpore asynchronous dumps, the TensorFlow adapter and
TorchAir (reference formats.md section 3.2, 3.3; seeds 000, 001, 003, 004)::

    offset 0              uint64 header_len (little-endian)
    offset 8              header_len bytes: serialized toolkit.dumpdata.DumpData
    offset 8+header_len   data segment: input[0].size bytes, input[1].size, ...,
                          then output[0].size, ..., then buffer[0].size, ...

The header's ``data`` fields are empty; tensor bytes live only in the data
segment, inputs first (although proto3 serialises ``output`` (field 3) before
``input`` (field 4) in the header).

The ``DumpData`` message classes are built at run time from a
``FileDescriptorProto`` with the public field numbers (``dump_data.proto`` next
to this module is the same schema as text, for reference); no protoc and no
generated ``_pb2`` module. Unknown fields (newer CANN adds ``address``,
``dim_range``, ``attr``, ``space``...) are skipped by protobuf. The string
fields (``version``, ``op_name``, ``OriginalOp.name``) are declared ``bytes``
here (same wire type): a name that is not valid UTF-8 then costs a replacement
character, not the whole file.

Names used in the catalog:

* ``dtype_declared`` is the ``OutputDataType`` enum's own name (``DT_FLOAT16``,
  ``DT_BF16``, ...); the stored dtype is the numpy dtype of
  :data:`NUMPY_DTYPES` (formats.md: msaccucmp's ``DATA_TYPE_TO_DTYPE_MAP``).
* ``format`` is the ``OutputFormat`` enum name without its ``FORMAT_`` prefix,
  spelled as the enum spells it (``NCHW``, ``ND``, ``NC1HWC0``, ``FRACTAL_Z``,
  ``FRACTAL_NZ``, ``C1HWNCoC0``...). Device formats are kept as dumped: the
  shape is the dumped (device) shape; ``original_shape`` is the header's.
"""

from __future__ import annotations

import json
import math
import os
import struct
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from dumpdb.dtypes import BFLOAT16
from dumpdb.dumpio import open_dump_file, read_dump_bytes
from dumpdb.errors import DumpFileError
from dumpdb.formats import OUTPUT_FORMAT

if TYPE_CHECKING:
    from google.protobuf import descriptor_pb2

PACKAGE = "toolkit.dumpdata"
HEADER_LEN_SIZE = 8  # uint64 header_len

# OutputDataType (formats.md 3.3; mindspore dump_data.proto, mstt AclDumpMsg.proto).
DATA_TYPES: dict[int, str] = {
    0: "DT_UNDEFINED", 1: "DT_FLOAT", 2: "DT_FLOAT16", 3: "DT_INT8", 4: "DT_UINT8", 5: "DT_INT16",
    6: "DT_UINT16", 7: "DT_INT32", 8: "DT_INT64", 9: "DT_UINT32", 10: "DT_UINT64", 11: "DT_BOOL",
    12: "DT_DOUBLE", 13: "DT_STRING", 14: "DT_DUAL_SUB_INT8", 15: "DT_DUAL_SUB_UINT8",
    16: "DT_COMPLEX64", 17: "DT_COMPLEX128", 18: "DT_QINT8", 19: "DT_QINT16", 20: "DT_QINT32",
    21: "DT_QUINT8", 22: "DT_QUINT16", 23: "DT_RESOURCE", 24: "DT_STRING_REF", 25: "DT_DUAL",
    26: "DT_VARIANT", 27: "DT_BF16", 28: "DT_INT4", 29: "DT_UINT1", 30: "DT_INT2", 31: "DT_UINT2",
}

# OutputDataType -> numpy: msaccucmp's DATA_TYPE_TO_DTYPE_MAP as formats.md 3.3 gives it.
# DT_UNDEFINED -> int8 and DT_RESOURCE -> int64 are msaccucmp's choices (noted on the
# tensor); DT_UINT1 is bit-packed and kept as its packed bytes (uint8, see tensor_array).
NUMPY_DTYPES: dict[int, np.dtype] = {
    1: np.dtype("<f4"), 2: np.dtype("<f2"), 12: np.dtype("<f8"), 3: np.dtype("i1"), 5: np.dtype("<i2"),
    7: np.dtype("<i4"), 8: np.dtype("<i8"), 4: np.dtype("u1"), 6: np.dtype("<u2"), 9: np.dtype("<u4"),
    10: np.dtype("<u8"), 11: np.dtype(np.bool_), 16: np.dtype("<c8"), 17: np.dtype("<c16"),
    27: BFLOAT16, 29: np.dtype("u1"), 0: np.dtype("i1"), 23: np.dtype("<i8"),
}
_BORROWED = {0: "int8", 23: "int64"}  # codes whose numpy type is a convention, not the enum's meaning
DT_UINT1 = 29

# OutputFormat (formats.md 3.3), the table dumpdb.formats converts with. Stored with the
# proto's FORMAT_ prefix; catalog names drop it.
FORMATS: dict[int, str] = OUTPUT_FORMAT

# Overflow record of one output slot of an Opdebug.Node_OpDebug file (formats.md 3.4;
# mstt AclDumpDataProcessor.cpp DumpOpDebugDataToDisk): byte offsets, little-endian.
_OVERFLOW_INFO_FIELDS = ("model_id", "stream_id", "task_id", "task_type", "pc_start", "para_base")
_DHA_INFO, _L2_INFO, _AICORE_INFO = 0, 128, 256
_DHA_STATUS, _L2_STATUS, _AICORE_STATUS = 512, 768, 1024
OVERFLOW_RECORD_SIZE = 1024 + 3 * 8  # ... AI Core kernel_code, block_idx, status


# -- the schema, built at run time ----------------------------------------------
def _file_descriptor() -> descriptor_pb2.FileDescriptorProto:
    from google.protobuf import descriptor_pb2

    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="dumpdb/layouts/dump_data.proto", package=PACKAGE,
                                             syntax="proto3")
    for enum_name, values in (
        ("OutputDataType", DATA_TYPES),
        ("OutputFormat", {code: "FORMAT_" + name for code, name in FORMATS.items()}),
        ("BufferType", {0: "L1"}),
    ):
        enum = fdp.enum_type.add(name=enum_name)
        for number, name in sorted(values.items()):
            enum.value.add(name=name, number=number)

    def message(name: str, fields: list[tuple]) -> None:
        msg = fdp.message_type.add(name=name)
        for field_name, number, ftype, type_name, repeated in fields:
            field = msg.field.add(name=field_name, number=number, type=ftype,
                                  label=F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL)
            if type_name:
                field.type_name = f".{PACKAGE}.{type_name}"

    dtype = ("OutputDataType", F.TYPE_ENUM)
    fmt = ("OutputFormat", F.TYPE_ENUM)
    message("OriginalOp", [("name", 1, F.TYPE_BYTES, None, False), ("output_index", 2, F.TYPE_UINT32, None, False),
                           ("data_type", 3, dtype[1], dtype[0], False), ("format", 4, fmt[1], fmt[0], False)])
    message("Shape", [("dim", 1, F.TYPE_UINT64, None, True)])
    message("OpOutput", [
        ("data_type", 1, dtype[1], dtype[0], False), ("format", 2, fmt[1], fmt[0], False),
        ("shape", 3, F.TYPE_MESSAGE, "Shape", False), ("original_op", 4, F.TYPE_MESSAGE, "OriginalOp", False),
        ("data", 5, F.TYPE_BYTES, None, False), ("size", 6, F.TYPE_UINT64, None, False),
        ("original_shape", 7, F.TYPE_MESSAGE, "Shape", False), ("sub_format", 8, F.TYPE_INT32, None, False),
    ])
    message("OpInput", [
        ("data_type", 1, dtype[1], dtype[0], False), ("format", 2, fmt[1], fmt[0], False),
        ("shape", 3, F.TYPE_MESSAGE, "Shape", False), ("data", 4, F.TYPE_BYTES, None, False),
        ("size", 5, F.TYPE_UINT64, None, False), ("original_shape", 6, F.TYPE_MESSAGE, "Shape", False),
        ("sub_format", 7, F.TYPE_INT32, None, False),
    ])
    message("OpBuffer", [("buffer_type", 1, F.TYPE_ENUM, "BufferType", False),
                         ("data", 2, F.TYPE_BYTES, None, False), ("size", 3, F.TYPE_UINT64, None, False)])
    message("DumpData", [
        ("version", 1, F.TYPE_BYTES, None, False), ("dump_time", 2, F.TYPE_UINT64, None, False),
        ("output", 3, F.TYPE_MESSAGE, "OpOutput", True), ("input", 4, F.TYPE_MESSAGE, "OpInput", True),
        ("buffer", 5, F.TYPE_MESSAGE, "OpBuffer", True), ("op_name", 6, F.TYPE_BYTES, None, False),
    ])
    return fdp


# The message classes are built on first use, not at import: protobuf and the pool cost
# ~0.1 s of CPU, and most ingests (MindSpore, msprobe) never meet a CANN container.
MESSAGES = ("DumpData", "OpInput", "OpOutput", "OpBuffer", "Shape", "OriginalOp")
_classes: dict[str, Any] = {}
_classes_lock = threading.Lock()


def _message_class(name: str) -> Any:
    """The generated class of message ``name`` (one of :data:`MESSAGES`), built once."""
    cls = _classes.get(name)
    if cls is None:
        with _classes_lock:
            if not _classes:
                from google.protobuf import descriptor_pool, message_factory

                pool = descriptor_pool.DescriptorPool()
                pool.Add(_file_descriptor())
                for n in MESSAGES:
                    _classes[n] = message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{n}"))
        cls = _classes[name]
    return cls


def __getattr__(name: str) -> Any:
    """``cann_pb.DumpData`` and the other message classes (PEP 562: built on first use)."""
    if name in MESSAGES:
        return _message_class(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- parsed header ---------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TensorSlot:
    """One input or output described by the header, with where its bytes are."""

    io: str  # 'input' | 'output'
    slot: int
    data_type: int
    format_code: int
    shape: tuple[int, ...]
    original_shape: tuple[int, ...] | None
    size: int
    offset: int  # absolute file offset of the bytes
    sub_format: int = 0
    original_op: str | None = None

    @property
    def dtype_name(self) -> str:
        """The enum's name (``DT_FLOAT16``), or ``DT_UNKNOWN_{n}`` for a number it lacks."""
        return DATA_TYPES.get(self.data_type, f"DT_UNKNOWN_{self.data_type}")

    @property
    def format(self) -> str:
        """The format's enum name without ``FORMAT_`` (``NC1HWC0``), or ``FORMAT_{n}`` if unknown."""
        return FORMATS.get(self.format_code, f"FORMAT_{self.format_code}")


@dataclass(frozen=True, slots=True)
class DumpHeader:
    """A parsed container: the header and the layout of its data segment."""

    file_size: int
    header_len: int
    version: str
    dump_time: int
    op_name: str
    inputs: tuple[TensorSlot, ...]
    outputs: tuple[TensorSlot, ...]
    buffer_sizes: tuple[int, ...]
    trailing: int  # data-segment bytes after the last described block (e.g. workspace)

    @property
    def data_offset(self) -> int:
        return HEADER_LEN_SIZE + self.header_len

    @property
    def tensors(self) -> tuple[TensorSlot, ...]:
        return self.inputs + self.outputs

    def slot(self, io: str, slot: int) -> TensorSlot | None:
        group = self.inputs if io == "input" else self.outputs if io == "output" else ()
        return group[slot] if 0 <= slot < len(group) else None


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


def _dims(shape) -> tuple[int, ...]:
    return tuple(int(d) for d in shape.dim)


def parse_header(head: bytes, file_size: int, where: str) -> DumpHeader:
    """Parse a container from its first bytes (at least ``8 + header_len``).

    ``file_size`` is the whole file's size, for the data-segment checks.
    Raises :class:`DumpFileError` (message starts with ``where``) for a file
    shorter than 8 bytes, a header length beyond the file, a header that is not
    a ``DumpData`` message, or a data segment shorter than the sizes it lists.
    """
    if file_size < HEADER_LEN_SIZE:
        what = "empty file (0 bytes)" if file_size == 0 else f"only {file_size} bytes"
        raise DumpFileError(f"{where}: {what}; a CANN dump starts with an 8-byte header length")
    (header_len,) = struct.unpack_from("<Q", head, 0)
    if header_len > file_size - HEADER_LEN_SIZE:
        raise DumpFileError(
            f"{where}: header length {header_len} is beyond the file ({file_size} bytes, "
            f"{file_size - HEADER_LEN_SIZE} after the 8-byte length); not a CANN dump or truncated")
    if len(head) < HEADER_LEN_SIZE + header_len:
        raise DumpFileError(f"{where}: cannot read the {header_len}-byte header")
    from google.protobuf.message import DecodeError

    msg = _message_class("DumpData")()
    try:
        msg.ParseFromString(bytes(head[HEADER_LEN_SIZE:HEADER_LEN_SIZE + header_len]))
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise DumpFileError(
            f"{where}: header ({header_len} bytes) is not a readable {PACKAGE}.DumpData protobuf "
            f"({str(exc) or type(exc).__name__})") from None
    offset = HEADER_LEN_SIZE + header_len
    inputs = []
    for i, t in enumerate(msg.input):
        inputs.append(TensorSlot(
            "input", i, int(t.data_type), int(t.format), _dims(t.shape),
            _dims(t.original_shape) if t.HasField("original_shape") else None,
            int(t.size), offset, int(t.sub_format)))
        offset += int(t.size)
    outputs = []
    for i, t in enumerate(msg.output):
        outputs.append(TensorSlot(
            "output", i, int(t.data_type), int(t.format), _dims(t.shape),
            _dims(t.original_shape) if t.HasField("original_shape") else None,
            int(t.size), offset, int(t.sub_format),
            _text(t.original_op.name) or None if t.HasField("original_op") else None))
        offset += int(t.size)
    buffers = tuple(int(b.size) for b in msg.buffer)
    offset += sum(buffers)
    data_len = file_size - HEADER_LEN_SIZE - header_len
    needed = offset - HEADER_LEN_SIZE - header_len
    if data_len < needed:
        in_b = sum(t.size for t in inputs)
        out_b = sum(t.size for t in outputs)
        raise DumpFileError(
            f"{where}: truncated: data segment is {data_len} bytes, header describes {needed} "
            f"({len(inputs)} inputs {in_b} + {len(outputs)} outputs {out_b} + {len(buffers)} buffers "
            f"{sum(buffers)})")
    return DumpHeader(
        file_size=file_size, header_len=header_len, version=_text(msg.version), dump_time=int(msg.dump_time),
        op_name=_text(msg.op_name), inputs=tuple(inputs), outputs=tuple(outputs), buffer_sizes=buffers,
        trailing=data_len - needed)


def _read_header_fd(fd: int, file_size: int, where: str) -> DumpHeader:
    head = os.pread(fd, HEADER_LEN_SIZE, 0)
    if len(head) == HEADER_LEN_SIZE and file_size >= HEADER_LEN_SIZE:
        (header_len,) = struct.unpack_from("<Q", head, 0)
        if header_len <= file_size - HEADER_LEN_SIZE:
            head += os.pread(fd, header_len, HEADER_LEN_SIZE)
    return parse_header(head, file_size, where)


def read_header(path: str | os.PathLike, where: str | None = None) -> DumpHeader:
    """Read and check one container's header (reads the header bytes only)."""
    where = where or str(path)
    fd = open_dump_file(path, where)  # regular files only: a FIFO never blocks (dumpdb.dumpio)
    try:
        return _read_header_fd(fd, os.fstat(fd).st_size, where)
    except OSError as exc:
        raise DumpFileError(f"{where}: cannot read: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)


# -- payloads ----------------------------------------------------------------------
def numpy_dtype(data_type: int) -> np.dtype | None:
    """Numpy dtype for an ``OutputDataType`` number (None: no equivalent)."""
    return NUMPY_DTYPES.get(data_type)


def tensor_array(t: TensorSlot, raw: bytes, where: str) -> tuple[np.ndarray, str | None]:
    """The slot's bytes ``raw`` as an array of its dtype and dumped shape, plus a note.

    Raises :class:`DumpFileError` for a data type with no numpy equivalent (or
    not in the enum) and for a ``size`` that disagrees with shape x itemsize.
    """
    label = f"{t.io}.{t.slot}"
    dtype = numpy_dtype(t.data_type)
    if dtype is None:
        if t.data_type in DATA_TYPES:
            raise DumpFileError(f"{where}: {label}: data type {t.dtype_name} ({t.data_type}) "
                                "has no numpy equivalent; not stored")
        raise DumpFileError(f"{where}: {label}: unknown data_type {t.data_type} "
                            f"(not in {PACKAGE}.OutputDataType)")
    if len(raw) != t.size:
        raise DumpFileError(f"{where}: {label}: truncated: read {len(raw)} of {t.size} bytes")
    count = math.prod(t.shape)
    note = None
    if t.data_type == DT_UINT1:
        # Bit-packed: keep the packed bytes as they are (no guessing the bit order).
        array = np.frombuffer(raw, dtype=np.uint8)
        return array, f"{t.dtype_name} is bit-packed: stored as its {t.size} packed bytes (uint8), shape {t.shape}"
    expected = count * dtype.itemsize
    if t.size != expected:
        if t.size == 0:
            return np.zeros((0,), dtype=dtype), f"size 0 bytes for shape {list(t.shape)}: stored as an empty tensor"
        raise DumpFileError(
            f"{where}: {label}: size field says {t.size} bytes but shape {list(t.shape)} of "
            f"{t.dtype_name} needs {expected}")
    if t.data_type in _BORROWED:
        note = f"{t.dtype_name} read as {_BORROWED[t.data_type]} (msaccucmp's mapping)"
    array = np.frombuffer(raw, dtype=dtype, count=count).reshape(t.shape)
    return array, note


def _pread(fd: int, t: TensorSlot, where: str) -> bytes:
    """The slot's bytes at their offset (one pread; bounded by the slot's checked size)."""
    try:
        return os.pread(fd, t.size, t.offset) if t.size else b""
    except OSError as exc:
        raise DumpFileError(f"{where}: cannot read: {exc.strerror or exc}") from exc


class HeaderCache:
    """Parsed headers by file, so the N tensors of one file parse it once.

    Thread-safe (loads run in worker threads); keeps the ``capacity`` most
    recently used files. A file whose size changed since it was parsed is
    parsed again.
    """

    def __init__(self, capacity: int = 2048):
        self.capacity = capacity
        self._lock = threading.Lock()
        self._items: OrderedDict[str, DumpHeader] = OrderedDict()

    def put(self, path: str, header: DumpHeader) -> None:
        with self._lock:
            self._items[path] = header
            self._items.move_to_end(path)
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)

    def load(self, path: str, io: str, slot: int, where: str) -> tuple[np.ndarray, str | None]:
        """Read slot ``io``.``slot`` of the container at ``path``."""
        fd = open_dump_file(path, where)
        try:
            size = os.fstat(fd).st_size
            with self._lock:
                header = self._items.get(path)
                if header is not None:
                    self._items.move_to_end(path)
            if header is None or header.file_size != size:
                header = _read_header_fd(fd, size, where)
                self.put(path, header)
            t = header.slot(io, slot)
            if t is None:
                raise DumpFileError(f"{where}: header has no {io}.{slot} "
                                    f"({len(header.inputs)} inputs, {len(header.outputs)} outputs)")
            raw = _pread(fd, t, where)
        finally:
            os.close(fd)
        return tensor_array(t, raw, where)


# -- overflow records (Opdebug.Node_OpDebug.*) ---------------------------------------
def _u64(raw: bytes, offset: int) -> int:
    return struct.unpack_from("<Q", raw, offset)[0]


def _overflow_info(raw: bytes, offset: int) -> dict[str, Any]:
    values = [_u64(raw, offset + 8 * i) for i in range(len(_OVERFLOW_INFO_FIELDS))]
    info: dict[str, Any] = dict(zip(_OVERFLOW_INFO_FIELDS, values))
    info["pc_start"] = f"0x{info['pc_start']:x}"
    info["para_base"] = f"0x{info['para_base']:x}"
    return info


def decode_overflow(raw: bytes) -> dict[str, Any]:
    """One output slot of an overflow file as msprobe writes it to ``.output.{slot}.json``.

    ``raw`` holds at least :data:`OVERFLOW_RECORD_SIZE` bytes (formats.md 3.4):
    DHA Atomic Add info (128 B), L2 Atomic Add info (128 B), AI Core info
    (256 B), DHA status (256 B), L2 status (256 B), then AI Core kernel_code,
    block_idx, status (uint64 each). Addresses and the kernel code are hex text.
    """
    dha = _overflow_info(raw, _DHA_INFO)
    l2 = _overflow_info(raw, _L2_INFO)
    core = _overflow_info(raw, _AICORE_INFO)
    dha["status"] = _u64(raw, _DHA_STATUS)
    l2["status"] = _u64(raw, _L2_STATUS)
    core["kernel_code"] = f"0x{_u64(raw, _AICORE_STATUS):x}"
    core["block_idx"] = _u64(raw, _AICORE_STATUS + 8)
    core["status"] = _u64(raw, _AICORE_STATUS + 16)
    return {"DHA Atomic Add": dha, "L2 Atomic Add": l2, "AI Core": core}


def read_overflow(path: str | os.PathLike, where: str) -> list[tuple[int, str]]:
    """``[(slot, JSON text)]`` of an ``Opdebug.Node_OpDebug.*`` container.

    Each output slot's data block is one record; a file whose header lists no
    outputs is read as one record (slot 0) from the start of its data segment.
    Raises :class:`DumpFileError` for a bad container or a block too short.
    """
    header = read_header(path, where)
    data = read_dump_bytes(path, where, header.file_size)
    blocks = [(t.slot, t.offset, t.size) for t in header.outputs] or [
        (0, header.data_offset, header.file_size - header.data_offset)]
    records = []
    for slot, offset, size in blocks:
        if size < OVERFLOW_RECORD_SIZE:
            raise DumpFileError(f"{where}: output.{slot}: overflow record is {size} bytes, "
                                f"needs {OVERFLOW_RECORD_SIZE}")
        records.append((slot, json.dumps(decode_overflow(data[offset:offset + size]))))
    return records
