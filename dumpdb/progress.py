"""Progress callbacks of :func:`dumpdb.ingest` (the CLI draws a rich progress bar)."""

from __future__ import annotations

from pathlib import Path


class Reporter:
    """Receives ingest progress. Every method is a no-op here; override what you need.

    ``start(total, skipped)``: tensors to ingest and tensors already in the run;
    ``advance(tensors, bytes_read)``: after each tensor is read;
    ``error(source_file, message)``: a file that could not be ingested;
    ``changed(source_file, detail)``: a file already in the run whose content changed
    (or, with ``moved``, that differs at the new location), once per file.
    Raising KeyboardInterrupt from a callback interrupts the ingest cleanly.
    """

    def scanning(self, dump_dir: Path) -> None: ...
    def start(self, total: int, skipped: int) -> None: ...
    def advance(self, tensors: int, bytes_read: int) -> None: ...
    def error(self, source_file: str, message: str) -> None: ...
    def changed(self, source_file: str, detail: str) -> None: ...
    def finish(self) -> None: ...
