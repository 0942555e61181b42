"""Verifying an archive: the catalog, every tensor's payload reference, every stored
payload read back and hashed again, and what nothing references.

The catalog: DuckDB can open and read it (every table scanned), every table the
migrations create is there, every migration is recorded in ``schema_version``, and the
row counts equal the summary recorded at the last commit (``catalog.summary.json``,
:func:`dumpdb.catalog.connection.write_summary`): a catalog rolled back or replaced
since shows. References: every live tensor's ``content_hash`` has a ``blobs`` row
whose array is in ``arrays`` and on disk, the tensor's ``nbytes`` equals the
payload's and ``prod(shape) x itemsize`` (the check that the old blob walk missed:
tensors whose payloads gc had deleted). Orphans: store arrays no catalog row names
and ``*.tmp-*`` shards left by crashed writes; ``repair`` deletes those older than the
grace period (under the store lock, like gc).

Two checks. Every shard file's crc32c, recorded when it was written
(``arrays.checksum``), is recomputed: any changed byte in a shard shows. And every
payload was hashed (xxh3-128) when it was ingested, and that hash is its key
(``blobs.content_hash``). :func:`verify` reads each payload back through the
store - which also checks each pack's shard index against its crc32c and that
every zstd frame decodes to a full chunk - hashes the bytes again and compares.
A flipped bit anywhere in a shard's data makes the hash differ (or the frame fail
to decode); a damaged index fails its checksum. Damaged payloads are reported
with every tensor that uses them (run, op, io, slot), since one payload may be
shared by many tensors and runs.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import xxhash

from dumpdb.errors import DumpdbError, require_run


@dataclass
class VerifyReport:
    """What :func:`verify` found. ``damaged`` maps content hash -> reason."""

    blobs_checked: int = 0
    blobs_total: int = 0
    bytes_checked: int = 0
    shards_checked: int = 0
    damaged: dict[str, str] = field(default_factory=dict)
    damaged_shards: dict[str, str] = field(default_factory=dict)  # array path -> reason
    damaged_tensors: pa.Table | None = None
    catalog_problems: list[str] = field(default_factory=list)  # one line each
    tensors_checked: int = 0  # tensor -> payload references checked (stored tensors: payload kept)
    tensors_pruned: int = 0  # payload dropped by prune: nothing to check (not counted as checked)
    tensors_statistics_only: int = 0  # no payload was dumped
    pruned_last: Any = None  # datetime of the last prune in scope (None: nothing pruned)
    orphans: list = field(default_factory=list)  # maintenance.Leftover: unreferenced store files
    repaired: int = 0  # orphans and temp files removed by repair

    @property
    def ok(self) -> bool:
        """No damage and a sound catalog (orphans waste space but lose nothing)."""
        return not self.damaged and not self.damaged_shards and not self.catalog_problems


def _payload_bytes(store, row: dict) -> np.ndarray:
    """The stored bytes of one blob, as uint8."""
    data = store.read_payload(row["array_path"], row["elem_offset"], row["elem_count"] or 0, row["content_hash"],
                              verify=False)  # hashed below, where damage is recorded rather than raised
    return np.ascontiguousarray(data).reshape(-1).view(np.uint8)


def verify(archive, run: str | None = None, *, sample: float | None = None, seed: int | None = None,
           progress: Callable[[int, int], None] | None = None, repair: bool = False,
           grace: float | None = None) -> VerifyReport:
    """Check the catalog, every tensor -> payload reference, and re-read and re-hash the
    stored payloads of ``run`` (all runs if None); list orphans (whole archive only).

    With ``run``, the payloads checked are those of its stored tensors; its pruned
    tensors are counted in ``tensors_pruned`` (their payloads are gone or going: not
    checked, not counted as checked) and its statistics-only ones in
    ``tensors_statistics_only``.

    ``sample`` in (0, 1] checks that fraction of the payloads, chosen at random
    (``seed`` makes the choice repeatable). ``repair`` deletes orphans and temp files
    older than ``grace`` seconds (default: gc's; younger ones are not listed). Returns a :class:`VerifyReport`;
    ``damaged_tensors`` lists (run, tensor_id, iteration, op_name, io, slot,
    source_file, content_hash, reason) of every tensor whose payload is damaged,
    missing, or of the wrong size. Raises DumpdbError for an unknown run or a bad
    sample fraction.
    """
    if sample is not None and not 0 < sample <= 1:
        raise DumpdbError(f"--sample {sample}: give a fraction in (0, 1], e.g. 0.05")
    if repair:
        from dumpdb.catalog.locks import EXCLUSIVE, archive_lock

        with archive_lock(archive, EXCLUSIVE, "verify --repair"):
            return _verify(archive, run, sample, seed, progress, True, grace)
    return _verify(archive, run, sample, seed, progress, False, grace)


def _verify(archive, run, sample, seed, progress, repair: bool, grace: float | None) -> VerifyReport:
    from dumpdb.archival.maintenance import GRACE_SECONDS, find_leftovers, reclaim_leftovers

    catalog_problems = check_catalog(archive)
    where, params = "", []
    with archive.reader() as con:
        if run is not None:
            require_run(con, run, archive.path)
            # the payloads of its stored tensors; pruned tensors' payloads are not the run's any more
            where = "WHERE content_hash IN (SELECT content_hash FROM tensors WHERE run = ? AND pruned_at IS NULL)"
            params = [run]
        report_counts = con.execute(
            "SELECT count(*) FILTER (pruned_at IS NOT NULL), count(*) FILTER (content_hash IS NULL), max(pruned_at) "
            "FROM tensors" + (" WHERE run = ?" if run is not None else ""), params).fetchone()
        blobs = con.execute(
            f"SELECT content_hash, nbytes, array_path, elem_offset, elem_count FROM blobs {where} "
            "ORDER BY array_path, elem_offset", params).fetchall()
    rows = [dict(zip(("content_hash", "nbytes", "array_path", "elem_offset", "elem_count"), b)) for b in blobs]
    report = VerifyReport(blobs_total=len(rows), tensors_pruned=report_counts[0],
                          tensors_statistics_only=report_counts[1], pruned_last=report_counts[2])
    if sample is not None and rows:
        rng = random.Random(seed)
        keep = max(1, round(len(rows) * sample))
        rows = sorted(rng.sample(rows, keep), key=lambda r: (r["array_path"] or "", r["elem_offset"] or 0))
    store = archive.store
    # every payload read as pread copies, none mapped: a disk read error is then an OSError
    # reported as damage below, not SIGBUS killing the process (ObjectStore.map_reads)
    # (restored after: a library caller's later compare of the same Archive maps again)
    maps, store.objects.map_reads = store.objects.map_reads, False
    try:
        for i, row in enumerate(rows):
            try:
                data = _payload_bytes(store, row)
                if data.size != row["nbytes"]:
                    raise ValueError(f"{data.size} bytes stored, catalog says {row['nbytes']}")
                digest = xxhash.xxh3_128_hexdigest(data.data)
                if digest != row["content_hash"]:
                    raise ValueError("content hash mismatch: the stored bytes changed")
            except (OSError, ValueError, RuntimeError, KeyError, DumpdbError) as exc:
                where_ = row["array_path"] or "(empty)"
                report.damaged[row["content_hash"]] = f"{where_}: {exc}"
            else:
                report.bytes_checked += row["nbytes"]
            report.blobs_checked += 1
            if progress:
                progress(i + 1, len(rows))
    finally:
        store.objects.map_reads = maps
    _check_shards(archive, {r["array_path"] for r in rows if r["array_path"]}, report)
    report.catalog_problems = catalog_problems
    bad_refs, report.tensors_checked = _check_references(archive, run)
    for content_hash, reason in bad_refs.items():
        report.damaged[content_hash] = reason  # "missing" says more than the read failure it caused
    report.damaged_tensors = _tensors_of(archive, report.damaged, run)
    sizes = _size_mismatches(archive, run)
    if sizes.num_rows:
        report.damaged_tensors = pa.concat_tables([report.damaged_tensors, sizes.cast(report.damaged_tensors.schema)])
        report.damaged.update({r["content_hash"]: r["reason"] for r in sizes.to_pylist()
                               if r["content_hash"] not in report.damaged})
    if run is None:  # crash leftovers: a local store's files, or an object store's streamed listing
        with archive.reader() as con:
            known = {r[0] for r in con.execute("SELECT array_path FROM arrays").fetchall()}
        wait = GRACE_SECONDS if grace is None else grace
        # younger files may belong to a writer that has not committed yet: neither listed nor removed
        report.orphans = [o for o in find_leftovers(archive.store, known) if o.age >= wait]
        if repair:
            removed = reclaim_leftovers(archive.writable_store(), report.orphans, wait)
            report.repaired = removed[0] + removed[1]
            report.orphans = []
    return report


def check_catalog(archive) -> list[str]:
    """Problems of the catalog itself, one line each (empty: sound). See module docstring."""
    from dumpdb.catalog.connection import expected_tables, read_summary
    from dumpdb.catalog.migrations import load_migrations

    problems = []
    with archive.reader() as con:
        tables = {r[0] for r in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main'").fetchall()}
        missing = sorted(expected_tables() - tables)
        if missing:
            problems.append(f"catalog lacks the table(s) {', '.join(missing)}")
        if "schema_version" in tables:
            have = {v for (v,) in con.execute("SELECT version FROM schema_version").fetchall()}
            absent = [f"{m.version:03d}_{m.name}" for m in load_migrations() if m.version not in have]
            if absent:
                problems.append(f"schema_version lacks the migration(s) {', '.join(absent)}")
        counts = {}
        for table in sorted(tables):
            try:  # read every column of every row: damaged blocks show here, not in a later query
                counts[table] = con.execute(f'SELECT count(*), bit_xor(hash(x)) FROM "{table}" AS x').fetchone()[0]
            except duckdb.Error as exc:
                problems.append(f"table {table} cannot be read ({str(exc).splitlines()[0]})")
        summary = read_summary(archive.catalog.path)
    if summary is not None and not ("before" in summary and summary["before"] is None):
        # a commit interrupted between its two summary writes: either state is the truth
        states = [summary["rows"]] + ([summary["before"]] if isinstance(summary.get("before"), dict) else [])
        differ = [f"{t} {counts.get(t)} (recorded {n})" for t, n in sorted(summary["rows"].items())
                  if t in counts and counts[t] != n]
        if any(all(counts.get(t) == n for t, n in state.items() if t in counts) for state in states):
            differ = []
        if differ:
            problems.append(f"row counts differ from the summary recorded at the last commit "
                            f"({summary.get('committed')}): {', '.join(differ)}")
    return problems


def _check_references(archive, run: str | None) -> tuple[dict[str, str], int]:
    """Live tensors' payload references: hash -> what is wrong (no blobs row, array
    not in ``arrays``, array or shard file gone). Also returns how many tensors were checked."""
    where, params = ("AND t.run = ?", [run]) if run is not None else ("", [])
    with archive.reader() as con:
        checked = con.execute(f"SELECT count(*) FROM tensors t WHERE t.content_hash IS NOT NULL "
                              f"AND t.pruned_at IS NULL {where}", params).fetchone()[0]
        rows = con.execute(f"""
            SELECT DISTINCT t.content_hash, b.content_hash IS NOT NULL, b.array_path, a.array_path IS NOT NULL,
                   len(a.shape)
            FROM tensors t LEFT JOIN blobs b USING (content_hash) LEFT JOIN arrays a ON a.array_path = b.array_path
            WHERE t.content_hash IS NOT NULL AND t.pruned_at IS NULL {where}""", params).fetchall()
    from dumpdb.storage.store import shard_key

    objects = archive.store.objects
    bad: dict[str, str] = {}
    for content_hash, has_blob, array_path, has_array, ndim in rows:
        if not has_blob:
            bad[content_hash] = "payload missing: no blobs row (deleted while this tensor was committed?)"
        elif array_path is None:
            continue  # an empty payload
        elif not has_array:
            bad[content_hash] = f"{array_path}: payload missing: array not in the catalog's arrays"
        else:
            if not objects.exists(shard_key(array_path, ndim)):
                bad[content_hash] = f"{array_path}: payload missing: shard file gone"
    return bad, checked


def _size_mismatches(archive, run: str | None) -> pa.Table:
    """Live tensors whose ``nbytes`` differs from their payload's or from shape x itemsize."""
    from dumpdb.dtypes import from_catalog_name

    where, params = ("AND t.run = ?", [run]) if run is not None else ("", [])
    with archive.reader() as con:
        dtypes = [d for (d,) in con.execute("SELECT DISTINCT dtype FROM tensors WHERE dtype IS NOT NULL").fetchall()]
        sizes = {}
        for d in dtypes:
            try:
                sizes[d] = from_catalog_name(d).itemsize
            except (TypeError, ValueError):
                sizes[d] = -1  # an unknown dtype: every tensor of it is reported
        con.register("_itemsize", pa.table({"dtype": pa.array(list(sizes), pa.string()),
                                            "itemsize": pa.array(list(sizes.values()), pa.int64())}))
        try:
            return con.sql(f"""
                SELECT t.run, t.tensor_id, t.iteration, t.op_name, t.io, t.slot, t.source_file, t.content_hash,
                       'size: tensor says ' || t.nbytes || ' bytes, payload ' || b.nbytes || ', dtype x shape '
                       || (coalesce(CAST(list_product(t.shape) AS BIGINT), 1) * i.itemsize) AS reason
                FROM tensors t JOIN blobs b USING (content_hash) JOIN _itemsize i USING (dtype)
                WHERE t.pruned_at IS NULL {where} AND (t.nbytes IS DISTINCT FROM b.nbytes OR
                      t.nbytes IS DISTINCT FROM coalesce(CAST(list_product(t.shape) AS BIGINT), 1) * i.itemsize)
                ORDER BY t.tensor_id""", params=params).to_arrow_table()
        finally:
            con.unregister("_itemsize")


def _check_shards(archive, array_paths: set[str], report: VerifyReport) -> None:
    """Compare each shard file's crc32c with the one recorded when it was written
    (``arrays.checksum``; arrays written before schema 5 have none)."""
    if not array_paths:
        return
    with archive.reader() as con:
        recorded = con.execute("SELECT array_path, checksum, shape FROM arrays WHERE checksum IS NOT NULL "
                               "AND array_path IN (SELECT unnest(?))", [sorted(array_paths)]).fetchall()
    store = archive.store
    for array_path, checksum, shape in recorded:
        try:
            actual = store.shard_checksum(array_path, len(shape))
        except (OSError, DumpdbError) as exc:
            shard = store.shard_name(array_path, len(shape))
            report.damaged_shards[array_path] = f"cannot read {shard}: {getattr(exc, 'strerror', None) or exc}"
            continue
        report.shards_checked += 1
        if actual != checksum:
            report.damaged_shards[array_path] = f"shard checksum {actual} differs from the recorded {checksum}"


def _tensors_of(archive, damaged: dict[str, str], run: str | None) -> pa.Table:
    hashes = pa.table({"content_hash": pa.array(list(damaged), pa.string()),
                       "reason": pa.array(list(damaged.values()), pa.string())})
    with archive.reader() as con:
        con.register("_damaged", hashes)
        try:
            query = ("SELECT t.run, t.tensor_id, t.iteration, t.op_name, t.io, t.slot, t.source_file, "
                     "t.content_hash, d.reason FROM tensors t JOIN _damaged d USING (content_hash)")
            if run is not None:
                return con.sql(query + " WHERE t.run = ? ORDER BY t.tensor_id", params=[run]).to_arrow_table()
            return con.sql(query + " ORDER BY t.tensor_id").to_arrow_table()
        finally:
            con.unregister("_damaged")
