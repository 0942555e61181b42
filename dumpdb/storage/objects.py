"""The one door to the tensor store's bytes: a small synchronous facade over a
:class:`zarr.abc.store.Store`.

Every byte dumpdb reads or writes under ``tensors.zarr`` (pack shards, large
arrays, ``zarr.json``) passes through an :class:`ObjectStore`, which speaks in
object keys (``packs/float32/<id>/c/0``), never in file paths. Any zarr Store
works: :class:`~dumpdb.storage.local.DurableLocalStore` for archives on disk,
:class:`zarr.storage.MemoryStore` in tests, an object store (``FsspecStore``,
``zarr.storage.ObjectStore``) later. Objects are written whole and are visible
only once complete (no renames, no appends), which is what S3 offers.

zarr's Store API is async. Stores that also have zarr's synchronous methods
(``get_sync``/``set_sync``/``delete_sync``: LocalStore, MemoryStore) are called
directly, so a small tensor's read is one ranged ``get`` with no event-loop hop;
everything else runs on zarr's own event loop thread (:func:`zarr.core.sync.sync`).

Errors: a missing object raises :class:`~dumpdb.errors.PayloadMissing`, a ranged
read the object is too short for :class:`~dumpdb.errors.PayloadCorrupt`; both name
the object. Write failures (ENOSPC...) propagate as OSError.
"""

from __future__ import annotations

import os
from collections.abc import Coroutine, Iterable
from typing import Any, TypeVar

import google_crc32c
from zarr.abc.store import RangeByteRequest, Store, SuffixByteRequest, SupportsSyncStore
from zarr.core.buffer import Buffer, default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import LocalStore

from dumpdb.errors import PayloadCorrupt, PayloadMissing

T = TypeVar("T")

_BLOCK = 16 << 20  # streaming reads (checksums of big objects) go in blocks of this size


def _run(coro: Coroutine[Any, Any, T]) -> T:
    return sync(coro)


def _view(buf: Buffer) -> memoryview:
    return buf.as_numpy_array().data.cast("B")


async def _collect(it: Any) -> list[str]:
    return [key async for key in it]


class ObjectStore:
    """Synchronous access to the objects of one zarr ``store`` (see module docstring).

    ``name`` is what error messages call the store (e.g. the ``tensors.zarr`` path).
    """

    def __init__(self, store: Store, name: str | None = None):
        self.store = store
        self.name = name or str(store)
        self._sync = isinstance(store, SupportsSyncStore)
        self._proto = default_buffer_prototype()

    def __repr__(self) -> str:
        return f"<ObjectStore {self.name}>"

    @property
    def read_only(self) -> bool:
        """True if the underlying zarr store refuses writes."""
        return self.store.read_only

    def where(self, key: str) -> str:
        """``<store>/<key>``: how messages name an object."""
        return f"{self.name.rstrip('/')}/{key}"

    # -- reading ---------------------------------------------------------------
    def _get(self, key: str, byte_range: RangeByteRequest | SuffixByteRequest | None) -> Buffer | None:
        if self._sync:
            return self.store.get_sync(key, prototype=self._proto, byte_range=byte_range)  # type: ignore[attr-defined]
        return _run(self.store.get(key, self._proto, byte_range))

    def get(self, key: str, start: int | None = None, end: int | None = None) -> memoryview:
        """The bytes ``[start, end)`` of object ``key`` (the whole object when both are None),
        as a view of the buffer the store returned (no copy: pack frames are up to
        1 MiB and are decoded straight from it; never write to it, ``bytes(...)`` it to keep it).

        Raises PayloadMissing if the object does not exist, PayloadCorrupt if it
        ends before ``end``.
        """
        if start is None and end is None:
            buf = self._get(key, None)
        else:
            lo = start or 0
            if end is None:
                raise ValueError("get(): give end with start (use get_suffix for a tail)")
            buf = self._get(key, RangeByteRequest(lo, max(end, lo)))
        if buf is None:
            raise PayloadMissing(f"{self.where(key)}: object missing from the tensor store")
        data = _view(buf)
        if end is not None and len(data) != end - (start or 0):
            raise PayloadCorrupt(f"{self.where(key)}: object too short for bytes [{start or 0}, {end}) "
                                 f"(got {len(data)} of {end - (start or 0)})")
        return data

    def get_suffix(self, key: str, n: int) -> memoryview:
        """The last ``n`` bytes of object ``key`` (a view, as :meth:`get`); PayloadCorrupt
        if it is shorter."""
        buf = self._get(key, SuffixByteRequest(n))
        if buf is None:
            raise PayloadMissing(f"{self.where(key)}: object missing from the tensor store")
        data = _view(buf)
        if len(data) != n:
            raise PayloadCorrupt(f"{self.where(key)}: object has {len(data)} bytes, fewer than the {n} expected")
        return data

    def get_into(self, key: str, start: int, out: memoryview) -> None:
        """Fill ``out`` (a writable byte view) with the bytes ``[start, start + len(out))`` of
        object ``key``: straight from the file into ``out`` for a store on local disk (one
        copy, as ``np.load`` does), else through :meth:`get`. Raises as :meth:`get`."""
        root = getattr(self.store, "root", None)
        if isinstance(self.store, LocalStore) and root is not None:
            path = os.path.join(root, key)
            try:
                with open(path, "rb", buffering=0) as f:
                    f.seek(start)
                    got = f.readinto(out)
                    while got is not None and got < len(out):
                        more = f.readinto(out[got:])
                        if not more:
                            break
                        got += more
            except FileNotFoundError as exc:
                raise PayloadMissing(f"{self.where(key)}: object missing from the tensor store") from exc
            if got != len(out):
                raise PayloadCorrupt(f"{self.where(key)}: object too short for bytes [{start}, {start + len(out)}) "
                                     f"(got {got or 0} of {len(out)})")
            return
        out[:] = self.get(key, start, start + len(out))

    def exists(self, key: str) -> bool:
        """True if object ``key`` exists (a prefix with objects under it is not one)."""
        return bool(_run(self.store.exists(key)))

    def size(self, key: str) -> int:
        """Size of object ``key`` in bytes; PayloadMissing if it does not exist."""
        try:
            return int(_run(self.store.getsize(key)))
        except FileNotFoundError as exc:
            raise PayloadMissing(f"{self.where(key)}: object missing from the tensor store") from exc

    def size_prefix(self, prefix: str) -> int:
        """Total bytes of the objects under ``prefix`` (``""``: the whole store)."""
        return sum(self.size(k) for k in self.list_prefix(prefix))

    def checksum(self, key: str) -> str:
        """``crc32c:<hex>`` of object ``key``, read in blocks (bounded memory)."""
        total = self.size(key)
        crc = 0
        for lo in range(0, total, _BLOCK):
            crc = google_crc32c.extend(crc, bytes(self.get(key, lo, min(lo + _BLOCK, total))))
        return f"crc32c:{crc:08x}"

    def list_prefix(self, prefix: str) -> list[str]:
        """Every object key under ``prefix`` (recursively), sorted."""
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        return sorted(_run(_collect(self.store.list_prefix(prefix))))

    def list_dir(self, prefix: str) -> list[str]:
        """The names directly under ``prefix`` (objects and sub-prefixes), sorted."""
        return sorted(_run(_collect(self.store.list_dir(prefix))))

    # -- writing ---------------------------------------------------------------
    def set(self, key: str, parts: bytes | Iterable[bytes | bytearray | memoryview]) -> int:
        """Write object ``key`` whole (``parts`` back to back); durable and visible
        when this returns. Returns its size in bytes."""
        chunks = [parts] if isinstance(parts, (bytes, bytearray, memoryview)) else list(parts)
        put_parts = getattr(self.store, "set_parts_sync", None)
        if put_parts is not None:
            return int(put_parts(key, chunks))
        data = b"".join(chunks)
        buf = self._proto.buffer.from_bytes(data)
        if self._sync:
            self.store.set_sync(key, buf)  # type: ignore[attr-defined]
        else:
            _run(self.store.set(key, buf))
        return len(data)

    def set_if_not_exists(self, key: str, data: bytes) -> None:
        """Write object ``key`` unless it exists (then nothing changes)."""
        _run(self.store.set_if_not_exists(key, self._proto.buffer.from_bytes(data)))

    def delete(self, key: str) -> None:
        """Delete object ``key`` (no error if it is gone already)."""
        if self._sync:
            self.store.delete_sync(key)  # type: ignore[attr-defined]
        else:
            _run(self.store.delete(key))

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under ``prefix``; returns how many there were."""
        keys = self.list_prefix(prefix)
        if keys:
            _run(self.store.delete_dir(prefix.rstrip("/")))  # LocalStore: its directories too
        return len(keys)
