"""Prometheus metrics: the writer's and the service's figures as metric families, the text
a scrape reads, and the small HTTP endpoint that serves it (``evidence serve --metrics``;
``evidence crawl --metrics`` adds the crawl's own families, ``_crawl.metrics``).

The text is the official client's (``prometheus_client``): its metric families, its
exposition (names, label escaping, histogram ``_bucket``/``_sum``/``_count``, counters'
``_total``), so what a scraper parses is what the Prometheus project tests. The families
are built at each scrape from ``statistics()`` snapshots (a custom collector, the client's
advice for figures an application already keeps), in a registry of our own: no global
state, and nothing on the write path but the counting the writer did already.

The endpoint answers ``GET /metrics`` and ``GET /healthz``, on a loopback address unless
the operator asks for another explicitly (``metrics_address(..., public=True)``): metrics
carry no secrets, but they tell who crawls what, and the endpoint has no token or TLS.
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping

import anyio
import anyio.abc
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from .._model.acks import WriterStatistics
from .._store.db import Store
from .tls import parse_listen
from .wire import PEER_GONE, ServiceError, ServiceStatistics

__all__ = ["CONTENT_TYPE", "exposition", "histogram", "metrics_address", "prometheus_text",
           "serve_metrics", "service_families", "wal_family", "writer_families"]

# The text format the families are written in (Prometheus text format 0.0.4).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def metrics_address(text: str, *, public: bool = False,
                    what: str = "--metrics") -> tuple[str, int]:
    """``HOST:PORT`` to serve metrics on: an IP literal (``localhost`` is 127.0.0.1), on
    this machine unless ``public`` (the operator's explicit ``--metrics-public``)."""
    host, port = parse_listen(text, tls=True, what=what)  # any IP: checked here instead
    if not public and not ipaddress.ip_address(host).is_loopback:
        raise ServiceError(
            f"{what} {text!r}: {host} is not a loopback address, and metrics are served "
            "without a token or TLS", hint="use 127.0.0.1:PORT (scrape through an ssh "
            f"tunnel), or add {what}-public to serve them on {host}")
    return host, port


# --- families ----------------------------------------------------------------------------

def histogram(name: str, text: str, buckets: Mapping[str, int], total: float) -> Metric:
    """A histogram family from per-bucket counts keyed by upper bound ("inf" the last), as
    ``WriterStatistics`` keeps them; Prometheus wants them cumulative."""
    cumulative, rows = 0, []
    for bound, n in buckets.items():
        cumulative += n
        rows.append(("+Inf" if bound == "inf" else bound, float(cumulative)))
    if not rows or rows[-1][0] != "+Inf":
        rows.append(("+Inf", float(cumulative)))
    family = HistogramMetricFamily(name, text)
    family.add_metric([], rows, float(total))
    return family


def _gauge(name: str, text: str, value: float) -> Metric:
    return GaugeMetricFamily(name, text, value=value)


def _counter(name: str, text: str, value: float) -> Metric:
    return CounterMetricFamily(name, text, value=value)


def _by(family: GaugeMetricFamily | CounterMetricFamily, counts: Mapping[str, float]
        ) -> Metric:
    for label, n in sorted(counts.items()):
        family.add_metric([label], n)
    return family


def writer_families(w: WriterStatistics) -> Iterator[Metric]:
    """The writer's figures: its queue, batches, commit latency, outcomes, upkeep."""
    yield _gauge("evidence_writer_queue_depth", "Submissions waiting for the writer.",
                 w.queue_depth)
    yield _gauge("evidence_writer_oldest_pending_age_seconds",
                 "Age of the oldest submitted, unacknowledged message.", w.oldest_pending_age)
    yield histogram("evidence_writer_commit_latency_seconds",
                    "Time from a batch's first statement to its COMMIT returning.",
                    w.commit_latencies, w.commit_latency_sum)
    outcomes = w.committed + w.duplicates + w.conflicts + w.rejections
    yield histogram("evidence_writer_batch_size_messages", "Messages per committed batch.",
                    w.batch_sizes, outcomes)
    yield _by(CounterMetricFamily("evidence_writer_messages",
                                  "Messages acknowledged, by outcome.", labels=["outcome"]),
              {"committed": w.committed, "duplicate": w.duplicates, "conflict": w.conflicts,
               "rejected": w.rejections})
    yield _counter("evidence_writer_busy_retries", "BEGIN IMMEDIATE retries on SQLITE_BUSY.",
                   w.busy_retries)
    yield _counter("evidence_writer_commit_errors", "Batches that did not commit.",
                   w.commit_errors)
    yield _counter("evidence_writer_checkpoints", "WAL checkpoints run by the writer.",
                   w.checkpoints)
    yield _counter("evidence_writer_checkpoint_errors", "WAL checkpoints that failed.",
                   w.checkpoint_errors)
    yield _counter("evidence_writer_reconnects",
                   "Connections to the database server made again after one was lost.",
                   w.reconnects)
    yield _gauge("evidence_writer_tree_size", "Messages in the Merkle log.", w.tree_size)


def wal_family(store: Store) -> Iterator[Metric]:
    """The size of a SQLite store's write-ahead log now (a PostgreSQL store has none here)."""
    if store.path is not None:
        yield _gauge("evidence_store_wal_bytes",
                     "Size of the SQLite store's write-ahead log (evidence.db-wal).",
                     store.wal_size())


def service_families(s: ServiceStatistics) -> Iterator[Metric]:
    """The service's figures (its writer's first): connections, requests, backpressure."""
    yield from writer_families(s.writer)
    yield _gauge("evidence_service_uptime_seconds", "Seconds since the service started.",
                 s.uptime)
    yield _gauge("evidence_service_connected_clients", "Open client connections.",
                 s.connected_clients)
    yield _counter("evidence_service_connections", "Connections accepted.",
                   s.connections_total)
    yield _gauge("evidence_service_requests_in_flight", "Requests read and not yet answered.",
                 s.requests_in_flight)
    yield _gauge("evidence_service_pending_bytes",
                 "Bytes read from clients, not yet committed.", s.pending_bytes)
    yield _counter("evidence_service_frames_received", "Frames read after handshakes.",
                   s.frames_received)
    yield _counter("evidence_service_messages_received", "Messages decoded from submits.",
                   s.messages_received)
    yield _counter("evidence_service_acks_sent", "Acknowledgements queued to clients.",
                   s.acks_sent)
    yield _counter("evidence_service_backpressure_waits",
                   "Times a connection's reads paused for in-flight room.",
                   s.backpressure_waits)
    yield _gauge("evidence_service_send_blocked_connections",
                 "Connections whose answers are waiting on a full socket.",
                 s.send_blocked_connections)
    yield _counter("evidence_service_slow_disconnects",
                   "Connections dropped because they did not read their answers.",
                   s.slow_disconnects)
    yield _by(CounterMetricFamily("evidence_service_protocol_errors",
                                  "Connections and requests refused, by error code.",
                                  labels=["code"]), s.protocol_errors)


class _Families(Collector):
    """A collector that yields what ``families()`` builds at each scrape."""

    def __init__(self, families: Callable[[], Iterable[Metric]]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return list(self._families())


def exposition(families: Callable[[], Iterable[Metric]]) -> str:
    """The families in the Prometheus text format, through a registry of their own."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return generate_latest(registry).decode()


def prometheus_text(s: ServiceStatistics, store: Store | None = None) -> str:
    """The service's statistics in the Prometheus text format (what ``evidence serve
    --metrics`` serves, with its ``store``'s WAL size, and a client's ``metrics_text()``
    reads)."""
    return exposition(lambda: itertools.chain(
        service_families(s), wal_family(store) if store is not None else ()))


# --- the endpoint ------------------------------------------------------------------------

METRICS_AT_ONCE = 16  # /metrics connections open at once; a newer one drops the oldest


async def serve_metrics(listener: anyio.abc.Listener[anyio.abc.SocketStream],
                        text: Callable[[], str], healthy: Callable[[], bool]) -> None:
    """Answer scrapes on ``listener`` until cancelled: ``GET /metrics`` with ``text()``,
    ``GET /healthz`` with 200 while ``healthy()`` (else 503), anything else 404.

    At most ``METRICS_AT_ONCE`` connections are open: a newer one drops the oldest (a
    scraper asks at once and is done in milliseconds), so a flood of connections costs a
    bounded amount of memory (before: 11,742 held at once took an ``evidence serve`` from
    34.4 to 53.6 MiB of VmRSS, and it stayed there; ``tools/flood_service.py``)."""
    open_now: dict[anyio.CancelScope, None] = {}  # oldest first

    async def answer(stream: anyio.abc.SocketStream) -> None:
        scope = anyio.CancelScope()
        while len(open_now) >= METRICS_AT_ONCE:
            oldest = next(iter(open_now))
            del open_now[oldest]
            oldest.cancel()
        open_now[scope] = None
        try:
            with scope:
                await _answer(stream, text, healthy)
        finally:
            open_now.pop(scope, None)
            with anyio.CancelScope(shield=True):
                await stream.aclose()

    async with listener:
        await listener.serve(answer)


async def _answer(stream: anyio.abc.ByteStream, text: Callable[[], str],
                  healthy: Callable[[], bool]) -> None:
    """A minimal HTTP/1.0 responder: one request, one answer, then the connection closes."""
    head = b""
    with anyio.move_on_after(5.0):
        with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError, OSError):
            while b"\r\n\r\n" not in head and len(head) < 8192:
                head += await stream.receive(8192)
    method, _, rest = head.partition(b" ")
    target = rest.split(b" ", 1)[0].split(b"?", 1)[0]
    if method not in (b"GET", b"HEAD"):
        status, body, kind = "405 Method Not Allowed", "GET only\n", "text/plain; charset=utf-8"
    elif target == b"/metrics":
        status, body, kind = "200 OK", text(), CONTENT_TYPE
    elif target in (b"/healthz", b"/health"):
        ok = healthy()
        status, body = ("200 OK", "ok\n") if ok else ("503 Service Unavailable", "stopping\n")
        kind = "text/plain; charset=utf-8"
    else:
        status, body, kind = "404 Not Found", "try /metrics\n", "text/plain; charset=utf-8"
    data = body.encode()
    response = (f"HTTP/1.0 {status}\r\nContent-Type: {kind}\r\n"
                f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode()
    with contextlib.suppress(*PEER_GONE, TimeoutError), anyio.fail_after(5.0):
        await stream.send(response + (data if method == b"GET" else b""))

