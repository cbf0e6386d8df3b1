"""The ``evidence`` command: the parser, assembled from one module per command group, and
``main``, the one boundary where errors become what the user reads.

The groups, in the order ``evidence --help`` lists them (docs/cli.md follows it): ``crawl``
(init, crawl, diff, stop, demo, status), ``archive`` (export, backup, restore, compare),
``verify``, ``proofs`` (keygen, checkpoint, prove, check-proof), ``replay``, ``rules``
(rules, report) and ``service`` (serve). Each is a few lines per command over the library;
what they share is in ``common``.

Every subcommand has ``--help`` (every default shown); those a script would read have
``--json``. Every command logs to stderr as ``--log-format`` (text, or JSON lines) and
``--log-level`` say, given before or after the command: ``main`` sets logging up once.

A user error prints ``Error: <message>`` and ``Try: <hint>`` on stderr and exits
with status 2, changing nothing: ``main`` is the one boundary where an ``EvidenceError``
(alone, or inside a task group's exception group) and argparse's usage errors become those
two lines. Output cut short by the reader (``evidence compare A B | head``) ends quietly
with status 1, as the Python docs advise for SIGPIPE.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from .._errors import EvidenceError, only_evidence_error
from .._version import __version__
from . import archive, convert, crawl, hosts, proofs, replay, rules, service, verify
from .common import Parser, add_log_options, configure_logs, error_text

__all__ = ["build_parser", "main"]

# The command groups, in the order --help lists their commands.
GROUPS = (crawl, archive, convert, verify, proofs, replay, rules, service, hosts)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="evidence",
        description="An audit-grade evidence store for web crawl pipelines.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}",
                        help="print the version and exit")
    add_log_options(parser, shown=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for group in GROUPS:
        group.add_commands(sub)
    for command in sub.choices.values():  # accepted after the command too
        add_log_options(command, shown=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    configure_logs(None, form=args.log_format, level=args.log_level)  # to sys.stderr
    try:
        code = func(args)
        sys.stdout.flush()  # here, so a closed pipe is seen while it can be handled
        return code
    except (EvidenceError, BaseExceptionGroup) as raised:
        exc = only_evidence_error(raised)  # a task group wraps a task's error
        if exc is None:
            raise
        sys.stderr.write(error_text(str(exc), exc.hint))
        return 2
    except BrokenPipeError:
        # The reader went away (evidence compare A B | head). Python's advice for SIGPIPE:
        # point stdout at devnull so the flush at exit cannot fail again, and exit 1.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
