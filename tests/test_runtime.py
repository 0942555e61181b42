"""dumpdb.runtime: memory a long command has freed goes back to the operating system."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dumpdb.dumpio import libc


def _has_malloc_trim() -> bool:
    return hasattr(libc(), "malloc_trim")


@pytest.mark.skipif(not sys.platform.startswith("linux") or not _has_malloc_trim(),
                    reason="malloc_trim is glibc's; elsewhere release_free_memory only releases Arrow's pool")
def test_freed_heap_memory_goes_back_to_the_system():
    # a fresh interpreter: its heap holds only what this script frees. 2,000 arrays of 96 KiB
    # (below glibc's mmap threshold: they come from the heap), all freed but the last, which
    # keeps the heap's top in use so that free() alone cannot shrink it
    script = (
        "import os, numpy as np\n"
        "from dumpdb.runtime import release_free_memory\n"
        "def rss():\n"
        "    with open('/proc/self/statm') as f: return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')\n"
        "held = [np.ones(96 << 7) for _ in range(2000)]\n"
        "last = held[-1]; del held\n"
        "before = rss(); release_free_memory(); after = rss()\n"
        "print(before - after)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) > 100 << 20  # of ~190 MB freed

