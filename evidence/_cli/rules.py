"""The rules commands: ``rules check``, ``rules evaluate`` and ``report``.

Each a few lines over ``_crawl.rules`` and ``_audit.report``.

Exit status: 0 when all is well, 1 when ``rules evaluate`` met a
conflict, a rejection or an unreadable artifact, 2 for an error (printed by ``_cli.main``
as ``Error:`` / ``Try:``). Rule verdicts, failing ones included, are findings, not errors:
they never change the exit status.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

import msgspec

from .common import local_path, print_json, store_location, write_output

if TYPE_CHECKING:  # the commands import what they run: a CLI start loads only its own
    from .._crawl.rules import EvaluationSummary

__all__ = ["add_commands"]


def _cmd_rules_check(args: argparse.Namespace) -> int:
    from .._crawl.rulesfile import load_rules

    rules = load_rules(args.file)
    if args.json:
        print_json(rules.as_record())
        return 0
    print(f"{args.file}: {len(rules)} rule(s)")
    print(format_rules([(f"{r.id} v{r.version}", r.type, r.definition_hash) for r in rules]))
    return 0


def format_rules(rows: list[tuple[str, str, str]]) -> str:
    """Rule, type and definition hash in aligned columns, under a header."""
    rows = [("rule", "type", "definition hash"), *rows]
    widths = [max(len(row[i]) for row in rows) for i in range(2)]
    return "\n".join(f"  {a:<{widths[0]}}  {b:<{widths[1]}}  {c}" for a, b, c in rows)


def _cmd_rules_evaluate(args: argparse.Namespace) -> int:
    from .._crawl.rules import evaluate_stored
    from .._crawl.rulesfile import load_rules
    from .._store.db import Store

    rules = load_rules(args.rules)
    with Store.open(args.store) as store:
        summary = evaluate_stored(store, rules, run_id=args.run, recheck=args.recheck)
    if args.json:
        print_json(msgspec.to_builtins(summary) | {"ok": summary.ok})
    else:
        print(format_summary(summary))
    return 0 if summary.ok else 1


def format_summary(s: EvaluationSummary) -> str:
    lines = [f"judged {s.pages} page(s) of {len(s.runs)} run(s) by {len(s.rules)} rule "
             f"version(s): {s.added} verdict(s) added, {s.already_recorded} already recorded, "
             f"{s.duplicates} duplicate(s), {s.conflicts} conflict(s), {s.rejected} "
             f"rejected, {s.unreadable} page(s) unreadable"]
    for rule, counts in s.verdicts.items():
        added = ", ".join(f"{verdict} {n}" for verdict, n in counts.items()) or "nothing new"
        lines.append(f"  {rule}: {added}")
    lines += [f"  ! {p}" for p in s.problems]
    return "\n".join(lines)


def _cmd_report(args: argparse.Namespace) -> int:
    from .._audit.report import render_html, render_json, render_text, report
    from .._store.db import Store

    with Store.open(args.store, read_only=True) as store:
        data = report(store, args.run, max_failures=args.max_failures)
    if args.format == "html":
        text = render_html(data, per_group=args.per_group)
    else:
        text = {"text": render_text, "json": render_json}[args.format](data)
    write_output(text, args.out)
    return 0


def add_commands(
        subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``rules`` (check, evaluate) and ``report`` to the ``evidence`` parser."""
    p = subparsers.add_parser(
        "rules", help="check a rules file, or judge stored captures by it",
        description="Compliance rules (a TOML file of named, versioned rules; see "
        "docs/rules.md). 'rules check FILE' validates a file; 'rules evaluate STORE --rules "
        "FILE' judges stored captures again without refetching.")
    actions = p.add_subparsers(dest="rules_command", metavar="ACTION", required=True)

    c = actions.add_parser("check", help="validate a rules file and list its rules",
                           description="Validate FILE strictly (errors name the rule and the "
                           "field) and list each rule with its definition hash.")
    c.add_argument("file", metavar="FILE", help="the rules file (TOML)")
    c.add_argument("--json", action="store_true", help="print the definitions as JSON")
    c.set_defaults(func=_cmd_rules_check)

    e = actions.add_parser(
        "evaluate", help="judge stored captures by a rules file (no refetching)",
        description="Judge the pages of STORE (each run's current attempt per URL with an "
        "HTTP response) by every rule in FILE, from the stored artifacts. New verdicts are "
        "appended through the writer; recorded ones are never changed: the same rule version "
        "on the same input is skipped (or, with --recheck, judged again and acked as a "
        "duplicate; a different answer is quarantined as a conflict). Refused while a crawl "
        "runs on STORE, and for a rule whose version was recorded with another definition. "
        "Exit status 1 on a conflict, a rejection or an unreadable artifact.")
    e.add_argument("store", metavar="STORE", type=store_location,
                   help="the store directory")
    e.add_argument("--rules", required=True, metavar="FILE", help="the rules file (TOML)")
    e.add_argument("--run", metavar="ID", help="only this run's pages (default: every run)")
    e.add_argument("--recheck", action="store_true",
                   help="judge already recorded inputs again, to prove the verdicts reproduce")
    e.add_argument("--json", action="store_true", help="print the summary as JSON")
    e.set_defaults(func=_cmd_rules_evaluate)

    r = subparsers.add_parser(
        "report", help="what a run did, its rule verdicts, and each failure with evidence",
        description="Report on run ID (default: the latest run): what the crawl did (its "
        "attempts by outcome and by HTTP status, the bytes received, its session's frontier "
        "by state, failed and skipped URLs grouped by reason), then the rule verdicts "
        "per rule version, group the fail "
        "and error verdicts by rule and reason with their counts, and list each with its "
        "evidence: URL, attempt, input hash, the BLAKE3 digests of the stored response head "
        "and body, and the log indexes to prove them with. The same store always gives the "
        "same bytes. HTML is one static file with no script and no external reference; it "
        "lists the first --per-group failures of each group.")
    r.add_argument("store", metavar="STORE", type=store_location,
                   help="the store directory")
    r.add_argument("--run", metavar="ID",
                   help="the run to report on (default: the one that started last)")
    r.add_argument("--format", choices=("text", "json", "html"), default="text",
                   help="text (default), json, or a self-contained html page")
    r.add_argument("--out", metavar="FILE", type=local_path,
                   help="write to FILE instead of standard output")
    r.add_argument("--max-failures", type=int, metavar="N",
                   help="list at most N failures (the count of the rest is given; default: "
                   "all)")
    r.add_argument("--per-group", type=int, default=50, metavar="N",
                   help="html: list at most N failures of each rule-and-reason group, so the "
                   "page opens quickly at any size of run (text and json list all)")
    r.set_defaults(func=_cmd_report)
