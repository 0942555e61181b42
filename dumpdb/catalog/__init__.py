"""The DuckDB catalog: connections and locking (``connection``), schema migrations
(``migrations``), and the schema they define (``schema``: tables, columns, types,
comments)."""

# ``schema`` (a submodule: ``from dumpdb.catalog import schema``) imports pyarrow, so it is not
# loaded here: a plain query starts without pyarrow.
from dumpdb.catalog.connection import DEFAULT_LOCK_TIMEOUT, Catalog, insert_arrow, one
from dumpdb.catalog.migrations import Migration, latest_version, load_migrations, migrations_dir

__all__ = [
    "DEFAULT_LOCK_TIMEOUT",
    "Catalog",
    "Migration",
    "insert_arrow",
    "latest_version",
    "load_migrations",
    "migrations_dir",
    "one",
]
