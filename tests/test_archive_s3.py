"""Archives in object storage (issue 29): export in every format, backup and restore at
``s3://BUCKET/PREFIX``, with the payload store's guarantees: conditional creates with
checksums, never written over, never half-visible (the index or the object itself last),
and a restore that checks every file and refuses anything incomplete or altered.

Real SeaweedFS (the session's server), real stores written through the real writer.
"""

from __future__ import annotations

import gzip
import os
import zipfile
from pathlib import Path

import pytest

from evidence import CorruptStoreError, Store, StoreError, verify
from evidence._archive.archive import compare
from evidence._archive.checkpoint import backup_to_s3
from evidence._archive.export import export
from evidence._archive.remote import INDEX, Remote, export_to, read_index, restore_from
from evidence._cli.main import main
from evidence.testing.seaweed import SeaweedS3

from .conftest import new_s3_url


@pytest.fixture
def s3_env(seaweed: SeaweedS3, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    for name, value in seaweed.environ.items():
        monkeypatch.setenv(name, value)
    return dict(os.environ)


def _objects(remote: Remote) -> dict[str, int]:
    return {item.key[len(remote.base):]: item.size for item in remote.client.list(remote.base)
            if not isinstance(item, str)}


def test_an_export_in_s3_restores_to_the_same_store_and_is_never_written_over(
        tmp_path: Path, populated_store: Store, seaweed: SeaweedS3, s3_env: dict[str, str],
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    url = new_s3_url(seaweed, "export")
    manifest = export_to(populated_store, url)
    with Remote(url) as remote:
        index = read_index(remote)
        objects = _objects(remote)
    assert index is not None and index.kind == "export"
    assert set(objects) == {INDEX, *index.files}
    assert "dump.sql" in index.files and "manifest.json" in index.files
    assert manifest.artifacts and {n for n in index.files if n.startswith("artifacts/")} == {
        "artifacts/index.tsv", "artifacts/segment-000000"}
    report = restore_from(url, tmp_path / "restored")
    assert "files' size and SHA-256" in report.checks[-1]
    with Store.open(tmp_path / "restored") as restored:
        assert verify(restored, full=True).ok
    assert compare(populated_store, tmp_path / "restored").equal
    # compare reads the archive in S3 too
    monkeypatch.chdir(tmp_path)
    assert main(["compare", url, str(tmp_path / "restored")]) == 0
    assert f"a  archive {url}  (store {populated_store.store_id}" in capsys.readouterr().out
    # A second export to the same prefix is refused before anything is built or sent.
    assert main(["export", str(populated_store.path), "--out", url]) == 2
    err = capsys.readouterr().err
    assert "already holds objects" in err and "Try: " in err
    with Remote(url) as remote:
        assert _objects(remote) == objects
    assert sorted(p.name for p in tmp_path.iterdir()) == ["restored", "store"]


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_a_review_export_in_s3_is_the_local_one_file_for_file(
        tmp_path: Path, populated_store: Store, seaweed: SeaweedS3, s3_env: dict[str, str],
        fmt: str) -> None:
    url = new_s3_url(seaweed, fmt)
    export_to(populated_store, url, format=fmt)  # type: ignore[arg-type]
    export(populated_store, tmp_path / "local", format=fmt)  # type: ignore[arg-type]
    local = {str(p.relative_to(tmp_path / "local")): p.read_bytes()
             for p in (tmp_path / "local").rglob("*") if p.is_file()}
    with Remote(url) as remote:
        index = read_index(remote)
        assert index is not None and set(index.files) == set(local)
        for name, body in local.items():
            assert remote.get_bytes(name) == body, name
    with pytest.raises(StoreError, match="for review tools only"):
        restore_from(url, tmp_path / "r")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(("fmt", "name"), [("warc", "crawl.warc.gz"), ("wacz", "c.wacz")])
def test_a_single_file_export_is_one_object_created_once(
        tmp_path: Path, populated_store: Store, seaweed: SeaweedS3, s3_env: dict[str, str],
        fmt: str, name: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    url = new_s3_url(seaweed, fmt).replace("?", f"/{name}?")
    store = str(populated_store.path)
    assert main(["export", store, "--format", fmt, "--out", url]) == 0
    out = capsys.readouterr().out
    assert url.split("?")[0] in out
    with Remote(url) as remote:
        body = remote.client.get(remote.location.prefix)
    assert body is not None
    if fmt == "warc":
        assert gzip.decompress(body).startswith(b"WARC/1.1\r\n")
    else:
        (tmp_path / "got.wacz").write_bytes(body)
        assert "datapackage.json" in zipfile.ZipFile(tmp_path / "got.wacz").namelist()
    assert main(["export", store, "--format", fmt, "--out", url]) == 2
    assert "already exists" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["store"] + (["got.wacz"] if fmt == "wacz" else []))


def test_restore_refuses_an_unfinished_or_altered_upload_and_creates_nothing(
        tmp_path: Path, populated_store: Store, seaweed: SeaweedS3,
        s3_env: dict[str, str]) -> None:
    url = new_s3_url(seaweed, "altered")
    export_to(populated_store, url)
    with Remote(url) as remote:
        index = remote.get_bytes(INDEX)
        assert index is not None
        dump = remote.get_bytes("dump.sql")
        assert dump is not None
        # Altered: the dump replaced by other bytes (a new object of the same key).
        remote.client.delete(remote.key("dump.sql"))
        remote.put_bytes("dump.sql", dump.replace(b"INSERT", b"insert", 1))
        with pytest.raises(CorruptStoreError, match="dump.sql is not what the index says"):
            restore_from(url, tmp_path / "a")
        # Unfinished: no index (an upload killed before its last object).
        remote.client.delete(remote.key(INDEX))
        with pytest.raises(StoreError, match="no complete archive here"):
            restore_from(url, tmp_path / "b")
    assert list(tmp_path.iterdir()) == [tmp_path / "store"]


def test_a_backup_in_s3_is_a_verified_checkpoint_that_restores_into_a_new_store(
        tmp_path: Path, populated_store: Store, seaweed: SeaweedS3,
        s3_env: dict[str, str]) -> None:
    url = new_s3_url(seaweed, "backup")
    taken = backup_to_s3(populated_store.path, url)  # type: ignore[arg-type]
    assert taken.findings == [] and taken.uploaded == taken.artifacts > 0
    with pytest.raises(StoreError, match="already holds objects"):
        backup_to_s3(populated_store.path, url)  # type: ignore[arg-type]
    report = restore_from(url, tmp_path / "restored")
    assert report.store_id == populated_store.store_id
    with Store.open(tmp_path / "restored") as restored:
        assert verify(restored, full=True).ok
    assert compare(populated_store, tmp_path / "restored").equal


def test_the_library_refuses_a_location_it_cannot_use_by_its_scheme(
        tmp_path: Path, populated_store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not only the command: ``export_to``, ``backup_to`` and ``restore_from`` never turn an
    http:// or ftp:// location into a local folder named after it."""
    from evidence._archive.remote import backup_to

    monkeypatch.chdir(tmp_path)
    for call in (lambda: export_to(populated_store, "http://host/x"),
                 lambda: backup_to(populated_store, "ftp://host/x"),
                 lambda: restore_from("http://host/x", tmp_path / "new")):
        with pytest.raises(StoreError, match=r"cannot be at a (http|ftp):// URL"):
            call()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]
