"""Payload faults seen through the archive API: a missing or altered payload is an
error naming the tensor (run, op_name, io, slot), never zeros or silent wrong bytes."""

from __future__ import annotations

import json

import pytest
from conftest import ms_case

import dumpdb
from dumpdb.errors import PayloadCorrupt, PayloadMissing
from dumpdb.storage.codecs import codec_for
from dumpdb.storage.shard import ShardTarget, encode_chunks, write_shard
from dumpdb.storage.store import shard_key


@pytest.fixture
def archive(tmp_path, monkeypatch):
    monkeypatch.setattr("dumpdb.storage.store.LARGE_BYTES", 1 << 12)  # some tensors become large arrays
    path = tmp_path / "a.dumpdb"
    dumpdb.ingest(ms_case("c1_inputs_kernels_iter"), archive=path, run="c1")
    return dumpdb.open(path)


def _one(a, kind):
    return a.sql("""SELECT t.tensor_id, t.op_name, t.io, t.slot, b.array_path, b.elem_offset, t.shape
                    FROM tensors t JOIN blobs b USING (content_hash) JOIN arrays r USING (array_path)
                    WHERE r.kind = ? ORDER BY t.tensor_id LIMIT 1""", [kind]).to_pylist()[0]


@pytest.mark.parametrize("kind", ["pack", "tensor"])
def test_a_missing_shard_names_the_tensor(archive, kind):
    row = _one(archive, kind)
    ndim = 1 if kind == "pack" else len(row["shape"])
    archive.writable_store().objects.delete(shard_key(row["array_path"], ndim))
    with pytest.raises(PayloadMissing) as info:
        archive.tensor(row["tensor_id"])
    message = str(info.value)
    assert "\n" not in message and "run='c1'" in message and row["op_name"] in message
    assert f"io={row['io']}" in message and f"slot={row['slot']}" in message and "missing" in message


def test_verify_on_read_catches_bytes_that_decode_but_changed(archive):
    row = _one(archive, "pack")
    store = archive.writable_store()
    path = row["array_path"]
    n = archive.sql("SELECT shape[1] AS n FROM arrays WHERE array_path = ?", [path])["n"][0].as_py()
    whole = store.read_pack_range(path, 0, n).copy()
    whole[row["elem_offset"]] += 1  # a valid pack whose bytes differ from what was hashed
    chunk = _inner_chunk(store, path)
    write_shard(ShardTarget(store.objects, shard_key(path, 1)), encode_chunks(whole, chunk, codec_for(whole.dtype, chunk * whole.dtype.itemsize).frame_codec()))
    fresh = dumpdb.open(archive.path)
    fresh.tensor(row["tensor_id"], verify=False)  # the opt-out: the altered bytes come back
    with pytest.raises(PayloadCorrupt, match=r"run=.c1.*content hash mismatch"):
        fresh.tensor(row["tensor_id"])  # checked by default (issue 30)
    with pytest.raises(PayloadCorrupt, match=r"run='c1'.*content hash mismatch"):
        fresh.tensor(row["tensor_id"], verify=True)
    with pytest.raises(PayloadCorrupt, match="content hash mismatch"):
        list(fresh.tensors("SELECT tensor_id FROM tensors WHERE tensor_id = ?", [row["tensor_id"]], verify=True))
    assert not fresh.verify().ok


def _inner_chunk(store, path) -> int:
    meta = json.loads(bytes(store.objects.get(f"{path}/zarr.json")))
    return int(meta["codecs"][0]["configuration"]["chunk_shape"][0])


def test_a_missing_shard_stops_export_and_shows_in_verify(archive, tmp_path):
    row = _one(archive, "pack")
    key = shard_key(row["array_path"], 1)
    archive.writable_store().objects.delete(key)
    report = archive.verify()
    assert not report.ok and row["array_path"] in report.damaged_shards
    assert any("missing" in reason for reason in report.damaged.values())
    with pytest.raises(PayloadMissing, match=key):
        archive.export("c1", tmp_path / "c1.bundle")
    assert not (tmp_path / "c1.bundle").exists()  # no bundle written without its payloads
