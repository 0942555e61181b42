"""``dumpdb serve``'s JSON API (issue 28) through Starlette's TestClient, on real dumps:
runs, the model tree (MindSpore scopes and msprobe construct.json), search, op, tensor
heatmap / histogram / .npy, a new and a stored compare (trees, first departure, plot,
filters), a pair's difference, the rank grid, SQL (sandbox, paging, downloads, time limit),
hostile names, read-only-ness, and serving while an ingest runs."""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

pytest.importorskip("starlette", reason="dumpdb serve needs the serve extra (starlette)")
pytest.importorskip("starlette.testclient", reason="Starlette's TestClient needs httpx2 (test extra)")
from serve_fixtures import HOSTILE_OP, HOSTILE_RUN, archive_copy  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

import dumpdb  # noqa: E402
from dumpdb.serve import create_app  # noqa: E402

LN1 = ("Default/network-LossCell/net-LM/encoder-TransformerEncoder/layers-CellList/1-TransformerEncoderLayer/"
       "norm1-LayerNorm/LayerNorm-op0")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    archive_path = archive_copy(tmp_path_factory)
    archive = dumpdb.open(archive_path)
    with TestClient(create_app(archive)) as client:
        yield archive_path, archive, client
    archive.close()


def get(client, route, status=200, **params):
    r = client.get(route, params=params)
    assert r.status_code == status, r.text[:500]
    return r.json() if r.headers["content-type"].startswith("application/json") else r


def test_runs_and_pages(served):
    _, archive, client = served
    data = get(client, "/api/runs")
    by_run = {r["run"]: r for r in data["runs"]}
    assert set(by_run) == {"fp32_ln1", "fp32", "fp16", "gloo", HOSTILE_RUN}
    expected = {r["run"]: r["tensors"] for r in archive.runs().to_pylist()}
    assert {k: v["tensors"] for k, v in by_run.items()} == expected
    assert by_run["gloo"]["ranks"] == 2
    for page in ("/", "/tree?run=fp32", "/compare?target=a&bench=b", "/tensor?id=1", "/sql", "/ranks?run=gloo"):
        r = client.get(page)
        assert r.status_code == 200 and "/static/app.js" in r.text
    assert client.get("/static/app.js").status_code == 200
    assert get(client, "/api/nothing", 404)["error"].startswith("no API route")


def test_tree_mindspore_scopes(served):
    _, archive, client = served
    root = get(client, "/api/tree", run="fp32_ln1")["children"]
    default = next(c for c in root if c["name"] == "Default")
    n = archive.sql("SELECT count(*) AS n FROM tensors WHERE run = 'fp32_ln1' AND scope_name LIKE 'Default/%'")
    assert default["tensors"] == n.column("n")[0].as_py() and default["has_children"]
    # walk down to the changed LayerNorm: each level's child named by the next scope segment
    path = ""
    for part in LN1.split("/"):
        kids = get(client, "/api/tree", run="fp32_ln1", path=path)["children"]
        node = next(c for c in kids if c["name"] == part)
        path = node["path"]
    assert path == LN1 and node["op"] == LN1 and node["op_type"] == "LayerNorm" and not node["has_children"]
    assert node["tensors"] == len(get(client, "/api/op", run="fp32_ln1", op=LN1)["tensors"])
    found = get(client, "/api/search", run="fp32_ln1", q="NORM1-layernorm")["matches"]
    assert {m["path"] for m in found} == {LN1, LN1.replace("CellList/1-", "CellList/0-")}
    paged = get(client, "/api/tree", run="fp32_ln1", path="Default/network-LossCell/net-LM", limit=3)
    assert len(paged["children"]) == 3 and paged["more"]
    assert get(client, "/api/tree", 404, run="nope")["error"].startswith("no run")


def test_tree_msprobe_modules(served):
    _, _, client = served
    root = {c["name"]: c for c in get(client, "/api/tree", run="gloo")["children"]}
    net = root["Module.module.Net.forward.0"]
    kids = {c["name"] for c in get(client, "/api/tree", run="gloo", path=net["path"])["children"]}
    assert "Module.module.conv.Conv2d.forward.0" in kids  # construct.json's parent chain
    conv = f"{net['path']}/Module.module.conv.Conv2d.forward.0"
    leaf = get(client, "/api/tree", run="gloo", path=conv)["children"]
    assert [c["name"] for c in leaf] == ["Functional.conv2d.0.forward"]


def test_op_tensor_heatmap_histogram_npy(served):
    _, archive, client = served
    op = get(client, "/api/op", run="fp32_ln1", op=LN1)
    assert op["source"]["code_file"].endswith("ms_transformer_variant.py")
    t = next(x for x in op["tensors"] if x["io"] == "input" and x["slot"] == 0)
    want = archive.tensor(t["tensor_id"]).astype(np.float32)
    hm = get(client, "/api/tensor/heatmap", id=t["tensor_id"], h=8, w=16)
    cells = np.frombuffer(base64.b64decode(hm["data"]), "<f4").reshape(hm["rows"], hm["cols"])
    grid = want.reshape(-1, want.shape[-1])
    assert (hm["source_rows"], hm["source_cols"]) == grid.shape and hm["cols"] == 16
    assert cells[0, 0] == pytest.approx(grid[: grid.shape[0] // hm["rows"], :4].mean(), rel=1e-5)
    assert cells.mean() == pytest.approx(grid.mean(), rel=1e-4, abs=1e-6)
    hist = get(client, "/api/tensor/histogram", id=t["tensor_id"], bins=10)
    assert sum(hist["counts"]) == want.size and hist["edges"][0] == pytest.approx(want.min())
    npy = get(client, "/api/tensor.npy", id=t["tensor_id"])
    got = np.load(io.BytesIO(npy.content))
    assert got.dtype == archive.tensor(t["tensor_id"]).dtype and np.array_equal(got, archive.tensor(t["tensor_id"]))
    assert get(client, "/api/tensor/heatmap", 404, id=10**9)["error"]
    assert "integer" in get(client, "/api/tensor", 400, id="../../etc/passwd")["error"]


def test_compare_new_and_stored(served):
    _, archive, client = served
    key = {"target": "fp32_ln1", "bench": "fp32"}
    s = get(client, "/api/compare", **key)
    expect = archive.first_divergence("fp32_ln1", "fp32", store_results=False)
    first = s["firsts"][0]
    assert first["pair_index"] == expect["pair_index"] and first["t_path"] == LN1 and first["b_path"] == LN1
    assert s["summary"]["error"] >= 1 and "verdict" in s["options"]
    # the trees: the first departure is marked on the path down to it, the node coloured error
    path = ""
    for part in LN1.split("/"):
        node = next(c for c in get(client, "/api/compare/tree", side="target", path=path, **key)["children"]
                    if c["name"] == part)
        assert node["firsts"] == [first["pair_index"]]
        path = node["path"]
    assert node["worst"] == 2 and node["link"] == LN1
    bench_root = get(client, "/api/compare/tree", side="bench", **key)["children"]
    assert sum(c["pairs"] for c in bench_root) == s["summary"]["pairs"]
    plot = get(client, "/api/compare/plot", **key)
    assert plot["metric"] == "scaled_err" and len(plot["points"]) == s["summary"]["pairs"]
    assert any(p["floor"] for p in plot["points"])
    only = get(client, "/api/compare/tree", side="target", verdict="error", **key)["children"]
    assert sum(c["pairs"] for c in only) == s["summary"]["error"]
    pairs = get(client, "/api/compare/pairs", side="target", op=LN1, **key)["pairs"]
    assert first["pair_index"] in {p["pair_index"] for p in pairs}
    p = next(p for p in pairs if p["io"] == "output" and p["slot"] == 0)
    diff = archive.tensor(p["t_id"]).astype(np.float32) - archive.tensor(p["b_id"]).astype(np.float32)
    hm = get(client, "/api/pair/heatmap", target=p["t_id"], bench=p["b_id"], h=4, w=4)
    cells = np.frombuffer(base64.b64decode(hm["data"]), "<f4")
    assert cells.max() == pytest.approx(np.abs(diff).max(), rel=1e-6)
    hist = get(client, "/api/pair/histogram", target=p["t_id"], bench=p["b_id"])
    assert sum(hist["counts"]) == diff.size
    # serving stored nothing: a stored compare is one the user made
    assert archive.sql("SELECT count(*) AS n FROM compares").column("n")[0].as_py() == 0
    archive.compare("fp32_ln1", "fp32")
    cid = archive.sql("SELECT max(compare_id) AS c FROM compares").column("c")[0].as_py()
    stored = get(client, "/api/compare", id=cid)
    assert stored["rules"] == "msprobe" and stored["summary"]["pairs"] == s["summary"]["pairs"]
    assert any(c["compare_id"] == cid for c in get(client, "/api/runs")["compares"])
    assert get(client, "/api/compare", 400, id=999)["error"].startswith("no stored compare")


def test_compare_marks_ops_only_one_side_has(served):
    _, _, client = served
    key = {"target": "fp16", "bench": "fp32"}
    s = get(client, "/api/compare", **key)
    assert s["firsts"] == [] and s["summary"]["unmatched_target"] > 0  # clean O2: no departure, its Casts
    target = get(client, "/api/compare/tree", side="target", **key)["children"]
    bench = get(client, "/api/compare/tree", side="bench", **key)["children"]
    assert sum(c["inserted"] for c in target) == s["summary"]["unmatched_target"]
    assert sum(c["removed"] for c in bench) == s["summary"]["unmatched_bench"]
    assert max(c["worst"] or 0 for c in target) < 2


def test_ranks_grid(served):
    _, _, client = served
    data = get(client, "/api/ranks", run="gloo")
    assert data["ranks"] == [0, 1] and len(data["cells"]) == 2 and len(data["ops"]) == len(data["cells"][0])
    departing = {r["rank"] for r in data["groups"] if not r["reference"]}
    # with two ranks of different data the majority is the lowest rank's value (the tie rule)
    assert set(data["cells"][0]) == {"agree"} and ("departs" in data["cells"][1]) == bool(departing)


def test_sql_sandbox_pages_and_downloads(served):
    archive_path, archive, client = served
    q = "SELECT tensor_id, run FROM tensors ORDER BY tensor_id"
    total = archive.sql("SELECT count(*) AS n FROM tensors").column("n")[0].as_py()
    p0 = get(client, "/api/sql", q=q, page_size=100)
    p1 = get(client, "/api/sql", q=q, page_size=100, page=1)
    assert p0["columns"] == ["tensor_id", "run"] and p0["more"] and len(p0["rows"]) == 100
    assert p1["rows"][0][0] == archive.sql(q + " LIMIT 1 OFFSET 100").column("tensor_id")[0].as_py()
    csv = client.get("/api/sql.csv", params={"q": q}).text.splitlines()
    assert csv[0] == "tensor_id,run" and len(csv) == total + 1
    assert len(get(client, "/api/sql.json", q=q)) == total
    assert pq.read_table(io.BytesIO(client.get("/api/sql.parquet", params={"q": q}).content)).num_rows == total
    refused = get(client, "/api/sql", 400, q=f"COPY (SELECT 1) TO '{archive_path}/x.csv'")["error"]
    assert "refused" in refused or "disabled" in refused
    assert not (archive_path / "x.csv").exists()
    assert "refused" in get(client, "/api/sql", 400, q=f"ATTACH '{archive_path}/catalog.duckdb' AS w")["error"]
    assert get(client, "/api/sql", 400, q="DELETE FROM runs")["error"]
    assert len(archive.runs()) == 5


def test_slow_query_cancelled(served, monkeypatch):
    _, _, client = served
    from dumpdb.serve import queries

    monkeypatch.setattr(queries, "QUERY_TIMEOUT", 0.3)
    err = get(client, "/api/sql", 400, q="SELECT sum(hash(x)) FROM range(10000000000) t(x)")["error"]
    assert "timeout" in err  # the sandbox's QueryTimeout
    assert get(client, "/api/sql", q="SELECT 42 AS x")["rows"] == [[42]]  # the next query runs


def test_hostile_names_are_data(served):
    _, _, client = served
    root = get(client, "/api/tree", run=HOSTILE_RUN)["children"]
    node = next(c for c in root if c["name"] == "Module.conv.Conv2d.forward.0")
    while not node.get("op") or node["op"] != HOSTILE_OP:  # its '/' (of </script>) is a tree level
        node = get(client, "/api/tree", run=HOSTILE_RUN, path=node["path"])["children"][0]
    assert node["path"].endswith(HOSTILE_OP)  # whole, 10 kB, as the dump named it
    assert get(client, "/api/search", run=HOSTILE_RUN, q="<script>")["matches"][0]["op"] == HOSTILE_OP
    assert len(get(client, "/api/op", run=HOSTILE_RUN, op=HOSTILE_OP)["tensors"]) > 0
    assert get(client, "/api/op", 400, run=HOSTILE_RUN, op="' OR 1=1 --")["error"].startswith("no op")


def test_firsts_per_phase_and_rank_when_reported():
    from dumpdb.serve.compares import _firsts

    report = {"pair_index": 7, "target_name": "op7", "io": "output", "slot": 0, "result": "error",
              "by_phase": {"forward": {"pair_index": 7, "target_name": "op7"},
                           "backward": {"pair_index": 40, "target_name": "op40"}},
              "by_rank": [{"rank": 1, "pair_index": 9, "target_name": "op9"}], "path": ["op1", "op2"]}
    got = [(f["label"], f["pair_index"]) for f in _firsts(report)]
    assert got == [("overall", 7), ("by_phase forward", 7), ("by_phase backward", 40), ("by_rank 1", 9)]
    assert _firsts(None) == [] and [f["label"] for f in _firsts({"pair_index": 3})] == ["overall"]


def test_cli_serve_url_and_ctrl_c(served):
    import signal
    import socket
    import urllib.request

    archive_path = served[0]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(Path(dumpdb.__file__).parent.parent)}
    proc = subprocess.Popen([sys.executable, "-m", "dumpdb", "serve", "-a", str(archive_path), "--port", str(port)],
                            env=env, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        assert f"http://127.0.0.1:{port}/" in line, line
        for _ in range(100):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/runs", timeout=5) as r:
                    runs = json.loads(r.read())
                break
            except OSError:
                time.sleep(0.1)
        assert {r["run"] for r in runs["runs"]} >= {"fp32", "fp32_ln1"}
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()


def _tiny_dump(out: Path, files: int) -> None:
    """A MindSpore e2e dump of ``files`` tiny float32 tensors over 4 iterations."""
    rng = np.random.default_rng(0)
    (out / "rank_0" / ".dump_metadata").mkdir(parents=True)
    for it in range(4):
        folder = out / "rank_0" / "Net" / "0" / str(it)
        folder.mkdir(parents=True)
        for k in range(files // 4):
            np.save(folder / f"MatMul.Default_network-Net_layer{k % 7}-Dense_MatMul-op{k}.0.0."
                             f"{1_795_336_652_543_735 + k}.output.0.DefaultFormat.Float32.npy",
                    rng.standard_normal(4).astype(np.float32))


def test_served_while_ingesting(served, tmp_path):
    archive_path, _, client = served
    files = 2_000
    _tiny_dump(tmp_path / "dump", files)
    env = {**os.environ, "PYTHONPATH": str(Path(dumpdb.__file__).parent.parent)}
    # the real `dumpdb ingest`, committing every 400 files instead of 5,000 (a smaller dump grows visibly)
    # After each commit the ingest waits (at most 10 s) until the server has answered a query
    # (the flag file removed below): the run is seen between commits however fast the machine.
    flag = tmp_path / "committed"
    env["DUMPDB_TEST_COMMIT_FLAG"] = str(flag)
    code = ("import os, sys, time; import dumpdb.ingestion.pipeline as p; p.COMMIT_ROWS = 400\n"
            "write = p.CatalogSink.write\n"
            "def hooked(self, *a, **k):\n"
            "    out = write(self, *a, **k)\n"
            "    flag = os.environ['DUMPDB_TEST_COMMIT_FLAG']; open(flag, 'w').close(); t = time.monotonic()\n"
            "    while os.path.exists(flag) and time.monotonic() - t < 10: time.sleep(0.02)\n"
            "    return out\n"
            "p.CatalogSink.write = hooked\n"
            "from dumpdb.__main__ import main; sys.argv[0] = 'dumpdb'; main()")
    proc = subprocess.Popen([sys.executable, "-c", code, "ingest", str(tmp_path / "dump"), "--archive",
                             str(archive_path), "--run", "growing", "--workers", "1"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    seen = []
    try:
        # polled as a page refreshing would (each query holds DuckDB's file lock for its length,
        # which a writer's commit waits for: a client querying without pause delays commits)
        while proc.poll() is None:
            seen.append(get(client, "/api/sql", q="SELECT count(*) FROM tensors WHERE run = 'growing'")["rows"][0][0])
            if len(seen) % 10 == 0 and "growing" in {r["run"] for r in get(client, "/api/runs")["runs"]}:
                get(client, "/api/tree", run="growing")
            if flag.exists():
                flag.unlink()
            time.sleep(0.2)
        out = proc.communicate()[0].decode()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    final = {r["run"]: r for r in get(client, "/api/runs")["runs"]}["growing"]
    assert final["tensors"] == files and final["state"] == "complete"
    assert any(0 < n < files for n in seen), seen  # the run was seen growing
    assert seen == sorted(seen)
