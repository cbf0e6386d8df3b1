"""What one run of a crawl is asked (``CrawlOptions``) and what it comes to (``CrawlResult``).

Separate from the engine (``_crawl.crawler``) because these are the values a caller
builds and reads (the CLI, the public ``evidence`` face, the tests) without the engine's
working parts: unlike ``CrawlConfig``, which a session records and keeps, the options may
change from one run to the next.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec

from .._errors import EvidenceError
from .._write.limits import WriterLimits
from .._write.tls import TLSFiles
from .frontier import CrawlConfig, FrontierCounts
from .netpolicy import Resolver
from .progress import CrawlProgress
from .secrets import WORKER_HOSTS_HINT, WORKER_HOSTS_REFUSAL, HostOptions, RequestOptions
from .seeds import SeedOptions, origin_of
from .session import Outcome

if TYPE_CHECKING:  # what a crawl that renders is given: loaded when it renders
    from .behaviors import BehaviorOptions
    from .render import RenderOptions

__all__ = ["CrawlOptions", "CrawlResult", "per_seed"]


@dataclass(frozen=True, kw_only=True)
class CrawlOptions:
    """How one run goes about it. Unlike ``CrawlConfig`` these may change between runs."""

    workers: int = 8
    per_host: int | None = None  # requests in flight per host; None: as many as ``workers``
    delay: float = 0.0  # seconds between request starts per host (robots Crawl-delay wins)
    timeout: float = 30.0  # seconds one read may wait (connecting, the head, a body chunk)
    deadline: float = 120.0  # seconds one fetch may take in all: connect, head and body
    grace: float = 10.0  # after a stop request, seconds in-flight fetches get to finish
    max_documents: int | None = None  # pages requested by this run; the session goes on
    writer_limits: WriterLimits | None = None
    clean: bool = False  # abandon an open session and start a new one
    full: bool = False  # a new session is a full crawl even when a completed one exists
    progress: Callable[[CrawlProgress], None] | None = None
    progress_interval: float = 1.0
    # Worker processes that fetch and parse (the writer runs as a service in this one);
    # 0: everything in this process. Concurrency stays ``workers`` in all.
    processes: int = 0
    # How pages are rendered when the session renders (``CrawlConfig.render``): the
    # browser, timeouts, tabs, MHTML. Rendering always happens in this process.
    render: RenderOptions | None = None
    # Worker hosts (``evidence worker --connect``): the writer service also listens here
    # ("HOST:PORT"; beyond loopback only with ``tls``), every client presenting ``token``.
    # The payloads must be in an object store the hosts reach (``--artifacts s3://``).
    listen: str | None = None
    tls: TLSFiles | None = None
    token: str | None = None
    heartbeat: float = 2.0  # seconds between beats on a worker host's channel (at most)
    lease_timeout: float = 15.0  # a worker host silent this long loses its leases
    # Accountable worker hosts (``_crawl/hostauth.py``): name -> SHA-256 of each host's own
    # token (``--hosts-file``); and how long the run goes on with no host left once one has
    # served it (None: it waits for hosts to come back; ``--fail-when-no-hosts``).
    hosts: dict[str, bytes] | None = None
    no_hosts_timeout: float | None = None
    cross_check: float = 0.0  # the share of hosts' pages fetched again here (CrossCheck)
    # How host names become addresses for the network policy (``_crawl.netpolicy``): the
    # system's resolver by default; a test gives its own answers. In this process only.
    resolver: Resolver | None = None
    # The proxies' credentials (``_crawl.proxy``), by proxy URL: never in the recorded
    # configuration; handed to worker processes and hosts in their setup.
    proxy_credentials: dict[str, tuple[str, str]] = field(default_factory=dict)
    # Prometheus metrics at http://HOST:PORT/metrics while the run goes (``_crawl.metrics``):
    # a loopback address, or any with ``metrics_public``.
    metrics: str | None = None
    metrics_public: bool = False
    # Headers, cookies and credentials added to every request (``_crawl.secrets``), with
    # the session's cookie jar; what was configured is recorded as ``CrawlConfig.request``,
    # without the secret values, which stay in this process.
    request: RequestOptions | None = None


class CrawlResult(msgspec.Struct, frozen=True, kw_only=True):
    session_id: str
    run_id: str
    outcome: Outcome
    reason: str
    resumed: bool
    session_completed: bool
    documents: int  # pages requested by this run (robots.txt not counted)
    counts: FrontierCounts


def per_seed(config: CrawlConfig, options: CrawlOptions) -> CrawlOptions:
    """The run's options with the session's per-seed headers and behaviours applied
    (``_crawl.seeds``), from its recorded configuration: a resumed run needs no seeds
    file."""
    seeds = [msgspec.convert(s, SeedOptions) for s in config.seed_options]
    tables = [HostOptions(match=origin_of(s.url).split("://", 1)[1], headers=s.headers)
              for s in seeds if s.headers]
    if (tables or options.request is not None) and options.listen:
        raise EvidenceError(WORKER_HOSTS_REFUSAL, hint=WORKER_HOSTS_HINT)
    why = None if options.request is None else options.request.for_worker()
    if why is not None and options.processes > 0:
        raise EvidenceError(why, hint="leave out --processes for this crawl")
    if tables:
        if options.request is None:
            options = dataclasses.replace(options, request=RequestOptions())
        assert options.request is not None
        options.request.seed_hosts = tables
    render = options.render
    if render is None:
        return options
    by_origin: dict[str, BehaviorOptions] = {}
    for seed in seeds:
        if seed.behaviors is not None:
            by_origin.setdefault(origin_of(seed.url), dataclasses.replace(
                render.behaviors, enabled=tuple(seed.behaviors)))
    if by_origin:
        options = dataclasses.replace(options, render=dataclasses.replace(
            render, by_origin=tuple(by_origin.items())))
    return options
