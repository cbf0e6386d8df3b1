"""Archives in object storage on the wire: a directory sent to or fetched from ``s3://``.

The archive commands there (``export``, ``backup``, ``restore`` at ``s3://BUCKET/PREFIX``:
``_archive/remote.py``) and a crawl's checkpoints (``_archive/checkpoint.py``) share these
transfers. An archive is built exactly as for a local directory (``export``, ``backup``: a
finished, checked directory in a private temporary directory), then uploaded under the
prefix::

    <prefix>/<file>             one object per file of the archive, at its relative path
    <prefix>/<file>.NNNNN       a file over ``PART_BYTES``: its parts, in order
                                (``TRANSFERS`` files are sent or fetched at once)
    <prefix>/INDEX.json         written last: every file, its size and SHA-256, its parts

Every object is a conditional create (``If-None-Match: *``) carrying its MD5 and SHA-256,
which the server checks (``S3Client.put_if_absent``), so an object is stored whole or not at
all, and nothing is ever written over: a prefix that holds anything is refused before the
build starts, and a put that finds its key taken fails the upload. ``INDEX.json`` is the
completion marker: a prefix without it holds no archive (nothing, or an upload that did not
finish), and ``restore`` refuses it. A reader downloads every file, checks each part and each
file against the index's SHA-256, and only then hands the directory to the local ``restore``
(which checks the manifest's BLAKE3 hashes, counts and Merkle root as for any archive).

Single-file formats (``--format warc``, ``wacz``) are one object at the URL's key, for other
tools to read: written last by construction, absent until whole. One ``PUT`` holds at most
``SINGLE_PUT_BYTES`` (S3's limit; the file is read into memory to send it).

Credentials and endpoint come as for an S3 artifact store (``S3Location.config``: the URL's
options, then ``AWS_*`` variables).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import TypeVar

import msgspec

from .._errors import CorruptStoreError, StoreError
from .._store.s3client import ListedObject, S3Client
from .._store.s3location import S3Location

__all__ = ["INDEX", "PART_BYTES", "SINGLE_PUT_BYTES", "Remote", "RemoteFile", "RemoteIndex",
           "download_tree", "no_archive", "read_index", "upload_tree"]

INDEX = "INDEX.json"
INDEX_VERSION = 1
PART_BYTES = 64 * 1024 * 1024  # a file over this is stored as parts (memory per put)
SINGLE_PUT_BYTES = 5 * 1024**3  # S3's limit for one PUT
TRANSFERS = 4  # files sent or fetched at once
T = TypeVar("T")
_PART_NAME = re.compile(r"\.\d{5}")


class RemoteFile(msgspec.Struct, frozen=True, kw_only=True):
    bytes: int
    sha256: str
    parts: list[str]  # the keys, relative to the prefix, in order


class RemoteIndex(msgspec.Struct, frozen=True, kw_only=True):
    """``INDEX.json``: what an upload holds; its presence says the upload is complete."""

    format_version: int
    kind: str  # export, backup
    files: dict[str, RemoteFile]


class Remote:
    """One prefix of one bucket, with the client that reaches it. ``close`` when done."""

    def __init__(self, url: str, *, environ: Mapping[str, str] | None = None) -> None:
        self.location = S3Location(url)
        self.url = self.location.url
        self.client = S3Client(self.location.config(os.environ if environ is None
                                                    else environ))
        self.base = f"{self.location.prefix}/" if self.location.prefix else ""

    def key(self, name: str) -> str:
        return self.base + name

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> Remote:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def is_empty(self) -> bool:
        return not any(True for _ in _first(self.client.list(self.base)))

    def require_empty(self) -> None:
        """Refuse a prefix holding anything: an archive is never written over, or among,
        other objects (a partial upload included)."""
        if not self.location.prefix:
            raise StoreError(f"{self.url}: give a prefix for the archive, not a whole bucket",
                             hint=f"e.g. {self.url.split('?')[0]}/archives/NAME")
        if not self.is_empty():
            raise StoreError(f"{self.url} already holds objects; an archive is never written "
                             "over another (or over a partial upload)",
                             hint="choose another prefix, or delete what is there first")

    def put_file(self, name: str, path: Path, *, part_bytes: int = PART_BYTES) -> RemoteFile:
        """Upload ``path`` as ``name`` (in parts when larger than ``part_bytes``), each put a
        conditional create with its checksums."""
        size = path.stat().st_size
        whole, parts = hashlib.sha256(), []
        with open(path, "rb") as handle:
            if size <= part_bytes:
                body = handle.read()
                whole.update(body)
                self.put_bytes(name, body)
                parts.append(name)
            else:
                for number in range(-(-size // part_bytes)):
                    body = handle.read(part_bytes)
                    whole.update(body)
                    self.put_bytes(f"{name}.{number:05d}", body)
                    parts.append(f"{name}.{number:05d}")
        return RemoteFile(bytes=size, sha256=whole.hexdigest(), parts=parts)

    def put_bytes(self, name: str, body: bytes) -> None:
        if not self.create(self.key(name), body):
            raise StoreError(f"{self.url}: {name} already exists; an archive is never written "
                             "over", hint="was something else written to this prefix "
                             "meanwhile? choose another prefix")

    def put_bytes_entry(self, name: str, body: bytes) -> RemoteFile:
        """``put_bytes``, described as an index describes a file (one part)."""
        self.put_bytes(name, body)
        return RemoteFile(bytes=len(body), sha256=hashlib.sha256(body).hexdigest(),
                          parts=[name])

    def get_verified(self, entry: RemoteFile, what: str) -> bytes:
        """A small object described by ``entry``, checked against its SHA-256."""
        body = b"".join(self._part(part, what) for part in entry.parts)
        if (len(body), hashlib.sha256(body).hexdigest()) != (entry.bytes, entry.sha256):
            raise CorruptStoreError(f"{self.url}: {what} is not what its manifest says",
                                    hint="the archive in object storage was altered or "
                                    "damaged; use another copy")
        return body

    def _part(self, part: str, what: str) -> bytes:
        body = self.get_bytes(part)
        if body is None:
            raise CorruptStoreError(f"{self.url}: {part} of {what} is missing",
                                    hint="the archive in object storage was altered or "
                                    "damaged; use another copy")
        return body

    def create(self, key: str, body: bytes) -> bool:
        """A conditional create of ``key`` with the body's MD5 and SHA-256 (the server
        checks both): True if created, False if the key was taken."""
        return self.client.put_if_absent(key, body, sha256=hashlib.sha256(body).digest(),
                                         md5=hashlib.md5(body).digest())

    def get_bytes(self, name: str) -> bytes | None:
        return self.client.get(self.key(name))

    def get_file(self, entry: RemoteFile, dest: Path, what: str) -> None:
        """Download ``entry`` into the new file ``dest``, checking its SHA-256. Not
        fsynced: a download is read back by the restore, which makes its own copy durable
        (and fsyncs a database it keeps as it is)."""
        whole = hashlib.sha256()
        dest.parent.mkdir(parents=True, exist_ok=True)
        with open(dest, "xb") as handle:
            for part in entry.parts:
                body = self._part(part, what)
                whole.update(body)
                handle.write(body)
        if (dest.stat().st_size, whole.hexdigest()) != (entry.bytes, entry.sha256):
            raise CorruptStoreError(
                f"{self.url}: {what} is not what the index says ({dest.stat().st_size} bytes, "
                f"sha256 {whole.hexdigest()[:16]}; the index says {entry.bytes} bytes, sha256 "
                f"{entry.sha256[:16]})", hint="the archive in object storage was altered or "
                "damaged; use another copy")


def _first(items: Iterator[ListedObject | str]) -> Iterator[ListedObject | str]:
    for item in items:
        yield item
        return


# --- directories -------------------------------------------------------------------------

def upload_tree(remote: Remote, directory: Path, kind: str, *,
                last: tuple[str, ...] = ("manifest.json", "backup.json")) -> RemoteIndex:
    """Upload every file under ``directory`` (the names in ``last`` after the others), then
    ``INDEX.json``: the prefix holds a complete archive only once the index is there."""
    names = sorted(str(PurePosixPath(*p.relative_to(directory).parts))
                   for p in directory.rglob("*") if p.is_file())
    for name in names:
        if name == INDEX or _PART_NAME.fullmatch(PurePosixPath(name).suffix):
            raise StoreError(f"{directory}/{name}: a name the upload reserves")
    first, then = ([n for n in names if (n in last) is later] for later in (False, True))
    files: dict[str, RemoteFile] = {}
    for group in (first, then):  # the manifest only once every other file is stored
        files.update(_each(group, lambda name: remote.put_file(name, directory / name)))
    index = RemoteIndex(format_version=INDEX_VERSION, kind=kind, files=files)
    remote.put_bytes(INDEX, msgspec.json.format(msgspec.json.encode(index), indent=2) + b"\n")
    return index


def read_index(remote: Remote) -> RemoteIndex | None:
    """The prefix's index, or None when it has none (no archive, or an unfinished one)."""
    body = remote.get_bytes(INDEX)
    if body is None:
        return None
    try:
        index = msgspec.json.decode(body, type=RemoteIndex)
    except msgspec.DecodeError as exc:
        raise CorruptStoreError(f"{remote.url}/{INDEX}: unreadable ({exc})",
                                hint="the archive in object storage was altered or "
                                "damaged") from exc
    if index.format_version != INDEX_VERSION:
        raise StoreError(f"{remote.url}: upload index format {index.format_version}, this "
                         f"program reads format {INDEX_VERSION}", hint="use a matching evidence")
    for name in index.files:
        if name.startswith("/") or ".." in PurePosixPath(name).parts:
            raise CorruptStoreError(f"{remote.url}/{INDEX} names {name!r}, outside the "
                                    "archive", hint="the index was altered; use another copy")
    return index


def no_archive(remote: Remote) -> StoreError:
    """What a reader says of a prefix with no complete archive."""
    if remote.is_empty():
        return StoreError(f"{remote.url}: no archive here (the prefix holds nothing)",
                          hint="check the bucket and prefix (and the endpoint)")
    return StoreError(f"{remote.url}: no complete archive here ({INDEX} is missing: the upload "
                      "did not finish, or this is not an archive)",
                      hint="restore from a complete archive or checkpoint; an unfinished "
                      "upload can be deleted")


def download_tree(remote: Remote, into: Path, index: RemoteIndex) -> None:
    """Every file of ``index`` into the directory ``into``, each checked as it comes."""
    _each(list(index.files), lambda name: remote.get_file(index.files[name], into / name,
                                                           name))


def _each(names: list[str], transfer: Callable[[str], T]) -> dict[str, T]:
    """``transfer`` of each name, ``TRANSFERS`` at a time (the client is thread-safe; a
    part is at most ``PART_BYTES`` in memory); the first failure is raised."""
    with ThreadPoolExecutor(max_workers=TRANSFERS) as pool:
        return dict(zip(names, pool.map(transfer, names), strict=True))
