"""Evidence rows against the ledger entries that wrote them, where an archive holds both.

The ledger is what the Merkle tree and a checkpoint bind; the tables are what a reader
queries. ``evidence verify`` rebuilds every row with the writer's own code. This module
redoes, from the messages alone, the part a reader relies on most and that needs none of
that code:

- ``ingest_ledger``: each row's ``message_id`` and ``kind`` are its payload's;
- ``crawl_session`` and ``crawl_run``: each row's fields are those of its
  ``session_started``/``run_started`` entry and, when ended, its ``session_ended``/
  ``run_ended`` entry; every such entry has its row, and no row lacks its entry;
- ``fetch_attempt``: each row written by a ``fetch_attempt`` entry (its ``log_index``) has
  that entry's attempt id, run, URL, sequence, method, time, duration, outcome, status,
  content type, error, capture and codings, and references the payloads (namespace,
  BLAKE3, size) the entry names; every ``fetch_attempt`` entry has its row.

Not checked here (``evidence verify`` on a restored copy checks them): links
(``discovery_edge``), rule verdicts, renders and the attempts a browser made, the record a
session keeps of its documents, the working state (``frontier``, ``host_state``), the
``url_current`` projection, DNS answers and connection details, and URL keys.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from .msgpack import unpack
from .verdict import Verdict

# fetch_attempt column -> (message field, the message's default when it leaves it out)
_ATTEMPT = {
    "attempt_id": ("attempt_id", None), "run_id": ("run_id", None), "url": ("url", None),
    "sequence": ("sequence", None), "method": ("method", "GET"),
    "started_at": ("started_at", None), "elapsed_ms": ("elapsed_ms", None),
    "outcome": ("outcome", None), "http_status": ("http_status", None),
    "body_truncated": ("body_truncated", False), "content_type": ("content_type", None),
    "error": ("error", None), "capture": ("capture", "rebuilt"),
    "transfer_coding": ("transfer_coding", None), "content_coding": ("content_coding", None),
    "content_truncated": ("content_truncated", False),
    "text_encoding": ("text_encoding", None),
    "text_encoding_source": ("text_encoding_source", None),
}
_REFS = {"request_headers_id": "request_headers", "response_headers_id": "response_headers",
         "body_id": "body", "content_id": "content", "surplus_id": "surplus"}
_MAX = 20  # problems listed per table; the rest are counted


def check_rows(db: sqlite3.Connection, verdict: Verdict) -> None:
    entries: dict[int, dict[str, Any]] = {}
    by_kind: dict[str, list[int]] = {}
    found = _Found(verdict)
    for index, message_id, kind, payload in db.execute(
            "SELECT log_index, message_id, kind, payload FROM ingest_ledger"):
        try:
            message = unpack(payload)
        except ValueError as exc:
            found.add("ingest_ledger", f"ledger entry {index} does not decode ({exc})")
            continue
        if not isinstance(message, dict):
            found.add("ingest_ledger", f"ledger entry {index} is not a message")
            continue
        if (message.get("message_id"), message.get("kind")) != (message_id, kind):
            found.add("ingest_ledger", f"ledger entry {index}: message_id {message_id!r} and "
                      f"kind {kind!r} are not its payload's")
        entries[index] = message
        by_kind.setdefault(str(message.get("kind")), []).append(index)
    _sessions(db, entries, by_kind, found)
    _runs(db, entries, by_kind, found)
    _attempts(db, entries, by_kind, found)
    found.close()


class _Found:
    def __init__(self, verdict: Verdict) -> None:
        self.verdict, self.counts = verdict, dict[str, int]()

    def add(self, table: str, message: str) -> None:
        n = self.counts[table] = self.counts.get(table, 0) + 1
        if n <= _MAX:
            self.verdict.problem(message)

    def close(self) -> None:
        for table, n in sorted(self.counts.items()):
            if n > _MAX:
                self.verdict.problem(f"{table}: {n - _MAX} more row(s) disagree with the "
                                     "ledger, not listed")


def _ended(entries: dict, indexes: list[int], key: str) -> dict[str, dict]:
    return {entries[i][key]: entries[i] for i in indexes}


def _same(have: object, want: object) -> bool:
    if isinstance(want, bool):
        return have == int(want)
    if isinstance(want, float) and isinstance(have, int | float):
        return float(have) == want
    return have == want


def _compare(found: _Found, table: str, key: str, row: dict, want: dict) -> None:
    for column, value in want.items():
        if not _same(row[column], value):
            found.add(table, f"{table} {key}: {column} is {row[column]!r}, its ledger entry "
                      f"says {value!r}")


def _rows(db: sqlite3.Connection, table: str, key: str) -> dict[str, dict]:
    cursor = db.execute(f"SELECT * FROM {table}")
    names = [d[0] for d in cursor.description]
    return {r[names.index(key)]: dict(zip(names, r, strict=True)) for r in cursor}


def _sessions(db: sqlite3.Connection, entries: dict, by_kind: dict, found: _Found) -> None:
    rows = _rows(db, "crawl_session", "session_id")
    ended = _ended(entries, by_kind.get("session_ended", []), "session_id")
    for index in by_kind.get("session_started", []):
        m = entries[index]
        row = rows.pop(m["session_id"], None)
        if row is None:
            found.add("crawl_session", f"session {m['session_id']} (ledger entry {index}) "
                      "has no crawl_session row")
            continue
        end = ended.get(m["session_id"], {})
        _compare(found, "crawl_session", m["session_id"], row, {
            "started_at": m["started_at"], "mode": m.get("mode", "full"),
            "baseline_session_id": m.get("baseline_session_id"),
            "ended_at": end.get("ended_at"), "outcome": end.get("outcome")})
        try:
            config = json.loads(row["config"]) if row["config"] else {}
        except ValueError:
            config = None
        if config != m.get("config", {}):
            found.add("crawl_session", f"crawl_session {m['session_id']}: config is not its "
                      "ledger entry's")
    for session_id in rows:
        found.add("crawl_session", f"crawl_session {session_id} was written by no ledger entry")


def _runs(db: sqlite3.Connection, entries: dict, by_kind: dict, found: _Found) -> None:
    rows = _rows(db, "crawl_run", "run_id")
    ended = _ended(entries, by_kind.get("run_ended", []), "run_id")
    for index in by_kind.get("run_started", []):
        m = entries[index]
        row = rows.pop(m["run_id"], None)
        if row is None:
            found.add("crawl_run", f"run {m['run_id']} (ledger entry {index}) has no "
                      "crawl_run row")
            continue
        end = ended.get(m["run_id"], {})
        want = {"session_id": m["session_id"], "started_at": m["started_at"],
                "program": m.get("program", ""), "host": m.get("host", ""),
                "pid": m.get("pid", 0), "ended_at": end.get("ended_at"),
                "outcome": end.get("outcome")}
        _compare(found, "crawl_run", m["run_id"], row, want)
        if (row["reason"] or "") != (end.get("reason") or ""):
            found.add("crawl_run", f"crawl_run {m['run_id']}: reason is {row['reason']!r}, "
                      f"its ledger entry says {end.get('reason')!r}")
    for run_id in rows:
        found.add("crawl_run", f"crawl_run {run_id} was written by no ledger entry")


def _attempts(db: sqlite3.Connection, entries: dict, by_kind: dict, found: _Found) -> None:
    artifacts = {a: (ns, digest, size) for a, ns, digest, size in db.execute(
        "SELECT artifact_id, namespace, digest, size FROM artifact")}
    rows = _rows(db, "fetch_attempt", "attempt_id")
    for index in by_kind.get("fetch_attempt", []):
        m = entries[index]
        row = rows.pop(m["attempt_id"], None)
        if row is None:
            found.add("fetch_attempt", f"attempt {m['attempt_id']} (ledger entry {index}) "
                      "has no fetch_attempt row")
            continue
        if row["log_index"] != index:
            found.add("fetch_attempt", f"fetch_attempt {m['attempt_id']}: log_index is "
                      f"{row['log_index']}, its ledger entry is {index}")
        _compare(found, "fetch_attempt", m["attempt_id"], row,
                 {column: m.get(field, default) for column, (field, default)
                  in _ATTEMPT.items() if column in row})
        for column, field in _REFS.items():
            ref = m.get(field)
            want = None if ref is None else (ref.get("namespace"), ref.get("digest"),
                                             ref.get("size"))
            have = artifacts.get(row.get(column)) if row.get(column) is not None else None
            if column in row and have != want:
                found.add("fetch_attempt", f"fetch_attempt {m['attempt_id']}: {field} is "
                          f"{have}, its ledger entry says {want}")
    for attempt_id, row in rows.items():  # a browser's requests come from render entries
        kind = entries.get(row["log_index"], {}).get("kind")
        if kind != "render":
            found.add("fetch_attempt", f"fetch_attempt {attempt_id} was written by no "
                      "fetch_attempt entry")
