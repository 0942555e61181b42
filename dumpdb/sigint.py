"""Ctrl-C in the ``dumpdb`` command: one line, "interrupted", and exit code 130, at any moment.

Stdlib only: :mod:`dumpdb.__main__` installs :func:`install` before it imports anything
heavy, so a Ctrl-C while modules load (typer, rich, DuckDB, numpy: the first ~0.2 s)
also ends as one line, never a ``KeyboardInterrupt`` traceback.

Two modes. Outside a command (start-up, argument parsing, after the command) the
handler writes the line and ends the process at once (``SystemExit(130)``, which no
``except Exception`` stops): there is nothing to clean up. Inside a command (:func:`graceful`, entered by the CLI around
every command) it raises :exc:`KeyboardInterrupt` as Python does, so ``finally``
blocks run (an export removes its partial bundle, an ingest commits what is complete)
and the CLI prints the line. The line is printed once, whoever prints it.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager

EXIT_INTERRUPTED = 130
MESSAGE = "interrupted"
_state = {"graceful": 0, "said": False, "signalled": False}


def reset() -> None:
    """Forget that the line was printed and that SIGINT came (a new command in the same
    process: tests, embedding)."""
    _state["said"] = False
    _state["signalled"] = False


def signalled() -> bool:
    """True if SIGINT came since :func:`reset`: an error raised then is the interruption
    (DuckDB answers a Ctrl-C during a query with its own ``Query interrupted`` error)."""
    return bool(_state["signalled"])


def say_interrupted() -> bool:
    """Record that the one line is being printed; False if it was printed already."""
    if _state["said"]:
        return False
    _state["said"] = True
    return True


def _handler(signum, frame) -> None:
    _state["signalled"] = True
    if _state["graceful"]:
        raise KeyboardInterrupt
    if say_interrupted():
        try:
            os.write(2, (MESSAGE + "\n").encode())
        except OSError:
            pass
    raise SystemExit(EXIT_INTERRUPTED)  # unwinds imports or parsing; nothing catches it


def install() -> None:
    """Make SIGINT end the process with the one line and exit 130 (see the module doc).
    Only in the main thread of a process whose SIGINT is not ignored (``nohup``, ``&``)."""
    try:
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
            return
        signal.signal(signal.SIGINT, _handler)
    except ValueError:  # not the main thread
        return


@contextmanager
def graceful() -> Iterator[None]:
    """Inside the block a Ctrl-C raises KeyboardInterrupt (cleanup runs); outside it the
    process ends at once. Nests; a no-op in effect if :func:`install` was not called."""
    _state["graceful"] += 1
    try:
        yield
    finally:
        _state["graceful"] -= 1


def exit_interrupted() -> None:
    """Print the line (once) and exit 130: for a KeyboardInterrupt caught outside a command."""
    if say_interrupted():
        sys.stderr.write(MESSAGE + "\n")
        sys.stderr.flush()
    raise SystemExit(EXIT_INTERRUPTED)
