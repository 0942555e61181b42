"""msprobe's checkers over the cells of its compare CSV, record by record, written directly
on the cells as msprobe 26.2 reads them (``indicator_analysis``): the independent oracle of
``test_msprobe_verdict.py``, which checks that :mod:`dumpdb.render.msprobe_rows`, calling
the one implementation of the rules in :mod:`dumpdb.compare.verdict`, writes the same
Result and Err_message cells. (dumpdb's own CSV writer had this code before issue 26.)
"""

from __future__ import annotations

import json
import math
from typing import Any

from dumpdb.compare.verdict import ALL_IGNORE, INPUT_IGNORE, Thresholds

N_A, NAN = "N/A", "Nan"


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


def judge(mode: str, rows: list[dict], th: Thresholds = Thresholds()) -> None:
    """Result and Err_message of one record's rows, as msprobe's checkers set them, over
    the CSV's cells (msprobe's strings: ``N/A``, ``Nan``, percentages)."""
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
