"""evidence: an audit-grade evidence store for web crawl pipelines.

The public face. Everything a user may import is listed in ``__all__`` here;
``tests/test_exported_members.py`` fails on an accidental export.

Names are imported on first use (PEP 562), so a command loads only the modules it needs:
``evidence status`` does not import the crawler, the archives or the proofs.
"""

import importlib as _importlib
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

if _TYPE_CHECKING:  # what type checkers and IDEs see
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
        BrowserError,
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
        SyncError,
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
        Render,
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
    from ._proofs import (
        SignedCheckpoint,
        check_proof,
        checkpoint,
        prove_consistency,
        prove_inclusion,
    )
    from ._render import RenderOptions
    from ._replay import ReplayedResponse, replay
    from ._replayserve import ReplayServer
    from ._report import RunReport, report
    from ._rules import EvaluationSummary, Rule, RuleSet, evaluate_page, evaluate_stored, load_rules
    from ._status import StoreStatus, status
    from ._store import Store
    from ._urls import NORMALIZER_VERSION, normalize_url, resolve_reference
    from ._verify import Finding, VerifyReport, reclaim_orphans, verify
    from ._wacz import WaczExport, export_wacz
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
    "BrowserError",
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
    "Render",
    "RenderOptions",
    "ReplayServer",
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
    "SyncError",
    "URLError",
    "VerifyReport",
    "WaczExport",
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
    "export_wacz",
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

# The module of each public name: imported when the name is first looked up.
_WHERE = {
    "BackupReport": "_archive",
    "Comparison": "_archive",
    "Difference": "_archive",
    "RestoreReport": "_archive",
    "backup": "_archive",
    "compare": "_archive",
    "restore": "_archive",
    "ArtifactRef": "_artifacts",
    "ArtifactStore": "_artifacts",
    "validate_namespace": "_artifacts",
    "CrawlOptions": "_crawl",
    "CrawlResult": "_crawl",
    "Crawler": "_crawl",
    "ArtifactCorruptError": "_errors",
    "ArtifactError": "_errors",
    "ArtifactMissingError": "_errors",
    "CommitError": "_errors",
    "CorruptStoreError": "_errors",
    "EvidenceError": "_errors",
    "MessageError": "_errors",
    "MigrationError": "_errors",
    "NamespaceError": "_errors",
    "NotFoundError": "_errors",
    "PayloadTooLargeError": "_errors",
    "ProofError": "_errors",
    "RulesError": "_errors",
    "SQLiteVersionError": "_errors",
    "ServiceError": "_errors",
    "StoreError": "_errors",
    "SyncError": "_errors",
    "URLError": "_errors",
    "WriterClosedError": "_errors",
    "WriterError": "_errors",
    "Manifest": "_export",
    "export": "_export",
    "CrawlConfig": "_frontier",
    "check_log": "_log",
    "Discovery": "_messages",
    "FetchAttempt": "_messages",
    "FrontierUpdate": "_messages",
    "HostUpdate": "_messages",
    "Message": "_messages",
    "ObservedRef": "_messages",
    "QueuedUrl": "_messages",
    "RuleEvaluated": "_messages",
    "RunEnded": "_messages",
    "RunStarted": "_messages",
    "SessionEnded": "_messages",
    "SessionStarted": "_messages",
    "SettledUrl": "_messages",
    "canonical_encode": "_messages",
    "decode_message": "_messages",
    "new_id": "_messages",
    "payload_hash": "_messages",
    "utc_now": "_messages",
    "SignedCheckpoint": "_proofs",
    "check_proof": "_proofs",
    "checkpoint": "_proofs",
    "prove_consistency": "_proofs",
    "prove_inclusion": "_proofs",
    "ReplayedResponse": "_replay",
    "replay": "_replay",
    "RunReport": "_report",
    "report": "_report",
    "EvaluationSummary": "_rules",
    "Rule": "_rules",
    "RuleSet": "_rules",
    "evaluate_page": "_rules",
    "evaluate_stored": "_rules",
    "load_rules": "_rules",
    "StoreStatus": "_status",
    "status": "_status",
    "Store": "_store",
    "NORMALIZER_VERSION": "_urls",
    "normalize_url": "_urls",
    "resolve_reference": "_urls",
    "Finding": "_verify",
    "VerifyReport": "_verify",
    "reclaim_orphans": "_verify",
    "verify": "_verify",
    "export_warc": "_warc",
    "BrowserError": "_errors",
    "Render": "_messages",
    "RenderOptions": "_render",
    "WaczExport": "_wacz",
    "export_wacz": "_wacz",
    "ReplayServer": "_replayserve",
    "Ack": "_writer",
    "Writer": "_writer",
    "WriterLimits": "_writer",
    "WriterStatistics": "_writer",
}


def __getattr__(name: str) -> _Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'evidence' has no attribute {name!r}")
    value = getattr(_importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # the next lookup is a plain global
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
