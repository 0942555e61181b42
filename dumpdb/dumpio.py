"""Opening dump files safely: regular files only, bounded reads, confined to the dump.

A dump directory may come from someone else (issue 14, "Hangs and memory bombs",
"Symlinks that leave the dump directory"). Every dump file dumpdb reads goes
through :func:`open_dump_file`, :func:`read_dump_bytes` or :func:`read_dump_text`:

* the path is ``os.stat``-ed **before** it is opened: a FIFO, socket or device
  (also through a symlink, e.g. ``x.npy -> /dev/zero``) is refused, so a read
  never blocks or streams forever; the open itself uses ``O_NONBLOCK`` and the
  descriptor is checked again (a FIFO swapped in between is refused too);
* a read never returns more than the file's size at open time, and callers give
  a ceiling (``max_bytes``) for files read whole into memory;
* during an ingest (:func:`confine`), a path whose real location is outside the
  dump directory (a symlink leaving it, at any level) is refused unless the user
  asked for ``--follow-symlinks``. Symlinks that stay inside the dump work.

Every refusal is a :class:`~dumpdb.errors.DumpFileError` whose one-line message
starts with the file's name as the caller gives it (``where``).
"""

from __future__ import annotations

import contextvars
import errno
import fcntl
import functools
import mmap
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from dumpdb.errors import DumpFileError

# Text files read whole (IR, execution orders, csv, json): far above any real one
# (the largest IR of the corpus is a few MB) and far below what hurts a machine.
MAX_TEXT_BYTES = 512 << 20

_KINDS = {
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFDIR: "a directory",
}


@dataclass
class _Confinement:
    root: str  # real path of the dump directory
    follow_symlinks: bool
    inside: dict[str, bool] = field(default_factory=dict)  # directory -> its real path is inside root


_confinement: contextvars.ContextVar[_Confinement | None] = contextvars.ContextVar(
    "dumpdb_confinement", default=None)


@contextmanager
def confine(root: str | os.PathLike, follow_symlinks: bool = False) -> Iterator[None]:
    """Within the block (and in contexts copied from it), dump files must lie inside
    ``root`` once symlinks are resolved, unless ``follow_symlinks``."""
    token = _confinement.set(_Confinement(os.path.realpath(root), follow_symlinks))
    try:
        yield
    finally:
        _confinement.reset(token)


def confined(root: str | os.PathLike) -> bool:
    """True inside :func:`confine` of the directory ``root`` (its real path)."""
    conf = _confinement.get()
    return conf is not None and conf.root == os.path.realpath(root)


def _outside(path: str, conf: _Confinement) -> str | None:
    """The real path of ``path`` if it lies outside the confinement root, else None."""
    directory, name = os.path.split(os.path.abspath(path))
    inside = conf.inside.get(directory)
    if inside is None:
        real_dir = os.path.realpath(directory)
        inside = real_dir == conf.root or real_dir.startswith(conf.root.rstrip(os.sep) + os.sep)
        conf.inside[directory] = inside
    if inside and not os.path.islink(path):
        return None
    real = os.path.realpath(path)
    if real == conf.root or real.startswith(conf.root.rstrip(os.sep) + os.sep):
        return None
    return real


def leaves_dump(path: str | os.PathLike) -> str | None:
    """Inside :func:`confine` without ``follow_symlinks``: the real path of ``path``
    if it lies outside the dump directory (a directory symlink leaving it), else None.
    Lets a reader refuse a whole directory with one line instead of one per file."""
    conf = _confinement.get()
    if conf is None or conf.follow_symlinks:
        return None
    return _outside(os.fspath(path), conf)


def check_dump_file(path: str | os.PathLike, where: str, confined: bool = True) -> os.stat_result:
    """``os.stat`` of ``path`` if it is a regular file dumpdb may read.

    Raises :class:`DumpFileError` for a missing or unreadable path, a FIFO,
    socket, device or directory, and (inside :func:`confine`, unless not
    ``confined``: a file read from beside the dump on purpose) a path that
    resolves outside the dump directory.
    """
    path = os.fspath(path)
    conf = _confinement.get()
    st = None
    if confined and conf is not None and not conf.follow_symlinks:
        # One lstat per file in the usual case (a file, not a symlink, in a directory inside
        # the dump): it tells both "not a symlink" and the kind (ingest's per-file cost).
        directory = os.path.dirname(os.path.abspath(path))
        if conf.inside.get(directory):
            try:
                st = os.lstat(path)
            except OSError as exc:
                raise DumpFileError(f"{where}: cannot read: {exc.strerror or exc}") from exc
            if stat.S_ISLNK(st.st_mode):
                st = None
        if st is None:
            real = _outside(path, conf)
            if real is not None:
                raise DumpFileError(f"{where}: symlink leads outside the dump directory (to {real}); "
                                    "not followed (--follow-symlinks allows it)")
    if st is None:
        try:
            st = os.stat(path)
        except OSError as exc:
            raise DumpFileError(f"{where}: cannot read: {exc.strerror or exc}") from exc
    if not stat.S_ISREG(st.st_mode):
        kind = _KINDS.get(stat.S_IFMT(st.st_mode), "not a regular file")
        raise DumpFileError(f"{where}: is {kind}, not a regular file; refused")
    return st


def open_dump_file(path: str | os.PathLike, where: str, confined: bool = True) -> int:
    """A read-only file descriptor of a regular dump file (see :func:`check_dump_file`).

    The caller closes it. Opened with ``O_NONBLOCK`` and checked again with
    ``fstat``, so a FIFO put in place after the check cannot block.
    """
    return _open_checked(path, where, confined)[0]


def _open_checked(path: str | os.PathLike, where: str, confined: bool) -> tuple[int, os.stat_result]:
    """:func:`open_dump_file` and the descriptor's ``fstat``."""
    check_dump_file(path, where, confined)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise DumpFileError(f"{where}: cannot read: {exc.strerror or exc}") from exc
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise DumpFileError(f"{where}: is not a regular file; refused")
    return fd, st


def read_dump_bytes(path: str | os.PathLike, where: str, max_bytes: int | None = None,
                    confined: bool = True) -> bytes:
    """The whole content of a regular dump file, at most its size at open time.

    Raises :class:`DumpFileError` if the file is refused (:func:`check_dump_file`),
    cannot be read, or is larger than ``max_bytes``.
    """
    fd, st = _open_checked(path, where, confined)
    try:
        size = st.st_size
        if max_bytes is not None and size > max_bytes:
            raise DumpFileError(f"{where}: {size} bytes, more than the {max_bytes} this file kind may hold; "
                                "refused")
        chunks, got = [], 0
        while got < size:
            chunk = os.read(fd, min(size - got, 64 << 20))
            if not chunk:
                break  # shrank while read: the caller's size checks report it
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)
    except OSError as exc:
        raise DumpFileError(f"{where}: cannot read: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)


class ReadBuffer:
    """Memory reused to read whole dump files, one file at a time (one per reader thread).

    A fresh buffer per file costs the kernel a page fault and a page of zeroes for every
    4 KiB read (~0.4 s of CPU per GB, issue 12's ``perf`` of a real dump); a reused one is
    faulted in once. Its memory is an anonymous ``mmap``: page aligned, so a read may go
    around the page cache (:func:`read_dump_into`, ``O_DIRECT``). What is read into it is
    a view, valid until the next read: the reader copies what it keeps
    (:func:`dumpdb.ingestion.workers.load_entry`). ``used`` tells whether a read went into
    it since the reader last cleared it; ``direct`` whether the last read into it went
    around the page cache (to the end of the file).
    """

    def __init__(self) -> None:
        self.data: mmap.mmap | bytearray = bytearray()
        self.used = False
        self.direct = False

    def view(self, size: int) -> memoryview:
        """``size`` bytes of the buffer, starting on a page boundary (grown, by a new
        mapping rounded up to whole pages, when smaller)."""
        if len(self.data) < size:
            grown = max(size, 2 * len(self.data))
            # the old mapping lives on while views of it do (a memoryview keeps its exporter)
            self.data = mmap.mmap(-1, -(-grown // mmap.PAGESIZE) * mmap.PAGESIZE)
        return memoryview(self.data)[:size]


# Reads that go around the page cache (O_DIRECT): the kernel moves the file's blocks
# straight into the reader's buffer instead of filling the page cache and copying out of
# it: a third of the CPU of a buffered read of an uncached dump (docs/storage-design.md,
# "Reading around the page cache"). Only for files from DIRECT_MIN_BYTES (a small file's
# blocks cost a request each; its copy is cheap) and only where the file is not already
# in the page cache (DIRECT_READS "uncached": a cached file is copied at memory speed, a
# direct read of it waits for the disk); "always" and "never" are for measuring.
DIRECT_MIN_BYTES = 1 << 20
DIRECT_READS = "uncached"
_DIRECT_ALIGN = 4096  # offsets, lengths and addresses of a direct read: a page covers every logical block size
# st_dev of file systems that refused O_DIRECT (tmpfs, some FUSE and network file systems):
# asked once per file system, then read buffered
_NO_DIRECT: set[int] = set()


@functools.cache
def libc() -> Any:
    """The C library's functions through ctypes (``ctypes.CDLL``, ``errno`` kept for
    ``ctypes.get_errno``), or None where the process cannot load it. The process's own
    global symbols (``dlopen(NULL)``): the C library the interpreter runs on, found without
    ``ctypes.util.find_library``'s ``ldconfig`` subprocess. The one place dumpdb loads it
    (``mincore`` here, ``malloc_trim`` in ``runtime``, ``prctl`` in ingest workers); a
    function the C library lacks (``malloc_trim`` outside glibc) raises AttributeError at
    the caller."""
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


class _Mincore:
    """``mincore(2)`` of a file's pages through ctypes (Python's ``mmap`` has no mincore):
    the share of a file in the page cache, read without touching the file, so without the
    readahead a probing read starts (``preadv2(RWF_NOWAIT)`` of an uncached page queues
    its readahead: the next probe would find it cached)."""

    def __init__(self) -> None:
        import ctypes

        c = libc()
        if c is None:
            raise OSError("no C library")
        self.mmap, self.munmap, self.mincore = c.mmap, c.munmap, c.mincore
        self.mmap.restype = ctypes.c_void_p
        self.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long]
        self.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        self.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
        self.failed = ctypes.c_void_p(-1).value
        self.buffer = ctypes.create_string_buffer

    def resident(self, fd: int, size: int) -> float | None:
        """Share (0..1) of the file's pages in the page cache; None if it cannot tell.
        The mapping is never read (no page fault, no SIGBUS if the file shrinks)."""
        addr = self.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr is None or addr == self.failed:
            return None
        try:
            pages = -(-size // mmap.PAGESIZE)
            vec = self.buffer(pages)
            if self.mincore(addr, size, vec) != 0:
                return None
            # the low bit of each page's byte tells; the others are reserved
            return vec.raw[:pages].translate(_LOW_BIT).count(1) / pages if pages else 1.0
        finally:
            self.munmap(addr, size)


_mincore: _Mincore | None = None
_LOW_BIT = bytes(i & 1 for i in range(256))


def _direct_wanted(fd: int, st: os.stat_result) -> bool:
    """Whether to read this file with O_DIRECT: large, on a file system not known to
    refuse it and (DIRECT_READS "uncached") at most half of it in the page cache
    (:class:`_Mincore`; where that cannot tell, buffered as before)."""
    global _mincore
    if DIRECT_READS == "never" or st.st_size < DIRECT_MIN_BYTES or st.st_dev in _NO_DIRECT \
            or not hasattr(os, "O_DIRECT"):
        return False
    if DIRECT_READS == "uncached" and st.st_size:
        try:
            _mincore = _mincore or _Mincore()
            share = _mincore.resident(fd, st.st_size)
        except (OSError, AttributeError):  # no libc mincore (not Linux)
            share = None
        return share is not None and share <= 0.5
    return True


def _set_direct(fd: int, on: bool) -> None:
    """Set or clear O_DIRECT on ``fd`` (raises OSError EINVAL where the file system has none)."""
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_DIRECT if on else flags & ~os.O_DIRECT)


_read_buffer: contextvars.ContextVar[ReadBuffer | None] = contextvars.ContextVar("dumpdb_read_buffer", default=None)


@contextmanager
def reading_into(buffer: ReadBuffer) -> Iterator[None]:
    """Within the block, readers that can (:func:`dumpdb.npy.read_npy`) read a whole file
    into ``buffer`` (:func:`read_dump_into`) instead of new memory."""
    token = _read_buffer.set(buffer)
    try:
        yield
    finally:
        _read_buffer.reset(token)


def current_read_buffer() -> ReadBuffer | None:
    """The :class:`ReadBuffer` of :func:`reading_into`, or None."""
    return _read_buffer.get()


def read_dump_into(path: str | os.PathLike, where: str, buffer: ReadBuffer, confined: bool = True) -> memoryview:
    """:func:`read_dump_bytes` into ``buffer``: a view of its first bytes (at most the
    file's size at open time), valid until ``buffer`` is read into again. Raises as
    :func:`read_dump_bytes`.

    A file of ``DIRECT_MIN_BYTES`` or more that is not in the page cache is read with
    ``O_DIRECT`` (whole pages into the page-aligned buffer, the tail past the size
    ignored); a file system that refuses it (EINVAL: tmpfs, ...) is remembered and read
    buffered, as is the rest of a file whose direct read fails with EINVAL. The bytes are
    the same either way."""
    fd, st = _open_checked(path, where, confined)
    try:
        size = st.st_size
        # room for whole pages: a direct read asks for a multiple of the page size
        view = buffer.view(-(-size // _DIRECT_ALIGN) * _DIRECT_ALIGN)
        buffer.used = True
        direct = _direct_wanted(fd, st)
        if direct:
            try:
                _set_direct(fd, True)
            except OSError:
                _NO_DIRECT.add(st.st_dev)
                direct = False
        got = 0
        while got < size:
            if direct:
                try:
                    n = os.readv(fd, [view[got:]])
                except OSError as exc:
                    if exc.errno != errno.EINVAL:
                        raise
                    _NO_DIRECT.add(st.st_dev)  # this file system takes the flag but not the read
                    _set_direct(fd, False)
                    direct = False
                    continue  # the failed read moved nothing: go on buffered from ``got``
                if n % _DIRECT_ALIGN:
                    got += n
                    break  # a short direct read is the end of the file
            else:
                n = os.readv(fd, [view[got:size]])
            if not n:
                break  # shrank while read: the caller's size checks report it
            got += n
        buffer.direct = direct
        return view[:min(got, size)]  # grown while read: only what it held at open time
    except OSError as exc:
        raise DumpFileError(f"{where}: cannot read: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)


def read_dump_text(path: str | os.PathLike, where: str | None = None, max_bytes: int = MAX_TEXT_BYTES,
                   confined: bool = True) -> str:
    """A text dump file (UTF-8, undecodable bytes replaced), read as :func:`read_dump_bytes`."""
    return read_dump_bytes(path, where or str(path), max_bytes, confined).decode("utf-8", errors="replace")


def looks_binary(text: str) -> bool:
    """True if ``text`` (decoded with ``errors='replace'``) is not text a dump tool
    writes: NUL bytes, or many replacement/control characters in its first 64 KiB."""
    head = text[:65536]
    if "\x00" in head:
        return True
    bad = sum(1 for c in head if c == "\ufffd" or (c < " " and c not in "\t\n\r\f\v"))
    return bad > max(8, len(head) // 100)


def reason(exc: BaseException, path: str | os.PathLike | None = None) -> str:
    """What is wrong, for a scan error line whose file is named separately: an
    OSError's strerror, or a dumpdb message without its leading ``path: ``."""
    if isinstance(exc, OSError):
        return f"cannot read: {exc.strerror or exc}"
    text = " ".join(str(exc).split())
    prefix = f"{os.fspath(path)}: " if path is not None else None
    return text[len(prefix):] if prefix and text.startswith(prefix) else text
