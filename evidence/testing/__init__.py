"""Helpers for testing code built on ``evidence``; not part of the store's public API.

``evidence.testing.site`` serves a small, deterministic website on 127.0.0.1 whose
request log is the ground truth for crawler tests, benchmarks and the README demo.
It is not imported here, so ``python -m evidence.testing.site`` runs cleanly.
"""
