#!/usr/bin/env python3
"""The floor: a crawler on raw asyncio streams that does what any crawler must, and no more.

    python tools/floor_crawler.py http://127.0.0.1:PORT/ --concurrency 8

Stricter than ``tools/bare_crawler.py`` (httpx + lexbor): no HTTP library at all. Each of
``--concurrency`` tasks owns one keep-alive HTTP/1.1 connection (``asyncio.open_connection``)
and takes URLs from one queue: it writes the request (``GET``, ``Host``, ``User-Agent``,
``Connection: keep-alive``, no compression asked), reads the head up to its blank line,
then the body as the head frames it (``Content-Length``, ``Transfer-Encoding: chunked``
with its trailers, or until the close), and connects again when the server closes or says
``Connection: close``. robots.txt is fetched first and obeyed (protego, the parser
evidence uses). Each HTML page is parsed whole by selectolax's lexbor, as evidence parses
it, and its links followed as evidence follows them (``a``, ``area`` and ``link`` with an
``href``; the first ``base[href]`` applies), resolved against the page, fragment dropped,
the start URL's host only, each URL fetched once. Nothing is stored: no bodies, no
frontier, no log. Prints one JSON line: pages fetched, 200 responses (robots.txt included),
bytes read, errors, seconds.

Not a general client: plain http only, no redirects followed, no proxies, no TLS. It is the
measure of the work a page costs before anything is recorded (``tools/bench_crawl.py``
reports every crawler's CPU per page against it).

127.0.0.1 only, as every tool here: the start URL must be on it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from urllib.parse import urldefrag, urljoin, urlsplit

from protego import Protego
from selectolax.lexbor import LexborHTMLParser

USER_AGENT = "floor-crawler/1.0"
MAX_HEAD = 64 * 1024
LINKS = "a[href], area[href], link[href]"


class Closed(Exception):
    """The server closed the connection before a whole response."""


class Connection:
    """One keep-alive HTTP/1.1 connection to the start URL's host, made when needed."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.authority = host if port == 80 else f"{host}:{port}"
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def get(self, target: str) -> tuple[int, dict[bytes, bytes], bytes]:
        """(status, header fields by lower-case name, body) of ``GET target``; a request
        over a kept-alive connection the server had closed is sent once more, on a new
        one."""
        for again in (True, False):
            fresh = self.writer is None
            if fresh:
                self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
            try:
                return await self._exchange(target)
            except (Closed, ConnectionError):
                self.close()
                if fresh or not again:
                    raise
        raise AssertionError("unreachable")

    async def _exchange(self, target: str) -> tuple[int, dict[bytes, bytes], bytes]:
        assert self.reader is not None and self.writer is not None
        self.writer.write(f"GET {target} HTTP/1.1\r\nHost: {self.authority}\r\n"
                          f"User-Agent: {USER_AGENT}\r\nConnection: keep-alive\r\n\r\n"
                          .encode("latin-1"))
        reader = self.reader
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            raise Closed("no response head") from exc
        except asyncio.LimitOverrunError as exc:
            raise Closed("a response head over the stream's limit") from exc
        lines = head[:-4].split(b"\r\n")
        version, _, rest = lines[0].partition(b" ")
        status = int(rest[:3])
        fields: dict[bytes, bytes] = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            key = name.strip().lower()
            fields[key] = (fields[key] + b", " + value.strip()) if key in fields \
                else value.strip()
        try:
            if b"chunked" in fields.get(b"transfer-encoding", b"").lower():
                body = await self._chunked(reader)
            elif b"content-length" in fields:
                body = await reader.readexactly(int(fields[b"content-length"]))
            elif status in (204, 304) or 100 <= status < 200:
                body = b""
            else:
                body = await reader.read()  # delimited by the close
                self.close()
        except asyncio.IncompleteReadError as exc:
            raise Closed("the body was cut short") from exc
        if version != b"HTTP/1.1" or b"close" in fields.get(b"connection", b"").lower():
            self.close()
        return status, fields, body

    @staticmethod
    async def _chunked(reader: asyncio.StreamReader) -> bytes:
        parts = []
        while True:
            line = await reader.readuntil(b"\r\n")
            size = int(line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":
                    pass  # trailer fields, up to the blank line
                return b"".join(parts)
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)  # the chunk's CRLF

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


def charset(fields: dict[bytes, bytes]) -> str:
    """The content type's charset, if it names one Python knows, else UTF-8."""
    for param in fields.get(b"content-type", b"").split(b";")[1:]:
        key, _, value = param.strip().partition(b"=")
        if key.lower() == b"charset":
            name = value.strip(b"\"' ").decode("ascii", "replace")
            try:
                "".encode(name)
            except LookupError:
                break
            return name
    return "utf-8"


def links(url: str, text: str) -> list[str]:
    """The page's followed references, resolved against its base (the first
    ``base[href]``, else the page's URL), fragment dropped."""
    tree = LexborHTMLParser(text)
    base = url
    for node in tree.css("base[href]"):
        href = node.attributes.get("href")
        if href:
            base = urljoin(url, href.strip())
            break
    found = []
    for node in tree.css(LINKS):
        href = node.attributes.get("href")
        if href:
            found.append(urldefrag(urljoin(base, href.strip())).url)
    return found


async def crawl(start: str, concurrency: int) -> dict:
    parts = urlsplit(start)
    host, port = parts.hostname or "", parts.port or 80
    netloc = parts.netloc
    started = time.perf_counter()
    stats = {"pages": 0, "status_200": 0, "bytes": 0, "errors": 0}
    connections = [Connection(host, port) for _ in range(concurrency)]
    status, fields, body = await connections[0].get("/robots.txt")
    stats["status_200"] += status == 200
    rules = Protego.parse(body.decode(charset(fields), "replace") if status == 200 else "")
    queue: asyncio.Queue[str] = asyncio.Queue()  # joined once every URL queued is done
    seen = {start}
    queue.put_nowait(start)

    async def fetch(connection: Connection, url: str) -> None:
        target = urlsplit(url)
        path = (target.path or "/") + (f"?{target.query}" if target.query else "")
        status, fields, body = await connection.get(path)
        stats["pages"] += 1
        stats["bytes"] += len(body)
        if status != 200:
            return
        stats["status_200"] += 1
        if b"html" not in fields.get(b"content-type", b""):
            return
        for link in links(url, body.decode(charset(fields), "replace")):
            if link in seen:
                continue
            other = urlsplit(link)
            if other.scheme != "http" or other.netloc != netloc:
                continue
            seen.add(link)
            queue.put_nowait(link)  # before this URL is done: the join waits for it

    async def worker(connection: Connection) -> None:
        try:
            while True:
                url = await queue.get()
                try:
                    if rules.can_fetch(url, USER_AGENT):
                        await fetch(connection, url)
                except (OSError, Closed, ValueError):
                    stats["errors"] += 1
                finally:
                    queue.task_done()
        finally:
            connection.close()

    workers = [asyncio.create_task(worker(c)) for c in connections]
    await queue.join()
    for task in workers:
        task.cancel()  # each waits for a URL that will not come
    await asyncio.gather(*workers, return_exceptions=True)
    return {**stats, "seconds": round(time.perf_counter() - started, 3)}


def arguments(argv: list[str] | None) -> argparse.Namespace:
    """The command line, checked: an http start URL on 127.0.0.1, one connection or more."""
    summary, _, rest = __doc__.partition("\n\n")
    parser = argparse.ArgumentParser(description=summary, epilog=rest,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url", help="the start URL (http, on 127.0.0.1)")
    parser.add_argument("--concurrency", type=int, default=8, help="connections, each "
                        "with its task: fetches in flight (default 8)")
    args = parser.parse_args(argv)
    start = urlsplit(args.url)
    if start.hostname != "127.0.0.1":
        parser.error("the start URL must be on 127.0.0.1")
    if start.scheme != "http":
        parser.error("the floor crawler speaks plain http only")
    if args.concurrency < 1:
        parser.error("--concurrency must be 1 or more")
    return args


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    print(json.dumps(asyncio.run(crawl(args.url, args.concurrency))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
