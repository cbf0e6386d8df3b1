-- 006_quarantine_records (PostgreSQL): mirrors schema/006_quarantine_records.sql. A counted
-- record changes in one way only: one more delivery, seen later (times compare bytewise,
-- as SQLite compares them, whatever the database's collation).

ALTER TABLE quarantine ADD COLUMN deliveries bigint CHECK (deliveries IS NULL OR deliveries >= 1);
ALTER TABLE quarantine ADD COLUMN last_received_at text;
CREATE UNIQUE INDEX quarantine_by_content ON quarantine (payload_hash, reason_code, reason)
WHERE deliveries IS NOT NULL;

DROP TRIGGER quarantine_no_update ON quarantine;
CREATE TRIGGER quarantine_counts_only BEFORE UPDATE ON quarantine FOR EACH ROW
WHEN (OLD.deliveries IS NULL OR NEW.deliveries IS NULL OR NEW.deliveries <= OLD.deliveries
  OR NEW.last_received_at IS NULL
  OR NEW.last_received_at COLLATE "C" < OLD.last_received_at COLLATE "C"
  OR NEW.quarantine_id IS DISTINCT FROM OLD.quarantine_id
  OR NEW.received_at IS DISTINCT FROM OLD.received_at
  OR NEW.message_id IS DISTINCT FROM OLD.message_id OR NEW.kind IS DISTINCT FROM OLD.kind
  OR NEW.reason_code IS DISTINCT FROM OLD.reason_code OR NEW.reason IS DISTINCT FROM OLD.reason
  OR NEW.payload_hash IS DISTINCT FROM OLD.payload_hash
  OR NEW.payload IS DISTINCT FROM OLD.payload)
EXECUTE FUNCTION evidence_refuse('quarantine is append-only (a record only counts later deliveries)');

ALTER TABLE commit_log ADD COLUMN quarantined bytea;
