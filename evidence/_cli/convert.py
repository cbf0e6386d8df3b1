"""The ``convert`` command: a store's payload files moved into artifact packs.

A few lines over ``_store.convert.convert_to_packs``: progress on stderr (a terminal only),
``--json`` for scripts. Nothing converts a store but this command (docs/store.md).
"""

from __future__ import annotations

import argparse

from .common import Progress, local_directory, print_json

__all__ = ["add_commands"]


def _cmd_convert(args: argparse.Namespace) -> int:
    from .._store.convert import convert_to_packs

    with Progress() as progress:
        report = convert_to_packs(args.store, progress=progress)
    if args.json:
        print_json(report)
        return 0
    if report.payloads == 0:
        print(f"{report.path}: payloads are in packs already; nothing to convert")
        return 0
    print(f"{report.path}: {report.packed} payload file(s) packed ({report.packed_bytes:,} "
          f"bytes), {report.already_packed} packed by an earlier run, {report.removed} "
          f"file(s) removed")
    for path in report.kept:
        print(f"  kept {path}: its bytes do not hash to its name (run evidence verify --full)")
    return 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``convert`` to the ``evidence`` command's subparsers."""
    p = sub.add_parser(
        "convert", help="move a store's payload files into artifact packs",
        description="Move every payload file of STORE (one file per payload: stores made "
        "before packs) into artifact packs, then remove the files. Nothing else converts "
        "a store. Safe to kill and run again: it carries on where it stopped, and no file "
        "is removed before its bytes are in a sealed pack. The database is not changed: "
        "exports, reports and proofs are the same afterwards. Stop crawls and services on "
        "the store first (a running crawl makes it refuse). See docs/store.md.")
    p.add_argument("store", type=local_directory, metavar="STORE",
                   help="the store directory")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=_cmd_convert)
