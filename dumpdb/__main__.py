"""``python -m dumpdb`` and the ``dumpdb`` console script.

The SIGINT handling (:mod:`dumpdb.sigint`, stdlib only) is installed before the CLI
module is imported, so a Ctrl-C at any moment - while modules load included - ends
as one line, "interrupted", with exit code 130.
"""

import os
import sys
from types import FrameType

from dumpdb import sigint
from dumpdb.runtime import quiet_exit, use_memory_pool

# Commands that build Arrow tables from Python lists and numpy arrays and never use pandas.
NO_PANDAS_COMMANDS = ("ingest", "ingest-worker", "commit", "compare")
# Commands whose process, and the worker processes it starts, take dumpdb's Arrow memory pool
# (dumpdb.runtime.use_memory_pool): the commands that build and read large Arrow tables; the others
# import pyarrow only when they need it.
MEMORY_POOL_COMMANDS = (*NO_PANDAS_COMMANDS, "first-divergence", "ranks", "scan")
# Commands whose numba kernel (dumpdb.compare.kernel) may load: numba's BLAS probe is skipped.
NO_BLAS_PROBE_COMMANDS = ("compare",)


def skip_pandas_probe() -> None:
    """Spare this process pyarrow's import of pandas (~0.3 s of CPU, ~6 % of a 2 GB ingest).

    ``pyarrow.array`` of a Python list first asks whether it is a pandas object, and the
    first time it asks it imports pandas when installed. Here it asks once while ``import
    pandas`` fails, so it remembers "no pandas" for that question only; pandas is importable
    again afterwards (``Table.to_pandas`` imports it as usual). Only for the ingest
    commands and ``compare`` (the statistics compare's first ``pyarrow.array`` imported
    pandas: about 0.4 s of CPU), in the ``dumpdb`` process itself (never in
    a library call).
    """
    if "pandas" in sys.modules:
        return
    sys.meta_path.insert(0, _NoPandas)  # "import pandas" raises ImportError meanwhile
    try:
        import pyarrow

        pyarrow.array([0])
    finally:
        sys.meta_path.remove(_NoPandas)


class _NoPandas:
    """A meta path finder refusing ``pandas`` (see :func:`skip_pandas_probe`)."""

    @staticmethod
    def find_spec(name: str, path: object = None, target: object = None) -> None:
        if name == "pandas" or name.startswith("pandas."):
            raise ImportError(f"{name}: not imported by dumpdb's ingest commands")


def skip_blas_probe() -> None:
    """Spare this process numba's import of ``scipy.linalg`` (~0.26 CPU s holding the GIL
    while the compare kernel loads, on the critical path of a tensor compare; ~0.11 s of it
    scipy's copy of numpy's namespace, which imports ``numpy.f2py``).

    ``numba.np.arraymath`` probes once, on import, whether ``scipy.linalg.cython_blas`` can
    be imported (``_check_blas``) and uses the answer for one choice alone: whether
    ``np.correlate`` and ``np.convolve`` in jitted code call BLAS or numba's own loop.
    dumpdb's kernel calls neither (nor any BLAS function), so here that probe, and only it
    (its caller is on the importing thread's stack), is answered "no scipy.linalg"; every
    other import of scipy, in any thread, is untouched, and numba's BLAS functions
    (``np.dot``...) still import it when they are compiled. Only in the ``dumpdb`` process
    itself, for the commands that may load the kernel (never in a library call, where the
    caller's own jitted code may want BLAS in ``np.correlate``)."""
    if "numba" not in sys.modules:
        sys.meta_path.insert(0, _NoBlasProbe)


class _NoBlasProbe:
    """A meta path finder refusing ``scipy.linalg`` to numba's BLAS probe alone (see
    :func:`skip_blas_probe`)."""

    @staticmethod
    def find_spec(name: str, path: object = None, target: object = None) -> None:
        if name != "scipy.linalg" and not name.startswith("scipy.linalg."):
            return None
        import inspect

        frame = inspect.currentframe()
        while frame is not None:
            if frame.f_code.co_name == "_check_blas" and frame.f_globals.get("__name__") == "numba.np.arraymath":
                raise ImportError(f"{name}: not imported for numba's BLAS probe by dumpdb's compare")
            frame = frame.f_back
        return None


def skip_numba_extras() -> None:
    """Spare this process two imports numba makes and never uses while ``NUMBA_JIT_COVERAGE``
    is off (~0.05 CPU s of the kernel's load, holding the GIL while the workers wait for it):

    * ``coverage`` (where installed), imported by ``numba.misc.coverage_support`` only to report
      jitted lines to a running coverage measurement, which numba does only when
      ``NUMBA_JIT_COVERAGE`` is set (numba.core.config; off by default);
    * ``yaml`` (where installed), imported by ``numba.core.config`` only to read
      ``.numba_config.yaml`` in the current directory.

    Nothing is refused when numba is loaded already, when ``NUMBA_JIT_COVERAGE`` is set (the
    coverage import), or when ``.numba_config.yaml`` exists (it may set ``jit_coverage``): then
    numba imports as usual. A running coverage measurement has ``coverage`` loaded already,
    which no finder is asked for again. Only numba's own module-level import is refused (the
    importing module is checked); any other import of ``coverage`` or ``yaml`` is untouched.
    Only in the ``dumpdb`` process itself, for the commands that may load the kernel."""
    if "numba" in sys.modules or os.path.isfile(".numba_config.yaml"):
        return
    refused = {"yaml": "numba.core.config"}
    if "NUMBA_JIT_COVERAGE" not in os.environ:
        refused["coverage"] = "numba.misc.coverage_support"
    sys.meta_path.insert(0, _NoNumbaExtras(refused))


class _NoNumbaExtras:
    """A meta path finder refusing top-level modules to one importing module each (see
    :func:`skip_numba_extras`)."""

    def __init__(self, refused: dict[str, str]) -> None:
        self.refused = refused  # module -> the one module whose import of it is refused

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        importer = self.refused.get(name)
        if importer is None:
            return None
        import inspect

        here = inspect.currentframe()
        frame: FrameType | None = here.f_back if here is not None else None  # the caller of find_spec
        while frame is not None and frame.f_code.co_filename.startswith("<frozen importlib"):
            frame = frame.f_back  # the import machinery's frames: up to the importing code
        if frame is not None and frame.f_globals.get("__name__") == importer:
            raise ImportError(f"{name}: not imported for numba by dumpdb's compare (unused by numba here)")
        return None


# The root options (dumpdb.cli._root) that take a value, given before the command as
# "--wait 5" (or "--wait=5"): command() skips the value too.
ROOT_OPTIONS_WITH_VALUE = ("--wait", "--storage-option")


def command(argv: list[str]) -> str | None:
    """The command an argument list (``sys.argv[1:]``) names: its first word that is neither
    a root option nor the value of one (``dumpdb --wait 5 compare ...``: ``compare``); None
    when there is none (``dumpdb --version``)."""
    words = iter(argv)
    for word in words:
        if word in ROOT_OPTIONS_WITH_VALUE:
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def main() -> None:
    """Entry point of the ``dumpdb`` command (see :mod:`dumpdb.cli`; Ctrl-C at any moment exits 130)."""
    sigint.install()
    quiet_exit()
    try:
        name = command(sys.argv[1:])
        if name in MEMORY_POOL_COMMANDS:
            use_memory_pool()  # before the first Arrow buffer (skip_pandas_probe makes one)
        if name in NO_PANDAS_COMMANDS:
            skip_pandas_probe()
        if name in NO_BLAS_PROBE_COMMANDS:
            skip_blas_probe()
            skip_numba_extras()
        from dumpdb.cli import main as cli_main
    except KeyboardInterrupt:  # SIGINT handling not installable (not the main thread)
        sigint.exit_interrupted()
    cli_main()


if __name__ == "__main__":
    main()
