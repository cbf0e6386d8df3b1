"""The crawler's HTTP client, made the same way in the crawl and in its worker processes."""

from __future__ import annotations

import httpx

__all__ = ["crawl_client"]


def crawl_client(*, connections: int, timeout: float) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` that never retries and keeps ``connections`` alive.

    A retry would be a request the evidence does not record: the crawler retries through
    its frontier instead, each attempt recorded.
    """
    transport = httpx.AsyncHTTPTransport(retries=0, limits=httpx.Limits(
        max_connections=connections, max_keepalive_connections=connections))
    return httpx.AsyncClient(transport=transport, timeout=timeout)
