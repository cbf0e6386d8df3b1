-- 009_submitter (PostgreSQL): mirrors schema/009_submitter.sql. Who submitted each ledger
-- entry (a worker host's identity), covered by its leaf hash; NULL for the crawl's own
-- messages and every row written before this migration.

ALTER TABLE ingest_ledger ADD COLUMN submitter text
    CHECK (submitter IS NULL OR length(submitter) BETWEEN 1 AND 256);
