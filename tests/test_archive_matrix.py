"""Export, backup, restore and compare on every kind of store there is: {SQLite,
PostgreSQL} x {files, packs, s3://} (issue 29), each holding rendered and unrendered pages.

Each of the six sources is crawled once per module (a small site on 127.0.0.1; the payloads
in one file each, in packs, or in SeaweedFS; its home page rendered in Chromium with the
default behaviours, the other pages not), named by its location as a user names it.
Its archive must hold every payload, restore into a store directory and into a PostgreSQL
database, export again to the same bytes (so the same Merkle root), and compare equal to
its source, payloads included; its backup too. The archive carries a checkpoint signed
of its source (issue 32), which every restore checks and every export of a copy carries
to the same bytes. A PostgreSQL store with its payloads in S3
once exported an archive with none of them (the source's artifact store was closed before
it was read) and said nothing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest

from evidence import ArtifactRef, CrawlConfig, Crawler, CrawlOptions, Store, compare
from evidence._archive.archive import backup, restore
from evidence._archive.carried import Carried, read_checkpoint_file
from evidence._archive.export import Manifest, export
from evidence._archive.segments import ArchivePayloads
from evidence._archive.wacz import export_wacz
from evidence._archive.warc import export_warc
from evidence._audit.checkpoints import checkpoint
from evidence._audit.keys import SigningKey
from evidence._cli.main import main as cli_main
from evidence._demo.site import SiteConfig, TestSite
from evidence._store.artifacts import ArtifactStore
from evidence._store.packs import PackStore
from evidence._store.s3 import S3ArtifactStore

from .conftest import new_pg_database, new_s3_url

SOURCES = [(db, layout) for db in ("sqlite", "postgresql") for layout in ("files", "packs", "s3")]
TARGETS = ["sqlite", "postgresql"]
KINDS = {"files": ArtifactStore, "packs": PackStore, "s3": S3ArtifactStore}


@dataclass(frozen=True)
class Source:
    name: str  # sqlite-files, postgresql-s3, ...
    location: str  # what a user names: a directory or a connection string
    work: Path  # where this source's archives and copies go
    refs: frozenset[tuple[str, str, int]]  # every payload its rows reference


@pytest.fixture(scope="module")
def s3_credentials(seaweed) -> Iterator[None]:
    """The object store's credentials in this process's environment, as a deployment sets
    them (the stores and the commands run from here read them there)."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in seaweed.environ.items():
            patch.setenv(name, value)
        yield


@pytest.fixture(scope="module")
def site() -> Iterator[TestSite]:
    with TestSite(SiteConfig(pages=4, links_per_page=2)) as served:
        yield served


@pytest.fixture(scope="module", params=SOURCES, ids=["-".join(s) for s in SOURCES])
def source(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
           pg_cluster, seaweed, s3_credentials: None, site: TestSite,
           chromium: str) -> Source:
    db, layout = request.param
    work = tmp_path_factory.mktemp(f"{db}-{layout}")
    location = str(work / "store") if db == "sqlite" else new_pg_database(pg_cluster)
    payloads = new_s3_url(seaweed, "matrix") if layout == "s3" else (
        None if db == "sqlite" else str(work / "payloads"))
    with Store.create(location, artifacts=payloads,
                      artifact_layout="files" if layout == "files" else "packs") as store:
        assert type(store.artifacts) is KINDS[layout]
        # Named localhost: its resolutions and the connections' addresses are recorded
        # (issue 33), and must travel through every archive like the rest. Its home page is
        # rendered (with the default behaviours), the others not.
        seed = site.url.replace("127.0.0.1", "localhost")
        config = CrawlConfig(seeds=[seed], render_only=[re.escape(seed) + "$"])
        result = anyio.run(Crawler(store, config, CrawlOptions()).run)
        assert result.outcome == "completed"
        assert store.connection.execute("SELECT count(*) FROM dns_resolution").fetchall()[0][0]
        assert store.connection.execute("SELECT count(*) FROM fetch_attempt WHERE "
                                        "remote_address = '127.0.0.1'").fetchall()[0][0]
        refs = frozenset(store.connection.execute(
            "SELECT namespace, digest, size FROM artifact").fetchall())
        assert store.connection.execute(  # a render, with its screenshot and behaviours
            "SELECT count(*) FROM render WHERE screenshot_id IS NOT NULL AND behaviors_id "
            "IS NOT NULL").fetchall() == [(1,)]
    assert len(refs) > 10
    return Source(f"{db}-{layout}", location, work, refs)


def signed(source: Source) -> Carried:
    """The checkpoint of the source (signed once per source), as export carries it."""
    cp = source.work / "cp"
    if not cp.exists():
        with Store.open(source.location, read_only=True) as store:
            cp.write_text(checkpoint(store, SigningKey.generate("example.com/crawl")).note())
    return read_checkpoint_file(cp)


@pytest.fixture(scope="module")
def archive(source: Source) -> tuple[Path, Manifest]:
    out = source.work / "archive"
    return out, export(source.location, out, checkpoint=signed(source))


@pytest.fixture(scope="module")
def restored(source: Source, archive: tuple[Path, Manifest], pg_cluster) -> dict[str, str]:
    """The archive restored into a store directory and into an empty PostgreSQL database."""
    database = new_pg_database(pg_cluster)
    restore(archive[0], source.work / "restored")
    restore(archive[0], database, artifacts=source.work / "restored-payloads")
    assert (source.work / "restored" / "checkpoint").read_bytes() == signed(source).note
    return {"sqlite": str(source.work / "restored"), "postgresql": database}


def archived_payloads(archive: Path) -> set[tuple[str, str, int]]:
    """(namespace, digest, size) of each payload the archive's index lists."""
    held = ArchivePayloads(archive / "artifacts")
    try:
        return {(r.namespace, r.digest, r.size) for r in held.refs()}
    finally:
        held.close()


def test_an_archive_holds_every_payload_its_store_references(
        source: Source, archive: tuple[Path, Manifest]) -> None:
    path, manifest = archive
    assert manifest.gaps == []
    assert manifest.artifacts == len(source.refs)
    assert archived_payloads(path) == source.refs
    held = ArchivePayloads(path / "artifacts")
    for namespace, digest, size in source.refs:  # every payload re-hashes to its name
        held.verify(ArtifactRef(namespace, digest, size))
    held.close()


def test_the_command_compares_a_store_and_its_archive_equal_payloads_re_hashed(
        source: Source, archive: tuple[Path, Manifest],
        capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["compare", source.location, str(archive[0]), "--full", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["equal"] and result["differences"] == []
    assert result["payloads"] == len(source.refs) and result["full"]
    assert result["a"]["payloads_held"] == result["b"]["payloads_held"] == len(source.refs)


@pytest.mark.parametrize("target", TARGETS)
def test_an_archive_restores_into_each_backend_and_exports_the_same_bytes(
        source: Source, archive: tuple[Path, Manifest], restored: dict[str, str],
        target: str) -> None:
    path, manifest = archive
    again = source.work / f"again-{target}"
    remade = export(restored[target], again, checkpoint=signed(source))
    for name in ("dump.sql", "manifest.json", "checkpoint"):
        assert (again / name).read_bytes() == (path / name).read_bytes(), name
    assert (remade.log.tree_size, remade.log.root) == (manifest.log.tree_size, manifest.log.root)
    assert remade.log.verified and remade.gaps == []
    assert archived_payloads(again) == source.refs
    result = compare(source.location, restored[target], full=True)
    assert result.equal, [str(d) for d in result.differences]
    assert result.payloads == result.b.payloads_held == len(source.refs)


def test_the_two_restored_copies_compare_equal_across_backends(
        source: Source, restored: dict[str, str]) -> None:
    result = compare(restored["sqlite"], restored["postgresql"], full=True)
    assert result.equal, [str(d) for d in result.differences]
    assert result.a.payloads_held == result.b.payloads_held == len(source.refs)


def test_a_backup_holds_every_payload_and_exports_the_same_bytes(
        source: Source, archive: tuple[Path, Manifest]) -> None:
    copy = source.work / "backup"
    report = backup(source.location, copy)
    assert report.findings == []
    assert (report.artifacts, report.artifact_bytes) == (
        len(source.refs), sum(size for _ns, _d, size in source.refs))
    export(copy, source.work / "backup-archive", checkpoint=signed(source))
    for name in ("dump.sql", "manifest.json", "checkpoint"):
        assert (source.work / "backup-archive" / name).read_bytes() == \
            (archive[0] / name).read_bytes(), name
    result = compare(source.location, copy, full=True)
    assert result.equal, [str(d) for d in result.differences]


def test_wacz_and_warc_exports_are_the_same_bytes_from_every_backend(
        source: Source, restored: dict[str, str]) -> None:
    """The WARC and the WACZ (its compressed index too, and the checkpoint it carries)
    depend only on the evidence: the source and its restored copies in either backend give
    the same bytes (issues 32, 33)."""
    made: dict[str, tuple[bytes, bytes]] = {}
    for name, location in [("source", source.location), *restored.items()]:
        out = source.work / f"wacz-{name}"
        out.mkdir()
        with Store.open(location, read_only=True) as store:
            wacz = export_wacz(store, out / "x.wacz", checkpoint=signed(source))
            warc = export_warc(store, out / "x.warc.gz")
        assert wacz.revisits == warc.revisits  # (tests/test_revisits.py makes some)
        made[name] = ((out / "x.wacz").read_bytes(), (out / "x.warc.gz").read_bytes())
    assert made["source"] == made["sqlite"] == made["postgresql"]
