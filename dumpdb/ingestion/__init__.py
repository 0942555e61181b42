"""Ingest: walking a dump, reading, hashing and packing tensors, committing catalog rows."""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dumpdb.ingestion.pipeline import IngestReport, ingest

__all__ = ["IngestReport", "ingest"]


def __getattr__(name: str):
    """``ingest`` and ``IngestReport`` imported when first used (PEP 562): a worker process
    importing :mod:`dumpdb.ingestion.workers` does not load the pipeline, the catalog and
    DuckDB (~0.5 s of CPU per spawned worker)."""
    if name in __all__:
        from dumpdb.ingestion import pipeline

        return getattr(pipeline, name)
    raise AttributeError(f"module 'dumpdb.ingestion' has no attribute {name!r}")
