"""The tensor metric kernel against a straightforward reference (issues 13 and 29, compare speed).

``metrics.tensor_metrics`` runs the compiled kernel (``dumpdb.compare.kernel``, numba) or its
numpy form, reuses work arrays, skips copies and cuts a large pair into segments folded in
order (``metrics.split_pair``); every such shortcut, in both forms, must leave the results
bit for bit what the module docstring's formulas give when applied chunk by chunk with plain
expressions and the kernel's summation order written out in Python (:func:`_reference`;
its logarithm is the kernel's fdlibm formula, checked against libm below). Hypothesis draws the arrays: every
supported float dtype and a few integer ones, zeros (bench zeros: msprobe's eps rule),
signed zeros, denormals, huge values, constant tensors, NaN/Inf at the same positions on
both sides (zeroed, noted) and at different ones (no metrics)."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from threadpoolctl import threadpool_limits

from dumpdb.compare import kernel
from dumpdb.compare import metrics as M

pytestmark = pytest.mark.timeout(300)

SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
DTYPES = [np.float16, np.float32, np.float64, ml_dtypes.bfloat16, np.int32, np.int8, np.bool_]
SPECIAL = [0.0, -0.0, 1e-40, 5e-324, 6e-8, 1e30, -1e30, 65504.0, 1.0, -1.0]


@st.composite
def pairs(draw, finite: bool = False):
    tdt, bdt = draw(st.sampled_from(DTYPES)), draw(st.sampled_from(DTYPES))
    n = draw(st.integers(1, 3000))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = rng.standard_normal(n) * 10 ** draw(st.floats(-6, 6))
    if draw(st.booleans()):
        x[:] = x[0]  # constant tensor: max == min in KL
    y = x * (1 + 10 ** draw(st.floats(-8, -1)) * rng.standard_normal(n))
    for arr in (x, y):
        k = draw(st.integers(0, min(n, 20)))
        arr[rng.integers(0, n, k)] = rng.choice(SPECIAL, k)
    if not finite and draw(st.booleans()):
        at = rng.integers(0, n, draw(st.integers(1, 5)))
        bad = rng.choice([np.nan, np.inf, -np.inf], at.size)
        x[at] = bad
        y[at] = bad if draw(st.booleans()) else rng.choice([np.nan, np.inf, 1.0], at.size)
    with np.errstate(all="ignore"):
        t, b = x.astype(tdt), y.astype(bdt)
    if finite:  # values that overflow the dtype (1e30 in float16) become 0
        t[~np.isfinite(t.astype(np.float64))] = 0
        b[~np.isfinite(b.astype(np.float64))] = 0
    chunk = draw(st.sampled_from([1, 7, 64, 500, 4096]))
    return t, b, chunk


def _lsum(terms: np.ndarray) -> float:
    """The kernel's order: lane i % 8 for the first 8 * (n // 8) elements (a reduction over
    the leading axis of a C-ordered (n // 8, 8) array adds row after row), lanes folded
    ((l0+l4)+(l2+l6))+((l1+l5)+(l3+l7)), then the rest one by one in order."""
    terms = np.asarray(terms, np.float64)
    n8 = terms.size // 8 * 8
    lanes = [0.0] * 8
    for row in terms[:n8].reshape(-1, 8):
        lanes = [a + float(v) for a, v in zip(lanes, row)]
    total = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]))
    for v in terms[n8:].tolist():
        total += v
    return total


def _reference(t: np.ndarray, b: np.ndarray, chunk: int):
    """The module docstring's formulas, chunk by chunk, one plain expression each."""
    out = dict.fromkeys(M.TENSOR_METRICS)
    if t.dtype.kind == "c" or b.dtype.kind == "c":
        return out, M.MSG_COMPLEX
    if t.size == 0:
        return out, M.MSG_EMPTY
    tf, bf = t.reshape(-1), b.reshape(-1)
    x_all, y_all = tf.astype(np.float64), bf.astype(np.float64)
    msgs = [M.MSG_ONE_ELEMENT] if t.size == 1 else []
    bad_x, bad_y = ~np.isfinite(x_all), ~np.isfinite(y_all)
    if bad_x.any() or bad_y.any():
        if not (np.array_equal(np.isnan(x_all), np.isnan(y_all)) and np.array_equal(np.isinf(x_all), np.isinf(y_all))):
            return out, M.MSG_NAN_INF_MISMATCH
        msgs.append(M.MSG_NAN_INF_ZEROED)
        x_all = np.where(bad_x, 0.0, x_all)
        y_all = np.where(bad_x, 0.0, y_all)
    if t.dtype != b.dtype:
        msgs.append(M.MSG_DTYPE.format(t=t.dtype, b=b.dtype))
    xmin, xmax, ymin, ymax = x_all.min(), x_all.max(), y_all.min(), y_all.max()
    rt = np.result_type(M._rel_dtype(t.dtype), M._rel_dtype(b.dtype), np.float32)
    eps = np.finfo(rt).eps
    acc = M._Acc()
    with np.errstate(all="ignore"):
        for s in range(0, t.size, chunk):
            x, y = x_all[s:s + chunk], y_all[s:s + chunk]
            acc.dot += _lsum(x * y)
            acc.xx += _lsum(x * x)
            acc.yy += _lsum(y * y)
            d = x - y
            acc.dd += _lsum(d * d)
            acc.abs_sum += _lsum(np.abs(d))
            acc.max_abs = float(np.maximum(acc.max_abs, np.abs(d).max()))
            n, bb = x.astype(rt), y.astype(rt)
            add = np.where(bb == 0, eps, rt.type(0)).astype(rt)
            r = np.abs((n + add - (bb + add)) / (bb + add))
            acc.max_rel = float(np.maximum(acc.max_rel, r.max()))
            acc.cnt1 += int(np.count_nonzero(r < rt.type(M.THOUSAND_RATIO_THRESHOLD)))
            acc.cnt5 += int(np.count_nonzero(r < rt.type(M.FIVE_THOUSAND_RATIO_THRESHOLD)))
            valid = np.abs(y) > M.EPS64
            acc.acc_rel += _lsum(np.where(valid, np.abs(x / np.where(valid, y, 1.0) - 1.0), 0.0))
            vx = (x - xmin) / (xmax - xmin) if xmax != xmin else x
            vy = (y - ymin) / (ymax - ymin) if ymax != ymin else y
            vx, vy = np.maximum(vx, M.EPS32), np.maximum(vy, M.EPS32)
            acc.kl_sx += _lsum(vx)
            acc.kl_sy += _lsum(vy)
            acc.kl_t += _lsum(vx * kernel.log_numpy(vx / vy))
    M._finish(out, msgs, acc, t.size, False)
    return out, "; ".join(msgs) if msgs else None


@pytest.fixture(params=["numba", "numpy"])
def form(request, monkeypatch):
    """Each test runs with the compiled kernel and with its numpy form."""
    if request.param == "numba" and not kernel.HAVE_NUMBA:
        pytest.skip("numba is not installed: the compiled kernel cannot run")
    monkeypatch.setattr(kernel, "AVAILABLE", request.param == "numba")
    return request.param


def _same(got, want, form: str = "") -> None:
    assert repr(got) == repr(want)


@SETTINGS
@given(case=pairs())
def test_kernel_is_the_reference_bit_for_bit(form, case):
    t, b, chunk = case
    _same(M.tensor_metrics(t, b, chunk=chunk), _reference(t, b, chunk), form)


@SETTINGS
@given(case=pairs())
def test_compiled_and_numpy_forms_agree(monkeypatch, case):
    """The numpy fallback is the kernel's twin, bit for bit."""
    t, b, chunk = case
    compiled = M.tensor_metrics(t, b, chunk=chunk)
    with monkeypatch.context() as m:
        m.setattr(kernel, "AVAILABLE", False)
        _same(M.tensor_metrics(t, b, chunk=chunk), compiled, "numpy")


@SETTINGS
@given(case=pairs(finite=True), segment=st.integers(1, 6))
def test_split_pair_folds_to_tensor_metrics_bit_for_bit(form, case, segment):
    t, b, chunk = case
    x, y = t.astype(np.float64), b.astype(np.float64)
    ranges = (float(x.min()), float(x.max()), float(y.min()), float(y.max()))
    split = M.split_pair(t, b, ranges, chunk=chunk)
    assert split is not None
    tasks = split.tasks(segment)
    assert len(tasks) == math.ceil(math.ceil(t.size / chunk) / segment)
    with threadpool_limits(1, user_api="blas"):
        got = split.finish([task() for task in reversed(tasks)][::-1])  # run in any order, folded in order
        assert repr(got) == repr(M.tensor_metrics(t, b, chunk=chunk, ranges=ranges))
        _same(got, _reference(t, b, chunk), form)


def test_split_pair_declines_what_tensor_metrics_takes_whole():
    x = np.arange(10, dtype=np.float32)
    r = (0.0, 9.0, 0.0, 9.0)
    assert M.split_pair(x, x, None) is None  # ranges unknown: the first pass is needed
    assert M.split_pair(x, x, (0.0, math.inf, 0.0, 9.0)) is None
    assert M.split_pair(np.float32(1), np.float32(1), r) is None  # 0-d
    assert M.split_pair(x, x[:5], r) is None  # shapes differ
    assert M.split_pair(x.astype(np.complex64), x, r) is None
    assert M.split_pair(x[:0], x[:0], r) is None
    with pytest.raises(ValueError):
        M.split_pair(x, x, r, chunk=0)


def test_log_is_within_one_ulp_of_libm_and_the_same_in_both_forms():
    rng = np.random.default_rng(7)
    q = np.concatenate([rng.uniform(0.5, 2.0, 20000), 1 + rng.standard_normal(20000) * 1e-6,
                        10.0 ** rng.uniform(-300, 300, 20000),
                        [1.0, np.nextafter(1.0, 2), np.nextafter(1.0, 0), 2.0, 0.5, 1e-310, 0.0, np.inf, np.nan]])
    got = kernel.log_numpy(q)
    with np.errstate(all="ignore"):
        libm = np.array([math.log(v) if v > 0 and math.isfinite(v) else np.log(v) for v in q.tolist()])
    finite = np.isfinite(libm)
    ulps = np.abs(got[finite] - libm[finite]) / np.spacing(np.abs(libm[finite]) + 1e-300)
    assert ulps.max() <= 1.0
    assert np.array_equal(got[~finite], libm[~finite], equal_nan=True)
    assert got[q == 1.0].tolist() == [0.0]
    if kernel.HAVE_NUMBA:
        work = np.zeros((1, q.size))
        out = np.empty_like(q)
        kernel.compiled()._log_block(q.copy(), q.copy().view(np.int64), work.view(np.int64)[0], work[0], out, q.size)
        assert repr(out.tolist()) == repr(got.tolist())


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(cases=st.lists(pairs(), min_size=1, max_size=6))
def test_batch_is_tensor_metrics_pair_by_pair_in_both_forms(form, cases):
    """tensor_metrics_batch (the compiled segment kernel, or the numpy segment form) gives each
    pair's tensor_metrics bits; pairs with NaN/Inf, 0-d or one element go one by one."""
    targets, benches = [c[0] for c in cases], [c[1] for c in cases]
    got = M.tensor_metrics_batch(targets, benches)
    for i, (t, b) in enumerate(zip(targets, benches)):
        assert repr(got[i]) == repr(M.tensor_metrics(t, b))


@pytest.mark.skipif(not kernel.HAVE_NUMBA, reason="numba is not installed: the compiled kernel cannot run")
def test_half_to_float32_is_numpys_cast_for_every_float16():
    """The kernel's float16 widening (all 65,536 bit patterns: zeros, subnormals, normals, Inf,
    NaN payloads, both signs) gives the bits of numpy's cast."""
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    out = np.empty(h.size, np.float32)
    kernel.compiled().half_to_float32(h, out, out.view(np.uint32))
    assert np.array_equal(out.view(np.uint32), h.view(np.float16).astype(np.float32).view(np.uint32))


def _scan_cases():
    """(x, y) pairs for the scan: lengths around the block size, signed zeros as extremes in
    either order, NaN/Inf at the same positions (one side or both) and at different ones."""
    rng = np.random.default_rng(29)
    block = kernel.BLOCK
    x = np.ones(2 * block)
    x[20], x[block + 4] = -0.0, 0.0  # the first zero is -0.0, at a later position in its block
    yield x, -x
    for n in (0, 1, 7, block - 1, block, block + 1, 3 * block + 5):
        for dtype in (np.float32, np.float64):
            x = rng.standard_normal(n).astype(dtype)
            y = (x * 1.001).astype(dtype)
            yield x, y
            if not n:
                continue
            z = np.abs(x)  # minimum a zero: -0.0 first, then +0.0 first
            z[rng.integers(0, n, 2)] = 0.0
            z[rng.integers(0, n)] = -0.0
            yield z, -z
            yield np.where(rng.random(n) < 0.5, 0.0, -0.0).astype(dtype), y
            for bad in (np.nan, np.inf, -np.inf):
                at = rng.integers(0, n, 2)
                x2, y2 = x.copy(), y.copy()
                x2[at], y2[at] = bad, bad
                yield x2, y2  # same positions: status 1, extremes of the zeroed values
                y3 = y.copy()
                y3[at] = bad
                yield x, y3  # bench only: status 2
                x4 = x2.copy()
                x4[-1] = np.inf if bad != np.inf else np.nan
                yield x4, y2  # kinds differ at one place


@pytest.mark.skipif(not kernel.HAVE_NUMBA, reason="numba is not installed: the compiled kernel cannot run")
def test_vectorised_scan_is_the_scalar_scan():
    """kernel.scan (branch-free per-position extremes, the element-by-element scan only for a
    pair with a NaN/Inf) returns scan_scalar's status and extremes bit for bit, the sign of
    a zero extreme included, with and without the NaN/Inf check (integer dtypes)."""
    k = kernel.compiled()
    count = 0
    for x, y in _scan_cases():
        for check in (True, False):
            got, want = k.scan(x, y, check), k.scan_scalar(x, y, check)
            assert got[0] == want[0]
            assert np.array(got[1:]).tobytes() == np.array(want[1:]).tobytes(), (x, y, check, got, want)
            count += 1
    assert count > 250  # the cases above all ran


@pytest.mark.skipif(not kernel.HAVE_NUMBA, reason="numba is not installed: the compiled kernel cannot run")
def test_lane_sums_fall_back_to_the_scalar_loop_when_the_intrinsic_cannot_be_built(monkeypatch):
    """The vector lane sums are an llvmlite intrinsic; where a numba/llvmlite release cannot
    build it, compiled() keeps the scalar loop (same bits), and where it builds, the probe
    finds it equal to the scalar sums."""
    import numba

    kernel.compiled()
    monkeypatch.setattr(kernel, "_lanes8x9", kernel._lanes8x9)  # restored after the test
    assert kernel._vector_lanes(numba) is True  # this numba builds it and it sums as the scalar loop
    rng = np.random.default_rng(3)
    work = rng.standard_normal((9, 40)) * 1e8
    vector = np.zeros((9, 8))
    numba.njit(kernel._lanes_probe)(work, 40, vector)  # an intrinsic runs only inside compiled code

    def broken():
        raise RuntimeError("llvmlite's IR builder changed")

    monkeypatch.setattr(kernel, "_lanes8x9_intrinsic", broken)
    assert kernel._vector_lanes(numba) is False
    assert isinstance(kernel._lanes8x9, numba.core.registry.CPUDispatcher)  # the scalar loop, compiled
    scalar = np.zeros((9, 8))
    numba.njit(kernel._lanes_probe)(work, 40, scalar)
    assert scalar.tobytes() == vector.tobytes()
    assert vector[0].sum() != 0.0  # the sums ran


ORACLE = Path(__file__).parent / "data" / "msprobe_oracle" / "statistics_L1"


def test_statistics_compare_imports_neither_numba_nor_pandas(tmp_path):
    """numba is imported on the first tensor pair (kernel.compiled()), pandas never by the
    compare command (dumpdb.__main__.NO_PANDAS_COMMANDS): a statistics compare, as a whole
    ``dumpdb`` process, loads neither and still compares every pair."""
    import dumpdb

    archive = tmp_path / "a.dumpdb"
    assert dumpdb.ingest(ORACLE / "bf16" / "dump", archive=archive, run="t").ok
    assert dumpdb.ingest(ORACLE / "fp32" / "dump", archive=archive, run="b").ok
    script = (
        "import runpy, sys, json\n"
        f"sys.argv = ['dumpdb', 'compare', 't', 'b', '-a', {str(archive)!r}, '--mode', 'statistics', '--show', '0']\n"
        "try:\n"
        "    runpy.run_module('dumpdb', run_name='__main__')\n"
        "except SystemExit as exc:\n"
        "    code = exc.code\n"
        "print(json.dumps([code, 'numba' in sys.modules, 'pandas' in sys.modules]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(Path(__file__).parents[1]), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    code, numba_loaded, pandas_loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert code in (0, None) and not numba_loaded and not pandas_loaded
    with dumpdb.open(archive) as a:
        assert a.sql("SELECT count(*) AS n FROM compare_results").to_pylist()[0]["n"] > 10


def _fresh_python(script: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> list:
    """Run ``script`` in a fresh interpreter with this checkout's dumpdb (in directory ``cwd``);
    its last line as JSON."""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=cwd,
                          env={"PYTHONPATH": str(Path(__file__).parents[1]), "PATH": "/usr/bin:/bin", **(env or {})})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


_PAIR = ("import json, sys, threading\n"
         "import numpy as np\n"
         "from dumpdb.compare import kernel, metrics\n"
         "rng = np.random.default_rng(5)\n"
         "x = rng.standard_normal(100_003).astype(np.float32)\n"
         "y = (x * (1 + 1e-3 * rng.standard_normal(x.size))).astype(np.float32)\n")


@pytest.mark.skipif(not kernel.HAVE_NUMBA, reason="numba is not installed: the compiled kernel cannot run")
def test_preload_loads_the_kernel_in_a_background_thread_and_a_failure_there_falls_back():
    """kernel.preload() loads numba and the kernel in a thread of its own (the compare engine
    starts it before aligning); compiled() then returns that kernel. A failure in that thread
    is dropped: the caller's compiled() loads the kernel itself. The metrics are the same bits
    as the numpy form's either way."""
    script = _PAIR + (
        "real = kernel.compiled\n"
        "def broken():\n"
        "    raise ImportError('numba cannot load')\n"
        "kernel.compiled = broken\n"
        "kernel.preload()\n"
        "kernel.wait_preload()\n"
        "failed = [kernel._compiled is None, kernel._preloader.name, kernel._preloader.is_alive()]\n"
        "kernel.compiled = real\n"
        "fallback = metrics.tensor_metrics(x, y)[0]\n"  # compiled() in this thread
        "kernel._preloader = None\n"
        "kernel.preload()\n"  # loaded: no thread
        "again = kernel._preloader is None\n"
        "print(json.dumps([failed, kernel._compiled is not None, again, fallback]))\n")
    failed, loaded, again, fallback = _fresh_python(script)
    assert failed == [True, "dumpdb-kernel-load", False]
    assert loaded and again
    script = _PAIR + (
        "kernel.preload()\n"
        "thread = kernel._preloader\n"
        "main = threading.get_ident()\n"
        "kernel.wait_preload()\n"
        "got = metrics.tensor_metrics(x, y)[0]\n"
        "print(json.dumps([thread.name, thread.ident != main, kernel._compiled is not None, got]))\n")
    name, other_thread, loaded, background = _fresh_python(script)
    assert name == "dumpdb-kernel-load" and other_thread and loaded
    script = _PAIR + (
        "kernel.preload()\n"
        "kernel.wait_preload()\n"
        "got = metrics.tensor_metrics(x, y)[0]\n"
        "print(json.dumps([kernel._preloader is None, 'numba' in sys.modules, got]))\n")
    no_thread, numba_loaded, numpy_form = _fresh_python(script, {"DUMPDB_METRICS_KERNEL": "numpy"})
    assert no_thread and not numba_loaded  # DUMPDB_METRICS_KERNEL=numpy: nothing loaded in the background
    for name in M.TENSOR_METRICS:  # the same bits from the kernel loaded either way and from numpy
        assert _same_float(background[name], numpy_form[name]) and _same_float(fallback[name], numpy_form[name]), name


def _same_float(a, b) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and (a == b or (a != a and b != b)))


# A kernel-like function in a module file of its own (numba caches only functions of a source
# file), wrapped as compiled() wraps the kernel's: a second process on the same empty cache
# must wait for the first one's compile and load its result. The first holds the compile lock
# until the test has seen the second one waiting for it (kernel.time.sleep, its poll), so the
# overlap does not depend on how fast either starts.
_ONE_COMPILER = '''
import pathlib, sys, time
import numba
from dumpdb.compare import kernel

def add_one(x):
    return x + 1

role, here = sys.argv[1], pathlib.Path(sys.argv[2])
if role == "first":
    take = kernel._take_compile_lock

    def take_then_hold(directory):
        got = take(directory)
        (here / "locked").write_text(str(got))
        while not (here / "go").exists():
            time.sleep(0.01)
        return got

    kernel._take_compile_lock = take_then_hold
else:
    sleep = time.sleep

    def noting_sleep(seconds):
        (here / "waiting").touch()
        sleep(seconds)

    kernel.time.sleep = noting_sleep
f = kernel._one_compiler(numba.njit(cache=True)(add_one))
print(f(41), sum(f.stats.cache_misses.values()), flush=True)
'''


def _wait_for(path: Path, proc: subprocess.Popen) -> None:
    for _ in range(6000):  # a bound, not a timing check: a process that never gets there fails the test
        if path.exists() or proc.poll() is not None:
            break
        time.sleep(0.02)
    assert path.exists(), f"{path.name} never appeared (process exited: {proc.poll()})"


def test_a_second_process_loads_what_the_first_compiles_instead_of_compiling_it(tmp_path):
    """On an empty numba cache, two processes that need the same signature: the first takes
    the compile lock and compiles (one cache miss); the second waits for the lock, then loads
    the first one's result from the cache (no miss: it compiled nothing)."""
    (tmp_path / "one_compiler.py").write_text(_ONE_COMPILER)
    env = {"PYTHONPATH": str(Path(__file__).parents[1]), "PATH": "/usr/bin:/bin",
           "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    script = [sys.executable, str(tmp_path / "one_compiler.py")]
    first = subprocess.Popen([*script, "first", str(tmp_path)], env=env, stdout=subprocess.PIPE, text=True)
    second = None
    try:
        _wait_for(tmp_path / "locked", first)
        assert (tmp_path / "locked").read_text() == "True"  # the first one holds the lock
        second = subprocess.Popen([*script, "second", str(tmp_path)], env=env, stdout=subprocess.PIPE, text=True)
        _wait_for(tmp_path / "waiting", second)
        (tmp_path / "go").touch()
        out_first, _ = first.communicate(timeout=240)
        out_second, _ = second.communicate(timeout=240)
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    assert (first.returncode, second.returncode) == (0, 0)
    assert out_first.split() == ["42", "1"]  # compiled
    assert out_second.split() == ["42", "0"]  # loaded from the cache the first one wrote


def test_the_compile_lock_is_waited_for_only_while_its_holder_lives_and_not_past_the_timeout(tmp_path, monkeypatch):
    """A live holder is waited for at most kernel.COMPILE_WAIT seconds, then the process
    compiles without the lock (and waits no more); a holder killed mid-compile releases the
    lock with its life (flock), so the next process takes it at once."""
    monkeypatch.setattr(kernel, "COMPILE_WAIT", 0.2)
    monkeypatch.setitem(kernel._lock_state, "gave_up", False)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time\n"
         "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\nfcntl.flock(fd, fcntl.LOCK_EX)\n"
         "print('held', flush=True)\ntime.sleep(600)", str(tmp_path / kernel.COMPILE_LOCK)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        assert kernel._take_compile_lock(str(tmp_path)) is False  # not taken: compile anyway
        assert kernel._lock_state["gave_up"] and kernel._lock_state["fd"] is None
        assert kernel._take_compile_lock(str(tmp_path)) is False  # gave up: no second wait
    finally:
        holder.kill()
        holder.wait()
    monkeypatch.setitem(kernel._lock_state, "gave_up", False)
    assert kernel._take_compile_lock(str(tmp_path)) is True  # the killed holder's lock is gone
    try:
        assert kernel._lock_state["fd"] is not None
    finally:
        kernel._release_compile_lock()
    assert kernel._lock_state["fd"] is None
    assert kernel._take_compile_lock(str(tmp_path / "missing")) is False  # no directory: no lock, no error


def test_tensor_compare_of_a_local_archive_never_imports_zarr(pair_archive):
    """A local archive's payloads are read as the store's files (ObjectStore.local), so a
    tensor compare, as a whole process, never imports zarr (~0.3 CPU s holding the GIL before
    the first pair, docs/compare-kernel.md "sixth round"); its metrics are the ones a
    process that has zarr loaded computes."""
    import dumpdb
    from dumpdb.compare.engine import compare

    script = (
        "import json, sys\n"
        "import dumpdb\n"
        "from dumpdb.compare.engine import compare\n"
        f"with dumpdb.open({str(pair_archive)!r}) as a:\n"
        "    out = compare(a, 'fp16', 'fp32', store_results=False)\n"
        "    rows = out.results.select(['cosine', 'max_abs_err']).to_pylist()\n"
        "print(json.dumps(['zarr' in sys.modules, rows]))\n")
    zarr_loaded, rows = _fresh_python(script, {"DUMPDB_METRICS_KERNEL": "numpy"})
    assert not zarr_loaded
    assert sum(r["cosine"] is not None for r in rows) > 10  # tensor metrics computed from payloads
    import zarr  # noqa: F401  # here zarr is loaded: the same numbers
    with dumpdb.open(pair_archive) as a:
        here = compare(a, "fp16", "fp32", store_results=False).results.select(["cosine", "max_abs_err"]).to_pylist()
    assert json.loads(json.dumps(here)) == rows


def _compare_command_script(pair_archive) -> str:
    """The start of a script for :func:`_fresh_python`: ``dumpdb compare fp16 fp32`` of
    ``pair_archive`` run as the ``dumpdb`` command runs it (``python -m dumpdb``, in that
    process), its exit code then in ``code``, and ``kernel`` imported."""
    return (
        "import importlib.util, json, runpy, sys\n"
        f"sys.argv = ['dumpdb', 'compare', 'fp16', 'fp32', '-a', {str(pair_archive)!r}, '--no-store', '--show', '0']\n"
        "try:\n"
        "    runpy.run_module('dumpdb', run_name='__main__')\n"
        "except SystemExit as exc:\n"
        "    code = exc.code\n"
        "from dumpdb.compare import kernel\n")


@pytest.mark.skipif(not kernel.HAVE_NUMBA, reason="numba is not installed: no BLAS probe to skip")
def test_compare_command_skips_numbas_blas_probe_and_nothing_else(pair_archive):
    """The ``dumpdb compare`` process loads the numba kernel without numba's import of
    ``scipy.linalg`` for its BLAS probe (dumpdb.__main__.skip_blas_probe, ~0.26 CPU s); the
    compare still computes its tensor metrics with the kernel, and ``scipy.linalg`` stays
    importable afterwards in that process (only the probe was refused)."""
    script = _compare_command_script(pair_archive) + (
        "state = [code, kernel._compiled is not None, 'scipy.linalg' in sys.modules, 'zarr' in sys.modules]\n"
        "try:\n"
        "    import scipy.linalg\n"
        "    later = hasattr(scipy.linalg, 'cython_blas') or bool(scipy.linalg.blas)\n"
        "except ModuleNotFoundError:  # scipy: no dependency of dumpdb (the optional parts bring it)\n"
        "    later = None\n"
        "print(json.dumps(state + [later]))\n")
    code, kernel_loaded, linalg_loaded, zarr_loaded, linalg_later = _fresh_python(script)
    assert code in (0, None) and kernel_loaded
    assert not linalg_loaded and not zarr_loaded
    # where scipy is installed, it still imports in that process: only numba's probe was refused
    assert linalg_later is (True if importlib.util.find_spec("scipy") is not None else None)


@pytest.mark.skipif(not kernel.HAVE_NUMBA, reason="numba is not installed: nothing of its to skip")
def test_compare_command_skips_numbas_coverage_and_yaml_imports_only_where_unused(pair_archive, tmp_path):
    """The ``dumpdb compare`` process loads the numba kernel without numba's imports of
    ``coverage`` and ``yaml`` (dumpdb.__main__.skip_numba_extras), which numba uses only for
    ``NUMBA_JIT_COVERAGE`` and ``.numba_config.yaml``; both stay importable afterwards. With a
    ``.numba_config.yaml`` in the current directory, or ``NUMBA_JIT_COVERAGE`` set, numba
    imports them as usual (its configuration is read, its coverage support is available).
    With stderr not a terminal (no progress bar drawn) ``rich.progress`` is not imported."""
    script = _compare_command_script(pair_archive) + (
        "import numba.core.config as config, numba.misc.coverage_support as cs\n"
        "state = [[code, 'rich.progress' in sys.modules], kernel._compiled is not None,\n"
        "         'yaml' in sys.modules, 'coverage' in sys.modules, config._HAVE_YAML, cs.coverage_available]\n"
        "later = [importlib.import_module(m).__name__ == m if importlib.util.find_spec(m) else None\n"
        "         for m in ('yaml', 'coverage')]\n"
        "print(json.dumps(state + later))\n")

    def run(cwd: Path, **extra: str) -> list:
        return _fresh_python(script, extra, cwd=cwd)

    have_yaml = importlib.util.find_spec("yaml") is not None
    have_coverage = importlib.util.find_spec("coverage") is not None
    plain = tmp_path / "plain"
    plain.mkdir()
    (code, progress_in), loaded, yaml_in, coverage_in, numba_yaml, numba_coverage, yaml_later, coverage_later = \
        run(plain)
    assert code in (0, None) and loaded and not progress_in
    assert not yaml_in and not coverage_in and not numba_yaml and not numba_coverage
    assert yaml_later is (True if have_yaml else None) and coverage_later is (True if have_coverage else None)

    configured = tmp_path / "configured"
    configured.mkdir()
    (configured / ".numba_config.yaml").write_text("# numba reads this file: yaml is imported\n")
    _, loaded, yaml_in, _, numba_yaml, _, _, _ = run(configured, NUMBA_JIT_COVERAGE="0")
    assert loaded and numba_yaml is have_yaml and yaml_in is have_yaml
    _, loaded, _, coverage_in, _, numba_coverage, _, _ = run(plain, NUMBA_JIT_COVERAGE="0")
    assert loaded and numba_coverage is have_coverage and coverage_in is have_coverage
