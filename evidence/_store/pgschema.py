"""A PostgreSQL store's tables: made by migrations, copied into SQLite and back, and
checked against what the migrations make.

The store's tables are the SQLite store's, mirrored by ``schema/postgresql/NNN_name.sql``
(one per SQLite migration, with the same number and name). This module owns:
  - the migrations (``apply_pg_migrations``, each under the writer's lock), the version a
    reader finds (``applied_version``) and a new store's identity (``ensure_store_id``);
  - the same messages make the same rows, ids included, as on SQLite: the migrations give
    the next id as SQLite's rowid does;
  - ``copy_snapshot`` writes one REPEATABLE READ snapshot into a private SQLite file made
    by the SQLite migrations of the store's version, which is what the canonical dump, the
    archives and verify read: both engines export the same bytes for the same evidence;
    ``restore_rows`` loads such a file into an empty database in one transaction;
  - verify's schema check (``check_schema``): the server's objects against what the
    migrations create, made again in a scratch schema that is rolled back.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import apsw

from .._errors import MigrationError, StoreError
from .._model.messages import new_id, now_text
from .backend import Progress
from .location import redact
from .pgconn import PgConnection, connect
from .pglock import POSTGRESQL
from .sqlite import CLOSE_LEGACY_QUARANTINE, apply_migrations, load_migrations, schema_dir

__all__ = ["LOCAL_META", "applied_version", "apply_pg_migrations", "check_schema",
           "copy_snapshot", "ensure_store_id", "pg_migrations", "restore_rows",
           "snapshot_into"]

_PG_MIGRATIONS = "postgresql"


# --- migrations ---------------------------------------------------------------------------

def pg_migrations() -> list[tuple[int, str, str, str]]:
    """(version, name, checksum, sql) of ``schema/postgresql``: one per SQLite migration,
    with the same number and name."""
    mine = load_migrations(schema_dir() / _PG_MIGRATIONS)
    canonical = load_migrations()
    if [(v, n) for v, n, _c, _s in mine] != [(v, n) for v, n, _c, _s in canonical]:
        raise MigrationError("schema/postgresql does not mirror schema/: every NNN_name.sql "
                             "needs its PostgreSQL twin")
    return mine


def _tables_exist(conn: PgConnection, *names: str) -> set[str]:
    return {n for (n,) in conn.raw.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = "
        "current_schema() AND table_name = ANY(%s)", (list(names),))}


def apply_pg_migrations(conn: PgConnection) -> int:
    """Check applied migrations, apply the new ones (all in one transaction, under the
    writer's lock: a store holds every migration of its version or none of the new ones);
    return the schema version.

    ``schema_migration`` holds what a SQLite store holds (the canonical migration's name
    and checksum: its dump's schema is the SQLite one); ``postgresql_migration`` the
    checksum of the file applied here. An edit of either file after it was applied, or a
    store newer than the program, is refused as on SQLite.
    """
    canonical = load_migrations()
    mine = pg_migrations()
    raw = conn.raw
    raw.execute("CREATE TABLE IF NOT EXISTS schema_migration (version bigint PRIMARY KEY, "
                "name text NOT NULL, checksum text NOT NULL, applied_at text NOT NULL)")
    raw.execute("CREATE TABLE IF NOT EXISTS postgresql_migration (version bigint PRIMARY KEY,"
                " name text NOT NULL, checksum text NOT NULL, applied_at text NOT NULL)")
    applied = {v: (n, c) for v, n, c in raw.execute(
        "SELECT version, name, checksum FROM schema_migration ORDER BY version")}
    applied_pg = {v: c for v, c in raw.execute(
        "SELECT version, checksum FROM postgresql_migration")}
    newest = len(canonical)
    if applied and max(applied) > newest:
        raise MigrationError(
            f"the store has schema version {max(applied)}, newer than this program "
            f"supports ({newest})", hint="upgrade evidence to open this store",
            schema_version=max(applied))
    pairs = list(zip(canonical, mine, strict=True))
    for (version, name, checksum, _sql), (_v, _n, pg_checksum, _s) in pairs:
        stored = applied.get(version)
        if stored is not None and (stored[1] != checksum or
                                   applied_pg.get(version, pg_checksum) != pg_checksum):
            which = ("schema/postgresql/" if stored[1] == checksum else "schema/")
            raise MigrationError(
                f"migration {version:03d}_{name} was edited after it was applied "
                f"({which}{version:03d}_{name}.sql differs from what the store recorded)",
                hint="never edit an applied migration; add a new NNN_name.sql instead",
                schema_version=version)
    pending = [(c, p) for c, p in pairs if c[0] not in applied]
    if not pending:
        return newest
    now = now_text()
    conn.execute(POSTGRESQL.begin_write)  # every pending migration, or none of them
    try:
        for (version, name, checksum, _sql), (_v, _n, pg_checksum, sql) in pending:
            raw.execute(sql)
            raw.execute("INSERT INTO schema_migration VALUES (%s, %s, %s, %s)",
                        (version, name, checksum, now))
            raw.execute("INSERT INTO postgresql_migration VALUES (%s, %s, %s, %s)",
                        (version, name, pg_checksum, now))
        raw.execute("COMMIT")
    except BaseException:
        if not conn.broken and not conn.get_autocommit():
            raw.execute("ROLLBACK")
        raise
    return newest


def _create_schema(conn: PgConnection, version: int) -> None:
    """Inside the caller's transaction: the tables of migrations 001..``version`` and the
    postgresql_migration rows (restore writes schema_migration's rows from its archive)."""
    raw = conn.raw
    raw.execute("CREATE TABLE schema_migration (version bigint PRIMARY KEY, "
                "name text NOT NULL, checksum text NOT NULL, applied_at text NOT NULL)")
    raw.execute("CREATE TABLE postgresql_migration (version bigint PRIMARY KEY,"
                " name text NOT NULL, checksum text NOT NULL, applied_at text NOT NULL)")
    now = now_text()
    for number, name, pg_checksum, sql in pg_migrations()[:version]:
        raw.execute(sql)
        raw.execute("INSERT INTO postgresql_migration VALUES (%s, %s, %s, %s)",
                    (number, name, pg_checksum, now))


def restore_rows(location: str, source: Path, version: int, artifacts: str,
                 check: Callable[[Path], list[str]]) -> list[str]:
    """Load every row of the SQLite database ``source`` (a loaded, checked dump) into the
    empty database ``location``, with the schema of ``version``, in one transaction; before
    it commits, its snapshot is handed to ``check`` (which re-dumps it against the
    manifest): any problem rolls everything back, and the database is left empty.
    Returns the problems (empty: committed)."""
    conn = connect(location)
    try:
        if _tables_exist(conn, "schema_migration", "store_meta", "ingest_ledger"):
            where = redact(location)
            raise StoreError(f"{where} is not empty: it holds an evidence store already",
                             hint="restore into a new, empty database", path=where)
        src = apsw.Connection(str(source), flags=apsw.SQLITE_OPEN_READONLY)
        try:
            conn.execute(POSTGRESQL.begin_write)
            raw = conn.raw
            _create_schema(conn, version)
            raw.execute("SET CONSTRAINTS ALL DEFERRED")  # whole tables, in the dump's order
            for (name,) in src.execute(
                    "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE "
                    "'sqlite\\_%' ESCAPE '\\' ORDER BY name").fetchall():
                columns = [c for _cid, c, *_ in src.execute(f"PRAGMA table_info({name})")]
                cols = ", ".join(columns)
                with raw.cursor().copy(f"COPY {name} ({cols}) FROM STDIN") as copy:
                    for row in src.execute(f"SELECT {cols} FROM {name}"):
                        copy.write_row(row)
            raw.execute("INSERT INTO store_meta (key, value) VALUES ('artifacts', %s) "
                        "ON CONFLICT (key) DO UPDATE SET value = excluded.value", (artifacts,))
            raw.execute("SET CONSTRAINTS ALL IMMEDIATE")  # every reference checked, here
            with contextlib.ExitStack() as stack:
                scratch = Path(stack.enter_context(_scratch_dir(source.parent)))
                snapshot_into(conn, scratch / "check.db", version)
                problems = check(scratch / "check.db")
            raw.execute("ROLLBACK" if problems else "COMMIT")
            return problems
        except BaseException:
            if not conn.broken and not conn.get_autocommit():
                conn.raw.execute("ROLLBACK")
            raise
        finally:
            src.close()
    finally:
        conn.close()


@contextlib.contextmanager
def _scratch_dir(near: Path) -> Iterator[str]:
    import tempfile

    with tempfile.TemporaryDirectory(prefix=".evidence-check-", dir=near) as path:
        yield path


def applied_version(conn: PgConnection) -> int:
    """The schema version of a store opened for reading (nothing applied); newer refused."""
    if "schema_migration" not in _tables_exist(conn, "schema_migration"):
        raise StoreError(f"{redact(conn.location)}: no evidence store in this database "
                         "(it has no schema_migration table)",
                         hint=f"create one with 'evidence init {redact(conn.location)} "
                         "--artifacts DIR'", path=redact(conn.location))
    version = conn.raw.execute(
        "SELECT coalesce(max(version), 0) FROM schema_migration").fetchall()[0][0]
    newest = len(load_migrations())
    if version > newest:
        raise MigrationError(
            f"the store has schema version {version}, newer than this program supports "
            f"({newest})", hint="upgrade evidence to open this store", schema_version=version)
    return int(version)


def ensure_store_id(conn: PgConnection, artifacts: str | None) -> None:
    """Give a new store its identity and its artifact location, once."""
    conn.execute(POSTGRESQL.begin_write)
    try:
        conn.raw.execute(
            "INSERT INTO store_meta (key, value) VALUES ('store_id', %s), ('created_at', %s),"
            " ('created_on', %s) ON CONFLICT (key) DO NOTHING",
            (new_id("store-"), now_text(), socket.gethostname()))
        conn.raw.execute(CLOSE_LEGACY_QUARANTINE)
        if artifacts is not None:
            conn.raw.execute("INSERT INTO store_meta (key, value) VALUES ('artifacts', %s) "
                             "ON CONFLICT (key) DO NOTHING", (artifacts,))
        conn.raw.execute("COMMIT")
    except BaseException:
        if not conn.broken and not conn.get_autocommit():
            conn.raw.execute("ROLLBACK")
        raise


# --- snapshots into SQLite -------------------------------------------------------------------

# Keys of store_meta that say where a deployment keeps things, not what the store holds:
# a copy of the same store elsewhere exports the same bytes.
LOCAL_META = ("artifacts",)


def copy_snapshot(location: str, dest: Path, *, progress: Progress | None = None) -> int:
    """Copy one consistent snapshot of the store into the new SQLite file ``dest`` (with the
    SQLite schema of the store's version); return its size in pages.

    One REPEATABLE READ, READ ONLY transaction: the writer is never blocked (MVCC), and
    every table is read at the same instant.
    """
    conn = connect(location, read_only=True)
    try:
        conn.raw.execute(POSTGRESQL.begin_read)
        pages = snapshot_into(conn, dest, applied_version(conn), progress=progress)
        conn.raw.execute("COMMIT")
    finally:
        conn.close()
    return pages


def snapshot_into(conn: PgConnection, dest: Path, version: int, *,
                  progress: Progress | None = None) -> int:
    """What ``conn``'s transaction sees, written into the new SQLite file ``dest``: the
    schema SQLite migrations 001..``version`` make, then every row, ordered by primary key
    (the dump orders rows itself, so the file's order does not matter), columns by name.
    ``store_meta``'s local keys (``LOCAL_META``) are left out."""
    dst = apsw.Connection(str(dest), flags=apsw.SQLITE_OPEN_READWRITE
                          | apsw.SQLITE_OPEN_CREATE | apsw.SQLITE_OPEN_EXCLUSIVE)
    try:
        dst.execute("PRAGMA synchronous = OFF")  # fsynced by the caller when it keeps it
        apply_migrations(dst, load_migrations()[:version])
        dst.execute("DELETE FROM schema_migration")  # the store's own rows follow
        dst.execute("PRAGMA foreign_keys = OFF")
        dst.execute("PRAGMA ignore_check_constraints = ON")  # a copy of what is there
        tables = [(name, [c for _cid, c, *_ in dst.execute(f"PRAGMA table_info({name})")])
                  for (name,) in dst.execute(
                      "SELECT name FROM sqlite_schema WHERE type = 'table' AND "
                      "name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY name")]
        raw = conn.raw
        total = sum(raw.execute(f"SELECT count(*) FROM {name}").fetchall()[0][0]
                    for name, _ in tables)
        done = 0
        dst.execute("BEGIN")
        for name, columns in tables:
            cols = ", ".join(columns)
            where = (" WHERE key <> ALL(%s)" if name == "store_meta" else "")
            insert = f"INSERT INTO {name} ({cols}) VALUES ({', '.join('?' * len(columns))})"
            with raw.cursor(name=f"snapshot_{name}") as cursor:  # server side: streamed
                cursor.itersize = 5000
                cursor.execute(f"SELECT {cols} FROM {name}{where} ORDER BY 1",
                               (list(LOCAL_META),) if where else None)
                while rows := cursor.fetchmany(5000):
                    dst.executemany(insert, rows)
                    done += len(rows)
                    if progress:
                        progress("snapshot", done, total)
        dst.execute("COMMIT")
        return dst.execute("PRAGMA page_count").fetchall()[0][0]
    finally:
        dst.close()


# --- the server's objects against the migrations (verify) ------------------------------------

_REFERENCE = "evidence_verify_reference"


def _describe(raw: Any, schema: str) -> dict[tuple[str, str], tuple[str, str]]:
    """(kind, name) -> (table, definition) of every table, column set, constraint, index,
    trigger (with whether it is enabled) and function in ``schema``, spelled without the
    schema's name so that two schemas made by the same migrations describe alike."""
    raw.execute("SELECT set_config('search_path', %s, true)", (schema,))
    found: dict[tuple[str, str], tuple[str, str]] = {}
    columns: dict[str, list[str]] = {}
    for table, column, kind, nullable, default in raw.execute(
            "SELECT table_name, column_name, data_type, is_nullable, "
            "coalesce(column_default, '') FROM information_schema.columns "
            "WHERE table_schema = %s ORDER BY table_name, ordinal_position", (schema,)):
        columns.setdefault(table, []).append(f"{column} {kind} {nullable} {default}")
    for table, spec in columns.items():
        found[("table", table)] = (table, "; ".join(spec))
    queries = (
        ("constraint", "SELECT c.relname, o.conname, pg_get_constraintdef(o.oid) FROM "
         "pg_constraint o JOIN pg_class c ON c.oid = o.conrelid JOIN pg_namespace n ON "
         "n.oid = o.connamespace WHERE n.nspname = %s"),
        ("index", "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE "
         "schemaname = %s"),
        ("trigger", "SELECT c.relname, t.tgname, pg_get_triggerdef(t.oid) || ' ' || "
         "t.tgenabled::text FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN "
         "pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND NOT "
         "t.tgisinternal"),
        ("function", "SELECT '', p.proname, pg_get_functiondef(p.oid) FROM pg_proc p JOIN "
         "pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = %s"),
    )
    for kind, sql in queries:
        for table, name, definition in raw.execute(sql, (schema,)):
            text = definition.replace(f'"{schema}".', "").replace(f"{schema}.", "")
            found[(kind, f"{table}.{name}" if kind == "constraint" else name)] = (table, text)
    return found


def check_schema(location: str, add: Callable[..., None], version: int) -> int:
    """Compare the store's tables, constraints, indexes, triggers and functions with what
    schema/postgresql 001..``version`` creates, made again in a scratch schema inside a
    transaction that is rolled back (nothing is left; it needs the CREATE privilege on the
    database); and postgresql_migration's rows with the files. Findings go to ``add``."""
    conn = connect(location)
    raw = conn.raw
    try:
        raw.execute("BEGIN READ WRITE")
        try:
            home = raw.execute("SELECT current_schema()").fetchall()[0][0]
            have = _describe(raw, home)
            raw.execute(f"CREATE SCHEMA {_REFERENCE}")
            raw.execute(f"SET LOCAL search_path = {_REFERENCE}")
            for statement in (
                    "CREATE TABLE schema_migration (version bigint PRIMARY KEY, name text NOT "
                    "NULL, checksum text NOT NULL, applied_at text NOT NULL)",
                    "CREATE TABLE postgresql_migration (version bigint PRIMARY KEY, name text "
                    "NOT NULL, checksum text NOT NULL, applied_at text NOT NULL)"):
                raw.execute(statement)
            for _v, _n, _c, sql in pg_migrations()[:version]:
                raw.execute(sql)
            want = _describe(raw, _REFERENCE)
            recorded = {v: (n, c) for v, n, c in raw.execute(
                f'SELECT version, name, checksum FROM "{home}".postgresql_migration')}
        finally:
            raw.execute("ROLLBACK")
    finally:
        conn.close()
    for key in sorted(want.keys() | have.keys()):
        kind, name = key
        if key not in have:
            add("schema", f"{kind} {name} is missing (schema/postgresql creates it)",
                table=want[key][0] or None)
        elif key not in want:
            add("schema", f"{kind} {name} is not created by any migration",
                table=have[key][0] or None)
        elif want[key] != have[key]:
            add("schema", f"{kind} {name} differs from its migration"
                + ("" if kind != "trigger" or not have[key][1].endswith(" D")
                   else " (it is disabled)"), table=have[key][0] or None)
    files = {v: (n, c) for v, n, c, _s in pg_migrations()[:version]}
    for v in sorted(files.keys() | recorded.keys()):
        if recorded.get(v) != files.get(v):
            add("schema", f"postgresql_migration row {v} does not match "
                f"schema/postgresql/{v:03d}_{files.get(v, ('?',))[0]}.sql",
                table="postgresql_migration", row_id=v)
    return len(have)
