"""dumpdb.render.report: self-contained HTML for compare and scan results.

The tables here are built by hand in the shapes the engine stores (migrations/003_compare.sql
plus the context columns the caller joins in); nothing here needs an archive.
"""

from __future__ import annotations

import html
import json
import math
import os
import re
import shutil
import subprocess
from datetime import datetime
from html.parser import HTMLParser
from pathlib import Path
from xml.etree import ElementTree

import numpy as np
import pyarrow as pa
import pytest

from dumpdb.render import report
from dumpdb.render.report import METRICS, write_compare_report, write_scan_report

TENSOR_METRICS = ("cosine", "euc_dist", "max_abs_err", "max_rel_err", "one_thousandth_err_ratio",
                  "five_thousandths_err_ratio", "mean_abs_err", "rmse", "rel_euc_dist", "accumulated_rel_err",
                  "mean_rel_err", "kl_divergence")
# the module's report leaves a few secondary metrics out (missing columns; and fewer plots: faster test)
FIXTURE_METRICS = ("cosine", "max_abs_err", "max_rel_err", "rel_euc_dist", "one_thousandth_err_ratio",
                   "mean_abs_err", "kl_divergence")
STATS_DIFFS = ("max_diff", "min_diff", "mean_diff", "l2norm_diff", "max_rel_diff", "min_rel_diff",
               "mean_rel_diff", "l2norm_rel_diff")
NASTY = """Mul<"x"&'y'>-op7 </script><b>"""  # op name with every character that must be escaped
OP_TYPES = ("Conv2D", "BiasAdd", "ReLU", "MatMul", "Mul", "Softmax")


def make_results(n_pairs: int = 300, iterations: int = 2, *, mode: str = "tensor", diverge: int = 40,
                 seed: int = 0) -> pa.Table:
    """Pairs of a LeNet-like run: 3 rows per op (input.0, input.1, output.0), ``iterations`` iterations.

    From op ``diverge`` of the last iteration on, errors grow (warnings then errors); a few
    metrics are NaN (all-zero tensors) or NULL (int tensors: tensor metrics do not apply).
    """
    rng = np.random.default_rng(seed)
    per_iter = n_pairs // iterations
    cols: dict[str, list] = {c: [] for c in (
        "pair_index", "target_tensor_id", "bench_tensor_id", "target_name", "bench_name", "io", "slot",
        "match_strategy", "mode", "result", "err_message", "iteration", "rank", "op_type", "position",
        "target_dtype", "bench_dtype", "target_shape", "bench_shape", "code_file", "code_line", "code_text")}
    metrics: dict[str, list] = {m: [] for m in TENSOR_METRICS + STATS_DIFFS}
    for k in range(n_pairs):
        it = min(k // per_iter, iterations - 1)
        j = k - it * per_iter
        op, slot_i = divmod(j, 3)
        io, slot = ("input", slot_i) if slot_i < 2 else ("output", 0)
        op_type = OP_TYPES[op % len(OP_TYPES)]
        name = NASTY if op == 7 else f"Default/network-WithLossCell/_backbone-LeNet5/layer{op}-{op_type}/{op_type}-op{op}"
        bad = it == iterations - 1 and op >= diverge
        result = "pass"
        err = None
        vals: dict[str, float | None] = {}
        if mode == "tensor":
            scale = 10 ** rng.uniform(-7, -4)
            if bad:
                scale = 10 ** rng.uniform(-2, 1)
            vals = {"cosine": max(-1.0, 1 - scale * rng.uniform(0.1, 1)), "euc_dist": scale * 30, "max_abs_err": scale * 5,
                    "max_rel_err": scale * 50, "one_thousandth_err_ratio": 1.0 if not bad else rng.uniform(0, 0.9),
                    "five_thousandths_err_ratio": 1.0 if not bad else rng.uniform(0.2, 1), "mean_abs_err": scale,
                    "rmse": scale * 1.3, "rel_euc_dist": scale * 2, "accumulated_rel_err": scale * 40,
                    "mean_rel_err": scale * 3, "kl_divergence": scale * 0.1}
            if bad:
                result = "error" if vals["cosine"] < 0.99 else "warning"
            if op % 23 == 5:  # all-zero tensors: cosine undefined
                vals["cosine"] = math.nan
                vals["kl_divergence"] = math.inf
                result, err = "warning", "both tensors are all zero: cosine is NaN"
            if op % 31 == 9 and io == "input":  # integer tensors: no float metrics
                vals = {m: None for m in vals}
                vals["max_abs_err"] = 0.0
                result, err = "pass", "int32: only exact comparison"
        else:
            base = rng.normal(0, 1e-3) * (1000 if bad else 1)
            vals = {"max_diff": base, "min_diff": -abs(base) / 2, "mean_diff": base / 10, "l2norm_diff": abs(base) * 3,
                    "max_rel_diff": abs(base) * 4, "min_rel_diff": None if op % 4 == 0 else abs(base),
                    "mean_rel_diff": abs(base) / 3, "l2norm_rel_diff": abs(base) * 2}
            if bad:
                result = "error"
        for m in metrics:
            metrics[m].append(vals.get(m))
        cols["pair_index"].append(k)
        cols["target_tensor_id"].append(1000 + k)
        cols["bench_tensor_id"].append(5000 + k)
        cols["target_name"].append(name)
        cols["bench_name"].append(name if op % 10 else name.replace("Default/", "Default_bench/"))
        cols["io"].append(io)
        cols["slot"].append(slot)
        cols["match_strategy"].append("exact" if op % 10 else "normalized")
        cols["mode"].append(mode)
        cols["result"].append(result)
        cols["err_message"].append(err)
        cols["iteration"].append(it)
        cols["rank"].append(0)
        cols["op_type"].append(op_type)
        cols["position"].append(op)
        cols["target_dtype"].append("float16")
        cols["bench_dtype"].append("float32")
        cols["target_shape"].append([32, 6 + op % 3, 28, 28])
        cols["bench_shape"].append([32, 6 + op % 3, 28, 28])
        cols["code_file"].append("lenet.py")
        cols["code_line"].append(40 + op % 12)
        cols["code_text"].append(f"x = self.{op_type.lower()}(x)  # op {op} & <co>")
    types = {"pair_index": pa.int64(), "target_tensor_id": pa.int64(), "bench_tensor_id": pa.int64(),
             "slot": pa.int32(), "iteration": pa.int64(), "rank": pa.int64(), "position": pa.int64(),
             "code_line": pa.int64(), "target_shape": pa.list_(pa.int64()), "bench_shape": pa.list_(pa.int64())}
    arrays = {c: pa.array(v, types.get(c, pa.string())) for c, v in cols.items()}
    arrays.update({m: pa.array(v, pa.float64()) for m, v in metrics.items()})
    return pa.table(arrays)


def make_unmatched() -> pa.Table:
    return pa.table({
        "side": ["target", "target", "bench"],
        "tensor_id": [77, 78, 9001],
        "name": ["Default/Extra-op99", 'Cast<&"odd">-op3', "Default/OnlyBench-op5"],
        "io": ["output", "input", "output"],
        "slot": pa.array([0, 1, 0], pa.int32()),
        "op_type": ["Extra", "Cast", "OnlyBench"],
    })


SUMMARY = {
    "compare_id": 3, "target_run": "fp16-amp", "bench_run": "fp32-baseline",
    "target_selection": "iteration in (0, 1) rank=0", "bench_selection": None, "mode": "tensor",
    "pairs": 300, "pass": 250, "warning": 20, "error": 30, "unmatched_target": 2, "unmatched_bench": 1,
    "thresholds": {"cosine": {"error": 0.9, "warning": 0.99}, "max_abs_err_error": 1.0},
    "options": '{"strategies": ["exact", "normalized"], "mapping": null}',
    "created_at": datetime(2026, 1, 2, 3, 4, 5), "dumpdb_version": "0.1.0",
}


def first_divergence(results: pa.Table) -> dict:
    res = results.column("result").to_pylist()
    i = next(k for k, r in enumerate(res) if r == "error")
    row = {c: results.column(c)[i].as_py() for c in results.column_names}
    names = results.column("target_name").to_pylist()
    start = results.column("position").to_pylist()[i]
    path = list(dict.fromkeys(names[k] for k in range(i - start * 3, i)))
    return {"name": row["target_name"], "scope": "Default/network-WithLossCell/_backbone-LeNet5",
            "io": row["io"], "slot": row["slot"], "iteration": row["iteration"], "rank": 0,
            "result": "error", "metrics": {m: row[m] for m in ("cosine", "max_abs_err", "max_diff") if m in row},
            "code_file": row["code_file"], "code_line": row["code_line"], "code_text": row["code_text"],
            "path": path}


class TagBalance(HTMLParser):
    """Checks that every non-void element is closed in order; collects attributes and text."""

    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.attrs: list[tuple[str, str, str | None]] = []
        self.counts: dict[str, int] = {}
        self.scripts: dict[str | None, str] = {}
        self._script: tuple[str | None, list[str]] | None = None
        self.datatables: list[dict] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.counts[tag] = self.counts.get(tag, 0) + 1
        self.attrs += [(tag, k, v) for k, v in attrs]
        a = dict(attrs)
        if tag == "div" and "datatable" in (a.get("class") or ""):
            self.datatables.append(a)
        if tag == "script":
            self._script = (a.get("id"), [])
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.counts[tag] = self.counts.get(tag, 0) + 1
        self.attrs += [(tag, k, v) for k, v in attrs]

    def handle_endtag(self, tag):
        if tag in self.VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1] if self.stack else None}>")
            return
        self.stack.pop()
        if tag == "script" and self._script:
            self.scripts[self._script[0]] = "".join(self._script[1])
            self._script = None

    def handle_data(self, data):
        if self._script is not None:
            self._script[1].append(data)
        else:
            self.text.append(data)


def parse(path: Path) -> tuple[str, TagBalance]:
    text = path.read_text(encoding="utf-8")
    p = TagBalance()
    p.feed(text)
    p.close()
    assert p.errors == [], p.errors[:5]
    assert p.stack == [], p.stack
    return text, p


def table_rows(p: TagBalance, element_id: str) -> tuple[list[str], list[dict]]:
    """Decode one datatable's JSON (string dictionary, NaN/inf as strings) into dict rows."""
    data = json.loads(p.scripts[element_id + "-data"])
    names = [c["name"] for c in data["columns"]]
    rows = []
    for r in data["rows"]:
        row = {}
        for c, x in zip(data["columns"], r):
            if x is not None and c["kind"] == "s":
                x = data["strings"][x]
            elif isinstance(x, str):
                x = float(x)
            row[c["name"]] = x
        rows.append(row)
    return names, rows


def expected_svgs(results: pa.Table) -> int:
    """One plot per (iteration, metric with any value in that iteration)."""
    n = 0
    for it in sorted(set(results.column("iteration").to_pylist())):
        sub = results.filter(pa.compute.equal(results.column("iteration"), it))
        n += sum(1 for m in METRICS if m in sub.column_names and sub.column(m).null_count < sub.num_rows)
    return n


def assert_self_contained(text: str, p: TagBalance) -> None:
    assert text.startswith("<!DOCTYPE html>")
    assert p.counts.get("html") == 1 and p.counts.get("body") == 1
    low = text.lower()
    assert "<script src" not in low and "<link" not in low and "@import" not in low
    for tag, attr, value in p.attrs:
        if attr in ("src", "href", "xlink:href", "action", "poster", "data"):
            assert value is not None and (value.startswith("#") or value.startswith("data:")), (tag, attr, value)
    # the only URLs left are the SVG namespace names, which are identifiers, never fetched
    urls = set(re.findall(r"https?://[^\s\"'<>)]+", text))
    assert urls <= {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}, urls
    assert "url(http" not in low


@pytest.fixture(scope="module")
def compare_report(tmp_path_factory):
    results = make_results()
    results = results.drop_columns([m for m in TENSOR_METRICS if m not in FIXTURE_METRICS])
    fd = first_divergence(results)
    path = tmp_path_factory.mktemp("report") / "compare.html"
    out = write_compare_report(path, summary=SUMMARY, results=results, unmatched=make_unmatched(),
                               first_divergence=fd)
    return out, results, fd


def test_compare_report_is_one_self_contained_document(compare_report):
    path, results, _ = compare_report
    assert isinstance(path, Path) and path.is_file()
    text, p = parse(path)
    assert_self_contained(text, p)
    assert [f for f in os.listdir(path.parent) if f != path.name] == []  # no temp file left


def test_compare_report_plots_one_svg_per_metric_and_iteration(compare_report):
    path, results, _ = compare_report
    text, p = parse(path)
    n = expected_svgs(results)
    assert n == 2 * len(FIXTURE_METRICS)
    assert text.count("<svg") == n
    assert set(re.findall(r'data-metric="([^"]+)"', text)) == set(FIXTURE_METRICS)
    # the four main metrics are shown, the others are in a collapsed <details>
    assert text.count("<details><summary>3 more metric(s)</summary>") == 2
    # rasterised points live in PNG data URIs; ids are unique across the inline SVGs
    assert "data:image/png;base64," in text
    ids = re.findall(r'\sid="([^"]+)"', text)
    assert len(ids) == len(set(ids))
    for ref in re.findall(r'(?:href="#|url\(#)([^")]+)', text):
        assert ref in ids or ref in ("pairs",), ref
    # each inline SVG is well-formed XML whose references resolve inside it
    for svg in re.findall(r"<svg .*?</svg>", text, re.S):
        root = ElementTree.fromstring(svg)
        assert root.tag == "{http://www.w3.org/2000/svg}svg" and root.get("viewBox")
        own = {e.get("id") for e in root.iter() if e.get("id")}
        assert set(re.findall(r'(?:href="#|url\(#)([^")]+)', svg)) <= own
        for e in root.iter("{http://www.w3.org/2000/svg}path"):
            assert re.fullmatch(r"[MLCQZz0-9.\- ]*", e.get("d", "")), e.get("d")


def test_compare_report_first_divergence_summary_and_escaping(compare_report):
    path, results, fd = compare_report
    text, p = parse(path)
    top = text[: text.index('id="summary"')]
    assert "First divergence: " + html.escape(fd["name"]) in top
    assert html.escape(fd["code_text"]) in top and "lenet.py:" in top
    for op in fd["path"]:
        assert html.escape(op) in top
    # the nasty op name appears only escaped: in the path of the divergence and never raw
    assert NASTY in fd["path"]
    assert NASTY not in text and 'Cast<&"odd">' not in text
    assert html.escape(NASTY, quote=True) in top
    assert text.count("</script>") == text.count("<script")
    # summary as a definition list, nested thresholds and JSON options rendered
    body = " ".join(p.text)
    for needle in ("fp16-amp", "fp32-baseline", "iteration in (0, 1) rank=0", "2026-01-02 03:04:05", "strategies",
                   "max abs err error", "compare id"):
        assert needle in body, needle
    assert "fp16-amp vs fp32-baseline" in p.text[[t.strip() for t in p.text].index("dumpdb compare: fp16-amp vs fp32-baseline")]


def test_compare_report_tables_hold_every_pair_and_unmatched(compare_report):
    path, results, _ = compare_report
    text, p = parse(path)
    assert [d["id"] for d in p.datatables] == ["pairs", "unmatched-table"]
    names, rows = table_rows(p, "pairs")
    assert len(rows) == results.num_rows == 300
    assert names[:9] == ["pair_index", "iteration", "position", "op_type", "target_name", "bench_name", "io",
                         "slot", "result"]
    assert set(FIXTURE_METRICS) <= set(names) and not set(STATS_DIFFS) & set(names)  # all-NULL columns dropped
    # columns with one value in every row are stated once above the table
    for name in ("rank", "mode", "target_dtype", "bench_dtype", "code_file"):
        assert name not in names
    assert "Same in every row: rank <b>0</b> · target_dtype <b>float16</b>" in text
    assert [r["pair_index"] for r in rows] == list(range(300))
    assert [r["target_name"] for r in rows] == results.column("target_name").to_pylist()
    assert [r["result"] for r in rows] == results.column("result").to_pylist()
    assert rows[0]["target_shape"] == "[32, 6, 28, 28]"
    cos = results.column("cosine").to_pylist()
    for r, c in zip(rows, cos):
        if c is None:
            assert r["cosine"] is None
        elif math.isnan(c):
            assert math.isnan(r["cosine"])
        else:
            assert r["cosine"] == pytest.approx(c, rel=2e-7, abs=1e-7)  # 7 significant digits
    assert any(r["kl_divergence"] == math.inf for r in rows)
    _, unmatched = table_rows(p, "unmatched-table")
    assert [u["name"] for u in unmatched] == make_unmatched().column("name").to_pylist()
    assert [u["side"] for u in unmatched] == ["target", "target", "bench"]


def test_engine_shaped_inputs(tmp_path):
    """first divergence as engine.first_divergence_of gives it (target_name, metric columns as keys,
    NULLs), summary with target/bench selections and verdict.Thresholds as a dict."""
    results = make_results(150, 1, diverge=30)
    results = results.drop_columns([m for m in TENSOR_METRICS if m not in ("cosine", "max_abs_err", "rmse")])
    res = results.column("result").to_pylist()
    i = next(k for k, r in enumerate(res) if r == "error")
    row = {c: results.column(c)[i].as_py() for c in results.column_names}
    fd = {k: row.get(k) for k in ("pair_index", "target_name", "bench_name", "op_type", "io", "slot", "iteration",
                                  "rank", "position", "result", "err_message", "code_file", "code_line", "code_text")}
    fd.update({m: row.get(m) for m in TENSOR_METRICS + STATS_DIFFS}, scope_name=None,
              path=results.column("target_name").to_pylist()[i - 9:i:3])
    summary = {"target": "run=fp16-amp iteration=0", "bench": "run=fp32-baseline", "pairs": 150, "mode": "tensor",
               "strategies": {"exact": 135, "normalized": 15, "order": 0},
               "thresholds": {"cosine_warn_drop": 0.1, "cosine_error": 0.99, "cosine_error_max": 0.9,
                              "max_abs_err_error_max": 1.0, "rel_err_input": 0.1},
               "compare_id": None}
    out = write_compare_report(tmp_path / "engine.html", summary=summary, results=results,
                               unmatched=make_unmatched(), first_divergence=fd)
    text, p = parse(out)
    assert "<title>dumpdb compare: run=fp16-amp iteration=0 vs run=fp32-baseline</title>" in text
    top = text[: text.index('id="summary"')]
    assert "First divergence: " + html.escape(fd["target_name"]) in top
    assert "<th>cosine</th><td>" + html.escape(f"{fd['cosine']:.6g}") in top  # metric keys -> metrics table
    assert "max_diff" not in top and "scope" not in top  # NULL fields are left out
    # absolute thresholds become lines on their metric's plot; relative rules do not
    cosine_svg = re.search(r'data-metric="cosine"><svg.*?</svg>', text, re.S).group(0)
    assert ">cosine_error 0.99<" in cosine_svg and ">cosine_error_max 0.9<" in cosine_svg
    assert "cosine_warn_drop" not in cosine_svg
    assert ">max_abs_err_error_max 1<" in re.search(r'data-metric="max_abs_err"><svg.*?</svg>', text, re.S).group(0)
    svgs = re.findall(r"<svg .*?</svg>", text, re.S)
    assert sum(">first divergence<" in svg for svg in svgs) == len(svgs) == 3  # the vertical line's legend


def test_statistics_mode_plots_diffs_only(tmp_path):
    results = make_results(120, 1, mode="statistics", diverge=20)
    results = results.drop_columns([m for m in TENSOR_METRICS if m != "cosine"])  # cosine: present, all NULL
    summary = dict(SUMMARY, mode="statistics")
    out = write_compare_report(tmp_path / "stats.html", summary=summary, results=results,
                               unmatched=make_unmatched().slice(0, 0), first_divergence=first_divergence(results))
    text, p = parse(out)
    assert_self_contained(text, p)
    assert text.count("<svg") == len(STATS_DIFFS)
    assert set(re.findall(r'data-metric="([^"]+)"', text)) == set(STATS_DIFFS)
    assert "symlog" in text  # signed diffs spanning decades
    names, rows = table_rows(p, "pairs")
    assert len(rows) == 120 and "cosine" not in names and "max_diff" in names
    assert "Every tensor found a partner." in text


def test_minimal_and_empty_inputs(tmp_path):
    # only a few columns, no iteration / position, no divergence
    results = pa.table({"target_name": ["a", "b&c", "d"], "result": ["pass", "pass", None],
                        "cosine": [0.9999, 1.0, None], "max_abs_err": pa.array([None, None, None], pa.float64())})
    out = write_compare_report(tmp_path / "sub" / "min.html", summary={}, results=results,
                               unmatched=pa.table({"name": pa.array([], pa.string())}), first_divergence=None)
    text, p = parse(out)
    assert_self_contained(text, p)
    assert "No divergence found" in text
    assert text.count("<svg") == 1  # cosine only: max_abs_err is all NULL
    assert len(table_rows(p, "pairs")[1]) == 3
    # nothing at all
    empty = pa.table({"pair_index": pa.array([], pa.int64()), "cosine": pa.array([], pa.float64())})
    out = write_compare_report(tmp_path / "empty.html", summary={"mode": "tensor"}, results=empty,
                               unmatched=pa.table({}), first_divergence=None)
    text, p = parse(out)
    assert "<svg" not in text and "No pairs." in text and "nothing to plot" in text
    # a second write replaces the file atomically
    out2 = write_compare_report(str(out), summary={}, results=results, unmatched=pa.table({}), first_divergence=None)
    assert out2 == out and "b&amp;c" not in out.read_text() and sorted(os.listdir(tmp_path)) == ["empty.html", "sub"]


def test_many_iterations_are_capped_but_every_pair_is_listed(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "MAX_PLOT_GROUPS", 3)  # 8 in use; 3 here keeps the test fast
    results = make_results(600, 12, diverge=5)
    results = results.drop_columns([m for m in TENSOR_METRICS if m not in ("cosine", "max_abs_err")])
    out = write_compare_report(tmp_path / "many.html", summary={}, results=results, unmatched=pa.table({}),
                               first_divergence=first_divergence(results))
    text, p = parse(out)
    assert text.count("<svg") == 3 * 2
    assert "12 iterations; plotted 3 (limit 3). Not plotted: 2, 3, 4, 5, 6, 7, 8, 9, 10." in text
    assert re.findall(r"<h3>Iteration (\d+)", text) == ["0", "1", "11"]  # the divergent (last) one is plotted
    assert len(table_rows(p, "pairs")[1]) == 600


def test_ten_thousand_pairs_stay_small(tmp_path):
    results = make_results(10_000, 2, diverge=1200)
    out = write_compare_report(tmp_path / "big.html", summary=SUMMARY, results=results, unmatched=make_unmatched(),
                               first_divergence=first_divergence(results))
    size = out.stat().st_size
    assert size < 3 * 1024 * 1024, size
    text = out.read_text(encoding="utf-8")
    assert text.count("<svg") == 2 * len(TENSOR_METRICS)
    data = re.search(r'<script type="application/json" id="pairs-data">(.*?)</script>', text).group(1)
    assert len(json.loads(data)["rows"]) == 10_000


def make_hits() -> pa.Table:
    rows = []
    for it in range(4):
        for pos in range(10 + it * 5):
            check = ("nan_inf", "fp16_overflow", "all_zero")[pos % 3]
            rows.append({"check": check, "iteration": it, "rank": 0, "position": 100 + pos, "op_type": "Add",
                         "op_name": NASTY if pos == 4 else f"Default/Add-op{pos}", "io": "output", "slot": 0,
                         "value": math.nan if check == "nan_inf" else 65504.0 * pos, "detail": "3 NaN of 1024",
                         "code_line": 12, "code_text": "x = x + y"})
    return pa.Table.from_pylist(rows)


def test_scan_report(tmp_path):
    hits = make_hits()
    out = write_scan_report(tmp_path / "scan.html", run="fp16 <amp>", summary={"run": "fp16 <amp>", "checks": 3,
                                                                             "hits": hits.num_rows}, hits=hits)
    text, p = parse(out)
    assert_self_contained(text, p)
    assert "dumpdb scan: fp16 &lt;amp&gt;" in text and NASTY not in text
    assert text.count("<svg") == 1 and "hits per iteration per check" in text
    names, rows = table_rows(p, "hits")
    constant = ["rank", "op_type", "io", "slot", "detail", "code_line", "code_text"]
    assert names == [c for c in hits.column_names if c not in constant] and len(rows) == hits.num_rows
    assert "Same in every row: rank <b>0</b> · op_type <b>Add</b>" in text
    assert [r["op_name"] for r in rows] == hits.column("op_name").to_pylist()
    # first hit per check, in the rows' (execution) order
    first = text[text.index('id="first"'): text.index('id="plots"')]
    assert "<td>nan_inf</td><td>25</td><td>0</td><td>0</td><td>100</td><td>Add</td><td>Default/Add-op0</td>" in first
    assert "<td>all_zero</td><td>22</td><td>0</td><td>0</td><td>102</td>" in first
    empty = write_scan_report(tmp_path / "none.html", run="r", summary={}, hits=hits.slice(0, 0))
    text, p = parse(empty)
    assert "<svg" not in text and "No hits" in text


# ----------------------------------------------------------------------------------- the page's JS

DOM_SHIM = r"""
class Node {
  constructor(tag) { this.tagName = tag; this.children = []; this.className = ""; this.textContent = "";
    this.listeners = {}; this.style = {}; this.attributes = {}; this.value = tag === "select" ? "all results" : ""; }
  appendChild(c) { this.children.push(c); return c; }
  get firstChild() { return this.children[0] || null; }
  removeChild(c) { this.children.splice(this.children.indexOf(c), 1); return c; }
  addEventListener(t, f) { (this.listeners[t] = this.listeners[t] || []).push(f); }
  dispatchEvent(e) { (this.listeners[e.type] || []).forEach(f => f(e)); }
  getAttribute(k) { return k in this.attributes ? this.attributes[k] : null; }
  find(tag) { if (this.tagName === tag) return this; for (const c of this.children) { const r = c.find(tag); if (r) return r; } return null; }
}
class Event { constructor(type) { this.type = type; } }
const byId = {};
const document = {
  createElement(tag) { return new Node(tag); },
  getElementById(id) { return byId[id] || (Object.values(byId).flatMap(n => n.all || []).find(n => n.id === id)) || null; },
  querySelectorAll(sel) { return sel === "div.datatable" ? TABLES : []; },
};
let clock = [];
function setTimeout(f) { clock.push(f); return clock.length; }
function clearTimeout() {}
"""


def test_table_script_sorts_filters_and_draws_every_row(compare_report, tmp_path):
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (apt-get install nodejs; .ci/run installs it): runs the report's table script")
    path, results, _ = compare_report
    text, p = parse(path)
    main_js = p.scripts[None]
    setup = ["const TABLES = [];"]
    for d in p.datatables:
        setup.append(f"byId[{json.dumps(d['data-src'])}] = {{textContent: {json.dumps(p.scripts[d['data-src']])}}};")
        setup.append(f"{{const n = new Node('div'); n.id = {json.dumps(d['id'])}; n.attributes['data-src'] = "
                     f"{json.dumps(d['data-src'])}; TABLES.push(n); byId[n.id] = n;}}")
    checks = r"""
const box = TABLES[0], bar = box.children[0], input = bar.children[0], table = box.children[1].children[0];
const tbody = table.children[1], ths = table.children[0].children[0].children;
byId[box.id + "-filter"] = input;
const col = name => ths.findIndex(th => th.title.startsWith(name + " "));
const cells = i => tbody.children.map(tr => tr.children[i].textContent);
const out = {rows: tbody.children.length, info: bar.children[2].textContent};
ths[col("rel_euc_dist")].dispatchEvent(new Event("click"));
ths[col("rel_euc_dist")].dispatchEvent(new Event("click"));  // descending
out.desc = cells(col("rel_euc_dist")).slice(0, 3);
out.last = cells(col("rel_euc_dist")).slice(-1);
ths[col("cosine")].dispatchEvent(new Event("click"));  // ascending: numbers, NaN, then NULL
out.cos = cells(col("cosine"));
input.value = "op7 input"; input.dispatchEvent(new Event("input")); clock.forEach(f => f());
out.filtered = tbody.children.length;
out.filtered_names = [...new Set(cells(col("target_name")))];
input.value = ""; bar.children[1].value = "error"; bar.children[1].dispatchEvent(new Event("change"));
out.errors = tbody.children.length;
out.result_classes = [...new Set(tbody.children.map(tr => tr.children[col("result")].className))];
out.unmatched = TABLES[1].children[1].children[0].children[1].children.length;
console.log(JSON.stringify(out));
"""
    script = tmp_path / "run.js"
    script.write_text(DOM_SHIM + "\n".join(setup) + "\n" + main_js + "\n" + checks)
    proc = subprocess.run([node, str(script)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["rows"] == 300 and out["info"] == "300 of 300 rows"
    rel = [v for v in results.column("rel_euc_dist").to_pylist() if v is not None]
    assert float(out["desc"][0]) == pytest.approx(max(rel), rel=1e-3)
    assert out["last"] == [""]  # NULLs sort last in both directions
    cos = results.column("cosine").to_pylist()
    n_null, n_nan = cos.count(None), sum(1 for c in cos if c is not None and math.isnan(c))
    assert n_null and n_nan
    assert out["cos"][-n_null:] == [""] * n_null and out["cos"][-n_null - n_nan:-n_null] == ["NaN"] * n_nan
    finite = [float(c) for c in out["cos"][: -n_null - n_nan]]
    assert finite == sorted(finite) and finite[0] == pytest.approx(min(c for c in cos if c == c and c is not None))
    assert out["filtered"] == 2 * 2 and out["filtered_names"] == [NASTY]  # 2 inputs x 2 iterations
    assert out["errors"] == results.column("result").to_pylist().count("error")
    assert out["result_classes"] == ["r-error"]
    assert out["unmatched"] == 3


def test_renders_in_headless_chromium(compare_report, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:  # CI installs Debian's chromium (.ci/run)
        pytest.skip("chromium is not installed (apt-get install chromium)")
    path, _, _ = compare_report
    shot = tmp_path / "r.png"
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                    "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}",
                    "--window-size=1400,2000", path.as_uri()], capture_output=True, timeout=60, check=True)
    assert shot.stat().st_size > 10_000
