"""The link extractor of evidence before issue 15, kept as the oracle of a differential test.

Not part of the package: ``evidence._crawl.links`` (selectolax's lexbor parser) replaced
it. tests/test_links.py checks that both find the same links where both must.

It turned a stored HTML body into ``ObservedRef`` records. It tokenizes
with the standard library's ``html.parser.HTMLParser`` (a real tokenizer: comments,
``<script>`` text, quoting and character references are handled as markup, not guessed
at with regular expressions) and records:

- ``a[href]``, ``area[href]`` and ``link[href]`` as ``edge_kind="link"``, with ``rel``
  lowercased and its tokens joined by single spaces;
- ``iframe[src]`` and ``frame[src]`` as ``edge_kind="embed"``;
- the first ``base[href]``, which changes the base URL for the references *after* it
  (one pass; browsers apply it to the whole document, but ``<base>`` belongs in
  ``<head>`` before any link). It is resolved against the document URL; if it does not
  resolve to http(s) it is ignored, and later ``<base>`` elements are ignored either way.

Markup inside comments and raw-text elements (``script``, ``style``, ``textarea``,
``title``, ``iframe``, ...) is text, as in browsers; so is everything after a comment, tag
or declaration left open at the end of the document.

Invariants:

- ``observed`` is the attribute value as the tokenizer produced it: character references
  decoded (``&amp;`` is ``&``), CR and CRLF read as LF and NUL as U+FFFD, which is the
  href a browser sees. Surrounding whitespace is kept. ``url`` is
  ``resolve_reference(base, observed)``: absolute http(s), at most ``MAX_URL_LENGTH``
  characters, not normalized.
- ``position`` is the index of the element among all start tags in document order, so
  equal hrefs in different elements stay distinct.
- Hrefs that give no http(s) URL (``javascript:``, ``mailto:``, ``data:``, invalid, over
  ``MAX_URL_LENGTH`` characters, empty, or holding lone surrogates that no encoder
  accepts) are counted in ``skipped``, never returned.
- Only a wrong argument type (``TypeError``) or a negative limit (``ValueError``) raises.
  Any document, valid or not, yields a ``LinkExtraction``.
- Work is bounded: at most ``max_bytes`` of the document is tokenized (bytes before
  decoding, characters for ``str``), parsing stops at the first reference past
  ``max_links``, and the tokenizer never rescans (see the note at the end of
  ``extract_links``). The pure-Python
  tokenizer's worst case is about 2 s per MiB of hostile markup on CPython 3.11 (3 s when
  every tag is a link and ``max_links`` is raised), so pass a smaller ``max_bytes`` where
  that matters.

Decoding bytes: as a browser does, by ``evidence._model.text`` (the decoder every consumer of
page text shares): a byte-order mark wins, then ``encoding`` (the charset the server
declared), then a ``<meta>`` charset in the first 1024 bytes, then windows-1252; labels
resolved by the WHATWG Encoding Standard, unmappable bytes read as U+FFFD. Which encoding
was used and why is in ``LinkExtraction.encoding`` and ``encoding_source``. A link's query
is encoded in that encoding (the URL standard; ``resolve_reference``), its path as UTF-8.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

import msgspec

from evidence._errors import URLError
from evidence._model.messages import ObservedRef
from evidence._model.text import decode, sniff
from evidence._model.urls import MAX_URL_LENGTH, resolve_reference

__all__ = ["LinkExtraction", "extract_links"]

_MAX_REL = 65536  # ObservedRef.rel is Text: at most this many characters.

# tag -> (attribute, edge_kind)
_TARGETS = {
    "a": ("href", "link"),
    "area": ("href", "link"),
    "link": ("href", "link"),
    "iframe": ("src", "embed"),
    "frame": ("src", "embed"),
}
_REL_TAGS = frozenset({"a", "area", "link"})

_REL_SPLIT_RE = re.compile(r"[\t\n\f\r ]+")  # HTML's ASCII whitespace, not str.split()'s
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_SURROGATE_RE = re.compile("[\ud800-\udfff]")
_COMMENT_END_RE = re.compile(r"--!?>")


class LinkExtraction(msgspec.Struct, frozen=True):
    """The references found in one document."""

    refs: list[ObservedRef]
    truncated: bool  # more than max_links references, or only a prefix was parsed
    base_url: str  # the base in effect at the end: the first usable <base href>, if any
    skipped: int  # hrefs that did not resolve to an http(s) URL
    encoding: str | None = None  # the WHATWG encoding the bytes were read in (None: str input)
    encoding_source: str | None = None  # why: "bom", "header", "meta" or "default"


class _Stop(Exception):
    """Raised from a handler to abandon parsing once max_links is exceeded."""


class _LinkParser(HTMLParser):
    # Raw-text elements: browsers do not tokenize markup inside these, so neither do we
    # (a <textarea> of pasted HTML holds no links). The stdlib only lists script, style.
    CDATA_CONTENT_ELEMENTS = (
        "script", "style", "textarea", "title", "xmp", "iframe", "noembed", "noframes",
    )

    def __init__(self, document_url: str, max_links: int, encoding: str | None) -> None:
        super().__init__(convert_charrefs=True)
        self.document_url = document_url
        self.encoding = encoding  # of the document: a link's query is encoded in it
        self.base_url = document_url
        self.refs: list[ObservedRef] = []
        self.skipped = 0
        self.truncated = False
        self._max_links = max_links
        self._base_seen = False
        self._start_tags = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        position = self._start_tags
        self._start_tags += 1
        if tag == "base":
            self._handle_base(attrs)
            return
        target = _TARGETS.get(tag)
        if target is None:
            return
        attr, edge_kind = target
        observed = _first(attrs, attr)
        if observed is None:
            return
        url = self._resolve(self.base_url, observed)
        if url is None:
            self.skipped += 1
            return
        if len(self.refs) >= self._max_links:
            self.truncated = True
            raise _Stop
        rel = _normalize_rel(_first(attrs, "rel") or "") if tag in _REL_TAGS else ""
        self.refs.append(ObservedRef(observed=observed, url=url, position=position, tag=tag,
                                     attr=attr, rel=rel, edge_kind=edge_kind))

    def _handle_base(self, attrs: list[tuple[str, str | None]]) -> None:
        href = _first(attrs, "href")
        if href is None or self._base_seen:
            return
        # Only the first <base> with an href counts, even when it is unusable.
        self._base_seen = True
        self.base_url = self._resolve(self.document_url, href) or self.document_url

    def _resolve(self, base: str, observed: str) -> str | None:
        # Empty: a self-reference, and ObservedRef.observed may not be empty. Over-long
        # hrefs are refused before the work of resolving them.
        if not observed or len(observed) > MAX_URL_LENGTH:
            return None
        try:
            url = resolve_reference(base, observed, encoding=self.encoding)
        except (URLError, ValueError):
            return None
        # A lone surrogate (only possible in str input) cannot be encoded or stored.
        if _SURROGATE_RE.search(observed) or _SURROGATE_RE.search(url):
            return None
        return url

    # Browser tokenizer rules where the stdlib differs in a way that changes which links
    # exist. Both hooks return the index after the construct, or -1 if it is unterminated.

    def parse_comment(self, i: int, report: bool = True) -> int:
        # "<!-->" and "<!--->" are complete empty comments; a comment ends at "-->" or
        # "--!>", not at "-- >" as the stdlib allows.
        rawdata = self.rawdata
        if rawdata.startswith(">", i + 4):
            return i + 5
        if rawdata.startswith("->", i + 4):
            return i + 6
        match = _COMMENT_END_RE.search(rawdata, i + 4)
        return -1 if match is None else match.end()

    def parse_html_declaration(self, i: int) -> int:
        # Outside SVG/MathML, "<![" opens a bogus comment that ends at the next '>'. The
        # stdlib parses SGML marked sections instead and raises on unknown keywords.
        if self.rawdata.startswith("<![", i):
            return self.parse_bogus_comment(i)
        return super().parse_html_declaration(i)


def _first(attrs: list[tuple[str, str | None]], name: str) -> str | None:
    """The first attribute called ``name`` (browsers drop duplicates); ``""`` if valueless."""
    for key, value in attrs:
        if key == name:
            return value or ""
    return None


def _normalize_rel(rel: str) -> str:
    tokens = _REL_SPLIT_RE.split(rel.translate(_ASCII_LOWER))
    text = " ".join(token for token in tokens if token)
    if len(text) > _MAX_REL:  # Hostile only; keep the whole tokens that fit.
        text = text[: _MAX_REL + 1].rpartition(" ")[0]
    return text


def extract_links(
    html: bytes | str,
    base_url: str,
    *,
    encoding: str | None = None,
    max_links: int = 10_000,
    max_bytes: int = 8 * 1024 * 1024,
) -> LinkExtraction:
    """Extract the references in ``html``, a document fetched from ``base_url``.

    ``encoding`` is the charset the server declared (a label), if any. At most ``max_links``
    references are returned and at most ``max_bytes`` of the document is parsed;
    ``truncated`` says either limit cut the result short.
    """
    if not isinstance(html, (bytes, bytearray, str)):
        raise TypeError(f"html must be bytes or str, not {type(html).__name__}")
    if not isinstance(base_url, str):
        raise TypeError(f"base_url must be str, not {type(base_url).__name__}")
    if encoding is not None and not isinstance(encoding, str):
        raise TypeError(f"encoding must be str or None, not {type(encoding).__name__}")
    for name, limit in (("max_links", max_links), ("max_bytes", max_bytes)):
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise TypeError(f"{name} must be int, not {type(limit).__name__}")
        if limit < 0:
            raise ValueError(f"{name} must not be negative, got {limit}")

    cut = len(html) > max_bytes
    sniffed = None
    if isinstance(html, str):
        text = html[:max_bytes] if cut else html
    else:
        data = memoryview(html)[:max_bytes] if cut else html
        sniffed = sniff(data, encoding)
        text = decode(data, sniffed.encoding)
    # Browsers' input preprocessing: CR and CRLF become LF; the tokenizer then reads NUL
    # as U+FFFD in tag names and attribute values. (replace() returns text itself when
    # there is nothing to replace, so clean documents are not copied.)
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "\ufffd")
    parser = _LinkParser(base_url, max_links, sniffed and sniffed.encoding)
    try:
        parser.feed(text)
    except _Stop:
        pass
    except Exception:  # The stdlib tokenizer gave up: keep what it found, flag the rest.
        cut = True
    # close() is never called: it re-parses an unterminated construct at the end as text,
    # one character at a time with a scan to the end for each (quadratic: minutes for
    # "<!" * 4 MiB), and finds links browsers never see there. A browser reads a comment,
    # tag or declaration left open at end of file as swallowing the rest, and so do we.
    return LinkExtraction(refs=parser.refs, truncated=cut or parser.truncated,
                          base_url=parser.base_url, skipped=parser.skipped,
                          encoding=sniffed and sniffed.encoding,
                          encoding_source=sniffed and sniffed.source)
