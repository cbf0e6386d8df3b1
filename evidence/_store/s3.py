"""Artifacts in an S3-compatible object store: ``--artifacts s3://bucket/prefix``.

This module owns everything under the store's prefix in the bucket::

    <prefix>/LAYOUT                  "evidence-s3-artifacts 1": the layout below
    <prefix>/<namespace>/<digest>    one immutable object per payload (layout 1)

Upper-case names cannot be namespaces (``[a-z0-9_-]``), so ``LAYOUT`` and any later
upper-case name (sealed pack segments, say, as ``<prefix>/PACKS/<segment>``, each one
immutable object read by range: ``S3Client.get(start=, end=)``) can never collide with a
payload. A layout this program does not know is refused, as for a store directory.

The durability point is the put's answer. A put is one ``PUT`` with ``If-None-Match: *``
(a conditional create) carrying the body's MD5 and SHA-256, which the server recomputes and
refuses on a mismatch (``s3client``); its 200 means the object is stored whole, so ``put``
returns the ref only then, and ``sync`` has nothing left to do. A 412 means the key exists:
a racing put of the same digest, an earlier try of this put whose answer was lost, or an
older copy. The put then reads what is there (HEAD: size and ETag, the MD5 of a single-part
object) and returns the ref only if it is the same content; an object of the same key with
other bytes is damaged, and is replaced (``If-Match`` on its ETag, so a concurrent repair
is not undone). A put waits out an outage of the object store (``s3client``: retried until
``EVIDENCE_S3_OUTAGE_DEADLINE``), so a crawl pauses on it; a put that fails even so
raises, and no message names its ref: the writer checks every new reference with a HEAD
(``check``) before the COMMIT that records it, so a reference never names an object that
is not there (design rule 6).

Reclaim's grace period reads ``age`` from the object's Last-Modified. A put that finds its
object already there and older than ``_TOUCH_AFTER`` refreshes that time with a copy of the
object onto itself, conditional on its ETag (the same bytes; S3 has no touch), so an orphan
that is about to be referenced again counts as young, as a file put again does.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import logging
import os
import re
import time
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, BinaryIO

import blake3

from .._errors import (
    ArtifactCorruptError,
    ArtifactError,
    ArtifactMissingError,
    PayloadTooLargeError,
)
from .._model.refs import DIGEST_RE, NAMESPACE_RE, ArtifactRef, validate_digest, validate_namespace
from .artifacts import Removal, SingleRemoval, check_one_by_one
from .location import is_s3_url
from .s3client import (
    DEFAULT_OUTAGE_DEADLINE,
    HeadResult,
    ListedObject,
    Outage,
    S3Client,
    S3Config,
    S3Error,
)

__all__ = ["OUTAGE_DEADLINE_ENV", "S3ArtifactStore", "S3Location", "is_s3_url"]

log = logging.getLogger("evidence.s3")

DEFAULT_MAX_PAYLOAD = 256 * 1024 * 1024
_CHUNK = 1024 * 1024
_LAYOUT_KEY = "LAYOUT"
_LAYOUTS = {"evidence-s3-artifacts 1\n": 1}
LAYOUT = 1
_TOUCH_AFTER = 60.0  # seconds: a put finding an older object refreshes its time
_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_PREFIX_RE = re.compile(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*")
_PARAMS = ("endpoint", "region", "ca")
OUTAGE_DEADLINE_ENV = "EVIDENCE_S3_OUTAGE_DEADLINE"  # seconds (S3Config.outage_deadline)


class S3Location:
    """A parsed ``s3://bucket[/prefix][?endpoint=URL&region=NAME&ca=FILE]``.

    The query parameters are the options that say where the objects are; credentials never
    go in the URL (it is recorded in the store): they come from the environment.
    """

    def __init__(self, url: str) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "s3":
            raise ArtifactError(f"{url!r} is not an s3:// URL",
                                hint="give --artifacts s3://BUCKET/PREFIX")
        if "@" in parts.netloc:
            raise ArtifactError("an s3:// URL must not hold credentials (it is recorded in "
                                "the store)", hint="set AWS_ACCESS_KEY_ID and "
                                "AWS_SECRET_ACCESS_KEY in the environment instead")
        bucket, prefix = parts.netloc, parts.path.strip("/")
        if not _BUCKET_RE.fullmatch(bucket):
            raise ArtifactError(f"{url!r}: {bucket!r} is not a valid bucket name",
                                hint="a bucket name is 3-63 characters of a-z, 0-9, '.', '-'")
        if prefix and not _PREFIX_RE.fullmatch(prefix):
            raise ArtifactError(f"{url!r}: the prefix {prefix!r} may hold only letters, "
                                "digits, '.', '_', '-' and single '/'",
                                hint="choose a simpler prefix, e.g. s3://bucket/crawls/site")
        params = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
        unknown = sorted(set(params) - set(_PARAMS))
        if unknown:
            raise ArtifactError(f"s3://{bucket}/{prefix}: unknown option {unknown[0]!r} (the "
                                "URL's options are not shown: one may hold a secret)",
                                hint="the options are endpoint=URL, region=NAME, ca=FILE")
        endpoint = params.get("endpoint")
        if endpoint is not None and not endpoint.startswith(("http://", "https://")):
            raise ArtifactError(f"{url!r}: endpoint {endpoint!r} is not an http(s) URL",
                                hint="e.g. endpoint=https://s3.eu-west-1.amazonaws.com")
        self.bucket, self.prefix, self.params = bucket, prefix, params

    @property
    def url(self) -> str:
        """The canonical form (what the store records): no credentials, options sorted."""
        query = urllib.parse.urlencode(sorted(self.params.items()), safe=":/")
        path = f"/{self.prefix}" if self.prefix else ""
        return f"s3://{self.bucket}{path}" + (f"?{query}" if query else "")

    def config(self, environ: Mapping[str, str], **options: Any) -> S3Config:
        """The client's configuration: the URL's options first, then the usual AWS_*
        variables of ``environ`` (read only here, when the user names an s3:// store), and
        ``EVIDENCE_S3_OUTAGE_DEADLINE``: how long a request rides through an outage. That
        one is not a URL option: it is how patient this process is, not where the objects
        are, and the URL is recorded in the store."""
        endpoint = (self.params.get("endpoint") or environ.get("AWS_ENDPOINT_URL_S3")
                    or environ.get("AWS_ENDPOINT_URL"))
        if not endpoint:
            raise ArtifactError(
                f"{self.url}: no S3 endpoint is given",
                hint="set AWS_ENDPOINT_URL (e.g. https://s3.eu-west-1.amazonaws.com), or add "
                "?endpoint=URL to the s3:// URL")
        access, secret = environ.get("AWS_ACCESS_KEY_ID"), environ.get("AWS_SECRET_ACCESS_KEY")
        if not access or not secret:
            raise ArtifactError(f"{self.url}: no S3 credentials in the environment",
                                hint="set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
        region = (self.params.get("region") or environ.get("AWS_REGION")
                  or environ.get("AWS_DEFAULT_REGION") or "us-east-1")
        if OUTAGE_DEADLINE_ENV in environ and "outage_deadline" not in options:
            options["outage_deadline"] = _outage_deadline(environ[OUTAGE_DEADLINE_ENV])
        return S3Config(endpoint=endpoint.rstrip("/"), bucket=self.bucket, region=region,
                        access_key=access, secret_key=secret,
                        session_token=environ.get("AWS_SESSION_TOKEN", ""),
                        ca_file=self.params.get("ca") or environ.get("AWS_CA_BUNDLE") or None,
                        **options)


def _outage_deadline(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise ArtifactError(f"{OUTAGE_DEADLINE_ENV}={text!r} is not a number of seconds",
                            hint=f"set it to how long a request to the object store may keep "
                            f"retrying an outage, e.g. {OUTAGE_DEADLINE_ENV}=300 (default "
                            f"{DEFAULT_OUTAGE_DEADLINE:g}; 0: no retry)")
    return value


def _digests(data: bytes | Iterable[bytes] | BinaryIO, limit: int,
             namespace: str) -> tuple[bytes, str]:
    """The whole payload (an S3 put sends one body) and its BLAKE3 hex digest; refused at
    the first byte over ``limit``, before anything is sent."""
    if isinstance(data, str):
        raise TypeError("put() takes bytes, an iterable of bytes or a binary file, not str")
    if isinstance(data, bytes | bytearray | memoryview):
        body = bytes(data)
        if len(body) > limit:
            raise _too_large(namespace, len(body), limit)
        return body, blake3.blake3(body, max_threads=1).hexdigest()
    buffer = bytearray()
    chunks: Iterable[object]
    if hasattr(data, "read"):
        stream = data
        chunks = iter(lambda: stream.read(_CHUNK), b"")
    else:
        chunks = data
    for chunk in chunks:
        if chunk is None:
            raise ArtifactError("put() was given a non-blocking stream that returned None")
        try:
            view = memoryview(chunk).cast("B")  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(f"payload chunks must be bytes-like, not "
                            f"{type(chunk).__name__}") from None
        if len(buffer) + len(view) > limit:
            raise _too_large(namespace, len(buffer) + len(view), limit)
        buffer += view
    body = bytes(buffer)
    return body, blake3.blake3(body).hexdigest()


def _too_large(namespace: str, size: int, limit: int) -> PayloadTooLargeError:
    return PayloadTooLargeError(
        f"payload for namespace {namespace!r} exceeds the limit of {limit} bytes ({size} "
        "bytes seen so far)",
        hint="raise max_payload, or store a truncated body and record that it was truncated",
        namespace=namespace, size=size, limit=limit)


class S3ArtifactStore:
    """Content-addressed payloads as objects under one prefix of one bucket.

    Thread-safe. ``create``: record the layout if the prefix has none (a new store);
    else the layout must be there. ``read_only``: every put refuses.
    """

    local = False  # every call is a request to the object store

    def __init__(self, location: S3Location | str, config: S3Config, *,
                 max_payload: int = DEFAULT_MAX_PAYLOAD, create: bool = True,
                 read_only: bool = False) -> None:
        if type(max_payload) is not int or max_payload < 0:
            raise ValueError(f"max_payload must be a non-negative int, not {max_payload!r}")
        self.location_ = location if isinstance(location, S3Location) else S3Location(location)
        self.url = self.location_.url
        self.max_payload = max_payload
        self.read_only = read_only
        self.client = S3Client(config)
        self._base = f"{self.location_.prefix}/" if self.location_.prefix else ""
        try:
            self.layout = self._open_layout(create=create and not read_only)
        except BaseException:
            self.client.close()
            raise

    def close(self) -> None:
        self.client.close()

    def __del__(self) -> None:  # a store dropped unclosed still releases its sockets
        client = getattr(self, "client", None)
        if client is not None:
            client.close()

    def __repr__(self) -> str:
        return f"S3ArtifactStore({self.url!r})"

    def outage(self) -> Outage | None:
        """The object store's outage under way (requests waiting on it), if any."""
        return self.client.outage()

    @property
    def root(self) -> str:
        """What a worker process is told to open: the URL (without credentials)."""
        return self.url

    # --- keys ----------------------------------------------------------------------------

    def key(self, ref_or_namespace: ArtifactRef | str, digest: str | None = None) -> str:
        """The object key of a ref (validated: no input can name another key)."""
        if isinstance(ref_or_namespace, ArtifactRef):
            namespace, digest = ref_or_namespace.namespace, ref_or_namespace.digest
        else:
            namespace = ref_or_namespace
        if digest is None:
            raise TypeError("key(namespace) needs a digest")
        validate_namespace(namespace)
        validate_digest(digest)
        return f"{self._base}{namespace}/{digest}"

    def location(self, ref: ArtifactRef) -> str:
        """The object's URL, for findings and errors."""
        return f"s3://{self.location_.bucket}/{self.key(ref)}"

    def _open_layout(self, *, create: bool) -> int:
        key = self._base + _LAYOUT_KEY
        text = self.client.get(key)
        if text is None:
            if not self.client.bucket_exists():
                raise ArtifactError(
                    f"{self.url}: the bucket {self.location_.bucket!r} does not exist at "
                    f"{self.client.config.endpoint}",
                    hint="create the bucket first (its name is in the s3:// URL)")
            if not create:
                if self._has_objects():
                    raise ArtifactError(f"{self.url}: objects but no LAYOUT under the prefix",
                                        hint="check the s3:// URL's prefix")
                return LAYOUT  # empty: nothing to read in any layout
            body = f"evidence-s3-artifacts {LAYOUT}\n".encode("ascii")
            self.client.put_if_absent(key, body, sha256=hashlib.sha256(body).digest(),
                                      md5=hashlib.md5(body).digest())
            text = self.client.get(key)  # ours, or a concurrent creator's (the same text)
        layout = _LAYOUTS.get((text or b"").decode("ascii", "replace"))
        if layout is None:
            raise ArtifactError(
                f"{self.url} has layout {(text or b'').decode('ascii', 'replace')[:40]!r}, "
                "which this version of evidence does not know",
                hint="the store was written by a newer version of evidence: use that version")
        return layout

    def _has_objects(self) -> bool:
        return any(True for _ in self.client.list(self._base, delimiter="/"))

    # --- writing -------------------------------------------------------------------------

    def put(self, namespace: str, data: bytes | Iterable[bytes] | BinaryIO) -> ArtifactRef:
        """Store ``data``; return its ref once the object store has it (durable)."""
        validate_namespace(namespace)
        if self.read_only:
            raise ArtifactError(f"artifact store {self.url} was opened read-only",
                                hint="open the store for writing to store payloads")
        body, digest = _digests(data, self.max_payload, namespace)
        ref = ArtifactRef(namespace, digest, len(body))
        key = self.key(ref)
        md5 = hashlib.md5(body, usedforsecurity=False).digest()
        sha256 = hashlib.sha256(body).digest()
        if self.client.put_if_absent(key, body, sha256=sha256, md5=md5):
            return ref
        self._resolve_existing(ref, key, body, sha256, md5)
        return ref

    def _resolve_existing(self, ref: ArtifactRef, key: str, body: bytes, sha256: bytes,
                          md5: bytes) -> None:
        """The key exists (412): keep it if it holds these bytes, else replace it."""
        head = self.client.head(key, checksum=True)
        if head is None:  # removed between our PUT and this HEAD (reclaim): put again
            if not self.client.put_if_absent(key, body, sha256=sha256, md5=md5):
                self._resolve_existing(ref, key, body, sha256, md5)
            return
        if self._same(head, ref, key, sha256, md5):
            if time.time() - head.last_modified > _TOUCH_AFTER:
                self._touch(key, head)
            return
        log.warning("%s: the object holds other bytes than its digest says; replacing it",
                    self.location(ref), extra={"event": "s3.object_replaced"})
        self.client.replace(key, body, sha256=sha256, md5=md5, if_match=head.etag)

    def _same(self, head: HeadResult, ref: ArtifactRef, key: str, sha256: bytes,
              md5: bytes) -> bool:
        if head.size != ref.size:
            return False
        if head.etag == md5.hex():  # a single-part object's ETag is its MD5
            return True
        if head.checksum_sha256 == base64.b64encode(sha256).decode("ascii"):
            return True
        data = self.client.get(key)  # put otherwise (multipart): hash what is there
        return data is not None and blake3.blake3(data).hexdigest() == ref.digest

    def _touch(self, key: str, head: HeadResult) -> None:
        try:
            self.client.touch(key, if_match=head.etag)
        except S3Error as exc:  # object lock, a policy: reclaim may then see it as old
            log.warning("could not refresh the time of %s (%s): an orphan reclaim with a "
                        "short grace period might remove it", key, exc,
                        extra={"event": "s3.touch_failed"})

    def batch(self) -> contextlib.AbstractContextManager[None]:
        """Each put is written by itself here: a block that only runs its body."""
        return contextlib.nullcontext()

    def sync(self, refs: Iterable[ArtifactRef]) -> None:
        """Nothing left to do: a put is durable when the server answered it."""

    # --- reading -------------------------------------------------------------------------

    def check_each(self, refs: Sequence[ArtifactRef]) -> list[ArtifactError | None]:
        return check_one_by_one(self.check, refs)

    def check(self, ref: ArtifactRef) -> None:
        """Raise ArtifactMissingError, or ArtifactCorruptError if the size differs."""
        head = self.client.head(self.key(ref))
        if head is None:
            raise self._missing(ref)
        if head.size != ref.size:
            raise self._wrong_size(ref, head.size)

    def exists(self, ref: ArtifactRef) -> bool:
        try:
            self.check(ref)
        except (ArtifactMissingError, ArtifactCorruptError):
            return False
        return True

    def read(self, ref: ArtifactRef, *, verify: bool = False) -> bytes:
        data = self.client.get(self.key(ref))
        if data is None:
            raise self._missing(ref)
        if len(data) != ref.size:
            raise self._wrong_size(ref, len(data))
        if verify:
            actual = blake3.blake3(data).hexdigest()
            if actual != ref.digest:
                raise ArtifactCorruptError(
                    f"artifact {self.location(ref)} is corrupt: expected blake3 {ref.digest}, "
                    f"got {actual}",
                    hint="do not trust this payload; restore it from backup or re-fetch",
                    path=self.location(ref), namespace=ref.namespace, digest=ref.digest,
                    actual_digest=actual)
        return data

    def read_range(self, ref: ArtifactRef, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end`` (inclusive) of a payload, without reading the rest."""
        data = self.client.get(self.key(ref), start=start, end=end)
        if data is None:
            raise self._missing(ref)
        return data

    def open(self, ref: ArtifactRef, *, verify: bool = False) -> BinaryIO:
        return io.BytesIO(self.read(ref, verify=verify))

    def verify(self, ref: ArtifactRef) -> None:
        self.read(ref, verify=True)

    def _missing(self, ref: ArtifactRef) -> ArtifactMissingError:
        return ArtifactMissingError(
            f"artifact {ref.namespace}/{ref.digest} is not in the store (expected at "
            f"{self.location(ref)})",
            hint="it was never stored here or was deleted; restore it or re-fetch the page",
            path=self.location(ref), namespace=ref.namespace, digest=ref.digest)

    def _wrong_size(self, ref: ArtifactRef, actual: int) -> ArtifactCorruptError:
        return ArtifactCorruptError(
            f"artifact {self.location(ref)} is {actual} bytes, its reference says {ref.size}",
            hint="the object was truncated or replaced; restore it from backup or re-fetch",
            path=self.location(ref), namespace=ref.namespace, digest=ref.digest,
            expected_size=ref.size, actual_size=actual)

    # --- walking and housekeeping --------------------------------------------------------

    def iter_refs(self) -> Iterator[ArtifactRef]:
        """Every payload object, sorted by (namespace, digest); other keys skipped."""
        namespaces = sorted(
            name for item in self.client.list(self._base, delimiter="/")
            if isinstance(item, str)
            and NAMESPACE_RE.fullmatch(name := item[len(self._base):].rstrip("/")))
        for namespace in namespaces:
            start = f"{self._base}{namespace}/"
            for item in self.client.list(start):
                if isinstance(item, ListedObject):
                    digest = item.key[len(start):]
                    if DIGEST_RE.fullmatch(digest):  # hex: the server's order is sorted
                        yield ArtifactRef(namespace, digest, item.size)

    def usage(self) -> tuple[int, int]:
        count = total = 0
        for ref in self.iter_refs():
            count, total = count + 1, total + ref.size
        return count, total

    def age(self, ref: ArtifactRef) -> float | None:
        """Seconds since the object was stored (or refreshed by a put); None if gone."""
        head = self.client.head(self.key(ref))
        if head is None:
            return None
        return max(0.0, time.time() - head.last_modified)

    def remove(self, ref: ArtifactRef) -> int | None:
        """Delete the object (reclaim, under the store's write lock); its size, or None."""
        key = self.key(ref)
        head = self.client.head(key)
        if head is None:
            return None
        self.client.delete(key)
        return head.size

    def plan_removal(self, refs: Iterable[ArtifactRef]) -> list[Removal]:
        """One removal per object (reclaim commits each under the write lock)."""
        return [SingleRemoval(self, ref) for ref in refs]

    def is_writable(self, ref: ArtifactRef) -> bool:
        """False: an object is never changed in place (a replacement is a new object,
        which verify's re-hash finds)."""
        return False


def open_s3(url: str, *, create: bool, read_only: bool, max_payload: int | None = None,
            environ: Mapping[str, str] | None = None) -> S3ArtifactStore:
    """The S3 artifact store an ``s3://`` URL names, configured from ``environ``
    (``os.environ`` when not given: the user named an s3:// store, so it is read here)."""
    location = S3Location(url)
    config = location.config(os.environ if environ is None else environ)
    kwargs = {} if max_payload is None else {"max_payload": max_payload}
    return S3ArtifactStore(location, config, create=create, read_only=read_only, **kwargs)
