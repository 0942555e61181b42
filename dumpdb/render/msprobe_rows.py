"""msprobe ``compare`` result rows rebuilt from the archive, cell for cell.

A port of what mindstudio-probe 26.2.0 writes into ``compare_result_*.csv`` for two
msprobe dumps whose records match by name (msprobe ``core/compare/acc_compare.py``
``ParseData.gen_data_df`` / ``CreateTable.make_result_df`` / ``CalcStatsDiff``,
``core/compare/utils.py`` ``read_op`` / ``op_item_parse`` / ``gen_op_item`` /
``reorder_index``, ``core/compare/indicator_analysis`` checkers; msprobe is Mulan PSL v2).
Checked against real msprobe CSVs in ``tests/data/msprobe_oracle``.

Rows come from the ``msprobe_records`` table (each dump.json record as dumped, in dump
order), so non-tensor arguments (``<class 'int'>`` rows), ``None`` gradients and
msprobe's row order are reproduced; tensor-mode metrics come from dumpdb's own compare
results (``compare_results``), matched by msprobe's tensor name.

Modes (msprobe ``dump_mode``): ``tensor`` (task tensor: six metrics + ``Data_name``),
``statistics`` (eight statistics diff columns) and ``md5`` (``NPU MD5``/``BENCH MD5``).
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from dumpdb.compare.columns import Shapes
from dumpdb.compare.verdict import Columns, Thresholds, msprobe_results

N_A, NAN, INF, NEG_INF, UNSUPPORTED, NONE_STR = "N/A", "Nan", "inf", "-inf", "unsupported", "None"
SHAPE_UNMATCHED = "shape unmatched"

HEAD = ["NPU Name", "Bench Name", "NPU Dtype", "Bench Dtype", "NPU Tensor Shape", "Bench Tensor Shape",
        "NPU Requires_grad", "Bench Requires_grad"]
TENSOR_METRICS = ["Cosine", "EucDist", "MaxAbsErr", "MaxRelativeErr", "One Thousandth Err Ratio",
                  "Five Thousandths Err Ratio"]
STATS_METRICS = ["Max diff", "Min diff", "Mean diff", "L2norm diff", "MaxRelativeErr", "MinRelativeErr",
                 "MeanRelativeErr", "NormRelativeErr"]
SUMMARY = ["NPU max", "NPU min", "NPU mean", "NPU l2norm", "Bench max", "Bench min", "Bench mean", "Bench l2norm"]
TAIL = ["Requires_grad Consistent", "Result", "Err_message", "NPU_Stack_Info"]

# dump.json record sections in msprobe's CompareConst.IO_NAME_MAPPING order
_SECTIONS = (("input_args", ".input", "input"), ("input_kwargs", ".input", "input"),
             ("input", ".input", "input"), ("output", ".output", "output"),
             ("parameters", ".parameters", "parameters"))
_STATS = ("Max", "Min", "Mean", "Norm")
_RESULT_COLUMN = {"tensor": ("cosine", "euc_dist", "max_abs_err", "max_rel_err", "one_thousandth_err_ratio",
                             "five_thousandths_err_ratio")}


def header(mode: str) -> list[str]:
    """msprobe's CSV header for ``mode`` ('tensor' | 'statistics' | 'md5')."""
    if mode == "md5":
        return [*HEAD, "NPU MD5", "BENCH MD5", *TAIL]
    metrics = TENSOR_METRICS if mode == "tensor" else STATS_METRICS
    return [*HEAD, *metrics, *SUMMARY, *TAIL, *(["Data_name"] if mode == "tensor" else [])]


# -- dump.json record -> leaf items (msprobe read_op / op_item_parse / gen_op_item) ----------
def _default_item(name: str, state: str) -> dict:
    return {"name": name, "dtype": None, "shape": None, "Max": None, "Min": None, "Mean": None, "Norm": None,
            "md5": None, "data_name": "-1", "state": state, "requires_grad": None, "none": True}


def _leaf_item(leaf: dict, name: str, state: str) -> dict:
    item = {k: str(v) if isinstance(v, bool) else v for k, v in leaf.items()}
    data_name = leaf.get("data_name") or "-1"
    item["data_name"] = data_name
    item["name"] = data_name.rsplit(".", 1)[0] if data_name != "-1" else name
    item["state"] = state
    item.setdefault("requires_grad", None)
    for k in _STATS:
        item.setdefault(k, None)
    if not item.get("dtype"):
        kind, value = leaf.get("type"), leaf.get("value")
        if kind == "torch.Size":
            item["dtype"], item["shape"] = kind, str(value)
        elif kind == "slice":
            item["dtype"], item["shape"] = kind, str(np.shape(np.array(value)))
        elif kind == "ellipsis":
            item["dtype"], item["shape"] = kind, "[]"
            item.update({k: value for k in _STATS})
        elif name.split(".")[-1] in ("src", "dst", "group_src", "group_dst"):
            item["dtype"], item["shape"] = kind, "[]"
            item.update({k: str(value) for k in _STATS})
            item["md5"] = str(value)
        elif kind == "torch.ProcessGroup":
            item["dtype"], item["shape"] = kind, "[]"
            item.update({k: str(leaf.get("group_ranks")) for k in _STATS})
            item["md5"] = str(leaf.get("group_ranks"))
        else:
            item["dtype"], item["shape"] = str(type(value)), "[]"
            item.update({k: value for k in _STATS})
    if not item.get("md5"):
        item["md5"] = f"{zlib.crc32(str(leaf.get('value', '')).encode()):08x}"
    return item


def _parse(data: Any, name: str, state: str, depth: int = 0) -> list[dict]:
    if depth > 50:
        raise ValueError(f"{name}: dump.json record nested deeper than 50 levels")
    if data is None:
        return [_default_item(name, state)]
    if not data:
        return []
    items: list[dict] = []
    if isinstance(data, list):
        grad = "parameters_grad" in name.split(".")
        for i, sub in enumerate(data):
            items.extend(_parse(sub, name if grad else f"{name}.{i}", state, depth + 1))
    elif isinstance(data, dict):
        if data.get("class_type") == "torch.distributed.P2POp":
            tensor = data.get("tensor")
            return [_leaf_item(tensor, name, state) if isinstance(tensor, dict) else _default_item(name, state)]
        if isinstance(data.get("type"), str):
            return [_leaf_item(data, name, state)]
        for key, sub in data.items():
            items.extend(_parse(sub, f"{name}.{key}", state, depth + 1))
    return items


def record_items(op_name: str, record: dict) -> list[dict]:
    """The leaf items of one dump.json record in msprobe's row order: inputs (args, kwargs),
    parameters, outputs, parameter gradients (``reorder_index``)."""
    parts = op_name.split(".")
    if parts[-1] == "parameters_grad" or (len(parts) >= 2 and parts[-2] == "parameters_grad"):
        items = _parse(record, op_name, "parameters_grad")
    else:
        items = []
        for section, suffix, state in _SECTIONS:
            if section in record:
                items.extend(_parse(record[section], op_name + suffix, state))
    order = {"input": 0, "parameters": 1, "output": 2, "parameters_grad": 3}
    return sorted(items, key=lambda it: order.get(it["state"], 0))  # stable: dump order within a state


# -- cells ---------------------------------------------------------------------------------
def _stat_cell(v: Any) -> Any:
    """A statistic as msprobe writes it: None -> 'None', NaN -> 'Nan' (``set_summary``),
    +-inf -> ' inf' / ' -inf' (its CSV writer's replacement, for Excel)."""
    if v is None:
        return NONE_STR
    return _nonfinite(v) or v


def _nonfinite(v: Any) -> str | None:
    """msprobe's text for a NaN or infinite float ('Nan', ' inf', ' -inf'), else None."""
    if isinstance(v, float) and not math.isfinite(v):
        return NAN if math.isnan(v) else (" inf" if v > 0 else " -inf")
    return None


def _classify(v: Any) -> str:
    s = str(v).strip()  # ' inf' is how a written cell spells a float inf
    low = s.lower()
    if v is None or (isinstance(v, float) and math.isnan(v)) or low == "nan":
        return "nan"
    if low == "inf" or v == math.inf:
        return "inf"
    if low == "-inf" or v == -math.inf:
        return "-inf"
    if low not in ("true", "false"):
        try:
            float(s)
            return "num"
        except ValueError:
            pass
    if any(d in low for d in ("npu", "cpu", "cuda")):
        return "device"
    if s == N_A:
        return "na"
    return "other"


def _stat_diff(npu: Any, bench: Any) -> tuple[str, str]:
    """msprobe CalcStatsDiff.calc_summary_diff for one statistic: (diff, relative error)."""
    if str(npu) == str(bench):
        return "0", "0"
    a, b = _classify(npu), _classify(bench)
    if a == "na" or b == "na":
        return N_A, N_A
    if a == "num" and b == "num":
        n, m = float(str(npu)), float(str(bench))
        diff = n - m
        rel = INF if m == 0 else f"{abs(diff / m * 100)!s}%"
        return str(diff), rel
    if "nan" in (a, b) and {a, b} <= {"num", "nan", "inf", "-inf"}:
        return NAN, NAN
    if a == "inf" and b in ("num", "-inf"):
        return INF, INF
    if a == "-inf" and b in ("num", "inf"):
        return NEG_INF, NEG_INF
    if a == "num" and b == "inf":
        return NEG_INF, NEG_INF
    if a == "num" and b == "-inf":
        return INF, INF
    if a == "device" and b == "device":
        return N_A, N_A
    if a in ("device", "other") or b in ("device", "other"):
        return "Diff", "Diff"
    return N_A, N_A


def _format_metric(name: str, v: Any) -> Any:
    """msprobe's rounding: ``float('{:.12f}'.format(v))`` (not EucDist); cosine > 0.9999 to 6 decimals."""
    if v is None:
        return UNSUPPORTED
    if _nonfinite(v) is not None:
        return _nonfinite(v)
    if name == "euc_dist":  # msprobe writes the Euclidean distance unrounded
        return float(v)
    v = float(f"{v:.12f}")
    if name == "cosine" and v > 0.9999:
        v = round(v, 6)
    return v


def _str_or_na(v: Any) -> Any:
    return N_A if v is None else v


def _compare_keys(records: list[tuple[str, Any]]) -> dict[str, str]:
    """msprobe's compare key of each record key: a backward record's call index replaced by
    its backward call order, the count of earlier backward records of the same name without
    the index (``Tensor.__add__.5.backward`` -> ``Tensor.__add__.3.backward`` when it is the
    fourth backward ``Tensor.__add__``); other keys unchanged. msprobe 26.2
    ``ParseData.split_data_name_components`` / ``gen_data_df`` (backward call order) and
    ``ProcessDf.update_backward_call`` (without ``--fuzzy_match``, its default)."""
    count: dict[str, int] = {}
    out = {}
    for key, _ in records:
        parts = key.split(".")
        if len(parts) >= 3 and "backward" in parts[-2:] and "parameters_grad" not in parts[-2:]:
            base = ".".join(parts[:-2])
            order = count.get(base, 0)
            count[base] = order + 1
            head, tail = parts[-2], parts[-1]
            out[key] = ".".join((base, str(order) if head.isdigit() else head, str(order) if tail.isdigit() else tail))
        else:
            out[key] = key
    return out


MetricsFn = Callable[[str, str], "dict | None"]


def build_rows(mode: str, target: list[tuple[str, Any]], bench: list[tuple[str, Any]],
               stacks: dict[str, list[str]], metrics: dict[str, tuple[str, dict]] | None = None,
               compute: MetricsFn | None = None) -> list[list]:
    """msprobe's CSV rows (cells as msprobe writes them, before CSV quoting).

    ``target`` / ``bench``: ``(record key, record)`` of each side's dump.json in dump order;
    ``stacks``: record key -> call-stack lines (stack.json); ``metrics``: tensor mode only,
    target msprobe tensor name -> (bench tensor name, dumpdb compare result row: ``cosine``,
    ``euc_dist``, ...); ``compute(target name, bench name)``: the metrics of a pair msprobe
    matches that dumpdb paired otherwise (its alignment re-aligned it), None if unreadable.
    Rows match by msprobe's compare key (:func:`_compare_keys`). A target row without a
    bench row gets ``N/A`` cells (tensor metrics: ``unsupported``, as msprobe's
    ``error_value_process`` writes for data with no bench) and tensors of other shapes
    ``shape unmatched``.
    """
    bkeys, tkeys = _compare_keys(bench), _compare_keys(target)
    bench_items: dict[str, dict] = {}
    for key, rec in bench:
        for it in record_items(key, rec):
            bench_items.setdefault(bkeys[key] + it["name"][len(key):], it)
    rows: list[dict] = []
    groups: list[int] = []
    for record, (key, rec) in enumerate(target):
        items = record_items(key, rec)
        for i, t in enumerate(items):
            b = bench_items.get(tkeys[key] + t["name"][len(key):])
            if b is not None and not _dtypes_match(t, b):
                b = None  # msprobe blanks the bench side (gen_dtype_condition)
            rows.append(_row(mode, t, b, stacks.get(key) if i == 0 else None, metrics or {}, compute))
            groups.append(record)
    _judge(mode, rows, groups)
    return [r["cells"] for r in rows]


_FLOATS = ({"float16", "float32", "float64", "bfloat16"},
           {"torch.float16", "torch.float32", "torch.float64", "torch.bfloat16"})


def _dtypes_match(t: dict, b: dict) -> bool:
    """msprobe ``Match.gen_dtype_condition``: equal dtypes, or both floating point."""
    x, y = str(t.get("dtype")), str(b.get("dtype"))
    return x == y or any(x in group and y in group for group in _FLOATS)


def _row(mode: str, t: dict, b: dict | None, stack, metrics: dict, compute: MetricsFn | None = None) -> dict:
    none = t.get("none", False)

    def dtype_shape(it):
        if it is None or it.get("none"):
            return N_A, N_A
        shape = it.get("shape")
        return str(it.get("dtype")), str(shape) if not isinstance(shape, str) else shape

    td, ts = dtype_shape(t)
    bd, bs = dtype_shape(b)
    trg = _str_or_na(t.get("requires_grad"))
    brg = _str_or_na(b.get("requires_grad")) if b is not None else N_A
    cells: list[Any] = [t["name"], b["name"] if b is not None else N_A, td, bd, ts, bs, trg, brg]
    tsum = [_stat_cell(t.get(k)) for k in _STATS]
    bsum = [_stat_cell(b.get(k)) for k in _STATS] if b is not None else [N_A] * 4
    row: dict[str, Any] = {"npu_name": t["name"], "bench_name": cells[1], "npu_dtype": td, "bench_dtype": bd,
                           "npu_shape": ts, "bench_shape": bs, "npu_rg": trg, "bench_rg": brg,
                           "npu_sum": tsum, "bench_sum": bsum, "result": "pass", "msgs": []}
    if mode == "md5":
        tm = N_A if none else t.get("md5")
        bm = (N_A if b.get("none") else b.get("md5")) if b is not None else N_A
        cells += [tm, bm]
        row["md5"] = (tm, bm)
    elif mode == "statistics":
        diffs = [_stat_diff(x, y) if b is not None else (N_A, N_A) for x, y in zip(tsum, bsum)]
        cells += [d for d, _ in diffs] + [r for _, r in diffs] + tsum + bsum
        row["norm_rel"] = diffs[3][1]
    else:
        if b is None or none or b.get("none") or "class" in td:
            values: list[Any] = [UNSUPPORTED] * 6  # msprobe: no bench data, no real data, a non-tensor
        elif ts != bs:
            values = [SHAPE_UNMATCHED] * 6
        else:
            found = metrics.get(t["name"])
            m = found[1] if found is not None and found[0] == b["name"] else None
            if m is None and compute is not None:
                m = compute(t["name"], b["name"])
            values = [UNSUPPORTED] * 6 if m is None else [_format_metric(c, m.get(c)) for c in _RESULT_COLUMN["tensor"]]
        cells += values + tsum + bsum
        row["cosine"], row["one_k"] = values[0], values[4]
    cells += [trg == brg]
    row["cells"] = cells
    row["stack"] = N_A if stack is None else str(stack)
    row["data_name"] = str([t.get("data_name", "-1"), b.get("data_name", "-1") if b is not None else N_A])
    row["has_bench"] = b is not None
    return row


# -- verdicts (msprobe indicator_analysis, per API / module) -----------------------------------
def _pct(v: Any) -> float:
    """A relative-error cell as a fraction, as msprobe reads it (``'12.5%'`` -> 0.125,
    ``'inf'`` -> inf, ``'Nan'`` -> NaN; other text 0)."""
    try:
        return float(str(v).strip("%")) / 100
    except ValueError:
        return 0.0


def _extreme_value(v: Any) -> float:
    """A metric cell as msprobe's min/max over a record reads it: numbers and percentages
    count, NaN, ``N/A`` and other text do not (NaN here)."""
    if isinstance(v, str):
        return _pct(v) if v.endswith("%") else math.nan
    if v is None or isinstance(v, bool):
        return math.nan
    return float(v)


def _inf_or_nan(v: Any) -> bool:
    if isinstance(v, float):
        return math.isnan(v) or math.isinf(v)
    return isinstance(v, str) and v.strip().lower() in ("inf", "-inf", "nan")


def _judge(mode: str, rows: list[dict], groups: list[int], th: Thresholds = Thresholds()) -> None:
    """Result and Err_message of every row (``groups``: the record of each row), by the
    rules of :mod:`dumpdb.compare.verdict` (:func:`~dumpdb.compare.verdict.msprobe_results`,
    the one home of msprobe's checkers, its thresholds, ignore lists and message texts).
    Here the CSV's cells (msprobe's strings: ``N/A``, ``Nan``, percentages) become the
    values msprobe's checkers read from them."""
    n = len(rows)
    if not n:
        return

    def objects(values) -> np.ndarray:
        out = np.empty(n, dtype=object)
        out[:] = list(values)
        return out

    has_bench = np.array([r["bench_name"] not in ("", N_A) for r in rows], bool)
    values: dict[str, np.ndarray] = {}
    valid: dict[str, np.ndarray] = {}
    for key, cell in (("cosine", "cosine"), ("one_thousandth_err_ratio", "one_k"), ("l2norm_rel_diff", "norm_rel")):
        values[key] = np.array([_extreme_value(r.get(cell)) for r in rows], np.float64)
        valid[key] = ~np.isnan(values[key])
    values["max_abs_err"], valid["max_abs_err"] = np.full(n, math.nan), np.zeros(n, bool)
    for side, cells in (("target", "npu_sum"), ("bench", "bench_sum")):  # only "is it nan/inf" matters
        for key, k in (("max", 0), ("min", 1)):
            values[f"{side}_{key}"] = np.array([math.inf if _inf_or_nan(r[cells][k]) else 0.0 for r in rows])
            valid[f"{side}_{key}"] = np.ones(n, bool)
    # requires_grad cells compared as written ('True', 'False', 'N/A'), where both are given
    codes: dict = {}
    rg_known = has_bench & np.array([bool(r["npu_rg"]) and bool(r["bench_rg"]) for r in rows], bool)
    for side, cell in (("target", "npu_rg"), ("bench", "bench_rg")):
        values[f"{side}_requires_grad"] = np.array([codes.setdefault(r[cell], len(codes)) for r in rows], np.float64)
        valid[f"{side}_requires_grad"] = rg_known
    # shapes compared as written: each distinct text one code
    shape_codes: dict = {}
    tshape = [[shape_codes.setdefault(str(r["npu_shape"]), len(shape_codes))] for r in rows]
    bshape = [[shape_codes.setdefault(str(r["bench_shape"]), len(shape_codes))] if b else None
              for r, b in zip(rows, has_bench.tolist())]
    columns = Columns(
        group=np.array(groups, np.int64), output=np.array([".output." in r["npu_name"] for r in rows], bool),
        statistics=np.full(n, mode == "statistics"), target_name=objects(r["npu_name"] for r in rows),
        bench_name=objects(r["bench_name"] for r in rows), target_dtype=objects(r["npu_dtype"] for r in rows),
        bench_dtype=objects(r["bench_dtype"] if b and r["npu_name"] != N_A else None
                            for r, b in zip(rows, has_bench.tolist())),
        err_message=np.full(n, None, dtype=object), values=values, valid=valid,
        target_shape=Shapes(pa.array(tshape, pa.list_(pa.int64()))),
        bench_shape=Shapes(pa.array(bshape, pa.list_(pa.int64()))),
        # msprobe's RelativeErrChecker reads each output's cell as a number (inf counts), its
        # min/max over a record only the percentages
        rel_row=np.array([_pct(r.get("norm_rel")) for r in rows], np.float64),
        parameter=has_bench & np.array([
            "class" in r["npu_dtype"] and "class" in r["bench_dtype"] and str(r["npu_shape"]) == "[]" for r in rows],
            bool),
        parameter_differs=np.array([r["npu_sum"][0] != r["bench_sum"][0] for r in rows], bool))
    if mode == "md5":
        columns.md5_target = objects(r["md5"][0] for r in rows)
        columns.md5_bench = objects(r["md5"][1] for r in rows)
    result, msgs = msprobe_results(columns, th)
    for r, level, texts in zip(rows, result, msgs):  # every row's message reset, "No bench data matched." too
        r["cells"] += [level, json.dumps(texts), r["stack"]]
        if mode == "tensor":
            r["cells"].append(r["data_name"])
