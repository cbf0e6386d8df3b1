-- 012_render_behaviors (PostgreSQL): mirrors schema/012_render_behaviors.sql.

ALTER TABLE render ADD COLUMN behaviors_id bigint REFERENCES artifact (artifact_id) DEFERRABLE;
