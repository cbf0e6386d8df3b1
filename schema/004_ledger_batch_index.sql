-- 004_ledger_batch_index: index the ledger's batch reference.
--
-- ingest_ledger.batch_seq is a deferred foreign key to commit_log. Inserting the commit-log
-- row at the end of a batch makes SQLite look for ledger rows that reference it; without
-- this index that is a full scan of the ledger, which made every commit slower as the store
-- grew (81 ms per batch at 200,000 ledger rows; 0.15 ms with the index).
CREATE INDEX ingest_ledger_by_batch ON ingest_ledger (batch_seq);
