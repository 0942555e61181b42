"""dumpdb.checks.scan on real MindSpore dumps, checked against an independent numpy model.

The model below reads the case directories itself (file names, .npy headers, the
execution-order csv, the IR text) without dumpdb, and applies each check's definition
(MindInsight / MindSpore semantics, see dumpdb/checks/scan.py) with plain numpy.
"""

from __future__ import annotations

import ast
import math
import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pyarrow as pa
import pytest

import dumpdb
from dumpdb.checks import scan as scan_mod
from dumpdb.checks.scan import CHECKS, RESULT_SCHEMA, parse_check_spec, scan
from dumpdb.errors import DumpdbError

DATA = Path(__file__).parent / "data" / "mindspore"
CASES = {"e1": "e1_nan_inf_overflow", "d2": "d2_compare_fp16_bf16_iter0", "c1": "c1_inputs_kernels_iter"}


@pytest.fixture(scope="session")
def archive(tmp_path_factory) -> dumpdb.Archive:
    path = tmp_path_factory.mktemp("scan") / "scan.dumpdb"
    for run, case in CASES.items():
        report = dumpdb.ingest(DATA / case, archive=path, run=run)
        assert report.ok, report.errors
    return dumpdb.open(path)


# --------------------------------------------------------------------------- independent model
_NAME = re.compile(r"^(?P<op_type>[^.]+)\.(?P<op_name>.+)\.(?P<task>\d+)\.(?P<stream>\d+)\.(?P<ts>\d+)\."
                   r"(?P<io>input|output)\.(?P<slot>\d+)\.(?P<fmt>[^.]+)(?:\.(?P<dtype>[A-Za-z0-9]+))?\.npy$")


def _load(path: Path) -> np.ndarray:
    """An .npy payload as what its bytes are: '<E2' is bfloat16; a '<f2' header over 4 bytes per
    element is float32 (MindSpore CPU writes such 'Float16' files)."""
    raw = path.read_bytes()
    if raw[6] == 1:
        hlen, start = int.from_bytes(raw[8:10], "little"), 10
    else:
        hlen, start = int.from_bytes(raw[8:12], "little"), 12
    header = ast.literal_eval(raw[start:start + hlen].decode("latin1"))
    payload, shape = raw[start + hlen:], tuple(header["shape"])
    n = math.prod(shape)
    dtype = ml_dtypes.bfloat16 if header["descr"] == "<E2" else np.dtype(header["descr"])
    if header["descr"] == "<f2" and len(payload) == 4 * n:
        dtype = np.float32
    return np.frombuffer(payload, dtype=dtype).reshape(shape)


def _model(run: str) -> list[dict]:
    """Every tensor file of a case: iteration, op, io, slot, execution position, array (float64 too)."""
    root = DATA / CASES[run] / "rank_0"
    lines = (root / "execution_order" / "ms_execution_order_graph_0.csv").read_text().splitlines()[1:]
    position = {s.strip().replace("/", "_"): i for i, s in enumerate(lines) if s.strip()}
    scope = {s.strip().replace("/", "_"): s.strip() for s in lines if s.strip()}
    out = []
    for f in sorted(root.glob("*/0/*/*.npy")):
        m = _NAME.match(f.name)
        assert m, f
        array = _load(f)
        out.append({
            "iteration": int(f.parent.name), "op_type": m["op_type"], "op_name": m["op_name"], "io": m["io"],
            "slot": int(m["slot"]), "timestamp": int(m["ts"]), "declared": m["dtype"],
            "position": position.get(m["op_name"]), "scope": scope.get(m["op_name"]), "array": array,
            "x": array.astype(np.float64).ravel(),
        })
    return out


def _order(t: dict) -> tuple:
    return (t["iteration"], t["position"] is None, t["position"] or 0, t["timestamp"], t["io"] != "input", t["slot"])


def _first_per_iteration(tensors: list[dict], hit) -> dict[int, dict]:
    first: dict[int, dict] = {}
    for t in sorted(tensors, key=_order):
        if t["iteration"] not in first and hit(t):
            first[t["iteration"]] = t
    return first


def _keys(table: pa.Table, check: str | None = None) -> set[tuple]:
    return {(r["iteration"], r["op_name"], r["io"], r["slot"]) for r in table.to_pylist()
            if check is None or r["check"] == check}


def _key(t: dict) -> tuple:
    return (t["iteration"], t["op_name"], t["io"], t["slot"])


def _ir_code(run: str, scope: str) -> tuple[str, int, str]:
    """The innermost '# In file' frame of the op's IR block outside site-packages (single lines before
    ranges), else the innermost single-line frame."""
    text = (DATA / CASES[run] / "rank_0" / "graphs" / "ms_output_trace_code_graph_0.ir").read_text()
    frames, inside = [], False
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("# Fullname with scope:"):
            inside = s == f"# Fullname with scope: ({scope})"
            frames = [] if inside else frames
        elif inside and s.startswith("# In file "):
            m = re.match(r"# In file (.+?):(\d+)(~\d+)?, [\d~]+/(.*)/$", s)
            frames.append((m[1], int(m[2]), bool(m[3]), m[4].strip()))
        elif inside and frames:
            break
    user = [f for f in frames if "site-packages" not in f[0]]
    for pool in ([f for f in user if not f[2]], user, [f for f in frames if not f[2]]):
        if pool:
            return pool[-1][0], pool[-1][1], pool[-1][3]
    raise AssertionError(scope)


# --------------------------------------------------------------------------- e1: first Inf / first NaN
def test_first_inf_and_nan_e1(archive):
    result = scan(archive, "e1", ["inf", "nan"])
    assert result.schema == RESULT_SCHEMA
    tensors = _model("e1")
    expected = {
        "inf": _first_per_iteration(tensors, lambda t: np.isinf(t["x"]).any()),
        "nan": _first_per_iteration(tensors, lambda t: np.isnan(t["x"]).any()),
    }
    got = {(r["check"], r["iteration"]): r for r in result.to_pylist()}
    assert set(got) == {(c, i) for c, firsts in expected.items() for i in firsts}
    for check, firsts in expected.items():
        for iteration, t in firsts.items():
            row = got[check, iteration]
            assert (row["op_name"], row["io"], row["slot"], row["position"]) == (
                t["op_name"], t["io"], t["slot"], t["position"])
            assert row["op_type"] == t["op_type"] and row["scope_name"] == t["scope"]
            x = t["x"]
            assert row["value"] == (np.isinf(x).sum() if check == "inf" else np.isnan(x).sum())
            assert (row["code_file"], row["code_line"], row["code_text"]) == _ir_code("e1", t["scope"])
    # the story of this case: loss inf at iteration 0 (no NaN yet), NaN from the first op of iteration 1
    assert ("nan", 0) not in got
    assert expected["inf"][0]["io"] == "output" and expected["inf"][0]["position"] > 0
    first_nan = got["nan", 1]
    assert first_nan["position"] == 0 and first_nan["io"] == "output"
    assert first_nan["code_text"] == "x = self.max_pool2d(self.relu(self.conv1(x)))"
    # ... whose weight input is already +-Inf: the first Inf of iteration 1 is the same op's input
    assert (got["inf", 1]["op_name"], got["inf", 1]["io"]) == (first_nan["op_name"], "input")
    # order: iteration, then execution position, inputs before outputs
    assert [(r["iteration"], r["check"]) for r in result.to_pylist()] == [(0, "inf"), (1, "inf"), (1, "nan")]


def test_all_hits_and_filters_e1(archive):
    tensors = _model("e1")
    result = scan(archive, "e1", ["nan_inf", "tensor_overflow", "all_zero"], first_only=False)
    bad = {_key(t) for t in tensors if not np.isfinite(t["x"]).all()}
    zero = {_key(t) for t in tensors if t["x"].size and not t["x"].any()}
    assert _keys(result, "nan_inf") == bad == _keys(result, "tensor_overflow")
    assert _keys(result, "all_zero") == zero and zero
    rows = result.to_pylist()
    order = [(r["iteration"], r["position"] is None, r["position"] or 0, r["timestamp"]) for r in rows]
    assert order == sorted(order)
    only1 = scan(archive, "e1", ["nan_inf"], iteration=1, rank=0, first_only=False)
    assert set(only1.column("iteration").to_pylist()) == {1} and only1.num_rows == sum(k[0] == 1 for k in bad)


def test_fp16_overflow_cast_reads_nan_tensors_e1(archive):
    """cast=1: float32 tensors that would overflow float16; tensors holding NaN (catalog min/max NaN) are read."""
    tensors = _model("e1")
    result = scan(archive, "e1", ["fp16_overflow:cast=1"], first_only=False)
    expected = {}
    for t in tensors:
        finite_or_inf = t["x"][~np.isnan(t["x"])]
        if finite_or_inf.size and np.abs(finite_or_inf).max() >= 65504:
            expected[_key(t)] = np.abs(finite_or_inf).max()
    got = {(r["iteration"], r["op_name"], r["io"], r["slot"]): r["value"] for r in result.to_pylist()}
    assert got.keys() == expected.keys()
    for k, v in expected.items():
        assert got[k] == pytest.approx(v, rel=1e-12)
    # some of them hold NaN as well, so the statistics alone could not say
    assert any(np.isnan(t["x"]).any() and _key(t) in expected for t in tensors)
    assert scan(archive, "e1", ["fp16_overflow"]).num_rows == 0  # no float16 tensor in this float32 run


# --------------------------------------------------------------------------- d2: float16 overflow
def test_fp16_overflow_d2(archive):
    tensors = _model("d2")
    declared_fp16 = [t for t in tensors if t["array"].dtype == np.float16 or t["declared"] == "Float16"]
    assert declared_fp16 and any(t["array"].dtype == np.float32 for t in declared_fp16)  # the CPU quirk
    # numpy.load on the quirky files reads half the bytes as float16 and sees Inf/NaN that are not there
    quirky = next(t for t in declared_fp16 if t["array"].dtype == np.float32
                  and not np.isfinite(np.load(_file("d2", t)).astype(np.float64)).all())
    assert np.abs(quirky["x"]).max() < 1
    assert scan(archive, "d2", ["fp16_overflow"], first_only=False).num_rows == 0
    assert scan(archive, "d2", ["fp16_overflow:cast=1,max_abs_ge=65500"], first_only=False).num_rows == 0

    for cast in (0, 1):
        limit = 0.25
        pool = declared_fp16 if cast == 0 else [t for t in tensors if t["array"].dtype.kind != "b"]
        expected = {_key(t): np.abs(t["x"]).max() for t in pool if t["x"].size and np.abs(t["x"]).max() >= limit}
        result = scan(archive, "d2", ["fp16_overflow"], params={"fp16_overflow": {"max_abs_ge": limit, "cast": cast}},
                      first_only=False)
        got = {(r["iteration"], r["op_name"], r["io"], r["slot"]): r["value"] for r in result.to_pylist()}
        assert got.keys() == expected.keys() and got
        assert all(got[k] == pytest.approx(v, rel=1e-12) for k, v in expected.items())
    assert len(expected) > len({_key(t) for t in declared_fp16} & expected.keys())


def _file(run: str, t: dict) -> Path:
    return next((DATA / CASES[run] / "rank_0").glob(f"*/0/{t['iteration']}/{t['op_type']}.{t['op_name']}.*."
                                                   f"{t['timestamp']}.{t['io']}.{t['slot']}.*.npy"))


# --------------------------------------------------------------------------- c1: MindInsight watch conditions
def _value_hits(t: dict, tests: list[tuple[str, str, float]], p: dict) -> list[float]:
    """MindSpore TensorSummary semantics: NaN/Inf tensors are not evaluated; any enabled parameter hits."""
    x = t["x"]
    if not x.size or not np.isfinite(x).all():
        return []
    metric = {
        "abs_mean": np.abs(x).mean(), "max": x.max(), "min": x.min(), "mean": x.mean(), "max_min": x.max() - x.min(),
        "zero_percentage": 100.0 * (x == 0).sum() / x.size,
    }
    if "range_start_inclusive" in p:
        inside = (x >= p["range_start_inclusive"]) & (x <= p["range_end_inclusive"])
        metric["range_percentage"] = 100.0 * inside.sum() / x.size
    out = []
    for name, op, v in tests:
        a = metric[name]
        if (op == "gt" and a > v) or (op == "lt" and a < v) or (op == "ge" and a >= v):
            out.append(a)
    return out


def _spec_tests(spec: str) -> tuple[list[tuple[str, str, float]], dict]:
    _, p = parse_check_spec(spec)
    tests = [(k.rpartition("_")[0], k.rpartition("_")[2], v) for k, v in p.items()
             if k not in ("range_start_inclusive", "range_end_inclusive")]
    return tests, p


@pytest.mark.parametrize("spec", [
    "tensor_too_large:abs_mean_gt=0.5,max_gt=3.9",
    "tensor_too_large:mean_gt=0.6",
    "tensor_too_small:abs_mean_lt=0.001",
    "tensor_too_small:min_lt=-3.5,mean_lt=-0.01",
    "tensor_range:range_start_inclusive=-0.05,range_end_inclusive=0.05,range_percentage_gt=60",
    "tensor_range:range_start_inclusive=0,range_end_inclusive=1,range_percentage_lt=90,max_min_lt=0.004",
    "tensor_all_zero:zero_percentage_ge=70",
])
def test_value_conditions_c1(archive, spec):
    tensors = _model("c1")
    tests, p = _spec_tests(spec)
    name = spec.partition(":")[0]
    expected = {}
    for t in tensors:
        hits = _value_hits(t, tests, p)
        if hits:
            expected[_key(t)] = hits[0]
    result = scan(archive, "c1", [spec], first_only=False)
    got = {(r["iteration"], r["op_name"], r["io"], r["slot"]): r["value"] for r in result.to_pylist()}
    assert got.keys() == expected.keys() and got, name
    for k, v in expected.items():
        assert got[k] == pytest.approx(v, rel=1e-9, abs=1e-12)
    # first_only: the first of them per iteration in execution order
    firsts = _first_per_iteration(tensors, lambda t: _key(t) in expected)
    assert _keys(scan(archive, "c1", [spec])) == {_key(t) for t in firsts.values()}


def _pairs(tensors: list[dict]) -> list[tuple[dict, dict]]:
    """(previous, current): the same op/io/slot in the previous dumped iteration."""
    series: dict[tuple, list[dict]] = {}
    for t in tensors:
        series.setdefault((t["op_name"], t["io"], t["slot"]), []).append(t)
    return [(a, b) for s in series.values() for a, b in zip(sorted(s, key=_order), sorted(s, key=_order)[1:])]


# Written out from the source, not read from dumpdb: reference formats.md 5
# (TensorUnchangedCondition(rtol=1e-5, atol=1e-8), TensorChange*ThresholdCondition(epsilon=1e-9))
# and mindinsight/debugger/conditionmgr/condition_list.py (abs_mean_update_ratio_gt 1e-1,
# abs_mean_update_ratio_lt 1e-4).
MINDINSIGHT_DEFAULTS = {
    "tensor_unchanged": {"rtol": 1e-5, "atol": 1e-8},
    "tensor_change_above_threshold": {"abs_mean_update_ratio_gt": 0.1, "epsilon": 1e-9},
    "tensor_change_below_threshold": {"abs_mean_update_ratio_lt": 1e-4, "epsilon": 1e-9},
}


def test_watch_condition_defaults_are_mindinsights():
    for name, params in MINDINSIGHT_DEFAULTS.items():
        assert {k: v for k, v in CHECKS[name].params.items() if v is not None} == params
    assert CHECKS["tensor_all_zero"].params == {"zero_percentage_ge": 100.0}
    assert CHECKS["fp16_overflow"].params["max_abs_ge"] == 65504  # float16's largest finite value


@pytest.mark.parametrize("spec", [
    "tensor_unchanged",
    "tensor_unchanged:atol=1e-3",
    "tensor_unchanged:rtol=0.02,atol=0",
    "tensor_change_above_threshold:abs_mean_update_ratio_gt=1.5",
    "tensor_change_above_threshold",
    "tensor_change_below_threshold:abs_mean_update_ratio_lt=1e-3",
])
def test_change_conditions_c1(archive, spec):
    tensors = _model("c1")
    assert sorted({t["iteration"] for t in tensors}) == [0, 2, 3]
    name, given = parse_check_spec(spec)
    p = MINDINSIGHT_DEFAULTS[name] | given
    expected = {}
    for prev, cur in _pairs(tensors):
        c, q = cur["x"], prev["x"]
        if c.size != q.size or not np.isfinite(c).all():
            continue
        d = np.abs(c - q)
        if name == "tensor_unchanged":
            if np.all(d <= p["atol"] + p["rtol"] * np.abs(q)):
                expected[_key(cur)] = (d.max(), prev["iteration"])
        else:
            ratio = d.mean() / (np.abs(q).mean() + p["epsilon"])
            threshold = p.get("abs_mean_update_ratio_gt", p.get("abs_mean_update_ratio_lt"))
            if ratio > threshold if name.endswith("above_threshold") else ratio < threshold:
                expected[_key(cur)] = (ratio, prev["iteration"])
    result = scan(archive, "c1", [spec], first_only=False)
    got = {(r["iteration"], r["op_name"], r["io"], r["slot"]): r for r in result.to_pylist()}
    assert got.keys() == expected.keys() and got
    for k, (value, prev_iteration) in expected.items():
        assert got[k]["value"] == pytest.approx(value, rel=1e-9, abs=1e-15)
        assert f"vs iteration {prev_iteration}" in got[k]["detail"]
    assert 0 not in {k[0] for k in got}  # nothing before the first dumped iteration
    # the other iterations are still compared with earlier ones when one is selected
    only3 = scan(archive, "c1", [spec], iteration=3, first_only=False)
    assert _keys(only3) == {k for k in expected if k[0] == 3}


def test_only_needed_payloads_are_read(archive, monkeypatch):
    reads = []
    real = dumpdb.Archive.tensors

    def counting(self, query, params=None, **kw):
        for row, array in real(self, query, params, **kw):
            reads.append(row["tensor_id"])
            yield row, array

    monkeypatch.setattr(dumpdb.Archive, "tensors", counting)
    statistics_only = [name for name, c in CHECKS.items() if not c.needs_tensors]
    assert set(statistics_only) >= {"nan", "inf", "nan_inf", "all_zero", "tensor_all_zero", "tensor_overflow"}
    for run in CASES:
        scan(archive, run, statistics_only, first_only=False)
    scan(archive, "c1", ["tensor_too_large:max_gt=1,mean_gt=0.5", "tensor_range:max_min_gt=1",
                         "tensor_unchanged", "fp16_overflow"], first_only=False)
    assert reads == []
    # abs_mean of a tensor with both signs is read; non-negative ones come from the statistics
    scan(archive, "c1", ["tensor_too_large:abs_mean_gt=0.5"], first_only=False)
    tensors = _model("c1")
    mixed = [t for t in tensors if t["x"].min() < 0 < t["x"].max()]
    assert 0 < len(reads) <= len(mixed)


# --------------------------------------------------------------------------- registry, specs, errors
def test_registry_and_parse_check_spec():
    mindinsight = {
        "tensor_too_large": ["abs_mean_gt", "max_gt", "min_gt", "mean_gt"],
        "tensor_too_small": ["abs_mean_lt", "max_lt", "min_lt", "mean_lt"],
        "tensor_range": ["range_start_inclusive", "range_end_inclusive", "range_percentage_lt",
                         "range_percentage_gt", "max_min_lt", "max_min_gt"],
        "tensor_all_zero": ["zero_percentage_ge"], "tensor_overflow": [],
        "tensor_unchanged": ["rtol", "atol"],
        "tensor_change_above_threshold": ["abs_mean_update_ratio_gt", "epsilon"],
        "tensor_change_below_threshold": ["abs_mean_update_ratio_lt", "epsilon"],
    }
    for name, params in mindinsight.items():
        assert list(CHECKS[name].params) == params
    assert CHECKS["tensor_unchanged"].params == {"rtol": 1e-5, "atol": 1e-8}
    assert CHECKS["tensor_change_above_threshold"].params["epsilon"] == 1e-9
    assert CHECKS["fp16_overflow"].params["max_abs_ge"] == 65504
    for c in CHECKS.values():
        assert c.description and c.source and isinstance(c.needs_tensors, bool)

    assert parse_check_spec("tensor_too_large:abs_mean_gt=100,max_gt=1e4") == (
        "tensor_too_large", {"abs_mean_gt": 100.0, "max_gt": 10000.0})
    assert parse_check_spec(" nan ") == ("nan", {})
    assert parse_check_spec("fp16_overflow:cast=true") == ("fp16_overflow", {"cast": 1.0})


@pytest.mark.parametrize("call, message", [
    (lambda a: scan(a, "e1", ["nan", "bogus"]), r"^unknown check 'bogus' \(known checks: nan, inf, nan_inf, "),
    (lambda a: parse_check_spec("tensor_too_large:abs_mean=3"), r"has no parameter 'abs_mean' \(parameters: "
                                                              r"abs_mean_gt, max_gt, min_gt, mean_gt\)"),
    (lambda a: parse_check_spec("tensor_too_large:max_gt"), r"bad parameter 'max_gt'.*expected PARAM=VALUE"),
    (lambda a: parse_check_spec("tensor_too_large:max_gt=big"), r"max_gt='big' is not a number"),
    (lambda a: scan(a, "c1", ["tensor_too_large"]), r"needs at least one of abs_mean_gt, max_gt"),
    (lambda a: scan(a, "c1", ["tensor_range:range_percentage_lt=5"]), r"need both range_start_inclusive"),
    (lambda a: scan(a, "c1", ["tensor_unchanged:rtol=-1"]), r"rtol=-1.0 must be >= 0"),
    (lambda a: scan(a, "c1", ["tensor_all_zero:zero_percentage_ge=120"]), r"must be a percentage"),
    (lambda a: scan(a, "c1", ["nan"], params={"inf": {}}), r"parameters given for check inf, which is not selected"),
    (lambda a: scan(a, "c1", ["nan", "nan"]), r"check nan given twice"),
    (lambda a: scan(a, "nope", ["nan"]), r"no run 'nope' in .* \(runs: c1, d2, e1\)"),
    (lambda a: scan(a, "c1", ["nan"], iteration=1), r"run 'c1' has no iteration 1 \(iterations: 0, 2, 3\)"),
    (lambda a: scan(a, "c1", []), r"no checks given"),
])
def test_errors(archive, call, message):
    with pytest.raises(DumpdbError, match=message) as info:
        call(archive)
    assert "\n" not in str(info.value)


def test_default_checks_and_empty_result(archive):
    result = scan(archive, "c1")
    assert result.schema == RESULT_SCHEMA
    assert set(result.column("check").to_pylist()) <= set(scan_mod.DEFAULT_CHECKS)
    # c1 has no NaN/Inf and nothing beyond float16's range; fc2's MatMul input 2 is all zeros in
    # each of its iterations 0, 2, 3 (read off the dump: 14 tensors per iteration).
    hits = [(r["check"], r["iteration"], r["op_name"], r["io"], r["slot"]) for r in result.to_pylist()]
    assert hits == [("all_zero", it, "Default_network-WithLossCell__backbone-LeNet5_fc2-Dense_MatMul-op0", "input", 2)
                    for it in (0, 2, 3)]
    empty = scan(archive, "c1", ["nan"])
    assert empty.num_rows == 0 and empty.schema == RESULT_SCHEMA
