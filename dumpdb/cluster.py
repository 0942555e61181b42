"""The one way dumpdb reaches a ``dask.distributed`` cluster (issues 12 and 29).

``--scheduler ADDRESS|local`` of ``ingest``, ``ingest-worker``, ``compare``,
``first-divergence``, ``scan`` and ``ranks`` all come here: :func:`dask_client` connects to
the scheduler at ``ADDRESS`` (``tcp://host:8786``) or, with ``"local"``, starts a
``LocalCluster`` of single-threaded worker processes on this machine and stops it at the
end. dask is imported only here and only when a scheduler is asked for (``pip install
'dumpdb[dask]'``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from dumpdb.errors import DumpdbError


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
            cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                   host="127.0.0.1", dashboard_address=None)
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
