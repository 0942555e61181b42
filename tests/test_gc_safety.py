"""gc against ingest/import/rm/prune: the store lock, the grace period, orphans and .tmp shards.

The race this guards against (issue 14): ``rm`` a run, then ingest its twin (every
payload deduplicates against the removed run's blobs) while ``gc`` runs: gc used to
delete the very payloads the new run was committing, and every tensor of it was lost.
"""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from conftest import ms_case, npy_files, npy_payload

import dumpdb
from dumpdb.catalog.locks import EXCLUSIVE, SHARED, describe_holders, holders, store_lock
from dumpdb.errors import ArchiveError
from dumpdb.progress import Reporter

REPO = Path(__file__).resolve().parent.parent

GC_LOOP = textwrap.dedent("""
    import sys
    from pathlib import Path
    import dumpdb
    archive, stop, started = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    a = dumpdb.open(archive, on_wait=lambda m: print("WAIT", m, flush=True))
    n = 0
    while not stop.exists() and n < 10000:
        after = started.exists()
        a.gc()
        n += 1
        print("GC after-start" if after else "GC", flush=True)
    print("END", n, flush=True)
""")


def _lines(proc, q):
    for line in proc.stdout:
        q.put(line.strip())
    q.put(None)


def _ingest_under_gc_loop(tmp_path, **ingest_options):
    """Ingest a dump that deduplicates against a removed run's (dead) payloads while gc runs
    in a loop in another process; returns (dump, archive, report, lines gc printed)."""
    src = ms_case("e1_nan_inf_overflow")
    archive = tmp_path / "a.dumpdb"
    dumpdb.ingest(src, archive=archive, run="old")
    dumpdb.open(archive).remove_run("old")  # its payloads are dead now, until the twin references them
    stop, started = tmp_path / "stop", tmp_path / "started"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", GC_LOOP, str(archive), str(stop), str(started)],
                            stdout=subprocess.PIPE, text=True, env=env)
    q: queue.Queue = queue.Queue()
    threading.Thread(target=_lines, args=(proc, q), daemon=True).start()
    seen: list[str] = []

    class DuringIngest(Reporter):
        def start(self, total, skipped):
            # The ingest has read which payloads exist. Let gc act now: wait for a gc pass
            # that began after this point to complete (the old race) or for gc to say it
            # waits for this ingest (the lock).
            started.touch()
            while True:
                line = q.get(timeout=120)
                assert line is not None, seen
                seen.append(line)
                if line == "GC after-start" or (line.startswith("WAIT") and "in use by" in line):
                    return

    try:
        report = dumpdb.ingest(src, archive=archive, run="new", reporter=DuringIngest(), **ingest_options)
    finally:
        stop.touch()
        proc.wait(timeout=300)
    return src, archive, report, seen


def _new_run_reads_back_whole(src, archive) -> None:
    """After a final gc every tensor of run 'new' reads back bit-exact and verify passes."""
    a = dumpdb.open(archive)
    a.gc()
    with a:
        rows = 0
        for row, array in a.tensors("SELECT tensor_id, source_file FROM tensors WHERE run = 'new'"):
            assert array is not None and array.tobytes() == npy_payload(src / row["source_file"])[2]
            rows += 1
    assert rows == len(npy_files(src))
    assert a.verify().ok


def test_gc_loop_during_deduplicating_ingest_loses_nothing(tmp_path):
    src, archive, report, seen = _ingest_under_gc_loop(tmp_path)
    assert report.ok and report.deduplicated > 0
    _new_run_reads_back_whole(src, archive)
    # and it was the store lock that did it: gc said it waited (for this ingest, or for whoever
    # was queued for the lock when it asked)
    assert any("in use by" in line for line in seen if line.startswith("WAIT")), seen


def test_shared_holders_coexist_and_exclusive_waits_naming_them(tmp_path):
    archive = tmp_path / "a.dumpdb"
    archive.mkdir()
    waits = []
    with store_lock(archive, SHARED, "ingest of run 'x'", timeout=5):
        with store_lock(archive, SHARED, "import of b.zip", timeout=5):
            assert {h["what"] for h in holders(archive)} == {"ingest of run 'x'", "import of b.zip"}
        with pytest.raises(ArchiveError, match=r"in use by ingest of run 'x' \(pid \d+, for \d+ s\)"):
            with store_lock(archive, EXCLUSIVE, "gc", timeout=0.1, on_wait=waits.append):
                pass
    assert waits and "gc: waiting" in waits[0]
    assert holders(archive) == [] and describe_holders(archive) == "another dumpdb process"
    with store_lock(archive, EXCLUSIVE, "gc", timeout=1):
        assert [h["what"] for h in holders(archive)] == ["gc"]


def test_a_killed_holder_leaves_no_stale_lock(tmp_path):
    archive = tmp_path / "a.dumpdb"
    archive.mkdir()
    code = ("import sys, os; from dumpdb.catalog.locks import store_lock, SHARED\n"
            "with store_lock(sys.argv[1], SHARED, 'ingest', timeout=5):\n"
            "    print('held', flush=True); os.kill(os.getpid(), 9)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(archive)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout.strip() == "held" and proc.returncode == -9
    assert len(list((archive / "locks" / "holders").glob("*.json"))) == 1  # its record is left...
    assert holders(archive) == []  # ...but not counted: the process is gone
    with store_lock(archive, EXCLUSIVE, "gc", timeout=1):  # and its flock went with it
        pass
    assert list((archive / "locks" / "holders").glob("*.json")) == []


def _age_tree(path: Path, seconds: float) -> None:
    """Make every file under ``path`` look ``seconds`` old (as a crashed ingest's would)."""
    then = time.time() - seconds
    for p in [path, *path.rglob("*")] if path.is_dir() else [path]:
        os.utime(p, (then, then))


def _first_pack(archive: Path) -> Path:
    a = dumpdb.open(archive)
    return archive / "tensors.zarr" / a.sql("SELECT min(array_path) AS p FROM arrays WHERE kind = 'pack'")["p"][0].as_py()


def _orphan_pack(archive: Path, age: float, name: str) -> Path:
    """An array no catalog row refers to, as an ingest killed before its commit leaves."""
    pack = _first_pack(archive)
    orphan = pack.parent / name
    shutil.copytree(pack, orphan)
    _age_tree(orphan, age)
    return orphan


def _temp_shard(archive: Path, age: float, name: str) -> Path:
    """A shard's temporary file, as a write interrupted before its rename leaves."""
    tmp = _first_pack(archive) / "c" / f"0.tmp-{name}"
    tmp.write_bytes(b"half a shard")
    _age_tree(tmp, age)
    return tmp


def test_gc_reclaims_crash_leftovers_older_than_the_grace_period(tmp_path):
    src = ms_case("c1_inputs_kernels_iter")
    archive = tmp_path / "a.dumpdb"
    dumpdb.ingest(src, archive=archive, run="c1")
    orphan, recent = _orphan_pack(archive, 7200, "old-orphan"), _orphan_pack(archive, 0, "new-orphan")
    tmp, recent_tmp = _temp_shard(archive, 7200, "old"), _temp_shard(archive, 0, "new")
    killed_import = archive / ".dumpdb-import-abc123"  # an import killed (-9) while extracting
    (killed_import / "catalog").mkdir(parents=True)
    (killed_import / "catalog" / "tensors.parquet").write_bytes(b"partial")
    _age_tree(killed_import, 7200)
    a = dumpdb.open(archive)
    report = a.gc(grace=3600)
    assert not orphan.exists() and not tmp.exists() and not killed_import.exists()
    assert (report.orphans_deleted, report.temp_files_deleted) == (1, 2) and report.reclaimed > 0
    assert recent.exists() and recent_tmp.exists() and report.kept_recent == 2  # younger than the grace
    report = a.gc(grace=0)
    assert not recent.exists() and not recent_tmp.exists()
    assert (report.orphans_deleted, report.temp_files_deleted) == (1, 1)
    with a:
        for row, array in a.tensors("SELECT tensor_id, source_file FROM tensors"):
            assert array.tobytes() == npy_payload(src / row["source_file"])[2]
    assert a.verify().ok


def test_rm_prune_import_ingest_wait_for_gc_and_say_so(tmp_path):
    archive = tmp_path / "a.dumpdb"
    dumpdb.ingest(ms_case("c1_inputs_kernels_iter"), archive=archive, run="c1")
    bundle = dumpdb.open(archive).export("c1", tmp_path / "c1.zip")
    waits: list[str] = []
    a = dumpdb.open(archive, lock_timeout=0.2, on_wait=waits.append)
    with store_lock(archive, EXCLUSIVE, "gc", timeout=1):
        with pytest.raises(ArchiveError, match=r"in use by gc \(pid"):
            a.import_bundle(bundle, rename={"c1": "c1-again"})
        with pytest.raises(ArchiveError, match=r"in use by gc \(pid"):
            a.verify(repair=True)
        with pytest.raises(ArchiveError, match=r"in use by gc \(pid"):
            a.remove_run("c1")
        with pytest.raises(ArchiveError, match=r"in use by gc \(pid"):
            a.prune("c1")
        with pytest.raises(ArchiveError, match=r"in use by gc \(pid"):
            dumpdb.ingest(ms_case("f_long_names"), archive=archive, run="f", lock_timeout=0.2)
    assert any("rm of run 'c1': waiting" in w for w in waits)
    assert a.sql("SELECT count(*) AS n FROM tensors")["n"][0].as_py() > 0  # nothing happened


@pytest.mark.parametrize("workers", [1, 2])
def test_gc_loop_during_ingest_with_workers_loses_nothing(tmp_path, workers):
    """The race above with the reading done by worker processes (issue 12)."""
    src, archive, report, _ = _ingest_under_gc_loop(tmp_path, workers=workers)
    assert report.ok and report.deduplicated > 0
    _new_run_reads_back_whole(src, archive)


def test_gc_between_ingest_worker_and_commit_loses_nothing(tmp_path):
    """ingest-worker deduplicates against a removed run's payloads (its snapshot); gc then
    deletes them before the commit: the commit refuses the part instead of committing rows
    without payloads, and the same worker command + commit then completes."""
    from dumpdb.ingestion.parts import commit_parts, ingest_worker
    src = ms_case("e1_nan_inf_overflow")
    archive = tmp_path / "a.dumpdb"
    dumpdb.ingest(src, archive=archive, run="old")
    dumpdb.open(archive).remove_run("old")
    written = ingest_worker(src, archive, "n0", "new")
    assert written.status == "written" and written.deduplicated > 0
    dumpdb.open(archive).gc(grace=0)  # the dead payloads go: the part refers to them
    refused = commit_parts(archive)
    assert not refused.committed and "ingest-worker again" in refused.refused[0][1]
    assert dumpdb.open(archive).sql("SELECT count(*) AS n FROM tensors")["n"][0].as_py() == 0
    assert ingest_worker(src, archive, "n0", "new").status == "written"
    done = commit_parts(archive)
    assert done.ok and done.committed[0][2] == len(npy_files(src))
    a = dumpdb.open(archive)
    with a:
        for row, array in a.tensors("SELECT tensor_id, source_file FROM tensors WHERE run = 'new'"):
            assert array.tobytes() == npy_payload(src / row["source_file"])[2]
    assert a.verify().ok
