"""Shared fixtures: the real dump cases in tests/data and archives made from them."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest

import dumpdb

DATA = Path(__file__).parent / "data"
# A suite started in the background of a non-interactive shell (`pytest ... &`, a CI runner's
# job) inherits SIGINT as ignored, and so would every dumpdb process the tests start: the
# Ctrl-C tests (test_interrupts.py, test_cli_features.py, test_hostile_input.py) would then
# see no interrupt at all. Restore Python's own handler, as a terminal's foreground run has it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

MS_CASES = ["c1_inputs_kernels_iter", "f_long_names", "d2_compare_fp16_bf16_iter0", "a_tensor_all_eval",
            "e1_nan_inf_overflow"]


def ms_case(name: str) -> Path:
    return DATA / "mindspore" / name


def npy_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.npy"))


def npy_payload(path: Path) -> tuple[str, tuple, bytes]:
    """(descr, shape, payload bytes) of an .npy file, parsed independently of dumpdb."""
    raw = path.read_bytes()
    assert raw[:6] == b"\x93NUMPY"
    if raw[6] == 1:
        hlen, start = int.from_bytes(raw[8:10], "little"), 10
    else:
        hlen, start = int.from_bytes(raw[8:12], "little"), 12
    header = eval(raw[start : start + hlen].decode("latin1"))  # noqa: S307 - test data we ship
    return header["descr"], tuple(header["shape"]), raw[start + hlen :]


@pytest.fixture(scope="session")
def ingested(tmp_path_factory) -> Path:
    """One archive holding every tests/data MindSpore case, one run per case (read-only use)."""
    archive = tmp_path_factory.mktemp("shared") / "all.dumpdb"
    for case in MS_CASES:
        report = dumpdb.ingest(ms_case(case), archive=archive, run=case)
        assert report.ok, report.errors
    return archive


@pytest.fixture
def case_copy(tmp_path):
    """Copy a tests/data case into tmp (so a test may damage it); returns the copy's path."""

    def _copy(name: str) -> Path:
        dst = tmp_path / name
        shutil.copytree(ms_case(name), dst)
        return dst

    return _copy


def ingest_with_address_space(src: Path, archive: Path, megabytes: int, *extra: str):
    """``dumpdb ingest SRC --archive ARCHIVE --run r -q EXTRA...`` in a subprocess whose address
    space is limited to ``megabytes`` (RLIMIT_AS): a memory bound a test can check without
    timing (issue 30 item 12). Returns the ``subprocess.CompletedProcess`` (text output)."""
    import resource
    import subprocess
    import sys

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (megabytes << 20, megabytes << 20))

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.run([sys.executable, "-m", "dumpdb", "ingest", str(src), "--archive", str(archive),
                           "--run", "r", "-q", *extra], env=env, preexec_fn=limit, capture_output=True, text=True,
                          timeout=300)


def file_count(path: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(path))


def assert_bit_exact(array: np.ndarray, payload: bytes) -> None:
    assert np.ascontiguousarray(array).tobytes() == payload


def assert_run_reads_back_its_dump(archive, case: Path, run: str) -> None:
    """Every tensor of ``run`` in ``archive`` (a dumpdb.Archive) has the shape and the bytes of
    its ``.npy`` file in the dump ``case``, and every file of the dump is there once."""
    files = {p.name: p for p in npy_files(case)}
    rows = archive.sql("SELECT tensor_id, source_file FROM tensors WHERE run = $run", {"run": run}).to_pylist()
    assert len(rows) == len(files)
    for row in rows:
        _descr, shape, raw = npy_payload(files[row["source_file"].rsplit("/", 1)[-1]])
        got = archive.tensor(row["tensor_id"])
        assert got.shape == shape and got.tobytes() == raw


# -- object storage: moto's S3 server on 127.0.0.1, started once, each test its own bucket --
@pytest.fixture(scope="session")
def moto_s3():
    """moto's ThreadedMotoServer on a free 127.0.0.1 port for the session (stopped at its end)."""
    import logging

    from storage_servers import moto_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    with moto_server() as server:
        yield server


@pytest.fixture
def s3_url(moto_s3, monkeypatch) -> str:
    """``s3://<fresh bucket>/archive`` on the moto server, with the AWS_* environment set to it."""
    for key, value in moto_s3.env().items():
        monkeypatch.setenv(key, value)
    return f"s3://{moto_s3.bucket()}/archive"


def record_pools(monkeypatch, module, name: str) -> list:
    """Replace ``module.<name>`` (an executor class, e.g. the compare engine's
    ``ThreadPoolExecutor``) by a subclass recording each pool's ``max_workers``; returns
    that list, which grows as pools start."""
    started: list = []
    base = getattr(module, name)

    class Recording(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args, **kwargs):
            started.append(kwargs.get("max_workers"))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(module, name, Recording)
    return started


def write_payloads(writer, payloads) -> tuple[dict, list]:
    """Add every (content hash, array) of ``payloads`` to the StoreWriter ``writer``, flush
    and close it: (content hash -> BlobLocation, the arrays written)."""
    locations = {}
    try:
        for content_hash, array in payloads:
            for loc in writer.add(content_hash, array):
                locations[loc.content_hash] = loc
        for loc in writer.flush():
            locations[loc.content_hash] = loc
        return locations, writer.take_arrays()
    finally:
        writer.close()


def assert_payloads_read_back(reader, locations: dict, hashes, arrays) -> None:
    """Each array reads back bit-exact from ``reader`` (a TensorStore) at its location
    (``locations[hash]``): through ``read`` (hash verified; a new writable array, never a view
    of a cache) and through ``read_payload``."""
    for h, a in zip(hashes, arrays):
        loc = locations[h]
        got = reader.read(loc.array_path, loc.elem_offset, loc.elem_count, a.dtype, a.shape, content_hash=h,
                          verify=True)
        assert got.dtype == a.dtype and got.shape == a.shape and got.tobytes() == a.tobytes()
        got[...] = got  # writable, not a view of a cache
        assert reader.read_payload(loc.array_path, loc.elem_offset, loc.elem_count).tobytes() == a.tobytes()


def ingest_runs(archive: Path, **cases: str) -> Path:
    """``archive`` with each real corpus case (:func:`ms_case` name) ingested as the run named
    by its keyword, every ingest asserted complete: the once-per-module archives that
    :func:`private_copy` hands out to the tests that change them."""
    for run, case in cases.items():
        assert dumpdb.ingest(ms_case(case), archive=archive, run=run).ok
    return archive


def private_copy(archive: Path, tmp_path: Path) -> Path:
    """A copy of ``archive`` (same directory name) under ``tmp_path`` for one test to change:
    ~0.01 s, where an ingest costs ~0.4 CPU s and its fsyncs."""
    copy = tmp_path / archive.name
    shutil.copytree(archive, copy)
    return copy


@pytest.fixture(scope="session")
def _pair_archive_once(tmp_path_factory):
    """The real fp32 and fp16/bf16 compare cases ingested once per session as runs ``fp32``
    and ``fp16`` (never written: :func:`pair_archive` hands out copies)."""
    return ingest_runs(tmp_path_factory.mktemp("pair-once") / "a.dumpdb",
                       fp32="d1_compare_fp32_iter0", fp16="d2_compare_fp16_bf16_iter0")


@pytest.fixture(scope="module")
def pair_archive(tmp_path_factory, _pair_archive_once):
    """An archive per test module with the real fp32 and fp16/bf16 compare cases as runs
    ``fp32`` and ``fp16`` (a module's compares store results in it): a copy of the
    session's ingest, so each module starts from the same freshly ingested archive."""
    return private_copy(_pair_archive_once, tmp_path_factory.mktemp("pair"))
