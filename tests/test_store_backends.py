"""A storage backend is one registration (dumpdb.storage.backends, issue 27 item 4): a ``gs://``
stub defined here, over a local directory, is enough to ingest a real dump with its tensors
there, read them back bit for bit, gc through its listing, export a bundle to it and query
that bundle in place. Nothing else in dumpdb names the scheme."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.fs
import pytest
import zarr.storage
from conftest import assert_run_reads_back_its_dump, ms_case, npy_files, npy_payload

import dumpdb
from dumpdb.errors import StorageError
from dumpdb.storage import backends

CASE = "c1_inputs_kernels_iter"


def _split(url: str) -> tuple[str, str]:
    bucket, _, prefix = url.removeprefix("gs://").partition("/")
    if not bucket or ".." in prefix.split("/"):
        raise StorageError(f"{url}: not a gs://BUCKET/PREFIX URL")
    return bucket, prefix.strip("/")


def _canonical(url: str) -> str:
    bucket, prefix = _split(url)
    return f"gs://{bucket}/{prefix}".rstrip("/")


def _dir(url: str, options) -> Path:
    bucket, prefix = _split(url)
    return Path(options["root"]) / bucket / prefix


GS = backends.Backend(
    "gs", canonical=_canonical,
    open_store=lambda url, options, read_only: zarr.storage.LocalStore(_dir(url, options), read_only=read_only),
    filesystem=lambda url, options: (pyarrow.fs.LocalFileSystem(), str(_dir(url, options))),
    endpoint=lambda options: f"file://{(options or {}).get('root')}",
    public_options=lambda options: {k: str(v) for k, v in (options or {}).items() if k != "secret"})


@pytest.fixture
def gs(tmp_path, monkeypatch):
    """The stub registered for this test only; its "bucket" directories under tmp_path/gs."""
    monkeypatch.setitem(backends._BACKENDS, "gs", GS)  # noqa: SLF001 - unregistered afterwards
    return {"root": str(tmp_path / "gs"), "secret": "s3cr3t"}


def test_a_gs_backend_registered_in_a_test_stores_reads_lists_and_bundles(tmp_path, gs):
    archive = tmp_path / "a.dumpdb"
    report = dumpdb.ingest(ms_case(CASE), archive, "c1", store="gs://bkt/tensors/", storage_options=gs)
    assert report.tensors_added > 0
    marker = json.loads((archive / "dumpdb.json").read_text())
    assert marker["store"] == {"url": "gs://bkt/tensors", "options": {"root": gs["root"]}}  # no secret kept
    assert not (archive / "tensors.zarr").exists()
    assert (Path(gs["root"]) / "bkt" / "tensors" / "zarr.json").is_file()

    a = dumpdb.open(archive, storage_options=gs)
    assert a.store_url == "gs://bkt/tensors"
    # what the store can do comes from its backend, though the stub's objects are files here:
    # ingest's workers send arrays back, gc lists through the store (never walks the directory)
    assert a.store.capabilities == GS.capabilities and not a.store.capabilities.files
    assert_run_reads_back_its_dump(a, ms_case(CASE), "c1")
    files = {p.name: p for p in npy_files(ms_case(CASE))}

    # gc's listing goes through the backend's store: a run removed, its packs reclaimed
    stored = sum(1 for p in (Path(gs["root"]) / "bkt" / "tensors").rglob("*") if p.is_file())
    a.remove_run("c1")
    a.gc(grace=0)
    left = sum(1 for p in (Path(gs["root"]) / "bkt" / "tensors").rglob("*") if p.is_file())
    assert left < stored

    # a bundle exported to gs:// and opened in place: its Parquet through the backend's filesystem
    dumpdb.ingest(ms_case(CASE), archive, "again", storage_options=gs)
    assert a.export(["again"], "gs://bkt/bundles/one") == "gs://bkt/bundles/one"
    b = dumpdb.open("gs://bkt/bundles/one", storage_options=gs)
    assert b.sql("SELECT count(*) AS n FROM tensors")["n"][0].as_py() == len(files)
    first = b.sql("SELECT tensor_id, source_file FROM tensors ORDER BY tensor_id LIMIT 1").to_pylist()[0]
    _descr, shape, raw = npy_payload(files[first["source_file"].rsplit("/", 1)[-1]])
    assert b.tensor(first["tensor_id"]).tobytes() == raw


def test_an_unknown_scheme_is_one_line_naming_the_known_ones(tmp_path):
    with pytest.raises(StorageError, match=r"az://x/y: not an object-storage URL \(known: .*s3://"):
        dumpdb.ingest(ms_case(CASE), tmp_path / "a.dumpdb", "c1", store="az://x/y")
