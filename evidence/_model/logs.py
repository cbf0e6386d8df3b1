"""What a log line carries: its event name, the ids of what it happened inside, and the two
ways a line is written (text for a person, JSON lines for a log system).

Every log call in the package names its event (``extra={"event": "run.ended"}``); the
names are ``EVENTS`` below, stable across releases, and docs/operations.md lists them
(``tests/test_logs.py`` fails on a call without one, a name not listed here, or a list
that differs from the docs). What a line happened inside is *context*, not arguments:

    with log_context(run_id=run.run_id):
        ...  # every line logged here, and in the tasks started here, carries run_id

The context is a ``contextvars`` variable, so each task has its own and a task started
inside a context inherits it (an anyio task copies its parent's context when it starts).
``JsonFormatter`` writes one JSON object per line: ``time``, ``level``, ``logger``,
``event``, ``message``, ``pid``, the context ids that are set (``run_id``,
``session_id``, ``url``, ``attempt_id``), ``data`` (an event's own values, given as
``extra={"data": {...}}``: the counts of ``crawl.progress``) and ``error`` (the traceback)
when there is one.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime as dt
import logging
from collections.abc import Iterator, Mapping
from types import MappingProxyType

import msgspec

__all__ = ["CONTEXT_KEYS", "EVENTS", "FORMATS", "LEVELS", "JsonFormatter", "TextFormatter",
           "add_log_context", "log_arguments", "log_context", "set_level"]

# The event names, each with what it means. A line from code outside this package (a
# library's own logging) has the event "log".
EVENTS: dict[str, str] = {
    "log": "a line from a library, without an event name of its own",
    # a crawl: runs, pages, the progress line
    "run.started": "a run started its session, or resumed the open one",
    "crawl.cookies_restored": "a resumed run rebuilt its session's cookie jar from the "
                              "recorded response heads",
    "crawl.login": "a login recipe ran in Chromium (why, and whether it held)",
    "crawl.login_exhausted": "a page showed the crawl logged out, and no login was left",
    "run.ended": "a run ended (completed, stopped, capped or failed), with the reason",
    "run.failed": "a run failed on an error (then run.ended follows)",
    "crawl.progress": "the crawl's progress (--log-format json; the text form is the "
                      "progress line)",
    "crawl.stopping": "a stop signal was received: no new requests, or in-flight fetches "
                      "cancelled",
    "crawl.listening": "the crawl takes worker hosts on this address",
    "crawl.live_stats_failed": "STORE/live-stats.json could not be written",
    "metrics.listening": "Prometheus metrics are served at this address",
    "fetch.done": "debug: a fetch attempt was made, with its outcome (its record commits "
                  "with its page)",
    "fetch.failed": "a fetch failed (network, timeout, 5xx, 429): retried later, or failed",
    "fetch.redirect_unusable": "a redirect pointed to a location that cannot be fetched",
    "rule.error": "a compliance rule raised an error on a page (recorded as 'error')",
    "page.crashed": "a worker's code failed on a page (a bug: the page is retried)",
    # worker processes and worker hosts, as the crawl sees them
    "worker.started": "a worker process (--processes) started",
    "worker.stopped_starting": "debug: a worker process stopped while it started",
    "worker.failed": "a worker process stopped on an error it names (no traceback)",
    "worker.channel_broken": "the channel to a worker process broke",
    "worker.lost": "a worker process died; its pages are settled from the store",
    "worker_host.refused": "a worker host did not start (refused or failed)",
    "worker_host.not_ready": "a worker host did not say it was ready",
    "worker_host.joined": "a worker host joined the run",
    "worker_host.lost": "a worker host was lost; its pages are settled from the store",
    "crawl.cross_check": "the crawl fetched a worker host's page again: matched, or not",
    "worker_host.failed": "a worker host failed a page: that host is fenced, not the run",
    "worker_host.fenced": "a worker host submitted what was not leased to it: refused, and "
    "the host fenced",
    # evidence worker (a worker host), as it sees its coordinator
    "worker.serving": "this worker host serves a run",
    "worker.coordinator_lost": "this worker host lost its coordinator and connects again",
    "worker.gave_up": "this worker host found no coordinator for --reconnect-timeout",
    "worker.run_ended": "the coordinator ended the run this worker host served",
    # the writer and its service
    "writer.reconnect": "the writer lost its database connection and retries the batch",
    "writer.commit_uncertain": "a COMMIT's outcome was unknown; what the store holds "
                               "decides it",
    "writer.checkpoint_failed": "a WAL checkpoint after a commit failed",
    "writer.closed_in_flight": "the writer's event loop closed with a batch in flight",
    "writer.reconnect_failed": "the writer's connection could not be made again while idle",
    "service.ready": "evidence serve listens",
    "service.waiting_for_lock": "evidence serve waits for the store's writer lock",
    "service.stopping": "evidence serve stops: no new connections, then drains",
    "service.accept_failed": "accepting a connection failed",
    "service.connection_failed": "a connection failed as it was accepted",
    "service.submission_refused": "the coordinator refused what a worker host submitted "
    "(not_leased); nothing of it was written",
    "service.protocol_error": "a client broke the protocol; its connection or request "
                              "was refused",
    "service.slow_client_dropped": "a client that did not read its answers was dropped",
    "client.reconnect": "the client lost the service and reconnects, to redeliver",
    "client.ended_by_service": "the service ended the client's connection",
    # the store at rest
    "postgresql.unreachable": "PostgreSQL did not answer; retrying until the outage deadline",
    "postgresql.reachable": "PostgreSQL answers again after an outage",
    "postgresql.connection_lost": "the write connection was lost while idle; connecting again",
    "postgresql.standby_connection_lost": "a standby lost its connection while waiting for "
                                          "the writer lock; connecting again",
    "store.artifacts_elsewhere": "the store's payloads are in another location than given",
    "store.fsync_failed": "an fsync failed: the store is marked for a resync",
    "store.resync_marker_failed": "the resync marker could not be left",
    "store.resynced": "the store was resynced after a failed fsync",
    "pack.seal_failed": "a pack could not be sealed",
    "pack.prepare_failed": "the next pack could not be created ahead",
    "pack.fsync_record_failed": "a pack's failed fsync could not be recorded",
    "pack.bad_header": "a pack file has no valid header; its bytes are kept, unread",
    "pack.torn_tail": "a pack's tail is not whole records (a crash); it is ignored",
    "pack.resealed": "a pack whose index did not reach the disk was sealed again",
    "s3.retry": "an S3 request failed and is retried",
    "s3.outage": "the object store has been unreachable or failing for a second; requests "
                 "wait, up to the outage deadline",
    "s3.reachable": "the object store answers again after an outage",
    "s3.held_dropped": "payloads held for a segment could not be stored at close",
    "s3.object_replaced": "an S3 object held other bytes than its digest; replaced",
    "s3.segment_unreadable": "an S3 segment's trailer or index is damaged; not read",
    "s3.touch_failed": "an S3 object's time could not be refreshed",
    "archive.partial_removed": "a partial build left by a killed export or restore was "
                               "removed",
    "archive.read_retry": "reading a payload for an archive failed; it is tried again",
    "checkpoint.retry": "a checkpoint to object storage failed; the next is on time",
    "checkpoint.done": "a checkpoint to object storage is complete",
    "scratch.removed": "a private directory left by a process that ended was removed",
}

# The ids a line may carry, as they are named in the messages and the store.
CONTEXT_KEYS = ("run_id", "session_id", "url", "attempt_id")
FORMATS = ("text", "json")
LEVELS = ("debug", "info", "warning", "error")

_CONTEXT: contextvars.ContextVar[Mapping[str, str]] = contextvars.ContextVar(
    "evidence_log_context", default=MappingProxyType({}))


@contextlib.contextmanager
def log_context(**ids: str | None) -> Iterator[None]:
    """Lines logged inside (and in tasks started inside) carry these ids; None is left out."""
    token = _CONTEXT.set(_merged(ids))
    try:
        yield
    finally:
        _CONTEXT.reset(token)


def add_log_context(**ids: str | None) -> None:
    """Add ids to the current context until the enclosing ``log_context`` ends (an id
    learnt halfway through it, as a run learns its session's)."""
    _CONTEXT.set(_merged(ids))


def _merged(ids: Mapping[str, str | None]) -> dict[str, str]:
    unknown = set(ids) - set(CONTEXT_KEYS)
    if unknown:
        raise ValueError(f"not a log context key: {', '.join(sorted(unknown))}")
    return {**_CONTEXT.get(), **{k: v for k, v in ids.items() if v}}


def line_fields(record: logging.LogRecord) -> dict[str, str]:
    """The context ids of a record: those of where it was logged, then any the call gave
    (``extra={"url": ...}``)."""
    fields = dict(_CONTEXT.get())
    for key in CONTEXT_KEYS:
        value = record.__dict__.get(key)
        if value:
            fields[key] = str(value)
    return fields


class TextFormatter(logging.Formatter):
    """``TIME LEVEL message``: the form a person reads on a terminal."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(message)s")


class JsonFormatter(logging.Formatter):
    """One JSON object per line, its keys always in the same order."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": str(record.__dict__.get("event") or "log"),
            "message": record.getMessage(),
            "pid": record.process,
        }
        ids = line_fields(record)
        line.update((key, ids[key]) for key in CONTEXT_KEYS if key in ids)  # in this order
        data = record.__dict__.get("data")
        if data:
            line["data"] = data
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["error"] = record.exc_text
        return msgspec.json.encode(line).decode()


def set_level(level: str) -> None:
    """Log ``level`` and up from this package's loggers (``evidence.*``); other libraries'
    lines from WARNING up whatever the level (asyncio's debug lines are not ours to show)."""
    number = logging.getLevelNamesMapping()[level.upper()]
    logging.getLogger("evidence").setLevel(number)
    logging.getLogger().setLevel(max(number, logging.WARNING))


def log_arguments() -> list[str]:
    """``--log-format`` and ``--log-level`` as this process logs: what a child process it
    starts is given, so that its lines match this one's."""
    root = logging.getLogger()
    json_lines = any(isinstance(h.formatter, JsonFormatter) for h in root.handlers)
    level = logging.getLevelName(logging.getLogger("evidence").getEffectiveLevel()).lower()
    return ["--log-format", "json" if json_lines else "text",
            "--log-level", level if level in LEVELS else "info"]
