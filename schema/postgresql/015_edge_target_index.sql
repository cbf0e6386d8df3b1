-- 015_edge_target_index: the edges' index by target covers sitemap edges only (issue 35).
--
-- As schema/015_edge_target_index.sql: an index on every edge's target scatters its
-- inserts (about ten per page) over the whole index; the one lookup by target a crawl
-- makes, the sitemap hint, asks for sitemap edges only.

DROP INDEX discovery_edge_by_target;
CREATE INDEX discovery_edge_sitemap_by_target ON discovery_edge (target_url_id)
    WHERE edge_kind = 'sitemap';
