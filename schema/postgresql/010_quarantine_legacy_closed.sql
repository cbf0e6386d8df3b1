-- 010_quarantine_legacy_closed (PostgreSQL): mirrors schema/010_quarantine_legacy_closed.sql.
-- A trigger's WHEN cannot read another table here, so a function does.

INSERT INTO store_meta (key, value)
SELECT 'legacy_quarantine', CAST((SELECT count(*) FROM quarantine WHERE deliveries IS NULL) AS text)
WHERE EXISTS (SELECT 1 FROM store_meta WHERE key = 'store_id');

CREATE FUNCTION quarantine_refuse_legacy() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM store_meta WHERE key = 'legacy_quarantine') THEN
        RAISE EXCEPTION 'quarantine rows in the pre-006 layout (deliveries NULL) are closed: a record counts its deliveries'
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER quarantine_no_legacy_insert BEFORE INSERT ON quarantine FOR EACH ROW
WHEN (NEW.deliveries IS NULL) EXECUTE FUNCTION quarantine_refuse_legacy();
