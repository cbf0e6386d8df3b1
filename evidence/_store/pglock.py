"""One writer per PostgreSQL store: the writer's lock, and the dialect whose write
transactions take it.

The writer's connection holds a session-level advisory lock (``WRITER_LOCK``) for its
whole life; a second writer waits for it (a standby) or is refused, and every write
transaction also takes the transaction-level form of the same lock (``POSTGRESQL``'s
``begin_write``), so any other write (a migration, ``evidence init``) waits for the
writer. Advisory locks belong to one database, which is one store: a fixed key is enough.
Who holds the lock is read from the server (``lock_holder``: the holder's application
name, which ``pgconn.connect`` sets to its pid and host).
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable

from .._errors import StoreError
from .backend import Dialect
from .location import redact
from .pgconn import DEFAULT_LOCK_TIMEOUT_MS, PgConnection

__all__ = ["POSTGRESQL", "WRITER_LOCK", "holder_pid", "lock_holder", "release_writer_lock",
           "take_writer_lock"]

# One writer per store. Advisory locks belong to one database, which is one store, so a
# fixed key is enough: ('evid', 1).
WRITER_LOCK = (0x65766964, 1)
_LOCK_ARGS = f"{WRITER_LOCK[0]}, {WRITER_LOCK[1]}"

POSTGRESQL = Dialect(
    name="postgresql",
    # The transaction-level form of the writer's lock: re-entrant for the writer's own
    # connection (it holds the session-level one), a wait for any other.
    begin_write=f"BEGIN ISOLATION LEVEL READ COMMITTED; SELECT pg_advisory_xact_lock({_LOCK_ARGS})",
    begin_read="BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",
    list_member="{column} = ANY({param})",
    encode_list=list,
    returning=True,
)


def lock_holder(conn: PgConnection) -> str | None:
    """Who holds the store's writer lock: its application name (pid and host) and since
    when; None if nobody does."""
    rows = conn.raw.execute(
        "SELECT a.application_name, a.client_addr::text, a.backend_start::text "
        "FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = "
        "'advisory' AND l.granted AND l.database = (SELECT oid FROM pg_database WHERE "
        "datname = current_database()) AND l.classid = %s AND l.objid = %s AND "
        "l.objsubid = 2", WRITER_LOCK).fetchall()
    if not rows:
        return None
    name, addr, since = rows[0]
    return f"{name or 'a connection'}{f' from {addr}' if addr else ''}, connected since {since}"


def holder_pid(conn: PgConnection) -> tuple[int, str] | None:
    """(pid, host) of the process holding the writer lock, from its application name."""
    holder = lock_holder(conn)
    match = re.search(r"evidence pid=(\d+) host=(\S+)", holder or "")
    return (int(match[1]), match[2].rstrip(",")) if match else None


DEAD_HOLDER_WAIT_MS = 10_000  # a killed holder's server session ends within this


def take_writer_lock(conn: PgConnection, *, wait: bool,
                     on_wait: Callable[[str], None] | None = None) -> None:
    """Hold the store's writer lock on ``conn`` (session level: until it is released or
    the connection ends, however the process ends). ``wait``: as a standby, until the
    holder is gone; else refused at once, naming the holder, unless the holder is a
    process of this host that no longer exists (killed a moment ago: the server ends its
    session when it notices, and the lock with it), which is waited for, boundedly."""
    if conn.raw.execute(f"SELECT pg_try_advisory_lock({_LOCK_ARGS})").fetchall()[0][0]:
        return
    holder = lock_holder(conn) or "another connection"
    where = redact(conn.location)
    timeout = 0  # no bound: a standby waits as long as the holder lives
    if not wait:
        found = holder_pid(conn)
        if found is None or found[1] != socket.gethostname() or _alive(found[0]):
            raise StoreError(f"{where}: another writer holds this store ({holder})",
                             hint="stop it first (one writer per store), or start this one "
                             "as a standby that takes over when it ends", path=where)
        timeout = DEAD_HOLDER_WAIT_MS
    elif on_wait is not None:
        on_wait(holder)
    conn.raw.execute(f"SET lock_timeout = {timeout}")
    try:
        conn.raw.execute(f"SELECT pg_advisory_lock({_LOCK_ARGS})")
    finally:
        if not conn.broken:
            conn.raw.execute(f"SET lock_timeout = {DEFAULT_LOCK_TIMEOUT_MS}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def release_writer_lock(conn: PgConnection) -> None:
    if not conn.broken:
        conn.raw.execute(f"SELECT pg_advisory_unlock({_LOCK_ARGS})")
