"""The first-divergence evaluation harness (scripts/divergence_eval.py, issue 26) on its
seeded sample of real msprobe pairs (tests/data/divergence: --size tiny, torch 2.13 CPU,
mindstudio-probe 26.2): the plan, the truth, the classification, the mispair check, and
(where torch and msprobe are installed) the generate step."""
from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
sys.path.insert(0, str(SCRIPTS))
import divergence_eval as de  # noqa: E402

DATA = Path(__file__).parent / "data" / "divergence"


def _picked(cases: list[dict]) -> list[dict]:
    """The cases the evaluate step runs on (hand-checked): an fp32 rerun, the issue's softmax
    scale 0.25 -> 0.0625 in fp32, a LayerNorm by hand, the 2-rank fc1 weight x1.1 on rank 1."""
    return [_one(cases, lambda c: c["kind"] == "rerun" and c["config"]["precision"] == "fp32"),
            _one(cases, lambda c: c["kind"] == "softmax_scale" and c["config"]["precision"] == "fp32"
                 and abs(c["changed"]["mag"] + 0.75) < 1e-9),
            _one(cases, lambda c: c["kind"] == "rw_layernorm"),
            _one(cases, lambda c: c["kind"] == "weight" and c["config"]["world"] == 2)]


def _judged(cases: list[dict]) -> list[dict]:
    """The cases the judgment test reads beside the picked ones: fp16 autocast against fp32
    at L1 with risk_level ALL (the bench's ``Tensor.float`` of a float32 tensor); a block's
    residual add dropped at mix level (module records hold the block's output)."""
    return [_one(cases, lambda c: c["kind"] == "amp" and c["config"]["level"] == "L1all"),
            _one(cases, lambda c: c["kind"] == "residual" and c["config"]["level"] == "mix")]


def _once_empty(cases: list[dict]) -> list[dict]:
    """The case that once compared no pair: fp16 autocast with a weight scaled, against the
    fp32 bench dump shared with the rerun (that bench held two runs' process directories)."""
    return [_one(cases, lambda c: c["kind"] == "weight" and c["config"]["precision"] == "fp16"
                 and c["config"]["level"] == "L1" and c["config"]["arch"] == "transformer")]


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> Path:
    """The sample as the harness lays it out: the truth files (``cases/``, kept readable in
    the repository) beside the dumps (``dumps.tar.xz``: 22 cases' 34 real msprobe dumps,
    one process directory per rank, 47 MB of small ``.pt`` files in 1.1 MB). Every dump's
    json files are extracted; the ``.pt`` payloads only of the dumps the evaluate step reads."""
    root = tmp_path_factory.mktemp("divergence")
    shutil.copytree(DATA / "cases", root / "cases")
    planned = de.load_cases(root, ready_only=False)
    keys = {c[k] for c in _picked(planned) + _judged(planned) + _once_empty(planned)
            for k in ("target_key", "bench_key")}
    with tarfile.open(DATA / "dumps.tar.xz") as tar:
        for m in tar:
            if not m.name.endswith(".pt") or m.name.split("/")[1] in keys:
                tar.extract(m, root, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    for truth in (root / "cases").glob("*/truth.json"):
        truth.touch()  # written after its dumps (load_cases skips a truth older than them)
    return root


def _cases(root: Path) -> list[dict]:
    return de.load_cases(root)


def _one(cases: list[dict], pred) -> dict:
    found = [c for c in cases if pred(c)]
    assert found, "the sample lacks a case this test needs"
    return found[0]


def test_plan_is_deterministic_and_covers_the_kinds():
    a = de.plan(150, 5)
    assert a == de.plan(150, 5)
    assert de.plan(60, 5) == a[:60]  # a bigger plan extends a smaller one: case ids stay
    assert de.plan(150, 6) != a
    kinds = {c["kind"] for c in a}
    assert {de.category(k) for k in kinds} == {"changed", "clean", "rewrite"}
    assert len(kinds & set(de.CHANGED_KINDS)) >= 8 and len(kinds & set(de.REWRITE_KINDS)) >= 5
    assert {c["target"]["level"] for c in a} == {"L1", "mix", "L1all"}
    assert {c["target"]["precision"] for c in a} == {"fp32", "bf16", "fp16"}
    assert {c["target"]["arch"] for c in a} == {"cnn", "transformer", "mlp"}
    assert max(c["target"]["world"] for c in a) > 1
    for c in a:
        t, b = c["target"], c["bench"]
        assert {k: t[k] for k in ("arch", "level", "world", "seed")} == {k: b[k] for k in ("arch", "level", "world", "seed")}
        if de.category(c["kind"]) != "clean":
            assert b["precision"] == "fp32" and b["variant"]["kind"] == "clean"
            assert c["kind"] in de.SITES[t["arch"]]
            assert t["variant"]["rank"] < t["world"]
        if c["kind"] == "overflow":
            assert t["precision"] == "fp16"
    assert len({c["case_id"] for c in a}) == len(a)


def test_the_sample_truth_names_a_record_of_its_target_dump(sample):
    cases = _cases(sample)
    assert len(cases) == len(list((DATA / "cases").iterdir())) >= 18  # every case's dumps are there
    assert len({c["target_key"] for c in cases} | {c["bench_key"] for c in cases}) < 2 * len(cases)  # benches shared
    assert {c["category"] for c in cases} == {"changed", "clean", "rewrite"}
    assert any(c["config"]["world"] > 1 for c in cases)
    for c in cases:
        assert (Path(c["_dir"]) / c["target_dump"] / "dump").is_dir()
        assert (Path(c["_dir"]) / c["bench_dump"] / "dump").is_dir()
        if c["category"] != "changed":
            assert c["departure_expected"] is False and c["expected"] is None
            continue
        assert c["departure_expected"] is True
        rank_dir = de.rank_dirs(sample / "dumps" / c["target_key"])[c["expected_rank"]]
        recs = de.records(rank_dir)
        assert c["expected"] in recs and not c["expected"].startswith("Module.")
        # the record holds the probed tensor: its first output's statistics are the probe's
        out = recs[c["expected"]]["output"][0]
        assert out["shape"] == c["probe"]["shape"]
        assert de._close(out["Max"], c["probe"]["max"], 1e-6)
        assert c["expected_phase"] == de.EXPECTED_PHASE[c["kind"]]


def test_classification_rules_on_a_sample_truth(sample):
    cases = _cases(sample)
    mix = _one(cases, lambda c: c["category"] == "changed" and c["config"]["level"] == "mix" and c["containers"])
    expected = mix["expected"]
    assert de.classify(mix, {"target_name": expected, "rank": None})["verdict"] == "named"
    assert de.classify(mix, {"target_name": mix["containers"][0], "rank": None})["verdict"] == "container"
    wrong = de.classify(mix, {"target_name": "Tensor.add_.0.forward", "rank": None})
    assert wrong["verdict"] == "wrong" and wrong["why"] == "wrong op"
    assert de.classify(mix, None)["verdict"] == "missed"
    # an op only the target has that produced the departing input (a swapped activation) is
    # where the report says the departure starts: that op is the answer, not its consumer
    consumer = {"target_name": "Functional.linear.3.forward", "rank": None}
    assert de.classify(mix, {**consumer, "origin_op": expected})["verdict"] == "named"
    assert de.classify(mix, {"target_name": expected, "rank": None, "origin_op": "Functional.relu.0.forward"}
                       )["verdict"] == "wrong"
    ranks = _one(cases, lambda c: c["category"] == "changed" and c["config"]["world"] > 1)
    other = (ranks["expected_rank"] + 1) % ranks["config"]["world"]
    assert de.classify(ranks, {"target_name": ranks["expected"], "rank": ranks["expected_rank"]})["verdict"] == "named"
    on_other = de.classify(ranks, {"target_name": ranks["expected"], "rank": other})
    assert on_other["verdict"] == "wrong" and on_other["why"] == "wrong rank"
    clean = _one(cases, lambda c: c["category"] == "clean")
    assert de.classify(clean, None)["verdict"] == "ok"
    assert de.classify(clean, {"target_name": "Tensor.add_.7.forward", "rank": 0})["verdict"] == "false-departure"


def test_phase_of_record_order():
    names = ["Functional.linear.0.forward", "Tensor.__add__.0.forward", "Functional.linear.0.backward",
             "Distributed.all_reduce.0.forward", "Tensor.add_.0.forward"]
    assert de.phase_of(names) == {names[0]: "forward", names[1]: "forward", names[2]: "backward",
                                  names[3]: "optimizer", names[4]: "optimizer"}


@pytest.fixture(scope="module")
def evaluated(sample, tmp_path_factory):
    pytest.importorskip("torch", reason="the sample's msprobe payloads are .pt files: reading them needs PyTorch")
    picked = _picked(_cases(sample))
    assert len({c["case_id"] for c in picked}) == 4
    archive = tmp_path_factory.mktemp("diveval") / "eval.dumpdb"
    results = de.evaluate(sample, picked, jobs=1, check_mispairs="rewrite", archive=archive)
    return picked, results, archive


def test_evaluate_hand_checked_cases(evaluated):
    picked, results, _ = evaluated
    by = {r["case_id"]: r for r in results}
    rerun, scale, rewrite, ranks = (by[c["case_id"]] for c in picked)
    assert all(r["verdict"] != "error" for r in results), [r.get("error") for r in results]
    # a rerun of the same seed is bit-identical: nothing may depart
    assert rerun["verdict"] == "ok" and rerun["fd"] is None
    # the softmax scale 0.25 -> 0.0625 in fp32 against fp32: gross, the changed multiply is named
    assert scale["verdict"] == "named", scale
    assert scale["fd"]["target_name"] == picked[1]["expected"]
    # the rewrite pair gets the brute-force alignment check
    assert rewrite["alignment"]["checked"] > 0
    assert rewrite["verdict"] in ("ok", "false-departure")
    # the multi-rank case: the truth's rank is carried, and a departure names its rank
    assert ranks["expected_rank"] == 1 and ranks["world"] == 2 and ranks["verdict"] in ("named", "wrong", "missed")
    if ranks["verdict"] == "wrong":
        assert ranks["why"] in ("wrong rank", "wrong op") and ranks["got"]["rank"] in (0, 1)
    summary = de.summarize(results)
    assert summary["cases"] == 4 and summary["changed"] == 2 and summary["clean"] == 1 and summary["rewrite"] == 1
    md = de.markdown(summary)
    assert "| softmax_scale | * | * | 1 |" in md


def test_every_sample_dump_holds_one_run_and_its_cases_compare_pairs(evaluated, sample):
    """Each sample dump holds one msprobe process directory per rank of its run (a dump
    made twice into one directory holds two runs' records under rank 0, and case 0013
    compared 0 pairs against it); the evaluated cases and that one compare pairs."""
    cases = _cases(sample)
    for c in cases:
        for key, config in ((c["target_key"], c["config"]), (c["bench_key"], c["bench_config"])):
            procs = [p for step in (sample / "dumps" / key / "dump").iterdir() for p in step.iterdir() if p.is_dir()]
            assert len(procs) == config["world"], (c["case_id"], key, [p.name for p in procs])
    _, results, archive = evaluated
    once = de.evaluate(sample, _once_empty(cases), jobs=1, check_mispairs="none", archive=archive)
    assert [r["verdict"] for r in once] != ["error"], once
    assert all(r["pairs"] > 0 for r in results + once), [(r["case_id"], r["pairs"]) for r in results + once]


def test_mispair_check_finds_a_constructed_mispair(evaluated):
    import dumpdb

    picked, _, archive = evaluated
    rerun = picked[0]
    a = dumpdb.open(str(archive))
    outcome = de._compare(a, rerun["target_key"], rerun["bench_key"])
    clean = de.mispairs(a, outcome.results, rerun["target_key"], rerun["bench_key"])
    assert clean["checked"] > 0 and clean["mispaired"] == 0
    # cross the partners of two forward outputs of one op type and shape whose contents differ
    rows = a.sql("SELECT tensor_id, op_type, shape FROM tensors WHERE run = ? AND direction = 'forward' "
                 "AND io = 'output' AND op_type = 'Functional.linear' ORDER BY tensor_id",
                 [rerun["target_key"]]).to_pylist()
    pairs = {r["target_tensor_id"]: r["bench_tensor_id"]
             for r in outcome.results.select(["target_tensor_id", "bench_tensor_id"]).to_pylist()}
    x, y = next((p, q) for i, p in enumerate(rows) for q in rows[i + 1:]
                if p["shape"] == q["shape"] and abs(_cos(a, p["tensor_id"], q["tensor_id"])) < 0.9)
    tx, ty = x["tensor_id"], y["tensor_id"]
    bx, by = pairs[tx], pairs[ty]
    crossed = pa.table({"target_tensor_id": [tx, ty], "bench_tensor_id": [by, bx],
                        "cosine": [_cos(a, tx, by), _cos(a, ty, bx)]})
    found = de.mispairs(a, crossed, rerun["target_key"], rerun["bench_key"])
    assert found["mispaired"] == 2
    ex = {e["target"]: e for e in found["examples"]}
    names = dict(a.sql_rows("SELECT tensor_id, op_name FROM tensors WHERE tensor_id IN (?, ?, ?, ?)",
                            [tx, ty, bx, by])[1])
    assert ex[names[tx]]["paired"] == names[by] and ex[names[tx]]["better"] == names[bx]
    assert ex[names[tx]]["better_cosine"] > 0.99


def test_judgment_of_collectives_and_misattributed_backward_records(evaluated, sample):
    """Two false departures of clean pairs (issue 26, judged on the sample's real dumps):
    a collective's output on a healthy rank carries another rank's input error (the
    2-rank fc1 weight x1.1: rank 0's all_reduce outputs differ while its inputs match) or
    rank noise (the key bias gradient, zero in exact arithmetic); and at L1 with risk_level
    ALL, the fp32 run's ``Tensor.float`` of a float32 tensor returns its input, so its
    backward record holds the preceding linear's gradients (a [5] bias gradient against
    the fp16 run's [2, 5] logits gradient)."""
    import dumpdb

    picked, _, archive = evaluated
    ranks = picked[3]
    a = dumpdb.open(str(archive))
    out = de._compare(a, ranks["target_key"], ranks["bench_key"])
    healthy = [r for r in out.results.to_pylist() if r["op_type"] == "Distributed.all_reduce" and r["io"] == "output"
               and r["rank"] != ranks["expected_rank"] and r["precision_result"] != "pass"]
    assert healthy and all(r["precision_result"] in ("warning", "noise") for r in healthy)
    assert any(r["precision_reason"].startswith("error") and "propagated" in r["precision_reason"] for r in healthy)
    assert any(r["precision_result"] == "noise" for r in healthy)
    assert out.first_divergence["rank"] == ranks["expected_rank"]
    amp, residual = _judged(_cases(sample))
    for key in (amp["target_key"], amp["bench_key"]):
        dumpdb.ingest(str(sample / "dumps" / key / "dump"), archive=str(archive), run=key)
    out = de._compare(dumpdb.open(str(archive)), amp["target_key"], amp["bench_key"])
    assert out.first_divergence is None
    (row,) = [r for r in out.results.to_pylist() if r["target_name"] == "Tensor.float.0.backward" and r["io"] == "output"]
    assert row["target_shape"] != row["bench_shape"] and row["precision_result"] == "warning"
    assert row["precision_reason"].startswith("not comparable: the bench's Tensor.float.0.backward output")


def test_a_dropped_residual_names_the_next_norm_not_the_module_record(evaluated, sample):
    """At mix level the block's module record holds the bytes the next norm reads (the
    block's output without its residual add): the producer of that input is the op inside
    the module (its output matches the bench), so the norm reads other data and is named;
    the module record used to explain the input as propagated, and a backward norm came
    first."""
    import dumpdb

    _, _, archive = evaluated
    residual = _judged(_cases(sample))[1]
    for key in (residual["target_key"], residual["bench_key"]):
        dumpdb.ingest(str(sample / "dumps" / key / "dump"), archive=str(archive), run=key)
    fd = de._compare(dumpdb.open(str(archive)), residual["target_key"], residual["bench_key"]).first_divergence
    assert de.classify(residual, fd)["verdict"] == "named", fd and fd["err_message"]
    assert fd["io"] == "input" and "reads other data" in fd["err_message"]
    assert not fd["err_message"].split("produced by ")[1].startswith("Module.")


def _cos(a, i: int, j: int) -> float:
    u = np.asarray(a.tensor(i), np.float64).ravel()
    v = np.asarray(a.tensor(j), np.float64).ravel()
    return float(u @ v / (np.linalg.norm(u) * np.linalg.norm(v)))


def test_generate_one_case(tmp_path):
    """The generate step: a real msprobe dump pair and its truth, from scratch."""
    for mod in ("torch", "msprobe"):
        if importlib.util.find_spec(mod) is None:
            pytest.skip(f"generating dumps needs {mod} (pip install torch mindstudio-probe: optional "
                        "parts, not in the test extras; .ci/run installs both)")
    case = de._case("scale", "mlp", "L1", "fp32", 1, size="tiny", block=1, mag=0.5)
    case["case_id"] = "0000-scale-mlp-L1-fp32-w1"
    gen = de.generate(tmp_path, [case], jobs=1, python=sys.executable)
    assert gen["failed"] == [] and gen["made"] == 2 and gen["truth_resolved"] == 1
    truth = json.loads((tmp_path / "cases" / case["case_id"] / "truth.json").read_text())
    assert truth["expected"].startswith("Tensor.__mul__.") and truth["expected_role"] == "changed-op"
    assert truth["magnitude"]["change_at_op"] == pytest.approx(0.5, rel=1e-3)
    # cached: a second generate makes nothing
    assert de.generate(tmp_path, [case], jobs=1, python=sys.executable)["made"] == 0


def test_a_mask_case_names_the_triu_call_where_the_dump_records_it():
    """At L1 with risk_level ALL msprobe records ``torch.triu``: the mask's changed call
    (its ``diagonal`` argument), named instead of the first float consumer; at levels that
    leave it out there is none before the consumer, and the consumer stays."""
    names = ["Torch.triu.0.forward", "Tensor.masked_fill.0.forward", "Functional.softmax.0.forward",
             "Torch.triu.1.forward", "Tensor.masked_fill.1.forward"]
    assert de._mask_producer(names, "Tensor.masked_fill.1.forward") == "Torch.triu.1.forward"
    assert de._mask_producer(names, "Tensor.masked_fill.0.forward") == "Torch.triu.0.forward"
    assert de._mask_producer(["Functional.linear.0.forward", "Tensor.masked_fill.0.forward"],
                             "Tensor.masked_fill.0.forward") is None
    assert de._mask_producer(names, None) is None
