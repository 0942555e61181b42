"""Hostile dumps and a read-only SQL (issue 14): what a user sees for each.

Every case plants one hostile thing in a copy of a real tests/data dump, runs
``dumpdb ingest`` in-process and checks: the exit code, ONE output line naming the
file and what is wrong (no traceback), the same line in ``ingest_errors``, and that
every other tensor of the dump was ingested bit for bit. Each test is time-bounded
(``pytest.mark.timeout``): before these fixes, FIFOs hung the ingest forever.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
from pathlib import Path

import pytest
from conftest import DATA, assert_bit_exact, npy_payload
from typer.testing import CliRunner

import dumpdb
from dumpdb.cli import app
from dumpdb.errors import DumpdbError

pytestmark = pytest.mark.timeout(120)

runner = CliRunner()
C1 = "c1_inputs_kernels_iter"
C1_TENSORS = 42
IT3 = Path("rank_0", "LeNet5", "0", "3")  # an iteration directory of c1 (14 tensors)
GRAPHS = Path("rank_0", "graphs")
ORDER = Path("rank_0", "execution_order")


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture
def c1(tmp_path) -> Path:
    dst = tmp_path / "dump"
    shutil.copytree(DATA / "mindspore" / C1, dst)
    return dst


def tensor_names(src: Path) -> list[Path]:
    return sorted((src / IT3).glob("*.npy"))


def ingest(src: Path, archive: Path, *extra):
    return invoke("ingest", src, "--archive", archive, "--run", "r", "-q", *extra)


def errors(archive: Path) -> list[tuple[str, str]]:
    t = dumpdb.open(archive).sql("SELECT source_file, error FROM ingest_errors WHERE run = 'r' ORDER BY ALL")
    return [(r["source_file"], r["error"]) for r in t.to_pylist()]


def assert_one_line(result, name: str, *phrases: str) -> None:
    """The output names ``name`` on one line holding every phrase; no traceback."""
    assert "Traceback" not in result.output, result.output
    lines = [ln for ln in result.output.splitlines() if name in ln and all(p in ln for p in phrases)]
    assert lines, f"no line naming {name!r} with {phrases}: {result.output}"


def assert_rest_bit_exact(archive: Path, src: Path, expected: int) -> None:
    """Every stored tensor of run r equals its source file's payload; ``expected`` of them."""
    a = dumpdb.open(archive)
    n = 0
    for row, array in a.tensors("SELECT * FROM tensors WHERE run = 'r' AND content_hash IS NOT NULL"):
        _, _, payload = npy_payload(src / row["source_file"])
        assert_bit_exact(array, payload)
        n += 1
    assert n == expected
    assert dumpdb.open(archive).sql("SELECT status FROM runs WHERE run = 'r'")["status"][0].as_py() != "ingesting"


def check(result, archive: Path, src: Path, name: str, phrases: tuple[str, ...], tensors: int = C1_TENSORS,
          exit_code: int = 1) -> None:
    assert result.exit_code == exit_code, result.output
    assert_one_line(result, name, *phrases)
    recorded = [(f, e) for f, e in errors(archive) if name in f or name in e]
    assert recorded and all("\n" not in e for _, e in recorded), errors(archive)
    assert_rest_bit_exact(archive, src, tensors)


# -- non-regular files: refused before open, never a hang -------------------------------------
NPY_NAME = "Conv2D.Hostile-op0.0.0.1795336648170000.output.0.DefaultFormat.Float32.npy"


def test_fifo_named_npy_is_refused(c1, tmp_path):
    os.mkfifo(c1 / IT3 / NPY_NAME)
    r = ingest(c1, tmp_path / "a")
    check(r, tmp_path / "a", c1, NPY_NAME, ("FIFO", "refused"))


def test_socket_named_npy_is_refused(c1, tmp_path, monkeypatch):
    monkeypatch.chdir(c1 / IT3)  # AF_UNIX paths are limited to 108 bytes: bind a relative name
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(NPY_NAME)
        r = ingest(c1, tmp_path / "a")
    finally:
        s.close()
    check(r, tmp_path / "a", c1, NPY_NAME, ("socket", "refused"))


def test_symlink_to_dev_zero_is_not_followed(c1, tmp_path):
    os.symlink("/dev/zero", c1 / IT3 / NPY_NAME)
    r = ingest(c1, tmp_path / "a")
    check(r, tmp_path / "a", c1, NPY_NAME, ("symlink leads outside the dump directory", "/dev/zero"))


def test_symlink_to_dev_zero_is_refused_even_when_following(c1, tmp_path):
    os.symlink("/dev/zero", c1 / IT3 / NPY_NAME)
    r = ingest(c1, tmp_path / "a", "--follow-symlinks")
    check(r, tmp_path / "a", c1, NPY_NAME, ("character device", "refused"))


def test_fifo_ir_is_refused(c1, tmp_path):
    ir = c1 / GRAPHS / "ms_output_trace_code_graph_0.ir"
    ir.unlink()
    os.mkfifo(ir)
    r = ingest(c1, tmp_path / "a")
    check(r, tmp_path / "a", c1, ir.name, ("FIFO",))


def test_fifo_execution_order_is_refused(c1, tmp_path):
    eo = c1 / ORDER / "ms_execution_order_graph_0.csv"
    eo.unlink()
    os.mkfifo(eo)
    r = ingest(c1, tmp_path / "a")
    check(r, tmp_path / "a", c1, eo.name, ("FIFO",))


def test_fifo_global_execution_order_is_refused(c1, tmp_path):
    eo = c1 / ORDER / "ms_global_execution_order_graph_0.csv"
    eo.unlink()
    os.mkfifo(eo)
    r = ingest(c1, tmp_path / "a")
    check(r, tmp_path / "a", c1, eo.name, ("FIFO",))


def test_fifo_statistic_csv_is_refused(c1, tmp_path):
    os.mkfifo(c1 / IT3 / "statistic.csv")
    r = ingest(c1, tmp_path / "a")
    check(r, tmp_path / "a", c1, "statistic.csv", ("FIFO",))


def test_fifo_mapping_csv_is_refused(c1, tmp_path):
    os.mkfifo(c1 / IT3 / "mapping.csv")
    r = ingest(c1, tmp_path / "a")
    check(r, tmp_path / "a", c1, "mapping.csv", ("FIFO",))


def test_fifo_in_metadata_is_reported(c1, tmp_path):
    os.mkfifo(c1 / "rank_0" / ".dump_metadata" / "extra.json")
    r = ingest(c1, tmp_path / "a")
    check(r, tmp_path / "a", c1, "extra.json", ("FIFO",))


# -- .npy headers: bounded, parsed strictly, no allocation beyond the file -------------------
def _npy(header: str, payload: bytes = b"", version: int = 1) -> bytes:
    text = header.encode("latin1")
    if version == 1:
        return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text + payload
    return b"\x93NUMPY\x02\x00" + len(text).to_bytes(4, "little") + text + payload


def test_npy_header_of_one_megabyte_is_refused(c1, tmp_path):
    pad = " " * (1 << 20)
    (c1 / IT3 / NPY_NAME).write_bytes(_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': '"
                                           + "a" * 200 + "'}" + pad + "\n", b"\0\0\0\0", version=2))
    r = ingest(c1, tmp_path / "a")
    check(r, tmp_path / "a", c1, NPY_NAME, (".npy header of", "refused"))


def test_npy_header_nested_deeply_is_one_error(c1, tmp_path):
    # ast.literal_eval raised RecursionError on this (a traceback that stopped the ingest)
    (c1 / IT3 / NPY_NAME).write_bytes(_npy("{'descr': '<f4', 'shape': " + "(" * 30000 + ")" * 30000 + "}\n"))
    r = ingest(c1, tmp_path / "a")
    check(r, tmp_path / "a", c1, NPY_NAME, ("unreadable .npy header",))


def test_npy_header_claiming_10e12_elements_reads_nothing(c1, tmp_path):
    (c1 / IT3 / NPY_NAME).write_bytes(_npy("{'descr': '<f4', 'fortran_order': False, "
                                           "'shape': (1000000, 1000000), }\n", b"\0" * 64))
    r = ingest(c1, tmp_path / "a")
    check(r, tmp_path / "a", c1, NPY_NAME, ("truncated", "4000000000000"))


def test_npy_header_with_an_expression_is_not_evaluated(c1, tmp_path):
    (c1 / IT3 / NPY_NAME).write_bytes(_npy("{'descr': '<f4', 'shape': (2**40,), }\n", b"\0" * 4))
    r = ingest(c1, tmp_path / "a")
    check(r, tmp_path / "a", c1, NPY_NAME, ("unreadable .npy header",))


def test_npy_header_with_a_subarray_descr_is_one_error(c1, tmp_path):
    (c1 / IT3 / NPY_NAME).write_bytes(_npy("{'descr': '(100000000000,100000000)f4', 'shape': (), }\n"))
    r = ingest(c1, tmp_path / "a")
    check(r, tmp_path / "a", c1, NPY_NAME, ("unknown dtype descriptor",))


# -- numbers that do not fit the catalog ---------------------------------------------------------
@pytest.mark.parametrize("field, name", [
    ("timestamp", "Conv2D.Hostile-op0.0.0.99999999999999999999999.output.0.DefaultFormat.Float32.npy"),
    ("task_id", "Conv2D.Hostile-op0.99999999999999999999.0.1795336648170000.output.0.DefaultFormat.Float32.npy"),
    ("slot", "Conv2D.Hostile-op0.0.0.1795336648170000.output.4294967296.DefaultFormat.Float32.npy"),
])
def test_int_overflow_in_file_name_is_one_error(c1, tmp_path, field, name):
    shutil.copy(tensor_names(c1)[0], c1 / IT3 / name)
    r = ingest(c1, tmp_path / "a")
    check(r, tmp_path / "a", c1, name, (f"{field}=", "out of range"))


def test_int_overflow_in_iteration_directory_is_one_error(c1, tmp_path):
    bad = c1 / "rank_0" / "LeNet5" / "0" / "99999999999999999999"
    shutil.copytree(c1 / IT3, bad)
    r = ingest(c1, tmp_path / "a")
    check(r, tmp_path / "a", c1, "99999999999999999999", ("iteration_id out of range",))


def test_int_overflow_in_graph_directory_is_one_error(c1, tmp_path):
    bad = c1 / "rank_0" / "LeNet5" / "4294967296" / "0"
    shutil.copytree(c1 / IT3, bad)
    r = ingest(c1, tmp_path / "a")
    check(r, tmp_path / "a", c1, "4294967296", ("graph_id", "out of range"))


@pytest.mark.parametrize("dirname", ["latest", "\u00b2"])  # '²' passes str.isdigit() but not int()
def test_non_numeric_iteration_directory_is_one_warning(c1, tmp_path, dirname):
    shutil.copytree(c1 / IT3, c1 / "rank_0" / "LeNet5" / "0" / dirname)
    r = ingest(c1, tmp_path / "a")
    check(r, tmp_path / "a", c1, dirname, ("not an iteration directory",))


# -- statistic.csv ------------------------------------------------------------------------------
STAT_HEADER = ("Op Type,Op Name,Task ID,Stream ID,Timestamp,IO,Slot,Data Size,Data Type,Shape,"
               "Max Value,Min Value,Avg Value,Count,Negative Zero Count,Positive Zero Count,NaN Count,"
               "Negative Inf Count,Positive Inf Count,Zero Count\n")


def _stat_row(count="4", nan_count="0", task="7") -> str:
    return f"Add,Hostile-op9,{task},0,1795336648170001,output,0,16,float32,\"(2,2)\",1,0,0.5,{count},0,0,{nan_count},0,0,1\n"


@pytest.mark.parametrize("count, nan_count, shown", [
    ("nan", "0", "count='nan'"),
    ("1e400", "0", "count='1e400'"),
    ("-5", "0", "count='-5'"),
    ("lots", "0", "count='lots'"),
    ("4", "1e30", "nan_count="),
])
def test_bad_statistic_counts_are_one_error_and_the_row_stays(c1, tmp_path, count, nan_count, shown):
    (c1 / IT3 / "statistic.csv").write_text(STAT_HEADER + _stat_row(count, nan_count))
    r = ingest(c1, tmp_path / "a")
    check(r, tmp_path / "a", c1, "statistic.csv", (shown, "ignored"))
    row = dumpdb.open(tmp_path / "a").sql("SELECT * FROM tensors WHERE op_name = 'Hostile-op9'").to_pylist()
    assert len(row) == 1 and row[0]["max"] == 1.0 and row[0]["content_hash"] is None


def test_statistic_csv_task_id_beyond_float_range_is_one_error(c1, tmp_path):
    (c1 / IT3 / "statistic.csv").write_text(STAT_HEADER + _stat_row(task="1e400") + _stat_row(task="8"))
    r = ingest(c1, tmp_path / "a")
    assert r.exit_code == 0, r.output  # '1e400' is no task id: NULL, as any unreadable key field
    assert_rest_bit_exact(tmp_path / "a", c1, C1_TENSORS)
    rows = dumpdb.open(tmp_path / "a").sql("SELECT task_id FROM tensors WHERE op_name = 'Hostile-op9' ORDER BY 1")
    assert rows["task_id"].to_pylist() == [8, None]


# -- IR and execution order ---------------------------------------------------------------------
def test_binary_garbage_ir_is_one_warning(c1, tmp_path):
    ir = c1 / GRAPHS / "ms_output_trace_code_graph_0.ir"
    ir.write_bytes(bytes(range(256)) * 64)
    r = ingest(c1, tmp_path / "a")
    check(r, tmp_path / "a", c1, ir.name, ("not a MindSpore IR text file",))


@pytest.mark.parametrize("number", ["99999999999999999999", "9" * 5000])
def test_absurd_source_line_number_in_ir_is_one_warning(c1, tmp_path, number):
    ir = c1 / GRAPHS / "ms_output_trace_code_graph_0.ir"
    text = re.sub(r"(# In file [^:\n]+\.py):\d+", rf"\g<1>:{number}", ir.read_text())
    ir.write_text(text)
    r = ingest(c1, tmp_path / "a")
    check(r, tmp_path / "a", c1, ir.name, ("source line number(s) out of range",))
    ops = dumpdb.open(tmp_path / "a").sql("SELECT count(*) AS n, count(code_line) AS lines FROM ops WHERE run = 'r'")
    assert ops["n"][0].as_py() > 0 and ops["lines"][0].as_py() == 0


def test_garbled_execution_order_line_is_one_warning_and_not_stored(c1, tmp_path):
    eo = c1 / ORDER / "ms_execution_order_graph_0.csv"
    lines = eo.read_bytes().splitlines()
    eo.write_bytes(b"\n".join([*lines[:3], b"Default/\x00\x00garbage\x01\xff\xfe", *lines[3:]]) + b"\n")
    r = ingest(c1, tmp_path / "a")
    check(r, tmp_path / "a", c1, eo.name, ("garbled line", "line 4"))
    scopes = dumpdb.open(tmp_path / "a").sql("SELECT scope_name FROM execution_order WHERE run = 'r'")
    assert len(scopes) == len(lines) - 1 and not any("\x00" in s for s in scopes["scope_name"].to_pylist())


def test_global_execution_order_beyond_int64_is_skipped(c1, tmp_path):
    eo = c1 / ORDER / "ms_global_execution_order_graph_0.csv"
    eo.write_text(eo.read_text() + "99999999999999999999\n")
    r = ingest(c1, tmp_path / "a")
    assert r.exit_code == 0, r.output
    its = dumpdb.open(tmp_path / "a").sql("SELECT iteration FROM graph_executions WHERE run = 'r' ORDER BY 1")
    assert its["iteration"].to_pylist() == [0, 2, 3]


def test_metadata_json_nested_100000_deep_is_one_error(c1, tmp_path):
    (c1 / "rank_0" / ".dump_metadata" / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    r = ingest(c1, tmp_path / "a")
    check(r, tmp_path / "a", c1, "deep.json", ("nested too deeply",))


# -- symlinks ------------------------------------------------------------------------------------
def test_symlinked_metadata_outside_the_dump_is_not_read(c1, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-CONTENT")
    os.symlink(secret, c1 / "rank_0" / ".dump_metadata" / "notes.txt")
    r = ingest(c1, tmp_path / "a")
    check(r, tmp_path / "a", c1, "notes.txt", ("symlink leads outside the dump directory",))
    meta = dumpdb.open(tmp_path / "a").sql("SELECT metadata FROM runs")["metadata"][0].as_py()
    assert "TOP-SECRET-CONTENT" not in meta


def test_symlink_to_a_tensor_outside_is_refused_unless_follow_symlinks(c1, tmp_path):
    outside = tmp_path / "outside.npy"
    shutil.copy(tensor_names(c1)[0], outside)
    os.symlink(outside, c1 / IT3 / NPY_NAME)
    r = ingest(c1, tmp_path / "a")
    check(r, tmp_path / "a", c1, NPY_NAME, ("symlink leads outside the dump directory", "--follow-symlinks"))
    r = ingest(c1, tmp_path / "b", "--follow-symlinks")
    assert r.exit_code == 0, r.output
    assert_rest_bit_exact(tmp_path / "b", c1, C1_TENSORS + 1)


def test_symlinked_directory_leaving_the_dump_is_not_followed(c1, tmp_path):
    outside = tmp_path / "elsewhere"
    shutil.copytree(c1 / IT3, outside)
    os.symlink(outside, c1 / "rank_0" / "LeNet5" / "0" / "7")
    r = ingest(c1, tmp_path / "a")
    check(r, tmp_path / "a", c1, str(Path("LeNet5", "0", "7")), ("symlink leads outside the dump directory",))
    assert len(errors(tmp_path / "a")) == 1  # the directory, once
    r = ingest(c1, tmp_path / "b", "--follow-symlinks")
    assert r.exit_code == 0, r.output
    assert_rest_bit_exact(tmp_path / "b", c1, C1_TENSORS + 14)


def test_symlink_inside_the_dump_still_works(c1, tmp_path):
    target = tensor_names(c1)[0]
    os.symlink(os.path.relpath(target, c1 / IT3), c1 / IT3 / NPY_NAME)
    r = ingest(c1, tmp_path / "a")
    assert r.exit_code == 0, r.output
    assert_rest_bit_exact(tmp_path / "a", c1, C1_TENSORS + 1)


def test_api_follow_symlinks_flag(c1, tmp_path):
    outside = tmp_path / "outside.npy"
    shutil.copy(tensor_names(c1)[0], outside)
    os.symlink(outside, c1 / IT3 / NPY_NAME)
    report = dumpdb.ingest(c1, archive=tmp_path / "a", run="r")
    assert [f for f, _ in report.errors] == [str(IT3 / NPY_NAME)]
    report = dumpdb.ingest(c1, archive=tmp_path / "b", run="r", follow_symlinks=True)
    assert report.ok and report.tensors_added == C1_TENSORS + 1


# -- msprobe dump.json ---------------------------------------------------------------------------
MSP = DATA / "msprobe" / "statistics_mix_md5"


@pytest.fixture
def msp(tmp_path) -> Path:
    dst = tmp_path / "msp"
    shutil.copytree(MSP, dst)
    return dst


def _dump_json(root: Path) -> Path:
    return sorted(root.rglob("dump.json"))[0]


def test_msprobe_dump_json_nested_100000_deep_is_one_error(msp, tmp_path):
    dj = _dump_json(msp)
    dj.write_text('{"data": ' + "[" * 100_000 + "]" * 100_000 + "}")
    r = invoke("ingest", msp, "--archive", tmp_path / "a", "--run", "r", "-q")
    assert r.exit_code == 1, r.output
    assert_one_line(r, "dump.json", "nested too deeply")


def test_msprobe_dump_json_fifo_is_refused(msp, tmp_path):
    dj = _dump_json(msp)
    dj.unlink()
    os.mkfifo(dj)
    r = invoke("ingest", msp, "--archive", tmp_path / "a", "--run", "r", "-q")
    assert r.exit_code == 1, r.output
    assert_one_line(r, "dump.json", "FIFO", "refused")


def test_msprobe_statistic_beyond_float_range_is_not_a_traceback(msp, tmp_path):
    dj = _dump_json(msp)
    dump = json.loads(dj.read_text())
    key = next(iter(dump["data"]))
    leaf = next(v for v in dump["data"][key]["input_args"] if isinstance(v, dict) and "Max" in v)
    text = json.dumps(dump).replace(json.dumps(leaf["Max"]), "1" + "0" * 400, 1)
    dj.write_text(text)
    r = invoke("ingest", msp, "--archive", tmp_path / "a", "--run", "r", "-q")
    assert r.exit_code == 0, r.output
    n = dumpdb.open(tmp_path / "a").sql("SELECT count(*) AS n FROM tensors WHERE run = 'r'")["n"][0].as_py()
    assert n > 0


# -- SQL sandbox ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("sql") / "a.dumpdb"
    dumpdb.ingest(DATA / "mindspore" / C1, archive=path, run="r")
    return path


@pytest.mark.parametrize("query, what", [
    ("COPY (SELECT * FROM tensors) TO '{out}'", "Cannot access file"),
    ("SELECT * FROM read_text('{secret}')", "Cannot access file"),
    ("SELECT * FROM read_csv('{secret}')", "Cannot access file"),
    ("SELECT * FROM read_parquet('{secret}')", "Cannot access file"),
    ("ATTACH '{out}' AS other", "ATTACH is disabled"),
    ("SELECT 1; DETACH catalog", "DETACH is disabled"),
    ("ATTACH OR REPLACE '{catalog}' AS catalog", "ATTACH is disabled"),
    ("INSTALL httpfs", "disabled by configuration"),
    ("LOAD httpfs", "disabled through configuration"),
    ("SET enable_external_access = true", "configuration has been locked"),
    ("RESET lock_configuration", "configuration has been locked"),
])
def test_sql_is_sandboxed(archive, tmp_path, query, what):
    secret = tmp_path / "secret.csv"
    secret.write_text("a,b\n1,2\n")
    out = tmp_path / "out.csv"
    q = query.format(out=out, secret=secret, catalog=archive / "catalog.duckdb")
    r = invoke("sql", "--archive", archive, q)
    assert r.exit_code == 2 and "Traceback" not in r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "SQL refused" in lines[0] and what in lines[0], r.output
    assert not out.exists()
    with pytest.raises(DumpdbError, match="SQL refused"):
        dumpdb.open(archive).sql(q)


def test_sql_allow_files_opts_in(archive, tmp_path):
    out = tmp_path / "out.csv"
    r = invoke("sql", "--archive", archive, "--allow-files", f"COPY (SELECT count(*) AS n FROM tensors) TO '{out}'")
    assert r.exit_code == 0, r.output
    assert out.read_text().split() == ["n", str(C1_TENSORS)]
    t = dumpdb.open(archive).sql(f"SELECT * FROM read_csv('{out}')", allow_files=True)
    assert t["n"][0].as_py() == C1_TENSORS


def test_sql_sandbox_keeps_parquet_output_and_stays_read_only(archive, tmp_path):
    import pyarrow.parquet as pq

    out = tmp_path / "t.parquet"
    r = invoke("sql", "--archive", archive, "-f", "parquet", "-o", out, "SELECT * FROM tensors")
    assert r.exit_code == 0 and pq.read_table(out).num_rows == C1_TENSORS
    r = invoke("sql", "--archive", archive, "DELETE FROM tensors")
    assert r.exit_code == 2 and "read-only" in r.output
    # the sandbox's settings stay in its own DuckDB instance: other reads are unaffected
    with dumpdb.open(archive) as a:
        assert a.sql("SELECT count(*) AS n FROM tensors")["n"][0].as_py() == C1_TENSORS
        assert a.tensor(1) is not None
        with pytest.raises(DumpdbError, match="SQL refused"):  # held connections stay sandboxed
            a.sql(f"COPY tensors TO '{tmp_path / 'held.csv'}'")
        assert a.sql("SELECT 1 AS x")["x"][0].as_py() == 1
    assert not (tmp_path / "held.csv").exists()


def test_sql_outside_with_keeps_one_instance_holds_no_lock_and_sees_new_commits(archive, tmp_path):
    """Between a.sql() calls the kept query instance holds no catalog lock (a writer opens
    the catalog at once) and the next call sees what that writer committed."""
    import shutil

    import duckdb

    copy = tmp_path / "a.dumpdb"
    shutil.copytree(archive, copy)
    a = dumpdb.open(copy)
    try:
        assert a.sql("SELECT count(*) AS n FROM tensors")["n"][0].as_py() == C1_TENSORS
        instance = a._query_db
        assert instance is not None
        # no lock held: a writable connection opens now (DuckDB refuses one while a reader is attached)
        con = duckdb.connect(str(copy / "catalog.duckdb"))
        con.execute("CREATE TABLE later AS SELECT 42 AS x")
        con.close()
        assert a.sql("SELECT x FROM later")["x"].to_pylist() == [42]
        assert a._query_db is instance  # the same DuckDB instance, re-attached
        wal = copy / "catalog.duckdb.wal"
        before = wal.read_bytes() if wal.exists() else None
        with pytest.raises(DumpdbError, match="belongs to an attached database"):
            a.sql(f"COPY tensors TO '{wal}'")  # the one writable path the instance may open
        assert (wal.read_bytes() if wal.exists() else None) == before
        with pytest.raises(DumpdbError, match="read-only"):
            a.sql("DELETE FROM tensors")
        assert a.sql("SELECT count(*) AS n FROM tensors")["n"][0].as_py() == C1_TENSORS
    finally:
        a.close()
    assert a._query_db is None


def _child_sql(a, queue) -> None:
    queue.put((a.sql("SELECT count(*) AS n FROM tensors")["n"][0].as_py(), a._query_pid == os.getpid()))


def test_sql_in_a_forked_child_uses_its_own_instance(archive):
    """An Archive used before a fork (DataLoader workers fork on Linux): the child's a.sql()
    makes its own DuckDB instance instead of the parent's copy, and answers."""
    import multiprocessing

    a = dumpdb.open(archive)
    try:
        assert a.sql("SELECT count(*) AS n FROM tensors")["n"][0].as_py() == C1_TENSORS
        ctx = multiprocessing.get_context("fork")
        queue = ctx.Queue()
        child = ctx.Process(target=_child_sql, args=(a, queue))
        child.start()
        assert queue.get(timeout=120) == (C1_TENSORS, True)
        child.join(timeout=120)
        assert child.exitcode == 0
        assert a.sql("SELECT count(*) AS n FROM tensors")["n"][0].as_py() == C1_TENSORS  # the parent's still works
    finally:
        a.close()


# -- CANN protobuf containers (ascend-async-pb) --------------------------------------------------
def _cann_dump(tmp_path: Path):
    import fixtures_cann as fc

    fx = fc.build_ascend_pb(tmp_path / "cann", "plain")
    it_dir = tmp_path / "cann" / fc.TIME / "0" / "kernel_graph_1" / "1" / "0"
    return fx, it_dir


def _assert_cann_bit_exact(fx, archive: Path) -> None:
    a = dumpdb.open(archive)
    for e in fx.tensors:
        t = a.sql("SELECT tensor_id FROM tensors WHERE run = 'r' AND source_file = ? AND io = ? AND slot = ?",
                  [e.source_file, e.io, e.slot])
        assert t.num_rows == 1, e.source_file
        assert a.tensor(t["tensor_id"][0].as_py()).tobytes() == e.array.tobytes()


@pytest.mark.parametrize("kind", ["fifo", "dev_zero"])
def test_cann_container_that_is_not_a_regular_file_is_refused(tmp_path, kind):
    fx, it_dir = _cann_dump(tmp_path)
    name = "Add.Default_Hostile-op0.1.2.1795336641750000"
    if kind == "fifo":
        os.mkfifo(it_dir / name)
    else:
        os.symlink("/dev/zero", it_dir / name)
    r = invoke("ingest", fx.root, "--archive", tmp_path / "a", "--run", "r", "-q", "--follow-symlinks")
    assert r.exit_code == 1, r.output
    assert_one_line(r, name, "FIFO" if kind == "fifo" else "character device", "refused")
    _assert_cann_bit_exact(fx, tmp_path / "a")
