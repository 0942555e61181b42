"""Dump layouts dumpdb can read, and auto-detection.

Each layout is a :class:`~dumpdb.layouts.base.Layout` subclass in its own module,
made known with the :func:`~dumpdb.layouts.base.register` decorator; importing this
package imports every module in it, so adding a layout is one module (and a test).
:data:`LAYOUTS` lists them in detection order (``priority``: most specific first).

Detection (:func:`locate`, :func:`detect_all`): each layout's ``detect`` looks a few
levels below the directory it is given. When none recognises the given directory, a
bounded walk (:data:`MAX_WALK_DEPTH` levels, :data:`MAX_WALK_DIRS` directories,
symlinks and hidden directories not followed, so no loops) tries the directories
below it, level by level, and stops descending where a dump is found. One dump found
is ingested from where it is; several are listed and refused (choose one with
``--layout`` or by naming its directory).
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from dataclasses import dataclass
from pathlib import Path

from dumpdb.errors import LayoutError
from dumpdb.layouts.base import DumpScan, Layout, LoadedTensor, TensorEntry, register, registered

# Every module of the package registers its layouts on import.
for _module in pkgutil.iter_modules(__path__):
    if not _module.name.endswith("_pb2"):
        importlib.import_module(f"{__name__}.{_module.name}")

LAYOUTS: list[Layout] = registered()

MAX_WALK_DEPTH = 8  # directory levels below the given one
MAX_WALK_DIRS = 512  # directories the walk tries at most

__all__ = ["LAYOUTS", "Detection", "DumpScan", "Layout", "LoadedTensor", "TensorEntry", "detect", "detect_all",
           "get_layout", "locate", "register"]


@dataclass(frozen=True)
class Detection:
    """A dump found: its ``layout`` and the directory ``path`` to read it from."""

    layout: Layout
    path: Path


def get_layout(name: str) -> Layout:
    """The layout called ``name``; raises LayoutError listing the known names."""
    for layout in LAYOUTS:
        if layout.name == name:
            return layout
    known = ", ".join(lay.name for lay in LAYOUTS)
    raise LayoutError(f"unknown layout {name!r}; known layouts: {known}")


def _matches(directory: Path, layouts: list[Layout]) -> list[Layout]:
    """Layouts recognising ``directory``, less those refined by another match (a layout
    whose class is a base of another match's, e.g. mindspore-sync under statistic-only)."""
    probed: dict[object, str | None] = {}  # a family's classify(), called once

    def hit(layout: Layout) -> bool:
        if layout.classify is None:
            return layout.detect(directory)
        key = layout.classify
        if key not in probed:
            probed[key] = layout.classify(directory)
        return probed[key] == layout.name

    hits = [layout for layout in layouts if hit(layout)]
    return [h for h in hits if not any(o is not h and isinstance(o, type(h)) for o in hits)]


def _subdirs(directory: Path) -> list[Path]:
    try:
        with os.scandir(directory) as entries:
            return sorted(Path(e.path) for e in entries
                          if not e.name.startswith(".") and e.is_dir(follow_symlinks=False))
    except OSError:
        return []


def _check_dir(root: Path) -> None:
    if not root.exists():
        raise LayoutError(f"{root}: no such directory")
    if not root.is_dir():
        raise LayoutError(f"{root}: not a directory")


def detect_all(root: Path, layouts: list[Layout] | None = None) -> list[Detection]:
    """Every dump at or below ``root``: one :class:`Detection` per directory and layout (of
    ``layouts``, default all) recognising a dump there, shallowest first.

    ``root`` itself is tried first (each layout searches a few levels below it); only
    when nothing matches there does the bounded walk try the directories below. Raises
    LayoutError when ``root`` is missing or not a directory.
    """
    root = Path(root)
    _check_dir(root)
    layouts = LAYOUTS if layouts is None else layouts
    found: list[Detection] = []
    frontier, tried = [root], 0
    for _depth in range(MAX_WALK_DEPTH + 1):
        deeper: list[Path] = []
        for directory in frontier:
            if tried >= MAX_WALK_DIRS:
                return found
            tried += 1
            hits = _matches(directory, layouts)
            found.extend(Detection(layout, directory) for layout in hits)
            if not hits:
                deeper.extend(_subdirs(directory))
        frontier = deeper
        if not frontier:
            break
    return found


def _where(root: Path, d: Detection, shared: bool) -> str:
    """``layout at dir`` for a message; where several layouts matched the same directory,
    name its subdirectories each one recognises (one more level of ``detect`` calls)."""
    places = [d.path]
    if shared:
        places = [c for c in _subdirs(d.path) if d.layout.detect(c)] or places
    rels = [os.path.relpath(p, root) for p in places]
    return f"{d.layout.name} at {', '.join(rels)}"


def locate(root: Path, layout: str | None = None) -> Detection:
    """The one dump at or below ``root`` (of layout ``layout`` if given).

    With ``layout``: ``root`` itself when that layout recognises it (or nothing
    anywhere does: its reader then says what it misses), else the one directory below
    where it does. Raises LayoutError when ``root`` is missing, holds no dump dumpdb
    recognises (the message lists what was looked for), or holds several (each is
    listed, with how to choose).
    """
    root = Path(root)
    if layout is not None:
        chosen = get_layout(layout)
        _check_dir(root)
        if chosen.detect(root):
            return Detection(chosen, root)
        found = detect_all(root, [chosen])
        if len(found) == 1:
            return found[0]
        if not found:
            return Detection(chosen, root)
        listed = ", ".join(os.path.relpath(d.path, root) for d in found)
        raise LayoutError(f"{root}: holds {len(found)} {layout} dumps ({listed}); ingest one directory at a time")
    found = detect_all(root)
    if not found:
        # bounded (issue 30: every layout's description made it 1,639 characters): the
        # names only; `dumpdb layouts` describes each
        raise LayoutError(f"{root}: not a dump dumpdb recognises (looked up to {MAX_WALK_DEPTH} levels down for "
                          f"{', '.join(lay.name for lay in LAYOUTS)}); ingest --layout NAME names the reader's missing "
                          "files; 'dumpdb layouts' shows what each looks like")
    if len(found) > 1:
        paths = [d.path for d in found]
        listed = "; ".join(_where(root, d, paths.count(d.path) > 1) for d in found)
        raise LayoutError(f"{root}: holds more than one dump ({listed}); ingest one directory at a time, "
                          "or choose a layout with --layout NAME")
    return found[0]


def detect(root: Path) -> Layout:
    """The layout of the one dump at or below ``root`` (see :func:`locate`, which also
    says in which directory it is). Raises LayoutError when ``root`` is missing, not a
    directory, holds no dump or several."""
    return locate(root).layout
