"""Replay in a browser (issue 17 point 3): ``evidence replay STORE --serve`` runs pywb on
127.0.0.1, and headless Chromium shows the captured page with its captured image, while
the site that was crawled is gone (offline: every byte comes from the capture)."""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from evidence import CrawlConfig, Crawler, CrawlOptions, Store
from evidence._crawl.browser import Browser

from .conftest import png_pixels
from .jssite import BANNER, JsSite

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory, chromium: str) -> Path:
    path = tmp_path_factory.mktemp("replay") / "s"
    with JsSite() as site, Store.create(path) as store:
        crawler = Crawler(store, CrawlConfig(seeds=[site.url], render=True),
                          CrawlOptions(workers=2))
        assert anyio.run(crawler.run).session_completed
    return path  # the site has stopped: nothing below can reach it


def serve(source: Path) -> tuple[subprocess.Popen, dict]:
    proc = subprocess.Popen([sys.executable, "-m", "evidence", "replay", str(source),
                             "--serve", "--port", "0", "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=ROOT)
    assert proc.stdout is not None
    first = proc.stdout.readline()
    try:
        return proc, json.loads(first)
    except ValueError:
        proc.kill()  # never leave a server behind
        raise AssertionError(first.decode() + proc.communicate()[1].decode()[-3000:]) from None


def stop(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    return proc.returncode


async def look(url: str) -> tuple[bytes, dict]:
    """Open ``url``, wait until the replayed page's image has loaded, screenshot it, and
    read the replayed document (pywb frames it: the page is in the iframe)."""
    inner = "document.querySelector('iframe') && document.querySelector('iframe').contentDocument"
    probe = (f"(() => {{ const d = {inner}; if (!d || !d.querySelector('#logo')) return null;"
             " const img = d.querySelector('#logo');"
             " return {complete: img.complete, width: img.naturalWidth,"
             " consent: (d.querySelector('#consent') || {}).textContent || null,"
             " data: (d.querySelector('#data') || {}).textContent || null,"
             " html: d.documentElement.outerHTML}; })()")
    async with Browser() as browser, browser.page() as page:
        await page.send("Page.enable")
        await page.send("Emulation.setDeviceMetricsOverride", {
            "width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False})
        await page.send("Page.navigate", {"url": url})
        deadline = time.monotonic() + 60
        state = None
        while time.monotonic() < deadline:
            state = await page.evaluate(probe)
            if state and state["complete"] and state["consent"] and state["data"]:
                break
            await anyio.sleep(0.2)
        await anyio.sleep(0.5)  # let the frame paint
        shot = await page.send("Page.captureScreenshot", {"format": "png"})
    return base64.b64decode(shot["data"]), state or {}


def red_pixels(png: bytes) -> int:
    width, _height, rows, channels = png_pixels(png)
    count = 0
    for row in rows:
        for x in range(0, width * channels, channels):
            if row[x] > 200 and row[x + 1] < 60 and row[x + 2] < 60:
                count += 1
    return count


@pytest.mark.slow
def test_a_replayed_page_shows_its_captured_image_offline(captured: Path) -> None:
    proc, info = serve(captured)
    try:
        assert info["url"].startswith("http://127.0.0.1:")
        pages = {p["url"].rsplit("/", 1)[1]: p for p in info["pages"]}
        assert pages["page"]["title"] == "Scripted page"
        png, state = anyio.run(look, pages["page"]["replay_url"])
    finally:
        status = stop(proc)
    assert status == 0
    assert state.get("width") == 24, "the captured 24x24 image was replayed and decoded"
    assert state["consent"] == BANNER  # the page's script ran again on replayed bytes
    assert state["data"] == "loaded by fetch"  # its fetch() was answered from the capture
    assert "hidden by script" in state["html"]
    # The image is drawn 240x240 in red: the screenshot shows it (pywb's banner above).
    assert red_pixels(png) >= 0.9 * 240 * 240


@pytest.mark.slow
def test_a_wacz_file_is_served_too_and_bad_sources_are_refused(captured: Path,
                                                               tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "evidence", "export", str(captured),
                           "--format", "wacz", "--out", str(tmp_path / "x.wacz")],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    proc, info = serve(tmp_path / "x.wacz")
    try:
        import httpx

        replay = next(p["replay_url"] for p in info["pages"] if p["url"].endswith("/hidden"))
        answer = httpx.get(replay.replace("/http", "mp_/http", 1), timeout=30)
    finally:
        assert stop(proc) == 0
    assert answer.status_code == 200 and "only a browser finds me" in answer.text
    (tmp_path / "not.wacz").write_bytes(b"plain text")
    done = subprocess.run([sys.executable, "-m", "evidence", "replay",
                           str(tmp_path / "not.wacz"), "--serve", "--port", "0"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 2 and "neither a store directory nor a WACZ" in done.stderr
    done = subprocess.run([sys.executable, "-m", "evidence", "replay", str(captured)],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 2 and "replay needs a URL" in done.stderr
