"""Write docs/cli.md from the command's own --help texts.

    python tools/gen_cli_docs.py          # rewrite docs/cli.md
    python tools/gen_cli_docs.py --check  # exit 1 if docs/cli.md is out of date

tests/test_docs.py runs the check, so the reference never drifts from the code.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from evidence._cli.main import build_parser

DOC = Path(__file__).resolve().parent.parent / "docs" / "cli.md"


def render() -> str:
    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal: fix it for stable output
    parser = build_parser()
    parts = ["# Command reference\n",
             "Generated from `--help` by `tools/gen_cli_docs.py`; do not edit by hand.\n",
             "```\n" + parser.format_help() + "```\n"]
    _commands(parser, "evidence", parts, level=2)
    return "\n".join(parts)


def _commands(parser: argparse.ArgumentParser, prefix: str, parts: list[str], *,
              level: int) -> None:
    """Every subcommand's help, recursing into nested ones (``evidence rules evaluate``)."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        for name, command in action.choices.items():
            parts.append(f"{'#' * level} {prefix} {name}\n")
            parts.append("```\n" + command.format_help() + "```\n")
            _commands(command, f"{prefix} {name}", parts, level=level + 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if docs/cli.md is stale")
    args = parser.parse_args()
    text = render()
    if args.check:
        if not DOC.exists() or DOC.read_text() != text:
            print("docs/cli.md is out of date: run python tools/gen_cli_docs.py",
                  file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text)
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
