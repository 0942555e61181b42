"""Keeping an archive small over time: prune, rm, gc, migrate.

* :func:`prune` drops the payloads of a run (optionally some iterations) but keeps
  every catalog row and statistic: statistics queries still answer, ``tensor()``
  says the payload was pruned.
* :func:`remove_run` deletes a run's rows (tensors, graphs, errors, comparisons).
* :func:`gc` reclaims store space no payload refers to any more: arrays whose
  payloads are all unreferenced are deleted; packs that are mostly unreferenced are
  rewritten with their live payloads only (compaction). A payload another run still
  uses stays. New data is written and committed before old files are removed, so a
  crash during gc leaves at worst unreferenced files for the next gc.

Concurrency: ``prune`` and ``rm`` (like ingest and import) hold the archive's store
lock shared, ``gc`` holds it exclusive (:mod:`dumpdb.catalog.locks`), so gc never
runs while another process may be about to reference a payload it would delete; it
waits (saying for whom) up to the archive's lock timeout. Readers are not locked out:
run gc when no other process is reading tensors (a reader that looked up a payload's
location just before gc moved it would fail to read it, and says so).

Crash leftovers: files in the store no catalog row refers to (arrays written by an
ingest killed before its commit) and ``*.tmp-*`` shards of interrupted writes are
reclaimed by gc too, once older than a grace period (``grace`` seconds, default
:data:`GRACE_SECONDS`), so even a writer that does not take the lock (an older
dumpdb) keeps what it has not committed yet.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from datetime import datetime

from dumpdb.catalog import schema
from dumpdb.catalog.locks import EXCLUSIVE, SHARED, archive_lock
from dumpdb.errors import DumpdbError, DumpdbWarning, require_run
from dumpdb.storage.leftovers import Leftover, find_leftovers, reclaim_leftovers  # noqa: F401 (re-exported)

_RANGE_RE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")
GRACE_SECONDS = 3600.0  # uncommitted store files younger than this are kept (an ingest commits every ~10 s)


def parse_iterations(spec: str) -> list[tuple[int, int]]:
    """MindSpore's iteration syntax (seed 001: ``"0|5-8|100-120"``; ``"all"``) as
    inclusive ranges. Raises DumpdbError for anything else."""
    if spec.strip().lower() == "all":
        return [(0, 2**62)]
    ranges = []
    for part in spec.split("|"):
        m = _RANGE_RE.match(part)
        if not m:
            raise DumpdbError(f"bad iteration spec {spec!r}: write e.g. \"0|5-8|100-120\" or \"all\"")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            raise DumpdbError(f"bad iteration range {part.strip()!r} in {spec!r}: end before start")
        ranges.append((lo, hi))
    return ranges


def _iteration_sql(ranges: list[tuple[int, int]] | None, column: str = "iteration") -> tuple[str, list]:
    if not ranges:
        return "", []
    conds = " OR ".join(f"{column} BETWEEN ? AND ?" for _ in ranges)
    return f" AND ({conds})", [v for r in ranges for v in r]


def spans(values: list[int]) -> str:
    """Sorted integers as MindSpore-style spans: ``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    runs: list[list[int]] = []
    for v in sorted(set(values)):
        if runs and v == runs[-1][1] + 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    return ", ".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in runs)


def _check_selection(con, run: str, column: str, ranges: list[tuple[int, int]] | None, spec: str | None) -> None:
    """``spec`` must select something the run has: if none of its ranges does, DumpdbError
    (exit 2) naming what the run has; ranges that select nothing beside others that do are
    named in a :class:`DumpdbWarning` (the CLI prints it as one line)."""
    if not ranges or spec is None or spec.strip().lower() == "all":
        return
    have = [v for (v,) in con.execute(f"SELECT DISTINCT {column} FROM tensors WHERE run = ? AND {column} "
                                      "IS NOT NULL", [run]).fetchall()]
    absent = [f"{lo}-{hi}" if hi != lo else str(lo) for lo, hi in ranges
              if not any(lo <= v <= hi for v in have)]
    if not absent:
        return
    word = {"iteration": "iterations", "rank": "ranks"}[column]
    what = f"run {run!r} has no {column} {', '.join(absent)} (its {word}: {spans(have) or 'none recorded'})"
    if len(absent) == len(ranges):
        raise DumpdbError(f"{what}; nothing pruned")
    warnings.warn(f"{what}; pruning the {word} it has", DumpdbWarning, stacklevel=3)


def prune(archive, run: str, iterations: str | None = None, ranks: str | None = None) -> int:
    """Drop the payloads of ``run`` (or of its ``iterations`` and/or ``ranks``, MindSpore
    syntax ``"0|5-8"``), keeping rows and statistics. Returns the number of tensors
    pruned (0 if those were pruned already). Space comes back with :func:`gc`.

    Raises :class:`DumpdbError` (exit 2, nothing pruned) for an unknown run, a bad spec,
    or a spec none of whose ranges selects an iteration (rank) the run has, naming the ones
    it has; ranges selecting nothing beside ones that do are named in a
    :class:`~dumpdb.errors.DumpdbWarning`."""
    ranges = parse_iterations(iterations) if iterations else None
    rank_ranges = parse_iterations(ranks) if ranks else None
    where, params = _iteration_sql(ranges)
    rank_where, rank_params = _iteration_sql(rank_ranges, "rank")
    where, params = where + rank_where, params + rank_params
    with archive_lock(archive, SHARED, f"prune of run {run!r}"), archive.catalog.writer() as con:
        require_run(con, run, archive.path)
        _check_selection(con, run, "iteration", ranges, iterations)
        _check_selection(con, run, "rank", rank_ranges, ranks)
        n = con.execute(f"SELECT count(*) FROM tensors WHERE run = ? AND pruned_at IS NULL "
                        f"AND content_hash IS NOT NULL{where}", [run, *params]).fetchone()[0]
        con.execute(f"UPDATE tensors SET pruned_at = ? WHERE run = ? AND pruned_at IS NULL "
                    f"AND content_hash IS NOT NULL{where}", [datetime.now(), run, *params])
    return n


def remove_run(archive, run: str) -> int:
    """Delete every row of ``run`` (tensors, graph relations, errors, comparisons that
    involve it). Returns the number of tensors removed. Space comes back with :func:`gc`."""
    with archive_lock(archive, SHARED, f"rm of run {run!r}"), archive.catalog.writer() as con:
        require_run(con, run, archive.path)
        n = con.execute("SELECT count(*) FROM tensors WHERE run = ?", [run]).fetchone()[0]
        ids = "SELECT compare_id FROM compares WHERE target_run = ? OR bench_run = ?"
        con.execute(f"DELETE FROM compare_results WHERE compare_id IN ({ids})", [run, run])
        con.execute(f"DELETE FROM compare_unmatched WHERE compare_id IN ({ids})", [run, run])
        con.execute("DELETE FROM compares WHERE target_run = ? OR bench_run = ?", [run, run])
        for table in schema.run_tables():
            con.execute(f"DELETE FROM {table} WHERE run = ?", [run])
    return n


@dataclass
class GcReport:
    """What :func:`gc` did. Bytes are on-disk bytes of the store."""

    arrays_deleted: int = 0
    packs_compacted: int = 0
    blobs_dropped: int = 0
    orphans_deleted: int = 0  # store arrays no catalog row refers to (crashed writes)
    temp_files_deleted: int = 0  # leftover *.tmp-* shards of interrupted writes
    kept_recent: int = 0  # uncommitted files younger than the grace period, kept
    bytes_before: int = 0
    bytes_after: int = 0

    @property
    def reclaimed(self) -> int:
        """Bytes of store space freed (``bytes_before - bytes_after``)."""
        return self.bytes_before - self.bytes_after


_LIVE = "(SELECT DISTINCT content_hash FROM tensors WHERE content_hash IS NOT NULL AND pruned_at IS NULL)"


def gc(archive, compact_below: float = 0.5, grace: float = GRACE_SECONDS) -> GcReport:
    """Reclaim store space no live tensor uses (see module docstring).

    A pack whose live payload bytes are under ``compact_below`` of its total is
    rewritten with the live payloads only; a pack or array with no live payload is
    deleted; store files no catalog row refers to, and ``*.tmp-*`` shards, are deleted
    once older than ``grace`` seconds. Holds the store lock exclusive (waits for
    ingest/import/rm/prune; raises :class:`~dumpdb.errors.ArchiveError` naming them
    after the archive's lock timeout). Returns a :class:`GcReport`.
    """
    if grace < 0:
        raise DumpdbError(f"--grace {grace:g}: give seconds >= 0")
    with archive_lock(archive, EXCLUSIVE, "gc"):
        return _gc(archive, compact_below, grace)


def _gc(archive, compact_below: float, grace: float) -> GcReport:
    from dumpdb.catalog.payload_rows import record_payloads
    from dumpdb.storage.payloads import copy_payloads
    from dumpdb.storage.store import StoreWriter

    store = archive.writable_store()
    report = GcReport(bytes_before=store.stored_bytes())
    with archive.catalog.reader() as con:
        usage = con.sql(f"""
            SELECT a.array_path, a.kind, CAST(coalesce(sum(b.nbytes), 0) AS BIGINT) AS total,
                   CAST(coalesce(sum(CASE WHEN l.content_hash IS NOT NULL THEN b.nbytes END), 0) AS BIGINT) AS live
            FROM arrays a LEFT JOIN blobs b USING (array_path)
            LEFT JOIN {_LIVE} l ON l.content_hash = b.content_hash
            GROUP BY ALL""").to_arrow_table().to_pylist()
    dead = [u["array_path"] for u in usage if u["live"] == 0]
    sparse = [u["array_path"] for u in usage
              if u["kind"] == "pack" and 0 < u["live"] < compact_below * u["total"]]
    # 0. crash leftovers: listed before this gc writes anything of its own
    # (local: temp names, unfinished arrays; object storage: arrays from its streamed listing)
    leftovers = find_leftovers(store, {u["array_path"] for u in usage})
    # 1. rewrite sparse packs: new pack written and committed before the old one goes
    if sparse:
        writer = StoreWriter(store)
        with archive.catalog.reader() as con:
            live_blobs = con.execute(
                f"SELECT content_hash, array_path, elem_offset, elem_count FROM blobs "
                f"WHERE array_path IN (SELECT unnest(?)) AND content_hash IN {_LIVE} "
                "ORDER BY array_path, elem_offset", [sparse]).fetchall()
        locations = copy_payloads(store, writer, live_blobs)
        arrays = writer.take_arrays()
        writer.close()
        with archive.catalog.writer() as con:
            record_payloads(con, locations, arrays, relocate=True)
        report.packs_compacted = len(sparse)
        dead.extend(sparse)
    # 2. drop unreferenced blobs and arrays from the catalog, then their files
    with archive.catalog.writer() as con:
        report.blobs_dropped = con.execute(
            f"SELECT count(*) FROM blobs WHERE content_hash NOT IN {_LIVE}").fetchone()[0]
        con.execute(f"DELETE FROM blobs WHERE content_hash NOT IN {_LIVE}")
        if dead:
            con.execute("DELETE FROM arrays WHERE array_path IN (SELECT unnest(?))", [dead])
    for array_path in dead:
        store.delete_array(array_path)
    report.arrays_deleted = len(dead)
    # 3. crash leftovers older than the grace period
    report.orphans_deleted, report.temp_files_deleted, report.kept_recent = reclaim_leftovers(
        store, leftovers, grace)
    report.bytes_after = store.stored_bytes()
    return report
