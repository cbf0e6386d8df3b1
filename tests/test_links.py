"""Tests for evidence._crawl.links: link extraction with selectolax's lexbor parser.

tests/oldlinks.py is the extractor it replaced (the standard library's tokenizer), kept
only as the oracle of the differential tests at the end: both must find the same links
where both look."""

from __future__ import annotations

import html as html_lib
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
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
ROOT = Path(__file__).resolve().parent.parent


def test_public_api() -> None:
    assert sorted(_links.__all__) == ["LinkExtraction", "MAX_DEPTH", "MAX_TAGS",
                                      "REQUISITE_KINDS", "extract_links"]


def summary(result: LinkExtraction) -> list[tuple[str, str]]:
    return [(ref.observed, ref.url) for ref in result.refs]


# (document, [(observed, url)], skipped). The document URL is DOC throughout.
EXAMPLES = [
    # relative, absolute, protocol-relative, root-relative, dot segments, query, fragment
    ('<a href="next.html">', [("next.html", "http://h.example/dir/next.html")], 0),
    ('<a href="https://o.example/p?q#f">', [("https://o.example/p?q#f",) * 2], 0),
    ("<a href=//cdn.example/x>", [("//cdn.example/x", "http://cdn.example/x")], 0),
    ("<a href=/root>", [("/root", "http://h.example/root")], 0),
    ("<a href='../up'>", [("../up", "http://h.example/up")], 0),
    ("<a href=?q=1>", [("?q=1", "http://h.example/dir/page.html?q=1")], 0),
    ("<a href=#top>", [("#top", "http://h.example/dir/page.html#top")], 0),
    # whitespace is kept in observed; resolution strips it (as browsers do)
    ('<a href="  /p\n ">', [("  /p\n ", "http://h.example/p")], 0),
    ('<a href="/a\r\nb">', [("/a\nb", "http://h.example/ab")], 0),  # CRLF read as LF
    # character references are decoded: observed is what a browser sees
    ('<a href="/s?a=1&amp;b=2&#x41;&#66;">', [("/s?a=1&b=2AB", "http://h.example/s?a=1&b=2AB")],
     0),
    ('<a href="/&lt;x&gt;">', [("/<x>", "http://h.example/<x>")], 0),
    # schemes other than http(s), empty and valueless hrefs are counted, not returned
    ('<a href="javascript:void(0)"><a href="mailto:a@b.example"><a href="data:,x">'
     '<a href="tel:1"><a href=""><a href><a href="http://[::1">', [], 7),
    ('<a href="JavaScript:x"><a href=/ok>', [("/ok", "http://h.example/ok")], 1),
    ("<a>no href</a><a name=x>", [], 0),
    # the same reference in two elements is two references
    ("<html><body><p>t<br/><a href=/x>a</a><a href=/x>",
     [("/x", "http://h.example/x"), ("/x", "http://h.example/x")], 0),
    # base: the first base with an href, wherever it is, applies to every reference
    ('<a href=x><base href="http://o.example/d/"><a href=x>',
     [("x", "http://o.example/d/x"), ("x", "http://o.example/d/x")], 0),
    ('<base href="/b/"><base href="http://o.example/"><a href=x>',
     [("x", "http://h.example/b/x")], 0),
    ('<base target=_top><base href="http://o.example/"><a href=x>',
     [("x", "http://o.example/x")], 0),
    ('<html><head><title>t</title><base href="/h/"></head><body><a href=x>',
     [("x", "http://h.example/h/x")], 0),
    # an unusable first base is ignored, and still blocks later ones
    ('<base href="javascript:x"><base href="http://o.example/"><a href=x>',
     [("x", "http://h.example/dir/x")], 0),
    # duplicate attributes: the first wins, as in browsers
    ("<a href=/one href=/two>", [("/one", "http://h.example/one")], 0),
    # case-insensitive tag and attribute names (a base and a style attribute too: the
    # extractor looks for them in the text before it asks the parsed tree)
    ("<A HREF=/up>", [("/up", "http://h.example/up")], 0),
    ('<BaSe HrEf="/b/"><a href=x>', [("x", "http://h.example/b/x")], 0),
    ('<P STYLE="background: url(s.png)">', [("s.png", "http://h.example/dir/s.png")], 0),
    # only ASCII letters fold: a long s (U+017F) does not make a style attribute
    ('<p \u017ftyle="background: url(s.png)"><BASE\u212a href=/k/><a href=x>',
     [("x", "http://h.example/dir/x")], 0),
    # markup that is not a tag holds no links
    ("<!-- <a href=/c> --><a href=/d>", [("/d", "http://h.example/d")], 0),
    ("<script>x='<a href=/s>'</script><style><a href=/t></style>", [], 0),
    ("<textarea><a href=/u></textarea><title><a href=/v></title>", [], 0),
    ("<iframe src=/f><a href=/w></iframe>", [("/f", "http://h.example/f")], 0),
    # browser comment rules: "<!-->" is a whole comment, "-- >" does not end one
    ("<!--><a href=/e>", [("/e", "http://h.example/e")], 0),
    ("<!-- -- ><a href=/no> --><a href=/yes>", [("/yes", "http://h.example/yes")], 0),
    # "<![" outside SVG is a bogus comment up to the next '>'
    ("<![CDATA[ x > <a href=/g> ]]>", [("/g", "http://h.example/g")], 0),
    ("<![foo[ <a href=/no>", [], 0),
    ("<![foo[ ]><a href=/h>", [("/h", "http://h.example/h")], 0),
    # a tag, comment or declaration left open at end of file swallows the rest
    ('<a href=/ok><a href="/cut', [("/ok", "http://h.example/ok")], 0),
    ("<a href=/ok><!-- <a href=/no>", [("/ok", "http://h.example/ok")], 0),
    ("<a href=/ok><!doctype <a href=/no", [("/ok", "http://h.example/ok")], 0),
    # junk that must not confuse the tokenizer
    ("<<a href=/i>>", [("/i", "http://h.example/i")], 0),
    ("<p <a href=/j>", [], 0),  # one tag "p" with attributes "<a" and "href"
    ("</a href=/k><a href=/l/>", [("/l/", "http://h.example/l/")], 0),
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
        '<link rel=" Stylesheet\tPRELOAD\n " href=/s.css><link rel=next href=/n>'
        '<a href=/a rel="NoFollow  UGC">'
        '<map><area href=/area shape=rect rel=Nofollow></map>'
        "<iframe src=/frame.html rel=x></iframe>"
        "<img src=/img.png><script src=/s.js></script><a href=/plain>"
    )
    refs = extract_links(document, DOC).refs
    assert [(r.tag, r.attr, r.rel, r.edge_kind, r.url) for r in refs] == [
        ("link", "href", "stylesheet preload", "stylesheet", "http://h.example/s.css"),
        ("link", "href", "next", "link", "http://h.example/n"),
        ("a", "href", "nofollow ugc", "link", "http://h.example/a"),
        ("area", "href", "nofollow", "link", "http://h.example/area"),
        ("iframe", "src", "", "embed", "http://h.example/frame.html"),
        ("img", "src", "", "image", "http://h.example/img.png"),
        ("script", "src", "", "script", "http://h.example/s.js"),
        ("a", "href", "", "link", "http://h.example/plain"),
    ]
    frames = extract_links("<frameset><frame src=/f1><frame src=/f2></frameset>", DOC).refs
    assert [(r.tag, r.edge_kind, r.url) for r in frames] == [
        ("frame", "embed", "http://h.example/f1"), ("frame", "embed", "http://h.example/f2")]


def test_page_requisites_are_edges_of_their_own_kinds() -> None:
    document = (
        '<html><head><link rel="shortcut icon" href=/fav.ico>'
        '<style>body { background: url( "bg.png" ) } @import "more.css";'
        " /* url(commented.png) */ p { background: url(p\\.png) }</style></head><body>"
        '<img src=i.png srcset="i1.png 1x, i2.png 2x, data:x 3x">'
        '<picture><source srcset="w.webp 100w,s.webp  200w" type=image/webp></picture>'
        '<div style="background: URL(d.png)"></div>'
        "<video poster=p.jpg src=v.mp4><source src=v.webm><track src=t.vtt></video>"
        "<audio src=a.ogg></audio><embed src=e.swf><object data=o.svg></object>"
        '<input type=IMAGE src=btn.png><input type=text src=no.png>'
        '<img src="same.png" srcset="same.png 2x">'
    )
    got = [(r.tag, r.attr, r.edge_kind, r.observed) for r in extract_links(document, DOC).refs]
    assert got == [
        ("link", "href", "image", "/fav.ico"),
        ("style", "#text", "style", "bg.png"),
        ("style", "#text", "style", "more.css"),
        ("style", "#text", "style", "p.png"),  # a CSS escape decoded
        ("img", "src", "image", "i.png"),
        ("img", "srcset", "image", "i1.png"),
        ("img", "srcset", "image", "i2.png"),  # data: is counted as skipped
        ("source", "srcset", "image", "w.webp"),
        ("source", "srcset", "image", "s.webp"),
        ("div", "style", "style", "d.png"),
        ("video", "src", "media", "v.mp4"),
        ("video", "poster", "image", "p.jpg"),
        ("source", "src", "media", "v.webm"),
        ("track", "src", "media", "t.vtt"),
        ("audio", "src", "media", "a.ogg"),
        ("embed", "src", "media", "e.swf"),
        ("object", "data", "media", "o.svg"),
        ("input", "src", "image", "btn.png"),
        ("img", "src", "image", "same.png"),  # one element, one edge per reference
    ]
    assert {r.edge_kind for r in extract_links(document, DOC).refs} <= (
        _links.REQUISITE_KINDS | {"link", "embed"})


@pytest.mark.parametrize(("srcset", "urls"), [
    ("a.png", ["a.png"]),
    ("a.png 1x,b.png 2x", ["a.png", "b.png"]),
    ("  a.png  1x ,  b.png 2x  ,", ["a.png", "b.png"]),
    ("a,b.png 1x, c.png", ["a,b.png", "c.png"]),  # a comma inside a URL is part of it
    ("a.png,, b.png", ["a.png", "b.png"]),  # trailing commas end a URL
    ("a.png (x, y) 1x, b.png", ["a.png", "b.png"]),  # commas inside parentheses
    ("", []), (",,,", []),
])
def test_srcset_candidates(srcset: str, urls: list[str]) -> None:
    assert list(_links.srcset_urls(srcset)) == urls


def test_positions_are_element_indexes_in_tree_order() -> None:
    # html 0, head 1, body 2 (added by the parser), then the document's elements in order;
    # the references of one element share its position.
    refs = extract_links("<p>t<br><a href=/x>a</a><img src=i.png srcset='j.png 2x'>"
                         "<a href=/x>", DOC).refs
    assert [(r.observed, r.position) for r in refs] == [
        ("/x", 5), ("i.png", 6), ("j.png", 6), ("/x", 7)]
    head = extract_links("<title>t</title><link rel=stylesheet href=s.css><a href=/a>", DOC)
    assert [(r.observed, r.position) for r in head.refs] == [("s.css", 3), ("/a", 5)]


def test_a_base_anywhere_in_the_document_applies_to_every_reference() -> None:
    late = extract_links('<html><head><link rel=stylesheet href=s.css></head><body>'
                         '<a href=a><base href="http://o.example/d/"></body>', DOC)
    assert late.base_url == "http://o.example/d/"
    assert [r.url for r in late.refs] == ["http://o.example/d/s.css", "http://o.example/d/a"]


def test_nesting_deeper_than_the_limit_is_cut_and_reported() -> None:
    # Parsing is quadratic in depth (50,000 nested divs took 13 s): the document is parsed
    # up to the tag that would nest past MAX_DEPTH, and the result says it is truncated.
    started = time.perf_counter()
    deep = extract_links("<a href=/before>" + "<div>" * 50_000 + "<a href=/deep>", DOC)
    assert time.perf_counter() - started < 2
    assert (summary(deep), deep.truncated) == ([("/before", "http://h.example/before")], True)
    # elements the tree builder closes by themselves (p, li, a...) do not nest
    flat = extract_links("<p>" * (_links.MAX_DEPTH + 10) + "<a href=/p>", DOC)
    assert (summary(flat), flat.truncated) == ([("/p", "http://h.example/p")], False)
    assert extract_links("<b><i><a href=/x>" * 5_000, DOC).truncated is False


def test_refs_are_valid_messages() -> None:
    refs = extract_links('<a href="/x" rel="a  b">', DOC).refs
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(refs), type=list[ObservedRef]) == refs


def test_million_links_truncate_with_bounded_time_and_memory() -> None:
    page = b'<a href="/p">x</a>' * 1_000_000  # 17 MiB; every link needs no budget
    # This thread's CPU time: what the work costs, whatever else the machine runs.
    started = time.thread_time()
    result = extract_links(page, DOC, max_links=1000, max_bytes=len(page))
    assert time.thread_time() - started < 5
    assert result.truncated is True
    assert len(result.refs) == 1000
    assert [r.position for r in result.refs[:3]] == [3, 4, 5]  # html, head, body first
    # The tree is lexbor's (C) memory, ~300 bytes a node: parsed whole, this page took
    # 600 MB. Only its first MAX_TAGS tags are parsed; measured in a process of its own.
    code = ("import resource, sys; sys.path.insert(0, sys.argv[1])\n"
            "from evidence._crawl.links import extract_links\n"
            "page = b'<a href=\"/p\">x</a>' * 1_000_000\n"
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "extract_links(page, 'http://h.example/', max_bytes=len(page))\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)\n")
    done = subprocess.run([sys.executable, "-c", code, str(ROOT)], capture_output=True,
                          text=True, check=True)
    assert int(done.stdout) < 150 * 1024  # KiB


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
    assert (summary(cut), cut.truncated) == ([("/first", "http://h.example/first")], True)
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
    # lone surrogates (only possible in str input) are read as U+FFFD in a document; a
    # document URL holding one cannot be stored with what resolves against it
    assert summary(extract_links('<a href="/\ud800">', DOC)) == [
        ("/\ufffd", "http://h.example/\ufffd")]
    assert extract_links('<a href="x">', "http://h.example/\udc00/").skipped == 1
    # a huge rel keeps the whole tokens that fit in ObservedRef.rel
    rel = extract_links(f'<a href=/r rel="{"ab " * 30_000}">', DOC).refs[0].rel
    assert len(rel) <= 65536 and rel.endswith("ab") and set(rel.split(" ")) == {"ab"}


def test_bad_document_url_skips_relative_links() -> None:
    result = extract_links("<a href=/x><a href=http://o.example/>", "not a url")
    assert summary(result) == [("http://o.example/", "http://o.example/")]
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
        # unclosed tags: the tree builder closes them by its rules
        "<b><i><a href=/x>" * 5_000,
        "<table><tr><td>" * 3_000,
    ],
    ids=lambda document: repr(document[:12]),
)
def test_hostile_documents_are_fast(document: str) -> None:
    # This thread's CPU time: what the work costs, whatever else the machine runs.
    started = time.thread_time()
    result = extract_links(document, DOC)
    assert time.thread_time() - started < 2
    # past MAX_TAGS '<' the rest is not parsed (the tree's memory), and it says so
    assert result.truncated is (document.count("<") > _links.MAX_TAGS)
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
    assert positions == sorted(positions)
    anchors = [(ref.position, ref.observed) for ref in result.refs]
    assert len(anchors) == len(set(anchors))  # the discovery edge's anchor is unique
    for ref in result.refs:
        parts = urlsplit(ref.url)
        assert parts.scheme in ("http", "https") and parts.netloc
        assert 0 < len(ref.observed) <= MAX_URL_LENGTH and len(ref.url) <= MAX_URL_LENGTH
        # resolved against the document's base (its URL, or its first <base href>), its
        # query encoded in the document's encoding, as the URL standard says
        assert ref.url == resolve_reference(result.base_url, ref.observed,
                                            encoding=result.encoding)
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
    # html, head and body come first: the i-th link is the element at 3 + 2 i (text
    # between links is no element)
    assert [(ref.observed, ref.position - 3) for ref in result.refs] == expected
    assert result.skipped == len(hrefs) - len(expected)
    check(result, DOC)


# --- differential: the extractor this one replaced, for the links both must find ----------

OLD_TAGS = {"a", "area", "link", "iframe", "frame"}  # all the old extractor looked at


def comparable(refs: list[ObservedRef]) -> Counter:
    """What both extractors record of the elements both look at (positions are counted
    differently: start tags then, elements in tree order now; and a stylesheet link's
    kind is its own now)."""
    return Counter((r.tag, r.attr, r.observed, r.url) for r in refs if r.tag in OLD_TAGS)


HREFS = ["/a", "b.html", "../c", "?q=1&r=2", "#f", "//o.example/x", "https://o.example/y",
         "javascript:void(0)", "mailto:x@y", "", " /spaced ", "/é?ü=1", "/a&b", "/<x>",
         "http://h.example/dir/page.html"]
href = st.sampled_from(HREFS).map(lambda h: html_lib.escape(h, quote=True))
text = st.text(st.characters(blacklist_characters="<&\x00\r", blacklist_categories=("Cs",)),
               max_size=8)


def element(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        # an anchor holds text only: nested anchors are not well formed, and a tree
        # builder clones the outer one (the adoption agency), which a tokenizer cannot
        st.builds(lambda h, c: f'<a href="{h}">{c}</a>', href, text),
        st.builds(lambda h: f'<area href="{h}" alt=x>', href),
        st.builds(lambda r, h: f'<link rel="{r}" href="{h}">', st.sampled_from(
            ["stylesheet", "next", "ICON", "alternate  prev"]), href),
        st.builds(lambda h: f'<iframe src="{h}">fallback</iframe>', href),
        st.builds(lambda h: f'<img src="{h}" alt="">', href),
        st.builds(lambda c: f"<div class=x>{c}</div>", children),
        st.builds(lambda c: f"<p>{c}</p>", children),
        st.builds(lambda c: f"<ul><li>{c}</li></ul>", children),
        st.builds(lambda t: f"<!-- {t} <a href=/commented> -->", text),
        st.builds(lambda t: f"<script>var s = '{t}';</script>", text),
        text,
    )


bodies = st.recursive(text, lambda inner: st.lists(element(inner), max_size=6).map("".join),
                      max_leaves=25)


@settings(max_examples=300, deadline=None)
@given(body=bodies, base=st.sampled_from(["", '<base href="http://b.example/base/">',
                                          '<base href="/root/">']),
       as_bytes=st.booleans())
def test_both_extractors_find_the_same_links_in_well_formed_pages(
        body: str, base: str, as_bytes: bool) -> None:
    from . import oldlinks

    document = (f"<!doctype html><html><head><meta charset=utf-8>{base}<title>t</title>"
                f"</head><body>{body}</body></html>")
    data: str | bytes = document.encode() if as_bytes else document
    new, old = extract_links(data, DOC), oldlinks.extract_links(data, DOC)
    assert comparable(new.refs) == comparable(old.refs)
    assert new.base_url == old.base_url
    assert (new.encoding, new.encoding_source) == (old.encoding, old.encoding_source)


def test_both_extractors_find_the_same_links_on_the_demo_site() -> None:
    from evidence._demo.site import SiteConfig, TestSite

    from . import oldlinks

    with TestSite(SiteConfig(pages=40)) as site:
        documents = site._layout(None).documents()
    pages = [(path, body) for path, (body, kind) in documents.items() if "html" in kind]
    assert len(pages) >= 40
    for path, body in pages:
        url = site.url_for(path)
        new, old = extract_links(body, url), oldlinks.extract_links(body, url)
        assert comparable(new.refs) == comparable(old.refs), path
        assert len(new.refs) == len(old.refs)  # the demo pages have no requisites
