"""Analysis on a dask.distributed cluster (issue 29, dumpdb/compare/distributed.py).

An 8-rank pair of runs - simulated ranks of the real MindSpore LeNet5 pair in tests/data
(d2 float16/bfloat16 target, d1 float32 bench: rank r's floating-point payloads scaled by
1 + r/1024, so each rank has payloads of its own) - ingested with its tensors on S3 (moto's
server on 127.0.0.1). Each compare / first-divergence / scan on the cluster must give the
local run's rows, bit for bit. One module-scoped in-process LocalCluster (2 workers,
threads) serves most tests through its address; one test starts ``scheduler="local"``:
real worker processes reading S3 themselves.
"""

from __future__ import annotations

import contextlib
import shutil
import socket

import numpy as np
import pyarrow as pa
import pytest
from conftest import ms_case
from typer.testing import CliRunner

import dumpdb
import dumpdb.cluster as dist
import dumpdb.compare.engine as engine
from dumpdb.checks.ranks import rank_groups
from dumpdb.cli import app
from dumpdb.ingestion.pipeline import ingest

distributed = pytest.importorskip("distributed", reason="dask.distributed is the [dask] extra these tests exercise")
RANKS = 8


def _simulate_ranks(src, out, ranks: int):
    """``src``'s rank_0 copied as rank_0..rank_{ranks-1}, floating-point .npy payloads of rank r
    scaled by 1 + r/1024 (bfloat16 files, which numpy cannot parse, are copied as they are)."""
    for r in range(ranks):
        dst = out / f"rank_{r}"
        shutil.copytree(src / "rank_0", dst)
        if r == 0:
            continue
        for f in dst.rglob("*.npy"):
            try:
                a = np.load(f)
            except ValueError:
                continue
            if a.dtype.kind == "f":
                with np.errstate(invalid="ignore", over="ignore"):  # some corpus payloads are not finite (nan, inf)
                    np.save(f, (a * (1 + r / 1024)).astype(a.dtype))
    return out


@pytest.fixture(scope="module")
def env(moto_s3):
    with pytest.MonkeyPatch.context() as mp:
        for key, value in moto_s3.env().items():
            mp.setenv(key, value)
        yield moto_s3


@pytest.fixture(scope="module")
def archive(env, tmp_path_factory):
    """An 8-rank target/bench pair, tensors on S3."""
    root = tmp_path_factory.mktemp("dist")
    path = root / "a.dumpdb"
    url = f"s3://{env.bucket()}/dist"
    for run, case in (("fp16", "d2_compare_fp16_bf16_iter0"), ("fp32", "d1_compare_fp32_iter0")):
        dump = _simulate_ranks(ms_case(case), root / run, RANKS)
        ingest(dump, archive=path, run=run, store=url)
    return path


@pytest.fixture(scope="module")
def cluster():
    """A 2-worker in-process LocalCluster (threads: starts in ~1 s); tests pass its address."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None,
                                  scheduler_kwargs={"dashboard_address": dist.LOCAL_HTTP_ADDRESS}) as c:
        yield c


@contextlib.contextmanager
def _port_taken(port: int):
    """``port`` on 127.0.0.1 held by a listening socket for the block (when nothing else holds
    it already): an HTTP server asking for that port must then take another one and warns."""
    sock = socket.socket()
    try:
        with contextlib.suppress(OSError):  # held already: the same for the block
            sock.bind(("127.0.0.1", port))
            sock.listen()
        yield
    finally:
        sock.close()


def _stored(a, compare_id: int) -> pa.Table:
    rows = a.sql("SELECT * FROM compare_results WHERE compare_id = $id ORDER BY pair_index", {"id": compare_id})
    return rows.drop_columns(["compare_id"])


def _same_bits(x: pa.Table, y: pa.Table) -> None:
    """Equal tables, floats compared by their bits (NaN == NaN, -0.0 != 0.0)."""
    assert x.column_names == y.column_names and x.num_rows == y.num_rows
    for name in x.column_names:
        a, b = x.column(name), y.column(name)
        if pa.types.is_floating(a.type):
            va, vb = a.to_numpy(zero_copy_only=False), b.to_numpy(zero_copy_only=False)
            assert np.array_equal(va.view(np.int64), vb.view(np.int64)), name
            assert a.null_count == b.null_count and a.is_null().equals(b.is_null()), name
        else:
            assert a.equals(b), name


@pytest.fixture(scope="module")
def local(archive):
    """The local compare (stored): the oracle of every cluster run."""
    with dumpdb.open(archive) as a:
        return engine.compare(a, "fp16", "fp32")


def _on_cluster(path, scheduler: str, **options):
    dist._OPEN.clear()
    with dumpdb.open(path) as a:
        return engine.compare(a, "fp16", "fp32", scheduler=scheduler, **options)


@pytest.mark.parametrize("small_elements", [engine.SMALL_ELEMENTS, 1024], ids=["batched", "large-pairs"])
def test_compare_on_the_cluster_stores_the_local_rows(archive, local, cluster, monkeypatch, small_elements):
    # 1024: every pair above 1 Ki elements takes the large-pair path on the cluster (tasks of
    # whole pairs), against the local run's batched path: the same bits either way
    monkeypatch.setattr(engine, "SMALL_ELEMENTS", small_elements)
    remote = _on_cluster(archive, cluster.scheduler_address)
    assert dist._OPEN, "no task opened the store on a worker"
    assert remote.summary["pairs"] == local.summary["pairs"] > 8 * 60
    assert local.summary["error"] + local.summary["warning"] > 0  # fp16 vs fp32: something to find
    with dumpdb.open(archive) as a:
        _same_bits(_stored(a, local.compare_id), _stored(a, remote.compare_id))
    _same_bits(local.results.drop_columns(["compare_id"]), remote.results.drop_columns(["compare_id"]))
    assert remote.first_divergence == local.first_divergence
    assert {k: v for k, v in remote.summary.items() if k != "compare_id"} == \
        {k: v for k, v in local.summary.items() if k != "compare_id"}


def test_partition_keeps_a_pack_in_one_task_and_bounds_task_bytes():
    tasks = dist.partition(["p1", "p2", "p1", "p1", "big"], ["q", "q", "q", "r", "s"], [10, 10, 10, 10, 500],
                           task_bytes=15)
    assert [t.tolist() for t in tasks] == [[0], [2], [1], [3], [4]]
    tasks = dist.partition(["p1", "p2", "p1", "p1"], ["q", "q", "q", "q"], [10, 10, 10, 10], task_bytes=100)
    assert [t.tolist() for t in tasks] == [[0, 2, 3], [1]]


def test_compare_with_local_worker_processes(archive, env, local, recwarn):
    """``scheduler="local"``: a LocalCluster of 2 worker processes, each opening the S3
    store from its own environment. Its scheduler serves HTTP on a free port of 127.0.0.1:
    with dask's default port 8787 taken (another cluster on the machine) it starts with no
    "Port 8787 is already in use" warning."""
    with _port_taken(8787):
        remote = _on_cluster(archive, "local", workers=2)
    assert not [w for w in recwarn if "already in use" in str(w.message)]
    assert not dist._OPEN  # nothing was read in this process: the workers did it
    _same_bits(local.results.drop_columns(["compare_id"]), remote.results.drop_columns(["compare_id"]))
    with dumpdb.open(archive) as a:
        _same_bits(_stored(a, local.compare_id), _stored(a, remote.compare_id))


def test_first_divergence_and_scan_on_the_cluster(archive, local, cluster):
    address = cluster.scheduler_address
    with dumpdb.open(archive) as a:
        found = a.first_divergence("fp16", "fp32", store_results=False, scheduler=address)
        assert found is not None and found == local.first_divergence
        checks = ["tensor_too_large:abs_mean_gt=0.01", "tensor_range:range_start_inclusive=-0.01,"
                  "range_end_inclusive=0.01,range_percentage_gt=50"]
        hits = a.scan("fp32", checks, first_only=False)
        dist._OPEN.clear()
        remote = a.scan("fp32", checks, first_only=False, scheduler=address)
        assert dist._OPEN and hits.num_rows > RANKS
        _same_bits(hits, remote)
        first = a.scan("fp16", checks, scheduler=address)
        _same_bits(a.scan("fp16", checks), first)


def test_cli_first_divergence_ranks_and_scan_take_scheduler(archive, cluster):
    runner = CliRunner()
    address = cluster.scheduler_address
    for cmd in (["first-divergence", "fp16", "fp32", "--rules", "msprobe"], ["ranks", "fp16", "-f", "csv"],
                ["scan", "fp32", "-c", "tensor_too_large:abs_mean_gt=0.01", "-f", "csv"]):
        local = runner.invoke(app, [*cmd, "-a", str(archive)], catch_exceptions=False)
        remote = runner.invoke(app, [*cmd, "-a", str(archive), "--scheduler", address], catch_exceptions=False)
        assert (remote.exit_code, remote.stdout) == (local.exit_code, local.stdout), cmd
        assert local.stdout.count("\n") > 3  # found something, said it


def test_ranks_on_the_cluster(archive, cluster):
    with dumpdb.open(archive) as a:
        local = rank_groups(a, "fp32")
        remote = rank_groups(a, "fp32", scheduler=cluster.scheduler_address)
    assert remote.equals(local)
    rows = local.to_pylist()
    assert len(rows) == RANKS and rows[0]["reference"] and sum(r["departs_at"] == "value" for r in rows) == RANKS - 1
