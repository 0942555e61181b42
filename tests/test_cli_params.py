"""The CLI's parameter types (issue 27): choices listed in --help and refused in one line,
one KEY=VALUE type, ``ingest --store-url`` with ``--store`` as its former name. Nothing
here reads a dump past the option checks: each test is a parse or a refusal."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from dumpdb.cli import app
from dumpdb.compare.choices import MODES, RULES, STRATEGIES
from dumpdb.render.tables import FORMATS
from tests.conftest import ms_case

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "300"})


def test_help_lists_the_choices():
    out = invoke("compare", "--help").output
    for choices in (MODES, RULES, FORMATS, ("error", "warning")):
        assert "[" + "|".join(choices) + "]" in out, choices
    assert all(s in out for s in STRATEGIES)
    assert "[text|json]" in invoke("verify", "--help").output


@pytest.mark.parametrize("args, line", [
    (["compare", "a", "b", "--mode", "fast"], "unknown --mode 'fast'; use one of auto, tensor, statistics"),
    (["first-divergence", "a", "b", "--rules", "strict"], "unknown --rules 'strict'; use one of precision, msprobe"),
    (["compare", "a", "b", "--strategy", "exact,fuzzy"], "unknown --strategy 'fuzzy'"),
    (["compare", "a", "b", "--fail-on", "pass"], "unknown --fail-on 'pass'; use one of error, warning"),
    (["scan", "r", "-f", "xml"], "unknown --format 'xml'"),
    (["compare", "a", "b", "-t", "cosine"], "--threshold 'cosine': write NAME=VALUE"),
    (["compare", "a", "b", "-t", "cosine=high"], "--threshold 'cosine=high': 'high' is not a number"),
    (["import", "b.zip", "--rename", "old="], "--rename 'old=': write OLD=NEW"),
    (["sql", "SELECT 1", "-p", "run"], "--param 'run': write NAME=VALUE (bound to $NAME in the query)"),
])
def test_a_refused_value_is_one_usage_line(args, line, tmp_path):
    r = invoke(*args, "-a", tmp_path / "none")
    assert r.exit_code == 2 and r.output.startswith(f"error: {line}"), r.output
    assert len(r.output.strip().splitlines()) == 1  # before anything is opened: no archive is made
    assert not (tmp_path / "none").exists()


def test_a_secret_storage_option_is_never_shown(tmp_path):
    r = invoke("--storage-option", "hunter2hunter2", "sql", "SELECT 1", "-a", tmp_path)
    assert r.exit_code == 2 and "hunter2" not in r.output and "write KEY=VALUE" in r.output


@pytest.mark.parametrize("option", ["--store-url", "--store"])
def test_ingest_store_url_and_its_former_name(option, tmp_path):
    r = invoke("ingest", ms_case("c1_inputs_kernels_iter"), "-a", tmp_path / "a", option, "s3://", "-q")
    assert r.exit_code == 2 and "s3://: not a valid s3://BUCKET/PREFIX URL" in r.output
    assert "--store " not in invoke("ingest", "--help").output  # the former name is hidden


def test_ingest_store_and_store_url_disagreeing_is_refused(tmp_path):
    r = invoke("ingest", ms_case("c1_inputs_kernels_iter"), "-a", tmp_path / "a",
               "--store-url", "s3://b/one", "--store", "s3://b/two")
    assert r.exit_code == 2 and "former name of --store-url" in r.output and not (tmp_path / "a").exists()


@pytest.mark.parametrize("option", ["--show", "--max-rows"])
def test_one_row_limit_name_and_its_former_name(option, tmp_path):
    from dumpdb.archive_dir import create_archive

    create_archive(tmp_path / "a")
    r = invoke("sql", "SELECT range AS n FROM range(5)", "-a", tmp_path / "a", option, "2")
    assert r.exit_code == 0, r.output
    rows = [line for line in r.stdout.splitlines() if line.strip(" │|").isdigit()]
    assert [int(x.strip(" │|")) for x in rows] == [0, 1] and "--show 0" in r.stdout
    assert "--max-rows" not in invoke("sql", "--help").output  # the former name is hidden
