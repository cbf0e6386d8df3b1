"""No key material or browser profile outlives a rendering crawl (issue 30 point 6).

The render proxy's host key never touches a file system (``_crawl.rendertls``: its chain
and key reach ``ssl`` through a memfd), and a browser profile left by a killed crawl is
removed when the next browser starts (``_crawl.scratch``: its owner's flock is free).
A real rendering crawl killed with SIGKILL mid-render, and the next one, are in
``tests/test_render.py`` (``test_a_kill_during_rendering_resumes_without_a_duplicate_render``
checks the temporary directory after each).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from evidence._crawl.rendertls import RenderTLS
from evidence._crawl.scratch import ScratchDir, remove_stale

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def tmpdir_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A temporary directory of the test's own, for this process and its children (short:
    Chromium puts a Unix socket in it, and its path must stay under 108 bytes)."""
    directory = Path(tempfile.mkdtemp(prefix="ev-tmp-", dir="/tmp"))
    monkeypatch.setenv("TMPDIR", str(directory))
    monkeypatch.setattr(tempfile, "tempdir", str(directory))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def everything_under(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


def _processes_using(text: str) -> list[int]:
    """Processes whose command line holds ``text`` (a browser left by the killed crawl)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_the_render_proxys_keys_never_reach_a_file(tmpdir_env: Path) -> None:
    tls = RenderTLS()
    for host in ("127.0.0.1", "example.com", "[::1]"):
        tls.context_for(host)
    assert everything_under(tmpdir_env) == []


def test_a_key_directory_left_by_an_older_crawl_is_removed_once_expired(
        tmpdir_env: Path) -> None:
    old, recent = tmpdir_env / "evidence-render-tls-old", tmpdir_env / "evidence-render-tls-new"
    for directory in (old, recent):
        directory.mkdir()
        (directory / "host.key").write_text("-----BEGIN PRIVATE KEY-----\n")
    eight_days_ago = time.time() - 8 * 24 * 3600
    os.utime(old, (eight_days_ago, eight_days_ago))
    RenderTLS()
    assert everything_under(tmpdir_env) == ["evidence-render-tls-new",
                                            "evidence-render-tls-new/host.key"]


def test_a_scratch_directory_is_removed_only_once_its_owner_is_gone(tmpdir_env: Path) -> None:
    mine = ScratchDir("evidence-test-")
    made = subprocess.run(
        [sys.executable, "-c", "from evidence._crawl.scratch import ScratchDir; "
         "print(ScratchDir('evidence-test-').path)"],  # exits without removing it
        capture_output=True, text=True, check=True, cwd=ROOT)
    theirs = Path(made.stdout.strip())
    foreign = tmpdir_env / "evidence-test-foreign"  # no owner lock: not ours to judge
    foreign.mkdir()
    assert theirs.is_dir()
    assert remove_stale("evidence-test-") == [theirs]
    assert mine.path.is_dir() and foreign.is_dir() and not theirs.exists()
    mine.remove()
    assert not mine.path.exists()


def test_a_process_s_renders_share_one_authority_made_again_after_a_day(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every renderer of a process uses one authority (a browser kept between crawls trusts
    its key: ``keep_browsers``); once it is a day old the next renderer gets a new one,
    long before its certificates (a week) expire."""
    from evidence._crawl import rendertls

    first = RenderTLS.shared()
    assert RenderTLS.shared() is first
    day_old = time.monotonic() - rendertls._RENEWED - 1
    monkeypatch.setattr(rendertls, "_shared", (first, day_old))  # put back after the test
    renewed = RenderTLS.shared()
    assert renewed is not first and renewed.spki_hash != first.spki_hash
    assert rendertls._RENEWED < rendertls._EXPIRED
