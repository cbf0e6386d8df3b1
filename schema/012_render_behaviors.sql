-- 012_render_behaviors: what a render's behaviours did before its capture.
--
-- Before a rendered page is captured, behaviours may scroll it, make its lazy images load,
-- open its <details>, click its "load more" buttons and play its media (docs/replay.md).
-- Their log (canonical JSON: each action, its target, when, the requests that followed) is
-- an artifact of namespace 'behaviors'; the render names it. A render made before this
-- migration, or with behaviours off, names none. A column is added in place: render is
-- append-only, and a NULL default changes no row.

ALTER TABLE render ADD COLUMN behaviors_id INTEGER REFERENCES artifact (artifact_id);
