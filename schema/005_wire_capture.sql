-- 005_wire_capture: attempts recorded as they crossed the connection, and their content.
--
-- An attempt's capture says what its artifacts are. 'rebuilt' (every attempt recorded
-- before this migration): the request and response heads were rebuilt from parsed
-- headers and the body was de-chunked (its content coding kept). 'wire': the request as
-- written, the response head and the message body as read, transfer coding included.
-- content_id is the body with transfer_coding and then content_coding removed, present
-- only when its bytes differ from the body's (absent: the body is the content).
-- surplus_id holds bytes read after the body's end. text_encoding and its source say how
-- an HTML document's text was decoded (bom, header, meta, default). Old rows keep their
-- meaning: 'rebuilt' and NULLs, the values their messages decode to.

ALTER TABLE fetch_attempt ADD COLUMN capture TEXT NOT NULL DEFAULT 'rebuilt'
    CHECK (capture IN ('rebuilt', 'wire'));
ALTER TABLE fetch_attempt ADD COLUMN content_id INTEGER REFERENCES artifact (artifact_id);
ALTER TABLE fetch_attempt ADD COLUMN transfer_coding TEXT;
ALTER TABLE fetch_attempt ADD COLUMN content_coding TEXT;
ALTER TABLE fetch_attempt ADD COLUMN content_truncated INTEGER NOT NULL DEFAULT 0
    CHECK (content_truncated IN (0, 1));
ALTER TABLE fetch_attempt ADD COLUMN surplus_id INTEGER REFERENCES artifact (artifact_id);
ALTER TABLE fetch_attempt ADD COLUMN text_encoding TEXT;
ALTER TABLE fetch_attempt ADD COLUMN text_encoding_source TEXT
    CHECK (text_encoding_source IN ('bom', 'header', 'meta', 'default'));
