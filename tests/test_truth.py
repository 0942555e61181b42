"""An archive that tells the truth (issue 19, points 1, 2 and 4), on real MindSpore dumps:

* a file rewritten after ingest is named and the re-ingest refuses; ``--update`` stores the
  new content bit for bit and the old payload goes at ``gc``; unchanged files are not read;
* ``runs``/``show``/``verify`` count pruned tensors as pruned; ``prune`` of what a run lacks
  is exit 2 naming what it has; a SIGKILLed ingest reads ``interrupted (pid N gone ...)``;
* ``ingest NEWPATH --run R --moved`` continues a run whose dump moved, and refuses (naming
  the files) when the new location is not the same dump.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ms_case, npy_files, npy_payload
from forkrun import crashkit_process
from typer.testing import CliRunner

import dumpdb
from dumpdb.cli import app
from dumpdb.layouts import LAYOUTS

REPO = Path(__file__).resolve().parents[1]
CRASHKIT = Path(__file__).with_name("crashkit.py")


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


def _rewrite_payload(path: Path) -> bytes:
    """Rewrite an .npy file in place with other content of the same size (every payload
    byte inverted, header kept), as a re-run of the dump into the same path would. Returns
    the new payload bytes."""
    raw = path.read_bytes()
    _, _, payload = npy_payload(path)
    assert payload, f"{path} has an empty payload"
    new = bytes(b ^ 0xFF for b in payload)
    path.write_bytes(raw[: len(raw) - len(payload)] + new)
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 5_000_000_000))  # a later write
    return new


def _row(archive: Path, run: str, source_file: str) -> dict:
    (row,) = dumpdb.open(archive).sql(
        "SELECT tensor_id, content_hash, previous_hash, updated_at, source_size, source_mtime_ns FROM tensors "
        "WHERE run = ? AND source_file = ?", [run, source_file]).to_pylist()
    return row


# -- 1. changed files --------------------------------------------------------------------------
def test_changed_file_is_named_and_refused_then_update_stores_it_and_gc_drops_the_old(tmp_path):
    dump = tmp_path / "c1"
    shutil.copytree(ms_case("c1_inputs_kernels_iter"), dump)
    archive = tmp_path / "a.dumpdb"
    assert dumpdb.ingest(dump, archive=archive, run="c1").ok
    files = npy_files(dump)
    payloads = [npy_payload(p)[2] for p in files]
    # a file whose payload no other tensor shares, so gc may drop the replaced payload
    changed = next(p for p, b in zip(files, payloads) if payloads.count(b) == 1 and len(b) > 64)
    touched = next(p for p in files if p != changed)
    rel = changed.relative_to(dump).as_posix()
    before = _row(archive, "c1", rel)
    old_payload = npy_payload(changed)[2]
    new_payload = _rewrite_payload(changed)
    os.utime(touched, ns=(touched.stat().st_atime_ns, touched.stat().st_mtime_ns + 7_000_000_000))  # same content

    r = invoke("ingest", dump, "-a", archive, "--run", "c1", "-q")
    assert r.exit_code == 1, r.output
    changed_lines = [line for line in r.output.splitlines() if line.startswith("changed: ")]
    assert changed_lines == [f"changed: {rel}: content differs (modified "
                             f"{_local(changed.stat().st_mtime_ns)})"]
    assert "1 file changed since run 'c1' ingested it" in r.output and "--update" in r.output
    assert touched.relative_to(dump).as_posix() not in r.output
    a = dumpdb.open(archive)
    assert _row(archive, "c1", rel) == before  # nothing replaced
    assert a.tensor(before["tensor_id"]).tobytes() == old_payload

    with pytest.raises(dumpdb.SourceChanged) as err:  # the same through the Python API
        dumpdb.ingest(dump, archive=archive, run="c1")
    assert err.value.files == [(rel, f"content differs (modified {_local(changed.stat().st_mtime_ns)})")]
    assert err.value.exit_code == 1

    report = dumpdb.ingest(dump, archive=archive, run="c1", update=True)
    assert report.ok and report.tensors_replaced == 1 and report.tensors_added == 0
    assert report.files_changed == err.value.files
    after = _row(archive, "c1", rel)
    assert after["tensor_id"] == before["tensor_id"] and after["previous_hash"] == before["content_hash"]
    assert after["content_hash"] != before["content_hash"] and after["updated_at"] is not None
    assert after["source_mtime_ns"] == changed.stat().st_mtime_ns
    assert a.tensor(after["tensor_id"], verify=True).tobytes() == new_payload  # bit-exact
    assert _row(archive, "c1", touched.relative_to(dump).as_posix())["source_mtime_ns"] == touched.stat().st_mtime_ns
    # the old payload is still in the store until gc (no other tensor uses it), then gone
    old_blob = "SELECT count(*) AS n FROM blobs WHERE content_hash = ?"
    assert a.sql(old_blob, [before["content_hash"]])["n"][0].as_py() == 1
    assert a.show("c1")["bytes_reclaimable"] > 0
    assert a.gc(grace=0).blobs_dropped == 1
    assert a.sql(old_blob, [before["content_hash"]])["n"][0].as_py() == 0
    assert a.verify().ok and a.show("c1")["bytes_reclaimable"] == 0
    for p in files:  # every tensor still reads back as the files are now
        (row,) = a.sql("SELECT tensor_id FROM tensors WHERE run = 'c1' AND source_file = ?",
                       [p.relative_to(dump).as_posix()]).to_pylist()
        assert a.tensor(row["tensor_id"]).tobytes() == npy_payload(p)[2]
    again = invoke("ingest", dump, "-a", archive, "--run", "c1", "-q")
    assert again.exit_code == 0 and "0 added" in again.output and "42 already there" in again.output


def _local(mtime_ns: int) -> str:
    from datetime import datetime

    return f"{datetime.fromtimestamp(mtime_ns / 1e9):%Y-%m-%d %H:%M:%S}"


def test_unchanged_files_are_not_read_and_a_touched_file_is_read_once(tmp_path, monkeypatch):
    dump = tmp_path / "e1"
    shutil.copytree(ms_case("e1_nan_inf_overflow"), dump)
    archive = tmp_path / "a.dumpdb"
    assert dumpdb.ingest(dump, archive=archive, run="e1").ok
    layout = next(lay for lay in LAYOUTS if lay.name == "mindspore-sync")
    read: list[str] = []
    real = type(layout).load

    def counting(self, entry):
        read.append(entry.source_file)
        return real(self, entry)

    monkeypatch.setattr(type(layout), "load", counting)
    report = dumpdb.ingest(dump, archive=archive, run="e1")
    assert read == [] and report.tensors_skipped == report.tensors_in_dump > 300 and report.bytes_read == 0
    touched = npy_files(dump)[11]
    os.utime(touched, ns=(touched.stat().st_atime_ns, touched.stat().st_mtime_ns + 3_000_000_000))
    report = dumpdb.ingest(dump, archive=archive, run="e1")
    assert read == [touched.relative_to(dump).as_posix()]  # confirmed by hash: same content
    assert report.ok and report.files_changed == [] and report.tensors_added == report.tensors_replaced == 0
    read.clear()
    assert dumpdb.ingest(dump, archive=archive, run="e1").ok and read == []  # its new mtime was recorded


# -- 2. run state ------------------------------------------------------------------------------
def test_runs_show_verify_name_the_pruned_tensors(tmp_path):
    archive = tmp_path / "a.dumpdb"
    case = ms_case("e1_nan_inf_overflow")
    assert dumpdb.ingest(case, archive=archive, run="e1").ok
    total = len(npy_files(case))
    in_iteration_1 = len([p for p in npy_files(case) if p.parent.name == "1"])
    assert 0 < in_iteration_1 < total
    r = invoke("prune", "e1", "-a", archive, "--keep-stats", "--iterations", "1")
    assert r.exit_code == 0 and f"pruned the payloads of {in_iteration_1} tensors" in r.output
    a = dumpdb.open(archive)
    (row,) = a.runs().to_pylist()
    assert (row["tensors"], row["stored"], row["pruned"], row["statistics_only"], row["failed"]) == (
        total, total - in_iteration_1, in_iteration_1, 0, 0)
    assert row["pruned_at"] is not None and row["state"] == "complete"
    info = a.show("e1")
    assert info["stored"] + info["statistics_only"] + info["pruned"] == info["tensors"] == total
    assert info["payloads_stored"] + info["deduplicated"] == info["stored"]
    r = invoke("runs", "-a", archive)
    assert f"{in_iteration_1} ({row['pruned_at']:%Y-%m-%d %H:%M})" in r.stdout
    r = invoke("show", "e1", "-a", archive)
    assert (f"{total} = {total - in_iteration_1} stored + 0 statistics-only + {in_iteration_1} pruned "
            f"(pruned {row['pruned_at']:%Y-%m-%d %H:%M})") in r.stdout
    report = a.verify("e1")
    assert report.ok and report.tensors_pruned == in_iteration_1 and report.tensors_checked == total - in_iteration_1
    r = invoke("verify", "e1", "-a", archive)
    assert r.exit_code == 0 and f"{total - in_iteration_1} tensor references" in r.output
    assert f"{in_iteration_1} tensors pruned (payloads dropped, last on {row['pruned_at']:%Y-%m-%d %H:%M}" in r.output
    a.gc(grace=0)
    after = a.show("e1")
    assert after["pruned"] == in_iteration_1 and after["bytes_stored"] < info["bytes_stored"]
    assert after["bytes_reclaimable"] == 0 and "pruned" in invoke("show", "e1", "-a", archive).stdout
    r = invoke("verify", "e1", "-a", archive)
    assert r.exit_code == 0 and f"{in_iteration_1} tensors pruned" in r.output


def test_prune_of_iterations_or_ranks_the_run_lacks_is_exit_2_naming_its_range(tmp_path):
    archive = tmp_path / "a.dumpdb"
    assert dumpdb.ingest(ms_case("c1_inputs_kernels_iter"), archive=archive, run="c1").ok
    r = invoke("prune", "c1", "-a", archive, "--keep-stats", "--iterations", "5")
    assert r.exit_code == 2
    assert "run 'c1' has no iteration 5 (its iterations: 0, 2-3); nothing pruned" in r.output
    r = invoke("prune", "c1", "-a", archive, "--keep-stats", "--iterations", "1|7-9")
    assert r.exit_code == 2 and "has no iteration 1, 7-9 (its iterations: 0, 2-3); nothing pruned" in r.output
    r = invoke("prune", "c1", "-a", archive, "--keep-stats", "--ranks", "1-3")
    assert r.exit_code == 2 and "run 'c1' has no rank 1-3 (its ranks: 0)" in r.output
    assert dumpdb.open(archive).show("c1")["pruned"] == 0  # nothing pruned by a refused command
    r = invoke("prune", "c1", "-a", archive, "--keep-stats", "--iterations", "1-2", "--ranks", "0")
    assert r.exit_code == 0 and "pruned the payloads of 14 tensors" in r.output  # 1-2 holds iteration 2
    assert "warning" not in r.output
    # a real process: pytest replaces the warning printer between tests
    p = subprocess.run([sys.executable, "-m", "dumpdb", "prune", "c1", "-a", str(archive), "--keep-stats",
                        "--iterations", "0|7-9"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert p.returncode == 0 and "pruned the payloads of 14 tensors" in p.stdout
    assert p.stderr.strip() == ("warning: run 'c1' has no iteration 7-9 (its iterations: 0, 2-3); "
                                "pruning the iterations it has")


def test_a_killed_ingest_reads_interrupted_with_the_command_that_completes_it(tmp_path):
    """A real `dumpdb ingest` SIGKILLed (by tests/crashkit.py) right after one of its catalog
    commits in the middle of the ingest: the kill point is an event the process writes."""
    archive = tmp_path / "a.dumpdb"
    case = ms_case("d2_compare_fp16_bf16_iter0")
    args = ["ingest", str(case), "-a", str(archive), "--run", "d2", "-q"]
    env = {**os.environ, "CRASHKIT_WATCH": str(archive),
           # 128 KiB packs (as test_crash_safety): d2 still commits ~14 times, at ~0.6x the CPU of 32 KiB
           "CRASHKIT_SET": "dumpdb.storage.store.PACK_BYTES=131072;dumpdb.ingestion.pipeline.COMMIT_SECONDS=0",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    probe = tmp_path / "probe.dumpdb"
    counts = tmp_path / "events.txt"
    counted = crashkit_process([str(probe) if a == str(archive) else a for a in args],  # tests/forkrun.py
                               {**env, "CRASHKIT_WATCH": str(probe), "CRASHKIT_COUNT_FILE": str(counts)})
    assert counted.returncode == 0, counted.stderr
    kinds = counts.read_text().split()[1:]
    commits = [i + 1 for i, k in enumerate(kinds) if k == "commit-after"]
    assert len(commits) > 6
    proc = subprocess.Popen([sys.executable, str(CRASHKIT), "-m", "dumpdb", *args],
                            env={**env, "CRASHKIT_KILL_AT": str(commits[len(commits) // 2])},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert proc.wait(timeout=240) == -signal.SIGKILL
    a = dumpdb.open(archive)
    (row,) = a.runs().to_pylist()
    assert row["status"] == "ingesting"  # what the killed process left in the catalog
    assert row["state"].startswith(f"interrupted (pid {proc.pid} gone since ")
    assert row["complete_command"] == f"dumpdb ingest {case} --run d2 -a {archive}"
    r = invoke("runs", "-a", archive)
    assert "interrupted" in r.stdout
    assert f"complete it with: dumpdb ingest {case} --run d2 -a {archive}" in r.output
    r = invoke("show", "d2", "-a", archive)
    assert f"interrupted (pid {proc.pid} gone since" in r.stdout and "complete it with" in r.stdout
    r = invoke(*row["complete_command"].split()[1:], "-q")  # the command it names, as given
    assert r.exit_code == 0, r.output
    (row,) = a.runs().to_pylist()
    assert row["state"] == "complete" and row["complete_command"] is None
    assert row["tensors"] == len(npy_files(case)) and a.verify().ok


# -- 4. moved dumps -----------------------------------------------------------------------------
def _partial_ingest(tmp_path: Path) -> tuple[Path, Path, list[Path]]:
    """c1 ingested from OLD with iteration 3 missing; returns (archive, OLD, the held files)."""
    old = tmp_path / "old" / "c1"
    shutil.copytree(ms_case("c1_inputs_kernels_iter"), old)
    held = npy_files(old)
    iteration_3 = old / "rank_0" / "LeNet5" / "0" / "3"
    aside = tmp_path / "aside"
    shutil.move(iteration_3, aside)
    archive = tmp_path / "a.dumpdb"
    assert dumpdb.ingest(old, archive=archive, run="c1").tensors_added == 28
    shutil.move(aside, iteration_3)
    return archive, old, [p for p in held if p.parent.name != "3"]


def test_moved_dump_continues_the_run_from_its_new_location(tmp_path):
    archive, old, held = _partial_ingest(tmp_path)
    new = tmp_path / "new" / "c1"
    new.parent.mkdir()
    shutil.copytree(old, new, copy_function=shutil.copyfile)  # a copy without -p: new mtimes
    shutil.rmtree(old)
    r = invoke("ingest", new, "-a", archive, "--run", "c1", "-q")
    assert r.exit_code == 2 and f"run 'c1' already holds the dump at {old}" in r.output and "--moved" in r.output
    r = invoke("ingest", new, "-a", archive, "--run", "c1", "--moved", "-q")
    assert r.exit_code == 0, r.output
    assert "14 added" in r.output and "28 already there" in r.output
    a = dumpdb.open(archive)
    info = a.show("c1")
    assert info["source_path"] == str(new) and info["status"] == "complete" and info["tensors"] == 42
    for p in npy_files(new):
        (row,) = a.sql("SELECT tensor_id, source_mtime_ns FROM tensors WHERE run = 'c1' AND source_file = ?",
                       [p.relative_to(new).as_posix()]).to_pylist()
        assert a.tensor(row["tensor_id"]).tobytes() == npy_payload(p)[2]
        assert row["source_mtime_ns"] == p.stat().st_mtime_ns  # the new identity is recorded
    again = invoke("ingest", new, "-a", archive, "--run", "c1", "-q")  # now an ordinary re-ingest
    assert again.exit_code == 0 and "42 already there" in again.output


def test_moved_onto_another_dump_refuses_naming_the_files(tmp_path):
    archive, old, held = _partial_ingest(tmp_path)
    other = tmp_path / "other" / "c1"
    shutil.copytree(old, other)
    gone, grown, same_size = held[0], held[5], held[9]
    (other / gone.relative_to(old)).unlink()
    with open(other / grown.relative_to(old), "ab") as f:
        f.write(b"\0" * 64)
    r = invoke("ingest", other, "-a", archive, "--run", "c1", "--moved", "-q")
    assert r.exit_code == 1, r.output
    lines = sorted(line for line in r.output.splitlines() if line.startswith("changed: "))
    size = grown.stat().st_size
    assert lines == sorted([f"changed: {gone.relative_to(old).as_posix()}: missing at {other}",
                            f"changed: {grown.relative_to(old).as_posix()}: size {size} -> {size + 64} bytes"])
    assert f"not the dump run 'c1' was ingested from ({old}): 1 file it holds missing, 1 different" in r.output
    a = dumpdb.open(archive)
    assert a.show("c1")["source_path"] == str(old) and a.show("c1")["tensors"] == 28  # nothing changed

    # same names and sizes, one payload rewritten: --moved accepts by size; --verify-hash reads and refuses
    third = tmp_path / "third" / "c1"
    shutil.copytree(old, third)
    _rewrite_payload(third / same_size.relative_to(old))
    r = invoke("ingest", third, "-a", archive, "--run", "c1", "--moved", "--verify-hash", "-q")
    assert r.exit_code == 1
    assert f"changed: {same_size.relative_to(old).as_posix()}: content differs" in r.output
    assert "1 file different at the new location" in r.output
    assert a.show("c1")["source_path"] == str(old)
    r = invoke("ingest", third, "-a", archive, "--run", "c1", "--verify-hash", "-q")
    assert r.exit_code == 2 and "--verify-hash checks a moved dump" in r.output
    r = invoke("ingest", third, "-a", archive, "--run", "nope", "--moved", "-q")
    assert r.exit_code == 2 and "--moved: no run 'nope'" in r.output

    # at the run's own path a same-size rewrite whose mtime was set back escapes size + mtime
    # (the file is not read); --moved --verify-hash reads every file the run holds and finds it
    target = old / same_size.relative_to(old)
    st = target.stat()
    _rewrite_payload(target)
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    r = invoke("ingest", old, "-a", archive, "--run", "c1", "-q")
    assert r.exit_code == 0 and "14 added, 28 already there" in r.output
    r = invoke("ingest", old, "-a", archive, "--run", "c1", "--moved", "--verify-hash", "-q")
    assert r.exit_code == 1 and "1 file changed since run 'c1' ingested it" in r.output
    assert f"changed: {same_size.relative_to(old).as_posix()}: content differs" in r.output
