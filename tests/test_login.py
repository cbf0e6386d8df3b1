"""Logins that hold (issue 36 point 2): a form login run in Chromium (a CSRF token, a
pre-session cookie), recorded as evidence with its secrets sealed; its session used by the
crawler's fetches; and, when the site's session expires after K requests, the crawl sees
it logged out, logs in again (at most N times) and refetches, recording why.

The site is tests/loginsite.py. Every test drives the real Debian Chromium.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from evidence import Store, verify
from evidence._cli.main import main
from evidence._crawl.secrets import open_request
from evidence._model.messages import decode_message
from evidence._model.refs import ArtifactRef

from .loginsite import PAGES, PASSWORD, USER, LoginSite


def _secrets(tmp_path: Path, site: LoginSite, max_logins: int = 3,
             logged_out: str | None = None) -> Path:
    path = tmp_path / "secrets.toml"
    path.write_text(
        f'[[logins]]\nurl = "{site.url}/login"\nsubmit = "#go"\nlogged_in = "#logout"\n'
        f"max_logins = {max_logins}\n"
        + (f'logged_out = "{logged_out}"\n' if logged_out else "")
        + f'[logins.fields]\n"#user" = "{USER}"\n"#pass" = "{PASSWORD}"\n')
    os.chmod(path, 0o600)
    return path


def _crawl(tmp_path: Path, site: LoginSite, *extra: str, **secrets: object) -> Path:
    store = tmp_path / "st"
    assert main(["crawl", site.url + "/account", "--store", str(store), "--workers", "1",
                 "--render-timeout", "120", "--secrets", str(_secrets(tmp_path, site,
                                                                    **secrets)),
                 *extra]) == 0
    return store


def _state(store: Path) -> dict[str, tuple[str, str]]:
    with Store.open(store) as st:
        return {u.split("/", 3)[3]: (s, r) for u, s, r in st.connection.execute(
            "SELECT url, state, reason FROM frontier").fetchall()}


def _requests(store: Path) -> list[tuple[str, str, int | None, bytes, bytes | None]]:
    """(method, url, status, stored request, exact request or None) of every attempt."""
    out = []
    with Store.open(store) as st:
        for method, url, status, *refs in st.connection.execute(
                "SELECT f.method, f.url, f.http_status, q.namespace, q.digest, q.size, "
                "o.namespace, o.digest, o.size FROM fetch_attempt f "
                "JOIN artifact q ON q.artifact_id = f.request_headers_id "
                "LEFT JOIN artifact o ON o.artifact_id = f.request_secrets_id "
                "ORDER BY f.log_index"):
            stored = st.artifacts.read(ArtifactRef(*refs[:3]))
            exact = None if refs[3] is None else open_request(
                stored, st.artifacts.read(ArtifactRef(*refs[3:])))
            out.append((method, url, status, stored, exact))
    return out


@pytest.fixture(scope="module")
def relogged(tmp_path_factory: pytest.TempPathFactory, chromium: str):
    """A crawl of /account and its pages whose session lasts 4 requests."""
    tmp = tmp_path_factory.mktemp("login")
    with LoginSite(session_requests=4) as site:
        store = _crawl(tmp, site, max_logins=5)
    return store, site


def test_the_login_holds_and_every_page_is_fetched_logged_in(relogged) -> None:
    store, site = relogged
    state = _state(store)
    pages = ["account", *(f"page/{n}" for n in range(1, PAGES + 1))]
    assert all(state[p][0] == "done" for p in pages), state
    with Store.open(store) as st:
        current = dict(st.connection.execute(
            "SELECT f.url, f.http_status FROM url_current c JOIN fetch_attempt f "
            "ON f.attempt_seq = c.attempt_seq").fetchall())
    assert all(current[f"{site.url}/{p}"] == 200 for p in pages), current


def test_an_expired_session_is_logged_in_again_and_the_page_refetched_saying_why(
        relogged) -> None:
    store, site = relogged
    # 7 pages and /gone, 4 requests per session (the login's own /account counts): the
    # crawl logged in more than once, each time after a page was redirected to /login
    assert 2 <= site.logins <= 5
    with Store.open(store) as st:  # each retry's reason, in the log (the frontier's
        # row keeps only the last)
        reasons = [s.reason for (payload,) in st.connection.execute(
            "SELECT payload FROM ingest_ledger WHERE kind = 'frontier'")
            for s in decode_message(payload).settled if s.reason.startswith("logged out")]
    assert reasons and all(r.startswith("logged out (redirected to the login page): ")
                           for r in reasons)
    assert any(r.endswith(f"logged in again, login 2 of 5: retry {n} of 3")
               for r in reasons for n in (2, 3))
    requests = _requests(store)
    redirected = [r for r in requests if r[0] == "GET" and r[2] == 302
                  and "/login" not in r[1]]
    assert redirected, "a page was redirected to the login page"
    with Store.open(store) as st:
        renders = st.connection.execute(
            "SELECT r.url, r.outcome, a.namespace, a.digest, a.size FROM render r "
            "JOIN artifact a ON a.artifact_id = r.behaviors_id").fetchall()
        logs = [json.loads(st.artifacts.read(ArtifactRef(*ref))) for *_, ref in
                [(u, o, tuple(x)) for u, o, *x in renders]]
    assert len(logs) == site.logins
    assert logs[0]["why"] == "the run starts"
    assert all(log["logged_in"] for log in logs)
    assert any(log["why"].startswith("logged out: redirected to the login page")
               for log in logs[1:])
    assert [a["action"] for a in logs[0]["actions"]] == ["fill", "fill", "submit", "check"]


def test_the_login_is_evidence_with_its_secrets_sealed(relogged, tmp_path: Path) -> None:
    store, site = relogged
    requests = _requests(store)
    posts = [r for r in requests if r[0] == "POST"]
    assert len(posts) == site.logins and all(r[2] == 303 for r in posts)
    secret_forms = (PASSWORD.encode(), b"pa+ss%26word", b"pa%20ss%26word")
    for _method, _url, _status, stored, exact in posts:
        assert not any(f in stored for f in secret_forms)
        assert exact is not None and b"pass=pa+ss%26word" in exact  # the form as sent
        assert b"csrf=" in stored  # the token is not a secret: it is in the page
    with Store.open(store) as st:
        assert verify(st).ok
    out = tmp_path / "login.warc"
    assert main(["export", str(store), "--out", str(out), "--format", "warc"]) == 0
    assert not any(f in out.read_bytes() for f in secret_forms)


def test_a_page_that_says_it_is_logged_out_is_caught_by_the_pattern(
        tmp_path: Path, chromium: str) -> None:
    with LoginSite(session_requests=100) as site:
        store = _crawl(tmp_path, site, max_logins=2, logged_out="Please log in")
    state = _state(store)
    # /gone/1 always says "Please log in": logged in again once (2 of 2), then no login
    # was left, and the page settled as it came
    assert state["gone/1"][0] == "done"
    assert site.logins == 2


def test_a_login_that_does_not_hold_fails_the_run_and_is_recorded(
        tmp_path: Path, chromium: str, capsys) -> None:
    with LoginSite() as site:
        path = _secrets(tmp_path, site)
        path.write_text(path.read_text().replace(PASSWORD, "wrong"))
        assert main(["crawl", site.url + "/account", "--store", str(tmp_path / "st"),
                     "--secrets", str(path), "--render-timeout", "120"]) == 2
    err = capsys.readouterr().err
    assert "the login at" in err and "'#logout' is not on the page" in err
    assert "wrong" not in err
    with Store.open(tmp_path / "st") as st:
        (outcome,), = st.connection.execute("SELECT outcome FROM render").fetchall()
    assert outcome == "error"
    assert site.logins == 0


@pytest.mark.slow
def test_a_logged_in_feed_with_infinite_scroll_replays_in_replaywebpage(
        tmp_path: Path, chromium: str) -> None:
    """The issue's last check: a rendered crawl of an area behind the login whose items
    appear only as a person scrolls (the autoscroll behaviour, on by default) exports to a
    WACZ that ReplayWeb.page (headless Chromium, on 127.0.0.1) replays logged in: the
    feed says whose it is, and scrolling the replay brings every item back from the WACZ."""
    from .conftest import replayed_in_replaywebpage
    from .loginsite import FEED_PAGE, FEED_PAGES

    with LoginSite(session_requests=100) as site:
        store = tmp_path / "st"
        assert main(["crawl", site.url + "/feed", "--store", str(store), "--workers", "1",
                     "--render", "--render-timeout", "120", "--exclude", "/logout",
                     "--secrets", str(_secrets(tmp_path, site))]) == 0
        scrolled = [p for p, live in site.paths if p == "/feed/more"]
        assert len(scrolled) == FEED_PAGES - 1  # the behaviour scrolled to the end
        assert all(live for p, live in site.paths if p.startswith("/feed"))
    wacz = tmp_path / "feed.wacz"
    assert main(["export", str(store), "--out", str(wacz), "--format", "wacz"]) == 0
    every = FEED_PAGE * FEED_PAGES
    probe = ("(window.scrollTo(0, document.body.scrollHeight), "
             "document.getElementById('who').textContent + ' ' "
             "+ document.querySelectorAll('.item').length)")
    shown = replayed_in_replaywebpage(wacz, site.url + "/feed", probe, frame="/feed",
                                      ready=lambda v: v == f"feed of {USER} {every}")
    assert shown == f"feed of {USER} {every}"


def test_a_page_that_needs_the_login_s_local_storage_renders_logged_in(
        tmp_path: Path, chromium: str) -> None:
    """The login's storage state is cookies and localStorage: /account keeps an API token
    (and the user's name) in localStorage; /app's content needs them. The render of /app
    starts with what the login left, records it in its log (the name, a field's value, as
    ``[field #user]``), and seals the name wherever a request of the render carries it."""
    from .loginsite import APP_ITEMS

    with LoginSite(session_requests=100) as site:
        store = tmp_path / "st"
        assert main(["crawl", site.url + "/app", "--store", str(store), "--workers", "1",
                     "--render", "--render-timeout", "120", "--behaviors", "none",
                     "--secrets", str(_secrets(tmp_path, site))]) == 0
        [(token, user, valid)] = site.api_calls
        assert valid and user == USER and token == next(iter(site.api_tokens.values()))
    with Store.open(store) as st:
        rows = st.connection.execute(
            "SELECT r.url, d.namespace, d.digest, d.size, b.namespace, b.digest, b.size "
            "FROM render r JOIN artifact d ON d.artifact_id = r.dom_id "
            "JOIN artifact b ON b.artifact_id = r.behaviors_id").fetchall()
        logs = {url.rsplit("/", 1)[1]: (st.artifacts.read(ArtifactRef(*ref[:3])),
                                        st.artifacts.read(ArtifactRef(*ref[3:])))
                for url, *ref in rows}
        assert verify(st).ok
    dom, log = logs["app"]
    assert all(f'<li class="item">{item}</li>'.encode() in dom for item in APP_ITEMS)
    given = json.loads(log)["storage"]
    assert given == {"origin": site.url, "items": {"token": token, "who": "[field #user]"}}
    assert json.loads(logs["login"][1])["storage"] == given  # what the login captured
    assert USER.encode() not in log
    [(stored, exact)] = [(r[3], r[4]) for r in _requests(store) if r[1].endswith("/api/items")]
    assert f"X-Token: {token}".encode() in stored  # the site's token: evidence as it is
    assert b"X-User: [secret sha256:" in stored and exact is not None
    assert f"X-User: {USER}".encode() in exact  # the opening proves the name sent


def _named_secrets(tmp_path: Path, *names: str) -> Path:
    """A secrets file with a named login per name: the field values and the submit
    element only (a seed gives the login page and the check)."""
    path = tmp_path / "named.toml"
    path.write_text("".join(f'[[logins]]\nname = "{name}"\nsubmit = "#go"\n'
                            f'[logins.fields]\n"#user" = "{USER}"\n"#pass" = "{PASSWORD}"\n'
                            for name in names))
    os.chmod(path, 0o600)
    return path


def test_a_seed_names_a_login_of_the_secrets_file_and_the_session_records_it(
        tmp_path: Path, chromium: str) -> None:
    """``login`` in a ``[[seeds]]`` table runs the secrets file's login of that name, with
    the parts the seed gives (its page, its check); the session records which, never a
    value, and a resumed run logs in with it again without the seeds file. A named login
    no seed names does not run."""
    secrets = _named_secrets(tmp_path, "intranet", "unused")
    with LoginSite(session_requests=100) as site:
        seeds = tmp_path / "seeds.toml"
        seeds.write_text(f'[[seeds]]\nurl = "{site.url}/account"\nmax_depth = 1\n'
                         f'exclude = ["/logout", "/gone"]\n[seeds.login]\nname = "intranet"\n'
                         f'url = "{site.url}/login"\nlogged_in = "#logout"\n')
        store = tmp_path / "st"
        assert main(["crawl", "--seeds", str(seeds), "--store", str(store), "--workers", "1",
                     "--render-timeout", "120", "--secrets", str(secrets),
                     "--max-documents", "3"]) == 0
        assert site.logins == 1
        seeds.unlink()
        assert main(["crawl", "--store", str(store), "--render-timeout", "120",
                     "--secrets", str(secrets)]) == 0
        assert site.logins == 2
        state = _state(store)
        assert all(state[f"page/{n}"][0] == "done" for n in range(1, PAGES + 1)), state
        assert all(live for path, live in site.paths if path.startswith("/page/"))
    with Store.open(store) as st:
        (config,), = st.connection.execute("SELECT config FROM crawl_session").fetchall()
    recorded = json.loads(config)
    assert recorded["seed_options"][0]["login"] == {
        "name": "intranet", "url": f"{site.url}/login", "logged_in": "#logout"}
    assert [r["login"] for r in recorded["request"] if "login" in r] == [{
        "name": "intranet", "url": f"{site.url}/login", "fields": ["#pass", "#user"],
        "submit": "#go", "logged_in": "#logout", "max_logins": 3}]
    assert USER not in config and "ss&word" not in config


def test_a_seed_s_login_that_cannot_be_used_is_refused_naming_the_line(
        tmp_path: Path, capsys) -> None:
    """Each mistake names the seeds file and the line of the seed's login, and nothing is
    created (no browser: refused before the crawl starts)."""
    secrets = _named_secrets(tmp_path, "intranet")
    store = tmp_path / "st"
    head = '# sites\n[[seeds]]\nurl = "http://127.0.0.1:9/"\n\n[[seeds]]\nurl = "http://127.0.0.1:9/b"\n'
    for body, extra, words in (
            ('login = "intranet"\n', (), "s.toml, line 7: login = 'intranet' names a login of "
             "the secrets file, and none was given"),
            ('login = "extranet"\n', ("--secrets", str(secrets)), "s.toml, line 7: login = "
             "'extranet': the secrets file has no login by that name (it has 'intranet')"),
            ('[seeds.login]\nname = "intranet"\nfields = { "#user" = "x" }\n',
             ("--secrets", str(secrets)), "s.toml, line 7: login.fields: a login's field "
             "values are secrets"),
            ("login = 3\n", ("--secrets", str(secrets)), "s.toml, line 7: login: Expected "),
            ('login = "intranet"\n', ("--secrets", str(secrets)),
             "the login 'intranet' has no url")):
        path = tmp_path / "s.toml"
        path.write_text(head + body)
        assert main(["crawl", "--seeds", str(path), "--store", str(store), *extra]) == 2
        err = capsys.readouterr().err
        assert words in err and "Try:" in err and "Traceback" not in err, err
        assert not store.exists()
