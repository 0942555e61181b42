"""The tensor store: directly encoded pack shards read back through zarr, bit for bit."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import zarr
import zarr.codecs
from store_payloads import write_payloads

from dumpdb.dtypes import BFLOAT16
from dumpdb.storage.objects import ObjectStore
from dumpdb.storage.shard import ShardTarget, encode_chunks, write_shard
from dumpdb.storage.store import StoreWriter, TensorStore, large_chunks


@pytest.mark.parametrize("dtype,n,chunk", [
    (np.float32, 983_825, 262_144),  # several chunks, partial last one
    (np.float16, 10, 4),
    (np.bool_, 3, 262_144),          # fewer elements than one chunk
    (np.int64, 524_288, 262_144),    # exact multiple
    (np.uint16, 1, 1),
])
def test_encoded_shard_reads_back_through_zarr(tmp_path, dtype, n, chunk):
    rng = np.random.default_rng(1)
    data = (rng.standard_normal(n) * 100).astype(dtype)
    store = zarr.storage.LocalStore(str(tmp_path))
    zarr.create_array(store, name="p", shape=(n,), dtype=data.dtype, chunks=(chunk,),
                      shards=(math.ceil(n / chunk) * chunk,), compressors=zarr.codecs.ZstdCodec(level=1),
                      fill_value=0)
    with ThreadPoolExecutor(2) as pool:
        write_shard(ShardTarget(ObjectStore(store), "p/c/0"), encode_chunks(data, chunk, 1, pool))
    back = zarr.open_array(store, path="p", mode="r")
    assert back[:].tobytes() == data.tobytes()
    assert back[n // 3 : n // 3 + 5].tobytes() == data[n // 3 : n // 3 + 5].tobytes()


def test_store_writer_round_trips_special_bit_patterns(tmp_path):
    nan_payload = np.array([0x7FC00001, 0xFFC12345, 0x80000000, 0x7F800000], np.uint32).view(np.float32)
    arrays = {
        "neg_zero": np.full(300_000, -0.0, np.float32),  # a whole inner chunk of -0.0
        "nan_payloads": nan_payload,
        "bf16": np.arange(-8, 8, dtype=np.float32).astype(BFLOAT16).reshape(4, 4),
        "scalar_bool": np.array(True),
        "empty": np.zeros((0, 7), np.float16),
        "large": np.arange(40_000, dtype=np.float64).reshape(200, 200),
    }
    locations = write_payloads(tmp_path / "s.zarr", arrays, pack_bytes=1 << 20, large_bytes=300_000)
    assert set(locations) == set(arrays)
    assert locations["large"].elem_offset is None and locations["large"].array_path.startswith("large/")
    assert locations["empty"].array_path is None
    reader = TensorStore(tmp_path / "s.zarr")
    for name, a in arrays.items():
        loc = locations[name]
        got = reader.read(loc.array_path, loc.elem_offset, loc.elem_count, a.dtype, a.shape)
        assert got.dtype == a.dtype and got.shape == a.shape and got.tobytes() == a.tobytes(), name


def test_large_chunks_split_leading_dims():
    assert large_chunks((8, 1024, 1024), 4, target=4 << 20) == (1, 1024, 1024)
    assert large_chunks((64, 256), 4, target=4 << 10) == (4, 256)
    assert large_chunks((3, 5000, 1000), 4, target=4 << 20) == (1, 1048, 1000)
    assert large_chunks((), 4) == ()


def test_pack_reader_handles_zarr_written_packs_with_empty_chunks(tmp_path):
    """Archives written by zarr itself (dumpdb 0.1.0's first packs) may omit all-zero chunks."""
    TensorStore.create(tmp_path / "s.zarr")
    data = np.concatenate([np.arange(1000, dtype=np.float32), np.zeros(3000, np.float32), np.ones(5, np.float32)])
    arr = zarr.create_array(zarr.storage.LocalStore(str(tmp_path / "s.zarr")), name="packs/float32/old",
                            shape=data.shape, dtype=data.dtype, chunks=(1000,), shards=(5000,),
                            compressors=zarr.codecs.ZstdCodec(level=1), fill_value=0)
    arr[:] = data  # zarr skips the all-zero chunks 1 and 2
    store = TensorStore(tmp_path / "s.zarr")
    got = store.read("packs/float32/old", 990, 2015, np.dtype(np.float32), (2015,))
    assert got.tobytes() == data[990:3005].tobytes()
    assert store.read_pack_range("packs/float32/old", 4000, 5).tolist() == [1.0] * 5


def test_pack_reader_detects_a_damaged_index(tmp_path):
    TensorStore.create(tmp_path / "s.zarr")
    writer = StoreWriter(TensorStore(tmp_path / "s.zarr", read_only=False))
    (loc,) = writer.add("h", np.arange(100, dtype=np.float32)) + writer.flush()
    writer.close()
    shard = tmp_path / "s.zarr" / loc.array_path / "c" / "0"
    raw = bytearray(shard.read_bytes())
    raw[-10] ^= 0x01  # flip a bit inside the index
    shard.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="index checksum mismatch"):
        TensorStore(tmp_path / "s.zarr").read(loc.array_path, loc.elem_offset, loc.elem_count,
                                              np.dtype(np.float32), (100,))
