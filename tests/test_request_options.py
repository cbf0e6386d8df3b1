"""Request options (issue 36 point 1): headers, cookies and credentials a crawl sends, to
its fetches and its renders alike, with every secret sealed in the stored request.

The site (tests/authsite.py) answers only requests that carry what the crawl was told to
send: basic credentials, a cookie the user supplied, a cookie it set itself, a header. The
evidence must show each request was made with them (the opening of its commitment gives
the exact bytes sent) while the stored request, WARC and replay hold no secret in clear.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import anyio
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evidence import CrawlConfig, Crawler, CrawlOptions, Store, verify
from evidence._archive.export import export
from evidence._cli.main import main
from evidence._crawl.cookies import Cookie, CookieJar, parse_netscape
from evidence._crawl.render import RenderOptions
from evidence._crawl.secrets import (
    HostOptions,
    RequestOptions,
    Secrets,
    commitments,
    load_secrets,
    open_request,
    redact,
)
from evidence._model.refs import ArtifactRef

from .authsite import BASIC, PASSWORD, SID, AuthSite

SECRET_BYTES = (PASSWORD.encode(), BASIC.split()[1].encode(), SID.encode())


def _options(site: AuthSite) -> RequestOptions:
    secrets = Secrets((HostOptions(match="127.0.0.1", username="alice", password=PASSWORD),))
    jar = [Cookie(name="sid", value=SID, domain="127.0.0.1", path="/members", secret=True)]
    return RequestOptions.build(headers=["Accept-Language: fr"], cookies=jar,
                                secrets=secrets)


def _digest_options() -> RequestOptions:
    return RequestOptions.build(secrets=Secrets((HostOptions(
        match="127.0.0.1", username="alice", password=PASSWORD, auth="digest"),)))


def _crawl(path: Path, site: AuthSite, *, render: RenderOptions | None = None,
           config: dict | None = None, request: RequestOptions | None = None,
           processes: int = 0) -> None:
    request = request or _options(site)
    with Store.create(path) as store:
        crawler = Crawler(store, CrawlConfig(**{"seeds": [site.url + "/"], **(config or {})},
                                             request=request.as_record()),
                          CrawlOptions(workers=2, render=render, request=request,
                                       processes=processes))
        anyio.run(crawler.run)


def _attempts(path: Path) -> list[tuple[str, int | None, bytes, bytes | None, bool]]:
    """(url, status, stored request, its opening, requested by the browser) per attempt."""
    out = []
    with Store.open(path) as store:
        rows = store.connection.execute(
            "SELECT f.url, f.http_status, q.namespace, q.digest, q.size, o.namespace, "
            "o.digest, o.size, f.render_seq IS NOT NULL FROM fetch_attempt f "
            "JOIN artifact q ON q.artifact_id = f.request_headers_id "
            "LEFT JOIN artifact o ON o.artifact_id = f.request_secrets_id").fetchall()
        for url, status, *ref, o_ns, o_digest, o_size, rendered in rows:
            opening = None if o_ns is None else store.artifacts.read(
                ArtifactRef(o_ns, o_digest, o_size), verify=True)
            out.append((url, status, store.artifacts.read(ArtifactRef(*ref), verify=True),
                        opening, bool(rendered)))
    return out


@pytest.fixture(scope="module")
def crawled(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("request") / "st"
    with AuthSite() as site:
        _crawl(path, site)
    return path, site


def test_every_request_carries_the_headers_cookies_and_credentials_configured(crawled) -> None:
    path, site = crawled
    statuses = {url.split("/", 3)[3]: status for url, status, *_ in _attempts(path)
                if "robots" not in url}
    assert statuses == {"": 200, "private": 200, "members": 200, "next": 200, "lang": 200,
                        **{f"private/{n}": 200 for n in range(1, 5)}}
    assert site.seen["/members"][0]["cookie"].count(f"sid={SID}") == 1
    # the cookie the site set on / came back on /next: the session's jar
    assert "srv=from-server" in site.seen["/next"][0]["cookie"]
    assert all(h.get("accept-language") == "fr" for seen in site.seen.values() for h in seen)


def test_secrets_are_sealed_in_the_stored_request_and_the_opening_gives_what_was_sent(
        crawled) -> None:
    path, _ = crawled
    for url, _status, stored, opening, _ in _attempts(path):
        assert not any(s in stored for s in SECRET_BYTES), stored
        if url.endswith(("/private", "/members")):
            assert opening is not None and commitments(stored)
            exact = open_request(stored, opening)  # checks it gives the stored bytes
            assert BASIC.encode() in exact
            if url.endswith("/members"):
                assert f"sid={SID}".encode() in exact
        if url.endswith("/lang"):  # a public header is stored as it was sent
            assert b"Accept-Language: fr" in stored
    with pytest.raises(Exception, match="does not give the stored request"):
        url, _, stored, opening, _ = next(a for a in _attempts(path) if a[3] is not None)
        open_request(stored.replace(b"GET", b"PUT", 1), opening)
    with Store.open(path) as store:
        report = verify(store)
    assert report.ok, report


def test_exports_leave_the_openings_out_unless_asked_and_a_restore_knows_why(
        crawled, tmp_path: Path) -> None:
    path, _ = crawled
    manifest = export(path, tmp_path / "plain")
    held = [g for g in manifest.gaps if g.subject.startswith("secrets/")]
    assert held and all("--include-secrets" in g.detail for g in held)
    assert "\nsecrets\t" not in (tmp_path / "plain" / "artifacts" / "index.tsv").read_text()
    every = b"".join(p.read_bytes() for p in (tmp_path / "plain").rglob("*") if p.is_file())
    assert not any(s in every for s in SECRET_BYTES)
    assert main(["restore", str(tmp_path / "plain"), "--store", str(tmp_path / "back")]) == 0
    full = export(path, tmp_path / "full", include_secrets=True)
    assert not [g for g in full.gaps if g.subject.startswith("secrets/")]
    index = (tmp_path / "full" / "artifacts" / "index.tsv").read_text()
    assert sum(line.startswith("secrets\t") for line in index.splitlines()) == len(held)
    for fmt in ("warc", "wacz"):
        out = tmp_path / f"out.{fmt}"
        assert main(["export", str(path), "--out", str(out), "--format", fmt]) == 0
        data = out.read_bytes()
        if fmt == "wacz":
            import zipfile
            with zipfile.ZipFile(out) as z:
                data = b"".join(z.read(n) for n in z.namelist())
        assert b"[secret sha256:" in data or fmt == "wacz"
        assert not any(s in data for s in SECRET_BYTES), fmt


def test_replay_and_show_print_no_secret(crawled, capsysbinary) -> None:
    path, site = crawled
    assert main(["show", str(path), site.url + "/members", "--json"]) == 0
    assert main(["replay", str(path), site.url + "/private"]) == 0
    out = capsysbinary.readouterr().out
    assert b"private ok" in out and not any(s in out for s in SECRET_BYTES)


def test_a_rendered_page_and_its_subrequests_carry_them_too(tmp_path: Path,
                                                           chromium: str) -> None:
    with AuthSite() as site:
        _crawl(tmp_path / "st", site, render=RenderOptions(timeout=120.0),
               config={"render_only": [r"/private$"], "max_depth": 1})
    browser = [a for a in _attempts(tmp_path / "st") if a[4]]
    pixel = [a for a in browser if a[0].endswith("/private/pixel.png")]
    assert pixel and pixel[0][1] == 200, browser
    for _url, _status, stored, opening, _ in browser:
        assert not any(s in stored for s in SECRET_BYTES)
        if opening is not None:
            assert BASIC.encode() in open_request(stored, opening)
    assert all(h.get("authorization") == BASIC for h in site.seen["/private/pixel.png"])


@pytest.mark.parametrize(("rendered", "processes"), [(False, 0), (True, 0), (False, 1)],
                         ids=["fetched", "rendered", "worker-process"])
def test_digest_credentials_answer_the_challenge_and_a_stale_nonce(
        tmp_path: Path, rendered: bool, processes: int, request: pytest.FixtureRequest
        ) -> None:
    """The first request gets the challenge (recorded), the page's next attempt answers
    it; the nonce goes stale after NONCE_USES requests and the new one is answered. In a
    worker process the same: it retries the page, and the crawl's process answers.
    Rendered, the browser's request for the pixel is answered stale the first time (as
    when other pages used the nonce up meanwhile): made again at once, answered."""
    render = None
    if rendered:
        request.getfixturevalue("chromium")
        render = RenderOptions(timeout=120.0)
    with AuthSite(digest=True, stale_once=frozenset({"/private/pixel.png"})) as site:
        _crawl(tmp_path / "st", site, request=_digest_options(), render=render,
               config={"seeds": [site.url + "/private"], "max_depth": 1, "max_attempts": 3,
                       **({"render_only": [r"/private$"]} if rendered else {})},
               processes=processes)
    attempts = [a for a in _attempts(tmp_path / "st") if "robots" not in a[0]]
    with Store.open(tmp_path / "st") as store:
        current = dict(store.connection.execute(
            "SELECT f.url, f.http_status FROM url_current c JOIN fetch_attempt f "
            "ON f.attempt_seq = c.attempt_seq").fetchall())
    assert {u.split("/", 3)[3]: s for u, s in current.items() if "robots" not in u} == {
        "private": 200, **{f"private/{n}": 200 for n in range(1, 5)}}
    first = [a for a in attempts if a[0].endswith("/private") and not a[4]]
    assert [a[1] for a in first] == [401, 200]  # the challenge, then its answer
    # 5 pages and (rendered) a pixel, NONCE_USES answers per nonce: a stale one came too
    assert len([a for a in attempts if a[1] == 401]) >= 2
    for _url, status, stored, opening, _ in attempts:
        assert PASSWORD.encode() not in stored and b'response="' not in stored
        if status == 200:
            assert opening is not None
            assert b'Digest username="alice"' in open_request(stored, opening)
    if rendered:
        pixel = [a for a in attempts if a[4] and a[0].endswith("/pixel.png")]
        assert [a[1] for a in pixel][-2:] == [401, 200], [a[:2] for a in attempts if a[4]]
        assert all(s == 401 for _u, s, *_ in pixel[:-1])


# --- the parts ------------------------------------------------------------------------------


def test_redaction_seals_only_header_values_and_each_commitment_has_its_own_salt() -> None:
    sent = (b"GET /pw?x=pw HTTP/1.1\r\nHost: h\r\nAuthorization: Basic pw\r\n"
            b"Cookie: a=pw; b=pw\r\n\r\nbody pw")
    stored, opening = redact(sent, ["pw"])
    assert stored.startswith(b"GET /pw?x=pw HTTP/1.1\r\n") and stored.endswith(b"body pw")
    marks = commitments(stored)
    assert len(marks) == 3 and len(set(marks)) == 3  # same value, different salts
    assert opening is not None and open_request(stored, opening) == sent
    assert redact(sent, []) == (sent, None)


def test_the_jar_follows_domain_path_secure_and_expiry() -> None:
    now = [1000.0]
    jar = CookieJar(clock=lambda: now[0])
    jar.update("https://a.example/x/y", ["s=1; Secure", "d=2; Domain=example; Path=/",
                                         "bad=3; Domain=other.example", "m=4; Max-Age=10",
                                         "p=5; Path=/x"])
    # the default path is the request's directory (/x); longer paths first, then older
    assert jar.header_for("https://a.example/x/z")[0] == "s=1; m=4; p=5; d=2"
    assert jar.header_for("http://a.example/x")[0] == "m=4; p=5; d=2"  # not Secure
    assert jar.header_for("https://a.example/xy")[0] == "d=2"  # /xy is not under /x
    assert jar.header_for("http://b.example/")[0] == "d=2"  # the domain's, not host-only
    now[0] += 11
    assert "m=4" not in (jar.header_for("https://a.example/x/")[0] or "")
    jar.update("https://a.example/", ["d=; Domain=example; Path=/; Max-Age=0"])
    assert jar.header_for("http://b.example/") == (None, [])


def test_digest_answers_match_the_rfc_examples(monkeypatch: pytest.MonkeyPatch) -> None:
    from evidence._crawl import digest

    monkeypatch.setattr(digest.secrets, "token_hex", lambda n: "0a4f113b")
    challenge = digest.parse_challenge(  # RFC 2617 section 3.5
        'Digest realm="testrealm@host.com", qop="auth,auth-int", '
        'nonce="dcd98b7102dd2f0e8b11d0f600bfb0c093", opaque="5ccc069c403ebaf9f0171e9517f40e41"')
    assert challenge is not None
    value = digest.authorization(challenge, "Mufasa", "Circle Of Life", "GET",
                                 "/dir/index.html")
    assert 'response="6629fae49393a05397450978507c4ef1"' in value and "nc=00000001" in value
    assert "nc=00000002" in digest.authorization(challenge, "Mufasa", "x", "GET", "/")
    monkeypatch.setattr(digest.secrets, "token_hex",
                        lambda n: "f2/wE4q74E6zIJEtWaHKaf5wv/H5QzzpXusqGemxURZJ")
    for algorithm, response in (  # RFC 7616 section 3.9.1
            ("SHA-256", "753927fa0e85d155564e2e272a28d1802ca10daf4496794697cf8db5856cb6c1"),
            ("MD5", "8ca523f5e9506fed4657c9700eebdbec")):
        challenge = digest.parse_challenge(
            f'Digest realm="http-auth@example.org", qop="auth, auth-int", '
            f'algorithm={algorithm}, nonce="7ypf/xlj9XXwfDPEoM4URrv/xwf94BcCAzFZH4GiTo0v", '
            f'opaque="FQhe/qaU925kfnzjCev0ciny7QMkPqMAFRtzCUYo5tdS"')
        assert challenge is not None
        assert f'response="{response}"' in digest.authorization(
            challenge, "Mufasa", "Circle of Life", "GET", "/dir/index.html")
    assert digest.parse_challenge('Basic realm="x"') is None
    assert digest.parse_challenge('Digest realm="x", nonce="n", qop="auth-int"') is None


def test_netscape_cookies_are_read_and_a_bad_line_is_named() -> None:
    text = ("# Netscape HTTP Cookie File\n"
            ".example.com\tTRUE\t/\tFALSE\t0\tsid\tabc\n"
            "#HttpOnly_host.example\tFALSE\t/app\tTRUE\t4102444800\ttok\txyz\n")
    a, b = parse_netscape(text, source="c.txt")
    assert (a.domain, a.host_only, a.secret, a.expires) == ("example.com", False, True, None)
    assert (b.domain, b.path, b.secure, b.expires) == ("host.example", "/app", True,
                                                       4102444800.0)
    with pytest.raises(Exception, match="c.txt, line 2: expected 7"):
        parse_netscape("# x\nexample.com\tTRUE\t/\n", source="c.txt")


# --- the command line -----------------------------------------------------------------------


def _cli_error(args: list[str], capsys) -> str:
    assert main(args) == 2
    return capsys.readouterr().err


def test_a_credential_is_refused_on_the_command_line_and_in_the_config(
        tmp_path: Path, capsys) -> None:
    store = tmp_path / "st"
    err = _cli_error(["crawl", "http://127.0.0.1:9/", "--store", str(store), "--header",
                      "Authorization: Basic eA=="], capsys)
    assert "Error: --header: Authorization carries a credential" in err and "Try:" in err
    config = tmp_path / "c.toml"
    config.write_text('[[hosts]]\nmatch = "*"\npassword = "x"\nusername = "u"\n')
    err = _cli_error(["crawl", "http://127.0.0.1:9/", "--store", str(store), "--config",
                      str(config)], capsys)
    assert "belongs in the secrets file" in err
    secrets = tmp_path / "s.toml"
    secrets.write_text('[[hosts]]\nmatch = "*"\nusername = "u"\npassword = "hunter2"\n')
    os.chmod(secrets, 0o644)
    err = _cli_error(["crawl", "http://127.0.0.1:9/", "--store", str(store), "--secrets",
                      str(secrets)], capsys)
    assert "can be read by other users" in err and "hunter2" not in err
    assert not store.exists()  # nothing created


def test_the_secrets_file_is_checked_and_its_content_never_echoed(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text('[[hosts]]\nmatch = "*"\nusername = "u"\npassword = "hunter2"\n'
                    'auth = "ntlm"\n')
    os.chmod(path, 0o600)
    with pytest.raises(Exception, match="not supported") as caught:
        load_secrets(str(path))
    assert "hunter2" not in str(caught.value)
    path.write_text('[[hosts]]\nmatch = "*.example"\nusername = "u"\npassword = "hunter2"\n'
                    '[hosts.cookies]\nsid = "v"\n')
    loaded = load_secrets(str(path))
    record = RequestOptions.build(secrets=loaded).as_record()
    assert "hunter2" not in json.dumps(record) and '"v"' not in json.dumps(record)
    assert record == [{"match": "*.example", "cookies": {"sid": None}, "username": "u",
                       "auth": "basic"}]


def test_the_options_are_recorded_and_a_resume_without_them_is_refused(
        tmp_path: Path, capsys) -> None:
    store = tmp_path / "st"
    secrets = tmp_path / "s.toml"
    secrets.write_text('[[hosts]]\nmatch = "127.0.0.1"\nusername = "alice"\n'
                       f'password = "{PASSWORD}"\n')
    os.chmod(secrets, 0o600)
    with AuthSite() as site:
        given = ["--header", "Accept-Language: fr", "--secrets", str(secrets)]
        assert main(["crawl", site.url + "/", "--store", str(store), "--max-documents", "1",
                     *given]) == 0
        with Store.open(store) as st:
            (config,), = st.connection.execute("SELECT config FROM crawl_session").fetchall()
        recorded = msgspec.json.decode(config)["request"]
        assert recorded == [{"match": "*", "headers": {"Accept-Language": "fr"}},
                            {"match": "127.0.0.1", "username": "alice", "auth": "basic"}]
        assert PASSWORD not in config
        capsys.readouterr()
        err = _cli_error(["crawl", "--store", str(store)], capsys)
        assert "give the same --header, --cookies, --secrets" in err
        err = _cli_error(["crawl", "--store", str(store), "--header", "Accept-Language: de",
                          "--secrets", str(secrets)], capsys)
        assert "request" in err  # another configuration: refused (design rule 19)
        assert main(["crawl", "--store", str(store), *given]) == 0  # the same: resumed
        assert site.seen["/private"][-1]["authorization"] == BASIC
        # the cookie the site set in the first run is in the resumed run's jar
        assert "srv=from-server" in site.seen["/next"][-1].get("cookie", "")


def test_on_postgresql_the_opening_is_recorded_verified_and_the_jar_rebuilt(
        tmp_path: Path, pg_url: str) -> None:
    secrets = tmp_path / "s.toml"
    secrets.write_text('[[hosts]]\nmatch = "127.0.0.1"\nusername = "alice"\n'
                       f'password = "{PASSWORD}"\n[hosts.cookies]\nsid = "{SID}"\n')
    os.chmod(secrets, 0o600)
    with AuthSite() as site:
        given = ["--secrets", str(secrets), "--header", "Accept-Language: fr"]
        assert main(["crawl", site.url + "/", "--store", pg_url, "--artifacts",
                     str(tmp_path / "art"), "--max-documents", "1", *given]) == 0
        assert main(["crawl", "--store", pg_url, *given]) == 0  # resumed: the jar rebuilt
        assert "srv=from-server" in site.seen["/next"][-1].get("cookie", "")
        assert site.seen["/members"][-1]["cookie"].count(f"sid={SID}") == 1
    with Store.open(pg_url) as store:
        report = verify(store)
        rows = store.connection.execute(
            "SELECT f.url, q.namespace, q.digest, q.size, o.namespace, o.digest, o.size "
            "FROM fetch_attempt f JOIN artifact q ON q.artifact_id = f.request_headers_id "
            "JOIN artifact o ON o.artifact_id = f.request_secrets_id").fetchall()
        opened = {url: open_request(store.artifacts.read(ArtifactRef(*stored)),
                                    store.artifacts.read(ArtifactRef(*opening)))
                  for url, *ref in rows for stored, opening in [(ref[:3], ref[3:])]}
    assert report.ok, report
    assert BASIC.encode() in opened[site.url + "/private"]
    assert f"sid={SID}".encode() in opened[site.url + "/members"]


_VALUE = st.text(st.sampled_from("abcXYZ019 =;+%&/"), min_size=1, max_size=12)


@settings(max_examples=300, deadline=None)
@given(fields=st.lists(st.tuples(st.sampled_from(["Cookie", "Authorization", "X-Key", "A"]),
                                 _VALUE), max_size=6),
       secrets=st.lists(_VALUE, max_size=4), body=st.binary(max_size=40),
       body_secrets=st.lists(_VALUE, max_size=3))
def test_any_request_redacted_opens_to_itself_and_no_header_value_keeps_a_secret(
        fields: list[tuple[str, str]], secrets: list[str], body: bytes,
        body_secrets: list[str]) -> None:
    sent = ("GET /a HTTP/1.1\r\n" + "".join(f"{n}: {v}\r\n" for n, v in fields)
            + "\r\n").encode("latin-1") + body
    stored, opening = redact(sent, secrets, body_secrets)
    if opening is None:
        assert stored == sent
        return
    assert open_request(stored, opening) == sent
    head = stored[:stored.index(b"\r\n\r\n")]
    for line in head.split(b"\r\n")[1:]:
        value = line.split(b":", 1)[1]
        for secret in secrets:
            assert secret.encode() not in re.sub(rb"\[secret sha256:[0-9a-f]{64}\]", b"\x00",
                                                 value)


def test_hosts_tables_in_the_config_print_back_as_the_same_crawl(tmp_path: Path,
                                                                  capsys) -> None:
    config = tmp_path / "c.toml"
    config.write_text(f'store = "{tmp_path / "st"}"\nseeds = ["http://127.0.0.1:9/"]\n'
                      '[[hosts]]\nmatch = "*.example"\n'
                      'headers = { "Accept-Language" = "fr" }\ncookies = { consent = "yes" }\n'
                      'public_cookies = ["consent"]\n')
    assert main(["crawl", "--config", str(config), "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert 'hosts = [{"match" = "*.example", "headers" = {"Accept-Language" = "fr"}' in printed
    again = tmp_path / "again.toml"
    again.write_text(printed)
    assert main(["crawl", "--config", str(again), "--print-config"]) == 0
    assert capsys.readouterr().out == printed


def test_worker_processes_send_them_and_the_jar_stays_in_the_crawl_process(
        tmp_path: Path) -> None:
    """With ``--processes`` the crawl's own process decides each order's headers and
    Cookie (the jar lives there) and its worker reports the answer's Set-Cookie back: the
    cookie the site set on / comes back on /next, fetched by a worker process; secrets are
    sealed the same way."""
    path = tmp_path / "st"
    with AuthSite() as site:
        request = _options(site)
        with Store.create(path) as store:
            crawler = Crawler(store, CrawlConfig(seeds=[site.url + "/"],
                                                 request=request.as_record()),
                              CrawlOptions(workers=2, processes=1, request=request))
            anyio.run(crawler.run)
        assert "srv=from-server" in site.seen["/next"][0]["cookie"]
        assert site.seen["/members"][0]["cookie"].count(f"sid={SID}") == 1
        assert all(h.get("accept-language") == "fr" for seen in site.seen.values()
                   for h in seen)
    assert any(c.name == "srv" and c.value == "from-server" for c in request.jar)
    attempts = _attempts(path)
    assert {u.split("/", 3)[3]: s for u, s, *_ in attempts if "robots" not in u} == {
        "": 200, "private": 200, "members": 200, "next": 200, "lang": 200,
        **{f"private/{n}": 200 for n in range(1, 5)}}
    for url, _status, stored, opening, _ in attempts:
        assert not any(s in stored for s in SECRET_BYTES), stored
        if url.endswith("/members"):
            assert opening is not None and f"sid={SID}".encode() in open_request(stored,
                                                                                 opening)
    with Store.open(path) as store:
        assert verify(store).ok


def test_what_worker_processes_and_hosts_cannot_carry_is_refused_saying_why(
        tmp_path: Path, capsys) -> None:
    store, url = tmp_path / "st", "http://127.0.0.1:9/"
    token = tmp_path / "token"
    token.write_text("t" * 32)
    os.chmod(token, 0o600)
    err = _cli_error(["crawl", url, "--store", str(store), "--header", "Accept-Language: fr",
                      "--listen", "127.0.0.1:0", "--token-file", str(token)], capsys)
    assert "Error: headers, cookies, credentials and logins are not sent to worker hosts" \
        in err and "never sent over the network" in err and "Try: leave out --listen" in err
    secrets = tmp_path / "s.toml"
    secrets.write_text(f'[[logins]]\nurl = "{url}login"\nsubmit = "#go"\n'
                       'logged_in = "#out"\nfields = { "#user" = "hunter2" }\n')
    os.chmod(secrets, 0o600)
    err = _cli_error(["crawl", url, "--store", str(store), "--secrets", str(secrets),
                      "--processes", "2"], capsys)
    assert "Error: a login is watched (a page logged out, a login again) as each page " \
        "settles, in the crawl's own process" in err and "Try: leave out --processes" in err
    assert "hunter2" not in err
    assert not store.exists()
