"""A test store holding given payloads, written through the real StoreWriter."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dumpdb.storage.store import StoreWriter, TensorStore


def write_payloads(root: Path, payloads: dict[str, np.ndarray], compressor: str | None = None,
                   large_bytes: int = 64 << 20, pack_bytes: int | None = None) -> dict:
    """A new store at ``root`` holding ``payloads`` (each added under its name as its hash; plain:
    no XOR deltas, so the reads are the packs' own chunks), with ``compressor`` chosen first when
    given; their locations by name."""
    TensorStore.create(root)
    store = TensorStore(root, read_only=False)
    if compressor is not None:
        store.choose_compressor(compressor)
    writer = StoreWriter(store, large_bytes=large_bytes, pack_bytes=pack_bytes, delta=False)
    locations = {}
    for name, a in payloads.items():
        for loc in writer.add(name, a):
            locations[loc.content_hash] = loc
    for loc in writer.flush():
        locations[loc.content_hash] = loc
    writer.close()
    return locations
