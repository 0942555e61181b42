"""Is a file the run already holds still the same? (README "Re-ingesting: changed and moved dumps")

Every tensor row records its source file's size and modification time
(``tensors.source_size``, ``tensors.source_mtime_ns``, migration 009) next to the
content hash of its payload. A re-ingest compares those with ``os.stat`` of the file
now, which reads nothing of it:

* size and mtime equal: the file is taken as unchanged and **not read**;
* either differs: the file is read and hashed; the same hash means it was only
  touched (the new size/mtime are recorded), another hash means it **changed**.

A dump continued from a new location (``moved``) is checked by name and size (files
copied without ``-p`` get new mtimes, so mtime is not compared); ``verify_hash`` also
reads and hashes every file the run holds. Rows ingested before migration 009 have no
size or mtime: they are checked by name only (and by hash with ``verify_hash``).

Statistics-only rows (no payload file) are not checked; one whose file the layout can
read now (a ``.pt`` dump ingested without PyTorch, re-ingested with it) is **filled in**:
its payload is read and stored, its row replaced (``IdentityPlan.fill``; issue 30).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime

from dumpdb.layouts import TensorEntry


@dataclass(frozen=True)
class Held:
    """What the catalog holds of one tensor of the run (a ``tensors`` row)."""

    tensor_key: str
    source_file: str
    source_size: int | None
    source_mtime_ns: int | None
    content_hash: str | None


@dataclass
class IdentityPlan:
    """What a re-ingest must do about the tensors a run already holds.

    ``changed``: ``(source_file, detail)``, one per file whose content differs;
    ``missing``: files the run holds that the dump lacks (``moved`` only);
    ``replace``: tensor_key -> the content hash it has now, for the tensors of changed
    files (what ``update`` stores anew); ``touched``: rows
    ``{tensor_key, source_size, source_mtime_ns}`` of files whose size or mtime changed
    but whose content did not (their identity is recorded anew, nothing is stored).
    """

    changed: list[tuple[str, str]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    replace: dict[str, str] = field(default_factory=dict)
    touched: list[dict] = field(default_factory=list)
    fill: dict[str, str] = field(default_factory=dict)  # statistics-only rows whose payload is readable now


def file_identity(path: str | None) -> tuple[int, int] | None:
    """``(st_size, st_mtime_ns)`` of the file at ``path`` (symlinks followed), None if absent."""
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def _when(mtime_ns: int) -> str:
    return f"{datetime.fromtimestamp(mtime_ns / 1e9):%Y-%m-%d %H:%M:%S}"


def plan(held: Iterable[Held], entries: Iterable[TensorEntry], *, moved: bool, verify_hash: bool,
         hash_of: Callable[[list[TensorEntry]], dict[str, tuple[str | None, str | None]]]) -> IdentityPlan:
    """Compare the run's ``held`` rows with the dump's ``entries`` (module docstring).

    ``hash_of(entries)`` reads the given entries and returns tensor_key ->
    ``(content_hash, error)``; it is called once, with only the entries that need reading.
    """
    by_key = {e.key: e for e in entries}
    result = IdentityPlan()
    to_hash: list[tuple[Held, TensorEntry, tuple[int, int]]] = []
    size_differs: list[tuple[Held, tuple[int, int]]] = []
    for h in held:
        entry = by_key.get(h.tensor_key)
        if entry is None:
            if moved:
                result.missing.append(h.source_file)
            continue
        if h.content_hash is None and entry.path is not None:
            result.fill[h.tensor_key] = ""  # stored statistics-only, its payload readable now: fill it in
            continue
        if entry.path is None or h.content_hash is None:
            continue  # statistics only
        now = file_identity(entry.path)
        if now is None:
            continue  # gone between scan and now: the ingest reports it if it reads it
        if h.source_size is None:  # ingested before migration 009
            if moved and verify_hash:  # hashed: its identity is recorded if the content matches
                to_hash.append((h, entry, now))
            continue  # never recorded unverified
        if moved and now[0] != h.source_size:
            size_differs.append((h, now))
        elif (moved and verify_hash) or (not moved and (now[0], now[1]) != (h.source_size, h.source_mtime_ns)):
            to_hash.append((h, entry, now))
        elif moved and now[1] != h.source_mtime_ns:
            result.touched.append({"tensor_key": h.tensor_key, "source_size": now[0], "source_mtime_ns": now[1]})
    hashes = hash_of([e for _, e, _ in to_hash]) if to_hash else {}
    seen: set[str] = set()

    def change(h: Held, detail: str) -> None:
        result.replace[h.tensor_key] = h.content_hash or ""
        if h.source_file not in seen:
            seen.add(h.source_file)
            result.changed.append((h.source_file, detail))

    for h, now in size_differs:
        change(h, f"size {h.source_size} -> {now[0]} bytes")
    for h, entry, now in to_hash:
        new_hash, error = hashes.get(entry.key, (None, "not read"))
        if error is None and new_hash == h.content_hash:
            result.touched.append({"tensor_key": h.tensor_key, "source_size": now[0], "source_mtime_ns": now[1]})
            continue
        facts = []
        if h.source_size is not None and now[0] != h.source_size:
            facts.append(f"size {h.source_size} -> {now[0]} bytes")
        if h.source_mtime_ns is not None and now[1] != h.source_mtime_ns:
            facts.append(f"modified {_when(now[1])}")
        what = f"unreadable now ({error})" if error else "content differs"
        change(h, what + (f" ({', '.join(facts)})" if facts else ""))
    return result
