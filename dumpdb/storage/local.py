"""A local-disk zarr Store that keeps dumpdb's durability promise.

:class:`zarr.storage.LocalStore` writes through a temporary file and a rename,
but never fsyncs: after a power loss a renamed file may be empty. dumpdb commits
catalog rows that reference a pack right after writing it, so every object must be
on disk before ``set`` returns. :class:`DurableLocalStore` therefore writes each
object (a whole pack shard, a ``zarr.json``, a large array's shard) as:

1. a temporary file beside the final name (``<name>.tmp-<pid>-<random>``),
2. ``fsync`` of the file,
3. a rename onto the final name (``os.replace``; ``set_if_not_exists`` links
   instead, so an existing object is never replaced),
4. ``fsync`` of the directory, and of every directory created on the way.

A crash at any step leaves at worst a temporary file (never a half-written object
under its final name). Readers see an object only once it is complete, which is
what an object store (S3 PUT) guarantees too: nothing above this module relies on
renames.
"""

from __future__ import annotations

import errno
import mmap
import os
import uuid
from pathlib import Path

from zarr.abc.store import ByteRequest, RangeByteRequest
from zarr.core.buffer import Buffer, BufferPrototype, default_buffer_prototype
from zarr.storage import LocalStore

TMP_MARK = ".tmp-"  # temporary files: ``<name>.tmp-<pid>-<hex>``; never an object name


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a directory's entries (a rename, a new file) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _make_parents(path: Path, root: Path) -> None:
    """Create ``path``'s missing parent directories, each made durable in its parent."""
    missing = []
    parent = path.parent
    while not parent.exists():
        missing.append(parent)
        if parent == root or parent == parent.parent:
            break
        parent = parent.parent
    for directory in reversed(missing):
        try:
            directory.mkdir()
        except FileExistsError:
            continue  # made meanwhile by a concurrent writer
        fsync_dir(directory.parent)


# Objects from this size (pack shards, large arrays' shards) are written with O_DIRECT from a
# reused page-aligned staging buffer: no page cache to fill and write back, a fifth of the CPU
# of a buffered write + fsync and less wall time (docs/storage-design.md, "Writing around the
# page cache"). Their pages are then not cached: the first read of a new archive goes to the
# disk. DIRECT_WRITES False writes every object buffered.
DIRECT_WRITE_MIN_BYTES = 1 << 20
DIRECT_WRITES = True
_STAGE_BYTES = 8 << 20  # per object being written
_ALIGN = 4096  # a page: offsets, lengths and addresses of a direct write
_NO_DIRECT_ROOTS: set[Path] = set()  # stores whose file system refused O_DIRECT: written buffered
_stages: list[memoryview] = []  # staging buffers not in use (list.append/pop: atomic)


def _write_direct(tmp: Path, parts: list[bytes | bytearray | memoryview], root: Path) -> int | None:
    """Write ``parts`` as the new file ``tmp`` with O_DIRECT and fsync it; the bytes
    written, or None (nothing left behind but an empty ``tmp``) where a buffered write
    must do it: a small object, ``DIRECT_WRITES`` off, or a file system that refuses
    O_DIRECT (EINVAL at open or write: remembered per store root). Other OSErrors
    (ENOSPC...) propagate."""
    total = sum(memoryview(p).nbytes for p in parts)
    if not DIRECT_WRITES or total < DIRECT_WRITE_MIN_BYTES or root in _NO_DIRECT_ROOTS \
            or not hasattr(os, "O_DIRECT"):
        return None
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_DIRECT | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        _NO_DIRECT_ROOTS.add(root)
        return None
    stage = None
    try:
        stage = _take_stage()
        fill = 0
        for part in parts:
            view = memoryview(part).cast("B")
            offset = 0
            while offset < len(view):
                n = min(len(stage) - fill, len(view) - offset)
                stage[fill:fill + n] = view[offset:offset + n]
                fill += n
                offset += n
                if fill == len(stage):
                    if not _write_all(fd, stage):
                        _undo(fd, root)
                        return None
                    fill = 0
        if fill:
            padded = -(-fill // _ALIGN) * _ALIGN  # whole pages; the tail is cut off below
            stage[fill:padded] = bytes(padded - fill)
            if not _write_all(fd, stage[:padded]):
                _undo(fd, root)
                return None
        os.ftruncate(fd, total)
        os.fsync(fd)  # the catalog commit that follows must never outlive the bytes (nor the size)
        return total
    finally:
        os.close(fd)
        if stage is not None:
            _stages.append(stage)


def _take_stage() -> memoryview:
    """A page-aligned staging buffer of ``_STAGE_BYTES`` (reused: as many exist as objects
    were ever written at once; the caller gives it back to ``_stages``)."""
    while True:
        try:
            stage = _stages.pop()
        except IndexError:
            return memoryview(mmap.mmap(-1, _STAGE_BYTES))  # anonymous memory: page aligned
        if len(stage) == _STAGE_BYTES:
            return stage


def _write_all(fd: int, view: memoryview) -> bool:
    """One direct write of ``view``; False if the file system refused it (EINVAL) or
    wrote less (then the caller writes the object buffered)."""
    try:
        return os.write(fd, view) == len(view)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        return False


def _undo(fd: int, root: Path) -> None:
    """A direct write failed half way: empty the file for a buffered write of it."""
    _NO_DIRECT_ROOTS.add(root)
    os.ftruncate(fd, 0)


def durable_put(path: Path, parts: list[bytes | bytearray | memoryview], root: Path, exclusive: bool = False) -> int:
    """Write ``parts`` back to back as the file ``path``, durably (module docstring).

    Returns the bytes written. With ``exclusive`` an existing file is kept and
    FileExistsError raised. OSError (ENOSPC...) propagates; the temporary file is removed.
    """
    _make_parents(path, root)
    tmp = path.with_name(f"{path.name}{TMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        written = _write_direct(tmp, parts, root)
        if written is None:
            with open(tmp, "wb") as f:
                f.writelines(parts)
                f.flush()
                os.fsync(f.fileno())  # the catalog commit that follows must never outlive the bytes
                written = f.tell()
        if exclusive:
            os.link(tmp, path)  # raises FileExistsError; never replaces
            os.unlink(tmp)
        else:
            os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return written


class DurableLocalStore(LocalStore):
    """:class:`zarr.storage.LocalStore` whose writes are durable when they return
    (temp file, fsync, rename, directory fsync; see the module docstring).

    Reads, listing and deletes are LocalStore's. :meth:`set_parts_sync` writes an
    object given as several buffers without joining them first (pack shards are
    tens of MB of zstd frames).
    """

    # StoreWriter's writer threads on this store: two, so one write's fsyncs (waits on the
    # disk, no CPU) overlap the next one's compression (issue 12: on a real dump one
    # thread left the main thread waiting for writes ~1.5 s in 5)
    parallel_writes = 2

    def get_sync(self, key: str, *, prototype: BufferPrototype | None = None,
                 byte_range: ByteRequest | None = None) -> Buffer | None:
        # The hot path of a tensor read (one inner chunk of a pack): one pread, no
        # pathlib and no seek to the end, which LocalStore's get does for every range.
        """A ranged read as one ``pread`` (zarr's sync Store API); None if the object does not exist."""
        if not isinstance(byte_range, RangeByteRequest):
            return super().get_sync(key, prototype=prototype, byte_range=byte_range)
        try:
            fd = os.open(os.path.join(self.root, key), os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            data = os.pread(fd, byte_range.end - byte_range.start, byte_range.start)
        except IsADirectoryError:
            return None
        finally:
            os.close(fd)
        return (prototype or default_buffer_prototype()).buffer.from_bytes(data)

    def set_parts_sync(self, key: str, parts: list[bytes | bytearray | memoryview], exclusive: bool = False) -> int:
        """Write the object ``key`` as ``parts`` back to back; returns its size in bytes."""
        self._ensure_open_sync()
        self._check_writable()
        return durable_put(self.root / key, parts, self.root, exclusive)

    def set_sync(self, key: str, value: Buffer) -> None:
        """Write the whole object durably: temp file, fsync, rename, directory fsync."""
        self.set_parts_sync(key, [value.as_buffer_like()])

    async def _set(self, key: str, value: Buffer, exclusive: bool = False) -> None:
        # zarr's own writes (zarr.json, large-array shards) land here, from its event loop;
        # blocking I/O is fine: LocalStore's own _set runs it in a thread for the same work.
        import asyncio

        if not self._is_open:
            await self._open()
        self._check_writable()
        path = self.root / key
        if exclusive and path.exists():
            # set_if_not_exists of an object that exists: zarr asks it of every parent group's
            # zarr.json at each create_array; refuse before writing and fsyncing a copy
            # (durable_put's link would refuse it after: ~3 wasted fsyncs per array written)
            raise FileExistsError(str(path))
        await asyncio.to_thread(durable_put, path, [value.as_buffer_like()], self.root, exclusive)

    def delete_sync(self, key: str) -> None:
        """Delete the object (missing is fine) and fsync its directory."""
        super().delete_sync(key)
        parent = (self.root / key).parent
        if parent.is_dir():
            fsync_dir(parent)
