"""dumpdb import of hostile bundles: every case refused with one BundleError line, before
anything enters the archive; nothing left in the temp directory; re-signed manifests with
altered payloads caught by re-hashing (issue 14)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import ingest_runs, ms_case, npy_files, npy_payload, private_copy
from typer.testing import CliRunner

import dumpdb
from dumpdb.cli import app
from dumpdb.errors import BundleError, PayloadMissing

SRC = ms_case("c1_inputs_kernels_iter")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("bundles")
    archive = root / "src.dumpdb"
    dumpdb.ingest(SRC, archive=archive, run="c1")
    return dumpdb.open(archive).export("c1", root / "c1.bundle")


@pytest.fixture
def bundle(exported, tmp_path):
    """A private copy of an honest directory bundle of run c1."""
    dst = tmp_path / "c1.bundle"
    shutil.copytree(exported, dst)
    return dst


@pytest.fixture(scope="module")
def _target_once(tmp_path_factory):
    return ingest_runs(tmp_path_factory.mktemp("target") / "target.dumpdb", f="f_long_names")


@pytest.fixture
def target(_target_once, tmp_path):
    """An archive with another run in it, to import into: a private copy of one ingest per
    module (33 tests import into it; a copy is ~0.01 s, an ingest ~0.4 CPU s and its fsyncs)."""
    return private_copy(_target_once, tmp_path)


def snapshot(archive: Path) -> tuple:
    """What must not change when an import is refused: row counts and every store file."""
    a = dumpdb.open(archive)
    counts = tuple(a.sql(f"SELECT count(*) AS n FROM {t}")["n"][0].as_py()
                   for t in ("runs", "tensors", "blobs", "arrays", "ops", "ingest_errors"))
    files = sorted(p.relative_to(archive).as_posix() for p in archive.rglob("*")
                   if p.is_file() and not p.is_relative_to(archive / "locks"))
    return counts, tuple(f for f in files if not f.startswith("catalog."))


def manifest(bundle: Path) -> dict:
    return json.loads((bundle / "manifest.json").read_text())


def write_manifest(bundle: Path, m: dict | str) -> None:
    (bundle / "manifest.json").write_text(m if isinstance(m, str) else json.dumps(m))


def resign(bundle: Path) -> None:
    """Recompute every listed file's size and sha256, as a forger would."""
    m = manifest(bundle)
    for rel in m["files"]:
        data = (bundle / rel).read_bytes()
        m["files"][rel] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    write_manifest(bundle, m)


def edit_table(bundle: Path, table: str, fn) -> None:
    path = bundle / "catalog" / f"{table}.parquet"
    pq.write_table(fn(pq.read_table(path)), path)
    resign(bundle)


def set_column(table: pa.Table, name: str, values: list) -> pa.Table:
    i = table.schema.get_field_index(name)
    return table.set_column(i, name, pa.array(values, table.schema.field(name).type))


def zip_dir(bundle: Path, to: Path, rename: dict[str, str] | None = None) -> Path:
    with zipfile.ZipFile(to, "w", compression=zipfile.ZIP_STORED) as z:
        for path in sorted(p for p in bundle.rglob("*") if p.is_file()):
            rel = path.relative_to(bundle).as_posix()
            z.write(path, (rename or {}).get(rel, rel))
    return to


def refused(target: Path, bundle: Path, match: str, **options) -> None:
    before = snapshot(target)
    with pytest.raises(BundleError, match=match) as info:
        dumpdb.open(target).import_bundle(bundle, **options)
    assert "\n" not in str(info.value) and str(bundle) in str(info.value)
    assert snapshot(target) == before
    assert not list(target.glob(".dumpdb-import-*"))  # the extraction directory is gone too


# -- paths that leave the bundle ------------------------------------------------------
def test_array_path_with_dotdot_is_refused(bundle, target):
    # points at the target archive's own store: reading it would import another archive's bytes
    edit_table(bundle, "blobs", lambda t: set_column(
        t, "array_path", ["../../target.dumpdb/tensors.zarr/" + p for p in t["array_path"].to_pylist()]))
    refused(target, bundle, "array_path .* is not a path of the bundle's tensor store")


def test_absolute_array_path_is_refused(bundle, target):
    edit_table(bundle, "blobs", lambda t: set_column(
        t, "array_path", [str(target / "tensors.zarr" / p) for p in t["array_path"].to_pylist()]))
    refused(target, bundle, "array_path")


def test_array_path_not_among_the_bundle_arrays_is_refused(bundle, target):
    edit_table(bundle, "blobs", lambda t: set_column(t, "array_path", ["packs/float32/elsewhere"] * t.num_rows))
    refused(target, bundle, "not among the bundle's arrays")


@pytest.mark.parametrize("path", ["../outside.parquet", "/etc/passwd", "catalog/../../x.parquet",
                                  "catalog\\runs.parquet", "catalog//runs.parquet"])
def test_table_paths_that_traverse_are_refused(bundle, target, path):
    m = manifest(bundle)
    m["tables"]["runs"]["file"] = path
    write_manifest(bundle, m)
    refused(target, bundle, "file of table runs .* (leaves the bundle|not a relative path)")


def test_manifest_file_entry_that_traverses_is_refused(bundle, target, tmp_path):
    (tmp_path / "secret").write_text("x")
    m = manifest(bundle)
    m["files"]["../secret"] = {"bytes": 1, "sha256": hashlib.sha256(b"x").hexdigest()}
    write_manifest(bundle, m)
    refused(target, bundle, "leaves the bundle")


@pytest.mark.parametrize("name", ["../evil.txt", "/tmp/evil.txt", "catalog/../../evil.txt", "C:/evil.txt"])
def test_zip_members_with_unsafe_names_are_refused(bundle, target, tmp_path, name):
    z = zip_dir(bundle, tmp_path / "b.zip")
    with zipfile.ZipFile(z, "a") as zf:
        zf.writestr(name, "evil")
    refused(target, z, "zip member .* (leaves the bundle|not a relative path)")
    assert not (tmp_path / "evil.txt").exists() and not Path("/tmp/evil.txt").exists()


def test_zip_symlink_member_is_refused(bundle, target, tmp_path):
    z = zip_dir(bundle, tmp_path / "b.zip")
    info = zipfile.ZipInfo("catalog/link")
    info.external_attr = (0o120777 << 16)
    with zipfile.ZipFile(z, "a") as zf:
        zf.writestr(info, "/etc/passwd")
    refused(target, z, "symlink")


def test_directory_bundle_with_a_symlink_is_refused(bundle, target, tmp_path):
    (tmp_path / "outside.parquet").write_bytes((bundle / "catalog" / "runs.parquet").read_bytes())
    (bundle / "catalog" / "runs.parquet").unlink()
    (bundle / "catalog" / "runs.parquet").symlink_to(tmp_path / "outside.parquet")
    refused(target, bundle, "symlink")


def test_a_fifo_or_device_is_refused_without_blocking(target, tmp_path):
    fifo = tmp_path / "b.zip"
    os.mkfifo(fifo)
    refused(target, fifo, "not a regular file")
    refused(target, Path("/dev/zero"), "not a regular file")


# -- the file list ------------------------------------------------------------------
def test_empty_files_does_not_skip_the_checks(bundle, target):
    m = manifest(bundle)
    m["files"] = {}
    write_manifest(bundle, m)
    refused(target, bundle, "not among the manifest's files|not in the manifest")


def test_unlisted_file_is_refused(bundle, target):
    (bundle / "tensors.zarr" / "extra").write_bytes(b"nobody vouched for me")
    refused(target, bundle, "tensors.zarr/extra is not in the manifest")


def test_listed_file_name_with_a_newline_is_refused_in_one_line(bundle, target):
    m = manifest(bundle)
    m["files"]["tensors.zarr/a\nb"] = {"bytes": 1, "sha256": "0" * 64}
    write_manifest(bundle, m)
    refused(target, bundle, "'tensors.zarr/a\\\\nb' holds a control character")


def test_unlisted_file_with_a_newline_in_its_name_is_named_in_one_line(bundle, target):
    (bundle / "tensors.zarr" / "extra\nline").write_bytes(b"nobody vouched for me")
    refused(target, bundle, "'tensors.zarr/extra\\\\nline' is not in the manifest")


def test_listed_file_missing_is_refused(bundle, target):
    rel = next(r for r in manifest(bundle)["files"] if r.startswith("tensors.zarr/packs"))
    (bundle / rel).unlink()
    refused(target, bundle, "is missing")


def test_altered_file_without_resigning_is_refused(bundle, target):
    path = bundle / "catalog" / "ops.parquet"
    raw = bytearray(path.read_bytes())
    raw[-20] ^= 1
    path.write_bytes(bytes(raw))
    refused(target, bundle, "catalog/ops.parquet is damaged")


# -- sizes: zip bombs, --max-bundle-size -----------------------------------------------
def test_zip_bomb_is_refused_before_extraction(bundle, target, tmp_path):
    big = 64 << 20  # 64 MiB of zeros, deflated to ~64 KiB
    m = manifest(bundle)
    digest = hashlib.sha256(bytes(big)).hexdigest()
    m["files"]["tensors.zarr/bomb"] = {"bytes": big, "sha256": digest}
    z = tmp_path / "bomb.zip"
    zip_dir(bundle, z)
    with zipfile.ZipFile(z, "a") as zf:
        zf.writestr(zipfile.ZipInfo("tensors.zarr/bomb"), bytes(big), compress_type=zipfile.ZIP_DEFLATED)
        zf.writestr("manifest.json.new", json.dumps(m))
    # put the forged manifest in place of the honest one
    z2 = tmp_path / "bomb2.zip"
    with zipfile.ZipFile(z) as src, zipfile.ZipFile(z2, "w") as dst:
        for info in src.infolist():
            if info.filename == "manifest.json":
                continue
            name = "manifest.json" if info.filename == "manifest.json.new" else info.filename
            dst.writestr(zipfile.ZipInfo(name), src.read(info), compress_type=info.compress_type)
    assert z2.stat().st_size < big / 100
    refused(target, z2, "expands .* times .*zip bomb")


def test_max_bundle_size_is_checked_before_anything_is_read(bundle, target, tmp_path):
    z = zip_dir(bundle, tmp_path / "b.zip")
    refused(target, z, "more than --max-bundle-size 1000", max_bundle_size=1000)
    refused(target, bundle, "more than --max-bundle-size 1000", max_bundle_size=1000)
    r = CliRunner().invoke(app, ["import", str(z), "-a", str(target), "--max-bundle-size", "1000"])
    assert r.exit_code == 2 and "max-bundle-size" in r.output


def test_zip_member_larger_than_declared_is_refused(bundle, target, tmp_path):
    m = manifest(bundle)
    rel = "catalog/ops.parquet"
    m["files"][rel]["bytes"] -= 1
    write_manifest(bundle, m)
    refused(target, zip_dir(bundle, tmp_path / "b.zip"), f"{rel} is .* bytes, the manifest says")


# -- malformed manifests: one line each, never a traceback ---------------------------------
MALFORMED = {
    "not JSON": "{not json",
    "a list": "[]",
    "not utf-8": b"\xff\xfe{}".decode("latin1"),
    "deep nesting": "[" * 100_000 + "]" * 100_000,
    "missing format": lambda m: m.pop("format"),
    "missing files": lambda m: m.pop("files"),
    "missing tables": lambda m: m.pop("tables"),
    "files a list": lambda m: m.update(files=[]),
    "negative size": lambda m: next(iter(m["files"].values())).update(bytes=-1),
    "size a string": lambda m: next(iter(m["files"].values())).update(bytes="12"),
    "sha256 not hex": lambda m: next(iter(m["files"].values())).update(sha256="zz"),
    "file entry not an object": lambda m: m["files"].update({next(iter(m["files"])): 3}),
    "runs empty": lambda m: m.update(runs=[]),
    "runs not strings": lambda m: m.update(runs=[1, 2]),
    "run not in the bundle": lambda m: m.update(runs=["c1", "ghost"]),
    "unknown table": lambda m: m["tables"].update(evil={"file": "catalog/runs.parquet"}),
    "blobs table missing": lambda m: m["tables"].pop("blobs"),
    "format_version a string": lambda m: m.update(format_version="1"),
    "newer schema": lambda m: m.update(schema_version=10_000),
    "tables a string": lambda m: m.update(tables="runs"),
}


@pytest.mark.parametrize("kind", list(MALFORMED))
def test_malformed_manifests_are_one_line_errors(bundle, target, kind):
    change = MALFORMED[kind]
    if isinstance(change, str):
        (bundle / "manifest.json").write_bytes(change.encode("latin1") if kind == "not utf-8" else change.encode())
    else:
        m = manifest(bundle)
        change(m)
        write_manifest(bundle, m)
    refused(target, bundle, ".")
    r = CliRunner().invoke(app, ["import", str(bundle), "-a", str(target)])
    assert r.exit_code == 2 and r.output.count("\n") == 1 and "Traceback" not in r.output, r.output


def test_bad_table_contents_are_one_line_errors(bundle, target):
    edit_table(bundle, "tensors", lambda t: t.append_column("evil_column", pa.array([1] * t.num_rows)))
    refused(target, bundle, "tensors has column.* evil_column")


def test_garbage_parquet_is_a_one_line_error(bundle, target):
    (bundle / "catalog" / "tensors.parquet").write_bytes(b"PAR1 garbage")
    resign(bundle)
    refused(target, bundle, "unreadable bundle")


def test_tensor_shape_disagreeing_with_its_payload_is_refused(bundle, target):
    edit_table(bundle, "tensors", lambda t: set_column(t, "nbytes", [n and n * 2 for n in t["nbytes"].to_pylist()]))
    refused(target, bundle, "says .* bytes")


# -- altered payloads under a re-signed manifest (acceptance) ----------------------------
def _alter_one_payload(bundle: Path, target: Path) -> str:
    """Re-encode a float32 pack with one element changed of a payload ``target`` does not
    hold (one it would store); re-sign the manifest. Returns the altered content hash."""
    import dumpdb.storage.store
    from dumpdb.storage.codecs import codec_for
    from dumpdb.storage.local import DurableLocalStore
    from dumpdb.storage.objects import ObjectStore
    from dumpdb.storage.shard import ShardTarget, encode_chunks, write_shard

    have = set(dumpdb.open(target).sql("SELECT content_hash FROM blobs")["content_hash"].to_pylist())
    blobs = pq.read_table(bundle / "catalog" / "blobs.parquet").to_pylist()
    blob = next(b for b in blobs if b["array_path"] and "float32" in b["array_path"] and b["elem_count"]
                and b["content_hash"] not in have)
    meta = json.loads((bundle / "tensors.zarr" / blob["array_path"] / "zarr.json").read_text())
    inner = meta["codecs"][0]["configuration"]["chunk_shape"][0]
    arr = dumpdb.storage.store.TensorStore(bundle / "tensors.zarr").read_pack_range(
        blob["array_path"], 0, meta["shape"][0]).copy()
    arr[blob["elem_offset"]] = np.float32(arr[blob["elem_offset"]]) + np.float32(1.0)
    objects = ObjectStore(DurableLocalStore(str(bundle / "tensors.zarr")))
    write_shard(ShardTarget(objects, f"{blob['array_path']}/c/0"), encode_chunks(arr, inner, codec_for(arr.dtype, inner * arr.dtype.itemsize).frame_codec()))
    resign(bundle)
    return blob["content_hash"]


def test_altered_payload_with_resigned_manifest_is_refused_and_dedup_stays_honest(bundle, target, tmp_path):
    bad = _alter_one_payload(bundle, target)
    refused(target, bundle, f"payload {bad} .* does not hash to its content_hash")
    refused(target, zip_dir(bundle, tmp_path / "b.zip"), "does not hash to its content_hash")
    dumpdb.ingest(SRC, archive=target, run="honest")  # the original dump, after the attempt
    with dumpdb.open(target) as a:
        rows = list(a.tensors("SELECT tensor_id, source_file FROM tensors WHERE run = 'honest'"))
        assert len(rows) == len(npy_files(SRC))
        for row, array in rows:
            assert array.tobytes() == npy_payload(SRC / row["source_file"])[2]


# -- nothing left behind -------------------------------------------------------------
def test_failed_imports_leave_nothing_in_the_temp_directory(bundle, target, tmp_path, monkeypatch):
    import tempfile

    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setenv("TMPDIR", str(tmp))
    _alter_one_payload(bundle, target)
    z = zip_dir(bundle, tmp_path / "b.zip")
    for source in (z, bundle):
        with pytest.raises(BundleError):
            dumpdb.open(target).import_bundle(source)
    assert list(tmp.iterdir()) == [] and not list(target.glob(".dumpdb-import-*"))


def test_honest_zip_still_imports_bit_exact(exported, target, tmp_path):
    z = zip_dir(exported, tmp_path / "c1.zip")
    report = dumpdb.open(target).import_bundle(z)
    assert report.runs_imported == ["c1"] and not list(target.glob(".dumpdb-import-*"))
    with dumpdb.open(target) as a:
        for row, array in a.tensors("SELECT tensor_id, source_file FROM tensors WHERE run = 'c1'"):
            assert array.tobytes() == npy_payload(SRC / row["source_file"])[2]


# -- export of a damaged archive --------------------------------------------------------
def test_export_with_a_missing_pack_shard_fails_and_writes_no_bundle(tmp_path):
    archive = tmp_path / "a.dumpdb"
    dumpdb.ingest(SRC, archive=archive, run="c1")
    a = dumpdb.open(archive)
    pack = a.sql("SELECT min(array_path) AS p FROM arrays WHERE kind = 'pack'")["p"][0].as_py()
    os.remove(archive / "tensors.zarr" / pack / "c" / "0")
    for to in (tmp_path / "out.zip", tmp_path / "out.bundle"):
        with pytest.raises(PayloadMissing, match=rf"{pack}: shard missing; run c1 op .* slot \d+ cannot be exported"):
            a.export("c1", to)
        assert not to.exists()
    assert not list(tmp_path.glob(".dumpdb-export-*"))
    r = CliRunner().invoke(app, ["export", "c1", "-a", str(archive), "--to", str(tmp_path / "x.zip")])
    assert r.exit_code == 2 and "shard missing" in r.output and not (tmp_path / "x.zip").exists()


# -- property-based: any manifest is a BundleError or a good import, never anything else -----
def _json_values():
    from hypothesis import strategies as st

    scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=30)
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) |
                        st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=12)


def test_random_manifests_raise_only_bundle_errors(exported):
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from dumpdb.archival import bundle_check as chk
    from dumpdb.catalog import latest_version

    honest = manifest(exported)
    tables = ("runs", "tensors", "ops", "execution_order", "graph_executions", "overflows", "call_stacks",
              "module_tree", "ingest_errors", "blobs", "arrays")

    def check(raw: bytes) -> None:
        try:
            chk.read_manifest(raw, exported, latest_version(), "dumpdb-bundle", 1, tables)
        except BundleError as exc:
            assert "\n" not in str(exc)

    @settings(max_examples=300, deadline=None)
    @given(value=_json_values(), key=st.sampled_from(["format", "format_version", "schema_version", "runs",
                                                      "tables", "files", None]),
           sub=st.sampled_from(["bytes", "sha256", "file", "rows", None]))
    def mutate(value, key, sub):
        m = json.loads(json.dumps(honest))
        if key is None:
            m = value
        elif sub is None or not isinstance(m[key], dict) or not m[key]:
            m[key] = value
        else:
            first = next(iter(m[key].values()))
            first[sub] = value
        check(json.dumps(m, allow_nan=True).encode())

    @settings(max_examples=200, deadline=None)
    @given(raw=st.binary(max_size=200))
    def garbage(raw):
        check(raw)

    mutate()
    garbage()


def test_mutated_manifests_through_import_never_raise_anything_else(exported, target, tmp_path):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    honest = (exported / "manifest.json").read_bytes()
    work = tmp_path / "b.bundle"
    shutil.copytree(exported, work)
    before = snapshot(target)

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(pos=st.integers(0, len(honest) - 1), byte=st.integers(0, 255))
    def flip(pos, byte):
        raw = bytearray(honest)
        raw[pos] = byte
        (work / "manifest.json").write_bytes(bytes(raw))
        try:
            report = dumpdb.open(target).import_bundle(work)
        except BundleError as exc:
            assert "\n" not in str(exc)
        else:  # a flip the manifest does not care about (whitespace, a date): the honest import
            assert report.runs_imported in ([], ["c1"])
            if report.runs_imported:
                dumpdb.open(target).remove_run("c1")

    flip()
    dumpdb.open(target).gc(grace=0)
    assert snapshot(target)[0][:3] == before[0][:3]


# -- issue 30, item 14: rows checked against each other, the manifest and their payloads ------------
def _edit_rows(bundle: Path, table: str, fn) -> None:
    """Change a table and, as a forger would, its declared rows and every file's signature."""
    edit_table(bundle, table, fn)
    m = manifest(bundle)
    m["tables"][table]["rows"] = pq.read_metadata(bundle / "catalog" / f"{table}.parquet").num_rows
    write_manifest(bundle, m)


def test_duplicate_tensor_rows_are_refused(bundle, target):
    _edit_rows(bundle, "tensors", lambda t: pa.concat_tables([t, t]))  # 84 rows for 42 tensors
    refused(target, bundle, r"tensors has 84 rows for 42 tensors: run 'c1' tensor_key .* appears 2 times")


def test_rows_of_a_run_the_manifest_does_not_list_are_refused(bundle, target):
    def add_other(t: pa.Table) -> pa.Table:
        other = set_column(t, "run", ["ghost"] * t.num_rows)
        return pa.concat_tables([t.slice(0, 0), other])  # every row moved to an unlisted run

    _edit_rows(bundle, "tensors", add_other)
    refused(target, bundle, r"table tensors holds rows of run 'ghost', which the manifest does not list")


def test_a_parquet_table_expanding_beyond_its_bound_is_refused_before_it_fills_memory(bundle, target):
    path = bundle / "catalog" / "tensors.parquet"
    honest = pq.read_table(path)
    block = honest.take(pa.array(np.zeros(100_000, np.int64)))
    rows = 0
    with pq.ParquetWriter(path, honest.schema, compression="zstd") as w:  # 3M equal rows: a few hundred KB
        for _ in range(30):
            w.write_table(block, row_group_size=1 << 20)
            rows += block.num_rows
    resign(bundle)
    m = manifest(bundle)
    m["tables"]["tensors"]["rows"] = rows
    write_manifest(bundle, m)
    assert path.stat().st_size < 8 << 20
    refused(target, bundle, r"table tensors \(3000000 rows\) expands to more than \d+ MiB in memory")


def test_table_rows_disagreeing_with_the_manifest_are_refused(bundle, target):
    edit_table(bundle, "tensors", lambda t: t.slice(0, 10))  # re-signed, rows left at 42
    refused(target, bundle, "table tensors has 10 rows, the manifest says 42")


def test_an_encrypted_zip_is_refused_plainly(bundle, target, tmp_path):
    z = zip_dir(bundle, tmp_path / "enc.zip")
    raw = bytearray(z.read_bytes())
    # set the "encrypted" flag (general purpose bit 0) in every local and central header
    for sig, off in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        start = 0
        while (i := raw.find(sig, start)) >= 0:
            raw[i + off] |= 1
            start = i + 4
    z.write_bytes(bytes(raw))
    refused(target, z, "is encrypted")


def _new_payload_rows(t: pa.Table, target: Path) -> list[int]:
    """Rows of ``t`` whose payload the target archive does not hold (the import reads it)."""
    have = set(dumpdb.open(target).sql("SELECT content_hash FROM blobs")["content_hash"].to_pylist())
    return [i for i, h in enumerate(t["content_hash"].to_pylist()) if h is not None and h not in have]


def test_a_forged_dtype_is_refused(bundle, target):
    def forge(t: pa.Table) -> pa.Table:
        dtypes = t["dtype"].to_pylist()
        i = next(i for i in _new_payload_rows(t, target) if dtypes[i] == "float32")
        dtypes[i] = "int32"  # same size, other meaning
        return set_column(t, "dtype", dtypes)

    edit_table(bundle, "tensors", forge)
    refused(target, bundle, "says dtype int32, its payload is stored as float32")


def test_forged_statistics_are_refused(bundle, target):
    def forge(t: pa.Table) -> pa.Table:
        maxima = t["max"].to_pylist()
        i = next(k for k in _new_payload_rows(t, target) if maxima[k] is not None)
        maxima[i] = maxima[i] + 1000.0
        return set_column(t, "max", maxima)

    edit_table(bundle, "tensors", forge)
    refused(target, bundle, r"says max .*, its payload's is .*forged or altered statistics")
