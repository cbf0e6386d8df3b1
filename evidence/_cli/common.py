"""What every command group shares: the parser's form, the output helpers, argument types.

- ``Parser`` and its help formatter: every option's default shown, usage errors as
  ``Error:`` / ``Try:`` lines with exit status 2 (``error_text`` is that form, for
  ``main``'s boundary too);
- ``print_json`` (the one JSON printer), ``write_output``, ``format_bytes``, ``confirm``;
- the argument types (whole numbers, seconds, durations), so ``--workers 0`` or
  ``--grace 1x`` is a usage error in the same words in every command;
- ``Progress``, the phase-and-count line long library calls report through, and
  ``log_to``, which keeps log lines off a live progress line;
- ``add_listen_options`` / ``listen_options``: listening beyond the Unix socket (TCP, TLS,
  the token), for ``crawl`` taking worker hosts and ``serve``;
- the store location (``STORE`` or ``--store``) of every command, which ``Parser`` gives a
  ``--dsn-file FILE`` beside it, and a warning when a password is typed on the command line
  (``_StoreLocation``).

Each command group (``crawl``, ``archive``, ``convert``, ``verify``, ``proofs``,
``replay``, ``rules``, ``service``, ``hosts``) imports from here and from the library,
never from another group.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import stat
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, NoReturn

import msgspec

if TYPE_CHECKING:
    from .._write.tls import TLSFiles

__all__ = ["Parser", "Progress", "add_listen_options", "confirm", "error_text",
           "format_bytes", "integer", "listen_options", "log_to", "non_negative",
           "parse_duration", "positive", "positive_seconds", "print_json", "seconds",
           "write_output"]


# --- the parser's form ----------------------------------------------------------------

def error_text(message: str, hint: str | None) -> str:
    """A user error as the CLI prints it: ``Error:``, then ``Try:`` when there is a hint."""
    return f"Error: {message}\n" + (f"Try: {hint}\n" if hint else "")


class _Help(argparse.HelpFormatter):
    """Shows every option's default: "(default X)" after its help, unless the help already
    says what happens without the option."""

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
        if action.dest == "store" and action.type is None and self._location is None:
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

    def error(self, message: str) -> NoReturn:
        self.exit(2, error_text(message, f"{self.prog} --help"))


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
        from .._store.location import is_postgres_location, redact

        if any(is_postgres_location(text) and redact(text) != text
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
    from .._store.location import is_postgres_location

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
    if not is_postgres_location(text):
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


def format_bytes(n: float) -> str:
    """``512 B``, ``1.5 KiB``, ... ``3.0 GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


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
    """Log lines that first clear a live progress line, so the two never share a line."""

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(self.stream, "isatty", lambda: False)():
            self.stream.write("\r\x1b[K")
        super().emit(record)


def log_to(stream: IO[str]) -> None:
    """Log INFO and up to ``stream``, time-stamped."""
    handler = _TerminalLogHandler(stream)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])


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


def listen_options(args: argparse.Namespace) -> tuple[str | None, TLSFiles | None,
                                                      str | None]:
    """The listening options, each checked now: the address (a non-loopback one needs
    TLS), the certificate and key (loaded once to see they work), the token file."""
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
        if token is None:
            raise ServiceError("listening on a TCP port needs a token",
                               hint="add --token-file FILE (mode 600)")
    return args.listen, tls, token
