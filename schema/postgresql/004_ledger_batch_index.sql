-- 004_ledger_batch_index (PostgreSQL): mirrors schema/004_ledger_batch_index.sql.
CREATE INDEX ingest_ledger_by_batch ON ingest_ledger (batch_seq);
