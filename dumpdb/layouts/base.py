"""What every layout reader produces: a :class:`DumpScan` of :class:`TensorEntry`.

A reader turns a dump directory into catalog material without reading tensor
payloads: names parsed, metadata and graphs read. Payloads are read later, in
the ingest pipeline, through :meth:`Layout.load`. Every reader fills the same
fields; what a layout does not have stays None, never invented.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from dumpdb.dumpio import read_dump_text, reason
from dumpdb.errors import DumpdbError, DumpFileError

# metadata files (.dump_metadata/*) are small JSON/text; their text goes into runs.metadata
MAX_METADATA_BYTES = 16 << 20


@dataclass(slots=True)
class TensorEntry:
    """One dumped tensor, as named by the dump (no payload read yet).

    ``source_file`` is relative to the ingested directory, as on disk (shown in
    the catalog); ``path`` is what to open (None: statistics only). For files
    holding several tensors, ``io`` + ``slot`` tell them apart.
    """

    source_file: str
    path: str | None
    rank: int | None = None
    net_name: str | None = None
    graph_id: int | None = None
    iteration: int | None = None
    op_type: str | None = None
    op_name: str | None = None
    scope_name: str | None = None
    task_id: int | None = None
    stream_id: int | None = None
    timestamp: int | None = None
    io: str | None = None
    slot: int | None = None
    format: str | None = None
    dtype_declared: str | None = None
    shape_declared: tuple[int, ...] | None = None
    stats: dict[str, Any] | None = None  # from the dump's own statistics (statistic.csv)
    checksum: str | None = None
    checksum_algo: str | None = None
    note: str | None = None
    size: int | None = None  # bytes of the file at ``path``, if the scan saw it
    # Identity within the run. None means ``source_file``; a reader MUST set it
    # when one file holds several tensors (``{source_file}#{suffix}``).
    tensor_key: str | None = None
    device_id: int | None = None
    model_name: str | None = None
    model_id: int | None = None
    step: int | None = None
    original_shape: tuple[int, ...] | None = None
    original_format: str | None = None
    direction: str | None = None  # 'forward' | 'backward'
    call_index: int | None = None
    arg_name: str | None = None
    slot_path: str | None = None
    requires_grad: bool | None = None
    csv_line: int | None = None  # the statistics csv line of a statistics-only row (error lines name it)

    @property
    def key(self) -> str:
        """Identity within a run (the catalog's ``tensor_key``)."""
        return self.tensor_key or self.source_file

    def payload_path(self) -> str:
        """``path``, for a layout's ``load``; :class:`DumpFileError` if the entry is statistics only
        (the ingest never loads those: it checks ``path`` first)."""
        if self.path is None:
            raise DumpFileError(f"{self.source_file}: statistics only; no tensor data")
        return self.path


@dataclass(frozen=True)
class LoadedTensor:
    """A payload read from disk: ``array`` in the dtype its bytes really are."""

    array: np.ndarray
    note: str | None = None


@dataclass
class StatisticsFile:
    """A statistics csv whose rows are statistics-only tensors (but those of ``claimed``),
    left for the ingest to stream in Arrow batches instead of one :class:`TensorEntry` per row
    (issue 12: a 10^7-row statistic.csv in bounded memory).

    ``source_file``: the csv relative to the ingested directory; ``fields``: the
    directory's catalog fields (rank, net_name, graph_id, iteration); ``scopes``:
    ``{op_name: scope_name}`` for non-Parameter rows and ``params``: ``{op_name:
    scope_name}`` for Parameter rows (what linking to the graph found); ``size``: bytes;
    ``claimed``: identities (:func:`dumpdb.layouts.mindspore_kit.row_identity`) of the tensor
    files beside the csv, whose rows already gave those files their statistics (a csv beside
    tensor files, issue 30 item 12): not statistics-only rows.
    """

    path: str
    source_file: str
    fields: dict[str, Any] = field(default_factory=dict)
    scopes: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    size: int = 0
    claimed: frozenset[str] = frozenset()


@dataclass
class DumpScan:
    """Everything a reader found in a dump, ready for the catalog."""

    layout: str
    root: Path
    entries: list[TensorEntry] = field(default_factory=list)
    framework: str | None = None
    framework_version: str | None = None
    device_target: str | None = None
    dump_config: str | None = None  # JSON text
    metadata: dict[str, Any] = field(default_factory=dict)
    ops: list[dict[str, Any]] = field(default_factory=list)
    execution_order: list[dict[str, Any]] = field(default_factory=list)
    graph_executions: list[dict[str, Any]] = field(default_factory=list)
    # rows of overflows / call_stacks / module_tree (without the run column)
    overflows: list[dict[str, Any]] = field(default_factory=list)
    call_stacks: list[dict[str, Any]] = field(default_factory=list)
    module_tree: list[dict[str, Any]] = field(default_factory=list)
    msprobe_records: list[dict[str, Any]] = field(default_factory=list)  # dump.json records, in order
    errors: list[tuple[str, str]] = field(default_factory=list)  # (source_file, message)
    # statistics-only csv files streamed by the ingest (StatisticsFile); rows not in entries
    statistics_files: list[StatisticsFile] = field(default_factory=list)


class Layout:
    """A dump layout: how to recognise it and how to read it.

    Subclasses set ``name``, ``description`` and ``document`` (the source
    document the rules come from) and implement :meth:`detect`, :meth:`scan`
    and :meth:`load`.
    """

    name: str = ""
    description: str = ""
    document: str = ""
    # Detection order (lower first): in one directory the first layout whose detect()
    # is True wins, so a layout that is a special case of another has a lower number.
    priority: int = 100
    # Layouts of one family that tell themselves apart with one probe set this to a
    # function (directory -> the matching layout's name or None): detection then calls
    # it once per directory for the whole family instead of each member's detect().
    classify: Callable[[Path], str | None] | None = None
    # Where the dump's own statistics (TensorEntry.stats) come from: the
    # catalog's stats_source says this, or this + '+computed'.
    stats_label: str = "statistic.csv"

    def detect(self, root: Path) -> bool:
        """True if ``root`` holds a dump of this layout (cheap: names only)."""
        raise NotImplementedError

    def scan(self, root: Path) -> DumpScan:
        """Parse names, metadata and graphs under ``root`` (no payloads)."""
        raise NotImplementedError

    def load(self, entry: TensorEntry) -> LoadedTensor:
        """Read one entry's payload; raises DumpFileError naming the file."""
        raise NotImplementedError


_REGISTRY: dict[str, Layout] = {}


_L = TypeVar("_L", bound="type[Layout]")


def register(cls: _L) -> _L:
    """Class decorator: make layout ``cls`` known to detection, ``--layout`` and
    ``dumpdb layouts`` (one instance, keyed by ``cls.name``). Raises ValueError for
    a duplicate or empty name."""
    if not cls.name or cls.name in _REGISTRY:
        raise ValueError(f"layout name {cls.name!r} is empty or already registered")
    _REGISTRY[cls.name] = cls()
    return cls


def registered() -> list[Layout]:
    """Every registered layout, in detection order (``priority``, then name)."""
    return sorted(_REGISTRY.values(), key=lambda lay: (lay.priority, lay.name))


# a backslash the reader of a name would take for an escape of display_name: written \x5c
_LOOKS_ESCAPED = re.compile(r"\\(?=x[0-9a-f]{2}|u[0-9a-f]{4})")


def display_name(name: str) -> str:
    """A file name (or a name read from a dump's text) as text the catalog can hold, injectively.

    Names that are not valid UTF-8 come from ``os.listdir`` with surrogate escapes
    (U+DC80-U+DCFF); each such byte is written ``\\xNN`` (lower-case hex). Any other lone
    surrogate (valid JSON such as ``"\\ud800"`` decodes to one) is written ``\\uNNNN``. So
    that no two names give the same text (issue 30, item 11: a raw 0xff byte and the four
    characters ``\\xff`` collided), a backslash that would read as such an escape is
    itself written ``\\x5c``. Every other name, valid UTF-8 without ``\\xNN``/``\\uNNNN``
    text in it, is kept as it is, as every earlier dumpdb stored it: existing archives'
    names read the same. Apply it once to a name: the result is not a fixed point.
    """
    if "\\" in name:
        name = _LOOKS_ESCAPED.sub(r"\\x5c", name)
    try:
        name.encode("utf-8")
        return name
    except UnicodeEncodeError:
        pass
    out = []
    for ch in name:
        code = ord(ch)
        if 0xDC80 <= code <= 0xDCFF:
            out.append(f"\\x{code - 0xDC00:02x}")
        elif 0xD800 <= code <= 0xDFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(ch)
    return "".join(out)


def encodable(text: str) -> bool:
    """True if ``text`` is valid UTF-8 text (no lone surrogate): the catalog can hold it as is."""
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def find_dirs(start: Path, match: Callable[[str], object], max_depth: int) -> list[Path]:
    """Directories at or below ``start`` whose name satisfies ``match``.

    Breadth-first over at most ``max_depth`` levels; a matching directory is
    returned and not searched inside; hidden directories and symlinks are not
    followed. Only directory names are read (cheap enough for ``detect``).
    """
    if match(start.name) and start.is_dir():
        return [start]
    found: list[Path] = []
    frontier = [start]
    for _ in range(max_depth + 1):
        nxt = []
        for d in frontier:
            try:
                with os.scandir(d) as entries:
                    subdirs = [e for e in entries if e.is_dir(follow_symlinks=False)]
            except OSError:
                continue
            for e in subdirs:
                if match(e.name):
                    found.append(Path(e.path))
                elif not e.name.startswith("."):
                    nxt.append(Path(e.path))
        frontier = nxt
    return sorted(found)


def read_metadata_dir(root: Path, meta_dir: Path, scan: DumpScan) -> dict[str, str]:
    """Read every file of a metadata directory (``.dump_metadata``, ``.metadata``).

    Each goes into ``scan.metadata`` under its path relative to ``root``
    (parsed if ``.json``); unreadable files and invalid JSON are recorded in
    ``scan.errors``. Returns ``{file name: text}`` for callers that pick
    particular files (e.g. ``data_dump.json`` as the dump config).
    """
    texts: dict[str, str] = {}
    if not meta_dir.is_dir() or meta_dir.is_symlink():
        return texts
    for path in sorted(meta_dir.iterdir()):
        if path.is_dir():
            continue
        rel = display_name(os.path.relpath(path, root))
        try:  # regular files inside the dump only, bounded (dumpdb.dumpio)
            text = read_dump_text(path, rel, MAX_METADATA_BYTES)
        except DumpdbError as exc:
            scan.errors.append((rel, f"cannot read metadata: {reason(exc, rel)}"))
            continue
        value: object = text
        if path.suffix == ".json":
            try:
                value = load_json(text, rel)
            except DumpdbError as exc:
                scan.errors.append((rel, reason(exc, rel)))
        scan.metadata[rel] = value
        texts[path.name] = text
    return texts


def load_json(text: str, where: str) -> Any:
    """``json.loads`` that fails with one line: :class:`~dumpdb.errors.DumpFileError`
    naming ``where`` for invalid JSON and for nesting too deep for Python's parser
    (a ``dump.json`` nested 100,000 levels deep raises RecursionError in ``json``)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise DumpFileError(f"{where}: invalid JSON: {exc.msg} at line {exc.lineno}") from None
    except RecursionError:
        raise DumpFileError(f"{where}: JSON nested too deeply to read; refused") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise DumpFileError(f"{where}: invalid JSON: {' '.join(str(exc).split())[:120]}") from None


def known_match(pattern: re.Pattern[str], text: str) -> re.Match[str]:
    """``pattern.match(text)`` for a name the caller kept because it matched (a listing filtered by
    ``pattern``); ValueError if it does not, which would be a bug of that caller."""
    m = pattern.match(text)
    if m is None:
        raise ValueError(f"{text!r} does not match {pattern.pattern!r}")
    return m


def names_mostly_match(names: list[str], pattern: re.Pattern) -> bool:
    """True if at least one and at least half of ``names`` match ``pattern``
    (detection of flat layouts whose only signature is the file name grammar)."""
    matched = sum(1 for n in names if pattern.match(n))
    return matched > 0 and 2 * matched >= len(names)


def file_sizes(directory: str | os.PathLike[str]) -> dict[str, int]:
    """``{name: bytes}`` of the non-directory entries of ``directory`` (symlinks followed).

    An entry whose stat fails (unreadable, symlink loop) gets size 0 and stays listed,
    so that reading it reports what is wrong. Raises OSError if the directory cannot
    be listed.
    """
    sizes: dict[str, int] = {}
    with os.scandir(directory) as entries:
        for e in entries:
            try:
                if e.is_dir():
                    continue
                sizes[e.name] = e.stat().st_size
            except OSError:
                sizes[e.name] = 0
    return sizes
