"""Acceptance over the full real corpus (shared/corpus/mindspore-cpu), when it is beside
the repository as in CI. The same features are tested on tests/data without it; this
module checks every real case end to end through the CLI."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import dumpdb
from conftest import file_count, npy_payload
from dumpdb.cli import app

CORPUS = Path(os.environ.get("DUMPDB_CORPUS", Path(__file__).resolve().parents[2] / "shared" / "corpus"))
MS = CORPUS / "mindspore-cpu"
CASES = sorted(p.name for p in MS.iterdir() if p.is_dir() and not p.name.startswith("_")
               and p.name != "j_tensordump_pynative") if MS.is_dir() else []

pytestmark = pytest.mark.skipif(not CASES, reason=f"real corpus not found at {MS} (set DUMPDB_CORPUS)")


@pytest.fixture(scope="module")
def corpus_archive(tmp_path_factory):
    archive = tmp_path_factory.mktemp("corpus") / "corpus.dumpdb"
    runner = CliRunner()
    for case in CASES:
        result = runner.invoke(app, ["ingest", str(MS / case), "--archive", str(archive), "--run", case, "-q"])
        assert result.exit_code == 0, (case, result.output)
    return archive


@pytest.mark.parametrize("case", CASES)
def test_case_ingests_every_file_bit_exact(corpus_archive, case):
    root = MS / case
    files = sorted(root.rglob("*.npy"))
    a = dumpdb.open(corpus_archive)
    n = a.sql("SELECT count(*) AS n FROM tensors WHERE run = ?", [case])["n"][0].as_py()
    assert n == len(files)
    with a:
        for row, array in a.tensors("SELECT tensor_id, source_file FROM tensors WHERE run = ?", [case]):
            descr, shape, payload = npy_payload(root / row["source_file"])
            assert array.shape == shape and np.ascontiguousarray(array).tobytes() == payload


def test_a_tensor_all_is_few_files_and_idempotent(tmp_path):
    archive = tmp_path / "a.dumpdb"
    first = dumpdb.ingest(MS / "a_tensor_all", archive=archive, run="a")
    assert first.ok and first.tensors_added == 641
    files = file_count(archive)
    assert files < 100
    again = dumpdb.ingest(MS / "a_tensor_all", archive=archive, run="a")
    assert again.tensors_added == 0 and file_count(archive) == files
    info = dumpdb.open(archive).show("a")
    assert info["graphs"] == [0, 1] and info["iterations"] == [0, 1, 2, 3]
    assert dumpdb.open(archive).sql("SELECT count(*) AS n FROM tensors WHERE scope_name IS NULL")["n"][0].as_py() == 0
