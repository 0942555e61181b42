"""Exceptions raised by dumpdb.

Every error dumpdb raises on purpose derives from :class:`DumpdbError`; its
message is one line that names the file or archive concerned and what is
wrong, so the CLI can print it as is (no traceback). Each class carries the
exit code the CLI ends with (``exit_code``), mapped in one place
(:func:`dumpdb.cli.main`).

Hierarchy::

    DumpdbError                      exit 2
    ├── ArchiveError                 the archive: missing, locked, read-only
    │   ├── CatalogVersionError      schema newer than this dumpdb, or not migratable
    │   └── CatalogCorrupt           catalog.duckdb cannot be opened or lacks tables
    ├── RunNotFound                  (also a LookupError)
    ├── TensorNotFound               (also a LookupError)
    ├── PayloadMissing               a tensor's stored bytes are gone
    ├── PayloadCorrupt               a tensor's stored bytes have the wrong length or hash
    ├── StorageError                 the tensor store cannot be reached or written
    ├── LayoutError                  no recognised dump layout (also BadDump)
    ├── BadDump                      the input as a whole is unusable
    ├── DumpFileError                one file of a dump (recorded, ingest goes on)
    ├── BundleError                  an export bundle is damaged, hostile or unreadable
    └── SourceChanged                exit 1: files of a dump differ from what the run holds

    DumpdbWarning (a UserWarning)    something left out on purpose (e.g. .pt payloads
                                     without PyTorch); the CLI prints it as one line
"""

from __future__ import annotations


class DumpdbError(Exception):
    """Base class of dumpdb's own errors."""

    exit_code = 2


class ArchiveError(DumpdbError):
    """The archive is missing, not an archive, read-only when writing, or locked."""


class CatalogVersionError(ArchiveError):
    """The catalog schema is newer than this dumpdb knows, or needs a migration
    that cannot be applied (e.g. the archive is read-only)."""


class CatalogCorrupt(ArchiveError):
    """``catalog.duckdb`` cannot be opened by DuckDB, or lacks tables or migrations."""


class RunNotFound(DumpdbError, LookupError):
    """No run of that name in the archive (see :func:`no_such_run`)."""


def no_such_run(run: str, where: object, con, prefix: str = "", hint: str = "") -> RunNotFound:
    """The one error for a run name the archive at ``where`` lacks, listing the runs it
    has (the first 10, then how many more) so a mistyped name is fixed at once (issue 30).
    ``con`` is a DuckDB connection to the catalog (anything with ``execute``); ``prefix``
    (e.g. ``"--moved: "``) and ``hint`` (``"; drop --moved ..."``) frame the message."""
    known = [r[0] for r in con.execute("SELECT run FROM runs ORDER BY run LIMIT 11").fetchall()]
    total = con.execute("SELECT count(*) FROM runs").fetchone()[0] if len(known) > 10 else len(known)
    shown = ", ".join(known[:10]) + (f", ... ({total} in all)" if total > 10 else "")
    return RunNotFound(f"{prefix}no run {run!r} in {where} (runs: {shown or 'none'}){hint}")


def require_run(con, run: str, where: object, prefix: str = "", hint: str = "") -> None:
    """Raise :func:`no_such_run`'s :class:`RunNotFound` unless the catalog behind ``con`` (a
    DuckDB connection) has a run named ``run``: the one check for a run name."""
    if con.execute("SELECT count(*) FROM runs WHERE run = ?", [run]).fetchall()[0][0] == 0:  # all: no open result
        raise no_such_run(run, where, con, prefix, hint)


class TensorNotFound(DumpdbError, LookupError):
    """No tensor matches the id or the (run, iteration, op_name, io, slot) key."""


class PayloadMissing(DumpdbError):
    """A tensor's payload bytes are not in the store (deleted shard, missing object).

    Never answered with zeros or fill values: the message names run/op/io/slot.
    """


class PayloadCorrupt(DumpdbError):
    """A tensor's payload bytes are there but their length or content hash is wrong."""


class StorageError(DumpdbError):
    """The tensor store cannot be reached, listed or written (disk full, server down)."""


class BadDump(DumpdbError):
    """The input directory as a whole cannot be ingested (missing, unreadable, empty)."""


class LayoutError(BadDump):
    """The input directory is missing or holds no dump layout dumpdb recognises."""


class DumpFileError(DumpdbError):
    """One dump file cannot be read (truncated, header lies, unknown dtype...).

    Ingest records these in ``ingest_errors`` and goes on with the other files.
    """


class BundleError(DumpdbError):
    """An export bundle is damaged, hostile (paths leaving it, bombs) or unreadable.

    Raised before anything of the bundle enters the archive.
    """


class SourceChanged(DumpdbError):
    """Files of a dump differ from what the run already holds (re-ingest without
    ``update``, or ``moved`` onto a directory that is not the same dump). Nothing was
    replaced. ``files`` lists ``(source_file, what differs)``, one per file. Exit 1."""

    exit_code = 1

    def __init__(self, message: str, files: list[tuple[str, str]]):
        super().__init__(message)
        self.files = files


class DumpdbWarning(UserWarning):
    """Something dumpdb left out on purpose and says once (e.g. ``.pt`` payloads not
    stored because PyTorch is missing: the statistics are kept). Not an error: exit 0."""


def shown(name: str) -> str:
    """A name read from the input (a zip member, an msprobe record key) as an error message
    shows it: as it is, or quoted and escaped (``repr``) when it holds a newline or another
    character that would break the message's one line. Found by hypothesis: an msprobe
    ``dump.json`` record named ``"\\n"`` and a bundle member named ``"\\n"``."""
    return name if name.isprintable() else repr(name)
