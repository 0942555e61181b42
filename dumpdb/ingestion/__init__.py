"""Ingest: walking a dump, reading, hashing and packing tensors, committing catalog rows."""

from dumpdb.ingestion.pipeline import IngestReport, ingest

__all__ = ["IngestReport", "ingest"]
