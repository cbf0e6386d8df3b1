"""``evidence show``: a page's evidence and its parts, out of a rendered crawl (issue 34
point 5), and ``status`` counting renders."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from evidence import CrawlConfig, Crawler, CrawlOptions, Store
from evidence._cli.main import main as cli_main

from .conftest import png_pixels
from .jssite import BANNER, JsSite


def evidence(*args: object) -> subprocess.CompletedProcess[str]:
    """The command as a user runs it: a process, its exit status and its two streams."""
    return subprocess.run([sys.executable, "-m", "evidence", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def in_process(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str]:
    code = cli_main([str(a) for a in args])
    return code, capsys.readouterr().out


@pytest.fixture(scope="module")
def crawled(tmp_path_factory: pytest.TempPathFactory, chromium: str):
    """One rendered crawl of the scripted site, and one without rendering."""
    base = tmp_path_factory.mktemp("show")
    with JsSite() as site:
        for name, render in (("rendered", True), ("plain", False)):
            with Store.create(base / name) as store:
                anyio.run(Crawler(store, CrawlConfig(seeds=[site.url], render=render),
                                  CrawlOptions(workers=2)).run)
    return base, site.url + "page"


def test_show_lists_a_pages_attempts_and_renders_and_writes_its_parts(
        crawled, tmp_path: Path) -> None:
    base, url = crawled
    out = {part: tmp_path / f"{part}.out" for part in
           ("screenshot", "dom", "headers", "request", "body", "content")}
    done = evidence("show", base / "rendered", url, "--json",
                    *[x for part, f in out.items() for x in (f"--{part}", f)])
    assert done.returncode == 0, done.stderr
    facts = json.loads(done.stdout)
    chosen = [a for a in facts["attempts"] if a["chosen"]]
    assert len(chosen) == 1 and chosen[0]["http_status"] == 200
    assert [r["outcome"] for r in facts["renders"]] == ["rendered"]
    assert facts["renders"][0]["attempt_id"] == chosen[0]["attempt_id"]
    assert facts["links_in"] >= 1 and facts["links_out"] >= 1
    # Each file holds exactly the recorded bytes of the part the facts name.
    with Store.open(base / "rendered", read_only=True) as store:
        for part, path in out.items():
            ref = facts["parts"][part]
            assert facts["written"][part] == str(path)
            assert path.read_bytes() == store.artifacts.read(
                _ref(ref), verify=True)
    width, height, _rows, _ = png_pixels(out["screenshot"].read_bytes(), max_rows=1)
    assert width > 0 and height > 0
    assert BANNER in out["dom"].read_text()
    assert out["headers"].read_bytes().startswith(b"HTTP/1.1 200")
    assert out["request"].read_bytes().startswith(b"GET /page HTTP/1.1\r\n")
    assert b"Scripted" in out["content"].read_bytes()


def test_show_prints_the_facts_as_text(crawled, capsys: pytest.CaptureFixture[str]) -> None:
    base, url = crawled
    code, out = in_process(capsys, "show", base / "rendered", url)
    assert code == 0
    assert "renders    1" in out and "  * " in out and "screenshot" in out


def _ref(value: dict):
    from evidence import ArtifactRef

    return ArtifactRef(value["namespace"], value["digest"], value["size"])


def test_show_of_a_part_not_recorded_or_a_page_not_crawled_writes_nothing(
        crawled, tmp_path: Path) -> None:
    base, url = crawled
    shot, body = tmp_path / "shot.png", tmp_path / "body.bin"
    done = evidence("show", base / "plain", url, "--body", body, "--screenshot", shot)
    assert done.returncode == 2
    assert "Error:" in done.stderr and "Try:" in done.stderr and "screenshot" in done.stderr
    assert "Traceback" not in done.stderr
    assert not shot.exists() and not body.exists(), "a failed command writes nothing"
    assert cli_main(["show", str(base / "plain"), url.replace("/page", "/nowhere")]) == 2


def test_status_counts_renders(crawled, capsys: pytest.CaptureFixture[str]) -> None:
    base, _ = crawled
    code, out = in_process(capsys, "status", base / "rendered", "--json")
    assert code == 0
    assert json.loads(out)["rows"]["render"] == 3  # the three HTML pages: /, /page, /hidden
    assert json.loads(in_process(capsys, "status", base / "plain", "--json")[1])[
        "rows"]["render"] == 0
    assert "renders 3" in in_process(capsys, "status", base / "rendered")[1]
