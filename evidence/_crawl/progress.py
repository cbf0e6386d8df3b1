"""A run's figures as it goes: ``CrawlProgress``, and the live-stats file beside a store.

Each ``progress_interval`` the engine (``_crawl.crawler``) counts the frontier and hands
a ``CrawlProgress`` to the progress callback, and writes it to ``STORE/live-stats.json``:
how ``evidence status`` (another process) shows a live crawl's writer metrics. The file
is a convenience, replaced atomically, not evidence.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from pathlib import Path

import msgspec

from .._model.acks import WriterStatistics
from .._model.messages import format_time
from .._store.db import Store
from .frontier import FrontierCounts

__all__ = ["LIVE_STATS", "CrawlProgress", "LiveStats", "unreachable_since"]

log = logging.getLogger("evidence.crawl")

LIVE_STATS = "live-stats.json"


class CrawlProgress(msgspec.Struct, frozen=True, kw_only=True):
    session_id: str
    run_id: str
    counts: FrontierCounts
    requested: int  # requests made by this run, robots.txt included
    in_flight: int
    pages_per_second: float
    elapsed: float
    writer: WriterStatistics
    worker_pids: list[int] = []  # the worker processes, with --processes
    seeds: list[str] = []
    # The concurrency allowed: ``in_flight`` is at most this on one host (with the default
    # --per-host); across hosts at most twice this (docs/design.md, "The crawler").
    workers: int = 0
    errors: int = 0  # fetches of this run that failed (network, timeout, 5xx, 429)
    last_error: str | None = None  # the latest, as logged
    limited_by: list[str] = []  # why fewer than ``workers`` fetches are in flight, if so
    worker_hosts: list[str] = []  # the worker hosts serving the run, with --listen
    hosts_fenced: dict[str, int] = {}  # worker hosts fenced at fault (_crawl/hostauth.py)
    # While the database server is out of reach (a PostgreSQL restart): since when (UTC,
    # as now_text spells it). The run waits meanwhile, up to the store's outage deadline.
    database_unreachable_since: str | None = None


def unreachable_since(store: Store) -> str | None:
    """Since when the database server is out of reach, while it is (a restart)."""
    since = getattr(getattr(store.backend, "outage", None), "since", None)
    return None if since is None else format_time(dt.datetime.fromtimestamp(since, dt.UTC))


class LiveStats:
    """``STORE/live-stats.json``, rewritten with each report (a PostgreSQL store has no
    directory to put it in: status names the writer instead)."""

    def __init__(self, store: Store) -> None:
        self.path: Path | None = None if store.path is None else store.path / LIVE_STATS
        self._failed = False

    def write(self, progress: CrawlProgress) -> None:
        if self.path is None:
            return
        try:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_bytes(msgspec.json.encode(progress))
            os.replace(tmp, self.path)
        except OSError as exc:  # a convenience for 'evidence status', never worth a run
            if not self._failed:
                log.warning("cannot write %s (%s); 'evidence status' will not show this "
                            "run's progress", self.path, exc.strerror,
                            extra={"event": "crawl.live_stats_failed"})
            self._failed = True
