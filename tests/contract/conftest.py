"""The backends the contract suites run over: one parameter per implementation.

A store backend (SQLite; PostgreSQL, a fresh database of the session's cluster per store)
or artifact store (packs, issue 15; S3, issue 16) is one parameter here, with a factory
that opens it in a fresh place and, for the commit-outcome rule, a way to make its next
COMMIT fail.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from evidence import ArtifactStore, Store
from evidence.testing.faults import CrashFileOps, SimulatedDisk

from ..conftest import new_pg_database
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
def _postgresql(cluster) -> Iterator[Callable[[Path], StoreKind]]:
    databases: list[str] = []

    def open_store(path: Path) -> Store:
        url = new_pg_database(cluster)
        databases.append(url)
        store = Store.create(url, artifacts=str(path / "artifacts"))
        cluster.sql(_FAIL_AT_COMMIT, dbname=urlsplit(url).path.lstrip("/"))
        return store

    def fail_next_commit() -> None:
        dbname = urlsplit(databases[-1]).path.lstrip("/")
        cluster.sql("ALTER SEQUENCE test_fail_commit RESTART WITH 1", dbname=dbname)

    yield lambda root: StoreKind(open=open_store, fail_next_commit=fail_next_commit)


STORE_BACKENDS = {"sqlite": _sqlite, "postgresql": _postgresql}


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
}


@pytest.fixture(params=sorted(STORE_BACKENDS))
def store_kind(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreKind]:
    args = [request.getfixturevalue("pg_cluster")] if request.param == "postgresql" else []
    with STORE_BACKENDS[request.param](*args) as kind:
        yield kind(tmp_path)


@pytest.fixture(params=sorted(ARTIFACT_STORES))
def artifact_kind(request: pytest.FixtureRequest) -> ArtifactKind:
    return ARTIFACT_STORES[request.param]
