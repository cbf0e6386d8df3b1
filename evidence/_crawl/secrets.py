"""What a crawl adds to its requests (headers, cookies, credentials), and how the secret
ones are kept out of what is exported while the evidence still proves what was sent.

    options = RequestOptions.build(headers=["Accept-Language: fr"], hosts=[...],
                                   cookies=[...], secrets=load_secrets(path))
    added = options.for_url(url)             # .headers to send, .secrets among their values
    redacted, opening = redact(exchange.sent, added.secrets)

**Where each option comes from.** ``--header`` (every host), a ``[[hosts]]`` table of the
configuration file (``match`` a host pattern; ``headers``, ``cookies``), ``--cookies FILE``
(Netscape ``cookies.txt``), and the secrets file (``--secrets FILE``, TOML, readable by its
owner only, as ``--dsn-file``): ``[[hosts]]`` tables with ``username``/``password`` and
``auth = "basic"`` or ``"digest"`` (``_crawl.digest``), and headers and cookies whose
values are secret. A credential is never a flag's value (every user of the machine can
read a command line), and a header that carries one (``Authorization``,
``Proxy-Authorization``, ``Cookie``) is refused in ``--header`` and in the configuration
file. The session's recorded configuration (``CrawlConfig.request``) says what was added
where, with each secret value left out: a resumed run must be given the same options.

**Secrets in the evidence.** What a request carried is evidence: a page seen logged in
proves nothing unless the record shows how. But a password, or a session cookie someone
could replay, must not be handed to whoever receives an export. So each secret value in
the request as written is replaced, in the stored request (``request_headers``: what WARC,
WACZ, ``show`` and ``replay`` read), by a *commitment*: ``[secret sha256:<hex>]``, the
SHA-256 of a fresh 32-byte random salt followed by the value. The exact bytes and each
salt (the *opening*) are stored apart, in the ``secrets`` namespace, referenced by the
attempt as ``request_secrets``. Both references are under the attempt's Merkle leaf, so a
proof of the attempt holds whichever form is shown. Whoever holds the opening can show a
court the exact request: replacing each of its spans by the commitment of its salt and
bytes gives the stored request, byte for byte, whose digest the signed leaf names
(``open_request``). Without it, the commitment reveals nothing: the salt is 256 random
bits, so a guessed password cannot be checked against it, and the opening's own digest is
of bytes that contain the salts. Exports leave the ``secrets`` namespace out unless asked
(``--include-secrets``), and logs never carry a header value.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import os
import re
import secrets as _random
import stat
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus, urlsplit

import msgspec

from .._errors import EvidenceError
from .._model.messages import parse_time_text
from .._model.refs import ArtifactRef
from .._store.backend import ArtifactBackend
from .cookies import Cookie, CookieJar
from .digest import Challenge, authorization, parse_challenge
from .loginrecipe import LoginRecipe, NamedLogin, SeedLogin, login_tables, resolve_login

__all__ = ["WORKER_HOSTS_HINT", "WORKER_HOSTS_REFUSAL", "Added", "HostOptions", "Opening",
           "RequestOptions", "Secrets", "load_secrets", "new_challenge", "open_request",
           "parse_header", "redact", "set_cookies"]

SECRETS_NS = "secrets"
# Why request options are refused with worker hosts (docs/security.md, "Secrets a crawl
# sends"): the secrets would have to travel to other machines.
WORKER_HOSTS_REFUSAL = ("headers, cookies, credentials and logins are not sent to worker "
                        "hosts: the secrets file, the cookie jar and the login stay on this "
                        "machine, never sent over the network")
WORKER_HOSTS_HINT = ("leave out --listen for this crawl (--processes N spreads it over this "
                     "machine's cores and keeps them here)")
SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie"})
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_BAD_VALUE = re.compile(r"[\r\n\x00]")
_MARK = re.compile(rb"\[secret sha256:([0-9a-f]{64})\]")
_AUTH = ("basic", "digest")


def parse_header(text: str, *, where: str = "--header") -> tuple[str, str]:
    """``Name: value`` as (name, value); a name that is not a token, a value with a line
    break, or no colon is an error naming ``where``."""
    name, colon, value = text.partition(":")
    name, value = name.strip(), value.strip()
    if not colon or not _TOKEN.fullmatch(name):
        raise EvidenceError(f"{where}: {text[:80]!r} is not a header",
                            hint="write it as 'Name: value', e.g. 'Accept-Language: fr'")
    if _BAD_VALUE.search(value):
        raise EvidenceError(f"{where}: the value of {name} has a line break",
                            hint="a header's value is one line")
    return name, value


def _public_header(name: str, where: str) -> None:
    if name.lower() in SECRET_HEADERS:
        raise EvidenceError(f"{where}: {name} carries a credential and cannot be given here",
                            hint="put it in the secrets file (--secrets FILE, mode 600): "
                            "username/password for credentials, [hosts.cookies] for cookies")


class HostOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True,
                  omit_defaults=True):
    """What is added to requests to hosts matching ``match`` (a pattern over the host, or
    over ``host:port`` if it has a colon; ``*`` any run of characters, ``*`` alone every
    host). Values of ``secret_headers`` and ``cookies`` not in ``public_cookies`` are
    sealed; ``password`` is never recorded."""

    match: str = "*"
    headers: dict[str, str] = {}
    secret_headers: dict[str, str] = {}
    cookies: dict[str, str] = {}
    public_cookies: list[str] = []
    username: str | None = None
    password: str | None = None
    auth: str = "basic"

    def __repr__(self) -> str:  # a traceback or a debug line never shows a secret
        return f"HostOptions({self.as_record()!r})"

    def applies_to(self, host: str, port: int) -> bool:
        subject = f"{host}:{port}" if ":" in self.match else host
        return fnmatch.fnmatchcase(subject, self.match.lower())

    def as_record(self) -> dict[str, object]:
        """What the session's configuration records: every name, no secret value."""
        record: dict[str, object] = {"match": self.match}
        if self.headers:
            record["headers"] = dict(self.headers)
        if self.secret_headers:
            record["secret_headers"] = sorted(self.secret_headers)
        if self.cookies:
            record["cookies"] = {k: v if k in self.public_cookies else None
                                 for k, v in sorted(self.cookies.items())}
        if self.username is not None:
            record.update(username=self.username, auth=self.auth)
        return record


def _host_options(table: object, where: str, *, secret_file: bool) -> HostOptions:
    try:
        options = msgspec.convert(table, HostOptions)
    except msgspec.ValidationError as exc:
        raise EvidenceError(f"{where}: {exc}", hint="a [[hosts]] table takes match, headers, "
                            "cookies, public_cookies" + (", secret_headers, username, "
                            "password, auth" if secret_file else "")) from None
    if not options.match.strip():
        raise EvidenceError(f"{where}: match is empty", hint="name a host pattern, e.g. "
                            "'*.example.com', or '*' for every host")
    for name, value in {**options.headers, **options.secret_headers}.items():
        parse_header(f"{name}: {value}", where=where)
    for name in options.headers:
        _public_header(name, where)
    if not secret_file:
        for key in ("secret_headers", "username", "password"):
            if getattr(options, key):
                raise EvidenceError(f"{where}: {key} belongs in the secrets file",
                                    hint="give it with --secrets FILE (mode 600), never in "
                                    "the configuration, which is recorded and exported")
    if (options.username is None) != (options.password is None):
        raise EvidenceError(f"{where}: username and password go together",
                            hint="give both, or neither")
    if options.auth not in _AUTH:
        raise EvidenceError(f"{where}: auth {options.auth!r} is not supported",
                            hint="auth = \"basic\" (sent with every request to the host) or "
                            "\"digest\" (answering the host's challenge)")
    if options.username is not None and ":" in options.username and options.auth == "basic":
        raise EvidenceError(f"{where}: a basic username cannot contain ':'",
                            hint="RFC 7617 section 2")
    return options


def host_tables(tables: object, where: str) -> list[HostOptions]:
    """The ``[[hosts]]`` tables of the configuration file (no secret may be there)."""
    if not isinstance(tables, list):
        raise EvidenceError(f"{where}: hosts must be an array of tables",
                            hint="write each as [[hosts]] with a match = \"...\" line")
    return [_host_options(t, f"{where}, hosts[{i}]", secret_file=False)
            for i, t in enumerate(tables)]


@dataclass(frozen=True)
class Secrets:
    """The secrets file's host tables (credentials, secret headers and cookies) and login
    recipes (``_crawl.login``)."""

    hosts: tuple[HostOptions, ...] = ()
    logins: tuple[LoginRecipe, ...] = ()
    named: dict[str, NamedLogin] = field(default_factory=dict)  # logins seeds name


def load_secrets(path: str) -> Secrets:
    """Read the secrets file: TOML, ``[[hosts]]`` tables only, readable by its owner only
    (refused otherwise, as ``--dsn-file`` is). Errors name the file, never its content."""
    where = f"the secrets file {path}"
    try:
        status = os.stat(path)
        data = Path(path).read_bytes()
    except OSError as exc:
        raise EvidenceError(f"cannot read {where}: {exc.strerror}",
                            hint="check the path given to --secrets") from None
    if status.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise EvidenceError(f"{where} can be read by other users",
                            hint=f"chmod 600 {path}")
    try:
        table = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        line = getattr(exc, "lineno", None)
        raise EvidenceError(f"{where} is not valid TOML" + (f" (line {line})" if line else ""),
                            hint="fix that line (https://toml.io)") from None
    unknown = sorted(set(table) - {"hosts", "logins"})
    if unknown:
        raise EvidenceError(f"{where}: unknown key {unknown[0]!r}",
                            hint="the secrets file holds [[hosts]] and [[logins]] tables")
    tables = table.get("hosts", [])
    if not isinstance(tables, list):
        raise EvidenceError(f"{where}: hosts must be an array of tables",
                            hint="write each as [[hosts]] with a match = \"...\" line")
    logins, named = login_tables(table.get("logins", []), where)
    return Secrets(tuple(_host_options(t, f"{where}, hosts[{i}]", secret_file=True)
                         for i, t in enumerate(tables)), tuple(logins), named)


@dataclass(frozen=True)
class Added:
    """What goes into one request: its extra header fields, and which of their values are
    secret (sealed in the stored request)."""

    headers: dict[str, str]
    secrets: list[str]


@dataclass
class RequestOptions:
    """Every host table in order (later tables override earlier ones for a header name),
    the user's cookies, and the session's jar."""

    hosts: list[HostOptions] = field(default_factory=list)
    jar: CookieJar = field(default_factory=CookieJar)
    supplied: list[str] = field(default_factory=list)  # "domain path name" of --cookies
    challenges: dict[str, Challenge] = field(default_factory=dict)  # digest, per host:port
    # Per-seed headers (``_crawl.seeds``): recorded with the seeds, not in ``as_record``.
    seed_hosts: list[HostOptions] = field(default_factory=list)
    logins: list[LoginRecipe] = field(default_factory=list)  # ``_crawl.login``
    # The localStorage each origin's last login left (origin -> items), given to every
    # later render of that origin (``_crawl.login``): with the jar, the storage state.
    storage: dict[str, dict[str, str]] = field(default_factory=dict)
    # The secrets file's named logins: they run for the seeds that name them.
    named_logins: dict[str, NamedLogin] = field(default_factory=dict)

    @classmethod
    def build(cls, *, headers: Sequence[str] = (), hosts: Sequence[HostOptions] = (),
              cookies: Iterable[Cookie] = (), secrets: Secrets = Secrets()) -> RequestOptions:
        every = []
        if headers:
            pairs = [parse_header(h) for h in headers]
            for name, _ in pairs:
                _public_header(name, "--header")
            every.append(HostOptions(match="*", headers=dict(pairs)))
        every += [*hosts, *secrets.hosts]
        cookies = list(cookies)
        options = cls(hosts=every, jar=CookieJar(cookies),
                      supplied=sorted(f"{c.domain} {c.path} {c.name}" for c in cookies),
                      logins=list(secrets.logins), named_logins=dict(secrets.named))
        for table in every:
            for name, value in table.cookies.items():
                options.jar.add(Cookie(name=name, value=value, domain=table.match.lower(),
                                       secret=name not in table.public_cookies))
        return options

    def as_record(self) -> list[dict[str, object]]:
        """What the session records: each host table, then the supplied cookies' names."""
        record = [h.as_record() for h in self.hosts]
        if self.supplied:
            record.append({"cookies_file": list(self.supplied)})
        record += [{"login": recipe.as_record()} for recipe in self.logins]
        return record

    def use_seed_logins(self, seeds: Sequence[Any], where: str) -> None:
        """Add the logins the seeds name (``SeedOptions.login``: a name, or a
        ``SeedLogin``) to those that run: one per origin, each seed's parts over its named
        login's."""
        for seed in seeds:
            if seed.login is None:
                continue
            given = seed.login if isinstance(seed.login, SeedLogin) else None
            name = seed.login if given is None else given.name
            if name not in self.named_logins:
                raise EvidenceError(f"{where}: the seed {seed.url} names the login {name!r}, "
                                    "and the secrets file has none by that name",
                                    hint=f"add name = \"{name}\" to a [[logins]] table of "
                                    "the file given to --secrets")
            recipe = resolve_login(self.named_logins[name], given, f"{where}, {seed.url}")
            same = [r for r in self.logins if r.origin == recipe.origin]
            if same and same[0] != recipe:
                raise EvidenceError(f"{where}: the seed {seed.url} names a login for "
                                    f"{recipe.origin}, which has another login already",
                                    hint="one login per origin: name the same login in "
                                    "each seed of the origin")
            if not same:
                self.logins.append(recipe)

    def login_for(self, url: str) -> LoginRecipe | None:
        return next((r for r in self.logins if r.applies_to(url)), None)

    def credentials(self, host: str, port: int) -> HostOptions | None:
        found = None
        for table in self.hosts:
            if table.username is not None and table.applies_to(host, port):
                found = table
        return found

    def for_url(self, url: str, method: str = "GET") -> Added:
        """The fields to add to a request for ``url``, and the secret values among them."""
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        port = parts.port or (443 if parts.scheme == "https" else 80)
        headers: dict[str, str] = {}
        hidden: list[str] = []
        for table in [*self.seed_hosts, *self.hosts]:
            if table.applies_to(host, port):
                headers.update(table.headers)
                headers.update(table.secret_headers)
                hidden += [v for v in table.secret_headers.values() if v]
        cookie, secret_cookies = _jar_header(self.jar, url, host, port)
        if cookie is not None:
            headers["Cookie"] = cookie
            hidden += secret_cookies
        found = self.credentials(host, port)
        if found is not None and found.password is not None and found.username is not None:
            value = None
            if found.auth == "basic":
                token = f"{found.username}:{found.password}".encode()
                value = "Basic " + base64.b64encode(token).decode("ascii")
            elif f"{host}:{port}" in self.challenges:
                target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
                value = authorization(self.challenges[f"{host}:{port}"], found.username,
                                      found.password, method, target)
            if value is not None:
                headers["Authorization"] = value
                hidden.append(value)
        return Added(headers, hidden)


    def challenged(self, url: str, head: bytes) -> bool:
        """Whether a 401 answer (its head as read) brought a digest challenge this crawl
        can answer and has not answered yet (a new nonce, or a stale one): kept for the
        host, so the page's next attempt answers it (``_crawl.digest``)."""
        where = self._digest_host(url)
        if where is None:
            return False
        known = self.challenges.get(where)
        challenge = new_challenge(head, None if known is None else known.nonce)
        if challenge is not None:
            self.challenges[where] = challenge
        return challenge is not None

    def digest_nonce(self, url: str) -> str | None:
        """For a worker process's order (``PageOrder.digest``): None when ``url``'s host
        has no digest credentials, else the nonce this crawl answers there ("" if none
        yet), so that the worker retries a page on a challenge this crawl would answer."""
        where = self._digest_host(url)
        if where is None:
            return None
        known = self.challenges.get(where)
        return "" if known is None else known.nonce

    def _digest_host(self, url: str) -> str | None:
        """``host:port`` of ``url`` when this crawl has digest credentials for it."""
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        port = parts.port or (443 if parts.scheme == "https" else 80)
        found = self.credentials(host, port)
        return None if found is None or found.auth != "digest" else f"{host}:{port}"

    def merge(self, url: str, theirs: dict[str, str],
              method: str = "GET") -> tuple[dict[str, str], list[str]]:
        """A browser's request headers with this crawl's added: a field the browser set
        itself stays, except ``Cookie``, where the jar's cookies it lacks are appended."""
        added = self.for_url(url, method)
        lower = {k.lower(): k for k in theirs}
        merged = dict(theirs)
        for name, value in added.headers.items():
            mine = lower.get(name.lower())
            if mine is None:
                merged[name] = value
            elif name.lower() == "cookie":
                have = {p.split("=", 1)[0].strip() for p in theirs[mine].split(";")}
                extra = [p for p in value.split("; ") if p.split("=", 1)[0] not in have]
                if extra:
                    merged[mine] = "; ".join([theirs[mine], *extra])
        return merged, added.secrets

    def update(self, url: str, head: bytes, *, at: float | None = None) -> None:
        """Apply the ``Set-Cookie`` fields of a response head (as read) to the jar."""
        values = set_cookies(head)
        if values:
            self.jar.update(url, values, at=at)

    def for_worker(self) -> str | None:
        """Why these options cannot be used with worker processes (``--processes``), or
        None. Each order's headers and cookies are decided here, where the jar is, and its
        worker reports the answer's head back (``Set-Cookie``, a digest challenge); but
        seeing a page logged out, and logging in again, happen as the page settles."""
        if self.logins:
            return ("a login is watched (a page logged out, a login again) as each page "
                    "settles, in the crawl's own process, not in a worker process")
        return None

    def order_headers(self, url: str, headers: dict[str, str]
                      ) -> tuple[dict[str, str], list[str]]:
        """A worker process's order for ``url``: the fields to send (``headers``, the
        baseline's conditional ones, over this crawl's) and the secret values among them."""
        added = self.for_url(url)
        return {**added.headers, **headers}, added.secrets

    def restore(self, conn: Any, artifacts: ArtifactBackend, session_id: str) -> int:
        """Rebuild the jar of a resumed session: the ``Set-Cookie`` fields of every
        response head its runs recorded, applied in log order, each at its attempt's start
        time (the module's doc: the jar is the evidence's, not a file beside it). Returns
        the number of heads read."""
        rows = conn.execute(
            "SELECT f.url, f.started_at, a.namespace, a.digest, a.size FROM fetch_attempt f "
            "JOIN crawl_run r ON r.run_id = f.run_id "
            "JOIN artifact a ON a.artifact_id = f.response_headers_id "
            "WHERE r.session_id = ? ORDER BY f.log_index, f.attempt_seq",
            (session_id,)).fetchall()
        for url, started_at, namespace, digest, size in rows:
            head = artifacts.read(ArtifactRef(namespace, digest, size))
            at = parse_time_text(started_at)
            self.update(url, head, at=None if at is None else at.timestamp())
        return len(rows)


def new_challenge(head: bytes, known: str | None) -> Challenge | None:
    """The digest challenge of a 401 answer's head (as read) that is not the one answered
    already (nonce ``known``): a new nonce, or a stale one; None if there is none."""
    for line in re.split(rb"\r?\n", head)[1:]:
        if line[:17].lower() != b"www-authenticate:":
            continue
        challenge = parse_challenge(line[17:].decode("latin-1").strip())
        if challenge is not None and (not known or challenge.stale
                                      or challenge.nonce != known):
            return challenge
    return None


def set_cookies(head: bytes) -> list[str]:
    """The ``Set-Cookie`` field values of a response head (as read), in order."""
    return [line.split(b":", 1)[1].strip().decode("latin-1")
            for line in re.split(rb"\r?\n", head)[1:] if line[:11].lower() == b"set-cookie:"]


def _jar_header(jar: CookieJar, url: str, host: str, port: int) -> tuple[str | None, list[str]]:
    """The jar's cookies for ``url``; a host table's cookie (domain = its pattern) goes to
    hosts the pattern matches."""
    cookie, hidden = jar.header_for(url)
    extra = [c for c in jar if c.domain and ("*" in c.domain or ":" in c.domain)
             and HostOptions(match=c.domain).applies_to(host, port)]
    if extra:
        pairs = "; ".join(f"{c.name}={c.value}" for c in extra)
        cookie = pairs if cookie is None else f"{cookie}; {pairs}"
        hidden = hidden + [c.value for c in extra if c.secret and c.value]
    return cookie, hidden


# --- sealing --------------------------------------------------------------------------------


class Opening(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The exact request and, for each secret span of it, ``[start, end, salt hex]``."""

    request: bytes
    spans: list[tuple[int, int, str]]


def _mark(salt: bytes, value: bytes) -> bytes:
    return b"[secret sha256:" + hashlib.sha256(salt + value).hexdigest().encode() + b"]"


def _head_end(sent: bytes) -> int:
    end = sent.find(b"\r\n\r\n")
    return len(sent) if end < 0 else end


def _body_forms(value: str) -> set[bytes]:
    """How a form field's value can appear in a request body: as typed (UTF-8, as JSON
    would carry it), and form-encoded (``+`` or ``%20`` for a space)."""
    raw = value.encode("utf-8")
    return {raw, quote_plus(raw).encode("ascii"), quote(raw, safe="").encode("ascii")}


def redact(sent: bytes, values: Sequence[str],
           body_values: Sequence[str] = ()) -> tuple[bytes, bytes | None]:
    """The request as stored (each secret value in its header block replaced by a
    commitment, and each of ``body_values`` in its body, as typed or form-encoded) and the
    opening's bytes (None: nothing was secret). The request line is never searched."""
    # a header is written in Latin-1 (``_crawl.http``): a value that is not never was sent
    wanted = sorted({v.encode("latin-1", "replace") for v in values if v}, key=len,
                    reverse=True)
    in_body = sorted({f for v in body_values if v for f in _body_forms(v)}, key=len,
                     reverse=True)
    if not wanted and not in_body:
        return sent, None
    end = _head_end(sent)
    spans: list[tuple[int, int]] = []
    for line in re.finditer(rb"[^\r\n]*", sent[:end]):
        colon = line.group().find(b":")
        if line.start() == 0 or colon < 0:
            continue  # the request line, or an empty match between \r and \n
        start = line.start() + colon + 1
        stop = line.end()
        cursor = start
        while cursor < stop:  # leftmost, longest value first
            hits = [(sent.find(v, cursor, stop), -len(v)) for v in wanted]
            hits = [h for h in hits if h[0] >= 0]
            if not hits:
                break
            at, minus = min(hits)
            spans.append((at, at - minus))
            cursor = at - minus
    cursor = end + 4
    while in_body and cursor < len(sent):  # the body, leftmost and longest first
        hits = [(sent.find(v, cursor), -len(v)) for v in in_body]
        hits = [h for h in hits if h[0] >= 0]
        if not hits:
            break
        at, minus = min(hits)
        spans.append((at, at - minus))
        cursor = at - minus
    if not spans:
        return sent, None
    out, salted, last = [], [], 0
    for start, stop in spans:
        salt = _random.token_bytes(32)
        out += [sent[last:start], _mark(salt, sent[start:stop])]
        salted.append((start, stop, salt.hex()))
        last = stop
    out.append(sent[last:])
    opening = msgspec.msgpack.encode(Opening(sent, salted))
    return b"".join(out), opening


def open_request(redacted: bytes, opening: bytes) -> bytes:
    """The exact request an opening shows, checked against the stored (redacted) request:
    raises ``EvidenceError`` unless its spans, with their salts, give ``redacted`` byte for
    byte."""
    try:
        found = msgspec.msgpack.decode(opening, type=Opening)
    except msgspec.DecodeError as exc:
        raise EvidenceError(f"not an opening of a request: {exc}",
                            hint="give the payload the attempt names as request_secrets") \
            from None
    out, last = [], 0
    for start, stop, salt in found.spans:
        if not last <= start <= stop <= len(found.request):
            raise EvidenceError("the opening's spans are out of order",
                                hint="it was not made by evidence, or it was altered")
        out += [found.request[last:start], _mark(bytes.fromhex(salt),
                                                 found.request[start:stop])]
        last = stop
    out.append(found.request[last:])
    if b"".join(out) != redacted:
        raise EvidenceError("the opening does not give the stored request",
                            hint="it belongs to another attempt, or one of them was altered")
    return found.request


def commitments(redacted: bytes) -> list[str]:
    """The commitments in a stored request (hex digests), in order."""
    return [m.group(1).decode() for m in _MARK.finditer(redacted)]
