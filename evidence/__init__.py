"""evidence: an audit-grade evidence store for web crawl pipelines.

The public face. Everything a user may import is listed in ``__all__`` here;
``tests/test_exported_members.py`` fails on an accidental export.
"""

from ._archive import (
    BackupReport,
    Comparison,
    Difference,
    RestoreReport,
    backup,
    compare,
    restore,
)
from ._artifacts import ArtifactRef, ArtifactStore, validate_namespace
from ._crawl import Crawler, CrawlOptions, CrawlResult
from ._errors import (
    ArtifactCorruptError,
    ArtifactError,
    ArtifactMissingError,
    CommitError,
    CorruptStoreError,
    EvidenceError,
    MessageError,
    MigrationError,
    NamespaceError,
    NotFoundError,
    PayloadTooLargeError,
    ProofError,
    RulesError,
    ServiceError,
    SQLiteVersionError,
    StoreError,
    URLError,
    WriterClosedError,
    WriterError,
)
from ._export import Manifest, export
from ._frontier import CrawlConfig
from ._log import check_log
from ._messages import (
    Discovery,
    FetchAttempt,
    FrontierUpdate,
    HostUpdate,
    Message,
    ObservedRef,
    QueuedUrl,
    RuleEvaluated,
    RunEnded,
    RunStarted,
    SessionEnded,
    SessionStarted,
    SettledUrl,
    canonical_encode,
    decode_message,
    new_id,
    payload_hash,
    utc_now,
)
from ._proofs import SignedCheckpoint, check_proof, checkpoint, prove_consistency, prove_inclusion
from ._replay import ReplayedResponse, replay
from ._report import RunReport, report
from ._rules import EvaluationSummary, Rule, RuleSet, evaluate_page, evaluate_stored, load_rules
from ._status import StoreStatus, status
from ._store import Store
from ._urls import NORMALIZER_VERSION, normalize_url, resolve_reference
from ._verify import Finding, VerifyReport, reclaim_orphans, verify
from ._warc import export_warc
from ._writer import Ack, Writer, WriterLimits, WriterStatistics

__version__ = "0.1.0"

__all__ = [
    "NORMALIZER_VERSION",
    "Ack",
    "ArtifactCorruptError",
    "ArtifactError",
    "ArtifactMissingError",
    "ArtifactRef",
    "ArtifactStore",
    "BackupReport",
    "CommitError",
    "Comparison",
    "CorruptStoreError",
    "CrawlConfig",
    "CrawlOptions",
    "CrawlResult",
    "Crawler",
    "Difference",
    "Discovery",
    "EvaluationSummary",
    "EvidenceError",
    "FetchAttempt",
    "Finding",
    "FrontierUpdate",
    "HostUpdate",
    "Manifest",
    "Message",
    "MessageError",
    "MigrationError",
    "NamespaceError",
    "NotFoundError",
    "ObservedRef",
    "PayloadTooLargeError",
    "ProofError",
    "QueuedUrl",
    "ReplayedResponse",
    "RestoreReport",
    "Rule",
    "RuleEvaluated",
    "RuleSet",
    "RulesError",
    "RunEnded",
    "RunReport",
    "RunStarted",
    "SQLiteVersionError",
    "ServiceError",
    "SessionEnded",
    "SessionStarted",
    "SettledUrl",
    "SignedCheckpoint",
    "Store",
    "StoreError",
    "StoreStatus",
    "URLError",
    "VerifyReport",
    "Writer",
    "WriterClosedError",
    "WriterError",
    "WriterLimits",
    "WriterStatistics",
    "backup",
    "canonical_encode",
    "check_log",
    "check_proof",
    "checkpoint",
    "compare",
    "decode_message",
    "evaluate_page",
    "evaluate_stored",
    "export",
    "export_warc",
    "load_rules",
    "new_id",
    "normalize_url",
    "payload_hash",
    "prove_consistency",
    "prove_inclusion",
    "reclaim_orphans",
    "replay",
    "report",
    "resolve_reference",
    "restore",
    "status",
    "utc_now",
    "validate_namespace",
    "verify",
]
