"""The tensor store: a Zarr v3 hierarchy (``tensors.zarr``) of packed arrays.

Layout (reference performance.md d. and tools-and-storage.md B.4: one Zarr
array per tensor costs ~2.7 ms + ~3 ms per chunk, so tensors are packed):

``packs/{dtype}/{pack_id}``
    1-D arrays holding many tensors' payloads back to back (one per dtype per
    flush, about ``pack_bytes`` each), zstd level 1, inner chunks of 1 MiB,
    one shard per pack: one ``zarr.json`` + one shard file per pack.
``large/{hh}/{content_hash}-{id}``
    one array per tensor of at least ``large_bytes``, in its own shape and
    dtype, chunked along the leading dimensions (~4 MiB chunks) in one shard.

The catalog's ``blobs`` table maps a content hash to ``(array_path,
elem_offset, elem_count)``; a repeated payload is stored once. Array names are
unique per write (time + random id), so concurrent ingests never write the same
array, and a crash leaves at worst an unreferenced array (no partial tensor is
ever referenced: the catalog commit comes after the write).

bfloat16 is stored as uint16 bit patterns (Zarr 3.1 has no bfloat16); every
payload reads back bit for bit.
"""

from __future__ import annotations

import json
import math
import os
import threading
import uuid
from collections import OrderedDict, deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import numcodecs
import numpy as np
import zarr
import zarr.codecs
import zarr.storage

from dumpdb.dtypes import storage_dtype
from dumpdb.storage.shard import (
    EMPTY_CHUNK,
    encode_chunks,
    file_checksum,
    fsync_dir,
    fsync_tree,
    read_shard_index,
    write_shard,
)

PACK_BYTES = 64 << 20
LARGE_BYTES = 16 << 20
INNER_CHUNK_BYTES = 1 << 20
LARGE_CHUNK_BYTES = 4 << 20
ZSTD_LEVEL = 1


@dataclass(frozen=True)
class BlobLocation:
    """Where one payload lives. ``array_path`` None means an empty payload."""

    content_hash: str
    nbytes: int
    array_path: str | None
    elem_offset: int | None
    elem_count: int
    stored_bytes: int


@dataclass(frozen=True)
class ArrayInfo:
    """One Zarr array written by a :class:`StoreWriter` (a row of ``arrays``)."""

    array_path: str
    kind: str
    dtype: str
    shape: tuple[int, ...]
    stored_bytes: int
    checksum: str | None = None  # crc32c of the shard file (packs)


def _unique_id() -> str:
    return datetime.now().strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:10]


def _dir_bytes(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(dirpath, f))
            except OSError:
                pass
    return total


def large_chunks(shape: tuple[int, ...], itemsize: int, target: int = LARGE_CHUNK_BYTES) -> tuple[int, ...]:
    """Chunk shape for a large tensor: whole trailing dims, split the leading ones.

    The first dimension ``i`` whose trailing block fits in ``target`` bytes is
    cut into runs of ``target // block`` rows; dims before it get chunk 1. So
    ``x[k]`` slices read only the chunks they need.
    """
    if not shape:
        return ()
    for i in range(len(shape)):
        block = math.prod(shape[i + 1 :]) * itemsize
        if block <= target:
            rows = max(1, min(shape[i], target // max(block, 1)))
            return (1,) * i + (rows,) + tuple(shape[i + 1 :])
    return (1,) * len(shape)  # unreachable: the last block is one item


class _PackMeta:
    """What reading a pack needs from its ``zarr.json``: dtype, inner chunk, shard index."""

    def __init__(self, root: Path, array_path: str):
        meta = json.loads((root / array_path / "zarr.json").read_text())
        sharding = meta["codecs"][0]
        if sharding["name"] != "sharding_indexed" or len(meta["shape"]) != 1:
            raise ValueError(f"{array_path}: not a 1-D sharded pack")
        inner = sharding["configuration"]
        codecs = [c["name"] for c in inner["codecs"]]
        if codecs != ["bytes", "zstd"] or inner.get("index_location", "end") != "end" or \
                [c["name"] for c in inner["index_codecs"]] != ["bytes", "crc32c"]:
            raise ValueError(f"{array_path}: pack codecs {codecs} not the ones dumpdb writes")
        data_type = meta["data_type"]
        self.dtype = np.dtype(np.bool_) if data_type == "bool" else np.dtype(data_type).newbyteorder("<")
        self.chunk = int(inner["chunk_shape"][0])
        self.shard = int(meta["chunk_grid"]["configuration"]["chunk_shape"][0])
        self.size = int(meta["shape"][0])
        self.path = root / array_path / "c" / "0"
        with open(self.path, "rb") as f:
            self.index = read_shard_index(f, self.shard // self.chunk, str(self.path))


class TensorStore:
    """Read access to ``tensors.zarr`` (and the root a :class:`StoreWriter` writes to).

    Pack reads decode only the 1 MiB inner chunks a tensor spans, straight from
    the shard (dumpdb writes the shards itself, see :mod:`dumpdb.storage.shard`), and keep
    recently decoded chunks in a bounded cache (``chunk_cache_bytes``), so a
    stream of neighbouring small tensors decodes each chunk once. Large arrays
    are read through zarr.
    """

    def __init__(self, root: Path, read_only: bool = True, cache_size: int = 64,
                 chunk_cache_bytes: int = 64 << 20):
        self.root = Path(root)
        self.zstore = zarr.storage.LocalStore(str(self.root), read_only=read_only)
        self._arrays: OrderedDict[str, zarr.Array] = OrderedDict()
        self._cache_size = cache_size
        self._packs: OrderedDict[str, _PackMeta] = OrderedDict()
        self._chunks: OrderedDict[tuple[str, int], np.ndarray] = OrderedDict()
        self._chunk_bytes = 0
        self._chunk_cache_limit = chunk_cache_bytes
        self._lock = threading.Lock()
        self._zstd = numcodecs.Zstd()
        zarr.config.set({"threading.max_workers": os.cpu_count() or 2})

    def _pack(self, array_path: str) -> _PackMeta:
        with self._lock:
            meta = self._packs.get(array_path)
            if meta is not None:
                self._packs.move_to_end(array_path)
                return meta
        meta = _PackMeta(self.root, array_path)
        with self._lock:
            self._packs[array_path] = meta
            if len(self._packs) > self._cache_size:
                self._packs.popitem(last=False)
        return meta

    def _chunk(self, array_path: str, meta: _PackMeta, i: int) -> np.ndarray:
        key = (array_path, i)
        with self._lock:
            data = self._chunks.get(key)
            if data is not None:
                self._chunks.move_to_end(key)
                return data
        offset, nbytes = (int(v) for v in meta.index[i])
        if offset == EMPTY_CHUNK:
            data = np.zeros(meta.chunk, dtype=meta.dtype)
        else:
            with open(meta.path, "rb") as f:
                f.seek(offset)
                frame = f.read(nbytes)
            data = np.frombuffer(self._zstd.decode(frame), dtype=meta.dtype)
            if data.size != meta.chunk:
                raise ValueError(f"{meta.path}: chunk {i} decodes to {data.size} elements, not {meta.chunk}")
        with self._lock:
            self._chunks[key] = data
            self._chunk_bytes += data.nbytes
            while self._chunk_bytes > self._chunk_cache_limit and len(self._chunks) > 1:
                _, old = self._chunks.popitem(last=False)
                self._chunk_bytes -= old.nbytes
        return data

    def read_pack_range(self, array_path: str, start: int, count: int) -> np.ndarray:
        """Elements ``[start, start + count)`` of a pack, in the pack's dtype."""
        meta = self._pack(array_path)
        if start < 0 or start + count > meta.size:
            raise ValueError(f"{array_path}: range {start}+{count} outside the pack ({meta.size} elements)")
        if count == 0:
            return np.empty(0, dtype=meta.dtype)
        first, last = start // meta.chunk, (start + count - 1) // meta.chunk
        if first == last:
            lo = start - first * meta.chunk
            return self._chunk(array_path, meta, first)[lo : lo + count]
        out = np.empty(count, dtype=meta.dtype)
        pos = 0
        for i in range(first, last + 1):
            chunk = self._chunk(array_path, meta, i)
            lo = max(start - i * meta.chunk, 0)
            hi = min(start + count - i * meta.chunk, meta.chunk)
            out[pos : pos + hi - lo] = chunk[lo:hi]
            pos += hi - lo
        return out

    @staticmethod
    def create(root: Path) -> None:
        """Create an empty store with its root group."""
        store = zarr.storage.LocalStore(str(root), read_only=False)
        zarr.create_group(store, attributes={"dumpdb": {"kind": "tensor-store", "layout": 1}})

    def array(self, path: str) -> zarr.Array:
        """Open (and cache) the Zarr array at ``path`` inside the store."""
        arr = self._arrays.get(path)
        if arr is None:
            arr = zarr.open_array(self.zstore, path=path, mode="r")
            self._arrays[path] = arr
            if len(self._arrays) > self._cache_size:
                self._arrays.popitem(last=False)
        else:
            self._arrays.move_to_end(path)
        return arr

    def read(self, array_path: str | None, elem_offset: int | None, elem_count: int,
             dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        """Payload of one tensor as ``dtype`` with ``shape`` (a new, writable array).

        ``dtype`` is the logical dtype (``ml_dtypes.bfloat16`` allowed).
        Raises ValueError if the stored byte count does not fit dtype x shape.
        """
        dtype = np.dtype(dtype)
        if array_path is None:
            return np.zeros(shape, dtype=dtype)
        if elem_offset is None:
            data = np.asarray(self.array(array_path)[...])
        else:
            data = self.read_pack_range(array_path, elem_offset, elem_count)
        want = storage_dtype(dtype)
        if data.dtype != want or data.shape != tuple(shape):
            data = np.ascontiguousarray(data).reshape(-1).view(np.uint8).view(want)
        if want != dtype:
            data = data.view(dtype)
        # a new, writable array: never a view into the chunk cache
        return np.array(data.reshape(shape), copy=True)


@dataclass
class _PackBuffer:
    dtype: np.dtype
    parts: list[tuple[str, np.ndarray]] = field(default_factory=list)
    nbytes: int = 0


_Written = tuple[list[BlobLocation], ArrayInfo]


class StoreWriter:
    """Writes payloads into the store: buffers small ones into packs per dtype,
    gives large ones their own array.

    Writing (compression + files) happens on a background thread so reading
    the dump goes on meanwhile; at most ``max_inflight`` writes are queued
    (back-pressure bounds memory to about that many packs).

    :meth:`add`, :meth:`poll` and :meth:`flush` return the
    :class:`BlobLocation` of every payload that has become durable (written)
    since the last call, in write order; the ingest pipeline commits catalog
    rows only for those. :meth:`take_arrays` returns the arrays written since
    it was last called. A write error (e.g. disk full) is raised by the call
    that collects it.
    """

    def __init__(self, store: TensorStore, pack_bytes: int | None = None, large_bytes: int | None = None,
                 max_inflight: int = 2):
        self.store = store
        # Module constants are read here, not bound as defaults, so tests and
        # benchmarks can change them.
        self.pack_bytes = pack_bytes or PACK_BYTES
        self.large_bytes = large_bytes or LARGE_BYTES
        self.max_inflight = max(1, max_inflight)
        self._buffers: dict[str, _PackBuffer] = {}
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dumpdb-write")
        self._codec_pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 2, thread_name_prefix="dumpdb-zstd")
        self._inflight: deque[Future[_Written]] = deque()
        self._arrays: list[ArrayInfo] = []
        self.bytes_written = 0

    @property
    def buffered_bytes(self) -> int:
        return sum(b.nbytes for b in self._buffers.values())

    def add(self, content_hash: str, payload: np.ndarray) -> list[BlobLocation]:
        """Queue one payload (any shape/dtype). Returns newly durable locations."""
        nbytes = payload.nbytes
        if nbytes == 0:
            return [BlobLocation(content_hash, 0, None, None, 0, 0)] + self.poll()
        sdtype = storage_dtype(payload.dtype)
        flat = np.ascontiguousarray(payload).reshape(-1).view(sdtype)
        if nbytes >= self.large_bytes:
            return self._submit(self._write_large, content_hash, flat.reshape(payload.shape))
        key = sdtype.str
        buf = self._buffers.setdefault(key, _PackBuffer(sdtype))
        buf.parts.append((content_hash, flat))
        buf.nbytes += nbytes
        if buf.nbytes >= self.pack_bytes:
            return self._submit(self._write_pack, self._buffers.pop(key))
        return self.poll()

    def poll(self) -> list[BlobLocation]:
        """Locations of writes finished so far (non-blocking)."""
        done: list[BlobLocation] = []
        while self._inflight and self._inflight[0].done():
            done.extend(self._collect(self._inflight.popleft()))
        return done

    def flush(self) -> list[BlobLocation]:
        """Write every buffered pack and wait for all writes. Returns their locations."""
        for key in list(self._buffers):
            self._inflight.append(self._pool.submit(self._write_pack, self._buffers.pop(key)))
        done: list[BlobLocation] = []
        while self._inflight:
            done.extend(self._collect(self._inflight.popleft()))
        return done

    def close(self) -> None:
        """Stop the writer threads (after waiting for queued writes)."""
        self._pool.shutdown(wait=True)
        self._codec_pool.shutdown(wait=True)

    def take_arrays(self) -> list[ArrayInfo]:
        taken, self._arrays = self._arrays, []
        return taken

    def _submit(self, fn, *args) -> list[BlobLocation]:
        done: list[BlobLocation] = []
        while len(self._inflight) >= self.max_inflight:  # back-pressure
            done.extend(self._collect(self._inflight.popleft()))
        self._inflight.append(self._pool.submit(fn, *args))
        return done + self.poll()

    def _collect(self, future: Future[_Written]) -> list[BlobLocation]:
        locations, info = future.result()
        self._arrays.append(info)
        self.bytes_written += info.stored_bytes
        return locations

    def _create(self, name: str, data: np.ndarray, chunks, shards, kind: str, write: bool = True,
                **attrs) -> zarr.Array:
        arr = zarr.create_array(
            self.store.zstore, name=name, shape=data.shape, dtype=data.dtype, chunks=chunks,
            shards=shards, compressors=zarr.codecs.ZstdCodec(level=ZSTD_LEVEL), fill_value=0,
            attributes={"dumpdb": {"kind": kind, **attrs}},
            # Every chunk is written: no scan for fill-value chunks (measured: ~25 % of
            # write time) and nothing depends on how a fill value compares (-0.0, NaN).
            config={"write_empty_chunks": True},
        )
        if write:
            arr[...] = data
        return arr

    def _write_pack(self, buf: _PackBuffer) -> _Written:
        data = np.concatenate([p for _, p in buf.parts]) if len(buf.parts) > 1 else buf.parts[0][1]
        n = data.size
        chunk = min(n, max(1, INNER_CHUNK_BYTES // buf.dtype.itemsize))
        name = f"packs/{_dtype_dir(buf.dtype)}/{_unique_id()}"
        # zarr writes the metadata; the one shard is encoded here (see dumpdb.storage.shard).
        self._create(name, data, (chunk,), (math.ceil(n / chunk) * chunk,), "pack", write=False)
        frames = encode_chunks(data, chunk, ZSTD_LEVEL, self._codec_pool)
        _, checksum = write_shard(str(self.store.root / name / "c" / "0"), frames)
        fsync_tree(str(self.store.root / name))  # zarr.json too: durable before the catalog commit
        fsync_dir(str((self.store.root / name).parent))
        stored = _dir_bytes(self.store.root / name)
        locations = []
        offset = 0
        for content_hash, part in buf.parts:
            share = round(stored * part.nbytes / data.nbytes) if data.nbytes else 0
            locations.append(BlobLocation(content_hash, part.nbytes, name, offset, part.size, share))
            offset += part.size
        return locations, ArrayInfo(name, "pack", buf.dtype.name, (n,), stored, checksum)

    def _write_large(self, content_hash: str, payload: np.ndarray) -> _Written:
        name = f"large/{content_hash[:2]}/{content_hash}-{_unique_id()}"
        chunks = large_chunks(payload.shape, payload.dtype.itemsize)
        shards = tuple(math.ceil(s / c) * c for s, c in zip(payload.shape, chunks)) if chunks else None
        self._create(name, payload, chunks or None, shards, "tensor", content_hash=content_hash)
        fsync_tree(str(self.store.root / name))
        fsync_dir(str((self.store.root / name).parent))
        stored = _dir_bytes(self.store.root / name)
        location = BlobLocation(content_hash, payload.nbytes, name, None, payload.size, stored)
        shard = self.store.root / name / "c" / ("/".join(["0"] * payload.ndim) if payload.ndim else "0")
        checksum = file_checksum(str(shard)) if shard.is_file() else None
        return [location], ArrayInfo(name, "tensor", payload.dtype.name, payload.shape, stored, checksum)


def _dtype_dir(dtype: np.dtype) -> str:
    return "bool" if dtype.kind == "b" else dtype.name
