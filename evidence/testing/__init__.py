"""Helpers for testing code built on ``evidence``; not part of the store's public API.

``evidence.testing.site`` serves a small, deterministic website on 127.0.0.1 whose
request log is the ground truth for crawler tests, benchmarks and the README demo.
It is not imported here, so ``python -m evidence.testing.site`` runs cleanly.

``evidence.testing.faults`` is the simulated disk of the fault tests: an apsw VFS and an
artifact-store ``FileOps`` that model power loss (dropped, torn, reordered writes; directory
entries durable only once their directory is synced) and I/O or disk-full errors at the
N-th operation (docs/reliability.md).
"""
