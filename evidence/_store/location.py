"""What a store location names: a store directory, or a PostgreSQL database.

The one place the kinds of location are told apart (``database_kind``); everything else
asks what it needs to know (``is_server_database``: no store directory, no files next to
the database; ``label``: what a message may show of it), so that another database is one
more kind here and one more opening in ``_store/db.py``, not a change at every caller.
Kept apart from ``postgresql`` so that telling them apart (every ``Store.open`` does, and
the command line's argument checks) never imports the PostgreSQL driver or SQLite; and
where a store's payloads live (its own directory, or an ``s3://`` URL), apart from ``s3``
and its HTTP client, which only an S3 store needs.
"""

from __future__ import annotations

import re
import urllib.parse
from typing import Literal

__all__ = ["DatabaseKind", "database_kind", "is_postgres_location", "is_s3_url",
           "is_server_database", "label", "redact"]

# What holds a store's tables: SQLite in a store directory, or a PostgreSQL database.
DatabaseKind = Literal["sqlite", "postgresql"]

_KEYWORDS = re.compile(r"^\s*(host|hostaddr|port|dbname|user|service|sslmode|"
                       r"application_name|connect_timeout|password|passfile)\s*=")


def is_postgres_location(location: object) -> bool:
    """A PostgreSQL connection string: a ``postgresql://`` or ``postgres://`` URI, or a
    libpq keyword/value string (``host=/run/postgresql dbname=evidence``)."""
    if not isinstance(location, str):
        return False
    return location.startswith(("postgresql://", "postgres://")) or bool(
        _KEYWORDS.match(location))


def database_kind(location: object) -> DatabaseKind:
    """Which database a store location names: a PostgreSQL connection string, or else a
    store directory (whose ``evidence.db`` is SQLite's)."""
    return "postgresql" if is_postgres_location(location) else "sqlite"


def is_server_database(location: object) -> bool:
    """The location is a database server's, not a store directory: no path to make, lock or
    mark, nothing kept next to the database."""
    return database_kind(location) != "sqlite"


def label(location: object) -> str:
    """What a message or report may show of a location: a path as it is, a connection
    string without its password."""
    return redact(str(location)) if is_server_database(location) else str(location)


def is_s3_url(spec: object) -> bool:
    """An artifact location in an S3-compatible object store: ``s3://bucket[/prefix]...``."""
    return isinstance(spec, str) and spec.startswith("s3://")


def redact(location: str) -> str:
    """The connection string without its password, for messages and reports."""
    if location.startswith(("postgresql://", "postgres://")):
        parts = urllib.parse.urlsplit(location)
        if parts.password is not None:
            netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
            parts = parts._replace(netloc=netloc)
        query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
        if any(k == "password" for k, _ in query):
            parts = parts._replace(query=urllib.parse.urlencode(
                [(k, "***" if k == "password" else v) for k, v in query], safe="/"))
        return urllib.parse.urlunsplit(parts)
    # libpq's keyword values: quoted, or up to the next ASCII space (libpq's isspace); a
    # backslash escapes the next character in both (password=a\ b is "a b": it goes whole).
    return re.sub(r"(password[ \t\n\r\f\v]*=[ \t\n\r\f\v]*)"
                  r"('(?:[^'\\]|\\.)*'|(?:[^ \t\n\r\f\v\\]|\\.)+)", r"\1***", location)


