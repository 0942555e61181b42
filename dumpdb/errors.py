"""Exceptions raised by dumpdb.

Every error dumpdb raises on purpose derives from :class:`DumpdbError`; its
message is one line that names the file or archive concerned and what is
wrong, so the CLI can print it as is (no traceback).
"""


class DumpdbError(Exception):
    """Base class of dumpdb's own errors."""


class ArchiveError(DumpdbError):
    """The archive is missing, not an archive, read-only when writing, or locked."""


class CatalogVersionError(ArchiveError):
    """The catalog schema is newer than this dumpdb knows, or needs a migration
    that cannot be applied (e.g. the archive is read-only)."""


class LayoutError(DumpdbError):
    """The input directory is missing or holds no dump layout dumpdb recognises."""


class DumpFileError(DumpdbError):
    """One dump file cannot be read (truncated, header lies, unknown dtype...).

    Ingest records these in ``ingest_errors`` and goes on with the other files.
    """


class TensorNotFound(DumpdbError, LookupError):
    """No tensor matches the id or the (run, iteration, op_name, io, slot) key."""
