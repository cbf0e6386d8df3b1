"""A site on 127.0.0.1 whose content appears only when a person scrolls, clicks or opens it.

    /feed            five item links (each 400 px tall, so the list is taller than the
                     viewport); scrolling near the bottom fetches /more?page=2, then 3, each
                     five more item links (three screens in all); a "Load more" button that
                     fetches /button?click=N and adds three item links per click, removed
                     after two clicks; an image with loading="lazy" and only a data-src
                     (/lazy.png); a closed <details>; a <video> that counts when it plays
    /item/N          a small page
    /more, /button   JSON lists of item numbers
    /lazy.png        a PNG
    /played          asked for by the video's play event

Every request is counted per path (``hits``), so a test can say what the browser asked for.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .jssite import png

SCROLL_PAGES = (2, 3)  # what infinite scroll loads after the first screen
BUTTON_CLICKS = 2
LAZY = png(8, 8, (0, 0, 255))


def first_items() -> list[int]:
    return list(range(1, 6))


def scroll_items(page: int) -> list[int]:
    return list(range(5 * (page - 1) + 1, 5 * page + 1))


def button_items(click: int) -> list[int]:
    return [100 + 3 * (click - 1) + i for i in range(3)]


def every_item() -> set[int]:
    items = set(first_items())
    for page in SCROLL_PAGES:
        items.update(scroll_items(page))
    for click in range(1, BUTTON_CLICKS + 1):
        items.update(button_items(click))
    return items


FEED = """<!doctype html><html><head><meta charset="utf-8"><title>Feed</title>
<style>body { margin: 0; } .item { display: block; height: 400px; }</style></head>
<body><h1>Feed</h1>
<details id="folded"><summary>Terms</summary><p>Folded terms text.</p></details>
<video id="clip" width="32" height="32" muted></video>
<img id="lazy" loading="lazy" data-src="/lazy.png" alt="lazy">
<div id="items">%(items)s</div>
<button id="more" type="button">Load more</button>
<div id="end" style="height: 10px"></div>
<script>
  const list = document.getElementById('items');
  const add = (numbers) => numbers.forEach((n) => {
    const a = document.createElement('a');
    a.className = 'item'; a.href = '/item/' + n; a.textContent = 'item ' + n;
    list.appendChild(a);
  });
  let page = 1, loading = false;
  window.addEventListener('scroll', () => {
    if (loading || page >= %(last_page)d) return;
    if (window.scrollY + window.innerHeight < document.body.scrollHeight - 600) return;
    loading = true;
    fetch('/more?page=' + (page + 1)).then((r) => r.json()).then((numbers) => {
      page += 1; add(numbers); loading = false;
    });
  });
  let clicks = 0;
  document.getElementById('more').addEventListener('click', (event) => {
    if (!event.isTrusted) return;  // a person's click, not a script's
    clicks += 1;
    fetch('/button?click=' + clicks).then((r) => r.json()).then((numbers) => {
      add(numbers);
      if (clicks >= %(clicks)d) document.getElementById('more').remove();
    });
  });
  document.getElementById('clip').addEventListener('play', () => fetch('/played'));
</script></body></html>"""


class BehaviorSite:
    """Serves the pages above from a background thread; a context manager."""

    __test__ = False

    def __init__(self) -> None:
        self.hits: Counter[str] = Counter()
        site = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                path, _, query = self.path.partition("?")
                site.hits[path] += 1
                if path == "/feed":
                    items = "".join(f'<a class="item" href="/item/{n}">item {n}</a>'
                                    for n in first_items())
                    body = FEED % {"items": items, "last_page": SCROLL_PAGES[-1],
                                   "clicks": BUTTON_CLICKS}
                    return self._send(200, body.encode(), "text/html; charset=utf-8")
                if path.startswith("/item/"):
                    n = path.rsplit("/", 1)[1]
                    return self._send(200, f"<!doctype html><title>item {n}</title>"
                                      f"<p>item {n}</p>".encode(), "text/html; charset=utf-8")
                if path == "/more":
                    page = int(query.split("=", 1)[1])
                    return self._json(scroll_items(page))
                if path == "/button":
                    click = int(query.split("=", 1)[1])
                    return self._json(button_items(click))
                if path == "/lazy.png":
                    return self._send(200, LAZY, "image/png")
                if path == "/played":
                    return self._send(204, b"", "text/plain")
                self._send(404, b"not found", "text/plain")

            def _json(self, value: object) -> None:
                self._send(200, json.dumps(value).encode(), "application/json")

            def _send(self, status: int, body: bytes, kind: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> BehaviorSite:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()
