"""The type checker is part of the test command: ``python -m mypy`` finds no error.

pyproject.toml [tool.mypy] checks ``evidence/`` with mypy's defaults, and strictly (every
flag of ``--strict`` that may be set per module) the model and the write path, where a
wrong type is a wrong message or a wrong commit, and ``evidence/client.py``, the public
module producers import. apsw is typed as Any (typings/apsw).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def mypy(cwd: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(cache)], cwd=cwd,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="session")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One mypy cache for both tests, also across pytest -n's processes (the directory
    above each one's basetemp): the second check reuses what the first one read (the
    standard library, the unchanged modules), 3 s of CPU instead of 11 (measured)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return tmp_path_factory.getbasetemp().parent / "mypy-cache"
    return tmp_path_factory.mktemp("mypy-cache")


@pytest.mark.slow
def test_the_package_type_checks(cache: Path) -> None:
    done = mypy(ROOT, cache)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("Success: no issues found")


def test_the_model_and_the_write_path_are_checked_strictly_the_rest_by_default(
        tmp_path: Path, cache: Path) -> None:
    """An unannotated function is an error in _model and _write, allowed in _crawl: the
    configuration checks what it says it checks (a probe in a copy of the package)."""
    shutil.copytree(ROOT / "evidence", tmp_path / "evidence",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "typings", tmp_path / "typings")
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    for stage in ("_model", "_write", "_crawl"):
        (tmp_path / "evidence" / stage / "probe.py").write_text(
            "def untyped(x):\n    return x\n")
    with (tmp_path / "evidence" / "client.py").open("a") as client:
        client.write("\n\ndef _untyped_probe(x):\n    return x\n")
    done = mypy(tmp_path, cache)
    assert done.returncode == 1, done.stdout + done.stderr
    flagged = {line.split(":")[0] for line in done.stdout.splitlines() if ": error:" in line}
    assert flagged == {"evidence/_model/probe.py", "evidence/_write/probe.py",
                       "evidence/client.py"}, done.stdout
