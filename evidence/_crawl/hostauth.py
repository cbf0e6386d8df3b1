"""Accountable worker hosts: who a host is, and what it may submit (issue 30 point 3).

A worker host (``evidence worker --connect``) is trusted to fetch; it is not trusted to
say anything else. Two things make what it says accountable:

- **Who it is.** The coordinator's ``--hosts-file`` names each host and the SHA-256 of
  that host's own token (``load_hosts``). The writer service admits a TCP connection only
  with one of those tokens, knows which host it is from the token (never from a name the
  host gives), and records that name as the submitter of every message it submits
  (``ingest_ledger.submitter``, covered by the Merkle leaf: ``_model.messages.ledger_entry``).
  Without a hosts file all hosts share ``--token-file``, and the submitter is the name the
  coordinator gave the host's channel (``worker host ADDRESS #N``): its source address.
- **What it may say.** A host submits only the evidence of the pages leased to it now
  (``check_submission``): their attempts, the rule verdicts and discoveries of those
  attempts (in the same group), their settlement, their host's backoff, and the URLs their
  links queue (in the crawl's scope, as the coordinator judges it). Anything else, an
  attempt for a URL it was never leased or a message kind a host never sends, is refused
  whole, nothing of it written, and the host is fenced as at fault (``WorkerPool``).

What a host may still do is lie about the pages it was leased. ``CrossCheck``
(``--cross-check FRACTION``) has the coordinator fetch a sample of them again itself and
record whether the content matched, as evidence of its own.

The file's form::

    # hosts.toml: one table per worker host
    [hosts.fetcher-1]
    token_sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"

    [hosts.fetcher-2]
    token_file = "fetcher-2.token"   # or the token itself, in a file of mode 600

``token_sha256`` is the hex SHA-256 of the token as the host's token file holds it
(surrounding whitespace removed), so the coordinator's file holds no secret;
``token_file`` (relative to the hosts file) reads the token itself.
"""

from __future__ import annotations

import hashlib
import logging
import re
import tomllib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from .._errors import EvidenceError, URLError
from .._model.messages import (
    Discovery,
    FetchAttempt,
    FrontierUpdate,
    HostUpdate,
    Message,
    RuleEvaluated,
    new_id,
    utc_now,
)
from .._model.urls import url_host
from .._write.wire import read_token
from .pages import PageEffects, PageOrder

__all__ = ["CROSS_CHECK_RULE", "HOST_NAME", "CrossCheck", "check_submission", "load_hosts"]

log = logging.getLogger("evidence.crawl")

HOST_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_DIGEST = re.compile(r"^[0-9a-f]{64}$")


def load_hosts(path: Path | str) -> dict[str, bytes]:
    """Host name -> SHA-256 of its token, from a hosts file; any defect an ``EvidenceError``
    naming the file and the host."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise EvidenceError(f"{path}: cannot read the hosts file ({exc.strerror})",
                            path=str(path), hint="give the TOML file naming each worker "
                            "host and its token's SHA-256 (docs/scale.md)") from None
    except UnicodeDecodeError as exc:
        raise EvidenceError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})",
                            path=str(path), hint="save the hosts file as UTF-8") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise EvidenceError(f"{path}: not valid TOML: {exc}", path=str(path),
                            hint="fix the syntax at the line and column given") from None
    unknown = sorted(set(data) - {"hosts"})
    hosts = data.get("hosts")
    if unknown or not isinstance(hosts, dict) or not hosts:
        raise EvidenceError(f"{path}: names no worker hosts" + (
            f" (unknown key {unknown[0]!r})" if unknown else ""), path=str(path),
            hint="one table per host: [hosts.NAME] with token_sha256 = \"HEX\" or "
            "token_file = \"FILE\"")
    found: dict[str, bytes] = {}
    owners: dict[bytes, str] = {}
    for name, table in hosts.items():
        digest = _digest(path, name, table)
        if digest in owners:
            raise EvidenceError(f"{path}: hosts {owners[digest]!r} and {name!r} have the "
                                "same token", path=str(path),
                                hint="give each host a token of its own: that is what "
                                "tells them apart")
        owners[digest] = name
        found[name] = digest
    return found


def _digest(path: Path, name: str, table: object) -> bytes:
    where = f"{path}: host {name!r}"
    if not HOST_NAME.match(name):
        raise EvidenceError(f"{where}: a host name is 1 to 64 letters, digits, '.', '_' "
                            "or '-', starting with a letter or digit", path=str(path),
                            hint="rename the [hosts.NAME] table")
    if not isinstance(table, dict) or len(table) != 1 or not (
            set(table) <= {"token_sha256", "token_file"}):
        raise EvidenceError(f"{where}: give exactly one of token_sha256 and token_file",
                            path=str(path), hint="token_sha256 = \"64 hex digits\", the "
                            "SHA-256 of the host's token (sha256sum of its token file, "
                            "without the newline)")
    value = next(iter(table.values()))
    if not isinstance(value, str):
        raise EvidenceError(f"{where}: {next(iter(table))} must be a string",
                            path=str(path), hint="quote it")
    if "token_file" in table:
        return hashlib.sha256(read_token(path.parent / value).encode()).digest()
    if not _DIGEST.match(value):
        raise EvidenceError(f"{where}: token_sha256 is not 64 lowercase hex digits",
                            path=str(path), hint="printf %s \"$(cat TOKEN_FILE)\" | "
                            "sha256sum")
    return bytes.fromhex(value)


def check_submission(messages: Sequence[Message], *, leased: Mapping[str, PageOrder],
                     run_id: str, session_id: str,
                     out_of_scope: Callable[[str, int], str | None]) -> str | None:
    """Why a worker host may not submit ``messages`` (one request, all or nothing), or None.

    ``leased``: the URLs leased to it now, with their orders. ``out_of_scope``: the
    crawl's scope rule (a URL and depth -> the reason it is not fetched, or None).
    """
    attempts = {m.attempt_id: m.url for m in messages if isinstance(m, FetchAttempt)}
    refs: set[str] = set()
    for message in messages:
        if isinstance(message, Discovery):
            refs.update(ref.url for ref in message.refs)
    for message in messages:
        kind = type(message).__struct_config__.tag
        other = getattr(message, "run_id", run_id)
        if other != run_id:
            return f"a {kind} message of another run ({other})"
        why = _refused(message, leased, attempts, refs, session_id, out_of_scope)
        if why is not None:
            return why
    return None


def _refused(message: Message, leased: Mapping[str, PageOrder], attempts: Mapping[str, str],
             refs: set[str], session_id: str,
             out_of_scope: Callable[[str, int], str | None]) -> str | None:
    if isinstance(message, FetchAttempt):
        if message.url not in leased:
            return f"an attempt for {message.url}, which is not leased to it"
        if message.render_id is not None:
            return f"an attempt of a render ({message.url}): only the coordinator renders"
        return None
    if isinstance(message, Discovery):
        if message.source_attempt_id not in attempts or message.render_id is not None:
            return (f"links found by attempt {message.source_attempt_id}, not one it "
                    "submits with them")
        return None
    if isinstance(message, RuleEvaluated):
        if message.attempt_id not in attempts or message.url not in leased:
            return f"a rule verdict on {message.url} without its attempt"
        return None
    if isinstance(message, HostUpdate):
        hosts = {order.host or url_host(order.url) for order in leased.values()}
        if message.host not in hosts or message.robots_attempt_id is not None \
                or message.robots_expires_at is not None or message.crawl_delay is not None:
            return f"a host update for {message.host}, not the backoff of a page it holds"
        return None
    if isinstance(message, FrontierUpdate):
        return _frontier_refused(message, leased, attempts, refs, session_id, out_of_scope)
    return f"a {type(message).__struct_config__.tag} message, which a worker host never sends"


def _frontier_refused(message: FrontierUpdate, leased: Mapping[str, PageOrder],
                      attempts: Mapping[str, str], refs: set[str], session_id: str,
                      out_of_scope: Callable[[str, int], str | None]) -> str | None:
    if message.session_id != session_id:
        return f"a frontier update of another session ({message.session_id})"
    if message.claimed:
        return f"a claim of {message.claimed[0]}: only the coordinator claims"
    for settled in message.settled:
        if settled.url not in leased:
            return f"a settlement of {settled.url}, which is not leased to it"
    for queued in message.queued:
        order = leased.get(attempts.get(queued.source_attempt_id or "", ""))
        if queued.url not in refs or order is None:
            return (f"{queued.url} queued without a link to it found by an attempt it "
                    "submits")
        if queued.depth > order.depth + 1:
            return f"{queued.url} queued at depth {queued.depth}, below its page's links"
        if queued.skip is None:
            try:
                why = out_of_scope(queued.url, queued.depth)
            except URLError as exc:
                why = f"invalid URL: {exc}"
            if why is not None:
                return f"{queued.url} queued to be fetched, and the crawl's rule says {why}"
    return None


# --- spot checks: the coordinator fetches a sample of the hosts' pages again ------------

CROSS_CHECK_RULE = "evidence.cross-check"
CROSS_CHECK_VERSION = "1"

_HOST_ATTEMPT = (
    "SELECT a.attempt_id, a.sequence, a.outcome, a.http_status, b.digest, c.digest, "
    "l.submitter FROM fetch_attempt a JOIN ingest_ledger l ON l.log_index = a.log_index "
    "LEFT JOIN artifact b ON b.artifact_id = a.body_id "
    "LEFT JOIN artifact c ON c.artifact_id = a.content_id "
    "WHERE a.run_id = ? AND a.url = ? AND a.render_seq IS NULL "
    "ORDER BY a.sequence DESC LIMIT 1")


class CrossCheck:
    """``--cross-check FRACTION``: once a worker host's page has committed, the coordinator
    fetches a sample of them again itself and records whether the content matched.

    The sample is a fixed share of URLs, chosen by hashing the run id and the URL (another
    run samples others; nothing a host does moves it). The coordinator's fetch is an
    attempt of its own (no submitter, the next sequence of that URL in the run), and the
    comparison a ``rule_evaluated`` record of the built-in rule ``evidence.cross-check``
    v1 on that attempt: ``pass`` when the status and the content's BLAKE3 digest are the
    host's, ``fail`` when either differs (as a page that changes between two fetches does
    too), ``error`` when the coordinator's own fetch got no response. Its details name the
    host, both attempts and both digests. Both are in the Merkle log and every export.
    """

    def __init__(self, fraction: float, *, run_id: str, read: Callable[[], Any],
                 fetch: Callable[[str, int], Awaitable[Any]],
                 submit: Callable[[Sequence[Message]], Awaitable[Any]]) -> None:
        self.fraction = fraction
        self.run_id = run_id
        self._read = read  # -> a connection reading the store (the crawl's reader)
        self._fetch = fetch  # (url, sequence) -> FetchResult, the coordinator's own fetch
        self._submit = submit  # the crawl's writer: no submitter
        self.checked = 0
        self.mismatched = 0

    def sampled(self, url: str) -> bool:
        digest = hashlib.sha256(f"{self.run_id}\n{url}".encode()).digest()
        return int.from_bytes(digest[:8], "big") < self.fraction * 2 ** 64

    async def __call__(self, order: PageOrder, effects: PageEffects) -> None:
        """Check ``order``'s page (just committed by a worker host), if it is sampled and
        settled: a page requeued for a retry is claimed again (the next claim's attempt
        takes the next sequence), one left to render or unchanged is the coordinator's."""
        if not self.sampled(order.url) or effects.retry_in is not None \
                or effects.render is not None or effects.unchanged is not None:
            return
        rows = self._read().execute(_HOST_ATTEMPT, (self.run_id, order.url)).fetchall()
        if not rows or rows[0][6] is None or rows[0][2] != "response":
            return  # the host recorded no response (or the coordinator settled the page)
        host_attempt, sequence, _outcome, host_status, body, content, host = rows[0]
        result = await self._fetch(order.url, sequence + 1)
        mine = result.attempt
        own = (mine.content or mine.body).digest if (mine.content or mine.body) else None
        theirs = content or body
        verdict: Literal["pass", "fail", "error"]
        if mine.outcome != "response":
            verdict = "error"
        elif mine.http_status == host_status and own == theirs:
            verdict = "pass"
        else:
            verdict = "fail"
        details = {"host": host, "host_attempt_id": host_attempt, "host_status": host_status,
                   "host_content": theirs, "status": mine.http_status, "content": own,
                   "outcome": mine.outcome}
        evaluated = RuleEvaluated(
            message_id=new_id("m-"), run_id=self.run_id, url=order.url,
            rule_id=CROSS_CHECK_RULE, rule_version=CROSS_CHECK_VERSION,
            input_hash=hashlib.sha256("\n".join(
                [host_attempt, str(theirs), mine.attempt_id, str(own)]).encode()).hexdigest(),
            verdict=verdict, evaluated_at=utc_now(), attempt_id=mine.attempt_id,
            details=details)
        await self._submit([mine, evaluated])
        self.checked += 1
        if verdict == "pass":
            log.info("cross-check of %s: the content matched what %s recorded", order.url,
                     host, extra={"event": "crawl.cross_check"})
            return
        self.mismatched += 1
        log.warning("cross-check of %s: %s (host %s recorded HTTP %s, content %s; this "
                    "fetch: %s, HTTP %s, content %s)", order.url,
                    "no response here" if verdict == "error" else "the content differs",
                    host, host_status, (theirs or "none")[:16], mine.outcome,
                    mine.http_status, (own or "none")[:16],
                    extra={"event": "crawl.cross_check"})
