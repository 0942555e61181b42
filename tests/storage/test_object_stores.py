"""One suite for every tensor-store backend: what dumpdb needs from a zarr Store.

Each test runs once per entry of ``STORES``; adding a backend (an S3 store, say)
is one more entry there. Local-only properties (durability after ``kill -9``)
are at the end.
"""

from __future__ import annotations

import json
import mmap
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import zarr.storage
from conftest import write_payloads
from zarr.abc.store import RangeByteRequest, Store
from zarr.storage import WrapperStore

import dumpdb.storage.store as store_mod
from dumpdb.errors import PayloadCorrupt, PayloadMissing
from dumpdb.storage.local import DurableLocalStore
from dumpdb.storage.objects import ObjectStore
from dumpdb.storage.payloads import copy_payloads
from dumpdb.storage.store import StoreWriter, TensorStore, payload_hash, shard_key


def _local(tmp_path: Path) -> Store:
    return DurableLocalStore(str(tmp_path / "tensors.zarr"))


def _memory(tmp_path: Path) -> Store:
    return zarr.storage.MemoryStore()


def _async_only(tmp_path: Path) -> Store:
    """A store with zarr's async API only, as object stores (FsspecStore, ObjectStore)
    have: every call goes through the facade's event-loop path."""
    return WrapperStore(zarr.storage.MemoryStore())


def _s3(tmp_path: Path) -> Store:
    """An S3 store (zarr's ObjectStore over obstore) on moto's server, a fresh bucket."""
    from dumpdb.storage.remote import open_store

    return open_store(_S3_URL[0])


_S3_URL: list[str] = []  # set by the zstore fixture from the s3_url fixture (moto on 127.0.0.1)

STORES: list[tuple[str, Callable[[Path], Store]]] = [
    ("local", _local), ("memory", _memory), ("async-only", _async_only), ("s3", _s3)]


@pytest.fixture(params=[f for _, f in STORES], ids=[n for n, _ in STORES])
def zstore(request, tmp_path) -> Store:
    if request.param is _s3:
        _S3_URL[:] = [request.getfixturevalue("s3_url")]
    store = request.param(tmp_path)
    TensorStore.create(store)
    return store


@pytest.fixture
def small_units(monkeypatch):
    """Tiny packs (4 KiB) and inner chunks (256 B), so boundaries are everywhere."""
    monkeypatch.setattr(store_mod, "INNER_CHUNK_BYTES", 256)
    return {"pack_bytes": 4096, "large_bytes": 16384}


def _payloads() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    out: dict[str, np.ndarray] = {}
    # float32 sizes around the inner chunk (64 elements) and the pack (1024 elements)
    for n in (1, 63, 64, 65, 127, 1023, 1024, 1025, 2047):
        out[f"f32-{n}"] = rng.standard_normal(n).astype(np.float32)
    out["f16-2d"] = rng.standard_normal((33, 17)).astype(np.float16)
    out["bool"] = rng.integers(0, 2, 300).astype(np.bool_)
    out["i64-large"] = np.arange(3000, dtype=np.int64).reshape(30, 100)  # 24 KB >= large_bytes
    out["empty"] = np.zeros((0, 4), np.float32)
    return out


def _write(zstore: Store, units: dict, payloads: dict[str, np.ndarray]):
    return write_payloads(StoreWriter(TensorStore(zstore, read_only=False), **units), payloads.items())


def test_round_trip_across_pack_and_chunk_boundaries(zstore, small_units):
    payloads = _payloads()
    locations, arrays = _write(zstore, small_units, payloads)
    assert set(locations) == set(payloads)
    assert len({a.array_path for a in arrays if a.kind == "pack"}) > 3  # several packs per dtype
    reader = TensorStore(zstore)
    for name, array in payloads.items():
        loc = locations[name]
        got = reader.read(loc.array_path, loc.elem_offset, loc.elem_count, array.dtype, array.shape,
                          content_hash=payload_hash(array), verify=True)
        assert got.dtype == array.dtype and got.shape == array.shape and got.tobytes() == array.tobytes(), name
    assert locations["i64-large"].elem_offset is None and locations["empty"].array_path is None
    for a in arrays:  # recorded checksums are those of the stored shards
        assert reader.shard_checksum(a.array_path, len(a.shape)) == a.checksum


def test_copy_payloads_between_stores_is_bit_exact(zstore, small_units, tmp_path):
    payloads = _payloads()
    locations, _ = _write(zstore, small_units, payloads)
    target = zarr.storage.MemoryStore()
    TensorStore.create(target)
    writer = StoreWriter(TensorStore(target, read_only=False), **small_units)
    # the payloads are keyed by labels ("f32-1"), not by their hash: reads unchecked
    copied = copy_payloads(TensorStore(zstore, verify=False), writer,
                           [(h, loc.array_path, loc.elem_offset, loc.elem_count) for h, loc in locations.items()])
    writer.close()
    reader = TensorStore(target)
    assert {c.content_hash for c in copied} == set(payloads)
    for loc in copied:
        array = payloads[loc.content_hash]
        got = reader.read(loc.array_path, loc.elem_offset, loc.elem_count, array.dtype, array.shape)
        assert got.tobytes() == array.tobytes()


def test_ranged_reads_and_short_objects(zstore):
    objects = ObjectStore(zstore, "s")
    data = bytes(range(256)) * 4
    assert objects.set("x/blob", [data[:100], data[100:]]) == len(data)
    assert objects.get("x/blob") == data
    assert objects.get("x/blob", 10, 20) == data[10:20]
    assert objects.get("x/blob", 1000, 1024) == data[1000:]
    assert objects.get_suffix("x/blob", 7) == data[-7:]
    assert objects.size("x/blob") == len(data)
    with pytest.raises(PayloadCorrupt, match=r"s/x/blob: object too short for bytes \[1000, 1100\)"):
        objects.get("x/blob", 1000, 1100)
    with pytest.raises(PayloadCorrupt, match="s/x/blob"):
        objects.get_suffix("x/blob", 2000)


def test_large_ranged_reads_of_a_local_store_are_mapped_with_pread_s_answers(tmp_path, monkeypatch):
    """A local store's ranged read of MAP_READ_BYTES or more is a read-only view of the file
    mapped (no copy): the same bytes as a pread, short at the end of the file (PayloadCorrupt
    from get), PayloadMissing for a missing object; a replaced file keeps its old bytes in a
    view taken before (the store writes by rename)."""
    import dumpdb.storage.objects as objects_mod

    root = tmp_path / "tensors.zarr"
    (root / "x").mkdir(parents=True)
    data = np.random.default_rng(3).integers(0, 256, 3 * objects_mod.MAP_READ_BYTES + 12345, np.uint8).tobytes()
    (root / "x" / "blob").write_bytes(data)
    objects = ObjectStore.local(root)
    n = objects_mod.MAP_READ_BYTES
    mapped = []
    real = objects_mod._map_range
    monkeypatch.setattr(objects_mod, "_map_range", lambda fd, start, k: mapped.append((start, k)) or real(fd, start, k))
    for start in (0, 1, 4095, 4096, 65537, len(data) - n):
        got = objects.get("x/blob", start, start + n)
        assert got.readonly and bytes(got) == data[start : start + n]
        assert isinstance(got.obj, mmap.mmap)  # a view of the file mapped, not of pread's bytes
    assert objects.get("x/blob", 10, 20) == data[10:20]  # small: a pread
    assert len(mapped) == 6
    with pytest.raises(PayloadCorrupt, match=r"x/blob: object too short"):
        objects.get("x/blob", len(data) - n + 1, len(data) + 1)
    with pytest.raises(PayloadCorrupt, match=r"x/blob: object too short"):
        objects.get("x/blob", len(data) + 5, len(data) + 5 + n)
    with pytest.raises(PayloadMissing):
        objects.get("x/none", 0, n)
    kept = objects.get("x/blob", 0, n)
    tmp = root / "x" / "blob.tmp"
    tmp.write_bytes(bytes(len(data)))
    os.replace(tmp, root / "x" / "blob")
    assert bytes(kept) == data[:n] and bytes(objects.get("x/blob", 0, n)) == bytes(n)


def test_a_local_store_s_checksum_is_read_not_mapped(tmp_path, monkeypatch):
    """ObjectStore.checksum (verify's shard check) reads a local object's blocks with pread,
    never as a mapping, however large: a disk's read error is then an OSError, which verify
    reports ("cannot read <shard>"), where a mapped page that cannot be read is SIGBUS and the
    process dies without a report."""
    import errno

    import google_crc32c

    import dumpdb.storage.objects as objects_mod

    root = tmp_path / "tensors.zarr"
    (root / "x").mkdir(parents=True)
    data = np.random.default_rng(5).integers(0, 256, 3 * objects_mod.MAP_READ_BYTES + 7, np.uint8).tobytes()
    (root / "x" / "blob").write_bytes(data)
    objects = ObjectStore.local(root)
    assert objects.checksum("x/blob") == f"crc32c:{google_crc32c.value(data):08x}"

    def unreadable(fd, n, offset):  # what pread answers for a bad sector
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "pread", unreadable)
    with pytest.raises(OSError, match="Input/output error"):
        objects.checksum("x/blob")


def test_listing_and_delete(zstore, small_units):
    payloads = _payloads()
    _, arrays = _write(zstore, small_units, payloads)
    objects = TensorStore(zstore).objects
    keys = objects.list_prefix("packs")
    packs = [a.array_path for a in arrays if a.kind == "pack"]
    expected = {k for p in packs for k in (f"{p}/zarr.json", shard_key(p, 1))}
    assert expected <= set(keys) and keys == sorted(keys)
    assert {k for k in keys if k not in expected} <= {"packs/zarr.json"} | {  # the implicit groups
        f"packs/{d}/zarr.json" for d in ("bool", "float16", "float32")}
    assert "float32" in objects.list_dir("packs") and objects.list_prefix("nothing/here") == []
    assert not any(".tmp-" in k for k in objects.list_prefix(""))  # no temporary leftovers
    store = TensorStore(zstore, read_only=False)
    total = store.stored_bytes()
    victim = packs[0]
    victim_bytes = store.stored_bytes(victim)
    store.delete_array(victim)
    assert objects.list_prefix(victim) == [] and not objects.exists(f"{victim}/zarr.json")
    assert store.stored_bytes() == total - victim_bytes
    store.delete_array(victim)  # gone already: fine


def test_set_if_not_exists_keeps_the_first_object(zstore):
    objects = ObjectStore(zstore)
    objects.set_if_not_exists("k", b"first")
    objects.set_if_not_exists("k", b"second")
    assert objects.get("k") == b"first"


def test_small_tensor_read_is_one_ranged_get(zstore, small_units, monkeypatch):
    payloads = _payloads()
    locations, _ = _write(zstore, small_units, payloads)
    reader = TensorStore(zstore)
    a, b = locations["f32-1"], locations["f32-64"]  # b: exactly chunk 1
    assert a.array_path == b.array_path and a.elem_offset // 64 != b.elem_offset // 64  # other chunk
    reader.read(a.array_path, a.elem_offset, a.elem_count, np.dtype(np.float32), (1,))  # pack metadata read
    calls = []  # (key, ranged) of every request, through zarr's store or a local store's files
    real_get, real_file = ObjectStore._get, ObjectStore._read_file

    def counting(self, key, byte_range):
        calls.append((key, isinstance(byte_range, RangeByteRequest)))
        return real_get(self, key, byte_range)

    def counting_file(self, key, start, end, suffix=None, **kwargs):
        calls.append((key, start is not None and end is not None))
        return real_file(self, key, start, end, suffix, **kwargs)

    monkeypatch.setattr(ObjectStore, "_get", counting)
    monkeypatch.setattr(ObjectStore, "_read_file", counting_file)
    got = reader.read(b.array_path, b.elem_offset, b.elem_count, np.dtype(np.float32), (64,))
    assert got.tobytes() == payloads["f32-64"].tobytes()
    assert calls == [(shard_key(b.array_path, 1), True)]


@pytest.mark.parametrize("what", ["pack shard", "pack metadata", "large shard", "large array"])
def test_missing_objects_raise_payload_missing_never_zeros(zstore, small_units, what):
    payloads = {"small": np.arange(10, dtype=np.float32) + 1,
                "large": np.arange(1, 5001, dtype=np.int64).reshape(50, 100)}
    locations, _ = _write(zstore, small_units, payloads)
    kind = "small" if what.startswith("pack") else "large"
    loc = locations[kind]
    objects = ObjectStore(zstore)
    if what == "large array":
        TensorStore(zstore, read_only=False).delete_array(loc.array_path)
        missing = loc.array_path
    else:
        missing = f"{loc.array_path}/zarr.json" if what.endswith("metadata") else \
            shard_key(loc.array_path, payloads[kind].ndim)
        objects.delete(missing)
    with pytest.raises(PayloadMissing, match=f"{missing}: .*missing"):
        TensorStore(zstore).read(loc.array_path, loc.elem_offset, loc.elem_count,
                                 payloads[kind].dtype, payloads[kind].shape, content_hash=kind)


def test_an_all_zero_large_array_of_older_archives_reads_back(zstore):
    """Older dumpdb let zarr skip fill-value chunks: an all-zero large tensor has no shard.
    Zeros are returned only when they hash to the payload's content hash."""
    zeros = np.zeros((40, 100), np.float32)
    arr = zarr.create_array(zstore, name="large/ab/old", shape=zeros.shape, dtype=zeros.dtype,
                            chunks=(10, 100), shards=(40, 100), fill_value=0)
    arr[...] = zeros  # written without write_empty_chunks: no shard object
    assert ObjectStore(zstore).list_prefix("large/ab/old") == ["large/ab/old/zarr.json"]
    got = TensorStore(zstore).read("large/ab/old", None, zeros.size, zeros.dtype, zeros.shape,
                                   content_hash=payload_hash(zeros))
    assert got.tobytes() == zeros.tobytes()
    with pytest.raises(PayloadMissing, match="large/ab/old/c/0/0: shard missing"):
        TensorStore(zstore).read("large/ab/old", None, zeros.size, zeros.dtype, zeros.shape, content_hash="0" * 32)


def test_truncated_pack_shard_is_corrupt_not_zeros(zstore, small_units):
    payloads = {"p": np.arange(500, dtype=np.float32)}
    locations, _ = _write(zstore, small_units, payloads)
    loc = locations["p"]
    objects = ObjectStore(zstore)
    key = shard_key(loc.array_path, 1)
    objects.set(key, objects.get(key)[:10])
    with pytest.raises((PayloadCorrupt, ValueError)):
        TensorStore(zstore).read(loc.array_path, loc.elem_offset, loc.elem_count, np.dtype(np.float32), (500,))


def test_a_big_endian_pack_is_refused(zstore, small_units):
    locations, _ = _write(zstore, small_units, {"p": np.arange(50, dtype=np.float32)})
    loc = locations["p"]
    objects = ObjectStore(zstore)
    meta = json.loads(bytes(objects.get(f"{loc.array_path}/zarr.json")))
    meta["codecs"][0]["configuration"]["codecs"][0]["configuration"] = {"endian": "big"}
    objects.set(f"{loc.array_path}/zarr.json", json.dumps(meta).encode())
    with pytest.raises(ValueError, match="little-endian"):
        TensorStore(zstore).read(loc.array_path, loc.elem_offset, loc.elem_count, np.dtype(np.float32), (50,))


# --- local store only -----------------------------------------------------------------

_WRITER = textwrap.dedent("""
    import json, sys
    import numpy as np
    import dumpdb.storage.store as s
    from dumpdb.storage.store import StoreWriter, TensorStore
    s.INNER_CHUNK_BYTES = 256
    root = sys.argv[1]
    TensorStore.create(root)
    writer = StoreWriter(TensorStore(root, read_only=False), pack_bytes=4096, large_bytes=16384)
    i = 0
    while True:  # until killed: report every payload once it is durable
        n = 1 + (i * 37) % 5000
        data = np.random.default_rng(i).standard_normal(n).astype(np.float32)
        for loc in writer.add(str(i), data):
            print(json.dumps([loc.content_hash, loc.array_path, loc.elem_offset, loc.elem_count]), flush=True)
        i += 1
""")


def test_reported_payloads_survive_kill_9(tmp_path):
    root = tmp_path / "tensors.zarr"
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(root)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    reported = []
    assert proc.stdout is not None
    for line in proc.stdout:
        reported.append(json.loads(line))
        if len(reported) >= 300:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    reader = TensorStore(root)
    large = 0
    for content_hash, array_path, offset, count in reported:
        i = int(content_hash)
        n = 1 + (i * 37) % 5000
        want = np.random.default_rng(i).standard_normal(n).astype(np.float32)
        got = reader.read(array_path, offset, count, np.dtype(np.float32), (n,))
        assert got.tobytes() == want.tobytes(), content_hash
        large += offset is None
    assert large > 0  # both kinds were written and killed around
