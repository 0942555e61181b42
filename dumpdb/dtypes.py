"""Data type names: dump spellings -> numpy dtypes.

MindSpore 2.x puts the dtype in the tensor file name with its own spelling
(``Float32``, ``BFloat16``, ``Int64``, ``Bool``; corpus README "Tensor file
names"). The catalog's ``dtype`` column uses numpy names (``float32``,
``bfloat16``, ``int64``, ``bool``), with bfloat16 from ``ml_dtypes``.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)

# Lower-cased dump spelling -> numpy dtype. Covers the dtypes MindSpore Dump can
# save (seed 001, "注意事项": bool, int8..int64, uint8..uint64, float16/32/64,
# bfloat16, double) plus complex.
_DUMP_NAMES: dict[str, np.dtype] = {
    "bool": np.dtype(np.bool_),
    "int8": np.dtype(np.int8),
    "int16": np.dtype(np.int16),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
    "uint8": np.dtype(np.uint8),
    "uint16": np.dtype(np.uint16),
    "uint32": np.dtype(np.uint32),
    "uint64": np.dtype(np.uint64),
    "float16": np.dtype(np.float16),
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
    "double": np.dtype(np.float64),
    "float": np.dtype(np.float32),
    "bfloat16": BFLOAT16,
    "complex64": np.dtype(np.complex64),
    "complex128": np.dtype(np.complex128),
    "bf16": BFLOAT16,  # CANN DT_BF16
}


def from_dump_name(name: str | None) -> np.dtype | None:
    """Numpy dtype for a dtype as a dump spells it (``Float32``, ``BFloat16``,
    ``torch.float32``, ``DT_FLOAT16``, ``kNumberTypeFloat32``...).

    Returns None for an unknown or missing name; never raises.
    """
    if not name:
        return None
    key = name.lower()
    # msprobe writes framework-qualified names ('torch.float32', 'mindspore.float16');
    # CANN enum names carry a prefix ('DT_FLOAT16'); MindSpore r1.2 'kNumberTypeFloat32'.
    key = key.rsplit(".", 1)[-1].removeprefix("dt_").removeprefix("knumbertype")
    return _DUMP_NAMES.get(key)


def dtype_name(dtype: np.dtype) -> str:
    """Catalog name of a numpy dtype: ``float32``, ``bfloat16``, ``bool``..."""
    dtype = np.dtype(dtype)
    if dtype == BFLOAT16:
        return "bfloat16"
    if dtype == np.bool_:
        return "bool"
    return dtype.name


def from_catalog_name(name: str) -> np.dtype:
    """Numpy dtype for a catalog ``dtype`` value (inverse of :func:`dtype_name`).

    Raises ValueError for a name numpy does not know.
    """
    if name == "bfloat16":
        return BFLOAT16
    return np.dtype(name)


def storage_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype a tensor's bytes are stored as in Zarr.

    Zarr 3.1 has no bfloat16, so bfloat16 bit patterns are stored as uint16;
    every other dtype is stored as itself. Bytes are identical either way.
    """
    dtype = np.dtype(dtype)
    if dtype == BFLOAT16:
        return np.dtype("<u2")
    return dtype.newbyteorder("<") if dtype.byteorder == ">" else dtype
