"""The comparable content of an archive (catalog rows, payload bytes), for tests that check two
ingests gave the same one."""

from __future__ import annotations

from pathlib import Path

import duckdb

import dumpdb

# Ingestion ids and times, and where a payload sits in the store (pack names are random).
VOLATILE = frozenset({"tensor_id", "ingest_started", "ingest_finished", "time", "array_path", "created_at",
                      "applied_at"})


def catalog_snapshot(archive: Path) -> dict[str, list]:
    """Every table of the archive's catalog, rows as sorted reprs, without the
    :data:`VOLATILE` columns; payload hashes are kept."""
    con = duckdb.connect(str(archive / "catalog.duckdb"), read_only=True)
    try:
        out = {}
        tables = [t for (t,) in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main' ORDER BY 1").fetchall()]
        for t in tables:
            cols = [c for (c,) in con.execute(
                "SELECT column_name FROM duckdb_columns() WHERE table_name = ? AND schema_name = 'main' "
                "ORDER BY column_index", [t]).fetchall() if c not in VOLATILE]
            sel = ", ".join(f'"{c}"' for c in cols)
            out[t] = sorted(repr(r) for r in con.execute(f"SELECT {sel} FROM {t}").fetchall())
        return out
    finally:
        con.close()


def payloads_by_source_file(archive: Path) -> dict[str, bytes]:
    """The bytes of every stored payload of the archive, by the dump file it came from."""
    with dumpdb.open(archive) as arch:
        rows = arch.sql("SELECT tensor_id, source_file FROM tensors WHERE content_hash IS NOT NULL").to_pylist()
        return {r["source_file"]: arch.tensor(r["tensor_id"]).tobytes() for r in rows}
