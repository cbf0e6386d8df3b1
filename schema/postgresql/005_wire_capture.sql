-- 005_wire_capture (PostgreSQL): mirrors schema/005_wire_capture.sql.

ALTER TABLE fetch_attempt ADD COLUMN capture text NOT NULL DEFAULT 'rebuilt'
    CHECK (capture IN ('rebuilt', 'wire'));
ALTER TABLE fetch_attempt ADD COLUMN content_id bigint REFERENCES artifact (artifact_id) DEFERRABLE;
ALTER TABLE fetch_attempt ADD COLUMN transfer_coding text;
ALTER TABLE fetch_attempt ADD COLUMN content_coding text;
ALTER TABLE fetch_attempt ADD COLUMN content_truncated bigint NOT NULL DEFAULT 0
    CHECK (content_truncated IN (0, 1));
ALTER TABLE fetch_attempt ADD COLUMN surplus_id bigint REFERENCES artifact (artifact_id) DEFERRABLE;
ALTER TABLE fetch_attempt ADD COLUMN text_encoding text;
ALTER TABLE fetch_attempt ADD COLUMN text_encoding_source text
    CHECK (text_encoding_source IN ('bom', 'header', 'meta', 'default'));
