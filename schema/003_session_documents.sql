-- 003_session_documents: what a completed session found, document by document.
--
-- Written once, when a session completes (never by a run that stopped early): one row per
-- URL whose last attempt in the session got an HTTP answer, classified against the
-- session's baseline (the last completed session), plus one 'orphaned' row per baseline
-- document this session never reached. It is the baseline of the next session.

CREATE TABLE session_document (
    session_id    TEXT NOT NULL REFERENCES crawl_session (session_id),
    url_id        INTEGER NOT NULL REFERENCES url_identity (url_id),
    url           TEXT NOT NULL,
    change        TEXT NOT NULL CHECK (change IN ('new', 'changed', 'unchanged', 'orphaned')),
    http_status   INTEGER,                  -- as of this session (NULL when orphaned)
    body_digest   TEXT,                     -- BLAKE3 of the body this session stands for
    attempt_id    TEXT REFERENCES fetch_attempt (attempt_id),  -- the attempt that settled it
    fetched_at    TEXT,                     -- when the content was last actually fetched
    log_index     INTEGER NOT NULL REFERENCES ingest_ledger (log_index),
    PRIMARY KEY (session_id, url_id)
) STRICT, WITHOUT ROWID;

CREATE TRIGGER session_document_no_update BEFORE UPDATE ON session_document
BEGIN SELECT RAISE(ABORT, 'session_document is append-only'); END;
CREATE TRIGGER session_document_no_delete BEFORE DELETE ON session_document
BEGIN SELECT RAISE(ABORT, 'session_document is append-only'); END;
