"""HTTP Digest access authentication (RFC 7616), the client's side, for ``auth = "digest"``.

A digest credential cannot be sent before the server has said how: its answer is computed
from the server's challenge (realm, nonce, algorithm, quality of protection). So the first
request to a host that wants one gets a 401 with ``WWW-Authenticate: Digest ...``: that
answer is recorded like any other, the challenge is kept for the host, and the page is
retried at once through the frontier (its second attempt, also recorded) with an
``Authorization`` computed from it. Later requests to the host answer the same challenge
with the next nonce count, until the server says the nonce is ``stale`` (a new challenge
replaces it, and that page is retried the same way). The ``Authorization`` value is sealed
in the stored request like any credential (``_crawl.secrets``): a digest response is a
hash of the password that could be attacked offline.

Supported: algorithms MD5, MD5-sess, SHA-256 and SHA-256-sess; ``qop=auth`` (or none, the
RFC 2069 form, for servers that offer no qop). ``auth-int`` alone is not (a crawl's GET
has no body to protect): such a challenge is not answered.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass, field

__all__ = ["Challenge", "authorization", "parse_challenge"]

_PARAM = re.compile(r'\s*([A-Za-z0-9_-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,]*))\s*,?')
_HASHES = {"md5": hashlib.md5, "sha-256": hashlib.sha256}


@dataclass
class Challenge:
    """A server's digest challenge, and how many times its nonce was answered."""

    realm: str
    nonce: str
    algorithm: str = "MD5"
    qop: str | None = None  # "auth", or None: the server offered none
    opaque: str | None = None
    stale: bool = False
    count: int = field(default=0)


def parse_challenge(value: str) -> Challenge | None:
    """The Digest challenge of a ``WWW-Authenticate`` value (None: none this client can
    answer: another scheme, no nonce, an unknown algorithm, only ``auth-int``)."""
    start = re.search(r"(?i)(?:^|,)\s*digest\s+", value)
    if start is None:
        return None
    params: dict[str, str] = {}
    at = start.end()
    for match in _PARAM.finditer(value, at):
        if match.start() != at:  # the challenge's parameters ended (another scheme)
            break
        at = match.end()
        quoted, bare = match.group(2), match.group(3)
        params.setdefault(match.group(1).lower(),
                          re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else bare)
    algorithm = params.get("algorithm", "MD5")
    if "nonce" not in params or algorithm.lower().removesuffix("-sess") not in _HASHES:
        return None
    qop = None
    if "qop" in params:
        offered = {q.strip().lower() for q in params["qop"].split(",")}
        if "auth" not in offered:
            return None
        qop = "auth"
    return Challenge(realm=params.get("realm", ""), nonce=params["nonce"], algorithm=algorithm,
                     qop=qop, opaque=params.get("opaque"),
                     stale=params.get("stale", "").lower() == "true")


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def authorization(challenge: Challenge, username: str, password: str, method: str,
                  uri: str) -> str:
    """The ``Authorization`` value answering ``challenge`` for ``method uri`` (the request
    target as sent); each call uses the next nonce count and a fresh client nonce."""
    name = challenge.algorithm.lower()
    digest = _HASHES[name.removesuffix("-sess")]

    def h(text: str) -> str:
        return digest(text.encode("utf-8")).hexdigest()

    challenge.count += 1
    nc, cnonce = f"{challenge.count:08x}", secrets.token_hex(16)
    ha1 = h(f"{username}:{challenge.realm}:{password}")
    if name.endswith("-sess"):
        ha1 = h(f"{ha1}:{challenge.nonce}:{cnonce}")
    ha2 = h(f"{method}:{uri}")
    if challenge.qop is None:
        response = h(f"{ha1}:{challenge.nonce}:{ha2}")
    else:
        response = h(f"{ha1}:{challenge.nonce}:{nc}:{cnonce}:{challenge.qop}:{ha2}")
    parts = [f"username={_quote(username)}", f"realm={_quote(challenge.realm)}",
             f"nonce={_quote(challenge.nonce)}", f"uri={_quote(uri)}",
             f"algorithm={challenge.algorithm}", f"response={_quote(response)}"]
    if challenge.qop is not None:
        parts += [f"qop={challenge.qop}", f"nc={nc}", f"cnonce={_quote(cnonce)}"]
    if challenge.opaque is not None:
        parts.append(f"opaque={_quote(challenge.opaque)}")
    return "Digest " + ", ".join(parts)
