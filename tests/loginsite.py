"""A site on 127.0.0.1 behind a form login with a CSRF token, whose sessions expire.

    /login           a form: a hidden CSRF token (one use, bound to the pre-session cookie
                     it sets), #user, #pass and a #go button; POST checks all three, then
                     sets the cookie sid (a new session) and redirects (303) to /account
    /account         with a live session: #logout and links to /page/1 .. /page/PAGES,
                     and a script that keeps the session's API token and the user's name
                     in localStorage (``token``, ``who``); without one: a redirect (302)
                     to /login
    /app             a page whose content needs that token: its script sends it (X-Token,
                     and the name as X-User) to /api/items and lists the answer in #items;
                     without a token it says "no token", with a wrong one "refused"
    /api/items       the items (JSON) for a valid X-Token, else 401
    /page/N          the same rule: a small page that says who is logged in
    /favicon.ico     404, whoever asks (a browser does, unasked)
    /gone/N          with a live session, answers 200 "Please log in" anyway (a site that
                     says it in the page rather than with a redirect)
    /feed            the same rule: a feed that says whose it is and shows FEED_PAGE items;
                     scrolling near its bottom loads /feed/more?page=2, then 3 (JSON), each
                     FEED_PAGE more items (infinite scroll behind the login)

A session answers ``session_requests`` requests, then is over (the next request with it is
redirected to /login), as sessions that expire do. ``logins`` counts the POSTs that logged
in; ``posts`` keeps each POST's body, so a test can say what the form sent.
"""

from __future__ import annotations

import json
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

USER, PASSWORD = "carol", "pa ss&word"  # a space and '&': form-encoded as the form sends
PAGES = 6
FEED_PAGE, FEED_PAGES = 3, 3  # items per screen; screens (the first, then two by scrolling)

FEED = """<!doctype html><html><head><title>Feed</title></head><body>
<a id="logout" href="/logout">out</a><p id="who">feed of %s</p><div id="items">%s</div>
<script>
  const list = document.getElementById('items');
  let page = 1, loading = false;
  window.addEventListener('scroll', () => {
    if (loading || page >= %d) return;
    if (window.scrollY + window.innerHeight < document.body.scrollHeight - 600) return;
    loading = true;
    fetch('/feed/more?page=' + (page + 1)).then((r) => r.json()).then((numbers) => {
      numbers.forEach((n) => {
        const p = document.createElement('p');
        p.className = 'item'; p.style.height = '700px'; p.textContent = 'item ' + n;
        list.appendChild(p);
      });
      page += 1; loading = false;
    });
  });
</script></body></html>"""


def feed_items(page: int) -> list[int]:
    return list(range((page - 1) * FEED_PAGE + 1, page * FEED_PAGE + 1))

APP = """<!doctype html><html><head><title>App</title></head><body><ul id="items"></ul>
<script>
  const list = document.getElementById('items');
  const token = localStorage.getItem('token');
  if (!token) {
    list.innerHTML = '<li id="none">no token</li>';
  } else {
    fetch('/api/items', {headers: {'X-Token': token, 'X-User': localStorage.getItem('who')}})
      .then((r) => r.ok ? r.json() : Promise.reject(r.status))
      .then((items) => items.forEach((text) => {
        const li = document.createElement('li'); li.className = 'item'; li.textContent = text;
        list.appendChild(li);
      }))
      .catch(() => { list.innerHTML = '<li id="none">refused</li>'; });
  }
</script></body></html>"""
APP_ITEMS = ["ledger 2026", "payroll Q3"]

FORM = """<!doctype html><html><head><title>Sign in</title></head><body>
<form method="post" action="/login">
<input type="hidden" name="csrf" value="%s">
<input id="user" name="user"> <input id="pass" name="pass" type="password">
<button id="go" type="submit">Sign in</button></form></body></html>"""


class LoginSite:
    """``with LoginSite(session_requests=K) as site: site.url``."""

    def __init__(self, *, session_requests: int = 4) -> None:
        self.session_requests = session_requests
        self.sessions: dict[str, int] = {}  # sid -> requests left
        self.tokens: dict[str, str] = {}  # csrf token -> the pre-session it belongs to
        self.logins = 0
        self.posts: list[bytes] = []
        self.api_tokens: dict[str, str] = {}  # sid -> the API token its /account handed out
        self.api_calls: list[tuple[str, str, bool]] = []  # (X-Token, X-User, valid)
        self.paths: list[tuple[str, bool]] = []  # (path, with a live session)
        self.lock = threading.Lock()
        site = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _cookies(self) -> dict[str, str]:
                return dict(p.strip().split("=", 1) for p in
                            self.headers.get("Cookie", "").split(";") if "=" in p)

            def _send(self, status: int, body: bytes, *extra: tuple[str, str]) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                for name, value in extra:
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                if path == "/favicon.ico":  # not behind the login: the browser asks for it
                    self._send(404, b"")
                    return
                if path == "/api/items":
                    token, user = self.headers.get("X-Token", ""), self.headers.get("X-User", "")
                    with site.lock:
                        valid = token in site.api_tokens.values()
                        site.api_calls.append((token, user, valid))
                    body = json.dumps(APP_ITEMS).encode() if valid else b"[]"
                    self.send_response(200 if valid else 401)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                if path == "/login":
                    pre, token = secrets.token_hex(8), secrets.token_hex(16)
                    with site.lock:
                        site.tokens[token] = pre
                    self._send(200, (FORM % token).encode(), ("Set-Cookie", f"pre={pre}"))
                    return
                sid = self._cookies().get("sid", "")
                with site.lock:
                    live = site.sessions.get(sid, 0) > 0
                    if live:
                        site.sessions[sid] -= 1
                    site.paths.append((path, live))
                if not live:
                    self._send(302, b"", ("Location", "/login"))
                elif path == "/account":
                    links = " ".join(f'<a href="/page/{n}">{n}</a>' for n in range(1, PAGES + 1))
                    with site.lock:
                        token = site.api_tokens.setdefault(sid, secrets.token_hex(12))
                    keep = (f"<script>localStorage.setItem('token', '{token}'); "
                            f"localStorage.setItem('who', '{USER}');</script>")
                    self._send(200, f'<html><body><a id="logout" href="/logout">out</a> '
                               f'{links} <a href="/gone/1">g</a>{keep}</body></html>'.encode())
                elif path == "/app":
                    self._send(200, APP.encode())
                elif path == "/feed":
                    items = "".join(f'<p class="item" style="height: 700px">item {n}</p>'
                                    for n in feed_items(1))
                    self._send(200, (FEED % (USER, items, FEED_PAGES)).encode())
                elif path == "/feed/more":
                    page = int(parse_qs(self.path.partition("?")[2]).get("page", ["0"])[0])
                    body = json.dumps(feed_items(page) if 1 < page <= FEED_PAGES else [])
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body.encode())
                elif path.startswith("/gone/"):
                    self._send(200, b"<html><body>Please log in</body></html>")
                else:
                    self._send(200, f"<html><body>page {path} for {USER}</body></html>".encode())

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
                with site.lock:
                    site.posts.append(body)
                    pre = site.tokens.pop(form.get("csrf", ""), None)
                    ok = (pre is not None and pre == self._cookies().get("pre")
                          and form.get("user") == USER and form.get("pass") == PASSWORD)
                    if ok:
                        sid = secrets.token_hex(16)
                        site.sessions[sid] = site.session_requests
                        site.logins += 1
                if not ok:
                    self._send(403, b"<html><body>bad login</body></html>")
                    return
                self._send(303, b"", ("Location", "/account"), ("Set-Cookie", f"sid={sid}"))

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> LoginSite:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
