"""A site on 127.0.0.1 that answers only requests carrying what a crawl was told to send.

    /                 links to the rest; sets the cookie srv=from-server (Path=/)
    /private          401 without HTTP basic credentials alice:s3cret-pw, else a page that
                      embeds /private/pixel.png
    /private/pixel.png  401 without the credentials, else a PNG
    /members          403 without the cookie sid=SID-SECRET-VALUE
    /next             400 without the cookie the site set (srv=from-server)
    /lang             400 without Accept-Language: fr

Every request's header fields are kept per path (``seen``), so a test can say what was sent.
"""

from __future__ import annotations

import base64
import threading
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .jssite import png

USER, PASSWORD = "alice", "s3cret-pw"
SID = "SID-SECRET-VALUE"
BASIC = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
PIXEL = png(4, 4, (0, 128, 0))

INDEX = (b'<!doctype html><html><head><title>Home</title></head><body>'
         b'<a href="/private">p</a> <a href="/members">m</a> <a href="/next">n</a> '
         b'<a href="/lang">l</a></body></html>')
PRIVATE = (b'<!doctype html><html><head><title>Private</title></head><body>private ok '
           b'<img src="/private/pixel.png"></body></html>')


class AuthSite:
    """``with AuthSite() as site: site.url``; ``site.seen[path]``: header dicts, in order."""

    def __init__(self) -> None:
        self.seen: dict[str, list[dict[str, str]]] = defaultdict(list)
        site = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                headers = {k.lower(): v for k, v in self.headers.items()}
                site.seen[path].append(headers)
                cookies = dict(p.strip().split("=", 1) for p in
                               headers.get("cookie", "").split(";") if "=" in p)
                extra: list[tuple[str, str]] = []
                status, body, kind = 200, b"ok", "text/plain"
                if path == "/":
                    body, kind = INDEX, "text/html"
                    extra.append(("Set-Cookie", "srv=from-server; Path=/"))
                elif path.startswith("/private"):
                    if headers.get("authorization") != BASIC:
                        status, body = 401, b"who are you?"
                        extra.append(("WWW-Authenticate", 'Basic realm="test"'))
                    elif path == "/private/pixel.png":
                        body, kind = PIXEL, "image/png"
                    else:
                        body, kind = PRIVATE, "text/html"
                elif path == "/members":
                    status, body = (200, b"members ok") if cookies.get("sid") == SID else (
                        403, b"no session")
                elif path == "/next":
                    status = 200 if cookies.get("srv") == "from-server" else 400
                elif path == "/lang":
                    status = 200 if headers.get("accept-language") == "fr" else 400
                else:
                    status, body = 404, b"not here"
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                for name, value in extra:
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> AuthSite:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
