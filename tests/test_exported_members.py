"""The public face is deliberate: an accidental export fails here."""

from __future__ import annotations

import evidence

EXPECTED = {
    "NORMALIZER_VERSION", "Ack", "ArtifactCorruptError", "ArtifactError",
    "ArtifactMissingError", "ArtifactReadError", "ArtifactRef", "ArtifactStore", "CommitError",
    "CorruptStoreError", "CrawlConfig", "CrawlOptions", "CrawlResult", "Crawler",
    "Discovery", "EvidenceError", "FetchAttempt", "FrontierUpdate", "HostUpdate", "Message",
    "MessageError", "MigrationError", "NamespaceError", "ObservedRef",
    "PayloadTooLargeError", "QueuedUrl", "RuleEvaluated", "RunEnded", "RunStarted",
    "SQLiteVersionError", "SessionEnded", "SessionStarted", "SettledUrl", "Store",
    "StoreError", "StoreStatus", "SyncError", "URLError", "Writer", "WriterClosedError",
    "WriterError",
    "WriterLimits", "WriterStatistics", "canonical_encode", "check_log", "decode_message",
    "new_id", "normalize_url", "payload_hash", "resolve_reference", "status", "utc_now",
    "validate_namespace",
    # archives: verify, proofs, replay
    "NotFoundError", "ProofError", "SignedCheckpoint", "check_proof", "checkpoint",
    "prove_consistency", "prove_inclusion", "ReplayedResponse", "replay", "Finding",
    "VerifyReport", "reclaim_orphans", "verify", "export_warc",
    # archives: export, backup, restore, compare
    "BackupReport", "Comparison", "Difference", "RestoreReport", "backup", "compare",
    "restore", "Manifest", "export",
    # compliance rules
    "RunReport", "report", "EvaluationSummary", "Rule", "RuleSet", "evaluate_page",
    "evaluate_stored", "load_rules", "RulesError",
    # the writer service (its client is the public module evidence.client)
    "ServiceError",
    # rendered capture, WACZ, replay in a browser
    "BrowserError", "Render", "RenderOptions", "WaczExport", "export_wacz", "ReplayServer",
    "keep_browsers",
}


def test_public_names_are_exactly_the_documented_ones() -> None:
    assert set(evidence.__all__) == EXPECTED


def test_every_public_name_exists() -> None:
    for name in evidence.__all__:
        assert getattr(evidence, name) is not None, name
    public = {n for n in dir(evidence) if not n.startswith("_")}
    # Submodules that Python binds on import are the only extra public attributes.
    assert public - EXPECTED <= {"testing", "client"}
