"""Issue 12 (scale-out): statistics csv streamed as Arrow batches, progressive commits.

Every test compares two code paths of dumpdb (or the catalog against the csv we wrote),
never a figure computed by the code under test.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from catalog_snapshot import catalog_snapshot
from conftest import ms_case

import dumpdb
from dumpdb.ingestion import pipeline
from dumpdb.progress import Reporter

REPO = Path(__file__).resolve().parents[1]
IT = Path("rank_0") / "LeNet5" / "1" / "3"
NAME_RE = re.compile(r"^(?P<op_type>[^.]+)\.(?P<op_name>.+)\.(?P<task>\d+)\.(?P<stream>\d+)\.(?P<ts>\d+)"
                     r"\.(?P<io>input|output)\.(?P<slot>\d+)\.")
HEADER = ("Op Type,Op Name,Task ID,Stream ID,Timestamp,IO,Slot,Data Size,Data Type,Shape,Max Value,Min Value,"
          "Avg Value,Count,Negative Zero Count,Positive Zero Count,NaN Count,Negative Inf Count,"
          "Positive Inf Count,MD5\n")


def _stat_csv(it_dir: Path) -> tuple[str, int]:
    """A statistic.csv naming every tensor of ``it_dir`` one microsecond later (so no file
    claims its row) plus odd records: blank, short, long, a count that is not a count,
    a non-ASCII digit, an empty shape, a duplicate identity. Returns (text, records)."""
    lines = []
    for i, p in enumerate(sorted(it_dir.glob("*.npy"))):
        m = NAME_RE.match(p.name)
        assert m, p.name
        lines.append(f"{m['op_type']},{m['op_name']},{m['task']},{m['stream']},{int(m['ts']) + 1},"
                     f"{m['io'].capitalize() if i % 2 else m['io']},{m['slot']},16,float32,\"({i + 1},2)\","
                     f"{i * 1.5},-{i}.25,1e-3,{2 * (i + 1)},0,{i % 3},0,0,0,{format(i, '032x') if i % 4 else ''}\n")
    lines += [
        ",,,,,,,,,,,,,,,,,,,\n",
        "Add,Short-op1,1,2\n",
        "Add,Long-op2,1,2,3,output,0,16,float32,\"(2,2)\",1,0,0.5,4,0,0,0,0,0,,extra,cells\n",
        "Add,NanCount-op3,1,2,4,output,0,16,float32,\"(2,2)\",1,0,0.5,nan,0,0,0,0,0,\n",
        "Add,Digit-op4,\u0663,2,5,output,0,16,float32,\"(2,2)\",1,0,0.5,4,0,0,0,0,0,\n",
        "Add,EmptyShape-op5,1,2,6,output,0,16,float32,,1,0,0.5,4,0,0,0,0,0,\n",
        "Parameter,conv1_weight,0,0,7,output,0,16,float32,\"(6,1,5,5)\",0.3,-0.3,0,150,0,0,0,0,0,\n",
        "Add,Dup-op6,1,2,8,output,0,16,float32,\"(2,2)\",1,0,0.5,4,0,0,0,0,0,\n",
        "Add,Dup-op6,1,2,8,output,0,16,float32,\"(2,2)\",1,0,0.5,4,0,0,0,0,0,\n",
    ]
    return HEADER + "".join(lines), len(lines)


def _rows(archive: Path, where: str = "content_hash IS NULL") -> list[dict]:
    con = duckdb.connect(str(archive / "catalog.duckdb"), read_only=True)
    try:
        cols = [r[0] for r in con.execute(
            "SELECT column_name FROM duckdb_columns() WHERE table_name = 'tensors' "
            "AND column_name NOT IN ('tensor_id') ORDER BY column_index").fetchall()]
        sel = ", ".join(f'"{c}"' for c in cols)
        rows = con.execute(f"SELECT {sel} FROM tensors WHERE {where}").fetchall()
        return sorted((dict(zip(cols, r)) for r in rows), key=repr)
    finally:
        con.close()


def _errors(archive: Path) -> list[tuple]:
    con = duckdb.connect(str(archive / "catalog.duckdb"), read_only=True)
    try:
        return sorted(con.execute("SELECT source_file, error FROM ingest_errors").fetchall())
    finally:
        con.close()


def test_streamed_statistics_equal_the_per_entry_path(tmp_path):
    """The same statistic.csv read beside tensor files (one TensorEntry per row) and alone
    (streamed in Arrow batches): identical statistics-only rows and error lines."""
    joined = tmp_path / "joined"
    shutil.copytree(ms_case("a_tensor_all_eval"), joined)
    text, records = _stat_csv(joined / IT)
    (joined / IT / "statistic.csv").write_text(text, encoding="utf-8")
    alone = tmp_path / "alone"
    shutil.copytree(joined, alone)
    for p in (alone / IT).glob("*.npy"):
        p.unlink()
    a = dumpdb.ingest(joined, tmp_path / "a", run="r")
    b = dumpdb.ingest(alone, tmp_path / "b", run="r")
    assert b.layout == "statistic-only" and a.layout == "mindspore-sync"
    rows_a, rows_b = _rows(tmp_path / "a"), _rows(tmp_path / "b")
    # every record but the blank one, the second duplicate and the empty shape (an error); the
    # 'nan' count is an error line and its row stays without that statistic
    assert len(rows_b) == records - 3 and b.statistics_only == len(rows_b)
    assert rows_a == rows_b
    # the 'nan' count, the empty shape and the second Dup-op6 row (issue 30 item 10: one line per duplicate)
    assert _errors(tmp_path / "a") == _errors(tmp_path / "b") and len(_errors(tmp_path / "b")) == 3
    # a value the csv spelled: the Parameter row, linked to the graph's parameter
    param = [r for r in rows_b if r["op_name"] == "conv1_weight" and r["timestamp"] == 7]
    assert len(param) == 1 and param[0]["max"] == 0.3 and param[0]["shape"] == [6, 1, 5, 5]


def test_streamed_statistics_resume_adds_nothing_twice(tmp_path, monkeypatch):
    dump = tmp_path / "d"
    shutil.copytree(ms_case("a_tensor_all_eval"), dump)
    text, _ = _stat_csv(dump / IT)
    (dump / IT / "statistic.csv").write_text(text, encoding="utf-8")
    for p in (dump / IT).glob("*.npy"):
        p.unlink()
    monkeypatch.setattr(pipeline, "STATISTIC_BATCH_BYTES", 2048)  # several batches

    class Stop(Reporter):
        def __init__(self):
            self.n = 0

        def advance(self, tensors, bytes_read):
            self.n += 1
            if self.n == 3:
                raise KeyboardInterrupt

    first = dumpdb.ingest(dump, tmp_path / "a", run="r", reporter=Stop())
    assert first.interrupted and 0 < first.tensors_added
    again = dumpdb.ingest(dump, tmp_path / "a", run="r")
    clean = dumpdb.ingest(dump, tmp_path / "c", run="r")
    assert again.status == clean.status == "complete_with_errors"  # the odd records
    assert first.tensors_added + again.tensors_added == clean.tensors_added
    assert _errors(tmp_path / "a") == _errors(tmp_path / "c")
    assert _rows(tmp_path / "a") == _rows(tmp_path / "c")
    keys = [r["tensor_key"] for r in _rows(tmp_path / "a")]
    assert len(keys) == len(set(keys))


class _Watcher(Reporter):
    """Counts the run's committed tensors from a separate read-only connection each time
    the ingest reports progress (the ingest holds no connection between commits) and the
    catalog's files (database, WAL) changed since it last looked: rows become visible only
    by a commit, which writes them, so an unchanged catalog would show the count seen last."""

    def __init__(self, archive: Path):
        self.archive = archive
        self.seen: list[int] = []
        self._files: list[tuple] = []

    def advance(self, tensors, bytes_read):
        if not (self.archive / "catalog.duckdb").exists():
            return
        files = []
        for p in sorted(self.archive.glob("catalog.duckdb*")):
            try:
                st = p.stat()
            except FileNotFoundError:  # a WAL checkpointed away meanwhile
                continue
            files.append((p.name, st.st_mtime_ns, st.st_size))
        if files == self._files:
            return
        self._files = files
        with dumpdb.open(self.archive) as arch:
            self.seen.append(arch.sql("SELECT count(*) AS n FROM tensors")["n"][0].as_py())


@pytest.mark.parametrize("statistics_only", [True, False])
def test_rows_are_visible_while_the_ingest_runs(tmp_path, monkeypatch, statistics_only):
    dump = tmp_path / "d"
    shutil.copytree(ms_case("a_tensor_all_eval"), dump)
    if statistics_only:
        text, _ = _stat_csv(dump / IT)
        (dump / IT / "statistic.csv").write_text(text, encoding="utf-8")
        for p in (dump / IT).glob("*.npy"):
            p.unlink()
        monkeypatch.setattr(pipeline, "STATISTIC_BATCH_BYTES", 2048)  # several commits
    else:
        monkeypatch.setattr(pipeline, "COMMIT_ROWS", 8)
    watcher = _Watcher(tmp_path / "a")
    report = dumpdb.ingest(dump, tmp_path / "a", run="r", reporter=watcher)
    assert report.status in ("complete", "complete_with_errors") and not report.interrupted
    partial = [n for n in watcher.seen if 0 < n < report.tensors_added]
    assert len(set(partial)) >= 2, watcher.seen  # the committed part grew while it ran
    assert watcher.seen == sorted(watcher.seen)


# -- the same catalog whatever runs the workers -------------------------------------------------
def _payloads(archive: Path) -> dict[str, bytes]:
    """content hash -> the bytes read back through the archive, for every stored payload."""
    with dumpdb.open(archive) as arch:
        ids = arch.sql("SELECT min(tensor_id) AS id, content_hash FROM tensors "
                       "WHERE content_hash IS NOT NULL GROUP BY content_hash").to_pylist()
        return {r["content_hash"]: arch.tensor(r["id"]).tobytes() for r in ids}


class _Counting(Reporter):
    def __init__(self):
        self.advanced: list[int] = []

    @property
    def files(self) -> int:
        return len(self.advanced)

    @property
    def bytes(self) -> int:
        return sum(self.advanced)

    def advance(self, tensors, bytes_read):
        self.advanced.append(bytes_read)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("dump", [
    ms_case("a_tensor_all_eval"),
    Path(__file__).parent / "data" / "msprobe" / "statistics_mix_2rank_gloo",
    Path(__file__).parent / "data" / "msprobe" / "tensor_mix",
], ids=["mindspore", "msprobe-statistics", "msprobe-tensors"])
def test_same_catalog_for_any_workers_and_dask(tmp_path, monkeypatch, dump):
    from dumpdb.ingestion import workers
    monkeypatch.setattr(workers, "BATCH_FILES", 3)  # many batches, interleaved on the workers
    one = dumpdb.ingest(dump, tmp_path / "w1", run="r", workers=1)
    two = dumpdb.ingest(dump, tmp_path / "w2", run="r", workers=2)
    progress = _Counting()
    local = dumpdb.ingest(dump, tmp_path / "dask", run="r", workers=2, scheduler="local", reporter=progress)
    assert one.tensors_added > 0 and one.status == two.status == local.status
    # progress of the Dask tasks reached the reporter (the CLI's bar), one advance per tensor file
    assert progress.files == local.tensors_in_dump and progress.bytes == local.bytes_read
    reference = catalog_snapshot(tmp_path / "w1")
    assert catalog_snapshot(tmp_path / "w2") == reference
    assert catalog_snapshot(tmp_path / "dask") == reference
    payloads = _payloads(tmp_path / "w1")
    assert _payloads(tmp_path / "w2") == payloads == _payloads(tmp_path / "dask")


# -- many nodes, one archive ----------------------------------------------------------------------
def _cli(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen([sys.executable, "-m", "dumpdb", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _in_process(*args: str):
    """``dumpdb ARGS`` through typer's runner in this process (its result: exit_code, stdout, stderr)."""
    from typer.testing import CliRunner

    from dumpdb.cli import app

    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def _two_rank_dump(tmp_path: Path) -> Path:
    """a_tensor_all_eval with its rank_0 copied as rank_1: equal payloads on two ranks, which
    two workers store at the same time (the dedup a commit resolves)."""
    dump = tmp_path / "two_ranks"
    shutil.copytree(ms_case("a_tensor_all_eval"), dump)
    shutil.copytree(dump / "rank_0", dump / "rank_1")
    return dump


@pytest.mark.timeout(600)
def test_two_ingest_workers_and_one_commit_equal_one_ingest(tmp_path):
    dump = _two_rank_dump(tmp_path)
    single = tmp_path / "single"
    assert dumpdb.ingest(dump, single, run="r", workers=1).ok
    nodes = []
    for rank in (0, 1):  # each node sees only its own rank
        node = tmp_path / f"node{rank}" / "two_ranks"
        shutil.copytree(dump, node)
        shutil.rmtree(node / f"rank_{1 - rank}")
        nodes.append(node)
    shared = tmp_path / "shared"
    # the two nodes' ingest-workers run as processes at the same time; the commits and the gc
    # around them run in this process (typer's runner: the same command, no process start)
    created = _in_process("commit", "--archive", str(shared))  # an empty archive to start from
    assert created.exit_code == 0, created.output
    workers = [_cli("ingest-worker", str(node), "--archive", str(shared), "--part", f"node{i}", "--run", "r",
                    "--workers", "2", "-q") for i, node in enumerate(nodes)]
    for w in workers:
        assert w.wait(timeout=300) == 0, w.stderr.read()
    with dumpdb.open(shared) as arch:  # nothing in the catalog until the commit
        assert arch.sql("SELECT count(*) AS n FROM tensors")["n"][0].as_py() == 0
    commit = _in_process("commit", "--archive", str(shared))
    assert commit.exit_code == 0, commit.output
    assert "part 'node0'" in commit.stderr
    got, want = catalog_snapshot(shared), catalog_snapshot(single)
    for name in ("arrays",):  # both workers stored the shared payloads: extra packs, left for gc
        got.pop(name), want.pop(name)
    got["blobs"] = sorted(_blob_identity(shared))
    want["blobs"] = sorted(_blob_identity(single))
    got["runs"] = [r.replace(str(nodes[0]), str(dump)).replace(str(nodes[1]), str(dump)) for r in got["runs"]]
    assert got == want
    assert _payloads(shared) == _payloads(single)
    again = _in_process("commit", "--archive", str(shared))
    assert again.exit_code == 0 and "nothing to commit" in again.stderr
    assert dumpdb.open(shared).verify().ok
    gc = _in_process("gc", "--archive", str(shared), "--grace", "0")
    assert gc.exit_code == 0, gc.output
    assert _payloads(shared) == _payloads(single) and dumpdb.open(shared).verify().ok


def _blob_identity(archive: Path) -> list[tuple]:
    con = duckdb.connect(str(archive / "catalog.duckdb"), read_only=True)
    try:
        return con.execute("SELECT content_hash, nbytes, elem_count, first_run FROM blobs").fetchall()
    finally:
        con.close()


def test_commit_refuses_a_damaged_part_and_names_it(tmp_path):
    dump = ms_case("a_tensor_all_eval")
    shared = tmp_path / "shared"
    from dumpdb.ingestion.parts import commit_parts, ingest_worker, part_dir
    commit_parts(shared)
    assert ingest_worker(dump, shared, "n0", "r").status == "written"
    assert ingest_worker(dump, shared, "n0", "r").status == "already written"
    frag = sorted(part_dir(shared, "r", "n0").glob("tensors-*.parquet"))[0]
    frag.write_bytes(frag.read_bytes()[:-1] + b"\0")
    report = commit_parts(shared)
    assert not report.ok and "sha256 differs" in report.refused[0][1] and str(frag) in report.refused[0][1]
    with dumpdb.open(shared) as arch:
        assert arch.sql("SELECT count(*) AS n FROM tensors")["n"][0].as_py() == 0


def test_ingest_worker_refuses_update_and_moved_naming_the_command_that_does_it(tmp_path):
    from typer.testing import CliRunner

    from dumpdb.cli import app

    dump = ms_case("a_tensor_all_eval")
    for flag in ("--update", "--moved"):
        result = CliRunner().invoke(app, ["ingest-worker", str(dump), "--archive", str(tmp_path / "a"),
                                          "--part", "n0", flag])
        assert result.exit_code == 2
        assert f"ingest-worker {flag}" in result.output and f"dumpdb ingest {flag}" in result.output
    assert not (tmp_path / "a").exists()  # refused before anything was made


def test_default_worker_processes_only_with_cores_to_spare(monkeypatch):
    """Without --workers, processes are used only from PROCESS_MIN_CORES cores: on 2 cores the
    ingesting process (compression, commits) and the workers compete (measured 0.71x)."""
    import contextlib

    from dumpdb.ingestion import pipeline as pl
    from dumpdb.ingestion import workers as wk
    from dumpdb.layouts import TensorEntry

    opened = []

    @contextlib.contextmanager
    def fake_pool(n):
        opened.append(n)
        yield "pool"

    monkeypatch.setattr(pl, "process_pool", fake_pool)
    big = [TensorEntry(source_file=f"f{i}", path=f"/x/f{i}", size=2 << 20) for i in range(wk.PROCESS_MIN_FILES)]
    for cores, workers, expect in ((2, None, None), (wk.PROCESS_MIN_CORES, None, "pool"), (2, 2, "pool"),
                                   (8, 1, None)):
        monkeypatch.setattr(pl, "default_workers", lambda c=cores: c)
        ex = pl.Executors("/x", False, workers, None, None)
        with ex.open(big) as pool:
            assert pool == expect, (cores, workers)
    assert opened == [wk.PROCESS_MIN_CORES, 2]
