"""The catalog schema source (dumpdb.catalog.schema): derived from the migrations,
every table and column commented, used by ingest/export/rm, kept by old archives."""

from __future__ import annotations

import re
import shutil

import duckdb
import pyarrow.parquet as pq
from conftest import DATA

import dumpdb
from dumpdb.catalog import load_migrations, schema
from dumpdb.ingestion import pipeline


def _created_in_sql() -> set[str]:
    """Table names every migration creates, read from the SQL text itself."""
    names = set()
    for mig in load_migrations():
        names |= set(re.findall(r"CREATE TABLE (\w+)", mig.sql))
    return names


def test_tables_are_those_the_migrations_create():
    assert set(schema.tables()) == _created_in_sql()
    assert schema.tables()[:3] == ("schema_version", "runs", "tensors")  # creation order


def test_every_table_and_column_has_a_one_line_comment():
    missing = []
    for name in schema.tables():
        t = schema.table(name)
        if not t.comment or "\n" in t.comment:
            missing.append(name)
        missing += [f"{name}.{c.name}" for c in t.columns if not c.comment or "\n" in c.comment]
    assert missing == [], f"add COMMENT ON for these in a new migration: {missing}"


def test_columns_and_types_come_from_the_migrations():
    assert schema.columns("tensors")[0] == "tensor_id"
    assert "pruned_at" in schema.columns("tensors")  # added by migration 004
    types = {c.name: c.type for c in schema.table("tensors").columns}
    assert types["shape"] == "BIGINT[]" and types["rank"] == "INTEGER" and types["min"] == "DOUBLE"
    assert not {c.name: c for c in schema.table("runs").columns}["run"].nullable
    try:
        schema.table("nope")
    except KeyError as exc:
        assert "tensors" in str(exc)
    else:
        raise AssertionError("unknown table accepted")


def test_run_tables_are_the_tables_with_a_run_column_runs_last():
    rt = schema.run_tables()
    assert rt == schema.RUN_TABLES and rt[-1] == "runs"
    assert set(rt) == {"runs", "tensors", "ops", "execution_order", "graph_executions", "overflows",
                       "call_stacks", "module_tree", "msprobe_records", "ingest_errors"}


def test_ingest_row_schemas_match_the_catalog():
    """What the pipeline writes is the catalog's columns, less those filled by defaults
    (or later: prune's pruned_at, ingest --update's previous_hash and updated_at)."""
    assert set(pipeline.TENSOR_SCHEMA.names) == set(schema.columns("tensors")) - {
        "tensor_id", "pruned_at", "previous_hash", "updated_at"}
    assert set(pipeline.ERROR_SCHEMA.names) == set(schema.columns("ingest_errors")) - {"time"}
    assert str(pipeline.TENSOR_SCHEMA.field("shape").type.value_type) == "int64"


def test_new_archive_catalog_carries_the_comments(ingested):
    con = duckdb.connect(str(ingested / "catalog.duckdb"), read_only=True)
    try:
        rows = dict(con.execute("SELECT column_name, comment FROM duckdb_columns() "
                                "WHERE table_name = 'tensors'").fetchall())
        tcomment = con.execute("SELECT comment FROM duckdb_tables() WHERE table_name = 'runs'").fetchone()[0]
    finally:
        con.close()
    assert rows["tensor_key"] == {c.name: c.comment for c in schema.table("tensors").columns}["tensor_key"]
    assert tcomment == schema.table("runs").comment


def test_first_schema_archive_migrates_to_commented_schema(tmp_path):
    archive = tmp_path / "old.dumpdb"
    shutil.copytree(DATA / "archives" / "schema_v1_c1.dumpdb", archive)
    a = dumpdb.open(archive)
    assert a.schema_version == load_migrations()[-1].version
    got = a.sql("SELECT table_name, column_name, data_type, comment FROM duckdb_columns() "
                "WHERE NOT internal AND schema_name = 'main'").to_pylist()
    have = {(r["table_name"], r["column_name"]): (r["data_type"], r["comment"]) for r in got}
    want = {(t, c.name): (c.type, c.comment) for t in schema.tables() for c in schema.table(t).columns}
    assert have == want
    assert a.show("c1")["tensors"] == 42


def test_export_writes_every_run_table(ingested, tmp_path):
    a = dumpdb.open(ingested)
    run = a.sql("SELECT run FROM runs LIMIT 1")["run"][0].as_py()
    out = a.export([run], tmp_path / "b")
    written = {p.stem for p in (out / "catalog").glob("*.parquet")}
    assert written == set(schema.run_tables()) | {"blobs", "arrays"}
    assert pq.read_schema(out / "catalog" / "tensors.parquet").names == list(schema.columns("tensors"))
