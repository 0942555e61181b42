"""The ``dumpdb`` command line: a thin layer over the Python API.

Every command calls one function of :mod:`dumpdb` and only formats its result.
Exit codes: 0 success; 1 ingest finished but some files failed; 2 bad input
(missing or unrecognised dump, not an archive, bad query); 130 interrupted.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Optional

import pyarrow.compute as pa_compute
import typer
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
from rich.table import Table

import dumpdb
from dumpdb.archive import default_archive_path
from dumpdb.errors import DumpdbError
from dumpdb.progress import Reporter
from dumpdb.render import tables as output

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
    if not query.strip():
        _fail(DumpdbError("empty query"))
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
                output.write_table(table, Console(file=f, width=200), max_rows if max_rows > 0 else None)
        else:
            output.write_table(table, out, max_rows if max_rows > 0 else None)
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


def _thresholds(pairs: list[str]):
    from dumpdb.compare.verdict import Thresholds

    values = {}
    for item in pairs:
        key, sep, value = item.partition("=")
        if not sep:
            raise DumpdbError(f"--threshold {item!r}: write NAME=VALUE")
        try:
            values[key.strip()] = float(value)
        except ValueError:
            raise DumpdbError(f"--threshold {item!r}: {value!r} is not a number") from None
    try:
        return Thresholds(**values)
    except TypeError:
        known = ", ".join(f.name for f in dataclasses.fields(Thresholds))
        raise DumpdbError(f"unknown threshold in {pairs}; known: {known}") from None


CompareTarget = typer.Argument(..., help="Target selection: RUN, RUN:ITERATION or RUN:ITERATION:RANK.")
CompareBench = typer.Argument(..., help="Bench (ground truth) selection, same form.")


def _run_compare(archive, target, bench, iteration, rank, mapping, strategy, mode, threshold, workers,
                 store: bool = True, rules: str = "precision"):
    """Run a comparison for the CLI (``store``: keep the results in the archive)."""
    from dumpdb.compare.engine import compare

    a = dumpdb.open(_archive_path(archive))
    strategies = tuple(s.strip() for s in strategy.split(",")) if strategy else None
    options = dict(iteration=iteration, rank=rank, mapping=mapping, mode=mode,
                   thresholds=_thresholds(threshold), workers=workers, store_results=store, rules=rules)
    if strategies:
        options["strategies"] = strategies
    with Progress(SpinnerColumn(), TextColumn("comparing"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err, transient=True) as bar:
        task = bar.add_task("compare", total=None)
        outcome = compare(a, target, bench, progress=lambda done, total: bar.update(task, completed=done, total=total),
                          **options)
    return outcome


def _print_divergence(fd, summary: dict | None = None) -> None:
    from dumpdb.compare import registry

    if fd is None:
        if summary is not None and summary.get("rules") == "precision":
            dtype = summary.get("precision_dtype") or "the dtypes'"
            out.print(f"[green]no departure beyond {dtype} precision[/green]", highlight=False)
        else:
            out.print("[green]no divergence: no pair fails the rule[/green]")
        return
    where = f"{fd['code_file']}:{fd['code_line']}  {fd['code_text']}" if fd.get("code_file") else "-"
    shown = [m for m in registry.metrics() if m.cli]
    metric = ", ".join(f"{m.name} {format(fd[m.name], m.display)}" for m in shown if isinstance(fd.get(m.name), float))
    out.print(f"[bold red]first divergence[/bold red]: iteration {fd['iteration']}, position {fd['position']}: "
              f"{fd['op_type']} {fd['io']}.{fd['slot']}", highlight=False)
    out.print(f"  op      {fd['target_name']}", highlight=False)
    if fd.get("origin_op"):
        out.print(f"  origin  {fd['origin_op']} (an op only the target has, produced this input)", highlight=False)
    out.print(f"  scope   {fd['scope_name'] or '-'}", highlight=False)
    out.print(f"  source  {where}", highlight=False)
    out.print(f"  metrics {metric or '-'}  ({fd['err_message'] or fd['result']})", highlight=False)
    for label in ("inputs", "outputs"):
        for e in fd.get(label) or []:
            err = "n/a" if e["scaled_err"] is None else f"{e['scaled_err']:.3g}"
            ratio = "" if e["ratio"] is None else f" = {e['ratio']:.3g} x floor"
            out.print(f"  {e['io']}.{e['slot']:<6} error {err}{ratio} ({e['target_dtype']} vs {e['bench_dtype']}, "
                      f"{e['result']})", highlight=False)
    if fd["path"]:
        out.print("  path    " + "\n          ".join(fd["path"]), highlight=False)


RulesOpt = typer.Option("precision", "--rules", help="Verdict rules for the summary and first divergence: "
                        "precision (default: departures beyond the dtypes' precision) or msprobe.")


@app.command("compare")
def compare_cmd(
    target: str = CompareTarget, bench: str = CompareBench, archive: Optional[Path] = ArchiveOpt,
    iteration: Optional[int] = typer.Option(None, "--iteration", "-i", help="Iteration for both sides (if not in the selection)."),
    rank: Optional[int] = typer.Option(None, "--rank", help="Rank for both sides (if not in the selection)."),
    mapping: Optional[Path] = typer.Option(None, "--mapping", "-m", help="Name mapping file (CSV target,bench or YAML; msprobe mapping yaml)."),
    strategy: Optional[str] = typer.Option(None, "--strategy", help="Alignment strategies in order, e.g. exact,normalized,sequence,order."),
    mode: str = typer.Option("auto", "--mode", help="auto | tensor | statistics"),
    threshold: list[str] = typer.Option([], "--threshold", "-t", help="Verdict threshold NAME=VALUE (repeatable)."),
    csv_file: Optional[Path] = typer.Option(None, "--csv", help="Write msprobe-compatible compare_result CSV."),
    parquet_file: Optional[Path] = typer.Option(None, "--parquet", help="Write all result columns as Parquet."),
    html: Optional[Path] = typer.Option(None, "--html", help="Write a self-contained HTML report."),
    workers: Optional[int] = typer.Option(None, "--workers", "-j", min=1, help="Metric workers (default: cores; processes for comparisons >= 64 MB)."),
    show: int = typer.Option(20, "--show", help="Failing pairs to list (0: none)."),
    fail_on: Optional[str] = typer.Option(None, "--fail-on", help="Exit 1 if any pair is 'error' (or 'warning')."),
    store: bool = typer.Option(True, "--store/--no-store", help="Keep the results in the archive (compares, compare_results)."),
    rules: str = RulesOpt,
) -> None:
    """Compare two runs, or two iterations/ranks of one run, tensor by tensor."""
    if fail_on not in (None, "error", "warning"):
        _fail(DumpdbError(f"--fail-on {fail_on!r}: use error or warning"))
    try:
        outcome = _run_compare(archive, target, bench, iteration, rank, mapping, strategy, mode, threshold, workers,
                               store, rules)
    except DumpdbError as exc:
        _fail(exc)
    except OSError as exc:
        _fail(DumpdbError(f"{getattr(exc, 'filename', '') or 'compare'}: {exc.strerror or exc}"))
    sm = outcome.summary
    if sm["pairs"] == 0:
        out.print(f"[yellow]no pairs formed between {sm['target']} and {sm['bench']}[/yellow] "
                  f"({sm['unmatched_target']} target, {sm['unmatched_bench']} bench tensors unmatched): "
                  "check the selections (iteration, rank) or give a --mapping", highlight=False)
    out.print(f"compare {sm['compare_id'] or '(not stored)'}: [bold]{sm['target']}[/bold] vs [bold]{sm['bench']}[/bold] "
              f"({sm['mode']}): {sm['pairs']} pairs: [green]{sm['pass']} pass[/green], "
              f"[yellow]{sm['warning']} warning[/yellow], [red]{sm['error']} error[/red]; unmatched "
              f"{sm['unmatched_target']} target, {sm['unmatched_bench']} bench", highlight=False)
    strategies = ", ".join(f"{k} {v}" for k, v in sm["strategies"].items() if v)
    out.print(f"  matched by {strategies or '-'}", highlight=False)
    diff = sm.get("first_difference")
    if diff is None and sm["pairs"]:
        out.print("  every pair is identical", highlight=False)
    elif diff is None:
        pass
    else:
        out.print(f"  first difference: iteration {diff['iteration']}, position {diff['position']}: "
                  f"{diff['target_name']} {diff['io']}.{diff['slot']} (max_abs_err {diff['max_abs_err']}, "
                  f"cosine {diff['cosine']}, {diff['target_dtype']} vs {diff['bench_dtype']}, {diff['result']})",
                  highlight=False)
    _print_divergence(outcome.first_divergence, sm)
    verdicts = "result" if sm.get("rules") == "msprobe" else "precision_result"
    failing = outcome.results.filter(pa_compute.not_equal(outcome.results[verdicts], "pass"))
    if show and failing.num_rows:
        cols = ["pair_index", "iteration", "op_type", "target_name", "io", "slot", "cosine", "max_abs_err",
                "max_rel_err", verdicts]
        output.write_table(failing.select(cols), out, show)
    if outcome.unmatched.num_rows:
        names = outcome.unmatched.to_pylist()
        out.print(f"unmatched ({len(names)}): " + ", ".join(
            f"{u['side']}:{u['name']}.{u['io']}.{u['slot']}" for u in names[:12]) + (" ..." if len(names) > 12 else ""),
            highlight=False)
    try:
        _write_compare_outputs(outcome, csv_file, parquet_file, html)
    except OSError as exc:
        _fail(DumpdbError(f"{exc.filename or 'output'}: {exc.strerror or exc}"))
    if fail_on and (sm["error"] or (fail_on == "warning" and sm["warning"])):
        raise typer.Exit(1)


def _write_compare_outputs(outcome, csv_file, parquet_file, html) -> None:
    from dumpdb.render import msprobe_csv as export

    sm = outcome.summary
    if csv_file:
        export.write_msprobe_csv(outcome.results, csv_file)
        err.print(f"msprobe-compatible CSV written to {csv_file}", style="dim")
    if parquet_file:
        export.write_parquet(outcome.results, parquet_file)
        err.print(f"Parquet written to {parquet_file}", style="dim")
    if html:
        from dumpdb.render.report import write_compare_report

        write_compare_report(html, summary=sm, results=outcome.results, unmatched=outcome.unmatched,
                             first_divergence=outcome.first_divergence)
        err.print(f"HTML report written to {html}", style="dim")


@app.command("first-divergence")
def first_divergence_cmd(
    target: str = CompareTarget, bench: str = CompareBench, archive: Optional[Path] = ArchiveOpt,
    iteration: Optional[int] = typer.Option(None, "--iteration", "-i"),
    rank: Optional[int] = typer.Option(None, "--rank"),
    mapping: Optional[Path] = typer.Option(None, "--mapping", "-m"),
    strategy: Optional[str] = typer.Option(None, "--strategy"),
    mode: str = typer.Option("auto", "--mode"),
    threshold: list[str] = typer.Option([], "--threshold", "-t"),
    workers: Optional[int] = typer.Option(None, "--workers", "-j", min=1),
    rules: str = RulesOpt,
) -> None:
    """The first op, in execution order, that departs: by default the first whose error
    exceeds its dtypes' precision and is not explained by its inputs' errors (--rules
    msprobe: the first output failing msprobe's rules); its scope, source line, metrics
    and its inputs' and outputs' errors. Exit 1 if there is one, 0 when nothing departs.
    (Nothing is stored: use 'dumpdb compare' to keep results.)"""
    try:
        outcome = _run_compare(archive, target, bench, iteration, rank, mapping, strategy, mode, threshold, workers,
                               store=False, rules=rules)
    except DumpdbError as exc:
        _fail(exc)
    _print_divergence(outcome.first_divergence, outcome.summary)
    if outcome.first_divergence is not None:
        raise typer.Exit(1)


@app.command("scan")
def scan_cmd(
    run: str = typer.Argument(..., help="Run name."), archive: Optional[Path] = ArchiveOpt,
    check: list[str] = typer.Option([], "--check", "-c", help="Check NAME or NAME:param=value,... (repeatable; default nan, inf, fp16_overflow, all_zero)."),
    iteration: Optional[int] = typer.Option(None, "--iteration", "-i"),
    rank: Optional[int] = typer.Option(None, "--rank"),
    all_hits: bool = typer.Option(False, "--all", help="Every hit, not only the first per check and iteration."),
    html: Optional[Path] = typer.Option(None, "--html", help="Write a self-contained HTML report."),
    list_checks: bool = typer.Option(False, "--list", help="List the checks and their parameters."),
    max_rows: int = typer.Option(50, "--max-rows"),
) -> None:
    """First NaN/Inf per iteration and rank, fp16 overflow, all-zero tensors and
    MindInsight watch conditions, answered from the catalog's statistics."""
    from dumpdb.checks import scan as scan_mod

    if list_checks:
        view = Table(header_style="bold")
        for col in ("check", "parameters", "reads tensors", "description"):
            view.add_column(col, overflow="fold")
        for name, c in scan_mod.CHECKS.items():
            params = ", ".join(f"{k}={v}" for k, v in (c.params or {}).items())
            view.add_row(name, params or "-", "yes" if c.needs_tensors else "no", c.description)
        out.print(view)
        return
    try:
        names, params = [], {}
        for spec in check:
            name, values = scan_mod.parse_check_spec(spec)
            names.append(name)
            if values:
                params[name] = values
        hits = dumpdb.open(_archive_path(archive)).scan(run, names or None, iteration=iteration, rank=rank,
                                                        params=params or None, first_only=not all_hits)
    except DumpdbError as exc:
        _fail(exc)
    cols = [c for c in ("check", "iteration", "rank", "position", "op_type", "op_name", "io", "slot", "value",
                        "code_line", "code_text") if c in hits.column_names]
    if hits.num_rows == 0:
        out.print("[green]no hits[/green]")
    else:
        output.write_table(hits.select(cols), out, max_rows or None)
    if html:
        from dumpdb.render.report import write_scan_report

        write_scan_report(html, run=run, summary={"run": run, "checks": names or "default", "hits": hits.num_rows},
                          hits=hits)
        err.print(f"HTML report written to {html}", style="dim")


@app.command()
def prune(
    run: str = typer.Argument(..., help="Run name."), archive: Optional[Path] = ArchiveOpt,
    keep_stats: bool = typer.Option(False, "--keep-stats", help="Required: payloads go, rows and statistics stay."),
    iterations: Optional[str] = typer.Option(None, "--iterations", help='MindSpore syntax, e.g. "0|5-8|100-120".'),
) -> None:
    """Drop a run's tensor payloads but keep its catalog rows and statistics
    (space comes back with 'dumpdb gc')."""
    if not keep_stats:
        _fail(DumpdbError("prune keeps rows and statistics and drops payloads: pass --keep-stats to confirm"))
    try:
        n = dumpdb.open(_archive_path(archive)).prune(run, iterations)
    except DumpdbError as exc:
        _fail(exc)
    out.print(f"pruned the payloads of {n} tensors of run {run}; run 'dumpdb gc' to reclaim the space",
              highlight=False)


@app.command("rm")
def rm_cmd(
    run: str = typer.Argument(..., help="Run name."), archive: Optional[Path] = ArchiveOpt,
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask."),
) -> None:
    """Delete a run from the catalog (space comes back with 'dumpdb gc')."""
    if not yes and not typer.confirm(f"delete run {run!r} and its comparisons?", default=False):
        raise typer.Exit(1)
    try:
        n = dumpdb.open(_archive_path(archive)).remove_run(run)
    except DumpdbError as exc:
        _fail(exc)
    out.print(f"removed run {run} ({n} tensors); run 'dumpdb gc' to reclaim the space", highlight=False)


@app.command()
def gc(archive: Optional[Path] = ArchiveOpt) -> None:
    """Reclaim store space no tensor uses any more (payloads other runs use stay).
    Run it when no other process uses the archive."""
    try:
        report = dumpdb.open(_archive_path(archive)).gc()
    except DumpdbError as exc:
        _fail(exc)
    out.print(f"reclaimed {_human(report.reclaimed)} ({_human(report.bytes_before)} -> {_human(report.bytes_after)}): "
              f"{report.arrays_deleted} arrays deleted, {report.packs_compacted} packs compacted, "
              f"{report.blobs_dropped} payloads dropped", highlight=False)


@app.command()
def migrate(archive: Optional[Path] = ArchiveOpt) -> None:
    """Upgrade the catalog schema (also done automatically on open; a copy goes to backups/)."""
    from dumpdb.archive import CATALOG
    from dumpdb.catalog import Catalog, latest_version

    path = _archive_path(archive)
    try:
        dumpdb.archive._check_marker(path)
        applied = Catalog(path / CATALOG).migrate()
    except DumpdbError as exc:
        _fail(exc)
    if applied:
        out.print(f"applied migrations {', '.join(f'{m.version:03d}_{m.name}' for m in applied)}; "
                  f"schema version {applied[-1].version}", highlight=False)
    else:
        out.print(f"schema is current (version {latest_version()})", highlight=False)


@app.command()
def export(
    runs: list[str] = typer.Argument(..., help="Run names."), archive: Optional[Path] = ArchiveOpt,
    to: Path = typer.Option(..., "--to", help="Bundle to write: a new directory, or a file ending in .zip."),
) -> None:
    """Export runs as a self-describing bundle (Parquet catalog rows + Zarr payloads + manifest),
    readable without dumpdb."""
    try:
        path = dumpdb.open(_archive_path(archive)).export(runs, to)
    except DumpdbError as exc:
        _fail(exc)
    out.print(f"exported {', '.join(runs)} to {path} ({_human(path.stat().st_size) if path.is_file() else 'directory'})",
              highlight=False)


@app.command("import")
def import_cmd(
    bundle: Path = typer.Argument(..., help="Bundle directory or .zip written by 'dumpdb export'."),
    archive: Optional[Path] = ArchiveOpt,
    rename: list[str] = typer.Option([], "--rename", help="OLD=NEW: import run OLD under the name NEW (repeatable)."),
) -> None:
    """Import a bundle's runs (every file checked against the manifest; importing twice adds nothing)."""
    from dumpdb.archive import create_archive, is_archive

    mapping = {}
    for item in rename:
        old, sep, new = item.partition("=")
        if not sep or not old or not new:
            _fail(DumpdbError(f"--rename {item!r}: write OLD=NEW"))
        mapping[old] = new
    path = _archive_path(archive)
    try:
        if not is_archive(path):
            create_archive(path)
        report = dumpdb.open(path).import_bundle(bundle, mapping)
    except DumpdbError as exc:
        _fail(exc)
    if report.runs_imported:
        out.print(f"imported {', '.join(report.runs_imported)}: {report.tensors} tensors, {report.payloads_added} "
                  f"payloads stored, {report.payloads_present} already in the archive", highlight=False)
    if report.runs_skipped:
        out.print(f"already in the archive, skipped: {', '.join(report.runs_skipped)}", highlight=False)


@app.command()
def verify(
    run: Optional[str] = typer.Argument(None, help="Run to verify (default: every payload of the archive)."),
    archive: Optional[Path] = ArchiveOpt,
    sample: Optional[float] = typer.Option(None, "--sample", help="Check only this fraction of payloads (e.g. 0.05)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Make --sample's choice repeatable."),
) -> None:
    """Re-read every stored payload, hash it again and compare with the catalog.
    Lists each damaged tensor (run, op, io, slot); exit 1 if any."""
    try:
        a = dumpdb.open(_archive_path(archive))
        with Progress(SpinnerColumn(), TextColumn("verifying"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=err, transient=True) as bar:
            task = bar.add_task("verify", total=None)
            report = a.verify(run, sample=sample, seed=seed,
                              progress=lambda done, total: bar.update(task, completed=done, total=total))
    except DumpdbError as exc:
        _fail(exc)
    scope = f"run {run}" if run else "archive"
    checked = (f"{report.blobs_checked} of {report.blobs_total} payloads ({_human(report.bytes_checked)}), "
               f"{report.shards_checked} shard checksums")
    if report.ok:
        out.print(f"[green]ok[/green]: {scope}: {checked}: all as recorded", highlight=False)
        return
    for array_path, reason in report.damaged_shards.items():
        out.print(f"[red]damaged shard[/red] {array_path}: {reason}", highlight=False)
    out.print(f"[red]damaged[/red]: {scope}: {len(report.damaged)} of the {report.blobs_checked} payloads checked "
              f"({report.blobs_total} in scope), {len(report.damaged_shards)} shards; "
              f"{report.damaged_tensors.num_rows} tensors affected", highlight=False)
    if report.damaged_tensors.num_rows:
        output.write_table(report.damaged_tensors.select(
            ["run", "tensor_id", "iteration", "op_name", "io", "slot", "reason"]), out, 50)
    raise typer.Exit(1)


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
