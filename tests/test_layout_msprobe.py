"""msprobe layout: detection, dump.json -> tensors mapping, .pt/.npy payloads, stack.json and
construct.json, on the real cases in tests/data/msprobe (and the whole corpus when present).

Expected rows are derived here from the dump.json files with the test's own walk, not with the
reader's helpers."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from conftest import DATA, MS_CASES, ms_case
from typer.testing import CliRunner

import dumpdb
from dumpdb.cli import app
from dumpdb.errors import DumpFileError, LayoutError
from dumpdb.layouts import detect
from dumpdb.layouts.msprobe import MsprobeDump, load_pt, parse_record_key

# Whether torch is installed (CI installs dumpdb[test] only; the .pt tests need dumpdb[torch]),
# without importing it (about 1.5 CPU s in each pytest worker that collects this file): the
# tests that use torch import it themselves.
HAVE_TORCH = importlib.util.find_spec("torch") is not None

needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="PyTorch not installed (pip install 'dumpdb[torch]')")

MSP = DATA / "msprobe"
CASES = ["statistics_mix_md5", "statistics_mix_2rank_gloo", "tensor_mix"]
STAT_CASES = CASES[:2]
CORPUS = Path(os.environ.get("DUMPDB_CORPUS", Path(__file__).resolve().parents[2] / "shared" / "corpus"))
CORPUS_MSP = CORPUS / "msprobe-torch-cpu"
NO_TORCH = "reading .pt tensors needs PyTorch: pip install 'dumpdb[torch]'"
STATS = {"Max": "max", "Min": "min", "Mean": "mean", "Norm": "l2norm"}


# -- expected rows, from the dump.json files --------------------------------------
def _leaves(value, path):
    if isinstance(value, dict) and value.get("type") == "torch.Tensor":
        yield path, value
    elif isinstance(value, list):
        for i, x in enumerate(value):
            yield from _leaves(x, path + (i,))
    elif isinstance(value, dict) and "type" not in value:
        for k, x in value.items():
            yield from _leaves(x, path + (k,))


def expected_rows(root: Path) -> dict[tuple, dict]:
    """{(rank, step, op_name, io, slot_path): expectation} for every tensor leaf under root."""
    out = {}
    for dump_json in sorted(root.rglob("dump.json")):
        rank_dir = dump_json.parent
        m = re.fullmatch(r"rank(\d+)|proc\d+", rank_dir.name)
        rank = int(m.group(1)) if m.group(1) else None
        step = int(re.fullmatch(r"step(\d+)", rank_dir.parent.name).group(1))
        data = json.loads(dump_json.read_text())["data"]
        for key, record in data.items():
            for section, value in record.items():
                if ".parameters_grad." in key:
                    io, slot_of, arg_of, base = "parameter_grad", None, True, (section,)
                else:
                    io = {"input_args": "input", "input_kwargs": "input", "input": "input",
                          "output": "output", "parameters": "parameter"}[section]
                    named = section in ("input_kwargs", "parameters")
                    slot_of, arg_of, base = (not named), named, ()
                for path, leaf in _leaves(value, base):
                    slot_path = ".".join(map(str, path))
                    k = (rank, step, key, io, slot_path)
                    assert k not in out, k
                    out[k] = {
                        "leaf": leaf, "dump_json": dump_json,
                        "slot": path[0] if slot_of else None,
                        "arg_name": path[0] if arg_of else None,
                        "file": (rank_dir / "dump_tensor_data" / leaf["data_name"]) if "data_name" in leaf else None,
                    }
    return out


def count_tensor_leaves(root: Path) -> int:
    return sum(1 for f in root.rglob("dump.json")
               for rec in json.loads(f.read_text())["data"].values() for v in rec.values() for _ in _leaves(v, ()))


def torch_payload(path: Path) -> tuple[str, tuple, bytes]:
    """(dtype name, shape, bytes) of a .pt file read with torch alone."""
    import torch

    t = torch.load(path, map_location="cpu", weights_only=True).contiguous()
    name = str(t.dtype).removeprefix("torch.")
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return name, tuple(t.shape), t.numpy().tobytes()


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> Path:
    """One archive with the tests/data cases, one run each (read-only use); tensor_mix
    (.pt payloads) only when torch is installed."""
    path = tmp_path_factory.mktemp("msprobe") / "msprobe.dumpdb"
    for case in CASES if HAVE_TORCH else STAT_CASES:
        report = dumpdb.ingest(MSP / case, archive=path, run=case)
        assert report.ok, report.errors
        assert report.layout == "msprobe"
    return path


def _rows(archive: Path, run: str) -> list[dict]:
    return dumpdb.open(archive).sql("SELECT * FROM tensors WHERE run = ? ORDER BY tensor_id", [run]).to_pylist()


def msprobe_key_fields(key: str) -> tuple[str, str | None, int]:
    """(op_type, direction, call_index) of a dump.json record key, by msprobe's naming rule
    written out here (formats.md 1.3; msprobe core/dump data_processor): APIs are
    ``{Prefix}.{api...}.{call_index}.{forward|backward}``, modules/cells
    ``{Module|Cell}.{path...}.{Class}.{forward|backward}.{call_index}`` and
    ``{Module|Cell}.{path...}.{Class}.parameters_grad.{call_index}`` (no direction)."""
    parts = key.split(".")
    if parts[0] in ("Module", "Cell"):
        direction = None if parts[-2] == "parameters_grad" else parts[-2]
        return f"{parts[0]}.{parts[-3]}", direction, int(parts[-1])
    return ".".join(parts[:-2]), parts[-1], int(parts[-2])


def test_independent_key_rule_agrees_on_the_grammar_examples():
    for key, fields in {"Functional.conv2d.0.forward": ("Functional.conv2d", "forward", 0),
                        "Aten.add.Tensor.3.backward": ("Aten.add.Tensor", "backward", 3),
                        "Module.mlp.0.Linear.forward.2": ("Module.Linear", "forward", 2),
                        "Module.conv.Conv2d.parameters_grad.0": ("Module.Conv2d", None, 0)}.items():
        assert msprobe_key_fields(key) == fields


# -- names and detection ------------------------------------------------------------
def test_record_key_grammar():
    assert parse_record_key("Functional.conv2d.0.forward") == {
        "op_type": "Functional.conv2d", "direction": "forward", "call_index": 0, "kind": "api"}
    assert parse_record_key("Aten.add.Tensor.3.backward") == {
        "op_type": "Aten.add.Tensor", "direction": "backward", "call_index": 3, "kind": "api"}
    assert parse_record_key("Module.mlp.0.Linear.forward.2") == {
        "op_type": "Module.Linear", "direction": "forward", "call_index": 2, "kind": "module"}
    assert parse_record_key("Cell.net.Dense.backward.1")["op_type"] == "Cell.Dense"
    assert parse_record_key("Module.conv.Conv2d.parameters_grad.0") == {
        "op_type": "Module.Conv2d", "direction": None, "call_index": 0, "kind": "parameters_grad"}
    assert parse_record_key("optimizer") is None and parse_record_key("Functional.x.forward") is None
    # the shortest forms the grammar accepts, and near misses
    assert parse_record_key("Tensor.0.forward") == {
        "op_type": "Tensor", "direction": "forward", "call_index": 0, "kind": "api"}
    assert parse_record_key("Module.Net.backward.4") == {
        "op_type": "Module.Net", "direction": "backward", "call_index": 4, "kind": "module"}
    assert parse_record_key("Functional.conv.Conv2d.forward.0") is None  # module form without Module/Cell
    assert parse_record_key("Module.conv.Conv2d.forward.x") is None  # no call index


@pytest.mark.parametrize("case", CASES)
def test_detected_at_every_level(case):
    root = MSP / case
    rank_dir = next(root.glob("dump/step1/*"))
    for d in (root, root / "dump", root / "dump" / "step0", rank_dir):
        assert detect(d).name == "msprobe", d
    scan = MsprobeDump().scan(rank_dir)
    assert not scan.errors and scan.entries
    assert {e.step for e in scan.entries} == {1} and all(e.iteration == 1 for e in scan.entries)
    assert all(e.source_file == "dump.json" or e.source_file.startswith("dump_tensor_data/") for e in scan.entries)


def test_does_not_claim_other_dumps(tmp_path):
    for case in MS_CASES:
        assert not MsprobeDump().detect(ms_case(case))
    assert not MsprobeDump().detect(DATA / "mindspore")
    (tmp_path / "step0" / "rank0").mkdir(parents=True)  # no dump.json: not msprobe
    assert not MsprobeDump().detect(tmp_path)


def test_two_dumps_in_one_directory_refused(tmp_path):
    shutil.copytree(MSP / "statistics_mix_md5", tmp_path / "a")
    shutil.copytree(MSP / "statistics_mix_2rank_gloo", tmp_path / "b")
    assert MsprobeDump().detect(tmp_path)
    with pytest.raises(LayoutError, match="2 separate msprobe dumps"):
        MsprobeDump().scan(tmp_path)


# -- mapping ----------------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES)
def test_scan_mapping_matches_dump_json(case):
    root = MSP / case
    scan = MsprobeDump().scan(root)
    assert not scan.errors
    assert scan.framework == "pytorch" and scan.metadata["level"] == "mix"
    assert scan.metadata["config.json"] == json.loads((root / "config.json").read_text())
    expected = expected_rows(root)
    got = {(e.rank, e.step, e.op_name, e.io, e.slot_path): e for e in scan.entries}
    assert len(got) == len(scan.entries) == len(expected) == count_tensor_leaves(root)
    assert got.keys() == expected.keys()
    assert len({e.key for e in scan.entries}) == len(scan.entries)
    for k, e in got.items():
        x, leaf = expected[k], expected[k]["leaf"]
        assert (e.slot, e.arg_name) == (x["slot"], x["arg_name"]), k
        assert e.iteration == e.step and e.dtype_declared == leaf["dtype"]
        assert e.shape_declared == tuple(leaf["shape"]) and e.requires_grad is leaf["requires_grad"]
        assert e.key.startswith(os.path.relpath(x["dump_json"], root) + "#" + e.op_name + ".")
        assert (e.op_type, e.direction, e.call_index) == msprobe_key_fields(e.op_name), e.op_name
        if x["file"] is not None and not HAVE_TORCH and x["file"].suffix == ".pt":
            # without PyTorch a .pt payload cannot be read: the entry keeps its file name, no path
            assert e.source_file == os.path.relpath(x["file"], root) and e.path is None
        elif x["file"] is not None:
            assert e.source_file == os.path.relpath(x["file"], root) and e.path == str(x["file"])
            assert e.key.split("#")[1] + ".pt" == leaf["data_name"]  # tensor name = msprobe data name
        else:
            assert e.path is None and e.source_file == os.path.relpath(x["dump_json"], root)


def test_mapping_examples():
    scan = MsprobeDump().scan(MSP / "tensor_mix")
    by = {e.key.split("#")[1]: e for e in scan.entries if e.step == 0}
    e = by["Module.conv.Conv2d.parameters_grad.0.weight"]
    assert (e.op_type, e.direction, e.call_index, e.io, e.slot, e.arg_name, e.slot_path) == \
        ("Module.Conv2d", None, 0, "parameter_grad", None, "weight", "weight.0")
    e = by["Module.conv.Conv2d.forward.0.parameters.bias"]
    assert (e.op_name, e.op_type, e.io, e.slot, e.arg_name, e.slot_path) == \
        ("Module.conv.Conv2d.forward.0", "Module.Conv2d", "parameter", None, "bias", "bias")
    e = by["Functional.conv2d.0.backward.output.2"]  # output[0] is null (input x needs no grad)
    assert (e.op_type, e.direction, e.io, e.slot, e.slot_path) == ("Functional.conv2d", "backward", "output", 2, "2")
    assert "Functional.conv2d.0.backward.output.0" not in by
    e = by["Tensor.add_.5.forward.input.1"]
    assert (e.op_type, e.call_index, e.io, e.slot) == ("Tensor.add_", 5, "input", 1)
    assert by["Functional.cross_entropy.0.forward.input.1"].stats == {"max": 2.0, "min": 0.0}  # int64: Mean/Norm null


def test_synthetic_nested_kwargs_xor_and_npy(tmp_path):
    """Forms the real cases lack: a tensor kwarg, a nested tuple, a bool tensor, the xor
    summary, a MindSpore .npy payload, an unknown key, non-tensor leaves."""
    rank_dir = tmp_path / "dump" / "step3" / "rank1"
    (rank_dir / "dump_tensor_data").mkdir(parents=True)
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.save(rank_dir / "dump_tensor_data" / "Mint.cat.0.forward.input.0.1.npy", arr)

    def leaf(**kw):
        return {"type": "mindspore.Tensor", "dtype": "Float32", "shape": [2, 3], "Max": 5.0, "Min": 0.0,
                "Mean": 2.5, "Norm": 7.4, "requires_grad": False, **kw}

    data = {
        "Mint.cat.0.forward": {
            "input_args": [[leaf(md5="0x00000000deadbeef"),
                            leaf(data_name="Mint.cat.0.forward.input.0.1.npy")], {"type": "int", "value": 0}],
            "input_kwargs": {"out": leaf(), "dim": {"type": "int", "value": 1}, "x": None},
            "output": [leaf(dtype="Bool", Max=True, Min=False, Mean=None, Norm=None)]},
        "weird": {"output": [leaf()]},
    }
    (rank_dir / "dump.json").write_text(json.dumps({"task": "tensor", "level": "L1", "framework": "mindspore",
                                                    "data": data}))
    (rank_dir / "stack.json").write_text(json.dumps({"Mint.cat.0.forward": ["File a.py, line 1, in f"]}))
    (rank_dir / "construct.json").write_text("{}")
    scan = MsprobeDump().scan(tmp_path)
    assert not scan.errors and scan.framework == "mindspore"
    by = {e.key.split("#")[1]: e for e in scan.entries}
    assert sorted(by) == ["Mint.cat.0.forward.input.0.0", "Mint.cat.0.forward.input.0.1",
                          "Mint.cat.0.forward.input.out", "Mint.cat.0.forward.output.0", "weird.output.0"]
    e = by["Mint.cat.0.forward.input.0.0"]
    assert (e.rank, e.step, e.slot, e.slot_path, e.checksum, e.checksum_algo) == \
        (1, 3, 0, "0.0", "0x00000000deadbeef", "xor64")
    e = by["Mint.cat.0.forward.input.out"]
    assert (e.io, e.slot, e.arg_name, e.slot_path) == ("input", None, "out", "out")
    assert by["Mint.cat.0.forward.output.0"].stats == {"max": 1.0, "min": 0.0}
    e = by["weird.output.0"]
    assert e.op_type is None and e.direction is None and "grammar" in e.note
    e = by["Mint.cat.0.forward.input.0.1"]
    assert e.source_file == "dump/step3/rank1/dump_tensor_data/Mint.cat.0.forward.input.0.1.npy"
    loaded = MsprobeDump().load(e)
    assert loaded.array.tobytes() == arr.tobytes() and loaded.note is None
    assert scan.call_stacks == [{"rank": 1, "iteration": 3, "stack_id": "Mint.cat.0.forward",
                                 "op_name": "Mint.cat.0.forward", "frames": ["File a.py, line 1, in f"]}]


def test_missing_and_broken_files_are_reported(tmp_path):
    root = tmp_path / "t"
    shutil.copytree(MSP / "tensor_mix", root)
    data = next(root.glob("dump/step0/*/dump_tensor_data"))
    (data / "Functional.relu.0.forward.input.0.pt").unlink()
    (data / "Functional.relu.0.forward.output.0.pt").write_bytes(b"not a zip")
    (next(root.glob("dump/step1/*")) / "construct.json").write_text("{broken")
    scan = MsprobeDump().scan(root)
    errors = dict(scan.errors)
    missing = os.path.relpath(data / "Functional.relu.0.forward.input.0.pt", root)
    assert errors[missing].startswith("missing: dump.json (Functional.relu.0.forward) names it")
    assert errors[next(k for k in errors if k.endswith("step1/" + Path(k).parent.name + "/construct.json"))]\
        .startswith("invalid JSON")
    e = next(e for e in scan.entries if e.key.endswith("#Functional.relu.0.forward.input.0"))
    assert e.path is None and e.stats and "missing" in e.note  # statistics kept
    bad = next(e for e in scan.entries if e.key.endswith("#Functional.relu.0.forward.output.0"))
    if not HAVE_TORCH:
        pytest.skip("PyTorch not installed (pip install 'dumpdb[torch]'): the .pt part is not checked")
    with pytest.raises(DumpFileError, match=r"^dump/step0/proc\d+/dump_tensor_data/Functional.relu.0.forward"
                                            r".output.0.pt: not a readable torch.save file"):
        MsprobeDump().load(bad)


def test_record_names_with_control_characters_give_one_line_errors(tmp_path):
    """A record key is text from dump.json: a newline or tab in it is shown escaped, so each
    error stays one line and still names the record (found by test_properties' hypothesis
    test: a record named "\\n" gave a two-line message)."""
    rank = tmp_path / "step0" / "rank0"
    rank.mkdir(parents=True)
    leaf = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [1]}
    data = {"Functional.relu.0.forward\n": {"input": [dict(leaf, data_name="missing.pt")]},
            "Functional.gelu.0.\tforward": {"input": [dict(leaf, data_name="../up.pt")]}}
    (rank / "dump.json").write_text(json.dumps({"task": "tensor", "level": "L1", "framework": "pytorch",
                                                "data": data}))
    messages = [msg for _, msg in MsprobeDump().scan(tmp_path).errors]
    assert len(messages) == 2 and all(m.isprintable() for m in messages)
    assert any(m.startswith("missing: dump.json ('Functional.relu.0.forward\\n') names it") for m in messages)
    assert any(m.startswith("'Functional.gelu.0.\\tforward': data_name '../up.pt' is not a file name")
               for m in messages)


@needs_torch
def test_load_pt_bfloat16_noncontiguous_and_unsupported(tmp_path):
    import ml_dtypes
    import torch

    src = torch.linspace(-3, 3, 12, dtype=torch.bfloat16).reshape(3, 4)
    torch.save(src, tmp_path / "bf16.pt")
    a = load_pt(tmp_path / "bf16.pt", "bf16.pt")
    assert a.dtype == np.dtype(ml_dtypes.bfloat16) and a.shape == (3, 4)
    assert a.tobytes() == src.view(torch.int16).numpy().tobytes()
    t = torch.arange(12, dtype=torch.int64).reshape(3, 4).t()  # non-contiguous view
    torch.save(t, tmp_path / "t.pt")
    a = load_pt(tmp_path / "t.pt", "t.pt")
    assert a.flags.c_contiguous and a.tobytes() == t.contiguous().numpy().tobytes()
    torch.save(torch.tensor([True, False]), tmp_path / "b.pt")
    assert load_pt(tmp_path / "b.pt", "b.pt").dtype == np.bool_
    torch.save(torch.zeros(2, dtype=torch.float8_e4m3fn), tmp_path / "f8.pt")
    with pytest.raises(DumpFileError, match=r"^f8\.pt: dtype torch.float8_e4m3fn"):
        load_pt(tmp_path / "f8.pt", "f8.pt")
    torch.save({"a": 1}, tmp_path / "d.pt")
    with pytest.raises(DumpFileError, match=r"^d\.pt: holds a dict, not a tensor"):
        load_pt(tmp_path / "d.pt", "d.pt")


# -- ingest ---------------------------------------------------------------------------
@pytest.mark.parametrize("case", [*STAT_CASES, pytest.param("tensor_mix", marks=needs_torch)])
def test_ingest_counts_and_stats(archive, case):
    root = MSP / case
    rows = _rows(archive, case)
    expected = expected_rows(root)
    assert len(rows) == count_tensor_leaves(root) == len(expected)
    assert dumpdb.open(archive).sql("SELECT count(*) AS n FROM ingest_errors WHERE run = ?", [case])["n"][0].as_py() == 0
    by = {(r["rank"], r["step"], r["op_name"], r["io"], r["slot_path"]): r for r in rows}
    assert by.keys() == expected.keys()
    for k, r in by.items():
        leaf = expected[k]["leaf"]
        for src, col in STATS.items():
            if leaf[src] is not None:
                assert r[col] == float(leaf[src]), (k, col)  # the dump's value, not recomputed
            else:  # null in dump.json (int tensors' Mean/Norm): computed when there is a payload
                assert (r[col] is None) == (expected[k]["file"] is None), (k, col)
        assert r["shape"] == leaf["shape"] and r["dtype_declared"] == leaf["dtype"]
        assert r["requires_grad"] is leaf["requires_grad"] and r["iteration"] == r["step"]
        assert (r["content_hash"] is None) == (expected[k]["file"] is None)
    with_payload = sum(x["file"] is not None for x in expected.values())
    assert sum(r["content_hash"] is not None for r in rows) == with_payload
    assert with_payload == (len(rows) if case.startswith("tensor") else 0)


@needs_torch
def test_tensor_payloads_bit_exact(archive):
    root = MSP / "tensor_mix"
    n = 0
    with dumpdb.open(archive) as a:
        for row, array in a.tensors("SELECT tensor_id, source_file, dtype, shape, count FROM tensors "
                                    "WHERE run = 'tensor_mix' ORDER BY tensor_id"):
            dtype, shape, payload = torch_payload(root / row["source_file"])
            assert array.shape == shape and row["dtype"] == dtype and array.size == row["count"]
            assert np.ascontiguousarray(array).tobytes() == payload, row["source_file"]
            n += 1
    assert n == count_tensor_leaves(root) == 194


def test_md5_case_stores_crc32(archive):
    rows = _rows(archive, "statistics_mix_md5")
    assert rows and all(r["checksum_algo"] == "crc32" and re.fullmatch(r"[0-9a-f]{8}", r["checksum"]) for r in rows)
    assert all(r["checksum"] is None for r in _rows(archive, "statistics_mix_2rank_gloo"))
    if not HAVE_TORCH:
        pytest.skip("PyTorch not installed (pip install 'dumpdb[torch]'): payload CRC32s not checked")
    # Same model, seeds and inputs as tensor_mix: its payloads have these CRC32s.
    md5 = {(r["step"], r["tensor_key"].split("#")[1]): r["checksum"] for r in rows}
    with dumpdb.open(archive) as a:
        checked = 0
        for row, array in a.tensors("SELECT tensor_id, step, tensor_key FROM tensors WHERE run = 'tensor_mix'"):
            want = md5[(row["step"], row["tensor_key"].split("#")[1])]
            assert f"{zlib.crc32(np.ascontiguousarray(array).tobytes()):08x}" == want
            checked += 1
    assert checked == len(rows)


def test_call_stacks_and_module_tree_join_tensors(archive):
    a = dumpdb.open(archive)
    for case in CASES if HAVE_TORCH else STAT_CASES:
        n_stack = a.sql("SELECT count(*) AS n FROM call_stacks WHERE run = ?", [case])["n"][0].as_py()
        n_tree = a.sql("SELECT count(*) AS n FROM module_tree WHERE run = ?", [case])["n"][0].as_py()
        assert n_stack > 0 and n_tree > 0
        joined = a.sql(
            "SELECT count(DISTINCT t.op_name) AS ops, count(*) AS n FROM tensors t JOIN call_stacks c "
            "ON c.run = t.run AND c.op_name = t.op_name AND c.iteration = t.iteration "
            "AND c.rank IS NOT DISTINCT FROM t.rank WHERE t.run = ?", [case]).to_pylist()[0]
        assert joined["ops"] >= 20 and joined["n"] > 0
        tree = a.sql(
            "SELECT count(*) AS n FROM tensors t JOIN module_tree m ON m.run = t.run AND m.node = t.op_name "
            "AND m.iteration = t.iteration AND m.rank IS NOT DISTINCT FROM t.rank WHERE t.run = ?", [case])
        assert tree["n"][0].as_py() > 0
    frames = a.sql("SELECT frames FROM call_stacks WHERE run = 'statistics_mix_md5' AND op_name = "
                   "'Functional.conv2d.0.forward' AND iteration = 0")["frames"][0].as_py()
    assert any("F.conv2d(" in f for f in frames)
    parent = a.sql("SELECT parent FROM module_tree WHERE run = 'statistics_mix_md5' AND iteration = 1 AND node = "
                   "'Functional.linear.0.forward'")["parent"][0].as_py()
    assert parent == "Module.mlp.0.Linear.forward.0"


def test_two_ranks(archive):
    a = dumpdb.open(archive)
    got = a.sql("SELECT rank, step, count(*) AS n FROM tensors WHERE run = 'statistics_mix_2rank_gloo' "
                "GROUP BY ALL ORDER BY ALL").to_pylist()
    assert [(r["rank"], r["step"]) for r in got] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert {r["n"] for r in got} == {100}
    assert a.sql("SELECT DISTINCT rank FROM call_stacks WHERE run = 'statistics_mix_2rank_gloo' "
                 "ORDER BY rank")["rank"].to_pylist() == [0, 1]
    assert a.sql("SELECT count(*) AS n FROM tensors WHERE run = 'statistics_mix_md5' AND rank IS NOT NULL"
                 )["n"][0].as_py() == 0  # proc{PID}: no rank


def test_reingest_adds_nothing(archive):
    report = dumpdb.ingest(MSP / "statistics_mix_md5", archive=archive, run="statistics_mix_md5")
    assert report.ok and report.tensors_added == 0 and report.tensors_skipped == 194


def _torch_gone(monkeypatch):
    """`import torch` raises ImportError from now on, as on a machine without it (also when
    torch is installed: the test means the same in both places)."""
    from dumpdb.layouts import msprobe

    monkeypatch.setitem(sys.modules, "torch", None)
    msprobe.torch_available.cache_clear()
    monkeypatch.setattr(msprobe, "torch_available", msprobe.torch_available.__wrapped__)


def test_without_torch_pt_files_keep_statistics_and_a_later_ingest_fills_them_in(tmp_path, monkeypatch):
    """Without PyTorch a .pt dump ingests statistics-only, with one warning saying the remedy;
    once torch is there the same command stores the payloads (issue 30: it used to answer
    `0 added, 194 already there` forever). Passes with and without torch installed."""
    _torch_gone(monkeypatch)
    archive = tmp_path / "a.dumpdb"
    stats = dumpdb.ingest(MSP / "statistics_mix_md5", archive=archive, run="s")
    assert stats.ok and stats.statistics_only == 194
    with pytest.warns(dumpdb.DumpdbWarning, match=r"194 \.pt payloads not stored.*ingest the same dump again"):
        report = dumpdb.ingest(MSP / "tensor_mix", archive=archive, run="t")
    assert report.ok and report.statistics_only == 194 and not report.errors
    a = dumpdb.open(archive)
    assert a.sql("SELECT count(*) AS n FROM tensors WHERE run = 't' AND content_hash IS NULL")["n"][0].as_py() == 194
    tid = a.sql("SELECT min(tensor_id) AS i FROM tensors WHERE run = 't'")["i"][0].as_py()
    with pytest.raises(dumpdb.DumpdbError, match="only statistics"):
        a.tensor(tid)
    with pytest.warns(dumpdb.DumpdbWarning):  # still no torch: nothing to fill in, nothing changes
        again = dumpdb.ingest(MSP / "tensor_mix", archive=archive, run="t")
    assert again.tensors_added == again.tensors_replaced == 0 and again.tensors_skipped == 194
    if not HAVE_TORCH:
        return  # the fill-in needs torch: checked where it is installed (.ci/run installs it)
    monkeypatch.undo()
    from dumpdb.layouts import msprobe

    msprobe.torch_available.cache_clear()
    filled = dumpdb.ingest(MSP / "tensor_mix", archive=archive, run="t")
    assert filled.ok and filled.payloads_filled == filled.tensors_replaced == 194 and filled.tensors_added == 0
    a = dumpdb.open(archive)
    assert a.sql("SELECT count(*) AS n FROM tensors WHERE run = 't' AND content_hash IS NULL")["n"][0].as_py() == 0
    row = a.sql("SELECT r.source_path || '/' || t.source_file AS f FROM tensors t JOIN runs r USING (run) "
                "WHERE t.tensor_id = ?", [tid]).to_pylist()[0]
    assert a.tensor(tid).tobytes() == load_pt(row["f"], "x").tobytes()
    assert dumpdb.ingest(MSP / "tensor_mix", archive=archive, run="t").tensors_skipped == 194  # done: stays done


# -- the whole real corpus ---------------------------------------------------------------
@needs_torch
def test_whole_msprobe_corpus_via_cli(tmp_path):
    if not CORPUS_MSP.is_dir():
        pytest.skip(f"msprobe corpus not found at {CORPUS_MSP} (set DUMPDB_CORPUS)")
    cases = sorted(p.name for p in CORPUS_MSP.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))
    assert cases
    archive = tmp_path / "corpus.dumpdb"
    runner = CliRunner()
    for case in cases:
        result = runner.invoke(app, ["ingest", str(CORPUS_MSP / case), "--archive", str(archive), "--run", case, "-q"])
        assert result.exit_code == 0, (case, result.output)
    with dumpdb.open(archive) as a:
        for case in cases:
            root = CORPUS_MSP / case
            n = a.sql("SELECT count(*) AS n FROM tensors WHERE run = ?", [case])["n"][0].as_py()
            assert n == count_tensor_leaves(root) > 0, case
            files = sorted(root.rglob("*.pt"))
            seen = 0
            for row, array in a.tensors("SELECT tensor_id, source_file FROM tensors WHERE run = ? "
                                        "AND content_hash IS NOT NULL", [case]):
                dtype, shape, payload = torch_payload(root / row["source_file"])
                assert array.shape == shape and np.ascontiguousarray(array).tobytes() == payload
                seen += 1
            assert seen == len(files), case
