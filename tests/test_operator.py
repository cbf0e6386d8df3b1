"""Telling the operator the truth about a crawl (issue 13), through the real command.

Errors and back-offs show as they happen; a crawl that fetched no seed fails; a run whose
process is gone shows as interrupted; leftovers of killed archive builds are named and
removed; the defaults agree, and the progress line says why fewer fetches are in flight;
every default is in --help; the progress line on a terminal ends with a newline.
"""

from __future__ import annotations

import argparse
import json
import os
import pty
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import anyio
import pytest

from evidence import CrawlConfig, Crawler, CrawlOptions, Store, __version__
from evidence._cli.main import build_parser
from evidence._demo.site import SiteConfig, TestSite

from .conftest import evidence_in_process
from .test_crawl import frontier_states

EVIDENCE = [sys.executable, "-m", "evidence"]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once it is closed


def test_a_crawl_that_fetches_no_seed_fails_and_says_why_as_it_happens(
        tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{_closed_port()}/"
    done = subprocess.run([*EVIDENCE, "crawl", url, "--store", str(tmp_path / "s"),
                           "--ignore-robots", "--max-attempts", "2"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    warnings = [line for line in done.stderr.splitlines() if " WARNING " in line]
    assert len(warnings) == 2, done.stderr
    assert f"{url}: network error (ConnectError" in warnings[0]
    assert warnings[0].endswith("retry 2 of 2 in 1 s")
    assert warnings[1].endswith("on attempt 2 of 2: attempts exhausted; failed")
    assert f"failed: no seed could be fetched ({url}: failed: network error" in done.stdout
    assert "session" in done.stdout and "0 done" in done.stdout


def test_a_host_backoff_shows_in_the_log_and_the_progress(tmp_path: Path) -> None:
    port = _closed_port()
    store = tmp_path / "s"
    proc = subprocess.Popen([*EVIDENCE, "crawl", f"http://127.0.0.1:{port}/", "--store",
                             str(store)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 60
        live: dict = {}
        while not live.get("limited_by"):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
            try:
                live = json.loads((store / "live-stats.json").read_text())
            except (FileNotFoundError, json.JSONDecodeError):
                continue
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
    assert live["errors"] == 1 and "robots.txt unavailable" in live["last_error"]
    assert re.fullmatch(r"127\.0\.0\.1 backs off for [1-6] s", live["limited_by"][0])
    assert f"http://127.0.0.1:{port}/: robots.txt unavailable (ConnectError" in err
    assert "host 127.0.0.1 backs off 2 s" in err


def test_an_unreachable_seed_fails_after_seconds_of_backoff_not_minutes(
        tmp_path: Path) -> None:
    # Issue 34: robots.txt was retried three times a minute apart (2 minutes to fail).
    url = f"http://127.0.0.1:{_closed_port()}/"
    done = subprocess.run([*EVIDENCE, "crawl", url, "--store", str(tmp_path / "s")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    warnings = [line for line in done.stderr.splitlines() if " WARNING " in line]
    waits = [float(w) for w in re.findall(r"retry \d of 3 in (\d+) s", done.stderr)]
    assert waits == [2, 6] and sum(waits) < 15
    assert len(warnings) == 3 and "attempts exhausted; failed" in warnings[2]
    assert "failed: no seed could be fetched" in done.stdout


def test_robots_backoff_grows_to_a_minute_and_no_further() -> None:
    from evidence._crawl.crawler import robots_backoff

    assert [robots_backoff(n) for n in range(1, 7)] == [2, 6, 18, 54, 60, 60]


def test_status_shows_a_run_whose_process_is_gone_as_interrupted(tmp_path: Path) -> None:
    store = tmp_path / "s"
    with TestSite(SiteConfig(pages=20, slow={f"/p/{i}": 0.5 for i in range(20)})) as site:
        proc = subprocess.Popen([*EVIDENCE, "crawl", site.url, "--store", str(store)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        site.wait_for_request("/p/0", timeout=60)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    shown = subprocess.run([*EVIDENCE, "status", str(store)], capture_output=True, text=True,
                           timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert f"interrupted (process {proc.pid} is gone)" in shown.stdout
    data = json.loads(subprocess.run([*EVIDENCE, "status", str(store), "--json"],
                                     capture_output=True, text=True, timeout=60).stdout)
    [run] = data["runs"]
    assert run["outcome"] is None and run["pid"] == proc.pid
    assert run["state"] == f"interrupted (process {proc.pid} is gone)"


_BUILD_AND_DIE = textwrap.dedent("""
    import os, sys
    from evidence._archive.snapshot import building
    with building(sys.argv[1], sys.argv[2]) as tmp:
        (tmp / "part").write_bytes(b"x" * 100_000)
        if sys.argv[3] == "die":
            os.kill(os.getpid(), 9)
        print("building", flush=True)
        sys.stdin.read()  # held until the test closes stdin
""")


def test_leftovers_of_a_killed_build_are_named_by_verify_and_removed_by_the_next(
        tmp_path: Path) -> None:
    from evidence._archive.snapshot import stale_builds

    Store.create(tmp_path / "store").close()
    killed = subprocess.run([sys.executable, "-c", _BUILD_AND_DIE, str(tmp_path / "new"),
                             "restoring", "die"], capture_output=True, text=True)
    assert killed.returncode == -9
    [leftover] = stale_builds(tmp_path / "new")
    assert leftover.name.startswith(".new.restoring-") and (leftover / "part").exists()
    # A build still running is not a leftover, and nothing removes it.
    live = subprocess.Popen([sys.executable, "-c", _BUILD_AND_DIE, str(tmp_path / "archive"),
                             "exporting", "live"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert live.stdout is not None and live.stdout.readline() == "building\n"
    try:
        (tmp_path / "store").rename(tmp_path / "new-store")
        shown = evidence_in_process("verify", tmp_path / "new-store")
        (tmp_path / "new-store").rename(tmp_path / "new")  # verify sees siblings of STORE
        shown = evidence_in_process("verify", tmp_path / "new")
        assert f"note     {leftover}: a partial restore or backup left by a killed process" \
            in shown.stdout, shown.stdout
        assert stale_builds(tmp_path / "archive") == []
        exported = evidence_in_process("export", tmp_path / "new", "--out",
                                       tmp_path / "other")
        assert exported.returncode == 0, exported.stderr
        assert len(list(tmp_path.glob(".archive.exporting-*"))) == 1, "the live one stays"
    finally:
        live.communicate("", timeout=30)
    # The next restore to the same place removes the leftover, and says so.
    (tmp_path / "new").rename(tmp_path / "kept")
    restored = evidence_in_process("restore", tmp_path / "other", "--store", tmp_path / "new")
    assert restored.returncode == 0, restored.stderr
    assert f"removing {leftover}: a partial build left by a killed" in restored.stderr
    assert not leftover.exists() and stale_builds(tmp_path / "new") == []


def test_workers_fill_one_host_by_default_and_progress_says_what_limits_them(
        tmp_path: Path) -> None:
    slow = {f"/p/{i}": 0.4 for i in range(24)}
    seen: dict[int, list] = {}
    with TestSite(SiteConfig(pages=24, links_per_page=8, slow=slow)) as site:
        for per_host in (None, 2):
            samples: list = []
            with Store.create(tmp_path / f"s{per_host}") as store:
                anyio.run(Crawler(store, CrawlConfig(seeds=[site.url]), CrawlOptions(
                    workers=6, per_host=per_host, progress=samples.append,
                    progress_interval=0.05)).run)
            seen[per_host or 0] = samples
    assert max(p.in_flight for p in seen[0]) == 6, "--per-host defaults to --workers"
    assert max(p.in_flight for p in seen[2]) == 2
    limited = [p.limited_by for p in seen[2] if p.limited_by]
    assert limited and all(x == ["--per-host 2 on 127.0.0.1"] for x in limited)


# Options whose default is None but which stand for a value all the same.
_IMPLIED = {"per_host", "max_documents", "scope", "max_depth", "max_attempts", "user_agent",
            "max_body_bytes", "rules", "max_failures"}


def test_every_option_shows_its_default_in_help() -> None:
    missing = []

    def walk(parser: argparse.ArgumentParser, name: str) -> None:
        formatter = parser._get_formatter()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    walk(sub, f"{name} {sub_name}")
                continue
            # An option without a default (None: not given) has none to show, unless it
            # stands for a value, which its help must then say (crawl --per-host).
            if (not action.option_strings or action.nargs == 0 or action.required
                    or action.default == argparse.SUPPRESS or (
                        action.default is None and action.dest not in _IMPLIED)):
                continue
            text = formatter._expand_help(action) if action.help else ""
            if "default" not in text:
                missing.append(f"{name} {action.option_strings[0]}")

    walk(build_parser(), "evidence")
    assert not missing, f"options whose --help does not say their default: {missing}"


def test_version() -> None:
    done = subprocess.run([*EVIDENCE, "--version"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == f"evidence {__version__}\n"


@pytest.mark.parametrize(("option", "value", "error"), [
    ("--render-timeout", "0", "must be more than 0 seconds, not 0"),
    ("--render-timeout", "x", "not a number of seconds: 'x'"),
    ("--render-tabs", "0", "must be 1 or more, not 0"),
    ("--render-tabs", "x", "not a whole number: 'x'"),
    ("--workers", "1.5", "not a whole number: '1.5'"),
    ("--grace", "-1", "must be 0 seconds or more, not -1"),
])
def test_a_bad_crawl_option_is_a_usage_error_that_creates_nothing(
        option: str, value: str, error: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "s"
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["crawl", "--store", str(store), f"{option}={value}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"Error: argument {option}: {error}\nTry: evidence crawl --help\n" in err
    assert not store.exists()


def test_the_render_timeout_takes_fractions_of_a_second() -> None:
    args = build_parser().parse_args(["crawl", "--store", "s", "--render-timeout", "2.5"])
    assert args.render_timeout == 2.5


def test_on_a_terminal_the_progress_line_names_the_session_and_seed_and_ends_its_line(
        tmp_path: Path) -> None:
    slow = {f"/p/{i}": 0.3 for i in range(12)}
    with TestSite(SiteConfig(pages=12, slow=slow)) as site:
        main, child = pty.openpty()
        proc = subprocess.Popen([*EVIDENCE, "crawl", site.url, "--store", str(tmp_path / "s"),
                                 "--workers", "2"], stdout=child, stderr=child,
                                stdin=subprocess.DEVNULL)
        os.close(child)
        out = b""
        while True:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
        os.close(main)
        assert proc.wait(timeout=60) == 0
    text = out.decode()
    session = re.search(r"session (session-[0-9a-f]+) completed", text)
    assert session, text
    assert f"crawling {site.url} in session {session[1]} (run run-" in text
    draws = re.findall(r"\r\x1b\[K([^\r\n]*)", text)
    progress = [d for d in draws if d.startswith("done ")]
    assert progress and all("in flight" in d and "errors 0" in d for d in progress), draws
    # The summary starts a line of its own, never the end of the progress line.
    assert re.search(r"\n(\r\x1b\[K)?run run-[0-9a-f]+ completed", text), text
    assert not re.search(r"pages/s(?:;[^\r\n]*)?run run-", text), text


def test_demo_reports_pages_as_it_announced_them_and_exits_like_crawl(
        tmp_path: Path) -> None:
    done = subprocess.run([*EVIDENCE, "demo", str(tmp_path / "d"), "--pages", "12"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "a home page and 12 pages, with 2 redirects, 2 pages robots.txt keeps private " \
        "and 2 broken links" in done.stderr
    assert "the home page and 12 of the 12 pages; followed 2 redirects, recorded 2 broken " \
        "links, skipped 2 URLs (robots.txt or scope), 0 failed." in done.stdout
    states = frontier_states(tmp_path / "d")
    assert sum(1 for p, (s, _r) in states.items() if p.startswith("/p/") and s == "done") == 12
    # Interrupted, the demo exits as the crawl does: 0, the run stopped, the session open.
    proc = subprocess.Popen([*EVIDENCE, "demo", str(tmp_path / "e"), "--pages", "3000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    while "started (full)" not in proc.stderr.readline():
        assert proc.poll() is None
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, _err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "run stopped: interrupted by Ctrl-C (SIGINT)" in out
    assert "Session session-" in out and " open;" in out


@pytest.mark.parametrize("processes", ["2"])
def test_progress_and_live_stats_with_worker_processes_count_errors(
        tmp_path: Path, processes: str) -> None:
    """A page whose fetch fails in a worker process still counts and logs in the crawl."""
    with TestSite(SiteConfig(pages=6, flaky={"/p/1": 1})) as site:
        done = subprocess.run([*EVIDENCE, "crawl", site.url, "--store", str(tmp_path / "s"),
                               "--processes", processes, "--json"], capture_output=True,
                              text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"{site.url}p/1: HTTP 500: retry 2 of 3 in 1 s" in done.stderr
    live = json.loads((tmp_path / "s" / "live-stats.json").read_text())
    assert live["errors"] == 1
