"""The tensor store's smaller promises, pinned where mutation testing found them untested:
the bounded chunk cache, the zarr v3 sharding defaults a pack may leave out, the store's
root marker. Values are written from the module docstring and the zarr v3 sharding spec."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr.storage

import dumpdb.storage.store as store_mod
from dumpdb.errors import PayloadCorrupt
from dumpdb.storage.objects import ObjectStore
from dumpdb.storage.store import StoreWriter, TensorStore, payload_hash, shard_key

CHUNK_ELEMS = 64  # float32 elements in a 256-byte inner chunk


@pytest.fixture
def pack(monkeypatch):
    """One float32 pack of 1024 elements in 256-byte inner chunks (16 chunks), in memory."""
    monkeypatch.setattr(store_mod, "INNER_CHUNK_BYTES", 256)
    zstore = zarr.storage.MemoryStore()
    TensorStore.create(zstore)
    data = np.arange(1024, dtype=np.float32)
    writer = StoreWriter(TensorStore(zstore, read_only=False), pack_bytes=4096, large_bytes=1 << 20)
    (loc,) = writer.add("h", data) + writer.flush()
    writer.close()
    return zstore, loc, data


def _counting_gets(monkeypatch) -> list:
    calls: list = []
    real = ObjectStore._get

    def counting(self, key, byte_range):
        calls.append(key)
        return real(self, key, byte_range)

    monkeypatch.setattr(ObjectStore, "_get", counting)
    return calls


def _read(reader: TensorStore, loc, chunk: int) -> np.ndarray:
    """The four elements at the start of inner chunk ``chunk``."""
    return reader.read(loc.array_path, chunk * CHUNK_ELEMS, 4, np.dtype(np.float32), (4,))


def test_chunk_cache_keeps_recent_chunks_within_its_byte_bound(pack, monkeypatch):
    zstore, loc, data = pack
    shard = shard_key(loc.array_path, 1)
    # a cache of one chunk (256 bytes): reading chunk 0, 1, 0 decodes chunk 0 twice
    small = TensorStore(zstore, chunk_cache_bytes=256)
    _read(small, loc, 15)  # pack metadata and index read, chunk 15 cached
    calls = _counting_gets(monkeypatch)
    for chunk in (0, 1, 0):
        assert _read(small, loc, chunk).tolist() == data[chunk * 64: chunk * 64 + 4].tolist()
    assert calls == [shard] * 3
    # the default cache (64 MiB) keeps both: chunk 0 is read once
    calls.clear()
    big = TensorStore(zstore)
    _read(big, loc, 15)
    calls.clear()
    for chunk in (0, 1, 0, 1):
        _read(big, loc, chunk)
    assert calls == [shard] * 2


def test_pack_metadata_without_index_location_means_end(pack):
    """zarr v3 sharding codec: ``index_location`` is optional, default ``"end"``."""
    zstore, loc, data = pack
    objects = ObjectStore(zstore)
    key = f"{loc.array_path}/zarr.json"
    meta = json.loads(bytes(objects.get(key)))
    del meta["codecs"][0]["configuration"]["index_location"]
    objects.set(key, json.dumps(meta).encode())
    got = TensorStore(zstore).read(loc.array_path, 100, 300, np.dtype(np.float32), (300,))
    assert got.tobytes() == data[100:400].tobytes()


def test_a_new_store_is_marked_as_a_dumpdb_tensor_store():
    zstore = zarr.storage.MemoryStore()
    TensorStore.create(zstore)
    root = json.loads(bytes(ObjectStore(zstore).get("zarr.json")))
    assert root["node_type"] == "group"
    marker = root["attributes"]["dumpdb"]
    assert (marker["kind"], marker["layout"]) == ("tensor-store", 1)
    assert "catalog" in marker["catalog"]  # says where the catalog describing it is (issue 19)


def test_verify_names_a_changed_payload(pack):
    """``read(verify=True)`` re-hashes the bytes read: a content hash they do not match is
    PayloadCorrupt naming the array and saying the stored bytes changed."""
    zstore, loc, data = pack
    reader = TensorStore(zstore)
    part = data[10:20]
    got = reader.read(loc.array_path, 10, 10, np.dtype(np.float32), (10,),
                      content_hash=payload_hash(part), verify=True)
    assert got.tobytes() == part.tobytes()
    with pytest.raises(PayloadCorrupt) as err:
        reader.read(loc.array_path, 10, 10, np.dtype(np.float32), (10,), content_hash="0" * 32, verify=True)
    assert f"{loc.array_path}: content hash mismatch: the stored bytes changed" in str(err.value)
    with pytest.raises(PayloadCorrupt):  # checked by default, too (issue 30)
        reader.read(loc.array_path, 10, 10, np.dtype(np.float32), (10,), content_hash="0" * 32)
    assert reader.read(loc.array_path, 10, 10, np.dtype(np.float32), (10,), content_hash="0" * 32,
                       verify=False).tobytes() == part.tobytes()


def test_a_local_store_given_as_a_store_keeps_its_directory(tmp_path):
    """``TensorStore(DurableLocalStore(dir))`` knows its directory as ``root``, as when
    given the path: verify and gc look for crash leftovers there."""
    from dumpdb.storage.local import DurableLocalStore

    assert TensorStore(DurableLocalStore(str(tmp_path))).root == tmp_path
    assert TensorStore(tmp_path).root == tmp_path
    assert TensorStore(zarr.storage.MemoryStore()).root is None
