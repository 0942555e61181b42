"""Host -> Ascend device format, the inverse of :func:`dumpdb.formats.to_host`: test code
(dumpdb only reads device formats), kept out of the package (issue 27 item 7). Layouts and their
sources: the docstring of :mod:`dumpdb.formats`."""

from __future__ import annotations

import math
from numbers import Integral

import numpy as np

from dumpdb.formats import (
    _NZ_1D,
    _PLAIN,
    SUPPORTED,
    FormatConversionError,
    _ceil,
    _check_permutable,
    _host_letters,
    _norm_original,
    normalize_format,
)


def _zeros(shape, dtype) -> np.ndarray:
    return np.zeros(shape, dtype=dtype)  # all-zero bytes for every dtype incl. bfloat16


def _to_canonical(arr: np.ndarray, letters: str, canonical: str) -> np.ndarray:
    return arr.transpose([letters.index(ch) for ch in canonical])


def from_host(
    array: np.ndarray,
    fmt: str | int,
    c0: int = 16,
    *,
    original_format: str | int | None = None,
    n0: int = 16,
    h0: int = 16,
) -> np.ndarray:
    """The host ``array`` laid out in device format ``fmt``, padding zero-filled.

    Inverse of :func:`to_host`, ``to_host(from_host(x, f, ...), f, x.shape, o) == x``
    bit for bit. ``c0`` is C0 for NC1HWC0 / NDC1HWC0 / FRACTAL_Z (K0 for 2-D
    FRACTAL_Z) and W0 for FRACTAL_NZ; NC1HWC0_C04 always uses 4. ``n0`` is N0
    of FRACTAL_Z, ``h0`` is H0 of FRACTAL_NZ (16 on every Ascend layout; the
    knobs exist for small hand-made examples). ``original_format`` is the axis
    order of ``array`` (NCHW / NCDHW when None). Returns a new C-contiguous
    array of ``array``'s dtype.
    """
    arr = np.asarray(array)
    dev = normalize_format(fmt)
    orig = _norm_original(original_format)
    for label, value in (("c0", c0), ("n0", n0), ("h0", h0)):
        if not isinstance(value, Integral) or value <= 0:
            raise FormatConversionError(f"{label} must be a positive integer, got {value!r}")
    c0, n0, h0 = int(c0), int(n0), int(h0)
    shape = tuple(arr.shape)

    if dev in ("NC1HWC0", "NC1HWC0_C04"):
        if dev == "NC1HWC0_C04":
            c0 = 4
        letters = _host_letters(shape, orig, "NCHW", dev)
        x = _to_canonical(arr, letters, "NCHW")
        n, c, h, w = x.shape
        c1 = _ceil(c, c0)
        padded = _zeros((n, c1 * c0, h, w), arr.dtype)
        padded[:, :c] = x
        out = padded.reshape(n, c1, c0, h, w).transpose(0, 1, 3, 4, 2)
    elif dev == "FRACTAL_Z":
        if len(shape) == 2 and orig in (None, "ND"):
            k, n = shape
            k1, n1 = _ceil(k, c0), _ceil(n, n0)
            padded = _zeros((k1 * c0, n1 * n0), arr.dtype)
            padded[:k, :n] = arr
            out = padded.reshape(k1, c0, n1, n0).transpose(0, 2, 3, 1)
        else:
            letters = _host_letters(shape, orig, "NCHW", dev)
            x = _to_canonical(arr, letters, "NCHW")
            n, c, h, w = x.shape
            c1, n1 = _ceil(c, c0), _ceil(n, n0)
            padded = _zeros((n1 * n0, c1 * c0, h, w), arr.dtype)
            padded[:n, :c] = x
            out = (padded.reshape(n1, n0, c1, c0, h, w).transpose(2, 4, 5, 0, 1, 3)
                   .reshape(c1 * h * w, n1, n0, c0))
    elif dev == "FRACTAL_NZ":
        if len(shape) < 2:
            raise FormatConversionError(_NZ_1D)
        batch, (hh, ww) = shape[:-2], shape[-2:]
        b = math.prod(batch)
        h1, w1 = _ceil(hh, h0), _ceil(ww, c0)
        padded = _zeros((b, h1 * h0, w1 * c0), arr.dtype)
        padded[:, :hh, :ww] = arr.reshape(b, hh, ww)
        out = padded.reshape(b, h1, h0, w1, c0).transpose(0, 3, 1, 2, 4).reshape(*batch, w1, h1, h0, c0)
    elif dev == "NDC1HWC0":
        letters = _host_letters(shape, orig, "NCDHW", dev)
        x = _to_canonical(arr, letters, "NCDHW")
        n, c, d, h, w = x.shape
        c1 = _ceil(c, c0)
        padded = _zeros((n, c1 * c0, d, h, w), arr.dtype)
        padded[:, :c] = x
        out = padded.reshape(n, c1, c0, d, h, w).transpose(0, 3, 1, 4, 5, 2)
    elif dev in _PLAIN:
        if orig is None or orig == "ND" or dev == "ND" or orig == dev:
            out = arr
        else:
            _check_permutable(dev, orig, arr.ndim)
            out = arr.transpose([orig.index(ch) for ch in dev])
    else:
        raise FormatConversionError(
            f"unsupported device format {fmt!r} ({dev}); dumpdb converts {', '.join(SUPPORTED)}")
    return np.array(out, order="C", copy=True)
