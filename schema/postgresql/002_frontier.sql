-- 002_frontier (PostgreSQL): mirrors schema/002_frontier.sql. Working state, changed only by
-- the writer applying logged messages; frontier rows are never deleted.

CREATE TABLE frontier (
    frontier_id       bigint PRIMARY KEY,
    session_id        text NOT NULL REFERENCES crawl_session (session_id) DEFERRABLE,
    url_id            bigint NOT NULL REFERENCES url_identity (url_id) DEFERRABLE,
    url               text NOT NULL,
    state             text NOT NULL CHECK (state IN ('queued', 'in_flight', 'done', 'failed',
                                                     'skipped')),
    depth             bigint NOT NULL CHECK (depth >= 0),
    via               text NOT NULL CHECK (via IN ('seed', 'link', 'redirect', 'sitemap',
                                                   'embed')),
    source_attempt_id text,
    attempts          bigint NOT NULL DEFAULT 0,
    reason            text NOT NULL DEFAULT '',
    not_before        text,
    claimed_run_id    text REFERENCES crawl_run (run_id) DEFERRABLE,
    claimed_at        text,
    updated_log_index bigint NOT NULL REFERENCES ingest_ledger (log_index) DEFERRABLE,
    UNIQUE (session_id, url_id)
);
CREATE INDEX frontier_by_state ON frontier (session_id, state, frontier_id);

CREATE TABLE host_state (
    host              text PRIMARY KEY,
    robots_attempt_id text REFERENCES fetch_attempt (attempt_id) DEFERRABLE,
    robots_expires_at text,
    crawl_delay       double precision,
    backoff_until     text,
    reason            text NOT NULL DEFAULT '',
    updated_log_index bigint NOT NULL REFERENCES ingest_ledger (log_index) DEFERRABLE
);

CREATE FUNCTION frontier_next_id() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN SELECT coalesce(max(frontier_id), 0) + 1 INTO NEW.frontier_id FROM frontier; RETURN NEW; END $$;
CREATE TRIGGER frontier_rowid BEFORE INSERT ON frontier FOR EACH ROW
WHEN (NEW.frontier_id IS NULL) EXECUTE FUNCTION frontier_next_id();

CREATE TRIGGER frontier_no_delete BEFORE DELETE OR TRUNCATE ON frontier
FOR EACH STATEMENT EXECUTE FUNCTION evidence_refuse('frontier rows are never deleted');
