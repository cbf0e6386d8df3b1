-- 003_session_documents (PostgreSQL): mirrors schema/003_session_documents.sql.

CREATE TABLE session_document (
    session_id    text NOT NULL REFERENCES crawl_session (session_id) DEFERRABLE,
    url_id        bigint NOT NULL REFERENCES url_identity (url_id) DEFERRABLE,
    url           text NOT NULL,
    change        text NOT NULL CHECK (change IN ('new', 'changed', 'unchanged', 'orphaned')),
    http_status   bigint,
    body_digest   text,
    attempt_id    text REFERENCES fetch_attempt (attempt_id) DEFERRABLE,
    fetched_at    text,
    log_index     bigint NOT NULL REFERENCES ingest_ledger (log_index) DEFERRABLE,
    PRIMARY KEY (session_id, url_id)
);

CREATE TRIGGER session_document_no_update BEFORE UPDATE OR DELETE OR TRUNCATE ON session_document
FOR EACH STATEMENT EXECUTE FUNCTION evidence_refuse('session_document is append-only');
