"""What a store holds right now, read in one short read-only snapshot.

``status(store)`` never blocks the writer: it uses its own ``query_only`` connection and
one read transaction that ends before it returns.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import msgspec

from .._crawl.frontier import FrontierCounts, counts
from .._model.merkle import root as merkle_root
from .._model.messages import now_text
from .._model.units import format_bytes
from .._model.urls import NORMALIZER_VERSION
from .._store.db import Store

__all__ = ["RunStatus", "SessionStatus", "StoreStatus", "status", "status_text"]

LIVE_STATS = "live-stats.json"  # written by a running crawl (evidence._crawl.crawler)

# The tables whose rows status counts, in a fixed order.
COUNTED_TABLES = (
    "crawl_session", "crawl_run", "url_identity", "fetch_attempt", "artifact",
    "discovery_edge", "rule_evaluation", "url_current", "ingest_ledger", "quarantine",
    "commit_log", "frontier", "host_state", "render", "dns_resolution",
)


class SessionStatus(msgspec.Struct, frozen=True, kw_only=True):
    session_id: str
    mode: str
    started_at: str
    ended_at: str | None
    outcome: str | None
    runs: int
    frontier: FrontierCounts


class RunStatus(msgspec.Struct, frozen=True, kw_only=True):
    run_id: str
    session_id: str
    started_at: str
    ended_at: str | None
    outcome: str | None
    attempts: int
    pid: int  # the process that ran it
    host: str
    # The outcome; for a run with no end recorded, "running" while its process holds the
    # store's lock, else "interrupted (process N is gone)" (killed, OOM, power cut: the next
    # crawl records it as failed).
    state: str


class StoreStatus(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    store_id: str
    schema_version: int
    normalizer_version: int
    sync: str
    sessions: list[SessionStatus]
    runs: list[RunStatus]  # the most recent runs, newest first
    rows: dict[str, int]
    artifact_bytes: int
    conflicts: int  # quarantined because their id was recorded with other content
    quarantined: int  # conflicts and rejections
    tree_size: int
    root: str
    last_commit_at: str | None
    wal_bytes: int
    hosts_in_backoff: list[str]
    crawl_pid: int | None  # the crawl running on this store now, if any
    live: dict[str, Any] | None  # its last progress and writer metrics (live-stats.json)


def status(store: Store, *, recent_runs: int = 20) -> StoreStatus:
    """Counts, sessions, recent runs, the log head and the WAL size of ``store``."""
    with store.snapshot() as conn:
        rows = {t: conn.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0]
                for t in COUNTED_TABLES}
        sessions = [SessionStatus(session_id=s, mode=m, started_at=a, ended_at=e,
                                  outcome=o, runs=n, frontier=counts(conn, s))
                    for s, m, a, e, o, n in conn.execute(
            "SELECT s.session_id, s.mode, s.started_at, s.ended_at, s.outcome, "
            "(SELECT count(*) FROM crawl_run r WHERE r.session_id = s.session_id) "
            "FROM crawl_session s ORDER BY s.started_at DESC, s.session_id LIMIT 20")]
        runs = conn.execute(
            "SELECT r.run_id, r.session_id, r.started_at, r.ended_at, r.outcome, "
            "(SELECT count(*) FROM fetch_attempt f WHERE f.run_id = r.run_id), r.pid, "
            "r.host FROM crawl_run r ORDER BY r.started_at DESC, r.run_id LIMIT ?",
            (recent_runs,)).fetchall()
        artifact_bytes = conn.execute(
            "SELECT coalesce(sum(size), 0) FROM artifact").fetchall()[0][0]
        conflicts = conn.execute(
            "SELECT count(*) FROM quarantine WHERE reason_code = 'conflict'"
        ).fetchall()[0][0]
        head = conn.execute("SELECT tree_size, root, committed_at FROM commit_log "
                            "ORDER BY batch_seq DESC LIMIT 1").fetchall()
        meta = dict(conn.execute("SELECT key, value FROM store_meta"))
        backoff = [f"{h} until {u} ({r})" for h, u, r in conn.execute(
            "SELECT host, backoff_until, reason FROM host_state "
            "WHERE backoff_until > ? ORDER BY host", (now_text(),))]
    tree_size, root, last = head[0] if head else (0, None, None)
    holder = store.running_writer()
    pid = None if holder is None or holder[1] != socket.gethostname() else holder[0]
    runs = [RunStatus(run_id=r, session_id=s, started_at=a, ended_at=e, outcome=o,
                      attempts=n, pid=p, host=h, state=run_state(o, p, h, pid))
            for r, s, a, e, o, n, p, h in runs]
    return StoreStatus(
        path=store.location, store_id=meta.get("store_id", ""),
        schema_version=store.schema_version, normalizer_version=NORMALIZER_VERSION,
        sync=store.sync, sessions=sessions, runs=runs, rows=rows,
        artifact_bytes=artifact_bytes, conflicts=conflicts,
        quarantined=rows["quarantine"], tree_size=tree_size,
        root=(root if root is not None else merkle_root([])).hex(), last_commit_at=last,
        wal_bytes=store.wal_size(), hosts_in_backoff=backoff, crawl_pid=pid,
        live=_live(store.path / LIVE_STATS) if pid and store.path is not None else None)


def run_state(outcome: str | None, pid: int, host: str, holder: int | None) -> str:
    """A run's state, from its record and the store lock's holder (``_store.runlock``): a run with
    no end whose process no longer holds the lock was interrupted (SIGKILL, OOM, power)."""
    if outcome is not None:
        return outcome
    if host != socket.gethostname():
        return f"no end recorded (process {pid} on {host}; not checked from here)"
    if holder == pid:
        return "running"
    return f"interrupted (process {pid} is gone)"


def _live(path: Path) -> dict[str, Any] | None:
    try:
        return msgspec.json.decode(path.read_bytes())
    except (FileNotFoundError, msgspec.DecodeError):
        return None


def status_text(s: StoreStatus) -> str:
    """What ``evidence status`` prints: the store, its log, its sessions and runs."""
    lines = [
        f"store      {s.path}",
        f"id         {s.store_id}  (schema v{s.schema_version}, normalizer "
        f"v{s.normalizer_version}, sync={s.sync})",
        f"log        {s.tree_size} messages, root {s.root[:16]}…, last commit "
        f"{s.last_commit_at or 'never'}",
        f"artifacts  {s.rows['artifact']} ({format_bytes(s.artifact_bytes)})",
        f"attempts   {s.rows['fetch_attempt']}   edges {s.rows['discovery_edge']}   "
        f"urls {s.rows['url_identity']}   rule verdicts {s.rows['rule_evaluation']}   "
        f"renders {s.rows['render']}",
        f"quarantine {s.quarantined} ({s.conflicts} conflicts)",
        f"wal        {format_bytes(s.wal_bytes)}",
    ]
    if s.crawl_pid and not s.live:
        lines.append(f"in use     pid {s.crawl_pid} holds the store (a writer service, or a "
                     "crawl just starting)")
    if s.crawl_pid and s.live:
        live = s.live
        writer = live.get("writer") or {}
        lines.append(f"crawling   pid {s.crawl_pid}, run {live.get('run_id', '?')}: "
                     f"{live.get('requested', 0)} requests, {live.get('in_flight', 0)} in "
                     f"flight, {float(live.get('pages_per_second', 0.0)):.1f} pages/s")
        if live.get("worker_pids"):
            lines.append("workers    worker processes, pids "
                         + ", ".join(str(pid) for pid in live["worker_pids"]))
        if writer:
            lines.append(f"writer     queue {writer['queue_depth']}, oldest pending "
                         f"{writer['oldest_pending_age']:.3f} s, {writer['batches']} batches, "
                         f"commit p50 {writer['commit_latency_p50'] * 1000:.1f} ms p99 "
                         f"{writer['commit_latency_p99'] * 1000:.1f} ms, "
                         f"{writer['duplicates']} duplicates, {writer['busy_retries']} busy "
                         "retries")
    if s.hosts_in_backoff:
        lines.append("backoff    " + "; ".join(s.hosts_in_backoff))
    if s.sessions:
        lines.append("sessions")
        for x in s.sessions:
            f = x.frontier
            lines.append(f"  {x.session_id}  {x.mode:<11} {x.outcome or 'open':<9} runs "
                         f"{x.runs}  started {x.started_at}")
            lines.append(f"    frontier: {f.done} done, {f.queued} queued, {f.in_flight} in "
                         f"flight, {f.failed} failed, {f.skipped} skipped" + (
                             f"; oldest in flight since {f.oldest_in_flight_at}"
                             if f.oldest_in_flight_at else ""))
    if s.runs:
        lines.append("runs")
        lines += [_run_line(r) for r in s.runs]
    return "\n".join(lines)


def _run_line(r: RunStatus) -> str:
    return f"  {r.run_id}  {r.state:<9} attempts {r.attempts}  session {r.session_id}"
