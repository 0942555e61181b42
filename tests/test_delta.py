"""Delta coding inside a pack (issue 13, dumpdb/storage/delta.py): a payload stored as the XOR
of a similar earlier payload of the same pack reads back bit for bit for every dtype (one-byte
dtypes are never delta-coded), ``ingest(delta=False)`` stores plain, archives written before
read unchanged, gc/prune keep what a live delta needs, and a SIGKILLed ingest that writes
deltas leaves committed rows exact and re-runs to a verified archive."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import zarr
from conftest import DATA, assert_payloads_read_back, ms_case, npy_files, npy_payload, write_payloads
from crashkit import kill_points
from test_crash_safety import assert_committed_rows_exact, crashkit_run, run_in_process

import dumpdb
import dumpdb.archive
import dumpdb.storage.delta as delta_mod
from dumpdb.storage.delta import XorPart, XorTable, from_attribute
from dumpdb.storage.store import StoreWriter, TensorStore, payload_hash

DTYPES = [np.bool_, np.int8, np.uint8, np.int16, np.int32, np.int64, np.uint16, np.uint32, np.uint64,
          np.float16, np.float32, np.float64, ml_dtypes.bfloat16, np.complex64, np.complex128]
ONE_BYTE = {np.dtype(np.bool_), np.dtype(np.int8), np.dtype(np.uint8)}
E1 = ms_case("e1_nan_inf_overflow")  # real MindSpore dump whose packs get delta payloads at 1 KiB


@pytest.fixture
def small_deltas(monkeypatch):
    """Delta coding tried from 1 KiB up, on 1 KiB samples: a few KiB make delta payloads."""
    monkeypatch.setattr(delta_mod, "DELTA_MIN_BYTES", 1024)
    monkeypatch.setattr(delta_mod, "DELTA_SAMPLE_BYTES", 1024)


def _random(rng: np.random.Generator, dtype, n: int) -> np.ndarray:
    """``n`` items of random bit patterns (bool: 0/1)."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, n).astype(np.bool_)
    return rng.integers(0, 256, n * dtype.itemsize, dtype=np.uint8).view(dtype)


def _close(x: np.ndarray, bit: int = 0) -> np.ndarray:
    """``x`` with bit ``bit`` of every item's first byte flipped (bool: every other item
    negated): nearly the same bits, as an op's output next to its input."""
    if x.dtype == np.bool_:
        out = x.copy()
        out[bit::2] = ~out[bit::2]
        return out
    raw = x.view(np.uint8).copy()
    raw[:: x.dtype.itemsize] ^= 1 << bit
    return raw.view(x.dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_every_dtype_round_trips_bit_exact_with_delta_payloads(tmp_path, small_deltas, dtype):
    TensorStore.create(tmp_path / "t.zarr")
    store = TensorStore(tmp_path / "t.zarr", read_only=False)
    rng = np.random.default_rng(np.dtype(dtype).num)
    n = 4096 // np.dtype(dtype).itemsize + 5
    base = _random(rng, dtype, n)
    near = _close(base)  # XOR with base: one set bit per item
    other = _random(rng, dtype, n)  # same size, unrelated: a delta would not pay
    tiny = _close(_random(rng, dtype, 7))  # under DELTA_MIN_BYTES
    payloads = [base, tiny, near, other, _close(near, 1).reshape(1, n)]
    hashes = [payload_hash(p) for p in payloads]
    locations, infos = write_payloads(StoreWriter(store, delta=True), zip(hashes, payloads))
    assert [i.kind for i in infos] == ["pack"]
    bases = [locations[h].base_hash for h in hashes]
    if np.dtype(dtype) in ONE_BYTE:  # never delta-coded
        assert bases == [None] * 5
    else:
        # near: XOR of base; other: plain (does not pay); the last: near is a delta, never a
        # base (chain depth 1), so its base is base too
        assert bases == [None, None, hashes[0], None, hashes[0]]
    meta = json.loads((tmp_path / "t.zarr" / infos[0].array_path / "zarr.json").read_text())
    attribute = meta["attributes"]["dumpdb"].get("xor")
    raw = np.asarray(zarr.open_array(store.zstore, path=infos[0].array_path, mode="r")[...])
    if np.dtype(dtype) not in ONE_BYTE:
        loc = locations[hashes[2]]
        assert attribute == [[loc.elem_offset, n, locations[hashes[0]].elem_offset],
                             [locations[hashes[4]].elem_offset, n, locations[hashes[0]].elem_offset]]
        # what zarr.json says holds: the stored elements are payload XOR base
        stored = raw[loc.elem_offset : loc.elem_offset + n]
        assert stored.tobytes() == np.bitwise_xor(near.view(np.uint8), base.view(np.uint8)).tobytes()
    else:
        assert attribute is None
    assert_payloads_read_back(TensorStore(tmp_path / "t.zarr"), locations, hashes, payloads)
    # the batch read (compare's small pairs) makes delta payloads plain as read() does
    many = TensorStore(tmp_path / "t.zarr").read_many(
        [(locations[h].array_path, locations[h].elem_offset, locations[h].elem_count, p.dtype, p.shape)
         for h, p in zip(hashes, payloads)])
    assert [g.tobytes() for g in many] == [p.tobytes() for p in payloads]
    # a range across plain and delta payloads (and starting inside one) reads plain too
    whole = np.concatenate([np.ascontiguousarray(p).reshape(-1) for p in payloads]).view(np.uint8)
    item = raw.dtype.itemsize
    for start, count in ((0, raw.size), (n // 2, 2 * n), (n + 7 + n - 3, 6)):
        part = TensorStore(tmp_path / "t.zarr").read_pack_range(infos[0].array_path, start, count)
        assert part.tobytes() == whole[start * item : (start + count) * item].tobytes()


def test_delta_off_stores_plain_and_on_reads_the_same(tmp_path, small_deltas):
    on, off = tmp_path / "on.dumpdb", tmp_path / "off.dumpdb"
    assert dumpdb.ingest(E1, archive=on, run="e1").ok
    assert dumpdb.ingest(E1, archive=off, run="e1", delta=False).ok
    deltas = dumpdb.open(on).sql("SELECT count(*) AS n FROM blobs WHERE base_hash IS NOT NULL").to_pylist()[0]["n"]
    assert deltas > 0
    assert dumpdb.open(off).sql("SELECT count(*) AS n FROM blobs WHERE base_hash IS NOT NULL").to_pylist() == [{"n": 0}]
    for path in (off / "tensors.zarr" / "packs").glob("*/*/zarr.json"):
        assert "xor" not in json.loads(path.read_text())["attributes"]["dumpdb"]
    for archive in (on, off):
        a = dumpdb.open(archive)
        assert _read_as_source(a, "TRUE") == len(npy_files(E1))
        assert a.verify().ok


def _read_as_source(a, where: str) -> int:
    """Every tensor of ``a`` matching ``where`` reads (hash verified) as its source file in
    the e1 dump, bit for bit; returns how many."""
    n = 0
    for row, array in a.tensors(f"SELECT tensor_id, source_file FROM tensors WHERE {where}", verify=True):
        _, shape, payload = npy_payload(E1 / row["source_file"])
        assert array.shape == shape and array.tobytes() == payload
        n += 1
    return n


def test_no_delta_on_the_command_line_stores_plain(tmp_path, small_deltas):
    from typer.testing import CliRunner

    from dumpdb.cli import app

    archive = tmp_path / "a.dumpdb"
    result = CliRunner().invoke(app, ["ingest", str(E1), "--archive", str(archive), "--run", "e1", "-q",
                                      "--no-delta"])
    assert result.exit_code == 0, result.output
    a = dumpdb.open(archive)
    assert a.sql("SELECT count(*) AS n FROM blobs WHERE base_hash IS NOT NULL").to_pylist() == [{"n": 0}]


def test_an_archive_written_before_delta_coding_reads_unchanged_beside_new_delta_payloads(tmp_path, small_deltas):
    """tests/data/archives/codec_zstd1_d2.dumpdb: written before issue 13 (schema without
    blobs.base_hash, packs without the xor attribute)."""
    archive = tmp_path / "old.dumpdb"
    shutil.copytree(DATA / "archives" / "codec_zstd1_d2.dumpdb", archive)
    assert dumpdb.ingest(E1, archive=archive, run="e1").ok
    a = dumpdb.open(archive)
    by_run = {r["run"]: r["n"] for r in a.sql(
        "SELECT t.run, count(*) FILTER (WHERE b.base_hash IS NOT NULL) AS n FROM tensors t "
        "JOIN blobs b USING (content_hash) GROUP BY ALL").to_pylist()}
    assert by_run["d2"] == 0 and by_run["e1"] > 0
    roots = {"d2": ms_case("d2_compare_fp16_bf16_iter0"), "e1": E1}
    n = 0
    for row, array in a.tensors("SELECT tensor_id, run, source_file FROM tensors", verify=True):
        _, shape, payload = npy_payload(roots[row["run"]] / row["source_file"])
        assert array.shape == shape and array.tobytes() == payload
        n += 1
    assert n == 95 + len(npy_files(E1))
    assert a.verify().ok


def _delta_files(archive: Path) -> tuple[set[str], set[str]]:
    """(source files whose payload is stored as a delta, source files of their bases)."""
    rows = dumpdb.open(archive).sql(
        "SELECT t.source_file, b.base_hash IS NOT NULL AS is_delta, "
        "t.content_hash IN (SELECT base_hash FROM blobs) AS is_base "
        "FROM tensors t JOIN blobs b USING (content_hash)").to_pylist()
    return {r["source_file"] for r in rows if r["is_delta"]}, {r["source_file"] for r in rows if r["is_base"]}


@pytest.mark.parametrize("compact_below", [0.0, 0.99], ids=["kept", "compacted"])
def test_prune_and_gc_of_the_base_run_keep_the_other_runs_delta_payloads_readable(tmp_path, small_deltas,
                                                                                 compact_below):
    archive = tmp_path / "a.dumpdb"
    assert dumpdb.ingest(E1, archive=archive, run="all").ok
    deltas, bases = _delta_files(archive)
    assert deltas and bases and not deltas & bases
    # run "deltas": the same dump without the bases' files: its delta payloads dedupe onto "all"'s
    only = tmp_path / "only_deltas"
    shutil.copytree(E1, only)
    for name in bases:
        (only / name).unlink()
    assert dumpdb.ingest(only, archive=archive, run="deltas").ok
    a = dumpdb.open(archive)
    assert a.prune("all") > 0
    report = a.gc(compact_below=compact_below, grace=0)
    assert report.blobs_dropped > 0  # the bases' blobs (only "all" used them) are gone
    a = dumpdb.open(archive)
    assert _read_as_source(a, "run = 'deltas'") == len(npy_files(E1)) - len(bases)
    assert a.verify().ok
    stored_deltas = a.sql("SELECT count(*) AS n FROM blobs WHERE base_hash IS NOT NULL").to_pylist()[0]["n"]
    if compact_below == 0.0:  # packs kept as they are: the base bytes stay in them without a blob row
        assert stored_deltas > 0
        assert a.sql("SELECT count(*) AS n FROM blobs WHERE base_hash NOT IN (SELECT content_hash FROM blobs)"
                     ).to_pylist()[0]["n"] > 0
    else:  # compacted: the live payloads were copied plain
        assert report.packs_compacted > 0 and stored_deltas == 0


def test_a_malformed_xor_attribute_is_an_error_naming_the_pack():
    assert from_attribute(None, 10, "p") == []
    assert from_attribute([[5, 3, 0], [3, 2, 0]], 10, "p") == [XorPart(3, 2, 0), XorPart(5, 3, 0)]
    for bad in ("x", [[1, 2]], [[4, 4, 2]], [[0, 3, 0]], [[8, 4, 0]], [[4, 2, 0], [5, 2, 0]], [[4, 2, True]]):
        with pytest.raises(ValueError, match="packs/float32/p1"):
            from_attribute(bad, 10, "packs/float32/p1")


def test_a_damaged_xor_attribute_in_a_stored_pack_is_an_error_naming_it_not_wrong_bytes(tmp_path, small_deltas):
    TensorStore.create(tmp_path / "t.zarr")
    store = TensorStore(tmp_path / "t.zarr", read_only=False)
    base = _random(np.random.default_rng(1), np.float32, 1024)
    payloads = [base, _close(base)]
    hashes = [payload_hash(p) for p in payloads]
    locations, infos = write_payloads(StoreWriter(store, delta=True), zip(hashes, payloads))
    assert locations[hashes[1]].base_hash == hashes[0]
    path = tmp_path / "t.zarr" / infos[0].array_path / "zarr.json"
    meta = json.loads(path.read_text())
    meta["attributes"]["dumpdb"]["xor"] = [[1024, 1024, 1000]]  # base overlapping the payload
    path.write_text(json.dumps(meta))
    loc = locations[hashes[1]]
    with pytest.raises(ValueError, match=infos[0].array_path):
        TensorStore(tmp_path / "t.zarr").read(loc.array_path, loc.elem_offset, loc.elem_count, np.float32, (1024,))


def test_xor_table_finds_the_delta_payloads_a_range_overlaps():
    table = XorTable([XorPart(10, 5, 0), XorPart(20, 5, 0)])
    assert not table.overlaps(0, 10) and table.overlaps(0, 11) and table.overlaps(14, 1)
    assert not table.overlaps(15, 5) and table.overlaps(15, 6) and not table.overlaps(25, 100)


# -- SIGKILL during an ingest that writes delta payloads (tests/crashkit.py, as test_crash_safety)
SETTINGS = ("dumpdb.storage.delta.DELTA_MIN_BYTES=1024;dumpdb.storage.store.PACK_BYTES=262144;"
            "dumpdb.ingestion.pipeline.COMMIT_SECONDS=0")


def _crashkit(archive: Path, args: list[str], **extra) -> subprocess.CompletedProcess:
    return crashkit_run(archive, args, SETTINGS, **extra)


@pytest.mark.timeout(600)
def test_ingest_writing_deltas_killed_anywhere_keeps_committed_rows_exact_and_reruns_verified(tmp_path):
    # e1's iteration 0 only (195 of its 390 files, the same relative paths, so the committed
    # rows check against E1's files): all of e1's delta payloads are in it, at half the work
    # of each of the seven ingests
    dump = tmp_path / "e1"
    shutil.copytree(E1, dump)
    shutil.rmtree(dump / "rank_0" / "LeNet5" / "0" / "1")
    archive = tmp_path / "a.dumpdb"
    args = ["ingest", str(dump), "--archive", str(archive), "--run", "e1", "-q"]
    probe = tmp_path / "probe.dumpdb"
    count_file = tmp_path / "events.txt"
    proc = _crashkit(probe, ["ingest", str(dump), "--archive", str(probe), "--run", "e1", "-q"],
                     CRASHKIT_COUNT_FILE=str(count_file))
    assert proc.returncode == 0, proc.stderr
    assert dumpdb.open(probe).sql("SELECT count(*) AS n FROM blobs WHERE base_hash IS NOT NULL"
                                  ).to_pylist()[0]["n"] > 0  # these settings do write deltas
    total = int(count_file.read_text().split()[0])
    n_files = len(npy_files(dump))
    # events vary a little from run to run (threads, commit timing): points in the first 90 %
    for at in kill_points(count_file, 3, "delta-ingest", head=0.9):
        if archive.exists():
            shutil.rmtree(archive)
        proc = _crashkit(archive, args, CRASHKIT_KILL_AT=str(at))
        where = f"ingest with deltas killed at event {at} of {total}"
        assert proc.returncode == -signal.SIGKILL, f"{where}: {proc.returncode} {proc.stderr[-500:]}"
        if archive.exists() and dumpdb.archive.is_archive(archive):
            assert assert_committed_rows_exact(archive, where) <= n_files
        rerun = run_in_process(args, SETTINGS)
        assert rerun.returncode == 0, f"{where}: re-run failed: {rerun.stderr[-500:]}"
        assert assert_committed_rows_exact(archive, where + ", after the re-run") == n_files


def test_a_bundle_of_an_archive_with_deltas_holds_plain_payloads_and_imports_bit_exact(tmp_path, small_deltas):
    import pyarrow.parquet as pq

    archive = tmp_path / "a.dumpdb"
    assert dumpdb.ingest(E1, archive=archive, run="e1").ok
    assert _delta_files(archive)[0]
    bundle = Path(dumpdb.open(archive).export("e1", tmp_path / "e1.bundle"))
    for path in (bundle / "tensors.zarr" / "packs").glob("*/*/zarr.json"):
        assert "xor" not in json.loads(path.read_text())["attributes"]["dumpdb"]  # any zarr reader reads it
    assert set(pq.read_table(bundle / "catalog" / "blobs.parquet").column("base_hash").to_pylist()) == {None}
    other = tmp_path / "b.dumpdb"
    dumpdb.ingest(ms_case("c1_inputs_kernels_iter"), archive=other, run="c1")
    b = dumpdb.open(other)
    b.import_bundle(bundle)
    n = 0
    for row, array in dumpdb.open(other).tensors("SELECT tensor_id, source_file FROM tensors WHERE run = 'e1'",
                                                 verify=True):
        _, shape, payload = npy_payload(E1 / row["source_file"])
        assert array.shape == shape and array.tobytes() == payload
        n += 1
    assert n == len(npy_files(E1))


def test_a_base_that_is_itself_a_delta_is_refused():
    """dumpdb's bases are plain (a read XORs once): an attribute chaining a delta onto a
    delta would read wrong bytes, so it is an error naming the pack."""
    assert from_attribute([[10, 5, 0], [20, 5, 3]], 30, "p")  # plain bases: accepted
    with pytest.raises(ValueError, match="p: attribute dumpdb.xor entry .*itself a delta"):
        from_attribute([[10, 5, 0], [20, 5, 12]], 30, "p")
