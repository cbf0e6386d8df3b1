-- 014_request_secrets: the opening of a request whose secrets were sealed (issue 36).
--
-- A request that carried a secret (a credential, a cookie the user supplied, a header the
-- secrets file names) is stored with each secret value replaced by a salted commitment
-- (request_headers); the exact bytes and the salts are an artifact of namespace 'secrets'
-- that the attempt names here, so the owner of the store can open the commitment and
-- exports can leave it out (evidence/_crawl/secrets.py, docs/security.md). Attempts
-- recorded before this migration, and those that carried no secret, name none. A column
-- is added in place: fetch_attempt is append-only, and a NULL default changes no row.

ALTER TABLE fetch_attempt ADD COLUMN request_secrets_id INTEGER REFERENCES artifact (artifact_id);
