"""CANN / Ascend operator dumps: the protobuf container parser (dumpdb.layouts.cann_pb)
and the directory layouts of seeds 000, 001, 003, 004 (dumpdb.layouts.ascend).

Fixtures are built in tmp by tests/fixtures_cann.py from real tensors of
tests/data/mindspore; every tensor must come back bit for bit with the names,
dtype, shape and format the dump states."""

from __future__ import annotations

import json
import struct
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import fixtures_cann as fc
import numpy as np
import pytest
from cann_wire import Spec, container, overflow_record
from conftest import DATA, ms_case

import dumpdb
from dumpdb.dtypes import BFLOAT16, dtype_name
from dumpdb.errors import DumpFileError
from dumpdb.layouts import LAYOUTS, cann_pb, detect, get_layout

MINE = ("mindspore-r1.2-async-pb", "ascend-async-pb", "ascend-async-npy", "cann-tf-adapter", "torchair-ge")
CASES = {
    "r12": (fc.build_r12_async, "mindspore-r1.2-async-pb"),
    "pb-plain": (lambda r: fc.build_ascend_pb(r, "plain"), "ascend-async-pb"),
    "pb-step": (lambda r: fc.build_ascend_pb(r, "step"), "ascend-async-pb"),
    "pb-o0": (lambda r: fc.build_ascend_pb(r, "o0"), "ascend-async-pb"),
    "npy": (fc.build_ascend_npy, "ascend-async-npy"),
    "tf-adapter": (fc.build_tf_adapter, "cann-tf-adapter"),
    "torchair": (fc.build_torchair, "torchair-ge"),
    "torchair-stats": (lambda r: fc.build_torchair(r, stats=True), "torchair-ge"),
}
OTHER_DUMPS = [DATA / "msprobe" / "statistics_mix_md5" / "dump", DATA / "msprobe" / "tensor_mix" / "dump",
               DATA / "tensordump"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Every fixture dump, ingested (auto-detected) into one archive, one run per case."""
    base = tmp_path_factory.mktemp("ascend")
    archive = base / "cann.dumpdb"
    fixtures, reports = {}, {}
    for case, (build, _) in CASES.items():
        fixtures[case] = build(base / "dumps" / case)
        reports[case] = dumpdb.ingest(fixtures[case].root, archive=archive, run=case)
    return archive, fixtures, reports


def _rows(archive, run, where="", params=()):
    return dumpdb.open(archive).sql(
        f"SELECT * FROM tensors WHERE run = ? {where} ORDER BY tensor_id", [run, *params]).to_pylist()


# -- detection -------------------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES)
def test_detect_picks_the_layout_and_only_it(world, case):
    _, fixtures, _ = world
    root = fixtures[case].root
    assert detect(root).name == CASES[case][1]
    assert [lay.name for lay in LAYOUTS if lay.name in MINE and lay.detect(root)] == [CASES[case][1]]


def test_other_dumps_are_not_claimed():
    others = [ms_case("c1_inputs_kernels_iter"), *OTHER_DUMPS]
    for root in others:
        assert root.is_dir(), root  # shipped in tests/data: the check is never dropped
        assert not [lay.name for lay in LAYOUTS if lay.name in MINE and lay.detect(root)], root


def test_torchair_rank_dir_itself_and_parent_of_dump_path(tmp_path):
    root = fc.build_torchair(tmp_path / "outer" / "dump").root
    rank_dir = root / "worldsize2_global_rank1"
    assert detect(rank_dir).name == "torchair-ge"
    scan = get_layout("torchair-ge").scan(rank_dir)
    assert {e.rank for e in scan.entries} == {1}
    assert detect(root.parent).name == "torchair-ge"  # {dump_path} one level down


# -- ingest: every tensor bit-exact, names and path fields as the dump states ----------------------
@pytest.mark.parametrize("case", CASES)
def test_ingest_report(world, case):
    _, fixtures, reports = world
    fx, report = fixtures[case], reports[case]
    assert report.layout == CASES[case][1]
    assert report.ok, report.errors
    assert report.tensors_in_dump == len(fx.tensors) + len(fx.stats_only)
    assert report.statistics_only == len(fx.stats_only)


@pytest.mark.parametrize("case", [c for c in CASES if c != "torchair-stats"])
def test_every_tensor_bit_exact_with_its_names(world, case):
    archive, fixtures, _ = world
    fx = fixtures[case]
    loaded = {row["tensor_key"]: (row, array) for row, array in dumpdb.open(archive).tensors(
        "SELECT * FROM tensors WHERE run = ? AND content_hash IS NOT NULL", [case])}
    assert len(loaded) == len(fx.tensors)
    for exp in fx.tensors:
        key = exp.source_file if exp.source_file.endswith(".npy") else f"{exp.source_file}#{exp.io}.{exp.slot}"
        row, got = loaded[key]
        assert row["source_file"] == exp.source_file
        assert (row["op_type"], row["op_name"], row["io"], row["slot"]) == (exp.op_type, exp.op_name, exp.io, exp.slot)
        assert row["format"] == exp.format
        assert row["dtype"] == dtype_name(exp.array.dtype)
        assert tuple(row["shape"]) == exp.array.shape
        if exp.dtype_declared:
            assert row["dtype_declared"] == exp.dtype_declared
        assert (tuple(row["original_shape"]) if row["original_shape"] is not None else None) == exp.original_shape
        for column in ("rank", "device_id", "step", "model_name", "model_id", "iteration", "net_name", "graph_id"):
            assert row[column] == exp.fields.get(column), (column, key)
        assert got.dtype == exp.array.dtype and got.shape == exp.array.shape
        assert got.tobytes() == np.ascontiguousarray(exp.array).tobytes(), key


def test_task_stream_timestamp_from_names(world):
    archive, _, _ = world
    row = _rows(archive, "pb-plain", "AND op_type = 'Conv2D' AND io = 'output' AND iteration = 0")[0]
    assert (row["task_id"], row["stream_id"], row["timestamp"]) == (2, 7, 1795336641754916)
    row = _rows(archive, "r12", "AND op_type = 'Conv2D' AND io = 'output' AND iteration = 1")[0]
    assert (row["task_id"], row["stream_id"], row["timestamp"]) == (2, None, 1608983934774492)
    assert row["scope_name"] == "Default/network-WithLossCell/_backbone-LeNet5/conv1-Conv2d/Conv2D-op1"
    order = dumpdb.open(archive).sql("SELECT * FROM execution_order WHERE run = 'r12'").to_pylist()
    assert [(r["graph_id"], r["position"], r["scope_name"]) for r in order] == [(1, 0, row["scope_name"])]


def test_real_dtypes_present(world):
    archive, _, _ = world
    dtypes = {r["dtype"] for r in _rows(archive, "pb-plain")}
    assert {"float32", "bfloat16", "float16", "bool", "int64"} <= dtypes
    assert {r["dtype_declared"] for r in _rows(archive, "pb-plain", "AND dtype = 'bfloat16'")} == {"DT_BF16"}


def test_device_formats_stored_as_dumped_and_convert_to_host(world):
    archive, _, _ = world
    a = dumpdb.open(archive)
    p = fc.payloads()
    row = _rows(archive, "pb-plain", "AND format = 'NC1HWC0' AND iteration = 0")[0]
    assert tuple(row["shape"]) == (4, 1, 28, 28, 16) and tuple(row["original_shape"]) == (4, 6, 28, 28)
    assert a.tensor(row["tensor_id"]).tobytes() == fc.nc1hwc0(p["conv_y"]).tobytes()  # as dumped
    assert np.array_equal(a.tensor(row["tensor_id"], host_format=True), p["conv_y"])
    row = _rows(archive, "pb-o0", "AND format = 'FRACTAL_NZ'")[0]
    assert row["iteration"] is None and row["step"] == 2  # static-shape op, directly in {device_id}
    host = a.tensor(row["tensor_id"], host_format=True)
    assert host.dtype == BFLOAT16 and host.tobytes() == p["bf16"].tobytes()


def test_mapping_csv_names_resolved(world):
    archive, _, _ = world
    for case in ("pb-plain", "npy"):
        rows = _rows(archive, case, "AND op_type = 'BiasAdd'")
        assert rows and all(r["op_name"] == fc.LONG_NAME for r in rows)
        assert all("mapping.csv" in (r["note"] or "") for r in rows)


# -- overflows and statistics ---------------------------------------------------------------------
@pytest.mark.parametrize("case", ["pb-plain", "npy"])
def test_overflow_rows(world, case):
    archive, fixtures, _ = world
    rows = dumpdb.open(archive).sql("SELECT * FROM overflows WHERE run = ?", [case]).to_pylist()
    expected = fixtures[case].overflows
    assert len(rows) == len(expected) == 1
    row, exp = rows[0], expected[0]
    assert row["source_file"] == exp["source_file"]
    assert (row["op_type"], row["op_name"], row["task_id"], row["stream_id"], row["slot"]) == (
        "Opdebug", "Node_OpDebug", 2, 7, 0)
    assert (row["device_id"], row["iteration"]) == (exp["device_id"], exp["iteration"])
    assert json.loads(row["content"]) == exp["content"]


@pytest.mark.parametrize("case", ["npy", "torchair-stats"])
def test_statistics_only_rows(world, case):
    archive, fixtures, _ = world
    rows = _rows(archive, case, "AND content_hash IS NULL")
    expected = fixtures[case].stats_only
    assert len(rows) == len(expected)
    by_key = {(r["source_file"], r["op_name"], r["io"], r["slot"]): r for r in rows}
    assert len({r["tensor_key"] for r in rows}) == len(rows)
    for exp in expected:
        row = by_key[(exp["source_file"], exp["op_name"], exp["io"], exp["slot"])]
        assert row["op_type"] == exp["op_type"] and row["stats_source"] == "statistic.csv"
        for stat in ("max", "min", "mean", "l2norm", "count", "zero_count"):
            if stat in exp:
                assert row[stat] == pytest.approx(exp[stat]), stat
        assert list(row["shape"]) == exp["shape"] and row["dtype_declared"] == exp["dtype_declared"]
        if "dtype" in exp:
            assert row["dtype"] == exp["dtype"]
        for column in ("rank", "device_id", "model_name", "model_id", "iteration"):
            assert row[column] == exp.get(column), column


def test_npy_statistic_csv_attached_to_tensors(world):
    archive, _, _ = world
    row = _rows(archive, "npy", "AND op_type = 'Conv2D' AND io = 'output'")[0]
    assert row["stats_source"] == "statistic.csv+computed"
    assert row["max"] == pytest.approx(float(fc.payloads()["conv_y"].max()))


def test_reingest_adds_nothing(world, tmp_path):
    archive, fixtures, _ = world
    report = dumpdb.ingest(fixtures["pb-plain"].root, archive=archive, run="pb-plain")
    assert report.tensors_added == 0 and report.tensors_skipped == len(fixtures["pb-plain"].tensors)


# -- bad containers ---------------------------------------------------------------------------------
def test_bad_containers_are_ingest_errors_rest_ingests(tmp_path):
    fx = fc.build_ascend_pb(tmp_path / "dump", "plain")
    d = tmp_path / "dump" / fc.TIME / "0" / "kernel_graph_1" / "1" / "0"
    fc.add_bad_containers(fx, d)
    p = fc.payloads()
    # a slot whose data type is not in the enum, and a slot whose size disagrees with its shape
    (d / "Add.UnknownType-op1.20.7.1795336641780001").write_bytes(container(
        [p["fp16"]], [Spec(p["fp16"], data_type=99)]))
    (d / "Add.SizeLies-op1.21.7.1795336641780002").write_bytes(container(
        [Spec(p["fp16"], shape=(85,))]))
    report = dumpdb.ingest(fx.root, archive=tmp_path / "a.dumpdb", run="bad")
    assert report.layout == "ascend-async-pb"
    errors = dict(report.errors)
    src = {name.split(".")[1]: f for f in fx.bad for name in [Path(f).name]}
    assert "truncated: data segment is" in errors[src["Truncated-op1"]]
    assert "header length 1000000 is beyond the file" in errors[src["HeaderBeyond-op1"]]
    assert "empty file (0 bytes)" in errors[src["Empty-op1"]]
    assert "not a readable toolkit.dumpdata.DumpData" in errors[src["Garbage-op1"]]
    rel = str(Path(fc.TIME, "0", "kernel_graph_1", "1", "0"))
    assert "output.0: unknown data_type 99" in errors[f"{rel}/Add.UnknownType-op1.20.7.1795336641780001"]
    assert "size field says 168 bytes but shape [85]" in errors[f"{rel}/Add.SizeLies-op1.21.7.1795336641780002"]
    for source_file, message in report.errors:
        assert message.startswith(source_file + ": "), message
    assert len(report.errors) == 6
    # the good tensors, and the good slot of the UnknownType file, are in
    assert report.tensors_added == len(fx.tensors) + 1
    rows = _rows(tmp_path / "a.dumpdb", "bad")
    assert len(rows) == len(fx.tensors) + 1
    a = dumpdb.open(tmp_path / "a.dumpdb")
    assert {r["run"] for r in a.sql("SELECT run FROM ingest_errors").to_pylist()} == {"bad"}


def test_mapping_csv_giving_a_file_a_foreign_json_name_is_one_error(tmp_path):
    # mapping.csv maps a hashed .npy (holding valid JSON) to a .json name that is no Opdebug
    # overflow record's: one error line naming the file, the rest ingests (was a TypeError
    # that stopped the ingest)
    fx = fc.build_ascend_npy(tmp_path / "dump")
    d = tmp_path / "dump" / fc.TIME / "0" / "kernel_graph_1" / "1" / "0"
    (d / "99.npy").write_text('{"op": 1}')
    with open(d / "mapping.csv", "a") as f:
        f.write("99.npy,Weird.op.json\n")
    report = dumpdb.ingest(fx.root, archive=tmp_path / "a.dumpdb", run="r")
    rel = str(Path(fc.TIME, "0", "kernel_graph_1", "1", "0", "99.npy"))
    assert [m for f, m in report.errors if f == rel] == [
        "mapping.csv names it 'Weird.op.json', which is not an Opdebug overflow record name "
        "(Opdebug.Node_OpDebug.*.output.N.json)"]
    stored = {r["source_file"] for r in _rows(tmp_path / "a.dumpdb", "r")}
    assert {t.source_file for t in fx.tensors} <= stored and rel not in stored


# -- the container parser ---------------------------------------------------------------------------
def test_container_starts_as_formats_md_says():
    raw = container([], [np.zeros(3, np.float32)], version="2.0", dump_time=1)
    (hlen,) = struct.unpack_from("<Q", raw)
    assert raw[8:13] == b"\x0a\x032.0" and raw[13] == 0x10 and raw[15] == 0x1A  # version, dump_time, output
    assert len(raw) == 8 + hlen + 12


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.int8, np.uint8, np.int16, np.uint16,
                                   np.int32, np.int64, np.uint32, np.uint64, np.bool_, np.complex64,
                                   np.complex128, BFLOAT16])
def test_roundtrip_every_mapped_dtype(tmp_path, dtype):
    array = (np.arange(24) % 7).astype(np.float64).astype(dtype).reshape(2, 3, 4)
    path = tmp_path / "Op.op.1.2.3"
    path.write_bytes(container([array], [array[:1]]))
    header = cann_pb.read_header(path)
    assert [t.shape for t in header.tensors] == [(2, 3, 4), (1, 3, 4)]
    cache = cann_pb.HeaderCache()
    for io, expected in (("input", array), ("output", array[:1])):
        got, note = cache.load(str(path), io, 0, "x")
        assert got.dtype == np.dtype(dtype) and got.tobytes() == expected.tobytes() and note is None


def test_unknown_fields_are_skipped():
    # OpOutput{data_type=1 (DT_FLOAT), format=2 (ND), shape{dim=[2]}, size=8}, by hand (formats.md 3.3)
    out = b"\x08\x01" + b"\x10\x02" + b"\x1a\x03\x0a\x01\x02" + b"\x30\x08"
    extra_out = out + b"\x48\x2a" + b"\x52\x02ab"  # fields 9 (varint), 10 (bytes)
    header = b"\x0a\x032.0" + b"\x1a" + bytes([len(extra_out)]) + extra_out + b"\x7a\x03xyz"  # DumpData field 15
    raw = struct.pack("<Q", len(header)) + header + np.array([1.5, 2.5], np.float32).tobytes()
    h = cann_pb.parse_header(raw, len(raw), "f")
    assert h.outputs[0].shape == (2,) and h.outputs[0].format == "ND" and h.outputs[0].dtype_name == "DT_FLOAT"
    array, _ = cann_pb.tensor_array(h.outputs[0], raw[-8:], "f")
    assert array.tolist() == [1.5, 2.5]


def test_container_errors_name_the_file():
    good = container([np.ones(4, np.float32)], [np.ones(2, np.float16)])
    for raw, text in (
        (b"", "empty file (0 bytes)"),
        (b"\x01\x02\x03", "only 3 bytes"),
        (struct.pack("<Q", 99) + b"\x00" * 10, "header length 99 is beyond the file (18 bytes, 10 after"),
        (good[:-1], "truncated: data segment is 19 bytes, header describes 20 (1 inputs 16 + 1 outputs 4"),
    ):
        with pytest.raises(DumpFileError) as info:
            cann_pb.parse_header(raw, len(raw), "dir/Op.x.1.2.3")
        assert str(info.value).startswith("dir/Op.x.1.2.3: ") and text in str(info.value)
    h = cann_pb.parse_header(good + b"\x00" * 5, len(good) + 5, "f")
    assert h.trailing == 5
    t = cann_pb.parse_header(container([Spec(np.ones(2, np.int8), data_type=13)]),
                             10**6, "f").inputs[0]
    with pytest.raises(DumpFileError, match="data type DT_STRING \\(13\\) has no numpy equivalent"):
        cann_pb.tensor_array(t, b"\x00\x00", "f")


def test_header_cache_many_threads(tmp_path):
    p = fc.payloads()
    arrays = [p["conv_x"], p["conv_w"], p["conv_y"], p["bf16"], p["fp16"]]
    path = tmp_path / "Multi.op.1.2.3"
    path.write_bytes(container(arrays[:3], arrays[3:]))
    cache = cann_pb.HeaderCache(capacity=1)
    jobs = [("input", i, a) for i, a in enumerate(arrays[:3])] + [("output", i, a) for i, a in enumerate(arrays[3:])]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda j: cache.load(str(path), j[0], j[1], "m")[0], jobs * 20))
    for (_, _, expected), got in zip(jobs * 20, results):
        assert got.dtype == expected.dtype and got.tobytes() == expected.tobytes()


def test_overflow_record_decodes_as_msprobe_writes_it():
    record = overflow_record(fc.OVERFLOW["dha"], fc.OVERFLOW["l2"], fc.OVERFLOW["core"])
    assert len(record) == cann_pb.OVERFLOW_RECORD_SIZE == 1048
    assert cann_pb.decode_overflow(record) == fc.overflow_json()


def test_every_field_of_an_overflow_record_at_its_documented_offset():
    """formats.md 3.4, every uint64 distinct so a field read from a neighbour's offset shows:
    DHA info at 0, L2 info at 128, AI Core info at 256 (model_id, stream_id, task_id, task_type,
    pc_start, para_base), DHA status at 512, L2 status at 768, AI Core kernel_code, block_idx,
    status at 1024. The record is built here with struct at those offsets."""
    raw = bytearray(1048)
    struct.pack_into("<6Q", raw, 0, 11, 12, 13, 14, 0x1500, 0x1600)
    struct.pack_into("<6Q", raw, 128, 21, 22, 23, 24, 0x2500, 0x2600)
    struct.pack_into("<6Q", raw, 256, 31, 32, 33, 34, 0x3500, 0x3600)
    struct.pack_into("<Q", raw, 512, 41)
    struct.pack_into("<Q", raw, 768, 51)
    struct.pack_into("<3Q", raw, 1024, 0x6100, 62, 63)
    # msprobe's json (AclDumpDataProcessor.cpp): ids as numbers, addresses as hex strings
    assert cann_pb.decode_overflow(bytes(raw)) == {
        "DHA Atomic Add": {"model_id": 11, "stream_id": 12, "task_id": 13, "task_type": 14,
                           "pc_start": "0x1500", "para_base": "0x1600", "status": 41},
        "L2 Atomic Add": {"model_id": 21, "stream_id": 22, "task_id": 23, "task_type": 24,
                          "pc_start": "0x2500", "para_base": "0x2600", "status": 51},
        "AI Core": {"model_id": 31, "stream_id": 32, "task_id": 33, "task_type": 34,
                    "pc_start": "0x3500", "para_base": "0x3600", "kernel_code": "0x6100", "block_idx": 62,
                    "status": 63},
    }


def test_container_file_names_follow_formats_md():
    """formats.md 3.1: {op_type}.{op_name}.{task_id}.{stream_id}.{timestamp}; seed 000's r1.2 form
    has no stream_id. Checked on the parser itself (the fixtures' world is built once per module)."""
    ge = get_layout("ascend-async-pb")
    assert ge._parse_bin_name(
        "Conv2D.Default_network-WithLossCell__backbone-AlexNet_conv3-Conv2d_Conv2D-op12.2.7.161243956333802") == {
        "op_type": "Conv2D", "op_name": "Default_network-WithLossCell__backbone-AlexNet_conv3-Conv2d_Conv2D-op12",
        "task_id": 2, "stream_id": 7, "timestamp": 161243956333802}
    for name in ("torchair-ge", "cann-tf-adapter"):
        assert get_layout(name)._parse_bin_name("Cast.Default_Cast-op0.41.3.1795336641754916")["stream_id"] == 3
    r12 = get_layout("mindspore-r1.2-async-pb")._parse_bin_name("Add.Default_Add-op1.9.1608983934774491")
    assert r12 == {"op_type": "Add", "op_name": "Default_Add-op1", "task_id": 9, "stream_id": None,
                   "timestamp": 1608983934774491}
