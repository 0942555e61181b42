"""Pack reads that decode each chunk as few times as they can (issue 29): payloads spanning
whole chunks decoded straight into the result, and a chunk cache that stays within its bytes
when two threads decode the same chunk at once."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from store_payloads import write_payloads

from dumpdb.storage import store as store_mod
from dumpdb.storage.store import MEDIUM_CHUNK_BYTES, TensorStore

CHUNK = MEDIUM_CHUNK_BYTES // 4  # float32 elements of one inner chunk of a pack of medium payloads


def test_payload_over_whole_chunks_reads_back_without_filling_the_cache(tmp_path):
    rng = np.random.default_rng(3)
    head = rng.standard_normal(CHUNK // 3, dtype=np.float32)  # the big payload starts inside chunk 0
    big = rng.standard_normal(2 * CHUNK + 17, dtype=np.float32)  # covers chunk 1 whole, 0 and 2 in part
    locations = write_payloads(tmp_path / "s.zarr", {"head": head, "big": big})
    loc = locations["big"]
    store = TensorStore(tmp_path / "s.zarr")
    got = store.read(loc.array_path, loc.elem_offset, loc.elem_count, np.dtype(np.float32), big.shape)
    assert got.tobytes() == big.tobytes()
    assert store._pack(loc.array_path).chunk == CHUNK and 0 < loc.elem_offset < CHUNK
    cached = {i for (_, i) in store._chunks}
    assert cached == {0, 2}  # the two partly covered chunks; chunk 1 was decoded into the result
    again = store.read(loc.array_path, loc.elem_offset, loc.elem_count, np.dtype(np.float32), big.shape)
    assert again.tobytes() == big.tobytes()
    h = locations["head"]
    assert store.read(h.array_path, h.elem_offset, h.elem_count, np.dtype(np.float32),
                      head.shape).tobytes() == head.tobytes()


def test_whole_chunk_of_the_wrong_size_is_an_error_naming_the_pack(tmp_path, monkeypatch):
    big = np.arange(2 * CHUNK, dtype=np.float32)
    loc = write_payloads(tmp_path / "s.zarr", {"big": big})["big"]
    store = TensorStore(tmp_path / "s.zarr")
    meta = store._pack(loc.array_path)
    short = meta.decoder.encode(np.zeros(CHUNK - 1, np.float32))  # a frame that decodes to fewer elements
    real_get = store.objects.get
    monkeypatch.setattr(store.objects, "get", lambda key, start=None, end=None: short
                        if key == meta.key and start == int(meta.index[1][0]) else real_get(key, start, end))
    with pytest.raises(ValueError, match=r"chunk 1 decodes to \d+ elements, not"):
        store.read(loc.array_path, loc.elem_offset, loc.elem_count, np.dtype(np.float32), big.shape)


def test_chunk_two_threads_want_at_once_is_decoded_once_and_counted_once(tmp_path, monkeypatch):
    small = np.arange(1000, dtype=np.float32)
    loc = write_payloads(tmp_path / "s.zarr", {"small": small})["small"]
    store = TensorStore(tmp_path / "s.zarr")
    meta = store._pack(loc.array_path)
    decoding, go = threading.Event(), threading.Event()
    calls = []
    real_decode = store_mod.decode_frame

    def decode(*args, **kwargs):
        calls.append(1)
        decoding.set()
        go.wait(10)  # the first decode lasts until the second thread has asked for the chunk
        return real_decode(*args, **kwargs)

    monkeypatch.setattr(store_mod, "decode_frame", decode)
    got: list[np.ndarray] = []
    threads = [threading.Thread(target=lambda: got.append(store._chunk(loc.array_path, meta, 0))) for _ in range(2)]
    threads[0].start()
    assert decoding.wait(10)
    threads[1].start()
    threads[1].join(0.5)  # it waits for the first thread's decode (or, started late, finds the chunk cached)
    go.set()
    for t in threads:
        t.join(10)
    assert len(calls) == 1
    assert len(got) == 2 and got[0] is got[1] and got[0].tobytes() == small.tobytes()
    assert len(store._chunks) == 1 and not store._decoding
    assert store._chunk_bytes == sum(c.nbytes for c in store._chunks.values())


def test_chunk_that_fails_to_decode_raises_and_leaves_nothing_behind(tmp_path, monkeypatch):
    loc = write_payloads(tmp_path / "s.zarr", {"small": np.arange(10, dtype=np.float32)})["small"]
    store = TensorStore(tmp_path / "s.zarr")
    meta = store._pack(loc.array_path)

    def broken(*args, **kwargs):
        raise ValueError("damaged frame")

    monkeypatch.setattr(store_mod, "decode_frame", broken)
    with pytest.raises(ValueError, match="damaged frame"):
        store._chunk(loc.array_path, meta, 0)
    assert not store._chunks and not store._decoding and store._chunk_bytes == 0


def test_payload_of_exactly_one_chunk_is_decoded_into_the_result_not_the_cache(tmp_path):
    # a payload that is one whole chunk (the conv-net dump: 1 GB of such 4 MiB payloads) is
    # decoded into the array read returns, as a spanning payload's whole chunks are: no
    # decode into the cache and copy out of it
    rng = np.random.default_rng(11)
    one = rng.standard_normal(CHUNK, dtype=np.float32)
    tail = rng.standard_normal(CHUNK // 4, dtype=np.float32)  # starts chunk 1
    locations = write_payloads(tmp_path / "s.zarr", {"one": one, "tail": tail})
    loc = locations["one"]
    store = TensorStore(tmp_path / "s.zarr")
    assert store._pack(loc.array_path).chunk == CHUNK and loc.elem_offset == 0 and loc.elem_count == CHUNK
    got = store.read(loc.array_path, loc.elem_offset, loc.elem_count, np.dtype(np.float32), one.shape)
    assert got.tobytes() == one.tobytes() and got.flags.writeable and not store._chunks
    t = locations["tail"]
    part = store.read(t.array_path, t.elem_offset, t.elem_count, np.dtype(np.float32), tail.shape)
    assert part.tobytes() == tail.tobytes() and {i for (_, i) in store._chunks} == {1}
    # read_pack_range: the same bytes, whether the chunk is cached or not
    assert store.read_pack_range(loc.array_path, 0, CHUNK).tobytes() == one.tobytes()
    store._chunk(loc.array_path, store._pack(loc.array_path), 0)
    assert store.read_pack_range(loc.array_path, 0, CHUNK).tobytes() == one.tobytes()
