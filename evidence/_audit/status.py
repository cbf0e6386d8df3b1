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
from .._model.urls import NORMALIZER_VERSION
from .._store.db import Store

__all__ = ["RunStatus", "SessionStatus", "StoreStatus", "status"]

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
