"""tools/soak_suite.py: the suite run N times beside CPU hogs, each run's outcome reported.

The tool is run for real on a two-test suite of the test's own (one passes, one fails
every time), so what it reports is checked against what is known to happen.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "soak_suite.py"


def _soak(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True,
                          timeout=240, cwd=ROOT)


@pytest.mark.slow
def test_each_run_is_reported_with_its_failures_and_the_hogs_ran(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "pytest.ini").write_text("[pytest]\n")  # this suite's own rootdir and options
    (suite / "test_two.py").write_text(
        "def test_passes():\n    assert sum([1, 1]) == 2\n\n\n"
        "def test_fails():\n    assert 1 == 2\n")
    done = _soak("--runs", "2", "--hogs", "1", "--out", str(tmp_path / "out"), "--json",
                 "--", str(suite))
    assert done.returncode == 1, done.stderr  # a run failed
    report = json.loads(done.stdout)
    assert [(r["run"], r["passed"], r["failed"], r["errors"], r["skipped"])
            for r in report["runs"]] == [(1, 1, 1, 0, 0), (2, 1, 1, 0, 0)]
    assert all(r["exit_status"] == 1 and r["seconds"] > 0 and r["cpu_seconds"] > 0
               for r in report["runs"])
    assert [r["failures"] for r in report["runs"]] == [["test_two::test_fails"]] * 2
    assert (report["passed_runs"], report["failed_runs"], report["hogs"]) == (0, 2, 1)
    assert len(report["hog_cpu_seconds"]) == 1 and report["hog_cpu_seconds"][0] > 0
    assert "test_fails" in Path(report["runs"][0]["output"]).read_text()

    (suite / "test_two.py").write_text("def test_passes():\n    assert sum([1, 1]) == 2\n")
    text = _soak("--runs", "1", "--hogs", "0", "--out", str(tmp_path / "out"), "--",
                 str(suite))
    assert text.returncode == 0, text.stdout + text.stderr
    assert text.stdout.startswith("run 1: passed in ")
    assert "1 of 1 runs passed" in text.stdout


def test_a_bad_count_is_a_usage_error_and_runs_nothing(tmp_path: Path) -> None:
    for args in (["--runs", "0"], ["--hogs", "-1"]):
        done = _soak(*args, "--out", str(tmp_path / "out"))
        assert done.returncode == 2 and "must" in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()
    assert _soak("--help").stdout.startswith("usage: python tools/soak_suite.py")
