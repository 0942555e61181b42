#!/usr/bin/env python3
"""Which codec per dtype: size and speed of candidate pack codecs on a real dump.

Loads every ``.npy`` of ``DUMP`` (distinct payloads only, as the store keeps them), groups
them by dtype, concatenates each group as a pack would (up to ``--max-mb`` per dtype),
cuts it into the store's 1 MiB inner chunks and encodes every chunk with each candidate:
plain zstd (what packs used before) and Blosc-zstd with byte shuffle or bit shuffle at
several levels. Prints, per dtype and candidate, the stored size as a fraction of plain
zstd level 1 (the baseline measured in the same run) and the encode/decode speed.
``dumpdb.storage.codecs`` records the choice this produced.

Read-heavy data (compare reads every payload once or more): a codec costs more than it saves
when reading its smaller frames and decoding them takes longer than reading the raw bytes
from storage. Column ``read/raw`` is ``(size / disk + decode time) / (raw / disk + copy
time)``, the copy (one memcpy of every chunk, what ``np.load`` of a cached file costs) timed
in the same run, ``disk`` the storage read rate (``--disk-gbps``; default 4.1, ``cat`` of a
real dump on this machine kind, issue 29); above 1 the codec ``COSTS`` more than it saves.
``--chunk-mb 4`` measures the store's large-array chunks instead of the packs' 1 MiB. Times are
CPU seconds of this process (one thread): other processes sharing the cores do not inflate them.

``--archive A`` measures an archive's packs as they are stored instead (every chunk of every
pack, the chunk size ingest chose): per dtype, both compressors an archive may have
(``ingest --codec zstd|lz4``: shuffle + zstd-1 and shuffle + lz4, ``dumpdb.storage.codecs``)
and raw bytes on the same chunks (stored bytes, decode CPU, read/raw as above); then, per
dtype and pair of codecs, the bytes the smaller one saves against the decode time it costs
a read, the storage read rate below which it is worth it, and plainly whether it costs more
than it saves at ``--disk-gbps``. This is what a compare reads: the figures behind the packs'
codec in docs/storage-design.md ("Reads").

    python scripts/bench_codecs.py DUMP [--max-mb 256] [--chunk-mb 1] [--disk-gbps 4.1]
    python scripts/bench_codecs.py --archive A [--disk-gbps 4.1]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import numcodecs
import numpy as np
import xxhash
from numcodecs import blosc


def candidates() -> dict[str, numcodecs.abc.Codec]:
    """Codecs to try, by label."""
    out: dict[str, numcodecs.abc.Codec] = {f"zstd-{lv}": numcodecs.Zstd(level=lv) for lv in (1, 3)}
    for shuffle, name in ((blosc.SHUFFLE, "shuffle"), (blosc.BITSHUFFLE, "bitshuffle")):
        for clevel in (1, 2, 3):  # c-blosc maps clevel c to zstd level 2c - 1: 1, 3, 5
            out[f"blosc-zstd{2 * clevel - 1}-{name}"] = numcodecs.Blosc(cname="zstd", clevel=clevel, shuffle=shuffle)
    out["blosc-lz4-shuffle"] = numcodecs.Blosc(cname="lz4", clevel=5, shuffle=blosc.SHUFFLE)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dump", type=Path, nargs="?")
    p.add_argument("--archive", type=Path, help="measure this archive's packs as stored (no DUMP)")
    p.add_argument("--max-mb", type=float, default=256)
    p.add_argument("--chunk-mb", type=float, default=1, help="chunk size (1: packs; 4: large arrays)")
    p.add_argument("--disk-gbps", type=float, default=4.1, help="storage read rate for the read/raw column")
    args = p.parse_args()
    disk = args.disk_gbps * 1e9
    if args.archive:
        archive_packs(args.archive, disk)
        return
    if args.dump is None:
        p.error("give DUMP or --archive")
    chunk = int(args.chunk_mb * 2**20)
    limit = int(args.max_mb * 2**20)
    groups: dict[str, list[np.ndarray]] = defaultdict(list)
    sizes: dict[str, int] = defaultdict(int)
    seen: set[str] = set()
    for path in sorted(args.dump.rglob("*.npy")):
        try:
            arr = np.load(path)
        except (ValueError, OSError):
            continue
        key = arr.dtype.str if arr.dtype.kind != "V" else "bfloat16"
        digest = xxhash.xxh3_128_hexdigest(np.ascontiguousarray(arr).view(np.uint8).data)
        if digest in seen or sizes[key] >= limit or arr.nbytes == 0:
            continue
        seen.add(digest)
        groups[key].append(np.ascontiguousarray(arr).reshape(-1))
        sizes[key] += arr.nbytes
    if not groups:
        sys.exit(f"{args.dump}: no .npy payloads")
    blosc.set_nthreads(1)  # one thread per chunk: the store encodes chunks on a pool
    print(f"{'dtype':<10}{'MB':>8}  {'codec':<26}{'size/zstd-1':>12}{'raw/size':>9}{'enc MB/s':>10}{'dec MB/s':>10}"
          f"{'read/raw':>10}")
    for key, parts in sorted(groups.items()):
        data = np.concatenate(parts)
        raw = data.view(np.uint8)
        chunks = [raw[i : i + chunk] for i in range(0, raw.size, chunk)]
        itemsize = data.dtype.itemsize
        base = None
        scratch = np.empty(chunk, np.uint8)
        t0 = time.process_time()
        for c in chunks:  # the raw baseline: the bytes copied once, as np.load of a cached file
            scratch[: c.size] = c
        copy_s = time.process_time() - t0
        raw_read = raw.size / disk + copy_s
        for label, codec in candidates().items():
            if isinstance(codec, numcodecs.Blosc):
                # typesize comes from the buffer's dtype: hand it items, not bytes
                pieces = [c.view(data.dtype) if c.size % itemsize == 0 else c for c in chunks]
            else:
                pieces = chunks
            t0 = time.process_time()
            frames = [codec.encode(c) for c in pieces]
            t1 = time.process_time()
            for f in frames:
                codec.decode(f)
            t2 = time.process_time()
            size = sum(len(f) for f in frames)
            base = base or size
            mb = raw.size / 2**20
            read = (size / disk + (t2 - t1)) / raw_read
            print(f"{key:<10}{mb:8.1f}  {label:<26}{size / base:12.3f}{raw.size / size:9.2f}{mb / (t1 - t0):10.0f}"
                  f"{mb / (t2 - t1):10.0f}{read:10.2f}{'  COSTS' if read > 1 else ''}", flush=True)


def archive_packs(archive: Path, disk: float) -> None:
    """Per dtype and chunk size of the archive's packs: bytes stored and decode CPU of both
    compressors an archive may have (``ingest --codec zstd|lz4``: shuffle + zstd-1, shuffle +
    lz4) and raw bytes, over the same chunks; then, per dtype, what each codec saves against
    what it costs a read, and plainly which costs more than it saves (``--archive``)."""
    from dumpdb.storage.codecs import COMPRESSORS, codec_for
    from dumpdb.storage.store import TensorStore

    blosc.set_nthreads(1)
    store = TensorStore(archive / "tensors.zarr", read_only=True, verify=False)
    rows: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))
    stored_as: dict[str, set[str]] = defaultdict(set)
    packs = sorted(z.parent for z in (archive / "tensors.zarr" / "packs").glob("*/*/zarr.json"))
    for path in packs:
        meta = store._pack(str(path.relative_to(archive / "tensors.zarr")))
        n_chunks = -(-meta.size // meta.chunk)
        frames = [bytes(store.objects.get(meta.key, int(o), int(o) + int(nb))) for o, nb in meta.index[:n_chunks]]
        key = f"{meta.dtype.name}/{meta.chunk * meta.dtype.itemsize >> 10}K"
        inner = json.loads((path / "zarr.json").read_text())["codecs"][0]["configuration"]["codecs"][-1]
        stored_as[key].add(inner["name"] if inner["name"] != "blosc" else inner["configuration"]["cname"])
        chunks = [np.frombuffer(meta.decoder.decode(f) if meta.decoder else f, meta.dtype) for f in frames]
        for compressor in COMPRESSORS:
            codec = codec_for(meta.dtype, meta.chunk * meta.dtype.itemsize, compressor)
            frame_codec = codec.frame_codec()
            encoded = [frame_codec.encode(c) for c in chunks]
            scratch = np.empty(meta.chunk, meta.dtype)
            t0 = time.process_time()
            for f, c in zip(encoded, chunks):
                frame_codec.decode(f, out=scratch[: c.size] if c.size == meta.chunk else None)
            rows[key][codec.name][0] += sum(map(len, encoded))
            rows[key][codec.name][1] += time.process_time() - t0
        scratch = np.empty(meta.chunk, meta.dtype)
        t0 = time.process_time()
        for c in chunks:  # raw: the bytes copied once (np.load of a cached file)
            scratch[: c.size] = c
        rows[key]["raw"][0] += sum(c.nbytes for c in chunks)
        rows[key]["raw"][1] += time.process_time() - t0
    print(f"{archive}: {len(packs)} packs; storage read rate {disk / 1e9:.1f} GB/s (--disk-gbps); "
          "decode: CPU s of one thread")
    print(f"{'dtype/chunk':<16}{'GB':>7}  {'codec':<18}{'stored/raw':>11}{'dec s':>8}{'dec GB/s':>9}{'read/raw':>10}")
    verdicts = []
    for key, found in sorted(rows.items()):
        raw_size, copy_s = found["raw"]
        raw_read = raw_size / disk + copy_s
        for label, (size, dec) in found.items():
            read = (size / disk + dec) / raw_read
            print(f"{key:<16}{raw_size / 1e9:7.3f}  {label:<18}{size / raw_size:11.3f}{dec:8.2f}"
                  f"{raw_size / 1e9 / max(dec, 1e-9):9.2f}{read:10.2f}{'  COSTS' if read > 1 else ''}", flush=True)
        verdicts.append(f"{key} (stored as {', '.join(sorted(stored_as[key]))}):")
        labels = [label for label in found if label != "raw"]
        pairs = [(label, "raw") for label in labels] + [(a, b) for a in labels for b in labels
                                                        if found[a][0] < found[b][0]]
        for small, big in pairs:
            saved = found[big][0] - found[small][0]  # bytes the smaller encoding saves per full read
            extra = found[small][1] - found[big][1]  # decode seconds it costs more
            if saved <= 0:
                verdicts.append(f"  {small} against {big}: stores {-saved / 1e6:.3f} MB more than {big}: "
                                "it saves nothing, so it COSTS MORE THAN IT SAVES at any storage rate")
            elif extra <= 0:
                verdicts.append(f"  {small} against {big}: saves {saved / 1e6:.1f} MB and decodes no slower: "
                                "it never costs more than it saves")
            else:
                even = saved / extra  # storage read rate at which the saved bytes pay the extra decode
                verdicts.append(
                    f"  {small} against {big}: saves {saved / 1e6:.1f} MB ({saved / found[big][0]:.0%}) for "
                    f"{extra:.2f} s more decode a read: worth it below {even / 1e9:.2f} GB/s of storage; "
                    + (f"at {disk / 1e9:.1f} GB/s it COSTS MORE THAN IT SAVES on read-heavy data" if disk > even
                       else f"at {disk / 1e9:.1f} GB/s it saves more than it costs"))
    print("\nRead-heavy data (every payload read at least once per compare):")
    print("\n".join(verdicts))


if __name__ == "__main__":
    main()
