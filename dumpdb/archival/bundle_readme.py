"""The ``README.md`` every bundle carries: a reader's kit for someone without dumpdb.

It says what the bundle holds (runs, files, every table and column with its meaning),
how to read a tensor with pyarrow + zarr (from a directory, or a ``.zip`` read in place
with ``zarr.storage.ZipStore``), and what statistics-only and pruned rows look like.
Tables and columns come from :mod:`dumpdb.catalog.schema` (the migrations' ``COMMENT
ON``): the one schema source, so the README never disagrees with the Parquet files.
The recipe (:data:`RECIPE`) is run by ``tests/test_bundle_readme.py`` in a Python that
does not import dumpdb, on a directory and a ``.zip`` bundle of a real dump.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dumpdb.catalog import schema

# Python, no dumpdb: pyarrow, zarr >= 3, numpy (and ml_dtypes for bfloat16 tensors).
RECIPE = '''\
import io, zipfile
import numpy as np, pyarrow.parquet as pq, zarr


def open_bundle(path):
    """(table, array) readers for a bundle: a directory, or a .zip read in place."""
    path = str(path)
    if zipfile.is_zipfile(path):
        z = zipfile.ZipFile(path)
        store = zarr.storage.ZipStore(path, mode="r", read_only=True)
        def table(name):
            return pq.read_table(io.BytesIO(z.read(f"catalog/{name}.parquet")))
        prefix = "tensors.zarr/"
    else:
        store = zarr.storage.LocalStore(f"{path}/tensors.zarr", read_only=True)
        def table(name):
            return pq.read_table(f"{path}/catalog/{name}.parquet")
        prefix = ""
    def array(array_path):
        return zarr.open_array(store, path=prefix + array_path, mode="r")
    return table, array


def numpy_dtype(name):
    if name == "bfloat16":  # stored as uint16 bit patterns
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def read_tensors(path):
    """Yield (row, array) for every tensor row of the bundle; array is None when the
    row has no payload (statistics-only: content_hash NULL; pruned: pruned_at set)."""
    table, array = open_bundle(path)
    blobs = {b["content_hash"]: b for b in table("blobs").to_pylist()}
    for t in table("tensors").to_pylist():
        b = blobs.get(t["content_hash"])
        if b is None or t["pruned_at"] is not None:
            yield t, None
            continue
        if b["array_path"] is None:  # an empty tensor (0 elements)
            flat = np.zeros(0, np.uint8)
        else:
            arr = array(b["array_path"])
            flat = arr[...] if b["elem_offset"] is None else \\
                arr[b["elem_offset"]:b["elem_offset"] + b["elem_count"]]
        raw = np.ascontiguousarray(flat).reshape(-1).view(np.uint8)
        yield t, raw.view(numpy_dtype(t["dtype"])).reshape(t["shape"])
'''


def _cell(text: str | None) -> str:
    return (text or "-").replace("|", "\\|").replace("\n", " ")


def render(runs: Sequence[str], tables: Mapping[str, Any], *, dumpdb_version: str, schema_version: int,
           created: str) -> str:
    """The README text (Markdown) of a bundle of ``runs`` whose ``tables`` (name ->
    ``pyarrow.Table`` written to ``catalog/<name>.parquet``) are given: their row counts and
    columns, with the meaning of each from the catalog schema. Raises KeyError for a table
    the schema does not know."""
    lines = [
        f"# dumpdb bundle: {', '.join(runs)}",
        "",
        f"Written by dumpdb {dumpdb_version} on {created} (catalog schema version {schema_version}).",
        "Everything here is readable without dumpdb: the catalog rows are Parquet files, the",
        "tensor payloads a Zarr v3 store. `dumpdb import` brings the runs into another archive.",
        "",
        "## Files",
        "",
        "| path | what |",
        "| --- | --- |",
        "| `manifest.json` | format, dumpdb and schema versions, runs, tables, and the byte size and "
        "sha256 of every other file |",
        "| `README.md` | this page |",
        "| `catalog/<table>.parquet` | the runs' catalog rows, one file per table (below) |",
        "| `tensors.zarr/` | Zarr v3 store: `packs/{dtype}/*` hold many small tensors back to back "
        "(flat), `large/{hh}/*` one large tensor each; each array's `zarr.json` attributes say what "
        "it holds |",
        "",
        "## Reading a tensor (pyarrow + zarr, no dumpdb)",
        "",
        "`tensors` rows name a payload by `content_hash`; the `blobs` row of that hash says where",
        "it is: `array_path` inside `tensors.zarr`, and for a pack `elem_offset`/`elem_count` (in",
        "elements of the storage dtype; `elem_offset` NULL: the whole array is the tensor). View the",
        "bytes as the tensor's `dtype` (bfloat16 is stored as uint16 bit patterns: use",
        "`ml_dtypes.bfloat16`) and reshape to `shape`. A `.zip` bundle is read in place (stored",
        "uncompressed): `zarr.storage.ZipStore` for the payloads, `zipfile` for the Parquet files.",
        "",
        "Saved as `read_bundle.py`, `python read_bundle.py BUNDLE` (the directory or the `.zip`)",
        "lists every tensor; `from read_bundle import read_tensors` reads them in your own code.",
        "",
        "```python",
        RECIPE.rstrip("\n"),
        "",
        "",
        'if __name__ == "__main__":',
        "    import sys",
        "    for row, x in read_tensors(sys.argv[1]):",
        '        print(row["run"], row["op_name"], row["io"], row["slot"],',
        '              "no payload" if x is None else f"{x.dtype} {x.shape}")',
        "```",
        "",
        "With DuckDB: `SELECT * FROM 'catalog/tensors.parquet'` (from the bundle directory).",
        "",
        "## Rows without a payload",
        "",
        "* **statistics-only**: `content_hash` is NULL (the dump held statistics only); the",
        "  statistics columns (`min`, `max`, `mean`, ...) are all there is.",
        "* **pruned**: `pruned_at` is set (`dumpdb prune --keep-stats`): the row and its statistics",
        "  were kept, the payload was dropped, so its `content_hash` has **no `blobs` entry** and",
        "  nothing in `tensors.zarr` - unless a kept tensor has the very same bytes (payloads are",
        "  stored once per content): then the entry is there for that tensor. Either way the row",
        "  counts as having no payload (the recipe checks `pruned_at`, as dumpdb does).",
        "",
        "## Tables",
        "",
        "| table | rows | what it holds |",
        "| --- | --- | --- |",
    ]
    for name, rows in tables.items():
        lines.append(f"| `{name}` | {rows.num_rows} | {_cell(schema.table(name).comment)} |")
    for name, rows in tables.items():
        known = {c.name: c for c in schema.table(name).columns}
        lines += ["", f"### {name}", "", "| column | type | meaning |", "| --- | --- | --- |"]
        for col_name in rows.column_names:
            col = known.get(col_name)
            lines.append(f"| `{col_name}` | {col.type if col else rows.schema.field(col_name).type} | "
                         f"{_cell(col.comment if col else None)} |")
    return "\n".join(lines) + "\n"
