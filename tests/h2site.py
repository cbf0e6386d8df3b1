"""An HTTPS site on 127.0.0.1 served by Hypercorn (a tiny ASGI app), for the HTTP/2 tests
(issue 33, point 2), with a throwaway certificate authority (``tests.testca``).

    /           an HTML page linking to /data and /gz
    /data       64 KiB of text (more than one DATA frame)
    /gz         a gzip-coded text (the content is derived from the body)
    /post       POST: ``posted <body>``
    /scripted   a page whose script loads /data by fetch() and writes its length

``h2_only``: the TLS layer offers ALPN ``h2`` only and the app refuses any other protocol
with 505 (HTTP Version Not Supported), as a server that speaks only HTTP/2 does. Otherwise
it offers ``h2, http/1.1``. Each request's protocol is noted (``seen``: (version, path)).
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import socket
import threading
from pathlib import Path
from typing import Any

from hypercorn.asyncio import serve
from hypercorn.config import Config

from .testca import make_authority

PAGE = b"<!doctype html><title>Over h2</title><a href='/data'>data</a> <a href='/gz'>gz</a>"
DATA = b"".join(b"line %05d of the data\n" % i for i in range(2979))  # 68,517 bytes
TEXT = b"gzip-coded text, " * 64
SCRIPTED = (b"<!doctype html><title>Rendered over h2</title><p id='out'>waiting</p><script>"
            b"fetch('/data').then(r => r.text()).then(t => {"
            b"document.getElementById('out').textContent = 'loaded ' + t.length; });"
            b"</script>")


class H2Site:
    """Serves the app above from a background thread; a context manager."""

    __test__ = False

    def __init__(self, directory: Path, *, h2_only: bool) -> None:
        self.ca_file, _ = make_authority(directory)
        self.h2_only = h2_only
        self.seen: list[tuple[str, str]] = []
        config = Config()
        config.bind = ["127.0.0.1:0"]
        config.certfile = str(directory / "server.pem")
        config.keyfile = str(directory / "server.key")
        config.alpn_protocols = ["h2"] if h2_only else ["h2", "http/1.1"]
        config.accesslog = config.errorlog = None
        config.loglevel = "ERROR"
        self._config = config
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._ready = threading.Event()
        self.port = 0

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}/"

    async def _app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        path, version = scope["path"], scope["http_version"]
        self.seen.append((version, path))
        headers = [(b"content-type", b"text/html; charset=utf-8")]
        if self.h2_only and version != "2":
            status, answer = 505, b"HTTP/2 only"
        elif path == "/":
            status, answer = 200, PAGE
        elif path == "/scripted":
            status, answer = 200, SCRIPTED
        elif path == "/data":
            status, answer = 200, DATA
            headers = [(b"content-type", b"text/plain")]
        elif path == "/gz":
            status, answer = 200, gzip.compress(TEXT, mtime=0)
            headers = [(b"content-type", b"text/plain"), (b"content-encoding", b"gzip")]
        elif path == "/post" and scope["method"] == "POST":
            status, answer = 200, b"posted " + body
            headers = [(b"content-type", b"text/plain")]
        else:
            status, answer = 404, b"not found"
        headers.append((b"x-served-over", version.encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": answer})

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def main() -> None:
            self._stop = asyncio.Event()
            self._ready.set()
            await serve(self._app, self._config,  # type: ignore[arg-type]
                        shutdown_trigger=self._stop.wait)

        self._loop.run_until_complete(main())
        self._loop.close()

    def __enter__(self) -> H2Site:
        # The listening socket is made here (its port known before the server runs) and
        # handed to Hypercorn by its descriptor.
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.bind(("127.0.0.1", 0))
        self._socket.listen(64)
        self.port = self._socket.getsockname()[1]
        self._config.bind = [f"fd://{self._socket.fileno()}"]
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the HTTP/2 test site did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        with contextlib.suppress(OSError):  # Hypercorn closed it (it took the descriptor)
            self._socket.close()
