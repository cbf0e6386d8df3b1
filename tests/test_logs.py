"""Logs a log system can filter (issue 34): ``--log-format json`` writes one JSON object per
line with a stable event name and the ids of the run, session, URL and attempt it happened
inside; ``--log-level`` chooses what is written; every log call names a documented event.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from evidence._demo.site import SiteConfig, TestSite
from evidence._model.logs import CONTEXT_KEYS, EVENTS, add_log_context, log_context

from .conftest import evidence_in_process
from .sources import nodes, package_modules

ROOT = Path(__file__).resolve().parent.parent
EVIDENCE = [sys.executable, "-m", "evidence"]
ORDER = ["time", "level", "logger", "event", "message", "pid", *CONTEXT_KEYS, "data", "error"]
KEYS = set(ORDER)


def test_a_json_crawl_writes_only_json_lines_each_with_its_event_and_the_run_id(
        tmp_path: Path) -> None:
    # A flaky page: a warning (fetch.failed) besides the info and debug lines.
    with TestSite(SiteConfig(pages=4, flaky={"/p/1": 1})) as site:
        done = subprocess.run([*EVIDENCE, "--log-format", "json", "crawl", site.url,
                               "--store", str(tmp_path / "s"), "--json",
                               "--log-level", "debug"],  # before and after the command
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    run_id = json.loads(done.stdout)["run_id"]
    lines = [json.loads(line) for line in done.stderr.splitlines()]  # each one JSON
    assert lines
    for line in lines:
        assert set(line) <= KEYS, line
        assert list(line) == sorted(line, key=ORDER.index), line  # always in one order
        assert {"time", "level", "logger", "event", "message", "pid"} <= set(line), line
        assert line["event"] in EVENTS and line["event"] != "log", line
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", line["time"])
        assert line["run_id"] == run_id, line  # every line here is logged inside the run
    events = [line["event"] for line in lines]
    assert events[0] == "run.started" and events[-1] == "run.ended"
    session_id = lines[0]["session_id"]
    fetches = [line for line in lines if line["event"] == "fetch.done"]
    assert {line["level"] for line in fetches} == {"debug"}
    assert all(line["session_id"] == session_id and line["attempt_id"].startswith("a-")
               and line["url"].startswith(site.url) for line in fetches), fetches
    failed = [line for line in lines if line["event"] == "fetch.failed"]
    assert [(line["level"], line["url"]) for line in failed] == [("warning", f"{site.url}p/1")]
    progress = [line for line in lines if line["event"] == "crawl.progress"]
    assert progress and {"done", "queued", "in_flight"} <= set(progress[0]["data"])


def test_worker_processes_log_as_their_crawl_does(tmp_path: Path) -> None:
    """A worker process (--processes) writes JSON lines too, at the crawl's level, with the
    run's and session's ids: its pid is its own."""
    with TestSite(SiteConfig(pages=2)) as site:
        done = subprocess.run([*EVIDENCE, "crawl", site.url, "--store", str(tmp_path / "s"),
                               "--processes", "1", "--json", "--log-format", "json",
                               "--log-level", "debug"],
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    lines = [json.loads(line) for line in done.stderr.splitlines()]
    crawl_pid = next(line["pid"] for line in lines if line["event"] == "run.started")
    children = [line for line in lines if line["pid"] != crawl_pid]
    assert {line["event"] for line in children} == {"fetch.done"}, children
    assert all(line["run_id"] == result["run_id"] and line["session_id"] ==
               result["session_id"] for line in lines if line["event"] == "fetch.done")
    assert all(line["run_id"] == result["run_id"] for line in lines)


def test_log_level_warning_hides_info_lines_and_keeps_warnings(tmp_path: Path) -> None:
    with TestSite(SiteConfig(pages=3, flaky={"/p/1": 1})) as site:
        quiet = subprocess.run([*EVIDENCE, "crawl", site.url, "--store", str(tmp_path / "q"),
                                "--log-level", "warning"],
                               capture_output=True, text=True, timeout=120)
        told = subprocess.run([*EVIDENCE, "crawl", site.url, "--store", str(tmp_path / "t")],
                              capture_output=True, text=True, timeout=120)
    assert quiet.returncode == told.returncode == 0, quiet.stderr + told.stderr
    # The text form by default: time, level, message.
    assert re.search(r"^\S+ \S+ INFO run run-\w+ ended: completed", told.stderr, re.M), \
        told.stderr
    assert " INFO " not in quiet.stderr, quiet.stderr
    assert re.search(r"^\S+ \S+ WARNING http://\S+/p/1: HTTP 500: retry 2 of 3",
                     quiet.stderr, re.M), quiet.stderr


@pytest.mark.parametrize("argv", [
    ["--log-format", "xml", "status", "{store}"],
    ["status", "{store}", "--log-level", "loud"],
    ["crawl", "http://127.0.0.1:9/", "--store", "{store}", "--log-format", "JSON"],
])
def test_a_bad_log_option_is_a_usage_error_that_creates_nothing(
        tmp_path: Path, argv: list[str]) -> None:
    store = tmp_path / "s"
    done = evidence_in_process(*(a.format(store=store) for a in argv))
    assert done.returncode == 2
    assert done.stderr.startswith("Error: argument --log-"), done.stderr
    assert "invalid choice" in done.stderr and "\nTry: evidence" in done.stderr
    assert "Traceback" not in done.stderr
    assert not store.exists()


def test_a_task_started_inside_a_log_context_carries_it_and_it_ends_with_the_block() -> None:
    seen: dict[str, dict[str, str]] = {}

    def context() -> dict[str, str]:
        from evidence._model import logs

        return dict(logs._CONTEXT.get())

    async def task(name: str) -> None:
        with log_context(url=f"http://127.0.0.1/{name}"):
            await anyio.sleep(0)
            seen[name] = context()

    async def main() -> None:
        with log_context(run_id="run-1"):
            add_log_context(session_id="session-1")
            async with anyio.create_task_group() as tg:
                tg.start_soon(task, "a")
                tg.start_soon(task, "b")
            seen["run"] = context()
        seen["after"] = context()

    anyio.run(main)
    assert seen["a"] == {"run_id": "run-1", "session_id": "session-1",
                         "url": "http://127.0.0.1/a"}
    assert seen["b"]["url"] == "http://127.0.0.1/b"  # each task its own
    assert seen["run"] == {"run_id": "run-1", "session_id": "session-1"}
    assert seen["after"] == {}
    with pytest.raises(ValueError, match="not a log context key: user"):
        log_context(user="x").__enter__()


# --- every log call names a documented event ------------------------------------------

LEVELS = {"debug", "info", "warning", "error", "exception", "critical"}


def log_calls(path: Path) -> list[tuple[int, str | None]]:
    """(line, event name or None) of every ``log.<level>(...)`` call in the file."""
    calls = []
    for node in nodes(path):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "log"
                and node.func.attr in LEVELS):
            continue
        event = None
        for keyword in node.keywords:
            if keyword.arg == "extra" and isinstance(keyword.value, ast.Dict):
                for key, value in zip(keyword.value.keys, keyword.value.values, strict=True):
                    if (isinstance(key, ast.Constant) and key.value == "event"
                            and isinstance(value, ast.Constant)):
                        event = value.value
        calls.append((node.lineno, event))
    return calls


def event_problems(paths: list[Path]) -> list[str]:
    return [f"{path.relative_to(ROOT)}:{line}: " + (
                "a log call without extra={'event': ...}" if event is None
                else f"event {event!r} is not in evidence._model.logs.EVENTS")
            for path in paths for line, event in log_calls(path)
            if event is None or event not in EVENTS]


def test_every_log_call_in_the_package_names_an_event_from_the_list() -> None:
    paths = package_modules()  # not another test's probe
    assert sum(len(log_calls(p)) for p in paths) > 50
    assert event_problems(paths) == []


def test_the_event_check_catches_a_call_without_an_event_and_an_unlisted_one(
        tmp_path: Path) -> None:
    probe = ROOT / "evidence" / "_probe_logs.py"
    probe.write_text('log.info("a")\nlog.warning("b", extra={"event": "nope.nope"})\n'
                     'log.error("c", extra={"event": "run.ended"})\n')
    try:
        problems = event_problems([probe])
    finally:
        probe.unlink()
    assert [p.split(": ", 1)[1] for p in problems] == [
        "a log call without extra={'event': ...}",
        "event 'nope.nope' is not in evidence._model.logs.EVENTS"]


def test_docs_operations_lists_every_event_and_every_key() -> None:
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text.split("### Event names", 1)[1].split("\n### ", 1)[0]
    documented = re.findall(r"^\| `([a-z0-9_]+\.[a-z_]+|log)` \|", section, re.M)
    assert documented == list(EVENTS)
    keys = text.split("### JSON keys", 1)[1].split("\n### ", 1)[0]
    assert set(re.findall(r"^\| `([a-z_]+)` \|", keys, re.M)) == KEYS
