"""Device formats (NC1HWC0, FRACTAL_Z, FRACTAL_NZ, NDC1HWC0) <-> host layout."""

from __future__ import annotations

import itertools
import math

import ml_dtypes
import numpy as np
import pytest
from formats_writer import from_host

from dumpdb.errors import DumpdbError
from dumpdb.formats import SUPPORTED, normalize_format, to_host

DTYPES = {
    "float16": np.dtype(np.float16),
    "float32": np.dtype(np.float32),
    "int8": np.dtype(np.int8),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
}
# C0 the Ascend layouts use per element width (32 bytes a row; GE also uses 16 for fp32).
C0 = {"float16": 16, "float32": 8, "int8": 32, "bfloat16": 16}


def random_bits(shape, dtype, seed=0) -> np.ndarray:
    """Arbitrary bit patterns (NaN payloads, -0.0, subnormals included) of ``dtype``."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=math.prod(shape) * dtype.itemsize, dtype=np.uint8)
    return raw.view(dtype).reshape(shape)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# (device format, host shape, original_format, c0 or None for the dtype's C0).
ROUND_TRIPS = [
    ("NC1HWC0", (2, 3, 5, 7), None, None),          # C padded
    ("NC1HWC0", (1, 64, 2, 3), None, None),         # C a multiple of every C0
    ("NC1HWC0", (2, 5, 3, 4), "NHWC", None),        # host NHWC: (N, H, W, C) = (2, 5, 3, 4)
    ("NC1HWC0", (3, 3, 20, 2), "HWCN", None),
    ("NC1HWC0", (2, 20, 3, 3), None, 16),           # fp32/int8 with C0 = 16 too
    ("NC1HWC0_C04", (2, 3, 4, 4), None, 4),
    ("FRACTAL_Z", (17, 3, 3, 3), None, None),       # N and C padded
    ("FRACTAL_Z", (32, 64, 1, 1), None, None),      # nothing padded
    ("FRACTAL_Z", (3, 3, 5, 20), "HWCN", None),     # (H, W, C, N)
    ("FRACTAL_Z", (20, 3, 3, 5), "NHWC", None),
    ("FRACTAL_Z", (20, 33), None, None),            # 2-D ND matrix (K, N), both padded
    ("FRACTAL_Z", (64, 32), "ND", None),
    ("FRACTAL_NZ", (5, 17), None, None),            # H, W padded
    ("FRACTAL_NZ", (32, 64), None, None),
    ("FRACTAL_NZ", (2, 3, 20, 30), None, None),     # batch axes carried over
    ("FRACTAL_NZ", (1, 40), None, 16),
    ("NDC1HWC0", (2, 5, 3, 4, 2), None, None),
    ("NDC1HWC0", (1, 2, 3, 2, 33), "NDHWC", None),
    ("NCHW", (2, 3, 4, 5), None, None),
    ("ND", (7,), None, None),
    ("NHWC", (2, 3, 4, 5), "NCHW", None),           # dumped NHWC, original NCHW: permute
]


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("fmt,shape,orig,c0", ROUND_TRIPS, ids=lambda v: str(v))
def test_round_trip_bit_exact(fmt, shape, orig, c0, dtype_name):
    dtype = DTYPES[dtype_name]
    c0 = c0 or C0[dtype_name]
    x = random_bits(shape, dtype, seed=len(shape) * 31 + c0)
    dev = from_host(x, fmt, c0, original_format=orig)
    assert dev.dtype == dtype and dev.flags.c_contiguous
    back = to_host(dev, fmt, x.shape, orig)
    assert back.flags.c_contiguous
    assert same_bits(back, x)


def test_device_shapes():
    x = np.ones((2, 3, 5, 7), np.float16)
    assert from_host(x, "NC1HWC0").shape == (2, 1, 5, 7, 16)
    assert from_host(np.ones((2, 17, 5, 7), np.float32), "NC1HWC0", 8).shape == (2, 3, 5, 7, 8)
    assert from_host(np.ones((17, 3, 3, 3), np.float16), "FRACTAL_Z").shape == (9, 2, 16, 16)
    assert from_host(np.ones((3, 3, 20, 17), np.float16), "FRACTAL_Z", original_format="HWCN").shape == (
        2 * 9, 2, 16, 16)
    assert from_host(np.ones((20, 33), np.float16), "FRACTAL_Z").shape == (2, 3, 16, 16)
    assert from_host(np.ones((2, 3, 20, 30), np.float16), "FRACTAL_NZ").shape == (2, 3, 2, 2, 16, 16)
    assert from_host(np.ones((20, 30), np.float32), "FRACTAL_NZ", 8).shape == (4, 2, 16, 8)
    assert from_host(np.ones((2, 5, 3, 4, 2), np.float16), "NDC1HWC0").shape == (2, 3, 1, 4, 2, 16)
    assert from_host(np.ones((1, 3, 4, 4), np.float16), "NC1HWC0_C04").shape == (1, 1, 4, 4, 4)


# -- worked examples, written out by hand ------------------------------------------------

def test_nc1hwc0_worked_example():
    # x[0, c, h, w] = 4c + 2h + w, C = 3, C0 = 4: x[n, c, h, w] lands at d[n, c // 4, h, w, c % 4].
    x = np.arange(12, dtype=np.float16).reshape(1, 3, 2, 2)
    expected = np.array([[[[[0, 4, 8, 0], [1, 5, 9, 0]],
                           [[2, 6, 10, 0], [3, 7, 11, 0]]]]], np.float16)
    dev = from_host(x, "NC1HWC0", c0=4)
    assert dev.shape == (1, 1, 2, 2, 4)
    assert same_bits(dev, expected)
    assert dev[0, 0, 1, 0, 2] == x[0, 2, 1, 0] == 10
    assert same_bits(to_host(expected, "NC1HWC0", (1, 3, 2, 2)), x)
    # NHWC original: the same device array, host axes (N, H, W, C).
    assert same_bits(to_host(expected, "NC1HWC0", (1, 2, 2, 3), "NHWC"), x.transpose(0, 2, 3, 1))


def test_nc1hwc0_second_c1_block():
    # C = 5, C0 = 4: channel 4 opens block C1 = 1 at C0 position 0; positions 1..3 are padding.
    x = np.arange(1, 1 + 5 * 2, dtype=np.int8).reshape(1, 5, 1, 2)  # x[0, c, 0, w] = 2c + w + 1
    dev = from_host(x, "NC1HWC0", c0=4)
    assert dev.shape == (1, 2, 1, 2, 4)
    assert dev[0, 1, 0, 0].tolist() == [9, 0, 0, 0]
    assert dev[0, 1, 0, 1].tolist() == [10, 0, 0, 0]
    assert dev[0, 0, 0, 1].tolist() == [2, 4, 6, 8]


def test_fractal_z_2d_worked_example():
    # (K, N) = (3, 2), K0 = 2, N0 = 2: x[k, n] lands at d[k // 2, n // 2, n % 2, k % 2].
    x = np.array([[1, 2], [3, 4], [5, 6]], np.float32)
    expected = np.array([[[[1, 3], [2, 4]]],
                         [[[5, 0], [6, 0]]]], np.float32)
    dev = from_host(x, "FRACTAL_Z", c0=2, n0=2)
    assert same_bits(dev, expected)
    assert same_bits(to_host(expected, "FRACTAL_Z", (3, 2)), x)


def test_fractal_z_4d_positions():
    # NCHW (N, C, H, W) = (3, 5, 1, 2), C0 = 4, N0 = 2: C1 = 2, N1 = 2, device (C1*H*W, N1, N0, C0) = (4, 2, 2, 4);
    # x[n, c, h, w] lands at d[(c // 4) * 2 + h * 2 + w, n // 2, n % 2, c % 4].
    x = np.zeros((3, 5, 1, 2), np.float32)
    for n, c, w in itertools.product(range(3), range(5), range(2)):
        x[n, c, 0, w] = 100 * (n + 1) + 10 * c + w
    dev = from_host(x, "FRACTAL_Z", c0=4, n0=2)
    assert dev.shape == (4, 2, 2, 4)
    assert dev[0, 0, 0].tolist() == [100, 110, 120, 130]   # n 0, w 0, c 0..3
    assert dev[1, 0, 1].tolist() == [201, 211, 221, 231]   # n 1, w 1, c 0..3
    assert dev[2, 1, 0].tolist() == [340, 0, 0, 0]         # n 2, w 0, c 4 then C padding
    assert dev[3, 1, 0].tolist() == [341, 0, 0, 0]         # n 2, w 1
    assert not dev[:, 1, 1].any()                          # n 3 is N padding
    assert not dev[2:, :, :, 1:].any()                     # c 5..7 is C padding
    assert same_bits(to_host(dev, "FRACTAL_Z", (3, 5, 1, 2)), x)


def test_fractal_nz_published_example():
    # Ascend C data-format docs: a 4x4 matrix 0..15 in 2x2 fractals is stored as
    # 0,1,4,5,8,9,12,13,2,3,6,7,10,11,14,15.
    x = np.arange(16, dtype=np.float16).reshape(4, 4)
    dev = from_host(x, "FRACTAL_NZ", c0=2, h0=2)
    assert dev.shape == (2, 2, 2, 2)
    assert dev.ravel().tolist() == [0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15]
    assert same_bits(to_host(dev, "FRACTAL_NZ", (4, 4)), x)


def test_fractal_nz_worked_example_with_padding():
    # (H, W) = (3, 3), H0 = W0 = 2: x[h, w] lands at d[w // 2, h // 2, h % 2, w % 2].
    x = np.arange(1, 10, dtype=np.int8).reshape(3, 3)
    expected = np.array([[[[1, 2], [4, 5]], [[7, 8], [0, 0]]],
                         [[[3, 0], [6, 0]], [[9, 0], [0, 0]]]], np.int8)
    dev = from_host(x, "FRACTAL_NZ", c0=2, h0=2)
    assert same_bits(dev, expected)
    assert same_bits(to_host(expected, "FRACTAL_NZ", (3, 3)), x)


def test_ndc1hwc0_positions():
    x = np.arange(1, 1 + 2 * 3 * 2 * 1 * 2, dtype=np.float16).reshape(2, 3, 2, 1, 2)  # NCDHW
    dev = from_host(x, "NDC1HWC0", c0=4)
    assert dev.shape == (2, 2, 1, 1, 2, 4)
    for n, c, d, h, w in np.ndindex(x.shape):
        assert dev[n, d, c // 4, h, w, c % 4] == x[n, c, d, h, w]
    assert not dev[..., 3].any()


def test_index_formulas_on_random_shapes():
    # Every element checked against the layout formulas of the module docstring.
    x = random_bits((5, 6, 2, 3), DTYPES["float16"], seed=1)
    d = from_host(x, "NC1HWC0", 4)
    d_z = from_host(x, "FRACTAL_Z", 4, n0=4)
    for n, c, h, w in np.ndindex(x.shape):
        assert d[n, c // 4, h, w, c % 4].tobytes() == x[n, c, h, w].tobytes()
        assert d_z[(c // 4) * 6 + h * 3 + w, n // 4, n % 4, c % 4].tobytes() == x[n, c, h, w].tobytes()
    y = random_bits((2, 7, 9), DTYPES["bfloat16"], seed=2)
    d_nz = from_host(y, "FRACTAL_NZ", 4, h0=3)
    assert d_nz.shape == (2, 3, 3, 3, 4)
    for b, h, w in np.ndindex(y.shape):
        assert d_nz[b, w // 4, h // 3, h % 3, w % 4].tobytes() == y[b, h, w].tobytes()


# -- padding ---------------------------------------------------------------------------

def nonzero_values(shape, dtype) -> np.ndarray:
    return np.random.default_rng(3).integers(1, 100, size=shape).astype(dtype)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_padding_is_zero(dtype_name):
    dtype, c0 = DTYPES[dtype_name], C0[dtype_name]
    x = nonzero_values((3, c0 + 3, 2, 5), dtype)        # N = 3, C = C0 + 3
    d = from_host(x, "NC1HWC0", c0)
    assert d.shape == (3, 2, 2, 5, c0)
    assert not d[:, 1, :, :, 3:].astype(np.float32).any()
    assert np.count_nonzero(d.astype(np.float32)) == x.size

    z = from_host(x, "FRACTAL_Z", c0).reshape(2, 2, 5, 1, 16, c0)  # (C1, H, W, N1, N0, C0)
    assert not z[:, :, :, :, 3:, :].astype(np.float32).any()     # n >= 3
    assert not z[1, :, :, :, :, 3:].astype(np.float32).any()     # c >= C0 + 3
    assert np.count_nonzero(z.astype(np.float32)) == x.size

    m = nonzero_values((2, 17, c0 + 1), dtype)                   # H = 17, W = C0 + 1
    nz = from_host(m, "FRACTAL_NZ", c0)
    assert nz.shape == (2, 2, 2, 16, c0)
    assert not nz[:, 1, :, :, 1:].astype(np.float32).any()       # w >= C0 + 1
    assert not nz[:, :, 1, 1:, :].astype(np.float32).any()       # h >= 17
    assert np.count_nonzero(nz.astype(np.float32)) == m.size


# -- plain formats ---------------------------------------------------------------------

def test_plain_identity_and_permutation():
    x = np.arange(16, dtype=np.float32).reshape(2, 2, 2, 2)
    assert same_bits(to_host(x, "NCHW", (2, 2, 2, 2)), x)
    assert same_bits(to_host(x, "DefaultFormat", (2, 2, 2, 2), "NHWC"), x)  # DefaultFormat = host layout
    # Dumped NHWC, original NCHW, equal extents: the data must still be permuted.
    assert same_bits(to_host(x, "NHWC", (2, 2, 2, 2), "NCHW"), x.transpose(0, 3, 1, 2).copy())
    assert same_bits(to_host(x, "NCHW", (2, 2, 2, 2), "NHWC"), x.transpose(0, 2, 3, 1).copy())
    assert same_bits(to_host(np.arange(4.0).reshape(1, 4), "ND", (4,)), np.arange(4.0))
    nchw = from_host(x.transpose(0, 2, 3, 1), "NCHW", original_format="NHWC")
    assert same_bits(nchw, x)


# -- names -----------------------------------------------------------------------------

@pytest.mark.parametrize("name,expected", [
    ("NC1HWC0", "NC1HWC0"), ("FORMAT_NC1HWC0", "NC1HWC0"), ("format_fractal_nz", "FRACTAL_NZ"),
    ("ACL_FORMAT_FRACTAL_NZ", "FRACTAL_NZ"), ("Fractal_Z", "FRACTAL_Z"), ("FracZ", "FRACTAL_Z"),
    ("FRACTAL_Zn", "FRACTAL_Z"), ("DefaultFormat", "ND"), (" nchw ", "NCHW"), (3, "NC1HWC0"),
    (np.int32(29), "FRACTAL_NZ"), ("4", "FRACTAL_Z"), (32, "NDC1HWC0"), ("c1hwncoc0", "C1HWNCoC0"),
    ("whatever", "WHATEVER"),
])
def test_normalize_format(name, expected):
    assert normalize_format(name) == expected


def test_format_spellings_accepted_by_to_host():
    x = random_bits((2, 20, 3), DTYPES["float16"], seed=4)
    dev = from_host(x, "FRACTAL_NZ")
    for spelling in ("FRACTAL_NZ", "format_fractal_nz", 29, "29"):
        assert same_bits(to_host(dev, spelling, x.shape), x)
    assert set(SUPPORTED) >= {"NC1HWC0", "FRACTAL_Z", "FRACTAL_NZ", "NDC1HWC0", "ND", "NCHW", "NHWC"}
    assert all(normalize_format(name) == name for name in SUPPORTED)


# -- errors ----------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["FRACTAL_Z_3D", "C1HWNCoC0", "FRACTAL_ZN_LSTM", "BOGUS", 13])
def test_unsupported_format(fmt):
    with pytest.raises(ValueError, match="unsupported device format"):
        to_host(np.zeros((1, 1, 16, 16), np.float16), fmt, (1, 1))
    with pytest.raises(ValueError, match="unsupported device format"):
        from_host(np.zeros((1, 1), np.float16), fmt)


@pytest.mark.parametrize("fmt,device_shape,original_shape,orig,message", [
    ("NC1HWC0", (2, 1, 5, 7, 16), (2, 3, 5, 8), None, "expected device shape"),     # W differs
    ("NC1HWC0", (2, 1, 5, 7, 16), (2, 17, 5, 7), None, "expected device shape"),    # needs C1 = 2
    ("NC1HWC0", (2, 5, 7, 16), (2, 3, 5, 7), None, "5-D array"),
    ("NC1HWC0", (1, 1, 1, 1, 16), (3,), None, "4-D original shape"),                # reshape_type unknown
    ("NC1HWC0", (1, 1, 2, 2, 16), (1, 2, 2, 3), "NCDHW", "cannot be laid out"),
    ("NC1HWC0_C04", (1, 1, 4, 4, 16), (1, 3, 4, 4), None, "C0 = 4"),
    ("FRACTAL_Z", (9, 2, 16, 16), (17, 3, 3, 4), None, "expected device shape"),
    ("FRACTAL_Z", (18, 1, 16, 16), (16, 16, 3, 3), None, "groups"),                 # 2 C1 blocks for C = 16
    ("FRACTAL_Z", (2, 1, 16, 16), (2, 3, 4), None, "2-D ND matrices"),
    ("FRACTAL_NZ", (1, 1, 16, 16), (5,), None, "ambiguous"),
    ("FRACTAL_NZ", (1, 1, 16, 16), (17, 5), None, "expected device shape"),
    ("FRACTAL_NZ", (3, 1, 1, 16, 16), (2, 5, 5), None, "expected device shape"),    # batch 3 vs 2
    ("FRACTAL_NZ", (1, 16, 16), (5, 5), None, "at least 4 axes"),
    ("NDC1HWC0", (1, 1, 1, 2, 2, 16), (1, 3, 2, 2, 2), None, "expected device shape"),
    ("ND", (2, 3), (3, 2), None, "does not match original shape"),
    ("NCHW", (2, 3, 4, 5), (2, 3, 4, 5), "NHWC", "not original shape"),
    ("NCHW", (2, 3, 4, 5), (2, 3, 4, 5, 1), "NCDHW", "cannot convert"),
])
def test_shape_mismatch_is_a_clear_error(fmt, device_shape, original_shape, orig, message):
    with pytest.raises(ValueError, match=message) as info:
        to_host(np.zeros(device_shape, np.float16), fmt, original_shape, orig)
    assert isinstance(info.value, DumpdbError)
    assert "\n" not in str(info.value)


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown OutputFormat number"):
        normalize_format(77)
    with pytest.raises(ValueError):
        normalize_format("")
    with pytest.raises(ValueError, match="negative"):
        to_host(np.zeros((2, 2), np.float16), "ND", (-1, 2))
    with pytest.raises(ValueError, match="c0 must be a positive integer"):
        from_host(np.zeros((2, 3, 1, 1), np.float16), "NC1HWC0", c0=0)
    with pytest.raises(ValueError, match="ambiguous"):
        from_host(np.zeros(5, np.float16), "FRACTAL_NZ")
