"""The comparable content of a catalog, for tests that check two ingests gave the same one."""

from __future__ import annotations

from pathlib import Path

import duckdb

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
