"""Dump layouts dumpdb can read, and auto-detection.

Each layout is a :class:`~dumpdb.layouts.base.Layout`; :data:`LAYOUTS` lists
them in detection order (most specific first).
"""

from __future__ import annotations

from pathlib import Path

from dumpdb.errors import LayoutError
from dumpdb.layouts.ascend import AscendAsyncNpy, AscendAsyncPb, CannTfAdapter, MindSporeR12AsyncPb, TorchAirGe
from dumpdb.layouts.base import DumpScan, Layout, LoadedTensor, TensorEntry
from dumpdb.layouts.mindspore_legacy import MindSporeR12SyncBin
from dumpdb.layouts.mindspore_sync import MindSporeSync
from dumpdb.layouts.msaccucmp import MsaccucmpNpy
from dumpdb.layouts.msprobe import MsprobeDump
from dumpdb.layouts.statistic_only import StatisticOnly
from dumpdb.layouts.tensordump import MindSporeTensorDump

# Detection order: the first layout whose detect() is True wins, so a layout
# that is a special case of another comes first.
LAYOUTS: list[Layout] = [
    StatisticOnly(),  # a mindspore-sync tree with statistic.csv and no .npy
    MindSporeSync(),
    MsprobeDump(),
    MindSporeTensorDump(),
    MindSporeR12SyncBin(),
    MindSporeR12AsyncPb(),
    AscendAsyncPb(),
    AscendAsyncNpy(),
    CannTfAdapter(),
    TorchAirGe(),
    MsaccucmpNpy(),
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
