"""dumpdb: turn operator dumps into an indexed, deduplicated archive.

A dump (thousands of ``.npy`` files with long encoded names, ``statistic.csv``,
``mapping.csv``, graphs and execution orders) becomes an *archive* directory:

* tensors in a compressed, content-deduplicated Zarr v3 store (``tensors.zarr``);
* everything about them in a DuckDB catalog (``catalog.duckdb``) queried with SQL.

Python API (the CLI is a thin layer over it)::

    import dumpdb
    report = dumpdb.ingest("./dump", archive="./lenet.dumpdb", run="fp32-baseline")
    a = dumpdb.open("./lenet.dumpdb")
    a.sql("SELECT iteration, op_type, count(*) FROM tensors GROUP BY ALL")  # pyarrow.Table
    a.tensor(1)                                                              # numpy.ndarray
"""

__version__ = "0.1.0"

from dumpdb.archive import Archive, open  # noqa: E402,A004
from dumpdb.errors import (  # noqa: E402
    ArchiveError,
    BadDump,
    BundleError,
    CatalogCorrupt,
    CatalogVersionError,
    DumpdbError,
    DumpFileError,
    LayoutError,
    PayloadCorrupt,
    PayloadMissing,
    RunNotFound,
    StorageError,
    TensorNotFound,
)


def __getattr__(name: str):
    # The ingest pipeline imports zarr (~0.2 s); load it only when asked for, so
    # queries (dumpdb sql, dumpdb.open(...).sql) start faster.
    if name in ("ingest", "IngestReport"):
        from dumpdb.ingestion import pipeline

        return getattr(pipeline, name)
    raise AttributeError(f"module 'dumpdb' has no attribute {name!r}")


__all__ = [
    "Archive",
    "ArchiveError",
    "BadDump",
    "BundleError",
    "CatalogCorrupt",
    "CatalogVersionError",
    "DumpFileError",
    "DumpdbError",
    "IngestReport",
    "LayoutError",
    "PayloadCorrupt",
    "PayloadMissing",
    "RunNotFound",
    "StorageError",
    "TensorNotFound",
    "__version__",
    "ingest",
    "open",
]
