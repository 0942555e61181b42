"""Build CANN / Ascend operator dumps in a temporary directory, to the letter of
seeds 000, 001, 003, 004 and reference formats.md section 3.

Payloads are real tensors from tests/data/mindspore (LeNet5 Conv2D input/weight/
output, a bfloat16 Cast output, a float16 Assign output, a Bool and an Int64
scalar). Containers and overflow records are written by ``cann_wire`` byte by byte from
formats.md 3.2-3.4 (uint64 LE header length, ``DumpData`` header, inputs then outputs),
sharing nothing with dumpdb's reader; the payloads are read here without dumpdb. Each builder
returns the tensors it wrote as :class:`Expect` records, so tests compare the
archive with what is on disk.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import ml_dtypes
import numpy as np
from cann_wire import DATA_TYPE, DATA_TYPE_NAME, Spec, container, overflow_record
from conftest import npy_payload

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)

DATA = Path(__file__).parent / "data" / "mindspore"
_A = DATA / "a_tensor_all_eval" / "rank_0" / "LeNet5" / "1" / "3"
_D = DATA / "d2_compare_fp16_bf16_iter0" / "rank_0" / "LeNet5" / "0" / "0"
_CONV = "Conv2D.Default_network-WithLossCell__backbone-LeNet5_conv1-Conv2d_Conv2D-op1.0.0."

CONV_NAME = "Default_network-WithLossCell__backbone-LeNet5_conv1-Conv2d_Conv2D-op1"
CAST_NAME = "Default_network-WithLossCell__backbone-LeNet5_Cast-op0"
ASSIGN_NAME = "Default_Assign-op1"
MATMUL_NAME = "Default_network-WithLossCell__backbone-LeNet5_fc3-Dense_MatMul-op1"
LONG_NAME = ("Default_network-WithLossCell__backbone-LeNet5_fc3-" + "LongNamedWrapperCell_inner_layer-" * 8
             + "Dense_BiasAdd-op1")


@lru_cache(maxsize=1)
def payloads() -> dict[str, np.ndarray]:
    """Real tensors from tests/data, by role."""

    def one(directory: Path, pattern: str) -> np.ndarray:
        matches = sorted(directory.glob(pattern))
        assert matches, pattern
        descr, shape, payload = npy_payload(matches[0])
        dtype = BFLOAT16 if descr == "<E2" else np.dtype(descr)  # MindSpore's bfloat16 descr
        return np.frombuffer(payload, dtype=dtype).reshape(shape).copy()

    out = {
        "conv_x": one(_A, _CONV + "*.input.0.DefaultFormat.Float32.npy"),      # (4, 1, 32, 32) float32
        "conv_w": one(_A, _CONV + "*.input.1.DefaultFormat.Float32.npy"),      # (6, 1, 5, 5)
        "conv_y": one(_A, _CONV + "*.output.0.DefaultFormat.Float32.npy"),     # (4, 6, 28, 28)
        "bf16": one(_D, "Cast.Default_network-WithLossCell__backbone-LeNet5_Cast-op0.*BFloat16.npy"),  # (4, 120)
        "fp16": one(_D, "Assign.Default_Assign-op1.*Float16.npy"),            # (84,) real float16
        "bool": one(_A, "MatMul.*fc3-Dense_MatMul-op1.*input.3.DefaultFormat.Bool.npy"),  # () bool
        "int64": one(_A, "BiasAdd.*fc3-Dense_BiasAdd-op1.*input.2.DefaultFormat.Int64.npy"),  # () int64
    }
    assert out["bf16"].dtype == BFLOAT16 and out["fp16"].dtype == np.float16
    return out


def nc1hwc0(x: np.ndarray, c0: int = 16) -> np.ndarray:
    """NCHW -> NC1HWC0 as the device lays it out (zero padding to a multiple of C0)."""
    n, c, h, w = x.shape
    c1 = -(-c // c0)
    padded = np.zeros((n, c1 * c0, h, w), dtype=x.dtype)
    padded[:, :c] = x
    return np.ascontiguousarray(padded.reshape(n, c1, c0, h, w).transpose(0, 1, 3, 4, 2))


def fractal_nz(x: np.ndarray, h0: int = 16, w0: int = 16) -> np.ndarray:
    """(H, W) -> FRACTAL_NZ (W1, H1, H0, W0) as the device lays it out (zero padding)."""
    h, w = x.shape
    h1, w1 = -(-h // h0), -(-w // w0)
    padded = np.zeros((h1 * h0, w1 * w0), dtype=x.dtype)
    padded[:h, :w] = x
    return np.ascontiguousarray(padded.reshape(h1, h0, w1, w0).transpose(2, 0, 1, 3))


@dataclass
class Expect:
    """One tensor a fixture wrote, as the catalog must show it."""

    source_file: str
    io: str
    slot: int
    op_type: str
    op_name: str
    array: np.ndarray  # exactly the bytes, dtype and (dumped) shape on disk
    format: str | None
    fields: dict = field(default_factory=dict)  # device_id, step, model_name, model_id, iteration, rank...
    original_shape: tuple | None = None
    dtype_declared: str | None = None


@dataclass
class Fixture:
    root: Path
    tensors: list[Expect] = field(default_factory=list)
    overflows: list[dict] = field(default_factory=list)  # source_file, slot, content (dict)
    stats_only: list[dict] = field(default_factory=list)  # source_file, op_name, io, slot, stats
    bad: list[str] = field(default_factory=list)  # source_files that must be in ingest_errors


def _write(path: Path, data: bytes | str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        path.write_text(data, encoding="utf-8")
    else:
        path.write_bytes(data)


def _rel(fx: Fixture, path: Path) -> str:
    return os.path.relpath(path, fx.root)


def _container(fx: Fixture, path: Path, op_type: str, op_name: str, inputs: list, outputs: list,
               fields: dict, source_name: str | None = None) -> None:
    """Write one container and record its slots; ``inputs``/``outputs`` are Spec."""
    _write(path, container(inputs, outputs, dump_time=1718260502123456, op_name=op_name))
    src = _rel(fx, path)
    for io, specs in (("input", inputs), ("output", outputs)):
        for slot, spec in enumerate(specs):
            fx.tensors.append(Expect(
                src, io, slot, op_type, op_name, spec.array, spec.format, dict(fields),
                tuple(spec.original_shape) if spec.original_shape is not None else None,
                DATA_TYPE_NAME[DATA_TYPE[spec.array.dtype]]))


def _conv_specs() -> tuple[list, list]:
    p = payloads()
    inputs = [Spec(p["conv_x"], "NCHW"), Spec(p["conv_w"], "NCHW")]
    outputs = [Spec(nc1hwc0(p["conv_y"]), "NC1HWC0", original_shape=p["conv_y"].shape)]
    return inputs, outputs


def _tensor_dir_containers(fx: Fixture, d: Path, fields: dict, with_stream: bool = True,
                           ts: int = 1795336641754916) -> None:
    """The containers every bin fixture directory holds: Conv2D (2 inputs, NC1HWC0 output),
    Cast (bfloat16 output) and Assign (float16 input/output, bool and int64 scalar inputs)."""
    p = payloads()
    task_stream = "2.7" if with_stream else "2"
    conv_in, conv_out = _conv_specs()
    _container(fx, d / f"Conv2D.{CONV_NAME}.{task_stream}.{ts}", "Conv2D", CONV_NAME, conv_in, conv_out, fields)
    _container(fx, d / f"Cast.{CAST_NAME}.{'3.7' if with_stream else '3'}.{ts + 100}", "Cast", CAST_NAME,
               [Spec(p["bf16"].astype(np.float32), "ND")], [Spec(p["bf16"], "ND")],
               fields)
    _container(fx, d / f"Assign.{ASSIGN_NAME}.{'4.7' if with_stream else '4'}.{ts + 200}", "Assign", ASSIGN_NAME,
               [Spec(p["fp16"], "ND"), Spec(p["bool"], "ND"),
                Spec(p["int64"], "ND")],
               [Spec(p["fp16"], "ND")], fields)


OVERFLOW = {
    "dha": {"model_id": 1, "stream_id": 7, "task_id": 2, "task_type": 0, "pc_start": 0x12C0000, "para_base": 0x8000,
            "status": 0},
    "l2": {"model_id": 1, "stream_id": 7, "task_id": 2, "task_type": 0, "pc_start": 0, "para_base": 0, "status": 0},
    "core": {"model_id": 1, "stream_id": 7, "task_id": 2, "task_type": 0, "pc_start": 0x12C4000,
             "para_base": 0x12D0000, "kernel_code": 0x12C4100, "block_idx": 3, "status": 32},
}


def overflow_json() -> dict:
    """The record of OVERFLOW as msprobe writes ``Opdebug...output.0.json`` (formats.md 3.4)."""
    def info(d):
        return {"model_id": d["model_id"], "stream_id": d["stream_id"], "task_id": d["task_id"],
                "task_type": d["task_type"], "pc_start": hex(d["pc_start"]), "para_base": hex(d["para_base"])}
    return {
        "DHA Atomic Add": {**info(OVERFLOW["dha"]), "status": OVERFLOW["dha"]["status"]},
        "L2 Atomic Add": {**info(OVERFLOW["l2"]), "status": OVERFLOW["l2"]["status"]},
        "AI Core": {**info(OVERFLOW["core"]), "kernel_code": hex(OVERFLOW["core"]["kernel_code"]),
                    "block_idx": OVERFLOW["core"]["block_idx"], "status": OVERFLOW["core"]["status"]},
    }


def _opdebug_bin(fx: Fixture, d: Path, name: str, fields: dict) -> None:
    record = overflow_record(OVERFLOW["dha"], OVERFLOW["l2"], OVERFLOW["core"])
    spec = Spec(np.frombuffer(record, dtype=np.uint8), "ND")
    path = d / name
    _write(path, container([], [spec], op_name="Node_OpDebug"))
    fx.overflows.append({"source_file": _rel(fx, path), "slot": 0, "content": overflow_json(), **fields})


# -- seed 000 ------------------------------------------------------------------------------
def build_r12_async(root: Path) -> Fixture:
    """{path}/{device_id}/{net_name}_graph_{graph_id}/{graph_id}/{iteration}/
    {op_type}.{op_name}.{task_id}.{timestamp}, graphs/execution_order, .metadata/data_dump.json."""
    fx = Fixture(root)
    _write(root / ".metadata" / "data_dump.json", json.dumps({
        "common_dump_settings": {"dump_mode": 0, "path": "/absolute_path", "net_name": "LeNet5", "iteration": 0,
                                 "input_output": 0, "kernels": [], "support_device": [0, 1, 2, 3, 4, 5, 6, 7]},
        "async_dump_settings": {"enable": True, "op_debug_mode": 0}}))
    for it in (0, 1):
        d = root / "0" / "LeNet5_graph_1" / "1" / str(it)
        _tensor_dir_containers(fx, d, {"device_id": 0, "net_name": "LeNet5", "graph_id": 1, "iteration": it},
                               with_stream=False, ts=1608983934774491 + it)
    _write(root / "0" / "execution_order" / "ms_execution_order_graph_1.csv",
           "Default/network-WithLossCell/_backbone-LeNet5/conv1-Conv2d/Conv2D-op1\n")
    return fx


# -- seed 001, file_format bin -----------------------------------------------------------------
TIME = "20240613143502"


def build_ascend_pb(root: Path, variant: str = "plain") -> Fixture:
    """``plain``: {path}/{time}/{device_id}/{model_name}/{model_id}/{iteration_id}/;
    ``step``: {path}/{step_id}/{time}/...; ``o0``: {path}/{step_id}/{time}/{device_id}/[{iteration_id}/]."""
    fx = Fixture(root)
    if variant == "plain":
        for it in (0, 1):
            fields = {"device_id": 0, "model_name": "kernel_graph_1", "model_id": 1, "iteration": it}
            d = root / TIME / "0" / "kernel_graph_1" / "1" / str(it)
            _tensor_dir_containers(fx, d, fields, ts=1795336641754916 + 1000 * it)
        d = root / TIME / "0" / "kernel_graph_1" / "1" / "1"
        _opdebug_bin(fx, d, "Opdebug.Node_OpDebug.2.7.1795336641759999",
                     {"device_id": 0, "iteration": 1})
        # over-long name: 32 random digits + mapping.csv (seed 001, formats.md 3.1)
        random_name = "48172635091827364510293847561029"
        original = f"BiasAdd.{LONG_NAME}.5.7.1795336641755555"
        p = payloads()
        path = d / random_name
        _write(path, container([Spec(p["conv_y"][0, 0], "ND")],
                                         [Spec(p["conv_y"][0, 0], "ND")]))
        _write(d / "mapping.csv", f"{random_name},{original}\n")
        for io in ("input", "output"):
            fx.tensors.append(Expect(_rel(fx, path), io, 0, "BiasAdd", LONG_NAME, p["conv_y"][0, 0], "ND",
                                     {"device_id": 0, "model_name": "kernel_graph_1", "model_id": 1,
                                      "iteration": 1}, None, "DT_FLOAT"))
        _write(root / "acl_dump_0.json", json.dumps({"dump": {"dump_path": str(root), "dump_mode": "all"}}))
    elif variant == "step":
        for step in (0, 3):
            fields = {"step": step, "device_id": 1, "model_name": "kernel_graph_0", "model_id": 0, "iteration": step}
            d = root / str(step) / TIME / "1" / "kernel_graph_0" / "0" / str(step)
            _tensor_dir_containers(fx, d, fields, ts=1795336641754916 + step)
    elif variant == "o0":
        step_dir = root / "2" / TIME / "0"
        _tensor_dir_containers(fx, step_dir / "5", {"step": 2, "device_id": 0, "iteration": 5})
        # static-shape ops sit directly in {device_id}
        p = payloads()
        _container(fx, step_dir / f"MatMul.{MATMUL_NAME}.9.3.1795336641760000", "MatMul", MATMUL_NAME,
                   [Spec(fractal_nz(p["bf16"]), "FRACTAL_NZ", original_shape=p["bf16"].shape)],
                   [Spec(p["fp16"], "ND")], {"step": 2, "device_id": 0})
    else:
        raise ValueError(variant)
    return fx


def add_bad_containers(fx: Fixture, d: Path) -> None:
    """Truncated data segment, header length beyond the file, 0-byte file, garbage header."""
    p = payloads()
    good = container([p["conv_x"]], [p["conv_y"]])
    cases = {
        "Conv2D.Truncated-op1.11.7.1795336641770001": good[:-10],
        "Conv2D.HeaderBeyond-op1.12.7.1795336641770002": (10 ** 6).to_bytes(8, "little") + good[8:200],
        "Conv2D.Empty-op1.13.7.1795336641770003": b"",
        "Conv2D.Garbage-op1.14.7.1795336641770004": (6).to_bytes(8, "little") + b"\xff" * 6 + b"x" * 32,
    }
    for name, raw in cases.items():
        _write(d / name, raw)
        fx.bad.append(_rel(fx, d / name))


# -- seed 001, file_format npy ----------------------------------------------------------------
_STAT_HEADER = ("Op Type,Op Name,Task ID,Stream ID,Timestamp,IO,Slot,Data Size,Data Type,Shape,Max Value,"
                "Min Value,Avg Value,Count,Negative Zero Count,Positive Zero Count,NaN Count,Negative Inf Count,"
                "Positive Inf Count,Zero Count,MD5")


def _npy_bytes(array: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    if array.dtype == BFLOAT16:  # MindSpore writes '<E2' (corpus README); np.save cannot
        header = f"{{'descr': '<E2', 'fortran_order': False, 'shape': {array.shape!r}, }}"
        header = header.ljust(118) + "\n"
        return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + array.tobytes()
    np.save(buf, array)
    return buf.getvalue()


def build_ascend_npy(root: Path) -> Fixture:
    """{path}/{time}/{device_id}/{model_name}/{model_id}/{iteration_id}/ with
    {op_type}.{op_name}.{task_id}.{stream_id}.{timestamp}.{input_output_index}.{slot}.{format}.npy,
    statistic.csv (one row without a tensor file), mapping.csv and Opdebug *.output.0.json."""
    fx = Fixture(root)
    p = payloads()
    fields = {"device_id": 0, "model_name": "kernel_graph_1", "model_id": 1, "iteration": 0}
    d = root / TIME / "0" / "kernel_graph_1" / "1" / "0"
    ts = 1795336641754916
    files = [
        ("Conv2D", CONV_NAME, 2, "input", 0, "NCHW", p["conv_x"]),
        ("Conv2D", CONV_NAME, 2, "input", 1, "NCHW", p["conv_w"]),
        ("Conv2D", CONV_NAME, 2, "output", 0, "NCHW", p["conv_y"]),
        ("Cast", CAST_NAME, 3, "output", 0, "DefaultFormat", p["bf16"]),
        ("Assign", ASSIGN_NAME, 4, "output", 0, "DefaultFormat", p["fp16"]),
    ]
    rows = []
    for op_type, op_name, task, io, slot, fmt, array in files:
        name = f"{op_type}.{op_name}.{task}.7.{ts + task}.{io}.{slot}.{fmt}.npy"
        _write(d / name, _npy_bytes(array))
        fx.tensors.append(Expect(_rel(fx, d / name), io, slot, op_type, op_name, array, fmt, dict(fields)))
        rows.append((op_type, op_name, task, 7, ts + task, io, slot, array))
    # over-long name -> random digits + mapping.csv (the hashed file keeps .npy, as MindSpore writes it)
    long_file = f"BiasAdd.{LONG_NAME}.5.7.{ts + 5}.output.0.DefaultFormat.npy"
    _write(d / "1711179297.npy", _npy_bytes(p["conv_y"][1]))
    _write(d / "mapping.csv", f"1711179297.npy,{long_file}\n")
    fx.tensors.append(Expect(_rel(fx, d / "1711179297.npy"), "output", 0, "BiasAdd", LONG_NAME, p["conv_y"][1],
                             "DefaultFormat", dict(fields)))
    with open(d / "statistic.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(_STAT_HEADER.split(","))
        for op_type, op_name, task, stream, t, io, slot, array in rows:
            a = array.astype(np.float64)
            w.writerow([op_type, op_name, task, stream, t, io, slot, array.nbytes, str(array.dtype),
                        "(" + ",".join(map(str, array.shape)) + ")", a.max(), a.min(), a.mean(), a.size,
                        int((a < 0).sum()), int((a > 0).sum()), 0, 0, 0, int((a == 0).sum()), ""])
        # a row whose tensor was not saved (saved_data "statistic" for this op): statistics only
        w.writerow(["ReLU", "Default_network-WithLossCell__backbone-LeNet5_relu-ReLU_ReLU-op4", 6, 7, ts + 6,
                    "output", 0, 75264, "float32", "(4,6,28,28)", 3.5, 0.0, 0.25, 18816, 0, 9000, 0, 0, 0, 9816, ""])
    fx.stats_only.append({"source_file": _rel(fx, d / "statistic.csv"), "op_type": "ReLU",
                          "op_name": "Default_network-WithLossCell__backbone-LeNet5_relu-ReLU_ReLU-op4",
                          "io": "output", "slot": 0, "max": 3.5, "min": 0.0, "mean": 0.25, "count": 18816,
                          "zero_count": 9816, "dtype_declared": "float32", "dtype": "float32",
                          "shape": [4, 6, 28, 28], **fields})
    jname = f"Opdebug.Node_OpDebug.2.7.{ts + 9}.output.0.json"
    _write(d / jname, json.dumps(overflow_json(), indent=4))
    fx.overflows.append({"source_file": _rel(fx, d / jname), "slot": 0, "content": overflow_json(),
                         "device_id": 0, "iteration": 0})
    return fx


# -- seed 003 --------------------------------------------------------------------------------
def build_tf_adapter(root: Path) -> Fixture:
    """{dump_path}/{time}/{deviceid}/{model_name}/{model_id}/{data_index}/ (seed 003's example
    path /home/HwHiAiUser/output/20200808163566/0/ge_default_20200808163719_121/11/0)."""
    fx = Fixture(root)
    for data_index in (0, 5):
        fields = {"device_id": 0, "model_name": "ge_default_20200808163719_121", "model_id": 11,
                  "iteration": data_index}
        d = root / "20200808163566" / "0" / "ge_default_20200808163719_121" / "11" / str(data_index)
        _tensor_dir_containers(fx, d, fields, ts=1596876342000000 + data_index)
    return fx


# -- seed 004 --------------------------------------------------------------------------------
def build_torchair(root: Path, stats: bool = False) -> Fixture:
    """{dump_path}/worldsize{N}_global_rank{R}/{time}/{device_id}/{model_name}/{model_id}/{data_index}/
    (seed 004's example /home/dump/worldsize1_global_rank0/2024112145738/0/ge_default_20200808163719_121/1/0;
    a 2-rank run here). ``stats``: dump_data = "stats", csv statistics instead of tensors."""
    fx = Fixture(root)
    p = payloads()
    for rank in (0, 1):
        fields = {"rank": rank, "device_id": rank, "model_name": "ge_default_20200808163719_121", "model_id": 1,
                  "iteration": 0}
        d = (root / f"worldsize2_global_rank{rank}" / "2024112145738" / str(rank) / "ge_default_20200808163719_121"
             / "1" / "0")
        if not stats:
            _tensor_dir_containers(fx, d, fields, ts=1732168658000000 + rank)
            continue
        # One csv per op, named like the container + ".csv" (the CANN stats file);
        # header spellings of mstt AclDumpDataProcessor.cpp (Input/Output, Index, L2 Norm Value).
        for op_type, op_name, task, tensors in (
            ("Conv2D", CONV_NAME, 2,
             [("input", 0, p["conv_x"]), ("input", 1, p["conv_w"]), ("output", 0, p["conv_y"])]),
            ("Cast", CAST_NAME, 3, [("output", 0, p["bf16"])]),
        ):
            name = f"{op_type}.{op_name}.{task}.7.{1732168658000000 + task}.csv"
            with open(_mk(d) / name, "w", newline="") as f:
                w = csv.writer(f)
                w.writerow(["Input/Output", "Index", "Data Size", "Data Type", "Format", "Shape", "Max Value",
                            "Min Value", "Avg Value", "L2 Norm Value", "Nan Count", "Negative Inf Count",
                            "Positive Inf Count"])
                for io, slot, array in tensors:
                    a = array.astype(np.float64)
                    dt = DATA_TYPE_NAME[DATA_TYPE[array.dtype]]  # DT_FLOAT, DT_BF16
                    w.writerow([io.capitalize(), slot, array.nbytes, dt, "ND",
                                "[" + ",".join(map(str, array.shape)) + "]", a.max(), a.min(), a.mean(),
                                float(np.sqrt((a * a).sum())), 0, 0, 0])
                    fx.stats_only.append({"source_file": _rel(fx, d / name), "op_type": op_type, "op_name": op_name,
                                          "io": io, "slot": slot, "max": a.max(), "min": a.min(),
                                          "mean": a.mean(), "l2norm": float(np.sqrt((a * a).sum())),
                                          "shape": list(array.shape), "dtype_declared": dt, **fields})
    return fx


def _mk(d: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    return d
