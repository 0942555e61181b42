"""Dump layouts dumpdb can read, and auto-detection.

Each layout is a :class:`~dumpdb.layouts.base.Layout`; :data:`LAYOUTS` lists
them in detection order (most specific first).
"""

from __future__ import annotations

from pathlib import Path

from dumpdb.errors import LayoutError
from dumpdb.layouts.base import DumpScan, Layout, LoadedTensor, TensorEntry
from dumpdb.layouts.mindspore_sync import MindSporeSync

# Detection order: most specific first. Each reader module adds its class here.
LAYOUTS: list[Layout] = [
    MindSporeSync(),
    # -- readers of issue 3 (one line each, in this order) --
    # [msprobe]
    # [mindspore-tensordump]
    # [mindspore-r1.2-sync-bin]
    # [mindspore-r1.2-async-pb]
    # [ascend-async-pb]
    # [ascend-async-npy]
    # [cann-tf-adapter]
    # [torchair-ge]
    # [msaccucmp-npy]
    # [statistic-only]
]

__all__ = ["LAYOUTS", "DumpScan", "Layout", "LoadedTensor", "TensorEntry", "detect", "get_layout"]


def get_layout(name: str) -> Layout:
    """The layout called ``name``; raises LayoutError listing the known names."""
    for layout in LAYOUTS:
        if layout.name == name:
            return layout
    known = ", ".join(lay.name for lay in LAYOUTS)
    raise LayoutError(f"unknown layout {name!r}; known layouts: {known}")


def detect(root: Path) -> Layout:
    """The layout of the dump at ``root``.

    Raises LayoutError when ``root`` is missing, not a directory, or matches no
    layout (the message says what was looked for).
    """
    root = Path(root)
    if not root.exists():
        raise LayoutError(f"{root}: no such directory")
    if not root.is_dir():
        raise LayoutError(f"{root}: not a directory")
    for layout in LAYOUTS:
        if layout.detect(root):
            return layout
    looked = "; ".join(f"{lay.name}: {lay.description}" for lay in LAYOUTS)
    raise LayoutError(f"{root}: not a dump dumpdb recognises (looked for {looked})")
