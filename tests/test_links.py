"""Tests for evidence._crawl.links: link extraction with the stdlib HTML tokenizer."""

from __future__ import annotations

import html as html_lib
import time
import tracemalloc
from urllib.parse import urlsplit

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evidence._crawl import links as _links
from evidence._crawl.links import LinkExtraction, extract_links
from evidence._errors import URLError
from evidence._model.messages import ObservedRef
from evidence._model.urls import MAX_URL_LENGTH, resolve_reference

DOC = "http://h.example/dir/page.html"


def test_public_api() -> None:
    assert sorted(_links.__all__) == ["LinkExtraction", "extract_links"]


def summary(result: LinkExtraction) -> list[tuple[str, str, int]]:
    return [(ref.observed, ref.url, ref.position) for ref in result.refs]


# (document, [(observed, url, position)], skipped). The document URL is DOC throughout.
EXAMPLES = [
    # relative, absolute, protocol-relative, root-relative, dot segments, query, fragment
    ('<a href="next.html">', [("next.html", "http://h.example/dir/next.html", 0)], 0),
    ('<a href="https://o.example/p?q#f">', [("https://o.example/p?q#f",) * 2 + (0,)], 0),
    ("<a href=//cdn.example/x>", [("//cdn.example/x", "http://cdn.example/x", 0)], 0),
    ("<a href=/root>", [("/root", "http://h.example/root", 0)], 0),
    ("<a href='../up'>", [("../up", "http://h.example/up", 0)], 0),
    ("<a href=?q=1>", [("?q=1", "http://h.example/dir/page.html?q=1", 0)], 0),
    ("<a href=#top>", [("#top", "http://h.example/dir/page.html#top", 0)], 0),
    # whitespace is kept in observed; resolution strips it (as browsers do)
    ('<a href="  /p\n ">', [("  /p\n ", "http://h.example/p", 0)], 0),
    ('<a href="/a\r\nb">', [("/a\nb", "http://h.example/ab", 0)], 0),  # CRLF read as LF
    # character references are decoded: observed is what a browser sees
    ('<a href="/s?a=1&amp;b=2&#x41;&#66;">', [("/s?a=1&b=2AB", "http://h.example/s?a=1&b=2AB", 0)],
     0),
    ('<a href="/&lt;x&gt;">', [("/<x>", "http://h.example/<x>", 0)], 0),
    # schemes other than http(s), empty and valueless hrefs are counted, not returned
    ('<a href="javascript:void(0)"><a href="mailto:a@b.example"><a href="data:,x">'
     '<a href="tel:1"><a href=""><a href><a href="http://[::1">', [], 7),
    ('<a href="JavaScript:x"><a href=/ok>', [("/ok", "http://h.example/ok", 1)], 1),
    ("<a>no href</a><a name=x>", [], 0),
    # positions count every start tag, including void and self-closing ones
    ("<html><body><p>t<br/><a href=/x>a</a><img src=i><a href=/x>",
     [("/x", "http://h.example/x", 4), ("/x", "http://h.example/x", 6)], 0),
    # base: applies to later references only; the first base with an href wins
    ('<a href=x><base href="http://o.example/d/"><a href=x>',
     [("x", "http://h.example/dir/x", 0), ("x", "http://o.example/d/x", 2)], 0),
    ('<base href="/b/"><base href="http://o.example/"><a href=x>',
     [("x", "http://h.example/b/x", 2)], 0),
    ('<base target=_top><base href="http://o.example/"><a href=x>',
     [("x", "http://o.example/x", 2)], 0),
    # an unusable first base is ignored, and still blocks later ones
    ('<base href="javascript:x"><base href="http://o.example/"><a href=x>',
     [("x", "http://h.example/dir/x", 2)], 0),
    # duplicate attributes: the first wins, as in browsers
    ("<a href=/one href=/two>", [("/one", "http://h.example/one", 0)], 0),
    # case-insensitive tag and attribute names
    ("<A HREF=/up>", [("/up", "http://h.example/up", 0)], 0),
    # markup that is not a tag holds no links
    ("<!-- <a href=/c> --><a href=/d>", [("/d", "http://h.example/d", 0)], 0),
    ("<script>x='<a href=/s>'</script><style><a href=/t></style>", [], 0),
    ("<textarea><a href=/u></textarea><title><a href=/v></title>", [], 0),
    ("<iframe src=/f><a href=/w></iframe>", [("/f", "http://h.example/f", 0)], 0),
    # browser comment rules: "<!-->" is a whole comment, "-- >" does not end one
    ("<!--><a href=/e>", [("/e", "http://h.example/e", 0)], 0),
    ("<!-- -- ><a href=/no> --><a href=/yes>", [("/yes", "http://h.example/yes", 0)], 0),
    # "<![" outside SVG is a bogus comment up to the next '>'
    ("<![CDATA[ x > <a href=/g> ]]>", [("/g", "http://h.example/g", 0)], 0),
    ("<![foo[ <a href=/no>", [], 0),  # the stdlib raises on the unknown keyword
    ("<![foo[ ]><a href=/h>", [("/h", "http://h.example/h", 0)], 0),
    # a tag, comment or declaration left open at end of file swallows the rest
    ('<a href=/ok><a href="/cut', [("/ok", "http://h.example/ok", 0)], 0),
    ("<a href=/ok><!-- <a href=/no>", [("/ok", "http://h.example/ok", 0)], 0),
    ("<a href=/ok><!doctype <a href=/no", [("/ok", "http://h.example/ok", 0)], 0),
    # junk that must not confuse the tokenizer
    ("<<a href=/i>>", [("/i", "http://h.example/i", 0)], 0),
    ("<p <a href=/j>", [], 0),  # one tag "p" with attributes "<a" and "href"
    ("</a href=/k><a href=/l/>", [("/l/", "http://h.example/l/", 0)], 0),
]


@pytest.mark.parametrize(("document", "expected", "skipped"), EXAMPLES)
def test_examples(document: str, expected: list[tuple[str, str, int]], skipped: int) -> None:
    result = extract_links(document, DOC)
    assert summary(result) == expected
    assert result.skipped == skipped
    assert result.truncated is False
    # bytes give the same answer as str (and say how they were decoded)
    from_bytes = extract_links(document.encode(), DOC)
    assert (from_bytes.encoding, from_bytes.encoding_source) == ("windows-1252", "default")
    assert msgspec.structs.replace(from_bytes, encoding=None, encoding_source=None) == result


def test_base_url_reported() -> None:
    assert extract_links("<a href=x>", DOC).base_url == DOC
    assert extract_links("<base href='../b/'>", DOC).base_url == "http://h.example/b/"
    assert extract_links("<base href='mailto:x'>", DOC).base_url == DOC


def test_tag_attr_rel_and_edge_kind() -> None:
    document = (
        '<link rel=" Stylesheet\tPRELOAD\n " href=/s.css>'
        '<a href=/a rel="NoFollow  UGC">'
        '<map><area href=/area shape=rect rel=Nofollow></map>'
        "<iframe src=/frame.html rel=x></iframe><frameset><frame src=/f2></frameset>"
        "<img src=/img.png><script src=/s.js></script><a href=/plain>"
    )
    refs = extract_links(document, DOC).refs
    assert [(r.tag, r.attr, r.rel, r.edge_kind, r.url) for r in refs] == [
        ("link", "href", "stylesheet preload", "link", "http://h.example/s.css"),
        ("a", "href", "nofollow ugc", "link", "http://h.example/a"),
        ("area", "href", "nofollow", "link", "http://h.example/area"),
        ("iframe", "src", "", "embed", "http://h.example/frame.html"),
        ("frame", "src", "", "embed", "http://h.example/f2"),
        ("a", "href", "", "link", "http://h.example/plain"),
    ]


def test_refs_are_valid_messages() -> None:
    refs = extract_links('<a href="/x" rel="a  b">', DOC).refs
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(refs), type=list[ObservedRef]) == refs


def test_million_links_truncate_with_bounded_time_and_memory() -> None:
    page = b'<a href="/p">x</a>' * 1_000_000  # 17 MiB; every link needs no budget
    tracemalloc.start()
    started = time.perf_counter()
    try:
        result = extract_links(page, DOC, max_links=1000, max_bytes=len(page))
        elapsed = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.truncated is True
    assert len(result.refs) == 1000
    assert [r.position for r in result.refs[:3]] == [0, 1, 2]
    # Parsing all of it takes ~30 s and keeps a million refs; stopping keeps neither.
    assert elapsed < 5
    assert peak < 40 * 1024 * 1024  # the decoded text (17 MiB) dominates


def test_default_limits_on_a_million_links() -> None:
    result = extract_links(b"<a href=/p>" * 1_000_000, DOC)
    assert result.truncated is True
    assert len(result.refs) == 10_000


def test_max_links_edges() -> None:
    assert extract_links("<a href=/a><a href=/b>", DOC, max_links=2).truncated is False
    result = extract_links("<a href=/a><a href=/b><a href=/c>", DOC, max_links=2)
    assert (len(result.refs), result.truncated) == (2, True)
    result = extract_links("<a href=/a>", DOC, max_links=0)
    assert (result.refs, result.truncated) == ([], True)
    # skipped hrefs do not count against max_links
    result = extract_links("<a href=/a><a href=mailto:x>", DOC, max_links=1)
    assert (len(result.refs), result.skipped, result.truncated) == (1, 1, False)


@pytest.mark.parametrize("as_bytes", [False, True])
def test_max_bytes(as_bytes: bool) -> None:
    document = "<a href=/first>" + " " * 100 + "<a href=/second>"
    data: str | bytes = document.encode() if as_bytes else document
    whole = extract_links(data, DOC, max_bytes=len(document))
    assert (len(whole.refs), whole.truncated) == (2, False)
    cut = extract_links(data, DOC, max_bytes=len(document) - 1)  # "<a href=/second" is open
    assert (summary(cut), cut.truncated) == ([("/first", "http://h.example/first", 0)], True)
    empty = extract_links(data, DOC, max_bytes=0)
    assert msgspec.structs.replace(empty, encoding=None, encoding_source=None) == (
        LinkExtraction([], True, DOC, 0))


LATIN1_PAGE = b'<meta charset="ISO-8859-1"><a href="/caf\xe9">\x80</a><a href="/\x80">'


def test_meta_charset_sniffing() -> None:
    result = extract_links(LATIN1_PAGE, DOC)
    # Browsers read the latin-1 label as windows-1252, where 0x80 is the euro sign.
    assert [r.observed for r in result.refs] == ["/café", "/€"]
    http_equiv = b'<meta http-equiv=Content-Type content="text/html; charset=windows-1251">'
    assert extract_links(http_equiv + b"<a href=/\xe4>", DOC).refs[0].observed == "/д"


@pytest.mark.parametrize(
    ("data", "encoding", "observed"),
    [
        (LATIN1_PAGE, "utf-8", "/caf\ufffd"),  # the declared encoding beats the meta tag
        (LATIN1_PAGE, "no-such-codec", "/café"),  # an unknown label is ignored
        (LATIN1_PAGE, "hex", "/café"),  # and so is a codec that is not a text encoding
        (LATIN1_PAGE, "idna", "/café"),  # or one that cannot replace errors
        (LATIN1_PAGE, "utf\x00", "/café"),
        (b"\xef\xbb\xbf<a href=/\xc3\xa9>", "latin-1", "/é"),  # a BOM beats everything
        ("<a href=/é>".encode("utf-16"), None, "/é"),
        (b'<meta charset="utf-16"><a href=/\xc3\xa9>', None, "/é"),  # meta UTF-16 is UTF-8
        (b'<meta charset="utf-7"><a href="/+AGE-">', None, "/+AGE-"),  # not ASCII-compatible
        (b'<meta charset="bogus"><a href=/\xc3\xa9>', None, "/Ã©"),  # the default: windows-1252
        (b"<a href=/\xe9>" + b" " * 1024 + b'<meta charset="utf-8">', None, "/é"),  # too late
    ],
)
def test_encoding_choice(data: bytes, encoding: str | None, observed: str) -> None:
    assert extract_links(data, DOC, encoding=encoding).refs[0].observed == observed


def test_invalid_utf8_and_nul_bytes() -> None:
    data = b'<a href="/\xff\xfe\xc3">\xff<a href="/n\x00b">\x00<a\x00 href=/x>'
    result = extract_links(data, DOC, encoding="utf-8")
    assert [r.observed for r in result.refs] == ["/\ufffd\ufffd\ufffd", "/n\ufffdb"]
    assert result.refs[0].url == "http://h.example/\ufffd\ufffd\ufffd"


def test_long_and_unstorable_hrefs_are_skipped() -> None:
    long = "/" + "a" * 100_000
    result = extract_links(f'<a href="{long}"><a href="/{"b" * (MAX_URL_LENGTH - 1)}">', DOC)
    assert (result.refs, result.skipped) == ([], 2)  # the second resolves past the limit
    fits = extract_links(f'<a href="/{"c" * 100}">', DOC)
    assert len(fits.refs) == 1
    # a whitespace-padded href still has to fit: observed is stored verbatim
    assert extract_links(f'<a href="{" " * MAX_URL_LENGTH}/x">', DOC).skipped == 1
    # lone surrogates (only possible in str input) cannot be encoded for storage
    assert extract_links('<a href="/\ud800">', DOC).skipped == 1
    assert extract_links('<a href="x">', "http://h.example/\udc00/").skipped == 1
    # a huge rel keeps the whole tokens that fit in ObservedRef.rel
    rel = extract_links(f'<a href=/r rel="{"ab " * 30_000}">', DOC).refs[0].rel
    assert len(rel) <= 65536 and rel.endswith("ab") and set(rel.split(" ")) == {"ab"}


def test_bad_document_url_skips_relative_links() -> None:
    result = extract_links("<a href=/x><a href=http://o.example/>", "not a url")
    assert summary(result) == [("http://o.example/", "http://o.example/", 1)]
    assert result.skipped == 1


MIB = 1024 * 1024


@pytest.mark.parametrize(
    "document",
    [
        # With HTMLParser.close() each of these takes minutes: it rescans to the end once
        # per character of an unterminated construct.
        "<!" * (MIB // 2),
        "<![" * (MIB // 3),
        "</" * (MIB // 2),
        "<?" * (MIB // 2),
        "&#" * (MIB // 2),
        "<!--" + "x" * MIB,
        '<a href="' + "x" * MIB,
        "<a " * (MIB // 12),
        "<script>" + "</" * (MIB // 2),
        # deep nesting and unclosed tags: the tokenizer keeps no stack
        "<div>" * 50_000 + "<a href=/deep>",
        "<b><i><a href=/x>" * 5_000,
    ],
    ids=lambda document: repr(document[:12]),
)
def test_hostile_documents_are_fast(document: str) -> None:
    started = time.perf_counter()
    result = extract_links(document, DOC)
    assert time.perf_counter() - started < 2
    assert result.truncated is False
    assert all(ref.url.startswith("http://h.example/") for ref in result.refs)


@pytest.mark.parametrize(
    ("args", "kwargs", "error"),
    [
        ((123, DOC), {}, TypeError),
        ((memoryview(b"<a>"), DOC), {}, TypeError),
        (("<a>", b"http://h/"), {}, TypeError),
        (("<a>", DOC), {"encoding": b"utf-8"}, TypeError),
        (("<a>", DOC), {"max_links": "10"}, TypeError),
        (("<a>", DOC), {"max_bytes": True}, TypeError),
        (("<a>", DOC), {"max_links": -1}, ValueError),
        (("<a>", DOC), {"max_bytes": -1}, ValueError),
    ],
)
def test_wrong_arguments(args: tuple, kwargs: dict, error: type[Exception]) -> None:
    with pytest.raises(error):
        extract_links(*args, **kwargs)


# --- properties ---------------------------------------------------------------------

FRAGMENTS = [
    "<a href=", "<A HREF='", "<base href=", "<link rel=", "<area href=", "<iframe src=",
    '"', "'", ">", "/>", " ", "\n", "\r", "\x00", "<!--", "-->", "<!", "<![", "<?", "</",
    "<script>", "</script>", "<textarea>", "&amp;", "&#", "&#x0;", "&lt", "/x", "../",
    "//h.example", "http://", "https://o.example/", "javascript:", "mailto:", "?q#f",
    "\\", "%", "[", "é", "\ufffd",
]
markup = st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=5), max_size=40).map("".join)


def check(result: LinkExtraction, document_url: str) -> None:
    assert result.skipped >= 0
    positions = [ref.position for ref in result.refs]
    assert positions == sorted(set(positions))
    for ref in result.refs:
        parts = urlsplit(ref.url)
        assert parts.scheme in ("http", "https") and parts.netloc
        assert 0 < len(ref.observed) <= MAX_URL_LENGTH and len(ref.url) <= MAX_URL_LENGTH
        # resolved against the document URL, or the base in effect after a <base>
        bases = {document_url, result.base_url}
        assert ref.url in {resolve_reference(base, ref.observed) for base in bases}
    # every result can be stored: the message schema accepts it
    encoded = msgspec.msgpack.encode(result.refs)
    assert msgspec.msgpack.decode(encoded, type=list[ObservedRef]) == result.refs


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(document=markup | st.text(max_size=200), url=st.sampled_from([DOC, "https://x/", "%"]))
def test_any_text_never_raises(document: str, url: str) -> None:
    check(extract_links(document, url), url)


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=300) | markup.map(lambda s: s.encode("utf-8", "replace")),
       encoding=st.sampled_from([None, "utf-8", "latin-1", "utf-16", "shift_jis", "nope"]),
       max_links=st.integers(0, 5), max_bytes=st.integers(0, 400))
def test_any_bytes_never_raise(
    data: bytes, encoding: str | None, max_links: int, max_bytes: int
) -> None:
    result = extract_links(data, DOC, encoding=encoding, max_links=max_links,
                           max_bytes=max_bytes)
    check(result, DOC)
    assert len(result.refs) <= max_links


def browser_view(href: str) -> str:
    return href.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "\ufffd")


def resolves(href: str) -> bool:
    try:
        resolve_reference(DOC, href)
    except URLError:
        return False
    return 0 < len(href) <= MAX_URL_LENGTH


hrefs = st.lists(
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)
    | st.sampled_from(["/a", "b?c=1&d=2", "//o.example/", 'q"uote', "<x>", "&amp;", " s "]),
    max_size=15,
)


@settings(max_examples=300, deadline=None)
@given(hrefs=hrefs, quote=st.sampled_from(['"', "'"]))
def test_escaped_hrefs_round_trip(hrefs: list[str], quote: str) -> None:
    document = "".join(
        f"<a href={quote}{html_lib.escape(href, quote=True)}{quote}>t</a>\n" for href in hrefs
    )
    result = extract_links(document, DOC)
    expected = [
        (browser_view(href), index) for index, href in enumerate(hrefs)
        if resolves(browser_view(href))
    ]
    assert [(ref.observed, ref.position) for ref in result.refs] == expected
    assert result.skipped == len(hrefs) - len(expected)
    check(result, DOC)


def test_tokenizer_failure_keeps_the_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(self: object, i: int, report: int = 1) -> int:
        raise AssertionError("stdlib tokenizer bug")

    monkeypatch.setattr(_links._LinkParser, "parse_pi", fail)
    result = extract_links("<a href=/before><?x><a href=/after>", DOC)
    assert summary(result) == [("/before", "http://h.example/before", 0)]
    assert result.truncated is True
