"""The registry of scan checks: one :class:`Check` entry per check.

A check is declared once, with everything the scan engine (:mod:`dumpdb.checks.scan`)
and ``dumpdb scan --list`` need: its parameters and defaults, the threshold tests it
makes on statistics-derived metrics, which tensors it can evaluate, and whether it
compares a tensor with its previous iteration. The entries live in
:mod:`dumpdb.checks.conditions`; adding a check is one :func:`register` call there
(plus a test), using the metrics the engine knows (``_metric_sql`` in scan.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = ["CHECKS", "OPS", "Check", "ThresholdTest", "fmt", "register", "threshold_text"]

OPS = {"gt": ">", "lt": "<", "ge": ">="}


@dataclass(frozen=True)
class ThresholdTest:
    """One threshold test: ``metric`` ``op`` (gt | lt | ge) ``threshold``; ``param`` names it
    in the result's ``detail`` (e.g. ``max_gt``)."""

    param: str
    metric: str
    op: str
    threshold: float


def fmt(v: float | None) -> str:
    """A number as the result's ``detail`` shows it (6 significant digits; ``n/a`` for None)."""
    return "n/a" if v is None else f"{v:.6g}"


def threshold_text(hits: list[tuple[ThresholdTest, float]]) -> str:
    """``max = 1e+05 > 10000, ...``: the tests that hit, with the values that made them."""
    return ", ".join(f"{t.param.rpartition('_')[0]} = {fmt(v)} {OPS[t.op]} {fmt(t.threshold)}" for t, v in hits)


# detail(row, metrics, hits, params) -> the result's one-line ``detail``: ``row`` is the
# tensor's catalog row (previous tensor's columns prefixed p_), ``metrics`` the computed
# metric values, ``hits`` the tests that hit with their values, ``params`` the parameters.
Detail = Callable[[Mapping[str, Any], Mapping[str, float], list[tuple[ThresholdTest, float]], Mapping[str, float]],
                  str]


def _finite(p: Mapping[str, float]) -> str:
    return "finite"


def _threshold_detail(row: Mapping[str, Any], m: Mapping[str, float], hits: list[tuple[ThresholdTest, float]],
                      p: Mapping[str, float]) -> str:
    return threshold_text(hits)


@dataclass(frozen=True)
class Check:
    """One scan check. ``params`` maps each parameter to its default (None: disabled unless given).

    ``tests(params)`` gives the threshold tests (None: one test per given MindInsight
    parameter ``{metric}_{gt|lt|ge}``, in parameter order); ``eligible(params)`` is the
    SQL condition on a tensor's statistics for it to be evaluated at all;
    ``value_metric`` is the metric reported as ``value`` when it is not the tested one;
    ``between_iterations``: the check compares a tensor with the same tensor in the
    previous dumped iteration (metric columns of that one are prefixed ``p_``);
    ``detail`` writes the result's ``detail`` (default: :func:`threshold_text`);
    ``validate(check, params)`` raises DumpdbError for parameters that do not make a
    check (beyond each one's own range).
    """

    name: str
    description: str
    source: str
    params: Mapping[str, float | None]
    needs_tensors: bool
    tests: Callable[[Mapping[str, float]], list[ThresholdTest]] | None = field(default=None, compare=False, repr=False)
    eligible: Callable[[Mapping[str, float]], str] = field(default=_finite, compare=False, repr=False)
    value_metric: str | None = None
    between_iterations: bool = False
    detail: Detail = field(default=_threshold_detail, compare=False, repr=False)
    validate: Callable[[Check, Mapping[str, float]], None] | None = field(default=None, compare=False, repr=False)


CHECKS: dict[str, Check] = {}


def register(name: str, description: str, source: str, params: Mapping[str, float | None] | None = None,
             needs_tensors: bool = False, **behaviour) -> Check:
    """Add a check to :data:`CHECKS` (``behaviour``: the optional :class:`Check` fields).
    Raises ValueError for a name already registered."""
    if name in CHECKS:
        raise ValueError(f"check {name!r} is already registered")
    check = Check(name, description, source, MappingProxyType(dict(params or {})), needs_tensors, **behaviour)
    CHECKS[name] = check
    return check
