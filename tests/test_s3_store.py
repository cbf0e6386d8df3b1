"""A store whose payloads are in an S3-compatible object store (``--artifacts s3://``):
crawls (in one process and with worker processes), verify (a missing or corrupted object
found like a missing or corrupted file), export, reclaim, and the command's refusals."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from evidence import CrawlConfig, Store, reclaim_orphans, verify
from evidence._archive.export import export
from evidence._demo.site import SiteConfig, TestSite
from evidence._model.refs import ArtifactRef
from evidence._store.s3 import S3ArtifactStore
from evidence.testing.seaweed import SeaweedS3

from .conftest import Factory, evidence_in_process, new_s3_url, submit_all
from .test_crawl import assert_links_recorded, crawl, done_pages


@pytest.fixture
def s3_env(seaweed: SeaweedS3, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The credentials in this process's environment (as a deployment sets them)."""
    for name, value in seaweed.environ.items():
        monkeypatch.setenv(name, value)
    return dict(os.environ)


def _evidence(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "evidence", *args], capture_output=True,
                          text=True, env=env, timeout=300)


def test_a_crawl_puts_every_payload_in_the_bucket_and_verifies(
        tmp_path: Path, seaweed: SeaweedS3, s3_env: dict[str, str]) -> None:
    url = new_s3_url(seaweed, "crawl")
    with Store.create(tmp_path / "s", artifacts=url) as store:
        assert isinstance(store.artifacts, S3ArtifactStore)
    with TestSite(SiteConfig(pages=25)) as site:
        result = crawl(tmp_path / "s", CrawlConfig(seeds=[site.url]), workers=4)
        reachable = site.reachable_pages()
    assert result.outcome == "completed"
    assert set(done_pages(tmp_path / "s")) == reachable
    assert_links_recorded(tmp_path / "s", site)
    assert not any((tmp_path / "s" / "artifacts").rglob("*/*")), "nothing on local disk"
    with Store.open(tmp_path / "s", read_only=True) as store:
        rows = set(store.connection.execute("SELECT namespace, digest, size FROM artifact"))
        objects = {(r.namespace, r.digest, r.size) for r in store.artifacts.iter_refs()}
        assert rows and rows == objects
        report = verify(store, full=True)
    assert report.ok, report.findings


def test_verify_reports_a_missing_and_a_corrupted_object_like_a_file(
        tmp_path: Path, seaweed: SeaweedS3, s3_env: dict[str, str]) -> None:
    store_path = tmp_path / "s"
    with TestSite(SiteConfig(pages=6)) as site:
        created = evidence_in_process("init", store_path, "--artifacts", new_s3_url(seaweed))
        assert created.returncode == 0, created.stderr
        assert "payloads at s3://" in created.stdout
        ran = _evidence("crawl", site.url, "--store", str(store_path), "--workers", "2",
                        env=s3_env)
        assert ran.returncode == 0, ran.stderr
    ok = evidence_in_process("verify", store_path, "--full", "--json")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    with Store.open(store_path, read_only=True) as store:
        s3 = store.artifacts
        assert isinstance(s3, S3ArtifactStore)
        gone, bad = sorted(s3.iter_refs(), key=lambda r: r.digest)[:2]
        _damage_segment_byte(s3, bad)  # the same size, other bytes: only a re-hash finds it
        s3.refresh()
        s3.remove(gone)  # its segment rewritten without it (as reclaim does)
    quick = evidence_in_process("verify", store_path, "--json")
    full = evidence_in_process("verify", store_path, "--full", "--json")
    assert quick.returncode == 1 and full.returncode == 1
    kinds = {f["kind"]: f for f in json.loads(full.stdout)["findings"]}
    missing, corrupt = (json.dumps(kinds[k]) for k in ("artifact_missing", "artifact_corrupt"))
    assert f"s3://{seaweed.bucket}/" in missing and gone.digest in missing
    assert f"s3://{seaweed.bucket}/" in corrupt and bad.digest in corrupt
    quick_kinds = {f["kind"] for f in json.loads(quick.stdout)["findings"]}
    assert "artifact_missing" in quick_kinds and "artifact_corrupt" not in quick_kinds


def _damage_segment_byte(s3: S3ArtifactStore, ref: ArtifactRef) -> None:
    """Flip the first byte of ``ref``'s payload inside its segment object, in place (the
    object keeps its key: damage in the bucket, not a new segment)."""
    s3.refresh()
    found = s3._entry(ref)
    assert found is not None, "the crawl's payloads are in segments"
    segment, entry = found
    data = bytearray(s3.client.get(segment.key) or b"")
    data[entry.offset] ^= 0xFF
    s3.client._send("PUT", segment.key, body=bytes(data), ok=(200,), headers={
        "content-md5": base64.b64encode(hashlib.md5(data).digest()).decode()})


def test_an_s3_store_exports_the_same_bytes_as_a_directory_store_holding_its_copy(
        tmp_path: Path, seaweed: SeaweedS3, s3_env: dict[str, str]) -> None:
    """Where the payloads live is not what the store holds: its export (whose artifacts/
    holds the payloads) and the export of its backup (a store directory) are identical."""
    from evidence._archive.archive import backup

    with TestSite(SiteConfig(pages=8)) as site:
        with Store.create(tmp_path / "s", artifacts=new_s3_url(seaweed)) as store:
            pass
        crawl(tmp_path / "s", CrawlConfig(seeds=[site.url]), workers=2)
    export(tmp_path / "s", tmp_path / "a")
    report = backup(tmp_path / "s", tmp_path / "b")
    assert report.findings == []
    with Store.open(tmp_path / "b", read_only=True) as store:
        assert not isinstance(store.artifacts, S3ArtifactStore)  # a plain directory store
    export(tmp_path / "b", tmp_path / "c")
    for name in ("dump.sql", "manifest.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "c" / name).read_bytes()
    assert "'artifacts'" not in (tmp_path / "a" / "dump.sql").read_text()
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*")
                   if p.is_file())
    assert files == sorted(p.relative_to(tmp_path / "c") for p in
                           (tmp_path / "c").rglob("*") if p.is_file())


def test_reclaim_removes_old_orphan_objects_and_keeps_referenced_ones(
        tmp_path: Path, seaweed: SeaweedS3, s3_env: dict[str, str]) -> None:
    with TestSite(SiteConfig(pages=4)) as site:
        with Store.create(tmp_path / "s", artifacts=new_s3_url(seaweed)):
            pass
        crawl(tmp_path / "s", CrawlConfig(seeds=[site.url]), workers=2)
    with Store.open(tmp_path / "s") as store:
        orphan = store.artifacts.put("body", b"put, then the crawler died before its commit")
        referenced = len(store.connection.execute("SELECT 1 FROM artifact").fetchall())
        young = reclaim_orphans(store, 3600.0)
        assert young.removed == [] and young.kept_young == 1
        report = reclaim_orphans(store, 0.0)
        assert report.removed == [store.artifacts.location(orphan)]
        assert report.bytes_freed == orphan.size
        assert not store.artifacts.exists(orphan)
        assert len(list(store.artifacts.iter_refs())) == referenced
        assert verify(store, full=True).ok


def test_worker_processes_put_into_the_bucket_with_their_own_credentials(
        tmp_path: Path, seaweed: SeaweedS3, s3_env: dict[str, str]) -> None:
    with TestSite(SiteConfig(pages=20)) as site:
        with Store.create(tmp_path / "s", artifacts=new_s3_url(seaweed)):
            pass
        result = crawl(tmp_path / "s", CrawlConfig(seeds=[site.url]), workers=4,
                       processes=2)
        reachable = site.reachable_pages()
    assert result.outcome == "completed"
    assert set(done_pages(tmp_path / "s")) == reachable
    with Store.open(tmp_path / "s", read_only=True) as store:
        assert verify(store, full=True).ok


@pytest.mark.parametrize("case", ["local store", "other prefix", "no credentials",
                                  "bad url", "not s3"])
def test_artifact_locations_that_cannot_be_right_are_refused_and_change_nothing(
        tmp_path: Path, seaweed: SeaweedS3, s3_env: dict[str, str], case: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    store_path = tmp_path / "s"
    if case == "local store":  # its payloads are in its artifacts/: a URL would hide them
        with Store.create(store_path) as store:  # not new: one committed batch
            submit_all(store, [Factory(store).session()])
        args = ["init", str(store_path), "--artifacts", new_s3_url(seaweed)]
    elif case == "other prefix":
        first = evidence_in_process("init", store_path, "--artifacts", new_s3_url(seaweed))
        assert first.returncode == 0, first.stderr
        args = ["init", str(store_path), "--artifacts", new_s3_url(seaweed)]
    elif case == "no credentials":
        monkeypatch.delenv("AWS_ACCESS_KEY_ID")
        args = ["init", str(store_path), "--artifacts", new_s3_url(seaweed)]
    elif case == "bad url":
        args = ["init", str(store_path), "--artifacts", "s3://No_Such Bucket/x"]
    else:
        args = ["init", str(store_path), "--artifacts", str(tmp_path / "elsewhere")]
    before = sorted(p for p in tmp_path.rglob("*"))
    meta_before = _meta(store_path)
    result = evidence_in_process(*args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("Error: ") and lines[1].startswith("Try: "), result.stderr
    assert "Traceback" not in result.stderr
    if case in ("bad url", "not s3", "no credentials"):
        assert sorted(p for p in tmp_path.rglob("*")) == before or not store_path.exists() \
            or _meta(store_path) == meta_before
    else:
        assert _meta(store_path) == meta_before


def _meta(store_path: Path) -> dict[str, str]:
    if not (store_path / "evidence.db").exists():
        return {}
    with Store.open(store_path, read_only=True) as store:
        return dict(store.connection.execute("SELECT key, value FROM store_meta"))
