"""Ingest skips statistics work for payloads the archive already stores (issue 13, point 1):
their computed statistics come from the catalog, identical to computing them again."""

from __future__ import annotations

import math

from conftest import ms_case

import dumpdb
import dumpdb.ingestion.workers as workers  # statistics are computed in the worker function (load_entry)
from dumpdb.stats import STAT_COLUMNS


def _stats(a, run):
    cols = ", ".join(f'"{c}"' for c in STAT_COLUMNS)
    return {r["tensor_key"]: r for r in a.sql(
        f"SELECT tensor_key, content_hash, dtype, stats_source, {cols} FROM tensors WHERE run = ?", [run]).to_pylist()}


def _same(x, y) -> bool:
    return (x is None and y is None) or x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y))


def test_a_second_run_of_stored_payloads_computes_no_statistics_and_gets_the_same(tmp_path, monkeypatch):
    archive = tmp_path / "a.dumpdb"
    case = ms_case("e1_nan_inf_overflow")  # NaN and inf statistics too
    assert dumpdb.ingest(case, archive=archive, run="first").ok
    calls = []
    real = workers.compute_stats
    monkeypatch.setattr(workers, "compute_stats", lambda array: calls.append(array.dtype) or real(array))
    report = dumpdb.ingest(case, archive=archive, run="second")
    assert report.ok and report.tensors_added > 0
    assert calls == []  # every payload was stored already: nothing computed
    a = dumpdb.open(archive)
    first, second = _stats(a, "first"), _stats(a, "second")
    assert first.keys() == second.keys()
    assert any(isinstance(r["nan_count"], int) and r["nan_count"] > 0 for r in second.values())
    for key, row in second.items():
        assert row["stats_source"] == first[key]["stats_source"]
        for c in STAT_COLUMNS:
            assert _same(row[c], first[key][c]), (key, c)


def test_new_payloads_still_get_their_statistics_computed(tmp_path, monkeypatch):
    archive = tmp_path / "a.dumpdb"
    assert dumpdb.ingest(ms_case("c1_inputs_kernels_iter"), archive=archive, run="c1").ok
    calls = []
    real = workers.compute_stats
    monkeypatch.setattr(workers, "compute_stats", lambda array: calls.append(1) or real(array))
    assert dumpdb.ingest(ms_case("f_long_names"), archive=archive, run="f").ok
    a = dumpdb.open(archive)
    fresh = a.sql("""SELECT count(DISTINCT (content_hash, dtype)) AS n FROM tensors WHERE run = 'f'
                     AND content_hash NOT IN (SELECT content_hash FROM tensors WHERE run = 'c1')""")["n"][0].as_py()
    assert fresh > 0 and len(calls) >= fresh
    assert a.sql("SELECT count(*) AS n FROM tensors WHERE run = 'f' AND stats_source IS NULL")["n"][0].as_py() == 0
