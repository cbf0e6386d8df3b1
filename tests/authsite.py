"""A site on 127.0.0.1 that answers only requests carrying what a crawl was told to send.

    /                 links to the rest; sets the cookie srv=from-server (Path=/)
    /private          401 without HTTP basic credentials alice:s3cret-pw (with
                      ``AuthSite(digest=True)``, digest ones: MD5, qop=auth, each nonce
                      good for ``NONCE_USES`` requests, then answered stale; a path of
                      ``stale_once`` has its first right answer called stale), else a page
                      that embeds /private/pixel.png and links /private/1 to /private/4
    /private/pixel.png, /private/N  the same credentials, else a PNG, a small page
    /members          403 without the cookie sid=SID-SECRET-VALUE
    /next             400 without the cookie the site set (srv=from-server)
    /lang             400 without Accept-Language: fr

Every request's header fields are kept per path (``seen``), so a test can say what was sent.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import re
import threading
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .jssite import png

USER, PASSWORD = "alice", "s3cret-pw"
SID = "SID-SECRET-VALUE"
BASIC = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
PIXEL = png(4, 4, (0, 128, 0))
REALM = "evidence tests"
NONCE_USES = 3

INDEX = (b'<!doctype html><html><head><title>Home</title></head><body>'
         b'<a href="/private">p</a> <a href="/members">m</a> <a href="/next">n</a> '
         b'<a href="/lang">l</a></body></html>')
PRIVATE = (b'<!doctype html><html><head><title>Private</title></head><body>private ok '
           b'<img src="/private/pixel.png"> <a href="/private/1">1</a> '
           b'<a href="/private/2">2</a> <a href="/private/3">3</a> <a href="/private/4">4</a>'
           b'</body></html>')


def _md5(text: str) -> str:
    return hashlib.md5(text.encode()).hexdigest()


class DigestServer:
    """The server's side of RFC 7616 (MD5, qop=auth), written from the RFC apart from the
    crawler's: nonces it issued, and how often each was used."""

    def __init__(self, stale_once: frozenset[str] = frozenset()) -> None:
        self.uses: dict[str, int] = {}
        self.stale_once = set(stale_once)
        self._numbers = itertools.count(1)
        self.lock = threading.Lock()

    def challenge(self, stale: bool = False) -> str:
        nonce = f"n{next(self._numbers)}x{threading.get_ident()}"
        self.uses[nonce] = 0
        return (f'Digest realm="{REALM}", qop="auth", nonce="{nonce}", algorithm=MD5, '
                f'opaque="op"' + (", stale=true" if stale else ""))

    def check(self, header: str | None, method: str, uri: str) -> str | None:
        """None if ``header`` answers a live nonce rightly; else the challenge to send."""
        with self.lock:
            if not header or not header.startswith("Digest "):
                return self.challenge()
            p = dict((k, a or b) for k, a, b in
                     re.findall(r'(\w+)=(?:"([^"]*)"|([^\s,]+))', header))
            nonce = p.get("nonce", "")
            if nonce not in self.uses or p.get("uri") != uri or p.get("username") != USER:
                return self.challenge()
            ha1 = _md5(f"{USER}:{REALM}:{PASSWORD}")
            ha2 = _md5(f"{method}:{uri}")
            want = _md5(f"{ha1}:{nonce}:{p.get('nc')}:{p.get('cnonce')}:auth:{ha2}")
            if p.get("response") != want or p.get("opaque") != "op":
                return self.challenge()
            if self.uses[nonce] >= NONCE_USES or uri in self.stale_once:
                self.stale_once.discard(uri)
                return self.challenge(stale=True)
            self.uses[nonce] += 1
            return None


class AuthSite:
    """``with AuthSite() as site: site.url``; ``site.seen[path]``: header dicts, in order."""

    def __init__(self, *, digest: bool = False, stale_once: frozenset[str] = frozenset()
                 ) -> None:
        self.seen: dict[str, list[dict[str, str]]] = defaultdict(list)
        self.digest = DigestServer(stale_once) if digest else None
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
                    challenge = None
                    if site.digest is not None:
                        challenge = site.digest.check(headers.get("authorization"), "GET",
                                                      self.path)
                    elif headers.get("authorization") != BASIC:
                        challenge = 'Basic realm="test"'
                    if challenge is not None:
                        status, body = 401, b"who are you?"
                        extra.append(("WWW-Authenticate", challenge))
                    elif path == "/private/pixel.png":
                        body, kind = PIXEL, "image/png"
                    elif path == "/private":
                        body, kind = PRIVATE, "text/html"
                    else:
                        body = b"private page " + path.encode()
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
