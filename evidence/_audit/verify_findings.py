"""What verify reports: a finding (an error, or a notice worth knowing), where it is, and
the collector that keeps at most a set number per kind. Every check module
(``verify_sqlite``, ``verify_rows``, ``verify_state``, ``verify_artifacts``) adds to one
``Findings``; ``verify`` turns it into the report's list."""

from __future__ import annotations

import collections
from typing import Any, Literal

import msgspec

__all__ = ["NOTICE_KINDS", "Finding", "Findings", "Location"]

NOTICE_KINDS = frozenset({"orphan", "artifact_writable", "sync_failed",  # worth knowing
                          "identity_unbound", "checkpoint_unbound"})


class Location(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Where a finding is: any of table and row id, log index, batch, file path, digest."""

    table: str | None = None
    row_id: int | str | None = None
    log_index: int | None = None
    batch_seq: int | None = None
    path: str | None = None
    digest: str | None = None

    def __str__(self) -> str:
        parts = []
        if self.table is not None:
            parts.append(self.table + ("" if self.row_id is None else f" row {self.row_id}"))
        if self.log_index is not None:
            parts.append(f"log index {self.log_index}")
        if self.batch_seq is not None:
            parts.append(f"batch {self.batch_seq}")
        if self.path is not None:
            parts.append(self.path)
        elif self.digest is not None:
            parts.append(self.digest)
        return ", ".join(parts)


class Findings:
    """Collects findings, keeping at most ``limit`` per kind (and counting the rest)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.items: list[tuple[str, Literal["error", "notice"], Location, str]] = []
        self.counts = collections.Counter[str]()
        self.omitted = collections.Counter[str]()

    def add(self, kind: str, message: str, **where: Any) -> None:
        severity: Literal["error", "notice"] = "notice" if kind in NOTICE_KINDS else "error"
        self.counts[kind] += 1
        if self.counts[kind] > self.limit:
            self.omitted[kind] += 1
            return
        self.items.append((kind, severity, Location(**where), message))


class Finding(msgspec.Struct, frozen=True, kw_only=True):
    """One thing wrong (``error``) or worth knowing (``notice``), and where it is."""

    kind: str
    severity: Literal["error", "notice"]
    location: Location
    message: str


