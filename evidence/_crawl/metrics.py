"""A crawl's Prometheus metrics (``evidence crawl --metrics HOST:PORT``): what the run did,
where its frontier stands, what is in flight, and its writer's figures.

    async with crawl_metrics(crawler, "127.0.0.1:9464"):
        ...  # the run: each scrape reads crawler.statistics() at that moment

The counters of what was recorded (pages settled, attempts and renders by outcome, bytes)
are the writer's ``Recorded`` tally, counted after each COMMIT: they agree with the store
whichever process fetched the pages. The frontier's sizes are those of the last progress
report (each ``progress_interval``: counting a large frontier is a query, not a lookup).
docs/operations.md lists every metric; ``_write/metrics.py`` builds the text and serves it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Protocol

import anyio
import anyio.abc
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from .._errors import ServiceError
from .._model.acks import Recorded
from .._write.metrics import (
    exposition,
    histogram,
    metrics_address,
    serve_metrics,
    wal_family,
    writer_families,
)

if TYPE_CHECKING:
    from .._model.acks import WriterStatistics
    from .._store.db import Store
    from .._write.tally import Tally
    from .frontier import FrontierCounts

__all__ = ["crawl_families", "crawl_metrics", "host_families", "metrics_endpoint",
           "recorded_families"]

log = logging.getLogger("evidence.crawl")

_STATES = ("queued", "in_flight", "done", "failed", "skipped")


# What a scrape reads, named here rather than imported: the crawler and the worker host
# start their endpoints from this module, so importing their classes back would be a circle.

class CrawlProgress(Protocol):
    """A crawl's figures at one moment (``crawler.CrawlProgress`` has them)."""

    @property
    def run_id(self) -> str: ...
    @property
    def session_id(self) -> str: ...
    @property
    def writer(self) -> WriterStatistics: ...
    @property
    def requested(self) -> int: ...
    @property
    def errors(self) -> int: ...
    @property
    def counts(self) -> FrontierCounts: ...
    @property
    def in_flight(self) -> int: ...
    @property
    def workers(self) -> int: ...
    @property
    def worker_pids(self) -> list[int]: ...
    @property
    def worker_hosts(self) -> list[str]: ...
    @property
    def hosts_fenced(self) -> dict[str, int]: ...


class Crawler(Protocol):
    """The crawl being served (``crawler.Crawler``)."""

    @property
    def store(self) -> Store: ...
    @property
    def stopping(self) -> bool: ...

    def statistics(self) -> CrawlProgress: ...


class HostStatistics(Protocol):
    """A worker host's figures (``workerhost.HostStatistics``)."""

    @property
    def run_id(self) -> str: ...
    @property
    def connected(self) -> bool: ...
    @property
    def channels(self) -> int: ...
    @property
    def orders(self) -> int: ...
    @property
    def in_flight(self) -> int: ...
    @property
    def tally(self) -> Tally: ...


@contextlib.asynccontextmanager
async def metrics_endpoint(address: str, families: Callable[[], Iterable[Metric]], *,
                           public: bool = False, healthy: Callable[[], bool] = lambda: True
                           ) -> AsyncIterator[tuple[str, int]]:
    """Serve ``families()`` on ``address`` while the block runs (``/healthz``: 200 while
    ``healthy()``); yields the address bound (port 0 picks one), and logs it
    (``metrics.listening``)."""
    host, port = metrics_address(address, public=public)
    try:
        listener = await anyio.create_tcp_listener(local_host=host, local_port=port)
    except OSError as exc:
        raise ServiceError(f"--metrics {address}: cannot listen ({exc.strerror or exc})",
                           hint="choose another port (0 picks a free one)") from None
    bound = (host, listener.extra(anyio.abc.SocketAttribute.local_port))
    url = "http://{}:{}/metrics".format(f"[{host}]" if ":" in host else host, bound[1])
    log.info("Prometheus metrics at %s", url, extra={"event": "metrics.listening",
                                                      "data": {"url": url}})
    async with anyio.create_task_group() as tg:
        tg.start_soon(serve_metrics, listener, lambda: exposition(families), healthy)
        try:
            yield bound
        finally:
            tg.cancel_scope.cancel()


def crawl_metrics(crawler: Crawler, address: str, *, public: bool = False
                  ) -> contextlib.AbstractAsyncContextManager[tuple[str, int]]:
    """Serve the crawl's metrics (``crawl_families``) on ``address`` while the block runs;
    ``/healthz`` answers 503 once the run is stopping."""
    return metrics_endpoint(address, lambda: crawl_families(crawler), public=public,
                            healthy=lambda: not crawler.stopping)


def crawl_families(crawler: Crawler) -> Iterator[Metric]:
    """The families one scrape reads, from the crawler's statistics at that moment."""
    p = crawler.statistics()
    info = GaugeMetricFamily("evidence_crawl_run_info", "The run being crawled (value 1).",
                             labels=["run_id", "session_id"])
    info.add_metric([p.run_id, p.session_id], 1)
    yield info
    yield from recorded_families("evidence_crawl", p.writer.recorded, "committed")
    yield CounterMetricFamily("evidence_crawl_requests", "HTTP requests this run made "
                              "(robots.txt included).", value=p.requested)
    yield CounterMetricFamily("evidence_crawl_fetch_errors", "Fetches of this run that "
                              "failed (network, timeout, 5xx, 429).", value=p.errors)
    yield _by(GaugeMetricFamily("evidence_crawl_frontier_urls", "The session's URLs by "
                                "frontier state (as of the last progress report).",
                                labels=["state"]),
              _frontier_counts(p), _STATES)
    yield GaugeMetricFamily("evidence_crawl_fetches_in_flight", "Requests in flight now.",
                            value=p.in_flight)
    yield GaugeMetricFamily("evidence_crawl_fetch_slots", "Requests allowed in flight at "
                            "once (--workers).", value=p.workers)
    yield GaugeMetricFamily("evidence_crawl_worker_processes", "Worker processes "
                            "(--processes) alive.", value=len(p.worker_pids))
    yield GaugeMetricFamily("evidence_crawl_worker_hosts", "Worker hosts serving the run.",
                            value=len(p.worker_hosts))
    fenced = CounterMetricFamily("evidence_crawl_worker_hosts_fenced", "Worker hosts fenced "
                                 "at fault: a page failed, or what they submitted refused.",
                                 labels=["host"])
    for host, times in sorted(p.hosts_fenced.items()):
        fenced.add_metric([host], times)
    yield fenced
    yield from wal_family(crawler.store)
    yield from writer_families(p.writer)


def host_families(s: HostStatistics) -> Iterator[Metric]:
    """A worker host's families (``evidence worker --metrics``): its channel, its leases,
    and what its submissions recorded (the coordinator's ``evidence_crawl_*`` count them
    too, with every other host's)."""
    info = GaugeMetricFamily("evidence_worker_run_info", "The run this host serves or "
                             "served last (value 1).", labels=["run_id"])
    info.add_metric([s.run_id], 1)
    yield info
    yield GaugeMetricFamily("evidence_worker_connected", "1 while a channel to the "
                            "coordinator is open.", value=int(s.connected))
    yield CounterMetricFamily("evidence_worker_channels", "Channels to the coordinator "
                              "opened (one more after each loss).", value=s.channels)
    yield CounterMetricFamily("evidence_worker_orders", "Pages the coordinator leased to "
                              "this host.", value=s.orders)
    yield GaugeMetricFamily("evidence_worker_pages_in_flight", "Leased pages not answered "
                            "yet.", value=s.in_flight)
    yield from recorded_families("evidence_worker", s.tally.snapshot(),
                                 "submitted by this host and committed")


def recorded_families(prefix: str, r: Recorded, how: str) -> Iterator[Metric]:
    """What committed messages recorded (``Recorded``): pages, attempts, bytes, renders."""
    yield _by(CounterMetricFamily(f"{prefix}_pages", f"Pages settled ({how}), by the "
                                  "frontier state they entered: done, failed, skipped, or "
                                  "queued again for a retry.", labels=["state"]),
              r.settled, ("done", "failed", "skipped", "queued"))
    yield _by(CounterMetricFamily(f"{prefix}_attempts", f"Fetch attempts ({how}), by "
                                  "outcome.", labels=["outcome"]), r.attempts)
    yield CounterMetricFamily(f"{prefix}_fetched_bytes", f"Response body bytes of the "
                              f"attempts ({how}), as received.", value=r.fetched_bytes)
    yield CounterMetricFamily(f"{prefix}_recorded_bytes", f"Payload bytes of the attempts "
                              f"and renders ({how}): heads, bodies, DOMs, screenshots (the "
                              "artifact store keeps one copy of a repeated payload).",
                              value=r.recorded_bytes)
    yield _by(CounterMetricFamily(f"{prefix}_renders", f"Renders ({how}), by outcome.",
                                  labels=["outcome"]), r.renders)
    yield histogram(f"{prefix}_render_duration_seconds", "Time one render took.",
                    r.render_seconds, r.render_seconds_sum)


def _frontier_counts(p: CrawlProgress) -> dict[str, int]:
    c = p.counts
    return {"queued": c.queued, "in_flight": c.in_flight, "done": c.done, "failed": c.failed,
            "skipped": c.skipped}


def _by(family: CounterMetricFamily | GaugeMetricFamily, counts: dict[str, int],
        always: tuple[str, ...] = ()) -> Metric:
    """One sample per label value: those in ``always`` (0 when absent), then the rest."""
    for label in (*always, *sorted(set(counts) - set(always))):
        family.add_metric([label], counts.get(label, 0))
    return family

