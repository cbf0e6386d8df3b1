-- 013_http2 (PostgreSQL): mirrors schema/013_http2.sql.

ALTER TABLE fetch_attempt ADD COLUMN protocol text NOT NULL DEFAULT 'http/1.1'
    CHECK (protocol = 'http/1.1' OR protocol = 'h2');
ALTER TABLE fetch_attempt ADD COLUMN frames_id bigint REFERENCES artifact (artifact_id)
    DEFERRABLE;
