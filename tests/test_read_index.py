"""Reads by tensor_id through the in-memory location index (issue 13, point 2): no catalog
connection is kept, commits of other processes are seen, and tensors() reads in storage
order yet yields in the query's order."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from conftest import ms_case, npy_payload

import dumpdb
from dumpdb.catalog.locations import catalog_stamp
from dumpdb.errors import DumpdbError, PayloadMissing


@pytest.fixture(scope="module")
def _archive_once(tmp_path_factory):
    path = tmp_path_factory.mktemp("read-index") / "a.dumpdb"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("dumpdb.storage.store.PACK_BYTES", 32 << 10)  # several packs
        assert dumpdb.ingest(ms_case("c1_inputs_kernels_iter"), archive=path, run="c1").ok
    return path


@pytest.fixture
def archive(_archive_once, tmp_path, monkeypatch):
    """A private copy (the tests prune and damage it) of one c1 ingest per module in 32 KiB
    packs, the pack size staying set for the test."""
    monkeypatch.setattr("dumpdb.storage.store.PACK_BYTES", 32 << 10)
    path = tmp_path / "a.dumpdb"
    shutil.copytree(_archive_once, path)
    return path


def _ingest_in_another_process(archive, case: str, run: str) -> None:
    code = f"import dumpdb; assert dumpdb.ingest({str(ms_case(case))!r}, archive={str(archive)!r}, run={run!r}).ok"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr


def test_reads_by_id_hold_no_connection_and_see_another_process_commit(archive):
    a = dumpdb.open(archive)
    root = ms_case("c1_inputs_kernels_iter")
    rows = a.sql("SELECT tensor_id, source_file FROM tensors ORDER BY tensor_id").to_pylist()
    for row in rows:
        assert a.tensor(row["tensor_id"]).tobytes() == npy_payload(root / row["source_file"])[2]
    assert a.locations.loads == 1  # one load for all those reads: the catalog did not change
    # the archive stays open here; another process can still write the catalog
    _ingest_in_another_process(archive, "f_long_names", "f")
    new = a.sql("SELECT tensor_id, source_file FROM tensors WHERE run = 'f' ORDER BY tensor_id").to_pylist()
    assert len(new) == 66
    f_root = ms_case("f_long_names")
    for row in new:
        assert a.tensor(row["tensor_id"]).tobytes() == npy_payload(f_root / row["source_file"])[2]
    assert a.locations.loads == 2  # reloaded once, after the commit


def test_the_catalog_stamp_changes_with_each_commit(archive):
    before = catalog_stamp(archive / "catalog.duckdb")
    assert before == catalog_stamp(archive / "catalog.duckdb")  # reading changes nothing
    dumpdb.open(archive).sql("SELECT count(*) FROM tensors")
    assert before == catalog_stamp(archive / "catalog.duckdb")
    dumpdb.open(archive).prune("c1", "0")
    assert before != catalog_stamp(archive / "catalog.duckdb")


def test_a_tensor_pruned_after_the_index_loaded_says_so(archive):
    a = dumpdb.open(archive)
    tid = a.sql("SELECT min(tensor_id) AS t FROM tensors WHERE iteration = 0")["t"][0].as_py()
    a.tensor(tid)
    dumpdb.open(archive).prune("c1", "0")
    with pytest.raises(DumpdbError, match="pruned"):
        a.tensor(tid)
    with pytest.raises(dumpdb.TensorNotFound):
        a.tensor(10**9)


def test_a_missing_payload_after_the_index_loaded_names_the_tensor(archive):
    a = dumpdb.open(archive)
    row = a.sql("""SELECT t.tensor_id, t.op_name, b.array_path FROM tensors t JOIN blobs b USING (content_hash)
                   ORDER BY t.tensor_id LIMIT 1""").to_pylist()[0]
    a.tensor(row["tensor_id"])
    store = a.writable_store()
    store.delete_array(row["array_path"])
    fresh = dumpdb.open(archive)
    with pytest.raises(PayloadMissing, match=f"op_name='{row['op_name']}'"):
        fresh.tensor(row["tensor_id"])


def test_tensors_yields_in_query_order_none_for_pruned_and_raises_at_the_bad_row(archive, monkeypatch):
    monkeypatch.setattr("dumpdb.archive.READ_BATCH_ROWS", 5)  # several batches, read ahead
    a = dumpdb.open(archive)
    a.prune("c1", "0")
    root = ms_case("c1_inputs_kernels_iter")
    query = "SELECT tensor_id, source_file, iteration FROM tensors ORDER BY op_name DESC, tensor_id DESC"
    expected = a.sql(query).to_pylist()
    got = list(a.tensors(query))
    assert [r for r, _ in got] == expected
    for row, array in got:
        if row["iteration"] == 0:
            assert array is None
        else:
            assert array.tobytes() == npy_payload(root / row["source_file"])[2]
    # a payload gone: every row before the first tensor stored in it comes, then the error names that tensor
    where = {r["tensor_id"]: r["array_path"] for r in a.sql(
        "SELECT tensor_id, array_path FROM tensors JOIN blobs USING (content_hash) WHERE iteration <> 0").to_pylist()}
    first: dict[str, int] = {}  # array -> first position in the query's order of a tensor stored in it
    for i, r in enumerate(expected):
        if r["tensor_id"] in where:
            first.setdefault(where[r["tensor_id"]], i)
    path, position = max(first.items(), key=lambda kv: kv[1])
    assert position > 0
    a.writable_store().delete_array(path)
    seen = []
    with pytest.raises(PayloadMissing, match=f"tensor {expected[position]['tensor_id']} "):
        for row, _array in dumpdb.open(archive).tensors(query):
            seen.append(row["tensor_id"])
    assert seen == [r["tensor_id"] for r in expected[:position]]
