"""Stores that read fast (issue 29 item 3): a pack payload spanning several chunks decoded on
every core, and archives whose compressor is lz4 (``ingest --codec lz4``)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import zarr

import dumpdb
from dumpdb.errors import DumpdbError, StorageError
from dumpdb.storage import store as store_mod
from dumpdb.storage.store import StoreWriter, TensorStore, payload_hash

DUMP = Path(__file__).parent / "data" / "mindspore" / "c1_inputs_kernels_iter"


def _write(root: Path, payloads: dict[str, np.ndarray], compressor: str | None = None,
           large_bytes: int = 64 << 20) -> dict:
    TensorStore.create(root)
    store = TensorStore(root, read_only=False)
    if compressor is not None:
        store.choose_compressor(compressor)
    writer = StoreWriter(store, large_bytes=large_bytes)
    locations = {}
    for name, a in payloads.items():
        for loc in writer.add(name, a):
            locations[loc.content_hash] = loc
    for loc in writer.flush():
        locations[loc.content_hash] = loc
    writer.close()
    return locations


def test_payload_over_many_chunks_decodes_on_the_pool_to_the_same_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(store_mod, "MEDIUM_CHUNK_BYTES", 64 << 10)  # a 1.2 MB payload spans 19 chunks
    rng = np.random.default_rng(7)
    head = rng.standard_normal(70_000, dtype=np.float32)  # the big payload starts inside a chunk
    big = (rng.standard_normal(300_001, dtype=np.float32) * 0.01).round(3)
    loc = _write(tmp_path / "s.zarr", {"head": head, "big": big})["big"]
    assert loc.elem_offset % (16 << 10) != 0

    def read(parallel: bool) -> tuple[np.ndarray, set[str]]:
        store = TensorStore(tmp_path / "s.zarr")
        threads: set[str] = set()
        fill = store._decode_into

        def spy(*args):
            threads.add(threading.current_thread().name)
            return fill(*args)

        monkeypatch.setattr(store, "_decode_into", spy)
        monkeypatch.setattr(store_mod, "PARALLEL_READ_BYTES", 0 if parallel else 1 << 62)
        got = store.read(loc.array_path, loc.elem_offset, loc.elem_count, np.dtype(np.float32), big.shape,
                         content_hash=payload_hash(big))
        return got, threads

    serial, serial_threads = read(False)
    parallel, parallel_threads = read(True)
    assert serial.tobytes() == big.tobytes() and parallel.tobytes() == big.tobytes()
    assert serial_threads == {threading.current_thread().name}
    assert any(name.startswith("dumpdb-decode") for name in parallel_threads)  # the pool did decode chunks


def test_lz4_store_round_trips_bit_exact_and_reopens_with_its_codec(tmp_path):
    rng = np.random.default_rng(11)
    payloads = {
        "f32": rng.standard_normal(100_000, dtype=np.float32),
        "f32-medium": np.repeat(rng.standard_normal(1000, dtype=np.float32), 300),  # a medium pack, compressible
        "bf16": rng.standard_normal(5000).astype(ml_dtypes.bfloat16),
        "bool": rng.random(3000) > 0.5,
        "i8": rng.integers(-128, 127, 4000, dtype=np.int8),
        "large": np.tile(rng.standard_normal(64, dtype=np.float32), (2048, 8)),  # 4 MiB, compresses: lz4
    }
    locs = _write(tmp_path / "s.zarr", payloads, "lz4", large_bytes=2 << 20)
    store = TensorStore(tmp_path / "s.zarr")
    assert store.compressor == "lz4"
    for name, a in payloads.items():
        loc = locs[name]
        got = store.read(loc.array_path, loc.elem_offset, loc.elem_count, a.dtype, a.shape,
                         content_hash=payload_hash(a))
        assert got.tobytes() == a.tobytes(), name
        meta = json.loads((tmp_path / "s.zarr" / loc.array_path / "zarr.json").read_text())
        inner = meta["codecs"][0]["configuration"]["codecs"]
        assert inner[-1]["name"] == "blosc" and inner[-1]["configuration"]["cname"] == "lz4", name
        # any zarr v3 reader decodes it (here: zarr itself)
        stored = zarr.open_array(store.zstore, path=loc.array_path, mode="r")[...].reshape(-1)
        want = a.reshape(-1).view(np.uint16) if a.dtype == ml_dtypes.bfloat16 else a.reshape(-1)
        offset = loc.elem_offset or 0
        assert stored[offset : offset + a.size].tobytes() == want.tobytes(), name
    with pytest.raises(StorageError, match="codec is lz4, not zstd"):
        TensorStore(tmp_path / "s.zarr", read_only=False).choose_compressor("zstd")
    assert StoreWriter(TensorStore(tmp_path / "s.zarr", read_only=False)).compressor == "lz4"


def test_ingest_codec_lz4_is_kept_verifies_and_reads_like_zstd(tmp_path):
    lz4 = dumpdb.ingest(DUMP, archive=tmp_path / "lz4.dumpdb", run="a", codec="lz4", workers=1)
    zstd = dumpdb.ingest(DUMP, archive=tmp_path / "zstd.dumpdb", run="a", workers=1)
    assert not lz4.errors and not zstd.errors
    with dumpdb.open(tmp_path / "lz4.dumpdb") as a, dumpdb.open(tmp_path / "zstd.dumpdb") as b:
        assert a.store.compressor == "lz4" and b.store.compressor == "zstd"
        assert a.verify().ok and b.verify().ok
        ids = [r["tensor_id"] for r in a.sql("SELECT tensor_id FROM tensors WHERE content_hash IS NOT NULL "
                                             "ORDER BY tensor_id").to_pylist()]
        assert ids
        for tid in ids:
            assert a.tensor(tid).tobytes() == b.tensor(tid).tobytes()
    with pytest.raises(StorageError, match="an archive keeps the codec"):
        dumpdb.ingest(DUMP, archive=tmp_path / "lz4.dumpdb", run="b", codec="zstd", workers=1)
    with pytest.raises(DumpdbError, match="unknown codec 'gzip'"):
        dumpdb.ingest(DUMP, archive=tmp_path / "x.dumpdb", run="a", codec="gzip")
    assert not (tmp_path / "x.dumpdb").exists()
