-- 007_render (PostgreSQL): mirrors schema/007_render.sql.

CREATE TABLE render (
    render_seq           bigint PRIMARY KEY,
    render_id            text NOT NULL UNIQUE,
    run_id               text NOT NULL REFERENCES crawl_run (run_id) DEFERRABLE,
    source_attempt_seq   bigint NOT NULL REFERENCES fetch_attempt (attempt_seq) DEFERRABLE,
    url                  text NOT NULL,
    started_at           text NOT NULL,
    elapsed_ms           double precision NOT NULL,
    outcome              text NOT NULL CHECK (outcome IN ('rendered', 'timeout', 'crashed',
                                                          'error')),
    error                text,
    browser              text NOT NULL,
    viewport_width       bigint NOT NULL,
    viewport_height      bigint NOT NULL,
    settle               text CHECK (settle IN ('quiet', 'deadline')),
    final_url            text,
    title                text NOT NULL,
    dom_id               bigint REFERENCES artifact (artifact_id) DEFERRABLE,
    screenshot_id        bigint REFERENCES artifact (artifact_id) DEFERRABLE,
    screenshot_truncated bigint NOT NULL CHECK (screenshot_truncated IN (0, 1)),
    mhtml_id             bigint REFERENCES artifact (artifact_id) DEFERRABLE,
    requests             bigint NOT NULL CHECK (requests >= 0),
    not_recorded         text NOT NULL,
    log_index            bigint NOT NULL UNIQUE REFERENCES ingest_ledger (log_index) DEFERRABLE,
    CHECK ((outcome = 'rendered') = (dom_id IS NOT NULL))
);
CREATE INDEX render_by_source ON render (source_attempt_seq);

CREATE FUNCTION render_next_id() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN SELECT coalesce(max(render_seq), 0) + 1 INTO NEW.render_seq FROM render; RETURN NEW; END $$;
CREATE TRIGGER render_rowid BEFORE INSERT ON render FOR EACH ROW
WHEN (NEW.render_seq IS NULL) EXECUTE FUNCTION render_next_id();

CREATE TRIGGER render_no_update BEFORE UPDATE OR DELETE OR TRUNCATE ON render
FOR EACH STATEMENT EXECUTE FUNCTION evidence_refuse('render is append-only');

ALTER TABLE fetch_attempt ADD COLUMN render_seq bigint REFERENCES render (render_seq) DEFERRABLE;
ALTER TABLE discovery_edge ADD COLUMN render_seq bigint REFERENCES render (render_seq) DEFERRABLE;
CREATE INDEX fetch_attempt_by_render ON fetch_attempt (render_seq) WHERE render_seq IS NOT NULL;
