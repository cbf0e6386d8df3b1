"""Artifacts in an S3-compatible object store: ``--artifacts s3://bucket/prefix``.

This module owns everything under the store's prefix in the bucket::

    <prefix>/LAYOUT                  "evidence-s3-artifacts 2": the layout below
    <prefix>/SEGMENTS/<blake3>       a segment: the payloads of one group commit, with
                                     their index (``s3segment``), read by range
    <prefix>/<namespace>/<digest>    one immutable object per payload (a worker
                                     process's put; all of layout 1)

Upper-case names cannot be namespaces (``[a-z0-9_-]``), so ``LAYOUT`` and ``SEGMENTS/``
can never collide with a payload. A layout this program does not know is refused, as for
a store directory; a layout-1 store is read as it is, and a writer that opens it sets its
``LAYOUT`` to 2 first (so that a program of layout 1 refuses it rather than miss the
segments).

Why segments: a crawl into an object store paid a signed request, and the server's work,
per payload (three a page) and a ``HEAD`` per new reference at the writer; it ran at 0.43x
the pages/s of the same crawl into local packs at 2.1x its CPU per page. The store opened
beside the writer (``hold``) keeps each put in memory (hashed, its ref returned at once)
until the writer's ``sync``, before the COMMIT that first references one of them; the
sync seals every held payload into one segment and puts it: one request per group
commit (docs/benchmarks.md, "The object-store path").

The durability point is an object's PUT answer. Every object is created by one ``PUT``
with ``If-None-Match: *`` (a conditional create) carrying the body's MD5 and SHA-256,
which the server recomputes and refuses on a mismatch (``s3client``); its 200 means the
object is stored whole. Held payloads are acknowledged by nobody until their segment's
200: ``sync`` returns only then, and a failed sync fails the writer's batch (nothing of it
commits; the payloads stay held for the next try). Without ``hold`` (a worker process,
whose references another process's writer checks) each put is its own object and returns
the ref only once it is stored. A 412 means the key exists: a racing put of the same
content, an earlier try whose answer was lost (a segment's name is the BLAKE3 of its
bytes, so a retry names the same object), or an older copy. The put then reads what is
there (HEAD: size and ETag, the MD5 of a single-part object) and goes on only if it is
the same content; an object of the same key with other bytes is damaged, and is replaced
(``If-Match`` on its ETag, so a concurrent repair is not undone). A put waits out an
outage of the object store (``s3client``: retried until ``EVIDENCE_S3_OUTAGE_DEADLINE``);
one that fails even so raises. The writer checks every new reference (``check_each``)
before the COMMIT that records it, so a reference never names an object that is not there
(design rule 6): a payload held here needs no request; any other is asked for with a HEAD
of its segment (once per segment per batch) or of its own object.

Reclaim's grace period reads ``age`` from the youngest copy's Last-Modified. A holding
store holds a payload that a segment it knows stored over ``_TOUCH_AFTER`` ago as a
*copy*, stored again only if the writer's sync names it (no row references it yet: an
orphan about to be referenced, which must count as young) and else dropped; a put of its
own object that finds it already there and older refreshes that time with a copy of the
object onto itself, conditional on its ETag (the same bytes; S3 has no touch). Either way
an orphan that is about to be referenced again counts as young, as a file put again does.
Reclaim rewrites a segment without its orphans (``_SegmentRemoval``): the new segment
first, the old one deleted under the write lock.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import logging
import os
import re
import threading
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
from .artifacts import Removal, check_one_by_one
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
from .s3segment import (
    SEGMENTS,
    TRAILER_SIZE,
    Entry,
    Segment,
    SegmentFormatError,
    build_segment,
    is_segment_name,
    parse_index,
    parse_trailer,
)

__all__ = ["OUTAGE_DEADLINE_ENV", "S3ArtifactStore", "S3Location", "is_s3_url"]

log = logging.getLogger("evidence.s3")

DEFAULT_MAX_PAYLOAD = 256 * 1024 * 1024
_CHUNK = 1024 * 1024
_LAYOUT_KEY = "LAYOUT"
_LAYOUTS = {"evidence-s3-artifacts 1\n": 1, "evidence-s3-artifacts 2\n": 2}
LAYOUT = 2
# A store that holds puts for its group commit seals what it holds into a segment at the
# sync, or sooner once it holds this much (a bound on memory, and on one PUT's size).
SEGMENT_BYTES = 16 * 1024 * 1024
SEGMENT_RECORDS = 8192
_TAIL = 64 * 1024  # bytes read from a segment's end to find its index (most fit)
_KNOWN_LOCATIONS = 1 << 17  # a holding store's memory of where its recent puts went
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
    else the layout must be there. ``read_only``: every put refuses. ``hold``: puts are
    held in memory until a ``sync`` names one of them (the writer's, before its COMMIT),
    then sealed into one segment object; without it (a worker process, whose references
    another process's writer checks), each put is its own object, durable when it returns.
    """

    local = False  # every call is a request to the object store

    def __init__(self, location: S3Location | str, config: S3Config, *,
                 max_payload: int = DEFAULT_MAX_PAYLOAD, create: bool = True,
                 read_only: bool = False, hold: bool = False) -> None:
        if type(max_payload) is not int or max_payload < 0:
            raise ValueError(f"max_payload must be a non-negative int, not {max_payload!r}")
        self.location_ = location if isinstance(location, S3Location) else S3Location(location)
        self.url = self.location_.url
        self.max_payload = max_payload
        self.read_only = read_only
        self.hold = hold and not read_only
        self.client = S3Client(config)
        self._base = f"{self.location_.prefix}/" if self.location_.prefix else ""
        self._lock = threading.Lock()  # the held payloads and the segment index
        self._sealing = threading.Lock()  # one segment PUT at a time
        self._held: dict[tuple[str, str], bytes] = {}
        # Held payloads that a known segment already holds (stored over a minute ago), and
        # since when: stored again only if a sync names them (the writer names a payload
        # that no row references yet: an orphan about to be referenced, kept young so);
        # else dropped after ``_TOUCH_AFTER`` (a page whose body a row already names).
        self._copies: dict[tuple[str, str], float] = {}
        self._held_bytes = 0
        # Segments known, by key, and where each payload of them is. A holding store
        # remembers only its recent puts (bounded); a full listing (``refresh``) loads all.
        self._segments: dict[str, Segment] = {}
        self._where: dict[tuple[str, str], list[str]] = {}
        self._listed = False  # a full listing was loaded: the index is the bucket's
        try:
            self.layout = self._open_layout(create=create and not read_only)
        except BaseException:
            self.client.close()
            raise

    def close(self) -> None:
        try:
            if self.hold and self._held:
                self._seal()  # no row names them (no sync did): stored for a later batch
        except ArtifactError as exc:
            log.warning("%s: %d held payloads could not be stored at close (%s); no "
                        "committed row names them", self.url, len(self._held), exc,
                        extra={"event": "s3.held_dropped"})
        finally:
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
        """The object key of a ref in layout 1 (one object per payload; validated: no
        input can name another key)."""
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
        """Where the payload is, for findings and errors: its segment and offset, or its
        own object."""
        with self._lock:
            keys = self._where.get((ref.namespace, ref.digest), ())
            segment = self._segments.get(keys[0]) if keys else None
        if segment is not None:
            entry = segment.entries[(ref.namespace, ref.digest)]
            return f"s3://{self.location_.bucket}/{segment.key}@{entry.offset}"
        return f"s3://{self.location_.bucket}/{self.key(ref)}"

    def segment_keys(self) -> list[str]:
        """The keys of every segment object in the bucket (listed now)."""
        start = self._base + SEGMENTS
        return [item.key for item in self.client.list(start)
                if isinstance(item, ListedObject) and is_segment_name(item.key[len(start):])]

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
        if layout == 1 and self.hold:
            layout = self._upgrade_layout(key)
        return layout

    def _upgrade_layout(self, key: str) -> int:
        """Layout 1 -> 2 before this store writes its first segment: a program that knows
        only layout 1 would not find payloads in segments, so it must refuse the store."""
        body = f"evidence-s3-artifacts {LAYOUT}\n".encode("ascii")
        head = self.client.head(key)
        if head is not None:
            self.client.replace(key, body, sha256=hashlib.sha256(body).digest(),
                                md5=hashlib.md5(body).digest(), if_match=head.etag)
        text = (self.client.get(key) or b"").decode("ascii", "replace")
        if _LAYOUTS.get(text) != LAYOUT:
            raise ArtifactError(f"{self.url}: its LAYOUT could not be set to {LAYOUT} "
                                f"(it reads {text[:40]!r})",
                                hint="another program changed it meanwhile: open it again")
        return LAYOUT

    def _has_objects(self) -> bool:
        return any(True for _ in self.client.list(self._base, delimiter="/"))

    # --- writing -------------------------------------------------------------------------

    def put(self, namespace: str, data: bytes | Iterable[bytes] | BinaryIO) -> ArtifactRef:
        """Store ``data``; return its ref. Durable when this returns, or (``hold``) once
        a ``sync`` named the ref."""
        validate_namespace(namespace)
        if self.read_only:
            raise ArtifactError(f"artifact store {self.url} was opened read-only",
                                hint="open the store for writing to store payloads")
        body, digest = _digests(data, self.max_payload, namespace)
        ref = ArtifactRef(namespace, digest, len(body))
        if self.hold:
            if self._hold(ref, body):
                self._seal()
            return ref
        key = self.key(ref)
        md5 = hashlib.md5(body, usedforsecurity=False).digest()
        sha256 = hashlib.sha256(body).digest()
        if self.client.put_if_absent(key, body, sha256=sha256, md5=md5):
            return ref
        self._resolve_existing(key, body, sha256, md5, size=ref.size, digest=ref.digest)
        return ref

    def _hold(self, ref: ArtifactRef, body: bytes) -> bool:
        """Hold ``body`` for the next segment, unless it is held already or in a segment
        this process stored within the last ``_TOUCH_AFTER`` seconds (an older copy
        could be an orphan that reclaim is about to remove: the payload is stored again,
        young). True when the held payloads should be sealed now."""
        name = (ref.namespace, ref.digest)
        now = time.time()
        with self._lock:
            if name in self._held:
                return False
            stored = False
            for key in self._where.get(name, ()):
                segment = self._segments[key]
                if segment.entries[name].size == ref.size:
                    if now - segment.modified < _TOUCH_AFTER:
                        return False
                    stored = True
            self._held[name] = body
            self._held_bytes += len(body)
            if stored:
                self._copies[name] = now
            return (self._held_bytes >= SEGMENT_BYTES
                    or len(self._held) >= SEGMENT_RECORDS)

    def _seal(self, names: set[tuple[str, str]] | None = None) -> None:
        """Store the payloads held now as one segment: all but the copies of payloads a
        known segment holds, which go in only if ``names`` names them (and are dropped
        once held ``_TOUCH_AFTER`` unnamed). They are released (and known where they are)
        only once the object store answered the PUT."""
        with self._sealing:
            with self._lock:
                now, items = time.time(), []
                for name, body in list(self._held.items()):
                    since = self._copies.get(name)
                    if since is None or (names is not None and name in names):
                        items.append((name[0], name[1], body))
                    elif now - since > _TOUCH_AFTER:
                        del self._held[name], self._copies[name]
                        self._held_bytes -= len(body)
            if not items:
                return
            body, entries, digest = build_segment(items)
            key = f"{self._base}{SEGMENTS}{digest}"
            self._put_object(key, body)
            segment = Segment(key, len(body), time.time(),
                              {(e.namespace, e.digest): e for e in entries})
            with self._lock:
                for namespace, held_digest, payload in items:
                    name = (namespace, held_digest)
                    if self._held.get(name) is payload:
                        del self._held[name]
                        self._copies.pop(name, None)
                        self._held_bytes -= len(payload)
                self._know(segment)

    def _know(self, segment: Segment) -> None:
        """Add ``segment`` to the index (under ``_lock``); a holding store that has not
        listed the bucket forgets its oldest segments past a bound, so a long crawl's
        memory does not grow with it (a payload not found is looked up again)."""
        self._segments.pop(segment.key, None)
        self._segments[segment.key] = segment
        for name in segment.entries:
            keys = self._where.setdefault(name, [])
            if segment.key not in keys:
                keys.append(segment.key)
        if self._listed:
            return
        while len(self._where) > _KNOWN_LOCATIONS and len(self._segments) > 1:
            self._forget(next(iter(self._segments)))

    def _forget(self, key: str) -> None:
        """Drop segment ``key`` from the index (under ``_lock``)."""
        segment = self._segments.pop(key, None)
        if segment is None:
            return
        for name in segment.entries:
            keys = self._where.get(name)
            if keys is not None and key in keys:
                keys.remove(key)
                if not keys:
                    del self._where[name]

    def _put_object(self, key: str, body: bytes) -> bool:
        """Create ``key`` with ``body`` (conditional create, both digests checked by the
        server); True if this call created it, False if the same bytes were there."""
        md5 = hashlib.md5(body, usedforsecurity=False).digest()
        sha256 = hashlib.sha256(body).digest()
        if self.client.put_if_absent(key, body, sha256=sha256, md5=md5):
            return True
        self._resolve_existing(key, body, sha256, md5, size=len(body), digest=None)
        return False

    def _resolve_existing(self, key: str, body: bytes, sha256: bytes, md5: bytes, *,
                          size: int, digest: str | None) -> None:
        """The key exists (412): keep it if it holds these bytes, else replace it."""
        head = self.client.head(key, checksum=True)
        if head is None:  # removed between our PUT and this HEAD (reclaim): put again
            if not self.client.put_if_absent(key, body, sha256=sha256, md5=md5):
                self._resolve_existing(key, body, sha256, md5, size=size, digest=digest)
            return
        if self._same(head, key, size, sha256, md5, digest or key.rsplit("/", 1)[1]):
            if time.time() - head.last_modified > _TOUCH_AFTER:
                self._touch(key, head)
            return
        log.warning("s3://%s/%s: the object holds other bytes than its digest says; "
                    "replacing it", self.location_.bucket, key,
                    extra={"event": "s3.object_replaced"})
        self.client.replace(key, body, sha256=sha256, md5=md5, if_match=head.etag)

    def _same(self, head: HeadResult, key: str, size: int, sha256: bytes, md5: bytes,
              digest: str) -> bool:
        if head.size != size:
            return False
        if head.etag == md5.hex():  # a single-part object's ETag is its MD5
            return True
        if head.checksum_sha256 == base64.b64encode(sha256).decode("ascii"):
            return True
        data = self.client.get(key)  # put otherwise (multipart): hash what is there
        return data is not None and blake3.blake3(data).hexdigest() == digest

    def _touch(self, key: str, head: HeadResult) -> None:
        try:
            self.client.touch(key, if_match=head.etag)
        except S3Error as exc:  # object lock, a policy: reclaim may then see it as old
            log.warning("could not refresh the time of %s (%s): an orphan reclaim with a "
                        "short grace period might remove it", key, exc,
                        extra={"event": "s3.touch_failed"})

    def batch(self) -> contextlib.AbstractContextManager[None]:
        """A plain block: a put is its own object, or held until the sync."""
        return contextlib.nullcontext()

    def sync(self, refs: Iterable[ArtifactRef]) -> None:
        """Make the listed payloads durable: if one of them is held, every held payload
        goes into one segment (the group commit's one PUT). Without ``hold``, nothing is
        left to do: a put is durable when the server answered it."""
        if not self.hold:
            return
        names = {(ref.namespace, ref.digest) for ref in refs}
        while True:
            with self._lock:
                if names.isdisjoint(self._held):
                    return
            self._seal(names)

    # --- finding a payload ---------------------------------------------------------------

    def _entry(self, ref: ArtifactRef) -> tuple[Segment, Entry] | None:
        """The youngest known segment holding ``ref``'s payload, and where in it."""
        name = (ref.namespace, ref.digest)
        with self._lock:
            found = [self._segments[key] for key in self._where.get(name, ())]
        if not found:
            return None
        segment = max(found, key=lambda s: s.modified)
        return segment, segment.entries[name]

    def refresh(self) -> None:
        """Load the index of every segment in the bucket not known yet, and forget the
        known ones that are gone (reclaim rewrote or removed them)."""
        listed: dict[str, ListedObject] = {}
        start = self._base + SEGMENTS
        for item in self.client.list(start):
            if isinstance(item, ListedObject) and is_segment_name(item.key[len(start):]):
                listed[item.key] = item
        with self._lock:
            for key in [k for k in self._segments if k not in listed]:
                self._forget(key)
            new = [item for key, item in listed.items() if key not in self._segments]
            self._listed = True
        for item in new:
            segment = self._load_segment(item)
            if segment is not None:
                with self._lock:
                    self._know(segment)

    def _load_segment(self, item: ListedObject) -> Segment | None:
        """A listed segment's index, read by range from its end (None: gone meanwhile,
        or damaged: its payloads are then not found, which verify reports)."""
        try:
            tail_start = max(0, item.size - _TAIL)
            tail = self.client.get(item.key, start=tail_start, end=item.size - 1)
            if tail is None:
                return None
            if len(tail) != item.size - tail_start or item.size < TRAILER_SIZE:
                raise SegmentFormatError("the object is shorter than its listing says")
            start, length, check = parse_trailer(tail[-TRAILER_SIZE:], item.size)
            if start >= tail_start:
                index = tail[start - tail_start:start - tail_start + length]
            else:
                index = self.client.get(item.key, start=start, end=start + length - 1) or b""
            entries = parse_index(index, check, start)
        except SegmentFormatError as exc:
            log.warning("s3://%s/%s: not a readable segment (%s); the payloads it holds "
                        "are not found", self.location_.bucket, item.key, exc,
                        extra={"event": "s3.segment_unreadable"})
            return None
        return Segment(item.key, item.size, item.last_modified, entries)

    # --- reading -------------------------------------------------------------------------

    def check_each(self, refs: Sequence[ArtifactRef]) -> list[ArtifactError | None]:
        """``check`` of each, asking for each segment once (a HEAD per segment, not per
        payload: verify's quick pass over a store of segments)."""
        confirmed: set[str] = set()
        return check_one_by_one(lambda ref: self._check(ref, confirmed), refs)

    def check(self, ref: ArtifactRef) -> None:
        """Raise ArtifactMissingError, or ArtifactCorruptError if the size differs."""
        self._check(ref, set())

    def _check(self, ref: ArtifactRef, confirmed: set[str]) -> None:
        """``check``, where the segments in ``confirmed`` are known to be there.

        A payload held here passes (the writer's sync stores it before its COMMIT);
        else its segment (once per ``check_each``) or its own object is asked for with a
        HEAD: what this process knows says where to look, never that it is there (a
        reclaim elsewhere may have rewritten a segment since)."""
        with self._lock:
            held = self._held.get((ref.namespace, ref.digest))
        if held is not None:
            if len(held) != ref.size:
                raise self._wrong_size(ref, len(held))
            return
        for attempt in range(2):
            found = self._entry(ref)
            if found is not None:
                segment, entry = found
                if entry.size != ref.size:
                    raise self._wrong_size(ref, entry.size)
                if segment.key in confirmed:
                    return
                if self.client.head(segment.key) is not None:
                    confirmed.add(segment.key)
                    return
                # Gone: reclaim rewrote it (the payload may be in the new segment).
            else:
                head = self.client.head(self.key(ref))
                if head is not None:
                    if head.size != ref.size:
                        raise self._wrong_size(ref, head.size)
                    return
            if attempt == 0:
                self.refresh()
        raise self._missing(ref)

    def exists(self, ref: ArtifactRef) -> bool:
        try:
            self.check(ref)
        except (ArtifactMissingError, ArtifactCorruptError):
            return False
        return True

    def _fetch(self, ref: ArtifactRef, start: int, end: int | None) -> bytes | None:
        """Bytes ``start``..``end`` (inclusive; None: to the end) of the payload, from
        memory, a segment or its own object; None if it is nowhere."""
        with self._lock:
            held = self._held.get((ref.namespace, ref.digest))
        if held is not None:
            return held[start:None if end is None else end + 1]
        for attempt in range(2):
            found = self._entry(ref)
            if found is not None:
                segment, entry = found
                last = entry.size - 1 if end is None else min(end, entry.size - 1)
                if last < start:
                    return b""
                data = self.client.get(segment.key, start=entry.offset + start,
                                       end=entry.offset + last)
                if data is not None:
                    return data
                # Gone: reclaim rewrote it (the payload may be in the new segment).
            elif start == 0 and end is None:
                data = self.client.get(self.key(ref))
            else:
                data = self.client.get(self.key(ref), start=start, end=end)
            if data is not None:
                return data
            if attempt == 0:
                self.refresh()  # forgets the segments gone, learns the new ones
        return None

    def read(self, ref: ArtifactRef, *, verify: bool = False) -> bytes:
        data = self._fetch(ref, 0, None)
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
        data = self._fetch(ref, start, end)
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
            f"{self.location(ref)} or in a segment under "
            f"s3://{self.location_.bucket}/{self._base}{SEGMENTS})",
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
        """Every payload, once, sorted by (namespace, digest): the objects of layout 1,
        the entries of every segment (listed now) and the payloads held here (as a pack
        lists records appended but not yet synced)."""
        self.refresh()
        with self._lock:
            found = {name: self._segments[keys[0]].entries[name].size
                     for name, keys in self._where.items() if keys}
            found.update((name, len(body)) for name, body in self._held.items())
        namespaces = sorted(
            name for item in self.client.list(self._base, delimiter="/")
            if isinstance(item, str)
            and NAMESPACE_RE.fullmatch(name := item[len(self._base):].rstrip("/")))
        for namespace in namespaces:
            start = f"{self._base}{namespace}/"
            for item in self.client.list(start):
                if isinstance(item, ListedObject):
                    digest = item.key[len(start):]
                    if DIGEST_RE.fullmatch(digest):
                        found.setdefault((namespace, digest), item.size)
        for (namespace, digest), size in sorted(found.items()):
            yield ArtifactRef(namespace, digest, size)

    def usage(self) -> tuple[int, int]:
        count = total = 0
        for ref in self.iter_refs():
            count, total = count + 1, total + ref.size
        return count, total

    def age(self, ref: ArtifactRef) -> float | None:
        """Seconds since its youngest copy was stored (a segment's time, or its own
        object's, refreshed by a put); None if it is nowhere."""
        times = []
        name = (ref.namespace, ref.digest)
        with self._lock:
            if name in self._held:
                return 0.0  # put just now, not sealed yet
            keys = list(self._where.get(name, ()))
        for key in keys:
            head = self.client.head(key)
            if head is None:
                with self._lock:
                    self._forget(key)
            else:
                times.append(head.last_modified)
        head = self.client.head(self.key(ref))
        if head is not None:
            times.append(head.last_modified)
        if not times:
            return None
        return max(0.0, time.time() - max(times))

    def remove(self, ref: ArtifactRef) -> int | None:
        """Delete every copy of the payload (reclaim, under the store's write lock): its
        own object, and its entry in each segment (rewritten without it); the bytes freed,
        or None if it was nowhere."""
        self.refresh()
        with self._lock:
            held = (ref.namespace, ref.digest) in self._held
        if not held and self._entry(ref) is None and self.client.head(self.key(ref)) is None:
            return None
        freed = 0
        for removal in self.plan_removal([ref]):
            freed += removal.commit()
        return freed

    def _remove_object(self, ref: ArtifactRef) -> int:
        key = self.key(ref)
        head = self.client.head(key)
        if head is None:
            return 0
        self.client.delete(key)
        return head.size

    def plan_removal(self, refs: Iterable[ArtifactRef]) -> list[Removal]:
        """One removal per segment holding some of ``refs`` (the segment rewritten without
        them, before the lock; swapped in by ``commit``), and one per payload in no
        segment (its own object, deleted)."""
        self.refresh()
        by_segment: dict[str, list[ArtifactRef]] = {}
        alone: list[ArtifactRef] = []
        removals: list[Removal] = []
        for ref in refs:
            with self._lock:
                keys = list(self._where.get((ref.namespace, ref.digest), ()))
                held = (ref.namespace, ref.digest) in self._held
            for key in keys:
                by_segment.setdefault(key, []).append(ref)
            if held:
                removals.append(_HeldRemoval(self, ref))
            elif not keys:
                alone.append(ref)
        for key, mine in by_segment.items():
            with self._lock:
                segment = self._segments.get(key)
            if segment is not None:
                removals.append(_SegmentRemoval(self, segment, mine))
        removals += [_ObjectRemoval(self, ref) for ref in alone]
        return removals

    def is_writable(self, ref: ArtifactRef) -> bool:
        """False: an object is never changed in place (a replacement is a new object,
        which verify's re-hash finds)."""
        return False


class _OneRemoval:
    """One payload of this store removed alone: nothing to prepare, nothing to undo."""

    def __init__(self, store: S3ArtifactStore, ref: ArtifactRef) -> None:
        self.store, self.refs = store, [ref]

    def abort(self) -> None:
        pass


class _HeldRemoval(_OneRemoval):
    """A payload held here, never sealed (no sync named it): dropped from memory."""

    def commit(self) -> int:
        store, ref = self.store, self.refs[0]
        with store._lock:
            body = store._held.pop((ref.namespace, ref.digest), None)
            store._copies.pop((ref.namespace, ref.digest), None)
            if body is not None:
                store._held_bytes -= len(body)
        return (0 if body is None else len(body)) + store._remove_object(ref)


class _ObjectRemoval(_OneRemoval):
    """A payload in no segment: its own object (layout 1) is deleted."""

    def commit(self) -> int:
        return self.store._remove_object(self.refs[0])


class _SegmentRemoval:
    """Some payloads of one segment removed: the segment is rewritten without them (a new
    segment, when any payload remains) before the lock; ``commit`` deletes the old one,
    ``abort`` the new one (if this removal created it). Both exist in between: a reader
    finds every payload in one or the other."""

    def __init__(self, store: S3ArtifactStore, segment: Segment,
                 refs: list[ArtifactRef]) -> None:
        self.store, self.segment, self.refs = store, segment, refs
        gone = {(ref.namespace, ref.digest) for ref in refs}
        self._freed = sum(e.size for name, e in segment.entries.items() if name in gone)
        self._new: Segment | None = None
        self._created = False
        keep = [e for name, e in segment.entries.items() if name not in gone]
        if not keep:
            return
        data = store.client.get(segment.key)
        if data is None or len(data) != segment.size:
            raise ArtifactError(f"s3://{store.location_.bucket}/{segment.key} changed while "
                                "reclaim planned its removal", hint="run reclaim again")
        body, entries, name = build_segment(
            (e.namespace, e.digest, data[e.offset:e.offset + e.size])
            for e in sorted(keep, key=lambda e: e.offset))
        key = f"{store._base}{SEGMENTS}{name}"
        self._created = store._put_object(key, body)
        self._new = Segment(key, len(body), time.time(),
                            {(e.namespace, e.digest): e for e in entries})
        with store._lock:
            store._know(self._new)

    def commit(self) -> int:
        store = self.store
        store.client.delete(self.segment.key)
        with store._lock:
            store._forget(self.segment.key)
        return self._freed + sum(store._remove_object(ref) for ref in self.refs)

    def abort(self) -> None:
        if self._new is not None and self._created:
            self.store.client.delete(self._new.key)
            with self.store._lock:
                self.store._forget(self._new.key)


def open_s3(url: str, *, create: bool, read_only: bool, max_payload: int | None = None,
            environ: Mapping[str, str] | None = None, hold: bool = False) -> S3ArtifactStore:
    """The S3 artifact store an ``s3://`` URL names, configured from ``environ``
    (``os.environ`` when not given: the user named an s3:// store, so it is read here).
    ``hold``: puts wait for a sync in this process (a store with its writer here)."""
    location = S3Location(url)
    config = location.config(os.environ if environ is None else environ)
    kwargs = {} if max_payload is None else {"max_payload": max_payload}
    return S3ArtifactStore(location, config, create=create, read_only=read_only, hold=hold,
                           **kwargs)
