"""Layouts whose only structure is a file-name grammar of ``.npy`` files.

msaccucmp-converted dumps and MindSpore ``ops.TensorDump`` output are flat
directories of ``.npy`` files; what a tensor is comes from its name alone.
:class:`FlatNpyLayout` holds what they share: detection by name, the scan loop
and per-file name errors. A subclass gives ``name_re``, ``grammar`` and
:meth:`~FlatNpyLayout.parse_name`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

from dumpdb.errors import LayoutError
from dumpdb.layouts.base import DumpScan, Layout, TensorEntry, display_name, names_mostly_match


def top_npy_names(root: Path) -> list[str]:
    """Names of the ``.npy`` files directly in ``root``; if none, those one level down."""
    def listing(d: Path) -> tuple[list[str], list[Path]]:
        files, dirs = [], []
        try:
            with os.scandir(d) as it:
                for e in it:
                    if e.name.startswith("."):
                        continue
                    if e.is_dir(follow_symlinks=False):
                        dirs.append(Path(e.path))
                    elif e.name.endswith(".npy"):
                        files.append(e.name)
        except OSError:
            pass
        return files, dirs

    files, dirs = listing(Path(root))
    if files:
        return files
    out: list[str] = []
    for d in dirs:
        out.extend(listing(d)[0])
    return out


def walk_npy(root: Path) -> Iterator[tuple[Path, list[str]]]:
    """(directory, sorted .npy names) for every directory under ``root`` (hidden ones skipped)."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        names = sorted(f for f in filenames if f.endswith(".npy"))
        if names:
            yield Path(dirpath), names


class FlatNpyLayout(Layout):
    """A flat ``.npy`` layout. Subclasses set ``name_re``/``grammar`` and implement
    :meth:`parse_name`; ``framework`` is recorded on the run."""

    name_re: re.Pattern
    grammar: str = ""
    framework: str | None = None

    def parse_name(self, name: str) -> dict:
        """TensorEntry fields of a file name; raises ValueError(reason) if it does not follow."""
        raise NotImplementedError

    def sort_key(self, entry: TensorEntry):
        return entry.source_file

    def detect(self, root: Path) -> bool:
        """Most ``.npy`` files at the top (or one level down) follow the grammar."""
        return names_mostly_match(top_npy_names(Path(root)), self.name_re)

    def scan(self, root: Path) -> DumpScan:
        root = Path(root)
        if not root.is_dir():
            raise LayoutError(f"{root}: not a directory")
        scan = DumpScan(layout=self.name, root=root, framework=self.framework)
        for directory, names in walk_npy(root):
            for name in names:
                path = directory / name
                source_file = display_name(os.path.relpath(path, root))
                try:
                    fields = self.parse_name(name)
                except ValueError as exc:
                    scan.errors.append((source_file, str(exc)))
                    continue
                try:
                    size = path.stat().st_size
                except OSError:
                    size = None
                scan.entries.append(TensorEntry(source_file=source_file, path=str(path), size=size, **fields))
        scan.entries.sort(key=self.sort_key)
        return scan
