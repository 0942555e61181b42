"""The tensor store's chunk sizes (bytes), apart from :mod:`~dumpdb.storage.store` so
that a module needing a size alone (the compare engine's memory budget) does not import
the store and its codecs (numcodecs, zarr): a statistics compare never reads a payload.
:mod:`~dumpdb.storage.store` uses them under the same names.
"""

# Inner chunks: a pack read decodes whole chunks, so small tensors (read one by one,
# target p99 <= 2 ms) sit in packs of small chunks; tensors of MEDIUM_BYTES or more
# sit in packs of 4 MiB chunks, which compress far better (zstd finds repeats across
# a whole chunk; scripts/bench_codecs.py on the Transformer dump: 4 MiB chunks store
# 0.67x the bytes of 1 MiB ones, 256 KiB ones 1.9x).
INNER_CHUNK_BYTES = 256 << 10
MEDIUM_BYTES = 256 << 10
MEDIUM_CHUNK_BYTES = 4 << 20
LARGE_CHUNK_BYTES = 4 << 20
