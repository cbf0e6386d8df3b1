"""A run's records in its session: how it begins (a new session, or the open one resumed,
with what a crash left in flight requeued) and how it ends.

The engine (``_crawl.crawler``) commits what these build. A session is one complete pass
over the configured scope; a run is one execution of the crawler inside it. A run that
finds the last session open resumes it (with the same configuration, else it is refused),
closes the runs that recorded no end, and requeues each URL left in flight, or fails it
once it has been claimed ``max_attempts`` times (a page that kills the crawler cannot loop
across restarts). A run that finds none, or is told ``clean``, starts a new session: full,
or incremental against the last completed one.
"""

from __future__ import annotations

import datetime as dt
import errno
import os
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

import apsw

from .._errors import EvidenceError, OutageTooLong, StoreError
from .._model.messages import (
    FrontierUpdate,
    Message,
    QueuedUrl,
    RunEnded,
    RunStarted,
    SessionDocuments,
    SessionEnded,
    SessionStarted,
    SettledUrl,
    new_id,
    utc_now,
)
from .._model.urls import resolve_reference
from . import frontier
from .frontier import CrawlConfig
from .incremental import session_records

__all__ = ["Opening", "Outcome", "documents", "no_seed_fetched", "open_session", "run_ended",
           "stopped_by_the_store"]

_DOCUMENTS_PER_MESSAGE = 2000

Outcome = Literal["completed", "stopped", "capped", "failed"]


@dataclass
class Opening:
    """How a run begins: its session, the session's baseline (incremental), and the
    messages that record it, to commit as one group."""

    session_id: str
    baseline_id: str | None
    resumed: bool
    messages: list[Message] = field(default_factory=list)


def open_session(reader: apsw.Connection, config: CrawlConfig, run_id: str, *, clean: bool,
                 full: bool, skip: Callable[[str, int], str | None]) -> Opening:
    """Start or resume the session and start the run; requeue what a crash left in flight.
    ``skip(url, depth)`` is the scope's verdict on a seed."""
    now = utc_now()
    last = frontier.last_session(reader)
    messages: list[Message] = []
    if last is not None and last.outcome is None and clean:
        messages += _close_runs(last.open_runs, "abandoned by --clean", now)
        messages.append(SessionEnded(message_id=new_id("m-"), session_id=last.session_id,
                                     ended_at=now, outcome="abandoned"))
        last = None

    def run(session_id: str) -> RunStarted:
        return RunStarted(message_id=new_id("m-"), run_id=run_id, session_id=session_id,
                          started_at=now, program="evidence crawl",
                          host=socket.gethostname(), pid=os.getpid())

    def update(session_id: str, **changes: list) -> FrontierUpdate:
        return FrontierUpdate(message_id=new_id("m-"), session_id=session_id,
                              run_id=run_id, at=utc_now(), **changes)

    if last is not None and last.outcome is None:
        differ = config.differences(last.config)
        if differ:
            raise EvidenceError(
                f"session {last.session_id} is open with a different configuration; "
                f"these keys differ: {', '.join(differ)}",
                hint="start with the same configuration to resume it, or add --clean "
                "to abandon it and start a new session", keys=differ)
        session_id = last.session_id
        messages += _close_runs(last.open_runs, f"no end recorded (killed or "
                                f"crashed); found by run {run_id}", now)
        messages.append(run(session_id))
        settled = []
        for url, attempts in frontier.in_flight(reader, session_id):
            if attempts >= config.max_attempts:
                settled.append(SettledUrl(url=url, state="failed", reason=(
                    f"attempts exhausted: claimed {attempts} times without a result "
                    "(the crawler stopped or crashed while fetching it)")))
            else:
                settled.append(SettledUrl(url=url, state="queued", reason=(
                    f"requeued: in flight when an earlier run ended "
                    f"(attempt {attempts} of {config.max_attempts})")))
        if settled:
            messages.append(update(session_id, settled=settled))
        # a resumed run keeps its session's mode
        return Opening(session_id, last.baseline_session_id, True, messages)
    session_id = new_id("session-")
    baseline_id = None if clean or full else frontier.last_completed_session(reader)
    messages.append(SessionStarted(
        message_id=new_id("m-"), session_id=session_id, started_at=now,
        mode="full" if baseline_id is None else "incremental",
        config=config.as_record(), baseline_session_id=baseline_id))
    messages.append(run(session_id))
    seeds = [QueuedUrl(url=s, depth=0, via="seed", skip=skip(s, 0)) for s in config.seeds]
    if config.sitemap:  # first, so their recrawl hints are known early
        sitemaps = dict.fromkeys(resolve_reference(s, "/sitemap.xml") for s in config.seeds)
        seeds = [QueuedUrl(url=u, depth=0, via="sitemap") for u in sitemaps] + seeds
    messages.append(update(session_id, queued=seeds))
    return Opening(session_id, baseline_id, False, messages)


def _close_runs(run_ids: list[str], reason: str, now: dt.datetime) -> list[Message]:
    return [RunEnded(message_id=new_id("m-"), run_id=r, ended_at=now, outcome="failed",
                     reason=reason) for r in run_ids]


def run_ended(run_id: str, session_id: str, outcome: Outcome, reason: str, *,
              complete: bool) -> list[Message]:
    """The run's end, and the session's when its frontier is exhausted (``complete``)."""
    now = utc_now()
    messages: list[Message] = [RunEnded(message_id=new_id("m-"), run_id=run_id,
                                        ended_at=now, outcome=outcome, reason=reason)]
    if complete:
        messages.append(SessionEnded(message_id=new_id("m-"), session_id=session_id,
                                     ended_at=now, outcome="completed"))
    return messages


def documents(reader: apsw.Connection, session_id: str, run_id: str,
              baseline: str | None) -> Iterator[SessionDocuments]:
    """The completed session's record of every document, in chunks, before its end.

    Only a session whose frontier is exhausted gets here, so orphans are never inferred
    from a run that stopped early. Rows are keyed by (session, url): a run that crashed
    halfway through writing them rewrites the rest and duplicates nothing.
    """
    chunk: list = []
    for record in session_records(reader, session_id, baseline):
        chunk.append(record)
        if len(chunk) == _DOCUMENTS_PER_MESSAGE:
            yield SessionDocuments(message_id=new_id("m-"), session_id=session_id,
                                   run_id=run_id, documents=chunk)
            chunk = []
    if chunk:
        yield SessionDocuments(message_id=new_id("m-"), session_id=session_id,
                               run_id=run_id, documents=chunk)


def no_seed_fetched(reader: apsw.Connection, session_id: str) -> str | None:
    """Why the session got nothing, when not one seed was fetched; else None.

    Its frontier is exhausted, so the session completes (a new crawl starts afresh), but
    the run fails: a crawl of an unreachable site must not look like a success.
    """
    seeds = frontier.seeds(reader, session_id)
    if not seeds or any(state == "done" for _url, state, _reason in seeds):
        return None
    if frontier.counts(reader, session_id).done:
        return None  # a seed was skipped, and a sitemap's pages were fetched
    why = "; ".join(f"{url}: {state}: {reason}" for url, state, reason in seeds[:3])
    more = f"; and {len(seeds) - 3} more" if len(seeds) > 3 else ""
    return f"no seed could be fetched ({why}{more})"


def stopped_by_the_store(exc: BaseException, location: str) -> StoreError | None:
    """What a run that failed on ``exc`` says when the store stopped it: the database
    server out of reach past its outage deadline, or a full disk; None otherwise."""
    too_long = _outage_too_long(exc)
    if too_long is not None:
        return StoreError(
            f"{too_long}; the run stopped (everything committed before is kept, "
            "and the session stays open)",
            hint=f"once the server is back, resume: evidence crawl --store "
            f"{location} (--db-outage-deadline SECONDS waits longer)", path=location)
    if _disk_full(exc):
        return StoreError(
            f"{location}: the disk is full; the run stopped "
            "(everything committed before is kept, and the session stays open)",
            hint=f"free disk space, then resume: evidence crawl --store {location}",
            path=location)
    return None


def _disk_full(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or what caused it) says the disk is full: SQLite's SQLITE_FULL, or
    ENOSPC/EDQUOT from the artifact store."""
    while exc is not None:
        code = getattr(exc, "sqlite_code", None)
        if isinstance(code, int) and code & 0xFF == 13:  # SQLITE_FULL
            return True
        if getattr(exc, "errno", None) in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
            return True
        exc = exc.__cause__
    return False


def _outage_too_long(exc: BaseException | None) -> OutageTooLong | None:
    """The database outage past its deadline that ``exc`` comes from, if it does."""
    while exc is not None:
        if isinstance(exc, OutageTooLong):
            return exc
        exc = exc.__cause__
    return None
