"""Self-contained HTML reports for ``dumpdb compare`` and ``dumpdb scan``.

One ``.html`` file that opens in a browser with no server and no network:

* inline CSS and a few dozen lines of vanilla JS (sortable, filterable tables);
* plots are inline SVG drawn by matplotlib (dense scatter rasterised by Agg into a
  PNG data URI inside the SVG, so the size does not grow with the point count);
* table rows travel as compact JSON (strings dictionary-encoded, floats rounded to
  display precision) inside ``<script type="application/json">`` and are built by
  the JS with ``textContent``: 10k pairs stay around 2 MB instead of ~5 MB of
  ``<td>`` markup, and no data string is ever parsed as HTML;
* every other text (summary, first divergence, headings) goes through
  :func:`html.escape`.

Nothing is loaded from the web: no ``<script src>``, no ``<link href>``, no fonts.
Files are written atomically (temporary file in the same folder, then rename).
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import os
import re
import tempfile
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator
from PIL import Image  # matplotlib's own dependency

from dumpdb.compare import registry

__all__ = ["write_compare_report", "write_scan_report"]

# Metrics plotted first (always visible) and the others (in a collapsed <details>): the
# registry's (dumpdb.compare.registry) primary flag, plot scale and digits.


def _metric_names() -> tuple[str, ...]:
    """Every registered metric, primary ones first (registry order within each)."""
    registry.load_plugins()
    every = registry.metrics()
    return tuple(m.name for m in every if m.primary) + tuple(m.name for m in every if not m.primary)


def _plot_kind(metric: str) -> str:
    entry = registry.get(metric)
    return entry.plot if entry else "log"


METRICS = _metric_names()

# Column order of the pairs table; columns not listed follow, all-NULL columns are left out.
PAIR_COLUMNS_HEAD = ("pair_index", "iteration", "rank", "position", "op_type", "target_name", "bench_name",
                     "io", "slot", "result")
PAIR_COLUMNS_TAIL = ("err_message", "match_strategy", "target_dtype", "bench_dtype", "target_shape",
                     "bench_shape", "code_file", "code_line", "code_text", "target_tensor_id",
                     "bench_tensor_id", "mode")
UNMATCHED_COLUMNS = ("side", "tensor_id", "name", "op_type", "io", "slot")

MAX_PLOT_GROUPS = 8     # iterations plotted; the table always has every pair
PLOT_DPI = 80           # raster resolution of the scatter inside each SVG
TABLE_PAGE = 1000       # rows the JS draws before a "show all" button
COLOURS = {"pass": "#4c72b0", "noise": "#7fb685", "warning": "#e08a1e", "error": "#c8102e", "other": "#8c8c8c"}
RESULT_ORDER = ("pass", "noise", "other", "warning", "error")  # drawing order: errors on top


# --------------------------------------------------------------------------- text helpers

def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _text(value: Any) -> str:
    """Plain text of a summary / divergence value (not escaped)."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return f"{value:.6g}"
    if isinstance(value, Decimal):
        return _text(float(value))
    if isinstance(value, datetime):
        return value.isoformat(sep=" ", timespec="seconds")
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_text(v) for v in value) + "]"
    return str(value)


def _maybe_json(value: Any) -> Any:
    """A JSON object stored as text (e.g. ``compares.options``) as a dict; anything else unchanged."""
    if isinstance(value, str) and value[:1] == "{":
        try:
            parsed = json.loads(value)
        except ValueError:
            return value
        if isinstance(parsed, dict):
            return parsed
    return value


def _dl(mapping: Mapping[str, Any], *, cls: str = "kv") -> str:
    """A definition list; nested mappings become nested lists."""
    parts = [f'<dl class="{cls}">']
    for key, value in mapping.items():
        value = _maybe_json(value)
        parts.append(f"<dt>{_esc(str(key).replace('_', ' '))}</dt>")
        if isinstance(value, Mapping):
            parts.append(f"<dd>{_dl(value) if value else '—'}</dd>")
        else:
            parts.append(f"<dd>{_esc(_text(value))}</dd>")
    parts.append("</dl>")
    return "".join(parts)


# --------------------------------------------------------------------------- arrow helpers

def _has_values(table: pa.Table, name: str) -> bool:
    return name in table.column_names and table.num_rows > 0 and table.column(name).null_count < table.num_rows


def _floats(table: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(values as float64 with NaN for NULL, mask of non-NULL)."""
    col = table.column(name)
    present = pc.is_valid(col).to_numpy(zero_copy_only=False).astype(bool)
    try:
        values = pc.cast(col, pa.float64(), safe=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        values = pa.array([_to_float(v) for v in col.to_pylist()], pa.float64())
    values = pc.fill_null(values, math.nan).to_numpy(zero_copy_only=False).astype(np.float64)
    return values, present


def _to_float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


# Which verdict column colours the report: "result" (msprobe's rules) or "precision_result"
# (the precision-aware rules, dumpdb.compare.precision), set per report from summary["rules"].
_VERDICT = {"column": "result"}


def _results(table: pa.Table) -> list[str]:
    """Result category of every row: pass / warning / error / other."""
    column = _VERDICT["column"] if _VERDICT["column"] in table.column_names else "result"
    if column not in table.column_names:
        return ["other"] * table.num_rows
    out = []
    for v in table.column(column).to_pylist():
        v = str(v).strip().lower() if v is not None else ""
        out.append(v if v in ("pass", "noise", "warning", "error") else "other")
    return out


def _cell_string(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_cell_string(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return json.dumps({str(k): _text(v) for k, v in value.items()}, ensure_ascii=False)
    return _text(value)


_INF = math.inf


def _num_token(value: float | None, digits: int) -> str:
    """A float as a JSON token at display precision: ``1.234e-5``; NaN/inf as strings; NULL as null."""
    if value is None:
        return "null"
    if value != value:
        return '"NaN"'
    if value == _INF or value == -_INF:
        return '"Infinity"' if value > 0 else '"-Infinity"'
    tok = format(float(value), f".{digits}g")
    if "e" in tok:  # 1.5e-05 -> 1.5e-5, 1e+20 -> 1e20
        tok = tok.replace("e-0", "e-").replace("e+0", "e").replace("e+", "e")
    return tok


def _hashable(value: Any) -> Any:
    if isinstance(value, list):
        return ("\0list", *(_hashable(v) for v in value))
    if isinstance(value, dict):
        return ("\0dict", *((k, _hashable(v)) for k, v in value.items()))
    return (type(value).__name__, value)


def _kind(typ: pa.DataType) -> str:
    if pa.types.is_dictionary(typ):
        typ = typ.value_type
    if pa.types.is_integer(typ):
        return "i"
    if pa.types.is_floating(typ) or pa.types.is_decimal(typ):
        return "n"
    return "s"


def _table_json(table: pa.Table, columns: Sequence[str]) -> str:
    """``{"columns": [{name, kind}], "strings": [...], "rows": [[...]]}`` as compact JSON text.

    Integers stay integers; floats are rounded to display precision (the archive has the
    exact values); strings are indices into one shared dictionary (op names, code lines,
    dtypes repeat across rows).
    """
    strings: dict[str, int] = {}
    meta, tokens = [], []
    for name in columns:
        col = table.column(name)
        kind = _kind(col.type)
        values = col.to_pylist()
        if kind == "i":
            tok = ["null" if v is None else str(int(v)) for v in values]
        elif kind == "n":
            entry = registry.get(name)
            digits = entry.digits if entry else 4
            tok = [_num_token(v, digits) for v in values]
        else:
            codes: dict[Any, str] = {}  # per distinct value: _cell_string once, not once per row
            tok = []
            for v in values:
                key = _hashable(v)
                code = codes.get(key)
                if code is None:
                    code = codes[key] = "null" if v is None else str(strings.setdefault(_cell_string(v), len(strings)))
                tok.append(code)
        meta.append({"name": name, "kind": kind})
        tokens.append(tok)
    rows = ",".join("[" + ",".join(r) + "]" for r in zip(*tokens)) if tokens else ""
    head = json.dumps({"columns": meta, "strings": list(strings)}, separators=(",", ":"), ensure_ascii=False)
    return head[:-1] + ',"rows":[' + rows + "]}"


def _json_text_script(element_id: str, text: str) -> str:
    text = text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
    text = text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    return f'<script type="application/json" id="{_esc(element_id)}">{text}</script>'


def _constant_columns(table: pa.Table, columns: Sequence[str], keep: Iterable[str]) -> dict[str, Any]:
    """Columns with one value in every row (rank 0, mode, dtype...): shown once above the table."""
    if table.num_rows < 2:
        return {}
    out = {}
    for name in columns:
        if name in keep:
            continue
        col = table.column(name)
        if col.null_count:
            continue
        first = col[0].as_py()
        if isinstance(first, float) and math.isnan(first):
            continue
        try:
            same = pc.all(pc.equal(col, col[0])).as_py()
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid, TypeError):  # lists, structs...
            same = all(v == first for v in col.to_pylist())
        if same:
            out[name] = first
    return out


TABLE_KEEP = frozenset({"pair_index", "target_name", "bench_name", "result", "name", "tensor_id", "check",
                        "op_name"})


def _table_block(element_id: str, table: pa.Table, columns: Sequence[str], *, empty: str) -> str:
    if table.num_rows == 0:
        return f'<p class="muted">{_esc(empty)}</p>'
    constant = _constant_columns(table, columns, TABLE_KEEP)
    same = ""
    if constant:
        same = ('<p class="note">Same in every row: '
                + " · ".join(f"{_esc(k)} <b>{_esc(_cell_string(v))}</b>" for k, v in constant.items()) + "</p>")
    columns = [c for c in columns if c not in constant]
    return (f'{same}<div class="datatable" id="{_esc(element_id)}" data-src="{_esc(element_id)}-data">'
            f'<noscript><p class="muted">The table needs JavaScript; its rows are in the JSON below.</p></noscript>'
            f"</div>{_json_text_script(element_id + '-data', _table_json(table, columns))}")


# --------------------------------------------------------------------------- plots

_PNG_RE = re.compile(r"data:image/png;base64,([A-Za-z0-9+/=\s]+)")


def _smaller_png(m: re.Match) -> str:
    """Re-encode a rasterised scatter with a 64-colour palette: ~3x smaller than Agg's RGBA PNG."""
    raw = base64.b64decode(m.group(1))
    try:
        with Image.open(io.BytesIO(raw)) as im:
            small = im.convert("RGBA").quantize(colors=64, method=Image.Quantize.FASTOCTREE)
        out = io.BytesIO()
        small.save(out, format="PNG")
        data = out.getvalue()
    except (OSError, ValueError):
        data = raw
    return "data:image/png;base64," + base64.b64encode(min(data, raw, key=len)).decode("ascii")


_ID_RE = re.compile(r'\sid="([^"]+)"')
_FONT_RE = re.compile(r"font-family:[^;\"]*;? ?")
_GEOM_RE = re.compile(r'(\s(?:d|x|y|transform)="(?!scale|matrix))([^"]*)"')  # coordinates in pt: 2 decimals
_DECIMALS_RE = re.compile(r"(\d\.\d\d)\d+")


def _svg(fig: Figure, uid: str, label: str) -> str:
    """The figure as an inline ``<svg>``: no XML prolog/DOCTYPE, ids made unique in the page."""
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": uid, "svg.image_inline": True}):
        fig.savefig(buf, format="svg", dpi=PLOT_DPI,
                    metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
    text = buf.getvalue()
    text = text[text.index("<svg"):]
    text = _PNG_RE.sub(_smaller_png, text)
    text = re.sub(r">\s+<", "><", text)
    text = re.sub(r" ?\n\s*", " ", text)  # path data and indentation
    text = _FONT_RE.sub("", text)  # the page's CSS gives the font: no 200-character family list per label
    text = _GEOM_RE.sub(lambda m: m.group(1) + _DECIMALS_RE.sub(r"\1", m.group(2)) + '"', text)
    referenced = set(re.findall(r'(?:href="#|url\(#)([^")]+)', text))

    def _rename(m: re.Match) -> str:
        return f' id="{uid}-{m.group(1)}"' if m.group(1) in referenced else ""

    text = _ID_RE.sub(_rename, text)
    text = re.sub(r'(href="#|url\(#)([^")]+)', lambda m: f"{m.group(1)}{uid}-{m.group(2)}", text)
    return text.replace("<svg ", f'<svg class="plot-svg" role="img" aria-label="{_esc(label)}" ', 1).strip()


# Threshold names drawn as lines: absolute limits (verdict.Thresholds: cosine_error, max_abs_err_error_max...),
# not the relative input/output rules (cosine_warn_drop, rel_err_input...), which a line would misrepresent.
_THRESHOLD_SUFFIXES = ("_error", "_error_max", "_warning", "_warn", "_threshold")


def _thresholds_for(metric: str, thresholds: Any) -> list[tuple[str, float]]:
    """Horizontal reference lines for ``metric`` found in ``summary['thresholds']`` (best effort)."""
    out: list[tuple[str, float]] = []
    thresholds = _maybe_json(thresholds)
    if not isinstance(thresholds, Mapping):
        return out
    for key, value in thresholds.items():
        key = str(key)
        if key != metric and key not in {metric + s for s in _THRESHOLD_SUFFIXES}:
            continue
        value = _maybe_json(value)
        items = value.items() if isinstance(value, Mapping) else [(key, value)]
        for label, v in items:
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                out.append((str(label), float(v)))
    return out


def _decade(value: float, _pos: Any = None) -> str:
    if value <= 0:
        return ""
    exp = math.log10(value)
    return f"1e{round(exp)}" if abs(exp - round(exp)) < 1e-9 else f"{value:.2g}"


def _signed_decade(value: float, _pos: Any = None) -> str:
    return "0" if value == 0 else ("-" if value < 0 else "") + _decade(abs(value))


def _symlog(ax: Any, vals: np.ndarray, nz: np.ndarray) -> None:
    """Symmetric log y axis for signed values spanning decades: at most ~5 labelled decades per side."""
    lt = float(max(np.percentile(nz, 10), nz.max() * 1e-12))
    ax.set_yscale("symlog", linthresh=lt, linscale=0.5)
    kmin, kmax = math.floor(math.log10(lt)) + 1, math.ceil(math.log10(nz.max()))
    step = max(1, math.ceil((kmax - kmin + 1) / 4))
    decades = [10.0 ** k for k in range(kmax, kmin - 1, -step)]
    ticks = {0.0}
    ticks |= set(decades) if (vals > 0).any() else set()
    ticks |= {-d for d in decades} if (vals < 0).any() else set()
    ax.set_yticks(sorted(ticks))
    ax.yaxis.set_major_formatter(FuncFormatter(_signed_decade))
    ax.yaxis.set_minor_locator(NullLocator())


def _metric_svg(metric: str, x: np.ndarray, y: np.ndarray, present: np.ndarray, cats: np.ndarray, *,
                xlabel: str, uid: str, divergence_x: float | None, thresholds: Any, small: bool) -> str:
    height = 2.1 if small else 2.5
    fig = Figure(figsize=(7.0, height))
    # fixed margins (constrained layout measures every label twice: 3x slower); legend on the right
    fig.subplots_adjust(left=0.1, right=0.8, bottom=0.42 / height, top=1 - 0.3 / height)
    ax = fig.add_subplot()
    finite = present & np.isfinite(y)
    nonfinite = present & ~np.isfinite(y)
    yplot = y.copy()
    scale_note = ""
    floor_mask = np.zeros_like(finite)
    vals = y[finite]
    if vals.size and _plot_kind(metric) != "linear":
        if _plot_kind(metric) == "signed" and (vals < 0).any():
            nz = np.abs(vals[vals != 0])
            if nz.size and nz.max() / nz.min() >= 1e3:
                _symlog(ax, vals, nz)
                scale_note = " (symlog)"
        else:
            pos = vals[vals > 0]
            if pos.size and pos.max() / pos.min() >= 1e2:
                floor = pos.min() / 4
                ax.set_yscale("log")
                ax.yaxis.set_major_locator(LogLocator(numticks=7))
                ax.yaxis.set_minor_locator(NullLocator())  # minor ticks: hundreds of SVG groups
                ax.yaxis.set_major_formatter(FuncFormatter(_decade))  # plain text, no mathtext
                floor_mask = finite & (y <= 0)
                yplot = np.where(floor_mask, floor, y)
                scale_note = " (log; ≤0 drawn ▼ at the bottom)" if floor_mask.any() else " (log)"
    for cat in RESULT_ORDER:
        sel = cats == cat
        m = finite & sel & ~floor_mask
        f = floor_mask & sel
        n = int((present & sel).sum())
        if not n:
            continue
        label: str | None = f"{cat} ({n})"
        big = cat in ("warning", "error")
        if m.any():
            ax.scatter(x[m], yplot[m], s=14 if big else 5, c=COLOURS[cat], linewidths=0, rasterized=True,
                       zorder=3 if big else 2, label=label)
            label = None
        if f.any():
            ax.scatter(x[f], yplot[f], s=16 if big else 8, c=COLOURS[cat], marker="v", linewidths=0,
                       rasterized=True, zorder=3, label=label)
    if nonfinite.any():
        ax.scatter(x[nonfinite], np.full(int(nonfinite.sum()), 0.96), transform=ax.get_xaxis_transform(),
                   marker="x", s=22, c="#6a1b9a", linewidths=1.2, zorder=4, clip_on=False,
                   label=f"NaN/inf ({int(nonfinite.sum())})", rasterized=True)
    for label, value in _thresholds_for(metric, thresholds):
        ax.axhline(value, color="#777777", lw=0.8, ls="--", zorder=1)
        ax.annotate(f"{label} {value:g}", (0.005, value), xycoords=("axes fraction", "data"), fontsize=6,
                    color="#555555", ha="left", va="bottom", annotation_clip=True, parse_math=False)
    if divergence_x is not None:
        ax.axvline(divergence_x, color=COLOURS["error"], lw=1, ls=":", zorder=1, label="first divergence")
    ax.set_title(metric + scale_note, fontsize=9, loc="left")
    ax.set_xlabel(xlabel, fontsize=7)
    ax.tick_params(labelsize=7)
    ax.grid(True, lw=0.3, alpha=0.5)
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, borderaxespad=0.0)
    return _svg(fig, uid, f"{metric} by execution order")


def _group_rows(table: pa.Table) -> list[tuple[Any, np.ndarray]]:
    """(iteration, row indices) per iteration present; one group when there is no iteration column."""
    if not _has_values(table, "iteration"):
        return [(None, np.arange(table.num_rows))] if table.num_rows else []
    groups: dict[Any, list[int]] = {}
    for i, v in enumerate(table.column("iteration").to_pylist()):
        groups.setdefault(v, []).append(i)
    keys = sorted(groups, key=lambda k: (k is None, str(type(k)), k if k is not None else 0))
    return [(k, np.asarray(groups[k])) for k in keys]


def _x_axis(table: pa.Table, rows: np.ndarray) -> tuple[np.ndarray, str]:
    for name, label in (("position", "execution order (position)"), ("pair_index", "pair index")):
        if name in table.column_names:
            values, present = _floats(table, name)
            if present[rows].all() and np.isfinite(values[rows]).all():
                return values[rows], label
    return np.arange(rows.size, dtype=np.float64), "row"


def _find_divergence_row(results: pa.Table, fd: Mapping[str, Any] | None) -> int | None:
    if not fd or results.num_rows == 0:
        return None
    cols = results.column_names
    if fd.get("pair_index") is not None and "pair_index" in cols:
        for i, v in enumerate(results.column("pair_index").to_pylist()):
            if v == fd["pair_index"]:
                return i
    name = fd.get("name", fd.get("target_name"))
    if name is None or "target_name" not in cols:
        return None
    keys = [k for k in ("iteration", "rank", "io", "slot") if fd.get(k) is not None and k in cols]
    columns = {k: results.column(k).to_pylist() for k in keys}
    cats = _results(results)
    candidates = [i for i, v in enumerate(results.column("target_name").to_pylist())
                  if v == name and all(columns[k][i] == fd[k] for k in keys)]
    failing = [i for i in candidates if cats[i] != "pass"]
    return failing[0] if failing else candidates[0] if candidates else None


def _plots_section(results: pa.Table, summary: Mapping[str, Any], divergence_row: int | None) -> str:
    metrics = [m for m in _metric_names() if _has_values(results, m)]
    groups = _group_rows(results)
    if not metrics or not groups:
        return '<p class="muted">No metric has values: nothing to plot.</p>'
    cats_all = np.asarray(_results(results))
    div_iter = None
    if divergence_row is not None:
        div_iter = results.column("iteration")[divergence_row].as_py() if "iteration" in results.column_names else None
    chosen = groups
    if len(groups) > MAX_PLOT_GROUPS:
        first = [g for g in groups if g[0] == div_iter][:1]
        rest = [g for g in groups if g[0] != div_iter or not first]
        keep = {id(g) for g in (first + rest)[:MAX_PLOT_GROUPS]}
        chosen = [g for g in groups if id(g) in keep]
    series = {m: _floats(results, m) for m in metrics}
    thresholds = summary.get("thresholds")
    parts = []
    if len(chosen) < len(groups):
        left = [_text(g[0]) for g in groups if all(g is not c for c in chosen)]
        parts.append(f'<p class="note">{len(groups)} iterations; plotted {len(chosen)} (limit {MAX_PLOT_GROUPS}). '
                     f'Not plotted: {_esc(", ".join(left))}. The table below lists every pair.</p>')
    for n_group, (key, rows) in enumerate(chosen):
        order = np.argsort(_x_axis(results, rows)[0], kind="stable")
        rows = rows[order]
        x, xlabel = _x_axis(results, rows)
        cats = cats_all[rows]
        counts = Counter(cats.tolist())
        head = f"Iteration {_text(key)}" if "iteration" in results.column_names else "All pairs"
        ranks = ""
        if _has_values(results, "rank"):
            rvals = sorted({v for v in results.column("rank").take(pa.array(rows)).to_pylist() if v is not None})
            if len(rvals) > 1:
                ranks = f" · ranks {_esc(_text(rvals[0]))}–{_esc(_text(rvals[-1]))} overlaid"
        count_text = " · ".join(f'<span class="r-{c}">{counts[c]} {c}</span>'
                                for c in ("pass", "warning", "error", "other") if counts.get(c))
        div_x = None
        if divergence_row is not None and divergence_row in set(rows.tolist()):
            div_x = float(x[int(np.nonzero(rows == divergence_row)[0][0])])
        primary: list[str] = []
        secondary: list[str] = []
        for metric in metrics:
            y, present = series[metric]
            if not present[rows].any():
                continue
            small = not getattr(registry.get(metric), "primary", False)
            svg = _metric_svg(metric, x, y[rows], present[rows], cats, xlabel=xlabel,
                              uid=f"g{n_group}m{_metric_names().index(metric)}", divergence_x=div_x,
                              thresholds=thresholds, small=small)
            fig_html = f'<figure class="plot" data-metric="{_esc(metric)}">{svg}</figure>'
            (secondary if small else primary).append(fig_html)
        parts.append(f'<section class="iteration"><h3>{_esc(head)} <small>{rows.size} pairs · {count_text}{ranks}'
                     f"</small></h3>")
        parts.append(f'<div class="plots">{"".join(primary)}</div>')
        if secondary:
            parts.append(f'<details><summary>{len(secondary)} more metric(s)</summary>'
                         f'<div class="plots">{"".join(secondary)}</div></details>')
        parts.append("</section>")
    return "".join(parts)


# --------------------------------------------------------------------------- page

_CSS = """
:root{--pass:#2e7d32;--warning:#b26a00;--error:#c8102e;--muted:#666;--line:#ddd;--bg:#f7f7f9}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#222;background:#fff}
header{background:#1f2933;color:#fff;padding:14px 24px}
header h1{margin:0;font-size:20px;word-break:break-all}
header nav a{color:#cde;margin-right:14px;font-size:13px}
main{padding:8px 24px 40px}
h2{font-size:17px;border-bottom:1px solid var(--line);padding-bottom:4px;margin-top:28px}
h3{font-size:15px;margin:18px 0 6px}
h3 small{font-weight:normal;color:var(--muted)}
.badges span{display:inline-block;margin:8px 8px 0 0;padding:2px 10px;border-radius:12px;background:#3e4c59;
 font-size:13px}
.badges .b-error{background:var(--error)}.badges .b-warning{background:var(--warning)}
.badges .b-pass{background:var(--pass)}.badges .b-noise{background:#7fb685}
.r-pass{color:var(--pass)}.r-warning{color:var(--warning)}.r-error{color:var(--error)}
td.r-pass,td.r-warning,td.r-error{font-weight:600}
td.r-pass{background:#e8f5e9}td.r-warning{background:#fff3e0}td.r-error{background:#fde8ea}
.verdict{border:2px solid var(--error);border-radius:6px;padding:10px 16px;background:#fff7f8;margin-top:16px}
.verdict.ok{border-color:var(--pass);background:#f3faf3}
.verdict h2{border:0;margin:0 0 6px;color:var(--error);word-break:break-all}
.verdict.ok h2{color:var(--pass)}
dl.kv{display:grid;grid-template-columns:max-content 1fr;gap:2px 16px;margin:6px 0}
dl.kv dt{color:var(--muted)}dl.kv dd{margin:0;word-break:break-all}
dl.kv dl.kv{margin:0}
pre{background:var(--bg);border:1px solid var(--line);padding:8px;overflow:auto;max-height:20em;white-space:pre-wrap}
ol.path{margin:4px 0;padding-left:2.5em;font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px;
 word-break:break-all}
ol.path li.here{color:var(--error);font-weight:700}
table.metrics{border-collapse:collapse;font-size:13px}
table.metrics td,table.metrics th{border:1px solid var(--line);padding:2px 8px;text-align:left}
.plots{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:4px 16px}
figure.plot{margin:0}
svg.plot-svg{width:100%;height:auto;display:block}
svg.plot-svg text{font-family:"DejaVu Sans","Bitstream Vera Sans",Verdana,Arial,sans-serif}
.muted,.note{color:var(--muted)}
details summary{cursor:pointer;color:#245;margin:6px 0}
.dt-bar{display:flex;gap:10px;align-items:center;margin:6px 0;flex-wrap:wrap}
.dt-bar input[type=search]{width:28em;max-width:100%;padding:4px 8px}
.dt-wrap{max-height:75vh;overflow:auto;border:1px solid var(--line)}
.dt-wrap table{border-collapse:collapse;font-size:12px;width:max-content;min-width:100%}
.dt-wrap th{position:sticky;top:0;background:#eef1f4;cursor:pointer;user-select:none;text-align:left;
 padding:4px 6px;border-bottom:1px solid #ccd;max-width:9em;vertical-align:bottom}
.dt-wrap th.asc::after{content:" ▲"}.dt-wrap th.desc::after{content:" ▼"}
.dt-wrap td{padding:2px 6px;border-bottom:1px solid #eee;white-space:nowrap;max-width:32em;overflow:hidden;
 text-overflow:ellipsis;font-family:ui-monospace,Menlo,Consolas,monospace}
.dt-wrap td.num{text-align:right}
.dt-wrap tr:hover td{background:#f5f8ff}
footer{color:var(--muted);font-size:12px;padding:10px 24px;border-top:1px solid var(--line)}
"""

# Tables: rows come from <script type="application/json"> and are drawn with textContent (no HTML parsing).
_JS = r"""
(function () {
  "use strict";
  function txt(v) {
    if (v === null || v === undefined) return "";
    if (typeof v === "number") { if (isNaN(v)) return "NaN"; if (!isFinite(v)) return v > 0 ? "inf" : "-inf"; }
    return String(v);
  }
  function cmp(a, b) {  // numbers, then NaN, then strings; NULLs are handled by the caller
    var na = typeof a === "number", nb = typeof b === "number";
    if (na && nb) { if (isNaN(a) || isNaN(b)) return isNaN(a) - isNaN(b); return a < b ? -1 : a > b ? 1 : 0; }
    if (na !== nb) return na ? -1 : 1;
    return collator.compare(String(a), String(b));
  }
  var collator = new Intl.Collator(undefined, {numeric: true});
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function setup(box) {
    var d = JSON.parse(document.getElementById(box.getAttribute("data-src")).textContent);
    var cols = d.columns, S = d.strings, resCol = -1;
    cols.forEach(function (c, i) { if (c.name === "result") resCol = i; });
    var rows = d.rows.map(function (r) {
      return r.map(function (x, i) {
        if (x === null) return null;
        var k = cols[i].kind;
        return k === "s" ? S[x] : (k === "n" && typeof x === "string") ? Number(x) : x;
      });
    });
    var hay = rows.map(function (r) { return r.map(txt).join("\u0001").toLowerCase(); });
    var order = rows.map(function (_, i) { return i; }), sortCol = -1, dir = 1, limit = %(page)d;
    var bar = el("div", "dt-bar"), input = el("input"), sel = el("select"), info = el("span", "muted");
    input.type = "search"; input.id = box.id + "-filter";
    input.placeholder = "filter: words that every shown row contains";
    ["all results", "error", "warning", "pass", "warning+error"].forEach(function (o) {
      var op = el("option", "", o); op.value = o; sel.appendChild(op);
    });
    var more = el("button", "", "show all");
    bar.appendChild(input); if (resCol >= 0) bar.appendChild(sel); bar.appendChild(info); bar.appendChild(more);
    var wrap = el("div", "dt-wrap"), table = el("table"), thead = el("thead"), hr = el("tr"), tbody = el("tbody");
    var ths = cols.map(function (c, i) {
      var th = el("th", "", c.name.replace(/_/g, "_\u200b")); th.title = c.name + " (click to sort)";
      th.addEventListener("click", function () { dir = sortCol === i ? -dir : 1; sortCol = i; sort(); render(); });
      hr.appendChild(th); return th;
    });
    thead.appendChild(hr); table.appendChild(thead); table.appendChild(tbody); wrap.appendChild(table);
    box.appendChild(bar); box.appendChild(wrap);
    function sort() {
      order.sort(function (a, b) {
        var x = rows[a][sortCol], y = rows[b][sortCol];
        if (x === null || y === null) return (x === null) - (y === null) || a - b;  // NULLs last
        return dir * cmp(x, y) || a - b;
      });
      ths.forEach(function (th, i) { th.className = i === sortCol ? (dir > 0 ? "asc" : "desc") : ""; });
    }
    function render() {
      var terms = input.value.toLowerCase().split(/\s+/).filter(Boolean), want = sel.value;
      var shown = order.filter(function (i) {
        if (resCol >= 0 && want !== "all results") {
          var r = rows[i][resCol];
          if (want === "warning+error" ? (r !== "warning" && r !== "error") : r !== want) return false;
        }
        return terms.every(function (t) { return hay[i].indexOf(t) >= 0; });
      });
      while (tbody.firstChild) tbody.removeChild(tbody.firstChild);
      shown.slice(0, limit).forEach(function (i) {
        var tr = el("tr");
        rows[i].forEach(function (v, j) {
          var s = txt(v), td = el("td", cols[j].kind === "s" ? "" : "num", s);
          if (j === resCol && v) td.className = "r-" + v;
          if (s.length > 40) td.title = s;
          tr.appendChild(td);
        });
        tbody.appendChild(tr);
      });
      info.textContent = shown.length + " of " + rows.length + " rows" +
        (shown.length > limit ? ", first " + limit + " shown" : "");
      more.style.display = shown.length > limit ? "" : "none";
    }
    var timer = null;
    input.addEventListener("input", function () { clearTimeout(timer); timer = setTimeout(render, 150); });
    sel.addEventListener("change", render);
    more.addEventListener("click", function () { limit = Infinity; render(); });
    render();
  }
  Array.prototype.forEach.call(document.querySelectorAll("div.datatable"), setup);
  Array.prototype.forEach.call(document.querySelectorAll("a[data-filter]"), function (a) {
    a.addEventListener("click", function () {
      var input = document.getElementById(a.getAttribute("data-table") + "-filter");
      if (input) { input.value = a.getAttribute("data-filter"); input.dispatchEvent(new Event("input")); }
    });
  });
})();
""" % {"page": TABLE_PAGE}


def _page(title: str, header_extra: str, nav: Iterable[tuple[str, str]], body: str) -> str:
    from dumpdb import __version__

    links = "".join(f'<a href="#{_esc(anchor)}">{_esc(label)}</a>' for anchor, label in nav)
    return ("<!DOCTYPE html>\n"
            '<html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{_esc(title)}</title><style>{_CSS}</style></head><body>"
            f"<header><h1>{_esc(title)}</h1>{header_extra}<nav>{links}</nav></header>"
            f"<main>{body}</main>"
            f"<footer>dumpdb {_esc(__version__)} · self-contained report: everything is in this file, "
            f"nothing is loaded from the network.</footer>"
            f"<script>{_JS}</script></body></html>\n")


def _write_atomic(path: str | os.PathLike[str], text: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def _badges(items: Iterable[tuple[str, str]]) -> str:
    return '<div class="badges">' + "".join(f'<span class="{_esc(c)}">{_esc(t)}</span>' for c, t in items) + "</div>"


def _ordered_columns(table: pa.Table, head: Sequence[str], tail: Sequence[str], skip: Iterable[str] = ()) -> list[str]:
    skip = set(skip)
    names = [c for c in table.column_names if c not in skip and _has_values(table, c)]
    known = list(head) + list(_metric_names()) + list(tail)
    ordered = [c for c in head if c in names] + [c for c in _metric_names() if c in names]
    ordered += [c for c in names if c not in known] + [c for c in tail if c in names]
    return ordered


# --------------------------------------------------------------------------- compare report

_FD_HANDLED = frozenset({"name", "target_name", "path", "metrics", "code_file", "code_line", "code_text", "inputs",
                         "outputs", "phases", "ranks", "sides", *METRICS})


def _fmt_num(v: Any) -> str:
    return "" if v is None else format(float(v), ".4g")


def _precision_svg(results: pa.Table) -> str:
    """Scaled error of every pair along execution order (log scale), with the precision floor
    x margin each pair is judged against drawn as a line: what departs is above it."""
    cols = results.column_names
    if "scaled_err" not in cols or "precision_floor" not in cols or results.num_rows == 0:
        return ""
    err = np.asarray([_to_float(v) for v in results.column("scaled_err").to_pylist()])
    floor = np.asarray([_to_float(v) for v in results.column("precision_floor").to_pylist()])
    cats = np.asarray(_results(results))
    x = np.arange(results.num_rows, dtype=np.float64)
    ok = np.isfinite(err) & (err > 0)
    if not ok.any():
        return '<p class="muted">Every compared pair is bit-identical in value: no error to plot.</p>'
    margin = 64.0  # PrecisionRules.margin default; drawn, not re-judged
    fig = Figure(figsize=(7.0, 2.6))
    fig.subplots_adjust(left=0.1, right=0.8, bottom=0.17, top=0.9)
    ax = fig.add_subplot()
    for cat in RESULT_ORDER:
        m = ok & (cats == cat)
        if m.any():
            ax.scatter(x[m], err[m], s=6 if cat in ("pass", "other") else 14, c=COLOURS[cat], label=cat,
                       rasterized=True, linewidths=0)
    fm = np.isfinite(floor) & (floor > 0)
    if fm.any():
        ax.step(x[fm], floor[fm] * margin, where="mid", color="#333333", linewidth=0.8,
                label=f"floor x {margin:g}")
    ax.set_yscale("log")
    ax.set_xlabel("pair (execution order)")
    ax.set_ylabel("relative error")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
    return _svg(fig, "precision", "relative error and precision floor")


def _alignment_section(unmatched: pa.Table) -> str:
    """Ops only one side has: insertions (target) and deletions (bench), by op name."""
    if unmatched.num_rows == 0 or "name" not in unmatched.column_names or "side" not in unmatched.column_names:
        return ""
    parts = []
    for side, label in (("target", "Insertions (ops only the target has)"),
                        ("bench", "Deletions (ops only the bench has)")):
        names = Counter(n for n, sd in zip(unmatched.column("name").to_pylist(), unmatched.column("side").to_pylist())
                        if sd == side and n is not None)
        items = "".join(f"<li><code>{_esc(n)}</code> <small class=\"muted\">({k} tensors)</small></li>"
                        for n, k in names.items())
        parts.append(f"<h3>{label}: {len(names)}</h3>" + (f"<ul>{items}</ul>" if items else
                                                          '<p class="muted">none</p>'))
    return "".join(parts)


def _divergence_section(fd: Mapping[str, Any] | None, results: pa.Table, row: int | None, n_pairs: int,
                        summary: Mapping[str, Any] | None = None) -> str:
    if not fd and summary and summary.get("rules") == "precision":
        dtype = _text(summary.get("precision_dtype") or "the dtypes'")
        return (f'<section class="verdict ok" id="divergence"><h2>No departure beyond {_esc(dtype)} precision</h2>'
                f"<p>{n_pairs} pair(s) compared; every difference is within what rounding explains "
                "(dumpdb.compare.precision).</p></section>")
    if not fd:
        return (f'<section class="verdict ok" id="divergence"><h2>No divergence found</h2>'
                f"<p>{n_pairs} pair(s) compared; none failed.</p></section>")
    name = fd.get("name", fd.get("target_name"))
    parts = ['<section class="verdict" id="divergence">',
             f'<h2>First divergence: {_esc(_text(name))}</h2>']
    if name is not None and n_pairs:
        parts.append(f'<p><a href="#pairs" data-table="pairs" data-filter="{_esc(name)}">show its rows in the '
                     f"table</a></p>")
    if fd.get("sides"):
        parts.append(f'<p class="note">{_esc(_text(fd["sides"]))}</p>')
    rest = {k: v for k, v in fd.items() if k not in _FD_HANDLED and v is not None}
    if rest:
        parts.append(_dl(rest))
    parts.append(_firsts_table("First departure of each phase", [fd["phases"][p] for p in ("forward", "backward",
                                                                                           "optimizer")
                                                                  if p in (fd.get("phases") or {})], "phase"))
    if len(fd.get("ranks") or []) > 1:
        parts.append(_firsts_table("First departure of each rank, in the order they ran", fd["ranks"], "rank"))
    sides = [e for key in ("inputs", "outputs") for e in (fd.get(key) or []) if isinstance(e, Mapping)]
    if sides:  # precision rules: the op's inputs' and outputs' errors side by side
        head = ("io", "slot", "error", "floor", "error / floor", "target dtype", "bench dtype", "result", "reason")
        cells = "".join(
            "<tr>" + "".join(f"<td>{_esc(_text(v))}</td>" for v in (
                e.get("io"), e.get("slot"), _fmt_num(e.get("scaled_err")), _fmt_num(e.get("floor")),
                _fmt_num(e.get("ratio")), e.get("target_dtype"), e.get("bench_dtype"), e.get("result"),
                e.get("reason") or "")) + "</tr>" for e in sides)
        parts.append('<table class="metrics errors"><thead><tr>' + "".join(f"<th>{h}</th>" for h in head)
                     + f"</tr></thead><tbody>{cells}</tbody></table>")
    # metrics: a "metrics" mapping, or metric columns as keys (engine.first_divergence_of), or the pair's row
    metrics = fd.get("metrics") or {m: fd[m] for m in _metric_names() if fd.get(m) is not None}
    if not metrics and row is not None:
        metrics = {m: results.column(m)[row].as_py() for m in _metric_names() if m in results.column_names}
        metrics = {k: v for k, v in metrics.items() if v is not None}
    metrics = _maybe_json(metrics)
    if isinstance(metrics, Mapping) and metrics:
        cells = "".join(f"<tr><th>{_esc(k)}</th><td>{_esc(_text(v))}</td></tr>" for k, v in metrics.items())
        parts.append(f'<table class="metrics"><tbody>{cells}</tbody></table>')
    code_file, code_line, code_text = fd.get("code_file"), fd.get("code_line"), fd.get("code_text")
    if code_file is not None or code_line is not None:
        loc = _text(code_file) + (f":{_text(code_line)}" if code_line is not None else "")
        parts.append(f"<p>Code: <code>{_esc(loc)}</code></p>")
    if code_text:
        parts.append(f"<pre>{_esc(_text(code_text))}</pre>")
    path = fd.get("path")
    if isinstance(path, str):
        path = [path]
    if path:
        path = [_text(p) for p in path]
        if name is not None and path[-1] != _text(name):
            path.append(_text(name))
        here = ' class="here"'
        items = [f"<li{here if i == len(path) - 1 else ''}>{_esc(p)}</li>" for i, p in enumerate(path)]
        if len(items) > 25:
            start = len(items) - 20
            parts.append(f'<details><summary>Path: {len(path)} ops leading to it (last 20 shown; click for all)'
                         f'</summary><ol class="path">{"".join(items[:start])}</ol></details>'
                         f'<ol class="path" start="{start + 1}">{"".join(items[start:])}</ol>')
        else:
            parts.append(f'<p>Path leading to it:</p><ol class="path">{"".join(items)}</ol>')
    parts.append("</section>")
    return "".join(parts)


def _firsts_table(title: str, entries: Sequence[Mapping[str, Any]], first: str) -> str:
    """A small table of departing ops (engine._brief dicts): per phase or per rank."""
    if not entries:
        return ""
    cols = (first, *(c for c in ("phase", "rank") if c != first), "iteration", "position", "target_name", "io",
            "slot", "container", "reason")
    cells = "".join("<tr>" + "".join(f"<td>{_esc(_text(e.get(c)))}</td>" for c in cols) + "</tr>" for e in entries)
    return (f'<h3>{_esc(title)}</h3><table class="metrics firsts"><thead><tr>'
            + "".join(f"<th>{_esc(c)}</th>" for c in cols) + f"</tr></thead><tbody>{cells}</tbody></table>")


def _evidence_section(results: pa.Table) -> str:
    """Rows the precision rules labelled rounding noise or not comparable, pairs the alignment re-aligned by
    content (``realigned``, regions of consecutive pairs) and scalar-argument differences
    (``arg_diff``): each shown when its column is there and has any."""
    cols = results.column_names
    parts = []
    if "precision_result" in cols:
        noise = results.filter(pc.fill_null(pc.equal(results.column("precision_result"), "noise"), False))
        if noise.num_rows:
            parts.append(f'<h3 id="noise">Rounding noise <small class="muted">({noise.num_rows} pairs)</small></h3>'
                         '<p class="note">Both sides at the level of rounding noise of their op (a sum or gradient '
                         "that is zero in exact arithmetic): their relative error says nothing and they never "
                         "depart.</p>" + _rows_table(noise, ("pair_index", "target_name", "io", "slot",
                                                             "precision_reason")))
        if "precision_reason" in cols:
            apart = results.filter(pc.fill_null(pc.and_(
                pc.equal(results.column("precision_result"), "warning"),
                pc.starts_with(results.column("precision_reason"), "not comparable")), False))
            if apart.num_rows:
                parts.append(f'<h3 id="not-comparable">Not comparable <small class="muted">({apart.num_rows} '
                             'pairs)</small></h3><p class="note">A side holds other data than the op computed (an '
                             "in-place optimizer's reused output buffers, a backward record of another op's "
                             "gradients): never a departure.</p>"
                             + _rows_table(apart, ("pair_index", "target_name", "io", "slot", "precision_reason")))
    if "realigned" in cols:
        flags = [bool(v) for v in results.column("realigned").to_pylist()]
        names = results.column("target_name").to_pylist() if "target_name" in cols else [None] * len(flags)
        bench = results.column("bench_name").to_pylist() if "bench_name" in cols else [None] * len(flags)
        regions, i = [], 0
        while i < len(flags):
            if flags[i]:
                j = i
                while j + 1 < len(flags) and flags[j + 1]:
                    j += 1
                regions.append((i, j))
                i = j + 1
            else:
                i += 1
        if regions:
            items = "".join(f"<li>pairs {a}-{b}: <code>{_esc(_text(names[a]))}</code> &hellip; "
                            f"<code>{_esc(_text(names[b]))}</code> (bench <code>{_esc(_text(bench[a]))}</code> "
                            f"&hellip; <code>{_esc(_text(bench[b]))}</code>)</li>" for a, b in regions)
            parts.append(f'<h3 id="realigned">Re-aligned regions <small class="muted">({len(regions)}, '
                         f"{sum(flags)} pairs)</small></h3><p class=\"note\">Pairs the alignment matched by content, "
                         f"not by name.</p><ul>{items}</ul>")
    if "arg_diff" in cols:
        diff = results.filter(pc.invert(pc.is_null(results.column("arg_diff"))))
        if diff.num_rows:
            parts.append(f'<h3 id="arg-diff">Scalar arguments that differ <small class="muted">({diff.num_rows} '
                         "pairs)</small></h3>" + _rows_table(diff, ("pair_index", "target_name", "io", "slot",
                                                                     "arg_diff")))
    if not parts:
        return ""
    return '<h2 id="evidence">Noise, re-alignment and scalar arguments</h2>' + "".join(parts)


def _rows_table(table: pa.Table, columns: Sequence[str]) -> str:
    cols = [c for c in columns if c in table.column_names]
    rows = table.select(cols).to_pylist()
    cells = "".join("<tr>" + "".join(f"<td>{_esc(_text(r[c]))}</td>" for c in cols) + "</tr>" for r in rows)
    return (f'<table class="metrics"><thead><tr>{"".join(f"<th>{_esc(c)}</th>" for c in cols)}</tr></thead>'
            f"<tbody>{cells}</tbody></table>")


def write_compare_report(path: str | os.PathLike[str], *, summary: Mapping[str, Any], results: pa.Table,
                         unmatched: pa.Table, first_divergence: Mapping[str, Any] | None) -> Path:
    """Write the HTML report of one comparison; returns the path written.

    ``results`` holds ``compare_results`` rows (plus optional context columns: iteration,
    rank, op_type, position, dtypes, shapes, code location); ``unmatched`` the
    ``compare_unmatched`` rows; any column may be missing or all NULL.
    """
    summary = dict(summary or {})
    _VERDICT["column"] = "precision_result" if summary.get("rules") == "precision" else "result"
    results = results if results is not None else pa.table({})
    unmatched = unmatched if unmatched is not None else pa.table({})
    n = results.num_rows
    cats = Counter(_results(results))
    sides = Counter(unmatched.column("side").to_pylist()) if "side" in unmatched.column_names else Counter()
    target = summary.get("target_run") or summary.get("target")
    bench = summary.get("bench_run") or summary.get("bench")
    title = f"dumpdb compare: {target} vs {bench}" if target and bench else "dumpdb compare report"
    badges = [("", f"{n} pairs")] + [(f"b-{c}", f"{cats[c]} {c}") for c in ("pass", "noise", "warning", "error",
                                                                             "other") if cats.get(c)]
    if unmatched.num_rows:
        order = {"target": 0, "bench": 1}
        ordered = sorted(sides.items(), key=lambda kv: (order.get(kv[0], 2), str(kv[0])))
        per_side = ", ".join(f"{_text(k)} {v}" for k, v in ordered)
        badges.append(("b-warning", f"{unmatched.num_rows} unmatched" + (f" ({per_side})" if per_side else "")))
    if summary.get("mode"):
        badges.append(("", f"mode: {summary['mode']}"))
    row = _find_divergence_row(results, first_divergence)
    body = [_divergence_section(first_divergence, results, row, n, summary),
            '<h2 id="summary">Summary</h2>', _dl(summary) if summary else '<p class="muted">No summary.</p>',
            '<h2 id="plots">Metrics by execution order</h2>',
            '<p class="note">One point per pair; error and warning pairs are drawn larger on top; NaN/inf values '
            "are marked × at the top of the plot.</p>",
            _plots_section(results, summary, row),
            *(['<h2 id="precision">Error against the precision floor</h2>',
               '<p class="note">Relative Euclidean error of every pair (log scale) and the floor x margin it is '
               "judged against (dumpdb.compare.precision); pairs above the line depart.</p>",
               _precision_svg(results)] if "scaled_err" in results.column_names else []),
            _evidence_section(results),
            f'<h2 id="pairs-h">Pairs <small class="muted">({n})</small></h2>',
            '<p class="note">Click a column header to sort (again to reverse); type words to filter rows.</p>',
            _table_block("pairs", results, _ordered_columns(results, PAIR_COLUMNS_HEAD, PAIR_COLUMNS_TAIL),
                         empty="No pairs."),
            f'<h2 id="unmatched">Unmatched tensors <small class="muted">({unmatched.num_rows})</small></h2>',
            _alignment_section(unmatched),
            _table_block("unmatched-table", unmatched, _ordered_columns(unmatched, UNMATCHED_COLUMNS, ()),
                         empty="Every tensor found a partner.")]
    nav = [("divergence", "first divergence"), ("summary", "summary"), ("plots", "plots"), ("pairs-h", "pairs"),
           ("unmatched", "unmatched")]
    return _write_atomic(path, _page(title, _badges(badges), nav, "".join(body)))


# --------------------------------------------------------------------------- scan report

def _hits_svg(hits: pa.Table) -> str:
    if "check" in hits.column_names:
        checks = [str(v) for v in hits.column("check").to_pylist()]
    else:
        checks = ["hit"] * hits.num_rows
    iters = hits.column("iteration").to_pylist() if "iteration" in hits.column_names else [None] * hits.num_rows
    names = sorted(set(checks))
    keys = sorted(set(iters), key=lambda k: (k is None, str(type(k)), k if k is not None else 0))
    counts = Counter(zip(checks, iters))
    fig = Figure(figsize=(7.5, 2.8), layout="constrained")
    ax = fig.add_subplot()
    xs = np.arange(len(keys), dtype=np.float64)
    palette = matplotlib.colormaps["tab10"]
    if len(keys) <= 40:
        width = 0.8 / len(names)
        for j, check in enumerate(names):
            ax.bar(xs - 0.4 + width * (j + 0.5), [counts[(check, k)] for k in keys], width, label=check,
                   color=palette(j % 10))
        ax.set_xticks(xs, [_text(k) if k is not None else "?" for k in keys], fontsize=7,
                      rotation=90 if len(keys) > 20 else 0)
    else:
        numeric = all(isinstance(k, (int, float)) for k in keys)
        xv = np.asarray(keys, dtype=np.float64) if numeric else xs
        for j, check in enumerate(names):
            ax.plot(xv, [counts[(check, k)] for k in keys], marker="o", ms=2, lw=1, label=check, color=palette(j % 10))
    ax.set_xlabel("iteration", fontsize=7)
    ax.set_ylabel("hits", fontsize=7)
    ax.set_title("hits per iteration per check", fontsize=9, loc="left")
    ax.tick_params(labelsize=7)
    ax.grid(True, axis="y", lw=0.3, alpha=0.5)
    legend = ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, borderaxespad=0.0)
    for text in [ax.title, *legend.get_texts(), *ax.get_xticklabels()]:
        text.set_parse_math(False)  # check names / labels are data: no mathtext
    return _svg(fig, "hits", "hits per iteration per check")


def _first_hits(hits: pa.Table) -> str:
    """The first hit of every check, in the order of the rows (``scan`` returns them in execution order)."""
    if "check" not in hits.column_names or hits.num_rows == 0:
        return ""
    cols = hits.column_names
    data = {c: hits.column(c).to_pylist() for c in cols}
    first: dict[str, int] = {}
    total = Counter(str(c) for c in data["check"])
    for i, check in enumerate(data["check"]):
        first.setdefault(str(check), i)
    show = [c for c in ("iteration", "rank", "position", "op_type", "op_name", "io", "slot", "value", "detail",
                        "code_line", "code_text") if c in cols]
    head = "".join(f"<th>{_esc(c)}</th>" for c in ["check", "hits", *show])
    body = "".join("<tr>" + f"<td>{_esc(check)}</td><td>{total[check]}</td>"
                   + "".join(f"<td>{_esc(_text(data[c][i]))}</td>" for c in show) + "</tr>"
                   for check, i in sorted(first.items()))
    return (f'<h2 id="first">First hit per check</h2><table class="metrics"><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table>")


def write_scan_report(path: str | os.PathLike[str], *, run: str, summary: Mapping[str, Any], hits: pa.Table) -> Path:
    """Write the HTML report of a scan (NaN/Inf, overflow, all-zero, watch conditions) of one run."""
    summary = dict(summary or {})
    hits = hits if hits is not None else pa.table({})
    checks = Counter(str(v) for v in hits.column("check").to_pylist()) if "check" in hits.column_names else Counter()
    badges = [("b-error" if hits.num_rows else "b-pass", f"{hits.num_rows} hits")]
    badges += [("", f"{check}: {k}") for check, k in sorted(checks.items())]
    body = ['<h2 id="summary">Summary</h2>', _dl(summary) if summary else '<p class="muted">No summary.</p>',
            _first_hits(hits), '<h2 id="plots">Hits per iteration</h2>']
    body.append(f'<figure class="plot">{_hits_svg(hits)}</figure>' if hits.num_rows
                else '<p class="muted">No hits: nothing to plot.</p>')
    body += [f'<h2 id="hits-h">Hits <small class="muted">({hits.num_rows})</small></h2>',
             '<p class="note">Click a column header to sort (again to reverse); type words to filter rows.</p>',
             _table_block("hits", hits, [c for c in hits.column_names if _has_values(hits, c)], empty="No hits.")]
    nav = [("summary", "summary"), ("plots", "plot"), ("hits-h", "hits")]
    return _write_atomic(path, _page(f"dumpdb scan: {run}", _badges(badges), nav, "".join(body)))


# Building blocks the other self-contained reports share (render/ranks_report.py).
esc, badges, has_values, page = _esc, _badges, _has_values, _page
table_block, write_atomic = _table_block, _write_atomic
