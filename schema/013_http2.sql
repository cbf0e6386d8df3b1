-- 013_http2: the protocol each attempt's request went over, and an HTTP/2 stream's frames
-- (issue 33).
--
-- protocol is 'http/1.1' (every attempt recorded before this migration: the value their
-- messages decode to) or 'h2'. An h2 attempt's request_headers artifact holds the frames
-- the client wrote on the request's stream, and frames_id the frames it read on it (with
-- each GOAWAY read while the stream was open), exactly as they crossed the connection;
-- its response_headers and body are derived from those frames (evidence/_model/http2.py:
-- the decoded head rendered HTTP/1-style, the DATA payloads). An HTTP/1.1 attempt has no
-- frames_id. The check is spelled with OR, not IN: SQLite builds an ephemeral index for
-- each CHECK (x IN (...)) at every execution of the attempt INSERT.

ALTER TABLE fetch_attempt ADD COLUMN protocol TEXT NOT NULL DEFAULT 'http/1.1'
    CHECK (protocol = 'http/1.1' OR protocol = 'h2');
ALTER TABLE fetch_attempt ADD COLUMN frames_id INTEGER REFERENCES artifact (artifact_id);
