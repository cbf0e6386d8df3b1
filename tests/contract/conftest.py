"""The backends the contract suites run over: one parameter per implementation.

A second store backend (PostgreSQL, issue 16) or artifact store (packs, issue 15; S3,
issue 16) is added here, as one more parameter, with a factory that opens it in a fresh
place and, for the commit-outcome rule, a way to make its next COMMIT fail; for the
durability rule, a medium that can be crashed.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import pytest

from evidence import ArtifactStore, Store
from evidence._store.backend import ArtifactBackend
from evidence._store.packs import PackStore
from evidence._store.s3 import S3ArtifactStore, open_s3
from evidence.testing.faults import CrashFileOps, SimulatedDisk
from evidence.testing.seaweed import SeaweedS3

from ..faultvfs import FaultVFS


@dataclass
class StoreKind:
    """How to open a store on one backend, and how to fail its next COMMIT's write."""

    open: Callable[[Path], Store]
    fail_next_commit: Callable[[], None]


@contextlib.contextmanager
def _sqlite() -> Iterator[Callable[[Path], StoreKind]]:
    vfs = FaultVFS("contractvfs")
    try:
        def kind(root: Path) -> StoreKind:
            return StoreKind(open=lambda path: Store.create(path, vfs=vfs.name),
                             fail_next_commit=lambda: vfs.arm("write", "-wal"))
        yield kind
    finally:
        vfs.unregister()


STORE_BACKENDS = {"sqlite": _sqlite}


class Medium(Protocol):
    """Where an artifact store keeps its bytes, and a way to crash it as hard as it can be
    crashed here: power loss for a directory (a simulated disk drops every write not
    synced), SIGKILL and a restart for an object store's server."""

    def open(self) -> ArtifactBackend: ...

    def crash(self) -> None: ...


@dataclass
class ArtifactKind:
    """How to open an artifact store at a fresh place (named by a fresh directory), and a
    medium that can be crashed (a context manager)."""

    open: Callable[[Path], ArtifactBackend]
    crashable: Callable[[Path], AbstractContextManager[Medium]]


class _DiskMedium:
    def __init__(self, root: Path, kind: type[ArtifactStore] | type[PackStore]) -> None:
        self.kind = kind
        self.disk = SimulatedDisk(root)
        self.disk.capture()
        self.root = root / "artifacts"
        self.crashed = False

    def open(self) -> ArtifactBackend:
        if self.crashed:  # what survived, on the real directory
            return self.kind(self.root)
        return self.kind(self.root, file_ops=CrashFileOps(self.disk))

    def crash(self) -> None:
        self.disk.power_loss("drop")  # nothing that was not synced reaches the medium
        self.disk.write_crash_image()
        self.crashed = True


def _disk_medium(kind: type[ArtifactStore] | type[PackStore]
                 ) -> Callable[[Path], AbstractContextManager[Medium]]:
    @contextlib.contextmanager
    def medium(root: Path) -> Iterator[Medium]:
        yield _DiskMedium(root, kind)
    return medium


class _S3Medium:
    """A private SeaweedFS (the session's is shared): crash() SIGKILLs it and starts it
    again on the same data directory."""

    def __init__(self, root: Path) -> None:
        self.server = SeaweedS3.start(root / "s3")
        self.stores: list[S3ArtifactStore] = []

    def open(self) -> ArtifactBackend:
        store = open_s3(self.server.url("crash"), create=True, read_only=False,
                        environ=self.server.environ)
        self.stores.append(store)
        return store

    def crash(self) -> None:
        self.server.kill()
        self.server.restart()


@contextlib.contextmanager
def _s3_medium(root: Path) -> Iterator[Medium]:
    medium = _S3Medium(root)
    try:
        yield medium
    finally:
        for store in medium.stores:
            store.close()
        medium.server.close()


def _s3_kind(server: SeaweedS3, opened: list[S3ArtifactStore]) -> ArtifactKind:
    def open_at(root: Path) -> ArtifactBackend:
        # One prefix per directory name: opening the same root twice is the same store.
        prefix = "c-" + hashlib.sha256(str(root).encode()).hexdigest()[:16]
        store = open_s3(server.url(prefix), create=True, read_only=False,
                        environ=server.environ)
        opened.append(store)
        return store
    return ArtifactKind(open=open_at, crashable=_s3_medium)


ARTIFACT_STORES = {
    "directory": lambda request: ArtifactKind(open=lambda root: ArtifactStore(root),
                                              crashable=_disk_medium(ArtifactStore)),
    "packs": lambda request: ArtifactKind(open=lambda root: PackStore(root),
                                          crashable=_disk_medium(PackStore)),
    "s3": lambda request: _s3_kind(request.getfixturevalue("seaweed"),
                                   request.getfixturevalue("_s3_opened")),
}


@pytest.fixture(params=sorted(STORE_BACKENDS))
def store_kind(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreKind]:
    with STORE_BACKENDS[request.param]() as kind:
        yield kind(tmp_path)


@pytest.fixture
def _s3_opened() -> Iterator[list[S3ArtifactStore]]:
    opened: list[S3ArtifactStore] = []
    yield opened
    for store in opened:
        store.close()


@pytest.fixture(params=sorted(ARTIFACT_STORES))
def artifact_kind(request: pytest.FixtureRequest) -> ArtifactKind:
    """Each artifact store; "s3" runs on the session's SeaweedFS (tests/conftest.py)."""
    return ARTIFACT_STORES[request.param](request)
