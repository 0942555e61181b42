"""export/import bundles: a real run to .zip and back bit for bit, readable without dumpdb,
damage detected, idempotent, name conflicts refused or renamed."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pyarrow.parquet as pq
import pytest
import zarr
from conftest import ingest_runs, ms_case, npy_files, npy_payload, private_copy
from typer.testing import CliRunner

import dumpdb
from dumpdb.cli import app


@pytest.fixture(scope="module")
def _source_once(tmp_path_factory):
    return ingest_runs(tmp_path_factory.mktemp("bundle-src") / "src.dumpdb",
                       d2="d2_compare_fp16_bf16_iter0", c1="c1_inputs_kernels_iter")


@pytest.fixture
def source_archive(_source_once, tmp_path):
    """A private copy (a test prunes it) of one d2 + c1 ingest per module."""
    return private_copy(_source_once, tmp_path)


def _exact(archive, run, src):
    with dumpdb.open(archive) as a:
        rows = list(a.tensors("SELECT tensor_id, source_file, dtype FROM tensors WHERE run = ?", [run]))
        assert len(rows) == len(npy_files(src))
        for row, array in rows:
            assert array.tobytes() == npy_payload(src / row["source_file"])[2]


def test_export_zip_import_fresh_verify_bit_exact(source_archive, tmp_path):
    bundle = dumpdb.open(source_archive).export("d2", tmp_path / "d2.zip")
    assert zipfile.is_zipfile(bundle)
    fresh = tmp_path / "fresh.dumpdb"
    r = CliRunner().invoke(app, ["import", str(bundle), "-a", str(fresh)])
    assert r.exit_code == 0, r.output
    a = dumpdb.open(fresh)
    assert a.runs()["run"].to_pylist() == ["d2"]
    assert a.verify().ok
    _exact(fresh, "d2", ms_case("d2_compare_fp16_bf16_iter0"))
    info = a.show("d2")
    assert info["bytes_stored"] > 0 and info["framework_version"] == "2.10.0"
    assert a.sql("SELECT count(*) AS n FROM ops WHERE run = 'd2'")["n"][0].as_py() > 0
    again = a.import_bundle(bundle)
    assert again.runs_skipped == ["d2"] and not again.runs_imported


def test_bundle_is_readable_without_dumpdb(source_archive, tmp_path):
    bundle = dumpdb.open(source_archive).export(["c1"], tmp_path / "c1.bundle")
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["runs"] == ["c1"] and "catalog/tensors.parquet" in manifest["files"]
    tensors = pq.read_table(bundle / "catalog" / "tensors.parquet").to_pylist()
    blobs = {b["content_hash"]: b for b in pq.read_table(bundle / "catalog" / "blobs.parquet").to_pylist()}
    store = zarr.storage.LocalStore(str(bundle / "tensors.zarr"), read_only=True)
    row = next(t for t in tensors if t["dtype"] == "float32" and t["shape"])
    b = blobs[row["content_hash"]]
    flat = zarr.open_array(store, path=b["array_path"], mode="r")[b["elem_offset"] : b["elem_offset"] + b["elem_count"]]
    array = np.asarray(flat).view(np.float32).reshape(row["shape"])
    assert array.tobytes() == npy_payload(ms_case("c1_inputs_kernels_iter") / row["source_file"])[2]


def test_damaged_bundle_and_conflicts(source_archive, tmp_path):
    bundle = dumpdb.open(source_archive).export(["c1"], tmp_path / "c1.bundle")
    target = tmp_path / "t.dumpdb"
    dumpdb.ingest(ms_case("f_long_names"), archive=target, run="c1")  # same name, other data
    with pytest.raises(dumpdb.DumpdbError, match="already exists in .*--rename c1=NEW"):
        dumpdb.open(target).import_bundle(bundle)
    report = dumpdb.open(target).import_bundle(bundle, rename={"c1": "c1-imported"})
    assert report.runs_imported == ["c1-imported"]
    _exact(target, "c1-imported", ms_case("c1_inputs_kernels_iter"))
    shard = next((bundle / "tensors.zarr").rglob("c/0"))
    raw = bytearray(shard.read_bytes())
    raw[10] ^= 1
    shard.write_bytes(bytes(raw))
    with pytest.raises(dumpdb.DumpdbError, match="damaged"):
        dumpdb.open(tmp_path / "t.dumpdb").import_bundle(bundle, rename={"c1": "other"})
    with pytest.raises(dumpdb.DumpdbError, match="already exists"):
        dumpdb.open(source_archive).export(["c1"], bundle)
    with pytest.raises(dumpdb.DumpdbError, match="no run 'zz'"):
        dumpdb.open(source_archive).export(["zz"], tmp_path / "zz.zip")


def test_pruned_rows_travel_without_payloads(source_archive, tmp_path):
    a = dumpdb.open(source_archive)
    a.prune("c1", iterations="0")
    bundle = a.export(["c1"], tmp_path / "c1.zip")
    fresh = tmp_path / "fresh.dumpdb"
    dumpdb.ingest(ms_case("f_long_names"), archive=fresh, run="f")
    dumpdb.open(fresh).import_bundle(bundle)
    b = dumpdb.open(fresh)
    assert b.verify().ok
    pruned = b.sql("SELECT tensor_id FROM tensors WHERE run = 'c1' AND iteration = 0")["tensor_id"].to_pylist()
    with pytest.raises(dumpdb.DumpdbError, match="pruned"):
        b.tensor(pruned[0])
    kept = b.sql("SELECT count(*) AS n FROM tensors WHERE run = 'c1' AND pruned_at IS NULL")["n"][0].as_py()
    assert kept == 28
