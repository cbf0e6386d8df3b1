"""What every command group shares: the parser's form, the output helpers, argument types.

- ``Parser`` and its help formatter: every option's default shown, usage errors as
  ``Error:`` / ``Try:`` lines with exit status 2 (``error_text`` is that form, for
  ``main``'s boundary too); ``show_default``, for a default the library holds, read only
  when the help is printed;
- ``print_json`` (the one JSON printer), ``write_output``, ``confirm``;
- the argument types (whole numbers, seconds, durations), so ``--workers 0`` or
  ``--grace 1x`` is a usage error in the same words in every command; and the location
  types (``store_location``, ``archive_location``, ``local_path``...), so a location a
  command cannot use (``init s3://...``, ``export --out http://...``) is refused by its
  scheme's name before anything is created: ``s3:`` never becomes a local folder;
- ``Progress``, the phase-and-count line long library calls report through, and
  ``log_to``, which keeps log lines off a live progress line; ``configure_logs`` and
  ``add_log_options``: the log format and level every command takes;
- ``add_listen_options`` / ``listen_options``: listening beyond the Unix socket (TCP, TLS,
  the token), for ``crawl`` taking worker hosts and ``serve``;
- the store location (``STORE`` or ``--store``) of every command, which ``Parser`` gives a
  ``--dsn-file FILE`` beside it, and a warning when a password is typed on the command line
  (``_StoreLocation``).

- ``note_given``: which options the command line gave, so that a TOML file of the
  command's options (``crawl --config``, read by ``_crawl.configfile``) fills in the rest.

Each command group (``crawl``, ``archive``, ``convert``, ``verify``, ``proofs``,
``replay``, ``rules``, ``service``, ``hosts``) imports from here and from the library,
never from another group.
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
import re
import stat
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, NoReturn

import msgspec

if TYPE_CHECKING:
    from .._write.tls import TLSFiles

__all__ = ["LocationError", "Parser", "Progress", "add_listen_options", "add_log_options",
           "add_metrics_options", "archive_location", "archive_source", "artifacts_location",
           "checkpoint_location", "compare_source", "configure_logs", "confirm", "error_text",
           "integer", "listen_options", "local_directory", "local_path",
           "log_to", "logs_are_json", "non_negative", "note_given", "parse_duration", "positive",
           "positive_seconds", "print_json", "seconds", "show_default", "store_location",
           "write_output"]


# --- the parser's form ----------------------------------------------------------------

def error_text(message: str, hint: str | None) -> str:
    """A user error as the CLI prints it: ``Error:``, then ``Try:`` when there is a hint."""
    return f"Error: {message}\n" + (f"Try: {hint}\n" if hint else "")


class _Help(argparse.HelpFormatter):
    """Shows every option's default: "(default X)" after its help, unless the help already
    says what happens without the option. A default given by ``show_default`` is read
    here, when the help is printed, not when the parser is built."""

    def _expand_help(self, action: argparse.Action) -> str:
        read = getattr(action, "shown_default", None)
        if read is not None:
            action = copy.copy(action)
            action.default = read()
        return super()._expand_help(action)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if ("default" in text or not action.option_strings or action.nargs == 0
                or action.default is None or action.default is False
                or action.default == argparse.SUPPRESS):
            return text
        return text + " (default %(default)s)"


class Parser(argparse.ArgumentParser):
    """Usage errors in the CLI's own form: ``Error:`` and ``Try:`` lines, exit status 2.

    A command whose store location is an argument (``store``, positional or ``--store``)
    gets ``--dsn-file FILE`` too, and has it read as it is parsed (``_StoreLocation``):
    every command takes a PostgreSQL store the same way.
    """

    def __init__(self, *args: object, **kwargs: object) -> None:
        self._location: _StoreLocation | None = None  # before argparse adds --help
        kwargs.setdefault("formatter_class", _Help)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def add_argument(self, *names: str, **kwargs: object) -> argparse.Action:
        action = super().add_argument(*names, **kwargs)  # type: ignore[arg-type]
        if action.dest == "store" and action.type in (None, store_location) \
                and self._location is None:
            self._location = _StoreLocation(action)
            super().add_argument(
                "--dsn-file", metavar="FILE",
                help=f"read {action.metavar or 'STORE'}, a PostgreSQL connection string, from "
                "FILE (mode 600) instead of the command line, where other users of this "
                "machine can see it (ps); or keep the password in ~/.pgpass, PGPASSFILE or "
                "PGPASSWORD, which libpq reads")
        return action

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None
                         ) -> tuple[argparse.Namespace, list[str]]:
        if self._location is not None:
            args = self._location.resolve(self, list(sys.argv[1:] if args is None else args))
        return super().parse_known_args(args, namespace)

    def _check_help(self, action: argparse.Action) -> None:
        # Python 3.13+ expands each help text as it is added, to check it: a default shown
        # by ``show_default`` is read when the help is printed, not then.
        if getattr(action, "shown_default", None) is None:
            super()._check_help(action)  # type: ignore[misc]

    def error(self, message: str) -> NoReturn:
        # A location type's refusal carries its own hint: argparse raises its usage error
        # while handling the type's ``LocationError``, which is that error's context.
        cause = getattr(sys.exc_info()[1], "__context__", None)
        hint = cause.hint if isinstance(cause, LocationError) else f"{self.prog} --help"
        self.exit(2, error_text(message, hint))


def show_default(action: argparse.Action, read: Callable[[], object]) -> argparse.Action:
    """Show ``read()`` as ``action``'s default in the help (``%(default)s``), reading it
    only when the help is printed, so that building the parser imports nothing heavy: a
    limit the writer or the crawl configuration defines, say. The option's value when it is
    not given stays ``action.default`` (None: the library's own default applies)."""
    action.shown_default = read  # type: ignore[attr-defined]
    return action


_PASSWORD_WARNING = (
    "Warning: the connection string on this command line holds a password, which every user "
    "of this machine can read (ps, /proc/PID/cmdline). Keep it in ~/.pgpass (or the file "
    "PGPASSFILE names), or in PGPASSWORD, both read by libpq; or put the whole connection "
    "string in a file (mode 600) and give --dsn-file FILE instead of it.\n")


class _StoreLocation:
    """A command's store location: ``--dsn-file FILE`` read into it, and a warning for a
    password typed on the command line.

    The file's connection string is put in the arguments this process parses (first, as
    the positional STORE; or as ``--store``), never in any process's argv. It must not be
    readable by other users (as libpq requires of ~/.pgpass), and its content is never
    shown in an error: it holds a password.
    """

    def __init__(self, action: argparse.Action) -> None:
        self.action = action

    def resolve(self, parser: Parser, args: list[str]) -> list[str]:
        from .._store.location import is_server_database, redact

        if any(is_server_database(text) and redact(text) != text
               for arg in args for text in (arg, arg.partition("=")[2])):
            sys.stderr.write(_PASSWORD_WARNING)
        path = _option_value(args, "--dsn-file")
        if path is None:
            return args
        location = _read_dsn_file(parser, path)
        if not self.action.option_strings:
            return [location, *args]  # the first positional (every STORE is)
        if _option_value(args, *self.action.option_strings) is not None:
            parser.exit(2, error_text(f"give {self.action.option_strings[0]} or --dsn-file, "
                                      "not both", f"{parser.prog} --help"))
        return [*args, self.action.option_strings[0], location]


def _option_value(args: list[str], *names: str) -> str | None:
    """The value given to the option ``names`` in ``args`` (the last one), if any."""
    value = None
    for i, arg in enumerate(args):
        if arg == "--":
            break
        if arg in names and i + 1 < len(args):
            value = args[i + 1]
        for name in names:
            if arg.startswith(name + "="):
                value = arg[len(name) + 1:]
    return value


def _read_dsn_file(parser: Parser, path: str) -> str:
    """The connection string in ``path``; an unusable file exits with an error that names
    the file, never its content."""
    from .._store.location import is_server_database

    def fail(message: str, hint: str) -> NoReturn:
        parser.exit(2, error_text(f"--dsn-file {path}: {message}", hint))

    try:
        with open(path, encoding="utf-8") as file:
            mode = os.fstat(file.fileno()).st_mode
            text = file.read().strip()
    except OSError as exc:
        fail(f"cannot read it ({exc.strerror})", "give a file holding the connection string")
    except UnicodeDecodeError:
        fail("not a text file", "give a file holding the connection string")
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        fail("other users may read it, and it holds a password", f"chmod 600 {path}")
    if not is_server_database(text):
        fail("it does not hold a PostgreSQL connection string (its content is not shown)",
             "write one line: postgresql://USER:PASSWORD@HOST/DBNAME, or libpq's "
             "'host=... dbname=... password=...'")
    return text


# --- output ----------------------------------------------------------------------------

def print_json(value: object, *, one_line: bool = False) -> None:
    """``value`` (a msgspec struct, or builtins) as JSON on stdout: indented for a reader,
    or ``one_line`` for a stream a script reads line by line (flushed at once)."""
    text = msgspec.json.encode(value).decode()
    sys.stdout.write((text if one_line else msgspec.json.format(text)) + "\n")
    sys.stdout.flush()


def write_output(text: str, out: str | None) -> None:
    """``text`` to stdout, or to the file ``out`` (saying so on stderr)."""
    if out is None:
        sys.stdout.write(text)
    else:
        Path(out).write_text(text, encoding="utf-8")
        print(f"wrote {out}", file=sys.stderr)


def confirm(question: str) -> bool:
    """Ask on the terminal; no terminal (a script, a pipe) is no."""
    if not sys.stdin.isatty():
        return False
    return input(question).strip().lower() in ("y", "yes")


class Progress:
    """One line on stderr, redrawn at most 4 times a second, only on a terminal: the
    ``progress(phase, done, total)`` callback the archive functions take."""

    def __init__(self) -> None:
        self.enabled = sys.stderr.isatty()
        self._last = 0.0

    def __call__(self, phase: str, done: int, total: int) -> None:
        now = time.monotonic()
        if self.enabled and (now - self._last >= 0.25 or done == total):
            self._last = now
            sys.stderr.write(f"\r\x1b[K  {phase}: {done:,}/{total:,}")
            sys.stderr.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.enabled:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


class _TerminalLogHandler(logging.StreamHandler):
    """Log lines that first clear a live progress line, so the two never share a line
    (``clear``: JSON lines have no progress line to clear). Without a stream, to
    ``sys.stderr`` as it is when a line is written (``main`` may run more than once in a
    process that replaces it, a test's)."""

    def __init__(self, stream: IO[str] | None = None, *, clear: bool = True) -> None:
        super().__init__(stream or sys.stderr)
        self.follow = stream is None
        self.clear = clear

    def emit(self, record: logging.LogRecord) -> None:
        if self.follow:
            self.stream = sys.stderr
        if self.clear and getattr(self.stream, "isatty", lambda: False)():
            self.stream.write("\r\x1b[K")
        super().emit(record)


def log_to(stream: IO[str]) -> None:
    """Log INFO and up to ``stream``, time-stamped, unless logging is set up already (by
    ``main``, with ``--log-format`` and ``--log-level``)."""
    if not logging.getLogger().handlers:
        configure_logs(stream)


def configure_logs(stream: IO[str] | None, *, form: str = "text", level: str = "info"
                   ) -> None:
    """Log ``level`` and up (this package's lines; other libraries' from WARNING up) to
    ``stream`` (None: ``sys.stderr``, whatever it is then), as text (time, level,
    message) or as JSON lines (``_model.logs``). Replaces the handler an earlier call
    added, so calling ``main`` twice in one process logs each line once."""
    from .._model.logs import JsonFormatter, TextFormatter, set_level

    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _TerminalLogHandler)]:
        root.removeHandler(old)
    handler = _TerminalLogHandler(stream, clear=form != "json")
    handler.setFormatter(JsonFormatter() if form == "json" else TextFormatter())
    root.addHandler(handler)
    set_level(level)


def logs_are_json() -> bool:
    """Whether ``configure_logs`` set JSON lines (then stderr carries nothing else)."""
    from .._model.logs import JsonFormatter

    return any(isinstance(h, _TerminalLogHandler) and isinstance(h.formatter, JsonFormatter)
               for h in logging.getLogger().handlers)


def add_log_options(p: argparse.ArgumentParser, *, shown: bool) -> None:
    """``--log-format`` and ``--log-level``: on ``evidence`` itself, ``shown`` in its help
    with their defaults; on every command, accepted but not shown, without defaults (a
    value given before the command stays unless one is given after it)."""
    from .._model.logs import FORMATS, LEVELS

    p.add_argument("--log-format", choices=FORMATS,
                   default="text" if shown else argparse.SUPPRESS,
                   help="log lines on stderr as text, or as JSON lines for a log system "
                   "(keys and event names: docs/operations.md); before or after the "
                   "command" if shown else argparse.SUPPRESS)
    p.add_argument("--log-level", choices=LEVELS,
                   default="info" if shown else argparse.SUPPRESS,
                   help="the least severe lines logged; before or after the command"
                   if shown else argparse.SUPPRESS)


# --- argument types --------------------------------------------------------------------

def non_negative(text: str) -> int:
    value = integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return value


def positive(text: str) -> int:
    value = integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {value}")
    return value


def integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be 0 seconds or more, not {text}")
    return value


def add_outage_option(p: argparse.ArgumentParser, what: str) -> None:
    """``--db-outage-deadline``: how long a PostgreSQL store's server may be out of reach."""
    p.add_argument("--db-outage-deadline", type=positive_seconds, default=60.0,
                   metavar="SECONDS",
                   help=f"a PostgreSQL store: while its server is out of reach (a restart, a "
                   f"dropped session) {what} waits, reconnecting with backoff, and goes on; "
                   "past this many seconds of one outage it fails, with nothing acknowledged "
                   "lost (default %(default)s)")


def positive_seconds(text: str) -> float:
    value = seconds(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, not {text}")
    return value


_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd]?)")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``30m``, ``24h``, ``7d`` -> seconds."""
    match = _DURATION.fullmatch(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (try 24h, 30m, 7d)")
    return float(match[1]) * _UNITS[match[2]]


# --- listening beyond this machine (crawl --listen, serve) ----------------------------

def add_listen_options(p: argparse.ArgumentParser, *, what: str) -> None:
    """``--listen``, ``--tls-cert``, ``--tls-key`` and ``--token-file``: how a command
    (``crawl`` taking worker hosts, ``serve``) listens beyond its Unix socket."""
    p.add_argument("--listen", metavar="HOST:PORT",
                   help=f"{what} listen on this TCP address (port 0 picks one): a loopback "
                   "address, or with --tls-cert and --tls-key any address; needs "
                   "--token-file")
    p.add_argument("--tls-cert", metavar="FILE",
                   help="the certificate (PEM) the service presents on --listen")
    p.add_argument("--tls-key", metavar="FILE", help="its private key (PEM)")
    p.add_argument("--token-file", metavar="FILE",
                   help="a file (mode 600) holding the token every client must present")


def add_metrics_options(p: argparse.ArgumentParser) -> None:
    """``--metrics`` and ``--metrics-public``: a Prometheus endpoint (``crawl``, ``worker``,
    ``serve``; the metrics: docs/operations.md)."""
    p.add_argument("--metrics", metavar="HOST:PORT",
                   help="serve Prometheus metrics at http://HOST:PORT/metrics (port 0 picks "
                   "one; the address is logged): a loopback address, or any with "
                   "--metrics-public")
    p.add_argument("--metrics-public", action="store_true",
                   help="allow --metrics on an address beyond this machine: anyone who "
                   "reaches it reads the metrics (no token, no TLS)")


def listen_options(args: argparse.Namespace, *, hosts: bool = False
                   ) -> tuple[str | None, TLSFiles | None, str | None]:
    """The listening options, each checked now: the address (a non-loopback one needs
    TLS), the certificate and key (loaded once to see they work), the token file (which
    ``hosts``, a crawl's hosts file naming each host's own token, makes optional)."""
    from .._errors import ServiceError
    from .._write.tls import TLSFiles, parse_listen, server_context
    from .._write.wire import read_token

    if (args.tls_cert is None) != (args.tls_key is None):
        raise ServiceError("--tls-cert and --tls-key go together",
                           hint="give both (make a pair with 'evidence tls-cert')")
    tls = None if args.tls_cert is None else TLSFiles(cert=args.tls_cert, key=args.tls_key)
    if tls is not None:
        if args.listen is None:
            raise ServiceError("--tls-cert is for --listen", hint="add --listen HOST:PORT")
        server_context(tls)
    token = read_token(args.token_file) if args.token_file else None
    if args.listen is not None:
        parse_listen(args.listen, tls=tls is not None)
        if token is None and not hosts:
            raise ServiceError("listening on a TCP port needs a token",
                               hint="add --token-file FILE (mode 600)")
    return args.listen, tls, token


# --- what the command line gave (crawl --config fills in the rest) --------------------

def note_given(parser: argparse.ArgumentParser) -> None:
    """Make each option of ``parser`` note its dest in ``namespace.given`` when the command
    line gives it, so a configuration file fills in only what the command line left out
    (argparse itself cannot tell a default from a value the user typed). Call it once the
    parser has all its options."""
    for action in parser._actions:
        if not action.option_strings or getattr(action, "_notes_given", False):
            continue
        base = type(action)

        def call(self: argparse.Action, parser: argparse.ArgumentParser,
                 namespace: argparse.Namespace, values: object,
                 option_string: str | None = None, _base: type = base) -> None:
            namespace.__dict__.setdefault("given", set()).add(self.dest)
            _base.__call__(self, parser, namespace, values, option_string)

        action.__class__ = type(base.__name__, (base,), {"__call__": call,
                                                         "_notes_given": True})


# --- locations: what each argument may name, refused by scheme before anything is made ----

class LocationError(argparse.ArgumentTypeError):
    """A location an argument cannot take, with the hint the ``Try:`` line shows."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.hint = hint


_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
_POSTGRES = ("postgresql", "postgres")


def _scheme(text: str) -> str | None:
    match = _SCHEME.match(text)
    return match[1].lower() if match else None


def _s3(text: str) -> str:
    """An ``s3://`` URL, parsed now (a bad bucket or prefix is a usage error)."""
    from .._errors import EvidenceError
    from .._store.s3location import S3Location

    try:
        return S3Location(text).url
    except EvidenceError as exc:
        raise LocationError(str(exc), exc.hint or "give s3://BUCKET/PREFIX") from None


def store_location(text: str) -> str:
    """A store: a directory, or a PostgreSQL connection string. Never an object store: a
    database needs a file system (or a server) under it."""
    scheme = _scheme(text)
    if scheme is None or scheme in _POSTGRES:
        return text
    if scheme == "s3":
        raise LocationError(f"{text}: a store's database cannot live in S3",
                            hint="keep the store in a directory and its payloads in S3: "
                            "evidence init DIR --artifacts s3://BUCKET/PREFIX (or back it "
                            "up there: evidence backup DIR --out s3://BUCKET/PREFIX)")
    raise LocationError(f"{text}: a store cannot be at a {scheme}:// URL",
                        hint="give a store directory, or a postgresql:// connection string")


def local_path(text: str) -> str:
    """A file or directory on this machine; a URL of any scheme is refused by name."""
    scheme = _scheme(text)
    if scheme is not None:
        raise LocationError(f"{text}: this is a local file or directory, not a {scheme}:// "
                            "URL", hint="give a path on this machine")
    return text


def local_directory(text: str) -> Path:
    """``local_path``, as a ``Path``."""
    return Path(local_path(text))


def archive_location(text: str) -> str | Path:
    """Where ``export`` and ``backup`` write: a new local directory (or file), or an
    ``s3://BUCKET/PREFIX`` (docs/archives.md, "Archives in object storage")."""
    scheme = _scheme(text)
    if scheme is None:
        return Path(text)
    if scheme == "s3":
        return _s3(text)
    raise LocationError(f"{text}: an archive cannot be written to a {scheme}:// URL",
                        hint="give a new local directory or file, or s3://BUCKET/PREFIX")


def archive_source(text: str) -> str:
    """What ``restore`` reads: a local archive, or one in ``s3://BUCKET/PREFIX``."""
    scheme = _scheme(text)
    if scheme is None:
        return text
    if scheme == "s3":
        return _s3(text)
    raise LocationError(f"{text}: an archive cannot be read from a {scheme}:// URL",
                        hint="give an archive directory, or s3://BUCKET/PREFIX")


def compare_source(text: str) -> str:
    """A side of ``compare``: a store (a directory or PostgreSQL), or an archive (a
    directory or ``s3://BUCKET/PREFIX``)."""
    scheme = _scheme(text)
    if scheme == "s3":
        return _s3(text)
    if scheme is None or scheme in _POSTGRES:
        return text
    raise LocationError(f"{text}: compare reads stores and archives, not {scheme}:// URLs",
                        hint="give a store or archive directory, a postgresql:// store, or "
                        "an archive at s3://BUCKET/PREFIX")


def artifacts_location(text: str) -> str:
    """Where a store's payloads live: a directory, or ``s3://BUCKET/PREFIX[?...]``."""
    scheme = _scheme(text)
    if scheme is None or scheme == "s3":
        return text  # the URL's options are checked with the store (artifactspec)
    raise LocationError(f"{text}: payloads cannot live at a {scheme}:// URL: a store keeps "
                        "them in a directory, and the other place it can keep them is an "
                        "s3:// URL", hint="give s3://BUCKET/PREFIX, or leave out --artifacts")


def checkpoint_location(text: str) -> str:
    """Where ``crawl --checkpoint`` writes: an ``s3://BUCKET/PREFIX`` only (a checkpoint
    is for a machine whose own disk is thrown away)."""
    if _scheme(text) == "s3":
        return _s3(text)
    what = f"a {_scheme(text)}:// URL" if _scheme(text) else "a local path"
    raise LocationError(f"{text}: checkpoints go to object storage, not {what}",
                        hint="give --checkpoint s3://BUCKET/PREFIX (or back up to a "
                        "directory with 'evidence backup')")
