"""The package's layout is its data flow, and imports only go down it (docs/design.md).

    _version < _errors < _model < _net < _store < _write < client < _crawl < _audit
             < _archive < _demo < _cli < testing < evidence (the public face)

Each module's imports are read with ``ast`` (every ``import`` and ``from ... import``,
inside functions and ``TYPE_CHECKING`` blocks too: a type named from an upper stage is a
dependency on it), resolved to absolute names, and checked against the stage order.
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from pathlib import Path

import pytest

from .sources import PROBES, nodes, package_modules, parsed

PACKAGE = Path(__file__).resolve().parent.parent / "evidence"

# The stages, lowest first. A module may import its own stage and the stages before it.
STAGES = ["evidence._version", "evidence._errors", "evidence._model", "evidence._net",
          "evidence._store", "evidence._write", "evidence.client", "evidence._crawl",
          "evidence._audit", "evidence._archive", "evidence._demo", "evidence._cli",
          "evidence.testing", "evidence"]
# Libraries that do I/O: the model is pure values and never imports them.
IO_LIBRARIES = {"apsw", "anyio", "httpx", "httpcore", "socket", "sqlite3", "subprocess"}


def module_name(path: Path) -> str:
    parts = ["evidence", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def stage_of(module: str) -> int:
    """The index in STAGES of the longest stage that is ``module`` or contains it."""
    best = None
    for index, stage in enumerate(STAGES):
        inside = module == stage or module.startswith(stage + ".")
        if inside and (best is None or len(stage) > len(STAGES[best])):
            best = index
    assert best is not None, module
    return best


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in the file, relative ones resolved."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in nodes(path):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # ``from . import messages`` imports the module evidence._model.messages
            found += [(node.lineno, f"{target}.{alias.name}") for alias in node.names]
            found.append((node.lineno, target))
    return found


def modules() -> list[Path]:
    return package_modules()


def layering_violations(paths: list[Path]) -> list[str]:
    problems = []
    for path in paths:
        here = module_name(path)
        for line, target in imports_of(path):
            if target != "evidence" and not target.startswith("evidence."):
                continue
            if stage_of(target) > stage_of(here):
                problems.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {here} "
                                f"imports {target}, a later stage")
    return problems


def test_lower_stages_never_import_upper_ones() -> None:
    assert layering_violations(modules()) == []


def test_the_layering_check_catches_an_upward_import(tmp_path: Path) -> None:
    """The check itself can fail: a store module that imports the crawler is caught."""
    bad = PACKAGE / "_store" / "_layering_probe.py"
    bad.write_text("from .._crawl.frontier import CrawlConfig\n")
    try:
        problems = layering_violations([bad])
    finally:
        bad.unlink()
    assert problems and "imports evidence._crawl.frontier" in problems[0]


# --- no circles: a module never needs, through any chain of imports, a module that needs it --

def module_edges(paths: list[Path]) -> dict[str, set[str]]:
    """Which of the package's modules each module imports (functions' and ``TYPE_CHECKING``
    imports too). ``from package import name`` is an edge to the module ``package.name``
    when there is one (``from . import warc``), else to ``package``; ``import a.b`` is an
    edge to ``a.b`` only (the parent package runs first, but needs nothing of ``a.b``)."""
    known = {module_name(p) for p in paths}
    edges: dict[str, set[str]] = {}
    for path in paths:
        here = module_name(path)
        package = here if path.name == "__init__.py" else here.rpartition(".")[0]
        needed: set[str] = set()
        for node in nodes(path):
            if isinstance(node, ast.Import):
                needed |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:
                    needed.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in known
                               else target)
        edges[here] = {m for m in needed if m in known and m != here}
    return edges


def import_circles(paths: list[Path]) -> list[list[str]]:
    """Every set of modules that import each other in a ring (Tarjan's strongly connected
    components of more than one module), each sorted, each ring as one list."""
    edges = module_edges(paths)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in sorted(edges[module]):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            ring = []
            while (member := stack.pop()) != module:
                ring.append(member)
            if ring:
                circles.append(sorted([module, *ring]))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return sorted(circles)


def test_no_module_imports_itself_back_through_others() -> None:
    """A circle means no part of it can be read, tested or replaced alone (issue 31: the
    seam module imported every implementation, and each imported it back)."""
    assert import_circles(modules()) == []


def test_the_circle_check_catches_a_circle() -> None:
    """Two probes that import each other, one through a function (still a dependency), and
    a third that closes a longer ring through a real module, are caught; ``from . import
    module`` counts as an edge to that module, not to its package."""
    first = PACKAGE / "_audit" / "_layering_probe.py"  # folders no other probe uses: the
    second = PACKAGE / "_demo" / "_layering_probe.py"  # suite runs in several processes
    first.write_text("from .._store import fsync\n\n\ndef later():\n"
                     "    from .._demo._layering_probe import x\n    return x\n")
    second.write_text("from .._audit._layering_probe import later\nx = 1\n")
    try:
        found = import_circles([*modules(), first, second])
    finally:
        first.unlink()
        second.unlink()
    assert found == [["evidence._audit._layering_probe", "evidence._demo._layering_probe"]]


# --- one way to open a store ---------------------------------------------------------------

# Who may ask which kind of database a location names. Everything else asks what it needs
# (location.is_server_database, location.label), so another database touches these alone:
# location (its kind), db (its opening), and archive (a restore into a PostgreSQL database
# writes its rows with PostgreSQL's own restore_rows).
KIND_QUESTIONS = {"is_postgres_location": {"_store/location.py"},
                  "database_kind": {"_store/location.py", "_store/db.py",
                                    "_archive/archive.py"}}


def kind_questions(paths: list[Path]) -> list[str]:
    """Each call of a KIND_QUESTIONS function outside the modules allowed to ask it."""
    found = []
    for path in paths:
        where = path.relative_to(PACKAGE).as_posix()
        for node in nodes(path):
            if not isinstance(node, ast.Call):
                continue
            called = node.func
            name = (called.id if isinstance(called, ast.Name) else
                    called.attr if isinstance(called, ast.Attribute) else "")
            if name in KIND_QUESTIONS and where not in KIND_QUESTIONS[name]:
                found.append(f"{where}:{node.lineno}: {name}")
    return found


def test_one_module_tells_locations_apart_and_one_opens_them() -> None:
    """Which database a location names is asked in _store/location.py and answered by an
    opening in _store/db.py (issue 31: nine sites in six modules asked it before)."""
    assert kind_questions(modules()) == []


def test_the_location_check_catches_a_caller_that_asks_the_kind() -> None:
    bad = PACKAGE / "_crawl" / "_layering_probe.py"  # a folder no other probe uses
    bad.write_text("from .._store import location\n\n\ndef f(x):\n"
                   "    return location.is_postgres_location(x) or "
                   "location.database_kind(x)\n")
    try:
        found = kind_questions([bad])
    finally:
        bad.unlink()
    assert found == ["_crawl/_layering_probe.py:5: is_postgres_location",
                     "_crawl/_layering_probe.py:5: database_kind"]


def test_the_version_is_named_once_and_pyproject_agrees() -> None:
    """``evidence/_version.py`` holds the version; the public face and pyproject.toml say the
    same, and no module learns it from the public face (issue 31)."""
    import tomllib

    import evidence
    from evidence._version import __version__

    project = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["project"]
    assert evidence.__version__ == __version__ == project["version"]
    assert [f"{module_name(p)}:{line}" for p in modules() for line, target in imports_of(p)
            if target == "evidence.__version__"] == []


def test_every_module_belongs_to_a_stage() -> None:
    top = {p.name for p in PACKAGE.iterdir() if not p.name.startswith("__pycache__")}
    stages = {s.split(".")[1] for s in STAGES if "." in s}
    loose = {name for name in top if name.removesuffix(".py") not in stages
             and name not in ("__init__.py", "__main__.py", "py.typed")}
    assert loose == set(), "a module outside the stages: give it one (docs/design.md)"


@pytest.mark.parametrize("path", [p for p in modules() if "_model" in p.parts],
                         ids=lambda p: p.name)
def test_the_model_is_pure_values(path: Path) -> None:
    """What flows imports no database, network or event-loop library."""
    used = {target.split(".")[0] for _, target in imports_of(path)}
    assert used & IO_LIBRARIES == set()


def test_importing_the_client_loads_no_sqlite_writer_store_or_crawler() -> None:
    """A worker process that only submits messages never loads SQLite (issue 14)."""
    probe = ("import sys, evidence.client\n"
             "print('\\n'.join(sorted(sys.modules)))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True)
    loaded = set(done.stdout.split())
    assert "evidence.client" in loaded
    forbidden = {m for m in loaded if m == "apsw" or m.startswith("apsw.")
                 or m.startswith(("evidence._write.writer", "evidence._store",
                                  "evidence._crawl", "evidence._audit", "evidence._archive"))}
    assert forbidden == set()


# --- the CLI: one module per command group, what they share in common ------------------

CLI = PACKAGE / "_cli"


def top_level_names(path: Path) -> set[str]:
    """The functions and classes a module defines at its top level."""
    tree = parsed(path)
    return {node.name for node in tree.body
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}


def cli_problems(paths: list[Path]) -> list[str]:
    """A command group importing another group (only ``main`` assembles them), any CLI
    module importing another's private name, or a group defining again what ``common``
    has (``_print_json`` once more, say)."""
    shared = top_level_names(CLI / "common.py")
    problems = []
    for path in paths:
        here = module_name(path)
        for line, target in imports_of(path):
            if not target.startswith("evidence._cli."):
                continue
            module, _, name = target.removeprefix("evidence._cli.").partition(".")
            where = f"{path.relative_to(PACKAGE.parent)}:{line}"
            if name.startswith("_") or (module.startswith("_") and module != "__init__"):
                problems.append(f"{where}: {here} imports the private {target}")
            if path.stem not in ("main", "__init__") and module != "common":
                problems.append(f"{where}: {here} imports the command group {module}; "
                                "share it through _cli/common.py")
        if path.stem != "common":
            again = {n for n in top_level_names(path) if n.lstrip("_") in shared}
            problems += [f"{path.relative_to(PACKAGE.parent)}: defines {n} again (it is in "
                         "_cli/common.py)" for n in sorted(again)]
    return list(dict.fromkeys(problems))  # ``from .x import y`` reads as x and x.y


def test_cli_groups_share_helpers_only_through_common() -> None:
    assert cli_problems(sorted(p for p in CLI.glob("*.py") if p.name not in PROBES)) == []


def test_the_cli_check_catches_a_private_import_and_a_second_json_printer() -> None:
    bad = CLI / "_layering_probe.py"
    bad.write_text("import sys\nfrom .verify import _cmd_verify\n\n\n"
                   "def _print_json(data):\n    sys.stdout.write(str(data))\n")
    try:
        problems = cli_problems([bad])
    finally:
        bad.unlink()
    assert any("imports the private evidence._cli.verify._cmd_verify" in p for p in problems)
    assert any("imports the command group verify" in p for p in problems)
    assert any("defines _print_json again" in p for p in problems)


def test_every_command_belongs_to_the_group_module_named_after_it() -> None:
    """``evidence X`` is defined in the group main lists, in the order --help lists them."""
    from evidence._cli.main import GROUPS, build_parser

    listed = [name for action in build_parser()._actions
              if isinstance(action, argparse._SubParsersAction) for name in action.choices]
    grouped = []
    for group in GROUPS:
        parser = argparse.ArgumentParser()
        group.add_commands(parser.add_subparsers())
        grouped += [name for action in parser._actions
                    if isinstance(action, argparse._SubParsersAction) for name in action.choices]
    assert grouped == listed
    assert sorted(p for p in CLI.glob("*.py") if p.name not in PROBES) == sorted(
        CLI / f"{name}.py" for name in
        ["__init__", "main", "common", *(g.__name__.rpartition(".")[2] for g in GROUPS)])


# --- docs/design.md draws the layout as it is ----------------------------------------

def drawn_layout() -> dict[str, str]:
    """The layout block of docs/design.md: each top-level entry and the text beside it."""
    text = (PACKAGE.parent / "docs" / "design.md").read_text()
    block = text.split("```\nevidence/\n", 1)[1].split("```", 1)[0]
    drawn: dict[str, str] = {}
    entry = ""
    for line in block.splitlines():
        name = line[2:].split(" ", 1)[0] if line.startswith("  ") and line[2] != " " else ""
        if name:
            entry = name.rstrip("/").removesuffix(".py")
            drawn[entry] = line[2 + len(name):]
        else:
            drawn[entry] += " " + line.strip()
    return drawn


def test_design_md_draws_every_stage_and_every_module_in_it() -> None:
    """A module added, moved or renamed without the drawing fails here (issue 14)."""
    drawn = drawn_layout()
    top = {p.name.removesuffix(".py") for p in PACKAGE.iterdir()
           if p.name not in ("__init__.py", "__main__.py", "py.typed", "__pycache__")}
    assert set(drawn) == top
    missing = []
    for stage in sorted(p for p in PACKAGE.iterdir() if p.is_dir() and p.name in drawn):
        words = set(drawn[stage.name].replace(",", " ").replace("(", " ").replace(")", " ")
                    .split())
        missing += [f"{stage.name}/{m.stem}" for m in sorted(stage.glob("*.py"))
                    if m.stem != "__init__" and m.stem not in words]
    assert missing == [], "modules docs/design.md does not draw"


# --- what a module lends is in its __all__ (the modules issue 14 split by their importers) --

LENDERS = ("evidence._archive.", "evidence.testing.")
IMPORTERS = [*(PACKAGE.parent / d for d in ("tests", "tools"))]


def names_imported(path: Path) -> list[tuple[int, str, str]]:
    """(line, absolute module, name) of every ``from module import name`` in the file, and
    of every ``alias.name`` read through a module imported as ``from package import
    module [as alias]``."""
    inside = path.is_relative_to(PACKAGE)
    found = []
    modules_by_alias: dict[str, str] = {}
    # ``name.attr`` reads, kept until every import is seen (one walk of the tree)
    attributes: list[tuple[int, str, str]] = []
    for node in nodes(path):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            attributes.append((node.lineno, node.value.id, node.attr))
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            if not inside:
                continue  # a test's ``from .conftest import ...``
            module = module_name(path)
            package = module if path.name == "__init__.py" else module.rpartition(".")[0]
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        found += [(node.lineno, target, alias.name) for alias in node.names]
        for alias in node.names:  # a module imported by name: what is read through it
            module_path = PACKAGE.parent.joinpath(*f"{target}.{alias.name}".split("."))
            if module_path.with_suffix(".py").is_file():
                modules_by_alias[alias.asname or alias.name] = f"{target}.{alias.name}"
    found += [(line, modules_by_alias[alias], attr)
              for line, alias, attr in attributes if alias in modules_by_alias]
    return found


def all_of(module: str) -> set[str] | None:
    """The module's ``__all__`` as written, or None for a package or a module without one."""
    path = PACKAGE.parent.joinpath(*module.split(".")).with_suffix(".py")
    if not path.is_file():
        return None
    for node in parsed(path).body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    return None


def lending_problems(paths: list[Path]) -> list[str]:
    """A name taken from another lending module that is private or not in its __all__."""
    problems = []
    for path in paths:
        here = module_name(path) if path.is_relative_to(PACKAGE) else ""
        for line, module, name in names_imported(path):
            if not module.startswith(LENDERS) or module == here:
                continue
            lent = all_of(module)
            if lent is None:
                continue  # ``from evidence.testing import seaweed``: a module, not a name
            if name.startswith("_") or name not in lent:
                problems.append(f"{path.relative_to(PACKAGE.parent)}:{line}: imports "
                                f"{module}.{name}, which its __all__ does not list")
    return problems


def test_what_the_archive_and_testing_modules_lend_is_in_their_all() -> None:
    """export and snapshot, disk and trial were cut by what their importers use: each
    imported name is one the module lists, and none is private (issue 14)."""
    paths = modules() + sorted(p for d in IMPORTERS for p in d.rglob("*.py"))
    assert lending_problems(paths) == []


def test_the_lending_check_catches_a_private_name_and_one_its_all_leaves_out() -> None:
    bad = PACKAGE / "_archive" / "_layering_probe.py"
    bad.write_text("from .snapshot import _held\nfrom .export import SNAPSHOT\n"
                   "from .export import dump\nfrom . import warc as _warc\n\n"
                   "_warc._NAMESPACE\n_warc.record_uri\n")
    try:
        problems = lending_problems([bad])
    finally:
        bad.unlink()
    assert [p.split(": ", 1)[1] for p in problems] == [
        "imports evidence._archive.snapshot._held, which its __all__ does not list",
        "imports evidence._archive.export.SNAPSHOT, which its __all__ does not list",
        "imports evidence._archive.warc._NAMESPACE, which its __all__ does not list"]
