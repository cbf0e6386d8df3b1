"""Compliance rules judged: their verdicts as evidence.

The rules file (its format and validation) is ``_crawl.rulesfile``. This module owns the
*rule input* of a page and its hash, judging one page (``evaluate_page``, pure:
bytes in, ``RuleEvaluated`` messages out) and judging stored captures again without
refetching (``evaluate_stored``, through the writer). docs/rules.md is the long form.

Invariants:

- A rule reads only its declared inputs: the response head artifact and the URL (every
  rule: applicability reads the status line and Content-Type), plus the document, the
  attempt's content (``selector``, ``link``, body ``regex``), or the attempt's
  ``elapsed_ms`` (``max_response_time``). Text is decoded by ``evidence._model.text``, the
  decoder links use too. ``input_hash`` is BLAKE3 over the canonical JSON description
  of exactly those inputs (``input_description``), so it can be computed from the
  database alone, before any byte is read, and anyone can recompute it from the row's
  ``details["input"]``.
- Bytes handed to ``evaluate_page`` must hash to the refs given with them; a mismatch
  raises instead of recording a verdict on other bytes than the hash names.
- A verdict and its ``details`` are a function of (rule definition, input) only: no
  clock, no randomness. So re-judging the same rule version on the same input restates
  recorded evidence (the writer acks it ``duplicate``) and a different answer is a
  ``conflict``, quarantined and reported, never an overwrite.
- ``details`` (its human ``reason`` included) is part of the verdict, so its wording is
  frozen with ``INPUT_FORMAT``: to change what a check writes, change the format, which
  gives every input a new hash (new rows), never a conflict with recorded ones.
- ``details["rule_hash"]`` pins the definition a verdict came from. ``check_rules``
  refuses a rule whose id and version were recorded with another definition: edit a
  rule, bump its version.
- Which attempts are pages: for every (run, URL), the run's current attempt
  (``url_current``), if it got an HTTP response. Superseded attempts (a 500 that was
  retried) are not judged by ``evaluate_stored``, and the report ignores them.
"""

from __future__ import annotations

import logging
import zlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal

import anyio
import apsw
import blake3
import msgspec
from selectolax.lexbor import LexborHTMLParser

from .._errors import (
    ArtifactCorruptError,
    ArtifactMissingError,
    NotFoundError,
    RulesError,
)
from .._errors import URLError as _URLError
from .._model.http1 import parse_head
from .._model.messages import RuleEvaluated, new_id, utc_now
from .._model.refs import ArtifactRef
from .._model.text import Sniffed, decode_document
from .._model.urls import resolve_reference
from .rulesfile import Rule, RuleSet

if TYPE_CHECKING:
    import datetime as dt

    from .._store.db import Store

__all__ = [
    "INPUT_FORMAT",
    "EvaluationSummary",
    "check_rules",
    "evaluate_page",
    "evaluate_stored",
    "input_description",
    "input_hash",
]

log = logging.getLogger("evidence.rules")

#: Names how inputs are described and read (body decoding included). Part of every hash:
#: a change to either is a new format, so old and new verdicts can never collide.
#: 2: the document is the attempt's content (wire capture), its text decoded as a browser
#: does (``evidence._model.text``: default windows-1252, WHATWG labels), heads read as h11 reads
#: them (bare LF, obs-fold), and a text-reading verdict names the encoding it read.
INPUT_FORMAT = "evidence-rule-input/2"
#: Decompressed bodies larger than this are not judged (verdict ``error``): a gzip bomb.
MAX_DECODED_BYTES = 32 * 1024 * 1024
_SNIPPET = 200
_HTML_TYPES = ("text/html", "application/xhtml+xml")
_json = msgspec.json.Encoder(order="sorted")

Verdict = Literal["pass", "fail", "error", "not_applicable"]


# --- the input of a rule -----------------------------------------------------------------

def _ref(ref: ArtifactRef | None) -> dict[str, Any] | None:
    return None if ref is None else {"namespace": ref.namespace, "digest": ref.digest,
                                     "size": ref.size}


def input_description(rule: Rule, *, url: str, headers_ref: ArtifactRef,
                      body_ref: ArtifactRef | None, body_truncated: bool,
                      elapsed_ms: float, decoded: bool = False,
                      content_coding: str | None = None,
                      max_bytes: int | None = None) -> dict[str, Any]:
    """What ``rule`` reads of one attempt: the objects whose canonical JSON is hashed.

    ``body_ref`` is the document: for a wire capture (``decoded``) the attempt's content
    (its ``content``, or its body when they are the same bytes), with the content codings
    the crawler removed; for an attempt recorded before wire capture, its stored body,
    whose content codings the reader removes. ``max_bytes``: the largest document rules
    read (a crawl's ``max_parse_bytes``); a document over it is not read, and the cap is
    then part of the input (``body["max_bytes"]``), since the verdict depends on it. A
    document within it is described as it always was.
    """
    description: dict[str, Any] = {"format": INPUT_FORMAT, "url": url,
                                   "response_headers": _ref(headers_ref)}
    if rule.reads_rendered:  # body_ref is a render's DOM (UTF-8, read as it is)
        description["input"] = "rendered"
    if rule.reads_body:
        body = _ref(body_ref)
        if body is not None:
            body |= {"truncated": body_truncated}
            if decoded:
                body |= {"decoded": True, "content_coding": content_coding}
            if max_bytes is not None and body["size"] > max_bytes:
                body |= {"max_bytes": max_bytes}
        description["body"] = body
    if rule.reads_elapsed:
        description["elapsed_ms"] = float(elapsed_ms)
    return description


def input_hash(description: Mapping[str, Any]) -> str:
    """BLAKE3 of the description as JSON: keys sorted, no whitespace, UTF-8."""
    return blake3.blake3(_json.encode(description)).hexdigest()


# --- judging one page --------------------------------------------------------------------

def _parse_head(head: bytes) -> tuple[int | None, dict[str, str]]:
    """Status and headers of a stored response head (names lowercased, repeats joined)."""
    status, fields = parse_head(head)
    headers: dict[str, str] = {}
    for name, value in fields:
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError:
            text = value.decode("latin-1")
        key = name.decode("latin-1").lower()
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    return status, headers


def _decode_body(raw: bytes, encoding: str) -> bytes:
    """Undo Content-Encoding (gzip, deflate; applied last first); ValueError if unable."""
    data = raw
    codings = [c.strip().lower() for c in encoding.split(",") if c.strip()]
    for coding in reversed(codings):
        if coding == "identity":
            continue
        if coding not in ("gzip", "x-gzip", "deflate"):
            raise ValueError(f"unsupported Content-Encoding {coding!r}")
        wbits = 16 + zlib.MAX_WBITS if "gzip" in coding else zlib.MAX_WBITS
        try:
            inflater = zlib.decompressobj(wbits)
            out = inflater.decompress(data, MAX_DECODED_BYTES + 1)
        except zlib.error as exc:
            raise ValueError(f"the {coding} body does not decompress: {exc}") from None
        if len(out) > MAX_DECODED_BYTES or inflater.unconsumed_tail:
            raise ValueError(f"the decoded body exceeds {MAX_DECODED_BYTES} bytes")
        if not inflater.eof:
            raise ValueError(f"the {coding} body is incomplete")
        data = out
    return data


def _codings(value: str) -> list[str]:
    """Content codings named in a header value, in order ("identity" means none)."""
    codings = [c.strip().lower() for c in value.split(",")]
    return [c for c in codings if c and c != "identity"]


def _snippet(text: str) -> str:
    return text if len(text) <= _SNIPPET else text[:_SNIPPET] + "…"


class _Page:
    """One attempt's inputs, parsed lazily: each view is built once, for every rule."""

    def __init__(self, url: str, head: bytes, body: bytes | None, body_truncated: bool,
                 elapsed_ms: float, decoded: bool = False,
                 content_coding: str | None = None, rendered: bool = False) -> None:
        self.url, self.raw_body, self.body_truncated = url, body, body_truncated
        self.rendered = rendered
        self.elapsed_ms = float(elapsed_ms)
        self.status, self.headers = _parse_head(head)
        self.decoded, self.content_coding = decoded, content_coding
        media, _, _params = self.headers.get("content-type", "").partition(";")
        self.media_type = media.strip().lower()

    @cached_property
    def body(self) -> bytes:
        """The document's content: as the crawler derived it (wire capture), or the stored
        body with its content codings removed (attempts recorded before wire capture)."""
        assert self.raw_body is not None
        if self.rendered:  # a serialized DOM: no coding to remove
            return self.raw_body
        if not self.decoded:
            return _decode_body(self.raw_body, self.headers.get("content-encoding", ""))
        named = _codings(self.headers.get("content-encoding", ""))
        removed = _codings(self.content_coding or "")
        left = named[:len(named) - len(removed)] if named[len(named) - len(removed):] == (
            removed) else named
        if left:
            raise ValueError(f"its content coding {', '.join(left)!r} was not removed by the "
                             "crawler (unsupported or damaged)")
        return self.raw_body

    @cached_property
    def decoded_text(self) -> tuple[str, Sniffed]:
        kind = "text/html; charset=utf-8" if self.rendered else self.headers.get("content-type")
        return decode_document(self.body, kind)

    @property
    def text(self) -> str:
        return self.decoded_text[0]

    @property
    def encoding(self) -> Sniffed:
        return self.decoded_text[1]

    @cached_property
    def dom(self) -> LexborHTMLParser:
        return LexborHTMLParser(self.text)

    @cached_property
    def links(self) -> list[tuple[str, str]]:
        """(absolute URL, text) of every a[href] and area[href], in document order."""
        base, encoding = self.url, self.encoding.encoding
        first_base = self.dom.css_first("base[href]")
        if first_base is not None:
            base = _resolve(self.url, first_base.attributes.get("href") or "",
                            encoding) or self.url
        links = []
        for node in self.dom.css("a[href], area[href]"):
            target = _resolve(base, node.attributes.get("href") or "", encoding)
            if target is None:
                continue
            text = " ".join(node.text(deep=True, separator="").split())
            if not text:
                img = node.css_first("img[alt]")
                text = " ".join((node.attributes.get("aria-label")
                                 or node.attributes.get("title")
                                 or node.attributes.get("alt")
                                 or (img.attributes.get("alt") if img is not None else "")
                                 or "").split())
            links.append((target, text))
        return links


def _resolve(base: str, href: str, encoding: str | None = None) -> str | None:
    try:
        return resolve_reference(base, href, encoding=encoding)
    except (_URLError, ValueError):
        return None


def _status_matches(status: int | None, wanted: Iterable[int | str]) -> bool:
    for w in wanted:
        if w == "any" or status == w or (
                isinstance(w, str) and status is not None and str(status)[0] == w[0]):
            return True
    return False


def _not_applicable(rule: Rule, page: _Page) -> str | None:
    scope = rule.applies_to
    if not _status_matches(page.status, scope.status):
        return f"status {page.status} is not in {', '.join(map(str, scope.status))}"
    if scope.url is not None and not rule._compiled["applies_to.url"].search(page.url):
        return f"the URL does not match `{scope.url}`"
    media = page.media_type or "none"
    if scope.content_type and not any(
            media == t or (t.endswith("/*") and media.startswith(t[:-1]))
            for t in scope.content_type):
        return f"Content-Type {media} is not in {', '.join(scope.content_type)}"
    if rule.type in ("selector", "link") and page.media_type not in _HTML_TYPES:
        return f"not an HTML document (Content-Type {media})"
    return None


def _expected(found: bool, expect: str, what: str, where: str) -> tuple[Verdict, str]:
    if expect == "match":
        return ("pass", f"{what} found {where}") if found else (
            "fail", f"{what} not found {where}; it must be")
    return ("fail", f"{what} found {where}; it must not be") if found else (
        "pass", f"{what} not found {where}")


def _check_selector(rule: Rule, page: _Page) -> tuple[Verdict, dict[str, Any]]:
    nodes = page.dom.css(rule.params["selector"])
    verdict, reason = _expected(bool(nodes), rule.params["expect"],
                                f"selector `{rule.params['selector']}`", "in the document")
    details: dict[str, Any] = {"reason": reason, "matches": len(nodes)}
    if nodes:
        details["first"] = _snippet(nodes[0].html or "")
    return verdict, details


def _check_regex(rule: Rule, page: _Page) -> tuple[Verdict, dict[str, Any]]:
    name = rule.params["header"]
    what = f"pattern `{rule.params['pattern']}`"
    subject: str | None
    if name is None:
        subject, where = page.text, "in the body"
    else:
        subject, where = page.headers.get(name), f"in header {name}"
        if subject is None:
            verdict, reason = _expected(False, rule.params["expect"], what, where)
            return verdict, {"reason": f"{reason} (the header is absent)", "header": None}
    match = rule._compiled["pattern"].search(subject)
    verdict, reason = _expected(match is not None, rule.params["expect"], what, where)
    details: dict[str, Any] = {"reason": reason}
    if match is not None:
        details |= {"match": _snippet(match.group(0)), "offset": match.start()}
    return verdict, details


def _check_header(rule: Rule, page: _Page) -> tuple[Verdict, dict[str, Any]]:
    name = rule.params["name"]
    value = page.headers.get(name)
    if value is None:
        return "fail", {"reason": f"required header {name} is absent", "value": None}
    return "pass", {"reason": f"header {name} is present", "value": _snippet(value)}


def _check_time(rule: Rule, page: _Page) -> tuple[Verdict, dict[str, Any]]:
    limit = rule.params["max_ms"]
    ok = page.elapsed_ms <= limit
    return ("pass" if ok else "fail"), {
        "reason": f"the response took {page.elapsed_ms:g} ms; the limit is {limit:g} ms",
        "elapsed_ms": page.elapsed_ms, "max_ms": limit}


def _check_link(rule: Rule, page: _Page) -> tuple[Verdict, dict[str, Any]]:
    url_re, text_re = rule._compiled.get("url"), rule._compiled.get("text")
    found = next(((u, t) for u, t in page.links
                  if (url_re is None or url_re.search(u))
                  and (text_re is None or text_re.search(t))), None)
    wanted = " and ".join(f"{k} `{rule.params[k]}`" for k in ("url", "text")
                          if rule.params[k] is not None)
    verdict, reason = _expected(found is not None, rule.params["expect"],
                                f"a link with {wanted}", f"among {len(page.links)} links")
    details: dict[str, Any] = {"reason": reason, "links": len(page.links)}
    if found is not None:
        details["found"] = {"url": _snippet(found[0]), "text": _snippet(found[1])}
    return verdict, details


_CHECKS = {"selector": _check_selector, "regex": _check_regex, "header": _check_header,
           "max_response_time": _check_time, "link": _check_link}


def _judge(rule: Rule, page: _Page, over: tuple[int, int] | None = None
           ) -> tuple[Verdict, dict[str, Any]]:
    """``over``: (the document's size, the cap) when it is over the cap on what rules
    read: then it is not read (its bytes may not have been handed over)."""
    reason = _not_applicable(rule, page)
    if reason is not None:
        return "not_applicable", {"reason": reason}
    if rule.reads_body:
        if page.raw_body is None and over is None:
            return "error", {"reason": "no body was stored for this attempt"}
        if page.body_truncated:
            return "error", {"reason": "the stored body is truncated (size cap or a failed "
                             "read): a verdict on part of a document would mislead"}
        if over is not None:
            return "error", {"reason": f"the document is {over[0]} bytes, over the cap of "
                             f"{over[1]} bytes on what rules read (the crawl's "
                             "--max-parse-bytes): it was not read"}
        try:
            page.body  # noqa: B018 - decode now, so a decoding problem is this rule's error
        except ValueError as exc:
            return "error", {"reason": f"the body cannot be read: {exc}"}
    try:
        verdict, details = _CHECKS[rule.type](rule, page)
        if rule.reads_body and not (rule.type == "regex" and rule.params["header"]):
            details |= {"encoding": page.encoding.encoding,
                        "encoding_source": page.encoding.source}
        return verdict, details
    except Exception as exc:  # recorded as the verdict, and logged: never a crashed crawl
        log.warning("rule %s v%s failed on %s", rule.id, rule.version, page.url,
                    exc_info=True, extra={"event": "rule.error"})
        return "error", {"reason": f"the check failed: {type(exc).__name__}: {exc}"}


def _check_bytes(data: bytes | None, ref: ArtifactRef | None, what: str) -> None:
    if ref is None or data is None:
        return
    if len(data) != ref.size or blake3.blake3(data).hexdigest() != ref.digest:
        raise RulesError(f"{what} bytes do not match {ref.namespace}/{ref.digest}",
                         hint="pass the exact stored bytes of the artifact the ref names",
                         digest=ref.digest)


def evaluate_page(rules: Iterable[Rule], *, url: str, attempt_id: str | None, run_id: str,
                  headers_bytes: bytes, body_bytes: bytes | None, headers_ref: ArtifactRef,
                  body_ref: ArtifactRef | None, elapsed_ms: float,
                  body_truncated: bool = False,
                  evaluated_at: dt.datetime | None = None, decoded: bool = False,
                  content_coding: str | None = None,
                  rendered: bool = False, max_bytes: int | None = None) -> list[RuleEvaluated]:
    """Judge one attempt by every rule: one ``RuleEvaluated`` per rule, nothing written.

    ``headers_bytes`` and ``body_bytes`` are the stored artifact bytes (the response head
    as recorded; the document) and must hash to ``headers_ref`` and ``body_ref``; ``url``
    is the URL as requested. For a wire capture (``decoded``) the document is the
    attempt's content and ``content_coding`` the codings the crawler removed; otherwise
    it is the stored body, still content-coded (``input_description``). ``rendered``: the
    document is a render's DOM (UTF-8) and ``rules`` are the ones that read it.
    ``max_bytes``: a document larger than this is not read (rules that read it give an
    ``error`` verdict, and their input names the cap), so its bytes may be left out
    (``body_bytes`` None with its ``body_ref``). Submit the result in the page's (or
    render's) writer group.
    """
    over = max_bytes is not None and body_ref is not None and body_ref.size > max_bytes
    if (body_bytes is None) != (body_ref is None) and not (over and body_bytes is None):
        raise RulesError("body_bytes and body_ref must be given together (or both None)",
                         hint="pass the stored body bytes with the ref that names them")
    _check_bytes(headers_bytes, headers_ref, "response head")
    _check_bytes(body_bytes, body_ref, "body")
    return _evaluate(rules, url=url, attempt_id=attempt_id, run_id=run_id,
                     head=headers_bytes, body=body_bytes,
                     headers_ref=headers_ref, body_ref=body_ref, elapsed_ms=elapsed_ms,
                     body_truncated=body_truncated, evaluated_at=evaluated_at or utc_now(),
                     decoded=decoded, content_coding=content_coding, rendered=rendered,
                     max_bytes=max_bytes)


def _evaluate(rules: Iterable[Rule], *, url: str, attempt_id: str | None, run_id: str,
              head: bytes,
              body: bytes | None, headers_ref: ArtifactRef, body_ref: ArtifactRef | None,
              elapsed_ms: float, body_truncated: bool, evaluated_at: dt.datetime,
              decoded: bool = False, content_coding: str | None = None,
              rendered: bool = False, max_bytes: int | None = None) -> list[RuleEvaluated]:
    page = _Page(url, head, body, body_truncated, elapsed_ms, decoded, content_coding,
                 rendered)
    over = ((body_ref.size, max_bytes) if max_bytes is not None and body_ref is not None
            and body_ref.size > max_bytes else None)
    messages = []
    for rule in rules:
        description = input_description(rule, url=url, headers_ref=headers_ref,
                                        body_ref=body_ref, body_truncated=body_truncated,
                                        elapsed_ms=elapsed_ms, decoded=decoded,
                                        content_coding=content_coding,
                                        max_bytes=max_bytes)
        verdict, details = _judge(rule, page, over)
        messages.append(RuleEvaluated(
            message_id=new_id("m-"), run_id=run_id, url=url, rule_id=rule.id,
            rule_version=rule.version, input_hash=input_hash(description), verdict=verdict,
            evaluated_at=evaluated_at, attempt_id=attempt_id,
            details=details | {"input": description, "rule_hash": rule.definition_hash}))
    return messages


# --- judging stored captures -------------------------------------------------------------

class EvaluationSummary(msgspec.Struct, frozen=True, kw_only=True):
    """What ``evaluate_stored`` did. ``added`` counts rows written by this call."""

    rules: list[str]  # "id@version"
    runs: list[str]  # runs that had pages to judge
    pages: int  # current attempts with an HTTP response that were considered
    added: int
    already_recorded: int  # same rule version, same input: present, not judged again
    duplicates: int  # judged again (recheck) and found identical to the recorded verdict
    conflicts: int  # judged again with another verdict: quarantined, the old row stands
    rejected: int
    unreadable: int  # pages skipped: an artifact is missing or does not match its digest
    verdicts: dict[str, dict[str, int]]  # "id@version" -> verdict -> added rows
    problems: list[str]  # the first conflicts, rejections and unreadable artifacts

    @property
    def ok(self) -> bool:
        return not (self.conflicts or self.rejected or self.unreadable)


def check_rules(conn: apsw.Connection, rules: Iterable[Rule]) -> None:
    """Refuse rules whose id and version were recorded with a different definition."""
    wanted = {(r.id, r.version): r.definition_hash for r in rules}
    ids = sorted({rule_id for rule_id, _ in wanted})
    rows = conn.execute(
        "SELECT DISTINCT rule_id, rule_version, json_extract(details, '$.rule_hash') "
        "FROM rule_evaluation WHERE rule_id IN (SELECT value FROM json_each(?))",
        (_json.encode(ids).decode(),)).fetchall()
    for rule_id, version, recorded in rows:
        mine = wanted.get((rule_id, version))
        if mine is not None and recorded is not None and recorded != mine:
            raise RulesError(
                f"rule {rule_id!r} version {version!r} was recorded with another definition "
                f"(hash {recorded}); this file defines it differently (hash {mine})",
                rule=rule_id, field="version",
                hint="a changed rule needs a new version: bump 'version' in the rules file")


_PAGES = """
SELECT f.attempt_seq FROM url_current c JOIN fetch_attempt f ON f.attempt_seq = c.attempt_seq
WHERE f.http_status IS NOT NULL AND f.response_headers_id IS NOT NULL
  AND (CAST(? AS TEXT) IS NULL OR c.run_id = ?)
ORDER BY f.attempt_seq
"""
_ATTEMPTS = """
SELECT f.attempt_id, f.run_id, f.url_id, f.url, f.elapsed_ms,
       f.body_truncated + f.content_truncated > 0, f.capture = 'wire', f.content_coding,
       h.namespace, h.digest, h.size, b.namespace, b.digest, b.size
FROM fetch_attempt f JOIN artifact h ON h.artifact_id = f.response_headers_id
LEFT JOIN artifact b ON b.artifact_id = coalesce(f.content_id, f.body_id)
WHERE f.attempt_seq IN (SELECT CAST(value AS BIGINT) FROM json_each(?)) ORDER BY f.attempt_seq
"""
_CHUNK = 256
_MAX_PROBLEMS = 50


def evaluate_stored(store: Store, rules: RuleSet | Sequence[Rule], *,
                    run_id: str | None = None, recheck: bool = False) -> EvaluationSummary:
    """Judge stored captures again, without refetching; new verdicts go through the writer.

    Pages are each run's current attempts with an HTTP response (only ``run_id``'s when
    given). A rule version whose input is already judged is skipped (``already_recorded``)
    unless ``recheck``: then it is judged and submitted again, and the writer acks an
    identical verdict ``duplicate`` and quarantines a different one (``conflict``). Old
    rows are never changed. Holds the store's crawl lock: no crawl may write meanwhile.
    Synchronous (it runs its own event loop); from async code, call it in a thread.
    """
    rules = tuple(r for r in rules if not r.reads_rendered)  # judged with their renders
    with store.writer_lock(), store.reader() as conn, store.errors():
        if run_id is not None and not conn.execute(
                "SELECT 1 FROM crawl_run WHERE run_id = ?", (run_id,)).fetchall():
            raise NotFoundError(f"no run {run_id!r} in the store", run_id=run_id,
                                hint="'evidence status' lists the runs")
        check_rules(conn, rules)
        seqs = [s for (s,) in conn.execute(_PAGES, (run_id, run_id))]
        return anyio.run(_evaluate_stored, store, conn, rules, seqs, recheck)


async def _evaluate_stored(store: Store, conn: apsw.Connection, rules: tuple[Rule, ...],
                           seqs: list[int], recheck: bool) -> EvaluationSummary:
    from .._write.writer import Writer

    counts: Counter[str] = Counter()
    verdicts: dict[str, Counter[str]] = {f"{r.id}@{r.version}": Counter() for r in rules}
    problems: list[str] = []
    runs: set[str] = set()

    def problem(text: str) -> None:
        if len(problems) < _MAX_PROBLEMS:
            problems.append(text)

    async with Writer(store) as writer:
        pending: list[RuleEvaluated] = []

        async def flush() -> None:
            acks = await writer.submit_group(pending)
            for message, ack in zip(pending, acks, strict=True):
                counts[ack.status] += 1
                if ack.status == "committed":
                    verdicts[f"{message.rule_id}@{message.rule_version}"][message.verdict] += 1
                elif ack.status in ("conflict", "rejected"):
                    problem(f"{ack.status}: {message.url} rule {message.rule_id} "
                            f"v{message.rule_version}: {ack.reason}")
            pending.clear()

        for start in range(0, len(seqs), _CHUNK):
            chunk = _json.encode(seqs[start:start + _CHUNK]).decode()
            for row in conn.execute(_ATTEMPTS, (chunk,)).fetchall():
                (attempt_id, run, url_id, url, elapsed_ms, truncated, wire, coding,
                 h_ns, h_digest, h_size, b_ns, b_digest, b_size) = row
                decoded = bool(wire)
                runs.add(run)
                counts["pages"] += 1
                head_ref = ArtifactRef(h_ns, h_digest, h_size)
                body_ref = None if b_ns is None else ArtifactRef(b_ns, b_digest, b_size)
                recorded = set() if recheck else set(conn.execute(
                    "SELECT rule_id, rule_version, input_hash FROM rule_evaluation "
                    "WHERE run_id = ? AND url_id = ?", (run, url_id)))
                todo = []
                for rule in rules:
                    description = input_description(
                        rule, url=url, headers_ref=head_ref, body_ref=body_ref,
                        body_truncated=bool(truncated), elapsed_ms=elapsed_ms,
                        decoded=decoded, content_coding=coding)
                    if (rule.id, rule.version, input_hash(description)) in recorded:
                        counts["already_recorded"] += 1
                    else:
                        todo.append(rule)
                if not todo:
                    continue
                try:
                    head = store.artifacts.read(head_ref, verify=True)
                    body = None
                    if body_ref is not None and any(r.reads_body for r in todo):
                        body = store.artifacts.read(body_ref, verify=True)
                except (ArtifactMissingError, ArtifactCorruptError) as exc:
                    counts["unreadable"] += 1
                    problem(f"unreadable: {url} attempt {attempt_id}: {exc}")
                    continue
                pending += _evaluate(
                    todo, url=url, attempt_id=attempt_id, run_id=run, head=head, body=body,
                    headers_ref=head_ref, body_ref=body_ref, elapsed_ms=elapsed_ms,
                    body_truncated=bool(truncated), evaluated_at=utc_now(), decoded=decoded,
                    content_coding=coding)
                if len(pending) >= _CHUNK:
                    await flush()
        if pending:
            await flush()
    return EvaluationSummary(
        rules=list(verdicts), runs=sorted(runs), pages=counts["pages"],
        added=counts["committed"], already_recorded=counts["already_recorded"],
        duplicates=counts["duplicate"], conflicts=counts["conflict"],
        rejected=counts["rejected"], unreadable=counts["unreadable"],
        verdicts={k: dict(sorted(v.items())) for k, v in verdicts.items()},
        problems=problems)
