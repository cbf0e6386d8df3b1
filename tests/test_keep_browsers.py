"""Browsers kept between crawls (``evidence.keep_browsers``), and pages that end.

A program that runs crawl after crawl in one process keeps the browsers they close, so a
crawl does not pay for Chromium's start (1.5-2.4 s of CPU) when the last one started it.
What a kept browser must not keep is anything of the pages rendered in it. The test
processes of this suite run inside such a block (tests/conftest.py), so the tests here that
need the block's end run in a process of their own.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from evidence import CrawlConfig, Crawler, CrawlOptions, Store, keep_browsers
from evidence._crawl import browser as browser_module
from evidence._crawl.browser import Browser

ROOT = Path(__file__).resolve().parent.parent

# The page says what its browser context held before it ran (a cookie, local storage),
# then sets both: a second render in the same context would see them.
REMEMBERS = b"""<!doctype html><title>-</title><script>
document.title = (document.cookie || "no-cookie") + "|"
    + (localStorage.getItem("k") || "no-storage");
document.cookie = "k=1; max-age=3600"; localStorage.setItem("k", "1");
</script>"""


@pytest.fixture
def remembering_site() -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/" else 404)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            body = REMEMBERS if self.path == "/" else b""
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/"
    finally:
        server.shutdown()
        server.server_close()


def kept_pids() -> list[int]:
    return [p.pid for p in browser_module._KEPT._idle]


def test_the_next_crawl_takes_the_kept_browser_and_sees_nothing_of_the_last(
        tmp_path: Path, chromium: str, remembering_site: str) -> None:
    titles, kept = [], []
    with keep_browsers():
        for n in range(2):
            with Store.create(tmp_path / f"s{n}") as store:
                config = CrawlConfig(seeds=[remembering_site], render=True)
                result = anyio.run(Crawler(store, config, CrawlOptions(workers=1)).run)
                assert result.session_completed
                titles += store.connection.execute(
                    "SELECT outcome, title FROM render").fetchall()
            kept.append(kept_pids())
    assert titles == [("rendered", "no-cookie|no-storage")] * 2
    # The second crawl took the browser the first kept, and kept it again: no other started.
    assert kept[0] and sorted(kept[0]) == sorted(kept[1]), kept


def test_a_page_cut_short_by_its_deadline_is_closed_with_its_context(chromium: str) -> None:
    """A render that runs out of time leaves the browser through a cancelled scope; its
    tab and browser context are closed all the same. Before, they were left open, their
    scripts running, as long as the browser lived: a page that loops kept a core busy
    for the rest of the crawl (and, kept, of the next crawls)."""
    busy = "data:text/html,<title>busy</title><script>while (true) {}</script>"

    async def main() -> tuple[list[str], list[str]]:
        async with Browser() as browser:
            with anyio.move_on_after(2.0):
                async with browser.page() as page:
                    await page.send("Page.navigate", {"url": busy})
                    await anyio.sleep(60)
            targets = (await browser.send("Target.getTargets"))["targetInfos"]
            contexts = (await browser.send("Target.getBrowserContexts"))["browserContextIds"]
            return [t["url"] for t in targets if t["type"] == "page"], contexts

    pages, contexts = anyio.run(main)
    assert busy not in pages and contexts == [], (pages, contexts)


def test_a_kept_browser_is_ended_at_the_block_s_end_and_a_dead_one_is_not_taken(
        tmp_path: Path, chromium: str) -> None:
    """In a process of its own (this suite's processes are inside a block): a browser
    killed while kept is replaced; the least recently kept goes when more than ``most``
    are; leaving the block ends the rest and removes their profiles."""
    script = textwrap.dedent("""
        import json, os, signal, sys, time
        import anyio
        from evidence import keep_browsers
        from evidence._crawl.browser import Browser

        async def use(user_agent=None):
            async with Browser(user_agent=user_agent) as b:
                async with b.page() as page:
                    await page.send("Runtime.evaluate", {"expression": "1 + 1"})
                return b.pid, b.kept

        def alive(pid):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    return f.read().split(") ")[1][0] != "Z"
            except FileNotFoundError:
                return False

        out = {}
        with keep_browsers(most=1):
            a, kept_a = anyio.run(use)
            b, kept_b = anyio.run(use)
            out["taken"] = [kept_a, kept_b, a == b]
            os.kill(b, signal.SIGKILL)
            time.sleep(0.5)
            c, kept_c = anyio.run(use)
            out["after_kill"] = [kept_c, c != b]
            d, kept_d = anyio.run(use, "another agent")  # other flags
            out["other_flags"] = [kept_d, d != c, alive(c)]  # most=1: c ended for d
            out["inside"] = alive(d)
        out["after"] = alive(d)
        out["profiles"] = sorted(n for n in os.listdir(os.environ["TMPDIR"])
                                 if n.startswith("evidence-browser-"))
        print(json.dumps(out))
    """)
    scratch = Path(tempfile.mkdtemp(prefix="ev-tmp-", dir="/tmp"))  # short: Chromium's socket
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env={**os.environ, "TMPDIR": str(scratch)})
    shutil.rmtree(scratch, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert out["taken"] == [False, True, True]
    assert out["after_kill"] == [False, True]
    assert out["other_flags"] == [False, True, False]
    assert out["inside"] is True and out["after"] is False
    assert out["profiles"] == []


def test_most_must_be_one_or_more() -> None:
    with pytest.raises(ValueError, match="1 or more"), keep_browsers(most=0):
        pass
