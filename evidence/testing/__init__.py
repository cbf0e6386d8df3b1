"""Helpers for testing code built on ``evidence``; not part of the store's public API.

``evidence.testing.disk`` is the simulated disk of the fault tests: an apsw VFS and an
artifact-store ``FileOps`` that model power loss (dropped, torn, reordered writes; directory
entries durable only once their directory is synced) and I/O or disk-full errors at the
N-th operation (docs/reliability.md). ``evidence.testing.trial`` runs a fixed writer
workload on that disk under one fault, crashes it and checks what survived.

``evidence.testing.pgcluster`` starts a throwaway PostgreSQL cluster (the Debian package's
server, in a temporary directory, on a Unix socket and 127.0.0.1) for the PostgreSQL
backend's tests and benchmark.

The website the crawler tests run against is the demo site, ``evidence._demo.site``.
"""
