"""A deterministic website served on 127.0.0.1, for crawler tests, benchmarks and the demo.

The site is generated from a ``SiteConfig``; nothing is read from disk and only the
standard library is used. The server's own request log is the ground truth a crawler
test compares its store against.

What it serves (defaults in brackets):

- ``/`` — the home page. Links to the first ``links_per_page`` pages, to every
  redirect chain head (``/old``), to every configured special path that is not a page,
  and, from content version 2 on, to the new page.
- ``/p/0`` .. ``/p/{pages-1}`` [50 pages] — HTML pages. Page *i* links to
  ``links_per_page`` [4] other pages, taken in order from ``(2i+1)%n``, ``(2i+2)%n``,
  ``(7i+3)%n``, ``(i+1)%n`` and then ``(i+d)%n``, and always to ``/``. With two or more
  links per page every page is reachable from ``/`` and the link graph has cycles.
  A few pages also link to each ``private_links`` path [``/private/a``, ``/private/b``]
  and each ``not_found`` path [``/missing/a``, ``/missing/b``, answered 404].
- ``/robots.txt`` — ``robots_txt`` verbatim [``Disallow: /private/`` for every agent],
  then ``Crawl-delay`` if ``crawl_delay`` is set, then a ``Sitemap`` line. With
  ``robots_txt=None`` it answers 404. The private pages themselves answer 200, so a
  crawler that ignores robots.txt is caught by the request log.
- ``/sitemap.xml`` — every page in ``reachable_pages()``, with ``lastmod`` and
  ``changefreq``.
- ``redirects`` [``/old`` → ``/moved`` → ``/p/1``] answer 301 with ``Location`` set to
  the configured target as written (a path: the client resolves it).
- Faults, per path, applied in this order before anything else: ``kill_paths`` (the
  request is logged, then the connection is held for ``hold_seconds`` before the normal
  answer), ``slow`` (sleep, then the normal answer), ``rate_limited`` (the first *n*
  requests get 429 with ``Retry-After``; a fractional delay is written as e.g. ``0.5``,
  which is not standard HTTP), ``flaky`` (the first *n* requests get 500). A configured
  path that is not a page is served as a small HTML page linked from ``/``. ``large``
  pads an HTML document to exactly that many bytes. ``drip`` sends the response head at
  once, then the body one byte every so many seconds (a server that never stalls long
  enough for a per-read timeout, and never finishes): a crawler's total deadline ends it.

Every 200 document carries ``Content-Type``, ``Content-Length``, a strong ``ETag``
(a hash of the body) and ``Last-Modified`` (except the ``unvalidated`` paths, which get
neither and never answer 304); ``If-None-Match`` (which takes precedence)
and ``If-Modified-Since`` produce 304. Connections are HTTP/1.1 keep-alive; GET and
HEAD are served, other methods get 405. Paths are matched exactly as sent: the query
string is ignored and nothing is percent-decoded.

Content versions: ``set_version(v)`` swaps the site atomically while it serves. Each
page shows the *content revision* it last changed in, so unchanged pages keep their
bytes, ETag and Last-Modified. Version *k* >= 2 rewrites the text of pages with
``i % 4 == (k-1) % 4``. From version 2 on, every link to one page (the highest-numbered
page that is not a redirect target or a special path) is removed, orphaning it (it
still answers 200 if requested), and a new page ``/p/{pages}`` appears, linked from
``/`` and ``/p/0``. The home page shows the site version, so it changes every time.
Last-Modified is an hour before start for version 1 and the wall-clock second of the
``set_version`` call (always later than any earlier stamp) for changed documents.

Ground truth: ``reachable_pages()`` is computed from the config, not the log: the paths
a crawler that starts at ``/``, obeys robots.txt (as ``urllib.robotparser`` reads it,
for user agent ``*``), follows local redirects and retries faults until they clear
would end with a 200 for. It excludes ``/robots.txt``, ``/sitemap.xml``, redirect
sources, 404s, disallowed paths and orphans. ``disallowed_paths()`` are the paths that
crawler discovers but must not fetch.

Usage::

    from evidence._demo.site import SiteConfig, TestSite

    with TestSite(SiteConfig(pages=20, flaky={"/p/3": 2})) as site:
        crawl(site.url)                      # e.g. "http://127.0.0.1:40123/"
        assert fetched_ok == site.reachable_pages()
        assert site.request_counts()["/private/a"] == 0
        site.set_version(2)                  # the next session sees changed content

From a shell (serves until Ctrl-C, printing the URL on the first line of stdout)::

    python -m evidence._demo.site --port 8765 --pages 200
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import socket
import socketserver
import sys
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from email.utils import formatdate, parsedate_to_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit
from xml.sax.saxutils import escape as xml_escape

from .layout import (
    DEFAULT_ROBOTS_TXT,
    HTML_TYPE,
    ROBOTS_PATH,
    SITEMAP_PATH,
    Layout,
    SiteConfig,
    page_index,
    render_page,
    sort_key,
)

__all__ = ["DEFAULT_ROBOTS_TXT", "Request", "SiteConfig", "TestSite", "demo_tally", "main"]

HOST = "127.0.0.1"
_TEXT = "text/plain; charset=utf-8"
_XML = "application/xml; charset=utf-8"
_MAX_DISCARD = 1 << 20  # request bodies up to this size are read and dropped


@dataclass(frozen=True, slots=True)
class _Resource:
    body: bytes
    content_type: str
    etag: str
    last_modified: int

    @property
    def http_date(self) -> str:
        return formatdate(self.last_modified, usegmt=True)


@dataclass(frozen=True, slots=True)
class _Snapshot:
    version: int
    resources: Mapping[str, _Resource]


@dataclass(frozen=True, slots=True)
class Request:
    """One entry of the request log.

    ``path`` is the request target as sent (path and query). ``headers`` has lowercase
    names; repeated fields are joined with ``", "``. ``time`` is ``time.time()`` when the
    request line and headers had been read. ``status`` is None until the answer is chosen
    (a request still held or delayed, or abandoned by ``stop()``). ``connection`` numbers
    the TCP connections from 1, so keep-alive reuse is visible.
    """

    method: str
    path: str
    headers: Mapping[str, str]
    time: float
    status: int | None
    connection: int = 0


def _etag_matches(header: str, etag: str) -> bool:
    """Weak comparison, as If-None-Match requires."""
    if header.strip() == "*":
        return True
    bare = etag.removeprefix("W/")
    return any(t.strip().removeprefix("W/") == bare for t in header.split(","))


def _not_modified_since(header: str, last_modified: int) -> bool:
    try:
        when = parsedate_to_datetime(header)
    except (TypeError, ValueError, IndexError):
        return False
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return last_modified <= when.timestamp()


def _page(title: str, text: str) -> bytes:
    return render_page(title, [text], ["/"], None)


_Response = tuple[int, list[tuple[str, str]], bytes]


class TestSite:
    """Serves a ``SiteConfig`` on 127.0.0.1 from a background thread; a context manager."""

    __test__ = False  # a pytest collection hint, not a test class

    def __init__(self, config: SiteConfig | None = None, *, port: int = 0) -> None:
        self.config = config if config is not None else SiteConfig()
        self.kill_paths: set[str] = set(self.config.kill_paths)
        """Paths whose requests are held; may be changed while serving."""
        self._wanted_port = port
        self._version = self.config.version
        self._lock = threading.Lock()
        self._logged = threading.Condition(self._lock)
        self._build_lock = threading.Lock()
        self._log: list[Request] = []
        self._faults: Counter[tuple[str, str]] = Counter()
        self._stopping = threading.Event()
        self._conns: set[socket.socket] = set()
        self._conn_ids = itertools.count(1)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._snapshot: _Snapshot | None = None
        self._stamp = 0
        self._layouts: dict[int, Layout] = {}

    # lifecycle

    def start(self) -> TestSite:
        """Bind 127.0.0.1 and serve in a daemon thread. A site starts once."""
        if self._server is not None:
            raise RuntimeError("this TestSite was already started")
        server = _Server((HOST, self._wanted_port), _Handler)
        server.site = self
        self._server = server
        self._stamp = int(time.time()) - 3600
        try:
            self._rebuild(self._version, first=True)
        except BaseException:
            server.server_close()
            self._server = None
            raise
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"TestSite:{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving: held and delayed requests are dropped, open connections closed."""
        server = self._server
        if server is None or self._stopping.is_set():
            return
        with self._lock:
            self._stopping.set()
            conns = list(self._conns)
        server.shutdown()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        server.server_close()
        assert self._thread is not None
        self._thread.join()

    def __enter__(self) -> TestSite:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the site is not started")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """The home page, e.g. ``http://127.0.0.1:40123/``."""
        return f"http://{HOST}:{self.port}/"

    def url_for(self, path: str) -> str:
        return f"http://{HOST}:{self.port}{path}"

    # content

    @property
    def version(self) -> int:
        return self._version

    def set_version(self, version: int) -> None:
        """Serve content version *version* from the next request on."""
        if version < 1:
            raise ValueError("version must be at least 1")
        self._version = version
        if self._server is not None:
            self._rebuild(version, first=False)

    def _layout(self, version: int | None) -> Layout:
        v = self._version if version is None else version
        layout = self._layouts.get(v)
        if layout is None:
            layout = self._layouts.setdefault(v, Layout(self.config, v))
        return layout

    def reachable_pages(self, version: int | None = None) -> frozenset[str]:
        """Paths a robots-obeying crawler starting at ``/`` ends with a 200 for."""
        return self._layout(version).walk[0]

    def disallowed_paths(self, version: int | None = None) -> frozenset[str]:
        """Paths that crawler discovers (links, redirect targets) but robots.txt forbids."""
        return self._layout(version).walk[1]

    def links(self, path: str, version: int | None = None) -> tuple[str, ...]:
        """The hrefs of the HTML document at *path*, in page order; () for anything else."""
        return self._layout(version).links.get(path, ())

    def robots_body(self) -> str | None:
        """The robots.txt text as served (it names the sitemap's absolute URL)."""
        cfg = self.config
        if cfg.robots_txt is None:
            return None
        text = cfg.robots_txt
        if text and not text.endswith("\n"):
            text += "\n"
        if cfg.crawl_delay is not None:
            text += f"Crawl-delay: {cfg.crawl_delay:g}\n"
        if cfg.sitemap_in_robots:
            text += f"\nSitemap: {self.url_for(SITEMAP_PATH)}\n"
        return text

    def _rebuild(self, version: int, *, first: bool) -> None:
        with self._build_lock:
            layout = self._layout(version)
            stamp = self._stamp if first else max(int(time.time()), self._stamp + 1)
            old = self._snapshot.resources if self._snapshot is not None else {}
            resources: dict[str, _Resource] = {}

            def add(path: str, body: bytes, content_type: str) -> None:
                etag = '"' + hashlib.blake2b(body, digest_size=12).hexdigest() + '"'
                prev = old.get(path)
                lm = prev.last_modified if prev is not None and prev.etag == etag else stamp
                resources[path] = _Resource(body, content_type, etag, lm)

            for path, (body, ctype) in layout.documents().items():
                add(path, body, ctype)
            robots = self.robots_body()
            if robots is not None:
                add(ROBOTS_PATH, robots.encode(), _TEXT)
            add(SITEMAP_PATH, self._sitemap(layout, resources), _XML)
            self._stamp = stamp
            self._snapshot = _Snapshot(version, MappingProxyType(resources))

    def _sitemap(self, layout: Layout, resources: Mapping[str, _Resource]) -> bytes:
        lines = ['<?xml version="1.0" encoding="UTF-8"?>',
                 '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">']
        for p in sorted(layout.walk[0], key=sort_key):
            i = page_index(p)
            freq = "daily" if p == "/" else "weekly" if i is not None and i % 4 else "monthly"
            lastmod = datetime.fromtimestamp(resources[p].last_modified, UTC)
            lines.append(f"  <url><loc>{xml_escape(self.url_for(p))}</loc>"
                         f"<lastmod>{lastmod:%Y-%m-%dT%H:%M:%SZ}</lastmod>"
                         f"<changefreq>{freq}</changefreq></url>")
        lines.append("</urlset>\n")
        return "\n".join(lines).encode()

    # the request log

    @property
    def requests(self) -> list[Request]:
        """A copy of the request log, in the order requests arrived."""
        with self._lock:
            return list(self._log)

    def request_counts(self, method: str | None = None) -> Counter[str]:
        """Requests per path (as sent), optionally only those with *method*."""
        with self._lock:
            return Counter(r.path for r in self._log if method is None or r.method == method)

    def clear_requests(self) -> None:
        """Empty the log (fault counters keep counting)."""
        with self._lock:
            self._log.clear()

    def wait_for_request(self, path: str, timeout: float = 10.0) -> Request:
        """Block until a request for *path* (as sent) is in the log; TimeoutError otherwise."""
        deadline = time.monotonic() + timeout
        with self._logged:
            while True:
                for r in self._log:
                    if r.path == path:
                        return r
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no request for {path} within {timeout} s")
                self._logged.wait(left)

    # serving (called from handler threads)

    def _register(self, conn: socket.socket) -> int:
        with self._lock:
            if self._stopping.is_set():
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
            self._conns.add(conn)
            return next(self._conn_ids)

    def _unregister(self, conn: socket.socket) -> None:
        with self._lock:
            self._conns.discard(conn)

    def _log_begin(self, entry: Request) -> int:
        with self._logged:
            self._log.append(entry)
            self._logged.notify_all()
            return len(self._log) - 1

    def _log_end(self, index: int, entry: Request, status: int) -> None:
        with self._lock:
            # clear_requests() may have run meanwhile; then the entry is gone
            if index < len(self._log) and self._log[index] is entry:
                self._log[index] = replace(entry, status=status)

    def _take_fault(self, kind: str, path: str, limit: int) -> bool:
        with self._lock:
            key = (kind, path)
            if self._faults[key] < limit:
                self._faults[key] += 1
                return True
            return False

    def _respond(self, method: str, path: str, headers: Mapping[str, str]) -> _Response | None:
        """The answer to one request, or None when the site stops while it waits."""
        cfg = self.config
        if method not in ("GET", "HEAD"):
            return 405, [("Allow", "GET, HEAD")], _page("Method not allowed", method)
        if path in self.kill_paths and self._stopping.wait(cfg.hold_seconds):
            return None
        delay = cfg.slow.get(path)
        if delay and self._stopping.wait(delay):
            return None
        limited = cfg.rate_limited.get(path)
        if limited is not None and self._take_fault("429", path, limited[0]):
            return 429, [("Retry-After", f"{limited[1]:g}")], _page("Too many requests", path)
        failures = cfg.flaky.get(path)
        if failures is not None and self._take_fault("500", path, failures):
            return 500, [], _page("Internal server error", path)
        target = cfg.redirects.get(path)
        if target is not None:
            return 301, [("Location", target)], _page("Moved permanently", target)
        snapshot = self._snapshot
        assert snapshot is not None
        res = snapshot.resources.get(path)
        if res is None:
            return 404, [], _page("Not found", path)
        if path in cfg.unvalidated:  # no validators: a crawler must compare checksums
            return 200, [("Content-Type", res.content_type)], res.body
        validators = [("ETag", res.etag), ("Last-Modified", res.http_date)]
        inm = headers.get("if-none-match")
        ims = headers.get("if-modified-since")
        if (_etag_matches(inm, res.etag) if inm is not None
                else ims is not None and _not_modified_since(ims, res.last_modified)):
            return 304, validators, b""
        return 200, [("Content-Type", res.content_type), *validators], res.body

    def _serve(self, handler: _Handler) -> None:
        target = handler.path
        if target.startswith("/"):
            path = target.split("?", 1)[0].split("#", 1)[0]
        else:  # absolute-form request target
            path = urlsplit(target).path or "/"
        headers: dict[str, str] = {}
        for name, value in handler.headers.items():
            key = name.lower()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        handler.discard_body(headers)
        entry = Request(handler.command, target, MappingProxyType(headers), time.time(), None,
                        handler.conn_id)
        index = self._log_begin(entry)
        answer = self._respond(handler.command, path, headers)
        if answer is None:
            handler.close_connection = True
            return
        status, extra, body = answer
        self._log_end(index, entry, status)
        handler.send_response(status)
        if status == 304:
            for name, value in extra:
                handler.send_header(name, value)
        else:
            if not any(name == "Content-Type" for name, _ in extra):
                handler.send_header("Content-Type", HTML_TYPE)
            for name, value in extra:
                handler.send_header(name, value)
            handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        if body and handler.command != "HEAD":
            interval = self.config.drip.get(path) if status == 200 else None
            if interval is None:
                handler.wfile.write(body)
                return
            handler.wfile.flush()
            for i in range(len(body)):  # one byte at a time, until the site stops
                handler.wfile.write(body[i:i + 1])
                if self._stopping.wait(interval):
                    handler.close_connection = True
                    return


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256
    site: TestSite

    def server_bind(self) -> None:
        # HTTPServer.server_bind looks up the host's FQDN, which can stall; skip it.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            return  # clients hanging up are normal here
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "evidence-testsite/1"
    sys_version = ""
    disable_nagle_algorithm = True
    timeout = 120  # idle keep-alive connections are closed after this
    server: _Server
    conn_id = 0

    def setup(self) -> None:
        super().setup()
        self.conn_id = self.server.site._register(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.site._unregister(self.connection)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the in-memory log is the only access log

    def discard_body(self, headers: Mapping[str, str]) -> None:
        """Read and drop a request body so the connection can carry the next request."""
        if "transfer-encoding" in headers:
            self.close_connection = True
            return
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError:
            length = -1
        if 0 < length <= _MAX_DISCARD:
            self.rfile.read(length)
        elif length != 0:
            self.close_connection = True

    def do_GET(self) -> None:
        self.server.site._serve(self)

    do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_GET


# command line


def _pairs(values: Sequence[str], convert: Any, what: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in values:
        path, sep, value = item.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"expected PATH={what}, got {item!r}")
        out[path] = convert(value)
    return out


def _rate(value: str) -> tuple[int, float]:
    count, _, seconds = value.partition(":")
    return int(count), float(seconds or 1)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m evidence._demo.site",
        description="Serve the deterministic evidence test site on 127.0.0.1 until Ctrl-C. "
                    "The URL is printed on the first line of stdout.")
    parser.add_argument("--port", type=int, default=8765, help="port to bind; 0 picks a free "
                        "one (default 8765)")
    parser.add_argument("--pages", type=int, default=50, help="number of /p/N pages (50)")
    parser.add_argument("--links-per-page", type=int, default=4, help="page links per page (4)")
    parser.add_argument("--content-version", type=int, default=1,
                        help="content version to serve (1)")
    parser.add_argument("--crawl-delay", type=float, default=None,
                        help="add a Crawl-delay line to robots.txt")
    parser.add_argument("--no-robots", action="store_true", help="answer 404 for robots.txt")
    parser.add_argument("--flaky", action="append", default=[], metavar="PATH=N",
                        help="answer 500 to the first N requests for PATH")
    parser.add_argument("--rate-limited", action="append", default=[],
                        metavar="PATH=N:SECONDS",
                        help="answer 429 with Retry-After SECONDS to the first N requests")
    parser.add_argument("--slow", action="append", default=[], metavar="PATH=SECONDS",
                        help="wait SECONDS before answering PATH")
    parser.add_argument("--large", action="append", default=[], metavar="PATH=BYTES",
                        help="pad the page at PATH to BYTES bytes")
    parser.add_argument("--drip", action="append", default=[], metavar="PATH=SECONDS",
                        help="send PATH's body one byte every SECONDS")
    args = parser.parse_args(argv)
    try:
        config = SiteConfig(
            pages=args.pages, links_per_page=args.links_per_page, version=args.content_version,
            crawl_delay=args.crawl_delay,
            robots_txt=None if args.no_robots else DEFAULT_ROBOTS_TXT,
            flaky=_pairs(args.flaky, int, "N"),
            rate_limited=_pairs(args.rate_limited, _rate, "N:SECONDS"),
            slow=_pairs(args.slow, float, "SECONDS"),
            large=_pairs(args.large, int, "BYTES"),
            drip=_pairs(args.drip, float, "SECONDS"))
        site = TestSite(config, port=args.port).start()
    except (ValueError, argparse.ArgumentTypeError) as exc:
        parser.error(str(exc))
    except OSError as exc:
        print(f"cannot serve on {HOST}:{args.port}: {exc}", file=sys.stderr)
        return 1
    print(site.url, flush=True)
    print(f"serving {len(site.reachable_pages())} reachable pages, content version "
          f"{site.version}; Ctrl-C to stop", file=sys.stderr, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        site.stop()
    print(f"stopped after {len(site.requests)} requests", file=sys.stderr, flush=True)
    return 0



def demo_tally(conn, session_id: str) -> dict[str, int]:
    """The demo site's URLs the session settled as done, counted the way the demo announced
    them (the site's paths are fixed: /, /p/N, redirects answer 301, broken links 404)."""
    from urllib.parse import urlsplit

    found = {"home": 0, "pages": 0, "redirects": 0, "broken": 0}
    for url, reason in conn.execute("SELECT url, reason FROM frontier WHERE session_id = ? "
                                    "AND state = 'done'", (session_id,)):
        path = urlsplit(url).path
        if reason == "HTTP 404":
            found["broken"] += 1
        elif reason.startswith("HTTP 3"):
            found["redirects"] += 1
        elif path == "/":
            found["home"] += 1
        elif path.startswith("/p/"):
            found["pages"] += 1
    return found


if __name__ == "__main__":
    raise SystemExit(main())
