"""What the writer counts as batches commit: histograms with fixed buckets, and the tally of
what committed messages recorded (``Recorded``).

The writer counts after COMMIT returned, only the messages acknowledged ``committed``: a
redelivery acknowledged ``duplicate`` was counted when it first committed, and a batch that
did not commit counts nothing. So a crawl's counters equal what the store holds (pages
settled done = the frontier's done rows; attempts by outcome = the fetch_attempt rows),
whichever process fetched the pages (this one, a worker process, a worker host).
"""

from __future__ import annotations

import bisect
import collections
import math

from .._model.acks import Recorded
from .._model.messages import FetchAttempt, FrontierUpdate, Message, Render
from .._model.refs import ArtifactRef

__all__ = ["COMMIT_SECONDS", "RENDER_SECONDS", "Histogram", "Tally"]

# Bucket upper bounds, in seconds: a local SQLite commit takes about a millisecond, one to
# a PostgreSQL server or through an fsync-heavy disk tens; a render, seconds.
COMMIT_SECONDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                  2.5, 5.0, 10.0, math.inf)
RENDER_SECONDS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, math.inf)


class Histogram:
    """Observations counted into fixed buckets (each by its upper bound), and their sum."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        assert bounds[-1] == math.inf and list(bounds) == sorted(bounds)
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def buckets(self) -> dict[str, int]:
        """Upper bound ("inf" for the last) -> observations in that bucket (not cumulative,
        as ``WriterStatistics.batch_sizes``)."""
        return {("inf" if b == math.inf else repr(b)): n
                for b, n in zip(self.bounds, self.counts, strict=True)}


class Tally:
    """What committed messages recorded: attempts, settlements, renders, bytes."""

    def __init__(self) -> None:
        self.attempts = collections.Counter[str]()
        self.settled = collections.Counter[str]()
        self.renders = collections.Counter[str]()
        self.render_seconds = Histogram(RENDER_SECONDS)
        self.fetched_bytes = 0
        self.recorded_bytes = 0

    def add(self, message: Message) -> None:
        """Count one message that committed (on the writer's loop, for every message: a
        kind that carries no figure costs three ``isinstance`` tests)."""
        if isinstance(message, FrontierUpdate):
            for settled in message.settled:
                self.settled[settled.state] += 1
        elif isinstance(message, FetchAttempt):
            self.attempts[message.outcome] += 1
            body = message.body
            if body is not None:
                self.fetched_bytes += body.size
            self.recorded_bytes += _sizes(message.request_headers, message.response_headers,
                                          body, message.content, message.surplus,
                                          message.frames)
        elif isinstance(message, Render):
            self.renders[message.outcome] += 1
            self.render_seconds.observe(message.elapsed_ms / 1000)
            self.recorded_bytes += _sizes(message.dom, message.screenshot, message.mhtml,
                                          message.behaviors)

    def snapshot(self) -> Recorded:
        """The counts now, as the writer's statistics carry them."""
        return Recorded(attempts=dict(self.attempts), settled=dict(self.settled),
                        renders=dict(self.renders),
                        render_seconds=self.render_seconds.buckets(),
                        render_seconds_sum=self.render_seconds.sum,
                        fetched_bytes=self.fetched_bytes, recorded_bytes=self.recorded_bytes)


def _sizes(*refs: ArtifactRef | None) -> int:
    total = 0
    for ref in refs:
        if ref is not None:
            total += ref.size
    return total
