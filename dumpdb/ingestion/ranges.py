"""What the catalog's columns can hold: entries and rows of a scan checked before commit.

A hostile or damaged dump can name a file with a timestamp beyond int64 or write
``nan`` as a count (issue 14); one such value would make a whole commit fail and
leave the run stuck in ``ingesting``. :func:`check_ranges` turns each into one
error line naming the file, before anything is written.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import fields as dataclass_fields
from typing import Any

import numpy as np
import pyarrow as pa

from dumpdb.layouts.base import DumpScan, TensorEntry

_INT_RANGES = {pa.int32(): (-(1 << 31), (1 << 31) - 1), pa.int64(): (-(1 << 63), (1 << 63) - 1)}


def _checker(typ: pa.DataType) -> Callable[[Any], bool] | None:
    """A test "``value`` cannot be stored in a column of type ``typ``" (None: any value can:
    only integer and list columns hold a value out of range). Built once per column: it runs
    for every value of every entry and relation row (the scan of 10,000s of small files calls
    it ~10 times a file), so the usual value, a plain int in range, is taken at once."""
    if typ in _INT_RANGES:
        lo, hi = _INT_RANGES[typ]

        def bad_int(value: Any) -> bool:
            if type(value) is int:
                return not lo <= value <= hi
            return value is not None and not (
                isinstance(value, (int, np.integer)) and not isinstance(value, bool) and lo <= value <= hi)
        return bad_int
    if pa.types.is_list(typ):
        item = _checker(typ.value_type)

        def bad_list(value: Any) -> bool:
            if value is None:
                return False
            if not isinstance(value, (list, tuple)):
                return True
            return item is not None and any(item(v) for v in value)
        return bad_list
    return None


def _checked(fields: Iterable[tuple[str, pa.DataType]]) -> list[tuple[str, Callable[[Any], bool]]]:
    """(column, :func:`_checker`) of the columns a value can be out of range for."""
    return [(name, check) for name, typ in fields if (check := _checker(typ)) is not None]


def _float_ok(value: Any) -> bool:
    try:
        float(value)
        return True
    except OverflowError:
        return False


_ENTRY_FIELDS = frozenset(f.name for f in dataclass_fields(TensorEntry))
_DECLARED = {"shape_declared": pa.list_(pa.int64()), "original_shape": pa.list_(pa.int64())}


def _row(e: TensorEntry) -> str:
    """The tensor an error line names: its key, and its statistics csv line if it is a row."""
    return e.key[:200] + (f" (line {e.csv_line})" if e.csv_line else "")


def check_ranges(scan: DumpScan, tensor_schema: pa.Schema, relation_schemas: dict[str, pa.Schema]) -> None:
    """Drop what the catalog's columns cannot hold, one error line each (issue 14).

    A file name's task id, timestamp or slot, or a directory's iteration beyond
    int64/int32 (or a statistic that is not a finite count) would make the whole
    commit fail: such an entry becomes an error naming its file; an unusable
    statistic is dropped (dumpdb computes it from the payload) with an error line;
    a relation row (IR ops, execution order, ...) with such a value loses that value.
    ``tensor_schema`` / ``relation_schemas``: the catalog tables' Arrow schemas
    (``tensors``; ``{scan attribute: schema}`` for ops, execution_order, ...).
    """
    fields = {f.name: f.type for f in tensor_schema} | _DECLARED
    checked = [c for c in _checked(fields.items()) if c[0] in _ENTRY_FIELDS]
    kept = []
    for e in scan.entries:
        bad = [f"{name}={value!r:.40}" for name, check in checked if check(value := getattr(e, name))]
        if bad:
            if isinstance(e.shape_declared, str):  # a statistic.csv Shape cell parse_shape_cell refused
                scan.errors.append((e.source_file, f"shape {e.shape_declared[:40]!r} of {_row(e)} is not a "
                                    "shape (non-negative integer sizes, e.g. (2,3)); row skipped"))
                continue
            scan.errors.append((e.source_file, f"{', '.join(bad)} out of range for the catalog "
                                "(int32/int64); tensor skipped"))
            continue
        if e.stats:
            wrong = []
            for k, v in list(e.stats.items()):
                if v is None:
                    continue
                if isinstance(v, (bool, np.bool_)):
                    ok = False  # readers turn booleans into numbers themselves (msprobe: 1.0 / 0.0)
                elif k.endswith("count"):
                    ok = bool(isinstance(v, (int, np.integer)) and 0 <= v < (1 << 63))
                else:  # min/max/mean/l2norm: any float, NaN and inf included; not an int beyond float
                    ok = isinstance(v, (int, float, np.number)) and _float_ok(v)
                if not ok:
                    wrong.append(f"{k}={v!r:.40}")
                    del e.stats[k]
                elif not k.endswith("count") and isinstance(v, (int, np.integer)):
                    # a DOUBLE column: pyarrow refuses an int it cannot hold exactly (2**53 + 1)
                    e.stats[k] = float(v)
            if wrong:
                scan.errors.append((e.source_file, f"statistic {', '.join(wrong)} is not a valid value "
                                    f"for {_row(e)}; ignored (computed from the payload if there is one)"))
        kept.append(e)
    scan.entries[:] = kept
    for table, schema in relation_schemas.items():
        dropped = 0
        columns = _checked((f.name, f.type) for f in schema)
        for row in getattr(scan, table):
            for name, check in columns:
                if name in row and check(row[name]):
                    row[name] = None
                    dropped += 1
        if dropped:
            scan.errors.append((table, f"{table}: {dropped} value(s) out of range for the catalog set to NULL"))
