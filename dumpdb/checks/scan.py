"""Scans of one run: first NaN/Inf, float16 overflow, all-zero tensors, MindInsight watch conditions.

::

    from dumpdb.checks.scan import scan, CHECKS, parse_check_spec
    hits = scan(archive, "nan", ["inf", "nan"])                  # first hit per check/iteration/rank
    hits = scan(archive, "c1", ["tensor_too_large:abs_mean_gt=100,max_gt=1e4"], first_only=False)
    hits = scan(archive, "c1", ["tensor_unchanged"], params={"tensor_unchanged": {"rtol": 1e-3}})

The result is a ``pyarrow.Table`` with one row per hit (:data:`RESULT_SCHEMA`): ``check,
iteration, rank, graph_id, position, timestamp, op_type, op_name, scope_name, io, slot,
tensor_id, value, detail, code_file, code_line, code_text``. ``position`` is the op's
line in ``execution_order`` (NULL for tensors not in it, e.g. Parameters); ``code_*``
come from ``ops`` (the IR) joined on rank, device_id, graph_id and scope_name; ``value``
is the number that triggered (a count, ``max|x|``, a ratio ...), ``detail`` says what and
against which threshold.

Order. Rows are sorted by iteration, rank, the graph's first dump timestamp in that
iteration (so graphs run in one iteration keep their order), graph_id, execution
position, timestamp, io (inputs before outputs; other io kinds after), slot, tensor_id,
then the order the checks were given; NULLs last everywhere. Tensors whose op is not in
the execution order (Parameters, layouts without one) therefore come after the ordered
ops of their iteration, by timestamp. With ``first_only=True`` (default) only the first
row of each (check, iteration, rank) in that order is kept.

Statistics first. Every check is answered from the catalog statistics (``min``, ``max``,
``mean``, ``l2norm``, ``count``, ``nan_count``, ``pos_inf_count``, ``neg_inf_count``,
``zero_count``, ``content_hash``) with one SQL query. Only quantities the catalog does
not hold are computed from payloads: ``abs_mean`` = mean(|x|) of a tensor with both
signs, the in-range percentage when the range splits the tensor, ``max|x|`` ignoring NaN
of a tensor that holds NaN but no Inf (its catalog min/max are NaN), and element-wise
differences between iterations when the payload changed. Before reading, the statistics bound each
such quantity (e.g. ``|mean| <= abs_mean <= min(max|x|, l2norm/sqrt(count))``, a
range covering ``[min, max]`` holds 100 %, identical ``content_hash`` means no change) and
tensors that the bounds prove cannot hit are never read; with ``first_only`` nothing
after a group's first certain hit is read. Payloads are streamed through
``Archive.tensors`` in batches of :data:`READ_BATCH` tensors, one array (two for the
between-iteration checks) in memory at a time, reduced in float64 chunks of
:data:`CHUNK` elements. ``Check.needs_tensors`` says which checks may read payloads.
Tensors without a payload (statistics-only dumps) cannot be read: when the statistics
prove a hit, it is reported with the proving bound as ``value`` (``detail`` says so);
when they cannot decide, the tensor is not reported.

Between iterations (``tensor_unchanged``, ``tensor_change_*``): a tensor is compared with
the same tensor (rank, device_id, graph_id, scope name or else op name, io, slot, and for
msprobe slot_path/direction/arg_name) in the previous *dumped* iteration of the run (the
last dumped one if it was dumped several times there); ``detail`` names that iteration.
MindInsight compares with the previous step and reports an error when it was not dumped;
with iterations 0, 2, 3 dumped, dumpdb compares 2 with 0 and 3 with 2.

Checks (names, parameters and defaults in :data:`CHECKS`, the registry of
:mod:`dumpdb.checks.registry`; one entry each in :mod:`dumpdb.checks.conditions`, with its
exact definition in ``description``). The MindInsight watch conditions follow
``mindinsight/debugger/api/conditions.py`` (names, parameters) and MindSpore's evaluator
``mindspore/ccsrc/debug/debugger/tensor_summary.cc`` (``TensorSummary::IsWatchpointHit``,
``StatLookup``) with ``debug_services.h`` (``parameter_t::Evaluate``); reference
formats.md section 5. Their common rules, as in that evaluator:

* a parameter that is not given is disabled; a tensor hits when **any** enabled
  parameter hits (``gt``: value > threshold, ``lt``: <, ``ge``: >=); a NaN value never hits;
* a tensor holding NaN or +-Inf is not evaluated by the value conditions (MindSpore sets
  error bits 1/2 and reports no hit); ``tensor_overflow`` / ``nan`` / ``inf`` report those;
* values are widened to float64; bool counts as 0/1.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from dumpdb.catalog.locations import LocationIndex
from dumpdb.checks.conditions import FP16_MAX
from dumpdb.checks.registry import CHECKS, Check
from dumpdb.checks.registry import ThresholdTest as _Test
from dumpdb.cluster import StoreSpec, dask_client, gathered, partition, store_spec, workers_for
from dumpdb.errors import DumpdbError


class ArchiveReads(Protocol):
    """What a scan reads of an archive: :class:`dumpdb.archive.Archive` (the facade sits above
    ``checks/`` in the import layers, pyproject.toml ``[tool.importlinter]``, so it is not imported)."""

    path: Any

    @property
    def locations(self) -> LocationIndex: ...

    def sql(self, query: str, params: Any = None) -> pa.Table: ...

    def tensors(self, query: str, params: Any = None) -> Iterator[tuple[dict[str, Any], np.ndarray | None]]: ...

    def reader(self) -> AbstractContextManager[Any]: ...

    def require_run(self, run: str) -> None: ...

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: Any) -> None: ...

__all__ = ["CHECKS", "DEFAULT_CHECKS", "FP16_MAX", "RESULT_SCHEMA", "Check", "parse_check_spec", "scan"]

READ_BATCH = 32  # tensors per Archive.tensors() call
REMOTE_READ_BATCH = 512  # tensors per window on a dask cluster (tasks per pack; the answer does not depend on it)
CHUNK = 1 << 20  # elements per float64 pass over a payload
_SLACK = 1e-9  # relative widening of statistics-derived bounds (float64 rounding)

RESULT_SCHEMA = pa.schema([
    ("check", pa.string()),
    ("iteration", pa.int64()),
    ("rank", pa.int32()),
    ("graph_id", pa.int32()),
    ("position", pa.int32()),
    ("timestamp", pa.int64()),
    ("op_type", pa.string()),
    ("op_name", pa.string()),
    ("scope_name", pa.string()),
    ("io", pa.string()),
    ("slot", pa.int32()),
    ("tensor_id", pa.int64()),
    ("value", pa.float64()),
    ("detail", pa.string()),
    ("code_file", pa.string()),
    ("code_line", pa.int32()),
    ("code_text", pa.string()),
])

DEFAULT_CHECKS: tuple[str, ...] = ("nan", "inf", "fp16_overflow", "all_zero")

# Parameter validity: "real" any finite number; "nonneg" >= 0; "pos" > 0; "pct" in [0, 100]; "flag" 0 or 1.
_PARAM_KINDS: dict[str, str] = {
    "max_abs_ge": "pos", "cast": "flag",
    "abs_mean_gt": "nonneg", "abs_mean_lt": "nonneg", "max_gt": "real", "max_lt": "real", "min_gt": "real",
    "min_lt": "real", "mean_gt": "real", "mean_lt": "real",
    "range_start_inclusive": "real", "range_end_inclusive": "real", "range_percentage_lt": "pct",
    "range_percentage_gt": "pct", "max_min_lt": "pos", "max_min_gt": "pos",
    "zero_percentage_ge": "pct", "rtol": "nonneg", "atol": "nonneg", "epsilon": "nonneg",
    "abs_mean_update_ratio_gt": "nonneg", "abs_mean_update_ratio_lt": "nonneg",
}
_KIND_TEXT = {"nonneg": ">= 0", "pos": "> 0", "pct": "a percentage in [0, 100]", "flag": "0 or 1"}


# --------------------------------------------------------------------------- parameters
def _known() -> str:
    return ", ".join(CHECKS)


def _lookup(name: str) -> Check:
    check = CHECKS.get(name)
    if check is None:
        raise DumpdbError(f"unknown check {name!r} (known checks: {_known()})")
    return check


def _number(check: str, key: str, value: Any) -> float:
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("true", "yes", "on"):
            return 1.0
        if text in ("false", "no", "off"):
            return 0.0
        try:
            return float(text)
        except ValueError:
            raise DumpdbError(f"check {check}: parameter {key}={value!r} is not a number") from None
    if isinstance(value, (bool, int, float, np.integer, np.floating)):
        return float(value)
    raise DumpdbError(f"check {check}: parameter {key}={value!r} is not a number")


def parse_check_spec(spec: str) -> tuple[str, dict[str, float]]:
    """``"tensor_too_large:abs_mean_gt=100,max_gt=1e4"`` -> ``("tensor_too_large", {"abs_mean_gt": 100.0, ...})``.

    Returns only the parameters given (defaults are applied by :func:`scan`). ``true``/``false``
    are accepted for 0/1 flags. Raises :class:`DumpdbError` for an unknown check, an unknown
    parameter, a missing ``=`` or a value that is not a number.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise DumpdbError(f"empty check specification {spec!r} (expected NAME or NAME:PARAM=VALUE,...)")
    name, _, rest = spec.strip().partition(":")
    name = name.strip()
    check = _lookup(name)
    params: dict[str, float] = {}
    for item in (p.strip() for p in rest.split(",")):
        if not item:
            continue
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key or not value.strip():
            raise DumpdbError(f"check {name}: bad parameter {item!r} in {spec!r} (expected PARAM=VALUE)")
        if key not in check.params:
            raise DumpdbError(f"check {name} has no parameter {key!r} (parameters: "
                              f"{', '.join(check.params) or 'none'})")
        if key in params:
            raise DumpdbError(f"check {name}: parameter {key} given twice in {spec!r}")
        params[key] = _number(name, key, value)
    return name, params


def _resolve_params(name: str, given: Mapping[str, Any]) -> dict[str, float]:
    """Defaults + given, validated; disabled parameters (None) are left out."""
    check = _lookup(name)
    out: dict[str, float] = {}
    for key, value in given.items():
        if key not in check.params:
            raise DumpdbError(f"check {name} has no parameter {key!r} (parameters: "
                              f"{', '.join(check.params) or 'none'})")
        if value is None:
            continue
        v = _number(name, key, value)
        kind = _PARAM_KINDS.get(key, "real")
        ok = (math.isfinite(v) and (kind == "real" or (kind == "nonneg" and v >= 0) or (kind == "pos" and v > 0)
                                    or (kind == "pct" and 0 <= v <= 100) or (kind == "flag" and v in (0, 1))))
        if not ok:
            want = _KIND_TEXT.get(kind, "a finite number")
            raise DumpdbError(f"check {name}: parameter {key}={value!r} must be {want}")
        out[key] = v
    for key, default in check.params.items():
        if key not in out and default is not None:  # None given for a defaulted parameter: the default
            out[key] = float(default)
    if check.validate is not None:
        check.validate(check, out)
    return out


def _selection(checks: Sequence[str] | None, params: Mapping[str, Mapping[str, Any]] | None
               ) -> list[tuple[str, dict[str, float]]]:
    if isinstance(checks, str):
        checks = [checks]
    entries = list(DEFAULT_CHECKS if checks is None else checks)
    if not entries:
        raise DumpdbError(f"no checks given (known checks: {_known()})")
    given: dict[str, dict[str, Any]] = {}
    for entry in entries:
        name, spec_params = parse_check_spec(entry)
        if name in given:
            raise DumpdbError(f"check {name} given twice")
        given[name] = dict(spec_params)
    for name, extra in (params or {}).items():
        _lookup(name)
        if name not in given:
            raise DumpdbError(f"parameters given for check {name}, which is not selected "
                              f"(selected: {', '.join(given)})")
        if not isinstance(extra, Mapping):
            raise DumpdbError(f"check {name}: parameters must be a mapping of name to number, not {extra!r}")
        given[name].update(extra)
    return [(name, _resolve_params(name, p)) for name, p in given.items()]


# --------------------------------------------------------------------------- SQL
_ORDER = ("iteration NULLS LAST, rank NULLS LAST, graph_start NULLS LAST, graph_id NULLS LAST, "
          "position NULLS LAST, timestamp NULLS LAST, io_order, slot NULLS LAST, tensor_id")

_JOIN_KEYS = ("{a}.rank IS NOT DISTINCT FROM {b}.rank AND {a}.device_id IS NOT DISTINCT FROM {b}.device_id "
              "AND {a}.graph_id IS NOT DISTINCT FROM {b}.graph_id")

_BASE_SQL = f"""
WITH t AS (
    SELECT * FROM tensors WHERE run = $run {{rank_filter}}
),
eo AS (
    SELECT rank, device_id, graph_id, scope_name, min(position) AS position
    FROM execution_order WHERE run = $run AND scope_name IS NOT NULL GROUP BY ALL
),
code AS (
    SELECT rank, device_id, graph_id, scope_name, code_file, code_line, code_text
    FROM ops WHERE run = $run AND scope_name IS NOT NULL
    QUALIFY row_number() OVER (PARTITION BY rank, device_id, graph_id, scope_name
                               ORDER BY code_line IS NULL, code_line, node) = 1
),
gs AS (
    SELECT rank, device_id, graph_id, iteration, min(timestamp) AS graph_start FROM t GROUP BY ALL
),
base AS (
    SELECT t.*, eo.position, gs.graph_start, code.code_file, code.code_line, code.code_text,
           CASE t.io WHEN 'input' THEN 0 WHEN 'output' THEN 1 ELSE 2 END AS io_order,
           (coalesce(t.nan_count + t.pos_inf_count + t.neg_inf_count, 0) = 0
            AND isfinite(t.min) AND isfinite(t.max) AND t.count > 0) AS finite
    FROM t
    LEFT JOIN eo ON eo.scope_name = t.scope_name AND {_JOIN_KEYS.format(a="eo", b="t")}
    LEFT JOIN code ON code.scope_name = t.scope_name AND {_JOIN_KEYS.format(a="code", b="t")}
    LEFT JOIN gs ON {_JOIN_KEYS.format(a="gs", b="t")} AND gs.iteration IS NOT DISTINCT FROM t.iteration
)"""

# The previous dumped iteration of the same tensor: one representative (the last dumped) per
# key and iteration, lag() over iterations.
_PAIR_SQL = """,
keyed AS (
    SELECT *, concat_ws(chr(31), coalesce(rank::VARCHAR, '~'), coalesce(device_id::VARCHAR, '~'),
                        coalesce(graph_id::VARCHAR, '~'), coalesce(scope_name, op_name, '~'), coalesce(io, '~'),
                        coalesce(slot::VARCHAR, '~'), coalesce(slot_path, '~'), coalesce(direction, '~'),
                        coalesce(arg_name, '~')) AS tkey
    FROM base WHERE iteration IS NOT NULL
),
rep AS (
    SELECT tkey, iteration, tensor_id AS r_id, content_hash AS r_content_hash, dtype AS r_dtype, count AS r_count,
           min AS r_min, max AS r_max, mean AS r_mean, l2norm AS r_l2norm, zero_count AS r_zero_count,
           finite AS r_finite
    FROM keyed
    QUALIFY row_number() OVER (PARTITION BY tkey, iteration ORDER BY timestamp DESC NULLS LAST, tensor_id DESC) = 1
),
prevs AS (
    SELECT tkey, iteration,
           lag(iteration) OVER w AS p_iteration, lag(r_id) OVER w AS p_id,
           lag(r_content_hash) OVER w AS p_content_hash, lag(r_dtype) OVER w AS p_dtype,
           lag(r_count) OVER w AS p_count, lag(r_min) OVER w AS p_min, lag(r_max) OVER w AS p_max,
           lag(r_mean) OVER w AS p_mean, lag(r_l2norm) OVER w AS p_l2norm,
           lag(r_zero_count) OVER w AS p_zero_count, lag(r_finite) OVER w AS p_finite
    FROM rep WINDOW w AS (PARTITION BY tkey ORDER BY iteration)
),
paired AS (
    SELECT k.*, p.p_iteration, p.p_id, p.p_content_hash, p.p_dtype, p.p_count, p.p_min, p.p_max, p.p_mean,
           p.p_l2norm, p.p_zero_count, p.p_finite,
           (k.content_hash IS NOT NULL AND k.content_hash = p.p_content_hash AND k.dtype = p.p_dtype) AS same_payload
    FROM keyed k JOIN prevs p USING (tkey, iteration)
    WHERE p.p_id IS NOT NULL
)"""


_OUT_COLUMNS = ("tensor_id, iteration, rank, graph_id, position, timestamp, op_type, op_name, scope_name, io, slot, "
                "code_file, code_line, code_text, graph_start, io_order, dtype, dtype_declared, content_hash, count, "
                "nan_count, pos_inf_count, neg_inf_count, zero_count")
_PAIR_COLUMNS = ", p_iteration, p_id, p_content_hash, same_payload"


def _nn(x: str) -> str:
    """NaN -> NULL (DuckDB orders NaN above every number, so NaN > 1 is true)."""
    return f"(CASE WHEN isnan({x}) THEN NULL ELSE {x} END)"


def _f(v: float) -> str:
    return repr(float(v)) if math.isfinite(v) else ("'inf'::DOUBLE" if v > 0 else "'-inf'::DOUBLE")


def _abs_mean_bounds(p: str = "") -> tuple[str, str, str]:
    """(exact, lower, upper) SQL for mean(|x|) from the statistics of columns {p}min, ..."""
    mn, mx, mean, l2, n = (f"{p}{c}" for c in ("min", "max", "mean", "l2norm", "count"))
    exact = f"(CASE WHEN {mn} >= 0 THEN {mean} WHEN {mx} <= 0 THEN -{mean} END)"
    lo = f"coalesce({exact}, abs({mean}) * (1 - {_SLACK}))"
    hi = f"coalesce({exact}, least(greatest(abs({mn}), abs({mx})), {l2} / sqrt({n})) * (1 + {_SLACK}))"
    return exact, lo, hi


def _metric_sql(metric: str, p: Mapping[str, float]) -> tuple[str, str]:
    """(lower, upper) bound SQL of a metric; equal expressions mean exact, NULL means unknown."""
    if metric in ("max", "min", "mean"):
        return metric, metric
    if metric == "max_min":
        return "(max - min)", "(max - min)"
    if metric == "count":
        return "count::DOUBLE", "count::DOUBLE"
    if metric == "zero_count":
        return "zero_count::DOUBLE", "zero_count::DOUBLE"
    if metric == "nan_count":
        return "nan_count::DOUBLE", "nan_count::DOUBLE"
    if metric == "inf_count":
        x = "(pos_inf_count + neg_inf_count)::DOUBLE"
        return x, x
    if metric == "nan_inf_count":
        x = "(nan_count + pos_inf_count + neg_inf_count)::DOUBLE"
        return x, x
    if metric == "zero_pct":
        x = "(CASE WHEN count > 0 THEN 100.0 * zero_count / count ELSE 0.0 END)"
        return x, x
    if metric == "abs_mean":
        _, lo, hi = _abs_mean_bounds()
        return lo, hi
    if metric == "max_abs":
        x = ("(CASE WHEN coalesce(pos_inf_count, 0) + coalesce(neg_inf_count, 0) > 0 THEN 'inf'::DOUBLE "
             "WHEN NOT isnan(min) AND NOT isnan(max) THEN greatest(abs(min), abs(max)) END)")
        return x, x
    if metric == "range_pct":
        s, e = _f(p["range_start_inclusive"]), _f(p["range_end_inclusive"])
        exact = f"(CASE WHEN min >= {s} AND max <= {e} THEN 100.0 WHEN max < {s} OR min > {e} THEN 0.0 END)"
        zero_in = f"({s} <= 0 AND 0 <= {e})"
        lo = f"coalesce({exact}, CASE WHEN {zero_in} THEN 100.0 * zero_count / count ELSE 0.0 END)"
        hi = f"coalesce({exact}, CASE WHEN {zero_in} THEN 100.0 ELSE 100.0 * (count - zero_count) / count END)"
        return lo, hi
    # between iterations (columns of the previous tensor prefixed p_)
    if metric == "allclose":
        tol = f"({_f(p['atol'])} + {_f(p['rtol'])} * greatest(abs(p_min), abs(p_max)))"

        def far(a: str, b: str) -> str:
            return f"abs({a} - {b}) > {tol} * (1 + {_SLACK}) + {_SLACK} * (abs({a}) + abs({b}))"

        changed = f"(p_finite AND ({far('max', 'p_max')} OR {far('min', 'p_min')} OR {far('mean', 'p_mean')}))"
        lo = "(CASE WHEN same_payload THEN 1.0 ELSE 0.0 END)"
        hi = f"(CASE WHEN same_payload THEN 1.0 WHEN {changed} THEN 0.0 ELSE 1.0 END)"
        return lo, hi
    if metric == "max_abs_diff":
        x = "(CASE WHEN same_payload THEN 0.0 END)"
        return x, x
    if metric == "ratio":
        eps = _f(p["epsilon"])
        _, p_lo, p_hi = _abs_mean_bounds("p_")
        exact = f"(CASE WHEN same_payload AND ({eps} > 0 OR p_zero_count < p_count) THEN 0.0 END)"
        rms = "(l2norm / sqrt(count) + p_l2norm / sqrt(p_count))"
        mabs = "(greatest(abs(min), abs(max)) + greatest(abs(p_min), abs(p_max)))"
        lo = _nn(f"abs(mean - p_mean) / ({p_hi} + {eps}) * (1 - {_SLACK})")
        hi = _nn(f"least({rms}, {mabs}) / ({p_lo} + {eps}) * (1 + {_SLACK})")
        return (f"coalesce({exact}, CASE WHEN p_finite THEN {lo} END)",
                f"coalesce({exact}, CASE WHEN p_finite THEN {hi} END)")
    raise AssertionError(metric)  # pragma: no cover


# --------------------------------------------------------------------------- check implementations
def _passes(value: float | None, op: str, threshold: float) -> bool:
    if value is None or math.isnan(value):  # MindSpore parameter_t::Evaluate: NaN never hits
        return False
    return value > threshold if op == "gt" else value < threshold if op == "lt" else value >= threshold


_MI_METRIC = {"abs_mean": "abs_mean", "max": "max", "min": "min", "mean": "mean",
              "range_percentage": "range_pct", "max_min": "max_min", "zero_percentage": "zero_pct",
              "abs_mean_update_ratio": "ratio"}


def _tests(name: str, p: Mapping[str, float]) -> list[_Test]:
    check = CHECKS[name]
    if check.tests is not None:
        return check.tests(p)
    out = []
    for key in CHECKS[name].params:  # MindInsight parameter order
        metric, _, op = key.rpartition("_")
        if key in p and metric in _MI_METRIC:
            out.append(_Test(key, _MI_METRIC[metric], op, p[key]))
    return out


def _value_metric(name: str) -> str | None:
    return CHECKS[name].value_metric


def _eligible(name: str, p: Mapping[str, float]) -> str:
    return CHECKS[name].eligible(p)


def _detail(name: str, row: Mapping[str, Any], m: Mapping[str, float], hits: list[tuple[_Test, float]],
            p: Mapping[str, float]) -> str:
    return CHECKS[name].detail(row, m, hits, p)


# --------------------------------------------------------------------------- reading payloads
def _flat_chunks(array: np.ndarray) -> Iterator[np.ndarray]:
    flat = np.asarray(array).reshape(-1)
    if flat.dtype.kind == "b":
        flat = flat.view(np.uint8)
    for start in range(0, flat.size, CHUNK):
        x = flat[start:start + CHUNK]
        yield np.abs(x).astype(np.float64) if x.dtype.kind == "c" else x.astype(np.float64)


def _single_metrics(array: np.ndarray, needed: set[str], p: Mapping[str, float]) -> dict[str, float]:
    with np.errstate(all="ignore"):
        return _single_metrics_(array, needed, p)


def _single_metrics_(array: np.ndarray, needed: set[str], p: Mapping[str, float]) -> dict[str, float]:
    n = int(np.asarray(array).size)
    abs_sum = 0.0
    in_range = 0
    max_abs = -math.inf
    for x in _flat_chunks(array):
        if "abs_mean" in needed:
            abs_sum += float(np.abs(x).sum())
        if "range_pct" in needed:
            in_range += int(np.count_nonzero((x >= p["range_start_inclusive"]) & (x <= p["range_end_inclusive"])))
        if "max_abs" in needed:
            a = np.abs(x[~np.isnan(x)])
            if a.size:
                max_abs = max(max_abs, float(a.max()))
    out: dict[str, float] = {}
    if "abs_mean" in needed:
        out["abs_mean"] = abs_sum / n if n else 0.0
    if "range_pct" in needed:
        out["range_pct"] = 100.0 * in_range / n if n else 0.0
    if "max_abs" in needed:
        out["max_abs"] = max_abs if max_abs > -math.inf else math.nan
    return out


def _pair_metrics(cur: np.ndarray, prev: np.ndarray, needed: set[str], p: Mapping[str, float]) -> dict[str, float]:
    with np.errstate(all="ignore"):  # inf - inf is NaN, as in MindSpore's double arithmetic
        return _pair_metrics_(cur, prev, needed, p)


def _pair_metrics_(cur: np.ndarray, prev: np.ndarray, needed: set[str], p: Mapping[str, float]) -> dict[str, float]:
    if np.asarray(cur).size != np.asarray(prev).size:
        return {}
    n = int(np.asarray(cur).size)
    close = True
    max_diff = 0.0
    diff_sum = prev_abs_sum = 0.0
    for c, q in zip(_flat_chunks(cur), _flat_chunks(prev)):
        d = np.abs(c - q)
        if "allclose" in needed and close:
            close = bool(np.all(d <= p["atol"] + p["rtol"] * np.abs(q)))
        if "max_abs_diff" in needed and d.size:
            max_diff = max(max_diff, float(d.max()))
        if "ratio" in needed:
            diff_sum += float(d.sum())
            prev_abs_sum += float(np.abs(q).sum())
    out: dict[str, float] = {}
    if "allclose" in needed:
        out["allclose"] = 1.0 if close else 0.0
    if "max_abs_diff" in needed:
        out["max_abs_diff"] = max_diff
    if "ratio" in needed:
        num, den = (diff_sum / n, prev_abs_sum / n + p["epsilon"]) if n else (math.nan, math.nan)
        out["ratio"] = num / den if den else (math.nan if num == 0 or math.isnan(num) else math.inf)
    return out


def _read(archive: ArchiveReads, ids: list[int]) -> Iterator[tuple[int, np.ndarray | None]]:
    if not ids:
        return
    for row, array in archive.tensors("SELECT unnest(?::BIGINT[]) AS tensor_id", [ids]):
        yield row["tensor_id"], array


def tensor_check_metrics(store, kind: str, items: list[tuple], needed: set[str],
                         p: Mapping[str, float]) -> list[dict[str, float]]:
    """The payload metrics ``needed`` of each item, read from ``store`` (a
    :class:`~dumpdb.storage.store.TensorStore`): ``(tensor_id, location)`` for ``kind``
    ``single``, ``(tensor_id, location, previous iteration's location)`` for ``pair``; a
    location is ``(array_path, elem_offset, elem_count, dtype, shape, content_hash)``. The
    functions of the local scan on the same bytes: the same values. A cluster task
    (:mod:`dumpdb.compare.distributed`); a read error is raised (the caller reads again
    locally for its message)."""
    from dumpdb.dtypes import from_catalog_name

    def read(loc: tuple) -> np.ndarray:
        path, offset, count, dtype, shape, content_hash = loc
        return store.read(path, offset, count or 0, from_catalog_name(dtype), tuple(shape), content_hash)

    if kind == "pair":
        return [_pair_metrics(read(loc), read(prev), needed, p) for _, loc, prev in items]
    return [_single_metrics(read(loc), needed, p) for _, loc in items]


def _location(loc) -> tuple | None:
    """A readable TensorLocation as a cluster task's location tuple, else None."""
    if loc is None or not loc.readable:
        return None
    return (loc.array_path, loc.elem_offset, loc.elem_count, loc.dtype, loc.shape, loc.content_hash)


def _read_remote(archive: ArchiveReads, client, pair: bool, to_read: list[dict[str, Any]], needed: set[str],
                 p: Mapping[str, float]) -> dict[int, dict[str, float]] | None:
    """:func:`tensor_check_metrics` of ``to_read`` on the dask ``client``
    (:func:`scan_reads`); None when a tensor cannot be read there
    or a task failed (the caller reads locally: the same values, or the local error)."""

    ids = [i for row in to_read for i in ((row["p_id"], row["tensor_id"]) if pair else (row["tensor_id"],))]
    locs = [_location(loc) for loc in archive.locations.many([int(i) for i in ids])]
    if any(loc is None for loc in locs):
        return None
    items = [(ids[k + 1], locs[k + 1], locs[k]) for k in range(0, len(ids), 2)] if pair else list(zip(ids, locs))
    try:
        return dict(scan_reads(archive, client, "pair" if pair else "single", items, needed, dict(p)))
    except Exception:  # noqa: BLE001 - any failure on the cluster: the local read says what it is
        return None


# --------------------------------------------------------------------------- running one check
def _candidates_sql(name: str, p: Mapping[str, float], tests: list[_Test], metrics: list[str],
                    pair: bool, first_only: bool, iteration: int | None, rank: int | None) -> str:
    rank_filter = "AND (rank = $rank OR rank IS NULL)" if rank is not None else ""
    sql = _BASE_SQL.format(rank_filter=rank_filter) + (_PAIR_SQL if pair else "")
    source = "paired" if pair else "base"
    cols = []
    for m in metrics:
        lo, hi = _metric_sql(m, p)
        lo, hi = f"CAST({lo} AS DOUBLE)", f"CAST({hi} AS DOUBLE)"  # 1.0 is a DECIMAL literal in DuckDB
        cols.append(f"{_nn(lo)} AS m_{m}_lo, {_nn(hi)} AS m_{m}_hi")
    lo_of = {m: f"coalesce(m_{m}_lo, '-inf'::DOUBLE)" for m in metrics}
    hi_of = {m: f"coalesce(m_{m}_hi, 'inf'::DOUBLE)" for m in metrics}
    possible, definite = [], []
    for t in tests:
        v = _f(t.threshold)
        if t.op == "gt":
            possible.append(f"{hi_of[t.metric]} > {v}")
            definite.append(f"{lo_of[t.metric]} > {v}")
        elif t.op == "lt":
            possible.append(f"{lo_of[t.metric]} < {v}")
            definite.append(f"{hi_of[t.metric]} < {v}")
        else:
            possible.append(f"{hi_of[t.metric]} >= {v}")
            definite.append(f"{lo_of[t.metric]} >= {v}")
    it_filter = "AND iteration = $iteration" if iteration is not None else ""
    keep = _OUT_COLUMNS + (_PAIR_COLUMNS if pair else "")
    sql += f""",
cand AS (
    SELECT {keep}, {', '.join(cols)} FROM {source} WHERE ({_eligible(name, p)}) {it_filter}
),
scored AS (
    SELECT *, ({' OR '.join(definite)}) AS definite FROM cand WHERE {' OR '.join(possible)}
)
SELECT * FROM scored
"""
    if first_only:  # nothing after a group's first certain hit can be its first hit
        sql += (f"QUALIFY coalesce(sum(definite::INTEGER) OVER (PARTITION BY iteration, rank ORDER BY {_ORDER} "
                "ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) = 0\n")
    return sql + f"ORDER BY {_ORDER}"


def _run_check(archive: ArchiveReads, name: str, p: Mapping[str, float], order: int, run: str,
               iteration: int | None, rank: int | None, first_only: bool, client=None) -> list[dict[str, Any]]:
    tests = _tests(name, p)
    value_metric = _value_metric(name)
    metrics = sorted({t.metric for t in tests} | ({value_metric} if value_metric else set()))
    pair = CHECKS[name].between_iterations
    sql = _candidates_sql(name, p, tests, metrics, pair, first_only, iteration, rank)
    params: dict[str, Any] = {"run": run}
    if iteration is not None:
        params["iteration"] = iteration
    if rank is not None:
        params["rank"] = rank
    rows = archive.sql(sql, params).to_pylist()

    # Rows whose metrics are all exact from statistics are decided now; the rest need their payload.
    for row in rows:
        known = {}
        for metric in metrics:
            lo, hi = row[f"m_{metric}_lo"], row[f"m_{metric}_hi"]
            if lo is not None and lo == hi:
                known[metric] = lo
        row["_known"] = known
        row["_exact"] = len(known) == len(metrics)
        row["_group"] = (row["iteration"], row["rank"])
        readable = row["content_hash"] is not None and (not pair or row["p_content_hash"] is not None)
        row["_readable"] = readable

    out: list[dict[str, Any]] = []
    done: set[tuple] = set()
    start = 0
    while start < len(rows):
        # a window of rows holding at most READ_BATCH rows that need a read
        end, reads = start, 0
        while end < len(rows) and (reads < (REMOTE_READ_BATCH if client else READ_BATCH) or rows[end]["_exact"]):
            reads += not rows[end]["_exact"]
            end += 1
        window = rows[start:end]
        start = end
        # plan: skip reads that cannot be a group's first hit any more ("definite": a certain hit)
        seen_hit: set[tuple] = set()
        to_read: list[dict[str, Any]] = []
        for row in window:
            g = row["_group"]
            if first_only and (g in done or g in seen_hit):
                continue
            if not row["_exact"] and row["_readable"]:
                to_read.append(row)
            if row["definite"]:
                seen_hit.add(g)
        needed = set(metrics)
        found = _read_remote(archive, client, pair, to_read, needed, p) if client is not None and to_read else None
        computed: dict[int, dict[str, float]] = found if found is not None else {}
        if found is None and pair:
            ids = [i for row in to_read for i in (row["p_id"], row["tensor_id"])]
            it = _read(archive, ids)
            for (_, prev), (tid, cur) in zip(it, it):
                if prev is not None and cur is not None:
                    computed[tid] = _pair_metrics(cur, prev, needed, p)
        elif found is None:
            for tid, array in _read(archive, [row["tensor_id"] for row in to_read]):
                if array is not None:
                    computed[tid] = _single_metrics(array, needed, p)
        for row in window:
            g = row["_group"]
            if first_only and g in done:
                continue
            note = ""
            if row["_exact"]:
                m = row["_known"]
            elif row["tensor_id"] in computed:
                m = {**row["_known"], **computed[row["tensor_id"]]}
            elif row["definite"]:
                # a certain hit by the statistics' bounds, but no payload to compute the exact value:
                # report the bound that proves it
                m = dict(row["_known"])
                for t in tests:
                    if t.metric not in m:
                        bound = row[f"m_{t.metric}_hi" if t.op == "lt" else f"m_{t.metric}_lo"]
                        if bound is not None and _passes(bound, t.op, t.threshold):
                            m[t.metric] = bound
                note = " (bound from statistics; no payload to read)"
            else:
                continue  # undecidable without a payload
            hits = [(t, m.get(t.metric)) for t in tests if _passes(m.get(t.metric), t.op, t.threshold)]
            if not hits:
                continue
            value = m.get(value_metric) if value_metric else hits[0][1]
            out.append({
                **{k: row.get(k) for k in RESULT_SCHEMA.names if k not in ("check", "value", "detail")},
                "check": name, "value": value, "detail": _detail(name, row, m, hits, p) + note,
                "graph_start": row.get("graph_start"), "io_order": row.get("io_order"), "check_order": order,
            })
            if first_only:
                done.add(g)
    return out


# --------------------------------------------------------------------------- public entry point
@contextmanager
def _hold(archive: ArchiveReads) -> Iterator[None]:
    """One catalog connection for the whole scan (each Archive.sql call otherwise opens one)."""
    if getattr(archive, "_held", "missing") is None:
        with archive:
            yield
    else:
        yield


@contextmanager
def _cluster(scheduler: str | None, workers: int | None) -> Iterator[Any]:
    """The dask client of ``scheduler`` (:func:`dumpdb.cluster.dask_client`), or None."""
    if scheduler is None:
        yield None
        return
    with dask_client(scheduler, workers_for(workers)) as client:
        yield client


def _check_selection(archive: ArchiveReads, run: str, iteration: int | None, rank: int | None) -> None:
    archive.require_run(run)
    for column, value in (("iteration", iteration), ("rank", rank)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise DumpdbError(f"{column} must be an integer, not {value!r}")
        cond = "rank = $v OR rank IS NULL" if column == "rank" else "iteration = $v"
        if archive.sql(f"SELECT 1 FROM tensors WHERE run = $run AND ({cond}) LIMIT 1",
                       {"run": run, "v": int(value)}).num_rows == 0:
            have = archive.sql(f"SELECT DISTINCT {column} AS v FROM tensors WHERE run = $run AND {column} "
                               "IS NOT NULL ORDER BY v", {"run": run}).column("v").to_pylist()
            raise DumpdbError(f"run {run!r} has no {column} {value} ({column}s: "
                              f"{', '.join(map(str, have)) or 'none'})")


def scan(archive: ArchiveReads, run: str, checks: Sequence[str] | None = None, *, iteration: int | None = None,
         rank: int | None = None, params: Mapping[str, Mapping[str, float]] | None = None,
         first_only: bool = True, scheduler: str | None = None, workers: int | None = None) -> pa.Table:
    """Run ``checks`` over run ``run`` of ``archive``; one row per hit (:data:`RESULT_SCHEMA`).

    ``checks``: names from :data:`CHECKS` or specs ``NAME:PARAM=VALUE,...`` (see
    :func:`parse_check_spec`); default :data:`DEFAULT_CHECKS`. ``params``: per check name,
    parameters overriding the spec's and the defaults. ``iteration``/``rank`` restrict the
    tensors scanned (the between-iteration checks still compare with earlier iterations;
    ``rank`` also matches tensors of layouts without ranks). ``first_only``: keep only the
    first hit per (check, iteration, rank) in execution order (module docstring).
    ``scheduler``: the payloads checks read are read and reduced on the ``dask.distributed``
    cluster at that address, or ``"local"`` (a LocalCluster of ``workers`` processes), in
    windows of :data:`REMOTE_READ_BATCH` tensors: the same rows
    (:mod:`dumpdb.compare.distributed`). No cluster is started when no check reads payloads.

    Raises :class:`DumpdbError` (one line) for an unknown check (listing the known ones), an
    unknown or invalid parameter, an unknown run, or an iteration/rank the run does not have.
    """
    selected = _selection(checks, params)
    rows: list[dict[str, Any]] = []
    remote = scheduler is not None and any(CHECKS[name].needs_tensors for name, _ in selected)
    with _hold(archive), _cluster(scheduler if remote else None, workers) as client:
        _check_selection(archive, run, iteration, rank)
        for order, (name, p) in enumerate(selected):
            rows.extend(_run_check(archive, name, p, order, run, iteration,
                                   int(rank) if rank is not None else None, first_only, client))
    keys = ("iteration", "rank", "graph_start", "graph_id", "position", "timestamp", "io_order", "slot",
            "tensor_id", "check_order")
    rows.sort(key=lambda r: tuple((r[k] is None, r[k] if r[k] is not None else 0) for k in keys))  # NULLs last
    return pa.Table.from_pylist([{k: r[k] for k in RESULT_SCHEMA.names} for r in rows], schema=RESULT_SCHEMA)


# --------------------------------------------------------------------------- on a cluster
def _scan_task(spec: StoreSpec, kind: str, items: list[tuple], needed: list[str], params: dict) -> list:
    store = spec.open()
    return tensor_check_metrics(store, kind, items, set(needed), params)


def scan_reads(archive, client, kind: str, items: list[tuple], needed: set[str],
               params: dict) -> Iterator[tuple[Any, Any]]:
    """A scan's payload metrics on ``client`` (:func:`dumpdb.checks.scan.tensor_check_metrics`):
    ``items`` are ``(tensor_id, location[, previous location])`` (``kind``: ``single`` or
    ``pair``), grouped by the array the tensor lies in; yields ``(tensor_id, metrics)``."""
    spec = store_spec(archive)
    arrays = [it[1][0] for it in items]
    others = [it[2][0] if kind == "pair" else None for it in items]
    sizes = [int(it[1][2] or 0) * (2 if kind == "pair" else 1) for it in items]
    futures = {}
    for group in partition(arrays, others, sizes):
        members = [items[k] for k in group.tolist()]
        fut = client.submit(_scan_task, spec, kind, members, sorted(needed), dict(params), pure=False)
        futures[fut] = ("scan", [m[0] for m in members])
    for _, ids, found in gathered(client, futures):
        yield from zip(ids, found)
