"""Crash safety asserted, not assumed: every archive-writing command is SIGKILLed at I/O
events chosen by a seeded random schedule (tests/crashkit.py counts files opened in the
archive, renames, removals, fsyncs and catalog commits), then, BEFORE the same command
runs again, the archive is opened and every committed row must read back bit for bit
against the source dump and ``verify`` must pass; after the re-run the result is complete.

``DUMPDB_CRASH_SEED`` changes the schedule (the failing seed and event are in the message);
``DUMPDB_CRASH_POINTS`` multiplies the number of kill points (default: 5 ingest, 2 ingest with
workers, 3 import, 4 prune, 3 gc, 3 compare: 20 in all). The points are stratified by event
kind (``crashkit.kill_points``): every command is killed at a commit, an fsync, a rename, a
write... before any kind gets a second point.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ms_case, npy_files, npy_payload
from crashkit import kill_points
from forkrun import crashkit_process

import dumpdb
import dumpdb.archive  # is_archive: a submodule, not imported by "import dumpdb" alone

REPO = Path(__file__).resolve().parents[1]
SEED = int(os.environ.get("DUMPDB_CRASH_SEED", "20"))
# Small packs and a commit after every accepted batch: many shards, renames and commits
# (hundreds of kill points: d2's ingest shows about 400 events of all ten kinds, 14 commits)
# in a dump of a few MB. 128 KiB, not 32 KiB: the same ten kinds of event, several packs per
# dtype, at 0.6x the CPU of a run and a third of its wall time (fewer fsyncs).
SETTINGS = "dumpdb.storage.store.PACK_BYTES=131072;dumpdb.ingestion.pipeline.COMMIT_SECONDS=0"
# The commit after every batch only makes more moments to kill an ingest at; a run that is
# never killed (a re-run, an archive a test starts from) commits at the default cadence: an
# e1+c1 ingest at these pack sizes is ~1.1 s of CPU instead of ~9.6 s (the same rows and payloads).
_EVERY_BATCH = "dumpdb.ingestion.pipeline.COMMIT_SECONDS="
SOURCES = {"d1": ms_case("d1_compare_fp32_iter0"), "d2": ms_case("d2_compare_fp16_bf16_iter0"),
           "c1": ms_case("c1_inputs_kernels_iter"), "e1": ms_case("e1_nan_inf_overflow")}


def _env(archive: Path, settings: str = SETTINGS, **extra) -> dict:
    env = {**os.environ, "CRASHKIT_WATCH": str(archive), "CRASHKIT_SET": settings, **extra}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return env


def crashkit_run(archive: Path, args: list[str], settings: str = SETTINGS, **extra) -> subprocess.CompletedProcess:
    """``dumpdb ARGS`` under tests/crashkit.py, watching ``archive``, with the module
    constants ``settings`` (``CRASHKIT_SET``) and more ``CRASHKIT_*`` variables in ``extra``:
    a process of its own, forked from a parent that imported dumpdb (tests/forkrun.py)."""
    return crashkit_process(args, _env(archive, settings, **extra))


@contextlib.contextmanager
def _settings(settings: str) -> Iterator[None]:
    """The module constants ``settings`` (``CRASHKIT_SET``'s syntax) set in this process meanwhile."""
    saved = []
    try:
        for item in filter(None, (x.strip() for x in settings.split(";"))):
            target, value = item.split("=", 1)
            module_name, attr = target.rsplit(".", 1)
            module = importlib.import_module(module_name)
            saved.append((module, attr, getattr(module, attr)))
            setattr(module, attr, type(getattr(module, attr))(value))
        yield
    finally:
        for module, attr, old in reversed(saved):
            setattr(module, attr, old)


def run_in_process(args: list[str], settings: str = SETTINGS) -> subprocess.CompletedProcess:
    """``dumpdb ARGS`` run to its end in this process (typer's runner) with the module
    constants of the kill runs (``settings``) but no commit after every batch (pack sizes
    kept): the re-runs and the archives the tests start from. What a kill leaves is made by a
    killed process (``crashkit_run``); the command that completes it needs none of its own (it
    saves the ~1.4 s of CPU a process spends starting, each time)."""
    from typer.testing import CliRunner

    from dumpdb.cli import app

    settings = ";".join(x for x in settings.split(";") if not x.strip().startswith(_EVERY_BATCH))
    with _settings(settings):
        result = CliRunner().invoke(app, args, catch_exceptions=False)
    return subprocess.CompletedProcess(["dumpdb", *args], result.exit_code, result.stdout, result.stderr)


def _schedule(archive: Path, args: list[str], points: int, salt: str, ok_codes=(0,), head: float = 1.0) -> list[int]:
    """Run the command once on a copy, counting its events; pick ``points`` of them (within
    the first ``head`` share of the events: see ``crashkit.kill_points``)."""
    probe = archive.with_name(archive.name + ".probe")
    shutil.copytree(archive, probe) if archive.exists() else None
    count_file = archive.with_name("events.txt")
    probe_args = [str(probe) if a == str(archive) else a for a in args]
    proc = crashkit_run(probe, probe_args, CRASHKIT_COUNT_FILE=str(count_file))
    assert proc.returncode in ok_codes, proc.stderr
    shutil.rmtree(probe)
    return kill_points(count_file, points, salt, head)


def _killed(archive: Path, args: list[str], at: int, **extra) -> subprocess.CompletedProcess:
    return crashkit_run(archive, args, CRASHKIT_KILL_AT=str(at), **extra)


def assert_committed_rows_exact(archive: Path, where: str) -> int:
    """Open the archive as a user would after the crash: every committed payload reads back
    bit-exact against its source file, verify passes, no tensor is there twice."""
    a = dumpdb.open(archive)
    rows = a.sql("SELECT tensor_id, run, source_file, tensor_key, content_hash, pruned_at FROM tensors").to_pylist()
    keys = [(r["run"], r["tensor_key"]) for r in rows]
    assert len(keys) == len(set(keys)), f"{where}: a tensor committed twice"
    with a:
        for r in rows:
            if r["content_hash"] is None or r["pruned_at"] is not None:
                continue
            try:
                got = a.tensor(r["tensor_id"])
            except dumpdb.DumpdbError as exc:
                raise AssertionError(f"{where}: committed row {r['run']}/{r['source_file']} unreadable: {exc}") from exc
            expected = npy_payload(SOURCES[r["run"]] / r["source_file"])[2]
            assert got.tobytes() == expected, f"{where}: {r['run']}/{r['source_file']} differs"
    report = a.verify()
    assert report.ok, f"{where}: verify failed: {report.damaged_tensors.to_pylist()[:3]}"
    return len(rows)


def _ingest(archive: Path, run: str) -> None:
    proc = run_in_process(["ingest", str(SOURCES[run]), "--archive", str(archive), "--run", run, "-q"])
    assert proc.returncode == 0, proc.stderr


def test_crashkit_counts_and_kills(tmp_path):
    """The harness itself: a count pass sees commits, fsyncs and renames; a kill point kills."""
    archive = tmp_path / "a.dumpdb"
    count_file = tmp_path / "events.txt"
    args = ["ingest", str(SOURCES["d2"]), "--archive", str(archive), "--run", "d2", "-q"]
    proc = crashkit_run(archive, args, CRASHKIT_COUNT_FILE=str(count_file))
    assert proc.returncode == 0, proc.stderr
    kinds = count_file.read_text().split()[1:]
    assert {"commit-before", "commit-after", "fsync-before", "os.rename", "open-write"} <= set(kinds)
    assert kinds.count("commit-after") > 5  # COMMIT_SECONDS=0 took effect: many commits to kill between
    shutil.rmtree(archive)
    assert _killed(archive, args, 3).returncode == -signal.SIGKILL


@pytest.mark.timeout(900)  # 30+ kills and re-runs: about 4 minutes on a busy 2-core machine
def test_ingest_killed_anywhere_keeps_committed_rows_exact_and_reruns_complete(tmp_path):
    archive = tmp_path / "a.dumpdb"
    args = ["ingest", str(SOURCES["d2"]), "--archive", str(archive), "--run", "d2", "-q"]
    n_files = len(npy_files(SOURCES["d2"]))
    # a commit after every accepted batch: how many there are follows the timing of the pack
    # writes (a few events more or less from run to run), so no point in the last 10 %; the
    # rare kinds (rmtree, truncate, remove) come early
    for at in _schedule(archive, args, 5, "ingest", head=0.9):
        if archive.exists():
            shutil.rmtree(archive)
        proc = _killed(archive, args, at)
        where = f"ingest killed at event {at} (seed {SEED})"
        assert proc.returncode == -signal.SIGKILL, f"{where}: {proc.returncode} {proc.stderr[-500:]}"
        if archive.exists() and dumpdb.archive.is_archive(archive):
            assert assert_committed_rows_exact(archive, where) <= n_files
        rerun = run_in_process(args)
        assert rerun.returncode == 0, f"{where}: re-run failed: {rerun.stderr[-500:]}"
        assert assert_committed_rows_exact(archive, where + ", after the re-run") == n_files
        assert dumpdb.open(archive).show("d2")["status"] == "complete"


def test_ingest_with_two_workers_killed_at_two_points_reruns_to_a_clean_ingest(tmp_path):
    """Issue 12: the ingesting process killed (SIGKILL) while 2 worker processes read for it;
    the same command again completes: counts equal a clean ingest, no tensor twice, verify
    passes, and gc finds the packs the dead ingest wrote but never committed."""
    clean = tmp_path / "clean.dumpdb"
    _ingest(clean, "d2")
    expected = assert_committed_rows_exact(clean, "clean ingest")
    archive = tmp_path / "a.dumpdb"
    args = ["ingest", str(SOURCES["d2"]), "--archive", str(archive), "--run", "d2", "-q", "--workers", "2"]
    count = tmp_path / "events.txt"
    for at in _schedule(archive, args, 2, "ingest-workers"):
        # With commits after every batch (COMMIT_SECONDS=0) how many there are follows the
        # timing of the pack writes, so a run may see fewer events than the probe did: one
        # that ends before its kill point is run again with the point inside its own count.
        for _attempt in range(3):
            if archive.exists():
                shutil.rmtree(archive)
            count.unlink(missing_ok=True)
            proc = _killed(archive, args, at, CRASHKIT_COUNT_FILE=str(count))
            seen = int(count.read_text().split()[0]) if proc.returncode == 0 and count.exists() else at
            if seen >= at:
                break
            at = max(1, seen * 3 // 4)
        where = f"ingest --workers 2 killed at event {at} (seed {SEED})"
        assert proc.returncode == -signal.SIGKILL, f"{where}: {proc.returncode} {proc.stderr[-500:]}"
        rerun = run_in_process(args)
        assert rerun.returncode == 0, f"{where}: re-run failed: {rerun.stderr[-500:]}"
        assert assert_committed_rows_exact(archive, where + ", after the re-run") == expected
        a = dumpdb.open(archive)
        assert a.show("d2")["status"] == "complete"
        assert a.sql("SELECT count(DISTINCT content_hash) AS n FROM tensors")["n"][0].as_py() == \
            dumpdb.open(clean).sql("SELECT count(DISTINCT content_hash) AS n FROM tensors")["n"][0].as_py()
        gc = run_in_process(["gc", "--archive", str(archive), "--grace", "0"])
        assert gc.returncode == 0, f"{where}: gc failed: {gc.stderr[-500:]}"
        assert assert_committed_rows_exact(archive, where + ", after gc") == expected


def test_import_killed_anywhere_keeps_committed_rows_exact_and_reruns_complete(tmp_path):
    src_archive, bundle = tmp_path / "src.dumpdb", tmp_path / "d2.bundle"
    _ingest(src_archive, "d2")
    dumpdb.open(src_archive).export(["d2"], bundle)
    base = tmp_path / "base.dumpdb"
    _ingest(base, "c1")
    archive = tmp_path / "a.dumpdb"
    shutil.copytree(base, archive)
    args = ["import", str(bundle), "--archive", str(archive)]
    n = len(npy_files(SOURCES["d2"])) + len(npy_files(SOURCES["c1"]))
    for at in _schedule(archive, args, 3, "import"):
        shutil.rmtree(archive)
        shutil.copytree(base, archive)
        where = f"import killed at event {at} (seed {SEED})"
        proc = _killed(archive, args, at)
        assert proc.returncode == -signal.SIGKILL, f"{where}: {proc.returncode} {proc.stderr[-500:]}"
        assert assert_committed_rows_exact(archive, where) <= n
        rerun = run_in_process(args)
        assert rerun.returncode == 0, f"{where}: re-run failed: {rerun.stderr[-500:]}"
        assert assert_committed_rows_exact(archive, where + ", after the re-run") == n


@pytest.fixture(scope="module")
def _e1_c1_once(tmp_path_factory) -> Path:
    """e1 (several iterations, tiny packs) and c1, ingested once for the module (never
    written: :func:`_e1_c1_base` hands out copies)."""
    base = tmp_path_factory.mktemp("e1c1") / "base.dumpdb"
    _ingest(base, "e1")
    _ingest(base, "c1")
    return base


def _e1_c1_base(tmp_path, e1_c1: Path) -> Path:
    """A copy of the module's e1 and c1 archive in ``tmp_path``, for one test to change."""
    base = tmp_path / "base.dumpdb"
    shutil.copytree(e1_c1, base)
    return base


def test_prune_killed_anywhere_keeps_rows_and_statistics(tmp_path, _e1_c1_once):
    base = _e1_c1_base(tmp_path, _e1_c1_once)
    stats_q = "SELECT tensor_id, min, max, mean, l2norm, nan_count, pos_inf_count, neg_inf_count FROM tensors ORDER BY 1"
    stats_before = _reprs(dumpdb.open(base).sql(stats_q).to_pylist())
    archive = tmp_path / "a.dumpdb"
    shutil.copytree(base, archive)
    args = ["prune", "e1", "--keep-stats", "--iterations", "0-5", "--archive", str(archive)]
    expected_pruned = dumpdb.open(base).sql(
        "SELECT count(*) AS n FROM tensors WHERE run = 'e1' AND iteration BETWEEN 0 AND 5")["n"][0].as_py()
    assert expected_pruned > 0
    for at in _schedule(archive, args, 4, "prune"):
        shutil.rmtree(archive)
        shutil.copytree(base, archive)
        where = f"prune killed at event {at} (seed {SEED})"
        proc = _killed(archive, args, at)
        assert proc.returncode == -signal.SIGKILL, f"{where}: {proc.returncode} {proc.stderr[-500:]}"
        assert_committed_rows_exact(archive, where)
        assert _reprs(dumpdb.open(archive).sql(stats_q).to_pylist()) == stats_before, f"{where}: statistics changed"
        assert run_in_process(args).returncode == 0
        assert_committed_rows_exact(archive, where + ", after the re-run")
        pruned = dumpdb.open(archive).sql("SELECT run, iteration FROM tensors WHERE pruned_at IS NOT NULL").to_pylist()
        assert len(pruned) == expected_pruned and all(r["run"] == "e1" and r["iteration"] <= 5 for r in pruned)


def test_gc_killed_anywhere_loses_no_live_payload(tmp_path, _e1_c1_once):
    base = _e1_c1_base(tmp_path, _e1_c1_once)
    dumpdb.open(base).prune("e1", "0-5")
    archive = tmp_path / "a.dumpdb"
    shutil.copytree(base, archive)
    args = ["gc", "--archive", str(archive)]
    live = assert_committed_rows_exact(base, "before gc")
    size_before = sum(p.stat().st_size for p in (base / "tensors.zarr").rglob("*") if p.is_file())
    for at in _schedule(archive, args, 3, "gc"):
        shutil.rmtree(archive)
        shutil.copytree(base, archive)
        where = f"gc killed at event {at} (seed {SEED})"
        proc = _killed(archive, args, at)
        assert proc.returncode == -signal.SIGKILL, f"{where}: {proc.returncode} {proc.stderr[-500:]}"
        assert assert_committed_rows_exact(archive, where) == live
        # --grace 0: nothing else uses this archive, so the killed gc's uncommitted pack is
        # reclaimable now (by default gc keeps young uncommitted files: another writer's)
        assert run_in_process(args + ["--grace", "0"]).returncode == 0
        assert assert_committed_rows_exact(archive, where + ", after the re-run") == live
        size_after = sum(p.stat().st_size for p in (archive / "tensors.zarr").rglob("*") if p.is_file())
        assert size_after < size_before, f"{where}: gc reclaimed nothing"


def _compare_rows(archive: Path) -> list[tuple]:
    rows = dumpdb.open(archive).sql(
        "SELECT pair_index, target_tensor_id, bench_tensor_id, cosine, max_abs_err FROM compare_results "
        "ORDER BY compare_id, pair_index").to_pylist()
    return _reprs(rows)


def _reprs(rows: list[dict]) -> list[tuple]:
    return [tuple(repr(v) for v in r.values()) for r in rows]  # repr: NaN equals NaN


def test_compare_killed_anywhere_stores_all_or_nothing(tmp_path):
    base = tmp_path / "base.dumpdb"
    _ingest(base, "d1")
    _ingest(base, "d2")
    reference = tmp_path / "ref.dumpdb"
    shutil.copytree(base, reference)
    args = ["compare", "d2", "d1", "--archive", str(reference), "--show", "0"]
    assert run_in_process(args).returncode in (0, 1)
    expected = _compare_rows(reference)
    assert len(expected) > 50
    archive = tmp_path / "a.dumpdb"
    shutil.copytree(base, archive)
    args = ["compare", "d2", "d1", "--archive", str(archive), "--show", "0"]
    for at in _schedule(archive, args, 3, "compare", ok_codes=(0, 1)):
        shutil.rmtree(archive)
        shutil.copytree(base, archive)
        where = f"compare killed at event {at} (seed {SEED})"
        proc = _killed(archive, args, at)
        assert proc.returncode == -signal.SIGKILL, f"{where}: {proc.returncode} {proc.stderr[-500:]}"
        assert_committed_rows_exact(archive, where)
        a = dumpdb.open(archive)
        for c in a.sql("SELECT compare_id, pairs FROM compares").to_pylist():  # a stored compare is whole
            n = a.sql("SELECT count(*) AS n FROM compare_results WHERE compare_id = ?", [c["compare_id"]])["n"][0]
            assert n.as_py() == c["pairs"], f"{where}: compare {c['compare_id']} stored in part"
        assert run_in_process(args).returncode in (0, 1)
        assert _compare_rows(archive)[-len(expected):] == expected, where
