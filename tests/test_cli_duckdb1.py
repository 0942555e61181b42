"""The catalog opens in DuckDB 1.x (issue 16 item 6): users' DuckDB CLI and libraries are
1.x, while dumpdb writes with DuckDB 2. A throwaway venv with the latest `duckdb<2` from
PyPI (cached under ~/.cache, keyed by Python version, so reruns are fast) opens an
archive's catalog read-only in a subprocess and counts its tensors."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from conftest import ms_case

import dumpdb

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dumpdb-tests"


def duckdb1_python() -> Path:
    """Python of a venv holding duckdb<2 (made once, reused)."""
    env_dir = CACHE / f"duckdb1-py{sys.version_info.major}.{sys.version_info.minor}"
    python = env_dir / "bin" / "python"
    if python.exists() and subprocess.run([python, "-c", "import duckdb"], capture_output=True).returncode == 0:
        return python
    venv.create(env_dir, with_pip=True, clear=True)
    proc = subprocess.run([python, "-m", "pip", "install", "-q", "duckdb<2"], capture_output=True, text=True,
                          timeout=600)
    if proc.returncode != 0:
        pytest.skip(f"cannot install duckdb<2 from the package index: {proc.stderr.strip()[-300:]}")
    return python


def test_duckdb_1x_opens_the_catalog(tmp_path):
    archive = tmp_path / "a.dumpdb"
    assert dumpdb.ingest(ms_case("c1_inputs_kernels_iter"), archive=archive, run="c1").ok
    dumpdb.open(archive).prune("c1", "0")  # a later write through another connection keeps the format
    python = duckdb1_python()
    code = ("import sys, duckdb; assert duckdb.__version__.startswith('1.'), duckdb.__version__; "
            "con = duckdb.connect(sys.argv[1], read_only=True); "
            "print(duckdb.__version__, con.sql('SELECT count(*) FROM tensors').fetchone()[0])")
    proc = subprocess.run([python, "-c", code, str(archive / "catalog.duckdb")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    version, count = proc.stdout.split()
    assert version.startswith("1.") and int(count) == 42


def test_duckdb_1x_opens_an_archive_migrated_from_schema_v1(tmp_path):
    """Issue 30: migrating kept the old file's storage format (DuckDB 2's default, which
    1.x refuses with "version number 999"); the migrated catalog is rewritten portable."""
    import shutil

    from conftest import DATA

    from dumpdb.catalog.connection import PORTABLE_STORAGE_NUMBER, storage_number

    archive = tmp_path / "old.dumpdb"
    shutil.copytree(DATA / "archives" / "schema_v1_c1.dumpdb", archive)
    assert storage_number(archive / "catalog.duckdb") > PORTABLE_STORAGE_NUMBER  # the case: a 2.x-only file
    a = dumpdb.open(archive)  # migrates
    assert storage_number(archive / "catalog.duckdb") <= PORTABLE_STORAGE_NUMBER
    assert a.show("c1")["tensors"] == 42
    assert dumpdb.ingest(ms_case("f_long_names"), archive=archive, run="f").tensors_added == 66
    ids = dumpdb.open(archive).sql("SELECT min(tensor_id) AS lo, max(tensor_id) AS hi FROM tensors").to_pylist()[0]
    assert (ids["lo"], ids["hi"]) == (1, 108)  # the tensor_id sequence went on from where it was
    code = ("import sys, duckdb; con = duckdb.connect(sys.argv[1], read_only=True); "
            "print(duckdb.__version__, con.sql('SELECT count(*) FROM tensors').fetchone()[0])")
    proc = subprocess.run([duckdb1_python(), "-c", code, str(archive / "catalog.duckdb")], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    version, count = proc.stdout.split()
    assert version.startswith("1.") and int(count) == 108
