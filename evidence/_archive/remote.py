"""The archive commands at either kind of location: a local directory, or ``s3://``.

``export``, ``backup`` and ``restore`` take a directory or an ``s3://BUCKET/PREFIX``; an
archive in object storage is built (or fetched and checked) in a private temporary
directory and sent (or received) by ``_archive/transfer.py``, which also says how it is
laid out there. A backup to ``s3://`` is one checkpoint (``_archive/checkpoint.py``), and a
restore from there takes an export, or else the newest complete checkpoint. Single-file
formats (``--format warc``, ``wacz``) are one object at the URL's key
(``object_destination``). Any other URL is refused by its scheme.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Literal

import msgspec

from .._errors import StoreError
from .._store.location import is_s3_url
from .archive import BackupReport, RestoreReport, backup, restore
from .carried import Carried
from .export import Manifest, export
from .snapshot import Progress, Source
from .transfer import (
    INDEX,
    SINGLE_PUT_BYTES,
    Remote,
    download_tree,
    no_archive,
    read_index,
    upload_tree,
)

if TYPE_CHECKING:
    from .checkpoint import Checkpoint, RestoredCheckpoint

# INDEX, Remote and read_index are transfer's, named here too (what the tests and scripts
# of archives in object storage read).
__all__ = ["INDEX", "Remote", "backup_to", "export_to", "fetched_archive",
           "object_destination", "read_index", "restore_from"]


@contextlib.contextmanager
def fetched_archive(url: str, *, scratch: os.PathLike[str] | str | None = None,
                    kinds: tuple[str, ...] = ("export",)) -> Iterator[tuple[Path, str]]:
    """An archive in object storage, downloaded and checked into a temporary directory:
    (the directory, its kind). Refuses a prefix without a complete upload."""
    with Remote(url) as remote:
        index = read_index(remote)
        if index is None:
            raise no_archive(remote)
        if index.kind not in kinds:
            raise StoreError(f"{remote.url} holds a {index.kind}, not "
                             f"{' or '.join(kinds)}", hint="see docs/archives.md, "
                             "'Archives in object storage'")
        with tempfile.TemporaryDirectory(prefix="evidence-fetch-", dir=scratch) as tmp:
            root = Path(tmp) / "archive"
            root.mkdir()
            download_tree(remote, root, index)
            yield root, index.kind


# --- single files (warc, wacz) -------------------------------------------------------------

@contextlib.contextmanager
def object_destination(url: str) -> Iterator[Path]:
    """A local file to write, uploaded as the object ``url`` names once the block ends
    without error. The key must be free before anything is built."""
    remote = Remote(url)
    try:
        key = remote.location.prefix
        if not key:
            raise StoreError(f"{remote.url}: name the object, not a whole bucket",
                             hint=f"e.g. {remote.url.split('?')[0]}/crawl.warc.gz")
        if remote.client.head(key) is not None:
            raise StoreError(f"{remote.url} already exists; an export never overwrites an "
                             "object", hint="choose another name")
        with tempfile.TemporaryDirectory(prefix="evidence-export-") as tmp:
            path = Path(tmp) / PurePosixPath(key).name
            yield path
            size = path.stat().st_size
            if size > SINGLE_PUT_BYTES:
                raise StoreError(f"{path.name} is {size} bytes; one object is sent in one PUT "
                                 f"of at most {SINGLE_PUT_BYTES} bytes",
                                 hint="export to a local file and upload it with a "
                                 "multipart tool")
            if not remote.create(key, path.read_bytes()):
                raise StoreError(f"{remote.url} was created by someone else meanwhile; an "
                                 "export never overwrites an object",
                                 hint="choose another name")
    finally:
        remote.close()


# --- the archive commands, at either kind of location ------------------------------------

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")


def _here_or_s3(location: os.PathLike[str] | str, what: str) -> bool:
    """True for an ``s3://`` URL, False for a local path; any other URL is refused by its
    scheme (it would otherwise become a local folder named after it)."""
    if is_s3_url(location):
        return True
    scheme = _SCHEME.match(str(location))
    if scheme is not None:
        raise StoreError(f"{location}: {what} cannot be at a {scheme[1]}:// URL",
                         hint="give a local directory, or s3://BUCKET/PREFIX")
    return False


def backup_to(source: Source, out: os.PathLike[str] | str, *,
              progress: Progress | None = None) -> BackupReport | Checkpoint:
    """``backup`` to a new directory, or to an empty ``s3://`` prefix (one verified
    checkpoint there: ``_archive/checkpoint.py``)."""
    if not _here_or_s3(out, "a backup"):
        return backup(source, out, progress=progress)
    from .checkpoint import backup_to_s3

    return backup_to_s3(source, str(out), progress=progress)


def export_to(source: Source, out: os.PathLike[str] | str, *, run_id: str | None = None,
              format: Literal["sql", "jsonl", "csv"] = "sql",
              progress: Progress | None = None, checkpoint: Carried | None = None,
              include_secrets: bool = False) -> Manifest:
    """``export`` to a new directory, or to an empty ``s3://`` prefix (built in a temporary
    directory, then uploaded, ``INDEX.json`` last)."""
    if not _here_or_s3(out, "an archive"):
        return export(source, out, run_id=run_id, format=format, progress=progress,
                      checkpoint=checkpoint, include_secrets=include_secrets)
    with Remote(str(out)) as remote:
        remote.require_empty()
        with tempfile.TemporaryDirectory(prefix="evidence-export-") as tmp:
            built = Path(tmp) / "archive"
            manifest = export(source, built, run_id=run_id, format=format, progress=progress,
                              checkpoint=checkpoint,
                              include_secrets=include_secrets)
            upload_tree(remote, built, "export")
    return manifest


def restore_from(archive: os.PathLike[str] | str, store_path: os.PathLike[str] | str, *,
                 artifacts: os.PathLike[str] | str | None = None,
                 checkpoint_id: str | None = None,
                 progress: Progress | None = None) -> RestoreReport | RestoredCheckpoint:
    """``restore`` from a local archive, or from ``s3://``: an export there (downloaded,
    checked against its index, then restored as a local one), else the newest complete
    checkpoint (or ``checkpoint_id``) of a crawl or a backup."""
    if not _here_or_s3(archive, "an archive"):
        if checkpoint_id is not None:
            raise StoreError("--checkpoint picks a checkpoint in object storage",
                             hint="leave it out for a local archive")
        return restore(archive, store_path, artifacts=artifacts, progress=progress)
    from .checkpoint import restore_checkpoint

    with Remote(str(archive)) as remote:
        index = read_index(remote)
    if index is None:
        if artifacts is not None:
            raise StoreError("--artifacts is for a restore into PostgreSQL; a checkpoint "
                             "restores into a store directory", hint="leave out --artifacts")
        return restore_checkpoint(str(archive), store_path, checkpoint_id=checkpoint_id,
                                  progress=progress)
    if checkpoint_id is not None:
        raise StoreError(f"{archive} holds an export, not checkpoints",
                         hint="leave out --checkpoint")
    with fetched_archive(str(archive)) as (local, _kind):
        report = restore(local, store_path, artifacts=artifacts, progress=progress)
    return msgspec.structs.replace(report, checks=[
        *report.checks, f"{len(index.files)} files' size and SHA-256 against {INDEX}"])
