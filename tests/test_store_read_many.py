"""TensorStore.read_many (issue 13: tiny compare pairs read in batches) gives what
TensorStore.read gives payload by payload, bit for bit, read-only."""

from __future__ import annotations

import numpy as np
import pytest

from dumpdb.dtypes import BFLOAT16
from dumpdb.errors import PayloadCorrupt
from dumpdb.storage.store import StoreWriter, TensorStore


def test_read_many_is_read_payload_by_payload(tmp_path):
    TensorStore.create(tmp_path / "s.zarr")
    rng = np.random.default_rng(3)
    arrays = {f"tiny{k}": rng.standard_normal(int(rng.integers(1, 70))).astype(np.float32) for k in range(300)}
    arrays.update({
        "across_chunks": np.full(300_000, -0.0, np.float32),  # longer than a pack's inner chunk
        "nan_payloads": np.array([0x7FC00001, 0xFFC12345, 0x80000000], np.uint32).view(np.float32),
        "bf16": np.arange(-8, 8, dtype=np.float32).astype(BFLOAT16).reshape(4, 4),
        "scalar_bool": np.array(True),
        "int8": np.arange(-5, 5, dtype=np.int8).reshape(2, 5),
        "empty": np.zeros((0, 7), np.float16),
        "large": np.arange(40_000, dtype=np.float64).reshape(200, 200),
    })
    writer = StoreWriter(TensorStore(tmp_path / "s.zarr", read_only=False), pack_bytes=1 << 20, large_bytes=300_000)
    locations = {}
    try:
        for name, a in arrays.items():
            for loc in writer.add(name, a):
                locations[loc.content_hash] = loc
        for loc in writer.flush():
            locations[loc.content_hash] = loc
    finally:
        writer.close()
    reader = TensorStore(tmp_path / "s.zarr")
    names = sorted(arrays, key=lambda n: (locations[n].array_path or "", locations[n].elem_offset or 0))
    names = names[::2] + names[1::2]  # out of storage order too
    wanted = [(locations[n].array_path, locations[n].elem_offset, locations[n].elem_count, arrays[n].dtype,
               arrays[n].shape) for n in names]
    got = reader.read_many(wanted)
    assert len(got) == len(names)
    for name, g, w in zip(names, got, wanted):
        a = arrays[name]
        one = reader.read(*w)
        assert g.dtype == a.dtype and g.shape == a.shape and g.tobytes() == a.tobytes() == one.tobytes(), name
        assert not g.flags.writeable  # read-only (most are views of the chunk cache)
    tiny = locations["tiny0"]
    with pytest.raises(PayloadCorrupt, match="bytes stored"):
        reader.read_many([(tiny.array_path, tiny.elem_offset, tiny.elem_count, np.dtype(np.float32),
                           (tiny.elem_count + 1,))])
