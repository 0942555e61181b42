"""Stored bytes are what the disk holds: the catalog's ``arrays.stored_bytes`` of each array
equals the bytes of its files (walked here with os, not with dumpdb), and its payloads'
``blobs.stored_bytes`` shares add up to it; compressible payloads store fewer bytes than raw."""

from __future__ import annotations

import os

from conftest import ms_case

import dumpdb


def _disk_bytes(path) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def test_stored_bytes_are_the_files_on_disk(tmp_path, monkeypatch):
    monkeypatch.setattr("dumpdb.storage.store.PACK_BYTES", 64 << 10)  # several packs
    monkeypatch.setattr("dumpdb.storage.store.LARGE_BYTES", 8 << 10)  # and some large arrays
    archive = tmp_path / "a.dumpdb"
    report = dumpdb.ingest(ms_case("e1_nan_inf_overflow"), archive=archive, run="e1")
    assert report.ok
    a = dumpdb.open(archive)
    arrays = a.sql("SELECT array_path, kind, stored_bytes FROM arrays").to_pylist()
    assert {r["kind"] for r in arrays} == {"pack", "tensor"}
    raw = {r["array_path"]: r["n"] for r in a.sql(
        "SELECT array_path, sum(nbytes) AS n FROM blobs GROUP BY 1").to_pylist()}
    shares = {r["array_path"]: (r["s"], r["k"]) for r in a.sql(
        "SELECT array_path, sum(stored_bytes) AS s, count(*) AS k FROM blobs GROUP BY 1").to_pylist()}
    for r in arrays:
        on_disk = _disk_bytes(archive / "tensors.zarr" / r["array_path"])
        assert r["stored_bytes"] == on_disk > 0, r
        total, parts = shares[r["array_path"]]
        assert abs(total - on_disk) <= parts, r  # per-payload shares round to whole bytes
    # e1's payloads compress (LeNet activations, zeros): stored < raw in total, and the
    # report's bytes_stored is the disk's, not the payloads' size
    assert sum(r["stored_bytes"] for r in arrays) < sum(raw.values())
    assert report.bytes_stored == sum(s for s, _ in shares.values())
    assert report.bytes_stored < report.bytes_in
