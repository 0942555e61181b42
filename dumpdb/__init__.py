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

from typing import TYPE_CHECKING

from dumpdb.errors import (  # noqa: E402
    ArchiveError,
    BadDump,
    BundleError,
    CatalogCorrupt,
    CatalogVersionError,
    DumpdbError,
    DumpdbWarning,
    DumpFileError,
    LayoutError,
    PayloadCorrupt,
    PayloadMissing,
    RunNotFound,
    SourceChanged,
    StorageError,
    TensorNotFound,
)

if TYPE_CHECKING:
    from dumpdb.archive import Archive, open  # noqa: A004
    from dumpdb.ingestion.pipeline import IngestReport, ingest

# Imported when first used (PEP 562): `import dumpdb` stays cheap, so the CLI starts
# fast and a Ctrl-C during start-up is caught by the entry point. The archive module
# imports DuckDB (~0.1 s); the ingest pipeline imports numpy and zarr (~0.3 s).
_LAZY = {"Archive": "dumpdb.archive", "open": "dumpdb.archive",
         "ingest": "dumpdb.ingestion.pipeline", "IngestReport": "dumpdb.ingestion.pipeline"}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dumpdb' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "Archive",
    "ArchiveError",
    "BadDump",
    "BundleError",
    "CatalogCorrupt",
    "CatalogVersionError",
    "DumpFileError",
    "DumpdbError",
    "DumpdbWarning",
    "IngestReport",
    "LayoutError",
    "PayloadCorrupt",
    "PayloadMissing",
    "RunNotFound",
    "SourceChanged",
    "StorageError",
    "TensorNotFound",
    "__version__",
    "ingest",
    "open",
]
