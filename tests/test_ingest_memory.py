"""Issue 29 item 4: an in-process ingest recycles the memory of the payloads it copies.

New content read into a reader thread's buffer is copied into blocks of
:class:`dumpdb.ingestion.workers.PayloadMemory` (reused once the payload is written and
dropped), and a pack's payloads are laid back to back in the writer thread's reused
scratch memory instead of a fresh ``np.concatenate``. Neither may change a byte: the
catalog (with each shard's checksum) and every payload read back equal those of an ingest
that copies into fresh memory, on a real MindSpore dump (float32, float16, bfloat16).
"""

from __future__ import annotations

import numpy as np
from catalog_snapshot import catalog_snapshot, payloads_by_source_file
from conftest import ms_case

import dumpdb
from dumpdb.ingestion import pipeline, workers
from dumpdb.storage import store as store_mod
from dumpdb.storage.store import StoreWriter


def test_a_block_is_reused_only_once_nothing_refers_to_it():
    memory = workers.PayloadMemory(1 << 20)
    x = np.arange(1000, dtype=np.float32).reshape(10, 100)
    a = memory.copy(x)
    assert a.dtype == x.dtype and a.shape == x.shape and a.flags.c_contiguous and np.array_equal(a, x)
    flat = a.reshape(-1).view(np.uint8)  # the writer's view outlives the payload array
    del a
    b = memory.copy(x + 1)
    assert not np.shares_memory(b, flat) and np.array_equal(flat.view(np.float32).reshape(10, 100), x)
    del flat, b
    c = memory.copy(x * 2)
    assert memory.reused == 1 and any(np.shares_memory(c, block) for block in memory.blocks)
    assert np.array_equal(c, x * 2)
    # past the limit a copy is fresh memory and the blocks held stay within it
    big = [memory.copy(np.ones(100_000, np.float32)) for _ in range(4)]
    assert memory.held <= 1 << 20 and not any(np.shares_memory(big[-1], block) for block in memory.blocks)


def test_recycled_memory_stores_what_fresh_copies_store(tmp_path, monkeypatch):
    dump = ms_case("d2_compare_fp16_bf16_iter0")
    # every file through the reader threads' buffers, few files in flight, small packs (many
    # back-to-back layouts, delta coding), and a pool of a few blocks: reused and evicted
    monkeypatch.setattr(pipeline, "READ_BUFFER_MIN_BYTES", 0)
    monkeypatch.setattr(workers, "BATCH_FILES", 2)
    monkeypatch.setattr(pipeline, "INFLIGHT_COUNT", 4)
    monkeypatch.setattr(store_mod, "PACK_BYTES", 16 << 10)
    monkeypatch.setattr(pipeline, "PAYLOAD_MEMORY_BYTES", 512 << 10)
    pools: list[workers.PayloadMemory] = []
    made = workers.PayloadMemory.__init__

    def init(self, limit_bytes):
        made(self, limit_bytes)
        pools.append(self)

    monkeypatch.setattr(workers.PayloadMemory, "__init__", init)
    recycled = dumpdb.ingest(dump, tmp_path / "recycled", run="r", workers=1)
    assert recycled.ok and pools and sum(p.reused for p in pools) >= 5
    # the same ingest copying into fresh memory, as before issue 29
    monkeypatch.setattr(workers.PayloadMemory, "copy", lambda self, array: array.copy())
    monkeypatch.setattr(StoreWriter, "_scratch", lambda self, nbytes: np.empty(nbytes, np.uint8))
    fresh = dumpdb.ingest(dump, tmp_path / "fresh", run="r", workers=1)
    assert fresh.ok and fresh.tensors_added == recycled.tensors_added > 0
    assert catalog_snapshot(tmp_path / "recycled") == catalog_snapshot(tmp_path / "fresh")
    got = payloads_by_source_file(tmp_path / "recycled")
    assert got == payloads_by_source_file(tmp_path / "fresh") and len(got) == recycled.tensors_added
