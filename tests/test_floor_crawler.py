"""tools/floor_crawler.py, the benchmarks' floor: it must crawl what every other crawler
crawls, or its figures mean nothing.

A real HTTP/1.1 server on 127.0.0.1 (asyncio streams, in the test's own event loop) frames
its bodies every way the floor reads them (Content-Length, chunked with a trailer,
delimited by the close), closes a kept-alive connection after one of them, and serves a
robots.txt that refuses a path: the crawl must fetch each allowed page once, never the
refused one, and follow the links evidence follows (``a``, ``area``, ``link``; the first
``base[href]``).
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from collections import Counter
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parent.parent / "tools" / "floor_crawler.py"


def _floor():  # the tool is a script, not a module of the package
    spec = importlib.util.spec_from_file_location("floor_crawler", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("floor_crawler", module)
    spec.loader.exec_module(module)
    return module


HTML = b"text/html; charset=utf-8"
PAGES = {
    "/robots.txt": (b"text/plain", b"User-agent: *\nDisallow: /private/\n"),
    "/": (HTML, b'<a href="/length">1</a><a href="chunked#frag">2</a>'
                b'<a href="/private/no">3</a><a href="http://elsewhere.test/">4</a>'
                b'<area href="/closing"><link rel="next" href="/missing">'),
    "/length": (HTML, b'<base href="/dir/"><a href="under">u</a><a href="/">home</a>'),
    "/chunked": (HTML, b'<a href="/length#again">again</a>'),
    "/closing": (HTML, b"<p>the server closes after this one</p>"),
    "/dir/under": (HTML, b'<a href="/untold">closed body</a>'),
    "/untold": (HTML, b"<p>delimited by the close</p>"),
    "/private/no": (HTML, b"<p>refused by robots.txt</p>"),
}


async def _serve(requested: list[str], connections: list[int]):
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return
                path = head.split(b" ", 2)[1].decode()
                requested.append(path)
                if path not in PAGES:
                    writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                    await writer.drain()
                    continue
                kind, body = PAGES[path]
                fields = b"HTTP/1.1 200 OK\r\nContent-Type: " + kind + b"\r\n"
                if path == "/chunked":
                    half = len(body) // 2
                    writer.write(fields + b"Transfer-Encoding: chunked\r\n\r\n"
                                 + b"%x\r\n%s\r\n" % (half, body[:half])
                                 + b"%x;ext=1\r\n%s\r\n" % (len(body) - half, body[half:])
                                 + b"0\r\nX-Trailer: yes\r\n\r\n")
                elif path == "/untold":
                    writer.write(fields + b"\r\n" + body)
                    await writer.drain()
                    return  # the body ends with the connection
                else:
                    close = b"Connection: close\r\n" if path == "/closing" else b""
                    writer.write(fields + close + b"Content-Length: %d\r\n\r\n" % len(body)
                                 + body)
                    if close:
                        await writer.drain()
                        return
                await writer.drain()
        finally:
            writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


def test_the_floor_fetches_every_allowed_page_once_however_its_body_is_framed() -> None:
    floor = _floor()
    requested: list[str] = []
    connections: list[int] = []

    async def main() -> dict:
        server = await _serve(requested, connections)
        port = server.sockets[0].getsockname()[1]
        async with server:
            return await floor.crawl(f"http://127.0.0.1:{port}/", 2)

    stats = asyncio.run(main())
    assert Counter(requested) == Counter(["/robots.txt", "/", "/length", "/chunked",
                                          "/closing", "/missing", "/dir/under", "/untold"])
    assert stats["pages"] == 7 and stats["status_200"] == 7 and stats["errors"] == 0
    assert stats["bytes"] == sum(len(PAGES[p][1]) for p in set(requested) - {
        "/robots.txt", "/missing"})
    assert len(connections) < len(requested)  # kept alive between requests


def test_the_floor_refuses_a_start_url_off_this_machine(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as refused:
        _floor().main(["http://192.0.2.1/"])
    assert refused.value.code == 2 and "127.0.0.1" in capsys.readouterr().err
