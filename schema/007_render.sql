-- 007_render: what a headless browser made of a stored capture (issue 17).
--
-- One render row is one load of one stored response in a browser: its outcome, the
-- artifacts it left (the DOM once settled, a full-page screenshot, MHTML), and how many
-- requests the browser made. Each of those requests is a fetch_attempt naming its render
-- (render_seq), never projected into url_current: it is not the crawler's attempt of its
-- URL. Links found in a rendered DOM are discovery edges naming their render: a kind of
-- edge of their own, whatever their tag (the edge_kind CHECK of 001 cannot be widened
-- without rebuilding discovery_edge; a column can be added in place).
-- A render's source attempt may belong to an earlier run of the session (a render that
-- arrives after a restart); its requests and edges belong to the render's own run.

CREATE TABLE render (
    render_seq           INTEGER PRIMARY KEY,
    render_id            TEXT NOT NULL UNIQUE,
    run_id               TEXT NOT NULL REFERENCES crawl_run (run_id),
    source_attempt_seq   INTEGER NOT NULL REFERENCES fetch_attempt (attempt_seq),
    url                  TEXT NOT NULL,             -- what the browser was pointed at
    started_at           TEXT NOT NULL,
    elapsed_ms           REAL NOT NULL,
    outcome              TEXT NOT NULL CHECK (outcome IN ('rendered', 'timeout', 'crashed',
                                                          'error')),
    error                TEXT,
    browser              TEXT NOT NULL,
    viewport_width       INTEGER NOT NULL,
    viewport_height      INTEGER NOT NULL,
    settle               TEXT CHECK (settle IN ('quiet', 'deadline')),
    final_url            TEXT,
    title                TEXT NOT NULL,
    dom_id               INTEGER REFERENCES artifact (artifact_id),
    screenshot_id        INTEGER REFERENCES artifact (artifact_id),
    screenshot_truncated INTEGER NOT NULL CHECK (screenshot_truncated IN (0, 1)),
    mhtml_id             INTEGER REFERENCES artifact (artifact_id),
    requests             INTEGER NOT NULL CHECK (requests >= 0),
    not_recorded         TEXT NOT NULL,             -- canonical JSON list
    log_index            INTEGER NOT NULL UNIQUE REFERENCES ingest_ledger (log_index),
    CHECK ((outcome = 'rendered') = (dom_id IS NOT NULL))
) STRICT;
CREATE INDEX render_by_source ON render (source_attempt_seq);

CREATE TRIGGER render_no_update BEFORE UPDATE ON render
BEGIN SELECT RAISE(ABORT, 'render is append-only'); END;
CREATE TRIGGER render_no_delete BEFORE DELETE ON render
BEGIN SELECT RAISE(ABORT, 'render is append-only'); END;

ALTER TABLE fetch_attempt ADD COLUMN render_seq INTEGER REFERENCES render (render_seq);
ALTER TABLE discovery_edge ADD COLUMN render_seq INTEGER REFERENCES render (render_seq);
CREATE INDEX fetch_attempt_by_render ON fetch_attempt (render_seq) WHERE render_seq IS NOT NULL;
