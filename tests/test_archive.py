"""The Python query API and the catalog's migrations."""

from __future__ import annotations

import shutil

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from conftest import MS_CASES, ms_case

import dumpdb
from dumpdb.catalog import migrations as catalog_mod


def test_sql_returns_arrow_and_is_read_only(ingested):
    a = dumpdb.open(ingested)
    t = a.sql("SELECT iteration, op_type, count(*) AS n FROM tensors GROUP BY ALL ORDER BY ALL")
    assert isinstance(t, pa.Table) and t.num_rows > 10
    assert a.sql("SELECT count(*) AS n FROM tensors WHERE run = ?", ["f_long_names"])["n"][0].as_py() == 66
    with pytest.raises(dumpdb.DumpdbError, match="SQL error"):
        a.sql("DELETE FROM tensors")
    with pytest.raises(dumpdb.DumpdbError, match="SQL error"):
        a.sql("SELECT nope FROM tensors")


def test_tensor_by_key_file_name_or_scope_name(ingested):
    a = dumpdb.open(ingested)
    by_file = a.tensor(run="a_tensor_all_eval", iteration=3,
                       op_name="Default_network-WithLossCell__backbone-LeNet5_relu-ReLU_ReLU-op4")
    by_scope = a.tensor(run="a_tensor_all_eval", iteration=3,
                        op_name="Default/network-WithLossCell/_backbone-LeNet5/relu-ReLU/ReLU-op0")
    assert by_file.shape == (4, 6, 28, 28) and np.array_equal(by_file, by_scope)
    assert (by_file >= 0).all()  # a ReLU output
    weight = a.tensor(run="a_tensor_all_eval", iteration=3, op_name="fc1.weight")
    assert weight.shape == (120, 400)


def test_tensor_lookup_errors(ingested):
    a = dumpdb.open(ingested)
    with pytest.raises(dumpdb.TensorNotFound, match="no tensor with tensor_id 999999"):
        a.tensor(999999)
    with pytest.raises(dumpdb.TensorNotFound, match="no tensor matches"):
        a.tensor(run="a_tensor_all_eval", iteration=3, op_name="nope")
    with pytest.raises(dumpdb.TensorNotFound, match="tensors match .*narrow it"):
        a.tensor(run="c1_inputs_kernels_iter", iteration=None, io="input", slot=0,
                 op_name="Default_network-WithLossCell__backbone-LeNet5_fc2-Dense_MatMul-op0")
    with pytest.raises(TypeError):
        a.tensor()


def test_tensors_batches_and_bfloat16(ingested):
    a = dumpdb.open(ingested)
    pairs = list(a.tensors("SELECT tensor_id, op_type, dtype FROM tensors WHERE dtype = 'bfloat16'"))
    assert pairs and all(arr.dtype.name == "bfloat16" for _, arr in pairs)
    assert set(pairs[0][0]) == {"tensor_id", "op_type", "dtype"}
    with pytest.raises(dumpdb.DumpdbError, match="tensor_id column"):
        next(a.tensors("SELECT op_type FROM tensors"))


def test_show_and_runs(ingested):
    a = dumpdb.open(ingested)
    info = a.show("c1_inputs_kernels_iter")
    assert info["iterations"] == [0, 2, 3] and info["ranks"] == [0] and info["graphs"] == [0]
    assert info["tensors"] == 42 and info["ratio"] > 1 and info["status"] == "complete"
    assert info["framework_version"] == "2.10.0"
    assert sorted(a.runs()["run"].to_pylist()) == sorted(MS_CASES)
    with pytest.raises(dumpdb.DumpdbError, match="no run 'nope'"):
        a.show("nope")


def test_the_catalog_tables_and_columns_and_the_ranks_through_the_archive(ingested):
    a = dumpdb.open(ingested)
    tables = {r["table"]: r for r in a.tables().to_pylist()}
    assert tables["tensors"]["kind"] == "table" and tables["tensors"]["comment"]
    assert tables["tensors"]["rows"] == a.sql("SELECT count(*) AS n FROM tensors")["n"][0].as_py()
    assert tables["runs"]["rows"] == len(MS_CASES)
    columns = a.columns("runs")
    assert columns.column_names == ["table", "column", "type", "comment"]
    assert set(columns["table"].to_pylist()) == {"runs"} and "source_path" in columns["column"].to_pylist()
    assert a.columns().num_rows > columns.num_rows
    with pytest.raises(dumpdb.DumpdbError, match=r"no table 'nope' in the catalog \(tables: .*tensors"):
        a.columns("nope")
    run = "c1_inputs_kernels_iter"
    assert a.ranks(run)["rank"].to_pylist() == [0]
    assert a.first_bad_rank(run).num_rows == 0
    with pytest.raises(dumpdb.RunNotFound, match="no run 'nope'"):
        a.ranks("nope")
    # one iteration each: compared step against step; several: by run
    single = [c for c in MS_CASES if len(a.show(c)["iterations"]) == 1]
    if len(single) >= 2:
        it = [a.show(c)["iterations"][0] for c in single[:2]]
        assert a.step_pair(single[0], single[1]) == (f"{single[0]}:{it[0]}", f"{single[1]}:{it[1]}")
    assert a.step_pair(run, run) == (run, run)


def test_ingest_through_the_archive_uses_its_settings(tmp_path):
    archive = tmp_path / "a.dumpdb"
    dumpdb.ingest(ms_case("c1_inputs_kernels_iter"), archive=archive, run="first")
    a = dumpdb.open(archive)
    report = a.ingest(ms_case("c1_inputs_kernels_iter"), "second")
    assert report.ok and report.tensors_added == 42 and report.deduplicated == 42
    assert sorted(a.runs()["run"].to_pylist()) == ["first", "second"]


def test_open_errors(tmp_path):
    with pytest.raises(dumpdb.ArchiveError, match="no such archive"):
        dumpdb.open(tmp_path / "missing")
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "x").write_text("x")
    with pytest.raises(dumpdb.ArchiveError, match="not a dumpdb archive"):
        dumpdb.open(tmp_path / "plain")
    with pytest.raises(dumpdb.ArchiveError, match="refusing to write into it"):
        dumpdb.ingest(ms_case("c1_inputs_kernels_iter"), archive=tmp_path / "plain")


def test_default_archive_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("DUMPDB_ARCHIVE", str(tmp_path / "env.dumpdb"))
    dumpdb.ingest(ms_case("c1_inputs_kernels_iter"))
    assert dumpdb.open().show("c1_inputs_kernels_iter")["tensors"] == 42


def _migrations_plus(tmp_path, extra_sql: str):
    """The real migrations plus one more (numbered latest + 1)."""
    mdir = tmp_path / "migrations"
    shutil.copytree(catalog_mod.migrations_dir(), mdir)
    (mdir / f"{catalog_mod.latest_version() + 1:03d}_add_comment.sql").write_text(extra_sql)
    return mdir


def test_older_archive_is_upgraded_on_open_with_backup(tmp_path, monkeypatch):
    archive = tmp_path / "a.dumpdb"
    dumpdb.ingest(ms_case("c1_inputs_kernels_iter"), archive=archive, run="c1")
    now = catalog_mod.latest_version()
    assert dumpdb.open(archive).schema_version == now
    mdir = _migrations_plus(tmp_path, "ALTER TABLE runs ADD COLUMN comment VARCHAR;")
    monkeypatch.setattr(catalog_mod, "migrations_dir", lambda: mdir)
    a = dumpdb.open(archive)
    assert a.schema_version == now + 1
    assert a.sql("SELECT version FROM schema_version ORDER BY version")["version"].to_pylist() == \
        list(range(1, now + 2))
    assert a.sql("SELECT comment FROM runs")["comment"].to_pylist() == [None]
    assert a.sql("SELECT count(*) AS n FROM tensors")["n"][0].as_py() == 42
    backups = list((archive / "backups").glob(f"catalog-v{now}-*.duckdb"))
    assert len(backups) == 1
    assert [m.version for m in a.migrate()] == [now + 1]  # what opening it applied (dumpdb migrate's answer)
    assert dumpdb.open(archive).migrate() == []
    with duckdb.connect(str(backups[0]), read_only=True) as con:
        assert con.execute("SELECT max(version) FROM schema_version").fetchone()[0] == now


def test_newer_archive_is_refused(tmp_path):
    archive = tmp_path / "a.dumpdb"
    dumpdb.ingest(ms_case("c1_inputs_kernels_iter"), archive=archive, run="c1")
    with duckdb.connect(str(archive / "catalog.duckdb")) as con:
        con.execute("INSERT INTO schema_version (version, name) VALUES (99, 'future')")
    with pytest.raises(dumpdb.CatalogVersionError, match="version 99 is newer than this dumpdb"):
        dumpdb.open(archive)


def test_queries_wait_for_a_writer_then_work(tmp_path):
    archive = tmp_path / "a.dumpdb"
    dumpdb.ingest(ms_case("c1_inputs_kernels_iter"), archive=archive, run="c1")
    a = dumpdb.open(archive, lock_timeout=0.3)
    import subprocess
    import sys
    # The holder keeps the lock until it reads a line: no sleeps, no race with the timeouts.
    holder = subprocess.Popen([sys.executable, "-c",
                               f"import duckdb,sys; c=duckdb.connect({str(archive / 'catalog.duckdb')!r}); "
                               "print('locked', flush=True); sys.stdin.readline(); c.close()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    with pytest.raises(dumpdb.ArchiveError, match="locked by another process"):
        a.sql("SELECT 1")
    waited = []

    def on_wait(message):  # the reader says it waits: now let the holder go
        waited.append(message)
        if holder.poll() is None:
            holder.stdin.write("release\n")
            holder.stdin.close()

    t = dumpdb.open(archive, lock_timeout=60, on_wait=on_wait).sql("SELECT count(*) AS n FROM tensors")
    assert holder.wait() == 0
    assert t["n"][0].as_py() == 42 and waited and "waiting for the catalog lock" in waited[0]


def test_first_schema_archive_upgrades_and_answers(tmp_path):
    """An archive made by the first dumpdb (schema v1, kept in tests/data) opens with today's code."""
    from conftest import DATA, npy_payload

    archive = tmp_path / "old.dumpdb"
    shutil.copytree(DATA / "archives" / "schema_v1_c1.dumpdb", archive)
    latest = catalog_mod.latest_version()
    a = dumpdb.open(archive)
    assert a.schema_version == latest
    assert a.sql("SELECT max(version) AS v FROM schema_version")["v"][0].as_py() == latest
    assert bool(list((archive / "backups").glob("catalog-v1-*.duckdb"))) == (latest > 1)
    assert a.show("c1")["tensors"] == 42
    root = ms_case("c1_inputs_kernels_iter")
    with a:
        for row, array in a.tensors("SELECT tensor_id, source_file FROM tensors"):
            _, shape, payload = npy_payload(root / row["source_file"])
            assert array.shape == shape and array.tobytes() == payload
    # and it still takes new ingests
    report = dumpdb.ingest(ms_case("f_long_names"), archive=archive, run="f")
    assert report.ok and report.tensors_added == 66


def _in_parallel(code: str, n: int = 2) -> list:
    import subprocess
    import sys

    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(n)]
    return [(p.wait(), p.stderr.read()) for p in procs]


def test_two_processes_opening_an_old_archive_migrate_it_once(tmp_path):
    from conftest import DATA

    archive = tmp_path / "old.dumpdb"
    shutil.copytree(DATA / "archives" / "schema_v1_c1.dumpdb", archive)
    results = _in_parallel(f"import dumpdb; print(dumpdb.open({str(archive)!r}).runs().num_rows)", n=3)
    assert all(code == 0 for code, _ in results), results
    a = dumpdb.open(archive)
    versions = a.sql("SELECT version FROM schema_version ORDER BY version")["version"].to_pylist()
    assert versions == list(range(1, catalog_mod.latest_version() + 1))  # each migration once


def test_two_ingests_creating_the_same_new_archive_both_succeed(tmp_path):
    archive = tmp_path / "new.dumpdb"
    code = (f"import dumpdb, os; r = dumpdb.ingest({str(ms_case('c1_inputs_kernels_iter'))!r}, "
            f"archive={str(archive)!r}, run='c1-' + str(os.getpid())); assert r.ok")
    results = _in_parallel(code, n=2)
    assert all(c == 0 for c, _ in results), results
    a = dumpdb.open(archive)
    assert a.runs().num_rows == 2 and a.sql("SELECT count(*) AS n FROM tensors")["n"][0].as_py() == 84


def test_compare_inside_a_held_connection(tmp_path):
    archive = tmp_path / "a.dumpdb"
    dumpdb.ingest(ms_case("c1_inputs_kernels_iter"), archive=archive, run="c1")
    with dumpdb.open(archive) as a:
        results = a.compare("c1:0", "c1:2")
        # iteration 0 against iteration 2 of one run: each of iteration 0's 14 tensors pairs with
        # the same op/io/slot of iteration 2, by exact name
        tensors = {r["tensor_id"]: r for r in a.sql("SELECT * FROM tensors").to_pylist()}
        pairs = results.to_pylist()
        assert len(pairs) == 14 and {p["match_strategy"] for p in pairs} == {"exact"}
        for p in pairs:
            t, b = tensors[p["target_tensor_id"]], tensors[p["bench_tensor_id"]]
            assert (t["iteration"], b["iteration"]) == (0, 2)
            assert (t["op_name"], t["io"], t["slot"]) == (b["op_name"], b["io"], b["slot"])
            x = np.load(ms_case("c1_inputs_kernels_iter") / t["source_file"]).astype(np.float64).ravel()
            y = np.load(ms_case("c1_inputs_kernels_iter") / b["source_file"]).astype(np.float64).ravel()
            assert p["max_abs_err"] == pytest.approx(np.max(np.abs(x - y)), rel=1e-12, abs=0)
            if x.size > 1 and np.any(x) and np.any(y):  # msprobe: no cosine of one element
                assert p["cosine"] == pytest.approx(x @ y / np.sqrt(x @ x) / np.sqrt(y @ y), abs=1e-9)
        assert a.sql("SELECT count(*) AS n FROM compares")["n"][0].as_py() == 1  # still usable after


def test_hold_keeps_the_connection_that_checked_the_schema(tmp_path, monkeypatch):
    """Archive(hold=True) opens as inside ``with archive:``, on the read-only connection the
    schema check used: one connect for the open and every query. Released by close(), after
    which this process can write again; an archive upgraded on open is held on a new one."""
    archive = tmp_path / "a.dumpdb"
    dumpdb.ingest(ms_case("c1_inputs_kernels_iter"), archive=archive, run="c1")
    opened: list[bool] = []
    connect = duckdb.connect

    def counted(database=":memory:", *args, **kwargs):
        if str(database).endswith("catalog.duckdb"):
            opened.append(kwargs.get("read_only", False))
        return connect(database, *args, **kwargs)

    monkeypatch.setattr(duckdb, "connect", counted)
    a = dumpdb.Archive(archive, hold=True)
    assert a.holding and opened == [True]
    with a.reader() as con:
        assert con.execute("SELECT count(*) FROM tensors").fetchone()[0] == 42
    assert a.runs()["run"].to_pylist() == ["c1"] and opened == [True]
    a.close()
    assert not a.holding
    with a.catalog.writer() as con:  # nothing of this process holds the catalog now
        con.execute("UPDATE runs SET framework_version = 'held' WHERE run = 'c1'")
    assert opened == [True, False]
    plain = dumpdb.Archive(archive)  # without hold: the check's connection is closed
    assert not plain.holding and plain.source.take_kept() is None
    now = catalog_mod.latest_version()
    mdir = _migrations_plus(tmp_path, "SELECT 1;")
    monkeypatch.setattr(catalog_mod, "migrations_dir", lambda: mdir)
    opened.clear()
    with dumpdb.Archive(archive, hold=True) as upgraded:
        assert upgraded.schema_version == now + 1 and upgraded.holding
        assert upgraded.sql("SELECT framework_version FROM runs")["framework_version"].to_pylist() == ["held"]
    assert opened[0] is True and opened[-1] is True and False in opened  # check, migrate (writes), then held
