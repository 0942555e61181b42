"""Readers of older and side-channel MindSpore dumps: r1.2 synchronous ``.bin`` (GPU/Ascend
and CPU variants), msaccucmp-converted ``.npy``, ``ops.TensorDump`` files (synthetic and the
real j_tensordump_pynative case), and statistic-only synchronous dumps.

Fixtures are built in tmp_path with file and directory names exactly as the seeds spell
them, and real payloads taken from tests/data/mindspore.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import DATA, assert_bit_exact, ms_case, npy_payload

import dumpdb
from dumpdb.layouts import LAYOUTS, detect, get_layout
from dumpdb.layouts.mindspore_legacy import MindSporeR12SyncBin, parse_bin_name
from dumpdb.layouts.msaccucmp import MsaccucmpNpy, parse_msaccucmp_name
from dumpdb.layouts.statistic_only import StatisticOnly
from dumpdb.layouts.tensordump import MindSporeTensorDump, parse_tensordump_name
from dumpdb.npy import read_npy

TENSORDUMP_REAL = DATA / "tensordump" / "j_tensordump_pynative"
MY_LAYOUTS = ["mindspore-r1.2-sync-bin", "msaccucmp-npy", "mindspore-tensordump", "statistic-only"]


# -- real payloads ---------------------------------------------------------------
def _real(case: str, pattern: str) -> tuple[Path, np.ndarray]:
    """A real tests/data tensor file whose payload is exactly what its header says."""
    for path in sorted((ms_case(case) / "rank_0").rglob(pattern)):
        t = read_npy(str(path))
        if t.note is None:
            return path, t.array
    raise AssertionError(f"no clean file {pattern} in {case}")


@pytest.fixture(scope="module")
def payloads() -> dict[str, tuple[Path, np.ndarray]]:
    p = {
        "f32_4d": _real("a_tensor_all_eval", "Conv2D.*conv1*.input.0.DefaultFormat.Float32.npy"),
        "f32_1d": _real("a_tensor_all_eval", "BiasAdd.*fc1*.input.1.DefaultFormat.Float32.npy"),
        "f16": _real("d2_compare_fp16_bf16_iter0", "Cast.Default_Cast-op2.*.output.0.DefaultFormat.Float16.npy"),
        "i32": _real("d2_compare_fp16_bf16_iter0", "AssignAdd.*.output.0.DefaultFormat.Int32.npy"),
        "bool0": _real("a_tensor_all_eval", "MatMul.*fc1*.input.2.DefaultFormat.Bool.npy"),
    }
    assert p["f32_4d"][1].shape == (4, 1, 32, 32) and p["f32_1d"][1].shape == (120,)
    assert p["f16"][1].dtype == np.float16 and p["f16"][1].shape == (84, 120)
    assert p["i32"][1].dtype == np.int32 and p["bool0"][1].shape == () and p["bool0"][1].dtype == np.bool_
    return p


def _bytes(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).tobytes()


def _rows(archive: Path, run: str) -> dict[str, dict]:
    rows = dumpdb.open(archive).sql("SELECT * FROM tensors WHERE run = ? ORDER BY tensor_id", [run]).to_pylist()
    return {r["source_file"]: r for r in rows}


def _errors(archive: Path, run: str) -> dict[str, str]:
    rows = dumpdb.open(archive).sql("SELECT source_file, error FROM ingest_errors WHERE run = ?", [run]).to_pylist()
    return {r["source_file"]: r["error"] for r in rows}


# -- fixtures: r1.2 synchronous .bin (seed 000) -----------------------------------
SEED000_CONFIG = {
    "common_dump_settings": {
        "dump_mode": 0, "path": "/absolute_path", "net_name": "ResNet50", "iteration": 0,
        "input_output": 0, "kernels": ["Default/Conv-op12"], "support_device": [0, 1, 2, 3, 4, 5, 6, 7],
    },
    "e2e_dump_settings": {"enable": True, "trans_flag": True},
}
CONV_SCOPE = "Default/network-WithLossCell/_backbone-AlexNet/conv3-Conv2d/Conv2D-op107"
BIAS_SCOPE = "Default/network-WithLossCell/_backbone-AlexNet/conv3-Conv2d/BiasAdd-op105"
# The seed's IR excerpt (r1.2 form: the scope is a bare ": (...)" line).
SEED000_IR = """\
  %24(equivoutput) = Conv2D(%23, %21) {instance name: conv2d} primitive_attrs: {compile_info: , pri_format: NC1HWC0, stride: (1, 1, 1, 1), pad: (0, 0, 0, 0), pad_mod: same, out_channel:
192, mode: 1, dilation: (1, 1, 1, 1), output_names: [output], group: 1, format: NCHW, offset_a: 0, kernel_size: (3, 3), groups: 1, input_names: [x, w], pad_list: (1, 1, 1, 1),
IsFeatureMapOutput: true, IsFeatureMapInputList: (0)}
       : (<Tensor[Float32]x[const vector][32, 128, 13, 13]>, <Tensor[Float16]x[const vector][192, 128, 3, 3]>) -> (<Tensor[Float16]x[const vector][32, 192, 13, 13]>)
       : (<Float16xNC1HWC0[const vector][32, 8, 13, 13, 16]>, <Float16xFracZ[const vector][72, 12, 16, 16]>) -> (<Float16xNC1HWC0[const vector][32, 12, 13, 13, 16]>)
       : (Default/network-WithLossCell/_backbone-AlexNet/conv3-Conv2d/Conv2D-op107)
       ...
       # In file {Absolute path of model_zoo}/official/cv/alexnet/src/alexnet.py(58)/        x = self.conv3(x)/
       ...
  %25(equivoutput) = BiasAdd(%24, %22) {instance name: bias_add} primitive_attrs: {output_used_num: (1), input_names: [x, b], format: NCHW, compile_info: , output_names: [output],
IsFeatureMapOutput: true, IsFeatureMapInputList: (0), pri_format: NC1HWC0}
       : (<Tensor[Float16]x[const vector][32, 192, 13, 13]>) -> (<Tensor[Float16]x[const vector][192]>) -> (<Tensor[Float16]x[const vector][32, 192, 13, 13]>)
       : (<Float16xNC1HWC0[const vector][32, 12, 13, 13, 16]>) -> (<Float16xDefaultFormat[const vector][192]>) -> (<Float16xNC1HWC0[const vector][32, 12, 13, 13, 16]>)
       : (Default/network-WithLossCell/_backbone-AlexNet/conv3-Conv2d/BiasAdd-op105)
       ...
       # In file {Absolute path of model_zoo}/official/cv/alexnet/src/alexnet.py(58)/        x = self.conv3(x)/
       ...
"""


def _flat(scope: str) -> str:
    return scope.replace("/", "--")  # seed 000: "replace / with -- to get it"


def _bin_name(op: str, io_index: str, shape: tuple, data_type: str, fmt: str) -> str:
    dims = "_".join(map(str, shape)) if shape else "0"  # MindSpore r1.2 writes shape_0 for a scalar
    return f"{op}_{io_index}_shape_{dims}_{data_type}_{fmt}.bin"


def make_r12_dump(root: Path, payloads) -> dict[str, dict]:
    """{path}/{net_name}/device_{id}/iteration_{n}/*.bin + graphs/, execution_order/, .metadata/.

    Returns {source_file: expected fields} for the good files.
    """
    f32, f16, i32, b0, f32_1d = (payloads[k][1] for k in ("f32_4d", "f16", "i32", "bool0", "f32_1d"))
    net = root / "ResNet50"
    dev0, dev1 = net / "device_0", net / "device_1"
    expected: dict[str, dict] = {}

    def put(it_dir: Path, op: str, io_index: str, array: np.ndarray, data_type: str, fmt: str, **extra):
        it_dir.mkdir(parents=True, exist_ok=True)
        name = _bin_name(op, io_index, array.shape, data_type, fmt)
        (it_dir / name).write_bytes(_bytes(array))  # raw bytes, as numpy.tofile writes them
        io, slot = io_index.split("_")
        expected[str((it_dir / name).relative_to(root))] = {
            "op_name": op, "io": io, "slot": int(slot), "array": array, "format": fmt,
            "dtype_declared": data_type, **extra}

    put(dev0 / "iteration_0", _flat(CONV_SCOPE), "input_0", f32, "Float32", "NCHW",
        scope_name=CONV_SCOPE, op_type="Conv2D", graph_id=0, device_id=0, iteration=0)
    put(dev0 / "iteration_0", _flat(CONV_SCOPE), "output_0", f16, "Float16", "NC1HWC0",
        scope_name=CONV_SCOPE, op_type="Conv2D", graph_id=0, device_id=0, iteration=0)
    put(dev0 / "iteration_0", _flat(BIAS_SCOPE), "input_1", f32_1d, "Float32", "DefaultFormat",
        scope_name=BIAS_SCOPE, op_type="BiasAdd", graph_id=0, device_id=0, iteration=0)
    # an op in no graph file: no scope_name
    put(dev0 / "iteration_0", "Default--Cast-op9", "output_0", i32, "kNumberTypeInt32", "DefaultFormat",
        scope_name=None, op_type=None, graph_id=None, device_id=0, iteration=0)
    put(dev0 / "iteration_1", _flat(CONV_SCOPE), "input_2", b0, "Bool", "DefaultFormat",
        scope_name=CONV_SCOPE, op_type="Conv2D", graph_id=0, device_id=0, iteration=1)
    put(dev1 / "iteration_0", _flat(CONV_SCOPE), "output_0", f16, "kNumberTypeFloat16", "NC1HWC0",
        scope_name=None, op_type=None, graph_id=None, device_id=1, iteration=0)  # device_1 has no graphs/
    (dev0 / "graphs").mkdir()
    (dev0 / "graphs" / "ms_output_trace_code_graph_0.ir").write_text(SEED000_IR)
    (dev0 / "graphs" / "ms_output_trace_code_graph_0.pb").write_bytes(b"\x08\x01")
    (dev0 / "execution_order").mkdir()
    (dev0 / "execution_order" / "ms_execution_order_graph_0.csv").write_text(
        f"NodeExecutionOrder-FullNameWithScope\n{CONV_SCOPE}\n{BIAS_SCOPE}\n")
    (root / ".metadata").mkdir()
    (root / ".metadata" / "data_dump.json").write_text(json.dumps(SEED000_CONFIG, indent=4))
    return expected


def make_r12_cpu_dump(root: Path, payloads) -> dict[str, dict]:
    """CPU variant: {path}/{net_name}/iteration_{n}/*.bin, no device_{id}, graphs, execution_order, .metadata."""
    expected = {}
    it = root / "LeNet5" / "iteration_3"
    it.mkdir(parents=True)
    for op, io_index, key, data_type in (
        ("Default--network-WithLossCell--_backbone-LeNet5--conv1-Conv2d--Conv2D-op0", "input_0", "f32_4d", "Float32"),
        ("Default--network-WithLossCell--_backbone-LeNet5--fc1-Dense--MatMul-op0", "input_2", "bool0", "Bool"),
    ):
        array = payloads[key][1]
        name = _bin_name(op, io_index, array.shape, data_type, "DefaultFormat")
        (it / name).write_bytes(_bytes(array))
        io, slot = io_index.split("_")
        expected[f"LeNet5/iteration_3/{name}"] = {"op_name": op, "io": io, "slot": int(slot), "array": array,
                                                  "format": "DefaultFormat", "dtype_declared": data_type,
                                                  "scope_name": None, "device_id": None, "iteration": 3}
    return expected


# -- fixtures: msaccucmp-converted .npy (seeds 000/001) ---------------------------
def make_msaccucmp_dump(root: Path, payloads) -> dict[str, dict]:
    root.mkdir(parents=True, exist_ok=True)
    expected = {}

    def put(name: str, key: str, **fields):
        path, array = payloads[key]
        shutil.copyfile(path, root / name)  # the real .npy, header and payload as dumped
        expected[name] = {"array": array, **fields}

    conv = "Conv2D.Default_network-WithLossCell__backbone-AlexNet_conv3-Conv2d_Conv2D-op12.2.7.161243956333802"
    bn = ("BNTrainingUpdate.Default_network-YoloWithLossCell_yolo_network-YOLOV3DarkNet53_feature_map-YOLOv3_"
          "backblock0-YoloBlock_conv3-SequentialCell_1-BatchNorm2d_BNTrainingUpdate-op5489.137.1608983934774491")
    common_conv = {"op_type": "Conv2D", "op_name": conv.split(".")[1], "task_id": 2, "stream_id": 7,
                   "timestamp": 161243956333802}
    common_bn = {"op_type": "BNTrainingUpdate", "op_name": bn.split(".")[1], "task_id": 137, "stream_id": None,
                 "timestamp": 1608983934774491}
    put(f"{conv}.input.0.4x1x32x32.npy", "f32_4d", io="input", slot=0, **common_conv)
    put(f"{conv}.output.0.84x120.npy", "f16", io="output", slot=0, **common_conv)
    put(f"{bn}.input.1.120.npy", "f32_1d", io="input", slot=1, **common_bn)
    put(f"{bn}.output.4.1.npy", "i32", io="output", slot=4, **common_bn)
    put(f"{bn}.input.6.npy", "bool0", io="input", slot=6, **common_bn)  # older msaccucmp: no shape part
    return expected


# -- fixtures: ops.TensorDump -------------------------------------------------------
def make_tensordump_dump(root: Path, payloads) -> dict[str, dict]:
    root.mkdir(parents=True, exist_ok=True)
    expected = {}

    def put(name: str, array: np.ndarray, **fields):
        np.save(root / name, array)
        expected[name] = {"array": array, **fields}

    put("conv1_out_float32_0.npy", payloads["f32_4d"][1], op_name="conv1_out", io="output", call_index=0,
        dtype_declared="float32")
    put("fc2_x_in_float16_1.npy", payloads["f16"][1], op_name="fc2_x", io="input", call_index=1,
        dtype_declared="float16")
    put("step_int32_2.npy", payloads["i32"][1], op_name="step", io="output", call_index=2, dtype_declared="int32")
    put("transpose_b_bool_3.npy", payloads["bool0"][1], op_name="transpose_b", io="output", call_index=3,
        dtype_declared="bool")
    # "bfloat16类型数据保存在.npy文件中会被转换成float32类型"
    put("fc1_bf16_bfloat16_4.npy", payloads["f32_1d"][1], op_name="fc1_bf16", io="output", call_index=4,
        dtype_declared="bfloat16")
    return expected


# -- fixtures: statistic-only (seed 001, saved_data "statistic") ---------------------
SEED001_STAT_HEADER = ("Op Type,Op Name,Task ID,Stream ID,Timestamp,IO,Slot,Data Size,Data Type,Shape,Max Value,"
                       "Min Value,Avg Value,Count,Negative Zero Count,Positive Zero Count,NaN Count,"
                       "Negative Inf Count,Positive Inf Count,Zero Count,MD5")


def make_statistic_dump(root: Path, payloads) -> list[dict]:
    rank = root / "rank_0"
    (rank / ".dump_metadata").mkdir(parents=True)
    config = {"common_dump_settings": {"dump_mode": 0, "path": "/absolute_path", "net_name": "LeNet5",
                                       "iteration": "0|1", "saved_data": "statistic", "input_output": 0,
                                       "kernels": [], "support_device": [0, 1, 2, 3, 4, 5, 6, 7]},
              "e2e_dump_settings": {"enable": True, "trans_flag": True}}
    (rank / ".dump_metadata" / "data_dump.json").write_text(json.dumps(config))
    (rank / "execution_order").mkdir()
    scope = "Default/network-WithLossCell/_backbone-LeNet5/conv1-Conv2d/Conv2D-op0"
    (rank / "execution_order" / "ms_execution_order_graph_0.csv").write_text(
        f"NodeExecutionOrder-FullNameWithScope\n{scope}\n")
    (rank / "execution_order" / "ms_global_execution_order_graph_0.csv").write_text("0\n1\n")
    rows = []
    for it, (key, io, slot, ts) in enumerate((("f32_4d", "input", 0, 1795336641444038),
                                              ("f16", "output", 0, 1795336641444099))):
        a = payloads[key][1].astype(np.float64)
        row = {"op_type": "Conv2D", "op_name": scope.replace("/", "_"), "task_id": 0, "stream_id": 0,
               "timestamp": ts, "io": io, "slot": slot, "dtype": payloads[key][1].dtype.name,
               "shape": payloads[key][1].shape, "max": float(a.max()), "min": float(a.min()),
               "mean": float(a.mean()), "count": int(a.size), "zero_count": int((a == 0).sum()),
               "md5": "d41d8cd98f00b204e9800998ecf8427e", "iteration": it}
        it_dir = rank / "LeNet5" / "0" / str(it)
        it_dir.mkdir(parents=True)
        shape = "(" + ",".join(map(str, row["shape"])) + ")"
        line = (f"{row['op_type']},{row['op_name']},0,0,{ts},{io},{slot},{payloads[key][1].nbytes},{row['dtype']},"
                f"\"{shape}\",{row['max']!r},{row['min']!r},{row['mean']!r},{row['count']},0,{row['zero_count']},"
                f"0,0,0,{row['zero_count']},{row['md5']}")
        (it_dir / "statistic.csv").write_text(SEED001_STAT_HEADER + "\n" + line + "\n")
        rows.append(row)
    return rows


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory, payloads) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("legacy")
    out = {}
    out["r12"] = base / "r12_dump"
    make_r12_dump(out["r12"], payloads)
    out["r12_cpu"] = base / "r12_cpu_dump"
    make_r12_cpu_dump(out["r12_cpu"], payloads)
    out["msaccucmp"] = base / "output"
    make_msaccucmp_dump(out["msaccucmp"], payloads)
    out["tensordump"] = base / "td"
    make_tensordump_dump(out["tensordump"], payloads)
    out["statistic"] = base / "stat_dump"
    make_statistic_dump(out["statistic"], payloads)
    return out


OWN = {"r12": "mindspore-r1.2-sync-bin", "r12_cpu": "mindspore-r1.2-sync-bin", "msaccucmp": "msaccucmp-npy",
       "tensordump": "mindspore-tensordump", "statistic": "statistic-only"}


def _check_rows(archive: Path, run: str, expected: dict[str, dict]) -> dict[str, dict]:
    rows = _rows(archive, run)
    assert set(rows) == set(expected)
    a = dumpdb.open(archive)
    for source_file, exp in expected.items():
        row = rows[source_file]
        array = exp["array"]
        got = a.tensor(row["tensor_id"])
        assert got.dtype == array.dtype and got.shape == array.shape, source_file
        assert_bit_exact(got, _bytes(array))
        assert row["shape"] == list(array.shape) and row["nbytes"] == array.nbytes
        for k, v in exp.items():
            if k != "array":
                assert row[k] == v, (source_file, k, row[k], v)
    return rows


# -- names ---------------------------------------------------------------------------
def test_r12_name_grammar_follows_seed_000():
    # The seed's worked example, letter for letter.
    f = parse_bin_name("Default--network-WithLossCell--_backbone-AlexNet--conv3-Conv2d--Conv2D-op107"
                       "_output_0_shape_32_12_13_13_16_Float16_NC1HWC0.bin")
    assert f == {"op_name": "Default--network-WithLossCell--_backbone-AlexNet--conv3-Conv2d--Conv2D-op107",
                 "io": "output", "slot": 0, "shape_declared": (32, 12, 13, 13, 16), "dtype_declared": "Float16",
                 "format": "NC1HWC0"}
    # TypeIdLabel spelling, a format with underscores, a parameter name with dots, an op name with '_input_'
    f = parse_bin_name("conv1.weight_output_0_shape_6_1_5_5_kNumberTypeFloat32_FRACTAL_Z.bin")
    assert (f["op_name"], f["dtype_declared"], f["format"]) == ("conv1.weight", "kNumberTypeFloat32", "FRACTAL_Z")
    f = parse_bin_name("Default--my_input_1_cell--Add-op3_input_1_shape_2_Int32_DefaultFormat.bin")
    assert (f["op_name"], f["io"], f["slot"]) == ("Default--my_input_1_cell--Add-op3", "input", 1)
    for bad in ("Conv2D-op1_output_0_32_12_Float16_NC1HWC0.bin",   # no "shape_"
                "Conv2D-op1_output_0_shape_32_12_Float16.bin",       # no format
                "Conv2D-op1_out_0_shape_2_Float16_ND.bin", "Conv2D-op1_output_0_shape_2_Float16_ND.npy"):
        assert parse_bin_name(bad) is None, bad


def test_msaccucmp_name_grammar_follows_seeds():
    seed000 = ("BNTrainingUpdate.Default_network-YoloWithLossCell_yolo_network-YOLOV3DarkNet53_feature_map-YOLOv3_"
               "backblock0-YoloBlock_conv3-SequentialCell_1-BatchNorm2d_BNTrainingUpdate-op5489.137.1608983934774491"
               ".input.0.30x1024x17x17.npy")
    f = parse_msaccucmp_name(seed000)
    assert (f["op_type"], f["task_id"], f["stream_id"], f["timestamp"], f["io"], f["slot"], f["shape_declared"]) == \
        ("BNTrainingUpdate", 137, None, 1608983934774491, "input", 0, (30, 1024, 17, 17))
    seed001 = ("Conv2D.Default_network-WithLossCell__backbone-AlexNet_conv3-Conv2d_Conv2D-op12.2.7.161243956333802"
               ".output.0.32x384x13x13.npy")
    f = parse_msaccucmp_name(seed001)
    assert (f["op_name"], f["task_id"], f["stream_id"], f["timestamp"], f["io"], f["shape_declared"]) == \
        ("Default_network-WithLossCell__backbone-AlexNet_conv3-Conv2d_Conv2D-op12", 2, 7, 161243956333802,
         "output", (32, 384, 13, 13))
    assert parse_msaccucmp_name("Add.Default_Add-op1.2.161243956333802.output.0.npy")["shape_declared"] is None
    assert parse_msaccucmp_name("Add.Default_Add-op1.2.161243956333802.output.0..npy")["shape_declared"] == ()
    for bad in ("Add.Default_Add-op1.output.0.2x3.npy", "Add.Default_Add-op1.2.16124.output.0.2x3.bin",
                "Add.Default_Add-op1.2.16124.output.0.DefaultFormat.npy", "x_float32_0.npy"):
        assert parse_msaccucmp_name(bad) is None, bad


def test_tensordump_names_parse_from_the_right():
    assert parse_tensordump_name("x_fp16_float16_2.npy") == {
        "op_name": "x_fp16", "io": "output", "dtype_declared": "float16", "call_index": 2}
    assert parse_tensordump_name("x_int_int32_3.npy")["op_name"] == "x_int"
    assert parse_tensordump_name("grad_in_bfloat16_17.npy") == {
        "op_name": "grad", "io": "input", "dtype_declared": "bfloat16", "call_index": 17}
    assert parse_tensordump_name("a_int32_float32_0.npy")["op_name"] == "a_int32"
    for bad in ("x_0.npy", "x_float32.npy", "_float32_0.npy", "x_float33_0.npy", "x_float32_0.bin"):
        assert parse_tensordump_name(bad) is None, bad


# -- r1.2 sync bin ---------------------------------------------------------------------
def test_r12_ingest_auto_detects_and_is_bit_exact(tmp_path, payloads):
    dump = tmp_path / "dump"
    expected = make_r12_dump(dump, payloads)
    archive = tmp_path / "a.dumpdb"
    report = dumpdb.ingest(dump, archive=archive, run="r12")
    assert report.layout == "mindspore-r1.2-sync-bin" and report.ok, report.errors
    rows = _check_rows(archive, "r12", expected)
    assert all(r["rank"] is None and r["net_name"] == "ResNet50" for r in rows.values())
    assert {r["dtype"] for r in rows.values()} == {"float32", "float16", "int32", "bool"}
    a = dumpdb.open(archive)
    info = a.show("r12")
    assert json.loads(info["dump_config"]) == SEED000_CONFIG and info["device_target"] is None
    ops = a.sql("SELECT scope_name, op_type, code_line FROM ops WHERE run = 'r12' ORDER BY node").to_pylist()
    assert ops == [{"scope_name": CONV_SCOPE, "op_type": "Conv2D", "code_line": 58},
                   {"scope_name": BIAS_SCOPE, "op_type": "BiasAdd", "code_line": 58}]
    order = a.sql("SELECT position, scope_name FROM execution_order WHERE run = 'r12' ORDER BY position").to_pylist()
    assert [o["scope_name"] for o in order] == [CONV_SCOPE, BIAS_SCOPE]


def test_r12_scope_only_by_matching_never_by_reversal(tmp_path, payloads):
    dump = tmp_path / "dump"
    make_r12_dump(dump, payloads)
    shutil.rmtree(dump / "ResNet50/device_0/graphs")
    shutil.rmtree(dump / "ResNet50/device_0/execution_order")
    scan = MindSporeR12SyncBin().scan(dump)
    assert not scan.errors and scan.entries
    assert all(e.scope_name is None and e.op_type is None and e.graph_id is None for e in scan.entries)
    assert {e.op_name for e in scan.entries} >= {_flat(CONV_SCOPE), _flat(BIAS_SCOPE)}


def test_r12_cpu_variant(tmp_path, payloads):
    dump = tmp_path / "cpu"
    expected = make_r12_cpu_dump(dump, payloads)
    archive = tmp_path / "a.dumpdb"
    report = dumpdb.ingest(dump, archive=archive, run="cpu")
    assert report.layout == "mindspore-r1.2-sync-bin" and report.ok, report.errors
    rows = _check_rows(archive, "cpu", expected)
    assert all(r["net_name"] == "LeNet5" for r in rows.values())
    assert dumpdb.open(archive).show("cpu")["device_target"] == "CPU"


def test_r12_bad_files_are_errors_the_rest_ingests(tmp_path, payloads):
    dump = tmp_path / "dump"
    expected = make_r12_dump(dump, payloads)
    it = dump / "ResNet50/device_0/iteration_0"
    f32 = payloads["f32_4d"][1]
    short = _bin_name("Default--Mul-op3", "output_0", (4, 1, 32, 32), "Float32", "NCHW")
    (it / short).write_bytes(_bytes(f32)[:-4])  # wrong byte count
    long_ = _bin_name("Default--Mul-op4", "output_0", (2, 3), "Float32", "DefaultFormat")
    (it / long_).write_bytes(_bytes(f32)[:28])
    (it / "Default--Mul-op5_output_0.bin").write_bytes(b"\0" * 8)  # unparseable name
    odd = _bin_name("Default--Mul-op6", "output_0", (2,), "Foo16", "DefaultFormat")
    (it / odd).write_bytes(b"\0" * 4)  # unknown data type
    archive = tmp_path / "a.dumpdb"
    report = dumpdb.ingest(dump, archive=archive, run="bad")
    assert report.layout == "mindspore-r1.2-sync-bin"
    errors = _errors(archive, "bad")
    rel = "ResNet50/device_0/iteration_0/"
    assert set(errors) == {rel + short, rel + long_, rel + "Default--Mul-op5_output_0.bin", rel + odd}
    assert errors[rel + short].startswith(rel + short) and "16380 bytes" in errors[rel + short] \
        and "16384 bytes" in errors[rel + short]
    assert "28 bytes" in errors[rel + long_] and "24 bytes" in errors[rel + long_]
    assert "does not follow" in errors[rel + "Default--Mul-op5_output_0.bin"]
    assert "Foo16" in errors[rel + odd]
    _check_rows(archive, "bad", expected)


def test_r12_shape_0_is_a_scalar_or_empty(tmp_path):
    it = tmp_path / "d/Net/iteration_0"
    it.mkdir(parents=True)
    (it / "Default--Add-op1_output_0_shape_0_Float32_DefaultFormat.bin").write_bytes(np.float32(2.5).tobytes())
    (it / "Default--Add-op2_output_0_shape_0_Float32_DefaultFormat.bin").write_bytes(b"")
    archive = tmp_path / "a.dumpdb"
    report = dumpdb.ingest(tmp_path / "d", archive=archive, run="s")
    assert report.ok, report.errors
    a = dumpdb.open(archive)
    rows = {r["op_name"]: r for r in a.sql("SELECT * FROM tensors").to_pylist()}
    scalar, empty = a.tensor(rows["Default--Add-op1"]["tensor_id"]), a.tensor(rows["Default--Add-op2"]["tensor_id"])
    assert scalar.shape == () and scalar == np.float32(2.5) and "scalar" in rows["Default--Add-op1"]["note"]
    assert empty.shape == (0,) and empty.dtype == np.float32


# -- msaccucmp -------------------------------------------------------------------------
def test_msaccucmp_ingest_auto_detects_and_is_bit_exact(tmp_path, payloads):
    out = tmp_path / "output"
    expected = make_msaccucmp_dump(out, payloads)
    archive = tmp_path / "a.dumpdb"
    report = dumpdb.ingest(out, archive=archive, run="m")
    assert report.layout == "msaccucmp-npy" and report.ok, report.errors
    rows = _check_rows(archive, "m", expected)
    for name, row in rows.items():
        _, shape, payload = npy_payload(out / name)
        assert tuple(row["shape"]) == shape and row["dtype_declared"] is None and row["format"] is None


def test_msaccucmp_bad_files_are_errors_the_rest_ingests(tmp_path, payloads):
    out = tmp_path / "output"
    expected = make_msaccucmp_dump(out, payloads)
    lying = "Conv2D.Default_Conv2D-op1.2.7.161243956333900.output.0.2x3.npy"
    shutil.copyfile(payloads["f32_1d"][0], out / lying)  # header says (120,)
    truncated = "Conv2D.Default_Conv2D-op1.2.7.161243956333901.output.1.120.npy"
    (out / truncated).write_bytes(payloads["f32_1d"][0].read_bytes()[:-8])
    unparseable = "Conv2D.Default_Conv2D-op1.output.2.120.npy"
    shutil.copyfile(payloads["f32_1d"][0], out / unparseable)
    archive = tmp_path / "a.dumpdb"
    report = dumpdb.ingest(out, archive=archive, run="m")
    assert report.layout == "msaccucmp-npy"
    errors = _errors(archive, "m")
    assert set(errors) == {lying, truncated, unparseable}
    assert errors[lying].startswith(lying) and "2x3" in errors[lying] and "(120,)" in errors[lying]
    assert errors[truncated].startswith(truncated) and "truncated" in errors[truncated]
    assert "does not follow" in errors[unparseable]
    _check_rows(archive, "m", expected)


# -- TensorDump ------------------------------------------------------------------------
def test_tensordump_real_case(tmp_path):
    archive = tmp_path / "a.dumpdb"
    report = dumpdb.ingest(TENSORDUMP_REAL, archive=archive, run="j")
    assert report.layout == "mindspore-tensordump" and report.ok, report.errors
    rows = _rows(archive, "j")
    assert sorted(rows) == sorted(p.name for p in TENSORDUMP_REAL.glob("*.npy"))
    got = {(r["op_name"], r["call_index"], r["dtype_declared"], r["dtype"], r["io"]) for r in rows.values()}
    assert got == {("x", 0, "float32", "float32", "output"), ("x_relu", 1, "float32", "float32", "output"),
                   ("x_fp16", 2, "float16", "float16", "output"), ("x_int", 3, "int32", "int32", "output"),
                   ("x", 4, "float32", "float32", "output")}
    a = dumpdb.open(archive)
    for name, row in rows.items():
        assert row["slot"] is None and row["iteration"] is None and row["timestamp"] is None
        descr, shape, payload = npy_payload(TENSORDUMP_REAL / name)
        array = a.tensor(row["tensor_id"])
        assert array.shape == shape and array.dtype == np.dtype(descr)
        assert_bit_exact(array, payload)
    x0 = a.tensor(rows["x_float32_0.npy"]["tensor_id"])
    assert np.array_equal(x0, np.arange(6, dtype=np.float32).reshape(2, 3))  # ms_tensordump_pynative.py
    assert np.array_equal(a.tensor(rows["x_float32_4.npy"]["tensor_id"]), x0 * 2)
    assert np.array_equal(a.tensor(rows["x_relu_float32_1.npy"]["tensor_id"]), np.maximum(x0 - 2, 0))


def test_tensordump_synthetic_and_bad_files(tmp_path, payloads):
    td = tmp_path / "td"
    expected = make_tensordump_dump(td, payloads)
    (td / "broken_float32_5.npy").write_bytes((td / "conv1_out_float32_0.npy").read_bytes()[:-16])
    (td / "notes.npy").write_bytes((td / "step_int32_2.npy").read_bytes())
    archive = tmp_path / "a.dumpdb"
    report = dumpdb.ingest(td, archive=archive, run="td")
    assert report.layout == "mindspore-tensordump"
    errors = _errors(archive, "td")
    assert set(errors) == {"broken_float32_5.npy", "notes.npy"}
    broken = errors["broken_float32_5.npy"]
    assert broken.startswith("broken_float32_5.npy") and "truncated" in broken
    assert "does not follow" in errors["notes.npy"]
    rows = _check_rows(archive, "td", expected)
    bf = rows["fc1_bf16_bfloat16_4.npy"]
    assert bf["dtype"] == "float32" and "bfloat16" in bf["note"]


def test_flat_layouts_found_one_level_down(tmp_path, payloads):
    make_tensordump_dump(tmp_path / "job" / "dumps", payloads)
    assert detect(tmp_path / "job").name == "mindspore-tensordump"
    scan = MindSporeTensorDump().scan(tmp_path / "job")
    assert not scan.errors and [e.call_index for e in scan.entries] == [0, 1, 2, 3, 4]
    assert all(e.source_file.startswith("dumps/") for e in scan.entries)
    make_msaccucmp_dump(tmp_path / "conv" / "output", payloads)
    assert detect(tmp_path / "conv").name == "msaccucmp-npy"
    assert MsaccucmpNpy().scan(tmp_path / "conv").entries[0].source_file.startswith("output/")


# -- statistic only ----------------------------------------------------------------------
def test_statistic_only_ingest(tmp_path, payloads):
    dump = tmp_path / "stat"
    expected = make_statistic_dump(dump, payloads)
    archive = tmp_path / "a.dumpdb"
    report = dumpdb.ingest(dump, archive=archive, run="st")
    assert report.layout == "statistic-only" and report.ok, report.errors
    assert report.statistics_only == len(expected) == 2
    a = dumpdb.open(archive)
    rows = a.sql("SELECT * FROM tensors WHERE run = 'st' ORDER BY iteration").to_pylist()
    assert len(rows) == 2
    for row, exp in zip(rows, expected):
        assert row["source_file"] == f"rank_0/LeNet5/0/{exp['iteration']}/statistic.csv"
        assert row["content_hash"] is None and row["stats_source"] == "statistic.csv"
        assert (row["op_type"], row["op_name"], row["io"], row["slot"], row["timestamp"]) == \
            (exp["op_type"], exp["op_name"], exp["io"], exp["slot"], exp["timestamp"])
        assert row["dtype"] == exp["dtype"] and row["shape"] == list(exp["shape"])
        assert (row["max"], row["min"], row["mean"], row["count"], row["zero_count"]) == \
            (exp["max"], exp["min"], exp["mean"], exp["count"], exp["zero_count"])
        assert row["checksum"] == exp["md5"] and row["checksum_algo"] == "md5"
        assert row["scope_name"] == "Default/network-WithLossCell/_backbone-LeNet5/conv1-Conv2d/Conv2D-op0"
        with pytest.raises(dumpdb.DumpdbError, match="only statistics were dumped"):
            a.tensor(row["tensor_id"])
    assert json.loads(a.show("st")["dump_config"])["common_dump_settings"]["saved_data"] == "statistic"


def test_statistic_only_not_detected_when_a_tensor_file_exists(tmp_path, payloads):
    dump = tmp_path / "stat"
    make_statistic_dump(dump, payloads)
    assert StatisticOnly().detect(dump) and detect(dump).name == "statistic-only"
    # saved_data "full": statistic.csv and tensor files -> the plain mindspore-sync layout
    shutil.copyfile(payloads["f32_4d"][0], dump / "rank_0/LeNet5/0/0" / payloads["f32_4d"][0].name)
    assert not StatisticOnly().detect(dump) and detect(dump).name == "mindspore-sync"
    # a tree with neither statistic.csv nor tensors is not statistic-only
    empty = tmp_path / "empty"
    (empty / "rank_0/LeNet5/0/0").mkdir(parents=True)
    assert not StatisticOnly().detect(empty)


# -- detection -------------------------------------------------------------------------------
def test_layout_order_statistic_only_before_mindspore_sync():
    names = [lay.name for lay in LAYOUTS]
    assert names.index("statistic-only") < names.index("mindspore-sync")
    for name in MY_LAYOUTS:
        assert get_layout(name).document and get_layout(name).description


def _other_test_data_cases() -> list[Path]:
    cases = []
    for family in sorted(p for p in DATA.iterdir() if p.is_dir() and p.name not in ("tensordump", "archives")):
        cases.extend(sorted(p for p in family.iterdir() if p.is_dir()))
    return cases


def test_detection_is_exclusive(fixtures):
    others = {"c1": ms_case("c1_inputs_kernels_iter"), "tensordump_real": TENSORDUMP_REAL, **fixtures}
    for name in MY_LAYOUTS:
        layout = get_layout(name)
        for case, root in others.items():
            own = OWN.get(case, "mindspore-tensordump" if case == "tensordump_real" else None)
            assert layout.detect(root) == (own == name), (name, case)
    for case, root in fixtures.items():
        assert detect(root).name == OWN[case], case
    assert detect(TENSORDUMP_REAL).name == "mindspore-tensordump"


@pytest.mark.parametrize("case", _other_test_data_cases(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_not_detected_on_other_test_data(case):
    for name in MY_LAYOUTS:
        assert not get_layout(name).detect(case), (name, case)


def test_source_never_modified(tmp_path, payloads):
    dump = tmp_path / "dump"
    make_r12_dump(dump, payloads)
    for p in dump.rglob("*"):
        if p.is_file():
            p.chmod(0o400)
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in dump.rglob("*") if p.is_file()}
    report = dumpdb.ingest(dump, archive=tmp_path / "a.dumpdb", run="ro")
    assert report.ok, report.errors
    assert before == {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in dump.rglob("*") if p.is_file()}
    assert os.access(dump, os.R_OK)
