"""A small site on 127.0.0.1 whose pages are built by scripts, for the rendering tests.

    /             links to /page only (no script)
    /page         a script adds a link to /hidden and writes a consent banner; an image
                  /logo.png (a red square, PNG) in the HTML; a stylesheet that a script
                  loads (/style.css); a fetch() of /data.json
    /hidden       reached only through the script-added link
    /logo.png     a 24x24 red PNG, gzip-free, Content-Length framed
    /style.css    chunked, gzip content coding
    /data.json    JSON
    /hang         a page whose script loops forever once loaded (a hung renderer)
    /locked       a page with two images that answer 401 with a challenge (Basic, Digest)
    /slowpage     a page with an image, /slow.png, that is answered only once the test
                  calls ``release()`` (``wait_for("/slow.png")`` says it was asked for)

Every request is counted per path (``hits``), so a test can say what the browser asked for.
"""

from __future__ import annotations

import gzip
import ssl
import struct
import threading
import zlib
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BANNER = "We use cookies: accept or refuse"


def png(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """A solid-colour RGB PNG, built by hand (signature, IHDR, IDAT, IEND)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    row = b"\x00" + bytes(rgb) * width
    return (b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(row * height)) + chunk(b"IEND", b""))


LOGO = png(24, 24, (255, 0, 0))

HOME = b"""<!doctype html><html><head><title>Home</title></head>
<body><h1>Home</h1><a href="/page">the page</a></body></html>"""

PAGE = f"""<!doctype html><html><head><meta charset="utf-8"><title>Scripted page</title>
<style>body {{ margin: 0; background: #fff; }} #logo {{ width: 240px; height: 240px; }}</style>
</head><body><h1>Scripted</h1>
<img id="logo" src="/logo.png" alt="logo">
<div id="slot"></div>
<script>
  const a = document.createElement('a');
  a.href = '/hidden'; a.textContent = 'hidden by script';
  document.getElementById('slot').appendChild(a);
  const banner = document.createElement('div');
  banner.id = 'consent'; banner.textContent = {BANNER!r};
  document.body.appendChild(banner);
  const css = document.createElement('link');
  css.rel = 'stylesheet'; css.href = '/style.css';
  document.head.appendChild(css);
  fetch('/data.json').then(r => r.json()).then(d => {{
    const p = document.createElement('p'); p.id = 'data'; p.textContent = d.message;
    document.body.appendChild(p);
  }});
</script></body></html>""".encode()

SLOWPAGE = b"""<!doctype html><title>Slow</title><img src="/slow.png">
<a href="/">home</a>"""
HIDDEN = b"<!doctype html><title>Hidden</title><p>only a browser finds me</p>"
LOCKED = b"""<!doctype html><title>Locked</title><img src="/basic.png"><img src="/digest.png">
<p>two locked images</p>"""
CHALLENGES = {"/basic.png": 'Basic realm="images"',
              "/digest.png": 'Digest realm="images", nonce="n0", qop="auth", algorithm=MD5'}
HANG = b"""<!doctype html><title>Hang</title><script>
window.addEventListener('load', () => { while (true) {} });
</script><p>hangs</p>"""
STYLE = b"h1 { color: rgb(0, 0, 255); }"
DATA = b'{"message": "loaded by fetch"}'


class JsSite:
    """Serves the pages above from a background thread; a context manager."""

    __test__ = False

    def __init__(self, *, tls: ssl.SSLContext | None = None) -> None:
        self.hits: Counter[str] = Counter()
        self._asked: dict[str, threading.Event] = {}
        self._released = threading.Event()
        site = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                site.hits[path] += 1
                site._asked.setdefault(path, threading.Event()).set()
                if path == "/slow.png":
                    site._released.wait(60)
                    return self._send(200, LOGO, "image/png")
                routes = {"/": (HOME, "text/html; charset=utf-8"),
                          "/page": (PAGE, "text/html; charset=utf-8"),
                          "/hidden": (HIDDEN, "text/html; charset=utf-8"),
                          "/hang": (HANG, "text/html; charset=utf-8"),
                          "/locked": (LOCKED, "text/html; charset=utf-8"),
                          "/slowpage": (SLOWPAGE, "text/html; charset=utf-8"),
                          "/logo.png": (LOGO, "image/png"),
                          "/data.json": (DATA, "application/json")}
                if path == "/style.css":
                    return self._chunked_gzip(STYLE, "text/css")
                if path in CHALLENGES:
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", CHALLENGES[path])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return None
                if path not in routes:
                    return self._send(404, b"not found", "text/plain")
                body, kind = routes[path]
                self._send(200, body, kind)

            def _send(self, status: int, body: bytes, kind: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _chunked_gzip(self, body: bytes, kind: str) -> None:
                data = gzip.compress(body, mtime=0)
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Encoding", "gzip")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                half = len(data) // 2
                for part in (data[:half], data[half:]):
                    self.wfile.write(b"%x\r\n" % len(part) + part + b"\r\n")
                self.wfile.write(b"0\r\n\r\n")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        if tls is not None:  # HTTPS: the listening socket speaks TLS
            self._server.socket = tls.wrap_socket(self._server.socket, server_side=True)
        self.port = self._server.server_address[1]
        scheme = "https" if tls is not None else "http"
        self.url = f"{scheme}://127.0.0.1:{self.port}/"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def wait_for(self, path: str, timeout: float = 60.0) -> None:
        """Until ``path`` has been requested at least once."""
        if not self._asked.setdefault(path, threading.Event()).wait(timeout):
            raise TimeoutError(f"{path} was not requested within {timeout} s")

    def release(self) -> None:
        """Answer the held /slow.png requests (and every later one at once)."""
        self._released.set()

    def __enter__(self) -> JsSite:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._released.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)
