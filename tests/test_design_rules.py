"""The rules live in the repository: docs/design.md states them, numbered, each with the
tests that hold it, and everything that cites a rule or a document points inside.

Also here: the two rules no other test held on its own (bounded batches, rule 2; no
statement that replaces a row, rule 3).
"""

from __future__ import annotations

import ast
import re
import threading
from pathlib import Path

import anyio
import pytest

from evidence import Store, Writer, WriterLimits
from evidence._write.limits import WriterHooks

from .conftest import Factory, asubmit
from .sources import nodes, package_modules

ROOT = Path(__file__).resolve().parent.parent
DESIGN = ROOT / "docs" / "design.md"

# Where citations live: the package, the tests, the tools, the docs, the schema, README.
_SCANNED = ("evidence", "tests", "tools", "docs", "schema", "README.md", "pyproject.toml")
_SUFFIXES = {".py", ".md", ".sql", ".toml"}
# An applied migration is never edited (every store records its checksum), so its old
# comment stays: the brief's "Tables and their grain" it names is design rule 16 now.
_FROZEN = {"schema/001_initial.sql"}

_RULE = re.compile(r"^(\d+)\. \*\*", re.M)
_HELD_BY = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")
_CITED = re.compile(r"design rules? (\d+)(?:-(\d+))?", re.I)
# The brief this project grew from and its style examples, named by their files (the names
# built here, so that this file does not cite them); a link to any other file outside the
# repository is caught by resolving it (citation_problems).
_BRIEF = "DESIGN" + ".md"
_STYLE = "STYLE" + ".md"
_OUTSIDE = re.compile("|".join(re.escape(name) for name in (_BRIEF, _STYLE)))
_MD_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def rules(text: str) -> dict[int, str]:
    """Rule number -> its text, from the '## The rules' section of a design page."""
    section = text.split("## The rules", 1)[1].split("\n## ", 1)[0]
    marks = list(_RULE.finditer(section))
    return {int(m.group(1)): section[m.start():(marks[i + 1].start() if i + 1 < len(marks)
                                                else len(section))]
            for i, m in enumerate(marks)}


def _defines(path: Path, name: str) -> bool:
    """Whether a test module defines ``name`` (a function, or a name bound to a test case)."""
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            return True
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return True
    return False


def _files(root: Path) -> list[Path]:
    found = []
    for name in _SCANNED:
        top = root / name
        if top.is_file():
            found.append(top)
        elif top.is_dir():
            found += [p for p in top.rglob("*") if p.suffix in _SUFFIXES and p.is_file()
                      and "__pycache__" not in p.parts]
    return sorted(found)


def citation_problems(root: Path, known: set[int]) -> list[str]:
    """Every citation under ``root`` that points outside it or at a rule that is not there."""
    problems = []
    for path in _files(root):
        rel = path.relative_to(root).as_posix()
        if rel in _FROZEN or path.resolve() == Path(__file__).resolve():
            continue
        text = path.read_text(errors="replace")
        for n, line in enumerate(text.splitlines(), 1):
            if _OUTSIDE.search(line):
                problems.append(f"{rel}:{n}: cites a document outside the repository")
            for m in _CITED.finditer(line):
                first, last = int(m.group(1)), int(m.group(2) or m.group(1))
                missing = [r for r in range(first, last + 1) if r not in known]
                if missing:
                    problems.append(f"{rel}:{n}: cites design rule {missing[0]}, "
                                    "which docs/design.md does not state")
            if path.suffix == ".md":
                for m in _MD_LINK.finditer(line):
                    target = m.group(1)
                    if re.match(r"[a-z]+:", target):  # https:, mailto:
                        continue
                    resolved = (path.parent / target).resolve()
                    if not resolved.is_relative_to(root.resolve()):
                        problems.append(f"{rel}:{n}: links outside the repository: {target}")
                    elif not resolved.exists():
                        problems.append(f"{rel}:{n}: links to a missing file: {target}")
    return problems


def test_every_rule_names_tests_that_exist() -> None:
    stated = rules(DESIGN.read_text())
    assert sorted(stated) == list(range(1, len(stated) + 1)), "numbered 1..N, no gaps"
    assert len(stated) >= 13, "the writer's rules at least"
    for number, text in stated.items():
        held = _HELD_BY.findall(text)
        assert held, f"design rule {number} names no test that holds it"
        for file, name in held:
            assert (ROOT / file).is_file(), f"design rule {number}: no {file}"
            assert _defines(ROOT / file, name), f"design rule {number}: {file} has no {name}"


def test_nothing_cites_outside_the_repository_or_a_rule_that_is_not_stated() -> None:
    assert citation_problems(ROOT, set(rules(DESIGN.read_text()))) == []


def test_the_citation_check_catches_an_outside_document_a_missing_rule_and_a_bad_link(
        tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "evidence").mkdir()
    (tmp_path / "docs" / "a.md").write_text(
        f"See {_BRIEF} and [notes](../../elsewhere/notes.md) and [b](b.md) and [c](c.md).\n")
    (tmp_path / "docs" / "b.md").write_text("fine\n")
    (tmp_path / "evidence" / "m.py").write_text(
        f'"""Kept as {_BRIEF} rule 6 says, and design rules 2-4."""\n'
        f"# the write thread ({_STYLE} 8)\n")
    problems = citation_problems(tmp_path, known={1, 2, 3})
    assert problems == [
        "docs/a.md:1: cites a document outside the repository",
        "docs/a.md:1: links outside the repository: ../../elsewhere/notes.md",
        "docs/a.md:1: links to a missing file: c.md",
        "evidence/m.py:1: cites a document outside the repository",
        "evidence/m.py:1: cites design rule 4, which docs/design.md does not state",
        "evidence/m.py:2: cites a document outside the repository",
    ]


# --- design rule 3: no statement replaces a row ------------------------------------------

_REPLACES = re.compile(r"\binsert\s+or\s+replace\b|^\s*replace\s+into\b", re.I | re.M)


def _docstrings(all_nodes: tuple[ast.AST, ...]) -> set[int]:
    ids = set()
    for node in all_nodes:
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef
                      | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def replacing_statements(root: Path) -> list[str]:
    """SQL under ``root`` (string literals of the package, migration files) that replaces."""
    found = []
    for path in package_modules(root):
        skip = _docstrings(nodes(path))
        found += [f"{path.relative_to(root)}:{node.lineno}" for node in nodes(path)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and id(node) not in skip and _REPLACES.search(node.value)]
    for path in sorted((root / "schema").rglob("*.sql")):
        code = re.sub(r"--[^\n]*", "", path.read_text())
        if _REPLACES.search(code):
            found.append(str(path.relative_to(root)))
    return found


def test_no_statement_replaces_a_row(tmp_path: Path) -> None:
    assert replacing_statements(ROOT) == []
    (tmp_path / "evidence").mkdir()
    (tmp_path / "schema").mkdir()
    (tmp_path / "evidence" / "m.py").write_text(
        '"""Never INSERT OR REPLACE."""\nSQL = "insert or replace into t values (1)"\n')
    (tmp_path / "schema" / "001_x.sql").write_text("-- no REPLACE INTO here\n"
                                                   "REPLACE INTO t VALUES (1);\n")
    assert replacing_statements(tmp_path) == ["evidence/m.py:2", "schema/001_x.sql"]


# --- design rule 2: bounded batches --------------------------------------------------------

@pytest.mark.anyio
@pytest.mark.parametrize("bound", ["messages", "bytes"])
async def test_a_batch_never_holds_more_messages_than_its_bound(
        store: Store, make: Factory, bound: str) -> None:
    await asubmit(store, [make.session(), make.run()])
    attempts = [make.attempt(f"http://example.com/{i}") for i in range(40)]
    gate = threading.Event()  # holds the first batch so the rest queue up behind it
    limits = (WriterLimits(max_batch_messages=7) if bound == "messages"
              else WriterLimits(max_batch_bytes=2_000))
    hooks = WriterHooks(before_commit=lambda seq: gate.wait(10))
    async with (Writer(store, limits=limits, hooks=hooks, commit_thread=True) as w,
                anyio.create_task_group() as tg):
        for m in attempts:
            tg.start_soon(w.submit, m)
        await anyio.sleep(0.2)
        gate.set()
    conn = store.connection
    batches = conn.execute("SELECT first_index, tree_size FROM commit_log "
                           "WHERE first_index >= 2 ORDER BY batch_seq").fetchall()
    sizes = [size - first for first, size in batches]
    assert sum(sizes) == 40 and len(sizes) > 2
    if bound == "messages":
        assert max(sizes) <= 7
    else:  # a batch takes no more once its messages reach the bound
        for first, size in batches:
            (before_last,) = conn.execute(
                "SELECT coalesce(sum(length(payload)), 0) FROM ingest_ledger "
                "WHERE log_index >= ? AND log_index < ?", (first, size - 1)).fetchone()
            assert before_last < 2_000, (first, size, before_last)
