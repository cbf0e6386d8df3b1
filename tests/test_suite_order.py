"""The suite's own schedule: under ``--dist worksteal`` (pyproject's addopts) every process
starts with its share of the tests marked ``slow`` (tests/conftest.py long_tests_first), so
no long test is left to start last and stretch the run's wall time.

Checked against pytest-xdist's own worksteal scheduler, fed the reordered collection: the
shares it hands out are the ones ``long_tests_first`` cut.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
from xdist.scheduler import WorkStealingScheduling

from .conftest import long_tests_first


@dataclass(eq=False)
class Item:
    """Stands for a ``pytest.Item``: its name and whether it is marked ``slow``."""

    name: str
    slow: bool

    def get_closest_marker(self, name: str) -> object | None:
        return object() if name == "slow" and self.slow else None


@dataclass(eq=False)
class Node:
    """Stands for xdist's controller of one worker process: what it was sent."""

    sent: list[int] = field(default_factory=list)
    shutting_down: bool = False
    gateway: SimpleNamespace = field(default_factory=lambda: SimpleNamespace(id="gw"))

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent += indices


def first_shares(names: list[str], processes: int) -> list[list[int]]:
    """The shares xdist's worksteal scheduler sends each process at the start."""
    scheduler = object.__new__(WorkStealingScheduling)  # no config: only the cut is used
    scheduler.numnodes = processes
    scheduler.node2collection, scheduler.node2pending = {}, {}
    scheduler.pending, scheduler.collection = [], None
    scheduler.steal_requested_from_node = None
    scheduler.log = lambda *args: None
    nodes = [Node() for _ in range(processes)]
    for node in nodes:
        scheduler.add_node(node)  # type: ignore[arg-type]
    for node in nodes:
        scheduler.add_node_collection(node, names)  # type: ignore[arg-type]
    scheduler.schedule()
    return [node.sent for node in nodes]


@pytest.mark.parametrize(("count", "slow_every", "processes"), [
    (1950, 45, 4), (103, 7, 3), (9, 4, 4), (40, 2, 2),
])
def test_each_process_starts_with_its_share_of_the_slow_tests(
        count: int, slow_every: int, processes: int) -> None:
    items = [Item(f"t{i}", i % slow_every == slow_every - 1) for i in range(count)]
    ordered = long_tests_first(items, processes)  # type: ignore[arg-type]
    assert sorted(map(id, ordered)) == sorted(map(id, items)), "the same tests, reordered"
    short = [item for item in items if not item.slow]
    assert [item for item in ordered if not item.slow] == short, "short ones keep their order"
    slow = sum(item.slow for item in items)
    shares = first_shares([item.name for item in ordered], processes)
    assert sorted(i for share in shares for i in share) == list(range(count))
    for share in shares:
        tests = [ordered[i] for i in share]
        mine = sum(item.slow for item in tests)
        assert all(item.slow for item in tests[:mine]), "its slow tests come first"
        assert slow // processes <= mine <= -(-slow // processes), "dealt out evenly"


def test_the_suite_runs_under_worksteal() -> None:
    """long_tests_first only orders for worksteal's cut; pyproject's addopts choose it."""
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())
    assert "--dist worksteal" in pyproject["tool"]["pytest"]["ini_options"]["addopts"]
