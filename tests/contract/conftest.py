"""The backends the contract suites run over: one parameter per implementation.

A second store backend (PostgreSQL, issue 16) or artifact store (S3, issue 16) is added
here, as one more parameter, with a factory that opens it in a fresh
place and, for the commit-outcome rule, a way to make its next COMMIT fail.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from evidence import ArtifactStore, Store
from evidence._store.packs import PackStore
from evidence.testing.faults import CrashFileOps, SimulatedDisk

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


@dataclass
class ArtifactKind:
    """How to open an artifact store at a root; how to open one whose every file operation
    goes to a simulated disk, cut its power and reopen what survived."""

    open: Callable[[Path], ArtifactStore]
    open_on: Callable[[Path, SimulatedDisk], ArtifactStore]


ARTIFACT_STORES = {
    "directory": ArtifactKind(
        open=lambda root: ArtifactStore(root),
        open_on=lambda root, disk: ArtifactStore(root, file_ops=CrashFileOps(disk))),
    "packs": ArtifactKind(
        open=lambda root: PackStore(root),
        open_on=lambda root, disk: PackStore(root, file_ops=CrashFileOps(disk))),
}


@pytest.fixture(params=sorted(STORE_BACKENDS))
def store_kind(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreKind]:
    with STORE_BACKENDS[request.param]() as kind:
        yield kind(tmp_path)


@pytest.fixture(params=sorted(ARTIFACT_STORES))
def artifact_kind(request: pytest.FixtureRequest) -> ArtifactKind:
    return ARTIFACT_STORES[request.param]
