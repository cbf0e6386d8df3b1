"""A throwaway PostgreSQL cluster for tests and benchmarks: initdb, start, stop.

    with PgCluster.start(tmp_dir) as cluster:
        url = cluster.create_database("t1")      # postgresql://...?host=<socket dir>

The server is the Debian package's (``apt-get install postgresql``; binaries under
``/usr/lib/postgresql/<major>/bin``), run from a temporary directory, listening on a Unix
socket in that directory and on 127.0.0.1 at a free port (never another address), with
``fsync=on`` and ``synchronous_commit=on``: the settings an evidence store requires.
``initdb`` refuses to run as root, so as root the cluster runs as the ``postgres`` user
(the package creates it; its directory is chowned to it); as anyone else, as that user.

Nothing here is silent: a missing server or a cluster that does not start raises
``ClusterError`` with the command's output, and the test that needed it fails with it.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

__all__ = ["ClusterError", "PgCluster", "find_bindir"]


class ClusterError(RuntimeError):
    """The throwaway cluster could not be made, started or stopped; says why."""


def find_bindir() -> Path:
    """The newest PostgreSQL server binaries of the Debian layout (or ``PG_BINDIR``)."""
    given = os.environ.get("PG_BINDIR")
    if given:
        candidates = [Path(given)]
    else:
        root = Path("/usr/lib/postgresql")
        versions = sorted((p for p in root.glob("*") if p.name.isdigit()),
                          key=lambda p: int(p.name), reverse=True) if root.is_dir() else []
        candidates = [p / "bin" for p in versions]
    for bindir in candidates:
        if (bindir / "initdb").is_file() and (bindir / "pg_ctl").is_file():
            return bindir
    raise ClusterError("no PostgreSQL server found (looked for initdb and pg_ctl under "
                       "/usr/lib/postgresql/*/bin and $PG_BINDIR): apt-get install postgresql")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgCluster:
    """One running cluster in ``root`` (data in ``root/data``, the socket in ``root``)."""

    def __init__(self, root: Path, bindir: Path, port: int, user: str | None) -> None:
        self.root = root
        self.data = root / "data"
        self.bindir = bindir
        self.port = port
        self.user = user  # the OS user the server runs as (None: this process's)
        self.superuser = user or pwd.getpwuid(os.getuid()).pw_name

    # --- lifecycle -------------------------------------------------------------------

    @classmethod
    def start(cls, root: os.PathLike[str] | str | None = None, *,
              bindir: Path | None = None, settings: dict[str, str] | None = None
              ) -> PgCluster:
        """initdb a new cluster in the new directory ``root`` and start it.

        ``root`` defaults to a new directory under the system's temporary directory: the
        server's user must be able to reach it (pytest's ``tmp_path`` is private to the
        user running the tests), and a Unix socket path must stay short (108 bytes).
        """
        root = Path(tempfile.mkdtemp(prefix="evidence-pg-")) if root is None else Path(root)
        root.mkdir(parents=True, exist_ok=True)
        user = "postgres" if os.getuid() == 0 else None
        if user is not None:
            try:
                entry = pwd.getpwnam(user)
            except KeyError:
                raise ClusterError("running as root, and there is no 'postgres' user to run "
                                   "the server as (the Debian package creates it)") from None
            os.chown(root, entry.pw_uid, entry.pw_gid)
            root.chmod(0o700)
        cluster = cls(root, bindir or find_bindir(), _free_port(), user)
        cluster._run("initdb", "-D", str(cluster.data), "-U", cluster.superuser,
                     "--auth=trust", "--encoding=UTF8", "--locale=C.UTF-8", "--no-sync")
        conf = {"listen_addresses": "'127.0.0.1'", "port": str(cluster.port),
                "unix_socket_directories": f"'{root}'", "fsync": "on",
                "synchronous_commit": "on", "full_page_writes": "on",
                "max_connections": "100", "shared_buffers": "128MB",
                "logging_collector": "off", **(settings or {})}
        with open(cluster.data / "postgresql.auto.conf", "a") as handle:
            for key, value in conf.items():
                handle.write(f"{key} = {value}\n")
        cluster.start_server()
        return cluster

    def start_server(self) -> None:
        """Start (or restart after ``stop_server``) and wait until it accepts connections."""
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"),
                  "-w", "-t", "60", "start")

    def stop_server(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m MODE``: ``immediate`` is a crash (no checkpoint; recovery
        replays the WAL at the next start), ``fast`` a clean shutdown."""
        self._run("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "-m", mode, "stop")

    def close(self) -> None:
        """Stop the server (immediately: its data is thrown away) and remove the directory."""
        with contextlib.suppress(ClusterError):
            self.stop_server("immediate")
        pid = self.pid()
        if pid is not None:  # pg_ctl failed: make sure nothing outlives the tests
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PgCluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- using it --------------------------------------------------------------------

    def pid(self) -> int | None:
        """The postmaster's pid while the server runs."""
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (FileNotFoundError, IndexError, ValueError):
            return None

    def url(self, dbname: str = "postgres", *, tcp: bool = False) -> str:
        """A connection string: over the Unix socket (default), or TCP on 127.0.0.1."""
        if tcp:
            return f"postgresql://{self.superuser}@127.0.0.1:{self.port}/{dbname}"
        return (f"postgresql://{self.superuser}@/{dbname}?host={quote(str(self.root))}"
                f"&port={self.port}")

    def sql(self, statement: str, dbname: str = "postgres") -> str:
        """Run a statement (or several, ``;``-separated) as the superuser, outside any
        transaction; the last one's rows as psql's unaligned, tuples-only output prints
        them (``|`` between values, a line each). Over psycopg, not psql: a psql process
        (run as the server's user) cost about 40 ms of CPU, and the suite runs hundreds."""
        import psycopg

        try:
            with psycopg.connect(self.url(dbname), autocommit=True) as conn:
                cursor = conn.execute(statement.encode())  # bytes: no placeholders
                rows: list[tuple[object, ...]] = []
                while True:  # one result per statement: the last one's rows
                    rows = cursor.fetchall() if cursor.description else []
                    if not cursor.nextset():
                        break
        except psycopg.Error as exc:
            raise ClusterError(f"{statement[:60]!r} failed on database {dbname!r}: {exc}"
                               ) from exc
        return "".join("|".join(_as_psql_prints(v) for v in row) + "\n" for row in rows)

    def create_database(self, name: str) -> str:
        """A new empty database (from template0: nothing of template1 in it); its URL."""
        self.sql(f'CREATE DATABASE "{name}" TEMPLATE template0')
        return self.url(name)

    def _run(self, program: str, *args: str) -> str:
        command = [str(self.bindir / program), *args]
        if self.user is not None:
            command = ["runuser", "-u", self.user, "--", *command]
        started = time.monotonic()
        result = subprocess.run(command, capture_output=True, text=True, cwd="/",
                                timeout=120, check=False)
        if result.returncode != 0:
            log = ""
            with contextlib.suppress(OSError):
                log = (self.root / "server.log").read_text()[-2000:]
            raise ClusterError(
                f"{program} {' '.join(args[:3])}... failed ({result.returncode}) after "
                f"{time.monotonic() - started:.1f} s: {result.stderr.strip() or result.stdout}"
                + (f"\nserver log:\n{log}" if log else ""))
        return result.stdout


def _as_psql_prints(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "t" if value else "f"
    return str(value)


@contextlib.contextmanager
def running(root: os.PathLike[str] | str | None = None) -> Iterator[PgCluster]:
    """``PgCluster.start(root)``, closed on exit."""
    cluster = PgCluster.start(root)
    try:
        yield cluster
    finally:
        cluster.close()
