"""An ingest's progress on a terminal: :class:`RichReporter`, the CLI's
:class:`~dumpdb.progress.Reporter` (a rich progress bar on stderr and one line per error,
the first :data:`MAX_ERRORS_SHOWN`)."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from dumpdb.progress import Reporter
from dumpdb.render.text import human

MAX_ERRORS_SHOWN = 20  # then one line pointing at ingest_errors


class RichReporter(Reporter):
    """Progress of an ingest on ``console`` (stderr); ``quiet``: no bar, no scanning line
    (errors and changed files are still printed)."""

    def __init__(self, console: Console, quiet: bool = False) -> None:
        self.quiet = quiet
        self.console = console
        self.errors = 0
        self.progress = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TaskProgressColumn(), TextColumn("{task.fields[read]}"), TimeElapsedColumn(), TimeRemainingColumn(),
            console=console, transient=False, disable=quiet,
        )
        self.task: Any = None
        self.read = 0
        self.pending = 0  # tensors advanced, not yet shown
        self.shown = 0.0  # when the bar was last updated (time.monotonic)

    def scanning(self, dump_dir: Any) -> None:
        if not self.quiet:
            self.console.print(Text(f"scanning {dump_dir} ...", style="dim"), soft_wrap=True)

    def start(self, total: int, skipped: int) -> None:
        if skipped and not self.quiet:
            self.console.print(Text(f"{skipped} tensors already in this run, skipped", style="dim"), soft_wrap=True)
        if total == 0:
            return  # nothing new: no empty progress bar
        self.progress.start()
        self.task = self.progress.add_task("ingesting", total=total, read="")

    def advance(self, tensors: int, bytes_read: int) -> None:
        # called once per file: the bar is updated every 0.1 s at most (rich's update and
        # the byte count's text cost ~10 us, a tenth of a tiny file's whole ingest)
        self.read += bytes_read
        self.pending += tensors
        if self.task is not None and not self.quiet:
            now = time.monotonic()
            if now - self.shown >= 0.1:
                self.shown = now
                self.progress.update(self.task, advance=self.pending, read=human(self.read))
                self.pending = 0

    def error(self, source_file: str, message: str) -> None:
        self.errors += 1
        if self.errors <= MAX_ERRORS_SHOWN:
            line = message if message.startswith(source_file) else f"{source_file}: {message}"
            self.progress.console.print(Text.assemble(("error: ", "red"), line), soft_wrap=True)
        elif self.errors == MAX_ERRORS_SHOWN + 1:
            self.progress.console.print(Text("more errors: see ingest_errors in the catalog", style="red"))

    def changed(self, source_file: str, detail: str) -> None:
        self.progress.console.print(Text.assemble(("changed: ", "yellow"), f"{source_file}: {detail}"),
                                    soft_wrap=True)

    def finish(self) -> None:
        if self.task is not None and self.pending and not self.quiet:
            self.progress.update(self.task, advance=self.pending, read=human(self.read))
            self.pending = 0
        self.progress.stop()
