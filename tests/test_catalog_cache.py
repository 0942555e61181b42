"""The catalog cache (dumpdb/catalog/cache.py): the derived schema and the empty-catalog
template kept between processes must equal what the migrations give, and a damaged or
unwritable cache must change nothing but speed."""

from __future__ import annotations

import duckdb
import pytest

from dumpdb.catalog import Catalog, cache, load_migrations, schema


def _describe(path) -> tuple[list, list, list]:
    """Tables, columns (with types and comments) and migration rows of a catalog file."""
    with duckdb.connect(str(path), read_only=True) as con:
        tables = con.execute("SELECT table_name, comment FROM duckdb_tables() ORDER BY 1").fetchall()
        columns = con.execute("SELECT table_name, column_name, data_type, is_nullable, comment "
                              "FROM duckdb_columns() WHERE NOT internal ORDER BY 1, 2").fetchall()
        versions = con.execute("SELECT version, name, dumpdb_version FROM schema_version ORDER BY 1").fetchall()
    return tables, columns, versions


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("DUMPDB_CACHE_DIR", str(d))
    return d


def test_template_copy_equals_a_catalog_built_from_the_migrations(tmp_path, cache_dir):
    Catalog(tmp_path / "first.duckdb").create()  # built from the migrations, fills the cache
    templates = list(cache_dir.glob("catalog-*.duckdb"))
    assert len(templates) == 1
    Catalog(tmp_path / "second.duckdb").create()  # a copy of the template
    first, second = _describe(tmp_path / "first.duckdb"), _describe(tmp_path / "second.duckdb")
    assert first == second
    assert [v[0] for v in second[2]] == [m.version for m in load_migrations()]
    assert any(c[4] for c in second[1]), "the comments of migration 006 are in the copy"


def test_copied_catalog_records_its_own_creation_time(tmp_path, cache_dir):
    Catalog(tmp_path / "first.duckdb").create()
    with duckdb.connect(str(tmp_path / "first.duckdb"), read_only=True) as con:
        first = con.execute("SELECT max(applied_at) FROM schema_version").fetchone()[0]
    Catalog(tmp_path / "second.duckdb").create()
    with duckdb.connect(str(tmp_path / "second.duckdb"), read_only=True) as con:
        second = con.execute("SELECT min(applied_at) FROM schema_version").fetchone()[0]
    assert second >= first  # not the template's time


def test_damaged_cache_entries_are_ignored(tmp_path, cache_dir):
    Catalog(tmp_path / "first.duckdb").create()
    schema._tables.cache_clear()
    schema.tables()  # writes the schema entry
    entries = sorted(cache_dir.iterdir())
    assert {p.name.split("-")[0] for p in entries} == {"catalog", "schema"}
    for p in entries:  # flip a byte in the body: the checksum no longer matches
        data = bytearray(p.read_bytes())
        data[-10] ^= 0xFF
        p.write_bytes(bytes(data))
        assert cache.get(p.name) is None
    Catalog(tmp_path / "second.duckdb").create()
    assert _describe(tmp_path / "second.duckdb") == _describe(tmp_path / "first.duckdb")
    schema._tables.cache_clear()
    assert "tensors" in schema.tables()
    assert cache.get(entries[0].name) is not None, "a damaged entry is rewritten"


def test_cache_put_on_a_file_path_does_nothing(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    monkeypatch.setenv("DUMPDB_CACHE_DIR", str(blocker))
    cache.put("entry", b"body")  # the directory cannot be made: silently no cache
    assert cache.get("entry") is None
    Catalog(tmp_path / "a.duckdb").create()
    assert _describe(tmp_path / "a.duckdb")[2]


def test_schema_from_cache_equals_the_derived_one(cache_dir):
    schema._tables.cache_clear()
    derived = schema._derive()
    schema.tables()  # stores the entry
    schema._tables.cache_clear()
    cached = schema._tables()
    assert list(cached) == list(derived)
    for name, table in derived.items():
        assert cached[name].columns == table.columns
        assert cached[name].comment == table.comment
        assert cached[name].arrow.equals(table.arrow, check_metadata=True)
