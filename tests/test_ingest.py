"""Ingest of real MindSpore dumps: counts, bit-exact payloads, statistics, dedup,
idempotency, resume after SIGKILL or Ctrl-C, and bad files recorded, not fatal."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import MS_CASES, assert_bit_exact, file_count, ms_case, npy_files, npy_payload

import dumpdb
from dumpdb.dtypes import BFLOAT16
from dumpdb.progress import Reporter


def _rows(archive, run):
    return dumpdb.open(archive).sql(
        "SELECT * FROM tensors WHERE run = ? ORDER BY tensor_id", [run]).to_pylist()


@pytest.mark.parametrize("case", MS_CASES)
def test_row_count_equals_npy_files(ingested, case):
    n = dumpdb.open(ingested).sql(f"SELECT count(*) AS n FROM tensors WHERE run = '{case}'")["n"][0].as_py()
    assert n == len(npy_files(ms_case(case)))


@pytest.mark.parametrize("case", MS_CASES)
def test_every_tensor_is_bit_exact(ingested, case):
    archive = dumpdb.open(ingested)
    root = ms_case(case)
    seen = 0
    for row, array in archive.tensors(f"SELECT * FROM tensors WHERE run = '{case}'"):
        descr, shape, payload = npy_payload(root / row["source_file"])
        assert array.shape == shape == tuple(row["shape"])
        assert_bit_exact(array, payload)
        expected_dtype = {"<E2": BFLOAT16, "<f2": np.float16}.get(descr) or np.dtype(descr)
        if expected_dtype == np.float16 and len(payload) == 4 * int(np.prod(shape)):
            expected_dtype = np.dtype(np.float32)  # Float16 header, float32 payload
        assert array.dtype == expected_dtype, row["source_file"]
        seen += 1
    assert seen == len(npy_files(root))


def test_tensor_by_id_equals_source_file(ingested):
    archive = dumpdb.open(ingested)
    row = archive.sql("SELECT tensor_id, source_file, run FROM tensors WHERE run = 'a_tensor_all_eval' "
                      "AND op_type = 'Conv2D' AND io = 'output' LIMIT 1").to_pylist()[0]
    expected = np.load(ms_case("a_tensor_all_eval") / row["source_file"])
    got = archive.tensor(row["tensor_id"])
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert got.tobytes() == expected.tobytes()


@pytest.mark.parametrize("case", MS_CASES)
def test_statistics_equal_numpy(ingested, case):
    archive = dumpdb.open(ingested)
    for row, array in archive.tensors(f"SELECT * FROM tensors WHERE run = '{case}'"):
        ref = np.asarray(array, dtype=np.float64) if array.dtype != np.bool_ else array.astype(np.float64)
        assert row["count"] == ref.size
        assert row["stats_source"] == "computed"
        assert row["nan_count"] == int(np.isnan(ref).sum())
        assert row["pos_inf_count"] == int(np.isposinf(ref).sum())
        assert row["neg_inf_count"] == int(np.isneginf(ref).sum())
        assert row["zero_count"] == int((ref == 0).sum())
        if ref.size and not np.isnan(ref).any():
            assert row["min"] == ref.min() and row["max"] == ref.max()
            with np.errstate(invalid="ignore", over="ignore"):  # inf - inf is NaN, as in numpy
                mean, l2 = ref.mean(), np.sqrt((ref * ref).sum())
            assert row["mean"] == pytest.approx(mean, rel=1e-12, abs=1e-300, nan_ok=True)
            assert row["l2norm"] == pytest.approx(l2, rel=1e-12, abs=1e-300, nan_ok=True)


def test_quirks_recorded(ingested):
    archive = dumpdb.open(ingested)
    rows = archive.sql("SELECT dtype, dtype_declared, note, op_type FROM tensors "
                       "WHERE run = 'd2_compare_fp16_bf16_iter0' AND dtype_declared = 'Float16'").to_pylist()
    quirky = [r for r in rows if r["dtype"] == "float32"]
    honest = [r for r in rows if r["dtype"] == "float16"]
    assert quirky and honest
    assert all("payload holds float32" in r["note"] for r in quirky)
    assert all(r["note"] is None for r in honest)
    bf16 = archive.sql("SELECT count(*) AS n FROM tensors WHERE dtype = 'bfloat16'")["n"][0].as_py()
    assert bf16 == len(list(ms_case("d2_compare_fp16_bf16_iter0").rglob("*.BFloat16.npy")))
    scalars = archive.sql("SELECT dtype, shape FROM tensors WHERE run = 'c1_inputs_kernels_iter' "
                          "AND op_type = 'MatMul' AND slot >= 2").to_pylist()
    assert scalars and all(r == {"dtype": "bool", "shape": []} for r in scalars)


def test_mapping_names_in_catalog(ingested):
    rows = dumpdb.open(ingested).sql(
        "SELECT op_name, source_file, scope_name FROM tensors WHERE run = 'f_long_names' "
        "AND note LIKE 'name from mapping.csv%'").to_pylist()
    assert len(rows) == 6
    for r in rows:
        assert r["source_file"].split("/")[-1][:-4].isdigit()  # on disk: {hash}.npy
        assert "LongNamedWrapperCell" in r["op_name"] or "inner_layer" in r["op_name"]
    matmul = [r for r in rows if r["op_name"].endswith("MatMul-op0")]
    assert matmul[0]["scope_name"].count("/") >= 5  # linked to the IR's full scope


def test_scope_and_execution_order_linkage(ingested):
    archive = dumpdb.open(ingested)
    unlinked = archive.sql("SELECT count(*) AS n FROM tensors WHERE scope_name IS NULL")["n"][0].as_py()
    assert unlinked == 0
    # every eval-graph op tensor joins to exactly one execution_order position and one IR node
    joined = archive.sql("""
        SELECT t.op_name, e.position, o.code_line
        FROM tensors t
        JOIN execution_order e ON e.run = t.run AND e.graph_id = t.graph_id AND e.scope_name = t.scope_name
        JOIN ops o ON o.run = t.run AND o.graph_id = t.graph_id AND o.scope_name = t.scope_name
        WHERE t.run = 'a_tensor_all_eval' AND t.io = 'output' AND t.op_type != 'Parameter'
        ORDER BY e.position""").to_pylist()
    assert [r["position"] for r in joined] == list(range(15))
    assert joined[0]["code_line"] == 80


def test_dedup_stores_repeated_content_once(ingested):
    archive = dumpdb.open(ingested)
    for case in MS_CASES:
        digests = set()
        for p in npy_files(ms_case(case)):
            _, _, payload = npy_payload(p)
            digests.add(hashlib.sha256(payload).hexdigest())
        info = archive.show(case)
        assert info["distinct_payloads"] == len(digests)
    blobs = archive.sql("SELECT count(*) AS n FROM blobs")["n"][0].as_py()
    distinct = archive.sql("SELECT count(DISTINCT content_hash) AS n FROM tensors")["n"][0].as_py()
    assert blobs == distinct
    # eval graph: Parameter x is the Conv2D input.0: one payload, two rows
    same = archive.sql("""SELECT count(*) AS n FROM tensors WHERE run = 'a_tensor_all_eval'
        AND content_hash = (SELECT content_hash FROM tensors WHERE run = 'a_tensor_all_eval' AND op_name = 'x')""")
    assert same["n"][0].as_py() >= 2


def test_archive_files_grow_with_packs_not_tensors(tmp_path):
    archive = tmp_path / "a.dumpdb"
    dumpdb.ingest(ms_case("d2_compare_fp16_bf16_iter0"), archive=archive, run="d2")
    n_files = file_count(archive)
    assert n_files < 30 < len(npy_files(ms_case("d2_compare_fp16_bf16_iter0")))
    report = dumpdb.ingest(ms_case("d2_compare_fp16_bf16_iter0"), archive=archive, run="d2")
    assert report.tensors_added == 0 and report.tensors_skipped == report.tensors_in_dump == 95
    assert file_count(archive) == n_files


def test_same_dump_under_another_run_stores_nothing_new(tmp_path):
    archive = tmp_path / "a.dumpdb"
    first = dumpdb.ingest(ms_case("c1_inputs_kernels_iter"), archive=archive, run="one")
    second = dumpdb.ingest(ms_case("c1_inputs_kernels_iter"), archive=archive, run="two")
    assert first.bytes_stored > 0 and second.bytes_stored == 0
    assert second.deduplicated == second.tensors_added == first.tensors_added
    assert dumpdb.open(archive).show("two")["bytes_stored"] == 0


def test_run_name_clash_with_other_dump_is_refused(tmp_path):
    archive = tmp_path / "a.dumpdb"
    dumpdb.ingest(ms_case("c1_inputs_kernels_iter"), archive=archive, run="x")
    with pytest.raises(dumpdb.ArchiveError, match="already holds the dump"):
        dumpdb.ingest(ms_case("f_long_names"), archive=archive, run="x")


def test_source_dump_is_never_modified(case_copy, tmp_path):
    src = case_copy("f_long_names")
    for p in src.rglob("*"):
        if p.is_file():
            p.chmod(0o400)
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in src.rglob("*") if p.is_file()}
    report = dumpdb.ingest(src, archive=tmp_path / "a.dumpdb")
    assert report.ok and report.run == "f_long_names"
    after = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in src.rglob("*") if p.is_file()}
    assert before == after
    assert all(p.stat().st_mode & 0o777 == 0o400 for p in after)


def test_corrupt_file_is_recorded_and_skipped(case_copy, tmp_path):
    src = case_copy("c1_inputs_kernels_iter")
    files = npy_files(src)
    truncated, empty = files[3], files[10]
    truncated.write_bytes(truncated.read_bytes()[:-5])
    empty.write_bytes(b"")
    (src / "rank_0/LeNet5/0/0/garbage_name.npy").write_bytes(b"x")
    archive = tmp_path / "a.dumpdb"
    report = dumpdb.ingest(src, archive=archive, run="c1")
    assert report.status == "complete_with_errors" and not report.ok
    assert report.tensors_added == len(files) - 2
    errors = dict(report.errors)
    rel = lambda p: str(p.relative_to(src))  # noqa: E731
    assert "truncated" in errors[rel(truncated)] and errors[rel(truncated)].startswith(rel(truncated))
    assert "not an .npy file" in errors[rel(empty)]
    assert "does not follow" in errors["rank_0/LeNet5/0/0/garbage_name.npy"]
    recorded = dumpdb.open(archive).sql("SELECT source_file FROM ingest_errors WHERE run = 'c1'")
    assert sorted(recorded["source_file"].to_pylist()) == sorted(errors)
    # fix one file and re-run: it is added, nothing else changes
    truncated.write_bytes((ms_case("c1_inputs_kernels_iter") / rel(truncated)).read_bytes())
    again = dumpdb.ingest(src, archive=archive, run="c1")
    assert again.tensors_added == 1 and len(again.errors) == 2


def test_ctrl_c_keeps_committed_work_and_rerun_completes(tmp_path, monkeypatch):
    monkeypatch.setattr("dumpdb.storage.store.PACK_BYTES", 32 << 10)  # many small packs
    monkeypatch.setattr("dumpdb.ingestion.pipeline.COMMIT_SECONDS", 0)  # commit as soon as rows are durable

    class Interrupt(Reporter):
        n = 0

        def advance(self, tensors, bytes_read):
            self.n += tensors
            if self.n == 40:
                raise KeyboardInterrupt

    archive = tmp_path / "a.dumpdb"
    src = ms_case("d2_compare_fp16_bf16_iter0")
    report = dumpdb.ingest(src, archive=archive, run="d2", reporter=Interrupt(), workers=1)
    assert report.interrupted and report.status == "interrupted"
    kept = report.tensors_added
    assert 0 < kept < 95
    assert dumpdb.open(archive).runs()["status"].to_pylist() == ["interrupted"]
    _assert_committed_exact(archive, src)
    final = dumpdb.ingest(src, archive=archive, run="d2")
    assert final.tensors_skipped == kept and final.tensors_added == 95 - kept and final.ok
    _assert_complete_and_exact(archive, "d2", src)


KILL_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    import dumpdb, dumpdb.storage.store, dumpdb.ingestion.pipeline
    from dumpdb.progress import Reporter
    dumpdb.storage.store.PACK_BYTES = 32 << 10
    dumpdb.ingestion.pipeline.COMMIT_SECONDS = 0  # commit as soon as rows are durable: many commits to kill between
    class Kill(Reporter):
        n = 0
        def advance(self, tensors, bytes_read):
            self.n += tensors
            if self.n == int(sys.argv[3]):
                os.kill(os.getpid(), signal.SIGKILL)
    dumpdb.ingest(sys.argv[1], archive=sys.argv[2], run="d2", reporter=Kill(), workers=1)
""")


@pytest.mark.parametrize("kill_at", [1, 30, 94])
def test_sigkill_mid_ingest_then_rerun_completes(tmp_path, kill_at):
    archive = tmp_path / "a.dumpdb"
    src = ms_case("d2_compare_fp16_bf16_iter0")
    proc = subprocess.run([sys.executable, "-c", KILL_SCRIPT, str(src), str(archive), str(kill_at)])
    assert proc.returncode == -signal.SIGKILL
    partial = dumpdb.open(archive).sql("SELECT count(*) AS n, any_value(status) AS s FROM tensors "
                                        "JOIN runs USING (run)").to_pylist()[0]
    assert partial["n"] < 95
    _assert_committed_exact(archive, src)  # before the re-run: what was committed reads back
    final = dumpdb.ingest(src, archive=archive, run="d2")
    assert final.ok and final.tensors_skipped == partial["n"]
    _assert_complete_and_exact(archive, "d2", src)


def _assert_committed_exact(archive, src: Path):
    """Every committed row with a payload reads back bit for bit; verify passes."""
    a = dumpdb.open(archive)
    with a:
        for row, array in a.tensors("SELECT tensor_id, source_file FROM tensors WHERE content_hash IS NOT NULL"):
            assert array is not None and array.tobytes() == npy_payload(src / row["source_file"])[2], row
    assert a.verify().ok


def _assert_complete_and_exact(archive, run, src: Path):
    rows = _rows(archive, run)
    assert len(rows) == len(npy_files(src))
    assert len({r["source_file"] for r in rows}) == len(rows)  # no duplicates
    with dumpdb.open(archive) as a:  # one read connection for the many tensor() calls
        for row in rows:
            _, _, payload = npy_payload(src / row["source_file"])
            assert_bit_exact(a.tensor(row["tensor_id"]), payload)
        assert a.show(run)["status"] == "complete"


def test_statistic_csv_values_are_used(case_copy, tmp_path):
    src = case_copy("a_tensor_all_eval")
    it_dir = src / "rank_0/LeNet5/1/3"
    target = sorted(it_dir.glob("Conv2D.*output.0*.npy"))[0]
    fields = target.name.split(".")
    op_type, op_name, task, stream, ts = fields[0], fields[1], fields[2], fields[3], fields[4]
    header = "Op Type,Op Name,Task ID,Stream ID,Timestamp,IO,Slot,Data Size,Data Type,Shape,Max Value,Min Value,Avg Value,L2Norm Value,MD5"
    rows = [f"{op_type},{op_name},{task},{stream},{ts},output,0,75264,float32,\"(4,6,28,28)\",9.5,-9.5,0.125,42.0,d41d8cd98f00b204e9800998ecf8427e",
            # a tensor with statistics only (no .npy file beside it)
            "ReLU,Default_stats_only_ReLU-op9,0,0,1795336641444999,output,0,64,float32,\"(4,4)\",1.0,0.0,0.5,2.0,"]
    (it_dir / "statistic.csv").write_text(header + "\n" + "\n".join(rows) + "\n")
    archive = tmp_path / "a.dumpdb"
    report = dumpdb.ingest(src, archive=archive, run="s")
    assert report.ok and report.statistics_only == 1
    a = dumpdb.open(archive)
    row = a.sql(f"SELECT * FROM tensors WHERE source_file LIKE '%{target.name}'").to_pylist()[0]
    assert (row["max"], row["min"], row["mean"], row["l2norm"]) == (9.5, -9.5, 0.125, 42.0)
    assert row["stats_source"] == "statistic.csv+computed"
    assert row["count"] == 4 * 6 * 28 * 28  # not in the csv: computed
    assert row["checksum"] == "d41d8cd98f00b204e9800998ecf8427e" and row["checksum_algo"] == "md5"
    only = a.sql("SELECT * FROM tensors WHERE op_name = 'Default_stats_only_ReLU-op9'").to_pylist()[0]
    assert only["content_hash"] is None and only["shape"] == [4, 4] and only["dtype"] == "float32"
    assert only["stats_source"] == "statistic.csv" and only["max"] == 1.0
    with pytest.raises(dumpdb.DumpdbError, match="only statistics were dumped"):
        a.tensor(only["tensor_id"])


def test_empty_and_scalar_and_large_tensors_round_trip(tmp_path, monkeypatch):
    """Synthetic dump in the seed-001 name form (no dtype suffix) with edge-case tensors."""
    monkeypatch.setattr("dumpdb.storage.store.LARGE_BYTES", 1 << 16)  # 64 KiB counts as large here
    it = tmp_path / "dump/rank_3/Net/0/7"
    it.mkdir(parents=True)
    arrays = {
        "Add.Default_Add-op0.0.0.1000.input.0.DefaultFormat.npy": np.zeros((0, 4), np.float32),
        "Add.Default_Add-op0.0.0.1001.input.1.DefaultFormat.npy": np.array(3.5, np.float64),
        "Add.Default_Add-op0.0.0.1002.output.0.DefaultFormat.npy": np.arange(50_000, dtype=np.float32).reshape(50, 1000),
        "Neg.Default_Neg-op0.0.0.1003.output.0.DefaultFormat.npy": -np.zeros(300_000, np.float32),
    }
    for name, a in arrays.items():
        np.save(it / name, a)
    archive = tmp_path / "a.dumpdb"
    report = dumpdb.ingest(tmp_path / "dump", archive=archive, run="edge")
    assert report.ok and report.tensors_added == 4
    a = dumpdb.open(archive)
    for row, got in a.tensors("SELECT * FROM tensors ORDER BY timestamp"):
        want = arrays[Path(row["source_file"]).name]
        assert got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes()
        assert row["rank"] == 3 and row["iteration"] == 7 and row["dtype_declared"] is None
    kinds = a.sql("SELECT kind, count(*) AS n FROM arrays GROUP BY kind ORDER BY kind").to_pylist()
    assert {k["kind"] for k in kinds} == {"pack", "tensor"}


def test_first_inf_and_nan_by_execution_order(ingested):
    """The README's first-NaN/Inf query on the real e1 case (loss inf at step 0, nan at step 1)."""
    rows = dumpdb.open(ingested).sql("""
        SELECT t.iteration, t.op_type, t.io, t.slot, t.nan_count, t.pos_inf_count + t.neg_inf_count AS inf_count
        FROM tensors t JOIN execution_order e USING (run, rank, graph_id, scope_name)
        WHERE t.run = 'e1_nan_inf_overflow' AND (t.nan_count > 0 OR t.pos_inf_count > 0 OR t.neg_inf_count > 0)
        QUALIFY row_number() OVER (PARTITION BY t.iteration ORDER BY e.position, t.io = 'output', t.slot) = 1
        ORDER BY t.iteration""").to_pylist()
    assert [r["iteration"] for r in rows] == [0, 1]
    assert rows[0]["op_type"] == "SparseSoftmaxCrossEntropyWithLogits" and rows[0]["inf_count"] > 0
    assert rows[0]["nan_count"] == 0
    # step 1 starts from the inf weights the optimizer wrote: conv1's weight input
    assert (rows[1]["op_type"], rows[1]["io"], rows[1]["slot"]) == ("Conv2D", "input", 1)
    assert rows[1]["inf_count"] > 0 and rows[1]["nan_count"] == 0


def test_constants_dir_and_unusual_file_names(tmp_path):
    """Seed 001: {net}/{graph}/constants/Parameter.data-{id}... (no iteration); non-ASCII and
    non-UTF-8 names are kept readable in the catalog and their tensors still ingest."""
    net = tmp_path / "dump" / "rank_0" / "Net" / "0"
    (net / "constants").mkdir(parents=True)
    (net / "0").mkdir()
    const = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.save(net / "constants" / "Parameter.data-1.0.0.1623124369613540.output.0.DefaultFormat.npy", const)
    unicode_name = "Add.Default_réseau-Add-op0.0.0.17.output.0.DefaultFormat.Float32.npy"
    np.save(net / "0" / unicode_name, np.ones(3, np.float32))
    raw_name = os.fsencode(str(net / "0")) + b"/Mul.Default_\xff\xfe-Mul-op0.0.0.18.output.0.DefaultFormat.Float32.npy"
    with open(raw_name, "wb") as f:
        np.save(f, np.full(2, 7, np.float32))
    archive = tmp_path / "a.dumpdb"
    report = dumpdb.ingest(tmp_path / "dump", archive=archive, run="odd")
    assert report.ok and report.tensors_added == 3
    a = dumpdb.open(archive)
    rows = {r["op_type"]: r for r in a.sql("SELECT * FROM tensors").to_pylist()}
    assert rows["Parameter"]["iteration"] is None and rows["Parameter"]["op_name"] == "data-1"
    assert np.array_equal(a.tensor(rows["Parameter"]["tensor_id"]), const)
    assert rows["Add"]["op_name"] == "Default_réseau-Add-op0"
    assert "\\xff\\xfe" in rows["Mul"]["source_file"] and "\\xff" in rows["Mul"]["op_name"]
    assert a.tensor(rows["Mul"]["tensor_id"]).tolist() == [7.0, 7.0]
    again = dumpdb.ingest(tmp_path / "dump", archive=archive, run="odd")
    assert again.tensors_added == 0  # the escaped names still identify the files


def test_rerun_settles_a_run_left_interrupted_after_its_last_commit(tmp_path):
    archive = tmp_path / "a.dumpdb"
    src = ms_case("c1_inputs_kernels_iter")
    dumpdb.ingest(src, archive=archive, run="c1")
    import duckdb

    with duckdb.connect(str(archive / "catalog.duckdb")) as con:  # as if Ctrl-C hit the final commit
        con.execute("UPDATE runs SET status = 'interrupted'")
    again = dumpdb.ingest(src, archive=archive, run="c1")
    assert again.tensors_added == 0
    assert dumpdb.open(archive).show("c1")["status"] == "complete"


def test_report_counts_the_files_payloads_and_duplicates_of_the_dump(tmp_path):
    """IngestReport's counts, from the dump's files parsed without dumpdb: bytes_read is the
    size of every payload file read, bytes_in the payload bytes of the tensors added,
    deduplicated the tensors whose payload was already stored (in this run or before)."""
    src = ms_case("a_tensor_all_eval")  # Parameter x is also the Conv2D input: duplicates
    files = npy_files(src)
    payloads = [npy_payload(p)[2] for p in files]
    distinct = {hashlib.sha256(p).hexdigest() for p in payloads}
    report = dumpdb.ingest(src, archive=tmp_path / "a.dumpdb", run="a")
    assert report.ok and report.tensors_added == len(files)
    assert report.bytes_read == sum(os.path.getsize(p) for p in files)
    assert report.bytes_in == sum(len(p) for p in payloads)
    assert report.deduplicated == len(files) - len(distinct) > 0
    # every payload was first stored by this run (blobs.first_run)
    blobs = dumpdb.open(tmp_path / "a.dumpdb").sql("SELECT first_run, count(*) AS n FROM blobs GROUP BY 1")
    assert blobs.to_pylist() == [{"first_run": "a", "n": len(distinct)}]
