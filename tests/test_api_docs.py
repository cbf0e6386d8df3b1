"""docs/api.md's examples run as written, in order, in a fresh directory, and print what the
page says they print."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

API = Path(__file__).resolve().parent.parent / "docs" / "api.md"


def blocks(text: str) -> list[tuple[str, str]]:
    """(code, what the page says it prints) per python block: the first `...` after
    'prints' in the paragraph that follows the block."""
    found = []
    for m in re.finditer(r"```python\n(.*?)```\n\n(.*?)(?:\n\n|\Z)", text, re.S):
        said = re.findall(r"prints `([^`]*)`(?:, then `([^`]*)`)?", m.group(2))
        assert said, f"the paragraph after a block says what it prints: {m.group(2)[:60]}"
        found.append((m.group(1), "\n".join(x for x in said[0] if x)))
    return found


def test_every_example_on_the_api_page_runs_and_prints_what_the_page_says(
        tmp_path: Path) -> None:
    examples = blocks(API.read_text())
    assert len(examples) >= 4
    marks = [f"--- example {i} ---" for i in range(len(examples))]
    script = "\n".join(f"print({mark!r})\n{code}" for mark, (code, _) in zip(
        marks, examples, strict=True))
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    printed = re.split(r"--- example \d+ ---\n", done.stdout)[1:]
    for (_, said), got in zip(examples, printed, strict=True):
        assert got.strip() == said, (got, said)
