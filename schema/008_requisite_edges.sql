-- 008_requisite_edges: a page's requisites are discovery edges of their own kinds (issue 15).
--
-- The images a page shows (img src and srcset, picture source, icons), its scripts, its
-- stylesheets, the url()s of its CSS (style elements and attributes) and its media (audio,
-- video, source, track, embed, object) are recorded as edges of kinds 'image', 'script',
-- 'stylesheet', 'style' and 'media'; the crawl follows them only when its configuration
-- says so (docs/crawling.md). The CHECK of 001 lists the four kinds there were, and SQLite
-- cannot widen a CHECK in place: the table is rebuilt, every row copied as it is (the same
-- edge_id and values), its indexes and append-only triggers made again, all in this
-- migration's one transaction. (DROP TABLE's implicit delete fires no trigger.)

CREATE TABLE discovery_edge_008 (
    edge_id            INTEGER PRIMARY KEY,
    run_id             TEXT NOT NULL REFERENCES crawl_run (run_id),
    source_attempt_seq INTEGER NOT NULL REFERENCES fetch_attempt (attempt_seq),
    source_artifact_id INTEGER NOT NULL REFERENCES artifact (artifact_id),
    position           INTEGER NOT NULL,           -- the node, in document order
    observed_ref       TEXT NOT NULL,              -- verbatim
    target_url_id      INTEGER NOT NULL REFERENCES url_identity (url_id),
    edge_kind          TEXT NOT NULL CHECK (edge_kind IN ('link', 'redirect', 'embed',
                                                          'sitemap', 'image', 'script',
                                                          'stylesheet', 'style', 'media')),
    tag                TEXT NOT NULL,
    attr               TEXT NOT NULL,
    rel                TEXT NOT NULL,
    log_index          INTEGER NOT NULL REFERENCES ingest_ledger (log_index),
    render_seq         INTEGER REFERENCES render (render_seq),
    UNIQUE (run_id, source_artifact_id, position, observed_ref)
) STRICT;

INSERT INTO discovery_edge_008 (edge_id, run_id, source_attempt_seq, source_artifact_id,
                                position, observed_ref, target_url_id, edge_kind, tag, attr,
                                rel, log_index, render_seq)
SELECT edge_id, run_id, source_attempt_seq, source_artifact_id, position, observed_ref,
       target_url_id, edge_kind, tag, attr, rel, log_index, render_seq
FROM discovery_edge ORDER BY edge_id;

DROP TABLE discovery_edge;
ALTER TABLE discovery_edge_008 RENAME TO discovery_edge;

CREATE INDEX discovery_edge_by_source ON discovery_edge (source_attempt_seq);
CREATE INDEX discovery_edge_by_target ON discovery_edge (target_url_id);
CREATE TRIGGER discovery_edge_no_update BEFORE UPDATE ON discovery_edge
BEGIN SELECT RAISE(ABORT, 'discovery_edge is append-only'); END;
CREATE TRIGGER discovery_edge_no_delete BEFORE DELETE ON discovery_edge
BEGIN SELECT RAISE(ABORT, 'discovery_edge is append-only'); END;
