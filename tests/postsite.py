"""A site on 127.0.0.1 whose page loads its data by POST, for the replay tests (issue 33).

    /          a page whose script POSTs ``q=alpha`` to /api as fetch() sends a string
               (text/plain) and ``q=beta`` as a form (URLSearchParams), and writes each
               answer into #alpha and #beta
    /api       POST: ``answer to <body>``; GET: ``GET answer`` (a GET is never captured,
               so a replay must not answer one with a POST's response)
    /same      the same bytes as /twin, under another URL (for revisit records)
    /twin      see /same

Requests are counted by method and path (``hits``).
"""

from __future__ import annotations

import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PAGE = b"""<!doctype html><html><head><meta charset="utf-8"><title>Posting page</title>
</head><body><h1>Posting</h1><a href="/same">same</a> <a href="/twin">twin</a>
<script>
  async function ask(id, body) {
    const r = await fetch('/api', {method: 'POST', body: body});
    const p = document.createElement('p'); p.id = id; p.textContent = await r.text();
    document.body.appendChild(p);
  }
  ask('alpha', 'q=alpha').then(() => ask('beta', new URLSearchParams({q: 'beta'})));
</script></body></html>"""
TWIN = b"<!doctype html><title>Twin</title><p>the same bytes under two URLs</p>"


class PostSite:
    """Serves the pages above from a background thread; a context manager."""

    __test__ = False

    def __init__(self) -> None:
        self.hits: Counter[tuple[str, str]] = Counter()
        site = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                site.hits["GET", self.path] += 1
                routes = {"/": PAGE, "/same": TWIN, "/twin": TWIN, "/api": b"GET answer"}
                if self.path not in routes:
                    return self._send(404, b"not found")
                self._send(200, routes[self.path])

            def do_POST(self) -> None:
                site.hits["POST", self.path] += 1
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.path != "/api":
                    return self._send(404, b"not found")
                self._send(200, b"answer to " + body, "text/plain")

            def _send(self, status: int, body: bytes,
                      kind: str = "text/html; charset=utf-8") -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> PostSite:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)
