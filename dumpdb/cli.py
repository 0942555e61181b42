"""The ``dumpdb`` command line: a thin layer over the Python API.

Every command calls one function of :mod:`dumpdb` and only formats its result.
Exit codes: 0 success; 1 ingest finished but some files failed; 2 bad input
(missing or unrecognised dump, not an archive, bad query); 130 interrupted.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TaskProgressColumn,
                           TextColumn, TimeElapsedColumn, TimeRemainingColumn)
from rich.table import Table

import dumpdb
from dumpdb import output
from dumpdb.archive import default_archive_path
from dumpdb.errors import DumpdbError
from dumpdb.progress import Reporter

app = typer.Typer(
    name="dumpdb",
    help="Turn operator dumps (MindSpore, CANN, msprobe) into an indexed archive; query it with SQL.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err = Console(stderr=True, highlight=False)
out = Console(highlight=False)

ArchiveOpt = typer.Option(
    None, "--archive", "-a", envvar="DUMPDB_ARCHIVE", show_default="$DUMPDB_ARCHIVE or ./dumpdb.archive",
    help="Archive directory.")


def _archive_path(path: Optional[Path]) -> Path:
    return path if path is not None else default_archive_path()


def _fail(exc: Exception, code: int = 2) -> None:
    err.print(f"[red]error:[/red] {exc}", soft_wrap=True)
    raise typer.Exit(code)


def _human(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return str(n)


def _version_callback(value: bool) -> None:
    if value:
        out.print(f"dumpdb {dumpdb.__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version_callback, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """dumpdb: ingest dumps once, then query ops, iterations and statistics with SQL."""


class _RichReporter(Reporter):
    MAX_ERRORS_SHOWN = 20

    def __init__(self, quiet: bool):
        self.quiet = quiet
        self.errors = 0
        self.progress = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TaskProgressColumn(), TextColumn("{task.fields[read]}"), TimeElapsedColumn(), TimeRemainingColumn(),
            console=err, transient=False, disable=quiet,
        )
        self.task = None
        self.read = 0

    def scanning(self, dump_dir):
        if not self.quiet:
            err.print(f"scanning {dump_dir} ...", style="dim")

    def start(self, total, skipped):
        if skipped and not self.quiet:
            err.print(f"{skipped} tensors already in this run, skipped", style="dim")
        if total == 0:
            return  # nothing new: no empty progress bar
        self.progress.start()
        self.task = self.progress.add_task("ingesting", total=total, read="")

    def advance(self, tensors, bytes_read):
        self.read += bytes_read
        if self.task is not None:
            self.progress.update(self.task, advance=tensors, read=_human(self.read))

    def error(self, source_file, message):
        self.errors += 1
        if self.errors <= self.MAX_ERRORS_SHOWN:
            self.progress.console.print(f"[red]error:[/red] {message}", soft_wrap=True, markup=True,
                                        highlight=False) if message.startswith(source_file) else \
                self.progress.console.print(f"[red]error:[/red] {source_file}: {message}", soft_wrap=True)
        elif self.errors == self.MAX_ERRORS_SHOWN + 1:
            self.progress.console.print("[red]more errors: see ingest_errors in the catalog[/red]")

    def finish(self):
        self.progress.stop()


def _print_report(r) -> None:
    ratio = f"{r.ratio:.2f}x" if r.ratio else "-"
    err.print(
        f"run [bold]{r.run}[/bold] ({r.layout}) -> {r.archive}\n"
        f"  tensors: {r.tensors_added} added, {r.tensors_skipped} already there, "
        f"{r.deduplicated} deduplicated, {r.statistics_only} statistics-only, {len(r.errors)} failed\n"
        f"  bytes read {_human(r.bytes_read)}, payload {_human(r.bytes_in)}, stored {_human(r.bytes_stored)}, "
        f"ratio {ratio}, {r.seconds:.1f} s",
        highlight=False,
    )


@app.command()
def ingest(
    dump_dir: Path = typer.Argument(..., help="The dump 'path' directory, or any directory above rank_*."),
    archive: Optional[Path] = ArchiveOpt,
    run: Optional[str] = typer.Option(None, "--run", "-r", help="Run name (default: the dump directory's name)."),
    layout: Optional[str] = typer.Option(None, "--layout", help="Skip auto-detection; see 'dumpdb layouts'."),
    workers: Optional[int] = typer.Option(None, "--workers", "-j", min=1, help="Reader threads (default: cores + 1, max 4)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
) -> None:
    """Ingest a dump into an archive (created if missing). Re-running completes or skips."""
    reporter = _RichReporter(quiet)
    try:
        report = dumpdb.ingest(dump_dir, archive=_archive_path(archive), run=run, layout=layout,
                               workers=workers, reporter=reporter,
                               on_wait=lambda msg: err.print(msg, style="yellow"))
    except DumpdbError as exc:
        _fail(exc)
    _print_report(report)
    if report.interrupted:
        err.print("[yellow]interrupted: what was committed stays; run the same command again to finish[/yellow]")
        raise typer.Exit(130)
    if report.errors:
        err.print(f"[red]{len(report.errors)} file(s) failed[/red]; they are listed in ingest_errors "
                  f"(dumpdb sql \"SELECT * FROM ingest_errors WHERE run = '{report.run}'\")")
        raise typer.Exit(1)


@app.command()
def sql(
    query: str = typer.Argument(..., help="SQL over runs, tensors, blobs, arrays, ops, execution_order, ..."),
    archive: Optional[Path] = ArchiveOpt,
    fmt: str = typer.Option("table", "--format", "-f", help="table | csv | json | parquet"),
    output_file: Optional[Path] = typer.Option(None, "--output", "-o", help="Write to this file (required for parquet)."),
    max_rows: int = typer.Option(50, "--max-rows", help="Rows shown by --format table (0: all)."),
) -> None:
    """Run a read-only SQL query on the catalog."""
    if fmt not in output.FORMATS:
        _fail(DumpdbError(f"unknown --format {fmt!r}; use one of {', '.join(output.FORMATS)}"))
    if fmt == "parquet" and output_file is None:
        _fail(DumpdbError("--format parquet needs --output FILE"))
    try:
        table = dumpdb.open(_archive_path(archive)).sql(query)
    except DumpdbError as exc:
        _fail(exc)
    if fmt == "table":
        if output_file is not None:
            with open(output_file, "w", encoding="utf-8") as f:
                output.write_table(table, Console(file=f, width=200), max_rows or None)
        else:
            output.write_table(table, out, max_rows or None)
    elif fmt == "csv":
        output.write_csv(table, output_file or sys.stdout)
    elif fmt == "json":
        output.write_json(table, output_file or sys.stdout)
    else:
        output.write_parquet(table, output_file)
    if output_file is not None:
        err.print(f"{table.num_rows} rows written to {output_file}", style="dim")


@app.command()
def runs(archive: Optional[Path] = ArchiveOpt) -> None:
    """List the runs of an archive."""
    try:
        table = dumpdb.open(_archive_path(archive)).runs()
    except DumpdbError as exc:
        _fail(exc)
    if table.num_rows == 0:
        err.print("no runs yet: add one with 'dumpdb ingest DUMP_DIR'")
        return
    view = Table(header_style="bold")
    for col in ("run", "status", "tensors", "payload", "ingested"):
        view.add_column(col, no_wrap=True)
    for col in ("layout", "framework", "source"):
        view.add_column(col, overflow="fold")
    for r in table.to_pylist():
        fw = " ".join(x for x in (r["framework"], r["framework_version"]) if x)
        view.add_row(r["run"], r["status"], str(r["tensors"]), _human(r["bytes_in"]),
                     r["ingest_started"].strftime("%Y-%m-%d %H:%M"), r["layout"], fw, r["source_path"])
    out.print(view)


@app.command()
def show(run: str = typer.Argument(..., help="Run name."), archive: Optional[Path] = ArchiveOpt) -> None:
    """Summarise one run: ranks, graphs, iterations, tensors, bytes in/stored, ratio."""
    try:
        info = dumpdb.open(_archive_path(archive)).show(run)
    except DumpdbError as exc:
        _fail(exc)

    def span(values):
        if not values:
            return "-"
        if len(values) > 12:
            return f"{len(values)} ({values[0]}..{values[-1]})"
        return ", ".join(str(v) for v in values)

    ratio = f"{info['ratio']:.2f}x" if info["ratio"] else "-"
    lines = [
        ("run", info["run"]), ("status", info["status"]), ("source", info["source_path"]),
        ("layout", info["layout"]),
        ("framework", " ".join(str(x) for x in (info["framework"], info["framework_version"], info["device_target"]) if x)),
        ("ingested", f"{info['ingest_started']:%Y-%m-%d %H:%M:%S} by dumpdb {info['dumpdb_version']}"),
        ("ranks", span(info["ranks"])), ("graphs", span(info["graphs"])), ("iterations", span(info["iterations"])),
        ("tensors", f"{info['tensors']} ({info['statistics_only']} statistics-only, "
                    f"{info['deduplicated']} deduplicated, {info['distinct_payloads']} distinct payloads)"),
        ("bytes in", _human(info["bytes_in"])), ("bytes stored", _human(info["bytes_stored"])), ("ratio", ratio),
        ("ingest errors", str(info["errors"])),
    ]
    width = max(len(k) for k, _ in lines)
    for k, v in lines:
        out.print(f"[bold]{k.ljust(width)}[/bold]  {v}", highlight=False)


@app.command()
def layouts() -> None:
    """List the dump layouts dumpdb reads, with the document each comes from."""
    from dumpdb.layouts import LAYOUTS

    view = Table(header_style="bold")
    for col in ("layout", "description", "source"):
        view.add_column(col, overflow="fold")
    for lay in LAYOUTS:
        view.add_row(lay.name, lay.description, lay.document)
    out.print(view)


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except KeyboardInterrupt:
        err.print("[yellow]interrupted[/yellow]")
        sys.exit(130)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
