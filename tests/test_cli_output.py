"""CLI output that fits where it goes (issue 16): every command that prints rows, run as a
real process with stdout a pipe and COLUMNS=80, prints every cell in full; one test per
--format; user text is never rich markup; absent values are empty (csv) or null (json)."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import DATA, ms_case

import dumpdb

ROOT = Path(__file__).resolve().parent.parent
# The longest op name of the e1 case: a rich table at 80 columns used to cut it with '…'.
LONG_OP = ("Default_network-WithLossCell__loss_fn-SoftmaxCrossEntropyWithLogits_"
           "SparseSoftmaxCrossEntropyWithLogits-op0")


def dumpdb_cli(*args, stdin: str | None = None, columns: int = 80) -> subprocess.CompletedProcess:
    """``python -m dumpdb ARGS`` with stdout and stderr pipes (not a terminal)."""
    env = dict(os.environ, COLUMNS=str(columns), PYTHONPATH=str(ROOT))
    env.pop("DUMPDB_ARCHIVE", None)
    return subprocess.run([sys.executable, "-m", "dumpdb", *map(str, args)], input=stdin, capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=300)


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cli_out") / "nan archive.dumpdb"  # a space: hints must quote it
    assert dumpdb.ingest(ms_case("e1_nan_inf_overflow"), archive=path, run="nan").ok
    return path


QUERY = ("SELECT 1 AS n, 'dumpdb[torch]' AS hint, NULL AS absent, [1, 2] AS shape, 'nan'::DOUBLE AS x, "
         "repeat('abcdefghij', 20) AS wide")


def test_sql_table_in_a_pipe_prints_every_cell_in_full(archive):
    r = dumpdb_cli("sql", "-a", archive, QUERY)
    assert r.returncode == 0, r.stderr
    assert "…" not in r.stdout
    assert "abcdefghij" * 20 in r.stdout  # 200 characters on one line, COLUMNS=80 notwithstanding
    assert "dumpdb[torch]" in r.stdout  # not eaten as rich markup
    assert "None" not in r.stdout and "1 row" in r.stdout


def test_format_csv(archive):
    r = dumpdb_cli("sql", "-a", archive, "-f", "csv", QUERY)
    assert r.returncode == 0, r.stderr
    rows = list(csv.reader(io.StringIO(r.stdout)))
    assert rows == [["n", "hint", "absent", "shape", "x", "wide"],
                    ["1", "dumpdb[torch]", "", "[1, 2]", "nan", "abcdefghij" * 20]]


def test_format_tsv(archive):
    r = dumpdb_cli("sql", "-a", archive, "-f", "tsv", QUERY)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["n\thint\tabsent\tshape\tx\twide",
                                     "1\tdumpdb[torch]\t\t[1, 2]\tnan\t" + "abcdefghij" * 20]


def test_format_json(archive):
    r = dumpdb_cli("sql", "-a", archive, "-f", "json", QUERY)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [{"n": 1, "hint": "dumpdb[torch]", "absent": None, "shape": [1, 2], "x": "nan",
                                     "wide": "abcdefghij" * 20}]


def test_format_ndjson(archive):
    r = dumpdb_cli("sql", "-a", archive, "-f", "ndjson",
                   "SELECT iteration, count(*) AS n FROM tensors GROUP BY ALL ORDER BY iteration")
    assert r.returncode == 0, r.stderr
    assert [json.loads(line) for line in r.stdout.splitlines()] == [{"iteration": 0, "n": 195},
                                                                     {"iteration": 1, "n": 195}]


def test_format_markdown(archive):
    r = dumpdb_cli("sql", "-a", archive, "-f", "markdown", "SELECT 'a|b' AS s, NULL AS absent, 2 AS n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["| s | absent | n |", "| --- | --- | --- |", "| a\\|b |  | 2 |"]


def test_format_parquet_needs_output_and_keeps_types(archive, tmp_path):
    r = dumpdb_cli("sql", "-a", archive, "-f", "parquet", "SELECT 1")
    assert r.returncode == 2 and "needs --output" in r.stderr
    out = tmp_path / "t.parquet"
    r = dumpdb_cli("sql", "-a", archive, "-f", "parquet", "-o", out, "SELECT tensor_id, shape FROM tensors")
    assert r.returncode == 0, r.stderr
    table = pq.read_table(out)
    assert table.num_rows == 390 and str(table.schema.field("shape").type) == "list<element: int64>"


def test_format_table_to_a_file(archive, tmp_path):
    out = tmp_path / "t.txt"
    r = dumpdb_cli("scan", "nan", "-a", archive, "-f", "table", "-o", out)
    assert r.returncode == 1  # hits found
    assert r.stdout == "" and LONG_OP in out.read_text()


def test_unknown_format_is_a_usage_error(archive):
    r = dumpdb_cli("sql", "-a", archive, "-f", "xml", "SELECT 1")
    assert r.returncode == 2 and r.stderr.startswith("error: unknown --format 'xml'")


def test_sql_reads_stdin_and_binds_parameters(archive):
    r = dumpdb_cli("sql", "-a", archive, "-", "-p", "run=nan", "--format", "csv",
                   stdin="SELECT count(*) FROM tensors WHERE run = $run")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[1] == "390"


def test_sql_file_option(archive, tmp_path):
    q = tmp_path / "q.sql"
    q.write_text("SELECT count(*) AS n FROM tensors WHERE iteration = $it\n")
    r = dumpdb_cli("sql", "-a", archive, "--file", q, "-p", "it=1", "-f", "csv")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["n", "195"]


def test_runs_and_show_in_a_pipe(archive):
    r = dumpdb_cli("runs", "-a", archive)
    assert r.returncode == 0, r.stderr
    source = str(ms_case("e1_nan_inf_overflow"))
    assert source in r.stdout and "…" not in r.stdout
    r = dumpdb_cli("runs", "-a", archive, "-f", "json")
    (row,) = json.loads(r.stdout)
    assert row["run"] == "nan" and row["tensors"] == 390 and row["framework"] == "MindSpore"
    r = dumpdb_cli("show", "nan", "-a", archive)
    assert r.returncode == 0, r.stderr
    assert source in r.stdout and "iterations    0, 1" in r.stdout
    r = dumpdb_cli("show", "nan", "-a", archive, "-f", "json")
    (info,) = json.loads(r.stdout)
    assert info["iterations"] == [0, 1] and info["tensors"] == 390 and info["source_path"] == source


def test_scan_in_a_pipe(archive):
    r = dumpdb_cli("scan", "nan", "-a", archive)
    assert r.returncode == 1, r.stderr  # NaN/Inf found
    assert LONG_OP in r.stdout and "x = self.sparse_softmax_cross_entropy(logits, labels)" in r.stdout
    assert "…" not in r.stdout
    r = dumpdb_cli("scan", "nan", "-a", archive, "-c", "nan", "-f", "csv")
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert r.returncode == 1 and rows and {row["check"] for row in rows} == {"nan"}
    r = dumpdb_cli("scan", "nan", "-a", archive, "--list", "-f", "json")
    assert r.returncode == 0 and "tensor_too_large" in {c["check"] for c in json.loads(r.stdout)}


def test_compare_and_first_divergence_in_a_pipe(archive):
    # msprobe's rules list this long op among the failing pairs (the precision rules judge it otherwise)
    r = dumpdb_cli("compare", "nan:0", "nan:1", "-a", archive, "--no-store", "--rules", "msprobe")
    assert r.returncode == 0, r.stderr
    assert "Default_network-WithLossCell__backbone-LeNet5_relu-ReLU_ReLU-op2" in r.stdout and "…" not in r.stdout
    assert "use --show" in r.stdout and "--max-rows" not in r.stdout  # the footer names compare's own option
    assert "None" not in r.stdout and "position -:" in r.stdout  # a parameter has no execution position
    r = dumpdb_cli("compare", "nan:0", "nan:1", "-a", archive, "--no-store", "-f", "csv")
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert len(rows) == 195 and "pairs" in r.stderr  # rows on stdout, the summary on stderr
    r = dumpdb_cli("first-divergence", "nan:0", "nan:1", "-a", archive, "--rules", "msprobe")
    assert r.returncode == 1 and "first divergence" in r.stdout
    assert "Gradients_Default_network-WithLossCell__backbone-LeNet5_conv2-Conv2d_Grad_Conv2D_Conv2DBackpropFilter-op0" \
        in r.stdout
    r = dumpdb_cli("first-divergence", "nan:0", "nan:1", "-a", archive, "--rules", "msprobe", "-f", "json")
    (fd,) = json.loads(r.stdout)
    assert r.returncode == 1 and fd["result"] == "error" and isinstance(fd["path"], list)


def test_tables_schema_layouts(archive):
    r = dumpdb_cli("tables", "-a", archive, "-f", "csv")
    assert r.returncode == 0, r.stderr
    counts = {row["table"]: int(row["rows"]) for row in csv.DictReader(io.StringIO(r.stdout))}
    assert counts["tensors"] == 390 and counts["runs"] == 1 and "ingest_errors" in counts
    r = dumpdb_cli("schema", "tensors", "-a", archive, "-f", "json")
    columns = {c["column"]: c["type"] for c in json.loads(r.stdout)}
    assert columns["shape"] == "BIGINT[]" and columns["op_name"] == "VARCHAR"
    r = dumpdb_cli("schema", "nope", "-a", archive)
    assert r.returncode == 2 and "no table 'nope'" in r.stderr and "tensors" in r.stderr
    r = dumpdb_cli("layouts")
    assert r.returncode == 0 and "…" not in r.stdout
    assert "step{N}/rank{R}|proc{PID}/dump.json [+ dump_tensor_data/]" in r.stdout


def test_hints_name_the_archive_given(archive, tmp_path):
    src = tmp_path / "dump"
    import shutil

    shutil.copytree(ms_case("c1_inputs_kernels_iter"), src)
    bad = sorted(src.rglob("*.npy"))[0]
    bad.write_bytes(bad.read_bytes()[:40])
    target = tmp_path / "my archive"
    r = dumpdb_cli("ingest", src, "-a", target, "-q")
    assert r.returncode == 1
    assert f"dumpdb sql -a '{target}' " in r.stderr


def test_msprobe_statistics_case_prints_in_full(tmp_path):
    """msprobe op names are long (Module.layer1.0.conv1.Conv2d.forward.0...): full in a pipe."""
    a = tmp_path / "msp"
    r = dumpdb_cli("ingest", DATA / "msprobe" / "statistics_mix_md5", "-a", a, "-q", "-r", "msp")
    assert r.returncode == 0, r.stderr
    names = [row[0] for row in dumpdb.open(a).sql_rows("SELECT op_name FROM tensors ORDER BY length(op_name) DESC")[1]]
    r = dumpdb_cli("sql", "-a", a, "SELECT op_name FROM tensors ORDER BY length(op_name) DESC", "--max-rows", "0")
    assert r.returncode == 0 and names[0] in r.stdout and "…" not in r.stdout


def test_table_on_a_narrow_terminal_wraps_and_never_cuts():
    """On a terminal (here a forced 60-column one) long cells fold onto more lines: every
    character is still there, nothing is replaced by an ellipsis."""
    from rich.console import Console

    from dumpdb.render.tables import Rows, render_table

    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=60, color_system=None)
    render_table(Rows(["op_name", "code_text"], [(LONG_OP, "x = self.sparse_softmax_cross_entropy(logits, labels)")]),
                 console)
    lines = buf.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 60 and "…" not in buf.getvalue()
    cells = ["".join(line.split("│")[i].strip() for line in lines if line.startswith("│")) for i in (1, 2)]
    assert cells[0] == LONG_OP
    assert cells[1].replace(" ", "") == "x=self.sparse_softmax_cross_entropy(logits,labels)"


def test_too_many_columns_for_the_terminal_print_as_records(archive):
    """`SELECT * FROM tensors` has ~45 columns: squeezed into 80 terminal columns rich would
    reduce every cell to nothing. Such rows print as records (a column per line), in full."""
    from rich.console import Console

    from dumpdb.render.tables import Rows, render_table

    names, rows = dumpdb.open(archive).sql_rows("SELECT * FROM tensors ORDER BY tensor_id LIMIT 2")
    assert len(names) > 30
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=80, color_system=None)
    render_table(Rows(names, rows), console)
    lines = buf.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 80 and "…" not in buf.getvalue()
    assert sum(1 for line in lines if line.startswith("row ")) == 2
    value_of = {}
    for line in lines:
        parts = line.split("│")
        if len(parts) == 4 and parts[1].strip():
            value_of.setdefault(parts[1].strip(), parts[2].strip())
    assert value_of["tensor_id"] == str(rows[0][0]) and value_of["run"] == "nan"
    assert set(names) <= set(value_of)


def test_sql_does_not_import_numpy_pyarrow_or_zarr(archive):
    """Start-up (issue 16 item 7): `dumpdb sql` loads only what it uses; numpy, pyarrow
    and zarr cost about 0.3 s and are needed only for tensors and Parquet."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for fmt in ("table", "csv"):
        proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "dumpdb", "sql", "-a", str(archive), "-f",
                               fmt, "SELECT count(*) FROM tensors"], capture_output=True, text=True, env=env,
                              cwd=ROOT, timeout=300)
        assert proc.returncode == 0 and "390" in proc.stdout
        imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if "|" in line}
        assert not imported & {"numpy", "pyarrow", "zarr", "pyarrow.lib"}, fmt
        assert "duckdb" in imported
