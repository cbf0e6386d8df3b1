"""Messages: the immutable results that crawler workers hand to the writer.

A message is a frozen, tagged ``msgspec.Struct``; the tag field is ``kind``. Decoding is
strict: an unknown kind, an unknown or missing field, or a wrong type is a ``MessageError``
whose text names the field path (``... - at `$.body.digest` ``).

Every message has a ``message_id`` chosen by its producer; redelivering the same message
(same id, same content) is always safe. The *canonical encoding* of a message is its
msgpack encoding with every map's keys in sorted order (``order="deterministic"``); the
payload hash is BLAKE3 of that encoding, and the Merkle leaf is SHA-256(0x00 || encoding).

Schema-evolution rules (docs/messages.md has the long form):
  - a field is never renamed, re-typed or given a new default;
  - a new field is added only with a default; defaults are omitted from the canonical
    encoding (``omit_defaults``), so every message stored before the field existed still
    re-encodes to the same bytes and keeps its hash;
  - a kind is never removed while stores hold it;
  - timestamps must carry a timezone; they are encoded as instants (msgpack timestamps).
"""

from __future__ import annotations

import datetime as _dt
import os
import re
import threading
import time
from typing import Annotated, Literal

import blake3
import msgspec

from .._errors import MessageError
from .refs import ArtifactRef

__all__ = [
    "MAX_MESSAGE_BYTES",
    "Connection",
    "Discovery",
    "DnsAnswer",
    "DocumentRecord",
    "FetchAttempt",
    "FrontierUpdate",
    "HostUpdate",
    "Message",
    "ObservedRef",
    "Proxied",
    "QueuedUrl",
    "Render",
    "RuleEvaluated",
    "RunEnded",
    "RunStarted",
    "SessionDocuments",
    "SessionEnded",
    "SessionStarted",
    "SettledUrl",
    "Tls",
    "canonical_encode",
    "check_size",
    "decode_message",
    "encode_checked",
    "format_time",
    "ledger_entry",
    "new_id",
    "now_text",
    "payload_hash",
    "utc_now",
]

#: The largest encoded message the writer accepts (bodies live in the artifact store).
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
#: The deepest nesting accepted in ``config`` and ``details`` (free-form JSON-like data).
#: Explicit, so acceptance never depends on how deep the decoding caller's stack is.
MAX_NESTING = 32

Id = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:-]+$")]
Url = Annotated[str, msgspec.Meta(min_length=1, max_length=65536)]
Text = Annotated[str, msgspec.Meta(max_length=65536)]
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
UtcTime = Annotated[_dt.datetime, msgspec.Meta(tz=True)]
NonNegative = Annotated[int, msgspec.Meta(ge=0, le=2**62)]

_STRUCT = {
    "frozen": True,
    "forbid_unknown_fields": True,
    "omit_defaults": True,
    "tag_field": "kind",
}


class SessionStarted(msgspec.Struct, tag="session_started", **_STRUCT):
    """A crawl session begins: one complete pass over the configured scope."""

    message_id: Id
    session_id: Id
    started_at: UtcTime
    mode: Literal["full", "incremental"] = "full"
    config: dict[str, object] = {}
    baseline_session_id: Id | None = None


class SessionEnded(msgspec.Struct, tag="session_ended", **_STRUCT):
    """A session ends. ``completed`` only when its frontier was exhausted."""

    message_id: Id
    session_id: Id
    ended_at: UtcTime
    outcome: Literal["completed", "abandoned"]


class RunStarted(msgspec.Struct, tag="run_started", **_STRUCT):
    """One execution of the crawler inside a session begins."""

    message_id: Id
    run_id: Id
    session_id: Id
    started_at: UtcTime
    program: Text = ""
    host: Text = ""
    pid: NonNegative = 0


class RunEnded(msgspec.Struct, tag="run_ended", **_STRUCT):
    """A run ends: ``completed`` (frontier exhausted), ``stopped``, ``capped`` or ``failed``."""

    message_id: Id
    run_id: Id
    ended_at: UtcTime
    outcome: Literal["completed", "stopped", "capped", "failed"]
    reason: Text = ""


Outcome = Literal[
    "response",  # an HTTP response was received (any status)
    "network_error",  # connection refused, reset, DNS, TLS
    "timeout",
    "too_large",  # the body exceeded the cap; body_truncated says what was kept
    "refused_by_robots",  # never requested: robots.txt disallows it
    "skipped",  # never requested: scope, depth, cap (error says which rule)
]


# The protocol an attempt's request went over (issue 33): "http/1.1" (every attempt recorded
# before HTTP/2 says so by default), "h2" (its request and response are the frames of
# its stream: ``evidence._model.http2``).
Protocol = Literal["http/1.1", "h2"]

Capture = Literal[
    "rebuilt",  # recorded before wire capture: heads rebuilt from parsed headers, body de-chunked
    "wire",  # the request and response exactly as they crossed the connection
]
TextSource = Literal["bom", "header", "meta", "default"]


Port = Annotated[int, msgspec.Meta(ge=0, le=65535)]
ResolverSource = Literal[
    "getaddrinfo",  # the system resolver (glibc: NSS, DNS through /etc/resolv.conf)
    "hosts-file",  # the same call, answered from /etc/hosts (nsswitch.conf puts files first)
    "given",  # a resolver the crawl's caller gave (CrawlOptions.resolver: tests)
]


class DnsAnswer(msgspec.Struct, **_STRUCT | {"tag_field": None}):
    """One resolution of a host name: what the resolver answered, once, under its own id.

    Every attempt whose connection used it carries it whole (so each attempt's leaf covers
    the answer it relied on); the store keeps it once (``dns_resolution``), and a second
    copy under the same id with other content is refused. ``ttl`` is absent when the
    resolver does not give one (``getaddrinfo`` never does).
    """

    resolution_id: Id
    host: Annotated[str, msgspec.Meta(min_length=1, max_length=300)]
    port: Port
    resolved_at: UtcTime
    source: ResolverSource
    addresses: list[Annotated[str, msgspec.Meta(min_length=1, max_length=64)]]
    ttl: NonNegative | None = None


class Tls(msgspec.Struct, **_STRUCT | {"tag_field": None}):
    """What a TLS handshake settled: as the client's TLS library reports it.

    ``chain`` is the server's certificate chain as it presented it (DER certificates,
    concatenated, leaf first: each is self-delimiting), a content-addressed artifact, so a
    chain seen again is stored once. ``verified``: the chain was verified against the
    client's trust store (the host name checked too): a chain that fails verification
    ends the handshake, and its attempt records no connection but a ``ConnectError``
    naming why (``certificate verify failed: ...``).
    """

    version: Name
    cipher: Name
    sni: Annotated[str, msgspec.Meta(max_length=300)] | None = None
    alpn: Name | None = None
    chain: ArtifactRef | None = None
    verified: bool = False


ProxyScheme = Literal["http", "socks5", "socks5h"]


class Proxied(msgspec.Struct, **_STRUCT | {"tag_field": None}):
    """The proxy a connection went through (issue 36), and what it was asked and answered.

    ``scheme``, ``host``, ``port``: the proxy as configured, never its credentials.
    ``target`` and ``target_port``: what the proxy was asked to connect to: the origin's
    address the network policy checked (``http`` CONNECT, ``socks5``), or its name
    (``socks5h``: the proxy resolves it, unchecked). ``reply``: the proxy's answer to the
    handshake, in words (the CONNECT response's status line; the SOCKS reply); with
    ``established`` false the tunnel was refused and the attempt never reached the origin.
    ``dns``: the resolution of the proxy's own host name (absent for an address literal).
    The connection's ``remote_address`` is the proxy's address, as the socket reports it.
    """

    scheme: ProxyScheme
    host: Annotated[str, msgspec.Meta(min_length=1, max_length=300)]
    port: Port
    target: Annotated[str, msgspec.Meta(min_length=1, max_length=300)]
    target_port: Port
    reply: Annotated[str, msgspec.Meta(max_length=300)]
    established: bool = True
    dns: DnsAnswer | None = None


class Connection(msgspec.Struct, **_STRUCT | {"tag_field": None}):
    """The connection an attempt's request was written to: the addresses actually
    connected (not the name), the resolution that gave the remote one, and TLS; through
    a proxy (``proxy``), the remote address is the proxy's and ``dns`` the origin's."""

    remote_address: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    remote_port: Port
    local_address: Annotated[str, msgspec.Meta(max_length=64)] = ""
    local_port: Port = 0
    dns: DnsAnswer | None = None  # absent: the URL's host was an address literal
    tls: Tls | None = None
    reused: bool = False  # an earlier request went over it (a kept-alive connection)
    proxy: Proxied | None = None  # absent: a direct connection


class FetchAttempt(msgspec.Struct, tag="fetch_attempt", **_STRUCT):
    """One request attempt, with references to its stored request and response.

    With ``capture="wire"``: ``request_headers`` is the request as written to the connection
    (request line, header block, body if any), ``response_headers`` the response's status
    line and header block as read (interim 1xx responses included), ``body`` the message
    body as read (transfer coding included), ``surplus`` bytes read after the body's end.
    ``content`` is the body with ``transfer_coding`` and then ``content_coding`` removed,
    present only when its bytes differ from the body's; ``content_truncated`` says it is
    cut (at the size cap, or because the body is). ``text_encoding`` and its
    ``text_encoding_source`` say how an HTML document's text was read (``evidence._model.text``).
    ``connection`` says with whom and how the request was exchanged (``Connection``).

    ``protocol`` "h2" (HTTP/2, ``evidence._model.http2``): ``request_headers`` holds the
    frames written on the request's stream, ``frames`` the frames read on it (and each
    GOAWAY read while it was open), exactly; ``response_headers`` and ``body`` are derived
    from ``frames`` (the decoded head rendered HTTP/1-style, the DATA payloads), and
    ``content`` from them as for HTTP/1.1.
    """

    message_id: Id
    attempt_id: Id
    run_id: Id
    url: Url  # the URL exactly as requested
    sequence: NonNegative  # orders attempts of one URL in one run; url_current follows it
    started_at: UtcTime
    elapsed_ms: Annotated[float, msgspec.Meta(ge=0)]
    outcome: Outcome
    method: Annotated[str, msgspec.Meta(pattern=r"^[A-Z]{1,16}$")] = "GET"
    http_status: Annotated[int, msgspec.Meta(ge=100, le=999)] | None = None
    request_headers: ArtifactRef | None = None
    response_headers: ArtifactRef | None = None
    body: ArtifactRef | None = None
    body_truncated: bool = False
    content_type: Text | None = None
    error: Text | None = None
    capture: Capture = "rebuilt"
    content: ArtifactRef | None = None
    transfer_coding: Text | None = None
    content_coding: Text | None = None
    content_truncated: bool = False
    surplus: ArtifactRef | None = None
    text_encoding: Name | None = None
    text_encoding_source: TextSource | None = None
    # A request a browser made while rendering a page (a ``render`` message with this id,
    # in the same run): not the crawler's attempt of the URL, so never in url_current.
    render_id: Id | None = None
    # Where the request went and how (issue 33): absent on attempts recorded before it,
    # and on those that never connected.
    connection: Connection | None = None
    protocol: Protocol = "http/1.1"
    frames: ArtifactRef | None = None  # "h2": the frames read on the request's stream
    # The opening of ``request_headers`` when secrets in it were sealed (issue 36,
    # ``_crawl.secrets``): the exact request and each commitment's salt, in the
    # ``secrets`` namespace, which exports leave out unless asked.
    request_secrets: ArtifactRef | None = None


# A page requisite (an image, script, stylesheet, CSS url(), media) has its own kind
# (issue 15); messages from before carry only the first four.
EdgeKind = Literal["link", "redirect", "embed", "sitemap", "image", "script",
                   "stylesheet", "style", "media"]


class ObservedRef(msgspec.Struct, **_STRUCT | {"tag_field": None}):
    """One reference observed in a source document."""

    observed: Url  # the href exactly as it appeared
    url: Url  # resolved against the document's base: absolute, not yet normalized
    position: NonNegative  # the node's index in document order
    tag: Name = "a"
    attr: Name = "href"
    rel: Text = ""
    edge_kind: EdgeKind = "link"


class Discovery(msgspec.Struct, tag="discovery", **_STRUCT):
    """The references found in one stored artifact of one attempt."""

    message_id: Id
    run_id: Id
    source_attempt_id: Id
    source_artifact: ArtifactRef
    refs: list[ObservedRef]
    truncated: bool = False  # more references existed than the extractor keeps
    # Found in the DOM of this render (its ``dom`` artifact is the source artifact; the
    # source attempt is the render's source): links a browser's rendering showed.
    render_id: Id | None = None


class RuleEvaluated(msgspec.Struct, tag="rule_evaluated", **_STRUCT):
    """One rule version judged one input set (the artifacts it read)."""

    message_id: Id
    run_id: Id
    url: Url
    rule_id: Name
    rule_version: Name
    input_hash: Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{64}$")]
    verdict: Literal["pass", "fail", "error", "not_applicable"]
    evaluated_at: UtcTime
    attempt_id: Id | None = None
    details: dict[str, object] = {}


RenderSettle = Literal["quiet", "deadline"]  # how the page was judged ready (docs/replay.md)
RenderOutcome = Literal[
    "rendered",  # loaded, settled, serialized: the artifacts are there
    "timeout",  # no result within the render timeout (the browser may have hung)
    "crashed",  # the page's renderer or the whole browser died
    "error",  # the browser refused the page (navigation error, protocol error)
]


class Render(msgspec.Struct, tag="render", **_STRUCT):
    """A stored capture loaded in a headless browser, and what the browser made of it.

    ``source_attempt_id`` is the attempt whose stored response the browser was given for
    ``url`` (any run of the session: a render can arrive after a restart). Every request
    the browser made is a ``fetch_attempt`` of this run naming this render (``requests``
    of them, in the same writer group); links found in the DOM are a ``discovery`` naming
    it. ``dom`` is the document serialized once it settled (``settle``: ``quiet`` or
    ``deadline``, docs/replay.md), ``screenshot`` a full-page PNG, ``mhtml`` optional.
    ``behaviors`` is the log of what the render's behaviours did before the capture (what
    was scrolled, clicked or opened, when, and which requests followed; JSON,
    docs/replay.md), absent when none ran.
    """

    message_id: Id
    render_id: Id
    run_id: Id
    source_attempt_id: Id
    url: Url
    started_at: UtcTime
    elapsed_ms: Annotated[float, msgspec.Meta(ge=0)]
    outcome: RenderOutcome
    error: Text | None = None
    browser: Text = ""
    viewport_width: NonNegative = 0
    viewport_height: NonNegative = 0
    settle: RenderSettle | None = None
    final_url: Url | None = None  # location.href when serialized (scripts may change it)
    title: Text = ""
    dom: ArtifactRef | None = None
    screenshot: ArtifactRef | None = None
    screenshot_truncated: bool = False  # the page was taller than the screenshot limit
    mhtml: ArtifactRef | None = None
    requests: NonNegative = 0
    not_recorded: list[Text] = []  # requests the browser asked for that were not made
    behaviors: ArtifactRef | None = None  # the behaviours' action log (namespace behaviors)


class QueuedUrl(msgspec.Struct, **_STRUCT | {"tag_field": None}):
    """A URL entering a session's frontier (a URL already there keeps its state)."""

    url: Url  # absolute; requested as given, keyed by its normalized form
    depth: NonNegative
    via: Literal["seed", "link", "redirect", "sitemap", "embed"] = "link"
    source_attempt_id: Id | None = None
    skip: Text | None = None  # enters as skipped, with this reason (scope, depth, ...)


class SettledUrl(msgspec.Struct, **_STRUCT | {"tag_field": None}):
    """A frontier URL moving to a new state, with the reason a person would ask for."""

    url: Url
    state: Literal["queued", "done", "failed", "skipped"]
    reason: Text = ""
    not_before: UtcTime | None = None  # for 'queued': not to be claimed before this


class FrontierUpdate(msgspec.Struct, tag="frontier", **_STRUCT):
    """Frontier transitions of one session: URLs queued, claimed for fetching, settled.

    Applied in that order. Claims must find their URL queued, settlements must find it
    present; otherwise the whole message is rejected.
    """

    message_id: Id
    session_id: Id
    run_id: Id
    at: UtcTime  # when the crawler decided these transitions
    queued: list[QueuedUrl] = []
    claimed: list[Url] = []
    settled: list[SettledUrl] = []


class HostUpdate(msgspec.Struct, tag="host", **_STRUCT):
    """What the crawler knows of a host: its robots.txt and any backoff it asked for."""

    message_id: Id
    run_id: Id
    host: Annotated[str, msgspec.Meta(min_length=1, max_length=300)]
    robots_attempt_id: Id | None = None  # the fetch of robots.txt now in force
    robots_expires_at: UtcTime | None = None
    crawl_delay: Annotated[float, msgspec.Meta(ge=0)] | None = None
    backoff_until: UtcTime | None = None
    reason: Text = ""


DocumentChange = Literal["new", "changed", "unchanged", "orphaned"]


class DocumentRecord(msgspec.Struct, **_STRUCT | {"tag_field": None}):
    """One document of a completed session, classified against the session's baseline."""

    url: Url
    change: DocumentChange
    http_status: Annotated[int, msgspec.Meta(ge=100, le=999)] | None = None
    body_digest: Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{64}$")] | None = None
    attempt_id: Id | None = None
    fetched_at: UtcTime | None = None


class SessionDocuments(msgspec.Struct, tag="session_documents", **_STRUCT):
    """Part of a completed session's record of every document (sent in chunks)."""

    message_id: Id
    session_id: Id
    run_id: Id
    documents: list[DocumentRecord]


Message = (
    SessionStarted | SessionEnded | RunStarted | RunEnded | FetchAttempt | Discovery
    | RuleEvaluated | FrontierUpdate | HostUpdate | SessionDocuments | Render
)

_FREE_FORM = {SessionStarted: "config", RuleEvaluated: "details"}  # the JSON-like fields
_msgpack_encoder = msgspec.msgpack.Encoder(order="deterministic")
_msgpack_decoder = msgspec.msgpack.Decoder(Message)
_json_decoder = msgspec.json.Decoder(Message)


def canonical_encode(message: Message) -> bytes:
    """The bytes that are hashed, logged and stored: deterministic msgpack."""
    return _msgpack_encoder.encode(message)


#: The first element of a ledger entry that names its submitter (``ledger_entry``).
SUBMITTED_BY = "evidence/submitted-by"


def ledger_entry(payload: bytes, submitter: str | None = None) -> bytes:
    """The bytes a ledger row's Merkle leaf hashes: ``SHA-256(0x00 || entry)``.

    A message with no recorded submitter (written by the crawl itself, its own worker
    processes, or any store before schema 9) is its canonical bytes, as it always was. One
    a worker host submitted (``ingest_ledger.submitter``) is the canonical msgpack array
    ``["evidence/submitted-by", submitter, payload]``: the leaf, and so every root, checkpoint
    and proof, covers who submitted it. The two forms never collide: a message encodes as a
    msgpack map, the wrapper as an array.
    """
    if submitter is None:
        return payload
    return _msgpack_encoder.encode((SUBMITTED_BY, submitter, payload))


def split_entry(entry: bytes) -> tuple[bytes, str | None]:
    """The payload and submitter of a ledger entry (``ledger_entry``'s inverse); an entry
    that is not the wrapper is a bare payload. Raises ``MessageError`` for a malformed
    wrapper."""
    if not entry or (entry[0] & 0xF0 != 0x90 and entry[0] not in (0xDC, 0xDD)):
        return entry, None
    try:
        tag, submitter, payload = msgspec.msgpack.decode(entry, type=tuple[str, str, bytes])
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise MessageError(f"a ledger entry that is neither a message nor a submitted "
                           f"one: {exc}") from None
    if tag != SUBMITTED_BY or ledger_entry(payload, submitter) != entry:
        raise MessageError("a ledger entry that is neither a message nor a submitted one")
    return payload, submitter


def check_size(size: int, message_id: str | None = None) -> None:
    """Refuse an encoded message larger than ``MAX_MESSAGE_BYTES``: the one check of that
    limit, made where a message is encoded to be submitted (``encode_checked``: the client
    and the writer) and where bytes are decoded (``decode_message``: the service)."""
    if size > MAX_MESSAGE_BYTES:
        which = "message" if message_id is None else f"message {message_id}"
        raise MessageError(
            f"{which} of {size} bytes exceeds the limit of {MAX_MESSAGE_BYTES}",
            hint="store large payloads in the artifact store and reference them",
            size=size, **({} if message_id is None else {"message_id": message_id}))


def encode_checked(message: Message) -> bytes:
    """The canonical encoding of a message to submit, refused (``MessageError``) over
    ``MAX_MESSAGE_BYTES``: how the client encodes a message to send it, and how the writer
    encodes each message it records (one the service decoded too: what is stored and hashed
    is the canonical encoding of what was decoded, whatever bytes a client sent)."""
    data = canonical_encode(message)
    check_size(len(data), message.message_id)
    return data


def payload_hash(encoded: bytes) -> str:
    """BLAKE3 of a canonical encoding, as 64 lowercase hex digits."""
    return blake3.blake3(encoded).hexdigest()


def decode_message(data: bytes, *, format: Literal["msgpack", "json"] = "msgpack") -> Message:
    """Decode one message strictly; any defect is a ``MessageError`` naming the field."""
    check_size(len(data))
    decoder = _msgpack_decoder if format == "msgpack" else _json_decoder
    try:
        message = decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise MessageError(f"invalid message: {exc}", hint="fix the producer") from exc
    except msgspec.DecodeError as exc:
        raise MessageError(f"malformed {format}: {exc}", hint="fix the producer") from exc
    except RecursionError as exc:
        raise MessageError(f"invalid message: nested deeper than {MAX_NESTING} levels",
                           hint="flatten config and details") from exc
    name = _FREE_FORM.get(type(message))
    value = getattr(message, name) if name else None
    problem = _free_form_problem(value) if value else None
    if problem:
        raise MessageError(f"invalid message: `$.{name}` {problem}",
                           hint="config and details hold JSON-like data")
    return message


def _free_form_problem(value: object) -> str | None:
    """Why free-form data (config, details) cannot be stored canonically, or None.

    Iterative, so its answer never depends on the caller's stack depth: nesting past
    MAX_NESTING is refused, and so are map keys that are not strings (msgpack allows them,
    the canonical JSON and sorted encodings do not).
    """
    stack = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if level > MAX_NESTING:
            return f"is nested deeper than {MAX_NESTING} levels"
        if isinstance(item, dict):
            if any(not isinstance(k, str) for k in item):
                return "has a map key that is not a string"
            stack.extend((v, level + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, level + 1) for v in item)
    return None


def utc_now() -> _dt.datetime:
    """The current time, timezone-aware UTC."""
    return _dt.datetime.now(_dt.UTC)


def format_time(moment: _dt.datetime) -> str:
    """The one text form of a time in the store: UTC, microseconds, 'Z' (sorts as it reads)."""
    if moment.tzinfo is not _dt.UTC:  # decoded and utc_now() times are UTC already
        moment = moment.astimezone(_dt.UTC)
    text = moment.isoformat(timespec="microseconds")
    return text[:-6] + "Z"  # "+00:00" -> "Z"; isoformat is ~4x faster than strftime


# The only form ``format_time`` writes; ``fromisoformat`` takes many more, so a text is
# matched against this first.
_TIME_TEXT = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}Z")


def parse_time_text(text: str | None) -> _dt.datetime | None:
    """The inverse of ``format_time``: a store timestamp back to an aware UTC datetime.
    A ValueError for any other text (as ``strptime`` gave, at 20 times the cost: one call
    a page when a session's documents are recorded)."""
    if text is None:
        return None
    if _TIME_TEXT.fullmatch(text) is None:
        raise ValueError(f"time data {text!r} is not a store timestamp "
                         "(YYYY-MM-DDTHH:MM:SS.ffffffZ)")
    return _dt.datetime.fromisoformat(text)  # 'Z': datetime.UTC


def now_text() -> str:
    return format_time(utc_now())


class _RandomPool(threading.local):
    """Bytes from the system's random source, read 4 KiB at a time, per thread (never
    shared: two threads never take the same bytes). ``os.urandom`` lets go of the GIL for
    its system call, and each time it did the crawl's event loop waited for the writer's
    thread to give the GIL back: 5 ids a page cost ~8 us each in a crawl, against 0.3 us
    alone."""

    data = b""
    at = 0


_random = _RandomPool()


def _fresh_pool() -> None:
    global _random
    _random = _RandomPool()  # a child process never repeats the ids of its parent


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_pool)


def new_id(prefix: str = "") -> str:
    """A fresh, time-ordered id (UUIDv7 layout, hex): sorts by creation time; 76 bits of
    it from the system's random source.

    Time-ordered keys keep the hot indexes append-mostly (random keys made inserts 1.7x
    slower by 100,000 rows in the prototype measurements of issue 2).
    """
    millis = time.time_ns() // 1_000_000
    pool = _random
    at = pool.at
    if at + 10 > len(pool.data):
        pool.data, at = os.urandom(4096), 0
    pool.at = at + 10
    rand = int.from_bytes(pool.data[at:at + 10], "big")
    value = (millis << 80) | (0x7 << 76) | (rand & ((1 << 76) - 1))
    return f"{prefix}{value:032x}"
