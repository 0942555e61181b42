"""Statistics-mode metrics in SQL (dumpdb.compare.stats_sql, issue 13) against the
per-pair rules of tests/compare_reference.stats_metrics: value for value, message for message."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from compare_reference import stats_metrics

import dumpdb
from dumpdb.compare.engine import compare
from dumpdb.compare.metrics import STAT_METRICS, STATS
from dumpdb.compare.stats_sql import statistics_metrics

DATA = Path(__file__).parent / "data"
ORACLE = DATA / "msprobe_oracle"

VALUES = [None, math.nan, math.inf, -math.inf, 0.0, -0.0, 1.0, -2.5, 2.5, 1e308, -1e308, 5e-324, 3.0, 1e-12]


def _same(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return a == b or (math.isnan(a) and math.isnan(b))


def _check(pairs: list[tuple[dict, dict]]) -> None:
    sides = [pa.table({"tensor_id": pa.array(range(len(pairs)), pa.int64()),
                       **{k: pa.array([p[s].get(k) for p in pairs], pa.float64()) for k in STATS}})
             for s in (0, 1)]
    index = pa.table({"pair_index": pa.array(range(len(pairs)), pa.int64()),
                      "target_tensor_id": sides[0].column("tensor_id"),
                      "bench_tensor_id": sides[1].column("tensor_id")})
    got = statistics_metrics(index, *sides).to_pylist()
    assert [r["pair_index"] for r in got] == list(range(len(pairs)))
    for (t, b), row in zip(pairs, got):
        want, message = stats_metrics(t, b)
        assert row["err_message"] == message, (t, b)
        bad = {k: (row[k], want[k]) for k in STAT_METRICS if not _same(row[k], want[k])}
        assert not bad, (t, b, bad)


def test_every_pair_of_special_values():
    """Each statistic: every (target, bench) combination of missing, NaN, +-Inf, +-0,
    overflow-sized, subnormal and ordinary values, on its own and all four at once."""
    combos = list(itertools.product(VALUES, VALUES))
    pairs = []
    for stat in STATS:
        pairs += [({stat: tv}, {stat: bv}) for tv, bv in combos]
    rot = combos[1:] + combos[:1]
    pairs += [({s: combos[(i + j) % len(combos)][0] for j, s in enumerate(STATS)},
               {s: rot[(i + 3 * j) % len(rot)][1] for j, s in enumerate(STATS)}) for i in range(len(combos))]
    _check(pairs)


def test_random_statistics():
    rng = np.random.default_rng(0)
    v = rng.standard_normal((3000, 2, 4)) * 10 ** rng.uniform(-6, 6, (3000, 2, 4))
    v[::7, 1] = v[::7, 0]                      # equal values
    v[::11, 0] *= 3                            # beyond half the magnitude
    _check([({s: float(v[i, 0, j]) for j, s in enumerate(STATS)}, {s: float(v[i, 1, j]) for j, s in enumerate(STATS)})
            for i in range(len(v))])


def test_missing_tensor_is_an_error():
    one = pa.table({"tensor_id": pa.array([1], pa.int64()), **{k: pa.array([1.0]) for k in STATS}})
    index = pa.table({"pair_index": pa.array([0], pa.int64()), "target_tensor_id": pa.array([1], pa.int64()),
                      "bench_tensor_id": pa.array([2], pa.int64())})
    with pytest.raises(ValueError, match="missing"):
        statistics_metrics(index, one, one)


CASES = {  # statistics-only corpus dumps: (target dump, bench dump)
    "statistics_L1": (ORACLE / "statistics_L1" / "bf16" / "dump", ORACLE / "statistics_L1" / "fp32" / "dump"),
    "statistics_mix": (ORACLE / "statistics_mix" / "bf16" / "dump", ORACLE / "statistics_mix" / "fp32" / "dump"),
    "statistics_L0": (ORACLE / "statistics_L0" / "bf16" / "dump", ORACLE / "statistics_L0" / "fp32" / "dump"),
    "naninf_vs_L1": (ORACLE / "naninf_L1" / "dump", ORACLE / "statistics_L1" / "fp32" / "dump"),
}


@pytest.mark.parametrize("case", CASES)
def test_engine_statistics_equal_per_pair_rules_on_the_corpus(case, tmp_path):
    """The engine's SQL path against stats_metrics on each pair's catalog statistics."""
    target, bench = CASES[case]
    archive = tmp_path / "a.dumpdb"
    assert dumpdb.ingest(target, archive=archive, run="t").ok
    assert dumpdb.ingest(bench, archive=archive, run="b").ok
    rows = compare(dumpdb.open(archive), "t", "b", mode="statistics", store_results=False).results.to_pylist()
    assert len(rows) > 10 and {r["mode"] for r in rows} == {"statistics"}
    flagged = 0
    for r in rows:
        want, message = stats_metrics({k: r[f"target_{k}"] for k in STATS}, {k: r[f"bench_{k}"] for k in STATS})
        bad = {k: (r[k], want[k]) for k in STAT_METRICS if not _same(r[k], want[k])}
        assert not bad, (r["target_name"], bad)
        if message:
            flagged += 1
            assert message in (r["err_message"] or "")
    assert any(r["max_diff"] not in (None, 0.0) for r in rows)


@pytest.mark.parametrize("case", CASES)
def test_statistics_pairs_equal_the_step_by_step_path(case, tmp_path, monkeypatch):
    """The statistics path inside DuckDB (stats_pairs: alignment, sides and metrics in one
    connection) gives the result table, unmatched tensors, summary and first departure /
    divergence that the step-by-step path gives (align_exact, then the sides paired in
    Arrow, then stats_sql.statistics_metrics; in ``auto`` mode the tensor engine's
    _compute, which sends pairs without payloads to the same query), which test_engine_statistics_equal_per_pair_rules_on_the_corpus
    checks pair by pair against stats_metrics."""
    from dumpdb.compare import engine

    target, bench = CASES[case]
    archive = tmp_path / "a.dumpdb"
    assert dumpdb.ingest(target, archive=archive, run="t").ok
    assert dumpdb.ingest(bench, archive=archive, run="b").ok
    a = dumpdb.open(archive)
    calls = []
    real = engine.statistics_pairs

    def spy(*args, **kwargs):
        found = real(*args, **kwargs)
        calls.append(found is not None)
        return found

    real_compute = engine._compute
    monkeypatch.setattr(engine, "statistics_pairs", spy)
    for rules, mode in (("precision", "statistics"), ("msprobe", "statistics"), ("precision", "auto")):
        sql = compare(a, "t", "b", mode=mode, store_results=False, rules=rules)
        assert calls[-1], "the DuckDB path did not run"
        monkeypatch.setattr(engine, "statistics_pairs", lambda *args, **kwargs: None)
        if mode == "auto":  # the tensor engine's own route for pairs without payloads
            monkeypatch.setattr(engine, "_compute_statistics_only",
                                lambda t, b, progress: real_compute(a, t, b, "auto", None, progress))
        steps = compare(a, "t", "b", mode=mode, store_results=False, rules=rules)
        monkeypatch.setattr(engine, "statistics_pairs", spy)
        assert sql.results.num_rows == steps.results.num_rows > 10
        assert sql.results.schema == steps.results.schema
        for name in sql.results.column_names:
            # repr: NaN equal to NaN, -0.0 not equal to 0.0
            assert repr(sql.results.column(name).to_pylist()) == repr(steps.results.column(name).to_pylist()), name
        assert sql.unmatched.to_pylist() == steps.unmatched.to_pylist()
        assert repr(sql.first_divergence) == repr(steps.first_divergence)
        assert repr(sql.summary) == repr(steps.summary)


@pytest.mark.parametrize("case", ["statistics_mix", "naninf_vs_L1"])
def test_verdicts_beside_the_precision_rules_equal_one_after_the_other(case, tmp_path, monkeypatch):
    """A statistics compare runs msprobe's verdicts in a second thread beside the precision
    rules (engine._verdicts_and_precision), the rules then reading the metrics' messages
    instead of the verdicts' joined onto them. The result table, summary and first
    departure / divergence equal those of the two one after the other, whichever finishes
    first (the verdicts held back until the rules are done, or the rules until the verdicts
    are), and with every message the rules may read replaced by the nan/inf mismatch note
    (the one message the rules read, and only on tensor-mode rows). The rules read the
    name masks (containers, phases, collectives) the verdicts' thread computes
    (``precision.Columns.name_masks``); one after the other, they compute them."""
    import threading
    import time

    from dumpdb.compare import engine
    from dumpdb.compare.metrics import MSG_NAN_INF_MISMATCH

    target, bench = CASES[case]
    archive = tmp_path / "a.dumpdb"
    assert dumpdb.ingest(target, archive=archive, run="t").ok
    assert dumpdb.ingest(bench, archive=archive, run="b").ok
    a = dumpdb.open(archive)
    real_judge, real_precision = engine._judge, engine._judge_precision

    def one_after_the_other(view, trows, thresholds, rules, storing=None):
        assert storing is None  # store_results=False
        view.result, view.err_message = real_judge(view, thresholds)
        return real_precision(view, trows, rules), {}

    threads: list[str] = []

    def judge(view, thresholds, delay=0.0):
        threads.append(threading.current_thread().name)
        time.sleep(delay)
        return real_judge(view, thresholds)

    def precision(view, trows, rules, masks, delay=0.0):
        threads.append("masks" if masks is not None else "no masks")
        time.sleep(delay)
        return real_precision(view, trows, rules, masks)

    def noted(**columns):  # the rules' columns with the nan/inf note as every row's message
        columns["err_message"] = np.full(len(columns["group"]), MSG_NAN_INF_MISMATCH, dtype=object)
        return real_columns(**columns)

    real_columns = engine.PrecisionColumns

    for rules in ("precision", "msprobe"):
        with monkeypatch.context() as m:
            m.setattr(engine, "_verdicts_and_precision", one_after_the_other)
            serial = compare(a, "t", "b", mode="statistics", store_results=False, rules=rules)
        assert serial.results.num_rows > 10
        assert any(r for r in serial.results.column("err_message").to_pylist())
        for verdicts_late, rules_late, note in ((0.0, 0.0, False), (0.3, 0.0, False), (0.0, 0.3, False),
                                                (0.0, 0.0, True)):
            with monkeypatch.context() as m:
                m.setattr(engine, "_judge", lambda view, th, d=verdicts_late: judge(view, th, d))
                m.setattr(engine, "_judge_precision",
                          lambda view, trows, r, masks=None, d=rules_late: precision(view, trows, r, masks, d))
                if note:
                    m.setattr(engine, "PrecisionColumns", noted)
                side = compare(a, "t", "b", mode="statistics", store_results=False, rules=rules)
            assert "masks" in threads[-2:] and any(t.startswith("dumpdb-compare-verdicts") for t in threads[-2:]), \
                threads
            assert side.results.schema == serial.results.schema
            for name in side.results.column_names:
                # repr: NaN equal to NaN, -0.0 not equal to 0.0
                assert repr(side.results.column(name).to_pylist()) == repr(serial.results.column(name).to_pylist()), \
                    (name, verdicts_late, rules_late, note)
            assert repr(side.summary) == repr(serial.summary)
            assert repr(side.first_divergence) == repr(serial.first_divergence)


@pytest.mark.parametrize("ids", ["consecutive", "shuffled_range", "sparse"])
def test_pair_rows_found_by_tensor_id(ids):
    """columns.row_positions finds each paired id's row as a hash lookup does, whether a
    side's ids are dense (consecutive, or a shuffled range with gaps: a table from id to
    row) or sparse (the hash lookup); an id the side does not hold is an error."""
    import pyarrow.compute as pc

    from dumpdb.compare.columns import row_positions as _positions

    rng = np.random.default_rng(3)
    have = {"consecutive": np.arange(40, 1040), "shuffled_range": rng.permutation(np.arange(5, 3005))[:1000],
            "sparse": rng.choice(10**7, 1000, replace=False)}[ids].astype(np.int64)
    column = pa.chunked_array([pa.array(have[:300]), pa.array(have[300:])])
    wanted = pa.chunked_array([pa.array(rng.permutation(have)[:700])])
    expected = pc.index_in(wanted, value_set=column).combine_chunks().to_numpy()
    assert np.array_equal(_positions(column, wanted), expected)
    # the smallest id between the side's least and greatest that it does not hold (the first
    # gap of the sorted ids: np.setdiff1d over an arange of 10**7 ids cost ~17 CPU s for "sparse")
    held = np.sort(have)
    missing = int(held[np.flatnonzero(np.diff(held) > 1)[0]] + 1) if ids != "consecutive" else 1040
    for absent in (missing, int(have.max()) + 1, int(have.min()) - 1):
        with pytest.raises(ValueError, match="not among"):
            _positions(column, pa.chunked_array([pa.array([int(have[0]), absent], pa.int64())]))


def test_pair_rows_taken_as_slices_where_they_run_in_order():
    """stats_pairs._take gives table.take's rows (values, types, row count), one chunk per
    column, for rows in a few runs of consecutive rows (slices concatenated), a shuffle,
    every row but one (the runs still cover nine tenths), too few rows, and none."""
    from dumpdb.compare.stats_pairs import _take

    n = 3000
    table = pa.table({"tensor_id": pa.chunked_array([pa.array(np.arange(1000)), pa.array(np.arange(1000, n))]),
                      "op_name": pa.chunked_array([pa.array([f"op{k}" for k in range(1000)]),
                                                   pa.array([None if k % 7 == 0 else f"op{k}" for k in range(1000, n)])]),
                      "shape": pa.array([[k % 5, 2] for k in range(n)], pa.list_(pa.int64()))})
    rng = np.random.default_rng(5)
    runs = np.concatenate([np.arange(0, 900), np.arange(1500, n), np.arange(900, 1500)])
    cases = {"runs": runs, "shuffled": rng.permutation(n), "all but one": np.delete(np.arange(n), 1234),
             "a tenth": np.arange(0, 300), "none": np.zeros(0, np.int64)}
    for name, rows in cases.items():
        rows = rows.astype(np.int64)
        got = _take(table, rows)
        assert got.schema == table.schema and got.equals(table.take(pa.array(rows))), name
        assert all(column.num_chunks <= 1 for column in got.columns), name


def test_pairs_order_from_the_whole_sides_order_equals_the_paired_rows_order():
    """stats_pairs._pairs_order (the pairs' order from execution_order of every target row,
    sorted while DuckDB pairs them) equals execution_order of the paired rows taken in pair
    order, on random sides (several iterations, ranks and graphs whose first timestamps
    order them, NULL positions, timestamps and slots, shuffled rows) paired in a random
    order; and gives None where the pairs miss a target row or hold one twice (the paired
    rows' graphs may then start at other timestamps: execution_order of them decides)."""
    from dumpdb.compare.columns import ORDER_KEYS, execution_order
    from dumpdb.compare.stats_pairs import _pairs_order

    rng = np.random.default_rng(11)
    for _ in range(40):
        n = int(rng.integers(1, 400))

        def nullable(values, p):
            return pa.array([None if rng.random() < p else int(v) for v in values], pa.int64())

        table = pa.table({"iteration": nullable(rng.integers(0, 3, n), 0.05),
                          "rank": nullable(rng.integers(0, 2, n), 0.05),
                          "graph_id": nullable(rng.integers(0, 4, n), 0.1),
                          "position": nullable(rng.integers(0, 50, n), 0.2),
                          "timestamp": nullable(rng.integers(0, 1000, n), 0.2),
                          "call_index": nullable(rng.integers(0, 5, n), 0.1),
                          "io": pa.array(rng.choice(["input", "output", "parameter", None], n).tolist(), pa.string()),
                          "slot": nullable(rng.integers(0, 3, n), 0.1),
                          "tensor_id": pa.array(rng.permutation(n * 3)[:n].astype(np.int64))})
        assert set(ORDER_KEYS) <= set(table.column_names)
        everything = execution_order(table)
        rows = rng.permutation(n).astype(np.int64)  # every row once, in the pairs' order
        want = execution_order(table.take(pa.array(rows)))
        assert np.array_equal(_pairs_order(rows, everything), want)
        assert _pairs_order(rows, None) is None
        if n > 1:
            twice = rows.copy()
            twice[0] = twice[1]
            assert _pairs_order(twice, everything) is None
            assert _pairs_order(rows[1:], everything) is None


def test_select_rows_query_gives_the_rows_in_table_order_as_one_chunk():
    """engine._one_thread_rows (select_rows' query) gives a join's rows in the table's row
    order, one Arrow chunk a column, where DuckDB's threads would hand them back as
    several chunks out of order, also for two queries run at once (select_sides); the
    instance's thread count is set back after."""
    from dumpdb.compare import engine

    n = 400_000
    con = duckdb.connect()
    con.execute("SET threads = 4")
    con.execute(f"CREATE TABLE t AS SELECT range AS id, range % 7 AS k FROM range({n})")
    con.execute("CREATE TABLE e AS SELECT range AS k, range * 10 AS pos FROM range(7)")
    query = "SELECT t.id, e.pos FROM t LEFT JOIN e ON e.k = t.k WHERE t.id >= ?"
    rows, = engine._one_thread_rows(con, [(query, [0])])
    assert [c.num_chunks for c in rows.columns] == [1, 1]
    assert np.array_equal(rows.column("id").to_numpy(), np.arange(n))
    assert np.array_equal(rows.column("pos").to_numpy(), np.arange(n) % 7 * 10)
    assert con.sql("SELECT current_setting('threads')").fetchall()[0][0] == 4
    # two queries at once (a compare's two sides, select_sides): each as it gives alone
    both = engine._one_thread_rows(con, [(query, [n // 2]), (query, [n // 3])])
    assert [[c.num_chunks for c in t.columns] for t in both] == [[1, 1], [1, 1]]
    assert np.array_equal(both[0].column("id").to_numpy(), np.arange(n // 2, n))
    assert np.array_equal(both[1].column("id").to_numpy(), np.arange(n // 3, n))
    assert con.sql("SELECT current_setting('threads')").fetchall()[0][0] == 4
    # a relation registered on the connection alone (an exported bundle's tables): a cursor
    # does not see it, so that query runs on the connection itself, the same rows
    con.register("_t_arrow", con.sql("SELECT * FROM t").to_arrow_table())
    con.execute("CREATE VIEW tv AS SELECT * FROM _t_arrow")
    views = engine._one_thread_rows(con, [(query.replace("FROM t ", "FROM tv t "), [n // 2]),
                                          (query.replace("FROM t ", "FROM tv t "), [n // 3])])
    assert [v.column("id").to_pylist() for v in views] == [b.column("id").to_pylist() for b in both]
    assert con.sql("SELECT current_setting('threads')").fetchall()[0][0] == 4
