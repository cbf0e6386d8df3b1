"""ReplayWeb.page on 127.0.0.1, for the tests and benchmarks that open a WACZ in it.

    with ReplayWebPage(package_dir(), "site.wacz") as rwp:
        url = rwp.embed_url("http://127.0.0.1:8000/page", "20240102030405")
        ... open url in headless Chromium; the replayed page is the frame whose URL
        ... holds "mp_/" (replay_frame below finds it)

ReplayWeb.page replays a WACZ inside the browser: its service worker (``sw.js``) reads the
file by HTTP range requests, finds a URL in its index and answers the page's requests
from the WARC. It is the ``replaywebpage`` package of the npm registry, fetched once by
``python -m evidence.testing.replayweb --install`` (``npm pack`` of the pinned version into
``~/.cache/evidence/``, or ``$EVIDENCE_REPLAYWEB``); nothing is fetched while a test runs.
It is AGPL-3.0 and is served, never imported or bundled.

The server here is a small threaded HTTP server bound to 127.0.0.1: ``/replay/`` is the
package (``ui.js``, ``sw.js``: the service worker's scope), ``/archive.wacz`` the WACZ with
byte ranges (``Range: bytes=a-b``, answered 206, as the service worker asks), and
``/embed.html`` a page holding ``<replay-web-page>`` for one URL and time with
``embed="replayonly"`` (the replayed page alone, no ReplayWeb.page chrome). Every
request is counted by path (``hits``), so a benchmark can say what was read.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

__all__ = ["VERSION", "ReplayWebPage", "ReplayWebUnavailable", "install", "package_dir",
           "replay_frame_value"]

VERSION = "2.5.3"
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
_TYPES = {".js": "application/javascript", ".html": "text/html; charset=utf-8",
          ".json": "application/json", ".wasm": "application/wasm",
          ".wacz": "application/wacz", ".gz": "application/gzip", ".css": "text/css"}


class ReplayWebUnavailable(RuntimeError):
    """The ``replaywebpage`` package has not been fetched here (see ``install``)."""


def package_dir() -> Path:
    """Where the fetched package lies (its ``ui.js`` and ``sw.js``), or raise
    ``ReplayWebUnavailable`` saying how to fetch it."""
    root = _cache_root()
    package = root / f"replaywebpage-{VERSION}" / "package"
    if not (package / "sw.js").is_file() or not (package / "ui.js").is_file():
        raise ReplayWebUnavailable(
            f"ReplayWeb.page {VERSION} is not in {root} (fetch it once: "
            "python -m evidence.testing.replayweb --install; it needs npm)")
    return package


def _cache_root() -> Path:
    configured = os.environ.get("EVIDENCE_REPLAYWEB")
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "evidence"


def install() -> Path:
    """``npm pack`` the pinned version (npm checks the registry's integrity hash) and unpack
    it in the cache; a no-op when it is there already."""
    try:
        return package_dir()
    except ReplayWebUnavailable:
        pass
    npm = shutil.which("npm")
    if npm is None:
        raise ReplayWebUnavailable("npm is not installed (Debian: apt-get install npm)")
    target = _cache_root() / f"replaywebpage-{VERSION}"
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        done = subprocess.run([npm, "pack", f"replaywebpage@{VERSION}", "--json"],
                              cwd=scratch, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise ReplayWebUnavailable(f"npm pack replaywebpage@{VERSION} failed: "
                                       f"{done.stderr[-2000:]}")
        tarball = Path(scratch) / json.loads(done.stdout)[0]["filename"]
        unpacked = Path(scratch) / "unpacked"
        unpacked.mkdir()
        subprocess.run(["tar", "-xzf", str(tarball), "-C", str(unpacked)], check=True,
                       timeout=120)
        shutil.rmtree(target, ignore_errors=True)
        os.rename(unpacked, target)
    return package_dir()


class ReplayWebPage:
    """ReplayWeb.page and one WACZ served on 127.0.0.1 (a context manager)."""

    def __init__(self, package: Path, wacz: str | os.PathLike[str]) -> None:
        self.package = package
        self.wacz = Path(wacz)
        self.hits: Counter[str] = Counter()
        self.bytes_served: Counter[str] = Counter()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                self._answer(head_only=True)

            def do_GET(self) -> None:
                self._answer(head_only=False)

            def _answer(self, *, head_only: bool) -> None:
                path = urlsplit(self.path).path
                server.hits[path] += 1
                if path == "/embed.html":
                    return self._send(200, server._embed_page(self.path).encode(),
                                      _TYPES[".html"], head_only)
                if path == "/archive.wacz":
                    return self._file(server.wacz, head_only)
                if path.startswith("/replay/"):
                    name = path[len("/replay/"):] or "index.html"
                    file = (server.package / name).resolve()
                    if file.is_relative_to(server.package.resolve()) and file.is_file():
                        return self._file(file, head_only)
                self._send(404, b"not found", "text/plain", head_only)

            def _file(self, file: Path, head_only: bool) -> None:
                size = file.stat().st_size
                kind = _TYPES.get(file.suffix, "application/octet-stream")
                match = _RANGE.match(self.headers.get("Range", "").strip())
                start, end, status = 0, size - 1, 200
                if match and (match.group(1) or match.group(2)):
                    if match.group(1):
                        start = int(match.group(1))
                        end = min(int(match.group(2)), size - 1) if match.group(2) else end
                    else:  # the last N bytes
                        start = max(size - int(match.group(2)), 0)
                    if start > end:
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{size}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return None
                    status = 206
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Cache-Control", "no-store")
                if status == 206:
                    self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
                self.send_header("Content-Length", str(end - start + 1))
                self.end_headers()
                if head_only:
                    return None
                with open(file, "rb") as f:
                    f.seek(start)
                    left = end - start + 1
                    while left > 0:
                        chunk = f.read(min(left, 1 << 20))
                        if not chunk:
                            break
                        self.wfile.write(chunk)
                        left -= len(chunk)
                        server.bytes_served[urlsplit(self.path).path] += len(chunk)
                return None

            def _send(self, status: int, body: bytes, kind: str, head_only: bool) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                if not head_only:
                    self.wfile.write(body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.origin = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def embed_url(self, url: str, ts: str) -> str:
        """The page that replays ``url`` at ``ts`` (14 digits) from the WACZ."""
        return f"{self.origin}/embed.html?url={quote(url, safe='')}&ts={ts}"

    def _embed_page(self, request_path: str) -> str:
        from urllib.parse import parse_qs

        query = parse_qs(urlsplit(request_path).query)
        url = html.escape(query.get("url", [""])[0])
        ts = html.escape(query.get("ts", [""])[0])
        return ("<!doctype html><html><head><title>replay</title>"
                '<script src="/replay/ui.js"></script>'
                "<style>html, body { margin: 0; height: 100%; }</style></head><body>"
                f'<replay-web-page source="/archive.wacz" url="{url}" ts="{ts}" '
                'replayBase="/replay/" embed="replayonly" deepLink></replay-web-page>'
                "</body></html>")

    def __enter__(self) -> ReplayWebPage:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)


async def replay_frame_value(page: Any, url_part: str, expression: str, *,
                             timeout: float = 60.0,
                             ready: Callable[[Any], bool] = bool,
                             sleep: Callable[[float], Awaitable[None]] | None = None) -> Any:
    """Evaluate ``expression`` in the replayed page's frame (the frame whose URL holds
    ``mp_/`` and ``url_part``) until ``ready(value)``; its last value after ``timeout``.

    ``page`` is a ``evidence._crawl.browser.Page`` already navigated to ``embed_url``.
    The expression runs in an isolated world of that frame: it sees the DOM, not the
    page's own script variables.
    """
    import anyio

    from .._crawl.browser import BrowserError

    nap = sleep or anyio.sleep
    deadline = time.monotonic() + timeout
    value: Any = None
    while time.monotonic() < deadline:
        tree = (await page.send("Page.getFrameTree"))["frameTree"]
        frame = _find_frame(tree, url_part)
        if frame is not None:
            try:
                world = await page.send("Page.createIsolatedWorld", {
                    "frameId": frame, "worldName": "evidence-probe"})
                result = await page.send("Runtime.evaluate", {
                    "expression": expression, "contextId": world["executionContextId"],
                    "returnByValue": True})
                value = result.get("result", {}).get("value")
                if ready(value):
                    return value
            except BrowserError:  # the frame navigated away meanwhile: look again
                value = None
        await nap(0.1)
    return value


def _find_frame(tree: dict[str, Any], url_part: str) -> str | None:
    frame = tree["frame"]
    if "mp_/" in frame.get("url", "") and url_part in frame.get("url", ""):
        return frame["id"]
    for child in tree.get("childFrames", []):
        found = _find_frame(child, url_part)
        if found is not None:
            return found
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m evidence.testing.replayweb",
        description=f"Fetch ReplayWeb.page {VERSION} (npm pack) into the cache the tests and "
        "benchmarks read it from, or say where it is.")
    parser.add_argument("--install", action="store_true",
                        help="fetch it if it is not there yet (needs npm and the registry)")
    args = parser.parse_args(argv)
    try:
        where = install() if args.install else package_dir()
    except ReplayWebUnavailable as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 2
    print(where)
    return 0


if __name__ == "__main__":
    sys.exit(main())
