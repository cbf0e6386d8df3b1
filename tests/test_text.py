"""Page text decoded as a browser decodes it, by one decoder that links and rules share."""

from __future__ import annotations

import codecs
from pathlib import Path

import anyio
import blake3
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evidence import CrawlConfig, Crawler, CrawlOptions, Store
from evidence._crawl.links import extract_links
from evidence._crawl.pages import _page_links
from evidence._crawl.rules import _Page, evaluate_page
from evidence._crawl.rulesfile import parse_rules
from evidence._model.refs import ArtifactRef
from evidence._model.text import (
    charset_param,
    decode,
    decode_document,
    encoding_for_label,
    percent_encode_query,
    sniff,
)
from evidence._model.urls import normalize_url, resolve_reference

from .rawserver import RawServer, Reply

DOC = "http://h.example/dir/page.html"


@pytest.mark.parametrize(("label", "name"), [
    ("iso-8859-1", "windows-1252"), ("Latin1", "windows-1252"), (" ascii ", "windows-1252"),
    ("us-ascii", "windows-1252"), ("utf-16", "utf-16le"), ("UTF8", "utf-8"),
    ("x-sjis", "shift_jis"), ("gb2312", "gbk"), ("iso-2022-kr", "replacement"),
    ("koi8-ru", "koi8-u"), ("utf-7", None), ("hex", None), ("", None), ("utf\x00", None)])
def test_labels_resolve_as_the_encoding_standard_says(label: str, name: str | None) -> None:
    assert encoding_for_label(label) == name


@pytest.mark.parametrize(("data", "header", "expected"), [
    (b"<a href=x>", None, ("windows-1252", "default")),
    (b"<a href=x>", "iso-8859-1", ("windows-1252", "header")),
    (b"\xef\xbb\xbf<a>", "iso-8859-1", ("utf-8", "bom")),  # the BOM beats the header
    (b"\xff\xfe<\x00a\x00>\x00", "utf-8", ("utf-16le", "bom")),
    (b'<meta charset="koi8-r">', None, ("koi8-r", "meta")),
    (b'<meta charset="koi8-r">', "utf-8", ("utf-8", "header")),  # the header beats the meta
    (b'<meta charset="koi8-r">', "bogus", ("koi8-r", "meta")),  # an unknown label is ignored
    (b'<meta http-equiv="Content-Type" content="text/html; charset=windows-1251">', None,
     ("windows-1251", "meta")),
    (b'<meta content="text/html; charset=windows-1251">', None, ("windows-1252", "default")),
    (b'<meta charset="utf-16">', None, ("utf-8", "meta")),  # UTF-16 from a meta is UTF-8
    (b'<meta charset="x-user-defined">', None, ("windows-1252", "meta")),
    (b"<!-- <meta charset=koi8-r> --><meta charset=big5>", None, ("big5", "meta")),
    (b'<p title="<meta charset=koi8-r>"><meta charset=euc-kr>', None, ("euc-kr", "meta")),
    (b" " * 1020 + b'<meta charset="koi8-r">', None, ("windows-1252", "default")),  # too late
    (b'<?xml version="1.0" encoding="iso-8859-2"?><html>', None, ("iso-8859-2", "meta")),
])
def test_sniffing_follows_the_html_standard_order(data: bytes, header: str | None,
                                                  expected: tuple[str, str]) -> None:
    assert tuple(sniff(data, header)) == expected


def test_windows_1252_decodes_every_byte_as_browsers_do() -> None:
    text = decode(bytes(range(0x80, 0xA0)), "windows-1252")
    assert text[0] == "€" and text[1] == "\x81" and text[0x1D] == "\x9d"  # C1 as itself
    assert decode(b"caf\xe9", "windows-1252") == "café"
    assert decode(b"\xae\xbe", "koi8-u") == "\u045e\u040e"  # the WHATWG index, not Python's


def test_charset_param_reads_quoted_and_bare_values() -> None:
    assert charset_param('text/html; charset="ISO-8859-1"') == "ISO-8859-1"
    assert charset_param("text/html;CHARSET=utf-8 ; q=1") == "utf-8"
    assert charset_param("text/html") is None and charset_param(None) is None


def test_a_query_is_encoded_in_the_document_encoding_and_the_path_as_utf8() -> None:
    url = resolve_reference(DOC, "/café?q=café&x=日", encoding="windows-1252")
    assert url == "http://h.example/café?q=caf%E9&x=%26%2326085%3B"
    assert resolve_reference(DOC, "/café?q=café", encoding="utf-8") == (
        "http://h.example/café?q=café")  # the normalizer encodes UTF-8 itself
    assert percent_encode_query("q=日本", "shift_jis") == "q=%93%FA%96{"  # 0x7B stays
    assert percent_encode_query("a b=é", "utf-16le") == "a b=é"  # UTF-16 pages: UTF-8 URLs


# One set of pages, read by the link extractor and by the rules: they must agree on the
# encoding and on every link.
LATIN1 = "<a href='/café'>x</a><a href='/q?x=café'>y</a><a href='/€'>z</a>"
PAGES = {
    "header only": ("text/html; charset=iso-8859-1", LATIN1.encode("cp1252"),
                    "windows-1252", "header",
        ["/caf%C3%A9", "/q?x=caf%E9", "/%E2%82%AC"]),
    "BOM": ("text/html; charset=iso-8859-1", codecs.BOM_UTF8 + "<a href='/café'>".encode(),
            "utf-8", "bom", ["/caf%C3%A9"]),
    "meta": ("text/html", b'<meta charset="windows-1251"><a href="/\xe4?q=\xe4">',
             "windows-1251", "meta", ["/%D0%B4?q=%E4"]),
    "wrong meta, header wins": ("text/html; charset=utf-8",
                                '<meta charset="iso-8859-1"><a href="/café?q=é">'.encode(),
                                "utf-8", "header", ["/caf%C3%A9?q=%C3%A9"]),
    "undecodable bytes": ("text/html; charset=utf-8", b'<a href="/\xff\xfeok">', "utf-8",
                          "header", ["/%EF%BF%BD%EF%BF%BDok"]),
    "default": ("text/html", b"<a href='/caf\xe9?q=\xe9'>", "windows-1252", "default",
                ["/caf%C3%A9?q=%E9"]),
    "unmappable query": ("text/html; charset=windows-1252",
                         b"<a href='/s?q=&#26085;&#x41;'>", "windows-1252", "header",
                         ["/s?q=%26%2326085%3BA"]),
    "utf-16": ("text/html", "<a href='/é?q=é'>".encode("utf-16"), "utf-16le", "bom",
               ["/%C3%A9?q=%C3%A9"]),
}


def head_for(content_type: str) -> bytes:
    return f"HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\n\r\n".encode()


@pytest.mark.parametrize("case", PAGES)
def test_links_and_rules_agree_on_every_page(case: str) -> None:
    content_type, body, encoding, source, keys = PAGES[case]
    refs, _, _ = _page_links(DOC, content_type, body)
    extraction = extract_links(body, DOC, encoding=charset_param(content_type))
    page = _Page(DOC, head_for(content_type), body, False, 0.0, decoded=True)
    assert (extraction.encoding, extraction.encoding_source) == (encoding, source)
    assert tuple(page.encoding) == (encoding, source)
    expected = [f"http://h.example{k}" for k in keys]
    assert [normalize_url(r.url) for r in refs] == expected
    assert [normalize_url(u) for u, _ in page.links] == expected
    # a rule that reads the text says how it read it
    rules = parse_rules("[[rule]]\nid = 'l'\nversion = 1\ntype = 'link'\nurl = '.'\n")

    def ref(data: bytes) -> ArtifactRef:
        return ArtifactRef("x", blake3.blake3(data).hexdigest(), len(data))

    [judged] = evaluate_page(rules, url=DOC, attempt_id="a", run_id="r",
                             headers_bytes=head_for(content_type), body_bytes=body,
                             headers_ref=ref(head_for(content_type)), body_ref=ref(body),
                             elapsed_ms=0.0, decoded=True)
    assert (judged.details["encoding"], judged.details["encoding_source"]) == (encoding, source)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=2048), label=st.one_of(st.none(), st.sampled_from(
    ["utf-8", "latin1", "shift_jis", "utf-16", "iso-2022-jp", "replacement", "x-user-defined",
     "gb18030", "big5", "koi8-u", "bogus"])))
def test_decoding_never_raises_and_always_says_how(data: bytes, label: str | None) -> None:
    text, sniffed = decode_document(data, None if label is None else f"text/html; charset={label}")
    assert isinstance(text, str)
    assert sniffed.source in ("bom", "header", "meta", "default")
    assert encoding_for_label(sniffed.encoding) == sniffed.encoding  # a real encoding name


@settings(max_examples=200, deadline=None)
@given(bom=st.sampled_from([(codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF16_LE, "utf-16le"),
                            (codecs.BOM_UTF16_BE, "utf-16be")]),
       rest=st.binary(max_size=1500),
       label=st.one_of(st.none(), st.sampled_from(["latin1", "utf-8", "koi8-r", "utf-16be"])))
def test_a_bom_always_wins(bom: tuple[bytes, str], rest: bytes, label: str | None) -> None:
    mark, name = bom
    assert tuple(sniff(mark + rest, label)) == (name, "bom")


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=40), encoding=st.sampled_from(
    ["windows-1252", "shift_jis", "euc-kr", "koi8-r", "iso-2022-jp", "gbk", "big5", "utf-8"]))
def test_an_encoded_query_is_ascii_and_leaves_ascii_alone(text: str, encoding: str) -> None:
    encoded = percent_encode_query(text, encoding)
    if encoding != "utf-8":
        assert encoded.isascii()
        assert percent_encode_query(encoded, encoding) == encoded
    if text.isascii():
        assert encoded == text


def test_a_crawl_requests_links_as_a_browser_would(tmp_path: Path) -> None:
    """End to end: a page whose charset is only in the Content-Type header."""
    page = "<a href='/café'>c</a><a href='/q?x=café'>q</a>".encode("latin-1")
    ok = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 2\r\n\r\nok"
    routes = {"/": Reply([b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=iso-8859-1\r\n"
                          b"Content-Length: %d\r\n\r\n" % len(page), page]),
              "/caf%C3%A9": Reply([ok]), "/q?x=caf%E9": Reply([ok])}
    with RawServer(routes) as server:
        with Store.create(tmp_path / "s") as store:
            config = CrawlConfig(seeds=[server.url("/")])
            result = anyio.run(Crawler(store, config, CrawlOptions(workers=2)).run)
            assert result.outcome == "completed"
            edges = sorted(store.connection.execute(
                "SELECT e.observed_ref, u.fetch_key FROM discovery_edge e "
                "JOIN url_identity u ON u.url_id = e.target_url_id"))
            encoding = store.connection.execute(
                "SELECT text_encoding, text_encoding_source FROM fetch_attempt "
                "WHERE url = ?", (server.url("/"),)).fetchall()
        requested = {e.path for e in server.exchanges}
    assert {"/caf%C3%A9", "/q?x=caf%E9"} <= requested
    assert edges == [("/café", server.url("/caf%C3%A9")), ("/q?x=café", server.url("/q?x=caf%E9"))]
    assert encoding == [("windows-1252", "header")]
