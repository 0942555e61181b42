"""The fast paths of the compare rules' column helpers give what the plain computations give
(seeded random inputs with NULLs, NaN, +-inf, -0.0, huge and tiny floats, constant columns):
precision._format / _distinct against str.format row by row, columns.unique_keys against
np.unique, group_codes against a dict numbering of the sorted keys, strings / string_codes
against Arrow's dictionary encoding, Shapes against the Python lists, Texts against a list
written alike, _other_max and _among against Python, the verdicts' ignored-name scan against
_name_class."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from dumpdb.compare import verdict
from dumpdb.compare.columns import Shapes, Texts, group_codes, string_codes, strings, unique_keys
from dumpdb.compare.precision import _FLOATS, _among, _distinct, _format, _other_max

_SPECIAL = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 1e-300, -1e-300, 5e-324, 2.2250738585072014e-308, 1e300,
                     1.7976931348623157e308, 0.0005, 0.00105, 999.5, 9.995, 0.1, 1e-5, 2.5e-7, 123456789.0, 1.0,
                     10.0, 100.0, 0.125, 1e16, 1e-16])


def _floats(rng: np.random.Generator, n: int, kind: int) -> np.ndarray:
    if kind == 0:  # spread over many decades
        x = rng.standard_normal(n) * 10.0 ** rng.integers(-12, 12, n)
    elif kind == 1:  # few distinct values, many rounding ties
        x = np.round(rng.standard_normal(n), int(rng.integers(0, 6))) * 10.0 ** rng.integers(-3, 3, n)
    elif kind == 2:  # edge values, nudged by an ulp or so
        x = rng.choice(_SPECIAL, n) * rng.choice([1.0, -1.0, 1.0000000000000002, 0.9999999999999998], n)
    elif kind == 3:  # the whole float range, subnormals included
        x = 10.0 ** rng.uniform(-323, 308, n) * rng.choice([1.0, -1.0], n)
    else:  # runs of one value (the inputs' error of an op's rows)
        x = np.repeat(rng.standard_normal(n // 7 + 1) * 1e-3, 7)[:n]
    x[rng.random(n) < 0.05] = np.nan
    return x


@pytest.mark.parametrize("seed", range(6))
def test_format_is_str_format_row_by_row(seed):
    rng = np.random.default_rng(seed)
    with np.errstate(over="ignore"):
        for trial in range(40):
            n = int(rng.integers(1, 2000))
            x = _floats(rng, n, trial % 5)
            for spec in (".3g", ".6g", ".1g", ".8g", "g", "", ".2e"):
                template = "a {:" + spec + "} b"
                assert _format(template, x).to_pylist() == [template.format(v) for v in x.tolist()], (spec, trial)
                first, inverse = _distinct(x, spec)  # every row of a group formats as its first row
                assert [format(v, spec) for v in x[first[inverse]].tolist()] == [format(v, spec) for v in x.tolist()]
            x32 = x.astype(np.float32)
            assert _format("{:.3g}", x32).to_pylist() == [f"{v:.3g}" for v in x32.tolist()]
            y = _floats(rng, n, (trial + 1) % 5)
            assert _format("e {:.3g} = {:.3g} x", x, y).to_pylist() == \
                [f"e {a:.3g} = {b:.3g} x" for a, b in zip(x.tolist(), y.tolist())]
            grow = np.full(n, float(rng.choice([16.0, 2.5, -0.0, np.nan])))  # one text: literal in the join
            assert _format("{:.3g} x {:.3g} + {:g}", x, grow, grow).to_pylist() == \
                [f"{a:.3g} x {b:.3g} + {b:g}" for a, b in zip(x.tolist(), grow.tolist())]
            assert _format("{:.3g}, {:g}", grow, grow).to_pylist() == [f"{b:.3g}, {b:g}" for b in grow.tolist()]
            ints = rng.integers(-5, 2 ** int(rng.integers(1, 62)), n)
            assert _format("{:d} element(s)", ints).to_pylist() == [f"{v:d} element(s)" for v in ints.tolist()]
            small = rng.integers(-128, 127, n).astype(np.int8)
            assert _format("{:d}", small).to_pylist() == [str(v) for v in small.tolist()]


@pytest.mark.parametrize("seed", range(4))
def test_unique_keys_is_np_unique(seed):
    rng = np.random.default_rng(seed)
    for trial in range(200):
        n = int(rng.integers(0, 3000))
        dtype = [np.int64, np.int8, np.uint64, np.int32, np.uint8][trial % 5]
        info = np.iinfo(dtype)
        if trial % 3 == 0:  # a wide range: np.unique's own path
            keys = rng.integers(info.min, info.max, n, dtype=dtype)
        else:  # a narrow one somewhere in the type's range
            lo = int(rng.integers(info.min, max(info.min + 1, info.max - 300), dtype=dtype))
            keys = np.array([lo + int(k) for k in rng.integers(0, min(300, info.max - lo), n)], dtype)
        if trial % 7 == 0 and n:
            keys[:] = keys[0]  # one key
        first, inverse = unique_keys(keys)
        _, want_first, want_inverse = np.unique(keys, return_index=True, return_inverse=True)
        assert np.array_equal(first, want_first) and np.array_equal(inverse, want_inverse.reshape(-1)), trial


def _numbered(cols: list[np.ndarray]) -> np.ndarray:
    keys = list(zip(*(c.tolist() for c in cols)))
    number = {k: i for i, k in enumerate(sorted(set(keys)))}
    return np.array([number[k] for k in keys], np.int64)


@pytest.mark.parametrize("seed", range(4))
def test_group_codes_number_the_sorted_keys(seed):
    rng = np.random.default_rng(seed)
    null = np.iinfo(np.int64).min
    for trial in range(150):
        n = int(rng.integers(1, 500))
        cols = []
        for _ in range(int(rng.integers(1, 6))):
            kind = int(rng.integers(0, 4))
            if kind == 0:
                col = np.full(n, int(rng.integers(-3, 3)), np.int64)  # one value: numbers nothing
            elif kind == 1:
                col = np.full(n, null, np.int64)  # all NULL
            else:
                col = rng.integers(-5, 5, n).astype(np.int64)
                col[rng.random(n) < 0.2] = null
            cols.append(col)
        assert np.array_equal(group_codes(cols), _numbered(cols)), trial


def _text_columns(rng: np.random.Generator, n: int):
    words = ["float32", "bfloat16", "", "é", "output"]
    yield pa.array(["float32"] * n, pa.string())  # one value
    yield pa.array([None] * n, pa.string())  # all NULL
    yield pa.nulls(n)
    yield pa.array([rng.choice(words) if rng.random() > 0.1 else None for _ in range(n)], pa.string())
    same_ends = ["a"] + [str(rng.choice(words)) for _ in range(max(0, n - 2))] + ["a"]
    yield pa.array(same_ends[:n], pa.string())  # first == last, not one value
    yield pa.array(rng.integers(0, 3, n), pa.int32())
    yield pa.array([1.5] * (n - 1) + [float("nan")], pa.float64()) if n else pa.array([], pa.float64())
    yield pa.array([0.0, -0.0] * (n // 2) + [0.0] * (n % 2), pa.float64())  # equal, not the same value


@pytest.mark.parametrize("seed", range(3))
def test_strings_and_string_codes_fast_paths(seed):
    rng = np.random.default_rng(seed)
    null = np.iinfo(np.int64).min
    for n in (0, 1, 2, 3, 17, 200):
        for col in _text_columns(rng, n):
            got = strings(col)
            assert got.dtype == object and repr(got.tolist()) == repr(col.to_pylist())
            if pa.types.is_string(col.type) or pa.types.is_null(col.type):
                enc = pc.dictionary_encode(col)
                want = pc.fill_null(enc.indices.cast(pa.int64()), null).to_numpy(zero_copy_only=False) if n else []
                assert string_codes(col).tolist() == list(want)
                assert string_codes(pa.chunked_array([col])).tolist() == list(want)


def _shape_lists(rng: np.random.Generator, n: int, ranks: list[int], null: float) -> pa.Array:
    rows = []
    for _ in range(n):
        if rng.random() < null:
            rows.append(None)
            continue
        high = 5 if rng.random() < 0.9 else 2 ** 40
        rows.append([int(d) for d in rng.integers(0, high, int(rng.choice(ranks)))])
    return pa.array(rows, pa.list_(pa.int64()))


@pytest.mark.parametrize("seed", range(4))
def test_shapes_are_the_python_lists(seed):
    rng = np.random.default_rng(seed)
    for trial in range(100):
        n = int(rng.integers(0, 60))
        ranks = [[2], [0], [1, 3], [0, 4], [3]][trial % 5]
        null = [0.0, 0.0, 0.2, 1.0][trial % 4]
        a, b = _shape_lists(rng, n, ranks, null), _shape_lists(rng, n, ranks, null)
        if trial % 7 == 0:
            a, b = a.slice(min(n, 2)), b.slice(min(n, 2))
        sa, sb = Shapes(a), Shapes(b)
        la, lb = a.to_pylist(), b.to_pylist()
        assert [sa.shape(i) for i in range(len(la))] == [None if s is None else tuple(s) for s in la]
        assert sa.size.tolist() == [0 if s is None else int(np.prod(s, dtype=np.int64)) for s in la]
        assert sa.ndim.tolist() == [0 if s is None else len(s) for s in la]
        same = [x is not None and y is not None and x == y for x, y in zip(la, lb)]
        assert sa.equal(sb).tolist() == same
        sa.equal(sb)[:] = True  # a new array each call: writing one changes no later answer
        assert sa.equal(sb).tolist() == same and sb.equal(sa).tolist() == same
    none = Shapes(pa.nulls(4))
    assert none.size.tolist() == [0] * 4 and none.equal(none).tolist() == [False] * 4


@pytest.mark.parametrize("seed", range(4))
def test_texts_read_back_as_written(seed):
    rng = np.random.default_rng(seed)
    for trial in range(150):
        n = int(rng.integers(0, 80))
        texts, want = Texts(n), [None] * n
        for w in range(int(rng.integers(0, 9))):
            rows = rng.permutation(n)[: int(rng.integers(0, n + 1))]
            kind = int(rng.integers(0, 3))
            if kind == 0:
                value = f"one {w}" if rng.random() < 0.8 else None
                texts[rows] = value
                values = [value] * len(rows)
            else:
                values = [None if rng.random() < 0.2 else f"t{w}.{i}" * int(rng.integers(0, 3))
                          for i in range(len(rows))]
                texts[rows] = pa.array(values, pa.string()) if kind == 1 else np.array(values, dtype=object)
            for r, v in zip(rows.tolist(), values):
                want[r] = v
        whole = texts.arrow()
        assert whole.type == pa.string() and whole.to_pylist() == want, trial
        for _ in range(3):  # a few rows (each from its part) and many (one take)
            few = rng.integers(0, n, int(rng.integers(0, 4))) if n else np.zeros(0, np.int64)
            assert texts[few].to_pylist() == [want[i] for i in few.tolist()]
            mask = rng.random(n) < 0.7
            assert texts[mask].to_pylist() == [want[i] for i in np.flatnonzero(mask).tolist()]
        assert texts.nonempty().tolist() == [bool(v) for v in want]


def test_other_max_and_among_are_the_python_ones():
    rng = np.random.default_rng(7)
    for trial in range(200):
        n = int(rng.integers(1, 60))
        g = rng.integers(0, max(1, n // 3), n)
        groups = int(g.max()) + 1
        values = rng.choice([0.0, 1.0, 2.0, 2.0, 3.5, -1.0], n) * (1 + rng.random(n) * (trial % 2))
        known = rng.random(n) < 0.8
        got = _other_max(g, groups, values, known)
        for i in range(n):
            others = [values[j] for j in range(n) if j != i and g[j] == g[i] and known[j]]
            top = max(others, default=-1.0)
            assert (np.isnan(got[i]) and not top > 0) or got[i] == top, (trial, i)
        low = np.array(rng.choice(["float32", "bfloat16", "int8", "", None], n).tolist(), dtype=object)
        assert _among(low, _FLOATS).tolist() == np.isin(low, list(_FLOATS)).tolist()


def test_ignored_name_scan_finds_the_classed_names():
    """verdict._IGNORED finds exactly the names _name_class puts in class 1 or 2."""
    rng = np.random.default_rng(3)
    parts = ["Functional", "Tensor", "to", "empty", "empty_like", "x", "", "_all_gather_base", "all_to_all_single",
             "numpy", "0", "forward", "emptyy", "t o", "é", "__setitem__"]
    names = [None, "", ".", "to", ".to", "a.to", "a.to.", "a..to", "a.to.b.c", "a.tox"]
    names += [".".join(rng.choice(parts, int(rng.integers(1, 6))).tolist()) for _ in range(5000)]
    found = pc.fill_null(pc.match_substring_regex(pa.array(names, pa.string()), verdict._IGNORED), False)
    assert found.to_pylist() == [verdict._name_class(x) != 0 for x in names]


def test_fused_name_scan_is_either_substring():
    """The verdicts' one regex scan for fused bench names (verdict._FUSED) finds the names
    holding either text, as the two substring scans it replaced did."""
    rng = np.random.default_rng(4)
    parts = ["qkv", "gate_up", "gate", "up", "q", "kv", "x", "_", ".", "Qkv", "é"]
    names = [None, "", "qkv", "gate_up", "gate_u", "qk"]
    names += ["".join(rng.choice(parts, int(rng.integers(0, 6))).tolist()) for _ in range(5000)]
    found = pc.fill_null(pc.match_substring_regex(pa.array(names, pa.string()), verdict._FUSED), False)
    assert found.to_pylist() == [x is not None and ("qkv" in x or "gate_up" in x) for x in names]


def test_same_texts_by_arrow_is_np_equal():
    """precision._same_texts reads the Arrow columns where Columns.arrow has them: the same
    per-row equality as np.equal over the object arrays (None equal to None)."""
    from types import SimpleNamespace

    from dumpdb.compare.precision import _same_texts

    rng = np.random.default_rng(9)
    for n in (0, 1, 50, 400):
        a = np.array([rng.choice(["float32", "bfloat16", "", None]) for _ in range(n)], dtype=object)
        b = np.array([rng.choice(["float32", "bfloat16", "", None]) for _ in range(n)], dtype=object)
        plain = SimpleNamespace(x=a, y=b, arrow={})
        arrowed = SimpleNamespace(x=a, y=b, arrow={"x": pa.array(a, pa.string()), "y": pa.array(b, pa.string())})
        want = np.equal(a, b).astype(bool).tolist()
        assert _same_texts(plain, "x", "y").tolist() == want  # type: ignore[arg-type]
        assert _same_texts(arrowed, "x", "y").tolist() == want  # type: ignore[arg-type]
