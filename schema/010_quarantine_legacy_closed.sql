-- 010_quarantine_legacy_closed: no quarantine row in the pre-006 layout is ever written again.
--
-- Rows from before migration 006 (one per delivery, deliveries NULL) are in no batch's
-- record of what it quarantined, so nothing in the commit log vouches for them; a row
-- forged in that layout would pass every check made of it. No writer has written one since
-- 006, so their set is closed: store_meta's 'legacy_quarantine' records how many the store
-- holds (here, for a store this migration finds; at creation, 0, for a new store), verify
-- compares the table with it, and a signed checkpoint binds the rows themselves
-- (docs/verify.md). A store being copied into (no store_id yet) gets the key with its rows.
INSERT INTO store_meta (key, value)
SELECT 'legacy_quarantine', CAST((SELECT count(*) FROM quarantine WHERE deliveries IS NULL) AS TEXT)
WHERE EXISTS (SELECT 1 FROM store_meta WHERE key = 'store_id');

CREATE TRIGGER quarantine_no_legacy_insert BEFORE INSERT ON quarantine
WHEN NEW.deliveries IS NULL AND EXISTS (SELECT 1 FROM store_meta WHERE key = 'legacy_quarantine')
BEGIN SELECT RAISE(ABORT, 'quarantine rows in the pre-006 layout (deliveries NULL) are closed: a record counts its deliveries'); END;
