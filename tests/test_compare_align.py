"""dumpdb.compare.align: pairing target and bench tensors, on the real MindSpore d1/d2 and
a_tensor_all_eval cases and the real msprobe dumps in tests/data, plus small synthetic rows
for the rules the real data cannot show. Expected pairs and counts are derived here from the
dump files (npy file names, dump.json) with the test's own parsing, not from dumpdb."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import DATA, ms_case

import dumpdb
from dumpdb.compare.align import STRATEGIES, Alignment, align, load_mapping, normalize_name

MSP = DATA / "msprobe"
GROUP = ("iteration", "rank")
OP_COUNTER = re.compile(r"-op\d+$")

# d1's fc1 ReLU output vs d2's same tensor after the bf16 round trip (Cast to bfloat16 and back:
# IR Cast-op5, file ..._Cast-op1, float32): the comparison a user asks for with a mapping.
RELU_FC1 = "Default/network-WithLossCell/_backbone-LeNet5/relu-ReLU/ReLU-op2"
BF16_ROUNDTRIP = "Default/network-WithLossCell/_backbone-LeNet5/Cast-op5"


# --------------------------------------------------------------------------- helpers


def npy_keys(case: str, graph: str, iteration: str) -> dict[tuple, str]:
    """{(op_name, io, slot): op_type} of one iteration directory, from the npy file names
    ``{op_type}.{op_name}.{task}.{stream}.{timestamp}.{io}.{slot}.{format}.{dtype}.npy``."""
    out = {}
    for f in (ms_case(case) / "rank_0" / "LeNet5" / graph / iteration).glob("*.npy"):
        p = f.name.split(".")
        key = (p[1], p[5], int(p[6]))
        assert key not in out
        out[key] = p[0]
    return out


def select(archive: Path, where: str) -> pa.Table:
    """Tensor rows + execution-order position, as the compare engine selects them."""
    t = dumpdb.open(archive).sql(
        "SELECT t.*, e.position FROM tensors t LEFT JOIN execution_order e "
        f"USING (run, rank, graph_id, scope_name) WHERE {where}")
    assert len(set(t.column("tensor_id").to_pylist())) == t.num_rows
    return t


def rows_by_id(*tables: pa.Table) -> dict[int, dict]:
    return {r["tensor_id"]: r for t in tables for r in t.to_pylist()}


def pair_list(al: Alignment) -> list[tuple[int, int, str]]:
    p = al.pairs
    return list(zip(p["target_tensor_id"].to_pylist(), p["bench_tensor_id"].to_pylist(),
                    p["match_strategy"].to_pylist()))


def check_partition(al: Alignment, target: pa.Table, bench: pa.Table) -> None:
    """One-to-one pairs; every tensor of each side is paired or listed unmatched, never both."""
    pairs = pair_list(al)
    tids = [p[0] for p in pairs]
    bids = [p[1] for p in pairs]
    assert len(set(tids)) == len(tids) and len(set(bids)) == len(bids)
    ut = al.unmatched_target["tensor_id"].to_pylist()
    ub = al.unmatched_bench["tensor_id"].to_pylist()
    assert sorted(tids + ut) == sorted(target["tensor_id"].to_pylist())
    assert sorted(bids + ub) == sorted(bench["tensor_id"].to_pylist())
    assert al.pairs.schema.names == ["target_tensor_id", "bench_tensor_id", "match_strategy", "realigned"]
    assert al.unmatched_target.schema.names == ["tensor_id", "name", "io", "slot"]
    assert al.pairs.num_rows > 0 and set(al.pairs["match_strategy"].to_pylist()) <= set(STRATEGIES)


def msprobe_leaves(dump_json: Path) -> list[str]:
    """Tensor data names of a dump.json, walked here: ``{key}.input.{path}``,
    ``{key}.output.{path}``, ``{key}.parameters.{name}``, ``{key}.{param}`` (parameters_grad)."""
    data = json.loads(dump_json.read_text())["data"]

    def leaf(v):
        return isinstance(v, dict) and "dtype" in v and "shape" in v

    def walk(v, path):
        if leaf(v):
            yield path
        elif isinstance(v, list):
            for i, x in enumerate(v):
                yield from walk(x, path + (str(i),))
        elif isinstance(v, dict):
            for k, x in v.items():
                yield from walk(x, path + (str(k),))

    out = []
    for key, rec in data.items():
        if ".parameters_grad." in key:
            for param, v in rec.items():
                out += [f"{key}.{param}" for _ in walk(v, ())]
            continue
        for section, v in rec.items():
            io = {"input_args": "input", "input_kwargs": "input", "input": "input", "output": "output",
                  "parameters": "parameters"}[section]
            out += [".".join((key, io) + p) for p in walk(v, ())]
    assert len(set(out)) == len(out)
    return out


def table(rows: list[dict]) -> pa.Table:
    """Synthetic tensor rows (missing columns stay missing: align must cope)."""
    cols = sorted({k for r in rows for k in r})
    return pa.table({c: [r.get(c) for r in rows] for c in cols})


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def ms(tmp_path_factory) -> Path:
    archive = tmp_path_factory.mktemp("align") / "ms.dumpdb"
    for case, run in (("d1_compare_fp32_iter0", "fp32"), ("d2_compare_fp16_bf16_iter0", "fp16"),
                      ("a_tensor_all_eval", "eval")):
        assert dumpdb.ingest(ms_case(case), archive=archive, run=run).ok
    return archive


@pytest.fixture(scope="module")
def msp(tmp_path_factory) -> Path:
    archive = tmp_path_factory.mktemp("align") / "msprobe.dumpdb"
    for case in ("statistics_mix_2rank_gloo", "statistics_mix_md5"):
        assert dumpdb.ingest(MSP / case, archive=archive, run=case).ok
    return archive


@pytest.fixture(scope="module")
def d1d2(ms):
    return select(ms, "run = 'fp32' AND iteration = 0"), select(ms, "run = 'fp16' AND iteration = 0")


# --------------------------------------------------------------------------- MindSpore d1 vs d2


def test_d1_vs_d2_pairs_every_common_op_and_leaves_extra_casts(d1d2):
    d1, d2 = d1d2
    k1 = npy_keys("d1_compare_fp32_iter0", "0", "0")
    k2 = npy_keys("d2_compare_fp16_bf16_iter0", "0", "0")
    common, only2, only1 = k1.keys() & k2.keys(), k2.keys() - k1.keys(), k1.keys() - k2.keys()
    assert (d1.num_rows, d2.num_rows) == (len(k1), len(k2))

    al = align(d1, d2, group_by=GROUP)
    check_partition(al, d1, d2)
    assert al.counts() == {"exact": len(common), "normalized": 0, "sequence": 0, "order": 0, "mapping": 0,
                           "unmatched_target": len(only1), "unmatched_bench": len(only2)}

    rows = rows_by_id(d1, d2)
    key = lambda r: (r["op_name"], r["io"], r["slot"])  # noqa: E731
    paired = {key(rows[t]): key(rows[b]) for t, b, _ in pair_list(al)}
    assert paired == {k: k for k in common}  # every d1 tensor whose op is in d2, with that op

    extra = [rows[i] for i in al.unmatched_bench["tensor_id"].to_pylist()]
    assert {key(r) for r in extra} == only2
    assert {k2[k] for k in only2} == {"Cast", "Assign"} == {r["op_type"] for r in extra}
    scopes = [r["scope_name"] for r in extra]
    for family in (r"Default/Cast-op\d+", r"Default/optimizer-Momentum/Cast-op\d+", r"Default/Assign-op\d+",
                   r"Default/network-WithLossCell/_backbone-LeNet5/.*Cast-op\d+"):
        assert any(re.fullmatch(family, s) for s in scopes), family
    assert all(re.fullmatch(r"(Gradients/)?Default/.*(Cast|Assign)-op\d+", s) for s in scopes)


@pytest.mark.parametrize("strategy", ["normalized", "order"])
def test_d1_vs_d2_each_fallback_alone_finds_the_same_pairs(d1d2, strategy):
    """Without exact names: -opN stripped + rank in execution order (normalized), or rank
    within op type (order), gives exactly the name-identical pairs on the real data."""
    d1, d2 = d1d2
    exact = align(d1, d2, group_by=GROUP, strategies=("exact",))
    alone = align(d1, d2, group_by=GROUP, strategies=(strategy,))
    check_partition(alone, d1, d2)
    assert {(t, b) for t, b, _ in pair_list(alone)} == {(t, b) for t, b, _ in pair_list(exact)}
    assert set(alone.pairs["match_strategy"].to_pylist()) == {strategy}


def test_order_pairs_only_equal_counts_of_an_op_type(d1d2):
    d1, d2 = d1d2
    k1 = npy_keys("d1_compare_fp32_iter0", "0", "0")
    k2 = npy_keys("d2_compare_fp16_bf16_iter0", "0", "0")
    c1 = Counter((t, io, slot) for (_, io, slot), t in k1.items())
    c2 = Counter((t, io, slot) for (_, io, slot), t in k2.items())
    expected = sum(n for k, n in c1.items() if c2.get(k) == n)
    assert c2[("Cast", "output", 0)] and not c1[("Cast", "output", 0)]  # counts differ: no guess

    al = align(d1, d2, group_by=GROUP, strategies=("order",))
    assert al.counts()["order"] == expected
    rows = rows_by_id(d1, d2)
    for t, b, _ in pair_list(al):
        assert [rows[t][c] for c in ("op_type", "io", "slot")] == [rows[b][c] for c in ("op_type", "io", "slot")]
    unequal = {k[0] for k in c1.keys() | c2.keys() if c1.get(k) != c2.get(k)}
    paired_types = {rows[t]["op_type"] for t, _, _ in pair_list(al)}
    assert not paired_types & unequal


def test_order_synthetic_unequal_counts_stay_unmatched():
    target = table([
        {"tensor_id": i, "op_type": "MatMul", "op_name": f"t/MatMul-op{i}", "io": "output", "slot": 0,
         "position": 10 - i} for i in range(3)] + [
        {"tensor_id": 7, "op_type": "ReLU", "op_name": "t/relu", "io": "output", "slot": 0, "position": None,
         "timestamp": 5},
        {"tensor_id": 8, "op_type": "ReLU", "op_name": "t/relu2", "io": "output", "slot": 0, "position": None,
         "timestamp": 4}])
    bench = table([
        {"tensor_id": 100 + i, "op_type": "MatMul", "op_name": f"b/M{i}", "io": "output", "slot": 0,
         "position": i} for i in range(2)] + [
        {"tensor_id": 200, "op_type": "ReLU", "op_name": "b/r1", "io": "output", "slot": 0, "timestamp": 1},
        {"tensor_id": 201, "op_type": "ReLU", "op_name": "b/r2", "io": "output", "slot": 0, "timestamp": 2},
        {"tensor_id": 202, "op_type": "ReLU", "op_name": "b/r3", "io": "input", "slot": 0, "timestamp": 3}])
    al = align(target, bench, strategies=("order",))
    check_partition(al, target, bench)
    # ReLU outputs 2 vs 2: paired in timestamp order (no position); MatMul 3 vs 2 and ReLU
    # input 0 vs 1: nothing guessed.
    assert pair_list(al) == [(8, 200, "order"), (7, 201, "order")]
    assert sorted(al.unmatched_target["tensor_id"].to_pylist()) == [0, 1, 2]


# --------------------------------------------------------------------------- -opN differs


def test_op_counter_differs_pairs_via_normalized(ms):
    """Eval graph (graph 1, iteration 3) numbers its files ReLU-op4..7, Conv2D-op1, ...; the
    training graph of d1 says ReLU-op0..3, Conv2D-op0: same ops, paired by normalized."""
    ev = select(ms, "run = 'eval' AND io = 'output'")
    d1 = select(ms, "run = 'fp32' AND iteration = 0")
    ke = {k: t for k, t in npy_keys("a_tensor_all_eval", "1", "3").items() if k[1] == "output"}
    k1 = npy_keys("d1_compare_fp32_iter0", "0", "0")
    exact = ke.keys() & k1.keys()
    strip = lambda keys: Counter((OP_COUNTER.sub("", n), io, s) for n, io, s in keys)  # noqa: E731
    se, s1 = strip(ke.keys() - exact), strip(k1.keys() - exact)
    normalized = sum(n for k, n in se.items() if s1.get(k) == n)
    assert exact and normalized

    al = align(ev, d1)  # iteration 3 vs 0: no group_by
    check_partition(al, ev, d1)
    counts = al.counts()
    assert (counts["exact"], counts["normalized"]) == (len(exact), normalized)
    assert counts["unmatched_target"] == len(ke) - len(exact) - normalized

    rows = rows_by_id(ev, d1)
    got = {rows[t]["op_name"].rsplit("_", 1)[-1]: rows[b]["op_name"].rsplit("_", 1)[-1]
           for t, b, s in pair_list(al) if s == "normalized" and rows[t]["op_type"] in ("ReLU", "MaxPool")}
    assert got == {"ReLU-op4": "ReLU-op0", "ReLU-op5": "ReLU-op1", "ReLU-op6": "ReLU-op2",
                   "ReLU-op7": "ReLU-op3", "MaxPool-op2": "MaxPool-op0", "MaxPool-op3": "MaxPool-op1"}
    for t, b, _s in pair_list(al):
        assert rows[t]["shape"] == rows[b]["shape"]
        assert OP_COUNTER.sub("", rows[t]["op_name"]) == OP_COUNTER.sub("", rows[b]["op_name"])
    assert al.unmatched_target["name"].to_pylist() == ["x"]  # eval input parameter; d1 has inputs0


def test_normalize_name_rules():
    # 1 + 2: -opN dropped, '/' == '_' (file name vs IR scope of the same real tensor)
    assert normalize_name("Default_network-WithLossCell__backbone-LeNet5_relu-ReLU_ReLU-op4") == \
        normalize_name("Default/network-WithLossCell/_backbone-LeNet5/relu-ReLU/ReLU-op0")
    assert normalize_name("Gradients/Default/network-WithLossCell/_backbone-LeNet5/conv1-Conv2d/Grad_Conv2D/"
                          "Conv2DBackpropFilter-op1") == normalize_name(
        "Gradients_Default_network-WithLossCell__backbone-LeNet5_conv1-Conv2d_Grad_Conv2D_Conv2DBackpropFilter-op0")
    # Gradients/ is kept: it is what tells backward from forward
    assert normalize_name("Gradients/Default/x/MatMul-op3") != normalize_name("Default/x/MatMul-op3")
    # 3: Parameter names: IR '.' vs file '_'
    assert normalize_name("moments.fc1.weight") == normalize_name("moments_fc1_weight") == "moments_fc1_weight"
    # 4: msprobe keys keep their dots and call index; DDP's module. wrapper is dropped
    assert normalize_name("Functional.conv2d.0.forward") == "Functional.conv2d.0.forward"
    assert normalize_name("Module.module.conv.Conv2d.forward.0") == "Module.conv.Conv2d.forward.0"
    assert normalize_name("Module.module.mlp.0.Linear.parameters_grad.0") == "Module.mlp.0.Linear.parameters_grad.0"
    assert normalize_name("Module.module.Net.forward.0") == "Module.Net.forward.0"
    assert normalize_name("Module.module.forward.0") == "Module.module.forward.0"  # nothing left to strip


# --------------------------------------------------------------------------- mapping


def test_mapping_wins_over_exact_csv_and_yaml(d1d2, tmp_path):
    d1, d2 = d1d2
    (tmp_path / "m.csv").write_text(f"{RELU_FC1},{BF16_ROUNDTRIP}\n")
    (tmp_path / "h.csv").write_text(f"target,bench\n{RELU_FC1},{BF16_ROUNDTRIP}\n")
    (tmp_path / "m.yaml").write_text(f"{RELU_FC1}: {BF16_ROUNDTRIP}\n")
    maps = [load_mapping(tmp_path / f) for f in ("m.csv", "h.csv", "m.yaml")]
    assert maps[0] == maps[1] == maps[2] == {RELU_FC1: BF16_ROUNDTRIP}

    plain = align(d1, d2, group_by=GROUP)
    al = align(d1, d2, group_by=GROUP, mapping=maps[0])  # default strategies: mapping listed last
    check_partition(al, d1, d2)
    rows = rows_by_id(d1, d2)
    mapped = [(rows[t], rows[b]) for t, b, s in pair_list(al) if s == "mapping"]
    assert len(mapped) == 1
    t, b = mapped[0]
    assert (t["scope_name"], t["io"], t["slot"]) == (RELU_FC1, "output", 0)
    assert (b["op_name"], b["dtype"], b["shape"]) == ("Default_network-WithLossCell__backbone-LeNet5_Cast-op1",
                                                       "float32", [4, 120])
    # d2's own ReLU-op2 lost its exact partner to the explicit mapping
    counts, before = al.counts(), plain.counts()
    assert counts["exact"] == before["exact"] - 1 and counts["unmatched_bench"] == before["unmatched_bench"]
    assert "Default_network-WithLossCell__backbone-LeNet5_relu-ReLU_ReLU-op2" in al.unmatched_bench["name"].to_pylist()

    with pytest.raises(ValueError, match="'mapping' is not among the strategies"):
        align(d1, d2, mapping=maps[0], strategies=("exact",))
    same = align(d1, d2, group_by=GROUP, mapping=maps[0], strategies=("exact", "mapping"))
    assert pair_list(same) == pair_list(al)


def test_msprobe_cell_layer_and_data_mapping(msp):
    single = select(msp, "run = 'statistics_mix_md5' AND iteration = 0")
    ddp = select(msp, "run = 'statistics_mix_2rank_gloo' AND rank = 0 AND iteration = 0")
    rows = rows_by_id(single, ddp)
    only = ("mapping",)

    # cell mapping {cell_name}.{class_name}: prefix runs of whole segments
    al = align(single, ddp, mapping={"conv.Conv2d": "module.conv.Conv2d"}, strategies=only)
    names = {rows[t]["op_name"] for t, _, _ in pair_list(al)}
    assert names and all(n.startswith("Module.conv.Conv2d.") for n in names)
    expected = sum(1 for r in single.to_pylist() if r["op_name"].startswith("Module.conv.Conv2d."))
    assert al.counts()["mapping"] == expected
    for t, b, _ in pair_list(al):
        assert rows[b]["op_name"] == rows[t]["op_name"].replace("Module.", "Module.module.", 1)
        assert [rows[t][c] for c in ("io", "slot", "arg_name", "slot_path")] == \
            [rows[b][c] for c in ("io", "slot", "arg_name", "slot_path")]

    # layer-mapping style single segment rename
    al = align(single, ddp, mapping={"mlp": "module.mlp"}, strategies=only)
    assert al.counts()["mapping"] == sum(1 for r in single.to_pylist() if r["op_name"].startswith("Module.mlp."))

    # data mapping: one tensor to one tensor, by msprobe data names
    data = {"Module.conv.Conv2d.forward.0.parameters.weight": "Module.module.conv.Conv2d.forward.0.parameters.weight",
            "Module.conv.Conv2d.parameters_grad.0.bias": "Module.module.conv.Conv2d.parameters_grad.0.bias",
            "Functional.linear.1.forward.input.2": "Functional.linear.1.forward.input.2"}
    al = align(single, ddp, mapping=data, strategies=only)
    got = {(rows[t]["op_name"], rows[t]["io"], rows[t]["slot_path"]) for t, _, _ in pair_list(al)}
    assert got == {("Module.conv.Conv2d.forward.0", "parameter", "weight"),
                   ("Module.conv.Conv2d.parameters_grad.0", "parameter_grad", "bias.0"),
                   ("Functional.linear.1.forward", "input", "2")}


def test_mapping_api_prefix_and_cell_to_module():
    target = table([
        {"tensor_id": 1, "op_type": "Functional.abs", "op_name": "Functional.abs.0.forward", "io": "input", "slot": 0},
        {"tensor_id": 2, "op_type": "Functional.abs", "op_name": "Functional.abs.0.forward", "io": "output", "slot": 0},
        {"tensor_id": 3, "op_type": "Cell.Dense", "op_name": "Cell.fc2.Dense.forward.0", "io": "output", "slot": 0},
        {"tensor_id": 4, "op_type": "Cell.Dense", "op_name": "Cell.fc2.Dense.forward.0", "io": "parameter",
         "arg_name": "weight", "slot_path": "weight"}])
    bench = table([
        {"tensor_id": 11, "op_type": "Torch.abs", "op_name": "Torch.abs.0.forward", "io": "input", "slot": 0},
        {"tensor_id": 12, "op_type": "Torch.abs", "op_name": "Torch.abs.0.forward", "io": "output", "slot": 0},
        {"tensor_id": 13, "op_type": "Module.Linear", "op_name": "Module.fc2.Linear.forward.0", "io": "output",
         "slot": 0},
        {"tensor_id": 14, "op_type": "Module.Linear", "op_name": "Module.fc2.Linear.forward.0", "io": "parameter",
         "arg_name": "weight", "slot_path": "weight"}])
    al = align(target, bench, mapping={"Functional.abs": "Torch.abs", "fc2.Dense": "fc2.Linear"})
    assert pair_list(al) == [(1, 11, "mapping"), (2, 12, "mapping"), (3, 13, "mapping"), (4, 14, "mapping")]


def test_mapping_never_guesses_many_to_one():
    target = table([{"tensor_id": i, "op_name": n, "io": "output", "slot": 0} for i, n in ((1, "a"), (2, "b"))])
    bench = table([{"tensor_id": 9, "op_name": "c", "io": "output", "slot": 0}])
    al = align(target, bench, mapping={"a": "c", "b": "c"}, strategies=("mapping",))
    assert al.pairs.num_rows == 0 and al.unmatched_target.num_rows == 2


# --------------------------------------------------------------------------- msprobe


def test_msprobe_rank0_vs_rank1_pairs_by_exact_names(msp):
    case = MSP / "statistics_mix_2rank_gloo" / "dump"
    for step in ("step0", "step1"):
        names0 = msprobe_leaves(case / step / "rank0" / "dump.json")
        names1 = msprobe_leaves(case / step / "rank1" / "dump.json")
        assert set(names0) == set(names1)
    n0 = len(msprobe_leaves(case / "step0" / "rank0" / "dump.json"))
    n_all = n0 + len(msprobe_leaves(case / "step1" / "rank0" / "dump.json"))

    r0 = select(msp, "run = 'statistics_mix_2rank_gloo' AND rank = 0 AND iteration = 0")
    r1 = select(msp, "run = 'statistics_mix_2rank_gloo' AND rank = 1 AND iteration = 0")
    al = align(r0, r1)
    check_partition(al, r0, r1)
    assert al.counts() == {"exact": n0, "normalized": 0, "sequence": 0, "order": 0, "mapping": 0,
                           "unmatched_target": 0, "unmatched_bench": 0}
    rows = rows_by_id(r0, r1)
    cols = ("op_name", "io", "slot", "slot_path", "arg_name")
    assert all([rows[t][c] for c in cols] == [rows[b][c] for c in cols] for t, b, _ in pair_list(al))

    # both steps, paired step by step
    a0 = select(msp, "run = 'statistics_mix_2rank_gloo' AND rank = 0")
    a1 = select(msp, "run = 'statistics_mix_2rank_gloo' AND rank = 1")
    al = align(a0, a1, group_by=("iteration",))
    rows = rows_by_id(a0, a1)
    assert al.counts()["exact"] == n_all
    assert all(rows[t]["iteration"] == rows[b]["iteration"] for t, b, _ in pair_list(al))
    # grouped by iteration, step 0 and step 1 never meet
    cross = align(select(msp, "run = 'statistics_mix_2rank_gloo' AND rank = 0 AND iteration = 0"),
                  select(msp, "run = 'statistics_mix_2rank_gloo' AND rank = 1 AND iteration = 1"),
                  group_by=("iteration",))
    assert cross.pairs.num_rows == 0 and cross.unmatched_target.num_rows == n0


def test_msprobe_ddp_wrapper_pairs_via_normalized(msp):
    """Single-process run (proc dir) vs the DDP run's rank 0: same model, modules named
    Module.conv... vs Module.module.conv... (DDP wrapper)."""
    single = msprobe_leaves(MSP / "statistics_mix_md5" / "dump" / "step0" / "proc17250" / "dump.json")
    ddp = msprobe_leaves(MSP / "statistics_mix_2rank_gloo" / "dump" / "step0" / "rank0" / "dump.json")
    exact = set(single) & set(ddp)
    via_ddp = {n for n in set(single) - exact if n.replace("Module.", "Module.module.", 1) in ddp}
    assert exact and via_ddp

    t = select(msp, "run = 'statistics_mix_md5' AND iteration = 0")
    b = select(msp, "run = 'statistics_mix_2rank_gloo' AND rank = 0 AND iteration = 0")
    al = align(t, b)
    check_partition(al, t, b)
    assert al.counts() == {"exact": len(exact), "normalized": len(via_ddp), "sequence": 0, "order": 0, "mapping": 0,
                           "unmatched_target": len(single) - len(exact) - len(via_ddp),
                           "unmatched_bench": len(ddp) - len(exact) - len(via_ddp)}
    assert set(al.unmatched_bench["name"].to_pylist()) == {"Module.module.Net.forward.0",
                                                           "Module.module.Net.backward.0"}


def test_msprobe_call_index_dropped_only_when_unique():
    def rows(prefix: int, names: list[str]) -> list[dict]:
        out = []
        for k, name in enumerate(names):
            for io in ("input", "output"):
                out.append({"tensor_id": prefix + 2 * k + (io == "output"), "op_name": name, "io": io,
                            "slot": 0, "slot_path": "0", "direction": "forward",
                            "op_type": name.rsplit(".", 2)[0]})
        return out

    # target ran relu 3x, bench 2x; target matmul call 3 <-> bench call 2 (unique: paired);
    # add calls 5, 6 <-> 7, 8 (two each: not unique, left to order)
    target = table(rows(0, ["Functional.relu.0.forward", "Functional.relu.1.forward", "Functional.relu.2.forward",
                            "Torch.matmul.3.forward", "Tensor.add.5.forward", "Tensor.add.6.forward"]))
    bench = table(rows(100, ["Functional.relu.0.forward", "Functional.relu.1.forward", "Torch.matmul.2.forward",
                             "Tensor.add.7.forward", "Tensor.add.8.forward"]))
    al = align(target, bench, strategies=("exact", "normalized"))
    by = {t: (b, s) for t, b, s in pair_list(al)}
    assert [by[i][1] for i in range(4)] == ["exact"] * 4
    assert by[6] == (104, "normalized") and by[7] == (105, "normalized")  # matmul.3 <-> matmul.2
    assert not {4, 5, 8, 9, 10, 11} & by.keys()  # relu.2: no bench call left; add: two calls each
    # relu.2 has no partner: unique-call rule needs a call on both sides
    assert al.unmatched_target["name"].to_pylist().count("Functional.relu.2.forward") == 2
    al = align(target, bench)  # sequence (or order) then pairs the two add calls (2 vs 2 of Tensor.add)
    by = {t: (b, s) for t, b, s in pair_list(al)}
    assert all(by[i][1] in ("sequence", "order") for i in range(8, 12))
    # relu ran 3x against 2x: the content check takes its name pairs back and the sequence
    # alignment pairs them again, here with the same partners (not "realigned")
    assert [by[i] for i in range(4)] == [(100 + i, "sequence") for i in range(4)]
    assert not any(al.pairs["realigned"].to_pylist())


# --------------------------------------------------------------------------- mapping files


@pytest.mark.parametrize("name,text,expected", [
    ("plain.csv", "a/b-op0,c/d-op1\n\n# comment\nx,y\n", {"a/b-op0": "c/d-op1", "x": "y"}),
    ("header.csv", "target,bench\na,b\n", {"a": "b"}),
    ("msprobe_header.csv", "NPU Name,Bench Name\na,b\n", {"a": "b"}),
    ("cell.yaml", "fc2.Dense: fc2.Linear\nconv1.Conv2d: conv3.Conv2d\n",
     {"fc2.Dense": "fc2.Linear", "conv1.Conv2d": "conv3.Conv2d"}),
    ("data.yaml", "Functional.flash_attention_score.4.forward.input.0: NPU.npu_fusion_attention.4.forward.input.0\n",
     {"Functional.flash_attention_score.4.forward.input.0": "NPU.npu_fusion_attention.4.forward.input.0"}),
    ("api.yaml", "ms_api: Functional.abs\npt_api: Torch.abs\nms_args:\n- 0\n- 1\npt_args:\n- 0\n- 1\n",
     {"Functional.abs": "Torch.abs"}),
    ("api_list.yml", "- ms_api: Functional.abs\n  pt_api: Torch.abs\n- ms_api: Mint.add\n  pt_api: Torch.add\n",
     {"Functional.abs": "Torch.abs", "Mint.add": "Torch.add"}),
    ("layer.yaml", "ParallelAttention:\n  qkv_proj: query_key_value\n  out_proj: dense\nCell:\n"
                   "  network_with_loss: module\n",
     {"qkv_proj": "query_key_value", "out_proj": "dense", "network_with_loss": "module"}),
    ("pairs.yaml", "- {npu: a, bench: b}\n- [c, d]\n- {target: e, golden: f}\n", {"a": "b", "c": "d", "e": "f"}),
    ("section.yaml", "api_mapping:\n  - ms_api: Mint.abs\n    pt_api: Torch.abs\n", {"Mint.abs": "Torch.abs"}),
    ("m.json", '{"a": "b"}', {"a": "b"}),
])
def test_load_mapping_forms(tmp_path, name, text, expected):
    (tmp_path / name).write_text(text)
    assert load_mapping(tmp_path / name) == expected
    assert load_mapping(str(tmp_path / name)) == expected


@pytest.mark.parametrize("name,text,line,reason", [
    ("cols.csv", "a,b\nc,d,e\n", 2, "expected 2 columns"),
    ("one.csv", "a,b\nc\n", 2, "expected 2 columns"),
    ("twice.csv", "a,b\nc,d\na,x\n", 3, "'a' is mapped to 'b' (line 1) and to 'x'"),
    ("empty_name.csv", "a,\n", 1, "empty target or bench name"),
    ("empty.csv", "", None, "no mapping entries"),
    ("syntax.yaml", "a: b\nc: [d\n", 3, "invalid YAML"),
    ("null.yaml", "a: b\nc:\n", 2, "must be a name"),
    ("scalar.yaml", "just text\n", 1, "expected a mapping"),
    ("empty.yaml", "# nothing\n", None, "no mapping entries"),
    ("args.yaml", "- ms_api: Functional.abs\n  pt_api: Torch.abs\n- ms_api: Tensor.add\n  pt_api: Torch.add\n"
                  "  ms_args: [0, 2]\n  pt_args: [0, 1]\n", 5, "move argument positions"),
    ("half_api.yaml", "ms_api: Functional.abs\nms_args: [0]\n", 1, "needs both ms_api and pt_api"),
    ("layer_twice.yaml", "A:\n  x: y\nB:\n  x: z\n", 4, "'x' is mapped to 'y' (line 2) and to 'z'"),
    ("item.yaml", "- {npu: a, bench: b, extra: c}\n", 1, "a list item must be"),
    ("nested.yaml", "a: b\nc: {d: [e]}\n", 2, "a layer mapping entry must be"),
])
def test_load_mapping_errors_name_file_and_line(tmp_path, name, text, line, reason):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ValueError) as e:
        load_mapping(path)
    msg = str(e.value)
    assert "\n" not in msg and reason in msg
    assert msg.startswith(f"{path}:{line}: " if line else f"{path}: ")


def test_load_mapping_binary_and_missing(tmp_path):
    (tmp_path / "b.yaml").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ValueError, match=r"b\.yaml: not UTF-8"):
        load_mapping(tmp_path / "b.yaml")
    with pytest.raises(FileNotFoundError):
        load_mapping(tmp_path / "absent.csv")


# --------------------------------------------------------------------------- inputs


def test_inputs_missing_columns_nulls_and_errors():
    # only tensor_id + op_name: exact pairs, NULL io/slot compare equal; NULL names too
    t = pa.table({"tensor_id": [1, 2, 3], "op_name": ["a", "b", None]})
    b = pa.table({"tensor_id": [7, 8, 9], "op_name": ["b", None, "z"]})
    al = align(t, b)
    assert pair_list(al) == [(2, 7, "exact"), (3, 8, "exact")]
    assert al.unmatched_target.to_pylist() == [{"tensor_id": 1, "name": "a", "io": None, "slot": None}]

    empty = align(t.slice(0, 0), b.slice(0, 0))
    assert empty.pairs.num_rows == 0 and empty.pairs.schema.field("target_tensor_id").type == pa.int64()

    with pytest.raises(ValueError, match="no tensor_id"):
        align(pa.table({"op_name": ["a"]}), b)
    with pytest.raises(ValueError, match="more than once"):
        align(pa.table({"tensor_id": [1, 1]}), b)
    with pytest.raises(ValueError, match="group_by column"):
        align(t, b, group_by=("iteration",))
    with pytest.raises(ValueError, match="unknown strategy 'fuzzy'"):
        align(t, b, strategies=("exact", "fuzzy"))
    with pytest.raises(TypeError):
        align(t.to_pylist(), b)


def test_100k_rows_per_side_align_completely():
    """100k rows per side align (a quadratic step would hit the test timeout; no timing here)."""
    n = 100_000

    def side(first_id: int, extra: int) -> pa.Table:
        m = n + extra
        return pa.table({
            "tensor_id": pa.array(range(first_id, first_id + m), pa.int64()),
            "op_type": [f"Op{i % 40}" for i in range(m)],
            "op_name": [f"Default/net/block{i // 4}/Op{i % 40}-op{i // 4}" for i in range(m)],
            "io": ["output"] * m, "slot": [i % 4 for i in range(m)],
            "iteration": [0] * m, "rank": [0] * m, "position": [i // 4 for i in range(m)]})

    target, bench = side(1, 0), side(10**7, 40)
    al = align(target, bench, group_by=GROUP, mapping={"block7": "block7"})
    counts = al.counts()
    assert counts["exact"] + counts["mapping"] == n and counts["unmatched_bench"] == 40
    assert counts["mapping"] > 0 and counts["unmatched_target"] == 0


# --------------------------------------------------------------------------- mutation survivors

def test_order_follows_position_before_tensor_id():
    """Execution order is iteration, rank, graph, position, timestamp, then tensor_id: two
    MatMul outputs whose ids run against their positions pair by position."""
    target = table([{"tensor_id": i, "op_type": "MatMul", "io": "output", "slot": 0, "position": 3 - i}
                    for i in (1, 2)])  # id 2 runs first
    bench = table([{"tensor_id": 10 + i, "op_type": "MatMul", "io": "output", "slot": 0, "position": i}
                   for i in (1, 2)])  # id 11 runs first
    al = align(target, bench, strategies=("order",))
    assert pair_list(al) == [(2, 11, "order"), (1, 12, "order")]


def test_sequence_repairs_ops_of_one_token_by_their_statistics():
    """Two reshapes of one token run in the other order on the bench side: the sequence
    diff pairs them by order, the statistics distance (sum of |x - y| / |bench l2norm|
    over l2norm, mean, min, max) re-pairs them: 0 for the right pairs, ~4 for the crossed."""
    def op(tid, counter, position, scale):
        return {"tensor_id": tid, "op_type": "Reshape", "op_name": f"Default/Reshape-op{counter}", "io": "output",
                "slot": 0, "shape": [4], "position": position, "l2norm": 2.0 * scale, "mean": 0.5 * scale,
                "min": 0.0, "max": 1.0 * scale}
    target = table([op(1, 1, 1, 1.0), op(2, 2, 2, 100.0)])
    bench = table([op(11, 7, 1, 100.0), op(12, 8, 2, 1.0)])  # every -opN counter differs
    al = align(target, bench, strategies=("sequence",))
    assert sorted(pair_list(al)) == [(1, 12, "sequence"), (2, 11, "sequence")]


@pytest.mark.parametrize("text,line,message", [
    ("- {target: [a, b], bench: x}\n", 1, "target must be a name (a string)"),
    ("- {target: a, bench: x}\n- just-a-name\n", 2,
     "a list item must be a {target: .., bench: ..} pair or [target, bench]"),
])
def test_mapping_list_errors_name_the_line_and_the_problem(tmp_path, text, line, message):
    (tmp_path / "m.yaml").write_text(text)
    with pytest.raises(ValueError) as err:
        load_mapping(tmp_path / "m.yaml")
    assert str(err.value) == f"{tmp_path / 'm.yaml'}:{line}: {message}"


def test_sequence_tokens_count_output_elements_not_inputs():
    """An op's sequence token carries its outputs' element counts (invariant under the
    reshapes AMP adds), not its inputs': a broadcast Add whose input differs (1 vs 4
    elements) but whose output does not (4) still pairs."""
    def add(tid, io, slot, shape):
        return {"tensor_id": tid, "op_type": "Add", "op_name": "Default/Add-op3", "io": io, "slot": slot,
                "shape": shape, "position": 1}
    target = table([add(1, "input", 0, [4]), add(2, "input", 1, [1]), add(3, "output", 0, [4])])
    bench = table([add(11, "input", 0, [4]), add(12, "input", 1, [4]), add(13, "output", 0, [4])])
    al = align(target, bench, strategies=("sequence",))
    assert sorted(pair_list(al)) == [(1, 11, "sequence"), (2, 12, "sequence"), (3, 13, "sequence")]


def test_mapping_file_syntax_errors_are_one_line_value_errors(tmp_path):
    """A character YAML refuses (no line mark) and a CSV field over csv's limit (131072
    characters) are ValueErrors naming the file and the parser's reason."""
    (tmp_path / "m.yaml").write_text("a: b\x07\n")
    with pytest.raises(ValueError) as err:
        load_mapping(tmp_path / "m.yaml")
    assert str(err.value) == (f"{tmp_path / 'm.yaml'}: invalid YAML: "
                              "unacceptable character #x0007: special characters are not allowed")
    (tmp_path / "m.csv").write_text("a," + "x" * 200_000 + "\n")
    with pytest.raises(ValueError) as err:
        load_mapping(tmp_path / "m.csv")
    assert str(err.value) == f"{tmp_path / 'm.csv'}:1: invalid CSV: field larger than field limit (131072)"


def test_unmatched_rows_keep_their_column_types_without_an_io_column():
    al = align(table([{"tensor_id": 1, "op_name": "a"}]), table([{"tensor_id": 2, "op_name": "b"}]),
               strategies=("exact",))
    for side in (al.unmatched_target, al.unmatched_bench):
        assert side.column("io").type == pa.string() and side.column("io").to_pylist() == [None]


@pytest.mark.parametrize("tname,bname,mapping", [
    ("Cell.fc1.Dense.forward.0", "Module.fc1.Linear.forward.0", {"Dense": "Linear"}),  # MindSpore vs PyTorch
    ("Module.fc1.Linear.forward.0", "Cell.fc1.Dense.forward.0", {"Linear": "Dense"}),  # and the other way
])
def test_mapping_crosses_the_cell_module_prefix_both_ways(tname, bname, mapping):
    """msprobe's cell mapping names a layer class only; the frameworks' prefixes differ
    (MindSpore ``Cell.``, PyTorch ``Module.``): a mapped name matches with either prefix."""
    target = table([{"tensor_id": 1, "op_name": tname, "io": "output", "slot": 0}])
    bench = table([{"tensor_id": 2, "op_name": bname, "io": "output", "slot": 0}])
    al = align(target, bench, mapping=mapping, strategies=("mapping",))
    assert pair_list(al) == [(1, 2, "mapping")]
