"""The Starlette application of ``dumpdb serve``: JSON under ``/api/...``, and one HTML shell
(``static/index.html`` + ``app.js``) for every page, which reads its query string and fetches
the same API (so every page's URL is a deep link and its data a stable JSON URL).

Read-only: no route writes the archive (new compares run with ``store_results=False``); request
values are bound as SQL parameters or parsed as integers, never used as paths; every JSON body
is capped at :data:`MAX_RESPONSE_BYTES` (a larger one is refused with a message asking for a
smaller ``limit``). Errors are JSON ``{"error": "..."}`` with status 400 (404 for an unknown
run, tensor or compare).
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from dumpdb.errors import DumpdbError
from dumpdb.render.tables import plain
from dumpdb.serve import compares, queries

MAX_RESPONSE_BYTES = 16 << 20
PAGES = ("/", "/tree", "/op", "/tensor", "/pair", "/compare", "/ranks", "/sql")


def _json(data: Any, status: int = 200) -> Response:
    body = json.dumps(plain(data), separators=(",", ":"), allow_nan=False).encode("utf-8")
    if len(body) > MAX_RESPONSE_BYTES:
        return _error(f"response of {len(body)} bytes is over the {MAX_RESPONSE_BYTES} byte limit: "
                      "ask for fewer rows (limit=)", 413)
    return Response(body, status, media_type="application/json")


def _error(message: str, status: int = 400) -> Response:
    return JSONResponse({"error": message}, status)


def _int(request: Request, name: str, default: int | None = None) -> int | None:
    value = request.query_params.get(name)
    if value in (None, ""):
        return default
    try:
        return int(value)
    except ValueError:
        raise DumpdbError(f"{name} must be an integer, not {value!r}") from None


def _id(request: Request, name: str) -> int:
    value = _int(request, name)
    if value is None:
        raise DumpdbError(f"missing parameter {name}")
    return value


def _text(request: Request, name: str, required: bool = True) -> str:
    value = request.query_params.get(name)
    if value is None:
        if required:
            raise DumpdbError(f"missing parameter {name}")
        return ""
    return value


def create_app(archive) -> Starlette:
    """The application serving ``archive`` (a :class:`dumpdb.Archive`)."""
    views = compares.ViewCache()
    static = resources.files("dumpdb.serve") / "static"
    shell = (static / "index.html").read_text(encoding="utf-8")

    def endpoint(fn):
        async def run(request: Request) -> Response:
            try:
                result = await run_in_threadpool(fn, request)
            except LookupError as exc:  # RunNotFound, TensorNotFound
                return _error(str(exc), 404)
            except DumpdbError as exc:
                return _error(str(exc), 400)
            return result if isinstance(result, Response) else _json(result)
        return run

    def view(request: Request) -> compares.CompareView:
        params = dict(request.query_params)
        if "rank_sel" not in params and params.get("target"):
            params["rank_sel"] = params.get("selection_rank", "")
        return views.get(archive, params)

    def compare_summary(request: Request) -> Any:
        v = view(request)
        return {"key": v.key, "summary": v.summary, "firsts": v.firsts, "rules": v.verdict_rule,
                "error_metric": v.error_metric, "options": compares.options(v)}

    def compare_children(request: Request) -> Any:
        v = view(request)
        return compares.children(v, _text(request, "side"), _text(request, "path", False),
                                 compares.filters_of(dict(request.query_params)), limit=_int(request, "limit"),
                                 offset=_int(request, "offset", 0) or 0)

    def compare_plot(request: Request) -> Any:
        return compares.plot(view(request), compares.filters_of(dict(request.query_params)))

    def compare_pairs(request: Request) -> Any:
        return compares.pairs_of(view(request), _text(request, "side"), _text(request, "op"), _int(request, "limit"))

    def npy(request: Request) -> Response:
        tid = _id(request, "id")
        body = queries.npy_bytes(archive, tid)
        return Response(body, media_type="application/octet-stream",
                        headers={"Content-Disposition": f'attachment; filename="tensor_{tid}.npy"'})

    def sql_export(request: Request) -> Response:
        fmt = request.path_params["fmt"]
        body, media = queries.sql_export(archive, _text(request, "q"), fmt)
        return Response(body, media_type=media,
                        headers={"Content-Disposition": f'attachment; filename="query.{fmt}"'})

    api = [
        ("/api/runs", lambda r: {"runs": queries.runs(archive), "compares": compares.stored_list(archive)}),
        ("/api/run", lambda r: archive.show(_text(r, "run"))),
        ("/api/tree", lambda r: queries.children(archive, _text(r, "run"), _text(r, "path", False),
                                                 limit=_int(r, "limit"), offset=_int(r, "offset", 0) or 0)),
        ("/api/search", lambda r: queries.search(archive, _text(r, "run"), _text(r, "q", False),
                                                 limit=_int(r, "limit"))),
        ("/api/op", lambda r: queries.op(archive, _text(r, "run"), _text(r, "op"), limit=_int(r, "limit"))),
        ("/api/tensor", lambda r: queries.tensor_info(archive, _id(r, "id"))),
        ("/api/tensor/heatmap", lambda r: queries.tensor_heatmap(archive, _id(r, "id"), _int(r, "h"), _int(r, "w"))),
        ("/api/tensor/histogram", lambda r: queries.tensor_histogram(archive, _id(r, "id"), _int(r, "bins"))),
        ("/api/tensor.npy", npy),
        ("/api/pair", lambda r: {"target": queries.tensor_info(archive, _id(r, "target")),
                                 "bench": queries.tensor_info(archive, _id(r, "bench"))}),
        ("/api/pair/heatmap", lambda r: queries.pair_heatmap(archive, _id(r, "target"), _id(r, "bench"),
                                                             _int(r, "h"), _int(r, "w"))),
        ("/api/pair/histogram", lambda r: queries.pair_histogram(archive, _id(r, "target"), _id(r, "bench"),
                                                                 _int(r, "bins"))),
        ("/api/compare", compare_summary),
        ("/api/compare/tree", compare_children),
        ("/api/compare/plot", compare_plot),
        ("/api/compare/pairs", compare_pairs),
        ("/api/ranks", lambda r: queries.ranks(archive, _text(r, "run"), _int(r, "iteration"), _int(r, "max_ops"))),
        ("/api/sql", lambda r: queries.sql_page(archive, _text(r, "q"), _int(r, "page", 0) or 0,
                                                _int(r, "page_size"))),
    ]

    async def page(request: Request) -> Response:
        return HTMLResponse(shell)

    async def not_found(request: Request) -> Response:
        return _error(f"no API route {request.url.path}", 404)

    routes: list[BaseRoute] = [Route(path, endpoint(fn)) for path, fn in api]
    routes.append(Route("/api/sql.{fmt}", endpoint(sql_export)))
    routes.append(Route("/api/{rest:path}", not_found))
    routes += [Route(p, page) for p in PAGES]
    routes.append(Mount("/static", StaticFiles(directory=str(static)), name="static"))
    app = Starlette(routes=routes)
    app.state.archive = archive
    return app
