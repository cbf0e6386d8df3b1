"""What each test costs in CPU time, not only in wall time: a pytest plugin.

    python -m pytest -p evidence.testing.costs --costs 40 tests/        # the 40 costliest
    python -m pytest -p evidence.testing.costs --costs 0 --costs-file costs.jsonl -n 4

pytest's ``--durations`` reports wall time, which on a shared or loaded machine says as
much about the other processes as about the test. This plugin records, for each test's
whole protocol (setup, call, teardown), the CPU time (user + system) of the process that
ran it and of the child processes it waited for (``RUSAGE_CHILDREN``: a ``python -m
evidence`` subprocess, a mypy run), beside its wall time. Servers a session fixture starts
and never reaps in the test (PostgreSQL, SeaweedFS) are not counted: their cost is shared.

Under pytest-xdist every worker appends one JSON line per test to ``--costs-file`` (a
temporary file by default) and the controller prints the table at the end: the costliest
tests by CPU, then the run's totals and each test process's busy time and the end of its last
test (a process idle long before the others ends a run that one long test finished alone). One
line per test: ``{"test", "cpu", "wall", "start", "process"}`` (``start`` in seconds since the
epoch; ``process`` xdist's worker name, or ``main``), so a later run's file can be compared with
an earlier one's.
"""

from __future__ import annotations

import json
import os
import resource
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

_FILE = "_evidence_costs_file"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("costs", "CPU time per test (evidence.testing.costs)")
    group.addoption("--costs", type=int, default=None, metavar="N",
                    help="print the N tests that used the most CPU time (0: all)")
    group.addoption("--costs-file", default=None, metavar="PATH",
                    help="append one JSON line per test here (default: a temporary file)")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("costs") is None and config.getoption("costs_file") is None:
        return
    path = config.getoption("costs_file")
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        path = workerinput[_FILE]  # the controller's choice, for every worker
    elif path is None:
        handle, path = tempfile.mkstemp(prefix="evidence-costs-", suffix=".jsonl")
        os.close(handle)
    else:
        Path(path).write_text("")  # this run's lines only
    config.stash[_path_key] = Path(path)


_path_key = pytest.StashKey[Path]()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:  # pytest-xdist's hook, on the controller
    node.workerinput[_FILE] = str(node.config.stash[_path_key])


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None
                            ) -> Iterator[None]:
    path = item.config.stash.get(_path_key, None)
    if path is None:
        return (yield)
    cpu, wall, start = _cpu(), time.monotonic(), time.time()
    try:
        return (yield)
    finally:
        line = json.dumps({"test": item.nodeid, "cpu": round(_cpu() - cpu, 3),
                           "wall": round(time.monotonic() - wall, 3),
                           "start": round(start, 3),
                           "process": _process(item.config)})
        with open(path, "a") as f:  # one write of one line: workers' lines never mix
            f.write(line + "\n")


def _process(config: pytest.Config) -> str:
    """xdist's name for this test process, or ``main`` (from the run's configuration, not
    the environment, which a pytest started by a test inherits from its own process)."""
    return getattr(config, "workerinput", {}).get("workerid", "main")


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    path = config.stash.get(_path_key, None)
    if path is None or hasattr(config, "workerinput") or not path.exists():
        return
    rows = [json.loads(line) for line in path.read_text().splitlines() if line]
    rows.sort(key=lambda r: r["cpu"], reverse=True)
    shown = config.getoption("costs") or len(rows)
    write = terminalreporter.write_line
    terminalreporter.section(f"CPU time per test ({path})")
    for row in rows[:shown]:
        write(f"{row['cpu']:8.2f}s cpu {row['wall']:8.2f}s wall  {row['test']}")
    write(f"{sum(r['cpu'] for r in rows):8.1f}s cpu {sum(r['wall'] for r in rows):8.1f}s wall"
          f"  in all, {len(rows)} tests")
    for line in busy_lines(rows):
        write(line)


def busy_lines(rows: list[dict]) -> list[str]:
    """Per test process: how long it ran tests, from the run's first test to the end of
    its own last one. A process that ends long before the others shows a run whose last
    minutes were one long test (or one share) running alone."""
    if not rows:
        return []
    first = min(r["start"] for r in rows)
    span = max(r["start"] + r["wall"] for r in rows) - first
    lines = []
    for process in sorted({r["process"] for r in rows}):
        own = [r for r in rows if r["process"] == process]
        busy = sum(r["wall"] for r in own)
        ended = max(r["start"] + r["wall"] for r in own) - first
        lines.append(f"{process:>8}: {len(own)} tests, busy {busy:.1f}s, its last test ended "
                     f"at {ended:.1f}s of {span:.1f}s")
    return lines
