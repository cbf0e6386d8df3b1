"""Tests for evidence._model.urls: the fetch-key normalizer, url_host and resolve_reference."""

from __future__ import annotations

import re
import string
from random import Random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evidence._errors import EvidenceError, URLError
from evidence._model import urls as _urls
from evidence._model.urls import (
    MAX_URL_LENGTH,
    NORMALIZER_VERSION,
    key_and_host,
    normalize_url,
    resolve_reference,
    url_host,
)


def test_public_api() -> None:
    assert sorted(_urls.__all__) == [
        "NORMALIZER_VERSION",
        "key_and_host",
        "key_origin",
        "normalize_url",
        "registrable_domain",
        "resolve_reference",
        "url_host",
    ]
    assert NORMALIZER_VERSION == 1
    assert MAX_URL_LENGTH == 8192


# (input, fetch key). Grouped by rule; every key is also checked to be a fixed point.
EXAMPLES = [
    # case: scheme and host lowercased, path and query case kept
    ("HTTP://Example.COM/Path?Q=V", "http://example.com/Path?Q=V"),
    ("hTTpS://WWW.example.com", "https://www.example.com/"),
    # default ports dropped, empty port is the default, others kept
    ("http://example.com:80/", "http://example.com/"),
    ("https://example.com:443/a", "https://example.com/a"),
    ("http://example.com:/a", "http://example.com/a"),
    ("http://example.com:0080/", "http://example.com/"),
    ("http://example.com:443/", "http://example.com:443/"),
    ("https://example.com:80/", "https://example.com:80/"),
    ("http://example.com:8080", "http://example.com:8080/"),
    # fragment removed, including from the authority
    ("http://example.com/a#frag", "http://example.com/a"),
    ("http://example.com/a?b=1#frag?x", "http://example.com/a?b=1"),
    ("http://example.com#x", "http://example.com/"),
    # empty path and empty query
    ("http://example.com", "http://example.com/"),
    ("http://example.com?", "http://example.com/"),
    ("http://example.com/a?", "http://example.com/a"),
    ("http://example.com/?&&", "http://example.com/"),
    # percent-encoding: unreserved decoded, hex uppercased, reserved kept encoded
    ("http://h/%7e%41%62%2D%2e%5F", "http://h/~Ab-._"),
    ("http://h/a%2fb%2Fc", "http://h/a%2Fb%2Fc"),
    ("http://h/%c3%bc%3a", "http://h/%C3%BC%3A"),
    ("http://h/%zz%4%", "http://h/%25zz%254%25"),
    ("http://h/100%", "http://h/100%25"),
    ("http://h/%25", "http://h/%25"),
    # percent-encoding: characters that must be encoded are encoded as UTF-8
    ("http://h/a b", "http://h/a%20b"),
    ("http://h/bücher/日本", "http://h/b%C3%BCcher/%E6%97%A5%E6%9C%AC"),
    ('http://h/<>"{}|^`\\', "http://h/%3C%3E%22%7B%7D%7C%5E%60%5C"),
    ("http://h/[x]", "http://h/%5Bx%5D"),
    ("http://h/a:b@c!$&'()*+,;=", "http://h/a:b@c!$&'()*+,;="),
    ("http://h/?q=a b&r=ü", "http://h/?q=a%20b&r=%C3%BC"),
    ("http://h/?a=%7e%2f%26", "http://h/?a=~%2F%26"),
    ("http://h/?u=http://x/y?z", "http://h/?u=http://x/y?z"),
    # dot segments (RFC 3986 5.2.4), including encoded dots
    ("http://h/a/./b/../c", "http://h/a/c"),
    ("http://h/a/b/..", "http://h/a/"),
    ("http://h/a/b/.", "http://h/a/b/"),
    ("http://h/../../a", "http://h/a"),
    ("http://h/..", "http://h/"),
    ("http://h/a/%2e%2E/b/%2E", "http://h/b/"),
    ("http://h/a/.../b", "http://h/a/.../b"),
    ("http://h/a/..b/.c", "http://h/a/..b/.c"),
    ("http://h//a//../b", "http://h//a/b"),
    ("http://h/a/%2e%2e%2fb", "http://h/a/..%2Fb"),
    # query: sorted by name, then '=', then value; '+' and empty values kept
    ("http://h/?b=2&a=1", "http://h/?a=1&b=2"),
    ("http://h/?a=2&a=1&a=10", "http://h/?a=1&a=10&a=2"),
    ("http://h/?flag&a=&a", "http://h/?a&a=&flag"),
    ("http://h/?q=a+b&p=c%20d", "http://h/?p=c%20d&q=a+b"),
    ("http://h/?%61=1&a=0", "http://h/?a=0&a=1"),
    ("http://h/?=x&a", "http://h/?=x&a"),
    ("http://h/?a=1;b=2", "http://h/?a=1;b=2"),
    # IDNA hosts become punycode; escaped hosts are decoded first; trailing dot dropped
    ("http://Bücher.example/", "http://xn--bcher-kva.example/"),
    ("http://BÜCHER.example/", "http://xn--bcher-kva.example/"),
    ("http://%62%C3%BCcher.example/", "http://xn--bcher-kva.example/"),
    ("http://xn--bcher-kva.example/", "http://xn--bcher-kva.example/"),
    ("http://XN--BCHER-KVA.example/", "http://xn--bcher-kva.example/"),
    ("http://日本語。ｊｐ/", "http://xn--wgv71a119e.jp/"),
    ("http://example.com./", "http://example.com/"),
    ("http://Example.COM.:8080/", "http://example.com:8080/"),
    # ASCII labels IDNA2008 would refuse but real hosts use
    ("http://my_host.example/", "http://my_host.example/"),
    ("http://r3---sn-ab.googlevideo.com/", "http://r3---sn-ab.googlevideo.com/"),
    # IPv4 kept, IPv6 bracketed in RFC 5952 form
    ("http://192.168.0.1:80/", "http://192.168.0.1/"),
    ("http://10.0.0.1./", "http://10.0.0.1/"),
    ("http://[2001:DB8::1]/", "http://[2001:db8::1]/"),
    ("http://[2001:db8:0:0:0:0:0:1]:8080/x", "http://[2001:db8::1]:8080/x"),
    ("http://[::FFFF:192.0.2.1]:80", "http://[::ffff:c000:201]/"),
    # userinfo kept, percent-normalized; empty password or userinfo dropped
    ("http://user:pass@h/", "http://user:pass@h/"),
    ("http://User@H/", "http://User@h/"),
    ("http://us%65r:p%3a%zz@h/", "http://user:p%3A%25zz@h/"),
    ("http://user:@h/", "http://user@h/"),
    ("http://@h/", "http://h/"),
    ("http://:@h/", "http://h/"),
    ("http://:pw@h/", "http://:pw@h/"),
    ("http://a@b@h/", "http://a%40b@h/"),
    ("http://uü@h/", "http://u%C3%BC@h/"),
]


@pytest.mark.parametrize(("url", "expected"), EXAMPLES)
def test_examples(url: str, expected: str) -> None:
    assert normalize_url(url) == expected
    assert normalize_url(expected) == expected


@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("http://Bücher.example:8080/x", "xn--bcher-kva.example"),
        ("https://user:pw@Example.com./", "example.com"),
        ("http://[2001:DB8::1]:81/", "[2001:db8::1]"),
        ("http://127.0.0.1/", "127.0.0.1"),
    ],
)
def test_url_host(url: str, host: str) -> None:
    assert url_host(url) == host


BAD = [
    ("ftp://example.com/", "scheme"),
    ("javascript:alert(1)", "scheme"),
    ("mailto:someone@example.com", "scheme"),
    ("data:text/plain,x", "scheme"),
    ("file:///etc/passwd", "scheme"),
    ("example.com/path", "scheme"),
    ("/relative/path", "scheme"),
    ("", "scheme"),
    ("http:///path", "no host"),
    ("http://", "no host"),
    ("http://user@/", "no host"),
    ("http://:80/", "no host"),
    ("http:/example.com/", "no host"),
    ("http:example.com", "no host"),
    ("http://.", "no host"),
    ("http://h:99999/", "port"),
    ("http://h:65536/", "port"),
    ("http://h:-1/", "port"),
    ("http://h:8a/", "port"),
    ("http://h:１２/", "port"),
    ("http://h:" + "9" * 5000 + "/", "port"),
    ("http://example.com/" + "a" * 100_000, "limit"),
    ("http://h/" + "ü" * 2000, "limit"),  # fits as input, too long once encoded
    ("http://h/a\x00b", "control"),
    ("http://h/a\tb", "control"),
    ("http://h/a\nb", "control"),
    ("http://h/\x7f", "control"),
    ("http://h/\x85", "control"),
    (" http://h/", "whitespace"),
    ("http://h/ ", "whitespace"),
    ("http://a b/", "whitespace"),
    ("http://h\\@evil.com/", "'\\'"),
    ("http://xn--zz.example/", "IDNA"),
    ("http://a\u200db.example/", "IDNA"),
    ("http://%ff.example/", "IDNA"),
    ("http://a..b/", "empty label"),
    ("http://a$b/", "characters"),
    ("http://%zz/", "characters"),
    ("http://a%2Fb/", "characters"),
    ("http://" + "a" * 64 + ".example/", "63"),
    ("http://" + "abc." * 70 + "example/", "253"),
    ("http://::1/", "host contains ':'"),
    ("http://[::1/", "unclosed"),
    ("http://[::1]x/", "IPv6"),
    ("http://[1.2.3.4]/", "IPv6"),
    ("http://[v1.fe]/", "IPv6"),
    ("http://[fe80::1%25eth0]/", "zone"),
    ("http://h/\ud800", "surrogate"),
    (b"http://h/", "str"),
]


@pytest.mark.parametrize(("url", "words"), BAD)
def test_errors(url: str, words: str) -> None:
    with pytest.raises(URLError) as info:
        normalize_url(url)  # type: ignore[arg-type]
    error = info.value
    assert isinstance(error, EvidenceError)
    assert words in str(error)
    assert error.hint
    assert "url" in error.context
    with pytest.raises(URLError):
        url_host(url)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("base", "href", "expected"),
    [
        # RFC 3986 5.4.1 and 5.4.2 examples
        ("http://a/b/c/d;p?q", "g", "http://a/b/c/g"),
        ("http://a/b/c/d;p?q", "./g", "http://a/b/c/g"),
        ("http://a/b/c/d;p?q", "//g", "http://g"),
        ("http://a/b/c/d;p?q", "?y", "http://a/b/c/d;p?y"),
        ("http://a/b/c/d;p?q", "#s", "http://a/b/c/d;p?q#s"),
        ("http://a/b/c/d;p?q", "../../g", "http://a/g"),
        ("http://a/b/c/d;p?q", "../../../../g", "http://a/g"),
        ("http://a/b/c/d;p?q", "", "http://a/b/c/d;p?q"),
        ("http://a/b/c/d;p?q", "https://other/x", "https://other/x"),
        # whitespace as browsers treat it
        ("http://a/b/c", "  g \n", "http://a/b/g"),
        ("http://a/b/c", "\tg/\nh\r?x", "http://a/b/g/h?x"),
        ("http://a/b/c", "\x00\x1f/x\x01", "http://a/x"),
        ("http://a/b/c", "/x y", "http://a/x y"),
        # backslashes and extra slashes as browsers treat them in http(s) URLs
        ("http://a/b/c", "\\\\evil.example\\x?q=\\", "http://evil.example/x?q=\\"),
        ("http://a/b/c", "///evil.example/x", "http://evil.example/x"),
        ("http://a/b/c", "http:////evil.example/x", "http://evil.example/x"),
    ],
)
def test_resolve_reference(base: str, href: str, expected: str) -> None:
    assert resolve_reference(base, href) == expected


@pytest.mark.parametrize(
    ("base", "href"),
    [
        ("http://a/b", "mailto:x@example.com"),
        ("http://a/b", "javascript:void(0)"),
        ("http://a/b", " JavaScript:alert(1)"),
        ("http://a/b", "data:text/html,hi"),
        ("http://a/b", "ftp://example.com/"),
        ("ftp://a/b", "c"),
        ("", "relative/path"),
        ("http://a/b", "http://[::1/"),
    ],
)
def test_resolve_reference_errors(base: str, href: str) -> None:
    with pytest.raises(URLError) as info:
        resolve_reference(base, href)
    assert info.value.hint


def test_resolved_references_normalize() -> None:
    resolved = resolve_reference("http://Example.com/dir/page", " ../Ä b/./c?z=1&a=2#top ")
    assert resolved == "http://Example.com/Ä b/c?z=1&a=2#top"
    assert normalize_url(resolved) == "http://example.com/%C3%84%20b/c?a=2&z=1"


def test_max_length_boundary() -> None:
    prefix = "http://h/"
    exact = prefix + "a" * (MAX_URL_LENGTH - len(prefix))
    assert normalize_url(exact) == exact
    with pytest.raises(URLError):
        normalize_url(exact + "a")


# --- properties ---------------------------------------------------------------------

_ASCII_LABEL_CHARS = string.ascii_letters + string.digits + "_-"
_UNICODE_LABEL_CHARS = "abcxyz019ÜüöäéñçßøåБбжд日本語"

ascii_labels = st.text(_ASCII_LABEL_CHARS, min_size=1, max_size=12).filter(
    lambda label: not label.lower().startswith("xn--")
)
unicode_labels = st.text(_UNICODE_LABEL_CHARS, min_size=1, max_size=8)
reg_names = st.builds(
    lambda labels, dot: ".".join(labels) + dot,
    st.lists(st.one_of(ascii_labels, unicode_labels), min_size=1, max_size=4),
    st.sampled_from(["", "."]),
)
ipv6_hosts = st.builds(
    lambda address, long: f"[{address.exploded if long else address}]".upper(),
    st.ip_addresses(v=6),
    st.booleans(),
)
hosts = st.one_of(reg_names, st.ip_addresses(v=4).map(str), ipv6_hosts)
ports = st.one_of(
    st.just(""),
    st.sampled_from([":", ":80", ":443", ":0080"]),
    st.integers(0, 65535).map(lambda port: f":{port}"),
)
userinfos = st.one_of(
    st.just(""),
    st.text(string.ascii_letters + ":%20ü!$", max_size=8).map(lambda text: text + "@"),
)
# Pieces of paths and queries: dots, escapes valid and not, reserved, unicode, spaces.
PIECES = [".", "..", "%2e", "%2E%2e", "%41", "%7e", "%2f", "%3D", "%26", "%zz", "%", "%4", "%%61b"]
PIECES += ["a", "Z", "~", "-", "+", " ", "ü", "日本", "=", ":", "@", "!", "'", "[", "|", "\\"]
pieces = st.one_of(
    st.sampled_from(PIECES),
    st.text(st.characters(codec="utf-8", exclude_categories=["Cc"]), max_size=3),
)
segments = st.lists(pieces, max_size=4).map("".join)
paths = st.lists(segments, max_size=5).map(lambda segs: "".join("/" + seg for seg in segs))
params = st.builds(
    lambda key, eq, value: key + eq + value, segments, st.sampled_from(["", "="]), segments
)
queries = st.one_of(
    st.just(""), st.lists(params, max_size=5).map(lambda items: "?" + "&".join(items))
)
fragments = st.one_of(st.just(""), segments.map(lambda text: "#" + text))
urls = st.builds(
    lambda *parts: "".join(parts),
    st.sampled_from(["http://", "https://", "HTTP://", "hTtPs://"]),
    userinfos,
    hosts,
    ports,
    paths,
    queries,
    fragments,
)

FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f]")


@FAST
@given(urls)
def test_normalize_is_idempotent(url: str) -> None:
    # The strategy builds valid URLs except for what random text may add: control
    # characters anywhere, or whitespace at the very end. Exactly those are refused.
    if _CONTROLS.search(url) or url != url.strip():
        with pytest.raises(URLError):
            normalize_url(url)
        return
    key = normalize_url(url)
    assert normalize_url(key) == key
    assert key.isascii()
    assert "#" not in key
    assert not any(char.isspace() for char in key)
    assert key.startswith(("http://", "https://"))
    assert url_host(key) == url_host(url)
    assert resolve_reference(key, "") == key


@FAST
@given(urls | st.text())
def test_key_and_host_is_normalize_url_and_url_host_in_one_parse(url: str) -> None:
    """The crawler computes a URL's fetch key and host once (issue 15): the pair must be
    exactly what the two functions give, or the same error."""
    try:
        expected = (normalize_url(url), _urls.url_host(url))
    except URLError:
        with pytest.raises(URLError):
            _urls.key_and_host(url)
        return
    assert _urls.key_and_host(url) == expected


@given(st.text())
def test_arbitrary_text_raises_only_url_error(text: str) -> None:
    for candidate in (text, "http://" + text, "https://h/" + text, "http://h/?" + text):
        try:
            key = normalize_url(candidate)
        except URLError:
            continue
        assert normalize_url(key) == key


@settings(max_examples=150, deadline=None)
@given(st.text(), st.text())
def test_resolve_reference_raises_only_url_error(base: str, href: str) -> None:
    for candidate_base in (base, "http://h/a/b"):
        try:
            resolved = resolve_reference(candidate_base, href)
        except URLError:
            continue
        assert resolved.lower().startswith(("http://", "https://"))


# Without random text: a '#' would cut the query short, a trailing space is refused.
clean_segments = st.lists(st.sampled_from([p for p in PIECES if p != " "]), max_size=4).map("".join)
clean_params = st.builds(
    lambda key, eq, value: key + eq + value,
    clean_segments,
    st.sampled_from(["", "="]),
    clean_segments,
)


@settings(max_examples=150, deadline=None)
@given(st.lists(clean_params, min_size=1, max_size=6), st.randoms())
def test_query_order_does_not_matter(items: list[str], random: Random) -> None:
    shuffled = list(items)
    random.shuffle(shuffled)
    assert normalize_url("http://h/?" + "&".join(items)) == normalize_url(
        "http://h/?" + "&".join(shuffled)
    )


@settings(max_examples=150, deadline=None)
@given(st.text(string.ascii_letters + string.digits + "-._~", min_size=1), st.data())
def test_escaping_unreserved_characters_does_not_matter(text: str, data: st.DataObject) -> None:
    escaped = "".join(
        data.draw(st.sampled_from([char, f"%{ord(char):02x}", f"%{ord(char):02X}"]))
        for char in text
    )
    # "%2e%2e" is a dot segment just as ".." is, so whole keys still compare equal.
    assert normalize_url(f"http://h/p/{escaped}?{escaped}") == normalize_url(
        f"http://h/p/{text}?{text}"
    )


_simple_chars = st.sampled_from(list("abcxyz019-._~!$&'()*+,;=:@/?%AZ"))


@settings(max_examples=1500, deadline=None)
@given(host=st.sampled_from(["example.com", "a-b.c_d.org", "xn--bcher-kva.example",
                             "127.0.0.1", "127.1", "0x7f.0.0.1", "EXAMPLE.com",
                             "example.com."]),
       scheme=st.sampled_from(["http", "https"]),
       port=st.sampled_from(["", ":80", ":443", ":8080", ":0080", ":99999"]),
       path=st.text(_simple_chars, max_size=30),
       query=st.one_of(st.none(), st.text(_simple_chars, max_size=30)),
       fragment=st.one_of(st.none(), st.text(_simple_chars | st.sampled_from("# \t\\^"),
                                             max_size=12)))
def test_fast_path_agrees_with_the_full_normalizer(host: str, scheme: str, port: str,
                                                   path: str, query: str | None,
                                                   fragment: str | None) -> None:
    from evidence._model.urls import _checked, _simple_key

    url = f"{scheme}://{host}{port}/{path}" + ("" if query is None else f"?{query}")
    url += "" if fragment is None else f"#{fragment}"
    try:
        parts = _checked(url)
    except URLError:
        assert _simple_key(url) is None
        with pytest.raises(URLError):
            url_host(url)
        with pytest.raises(URLError):
            key_and_host(url)
        return
    full = parts.serialize()
    if _simple_key(url) is not None:
        assert full == url
    assert normalize_url(url) == full
    assert url_host(url) == parts.host
    assert key_and_host(url) == (full, parts.host)



_ref_chars = st.sampled_from(list("ab19/.:?#%-_~@!$&'()*+,;= \t\\AZ"))


@settings(max_examples=3000, deadline=None)
@given(base=st.one_of(
           st.sampled_from(["http://127.0.0.1:8080/p/1.html", "https://example.com/",
                            "http://example.com/a/b/c?x=1", "http://example.com",
                            "http://EXAMPLE.com/a/", "http://h.example/a/b/./c",
                            "http://h.example:80/x", "http://xn--bcher-kva.example/d/e"]),
           st.builds(lambda path: f"http://h.example/{path}", st.text(_ref_chars, max_size=20))),
       href=st.one_of(
           st.text(_ref_chars, max_size=25),
           st.builds(lambda p: f"/{p}", st.text(_ref_chars, max_size=20)),
           st.builds(lambda p: f"#{p}", st.text(_ref_chars, max_size=20)),
           st.builds(lambda p: f"http://h.example/{p}", st.text(_ref_chars, max_size=20))))
@pytest.mark.slow
def test_the_plain_reference_path_agrees_with_urljoin(base: str, href: str) -> None:
    """resolve_reference's fast path gives exactly what the full resolution gives."""
    from evidence._model.urls import _resolve, _resolve_plain, reference_resolver

    fast = _resolve_plain(base, href)
    resolver = reference_resolver(base)  # a page's many links against one base
    try:
        full = _resolve(base, href)
    except URLError:
        assert fast is None
        with pytest.raises(URLError):
            resolver(href)
        return
    if fast is not None:
        assert fast == full
    assert resolve_reference(base, href) == full
    assert resolver(href) == full
