"""The .npy reader on real MindSpore files and on damaged copies of them."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ms_case, npy_payload

from dumpdb.dtypes import BFLOAT16
from dumpdb.errors import DumpFileError
from dumpdb.npy import parse_npy, read_npy

D2 = ms_case("d2_compare_fp16_bf16_iter0") / "rank_0/LeNet5/0/0"


def _one(pattern: str):
    files = sorted(D2.glob(pattern))
    assert files, pattern
    return files[0]


def test_bfloat16_E2_descr_reads_as_bfloat16():
    path = _one("*.BFloat16.npy")
    with pytest.raises(ValueError):  # the real quirk: numpy refuses '<E2'
        np.load(path)
    t = read_npy(str(path))
    descr, shape, payload = npy_payload(path)
    assert descr == "<E2" and t.array.dtype == BFLOAT16 and t.array.shape == shape
    assert t.array.tobytes() == payload
    assert np.isfinite(t.array.astype(np.float32)).all()


def test_float16_header_with_float32_payload_is_stored_as_float32():
    # MatMul of fc2 in d2: file says Float16, header '<f2', payload is float32.
    path = _one("MatMul.Default_network-WithLossCell__backbone-LeNet5_fc2-Dense_MatMul-op0.*.Float16.npy")
    descr, shape, payload = npy_payload(path)
    assert descr == "<f2" and len(payload) == 4 * int(np.prod(shape))
    t = read_npy(str(path))
    assert t.array.dtype == np.float32 and t.array.shape == shape
    assert t.array.tobytes() == payload
    assert "float32" in t.note
    # and np.load would have returned garbage of the right shape silently
    assert np.load(path).dtype == np.float16


def test_true_float16_file_stays_float16():
    path = _one("Parameter.fc2_weight.*.Float16.npy")
    t = read_npy(str(path))
    assert t.array.dtype == np.float16 and t.note is None
    np.testing.assert_array_equal(t.array, np.load(path))


def test_truncated_file_is_an_error_naming_it():
    raw = _one("*Conv2D-op0*.npy").read_bytes()
    with pytest.raises(DumpFileError, match=r"^x\.npy: truncated"):
        parse_npy(raw[:-7], "x.npy")


def test_header_lying_about_shape_is_an_error():
    path = _one("Conv2D.*Conv2D-op0*.output.0.*.npy")
    raw = path.read_bytes()
    descr, shape, _ = npy_payload(path)
    assert shape[0] == 4
    lying = raw.replace(b"'shape': (4,", b"'shape': (2,", 1)  # same header length, half the elements
    assert lying != raw
    with pytest.raises(DumpFileError, match="header and data disagree"):
        parse_npy(lying, "lying.npy")


@pytest.mark.parametrize("raw,msg", [
    (b"", "not an .npy file"),
    (b"PK\x03\x04 not numpy", "not an .npy file"),
    (b"\x93NUMPY\x01\x00\xff\xff{'descr'", "truncated .npy header"),
])
def test_garbage_is_an_error(raw, msg):
    with pytest.raises(DumpFileError, match=msg):
        parse_npy(raw, "bad.npy")


def test_object_dtype_is_refused(tmp_path):
    path = tmp_path / "obj.npy"
    np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(DumpFileError, match="not a numeric tensor"):
        read_npy(str(path))


def test_fortran_order_and_big_endian_keep_values(tmp_path):
    a = np.arange(12, dtype=">f4").reshape(3, 4)
    np.save(tmp_path / "be.npy", a)
    f = np.asfortranarray(np.arange(6, dtype=np.int64).reshape(2, 3))
    np.save(tmp_path / "f.npy", f)
    be = read_npy(str(tmp_path / "be.npy"))
    assert be.array.dtype == np.dtype("<f4") and "big-endian" in be.note
    np.testing.assert_array_equal(be.array, a)
    fo = read_npy(str(tmp_path / "f.npy")).array
    assert fo.flags.c_contiguous
    np.testing.assert_array_equal(fo, f)


def test_unreadable_path_is_an_error(tmp_path):
    with pytest.raises(DumpFileError, match="cannot read"):
        read_npy(str(tmp_path / "missing.npy"), where="rank_0/missing.npy")
