-- 008_requisite_edges (PostgreSQL): mirrors schema/008_requisite_edges.sql.
--
-- A page's requisites are discovery edges of their own kinds ('image', 'script',
-- 'stylesheet', 'style', 'media'). SQLite rebuilds the table to widen its CHECK; here the
-- CHECK is replaced in place (ALTER TABLE fires no row trigger, and the new CHECK is
-- validated against every row already there), under the same name PostgreSQL gave the
-- column constraint of 001.

ALTER TABLE discovery_edge DROP CONSTRAINT discovery_edge_edge_kind_check;
ALTER TABLE discovery_edge ADD CONSTRAINT discovery_edge_edge_kind_check
    CHECK (edge_kind IN ('link', 'redirect', 'embed', 'sitemap', 'image', 'script',
                         'stylesheet', 'style', 'media'));
