-- 011_connection_facts: with whom and how each attempt's request was exchanged (issue 33).
--
-- An attempt that went over a connection records the remote address and port actually
-- connected to (never the name: the address the network policy checked) and the local
-- ones, whether an earlier request went over the same connection, and for TLS the
-- negotiated version, cipher and ALPN protocol, the SNI sent, the server's certificate
-- chain as presented (one artifact of DER certificates, leaf first, content-addressed so a
-- chain is stored once) and whether it was verified. The resolver's answer that gave the
-- remote address is a dns_resolution row of its own, one per resolution, which every
-- attempt over that connection references (each of their messages carries it, so every
-- attempt's Merkle leaf covers the answer it used). Attempts recorded before this
-- migration, and attempts that never connected, keep NULLs: the values their messages
-- decode to.

CREATE TABLE dns_resolution (
    resolution_seq INTEGER PRIMARY KEY,
    resolution_id  TEXT NOT NULL UNIQUE,
    host           TEXT NOT NULL,             -- the name resolved, IDNA-encoded
    port           INTEGER NOT NULL,          -- the port asked with (getaddrinfo takes one)
    resolved_at    TEXT NOT NULL,
    source         TEXT NOT NULL CHECK (source IN ('getaddrinfo', 'hosts-file', 'given')),
    addresses      TEXT NOT NULL,             -- canonical JSON list, the resolver's order
    ttl            INTEGER                    -- seconds; NULL: the resolver gave none
) STRICT;

CREATE TRIGGER dns_resolution_no_update BEFORE UPDATE ON dns_resolution
BEGIN SELECT RAISE(ABORT, 'dns_resolution is append-only'); END;
CREATE TRIGGER dns_resolution_no_delete BEFORE DELETE ON dns_resolution
BEGIN SELECT RAISE(ABORT, 'dns_resolution is append-only'); END;

ALTER TABLE fetch_attempt ADD COLUMN remote_address TEXT;
ALTER TABLE fetch_attempt ADD COLUMN remote_port INTEGER;
ALTER TABLE fetch_attempt ADD COLUMN local_address TEXT;
ALTER TABLE fetch_attempt ADD COLUMN local_port INTEGER;
ALTER TABLE fetch_attempt ADD COLUMN connection_reused INTEGER
    CHECK (connection_reused IN (0, 1));
ALTER TABLE fetch_attempt ADD COLUMN resolution_seq INTEGER
    REFERENCES dns_resolution (resolution_seq);
ALTER TABLE fetch_attempt ADD COLUMN tls_version TEXT;
ALTER TABLE fetch_attempt ADD COLUMN tls_cipher TEXT;
ALTER TABLE fetch_attempt ADD COLUMN tls_sni TEXT;
ALTER TABLE fetch_attempt ADD COLUMN tls_alpn TEXT;
ALTER TABLE fetch_attempt ADD COLUMN tls_chain_id INTEGER REFERENCES artifact (artifact_id);
ALTER TABLE fetch_attempt ADD COLUMN tls_verified INTEGER CHECK (tls_verified IN (0, 1));
CREATE INDEX fetch_attempt_by_resolution ON fetch_attempt (resolution_seq)
    WHERE resolution_seq IS NOT NULL;
