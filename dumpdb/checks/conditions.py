"""The scan checks: first NaN/Inf, float16 overflow, all-zero tensors, and MindInsight's
watch conditions, one :func:`~dumpdb.checks.registry.register` call each.

Definitions and sources are in each entry's ``description`` and ``source``; the common
rules of the MindInsight conditions and how the engine evaluates them (statistics
first, payloads only where needed) are in :mod:`dumpdb.checks.scan`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from dumpdb.checks.registry import Check, ThresholdTest, fmt, register, threshold_text
from dumpdb.errors import DumpdbError

FP16_MAX = 65504.0  # msaccucmp OVERFLOW_MAX_VALUE (reference formats.md 2.2); float16 max finite
_FP16_DECLARED = "regexp_matches(lower(coalesce(dtype_declared, '')), '(^|[^b])float16')"
_MI = ("MindInsight {cls} (mindinsight/debugger/api/conditions.py, condition id {id}); evaluated as "
       "MindSpore TensorSummary::IsWatchpointHit/StatLookup (mindspore/ccsrc/debug/debugger/tensor_summary.cc); "
       "reference formats.md 5")


def _all_counts(p: Mapping[str, float]) -> str:
    return "nan_count IS NOT NULL AND pos_inf_count IS NOT NULL AND neg_inf_count IS NOT NULL"


def _fp16_eligible(p: Mapping[str, float]) -> str:
    numeric = "count > 0 AND coalesce(dtype, '') NOT IN ('bool', 'str', 'object', '')"
    return numeric if p["cast"] else f"count > 0 AND (dtype = 'float16' OR {_FP16_DECLARED})"


def _same_count(p: Mapping[str, float]) -> str:
    # between iterations: only a tensor with the same element count as its previous one
    return "finite AND count = p_count"


# -- detail texts (row: the tensor's catalog row; m: metrics; hits: tests that hit; p: parameters)
Row = Mapping[str, Any]
Metrics = Mapping[str, float]
Hits = list[tuple[ThresholdTest, float]]


def _nan_detail(row: Row, m: Metrics, hits: Hits, p: Metrics) -> str:
    return f"{row['nan_count']} NaN of {row.get('count')} elements"


def _inf_detail(row: Row, m: Metrics, hits: Hits, p: Metrics) -> str:
    return f"{row['pos_inf_count']} +Inf, {row['neg_inf_count']} -Inf of {row.get('count')} elements"


def _nan_inf_detail(row: Row, m: Metrics, hits: Hits, p: Metrics) -> str:
    return (f"{row['nan_count']} NaN, {row['pos_inf_count']} +Inf, {row['neg_inf_count']} -Inf "
            f"of {row.get('count')} elements")


def _all_zero_detail(row: Row, m: Metrics, hits: Hits, p: Metrics) -> str:
    return f"all {row.get('count')} elements are 0"


def _fp16_detail(row: Row, m: Metrics, hits: Hits, p: Metrics) -> str:
    dtype, declared = row.get("dtype"), row.get("dtype_declared")
    if dtype == "float16":
        what = "float16 tensor"
    elif p["cast"] == 0:
        what = f"declared {declared} (payload {dtype})"
    else:
        what = f"{dtype} tensor (overflows if cast to float16)"
    infs = (row.get("pos_inf_count") or 0) + (row.get("neg_inf_count") or 0)
    extra = f"; {row.get('pos_inf_count')} +Inf, {row.get('neg_inf_count')} -Inf" if infs else ""
    extra += f"; {row.get('nan_count')} NaN ignored" if row.get("nan_count") else ""
    return f"{what}: max|x| = {fmt(m['max_abs'])} >= {fmt(p['max_abs_ge'])}{extra}"


def _prev(row: Row) -> str:
    return f" vs iteration {row['p_iteration']}" if "p_iteration" in row else ""


def _unchanged_detail(row: Row, m: Metrics, hits: Hits, p: Metrics) -> str:
    how = " (identical payload)" if row.get("same_payload") else ""
    return (f"allclose{_prev(row)} (rtol={fmt(p['rtol'])}, atol={fmt(p['atol'])}): "
            f"max|x - x_prev| = {fmt(m.get('max_abs_diff'))}{how}")


def _range_detail(row: Row, m: Metrics, hits: Hits, p: Metrics) -> str:
    text = threshold_text(hits)
    if any(t.metric == "range_pct" for t, _ in hits):
        text += f" (range [{fmt(p['range_start_inclusive'])}, {fmt(p['range_end_inclusive'])}])"
    return text


def _change_detail(row: Row, m: Metrics, hits: Hits, p: Metrics) -> str:
    same = " (identical payload)" if row.get("same_payload") else ""
    return threshold_text(hits) + f"{_prev(row)} (epsilon={fmt(p['epsilon'])})" + same


def _all_zero_pct_detail(row: Row, m: Metrics, hits: Hits, p: Metrics) -> str:
    return threshold_text(hits) + f" ({row.get('zero_count')} of {row.get('count')} elements are 0)"


# -- parameter rules beyond each parameter's own range
def _needs_threshold(check: Check, out: Metrics) -> None:
    thresholds = [k for k in check.params if k not in ("range_start_inclusive", "range_end_inclusive")]
    if not any(k in out for k in thresholds):
        raise DumpdbError(f"check {check.name} needs at least one of {', '.join(thresholds)} "
                          f"(e.g. {check.name}:{thresholds[0]}=...)")


def _range_rules(check: Check, out: Metrics) -> None:
    _needs_threshold(check, out)
    if ("range_percentage_lt" in out or "range_percentage_gt" in out) and not (
            "range_start_inclusive" in out and "range_end_inclusive" in out):
        raise DumpdbError("check tensor_range: range_percentage_lt/gt need both range_start_inclusive "
                          "and range_end_inclusive")
    if out.get("range_start_inclusive", -math.inf) > out.get("range_end_inclusive", math.inf):
        raise DumpdbError("check tensor_range: range_start_inclusive is greater than range_end_inclusive")


register("nan", "tensors with NaN: nan_count > 0. value = nan_count. Statistics only.",
         "catalog nan_count; MindSpore watch condition HAS_NAN (tensor_summary.cc: nan_count > 0)",
         tests=lambda p: [ThresholdTest("nan", "nan_count", "gt", 0)], eligible=lambda p: "nan_count IS NOT NULL",
         detail=_nan_detail)
register("inf", "tensors with +-Inf: pos_inf_count + neg_inf_count > 0. value = number of +-Inf. Statistics only.",
         "catalog pos_inf_count/neg_inf_count; MindSpore watch condition HAS_INF (inf_count > 0)",
         tests=lambda p: [ThresholdTest("inf", "inf_count", "gt", 0)],
         eligible=lambda p: "pos_inf_count IS NOT NULL AND neg_inf_count IS NOT NULL", detail=_inf_detail)
register("nan_inf", "tensors with NaN or +-Inf: nan_count + pos_inf_count + neg_inf_count > 0. "
         "value = that sum. Statistics only.",
         "catalog counts; README 'First NaN/Inf of each iteration'",
         tests=lambda p: [ThresholdTest("nan_inf", "nan_inf_count", "gt", 0)], eligible=_all_counts,
         detail=_nan_inf_detail)
register("fp16_overflow",
         "max|x| >= max_abs_ge (NaN ignored; +-Inf counts as overflow, value inf). cast=0: only tensors that "
         "are float16 (catalog dtype float16, or dtype_declared float16 with another payload dtype); "
         "cast=1: every numeric tensor (would overflow if cast to float16). value = max|x|. Statistics "
         "(max(|min|, |max|)); reads only tensors holding NaN and no Inf, whose catalog min/max are NaN.",
         "msaccucmp OVERFLOW_MAX_VALUE 65504 (reference formats.md 2.2); MindInsight DumpAnalyzer."
         "summary_statistics overflow_value=65500 (formats.md 5): pass max_abs_ge=65500 for it",
         {"max_abs_ge": FP16_MAX, "cast": 0.0}, needs_tensors=True,
         tests=lambda p: [ThresholdTest("max_abs_ge", "max_abs", "ge", p["max_abs_ge"])], eligible=_fp16_eligible,
         detail=_fp16_detail)
register("all_zero", "non-empty tensors whose elements are all 0: count > 0 and zero_count = count "
         "(-0.0 is 0, NaN is not, bool False is 0). value = count. Statistics only.",
         "catalog zero_count; README 'All-zero tensors'",
         tests=lambda p: [ThresholdTest("all_zero", "zero_pct", "ge", 100)],
         eligible=lambda p: "count > 0 AND zero_count IS NOT NULL", value_metric="count",
         detail=_all_zero_detail)
register("tensor_too_large",
         "hit if abs_mean > abs_mean_gt or max > max_gt or min > min_gt or mean > mean_gt (given ones; at "
         "least one). abs_mean = mean(|x|): exact from statistics when min >= 0 (= mean) or max <= 0 "
         "(= -mean), else read. Tensors with NaN/Inf are not evaluated.",
         _MI.format(cls="TensorTooLargeCondition", id=15),
         {"abs_mean_gt": None, "max_gt": None, "min_gt": None, "mean_gt": None}, needs_tensors=True,
         validate=_needs_threshold)
register("tensor_too_small",
         "hit if abs_mean < abs_mean_lt or max < max_lt or min < min_lt or mean < mean_lt (given ones; at "
         "least one). abs_mean as in tensor_too_large. Tensors with NaN/Inf are not evaluated.",
         _MI.format(cls="TensorTooSmallCondition", id=16),
         {"abs_mean_lt": None, "max_lt": None, "min_lt": None, "mean_lt": None}, needs_tensors=True,
         validate=_needs_threshold)
register("tensor_range",
         "range_percentage = 100 * #(range_start_inclusive <= x <= range_end_inclusive) / count; hit if "
         "range_percentage < range_percentage_lt or > range_percentage_gt, or max-min < max_min_lt or "
         "> max_min_gt (given ones; at least one of these four; a percentage needs both range ends). "
         "The percentage is exact from statistics when the range covers [min, max] (100) or misses it (0), "
         "else read. Tensors with NaN/Inf are not evaluated.",
         _MI.format(cls="TensorRangeCondition", id=21),
         {"range_start_inclusive": None, "range_end_inclusive": None, "range_percentage_lt": None,
        "range_percentage_gt": None, "max_min_lt": None, "max_min_gt": None}, needs_tensors=True,
         validate=_range_rules, detail=_range_detail)
register("tensor_all_zero",
         "zero_percentage = 100 * zero_count / count >= zero_percentage_ge (default 100, MindInsight's UI "
         "default). value = zero_percentage. Statistics only; tensors with NaN/Inf are not evaluated.",
         _MI.format(cls="TensorAllZeroCondition", id=17)
         + "; default from mindinsight/debugger/conditionmgr/condition_list.py",
         {"zero_percentage_ge": 100.0}, detail=_all_zero_pct_detail)
register("tensor_overflow", "tensors with NaN or +-Inf (nan_count + inf_count > 0, MindSpore GENERAL_OVERFLOW). "
         "value = that count. Statistics only.",
         _MI.format(cls="TensorOverflowCondition", id=13),
         tests=lambda p: [ThresholdTest("tensor_overflow", "nan_inf_count", "gt", 0)], eligible=_all_counts,
         detail=_nan_inf_detail)
register("tensor_unchanged",
         "|x - x_prev| <= atol + rtol * |x_prev| for every element (allclose; NaN compares false), x_prev = "
         "the same tensor (rank, device, graph, scope/op name, io, slot) in the previous dumped iteration, "
         "same element count. value = max|x - x_prev|. Identical payloads (content_hash) hit without "
         "reading; statistics rule out changed ones (|d max|, |d min|, |d mean| > atol + rtol*max|x_prev|) "
         "without reading; the rest are read. Tensors with NaN/Inf are not evaluated.",
         _MI.format(cls="TensorUnchangedCondition", id=20),
         {"rtol": 1e-5, "atol": 1e-8}, needs_tensors=True,
         tests=lambda p: [ThresholdTest("allclose", "allclose", "ge", 1)], eligible=_same_count,
         value_metric="max_abs_diff", between_iterations=True, detail=_unchanged_detail)
register("tensor_change_above_threshold",
         "abs_mean_update_ratio = mean|x - x_prev| / (mean|x_prev| + epsilon) > abs_mean_update_ratio_gt "
         "(default 0.1, MindInsight's UI default), x_prev as in tensor_unchanged (for a Parameter: the "
         "weight update). epsilon in the denominator as MindSpore's StatLookup computes it (the "
         "docstring writes '+ epsilon' after the fraction). value = the ratio. Identical payloads give 0 "
         "without reading; statistics bound the ratio; the rest are read.",
         _MI.format(cls="TensorChangeAboveThresholdCondition", id=18)
         + "; default from mindinsight/debugger/conditionmgr/condition_list.py",
         {"abs_mean_update_ratio_gt": 0.1, "epsilon": 1e-9}, needs_tensors=True,
         eligible=_same_count, between_iterations=True, detail=_change_detail)
register("tensor_change_below_threshold",
         "abs_mean_update_ratio (as in tensor_change_above_threshold) < abs_mean_update_ratio_lt (default "
         "1e-4, MindInsight's UI default). value = the ratio.",
         _MI.format(cls="TensorChangeBelowThresholdCondition", id=19)
         + "; default from mindinsight/debugger/conditionmgr/condition_list.py",
         {"abs_mean_update_ratio_lt": 1e-4, "epsilon": 1e-9}, needs_tensors=True,
         eligible=_same_count, between_iterations=True, detail=_change_detail)
