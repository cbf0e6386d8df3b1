-- 009_submitter: who submitted each ledger entry (issue 30 point 3).
--
-- A crawl that takes worker hosts records, for every message a host submitted, that
-- host's identity: its name in the coordinator's hosts file (--hosts-file), or without
-- one the name the coordinator gave its channel ("worker host ADDRESS #N"). The leaf hash
-- of such a row covers it: SHA-256(0x00 || msgpack ["evidence/submitted-by", submitter,
-- payload]) (evidence/_model/messages.py ledger_entry), so roots, checkpoints and proofs
-- bind who submitted what. Rows without a submitter (the crawl's own messages, and every
-- row written before this migration) keep SHA-256(0x00 || payload): old stores verify
-- as they did. The column is NULL for them; ingest_ledger stays append-only.

ALTER TABLE ingest_ledger ADD COLUMN submitter TEXT
    CHECK (submitter IS NULL OR length(submitter) BETWEEN 1 AND 256);
