"""The backends the contract suites run over: one parameter per implementation.

A store backend (SQLite; PostgreSQL, a fresh database of the session's cluster per store)
or artifact store (a directory of files; packs, issue 15; S3, issue 16) is one parameter
here, with a factory that opens it in a fresh place and, for the commit-outcome rule, a way
to make its next COMMIT fail; for the durability rule, a medium that can be crashed.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

import pytest

from evidence import ArtifactStore, Store
from evidence._store.backend import ArtifactBackend
from evidence._store.packs import PackStore
from evidence._store.s3 import S3ArtifactStore, open_s3
from evidence.testing.disk import CrashFileOps, SimulatedDisk
from evidence.testing.seaweed import SeaweedS3

from ..conftest import new_pg_database, new_s3_url
from ..faultvfs import FaultVFS


@dataclass
class StoreKind:
    """How to open a store on one backend, and how to fail its next COMMIT's write."""

    open: Callable[[Path], Store]
    fail_next_commit: Callable[[], None]


# Where a store of the contract suite keeps its payloads: its own directory (packs, the
# default for a new store; a PostgreSQL store names one) or an S3 object store. Every store
# backend runs with each (the {SQLite, PostgreSQL} x {packs, S3} matrix of issue 16).
ARTIFACT_PLACES = ("packs", "s3")


@contextlib.contextmanager
def _sqlite(s3: Callable[[], str] | None) -> Iterator[Callable[[Path], StoreKind]]:
    vfs = FaultVFS("contractvfs")
    try:
        def kind(root: Path) -> StoreKind:
            return StoreKind(open=lambda path: Store.create(
                                 path, vfs=vfs.name, artifacts=s3() if s3 else None),
                             fail_next_commit=lambda: vfs.arm("write", "-wal"))
        yield kind
    finally:
        vfs.unregister()


# A COMMIT that fails, on PostgreSQL: a deferred constraint trigger on commit_log that raises
# an I/O-class error (SQLSTATE 58030) at COMMIT while a sequence (not rolled back with the
# transaction) says it is armed. Installed in the test's database only.
_FAIL_AT_COMMIT = """
CREATE SEQUENCE test_fail_commit START 1000;
CREATE FUNCTION test_fail_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF nextval('test_fail_commit') = 1 THEN
        RAISE EXCEPTION 'injected: the COMMIT failed' USING ERRCODE = '58030';
    END IF;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER test_fail_commit AFTER INSERT ON commit_log
DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION test_fail_commit();
"""


@contextlib.contextmanager
def _postgresql(s3: Callable[[], str] | None, cluster) -> Iterator[Callable[[Path], StoreKind]]:
    databases: list[str] = []

    def open_store(path: Path) -> Store:
        url = new_pg_database(cluster)
        databases.append(url)
        store = Store.create(url, artifacts=s3() if s3 else str(path / "artifacts"))
        cluster.sql(_FAIL_AT_COMMIT, dbname=urlsplit(url).path.lstrip("/"))
        return store

    def fail_next_commit() -> None:
        dbname = urlsplit(databases[-1]).path.lstrip("/")
        cluster.sql("ALTER SEQUENCE test_fail_commit RESTART WITH 1", dbname=dbname)

    yield lambda root: StoreKind(open=open_store, fail_next_commit=fail_next_commit)


STORE_BACKENDS = {"sqlite": _sqlite, "postgresql": _postgresql}


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

    def __init__(self, root: Path, hold: bool) -> None:
        self.server = SeaweedS3.start(root / "s3")
        self.stores: list[S3ArtifactStore] = []
        self.hold = hold

    def open(self) -> ArtifactBackend:
        store = open_s3(self.server.url("crash"), create=True, read_only=False,
                        environ=self.server.environ, hold=self.hold)
        self.stores.append(store)
        return store

    def crash(self) -> None:
        self.server.kill()
        self.server.restart()


def _s3_medium(hold: bool) -> Callable[[Path], AbstractContextManager[Medium]]:
    return functools.partial(_s3_medium_at, hold=hold)


@contextlib.contextmanager
def _s3_medium_at(root: Path, *, hold: bool) -> Iterator[Medium]:
    medium = _S3Medium(root, hold)
    try:
        yield medium
    finally:
        for store in medium.stores:
            store.close()
        medium.server.close()


def _s3_kind(server: SeaweedS3, opened: list[S3ArtifactStore], *,
             hold: bool = False) -> ArtifactKind:
    """One object per payload (``hold=False``: a worker process's store), or the
    writer's store, whose puts wait for a sync that seals them into a segment."""
    def open_at(root: Path) -> ArtifactBackend:
        # One prefix per directory name: opening the same root twice is the same store.
        prefix = "c-" + hashlib.sha256(f"{root}{hold}".encode()).hexdigest()[:16]
        store = open_s3(server.url(prefix), create=True, read_only=False,
                        environ=server.environ, hold=hold)
        opened.append(store)
        return store
    return ArtifactKind(open=open_at, crashable=_s3_medium(hold))


ARTIFACT_STORES = {
    "directory": lambda request: ArtifactKind(open=lambda root: ArtifactStore(root),
                                              crashable=_disk_medium(ArtifactStore)),
    "packs": lambda request: ArtifactKind(open=lambda root: PackStore(root),
                                          crashable=_disk_medium(PackStore)),
    "s3": lambda request: _s3_kind(request.getfixturevalue("seaweed"),
                                   request.getfixturevalue("_s3_opened")),
    "s3-segments": lambda request: _s3_kind(request.getfixturevalue("seaweed"),
                                            request.getfixturevalue("_s3_opened"),
                                            hold=True),
}


@pytest.fixture(params=[f"{backend}-{place}" for backend in sorted(STORE_BACKENDS)
                        for place in ARTIFACT_PLACES])
def store_kind(request: pytest.FixtureRequest, tmp_path: Path,
               monkeypatch: pytest.MonkeyPatch) -> Iterator[StoreKind]:
    """Each store backend with each place for its payloads."""
    backend, place = request.param.split("-")
    yield from _store_kind(request, tmp_path, monkeypatch, backend, place)


@pytest.fixture(params=sorted(STORE_BACKENDS))
def backend_kind(request: pytest.FixtureRequest, tmp_path: Path,
                 monkeypatch: pytest.MonkeyPatch) -> Iterator[StoreKind]:
    """Each store backend, its payloads in packs: for a guarantee of the database alone
    (a property test whose examples each make a store, where S3 would only add time)."""
    yield from _store_kind(request, tmp_path, monkeypatch, request.param, "packs")


def _store_kind(request: pytest.FixtureRequest, tmp_path: Path,
                monkeypatch: pytest.MonkeyPatch, backend: str, place: str
                ) -> Iterator[StoreKind]:
    s3 = None
    if place == "s3":
        server = request.getfixturevalue("seaweed")
        for name, value in server.environ.items():  # the credentials, as an operator's
            monkeypatch.setenv(name, value)
        s3 = functools.partial(new_s3_url, server, "contract")
    args = [request.getfixturevalue("pg_cluster")] if backend == "postgresql" else []
    with STORE_BACKENDS[backend](s3, *args) as kind:
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
