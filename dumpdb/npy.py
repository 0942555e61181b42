"""Reading ``.npy`` tensor files as dumps really write them.

``numpy.load`` is not enough for real MindSpore dumps (corpus README,
"Tensor file names" and "Things that differ from the docs"):

* bfloat16 files carry ``'descr': '<E2'``, which numpy rejects
  (``ValueError: descr is not a valid dtype descriptor``);
* on CPU, some files named ``Float16`` with a ``'<f2'`` header hold float32
  bytes (payload = 4 x prod(shape) bytes); ``np.load`` silently returns the
  first half of the bytes as float16 garbage;
* a truncated file or a header that lies about shape/dtype must be an error,
  never garbage in the archive.

:func:`read_npy` parses the header itself, checks the payload size against
it, and returns the array in the dtype the bytes really are.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from dumpdb.dtypes import BFLOAT16
from dumpdb.dumpio import current_read_buffer, read_dump_bytes, read_dump_into
from dumpdb.errors import DumpFileError

MAGIC = b"\x93NUMPY"


@dataclass(frozen=True)
class NpyTensor:
    """A tensor read from an ``.npy`` file.

    ``array`` is C-contiguous, little-endian, in the dtype the payload really
    holds (``ml_dtypes.bfloat16`` for ``'<E2'``). ``header_descr`` is the
    descr the header states; ``note`` describes any quirk found (None if none).
    """

    array: np.ndarray
    header_descr: str
    note: str | None = None


# numpy refuses headers above 10000 bytes by default (``max_header_size``); real
# tensor headers are about 100 bytes. Anything longer is refused before parsing.
MAX_HEADER_BYTES = 65536
_TOKEN_RE = re.compile(r"""\s*(?:(?P<str>'[^'\\\n]{0,256}'|"[^"\\\n]{0,256}")|(?P<int>\d{1,20})L?(?![\w.])"""
                       r"|(?P<name>True|False|None)(?!\w)|(?P<punct>[{}():,\[\]]))")
_END = object()


def _tokens(text: str, where: str) -> list:
    out: list = []
    pos = 0
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if m is None:
            if not text[pos:].strip():
                break
            raise DumpFileError(f"{where}: unreadable .npy header at {text[pos:pos + 20]!r}")
        pos = m.end()
        if m["str"] is not None:
            out.append(("str", m["str"][1:-1]))
        elif m["int"] is not None:
            out.append(("int", int(m["int"])))
        elif m["name"] is not None:
            out.append(("val", {"True": True, "False": False, "None": None}[m["name"]]))
        else:
            out.append(("p", m["punct"]))
    return out


def _header_dict(text: str, where: str) -> dict:
    """The header dict, parsed strictly: string keys; values a string, True/False,
    or a tuple of non-negative ints (a list means a structured dtype: refused).
    Never evaluates anything (no ``ast.literal_eval``)."""
    toks = _tokens(text, where)
    i = 0

    def take(kind=None, value=None):
        nonlocal i
        if i >= len(toks):
            raise DumpFileError(f"{where}: .npy header ends early: {text.strip()[:80]!r}")
        tok = toks[i]
        if (kind and tok[0] != kind) or (value is not None and tok[1] != value):
            raise DumpFileError(f"{where}: unreadable .npy header {text.strip()[:80]!r}")
        i += 1
        return tok

    take("p", "{")
    header: dict = {}
    while True:
        if toks[i:i + 1] == [("p", "}")]:
            i += 1
            break
        key = take("str")[1]
        take("p", ":")
        kind, val = toks[i] if i < len(toks) else ("end", None)
        if kind == "p" and val == "(":
            i += 1
            dims: list[int] = []
            while toks[i:i + 1] != [("p", ")")]:
                dims.append(take("int")[1])
                if toks[i:i + 1] == [("p", ",")]:
                    i += 1
                elif toks[i:i + 1] != [("p", ")")]:
                    take("p", ")")  # raises: neither ',' nor ')'
            i += 1
            header[key] = tuple(dims)
        elif kind == "p" and val == "[":
            raise DumpFileError(f"{where}: structured dtype in .npy header is not a tensor")
        elif kind in ("str", "val", "int"):
            i += 1
            header[key] = val
        else:
            take("str")  # raises
        if toks[i:i + 1] == [("p", ",")]:
            i += 1
        elif toks[i:i + 1] != [("p", "}")]:
            take("p", "}")  # raises
    if i != len(toks):
        raise DumpFileError(f"{where}: unreadable .npy header (text after the dict)")
    return header


# Parsed header dicts by header text: a dump repeats a few headers (dtype, shape) over
# thousands of files, and the strict parser costs about a third of reading a tiny file.
_HEADERS: dict[str, dict] = {}


def _parse_header(raw: bytes | memoryview, where: str) -> tuple[dict, int]:
    if len(raw) < 10 or bytes(raw[:6]) != MAGIC:
        raise DumpFileError(f"{where}: not an .npy file (missing \\x93NUMPY magic)")
    major = raw[6]
    if major == 1:
        hlen, start = int.from_bytes(raw[8:10], "little"), 10
    elif major in (2, 3):
        if len(raw) < 12:
            raise DumpFileError(f"{where}: truncated .npy header")
        hlen, start = int.from_bytes(raw[8:12], "little"), 12
    else:
        raise DumpFileError(f"{where}: unsupported .npy format version {major}")
    if hlen > MAX_HEADER_BYTES:
        raise DumpFileError(f"{where}: .npy header of {hlen} bytes (more than {MAX_HEADER_BYTES}); refused")
    if start + hlen > len(raw):
        raise DumpFileError(
            f"{where}: truncated .npy header ({len(raw)} bytes, header needs {start + hlen})"
        )
    text = bytes(raw[start : start + hlen]).decode("utf-8" if major == 3 else "latin1", errors="replace")
    cached = _HEADERS.get(text)
    if cached is None:
        cached = _header_dict(text, where)  # raises for a bad header (never cached)
        if len(_HEADERS) >= 4096:
            _HEADERS.clear()
        _HEADERS[text] = cached
    header = dict(cached)
    if not {"descr", "shape"} <= header.keys():
        raise DumpFileError(f"{where}: .npy header lacks descr/shape: {text.strip()[:80]!r}")
    shape = header["shape"]
    if not isinstance(shape, tuple) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise DumpFileError(f"{where}: bad shape {shape!r} in .npy header")
    if len(shape) > 64:  # numpy's NPY_MAXDIMS
        raise DumpFileError(f"{where}: {len(shape)} dimensions in .npy header (numpy allows 64)")
    if not isinstance(header.get("fortran_order", False), bool):
        raise DumpFileError(f"{where}: bad fortran_order {header['fortran_order']!r} in .npy header")
    return header, start + hlen


def _header_dtype(descr, where: str) -> np.dtype:
    if not isinstance(descr, str):
        raise DumpFileError(f"{where}: structured dtype {descr!r} is not a tensor")
    if descr in ("<E2", "E2"):  # MindSpore's bfloat16 spelling
        return BFLOAT16
    try:
        dtype = np.dtype(descr)
    except (TypeError, ValueError, OverflowError, SyntaxError) as exc:  # numpy parses descr strings
        raise DumpFileError(f"{where}: unknown dtype descriptor {descr!r}") from exc
    if dtype.hasobject or dtype.kind in "OVSUMm":
        raise DumpFileError(f"{where}: dtype {descr!r} is not a numeric tensor")
    if dtype.kind in "fc" and dtype.itemsize > {"f": 8, "c": 16}[dtype.kind]:
        # x86 long double (float128 / complex256): no framework dumps it, and neither the
        # float64 statistics nor the catalog's dtype names hold it (issue 30, item 8)
        raise DumpFileError(f"{where}: dtype {dtype.name} ({descr!r}, long double) is not a tensor dtype "
                            "dumps write; refused")
    return dtype


def parse_npy(raw: bytes | memoryview, where: str) -> NpyTensor:
    """Parse the bytes of an ``.npy`` file (see module docstring for the rules).

    ``where`` names the file in error messages. Raises :class:`DumpFileError`
    for a missing magic, unreadable header, unknown or object dtype, or a
    payload whose size does not match the header (truncated or lying).
    """
    header, data_offset = _parse_header(raw, where)
    descr = header["descr"]
    dtype = _header_dtype(descr, where)
    shape = header["shape"]
    count = math.prod(shape)
    payload = len(raw) - data_offset
    expected = count * dtype.itemsize
    note = None
    if payload != expected:
        if dtype == np.float16 and payload == 2 * expected:
            # MindSpore CPU quirk (corpus d2_compare_fp16_bf16): header '<f2',
            # payload float32. Keep what the bytes are.
            dtype = np.dtype("<f4")
            note = (
                f"header says float16 ('{descr}') but the payload holds float32 "
                f"({payload} bytes = 4 x {count}); stored as float32"
            )
        elif payload < expected:
            raise DumpFileError(
                f"{where}: truncated: payload is {payload} bytes, header "
                f"({descr}, shape {shape}) needs {expected}"
            )
        else:
            raise DumpFileError(
                f"{where}: payload is {payload} bytes but header ({descr}, shape "
                f"{shape}) describes {expected}; header and data disagree"
            )
    array = np.frombuffer(raw, dtype=dtype, count=count, offset=data_offset)
    if header.get("fortran_order"):
        array = np.ascontiguousarray(array.reshape(shape, order="F"))
    else:
        array = array.reshape(shape)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
        note = (note + "; " if note else "") + "big-endian payload stored little-endian"
    return NpyTensor(array=array, header_descr=str(descr), note=note)


def read_npy(path: str, where: str | None = None) -> NpyTensor:
    """Read one ``.npy`` file (never modifies it; works on 0400 files).

    Raises :class:`DumpFileError` (message starts with ``where`` or the path)
    for an unreadable or non-regular file (FIFO, device, socket; a symlink out of
    the dump during an ingest) or any problem :func:`parse_npy` finds.
    """
    where = where or path
    # Regular files only, never more than the file's size (dumpdb.dumpio): a FIFO or
    # a symlink to /dev/zero named .npy is refused instead of blocking or filling memory.
    buffer = current_read_buffer()
    if buffer is not None:  # an ingest's reader thread: into its reused memory (dumpio.ReadBuffer)
        return parse_npy(read_dump_into(path, where, buffer), where)
    return parse_npy(read_dump_bytes(path, where), where)


def read_npy_declared(path: str, where: str, declared: str | None) -> NpyTensor:
    """:func:`read_npy`, plus a note when the dtype the dump's file name declares
    (``declared``, e.g. ``BFloat16``, ``torch.float32``) differs from the payload's.

    MindSpore saves bfloat16 as float32 in some versions (seed 001, 注意事项:
    "bfloat16类型的算子保存到npy文件时，会转换成float32类型"); the float16-header
    quirk already carries its own note, which then stands alone.
    """
    from dumpdb.dtypes import dtype_name, from_dump_name

    t = read_npy(path, where=where)
    expected = from_dump_name(declared)
    if expected is None or expected == t.array.dtype or t.note and "float32" in t.note:
        return t
    mismatch = f"file name declares {declared}, payload is {dtype_name(t.array.dtype)}"
    return NpyTensor(t.array, t.header_descr, "; ".join(n for n in (t.note, mismatch) if n))
