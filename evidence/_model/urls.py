"""The versioned URL normalizer: fetch keys, hosts, and resolving links seen in pages.

This module owns the mapping from a URL string to its *fetch key*, the string two
observations are compared by to decide they concern "the same URL". Each url_identity
row stores ``NORMALIZER_VERSION`` beside its key; any change that can alter an output
for any input must bump it, so keys made by different rules are never compared.

Invariants:

- ``normalize_url`` accepts only absolute http/https URLs with a host. Anything it
  cannot key raises ``URLError`` and never another exception.
- A fetch key is ASCII, at most ``MAX_URL_LENGTH`` characters, has no fragment, and is
  a fixed point: ``normalize_url(normalize_url(u)) == normalize_url(u)``.
- Only the equivalences of RFC 3986 section 6.2.2 and 6.2.3 are applied (case,
  percent-encoding, dot segments, default port, empty path), plus two crawler
  conventions: query parameters are sorted and the fragment is dropped.

Decisions (these are the rules of version 1):

- userinfo is kept, because a different user may see a different resource. Its
  percent-encoding is normalized like the path's; ``u:@h`` becomes ``u@h`` and an
  empty ``@h`` becomes ``h``. It may hold a password: callers decide whether to store it.
- A ``%`` not followed by two hex digits is kept as ``%25``, as browsers send it.
- Spaces and other characters RFC 3986 does not allow inside the path or query are
  percent-encoded as UTF-8. Control characters (C0, DEL, C1) anywhere, whitespace in
  the authority, and leading or trailing whitespace are errors (strip them first, as
  ``resolve_reference`` does).
- ASCII host labels may use ``[a-z0-9_-]`` (real hosts use ``_`` and ``--``, which
  IDNA2008 forbids); ``xn--`` labels must be valid punycode; other labels go through
  UTS #46 and IDNA2008. Non-dotted-decimal IPv4 forms (``0x7f.1``) are not reinterpreted.
- IPv6 literals are written in RFC 5952 form (lowercase, zeros compressed); zone
  identifiers are refused.
- ``normalize_url`` follows RFC 3986, not WHATWG, on backslashes: ``%5C`` in the path,
  an error in the authority. ``resolve_reference`` (raw hrefs) reads them as browsers do.
- Empty query parameters (``a&&b``) are dropped; the sort is by name, then ``=``, then value.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Callable
from typing import NamedTuple
from urllib.parse import unquote, urljoin, urlsplit

import idna

from .._errors import URLError
from .text import percent_encode_query

__all__ = ["NORMALIZER_VERSION", "key_and_host", "key_origin", "normalize_url",
           "registrable_domain", "resolve_reference", "url_host"]

NORMALIZER_VERSION: int = 1
MAX_URL_LENGTH = 8192

_DEFAULT_PORTS = {"http": 80, "https": 443}
_UNRESERVED = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~"  # 3986 2.3
_SUB_DELIMS = "!$&'()*+,;="  # RFC 3986 2.2
_SCHEME_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")  # RFC 3986 3.1
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_ASCII_LABEL_RE = re.compile(r"[a-z0-9_-]+")
_C0_OR_SPACE = "".join(chr(i) for i in range(0x21))
_DROP_TAB_NEWLINE = str.maketrans("", "", "\t\n\r")
_AUTHORITY_RE = re.compile(r"//([^/?]*)(.*)")  # RFC 3986 3.2: '#' is already cut off.
_EXTRA_SLASHES_RE = re.compile(r"^((?:https?:)?//)/+", re.IGNORECASE)


def _fail(message: str, url: object, hint: str) -> URLError:
    return URLError(message, hint=hint, url=url)


def _component_normalizer(safe: str) -> Callable[[str], str]:
    """Percent-encoding normalizer for one component (RFC 3986 2.1, 2.3, 2.4, 6.2.2.2).

    An escape of an unreserved character is decoded; any other escape keeps its byte
    and gets uppercase hex; a stray ``%`` becomes ``%25``; a character outside ``safe``
    is encoded as UTF-8. Reserved characters are left alone either way (``%2F`` stays
    ``%2F`` and ``/`` stays ``/``): decoding or encoding them can change the meaning.
    """
    pattern = re.compile(r"%([0-9A-Fa-f]{2})|%|[^" + re.escape(_UNRESERVED + safe) + "]")

    def fix(match: re.Match[str]) -> str:
        pair = match.group(1)
        if pair is not None:
            char = chr(int(pair, 16))
            return char if char in _UNRESERVED else "%" + pair.upper()
        if match.group() == "%":
            return "%25"
        # A lone surrogate raises UnicodeEncodeError here; normalize_url turns it into URLError.
        return "".join(f"%{byte:02X}" for byte in match.group().encode("utf-8"))

    return lambda text: pattern.sub(fix, text)


# '?' and '#' cannot occur in these components: they end them (RFC 3986 3.3, 3.4).
_normalize_userinfo = _component_normalizer(_SUB_DELIMS + ":")  # RFC 3986 3.2.1
_normalize_path_chars = _component_normalizer(_SUB_DELIMS + ":@/")  # RFC 3986 3.3
_normalize_query_chars = _component_normalizer(_SUB_DELIMS + ":@/?")  # RFC 3986 3.4


class _Parts(NamedTuple):
    scheme: str
    userinfo: str  # "" when absent
    host: str  # IPv6 literals keep their brackets
    port: int | None  # None for the scheme's default port
    path: str
    query: str  # "" when absent

    def serialize(self) -> str:
        userinfo = f"{self.userinfo}@" if self.userinfo else ""
        port = "" if self.port is None else f":{self.port}"
        query = f"?{self.query}" if self.query else ""
        return f"{self.scheme}://{userinfo}{self.host}{port}{self.path}{query}"


def _normalize_port(text: str, scheme: str, url: str) -> int | None:
    if text == "":  # "http://h:/" -- RFC 3986 3.2.3 lets the port be empty.
        return None
    digits = text.lstrip("0") or "0"
    # isdigit() alone would accept non-ASCII digits; 5 digits also bounds int().
    if not (text.isascii() and text.isdigit()) or len(digits) > 5 or int(digits) > 65535:
        raise _fail(f"invalid port {text[:20]!r}", url, "A port is a number from 0 to 65535.")
    port = int(digits)
    return None if port == _DEFAULT_PORTS[scheme] else port


def _label_to_ascii(label: str, url: str) -> str:
    if not label:
        raise _fail("host has an empty label", url, "Remove the doubled or leading dot.")
    if not label.isascii():
        ascii_label = idna.alabel(label).decode("ascii")  # IDNA2008 (RFC 5891 4.4)
    elif label.startswith("xn--"):
        idna.ulabel(label)  # Must be the canonical punycode of a valid U-label.
        ascii_label = label
    elif _ASCII_LABEL_RE.fullmatch(label):
        ascii_label = label
    else:
        raise _fail(
            f"host label {label[:70]!r} has characters a hostname cannot contain",
            url,
            "Host labels may contain letters, digits, '-' and '_'.",
        )
    if len(ascii_label) > 63:  # RFC 1035 2.3.4
        raise _fail("host label longer than 63 characters", url, "Check the host name.")
    return ascii_label


def _normalize_host(text: str, url: str) -> str:
    if text.startswith("["):  # IP-literal, RFC 3986 3.2.2
        literal = text[1:-1]
        if "%" in literal:  # RFC 6874 zone ids: not routable beyond one machine.
            raise _fail("IPv6 zone identifiers are not supported", url, "Drop the %25zone part.")
        try:
            return f"[{ipaddress.IPv6Address(literal).compressed}]"  # RFC 5952 form
        except ValueError:
            raise _fail(f"invalid IPv6 literal {text[:60]!r}", url, "Check the address.") from None
    try:
        decoded = unquote(text, errors="strict")  # WHATWG host parsing decodes escapes first.
        # UTS #46 maps case, width and the ideographic full stops; ASCII only needs lower().
        mapped = decoded.lower() if decoded.isascii() else idna.uts46_remap(decoded, False)
        if mapped.endswith("."):  # The root label is implied (RFC 1034 3.1).
            mapped = mapped[:-1]
        if not mapped:
            raise _fail("URL has no host", url, "Use an absolute URL: scheme://host/path.")
        if ":" in mapped:
            raise _fail("host contains ':'", url, "Put IPv6 addresses in brackets: [::1].")
        host = ".".join(_label_to_ascii(label, url) for label in mapped.split("."))
    except ValueError as exc:  # idna.IDNAError and UnicodeDecodeError are ValueErrors.
        raise _fail(f"host fails IDNA: {exc}", url, "Check the host name's spelling.") from exc
    if len(host) > 253:  # RFC 1035 2.3.4
        raise _fail("host name longer than 253 characters", url, "Check the host name.")
    return host


def _remove_dot_segments(path: str) -> str:
    """RFC 3986 5.2.4 for an absolute path (it always starts with '/')."""
    segments = path.split("/")
    kept: list[str] = []
    for segment in segments:
        if segment == "..":
            if len(kept) > 1:  # kept[0] is the empty segment before the leading '/'.
                kept.pop()
        elif segment != ".":
            kept.append(segment)
    if segments[-1] in (".", ".."):  # "/a/b/.." names the directory "/a/".
        kept.append("")
    return "/".join(kept) or "/"


def _normalize_query(query: str) -> str:
    params = [param for param in _normalize_query_chars(query).split("&") if param]
    # Sorting on normalized text makes the order independent of the spelling.
    params.sort(key=lambda param: param.partition("="))
    return "&".join(params)


def _split_authority(authority: str, url: str) -> tuple[str, str, str]:
    """Split ``[userinfo@]host[:port]`` (RFC 3986 3.2); normalize the userinfo."""
    if any(char.isspace() for char in authority):
        raise _fail("URL has whitespace in its host part", url, "Check the host name.")
    if "\\" in authority:  # WHATWG reads it as '/', RFC 3986 as data: refuse the ambiguity.
        raise _fail("URL has '\\' in its host part", url, "Write '/' to end the host.")
    userinfo, _, host_port = authority.rpartition("@")  # '@' is not allowed in userinfo.
    user, _, password = _normalize_userinfo(userinfo).partition(":")
    userinfo = f"{user}:{password}" if password else user
    if not host_port.startswith("["):
        host_text, colon, port_text = host_port.rpartition(":")
        return (userinfo, host_text, port_text) if colon else (userinfo, host_port, "")
    if "]" not in host_port:
        raise _fail("unclosed '[' in host", url, "Write IPv6 literals as [address].")
    host_text, bracket, port_text = host_port.partition("]")
    if port_text and not port_text.startswith(":"):
        raise _fail("junk after IPv6 literal", url, "Write [address]:port.")
    return userinfo, host_text + bracket, port_text[1:]


def _normalize(url: str) -> _Parts:
    if not isinstance(url, str):
        raise _fail(f"URL must be str, not {type(url).__name__}", url, "Decode it first.")
    if len(url) > MAX_URL_LENGTH:
        raise _fail(
            f"URL is {len(url)} characters, over the {MAX_URL_LENGTH} limit",
            url[:200],
            "Very long URLs are not given fetch keys; record them separately.",
        )
    if match := _CONTROL_RE.search(url):
        raise _fail(
            f"URL contains control character {match.group()!r} at {match.start()}",
            url,
            "Remove control characters (resolve_reference removes tabs and newlines).",
        )
    if url[:1].isspace() or url[-1:].isspace():
        raise _fail("URL has leading or trailing whitespace", url, "Strip the URL first.")
    without_fragment = url.partition("#")[0]  # The fragment is never sent (RFC 3986 3.5).
    scheme_match = _SCHEME_RE.match(without_fragment)
    if scheme_match is None:
        raise _fail("URL has no scheme", url, "Resolve it with resolve_reference first.")
    scheme = scheme_match.group(1).lower()
    if scheme not in _DEFAULT_PORTS:
        raise _fail(
            f"unsupported scheme {scheme[:20]!r}", url, "Only http and https URLs have fetch keys."
        )
    split = _AUTHORITY_RE.match(without_fragment, scheme_match.end())
    if split is None:
        raise _fail("URL has no host", url, "Use an absolute URL: scheme://host/path.")
    authority, rest = split.groups()
    userinfo, host_text, port_text = _split_authority(authority, url)
    port = _normalize_port(port_text, scheme, url)
    host = _normalize_host(host_text, url)
    path, _, query = rest.partition("?")
    path = _remove_dot_segments(_normalize_path_chars(path) or "/")  # RFC 3986 6.2.3, 6.2.2.3
    return _Parts(scheme, userinfo, host, port, path, _normalize_query(query))


def _checked(url: str) -> _Parts:
    try:
        parts = _normalize(url)
        key = parts.serialize()
    except UnicodeEncodeError as exc:  # A lone surrogate cannot be encoded as UTF-8.
        raise _fail("URL contains a lone surrogate", url, "Decode the page text.") from exc
    if len(key) > MAX_URL_LENGTH:  # Keeps every key a valid input, so idempotence holds.
        raise _fail(
            f"normalized URL is over the {MAX_URL_LENGTH} character limit",
            url,
            "Very long URLs are not given fetch keys; record them separately.",
        )
    return parts


def normalize_url(url: str) -> str:
    """Return the fetch key of an absolute http(s) URL; raise ``URLError`` if it has none."""
    if isinstance(url, str) and _simple_key(url) is not None:
        return url
    return _checked(url).serialize()


# Most URLs a crawler meets are already fetch keys: lowercase ASCII host, no default port,
# no escapes, no dot segments, a sorted query. Recognizing them is ~10x cheaper than the
# full parse; tests/test_urls.py checks that this path never answers differently.
_SIMPLE_RE = re.compile(
    r"(https?)://([a-z0-9_-]{1,63}(?:\.[a-z0-9_-]{1,63})*)(?::([1-9][0-9]{0,4}))?"
    r"(/[A-Za-z0-9\-._~!$&'()*+,;=:@/]*)(?:\?([A-Za-z0-9\-._~!$&'()*+,;=:@/?]+))?")


def _simple_key(url: str) -> re.Match[str] | None:
    """The fast path's match when ``url`` is already a fetch key, else None."""
    match = _SIMPLE_RE.fullmatch(url)
    if match is None or len(url) > MAX_URL_LENGTH:
        return None
    scheme, host, port, path, query = match.groups()
    if len(host) > 253 or "xn--" in host or "/." in path:
        return None
    if port is not None and (int(port) > 65535 or int(port) == _DEFAULT_PORTS[scheme]):
        return None
    if query is not None:
        params = query.split("&")
        keys = [p.partition("=") for p in params]
        if "" in params or keys != sorted(keys):
            return None
    return match


def key_and_host(url: str) -> tuple[str, str]:
    """``(normalize_url(url), url_host(url))`` from one parse: what a crawl needs of each
    URL it meets (issue 15: one pass per page)."""
    match = _simple_key(url) if isinstance(url, str) else None
    if match is not None:
        return url, match.group(2)
    # A fetch key with a plain fragment (an in-page link: "page.html#top"): the key is the
    # URL without it.
    head, mark, fragment = url.partition("#") if isinstance(url, str) else ("", "", "")
    if mark and len(url) <= MAX_URL_LENGTH and _PLAIN_FRAGMENT_RE.fullmatch(fragment):
        match = _simple_key(head)
        if match is not None:
            return head, match.group(2)
    parts = _checked(url)
    return parts.serialize(), parts.host


def url_host(url: str) -> str:
    """Return the host of ``url``'s fetch key: IDNA-encoded, IPv6 bracketed, no port."""
    match = _simple_key(url) if isinstance(url, str) else None
    if match is not None:
        return match.group(2)
    return _checked(url).host


def key_origin(key: str) -> str:
    """The origin of a fetch key: ``scheme://host[:port]``, userinfo dropped. Keys carry no
    default port (``http://a:80/`` and ``http://a/`` have one key), so two URLs have the
    same origin exactly when their scheme, host and port are the same (RFC 6454)."""
    start = key.index("//") + 2
    end = key.find("/", start)  # a key's path is never empty
    authority = key[start:end]
    return key[:start] + authority[authority.rfind("@") + 1:]


_SUFFIXES = None  # the Public Suffix List, read on first use (0.11 s of CPU on the dev VM)


@functools.lru_cache(maxsize=4096)  # a crawl meets the same hosts again and again
def registrable_domain(host: str) -> str:
    """The registrable domain of a fetch key's host by the Public Suffix List (ICANN and
    private sections: ``a.example.co.uk`` is ``example.co.uk``, ``alice.github.io`` is
    itself), the list the ``publicsuffixlist`` package ships (read offline, never
    fetched). An IP address, or a host that is itself a public suffix, is its own."""
    global _SUFFIXES
    if host.startswith("[") or host.replace(".", "").isdigit():
        return host
    if _SUFFIXES is None:
        from publicsuffixlist import PublicSuffixList

        _SUFFIXES = PublicSuffixList()
    return _SUFFIXES.privatesuffix(host) or host


def _clean_reference(text: str) -> str:
    # WHATWG URL parsing: strip C0 controls and spaces around, drop tabs and newlines inside.
    text = text.strip(_C0_OR_SPACE).translate(_DROP_TAB_NEWLINE)
    # For http(s) browsers read '\\' as '/' before the query, and skip extra slashes
    # before the host ("///h" is "//h"); urljoin does neither, so do it here.
    cut = re.search(r"[?#]|$", text).start()  # type: ignore[union-attr] # "$" always matches
    text = text[:cut].replace("\\", "/") + text[cut:]
    return _EXTRA_SLASHES_RE.sub(r"\1", text, count=1)


# References that resolve without urljoin against a base that is a fetch key: an absolute
# fetch key, an absolute path, or a relative path; no dot segments, query, fragment, ':'
# or character that cleaning would change. Most links on most pages are one of these, and
# this path is ~10x cheaper; tests/test_urls.py checks it never answers differently.
# No ';' in either string: urljoin reads it as RFC 1808 path parameters (and may drop it).
_PLAIN_PATH_RE = re.compile(r"[A-Za-z0-9\-_~!$&'()*+,=@%/][A-Za-z0-9\-._~!$&'()*+,=@%/]*")


# A fragment (after '#') of characters that cleaning leaves as they are.
_PLAIN_FRAGMENT_RE = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,=:@/?%]*")


class _PlainBase(NamedTuple):
    """What the fast path needs of a base, worked out once for all of a page's links."""

    base: str
    usable: bool  # no ';' (urljoin reads it as RFC 1808 path parameters)
    key: bool  # the base is a fetch key (``_simple_key``)
    origin: str  # "scheme://host[:port]", when the base is a key with no '//' in its path
    directory: str  # origin + the path up to its last '/', likewise


def _plain_base(base: str) -> _PlainBase:
    match = _simple_key(base) if ";" not in base else None
    if match is None:
        return _PlainBase(base, ";" not in base, False, "", "")
    path = match.group(4)
    if "//" in path:
        return _PlainBase(base, True, True, "", "")
    origin = base[: match.start(4)]
    return _PlainBase(base, True, True, origin, origin + path[: path.rfind("/") + 1])


def _resolve_plain(base: str, href: str) -> str | None:
    return _resolve_plain_with(_plain_base(base), href)


def _resolve_plain_with(plain: _PlainBase, href: str) -> str | None:
    if not plain.usable or ";" in href:
        return None
    if href.startswith("#"):  # the page itself, at a fragment
        if (len(href) == 1 or _PLAIN_FRAGMENT_RE.fullmatch(href, 1) is None
                or not plain.key):  # urljoin drops an empty fragment
            return None
        resolved = plain.base + href
    elif href.startswith(("http://", "https://")):
        return href if _simple_key(href) is not None else None
    # "//" anywhere: urljoin drops empty path segments, which RFC 3986 keeps.
    elif ("//" in href or "/." in href or not _PLAIN_PATH_RE.fullmatch(href)
          or not plain.origin):
        return None
    elif href.startswith("/"):
        resolved = plain.origin + href
    else:
        resolved = plain.directory + href
    return resolved if len(resolved) <= MAX_URL_LENGTH else None


def reference_resolver(base: str, *, encoding: str | None = None) -> Callable[[str], str]:
    """``resolve_reference(base, href, encoding=encoding)`` as a function of ``href``, for
    the many references of one page (what the base allows is worked out once)."""
    plain = _plain_base(base)

    def resolve(href: str) -> str:
        resolved = _resolve_plain_with(plain, href) if isinstance(href, str) else None
        if resolved is not None:
            return resolved
        return _resolve_full(base, href, encoding)

    return resolve


def resolve_reference(base: str, href: str, *, encoding: str | None = None) -> str:
    """Resolve ``href`` seen in a page against ``base`` (RFC 3986 5.2); not normalized.

    Both strings are first cleaned as browsers do (see ``_clean_reference``). Raises
    ``URLError`` unless the result is an http(s) URL with an authority. ``encoding`` is
    the document's (a WHATWG name, ``evidence._model.text``): as in the URL standard, the query
    of ``href`` is percent-encoded in it (characters it cannot represent as ``&#N;``); the
    path is always UTF-8 (``normalize_url`` encodes it). None means UTF-8.
    """
    if isinstance(base, str) and isinstance(href, str):
        resolved = _resolve_plain(base, href)
        if resolved is not None:
            return resolved
    return _resolve_full(base, href, encoding)


def _resolve_full(base: str, href: str, encoding: str | None) -> str:
    resolved = _resolve(base, href)
    if encoding is not None and not resolved.isascii() and "?" in href:
        resolved = _encode_query(resolved, encoding)
        if len(resolved) > MAX_URL_LENGTH:
            raise _fail("resolved URL is too long", href[:200], "Skip this link.")
    return resolved


def _encode_query(url: str, encoding: str) -> str:
    """``url`` with its query's non-ASCII characters percent-encoded in ``encoding``."""
    rest, hash_, fragment = url.partition("#")
    before, mark, query = rest.partition("?")
    if not mark:
        return url
    return before + mark + percent_encode_query(query, encoding) + hash_ + fragment


def _resolve(base: str, href: str) -> str:
    base, href = _clean_reference(base), _clean_reference(href)
    try:
        resolved = urljoin(base, href)
        parts = urlsplit(resolved)
    except ValueError as exc:  # e.g. an unclosed '[' in the authority
        raise _fail(f"cannot resolve reference: {exc}", href, "Check the link.") from exc
    if parts.scheme not in _DEFAULT_PORTS or not parts.netloc:
        raise _fail(
            f"reference does not resolve to an http(s) URL: {resolved[:200]!r}",
            href,
            "Skip links to other schemes (mailto:, javascript:, data:).",
        )
    if len(resolved) > MAX_URL_LENGTH:
        raise _fail("resolved URL is too long", href[:200], "Skip this link.")
    return resolved
