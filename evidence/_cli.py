"""The ``evidence`` command: a thin layer over the library, one function per subcommand.

Every subcommand has ``--help``; those a script would read have ``--json``. Errors print
``Error: <message>`` and ``Try: <hint>`` on stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

import msgspec

from ._errors import EvidenceError
from ._status import StoreStatus, status
from ._store import Store

__all__ = ["main"]


def _cmd_init(args: argparse.Namespace) -> int:
    with Store.create(args.store, sync=args.sync) as store:
        print(f"store {store.store_id} ready at {store.path} (schema v{store.schema_version})")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    with Store.open(args.store) as store:
        report = status(store)
    if args.json:
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(report).decode()) + "\n")
    else:
        print(_format_status(report))
    return 0


def _format_status(s: StoreStatus) -> str:
    lines = [
        f"store      {s.path}",
        f"id         {s.store_id}  (schema v{s.schema_version}, normalizer "
        f"v{s.normalizer_version}, sync={s.sync})",
        f"log        {s.tree_size} messages, root {s.root[:16]}…, last commit "
        f"{s.last_commit_at or 'never'}",
        f"artifacts  {s.rows['artifact']} ({_bytes(s.artifact_bytes)})",
        f"attempts   {s.rows['fetch_attempt']}   edges {s.rows['discovery_edge']}   "
        f"urls {s.rows['url_identity']}   rule verdicts {s.rows['rule_evaluation']}",
        f"quarantine {s.quarantined} ({s.conflicts} conflicts)",
        f"wal        {_bytes(s.wal_bytes)}",
    ]
    if s.sessions:
        lines.append("sessions")
        lines += [f"  {x.session_id}  {x.mode:<11} {x.outcome or 'open':<9} runs {x.runs}  "
                  f"started {x.started_at}" for x in s.sessions]
    if s.runs:
        lines.append("runs")
        lines += [f"  {r.run_id}  {r.outcome or 'running':<9} attempts {r.attempts}  "
                  f"session {r.session_id}" for r in s.runs]
    return "\n".join(lines)


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    raise AssertionError("unreachable")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="evidence",
        description="An audit-grade evidence store for web crawl pipelines.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("init", help="create an evidence store",
                       description="Create an evidence store (a directory holding "
                       "evidence.db and artifacts/). Opening an existing store is harmless.")
    p.add_argument("store", metavar="STORE", help="the store directory")
    p.add_argument("--sync", choices=("full", "normal"), default="full",
                   help="full (default): every commit survives power loss; normal: survives "
                   "a process crash, may lose the last commits on power loss")
    p.set_defaults(func=_cmd_init)

    p = sub.add_parser("status", help="show what a store holds",
                       description="Show sessions, runs, row counts, the Merkle log head, "
                       "quarantine and WAL size, from one short read-only snapshot.")
    p.add_argument("store", metavar="STORE", help="the store directory")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.set_defaults(func=_cmd_status)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except EvidenceError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        if exc.hint:
            print(f"Try: {exc.hint}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
