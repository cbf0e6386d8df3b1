"""``evidence crawl --config FILE``: every crawl option under its long flag's name, seeds from
a file, the command line winning, ``--print-config`` (issue 34 point 2)."""

from __future__ import annotations

import contextlib
import io
import json
import tomllib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evidence import Store
from evidence._cli.main import main as cli_main
from evidence._demo.site import SiteConfig, TestSite


def printed(*argv: str) -> dict[str, object]:
    """What ``crawl ARGV --print-config`` prints, read back as TOML."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli_main(["crawl", *argv, "--print-config"]) == 0
    return tomllib.loads(out.getvalue())


def test_a_crawl_configured_by_a_file_records_the_same_session_as_the_same_flags(
        tmp_path: Path) -> None:
    with TestSite(SiteConfig(pages=10)) as site:
        (tmp_path / "seeds.txt").write_text(f"# the demo site\n\n{site.url}\n")
        (tmp_path / "crawl.toml").write_text(
            f'store = "{tmp_path / "by-file"}"\nseeds = "{tmp_path / "seeds.txt"}"\n'
            'workers = 2\nmax_documents = 4\nexclude = ["/p/9$"]\nmax_depth = 3\n')
        by_file = cli_main(["crawl", "--config", str(tmp_path / "crawl.toml"),
                            "--max-documents", "3"])  # the command line wins
        by_flags = cli_main(["crawl", site.url, "--store", str(tmp_path / "by-flags"),
                             "--workers", "2", "--max-documents", "3", "--exclude", "/p/9$",
                             "--max-depth", "3"])
    assert by_file == by_flags == 0

    def recorded(name: str) -> tuple[dict, int]:
        with Store.open(tmp_path / name, read_only=True) as store:
            (config,), = store.connection.execute("SELECT config FROM crawl_session")
            (requested,), = store.connection.execute(
                "SELECT count(*) FROM fetch_attempt WHERE url NOT LIKE '%robots.txt'")
        return json.loads(config), requested

    assert recorded("by-file") == recorded("by-flags")
    assert recorded("by-file")[1] == 3


_OPTIONS = st.fixed_dictionaries({}, optional={
    "workers": st.integers(1, 64),
    "delay": st.floats(0, 10, allow_nan=False).map(lambda f: round(f, 3)),
    "max_documents": st.integers(1, 10**6),
    "scope": st.sampled_from(["host", "domain", "prefix"]),
    "include": st.lists(st.from_regex(r"[a-z/]{1,8}", fullmatch=True), max_size=3),
    "render": st.booleans(),
    "ignore_robots": st.booleans(),
    "user_agent": st.text(st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]),
                          min_size=1, max_size=20),
})


def _flags(options: dict[str, object]) -> list[str]:
    argv = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            argv += [flag] if value else []
        elif isinstance(value, list):
            for item in value:
                argv += [flag, str(item)]
        else:
            argv.append(f"{flag}={value}")
    return argv


@settings(max_examples=25, deadline=None)
@given(file_options=_OPTIONS, line_options=_OPTIONS)
def test_any_file_and_command_line_give_the_options_of_the_command_line_over_the_file(
        tmp_path_factory: pytest.TempPathFactory, file_options: dict,
        line_options: dict) -> None:
    directory = tmp_path_factory.mktemp("cfg")
    config = directory / "crawl.toml"
    config.write_text("".join(f"{k} = {json.dumps(v, ensure_ascii=False)}\n"
                              for k, v in file_options.items()))
    base = ["http://127.0.0.1:1/", "--store", str(directory / "s")]
    combined = printed(*base, "--config", str(config), *_flags(line_options))
    # The same as flags alone, the command line's after the file's (append options: the
    # command line's list replaces the file's), and --print-config reads back to itself.
    # (An empty list or a false switch gives no flag: the file's value stands.)
    given_on_line = {k: v for k, v in line_options.items() if v is not False and v != []}
    merged = {**file_options, **given_on_line}
    assert combined == printed(*base, *_flags(merged))
    config.write_text("".join(f"{k} = {json.dumps(v, ensure_ascii=False)}\n"
                              for k, v in combined.items()))
    assert printed("--config", str(config)) == combined
    assert not (directory / "s").exists(), "--print-config creates nothing"


@pytest.mark.parametrize(("text", "message"), [
    ('store = "S"\nmax_document = 3\n', "crawl.toml, line 2: unknown key 'max_document'"),
    ('store = "S"\nworkers = 0\n', "crawl.toml, line 2: workers = 0: must be 1 or more"),
    ('store = "S"\nworkers = "many"\n', "crawl.toml, line 2: workers = 'many'"),
    ('store = "S"\nrender = "yes"\n', "crawl.toml, line 2: render = 'yes': expected true"),
    ('store = "S"\nscope = "planet"\n', "scope = 'planet': expected one of host, domain"),
    ('store = "S"\nseeds = 3\n', "seeds = 3: expected a list of URLs"),
    ('store = "S"\nseeds = "missing.txt"\n', "cannot read the seeds file missing.txt"),
    ('store = "S"\nworkers = \n', "not valid TOML"),
    ('workers = 2\n', "the crawl needs a store"),
])
def test_a_bad_configuration_names_the_file_line_and_key_and_creates_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        text: str, message: str) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "crawl.toml").write_text(text)
    assert cli_main(["crawl", "http://127.0.0.1:1/", "--config", "crawl.toml"]
                    if "seeds" not in text else ["crawl", "--config", "crawl.toml"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("Error: ") and message in err and "\nTry: " in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["crawl.toml"]


def test_a_seeds_file_without_a_url_is_refused(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "seeds.txt").write_text("# nothing yet\n\n")
    assert cli_main(["crawl", "--seeds", str(tmp_path / "seeds.txt"), "--store",
                     str(tmp_path / "s")]) == 2
    assert "holds no URL" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()
