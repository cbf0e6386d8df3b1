"""What every command group shares: the parser's form, the output helpers, argument types.

- ``Parser`` and its help formatter: every option's default shown, usage errors as
  ``Error:`` / ``Try:`` lines with exit status 2 (``error_text`` is that form, for
  ``main``'s boundary too);
- ``print_json`` (the one JSON printer), ``write_output``, ``format_bytes``, ``confirm``;
- the argument types (whole numbers, seconds, durations), so ``--workers 0`` or
  ``--grace 1x`` is a usage error in the same words in every command;
- ``Progress``, the phase-and-count line long library calls report through, and
  ``log_to``, which keeps log lines off a live progress line; ``configure_logs`` and
  ``add_log_options``: the log format and level every command takes;
- ``add_listen_options`` / ``listen_options``: listening beyond the Unix socket (TCP, TLS,
  the token), for ``crawl`` taking worker hosts and ``serve``.

Each command group (``crawl``, ``archive``, ``convert``, ``verify``, ``proofs``,
``replay``, ``rules``, ``service``, ``hosts``) imports from here and from the library,
never from another group.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, NoReturn

import msgspec

if TYPE_CHECKING:
    from .._write.tls import TLSFiles

__all__ = ["Parser", "Progress", "add_listen_options", "add_log_options", "add_metrics_options",
           "configure_logs",
           "confirm", "error_text", "format_bytes", "integer", "listen_options", "log_to",
           "logs_are_json", "non_negative", "parse_duration", "positive", "positive_seconds",
           "print_json", "seconds", "write_output"]


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
    """Usage errors in the CLI's own form: ``Error:`` and ``Try:`` lines, exit status 2."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("formatter_class", _Help)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def error(self, message: str) -> NoReturn:
        self.exit(2, error_text(message, f"{self.prog} --help"))


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
