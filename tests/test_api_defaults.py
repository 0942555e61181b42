"""An API that does not lie: ``a.tensor(...)`` needs ``run=`` only when the archive holds more
than one run; query results become pandas / polars frames (``dumpdb[frames]``), with a clear
message when the library is missing."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from conftest import ingest_runs, ms_case, npy_payload, private_copy

import dumpdb


@pytest.fixture(scope="module")
def _one_run_once(tmp_path_factory):
    return ingest_runs(tmp_path_factory.mktemp("one-run") / "a.dumpdb", f="f_long_names")


@pytest.fixture
def one_run(_one_run_once, tmp_path):
    """A private copy (a test ingests a second run into it) of one f ingest per module."""
    return private_copy(_one_run_once, tmp_path)


def test_tensor_by_key_without_run_when_the_archive_holds_one_run(one_run):
    a = dumpdb.open(one_run)
    row = a.sql("SELECT op_name, iteration, io, slot, source_file FROM tensors ORDER BY tensor_id LIMIT 1").to_pylist()[0]
    key = dict(op_name=row["op_name"], iteration=row["iteration"], io=row["io"], slot=row["slot"])
    x = a.tensor(**key)
    _, shape, payload = npy_payload(ms_case("f_long_names") / row["source_file"])
    assert x.shape == shape and np.ascontiguousarray(x).tobytes() == payload
    assert np.array_equal(a.tensor(run="f", **key), x, equal_nan=True)
    assert a.only_run() == "f"

    assert dumpdb.ingest(ms_case("c1_inputs_kernels_iter"), archive=one_run, run="c1").ok
    with pytest.raises(dumpdb.DumpdbError, match=r"holds several runs \('c1', 'f'\): say which with run="):
        a.tensor(**key)
    assert np.array_equal(a.tensor(run="f", **key), x, equal_nan=True)  # naming it still works


def test_tensor_without_op_name_says_what_it_needs(one_run):
    with pytest.raises(TypeError, match="needs a tensor_id, or op_name="):
        dumpdb.open(one_run).tensor(iteration=0)


def test_query_results_as_pandas_and_polars_frames(one_run):
    import pandas as pd  # both in the test extra (dumpdb[frames])
    import polars as pl

    a = dumpdb.open(one_run)
    query = "SELECT tensor_id, op_name, nbytes FROM tensors ORDER BY tensor_id"
    table = a.sql(query)
    df = a.frame(query)
    assert isinstance(df, pd.DataFrame) and df["tensor_id"].tolist() == table["tensor_id"].to_pylist()
    assert table.to_pandas().equals(df)  # what the README shows works as well
    frame = a.frame(query, library="polars")
    assert isinstance(frame, pl.DataFrame) and frame["op_name"].to_list() == table["op_name"].to_pylist()
    assert pl.from_arrow(table).equals(frame)


def test_frame_without_the_library_says_how_to_get_it(one_run, monkeypatch):
    a = dumpdb.open(one_run)
    for library in ("pandas", "polars"):
        monkeypatch.setitem(sys.modules, library, None)  # import of it fails, as when not installed
        with pytest.raises(dumpdb.DumpdbError,
                           match=rf"frame\(library='{library}'\) needs {library}, which is not installed: "
                                 r"pip install 'dumpdb\[frames\]'"):
            a.frame("SELECT 1", library=library)
    with pytest.raises(dumpdb.DumpdbError, match="use 'pandas' or 'polars'"):
        a.frame("SELECT 1", library="spark")
