"""A reader's kit: every bundle carries a README.md whose recipe reads every tensor without
dumpdb, from a directory bundle and from a ``.zip`` read in place; zarr attributes say what
each array holds.

The recipe is taken from the exported bundle's own README and run in a fresh Python that
does not import dumpdb; the tensors it returns are compared with the dump's ``.npy`` files
parsed independently (conftest.npy_payload), byte for byte.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import ms_case, npy_payload

import dumpdb
from dumpdb.catalog import schema

CASES = ("c1_inputs_kernels_iter", "d2_compare_fp16_bf16_iter0")  # inputs of 3 iterations; bfloat16 + float16
DRIVER = r"""
import hashlib, json, sys
from read_bundle import read_tensors
assert "dumpdb" not in sys.modules
out = []
for row, x in read_tensors(sys.argv[1]):
    out.append({"run": row["run"], "source_file": row["source_file"], "pruned": row["pruned_at"] is not None,
                "sha256": None if x is None else hashlib.sha256(x.tobytes()).hexdigest(),
                "shape": None if x is None else list(x.shape), "dtype": None if x is None else str(x.dtype)})
assert "dumpdb" not in sys.modules, "the recipe imported dumpdb"
json.dump({"tensors": out, "modules": sorted(m for m in sys.modules if m.split(".")[0] == "dumpdb")}, sys.stdout)
"""


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> tuple[Path, Path, int]:
    """(directory bundle, .zip bundle, pruned tensors) of both cases, iteration 2 of c1 pruned."""
    tmp = tmp_path_factory.mktemp("readme")
    archive = tmp / "a.dumpdb"
    for case in CASES:
        assert dumpdb.ingest(ms_case(case), archive=archive, run=case).ok
    a = dumpdb.open(archive)
    pruned = a.prune("c1_inputs_kernels_iter", "2")
    assert pruned > 0
    return a.export(list(CASES), tmp / "b"), a.export(list(CASES), tmp / "b.zip"), pruned


def _readme(bundle: Path) -> str:
    if bundle.is_dir():
        return (bundle / "README.md").read_text(encoding="utf-8")
    with zipfile.ZipFile(bundle) as z:
        return z.read("README.md").decode("utf-8")


def _recipe(readme: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert len(blocks) == 1
    return blocks[0]


@pytest.mark.parametrize("kind", ["directory", "zip"])
def test_readme_recipe_reads_every_tensor_bit_exact_without_dumpdb(bundles, tmp_path, kind):
    bundle = bundles[0] if kind == "directory" else bundles[1]
    (tmp_path / "read_bundle.py").write_text(_recipe(_readme(bundle)), encoding="utf-8")  # as printed
    (tmp_path / "driver.py").write_text(DRIVER, encoding="utf-8")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}  # no PYTHONPATH: nothing points at dumpdb
    listed = subprocess.run([sys.executable, "read_bundle.py", str(bundle)], capture_output=True, text=True,
                            cwd=tmp_path, env=env, timeout=300)  # the README's own usage
    assert listed.returncode == 0, listed.stderr
    assert len(listed.stdout.splitlines()) == sum(len(list(ms_case(c).rglob("*.npy"))) for c in CASES)
    assert sum("no payload" in line for line in listed.stdout.splitlines()) == bundles[2]
    done = subprocess.run([sys.executable, "driver.py", str(bundle)], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["modules"] == []
    rows = result["tensors"]
    files = {case: sorted(p.relative_to(ms_case(case)).as_posix() for p in ms_case(case).rglob("*.npy"))
             for case in CASES}
    assert sorted((r["run"], r["source_file"]) for r in rows) == sorted(
        (case, f) for case, names in files.items() for f in names)  # every tensor of both runs
    read = pruned = 0
    for r in rows:
        descr, shape, payload = npy_payload(ms_case(r["run"]) / r["source_file"])
        if r["pruned"]:
            assert r["sha256"] is None  # no blobs entry: no payload, as the README says
            pruned += 1
            continue
        assert r["sha256"] == hashlib.sha256(payload).hexdigest(), r["source_file"]
        assert tuple(r["shape"]) == shape
        read += 1
    assert pruned == bundles[2] and read == len(rows) - pruned
    assert {r["dtype"] for r in rows if r["dtype"]} >= {"bfloat16", "float16", "float32"}


def test_readme_lists_every_table_and_column_with_the_schema_comments(bundles):
    bundle = bundles[0]
    readme = _readme(bundle)
    manifest = json.loads((bundle / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["files"]["README.md"]["sha256"] == hashlib.sha256((bundle / "README.md").read_bytes()).hexdigest()
    for name, info in manifest["tables"].items():
        section = readme.split(f"\n### {name}\n", 1)[1].split("\n### ", 1)[0]
        comments = {c.name: c.comment for c in schema.table(name).columns}
        for column in pq.read_schema(bundle / info["file"]).names:
            assert f"| `{column}` |" in section, (name, column)
            if comments.get(column):
                assert comments[column].replace("|", "\\|") in section
        assert f"| `{name}` | {info['rows']} | {schema.table(name).comment}" in readme
    assert "zarr.storage.ZipStore" in readme and "no `blobs` entry" in readme
    assert _readme(bundles[1]).split("\n", 1)[0] == readme.split("\n", 1)[0]  # the .zip carries it too


def test_zarr_attributes_say_what_each_array_holds_and_point_to_the_catalog(bundles):
    store = bundles[0] / "tensors.zarr"
    root = json.loads((store / "zarr.json").read_text())["attributes"]["dumpdb"]
    assert root["kind"] == "tensor-store" and "catalog" in root["catalog"]
    arrays = [json.loads(p.read_text())["attributes"]["dumpdb"] for p in store.rglob("zarr.json")
              if json.loads(p.read_text())["node_type"] == "array"]
    assert arrays and {a["kind"] for a in arrays} <= {"pack", "tensor"}
    for attrs in arrays:
        assert attrs["holds"] and "catalog" in attrs["catalog"] and "blobs" in attrs["find"]


def test_bundle_with_readme_imports(bundles, tmp_path):
    from dumpdb.archive import create_archive

    create_archive(tmp_path / "b.dumpdb")
    imported = dumpdb.open(tmp_path / "b.dumpdb").import_bundle(bundles[1])
    assert sorted(imported.runs_imported) == sorted(CASES)
