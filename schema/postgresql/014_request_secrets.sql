-- 014_request_secrets (PostgreSQL): mirrors schema/014_request_secrets.sql.

ALTER TABLE fetch_attempt ADD COLUMN request_secrets_id bigint REFERENCES artifact (artifact_id) DEFERRABLE;
