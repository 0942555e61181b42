"""verify checks the catalog and every tensor -> payload reference; a damaged catalog is one
line from every command; a full disk under DuckDB is one line; orphans reported and repaired."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import duckdb
import pytest
from conftest import ms_case, npy_payload
from typer.testing import CliRunner

import dumpdb
from dumpdb.cli import app
from dumpdb.errors import CatalogCorrupt, StorageError

SRC = ms_case("c1_inputs_kernels_iter")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    root = tmp_path_factory.mktemp("verify")
    archive = root / "a.dumpdb"
    dumpdb.ingest(SRC, archive=archive, run="c1")
    bundle = dumpdb.open(archive).export("c1", root / "c1.zip")
    return archive, bundle


@pytest.fixture
def archive(pristine, tmp_path):
    dst = tmp_path / "a.dumpdb"
    shutil.copytree(pristine[0], dst)
    return dst


def raw_sql(archive: Path, sql: str) -> None:
    """Change the catalog behind dumpdb's back (no summary recorded)."""
    con = duckdb.connect(str(archive / "catalog.duckdb"))
    con.execute(sql)
    con.close()


def commands(archive: Path, bundle: Path, tmp: Path) -> dict[str, list[str]]:
    a = ["-a", str(archive)]
    return {
        "runs": ["runs", *a], "show": ["show", "c1", *a], "sql": ["sql", *a, "SELECT 1"],
        "verify": ["verify", *a], "prune": ["prune", "c1", "--keep-stats", *a], "rm": ["rm", "c1", "-y", *a],
        "gc": ["gc", *a], "migrate": ["migrate", *a], "export": ["export", "c1", *a, "--to", str(tmp / "x.zip")],
        "import": ["import", str(bundle), *a], "ingest": ["ingest", str(ms_case("f_long_names")), *a, "-q"],
        "compare": ["compare", "c1", "c1", *a], "scan": ["scan", "c1", *a],
        "first-divergence": ["first-divergence", "c1", "c1", *a],
    }


def one_line_exit_2(result) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert result.output.strip().count("\n") == 0 and "Traceback" not in result.output, result.output
    return result.output


@pytest.mark.parametrize("cut", [0, 100, 12288])
def test_truncated_catalog_is_one_line_from_every_command(archive, pristine, tmp_path, cut):
    with open(archive / "catalog.duckdb", "r+b") as f:
        f.truncate(cut)
    before = (archive / "catalog.duckdb").read_bytes()
    for name, args in commands(archive, pristine[1], tmp_path).items():
        output = one_line_exit_2(CliRunner().invoke(app, args))
        assert "catalog is damaged" in output and "catalog.duckdb" in output, (name, output)
    assert (archive / "catalog.duckdb").read_bytes() == before  # nothing "migrated" or rewritten
    with pytest.raises(CatalogCorrupt):
        dumpdb.open(archive)


def test_catalog_without_tables_is_refused_not_migrated(archive, pristine, tmp_path):
    os.remove(archive / "catalog.duckdb")
    duckdb.connect(str(archive / "catalog.duckdb")).close()  # a valid, empty DuckDB file
    before = (archive / "catalog.duckdb").read_bytes()
    for name, args in commands(archive, pristine[1], tmp_path).items():
        output = one_line_exit_2(CliRunner().invoke(app, args))
        assert "no schema_version table" in output, (name, output)
    assert (archive / "catalog.duckdb").read_bytes() == before
    assert not (archive / "backups").exists() or not list((archive / "backups").iterdir())


def test_a_dropped_table_is_catalog_corrupt(archive):
    raw_sql(archive, "DROP TABLE overflows")
    with pytest.raises(CatalogCorrupt, match="lacks the table.* overflows"):
        dumpdb.open(archive)


def test_verify_reports_a_lost_migration_record_and_changed_row_counts(archive):
    assert dumpdb.open(archive).verify().ok
    raw_sql(archive, "DELETE FROM schema_version WHERE version = 3; DELETE FROM ingest_errors; "
                     "DELETE FROM ops WHERE rowid % 2 = 0")
    report = dumpdb.open(archive).verify()
    assert not report.ok
    text = "\n".join(report.catalog_problems)
    assert "schema_version lacks the migration(s) 003_compare" in text
    assert "row counts differ from the summary recorded at the last commit" in text and "ops" in text
    r = CliRunner().invoke(app, ["verify", "-a", str(archive)])
    assert r.exit_code == 1 and "catalog" in r.output


def test_summary_follows_every_dumpdb_commit(archive):
    a = dumpdb.open(archive)
    a.prune("c1", iterations="0")
    dumpdb.ingest(ms_case("f_long_names"), archive=archive, run="f")
    a.remove_run("f")
    a.gc()
    assert a.verify().catalog_problems == []


def test_a_tensor_whose_payload_row_is_gone_is_reported(archive):
    # what gc's race produced: tensors committed against payloads it had deleted
    a = dumpdb.open(archive)
    victim = a.sql("SELECT content_hash, count(*) AS n FROM tensors GROUP BY 1 ORDER BY 2 DESC LIMIT 1").to_pylist()[0]
    raw_sql(archive, f"DELETE FROM blobs WHERE content_hash = '{victim['content_hash']}'")
    report = dumpdb.open(archive).verify()
    assert not report.ok and report.tensors_checked > 0
    hit = [r for r in report.damaged_tensors.to_pylist() if r["content_hash"] == victim["content_hash"]]
    assert len(hit) == victim["n"] and hit[0]["op_name"]
    assert {r["reason"] for r in hit} == {"payload missing: no blobs row (deleted while this tensor was committed?)"}


def test_a_tensor_whose_size_disagrees_is_reported(archive):
    raw_sql(archive, "UPDATE tensors SET nbytes = nbytes + 4 WHERE tensor_id = 3")
    report = dumpdb.open(archive).verify()
    assert [r["tensor_id"] for r in report.damaged_tensors.to_pylist()] == [3]
    assert "size: tensor says" in report.damaged_tensors["reason"][0].as_py()


def test_a_missing_large_array_shard_is_reported_missing_not_zeros(tmp_path, monkeypatch):
    import dumpdb.storage.store as store

    monkeypatch.setattr(store, "LARGE_BYTES", 4096)  # every tensor of 4 KiB or more gets its own array
    archive = tmp_path / "a.dumpdb"
    dumpdb.ingest(SRC, archive=archive, run="c1")
    a = dumpdb.open(archive)
    large = a.sql("SELECT array_path FROM arrays WHERE kind = 'tensor' LIMIT 1")["array_path"][0].as_py()
    shutil.rmtree(archive / "tensors.zarr" / large / "c")
    report = a.verify()
    assert not report.ok
    reasons = [r["reason"] for r in report.damaged_tensors.to_pylist()]
    assert any(large in r and "shard file gone" in r for r in reasons), reasons


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    for p in [path, *path.rglob("*")] if path.is_dir() else [path]:
        os.utime(p, (then, then))


def test_verify_reports_orphans_and_repair_removes_them(archive):
    a = dumpdb.open(archive)
    pack = archive / "tensors.zarr" / a.sql("SELECT min(array_path) AS p FROM arrays")["p"][0].as_py()
    orphan = pack.parent / "orphan-of-a-crash"
    shutil.copytree(pack, orphan)
    tmp = pack / "c" / "0.tmp-4242"
    tmp.write_bytes(b"partial")
    _age(orphan, 7200)
    _age(tmp, 7200)
    report = a.verify()
    assert report.ok  # orphans waste space, lose nothing
    assert sorted(o.kind for o in report.orphans) == ["array", "temp"]
    r = CliRunner().invoke(app, ["verify", "-a", str(archive)])
    assert r.exit_code == 0 and "orphans: 2 store files" in r.output
    r = CliRunner().invoke(app, ["verify", "-a", str(archive), "--repair"])
    assert r.exit_code == 0 and "removed 2" in r.output, r.output
    assert not orphan.exists() and not tmp.exists()
    assert dumpdb.open(archive).verify().orphans == []
    with dumpdb.open(archive) as a:
        for row, array in a.tensors("SELECT tensor_id, source_file FROM tensors"):
            assert array.tobytes() == npy_payload(SRC / row["source_file"])[2]


# -- a full disk while DuckDB writes its WAL ----------------------------------------------
@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux) to make writes fail with ENOSPC")
def test_enospc_while_duckdb_writes_is_one_line_and_nothing_is_lost(archive):
    wal = archive / "catalog.duckdb.wal"
    wal.symlink_to("/dev/full")  # every WAL write fails with ENOSPC
    a = dumpdb.open(archive)
    with pytest.raises(StorageError, match="No space left on device"):
        a.prune("c1")
    for args in (["rm", "c1", "-y"], ["prune", "c1", "--keep-stats"],
                 ["ingest", str(ms_case("f_long_names")), "-q"]):
        output = one_line_exit_2(CliRunner().invoke(app, [*args, "-a", str(archive)]))
        assert "No space left on device" in output, output
    wal.unlink()
    a = dumpdb.open(archive)
    assert a.sql("SELECT count(*) AS n FROM tensors WHERE pruned_at IS NOT NULL")["n"][0].as_py() == 0
    with a:
        for row, array in a.tensors("SELECT tensor_id, source_file FROM tensors WHERE run = 'c1'"):
            assert array.tobytes() == npy_payload(SRC / row["source_file"])[2]


def test_a_commit_killed_between_its_two_summary_writes_still_verifies(archive):
    """write_summary (dumpdb.catalog.connection) writes the summary twice per commit: before
    COMMIT the counts about to be committed with the last committed ones under "before",
    after COMMIT plain. Killed in between, the catalog holds either state: both verify."""
    summary = archive / "catalog.summary.json"
    record = json.loads(summary.read_text(encoding="utf-8"))
    committed = record["rows"]
    about_to_commit = {**committed, "ops": committed["ops"] + 7, "tensors": committed["tensors"] + 9}
    summary.write_text(json.dumps({**record, "rows": about_to_commit, "before": committed}), encoding="utf-8")
    assert dumpdb.open(archive).verify().catalog_problems == []  # the catalog holds "before"
    summary.write_text(json.dumps({**record, "rows": committed, "before": about_to_commit}), encoding="utf-8")
    assert dumpdb.open(archive).verify().catalog_problems == []  # the catalog holds "rows"
    # neither state: one line naming only the table that differs, with both counts
    summary.write_text(json.dumps({**record, "rows": about_to_commit, "before": {**committed, "ops": 0}}),
                       encoding="utf-8")
    problems = dumpdb.open(archive).verify().catalog_problems
    assert len(problems) == 1 and problems[0].startswith("row counts differ from the summary"), problems
    assert problems[0].endswith(f": ops {committed['ops']} (recorded {committed['ops'] + 7}), "
                                f"tensors {committed['tensors']} (recorded {committed['tensors'] + 9})"), problems


def test_a_tensor_of_a_dtype_dumpdb_does_not_know_is_reported(archive):
    """_size_mismatches: no itemsize for an unknown dtype name, so its tensors are reported
    even when their nbytes equals the payload's and the element count."""
    a = dumpdb.open(archive)
    victim = a.sql("SELECT tensor_id, nbytes FROM tensors WHERE content_hash IS NOT NULL AND nbytes > 0 "
                   "ORDER BY tensor_id LIMIT 1").to_pylist()[0]
    # one "element" per byte: a 1-byte dtype would match shape x itemsize; an unknown one never does
    raw_sql(archive, f"UPDATE tensors SET dtype = 'mystery8', shape = [{victim['nbytes']}] "
                     f"WHERE tensor_id = {victim['tensor_id']}")
    report = dumpdb.open(archive).verify()
    assert not report.ok
    bad = report.damaged_tensors.to_pylist()
    assert [r["tensor_id"] for r in bad] == [victim["tensor_id"]]
    # the unknown dtype's itemsize counts as -1, so the expected size can never match
    n = victim["nbytes"]
    assert bad[0]["reason"] == f"size: tensor says {n} bytes, payload {n}, dtype x shape {-n}"


def test_repair_waits_for_writers_and_names_them(archive):
    """verify --repair deletes files: it takes the store lock exclusively (like gc), so an
    ingest holding it shared (whose fresh files it could take for orphans) keeps it out."""
    from dumpdb.catalog.locks import SHARED, store_lock
    from dumpdb.errors import ArchiveError

    a = dumpdb.open(archive, lock_timeout=0.1)
    with store_lock(archive, SHARED, "ingest of run 'x'", timeout=5):
        assert a.verify().ok  # checking alone needs no store lock
        with pytest.raises(ArchiveError, match=r"in use by ingest of run 'x' \(pid \d+"):
            a.verify(repair=True)
    assert a.verify(repair=True).ok


def test_repair_counts_orphan_arrays_and_temp_files_removed(archive):
    """report.repaired = orphan arrays + temp files removed (leftovers.reclaim_leftovers),
    here 2 + 1, so neither count can stand in for the other."""
    a = dumpdb.open(archive)
    pack = archive / "tensors.zarr" / a.sql("SELECT min(array_path) AS p FROM arrays")["p"][0].as_py()
    orphans = [pack.parent / "orphan-of-a-crash", pack.parent / "another-orphan"]
    for orphan in orphans:
        shutil.copytree(pack, orphan)
        _age(orphan, 7200)
    tmp = pack / "c" / "0.tmp-4243"
    tmp.write_bytes(b"partial")
    _age(tmp, 7200)
    assert sorted(o.kind for o in a.verify().orphans) == ["array", "array", "temp"]
    report = a.verify(repair=True)
    assert report.repaired == 3 and report.orphans == [] and report.ok
    assert not any(o.exists() for o in orphans) and not tmp.exists() and pack.exists()


def test_a_table_that_cannot_be_read_is_one_line_naming_it(archive, monkeypatch):
    """check_catalog reads every column of every row of every table; a table DuckDB cannot
    read (a damaged block: DuckDB raises, its message several lines long) is one problem
    line naming the table and the message's first line, and the other tables still count."""
    from contextlib import contextmanager

    from dumpdb.archival.verify import check_catalog

    class DamagedOps:  # DuckDB's connection, except that scanning "ops" fails as a bad block does
        def __init__(self, con):
            self.con = con

        def execute(self, sql, *args):
            if 'FROM "ops"' in sql:
                raise duckdb.IOException("Could not read block 42 of catalog.duckdb\nLINE 1: SELECT count(*)")
            return self.con.execute(sql, *args)

        def __getattr__(self, name):
            return getattr(self.con, name)

    a = dumpdb.open(archive)
    real = a.reader

    @contextmanager
    def reader():
        with real() as con:
            yield DamagedOps(con)

    monkeypatch.setattr(a, "reader", reader)
    assert check_catalog(a) == ["table ops cannot be read (Could not read block 42 of catalog.duckdb)"]
