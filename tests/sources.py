"""The package's source as syntax trees, for the tests that read the code itself (its
layering, its log calls, its design rules): its modules (``package_modules``), each file
parsed once per content in a test process, and its nodes listed once, in ``ast.walk``'s
order. Half a dozen checks each walk every module; the walk, not the check, was most of
their time."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

__all__ = ["PROBES", "nodes", "package_modules", "parsed"]

ROOT = Path(__file__).resolve().parent.parent

# Files the checks' own tests write into the package for a moment (tests/test_layering.py's
# and tests/test_logs.py's), to show a check can fail: never part of what the checks read,
# since the suite runs in several processes at once (pyproject.toml's mypy configuration
# leaves them out too).
PROBES = ("_layering_probe.py", "_probe_logs.py")


def package_modules(root: Path = ROOT) -> list[Path]:
    """The ``.py`` files of ``root``'s ``evidence`` package, in order, without probes."""
    return sorted(p for p in (root / "evidence").rglob("*.py")
                  if "__pycache__" not in p.parts and p.name not in PROBES)


def parsed(path: Path) -> ast.Module:
    """The file's syntax tree (shared: not to be changed)."""
    return _parse(str(path), path.read_text())


def nodes(path: Path) -> tuple[ast.AST, ...]:
    """Every node of the file's tree, as ``ast.walk(parsed(path))`` gives them."""
    return _walk(str(path), path.read_text())


@functools.cache
def _parse(name: str, text: str) -> ast.Module:
    return ast.parse(text, name)


@functools.cache
def _walk(name: str, text: str) -> tuple[ast.AST, ...]:
    return tuple(ast.walk(_parse(name, text)))
