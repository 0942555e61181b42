"""Fault tests: what the user sees for each kind of bad input or failure, and that nothing
already ingested is lost (the archive still verifies). Other fault tests live beside the
feature they guard: SIGKILL/Ctrl-C resume, truncated / zero-byte / lying-header / non-UTF-8
files in test_ingest.py; CANN header length beyond the file in test_layout_ascend.py; a
flipped bit in a shard in test_verify.py; racing processes in test_archive.py."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import ms_case, npy_files, npy_payload

import dumpdb
import dumpdb.storage.store


def _exact_and_complete(archive, run, src):
    a = dumpdb.open(archive)
    assert a.verify().ok
    with a:
        rows = list(a.tensors("SELECT tensor_id, source_file FROM tensors WHERE run = ?", [run]))
    assert len(rows) == len(npy_files(src)) == len({r["source_file"] for r, _ in rows})
    for row, array in rows:
        assert array.tobytes() == npy_payload(src / row["source_file"])[2]


def test_disk_full_during_ingest_keeps_what_was_committed(tmp_path, monkeypatch):
    monkeypatch.setattr("dumpdb.storage.store.PACK_BYTES", 32 << 10)
    monkeypatch.setattr("dumpdb.ingestion.pipeline.COMMIT_SECONDS", 0)
    real = dumpdb.storage.store.write_shard
    calls = []

    def full_after_three(path, frames):
        calls.append(path)
        if len(calls) > 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return real(path, frames)

    monkeypatch.setattr("dumpdb.storage.store.write_shard", full_after_three)
    src = ms_case("d2_compare_fp16_bf16_iter0")
    archive = tmp_path / "a.dumpdb"
    with pytest.raises(dumpdb.ArchiveError, match="No space left on device.*committed so far are kept"):
        dumpdb.ingest(src, archive=archive, run="d2", workers=1)
    a = dumpdb.open(archive)
    kept = a.sql("SELECT count(*) AS n FROM tensors")["n"][0].as_py()
    assert 0 < kept < 95 and a.verify().ok
    assert a.show("d2")["status"] == "interrupted"
    monkeypatch.setattr("dumpdb.storage.store.write_shard", real)  # space freed
    again = dumpdb.ingest(src, archive=archive, run="d2")
    assert again.ok and again.tensors_skipped == kept
    _exact_and_complete(archive, "d2", src)


def test_symlink_loops_are_reported_not_followed(case_copy, tmp_path):
    src = case_copy("c1_inputs_kernels_iter")
    it = src / "rank_0" / "LeNet5" / "0" / "0"
    loop = it / "Conv2D.Default_loop-op0.0.0.17.output.0.DefaultFormat.Float32.npy"
    os.symlink(loop.name, loop)  # points at itself
    os.symlink("..", it / "back")  # a directory loop: not an iteration, never walked
    report = dumpdb.ingest(src, archive=tmp_path / "a.dumpdb", run="c1")
    errors = dict(report.errors)
    key = str(loop.relative_to(src))
    assert "symbolic links" in errors[key] and errors[key].startswith(key)
    assert report.tensors_added == 42 and len(errors) == 1


def test_255_byte_file_name(tmp_path):
    it = tmp_path / "dump" / "rank_0" / "Net" / "0" / "0"
    it.mkdir(parents=True)
    prefix, suffix = "MatMul.Default_", ".0.0.17.output.0.DefaultFormat.Float32.npy"
    name = prefix + "x" * (255 - len(prefix) - len(suffix) - len("-op0")) + "-op0" + suffix
    assert len(name.encode()) == 255
    np.save(it / name, np.arange(4, dtype=np.float32))
    report = dumpdb.ingest(tmp_path / "dump", archive=tmp_path / "a.dumpdb", run="long")
    assert report.ok
    row = dumpdb.open(tmp_path / "a.dumpdb").sql("SELECT op_name, source_file FROM tensors").to_pylist()[0]
    assert row["source_file"].endswith(name) and len(row["op_name"]) > 190


def test_queries_from_another_process_work_while_an_ingest_runs(tmp_path):
    archive = tmp_path / "a.dumpdb"
    src = ms_case("d2_compare_fp16_bf16_iter0")
    # Lock-step over a pipe: every 8 tensors the ingest says so and waits for the test's query
    # to finish, so the test sees the committed state at fixed points (no sleeps, no race).
    code = textwrap.dedent(f"""
        import sys, dumpdb, dumpdb.ingestion.pipeline, dumpdb.storage.store
        from dumpdb.progress import Reporter
        dumpdb.storage.store.PACK_BYTES = 32 << 10
        dumpdb.ingestion.pipeline.COMMIT_SECONDS = 0
        class Paced(Reporter):
            n = 0
            def advance(self, n, b):
                self.n += n
                if self.n % 8 == 0:
                    print(self.n, flush=True)
                    sys.stdin.readline()
        dumpdb.ingest({str(src)!r}, archive={str(archive)!r}, run="d2", reporter=Paced(), workers=1)
        print("done", flush=True)
    """)
    dumpdb.ingest(ms_case("c1_inputs_kernels_iter"), archive=archive, run="c1")  # the archive exists
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    counts, seen = [], []
    for line in proc.stdout:
        if line.strip() == "done":
            break
        seen.append(int(line))
        a = dumpdb.open(archive, lock_timeout=30)
        counts.append(a.sql("SELECT count(*) AS n FROM tensors WHERE run = 'd2'")["n"][0].as_py())
        assert a.sql("SELECT status FROM runs WHERE run = 'd2'")["status"][0].as_py() == "ingesting"
        proc.stdin.write("go\n")
        proc.stdin.flush()
    proc.stdin.close()
    assert proc.wait() == 0
    assert seen == list(range(8, 95, 8))
    # saw the ingest progress, commit by commit; never more rows than tensors read
    assert counts == sorted(counts) and len(set(counts)) > 2 and all(c <= s for c, s in zip(counts, seen))
    _exact_and_complete(archive, "d2", src)


# --- as an unprivileged user: root reads and writes whatever the permissions say ------------

def _drop():
    os.setgid(65534)
    os.setuid(65534)


def _nobody_python() -> tuple[str, dict] | None:
    """An interpreter user nobody can run, with dumpdb and its dependencies importable
    (pyenv's may live in root's home, mode 700: fall back to the python3.X on PATH outside
    this environment, with this environment's site-packages on PYTHONPATH)."""
    if os.geteuid() != 0:
        return None
    repo = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([repo, sysconfig.get_paths()["purelib"]])}
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    on_path = [os.path.join(d, version) for d in os.environ.get("PATH", "").split(os.pathsep) if d]
    for exe in [sys.executable, *(p for p in on_path if os.access(p, os.X_OK))]:
        try:
            ok = subprocess.run([exe, "-c", "import dumpdb.cli"], preexec_fn=_drop, env=env, cwd=tempfile.gettempdir(),
                                capture_output=True, timeout=60).returncode == 0
        except OSError:
            ok = False
        if ok:
            return exe, env
    return None


NOBODY = _nobody_python()
needs_nobody = pytest.mark.skipif(
    NOBODY is None, reason="needs root and a Python that user nobody can run (permission checks bypass root)")


def _as_nobody(*args, cwd) -> subprocess.CompletedProcess:
    exe, env = NOBODY
    return subprocess.run([exe, "-m", "dumpdb", *args], cwd=cwd, preexec_fn=_drop,
                          capture_output=True, text=True, env={**env, "HOME": str(cwd)})


@pytest.fixture
def shared_tmp():
    path = Path(tempfile.mkdtemp(prefix="dumpdb-nobody-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@needs_nobody
def test_unreadable_file_is_recorded_and_the_rest_ingests(shared_tmp):
    src = shared_tmp / "dump"
    shutil.copytree(ms_case("c1_inputs_kernels_iter"), src)
    for p in [src, *src.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    locked = npy_files(src)[5]
    locked.chmod(0o000)
    result = _as_nobody("ingest", str(src), "--archive", str(shared_tmp / "a.dumpdb"), "-q", cwd=shared_tmp)
    assert result.returncode == 1, result.stderr
    assert "Permission denied" in result.stderr and locked.name in result.stderr and "Traceback" not in result.stderr
    assert dumpdb.open(shared_tmp / "a.dumpdb").show("dump")["tensors"] == 41


@needs_nobody
def test_read_only_archive_answers_queries_and_refuses_ingest(shared_tmp):
    archive = shared_tmp / "a.dumpdb"
    dumpdb.ingest(ms_case("c1_inputs_kernels_iter"), archive=archive, run="c1")
    for p in [archive, *archive.rglob("*")]:
        p.chmod(0o555 if p.is_dir() else 0o444)
    q = _as_nobody("sql", "--archive", str(archive), "-f", "csv", "SELECT count(*) AS n FROM tensors", cwd=shared_tmp)
    assert q.returncode == 0 and q.stdout.splitlines()[-1] == "42", q.stderr
    v = _as_nobody("verify", "--archive", str(archive), cwd=shared_tmp)
    assert v.returncode == 0, v.stderr
    i = _as_nobody("ingest", str(ms_case("f_long_names")), "--archive", str(archive), cwd=shared_tmp)
    assert i.returncode == 2 and "read-only" in i.stderr and "Traceback" not in i.stderr
