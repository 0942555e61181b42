"""The one way dumpdb reaches a ``dask.distributed`` cluster (issues 12 and 29).

``--scheduler ADDRESS|local`` of ``ingest``, ``ingest-worker``, ``compare``,
``first-divergence``, ``scan`` and ``ranks`` all come here: :func:`dask_client` connects to
the scheduler at ``ADDRESS`` (``tcp://host:8786``) or, with ``"local"``, starts a
``LocalCluster`` of single-threaded worker processes on this machine and stops it at the
end. dask is imported only here and only when a scheduler is asked for (``pip install
'dumpdb[dask]'``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dumpdb.errors import DumpdbError

# Where a "local" cluster's scheduler serves its HTTP routes: this host only, a free port.
LOCAL_HTTP_ADDRESS = "127.0.0.1:0"


@contextmanager
def dask_client(scheduler: str, workers: int, on_start: Callable[[str], None] | None = None) -> Iterator[Any]:
    """A ``distributed.Client`` of the cluster at ``scheduler``, or with ``"local"`` of a
    ``LocalCluster`` of ``workers`` single-threaded worker processes (127.0.0.1, no
    dashboard) started here and closed at the end. ``on_start`` receives one line naming the
    workers and the scheduler's address.

    A remote cluster's workers need dumpdb installed and must see the files a task names at
    the same paths (a dump directory, an archive's local store), or the same object store.
    Raises :class:`~dumpdb.errors.DumpdbError` if ``dask.distributed`` is not installed or
    the scheduler cannot be reached.
    """
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise DumpdbError("--scheduler needs dask.distributed: pip install 'dumpdb[dask]'") from None
    cluster = None
    try:
        if scheduler == "local":
            # dashboard_address=None turns the dashboard off, yet the scheduler still serves its
            # HTTP routes (health, metrics) and, given no address, asks for port 8787: a second
            # cluster on the machine (another command, a test's cluster) then gets "Port 8787 is
            # already in use" and another port. The scheduler's own address (127.0.0.1, port 0:
            # any free one) keeps it private and quiet; the workers' HTTP servers take a free port already.
            cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                   host="127.0.0.1", dashboard_address=None,
                                   scheduler_kwargs={"dashboard_address": LOCAL_HTTP_ADDRESS})
            client = Client(cluster)
        else:
            client = Client(scheduler, timeout=30)
    except (OSError, TimeoutError) as exc:
        if cluster is not None:
            cluster.close()
        reason = " ".join(str(exc).split())[:300]
        raise DumpdbError(f"dask scheduler {scheduler}: cannot connect: {reason}") from None
    if on_start is not None:
        address = getattr(client.scheduler, "address", scheduler)
        on_start(f"dask: {len(client.scheduler_info().get('workers', {}))} workers at {address}")
    try:
        yield client
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


# --------------------------------------------------------------------------- tasks' common parts
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
    from dumpdb.archive_dir import store_location

    location, options = store_location(archive.path, archive.storage_options)
    return StoreSpec(str(location), tuple(sorted((k, str(v)) for k, v in options.items())),
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


def gathered(client, futures: dict) -> Iterator[tuple[str, Any, Any]]:
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
