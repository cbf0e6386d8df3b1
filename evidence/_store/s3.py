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

The store is built in parts, one module each, lowest first: ``s3location`` (what an
``s3://`` URL names), ``s3index`` (the segments known, and the reads through them),
``s3puts`` (puts, held and sealed into segments or each its own object; the conditional
create), ``s3reclaim`` (what verify and reclaim ask: the listing, ages, removals) and this
module (``S3ArtifactStore``: opening, the layout, closing). The segment object's format is
``s3segment``'s, the signed requests ``s3client``'s.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Mapping

from .._errors import ArtifactError
from .s3client import Outage, S3Client, S3Config
from .s3location import S3Location
from .s3reclaim import S3Reclaim
from .s3segment import Segment

__all__ = ["S3ArtifactStore", "open_s3"]

log = logging.getLogger("evidence.s3")

DEFAULT_MAX_PAYLOAD = 256 * 1024 * 1024
_LAYOUT_KEY = "LAYOUT"
_LAYOUTS = {"evidence-s3-artifacts 1\n": 1, "evidence-s3-artifacts 2\n": 2}
LAYOUT = 2


class S3ArtifactStore(S3Reclaim):
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
