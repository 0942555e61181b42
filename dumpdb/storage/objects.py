"""The one door to the tensor store's bytes: a small synchronous facade over a
:class:`zarr.abc.store.Store`, or over a directory on local disk (:meth:`ObjectStore.local`).

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

A store on local disk opened with :meth:`ObjectStore.local` reads its objects as the files
``<root>/<key>`` (``pread``, ``mmap``) without zarr: zarr (~0.3 CPU s of imports holding
the GIL, docs/compare-kernel.md "sixth round") is imported, and the zarr Store made
(:class:`~dumpdb.storage.local.DurableLocalStore`), only when something else is asked of it
(listing, size, writing) or of :attr:`ObjectStore.store`. A tensor compare reads through
:meth:`~ObjectStore.get`, :meth:`~ObjectStore.get_suffix`, :meth:`~ObjectStore.get_into`
and :meth:`~ObjectStore.map_private` alone, so it never imports zarr.

Errors: a missing object raises :class:`~dumpdb.errors.PayloadMissing`, a ranged
read the object is too short for :class:`~dumpdb.errors.PayloadCorrupt`; both name
the object. Write failures (ENOSPC...) propagate as OSError.
"""

from __future__ import annotations

import mmap
import os
import re
from collections.abc import Callable, Coroutine, Iterable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import google_crc32c

from dumpdb.errors import DumpdbError, PayloadCorrupt, PayloadMissing, StorageError

if TYPE_CHECKING:
    from zarr.abc.store import RangeByteRequest, Store, SuffixByteRequest
    from zarr.core.buffer import Buffer

T = TypeVar("T")

_BLOCK = 16 << 20  # streaming reads (checksums of big objects) go in blocks of this size
# A ranged read of a local object this large or larger is a read-only mapping of the file
# (ObjectStore._map_range), not a pread into a new buffer: a pread of a pack frame (up to a 4 MiB
# chunk) first has the kernel zero the fresh pages of the buffer, then copies the page cache into
# them (~5 % of a lz4 conv-net compare's CPU, docs/compare-kernel.md "seventh round"); smaller
# reads cost less as a pread than as a mapping's set-up and tear-down.
MAP_READ_BYTES = 256 << 10


def _run(coro: Coroutine[Any, Any, T]) -> T:
    from zarr.core.sync import sync

    return sync(coro)


_zarr_ready = False


def configure_zarr() -> None:
    """Set zarr's configuration for dumpdb once per process (its thread pool: one thread per
    core), importing zarr; every place that hands work to zarr calls this first."""
    global _zarr_ready
    if not _zarr_ready:
        import zarr

        zarr.config.set({"threading.max_workers": os.cpu_count() or 2})
        _zarr_ready = True


def _view(buf: Buffer) -> memoryview:
    return buf.as_numpy_array().data.cast("B")


async def _collect_dir(store: Store, prefix: str) -> list[str]:
    # the listing is started inside the loop: zarr's ObjectStore starts its request on the call
    return [key async for key in store.list_dir(prefix)]


_PAGE = 1000  # keys per step of a streamed listing (an S3 ListObjectsV2 page)


async def _take(it: Any, n: int) -> list[str]:
    out: list[str] = []
    async for key in it:
        out.append(key)
        if len(out) >= n:
            break
    return out


_S3_ERROR = re.compile(r"<Code>([A-Za-z]+)</Code>\s*(?:<Message>([^<]{0,200})</Message>)?")
# what to do about an S3 error code (the server's XML says only what went wrong)
_S3_FIX = {"NoSuchBucket": "create the bucket first, or check the URL and the endpoint",
           "AccessDenied": "check the credentials (AWS_* or --storage-option) and the bucket's policy",
           "InvalidAccessKeyId": "check the credentials (AWS_* or --storage-option)",
           "SignatureDoesNotMatch": "check the secret key and the region"}


def _first_line(exc: BaseException) -> str:
    """``exc`` in one bounded line: an S3 error as its code, message and fix (obstore
    quotes the whole XML body and a debug dump: 1,165 characters for a missing bucket,
    issue 30), else the first line, at most 300 characters."""
    text = str(exc)
    found = _S3_ERROR.search(text)
    if found:
        code, message = found.group(1), (found.group(2) or "").strip()
        fix = _S3_FIX.get(code)
        return f"{code}" + (f" ({message})" if message else "") + (f": {fix}" if fix else "")
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return (lines[0] if lines else type(exc).__name__)[:300]


def is_transport_error(exc: BaseException) -> bool:
    """True for a failure to reach or use a remote store (not a missing object, not a bug)."""
    if isinstance(exc, (DumpdbError, FileNotFoundError, KeyError, ValueError, TypeError, AssertionError)):
        return False
    module = type(exc).__module__ or ""
    return isinstance(exc, (OSError, TimeoutError)) or module.split(".")[0] in {
        "obstore", "botocore", "aiobotocore", "aiohttp", "s3fs"}


def _map_range(fd: int, start: int, n: int) -> memoryview | None:
    """Bytes ``[start, start + n)`` of the open file ``fd`` as a read-only view of a shared
    mapping of them (``MAP_POPULATE``: the page tables filled in one call, not a fault per 64
    KiB), cut short at the end of the file as ``pread`` would; None where there is nothing to
    map (``start`` at or past the end), no POSIX ``mmap``, or the mapping fails (then the
    caller preads). The view keeps the mapping, which is undone when the last view of it is
    gone; closing ``fd`` does not end it. Safe because the store never changes a file in
    place (a write goes to a temporary file that is renamed, ``durable_put``): a file replaced
    or deleted meanwhile keeps its old bytes in the mapping, as an open descriptor would. Not
    safe against a disk read error or a file truncated in place from outside: reading such a
    page is SIGBUS, not an OSError (``ObjectStore.map_reads`` False for verify). Each live
    mapping holds a duplicate of ``fd`` (Python < 3.13 has no ``trackfd=False``): the views
    are short-lived (decoded at once)."""
    if not hasattr(mmap, "MAP_SHARED") or start < 0 or n <= 0:
        return None
    try:
        size = os.fstat(fd).st_size
        n = min(n, size - start)
        if n <= 0:
            return None
        lo = start - start % mmap.ALLOCATIONGRANULARITY
        mapped = mmap.mmap(fd, start + n - lo, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                           prot=mmap.PROT_READ, offset=lo)
    except (OSError, ValueError, OverflowError):  # ENODEV (no mmap on this file system), ENOMEM
        return None
    return memoryview(mapped)[start - lo : start - lo + n]


class ObjectStore:
    """Synchronous access to the objects of one zarr ``store`` (see module docstring).

    ``name`` is what error messages call the store (e.g. the ``tensors.zarr`` path, the
    ``s3://`` URL); ``endpoint`` (remote stores) is named too when the store cannot be
    reached. A transport failure (connection refused, timeouts after the client's retries,
    access denied) raises :class:`~dumpdb.errors.StorageError`, one line naming both.
    """

    def __init__(self, store: Store | None, name: str | None = None, endpoint: str | None = None, *,
                 root: str | os.PathLike[str] | None = None, read_only: bool = True):
        self._store = store
        self.name = name or str(store if store is not None else root)
        self.endpoint = endpoint
        if store is not None:
            self._root: str | None = getattr(store, "root", None) if _is_local(store) else None
            self._read_only = bool(store.read_only)
        else:  # local(): the files under root
            self._root, self._read_only = str(root), read_only
        self._sync = False
        self._proto: Any = None
        # False: a local store's reads are all pread copies, none a mapping (_read_file,
        # map_private). A page of a mapping that the disk cannot read, or that a file truncated
        # in place from outside no longer has, kills the process with SIGBUS where a pread
        # raises OSError or comes back short; verify, whose job is to report such files, sets
        # it False (archival/verify.py).
        self.map_reads = True
        if store is not None:
            self._adopt(store)

    @classmethod
    def local(cls, root: str | os.PathLike[str], read_only: bool = True, name: str | None = None) -> ObjectStore:
        """The objects of a store on local disk: the files under ``root`` (``<root>/<key>``,
        the layout of zarr's ``LocalStore``), read without zarr (module docstring); its
        zarr Store, a :class:`~dumpdb.storage.local.DurableLocalStore`, is made on first
        need. ``read_only`` False: it may be written (through that store)."""
        return cls(None, name or str(root), root=root, read_only=read_only)

    def _adopt(self, store: Store) -> None:
        from zarr.abc.store import SupportsSyncStore
        from zarr.core.buffer import default_buffer_prototype

        self._sync = isinstance(store, SupportsSyncStore)
        self._proto = default_buffer_prototype()

    @property
    def store(self) -> Store:
        """The zarr Store underneath (for :meth:`local`: a DurableLocalStore of its root,
        made now if not yet, importing zarr)."""
        if self._store is None:
            configure_zarr()
            from dumpdb.storage.local import DurableLocalStore

            store = DurableLocalStore(str(self._root), read_only=self._read_only)
            self._adopt(store)
            self._store = store
        return self._store

    def __repr__(self) -> str:
        return f"<ObjectStore {self.name}>"

    @property
    def read_only(self) -> bool:
        """True if the underlying zarr store refuses writes."""
        return self._read_only if self._store is None else bool(self._store.read_only)

    def where(self, key: str) -> str:
        """``<store>/<key>``: how messages name an object."""
        return f"{self.name.rstrip('/')}/{key}"

    def call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` with transport failures turned into one-line StorageErrors
        (``what``: the operation and object, for the message)."""
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if not is_transport_error(exc):
                raise
            raise self.storage_error(what, exc) from exc

    def storage_error(self, what: str, exc: BaseException) -> StorageError:
        """The one-line StorageError for a transport failure ``exc`` while doing ``what``
        (names the store and its endpoint; for failures inside zarr's own calls)."""
        at = f" at {self.endpoint}" if self.endpoint else ""
        return StorageError(f"{self.name}{at}: cannot {what}: {_first_line(exc)}")

    def _async(self, what: str, coro: Coroutine[Any, Any, T]) -> T:
        return self.call(what, _run, coro)

    # -- reading ---------------------------------------------------------------
    def _get(self, key: str, byte_range: RangeByteRequest | SuffixByteRequest | None) -> Buffer | None:
        store = self.store
        if self._sync:
            return store.get_sync(key, prototype=self._proto, byte_range=byte_range)  # type: ignore[attr-defined]
        return self._async(f"read {key}", store.get(key, self._proto, byte_range))

    def _read_file(self, key: str, start: int | None, end: int | None,
                   suffix: int | None = None, mapped: bool = True) -> bytes | memoryview | None:
        """Bytes of the file of object ``key`` in a local store (``_root``): ``[start, end)``,
        the last ``suffix`` bytes, or the whole file; None if it does not exist (what zarr's
        LocalStore answers; a range past the end comes back short, as there). A range of
        :data:`MAP_READ_BYTES` or more (a pack frame, a large array's shard) comes as a
        read-only view of the file mapped (:func:`_map_range`), a smaller one (or any, not
        ``mapped``) as ``pread``'s bytes."""
        try:
            fd = os.open(os.path.join(str(self._root), key), os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            if start is not None and end is not None:
                lo, n = start, max(end - start, 0)
            else:
                size = os.fstat(fd).st_size
                lo = max(size - suffix, 0) if suffix is not None else 0
                n = size - lo
            if mapped and self.map_reads and n >= MAP_READ_BYTES:
                view = _map_range(fd, lo, n)
                if view is not None:
                    return view
            return os.pread(fd, n, lo)
        except IsADirectoryError:
            return None
        finally:
            os.close(fd)

    def get(self, key: str, start: int | None = None, end: int | None = None, *, mapped: bool = True) -> memoryview:
        """The bytes ``[start, end)`` of object ``key`` (the whole object when both are None),
        as a view of the buffer the store returned (no copy: pack frames are up to a 4 MiB
        chunk and are decoded straight from it; never write to it, ``bytes(...)`` it to keep it).
        ``mapped`` False: a local store's large read is a ``pread`` too, not a mapping
        (:meth:`_read_file`): a disk's read error is then an OSError, where a mapped page that
        cannot be read is SIGBUS, the end of the process (:meth:`checksum`, verify's reads).

        Raises PayloadMissing if the object does not exist, PayloadCorrupt if it
        ends before ``end``.
        """
        if start is not None and end is None:
            raise ValueError("get(): give end with start (use get_suffix for a tail)")
        if self._root is not None:
            raw = self._read_file(key, None if end is None else start or 0, end, mapped=mapped)
            buf: Any = raw if raw is None or isinstance(raw, memoryview) else memoryview(raw)
        elif start is None and end is None:
            buf = self._get(key, None)
        else:
            from zarr.abc.store import RangeByteRequest

            lo = start or 0
            buf = self._get(key, RangeByteRequest(lo, max(end or 0, lo)))
        if buf is None:
            raise PayloadMissing(f"{self.where(key)}: object missing from the tensor store")
        data = buf if isinstance(buf, memoryview) else _view(buf)
        if end is not None and len(data) != end - (start or 0):
            raise PayloadCorrupt(f"{self.where(key)}: object too short for bytes [{start or 0}, {end}) "
                                 f"(got {len(data)} of {end - (start or 0)})")
        return data

    def get_suffix(self, key: str, n: int) -> memoryview:
        """The last ``n`` bytes of object ``key`` (a view, as :meth:`get`); PayloadCorrupt
        if it is shorter."""
        if self._root is not None:
            raw = self._read_file(key, None, None, suffix=n)
            buf: Any = raw if raw is None else memoryview(raw)
        else:
            from zarr.abc.store import SuffixByteRequest

            buf = self._get(key, SuffixByteRequest(n))
        if buf is None:
            raise PayloadMissing(f"{self.where(key)}: object missing from the tensor store")
        data = buf if isinstance(buf, memoryview) else _view(buf)
        if len(data) != n:
            raise PayloadCorrupt(f"{self.where(key)}: object has {len(data)} bytes, fewer than the {n} expected")
        return data

    def get_into(self, key: str, start: int, out: memoryview,
                 on_piece: Callable[[memoryview], None] | None = None, piece_bytes: int = 8 << 20) -> None:
        """Fill ``out`` (a writable byte view) with the bytes ``[start, start + len(out))`` of
        object ``key``: straight from the file into ``out`` for a store on local disk (one
        copy, as ``np.load`` does), else through :meth:`get`. ``on_piece``: called with each
        consecutive piece of ``out`` (``piece_bytes`` each, the last shorter) as soon as it is
        filled, in order, so a caller can hash piece k while piece k+1 is read. Raises as
        :meth:`get`."""
        root = self._root
        if root is not None:
            path = os.path.join(root, key)
            step = piece_bytes if on_piece is not None else max(len(out), 1)
            got = 0
            try:
                with open(path, "rb", buffering=0) as f:
                    f.seek(start)
                    while got < len(out):
                        end = min(got + step, len(out))
                        piece = out[got:end]
                        filled = 0
                        while filled < len(piece):
                            more = f.readinto(piece[filled:])
                            if not more:
                                break
                            filled += more
                        got += filled
                        if filled < len(piece):
                            break
                        if on_piece is not None:
                            on_piece(piece)
            except FileNotFoundError as exc:
                raise PayloadMissing(f"{self.where(key)}: object missing from the tensor store") from exc
            if got != len(out):
                raise PayloadCorrupt(f"{self.where(key)}: object too short for bytes [{start}, {start + len(out)}) "
                                     f"(got {got or 0} of {len(out)})")
            return
        out[:] = self.get(key, start, start + len(out))
        if on_piece is not None:
            for i in range(0, len(out), piece_bytes):
                on_piece(out[i : i + piece_bytes])

    def map_private(self, key: str, nbytes: int) -> memoryview | None:
        """The first ``nbytes`` bytes of object ``key`` mapped into memory copy-on-write
        (``mmap`` ``MAP_PRIVATE``, writable: a write changes this process's copy, never the
        file), for a store on local disk; None for any other store (or ``map_reads`` False, ``nbytes`` 0, a
        platform without ``MAP_PRIVATE``, a file system that cannot map the file): then
        :meth:`get_into`. Nothing is copied: the pages are the page cache's until written,
        where a read into a new array first has the kernel zero each (huge) page of it and
        then copies the file into it (docs/compare-kernel.md, issue 29). Safe because the
        store never changes a file in place (writes go to a temporary file that is renamed,
        ``durable_put``): a file deleted meanwhile stays readable while mapped. Raises
        PayloadMissing if the object does not exist, PayloadCorrupt if it is shorter than
        ``nbytes``."""
        root = self._root
        if not (root is not None and self.map_reads and nbytes > 0 and hasattr(mmap, "MAP_PRIVATE")):
            return None
        try:
            fd = os.open(os.path.join(root, key), os.O_RDONLY)
        except FileNotFoundError as exc:
            raise PayloadMissing(f"{self.where(key)}: object missing from the tensor store") from exc
        except OSError:
            return None  # get_into reads it, or says what is wrong
        try:
            size = os.fstat(fd).st_size
            if size < nbytes:  # mapped pages past the end would raise SIGBUS when read
                raise PayloadCorrupt(f"{self.where(key)}: object too short for bytes [0, {nbytes}) "
                                     f"(got {size} of {nbytes})")
            try:
                mapped = mmap.mmap(fd, nbytes, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
            except OSError:  # ENODEV (a file system without mmap), ENOMEM: read it instead
                return None
        finally:
            os.close(fd)  # the mapping keeps the file
        return memoryview(mapped)

    def exists(self, key: str) -> bool:
        """True if object ``key`` exists (a prefix with objects under it is not one)."""
        return bool(self._async(f"look up {key}", self.store.exists(key)))

    def size(self, key: str) -> int:
        """Size of object ``key`` in bytes; PayloadMissing if it does not exist."""
        try:
            return int(self._async(f"look up {key}", self.store.getsize(key)))
        except FileNotFoundError as exc:
            raise PayloadMissing(f"{self.where(key)}: object missing from the tensor store") from exc

    def size_prefix(self, prefix: str) -> int:
        """Total bytes of the objects under ``prefix`` (``""``: the whole store); sizes come with
        the streamed listing where the store gives them (S3: no request per object)."""
        return sum(size if size is not None else self.size(key) for key, size, _ in self.iter_meta(prefix))

    def checksum(self, key: str) -> str:
        """``crc32c:<hex>`` of object ``key``, read in blocks (bounded memory); an object store
        that has just written ``key`` answers from the bytes it sent (no download). A local
        store's blocks are read (``pread``), never mapped: a read error is an OSError, which
        verify reports as a shard it cannot read (a mapped page would be SIGBUS)."""
        known = getattr(self.store, "written_checksum", None)
        if known is not None and (crc := known(key)) is not None:
            return str(crc)
        total = self.size(key)
        crc = 0
        for lo in range(0, total, _BLOCK):
            crc = google_crc32c.extend(crc, bytes(self.get(key, lo, min(lo + _BLOCK, total), mapped=False)))
        return f"crc32c:{crc:08x}"

    def list_prefix(self, prefix: str) -> list[str]:
        """Every object key under ``prefix`` (recursively), sorted."""
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        return sorted(self.iter_prefix(prefix))

    def iter_prefix(self, prefix: str) -> Iterator[str]:
        """Every object key under ``prefix``, streamed (pages of 1000 keys; unsorted): an
        archive of 10^6 objects is listed without holding the listing in memory."""
        for key, _size, _mtime in self.iter_meta(prefix):
            yield key

    def iter_meta(self, prefix: str) -> Iterator[tuple[str, int | None, float | None]]:
        """``(key, size, mtime)`` of every object under ``prefix``, streamed as :meth:`iter_prefix`.

        Size and mtime (seconds since the epoch) come with the listing where the store gives
        them (S3: ListObjectsV2; local: stat); otherwise None.
        """
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        lister = getattr(self.store, "list_meta", None)
        if lister is not None:
            yield from _guarded(self, prefix, lister(prefix))
            return
        it = self.store.list_prefix(prefix).__aiter__()
        while True:
            batch = self._async(f"list {prefix or '/'}", _take(it, _PAGE))
            for key in batch:
                yield key, None, None
            if len(batch) < _PAGE:
                return

    def list_dir(self, prefix: str) -> list[str]:
        """The names directly under ``prefix`` (objects and sub-prefixes), sorted."""
        return sorted(self._async(f"list {prefix or '/'}", _collect_dir(self.store, prefix)))

    # -- writing ---------------------------------------------------------------
    def set(self, key: str, parts: bytes | Iterable[bytes | bytearray | memoryview]) -> int:
        """Write object ``key`` whole (``parts`` back to back); durable and visible
        when this returns. Returns its size in bytes."""
        chunks = [parts] if isinstance(parts, (bytes, bytearray, memoryview)) else list(parts)
        put_parts = getattr(self.store, "set_parts_sync", None)
        if put_parts is not None:
            return int(self.call(f"write {key}", put_parts, key, chunks))
        data = b"".join(chunks)
        buf = self._proto.buffer.from_bytes(data)
        if self._sync:
            self.store.set_sync(key, buf)  # type: ignore[attr-defined]
        else:
            self._async(f"write {key}", self.store.set(key, buf))
        return len(data)

    def set_if_not_exists(self, key: str, data: bytes) -> None:
        """Write object ``key`` unless it exists (then nothing changes)."""
        store = self.store  # made first: it sets _proto
        self._async(f"write {key}", store.set_if_not_exists(key, self._proto.buffer.from_bytes(data)))

    def delete(self, key: str) -> None:
        """Delete object ``key`` (no error if it is gone already)."""
        store = self.store  # made first: it sets _sync
        if self._sync:
            store.delete_sync(key)  # type: ignore[attr-defined]
        else:
            self._async(f"delete {key}", store.delete(key))

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under ``prefix``; returns how many there were."""
        keys = self.list_prefix(prefix)
        if keys:  # LocalStore: its directories too
            self._async(f"delete {prefix}", self.store.delete_dir(prefix.rstrip("/")))
        return len(keys)


def _is_local(store: Any) -> bool:
    """True for zarr's LocalStore (and DurableLocalStore): its objects are the files
    ``<root>/<key>``. Asked only of a store that exists, so zarr is imported already."""
    if store is None:
        return False
    from zarr.storage import LocalStore

    return isinstance(store, LocalStore) and getattr(store, "root", None) is not None


def _guarded(objects: ObjectStore, prefix: str, it: Iterator[T]) -> Iterator[T]:
    """``it`` with transport failures of each page turned into StorageError (see ObjectStore.call)."""
    while True:
        try:
            item = objects.call(f"list {prefix or '/'}", next, it)
        except StopIteration:
            return
        yield item
