"""Encoding pack shards directly, in the Zarr v3 ``sharding_indexed`` format.

Why: zarr-python's write path costs about 1 CPU-second per GB on top of zstd
itself (per-chunk event-loop round trips, buffer copies; measured with py-spy on
``scripts/bench_ingest.py``). For the 1-D pack arrays dumpdb writes whole shards
of a known layout, so it encodes them itself and lets zarr write the metadata and
do all reading. The bytes are exactly what the codec chain in the array's
``zarr.json`` describes (zarr-specs, sharding-indexed codec v1.0):

* inner chunks: the ``bytes`` codec (little-endian, C order) then ``zstd``; the
  last chunk is padded with the fill value (0) to the full chunk shape;
* the chunks back to back from offset 0, in chunk order;
* at the end (``index_location: end``) the index: ``(chunks, 2)`` little-endian
  uint64 ``(offset, nbytes)`` pairs, followed by the ``crc32c`` of the index bytes
  as a little-endian uint32 (``index_codecs: [bytes, crc32c]``).

Tests read every shard back through zarr and compare bit for bit.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import google_crc32c
import numcodecs
import numpy as np


def encode_chunks(data: np.ndarray, chunk: int, level: int, pool: ThreadPoolExecutor | None = None) -> list[bytes]:
    """zstd frames of ``data`` (1-D, little-endian) cut into ``chunk``-element pieces.

    The last piece is zero-padded to ``chunk`` elements. Compression runs on
    ``pool`` when given (numcodecs releases the GIL while compressing).
    """
    codec = numcodecs.Zstd(level=level)
    n = data.size
    pieces = [data[i : i + chunk] for i in range(0, n, chunk)]
    if pieces and pieces[-1].size < chunk:
        last = np.zeros(chunk, dtype=data.dtype)
        last[: pieces[-1].size] = pieces[-1]
        pieces[-1] = last
    encode = lambda piece: codec.encode(np.ascontiguousarray(piece))  # noqa: E731
    if pool is None or len(pieces) < 2:
        return [bytes(encode(p)) for p in pieces]
    return [bytes(b) for b in pool.map(encode, pieces)]


def shard_index(frames: list[bytes]) -> bytes:
    """The shard index for ``frames`` laid out back to back from offset 0:
    ``(n, 2)`` little-endian uint64 (offset, nbytes), then its crc32c (LE uint32).

    Vectorised on purpose: a per-frame Python loop here waits for the GIL at
    every step while reader threads run (measured: seconds per GB).
    """
    lengths = np.fromiter(map(len, frames), dtype="<u8", count=len(frames))
    index = np.empty((len(frames), 2), dtype="<u8")
    index[:, 1] = lengths
    index[:, 0] = np.cumsum(lengths) - lengths
    index_bytes = index.tobytes()
    return index_bytes + np.array([google_crc32c.value(index_bytes)], dtype="<u4").tobytes()


def file_checksum(path: str) -> str:
    """``crc32c:<hex>`` of a file's bytes (the shard checksum ``dumpdb verify`` compares)."""
    crc = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            crc = google_crc32c.extend(crc, block)
    return f"crc32c:{crc:08x}"


def write_shard(path: str, frames: list[bytes]) -> tuple[int, str]:
    """Write a shard (frames, then :func:`shard_index`) to ``path`` atomically:
    through a temporary file and a rename, so a crash never leaves a half-written
    shard under the final name. Returns (bytes written, ``crc32c:<hex>`` of them)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    index = shard_index(frames)
    crc = 0
    for frame in frames:
        crc = google_crc32c.extend(crc, frame)
    crc = google_crc32c.extend(crc, index)
    with open(tmp, "wb") as f:
        f.writelines(frames)
        f.write(index)
        f.flush()
        os.fsync(f.fileno())  # the catalog commit that follows must never outlive the bytes
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path))
    return sum(map(len, frames)) + len(index), f"crc32c:{crc:08x}"


def fsync_dir(path: str) -> None:
    """Make a directory's entries (a rename, a new file) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: str) -> None:
    """fsync every file under ``path`` and every directory (zarr-written arrays)."""
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(dirpath)


EMPTY_CHUNK = 2**64 - 1  # index entry (offset, nbytes) of a chunk never written


def read_shard_index(f, n_chunks: int, where: str) -> np.ndarray:
    """The ``(n_chunks, 2)`` (offset, nbytes) index at the end of an open shard file.

    Raises ValueError (naming ``where``) if the file is too short or the index
    checksum does not match (a damaged shard).
    """
    size = 16 * n_chunks + 4
    f.seek(0, os.SEEK_END)
    if f.tell() < size:
        raise ValueError(f"{where}: shard too short for its index ({f.tell()} bytes)")
    f.seek(-size, os.SEEK_END)
    raw = f.read(size)
    index_bytes, checksum = raw[:-4], int.from_bytes(raw[-4:], "little")
    if google_crc32c.value(index_bytes) != checksum:
        raise ValueError(f"{where}: shard index checksum mismatch (damaged file)")
    return np.frombuffer(index_bytes, dtype="<u8").reshape(n_chunks, 2)
