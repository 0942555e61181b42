"""Issue 29 item 4: an ingest reads large uncached dump files around the page cache (O_DIRECT).

:func:`dumpdb.dumpio.read_dump_into` reads a file of ``DIRECT_MIN_BYTES`` or more that is not
in the page cache with ``O_DIRECT`` into its page-aligned buffer, and falls back to a buffered
read where the file system refuses it (tmpfs: EINVAL) or a direct read fails with EINVAL half
way. Whatever the path, the bytes are the file's: checked on odd sizes, a read-only file,
reads cut short (as every read of a file over 2 GiB is), and a whole ingest of a real
MindSpore dump, read and written (``storage.local.durable_put``) around the page cache,
whose catalog and payloads equal those of a buffered ingest.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

import numpy as np
import pytest
from catalog_snapshot import catalog_snapshot, payloads_by_source_file
from conftest import ms_case

import dumpdb
from dumpdb import dumpio
from dumpdb.ingestion import pipeline
from dumpdb.storage import local

MIB = 1 << 20


@pytest.fixture(autouse=True)
def _fresh_file_systems(monkeypatch):
    """Each test learns anew which file systems refuse O_DIRECT."""
    monkeypatch.setattr(dumpio, "_NO_DIRECT", set())


def _file(path: Path, size: int, mode: int = 0o644) -> bytes:
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    path.write_bytes(data)
    path.chmod(mode)
    return data


def _drop_from_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # dirty pages cannot be dropped
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _read(path: Path, buffer: dumpio.ReadBuffer) -> bytes:
    got = bytes(dumpio.read_dump_into(path, path.name, buffer))
    if os.stat(path).st_dev in dumpio._NO_DIRECT:
        pytest.skip(f"the file system of {path.parent} has no O_DIRECT: the tmpfs test covers the fallback")
    return got


@pytest.mark.parametrize("size", [MIB, MIB + 123, 3 * MIB - 4095])
def test_direct_reads_give_the_file_bytes(tmp_path, monkeypatch, size):
    monkeypatch.setattr(dumpio, "DIRECT_READS", "always")
    path = tmp_path / "x.npy"
    data = _file(path, size, 0o400)  # read-only, as dumps copied from elsewhere often are
    buffer = dumpio.ReadBuffer()
    assert _read(path, buffer) == data and buffer.direct
    # page aligned, so the kernel can move the blocks straight into it
    assert np.frombuffer(buffer.data, np.uint8).ctypes.data % os.sysconf("SC_PAGE_SIZE") == 0
    monkeypatch.setattr(dumpio, "DIRECT_MIN_BYTES", size + 1)  # below the threshold: buffered
    assert _read(path, buffer) == data and not buffer.direct


def test_only_uncached_files_go_around_the_page_cache(tmp_path):
    assert dumpio.DIRECT_READS == "uncached"
    path = tmp_path / "x.npy"
    data = _file(path, 2 * MIB + 5)
    buffer = dumpio.ReadBuffer()
    assert _read(path, buffer) == data and not buffer.direct  # just written: in the page cache
    _drop_from_cache(path)
    assert _read(path, buffer) == data and buffer.direct
    assert _read(path, buffer) == data and buffer.direct  # a direct read does not fill the cache


def test_short_direct_reads_are_continued(tmp_path, monkeypatch):
    """Linux moves at most 2 GiB - 4 KiB per read: a file over 2 GiB takes several reads,
    each a whole number of pages; here every read is cut to 64 KiB."""
    monkeypatch.setattr(dumpio, "DIRECT_READS", "always")
    path = tmp_path / "x.npy"
    data = _file(path, 4 * MIB + 777)
    readv, calls = os.readv, []

    def short_readv(fd, buffers):
        calls.append(fd)
        return readv(fd, [memoryview(buffers[0])[:64 << 10]])

    monkeypatch.setattr(os, "readv", short_readv)
    buffer = dumpio.ReadBuffer()
    assert _read(path, buffer) == data and buffer.direct and len(calls) == 65


def test_a_direct_read_failing_with_einval_goes_on_buffered(tmp_path, monkeypatch):
    monkeypatch.setattr(dumpio, "DIRECT_READS", "always")
    path = tmp_path / "x.npy"
    data = _file(path, 2 * MIB + 1)
    readv, direct_calls = os.readv, []

    def failing_readv(fd, buffers):
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            direct_calls.append(fd)
            if len(direct_calls) > 1:  # the first read went through, the second is refused
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return readv(fd, [memoryview(buffers[0])[:MIB]])

    monkeypatch.setattr(os, "readv", failing_readv)
    buffer = dumpio.ReadBuffer()
    assert bytes(dumpio.read_dump_into(path, "x.npy", buffer)) == data and not buffer.direct
    assert len(direct_calls) == 2 and os.stat(path).st_dev in dumpio._NO_DIRECT
    assert bytes(dumpio.read_dump_into(path, "x.npy", buffer)) == data and len(direct_calls) == 2  # not asked again


def test_a_file_system_refusing_o_direct_is_read_buffered(tmp_path, monkeypatch):
    """tmpfs refused O_DIRECT with EINVAL before Linux 6.6 (as some FUSE and network file
    systems still do): the file is read buffered and its file system not asked again."""
    monkeypatch.setattr(dumpio, "DIRECT_READS", "always")
    shm = Path("/dev/shm")
    where = shm if shm.is_dir() and os.access(shm, os.W_OK) else tmp_path
    path = where / f"dumpdb-test-{os.getpid()}.npy"
    try:
        data = _file(path, MIB + 9, 0o400)
        buffer = dumpio.ReadBuffer()
        # whatever this kernel's tmpfs says, the bytes are the file's
        assert bytes(dumpio.read_dump_into(path, path.name, buffer)) == data
        assert buffer.direct == (os.stat(path).st_dev not in dumpio._NO_DIRECT)
        # a refusal of the flag, as fcntl(F_SETFL, O_DIRECT) gives it on such a file system
        monkeypatch.setattr(dumpio, "_NO_DIRECT", set())
        setfl, asked = fcntl.fcntl, []

        def refusing(fd, cmd, arg=0):
            if cmd == fcntl.F_SETFL and arg & os.O_DIRECT:
                asked.append(fd)
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
            return setfl(fd, cmd, arg)

        monkeypatch.setattr(fcntl, "fcntl", refusing)
        for _ in range(2):
            assert bytes(dumpio.read_dump_into(path, path.name, buffer)) == data and not buffer.direct
        assert len(asked) == 1 and os.stat(path).st_dev in dumpio._NO_DIRECT
    finally:
        path.unlink(missing_ok=True)


def test_an_ingest_reading_and_writing_around_the_page_cache_stores_the_same(tmp_path, monkeypatch):
    dump = ms_case("d2_compare_fp16_bf16_iter0")
    # every file through the reader threads' buffers and read with O_DIRECT, every object
    # of the store (shards, zarr.json) written with O_DIRECT
    monkeypatch.setattr(pipeline, "READ_BUFFER_MIN_BYTES", 0)
    monkeypatch.setattr(dumpio, "DIRECT_MIN_BYTES", 0)
    monkeypatch.setattr(dumpio, "DIRECT_READS", "always")
    monkeypatch.setattr(local, "DIRECT_WRITE_MIN_BYTES", 1)
    monkeypatch.setattr(local, "_NO_DIRECT_ROOTS", set())
    reads, opened = [], []
    read_dump_into, os_open = dumpio.read_dump_into, os.open

    def spy(path, where, buffer, confined=True):
        view = read_dump_into(path, where, buffer, confined)
        reads.append(buffer.direct)
        return view

    monkeypatch.setattr(dumpio, "read_dump_into", spy)
    monkeypatch.setattr("dumpdb.npy.read_dump_into", spy)
    monkeypatch.setattr(os, "open", lambda path, flags, *a, **k: opened.append(flags) or os_open(path, flags, *a, **k))
    direct = dumpdb.ingest(dump, tmp_path / "direct", run="r", workers=1)
    if os.stat(dump).st_dev in dumpio._NO_DIRECT or local._NO_DIRECT_ROOTS:
        pytest.skip("the corpus's or tmp_path's file system has no O_DIRECT: the refusal tests cover the fallback")
    assert direct.ok and direct.tensors_added > 0 and reads and all(reads)
    assert sum(1 for f in opened if f & os.O_DIRECT) >= 2  # a shard and its zarr.json at least
    monkeypatch.setattr(dumpio, "DIRECT_READS", "never")
    monkeypatch.setattr(local, "DIRECT_WRITES", False)
    buffered = dumpdb.ingest(dump, tmp_path / "buffered", run="r", workers=1)
    assert buffered.ok and buffered.tensors_added == direct.tensors_added
    assert catalog_snapshot(tmp_path / "direct") == catalog_snapshot(tmp_path / "buffered")
    got = payloads_by_source_file(tmp_path / "direct")
    assert got == payloads_by_source_file(tmp_path / "buffered") and len(got) == direct.tensors_added
    with dumpdb.open(tmp_path / "direct") as arch:
        assert arch.verify().ok
