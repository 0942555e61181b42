"""Encoding pack shards directly, in the Zarr v3 ``sharding_indexed`` format.

Why: zarr-python's write path adds per-chunk event-loop round trips and buffer copies
to zstd's own cost (``docs/storage-design.md``, "Shards"). For the 1-D pack arrays dumpdb writes whole shards
of a known layout, so it encodes them itself and lets zarr write the metadata and
do all reading. The bytes are exactly what the codec chain in the array's
``zarr.json`` describes (zarr-specs, sharding-indexed codec v1.0):

* inner chunks: the ``bytes`` codec (little-endian, C order) then ``zstd`` or
  ``blosc`` (:mod:`dumpdb.storage.codecs` chooses per dtype); the
  last chunk is padded with the fill value (0) to the full chunk shape;
* the chunks back to back from offset 0, in chunk order;
* at the end (``index_location: end``) the index: ``(chunks, 2)`` little-endian
  uint64 ``(offset, nbytes)`` pairs, followed by the ``crc32c`` of the index bytes
  as a little-endian uint32 (``index_codecs: [bytes, crc32c]``).

Tests read every shard back through zarr and compare bit for bit. A shard is
written as one whole object through the store facade (:mod:`dumpdb.storage.objects`),
never appended to or renamed by this module.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, NamedTuple

import google_crc32c
import numcodecs
import numpy as np

if TYPE_CHECKING:
    from dumpdb.storage.objects import ObjectStore


def encode_chunks(data: np.ndarray, chunk: int, codec: int | numcodecs.abc.Codec,
                  pool: ThreadPoolExecutor | None = None) -> list[bytes]:
    """Compressed frames of ``data`` (1-D, little-endian) cut into ``chunk``-element pieces.

    ``codec``: the numcodecs codec of the array's inner chain (an int: zstd at that level,
    what packs used before :mod:`dumpdb.storage.codecs`). The last piece is zero-padded to
    ``chunk`` elements. Compression runs on ``pool`` when given (numcodecs releases the
    GIL while compressing).
    """
    enc = numcodecs.Zstd(level=codec) if isinstance(codec, int) else codec
    n = data.size
    pieces = [data[i : i + chunk] for i in range(0, n, chunk)]
    if pieces and pieces[-1].size < chunk:
        last = np.zeros(chunk, dtype=data.dtype)
        last[: pieces[-1].size] = pieces[-1]
        pieces[-1] = last
    encode = lambda piece: enc.encode(np.ascontiguousarray(piece))  # noqa: E731
    if pool is None or len(pieces) < 2:
        return [bytes(encode(p)) for p in pieces]
    return [bytes(b) for b in pool.map(encode, pieces)]


def shard_index(frames: list[bytes]) -> bytes:
    """The shard index for ``frames`` laid out back to back from offset 0:
    ``(n, 2)`` little-endian uint64 (offset, nbytes), then its crc32c (LE uint32).

    Vectorised on purpose: a per-frame Python loop here waits for the GIL at
    every step while reader threads run.
    """
    lengths = np.fromiter(map(len, frames), dtype="<u8", count=len(frames))
    index = np.empty((len(frames), 2), dtype="<u8")
    index[:, 1] = lengths
    index[:, 0] = np.cumsum(lengths) - lengths
    index_bytes = index.tobytes()
    return index_bytes + np.array([google_crc32c.value(index_bytes)], dtype="<u4").tobytes()


class ShardTarget(NamedTuple):
    """Where a shard goes: an object ``key`` of the store ``objects``."""

    objects: ObjectStore
    key: str

    def __str__(self) -> str:
        return self.objects.where(self.key)


def write_shard(target: ShardTarget, frames: list[bytes]) -> tuple[int, str]:
    """Write a shard (frames, then :func:`shard_index`) as the object ``target``, whole:
    durable and visible only once complete (the store's promise, see
    :mod:`dumpdb.storage.local`). Returns (bytes written, ``crc32c:<hex>`` of them)."""
    index = shard_index(frames)
    crc = 0
    for frame in frames:
        crc = google_crc32c.extend(crc, frame)
    crc = google_crc32c.extend(crc, index)
    written = target.objects.set(target.key, [*frames, index])
    return written, f"crc32c:{crc:08x}"


EMPTY_CHUNK = 2**64 - 1  # index entry (offset, nbytes) of a chunk never written


def shard_index_bytes(n_chunks: int) -> int:
    """Size of the index at the end of a shard of ``n_chunks`` chunks."""
    return 16 * n_chunks + 4


def parse_shard_index(raw: bytes | memoryview, n_chunks: int, where: str) -> np.ndarray:
    """The ``(n_chunks, 2)`` (offset, nbytes) index from a shard's last
    :func:`shard_index_bytes` bytes ``raw``.

    Raises ValueError (naming ``where``) if the index checksum does not match (a
    damaged shard).
    """
    index_bytes, checksum = bytes(raw[:-4]), int.from_bytes(raw[-4:], "little")
    if len(raw) != shard_index_bytes(n_chunks) or google_crc32c.value(index_bytes) != checksum:
        raise ValueError(f"{where}: shard index checksum mismatch (damaged file)")
    return np.frombuffer(index_bytes, dtype="<u8").reshape(n_chunks, 2)
