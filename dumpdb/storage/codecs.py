"""Which compression codec the tensor store uses, per dtype, and decoding any of them.

Chosen by measurement (``scripts/bench_codecs.py`` on the real MindSpore corpus: LeNet
cases in ``shared/corpus/mindspore-cpu`` and a 6.6 GB Transformer dump made with
``corpus/tools/make_big_dump.sh``; distinct payloads, 1 MiB chunks as the store cuts them):

* multi-byte dtypes (float16/32/64, bfloat16 stored as uint16, complex, int16..int64,
  uint16..uint64): **byte shuffle, then zstd level 1** (Blosc, one block per chunk). Byte
  shuffle groups the exponent bytes of floats and the high bytes of integers, which zstd
  then finds: float32 stored 6-9 % smaller than plain zstd-1, int32 18 % smaller; zstd
  levels 3, 5 and 9 after shuffling gained under 1 % more at 2-7x the encode time, so
  level 1 stays. Blosc's default block size (a few hundred KiB per block) lost 3-20 %
  against plain zstd on the same data; one block per chunk (``blocksize`` = the chunk's
  bytes) is what gives shuffle+zstd its gain;
* one-byte dtypes (bool, int8, uint8): **zstd level 1** (a shuffle of one-byte items is
  the identity).

* large arrays (one tensor of 16 MiB or more) whose chunks the codec above shrinks by less
  than ``LARGE_MIN_SAVING`` (20 %) are stored **uncompressed** (the ``bytes`` codec alone):
  decoding 32 MiB of near-random float32 (weights, gradients: shuffle+zstd saves 12-16 %)
  took 5-10x ``np.load`` of the source file on this 2-core machine kind, a plain copy about
  as long as ``np.load``; the issue's read target (largest tensors <= 2x ``np.load``) is
  worth those few percent of their bytes. Large arrays that compress well (masks, broadcasts:
  19x on the Transformer dump) stay compressed.

* large arrays whose chunks the codec above shrinks **8x or more** (``REDUNDANT_RATIO``:
  broadcasts, masks, a slice repeated along the leading dimensions) are encoded again as
  **plain zstd level 3 in chunks of up to 64 MiB** (``REDUNDANT_CHUNK_BYTES``) and stored so
  when that is at most ``REDUNDANT_KEEP`` (0.75) of the first encoding. Each chunk is
  compressed on its own, so a 4 MiB chunk stores its own copy of the repeated slice: on the
  3-step Transformer dump (``make_big_dump.sh``: 3 steps, 2 layers, width 256) the 30
  distinct ``(128, 256, 256)`` float32 attention tensors (a 256x256 slice repeated 128 times)
  took 52.8 MB in 4 MiB shuffle+zstd-1 chunks, 13.3 MB in 16 MiB chunks, 7.3 MB as one
  plain zstd chunk each (a 6 % smaller store, ``scripts/bench_ingest.py`` on that dump). No shuffle
  here: Blosc unshuffling a 32 MiB block read back 3-6x slower than ``np.load`` of the source
  file, plain zstd of such data decodes faster than ``np.load`` (6-12 ms for 33.5 MB against
  18-24 ms). Level 3, not 1: its 2 MiB match window (level 1: 512 KiB) also finds a repeated
  slice of up to 2 MiB, at no cost on data this redundant.

* **an archive's compressor** (``COMPRESSORS``): ``zstd`` (everything above, the default)
  or ``lz4`` (``dumpdb ingest --codec lz4`` when the archive is created), for archives read
  far more than they are written. ``lz4`` keeps the same layout with Blosc's ``lz4`` in place
  of zstd-1 (byte shuffle for multi-byte dtypes, none for one-byte ones; clevel
  ``LZ4_CLEVEL``): on the conv-net packs (float32 in 4 MiB chunks, ``scripts/bench_codecs.py
  --archive``) it decodes 2.8-3.1 GB/s on one core against zstd-1's 1.1-1.3 GB/s and stores
  0.85x the raw bytes against 0.72x (clevel 1-9: 0.881-0.847x, decoding alike: 9 kept).
  Large arrays follow it (raw under ``LARGE_MIN_SAVING``, lz4 + shuffle above), and in such an
  archive payloads count as large from 4 MiB (``store.READ_LARGE_BYTES``): the conv net's
  8 MiB payloads, which lz4 shrinks by 14 %, are then stored raw and read at a median
  1.07-1.14x ``np.load`` (5.1-5.3x packed in lz4 chunks, 8-10x in zstd ones), for a store
  1.33x the zstd archive's (docs/storage-design.md). The redundant encoding below stays plain
  zstd-3 (it decodes faster than ``np.load`` on such data). The
  compressor is recorded in the store's root ``zarr.json`` (``attributes.dumpdb.codec``), so
  every later writer of the archive (later ingests, worker processes, gc's copies) uses it.

Every codec is lossless: a payload reads back bit for bit. The codec is recorded in each
array's ``zarr.json`` (the ``sharding_indexed`` codec's inner ``codecs``), so archives
written before this choice (``bytes`` + ``zstd``) read unchanged and any zarr v3 reader
decodes all of them (``blosc`` and ``zstd`` are standard zarr v3 codecs; a Blosc frame names
its compressor, zstd or lz4, in its header).

Blosc is used without its internal threads (``numcodecs.blosc.use_threads = False``, set
on import): dumpdb encodes and decodes chunks on its own thread pools, and Blosc's shared
global context would serialise them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numcodecs
import numcodecs.blosc
import numpy as np

from dumpdb.errors import DumpdbError

ZSTD_LEVEL = 1  # zstd level of every codec (see the module docstring for the measurement)
LARGE_MIN_SAVING = 0.20  # a large array compressing by less is stored uncompressed
REDUNDANT_RATIO = 8  # a large array compressing this much or more is tried in big plain-zstd chunks
REDUNDANT_CHUNK_BYTES = 64 << 20  # chunk bytes (at most) of that second encoding
REDUNDANT_KEEP = 0.75  # kept when its bytes are at most this share of the first encoding's
REDUNDANT_LEVEL = 3  # zstd level of that encoding (2 MiB match window)
COMPRESSORS = ("zstd", "lz4")  # an archive's compressor (its store's root zarr.json records it)
DEFAULT_COMPRESSOR = "zstd"  # and what a store that records none (every archive before it) uses
LZ4_CLEVEL = 9  # Blosc clevel of lz4 (see the module docstring)

numcodecs.blosc.use_threads = False


@dataclass(frozen=True)
class Codec:
    """The compression of one array's chunks.

    ``shuffle``: byte-shuffle items of ``typesize`` bytes before zstd (Blosc); else plain
    zstd. ``chunk_bytes``: bytes of one (uncompressed) chunk, Blosc's block size.
    """

    shuffle: bool
    typesize: int
    chunk_bytes: int
    level: int = ZSTD_LEVEL
    raw: bool = False  # no compression at all (the ``bytes`` codec alone)
    cname: str = "zstd"  # the compressor: zstd, or lz4 (always in Blosc; ``level`` is then Blosc's clevel)

    @property
    def name(self) -> str:
        """``shuffle-zstd-1``, ``zstd-1``, ``shuffle-lz4-9``, ``lz4-9`` or ``raw`` (for reports)."""
        return "raw" if self.raw else f"{'shuffle-' if self.shuffle else ''}{self.cname}-{self.level}"

    def uncompressed(self) -> Codec:
        """This codec without compression (chunks stored as their bytes)."""
        return Codec(shuffle=False, typesize=self.typesize, chunk_bytes=self.chunk_bytes, level=self.level, raw=True,
                     cname=self.cname)

    def zarr_codec(self) -> Any:
        """The zarr v3 bytes-to-bytes codec that ``zarr.json`` records (None: uncompressed)."""
        if self.raw:
            return None
        import zarr.codecs  # only writers need it: a read decodes frames with numcodecs alone

        if self.cname == "lz4":
            return zarr.codecs.BloscCodec(typesize=self.typesize, cname="lz4", clevel=self.level,
                                          shuffle="shuffle" if self.shuffle else "noshuffle",
                                          blocksize=self.chunk_bytes)
        if self.shuffle:
            return zarr.codecs.BloscCodec(typesize=self.typesize, cname="zstd", clevel=self.level,
                                          shuffle="shuffle", blocksize=self.chunk_bytes)
        return zarr.codecs.ZstdCodec(level=self.level)

    def frame_codec(self) -> numcodecs.abc.Codec:
        """The numcodecs codec that encodes one chunk (any buffer of its bytes) exactly as
        :meth:`zarr_codec` describes."""
        if self.cname == "lz4":
            return numcodecs.Blosc(cname="lz4", clevel=self.level,
                                   shuffle=numcodecs.Blosc.SHUFFLE if self.shuffle else numcodecs.Blosc.NOSHUFFLE,
                                   blocksize=self.chunk_bytes, typesize=self.typesize)
        if self.shuffle:
            # c-blosc maps clevel c of zstd to zstd level 2c - 1: clevel 1 is zstd level 1.
            return numcodecs.Blosc(cname="zstd", clevel=(self.level + 1) // 2, shuffle=numcodecs.Blosc.SHUFFLE,
                                   blocksize=self.chunk_bytes, typesize=self.typesize)
        return numcodecs.Zstd(level=self.level)


def item_size(dtype: np.dtype) -> int:
    """Bytes of the items a codec shuffles (and delta coding XORs) for storage dtype
    ``dtype``: its item size, complex items as their two float components."""
    dtype = np.dtype(dtype)
    return dtype.itemsize // 2 if dtype.kind == "c" else dtype.itemsize


def check_compressor(compressor: str) -> str:
    """``compressor`` if it is one of ``COMPRESSORS``; DumpdbError naming the choices otherwise."""
    if compressor not in COMPRESSORS:
        raise DumpdbError(f"unknown codec {compressor!r}: one of {', '.join(COMPRESSORS)}")
    return compressor


def codec_for(dtype: np.dtype, chunk_bytes: int, compressor: str = DEFAULT_COMPRESSOR) -> Codec:
    """The codec for chunks of ``chunk_bytes`` bytes of storage dtype ``dtype`` in a store
    whose compressor is ``compressor`` (``COMPRESSORS``; see the module docstring). Complex
    items shuffle as their two float components. ValueError for an unknown compressor."""
    typesize = item_size(dtype)
    if compressor == "lz4":
        return Codec(shuffle=typesize > 1, typesize=typesize, chunk_bytes=chunk_bytes, level=LZ4_CLEVEL, cname="lz4")
    if compressor != "zstd":
        raise ValueError(f"unknown compressor {compressor!r}: one of {', '.join(COMPRESSORS)}")
    return Codec(shuffle=typesize > 1, typesize=typesize, chunk_bytes=chunk_bytes)


def redundant_codec(dtype: np.dtype, chunk_bytes: int) -> Codec:
    """The codec tried for a highly redundant large array (see the module docstring): plain
    zstd level ``REDUNDANT_LEVEL`` over chunks of ``chunk_bytes`` bytes, no shuffle."""
    return Codec(shuffle=False, typesize=item_size(dtype), chunk_bytes=chunk_bytes, level=REDUNDANT_LEVEL)


def frame_decoder(codecs: list[dict[str, Any]], where: str) -> numcodecs.abc.Codec | None:
    """A decoder for chunks whose ``sharding_indexed`` inner codec chain is ``codecs``
    (from ``zarr.json``): ``bytes`` (little-endian) then ``zstd`` or ``blosc``, or ``bytes``
    alone (None: the frames are the chunks' bytes).

    Raises ValueError naming ``where`` for any other chain (dumpdb never wrote one: a
    foreign or damaged array) or a big-endian ``bytes`` codec.
    """
    names = [c.get("name") for c in codecs]
    if names == ["bytes"]:
        pass
    elif len(names) != 2 or names[0] != "bytes" or names[1] not in ("zstd", "blosc"):
        raise ValueError(f"{where}: codecs {names} not the ones dumpdb writes")
    endian = (codecs[0].get("configuration") or {}).get("endian", "little")
    if endian != "little":  # dumpdb writes and decodes little-endian only: never read byte-swapped
        raise ValueError(f"{where}: bytes codec is {endian}-endian, not little-endian")
    if len(names) == 1:
        return None
    # Both decoders read what they need (level, shuffle, item size) from the frame itself.
    return numcodecs.Zstd() if names[1] == "zstd" else numcodecs.Blosc()
