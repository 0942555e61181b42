"""Property-based tests (Hypothesis) of the dump parsers (issue 14, item 6).

For random and mutated inputs, every parser either returns something the catalog
can hold or raises :class:`~dumpdb.errors.DumpdbError` (never another exception),
finishes in bounded time (``pytest.mark.timeout``), and never allocates more than
a small multiple of its input (``tracemalloc`` peak). Run sizes are kept modest so
the default test run stays fast (``max_examples`` per test below).
"""

from __future__ import annotations

import io
import json
import tracemalloc
from pathlib import Path

import cann_wire
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dumpdb.errors import DumpdbError
from dumpdb.ingestion import ranges
from dumpdb.ingestion.pipeline import RELATION_SCHEMAS, TENSOR_SCHEMA
from dumpdb.layouts import cann_pb
from dumpdb.layouts.ascend import AscendAsyncPb
from dumpdb.layouts.base import DumpScan, TensorEntry, load_json
from dumpdb.layouts.mindspore_legacy import parse_bin_name
from dumpdb.layouts.mindspore_sync import parse_tensor_name, read_statistic_csv
from dumpdb.layouts.msaccucmp import parse_msaccucmp_name
from dumpdb.layouts.msprobe import MsprobeDump, parse_record_key
from dumpdb.layouts.tensordump import parse_tensordump_name
from dumpdb.npy import parse_npy

pytestmark = pytest.mark.timeout(300)

FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FILES = settings(max_examples=60, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

def check_ranges(scan: DumpScan) -> None:
    ranges.check_ranges(scan, TENSOR_SCHEMA, RELATION_SCHEMAS)


ENTRY_COLUMNS = [f for f in TENSOR_SCHEMA if f.name not in ("run", "dtype", "nbytes", "content_hash", "stats_source")]


def catalog_rows(scan: DumpScan) -> pa.Table:
    """The scan's entries as the catalog's tensors columns (raises if a value does not fit)."""
    rows = []
    for e in scan.entries:
        row = {f.name: getattr(e, f.name, None) for f in ENTRY_COLUMNS}
        row["shape"] = list(e.shape_declared) if e.shape_declared is not None else None
        row["original_shape"] = list(e.original_shape) if e.original_shape is not None else None
        row["tensor_key"] = e.key
        row.update(e.stats or {})
        rows.append(row)
    return pa.Table.from_pylist(rows, pa.schema(ENTRY_COLUMNS))


def bounded(fn, data: bytes, factor: int = 4, slack: int = 1 << 20):
    """Run ``fn()``; assert its peak Python/numpy allocation is at most factor x input + slack."""
    tracemalloc.start()
    try:
        result = fn()
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak <= factor * len(data) + slack, f"allocated {peak} bytes for {len(data)} input bytes"
    return result


# -- file names of each layout --------------------------------------------------------------------
NAME_PARTS = st.sampled_from(["Conv2D", "Default_net-op0", "0", "1", "99999999999999999999999", "input",
                              "output", "DefaultFormat", "Float32", "npy", "bin", "shape", "x", "-1", "",
                              "\x00", "é", "²", "1e400", "NaN", "float32", "in"])
BIG = st.integers(0, 10**30).map(str)
WELL_FORMED = st.one_of(  # the layouts' grammars with numbers of any size
    st.tuples(BIG, BIG, BIG, BIG, st.sampled_from(["input", "output"])).map(
        lambda t: f"Conv2D.Default_x-op0.{t[0]}.{t[1]}.{t[2]}.{t[4]}.{t[3]}.DefaultFormat.Float32.npy"),
    st.tuples(BIG, BIG, BIG).map(lambda t: f"Default--x_output_{t[0]}_shape_{t[1]}_{t[2]}_Float32_NCHW.bin"),
    st.tuples(BIG, BIG).map(lambda t: f"Add.Default_x-op1.{t[0]}.{t[1]}"),
    st.tuples(BIG, BIG).map(lambda t: f"Module.fc.Linear.forward.{t[0]}"),
    st.tuples(BIG, BIG).map(lambda t: f"x_in_float32_{t[0]}.npy"),
)
NAMES = st.one_of(
    WELL_FORMED,
    st.text(max_size=255),
    st.lists(NAME_PARTS, min_size=1, max_size=14).map(".".join),
    st.lists(NAME_PARTS, min_size=1, max_size=14).map("_".join),
)
PARSERS = [parse_tensor_name, parse_msaccucmp_name, parse_tensordump_name, parse_bin_name, parse_record_key,
           AscendAsyncPb()._parse_bin_name]


@FAST
@given(NAMES)
def test_file_name_parsers_return_none_or_fields(name):
    for parse in PARSERS:
        fields = parse(name)
        assert fields is None or isinstance(fields, dict)
        if fields:  # whatever they return, check_ranges makes it fit the catalog (or drops it)
            known = {k: v for k, v in fields.items() if hasattr(TensorEntry, k) and k != "stats"}
            scan = DumpScan(layout="t", root=Path("."), entries=[TensorEntry(source_file=name, path=None, **known)])
            check_ranges(scan)
            catalog_rows(scan)


# -- .npy headers ------------------------------------------------------------------------------------
def _npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


ARRAYS = st.sampled_from([np.arange(6, dtype="<f4").reshape(2, 3), np.zeros((), "<f8"), np.ones(5, ">i2"),
                          np.array([True, False]), np.zeros((2, 2, 2), "<f2", order="F")])


def _parse_only_dumpdb_errors(raw: bytes):
    try:
        t = parse_npy(raw, "x.npy")
    except DumpdbError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("x.npy: ")
        return None
    assert t.array.nbytes <= len(raw)  # never more than the file holds
    return t


@FAST
@given(st.binary(max_size=4096))
def test_npy_random_bytes(raw):
    bounded(lambda: _parse_only_dumpdb_errors(b"\x93NUMPY" + raw), raw)
    bounded(lambda: _parse_only_dumpdb_errors(raw), raw)


@FAST
@given(ARRAYS, st.data())
def test_npy_mutated_files(array, data):
    raw = bytearray(_npy_bytes(array))
    for _ in range(data.draw(st.integers(1, 6))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        raw = raw[: data.draw(st.integers(0, len(raw)))]
    bounded(lambda: _parse_only_dumpdb_errors(bytes(raw)), bytes(raw))


HEADER_VALUES = st.one_of(st.integers(-2, 10**30), st.text(max_size=12), st.booleans(), st.none(),
                          st.lists(st.integers(-1, 10**25), max_size=4).map(tuple))


@FAST
@given(st.dictionaries(st.sampled_from(["descr", "shape", "fortran_order", "x"]), HEADER_VALUES, max_size=4),
       st.sampled_from(["<f4", "<E2", "|b1", ">i8", "O", "<U3", "(3,)f4"]), st.binary(max_size=64))
def test_npy_header_dicts(header, descr, payload):
    header.setdefault("descr", descr)
    text = repr(header).encode("latin1", "replace")
    raw = b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text + payload
    bounded(lambda: _parse_only_dumpdb_errors(raw), raw)


# -- CANN .bin headers -----------------------------------------------------------------------------
# the protobuf classes are built on first use (cann_pb): here, not within a measured allocation
_DUMP_DATA = cann_pb.DumpData


def _container() -> bytes:
    return cann_wire.container(inputs=[np.arange(12, dtype=np.float32).reshape(3, 4)],
                               outputs=[np.ones((2, 2), np.float16)], op_name="Default/Add-op1")


def _cann_only_dumpdb_errors(raw: bytes) -> None:
    try:
        header = cann_pb.parse_header(raw, len(raw), "c.bin")
        for t in header.tensors:
            array, _ = cann_pb.tensor_array(t, raw[t.offset:t.offset + t.size], "c.bin")
            assert array.nbytes <= len(raw)
    except DumpdbError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("c.bin")


@FAST
@given(st.binary(max_size=2048))
def test_cann_random_bytes(raw):
    bounded(lambda: _cann_only_dumpdb_errors(raw), raw)


@FAST
@given(st.data())
def test_cann_mutated_containers(data):
    raw = bytearray(_container())
    for _ in range(data.draw(st.integers(1, 8))):
        i = data.draw(st.integers(0, min(len(raw) - 1, 8 + 200)))  # mostly the header
        raw[i] = data.draw(st.integers(0, 255))
    bounded(lambda: _cann_only_dumpdb_errors(bytes(raw)), bytes(raw))


# -- statistic.csv rows -------------------------------------------------------------------------------
CELLS = st.one_of(st.sampled_from(["nan", "inf", "-inf", "1e400", "-1", "0", "3", "1e30", "", "abc", "(2,2)",
                                   "99999999999999999999999", "input", "output", "Add", "op"]),
                  st.text(alphabet=st.characters(blacklist_characters="\r\n"), max_size=12))
STAT_HEADER = ["Op Type", "Op Name", "Task ID", "Stream ID", "Timestamp", "IO", "Slot", "Data Type", "Shape",
               "Max Value", "Min Value", "Avg Value", "Count", "NaN Count", "Negative Inf Count",
               "Positive Inf Count", "Zero Count", "Negative Zero Count", "Positive Zero Count", "MD5"]


@FILES
@given(st.lists(st.lists(CELLS, min_size=0, max_size=len(STAT_HEADER) + 2), max_size=8), st.binary(max_size=64))
def test_statistic_csv_rows(tmp_path_factory, rows, junk):
    import csv

    path = tmp_path_factory.mktemp("csv") / "statistic.csv"
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(STAT_HEADER)
    w.writerows(rows)
    path.write_bytes(buf.getvalue().encode("utf-8", "surrogatepass") + junk)
    try:
        parsed = read_statistic_csv(path)
    except DumpdbError:
        return
    entries = [TensorEntry(source_file="statistic.csv", path=None, tensor_key=f"k{i}", op_type=r.get("op_type"),
                           op_name=r.get("op_name"), task_id=r.get("task_id"), stream_id=r.get("stream_id"),
                           timestamp=r.get("timestamp"), io=r.get("io"), slot=r.get("slot"),
                           shape_declared=r.get("shape"), stats=r["stats"] or None)
               for i, r in enumerate(parsed)]
    scan = DumpScan(layout="t", root=Path("."), entries=entries)
    check_ranges(scan)
    catalog_rows(scan)  # every value left fits its column


# -- dump.json ----------------------------------------------------------------------------------------
JSON_LEAVES = st.one_of(st.none(), st.booleans(), st.integers(-(10**30), 10**30),
                        st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=10),
                        st.sampled_from(["torch.float32", "torch.Tensor", "x.pt", "0x0123456789abcdef"]))
JSON = st.recursive(JSON_LEAVES, lambda kids: st.one_of(
    st.lists(kids, max_size=4),
    st.dictionaries(st.sampled_from(["type", "dtype", "shape", "Max", "Min", "Mean", "Norm", "md5", "data_name",
                                     "input_args", "output", "requires_grad", "0"]), kids, max_size=5)),
    max_leaves=30)
KEYS = st.one_of(st.text(max_size=30), st.sampled_from(
    ["Functional.conv2d.0.forward", "Module.fc.Linear.backward.99999999999999999999999",
     "Module.fc.Linear.parameters_grad.0", "Tensor.add.1.backward", "a.b", "Cell.x.Dense.forward.2147483648"]))


@FILES
@given(st.dictionaries(KEYS, JSON, max_size=5), st.integers(0, 2))
def test_dump_json(tmp_path_factory, data, variant):
    root = tmp_path_factory.mktemp("msp")
    rank = root / "step0" / "rank0"
    rank.mkdir(parents=True)
    doc: object = {"task": "statistics", "level": "L1", "framework": "pytorch", "data": data}
    if variant == 1:
        doc = data  # no "data" object
    text = json.dumps(doc, allow_nan=True)
    if variant == 2:
        text = text[: len(text) // 2]  # truncated
    (rank / "dump.json").write_text(text)
    try:
        scan = bounded(lambda: MsprobeDump().scan(root), text.encode(), factor=200)
    except DumpdbError:
        return
    check_ranges(scan)
    catalog_rows(scan)
    assert all("\n" not in msg for _, msg in scan.errors)


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 200_000), st.sampled_from(["[", '{"a":']))
def test_json_nesting_is_one_error_at_any_depth(depth, opener):
    closer = "]" if opener == "[" else "}"
    text = opener * depth + "0" + closer * depth
    try:
        load_json(text, "d.json")
    except DumpdbError as exc:
        assert str(exc).startswith("d.json: ")


# -- check_ranges: whatever a reader leaves, the catalog can hold what is kept ---------------------
ANY_VALUE = st.one_of(st.none(), st.booleans(), st.integers(-(10**400), 10**400), st.floats(), st.text(max_size=5))
INT_FIELDS = ["rank", "graph_id", "iteration", "task_id", "stream_id", "timestamp", "slot", "device_id",
              "model_id", "step", "call_index"]


@FAST
@given(st.dictionaries(st.sampled_from(INT_FIELDS), st.integers(-(10**30), 10**30), max_size=4),
       st.dictionaries(st.sampled_from(["max", "min", "mean", "l2norm", "count", "nan_count", "zero_count"]),
                       ANY_VALUE, max_size=5),
       st.lists(st.integers(-(10**30), 10**30), max_size=3))
def test_check_ranges_leaves_only_storable_values(ints, stats, shape):
    entry = TensorEntry(source_file="f", path=None, stats=stats or None, shape_declared=tuple(shape), **ints)
    scan = DumpScan(layout="t", root=Path("."), entries=[entry])
    check_ranges(scan)
    catalog_rows(scan)
    assert len(scan.entries) == 1 or scan.errors


def test_check_ranges_keeps_an_integer_statistic_beyond_float_precision():
    """Found by the property above: a statistic.csv max of 2**53 + 1 (an int64 tensor) is kept
    as the nearest double instead of failing the commit (pyarrow refuses the inexact int)."""
    entry = TensorEntry(source_file="f", path=None, stats={"max": 2**53 + 1, "min": -3}, shape_declared=(2,))
    scan = DumpScan(layout="t", root=Path("."), entries=[entry])
    check_ranges(scan)
    catalog_rows(scan)
    assert not scan.errors
    assert scan.entries[0].stats == {"max": float(2**53), "min": -3.0}
