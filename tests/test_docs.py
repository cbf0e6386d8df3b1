"""Docs say what the code does now: the command reference is generated and checked."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_command_reference_is_current() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_cli_docs.py"),
                           "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_every_command_is_documented_in_the_guides() -> None:
    from evidence._cli.main import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    guides = "\n".join(p.read_text() for p in (ROOT / "docs").glob("*.md")
                       if p.name != "cli.md") + (ROOT / "README.md").read_text()
    missing = [name for name in sub.choices if f"evidence {name}" not in guides]
    assert not missing, f"commands with no guide: {missing}"


def test_readme_gives_the_two_setup_commands_and_ci_runs_the_tests_one() -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = readme.split("```sh\n")
    demo = next(b.split("\n")[0] for b in blocks if "evidence demo" in b.split("\n")[0])
    tests = next(b.split("\n")[0] for b in blocks if "python -m pytest" in b.split("\n")[0])
    assert demo.startswith("python3 -m venv .venv && ")
    # .ci/run runs each command of README's test line (an install may add --quiet).
    ci = [line.replace(" --quiet", "") for line in
          (ROOT / ".ci" / "run").read_text().splitlines() if not line.startswith("#")]
    for command in tests.split(" && "):
        assert any(line.startswith(command) for line in ci), command
    assert "-e '.[test]'" in tests
