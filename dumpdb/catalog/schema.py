"""The catalog schema, read from the one place that defines it: the SQL migrations.

The numbered ``migrations/NNN_name.sql`` files are the source of truth. This module
applies them once (cached, per process) to an in-memory DuckDB and answers from
DuckDB's own catalog (``duckdb_tables()``, ``duckdb_columns()``), so export/import,
``rm``, ingest (its arrow schemas) and ``dumpdb schema`` never keep their own lists of
tables or columns. Comments come from migration 006 (``COMMENT ON``).

Building it costs one in-memory DuckDB and the migrations (a few hundred ms), so it
happens on first use, not on import, and its result is kept in the user's cache
(:mod:`dumpdb.catalog.cache`, keyed by the migrations' content) for the next process.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from functools import cache

import duckdb
import pyarrow as pa

from dumpdb.catalog import cache as disk_cache
from dumpdb.catalog.migrations import load_migrations

__all__ = ["Column", "Table", "arrow_schema", "columns", "run_tables", "table", "tables"]


@dataclass(frozen=True)
class Column:
    """One catalog column: ``name``, DuckDB ``type`` (e.g. ``BIGINT[]``), whether it
    may be NULL, and its one-line ``comment``."""

    name: str
    type: str
    nullable: bool
    comment: str | None


@dataclass(frozen=True)
class Table:
    """One catalog table, its columns in order, and its one-line ``comment``."""

    name: str
    comment: str | None
    columns: tuple[Column, ...]
    arrow: pa.Schema

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)


@cache
def _tables() -> dict[str, Table]:
    name = f"schema-{disk_cache.migrations_key()}.json"
    cached = disk_cache.get(name)
    if cached is not None:
        try:
            return _decode(cached)
        except (ValueError, KeyError, TypeError, pa.ArrowInvalid):
            pass  # an entry of another shape: derive again and overwrite it
    found = _derive()
    disk_cache.put(name, _encode(found))
    return found


def _encode(found: dict[str, Table]) -> bytes:
    return json.dumps([
        {"name": t.name, "comment": t.comment,
         "columns": [[c.name, c.type, c.nullable, c.comment] for c in t.columns],
         "arrow": base64.b64encode(t.arrow.serialize().to_pybytes()).decode("ascii")}
        for t in found.values()]).encode("utf-8")


def _decode(data: bytes) -> dict[str, Table]:
    found: dict[str, Table] = {}
    for t in json.loads(data):
        arrow = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(t["arrow"])))
        found[t["name"]] = Table(t["name"], t["comment"], tuple(Column(*c) for c in t["columns"]), arrow)
    return found


def _derive() -> dict[str, Table]:
    """Apply the migrations to an in-memory DuckDB and read its catalog."""
    con = duckdb.connect()
    try:
        con.execute("BEGIN TRANSACTION")  # one commit for all migrations: several times faster
        for mig in load_migrations():
            con.execute(mig.sql)
        con.execute("COMMIT")
        cols: dict[str, list[Column]] = {}
        for table_name, *col in con.execute(
                "SELECT table_name, column_name, data_type, is_nullable, comment FROM duckdb_columns() "
                "WHERE NOT internal ORDER BY table_name, column_index").fetchall():
            cols.setdefault(table_name, []).append(Column(col[0], col[1], bool(col[2]), col[3]))
        found: dict[str, Table] = {}
        for name, comment in con.execute(
                "SELECT table_name, comment FROM duckdb_tables() WHERE NOT internal ORDER BY table_oid").fetchall():
            arrow = con.sql(f'SELECT * FROM "{name}" LIMIT 0').to_arrow_table().schema
            found[name] = Table(name, comment, tuple(cols[name]), arrow)
        return found
    finally:
        con.close()


def tables() -> tuple[str, ...]:
    """Names of every catalog table, in the order the migrations create them."""
    return tuple(_tables())


def table(name: str) -> Table:
    """The table called ``name``; raises KeyError naming the known tables."""
    try:
        return _tables()[name]
    except KeyError:
        raise KeyError(f"no catalog table {name!r} (tables: {', '.join(_tables())})") from None


def columns(name: str) -> tuple[str, ...]:
    """Column names of table ``name``, in order."""
    return table(name).column_names


def run_tables() -> tuple[str, ...]:
    """Tables holding rows of one run (a ``run`` column): what export copies and ``rm``
    deletes. ``runs`` comes last, so deleting in this order never leaves rows of a run
    that is gone."""
    names = [t for t, info in _tables().items() if "run" in info.column_names]
    return (*[t for t in names if t != "runs"], "runs")


def arrow_schema(name: str, exclude: tuple[str, ...] = ()) -> pa.Schema:
    """The pyarrow schema DuckDB gives table ``name`` (types as in the catalog), without
    the columns in ``exclude`` (e.g. ones filled by a default, like ``tensor_id``)."""
    schema = table(name).arrow
    for col in exclude:
        schema = schema.remove(schema.get_field_index(col))
    return schema


def __getattr__(name: str) -> tuple[str, ...]:
    # RUN_TABLES reads like a constant but is derived on first use (see run_tables).
    if name == "RUN_TABLES":
        return run_tables()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
