"""The compare metric registry: one :class:`Metric` entry per metric.

Every output reads this table instead of its own list: the engine (which metrics to
compute and return), the msprobe CSV (``msprobe_column``, in registry order, and
``csv_percent``), Parquet (every returned column), the HTML report (``primary``,
``plot``, ``digits``) and the CLI (``cli`` metrics printed with ``display``).

Built-in metrics are computed together in one chunked pass
(:func:`dumpdb.compare.metrics.tensor_metrics`, :mod:`dumpdb.compare.stats_sql`)
and are stored in ``compare_results`` (``migrations/003_compare.sql``). A new metric is
one module in :mod:`dumpdb.compare.metric_plugins` calling :func:`register` with a
``function(target, bench) -> float | None`` (numpy arrays of the same shape, any numeric
dtype; None where the metric does not apply) plus a test; it is computed for every
tensor-mode pair and appears in the returned table, Parquet, HTML and CLI (and in the
msprobe CSV only if it names an msprobe column). It is not stored in ``compare_results``
until a migration adds its column.

``verdict``: an optional per-pair rule ``verdict(value, row) -> (level, reason) | None``
applied after msprobe's checkers (:mod:`dumpdb.compare.verdict`), which judge the
built-in metrics (their entries name the checker in ``rule``).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Metric", "register", "metrics", "names", "get", "load_plugins"]


@dataclass(frozen=True)
class Metric:
    """One compare metric.

    ``name``: result column; ``kind``: ``'tensor'`` (from payloads) or ``'statistics'``
    (from catalog statistics); ``msprobe_column``: its header in msprobe's
    ``compare_result`` CSV (None: not in that CSV); ``display``: format spec for terminal
    and HTML text (``'.6g'``); ``digits``: significant digits kept in the HTML table;
    ``csv_percent``: written as msprobe's ``"12.5%"``; ``plot``: ``'linear'`` (bounded),
    ``'signed'`` (may be negative: symlog) or ``'log'``; ``primary``: plotted first in
    the HTML report; ``cli``: printed by ``first-divergence``; ``rule``: the verdict rule
    that reads it (text); ``function``/``verdict``: see the module docstring; ``builtin``:
    computed by the fused pass and stored.
    """

    name: str
    kind: str
    description: str
    msprobe_column: str | None = None
    display: str = ".6g"
    digits: int = 4
    csv_percent: bool = False
    plot: str = "log"
    primary: bool = False
    cli: bool = False
    rule: str | None = None
    function: Callable[[Any, Any], float | None] | None = None
    verdict: Callable[[float | None, dict], tuple[str, str] | None] | None = None
    builtin: bool = False


_REGISTRY: dict[str, Metric] = {}


def register(metric: Metric) -> Metric:
    """Add ``metric`` (kept in registration order). A name already registered raises
    ValueError; a non-builtin tensor metric needs a ``function``."""
    if metric.name in _REGISTRY:
        raise ValueError(f"metric {metric.name!r} is already registered")
    if metric.kind not in ("tensor", "statistics"):
        raise ValueError(f"metric {metric.name!r}: kind must be 'tensor' or 'statistics'")
    if not metric.builtin and metric.function is None:
        raise ValueError(f"metric {metric.name!r}: a registered metric needs a function")
    if not metric.builtin and metric.kind != "tensor":
        raise ValueError(f"metric {metric.name!r}: plug-in metrics are tensor metrics")
    _REGISTRY[metric.name] = metric
    return metric


def unregister(name: str) -> None:
    """Remove a plug-in metric (tests); built-ins stay."""
    if name in _REGISTRY and not _REGISTRY[name].builtin:
        del _REGISTRY[name]


def metrics(kind: str | None = None, *, builtin: bool | None = None) -> tuple[Metric, ...]:
    """Registered metrics in order, optionally of one ``kind`` / only (non-)builtins."""
    return tuple(m for m in _REGISTRY.values()
                 if (kind is None or m.kind == kind) and (builtin is None or m.builtin == builtin))


def names(kind: str | None = None, *, builtin: bool | None = None) -> tuple[str, ...]:
    """Column names of :func:`metrics`."""
    return tuple(m.name for m in metrics(kind, builtin=builtin))


def get(name: str) -> Metric | None:
    """The entry of ``name``, or None."""
    return _REGISTRY.get(name)


def _builtin(name: str, kind: str, description: str, **kw) -> None:
    register(Metric(name, kind, description, builtin=True, **kw))


# Built-ins, in the stored column order (definitions: dumpdb.compare.metrics docstring).
_ONES = "OneThousandthErrChecker (input > 0.9 and output < 0.1)"
_builtin("cosine", "tensor", "cosine similarity (msprobe)", msprobe_column="Cosine", digits=7,
         plot="linear", primary=True, cli=True,
         rule="CosineWarnChecker; outputs-only accuracy rule (cosine < 0.99 and max_abs_err > 0.001, or < 0.9)")
_builtin("euc_dist", "tensor", "Euclidean distance (msprobe)", msprobe_column="EucDist")
_builtin("max_abs_err", "tensor", "max absolute error (msprobe)", msprobe_column="MaxAbsErr", primary=True,
         cli=True, rule="outputs-only accuracy rule (> 0.001 with cosine < 0.99, or > 1)")
_builtin("max_rel_err", "tensor", "max relative error (msprobe)", msprobe_column="MaxRelativeErr",
         primary=True, cli=True)
_builtin("one_thousandth_err_ratio", "tensor", "share of elements with relative error < 0.001 (msprobe)",
         msprobe_column="One Thousandth Err Ratio", plot="linear", rule=_ONES)
_builtin("five_thousandths_err_ratio", "tensor", "share of elements with relative error < 0.005 (msprobe)",
         msprobe_column="Five Thousandths Err Ratio", plot="linear")
_builtin("mean_abs_err", "tensor", "mean absolute error (msaccucmp)")
_builtin("rmse", "tensor", "root mean square error (msaccucmp)")
_builtin("rel_euc_dist", "tensor", "relative Euclidean distance (msaccucmp)", primary=True, cli=True,
         rule="precision-aware rules (dumpdb.compare.precision)")
_builtin("accumulated_rel_err", "tensor", "accumulated relative error (msaccucmp)")
_builtin("mean_rel_err", "tensor", "mean relative error (msaccucmp)")
_builtin("kl_divergence", "tensor", "Kullback-Leibler divergence (msaccucmp)")
for _stat, _col in (("max", "Max diff"), ("min", "Min diff"), ("mean", "Mean diff"), ("l2norm", "L2norm diff")):
    _builtin(f"{_stat}_diff", "statistics", f"target {_stat} - bench {_stat}", msprobe_column=_col,
             plot="signed", primary=True)
for _stat, _col in (("max", "MaxRelativeErr"), ("min", "MinRelativeErr"), ("mean", "MeanRelativeErr"),
                    ("l2norm", "NormRelativeErr")):
    _builtin(f"{_stat}_rel_diff", "statistics", f"|{_stat} diff / bench {_stat}| (fraction)", msprobe_column=_col,
             csv_percent=True, cli=_stat == "mean",
             rule="RelativeErrChecker / RelativeWarnChecker" if _stat == "l2norm" else None)

_loaded = False


def load_plugins() -> None:
    """Import every module of :mod:`dumpdb.compare.metric_plugins` once (each registers
    its metric)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    from dumpdb.compare import metric_plugins

    for info in pkgutil.iter_modules(metric_plugins.__path__):
        importlib.import_module(f"{metric_plugins.__name__}.{info.name}")
