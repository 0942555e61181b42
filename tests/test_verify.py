"""dumpdb verify: payloads read back and re-hashed; a flipped byte names the tensors it hurts."""

from __future__ import annotations

import shutil

import pytest
from conftest import ingest_runs, private_copy
from typer.testing import CliRunner

import dumpdb
from dumpdb.cli import app


@pytest.fixture(scope="module")
def _archive_once(tmp_path_factory):
    return ingest_runs(tmp_path_factory.mktemp("verify") / "a.dumpdb", c1="c1_inputs_kernels_iter", f="f_long_names")


@pytest.fixture
def archive(_archive_once, tmp_path):
    """A private copy (the tests damage it) of one c1 + f ingest per module."""
    return private_copy(_archive_once, tmp_path)


def _pack_of(archive, run="c1", dtype="float32"):
    """The shard file and path of the float32 pack that ``run``'s ingest wrote."""
    a = dumpdb.open(archive)
    path = a.sql("SELECT DISTINCT b.array_path FROM blobs b JOIN arrays r USING (array_path) "
                 "WHERE b.first_run = ? AND r.kind = 'pack' AND r.dtype = ?", [run, dtype])["array_path"][0].as_py()
    return archive / "tensors.zarr" / path / "c" / "0", path


def test_clean_archive_verifies(archive):
    report = dumpdb.open(archive).verify()
    assert report.ok and report.blobs_checked == report.blobs_total > 0
    assert report.damaged_tensors.num_rows == 0
    result = CliRunner().invoke(app, ["verify", "-a", str(archive)])
    assert result.exit_code == 0 and "ok" in result.output


def test_a_flipped_byte_in_a_shard_names_the_affected_tensors(archive):
    shard, array_path = _pack_of(archive)
    raw = bytearray(shard.read_bytes())
    raw[100] ^= 0x10  # inside the first zstd frame (data, not the index at the end)
    shard.write_bytes(bytes(raw))
    a = dumpdb.open(archive)
    report = a.verify()
    assert not report.ok
    bad = report.damaged_tensors.to_pylist()
    assert bad and all(array_path in r["reason"] for r in bad)
    # only tensors whose payload lies in the damaged first chunk can be named (zstd without
    # frame checksums: a flipped literal usually decodes, changing just that payload)
    in_chunk = a.sql("""SELECT t.tensor_id FROM tensors t JOIN blobs b USING (content_hash)
                        WHERE b.array_path = ? AND b.elem_offset < 262144""", [array_path])
    assert {r["tensor_id"] for r in bad} <= set(in_chunk["tensor_id"].to_pylist())
    assert {r["run"] for r in bad} <= {"c1", "f"} and all(r["op_name"] and r["io"] for r in bad)
    result = CliRunner().invoke(app, ["verify", "-a", str(archive)])
    assert result.exit_code == 1 and "damaged" in result.output


def test_shard_checksums_are_recorded_and_checked(archive):
    a = dumpdb.open(archive)
    assert a.sql("SELECT count(*) AS n FROM arrays WHERE checksum IS NULL")["n"][0].as_py() == 0
    report = a.verify()
    assert report.ok and report.shards_checked == a.sql("SELECT count(*) AS n FROM arrays")["n"][0].as_py()
    shard, array_path = _pack_of(archive)
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0x04
    shard.write_bytes(bytes(raw))
    report = dumpdb.open(archive).verify()
    assert not report.ok and array_path in report.damaged_shards


def test_a_damaged_index_is_found_and_run_filter(archive):
    shard, _ = _pack_of(archive)
    raw = bytearray(shard.read_bytes())
    raw[-6] ^= 0x01  # inside the shard index
    shard.write_bytes(bytes(raw))
    report = dumpdb.open(archive).verify("c1")
    assert not report.ok and "checksum" in next(iter(report.damaged.values()))
    assert set(report.damaged_tensors["run"].to_pylist()) == {"c1"}


def test_sample_and_errors(archive):
    a = dumpdb.open(archive)
    full = a.verify()
    part = a.verify(sample=0.3, seed=1)
    assert 0 < part.blobs_checked < full.blobs_checked and part.ok
    assert a.verify(sample=0.3, seed=1).blobs_checked == part.blobs_checked
    with pytest.raises(dumpdb.DumpdbError, match="fraction"):
        a.verify(sample=2)
    with pytest.raises(dumpdb.DumpdbError, match="no run 'x'"):
        a.verify("x")


def test_missing_shard_file_is_damage_not_a_crash(archive):
    shard, _ = _pack_of(archive)
    shutil.move(shard, shard.with_suffix(".moved"))
    report = dumpdb.open(archive).verify()
    assert not report.ok and report.damaged_tensors.num_rows > 0


def test_large_arrays_and_empty_payloads_verify(tmp_path, monkeypatch):
    """Payloads stored as their own (large) array, and zero-byte payloads, read back and hash."""
    import numpy as np

    monkeypatch.setattr("dumpdb.storage.store.LARGE_BYTES", 8 << 10)
    it = tmp_path / "dump/rank_0/Net/0/0"
    it.mkdir(parents=True)
    np.save(it / "Add.Default_Add-op1.0.0.1623124369613541.output.0.DefaultFormat.npy",
            np.arange(4096, dtype=np.float32).reshape(64, 64))  # 16 KiB: large here
    np.save(it / "Add.Default_Add-op1.0.0.1623124369613541.input.0.DefaultFormat.npy", np.zeros(0, np.float32))
    np.save(it / "Add.Default_Add-op1.0.0.1623124369613541.input.1.DefaultFormat.npy", np.ones(3, np.float32))
    archive = tmp_path / "a.dumpdb"
    assert dumpdb.ingest(tmp_path / "dump", archive=archive, run="r").ok
    a = dumpdb.open(archive)
    kinds = a.sql("SELECT b.nbytes, r.kind FROM blobs b LEFT JOIN arrays r USING (array_path) ORDER BY 1").to_pylist()
    assert [(k["nbytes"], k["kind"]) for k in kinds] == [(0, None), (12, "pack"), (16384, "tensor")]
    report = a.verify()
    assert report.ok and report.blobs_checked == report.blobs_total == 3 and report.bytes_checked == 16396
    # damage the large array's shard: verify names its tensor
    shard = next(p for p in (archive / "tensors.zarr" / "large").rglob("*") if p.is_file() and p.name != "zarr.json")
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    shard.write_bytes(bytes(raw))
    bad = a.verify()
    assert not bad.ok and bad.damaged_tensors["io"].to_pylist() == ["output"]


def test_sample_fraction_bounds(archive):
    a = dumpdb.open(archive)
    for bad in (0, -0.5, 1.5):
        with pytest.raises(dumpdb.DumpdbError, match="fraction in \\(0, 1\\]"):
            a.verify(sample=bad)
    whole = a.verify(sample=1)
    assert whole.ok and whole.blobs_checked == whole.blobs_total


def test_progress_and_repeatable_sample(archive):
    a = dumpdb.open(archive)
    calls = []
    report = a.verify(progress=lambda done, total: calls.append((done, total)))
    n = report.blobs_total
    assert calls == [(i, n) for i in range(1, n + 1)]
    one = a.verify(sample=1e-9, seed=5)  # at least one payload is always checked
    assert one.blobs_checked == 1
    picks = {a.verify(sample=0.3, seed=11).bytes_checked for _ in range(3)}
    assert len(picks) == 1  # the same seed checks the same payloads


def test_changed_bytes_that_still_read_back_are_a_content_hash_mismatch(tmp_path, monkeypatch):
    """Random float32 does not compress: the large array is stored uncompressed
    (dumpdb.storage.codecs), so a changed byte reads back without error and only the
    re-hash (xxh3-128, blobs.content_hash) and the shard's crc32c can see it."""
    import numpy as np

    monkeypatch.setattr("dumpdb.storage.store.LARGE_BYTES", 8 << 10)
    it = tmp_path / "dump/rank_0/Net/0/0"
    it.mkdir(parents=True)
    values = np.random.default_rng(20).standard_normal((64, 64)).astype(np.float32)  # 16 KiB
    np.save(it / "Add.Default_Add-op1.0.0.1623124369613541.output.0.DefaultFormat.npy", values)
    archive = tmp_path / "a.dumpdb"
    assert dumpdb.ingest(tmp_path / "dump", archive=archive, run="r").ok
    a = dumpdb.open(archive)
    (row,) = a.sql("SELECT content_hash, array_path FROM blobs").to_pylist()
    shard = next(p for p in (archive / "tensors.zarr" / row["array_path"]).rglob("*")
                 if p.is_file() and p.name != "zarr.json")
    raw = bytearray(shard.read_bytes())
    raw[1000] ^= 0x01  # one bit of one value, far from the index at the end
    shard.write_bytes(bytes(raw))
    report = a.verify()
    assert report.damaged == {row["content_hash"]:
                              f"{row['array_path']}: content hash mismatch: the stored bytes changed"}
    assert report.damaged_shards[row["array_path"]].startswith("shard checksum crc32c:")
    assert report.bytes_checked == 0 and report.blobs_checked == 1
    assert report.damaged_tensors["io"].to_pylist() == ["output"]


def test_pruned_tensors_are_counted_not_checked(archive):
    """verify(run): pruned tensors (payload dropped, rows kept) are counted in
    tensors_pruned and left out of tensors_checked; pruned_last is the last prune's time."""
    a = dumpdb.open(archive)
    counts = a.sql("SELECT count(*) AS n, count(*) FILTER (iteration = 0) AS it0, "
                   "count(*) FILTER (content_hash IS NULL) AS stats_only FROM tensors WHERE run = 'c1'").to_pylist()[0]
    assert 0 < counts["it0"] < counts["n"]
    before = a.verify("c1")
    assert before.tensors_pruned == 0 and before.pruned_last is None
    assert before.tensors_checked == counts["n"] - counts["stats_only"]
    assert a.prune("c1", iterations="0") == counts["it0"]
    after = a.verify("c1")
    assert after.ok and after.tensors_pruned == counts["it0"] and after.pruned_last is not None
    assert after.tensors_checked == before.tensors_checked - counts["it0"]
    assert after.tensors_statistics_only == counts["stats_only"]
    assert a.verify("f").tensors_pruned == 0  # another run's count is its own


def test_statistics_only_tensors_are_counted_apart(tmp_path):
    """Tensors dumped as statistic.csv rows only (no payload) are counted in
    tensors_statistics_only, not checked, and are no damage."""
    import numpy as np

    it = tmp_path / "dump/rank_0/Net/0/0"
    it.mkdir(parents=True)
    np.save(it / "Add.Default_Add-op1.0.0.1623124369613541.output.0.DefaultFormat.npy", np.ones(3, np.float32))
    header = ("Op Type,Op Name,Task ID,Stream ID,Timestamp,IO,Slot,Data Size,Data Type,Shape,"
              "Max Value,Min Value,Avg Value,L2Norm Value,MD5")
    rows = ['ReLU,Default_ReLU-op9,0,0,1795336641444999,output,0,64,float32,"(4,4)",1.0,0.0,0.5,2.0,',
            'ReLU,Default_ReLU-op9,0,0,1795336641444999,input,0,64,float32,"(4,4)",1.0,-1.0,0.0,2.0,']
    (it / "statistic.csv").write_text(header + "\n" + "\n".join(rows) + "\n")
    archive = tmp_path / "a.dumpdb"
    assert dumpdb.ingest(tmp_path / "dump", archive=archive, run="r").statistics_only == 2
    a = dumpdb.open(archive)
    for report in (a.verify(), a.verify("r")):
        assert report.ok and report.tensors_statistics_only == 2
        assert report.tensors_checked == 1 and report.blobs_checked == 1 and report.tensors_pruned == 0


def test_a_shard_the_system_refuses_to_read_is_named_with_its_reason(archive, monkeypatch):
    """_check_shards: an OSError while re-reading a shard (here EACCES, which a test run as
    root cannot provoke with chmod) is damage naming the shard and the system's reason."""
    a = dumpdb.open(archive)
    store = a.store

    def refused(array_path, ndim):
        raise PermissionError(13, "Permission denied", store.shard_name(array_path, ndim))

    monkeypatch.setattr(store, "shard_checksum", refused)
    report = a.verify()
    arrays = a.sql("SELECT array_path, len(shape) AS ndim FROM arrays").to_pylist()
    assert report.damaged_shards == {r["array_path"]: f"cannot read {store.shard_name(r['array_path'], r['ndim'])}: "
                                     "Permission denied" for r in arrays}
    assert report.shards_checked == 0 and not report.ok


def test_verify_maps_no_file_and_reads_map_again_after(tmp_path, monkeypatch):
    """verify reads every payload as pread copies, never a file mapping
    (``ObjectStore.map_reads``): a mapped page the disk cannot read is SIGBUS, which would kill
    verify instead of reporting the damage. With ``MAP_READ_BYTES`` 1 every local read of this
    archive is a mapping otherwise (a tensor read shows it), and again after verify."""
    import mmap

    import numpy as np

    monkeypatch.setattr("dumpdb.storage.store.LARGE_BYTES", 8 << 10)
    monkeypatch.setattr("dumpdb.storage.objects.MAP_READ_BYTES", 1)
    it = tmp_path / "dump/rank_0/Net/0/0"
    it.mkdir(parents=True)
    np.save(it / "Add.Default_Add-op1.0.0.1623124369613541.output.0.DefaultFormat.npy",
            np.arange(4096, dtype=np.float32).reshape(64, 64))  # 16 KiB: its own (large) array here
    np.save(it / "Add.Default_Add-op1.0.0.1623124369613541.input.0.DefaultFormat.npy", np.ones(3, np.float32))
    archive = tmp_path / "a.dumpdb"
    assert dumpdb.ingest(tmp_path / "dump", archive=archive, run="r").ok
    maps: list = []
    real = mmap.mmap

    def counted(*args, **kwargs):
        maps.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(mmap, "mmap", counted)
    ids = dumpdb.open(archive).sql("SELECT tensor_id FROM tensors ORDER BY 1")["tensor_id"].to_pylist()

    def read_all():  # a new Archive each time: nothing comes from a chunk cache
        a = dumpdb.open(archive)
        return a, [a.tensor(i) for i in ids]

    _, tensors = read_all()
    assert len(maps) >= len(ids)  # the read path maps both payloads
    maps.clear()
    a = dumpdb.open(archive)
    report = a.verify()
    assert report.ok and report.blobs_checked == 2 and report.bytes_checked == 16384 + 12
    assert maps == []
    assert a.store.objects.map_reads  # restored: a later read of the same Archive maps again
    maps.clear()
    assert [t.tolist() for t in (a.tensor(i) for i in ids)] == [t.tolist() for t in tensors]
    assert maps
