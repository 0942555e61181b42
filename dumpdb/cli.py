"""The ``dumpdb`` command line: a thin layer over the Python API.

Every command calls one function of :mod:`dumpdb` and only formats its result;
commands that print rows take ``--format`` and ``--output`` and go through
:func:`dumpdb.render.tables.emit`. Errors are handled in one place
(:class:`_Commands`): a :class:`~dumpdb.errors.DumpdbError` prints its one-line
message and exits with its ``exit_code``; ``--debug`` adds the traceback.

Exit codes (README "Exit codes"): 0 ok / nothing found; 1 found (failed files,
a divergence, scan hits, ``compare --fail-on``); 2 usage or input error, and
internal errors; 130 interrupted.

Start-up time matters (``dumpdb sql`` is run in loops): modules beyond typer
are imported inside the commands that use them (numpy, pyarrow, zarr, rich
progress bars); ``scripts/bench_cli.py`` measures it.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, cast

import typer
from typer.core import TyperGroup

from dumpdb import __version__
from dumpdb.compare.choices import MODES, RULES, STRATEGIES
from dumpdb.errors import DumpdbError
from dumpdb.render.tables import FORMAT_HELP, FORMATS, Rows, emit
from dumpdb.sql_sandbox import SqlLimits

if TYPE_CHECKING:
    from rich.console import Console

EXIT_OK, EXIT_FOUND, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 130
INTERNAL_ERROR_EXIT = EXIT_ERROR  # a bug is not a finding: never 1, which scripts read as "found"

_state: dict[str, Any] = {"debug": bool(os.environ.get("DUMPDB_DEBUG"))}
_consoles: dict[bool, Console] = {}


def _console(stderr: bool = False) -> Console:
    """stdout (or stderr) console, made on first use (rich costs start-up time)."""
    if stderr not in _consoles:
        from rich.console import Console

        class _Console(Console):
            def on_broken_pipe(self) -> None:
                """The reader went away (``dumpdb sql ... | head``): rich's own handler exits 1,
                which the README defines as "found". Go quiet instead and let the command end
                with its own exit code (issue 30)."""
                self.quiet = True
                stream = sys.stderr if stderr else sys.stdout
                try:
                    os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())
                except (OSError, ValueError):  # not a real file (tests capture it): nothing to redirect
                    pass

        _consoles[stderr] = _Console(stderr=stderr, highlight=False)
    return _consoles[stderr]


def _say(message: str, *, stderr: bool = False, style: str | None = None) -> None:
    """Print ``message`` literally: user text ('dumpdb[torch]', scope names) is never markup."""
    from rich.text import Text

    _console(stderr).print(Text(message, style=style or ""), soft_wrap=True)


def one_line(message: str) -> str:
    """``message`` on one line; DuckDB's ``LINE 1: ...`` / ``^^^`` pointer lines are dropped
    (they only make sense on several lines)."""
    kept = []
    for line in str(message).splitlines():
        if line.lstrip().startswith("LINE ") or (line.strip() and not line.strip("^ ")):
            break
        if line.strip():
            kept.append(line.strip())
    return " ".join(kept)


def _error_line(message: str) -> None:
    from rich.text import Text

    _console(True).print(Text.assemble(("error: ", "red"), one_line(message)), soft_wrap=True)


class _Commands(TyperGroup):
    """The one place exceptions become one-line messages and exit codes."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        # --wait and --storage-option are global and may follow the command too
        # (dumpdb sql --wait 5 ...): moved before it.
        try:
            return super().parse_args(ctx, _hoist_globals(args))
        except Exception as exc:  # noqa: BLE001 - click's usage errors: one line
            if _is_usage_error(exc):
                _usage_line(exc)
            raise

    def invoke(self, ctx: Any) -> Any:
        from dumpdb import sigint

        sigint.reset()
        try:
            with sigint.graceful():  # Ctrl-C raises KeyboardInterrupt: cleanup (finally) runs, then one line
                return super().invoke(ctx)
        except DumpdbError as exc:
            _report(exc, str(exc), exc.exit_code)
        except KeyboardInterrupt as exc:
            _report(exc, "interrupted", EXIT_INTERRUPTED)
        except BrokenPipeError:
            # The reader went away (dumpdb sql ... | head): not an error. Point stdout at
            # /dev/null so the interpreter's final flush does not complain again.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise typer.Exit(EXIT_OK) from None
        except OSError as exc:
            where = exc.filename or "output"
            _report(exc, f"{where}: {exc.strerror or exc}", EXIT_ERROR)
        except Exception as exc:  # noqa: BLE001 - the last line of defence: one line, not a traceback
            if _is_usage_error(exc):
                _usage_line(exc)
            if sigint.signalled():
                # Ctrl-C while DuckDB ran a query: DuckDB turns the KeyboardInterrupt into its
                # own "Query interrupted" error; the user pressed Ctrl-C all the same
                _report(exc, "interrupted", EXIT_INTERRUPTED)
            if type(exc).__name__ == "Abort" and _is_cli_control(exc):
                # click turns Ctrl-C (or end of input) at a prompt into Abort ("Aborted!", exit 1)
                _report(exc, "interrupted", EXIT_INTERRUPTED)
            if _is_cli_control(exc):
                raise
            first = (str(exc).strip().splitlines() or [""])[0]
            if type(exc).__module__.lstrip("_").startswith("duckdb"):
                # DuckDB names the catalog file and what failed (a damaged or truncated catalog):
                # an input error, not a dumpdb bug.
                _report(exc, f"DuckDB: {first}", EXIT_ERROR)
            _report(exc, f"internal error: {type(exc).__name__}: {first} (run again with --debug for the traceback)",
                    INTERNAL_ERROR_EXIT)


_GLOBAL_WITH_VALUE = ("--wait", "--storage-option")
_GLOBAL_FLAGS = ("--no-verify",)


def _is_usage_error(exc: BaseException) -> bool:
    """click's UsageError (bad option, missing argument, no such command), from click or
    the copy typer >= 0.20 vendors (matched by name)."""
    return any(c.__name__ == "UsageError" for c in type(exc).__mro__) and _is_cli_control(exc) \
        and type(exc).__name__ != "NoArgsIsHelpError"  # bare `dumpdb`: the help, as click prints it


def _usage_line(exc: Any) -> None:
    """A usage error as one line (click prints four: Usage, Try, blank, Error), exit 2."""
    ctx = getattr(exc, "ctx", None)
    hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
    _error_line(f"{exc.format_message()}{hint}")
    raise typer.Exit(EXIT_ERROR)


def _hoist_globals(args: list[str]) -> list[str]:
    """``args`` with the global options that take a value (``--wait SECONDS``,
    ``--storage-option KEY=VALUE``, each also written ``--wait=SECONDS``) moved to the front (before
    the command name), wherever they were given; nothing after ``--`` is touched."""
    rest, front, i = [], [], 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            rest.extend(args[i:])
            break
        if arg in _GLOBAL_FLAGS:
            front.append(arg)
            i += 1
            continue
        if arg in _GLOBAL_WITH_VALUE:  # with its value; none given: the name and '=' (the option says what it wants)
            front += args[i:i + 2] if i + 1 < len(args) else [arg + "="]
            i += 2
            continue
        (front if arg.startswith(tuple(o + "=" for o in _GLOBAL_WITH_VALUE)) else rest).append(arg)
        i += 1
    return front + rest


def _wait_line(message: str) -> None:
    """A waiting process says why, once, on stderr (see dumpdb.catalog.waiting)."""
    _say(message, stderr=True, style="yellow")


def _lock_timeout() -> float:
    """Seconds to wait for a lock: ``--wait``, else ``$DUMPDB_LOCK_TIMEOUT`` or 120."""
    from dumpdb.catalog import DEFAULT_LOCK_TIMEOUT

    wait = _state.get("wait")
    return DEFAULT_LOCK_TIMEOUT if wait is None else float(wait)


def _storage_options() -> dict[str, str]:
    """``--storage-option KEY=VALUE`` pairs (parsed by :func:`_key_value`) as a dict."""
    return dict(_state.get("storage_options") or ())


def _is_cli_control(exc: BaseException) -> bool:
    """typer.Exit, click's Exit/Abort/usage errors: exits and messages the CLI framework
    handles itself. Matched by module, as typer >= 0.20 vendors its own click."""
    return isinstance(exc, (typer.Exit, _RefusedValue)) or type(exc).__module__.split(".")[0] in ("click", "typer")


def _report(exc: BaseException, message: str, code: int) -> None:
    if _state["debug"]:
        import traceback

        traceback.print_exception(exc, file=sys.stderr)
    if code == EXIT_INTERRUPTED:
        import warnings

        from dumpdb import sigint

        # zarr's calls run as coroutines on its own thread: one cut short by Ctrl-C is never
        # awaited, and Python would say so at exit, after the one line
        warnings.filterwarnings("ignore", message="coroutine .* was never awaited", category=RuntimeWarning)
        if sigint.say_interrupted():
            _say(message, stderr=True, style="yellow")
    else:
        _error_line(message)
    raise typer.Exit(code)


app = typer.Typer(
    name="dumpdb",
    cls=_Commands,
    help="Turn operator dumps (MindSpore, CANN, msprobe) into an indexed archive; query it with SQL.",
    epilog="Exit codes: 0 ok or nothing found; 1 found (failed files, NaN/Inf hits, a divergence, damage); "
           "2 usage or input error; 130 interrupted. Errors are one line; --debug adds the traceback.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

class _RefusedValue(typer.BadParameter):
    """An option value refused by its parameter type: a usage error (exit 2, one line) whose
    message names the option and what it accepts, so click's "Invalid value for ..." prefix
    is left off."""

    def format_message(self) -> str:
        return self.message


def _choice(option: str, choices: Sequence[str]):
    """The parameter type of an option taking one of ``choices`` (a typer ``parser``): the
    value itself, or a usage error ``unknown OPTION 'VALUE'; use one of A, B``. Used with
    :func:`_choices_metavar` so ``--help`` lists the choices."""
    def parse(value: str) -> str:
        if value not in choices:
            raise _RefusedValue(f"unknown {option} {value!r}; use one of {', '.join(choices)}")
        return value
    return parse


def _choices_metavar(choices: Sequence[str]) -> str:
    return "[" + "|".join(choices) + "]"


def _choice_list(option: str, choices: Sequence[str]):
    """The parameter type of an option taking a comma-separated list of ``choices`` in order
    (``--strategy exact,sequence``): a tuple, or a usage error naming the unknown one."""
    def parse(value: str) -> tuple[str, ...]:
        items = tuple(s.strip() for s in value.split(",") if s.strip())
        unknown = [s for s in items if s not in choices]
        if unknown or not items:
            raise _RefusedValue(f"unknown {option} {(unknown or [value])[0]!r}; use one or more of "
                                f"{', '.join(choices)}, comma-separated")
        return items
    return parse


def _key_value(option: str, metavar: str = "KEY=VALUE", *, hint: str = "", strip: str = "",
               lower: bool = False, secret: bool = False, number: bool = False):
    """The one parameter type of the options written ``KEY=VALUE`` (``--param``, ``--threshold``,
    ``--rename``, ``--storage-option``): a ``(key, value)`` tuple, or a usage error
    ``OPTION 'ITEM': write KEY=VALUE`` (with ``metavar``'s names and ``hint``). ``strip``:
    characters dropped from the key's start (``$NAME``); ``lower``: the key lower-cased;
    ``secret``: the message shows the key only, never the value; ``number``: the value as a float.
    A key may not be empty; with ``metavar`` ``OLD=NEW`` the value may not be either."""
    needs_value = metavar == "OLD=NEW"

    def parse(item: str) -> tuple[str, Any]:
        key, sep, value = item.partition("=")
        key = key.strip().lstrip(strip)
        key = key.lower() if lower else key
        if not sep or not key or (needs_value and not value):
            # a secret's item without '=' may be the secret itself: not shown
            where = f"{option} {item!r}" if not secret else f"{option} {key!r}" if sep and key else option
            raise _RefusedValue(f"{where}: write {metavar}{hint}")
        if number:
            try:
                return key, float(value)
            except ValueError:
                raise _RefusedValue(f"{option} {item!r}: {value!r} is not a number") from None
        return key, value
    return parse


def _format_opt(help: str = FORMAT_HELP):
    """``--format/-f``, one of :data:`dumpdb.render.tables.FORMATS` (default table)."""
    return typer.Option("table", "--format", "-f", parser=_choice("--format", FORMATS),
                        metavar=_choices_metavar(FORMATS), help=help)


ArchiveOpt = typer.Option(
    None, "--archive", "-a", envvar="DUMPDB_ARCHIVE", show_default="$DUMPDB_ARCHIVE or ./dumpdb.archive",
    help="Archive directory.")
FormatOpt = _format_opt()
OutputOpt = typer.Option(None, "--output", "-o", help="Write the rows to this file instead of stdout.")


REPORT_FORMATS = ("text", "json")


def _report_format_opt():
    """``--format/-f`` of the report commands (ingest, verify, gc, import, export, prune, migrate)."""
    return typer.Option("text", "--format", "-f", parser=_choice("--format", REPORT_FORMATS),
                        metavar=_choices_metavar(REPORT_FORMATS),
                        help="text (default): the report as lines for people; json: the same report as one "
                             "JSON object on stdout (exit codes unchanged).")


def _print_json(report: Any, **extra: Any) -> None:
    """A command's report as one JSON object on stdout (:mod:`dumpdb.render.json_report`)."""
    from dumpdb.render.json_report import report_json

    sys.stdout.write(report_json(report, **extra) + "\n")
    sys.stdout.flush()


def _archive_path(path: Optional[Path]) -> Path:
    from dumpdb.archive import default_archive_path

    return path if path is not None else default_archive_path()


def _url(path: Any) -> Optional[str]:
    """``SCHEME://...`` if ``path`` is an object-storage URL (typer's Path turned ``//`` into ``/``)."""
    from dumpdb.storage.backends import unfold

    return unfold(path)


def _open(path: Optional[Path], on_wait=None):
    from dumpdb.archive import Archive

    url = _url(path)
    if url is not None:  # a bundle on object storage, read-only in place
        import dumpdb

        return dumpdb.open(url, storage_options=_storage_options())
    return Archive(_archive_path(path), on_wait=on_wait or _wait_line, lock_timeout=_lock_timeout(),
                   storage_options=_storage_options(), verify_reads=_state.get("verify_reads", True))


def _a(archive: Optional[Path]) -> str:
    """`` -a ARCHIVE`` for hints, as the user gave it (empty when the default is used)."""
    return f" -a {shlex.quote(str(archive))}" if archive is not None else ""


def _check_format(fmt: str, output: Optional[Path]) -> None:
    """--format and --output together (the format itself is checked by its parameter type)."""
    if fmt == "parquet" and output is None:
        raise DumpdbError("--format parquet needs --output FILE")


# The one row-limit option: --show N, as compare's (whose 0 lists no failing pair, the summary
# being its answer); --max-rows, its former name on sql, scan and ranks, stays as a hidden alias.
RowsOpt = typer.Option(50, "--show", help="Rows shown by --format table (0: all).")
RowsOldOpt = typer.Option(None, "--max-rows", hidden=True, help="The former name of --show.")


def _rows_shown(show: int, old: Optional[int]) -> int:
    """``--show``, or ``--max-rows`` (its former name) when that was given."""
    return old if old is not None else show


def _emit(data, fmt: str, output: Optional[Path], max_rows: int | None = None, footer: bool = True,
          more: str = "--show 0") -> None:
    """Rows of any command to stdout or ``--output`` (one rendering path for all)."""
    console = _console() if fmt == "table" and output is None else None  # rich only when drawing a table
    emit(data, fmt, output, console=console, max_rows=max_rows, footer=footer, more=more)
    if output is not None:
        n = data.num_rows if hasattr(data, "num_rows") else len(data)
        _say(f"{n} rows written to {output}", stderr=True, style="dim")


def _progress(label: str):
    """A transient progress bar on stderr; none when stderr is not a terminal (logs stay clean)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    console = _console(True)
    return Progress(SpinnerColumn(), TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console, transient=True, disable=not console.is_terminal)


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
        _say(f"dumpdb {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version_callback, is_eager=True,
                                 help="Print the version and exit."),
    debug: bool = typer.Option(False, "--debug", envvar="DUMPDB_DEBUG",
                               help="On an error, print the Python traceback too."),
    wait: Optional[float] = typer.Option(
        None, "--wait", min=0, metavar="SECONDS", show_default="$DUMPDB_LOCK_TIMEOUT or 120",
        help="How long to wait for a lock another process holds on the archive (its store lock or the "
             "catalog file); after ~1 s one line on stderr names the holder; past it: exit 2 naming it. "
             "May also follow the command (dumpdb sql --wait 5 ...)."),
    storage_option: Optional[list[str]] = typer.Option(
        None, "--storage-option", metavar="KEY=VALUE", parser=_key_value("--storage-option", lower=True, secret=True),
        help="Object-storage setting (endpoint, region, access_key_id, secret_access_key, retries, ...) for an "
             "archive whose tensors are on S3 or a bundle at s3://; repeatable; overrides the AWS_* environment; "
             "secrets are never stored or printed. May also follow the command."),
    no_verify: bool = typer.Option(
        False, "--no-verify",
        help="Do not hash each tensor payload read (compare, scan, ranks, first-divergence) against its "
             "content hash; by default a damaged payload stops the command (PayloadCorrupt, naming the "
             "pack) instead of giving wrong numbers. May also follow the command."),
) -> None:
    """dumpdb: ingest dumps once, then query ops, iterations and statistics with SQL.

    Exit codes: 0 ok or nothing found; 1 found (failed files, NaN/Inf hits, a
    divergence); 2 usage or input error; 130 interrupted.
    """
    _state["debug"] = debug
    _state["wait"] = wait
    _state["storage_options"] = storage_option
    _state["verify_reads"] = not no_verify
    _install_warning_printer()


def _install_warning_printer() -> None:
    """Print dumpdb's warnings as one line each ('warning: ...'), not Python's two-line form."""
    import warnings

    from dumpdb.errors import DumpdbWarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, DumpdbWarning):
            _say(f"warning: {message}", stderr=True, style="yellow")
        else:
            default_show(message, category, filename, lineno, file, line)

    if _state.get("warning_printer"):
        return
    _state["warning_printer"] = True
    default_show = warnings.showwarning
    warnings.showwarning = show


# -- ingest -------------------------------------------------------------------------------------
def _reporter(quiet: bool):
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

    from dumpdb.progress import Reporter

    class RichReporter(Reporter):
        MAX_ERRORS_SHOWN = 20

        def __init__(self) -> None:
            self.errors = 0
            self.progress = Progress(
                SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                TaskProgressColumn(), TextColumn("{task.fields[read]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                console=_console(True), transient=False, disable=quiet,
            )
            self.task: Any = None
            self.read = 0
            self.pending = 0  # tensors advanced, not yet shown
            self.shown = 0.0  # when the bar was last updated (time.monotonic)

        def scanning(self, dump_dir):
            if not quiet:
                _say(f"scanning {dump_dir} ...", stderr=True, style="dim")

        def start(self, total, skipped):
            if skipped and not quiet:
                _say(f"{skipped} tensors already in this run, skipped", stderr=True, style="dim")
            if total == 0:
                return  # nothing new: no empty progress bar
            self.progress.start()
            self.task = self.progress.add_task("ingesting", total=total, read="")

        def advance(self, tensors, bytes_read):
            # called once per file: the bar is updated every 0.1 s at most (rich's update and
            # the byte count's text cost ~10 us, a tenth of a tiny file's whole ingest)
            self.read += bytes_read
            self.pending += tensors
            if self.task is not None and not quiet:
                now = time.monotonic()
                if now - self.shown >= 0.1:
                    self.shown = now
                    self.progress.update(self.task, advance=self.pending, read=_human(self.read))
                    self.pending = 0

        def error(self, source_file, message):
            from rich.text import Text

            self.errors += 1
            if self.errors <= self.MAX_ERRORS_SHOWN:
                line = message if message.startswith(source_file) else f"{source_file}: {message}"
                self.progress.console.print(Text.assemble(("error: ", "red"), line), soft_wrap=True)
            elif self.errors == self.MAX_ERRORS_SHOWN + 1:
                self.progress.console.print(Text("more errors: see ingest_errors in the catalog", style="red"))

        def changed(self, source_file, detail):
            from rich.text import Text

            self.progress.console.print(Text.assemble(("changed: ", "yellow"), f"{source_file}: {detail}"),
                                        soft_wrap=True)

        def finish(self):
            if self.task is not None and self.pending and not quiet:
                self.progress.update(self.task, advance=self.pending, read=_human(self.read))
                self.pending = 0
            self.progress.stop()

    return RichReporter()


def _print_report(r) -> None:
    ratio = f"{r.ratio:.2f}x" if r.ratio else "-"
    changed = r.tensors_replaced - r.payloads_filled
    replaced = (f"{changed} replaced (changed files), " if changed else "") + \
        (f"{r.payloads_filled} statistics-only filled in with their payloads, " if r.payloads_filled else "")
    _say(f"run {r.run} ({r.layout}) -> {r.archive}\n"
         f"  tensors: {r.tensors_added} added, {replaced}{r.tensors_skipped} already there, "
         f"{r.deduplicated} deduplicated, {r.statistics_only} statistics-only, {len(r.errors)} failed\n"
         f"  bytes read {_human(r.bytes_read)}, payload {_human(r.bytes_in)}, stored {_human(r.bytes_stored)}, "
         f"ratio {ratio}, {r.seconds:.1f} s", stderr=True)


def _ensure_archive(path: Path, create: bool = True) -> None:
    """Make the archive at ``path`` if there is none, saying ``created archive PATH`` (a
    mistyped path shows at once); with ``create`` False refuse with exit 2 instead."""
    from dumpdb.archive import create_archive, is_archive
    from dumpdb.errors import ArchiveError

    if is_archive(path):
        return
    if not create:
        what = "is not a dumpdb archive" if path.exists() else "no such archive"
        raise ArchiveError(f"{path}: {what}; --no-create refuses to make one (check the path, or drop --no-create)")
    create_archive(path)
    _say(f"created archive {path}", stderr=True)


@app.command()
def ingest(
    dump_dir: Path = typer.Argument(..., help="The dump 'path' directory, or any directory above rank_*."),
    archive: Optional[Path] = ArchiveOpt,
    run: Optional[str] = typer.Option(None, "--run", "-r", help="Run name (default: the dump directory's name)."),
    layout: Optional[str] = typer.Option(None, "--layout", help="Skip auto-detection; see 'dumpdb layouts'."),
    workers: Optional[int] = typer.Option(
        None, "--workers", "-j", min=1,
        help="Worker processes that read, hash and compute statistics (default: the cores if 4 or more, else "
             "in-process; a dump under 256 files and 256 MB is read in-process; 1: in-process). The catalog "
             "does not depend on it."),
    scheduler: Optional[str] = typer.Option(
        None, "--scheduler", metavar="ADDRESS|local",
        help="Run the workers as tasks of the dask.distributed cluster at ADDRESS (tcp://host:8786; its "
             "workers must see DUMP_DIR at the same path), or 'local' for a LocalCluster of --workers "
             "processes. Needs dumpdb[dask] (and dumpdb on the cluster's workers)."),
    follow_symlinks: bool = typer.Option(
        False, "--follow-symlinks", help="Read files that symlinks lead to outside DUMP_DIR (off by default)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    no_create: bool = typer.Option(False, "--no-create",
                                   help="Refuse (exit 2) if the archive does not exist, instead of creating it."),
    update: bool = typer.Option(
        False, "--update", help="Store the new content of files that changed since the run ingested them "
                                "(default: list them and refuse, exit 1). Replaced payloads stay until 'dumpdb gc'."),
    moved: bool = typer.Option(
        False, "--moved", help="Continue run --run from DUMP_DIR, its new location: the files the run holds must "
                               "be there with the same names and sizes."),
    verify_hash: bool = typer.Option(
        False, "--verify-hash", help="With --moved: also read and hash every file the run holds (slow, certain)."),
    store_url: Optional[str] = typer.Option(
        None, "--store-url", metavar="s3://BUCKET/PREFIX",
        help="Keep a new archive's tensors on object storage (S3 or compatible); the catalog stays in --archive, "
             "which remembers the URL. Endpoint and credentials: AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, "
             "AWS_SECRET_ACCESS_KEY, AWS_REGION."),
    store_old: Optional[str] = typer.Option(
        None, "--store", metavar="s3://BUCKET/PREFIX", hidden=True,
        help="The former name of --store-url (kept for scripts; 'compare --store' keeps results)."),
    no_delta: bool = typer.Option(
        False, "--no-delta", help="Store every payload plain (default: a payload may be stored as the XOR of a "
                                  "similar one of the same pack when that compresses better; reads are the same)."),
    fmt: str = _report_format_opt(),
) -> None:
    """Ingest a dump into an archive (created if missing: 'created archive PATH'). Re-running completes or skips:
    files already in the run are not read unless their size or mtime changed; a file
    whose content changed is listed and the ingest refuses (exit 1) unless --update."""
    from dumpdb.archive import is_archive
    from dumpdb.ingestion.pipeline import ingest as run_ingest

    if store_url is not None and store_old is not None and store_url != store_old:
        raise DumpdbError("--store is the former name of --store-url: give one URL")
    store = store_url if store_url is not None else store_old
    if verify_hash and not moved:
        raise DumpdbError("--verify-hash checks a moved dump: use it with --moved "
                          "(changed files are always confirmed by hash)")
    path = _archive_path(archive)
    existed = is_archive(path)
    if no_create and not existed:
        _ensure_archive(path, create=False)
    try:  # the pipeline creates the archive once it has found the dump (a bad DUMP_DIR makes none)
        report = run_ingest(dump_dir, archive=path, run=run, layout=layout, workers=workers,
                            scheduler=scheduler,
                            follow_symlinks=follow_symlinks, reporter=_reporter(quiet),
                            on_wait=_wait_line, lock_timeout=_lock_timeout(),
                            store=store, storage_options=_storage_options(),
                            update=update, moved=moved, verify_hash=verify_hash, delta=not no_delta)
    finally:
        if not existed and is_archive(path):
            _say(f"created archive {path}", stderr=True)
    _print_report(report)
    if fmt == "json":
        _print_json(report)
    if report.interrupted:
        _say("interrupted: what was committed stays; run the same command again to finish",
             stderr=True, style="yellow")
        raise typer.Exit(EXIT_INTERRUPTED)
    if report.errors:
        query = shlex.quote(f"SELECT * FROM ingest_errors WHERE run = '{report.run}'")
        _say(f"{len(report.errors)} file(s) failed; they are listed in ingest_errors "
             f"(dumpdb sql{_a(archive)} {query})", stderr=True, style="red")
        raise typer.Exit(EXIT_FOUND)


@app.command("ingest-worker")
def ingest_worker_cmd(
    dump_dir: Path = typer.Argument(..., help="This node's share of the dump (its rank_* directories)."),
    archive: Optional[Path] = ArchiveOpt,
    part: str = typer.Option(..., "--part", help="Name of this part of the run, unique per node (e.g. node3)."),
    run: Optional[str] = typer.Option(None, "--run", "-r", help="Run name, the same on every node "
                                      "(default: the dump directory's name)."),
    layout: Optional[str] = typer.Option(None, "--layout", help="Skip auto-detection; see 'dumpdb layouts'."),
    workers: Optional[int] = typer.Option(None, "--workers", "-j", min=1, help="Worker processes (as ingest)."),
    scheduler: Optional[str] = typer.Option(None, "--scheduler", metavar="ADDRESS|local",
                                            help="Run the workers on a dask.distributed cluster (as ingest)."),
    follow_symlinks: bool = typer.Option(
        False, "--follow-symlinks", help="Read files that symlinks lead to outside DUMP_DIR (off by default)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    update: bool = typer.Option(False, "--update", help="Refused (exit 2): a part only adds tensors; "
                                                        "'dumpdb ingest --update' replaces changed files."),
    moved: bool = typer.Option(False, "--moved", help="Refused (exit 2): 'dumpdb ingest --moved' continues a "
                                                      "run from a new location."),
) -> None:
    """Ingest one node's part of a run into a shared archive without writing its catalog:
    payloads into the store, rows as Parquet fragments and a manifest; then 'dumpdb commit'."""
    from dumpdb.ingestion.parts import ingest_worker

    report = ingest_worker(dump_dir, _archive_path(archive), part, run, layout=layout, workers=workers,
                           scheduler=scheduler, follow_symlinks=follow_symlinks, reporter=_reporter(quiet),
                           on_wait=_wait_line, lock_timeout=_lock_timeout(), storage_options=_storage_options(),
                           update=update, moved=moved)
    if report.status == "already written":
        _say(f"part {part!r} of run {report.run!r} is written and waits for 'dumpdb commit{_a(archive)}'",
             stderr=True)
        return
    _print_report(report)
    if report.interrupted:
        _say("interrupted: run the same command again to write the part", stderr=True, style="yellow")
        raise typer.Exit(EXIT_INTERRUPTED)
    _say(f"part {part!r} written; commit it with: dumpdb commit{_a(archive)}", stderr=True)
    if report.errors:
        raise typer.Exit(EXIT_FOUND)


@app.command("commit")
def commit_cmd(
    archive: Optional[Path] = ArchiveOpt,
    run: Optional[str] = typer.Option(None, "--run", "-r", help="Commit only this run's parts."),
) -> None:
    """Commit the parts 'dumpdb ingest-worker' wrote: each manifest validated, each part in
    one transaction (creates an empty archive if there is none)."""
    from dumpdb.ingestion.parts import commit_parts

    report = commit_parts(_archive_path(archive), run, on_wait=_wait_line, lock_timeout=_lock_timeout())
    for run_name, part, added in report.committed:
        _say(f"committed run {run_name!r} part {part!r}: {added} tensors added", stderr=True)
    for directory in report.unfinished:
        _say(f"{directory}: no manifest yet (being written, or its worker died: run it again); left as is",
             stderr=True, style="yellow")
    for _manifest, reason in report.refused:
        _error_line(f"{reason}; part not committed")
    if not report.committed and not report.refused:
        _say("nothing to commit", stderr=True)
    if not report.ok:
        raise typer.Exit(EXIT_FOUND)


# -- sql, tables, schema ------------------------------------------------------------------------
def _read_query(query: Optional[str], file: Optional[Path]) -> str | None:
    if file is not None:
        if query is not None:
            raise DumpdbError("give the query as an argument or with --file, not both")
        try:
            return file.read_text(encoding="utf-8")
        except OSError as exc:
            raise DumpdbError(f"{file}: cannot read the query: {exc.strerror or exc}") from None
    if query == "-" or (query is None and not sys.stdin.isatty()):
        return sys.stdin.read()
    return query  # None: a terminal and no query, the interactive prompt


def sql_shell(a, fmt: str, max_rows: int | None, *, input=None, output=None) -> None:
    """An interactive SQL prompt on archive ``a`` (``dumpdb sql`` with no query on a terminal).

    Statements end with ``;`` and may span lines (as in the DuckDB shell); history is kept in
    ``~/.dumpdb_history``; Ctrl-C drops the statement being typed, Ctrl-D or ``.quit`` ends.
    An error is one line and the prompt goes on. Needs prompt_toolkit (``pip install
    'dumpdb[shell]'``); raises DumpdbError saying so without it. ``input``/``output``:
    prompt_toolkit input/output objects (tests).
    """
    try:
        from prompt_toolkit import PromptSession
        from prompt_toolkit.history import FileHistory, InMemoryHistory
    except ImportError:
        raise DumpdbError("no query: give one as an argument, '-' to read it from stdin, or --file Q.sql "
                          "(an interactive prompt needs: pip install 'dumpdb[shell]')") from None
    history = InMemoryHistory() if input is not None else FileHistory(str(Path.home() / ".dumpdb_history"))
    session: Any = PromptSession(history=history, input=input, output=output)
    _say(f"dumpdb {__version__} SQL on {a.path} (read-only); end statements with ';', Ctrl-D to quit", style="dim")
    lines: list[str] = []
    while True:
        try:
            line = session.prompt("dumpdb> " if not lines else "   ...> ")
        except KeyboardInterrupt:
            lines.clear()
            continue
        except EOFError:
            break
        if not lines and line.strip() in (".quit", ".exit", "\\q"):
            break
        lines.append(line)
        text = "\n".join(lines).strip()
        if not text:
            lines.clear()
        elif text.endswith(";"):
            lines.clear()
            try:
                names, rows = a.sql_rows(text)
                _emit(Rows(names, rows), fmt, None, max_rows=max_rows)
            except DumpdbError as exc:
                _error_line(str(exc))
            except KeyboardInterrupt:  # the query was stopped (dumpdb.sql_sandbox); the prompt goes on
                _error_line("interrupted")


@app.command()
def sql(
    query: Optional[str] = typer.Argument(
        None, help="SQL over runs, tensors, blobs, arrays, ops, execution_order, ... ('-': read it from stdin)."),
    archive: Optional[Path] = ArchiveOpt,
    file: Optional[Path] = typer.Option(None, "--file", help="Read the query from this file."),
    param: list[str] = typer.Option([], "--param", "-p", metavar="NAME=VALUE",
                                    parser=_key_value("--param", "NAME=VALUE", strip="$",
                                                      hint=" (bound to $NAME in the query)"),
                                    help="NAME=VALUE: bind $NAME in the query to the text VALUE (repeatable)."),
    fmt: str = FormatOpt,
    output: Optional[Path] = OutputOpt,
    max_rows: int = RowsOpt,
    max_rows_old: Optional[int] = RowsOldOpt,
    allow_files: bool = typer.Option(
        False, "--allow-files", help="Let the query read/write files (COPY, read_csv, ATTACH...); off by default."),
    memory_limit: Optional[str] = typer.Option(
        None, "--memory-limit", metavar="SIZE",
        help="DuckDB memory limit of the query, e.g. 512MB, 8GB (default $DUMPDB_SQL_MEMORY_LIMIT or 2GB); "
             "beyond it DuckDB spills to a private temporary directory or the query fails."),
    threads: Optional[int] = typer.Option(
        None, "--threads", help="DuckDB threads for the query (default $DUMPDB_SQL_THREADS or 2)."),
    timeout: Optional[float] = typer.Option(
        None, "--timeout", metavar="SECONDS", help="Stop a query running longer than this (default: no limit)."),
) -> None:
    """Run a read-only SQL query on the catalog (sandboxed: no file access unless --allow-files;
    memory, threads and time bounded; Ctrl-C stops a running query: exit 130).
    With no query on a terminal: an interactive prompt."""
    max_rows = _rows_shown(max_rows, max_rows_old)
    _check_format(fmt, output)
    limits = SqlLimits.from_env(memory_limit, threads, timeout)
    text = _read_query(query, file)
    if text is None:
        if output is not None or fmt == "parquet":
            raise DumpdbError("the interactive prompt prints to the terminal: give a query to use --output")
        a = _open(archive)
        a.sql_limits = limits
        sql_shell(a, fmt, max_rows if max_rows > 0 else None)
        return
    if not text.strip():
        raise DumpdbError("empty query")
    a = _open(archive)
    a.sql_limits = limits
    params = dict(cast("list[tuple[str, str]]", param)) or None  # (NAME, VALUE) pairs (parsed by _key_value)
    if fmt == "parquet":
        data: Any = a.sql(text, params, allow_files=allow_files)  # keeps DuckDB's column types
    else:
        names, rows = a.sql_rows(text, params, allow_files=allow_files)  # no pyarrow import: fast start
        data = Rows(names, rows)
    _emit(data, fmt, output, max_rows=max_rows if max_rows > 0 else None)


_TABLES_SQL = """
SELECT table_name AS "table", 'table' AS kind, estimated_size, comment FROM duckdb_tables()
WHERE database_name = current_database() AND schema_name = 'main' AND NOT internal AND NOT temporary
UNION ALL
SELECT view_name, 'view', NULL, comment FROM duckdb_views()
WHERE database_name = current_database() AND schema_name = 'main' AND NOT internal AND NOT temporary
ORDER BY 1
"""


@app.command()
def tables(archive: Optional[Path] = ArchiveOpt, fmt: str = FormatOpt, output: Optional[Path] = OutputOpt) -> None:
    """List the catalog's tables with their row counts and what each holds."""
    _check_format(fmt, output)
    a = _open(archive)
    _, found = a.sql_rows(_TABLES_SQL)
    rows = []
    if found:
        counts = " UNION ALL ".join(
            f"SELECT {i} AS i, count(*) AS n FROM \"{name.replace(chr(34), chr(34) * 2)}\""
            for i, (name, *_rest) in enumerate(found))
        n = dict(a.sql_rows(counts)[1])
        rows = [(name, kind, n[i], comment or None) for i, (name, kind, _, comment) in enumerate(found)]
    _emit(Rows(["table", "kind", "rows", "comment"], rows), fmt, output)


@app.command()
def schema(
    table: Optional[str] = typer.Argument(None, help="Table (default: every table)."),
    archive: Optional[Path] = ArchiveOpt,
    fmt: str = FormatOpt,
    output: Optional[Path] = OutputOpt,
) -> None:
    """Columns of the catalog's tables: name, type and meaning (DuckDB's column comments)."""
    _check_format(fmt, output)
    a = _open(archive)
    where = "AND table_name = $table" if table else ""
    names, rows = a.sql_rows(
        'SELECT table_name AS "table", column_name AS "column", data_type AS type, comment '
        "FROM duckdb_columns() WHERE database_name = current_database() AND schema_name = 'main' "
        f"AND NOT internal {where} ORDER BY table_name, column_index",
        {"table": table} if table else None)
    if table and not rows:
        _, known = a.sql_rows(_TABLES_SQL)
        raise DumpdbError(f"no table {table!r} in the catalog (tables: {', '.join(r[0] for r in known)})")
    if table:
        names, rows = names[1:], [r[1:] for r in rows]
    _emit(Rows(names, [tuple(v if v != "" else None for v in r) for r in rows]), fmt, output)


# -- runs, show ---------------------------------------------------------------------------------
@app.command()
def runs(
    archive: Optional[Path] = ArchiveOpt,
    fmt: str = FormatOpt,
    output: Optional[Path] = OutputOpt,
) -> None:
    """List the runs of an archive."""
    _check_format(fmt, output)
    table = _open(archive).runs()
    if table.num_rows == 0 and fmt == "table" and output is None:
        _say(f"no runs yet: add one with 'dumpdb ingest DUMP_DIR{_a(archive)}'", stderr=True)
        return
    if fmt != "table":
        _emit(table, fmt, output)
        return
    rows, hints = [], []
    for r in table.to_pylist():
        fw = " ".join(x for x in (r["framework"], r["framework_version"]) if x)
        started = r["ingest_started"]
        pruned = f"{r['pruned']} ({r['pruned_at']:%Y-%m-%d %H:%M})" if r["pruned"] else 0
        rows.append((r["run"], r["state"], r["tensors"], r["stored"], r["statistics_only"], pruned, r["failed"],
                     _human(r["bytes_in"]), started.strftime("%Y-%m-%d %H:%M") if started else None, r["layout"],
                     fw or None, r["source_path"]))
        if r["complete_command"]:
            hints.append(f"run {r['run']} is {r['state']}; complete it with: {_complete(r, archive)}")
    _emit(Rows(["run", "state", "tensors", "stored", "stats-only", "pruned", "failed", "payload", "ingested",
                "layout", "framework", "source"], rows), fmt, output, footer=False)
    for hint in hints:
        _say(hint, stderr=True, style="yellow")


def _complete(info: dict, archive: Optional[Path]) -> str:
    """The ingest command that completes an interrupted run, with -a as the user gave it."""
    from dumpdb.catalog.runstate import complete_command

    return complete_command(info["run"], info["source_path"]) + _a(archive)


@app.command()
def show(
    run: str = typer.Argument(..., help="Run name."),
    archive: Optional[Path] = ArchiveOpt,
    fmt: str = FormatOpt,
    output: Optional[Path] = OutputOpt,
) -> None:
    """Summarise one run: ranks, graphs, iterations, tensors, bytes in/stored, ratio."""
    _check_format(fmt, output)
    info = _open(archive).show(run)
    if fmt != "table":
        _emit(Rows.from_dicts([info]), fmt, output)
        return

    def span(values):
        if not values:
            return "-"
        if len(values) > 12:
            return f"{len(values)} ({values[0]}..{values[-1]})"
        return ", ".join(str(v) for v in values)

    started = info.get("ingest_started")
    ratio = f"{info['ratio']:.2f}x" if info["ratio"] else "-"
    state = info["state"] + (f"; complete it with: {_complete(info, archive)}" if info["complete_command"] else "")
    pruned = ""
    if info["pruned"]:
        first, last = info["pruned_first"], info["pruned_last"]
        when, until = f"{first:%Y-%m-%d %H:%M}", f"{last:%Y-%m-%d %H:%M}"
        pruned = f" (pruned {when}" + (f" to {until})" if until != when else ")")
    stored = (f"{info['stored']} = {info['payloads_stored']} payloads stored by this run + {info['deduplicated']} "
              f"deduplicated ({info['distinct_payloads']} distinct payloads)")
    reclaim = (f", {_human(info['bytes_reclaimable'])} of it unused until 'dumpdb gc'"
               if info["bytes_reclaimable"] else "")
    framework = (info["framework"], info["framework_version"], info["device_target"])
    lines = [
        ("run", info["run"]), ("status", state), ("source", info["source_path"]),
        ("layout", info["layout"]),
        ("framework", " ".join(str(x) for x in framework if x) or "-"),
        ("ingested", f"{started:%Y-%m-%d %H:%M:%S} by dumpdb {info['dumpdb_version']}" if started else "-"),
        ("ranks", span(info["ranks"])), ("graphs", span(info["graphs"])), ("iterations", span(info["iterations"])),
        ("tensors", f"{info['tensors']} = {info['stored']} stored + {info['statistics_only']} statistics-only + "
                    f"{info['pruned']} pruned{pruned}"),
        ("stored", stored),
        ("failed", f"{info['failed']} files (not ingested: see ingest_errors)"),
        ("bytes in", _human(info["bytes_in"]) + " (payloads of the stored tensors)"
         + (f", {_human(info['bytes_pruned'])} pruned" if info["pruned"] else "")),
        ("bytes stored", _human(info["bytes_stored"]) + reclaim), ("ratio", ratio),
    ]
    if output is not None:
        _emit(Rows(["field", "value"], lines), fmt, output, footer=False)
        return
    from rich.text import Text

    width = max(len(k) for k, _ in lines)
    for k, v in lines:
        _console().print(Text.assemble((k.ljust(width), "bold"), "  ", "-" if v is None else str(v)),
                         soft_wrap=True)


# -- compare, first-divergence, scan ------------------------------------------------------------
def _thresholds(pairs: list[tuple[str, float]]):
    import dataclasses

    from dumpdb.compare.verdict import Thresholds

    try:
        return Thresholds(**dict(pairs))  # (NAME, number) pairs parsed by ThresholdOpt
    except TypeError:
        known = ", ".join(f.name for f in dataclasses.fields(Thresholds))
        given = ", ".join(name for name, _ in pairs)
        raise DumpdbError(f"unknown threshold in {given}; known: {known}") from None


CompareTarget = typer.Argument(..., help="Target selection: RUN, RUN:ITERATION or RUN:ITERATION:RANK.")
CompareBench = typer.Argument(..., help="Bench (ground truth) selection, same form.")
IterationOpt = typer.Option(None, "--iteration", "-i", help="Iteration for both sides (if not in the selection).")
RankOpt = typer.Option(None, "--rank", help="Rank for both sides (if not in the selection).")
MappingOpt = typer.Option(None, "--mapping", "-m",
                          help="Name mapping file (CSV target,bench or YAML; msprobe mapping yaml).")
StrategyOpt = typer.Option(None, "--strategy", parser=_choice_list("--strategy", STRATEGIES),
                           metavar="NAME,...",
                           help=f"Alignment strategies in order, comma-separated, of: {', '.join(STRATEGIES)}.")
ModeOpt = typer.Option("auto", "--mode", parser=_choice("--mode", MODES), metavar=_choices_metavar(MODES),
                       help="auto (payloads where stored, else statistics) | tensor | statistics.")
ThresholdOpt = typer.Option([], "--threshold", "-t", metavar="NAME=VALUE",
                            parser=_key_value("--threshold", "NAME=VALUE", number=True),
                            help="Verdict threshold NAME=VALUE (repeatable).")
WorkersOpt = typer.Option(None, "--workers", "-j", min=1,
                          help="Metric workers (default: cores; processes for comparisons >= 64 MB).")
SchedulerOpt = typer.Option(None, "--scheduler", metavar="ADDRESS|local",
                            help="Read and compute the payloads on the dask.distributed cluster at ADDRESS "
                                 "(tcp://host:8786; its workers read the archive's store themselves: S3, or the "
                                 "same path), or 'local' for a LocalCluster of --workers processes. Same answer. "
                                 "Needs dumpdb[dask].")


def _run_compare(archive, target, bench, iteration, rank, mapping, strategy, mode, threshold, workers,
                 store: bool = True, bench_rank: int | None = None,
                 rules: str = "precision", scheduler: str | None = None):
    """Run a comparison for the CLI (``store``: keep the results in the archive).

    Raises DumpdbError (exit 2) when no pair is formed: there is nothing to judge,
    and a script must not read that as "no difference".
    """
    from dumpdb.compare.engine import compare

    a = _open(archive)
    strategies = strategy  # a tuple of names (parsed by StrategyOpt)
    options = dict(iteration=iteration, rank=rank, mapping=mapping, mode=mode,
                   thresholds=_thresholds(threshold), workers=workers, store_results=store, bench_rank=bench_rank,
                   rules=rules, scheduler=scheduler)
    if strategies:
        options["strategies"] = strategies
    with _progress("comparing") as bar:
        task = bar.add_task("compare", total=None)
        outcome = compare(a, target, bench, progress=lambda done, total: bar.update(task, completed=done, total=total),
                          **options)
    sm = outcome.summary
    if sm["pairs"] == 0:
        raise DumpdbError(
            f"no pairs formed between {sm['target']} and {sm['bench']} ({sm['unmatched_target']} target, "
            f"{sm['unmatched_bench']} bench tensors unmatched): check the selections (iteration, rank) "
            "or give a --mapping")
    return outcome


def _v(value: Any) -> str:
    """A value in a message: absent -> '-', never 'None'; floats to 6 significant digits."""
    if value is None:
        return "-"
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _divergence_lines(fd, summary: dict | None = None) -> list[str]:
    from dumpdb.compare import registry

    if fd is None:
        if summary is not None and summary.get("rules") == "precision":
            dtype = summary.get("precision_dtype") or "the dtypes'"
            return [f"no departure beyond {dtype} precision"]
        return ["no divergence: no pair fails the rule"]
    where = f"{fd['code_file']}:{fd['code_line']}  {fd['code_text']}" if fd.get("code_file") else "-"
    shown = [m for m in registry.metrics() if m.cli]
    metric = ", ".join(f"{m.name} {format(fd[m.name], m.display)}" for m in shown if isinstance(fd.get(m.name), float))
    rank = "" if fd.get("rank") is None else f"rank {fd['rank']}, "
    phase = f" ({fd['phase']})" if fd.get("phase") else ""
    lines = [f"first divergence: {rank}iteration {_v(fd['iteration'])}, position {_v(fd['position'])}: "
             f"{_v(fd['op_type'])} {fd['io']}.{_v(fd['slot'])}{phase}",
             f"  op      {fd['target_name']}"
             + (f"  (scalar arguments: {fd['arg_diff']})" if fd.get("arg_diff") else "")]
    if fd.get("origin_op"):
        lines.append(f"  origin  {fd['origin_op']} (an op only the target has, produced this input)")
    lines += [f"  scope   {fd['scope_name'] or '-'}"]
    if fd.get("container"):
        lines.append(f"  within  {fd['container']}")
    lines += [f"  source  {where}",
              f"  metrics {metric or '-'}  ({fd['err_message'] or fd['result']})"]
    for label in ("inputs", "outputs"):
        for e in fd.get(label) or []:
            err = "n/a" if e["scaled_err"] is None else f"{e['scaled_err']:.3g}"
            ratio = "" if e["ratio"] is None else f" = {e['ratio']:.3g} x floor"
            lines.append(f"  {e['io']}.{_v(e['slot']):<6} error {err}{ratio} ({e['target_dtype']} vs "
                         f"{e['bench_dtype']}, {e['result']})")
    if fd["path"]:
        lines.append("  path    " + "\n          ".join(fd["path"]))
    phases = fd.get("phases") or {}
    if phases:
        lines.append("  per phase (first departure of each):")
        lines += [f"    {name:<9} {_brief_line(phases[name])}" for name in ("forward", "backward", "optimizer")
                  if name in phases]
    ranks = fd.get("ranks") or []
    if len(ranks) > 1:
        lines.append("  per rank (in the order they departed):")
        lines += [f"    rank {_v(b['rank']):<4} {_brief_line(b)}" for b in ranks]
    if fd.get("sides"):
        lines.append(f"  note    {fd['sides']}")
    return lines


def _alignment_lines(summary: dict | None) -> list[str]:
    """Re-aligned pairs, suspected mispairs and scalar-argument differences of a compare summary."""
    if not summary:
        return []
    lines = []
    if summary.get("realigned"):
        lines.append(f"alignment: {summary['realigned']} pairs re-aligned by sequence and content "
                     "(name counters shifted or a name pair did not fit)")
    suspects = summary.get("suspected_mispairs") or []
    if suspects:
        lines.append(f"suspected mispairs ({len(suspects)}): a same-type, same-shape bench tensor fits far better")
        lines += [f"  {s['target']} -> {s['bench']} (distance {s['distance']:.3g}; {s['better_bench']}: "
                  f"{s['better_distance']:.3g})" for s in suspects[:10]]
        if len(suspects) > 10:
            lines.append(f"  ... {len(suspects) - 10} more")
    diffs = summary.get("arg_diffs") or []
    if diffs:
        lines.append(f"scalar arguments differ ({len(diffs)} ops):")
        lines += [f"  {d['target']}: {d['arg_diff']}" for d in diffs[:10]]
        if len(diffs) > 10:
            lines.append(f"  ... {len(diffs) - 10} more")
    return lines


def _brief_line(b: dict) -> str:
    """One departing op of a first-divergence report's per-phase / per-rank lists."""
    return (f"iteration {_v(b['iteration'])}, position {_v(b['position'])}: {b['target_name']} "
            f"{b['io']}.{_v(b['slot'])} ({b['reason'] or b['result']})")


def _print_divergence(fd, summary: dict | None = None, stderr: bool = False) -> None:
    for i, line in enumerate(_divergence_lines(fd, summary)):
        style = "green" if fd is None else ("bold red" if i == 0 else None)
        _say(line, stderr=stderr, style=style)
    for line in _alignment_lines(summary):
        _say(line, stderr=stderr, style="yellow")


FAIL_ON = ("error", "warning")
RulesOpt = typer.Option("precision", "--rules", parser=_choice("--rules", RULES), metavar=_choices_metavar(RULES),
                        help="Verdict rules for the summary and first divergence: "
                        "precision (default: departures beyond the dtypes' precision) or msprobe.")


@app.command("compare")
def compare_cmd(
    target: str = CompareTarget, bench: str = CompareBench, archive: Optional[Path] = ArchiveOpt,
    iteration: Optional[int] = IterationOpt,
    rank: Optional[int] = RankOpt,
    bench_rank: Optional[int] = typer.Option(None, "--bench-rank",
                                             help="Rank of the bench side (overrides --rank)."),
    mapping: Optional[Path] = MappingOpt,
    strategy: Optional[str] = StrategyOpt,
    mode: str = ModeOpt,
    threshold: list[str] = ThresholdOpt,
    csv_file: Optional[Path] = typer.Option(None, "--csv", help="Write msprobe-compatible compare_result CSV."),
    parquet_file: Optional[Path] = typer.Option(None, "--parquet", help="Write all result columns as Parquet."),
    html: Optional[Path] = typer.Option(None, "--html", help="Write a self-contained HTML report."),
    workers: Optional[int] = WorkersOpt,
    show: int = typer.Option(20, "--show", help="Failing pairs listed by --format table (0: none)."),
    fail_on: Optional[str] = typer.Option(None, "--fail-on", parser=_choice("--fail-on", FAIL_ON),
                                          metavar=_choices_metavar(FAIL_ON),
                                          help="Exit 1 if any pair is 'error' (or 'warning')."),
    store: bool = typer.Option(True, "--store/--no-store",
                               help="Keep the results in the archive (compares, compare_results)."),
    fmt: str = _format_opt(FORMAT_HELP + " table: summary and failing pairs; others: every pair's row."),
    output: Optional[Path] = OutputOpt,
    rules: str = RulesOpt,
    scheduler: Optional[str] = SchedulerOpt,
) -> None:
    """Compare two runs, or two iterations/ranks of one run, tensor by tensor.

    TARGET and BENCH may also be two dump directories (any layout): both are ingested
    first, into --archive if given (kept), else into a temporary archive.
    Exit 2 if no pair is formed."""
    _check_format(fmt, output)
    if os.path.isdir(target) and os.path.isdir(bench):
        archive, target, bench = _ingest_pair(Path(target), Path(bench), archive)
    outcome = _run_compare(archive, target, bench, iteration, rank, mapping, strategy, mode, threshold, workers,
                           store, bench_rank, rules, scheduler)
    rows_out = fmt != "table" or output is not None
    sm = outcome.summary
    say = (lambda m, style=None: _say(m, stderr=rows_out, style=style))  # noqa: E731
    noise = f", {sm['noise']} noise" if sm.get("rules") != "msprobe" and sm.get("noise") else ""
    say(f"compare {sm['compare_id'] or '(not stored)'}: {sm['target']} vs {sm['bench']} ({sm['mode']}): "
        f"{sm['pairs']} pairs: {sm['pass']} pass, {sm['warning']} warning, {sm['error']} error{noise}; "
        f"unmatched {sm['unmatched_target']} target, {sm['unmatched_bench']} bench")
    strategies = ", ".join(f"{k} {v}" for k, v in sm["strategies"].items() if v)
    say(f"  matched by {strategies or '-'}")
    diff = sm.get("first_difference")
    if diff is None:
        say("  every pair is identical")
    else:
        say(f"  first difference: iteration {_v(diff['iteration'])}, position {_v(diff['position'])}: "
            f"{diff['target_name']} {diff['io']}.{diff['slot']} (max_abs_err {_v(diff['max_abs_err'])}, "
            f"cosine {_v(diff['cosine'])}, {_v(diff['target_dtype'])} vs {_v(diff['bench_dtype'])}, "
            f"{diff['result']})")
    _print_divergence(outcome.first_divergence, sm, stderr=rows_out)
    if rows_out:
        _emit(outcome.results, fmt, output)
    else:
        import pyarrow.compute as pc

        verdicts = "result" if sm.get("rules") == "msprobe" else "precision_result"
        cols = ["pair_index", "iteration", "op_type", "target_name", "io", "slot", "cosine", "max_abs_err",
                "max_rel_err", verdicts, "arg_diff"]
        # the shown columns only (a zero-copy select), then the failing rows: filtering the
        # whole result table first copied nearly all of it
        failing = outcome.results.select(cols).filter(pc.not_equal(outcome.results[verdicts], "pass")) \
            if show else None
        if failing is not None and failing.num_rows:
            _emit(failing, "table", None, max_rows=show, more=f"--show {failing.num_rows}")
    if outcome.unmatched.num_rows:
        names = outcome.unmatched.to_pylist()
        say(f"unmatched ({len(names)}): " + ", ".join(
            f"{u['side']}:{u['name']}.{u['io']}.{u['slot']}" for u in names[:12]) + (" ..." if len(names) > 12 else ""))
    _write_compare_outputs(outcome, csv_file, parquet_file, html, archive)
    if fail_on and (sm["error"] or (fail_on == "warning" and sm["warning"])):
        raise typer.Exit(EXIT_FOUND)


def _ingest_pair(target: Path, bench: Path, archive: Optional[Path]) -> tuple[Path, str, str]:
    """Ingest two dump directories for ``compare DIR DIR``; (archive, target run, bench run).

    Without ``archive`` a temporary one is used and removed when the command ends. Run
    names are the directories' names (prefixed ``target-``/``bench-`` when they are equal);
    two single-step dumps are compared step against step whatever their step numbers.
    """
    import atexit
    import shutil
    import tempfile

    from dumpdb.ingestion.pipeline import ingest as run_ingest

    if archive is None:
        tmp = tempfile.mkdtemp(prefix="dumpdb-compare-")
        atexit.register(shutil.rmtree, tmp, True)
        archive = Path(tmp) / "archive"
    t_name, b_name = target.resolve().name, bench.resolve().name
    if t_name == b_name:
        t_name, b_name = f"target-{t_name}", f"bench-{b_name}"
    for path, name in ((target, t_name), (bench, b_name)):
        report = run_ingest(path, archive=archive, run=name, on_wait=_wait_line, lock_timeout=_lock_timeout())
        for source_file, message in report.errors:
            _say(f"{source_file}: {message}", stderr=True)
        _say(f"ingested {path} as run {name!r}: {report.tensors_in_dump} tensors", stderr=True, style="dim")
    a = _open(archive)
    its = [a.sql("SELECT DISTINCT iteration FROM tensors WHERE run = $run", {"run": n})["iteration"].to_pylist()
           for n in (t_name, b_name)]
    if all(len(i) == 1 and i[0] is not None for i in its):  # one step each (step1 vs step0): pair them, as msprobe
        return archive, f"{t_name}:{its[0][0]}", f"{b_name}:{its[1][0]}"
    return archive, t_name, b_name


def _write_compare_outputs(outcome, csv_file, parquet_file, html, archive=None) -> None:
    from dumpdb.render import msprobe_csv as export

    sm = outcome.summary
    if csv_file:
        export.write_msprobe_csv(outcome.results, csv_file, archive=_open(archive))
        written = ([csv_file] if csv_file.exists()  # several ranks: one file per rank, like msprobe
                   else sorted(csv_file.parent.glob(f"{csv_file.stem}_rank*{csv_file.suffix}")))
        _say(f"msprobe-compatible CSV written to {', '.join(map(str, written))}", stderr=True, style="dim")
    if parquet_file:
        export.write_parquet(outcome.results, parquet_file)
        _say(f"Parquet written to {parquet_file}", stderr=True, style="dim")
    if html:
        from dumpdb.render.report import write_compare_report

        write_compare_report(html, summary=sm, results=outcome.results, unmatched=outcome.unmatched,
                             first_divergence=outcome.first_divergence)
        _say(f"HTML report written to {html}", stderr=True, style="dim")


def _scan_across_ranks(run, archive, iteration, max_rows, fmt, output) -> None:
    from dumpdb.checks.ranks import first_bad_across_ranks

    bad = first_bad_across_ranks(_open(archive), run, iteration=iteration)
    if fmt != "table" or output is not None:
        _emit(bad, fmt, output)
    elif bad.num_rows == 0:
        _say("no rank has a NaN/Inf tensor", style="green")
        return
    else:
        f = bad.to_pylist()[0]
        where = (f"{f['code_file']}:{f['code_line']} {f['code_text']}" if f["code_file"]
                 else "no source line recorded")
        _say(f"first bad rank: {_rank_label(f['rank'])}, iteration {f['iteration']}, position "
             f"{f['position']}: {f['op_name']} {f['io']}.{f['slot']} ({where})")
        _emit(bad.select(["order", "rank", "iteration", "position", "timestamp", "op_name", "io", "slot",
                          "nan_count", "inf_count", "code_line", "code_text"]), fmt, None, max_rows=max_rows or None)
    if bad.num_rows:
        raise typer.Exit(EXIT_FOUND)


def _rank_label(rank) -> str:
    return "proc (no rank)" if rank is None else f"rank {rank}"


@app.command("serve")
def serve_cmd(
    archive: Optional[Path] = ArchiveOpt,
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (another than 127.0.0.1 exposes the "
                                                         "archive to the network: no authentication)."),
    port: int = typer.Option(8765, "--port", help="TCP port."),
    open_browser: bool = typer.Option(False, "--open", help="Open the start page in a web browser."),
) -> None:
    """Browse the archive in a web browser (read-only): runs, model trees, compares, tensors, ranks, SQL."""
    from dumpdb.serve import serve

    serve(_open(archive), host, port, open_browser)  # (Archive.serve; a bundle on s3:// too)


@app.command("ranks")
def ranks_cmd(
    run: str = typer.Argument(..., help="Run name."), archive: Optional[Path] = ArchiveOpt,
    iteration: Optional[int] = typer.Option(None, "--iteration", "-i", help="One iteration/step only."),
    max_rows: int = RowsOpt,
    max_rows_old: Optional[int] = RowsOldOpt,
    html: Optional[Path] = typer.Option(None, "--html", help="Write a self-contained HTML report (with NaN/Inf)."),
    fmt: str = FormatOpt,
    output: Optional[Path] = OutputOpt,
    scheduler: Optional[str] = SchedulerOpt,
) -> None:
    """Group the ranks of a run by fingerprint; name the odd ranks and where they depart."""
    max_rows = _rows_shown(max_rows, max_rows_old)
    from dumpdb.checks.ranks import first_bad_across_ranks, rank_groups

    _check_format(fmt, output)
    a = _open(archive)
    table = rank_groups(a, run, iteration=iteration, scheduler=scheduler)
    if html:
        from dumpdb.render.ranks_report import write_ranks_report

        write_ranks_report(html, run=run, groups=table, first_bad=first_bad_across_ranks(a, run, iteration=iteration))
        _say(f"HTML report written to {html}", stderr=True, style="dim")
    if fmt != "table" or output is not None:
        _emit(table, fmt, output)
        return
    rows = table.to_pylist()
    groups: dict = {}
    for r in rows:
        groups.setdefault(r["group"], r)
    seq = len({r["sequence_group"] for r in rows})
    _say(f"{run}: {len(rows)} rank(s), {len(groups)} data group(s), {seq} op-sequence group(s)")
    for g, r in groups.items():
        shared = sum(x["shared_bytes"] for x in rows if x["group"] == g)
        payload = sum(x["payload_bytes"] for x in rows if x["group"] == g)
        share = f", {shared / payload:.0%} of payload bytes shared with other ranks" if payload else ""
        label = ", ".join(_rank_label(k) for k in r["group_ranks"])
        if r["reference"]:
            _say(f"  group {g} (reference): {label}{share}")
        else:
            where = (f" ({r['first_diff_code_file']}:{r['first_diff_code_line']} {r['first_diff_code_text']})"
                     if r["first_diff_code_file"] else "")
            _say(f"  group {g}: {label} departs from {_rank_label(r['reference_rank'])} "
                 f"({r['departs_at']}) at iteration {r['first_diff_iteration']}, position "
                 f"{r['first_diff_position']}: {r['first_diff_op']} {r['first_diff_io']}.{r['first_diff_slot']}"
                 f"{where}{share}")
    _emit(table.select(["rank", "group", "sequence_group", "tensors", "payload_bytes", "shared_bytes",
                        "departs_at", "first_diff_position", "first_diff_op", "first_diff_io",
                        "first_diff_slot"]), fmt, None, max_rows=max_rows or None)


@app.command("first-divergence")
def first_divergence_cmd(
    target: str = CompareTarget, bench: str = CompareBench, archive: Optional[Path] = ArchiveOpt,
    iteration: Optional[int] = IterationOpt,
    rank: Optional[int] = RankOpt,
    mapping: Optional[Path] = MappingOpt,
    strategy: Optional[str] = StrategyOpt,
    mode: str = ModeOpt,
    threshold: list[str] = ThresholdOpt,
    workers: Optional[int] = WorkersOpt,
    rules: str = RulesOpt,
    fmt: str = _format_opt(FORMAT_HELP + " Non-table formats: one row, or none if nothing departs."),
    output: Optional[Path] = OutputOpt,
    scheduler: Optional[str] = SchedulerOpt,
) -> None:
    """The first op, in execution order, that departs: by default the first whose error
    exceeds its dtypes' precision and is not explained by its inputs' errors (--rules
    msprobe: the first output failing msprobe's rules); its scope, source line, metrics
    and its inputs' and outputs' errors. Exit 1 if there is one, 0 when nothing departs,
    2 if no pair is formed. (Nothing is stored: use 'dumpdb compare' to keep results.)"""
    _check_format(fmt, output)
    outcome = _run_compare(archive, target, bench, iteration, rank, mapping, strategy, mode, threshold, workers,
                           store=False, rules=rules, scheduler=scheduler)
    fd = outcome.first_divergence
    if fmt == "table" and output is None:
        _print_divergence(fd, outcome.summary)
    else:
        _emit(Rows.from_dicts([fd] if fd is not None else []), fmt, output)
    if fd is not None:
        raise typer.Exit(EXIT_FOUND)


@app.command("scan")
def scan_cmd(
    run: str = typer.Argument(..., help="Run name."), archive: Optional[Path] = ArchiveOpt,
    check: list[str] = typer.Option([], "--check", "-c", help="Check NAME or NAME:param=value,... (repeatable; "
                                    "default nan, inf, fp16_overflow, all_zero)."),
    iteration: Optional[int] = typer.Option(None, "--iteration", "-i", help="Only this iteration."),
    rank: Optional[int] = typer.Option(None, "--rank", help="Only this rank."),
    all_hits: bool = typer.Option(False, "--all", help="Every hit, not only the first per check and iteration."),
    html: Optional[Path] = typer.Option(None, "--html", help="Write a self-contained HTML report."),
    list_checks: bool = typer.Option(False, "--list", help="List the checks and their parameters."),
    max_rows: int = RowsOpt,
    max_rows_old: Optional[int] = RowsOldOpt,
    fmt: str = FormatOpt,
    output: Optional[Path] = OutputOpt,
    across_ranks: bool = typer.Option(False, "--across-ranks",
                                      help="Which rank went bad (NaN/Inf) first, then the others."),
    scheduler: Optional[str] = SchedulerOpt,
    workers: Optional[int] = typer.Option(None, "--workers", "-j", min=1, help="Workers of --scheduler local."),
) -> None:
    """First NaN/Inf per iteration and rank, fp16 overflow, all-zero tensors and
    MindInsight watch conditions, answered from the catalog's statistics.
    Exit 1 if there is a hit."""
    max_rows = _rows_shown(max_rows, max_rows_old)
    from dumpdb.checks import scan as scan_mod

    _check_format(fmt, output)
    if across_ranks:
        _scan_across_ranks(run, archive, iteration, max_rows, fmt, output)
        return
    if list_checks:
        rows = [(name, ", ".join(f"{k}={v}" for k, v in (c.params or {}).items()) or None,
                 "yes" if c.needs_tensors else "no", c.description) for name, c in scan_mod.CHECKS.items()]
        _emit(Rows(["check", "parameters", "reads tensors", "description"], rows), fmt, output, footer=False)
        return
    names, params = [], {}
    for spec in check:
        name, values = scan_mod.parse_check_spec(spec)
        names.append(name)
        if values:
            params[name] = values
    hits = _open(archive).scan(run, names or None, iteration=iteration, rank=rank,
                               params=params or None, first_only=not all_hits, scheduler=scheduler, workers=workers)
    if fmt == "table" and output is None:
        cols = [c for c in ("check", "iteration", "rank", "position", "op_type", "op_name", "io", "slot", "value",
                            "code_line", "code_text") if c in hits.column_names]
        if hits.num_rows == 0:
            _say("no hits", style="green")
        else:
            _emit(hits.select(cols), fmt, None, max_rows=max_rows or None)
    else:
        _emit(hits, fmt, output)
    if html:
        from dumpdb.render.report import write_scan_report

        write_scan_report(html, run=run, summary={"run": run, "checks": names or "default", "hits": hits.num_rows},
                          hits=hits)
        _say(f"HTML report written to {html}", stderr=True, style="dim")
    if hits.num_rows:
        raise typer.Exit(EXIT_FOUND)


# -- archival -----------------------------------------------------------------------------------
@app.command()
def prune(
    run: str = typer.Argument(..., help="Run name."), archive: Optional[Path] = ArchiveOpt,
    keep_stats: bool = typer.Option(False, "--keep-stats", help="Required: payloads go, rows and statistics stay."),
    iterations: Optional[str] = typer.Option(None, "--iterations", help='MindSpore syntax, e.g. "0|5-8|100-120".'),
    ranks: Optional[str] = typer.Option(None, "--ranks", help='Only these ranks, same syntax, e.g. "0|2-3".'),
    fmt: str = _report_format_opt(),
) -> None:
    """Drop a run's tensor payloads but keep its catalog rows and statistics
    (space comes back with 'dumpdb gc'). Iterations or ranks the run does not have: exit 2."""
    if not keep_stats:
        raise DumpdbError("prune keeps rows and statistics and drops payloads: pass --keep-stats to confirm")
    n = _open(archive).prune(run, iterations, ranks)
    if fmt == "json":
        _print_json({"run": run, "iterations": iterations, "ranks": ranks, "tensors_pruned": n})
        return
    _say(f"pruned the payloads of {n} tensors of run {run}; run 'dumpdb gc{_a(archive)}' to reclaim the space")


@app.command("rm")
def rm_cmd(
    run: str = typer.Argument(..., help="Run name."), archive: Optional[Path] = ArchiveOpt,
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask."),
) -> None:
    """Delete a run from the catalog (space comes back with 'dumpdb gc')."""
    if not yes:
        if not sys.stdin.isatty():
            raise DumpdbError(f"rm {run}: not confirmed; pass --yes (no terminal to ask on)")
        if not typer.confirm(f"delete run {run!r} and its comparisons?", default=False):
            _say("nothing deleted", stderr=True)
            return
    n = _open(archive).remove_run(run)
    _say(f"removed run {run} ({n} tensors); run 'dumpdb gc{_a(archive)}' to reclaim the space")


@app.command()
def gc(archive: Optional[Path] = ArchiveOpt,
       grace: float = typer.Option(3600.0, "--grace", min=0,
                                   help="Keep uncommitted store files younger than this many seconds."),
       fmt: str = _report_format_opt(),
       ) -> None:
    """Reclaim store space no tensor uses any more (payloads other runs use stay), and
    files crashed ingests left. Waits for running ingest/import/rm/prune."""
    report = _open(archive).gc(grace=grace)
    if fmt == "json":
        _print_json(report)
        return
    _say(f"reclaimed {_human(report.reclaimed)} ({_human(report.bytes_before)} -> {_human(report.bytes_after)}): "
         f"{report.arrays_deleted} arrays deleted, {report.packs_compacted} packs compacted, "
         f"{report.blobs_dropped} payloads dropped, {report.orphans_deleted + report.temp_files_deleted} "
         f"crash leftovers removed")


@app.command()
def migrate(archive: Optional[Path] = ArchiveOpt, fmt: str = _report_format_opt()) -> None:
    """Upgrade the catalog schema (also done automatically on open; a copy goes to backups/)."""
    import dumpdb.archive
    from dumpdb.catalog import Catalog, latest_version

    path = _archive_path(archive)
    dumpdb.archive.check_marker(path)
    applied = Catalog(path / dumpdb.archive.CATALOG, lock_timeout=_lock_timeout(), on_wait=_wait_line).migrate()
    if fmt == "json":
        _print_json({"applied": [f"{m.version:03d}_{m.name}" for m in applied],
                     "schema_version": applied[-1].version if applied else latest_version()})
        return
    if applied:
        _say(f"applied migrations {', '.join(f'{m.version:03d}_{m.name}' for m in applied)}; "
             f"schema version {applied[-1].version}")
    else:
        _say(f"schema is current (version {latest_version()})")


@app.command()
def export(
    runs: list[str] = typer.Argument(..., help="Run names."), archive: Optional[Path] = ArchiveOpt,
    to: Path = typer.Option(..., "--to", help="Bundle to write: a new directory, a file ending in .zip, "
                                              "or s3://BUCKET/PREFIX (object storage)."),
    fmt: str = _report_format_opt(),
) -> None:
    """Export runs as a self-describing bundle (Parquet catalog rows + Zarr payloads + manifest),
    readable without dumpdb."""
    url = _url(to)
    path = _open(archive).export(runs, url or to)
    if fmt == "json":
        size = path.stat().st_size if url is None and path.is_file() else None
        _print_json({"runs": runs, "bundle": path, "bytes": size})
        return
    if url is not None:
        _say(f"exported {', '.join(runs)} to {path}")
        return
    size = _human(path.stat().st_size) if path.is_file() else "directory"
    _say(f"exported {', '.join(runs)} to {path} ({size})")


@app.command("import")
def import_cmd(
    bundle: Path = typer.Argument(..., help="Bundle directory, .zip or s3://BUCKET/PREFIX written by 'dumpdb export'."),
    archive: Optional[Path] = ArchiveOpt,
    rename: list[str] = typer.Option([], "--rename", metavar="OLD=NEW", parser=_key_value("--rename", "OLD=NEW"),
                                     help="OLD=NEW: import run OLD under the name NEW (repeatable)."),
    max_bundle_size: int = typer.Option(1 << 40, "--max-bundle-size", min=0,
                                        help="Refuse bundles declaring more bytes than this (default 1 TiB)."),
    fmt: str = _report_format_opt(),
) -> None:
    """Import a bundle's runs (every file checked against the manifest; importing twice adds nothing)."""
    mapping = dict(cast("list[tuple[str, str]]", rename))  # (OLD, NEW) pairs (parsed by _key_value)
    path = _archive_path(archive)
    _ensure_archive(path)
    report = _open(path).import_bundle(_url(bundle) or bundle, mapping,
                                                            max_bundle_size=max_bundle_size)
    if fmt == "json":
        _print_json(report)
        return
    if report.runs_imported:
        _say(f"imported {', '.join(report.runs_imported)}: {report.tensors} tensors, {report.payloads_added} "
             f"payloads stored, {report.payloads_present} already in the archive")
    if report.runs_skipped:
        _say(f"already in the archive, skipped: {', '.join(report.runs_skipped)}")


@app.command()
def verify(
    run: Optional[str] = typer.Argument(None, help="Run to verify (default: every payload of the archive)."),
    archive: Optional[Path] = ArchiveOpt,
    sample: Optional[float] = typer.Option(None, "--sample", help="Check only this fraction of payloads (e.g. 0.05)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Make --sample's choice repeatable."),
    repair: bool = typer.Option(False, "--repair", help="Delete orphan arrays and leftover .tmp shards."),
    grace: float = typer.Option(3600.0, "--grace", min=0, help="--repair keeps files younger than this (seconds)."),
    fmt: str = _report_format_opt(),
) -> None:
    """Re-read every stored payload, hash it again and compare with the catalog.
    Lists each damaged tensor (run, op, io, slot); exit 1 if any."""
    a = _open(archive)
    with _progress("verifying") as bar:
        task = bar.add_task("verify", total=None)
        report = a.verify(run, sample=sample, seed=seed, repair=repair, grace=grace,
                          progress=lambda done, total: bar.update(task, completed=done, total=total))
    if fmt == "json":
        _print_json(report, run=run)
        if not report.ok:
            raise typer.Exit(EXIT_FOUND)
        return
    for problem in report.catalog_problems:
        _say(f"catalog: {problem}", style="red")
    if report.repaired:
        _say(f"repaired: removed {report.repaired} orphan arrays and temp files")
    if report.orphans:
        _say(f"orphans: {len(report.orphans)} store files nothing references "
             f"({_human(sum(o.bytes for o in report.orphans))}); 'dumpdb verify{_a(archive)} --repair' removes those "
             f"older than --grace")
    scope = f"run {run}" if run else "archive"
    checked = (f"{report.blobs_checked} of {report.blobs_total} payloads ({_human(report.bytes_checked)}), "
               f"{report.shards_checked} shard checksums, {report.tensors_checked} tensor references, catalog")
    unchecked = []
    if report.tensors_pruned:
        unchecked.append(f"{report.tensors_pruned} tensors pruned (payloads dropped, last on "
                         f"{report.pruned_last:%Y-%m-%d %H:%M}: not checked)")
    if report.tensors_statistics_only:
        unchecked.append(f"{report.tensors_statistics_only} statistics-only (no payload dumped)")
    if report.ok:
        _say(f"ok: {scope}: {checked}: all as recorded" + (f"; {', '.join(unchecked)}" if unchecked else ""),
             style="green")
        return
    for array_path, reason in report.damaged_shards.items():
        _say(f"damaged shard {array_path}: {reason}", style="red")
    _say(f"damaged: {scope}: {len(report.damaged)} payloads ({report.blobs_checked} checked, "
         f"of {report.blobs_total} in scope; {report.tensors_checked} tensor references), "
         f"{len(report.damaged_shards)} shards, {len(report.catalog_problems)} catalog problems; "
         f"{report.damaged_tensors.num_rows} tensors affected" + (f"; {', '.join(unchecked)}" if unchecked else ""),
         style="red")
    if report.damaged_tensors.num_rows:
        _emit(report.damaged_tensors.select(["run", "tensor_id", "iteration", "op_name", "io", "slot", "reason"]),
              "table", None, max_rows=None)
    raise typer.Exit(EXIT_FOUND)


@app.command()
def layouts(
    fmt: str = FormatOpt,
    output: Optional[Path] = OutputOpt,
) -> None:
    """List the dump layouts dumpdb reads, with the public document that describes each."""
    from dumpdb.layouts import LAYOUTS

    _check_format(fmt, output)
    _emit(Rows(["layout", "description", "documented in"],
               [(lay.name, lay.description, public_source(lay.document)) for lay in LAYOUTS]),
          fmt, output, footer=False)


# The vendor documents behind the layouts' ``document`` notes ("seed NNN" are the copies the
# project keeps of them, which a pip user never sees; issue 30): their public titles and homes.
PUBLIC_DOCUMENTS = {
    "seed 000": "MindSpore r1.2 docs, 'Using Dump in the Graph Mode' (mindspore.cn, gitee.com/mindspore/docs r1.2)",
    "seed 001": "MindSpore docs, 'Dump功能调试' (mindspore.cn tutorials, debug/dump.md)",
    "seed 002": "MindSpore r1.3 docs, 'Using Dump in the Graph Mode' (mindspore.cn)",
    "seed 003": "Ascend CANN TensorFlow adapter docs, 'Dump Data Collection' (support.huaweicloud.com)",
    "seed 004": "TorchAir docs, '算子输入输出dump功能（图模式）' (gitee.com/ascend/torchair)",
}


def public_source(document: str) -> str:
    """A layout's ``document`` note as a user can follow it: each project copy of a vendor
    document ("seed NNN (section)") named by its public title and section; the project's
    own notes ("reference formats.md", "corpus ...": files not in the package) dropped, a
    version they give (``msprobe 26.2.0``) kept."""
    import re

    out = []
    for part in (p.strip() for p in re.split(r";(?![^()]*\))", document)):  # not inside "(...)"
        if part.startswith("corpus "):
            continue
        if part.startswith("reference "):
            found = re.search(r"\(([^)]*)\)", part)
            if found:  # e.g. "(msprobe 26.2.0)": the tool and version the format was read from
                out.append(f"{found.group(1)} documentation (its dump file format)")
            continue
        for seed in re.findall(r"seed (\d{3})", part):
            section = re.search(rf"seed {seed}\s*\(([^)]*)\)", part)
            doc = PUBLIC_DOCUMENTS.get(f"seed {seed}", f"seed {seed}")
            out.append(doc + (f", section {section.group(1)}" if section else ""))
        if not re.search(r"seed \d{3}", part):
            out.append(part)
    return "; ".join(dict.fromkeys(out))


def main() -> None:
    """Console-script entry point: the app with the top-level handler (see :class:`_Commands`).

    A Ctrl-C outside a command (while parsing, or in click itself) also ends as
    one line and exit 130, not click's "Aborted!".
    """
    from dumpdb import sigint

    try:
        app(standalone_mode=True)
    except KeyboardInterrupt:
        sigint.exit_interrupted()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(EXIT_OK)
