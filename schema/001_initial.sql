-- 001_initial: the evidence tables, their uniqueness anchors, and append-only triggers.
--
-- Grain (one row is ...) and anchors follow DESIGN.md "Tables and their grain".
-- Evidence tables are append-only: triggers abort every UPDATE and DELETE.
-- crawl_session and crawl_run are facts with write-once end columns: a trigger allows
-- only the one UPDATE that sets the end fields from NULL, and nothing else.
-- url_current is a projection: it may only advance to a higher sequence.
-- Timestamps are TEXT, UTC, 'YYYY-MM-DDTHH:MM:SS.ffffffZ' (sorts as it reads).

CREATE TABLE store_meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) STRICT;

-- One complete pass over the configured scope.
CREATE TABLE crawl_session (
    session_id          TEXT PRIMARY KEY,
    started_at          TEXT NOT NULL,
    mode                TEXT NOT NULL CHECK (mode IN ('full', 'incremental')),
    config              TEXT NOT NULL,             -- canonical JSON
    baseline_session_id TEXT REFERENCES crawl_session (session_id),
    ended_at            TEXT,
    outcome             TEXT CHECK (outcome IN ('completed', 'abandoned')),
    CHECK ((ended_at IS NULL) = (outcome IS NULL))
) STRICT;

-- One execution of the crawler inside a session.
CREATE TABLE crawl_run (
    run_id     TEXT PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES crawl_session (session_id),
    started_at TEXT NOT NULL,
    program    TEXT NOT NULL,
    host       TEXT NOT NULL,
    pid        INTEGER NOT NULL,
    ended_at   TEXT,
    outcome    TEXT CHECK (outcome IN ('completed', 'stopped', 'capped', 'failed')),
    reason     TEXT,
    CHECK ((ended_at IS NULL) = (outcome IS NULL))
) STRICT;
CREATE INDEX crawl_run_by_session ON crawl_run (session_id, started_at);

-- One comparison key under one normalizer version.
CREATE TABLE url_identity (
    url_id             INTEGER PRIMARY KEY,
    normalizer_version INTEGER NOT NULL,
    fetch_key          TEXT NOT NULL,
    UNIQUE (normalizer_version, fetch_key)
) STRICT;

-- One immutable stored payload; its bytes live in the artifact store.
CREATE TABLE artifact (
    artifact_id INTEGER PRIMARY KEY,
    namespace   TEXT NOT NULL CHECK (namespace GLOB '[a-z0-9_-]*' AND length(namespace) BETWEEN 1 AND 32),
    digest      TEXT NOT NULL CHECK (length(digest) = 64 AND digest NOT GLOB '*[^0-9a-f]*'),
    size        INTEGER NOT NULL CHECK (size >= 0),
    UNIQUE (namespace, digest)
) STRICT;

-- One accepted message: its place in the Merkle log, its hash and its canonical bytes.
CREATE TABLE ingest_ledger (
    log_index    INTEGER PRIMARY KEY,              -- 0-based Merkle leaf index, contiguous
    message_id   TEXT NOT NULL UNIQUE,
    kind         TEXT NOT NULL,
    payload_hash TEXT NOT NULL,                    -- BLAKE3 of payload, hex
    leaf_hash    BLOB NOT NULL CHECK (length(leaf_hash) = 32),  -- SHA-256(0x00 || payload)
    payload      BLOB NOT NULL,                    -- canonical msgpack encoding
    batch_seq    INTEGER NOT NULL REFERENCES commit_log (batch_seq) DEFERRABLE INITIALLY DEFERRED,
    received_at  TEXT NOT NULL
) STRICT;

-- One committed batch: the Merkle tree after it, hash-chained to the previous batch.
CREATE TABLE commit_log (
    batch_seq    INTEGER PRIMARY KEY,              -- 1, 2, 3, ...
    committed_at TEXT NOT NULL,
    first_index  INTEGER NOT NULL,                 -- first log_index of the batch
    tree_size    INTEGER NOT NULL,                 -- leaves after the batch
    root         BLOB NOT NULL CHECK (length(root) = 32),
    frontier     BLOB NOT NULL,                    -- perfect-subtree roots, for O(log n) reopen
    prev_hash    BLOB NOT NULL CHECK (length(prev_hash) = 32),
    entry_hash   BLOB NOT NULL CHECK (length(entry_hash) = 32)
) STRICT;

-- One request attempt (or a decision not to request, with its reason).
CREATE TABLE fetch_attempt (
    attempt_seq          INTEGER PRIMARY KEY,
    attempt_id           TEXT NOT NULL UNIQUE,
    run_id               TEXT NOT NULL REFERENCES crawl_run (run_id),
    url_id               INTEGER NOT NULL REFERENCES url_identity (url_id),
    url                  TEXT NOT NULL,            -- exactly as requested
    sequence             INTEGER NOT NULL CHECK (sequence >= 0),
    method               TEXT NOT NULL,
    started_at           TEXT NOT NULL,
    elapsed_ms           REAL NOT NULL,
    outcome              TEXT NOT NULL CHECK (outcome IN ('response', 'network_error', 'timeout',
                             'too_large', 'refused_by_robots', 'skipped')),
    http_status          INTEGER,
    request_headers_id   INTEGER REFERENCES artifact (artifact_id),
    response_headers_id  INTEGER REFERENCES artifact (artifact_id),
    body_id              INTEGER REFERENCES artifact (artifact_id),
    body_truncated       INTEGER NOT NULL CHECK (body_truncated IN (0, 1)),
    content_type         TEXT,
    error                TEXT,
    log_index            INTEGER NOT NULL UNIQUE REFERENCES ingest_ledger (log_index),
    UNIQUE (run_id, url_id, sequence)
) STRICT;
CREATE INDEX fetch_attempt_by_url ON fetch_attempt (url_id, run_id);
CREATE INDEX fetch_attempt_by_body ON fetch_attempt (body_id) WHERE body_id IS NOT NULL;

-- One observed source-to-reference relation.
CREATE TABLE discovery_edge (
    edge_id            INTEGER PRIMARY KEY,
    run_id             TEXT NOT NULL REFERENCES crawl_run (run_id),
    source_attempt_seq INTEGER NOT NULL REFERENCES fetch_attempt (attempt_seq),
    source_artifact_id INTEGER NOT NULL REFERENCES artifact (artifact_id),
    position           INTEGER NOT NULL,           -- the node, in document order
    observed_ref       TEXT NOT NULL,              -- verbatim
    target_url_id      INTEGER NOT NULL REFERENCES url_identity (url_id),
    edge_kind          TEXT NOT NULL CHECK (edge_kind IN ('link', 'redirect', 'embed', 'sitemap')),
    tag                TEXT NOT NULL,
    attr               TEXT NOT NULL,
    rel                TEXT NOT NULL,
    log_index          INTEGER NOT NULL REFERENCES ingest_ledger (log_index),
    UNIQUE (run_id, source_artifact_id, position, observed_ref)
) STRICT;
CREATE INDEX discovery_edge_by_source ON discovery_edge (source_attempt_seq);
CREATE INDEX discovery_edge_by_target ON discovery_edge (target_url_id);

-- One rule version on one input set.
CREATE TABLE rule_evaluation (
    evaluation_id INTEGER PRIMARY KEY,
    run_id        TEXT NOT NULL REFERENCES crawl_run (run_id),
    url_id        INTEGER NOT NULL REFERENCES url_identity (url_id),
    rule_id       TEXT NOT NULL,
    rule_version  TEXT NOT NULL,
    input_hash    TEXT NOT NULL,
    verdict       TEXT NOT NULL CHECK (verdict IN ('pass', 'fail', 'error', 'not_applicable')),
    attempt_seq   INTEGER REFERENCES fetch_attempt (attempt_seq),
    evaluated_at  TEXT NOT NULL,
    details       TEXT NOT NULL,                   -- canonical JSON
    log_index     INTEGER NOT NULL UNIQUE REFERENCES ingest_ledger (log_index),
    UNIQUE (run_id, url_id, rule_id, rule_version, input_hash)
) STRICT;

-- Projection: the latest attempt per (run, url), advanced by sequence only.
CREATE TABLE url_current (
    run_id      TEXT NOT NULL REFERENCES crawl_run (run_id),
    url_id      INTEGER NOT NULL REFERENCES url_identity (url_id),
    sequence    INTEGER NOT NULL,
    attempt_seq INTEGER NOT NULL REFERENCES fetch_attempt (attempt_seq),
    PRIMARY KEY (run_id, url_id)
) STRICT, WITHOUT ROWID;

-- One rejected or conflicting message, kept whole.
CREATE TABLE quarantine (
    quarantine_id INTEGER PRIMARY KEY,
    received_at   TEXT NOT NULL,
    message_id    TEXT,                            -- NULL when it could not be decoded
    kind          TEXT,
    reason_code   TEXT NOT NULL CHECK (reason_code IN ('conflict', 'rejected')),
    reason        TEXT NOT NULL,
    payload_hash  TEXT NOT NULL,
    payload       BLOB NOT NULL
) STRICT;
CREATE INDEX quarantine_by_message ON quarantine (message_id);

-- Append-only, enforced by the database.
CREATE TRIGGER url_identity_no_update BEFORE UPDATE ON url_identity
BEGIN SELECT RAISE(ABORT, 'url_identity is append-only'); END;
CREATE TRIGGER url_identity_no_delete BEFORE DELETE ON url_identity
BEGIN SELECT RAISE(ABORT, 'url_identity is append-only'); END;
CREATE TRIGGER artifact_no_update BEFORE UPDATE ON artifact
BEGIN SELECT RAISE(ABORT, 'artifact is append-only'); END;
CREATE TRIGGER artifact_no_delete BEFORE DELETE ON artifact
BEGIN SELECT RAISE(ABORT, 'artifact is append-only'); END;
CREATE TRIGGER ingest_ledger_no_update BEFORE UPDATE ON ingest_ledger
BEGIN SELECT RAISE(ABORT, 'ingest_ledger is append-only'); END;
CREATE TRIGGER ingest_ledger_no_delete BEFORE DELETE ON ingest_ledger
BEGIN SELECT RAISE(ABORT, 'ingest_ledger is append-only'); END;
CREATE TRIGGER commit_log_no_update BEFORE UPDATE ON commit_log
BEGIN SELECT RAISE(ABORT, 'commit_log is append-only'); END;
CREATE TRIGGER commit_log_no_delete BEFORE DELETE ON commit_log
BEGIN SELECT RAISE(ABORT, 'commit_log is append-only'); END;
CREATE TRIGGER fetch_attempt_no_update BEFORE UPDATE ON fetch_attempt
BEGIN SELECT RAISE(ABORT, 'fetch_attempt is append-only'); END;
CREATE TRIGGER fetch_attempt_no_delete BEFORE DELETE ON fetch_attempt
BEGIN SELECT RAISE(ABORT, 'fetch_attempt is append-only'); END;
CREATE TRIGGER discovery_edge_no_update BEFORE UPDATE ON discovery_edge
BEGIN SELECT RAISE(ABORT, 'discovery_edge is append-only'); END;
CREATE TRIGGER discovery_edge_no_delete BEFORE DELETE ON discovery_edge
BEGIN SELECT RAISE(ABORT, 'discovery_edge is append-only'); END;
CREATE TRIGGER rule_evaluation_no_update BEFORE UPDATE ON rule_evaluation
BEGIN SELECT RAISE(ABORT, 'rule_evaluation is append-only'); END;
CREATE TRIGGER rule_evaluation_no_delete BEFORE DELETE ON rule_evaluation
BEGIN SELECT RAISE(ABORT, 'rule_evaluation is append-only'); END;
CREATE TRIGGER quarantine_no_update BEFORE UPDATE ON quarantine
BEGIN SELECT RAISE(ABORT, 'quarantine is append-only'); END;
CREATE TRIGGER quarantine_no_delete BEFORE DELETE ON quarantine
BEGIN SELECT RAISE(ABORT, 'quarantine is append-only'); END;

-- Sessions and runs: only the end fields, only once.
CREATE TRIGGER crawl_session_end_once BEFORE UPDATE ON crawl_session
WHEN OLD.ended_at IS NOT NULL
  OR NEW.session_id IS NOT OLD.session_id OR NEW.started_at IS NOT OLD.started_at
  OR NEW.mode IS NOT OLD.mode OR NEW.config IS NOT OLD.config
  OR NEW.baseline_session_id IS NOT OLD.baseline_session_id
BEGIN SELECT RAISE(ABORT, 'crawl_session is append-only (its end is written once)'); END;
CREATE TRIGGER crawl_session_no_delete BEFORE DELETE ON crawl_session
BEGIN SELECT RAISE(ABORT, 'crawl_session is append-only'); END;
CREATE TRIGGER crawl_run_end_once BEFORE UPDATE ON crawl_run
WHEN OLD.ended_at IS NOT NULL
  OR NEW.run_id IS NOT OLD.run_id OR NEW.session_id IS NOT OLD.session_id
  OR NEW.started_at IS NOT OLD.started_at OR NEW.program IS NOT OLD.program
  OR NEW.host IS NOT OLD.host OR NEW.pid IS NOT OLD.pid
BEGIN SELECT RAISE(ABORT, 'crawl_run is append-only (its end is written once)'); END;
CREATE TRIGGER crawl_run_no_delete BEFORE DELETE ON crawl_run
BEGIN SELECT RAISE(ABORT, 'crawl_run is append-only'); END;

-- The projection never moves backward and is never deleted.
CREATE TRIGGER url_current_forward_only BEFORE UPDATE ON url_current
WHEN NEW.sequence <= OLD.sequence OR NEW.run_id IS NOT OLD.run_id OR NEW.url_id IS NOT OLD.url_id
BEGIN SELECT RAISE(ABORT, 'url_current only advances to a higher sequence'); END;
CREATE TRIGGER url_current_no_delete BEFORE DELETE ON url_current
BEGIN SELECT RAISE(ABORT, 'url_current rows are never deleted'); END;
