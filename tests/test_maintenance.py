"""prune --keep-stats, rm, gc (with pack compaction), migrate: space comes back, nothing
another run still uses is lost, statistics survive pruning."""

from __future__ import annotations

import shutil

import pytest
from conftest import DATA, file_count, ms_case, npy_files, npy_payload
from typer.testing import CliRunner

import dumpdb
from dumpdb.archival.maintenance import parse_iterations
from dumpdb.cli import app


def store_bytes(archive):
    return sum(p.stat().st_size for p in (archive / "tensors.zarr").rglob("*") if p.is_file())


def assert_exact(archive, run, src):
    with dumpdb.open(archive) as a:
        for row, array in a.tensors("SELECT tensor_id, source_file FROM tensors WHERE run = ?", [run]):
            assert array is not None and array.tobytes() == npy_payload(src / row["source_file"])[2]


def test_parse_iterations():
    assert parse_iterations("0|5-8|100-120") == [(0, 0), (5, 8), (100, 120)]
    assert parse_iterations(" 3 ") == [(3, 3)]
    for bad in ("", "a", "5-3", "1||2"):
        with pytest.raises(dumpdb.DumpdbError, match="iteration"):
            parse_iterations(bad)


def test_prune_keep_stats_then_gc(tmp_path):
    archive = tmp_path / "a.dumpdb"
    src = ms_case("e1_nan_inf_overflow")
    dumpdb.ingest(src, archive=archive, run="e1")
    a = dumpdb.open(archive)
    stats_query = "SELECT tensor_id, min, max, mean, l2norm, nan_count, pos_inf_count FROM tensors ORDER BY 1"
    before_stats, before_bytes = a.sql(stats_query), store_bytes(archive)
    assert a.prune("e1") == len(npy_files(src))
    report = a.gc()
    assert report.reclaimed > 0 and store_bytes(archive) < before_bytes / 10
    after = a.sql(stats_query).to_pylist()  # every statistics query still answers the same
    same = lambda u, v: u == v or (u != u and v != v)  # noqa: E731  (NaN == NaN here)
    assert len(after) == before_stats.num_rows
    assert all(all(same(x[k], y[k]) for k in x) for x, y in zip(after, before_stats.to_pylist()))
    with pytest.raises(dumpdb.DumpdbError, match="pruned"):
        a.tensor(1)
    assert all(arr is None for _, arr in a.tensors("SELECT tensor_id FROM tensors"))
    assert a.verify().ok


def test_prune_some_iterations_compacts_packs_and_keeps_the_rest_exact(tmp_path):
    archive = tmp_path / "a.dumpdb"
    src = ms_case("e1_nan_inf_overflow")
    dumpdb.ingest(src, archive=archive, run="e1")
    a = dumpdb.open(archive)
    n = a.prune("e1", iterations="1")
    assert n == a.sql("SELECT count(*) AS n FROM tensors WHERE iteration = 1")["n"][0].as_py()
    a.gc(compact_below=0.99)  # force compaction of every partly dead pack
    with a:
        for row, array in a.tensors("SELECT tensor_id, source_file, iteration FROM tensors"):
            if row["iteration"] == 1:
                assert array is None
            else:
                assert array.tobytes() == npy_payload(src / row["source_file"])[2]
    assert a.verify().ok


def test_shared_content_survives_pruning_and_removing_another_run(tmp_path):
    archive = tmp_path / "a.dumpdb"
    src = ms_case("c1_inputs_kernels_iter")
    dumpdb.ingest(src, archive=archive, run="a")
    dumpdb.ingest(src, archive=archive, run="b")  # same payloads: stored once
    a = dumpdb.open(archive)
    a.compare("a", "b")
    size = store_bytes(archive)
    a.prune("a")
    a.gc()
    assert store_bytes(archive) == size  # b still uses every payload
    assert_exact(archive, "b", src)
    assert a.remove_run("b") == len(npy_files(src))
    assert a.sql("SELECT count(*) AS n FROM compares")["n"][0].as_py() == 0
    report = a.gc()
    assert report.reclaimed > 0 and report.blobs_dropped > 0
    assert a.sql("SELECT count(*) AS n FROM blobs")["n"][0].as_py() == 0
    assert file_count(archive / "tensors.zarr") < 10
    # the archive still takes new data
    assert dumpdb.ingest(src, archive=archive, run="c").ok
    assert_exact(archive, "c", src)


def test_cli_prune_rm_gc_migrate(tmp_path):
    archive = tmp_path / "a.dumpdb"
    dumpdb.ingest(ms_case("c1_inputs_kernels_iter"), archive=archive, run="c1")
    runner = CliRunner()
    r = runner.invoke(app, ["prune", "c1", "-a", str(archive)])
    assert r.exit_code == 2 and "--keep-stats" in r.output
    r = runner.invoke(app, ["prune", "c1", "-a", str(archive), "--keep-stats", "--iterations", "0|2"])
    assert r.exit_code == 0 and "pruned the payloads of 28 tensors" in r.output
    r = runner.invoke(app, ["gc", "-a", str(archive)])
    assert r.exit_code == 0 and "reclaimed" in r.output
    r = runner.invoke(app, ["rm", "nope", "-a", str(archive), "--yes"])
    assert r.exit_code == 2 and "no run 'nope'" in r.output
    r = runner.invoke(app, ["rm", "c1", "-a", str(archive), "--yes"])
    assert r.exit_code == 0 and "removed run c1" in r.output
    old = tmp_path / "old.dumpdb"
    shutil.copytree(DATA / "archives" / "schema_v1_c1.dumpdb", old)
    r = runner.invoke(app, ["migrate", "-a", str(old)])
    assert r.exit_code == 0 and "applied migrations" in r.output
    r = runner.invoke(app, ["migrate", "-a", str(old)])
    assert r.exit_code == 0 and "schema is current" in r.output
