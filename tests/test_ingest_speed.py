"""Issue 12, the speed figures: worker processes write the packs of payloads they read.

With ``--workers N`` on a local store, payloads of 256 KiB or more come back from the
workers as references (:class:`dumpdb.ingestion.workers.PayloadRef`); the ingesting
process lays the packs out and hands each write back to the pool. These tests check that
this changes nothing a user can see (same catalog and stored bytes as the in-process
path, crash safety), that the workers really write, and that a file rewritten between the
two reads is refused instead of stored.

Every expected value comes from a second code path of dumpdb or from the files written
here, never from the code under test alone.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import uuid
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pytest
from catalog_snapshot import catalog_snapshot
from crashkit import kill_points
from forkrun import crashkit_process
from test_crash_safety import run_in_process

import dumpdb
from dumpdb.dumpio import confine
from dumpdb.errors import DumpdbError
from dumpdb.ingestion import pipeline, workers
from dumpdb.layouts import locate
from dumpdb.storage import store as store_mod
from dumpdb.storage.store import StoreWriter, TensorStore, payload_hash

REPO = Path(__file__).resolve().parents[1]
NAME = "{op}.Default_network-Net_{op}-op{i}.0.0.{ts}.output.0.DefaultFormat.{dt}.npy"


def make_dump(root: Path) -> dict[str, np.ndarray]:
    """A MindSpore sync dump (rank_0/Net/0/{0,1}) with tiny, medium (>= 256 KiB) and one
    large payload, float32 and float16, and a medium payload repeated in both iterations
    (dedup). Returns source_file -> the array saved."""
    rng = np.random.default_rng(7)
    (root / "rank_0" / ".dump_metadata").mkdir(parents=True)
    saved: dict[str, np.ndarray] = {}
    repeated = rng.standard_normal(70_000).astype(np.float32)  # 280 KB, in both iterations
    for it in (0, 1):
        d = root / "rank_0" / "Net" / "0" / str(it)
        d.mkdir(parents=True)
        arrays = [rng.standard_normal(16).astype(np.float32),  # tiny: comes back whole
                  rng.standard_normal(80_000).astype(np.float32),  # medium (320 KB)
                  rng.standard_normal((300, 500)).astype(np.float16),  # medium float16
                  repeated,
                  rng.standard_normal(300_000).astype(np.float32)]  # 1.2 MB: large below
        for i, arr in enumerate(arrays):
            dt = "Float16" if arr.dtype == np.float16 else "Float32"
            name = NAME.format(op="Add", i=i, ts=1_700_000_000_000_000 + 10 * it + i, dt=dt)
            np.save(d / name, arr)
            saved[f"rank_0/Net/0/{it}/{name}"] = arr
    return saved


def read_back(archive: Path) -> dict[str, bytes]:
    """source_file -> payload bytes read through the archive."""
    with dumpdb.open(archive) as arch:
        rows = arch.sql("SELECT tensor_id, source_file FROM tensors").to_pylist()
        return {r["source_file"]: arch.tensor(r["tensor_id"]).tobytes() for r in rows}


def recording_write(store_root: str, kind: str, args: tuple):
    """workers.write_payloads, leaving a file per call (kind, pid) in $DUMPDB_TEST_DELEGATED."""
    marker = Path(os.environ["DUMPDB_TEST_DELEGATED"]) / f"{kind}-{os.getpid()}-{uuid.uuid4().hex}"
    marker.touch()
    return workers.write_payloads(store_root, kind, args)


@pytest.fixture
def small_store(monkeypatch):
    """Packs of ~600 KB and large arrays from 1 MB: several delegated packs and a large one."""
    monkeypatch.setattr(store_mod, "PACK_BYTES", 600_000)
    monkeypatch.setattr(store_mod, "LARGE_BYTES", 1 << 20)


@pytest.mark.timeout(600)
def test_workers_write_the_packs_and_the_archive_equals_the_in_process_one(tmp_path, monkeypatch, small_store):
    saved = make_dump(tmp_path / "dump")
    calls = tmp_path / "delegated"
    calls.mkdir()
    monkeypatch.setenv("DUMPDB_TEST_DELEGATED", str(calls))
    monkeypatch.setattr(pipeline, "write_payloads", recording_write)
    one = dumpdb.ingest(tmp_path / "dump", tmp_path / "w1", run="r", workers=1)
    assert not list(calls.iterdir())  # in-process: this process writes
    two = dumpdb.ingest(tmp_path / "dump", tmp_path / "w2", run="r", workers=2)
    assert one.ok and two.ok and one.tensors_added == two.tensors_added == len(saved)
    assert one.deduplicated == two.deduplicated == 1
    # the worker processes wrote packs and the large array, never this process
    made = [p.name.split("-") for p in calls.iterdir()]
    assert {kind for kind, _, _ in made} == {"pack", "large"}
    assert all(int(pid) != os.getpid() for _, pid, _ in made)
    # same catalog (blobs offsets, stored bytes, arrays' shard checksums) and payloads
    assert catalog_snapshot(tmp_path / "w2") == catalog_snapshot(tmp_path / "w1")
    got = read_back(tmp_path / "w2")
    assert got == read_back(tmp_path / "w1")
    assert got == {k: v.tobytes() for k, v in saved.items()}
    assert dumpdb.open(tmp_path / "w2").verify().ok


def test_a_file_rewritten_between_the_two_reads_is_refused(tmp_path):
    make_dump(tmp_path / "dump")
    found = locate(tmp_path / "dump", None)
    with confine(tmp_path / "dump"):
        scan = found.layout.scan(found.path)
    entries = [e for e in scan.entries if (e.size or 0) > 300_000][:1]
    task = workers.LoadTask(found.layout.name, str(tmp_path / "dump"), False, entries, [e.size for e in entries],
                            keep_arrays=False)
    (item,) = workers.load_batch(task)
    assert item.array is None and item.ref is not None
    first = workers.read_payload(item.ref)
    assert payload_hash(first) == item.content_hash  # read again: the same payload
    path = Path(entries[0].path)
    np.save(path, np.load(path) + 1)  # same dtype and shape, other content
    with pytest.raises(DumpdbError) as err:
        workers.read_payload(item.ref)
    assert entries[0].source_file in str(err.value) and "changed while being ingested" in str(err.value)


class _Ref:
    """A payload by reference for StoreWriter: dtype, shape, nbytes, and which array."""

    def __init__(self, arrays: list[np.ndarray], i: int):
        self.i, a = i, arrays[i]
        self.dtype, self.shape, self.nbytes = a.dtype, a.shape, a.nbytes


def _write(root: Path, payloads, arrays, delegate=None) -> tuple[list, list]:
    writer = StoreWriter(TensorStore(root, read_only=False), pack_bytes=700_000, large_bytes=1 << 20)
    writer.resolve = lambda ref: arrays[ref.i]
    writer.delegate = delegate
    locations = []
    try:
        for p, a in zip(payloads, arrays):
            locations += writer.add(payload_hash(a), p)
        locations += writer.flush()
        return locations, writer.take_arrays()
    finally:
        writer.close()


def test_store_writer_references_write_the_same_bytes_here_when_the_pool_drops_them(tmp_path):
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal(n).astype(np.float32) for n in (70_000, 90_000, 80_000, 400_000, 75_000)]
    want, want_arrays = _write(tmp_path / "arrays", arrays, arrays)
    dropped = []

    def cancelled(kind, args):  # a pool shut down before it ran the write (Ctrl-C)
        dropped.append(kind)
        f: Future = Future()
        f.cancel()
        return f

    refs = [_Ref(arrays, i) for i in range(len(arrays))]
    for name, delegate in (("resolved", None), ("cancelled", cancelled)):
        got, got_arrays = _write(tmp_path / name, refs, arrays, delegate)
        assert [(g.content_hash, g.elem_offset, g.elem_count, g.stored_bytes) for g in got] == \
            [(w.content_hash, w.elem_offset, w.elem_count, w.stored_bytes) for w in want]
        # the same shard bytes (crc32c of each shard) and sizes
        assert [(a.kind, a.dtype, a.shape, a.stored_bytes, a.checksum) for a in got_arrays] == \
            [(a.kind, a.dtype, a.shape, a.stored_bytes, a.checksum) for a in want_arrays]
        reader = TensorStore(tmp_path / name)
        for loc, a in zip(got, arrays):
            back = reader.read(loc.array_path, loc.elem_offset, loc.elem_count, a.dtype, a.shape)
            assert back.tobytes() == a.tobytes()
    assert set(dropped) == {"pack", "large"}


# the small_store sizes and a commit after every batch, for the kill runs and the runs after them
SETTINGS = ("dumpdb.storage.store.PACK_BYTES=600000;dumpdb.storage.store.LARGE_BYTES=1048576;"
            "dumpdb.ingestion.pipeline.COMMIT_SECONDS=0")


def _crashkit(archive: Path, args: list[str], **env) -> subprocess.CompletedProcess:
    full = {**os.environ, "CRASHKIT_WATCH": str(archive), "CRASHKIT_SET": SETTINGS, **env}
    full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return crashkit_process(args, full)  # forked from a parent that imported dumpdb (tests/forkrun.py)


@pytest.mark.timeout(900)
def test_killed_while_workers_write_packs_reruns_to_the_clean_ingest(tmp_path):
    """kill -9 of the ingesting process at 2 points while 2 workers write its packs; the
    same command again: the rows of a clean ingest, each payload bit for bit, verify and gc."""
    saved = make_dump(tmp_path / "dump")
    archive = tmp_path / "a.dumpdb"
    args = ["ingest", str(tmp_path / "dump"), "--archive", str(archive), "--run", "r", "-q", "--workers", "2"]
    count = tmp_path / "events.txt"
    probe = _crashkit(tmp_path / "probe.dumpdb", [a if a != str(archive) else str(tmp_path / "probe.dumpdb")
                                                  for a in args], CRASHKIT_COUNT_FILE=str(count))
    assert probe.returncode == 0, probe.stderr
    total = int(count.read_text().split()[0])
    seed = int(os.environ.get("DUMPDB_CRASH_SEED", "20"))
    want = {k: v.tobytes() for k, v in saved.items()}
    # the workers' writes run beside the counted events, so later runs may have a few less
    # commits than the probe: kill points are taken from its first 60 %
    for at in kill_points(count, 2, "delegated", head=0.6):
        shutil.rmtree(archive, ignore_errors=True)
        where = f"killed at event {at} of {total} (seed {seed})"
        killed = _crashkit(archive, args, CRASHKIT_KILL_AT=str(at))
        assert killed.returncode == -signal.SIGKILL, f"{where}: {killed.returncode} {killed.stderr[-500:]}"
        if (archive / "catalog.duckdb").exists():
            committed = read_back(archive)  # what was committed reads back exactly
            assert all(want[k] == v for k, v in committed.items()), where
        # the runs that complete what the kill left need no process of their own (as in
        # test_crash_safety): this process, the same settings; the re-run's workers are processes
        rerun = run_in_process(args, SETTINGS)
        assert rerun.returncode == 0, f"{where}: re-run failed: {rerun.stderr[-500:]}"
        assert read_back(archive) == want, where
        assert dumpdb.open(archive).verify().ok, where
        gc = run_in_process(["gc", "--archive", str(archive), "--grace", "0"], SETTINGS)
        assert gc.returncode == 0, f"{where}: gc failed: {gc.stderr[-500:]}"
        assert read_back(archive) == want and dumpdb.open(archive).verify().ok, where


# -- the tiny-file path: cheaper per file, the same rows -------------------------------------------
def test_rows_table_equals_arrow_from_pylist():
    """rows_table (column lists) builds what pa.Table.from_pylist builds, missing keys NULL."""
    import pyarrow as pa

    rows = [{"run": "r", "tensor_key": "a", "shape": [2, 3], "min": 1.5, "count": 6, "rank": 0},
            {"run": "r", "tensor_key": "b", "shape": None, "note": "x", "requires_grad": True},
            {"tensor_key": "c", "original_shape": (4,), "source_mtime_ns": 2**62}]
    for schema in (pipeline.TENSOR_SCHEMA, pipeline.ERROR_SCHEMA):
        assert pipeline.rows_table(rows, schema).equals(pa.Table.from_pylist(rows, schema))
    assert pipeline.rows_table([], pipeline.TENSOR_SCHEMA).equals(pa.Table.from_pylist([], pipeline.TENSOR_SCHEMA))


def test_blob_table_equals_the_rows_of_each_location():
    import pyarrow as pa

    from dumpdb.catalog.payload_rows import BLOB_SCHEMA, blob_table
    from dumpdb.storage.store import BlobLocation

    locs = [BlobLocation("h1", 64, "packs/float32/p", 0, 16, 40), BlobLocation("h2", 0, None, None, 0, 0),
            BlobLocation("h3", 1 << 24, "large/h3/x", None, 1 << 22, 1 << 23)]
    for first_run in ("r", None, {"h1": "a", "h3": "b"}):
        want = pa.Table.from_pylist(
            [loc.row(first_run.get(loc.content_hash) if isinstance(first_run, dict) else first_run) for loc in locs],
            BLOB_SCHEMA)
        assert blob_table(locs, first_run).equals(want)


def test_a_worker_process_loads_no_catalog():
    """What a spawned worker imports (dumpdb.ingestion.workers) leaves the pipeline, the catalog
    and DuckDB out: each worker starts in ~0.5 s less CPU; dumpdb.ingestion.ingest still works."""
    code = ("import sys, dumpdb.ingestion.workers; "
            "print(sorted(m for m in ('duckdb', 'dumpdb.ingestion.pipeline', 'dumpdb.catalog') if m in sys.modules)); "
            "import dumpdb.ingestion as i; print(i.ingest.__module__)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["[]", "dumpdb.ingestion.pipeline"]
