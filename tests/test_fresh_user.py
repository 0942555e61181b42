"""What a new user does first works as the README shows it (issue 30, items 5 and 7)."""

from __future__ import annotations

from conftest import ms_case
from typer.testing import CliRunner

import dumpdb
from dumpdb.cli import app


def test_ingest_worker_then_commit_from_no_archive(tmp_path):
    """README "Scaling out": `ingest-worker ... --part node3` then `commit`, with no archive
    yet (it said `no archive there` until a commit had run once)."""
    archive = tmp_path / "A"
    runner = CliRunner()
    r = runner.invoke(app, ["ingest-worker", str(ms_case("c1_inputs_kernels_iter")), "--archive", str(archive),
                            "--run", "job42", "--part", "node3", "-q"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["commit", "--archive", str(archive)])
    assert r.exit_code == 0, r.output
    assert dumpdb.open(archive).show("job42")["tensors"] == 42


def test_layouts_cite_public_documents_only():
    """`dumpdb layouts` named the project's own copies ("seed 001", "reference formats.md",
    "corpus ..."), which a pip user never sees: it names the public documents."""
    r = CliRunner().invoke(app, ["layouts", "-f", "csv"])
    assert r.exit_code == 0
    assert r.output.splitlines()[0] == "layout,description,documented in"
    for internal in ("seed 0", "formats.md", "corpus "):
        assert internal not in r.output, internal
    assert "'Dump功能调试'" in r.output and "msprobe 26.2.0" in r.output and "Dump Data Collection" in r.output
