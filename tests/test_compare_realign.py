"""Alignment checked by content and scalar arguments as evidence (issue 26), on real msprobe
26.2 dumps of a small Transformer (tests/data/msprobe_rewrite, README there): a LayerNorm
computed by hand shifts msprobe's call counters; an epsilon and a softmax scale differ."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from conftest import DATA
from typer.testing import CliRunner

import dumpdb
from dumpdb.cli import app
from dumpdb.compare.align import align, stat_distance
from dumpdb.compare.args import arg_diff
from dumpdb.compare.engine import compare
from dumpdb.layouts.msprobe import scalar_args

RW = DATA / "msprobe_rewrite"


# The rewrite dumps hold their payloads as .pt files: without PyTorch they ingest statistics-only, and the
# brute-force mispair check below compares tensor contents (cosine of each pair against every partner).
NEEDS_TORCH = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="msprobe .pt payloads need PyTorch (pip install 'dumpdb[torch]'; "
                                        ".ci/run installs it)")


@pytest.fixture(scope="module")
def rw(tmp_path_factory):
    archive = tmp_path_factory.mktemp("rw") / "a.dumpdb"
    for case in ("none", "handln", "eps", "scale"):
        assert dumpdb.ingest(RW / case, archive=archive, run=case).ok
    return archive


def _cos(x: np.ndarray, y: np.ndarray) -> float:
    x, y = x.astype(np.float64).ravel(), y.astype(np.float64).ravel()
    nx, ny = np.linalg.norm(x), np.linalg.norm(y)
    if nx == 0 or ny == 0:
        return 1.0 if nx == ny else 0.0
    return float(x @ y / (nx * ny))


def _mispaired(archive, out, target: str, bench: str) -> list[tuple]:
    """Brute force: forward float tensors paired at cosine <= 0.99 while a bench tensor of
    the same op type, io and shape has cosine > 0.99 with them."""
    a = dumpdb.open(archive)
    with a:
        arrays = {r["tensor_id"]: x for r, x in
                  a.tensors(f"SELECT tensor_id FROM tensors WHERE run IN ('{target}', '{bench}')")}
    bench_rows = a.sql("SELECT tensor_id, op_type, io, shape FROM tensors WHERE run = ?", [bench]).to_pylist()
    bad = []
    for r in out.results.to_pylist():
        if r["target_name"].endswith(".backward") or r["io"] not in ("input", "output"):
            continue
        t, b = arrays[r["target_tensor_id"]], arrays[r["bench_tensor_id"]]
        if t.size <= 1 or not np.issubdtype(t.dtype, np.floating):
            continue
        if t.size == b.size and _cos(t, b) > 0.99:
            continue
        better = [x["tensor_id"] for x in bench_rows if x["tensor_id"] != r["bench_tensor_id"]
                  and (x["op_type"], x["io"]) == (r["op_type"], r["io"]) and tuple(x["shape"]) == t.shape
                  and _cos(t, arrays[x["tensor_id"]]) > 0.99]
        if better:
            bad.append((r["target_name"], r["io"], r["slot"], r["bench_name"], better))
    return bad


@NEEDS_TORCH
def test_hand_written_layernorm_leaves_no_forward_tensor_mispaired(rw):
    out = compare(dumpdb.open(rw), "handln", "none", store_results=False)
    assert _mispaired(rw, out, "handln", "none") == []
    assert out.first_divergence is None  # the rewrite is equivalent
    rows = out.results.to_pylist()
    realigned = [r for r in rows if r["realigned"]]
    assert realigned and out.summary["realigned"] == len(realigned)
    # re-aligned pairs cross the shifted counters: target call N pairs with bench call N - k
    assert any(r["target_name"] != r["bench_name"] for r in realigned)
    assert all(r["match_strategy"] == "sequence" for r in realigned)
    assert out.summary["suspected_mispairs"] == []
    # the hand-written ops themselves have no partner
    assert {"Tensor.mean.0.forward", "Tensor.__sub__.0.forward"} <= set(out.unmatched["name"].to_pylist())


@NEEDS_TORCH
def test_exact_names_alone_leave_suspected_mispairs(rw):
    """Without the sequence strategy nothing is re-aligned: the counter-shifted name pairs
    are reported as suspected mispairs, each with the far better bench partner."""
    out = compare(dumpdb.open(rw), "handln", "none", strategies=("exact",), store_results=False)
    assert _mispaired(rw, out, "handln", "none")
    assert not any(out.results["realigned"].to_pylist())
    suspects = out.summary["suspected_mispairs"]
    assert suspects and all(s["better_distance"] < s["distance"] for s in suspects)
    assert any(s["target"].startswith("Tensor.__add__.") for s in suspects)
    r = CliRunner().invoke(app, ["compare", "handln", "none", "-a", str(rw), "--strategy", "exact", "--no-store"])
    assert "suspected mispairs" in r.output


def test_clean_and_changed_pairs_keep_their_name_pairs(rw):
    """A real change of one op (an epsilon, a scale) is not a mispair: exact names stand."""
    for target in ("eps", "scale", "none"):
        out = compare(dumpdb.open(rw), target, "none", store_results=False)
        assert set(out.results["match_strategy"].to_pylist()) == {"exact"}
        assert not any(out.results["realigned"].to_pylist())
        assert out.summary["suspected_mispairs"] == []


@pytest.mark.parametrize("target, op, text", [
    ("eps", "Functional.layer_norm.2.forward", "input.4: 1e-05 -> 0.1"),
    ("scale", "Tensor.__mul__.1.forward", "input.1: 0.5 -> 0.25"),
])
def test_arg_diff_names_the_changed_scalar_argument(rw, target, op, text):
    a = dumpdb.open(rw)
    out = compare(a, target, "none", store_results=False)
    diffs = {(r["target_name"], r["arg_diff"]) for r in out.results.to_pylist() if r["arg_diff"] is not None}
    assert diffs == {(op, text)}
    assert out.summary["arg_diffs"] == [{"target": op, "bench": op, "arg_diff": text}]
    # the recorded scalar is what the catalog keeps (msprobe_records): queryable in SQL
    slot = int(text.split(":")[0].split(".")[1])
    value = a.sql(f"SELECT record->'input_args'->{slot}->>'value' AS v FROM msprobe_records "
                  "WHERE run = ? AND op_name = ?", [target, op]).to_pylist()
    assert [float(v["v"]) for v in value] == [float(text.rsplit(" ", 1)[1])]
    r = CliRunner().invoke(app, ["first-divergence", target, "none", "-a", str(rw)])
    assert text in r.output


def test_has_scalar_is_written_at_ingest_and_a_null_one_is_read_from_the_text(rw, tmp_path):
    """msprobe_records.has_scalar (schema 11) is the record text's test "holds the key
    value" for every ingested record, true for the records holding the changed epsilon;
    with it NULL (a part an older ingest-worker wrote) compare tests the text and names
    the same changed scalar; an archive of schema 10 gets the column filled on open."""
    from conftest import private_copy

    a = dumpdb.open(rw)
    rows = a.sql("SELECT count(*) AS n, count(*) FILTER (WHERE has_scalar) AS hit, count(*) FILTER (WHERE "
                 "has_scalar IS DISTINCT FROM contains(record, '\"value\"')) AS off FROM msprobe_records").to_pylist()[0]
    assert rows["n"] and 0 < rows["hit"] < rows["n"] and rows["off"] == 0
    copy = private_copy(rw, tmp_path)
    import duckdb

    con = duckdb.connect(str(copy / "catalog.duckdb"))
    con.execute("UPDATE msprobe_records SET has_scalar = NULL WHERE run = 'eps'")
    con.close()
    out = compare(dumpdb.open(copy), "eps", "none", store_results=False)
    assert out.summary["arg_diffs"] == [{"target": "Functional.layer_norm.2.forward",
                                         "bench": "Functional.layer_norm.2.forward", "arg_diff": "input.4: 1e-05 -> 0.1"}]
    # an archive of schema 10 (no column) gets it filled by the same test when it is opened (migration 011)
    con = duckdb.connect(str(copy / "catalog.duckdb"))
    con.execute("ALTER TABLE msprobe_records DROP COLUMN has_scalar")
    con.execute("DELETE FROM schema_version WHERE version = 11")
    con.close()
    again = dumpdb.open(copy).sql("SELECT count(*) FILTER (WHERE has_scalar) AS hit, count(*) FILTER (WHERE "
                                  "has_scalar IS DISTINCT FROM contains(record, '\"value\"')) AS off "
                                  "FROM msprobe_records").to_pylist()[0]
    assert again == {"hit": rows["hit"], "off": 0}


def test_arg_diff_is_null_for_a_clean_pair(rw):
    out = compare(dumpdb.open(rw), "none", "none", store_results=False)
    assert out.results["arg_diff"].null_count == out.results.num_rows
    assert out.summary["arg_diffs"] == []


def test_arg_diff_and_scalar_args_rules():
    record = {"input_args": [{"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2]},
                             [{"type": "int", "value": 8}], None, {"type": "float", "value": 1e-05}],
              "input_kwargs": {"dim": {"type": "int", "value": -1}, "flag": {"type": "bool", "value": True}},
              "output": [{"type": "float", "value": 3.0}]}
    assert scalar_args(record) == {"input.1.0": 8, "input.3": 1e-05, "input.dim": -1, "input.flag": True}
    assert arg_diff({"a": 1.0}, {"a": 1}) is None
    assert arg_diff({"a": True}, {"a": 1}) == "a: 1 -> True"
    assert arg_diff({"a": 1, "b": 2}, {"a": 1}) == "b: - -> 2"
    many = arg_diff({str(i): i for i in range(5)}, {str(i): -i - 1 for i in range(5)})
    assert many is not None and many.endswith("(+2 more)") and many.count(";") == 2


def test_stat_distance_scale():
    assert stat_distance((2.0, 0.5, -1.0, 1.0, 4), (2.0, 0.5, -1.0, 1.0, 4)) == 0.0
    assert 0 < stat_distance((2.0, 0.5, -1.0, 1.0, 4), (2.002, 0.5, -1.0, 1.0, 4)) < 0.01
    assert stat_distance((0.0, 0.0, 0.0, 0.0, 4), (1.0, 0.5, 0.0, 0.5, 4)) == 1.0
    assert np.isnan(stat_distance((None, 0.0, 0.0, 0.0, 4), (1.0, 0.5, 0.0, 0.5, 4)))


def test_crossed_pair_of_one_family_is_realigned():
    """Two ops of one name family whose exact names are crossed (a per-graph -opN counter
    that another graph numbers otherwise): each pair looks wrong while the other's partner
    fits, so the family is re-aligned and the pairs follow content."""
    import pyarrow as pa

    def side(prefix, names, stats):
        rows = {"tensor_id": [], "op_name": [], "op_type": [], "io": [], "slot": [], "shape": [], "l2norm": [],
                "mean": [], "min": [], "max": [], "dtype": [], "graph_id": [], "position": []}
        for k, (name, st) in enumerate(zip(names, stats)):
            for key, v in zip(("tensor_id", "op_name", "op_type", "io", "slot", "shape", "graph_id", "position",
                               "dtype"), (prefix + k, name, "Transpose", "output", 0, [4, 4], 0, k, "float32")):
                rows[key].append(v)
            for key, v in zip(("l2norm", "mean", "min", "max"), st):
                rows[key].append(v)
        return pa.table(rows)

    a_stats, b_stats = (4.0, 0.1, -2.0, 2.0), (9.0, -1.0, -5.0, 1.0)
    target = side(0, ["s/Transpose-op1", "s/Transpose-op2"], [a_stats, b_stats])
    bench = side(100, ["s/Transpose-op1", "s/Transpose-op2"], [b_stats, a_stats])  # scheduled the other way
    al = align(target, bench)
    got = dict(zip(al.pairs["target_tensor_id"].to_pylist(), al.pairs["bench_tensor_id"].to_pylist()))
    assert got == {0: 101, 1: 100}
    assert al.pairs["realigned"].to_pylist() == [True, True]
    exact_only = align(target, bench, strategies=("exact",))
    assert exact_only.suspects.num_rows == 2


def test_a_rounding_noise_input_does_not_decide_a_re_pair():
    """Two Concats of one token scheduled the other way round in the bench graph, each with an
    input that is zero in exact arithmetic (rounding noise, 1e-12 to 3e-6) beside one of
    signal. The signal (input 1 and the output) says which pairs with which; the noise inputs,
    whose differences are about the size of the larger of the two, must not (divided by the
    bench's L2 norm they weighed up to 1e6: MindSpore fp16 vs fp32 backward Concats)."""
    import pyarrow as pa

    def side(start, ops):
        rows: dict[str, list] = {k: [] for k in ("tensor_id", "op_name", "op_type", "io", "slot", "shape", "l2norm",
                                                 "mean", "min", "max", "dtype", "graph_id", "position")}
        for k, (name, noise, sig) in enumerate(ops):
            leaves = (("input", 0, (noise, 0.0, -noise / 4, noise / 4)), ("input", 1, sig), ("output", 0, sig))
            for j, (io, slot, st) in enumerate(leaves):
                for key, v in zip(rows, (start + 3 * k + j, name, "Concat", io, slot, [256], *st, "float32", 0,
                                         3 * k + j)):
                    rows[key].append(v)
        return pa.table(rows)

    a, b = (0.37, -3e-4, -0.057, 0.067), (0.012, -1e-5, -0.002, 0.002)
    target = side(0, [("g/Concat-op1", 1e-9, a), ("g/Concat-op2", 3e-6, b)])
    bench = side(100, [("g/Concat-op1", 1e-9, b), ("g/Concat-op2", 1e-12, a)])
    al = align(target, bench)
    got = dict(zip(al.pairs["target_tensor_id"].to_pylist(), al.pairs["bench_tensor_id"].to_pylist()))
    assert got == {0: 103, 1: 104, 2: 105, 3: 100, 4: 101, 5: 102}


def _optimizer_side(start: int, calls: list[tuple[str, tuple, tuple, tuple]]):
    """MindSpore-style rows of in-place optimizer calls (``Default_optimizer-AdamWeightDecay_
    AdamWeightDecay-opN``): (name, var input 0, gradient input 8, output 0), each as statistics
    (l2norm, mean, min, max), in execution order."""
    import pyarrow as pa

    rows: dict[str, list] = {k: [] for k in ("tensor_id", "op_name", "op_type", "io", "slot", "shape", "l2norm",
                                             "mean", "min", "max", "dtype", "graph_id", "position")}
    for k, (name, var, grad, out) in enumerate(calls):
        for j, (io, slot, st) in enumerate((("input", 0, var), ("input", 8, grad), ("output", 0, out))):
            for key, v in zip(rows, (start + 3 * k + j, name, "AdamWeightDecay", io, slot, [256], *st, "float32",
                                     0, 3 * k + j)):
                rows[key].append(v)
    return pa.table(rows)


def test_a_call_whose_inputs_fit_keeps_its_name_pair_whatever_a_stale_output_says():
    """MindSpore 2.10 CPU's in-place AdamWeightDecay dumps output buffers it never wrote,
    reused across calls: one parameter's update output may fit another call's output far
    better, while the name pair's var and gradient inputs fit and the other call's do not.
    The call as a unit decides: the name pairs stay, nothing is re-aligned or suspected
    (before, the family was taken back and the re-pair, led by the outputs, crossed the two
    updates: the real fp16 O2 vs fp32 Transformer reported a gradient of another layer as
    its first divergence). A call crossed in all its tensors is still re-aligned."""
    name = "Default_optimizer-AdamWeightDecay_AdamWeightDecay-op"
    var1, var2 = (1.0, 0.01, -0.1, 0.1), (1.1, 0.011, -0.11, 0.11)  # two same-shape parameters
    grad1, grad2 = (0.02, 1e-4, -0.004, 0.004), (0.022, 1.1e-4, -0.0044, 0.0044)
    x, y = (5.0, 0.5, -1.0, 1.0), (0.5, 0.0, -0.1, 0.1)  # stale buffers, swapped between the runs
    target = _optimizer_side(0, [(name + "1", var1, grad1, x), (name + "2", var2, grad2, y)])
    bench = _optimizer_side(100, [(name + "1", var1, grad1, y), (name + "2", var2, grad2, x)])
    al = align(target, bench)
    got = dict(zip(al.pairs["target_tensor_id"].to_pylist(), al.pairs["bench_tensor_id"].to_pylist()))
    assert got == {k: 100 + k for k in range(6)}
    assert not any(al.pairs["realigned"].to_pylist())
    assert al.suspects.num_rows == 0
    # every tensor of the two calls crossed (a counter the other graph numbers otherwise): re-aligned
    bench = _optimizer_side(100, [(name + "1", var2, grad2, y), (name + "2", var1, grad1, x)])
    al = align(target, bench)
    got = dict(zip(al.pairs["target_tensor_id"].to_pylist(), al.pairs["bench_tensor_id"].to_pylist()))
    assert got == {0: 103, 1: 104, 2: 105, 3: 100, 4: 101, 5: 102}
    assert all(al.pairs["realigned"].to_pylist())


def _msprobe_side(start: int, calls: list[tuple[str, tuple]]):
    """msprobe-style rows (one output tensor per call, per-API counters) of ``calls``:
    (API, statistics (l2norm, mean, min, max)) in execution order."""
    import pyarrow as pa

    count: dict[str, int] = {}
    rows: dict[str, list] = {k: [] for k in ("tensor_id", "op_name", "op_type", "io", "slot", "shape", "l2norm",
                                             "mean", "min", "max", "dtype", "position")}
    for k, (api, st) in enumerate(calls):
        n = count[api] = count.get(api, -1) + 1
        for key, v in zip(rows, (start + k, f"{api}.{n}.forward", api, "output", 0, [2, 8, 8], *st, "float32", k)):
            rows[key].append(v)
    return pa.table(rows)


def test_a_rewritten_call_among_lookalike_calls_is_placed_by_the_calls_around_it():
    """A softmax computed by hand in layer 2 of 4 leaves the target's softmax family one call
    short; softmax outputs of all layers have about the same statistics (each row sums to 1),
    so content cannot say which bench call has no partner, and calls only one side records
    (the bench's adds, the target's hand-written ops) leave the diff of the taken-back calls
    several equally long answers. The linears around them, kept by their names, decide: the
    target's third softmax (layer 3) pairs with the bench's fourth, and the bench's layer-2
    softmax is left unpaired (as in the harness's rw_softmax cases, bf16 against fp32 at level
    L1: 10 mispaired forward tensors in 4 pairs before)."""
    soft = (5.657, 0.125, 0.0, 0.98)  # every layer's softmax: the same statistics

    def layers(by_hand: int | None) -> list[tuple[str, tuple]]:
        calls = []
        for layer in range(4):
            calls.append(("Functional.linear", (10.0 + layer, 0.1 * layer, -3.0 - layer, 3.0 + layer)))
            if layer == by_hand:
                calls += [("Tensor.max", (3.0, 1.0, 0.5, 2.0)), ("Tensor.__sub__", (8.0, -1.0, -4.0, 0.0)),
                          ("Torch.exp", (4.0, 0.4, 0.0, 1.0)), ("Tensor.sum", (9.0, 3.0, 1.0, 5.0)),
                          ("Tensor.__truediv__", soft)]
            else:
                calls.append(("Functional.softmax", soft))
            calls.append(("Torch.matmul", (20.0 + layer, 0.2 * layer, -6.0 - layer, 6.0 + layer)))
            if by_hand is None:  # msprobe records a residual add in the fp32 bench, not in the bf16 target
                calls.append(("Tensor.__add__", (30.0 + layer, 0.3 * layer, -7.0 - layer, 7.0 + layer)))
        return calls

    target, bench = _msprobe_side(0, layers(2)), _msprobe_side(1000, layers(None))
    al = align(target, bench)
    tname = dict(zip(target["tensor_id"].to_pylist(), target["op_name"].to_pylist()))
    bname = dict(zip(bench["tensor_id"].to_pylist(), bench["op_name"].to_pylist()))
    got = {tname[t]: bname[b] for t, b in zip(al.pairs["target_tensor_id"].to_pylist(),
                                               al.pairs["bench_tensor_id"].to_pylist())}
    assert {k: v for k, v in got.items() if "softmax" in k} == {
        "Functional.softmax.0.forward": "Functional.softmax.0.forward",
        "Functional.softmax.1.forward": "Functional.softmax.1.forward",
        "Functional.softmax.2.forward": "Functional.softmax.3.forward"}
    assert all(got[f"Functional.linear.{k}.forward"] == f"Functional.linear.{k}.forward" for k in range(4))
    assert "Functional.softmax.2.forward" in al.unmatched_bench["name"].to_pylist()
    realigned = dict(zip(al.pairs["target_tensor_id"].to_pylist(), al.pairs["realigned"].to_pylist()))
    assert [tname[t] for t, r in realigned.items() if r] == ["Functional.softmax.2.forward"]


@pytest.fixture(scope="module")
def tf(tmp_path_factory):
    archive = tmp_path_factory.mktemp("tf") / "a.dumpdb"
    for case in ("fp32", "fp16", "fp32_ln1", "fp16_ln1"):
        assert dumpdb.ingest(DATA / "transformer" / case, archive=archive, run=case).ok
    return archive


@pytest.mark.parametrize("target", ["fp32_ln1", "fp16_ln1"])
def test_mindspore_ir_constant_epsilon_is_an_arg_diff(tf, target):
    """MindSpore IR: layer 1's norm1 LayerNorm is `F32(0.5)` against `F32(1e-05)`
    (tests/data/transformer/README.md): the one op with an arg_diff, also under O2."""
    a = dumpdb.open(tf)
    out = compare(a, target, "fp32", store_results=False)
    diffs = out.summary["arg_diffs"]
    assert [d["arg_diff"] for d in diffs] == ["input.5: 1e-05 -> 0.5"]
    assert "1-TransformerEncoderLayer_norm1-" in diffs[0]["target"] and diffs[0]["target"].endswith("LayerNorm-op0")
    stored = a.sql("SELECT scalar_args FROM ops WHERE run = ? AND op_type = 'LayerNorm' AND scope_name LIKE "
                   "'%1-TransformerEncoderLayer/norm1-%'", [target])["scalar_args"].to_pylist()
    assert stored and '"input.5": 0.5' in stored[0]


def test_mindspore_clean_amp_pair_has_no_arg_diff(tf):
    out = compare(dumpdb.open(tf), "fp16", "fp32", store_results=False)
    assert out.summary["arg_diffs"] == []


def test_ir_arguments_not_recorded_on_one_side_are_no_difference():
    """ops.scalar_args NULL (a run ingested before migration 010 recorded none) is unknown:
    no arg_diff against the other run's recorded constants; a recorded change still is one."""
    import duckdb

    from dumpdb.compare.args import arg_diff_column

    con = duckdb.connect()
    con.execute("CREATE TABLE msprobe_records (run VARCHAR, rank INT, iteration INT, op_name VARCHAR, record VARCHAR)")
    con.execute("CREATE TABLE ops (run VARCHAR, rank INT, graph_id INT, scope_name VARCHAR, scalar_args VARCHAR)")
    con.execute("INSERT INTO ops VALUES ('t', 0, 1, 'a', '{\"input.2\": false}'), ('b', 0, 1, 'a', NULL), "
                "('t', 0, 1, 'c', '{\"input.4\": 0.5}'), ('b', 0, 1, 'c', '{\"input.4\": 1e-05}')")
    pairs = {"target_name": ["a", "c"], "bench_name": ["a", "c"], "rank": [0, 0], "iteration": [0, 0],
             "bench_rank": [0, 0], "bench_iteration": [0, 0], "scope_name": ["a", "c"],
             "bench_scope_name": ["a", "c"], "graph_id": [1, 1], "bench_graph_id": [1, 1]}
    column = arg_diff_column(con, "t", "b", pairs)
    assert column is not None and list(column) == [None, "input.4: 1e-05 -> 0.5"]


def test_msprobe_records_without_scalars_count_as_empty_against_recorded_ones():
    """Issue 29 item 5: records holding no scalar are not read when neither run records
    any (a statistics dump: every pair's arg_diff is None); when one run does, a record
    without scalars (or NULL) is ``{}`` against it, and an op without a record is no difference."""
    import duckdb

    from dumpdb.compare.args import arg_diff_column

    con = duckdb.connect()
    con.execute("CREATE TABLE msprobe_records (run VARCHAR, rank INT, iteration INT, op_name VARCHAR, record VARCHAR)")
    scalar = '{"input_kwargs": {"eps": {"type": "float", "value": 0.5}}}'
    bare = '{"input_args": [{"type": "torch.Tensor", "Max": 1.0}]}'
    con.execute("INSERT INTO msprobe_records VALUES ('t', 0, 0, 'a', ?), ('b', 0, 0, 'a', ?), "
                "('t', 0, 0, 'n', ?), ('b', 0, 0, 'n', NULL), ('t', 0, 0, 'c', ?), ('b', 0, 0, 'c', ?), "
                "('t', 0, 0, 'm', ?), ('s', 0, 0, 'a', ?), ('r', 0, 0, 'a', ?)",
                [scalar, bare, scalar, scalar, scalar, scalar, bare, bare])
    names = ["a", "n", "c", "m"]
    pairs = {"target_name": names, "bench_name": names, "rank": [0] * 4, "iteration": [0] * 4,
             "bench_rank": [0] * 4, "bench_iteration": [0] * 4}
    column = arg_diff_column(con, "t", "b", pairs)
    assert column is not None and list(column) == ["input.eps: - -> 0.5", "input.eps: - -> 0.5", None, None]
    column = arg_diff_column(con, "s", "r", {k: v[:1] for k, v in pairs.items()})
    assert column is not None and list(column) == [None]
