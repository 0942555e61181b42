"""The tensor store: a Zarr v3 hierarchy (``tensors.zarr``) of packed arrays.

Layout (reference performance.md d. and tools-and-storage.md B.4: one Zarr
array per tensor costs ~2.7 ms + ~3 ms per chunk, so tensors are packed):

``packs/{dtype}/{pack_id}``
    1-D arrays holding many tensors' payloads back to back (one per dtype per
    flush, about ``pack_bytes`` each), inner chunks of 256 KiB (4 MiB in packs of
    tensors of 256 KiB or more) compressed with the
    dtype's codec (:mod:`dumpdb.storage.codecs`: byte shuffle + zstd-1 for multi-byte
    dtypes, zstd-1 for one-byte ones; older archives: zstd-1 throughout),
    one shard per pack: one ``zarr.json`` + one shard object per pack.
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

All I/O goes through :class:`~dumpdb.storage.objects.ObjectStore` (object keys, not
paths), so the store may be local (:mod:`dumpdb.storage.local`), in memory, or remote.
"""

from __future__ import annotations

import json
import math
import os
import threading
import uuid
from collections import OrderedDict, deque
from concurrent.futures import BrokenExecutor, CancelledError, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numcodecs
import numpy as np
import xxhash

from dumpdb.dtypes import storage_dtype
from dumpdb.errors import PayloadCorrupt, PayloadMissing, StorageError
from dumpdb.storage import backends
from dumpdb.storage import delta as xor_delta
from dumpdb.storage.codecs import (
    COMPRESSORS,
    DEFAULT_COMPRESSOR,
    LARGE_MIN_SAVING,
    REDUNDANT_CHUNK_BYTES,
    REDUNDANT_KEEP,
    REDUNDANT_RATIO,
    Codec,
    check_compressor,
    codec_for,
    frame_decoder,
    redundant_codec,
)
from dumpdb.storage.objects import ObjectStore, configure_zarr, is_transport_error
from dumpdb.storage.shard import (
    EMPTY_CHUNK,
    ShardTarget,
    encode_chunks,
    parse_shard_index,
    shard_index_bytes,
    write_shard,
)
from dumpdb.storage.sizes import INNER_CHUNK_BYTES, LARGE_CHUNK_BYTES, MEDIUM_BYTES, MEDIUM_CHUNK_BYTES

if TYPE_CHECKING:
    import zarr
    from zarr.abc.store import Store

PACK_BYTES = 64 << 20
LARGE_BYTES = 16 << 20
READ_LARGE_BYTES = 4 << 20  # LARGE_BYTES of an lz4 archive (codecs.py: made for reading)
# A large array's chunks are decoded on a thread pool when its shard holds at least this
# many compressed bytes (decoding then costs more than handing chunks to threads).
PARALLEL_DECODE_BYTES = 4 << 20
# A pack payload read spanning several chunks decodes them on the calling thread and the
# decode pool at once when it is at least this many bytes and no other read is in flight
# (TensorStore._fill_chunks; issue 29: one 8 MiB payload spans 2-3 chunks of 4 MiB).
PARALLEL_READ_BYTES = 4 << 20
# A checked read of a large uncompressed array hashes piece k (xxh3-128 streaming, which
# releases the GIL) in a helper thread while piece k+1 is read: the check costs about the
# hash of the last piece instead of the hash of the whole array (issue 30, scripts/bench_read.py)
HASH_PIECE_BYTES = 4 << 20

# What each array says about itself (its zarr.json "attributes"), for a reader without dumpdb.
CATALOG_POINTER = ("the catalog: catalog.duckdb beside this store (an archive) or catalog/*.parquet "
                   "(a bundle; its README.md has a reading recipe)")
DESCRIBE = {
    "tensor-store": {"holds": "tensor payloads of dumpdb: packs/{dtype}/* (many small tensors each), "
                              "large/{hh}/* (one large tensor each)", "catalog": CATALOG_POINTER},
    "pack": {"holds": "payloads of many tensors back to back, flattened, in storage dtype (bfloat16 as "
                      "uint16 bit patterns)",
             "find": "blobs row (content_hash, array_path = this array, elem_offset, elem_count); "
                     "tensors rows with that content_hash give dtype, shape, run, op_name, io, slot",
             "catalog": CATALOG_POINTER},
    "tensor": {"holds": "the payload of one tensor in its own shape, in storage dtype (bfloat16 as uint16 bit "
                        "patterns)",
               "find": "tensors rows whose content_hash is this array's content_hash (dtype, run, op_name, io, "
                       "slot); blobs row array_path = this array", "catalog": CATALOG_POINTER},
}


@dataclass(frozen=True)
class BlobLocation:
    """Where one payload lives. ``array_path`` None means an empty payload."""

    content_hash: str
    nbytes: int
    array_path: str | None
    elem_offset: int | None
    elem_count: int
    stored_bytes: int
    base_hash: str | None = None  # stored as XOR of this payload of the same pack (dumpdb.storage.delta)

    def row(self, first_run: str | None = None) -> dict[str, Any]:
        """This location as a ``blobs`` catalog row."""
        return {"content_hash": self.content_hash, "nbytes": self.nbytes, "array_path": self.array_path,
                "elem_offset": self.elem_offset, "elem_count": self.elem_count,
                "stored_bytes": self.stored_bytes, "first_run": first_run, "base_hash": self.base_hash}


@dataclass(frozen=True)
class ArrayInfo:
    """One Zarr array written by a :class:`StoreWriter` (a row of ``arrays``)."""

    array_path: str
    kind: str
    dtype: str
    shape: tuple[int, ...]
    stored_bytes: int
    checksum: str | None = None  # crc32c of the shard object

    def row(self) -> dict[str, Any]:
        """This array as an ``arrays`` catalog row."""
        return {"array_path": self.array_path, "kind": self.kind, "dtype": self.dtype,
                "shape": list(self.shape), "stored_bytes": self.stored_bytes, "checksum": self.checksum}


def _unique_id() -> str:
    return datetime.now().strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:10]


def payload_hash(data: np.ndarray) -> str:
    """xxh3-128 hex digest of an array's bytes in C order: the content hash that keys
    ``blobs`` (dedup) and that ``verify`` and ``tensor(verify=True)`` recompute."""
    return xxhash.xxh3_128_hexdigest(np.ascontiguousarray(data).reshape(-1).view(np.uint8).data)


def shard_key(array_path: str, ndim: int) -> str:
    """Object key of the one shard of a dumpdb array (packs: 1-D; large: ``ndim``-D)."""
    return f"{array_path}/c/" + "/".join(["0"] * max(ndim, 1))


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


def decode_frame(decoder: numcodecs.abc.Codec | None, frame: Any, where: str, i: int,
                 out: np.ndarray | None = None) -> Any:
    """``decoder.decode(frame, out)`` (``decoder`` None: the frame is the chunk's bytes); a
    frame that does not decode (damaged bytes: zstd and Blosc raise RuntimeError) becomes
    ValueError naming ``where`` and chunk ``i``."""
    if decoder is None:
        if out is None:
            return frame
        dest = out.reshape(-1).view(np.uint8)
        if len(frame) != dest.size:
            raise ValueError(f"{where}: chunk {i} has {len(frame)} bytes, not {dest.size}")
        dest[...] = np.frombuffer(frame, dtype=np.uint8)
        return out
    try:
        return decoder.decode(frame, out=out)
    except (RuntimeError, ValueError) as exc:
        raise ValueError(f"{where}: chunk {i} does not decode ({exc})") from exc


def idle_core() -> bool:
    """True when the 1-minute load average leaves at least one core idle (``os.getloadavg``;
    False where the platform has none): only then do more decoding threads finish sooner."""
    try:
        return os.getloadavg()[0] <= (os.cpu_count() or 1) - 1
    except (AttributeError, OSError):
        return False


def chunk_runs(shape: tuple[int, ...], chunks: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """For an array whose chunks are contiguous in C order (``chunks`` = ones, then one cut
    dimension, then whole trailing dimensions, as :func:`large_chunks` makes them):
    ``(start, count)`` in flat elements of every chunk, in the shard's (C) chunk order.
    ``count`` is less than the chunk's size only for edge chunks (zarr pads them)."""
    nd = len(shape)
    lead = min(next((i for i, c in enumerate(chunks) if c != 1), nd), nd - 1)
    block = math.prod(shape[lead + 1 :])
    rows, n_lead = chunks[lead], math.ceil(shape[lead] / chunks[lead])
    g = np.arange(math.prod(math.ceil(s / c) for s, c in zip(shape, chunks)), dtype=np.int64)
    prefix, b = np.divmod(g, n_lead)
    start = (prefix * shape[lead] + b * rows) * block
    count = np.minimum(rows, shape[lead] - b * rows) * block
    return start, count


class _PackMeta:
    """What reading a pack needs from its ``zarr.json``: dtype, inner chunk, decoder, shard index."""

    def __init__(self, objects: ObjectStore, array_path: str):
        meta = json.loads(bytes(objects.get(f"{array_path}/zarr.json")))
        sharding = meta["codecs"][0]
        if sharding["name"] != "sharding_indexed" or len(meta["shape"]) != 1:
            raise ValueError(f"{array_path}: not a 1-D sharded pack")
        inner = sharding["configuration"]
        if inner.get("index_location", "end") != "end" or \
                [c["name"] for c in inner["index_codecs"]] != ["bytes", "crc32c"]:
            raise ValueError(f"{array_path}: pack shard index not the one dumpdb writes")
        self.decoder = frame_decoder(inner["codecs"], f"{array_path}: pack")
        data_type = meta["data_type"]
        self.dtype = np.dtype(np.bool_) if data_type == "bool" else np.dtype(data_type).newbyteorder("<")
        self.chunk = int(inner["chunk_shape"][0])
        self.shard = int(meta["chunk_grid"]["configuration"]["chunk_shape"][0])
        self.size = int(meta["shape"][0])
        attrs = (meta.get("attributes") or {}).get("dumpdb") or {}
        # delta payloads (dumpdb.storage.delta); packs written before issue 13 have none
        self.xor = xor_delta.XorTable(xor_delta.from_attribute(attrs.get("xor"), self.size, f"{array_path}: pack"))
        self.key = shard_key(array_path, 1)
        n_chunks = self.shard // self.chunk
        raw = objects.get_suffix(self.key, shard_index_bytes(n_chunks))
        self.index = parse_shard_index(raw, n_chunks, objects.where(self.key))


class _LargeMeta:
    """A large array whose chunks can be decoded straight into the result: one shard
    covering the whole array, inner chunks contiguous in C order (whole trailing
    dimensions, as :func:`large_chunks` cuts them), ``bytes`` + ``zstd``/``blosc``.
    ``None`` from :meth:`parse` for anything else (then zarr reads it)."""

    def __init__(self, array_path: str, dtype: np.dtype, shape: tuple[int, ...], chunks: tuple[int, ...],
                 decoder: numcodecs.abc.Codec | None):
        self.array_path = array_path
        self.key = shard_key(array_path, len(shape))
        self.dtype, self.shape, self.chunks, self.decoder = dtype, shape, chunks, decoder
        self.grid = tuple(math.ceil(s / c) for s, c in zip(shape, chunks))
        self.n_chunks = math.prod(self.grid)
        self.chunk_elems = math.prod(chunks)

    @staticmethod
    def parse(array_path: str, meta: dict[str, Any]) -> _LargeMeta | None:
        try:
            shape = tuple(int(s) for s in meta["shape"])
            sharding = meta["codecs"][0]
            if meta.get("zarr_format") != 3 or sharding["name"] != "sharding_indexed" or not shape:
                return None
            shard = tuple(int(s) for s in meta["chunk_grid"]["configuration"]["chunk_shape"])
            inner = sharding["configuration"]
            chunks = tuple(int(c) for c in inner["chunk_shape"])
            if len(shard) != len(shape) or len(chunks) != len(shape) or any(s < n for s, n in zip(shard, shape)) \
                    or any(s % c for s, c in zip(shard, chunks)) or any(s > n + c - 1 for s, n, c in
                                                                     zip(shard, shape, chunks)):
                return None  # more than one shard, or a shard that is not a whole grid of chunks
            if inner.get("index_location", "end") != "end" or \
                    [c["name"] for c in inner["index_codecs"]] != ["bytes", "crc32c"] or meta.get("fill_value") != 0:
                return None
            data_type = meta["data_type"]
            if not isinstance(data_type, str):
                return None
            dtype = np.dtype(np.bool_) if data_type == "bool" else np.dtype(data_type).newbyteorder("<")
            decoder = frame_decoder(inner["codecs"], array_path)
        except (KeyError, TypeError, ValueError, IndexError):
            return None
        lead = next((i for i, c in enumerate(chunks) if c != 1), len(chunks))
        if chunks[lead + 1 :] != shape[lead + 1 :]:
            return None  # a chunk is not one contiguous run of the C-order array
        return _LargeMeta(array_path, dtype, shape, chunks, decoder)


class TensorStore:
    """Read access to ``tensors.zarr`` (and the store a :class:`StoreWriter` writes to).

    ``location`` is a directory (its objects read as its files, without importing zarr:
    :meth:`ObjectStore.local <dumpdb.storage.objects.ObjectStore.local>`; a
    :class:`~dumpdb.storage.local.DurableLocalStore` made for anything else), a URL, or any
    :class:`zarr.abc.store.Store`; every byte goes through :attr:`objects`
    (:class:`~dumpdb.storage.objects.ObjectStore`).

    Pack reads decode only the inner chunks a tensor spans, each one ranged
    ``get`` of the shard (dumpdb writes the shards itself, see
    :mod:`dumpdb.storage.shard`), and keep recently decoded chunks in a bounded
    cache (``chunk_cache_bytes``), so a stream of neighbouring small tensors
    decodes each chunk once. Large arrays are read through zarr, after checking
    that their shard exists (zarr would answer a missing one with fill values).

    Every read given the payload's ``content_hash`` hashes the bytes it returns again
    (xxh3-128, :func:`payload_hash`) and raises PayloadCorrupt naming the pack when they
    differ (issue 30: 4 bytes overwritten in a shard must never come back silently);
    ``verify=False`` (here: the default of every read; or per call) opts out.

    Errors: PayloadMissing when an object is gone, PayloadCorrupt when it is too
    short or its bytes do not hash to the content hash, ValueError when its content
    does not decode (damaged index or frame).
    """

    def __init__(self, location: str | os.PathLike[str] | Store, read_only: bool = True, cache_size: int = 64,
                 chunk_cache_bytes: int = 64 << 20, storage_options: dict[str, Any] | None = None,
                 verify: bool = True):
        self.verify = verify  # default of read/read_many/read_payload: re-hash what they return
        endpoint = None
        if not isinstance(location, (str, os.PathLike)):  # a zarr Store
            configure_zarr()
            zstore: Store = location if location.read_only == read_only or not read_only \
                else location.with_read_only(True)
            self.root: Path | None = getattr(location, "root", None)
            self.capabilities = backends.LOCAL if self.root is not None else backends.Capabilities()
            self.objects = ObjectStore(zstore, str(location))
        elif backends.is_url(location):  # SCHEME://BUCKET/PREFIX (dumpdb.storage.backends)
            configure_zarr()
            zstore = backends.open_store(str(location), storage_options, read_only=read_only)
            self.root = None
            self.capabilities = backends.backend(str(location)).capabilities
            endpoint = backends.endpoint(str(location), storage_options)
            self.objects = ObjectStore(zstore, str(location), endpoint)
        else:  # a directory: read without zarr, its DurableLocalStore made on first need (ObjectStore.local)
            self.root = Path(location)
            self.capabilities = backends.LOCAL
            self.objects = ObjectStore.local(self.root, read_only, str(self.root))
        self._arrays: OrderedDict[str, zarr.Array] = OrderedDict()
        self._cache_size = cache_size
        self._packs: OrderedDict[str, _PackMeta] = OrderedDict()
        self._chunks: OrderedDict[tuple[str, int], np.ndarray] = OrderedDict()
        self._chunk_bytes = 0
        self._chunk_cache_limit = chunk_cache_bytes
        self._decoding: dict[tuple[str, int], Future] = {}  # chunks a thread is decoding now
        self._large_metas: OrderedDict[str, _LargeMeta | None] = OrderedDict()
        self._lock = threading.Lock()
        self._decode_pool: ThreadPoolExecutor | None = None
        self._reading = 0  # multi-chunk pack reads in flight (_fill_chunks)
        self._compressor: str | None = None  # the store's compressor, read on first use
        self._hash_pool: ThreadPoolExecutor | None = None  # hashes a checked large read as it arrives

    def __repr__(self) -> str:
        return f"<TensorStore {self.objects.name}>"

    @property
    def zstore(self) -> Store:
        """The zarr Store underneath (picklable for local stores: worker processes reopen it;
        for a local store made, and zarr imported, on first use: :meth:`ObjectStore.local`)."""
        return self.objects.store

    @property
    def name(self) -> str:
        """How messages name this store (its directory for a local store)."""
        return self.objects.name

    def _pack(self, array_path: str) -> _PackMeta:
        with self._lock:
            meta = self._packs.get(array_path)
            if meta is not None:
                self._packs.move_to_end(array_path)
                return meta
        meta = _PackMeta(self.objects, array_path)
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
            # Another thread decoding this chunk now: wait for its result rather than decode
            # it a second time (compare's two workers read neighbouring payloads at once).
            pending = self._decoding.get(key)
            if pending is None:
                mine: Future = Future()
                self._decoding[key] = mine
        if pending is not None:
            return pending.result()
        try:
            data = self._decode_chunk(meta, i)
        except BaseException as exc:
            with self._lock:
                del self._decoding[key]
            mine.set_exception(exc)
            raise
        with self._lock:
            del self._decoding[key]
            self._chunks[key] = data
            self._chunk_bytes += data.nbytes
            while self._chunk_bytes > self._chunk_cache_limit and len(self._chunks) > 1:
                _, old = self._chunks.popitem(last=False)
                self._chunk_bytes -= old.nbytes
        mine.set_result(data)
        return data

    def _frame(self, meta: _PackMeta, i: int) -> memoryview | None:
        """The stored frame of chunk ``i`` of a pack (one ranged read), None for an empty chunk."""
        offset, nbytes = (int(v) for v in meta.index[i])
        return None if offset == EMPTY_CHUNK else self.objects.get(meta.key, offset, offset + nbytes)

    def _decode_chunk(self, meta: _PackMeta, i: int) -> np.ndarray:
        """Chunk ``i`` of a pack, read and decoded (read-only)."""
        frame = self._frame(meta, i)
        if frame is None:
            return np.zeros(meta.chunk, dtype=meta.dtype)
        data = np.frombuffer(decode_frame(meta.decoder, frame, self.objects.where(meta.key), i), dtype=meta.dtype)
        if data.size != meta.chunk:
            raise ValueError(f"{self.objects.where(meta.key)}: chunk {i} decodes to {data.size} elements, "
                             f"not {meta.chunk}")
        return data

    def read_pack_range(self, array_path: str, start: int, count: int) -> np.ndarray:
        """Elements ``[start, start + count)`` of a pack, in the pack's dtype (may be a
        read-only view of the chunk cache: copy before writing to it)."""
        return self._pack_range(array_path, start, count)[0]

    def _pack_range(self, array_path: str, start: int, count: int) -> tuple[np.ndarray, bool]:
        """(elements, True if they are a new array rather than a view of the chunk cache),
        delta payloads made plain (:mod:`dumpdb.storage.delta`: their base read too)."""
        meta = self._pack(array_path)
        if meta.xor and meta.xor.overlaps(start, count):
            data, fresh = self._stored_range(array_path, meta, start, count)
            if not fresh:
                data = data.copy()
            return meta.xor.resolve(data, start, lambda o, n: self._stored_range(array_path, meta, o, n)[0]), True
        return self._stored_range(array_path, meta, start, count)

    def _stored_range(self, array_path: str, meta: _PackMeta, start: int, count: int) -> tuple[np.ndarray, bool]:
        """Elements ``[start, start + count)`` of the pack as stored (delta payloads XORed)."""
        if start < 0 or start + count > meta.size:
            raise ValueError(f"{array_path}: range {start}+{count} outside the pack ({meta.size} elements)")
        if count == 0:
            return np.empty(0, dtype=meta.dtype), True
        first, last = start // meta.chunk, (start + count - 1) // meta.chunk
        if first == last:
            lo = start - first * meta.chunk
            if count == meta.chunk:  # the whole chunk: decoded straight into the result, as in fill()
                whole = np.empty(count, dtype=meta.dtype)
                if self._decode_into(array_path, meta, first, whole):
                    return whole, True
            return self._chunk(array_path, meta, first)[lo : lo + count], False
        out = np.empty(count, dtype=meta.dtype)

        def fill(i: int) -> None:
            # chunk i's part of the payload: its own slice of out (disjoint from every other chunk's)
            lo = max(start - i * meta.chunk, 0)
            hi = min(start + count - i * meta.chunk, meta.chunk)
            pos = i * meta.chunk + lo - start
            if hi - lo == meta.chunk and self._decode_into(array_path, meta, i, out[pos : pos + meta.chunk]):
                return
            out[pos : pos + hi - lo] = self._chunk(array_path, meta, i)[lo:hi]

        self._fill_chunks(fill, range(first, last + 1), count * meta.dtype.itemsize)
        return out, True

    def _fill_chunks(self, fill: Any, chunks: range, nbytes: int) -> None:
        """``fill(i)`` for every chunk ``i`` of one payload read (each writes its own part of
        the result). A read of ``PARALLEL_READ_BYTES`` or more that no other read overlaps, on
        a machine with a core idle (:func:`idle_core`), runs them on the calling thread and the
        decode pool at once (Blosc decodes without the GIL): a single large read uses the idle
        cores. While another read is in flight (compare's worker threads) or every core is
        busy, one thread, no hand-offs: on the shared 2-core machine (load average 6-7) the
        pool made single 8 MiB reads slower, not faster (docs/storage-design.md "Reads")."""
        with self._lock:
            alone = self._reading == 0
            self._reading += 1
        try:
            helpers = min(len(chunks) - 1, (os.cpu_count() or 2) - 1)
            if not alone or helpers < 1 or nbytes < PARALLEL_READ_BYTES or not idle_core():
                for i in chunks:
                    fill(i)
                return
            todo = iter(chunks)
            take = threading.Lock()

            def drain() -> None:
                while True:
                    with take:
                        i = next(todo, None)
                    if i is None:
                        return
                    fill(i)

            pool = self._decoders()
            futures = [pool.submit(drain) for _ in range(helpers)]
            try:
                drain()
            finally:
                for f in futures:  # every helper done before out is handed back (or an error raised)
                    f.exception()
            for f in futures:
                f.result()
        finally:
            with self._lock:
                self._reading -= 1

    def _decoders(self) -> ThreadPoolExecutor:
        """The store's decode pool (one thread per core), made on first use."""
        with self._lock:
            if self._decode_pool is None:
                self._decode_pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 2,
                                                       thread_name_prefix="dumpdb-decode")
            return self._decode_pool

    def _decode_into(self, array_path: str, meta: _PackMeta, i: int, dest: np.ndarray) -> bool:
        """Chunk ``i`` of a pack decoded straight into ``dest`` (its size), bypassing the chunk
        cache: a chunk a payload covers whole belongs to that payload alone, so caching it
        saves nothing, and decoding into the result saves an allocation and a copy of every
        such chunk (issue 29, docs/storage-design.md "Reads"). False (nothing done) when the
        chunk is cached already, is empty, or its codec does not say its decoded size up front
        (plain zstd: one-byte dtypes, archives before issue 13): then :meth:`_chunk` serves it.
        Raises ValueError naming the pack for a frame that does not decode to the chunk's size."""
        with self._lock:
            if (array_path, i) in self._chunks or (array_path, i) in self._decoding:
                return False
        if meta.decoder is not None and not isinstance(meta.decoder, numcodecs.Blosc):
            return False
        frame = self._frame(meta, i)
        if frame is None:
            return False
        where = self.objects.where(meta.key)
        if meta.decoder is not None:
            # c-blosc 1.x frame header: bytes 4-7 are the decoded size (uint32, little-endian)
            size = int.from_bytes(bytes(frame[4:8]), "little") if len(frame) >= 16 else -1
            if size != dest.nbytes:  # decode() would fill dest only partly, silently
                raise ValueError(f"{where}: chunk {i} decodes to {size // meta.dtype.itemsize} elements, "
                                 f"not {meta.chunk}")
        decode_frame(meta.decoder, frame, where, i, out=dest)
        return True

    @property
    def compressor(self) -> str:
        """The store's compressor (:data:`~dumpdb.storage.codecs.COMPRESSORS`), which every
        writer of it uses: what its root ``zarr.json`` records (``attributes.dumpdb.codec``),
        ``zstd`` when it records none (every store made before the choice existed).
        ValueError naming the store for a compressor this dumpdb does not know."""
        found = self._compressor
        if found is None:
            try:
                root = json.loads(bytes(self.objects.get("zarr.json")))
            except PayloadMissing:
                root = {}
            found = ((root.get("attributes") or {}).get("dumpdb") or {}).get("codec", DEFAULT_COMPRESSOR)
            if found not in COMPRESSORS:
                raise ValueError(f"{self.objects.where('zarr.json')}: codec {found!r} is not one this dumpdb "
                                 f"writes ({', '.join(COMPRESSORS)})")
            self._compressor = found
        return found

    def choose_compressor(self, compressor: str) -> None:
        """Make ``compressor`` (``zstd`` or ``lz4``) the store's compressor, recorded in its root
        ``zarr.json`` for every later writer; nothing to do when it is the store's already.
        Only a store holding no array yet may change it (its arrays keep the codec they were
        written with, but one archive keeps one compressor: ``dumpdb.storage.codecs``).
        Raises DumpdbError for an unknown compressor, StorageError naming the store when it
        holds arrays written with another one."""
        check_compressor(compressor)
        current = self.compressor
        if compressor == current:
            return
        if self.objects.list_dir("packs") or self.objects.list_dir("large"):
            raise StorageError(f"{self.objects.where('zarr.json')}: the archive's codec is {current}, not "
                               f"{compressor}; an archive keeps the codec it was created with (omit --codec)")
        root = json.loads(bytes(self.objects.get("zarr.json")))
        attrs = root.setdefault("attributes", {}).setdefault("dumpdb", {})
        attrs["codec"] = compressor
        self.objects.set("zarr.json", json.dumps(root, indent=2).encode())
        self._compressor = compressor

    @staticmethod
    def create(location: str | os.PathLike[str] | Store, storage_options: dict[str, Any] | None = None) -> None:
        """Create an empty store with its root group (``location`` as in the constructor).

        A remote location must not hold a tensor store already (two archives sharing one
        store would take each other's arrays for crash leftovers): StorageError naming it.
        """
        import zarr

        configure_zarr()
        if backends.is_url(location):
            target = TensorStore(location, read_only=False, storage_options=storage_options)
            if target.objects.exists("zarr.json"):
                raise StorageError(f"{location}: already holds a tensor store (of another archive?); "
                                   "give each archive its own prefix")
            store: Store = target.zstore
        elif isinstance(location, (str, os.PathLike)):
            from dumpdb.storage.local import DurableLocalStore

            store = DurableLocalStore(str(location), read_only=False)
        else:
            store = location
        try:
            zarr.create_group(store, attributes={"dumpdb": {"kind": "tensor-store", "layout": 1,
                                                              **DESCRIBE["tensor-store"]}})
        except Exception as exc:
            # a remote PUT refused (obstore says FileNotFoundError for a missing bucket): one line
            if not backends.is_url(location) or isinstance(exc, StorageError):
                raise
            raise target.objects.storage_error("create the tensor store", exc) from exc

    def array(self, path: str) -> zarr.Array:
        """Open (and cache) the Zarr array at ``path`` inside the store.

        Raises PayloadMissing if one of its shards is missing (zarr itself would
        read a missing shard as fill values).
        """
        arr = self._arrays.get(path)
        if arr is None:
            import zarr

            configure_zarr()
            try:
                arr = zarr.open_array(self.zstore, path=path, mode="r")
            except FileNotFoundError as exc:  # zarr.errors.ArrayNotFoundError too
                raise PayloadMissing(f"{self.objects.where(path)}: array missing from the tensor store") from exc
            self._arrays[path] = arr
            if len(self._arrays) > self._cache_size:
                self._arrays.popitem(last=False)
        else:
            self._arrays.move_to_end(path)
        for key in _shard_keys(arr):
            if not self.objects.exists(f"{path}/{key}"):
                raise PayloadMissing(f"{self.objects.where(path + '/' + key)}: shard missing from the tensor store")
        return arr

    def _large_meta(self, array_path: str) -> _LargeMeta | None:
        with self._lock:
            if array_path in self._large_metas:
                self._large_metas.move_to_end(array_path)
                return self._large_metas[array_path]
        try:
            meta = _LargeMeta.parse(array_path, json.loads(bytes(self.objects.get(f"{array_path}/zarr.json"))))
        except (PayloadMissing, ValueError):
            meta = None  # zarr's path says what is wrong
        with self._lock:
            self._large_metas[array_path] = meta
            if len(self._large_metas) > self._cache_size:
                self._large_metas.popitem(last=False)
        return meta

    def _large_direct(self, array_path: str, check: str | None = None) -> tuple[np.ndarray | None, bool]:
        """(data, checked): a large array read whole with one ``get`` of its shard and every
        chunk decoded straight into the result (in parallel); data None when the array is
        not one dumpdb lays out that way, or its shard is missing (then :meth:`_large`
        answers). ``check``: the content hash to check the bytes against while they are
        read (uncompressed arrays only); ``checked`` says it was (PayloadCorrupt if they differ)."""
        meta = self._large_meta(array_path)
        if meta is None:
            return None, False
        if meta.decoder is None:
            direct = self._large_uncompressed(meta, check)
            if direct is not None:
                return direct, check is not None
        try:
            raw = self.objects.get(meta.key)
        except PayloadMissing:
            return None, False
        where = self.objects.where(meta.key)
        tail = shard_index_bytes(meta.n_chunks)
        if len(raw) < tail:
            raise PayloadCorrupt(f"{where}: shard has {len(raw)} bytes, fewer than its index needs")
        index = parse_shard_index(raw[-tail:], meta.n_chunks, where)
        out = np.empty(meta.shape, dtype=meta.dtype)
        flat = out.reshape(-1)
        starts, counts = chunk_runs(meta.shape, meta.chunks)
        body = len(raw) - tail

        def decode(i: int) -> None:
            offset, nbytes = (int(v) for v in index[i])
            start, count = int(starts[i]), int(counts[i])
            if offset == EMPTY_CHUNK:
                flat[start : start + count] = 0
                return
            if offset + nbytes > body:
                raise ValueError(f"{where}: chunk {i} lies outside the shard (damaged index)")
            frame = raw[offset : offset + nbytes]
            if count == meta.chunk_elems:
                got = decode_frame(meta.decoder, frame, where, i, out=flat[start : start + count])
                if np.asarray(got).nbytes != count * meta.dtype.itemsize:
                    raise ValueError(f"{where}: chunk {i} decodes to the wrong size")
            else:  # an edge chunk: padded to the full chunk shape
                whole = np.frombuffer(decode_frame(meta.decoder, frame, where, i), dtype=meta.dtype)
                if whole.size != meta.chunk_elems:
                    raise ValueError(f"{where}: chunk {i} decodes to {whole.size} elements, not {meta.chunk_elems}")
                flat[start : start + count] = whole[:count]

        if meta.n_chunks == 1 or body < PARALLEL_DECODE_BYTES:
            for i in range(meta.n_chunks):  # little to decode: thread hand-offs would cost more
                decode(i)
        else:
            for _ in self._decoders().map(decode, range(meta.n_chunks)):
                pass
        return out, False

    def _large_uncompressed(self, meta: _LargeMeta, check: str | None = None) -> np.ndarray | None:
        """An uncompressed large array whose shard holds exactly its bytes in order (no edge
        padding): on a local store the shard's bytes mapped copy-on-write, nothing copied
        (:meth:`~dumpdb.storage.objects.ObjectStore.map_private`); on any other, read from
        the shard straight into the result, one copy as ``np.load`` does. None for any other
        layout (then :meth:`_large_direct` decodes chunk by chunk). ``check``: a content hash
        the bytes are hashed against (a read's piece k hashed in a helper thread while piece
        k+1 is read, :data:`HASH_PIECE_BYTES`); PayloadCorrupt naming the shard if they differ."""
        nbytes = math.prod(meta.shape) * meta.dtype.itemsize
        chunk_bytes = meta.chunk_elems * meta.dtype.itemsize
        if nbytes != meta.n_chunks * chunk_bytes:
            return None  # edge chunks are padded
        try:
            tail = self.objects.get_suffix(meta.key, shard_index_bytes(meta.n_chunks))
        except (PayloadMissing, PayloadCorrupt):
            return None
        index = parse_shard_index(tail, meta.n_chunks, self.objects.where(meta.key))
        expected = np.arange(meta.n_chunks, dtype=np.uint64) * np.uint64(chunk_bytes)
        if not (np.array_equal(index[:, 0], expected) and bool((index[:, 1] == chunk_bytes).all())):
            return None  # chunks not back to back in order
        mapped = self.objects.map_private(meta.key, nbytes)
        if mapped is not None:  # a local store: the file's pages, nothing copied (ObjectStore.map_private)
            if check is not None and xxhash.xxh3_128_hexdigest(mapped) != check:
                raise self._mismatch(meta.array_path, check)
            return np.frombuffer(mapped, dtype=meta.dtype).reshape(meta.shape)
        out = np.empty(meta.shape, dtype=meta.dtype)
        view = out.reshape(-1).view(np.uint8).data
        if check is None:
            self.objects.get_into(meta.key, 0, view)
            return out
        if self._hash_pool is None:
            self._hash_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dumpdb-hash")
        hasher = xxhash.xxh3_128()
        hashed: deque[Future] = deque()  # one worker: the pieces are hashed in order
        pool = self._hash_pool
        self.objects.get_into(meta.key, 0, view, lambda piece: hashed.append(pool.submit(hasher.update, piece)),
                              HASH_PIECE_BYTES)
        for done in hashed:
            done.result()
        if hasher.hexdigest() != check:
            raise self._mismatch(meta.array_path, check)
        return out

    def _large(self, array_path: str, content_hash: str | None) -> np.ndarray:
        """A large array's data; PayloadMissing for a missing shard, with one exception:
        older archives (large arrays written without ``write_empty_chunks``) have no
        shard for an all-zero tensor, and zeros are right when they hash to its key."""
        try:
            try:
                return np.asarray(self.array(array_path)[...])
            except Exception as exc:  # zarr reads the shards itself: its transport errors, one line
                if not is_transport_error(exc):
                    raise
                raise self.objects.storage_error(f"read {array_path}", exc) from exc
        except PayloadMissing:
            arr = self._arrays.get(array_path)  # None: zarr.json itself is gone
            if arr is None or content_hash is None:
                raise
            zeros = np.zeros(arr.shape, dtype=arr.dtype)
            if payload_hash(zeros) != content_hash:
                raise
            return zeros

    def read_payload(self, array_path: str | None, elem_offset: int | None, elem_count: int,
                     content_hash: str | None = None, verify: bool | None = None) -> np.ndarray:
        """The stored payload of one blob, flat, in its storage dtype (a new array).

        ``array_path`` None is the empty payload (uint8, 0 elements);
        ``content_hash`` and ``verify`` as in :meth:`read`. Raises as the class docstring says.
        """
        if array_path is None:
            return np.empty(0, np.uint8)
        checked = False
        if elem_offset is None:
            data, checked = self._large_direct(array_path, self._wanted(content_hash, verify))
            data = (data if data is not None else self._large(array_path, content_hash)).reshape(-1)
        else:
            data, fresh = self._pack_range(array_path, elem_offset, elem_count)
            data = data if fresh else data.copy()  # a delta payload comes back new already
        if not checked:
            self._check(array_path, data, content_hash, verify)
        return data

    def _wanted(self, content_hash: str | None, verify: bool | None) -> str | None:
        """The hash a read must check its bytes against (None: no check)."""
        return content_hash if content_hash is not None and (self.verify if verify is None else verify) else None

    def _mismatch(self, array_path: str, content_hash: str) -> PayloadCorrupt:
        return PayloadCorrupt(f"{self.objects.where(array_path)}: content hash mismatch: the stored bytes "
                              f"changed (not {content_hash}); 'dumpdb verify' lists every damaged tensor")

    def _check(self, array_path: str, data: np.ndarray, content_hash: str | None, verify: bool | None) -> None:
        """PayloadCorrupt naming the pack when ``data`` (C-contiguous) does not hash to
        ``content_hash``; nothing when there is no hash or verification is off."""
        if content_hash is None or not (self.verify if verify is None else verify):
            return
        if xxhash.xxh3_128_hexdigest(data.reshape(-1).view(np.uint8).data) != content_hash:
            raise self._mismatch(array_path, content_hash)

    def read(self, array_path: str | None, elem_offset: int | None, elem_count: int,
             dtype: np.dtype, shape: tuple[int, ...], content_hash: str | None = None,
             verify: bool | None = None) -> np.ndarray:
        """Payload of one tensor as ``dtype`` with ``shape`` (a new, writable array).

        ``dtype`` is the logical dtype (``ml_dtypes.bfloat16`` allowed).
        ``content_hash`` is the payload's key: the bytes read are hashed again
        (xxh3-128) and compared, PayloadCorrupt naming the pack if they differ, unless
        ``verify`` is False (None: the store's :attr:`verify`, True by default). Raises
        PayloadCorrupt if the stored byte count does not fit dtype x shape,
        PayloadMissing if an object is gone.
        """
        dtype = np.dtype(dtype)
        if array_path is None:
            return np.zeros(shape, dtype=dtype)
        fresh = True  # data is a new array (not a view of the chunk cache or of zarr's)
        checked = False
        if elem_offset is None:
            data, checked = self._large_direct(array_path, self._wanted(content_hash, verify))
            if data is None:
                data, fresh = self._large(array_path, content_hash), False
        else:
            data, fresh = self._pack_range(array_path, elem_offset, elem_count)
        want = storage_dtype(dtype)
        expected = math.prod(shape) * want.itemsize
        if data.nbytes != expected:
            raise PayloadCorrupt(f"{self.objects.where(array_path)}: {data.nbytes} bytes stored, "
                                 f"{dtype} x {tuple(shape)} needs {expected}")
        if data.dtype != want or data.shape != tuple(shape):
            data = np.ascontiguousarray(data).reshape(-1).view(np.uint8).view(want)
        if want != dtype:
            data = data.view(dtype)
        if not checked:  # the large uncompressed path hashed the bytes as they arrived
            self._check(array_path, np.ascontiguousarray(data), content_hash, verify)
        # a new, writable array: never a view into the chunk cache (decoded straight into
        # a new array already: no copy)
        data = data.reshape(shape)
        return data if fresh else np.array(data, copy=True)

    def read_many(self, locations: list[tuple[str | None, int | None, int, np.dtype, tuple[int, ...]]]
                  | list[tuple[str | None, int | None, int, np.dtype, tuple[int, ...], str | None]],
                  verify: bool | None = None) -> list[np.ndarray]:
        """Many payloads at once (issue 13: tiny compare pairs), as :meth:`read` gives each
        but **read-only**: a payload lying in one chunk of a pack is a view of that chunk
        (decoded once, one ranged read per chunk, kept in the chunk cache), without
        :meth:`read`'s per-call locks and copy (~11 us a payload there); anything else
        (large arrays, payloads across chunk boundaries, empty payloads, delta payloads) goes through
        :meth:`read`. Read ``locations`` in storage order (pack, offset) for the fewest chunk
        decodes.

        ``locations``: ``(array_path, elem_offset, elem_count, dtype, shape)`` per payload
        (``dtype`` the logical dtype, ``ml_dtypes.bfloat16`` allowed), optionally with a
        sixth item, the payload's ``content_hash``: then its bytes are hashed again as in
        :meth:`read` (``verify`` as there). Returns one array per location, in order, of
        that dtype and shape. Raises as :meth:`read` does (PayloadCorrupt when the stored
        byte count does not fit dtype x shape or the bytes do not hash to the content hash,
        PayloadMissing when an object is gone)."""
        out: list[np.ndarray] = []
        metas: dict[str, _PackMeta] = {}
        chunks: dict[tuple[str, int], np.ndarray] = {}
        stored: dict[np.dtype, np.dtype] = {}  # storage_dtype per dtype
        for location in locations:
            array_path, offset, count, dtype, shape = location[:5]
            content_hash = location[5] if len(location) > 5 else None
            if not isinstance(dtype, np.dtype):
                dtype = np.dtype(dtype)
            meta = None
            if array_path is not None and offset is not None and count:
                meta = metas.get(array_path)
                if meta is None:
                    meta = metas[array_path] = self._pack(array_path)
            if meta is None or array_path is None or offset is None or offset < 0 or offset + count > meta.size \
                    or offset // meta.chunk != (offset + count - 1) // meta.chunk \
                    or (meta.xor and meta.xor.overlaps(offset, count)):  # a delta payload: read() makes it plain
                data = self.read(array_path, offset, count, dtype, tuple(shape), content_hash, verify)
                data.flags.writeable = False
                out.append(data)
                continue
            i = offset // meta.chunk
            chunk = chunks.get((array_path, i))
            if chunk is None:
                chunk = chunks[(array_path, i)] = self._chunk(array_path, meta, i)
            lo = offset - i * meta.chunk
            data = chunk[lo : lo + count]
            want = stored.get(dtype)
            if want is None:
                want = stored[dtype] = storage_dtype(dtype)
            if data.nbytes != math.prod(shape) * want.itemsize:
                raise PayloadCorrupt(f"{self.objects.where(array_path)}: {data.nbytes} bytes stored, "
                                     f"{dtype} x {tuple(shape)} needs {math.prod(shape) * want.itemsize}")
            self._check(array_path, data, content_hash, verify)
            if data.dtype != want:
                data = data.view(np.uint8).view(want)
            if want != dtype:
                data = data.view(dtype)
            data = data.reshape(shape)
            if data.flags.writeable:
                data.flags.writeable = False
            out.append(data)
        return out

    def stored_bytes(self, prefix: str = "") -> int:
        """Bytes of every object under ``prefix`` (the whole store by default)."""
        return self.objects.size_prefix(prefix)

    def shard_checksum(self, array_path: str, ndim: int) -> str:
        """``crc32c:<hex>`` of the shard of a dumpdb array (as ``arrays.checksum`` records).

        ``ndim``: the array's dimensions (1 for packs). Raises PayloadMissing if gone.
        """
        return self.objects.checksum(shard_key(array_path, ndim))

    def shard_name(self, array_path: str, ndim: int) -> str:
        """The shard's key relative to the store (for messages)."""
        return shard_key(array_path, ndim)

    def delete_array(self, array_path: str) -> None:
        """Delete an array (its ``zarr.json`` and shards). Gone already is fine."""
        self.objects.delete_prefix(array_path)
        with self._lock:
            self._packs.pop(array_path, None)
            self._arrays.pop(array_path, None)
            self._large_metas.pop(array_path, None)


def _shard_keys(arr: zarr.Array) -> list[str]:
    """The chunk-grid keys (shards, for sharded arrays) of every chunk of ``arr``."""
    meta: Any = arr.metadata
    grid = tuple(math.ceil(s / c) for s, c in zip(arr.shape, meta.chunk_grid.chunk_shape))
    return [meta.encode_chunk_key(idx) for idx in np.ndindex(*grid)] if grid else [meta.encode_chunk_key(())]


@dataclass
class _PackBuffer:
    dtype: np.dtype
    chunk_bytes: int
    parts: list[tuple[str, Any]] = field(default_factory=list)  # (content hash, flat array or a reference)
    nbytes: int = 0


_Written = tuple[list[BlobLocation], ArrayInfo]


@dataclass
class _Pending:
    """One write in flight: its future, and how to do it here if the future is cancelled
    (a worker pool shut down before it ran it)."""

    future: Future[_Written]
    local: Any  # callable () -> _Written

    def done(self) -> bool:
        return self.future.done()


class StoreWriter:
    """Writes payloads into the store: buffers small ones into packs per dtype (and per
    size class: tensors of ``MEDIUM_BYTES`` or more in packs of bigger chunks), gives
    large ones their own array. Each array's chunks are compressed with its dtype's
    codec (:mod:`dumpdb.storage.codecs`) for the store's compressor
    (:attr:`TensorStore.compressor`: zstd, or lz4 for an archive made for reading, where
    payloads of ``READ_LARGE_BYTES`` or more count as large).

    Writing (compression + files) happens on a background thread so reading
    the dump goes on meanwhile; at most ``max_inflight`` writes are queued
    (back-pressure bounds memory to about that many packs).

    :meth:`add`, :meth:`poll` and :meth:`flush` return the
    :class:`BlobLocation` of every payload that has become durable (written)
    since the last call, in write order; the ingest pipeline commits catalog
    rows only for those. :meth:`take_arrays` returns the arrays written since
    it was last called. A write error (e.g. disk full) is raised by the call
    that collects it.

    A payload may be given by reference instead of as an array (any object with ``dtype``,
    ``shape`` and ``nbytes`` that is not an ndarray, e.g. a file of the dump): writes
    then either go to ``delegate`` (``delegate("pack", (dtype str, chunk bytes, [(hash,
    reference)...], delta))`` or ``delegate("large", (hash, reference))`` returns a future of what
    :meth:`write_pack` / :meth:`write_large` return, run where the reference is read, e.g.
    an ingest's worker processes: the payload bytes never pass through this process), or
    here after ``resolve(reference)`` gives the array. The bytes written are the same
    either way. ``codec_threads``: threads compressing chunks (default: the cores).
    ``delta``: store a pack's payload as the XOR of a similar earlier payload of the same
    pack when that compresses better (:mod:`dumpdb.storage.delta`; ingest turns it on;
    off for bundles, which any zarr reader must read plain, for gc's copies, and for runs
    that ``import`` brings in, which are stored plain as their bundle was).
    """

    def __init__(self, store: TensorStore, pack_bytes: int | None = None, large_bytes: int | None = None,
                 max_inflight: int | None = None, codec_threads: int | None = None, delta: bool = False):
        self.store = store
        self.delta = delta
        self.compressor = store.compressor  # the archive's (TensorStore.choose_compressor)
        # Module constants are read here, not bound as defaults, so tests and
        # benchmarks can change them.
        # a remote store may ask for smaller packs (``pack_bytes`` attribute): more writes in flight
        self.pack_bytes = pack_bytes or min(PACK_BYTES, int(getattr(store.zstore, "pack_bytes", PACK_BYTES)))
        # an lz4 archive is one made for reading: payloads of READ_LARGE_BYTES or more get their own
        # array (stored raw when lz4 saves under LARGE_MIN_SAVING, read near np.load)
        self.large_bytes = large_bytes or (READ_LARGE_BYTES if self.compressor == "lz4" else LARGE_BYTES)
        self.medium_bytes = MEDIUM_BYTES
        # An object store's PUT is a network round trip: remote stores (``parallel_writes`` > 1)
        # get that many writer threads and queued writes; local disk keeps one (fsync-bound).
        parallel = max(1, int(getattr(store.zstore, "parallel_writes", 1)))
        self.max_inflight = max(1, max_inflight if max_inflight is not None else max(2, parallel))
        self._buffers: dict[tuple[str, bool], _PackBuffer] = {}
        self._pool = ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="dumpdb-write")
        self._codec_pool = ThreadPoolExecutor(max_workers=codec_threads or os.cpu_count() or 2,
                                              thread_name_prefix="dumpdb-zstd")
        self._inflight: deque[_Pending] = deque()
        self.delegate: Any = None  # callable (kind, args) -> Future[_Written]; see the class docstring
        self.resolve: Any = None  # callable (reference) -> np.ndarray
        self._arrays: list[ArrayInfo] = []
        self.bytes_written = 0
        self._local = threading.local()  # per writer thread: its pack scratch (_scratch)

    @property
    def buffered_bytes(self) -> int:
        """Payload bytes added but not yet written to a pack shard."""
        return sum(b.nbytes for b in self._buffers.values())

    def add(self, content_hash: str, payload: Any) -> list[BlobLocation]:
        """Queue one payload (any shape/dtype): a numpy array, or a reference with its ``nbytes``,
        ``dtype`` and ``shape`` that a worker process writes (``ingestion.workers.PayloadRef``).
        Returns newly durable locations."""
        nbytes = payload.nbytes
        if nbytes == 0:
            return [BlobLocation(content_hash, 0, None, None, 0, 0)] + self.poll()
        sdtype = storage_dtype(payload.dtype)
        if isinstance(payload, np.ndarray):
            flat = np.ascontiguousarray(payload).reshape(-1).view(sdtype)
        else:
            flat = payload  # a reference, read where it is written
        if nbytes >= self.large_bytes:
            return self._submit(self._large_job(content_hash, flat, tuple(payload.shape)))
        medium = nbytes >= self.medium_bytes  # packs of small tensors keep small chunks (fast reads)
        key = (sdtype.str, medium)
        buf = self._buffers.get(key)
        if buf is None:
            buf = self._buffers[key] = _PackBuffer(sdtype, MEDIUM_CHUNK_BYTES if medium else INNER_CHUNK_BYTES)
        buf.parts.append((content_hash, flat))
        buf.nbytes += nbytes
        if buf.nbytes >= self.pack_bytes:
            return self._submit(self._pack_job(self._buffers.pop(key)))
        return self.poll()

    # -- where a write runs: delegated (references, a delegate set) or on this writer's thread
    def _pack_job(self, buf: _PackBuffer) -> _Pending:
        def local() -> _Written:
            return self._write_pack(self._resolved(buf))

        if self.delegate is not None and not any(isinstance(p, np.ndarray) for _, p in buf.parts):
            future = self.delegate("pack", (buf.dtype.str, buf.chunk_bytes, buf.parts, self.delta))
        else:
            future = self._pool.submit(local)
        return _Pending(future, local)

    def _large_job(self, content_hash: str, payload: Any, shape: tuple[int, ...]) -> _Pending:
        def local() -> _Written:
            data = payload if isinstance(payload, np.ndarray) else self._array(payload)
            return self._write_large(content_hash, data.reshape(shape))

        if self.delegate is not None and not isinstance(payload, np.ndarray):
            future = self.delegate("large", (content_hash, payload))
        else:
            future = self._pool.submit(local)
        return _Pending(future, local)

    def _array(self, ref: Any) -> np.ndarray:
        """The flat storage-dtype array of a payload given by reference (``resolve``)."""
        if self.resolve is None:
            raise TypeError(f"StoreWriter got a payload reference {ref!r} but no resolve function")
        data = self.resolve(ref)
        return np.ascontiguousarray(data).reshape(-1).view(storage_dtype(data.dtype))

    def _resolved(self, buf: _PackBuffer) -> _PackBuffer:
        if all(isinstance(p, np.ndarray) for _, p in buf.parts):
            return buf
        parts = [(h, p if isinstance(p, np.ndarray) else self._array(p)) for h, p in buf.parts]
        return _PackBuffer(buf.dtype, buf.chunk_bytes, parts, buf.nbytes)

    def write_pack(self, dtype: str, chunk_bytes: int, parts: list[tuple[str, np.ndarray]],
                   delta: bool | None = None) -> _Written:
        """Write one pack of storage dtype ``dtype`` (``np.dtype.str``) with inner chunks of
        ``chunk_bytes`` bytes: ``parts`` (content hash, flat array of that dtype) back to back,
        now, on the calling thread (a delegated write; ``delta`` as the delegating writer's,
        default this writer's). Returns (locations, the array written).
        Raises OSError / StorageError as the store does."""
        return self._write_pack(_PackBuffer(np.dtype(dtype), chunk_bytes, list(parts),
                                            sum(p.nbytes for _, p in parts)),
                                self.delta if delta is None else delta)

    def write_large(self, content_hash: str, payload: np.ndarray) -> _Written:
        """Write one large payload (any shape and dtype) as its own array, now, on the calling
        thread (a delegated write). Returns (locations, the array written)."""
        flat = np.ascontiguousarray(payload).reshape(-1).view(storage_dtype(payload.dtype))
        return self._write_large(content_hash, flat.reshape(payload.shape))

    def poll(self) -> list[BlobLocation]:
        """Locations of writes finished so far (non-blocking)."""
        done: list[BlobLocation] = []
        while self._inflight and self._inflight[0].done():
            done.extend(self._collect(self._inflight.popleft()))
        return done

    def flush(self) -> list[BlobLocation]:
        """Write every buffered pack and wait for all writes. Returns their locations."""
        for key in list(self._buffers):
            self._inflight.append(self._pack_job(self._buffers.pop(key)))
        done: list[BlobLocation] = []
        while self._inflight:
            done.extend(self._collect(self._inflight.popleft()))
        return done

    def close(self) -> None:
        """Stop the writer threads (after waiting for queued writes)."""
        self._pool.shutdown(wait=True)
        self._codec_pool.shutdown(wait=True)

    def take_arrays(self) -> list[ArrayInfo]:
        """The arrays written since the last call (``arrays`` rows to record), and forget them."""
        taken, self._arrays = self._arrays, []
        return taken

    def wait(self) -> None:
        """Wait until every write in flight has finished (or failed): delegated writes must
        be done before their workers go. Results stay for the next :meth:`poll` or
        :meth:`flush`; a write the delegate's pool cancelled is then done here."""
        for pending in self._inflight:
            try:
                pending.future.exception()
            except CancelledError:
                pass

    def _submit(self, job: _Pending) -> list[BlobLocation]:
        done: list[BlobLocation] = []
        while len(self._inflight) >= self.max_inflight:  # back-pressure
            done.extend(self._collect(self._inflight.popleft()))
        self._inflight.append(job)
        return done + self.poll()

    def _collect(self, pending: _Pending) -> list[BlobLocation]:
        try:
            try:
                locations, info = pending.future.result()
            except (CancelledError, BrokenExecutor):
                # a delegated write its pool dropped (shut down, a worker gone): write it here
                locations, info = pending.local()
        except Exception as exc:  # zarr's own writes (zarr.json, large shards) bypass ObjectStore.call
            # a local disk's OSError (ENOSPC, EACCES) goes up as it is: ingest names the file
            # and says what was kept; only a remote store's failure is a StorageError here
            if not is_transport_error(exc) or self.store.capabilities.files:
                raise
            raise self.store.objects.storage_error("write an array", exc) from exc
        self._arrays.append(info)
        self.bytes_written += info.stored_bytes
        return locations

    def _create(self, name: str, data: np.ndarray, chunks, shards, kind: str, codec: Codec, write: bool = True,
                **attrs) -> zarr.Array:
        import zarr

        configure_zarr()
        arr = zarr.create_array(
            self.store.zstore, name=name, shape=data.shape, dtype=data.dtype, chunks=chunks,
            shards=shards, compressors=codec.zarr_codec(), fill_value=0,
            attributes={"dumpdb": {"kind": kind, **attrs, **DESCRIBE.get(kind, {})}},
            # Every chunk is written: no scan for fill-value chunks (measured: ~25 % of
            # write time) and nothing depends on how a fill value compares (-0.0, NaN).
            config={"write_empty_chunks": True},
        )
        if write:
            arr[...] = data
        return arr

    def _write_pack(self, buf: _PackBuffer, delta: bool | None = None) -> _Written:
        arrays = [p for _, p in buf.parts]
        bases: list[int | None] = [None] * len(arrays)
        if (self.delta if delta is None else delta) and len(arrays) > 1:
            sample = codec_for(buf.dtype, xor_delta.DELTA_SAMPLE_BYTES, self.compressor).frame_codec()
            bases = xor_delta.choose_bases(arrays, buf.dtype, lambda a: len(sample.encode(a)))
        data = arrays[0] if len(arrays) == 1 else xor_delta.encode_into(
            arrays, bases, buf.dtype, self._scratch(sum(a.nbytes for a in arrays)))
        n = data.size
        chunk = min(n, max(1, buf.chunk_bytes // buf.dtype.itemsize))
        name = f"packs/{_dtype_dir(buf.dtype)}/{_unique_id()}"
        codec = codec_for(buf.dtype, chunk * buf.dtype.itemsize, self.compressor)
        offsets = np.concatenate([[0], np.cumsum([a.size for a in arrays])]).astype(int).tolist()
        xor = [xor_delta.XorPart(offsets[i], arrays[i].size, offsets[j]) for i, j in enumerate(bases) if j is not None]
        attrs = {"xor": xor_delta.to_attribute(xor), "xor_means": xor_delta.XOR_MEANS} if xor else {}
        # zarr writes the metadata; the one shard is encoded here (see dumpdb.storage.shard).
        self._create(name, data, (chunk,), (math.ceil(n / chunk) * chunk,), "pack", codec, write=False, **attrs)
        frames = encode_chunks(data, chunk, codec.frame_codec(), self._codec_pool)
        objects = self.store.objects
        written, checksum = write_shard(ShardTarget(objects, shard_key(name, 1)), frames)
        # zarr.json was written (durably, by the store) before the shard: the pack is complete
        # once the shard exists, and the catalog commit comes after this returns.
        stored = objects.size(f"{name}/zarr.json") + written
        locations = []
        for i, (content_hash, part) in enumerate(buf.parts):
            share = round(stored * part.nbytes / data.nbytes) if data.nbytes else 0
            base = bases[i]
            locations.append(BlobLocation(content_hash, part.nbytes, name, offsets[i], part.size, share,
                                          None if base is None else buf.parts[base][0]))
        return locations, ArrayInfo(name, "pack", buf.dtype.name, (n,), stored, checksum)

    def _scratch(self, nbytes: int) -> np.ndarray:
        """This thread's reused memory for a pack's payloads back to back (``nbytes``
        bytes, uint8): a fresh array per pack costs the kernel a zeroed page for every page
        (``np.concatenate``: ~5 % of a conv-net ingest's CPU, issue 29). One per writer
        thread, the size of the largest pack it wrote (about ``pack_bytes``)."""
        block = getattr(self._local, "scratch", None)
        if block is None or block.nbytes < nbytes:
            block = self._local.scratch = np.empty(nbytes, np.uint8)
        return block[:nbytes]

    def _write_large(self, content_hash: str, payload: np.ndarray) -> _Written:
        name = f"large/{content_hash[:2]}/{content_hash}-{_unique_id()}"
        chunks = large_chunks(payload.shape, payload.dtype.itemsize, LARGE_CHUNK_BYTES)
        shards = tuple(math.ceil(s / c) * c for s, c in zip(payload.shape, chunks)) if chunks else None
        codec = codec_for(payload.dtype, math.prod(chunks or payload.shape) * payload.dtype.itemsize, self.compressor)
        if not chunks:  # a 0-d array (never this large in practice): zarr writes it
            self._create(name, payload, None, None, "tensor", codec, content_hash=content_hash)
            stored = self.store.stored_bytes(name)  # every object durable already (the store's set)
            key = shard_key(name, payload.ndim)
            checksum = self.store.objects.checksum(key) if self.store.objects.exists(key) else None
        else:
            # zarr writes the metadata; the one shard is encoded here, each chunk one contiguous
            # run of the C-order payload (chunk_runs), edge chunks zero-padded as zarr pads them.
            flat = payload.reshape(-1)
            frames = self._large_frames(flat, payload.shape, chunks, codec)
            encoded = sum(map(len, frames))
            if encoded > (1 - LARGE_MIN_SAVING) * math.prod(shards or ()) * payload.dtype.itemsize:
                codec = codec.uncompressed()  # little saved: fast reads matter more (codecs.py)
                frames = self._large_frames(flat, payload.shape, chunks, codec)
            elif encoded * REDUNDANT_RATIO <= payload.nbytes:  # highly redundant: bigger chunks (codecs.py)
                big = large_chunks(payload.shape, payload.dtype.itemsize, REDUNDANT_CHUNK_BYTES)
                if big != chunks:
                    big_codec = redundant_codec(payload.dtype, math.prod(big) * payload.dtype.itemsize)
                    big_frames = self._large_frames(flat, payload.shape, big, big_codec)
                    if sum(map(len, big_frames)) <= REDUNDANT_KEEP * encoded:
                        chunks, codec, frames = big, big_codec, big_frames
                        shards = tuple(math.ceil(s / c) * c for s, c in zip(payload.shape, chunks))
            self._create(name, payload, chunks, shards, "tensor", codec, write=False, content_hash=content_hash)
            objects = self.store.objects
            written, checksum = write_shard(ShardTarget(objects, shard_key(name, payload.ndim)), frames)
            stored = objects.size(f"{name}/zarr.json") + written
        location = BlobLocation(content_hash, payload.nbytes, name, None, payload.size, stored)
        return [location], ArrayInfo(name, "tensor", payload.dtype.name, payload.shape, stored, checksum)

    def _large_frames(self, flat: np.ndarray, shape: tuple[int, ...], chunks: tuple[int, ...],
                      codec: Codec) -> list[bytes]:
        """The compressed inner chunks of a large array, in shard order."""
        starts, counts = chunk_runs(shape, chunks)
        size = math.prod(chunks)
        encoder = None if codec.raw else codec.frame_codec()

        def encode(i: int) -> bytes:
            start, count = int(starts[i]), int(counts[i])
            piece = flat[start : start + count]
            if count < size:
                padded = np.zeros(size, dtype=flat.dtype)
                padded[:count] = piece
                piece = padded
            return piece.tobytes() if encoder is None else bytes(encoder.encode(piece))

        return list(self._codec_pool.map(encode, range(len(starts))))


def _dtype_dir(dtype: np.dtype) -> str:
    return "bool" if dtype.kind == "b" else dtype.name
