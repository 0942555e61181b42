"""The compare engine's columnar paths (issue 13): results built column by column, msprobe
verdicts and precision rules over columns, give what the pair-by-pair code gives.

* a corpus compare through the bulk paths (identical-hash short cut, batched small pairs)
  equals the same compare forced pair by pair (a plug-in metric is registered: then every
  tensor pair is computed alone by tensor_metrics in the pool, as before issue 13);
* :func:`dumpdb.compare.verdict.op_results_columns` equals the row-by-row reference
  (tests/compare_reference.py: the checkers as written before they moved onto columns) op
  by op, and :func:`dumpdb.compare.precision.judge_precision_columns` equals the reference's
  ``judge_precision`` / ``first_departure`` row by row, on generated rows that reach every
  checker and branch (NaN/Inf, zeros, missing values, reshapes, dtype mixes, ignored ops,
  ops without inputs, producers, cancellation); dumpdb's own row functions (thin wrappers
  over the column code) give the same.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections import defaultdict

import compare_reference as reference  # the rules row by row, as written before columns
import numpy as np
import pyarrow as pa
import pytest
from precision_rows import first_departure, judge_precision
from verdict_rows import op_results

import dumpdb
from dumpdb.compare import registry
from dumpdb.compare.columns import Shapes, filled, group_codes, run_order, truthy
from dumpdb.compare.engine import compare
from dumpdb.compare.metrics import MSG_NAN_INF_MISMATCH
from dumpdb.compare.precision import Columns as PrecisionColumns
from dumpdb.compare.precision import PrecisionRules, judge_precision_columns
from dumpdb.compare.verdict import Columns as VerdictColumns
from dumpdb.compare.verdict import Thresholds, op_results_columns


@pytest.mark.parametrize("target,bench", [("fp16", "fp32"), ("fp32", "fp32")])
def test_bulk_paths_equal_the_pair_by_pair_path(pair_archive, target, bench):
    """fp16/bf16 vs fp32 takes the batched small-pair path, fp32 vs itself the identical-hash
    short cut; with a plug-in metric registered every tensor pair is computed alone. The
    result tables are equal column for column (the plug-in's own column aside), and so are
    the summaries and first divergences."""
    a = dumpdb.open(pair_archive)
    bulk = compare(a, target, bench, store_results=False, mode="tensor")
    seen = []

    def plugin(t, b):
        seen.append(t.size)
        return 1.0

    registry.register(registry.Metric("per_pair_probe_test", "tensor", "calls (test)", function=plugin))
    try:
        one_by_one = compare(a, target, bench, store_results=False, mode="tensor")
    finally:
        registry.unregister("per_pair_probe_test")
    assert len(seen) == bulk.results.num_rows > 50  # every pair went through the per-pair path
    slow = one_by_one.results.drop_columns(["per_pair_probe_test"])
    assert slow.drop_columns(["cosine"]).equals(bulk.results.drop_columns(["cosine"]))
    # cosine: equal, but where the payloads are the same bytes the short cut gives the
    # definition's 1.0 where dot(x, x) / |x|**2 computes 1 - a few ulps (metrics.identical_metrics)
    same = [t == b for t, b in zip(bulk.results["target_content_hash"].to_pylist(),
                                   bulk.results["bench_content_hash"].to_pylist())]
    for k, (fast, computed) in enumerate(zip(bulk.results["cosine"].to_pylist(), slow["cosine"].to_pylist())):
        if same[k] and fast is not None and computed is not None:
            assert fast == 1.0 and abs(computed - 1.0) <= 4 * np.finfo(np.float64).eps, k
        else:
            assert repr(fast) == repr(computed), k
    assert one_by_one.summary == bulk.summary
    assert one_by_one.first_divergence == bulk.first_divergence
    if target == bench:
        assert set(bulk.results["max_abs_err"].to_pylist()) == {0.0}
    else:
        assert bulk.summary["error"] + bulk.summary["warning"] > 0  # the verdicts had something to judge
        assert any(v is not None and v > 0 for v in bulk.results["max_abs_err"].to_pylist())


# -- generated rows: verdicts ------------------------------------------------------------------

_NAMES = ["Functional.linear.0.forward", "Functional.empty.1.forward", "Distributed._all_gather_base.0.forward",
          "Default/net/MatMul-op3", "Tensor.to.2.forward", "Module.qkv_proj.0.forward", None]
_PRECISION_NAMES = [*_NAMES, "Functional.linear.0.backward", "Tensor.add_.0.forward", "Distributed.all_reduce.0.forward"]
_OP_TYPES = {"Functional.linear.0.forward": "Functional.linear", "Functional.linear.0.backward": "Functional.linear",
             "Module.qkv_proj.0.forward": "Module.Linear", "Tensor.add_.0.forward": "Tensor.add_",
             "Distributed.all_reduce.0.forward": "Distributed.all_reduce"}
_DTYPES = ["float32", "float16", "bfloat16", "int32", "bool", None, ""]


def _value(rng: random.Random, scale: float = 1.0):
    return rng.choice([None, math.nan, math.inf, -math.inf, 0.0, -0.0, 1.0, 0.95, 0.5, 0.05, 1e-4,
                       rng.random() * scale, -rng.random() * scale])


def _norm(rng: random.Random, scale: float):
    """A distance: None, NaN, +inf or >= 0."""
    v = _value(rng, scale)
    return v if v is None else abs(v)


def _rows(seed: int, n: int = 400) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        op = rng.randrange(40)
        shapes = [[2, 3], [3, 2], [6], [], None, [2, 3]]
        name = _NAMES[op % len(_NAMES)]
        rows.append({
            "pair_index": i, "iteration": rng.choice([0, 1, None]), "rank": rng.choice([0, None]),
            "graph_id": op % 3, "call_index": rng.choice([None, 0]), "target_name": name,
            "bench_name": rng.choice([name, "Module.gate_up.0", None]),
            "io": "output" if rng.random() < 0.5 else rng.choice(["input", "parameter", None]),
            "slot": rng.randrange(3), "timestamp": rng.choice([None, 1000 + rng.randrange(50)]),
            "mode": rng.choice(["tensor", "statistics"]),
            "target_dtype": rng.choice(_DTYPES), "bench_dtype": rng.choice(_DTYPES),
            "target_dtype_declared": rng.choice([None, "Float16", "fp32"]), "bench_dtype_declared": None,
            "target_shape": rng.choice(shapes), "bench_shape": rng.choice(shapes),
            "target_requires_grad": rng.choice([None, True, False]),
            "bench_requires_grad": rng.choice([None, True, False]),
            "cosine": _value(rng), "one_thousandth_err_ratio": _value(rng), "max_abs_err": _norm(rng, 2.0),
            "euc_dist": _norm(rng, 1e-3), "flat_euc_dist": _norm(rng, 1e-3), "l2norm_diff": _value(rng),
            "l2norm_rel_diff": _value(rng, 20.0),
            **{f"{s}_{k}": _value(rng, 10.0) for s in ("target", "bench") for k in ("max", "min")},
            "bench_l2norm": rng.choice([None, 0.0, 1.0, 3.0, 1e-30]),
            "err_message": rng.choice([None, MSG_NAN_INF_MISMATCH, "dtype mismatch"]),
            "target_content_hash": rng.choice(["h1", "h2", "h3", None]),
        })
    return rows


def _op_key(r: dict) -> tuple:
    return r["iteration"], r["rank"], r["graph_id"], r["call_index"], r["target_name"]


def _codes(keys: list[tuple]) -> np.ndarray:
    index: dict = {}
    return np.array([index.setdefault(k, len(index)) for k in keys], np.int64)


def _numbers(rows: list[dict], names) -> tuple[dict, dict]:
    values, valid = {}, {}
    for k in names:
        col = [r[k] for r in rows]
        valid[k] = np.array([v is not None for v in col])
        values[k] = np.array([np.nan if v is None else float(v) for v in col])
    return values, valid


def _objects(rows: list[dict], key: str) -> np.ndarray:
    return np.array([r[key] for r in rows], dtype=object)


def _shapes(rows: list[dict], key: str) -> Shapes:
    return Shapes(pa.array([r[key] for r in rows], pa.list_(pa.int64())))


def test_verdict_columns_equal_op_results():
    levels = set()
    for seed in range(6):
        levels |= _check_verdicts(_rows(seed))
    assert levels == {"pass", "warning", "error"}  # the rows reach every level


def _check_verdicts(rows: list[dict]) -> set[str]:
    th = Thresholds()
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        groups[_op_key(r)].append(i)
    expected: list = [None] * len(rows)
    for idx in groups.values():
        mode = "statistics" if all(rows[i]["mode"] == "statistics" for i in idx) else "tensor"
        group = [rows[i] for i in idx]
        for i, got, wrapped in zip(idx, reference.op_results(group, th, mode=mode), op_results(group, th, mode=mode)):
            expected[i] = got
            assert wrapped == got, i  # dumpdb's row function: the columns of these rows
    names = ("cosine", "one_thousandth_err_ratio", "max_abs_err", "l2norm_rel_diff", "target_max", "target_min",
             "bench_max", "bench_min", "target_requires_grad", "bench_requires_grad")
    values, valid = _numbers(rows, names)
    columns = VerdictColumns(
        group=_codes([_op_key(r) for r in rows]), output=np.array([r["io"] == "output" for r in rows]),
        statistics=np.array([r["mode"] == "statistics" for r in rows]), target_name=_objects(rows, "target_name"),
        bench_name=_objects(rows, "bench_name"), target_dtype=_objects(rows, "target_dtype"),
        bench_dtype=_objects(rows, "bench_dtype"), err_message=_objects(rows, "err_message"), values=values,
        valid=valid, target_shape=_shapes(rows, "target_shape"), bench_shape=_shapes(rows, "bench_shape"))
    result, reason = op_results_columns(columns, th)
    assert list(zip(result.tolist(), reason.tolist())) == expected
    return {lvl for lvl, _ in expected}


# -- generated rows: precision rules -----------------------------------------------------------

def _precision_columns(rows: list[dict], producers: dict) -> PrecisionColumns:
    n = len(rows)
    ranked = sorted(range(n), key=lambda i: run_order(rows[i]))
    run_rank = np.empty(n, np.int64)
    run_rank[ranked] = np.arange(n)
    values, valid = _numbers(rows, ("flat_euc_dist", "euc_dist", "max_abs_err", "l2norm_diff", "bench_l2norm",
                                    "target_max", "target_min", "bench_max", "bench_min", "target_l2norm"))
    texts = {k: _objects(rows, k) for k in ("target_dtype", "bench_dtype", "target_dtype_declared",
                                            "bench_dtype_declared", "err_message", "target_content_hash", "io",
                                            "slot", "target_name", "scope_name", "op_type", "arg_diff")}
    return PrecisionColumns(
        group=_codes([_op_key(r) for r in rows]), where=_codes([(r["iteration"], r["rank"]) for r in rows]),
        run_rank=run_rank, output=np.array([r["io"] == "output" for r in rows]),
        statistics=np.array([r["mode"] == "statistics" for r in rows]),
        order=np.array([r["_order"] for r in rows], np.int64), values=values, valid=valid, **texts,
        target_shape=_shapes(rows, "target_shape"), bench_shape=_shapes(rows, "bench_shape"),
        producers=lambda hashes: {h: producers[h] for h in hashes if h in producers},
        iteration=np.array([-1 if r["iteration"] is None else r["iteration"] for r in rows], np.int64),
        timestamp=np.array([np.nan if r["timestamp"] is None else float(r["timestamp"]) for r in rows]))


def _listed(col):
    """A column of judge_precision_columns' output as numpy (the reasons come as an Arrow array)."""
    if isinstance(col, pa.Array):
        out = np.empty(len(col), dtype=object)
        out[:] = col.to_pylist()
        return out
    return col


def _same(a, b) -> bool:
    return repr(a) == repr(b)


_REACHED: set[str] = set()  # the precision reasons the generated rows gave


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("statistics_only", [False, True])
def test_precision_columns_equal_judge_precision(seed, statistics_only):
    rows = _rows(100 + seed)
    rng = random.Random(seed)
    more = random.Random(1000 + seed)  # the new rules' evidence, drawn apart from the rows above
    for k, r in enumerate(rows):
        r["_order"] = 2 * k + 1
        if statistics_only:
            r["mode"] = "statistics"
        if rng.random() < 0.5:  # plenty of rows within the floor and many just beyond it
            r["euc_dist"] = r["l2norm_diff"] = rng.choice([0.0, 1e-9, 1e-6, 1e-4, 1e-2])
            r["bench_l2norm"], r["err_message"] = 1.0, None
            r["target_max"] = r["target_min"] = 0.5
        # the evidence the new rules read: op types (module records), scalar-argument
        # differences, target norms, tiny tensors beside big ones (rounding noise)
        if more.random() < 0.2:
            r["target_name"] = more.choice(_PRECISION_NAMES)
        r["op_type"] = _OP_TYPES.get(r["target_name"])
        r["scope_name"] = r["target_name"]
        r["arg_diff"] = "eps: 1e-05 -> 0.1" if more.random() < 0.02 else None
        if more.random() < 0.04:  # produced by a compared op whose own pair matches the bench
            r["target_content_hash"] = "h4"
            if r["io"] == "output":
                r["euc_dist"] = r["flat_euc_dist"] = r["l2norm_diff"] = 0.0
        r["target_l2norm"] = more.choice([None, r["bench_l2norm"]])
        if more.random() < 0.25 and r["mode"] == "tensor":
            r["bench_l2norm"], r["target_shape"] = 1e-9, r["bench_shape"]
            r["euc_dist"] = r["flat_euc_dist"] = more.choice([1e-10, 1e-9, 3e-9, 1e-6])
            r["err_message"] = None
    producers = {"h1": [(0, "Producer-op1", True), (301, "Inserted-op2", False)], "h2": [(5, "OnlyTarget-op3", False)],
                 "h4": [(0, "Matching-op4", True)]}
    columns = _precision_columns(rows, producers)
    rules = PrecisionRules()
    got, departure = judge_precision_columns(columns, rules)
    # the engine's form: names only as Arrow, dtypes as Arrow too (Columns.text/objects)
    arrowed = dataclasses.replace(columns, target_name=None, scope_name=None, arrow={
        k: pa.array(getattr(columns, k), pa.string()) for k in ("target_name", "scope_name", "op_type", "target_dtype",
                                                                 "bench_dtype", "target_dtype_declared",
                                                                 "bench_dtype_declared")})
    got_arrow, departure_arrow = judge_precision_columns(arrowed, rules)
    assert repr(departure_arrow) == repr(departure)
    got = {k: _listed(v) for k, v in got.items()}  # the reasons come as Arrow
    for name, col in got.items():
        assert repr(_listed(got_arrow[name]).tolist()) == repr(col.tolist()), name
    expected = [dict(r) for r in rows]
    reference.judge_precision(expected, producers, rules)
    wrapped = [dict(r) for r in rows]
    judge_precision(wrapped, producers, rules)  # dumpdb's row function: the columns of these rows
    assert repr(wrapped) == repr(expected)
    for i, r in enumerate(expected):
        for name in ("scaled_err", "precision_floor", "precision_ratio"):
            value = float(got[name][i]) if got[f"{name}_valid"][i] else None
            assert _same(value, r[name]), (i, name, value, r[name])
        for name in ("precision_dtype", "precision_result", "precision_reason"):
            assert got[name][i] == r[name], (i, name, got[name][i], r[name])
        assert got["origin_op"][i] == r.get("origin_op"), i
    assert {r["precision_result"] for r in expected} >= {"pass", "warning", "error"}
    _REACHED.update(str(r["precision_reason"]) for r in expected)
    first = reference.first_departure(expected)
    assert repr(first_departure(wrapped)) == repr(first)
    assert first is not None and departure is not None
    assert departure["row"]["pair_index"] == first["row"]["pair_index"]
    assert {k: departure[k] for k in ("origin_op", "inputs", "outputs")} == \
        {k: first[k] for k in ("origin_op", "inputs", "outputs")}


def test_generated_rows_reach_every_precision_branch():
    """The rows of test_precision_columns_equal_judge_precision reach every branch of the
    precision rules (reasons as the reference writes them). All of them, here: under
    pytest-xdist only some of those cases may have run in this worker."""
    for seed in range(4):
        for statistics_only in (False, True):
            test_precision_columns_equal_judge_precision(seed, statistics_only)
    reasons = " | ".join(sorted(_REACHED))
    for branch in ("propagated: within", "exact-dtype result", "propagated from earlier nan/inf", "departs: error",
                   "input error propagated from", "x the largest earlier error", "an op only the target has",
                   "no compared op produced it", "(cancellation)", "shapes differ", "and are not two floats",
                   "overflow:", "nan/inf at different positions", "rounding noise:", "scalar arguments differ",
                   "module/cell record", "not comparable"):
        assert branch in reasons, branch


def test_filled_shares_one_object_and_truthy_is_bool():
    """columns.filled holds one object n times (np.full made a str per row); truthy is
    bool() per element, None, "" and 0 False."""
    text = "".join(["for", "ward"])  # not interned
    out = filled(5, text)
    assert out.tolist() == [text] * 5 and all(v is text for v in out.tolist())
    values = np.array([None, "", "x", 0, 1.5, None], dtype=object)
    assert truthy(values).tolist() == [bool(v) for v in values.tolist()]
    assert truthy(np.array([], dtype=object)).tolist() == []


def test_group_codes_and_shapes():
    """NULL keys group with NULL, distinct keys stay apart; shapes compare and print as lists."""
    sentinel = np.iinfo(np.int64).min
    a = np.array([1, 1, sentinel, sentinel, 2])
    b = np.array([5, 6, 5, 5, 5])
    codes = group_codes([a, b])
    assert codes[2] == codes[3] and len(set(codes.tolist())) == 4
    s = Shapes(pa.array([[2, 3], [], None, [6]], pa.list_(pa.int64())))
    t = Shapes(pa.array([[2, 3], [], None, [2, 3]], pa.list_(pa.int64())))
    assert s.equal(t).tolist() == [True, True, False, False]
    assert s.size.tolist() == [6, 1, 0, 6] and s.text(0) == "[2, 3]" and s.text(2) == "None"


def test_texts_and_format_equal_python_strings():
    """columns.Texts (the precision reasons as Arrow parts, no str per row) reads, overwrites,
    NULLs and truthiness as an object array does; precision._format equals str.format row
    by row over numbers (-0.0, nan, inf, ties of .3g), objects (str, None, a number, bytes)
    and Arrow texts with NULL."""
    from dumpdb.compare.columns import Texts, nonempty, replaced
    from dumpdb.compare.precision import _format

    more = random.Random(7)
    n = 300
    want = np.full(n, None, dtype=object)
    texts = Texts(n)
    for step in range(12):
        at = np.array(sorted(more.sample(range(n), more.randint(0, 60))), np.int64)
        kind = step % 4
        if kind == 0:
            values = [more.choice([None, "", f"r{step}-{i}"]) for i in range(len(at))]
            texts[at] = values
        elif kind == 1:
            values = [f"{v}: propagated" if v is not None else None for v in want[at].tolist()]
            texts[at] = pa.array(values, pa.large_string())
        elif kind == 2:
            mask = np.zeros(n, bool)
            mask[at] = True
            values = ["same"] * len(at)
            texts[mask] = "same"
        else:
            values = [None] * len(at)
            texts[at] = None
        want[at] = values
        rows = np.array(more.sample(range(n), 40))
        assert texts[rows].to_pylist() == want[rows].tolist()
    assert texts.arrow().to_pylist() == want.tolist() and texts.arrow().type == pa.string()
    assert texts.present().tolist() == [v is not None for v in want.tolist()]
    assert texts.nonempty().tolist() == truthy(want).tolist()
    assert texts.get(int(np.flatnonzero(texts.present())[0])) == want[np.flatnonzero(texts.present())[0]]
    arr = texts[np.arange(n)]
    assert nonempty(arr).tolist() == truthy(want).tolist()
    blank = ~truthy(want)
    assert replaced(arr, blank, "x").to_pylist() == [("x" if b else v) for v, b in zip(want.tolist(), blank.tolist())]

    floats = np.array([0.0, -0.0, 1.5, 0.0012345, 0.00123449999, 2.5e-7, np.nan, np.inf, -np.inf, 1e300, 12345.0] * 3)
    objects = np.empty(len(floats), dtype=object)
    objects[:] = ([None, "a", "", "float32"] * 9)[:len(floats)]
    mixed = objects.copy()
    mixed[1], mixed[2] = 3.5, b"x"
    arrow = pa.array([None if i % 5 == 0 else f"t{i}" for i in range(len(floats))], pa.large_string())
    for template, cols in (("error {:.3g} = {:g} x floor", (floats, floats[::-1].copy())),
                           ("{}: {} of {:.3g}", (objects, mixed, floats)),
                           ("{}; produced by {}", (arrow, objects)),
                           ("a {!r} b {}", (objects, floats))):
        got = _format(template, *cols).to_pylist()
        lists = [c.to_pylist() if isinstance(c, pa.Array) else c.tolist() for c in cols]
        assert got == [template.format(*row) for row in zip(*lists)], template
