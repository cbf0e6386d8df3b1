"""Link extraction: the references a browser would see in one HTML document.

This module owns turning an HTML document into ``ObservedRef`` records. The document is
parsed by selectolax's binding of lexbor (``selectolax.lexbor``), a C implementation of the
HTML standard's tokenizer and tree builder: comments, raw-text elements (``script``,
``style``, ``textarea``, ``title``...), quoting, character references, misnested and
unclosed tags are read as a browser reads them. Then the tree is walked once, in document
order, and records:

============================================  ============  ==========================
element and attribute                         ``edge_kind`` ``attr``
============================================  ============  ==========================
``a[href]``, ``area[href]``, ``link[href]``   ``link``      ``href``
``link[rel~=stylesheet]``                     ``stylesheet`` ``href``
``link[rel~=icon]`` (and apple/mask icons)    ``image``     ``href``
``iframe[src]``, ``frame[src]``               ``embed``     ``src``
``img[src]``, ``input[type=image][src]``,     ``image``     ``src``, ``poster``,
``video[poster]``, every ``srcset`` URL                     ``srcset``
``script[src]``                               ``script``    ``src``
``audio``/``video``/``source``/``track``/     ``media``     ``src`` (``data``)
``embed[src]``, ``object[data]``
``url()`` and ``@import`` in a ``style``      ``style``     ``style`` (the attribute),
attribute or a ``<style>`` element                          ``#text`` (the element)
============================================  ============  ==========================

Page requisites (kinds ``image``, ``script``, ``stylesheet``, ``style``, ``media``) are
recorded always and followed only when the crawl says so (``CrawlConfig.requisites``,
``evidence crawl --requisites``; docs/crawling.md).

Invariants:

- The base URL is the first ``base`` element with an ``href`` in the document (in the
  head, or anywhere: the HTML standard's rule), resolved against the document's URL, and
  applies to every reference, before it or after it. A base that does not resolve to
  http(s) is ignored, and later ones are ignored either way.
- ``observed`` is the attribute value as the parser produced it (character references
  decoded, CR and CRLF read as LF, NUL as U+FFFD: the href a browser sees; surrounding
  whitespace kept), one ``srcset`` candidate's URL, or the text inside one CSS ``url()``.
  ``url`` is ``resolve_reference(base, observed)``: absolute http(s), at most
  ``MAX_URL_LENGTH`` characters, not normalized.
- ``position`` is the element's index among all elements of the document in tree order
  (pre-order: ``html`` is 0, then ``head``...), counting the elements the parser adds
  (``html``, ``head``, ``body``). The references of one element share its position and
  differ in ``observed`` (one element naming the same reference twice records it once), so
  the discovery edge's anchor (run, source, position, observed) is unique per reference.
- References that give no http(s) URL (``javascript:``, ``mailto:``, ``data:``, invalid,
  over ``MAX_URL_LENGTH``, empty) are counted in ``skipped``, never returned.
- Only a wrong argument type (``TypeError``) or a negative limit (``ValueError``) raises.
  Any document, valid or not, yields a ``LinkExtraction``. Work is bounded: at most
  ``max_bytes`` of the document is parsed, and of those only the first ``MAX_TAGS`` tags
  (the tree's memory) and only up to where it would nest deeper than ``MAX_DEPTH``
  elements (parsing is quadratic in depth); extraction stops at the first reference past
  ``max_links``.

Decoding bytes: as a browser does, by ``evidence._model.text`` (the decoder the crawler,
rules and reports share): a byte-order mark wins, then ``encoding`` (the charset the
server declared), then a ``<meta>`` charset in the first 1024 bytes, then windows-1252.
Which encoding was used and why is in ``LinkExtraction.encoding`` and ``encoding_source``.
A link's query is encoded in that encoding (the URL standard; ``resolve_reference``), its
path as UTF-8. A ``str`` is parsed as it is (a lone surrogate in it is read as U+FFFD).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

import msgspec
from selectolax.lexbor import LexborHTMLParser

from .._errors import URLError
from .._model.messages import ObservedRef
from .._model.text import Sniffed, decode, sniff
from .._model.urls import MAX_URL_LENGTH, reference_resolver

__all__ = ["MAX_DEPTH", "MAX_TAGS", "REQUISITE_KINDS", "LinkExtraction", "extract_links"]

REQUISITE_KINDS = frozenset({"image", "script", "stylesheet", "style", "media"})
_MAX_REL = 65536  # ObservedRef.rel is Text: at most this many characters.

# tag -> ((attribute, edge_kind), ...); "srcset" attributes hold several URLs.
_TARGETS: dict[str, tuple[tuple[str, str], ...]] = {
    "a": (("href", "link"),),
    "area": (("href", "link"),),
    "link": (("href", "link"),),  # its kind by rel: _link_kind
    "iframe": (("src", "embed"),),
    "frame": (("src", "embed"),),
    "img": (("src", "image"), ("srcset", "image")),
    "source": (("src", "media"), ("srcset", "image")),
    "video": (("src", "media"), ("poster", "image")),
    "audio": (("src", "media"),),
    "track": (("src", "media"),),
    "embed": (("src", "media"),),
    "object": (("data", "media"),),
    "script": (("src", "script"),),
    "input": (("src", "image"),),  # type=image only
}
_REL_TAGS = frozenset({"a", "area", "link"})
_ICONS = frozenset({"icon", "apple-touch-icon", "apple-touch-icon-precomposed", "mask-icon"})

_REL_SPLIT_RE = re.compile(r"[\t\n\f\r ]+")  # HTML's ASCII whitespace, not str.split()'s
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_SURROGATE_RE = re.compile("[\ud800-\udfff]")
# What a document's text holds wherever it has a <base> element, or a style attribute
# (tag and attribute names are never written with character references, and the
# tokenizer lowers only their ASCII letters): without it, the CSS query that would find
# one need not run. Looked for in the text lowered once (``str.lower`` lowers every ASCII
# letter): a case-insensitive regular expression scans a 4 KB page 15 times slower.
_BASE_TAG = "<base"
_STYLE = "style"
_WHITESPACE = "\t\n\f\r "
# CSS: comments out first; then url(...) (quoted or not) and @import "..." (CSS Syntax 4.3).
_CSS_COMMENT_RE = re.compile(r"/\*.*?(?:\*/|$)", re.DOTALL)
_CSS_URL_RE = re.compile(
    r"""url\(\s*(?:"((?:[^"\\\n]|\\.)*)"|'((?:[^'\\\n]|\\.)*)'|((?:[^"'()\s\\]|\\.)*))\s*\)"""
    r"""|@import\s+(?:"((?:[^"\\\n]|\\.)*)"|'((?:[^'\\\n]|\\.)*)')""",
    re.IGNORECASE)
_CSS_ESCAPE_RE = re.compile(r"\\([0-9a-fA-F]{1,6}\s?|.)", re.DOTALL)


# The tree builder checks the stack of open elements at each start tag (the HTML standard's
# "has an element in scope"), so nesting costs time quadratic in depth: 10,000 nested divs
# parse in 0.12 s, 50,000 in 13 s. Browsers cap it (Blink attaches elements past depth 512
# to the element at that depth). Here a document is parsed only up to the tag that would
# nest deeper than this, and the result is marked truncated.
MAX_DEPTH = 4096
# The tree takes memory in proportion to its nodes (~300 bytes each: 17 MiB of tiny links,
# two million nodes, took 600 MB). Only the document up to its MAX_TAGS-th '<' is parsed;
# past it the result is marked truncated, as past max_bytes or max_links.
MAX_TAGS = 100_000
_TAG_RE = re.compile(r"<(/?)([A-Za-z][^\t\n\f\r />]*)")
_VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link",
                   "meta", "source", "track", "wbr", "param", "keygen", "frame", "basefont",
                   "bgsound", "image"})


# A start tag of one of these closes an open element of the names given first (the tree
# builder's rules for p, li, dd/dt, option, a and table cells), so lists of them never nest.
_CLOSES = {"p": ("p",), "li": ("li",), "dt": ("dt", "dd"), "dd": ("dt", "dd"),
           "option": ("option",), "a": ("a",), "tr": ("tr",), "td": ("td", "th"),
           "th": ("td", "th")}


def _nth(text: str, char: str, n: int) -> int | None:
    """Where the ``n``-th ``char`` of ``text`` is, or None if there are fewer."""
    if text.count(char) < n:
        return None
    at = -1
    for _ in range(n):
        at = text.find(char, at + 1)
    return at


def _depth_cut(text: str, limit: int = MAX_DEPTH) -> int | None:
    """Where the document would nest deeper than ``limit`` (an estimate that errs deep:
    tags in comments and scripts count), or None. End tags close the innermost open element
    of their name, as the tree builder's "any other end tag" does."""
    if text.count("<") <= limit:
        return None
    stack: list[str] = []
    open_names: dict[str, int] = {}

    def close(name: str) -> None:
        while stack:
            top = stack.pop()
            open_names[top] -= 1
            if top == name:
                return

    for match in _TAG_RE.finditer(text):
        name = match.group(2).lower()
        if match.group(1):  # an end tag
            if open_names.get(name):
                close(name)
            continue
        if name in _VOID:
            continue
        for closed in _CLOSES.get(name, ()):
            if open_names.get(closed):
                close(closed)
        stack.append(name)
        open_names[name] = open_names.get(name, 0) + 1
        if len(stack) > limit:
            return match.start()
    return None


class LinkExtraction(msgspec.Struct, frozen=True):
    """The references found in one document."""

    refs: list[ObservedRef]
    truncated: bool  # more than max_links references, or only a prefix was parsed
    base_url: str  # the base in effect: the first usable <base href>, if any
    skipped: int  # references that did not resolve to an http(s) URL
    encoding: str | None = None  # the WHATWG encoding the bytes were read in (None: str input)
    encoding_source: str | None = None  # why: "bom", "header", "meta" or "default"


class _Stop(Exception):
    """max_links references were found and there is another one."""


class _Collector:
    """The references of one document, in order, resolved against its base."""

    def __init__(self, base: str, max_links: int, encoding: str | None) -> None:
        self.base = base
        self.resolve = reference_resolver(base, encoding=encoding)
        self.max_links = max_links
        self.refs: list[ObservedRef] = []
        self.skipped = 0

    def add(self, observed: str, position: int, tag: str, attr: str, kind: str,
            rel: str = "") -> None:
        url = _resolve(self.resolve, observed)
        if url is None:
            self.skipped += 1
            return
        if len(self.refs) >= self.max_links:
            raise _Stop
        self.refs.append(ObservedRef(observed=observed, url=url, position=position, tag=tag,
                                     attr=attr, rel=rel, edge_kind=kind))  # type: ignore[arg-type]


def _resolve(resolve: Callable[[str], str], observed: str) -> str | None:
    """``observed`` resolved (``resolve``: a ``reference_resolver``), or None if unusable."""
    # Empty: a self-reference, and ObservedRef.observed may not be empty. Over-long
    # references are refused before the work of resolving them.
    if not observed or len(observed) > MAX_URL_LENGTH:
        return None
    try:
        url = resolve(observed)
    except (URLError, ValueError):
        return None
    if _SURROGATE_RE.search(url):  # cannot be encoded or stored
        return None
    return url


def _elements(tree: LexborHTMLParser) -> Iterator[tuple[int, object]]:
    """(position, node) of every element, in tree order (comments and text left out)."""
    root = tree.root
    if root is None:
        return
    position = 0
    for node in root.traverse(include_text=False):
        if node.is_element_node:
            yield position, node
            position += 1


def _base(tree: LexborHTMLParser, lowered: str, document_url: str) -> str:
    """The first <base> with an href, anywhere in the document, resolved; or the URL
    (``lowered``: the document's text, lowered)."""
    # A tree's first CSS query sets up lexbor's selector engine (about 25 us a page): asked
    # only of a document whose text could hold the element at all.
    if _BASE_TAG not in lowered:
        return document_url
    for node in tree.css("base[href]"):
        href = node.attributes.get("href") or ""
        resolved = _resolve(reference_resolver(document_url), href)
        return resolved or document_url
    return document_url


def _normalize_rel(rel: str) -> str:
    if not rel:  # most links have none
        return ""
    tokens = _REL_SPLIT_RE.split(rel.translate(_ASCII_LOWER))
    text = " ".join(token for token in tokens if token)
    if len(text) > _MAX_REL:  # hostile only; keep the whole tokens that fit
        text = text[: _MAX_REL + 1].rpartition(" ")[0]
    return text


def _link_kind(rel: str) -> str:
    tokens = set(rel.split(" "))
    if "stylesheet" in tokens:
        return "stylesheet"
    if tokens & _ICONS:
        return "image"
    return "link"


def srcset_urls(value: str) -> Iterator[str]:
    """The URLs of a ``srcset`` attribute (HTML standard, "parse a srcset attribute"): each
    candidate is a URL (a run of non-whitespace, commas at its end removed) and optional
    descriptors up to the next comma outside parentheses."""
    n, pos = len(value), 0
    while True:
        while pos < n and (value[pos] in _WHITESPACE or value[pos] == ","):
            pos += 1
        if pos >= n:
            return
        start = pos
        while pos < n and value[pos] not in _WHITESPACE:
            pos += 1
        url = value[start:pos]
        if url.endswith(","):
            url = url.rstrip(",")
        else:  # descriptors: up to a comma not inside parentheses
            depth = 0
            while pos < n:
                char = value[pos]
                if char == "(":
                    depth += 1
                elif char == ")" and depth:
                    depth -= 1
                elif char == "," and not depth:
                    pos += 1
                    break
                pos += 1
        if url:
            yield url


def css_urls(css: str) -> Iterator[str]:
    """The references in CSS text: ``url(...)`` (quoted or not) and ``@import "..."``,
    comments skipped and CSS escapes decoded."""
    for match in _CSS_URL_RE.finditer(_CSS_COMMENT_RE.sub(" ", css)):
        text = next(group for group in match.groups() if group is not None)
        if "\\" in text:
            text = _CSS_ESCAPE_RE.sub(_css_unescape, text)
        if text.strip(_WHITESPACE):
            yield text


def _css_unescape(match: re.Match[str]) -> str:
    escaped = match.group(1)
    if escaped[0] in "0123456789abcdefABCDEF":
        code = int(escaped.strip(), 16)
        return chr(code) if 0 < code <= 0x10FFFF and not 0xD800 <= code <= 0xDFFF else "\ufffd"
    return "" if escaped == "\n" else escaped


def _collect(tree: LexborHTMLParser, lowered: str, out: _Collector) -> None:
    styled = ({node.mem_id for node in tree.css("[style]")} if _STYLE in lowered
              else set())
    for position, node in _elements(tree):
        tag = node.tag  # type: ignore[attr-defined]
        targets = _TARGETS.get(tag)
        has_style = styled and node.mem_id in styled  # type: ignore[attr-defined]
        if targets is None and not has_style and tag != "style":
            continue
        attrs = node.attributes  # type: ignore[attr-defined]
        seen: set[str] = set()

        def add(observed: str, attr: str, kind: str, rel: str = "",
                _position: int = position, _tag: str = tag, _seen: set[str] = seen) -> None:
            if observed in _seen:  # one element, one edge per reference
                return
            _seen.add(observed)
            out.add(observed, _position, _tag, attr, kind, rel)

        if targets is not None and not (tag == "input" and (
                attrs.get("type") or "").translate(_ASCII_LOWER) != "image"):
            rel = _normalize_rel(attrs.get("rel") or "") if tag in _REL_TAGS else ""
            for attr, kind in targets:
                value = attrs.get(attr)
                if value is None:
                    if attr not in attrs:
                        continue
                    value = ""  # a valueless attribute is the empty string
                if attr == "srcset":
                    for url in srcset_urls(value):
                        add(url, attr, kind)
                    continue
                if tag == "link":
                    kind = _link_kind(rel)
                if not value:
                    out.skipped += 1  # an empty reference: the document itself
                    continue
                add(value, attr, kind, rel)
        if has_style:
            for url in css_urls(attrs.get("style") or ""):
                add(url, "style", "style")
        if tag == "style":
            for url in css_urls(node.text(deep=True) or ""):  # type: ignore[attr-defined]
                add(url, "#text", "style")


def extract_links(
    html: bytes | str,
    base_url: str,
    *,
    encoding: str | None = None,
    max_links: int = 10_000,
    max_bytes: int = 8 * 1024 * 1024,
    sniffed: Sniffed | None = None,
) -> LinkExtraction:
    """Extract the references in ``html``, a document fetched from ``base_url``.

    ``encoding`` is the charset the server declared (a label), if any; ``sniffed``, what
    ``sniff(html, encoding)`` answered, when the caller has asked already. At most ``max_links``
    references are returned and at most ``max_bytes`` of the document is parsed;
    ``truncated`` says either limit cut the result short.
    """
    if not isinstance(html, bytes | bytearray | str):
        raise TypeError(f"html must be bytes or str, not {type(html).__name__}")
    if not isinstance(base_url, str):
        raise TypeError(f"base_url must be str, not {type(base_url).__name__}")
    if encoding is not None and not isinstance(encoding, str):
        raise TypeError(f"encoding must be str or None, not {type(encoding).__name__}")
    if sniffed is not None and not isinstance(sniffed, Sniffed):
        raise TypeError(f"sniffed must be Sniffed or None, not {type(sniffed).__name__}")
    for name, limit in (("max_links", max_links), ("max_bytes", max_bytes)):
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise TypeError(f"{name} must be int, not {type(limit).__name__}")
        if limit < 0:
            raise ValueError(f"{name} must not be negative, got {limit}")

    cut = len(html) > max_bytes
    if isinstance(html, str):
        sniffed = None
        text = html[:max_bytes] if cut else html
        if _SURROGATE_RE.search(text):
            text = _SURROGATE_RE.sub("\ufffd", text)
    else:
        data = memoryview(html)[:max_bytes] if cut else html
        sniffed = sniffed or sniff(data, encoding)  # the same: sniffing reads 1,024 bytes
        text = decode(data, sniffed.encoding)
    many = _nth(text, "<", MAX_TAGS + 1)
    if many is not None:
        text, cut = text[:many], True
    deep = _depth_cut(text)
    if deep is not None:
        text, cut = text[:deep], True
    tree = LexborHTMLParser(text)
    lowered = text.lower()
    base = _base(tree, lowered, base_url)
    out = _Collector(base, max_links, sniffed and sniffed.encoding)
    truncated = cut
    try:
        _collect(tree, lowered, out)
    except _Stop:
        truncated = True
    return LinkExtraction(refs=out.refs, truncated=truncated, base_url=base,
                          skipped=out.skipped, encoding=sniffed and sniffed.encoding,
                          encoding_source=sniffed and sniffed.source)
