"""MindSpore 2.x sync layout: names, mapping.csv, statistic.csv, IR, linkage, detection."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from conftest import ms_case, npy_files

import dumpdb
from dumpdb.errors import LayoutError
from dumpdb.layouts import detect, get_layout
from dumpdb.layouts.mindspore_ir import link_scopes, parse_ir
from dumpdb.layouts.mindspore_sync import MindSporeSync, find_dump_roots, parse_tensor_name, read_statistic_csv


def test_parse_name_with_and_without_dtype():
    # MindSpore 2.10 (corpus) appends the dtype; seed 001 documents the name without it.
    with_dtype = parse_tensor_name(
        "Conv2D.Default_network-WithLossCell__backbone-LeNet5_conv1-Conv2d_Conv2D-op0.0.0.1795336641444038"
        ".output.0.DefaultFormat.Float32.npy")
    assert with_dtype == {
        "op_type": "Conv2D", "op_name": "Default_network-WithLossCell__backbone-LeNet5_conv1-Conv2d_Conv2D-op0",
        "task_id": 0, "stream_id": 0, "timestamp": 1795336641444038, "io": "output", "slot": 0,
        "format": "DefaultFormat", "dtype_declared": "Float32"}
    seed = parse_tensor_name("Conv2D.Conv2D-op12.0.0.1623124369613540.output.0.DefaultFormat.npy")
    assert seed["op_name"] == "Conv2D-op12" and seed["format"] == "DefaultFormat" and seed["dtype_declared"] is None
    assert parse_tensor_name("Parameter.data-3.0.0.1623124369613540.output.0.DefaultFormat.npy")["op_name"] == "data-3"
    assert parse_tensor_name("notes.txt.npy") is None


def test_every_npy_file_becomes_one_entry():
    for case in ("c1_inputs_kernels_iter", "f_long_names", "d2_compare_fp16_bf16_iter0", "a_tensor_all_eval"):
        root = ms_case(case)
        scan = MindSporeSync().scan(root)
        assert not scan.errors
        assert sorted(e.source_file for e in scan.entries) == sorted(
            str(p.relative_to(root)) for p in npy_files(root))


def test_mapping_csv_gives_original_names():
    root = ms_case("f_long_names")
    scan = MindSporeSync().scan(root)
    mapping = {}
    for line in (root / "rank_0/LeNet5/0/0/mapping.csv").read_text().splitlines():
        hashed, original = line.split(",", 1)
        mapping[hashed] = original
    hashed_entries = [e for e in scan.entries if e.source_file.split("/")[-1] in mapping]
    assert len(hashed_entries) == len(mapping) == 6
    for e in hashed_entries:
        original = mapping[e.source_file.split("/")[-1]]
        assert original.startswith(f"{e.op_type}.{e.op_name}.")
        assert len(original) > 255 and "mapping.csv" in e.note


def test_metadata_and_graph_files_are_read():
    scan = MindSporeSync().scan(ms_case("a_tensor_all_eval"))
    assert scan.framework == "MindSpore" and scan.framework_version == "2.10.0" and scan.device_target == "CPU"
    assert '"net_name": "LeNet5"' in scan.dump_config
    assert {(x["graph_id"], x["iteration"]) for x in scan.graph_executions} == {(0, 0), (0, 1), (0, 2), (1, 3)}
    order_1 = [x["scope_name"] for x in scan.execution_order if x["graph_id"] == 1]
    assert len(order_1) == 15 and order_1[0].endswith("conv1-Conv2d/Conv2D-op0")


def test_ir_nodes_shapes_and_source_lines():
    nodes, params = parse_ir(ms_case("a_tensor_all_eval") / "rank_0/graphs/ms_output_trace_code_graph_1.ir")
    assert "fc1.weight" in params and "x" in params
    conv = next(n for n in nodes if n["scope_name"].endswith("conv1-Conv2d/Conv2D-op0"))
    assert conv["op_type"] == "Conv2D" and conv["node"] == "%1"
    assert conv["input_shapes"] == [[4, 1, 32, 32], [6, 1, 5, 5]] and conv["output_shapes"] == [[4, 6, 28, 28]]
    assert conv["input_dtypes"] == ["Float32", "Float32"]
    assert conv["code_file"] == "/home/user/lenet/ms_lenet_train.py" and conv["code_line"] == 80
    assert conv["code_text"] == "x = self.max_pool2d(self.relu(self.conv1(x)))"
    assert len(conv["code_trace"]) == 4
    relu = next(n for n in nodes if n["ir_op_type"] == "PrimFunc_ReLU")
    assert relu["op_type"] == "ReLU"
    assert nodes[-1]["op_type"] == "Return" and nodes[-1]["scope_name"] == "Default/Return-op1"


def test_link_scopes_rules():
    scopes = ["A/relu-ReLU/ReLU-op0", "A/relu-ReLU/ReLU-op1", "G/conv-Conv/Filter-op1", "A/x_y/Add-op0", "A/x/y/Add-op0"]
    files = ["A_relu-ReLU_ReLU-op4", "A_relu-ReLU_ReLU-op5", "G_conv-Conv_Filter-op0", "A_x_y_Add-op0"]
    got = link_scopes(files, scopes)
    assert got["A_relu-ReLU_ReLU-op4"] == "A/relu-ReLU/ReLU-op0"  # renumbered: paired in -opN order
    assert got["A_relu-ReLU_ReLU-op5"] == "A/relu-ReLU/ReLU-op1"
    assert got["G_conv-Conv_Filter-op0"] == "G/conv-Conv/Filter-op1"
    assert "A_x_y_Add-op0" not in got  # two scopes flatten to it: ambiguous, never guessed
    assert link_scopes(["A_relu-ReLU_ReLU-op1"], scopes) == {"A_relu-ReLU_ReLU-op1": "A/relu-ReLU/ReLU-op1"}


def test_real_renumbered_eval_graph_links_by_order():
    scan = MindSporeSync().scan(ms_case("a_tensor_all_eval"))
    by_name = {e.op_name: e.scope_name for e in scan.entries}
    prefix = "Default_network-WithLossCell__backbone-LeNet5_"
    for file_n, ir_n in zip(range(4, 8), range(4)):
        assert by_name[f"{prefix}relu-ReLU_ReLU-op{file_n}"] == \
            f"Default/network-WithLossCell/_backbone-LeNet5/relu-ReLU/ReLU-op{ir_n}"
    assert by_name["fc1_weight"] == "fc1.weight" and by_name["x"] == "x"
    assert all(e.scope_name for e in scan.entries)


def test_statistic_csv_parsed_by_header_names(tmp_path):
    path = tmp_path / "statistic.csv"
    path.write_text(
        "Op Name,Op Type,Task ID,Stream ID,Timestamp,IO,Slot,Data Size,Data Type,Shape,Extra,"
        "Max Value,Min Value,Avg Value,Count,Negative Zero Count,Positive Zero Count,NaN Count,"
        "Negative Inf Count,Positive Inf Count,L2Norm Value,MD5\n"
        "Default_Conv2D-op0,Conv2D,0,0,17,output,0,64,float32,\"(4,4)\",x,"
        "2.5,-1,0.25,16,1,2,0,0,1,3.5,abcd\n")
    (row,) = read_statistic_csv(path)
    assert (row["op_type"], row["op_name"], row["timestamp"], row["io"], row["slot"]) == \
        ("Conv2D", "Default_Conv2D-op0", 17, "output", 0)
    assert row["shape"] == (4, 4)
    assert row["stats"] == {"max": 2.5, "min": -1.0, "mean": 0.25, "l2norm": 3.5, "count": 16,
                            "nan_count": 0, "pos_inf_count": 1, "neg_inf_count": 0, "zero_count": 3}
    assert (row["checksum"], row["checksum_algo"]) == ("abcd", "md5")


def test_dump_root_search(tmp_path):
    shutil.copytree(ms_case("c1_inputs_kernels_iter"), tmp_path / "runs/exp1/dump")
    assert find_dump_roots(tmp_path) == [tmp_path / "runs/exp1/dump"]
    assert detect(tmp_path).name == "mindspore-sync"
    scan = MindSporeSync().scan(tmp_path)
    assert all(e.source_file.startswith("runs/exp1/dump/rank_0/") for e in scan.entries)
    shutil.copytree(ms_case("f_long_names"), tmp_path / "runs/exp2")
    with pytest.raises(LayoutError, match="2 separate dumps"):
        MindSporeSync().scan(tmp_path)


def test_detect_errors_say_what_is_wrong(tmp_path):
    with pytest.raises(LayoutError, match="no such directory"):
        detect(tmp_path / "nope")
    (tmp_path / "file").write_text("x")
    with pytest.raises(LayoutError, match="not a directory"):
        detect(tmp_path / "file")
    (tmp_path / "empty").mkdir()
    with pytest.raises(LayoutError, match="not a dump dumpdb recognises.*mindspore-sync"):
        detect(tmp_path / "empty")
    with pytest.raises(LayoutError, match="unknown layout 'nope'.*mindspore-sync"):
        get_layout("nope")


def test_task_id_and_stream_id_are_not_swapped(tmp_path):
    """Seed 001's name pattern {op_type}.{op_name}.{task_id}.{stream_id}.{timestamp}.{io}.{slot}.{format}.npy
    with non-zero, distinct ids (every real CPU case has 0/0): each lands in its own column."""
    assert parse_tensor_name("Conv2D.Conv2D-op12.7.3.1623124369613540.output.1.NC1HWC0.npy") == {
        "op_type": "Conv2D", "op_name": "Conv2D-op12", "task_id": 7, "stream_id": 3,
        "timestamp": 1623124369613540, "io": "output", "slot": 1, "format": "NC1HWC0", "dtype_declared": None}
    it = tmp_path / "dump/rank_0/Net/0/0"
    it.mkdir(parents=True)
    names = {"MatMul.Default_MatMul-op5.41.2.1623124369613541.input.0.DefaultFormat.npy": (41, 2),
             "ReLU.Default_ReLU-op6.9.5.1623124369613542.output.0.DefaultFormat.Float32.npy": (9, 5)}
    for i, name in enumerate(names):
        np.save(it / name, np.full((2, 3), i, np.float32))
    archive = tmp_path / "a.dumpdb"
    assert dumpdb.ingest(tmp_path / "dump", archive=archive, run="ids").ok
    rows = dumpdb.open(archive).sql("SELECT source_file, task_id, stream_id, timestamp FROM tensors").to_pylist()
    got = {r["source_file"].rsplit("/", 1)[-1]: (r["task_id"], r["stream_id"]) for r in rows}
    assert got == names
    assert sorted(r["timestamp"] for r in rows) == [1623124369613541, 1623124369613542]
