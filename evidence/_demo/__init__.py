"""The demo site: a small, deterministic website served on 127.0.0.1.

``evidence demo`` crawls it; the crawler tests use its request log as their ground truth,
and the benchmarks crawl it (``python -m evidence._demo.site`` serves one by itself).
Nothing here is imported by the store, the writer or the crawler.
"""
