"""Any report of a command (ingest, verify, gc, import, export, prune, migrate) as one JSON object.

``dumpdb CMD --format json`` prints what the text report says, for scripts: the report's
dataclass fields and its public properties (``ratio``, ``ok``, ``reclaimed``), by name.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import PurePath
from typing import Any

from dumpdb.render import tables


def plain(value: Any) -> Any:
    """``value`` as JSON-ready data: a dataclass as an object of its fields and public
    properties; a mapping as an object (keys as text); a sequence or set as a list; a
    pyarrow Table as a list of row objects; a path as text; a numpy scalar as its value;
    scalars as the row formats write them (:func:`dumpdb.render.tables.plain`: NaN/inf as
    ``"nan"``/``"inf"``, times ISO 8601); anything else as text."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        for name in dir(type(value)):
            if not name.startswith("_") and isinstance(getattr(type(value), name), property):
                out[name] = plain(getattr(value, name))
        return out
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain(v) for v in value]
    if isinstance(value, PurePath):
        return str(value)
    if hasattr(value, "to_pylist") and hasattr(value, "num_rows"):  # a pyarrow Table
        return plain(value.to_pylist())
    if hasattr(value, "item") and hasattr(value, "dtype"):  # a numpy scalar
        return plain(value.item())
    value = tables.plain(value)
    return value if value is None or isinstance(value, (bool, int, float, str)) else str(value)


def report_json(report: Any, **extra: Any) -> str:
    """``report`` (a dataclass, or a mapping) as one JSON object, with ``extra`` fields
    added (e.g. the command's name); two-space indented."""
    data = plain(report)
    if not isinstance(data, dict):
        data = {"result": data}
    data.update({k: plain(v) for k, v in extra.items()})
    return json.dumps(data, indent=2, ensure_ascii=False)
