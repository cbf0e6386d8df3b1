#!/usr/bin/env python3
"""A crawler that records nothing: the floor tools/bench_crawl.py measures evidence against.

    python tools/bare_crawler.py http://127.0.0.1:PORT/ --concurrency 8

What any crawler has to do and nothing more: one ``httpx.AsyncClient`` (HTTP/1.1,
keep-alive, the connection pool sized to the concurrency), ``--concurrency`` tasks taking
URLs from one queue, robots.txt fetched first and obeyed (protego, the parser evidence
uses), links taken from each HTML page with selectolax's lexbor parser (``a[href]`` and
``area[href]``, resolved against the page, fragment dropped), only the start URL's host,
each URL fetched once. Nothing is stored: no bodies, no frontier, no log. Prints one JSON
line: pages fetched, 200 responses (robots.txt included), bytes read, seconds.

127.0.0.1 only, as every tool here: the start URL must be on it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from urllib.parse import urldefrag, urljoin, urlsplit

import httpx
from protego import Protego
from selectolax.lexbor import LexborHTMLParser

USER_AGENT = "bare-crawler/1.0"


async def crawl(start: str, concurrency: int) -> dict:
    host = urlsplit(start).netloc
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    started = time.perf_counter()
    stats = {"pages": 0, "status_200": 0, "bytes": 0, "errors": 0}
    async with httpx.AsyncClient(limits=limits, timeout=30.0,
                                 headers={"User-Agent": USER_AGENT}) as client:
        robots_url = urljoin(start, "/robots.txt")
        response = await client.get(robots_url)
        stats["status_200"] += response.status_code == 200
        rules = Protego.parse(response.text if response.status_code == 200 else "")
        queue: asyncio.Queue[str | None] = asyncio.Queue()
        seen = {start}
        pending = 1
        await queue.put(start)
        done = asyncio.Event()

        async def worker() -> None:
            nonlocal pending
            while True:
                url = await queue.get()
                if url is None:
                    return
                try:
                    if rules.can_fetch(url, USER_AGENT):
                        await fetch(url)
                except httpx.HTTPError:
                    stats["errors"] += 1
                finally:
                    pending -= 1
                    if pending == 0:
                        done.set()

        async def fetch(url: str) -> None:
            nonlocal pending
            response = await client.get(url)
            stats["pages"] += 1
            stats["bytes"] += len(response.content)
            if response.status_code != 200:
                return
            stats["status_200"] += 1
            if "html" not in response.headers.get("content-type", ""):
                return
            tree = LexborHTMLParser(response.text)
            for node in tree.css("a[href], area[href]"):
                href = node.attributes.get("href")
                if not href:
                    continue
                target = urldefrag(urljoin(url, href.strip())).url
                parts = urlsplit(target)
                if parts.scheme not in ("http", "https") or parts.netloc != host:
                    continue
                if target not in seen:
                    seen.add(target)
                    pending += 1
                    queue.put_nowait(target)

        tasks = [asyncio.create_task(worker()) for _ in range(concurrency)]
        await done.wait()
        for _ in tasks:
            queue.put_nowait(None)
        await asyncio.gather(*tasks)
    stats["seconds"] = round(time.perf_counter() - started, 3)
    return stats


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("url", help="the start URL (on 127.0.0.1)")
    p.add_argument("--concurrency", type=int, default=8,
                   help="fetches in flight, and tasks (default 8)")
    args = p.parse_args(argv)
    if urlsplit(args.url).hostname != "127.0.0.1":
        p.error("the start URL must be on 127.0.0.1")
    print(json.dumps(asyncio.run(crawl(args.url, args.concurrency))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
