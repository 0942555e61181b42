"""The statistics-mode rules, once: a table of cases from which both forms are generated.

One statistic X (max, min, mean, l2norm) of a pair gives ``X_diff``, ``X_rel_diff`` and whether
msprobe's "double check" warning names it (rules: msprobe 26.2.0 ``calc_summary_diff`` and
``get_rela_diff_summary_mode``, see :mod:`dumpdb.compare.metrics`' docstring). :data:`CASES` is
the rule: the first case whose condition holds decides the three values. Each condition and
value is a name in :data:`CONDITIONS` / :data:`VALUES`, which give its Python form (a function
of the target and bench values, floats, not None but where the "missing" case says so) and its
DuckDB form (SQL over ``{t}``/``{b}``). :func:`python_stat` (the pair-by-pair reference
``stats_metrics`` of ``tests/compare_reference.py`` uses it) and :func:`sql_stat` (used by
:mod:`dumpdb.compare.stats_sql`) walk the same table; ``tests/test_compare_stats_sql.py`` checks
the two forms value for value on every pair of special values.

The two forms of a condition differ where DuckDB's floating point differs from Python's:
NaN = NaN is true in DuckDB (so "equal" is ``t = b`` there and ``t == b or both NaN`` in
Python), NaN sorts above every number (the magnitude test excludes NaN explicitly), and
``greatest`` returns NaN when one argument is NaN (not reached: NaN cases come first).
"""

from __future__ import annotations

import math
from collections.abc import Callable

MAGNITUDE = 0.5                             # msprobe CompareConst.MAGNITUDE
MAGNITUDE_EPSILON = 1e-10                   # msprobe CompareConst.EPSILON

Rule = tuple[Callable[[float, float], object], str]


def _magnitude_py(t: float, b: float) -> bool:
    try:
        m = abs(t - b) / (max(abs(t), abs(b)) + MAGNITUDE_EPSILON)
    except (ZeroDivisionError, OverflowError):
        return False
    return m > MAGNITUDE  # NaN (inf/inf) compares False, as in msprobe


_MAG_SQL = f"(abs({{t}} - {{b}}) / (greatest(abs({{t}}), abs({{b}})) + {MAGNITUDE_EPSILON!r}))"

# name -> (Python predicate, DuckDB predicate)
CONDITIONS: dict[str, Rule] = {
    "missing": (lambda t, b: t is None or b is None, "{t} IS NULL OR {b} IS NULL"),
    "equal": (lambda t, b: t == b or (math.isnan(t) and math.isnan(b)), "{t} = {b}"),
    "one_nan": (lambda t, b: math.isnan(t) or math.isnan(b), "isnan({t}) OR isnan({b})"),
    "bench_zero": (lambda t, b: b == 0, "{b} = 0"),
    "diff_inf": (lambda t, b: math.isinf(t - b), "isinf({t} - {b})"),
    "otherwise": (lambda t, b: True, "TRUE"),
}

# name -> (Python value, DuckDB value); None is SQL NULL
VALUES: dict[str, Rule] = {
    "none": (lambda t, b: None, "NULL"),
    "zero": (lambda t, b: 0.0, "0.0"),
    "zero_or_none_if_bench_zero": (lambda t, b: None if b == 0 else 0.0, "CASE WHEN {b} = 0 THEN NULL ELSE 0.0 END"),
    "diff": (lambda t, b: t - b, "({t} - {b})"),
    "inf": (lambda t, b: math.inf, "'inf'::DOUBLE"),
    "rel": (lambda t, b: abs((t - b) / b), "abs(({t} - {b}) / {b})"),
    "false": (lambda t, b: False, "false"),
    "magnitude": (_magnitude_py, f"(NOT isnan({_MAG_SQL}) AND {_MAG_SQL} > {MAGNITUDE!r})"),
}

# (condition, X_diff, X_rel_diff, flagged): the first case that holds decides
CASES: tuple[tuple[str, str, str, str], ...] = (
    ("missing", "none", "none", "false"),
    ("equal", "zero", "zero_or_none_if_bench_zero", "false"),   # both NaN, the same Inf included
    ("one_nan", "none", "none", "false"),
    ("bench_zero", "diff", "none", "magnitude"),                # msprobe's N/A
    ("diff_inf", "diff", "inf", "magnitude"),
    ("otherwise", "diff", "rel", "magnitude"),
)


def python_stat(t: float | None, b: float | None) -> tuple[float | None, float | None, bool]:
    """``(X_diff, X_rel_diff, flagged)`` of one statistic from the target and bench values
    (floats, NaN and +-Inf allowed; None when missing), by :data:`CASES`."""
    for cond, diff, rel, flag in CASES:
        if CONDITIONS[cond][0](t, b):  # type: ignore[arg-type]
            return (VALUES[diff][0](t, b), VALUES[rel][0](t, b),  # type: ignore[arg-type,return-value]
                    bool(VALUES[flag][0](t, b)))  # type: ignore[arg-type]
    raise AssertionError("CASES ends with 'otherwise'")


def sql_stat(name: str, t: str, b: str) -> str:
    """The select items ``{name}_diff``, ``{name}_rel_diff`` and ``{name}_flag`` (boolean,
    never NULL) of one statistic over the SQL expressions ``t`` and ``b``, by :data:`CASES`."""

    def case(column: int) -> str:
        whens = []
        for row in CASES:
            cond = CONDITIONS[row[0]][1].format(t=t, b=b)
            value = VALUES[row[column]][1].format(t=t, b=b)
            if row[0] == "otherwise":
                whens.append(f"ELSE {value}")
            else:
                whens.append(f"WHEN {cond} THEN {value}")
        return "CASE " + " ".join(whens) + " END"

    return (f"{case(1)} AS {name}_diff, {case(2)} AS {name}_rel_diff, "
            f"coalesce({case(3)}, false) AS {name}_flag")
