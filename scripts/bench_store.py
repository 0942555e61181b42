"""Tensor stores side by side: local disk vs S3 (moto, or SeaweedFS), and the two S3 clients.

Usage::

    python scripts/bench_store.py --clients            # obstore vs s3fs on one moto server
    python scripts/bench_store.py --ingest DUMP_DIR    # ingest + reads: local disk vs S3 (SeaweedFS)
    python scripts/bench_store.py --ingest DUMP_DIR --server moto
    python scripts/bench_store.py --synthetic-gb 0.5   # a generated MindSpore dump (scripts/bench_ingest.py's)

Every figure is measured in this run; ratios are against the baseline measured beside it
(``--clients``: s3fs; ``--ingest``: local disk). Servers listen on 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the test servers (storage_servers)

from storage_servers import moto_server, open_s3fs, seaweedfs_server  # noqa: E402

from dumpdb.storage.objects import ObjectStore  # noqa: E402
from dumpdb.storage.remote import open_store  # noqa: E402


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


def bench_client(client: str, url: str, small_n: int, large_mb: int, conc: int) -> dict[str, float]:
    """Put/get figures of one client on ``url`` (the same server for both clients)."""
    objects = ObjectStore(open_s3fs(url) if client == "s3fs" else open_store(url), url)
    rng = np.random.default_rng(0)
    big = rng.integers(0, 255, large_mb << 20, dtype=np.uint8).tobytes()
    out: dict[str, float] = {}
    t = time.perf_counter()
    for i in range(3):
        objects.set(f"big/{i}", [big])
    out["put MB/s"] = 3 * len(big) / (1 << 20) / (time.perf_counter() - t)
    t = time.perf_counter()
    for i in range(3):
        assert len(objects.get(f"big/{i}")) == len(big)
    out["get MB/s"] = 3 * len(big) / (1 << 20) / (time.perf_counter() - t)
    lat = []
    for i in range(small_n):
        lo = (i * 7919 * 4096) % (len(big) - 65536)
        t = time.perf_counter()
        objects.get("big/0", lo, lo + 16384)
        lat.append(time.perf_counter() - t)
    out["ranged 16KiB p50 ms"] = pct(lat, 50) * 1e3
    out["ranged 16KiB p99 ms"] = pct(lat, 99) * 1e3
    t = time.perf_counter()
    with ThreadPoolExecutor(conc) as pool:
        list(pool.map(lambda i: objects.get("big/1", (i * 65536) % (len(big) - 16384),
                                            (i * 65536) % (len(big) - 16384) + 16384), range(small_n)))
    out[f"ranged x{conc} threads req/s"] = small_n / (time.perf_counter() - t)
    t = time.perf_counter()
    for i in range(small_n // 4):
        objects.set(f"small/{i}", [b"x" * 4096])
    out["small put req/s"] = (small_n // 4) / (time.perf_counter() - t)
    t = time.perf_counter()
    n = sum(1 for _ in objects.iter_prefix("small"))
    out["list keys/s"] = n / (time.perf_counter() - t)
    return out


def run_clients(args) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-store-") as tmp, \
            (moto_server() if args.server == "moto" else seaweedfs_server(Path(tmp) / "weed")) as server:
        os.environ.update(server.env())
        bucket = server.bucket()
        results = {c: bench_client(c, f"s3://{bucket}/{c}", args.small, args.large_mb, args.concurrency)
                   for c in ("s3fs", "obstore")}
    print(f"clients on {args.server} (127.0.0.1); {args.large_mb} MiB objects, {args.small} small requests")
    print(f"{'figure':28s} {'s3fs':>10s} {'obstore':>10s} {'obstore/s3fs':>13s}")
    for key in results["s3fs"]:
        a, b = results["s3fs"][key], results["obstore"][key]
        print(f"{key:28s} {a:10.2f} {b:10.2f} {b / a:12.2f}x")


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def ingest_once(dump: Path, archive: Path, store: str | None) -> float:
    import dumpdb

    t = time.perf_counter()
    report = dumpdb.ingest(dump, archive=archive, run="r", store=store)
    assert report.ok, report.errors[:3]
    return time.perf_counter() - t


def read_figures(archive: Path, n: int) -> dict[str, float]:
    """Small-tensor read latency (each from a different 1 MiB chunk: no chunk-cache hit; a pack's
    first read also fetches its zarr.json and shard index) and large-tensor read throughput."""
    import dumpdb

    a = dumpdb.open(archive)
    a.__enter__()  # one catalog connection for all reads (what a loop over tensors does)
    small = [r["id"] for r in a.sql(f"""
        SELECT min(t.tensor_id) AS id FROM tensors t JOIN blobs b USING (content_hash)
        WHERE b.elem_offset IS NOT NULL AND t.nbytes BETWEEN 1 AND 65536
        GROUP BY b.array_path, (b.elem_offset * (t.nbytes // b.elem_count)) // 1048576
        ORDER BY hash(min(t.tensor_id)) LIMIT {int(n)}""").to_pylist()]
    large = [r["tensor_id"] for r in a.sql(
        "SELECT min(tensor_id) AS tensor_id FROM tensors WHERE nbytes > 0 GROUP BY content_hash "
        "ORDER BY max(nbytes) DESC LIMIT 8").to_pylist()]
    a.tensor(large[-1])  # warm-up: opens the store (zarr import), not timed
    lat = []
    for tid in small:
        t = time.perf_counter()
        a.tensor(tid)
        lat.append(time.perf_counter() - t)
    t = time.perf_counter()
    total = sum(a.tensor(tid).nbytes for tid in large)
    gbs = total / (time.perf_counter() - t) / 1e9
    a.close()
    return {"small reads": float(len(lat)),
            "small p50 ms": pct(lat, 50) * 1e3 if lat else float("nan"),
            "small p99 ms": pct(lat, 99) * 1e3 if lat else float("nan"),
            "large GB/s": gbs, "large MB": total / 1e6}


def large_array_figures(location, mb: int) -> dict[str, float]:
    """Write and read back one tensor of ``mb`` MiB (its own large array: chunks of ~4 MiB in one
    shard) through TensorStore/StoreWriter; GB/s of each."""
    from dumpdb.storage.store import StoreWriter, TensorStore, payload_hash

    TensorStore.create(location)
    x = np.random.default_rng(3).standard_normal((mb, 1 << 18)).astype(np.float32)
    writer = StoreWriter(TensorStore(location, read_only=False))
    t = time.perf_counter()
    writer.add(payload_hash(x), x)
    (loc,) = writer.flush()
    put = time.perf_counter() - t
    writer.close()
    reader = TensorStore(location)
    t = time.perf_counter()
    y = reader.read(loc.array_path, None, x.size, x.dtype, x.shape)
    get = time.perf_counter() - t
    assert y.tobytes() == x.tobytes()
    return {f"{mb} MiB tensor write GB/s": x.nbytes / put / 1e9, f"{mb} MiB tensor read GB/s": x.nbytes / get / 1e9}


def run_ingest(args) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-store-") as tmp, ExitStack() as stack:
        tmp_path = Path(tmp)
        if args.synthetic_gb:
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            from bench_ingest import generate

            files, payload = generate(tmp_path / "gen", args.synthetic_gb, 1, 0)
            dump = tmp_path / "gen" / "dump"
            print(f"synthetic dump: {files} files, {payload / 1e9:.2f} GB payload")
        else:
            dump = Path(args.ingest)
        server = stack.enter_context(moto_server() if args.server == "moto"
                                     else seaweedfs_server(tmp_path / "weed"))
        os.environ.update(server.env())
        bucket = server.bucket()
        # warm-up (imports, page cache of the dump) so neither side pays them
        ingest_once(dump, tmp_path / "warm", None)
        figures = {}
        import dumpdb

        times: dict[str, list[float]] = {"local": [], args.server: []}
        for rep in range(args.repeats):  # alternate local / S3: drifts of a shared machine hit both
            for label, store in (("local", None), (args.server, f"s3://{bucket}/bench-{rep}")):
                archive = tmp_path / f"archive-{label}-{rep}"
                times[label].append(ingest_once(dump, archive, store))
        print("ingest seconds per repeat: " + "; ".join(f"{k} {', '.join(f'{t:.2f}' for t in v)}"
                                                        for k, v in times.items()))
        for label in times:
            archive = tmp_path / f"archive-{label}-{args.repeats - 1}"
            secs = float(np.median(times[label]))
            bytes_in = dumpdb.open(archive).show("r")["bytes_in"]
            figures[label] = {"ingest s (median)": secs, "ingest MB/s": bytes_in / secs / 1e6,
                              "payload MB": bytes_in / 1e6,
                              "local dir MB": dir_bytes(archive) / 1e6,
                              "local dir w/o catalog MB": (dir_bytes(archive)
                                                           - (archive / "catalog.duckdb").stat().st_size) / 1e6,
                              **read_figures(archive, args.small),
                              **large_array_figures(tmp_path / "large.zarr" if label == "local"
                                                    else f"s3://{bucket}/large", args.large_mb)}
    base, other = figures["local"], figures[args.server]
    print(f"{'figure':26s} {'local':>10s} {args.server:>10s} {'ratio':>8s}")
    for key in base:
        ratio = other[key] / base[key] if base[key] else float("nan")
        print(f"{key:26s} {base[key]:10.3f} {other[key]:10.3f} {ratio:7.2f}x")
    print(f"ingest throughput {args.server}/local: {other['ingest MB/s'] / base['ingest MB/s']:.2f}x (goal >= 0.5x)")
    print(f"local dir besides the catalog / payload bytes ({args.server}): "
          f"{other['local dir w/o catalog MB'] / other['payload MB'] * 100:.2f} % (goal <= 10 %)")


def main() -> None:
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's per-request log lines
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", action="store_true", help="obstore vs s3fs on a moto server")
    ap.add_argument("--ingest", metavar="DUMP_DIR", help="ingest + reads: local disk vs S3")
    ap.add_argument("--synthetic-gb", type=float, metavar="GB", help="generate a MindSpore dump of GB and ingest it")
    ap.add_argument("--repeats", type=int, default=3, help="ingest pairs (local, S3), alternated")
    ap.add_argument("--server", choices=("seaweedfs", "moto"), default="seaweedfs")
    ap.add_argument("--small", type=int, default=300, help="small reads/puts per figure")
    ap.add_argument("--large-mb", type=int, default=128, help="large object / tensor size (MiB)")
    ap.add_argument("--concurrency", type=int, default=16)
    args = ap.parse_args()
    if args.clients:
        run_clients(args)
    if args.ingest or args.synthetic_gb:
        run_ingest(args)
    if not (args.clients or args.ingest or args.synthetic_gb):
        ap.error("give --clients and/or --ingest DUMP_DIR / --synthetic-gb GB")


if __name__ == "__main__":
    main()
