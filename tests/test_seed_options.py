"""Per-seed configuration (issue 36 point 5): a TOML seeds file gives each seed its own
scope, depth, patterns, headers and behaviours; one crawl holds many sites with their own
rules, recorded in the session's configuration so that a resumed run keeps them.

Two sites on 127.0.0.1 (tests/authsite.py, on two ports: two origins) stand for two sites.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from evidence import Store
from evidence._cli.main import main

from .authsite import AuthSite


def _seeds(path: Path, a: AuthSite, b: AuthSite, extra_a: str = "", extra_b: str = "") -> Path:
    path.write_text(f'[[seeds]]\nurl = "{a.url}/"\nmax_depth = 0\n'
                    f'headers = {{ "Accept-Language" = "fr" }}\n{extra_a}\n'
                    f'[[seeds]]\nurl = "{b.url}/"\nmax_depth = 1\nexclude = ["/members"]\n'
                    f'{extra_b}\n')
    return path


def _fetched(store: Path) -> dict[str, tuple[str, str | None]]:
    """URL -> (frontier state, reason) of every URL of the session."""
    with Store.open(store) as st:
        return {u: (s, r) for u, s, r in st.connection.execute(
            "SELECT url, state, reason FROM frontier").fetchall()}


def test_each_seed_keeps_its_own_depth_patterns_and_headers(tmp_path: Path) -> None:
    store = tmp_path / "st"
    with AuthSite() as a, AuthSite() as b:
        seeds = _seeds(tmp_path / "seeds.toml", a, b)
        assert main(["crawl", "--seeds", str(seeds), "--store", str(store)]) == 0
        state = _fetched(store)
        # a: depth 0, the seed only; its links are beyond its depth (and b's rules are
        # b's origin's: the host scope keeps a's URLs out of them)
        assert state[a.url + "/"][0] == "done"
        assert state[a.url + "/private"] == ("skipped", "depth: 1 is beyond max depth 0")
        # b: depth 1, /members excluded by b's pattern only
        assert state[b.url + "/private"][0] == state[b.url + "/next"][0] == "done"
        assert state[b.url + "/members"] == ("skipped", "scope: exclude pattern '/members'")
        assert [h.get("accept-language") for h in a.seen["/"]] == ["fr"]
        assert all("accept-language" not in h for seen in b.seen.values() for h in seen)
    with Store.open(store) as st:
        (config,), = st.connection.execute("SELECT config FROM crawl_session").fetchall()
    recorded = msgspec.json.decode(config)["seed_options"]
    assert recorded == [
        {"url": a.url + "/", "max_depth": 0, "headers": {"Accept-Language": "fr"}},
        {"url": b.url + "/", "max_depth": 1, "exclude": ["/members"]}]


def test_a_resumed_run_keeps_the_seeds_rules_without_the_file(tmp_path: Path) -> None:
    store = tmp_path / "st"
    with AuthSite() as a, AuthSite() as b:
        seeds = _seeds(tmp_path / "seeds.toml", a, b)
        assert main(["crawl", "--seeds", str(seeds), "--store", str(store),
                     "--max-documents", "2", "--workers", "1"]) == 0
        seeds.unlink()
        assert main(["crawl", "--store", str(store)]) == 0
        state = _fetched(store)
        assert state[b.url + "/members"][0] == "skipped"
        assert state[a.url + "/private"][0] == "skipped"
        assert all(h.get("accept-language") == "fr" for h in a.seen["/"])


def test_a_seeds_file_with_a_mistake_is_refused_naming_it_and_nothing_is_created(
        tmp_path: Path, capsys) -> None:
    store = tmp_path / "st"
    for body, words in (
            ('[[seeds]]\nurl = "http://127.0.0.1:9/"\nscope = "planet"\n',
             "seeds[0]: scope 'planet' is not host, domain or prefix"),
            ('[[seeds]]\nurl = "http://127.0.0.1:9/"\nmax_dept = 1\n', "seeds[0]"),
            ('[[seeds]]\nurl = "http://127.0.0.1:9/"\nheaders = { Cookie = "a=b" }\n',
             "Cookie carries a credential"),
            ('[[seeds]]\nurl = "http://127.0.0.1:9/"\nbehaviors = ["dance"]\n',
             "unknown behaviour 'dance'"),
            ('[[seeds]]\nurl = "127.0.0.1:9"\n', "127.0.0.1:9"),
            ("seeds = 3\n", "holds no [[seeds]] table")):
        path = tmp_path / "s.toml"
        path.write_text(body)
        assert main(["crawl", "--seeds", str(path), "--store", str(store)]) == 2
        err = capsys.readouterr().err
        assert words in err and "Try:" in err and "Traceback" not in err, err
        assert not store.exists()


def test_a_line_seeds_file_still_works_and_print_config_shows_the_file(
        tmp_path: Path, capsys) -> None:
    with AuthSite() as a:
        plain = tmp_path / "seeds.txt"
        plain.write_text(f"# one a line\n{a.url}/lang\n")
        assert main(["crawl", "--seeds", str(plain), "--store", str(tmp_path / "st"),
                     "--header", "Accept-Language: fr"]) == 0
        assert a.seen["/lang"][0]["accept-language"] == "fr"
    config = tmp_path / "c.toml"
    config.write_text(f'seeds = "{tmp_path / "x.toml"}"\n')
    (tmp_path / "x.toml").write_text('[[seeds]]\nurl = "http://127.0.0.1:9/"\nmax_depth = 0\n')
    capsys.readouterr()
    assert main(["crawl", "--config", str(config), "--store", str(tmp_path / "s2"),
                 "--print-config"]) == 0
    assert 'seeds = ["http://127.0.0.1:9/"]' in capsys.readouterr().out


def test_each_seed_renders_with_its_own_behaviours(tmp_path: Path, chromium: str) -> None:
    store = tmp_path / "st"
    with AuthSite() as a, AuthSite() as b:
        seeds = _seeds(tmp_path / "seeds.toml", a, b, extra_a="behaviors = []",
                       extra_b='behaviors = ["details"]')
        assert main(["crawl", "--seeds", str(seeds), "--store", str(store), "--render-only",
                     r"/$", "--render-timeout", "120"]) == 0
    with Store.open(store) as st:
        rows = st.connection.execute(
            "SELECT r.url, a.namespace, a.digest, a.size FROM render r "
            "LEFT JOIN artifact a ON a.artifact_id = r.behaviors_id").fetchall()
        logs = {}
        for url, ns, digest, size in rows:
            from evidence._model.refs import ArtifactRef
            logs[url] = None if ns is None else json.loads(
                st.artifacts.read(ArtifactRef(ns, digest, size)))
    assert logs[a.url + "/"] is None  # behaviours off for a
    assert logs[b.url + "/"] is not None
    assert json.dumps(logs[b.url + "/"]).count("details") >= 1
    assert "autoscroll" not in json.dumps(logs[b.url + "/"])


def test_a_url_is_taken_by_some_seed_and_else_skipped_with_the_nearest_seeds_reason(
        ) -> None:
    from evidence import CrawlConfig
    from evidence._crawl.frontier import Scope

    scope = Scope(CrawlConfig(seeds=["http://a.test/x/", "http://b.test/"], seed_options=[
        {"url": "http://a.test/x/", "scope": "prefix", "max_depth": 3},
        {"url": "http://b.test/", "max_depth": 0}]))
    assert scope.reason_to_skip("http://a.test/x/y", 3) is None
    assert scope.reason_to_skip("http://a.test/z", 1) == "scope: not under a seed prefix"
    assert scope.reason_to_skip("http://b.test/q", 1) == "depth: 1 is beyond max depth 0"
    # no seed of its origin or host: the first seed's reason
    assert scope.reason_to_skip("http://c.test/", 0) == "scope: not under a seed prefix"
