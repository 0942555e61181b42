"""The exact alignment in SQL (dumpdb.compare.align_sql, issue 13) gives align()'s answer."""

from __future__ import annotations

from pathlib import Path
from unittest.mock import patch

import duckdb
import pyarrow as pa
import pytest
from conftest import ms_case

import dumpdb
import dumpdb.compare.engine as engine
from dumpdb.compare import align_sql, stats_pairs
from dumpdb.compare.align import STRATEGIES, align
from dumpdb.compare.align_sql import align_exact
from dumpdb.compare.columns import row_positions
from dumpdb.compare.engine import Selection
from dumpdb.compare.stats_sql import statistics_sql

ORACLE = Path(__file__).parent / "data" / "msprobe_oracle"


def _tables(archive, t: str, b: str):
    a = dumpdb.open(archive)
    with a.reader() as con:
        return engine.select_rows(con, Selection(t)), engine.select_rows(con, Selection(b))


def _same(x, y) -> None:
    assert x.pairs.equals(y.pairs)
    assert x.unmatched_target.equals(y.unmatched_target)
    assert x.unmatched_bench.equals(y.unmatched_bench)


CASES = {
    "statistics_L1": (ORACLE / "statistics_L1" / "bf16" / "dump", ORACLE / "statistics_L1" / "fp32" / "dump"),
    "statistics_mix_vs_L1": (ORACLE / "statistics_mix" / "bf16" / "dump", ORACLE / "statistics_L1" / "fp32" / "dump"),
    "tensor_L1": (ORACLE / "tensor_L1" / "bf16" / "dump", ORACLE / "tensor_L1" / "fp32" / "dump"),
    "mindspore_fp16_vs_fp32": (ms_case("d2_compare_fp16_bf16_iter0"), ms_case("d1_compare_fp32_iter0")),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("group_by", [(), ("iteration", "rank")])
def test_equals_align_on_the_corpus(case, group_by, tmp_path):
    target, bench = CASES[case]
    archive = tmp_path / "a.dumpdb"
    assert dumpdb.ingest(target, archive=archive, run="t").ok
    assert dumpdb.ingest(bench, archive=archive, run="b").ok
    trows, brows = _tables(archive, "t", "b")
    only_exact = align_exact(trows, brows, group_by=group_by, strategies=("exact",))
    assert only_exact is not None
    _same(only_exact, align(trows, brows, group_by=group_by, strategies=("exact",)))
    full = align_exact(trows, brows, group_by=group_by, strategies=STRATEGIES)
    if full is not None:  # exact left nothing to a later strategy
        _same(full, align(trows, brows, group_by=group_by))
    else:
        assert only_exact.unmatched_target.num_rows and only_exact.unmatched_bench.num_rows
    if case == "statistics_L1":  # same model, same settings: exact pairs everything
        assert full is not None and full.pairs.num_rows > 10


def _rows(names: list[tuple], start: int) -> pa.Table:
    cols = ("op_name", "io", "slot", "shape", "iteration", "timestamp")
    data = {c: [r[i] for r in names] for i, c in enumerate(cols)}
    n = len(names)
    return pa.table({
        "tensor_id": pa.array(range(start, start + n), pa.int64()), "op_name": data["op_name"],
        "scope_name": [None] * n, "io": data["io"], "slot": pa.array(data["slot"], pa.int32()),
        "slot_path": pa.array([None] * n, pa.string()), "arg_name": pa.array([None] * n, pa.string()),
        "shape": pa.array(data["shape"], pa.list_(pa.int64())), "iteration": pa.array(data["iteration"], pa.int64()),
        "rank": pa.array([None] * n, pa.int32()), "graph_id": pa.array([0] * n, pa.int32()),
        "position": pa.array([None] * n, pa.int64()), "timestamp": pa.array(data["timestamp"], pa.int64()),
    })


def test_synthetic_counter_names_repeats_nulls_and_unequal_counts():
    """-opN names need equal element counts; repeated keys pair k-th with k-th in execution
    order (timestamps reversed against tensor_id); NULL op names and slots pair; a key
    with unequal counts stays unpaired."""
    target = _rows([("Net/Add-op1", "output", 0, [2, 3], 0, 50), ("Net/Add-op1", "output", 0, [6], 0, 40),
                    ("relu", "input", 0, [4], 0, 30), ("relu", "input", 0, [4], 0, 20),
                    (None, "output", None, [1], 0, 10), ("dup", "output", 0, [1], 0, 5),
                    ("dup", "output", 0, [1], 0, 6), ("solo", "output", 0, [], 1, 7)], 100)
    bench = _rows([("Net/Add-op1", "output", 0, [7], 0, 1), ("relu", "input", 0, [4], 0, 2),
                   ("relu", "input", 0, [4], 0, 3), (None, "output", None, [2], 0, 4),
                   ("dup", "output", 0, [1], 0, 5), ("solo", "output", 0, [], 1, 9)], 500)
    for group_by in ((), ("iteration",)):
        got = align_exact(target, bench, group_by=group_by)
        assert got is not None
        _same(got, align(target, bench, group_by=group_by, strategies=("exact",)))
        assert got.pairs.num_rows == 4 and got.unmatched_target.num_rows == 4


def test_keys_held_once_pair_without_the_window():
    """No key held twice on both sides (align_sql._pair's grouped path): -opN names still
    need equal element counts, NULL op names and slots pair, a key held twice on one side
    only stays unpaired; the same pairs and unmatched tensors as align."""
    target = _rows([("Net/Add-op1", "output", 0, [2, 3], 0, 50), ("Net/Mul-op2", "output", 0, [6], 0, 40),
                    ("relu", "input", 0, [4], 0, 30), (None, "output", None, [1], 0, 10),
                    ("dup", "output", 0, [1], 0, 5), ("dup", "output", 0, [1], 0, 6)], 100)
    bench = _rows([("Net/Add-op1", "output", 0, [7], 0, 1), ("Net/Mul-op2", "output", 0, [3, 2], 0, 2),
                   ("relu", "input", 0, [4], 0, 3), (None, "output", None, [2], 0, 4),
                   ("dup", "output", 0, [1], 0, 5)], 500)
    for group_by in ((), ("iteration",)):
        got = align_exact(target, bench, group_by=group_by)
        assert got is not None
        _same(got, align(target, bench, group_by=group_by, strategies=("exact",)))
        assert got.pairs.num_rows == 3 and got.unmatched_target.num_rows == 3


def test_declines_when_a_later_strategy_has_work():
    target = _rows([("a", "output", 0, [1], 0, 1), ("x", "output", 0, [1], 0, 2)], 1)
    bench = _rows([("a", "output", 0, [1], 0, 1), ("y", "output", 0, [1], 0, 2)], 10)
    assert align_exact(target, bench, strategies=STRATEGIES) is None
    assert align_exact(target, bench, strategies=("order", "exact")) is None
    assert align_exact(target, bench, strategies=("exact",)).pairs.num_rows == 1


def _raw_sql(archive: Path, sql: str) -> None:
    """Change the catalog behind dumpdb's back (a bench tensor's statistics)."""
    import duckdb
    con = duckdb.connect(str(archive / "catalog.duckdb"))
    con.execute(sql)
    con.close()


def _compare_both_paths(archive: Path, monkeypatch) -> tuple:
    """The statistics compare through the SQL fast path and through align() (the engine
    with statistics_pairs declining): result rows (without compare_id) and summaries."""
    fast = engine.compare(dumpdb.open(archive), "t", "b", mode="statistics", store_results=False)
    with monkeypatch.context() as m:
        m.setattr(engine, "statistics_pairs", lambda *a, **k: None)
        full = engine.compare(dumpdb.open(archive), "t", "b", mode="statistics", store_results=False)
    for outcome in (fast, full):
        outcome.results = outcome.results.drop_columns(["compare_id"])
    return fast, full


def test_a_pair_that_looks_wrong_without_a_better_partner_keeps_the_fast_path(tmp_path, monkeypatch):
    """Real msprobe statistics (bf16 vs fp32, every tensor paired by exact): one bench
    tensor's statistics made unrelated to its target's. align() keeps the pair (no other
    bench tensor fits the target), so the SQL path must not decline for it, and the
    compare rows equal align()'s; with two bench tensors of one kind swapping statistics
    (each fits the other's target: align() may take their family back) the SQL path
    declines."""
    archive = tmp_path / "a.dumpdb"
    assert dumpdb.ingest(ORACLE / "statistics_L1" / "bf16" / "dump", archive=archive, run="t").ok
    assert dumpdb.ingest(ORACLE / "statistics_L1" / "fp32" / "dump", archive=archive, run="b").ok
    trows, brows = _tables(archive, "t", "b")
    assert align_exact(trows, brows, strategies=STRATEGIES) is not None
    # one pair looks wrong: the bench tensor 100 times larger and shifted
    victim = brows.filter(pa.compute.greater(brows.column("l2norm"), 0)).slice(3, 1).to_pylist()[0]
    _raw_sql(archive, "UPDATE tensors SET l2norm = l2norm * 100, mean = mean * 100 + 1, min = min * 100 - 1, "
                      f"max = max * 100 + 1 WHERE tensor_id = {victim['tensor_id']}")
    trows, brows = _tables(archive, "t", "b")
    full_align = align(trows, brows)
    exact = align_exact(trows, brows, strategies=STRATEGIES)
    assert exact is not None  # the old check declined here: one pair farther than LOOKS_WRONG
    _same(exact, full_align)
    assert full_align.suspects.num_rows == 0 and not any(full_align.pairs.column("realigned").to_pylist())
    fast, full = _compare_both_paths(archive, monkeypatch)
    assert fast.results.equals(full.results)
    assert fast.summary["suspected_mispairs"] == full.summary["suspected_mispairs"] == []
    row = [r for r in fast.results.to_pylist() if r["bench_tensor_id"] == victim["tensor_id"]]
    assert len(row) == 1 and row[0]["result"] != "pass"  # the changed pair is compared, not lost

    # two bench tensors of one kind swap statistics: each fits the other's target
    kinds = brows.group_by(["op_type", "dtype", "io"]).aggregate([("tensor_id", "list")]).to_pylist()
    same_shape = None
    by_id = {r["tensor_id"]: r for r in brows.to_pylist()}
    for k in kinds:
        ids = [i for i in k["tensor_id_list"] if by_id[i]["l2norm"]]
        for x, y in zip(ids, ids[1:]):
            a, b = by_id[x], by_id[y]
            if a["shape"] == b["shape"] and abs(a["l2norm"] - b["l2norm"]) > 0.5 * max(a["l2norm"], b["l2norm"]):
                same_shape = (a, b)
                break
        if same_shape:
            break
    assert same_shape is not None
    for me, other in (same_shape, same_shape[::-1]):
        _raw_sql(archive, f"UPDATE tensors SET l2norm = {other['l2norm']!r}, mean = {other['mean']!r}, "
                          f"min = {other['min']!r}, max = {other['max']!r} WHERE tensor_id = {me['tensor_id']}")
    trows, brows = _tables(archive, "t", "b")
    assert align_exact(trows, brows, strategies=STRATEGIES) is None  # align() decides (the compare then runs it)


def test_random_statistics_take_the_sql_path_only_where_align_keeps_every_exact_pair():
    """Small runs of one msprobe family (relu calls of two shapes, float/int dtypes) whose
    bench statistics are perturbed by rounding, scaled (looks wrong, no better partner)
    or copied from another call (a better partner may sit in align's window): whenever
    the SQL path answers, align() gives the same pairs, nothing re-aligned, no suspect."""
    import numpy as np

    rng = np.random.default_rng(7)

    def side(n, stats, start, ts, dtypes, shapes):
        return pa.table({
            "tensor_id": pa.array(range(start, start + n), pa.int64()), "op_type": ["relu"] * n,
            "op_name": [f"Functional.relu.{i}.forward" for i in range(n)], "scope_name": [None] * n,
            "io": ["output"] * n, "slot": pa.array([0] * n, pa.int32()), "slot_path": pa.array([None] * n, pa.string()),
            "arg_name": pa.array([None] * n, pa.string()), "shape": pa.array(shapes, pa.list_(pa.int64())),
            "iteration": pa.array([0] * n, pa.int64()), "rank": pa.array([None] * n, pa.int32()),
            "graph_id": pa.array([0] * n, pa.int32()), "position": pa.array([None] * n, pa.int64()),
            "timestamp": pa.array(ts, pa.int64()), "dtype": dtypes,
            **{c: stats[:, k] for k, c in enumerate(("l2norm", "mean", "min", "max"))}})

    taken = declined = 0
    for _ in range(30):
        n = int(rng.integers(4, 40))
        st = rng.standard_normal((n, 4))
        st[:, 0] = np.abs(st[:, 0]) * rng.choice([0.001, 1, 10], n)
        bst = st * (1 + 1e-3 * rng.standard_normal((n, 4)))
        for _ in range(int(rng.integers(1, 4))):
            i, j = rng.integers(0, n, 2)
            bst[i] = st[j] * (1 + 1e-4) if rng.random() < 0.5 else bst[i] * 50 + 1
        shapes = [[int(rng.choice([2, 3]))] for _ in range(n)]
        dtypes = list(rng.choice(["float32", "float16"], n))
        ts = rng.permutation(n).tolist()
        target = side(n, st, 0, ts, dtypes, shapes)
        bench = side(n, bst, 1000, ts, [d if rng.random() > 0.05 else "int32" for d in dtypes], shapes)
        fast = align_exact(target, bench, strategies=STRATEGIES)
        if fast is None:
            declined += 1
            continue
        taken += 1
        full = align(target, bench)
        _same(fast, full)
        assert full.suspects.num_rows == 0 and not any(full.pairs.column("realigned").to_pylist())
    assert taken and declined  # both ways were exercised


def test_family_count_still_checked_when_every_tensor_pairs_but_an_op_type_differs():
    """Every tensor of both sides pairs by its key. With the same op_type on both sides
    each family has as many ops on both (the SQL path answers, as align); with one bench op
    a Cast (a cast-only op has no family) family Net_Add has two ops on the target and one
    on the bench, and the SQL path leaves the decision to align() (None)."""
    def side(op_types: list[str], start: int) -> pa.Table:
        rows = _rows([("Net/Add-op1", "output", 0, [2], 0, 1), ("Net/Add-op2", "output", 0, [2], 0, 2)], start)
        rows = rows.append_column("op_type", pa.array(op_types, pa.string()))
        for c in ("l2norm", "mean", "min", "max"):
            rows = rows.append_column(c, pa.array([1.0, 2.0], pa.float64()))
        return rows

    target = side(["Add", "Add"], 1)
    same = align_exact(target, side(["Add", "Add"], 10))
    assert same is not None and same.pairs.num_rows == 2
    _same(same, align(target, side(["Add", "Add"], 10)))
    assert align_exact(target, side(["Add", "Cast"], 10)) is None


def test_keys_held_once_on_both_sides_pair_by_one_join():
    """Every key met on both sides held once on each (align_sql._pair's one join, no
    grouping): -opN names still need equal element counts, NULL op names and slots pair,
    a key on one side only stays unpaired; the same answer as align. A key held 40 times on
    both sides (1,600 joined rows, more than either side's rows) leaves the join for the
    execution-order rule, still align's answer."""
    target = _rows([("Net/Add-op1", "output", 0, [2, 3], 0, 50), ("Net/Mul-op2", "output", 0, [6], 0, 40),
                    ("relu", "input", 0, [4], 0, 30), (None, "output", None, [1], 0, 10),
                    ("only_target", "output", 0, [1], 0, 5)], 100)
    bench = _rows([("Net/Add-op1", "output", 0, [7], 0, 1), ("Net/Mul-op2", "output", 0, [3, 2], 0, 2),
                   ("relu", "input", 0, [4], 0, 3), (None, "output", None, [2], 0, 4),
                   ("only_bench", "output", 0, [1], 0, 5)], 500)
    queries: list[str] = []

    class Recording:  # the real connection, recording the statements run on it
        def __init__(self, con):
            self.con = con

        def execute(self, sql, *args):
            queries.append(sql)
            return self.con.execute(sql, *args)

        def __getattr__(self, name):
            return getattr(self.con, name)

    for group_by in ((), ("iteration",)):
        got = align_exact(target, bench, group_by=group_by)
        assert got is not None
        _same(got, align(target, bench, group_by=group_by, strategies=("exact",)))
        assert got.pairs.num_rows == 3 and got.unmatched_target.num_rows == 2
        queries.clear()
        con = duckdb.connect()
        assert align_sql.exact_paired(Recording(con), target, bench, group_by=group_by) is not None
        made = [q for q in queries if "CREATE TEMP TABLE paired" in q]
        assert len(made) == 1 and "GROUP BY" not in made[0] and "OVER" not in made[0]
        assert con.sql("SELECT count(*) FROM paired").fetchall()[0][0] == 3
        con.close()
    many_t = _rows([("loop", "output", 0, [4], 0, 100 - k) for k in range(40)], 100)
    many_b = _rows([("loop", "output", 0, [4], 0, k) for k in range(40)], 500)
    got = align_exact(many_t, many_b)
    assert got is not None and got.pairs.num_rows == 40
    _same(got, align(many_t, many_b, strategies=("exact",)))


def test_order_numbers_are_align_execution_order():
    """align_sql._order_numbers (the better-partner window's one integer) numbers rows as
    DuckDB's ORDER BY of align's execution order (iteration, rank, graph_id, position,
    timestamp, tensor_id, NULLs last): rows in order, shuffled, with NULLs and constant
    keys, one row and none."""
    import numpy as np

    rng = np.random.default_rng(3)
    n = 300

    def col(values, null_share, typ):
        return pa.array([None if rng.random() < null_share else int(v) for v in values], typ)

    base = {"iteration": col(rng.integers(0, 2, n), 0.1, pa.int64()), "rank": pa.nulls(n, pa.int32()),
            "graph_id": col(np.zeros(n), 0.0, pa.int32()), "position": col(rng.integers(0, 50, n), 0.2, pa.int32()),
            "timestamp": col(rng.integers(0, 9, n), 0.3, pa.int64()),
            "tensor_id": pa.array(rng.permutation(n) + 7, pa.int64())}
    order = ", ".join(f'"{c}" ASC NULLS LAST' for c in align_sql._ORDER)
    for rows in (pa.table(base), pa.table(base).slice(0, 1), pa.table(base).slice(0, 0)):
        numbered = duckdb.sql(f"SELECT tensor_id, row_number() OVER (ORDER BY {order}) - 1 AS k FROM rows").to_arrow_table()
        expected = dict(zip(numbered.column("tensor_id").to_pylist(), numbered.column("k").to_pylist()))
        in_order = duckdb.sql(f"SELECT * FROM rows ORDER BY {order}").to_arrow_table()  # one pass
        for table in (rows, in_order):
            got = align_sql._order_numbers(table).tolist()
            assert got == [expected[i] for i in table.column("tensor_id").to_pylist()]


def _reversed_sql(*args) -> str:
    """stats_sql.statistics_sql's query, its rows in reverse pair order."""
    return f"SELECT * FROM ({statistics_sql(*args)}) ORDER BY pair_index DESC"


def test_content_check_over_the_pairs_rows_equals_the_one_in_the_join():
    """exact_paired's ``sides`` (the content check computed over the pairs' rows side by
    side, as statistics_pairs gives them) yields, in table ``checked``, the rows of the
    ``paired`` table (ids, ``wrong``, ``other_op``) that _pair's join computes where either
    flag is true, and statistics_pairs declines exactly where
    align_exact does: random runs with shuffled bench rows, other shapes, dtypes, op types
    and graphs, NULL, NaN, +-Inf and zero statistics, with and without a dtype column."""
    import numpy as np

    from dumpdb.compare.stats_pairs import statistics_pairs

    rng = np.random.default_rng(11)
    specials = [np.nan, np.inf, -np.inf, 0.0, -0.0]

    def side(n, stats, start, shapes, dtypes, op_types, graphs, dtype):
        cols = {
            "tensor_id": pa.array(range(start, start + n), pa.int64()), "op_type": op_types,
            "op_name": [f"Functional.{o}.{i}.forward" for i, o in enumerate(op_types)], "scope_name": [None] * n,
            "io": ["output"] * n, "slot": pa.array([0] * n, pa.int32()), "slot_path": pa.array([None] * n, pa.string()),
            "arg_name": pa.array([None] * n, pa.string()), "shape": pa.array(shapes, pa.list_(pa.int64())),
            "iteration": pa.array([0] * n, pa.int64()), "rank": pa.array([None] * n, pa.int32()),
            "graph_id": pa.array(graphs, pa.int32()), "position": pa.array(range(n), pa.int32()),
            "timestamp": pa.array(range(n), pa.int64()), "call_index": pa.array([None] * n, pa.int32()),
            **{c: pa.array(stats[:, k], pa.float64(), mask=np.isnan(stats[:, k]) & (stats[:, k] != stats[:, k]) &
                           (rng.random(n) < 0.3))
               for k, c in enumerate(("l2norm", "mean", "min", "max"))}}
        if dtype:
            cols["dtype"] = dtypes
        return pa.table(cols)

    checked = 0
    for case in range(60):
        n = int(rng.integers(2, 30))
        st = rng.standard_normal((n, 4))
        st[:, 0] = np.abs(st[:, 0]) * rng.choice([0.001, 1, 10], n)
        st[rng.random((n, 4)) < 0.1] = rng.choice(specials)
        bst = st * (1 + 1e-3 * rng.standard_normal((n, 4)))
        for _ in range(int(rng.integers(0, 4))):
            i, j = rng.integers(0, n, 2)
            bst[i] = st[j] * (1 + 1e-4) if rng.random() < 0.5 else bst[i] * 50 + 1
        shapes = [[int(rng.choice([2, 3]))] if rng.random() > 0.1 else None for _ in range(n)]
        dtypes = [str(d) if rng.random() > 0.1 else None for d in rng.choice(["float32", "float16"], n)]
        ops = ["relu"] * n
        graphs = [0] * n
        dtype = case % 3 != 0
        target = side(n, st, 0, shapes, dtypes, ops, graphs, dtype)
        bench = side(n, bst, 1000, [s if rng.random() > 0.1 else [5] for s in shapes],
                     [d if rng.random() > 0.1 else "int32" for d in dtypes], ops,
                     [g if rng.random() > 0.05 else 1 for g in graphs], dtype)
        bench = bench.take(pa.array(rng.permutation(n)))
        cons = [duckdb.connect(), duckdb.connect()]
        for con in cons:
            con.register("target", target)
            con.register("bench", bench)
        align_sql._pair(cons[0], (), (n, n))

        def sides(paired, target=target, bench=bench):
            paired = paired.take(pa.array(rng.permutation(paired.num_rows)))  # any order of the pairs
            ids = [t.column("tensor_id").to_pylist() for t in (target, bench)]
            rows = [[ids[k].index(i) for i in paired.column(c).to_pylist()]
                    for k, c in enumerate(("target_tensor_id", "bench_tensor_id"))]
            return target.take(pa.array(rows[0])), bench.take(pa.array(rows[1]))

        _, ids = align_sql._pair(cons[1], (), (n, n), check=False)
        assert ids is not None and sorted(ids.column("target_tensor_id").to_pylist()) == list(range(n))
        assert align_sql._checked_pairs(cons[1], sides, ids)
        got = [cons[0].sql("SELECT * FROM paired WHERE wrong OR other_op ORDER BY target_tensor_id").fetchall(),
               cons[1].sql("SELECT * FROM checked ORDER BY target_tensor_id").fetchall()]
        assert got[0] == got[1] and all(len(r) == 4 for r in got[0])
        checked += len(got[0]) > 0
        fast = statistics_pairs(target, bench, target_columns=target.column_names,
                                bench_columns=bench.column_names)
        assert (fast is None) == (align_exact(target, bench, strategies=STRATEGIES) is None)
        if fast is not None:
            # the metrics query's rows in another order than the pairs' (it has no ORDER BY):
            # statistics_pairs puts them back in pair order (repr: NaN equal to NaN)
            with patch.object(stats_pairs, "statistics_sql", _reversed_sql):
                shuffled = statistics_pairs(target, bench, target_columns=target.column_names,
                                            bench_columns=bench.column_names)
            assert shuffled is not None
            assert [repr(x.to_pylist()) for x in shuffled[1:]] == [repr(x.to_pylist()) for x in fast[1:]]
    assert checked > 10  # pairs that look wrong or are of another op were checked


def test_positional_pairs_are_the_joins_pairs():
    """align_sql._positional_pairs (sides of as many rows, each in execution order, row i of
    one with row i's key on the other) pairs what _pair's join pairs: repeated keys (the
    k-th with the k-th), NULL keys, -opN names (their shapes equal) and other names whose
    shapes differ (no element count in their key); it declines (None) when a key, an -opN
    name's shape or the row count differs, or a side's rows are not in execution order."""
    import numpy as np

    rng = np.random.default_rng(29)
    names = ["Net/Add-op1", "Net/Mul-op22", "relu", "dup", None]

    def side(keys, start, shapes):
        return _rows([(name, io, slot, shape, it, 10 * k) for k, ((name, io, slot, it), shape)
                      in enumerate(zip(keys, shapes))], start)

    def join_pairs(target, bench):
        con = duckdb.connect()
        con.register("target", target)
        con.register("bench", bench)
        align_sql._pair(con, (), (target.num_rows, bench.num_rows), check=False)
        return sorted(con.sql("SELECT target_tensor_id, bench_tensor_id FROM paired").fetchall())

    paired = declined = 0
    for case in range(80):
        n = int(rng.integers(1, 25))
        keys = [(names[rng.integers(0, len(names))], ["input", "output"][rng.integers(0, 2)],
                 None if rng.random() < 0.1 else int(rng.integers(0, 2)), int(rng.integers(0, 2))) for _ in range(n)]
        keys.sort(key=lambda k: k[3])  # iteration first in execution order, then the timestamps side() gives
        shapes = [None if rng.random() < 0.1 else [int(rng.integers(1, 4))] for _ in range(n)]
        target = side(keys, 100, shapes)
        change = case % 4
        bkeys, bshapes = list(keys), list(shapes)
        i = int(rng.integers(0, n))
        if change == 1:  # another key at one place
            bkeys[i] = ("other", *keys[i][1:])
        elif change == 2:  # another shape at one place: declines only for an -opN name
            bshapes[i] = [9, 9]
        bench = side(bkeys, 1000, bshapes)
        if change == 3 and n > 1:  # the bench's rows out of execution order
            bench = bench.take(pa.array(np.roll(np.arange(n), 1)))
        got = align_sql._positional_pairs(target, bench, ())
        counter = keys[i][0] is not None and "-op" in keys[i][0]
        if change == 1 or (change == 2 and counter) or (change == 3 and n > 1):
            assert got is None
            declined += 1
            continue
        assert got is not None
        assert sorted(zip(got.column("target_tensor_id").to_pylist(),
                          got.column("bench_tensor_id").to_pylist())) == join_pairs(target, bench)
        paired += 1
    assert paired > 20 and declined > 20
    one = side([("relu", "output", 0, 0)], 1, [[2]])
    assert align_sql._positional_pairs(one, side([("relu", "output", 0, 0)] * 2, 5, [[2], [2]]), ()) is None


def test_places_in_kind_are_the_windows_row_numbers():
    """align_sql._places_in_kind numbers each row as DuckDB's row_number() OVER (PARTITION
    BY kid ORDER BY eo) - 1: few kinds (16-bit codes) and many (above them), eo a subset
    of a permutation, one row and none."""
    import numpy as np

    rng = np.random.default_rng(5)
    for n, kinds in ((1000, 7), (3000, 1 << 17), (1, 3), (0, 3)):
        kid = rng.integers(1, kinds + 1, n).astype(np.int64)
        eo = rng.permutation(2 * n)[:n].astype(np.int64)
        con = duckdb.connect()
        con.register("rows", pa.table({"kid": kid, "eo": eo, "i": np.arange(n)}))
        expected = con.sql("SELECT i, row_number() OVER (PARTITION BY kid ORDER BY eo) - 1 AS r FROM rows "
                           "ORDER BY i").to_arrow_table().column("r").to_pylist()
        assert align_sql._places_in_kind(kid, eo).tolist() == expected


def _partner_side(rng, n: int, start: int, kinds: int, stats=None, varied: bool = True) -> pa.Table:
    """A side for the partner search: ``kinds`` op types, two dtypes of one class and one of
    another, shapes of one to three numbers (some NULL or empty), NULL strings and ranks,
    statistics with NULL, NaN, Inf and zero L2 norms; rows in a shuffled order. Not
    ``varied``: one value in every kind column but the op type (kinds of many rows, wider
    than align's window)."""
    import numpy as np

    def maybe_null(values, p):
        return [None if rng.random() < p else v for v in values] if varied else values

    st = rng.standard_normal((n, 4)) if stats is None else stats
    st[:, 0] = np.abs(st[:, 0])
    shapes = [None if rng.random() < 0.03 else [] if rng.random() < 0.03 else
              [int(v) for v in rng.choice([2, 3], int(rng.integers(1, 3)))] for _ in range(n)] if varied else [[4]] * n
    few = 2 if varied else 1
    cols = {
        "tensor_id": pa.array(rng.permutation(n) + start, pa.int64()),
        "iteration": pa.array(rng.integers(0, few, n), pa.int64()),
        "rank": pa.array(maybe_null(rng.integers(0, few, n).tolist(), 0.2), pa.int32()),
        "graph_id": pa.array(rng.integers(0, few, n), pa.int32()),
        "op_type": maybe_null([f"op{k}" for k in rng.integers(0, kinds, n)], 0.05),
        "io": list(rng.choice(["input", "output"][:few], n)),
        "slot": pa.array(rng.integers(0, few, n), pa.int32()),
        "slot_path": pa.array(maybe_null(["0"] * n, 0.5), pa.string()),
        "arg_name": pa.array([None] * n, pa.string()),
        "shape": pa.array(shapes, pa.list_(pa.int64())),
        "dtype": maybe_null(list(rng.choice(["float32", "float16", "int32"][:3 if varied else 1], n)), 0.05),
        "position": pa.array(maybe_null(rng.integers(0, 5, n).tolist(), 0.3), pa.int64()),
        "timestamp": pa.array(rng.permutation(n), pa.int64()),
    }
    for k, c in enumerate(("l2norm", "mean", "min", "max")):
        cols[c] = pa.array(maybe_null(st[:, k].tolist(), 0.02), pa.float64())
    return pa.table(cols)


def test_partner_fits_is_the_sql_partner_search():
    """align_sql._partner_fits (numpy) answers as _better_partner_may_exist (DuckDB) on
    random sides (seeded): pairs whose bench tensor is of the target's kind (the window
    either side of its place) or of another kind (the whole kind), target kinds no bench
    tensor has, bench statistics copied from other targets (a partner exists) or scaled
    (none), rows not in execution order, with and without group columns."""
    import numpy as np

    rng = np.random.default_rng(11)
    answers = []
    for trial in range(80):
        n = int(rng.integers(5, 300))
        kinds = int(rng.integers(1, 4))
        varied = trial % 4 != 3
        target = _partner_side(rng, n, 0, kinds, varied=varied)
        st = np.column_stack([target.column(c).to_numpy(zero_copy_only=False)
                              for c in ("l2norm", "mean", "min", "max")])
        bst = np.nan_to_num(st, nan=1.0) * (1 + 1e-3 * rng.standard_normal((n, 4)))
        copied = rng.integers(0, n, int(rng.integers(0, 3)))
        bst[copied] = np.nan_to_num(st[rng.integers(0, n, copied.size)], nan=0.5) * (1 + 1e-4)
        bst[rng.random(n) < 0.02] = [[0.0, 0.0, 0.0, 0.0]]
        bst[rng.random(n) < 0.02, 1] = np.nan
        bst[rng.random(n) < 0.01, 2] = np.inf
        # the bench's kinds: the target's row by row (the sides line up) with some rows of
        # another kind, or all drawn afresh (some of the target's kinds then missing)
        bench = _partner_side(rng, n, 10_000, kinds + int(rng.integers(0, 2)), stats=bst, varied=varied)
        if rng.random() < 0.6:
            keep = [c for c in bench.column_names if c not in ("tensor_id", "l2norm", "mean", "min", "max")
                    and rng.random() < 0.9]
            for c in keep:
                bench = bench.set_column(bench.column_names.index(c), c, target.column(c))
        m = int(rng.integers(1, max(2, n // 4)))
        trows = rng.choice(n, m, replace=False)
        brows = trows if rng.random() < 0.7 else rng.choice(n, m, replace=False)
        wrong = pa.table({"target_tensor_id": target.column("tensor_id").take(pa.array(trows)),
                          "bench_tensor_id": bench.column("tensor_id").take(pa.array(brows))})
        group_by = ("iteration", "rank") if trial % 2 else ()
        con = duckdb.connect()
        con.register("target", target)
        con.register("bench", bench)
        con.register("w", wrong)
        con.execute("CREATE TEMP TABLE looks_wrong AS SELECT * FROM w")
        expected = align_sql._better_partner_may_exist(con, group_by, bench)
        got = align_sql._partner_fits(target, bench, wrong, group_by)
        assert got == expected, trial
        # the bench rows put in execution order, said so: their places without a look
        in_order = bench.take(pa.array(np.argsort(align_sql._order_numbers(bench))))
        assert align_sql._partner_fits(target, in_order, wrong, group_by, bench_in_order=True) == expected, trial
        answers.append(got)
        con.close()
    assert 10 < sum(answers) < len(answers) - 10  # both answers, often


def test_partner_fits_window_edges():
    """The window's edges: one kind in execution order, each bench tensor holding the
    statistics of the target tensor ``d`` places later; a looks-wrong pair then has a
    fitting bench tensor ``d`` places before its own, inside align's window for ``d`` up
    to NEIGHBOURS only. _partner_fits answers as _better_partner_may_exist for each d."""
    import numpy as np

    from dumpdb.compare.align import NEIGHBOURS

    rng = np.random.default_rng(3)
    n = 120
    answers = {}
    for d in range(NEIGHBOURS - 3, NEIGHBOURS + 4):
        target = _partner_side(rng, n, 0, 1, varied=False)
        order = np.argsort(align_sql._order_numbers(target))  # rows in execution order
        st = np.column_stack([target.column(c).to_numpy(zero_copy_only=False) for c in ("l2norm", "mean", "min", "max")])
        st = np.nan_to_num(st, nan=1.0)
        bst = 10 * (st + 1)
        bst[order[:-d]] = st[order[d:]]
        bench = target.drop_columns(["l2norm", "mean", "min", "max", "tensor_id"]).append_column(
            "tensor_id", pa.array(np.arange(n) + 5000, pa.int64()))
        for k, c in enumerate(("l2norm", "mean", "min", "max")):
            bench = bench.append_column(c, pa.array(bst[:, k], pa.float64()))
        at = order[d + 40:d + 43]  # pairs of the same row of each side, well inside the kind
        wrong = pa.table({"target_tensor_id": target.column("tensor_id").take(pa.array(at)),
                          "bench_tensor_id": bench.column("tensor_id").take(pa.array(at))})
        con = duckdb.connect()
        con.register("target", target)
        con.register("bench", bench)
        con.register("w", wrong)
        con.execute("CREATE TEMP TABLE looks_wrong AS SELECT * FROM w")
        expected = align_sql._better_partner_may_exist(con, (), bench)
        assert align_sql._partner_fits(target, bench, wrong, ()) == expected, d
        answers[d] = expected
        con.close()
    assert answers == {d: d <= NEIGHBOURS for d in answers}


def test_row_numbers_by_each_lookup():
    """columns.row_positions finds each wanted id's row by binary search (ids ascending),
    by a table (dense ids in any order) and by hash (sparse ids); ValueError for an id
    that is not there."""
    import numpy as np

    rng = np.random.default_rng(2)
    for ids in (np.sort(rng.choice(1000, 60, replace=False)), rng.permutation(60) + 7,
                rng.choice(10**9, 60, replace=False)):
        pick = rng.integers(0, ids.size, 25)
        column = pa.chunked_array([pa.array(ids, pa.int64())])
        assert row_positions(column, pa.chunked_array([pa.array(ids[pick])])).tolist() == pick.tolist()
        with pytest.raises(ValueError):
            row_positions(column, pa.chunked_array([pa.array([*ids[pick], 10**10])]))


def test_check_arrays_are_the_sql_content_check():
    """align_sql._check_arrays (numpy) gives _check_sql's wrong and other_op row for row on
    random pairs (seeded): shapes equal, of other lengths, NULL or empty on either side,
    one number changed; dtypes, graph ids and op types equal, other or NULL; statistics
    perturbed by rounding or far, NULL, NaN, Inf, both L2 norms 0 (with -0.0 against 0.0),
    element counts large enough that a distance's scale underflows (NaN distances)."""
    import numpy as np

    rng = np.random.default_rng(13)
    for trial in range(40):
        n = int(rng.integers(1, 400))

        def shapes(n=n):
            return [None if rng.random() < 0.05 else [] if rng.random() < 0.05 else
                    [int(v) for v in rng.choice([1, 2, 3, 10**6, 0], int(rng.integers(1, 4)))] for _ in range(n)]

        ts = shapes()
        bs = [s if rng.random() < 0.85 else (None if s is None else [*s[:-1], 7] if s else [5])
              if rng.random() < 0.5 else t for s, t in zip(ts, shapes())]
        if trial % 3 == 0:  # shapes of every row the same lengths (the numbers line up)
            ts = [[2, 3]] * n
            bs = [[2, 3] if rng.random() < 0.9 else [2, 4] for _ in range(n)]
        st = rng.standard_normal((n, 4)) * rng.choice([1e-320, 1e-300, 1e-3, 1, 1e6], (n, 1))
        st[:, 0] = np.abs(st[:, 0])
        bst = st * (1 + rng.choice([0, 1e-3, 0.5], (n, 1)) * rng.standard_normal((n, 4)))
        zero = rng.random(n) < 0.05
        st[zero, 0] = 0.0
        bst[zero, 0] = -0.0
        both_zero = zero & (rng.random(n) < 0.5)
        bst[both_zero, 1:] = np.where(st[both_zero, 1:] == 0, -0.0, st[both_zero, 1:])
        for k in (1, 2, 3):  # one of mean, min, max other where both L2 norms are 0
            bst[both_zero & (rng.random(n) < 0.2), k] += 1.0

        def stats(values):
            out = {}
            for k, c in enumerate(("l2norm", "mean", "min", "max")):
                v = values[:, k].tolist()
                v = [None if rng.random() < 0.02 else float("nan") if rng.random() < 0.02 else
                     float("inf") if rng.random() < 0.01 else x for x in v]
                out[c] = pa.array(v, pa.float64())
            return out

        def strings(choices, p_null, n=n):
            return [None if rng.random() < p_null else str(rng.choice(choices)) for _ in range(n)]

        tdt = strings(["float32", "float16"], 0.05)
        t = pa.table({"tensor_id": pa.array(np.arange(n), pa.int64()), "shape": pa.array(ts, pa.list_(pa.int64())),
                      "graph_id": pa.array([None if rng.random() < 0.05 else 0 for _ in range(n)], pa.int32()),
                      "op_type": strings(["relu", "add"], 0.05), "dtype": tdt, **stats(st)})
        b = pa.table({"tensor_id": pa.array(np.arange(n) + 1000, pa.int64()), "shape": pa.array(bs, pa.list_(pa.int64())),
                      "graph_id": pa.array([None if rng.random() < 0.05 else int(rng.random() < 0.1) for _ in range(n)],
                                           pa.int32()),
                      "op_type": [x if rng.random() < 0.9 else "mul" for x in t.column("op_type").to_pylist()],
                      "dtype": [x if rng.random() < 0.9 else "int32" for x in tdt], **stats(bst)})
        dtype = trial % 2 == 0
        con = duckdb.connect()
        con.register("tt", t)
        con.register("bb", b)
        expected = con.sql(f"SELECT {align_sql._check_sql(dtype)} FROM tt t POSITIONAL JOIN bb b").to_arrow_table()
        got = align_sql._check_arrays(t, b, dtype)
        assert got is not None
        assert got[0].tolist() == expected.column("wrong").to_pylist(), trial
        assert got[1].tolist() == expected.column("other_op").to_pylist(), trial
        con.close()
    assert align_sql._check_arrays(t.set_column(1, "shape", pa.array([[None]] * n, pa.list_(pa.int64()))), b,
                                   True) is None  # a NULL number in a shape: the SQL decides
