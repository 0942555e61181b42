"""Analysis on a ``dask.distributed`` cluster (issue 29): ``compare``, ``first-divergence``,
``scan`` and ``ranks`` with ``scheduler=ADDRESS|"local"`` (CLI ``--scheduler``).

The process that asks (the *driver*) keeps every decision the local run makes: it selects
and aligns the pairs, settles what needs no payload (statistics-mode pairs in DuckDB,
identical payloads from the definitions, repeats of a large pair), judges and stores. Only
the payload work - read both tensors, compute the metrics - goes to the cluster, as tasks
that each name payload locations (array path, offset, count, dtype, shape, content hash)
and open the archive's store themselves: the local ``tensors.zarr`` at the same path on a
shared file system, or the ``s3://`` store its marker names, with the credentials of the
worker's own ``AWS_*`` environment (:class:`dumpdb.cluster.StoreSpec`; no catalog, no payload byte passes
through the driver). A task returns metric values, which the driver puts at the pairs'
rows: the ``compare_results`` rows and the answer are those of the local run, bit for bit,
because each pair's metrics are computed by the same functions on the same bytes whatever
the process (small pairs by ``metrics.tensor_metrics_batch``, whose values do not depend on
the batch, large pairs whole by ``metrics.tensor_metrics``: the segments of the local path
fold to the same bits; tests/test_distributed.py).

**Partition** (:func:`dumpdb.cluster.partition`): pairs are grouped by where their payloads lie - the
target's array (a pack, or a large array of its own) and the bench's - so a pack's shards
are read by one task, once, in offset order (``TensorStore.read_many`` decodes each chunk
once); a group is cut into tasks of at most :data:`dumpdb.cluster.TASK_BYTES` of payload.

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

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from dumpdb.cluster import StoreSpec, dask_client, gathered, partition, store_spec, workers_for


# --------------------------------------------------------------------------- compare
def _small_task(spec: StoreSpec, metrics: Callable, t: pa.Table, b: pa.Table, sizes: np.ndarray) -> list:
    return metrics(spec.open(), t, b, sizes)


def _large_task(spec: StoreSpec, metrics: Callable, pairs: list[tuple]) -> list:
    return metrics(spec.open(), pairs)


def compare_pairs(archive, scheduler: str, workers: int | None, tloc: pa.Table, bloc: pa.Table,
                  small: np.ndarray, small_sizes: np.ndarray, small_bytes: np.ndarray,
                  large: list[tuple], small_metrics: Callable, large_metrics: Callable
                  ) -> Iterator[tuple[str, Any, Any]]:
    """The payload work of a compare on the cluster at ``scheduler``: yields, as tasks finish,
    ``("small", pair rows, MetricColumns)`` for the small pairs ``small`` (rows of
    ``tloc``/``bloc``, the pairs' payload locations, ``small_sizes`` elements a side,
    ``small_bytes`` payload bytes of both sides) and
    ``("large", pair rows, [(metrics, message), ...])`` for ``large``:
    ``(row, target loc, bench loc, ranges, nbytes)`` each. Partitioned by :func:`partition`.

    ``small_metrics(store, t, b, sizes)`` and ``large_metrics(store, pairs)`` are the tasks'
    work, the engine's own functions (``dumpdb.compare.engine.small_pairs_metrics`` and
    ``large_pairs_metrics``: module-level, so dask ships them by name), given by the caller
    so that this module does not import the engine that imports it."""
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
                fut = client.submit(_small_task, spec, small_metrics, tloc.take(sel), bloc.take(sel),
                                    small_sizes[group], pure=False)
                futures[fut] = ("small", rows)
        if large:
            for group in partition([p[1][0] for p in large], [p[2][0] for p in large], [p[4] for p in large]):
                members = [large[k] for k in group.tolist()]
                fut = client.submit(_large_task, spec, large_metrics, [(p[1], p[2], p[3]) for p in members], pure=False)
                futures[fut] = ("large", np.asarray([p[0] for p in members], np.int64))
        yield from gathered(client, futures)
