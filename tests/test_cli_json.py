"""``--format json`` of the report commands (issue 27): each prints one JSON object of the
report its text shows, checked against the archive itself, on one small real MindSpore case."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import dumpdb
from dumpdb.catalog import latest_version
from dumpdb.cli import app
from tests.conftest import ms_case

CASE = "c1_inputs_kernels_iter"


def run_json(*args, code: int = 0) -> dict:
    r = CliRunner().invoke(app, [str(a) for a in args])
    assert r.exit_code == code, r.output
    return json.loads(r.stdout)


def count(archive, query: str) -> int:
    return dumpdb.open(archive).sql(query).column(0)[0].as_py()


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """(archive, the ingest's JSON report): run c1 ingested through the CLI."""
    archive = tmp_path_factory.mktemp("json") / "a.dumpdb"
    report = run_json("ingest", ms_case(CASE), "-a", archive, "--run", "c1", "-q", "--format", "json")
    return archive, report


def test_ingest_json_is_the_report(made):
    archive, report = made
    assert report["run"] == "c1" and report["archive"] == str(archive) and report["ok"] is True
    assert report["tensors_added"] == count(archive, "SELECT count(*) FROM tensors WHERE run = 'c1'") > 0
    assert report["errors"] == [] and report["bytes_stored"] > 0
    assert report["ratio"] == pytest.approx(report["bytes_in"] / report["bytes_stored"])


def test_verify_json(made):
    archive, _ = made
    report = run_json("verify", "-a", archive, "-f", "json")
    stored = count(archive, "SELECT count(DISTINCT content_hash) FROM tensors WHERE content_hash IS NOT NULL")
    assert report["ok"] is True and report["damaged"] == {} and report["blobs_checked"] == stored > 0


def test_export_import_json(made, tmp_path):
    archive, _ = made
    bundle = tmp_path / "b.zip"
    exported = run_json("export", "c1", "-a", archive, "--to", bundle, "-f", "json")
    assert exported == {"runs": ["c1"], "bundle": str(bundle), "bytes": bundle.stat().st_size}
    other = tmp_path / "other.dumpdb"
    imported = run_json("import", bundle, "-a", other, "--rename", "c1=copy", "-f", "json")
    assert imported["runs_imported"] == ["copy"] and imported["runs_skipped"] == []
    assert imported["tensors"] == count(other, "SELECT count(*) FROM tensors WHERE run = 'copy'") > 0


def test_prune_gc_migrate_json(made, tmp_path):
    archive, _ = made
    stored = count(archive, "SELECT count(*) FROM tensors WHERE run = 'c1' AND content_hash IS NOT NULL "
                            "AND pruned_at IS NULL")
    pruned = run_json("prune", "c1", "-a", archive, "--keep-stats", "-f", "json")
    assert pruned == {"run": "c1", "iterations": None, "ranks": None, "tensors_pruned": stored}
    gc = run_json("gc", "-a", archive, "-f", "json")
    assert gc["reclaimed"] == gc["bytes_before"] - gc["bytes_after"] > 0
    assert run_json("migrate", "-a", archive, "-f", "json") == {"applied": [], "schema_version": latest_version()}


def test_report_format_is_a_typed_choice(made):
    archive, _ = made
    r = CliRunner().invoke(app, ["gc", "-a", str(archive), "-f", "csv"])
    assert r.exit_code == 2 and "unknown --format 'csv'; use one of text, json" in r.output
