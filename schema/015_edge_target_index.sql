-- 015_edge_target_index: the edges' index by target covers sitemap edges only (issue 35).
--
-- discovery_edge_by_target held every edge (about ten per page) keyed by the target's
-- url_id, which scatters: each batch of a crawl rewrote a page of that index for most of
-- its edges, a fifth of all the bytes a crawl wrote to the WAL (docs/benchmarks.md, "Writes
-- per page"). What reads edges by their target during a crawl is the sitemap hint (the
-- lastmod and changefreq a session's sitemaps gave for a URL: _crawl/incremental.py),
-- which asks for sitemap edges only, so a partial index keeps that lookup indexed. The
-- rarer questions about any edge's target (``evidence show``'s count of links in) read
-- the table instead.

DROP INDEX discovery_edge_by_target;
CREATE INDEX discovery_edge_sitemap_by_target ON discovery_edge (target_url_id)
    WHERE edge_kind = 'sitemap';
