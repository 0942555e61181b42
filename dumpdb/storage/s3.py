"""The S3 client dumpdb uses: zarr's :class:`zarr.storage.ObjectStore` over ``obstore``'s
``S3Store`` (Rust ``object_store``), with dumpdb's additions (:class:`RemoteObjectStore`).

Why obstore and not ``FsspecStore`` over ``s3fs``: ``docs/storage-design.md`` ("S3 client").
Configuration and URLs are
:mod:`dumpdb.storage.remote`'s; this module is imported only when an ``s3://`` store is opened
(``pip install 'dumpdb[s3]'``).

Object-storage semantics: an object is written whole by one PUT, or, from
``multipart_bytes`` up, by a parallel multipart upload that S3 makes visible only when it
is completed (never half an object); reads are ranged GETs; listings are streamed page by
page; obstore retries 5xx, throttling (503 SlowDown) and dropped connections with
exponential backoff and jitter (``retries``, ``retry_timeout``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from datetime import timedelta
from typing import Any, Literal

import google_crc32c
import obstore
import obstore.store
import zarr.storage


def open_obstore(bucket: str, prefix: str, s3conf: dict[str, str], conf: dict[str, Any],
                 read_only: bool) -> RemoteObjectStore:
    """A :class:`RemoteObjectStore` for the objects under ``s3://bucket/prefix``: ``s3conf``
    the S3 client's settings (endpoint, region, credentials), ``conf`` every setting with the
    tuning ones (retries, timeouts in seconds, multipart sizes in bytes;
    :func:`dumpdb.storage.remote.settings`)."""
    client_options: dict[str, Any] = {
        "allow_http": str(s3conf.get("endpoint", "")).startswith("http://"),
        "connect_timeout": timedelta(seconds=conf["connect_timeout"]),
        "timeout": timedelta(seconds=conf["timeout"]),
    }
    retry = {"max_retries": int(conf["retries"]), "retry_timeout": timedelta(seconds=conf["retry_timeout"]),
             "backoff": {"init_backoff": timedelta(milliseconds=100), "max_backoff": timedelta(seconds=15),
                         "base": 2}}
    s3 = obstore.store.S3Store(bucket, prefix=prefix or None, config=s3conf,  # type: ignore[arg-type]
                               client_options=client_options, retry_config=retry)  # type: ignore[arg-type]
    store = RemoteObjectStore(s3, read_only=read_only)
    store.multipart = (int(conf["multipart_bytes"]), int(conf["part_bytes"]), int(conf["part_concurrency"]))
    store.url = f"s3://{bucket}/{prefix}".rstrip("/")
    return store


class RemoteObjectStore(zarr.storage.ObjectStore):
    """zarr's ObjectStore with what dumpdb adds for S3: whole-object writes of several
    buffers as one parallel multipart upload when large, and a streamed listing with
    sizes and modification times (one page of keys at a time)."""

    url: str = ""
    multipart: tuple[int, int, int] = (16 << 20, 8 << 20, 8)  # threshold, part size, parallel parts
    parallel_writes = 4  # StoreWriter's writer threads on this store (PUTs are round trips, not fsyncs)
    pack_bytes = 16 << 20  # StoreWriter's packs: smaller than on disk, so PUTs overlap with reading the dump

    def __str__(self) -> str:
        return self.url or super().__str__()

    def with_read_only(self, read_only: bool = False) -> RemoteObjectStore:
        """This store (same client, URL and multipart settings) opened ``read_only`` or not
        (zarr's ``Store.with_read_only``)."""
        other = RemoteObjectStore(self.store, read_only=read_only)
        other.url, other.multipart = self.url, self.multipart
        return other

    def set_parts_sync(self, key: str, parts: list[bytes | bytearray | memoryview],
                       exclusive: bool = False) -> int:
        """Write object ``key`` whole from ``parts``; a single PUT when small, a parallel
        multipart upload (completed only when every part is up: the object appears
        whole or not at all) when at least ``multipart_bytes``."""


        self._check_writable()
        total = sum(memoryview(p).nbytes for p in parts)
        threshold, part, concurrency = self.multipart
        mode: Literal["create", "overwrite"] = "create" if exclusive else "overwrite"
        if total >= threshold:
            obstore.put(self.store, key, _rechunk(parts, part), use_multipart=True, chunk_size=part,
                        max_concurrency=concurrency, mode=mode)
        else:
            obstore.put(self.store, key, b"".join(parts), use_multipart=False, mode=mode)
        return total

    async def set(self, key: str, value: Any) -> None:
        """zarr's writes (``zarr.json``, a large tensor's shards): as zarr's ObjectStore, but an
        object of at least ``multipart_bytes`` goes up as a parallel multipart upload."""
        self._check_writable()
        data = value.as_buffer_like()
        threshold, part, concurrency = self.multipart
        if memoryview(data).nbytes < threshold:
            await super().set(key, value)
        else:
            await obstore.put_async(self.store, key, data, use_multipart=True, chunk_size=part,
                                    max_concurrency=concurrency)
        self._remember(key, google_crc32c.value(bytes(memoryview(data).cast("B"))))

    def _remember(self, key: str, crc: int) -> None:
        written = self.__dict__.setdefault("_written", OrderedDict())
        written[key] = crc
        while len(written) > 4096:
            written.popitem(last=False)

    def written_checksum(self, key: str) -> str | None:
        """``crc32c:<hex>`` of the bytes this store object wrote as ``key`` (recently), else None:
        the writer records a large array's checksum without downloading the object again."""
        crc = self.__dict__.get("_written", {}).get(key)
        return None if crc is None else f"crc32c:{crc:08x}"

    def list_meta(self, prefix: str) -> Iterator[tuple[str, int, float]]:
        """``(key, size, mtime)`` of every object under ``prefix``, streamed page by page
        (S3 ListObjectsV2 pages of 1000 keys; never the whole listing in memory)."""
        for batch in obstore.list(self.store, prefix or None, chunk_size=1000):
            for meta in batch:
                yield meta["path"], int(meta["size"]), meta["last_modified"].timestamp()


def _rechunk(parts: list[bytes | bytearray | memoryview], size: int) -> Iterator[bytes]:
    """The bytes of ``parts`` regrouped into pieces of ``size`` (the multipart part size)."""
    pending: list[memoryview] = []
    have = 0
    for part in parts:
        view = memoryview(part).cast("B")
        while view.nbytes:
            take = min(size - have, view.nbytes)
            pending.append(view[:take])
            have += take
            view = view[take:]
            if have == size:
                yield b"".join(pending)
                pending, have = [], 0
    if pending:
        yield b"".join(pending)
