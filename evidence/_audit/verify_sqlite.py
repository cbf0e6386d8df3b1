"""The database as SQLite and the migrations see it, for verify: every schema object exactly
as the migrations up to the store's version create it, SQLite's own ``quick_check`` (or
``integrity_check``) with each damaged table or index located, and ``foreign_key_check``.
"""

from __future__ import annotations

import contextlib
import re

import apsw

from .._store.sqlite import copy_migrated, load_migrations
from .verify_findings import Findings

__all__ = ["check_foreign_keys", "check_schema", "check_sqlite"]


def check_schema(conn: apsw.Connection, found: Findings, version: int) -> int:
    """Every table, index and trigger exactly as the migrations up to the store's version
    create them, and no other."""
    fresh = apsw.Connection(":memory:")
    try:
        copy_migrated(fresh, load_migrations()[:version])
        want = _schema(fresh)
    finally:
        fresh.close()
    have = _schema(conn)
    for key in sorted(want.keys() | have.keys()):
        kind, name = key
        if key not in have:
            found.add("schema", f"{kind} {name} is missing (the migrations create it)",
                      table=want[key][0])
        elif key not in want:
            found.add("schema", f"{kind} {name} is not created by any migration",
                      table=have[key][0])
        elif want[key] != have[key]:
            found.add("schema", f"{kind} {name} differs from its migration", table=have[key][0])
    return len(have)


def _schema(conn: apsw.Connection) -> dict[tuple[str, str], tuple[str, str | None]]:
    return {(t, n): (tbl, sql) for t, n, tbl, sql in conn.execute(
        "SELECT type, name, tbl_name, sql FROM sqlite_schema WHERE name NOT LIKE 'sqlite_stat%'")}


def check_sqlite(conn: apsw.Connection, found: Findings, full: bool) -> int:
    """SQLite's own check, its report grouped by what is damaged: each damaged table or
    index is one finding (how many problems, the first ones), located at its table."""
    pragma = "integrity_check" if full else "quick_check"
    try:
        lines = _report_lines(conn, f"PRAGMA {pragma}")
    except apsw.CorruptError:  # it stopped at a damaged page: table by table, then
        lines = []
        for (table,) in conn.execute("SELECT name FROM sqlite_schema WHERE type = 'table' "
                                     "ORDER BY name").fetchall():
            try:
                lines += [line for line in _report_lines(
                    conn, f"PRAGMA {pragma}({_quote(table)})") if line != "ok"]
            except apsw.Error as exc:
                unreadable = _unreadable_objects(conn, table) or [
                    f"table {table} (or one of its indexes)"]
                for name in unreadable:
                    found.add("sqlite_integrity", f"{pragma}: {name} is damaged: the check "
                              f"stops at it ({exc})", table=table)
        if not lines:
            return 1
    if lines == ["ok"]:
        return 1
    names = _objects_by_root_page(conn)
    damaged: dict[tuple[str, str, str], list[str]] = {}
    for line in lines:
        damaged.setdefault(_damaged_object(conn, names, line), []).append(line)
    for (kind, name, table), problems in damaged.items():
        example = "; ".join(problems[:3]) + ("; ..." if len(problems) > 3 else "")
        if not name:
            for problem in problems:
                found.add("sqlite_integrity", f"{pragma}: {problem}")
            continue
        what = f"{kind} {name}" + (f" (on {table})" if kind == "index" else "")
        found.add("sqlite_integrity", f"{pragma}: {what} is damaged: {len(problems)} "
                  f"problem(s) reported, e.g. {example}", table=table)
    return 1


def _unreadable_objects(conn: apsw.Connection, table: str) -> list[str]:
    """Which b-trees of a table a full scan cannot read: the table, and each index."""
    # Every cell is read (count(*) would only read each page's cell count).
    scans = [(f"table {table}", f"SELECT * FROM {_quote(table)} NOT INDEXED")]
    for (index,) in conn.execute("SELECT name FROM sqlite_schema WHERE type = 'index' AND "
                                 "tbl_name = ? ORDER BY name", (table,)).fetchall():
        columns = [name for _, _, name in conn.execute(f"PRAGMA index_info({_quote(index)})")
                   if name is not None]
        scans.append((f"index {index} (on {table})",
                      f"SELECT {', '.join(map(_quote, columns)) or 1} FROM {_quote(table)} "
                      f"INDEXED BY {_quote(index)}"))
    damaged = []
    for what, sql in scans:
        try:
            for _ in conn.execute(sql):
                pass
        except apsw.CorruptError:
            damaged.append(what)
        except apsw.Error:  # a partial index the planner cannot scan whole: not known
            continue
    return damaged


def _report_lines(conn: apsw.Connection, sql: str) -> list[str]:
    return [line for (row,) in conn.execute(sql) for line in str(row).splitlines()
            if line and not line.startswith("*** in database")]


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


_TREE = re.compile(r"(?:Tree|On tree page|On page) (\d+)")
_INDEX = re.compile(r"(?:index|in) (\w+)")
_PAGE_NO = re.compile(r"[Pp]age (\d+)")


def _objects_by_root_page(conn: apsw.Connection) -> dict[int, tuple[str, str, str]]:
    """root page -> (kind, name, table) of every b-tree (sqlite_schema is page 1)."""
    names = {1: ("table", "sqlite_schema", "sqlite_schema")}
    with contextlib.suppress(apsw.Error):  # the schema itself may be what is damaged
        for kind, name, table, root in conn.execute(
                "SELECT type, name, tbl_name, rootpage FROM sqlite_schema WHERE rootpage > 0"):
            names[root] = (kind, name, table)
    return names


def _damaged_object(conn: apsw.Connection, names: dict[int, tuple[str, str, str]],
                    line: str) -> tuple[str, str, str]:
    """Which b-tree one line of an integrity report is about: ("", "", "") if none."""
    by_name = {name: (kind, name, table) for kind, name, table in names.values()}
    match = _TREE.search(line)
    if match and int(match[1]) in names:
        return names[int(match[1])]
    for word in _INDEX.findall(line):
        if word in by_name:
            return by_name[word]
    match = _PAGE_NO.search(line)
    if match:  # a page of some tree: dbstat (when compiled in) knows which
        with contextlib.suppress(apsw.Error):
            for (name,) in conn.execute("SELECT name FROM dbstat WHERE pageno = ?",
                                        (int(match[1]),)):
                if name in by_name:
                    return by_name[name]
    return ("", "", "")


def check_foreign_keys(conn: apsw.Connection, found: Findings) -> None:
    for table, rowid, parent, _fkid in conn.execute("PRAGMA foreign_key_check"):
        found.add("foreign_key", f"{table} row {rowid} references a {parent} row that does "
                  "not exist", table=table, row_id=rowid)


