"""Shared fixtures: real stores in tmp_path, and a small message factory."""

from __future__ import annotations

import hashlib
import itertools
from pathlib import Path

import pytest

from evidence import (
    ArtifactRef,
    Discovery,
    FetchAttempt,
    ObservedRef,
    RunStarted,
    SessionStarted,
    Store,
    utc_now,
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def store(tmp_path: Path):
    with Store.create(tmp_path / "store") as s:
        yield s


class Factory:
    """Builds valid messages with fresh ids; every test states what it varies."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._ids = itertools.count()
        self.now = utc_now()

    def id(self, prefix: str) -> str:
        return f"{prefix}-{next(self._ids):06d}"

    def session(self, session_id: str = "s1", **kw: object) -> SessionStarted:
        return SessionStarted(message_id=self.id("m"), session_id=session_id,
                              started_at=self.now, **kw)

    def run(self, run_id: str = "r1", session_id: str = "s1") -> RunStarted:
        return RunStarted(message_id=self.id("m"), run_id=run_id, session_id=session_id,
                          started_at=self.now)

    def body(self, content: bytes = b"<html>hello</html>") -> ArtifactRef:
        return self.store.artifacts.put("body", content)

    def attempt(self, url: str = "http://example.com/", *, run_id: str = "r1",
                sequence: int = 0, body: ArtifactRef | None = None,
                **kw: object) -> FetchAttempt:
        fields: dict[str, object] = {
            "message_id": self.id("m"), "attempt_id": self.id("a"), "run_id": run_id,
            "url": url, "sequence": sequence, "started_at": self.now, "elapsed_ms": 1.0,
            "body": body, "outcome": "response", "http_status": 200}
        fields.update(kw)
        return FetchAttempt(**fields)

    def discovery(self, attempt: FetchAttempt, source: ArtifactRef,
                  targets: list[str]) -> Discovery:
        refs = [ObservedRef(observed=t, url=t, position=i) for i, t in enumerate(targets)]
        return Discovery(message_id=self.id("m"), run_id=attempt.run_id,
                         source_attempt_id=attempt.attempt_id, source_artifact=source,
                         refs=refs)


@pytest.fixture
def make(store: Store) -> Factory:
    return Factory(store)


async def asubmit(store: Store, messages: list, **limits: object) -> list:
    """Submit messages one after another through a real writer; return their acks."""
    from evidence import Writer, WriterLimits

    async with Writer(store, limits=WriterLimits(**limits)) as writer:
        return [await writer.submit(m) for m in messages]


def submit_all(store: Store, messages: list, **limits: object) -> list:
    """``asubmit`` for synchronous callers."""
    import anyio

    return anyio.run(lambda: asubmit(store, messages, **limits))


@pytest.fixture
def populated_store(store: Store, make: Factory) -> Store:
    """A store with at least one row in every evidence table, written by the writer."""
    import msgspec

    from evidence import RuleEvaluated, RunEnded

    body = make.body()
    attempt = make.attempt(body=body)
    messages = [
        make.session(), make.run(), attempt,
        make.discovery(attempt, body, ["http://example.com/a", "http://example.com/b"]),
        RuleEvaluated(message_id=make.id("m"), run_id="r1", url=attempt.url, rule_id="title",
                      rule_version="1", input_hash=body.digest, verdict="pass",
                      evaluated_at=make.now, attempt_id=attempt.attempt_id),
        RunEnded(message_id=make.id("m"), run_id="r1", ended_at=make.now, outcome="completed"),
        msgspec.structs.replace(attempt, elapsed_ms=99.0),  # a conflict: quarantined
    ]
    acks = submit_all(store, messages)
    assert [a.status for a in acks] == ["committed"] * 6 + ["conflict"]
    return store


def reference_mth(leaves: list[bytes]) -> bytes:
    """RFC 9162 2.1.1 Merkle tree hash, transcribed independently of evidence._model.merkle."""
    if not leaves:
        return hashlib.sha256(b"").digest()
    if len(leaves) == 1:
        return leaves[0]
    k = 1
    while k * 2 < len(leaves):
        k *= 2
    return hashlib.sha256(b"\x01" + reference_mth(leaves[:k])
                          + reference_mth(leaves[k:])).digest()
