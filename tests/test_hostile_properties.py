"""Property-based tests (Hypothesis) of issue 30's hostile-input findings (items 8-14).

Over the parsers of dump text (``.ir``, execution order, ``mapping.csv``, both
``statistic.csv`` readers, msprobe ``dump.json``, ``.npy`` headers), catalog names and the
tables of a bundle: never an internal error (only :class:`~dumpdb.errors.DumpdbError` or a
per-record refusal), output bounded by the input, catalog names injective. The findings of
issue 30 are the first examples (``@example``). ``tests/test_properties.py`` keeps issue
14's properties; this file adds issue 30's. Example counts are kept small: the whole file
runs in well under a minute on 2 cores.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import DATA
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import dumpdb
from dumpdb.errors import DumpdbError
from dumpdb.ingestion.pipeline import _ENTRY_COLUMNS, RELATION_SCHEMAS, TENSOR_SCHEMA, rows_table
from dumpdb.ingestion.workers import Loaded, tensor_row
from dumpdb.layouts.base import display_name
from dumpdb.layouts.mindspore_ir import parse_ir, read_execution_order, read_global_execution_order
from dumpdb.layouts.mindspore_kit import parse_shape_cell, read_mapping_csv, read_statistic_csv, statistic_batches
from dumpdb.layouts.msprobe import MsprobeDump
from dumpdb.npy import parse_npy

pytestmark = pytest.mark.timeout(300)

QUICK = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FILES = settings(max_examples=25, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


# -- item 11: catalog names are injective ------------------------------------------------------------
@QUICK
@given(st.binary(min_size=1, max_size=24), st.binary(min_size=1, max_size=24))
@example(b"a\xff", b"a\\xff")  # issue 30's finding: a raw 0xff byte and its escape text
@example(b"\\x5c", b"\\")
@example(b"\\\xff", b"\\\\xff")
def test_display_name_is_injective_over_file_names(a, b):
    na, nb = display_name(os.fsdecode(a)), display_name(os.fsdecode(b))
    na.encode("utf-8")  # the catalog can hold it
    assert (na == nb) == (a == b), (a, b, na, nb)


@QUICK
@given(st.text(alphabet=st.sampled_from(["a", "\\", "x", "u", "f", "0", "d", "8", "\ud800", "\udcff", "é"]),
               max_size=16), st.text(alphabet=st.sampled_from(["a", "\\", "x", "u", "f", "0", "d", "8", "\ud800",
                                                                "\udcff", "é"]), max_size=16))
@example("\ud800", "\\ud800")  # a lone surrogate in a JSON key vs the same escape as text
def test_display_name_is_injective_over_text_with_lone_surrogates(a, b):
    na, nb = display_name(a), display_name(b)
    na.encode("utf-8")
    assert (na == nb) == (a == b), (a, b, na, nb)


# -- item 10: one Shape rule -------------------------------------------------------------------------
SHAPE_CELLS = st.one_of(
    st.lists(st.integers(0, 10**6), max_size=5).map(lambda d: "(" + ",".join(map(str, d)) + ")"),
    st.text(alphabet=st.sampled_from("()[], 0123456789-.e+xE"), max_size=16),
)


@QUICK
@given(SHAPE_CELLS)
@example("(-1,4)")
@example("(2.5,4)")
@example("(4e3,)")
def test_a_shape_cell_is_its_sizes_or_refused(cell):
    shape = parse_shape_cell(cell)
    if shape is None:
        return
    assert all(isinstance(d, int) and d >= 0 for d in shape)
    # nothing but the sizes, separators and brackets: no sign, point or exponent was dropped
    assert not set(cell) & set("-.+eExX"), cell
    assert [int(d) for d in cell.strip("()[] ").replace(" ", "").split(",") if d] == list(shape)


STAT_HEADER = ("Op Type,Op Name,Task ID,Stream ID,Timestamp,IO,Slot,Data Size,Data Type,Shape,"
               "Max Value,Min Value,Avg Value,Count\n")


def _shapes_by_reader(path: Path) -> tuple[list, list]:
    """The Shape of each row as read_statistic_csv and statistic_batches give it."""
    whole = [r.get("shape") for r in read_statistic_csv(path)]
    streamed: list = []
    for part in statistic_batches(path, "statistic.csv"):
        streamed += [tuple(s) if s is not None else None for s in part.table["shape_declared"].to_pylist()]
        streamed += [r.get("shape") for r in part.rows]
    return whole, streamed


@FILES
@given(st.lists(SHAPE_CELLS, min_size=1, max_size=4), st.sampled_from(["\n", "\r\n"]), st.booleans())
@example(["(-1,4)", "(2.5,4)", "(4e3,)", "(2,3)"], "\n", True)
def test_both_statistic_csv_readers_apply_one_shape_rule(tmp_path_factory, cells, newline, bom):
    path = tmp_path_factory.mktemp("csv") / "statistic.csv"
    rows = "".join(f'Add,op{i},7,0,1,output,0,16,float32,"{c}",1,0,0.5,4{newline}' for i, c in enumerate(cells))
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + (STAT_HEADER.replace("\n", newline) + rows).encode())
    whole, streamed = _shapes_by_reader(path)
    assert sorted(map(repr, whole)) == sorted(map(repr, streamed)), (whole, streamed)
    for shape, cell in zip(whole, cells):
        c = cell.strip()
        parsed = parse_shape_cell(c) if c else None
        assert shape == (parsed if parsed is not None else c)  # its sizes, or the text (refused per row)


# -- item 9: parsers of dump text: total and linear --------------------------------------------------
IR_PIECES = st.sampled_from(["%para1_", "a:", "<", ">", ": (", "a/", "# Fullname with scope: (", ")",
                             ": full_name_with_scope: (", "  %1(x) = PrimFunc_Add(", "# In file ", "a.py:1/",
                             "(3)", "~", ",", " ", "\t", "Tensor[Float32]", "ref_key=", "}", "subgraph", "\x00"])


@FILES
@given(st.lists(st.lists(IR_PIECES, max_size=40).map("".join), max_size=30))
@example(["%para1_" + "a:<" * 30_000])  # issue 30's finding, 90 KB here (quadratic: minutes at 1.2 MB)
@example(["  %1(y) = PrimFunc_Add(%a)", "  # Fullname with scope: (" * 4_000])
@example(["  %1(y) = PrimFunc_Add(%a)", "  : (" + "a/" * 50_000 + " "])
def test_ir_parser_returns_nodes_or_one_error(tmp_path_factory, lines):
    path = tmp_path_factory.mktemp("ir") / "ms_output_trace_code_graph_0.ir"
    path.write_text("\n".join(lines), errors="surrogatepass")
    try:
        nodes, params = parse_ir(path)
    except DumpdbError:
        return
    size = path.stat().st_size
    assert len(nodes) <= size and len(params) <= size
    assert all(len(n["scope_name"] or "") <= size for n in nodes)


@FILES
@given(st.binary(max_size=4096))
@example(b"\xff\xfe" + "Op Type,Op Name\n".encode("utf-16-le"))
@example(b"a," * 2000 + b"\n")
def test_text_files_of_random_bytes_raise_only_dumpdb_errors(tmp_path_factory, raw):
    d = tmp_path_factory.mktemp("txt")
    for name, read in (("mapping.csv", read_mapping_csv), ("ms_execution_order_graph_0.csv", read_execution_order),
                       ("ms_global_execution_order_graph_0.csv", read_global_execution_order),
                       ("statistic.csv", read_statistic_csv),
                       ("s.csv", lambda p: [b for b in statistic_batches(p, "s.csv")])):
        (d / name).write_bytes(raw)
        try:
            out = read(d / name)
        except DumpdbError as exc:
            assert "\n" not in str(exc)
            continue
        assert len(out) <= len(raw) + 1


# -- item 8: a long-double .npy, a lone surrogate in dump.json -------------------------------------
@QUICK
@given(st.sampled_from(["<f16", "<c32", ">f16", "<g", "<G", "<f8", "<c16", "<f4", "|u1"]),
       st.lists(st.integers(0, 4), max_size=3))
@example("<f16", [2])
def test_npy_headers_of_any_float_width_are_read_or_refused(descr, shape):
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': ({','.join(map(str, shape))}{',' if len(shape) == 1 else ''}), }}"
    header = header.ljust(118) + "\n"
    n = int(np.prod(shape)) * np.dtype(descr).itemsize
    raw = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + b"\x00" * n
    try:
        t = parse_npy(raw, "x.npy")
    except DumpdbError as exc:
        assert np.dtype(descr).itemsize > (8 if np.dtype(descr).kind == "f" else 16), exc
        return
    assert t.array.dtype.itemsize <= 16 and t.array.dtype.kind in "fcui"


KEYS = st.one_of(st.text(max_size=20), st.sampled_from(["Functional.conv2d.0.forward", "Tensor.add.1.backward"]))


@FILES
@given(st.dictionaries(KEYS, st.fixed_dictionaries(
    {"input_args": st.lists(st.fixed_dictionaries({"type": st.just("torch.Tensor"), "dtype": st.text(max_size=8),
                                                    "shape": st.lists(st.integers(0, 9), max_size=3),
                                                    "Max": st.floats(), "md5": st.text(max_size=40)}),
                            max_size=2)}), max_size=4))
@example({"Functional.conv2d.0.forward\ud800": {"input_args": [
    {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2], "Max": 1.0, "md5": "0" * 8}]}})
@example({"Functional.conv2d.0.forward" + "X" * 5000: {"input_args": []}})
@example({"Tensor.add.1.backward": {"input_args": [
    {"type": "torch.Tensor", "dtype": "d" * 5000, "shape": [2], "Max": 1.0, "md5": "0" * 8}]}})
def test_dump_json_rows_are_always_storable(tmp_path_factory, data):
    root = tmp_path_factory.mktemp("msp")
    rank = root / "step0" / "rank0"
    rank.mkdir(parents=True)
    text = json.dumps({"task": "statistics", "level": "L1", "framework": "pytorch", "data": data})
    (rank / "dump.json").write_text(text)
    try:
        scan = MsprobeDump().scan(root)
    except DumpdbError:
        return
    rows = [tensor_row(Loaded(e), "r", "dump", _ENTRY_COLUMNS) for e in scan.entries]
    rows_table(rows, TENSOR_SCHEMA)  # what the commit inserts: every text valid UTF-8
    rows_table([{"run": "r", **r} for r in scan.msprobe_records], RELATION_SCHEMAS["msprobe_records"])
    assert all(len(r["op_name"] or "") <= 4096 for r in rows)
    assert all(len(str(r.get("dtype_declared") or "")) <= 4096 for r in rows)


# -- item 14: every bundle table ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """An honest bundle of run c1 and an archive (run f) to import it into, copied per example."""
    root = tmp_path_factory.mktemp("pbundle")
    dumpdb.ingest(DATA / "mindspore" / "c1_inputs_kernels_iter", archive=root / "src.dumpdb", run="c1")
    dumpdb.ingest(DATA / "mindspore" / "f_long_names", archive=root / "target.dumpdb", run="f")
    return dumpdb.open(root / "src.dumpdb").export("c1", root / "c1.bundle"), root / "target.dumpdb"


def _resign(bundle: Path) -> None:
    import hashlib

    m = json.loads((bundle / "manifest.json").read_text())
    for rel in m["files"]:
        data = (bundle / rel).read_bytes()
        m["files"][rel] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    for meta in m["tables"].values():
        meta["rows"] = pq.read_metadata(bundle / meta["file"]).num_rows
    (bundle / "manifest.json").write_text(json.dumps(m))


MUTATIONS = st.sampled_from(["duplicate", "other run", "dtype", "max", "count", "shape", "drop half", "nbytes"])
TABLES = st.sampled_from(["tensors", "blobs", "arrays", "runs", "ops", "execution_order"])


def _mutate(table: pa.Table, how: str, row: int) -> pa.Table:
    if table.num_rows == 0:
        return table
    row %= table.num_rows

    def put(name: str, value) -> pa.Table:
        if name not in table.column_names:
            return table
        values = table[name].to_pylist()
        values[row] = value
        return table.set_column(table.schema.get_field_index(name), name,
                                pa.array(values, table.schema.field(name).type))

    if how == "duplicate":
        return pa.concat_tables([table, table.slice(row, 1)])
    if how == "other run":
        return put("run", "ghost")
    if how == "dtype":
        return put("dtype", "int32")
    if how == "max":
        return put("max", 12345.0)
    if how == "count":
        return put("count", 7)
    if how == "shape":
        return put("shape", [3, 1])
    if how == "nbytes":
        return put("nbytes", 4)
    return table.slice(0, table.num_rows // 2)


@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(TABLES, MUTATIONS, st.integers(0, 1000))
@example("tensors", "duplicate", 0)  # issue 30: 84 rows for 42 identities imported
@example("tensors", "other run", 0)  # rows of a run the manifest does not list
@example("tensors", "dtype", 3)  # a forged dtype
@example("tensors", "max", 3)  # forged statistics
def test_mutated_bundle_tables_import_or_raise_only_dumpdb_errors(exported, tmp_path_factory, table, how, row):
    bundle, template = exported
    work = tmp_path_factory.mktemp("mut") / "b"
    shutil.copytree(bundle, work)
    path = work / "catalog" / f"{table}.parquet"
    before = pq.read_table(path)
    after = _mutate(before, how, row)
    pq.write_table(after, path)
    _resign(work)
    target = tmp_path_factory.mktemp("target") / "t.dumpdb"
    shutil.copytree(template, target, ignore=shutil.ignore_patterns("locks"))
    try:
        report = dumpdb.open(target).import_bundle(work)
    except DumpdbError as exc:
        assert "\n" not in str(exc)
        return
    a = dumpdb.open(target)
    n = a.sql("SELECT count(*) AS n FROM tensors WHERE run = 'c1'")["n"][0].as_py()
    keys = a.sql("SELECT count(DISTINCT tensor_key) AS n FROM tensors WHERE run = 'c1'")["n"][0].as_py()
    assert n == keys == report.tensors  # never two rows with one identity
    if table == "tensors" and how in ("duplicate", "other run") and not after.equals(before):
        pytest.fail(f"tensors mutated by {how!r} (row {row}) was imported")
