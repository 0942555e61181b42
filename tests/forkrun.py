"""A fork server for tests/crashkit.py runs: ``python tests/crashkit.py -m dumpdb ARGS`` as a
process forked from a parent that has imported dumpdb and its libraries already.

A crash test starts dozens of ``dumpdb`` processes to SIGKILL each at an I/O event; each spent
~1.4 s of CPU importing DuckDB, Arrow, zarr and dumpdb before its first event (imports are no
kill point: crashkit counts nothing before the command runs). Forked from this server, each
child starts with those modules loaded and is otherwise the same process: its own pid, the
test's environment, working directory and files as stdin/stdout/stderr, crashkit's counter and
kill (``os.kill(own pid, SIGKILL)``) at the same event, the interpreter's normal exit (atexit,
thread joins) when it is not killed. The server waits for the child and reports its exit
status as ``subprocess`` gives it (``-9`` for SIGKILL).

The server imports modules only (it opens no archive and starts no thread), so a fork is
safe. A command whose environment changes what dumpdb reads at import time (``DUMPDB_*``
variables other than the server's) is run as a plain subprocess instead: see
:func:`crashkit_process`.

Protocol (server's stdin/stdout, one JSON object a line): request ``{"argv", "env", "cwd",
"stdin", "stdout", "stderr"}`` (the three streams are file paths), answers ``{"pid": N}`` at
the fork and ``{"returncode": N}`` at the child's end.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

TESTS = Path(__file__).resolve().parent
CRASHKIT = TESTS / "crashkit.py"
# What a `dumpdb` command of the crash tests imports before its first event.
# Not dumpdb.__main__: runpy runs it as __main__ in the child, as in a real process.
PRELOAD = ("dumpdb", "dumpdb.cli", "dumpdb.ingestion.pipeline", "dumpdb.ingestion.workers",
           "dumpdb.storage.store", "dumpdb.catalog.connection", "dumpdb.archival.maintenance", "dumpdb.archival.bundle",
           "dumpdb.archive", "duckdb", "numpy", "pyarrow", "pyarrow.parquet", "zarr", "crashkit")


def _serve() -> None:
    import importlib

    sys.path.insert(0, str(TESTS))
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:  # a module moved by a refactoring: the child imports what it needs
            pass
    rfd, wfd = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    reader = os.fdopen(rfd, "rb", buffering=0)

    def send(obj: dict) -> None:
        os.write(wfd, (json.dumps(obj) + "\n").encode())

    buf = b""
    while True:
        while b"\n" not in buf:
            chunk = reader.read(65536)
            if not chunk:
                return
            buf += chunk
        line, buf = buf.split(b"\n", 1)
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:  # the child: becomes `python crashkit.py -m dumpdb ARGS`
            reader.close()  # its descriptor, closed once (not again when the object goes)
            os.close(wfd)
            os.close(devnull)
            for fd, path, flags in ((0, req["stdin"], os.O_RDONLY), (1, req["stdout"], os.O_WRONLY),
                                    (2, req["stderr"], os.O_WRONLY)):
                f = os.open(path, flags)
                os.dup2(f, fd)
                os.close(f)
            os.chdir(req["cwd"])
            os.environ.clear()
            os.environ.update(req["env"])
            sys.path[:0] = [p for p in req["env"].get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
            signal.signal(signal.SIGINT, signal.default_int_handler)
            sys.argv = [str(CRASHKIT), *req["argv"]]
            import crashkit

            crashkit.main()  # ends in sys.exit: the interpreter's own exit, as the real process
            sys.exit(0)
        send({"pid": pid})
        _, status = os.waitpid(pid, 0)
        send({"returncode": os.waitstatus_to_exitcode(status)})


# Keys dumpdb reads when a module is imported (the server imported them with its own values).
_IMPORT_TIME_ENV = ("DUMPDB_LOCK_TIMEOUT", "DUMPDB_DEBUG", "DUMPDB_METRICS_KERNEL")


class ForkServer:
    """The server process of this test process (one, started on first use, stopped at exit)."""

    def __init__(self) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS.parent),
                                                                         os.environ.get("PYTHONPATH")]))}
        self.env = env
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env, cwd=str(TESTS.parent))
        self.lock = threading.Lock()

    def _answer(self, timeout: float | None) -> dict:
        assert self.proc.stdout is not None
        if timeout is not None and not select.select([self.proc.stdout], [], [], timeout)[0]:
            raise subprocess.TimeoutExpired("forkrun", timeout)
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"fork server exited ({self.proc.poll()})")
        return json.loads(line)

    def run(self, argv: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
        with self.lock, tempfile.TemporaryDirectory(prefix="forkrun-") as tmp:
            out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
            open(out, "w").close()
            open(err, "w").close()
            req = {"argv": argv, "env": env, "cwd": os.getcwd(), "stdin": os.devnull, "stdout": out, "stderr": err}
            assert self.proc.stdin is not None
            self.proc.stdin.write((json.dumps(req) + "\n").encode())
            self.proc.stdin.flush()
            pid = self._answer(60)["pid"]
            try:
                code = self._answer(timeout)["returncode"]
            except subprocess.TimeoutExpired:
                os.kill(pid, signal.SIGKILL)
                self._answer(60)
                raise
            return subprocess.CompletedProcess([sys.executable, str(CRASHKIT), *argv], code,
                                               Path(out).read_text(errors="replace"),
                                               Path(err).read_text(errors="replace"))

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


_server: ForkServer | None = None


def crashkit_process(args: list[str], env: dict, timeout: float = 240) -> subprocess.CompletedProcess:
    """``python tests/crashkit.py -m dumpdb ARGS`` with environment ``env`` and this process's
    working directory, stdout and stderr captured as text (what ``subprocess.run(...,
    capture_output=True, text=True)`` gives): forked from the fork server, or a plain
    subprocess when ``env`` sets a variable dumpdb reads at import time differently."""
    global _server
    if _server is None:
        _server = ForkServer()
        atexit.register(_server.close)
    if any(env.get(k) != _server.env.get(k) for k in _IMPORT_TIME_ENV):
        return subprocess.run([sys.executable, str(CRASHKIT), "-m", "dumpdb", *args], env=env,
                              capture_output=True, text=True, timeout=timeout)
    return _server.run(["-m", "dumpdb", *args], env, timeout)


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
    _serve()
