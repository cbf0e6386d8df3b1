"""Puts in an S3 store: held and sealed into one segment at the writer's sync, or each
its own object, and the conditional create that makes either durable: ``S3Puts``.

A holding store (``hold``: the writer's) keeps each put in memory until a ``sync`` names
one of them, then seals what it holds into one segment (``_seal``); without ``hold`` a put
is its own object, stored before it returns. Every object is created by one conditional
``PUT`` (``_put_object``); a 412 (the key exists) is resolved by what is there
(``_resolve_existing``): the same bytes are kept (their time refreshed if older than
``_TOUCH_AFTER``), other bytes replaced. ``s3.py``'s docstring says why, and what each
answer means.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import logging
import time
from collections.abc import Iterable
from typing import BinaryIO

import blake3

from .._errors import ArtifactError, PayloadTooLargeError
from .._model.refs import ArtifactRef, validate_namespace
from .s3client import HeadResult, S3Error
from .s3index import S3Index
from .s3segment import SEGMENTS, Segment, build_segment

__all__ = ["S3Puts"]

log = logging.getLogger("evidence.s3")

_CHUNK = 1024 * 1024
# A store that holds puts for its group commit seals what it holds into a segment at the
# sync, or sooner once it holds this much (a bound on memory, and on one PUT's size).
SEGMENT_BYTES = 16 * 1024 * 1024
SEGMENT_RECORDS = 8192
_TOUCH_AFTER = 60.0  # seconds: a put finding an older object refreshes its time


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


class S3Puts(S3Index):
    """Writing to an S3 store (see the module's docstring)."""

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
