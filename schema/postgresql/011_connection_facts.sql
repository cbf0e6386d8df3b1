-- 011_connection_facts (PostgreSQL): mirrors schema/011_connection_facts.sql.

CREATE TABLE dns_resolution (
    resolution_seq bigint PRIMARY KEY,
    resolution_id  text NOT NULL UNIQUE,
    host           text NOT NULL,
    port           bigint NOT NULL,
    resolved_at    text NOT NULL,
    source         text NOT NULL CHECK (source IN ('getaddrinfo', 'hosts-file', 'given')),
    addresses      text NOT NULL,
    ttl            bigint
);

CREATE FUNCTION dns_resolution_next_id() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN SELECT coalesce(max(resolution_seq), 0) + 1 INTO NEW.resolution_seq FROM dns_resolution;
RETURN NEW; END $$;
CREATE TRIGGER dns_resolution_rowid BEFORE INSERT ON dns_resolution FOR EACH ROW
WHEN (NEW.resolution_seq IS NULL) EXECUTE FUNCTION dns_resolution_next_id();

CREATE TRIGGER dns_resolution_no_update BEFORE UPDATE OR DELETE OR TRUNCATE ON dns_resolution
FOR EACH STATEMENT EXECUTE FUNCTION evidence_refuse('dns_resolution is append-only');

ALTER TABLE fetch_attempt ADD COLUMN remote_address text;
ALTER TABLE fetch_attempt ADD COLUMN remote_port bigint;
ALTER TABLE fetch_attempt ADD COLUMN local_address text;
ALTER TABLE fetch_attempt ADD COLUMN local_port bigint;
ALTER TABLE fetch_attempt ADD COLUMN connection_reused bigint
    CHECK (connection_reused IN (0, 1));
ALTER TABLE fetch_attempt ADD COLUMN resolution_seq bigint
    REFERENCES dns_resolution (resolution_seq) DEFERRABLE;
ALTER TABLE fetch_attempt ADD COLUMN tls_version text;
ALTER TABLE fetch_attempt ADD COLUMN tls_cipher text;
ALTER TABLE fetch_attempt ADD COLUMN tls_sni text;
ALTER TABLE fetch_attempt ADD COLUMN tls_alpn text;
ALTER TABLE fetch_attempt ADD COLUMN tls_chain_id bigint REFERENCES artifact (artifact_id) DEFERRABLE;
ALTER TABLE fetch_attempt ADD COLUMN tls_verified bigint CHECK (tls_verified IN (0, 1));
CREATE INDEX fetch_attempt_by_resolution ON fetch_attempt (resolution_seq)
    WHERE resolution_seq IS NOT NULL;
