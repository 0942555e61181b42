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
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, cast

import typer
from typer.core import TyperGroup

from dumpdb import __version__
from dumpdb.compare.choices import MODES, RULES, STRATEGIES
from dumpdb.errors import DumpdbError
from dumpdb.render import text
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


def _open(path: Optional[Path], on_wait=None, hold: bool = False):
    """The archive at ``path`` (a directory, or a bundle's URL); ``hold``: holding its catalog
    connection (:class:`~dumpdb.archive.Archive`'s ``hold``; the caller closes it)."""
    from dumpdb.archive import Archive

    url = _url(path)
    if url is not None:  # a bundle on object storage, read-only in place
        import dumpdb

        opened = dumpdb.open(url, storage_options=_storage_options())
        return opened.__enter__() if hold else opened
    return Archive(_archive_path(path), on_wait=on_wait or _wait_line, lock_timeout=_lock_timeout(),
                   storage_options=_storage_options(), verify_reads=_state.get("verify_reads", True), hold=hold)


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


class _NoProgress:
    """What a disabled ``rich.progress.Progress`` does, without importing it (~6 ms of CPU)."""

    def __enter__(self) -> _NoProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def add_task(self, description: str, **fields: Any) -> int:
        return 0

    def update(self, task: int, **fields: Any) -> None:
        return None


def _progress(label: str):
    """A transient progress bar on stderr; none when stderr is not a terminal (logs stay clean)."""
    console = _console(True)
    if not console.is_terminal:
        return _NoProgress()
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    return Progress(SpinnerColumn(), TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console, transient=True)


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
    from dumpdb.render.progress import RichReporter

    return RichReporter(_console(True), quiet)


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
    codec: Optional[str] = typer.Option(
        None, "--codec", metavar="zstd|lz4",
        help="Compressor of a new archive's tensor store: zstd (default, smallest) or lz4 (made for reading: "
             "large payloads read about as fast as np.load, for ~1.3x the bytes). Kept by the archive for every "
             "later ingest."),
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
                            update=update, moved=moved, verify_hash=verify_hash, delta=not no_delta,
                            codec=codec)
    finally:
        if not existed and is_archive(path):
            _say(f"created archive {path}", stderr=True)
    _say(text.ingest_text(report), stderr=True)
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
    _say(text.ingest_text(report), stderr=True)
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


@app.command()
def tables(archive: Optional[Path] = ArchiveOpt, fmt: str = FormatOpt, output: Optional[Path] = OutputOpt) -> None:
    """List the catalog's tables with their row counts and what each holds."""
    _check_format(fmt, output)
    _emit(_open(archive).tables(), fmt, output)


@app.command()
def schema(
    table: Optional[str] = typer.Argument(None, help="Table (default: every table)."),
    archive: Optional[Path] = ArchiveOpt,
    fmt: str = FormatOpt,
    output: Optional[Path] = OutputOpt,
) -> None:
    """Columns of the catalog's tables: name, type and meaning (DuckDB's column comments)."""
    _check_format(fmt, output)
    columns = _open(archive).columns(table)
    _emit(columns.drop_columns(["table"]) if table else columns, fmt, output)


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
    records = table.to_pylist()
    hints = [f"run {r['run']} is {r['state']}; complete it with: {_complete(r, archive)}"
             for r in records if r["complete_command"]]
    _emit(Rows(text.RUNS_COLUMNS, [text.runs_row(r) for r in records]), fmt, output, footer=False)
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

    lines = text.show_fields(info, _complete(info, archive) if info["complete_command"] else None)
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
    strategies = strategy  # a tuple of names (parsed by StrategyOpt)
    options = dict(iteration=iteration, rank=rank, mapping=mapping, mode=mode,
                   thresholds=_thresholds(threshold), workers=workers, store_results=store, bench_rank=bench_rank,
                   rules=rules, scheduler=scheduler)
    if strategies:
        options["strategies"] = strategies
    # A statistics compare (catalog queries alone, about a second) holds one catalog connection
    # throughout, the one that checked the schema: 1 DuckDB connect instead of 4 (~12 ms of CPU
    # each; the engine closes it to store the results). Other modes read payloads for minutes
    # maybe, while other processes' writes must not wait: a connection per query, as before.
    a = _open(archive, hold=mode == "statistics")
    try:
        with _progress("comparing") as bar:
            task = bar.add_task("compare", total=None)
            outcome = a.comparison(target, bench,
                                   progress=lambda done, total: bar.update(task, completed=done, total=total),
                                   **options)
    finally:
        a.close()
    sm = outcome.summary
    if sm["pairs"] == 0:
        raise DumpdbError(
            f"no pairs formed between {sm['target']} and {sm['bench']} ({sm['unmatched_target']} target, "
            f"{sm['unmatched_bench']} bench tensors unmatched): check the selections (iteration, rank) "
            "or give a --mapping")
    return outcome


def _print_divergence(fd, summary: dict | None = None, stderr: bool = False) -> None:
    for i, line in enumerate(text.divergence_lines(fd, summary)):
        style = "green" if fd is None else ("bold red" if i == 0 else None)
        _say(line, stderr=stderr, style=style)
    for line in text.alignment_lines(summary):
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
    for line in text.compare_summary_lines(sm):
        _say(line, stderr=rows_out)
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
        _say(text.unmatched_line(outcome.unmatched.to_pylist()), stderr=rows_out)
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
    return (archive, *_open(archive).step_pair(t_name, b_name))


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
    bad = _open(archive).first_bad_rank(run, iteration=iteration)
    if fmt != "table" or output is not None:
        _emit(bad, fmt, output)
    elif bad.num_rows == 0:
        _say("no rank has a NaN/Inf tensor", style="green")
        return
    else:
        _say(text.first_bad_line(bad.to_pylist()[0]))
        _emit(bad.select(["order", "rank", "iteration", "position", "timestamp", "op_name", "io", "slot",
                          "nan_count", "inf_count", "code_line", "code_text"]), fmt, None, max_rows=max_rows or None)
    if bad.num_rows:
        raise typer.Exit(EXIT_FOUND)


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
    _check_format(fmt, output)
    a = _open(archive)
    table = a.ranks(run, iteration=iteration, scheduler=scheduler)
    if html:
        from dumpdb.render.ranks_report import write_ranks_report

        write_ranks_report(html, run=run, groups=table, first_bad=a.first_bad_rank(run, iteration=iteration))
        _say(f"HTML report written to {html}", stderr=True, style="dim")
    if fmt != "table" or output is not None:
        _emit(table, fmt, output)
        return
    for line in text.ranks_lines(run, table.to_pylist()):
        _say(line)
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
    _say(text.gc_line(report))


@app.command()
def migrate(archive: Optional[Path] = ArchiveOpt, fmt: str = _report_format_opt()) -> None:
    """Upgrade the catalog schema (also done automatically on open; a copy goes to backups/)."""
    from dumpdb.catalog import latest_version

    applied = _open(archive).migrate()
    if fmt == "json":
        _print_json({"applied": [f"{m.version:03d}_{m.name}" for m in applied],
                     "schema_version": applied[-1].version if applied else latest_version()})
        return
    _say(text.migrate_line(applied, latest_version()))


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
    size = text.human(path.stat().st_size) if path.is_file() else "directory"
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
    for line in text.import_lines(report):
        _say(line)


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
    for line, style in text.verify_lines(report, run, f"dumpdb verify{_a(archive)}"):
        _say(line, style=style)
    if report.ok:
        return
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
               [(lay.name, lay.description, text.public_source(lay.document)) for lay in LAYOUTS]),
          fmt, output, footer=False)


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
