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

from dumpdb.compare.verdict import ALL_IGNORE, INPUT_IGNORE, Thresholds

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
    out: list[list] = []
    for key, rec in target:
        items = record_items(key, rec)
        rows = []
        for i, t in enumerate(items):
            b = bench_items.get(tkeys[key] + t["name"][len(key):])
            if b is not None and not _dtypes_match(t, b):
                b = None  # msprobe blanks the bench side (gen_dtype_condition)
            rows.append(_row(mode, t, b, stacks.get(key) if i == 0 else None, metrics or {}, compute))
        _judge(mode, rows)
        out.extend(r["cells"] for r in rows)
    return out


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
    try:
        return float(str(v).strip("%")) / 100
    except ValueError:
        return 0.0


def _extreme(rows: list[dict], key: str, smallest: bool) -> float:
    value = 1.0 if smallest else 0.0
    for r in rows:
        v = r.get(key)
        if v is None or v in (NAN, N_A):
            continue
        if isinstance(v, str) and v.endswith("%"):
            v = _pct(v)
        if isinstance(v, str):
            continue
        value = min(value, v) if smallest else max(value, v)
    return value


def _inf_or_nan(v: Any) -> bool:
    if isinstance(v, float):
        return math.isnan(v) or math.isinf(v)
    return isinstance(v, str) and v.strip().lower() in ("inf", "-inf", "nan")


def _judge(mode: str, rows: list[dict], th: Thresholds = Thresholds()) -> None:
    """Result and Err_message of one record's rows, as msprobe's checkers set them: the
    rules of :mod:`dumpdb.compare.verdict` (its thresholds and ignore lists, the one home
    of msprobe's rules) over the CSV's cells (msprobe's strings: ``N/A``, ``Nan``,
    percentages), with msprobe's message texts; plus what only the CSV has, msprobe's
    ``ParametersErrChecker`` (non-tensor arguments) and the md5 mode."""
    if not rows:
        return
    inputs = [r for r in rows if ".output." not in r["npu_name"]]
    outputs = [r for r in rows if ".output." in r["npu_name"]]
    levels = {"pass": 0, "warning": 1, "error": 2}

    def flag(r, level, msg):
        if levels[level] > levels[r["result"]]:
            r["result"] = level
        r["msgs"].append(msg)

    name_split = inputs[0]["npu_name"].split(".") if inputs else []
    api = name_split[1] if len(name_split) >= 2 else None
    ignore = "all" if api in ALL_IGNORE else "input" if api in INPUT_IGNORE else None
    per_row = [] if ignore == "all" else outputs if ignore == "input" else inputs + outputs
    whole = ignore is None

    def inf_nan():
        for r in per_row:
            if _inf_or_nan(r["bench_sum"][0]) or _inf_or_nan(r["bench_sum"][1]):
                continue
            if _inf_or_nan(r["npu_sum"][0]) or _inf_or_nan(r["npu_sum"][1]):
                flag(r, "error", "error: There is nan/inf/-inf in the maximum or minimum value of NPU.")

    def requires_grad():
        for r in per_row:
            if r["bench_name"] in ("", N_A) or not r["npu_rg"] or not r["bench_rg"]:
                continue
            if r["npu_rg"] != r["bench_rg"]:
                flag(r, "error", "error: The Required_Grad of NPU and Bench are inconsistent")

    def parameters():
        if not whole:
            return
        for r in inputs:
            if r["bench_name"] in ("", N_A) or "class" not in r["npu_dtype"] or "class" not in r["bench_dtype"]:
                continue
            if str(r["npu_shape"]) != "[]":
                continue
            if r["npu_sum"][0] != r["bench_sum"][0]:
                flag(r, "error", "error: The scalar parameters of NPU and Bench are inconsistent.")

    def dtype():
        for r in per_row:
            if r["bench_name"] in ("", N_A) or r["npu_name"] == N_A:
                continue
            if "qkv" in r["bench_name"] or "gate_up" in r["bench_name"]:
                continue
            if r["npu_dtype"] and r["bench_dtype"] and r["npu_dtype"] != r["bench_dtype"]:
                flag(r, "error", "error: The dtype of NPU and Bench are inconsistent.")

    def shape():
        for r in per_row:
            if r["bench_name"] in ("", N_A):
                continue
            if r["npu_shape"] != r["bench_shape"]:
                flag(r, "error", "error: The shape of NPU and Bench are inconsistent.")

    if mode == "md5":
        for r in per_row:
            tm, bm = r["md5"]
            if tm != bm:
                if tm in (N_A, NAN, "") or bm in (N_A, NAN, ""):
                    flag(r, "warning", "warning: The parameter of NPU does not match the bench.")
                else:
                    flag(r, "error", "error: The CRC-32 value of NPU differs from that of the bench.")
    elif mode == "statistics":
        inf_nan()
        if whole:
            if abs(_extreme(inputs, "norm_rel", smallest=False)) < th.rel_err_input:
                for r in outputs:
                    if abs(_pct(r["norm_rel"])) > th.rel_err_output:
                        flag(r, "error", "error: The NormRelativeErr of output is greater than 0.5.")
        requires_grad()
        parameters()
        dtype()
        shape()
        if whole and outputs:
            max_in = abs(_extreme(inputs, "norm_rel", smallest=False))
            max_out = abs(_extreme(outputs, "norm_rel", smallest=False))
            if (max_out > th.rel_warn_zero_input) if max_in == 0 else (max_out / max_in > th.rel_warn_ratio):
                flag(outputs[0], "warning", "warning: The norm relative error of output is 10 times that of input.")
    else:
        inf_nan()
        if whole and outputs:
            if _extreme(inputs, "one_k", True) > th.one_thousandth_input and \
                    _extreme(outputs, "one_k", True) < th.one_thousandth_output:
                flag(outputs[0], "error",
                     "error: The input/parameters of One Thousandth Err Ratio > 0.9 while the output < 0.6.")
        requires_grad()
        parameters()
        dtype()
        shape()
        if whole and outputs:
            cin, cout = _extreme(inputs, "cosine", True), _extreme(outputs, "cosine", True)
            if cin > th.cosine_warn_input and cin - cout > th.cosine_warn_drop:
                flag(outputs[0], "warning",
                     "warning: The input/parameters of Cosine > 0.9, and input/parameters - output > 0.1")
    for r in rows:  # msprobe's checkers reset every row's message, "No bench data matched." included
        r["cells"] += [r["result"], json.dumps(r["msgs"]), r["stack"]]
        if mode == "tensor":
            r["cells"].append(r["data_name"])
