"""Secrets stay out of argv, errors and logs (issue 30 point 8).

A PostgreSQL password comes from libpq's own places (~/.pgpass, PGPASSFILE, PGPASSWORD) or
from ``--dsn-file FILE``, which every command taking a store location has; one typed in a
connection string on the command line is warned about. Errors show a location without its
password, and an s3:// location's options (one may hold anything) are never echoed. The
PostgreSQL tests run against the session's real cluster, with a role that needs a password
over TCP (scram-sha-256, added to pg_hba.conf for that role only).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evidence._errors import ArtifactError
from evidence._store.location import redact
from evidence._store.s3location import S3Location

PASSWORD = "pw-Zq81x-never-shown"


@dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def evidence(capsys: pytest.CaptureFixture[str]) -> Callable[..., Done]:
    """Run ``evidence ARGS`` in this process (its parser and its error boundary, as the
    command line has them): the exit status and what it printed."""
    from evidence._cli.main import main

    def run(*args: str) -> Done:
        capsys.readouterr()
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse's usage errors, and --dsn-file's
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        return Done(code, out, err)

    return run


def test_a_password_on_the_command_line_is_warned_about_and_never_shown(evidence) -> None:
    for location in (f"postgresql://someone:{PASSWORD}@127.0.0.1:1/db",
                     f"host=127.0.0.1 port=1 dbname=db user=someone password={PASSWORD}"):
        done = evidence("verify", location)
        assert done.returncode == 2
        assert "Warning: the connection string on this command line holds a password" in \
            done.stderr
        assert "--dsn-file FILE" in done.stderr and "PGPASSFILE" in done.stderr
        assert "Error: " in done.stderr
        assert PASSWORD not in done.stdout + done.stderr


def test_no_warning_without_a_password_on_the_command_line(evidence) -> None:
    done = evidence("verify", "postgresql://someone@127.0.0.1:1/db")
    assert done.returncode == 2 and "Warning" not in done.stderr


def test_a_dsn_file_others_may_read_is_refused_without_showing_it(
        evidence, tmp_path: Path) -> None:
    dsn = tmp_path / "dsn"
    dsn.write_text(f"postgresql://someone:{PASSWORD}@127.0.0.1:1/db\n")
    dsn.chmod(0o644)
    done = evidence("verify", "--dsn-file", str(dsn))
    assert done.returncode == 2
    assert done.stderr == (f"Error: --dsn-file {dsn}: other users may read it, and it holds "
                           f"a password\nTry: chmod 600 {dsn}\n")
    dsn.chmod(0o600)
    dsn.write_text(f"not a connection string {PASSWORD}")
    done = evidence("verify", "--dsn-file", str(dsn))
    assert done.returncode == 2 and "does not hold a PostgreSQL connection string" in done.stderr
    assert PASSWORD not in done.stderr


def test_every_command_with_a_store_location_takes_a_dsn_file() -> None:
    from evidence._cli.main import build_parser

    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    with_store = {name for name, sub in commands.items()
                  if any(a.dest == "store" for a in sub._actions)}
    with_dsn_file = {name for name, sub in commands.items()
                     if any(a.dest == "dsn_file" for a in sub._actions)}
    assert {"init", "crawl", "serve", "verify", "export", "restore"} <= with_store
    # convert and demo take a directory only
    assert with_store - {"convert", "demo"} == with_dsn_file


# --- against the real PostgreSQL cluster ------------------------------------------------

@pytest.fixture
def password_db(pg_cluster, tmp_path: Path) -> str:
    """A database owned by a role that must give its password over TCP: its URL without
    the password."""
    role = f"pw{os.getpid()}_{len(list(tmp_path.parent.iterdir()))}"
    pg_cluster.sql(f"CREATE ROLE {role} LOGIN PASSWORD '{PASSWORD}'")
    pg_cluster.sql(f'CREATE DATABASE "{role}" OWNER {role} TEMPLATE template0')
    hba = pg_cluster.data / "pg_hba.conf"
    rule = f"host all {role} 127.0.0.1/32 scram-sha-256\n"
    stat = hba.stat()
    hba.write_text(rule + hba.read_text())  # before the trust lines: the first match wins
    os.chown(hba, stat.st_uid, stat.st_gid)
    pg_cluster.sql("SELECT pg_reload_conf()")
    return f"postgresql://{role}@127.0.0.1:{pg_cluster.port}/{role}"


def test_a_dsn_file_and_pgpassword_reach_a_store_that_needs_a_password(
        evidence, password_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("DEBUG")
    with_password = password_db.replace("@", f":{PASSWORD}@", 1)
    dsn = tmp_path / "dsn"
    dsn.write_text(with_password + "\n")
    dsn.chmod(0o600)
    outputs = []

    made = evidence("init", "--dsn-file", str(dsn), "--artifacts", str(tmp_path / "payloads"))
    outputs.append(made)
    assert made.returncode == 0, made.stderr
    checked = evidence("verify", "--dsn-file", str(dsn))
    outputs.append(checked)
    assert checked.returncode == 0, checked.stderr
    without = evidence("verify", password_db)  # no password anywhere: refused by the server
    outputs.append(without)
    assert without.returncode == 2 and "Error:" in without.stderr
    monkeypatch.setenv("PGPASSWORD", PASSWORD)  # libpq reads it at each connect
    from_env = evidence("verify", password_db)
    monkeypatch.delenv("PGPASSWORD")
    outputs.append(from_env)
    assert from_env.returncode == 0, from_env.stderr
    dsn.write_text(with_password.replace(PASSWORD, PASSWORD + "-wrong") + "\n")
    wrong = evidence("verify", "--dsn-file", str(dsn))
    outputs.append(wrong)
    assert wrong.returncode == 2 and "Error:" in wrong.stderr
    assert not any("Warning" in done.stderr for done in outputs)
    assert not any(PASSWORD in done.stdout + done.stderr for done in outputs)
    assert PASSWORD not in caplog.text  # nor in any log line


# --- what errors show -------------------------------------------------------------------

def test_a_mistyped_s3_option_is_named_without_its_value_or_the_query() -> None:
    with pytest.raises(ArtifactError) as info:
        S3Location("s3://bucket/crawls?region=eu&secret_key=hunter2-value&endpoint="
                   "http://127.0.0.1:9000")
    message = str(info.value)
    assert "'secret_key'" in message
    assert "hunter2" not in message and "?" not in message and "127.0.0.1" not in message


def test_a_mistyped_s3_option_on_the_command_line_is_not_echoed(
        evidence, tmp_path: Path) -> None:
    done = evidence("init", str(tmp_path / "s"), "--artifacts",
                    "s3://bucket/p?secret=hunter2-value")
    assert done.returncode == 2 and "unknown option 'secret'" in done.stderr
    assert "hunter2" not in done.stdout + done.stderr
    assert not (tmp_path / "s").exists()


_SAFE = st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                                "-._~!$&*+,;:"), min_size=1, max_size=24)
_ANY = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1,
               max_size=24)


def _libpq_escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'").replace(" ", "\\ ")


@given(password=_SAFE, form=st.sampled_from(["uri", "uri-query"]))
def test_any_password_is_redacted_from_a_shown_uri(password: str, form: str) -> None:
    secret = "SECRET" + password
    location = {
        "uri": f"postgresql://user:{secret}@127.0.0.1:5432/db?sslmode=disable",
        "uri-query": f"postgresql://user@127.0.0.1/db?password={secret}&sslmode=disable",
    }[form]
    assert "SECRET" not in redact(location)


@given(password=_ANY, quoted=st.booleans())
def test_any_password_is_redacted_whole_from_a_shown_keyword_string(password: str,
                                                                    quoted: bool) -> None:
    """Any value libpq would read as the password (quoted, or unquoted with backslash
    escapes: a space in it does not end it) is replaced whole."""
    value = _libpq_escaped(password)
    value = f"'{value}'" if quoted else value
    assert redact(f"host=127.0.0.1 password={value} dbname=db") == \
        "host=127.0.0.1 password=*** dbname=db"
