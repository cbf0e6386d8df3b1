-- 002_frontier: the durable frontier of each session, and what is known of each host.
--
-- These are working state, not evidence: rows change as the crawl moves. Every change is
-- made by the writer applying a 'frontier' or 'host' message, which is itself in the
-- ledger, so the history of every transition is evidence even though the rows move.
-- 'updated_log_index' names the message that last changed a row.

-- One URL in one session's frontier.
CREATE TABLE frontier (
    frontier_id       INTEGER PRIMARY KEY,          -- discovery order
    session_id        TEXT NOT NULL REFERENCES crawl_session (session_id),
    url_id            INTEGER NOT NULL REFERENCES url_identity (url_id),
    url               TEXT NOT NULL,                -- as first queued: what is requested
    state             TEXT NOT NULL CHECK (state IN ('queued', 'in_flight', 'done', 'failed',
                                                     'skipped')),
    depth             INTEGER NOT NULL CHECK (depth >= 0),
    via               TEXT NOT NULL CHECK (via IN ('seed', 'link', 'redirect', 'sitemap',
                                                   'embed')),
    source_attempt_id TEXT,                         -- where it was first found
    attempts          INTEGER NOT NULL DEFAULT 0,   -- claims so far
    reason            TEXT NOT NULL DEFAULT '',     -- why skipped, failed or requeued
    not_before        TEXT,
    claimed_run_id    TEXT REFERENCES crawl_run (run_id),
    claimed_at        TEXT,
    updated_log_index INTEGER NOT NULL REFERENCES ingest_ledger (log_index),
    UNIQUE (session_id, url_id)
) STRICT;
CREATE INDEX frontier_by_state ON frontier (session_id, state, frontier_id);

-- One host: robots.txt in force and backoff, as last recorded.
CREATE TABLE host_state (
    host              TEXT PRIMARY KEY,
    robots_attempt_id TEXT REFERENCES fetch_attempt (attempt_id),
    robots_expires_at TEXT,
    crawl_delay       REAL,
    backoff_until     TEXT,
    reason            TEXT NOT NULL DEFAULT '',
    updated_log_index INTEGER NOT NULL REFERENCES ingest_ledger (log_index)
) STRICT;

CREATE TRIGGER frontier_no_delete BEFORE DELETE ON frontier
BEGIN SELECT RAISE(ABORT, 'frontier rows are never deleted'); END;
