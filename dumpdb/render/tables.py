"""Writing query results: rich table, CSV, JSON and Parquet.

Used by ``dumpdb sql``; functions take a ``pyarrow.Table`` and a destination.
"""

from __future__ import annotations

import io
import json
import math
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, TextIO

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from rich.console import Console
from rich.table import Table

FORMATS = ("table", "csv", "json", "parquet")


def _plain(value: Any) -> Any:
    """A JSON-safe value: NaN/inf as strings, timestamps ISO, bytes hex."""
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _nested_to_text(table: pa.Table) -> pa.Table:
    """Replace list/struct/map columns by their JSON text (CSV cannot hold them)."""
    cols = []
    for _name, col in zip(table.column_names, table.columns):
        if pa.types.is_nested(col.type):
            col = pa.array([None if v is None else json.dumps(_plain(v)) for v in col.to_pylist()], pa.string())
        cols.append(col)
    return pa.table(cols, names=table.column_names)


def cell_text(value: Any) -> str:
    """One table cell: NULL, floats to 6 significant digits, lists bracketed."""
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list):
        return "[" + ", ".join(cell_text(v) for v in value) + "]"
    return str(value)


def _column_widths(naturals: list[int], available: int) -> list[int]:
    """Widths that fit ``available`` characters: short columns (<= 16) keep their
    natural width, long ones share the rest in proportion (at least 8 each)."""
    if sum(naturals) <= available:
        return naturals
    short = [w if w <= 16 else None for w in naturals]
    room = max(available - sum(w for w in short if w is not None), 0)
    long_total = sum(w for w, s in zip(naturals, short) if s is None) or 1
    return [s if s is not None else max(8, room * w // long_total) for w, s in zip(naturals, short)]


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def write_table(table: pa.Table, console: Console, max_rows: int | None = 50) -> None:
    """Print ``table`` as a rich table, one line per row, at most ``max_rows`` rows (None: all).

    Short columns keep their full width; long ones (names, source lines) share
    what is left of the terminal and are cut with an ellipsis.
    """
    shown = table if max_rows is None else table.slice(0, max_rows)
    rows = [[cell_text(v) for v in row.values()] for row in shown.to_pylist()]
    names = table.column_names
    naturals = [max([len(n)] + [len(r[i]) for r in rows]) for i, n in enumerate(names)]
    widths = _column_widths(naturals, console.width - 3 * len(names) - 1)
    view = Table(show_lines=False, header_style="bold")
    for name, w in zip(names, widths):
        view.add_column(_cut(name, w), no_wrap=True, width=w)
    for r in rows:
        view.add_row(*(_cut(text, w) for text, w in zip(r, widths)))
    console.print(view)
    hidden = table.num_rows - shown.num_rows
    footer = f"{table.num_rows} row{'s' if table.num_rows != 1 else ''}"
    if hidden:
        footer += f" ({hidden} not shown; use --max-rows 0 for all, or --format csv)"
    console.print(footer, style="dim")


def write_csv(table: pa.Table, out: TextIO | Path) -> None:
    """Write ``table`` as CSV (list/struct columns as JSON text) to a stream or file."""
    buf = io.BytesIO()
    pacsv.write_csv(_nested_to_text(table), buf)
    data = buf.getvalue().decode("utf-8")
    if isinstance(out, Path):
        out.write_text(data, encoding="utf-8")
    else:
        out.write(data)


def write_json(table: pa.Table, out: TextIO | Path) -> None:
    """A JSON array of row objects (NaN/inf as the strings "nan", "inf", "-inf")."""
    rows = [_plain(r) for r in table.to_pylist()]
    text = "[\n" + ",\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + ("\n]\n" if rows else "]\n")
    if isinstance(out, Path):
        out.write_text(text, encoding="utf-8")
    else:
        out.write(text)


def write_parquet(table: pa.Table, out: Path) -> None:
    """Write ``table`` as zstd-compressed Parquet."""
    pq.write_table(table, out, compression="zstd")
