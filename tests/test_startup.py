"""What a start of the ``evidence`` command imports (issue 34): only what its command needs.

Every ``evidence`` process used to import the whole library before reading its arguments
(the writer, the PostgreSQL driver, the crawler's HTTP client): 0.6 to 0.7 s of CPU for
``evidence --help``, paid again by every script and test that starts one. The command
groups (``evidence/_cli/``) now build their parsers from light modules and import what a
command runs inside the command; a default the library holds is read only when the help
is printed (``_cli/common.py`` ``show_default``). Each test starts the real command in a
subprocess and reads the modules it loaded from ``python -X importtime``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from evidence import Store
from evidence._demo.site import SiteConfig, TestSite

# Nothing of the store, the writer, the crawler, the audit or the archives, and none of
# the libraries they bring (the PostgreSQL driver, the HTTP client, TLS, the event loop).
LIBRARY = ("evidence._store", "evidence._write", "evidence._crawl", "evidence._audit",
           "evidence._archive", "apsw", "psycopg", "httpx", "anyio", "cryptography")

# What only a crawl or a writer needs: a command reading a store on this machine (SQLite)
# loads none of it.
# The PostgreSQL backend's modules (``_store/postgresql.py`` and the parts it is built of).
POSTGRESQL_BACKEND = ("evidence._store.pgconn", "evidence._store.pglock",
                      "evidence._store.pgschema", "evidence._store.postgresql")
# What only a crawl that renders or logs in runs (issue 35 point 5): the renderer, the
# browser and its scratch directory, the behaviours, the recording proxy (with its HTTP/1.1
# parser and TLS certificates), a login run in Chromium and a run's logins.
RENDERING = ("evidence._crawl.render", "evidence._crawl.renderproxy",
             "evidence._crawl.rendertls", "evidence._crawl.browser", "evidence._crawl.scratch",
             "evidence._crawl.behaviors", "evidence._crawl.login", "evidence._crawl.runlogins",
             "h11", "cryptography")
WRITER_AND_CLIENTS = ("psycopg", "httpx", "evidence._write.writer", "evidence._crawl.crawler",
                      *POSTGRESQL_BACKEND)


def imported(*argv: str, cwd: Path | None = None) -> tuple[int, set[str]]:
    """The exit status of ``evidence ARGV`` and the modules it imported."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "evidence", *argv],
                          capture_output=True, text=True, cwd=cwd, timeout=120)
    modules = {line.rpartition("|")[2].strip() for line in done.stderr.splitlines()
               if line.startswith("import time:")}
    assert "evidence._cli.main" in modules, done.stderr[-2000:]
    return done.returncode, modules


def among(modules: set[str], names: tuple[str, ...]) -> list[str]:
    """The modules that are one of ``names`` or inside one of them."""
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in names))


def test_evidence_help_imports_none_of_the_library() -> None:
    code, modules = imported("--help")
    assert code == 0
    assert among(modules, LIBRARY) == []


def test_no_command_s_help_but_serve_s_imports_the_writer_or_a_client() -> None:
    """Every command's parser is built and its help printed in one process; only ``serve``
    shows the writer's own limits, and only ``crawl`` reads the crawl configuration's
    defaults (``evidence._crawl.frontier``: no writer, no HTTP client)."""
    probe = ("import argparse, io, sys, contextlib\n"
             "from evidence._cli.main import build_parser\n"
             "[sub] = [a for a in build_parser()._actions\n"
             "         if isinstance(a, argparse._SubParsersAction)]\n"
             "names = [n for n in sub.choices if n != 'serve']\n"
             "with contextlib.redirect_stdout(io.StringIO()):\n"
             "    for name in names:\n"
             "        sub.choices[name].print_help()\n"
             "print(len(names)); print('\\n'.join(sorted(sys.modules)))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True, timeout=120)
    count, *modules = done.stdout.split()
    assert int(count) >= 20  # every command of docs/cli.md but serve (23 now)
    assert among(set(modules), WRITER_AND_CLIENTS) == []
    assert among(set(modules), ("evidence._store.db", "evidence._write")) == []


def test_a_command_on_a_sqlite_store_imports_no_postgresql_driver_writer_or_client(
        tmp_path: Path) -> None:
    Store.create(tmp_path / "store").close()
    code, modules = imported("status", "store", cwd=tmp_path)
    assert code == 0
    assert "evidence._audit.status" in modules  # the command ran
    assert among(modules, WRITER_AND_CLIENTS) == []


def test_a_crawl_on_sqlite_loads_the_writer_and_crawler_but_no_postgresql_driver() -> None:
    """The errors a PostgreSQL store raises (a lost writer lock, an outage past its
    deadline) live in ``_errors``, so catching them loads no driver."""
    probe = ("import sys, evidence._crawl.crawler, evidence._write.writer\n"
             "print('\\n'.join(sorted(sys.modules)))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True, timeout=120)
    modules = set(done.stdout.split())
    assert {"evidence._crawl.crawler", "evidence._write.writer"} <= modules
    assert among(modules, ("psycopg", *POSTGRESQL_BACKEND)) == []


def test_a_crawl_that_neither_renders_nor_logs_in_loads_no_browser_code(tmp_path: Path) -> None:
    """A plain crawl, start to end, in its own process: a fifth of the crawler's imports
    were the renderer's, paid by every crawl (about 7% of its CPU on a 5,000-page site)."""
    with TestSite(SiteConfig(pages=5)) as site:
        code, modules = imported("crawl", site.url, "--store", str(tmp_path / "s"),
                                 cwd=tmp_path)
    assert code == 0
    assert {"evidence._crawl.crawler", "evidence._crawl.pages"} <= modules  # it crawled
    assert among(modules, RENDERING) == []
