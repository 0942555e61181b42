"""The CLI's one error handler and its exit codes (issue 16 item 3, issue 14 item 1):
0 ok / nothing found, 1 found, 2 usage or input error (and internal errors), 130
interrupted; one line, no traceback unless --debug; every option has help text."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
import typer
from conftest import DATA, ms_case
from typer.testing import CliRunner

import dumpdb
from dumpdb.archive import Archive
from dumpdb.cli import app

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cli_err") / "a.dumpdb"
    assert dumpdb.ingest(ms_case("c1_inputs_kernels_iter"), archive=path, run="c1").ok
    assert dumpdb.ingest(DATA / "msprobe" / "statistics_mix_md5", archive=path, run="msp").ok
    return path


def test_every_command_and_option_has_help():
    group = typer.main.get_command(app)
    assert len(group.commands) >= 17  # type: ignore[attr-defined]
    missing = [f"{cmd_name} {param.name}"
               for cmd_name, cmd in group.commands.items()
               for param in cmd.params
               if not getattr(param, "hidden", False) and not (getattr(param, "help", None) or "").strip()]
    missing += [f"{cmd_name}: no help text" for cmd_name, cmd in group.commands.items() if not cmd.help]
    missing += [f"--{p.name}" for p in group.params if not getattr(p, "help", None)]
    assert not missing, missing
    for cmd_name in group.commands:
        r = invoke(cmd_name, "--help")
        assert r.exit_code == 0 and "Usage:" in r.output, cmd_name


def test_version():
    r = invoke("--version")
    assert r.exit_code == 0 and r.stdout.strip() == f"dumpdb {dumpdb.__version__}"


def test_compare_with_no_pairs_exits_2_with_the_reason(archive):
    r = invoke("compare", "msp", "c1", "-a", archive, "--strategy", "exact", "--no-store")
    assert r.exit_code == 2
    assert "error: no pairs formed between msp and c1" in r.output and "--mapping" in r.output
    r = invoke("first-divergence", "msp", "c1", "-a", archive, "--strategy", "exact")
    assert r.exit_code == 2 and "no pairs formed" in r.output


def test_show_a_run_with_no_tensors(tmp_path):
    """A run row with nothing committed yet (an ingest interrupted before its first batch)."""
    a = tmp_path / "a.dumpdb"
    assert dumpdb.ingest(ms_case("c1_inputs_kernels_iter"), archive=a, run="c1").ok
    con = duckdb.connect(str(a / "catalog.duckdb"))
    con.execute("INSERT INTO runs (run, source_path, layout, status, ingest_started, dumpdb_version) VALUES "
                "('empty', '/x', 'mindspore-sync', 'interrupted', now(), '0.1.0')")
    con.close()
    r = invoke("show", "empty", "-a", a)
    assert r.exit_code == 0, r.output
    assert "tensors       0 = 0 stored + 0 statistics-only + 0 pruned\n" in r.stdout
    assert "ranks         -" in r.stdout and "None" not in r.stdout
    assert "status        interrupted (stopped " not in r.stdout  # no ingest_finished recorded: no time invented
    assert f"status        interrupted; complete it with: dumpdb ingest /x --run empty -a {a}" in r.stdout
    r = invoke("show", "empty", "-a", a, "-f", "json")
    assert r.exit_code == 0 and '"ranks": []' in r.stdout and '"ratio": null' in r.stdout
    r = invoke("runs", "-a", a, "-f", "csv")
    assert r.exit_code == 0 and "empty,interrupted" in r.stdout and "None" not in r.stdout


def test_unknown_run_is_one_line_exit_2(archive):
    r = invoke("show", "nope", "-a", archive)
    assert r.exit_code == 2 and r.output.count("\n") == 1 and r.output.startswith("error: no run 'nope'")


def test_bad_sql_is_one_line(archive):
    r = invoke("sql", "-a", archive, "SELEC 1")
    assert r.exit_code == 2
    assert r.output.splitlines() == ['error: SQL error: Parser Error: syntax error at or near "SELEC"']


def test_scan_exit_codes(archive):
    r = invoke("scan", "c1", "-a", archive, "-c", "nan")
    assert r.exit_code == 0 and "no hits" in r.stdout
    r = invoke("scan", "c1", "-a", archive, "-c", "all_zero")
    assert r.exit_code == 1


def test_unexpected_exception_is_one_line_and_debug_shows_the_traceback(archive, monkeypatch):
    def broken(self):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(Archive, "runs", broken)
    r = invoke("runs", "-a", archive)
    assert r.exit_code == 2
    assert r.output.splitlines() == [
        "error: internal error: RuntimeError: boom (run again with --debug for the traceback)"]
    r = invoke("--debug", "runs", "-a", archive)
    assert r.exit_code == 2 and "Traceback (most recent call last)" in r.output and "in broken" in r.output


def test_keyboard_interrupt_is_130_and_one_line(archive, monkeypatch):
    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(Archive, "runs", interrupted)
    r = invoke("runs", "-a", archive)
    assert r.exit_code == 130 and r.output == "interrupted\n"


def test_output_file_that_cannot_be_written_is_one_line(archive, tmp_path):
    r = invoke("sql", "-a", archive, "-f", "csv", "-o", tmp_path / "no" / "such" / "dir.csv", "SELECT 1")
    assert r.exit_code == 2 and r.output.startswith("error: ") and "No such file or directory" in r.output
    assert "Traceback" not in r.output


def test_closed_pipe_exits_0_without_traceback(archive):
    """`dumpdb sql ... | head -1`: the reader goes away; dumpdb ends quietly with 0."""
    proc = subprocess.Popen([sys.executable, "-m", "dumpdb", "sql", "-a", str(archive), "-f", "csv",
                             "SELECT * FROM range(2000000)"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, cwd=ROOT)
    first = proc.stdout.readline()
    if first != b"range\n":  # say why the command ended early
        proc.kill()
        raise AssertionError(f"first line {first!r}; stderr: {proc.stderr.read().decode()}")
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err


def test_no_query_is_a_usage_error(archive, tmp_path):
    r = runner.invoke(app, ["sql", "-a", str(archive)], input="")
    assert r.exit_code == 2 and "empty query" in r.output
    r = invoke("sql", "-a", archive, "--file", tmp_path / "missing.sql")
    assert r.exit_code == 2 and "missing.sql: cannot read the query" in r.output
    r = invoke("sql", "-a", archive, "-p", "novalue", "SELECT 1")
    assert r.exit_code == 2 and "write NAME=VALUE" in r.output


def test_interrupt_while_modules_load_is_one_line_130(tmp_path):
    """Ctrl-C before the CLI module has finished importing (typer, rich, DuckDB load):
    'interrupted', exit 130, no traceback. The interrupt is raised by an import hook
    at the moment typer is imported, as a real Ctrl-C there would."""
    code = ("import sys, runpy\n"
            "class Interrupt:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'typer':\n"
            "            raise KeyboardInterrupt\n"
            "sys.meta_path.insert(0, Interrupt())\n"
            "sys.argv = ['dumpdb', 'sql', 'SELECT 1']\n"
            "runpy.run_module('dumpdb', run_name='__main__')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert proc.returncode == 130 and proc.stderr == "interrupted\n"


def test_truncated_catalog_is_one_line_in_every_command(tmp_path, monkeypatch):
    """Issue 14: a truncated catalog.duckdb gave raw DuckDB tracebacks; now one line, exit 2
    (or an answer where DuckDB can still give one)."""
    import shutil
    import types

    from dumpdb.catalog import connection

    # Each open judges a truncated file 5 times (another process's migration may be renaming
    # a new file into place) with 1 s of pauses in all: the retries run, without the pauses.
    pauses: list[float] = []
    monkeypatch.setattr(connection, "time", types.SimpleNamespace(sleep=pauses.append))
    a = tmp_path / "a.dumpdb"
    assert dumpdb.ingest(ms_case("c1_inputs_kernels_iter"), archive=a, run="c1").ok
    catalog = a / "catalog.duckdb"
    catalog.write_bytes(catalog.read_bytes()[: catalog.stat().st_size // 2])
    for args in (["sql", "SELECT * FROM tensors"], ["runs"], ["show", "c1"], ["scan", "c1"], ["verify"], ["gc"],
                 ["export", "c1", "--to", str(tmp_path / "b.zip")], ["tables"], ["schema"],
                 ["prune", "c1", "--keep-stats"], ["rm", "c1", "--yes"],
                 ["ingest", str(ms_case("c1_inputs_kernels_iter")), "-r", "again", "-q"]):
        r = invoke(*args, "-a", a)
        assert "Traceback" not in r.output, args
        assert r.exit_code in (0, 1, 2), (args, r.output)
        if r.exit_code == 2:
            assert r.output.rstrip("\n").count("\n") == 0 and r.output.startswith("error: "), (args, r.output)
    assert pauses  # the truncation was judged again before it was reported
    shutil.rmtree(a)


def test_sql_shell_runs_statements_until_ctrl_d(archive, capsys):
    """`dumpdb sql` with no query on a terminal: statements end with ';' and may span lines;
    an error is one line and the prompt goes on. Driven through prompt_toolkit's pipe input."""
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    from dumpdb.cli import sql_shell

    with create_pipe_input() as keys:
        keys.send_text("SELECT count(*) AS n\r FROM tensors WHERE run = 'c1';\rSELEC 1;\rSELECT 'dumpdb[torch]' AS s;\r")
        keys.send_text("\x04")  # Ctrl-D
        sql_shell(Archive(archive), "csv", None, input=keys, output=DummyOutput())
    out = capsys.readouterr()
    assert out.out.splitlines()[-4:] == ["n", "42", "s", "dumpdb[torch]"]
    assert 'error: SQL error: Parser Error: syntax error at or near "SELEC"' in out.err


def test_rm_without_yes_and_no_terminal_refuses_clearly(archive):
    r = runner.invoke(app, ["rm", "c1", "-a", str(archive)], input="")
    assert r.exit_code == 2 and "pass --yes" in r.output
    assert dumpdb.open(archive).sql_rows("SELECT count(*) FROM runs WHERE run = 'c1'")[1] == [(1,)]
