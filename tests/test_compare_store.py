"""A compare's rows are stored from a thread while the precision rules run
(engine._verdicts_and_precision, engine._Storing), in a transaction committed only once the
rules have succeeded: the stored rows are the result table's, and a compare that raises
stores nothing. Statistics (the verdicts beside the rules) and tensor pairs (the verdicts
first)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import dumpdb
from dumpdb.compare import engine
from dumpdb.compare.engine import RESULT_COLUMNS, compare

ORACLE = Path(__file__).parent / "data" / "msprobe_oracle"
STATS = (ORACLE / "statistics_mix" / "bf16" / "dump", ORACLE / "statistics_mix" / "fp32" / "dump")


@pytest.fixture(scope="module")
def stats_archive(tmp_path_factory):
    archive = tmp_path_factory.mktemp("store") / "a.dumpdb"
    assert dumpdb.ingest(STATS[0], archive=archive, run="t").ok
    assert dumpdb.ingest(STATS[1], archive=archive, run="b").ok
    return archive


CASES = {"statistics": ("stats_archive", "t", "b", "statistics"), "tensor": ("pair_archive", "fp16", "fp32", "auto")}


def _case(request, case):
    fixture, target, bench, mode = CASES[case]
    return dumpdb.open(request.getfixturevalue(fixture)), target, bench, mode


@pytest.fixture(params=["beside", "after"])
def beside(request, monkeypatch):
    """The insert beside the rules (a compare of at most STORE_BESIDE_ROWS pairs), or after
    them (a larger one: the bound set to 0)."""
    if request.param == "after":
        monkeypatch.setattr(engine, "STORE_BESIDE_ROWS", 0)
    return request.param == "beside"


def _counts(a) -> dict[str, int]:
    return {t: a.sql(f"SELECT count(*) AS n FROM {t}").to_pylist()[0]["n"]
            for t in ("compares", "compare_results", "compare_unmatched")}


@pytest.mark.parametrize("case", CASES)
def test_stored_rows_are_the_result_tables(request, case, beside):
    """compare_results holds the returned table's RESULT_COLUMNS, row for row (EXCEPT ALL
    both ways, NaN and -0.0 as DuckDB compares them, and a repr of every value in pair
    order), as the store of the whole result table after the rules stored them; the
    compares row counts the pairs."""
    a, target, bench, mode = _case(request, case)
    out = compare(a, target, bench, mode=mode)
    assert out.compare_id is not None and out.results.num_rows > 10
    if case == "tensor":
        assert "tensor" in out.results.column("mode").to_pylist()
    else:
        assert set(out.results.column("mode").to_pylist()) == {"statistics"}
    want = out.results.select(list(RESULT_COLUMNS))
    cols = ", ".join(f'"{c}"' for c in RESULT_COLUMNS)
    with a.catalog.reader() as con:
        stored = f"SELECT {cols} FROM compare_results WHERE compare_id = {out.compare_id}"
        got = con.sql(f"{stored} ORDER BY pair_index").to_arrow_table()
        con.register("want", want)
        for left, right in ((stored, f"SELECT {cols} FROM want"), (f"SELECT {cols} FROM want", stored)):
            assert con.execute(f"SELECT count(*) FROM ({left} EXCEPT ALL {right})").fetchone()[0] == 0
        pairs = con.execute("SELECT pairs FROM compares WHERE compare_id = ?", [out.compare_id]).fetchone()[0]
    assert pairs == want.num_rows
    assert got.schema.names == want.schema.names
    for name in RESULT_COLUMNS:  # repr: NaN equal to NaN, -0.0 not equal to 0.0
        assert repr(got.column(name).to_pylist()) == repr(want.column(name).to_pylist()), name


@pytest.mark.parametrize("case", CASES)
def test_a_compare_whose_rules_raise_stores_nothing(request, case, beside, monkeypatch):
    """The rules raise, beside the insert once the rows are in the (open) transaction, or
    before any insert: the compare raises that error, nothing of it is stored, and the
    archive takes the next compare."""
    a, target, bench, mode = _case(request, case)
    before = _counts(a)
    inserted = threading.Event()
    real_insert, real_precision = engine._insert, engine._judge_precision

    def insert(*args, **kwargs):
        compare_id = real_insert(*args, **kwargs)
        inserted.set()
        return compare_id

    def failing(*args, **kwargs):
        real_precision(*args, **kwargs)
        assert inserted.wait(30) if beside else not inserted.is_set(), beside
        raise RuntimeError("rules failed")

    monkeypatch.setattr(engine, "_insert", insert)
    monkeypatch.setattr(engine, "_judge_precision", failing)
    with pytest.raises(RuntimeError, match="rules failed"):
        compare(a, target, bench, mode=mode)
    assert inserted.is_set() == beside
    assert _counts(a) == before
    monkeypatch.setattr(engine, "_insert", real_insert)
    monkeypatch.setattr(engine, "_judge_precision", real_precision)
    out = compare(a, target, bench, mode=mode)
    after = _counts(a)
    assert after["compares"] == before["compares"] + 1
    assert after["compare_results"] == before["compare_results"] + out.results.num_rows


@pytest.mark.parametrize("case", CASES)
def test_a_failing_insert_fails_the_compare(request, case, beside, monkeypatch):
    """The insert raises (a full disk, say) while the rules run: the compare raises it
    once the rules are done, and stores nothing."""
    a, target, bench, mode = _case(request, case)
    before = _counts(a)

    def insert(con, *args, **kwargs):
        con.execute("INSERT INTO compares (compare_id, target_run, bench_run, mode) VALUES (-1, 't', 'b', 'tensor')")
        raise OSError("disk full")

    monkeypatch.setattr(engine, "_insert", insert)
    with pytest.raises(OSError, match="disk full"):
        compare(a, target, bench, mode=mode)
    assert _counts(a) == before


def test_a_held_read_only_connection_is_closed_for_the_store_and_opened_again(stats_archive, beside):
    """An archive opened as a context (holding a read-only connection) stores the compare
    (DuckDB: no write while the process holds one) and holds its connection again after."""
    with dumpdb.open(stats_archive) as a:
        assert a.holding
        out = compare(a, "t", "b", mode="statistics")
        assert a.holding
        n = a.sql(f"SELECT count(*) AS n FROM compare_results WHERE compare_id = {out.compare_id}").to_pylist()[0]["n"]
    assert n == out.results.num_rows


def test_a_compare_whose_rules_raise_does_not_wait_for_the_catalog_lock(stats_archive, monkeypatch):
    """Another process holds the catalog (a read-only connection: no writer may open) while
    the store waits for its lock beside the rules; the rules raise: the compare raises that
    error at the wait's next retry, not after the archive's lock_timeout (30 s here)."""
    import subprocess
    import sys
    import time

    holder = subprocess.Popen(
        [sys.executable, "-c", "import duckdb, sys, time; con = duckdb.connect(sys.argv[1], read_only=True); "
                               "print('ready', flush=True); time.sleep(120)", str(stats_archive / "catalog.duckdb")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        a = dumpdb.Archive(stats_archive, lock_timeout=30)
        real_precision = engine._judge_precision

        def failing(*args, **kwargs):
            real_precision(*args, **kwargs)
            time.sleep(0.5)  # the store thread is waiting for the lock by now
            raise RuntimeError("rules failed")

        monkeypatch.setattr(engine, "_judge_precision", failing)
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="rules failed"):
            compare(a, "t", "b", mode="statistics")
        assert time.monotonic() - started < 10
    finally:
        holder.kill()
        holder.wait()
