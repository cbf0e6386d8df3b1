-- 006_quarantine_records: one quarantine record per refused content, counted, and bound
-- into the commit log.
--
-- The same conflicting message retried a thousand times was a thousand rows. From here on
-- a record is one content refused for one reason (payload hash, reason code, reason): a
-- later delivery of it counts (deliveries, last_received_at) instead of adding a row.
-- Rows written before this migration keep deliveries NULL (one row per delivery, as they
-- were) and are never rewritten; the unique index covers only the counted records.
--
-- Quarantined messages are not leaves of the Merkle tree. What binds them is the commit
-- log: each batch that quarantined something records which records it wrote or counted,
-- and how many deliveries, in commit_log.quarantined, which its chain hash covers
-- (evidence/_quarantine.py, evidence/_log.py).

ALTER TABLE quarantine ADD COLUMN deliveries INTEGER CHECK (deliveries IS NULL OR deliveries >= 1);
ALTER TABLE quarantine ADD COLUMN last_received_at TEXT;
CREATE UNIQUE INDEX quarantine_by_content ON quarantine (payload_hash, reason_code, reason)
WHERE deliveries IS NOT NULL;

-- A counted record changes in one way only: one more delivery, seen later.
DROP TRIGGER quarantine_no_update;
CREATE TRIGGER quarantine_counts_only BEFORE UPDATE ON quarantine
WHEN OLD.deliveries IS NULL OR NEW.deliveries IS NULL OR NEW.deliveries <= OLD.deliveries
  OR NEW.last_received_at IS NULL OR NEW.last_received_at < OLD.last_received_at
  OR NEW.quarantine_id IS NOT OLD.quarantine_id OR NEW.received_at IS NOT OLD.received_at
  OR NEW.message_id IS NOT OLD.message_id OR NEW.kind IS NOT OLD.kind
  OR NEW.reason_code IS NOT OLD.reason_code OR NEW.reason IS NOT OLD.reason
  OR NEW.payload_hash IS NOT OLD.payload_hash OR NEW.payload IS NOT OLD.payload
BEGIN SELECT RAISE(ABORT, 'quarantine is append-only (a record only counts later deliveries)'); END;

-- What the batch quarantined: canonical msgpack of [quarantine_id, record hash, deliveries]
-- per record, in quarantine_id order; NULL when it quarantined nothing.
ALTER TABLE commit_log ADD COLUMN quarantined BLOB;
