"""Quick first pass of scripts/mutation.sh: a module's own unit tests against each mutant.

mutmut runs, per mutant, every test that executes the mutated function: for the store or
the ingest commit that includes the crash-safety kill schedules (minutes per surviving
mutant on a shared 2-core machine). Most mutants fail a module's own unit tests within
seconds, so this pass runs those first (``pytest -x``, one process per mutant, in
``mutants/`` as mutmut does, the mutant chosen by ``MUTANT_UNDER_TEST``) and records
each mutant they kill in mutmut's own result file (exit code 1: "killed"; 124 from the
time limit: "timeout"; a test process killed by a signal: "segfault", as mutmut records
it). Each test process gets at most ``MUTATION_MEMORY_GB`` (8) GiB of address space. It
prints the names of the mutants they do not kill, one per line, for ``mutmut run`` to
judge with every covering test. A kill here is a kill by a test of the core; a survivor
here is not yet a survivor.

Before the mutants, the same tests must pass unmutated and fail with mutmut's forced
failure (``MUTANT_UNDER_TEST=fail``): otherwise every mutant would look killed.

Usage (from the repository root, after mutmut generated ``mutants/``)::

    python scripts/mutation_prefilter.py --tests tests/test_store.py [--tests ...] NAME...
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from mutmut.mutation.data import SourceFileMutationData

TIME_LIMIT = 600  # seconds per mutant (wall clock): an endless loop counts as a timeout
# Address space of each test process (GiB, env MUTATION_MEMORY_GB): a mutant that allocates
# without bound (e.g. a loop step lost: millions of overlapping chunk copies) fails its test
# with MemoryError instead of waking the kernel's OOM killer on a shared machine.
MEMORY_GB = float(os.environ.get("MUTATION_MEMORY_GB", "8"))


def _limit_memory() -> None:
    limit = int(MEMORY_GB * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _source_path(name: str) -> Path:
    """dumpdb.storage.store.xǁStoreWriterǁadd__mutmut_3 -> dumpdb/storage/store.py."""
    module = name.split(".x_")[0].split(".xǁ")[0]
    return Path(*module.split(".")).with_suffix(".py")


def _pytest(tests: list[str], mutant: str, extra: list[str]) -> int:
    env = {**os.environ, "MUTANT_UNDER_TEST": mutant, "PY_IGNORE_IMPORTMISMATCH": "1"}
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
           "--rootdir=.", "--tb=no", "--no-header", *extra, *tests]
    try:
        return subprocess.run(cmd, cwd="mutants", env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=TIME_LIMIT, preexec_fn=_limit_memory).returncode
    except subprocess.TimeoutExpired:
        return 124


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests", action="append", required=True, help="a test file or directory (repeatable)")
    parser.add_argument("--pytest-arg", action="append", default=[], help="an extra pytest argument (repeatable)")
    parser.add_argument("--record-survivors", action="store_true",
                        help="record the mutants these tests do not kill as survived (a lower bound: "
                             "mutmut's full run may still kill them)")
    parser.add_argument("names", nargs="+", help="mutant names")
    args = parser.parse_args()
    if not Path("mutants").is_dir():
        print("mutation_prefilter: no mutants/ here: run from the repository root after generation",
              file=sys.stderr)
        return 2
    clean = _pytest(args.tests, "", args.pytest_arg)
    if clean != 0:
        print(f"mutation_prefilter: the quick tests fail unmutated (pytest exit {clean})", file=sys.stderr)
        return 2
    if _pytest(args.tests, "fail", args.pytest_arg) == 0:
        print("mutation_prefilter: the quick tests pass under mutmut's forced failure: "
              "they do not reach the mutated code", file=sys.stderr)
        return 2
    data: dict[Path, SourceFileMutationData] = {}
    killed = 0
    for i, name in enumerate(args.names, 1):
        path = _source_path(name)
        if path not in data:
            data[path] = SourceFileMutationData(path=path)
            data[path].load()
        m = data[path]
        if name not in m.exit_code_by_key:
            print(f"mutation_prefilter: {name} is not a mutant of {path}", file=sys.stderr)
            return 2
        start = time.monotonic()
        code = _pytest(args.tests, name, args.pytest_arg)
        if code in (1, 3, 124) or code < 0:
            # 1: a test failed; 3: pytest's internal error; 124: the time limit (mutmut's
            # "timeout", 36); < 0: killed by a signal (mutmut's -9, "segfault": killed)
            m.exit_code_by_key[name] = {1: 1, 3: 3, 124: 36}.get(code, -9)
            m.durations_by_key[name] = time.monotonic() - start
            m.save()
            killed += 1
        else:
            if args.record_survivors:
                m.exit_code_by_key[name] = 0
                m.durations_by_key[name] = time.monotonic() - start
                m.save()
            print(name)
        print(f"prefilter {i}/{len(args.names)}: {killed} killed", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
