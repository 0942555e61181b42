"""``python -m dumpdb`` and the ``dumpdb`` console script.

The CLI module is imported inside :func:`main` so that a Ctrl-C while modules
load also ends as one line, "interrupted", with exit code 130.
"""

import sys


def main() -> None:
    """Entry point of the ``dumpdb`` command (see :mod:`dumpdb.cli`; Ctrl-C during imports exits 130)."""
    try:
        from dumpdb.cli import main as cli_main
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        raise SystemExit(130) from None
    cli_main()


if __name__ == "__main__":
    main()
