"""A directory is fsynced one way (``evidence/_store/fsync.py``), everywhere.

The helper does what it says on real files, and the package holds no other spelling of
it: no function outside ``_store/fsync.py`` opens a path with ``os.open`` and fsyncs it
(before issue 14 there were four: the artifact store's, export's ``fsync_path``, WARC's
``_fsync_dir`` and wacz borrowing WARC's private one).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from evidence._store.fsync import fsync_dir, fsync_file

from .sources import nodes, package_modules

PACKAGE = Path(__file__).resolve().parent.parent / "evidence"
HELPER = PACKAGE / "_store" / "fsync.py"


def test_fsync_dir_takes_a_directory_and_fsync_file_a_file(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x")
    fsync_dir(tmp_path)
    fsync_file(tmp_path / "f")
    with pytest.raises(NotADirectoryError):
        fsync_dir(tmp_path / "f")
    with pytest.raises(IsADirectoryError):
        fsync_file(tmp_path)
    with pytest.raises(FileNotFoundError):
        fsync_dir(tmp_path / "absent")


def _calls(node: ast.AST, module: str, name: str) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
               and n.func.attr == name and isinstance(n.func.value, ast.Name)
               and n.func.value.id == module for n in ast.walk(node))


def hand_rolled_fsyncs(paths: list[Path]) -> list[str]:
    """Functions that ``os.open`` a path and ``os.fsync`` it: a second spelling."""
    found = []
    for path in paths:
        for node in nodes(path):
            if (isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                    and _calls(node, "os", "open") and _calls(node, "os", "fsync")):
                where = path.relative_to(PACKAGE.parent) if path.is_relative_to(
                    PACKAGE.parent) else path
                found.append(f"{where}:{node.lineno} {node.name}")
    return found


def test_no_module_spells_its_own_fsync_by_path() -> None:
    modules = [p for p in package_modules() if p != HELPER]
    assert hand_rolled_fsyncs(modules) == [], "use evidence._store.fsync"


def test_the_check_finds_a_hand_rolled_directory_fsync(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("import os\n\n\ndef sync(path):\n    fd = os.open(path, os.O_RDONLY)\n"
                     "    os.fsync(fd)\n    os.close(fd)\n")
    assert hand_rolled_fsyncs([probe]) == [f"{probe}:4 sync"]
