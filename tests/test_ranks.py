"""Analysis across ranks (dumpdb.checks.ranks, `dumpdb ranks`, `dumpdb scan --across-ranks`).

Real data: the 2-rank msprobe DDP run in tests/data/msprobe (each rank fed its own batch),
and synthetic multi-rank runs built from one of its real rank directories copied N times,
with one tensor of one rank perturbed (dump.json statistics edited, or a .pt payload
replaced), as a data-parallel job with one bad card would look.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
from conftest import DATA
from typer.testing import CliRunner

import dumpdb
from dumpdb.checks.ranks import first_bad_across_ranks, rank_groups
from dumpdb.cli import app
from dumpdb.errors import RunNotFound

GLOO = DATA / "msprobe" / "statistics_mix_2rank_gloo" / "dump"
TENSOR_MIX = DATA / "msprobe" / "tensor_mix" / "dump"


def _keys(dump_json: Path) -> list[str]:
    return list(json.loads(dump_json.read_text())["data"])


def _edit(dump_json: Path, key: str, **leaf) -> None:
    d = json.loads(dump_json.read_text())
    d["data"][key]["output"][0].update(leaf)
    dump_json.write_text(json.dumps(d))


def _replicate(src_rank_dir: Path, out: Path, n: int, step: str = "step0") -> Path:
    for r in range(n):
        shutil.copytree(src_rank_dir, out / "dump" / step / f"rank{r}")
    return out / "dump"


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ranks")
    path = tmp / "a.dumpdb"
    # 8 data-parallel ranks: rank 5 differs at the 5th op; ranks 2 and 6 get a NaN, 6 earlier
    dump8 = _replicate(GLOO / "step0" / "rank0", tmp / "dp8", 8)
    keys = _keys(dump8 / "step0" / "rank0" / "dump.json")
    d5 = json.loads((dump8 / "step0" / "rank5" / "dump.json").read_text())
    _edit(dump8 / "step0" / "rank5" / "dump.json", keys[4], Max=d5["data"][keys[4]]["output"][0]["Max"] + 1.0)
    _edit(dump8 / "step0" / "rank2" / "dump.json", keys[10], Max=float("nan"))
    _edit(dump8 / "step0" / "rank6" / "dump.json", keys[6], Min=float("-inf"))
    for dump, run in ((dump8, "dp8"), (GLOO, "gloo")):
        assert dumpdb.ingest(dump, archive=path, run=run).ok
    return dumpdb.open(path), keys


def test_eight_ranks_one_group_and_the_odd_ranks_named(archive):
    a, keys = archive
    rows = {r["rank"]: r for r in rank_groups(a, "dp8").to_pylist()}
    assert rows[0]["group_ranks"] == [0, 1, 3, 4, 7] and all(rows[k]["reference"] for k in (0, 1, 3, 4, 7))
    assert {rows[k]["sequence_group"] for k in range(8)} == {1}  # same op sequence everywhere
    odd = rows[5]
    assert not odd["reference"] and odd["group_ranks"] == [5] and odd["reference_rank"] == 0
    assert (odd["departs_at"], odd["first_diff_op"], odd["first_diff_io"], odd["first_diff_slot"]) == \
        ("value", keys[4], "output", "0")
    assert odd["first_diff_position"] == 4 and odd["first_diff_iteration"] == 0
    assert odd["first_diff_code_file"].endswith("_worker.py") and odd["first_diff_code_line"] == 19
    assert rows[2]["first_diff_op"] == keys[10] and rows[6]["first_diff_op"] == keys[6]


def test_two_rank_ddp_run_differs_from_its_first_input(archive):
    a, _ = archive
    rows = {r["rank"]: r for r in rank_groups(a, "gloo").to_pylist()}
    # each rank draws its own batch (generator seed 42 + rank): the very first input differs
    assert rows[0]["reference"] and not rows[1]["reference"]
    assert rows[0]["sequence_group"] == rows[1]["sequence_group"]
    assert (rows[1]["first_diff_op"], rows[1]["first_diff_io"], rows[1]["first_diff_position"]) == \
        ("Functional.conv2d.0.forward", "input", 0)


def test_first_bad_rank_by_execution_position(archive):
    a, keys = archive
    bad = first_bad_across_ranks(a, "dp8").to_pylist()
    assert [(b["order"], b["rank"], b["op_name"], b["position"]) for b in bad] == \
        [(1, 6, keys[6], 6), (2, 2, keys[10], 10)]
    assert bad[0]["code_line"] == 20 and bad[0]["min"] == float("-inf")


def test_unknown_run(archive):
    with pytest.raises(RunNotFound):
        rank_groups(archive[0], "nope")


def test_cli_ranks_and_scan_across_ranks(archive):
    a, keys = archive
    runner = CliRunner()
    res = runner.invoke(app, ["ranks", "dp8", "--archive", str(a.path)], env={"COLUMNS": "250"})
    assert res.exit_code == 0, res.output
    assert "8 rank(s), 4 data group(s), 1 op-sequence group(s)" in res.output
    assert f"rank 5 departs from rank 0 (value) at iteration 0, position 4: {keys[4]} output.0" in res.output
    res = runner.invoke(app, ["scan", "dp8", "--across-ranks", "--archive", str(a.path)], env={"COLUMNS": "250"})
    assert res.exit_code == 1, res.output  # scan exit codes: 1 = found
    assert f"first bad rank: rank 6, iteration 0, position 6: {keys[6]} output.0" in res.output
    res = runner.invoke(app, ["ranks", "nope", "--archive", str(a.path)])
    assert res.exit_code == 2 and "nope" in res.output


@pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                    reason="tensor_mix's payloads are .pt files: reading them needs PyTorch (pip install "
                           "'dumpdb[torch]'; .ci/run installs it); without it there are no payload bytes to share")
def test_identical_payloads_shared_across_ranks(tmp_path):
    (proc,) = (TENSOR_MIX / "step0").glob("proc*")
    dump = _replicate(proc, tmp_path / "tp", 3)
    assert dumpdb.ingest(dump, archive=tmp_path / "a", run="tp").ok
    rows = rank_groups(dumpdb.open(tmp_path / "a"), "tp").to_pylist()
    assert [r["group_ranks"] for r in rows] == [[0, 1, 2]] * 3
    assert all(r["payload_bytes"] > 0 and r["shared_bytes"] == r["payload_bytes"] for r in rows)


def test_proc_run_aligns_with_rank0_and_bench_rank_picks_a_rank(archive, tmp_path):
    a, _ = archive
    (proc,) = (GLOO.parent.parent / "statistics_mix_md5" / "dump" / "step0").glob("proc*")
    dump = tmp_path / "single" / "dump" / "step0"
    shutil.copytree(GLOO / "step0" / "rank1", dump / proc.name)  # rank 1's records, as a 1-card run
    assert dumpdb.ingest(dump.parent, archive=a.path, run="single").ok
    # proc<PID> pairs with rank 0 of the 2-rank run; rank 1 has no partner
    out = a.compare("single", "gloo:0")
    ranks = set(a.sql("SELECT rank FROM tensors WHERE tensor_id IN (SELECT unnest($ids))",
                      {"ids": out["bench_tensor_id"].to_pylist()})["rank"].to_pylist())
    assert out.num_rows > 50 and ranks == {0}
    # --bench-rank 1: the same data on both sides, every pair identical
    from dumpdb.compare.engine import compare
    outcome = compare(a, "single", "gloo", iteration=0, bench_rank=1, store_results=False)
    assert outcome.summary["pairs"] == outcome.summary["pass"] > 50
    assert outcome.summary["unmatched_target"] == 0
    assert set(outcome.results["max_diff"].to_pylist()) <= {0.0, None}


def test_ranks_html_report(archive, tmp_path):
    a, keys = archive
    out = tmp_path / "ranks.html"
    res = CliRunner().invoke(app, ["ranks", "dp8", "--archive", str(a.path), "--html", str(out)])
    assert res.exit_code == 0, res.output
    page = out.read_text()
    assert f"<b>rank 5</b> departs from rank 0 (value) at iteration 0, position 4: <code>{keys[4]} output.0" in page
    assert "First rank with NaN/Inf</h2><p><b>rank 6</b>" in page
    assert "<script src" not in page  # self-contained


def test_first_bad_rank_by_timestamp_on_a_mindspore_dump(tmp_path):
    """MindSpore file names carry a dump timestamp (µs): the rank that dumped its first
    NaN/Inf tensor earlier went bad first, whatever its rank number."""
    import os
    import re

    src = DATA / "mindspore" / "e1_nan_inf_overflow" / "rank_0"
    root = tmp_path / "ms2"
    shutil.copytree(src, root / "rank_0", copy_function=os.link)
    shutil.copytree(src, root / "rank_1", copy_function=os.link)
    stamp = re.compile(r"\.(\d{16})\.(input|output)\.")
    for f in (root / "rank_1").rglob("*.npy"):  # rank 1 ran one second earlier
        new = stamp.sub(lambda m: f".{int(m.group(1)) - 1_000_000}.{m.group(2)}.", f.name)
        f.rename(f.with_name(new))
    report = dumpdb.ingest(root, archive=tmp_path / "a", run="ms2")
    assert report.tensors_added > 0 and not report.errors
    a = dumpdb.open(tmp_path / "a")
    bad = first_bad_across_ranks(a, "ms2").to_pylist()
    assert [b["rank"] for b in bad] == [1, 0]
    assert bad[0]["timestamp"] == bad[1]["timestamp"] - 1_000_000
    assert (bad[0]["op_name"], bad[0]["io"], bad[0]["slot"]) == (bad[1]["op_name"], bad[1]["io"], bad[1]["slot"])
    assert bad[0]["nan_count"] is not None  # counts come from the payloads
    groups = {r["rank"]: r for r in rank_groups(a, "ms2").to_pylist()}
    assert groups[0]["group"] == groups[1]["group"] == 1  # same data: one group, every byte shared
    assert groups[0]["shared_bytes"] == groups[0]["payload_bytes"] > 0
