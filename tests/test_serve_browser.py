"""``dumpdb serve`` in a real browser (issue 28's acceptance walk): Debian's chromium driven by
Playwright for Python (the system chromium as executable; browsers are never downloaded), on a
real uvicorn server over real Transformer dumps.

Set ``DUMPDB_SCREENSHOTS=DIR`` to save the main pages as PNGs there (docs/serve.md's pictures).
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="dumpdb serve needs the serve extra (starlette, uvicorn)")
uvicorn = pytest.importorskip("uvicorn", reason="dumpdb serve needs the serve extra (uvicorn)")
sync_api = pytest.importorskip("playwright.sync_api", reason="the browser tests need playwright (test extra)")
CHROMIUM = os.environ.get("DUMPDB_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
if not Path(CHROMIUM).exists():
    pytest.skip("the browser tests need Debian's chromium (apt-get install chromium; .ci/run installs it)",
                allow_module_level=True)

from serve_fixtures import HOSTILE_OP, HOSTILE_RUN, archive_copy  # noqa: E402

import dumpdb  # noqa: E402
from dumpdb.serve import create_app  # noqa: E402

SHOTS = os.environ.get("DUMPDB_SCREENSHOTS")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    archive = dumpdb.open(archive_copy(tmp_path_factory))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(create_app(archive), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(10)
    archive.close()


@pytest.fixture(scope="module")
def page(server):
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        context = browser.new_context(viewport={"width": 1400, "height": 900}, accept_downloads=True)
        pg = context.new_page()
        errors: list[str] = []
        pg.on("pageerror", lambda e: errors.append(str(e)))
        pg.errors = errors
        yield pg
        browser.close()


def ready(page) -> None:
    page.wait_for_selector("body[data-ready='1']", timeout=60_000)
    assert not page.query_selector("main > p.error"), page.inner_text("main")


def shot(page, name: str, full: bool = False) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"serve-{name}.png"), full_page=full)


def painted(page, selector: str) -> int:
    """Distinct colours drawn on a canvas (0: nothing drawn)."""
    return page.eval_on_selector(selector, """c => { const d = c.getContext('2d').getImageData(0, 0, c.width,
        c.height).data; const s = new Set(); for (let i = 0; i < d.length; i += 4) if (d[i + 3]) s.add(
        d[i] * 65536 + d[i + 1] * 256 + d[i + 2]); return s.size; }""")


def test_acceptance_walk(server, page, tmp_path):
    # runs -> a run's tree
    page.goto(server + "/")
    ready(page)
    assert page.locator("a.run-link", has_text="fp32_ln1").count() == 1
    shot(page, "runs")
    page.click("a.run-link:text-is('fp32_ln1')")
    ready(page)
    assert page.locator(".tree .node", has_text="Default").count() >= 1
    # search an op, open it in the tree, its tensors beside
    page.fill("#search", "norm1-LayerNorm/LayerNorm")
    page.click("#search-results div:has-text('1-TransformerEncoderLayer')")
    page.wait_for_selector(".tree .node.sel:has-text('LayerNorm-op0')")
    page.wait_for_selector("#op-panel a.tensor-link")
    shot(page, "tree")
    # -> its tensor heatmap
    page.click("#op-panel a.tensor-link >> nth=0")
    ready(page)
    page.wait_for_selector("#pictures canvas.heat")
    assert painted(page, "#pictures canvas.heat") > 10
    assert page.locator("#pictures svg.hist rect").count() > 10
    shot(page, "tensor", full=True)
    # -> a compare of two corpus runs (from the runs page's form)
    page.goto(server + "/")
    ready(page)
    page.select_option("#cmp-target", "fp32_ln1")
    page.select_option("#cmp-bench", "fp32")
    page.click("#cmp-go")
    ready(page)
    # the first departure highlighted in both trees, named in the panel, plotted with the floor
    page.wait_for_selector(".tree .node.first:has-text('LayerNorm-op0')")
    assert page.locator(".tree .node.first:has-text('LayerNorm-op0')").count() == 2
    assert "norm1-LayerNorm_LayerNorm-op0" in page.inner_text("#firsts")
    assert page.locator("#error-plot circle").count() > 100 and page.locator("#error-plot path.floor").count() == 1
    page.wait_for_selector("#pair-panel a.first-diff")
    shot(page, "compare")
    # a click on a node of one side reveals its aligned node in the other tree
    page.locator(".cols2 > div").nth(0).locator(".node:has-text('embed-Embedding')").click()
    page.wait_for_selector(".cols2 > div >> nth=1 >> .node.sel:has-text('embed-Embedding')")
    # -> its difference heatmap
    page.click("#pair-panel a.first-diff")
    ready(page)
    page.wait_for_selector("#pictures canvas.heat")
    assert painted(page, "#pictures canvas.heat") >= 1  # (the first departure here is a 0-d input)
    assert "Difference heatmap" in page.inner_text("#pictures")
    shot(page, "pair")
    # -> SQL page -> CSV download
    page.goto(server + "/sql")
    ready(page)
    page.fill("#sql", "SELECT run, count(*) AS tensors FROM tensors GROUP BY run ORDER BY run")
    page.click("#sql-run")
    ready(page)
    assert page.locator("#sql-out td", has_text="fp32_ln1").count() == 1
    with page.expect_download() as info:
        page.click("#dl-csv")
    target = tmp_path / "q.csv"
    info.value.save_as(target)
    lines = target.read_text().splitlines()
    assert lines[0] == "run,tensors" and any(line.startswith("fp32_ln1,") for line in lines)
    page.goto(server + "/ranks?run=gloo")
    ready(page)
    assert painted(page, "#rank-grid") >= 1
    shot(page, "ranks")
    assert page.errors == []


def test_hostile_names_render_as_text(server, page):
    page.goto(server + "/")
    ready(page)
    assert page.locator("a.run-link", has_text="<b>run</b>").count() == 1  # the name as text, not markup
    page.goto(server + "/tree?" + __import__("urllib.parse").parse.urlencode({"run": HOSTILE_RUN}))
    ready(page)
    page.fill("#search", "<script>")
    page.click("#search-results div >> nth=0")
    page.wait_for_selector("#op-panel h2")
    assert page.inner_text("#op-panel h2") == HOSTILE_OP
    assert page.evaluate("window.__pwned") is None
    assert page.locator("main img, main script, main b").count() == 0
    assert page.errors == []
