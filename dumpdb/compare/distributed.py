"""Analysis on a ``dask.distributed`` cluster (issue 29): ``compare``, ``first-divergence``,
``scan`` and ``ranks`` with ``scheduler=ADDRESS|"local"`` (CLI ``--scheduler``).

The process that asks (the *driver*) keeps every decision the local run makes: it selects
and aligns the pairs, settles what needs no payload (statistics-mode pairs in DuckDB,
identical payloads from the definitions, repeats of a large pair), judges and stores. Only
the payload work - read both tensors, compute the metrics - goes to the cluster, as tasks
that each name payload locations (array path, offset, count, dtype, shape, content hash)
and open the archive's store themselves: the local ``tensors.zarr`` at the same path on a
shared file system, or the ``s3://`` store its marker names, with the credentials of the
worker's own ``AWS_*`` environment (:class:`StoreSpec`; no catalog, no payload byte passes
through the driver). A task returns metric values, which the driver puts at the pairs'
rows: the ``compare_results`` rows and the answer are those of the local run, bit for bit,
because each pair's metrics are computed by the same functions on the same bytes whatever
the process (small pairs by ``metrics.tensor_metrics_batch``, whose values do not depend on
the batch, large pairs whole by ``metrics.tensor_metrics``: the segments of the local path
fold to the same bits; tests/test_distributed.py).

**Partition** (:func:`partition`): pairs are grouped by where their payloads lie - the
target's array (a pack, or a large array of its own) and the bench's - so a pack's shards
are read by one task, once, in offset order (``TensorStore.read_many`` decodes each chunk
once); a group is cut into tasks of at most :data:`TASK_BYTES` of payload.

**Memory per worker** (one task per worker thread; ``"local"`` starts single-threaded
workers): a small-pair task holds one batch of at most ``engine.BATCH_ELEMENTS`` elements a
side (<= 8 MB as float64) plus the store's chunk cache (``TensorStore``: 64 MB); a large
pair task holds one pair at a time, both payloads whole, plus the kernel's chunk
temporaries - at most 2 x the largest payload + 64 MB + 72 MB per worker thread, the same
as one thread of the local engine. A scan task holds one tensor (or one tensor and its
previous iteration's) at a time plus the chunk cache. The driver holds what the local run
holds (both sides' rows and the result columns) plus one small result per task.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

TASK_BYTES = 256 << 20  # payload bytes (both sides) a task reads at most (a pack is rarely cut)


@dataclass(frozen=True)
class StoreSpec:
    """How a worker opens the archive's tensor store: ``location`` (the ``s3://`` URL, or the
    local ``tensors.zarr`` path, which a remote worker must see at the same path),
    ``options`` (``--storage-option`` values; credentials otherwise from the worker's
    ``AWS_*`` environment) and ``verify`` (re-hash every payload read, as the archive does)."""

    location: str
    options: tuple[tuple[str, str], ...] = field(default=())
    verify: bool = True

    def open(self):
        """This process's read-only :class:`~dumpdb.storage.store.TensorStore` for the spec
        (opened once per process and kept: its caches serve the next task)."""
        with _OPEN_LOCK:
            store = _OPEN.get(self)
            if store is None:
                from dumpdb.storage.store import TensorStore

                store = TensorStore(self.location, read_only=True, storage_options=dict(self.options),
                                    verify=self.verify)
                _OPEN[self] = store
            return store


_OPEN: dict[StoreSpec, Any] = {}
_OPEN_LOCK = threading.Lock()


def store_spec(archive) -> StoreSpec:
    """The :class:`StoreSpec` of ``archive``'s store (``dumpdb.json``: its URL and remembered
    options, overlaid by the archive's ``storage_options``)."""
    from dumpdb.archive import STORE, store_config

    url, options = store_config(archive.path)
    merged = {**options, **archive.storage_options}
    return StoreSpec(url or str(Path(archive.path) / STORE), tuple(sorted((k, str(v)) for k, v in merged.items())),
                     bool(archive.verify_reads))


def workers_for(workers: int | None) -> int:
    """Worker processes of a ``"local"`` cluster: ``workers``, else this machine's cores."""
    import os

    return workers or os.cpu_count() or 2


# --------------------------------------------------------------------------- partition
def partition(tarrays: Sequence[str | None], barrays: Sequence[str | None], nbytes: Sequence[int],
              task_bytes: int = TASK_BYTES) -> list[np.ndarray]:
    """Positions ``0..n-1`` grouped by where both payloads lie (``tarrays[k]``,
    ``barrays[k]``: the array paths of pair k), each group in its given order and cut into
    runs of at most ``task_bytes`` of payload (``nbytes[k]``: both sides; a pair larger than
    that is a task alone). Groups come in order of their first position."""
    groups: dict[tuple, list[int]] = {}
    for k, key in enumerate(zip(tarrays, barrays)):
        groups.setdefault(key, []).append(k)
    tasks: list[np.ndarray] = []
    for members in groups.values():
        current: list[int] = []
        size = 0
        for k in members:
            if current and size + nbytes[k] > task_bytes:
                tasks.append(np.asarray(current, np.int64))
                current, size = [], 0
            current.append(k)
            size += nbytes[k]
        if current:
            tasks.append(np.asarray(current, np.int64))
    return tasks


# --------------------------------------------------------------------------- compare
def _small_task(spec: StoreSpec, t: pa.Table, b: pa.Table, sizes: np.ndarray) -> list:
    from dumpdb.compare.engine import small_pairs_metrics

    return small_pairs_metrics(spec.open(), t, b, sizes)


def _large_task(spec: StoreSpec, pairs: list[tuple]) -> list:
    from dumpdb.compare.engine import large_pairs_metrics

    return large_pairs_metrics(spec.open(), pairs)


def compare_pairs(archive, scheduler: str, workers: int | None, tloc: pa.Table, bloc: pa.Table,
                  small: np.ndarray, small_sizes: np.ndarray, small_bytes: np.ndarray,
                  large: list[tuple]) -> Iterator[tuple[str, Any, Any]]:
    """The payload work of a compare on the cluster at ``scheduler``: yields, as tasks finish,
    ``("small", pair rows, MetricColumns)`` for the small pairs ``small`` (rows of
    ``tloc``/``bloc``, the pairs' payload locations, ``small_sizes`` elements a side,
    ``small_bytes`` payload bytes of both sides) and
    ``("large", pair rows, [(metrics, message), ...])`` for ``large``:
    ``(row, target loc, bench loc, ranges, nbytes)`` each. Partitioned by :func:`partition`."""
    from dumpdb.cluster import dask_client

    spec = store_spec(archive)
    with dask_client(scheduler, workers_for(workers)) as client:
        futures = {}
        if small.size:
            at = pa.array(small, pa.int64())
            tpaths = tloc.column("array_path").take(at).to_pylist()
            bpaths = bloc.column("array_path").take(at).to_pylist()
            for group in partition(tpaths, bpaths, small_bytes.tolist()):
                rows = small[group]
                sel = pa.array(rows, pa.int64())
                fut = client.submit(_small_task, spec, tloc.take(sel), bloc.take(sel), small_sizes[group], pure=False)
                futures[fut] = ("small", rows)
        if large:
            for group in partition([p[1][0] for p in large], [p[2][0] for p in large], [p[4] for p in large]):
                members = [large[k] for k in group.tolist()]
                fut = client.submit(_large_task, spec, [(p[1], p[2], p[3]) for p in members], pure=False)
                futures[fut] = ("large", np.asarray([p[0] for p in members], np.int64))
        yield from _gathered(client, futures)


def _gathered(client, futures: dict) -> Iterator[tuple[str, Any, Any]]:
    """``(kind, rows, result)`` of each future as it finishes; the first failure cancels the
    rest and is raised (the task's own exception, as dask re-raises it)."""
    from distributed import as_completed

    try:
        for fut in as_completed(list(futures)):
            kind, rows = futures.pop(fut)
            yield kind, rows, fut.result()
    finally:
        if futures:
            client.cancel(list(futures))


# --------------------------------------------------------------------------- scan
def _scan_task(spec: StoreSpec, kind: str, items: list[tuple], needed: list[str], params: dict) -> list:
    from dumpdb.checks.scan import tensor_check_metrics

    store = spec.open()
    return tensor_check_metrics(store, kind, items, set(needed), params)


def scan_reads(archive, client, kind: str, items: list[tuple], needed: set[str],
               params: dict) -> Iterator[tuple[Any, Any]]:
    """A scan's payload metrics on ``client`` (:func:`dumpdb.checks.scan.tensor_check_metrics`):
    ``items`` are ``(tensor_id, location[, previous location])`` (``kind``: ``single`` or
    ``pair``), grouped by the array the tensor lies in; yields ``(tensor_id, metrics)``."""
    spec = store_spec(archive)
    arrays = [it[1][0] for it in items]
    others = [it[2][0] if kind == "pair" else None for it in items]
    sizes = [int(it[1][2] or 0) * (2 if kind == "pair" else 1) for it in items]
    futures = {}
    for group in partition(arrays, others, sizes):
        members = [items[k] for k in group.tolist()]
        fut = client.submit(_scan_task, spec, kind, members, sorted(needed), dict(params), pure=False)
        futures[fut] = ("scan", [m[0] for m in members])
    for _, ids, found in _gathered(client, futures):
        yield from zip(ids, found)

