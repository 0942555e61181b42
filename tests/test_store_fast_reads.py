"""Stores that read fast (issue 29 item 3): a pack payload spanning several chunks decoded on
every core, and archives whose compressor is lz4 (``ingest --codec lz4``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import zarr
from store_payloads import write_payloads

import dumpdb
from dumpdb.errors import DumpdbError, StorageError
from dumpdb.storage import store as store_mod
from dumpdb.storage.store import StoreWriter, TensorStore, payload_hash

DUMP = Path(__file__).parent / "data" / "mindspore" / "c1_inputs_kernels_iter"


def test_payload_over_many_chunks_decodes_on_the_pool_to_the_same_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(store_mod, "MEDIUM_CHUNK_BYTES", 64 << 10)  # a 1.2 MB payload spans 19 chunks
    rng = np.random.default_rng(7)
    head = rng.standard_normal(70_000, dtype=np.float32)  # the big payload starts inside a chunk
    big = (rng.standard_normal(300_001, dtype=np.float32) * 0.01).round(3)
    loc = write_payloads(tmp_path / "s.zarr", {"head": head, "big": big})["big"]
    assert loc.elem_offset % (16 << 10) != 0

    def read(parallel: bool) -> tuple[np.ndarray, set[str]]:
        store = TensorStore(tmp_path / "s.zarr")
        threads: set[str] = set()
        fill = store._decode_into

        pool_decoded = threading.Event()

        def spy(*args):
            name = threading.current_thread().name
            threads.add(name)
            if name.startswith("dumpdb-decode"):
                pool_decoded.set()
            elif parallel:
                # the calling thread decodes too: on a busy machine it could take every chunk before
                # a pool thread starts; it waits (bounded) for the pool to take one
                pool_decoded.wait(10)
            return fill(*args)

        monkeypatch.setattr(store, "_decode_into", spy)
        monkeypatch.setattr(store_mod, "PARALLEL_READ_BYTES", 0 if parallel else 1 << 62)
        monkeypatch.setattr(store_mod, "idle_core", lambda: True)  # as on an idle machine
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
        "large-noise": rng.standard_normal((700, 1000), dtype=np.float32),  # lz4 saves little: raw
    }
    TensorStore.create(tmp_path / "default.zarr")
    assert TensorStore(tmp_path / "default.zarr").compressor == "zstd"  # a store that records none
    locs = write_payloads(tmp_path / "s.zarr", payloads, "lz4", large_bytes=2 << 20)
    store = TensorStore(tmp_path / "s.zarr")
    assert store.compressor == "lz4"
    for name, a in payloads.items():
        loc = locs[name]
        got = store.read(loc.array_path, loc.elem_offset, loc.elem_count, a.dtype, a.shape,
                         content_hash=payload_hash(a))
        assert got.tobytes() == a.tobytes(), name
        meta = json.loads((tmp_path / "s.zarr" / loc.array_path / "zarr.json").read_text())
        inner = meta["codecs"][0]["configuration"]["codecs"]
        if name == "large-noise":
            assert [c["name"] for c in inner] == ["bytes"], name
        else:
            assert inner[-1]["name"] == "blosc" and inner[-1]["configuration"]["cname"] == "lz4", name
        # any zarr v3 reader decodes it (here: zarr itself)
        stored = zarr.open_array(store.zstore, path=loc.array_path, mode="r")[...].reshape(-1)
        want = a.reshape(-1).view(np.uint16) if a.dtype == ml_dtypes.bfloat16 else a.reshape(-1)
        offset = loc.elem_offset or 0
        assert stored[offset : offset + a.size].tobytes() == want.tobytes(), name
    with pytest.raises(StorageError, match="codec is lz4, not zstd"):
        TensorStore(tmp_path / "s.zarr", read_only=False).choose_compressor("zstd")
    lz4_writer = StoreWriter(TensorStore(tmp_path / "s.zarr", read_only=False))
    zstd_writer = StoreWriter(TensorStore(tmp_path / "default.zarr", read_only=False))
    assert lz4_writer.compressor == "lz4" and zstd_writer.compressor == "zstd"
    # made for reading: payloads from 4 MiB get their own array (raw when lz4 saves little)
    assert lz4_writer.large_bytes == store_mod.READ_LARGE_BYTES < zstd_writer.large_bytes == store_mod.LARGE_BYTES
    lz4_writer.close()
    zstd_writer.close()


def test_ingest_codec_lz4_is_kept_verifies_and_reads_bit_exact(tmp_path):
    report = dumpdb.ingest(DUMP, archive=tmp_path / "lz4.dumpdb", run="a", codec="lz4", workers=1)
    assert not report.errors
    with dumpdb.open(tmp_path / "lz4.dumpdb") as a:
        assert a.store.compressor == "lz4"
        assert a.verify().ok
        rows = a.sql("SELECT t.tensor_id, r.source_path || '/' || t.source_file AS path FROM tensors t "
                     "JOIN runs r USING (run) WHERE t.content_hash IS NOT NULL AND t.source_file LIKE '%.npy' "
                     "ORDER BY t.tensor_id").to_pylist()
        assert rows
        for r in rows:
            assert a.tensor(r["tensor_id"]).tobytes() == np.load(r["path"]).tobytes(), r["path"]
    with pytest.raises(StorageError, match="an archive keeps the codec"):
        dumpdb.ingest(DUMP, archive=tmp_path / "lz4.dumpdb", run="b", codec="zstd", workers=1)
    with pytest.raises(DumpdbError, match="unknown codec 'gzip'"):
        dumpdb.ingest(DUMP, archive=tmp_path / "x.dumpdb", run="a", codec="gzip")
    assert not (tmp_path / "x.dumpdb").exists()


def test_bench_codecs_archive_says_which_codec_costs_more_than_it_saves(tmp_path):
    dumpdb.ingest(DUMP, archive=tmp_path / "a.dumpdb", run="a", workers=1)
    script = Path(__file__).resolve().parents[1] / "scripts" / "bench_codecs.py"
    proc = subprocess.run([sys.executable, str(script), "--archive", str(tmp_path / "a.dumpdb"), "--disk-gbps", "4.1"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(script.parents[1])})
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "float32/256K (stored as zstd)" in out, out
    for label in ("shuffle-zstd-1 against raw", "shuffle-lz4-9 against raw", "shuffle-zstd-1 against shuffle-lz4-9"):
        line = next(x for x in out.splitlines() if label in x)
        # one of the script's three verdicts; which one rests on decode times measured on a shared
        # machine (zstd timed no slower than lz4 is "never costs more than it saves")
        assert any(v in line for v in ("COSTS MORE THAN IT SAVES", "saves more than it costs",
                                       "never costs more than it saves")), line
