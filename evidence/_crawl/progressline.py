"""What a person (or a log system) sees of a crawl as it goes: the progress line.

The engine hands a ``CrawlProgress`` (``progress``) to a callback every second; these are
the two callbacks ``evidence crawl`` passes: ``CrawlProgressLine``, a live line on a
terminal (a full line every 10 seconds elsewhere), and ``CrawlProgressLog``, the same
figures as ``crawl.progress`` log lines when the logs are JSON lines. Both also carry
what the command says mid-run (a stop signal) and end cleanly. Separate from
``progress``, which computes the figures, because this only words them.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .progress import CrawlProgress

__all__ = ["CrawlProgressLine", "CrawlProgressLog"]

log = logging.getLogger("evidence.crawl")


class CrawlProgressLine:
    """The crawl's progress on stderr. On a terminal: the session and seed once, then a
    live line redrawn in place (and ended with a newline when the crawl ends); elsewhere a
    full line every 10 seconds. It counts errors as they happen, and says why fewer fetches
    are in flight than allowed."""

    def __init__(self, stream, *, outage: Callable[[], Any] | None = None) -> None:
        self.stream = stream
        self.outage = outage  # an object store's outage under way, if any (``describe``)
        self.tty = stream.isatty()
        self._drawn = False
        self._named = False
        self._last = 0.0

    def __call__(self, p: CrawlProgress) -> None:
        if self.tty:
            if not self._named:
                self.say(f"crawling {self.seeds(p)} in session {p.session_id} "
                         f"(run {p.run_id})")
                self._named = True
            line = self.line(p)
            width = shutil.get_terminal_size().columns - 1  # a wrapped line cannot be redrawn
            self.stream.write("\r\x1b[K" + (line if len(line) <= width else
                                             line[:max(0, width - 1)] + "…"))
            self.stream.flush()
            self._drawn = True
        elif p.elapsed - self._last >= 10:
            self._last = p.elapsed
            self.stream.write(f"{p.session_id} {self.seeds(p)}: {self.line(p)}\n")
            self.stream.flush()

    @staticmethod
    def seeds(p: CrawlProgress) -> str:
        if not p.seeds:
            return "?"
        return p.seeds[0] + (f" (+{len(p.seeds) - 1} more seeds)" if len(p.seeds) > 1 else "")

    def line(self, p: CrawlProgress) -> str:
        return self.counts(p) + self.paused()

    def paused(self) -> str:
        """Why the crawl is paused, if an object store it waits on is down (else "")."""
        outage = self.outage() if self.outage is not None else None
        return f"; paused: {outage.describe()}" if outage else ""

    @staticmethod
    def counts(p: CrawlProgress) -> str:
        c = p.counts
        text = (f"done {c.done}, queued {c.queued}, in flight {p.in_flight} of {p.workers}, "
                f"failed {c.failed}, skipped {c.skipped}, errors {p.errors}, "
                f"{p.pages_per_second:.1f} pages/s")
        if p.limited_by:
            text += "; fewer in flight: " + "; ".join(p.limited_by)
        if p.database_unreachable_since is not None:
            text = (f"paused: database unreachable since {p.database_unreachable_since}, "
                    f"retrying; {text}")
        return text

    def say(self, text: str) -> None:
        """A line of its own (the live line is redrawn after it)."""
        self.end()
        self.stream.write(text + "\n")
        self.stream.flush()

    def end(self) -> None:
        """End the live line with a newline, so what follows starts on a line of its own."""
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False


class CrawlProgressLog:
    """The progress as log lines, with ``--log-format json`` (stderr then carries JSON lines
    only): a ``crawl.progress`` line at the first report and every 10 seconds after, its
    counts in ``data``; what the line would say (a stop signal) as ``crawl.stopping``."""

    def __init__(self) -> None:
        self._last: float | None = None

    def __call__(self, p: CrawlProgress) -> None:
        if self._last is None or p.elapsed - self._last >= 10:
            self._last = p.elapsed
            c = p.counts
            text = CrawlProgressLine.counts(p)
            log.info("%s", text, extra={"event": "crawl.progress", "data": {
                "done": c.done, "queued": c.queued, "in_flight": p.in_flight,
                "failed": c.failed, "skipped": c.skipped, "errors": p.errors,
                "requested": p.requested, "pages_per_second": round(p.pages_per_second, 3),
                "limited_by": p.limited_by}})

    def say(self, text: str) -> None:
        log.info("%s", text, extra={"event": "crawl.stopping"})

    def end(self) -> None:
        pass
