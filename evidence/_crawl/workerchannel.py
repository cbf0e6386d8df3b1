"""The frames on a worker's channel (``_crawl.workers``): between the crawl and a worker
process over a socketpair, or a worker host over TCP and TLS, in length-prefixed msgpack
frames. ``Setup`` and ``Order`` go down, ``Ready``, ``Fetched`` (an order's request is
over, its page committing), ``Done`` and ``Failed`` come up; ``Beat`` goes both ways on a
worker host's channel and ``Bye`` down it.

Separate from the pool (``_crawl.workers``) because three parties speak them: the crawl's
``WorkerPool``, a worker process (``_crawl.workerchild``) and a worker host
(``_crawl.workerhost``); none of them needs another's working parts to read a frame.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec

from .._errors import EvidenceError
from .._write.wire import FrameReader
from .pages import PageEffects, PageOrder

__all__ = ["Beat", "Bye", "Done", "Failed", "Fetched", "Order", "Ready", "Setup", "failed"]

log = logging.getLogger("evidence.crawl")

_MAX_FRAME = 16 * 1024 * 1024


class Setup(msgspec.Struct, tag="setup", kw_only=True):
    store: str  # the store (its directory, or a connection string): for messages
    socket: str  # the writer service
    config: dict[str, Any]  # the session's CrawlConfig record
    session_id: str
    run_id: str
    connections: int  # HTTP connections the child may keep open
    timeout: float
    name: str = ""  # how the service knows this child's connection
    deadline: float | None = None  # seconds one fetch may take in all
    # the store's artifact location: an s3:// URL or a directory (default: STORE/artifacts)
    artifacts: str = ""
    heartbeat: float = 0.0  # a worker host: seconds between beats (0: a local child)
    lease_timeout: float = 0.0  # a worker host: silence after which its leases expire
    # the proxies' credentials by proxy URL (``_crawl.proxy``): kept out of ``config``
    proxy_credentials: dict[str, tuple[str, str]] = {}


class Order(msgspec.Struct, tag="order"):
    id: int
    page: PageOrder


class Ready(msgspec.Struct, tag="ready"):
    pid: int


class Done(msgspec.Struct, tag="done"):
    id: int
    effects: PageEffects


class Fetched(msgspec.Struct, tag="fetched"):
    """Up, before an order's ``Done``: its request is over and its page is committing, so
    the crawl may start another request on its host (its fetch slot is free)."""

    id: int


class Failed(msgspec.Struct, tag="failed"):
    id: int
    error: str
    hint: str | None = None  # the error's own advice (an S3 outage's deadline, say)


class Beat(msgspec.Struct, tag="beat"):
    """Both ways on a worker host's channel: still here (the lease goes on)."""


class Bye(msgspec.Struct, tag="bye"):
    """Down a worker host's channel: the run is over; exit."""

    reason: str = ""


_down = msgspec.msgpack.Decoder(Setup | Order | Beat | Bye)
_up = msgspec.msgpack.Decoder(Ready | Fetched | Done | Failed | Beat)


async def _read(reader: FrameReader, decoder: msgspec.msgpack.Decoder) -> Any:
    """The next frame, or None when the channel has ended."""
    size = await reader.read_header()
    if size is None:
        return None
    if size > _MAX_FRAME:
        raise EvidenceError(f"a {size}-byte frame on a worker channel (at most {_MAX_FRAME})")
    return decoder.decode(await reader.read_body(size))



def failed(order: Order, exc: Exception, name: str) -> Failed:
    """What a page's failure is to the parent, which fails the run with it (its traceback
    logged here unless it is one of ours, whose message and hint say it all)."""
    if isinstance(exc, EvidenceError):
        log.error("%s: %s: %s", name, order.page.url, exc, extra={"event": "page.crashed"})
    else:
        log.exception("%s: %s", name, order.page.url, extra={"event": "page.crashed"})
    return Failed(id=order.id, error=f"{type(exc).__name__}: {exc}", hint=exc.hint
                  if isinstance(exc, EvidenceError) else None)
