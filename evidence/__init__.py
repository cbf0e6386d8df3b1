"""evidence: an audit-grade evidence store for web crawl pipelines.

The public face. Everything a user may import is listed in ``__all__`` here;
``tests/test_exported_members.py`` fails on an accidental export.

Names are imported on first use (PEP 562), so a command loads only the modules it needs:
``evidence status`` does not import the crawler, the archives or the proofs.
"""

import importlib as _importlib
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from ._version import __version__ as __version__  # the one place it is written

if _TYPE_CHECKING:  # what type checkers and IDEs see
    from ._archive.archive import (
        BackupReport,
        Comparison,
        Difference,
        RestoreReport,
        backup,
        compare,
        restore,
    )
    from ._archive.export import Manifest, export
    from ._archive.replayserve import ReplayServer
    from ._archive.wacz import WaczExport, export_wacz
    from ._archive.warc import export_warc
    from ._audit.checkpoints import SignedCheckpoint, checkpoint
    from ._audit.proofs import check_proof, prove_consistency, prove_inclusion
    from ._audit.replay import ReplayedResponse, replay
    from ._audit.report import RunReport, report
    from ._audit.status import StoreStatus, status
    from ._audit.verify import Finding, VerifyReport, reclaim_orphans, verify
    from ._crawl.browser import keep_browsers
    from ._crawl.crawler import Crawler
    from ._crawl.frontier import CrawlConfig
    from ._crawl.options import CrawlOptions, CrawlResult
    from ._crawl.render import RenderOptions
    from ._crawl.rules import EvaluationSummary, evaluate_page, evaluate_stored
    from ._crawl.rulesfile import Rule, RuleSet, load_rules
    from ._errors import (
        ArtifactCorruptError,
        ArtifactError,
        ArtifactMissingError,
        ArtifactReadError,
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
    from ._model.acks import Ack, WriterStatistics
    from ._model.messages import (
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
    from ._model.refs import ArtifactRef, validate_namespace
    from ._model.urls import NORMALIZER_VERSION, normalize_url, resolve_reference
    from ._store.artifacts import ArtifactStore
    from ._store.db import Store
    from ._store.log import check_log
    from ._write.limits import WriterLimits
    from ._write.writer import Writer


__all__ = [
    "NORMALIZER_VERSION",
    "Ack",
    "ArtifactCorruptError",
    "ArtifactError",
    "ArtifactMissingError",
    "ArtifactReadError",
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
    "keep_browsers",
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
    "BackupReport": "_archive.archive",
    "Comparison": "_archive.archive",
    "Difference": "_archive.archive",
    "RestoreReport": "_archive.archive",
    "backup": "_archive.archive",
    "compare": "_archive.archive",
    "restore": "_archive.archive",
    "ArtifactRef": "_model.refs",
    "ArtifactStore": "_store.artifacts",
    "validate_namespace": "_model.refs",
    "CrawlOptions": "_crawl.options",
    "CrawlResult": "_crawl.options",
    "Crawler": "_crawl.crawler",
    "ArtifactCorruptError": "_errors",
    "ArtifactError": "_errors",
    "ArtifactMissingError": "_errors",
    "ArtifactReadError": "_errors",
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
    "Manifest": "_archive.export",
    "export": "_archive.export",
    "CrawlConfig": "_crawl.frontier",
    "check_log": "_store.log",
    "Discovery": "_model.messages",
    "FetchAttempt": "_model.messages",
    "FrontierUpdate": "_model.messages",
    "HostUpdate": "_model.messages",
    "Message": "_model.messages",
    "ObservedRef": "_model.messages",
    "QueuedUrl": "_model.messages",
    "RuleEvaluated": "_model.messages",
    "RunEnded": "_model.messages",
    "RunStarted": "_model.messages",
    "SessionEnded": "_model.messages",
    "SessionStarted": "_model.messages",
    "SettledUrl": "_model.messages",
    "canonical_encode": "_model.messages",
    "decode_message": "_model.messages",
    "new_id": "_model.messages",
    "payload_hash": "_model.messages",
    "utc_now": "_model.messages",
    "SignedCheckpoint": "_audit.checkpoints",
    "check_proof": "_audit.proofs",
    "checkpoint": "_audit.checkpoints",
    "prove_consistency": "_audit.proofs",
    "prove_inclusion": "_audit.proofs",
    "ReplayedResponse": "_audit.replay",
    "replay": "_audit.replay",
    "RunReport": "_audit.report",
    "report": "_audit.report",
    "EvaluationSummary": "_crawl.rules",
    "Rule": "_crawl.rulesfile",
    "RuleSet": "_crawl.rulesfile",
    "evaluate_page": "_crawl.rules",
    "evaluate_stored": "_crawl.rules",
    "load_rules": "_crawl.rulesfile",
    "StoreStatus": "_audit.status",
    "status": "_audit.status",
    "Store": "_store.db",
    "NORMALIZER_VERSION": "_model.urls",
    "normalize_url": "_model.urls",
    "resolve_reference": "_model.urls",
    "Finding": "_audit.verify",
    "VerifyReport": "_audit.verify",
    "reclaim_orphans": "_audit.verify",
    "verify": "_audit.verify",
    "export_warc": "_archive.warc",
    "Ack": "_model.acks",
    "Writer": "_write.writer",
    "WriterLimits": "_write.limits",
    "WriterStatistics": "_model.acks",
    "BrowserError": "_errors",
    "Render": "_model.messages",
    "RenderOptions": "_crawl.render",
    "keep_browsers": "_crawl.browser",
    "WaczExport": "_archive.wacz",
    "export_wacz": "_archive.wacz",
    "ReplayServer": "_archive.replayserve",
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
