"""Issue 29 item 4: the local store writes large objects with O_DIRECT.

:func:`dumpdb.storage.local.durable_put` writes an object of ``DIRECT_WRITE_MIN_BYTES`` or
more through a page-aligned staging buffer with ``O_DIRECT`` (whole pages, the file then cut
to its size), and writes it buffered where the file system refuses that (EINVAL at open or
at a write, remembered per store root). Either way the object holds exactly its parts,
under its final name only, with no temporary file left. A whole ingest written so stores
what a buffered one does: tests/test_dumpio_direct.py.
"""

from __future__ import annotations

import errno
import fcntl
import os

import pytest

from dumpdb.storage import local

MIB = 1 << 20


@pytest.fixture(autouse=True)
def _fresh_roots(monkeypatch):
    """Each test learns anew which stores refuse O_DIRECT."""
    monkeypatch.setattr(local, "_NO_DIRECT_ROOTS", set())


def _parts(total: int) -> list[bytes]:
    """Random parts of unaligned sizes (as zstd frames are), ``total`` bytes in all."""
    sizes, out = [MIB // 3, 4097, 7], []
    while total:
        n = min(sizes[len(out) % 3], total)
        out.append(os.urandom(n))
        total -= n
    return out


def _spy_direct(monkeypatch) -> list[int]:
    """The flags of every file durable_put opens with os.open."""
    flags: list[int] = []
    real = os.open

    def spy(path, flag, *args, **kwargs):
        flags.append(flag)
        return real(path, flag, *args, **kwargs)

    monkeypatch.setattr(os, "open", spy)
    return flags


@pytest.mark.parametrize("total", [MIB, 3 * MIB + 5, 9 * MIB - 4096 + 1])  # one stage, more, past a full one
def test_a_large_object_is_written_direct_and_whole(tmp_path, monkeypatch, total):
    monkeypatch.setattr(local, "_STAGE_BYTES", 8 * MIB)
    parts = _parts(total)
    flags = _spy_direct(monkeypatch)
    written = local.durable_put(tmp_path / "c" / "0", parts, tmp_path)
    if tmp_path in local._NO_DIRECT_ROOTS:
        pytest.skip(f"the file system of {tmp_path} has no O_DIRECT: the refusal test covers the fallback")
    assert written == total and (tmp_path / "c" / "0").read_bytes() == b"".join(parts)
    assert any(f & os.O_DIRECT for f in flags)
    assert [p.name for p in (tmp_path / "c").iterdir()] == ["0"]  # no temporary file left


def test_small_objects_are_written_buffered(tmp_path, monkeypatch):
    flags = _spy_direct(monkeypatch)
    assert local.durable_put(tmp_path / "zarr.json", [b"{}"], tmp_path) == 2
    assert (tmp_path / "zarr.json").read_bytes() == b"{}" and not any(f & os.O_DIRECT for f in flags)


def test_a_store_refusing_o_direct_is_written_buffered(tmp_path, monkeypatch):
    parts = _parts(2 * MIB + 3)
    real_open = os.open

    def refusing_open(path, flag, *args, **kwargs):  # as open(2) on tmpfs before Linux 6.6
        if flag & os.O_DIRECT:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return real_open(path, flag, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing_open)
    assert local.durable_put(tmp_path / "a", parts, tmp_path) == 2 * MIB + 3
    assert (tmp_path / "a").read_bytes() == b"".join(parts) and tmp_path in local._NO_DIRECT_ROOTS
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]


def test_a_direct_write_refused_half_way_is_written_again_buffered(tmp_path, monkeypatch):
    monkeypatch.setattr(local, "_STAGE_BYTES", MIB)
    parts = _parts(3 * MIB + 11)
    real_write, direct_writes = os.write, []

    def failing_write(fd, data):
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            direct_writes.append(len(data))
            if len(direct_writes) == 2:  # the first stage went out, the second is refused
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", failing_write)
    written = local.durable_put(tmp_path / "a", parts, tmp_path)
    if len(direct_writes) == 0:
        pytest.skip(f"the file system of {tmp_path} has no O_DIRECT: the refusal test covers the fallback")
    assert written == 3 * MIB + 11 and (tmp_path / "a").read_bytes() == b"".join(parts)
    assert direct_writes == [MIB, MIB] and tmp_path in local._NO_DIRECT_ROOTS
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]
