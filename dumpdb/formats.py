"""Ascend device formats -> host layout (the way back, for tests: ``tests/formats_writer.py``).

CANN ``.bin`` dumps store a tensor as it lies in device memory: its ``format``
(``OutputFormat`` enum, reference formats.md section 3.3) with the device
``shape``, plus the ``original_shape`` / ``original_format`` of the framework
tensor. dumpdb archives tensors as dumped and converts on request with
:func:`to_host`. Conversions are pure index permutations (reshape, transpose,
crop), so values come back bit-exact and in the array's own dtype; padding that
the device format added is dropped.

Notation: ``ceil(a / b)`` is integer ceiling division. "Element ``x[i, j]``
lands at ``d[...]``" describes ``from_host`` (tests/formats_writer.py); :func:`to_host` is its exact
inverse restricted to the non-padding elements.

Layouts (device shape <- host shape)
------------------------------------
``NC1HWC0`` (5HD), host NCHW ``(N, C, H, W)``::

    device (N, C1, H, W, C0),  C1 = ceil(C / C0)
    x[n, c, h, w] -> d[n, c // C0, h, w, c % C0];  d[:, :, :, :, c' >= C] = 0

    C0 is read from the array's last axis (GE: 16 for float16/float32/bf16 and
    32 for int8/uint8; some builds use 8 for float32). Host NHWC / HWCN / CHWN
    originals are the same layout with N, C, H, W taken from their axes.
    Source: msaccucmp ``convert_NC1HWC0_to_NCHW.py`` (reshape (N, C1, H, W, C0),
    transpose (0, 1, 4, 2, 3)), ``convert_NC1HWC0_to_HWCN.py`` (transpose
    (2, 3, 1, 4, 0)); shape from GE ``transfer_shape_utils.cc`` GetNC1HWC0Shape.
    ``NC1HWC0_C04`` is the same layout with C0 = 4 (GE GetC0Value).

``FRACTAL_Z`` (FracZ, FRACTAL_Zn) for a 4-D weight, host NCHW ``(N, C, H, W)``::

    device (C1 * H * W, N1, N0, C0),  C1 = ceil(C / C0), N1 = ceil(N / N0), N0 = 16
    x[n, c, h, w] -> d[(c // C0) * H * W + h * W + w, n // N0, n % N0, c % C0]
    padding (n >= N or c >= C) is zero

    C0 from the last axis, N0 from the third. Source: msaccucmp
    ``convert_FRACTAL_Z_to_NCHW.py`` (reshape (C1, H, W, N1, N0, C0), transpose
    (3, 4, 0, 5, 1, 2)) and ``convert_FRACTAL_Z_to_HWCN.py``; GE
    GetFractalZShape(format_index, c0, group) with group = 1. Host HWCN / NHWC /
    CHWN originals: same layout with N, C, H, W taken from their axes (the TBE
    TransData HWCN -> FRACTAL_Z path produces exactly this). ND/DefaultFormat
    4-D originals are read as NCHW, as GE (kFormatIndexMap: ND = NCHW indices)
    and MindSpore (``host_format == NCHW || ND`` -> FracZ) do.

``FRACTAL_Z`` for a 2-D ND matrix ``(K, N)`` (e.g. a MatMul weight)::

    device (K1, N1, N0, K0),  K1 = ceil(K / K0), N1 = ceil(N / N0), N0 = 16
    x[k, n] -> d[k // K0, n // N0, n % N0, k % K0]

    i.e. the 4-D layout with C = K, N = N, H = W = 1 (the "ZN" fractal layout:
    (K, N) -> pad -> (K1, K0, N1, N0) -> transpose -> (K1, N1, N0, K0)).
    Source: GE GetFractalZShape(c0, origin_shape) for 2-D origins; TBE TransData
    tiling ``trans_data_positive_source_ntc_100`` (ND -> FRACTAL_Z as HCN -> HCNT
    with C = K, N = N).

``FRACTAL_NZ`` for an ND tensor ``(..., H, W)`` with at least 2 axes::

    device (..., W1, H1, H0, W0),  W1 = ceil(W / W0), H1 = ceil(H / H0), H0 = 16
    x[..., h, w] -> d[..., w // W0, h // H0, h % H0, w % W0]
    padding (h >= H or w >= W) is zero; leading (batch) axes are carried over

    W0 from the last axis (GE: 16 for 16/32-bit types, 32 for 8-bit), H0 from
    the second to last. On reading, only the product of the batch axes has to
    match. Source: msaccucmp ``convert_FRACTAL_NZ_to_ND.py`` (reshape
    (B, W1, H1, H0, W0), transpose (0, 2, 3, 1, 4)); GE GetFractalNzShape;
    MindSpore 1.x ``TransShapeToDevice`` (``..., w1, h1, 16, 16``).
    The original format is ignored: like msaccucmp's FRACTAL_NZ -> NCHW/NHWC
    converters, NZ acts on the last two axes of the original shape as given.

``NDC1HWC0`` (6HD), host NCDHW ``(N, C, D, H, W)``::

    device (N, D, C1, H, W, C0),  C1 = ceil(C / C0)
    x[n, c, d, h, w] -> d[n, d, c // C0, h, w, c % C0]

    Host NDHWC / DHWCN / DHWNC originals use their axes; 5-D ND is NCDHW.
    Source: msaccucmp ``convert_NDC1HWC0_to_NCDHW.py`` (transpose
    (0, 2, 5, 1, 3, 4)) and ``convert_NDC1HWC0_to_ND.py``; GE GetNDC1HWC0Shape.

Plain formats ``ND`` (also ``DefaultFormat``), ``NCHW``, ``NHWC``, ``HWCN``,
``CHWN``, ``NCDHW``, ``NDHWC``, ``DHWCN``, ``DHWNC``: identity when the dumped
shape equals ``original_shape`` (or differs only by axes of size 1, which a
reshape settles without moving data). When both the dumped and the original
format are named layouts of the same axes and differ (e.g. dumped NHWC, original
NCHW) the axes are permuted, as msaccucmp's HWCN/NCHW/NHWC permutations do.

Left out (ValueError): FRACTAL_NZ of 1-D originals (msaccucmp and MindSpore 1.x
read ``(W,)`` as ``(1, W)``, GE GetFractalNzShape as ``(W, 1)``), NC1HWC0 /
FRACTAL_Z of originals of other ranks (the axes are padded to 4-D by a
``reshape_type`` the dump does not record), grouped convolution weights
(FRACTAL_Z with groups > 1 / FRACTAL_Z_G), FRACTAL_Z_3D, FRACTAL_Z_C04,
C1HWNCoC0, FRACTAL_ZN_LSTM/RNN, ND_RNN_BIAS and the other enum members: their
layouts depend on attributes the dump does not carry.
"""

from __future__ import annotations

import math
from numbers import Integral

import numpy as np

from dumpdb.errors import DumpdbError

__all__ = ["SUPPORTED", "FormatConversionError", "normalize_format", "to_host"]


class FormatConversionError(DumpdbError, ValueError):
    """A device format dumpdb cannot convert, or an array that does not fit it."""


# CANN ``OutputFormat`` enum (toolkit.dumpdata proto; reference formats.md 3.3).
OUTPUT_FORMAT: dict[int, str] = {
    0: "NCHW", 1: "NHWC", 2: "ND", 3: "NC1HWC0", 4: "FRACTAL_Z", 5: "NC1C0HWPAD", 6: "NHWC1C0",
    7: "FSR_NCHW", 8: "FRACTAL_DECONV", 9: "C1HWNC0", 10: "FRACTAL_DECONV_TRANSPOSE",
    11: "FRACTAL_DECONV_SP_STRIDE_TRANS", 12: "NC1HWC0_C04", 13: "FRACTAL_Z_C04", 14: "CHWN",
    15: "FRACTAL_DECONV_SP_STRIDE8_TRANS", 16: "HWCN", 17: "NC1KHKWHWC0", 18: "BN_WEIGHT",
    19: "FILTER_HWCK", 20: "HASHTABLE_LOOKUP_LOOKUPS", 21: "HASHTABLE_LOOKUP_KEYS",
    22: "HASHTABLE_LOOKUP_VALUE", 23: "HASHTABLE_LOOKUP_OUTPUT", 24: "HASHTABLE_LOOKUP_HITS",
    25: "C1HWNCoC0", 26: "MD", 27: "NDHWC", 28: "FRACTAL_ZZ", 29: "FRACTAL_NZ", 30: "NCDHW",
    31: "DHWCN", 32: "NDC1HWC0", 33: "FRACTAL_Z_3D", 34: "CN", 35: "NC", 36: "DHWNC",
    37: "FRACTAL_Z_3D_TRANSPOSE", 38: "FRACTAL_ZN_LSTM", 39: "FRACTAL_Z_G", 40: "RESERVED",
    41: "ALL", 42: "NULL", 43: "ND_RNN_BIAS", 44: "FRACTAL_ZN_RNN", 45: "YUV", 46: "YUV_A",
    47: "NCL", 48: "FRACTAL_Z_WINO", 49: "C1HWC0", 255: "MAX",
}

# Other spellings of the same layouts: MindSpore 1.x kOpFormat_FRAC_Z = "FracZ" and
# DefaultFormat (host layout, i.e. no device layout); TBE TransData treats
# "FRACTAL_Zn" exactly as "FRACTAL_Z".
_ALIASES = {
    "DEFAULTFORMAT": "ND",
    "DEFAULT": "ND",
    "FRACZ": "FRACTAL_Z",
    "FRAC_Z": "FRACTAL_Z",
    "FRACTAL_ZN": "FRACTAL_Z",
    "FRACNZ": "FRACTAL_NZ",
    "FRAC_NZ": "FRACTAL_NZ",
}
_CANONICAL = {name.upper(): name for name in OUTPUT_FORMAT.values()}

# Named plain layouts: the letters name the axes in memory order.
_NAMED = ("NCHW", "NHWC", "HWCN", "CHWN", "NCDHW", "NDHWC", "DHWCN", "DHWNC")
_PLAIN = ("ND", *_NAMED)

SUPPORTED: tuple[str, ...] = ("NC1HWC0", "NC1HWC0_C04", "FRACTAL_Z", "FRACTAL_NZ", "NDC1HWC0", *_PLAIN)


def normalize_format(name: str | int) -> str:
    """Canonical spelling of a format name or ``OutputFormat`` number.

    Accepts the CANN enum spelling with or without ``FORMAT_`` / ``ACL_FORMAT_``
    prefix, in any case (``'format_fractal_nz'`` -> ``'FRACTAL_NZ'``), the enum
    number as int or digit string (``3`` -> ``'NC1HWC0'``), and the aliases
    ``FracZ`` / ``FRACTAL_Zn`` -> ``FRACTAL_Z`` and ``DefaultFormat`` -> ``ND``.
    Names outside the enum come back upper-cased (``to_host`` then rejects them);
    an unknown enum number or an empty / non-string name raises ValueError.
    """
    if isinstance(name, Integral) and not isinstance(name, bool):
        number = int(name)
    elif isinstance(name, str) and name.strip():
        text = name.strip()
        if not text.isdigit():
            key = text.upper()
            for prefix in ("ACL_FORMAT_", "FORMAT_"):
                if key.startswith(prefix):
                    key = key[len(prefix):]
                    break
            key = _ALIASES.get(key, key)
            return _CANONICAL.get(key, key)
        number = int(text)
    else:
        raise FormatConversionError(f"format must be a name or an OutputFormat number, got {name!r}")
    if number not in OUTPUT_FORMAT:
        raise FormatConversionError(f"unknown OutputFormat number {number}")
    return _ALIASES.get(OUTPUT_FORMAT[number], OUTPUT_FORMAT[number])


def to_host(
    array: np.ndarray,
    fmt: str | int,
    original_shape: tuple[int, ...],
    original_format: str | int | None = None,
) -> np.ndarray:
    """The dumped ``array`` (device format ``fmt``, device shape) in host layout.

    Returns a C-contiguous array of shape ``original_shape`` with ``array``'s
    dtype and bit-exact values; the device format's padding is dropped. For
    device formats, C0 (and N0 / H0) are read from the array's axes, so
    ``array`` must carry the device shape the dump records (e.g. 5-D for
    NC1HWC0). ``original_format`` selects the host axis order (NCHW when
    None); see the module docstring for every layout and its source. When no
    conversion is needed the result may share memory with ``array``.

    Raises :class:`FormatConversionError` (a ValueError) for an unsupported
    format pair or an array whose shape / element count does not match what
    the format gives for ``original_shape``.
    """
    arr = np.asarray(array)
    dev = normalize_format(fmt)
    orig = _norm_original(original_format)
    shape = _as_shape(original_shape)
    convert = _TO_HOST.get(dev)
    if convert is None:
        raise FormatConversionError(
            f"unsupported device format {fmt!r} ({dev}); dumpdb converts {', '.join(SUPPORTED)}")
    out = convert(arr, shape, orig, dev)
    if out.shape != shape:  # pragma: no cover - guarded by the converters' own checks
        raise FormatConversionError(f"{dev} -> host gave shape {out.shape}, not {shape}")
    return np.ascontiguousarray(out)


# -- to_host converters --------------------------------------------------------------

_NZ_1D = ("FRACTAL_NZ of a 1-D original shape is ambiguous (msaccucmp reads (W,) as (1, W), "
          "GE transfer_shape as (W, 1)); not converted")


def _nc1hwc0_to_host(arr, shape, orig, dev):
    letters = _host_letters(shape, orig, "NCHW", dev)
    n, c, h, w = (shape[letters.index(ch)] for ch in "NCHW")
    _need_ndim(arr, 5, dev, "(N, C1, H, W, C0)")
    c0 = _axis(arr, -1, "C0", dev)
    if dev == "NC1HWC0_C04" and c0 != 4:
        raise FormatConversionError(f"NC1HWC0_C04 needs C0 = 4 in the last axis, array shape {arr.shape}")
    c1 = _ceil(c, c0)
    _expect(arr, (n, c1, h, w, c0), dev, shape, letters)
    nchw = arr.transpose(0, 1, 4, 2, 3).reshape(n, c1 * c0, h, w)[:, :c]
    return _from_canonical(nchw, "NCHW", letters)


def _fractal_z_to_host(arr, shape, orig, dev):
    _need_ndim(arr, 4, dev, "(C1*H*W, N1, N0, C0)")
    n0 = _axis(arr, 2, "N0", dev)
    c0 = _axis(arr, 3, "C0", dev)
    if len(shape) == 2 and orig in (None, "ND"):
        k, n = shape
        k1, n1 = _ceil(k, c0), _ceil(n, n0)
        _expect(arr, (k1, n1, n0, c0), dev, shape, "ND (K, N)")
        return arr.transpose(0, 3, 1, 2).reshape(k1 * c0, n1 * n0)[:k, :n]
    if len(shape) != 4:
        raise FormatConversionError(
            f"FRACTAL_Z converts 4-D weights (NCHW/NHWC/HWCN/CHWN) and 2-D ND matrices, "
            f"not original shape {shape}")
    letters = _host_letters(shape, orig, "NCHW", dev)
    n, c, h, w = (shape[letters.index(ch)] for ch in "NCHW")
    c1, n1 = _ceil(c, c0), _ceil(n, n0)
    expected = (c1 * h * w, n1, n0, c0)
    if arr.shape != expected and arr.shape[1:] == expected[1:] and h * w and arr.shape[0] % (h * w) == 0:
        raise FormatConversionError(
            f"FRACTAL_Z array of shape {arr.shape} has {arr.shape[0] // (h * w)} C1 blocks where original "
            f"shape {shape} ({letters}) gives {c1}: grouped-convolution weights (groups > 1) are not supported")
    _expect(arr, expected, dev, shape, letters)
    nchw = (arr.reshape(c1, h, w, n1, n0, c0).transpose(3, 4, 0, 5, 1, 2)
            .reshape(n1 * n0, c1 * c0, h, w)[:n, :c])
    return _from_canonical(nchw, "NCHW", letters)


def _fractal_nz_to_host(arr, shape, orig, dev):
    if len(shape) < 2:
        raise FormatConversionError(_NZ_1D)
    if arr.ndim < 4:
        raise FormatConversionError(
            f"FRACTAL_NZ expects an array (..., W1, H1, H0, W0) of at least 4 axes, got shape {arr.shape}")
    h0 = _axis(arr, -2, "H0", dev)
    w0 = _axis(arr, -1, "W0", dev)
    batch, (hh, ww) = shape[:-2], shape[-2:]
    b = math.prod(batch)
    w1, h1 = _ceil(ww, w0), _ceil(hh, h0)
    if arr.shape[-4:] != (w1, h1, h0, w0) or math.prod(arr.shape[:-4]) != b:
        _expect(arr, (*batch, w1, h1, h0, w0), dev, shape, "ND (..., H, W)")
    out = arr.reshape(b, w1, h1, h0, w0).transpose(0, 2, 3, 1, 4).reshape(b, h1 * h0, w1 * w0)
    return out[:, :hh, :ww].reshape(shape)


def _ndc1hwc0_to_host(arr, shape, orig, dev):
    letters = _host_letters(shape, orig, "NCDHW", dev)
    n, c, d, h, w = (shape[letters.index(ch)] for ch in "NCDHW")
    _need_ndim(arr, 6, dev, "(N, D, C1, H, W, C0)")
    c0 = _axis(arr, -1, "C0", dev)
    c1 = _ceil(c, c0)
    _expect(arr, (n, d, c1, h, w, c0), dev, shape, letters)
    ncdhw = arr.transpose(0, 2, 5, 1, 3, 4).reshape(n, c1 * c0, d, h, w)[:, :c]
    return _from_canonical(ncdhw, "NCDHW", letters)


def _plain_to_host(arr, shape, orig, dev):
    if orig is None or orig == "ND" or dev == "ND" or orig == dev:
        if arr.shape == shape:
            return arr
        if arr.size == math.prod(shape) and [d for d in arr.shape if d != 1] == [d for d in shape if d != 1]:
            return arr.reshape(shape)  # only size-1 axes differ: no data moves
        raise FormatConversionError(
            f"{dev} array of shape {arr.shape} ({arr.size} elements) does not match original shape "
            f"{shape} ({math.prod(shape)} elements)")
    _check_permutable(dev, orig, arr.ndim)
    out = arr.transpose([dev.index(ch) for ch in orig])
    if out.shape != shape:
        raise FormatConversionError(
            f"{dev} array of shape {arr.shape} is {out.shape} as {orig}, not original shape {shape}")
    return out


_TO_HOST = {
    "NC1HWC0": _nc1hwc0_to_host,
    "NC1HWC0_C04": _nc1hwc0_to_host,
    "FRACTAL_Z": _fractal_z_to_host,
    "FRACTAL_NZ": _fractal_nz_to_host,
    "NDC1HWC0": _ndc1hwc0_to_host,
    **{name: _plain_to_host for name in _PLAIN},
}


# -- helpers ---------------------------------------------------------------------------

def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _norm_original(original_format) -> str | None:
    if original_format is None or (isinstance(original_format, str) and not original_format.strip()):
        return None
    return normalize_format(original_format)


def _as_shape(original_shape) -> tuple[int, ...]:
    try:
        shape = tuple(int(d) for d in original_shape)
    except (TypeError, ValueError):
        raise FormatConversionError(f"original_shape must be a sequence of ints, got {original_shape!r}") from None
    if any(d < 0 for d in shape):
        raise FormatConversionError(f"original_shape has a negative dimension: {shape}")
    return shape


def _host_letters(shape: tuple[int, ...], orig: str | None, canonical: str, dev: str) -> str:
    """Axis letters of the host tensor: ``orig`` if it names ``canonical``'s axes,
    ``canonical`` itself for None / ND (GE reads ND as NCHW / NCDHW)."""
    if len(shape) != len(canonical):
        raise FormatConversionError(
            f"{dev} needs a {len(canonical)}-D original shape ({canonical}-like), got {shape}; "
            f"lower-rank originals depend on a reshape_type the dump does not record")
    if orig is None or orig == "ND":
        return canonical
    if orig in _NAMED and sorted(orig) == sorted(canonical):
        return orig
    raise FormatConversionError(f"{dev} cannot be laid out as original format {orig} (shape {shape})")


def _from_canonical(arr: np.ndarray, canonical: str, letters: str) -> np.ndarray:
    return arr.transpose([canonical.index(ch) for ch in letters])


def _check_permutable(dev: str, orig: str, ndim: int) -> None:
    if dev not in _NAMED or orig not in _NAMED or sorted(dev) != sorted(orig):
        raise FormatConversionError(f"cannot convert {dev} to original format {orig}")
    if ndim != len(dev):
        raise FormatConversionError(f"{dev} -> {orig} needs a {len(dev)}-D array, got {ndim}-D")


def _need_ndim(arr: np.ndarray, ndim: int, dev: str, layout: str) -> None:
    if arr.ndim != ndim:
        raise FormatConversionError(f"{dev} expects a {ndim}-D array {layout}, got shape {arr.shape}")


def _axis(arr: np.ndarray, index: int, label: str, dev: str) -> int:
    value = int(arr.shape[index])
    if value <= 0:
        raise FormatConversionError(f"{dev} array of shape {arr.shape} has {label} = {value}")
    return value


def _expect(arr: np.ndarray, expected: tuple[int, ...], dev: str, shape, layout: str) -> None:
    if tuple(arr.shape) != tuple(expected):
        raise FormatConversionError(
            f"{dev} array of shape {arr.shape} ({arr.size} elements) does not hold original shape "
            f"{shape} ({layout}): expected device shape {tuple(expected)} ({math.prod(expected)} elements)")
