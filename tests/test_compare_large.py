"""The compare engine's large-pair path (issue 13, tensor compare speed): worker threads,
pairs of the same two payloads computed once, and a large pair's chunks computed in
parallel and folded in order, each giving what ``metrics.tensor_metrics`` gives pair by pair."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
from conftest import record_pools
from threadpoolctl import threadpool_limits

import dumpdb
import dumpdb.compare.engine as engine
from dumpdb.compare import metrics
from dumpdb.compare.engine import compare
from dumpdb.compare.metrics import TENSOR_METRICS, tensor_metrics

N = 70_000  # elements a tensor: above engine.SMALL_ELEMENTS (the batched path)


def _dump(root: Path, payloads: list[np.ndarray]) -> None:
    """A MindSpore e2e dump (one iteration), op k's output 0 holding ``payloads[k]``."""
    rank = root / "rank_0"
    (rank / ".dump_metadata").mkdir(parents=True)
    (rank / ".dump_metadata" / "config.json").write_text('{"device_target":"CPU","ms_version":"2.10.0"}')
    folder = rank / "Net" / "0" / "0"
    folder.mkdir(parents=True)
    stamp = 1_795_336_652_543_735
    for k, x in enumerate(payloads):
        name = f"Default_network-WithLossCell__backbone-Net_layer{k}-Dense_MatMul-op{k}"
        kind = {np.dtype(np.float32): "Float32", np.dtype(np.float16): "Float16"}[x.dtype]
        np.save(folder / f"MatMul.{name}.0.0.{stamp + 17 * k}.output.0.DefaultFormat.{kind}.npy", x)


def _archive(tmp_path: Path) -> tuple[Path, list[np.ndarray], list[np.ndarray]]:
    """Runs ``target`` (float16) and ``bench`` (float32) whose pairs repeat: ops 0, 1 and 3
    compare the same two payloads, op 2 another pair, op 4 the target of op 0 against
    another bench payload."""
    rng = np.random.default_rng(7)
    a, b, c = (rng.standard_normal(N).astype(np.float32) for _ in range(3))
    a[::5] = 0.0  # bench zeros: the relative errors' eps rule
    noisy = [(x * (1 + 1e-3 * rng.standard_normal(N))).astype(np.float16) for x in (a, b)]
    target = [noisy[0], noisy[0], noisy[1], noisy[0], noisy[0]]
    bench = [a, a, b, a, c]
    _dump(tmp_path / "target", target)
    _dump(tmp_path / "bench", bench)
    archive = tmp_path / "a.dumpdb"
    for run in ("bench", "target"):
        assert dumpdb.ingest(tmp_path / run, archive=archive, run=run).ok
    return archive, target, bench


def _rows(results) -> dict[str, dict]:
    return {r["target_name"]: r for r in results.to_pylist()}


def _assert_metrics_of_each_pair(results, target, bench) -> None:
    """Each of the five pairs' stored metrics are tensor_metrics' of its arrays (one BLAS
    thread), and its message starts with tensor_metrics' (then the verdict's reason)."""
    rows = _rows(results)
    for k in range(5):
        row = next(r for name, r in rows.items() if name.endswith(f"-op{k}"))
        with threadpool_limits(1, user_api="blas"):
            want, message = tensor_metrics(target[k], bench[k])
        assert {m: row[m] for m in TENSOR_METRICS} == want, k
        assert row["err_message"].startswith(message)


def test_pairs_of_the_same_payloads_are_computed_once(tmp_path, monkeypatch):
    archive, target, bench = _archive(tmp_path)
    calls = []
    real = engine._read_pair

    def counting(store, t, b):
        calls.append(repr((t, b)))
        return real(store, t, b)

    monkeypatch.setattr(engine, "_read_pair", counting)
    out = compare(dumpdb.open(archive), "target", "bench", workers=1, store_results=False).results
    assert len(calls) == len(set(calls)) == 3  # ops 0/1/3 once, op 2, op 4
    rows = _rows(out)
    assert len(rows) == 5
    for k in range(5):
        row = next(r for name, r in rows.items() if name.endswith(f"-op{k}"))
        with threadpool_limits(1, user_api="blas"):  # as the engine: one BLAS thread, the same sums
            want, _ = tensor_metrics(target[k], bench[k])
        assert {m: row[m] for m in TENSOR_METRICS} == want, k
        assert row["err_message"] is not None and "dtype mismatch" in row["err_message"]
    assert rows[next(n for n in rows if n.endswith("-op0"))]["max_abs_err"] > 0


def test_worker_threads_give_the_one_thread_results(pair_archive, monkeypatch):
    """Large pairs on ``workers`` threads (below PROCESS_MIN_BYTES): the same bits as one thread."""
    monkeypatch.setattr(engine, "SMALL_ELEMENTS", 0)  # every pair one by one (no batched path)
    a = dumpdb.open(pair_archive)
    one = compare(a, "fp16", "fp32", workers=1, store_results=False).results
    started = record_pools(monkeypatch, engine, "ThreadPoolExecutor")
    many = compare(a, "fp16", "fp32", workers=2, store_results=False).results
    assert 2 in started
    columns = [*TENSOR_METRICS, "result", "err_message", "mode"]
    assert one.num_rows == many.num_rows > 50
    assert [repr(v) for c in columns for v in many.column(c).to_pylist()] == \
        [repr(v) for c in columns for v in one.column(c).to_pylist()]


def test_a_large_pair_runs_as_segments_on_worker_threads(tmp_path, monkeypatch):
    """A pair cut into segments (one chunk each here) on two threads, folded in chunk
    order: tensor_metrics' bits."""
    archive, target, bench = _archive(tmp_path)
    monkeypatch.setattr(metrics, "SEGMENT_CHUNKS", 1)
    segments = []
    real = metrics.SplitPair.tasks

    def recording(self, segment=None):
        found = real(self, segment)
        segments.append(len(found))
        return found

    monkeypatch.setattr(metrics.SplitPair, "tasks", recording)
    out = compare(dumpdb.open(archive), "target", "bench", workers=2, store_results=False).results
    assert segments == [2, 2, 2]  # 70,000 elements: two 64 Ki-element chunks, one segment each
    _assert_metrics_of_each_pair(out, target, bench)


def test_pairs_read_ahead_stay_within_the_inflight_bytes(tmp_path, monkeypatch):
    """The thread path reads a queued pair as soon as a thread is free (its segments wait
    behind it): only ``INFLIGHT_BYTES`` of pairs may be queued, or the read-ahead sets the
    peak memory (issue 29: 256 MiB put the Transformer pair's compare over 1 GB once)."""
    archive, target, bench = _archive(tmp_path)
    pair = target[0].nbytes + bench[0].nbytes  # every computed pair here: float16 against float32
    monkeypatch.setattr(engine, "INFLIGHT_BYTES", pair)  # one pair at a time
    lock = threading.Lock()
    started, finished, ahead = [0], [0], []
    read, finish, land = engine._read_pair, engine._finish, engine._EarlyPairs._land

    def reading(store, t, b):
        with lock:
            started[0] += 1
            ahead.append(started[0] - finished[0])
        return read(store, t, b)

    def finishing(item, res, computed):
        done = finish(item, res, computed)
        with lock:
            finished[0] += 1
        return done

    def landing(self, item):  # the exact pairs started during the alignment (_EarlyPairs)
        done = land(self, item)
        with lock:
            finished[0] += 1
        return done

    monkeypatch.setattr(engine, "_read_pair", reading)
    monkeypatch.setattr(engine, "_finish", finishing)
    monkeypatch.setattr(engine._EarlyPairs, "_land", landing)
    out = compare(dumpdb.open(archive), "target", "bench", workers=2, store_results=False).results
    assert out.num_rows == 5 and started[0] == 3 and max(ahead) == 1


def test_exact_pairs_start_during_the_alignment_and_a_repaired_pair_is_not_taken(tmp_path, monkeypatch):
    """The exact pairs go to the worker threads while the alignment still runs
    (_EarlyPairs, issue 29); a result is taken only for a final pair of the same payloads:
    pairs the alignment then changes give the rows of a compare that started nothing early."""
    archive, _, _ = _archive(tmp_path)
    a = dumpdb.open(archive)
    columns = [c for c in engine.RESULT_COLUMNS if c != "compare_id"]

    def table(out):
        return [repr(v) for c in columns for v in out.column(c).to_pylist()]

    with monkeypatch.context() as m:
        m.setattr(engine._EarlyPairs, "start", lambda self, pairs: None)  # nothing early: the loop after align
        want = table(compare(a, "target", "bench", workers=2, store_results=False).results)

    real_exact, read = engine.align_exact, engine._read_pair
    read_during_alignment = threading.Event()

    def reading(store, t, b):
        read_during_alignment.set()
        return read(store, t, b)

    def exact_then_wait(*args, **kwargs):
        found = real_exact(*args, **kwargs)
        read_during_alignment.wait(10)  # the alignment goes on: a read must come meanwhile
        return found

    monkeypatch.setattr(engine, "_read_pair", reading)
    monkeypatch.setattr(engine, "align_exact", exact_then_wait)
    assert table(compare(a, "target", "bench", workers=2, store_results=False).results) == want
    assert read_during_alignment.is_set()

    def crossed(*args, on_pairs=None, **kwargs):
        """Exact pairs each with another bench tensor (as a content check might take them
        back), then align() decides the real pairs."""
        def shifted(pairs):
            bench = pairs.column("bench_tensor_id").to_pylist()
            on_pairs(pairs.set_column(1, "bench_tensor_id", pa.array(bench[1:] + bench[:1], pa.int64())))
        real_exact(*args, on_pairs=shifted, **kwargs)
        return None

    started = []
    real_start = engine._EarlyPairs.start
    monkeypatch.setattr(engine._EarlyPairs, "start", lambda self, pairs: (started.append(self),
                                                                        real_start(self, pairs))[1])
    monkeypatch.setattr(engine, "align_exact", crossed)
    assert table(compare(a, "target", "bench", workers=2, store_results=False).results) == want
    assert started and len(started[0]._seen) >= 2  # the crossed pairs were computed, and not taken


def test_a_null_shape_and_the_0d_shape_are_different_pairs():
    """Repeated large pairs share metrics by key: a NULL shape (unknown) must not take the
    metrics of a 0-d tensor's pair (shape ())."""
    row = {"content_hash": "h", "dtype": "float32", "shape": None, "stats_source": "computed", "nan_count": 0,
           "pos_inf_count": 0, "neg_inf_count": 0, "min": -1.0, "max": 1.0}
    scalar = {**row, "shape": []}
    assert engine._pair_key(row, row) != engine._pair_key(scalar, scalar)
    assert engine._pair_key(scalar, scalar) == engine._pair_key({**scalar}, {**scalar})


def test_a_large_pair_in_one_pack_chunk_is_read_as_views_of_the_chunk_cache(tmp_path, monkeypatch):
    """The worker threads read a large pair's pack payloads that lie in one chunk as read-only
    views of the store's chunk cache (TensorStore.read_many), not as copies (TensorStore.read):
    the same bits as tensor_metrics of the arrays; each such payload counts as its whole
    chunk against INFLIGHT_BYTES (_held_bytes)."""
    from dumpdb.storage.store import MEDIUM_CHUNK_BYTES, TensorStore

    archive, target, bench = _archive(tmp_path)
    copies, views = [], []
    real_read, real_pair = TensorStore.read, engine._read_pair

    def reading(self, array_path, elem_offset, *args, **kwargs):
        copies.append(array_path)
        return real_read(self, array_path, elem_offset, *args, **kwargs)

    def pair(store, t, b):
        found = real_pair(store, t, b)
        views.extend(not x.flags.writeable for x in found)
        return found

    monkeypatch.setattr(TensorStore, "read", reading)
    monkeypatch.setattr(engine, "_read_pair", pair)
    out = compare(dumpdb.open(archive), "target", "bench", workers=2, store_results=False).results
    # three computed pairs, six read-only sides, none read as a copy but a float16 payload
    # across the boundary of two 256 KiB chunks (a new array: TensorStore.read)
    assert views == [True] * 6 and len(copies) <= 1 and all("float16" in path for path in copies)
    _assert_metrics_of_each_pair(out, target, bench)
    x = {"nbytes": 1000, "elem_offset": 0}
    assert engine._held_bytes(x, {"nbytes": 1000, "elem_offset": None}) == MEDIUM_CHUNK_BYTES + 1000
    assert engine._held_bytes({"nbytes": 3 * MEDIUM_CHUNK_BYTES, "elem_offset": 7}, x) == 4 * MEDIUM_CHUNK_BYTES
