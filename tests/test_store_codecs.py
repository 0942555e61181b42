"""Codecs per dtype (issue 13, point 1): every dtype round-trips bit for bit through the
new codecs (packs of small and medium tensors, multi-chunk packs, large N-D arrays with
edge chunks), zarr itself reads what dumpdb encoded, and archives written before the
change (zstd only) read unchanged."""

from __future__ import annotations

import json
import shutil

import ml_dtypes
import numpy as np
import pytest
import zarr
from conftest import DATA, assert_payloads_read_back, ms_case, npy_payload, write_payloads

import dumpdb
import dumpdb.storage.store as store_mod
from dumpdb.errors import PayloadCorrupt
from dumpdb.storage.store import StoreWriter, TensorStore, payload_hash, shard_key

DTYPES = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
          np.float16, np.float32, np.float64, ml_dtypes.bfloat16, np.complex64, np.complex128]


def _payload(rng: np.random.Generator, dtype, shape) -> np.ndarray:
    """Every bit pattern is fair (NaN payloads, -0.0, subnormals, inf), except bool: 0/1."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape))
    if dtype == np.bool_:
        return rng.integers(0, 2, n).astype(np.bool_).reshape(shape)
    raw = rng.integers(0, 256, n * dtype.itemsize, dtype=np.uint8)
    if dtype.kind in "fc" or dtype == ml_dtypes.bfloat16:
        raw[: min(raw.size, 64 * dtype.itemsize)] = 0  # a run of zeros: something for zstd to find
    return raw.view(dtype).reshape(shape)


@pytest.fixture
def small_store(monkeypatch):
    """Thresholds scaled down so a few KiB make multi-chunk packs, medium packs and large arrays."""
    monkeypatch.setattr(store_mod, "INNER_CHUNK_BYTES", 256)
    monkeypatch.setattr(store_mod, "MEDIUM_BYTES", 2048)
    monkeypatch.setattr(store_mod, "MEDIUM_CHUNK_BYTES", 1024)
    monkeypatch.setattr(store_mod, "LARGE_CHUNK_BYTES", 1000)
    monkeypatch.setattr(store_mod, "PACK_BYTES", 16 << 10)
    monkeypatch.setattr(store_mod, "LARGE_BYTES", 8192)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_every_dtype_round_trips_bit_exact_in_packs_of_mixed_sizes_and_large_arrays(tmp_path, small_store, dtype):
    TensorStore.create(tmp_path / "t.zarr")
    store = TensorStore(tmp_path / "t.zarr", read_only=False)
    writer = StoreWriter(store)
    rng = np.random.default_rng(np.dtype(dtype).num)
    item = np.dtype(dtype).itemsize
    # 1 element, a few, a pack-spanning small one, medium ones, and large N-D arrays whose
    # leading dimension does not divide into chunks (edge chunks padded)
    shapes = [(1,), (3,), (2, 5), (300 // item + 7,), (2048 // item + 3,), (4096 // item,),
              (3, 7, 8192 // item // 21 + 5), (9000 // item + 1,), (5, 3, 8192 // item // 15 + 3)]
    arrays = [_payload(rng, dtype, s) for s in shapes]
    for a in arrays[7:]:  # these large ones compress (half zeros); the random one before is stored raw
        a.reshape(-1)[a.size // 2 :] = 0
    hashes = [payload_hash(a) for a in arrays]
    locations, infos = write_payloads(writer, zip(hashes, arrays))
    assert {i.kind for i in infos} == {"pack", "tensor"}
    chunked = []  # (shape, inner chunk shape) of every array
    for info in infos:
        meta = json.loads((tmp_path / "t.zarr" / info.array_path / "zarr.json").read_text())
        chunked.append((tuple(meta["shape"]), tuple(meta["codecs"][0]["configuration"]["chunk_shape"])))
    # several chunks per array, and edge chunks (a dimension the chunk does not divide)
    assert any(np.prod(s) > np.prod(c) for s, c in chunked if len(s) == 3)
    assert any(any(n % c for n, c in zip(s, cs)) for s, cs in chunked if len(s) == 3)
    assert any(np.prod(s) > np.prod(c) for s, c in chunked if len(s) == 1)
    assert_payloads_read_back(TensorStore(tmp_path / "t.zarr"), locations, hashes, arrays)
    # zarr itself decodes every array dumpdb encoded (the bytes are what zarr.json says)
    multi_byte = np.dtype(dtype).itemsize > 1
    kinds_seen = set()
    for info in infos:
        meta = json.loads((tmp_path / "t.zarr" / info.array_path / "zarr.json").read_text())
        inner = [c["name"] for c in meta["codecs"][0]["configuration"]["codecs"]]
        kinds_seen.add((info.kind, len(inner)))
        if inner == ["bytes"]:
            assert info.kind == "tensor"  # a large array that barely compresses: stored as it is
        else:
            assert inner == ["bytes", "blosc" if multi_byte else "zstd"]
        if multi_byte and len(inner) == 2:
            blosc = meta["codecs"][0]["configuration"]["codecs"][1]["configuration"]
            assert blosc["shuffle"] == "shuffle" and blosc["cname"] == "zstd"
            assert blosc["typesize"] == (np.dtype(dtype).itemsize // 2 if np.dtype(dtype).kind == "c"
                                         else np.dtype(dtype).itemsize)
        whole = np.asarray(zarr.open_array(store.zstore, path=info.array_path, mode="r")[...])
        if info.kind == "tensor":
            a = next(a for h, a in zip(hashes, arrays) if locations[h].array_path == info.array_path)
            assert whole.tobytes() == np.ascontiguousarray(a).view(whole.dtype).tobytes()
        else:
            for h, a in zip(hashes, arrays):
                loc = locations[h]
                if loc.array_path == info.array_path:
                    part = whole[loc.elem_offset : loc.elem_offset + loc.elem_count]
                    assert part.tobytes() == np.ascontiguousarray(a).tobytes()
    expected = {("pack", 2), ("tensor", 2)} | ({("tensor", 1)} if np.dtype(dtype) != np.bool_ else set())
    assert kinds_seen == expected  # bool: 0/1 bytes always compress


def test_a_damaged_blosc_frame_is_an_error_naming_the_object_not_zeros(tmp_path, small_store):
    TensorStore.create(tmp_path / "t.zarr")
    store = TensorStore(tmp_path / "t.zarr", read_only=False)
    writer = StoreWriter(store)
    a = np.arange(4000, dtype=np.float32).reshape(40, 100)  # large: its own array
    h = payload_hash(a)
    (loc,) = writer.add(h, a) + writer.flush()
    writer.close()
    shard = tmp_path / "t.zarr" / shard_key(loc.array_path, 2)
    raw = bytearray(shard.read_bytes())
    raw[20:40] = b"\xff" * 20  # inside the first frame's Blosc header/body
    shard.write_bytes(bytes(raw))
    with pytest.raises((ValueError, PayloadCorrupt), match=str(loc.array_path)):
        TensorStore(tmp_path / "t.zarr").read(loc.array_path, None, loc.elem_count, a.dtype, a.shape,
                                              content_hash=h, verify=True)


def test_ingest_stores_floats_shuffled_and_reads_the_dump_back_bit_for_bit(tmp_path):
    archive = tmp_path / "a.dumpdb"
    root = ms_case("d2_compare_fp16_bf16_iter0")
    dumpdb.ingest(root, archive=archive, run="d2")
    a = dumpdb.open(archive)
    codecs = set()
    for path in (archive / "tensors.zarr" / "packs").glob("*/*/zarr.json"):
        meta = json.loads(path.read_text())
        codecs.add((meta["data_type"], meta["codecs"][0]["configuration"]["codecs"][1]["name"]))
    assert ("float32", "blosc") in codecs and ("float16", "blosc") in codecs and ("uint16", "blosc") in codecs
    n = 0
    for row, array in a.tensors("SELECT tensor_id, source_file FROM tensors ORDER BY tensor_id DESC"):
        _, shape, payload = npy_payload(root / row["source_file"])
        assert array.shape == shape and array.tobytes() == payload
        n += 1
    assert n == 95


def test_an_archive_written_before_the_codec_change_reads_unchanged(tmp_path):
    """tests/data/archives/codec_zstd1_d2.dumpdb: written by dumpdb before issue 13 (zstd-1
    packs with several inner chunks, large arrays; see tests/data/README.md)."""
    archive = tmp_path / "old.dumpdb"
    shutil.copytree(DATA / "archives" / "codec_zstd1_d2.dumpdb", archive)
    names = set()
    for path in (archive / "tensors.zarr").rglob("zarr.json"):
        meta = json.loads(path.read_text())
        if "codecs" in meta:
            names.update(c["name"] for c in meta["codecs"][0]["configuration"]["codecs"])
    assert names == {"bytes", "zstd"}  # nothing re-encoded: the old codec is read as it is
    a = dumpdb.open(archive)
    kinds = a.sql("SELECT kind, count(*) AS n FROM arrays GROUP BY ALL ORDER BY kind").to_pylist()
    assert [k["kind"] for k in kinds] == ["pack", "tensor"]
    root = ms_case("d2_compare_fp16_bf16_iter0")
    n = 0
    for row, array in a.tensors("SELECT tensor_id, source_file FROM tensors", verify=True):
        _, shape, payload = npy_payload(root / row["source_file"])
        assert array.shape == shape and array.tobytes() == payload
        assert a.tensor(row["tensor_id"]).tobytes() == payload
        n += 1
    assert n == 95
    assert a.verify().ok
    # new payloads go in with the new codecs beside the old ones; both read
    report = dumpdb.ingest(ms_case("c1_inputs_kernels_iter"), archive=archive, run="c1")
    assert report.ok and report.tensors_added == 42
    assert dumpdb.open(archive).verify().ok


def test_a_large_array_that_barely_compresses_is_stored_uncompressed_and_reads_back(tmp_path, small_store):
    TensorStore.create(tmp_path / "t.zarr")
    store = TensorStore(tmp_path / "t.zarr", read_only=False)
    writer = StoreWriter(store)
    rng = np.random.default_rng(7)
    noisy = rng.standard_normal((37, 61)).astype(np.float32)  # near-random mantissas: ~12 % saved at best
    # 40 rows cut into whole chunks of 4 rows: no edge padding, read straight from the shard file
    unpadded = rng.standard_normal((40, 61)).astype(np.float32)
    masked = np.zeros((37, 61), dtype=np.float32)
    masked[::5] = -np.inf  # a mask: compresses many times over
    locations = {}
    for a in (noisy, unpadded, masked):
        for loc in writer.add(payload_hash(a), a) + writer.flush():
            locations[loc.content_hash] = loc
    writer.close()
    reader = TensorStore(tmp_path / "t.zarr")
    inner = {}
    for a in (noisy, unpadded, masked):
        loc = locations[payload_hash(a)]
        assert loc.elem_offset is None  # its own (large) array
        meta = json.loads((tmp_path / "t.zarr" / loc.array_path / "zarr.json").read_text())
        inner[a is not masked] = [c["name"] for c in meta["codecs"][0]["configuration"]["codecs"]]
        got = reader.read(loc.array_path, None, loc.elem_count, a.dtype, a.shape, content_hash=payload_hash(a),
                          verify=True)
        assert got.tobytes() == a.tobytes()
        assert np.asarray(zarr.open_array(store.zstore, path=loc.array_path, mode="r")[...]).tobytes() == a.tobytes()
    # the mask compresses 8x and more: re-encoded in one big plain-zstd chunk (codecs.REDUNDANT_RATIO)
    assert inner == {True: ["bytes"], False: ["bytes", "zstd"]}
    assert locations[payload_hash(noisy)].stored_bytes >= noisy.nbytes  # stored as it is
    # the unpadded one: exactly its bytes in the shard, so a damaged index is caught, not read past
    loc = locations[payload_hash(unpadded)]
    shard = tmp_path / "t.zarr" / shard_key(loc.array_path, 2)
    assert shard.stat().st_size == unpadded.nbytes + 16 * 10 + 4
    raw = bytearray(shard.read_bytes())
    raw[-10] ^= 0xFF
    shard.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="checksum"):
        TensorStore(tmp_path / "t.zarr").read(loc.array_path, None, loc.elem_count, unpadded.dtype, unpadded.shape)
    # stored_bytes includes the array's zarr.json (its self-description: ~0.6 KB)
    assert locations[payload_hash(masked)].stored_bytes < masked.nbytes / 3


def _repeated(rng: np.random.Generator, dtype, shape) -> np.ndarray:
    """A slice ``shape[1:]`` of random bit patterns (bool: 0/1) repeated along the leading
    dimension (a broadcast)."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape[1:]))
    if dtype == np.bool_:
        part = rng.integers(0, 2, n).astype(np.bool_)
    else:
        part = rng.integers(0, 256, n * dtype.itemsize, dtype=np.uint8).view(dtype)
    return np.broadcast_to(part.reshape(shape[1:]), shape).copy()


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_a_highly_redundant_large_array_is_stored_in_big_zstd_chunks_and_reads_back_bit_exact(
        tmp_path, small_store, monkeypatch, dtype):
    # a (300, 4, 10) array, a 40-element slice repeated: chunks of 32 rows (10 chunks) compress
    # 8x and more; big chunks of 96 rows (4 chunks, the last an edge chunk of 12 rows)
    item = np.dtype(dtype).itemsize
    monkeypatch.setattr(store_mod, "LARGE_CHUNK_BYTES", 32 * 40 * item)
    monkeypatch.setattr(store_mod, "REDUNDANT_CHUNK_BYTES", 96 * 40 * item)
    TensorStore.create(tmp_path / "t.zarr")
    store = TensorStore(tmp_path / "t.zarr", read_only=False)
    rng = np.random.default_rng(np.dtype(dtype).num)
    a = _repeated(rng, dtype, (300, 4, 10))
    h = payload_hash(a)
    locations, infos = write_payloads(StoreWriter(store), [(h, a)])
    loc = locations[h]
    meta = json.loads((tmp_path / "t.zarr" / loc.array_path / "zarr.json").read_text())
    config = meta["codecs"][0]["configuration"]
    assert [c["name"] for c in config["codecs"]] == ["bytes", "zstd"]
    assert config["codecs"][1]["configuration"]["level"] == 3
    assert config["chunk_shape"] == [96, 4, 10] and meta["chunk_grid"]["configuration"]["chunk_shape"] == [384, 4, 10]
    # smaller than the array's shuffle+zstd-1 encoding in LARGE_CHUNK_BYTES chunks (what it was before)
    monkeypatch.setattr(store_mod, "REDUNDANT_RATIO", 10**9)
    TensorStore.create(tmp_path / "u.zarr")
    before, _ = write_payloads(StoreWriter(TensorStore(tmp_path / "u.zarr", read_only=False)), [(h, a)])
    assert loc.stored_bytes < before[h].stored_bytes
    got = TensorStore(tmp_path / "t.zarr").read(loc.array_path, None, loc.elem_count, a.dtype, a.shape,
                                                content_hash=h, verify=True)
    assert got.dtype == a.dtype and got.shape == a.shape and got.tobytes() == a.tobytes()
    whole = np.asarray(zarr.open_array(store.zstore, path=loc.array_path, mode="r")[...])  # zarr reads it too
    assert whole.tobytes() == np.ascontiguousarray(a).view(whole.dtype).tobytes()


def test_a_redundant_large_array_keeps_its_first_encoding_when_big_chunks_do_not_pay(
        tmp_path, small_store, monkeypatch):
    monkeypatch.setattr(store_mod, "REDUNDANT_KEEP", 0.0)  # no second encoding is ever small enough
    TensorStore.create(tmp_path / "t.zarr")
    store = TensorStore(tmp_path / "t.zarr", read_only=False)
    a = _repeated(np.random.default_rng(3), np.float32, (40, 61))
    h = payload_hash(a)
    locations, _ = write_payloads(StoreWriter(store), [(h, a)])
    meta = json.loads((tmp_path / "t.zarr" / locations[h].array_path / "zarr.json").read_text())
    config = meta["codecs"][0]["configuration"]
    assert [c["name"] for c in config["codecs"]] == ["bytes", "blosc"]
    assert config["chunk_shape"] == [4, 61]  # large_chunks at LARGE_CHUNK_BYTES (1000 bytes here)
    got = TensorStore(tmp_path / "t.zarr").read(locations[h].array_path, None, a.size, a.dtype, a.shape,
                                                content_hash=h, verify=True)
    assert got.tobytes() == a.tobytes()
