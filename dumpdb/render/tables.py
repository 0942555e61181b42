"""Rows to the terminal or a file: one module every command that prints rows uses.

``emit(rows, fmt, output)`` writes :class:`Rows` (column names + Python tuples,
as DuckDB's ``fetchall`` gives them, or a ``pyarrow.Table``) as one of
:data:`FORMATS`:

* ``table``: a rich table that never cuts a cell: on a terminal wide cells wrap
  (fold), in a pipe or a file each row prints in full, whatever ``COLUMNS`` says;
  every cell is rich ``Text``, so ``[torch]`` prints as written, never as markup;
* ``csv`` / ``tsv``: RFC 4180 via :mod:`csv`, absent values empty;
* ``json`` (an array of objects) / ``ndjson`` (one object per line): absent values
  ``null``, NaN/inf as the strings ``"nan"``, ``"inf"``, ``"-inf"`` (JSON has none);
* ``markdown``: a GitHub pipe table (``|`` escaped);
* ``parquet``: zstd Parquet, needs a file (``--output``).

Lists and structs become JSON text in csv/tsv/markdown and stay nested in json.
pyarrow is imported only for ``parquet`` or when given a ``pyarrow.Table``, so
``dumpdb sql`` starts fast.
"""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    import pyarrow as pa
    from rich.console import Console

FORMATS = ("table", "csv", "tsv", "json", "ndjson", "markdown", "parquet")
MIN_COLUMN = 8  # narrowest a wrapped column may get on a terminal before rows print as records
FORMAT_HELP = "Output format: " + " | ".join(FORMATS) + " (parquet needs --output)."


@dataclass
class Rows:
    """Column ``names`` and ``rows`` (tuples of Python values, ``None`` when absent)."""

    names: list[str]
    rows: list[tuple]

    @classmethod
    def from_arrow(cls, table: pa.Table) -> Rows:
        """Rows of a ``pyarrow.Table`` (column names and Python values)."""
        return cls(list(table.column_names), [tuple(r.values()) for r in table.to_pylist()])

    @classmethod
    def from_dicts(cls, records: Sequence[dict[str, Any]], names: Sequence[str] | None = None) -> Rows:
        """Rows of a list of dicts with the same keys (empty list: no columns)."""
        names = list(names if names is not None else (records[0].keys() if records else []))
        return cls(names, [tuple(r.get(n) for n in names) for r in records])

    def to_dicts(self) -> list[dict[str, Any]]:
        """The rows as dicts, column name -> value."""
        return [dict(zip(self.names, r)) for r in self.rows]

    def __len__(self) -> int:
        return len(self.rows)


def as_rows(data: Rows | pa.Table) -> Rows:
    """``data`` as :class:`Rows` (a ``pyarrow.Table`` is converted)."""
    return data if isinstance(data, Rows) else Rows.from_arrow(data)


def plain(value: Any) -> Any:
    """A JSON-safe value: NaN/inf as strings, timestamps ISO 8601, bytes hex, Decimal float."""
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    if isinstance(value, timedelta):
        return str(value)
    # decimal and uuid are not imported to check: a value of those types means DuckDB imported them.
    if (decimal := sys.modules.get("decimal")) is not None and isinstance(value, decimal.Decimal):
        return float(value)
    if (uuid := sys.modules.get("uuid")) is not None and isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def text(value: Any) -> str:
    """One cell as text in full: absent -> ``""``; floats as Python prints them
    (shortest round-trip form); lists and dicts as JSON."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(plain(value), ensure_ascii=False)
    if isinstance(value, (datetime, date, time)):
        return value.isoformat(sep=" ") if isinstance(value, datetime) else value.isoformat()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    return str(value)


def _table_cell(value: Any) -> str:
    # Floats to 6 significant digits in the terminal view only; files get full precision.
    if isinstance(value, float) and math.isfinite(value):
        return f"{value:.6g}"
    return text(value)


def render_table(rows: Rows, console: Console, max_rows: int | None = None, footer: bool = True,
                 more: str = "--max-rows 0") -> None:
    """Print ``rows`` as a rich table on ``console``, at most ``max_rows`` rows (None: all).

    Never truncates a cell: on a terminal wide cells fold onto more lines; on a
    pipe or file the console is widened to the longest row so nothing wraps.
    ``more`` names the command's option that shows the rows left out.
    """
    from rich.text import Text

    shown = rows.rows if max_rows is None else rows.rows[:max_rows]
    cells = [[_table_cell(v) for v in r] for r in shown]
    natural = [max([len(n)] + [max((len(line) for line in r[i].splitlines()), default=0) for r in cells])
               for i, n in enumerate(rows.names)]
    if console.is_terminal and sum(min(w, MIN_COLUMN) + 3 for w in natural) + 1 > console.width:
        # Too many columns to wrap legibly (rich would squeeze cells to nothing): one
        # record at a time, a column per line, like psql's \x or DuckDB's .mode line.
        _render_records(rows.names, cells, console)
    else:
        _render_grid(rows, shown, cells, natural, console)
    if footer:
        hidden = len(rows) - len(shown)
        note = f"{len(rows)} row{'s' if len(rows) != 1 else ''}"
        if hidden:
            note += f" ({hidden} not shown; use {more} for more, or --format csv)"
        console.print(Text(note, style="dim"))


def _render_records(names: list[str], cells: list[list[str]], console: Console) -> None:
    from rich.table import Table
    from rich.text import Text

    for i, r in enumerate(cells, 1):
        view = Table(title=Text(f"row {i}", style="dim"), title_justify="left", show_header=False)
        view.add_column(overflow="fold", style="bold")
        view.add_column(overflow="fold")
        for name, value in zip(names, r):
            view.add_row(Text(name), Text(value))
        console.print(view)


def _render_grid(rows: Rows, shown: list[tuple], cells: list[list[str]], natural: list[int],
                 console: Console) -> None:
    from rich.table import Table
    from rich.text import Text

    view = Table(header_style="bold")
    for i, name in enumerate(rows.names):
        numeric = any(r[i] is not None for r in shown) and all(
            r[i] is None or (isinstance(r[i], (int, float)) and not isinstance(r[i], bool)) for r in shown)
        view.add_column(Text(name), overflow="fold", justify="right" if numeric else "left")
    for r in cells:
        view.add_row(*(Text(c) for c in r))
    if console.is_terminal:
        console.print(view)
    else:
        width = sum(natural) + 3 * len(natural) + 1
        saved = console.width
        console.width = max(width, saved)
        try:
            console.print(view, crop=False)
        finally:
            console.width = saved


def _write_delimited(rows: Rows, out: TextIO, delimiter: str) -> None:
    writer = csv.writer(out, delimiter=delimiter, lineterminator="\n")
    writer.writerow(rows.names)
    for r in rows.rows:
        writer.writerow([text(v) for v in r])


def _write_json(rows: Rows, out: TextIO, lines: bool) -> None:
    objects = (json.dumps({n: plain(v) for n, v in zip(rows.names, r)}, ensure_ascii=False) for r in rows.rows)
    if lines:
        for obj in objects:
            out.write(obj + "\n")
        return
    body = ",\n".join(objects)
    out.write("[\n" + body + "\n]\n" if body else "[]\n")


def _md(value: str) -> str:
    return value.replace("\\", "\\\\").replace("|", "\\|").replace("\r", "").replace("\n", "<br>")


def _write_markdown(rows: Rows, out: TextIO) -> None:
    out.write("| " + " | ".join(_md(n) for n in rows.names) + " |\n")
    out.write("|" + "|".join(" --- " for _ in rows.names) + "|\n")
    for r in rows.rows:
        out.write("| " + " | ".join(_md(text(v)) for v in r) + " |\n")


def write_parquet(data: Rows | pa.Table, path: Path) -> None:
    """Write ``data`` as zstd-compressed Parquet (types inferred for :class:`Rows`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = data if isinstance(data, pa.Table) else pa.Table.from_pylist(data.to_dicts()) if data.rows \
        else pa.table({n: pa.array([], pa.null()) for n in data.names})
    pq.write_table(table, path, compression="zstd")


def emit(data: Rows | pa.Table, fmt: str, output: Path | None = None, *, console: Console | None = None,
         max_rows: int | None = None, footer: bool = True, more: str = "--max-rows 0") -> None:
    """Write ``data`` as ``fmt`` to ``output`` (a file, replaced) or to stdout / ``console``.

    ``max_rows`` limits the ``table`` format only (``more``: the option to see more). Raises ``ValueError`` for an
    unknown format or ``parquet`` without a file; ``OSError`` if the file cannot
    be written.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown --format {fmt!r}; use one of {', '.join(FORMATS)}")
    if fmt == "parquet":
        if output is None:
            raise ValueError("--format parquet needs --output FILE")
        write_parquet(data, output)
        return
    rows = as_rows(data)
    if output is not None:
        with open(output, "w", encoding="utf-8", newline="") as f:
            _emit_text(rows, fmt, f, None, max_rows, footer, more)
    else:
        _emit_text(rows, fmt, sys.stdout, console, max_rows, footer, more)


def _emit_text(rows: Rows, fmt: str, out: TextIO, console: Console | None, max_rows: int | None,
               footer: bool, more: str = "--max-rows 0") -> None:
    if fmt == "table":
        from rich.console import Console

        if console is None or out is not sys.stdout:
            console = Console(file=out, highlight=False, soft_wrap=False)
        render_table(rows, console, max_rows, footer, more)
    elif fmt in ("csv", "tsv"):
        _write_delimited(rows, out, "," if fmt == "csv" else "\t")
    elif fmt in ("json", "ndjson"):
        _write_json(rows, out, lines=fmt == "ndjson")
    else:
        _write_markdown(rows, out)
    out.flush()


def records(pairs: Iterable[tuple[str, Any]]) -> Rows:
    """A two-column ``field``/``value`` view of one record (for ``table`` output of one object)."""
    return Rows(["field", "value"], [(k, v) for k, v in pairs])


def as_text(data: Rows | pa.Table, fmt: str) -> str:
    """``data`` rendered as ``fmt`` (not table/parquet) into a string (for tests and reports)."""
    buf = io.StringIO()
    _emit_text(as_rows(data), fmt, buf, None, None, False)
    return buf.getvalue()
