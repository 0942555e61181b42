"""Issue 29 item 4: the worker-process read path (``workers.load_batch``, the default on 4 or
more cores and with ``-j``) reads large files as the reader threads do: into a reused
``dumpio.ReadBuffer``, around the page cache (``O_DIRECT``) when it does not hold them.

Checked on a real MindSpore dump: every file through the buffer and read direct, the
payloads, hashes and rows a worker sends back equal those of a buffered read (each array its
file's bytes although the buffer was read into again after it), with and without the
workers writing the payloads (``keep_arrays``: references for payloads of ``MEDIUM_BYTES``
or more, the others a copy). That a whole ingest on worker processes stores what the
in-process ingest stores is test_ingest_speed's.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from conftest import ms_case

from dumpdb import dumpio
from dumpdb.ingestion import workers
from dumpdb.layouts import locate

DUMP = "d2_compare_fp16_bf16_iter0"


def _task(keep_arrays: bool) -> workers.LoadTask:
    found = locate(ms_case(DUMP), None)
    scan = found.layout.scan(found.path)
    entries = [e for e in scan.entries if e.path is not None]
    return workers.LoadTask(found.layout.name, str(ms_case(DUMP)), False, entries,
                            [os.stat(e.path).st_size for e in entries], keep_arrays=keep_arrays)


def _sent_back(items: list[workers.Loaded]) -> list[tuple]:
    """What a worker returns, comparable: hash, statistics, and the payload (bytes or reference)."""
    out = []
    for it in items:
        payload = it.array.tobytes() if it.array is not None else (it.ref.content_hash, it.ref.dtype.str, it.ref.shape)
        out.append((it.entry.key, it.content_hash, it.stats, it.error, payload))
    return out


@pytest.mark.parametrize("keep_arrays", [True, False])
def test_a_worker_reads_large_files_around_the_page_cache_and_sends_the_same(monkeypatch, keep_arrays):
    monkeypatch.setattr(dumpio, "_NO_DIRECT", set())
    monkeypatch.setattr(workers, "READ_BUFFER_MIN_BYTES", 0)  # every file through the buffer
    monkeypatch.setattr(workers, "MEDIUM_BYTES", 64)  # references for all but the smallest payloads
    monkeypatch.setattr(workers, "_LOCAL", type(workers._LOCAL)())
    monkeypatch.setattr(dumpio, "DIRECT_MIN_BYTES", 0)
    monkeypatch.setattr(dumpio, "DIRECT_READS", "always")
    reads = []
    read_dump_into = dumpio.read_dump_into

    def spy(path, where, buffer, confined=True):
        view = read_dump_into(path, where, buffer, confined)
        reads.append(buffer.direct)
        return view

    monkeypatch.setattr("dumpdb.npy.read_dump_into", spy)
    direct = workers.load_batch(_task(keep_arrays))
    if os.stat(ms_case(DUMP)).st_dev in dumpio._NO_DIRECT:
        pytest.skip("the corpus's file system has no O_DIRECT: test_dumpio_direct covers the fallback")
    assert len(reads) == len(direct) > 1 and all(reads)
    monkeypatch.setattr(dumpio, "DIRECT_READS", "never")
    monkeypatch.setattr(workers, "READ_BUFFER_MIN_BYTES", 1 << 40)  # new memory per file, as before
    buffered = workers.load_batch(_task(keep_arrays))
    assert len(reads) == len(direct)  # the second batch did not use the buffer
    assert _sent_back(direct) == _sent_back(buffered)
    assert not any(it.error for it in direct)
    refs = [it for it in direct if it.ref is not None]
    if keep_arrays:
        assert not refs
    else:  # the large payloads by reference, the small ones whole (copied out of the buffer)
        assert refs and all(it.ref.nbytes >= 64 for it in refs)
        assert all(it.array is not None and it.array.nbytes < 64 for it in direct if it.ref is None)
    for it in direct:
        if it.array is not None:  # a copy: the buffer was read into again after it
            assert isinstance(it.array, np.ndarray) and it.array.flags.owndata

