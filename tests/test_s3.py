"""Archives whose tensor store is on S3 (moto's server on 127.0.0.1), through the real CLI and API.

Every command runs on an archive made by ``dumpdb ingest --store s3://...`` and its answer is
checked against the same command on a local archive of the same dumps (the local store is the
oracle: the store must not change any answer), or against the dump files themselves.
Faults (server down, server dying mid-ingest, deleted and truncated objects) are at the end;
wrong credentials need a server that checks them: tests/test_seaweedfs.py.
"""

from __future__ import annotations

import json
import shutil

import google_crc32c
import numpy as np
import pytest
from conftest import assert_run_reads_back_its_dump, ms_case, npy_files, npy_payload
from storage_servers import free_port, moto_server
from typer.testing import CliRunner

import dumpdb
import dumpdb.storage.store as store_mod
from dumpdb.cli import app
from dumpdb.errors import PayloadCorrupt, PayloadMissing, StorageError
from dumpdb.storage.objects import ObjectStore
from dumpdb.storage.remote import open_store
from dumpdb.storage.store import shard_key

runner = CliRunner()
CASES = {"fp32": "d1_compare_fp32_iter0", "fp16": "d2_compare_fp16_bf16_iter0", "c1": "c1_inputs_kernels_iter"}


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(autouse=True)
def aws_env(moto_s3, monkeypatch):
    for key, value in moto_s3.env().items():
        monkeypatch.setenv(key, value)


def _make(path, store_url=None):
    for run, case in CASES.items():
        args = ["ingest", ms_case(case), "-a", path, "--run", run, "-q"]
        r = invoke(*args, *(["--store", store_url] if store_url else []))
        assert r.exit_code == 0, r.output
    return path


@pytest.fixture(scope="module")
def pair(moto_s3, tmp_path_factory):
    """(S3-backed archive, local archive) of the same three runs; read-only use."""
    root = tmp_path_factory.mktemp("s3pair")
    with pytest.MonkeyPatch.context() as mp:
        for key, value in moto_s3.env().items():
            mp.setenv(key, value)
        url = f"s3://{moto_s3.bucket()}/team/archive"
        return _make(root / "s3.dumpdb", url), _make(root / "local.dumpdb"), url


@pytest.fixture
def s3_archive(pair, moto_s3, tmp_path, s3_url):
    """A fresh S3-backed archive (the three runs) a test may change: a copy of ``pair``'s S3
    archive (its directory, its objects copied server-side into a fresh bucket, the marker
    pointed at them), so the three runs are ingested once per module, not once per test."""
    src_dir, _local, src_url = pair
    path = tmp_path / "a.dumpdb"
    shutil.copytree(src_dir, path)
    src_bucket, _, src_prefix = src_url.removeprefix("s3://").partition("/")
    dst_bucket, _, dst_prefix = s3_url.removeprefix("s3://").partition("/")
    client = moto_s3.client()
    copied = 0
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=src_bucket, Prefix=src_prefix + "/"):
        for obj in page.get("Contents", []):
            key = dst_prefix + obj["Key"][len(src_prefix):]
            client.copy_object(Bucket=dst_bucket, Key=key, CopySource={"Bucket": src_bucket, "Key": obj["Key"]})
            copied += 1
    assert copied > 3
    marker = json.loads((path / "dumpdb.json").read_text())
    assert marker["store"]["url"] == src_url
    marker["store"]["url"] = s3_url
    (path / "dumpdb.json").write_text(json.dumps(marker, indent=2) + "\n")
    return path, s3_url


def _objects(url) -> ObjectStore:
    return ObjectStore(open_store(url), url)


def _dir_bytes(path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# -- the archive: catalog local, tensors on S3 ---------------------------------------------
def test_ingest_puts_tensors_on_s3_and_remembers_the_url(pair):
    s3, _local, url = pair
    marker = json.loads((s3 / "dumpdb.json").read_text())
    assert marker["store"] == {"url": url, "options": {}}
    assert not (s3 / "tensors.zarr").exists()
    a = dumpdb.open(s3)
    assert a.store_url == url
    keys = list(_objects(url).iter_prefix("packs"))
    arrays = {r["array_path"] for r in a.sql("SELECT array_path FROM arrays").to_pylist()}
    assert arrays and {shard_key(p, 1) for p in arrays if p.startswith("packs/")} <= set(keys)
    # besides the catalog, the local directory holds a few small files only
    payload = int(a.sql("SELECT sum(nbytes) AS n FROM tensors").to_pylist()[0]["n"])
    besides = _dir_bytes(s3) - (s3 / "catalog.duckdb").stat().st_size
    assert besides <= 0.10 * payload, (besides, payload)


def test_every_tensor_reads_back_bit_exact_from_the_dump_files(pair):
    s3, _local, _url = pair
    assert_run_reads_back_its_dump(dumpdb.open(s3), ms_case(CASES["c1"]), "c1")


def test_tensors_stream_equals_local(pair):
    s3, local, _url = pair
    q = "SELECT tensor_id, run, op_name, io, slot, iteration FROM tensors ORDER BY run, op_name, io, slot, iteration"

    def rows(archive):
        return [({k: v for k, v in r.items() if k != "tensor_id"}, a.tobytes() if a is not None else None)
                for r, a in dumpdb.open(archive).tensors(q)]

    got, want = rows(s3), rows(local)
    assert got == want and len(got) > 50


def test_dedup_on_s3_stores_nothing_twice(s3_archive, tmp_path):
    path, url = s3_archive
    before = sorted(_objects(url).iter_prefix(""))
    r = invoke("ingest", ms_case(CASES["c1"]), "-a", path, "--run", "c1-again", "-q")
    assert r.exit_code == 0, r.output
    assert "0 deduplicated" not in r.output
    show = dumpdb.open(path).show("c1-again")
    assert show["payloads_stored"] == 0 and show["tensors"] > 0
    assert sorted(_objects(url).iter_prefix("")) == before


def test_a_second_store_url_for_an_existing_archive_is_refused(s3_archive, moto_s3):
    path, _url = s3_archive
    r = invoke("ingest", ms_case(CASES["c1"]), "-a", path, "--run", "x", "--store", f"s3://{moto_s3.bucket()}/other")
    assert r.exit_code == 2 and "keeps the store it was created with" in r.output


def test_a_prefix_holding_another_archives_store_is_refused(s3_archive, tmp_path):
    _path, url = s3_archive
    r = invoke("ingest", ms_case(CASES["c1"]), "-a", tmp_path / "second", "--run", "x", "--store", url)
    assert r.exit_code == 2 and "already holds a tensor store" in r.output
    assert not (tmp_path / "second").exists()


def test_secrets_are_never_stored_or_printed(tmp_path, s3_url, moto_s3):
    secret = "TOPSECRET-" + "x" * 20
    r = invoke("ingest", ms_case(CASES["c1"]), "-a", tmp_path / "a", "--run", "c1", "--store", s3_url,
               "--storage-option", f"secret_access_key={secret}", "--storage-option", "region=us-east-1")
    assert r.exit_code == 0, r.output
    assert secret not in r.output
    assert secret not in (tmp_path / "a" / "dumpdb.json").read_text()
    assert json.loads((tmp_path / "a" / "dumpdb.json").read_text())["store"]["options"] == {"region": "us-east-1"}
    r = invoke("ingest", ms_case(CASES["c1"]), "-a", tmp_path / "b", "--run", "c1", "--store", "s3://",
               "--storage-option", f"secret_access_key={secret}")
    assert r.exit_code == 2 and secret not in r.output and "s3://BUCKET/PREFIX" in r.output


# -- every read command answers as on a local archive ---------------------------------------
@pytest.mark.parametrize("args", [
    ["compare", "fp16", "fp32", "-f", "csv", "--no-store"],
    ["first-divergence", "fp16", "fp32", "--rules", "msprobe", "-f", "json"],
    ["scan", "c1", "-f", "csv"],
    ["scan", "fp16", "-c", "all_zero", "-f", "csv"],
    ["sql", "-f", "csv", "SELECT run, count(*) AS n, sum(nbytes) AS b FROM tensors GROUP BY ALL ORDER BY run"],
    ["show", "fp16", "-f", "json"],
], ids=["compare", "first-divergence", "scan", "scan-all-zero", "sql", "show"])
def test_read_commands_answer_as_on_a_local_archive(pair, args):
    s3, local, _url = pair
    got, want = invoke(*args, "-a", s3), invoke(*args, "-a", local)
    assert got.exit_code == want.exit_code, got.output
    clean = [line for line in got.stdout.splitlines() if "compare_id" not in line]
    expect = [line for line in want.stdout.splitlines() if "compare_id" not in line]
    if args[0] == "show":  # ingested at other times, from the same source
        g, w = json.loads(got.stdout), json.loads(want.stdout)
        g, w = (g[0], w[0]) if isinstance(g, list) else (g, w)
        for key in ("ingest_started", "ingest_finished", "ingest_seconds", "created"):
            g.pop(key, None)
            w.pop(key, None)
        assert g == w and g["tensors"] > 0
    else:
        assert clean == expect and len(clean) > 1


def test_storage_option_reaches_every_read_command_wherever_it_is_given(pair, moto_s3, monkeypatch):
    """``--storage-option`` is global: a read command given the endpoint that the environment
    lacks reads the S3 store, whether the option comes before or after the command."""
    s3, local, _url = pair
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL", dead)
    args = ["compare", "fp16", "fp32", "--mode", "tensor", "-f", "csv", "--no-store", "-a", s3]  # reads payloads
    r = invoke(*args, "--storage-option", "retries=1")
    assert r.exit_code == 2 and dead in r.output, r.output  # the environment's endpoint, named
    want = invoke(*args[:-1], local)
    assert want.exit_code in (0, 1) and len(want.stdout.splitlines()) > 1
    after = invoke(*args, "--storage-option", f"endpoint={moto_s3.endpoint}")
    before = invoke(f"--storage-option=endpoint={moto_s3.endpoint}", *args)
    assert after.exit_code == before.exit_code == want.exit_code, after.output
    unstable = "compare_id"
    assert [x for x in after.stdout.splitlines() if unstable not in x] == \
        [x for x in before.stdout.splitlines() if unstable not in x] == \
        [x for x in want.stdout.splitlines() if unstable not in x]


def test_compare_in_worker_processes_reads_s3(pair):
    s3, local, _url = pair
    got = dumpdb.open(s3).compare("fp16", "fp32", workers=2, store_results=False)
    want = dumpdb.open(local).compare("fp16", "fp32", workers=1, store_results=False)
    cols = [c for c in want.column_names if c not in ("compare_id",)]
    assert got.select(cols).to_pylist() == want.select(cols).to_pylist()


# -- maintenance --------------------------------------------------------------------------
def test_verify_lists_objects_and_passes(pair):
    r = invoke("verify", "-a", pair[0])
    assert r.exit_code == 0 and r.output.startswith("ok: archive")


def test_prune_rm_gc_delete_objects_on_s3(s3_archive):
    path, url = s3_archive
    objects = _objects(url)
    before = set(objects.iter_prefix(""))
    assert invoke("prune", "c1", "-a", path, "--keep-stats").exit_code == 0
    assert invoke("rm", "fp16", "-a", path, "--yes").exit_code == 0
    r = invoke("gc", "-a", path)
    assert r.exit_code == 0 and "reclaimed" in r.output
    after = set(objects.iter_prefix(""))
    assert after < before
    a = dumpdb.open(path)
    live = {r["array_path"] for r in a.sql("SELECT array_path FROM arrays").to_pylist()}
    on_s3 = {"/".join(k.split("/")[:3]) for k in after if k.count("/") >= 3}
    assert on_s3 == live  # nothing referenced is gone, nothing unreferenced is left
    for row, arr in a.tensors("SELECT * FROM tensors WHERE run = 'fp32'"):
        assert arr is not None and arr.nbytes == row["nbytes"]
    assert invoke("verify", "-a", path).exit_code == 0


def test_gc_and_verify_find_crash_leftovers_in_the_streamed_listing(s3_archive, monkeypatch):
    path, url = s3_archive
    objects = _objects(url)
    objects.set("packs/float32/20200101T000000-deadbeef00/zarr.json", b"{}")
    objects.set("packs/float32/20200101T000000-deadbeef00/c/0", b"x" * 1000)
    r = invoke("verify", "-a", path, "--grace", "0")
    assert "orphans: 1 store files nothing references (1.00 KB)" in r.output, r.output
    report = dumpdb.open(path).verify(grace=0)
    assert [o.path for o in report.orphans] == ["packs/float32/20200101T000000-deadbeef00"]
    r = invoke("gc", "-a", path, "--grace", "0")
    assert r.exit_code == 0 and "1 crash leftovers removed" in r.output, r.output
    assert not list(objects.iter_prefix("packs/float32/20200101T000000-deadbeef00"))
    assert invoke("verify", "-a", path).exit_code == 0


def test_migrate_an_s3_archive(s3_archive):
    r = invoke("migrate", "-a", s3_archive[0])
    assert r.exit_code == 0 and "schema is current" in r.output


# -- bundles on S3 --------------------------------------------------------------------------
def test_export_to_s3_sql_in_place_and_import(pair, moto_s3, tmp_path):
    s3, local, _url = pair
    bundle = f"s3://{moto_s3.bucket()}/bundles/fp16"
    r = invoke("export", "fp16", "fp32", "-a", s3, "--to", bundle)
    assert r.exit_code == 0 and bundle in r.output
    n = dumpdb.open(s3).sql("SELECT count(*) AS n FROM tensors WHERE run IN ('fp16', 'fp32')").to_pylist()[0]["n"]
    r = invoke("sql", "-a", bundle, "-f", "csv", "SELECT count(*) AS n FROM tensors")
    assert r.exit_code == 0 and r.stdout.splitlines() == ["n", str(n)]
    view = dumpdb.open(bundle)
    with pytest.raises(dumpdb.DumpdbError, match="SQL refused"):
        view.sql("COPY (SELECT 1) TO 'x.csv'")
    q = "SELECT tensor_id, run, op_name, io, slot FROM tensors {} ORDER BY run, op_name, io, slot"

    def rows(archive, where=""):
        return [({k: v for k, v in r.items() if k != "tensor_id"}, a.tobytes()) for r, a in archive.tensors(q.format(where))]

    got = rows(view)
    want = rows(dumpdb.open(local), "WHERE run IN ('fp16', 'fp32')")
    assert got == want
    with pytest.raises(dumpdb.ArchiveError, match="read-only"):
        view.gc()
    r = invoke("compare", "fp16", "fp32", "-a", bundle, "-f", "csv", "--no-store")
    assert r.exit_code == invoke("compare", "fp16", "fp32", "-a", s3, "-f", "csv", "--no-store").exit_code
    assert r.stdout.count("\n") > 10, r.output
    r = invoke("compare", "fp16", "fp32", "-a", bundle)
    assert r.exit_code == 2 and r.output.count("\n") == 1 and "--no-store" in r.output
    r = invoke("export", "fp16", "-a", s3, "--to", bundle)
    assert r.exit_code == 2 and "already holds a bundle" in r.output
    target = tmp_path / "imported.dumpdb"
    r = invoke("import", bundle, "-a", target)
    assert r.exit_code == 0 and "imported fp16, fp32" in r.output, r.output
    assert invoke("verify", "-a", target).exit_code == 0
    assert not list(target.glob(".dumpdb-import-*"))
    r = invoke("import", bundle, "-a", target)
    assert r.exit_code == 0 and "skipped" in r.output


def test_import_refuses_an_s3_bundle_whose_object_differs_from_its_manifest(pair, moto_s3, tmp_path):
    bundle = f"s3://{moto_s3.bucket()}/b"
    assert invoke("export", "c1", "-a", pair[0], "--to", bundle).exit_code == 0
    objects = _objects(bundle)
    key = next(k for k in objects.iter_prefix("catalog") if k.endswith("tensors.parquet"))
    objects.set(key, bytes(objects.get(key)) + b"tail")
    r = invoke("import", bundle, "-a", tmp_path / "t")
    assert r.exit_code == 2 and key in r.output and "manifest says" in r.output


def test_open_an_s3_prefix_without_a_bundle(moto_s3):
    with pytest.raises(dumpdb.BundleError, match="no manifest.json"):
        dumpdb.open(f"s3://{moto_s3.bucket()}/nothing")


# -- faults ---------------------------------------------------------------------------------
def test_server_down_at_start_is_one_line_naming_the_endpoint_exit_2(tmp_path, monkeypatch):
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    r = invoke("ingest", ms_case(CASES["c1"]), "-a", tmp_path / "a", "--run", "c1", "-q", "--store", "s3://bkt/p",
               "--storage-option", "retries=1")
    assert r.exit_code == 2
    assert r.output.count("\n") == 1 and r.output.startswith("error: ") and endpoint in r.output
    assert not (tmp_path / "a").exists()


def test_missing_and_truncated_objects_are_named_by_verify_and_never_read_as_zeros(s3_archive):
    path, url = s3_archive
    a = dumpdb.open(path)
    packs = a.sql("""SELECT b.array_path, list(t.tensor_id ORDER BY t.tensor_id) AS ids, any_value(t.op_name) AS op
                     FROM blobs b JOIN tensors t USING (content_hash) WHERE b.elem_offset IS NOT NULL
                     GROUP BY ALL ORDER BY b.array_path""").to_pylist()
    gone, cut = packs[0], packs[1]
    objects = _objects(url)
    objects.delete(shard_key(gone["array_path"], 1))
    key = shard_key(cut["array_path"], 1)
    objects.set(key, bytes(objects.get(key))[:100])
    r = invoke("verify", "-a", path)
    assert r.exit_code == 1, r.output
    assert shard_key(gone["array_path"], 1) in r.output and cut["array_path"] in r.output
    named = dumpdb.open(path).verify().damaged_tensors["tensor_id"].to_pylist()
    assert set(gone["ids"]) | set(cut["ids"]) <= set(named)
    with pytest.raises(PayloadMissing, match=shard_key(gone["array_path"], 1)):
        dumpdb.open(path).tensor(gone["ids"][0])
    with pytest.raises((PayloadCorrupt, PayloadMissing, ValueError)):
        dumpdb.open(path).tensor(cut["ids"][0])


def test_server_dying_mid_ingest_leaves_no_dangling_reference_and_a_rerun_completes(tmp_path, monkeypatch):
    """A second moto server is stopped after the ingest's third pack shard is written (the
    store's own call tells the test when: no timing). moto keeps its buckets in-process, so a
    server restarted on another port serves the objects written before."""
    monkeypatch.setattr(store_mod, "PACK_BYTES", 32 << 10)  # many packs
    with moto_server() as first:
        for key, value in first.env().items():
            monkeypatch.setenv(key, value)
        url = f"s3://{first.bucket()}/a"
        real_set = ObjectStore.set
        shards = []

        def set_then_maybe_die(self, key, parts):
            written = real_set(self, key, parts)
            if key.startswith("packs/") and key.endswith("/c/0"):
                shards.append(key)
                if len(shards) == 3:
                    first_server.stop()  # the server dies: every later request fails
            return written

        first_server = first.server
        monkeypatch.setattr(ObjectStore, "set", set_then_maybe_die)
        r = invoke("ingest", ms_case(CASES["c1"]), "-a", tmp_path / "a", "--run", "c1", "-q",
                   "--store", url, "--storage-option", "retries=1")
        monkeypatch.setattr(ObjectStore, "set", real_set)
        assert r.exit_code == 2, r.output
        # dumpdb's message is one line (moto's dying server thread may print its own traceback meanwhile)
        errors = [line for line in r.output.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1 and first.endpoint in errors[0] and "internal error" not in errors[0], r.output
    with moto_server() as second:
        monkeypatch.setenv("AWS_ENDPOINT_URL", second.endpoint)
        a = dumpdb.open(tmp_path / "a")
        referenced = [r["array_path"] for r in a.sql("SELECT array_path FROM arrays").to_pylist()]
        objects = _objects(url)
        for array_path in referenced:  # the catalog references only objects that exist
            assert objects.exists(shard_key(array_path, 1)) or objects.exists(f"{array_path}/zarr.json")
        r = invoke("ingest", ms_case(CASES["c1"]), "-a", tmp_path / "a", "--run", "c1", "-q")
        assert r.exit_code == 0, r.output
        assert invoke("verify", "-a", tmp_path / "a").exit_code == 0
        files = {p.name: p for p in npy_files(ms_case(CASES["c1"]))}
        done = dumpdb.open(tmp_path / "a")
        rows = done.sql("SELECT tensor_id, source_file FROM tensors").to_pylist()
        assert len(rows) == len(files)
        for row in rows:
            assert done.tensor(row["tensor_id"]).tobytes() == npy_payload(files[row["source_file"].rsplit("/", 1)[-1]])[2]


def test_errors_of_the_object_store_are_storage_errors(monkeypatch):
    endpoint = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    objects = ObjectStore(open_store("s3://bkt/p", {"retries": "0"}), "s3://bkt/p", endpoint)
    with pytest.raises(StorageError, match=endpoint):
        objects.get("x")
    with pytest.raises(StorageError, match=endpoint):
        list(objects.iter_prefix(""))


def test_multipart_upload_of_a_large_pack_reads_back(s3_url):
    """A pack object larger than multipart_bytes goes up in parts; it reads back whole."""
    store = open_store(s3_url, {"multipart_bytes": str(5 << 20), "part_bytes": str(5 << 20)})
    objects = ObjectStore(store, s3_url)
    rng = np.random.default_rng(1)
    parts = [rng.integers(0, 255, 3 << 20, dtype=np.uint8).tobytes() for _ in range(4)]  # 12 MiB, 3 parts
    assert objects.set("packs/u8/big/c/0", parts) == 12 << 20
    assert bytes(objects.get("packs/u8/big/c/0")) == b"".join(parts)
    assert bytes(objects.get("packs/u8/big/c/0", 5 << 20, (5 << 20) + 10)) == b"".join(parts)[5 << 20:(5 << 20) + 10]


def test_listing_is_paginated_past_one_page(s3_url):
    objects = _objects(s3_url)
    keys = {f"large/aa/{i:05d}/zarr.json" for i in range(1100)}  # more than one 1000-key page
    for key in keys:
        objects.set(key, b"{}")
    assert set(objects.iter_prefix("large")) == keys


def test_a_large_tensor_shard_goes_up_as_a_multipart_upload_and_reads_back(s3_url, monkeypatch):
    import obstore

    from dumpdb.storage.store import StoreWriter, TensorStore

    calls = []
    real, real_async = obstore.put, obstore.put_async

    def recording_put(store, key, data, **kwargs):  # shards dumpdb encodes itself (StoreWriter)
        calls.append((key, kwargs.get("use_multipart")))
        return real(store, key, data, **kwargs)

    async def recording_put_async(store, key, data, **kwargs):  # what zarr writes
        calls.append((key, kwargs.get("use_multipart")))
        return await real_async(store, key, data, **kwargs)

    monkeypatch.setattr(obstore, "put", recording_put)
    monkeypatch.setattr(obstore, "put_async", recording_put_async)
    opts = {"multipart_bytes": str(5 << 20), "part_bytes": str(5 << 20)}
    TensorStore.create(s3_url, opts)
    writer = StoreWriter(TensorStore(s3_url, read_only=False, storage_options=opts), large_bytes=1 << 20)
    x = np.random.default_rng(2).standard_normal((3, 1 << 19)).astype(np.float32)  # 6 MiB, incompressible
    writer.add("h" * 32, x)
    (loc,) = writer.flush()
    (info,) = writer.take_arrays()
    writer.close()
    assert any(k.startswith(loc.array_path) and k.endswith("/c/0/0") and mp for k, mp in calls), calls
    # the checksum recorded without downloading the shard again is the object's own
    shard = bytes(_objects(s3_url).get(f"{loc.array_path}/c/0/0"))
    assert info.checksum == f"crc32c:{google_crc32c.value(shard):08x}"
    got = TensorStore(s3_url, storage_options=opts).read(loc.array_path, None, x.size, x.dtype, x.shape)
    assert got.tobytes() == x.tobytes()


def test_an_s3_url_as_the_archive_of_an_ingest_is_refused_with_the_way_to_do_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = invoke("ingest", ms_case(CASES["c1"]), "-a", "s3://bucket/archive", "--run", "c1", "-q")
    assert r.exit_code == 2 and "--store s3://BUCKET/PREFIX" in r.output
    assert list(tmp_path.iterdir()) == []  # no local directory named like the URL


class _FlakyProxy:
    """An HTTP proxy on 127.0.0.1 in front of moto that answers the first attempt of every
    request (method + path + query) with 503 SlowDown (S3's throttling answer) and forwards
    the retry: the client must back off and retry. Counts what it refused."""

    def __init__(self, upstream: str):
        import http.server
        import threading
        import urllib.request

        proxy = self
        self.refused = 0
        self.forwarded = 0
        self._lock = threading.Lock()
        self._seen: set = set()

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _any(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with proxy._lock:
                    key = (self.command, self.path)
                    flaky = key not in proxy._seen
                    proxy._seen.add(key)
                if flaky:
                    proxy.refused += 1
                    msg = b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
                    self.send_response(503)
                    self.send_header("Content-Length", str(len(msg)))
                    self.end_headers()
                    if self.command != "HEAD":  # a HEAD answer has no body
                        self.wfile.write(msg)
                    return
                req = urllib.request.Request(upstream + self.path, data=body if body or self.command in ("PUT", "POST")
                                             else None, method=self.command,
                                             headers={k: v for k, v in self.headers.items() if k.lower() != "host"})
                if not req.has_header("Content-type"):  # else urllib sends a form type and moto parses the body away
                    req.add_header("Content-type", "application/octet-stream")
                try:
                    with urllib.request.urlopen(req, timeout=60) as resp:
                        status, headers, data = resp.status, resp.headers, resp.read()
                except urllib.error.HTTPError as err:
                    status, headers, data = err.code, err.headers, err.read()
                proxy.forwarded += 1
                self.send_response(status)
                for k, v in headers.items():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection", "server", "date"):
                        self.send_header(k, v)
                self.send_header("Content-Length", headers.get("Content-Length", "0") if self.command == "HEAD"
                                 else str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def test_throttling_503_is_retried_with_backoff(tmp_path, s3_url, moto_s3, monkeypatch):
    proxy = _FlakyProxy(moto_s3.endpoint)
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        r = invoke("ingest", ms_case(CASES["c1"]), "-a", tmp_path / "a", "--run", "c1", "-q", "--store", s3_url)
        assert r.exit_code == 0, r.output
        r = invoke("verify", "-a", tmp_path / "a")
        assert r.exit_code == 0, r.output
        assert proxy.refused > 10 and proxy.forwarded >= proxy.refused - 1
    finally:
        proxy.close()
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_s3.endpoint)  # straight to the server: the objects are whole
    a = dumpdb.open(tmp_path / "a")
    files = {p.name: p for p in npy_files(ms_case(CASES["c1"]))}
    for row in a.sql("SELECT tensor_id, source_file FROM tensors").to_pylist():
        assert a.tensor(row["tensor_id"]).tobytes() == npy_payload(files[row["source_file"].rsplit("/", 1)[-1]])[2]
