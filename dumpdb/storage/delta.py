"""Delta coding inside a pack: a payload stored as the XOR of an earlier payload of the same pack.

Why: an op's output is often close to one of its inputs (a residual ``Add``, an optimizer's
updated parameter), so ``output XOR input`` is mostly zero bytes in the high byte planes,
which shuffle + zstd then store in less space; the measurements behind the rule are in
``docs/storage-design.md`` ("Delta coding").

The rule (:func:`choose_bases`):

* only in packs (payloads under ``LARGE_BYTES``), only dtypes of 2 or more bytes per item
  (bool, int8, uint8: no delta), only payloads of ``DELTA_MIN_BYTES`` (64 KiB) or more
  (below that the trial costs more than it can save);
* candidate bases: the last ``DELTA_CANDIDATES`` (4) *plain* payloads of the same pack with
  the same element count (dump order puts an op's inputs right before its outputs);
* trial: the first ``DELTA_SAMPLE_BYTES`` (64 KiB) of the payload compressed plain and
  XORed with each candidate, with the pack's codec; the best candidate is taken when its
  sample is at most ``DELTA_MAX_RATIO`` (0.9) of the plain sample, else the payload is
  stored plain. Measured on that dump: 64 KiB samples choose as well as 256 KiB ones
  (559.8 against 559.1 MB) at a quarter of the trial cost; a cheaper pre-filter (skip a
  candidate whose top 16 bits agree in under 25 % of the items) lost most of the gain
  (607 MB: the saving comes from partly equal high bits, not equal ones);
* a base is always plain: one extra ranged read at most (a chain depth of 1), and the base
  lies in the same pack, before the payload.

Because the base is in the same pack (the same shard object, written whole and committed in
the same catalog batch as the payload), a delta payload can never outlive its base: no
ordering rule for commits, and ``gc`` (which deletes a pack only when no live blob names it,
and copies live payloads through the reader, plain) needs nothing new. The content hash
stays the hash of the *plain* payload: dedup, ``verify`` and compare short-cuts are unchanged.

Recorded twice: the pack's ``zarr.json`` attribute ``dumpdb.xor`` lists ``[elem_offset,
elem_count, base_offset]`` per delta payload (what :class:`~dumpdb.storage.store.TensorStore`
reads: any reader of the pack finds it there), and the catalog's ``blobs.base_hash`` names
the base payload (migration 009; NULL = plain). Packs without the attribute (every archive
written before) hold plain payloads only.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from dumpdb.storage.codecs import item_size

DELTA_MIN_BYTES = 64 << 10  # smaller payloads are stored plain
DELTA_SAMPLE_BYTES = 64 << 10  # bytes of a payload compressed to try a base
DELTA_CANDIDATES = 4  # last plain same-size payloads of the pack tried as base
DELTA_MAX_RATIO = 0.9  # a delta is kept when its sample compresses to at most this share of the plain one
# What a pack with delta payloads says about them in its zarr.json (beside the "xor" list).
XOR_MEANS = ("each [elem_offset, elem_count, base_offset] of xor: elements [elem_offset, elem_offset + elem_count) "
             "hold the payload XOR elements [base_offset, base_offset + elem_count) of this pack (stored plain); "
             "XOR them (as bytes) to get the payload")


class XorPart(NamedTuple):
    """One delta payload of a pack: elements ``[offset, offset + elems)`` hold the payload
    XOR elements ``[base_offset, base_offset + elems)`` (plain) of the same pack."""

    offset: int
    elems: int
    base_offset: int


def xor_dtype(dtype: np.dtype) -> np.dtype | None:
    """The unsigned integer dtype payloads of storage dtype ``dtype`` are XORed in (the item
    size the pack's codec shuffles: complex as its two components), None for one-byte dtypes
    (bool, int8, uint8: never delta-coded)."""
    size = item_size(dtype)
    return np.dtype(f"<u{size}") if size in (2, 4, 8) else None


def choose_bases(parts: Sequence[np.ndarray], dtype: np.dtype,
                 compressed_size: Callable[[np.ndarray], int]) -> list[int | None]:
    """For each flat payload of ``parts`` (one pack, storage dtype ``dtype``, in pack order):
    the index of its base in ``parts`` or None (stored plain), by the rule of the module
    docstring. ``compressed_size(array)`` is the bytes the pack's codec makes of ``array``."""
    udtype = xor_dtype(dtype)
    bases: list[int | None] = [None] * len(parts)
    if udtype is None:
        return bases
    recent: dict[int, deque[int]] = defaultdict(lambda: deque(maxlen=DELTA_CANDIDATES))
    sample_items = max(1, DELTA_SAMPLE_BYTES // udtype.itemsize)
    for i, part in enumerate(parts):
        if part.nbytes < DELTA_MIN_BYTES:
            continue
        size = part.nbytes
        cands = recent[size]
        if cands:
            sample = part.view(udtype)[:sample_items]
            limit = DELTA_MAX_RATIO * compressed_size(sample)
            best = None
            for j in reversed(cands):
                got = compressed_size(np.bitwise_xor(sample, parts[j].view(udtype)[:sample_items]))
                if got <= limit and (best is None or got < best[0]):
                    best = (got, j)
            if best is not None:
                bases[i] = best[1]
                continue  # a delta is never a base
        cands.append(i)
    return bases


def encode_into(parts: Sequence[np.ndarray], bases: Sequence[int | None], dtype: np.dtype,
                out: np.ndarray) -> np.ndarray:
    """``parts`` as stored, back to back, written into ``out`` (uint8, exactly their bytes;
    a writer's reused memory): a payload with a base becomes payload XOR base (same dtype).
    Returns the pack's flat array of ``dtype``, a view of ``out``."""
    udtype = xor_dtype(dtype)
    data = out.view(dtype)
    pos = 0
    for i, j in enumerate(bases):
        part = parts[i]
        dest = data[pos : pos + part.size]
        if j is None:
            np.copyto(dest, part.reshape(-1).view(dtype), casting="no")
        else:
            assert udtype is not None and bases[j] is None and parts[j].nbytes == part.nbytes
            np.bitwise_xor(part.view(udtype), parts[j].view(udtype), out=dest.view(udtype))
        pos += part.size
    return data


def to_attribute(parts: Sequence[XorPart]) -> list[list[int]]:
    """``parts`` as the ``dumpdb.xor`` attribute of a pack's ``zarr.json``."""
    return [[p.offset, p.elems, p.base_offset] for p in parts]


def from_attribute(value: Any, size: int, where: str) -> list[XorPart]:
    """The delta payloads a pack's ``dumpdb.xor`` attribute lists (None: none), sorted by
    offset. Raises ValueError naming ``where`` for anything dumpdb does not write: not a list
    of ``[offset, count, base_offset]`` integers, a range outside the pack's ``size``
    elements, a base not wholly before its payload, a base that is itself a delta payload
    (dumpdb's bases are plain: a read XORs once), or overlapping payloads."""
    if value is None:
        return []
    try:
        parts = sorted(XorPart(*(int(v) for v in item)) for item in value
                       if len(item) == 3 and all(isinstance(v, int) and not isinstance(v, bool) for v in item))
    except TypeError as exc:
        raise ValueError(f"{where}: attribute dumpdb.xor is not a list of [offset, count, base_offset]") from exc
    if len(parts) != len(value):
        raise ValueError(f"{where}: attribute dumpdb.xor is not a list of [offset, count, base_offset] integers")
    end = 0
    for p in parts:
        if p.elems <= 0 or p.offset < end or p.offset + p.elems > size or p.base_offset < 0 \
                or p.base_offset + p.elems > p.offset:
            raise ValueError(f"{where}: attribute dumpdb.xor entry {list(p)} is not a delta dumpdb writes "
                             f"(pack of {size} elements)")
        end = p.offset + p.elems
    table = XorTable(parts)
    for p in parts:
        if table.overlaps(p.base_offset, p.elems):
            raise ValueError(f"{where}: attribute dumpdb.xor entry {list(p)} has a base that is itself a delta "
                             "payload (dumpdb writes plain bases only)")
    return parts


class XorTable:
    """The delta payloads of one pack (from :func:`from_attribute`), searchable by offset."""

    def __init__(self, parts: list[XorPart]):
        self.parts = parts
        self.offsets = np.array([p.offset for p in parts], dtype=np.int64)

    def __bool__(self) -> bool:
        return bool(self.parts)

    def overlaps(self, start: int, count: int) -> bool:
        """True if a delta payload overlaps elements ``[start, start + count)``."""
        i = int(np.searchsorted(self.offsets, start + count, side="left"))  # parts starting before the end
        return i > 0 and self.parts[i - 1].offset + self.parts[i - 1].elems > start

    def resolve(self, data: np.ndarray, start: int, read_base: Callable[[int, int], np.ndarray]) -> np.ndarray:
        """Elements ``[start, start + len(data))`` of the pack made plain: every delta payload
        overlapping the range XORed with its base, read by ``read_base(offset, count)`` (plain
        elements of the same pack). ``data`` (a new array) is written in place and returned."""
        udtype = xor_dtype(data.dtype)
        if udtype is None or not self.parts:
            return data
        stop = start + data.size
        flat = data.view(udtype)
        per = data.dtype.itemsize // udtype.itemsize  # XOR items per element (complex: 2)
        i = max(0, int(np.searchsorted(self.offsets, start, side="right")) - 1)
        for p in self.parts[i:]:
            if p.offset >= stop:
                break
            lo, hi = max(start, p.offset), min(stop, p.offset + p.elems)
            if lo >= hi:
                continue
            base = read_base(p.base_offset + lo - p.offset, hi - lo)
            flat[(lo - start) * per : (hi - start) * per] ^= base.view(udtype)
        return data
