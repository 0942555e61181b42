"""Precision-aware rules and sequence alignment on real MindSpore 2.10 Transformer dumps
(tests/data/transformer, README there): a numeric change in one op is named, clean pairs
do not depart, msprobe's rules stay available."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from conftest import DATA
from typer.testing import CliRunner

import dumpdb
from dumpdb.cli import app
from dumpdb.compare import registry
from dumpdb.compare.align import align, sequence_key
from dumpdb.compare.engine import compare
from dumpdb.compare.precision import dtype_floor, lowest_precision
from dumpdb.compare.sequence import _dp, diff

TF = DATA / "transformer"


CASES = ("fp32", "fp16", "fp32_ln1", "fp16_ln1", "fp32_act0", "fp16_act0", "fp32_big", "fp16_big")


@pytest.fixture(scope="module")
def tf_archive(tmp_path_factory):
    archive = tmp_path_factory.mktemp("tf") / "a.dumpdb"
    for case in CASES:
        assert dumpdb.ingest(TF / case, archive=archive, run=case).ok
    return archive


@pytest.fixture(scope="module")
def clean_fp16(tf_archive):
    return compare(dumpdb.open(tf_archive), "fp16", "fp32", store_results=False)


def test_floor_follows_ieee_epsilons():
    assert dtype_floor("float16", 1, 1.0) == pytest.approx(2.0 ** -11 + 2.0 ** -25)
    assert dtype_floor("float32", 4, 2.0) == pytest.approx(2.0 ** -24 + 2.0 ** -150 * 2 / 2)
    assert dtype_floor("int32", 10, 1.0) == 0.0 and dtype_floor("bool", 10, 1.0) == 0.0
    assert dtype_floor("float16", 1, 0.0) == math.inf
    assert lowest_precision("float16", "float32") == "float16"
    assert lowest_precision("bfloat16", "float16") == "bfloat16"
    assert lowest_precision("int32", "float32") is None


@pytest.mark.parametrize("target", ["fp32_ln1", "fp16_ln1"])
def test_changed_layernorm_is_named_not_its_consumers(tf_archive, target):
    """Layer 1's norm1 LayerNorm with epsilon 0.5: every later op differs too, but the first
    departure is that LayerNorm (its epsilon input), in fp32 and in the float16 target."""
    out = compare(dumpdb.open(tf_archive), target, "fp32", store_results=False)
    fd = out.first_divergence
    assert fd is not None and fd["op_type"] == "LayerNorm"
    assert "1-TransformerEncoderLayer/norm1-" in fd["scope_name"]
    assert any(e["result"] == "error" for e in fd["inputs"] + fd["outputs"])
    rows = out.results.to_pylist()
    # later ops: propagated, not blamed; the one op in error is the LayerNorm (its epsilon
    # input, and its outputs, whose recorded epsilon differs: arg_diff)
    assert {r["target_name"] for r in rows if r["precision_result"] == "error"} == {fd["target_name"]}
    assert sum(r["precision_result"] == "warning" for r in rows) > 50
    # msprobe's rules stay available
    ms = compare(dumpdb.open(tf_archive), target, "fp32", store_results=False, rules="msprobe")
    assert ms.summary["rules"] == "msprobe" and ms.first_divergence is not None


@pytest.mark.parametrize("target", ["fp32_act0", "fp16_act0"])
def test_inserted_scaled_activation_is_named(tf_archive, target):
    """Layer 0's activation scaled by 1.25 inserts a Mul (Expand/_Muls/Mul): it is named."""
    out = compare(dumpdb.open(tf_archive), target, "fp32", store_results=False)
    fd = out.first_divergence
    assert fd is not None
    # The target runs one Expand Mul more than the bench: the content check re-aligns that
    # family, the inserted Mul has no bench partner and is named as the op that produced
    # the departing input (before, exact names paired it with the bench's unrelated Mul-op0).
    origin = fd.get("origin_op") or fd["target_name"]
    assert origin.startswith("Expand_") and "Mul" in origin
    shapes = dumpdb.open(tf_archive).sql("SELECT shape FROM tensors WHERE run = ? AND op_name = ?",
                                         [target, origin])["shape"].to_pylist()
    assert [1, 32, 256] in shapes  # the feed-forward width (4 x 64): the activation's output


def test_float16_overflow_is_named(tf_archive):
    out = compare(dumpdb.open(tf_archive), "fp16_big", "fp32_big", store_results=False)
    fd = out.first_divergence
    assert fd is not None and fd["op_type"] == "Mul" and "overflow" in fd["err_message"]
    assert fd["target_name"].startswith("Expand_")


def test_clean_fp16_against_fp32_does_not_depart(tf_archive, clean_fp16):
    out = clean_fp16
    assert out.first_divergence is None and out.summary["error"] == 0
    assert out.summary["precision_dtype"] == "float16"
    r = CliRunner().invoke(app, ["first-divergence", "fp16", "fp32", "-a", str(tf_archive)])
    assert r.exit_code == 0 and "no departure beyond float16 precision" in r.output


def test_clean_fp16_pairs_every_fp32_tensor_with_the_same_op_type(tf_archive, clean_fp16):
    out = clean_fp16
    a = dumpdb.open(tf_archive)
    bench = {r["tensor_id"]: r for r in a.sql("SELECT tensor_id, op_type FROM tensors WHERE run = 'fp32'").to_pylist()}
    rows = out.results.to_pylist()
    assert out.summary["unmatched_bench"] == 0
    assert {r["bench_tensor_id"] for r in rows} == set(bench)
    assert all(r["op_type"] == bench[r["bench_tensor_id"]]["op_type"] for r in rows)
    unmatched = {u["name"] for u in out.unmatched.to_pylist()}
    assert unmatched and all("Cast" in n or "Reshape" in n or n.startswith("Expand_") for n in unmatched)
    assert out.summary["strategies"]["sequence"] > 0 and out.summary["strategies"]["order"] == 0


def _cos(x: np.ndarray, y: np.ndarray) -> float:
    x, y = x.astype(np.float64).ravel(), y.astype(np.float64).ravel()
    nx, ny = np.linalg.norm(x), np.linalg.norm(y)
    if nx == 0 or ny == 0:
        return 1.0 if nx == ny else 0.0
    return float(x @ y / (nx * ny))


def test_clean_fp16_no_pair_misses_a_better_partner(tf_archive, clean_fp16):
    """Brute force: no target tensor is paired with a bench tensor of cosine <= 0.99 while a
    bench tensor of the same op type, io, slot and shape has cosine > 0.99 with it."""
    a = dumpdb.open(tf_archive)
    bench = a.sql("SELECT tensor_id, op_type, io, slot, shape FROM tensors WHERE run = 'fp32'").to_pylist()
    with a:
        arrays = {row["tensor_id"]: array for row, array in
                  a.tensors("SELECT tensor_id FROM tensors WHERE run IN ('fp16', 'fp32')")}

    def tensor(i):
        return arrays[i]

    checked = 0
    for r in clean_fp16.results.to_pylist():
        t, b = tensor(r["target_tensor_id"]), tensor(r["bench_tensor_id"])
        if t.size > 1 and t.size == b.size and _cos(t, b) > 0.99:
            continue
        checked += 1
        better = [x["tensor_id"] for x in bench if x["tensor_id"] != r["bench_tensor_id"]
                  and (x["op_type"], x["io"], x["slot"]) == (r["op_type"], r["io"], r["slot"])
                  and tuple(x["shape"]) == t.shape and t.size > 1 and _cos(t, tensor(x["tensor_id"])) > 0.99]
        assert not better, (r["target_name"], r["io"], r["slot"], r["bench_name"], better)
    assert checked > 0  # there are low-cosine pairs to check (one-element tensors, zero tensors...)


def test_clean_pair_does_not_depart_and_cli_exit_codes(tf_archive):
    out = compare(dumpdb.open(tf_archive), "fp32", "fp32", store_results=False)
    assert out.first_divergence is None and out.summary["error"] == 0
    r = CliRunner().invoke(app, ["first-divergence", "fp32", "fp32", "-a", str(tf_archive)])
    assert r.exit_code == 0 and "no departure beyond float32 precision" in r.output
    r = CliRunner().invoke(app, ["first-divergence", "fp16_ln1", "fp32", "-a", str(tf_archive)])
    assert r.exit_code == 1 and "LayerNorm" in r.output and "input." in r.output and "output." in r.output
    r = CliRunner().invoke(app, ["compare", "fp16", "fp32", "-a", str(tf_archive), "--no-store"])
    assert r.exit_code == 0 and "unmatched 70 target, 0 bench" in r.output, r.output


def test_diff_is_a_longest_common_subsequence_on_small_cases():
    rng = random.Random(7)
    for _ in range(200):
        a = [rng.choice("abcdef") for _ in range(rng.randint(0, 30))]
        b = [rng.choice("abcdef") for _ in range(rng.randint(0, 30))]
        pairs = diff(a, b)
        assert all(a[i] == b[j] for i, j in pairs)
        assert all(i1 < i2 and j1 < j2 for (i1, j1), (i2, j2) in zip(pairs, pairs[1:]))
        best = len(_dp(a, b, 0, len(a), 0, len(b)))
        assert len(pairs) == best  # small windows: the exact LCS


def test_diff_survives_insertions_and_deletions():
    a = [f"op{i}" for i in range(1000)]
    b = list(a)
    del b[100:108]                     # 8 ops removed
    b[500:500] = ["cast"] * 5          # 5 ops inserted
    pairs = diff(a, b)
    assert len(pairs) == 992
    assert all(a[i] == b[j] for i, j in pairs)


def test_sequence_key_drops_amp_wrappers_counters_and_casts():
    t = "Default/network-LossCell/net-_OutputTo32/_backbone-LM/encoder-TransformerEncoder/norm-_OutputTo16/" \
        "_backbone-LayerNorm/LayerNorm-op3"
    b = "Default/network-LossCell/net-LM/encoder-TransformerEncoder/norm-LayerNorm/LayerNorm-op0"
    assert sequence_key("LayerNorm", t) == sequence_key("LayerNorm", b)
    assert sequence_key("Cast", t) is None
    assert sequence_key("Functional.to", "Functional.to.3.forward") is None
    assert sequence_key("Parameter", "net._backbone.encoder.layers.0.dense1.weight") == \
        sequence_key("Parameter", "net.encoder.layers.0.dense1.weight")


def test_sequence_strategy_pairs_through_inserted_ops():
    """Unequal counts (order refuses them) and shifted -opN counters: sequence pairs the rest."""
    import pyarrow as pa

    def table(names, start):
        return pa.table({"tensor_id": list(range(start, start + len(names))),
                         "op_type": [n.split("/")[-1].split("-")[0] for n in names],
                         "op_name": names, "io": ["output"] * len(names), "slot": [0] * len(names),
                         "position": list(range(len(names)))})

    bench = [f"Default/net-LM/layer{i}/Add-op{i}" for i in range(6)]
    target = [f"Default/net-_OutputTo32/_backbone-LM/layer{i}/Add-op{i + 1}" for i in range(6)]
    target.insert(3, "Default/net-_OutputTo32/_backbone-LM/Cast-op0")
    target.insert(4, "Default/net-_OutputTo32/_backbone-LM/layer9/Reshape-op0")
    al = align(table(target, 1), table(bench, 100), strategies=("exact", "normalized", "sequence", "order"))
    pairs = {p["target_tensor_id"]: p["bench_tensor_id"] for p in al.pairs.to_pylist()}
    assert al.counts()["sequence"] == 6 and al.unmatched_bench.num_rows == 0
    by_name = {n: i for i, n in enumerate(target, 1)}
    for i in range(6):
        assert pairs[by_name[target[i if i < 3 else i + 2]]] == 100 + i


def test_registered_metric_reaches_results_and_parquet(tmp_path):
    """Adding a metric is one registry entry: it is computed per pair and returned."""
    metric = registry.Metric("max_abs_sum_test", "tensor", "|sum(x) - sum(y)| (test)",
                             function=lambda t, b: float(abs(t.astype(np.float64).sum() - b.astype(np.float64).sum())))
    registry.register(metric)
    try:
        import pyarrow.parquet as pq

        from dumpdb.render.msprobe_csv import write_parquet

        archive = tmp_path / "a.dumpdb"
        assert dumpdb.ingest(TF / "fp32", archive=archive, run="a").ok
        assert dumpdb.ingest(TF / "fp32_ln1", archive=archive, run="b").ok
        out = compare(dumpdb.open(archive), "b", "a", store_results=True)
        values = [v for v in out.results["max_abs_sum_test"].to_pylist() if v is not None]
        assert values and max(values) > 0
        assert "max_abs_sum_test" in pq.read_table(write_parquet(out.results, tmp_path / "r.parquet")).column_names
    finally:
        registry.unregister("max_abs_sum_test")


def test_html_report_shows_departure_errors_floor_plot_and_insertions(tf_archive, tmp_path):
    from dumpdb.render.report import write_compare_report

    out = compare(dumpdb.open(tf_archive), "fp16_ln1", "fp32", store_results=False)
    page = write_compare_report(tmp_path / "r.html", summary=out.summary, results=out.results,
                                unmatched=out.unmatched, first_divergence=out.first_divergence).read_text()
    assert "First divergence" in page and "norm1-_OutputTo16" in page
    assert "<th>error / floor</th>" in page and "<td>input</td>" in page and "<td>output</td>" in page
    assert "Error against the precision floor" in page and "floor x 64" in page
    assert "Insertions (ops only the target has): " in page and "Cast-op" in page
    clean = compare(dumpdb.open(tf_archive), "fp16", "fp32", store_results=False)
    page = write_compare_report(tmp_path / "c.html", summary=clean.summary, results=clean.results,
                                unmatched=clean.unmatched, first_divergence=clean.first_divergence).read_text()
    assert "No departure beyond float16 precision" in page and "Deletions (ops only the bench has): 0" in page


def _row(io, slot, err, dtype="float16", bench_dtype="float32", **kw):
    """A result row as the engine gives it: euc_dist over a bench of L2 norm 1, 100 elements."""
    row = dict(iteration=0, rank=0, graph_id=0, call_index=None, target_name=kw.pop("op", "op"), io=io, slot=slot,
               mode="tensor", target_dtype=dtype, bench_dtype=bench_dtype, target_shape=[100], bench_shape=[100],
               euc_dist=err, bench_l2norm=1.0, err_message=None, timestamp=kw.pop("ts", 0), pair_index=kw.pop("i", 0),
               target_content_hash=None, target_max=1.0, target_min=-1.0, bench_max=1.0, bench_min=-1.0)
    row.update(kw)
    return row


def test_error_growth_blames_the_op_whose_inputs_do_not_explain_it():
    from precision_rows import first_departure, judge_precision

    u = 2.0 ** -11
    rows = [
        _row("input", 0, 2 * u, op="a", i=0), _row("output", 0, 3 * u, op="a", i=1),          # rounding: pass
        _row("input", 0, 0.01, op="b", i=2, ts=1), _row("output", 0, 0.1, op="b", i=3, ts=1),  # x10: propagated
        _row("input", 0, 0.001, op="c", i=4, ts=2), _row("output", 0, 0.5, op="c", i=5, ts=2),  # x500: origin
        _row("input", 0, 0.01, op="d", i=6, ts=3),                                               # bool from inexact
        _row("output", 0, 0.3, op="d", i=7, ts=3, dtype="bool", bench_dtype="bool"),
    ]
    judge_precision(rows)
    result = {(r["target_name"], r["io"]): r["precision_result"] for r in rows}
    assert result[("a", "output")] == "pass" and result[("b", "output")] == "warning"
    assert result[("c", "output")] == "error" and result[("d", "output")] == "warning"
    fd = first_departure(rows)
    assert fd is not None and fd["row"]["target_name"] == "c"
    assert [e["io"] for e in fd["inputs"] + fd["outputs"]] == ["input", "output"]
    # an int32 vs float32 pair is a dtype error, float16 vs float32 is not
    rows = [_row("output", 0, 0.0, dtype="int32", bench_dtype="float32", op="e")]
    judge_precision(rows)
    assert rows[0]["precision_result"] == "error" and "dtypes differ" in rows[0]["precision_reason"]


def test_a_parameter_that_differs_where_all_before_is_equal_departs_within_the_margin():
    """docs/precision.md "Exact context": an fp32 weight scaled by 1 + 1e-6 (17 x the
    float32 floor, far within the margin 64) is named when every earlier tensor is bitwise
    equal (nothing computed can have rounded it); after an earlier error, or where an op of
    the target produced it, the margin rules as before."""
    from precision_rows import first_departure, judge_precision

    def rows(earlier: float, hash_: str | None = None) -> list[dict]:
        f32 = dict(dtype="float32", bench_dtype="float32")
        return [_row("input", 0, 0.0, op="Functional.linear.0.forward", i=0, **f32),
                _row("output", 0, earlier, op="Functional.linear.0.forward", i=1, **f32),
                _row("input", 0, 0.0, op="Functional.linear.1.forward", i=2, ts=1, **f32),
                _row("input", 1, 1e-6, op="Functional.linear.1.forward", i=3, ts=1, target_content_hash=hash_,
                     _order=3, **f32),
                _row("output", 0, 1e-6, op="Functional.linear.1.forward", i=4, ts=1, **f32)]

    exact = rows(0.0)
    judge_precision(exact)
    assert exact[3]["precision_result"] == "error" and exact[3]["precision_ratio"] < 64
    assert "bitwise equal" in exact[3]["precision_reason"]
    assert first_departure(exact)["row"]["pair_index"] == 3
    after = rows(1e-7)  # an earlier op's rounding: the weight's few ulps say nothing more
    judge_precision(after)
    assert {r["precision_result"] for r in after} == {"pass"}
    made = rows(0.0, "h")  # an op the dump holds (only the target has it) made these bytes
    judge_precision(made, producers={"h": [(2, "Tensor.__mul__.0.forward", False)]})
    assert {r["precision_result"] for r in made} == {"pass"}


def test_an_input_no_op_produced_carries_one_earlier_error_in_the_forward_pass():
    """docs/precision.md "Inputs no compared op explains": a bfloat16 run's fp32 weight
    (no producer) 4x the largest earlier error departs in the forward pass (LEAF_GROWTH
    2.5; the growth default 16 accepted it); 2x is a copy's error; a backward record keeps
    the growth default (gradients accumulate)."""
    from precision_rows import judge_precision

    from dumpdb.compare.precision import LEAF_GROWTH

    def rows(weight: float, name: str = "Functional.linear.1.forward") -> list[dict]:
        return [_row("input", 0, 0.004, op="Functional.linear.0.forward", i=0, dtype="bfloat16"),
                _row("output", 0, 0.005, op="Functional.linear.0.forward", i=1, dtype="bfloat16"),
                _row("input", 1, weight, op=name, i=2, ts=1, dtype="float32")]

    assert LEAF_GROWTH < 4
    for weight, name, want in ((0.02, "Functional.linear.1.forward", "error"),
                               (0.01, "Functional.linear.1.forward", "warning"),
                               (0.02, "Functional.linear.1.backward", "warning")):
        judged = rows(weight, name)
        judge_precision(judged)
        assert judged[2]["precision_result"] == want, (weight, name, judged[2]["precision_reason"])


def test_an_input_an_inserted_op_made_is_judged_by_that_ops_inputs():
    """docs/precision.md "Inputs no compared op explains": a silu only the target runs
    (where the bench runs gelu) feeds fc2 an input 43 x the bfloat16 floor (under the margin
    64) from an fc1 output of error 0.005: beyond 16 x 0.005 + 16 x floor it departs and the
    silu is named as its origin; an input within that (a rewrite's own rounding) passes."""
    from precision_rows import columns_of

    from dumpdb.compare.precision import judge_precision_columns

    def judged(err: float) -> tuple[dict, dict | None]:
        rows = [_row("input", 0, 0.004, op="Functional.linear.0.forward", i=0, dtype="bfloat16", _order=0),
                _row("output", 0, 0.005, op="Functional.linear.0.forward", i=1, dtype="bfloat16",
                     target_content_hash="fc1", _order=1),
                _row("input", 0, err, op="Functional.linear.1.forward", i=2, ts=2, dtype="bfloat16",
                     target_content_hash="act", _order=4)]
        c = columns_of(rows, {"fc1": [(1, "Functional.linear.0.forward", True)],
                              "act": [(3, "Functional.silu.0.forward", False)]})
        c.inputs_of = lambda k: [("fc1", 2)] if k == 3 else []  # the silu reads fc1's output
        return judge_precision_columns(c)

    out, fd = judged(0.168)
    assert out["precision_result"][2] == "error" and out["precision_ratio"][2] < 64
    assert out["origin_op"][2] == "Functional.silu.0.forward" and fd["origin_op"] == "Functional.silu.0.forward"
    assert "0.005 of the inputs of Functional.silu.0.forward" in out["precision_reason"][2].as_py()
    out, fd = judged(0.05)
    assert fd is None and out["precision_result"][2] == "pass"


def test_in_place_optimizer_outputs_holding_other_bytes_are_not_comparable():
    """docs/precision.md "In-place optimizer outputs" (ms-00 of docs/divergence_eval.md):
    MindSpore CPU's AdamWeightDecay updates its inputs in place and its dumped output
    buffers are reused (quirk 6 of the MindSpore CPU corpus README): a call that outputs the
    bytes of an earlier call's tensor makes every output of that op type in the optimizer
    phase not comparable (a warning), so the pair departs nowhere. Without that evidence (an
    update the kernel wrote, or outputs equal to the call's own input 0) a wrong update
    departs there."""
    from precision_rows import first_departure, judge_precision

    scope = "Default/optimizer-AdamWeightDecay"

    def rows(second_out: str) -> list[dict]:
        f32 = dict(dtype="float32", bench_dtype="float32", scope_name=scope, op_type="AdamWeightDecay")
        return [
            _row("input", 0, 0.0, op="Gradients/MatMul-op3", i=0, scope_name="Gradients/MatMul", op_type="MatMul",
                 dtype="float32", target_content_hash="g3"),
            _row("output", 0, 1e-7, op="Gradients/MatMul-op3", i=1, scope_name="Gradients/MatMul", op_type="MatMul",
                 dtype="float32", target_content_hash="g3out"),
            _row("input", 0, 1e-7, op="AdamWeightDecay-op0", i=2, ts=1, target_content_hash="w0", **f32),
            _row("output", 0, 1.0, op="AdamWeightDecay-op0", i=3, ts=1, target_content_hash="o0", **f32),
            _row("input", 0, 1e-7, op="AdamWeightDecay-op1", i=4, ts=2, target_content_hash="w1", **f32),
            _row("output", 0, 1.0, op="AdamWeightDecay-op1", i=5, ts=2, target_content_hash=second_out, **f32)]

    stale = rows("g3")  # op1's output holds the bytes of an earlier MatMul's input: a reused buffer
    judge_precision(stale)
    assert [r["precision_result"] for r in stale if r["io"] == "output"][1:] == ["warning", "warning"]
    assert all("not comparable" in r["precision_reason"] for r in stale[3::2])
    assert first_departure(stale) is None
    for hash_ in ("o1", "w1"):  # its own bytes, or its own input 0's (updated in place): a real update
        real = rows(hash_)
        judge_precision(real)
        assert real[3]["precision_result"] == "error", real[3]["precision_reason"]
        assert first_departure(real)["row"]["pair_index"] == 3
    bench = rows("o1")  # the evidence on the bench side: its op0 and op1 outputs are one tensor
    for r, h in zip(bench, (None, None, None, "b0", None, "b0")):
        r["bench_content_hash"] = h
    judge_precision(bench)
    assert first_departure(bench) is None and bench[5]["precision_result"] == "warning"


def test_a_backward_record_counts_its_forward_inputs_and_elements_switching_at_a_kink():
    """docs/precision.md "Backward records" (0228 of docs/divergence_eval.md): a bfloat16
    relu backward of 32 elements whose incoming gradient is at 0.0028 reads its forward
    input (0.005) too, so one element may take the other side of the kink, and that
    element's gradient differs by up to the largest incoming gradient (0.131 of an output
    of norm 0.262: 0.5). With a forward input equal in both runs, or an output far beyond
    one element's share, it departs."""
    from precision_rows import first_departure, judge_precision

    def rows(forward_err: float, out_err: float, op_type: str = "Functional.relu") -> list[dict]:
        bf = dict(dtype="bfloat16", target_shape=[2, 16], bench_shape=[2, 16], op_type=op_type)
        return [
            _row("input", 0, 0.004, op="Functional.linear.0.forward", i=0, **bf),
            _row("output", 0, forward_err, op="Functional.linear.0.forward", i=1, **bf),
            _row("input", 0, forward_err, op=f"{op_type}.4.forward", i=2, ts=1, **bf),
            _row("output", 0, forward_err, op=f"{op_type}.4.forward", i=3, ts=1, **bf),
            _row("input", 0, 0.0028 * 0.39, op=f"{op_type}.4.backward", i=4, ts=2, bench_l2norm=0.39,
                 bench_max=0.131, bench_min=-0.125, **bf),  # euc_dist: error x the bench's L2 norm
            _row("output", 0, out_err * 0.262, op=f"{op_type}.4.backward", i=5, ts=2, bench_l2norm=0.262,
                 bench_max=0.079, bench_min=-0.125, **bf)]

    flipped = rows(0.005, 0.4)  # beyond 16 x 0.005 + 64 x floor (0.33), within one element's 0.5 more
    judge_precision(flipped)
    assert flipped[5]["precision_result"] == "warning", flipped[5]["precision_reason"]
    assert "1 element(s) of the forward input (error 0.005) switching branch" in flipped[5]["precision_reason"]
    assert first_departure(flipped) is None
    # nothing could flip; beyond one element's 0.5; a smooth function has no kink
    for forward_err, out_err, op_type in ((0.0, 0.4, "Functional.relu"), (0.005, 0.9, "Functional.relu"),
                                          (0.005, 0.4, "Functional.gelu")):
        judged = rows(forward_err, out_err, op_type)
        judge_precision(judged)
        assert judged[5]["precision_result"] == "error", (op_type, forward_err, out_err, judged[5]["precision_reason"])
    # the forward call's input error counts as the backward's: 0.05 explains 0.6 within 16 x
    saved = rows(0.05, 0.6)
    judge_precision(saved)
    assert saved[5]["precision_result"] == "warning"


def test_an_inserted_op_grows_its_inputs_error_by_its_own_calibrated_allowance():
    """docs/precision.md "Inputs no compared op explains" (held-out 0044 and 0058): a
    leaky_relu in place of a relu in float16 feeds the next op an input at 0.0102 from a
    group_norm output at 0.000671: 15x, where ops only the target has grew their inputs'
    error at most 1.13x in clean and rewritten pairs (CHAIN_GROWTH 2.5); the growth default
    16 had let it pass under the 16 roundings' term."""
    from precision_rows import columns_of

    from dumpdb.compare.precision import CHAIN_GROWTH, judge_precision_columns

    def judged(err: float) -> tuple[dict, dict | None]:
        f16 = dict(dtype="float16")
        rows = [_row("input", 0, 0.0006, op="Functional.group_norm.2.forward", i=0, _order=0, **f16),
                _row("output", 0, 0.000671, op="Functional.group_norm.2.forward", i=1, target_content_hash="gn",
                     _order=1, **f16),
                _row("input", 0, err, op="Tensor.__mul__.2.forward", i=2, ts=2, target_content_hash="act",
                     _order=4, **f16)]
        c = columns_of(rows, {"gn": [(1, "Functional.group_norm.2.forward", True)],
                              "act": [(3, "Functional.leaky_relu.0.forward", False)]})
        c.inputs_of = lambda k: [("gn", 2)] if k == 3 else []
        return judge_precision_columns(c)

    assert CHAIN_GROWTH < 15
    out, fd = judged(0.0102)
    assert out["precision_result"][2] == "error" and fd["origin_op"] == "Functional.leaky_relu.0.forward"
    out, fd = judged(0.0085)  # within 2.5 x 0.000671 + 16 x floor: a rewrite's rounding
    assert fd is None


def test_the_html_report_lists_not_comparable_rows():
    """The HTML report's evidence section shows the rows labelled not comparable (an
    in-place optimizer's reused output buffers) beside the noise rows."""
    import pyarrow as pa

    from dumpdb.render.report import _evidence_section

    reason = ("not comparable: an output of the in-place optimizer kernel AdamWeightDecay holds the bytes of an "
              "earlier tensor of its run")
    table = pa.table({"pair_index": [0, 1], "target_name": ["AdamWeightDecay-op0", "MatMul-op1"], "io": ["output"] * 2,
                      "slot": [0, 0], "precision_result": ["warning", "warning"],
                      "precision_reason": [reason, "error 0.1 propagated"]})
    html = _evidence_section(table)
    assert 'id="not-comparable"' in html and "(1 pairs)" in html and "AdamWeightDecay-op0" in html
    assert "MatMul-op1" not in html


def test_reason_fields_format_as_str_format_row_by_row():
    """precision._format groups a ``.Ng`` float column by its rounded digits before formatting
    (one text per group): every row still reads exactly as ``template.format`` writes it,
    across magnitudes, signs, zeros, NaN/Inf, subnormals, float32 and values at rounding ties."""
    from dumpdb.compare.precision import _format

    rng = np.random.default_rng(7)
    n = 8000
    specials = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 5e-324, 1e-310, 0.125, 0.15, 1.005, 2.675, 999.5,
                         9995.0, 1e16, 123456789.0, 1e-5, 9.995e-5])
    cols = [np.exp(rng.normal(0, 40, n)) * rng.choice([-1.0, 1.0], n),
            rng.integers(0, 100000, n) / 10000.0 + 0.00005,  # many values on a 3-digit tie
            np.nextafter(10.0 ** rng.integers(-20, 20, n), rng.choice([0.0, np.inf], n)),  # beside powers of 10
            np.resize(specials, n)]
    names = np.resize(np.array(["MatMul", None, "Cast"], dtype=object), n)
    for col in cols:
        for template in ("error {:.3g} x {:.1g} ({}) {:.6g}", "{:g}/{:.3g}"):
            with np.errstate(over="ignore"):  # float32: beyond its range, inf
                args = (col, col[::-1].copy(), names, col.astype(np.float32))[:template.count("{")]
            want = [template.format(*row) for row in zip(*(a.tolist() for a in args))]
            assert _format(template, *args).tolist() == want
