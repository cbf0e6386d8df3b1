"""The suite's CPU-cost plugin (``evidence.testing.costs``) counts what each test used and
says when each test process was busy: run on a small suite of its own in a new pytest."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SUITE = '''
import time

def test_burns_cpu():
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass

def test_waits():
    time.sleep(0.3)
'''


def test_each_test_s_cpu_wall_start_and_process_are_recorded(tmp_path: Path) -> None:
    (tmp_path / "test_small.py").write_text(SUITE)
    costs = tmp_path / "costs.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "evidence.testing.costs", "--costs", "0",
         f"--costs-file={costs}", "-p", "no:cacheprovider", "-n", "0", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = costs.read_text().splitlines()
    rows = {r["test"].rsplit("::", 1)[1]: r for r in map(json.loads, lines)}
    assert set(rows) == {"test_burns_cpu", "test_waits"}
    burns, waits = rows["test_burns_cpu"], rows["test_waits"]
    assert burns["cpu"] >= 0.3 and waits["cpu"] < 0.2 <= waits["wall"], rows
    assert burns["start"] + burns["wall"] <= waits["start"] + 0.01, rows  # one after the other
    assert {burns["process"], waits["process"]} == {"main"}
    assert "main: 2 tests, busy" in done.stdout, done.stdout
