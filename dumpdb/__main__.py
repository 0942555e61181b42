"""``python -m dumpdb`` and the ``dumpdb`` console script.

The SIGINT handling (:mod:`dumpdb.sigint`, stdlib only) is installed before the CLI
module is imported, so a Ctrl-C at any moment - while modules load included - ends
as one line, "interrupted", with exit code 130.
"""

from dumpdb import sigint


def main() -> None:
    """Entry point of the ``dumpdb`` command (see :mod:`dumpdb.cli`; Ctrl-C at any moment exits 130)."""
    sigint.install()
    try:
        from dumpdb.cli import main as cli_main
    except KeyboardInterrupt:  # SIGINT handling not installable (not the main thread)
        sigint.exit_interrupted()
    cli_main()


if __name__ == "__main__":
    main()
