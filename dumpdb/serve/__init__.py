"""``dumpdb serve``: a local, read-only web application over an archive (issue 28).

Pages (each backed by JSON at ``/api/...``; see ``docs/serve.md``): runs, a run's model tree,
an op and its tensors, a tensor's heatmap and histogram, a compare of two runs (two trees side
by side, the first departure, the error plot), a pair's difference heatmap, the rank x op grid,
and SQL through the sandbox of ``dumpdb sql``. Needs the ``serve`` extra
(``pip install 'dumpdb[serve]'``: starlette, uvicorn).
"""

from __future__ import annotations

import sys
from typing import Any

from dumpdb.errors import DumpdbError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765


def create_app(archive) -> Any:
    """The Starlette application serving ``archive`` (:func:`dumpdb.serve.app.create_app`).
    Raises DumpdbError when starlette is not installed."""
    try:
        from dumpdb.serve.app import create_app as make
    except ImportError as exc:
        raise DumpdbError(f"dumpdb serve needs starlette and uvicorn ({exc.name} is missing): "
                          "pip install 'dumpdb[serve]'") from None
    return make(archive)


def serve(archive, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, open_browser: bool = False) -> None:
    """Serve ``archive`` at ``http://host:port/`` until Ctrl-C (uvicorn; the URL on stderr).
    Binds 127.0.0.1 unless told otherwise. Raises DumpdbError when starlette or uvicorn is
    missing, or the port cannot be bound."""
    app = create_app(archive)
    try:
        import uvicorn
    except ImportError:
        raise DumpdbError("dumpdb serve needs uvicorn: pip install 'dumpdb[serve]'") from None
    url = f"http://{host if ':' not in host else f'[{host}]'}:{port}/"
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    print(f"dumpdb serve: {archive.path} at {url} (read-only; Ctrl-C stops)", file=sys.stderr, flush=True)
    if open_browser:
        import threading
        import webbrowser

        threading.Timer(0.5, webbrowser.open, [url]).start()
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    except SystemExit:  # uvicorn exits when it cannot bind (it logged why)
        raise DumpdbError(f"cannot serve at {url}: the address is in use or not available") from None
    except OSError as exc:
        raise DumpdbError(f"cannot serve at {url}: {exc.strerror or exc}") from exc
    finally:
        archive.close()
