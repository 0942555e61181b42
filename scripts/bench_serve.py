"""dumpdb serve speed (issue 28): p95 page / API times against a bare Archive.sql of the same
query in the same run, on an archive of statistics-only tensors (bench_scale.py's generator:
MindSpore statistic.csv rows, ingested without payloads), and a heatmap of a 64 MiB tensor.

    python scripts/bench_serve.py --work /tmp/serve-bench [--rows 1000000] [--repeat 20]

The archive is built once in WORK and reused. Goals: tree and compare API within 2x of the
bare query; the 64 MiB tensor's heatmap under 0.5 s. Prints the figures (no assertion).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import bench_scale  # noqa: E402

import dumpdb  # noqa: E402
from dumpdb.archive import is_archive  # noqa: E402
from dumpdb.serve import create_app, queries  # noqa: E402


def p95(times: list[float]) -> float:
    return sorted(times)[max(0, int(round(0.95 * len(times))) - 1)]


def timed(fn, repeat: int) -> list[float]:
    fn()  # warm
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    archive_path = args.work / "bench.dumpdb"
    if not is_archive(archive_path):
        for run in ("a", "b"):
            dump = args.work / f"dump_{run}"
            if not dump.exists():
                bench_scale.make_stats(dump, 1, 4, args.rows // 2)
            t = time.perf_counter()
            assert dumpdb.ingest(dump, archive=archive_path, run=run).ok
            print(f"ingest {run}: {args.rows // 2} rows in {time.perf_counter() - t:.1f} s")
        big = args.work / "big"
        (big / "rank_0" / ".dump_metadata").mkdir(parents=True, exist_ok=True)
        folder = big / "rank_0" / "Net" / "0" / "0"
        folder.mkdir(parents=True, exist_ok=True)
        np.save(folder / "MatMul.Default_network-Net_MatMul-op0.0.0.1700000000000000.output.0.DefaultFormat."
                         "Float32.npy", np.random.default_rng(0).standard_normal((4096, 4096)).astype(np.float32))
        assert dumpdb.ingest(big, archive=archive_path, run="big").ok
    archive = dumpdb.open(archive_path)
    from starlette.testclient import TestClient

    client = TestClient(create_app(archive))
    n = archive.sql("SELECT count(*) AS n FROM tensors").column("n")[0].as_py()
    print(f"archive: {n} tensors")
    prefix = "Default/network-Net"
    rows = []

    def case(name, bare, served):
        b, s = timed(bare, args.repeat), timed(served, args.repeat)
        rows.append((name, p95(b), p95(s), statistics.median(b), statistics.median(s)))

    tree_params = {"run": "a", "prefix": prefix, "limit": 501, "offset": 0}
    case("tree API (children of a node of 500k ops)",
         lambda: archive.sql(queries.CHILDREN_SQL, tree_params),
         lambda: client.get("/api/tree", params={"run": "a", "path": prefix}).raise_for_status())

    def tree_page():  # what the browser fetches to show a run's tree: the shell, then the root's children
        client.get("/tree", params={"run": "a"}).raise_for_status()
        client.get("/api/tree", params={"run": "a"}).raise_for_status()

    case("tree page load (shell + root children)",
         lambda: archive.sql(queries.CHILDREN_SQL, {**tree_params, "prefix": ""}), tree_page)
    case("search API", lambda: archive.sql(queries.SEARCH_SQL, {"run": "a", "q": "op4242", "limit": 101}),
         lambda: client.get("/api/search", params={"run": "a", "q": "op4242"}).raise_for_status())
    t = time.perf_counter()
    client.get("/api/compare", params={"target": "a", "bench": "b"}).raise_for_status()
    build = time.perf_counter() - t
    t = time.perf_counter()
    archive.compare("a", "b", store_results=False)
    bare_compare = time.perf_counter() - t
    print(f"new compare a vs b: served (compare + view) {build:.2f} s, bare Archive.compare {bare_compare:.2f} s "
          f"({build / bare_compare:.2f}x)")
    case("compare tree API (target root)",
         lambda: archive.sql(queries.CHILDREN_SQL, {**tree_params, "prefix": ""}),
         lambda: client.get("/api/compare/tree", params={"target": "a", "bench": "b", "side": "target"}
                            ).raise_for_status())
    case("compare tree API (a node of 500k pairs)",
         lambda: archive.sql(queries.CHILDREN_SQL, tree_params),
         lambda: client.get("/api/compare/tree", params={"target": "a", "bench": "b", "side": "target",
                                                         "path": prefix}).raise_for_status())

    def compare_page():  # the compare page's fetches once the compare is held: summary, both roots, plot
        key = {"target": "a", "bench": "b"}
        client.get("/compare", params=key).raise_for_status()
        client.get("/api/compare", params=key).raise_for_status()
        for side in ("target", "bench"):
            client.get("/api/compare/tree", params={**key, "side": side}).raise_for_status()
        client.get("/api/compare/plot", params=key).raise_for_status()

    case("compare page load (summary, 2 trees, plot)",
         lambda: archive.sql(queries.CHILDREN_SQL, {**tree_params, "prefix": ""}), compare_page)
    tid = archive.sql("SELECT tensor_id FROM tensors WHERE run = 'big'").column(0)[0].as_py()
    heat = timed(lambda: client.get("/api/tensor/heatmap", params={"id": tid}).raise_for_status(), 5)
    read = timed(lambda: archive.tensor(tid), 5)
    print(f"\n{'what':45} {'bare p95':>9} {'served p95':>11} {'ratio':>6}  (medians)")
    for name, b, s, mb, ms in rows:
        print(f"{name:45} {b * 1000:8.1f}ms {s * 1000:10.1f}ms {s / b:6.2f}  ({mb * 1000:.1f} / {ms * 1000:.1f} ms)")
    print(f"heatmap of a 64 MiB float32 tensor: p95 {p95(heat):.3f} s (goal < 0.5 s); "
          f"bare Archive.tensor read p95 {p95(read):.3f} s")


if __name__ == "__main__":
    main()
