"""Where a store's payloads live: its own ``artifacts/`` directory, or an ``s3://`` URL.

The choice is made once, when the store is created (``evidence init STORE --artifacts
s3://bucket/prefix``, or the first ``evidence crawl``), and recorded in ``store_meta``
under ``artifacts`` (the PostgreSQL backend records its payload location under the same
key), so every later command finds the payloads without being told. What is recorded is
the URL with its options (endpoint, region, CA file) and never a credential: those come
from the environment of each process that opens the store (``s3location.S3Location.config``).

Rules, so that no open can quietly look for a store's payloads somewhere they are not:
  - a store recorded with a URL is opened there; an open may name the same bucket and
    prefix with other options (another host reaches the endpoint under another name);
  - a store with no record keeps its payloads in ``artifacts/``: naming a URL for it is
    refused (its payloads would vanish from view), and so is naming another bucket or
    prefix for a recorded one;
  - ``store_meta.artifacts`` says where a deployment keeps things, not what the store
    holds, so the canonical export leaves it out (``LOCAL_META``): a store and a copy of it
    elsewhere export the same bytes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._errors import ArtifactError, StoreError
from .backend import ArtifactBackend
from .fileops import FileOps
from .location import is_s3_url
from .packs import Layout, open_artifact_store

__all__ = ["LOCAL_META", "META_KEY", "choose", "open_artifacts", "record", "recorded"]

META_KEY = "artifacts"
LOCAL_META = (META_KEY,)


def recorded(conn: Any) -> str | None:
    """The location the store records, or None (its own ``artifacts/``)."""
    rows = conn.execute("SELECT value FROM store_meta WHERE key = ?", (META_KEY,)).fetchall()
    return rows[0][0] if rows else None


def is_new(conn: Any) -> bool:
    """Nothing committed yet: the store may still choose where its payloads live."""
    return not conn.execute("SELECT 1 FROM commit_log LIMIT 1").fetchall()


def check_given(given: str, *, environ: Mapping[str, str] | None = None) -> None:
    """Refuse a location that cannot work (not an s3:// URL, a malformed one, no
    credentials, a bucket that is not there) before anything of a store is created."""
    if not is_s3_url(given):
        raise StoreError(f"--artifacts {given!r}: a store directory keeps its payloads in its "
                         "artifacts/; the other place it can keep them is an s3:// URL",
                         hint="give --artifacts s3://BUCKET/PREFIX, or leave it out")
    from .s3client import S3Client  # an S3 store's modules, only for one (~20 ms to import)
    from .s3location import S3Location

    location = S3Location(given)
    client = S3Client(location.config(os.environ if environ is None else environ,
                                      attempts=2))
    try:
        if not client.bucket_exists():
            raise ArtifactError(f"{location.url}: the bucket {location.bucket!r} does not "
                                f"exist at {client.config.endpoint}",
                                hint="create the bucket first (its name is in the s3:// URL)")
    finally:
        client.close()


def choose(recorded_spec: str | None, given: str | None, *, create: bool,
           where: str) -> str | None:
    """The location to open (None: the store's own directory), by the module's rules.
    ``create``: the store is new (nothing committed), so a URL given now is its choice."""
    if given is None:
        return recorded_spec
    if not is_s3_url(given):
        raise StoreError(f"--artifacts {given!r}: a store directory keeps its payloads in its "
                         "artifacts/; the other place it can keep them is an s3:// URL",
                         hint="give --artifacts s3://BUCKET/PREFIX, or leave it out")
    from .s3location import S3Location

    wanted = S3Location(given)
    if recorded_spec is None:
        if not create:
            raise StoreError(f"{where} keeps its payloads in its own artifacts/ directory, "
                             f"not at {wanted.url}",
                             hint="leave out --artifacts for this store")
        return wanted.url
    have = S3Location(recorded_spec) if is_s3_url(recorded_spec) else None
    if have is None or (have.bucket, have.prefix) != (wanted.bucket, wanted.prefix):
        raise StoreError(f"{where} keeps its payloads at {recorded_spec}, not at {wanted.url}",
                         hint="leave out --artifacts (the store knows where they are), or "
                         "name the same bucket and prefix")
    return wanted.url


def record(conn: Any, spec: str, *, begin: str = "BEGIN IMMEDIATE") -> None:
    """Record the store's payload location, once (a later record never changes it)."""
    from .s3location import S3Location

    conn.execute(begin)
    try:
        conn.execute("INSERT INTO store_meta (key, value) VALUES (?, ?) "
                     "ON CONFLICT (key) DO NOTHING", (META_KEY, S3Location(spec).url))
        conn.execute("COMMIT")
    except BaseException:
        if not conn.get_autocommit():
            conn.execute("ROLLBACK")
        raise


def open_artifacts(spec: str | None, *, local: os.PathLike[str] | str, create: bool,
                   read_only: bool, max_payload: int | None = None,
                   file_ops: FileOps | None = None,
                   environ: Mapping[str, str] | None = None, layout: Layout | None = None,
                   store_marker: Path | None = None, hold: bool = False) -> ArtifactBackend:
    """The artifact store at ``spec`` (an s3:// URL), or the directory ``local`` in the
    layout it has (packs, or one file per payload; a new one gets ``layout``, packs by
    default). ``hold``: an object store's puts wait for this process's sync (a store
    whose writer runs here), which seals them into one segment object (``s3puts.py``)."""
    if spec is not None and is_s3_url(spec):
        from .s3 import open_s3

        return open_s3(spec, create=create, read_only=read_only, max_payload=max_payload,
                       environ=environ, hold=hold)
    if read_only:
        return open_artifact_store(Path(local), create=False, read_only=True,
                                   max_payload=max_payload)
    return open_artifact_store(Path(local), file_ops=file_ops, create=create,
                               max_payload=max_payload, layout=layout,
                               store_marker=store_marker)
