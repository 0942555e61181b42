"""Verifying an archive: every stored payload read back and hashed again.

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

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import xxhash

from dumpdb.errors import DumpdbError


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

    @property
    def ok(self) -> bool:
        return not self.damaged and not self.damaged_shards


def _payload_bytes(store, row: dict) -> np.ndarray:
    """The stored bytes of one blob, as uint8."""
    if row["array_path"] is None:
        return np.empty(0, np.uint8)
    if row["elem_offset"] is None:
        data = np.asarray(store.array(row["array_path"])[...])
    else:
        data = store.read_pack_range(row["array_path"], row["elem_offset"], row["elem_count"] or 0)
    return np.ascontiguousarray(data).reshape(-1).view(np.uint8)


def verify(archive, run: str | None = None, *, sample: float | None = None, seed: int | None = None,
           progress: Callable[[int, int], None] | None = None) -> VerifyReport:
    """Re-read and re-hash the stored payloads of ``run`` (all runs if None).

    ``sample`` in (0, 1] checks that fraction of the payloads, chosen at random
    (``seed`` makes the choice repeatable). Returns a :class:`VerifyReport`;
    ``damaged_tensors`` lists (run, tensor_id, iteration, op_name, io, slot,
    source_file, content_hash) of every tensor whose payload is damaged.
    Raises DumpdbError for an unknown run or a bad sample fraction.
    """
    if sample is not None and not 0 < sample <= 1:
        raise DumpdbError(f"--sample {sample}: give a fraction in (0, 1], e.g. 0.05")
    where, params = "", []
    with archive._reader() as con:
        if run is not None:
            if not con.execute("SELECT count(*) FROM runs WHERE run = ?", [run]).fetchone()[0]:
                raise DumpdbError(f"no run {run!r} in {archive.path}")
            where = "WHERE content_hash IN (SELECT content_hash FROM tensors WHERE run = ?)"
            params = [run]
        blobs = con.execute(
            f"SELECT content_hash, nbytes, array_path, elem_offset, elem_count FROM blobs {where} "
            "ORDER BY array_path, elem_offset", params).fetchall()
    rows = [dict(zip(("content_hash", "nbytes", "array_path", "elem_offset", "elem_count"), b)) for b in blobs]
    report = VerifyReport(blobs_total=len(rows))
    if sample is not None and rows:
        rng = random.Random(seed)
        keep = max(1, round(len(rows) * sample))
        rows = sorted(rng.sample(rows, keep), key=lambda r: (r["array_path"] or "", r["elem_offset"] or 0))
    store = archive.store
    for i, row in enumerate(rows):
        try:
            data = _payload_bytes(store, row)
            if data.size != row["nbytes"]:
                raise ValueError(f"{data.size} bytes stored, catalog says {row['nbytes']}")
            digest = xxhash.xxh3_128_hexdigest(data)
            if digest != row["content_hash"]:
                raise ValueError("content hash mismatch: the stored bytes changed")
        except (OSError, ValueError, RuntimeError, KeyError) as exc:
            where_ = row["array_path"] or "(empty)"
            report.damaged[row["content_hash"]] = f"{where_}: {exc}"
        else:
            report.bytes_checked += row["nbytes"]
        report.blobs_checked += 1
        if progress:
            progress(i + 1, len(rows))
    _check_shards(archive, {r["array_path"] for r in rows if r["array_path"]}, report)
    report.damaged_tensors = _tensors_of(archive, report.damaged, run)
    return report


def _check_shards(archive, array_paths: set[str], report: VerifyReport) -> None:
    """Compare each shard file's crc32c with the one recorded when it was written
    (``arrays.checksum``; arrays written before schema 5 have none)."""
    from dumpdb.storage.shard import file_checksum

    if not array_paths:
        return
    with archive._reader() as con:
        recorded = con.execute("SELECT array_path, checksum, shape FROM arrays WHERE checksum IS NOT NULL "
                               "AND array_path IN (SELECT unnest(?))", [sorted(array_paths)]).fetchall()
    root = archive.path / "tensors.zarr"
    for array_path, checksum, shape in recorded:
        kind_1d = len(shape) <= 1
        shard = root / array_path / "c" / ("0" if kind_1d else "/".join(["0"] * len(shape)))
        try:
            actual = file_checksum(str(shard))
        except OSError as exc:
            report.damaged_shards[array_path] = f"cannot read {shard.relative_to(root)}: {exc.strerror or exc}"
            continue
        report.shards_checked += 1
        if actual != checksum:
            report.damaged_shards[array_path] = f"shard checksum {actual} differs from the recorded {checksum}"


def shard_file(root: Path, array_path: str, ndim: int | None = None) -> Path | None:
    """The one shard file of a dumpdb array (packs: ``c/0``; large arrays: ``c/0/0/...``,
    one ``0`` per dimension); ``ndim`` None reads it from ``zarr.json``. None if the
    array's metadata is gone or unreadable."""
    if ndim is None:
        try:
            ndim = len(json.loads((root / array_path / "zarr.json").read_bytes()[: 1 << 20])["shape"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
    return root / array_path / "c" / ("0" if ndim <= 1 else "/".join(["0"] * ndim))


def _tensors_of(archive, damaged: dict[str, str], run: str | None) -> pa.Table:
    hashes = pa.table({"content_hash": pa.array(list(damaged), pa.string()),
                       "reason": pa.array(list(damaged.values()), pa.string())})
    with archive._reader() as con:
        con.register("_damaged", hashes)
        try:
            query = ("SELECT t.run, t.tensor_id, t.iteration, t.op_name, t.io, t.slot, t.source_file, "
                     "t.content_hash, d.reason FROM tensors t JOIN _damaged d USING (content_hash)")
            if run is not None:
                return con.sql(query + " WHERE t.run = ? ORDER BY t.tensor_id", params=[run]).to_arrow_table()
            return con.sql(query + " ORDER BY t.tensor_id").to_arrow_table()
        finally:
            con.unregister("_damaged")
