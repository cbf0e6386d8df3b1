-- 001_initial (PostgreSQL): the same tables, anchors and guards as schema/001_initial.sql.
--
-- Each file here mirrors the SQLite migration of the same number and name; a store's
-- schema_migration rows name the SQLite file (the canonical schema its dump holds) and
-- postgresql_migration the file applied here. Types: TEXT text, INTEGER bigint, REAL
-- double precision, BLOB bytea. Where SQLite gives an INTEGER PRIMARY KEY the next rowid
-- (one more than the largest), a trigger gives the same number, so the same messages make
-- the same rows, ids included, on either engine (and exports of the same bytes).
-- Foreign keys are DEFERRABLE (checked at each statement's end, as SQLite checks them,
-- unless a transaction defers them): restore loads whole tables in the dump's order.
-- Append-only: triggers refuse UPDATE, DELETE and TRUNCATE (ERRCODE 23000, the class of
-- constraint violations, as SQLite's RAISE(ABORT) is a constraint error).

CREATE FUNCTION evidence_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '%', TG_ARGV[0] USING ERRCODE = 'integrity_constraint_violation';
END $$;

-- The two JSON functions of SQLite that the readers' statements use (on text holding JSON),
-- so that one statement reads either engine: json_extract with a '$.key.key' path, and
-- json_each's value column for an array.
CREATE FUNCTION json_extract(doc text, path text) RETURNS text LANGUAGE sql IMMUTABLE AS
$$ SELECT doc::jsonb #>> string_to_array(substr(path, 3), '.') $$;
CREATE FUNCTION json_each(doc text) RETURNS TABLE (value text) LANGUAGE sql IMMUTABLE AS
$$ SELECT jsonb_array_elements_text(doc::jsonb) $$;

CREATE TABLE store_meta (
    key   text PRIMARY KEY,
    value text NOT NULL
);

CREATE TABLE crawl_session (
    session_id          text PRIMARY KEY,
    started_at          text NOT NULL,
    mode                text NOT NULL CHECK (mode IN ('full', 'incremental')),
    config              text NOT NULL,
    baseline_session_id text REFERENCES crawl_session (session_id) DEFERRABLE,
    ended_at            text,
    outcome             text CHECK (outcome IN ('completed', 'abandoned')),
    CHECK ((ended_at IS NULL) = (outcome IS NULL))
);

CREATE TABLE crawl_run (
    run_id     text PRIMARY KEY,
    session_id text NOT NULL REFERENCES crawl_session (session_id) DEFERRABLE,
    started_at text NOT NULL,
    program    text NOT NULL,
    host       text NOT NULL,
    pid        bigint NOT NULL,
    ended_at   text,
    outcome    text CHECK (outcome IN ('completed', 'stopped', 'capped', 'failed')),
    reason     text,
    CHECK ((ended_at IS NULL) = (outcome IS NULL))
);
CREATE INDEX crawl_run_by_session ON crawl_run (session_id, started_at);

CREATE TABLE url_identity (
    url_id             bigint PRIMARY KEY,
    normalizer_version bigint NOT NULL,
    fetch_key          text NOT NULL,
    UNIQUE (normalizer_version, fetch_key)
);

-- SQLite: namespace GLOB '[a-z0-9_-]*' (the first character), digest NOT GLOB '*[^0-9a-f]*'.
CREATE TABLE artifact (
    artifact_id bigint PRIMARY KEY,
    namespace   text NOT NULL CHECK (namespace ~ '^[a-z0-9_-]' AND length(namespace) BETWEEN 1 AND 32),
    digest      text NOT NULL CHECK (length(digest) = 64 AND digest !~ '[^0-9a-f]'),
    size        bigint NOT NULL CHECK (size >= 0),
    UNIQUE (namespace, digest)
);

CREATE TABLE commit_log (
    batch_seq    bigint PRIMARY KEY,
    committed_at text NOT NULL,
    first_index  bigint NOT NULL,
    tree_size    bigint NOT NULL,
    root         bytea NOT NULL CHECK (octet_length(root) = 32),
    frontier     bytea NOT NULL,
    prev_hash    bytea NOT NULL CHECK (octet_length(prev_hash) = 32),
    entry_hash   bytea NOT NULL CHECK (octet_length(entry_hash) = 32)
);

CREATE TABLE ingest_ledger (
    log_index    bigint PRIMARY KEY,
    message_id   text NOT NULL UNIQUE,
    kind         text NOT NULL,
    payload_hash text NOT NULL,
    leaf_hash    bytea NOT NULL CHECK (octet_length(leaf_hash) = 32),
    payload      bytea NOT NULL,
    batch_seq    bigint NOT NULL REFERENCES commit_log (batch_seq) DEFERRABLE INITIALLY DEFERRED,
    received_at  text NOT NULL
);

CREATE TABLE fetch_attempt (
    attempt_seq          bigint PRIMARY KEY,
    attempt_id           text NOT NULL UNIQUE,
    run_id               text NOT NULL REFERENCES crawl_run (run_id) DEFERRABLE,
    url_id               bigint NOT NULL REFERENCES url_identity (url_id) DEFERRABLE,
    url                  text NOT NULL,
    sequence             bigint NOT NULL CHECK (sequence >= 0),
    method               text NOT NULL,
    started_at           text NOT NULL,
    elapsed_ms           double precision NOT NULL,
    outcome              text NOT NULL CHECK (outcome IN ('response', 'network_error', 'timeout',
                             'too_large', 'refused_by_robots', 'skipped')),
    http_status          bigint,
    request_headers_id   bigint REFERENCES artifact (artifact_id) DEFERRABLE,
    response_headers_id  bigint REFERENCES artifact (artifact_id) DEFERRABLE,
    body_id              bigint REFERENCES artifact (artifact_id) DEFERRABLE,
    body_truncated       bigint NOT NULL CHECK (body_truncated IN (0, 1)),
    content_type         text,
    error                text,
    log_index            bigint NOT NULL UNIQUE REFERENCES ingest_ledger (log_index) DEFERRABLE,
    UNIQUE (run_id, url_id, sequence)
);
CREATE INDEX fetch_attempt_by_url ON fetch_attempt (url_id, run_id);
CREATE INDEX fetch_attempt_by_body ON fetch_attempt (body_id) WHERE body_id IS NOT NULL;

CREATE TABLE discovery_edge (
    edge_id            bigint PRIMARY KEY,
    run_id             text NOT NULL REFERENCES crawl_run (run_id) DEFERRABLE,
    source_attempt_seq bigint NOT NULL REFERENCES fetch_attempt (attempt_seq) DEFERRABLE,
    source_artifact_id bigint NOT NULL REFERENCES artifact (artifact_id) DEFERRABLE,
    position           bigint NOT NULL,
    observed_ref       text NOT NULL,
    target_url_id      bigint NOT NULL REFERENCES url_identity (url_id) DEFERRABLE,
    edge_kind          text NOT NULL CHECK (edge_kind IN ('link', 'redirect', 'embed', 'sitemap')),
    tag                text NOT NULL,
    attr               text NOT NULL,
    rel                text NOT NULL,
    log_index          bigint NOT NULL REFERENCES ingest_ledger (log_index) DEFERRABLE,
    UNIQUE (run_id, source_artifact_id, position, observed_ref)
);
CREATE INDEX discovery_edge_by_source ON discovery_edge (source_attempt_seq);
CREATE INDEX discovery_edge_by_target ON discovery_edge (target_url_id);

CREATE TABLE rule_evaluation (
    evaluation_id bigint PRIMARY KEY,
    run_id        text NOT NULL REFERENCES crawl_run (run_id) DEFERRABLE,
    url_id        bigint NOT NULL REFERENCES url_identity (url_id) DEFERRABLE,
    rule_id       text NOT NULL,
    rule_version  text NOT NULL,
    input_hash    text NOT NULL,
    verdict       text NOT NULL CHECK (verdict IN ('pass', 'fail', 'error', 'not_applicable')),
    attempt_seq   bigint REFERENCES fetch_attempt (attempt_seq) DEFERRABLE,
    evaluated_at  text NOT NULL,
    details       text NOT NULL,
    log_index     bigint NOT NULL UNIQUE REFERENCES ingest_ledger (log_index) DEFERRABLE,
    UNIQUE (run_id, url_id, rule_id, rule_version, input_hash)
);

CREATE TABLE url_current (
    run_id      text NOT NULL REFERENCES crawl_run (run_id) DEFERRABLE,
    url_id      bigint NOT NULL REFERENCES url_identity (url_id) DEFERRABLE,
    sequence    bigint NOT NULL,
    attempt_seq bigint NOT NULL REFERENCES fetch_attempt (attempt_seq) DEFERRABLE,
    PRIMARY KEY (run_id, url_id)
);

CREATE TABLE quarantine (
    quarantine_id bigint PRIMARY KEY,
    received_at   text NOT NULL,
    message_id    text,
    kind          text,
    reason_code   text NOT NULL CHECK (reason_code IN ('conflict', 'rejected')),
    reason        text NOT NULL,
    payload_hash  text NOT NULL,
    payload       bytea NOT NULL
);
CREATE INDEX quarantine_by_message ON quarantine (message_id);

-- The next rowid, as SQLite gives it: one more than the largest (1 for an empty table).
CREATE FUNCTION url_identity_next_id() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN SELECT coalesce(max(url_id), 0) + 1 INTO NEW.url_id FROM url_identity; RETURN NEW; END $$;
CREATE TRIGGER url_identity_rowid BEFORE INSERT ON url_identity FOR EACH ROW
WHEN (NEW.url_id IS NULL) EXECUTE FUNCTION url_identity_next_id();
CREATE FUNCTION artifact_next_id() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN SELECT coalesce(max(artifact_id), 0) + 1 INTO NEW.artifact_id FROM artifact; RETURN NEW; END $$;
CREATE TRIGGER artifact_rowid BEFORE INSERT ON artifact FOR EACH ROW
WHEN (NEW.artifact_id IS NULL) EXECUTE FUNCTION artifact_next_id();
CREATE FUNCTION fetch_attempt_next_id() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN SELECT coalesce(max(attempt_seq), 0) + 1 INTO NEW.attempt_seq FROM fetch_attempt; RETURN NEW; END $$;
CREATE TRIGGER fetch_attempt_rowid BEFORE INSERT ON fetch_attempt FOR EACH ROW
WHEN (NEW.attempt_seq IS NULL) EXECUTE FUNCTION fetch_attempt_next_id();
CREATE FUNCTION discovery_edge_next_id() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN SELECT coalesce(max(edge_id), 0) + 1 INTO NEW.edge_id FROM discovery_edge; RETURN NEW; END $$;
CREATE TRIGGER discovery_edge_rowid BEFORE INSERT ON discovery_edge FOR EACH ROW
WHEN (NEW.edge_id IS NULL) EXECUTE FUNCTION discovery_edge_next_id();
CREATE FUNCTION rule_evaluation_next_id() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN SELECT coalesce(max(evaluation_id), 0) + 1 INTO NEW.evaluation_id FROM rule_evaluation; RETURN NEW; END $$;
CREATE TRIGGER rule_evaluation_rowid BEFORE INSERT ON rule_evaluation FOR EACH ROW
WHEN (NEW.evaluation_id IS NULL) EXECUTE FUNCTION rule_evaluation_next_id();
CREATE FUNCTION quarantine_next_id() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN SELECT coalesce(max(quarantine_id), 0) + 1 INTO NEW.quarantine_id FROM quarantine; RETURN NEW; END $$;
CREATE TRIGGER quarantine_rowid BEFORE INSERT ON quarantine FOR EACH ROW
WHEN (NEW.quarantine_id IS NULL) EXECUTE FUNCTION quarantine_next_id();

-- Append-only, enforced by the database: no UPDATE, DELETE or TRUNCATE statement runs.
CREATE TRIGGER url_identity_no_update BEFORE UPDATE OR DELETE OR TRUNCATE ON url_identity
FOR EACH STATEMENT EXECUTE FUNCTION evidence_refuse('url_identity is append-only');
CREATE TRIGGER artifact_no_update BEFORE UPDATE OR DELETE OR TRUNCATE ON artifact
FOR EACH STATEMENT EXECUTE FUNCTION evidence_refuse('artifact is append-only');
CREATE TRIGGER ingest_ledger_no_update BEFORE UPDATE OR DELETE OR TRUNCATE ON ingest_ledger
FOR EACH STATEMENT EXECUTE FUNCTION evidence_refuse('ingest_ledger is append-only');
CREATE TRIGGER commit_log_no_update BEFORE UPDATE OR DELETE OR TRUNCATE ON commit_log
FOR EACH STATEMENT EXECUTE FUNCTION evidence_refuse('commit_log is append-only');
CREATE TRIGGER fetch_attempt_no_update BEFORE UPDATE OR DELETE OR TRUNCATE ON fetch_attempt
FOR EACH STATEMENT EXECUTE FUNCTION evidence_refuse('fetch_attempt is append-only');
CREATE TRIGGER discovery_edge_no_update BEFORE UPDATE OR DELETE OR TRUNCATE ON discovery_edge
FOR EACH STATEMENT EXECUTE FUNCTION evidence_refuse('discovery_edge is append-only');
CREATE TRIGGER rule_evaluation_no_update BEFORE UPDATE OR DELETE OR TRUNCATE ON rule_evaluation
FOR EACH STATEMENT EXECUTE FUNCTION evidence_refuse('rule_evaluation is append-only');
CREATE TRIGGER quarantine_no_update BEFORE UPDATE ON quarantine
FOR EACH STATEMENT EXECUTE FUNCTION evidence_refuse('quarantine is append-only');
CREATE TRIGGER quarantine_no_delete BEFORE DELETE OR TRUNCATE ON quarantine
FOR EACH STATEMENT EXECUTE FUNCTION evidence_refuse('quarantine is append-only');

-- Sessions and runs: only the end fields, only once.
CREATE TRIGGER crawl_session_end_once BEFORE UPDATE ON crawl_session FOR EACH ROW
WHEN (OLD.ended_at IS NOT NULL
  OR NEW.session_id IS DISTINCT FROM OLD.session_id OR NEW.started_at IS DISTINCT FROM OLD.started_at
  OR NEW.mode IS DISTINCT FROM OLD.mode OR NEW.config IS DISTINCT FROM OLD.config
  OR NEW.baseline_session_id IS DISTINCT FROM OLD.baseline_session_id)
EXECUTE FUNCTION evidence_refuse('crawl_session is append-only (its end is written once)');
CREATE TRIGGER crawl_session_no_delete BEFORE DELETE OR TRUNCATE ON crawl_session
FOR EACH STATEMENT EXECUTE FUNCTION evidence_refuse('crawl_session is append-only');
CREATE TRIGGER crawl_run_end_once BEFORE UPDATE ON crawl_run FOR EACH ROW
WHEN (OLD.ended_at IS NOT NULL
  OR NEW.run_id IS DISTINCT FROM OLD.run_id OR NEW.session_id IS DISTINCT FROM OLD.session_id
  OR NEW.started_at IS DISTINCT FROM OLD.started_at OR NEW.program IS DISTINCT FROM OLD.program
  OR NEW.host IS DISTINCT FROM OLD.host OR NEW.pid IS DISTINCT FROM OLD.pid)
EXECUTE FUNCTION evidence_refuse('crawl_run is append-only (its end is written once)');
CREATE TRIGGER crawl_run_no_delete BEFORE DELETE OR TRUNCATE ON crawl_run
FOR EACH STATEMENT EXECUTE FUNCTION evidence_refuse('crawl_run is append-only');

-- The projection never moves backward and is never deleted.
CREATE TRIGGER url_current_forward_only BEFORE UPDATE ON url_current FOR EACH ROW
WHEN (NEW.sequence <= OLD.sequence OR NEW.run_id IS DISTINCT FROM OLD.run_id
      OR NEW.url_id IS DISTINCT FROM OLD.url_id)
EXECUTE FUNCTION evidence_refuse('url_current only advances to a higher sequence');
CREATE TRIGGER url_current_no_delete BEFORE DELETE OR TRUNCATE ON url_current
FOR EACH STATEMENT EXECUTE FUNCTION evidence_refuse('url_current rows are never deleted');
