#!/usr/bin/env python3
"""Benchmark the rules report (issue 13): its HTML page at 100,000 verdicts.

A store is generated through ``evidence.Writer``: ``--verdicts / 4`` pages (fetch attempts
sharing one response head and body), each judged by four rules (RuleEvaluated messages as
``evidence rules evaluate`` would record them): ``fast`` (max_response_time 1000 ms: its
reason names each page's own time), ``hsts`` (header), ``has-h1`` (selector) and
``copyright`` (regex). Each rule fails on ``--failure-rate`` of the pages, chosen at random
with a fixed seed. Then, in the same run, on that store:

  report     ``report(store, run)``: the one read-only snapshot every format starts from;
  baseline   the HTML page as it was before issue 13 (commit 1ae2cb6: every failure in one
             table with its evidence), kept below as ``baseline_html``;
  html       today's page: failures grouped by rule and reason with counts, each group's
             first ``--per-group`` failures (50) listed with their evidence;
  text/json  the complete listings, for scale.

Sizes are the bytes written; times are wall-clock medians of ``--reps`` renders (3).

Examples:
  python tools/bench_report.py --quick           # 10,000 verdicts, a few seconds
  python tools/bench_report.py                   # 100,000 verdicts: docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import html
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import msgspec

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evidence import (  # noqa: E402
    FetchAttempt,
    RuleEvaluated,
    RunEnded,
    RunStarted,
    SessionStarted,
    Store,
    Writer,
    utc_now,
)
from evidence._audit.report import (  # noqa: E402
    _CSS,
    VERDICTS,
    RunReport,
    render_html,
    render_json,
    render_text,
    report,
)

HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\n"
        b"Content-Length: 64\r\n\r\n")
BODY = b"<!doctype html><html><body><p>Copyright 2025</p></body></html>"
RULES = ("fast", "hsts", "has-h1", "copyright")


def _verdict(rule: str, failing: bool, elapsed: float) -> tuple[str, dict[str, object]]:
    if rule == "fast":
        ok = not failing
        return ("pass" if ok else "fail"), {
            "reason": f"the response took {elapsed:g} ms; the limit is 1000 ms",
            "elapsed_ms": elapsed, "max_ms": 1000}
    if rule == "hsts":
        return ("fail", {"reason": "required header strict-transport-security is absent",
                         "value": None}) if failing else (
            "pass", {"reason": "header strict-transport-security is present"})
    if rule == "has-h1":
        return ("fail", {"reason": "selector `h1` not found in the document; it must be",
                         "matches": 0}) if failing else (
            "pass", {"reason": "selector `h1` found in the document", "matches": 1})
    return ("fail", {"reason": "pattern `Copyright \\d{4}` not found in the body; it must "
                     "be"}) if failing else (
        "pass", {"reason": "pattern `Copyright \\d{4}` found in the body"})


async def generate(store: Store, pages: int, failure_rate: float, seed: int) -> None:
    rng = random.Random(seed)
    head = store.artifacts.put("headers", HEAD)
    body = store.artifacts.put("body", BODY)
    now = utc_now()
    async with Writer(store) as writer:
        await writer.submit_group([
            SessionStarted(message_id="m-session", session_id="s1", started_at=now),
            RunStarted(message_id="m-run", run_id="r1", session_id="s1", started_at=now)])
        group: list = []
        for i in range(pages):
            url = f"http://example.com/page/{i}"
            elapsed = round(rng.uniform(50, 3000), 1)
            group.append(FetchAttempt(
                message_id=f"m-a{i}", attempt_id=f"a{i}", run_id="r1", url=url, sequence=1,
                started_at=now, elapsed_ms=elapsed, outcome="response", http_status=200,
                response_headers=head, body=body, content_type="text/html"))
            for rule in RULES:
                verdict, details = _verdict(rule, rng.random() < failure_rate, elapsed)
                group.append(RuleEvaluated(
                    message_id=f"m-{rule}-{i}", run_id="r1", url=url, rule_id=rule,
                    rule_version="1", input_hash=f"{i:064x}", verdict=verdict,
                    evaluated_at=now, attempt_id=f"a{i}", details=details))
            if len(group) >= 500:
                await writer.submit_group(group)
                group = []
        group.append(RunEnded(message_id="m-end", run_id="r1", ended_at=now,
                              outcome="completed", reason="done"))
        await writer.submit_group(group)


def baseline_html(data: RunReport) -> str:
    """The HTML page before issue 13 (commit 1ae2cb6), unchanged but for its name: every
    failure in one table, each with its evidence and details. The baseline."""
    e = html.escape
    rows = []
    for t in data.rules:
        v = t.verdicts
        rows.append(
            f'<tr class="rule" data-rule="{e(t.rule_id)}" data-version="{e(t.rule_version)}">'
            f"<td>{e(t.rule_id)}</td><td>{e(t.rule_version)}</td>"
            + "".join(f'<td class="n">{v[k]}</td>' for k in VERDICTS)
            + f'<td class="n">{t.not_evaluated}</td>'
            f'<td class="hash">{"<br>".join(e(h) for h in t.rule_hashes)}</td></tr>')
    failures = []
    for f in data.failures:
        details = e(msgspec.json.format(msgspec.json.encode(f.details).decode()))
        failures.append(
            f'<tr class="{e(f.verdict)}" data-rule="{e(f.rule_id)}" '
            f'data-attempt="{e(f.attempt_id)}">'
            f'<td class="verdict">{e(f.verdict)}</td>'
            f"<td>{e(f.rule_id)} v{e(f.rule_version)}</td>"
            f'<td class="url"><code>{e(f.url)}</code></td>'
            f"<td><code>{e(f.attempt_id)}</code><br>HTTP {e(str(f.http_status))}<br>"
            f"{e(f.started_at)}</td>"
            f'<td class="reason">{e(f.reason)}</td>'
            f'<td class="hash">input {e(f.input_hash)}<br>head '
            f"{e(f.response_headers_digest or '-')}<br>body {e(f.body_digest or '-')}<br>"
            f"log #{f.evaluation_log_index} (attempt #{f.attempt_log_index})</td>"
            f"<td><details><summary>details</summary><pre>{details}</pre></details></td>"
            "</tr>")
    omitted = (f"<p>{data.failures_omitted} more not listed.</p>"
               if data.failures_omitted else "")
    summary = (
        '<table id="rules"><thead><tr><th>rule</th><th>version</th><th>pass</th>'
        "<th>fail</th><th>error</th><th>n/a</th><th>not evaluated</th>"
        "<th>definition hash</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
        if rows else "<p>No rule verdicts in this run.</p>")
    listing = (
        '<table id="failures"><thead><tr><th>verdict</th><th>rule</th><th>URL</th>'
        "<th>attempt</th><th>reason</th><th>evidence</th><th></th></tr></thead><tbody>"
        + "".join(failures) + "</tbody></table>" if failures else "<p>None.</p>")
    total = len(data.failures) + data.failures_omitted
    return (
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        "<meta http-equiv=\"Content-Security-Policy\" "
        "content=\"default-src 'none'; style-src 'unsafe-inline'\">\n"
        f"<title>Rules report: run {e(data.run_id)}</title>\n<style>{_CSS}</style>\n"
        "</head>\n<body>\n"
        f"<h1>Rules report: run <code>{e(data.run_id)}</code></h1>\n<dl>"
        f"<dt>session</dt><dd><code>{e(data.session_id)}</code></dd>"
        f"<dt>run</dt><dd>{e(data.run_outcome or 'running')}, started "
        f"{e(data.run_started_at)}, ended {e(data.run_ended_at or '-')}</dd>"
        f"<dt>store</dt><dd><code>{e(data.store_id)}</code></dd>"
        f"<dt>log</dt><dd>size {data.log_size}, root "
        f'<span class="hash">{e(data.log_root)}</span></dd>'
        f'<dt>pages</dt><dd id="pages">{data.pages} (current attempt per URL with an HTTP '
        "response)</dd></dl>\n"
        f"<h2>Verdicts per rule</h2>\n{summary}\n"
        f'<h2>Failures and errors (<span id="failure-count">{total}</span>)</h2>\n'
        f"{listing}\n{omitted}\n</body>\n</html>\n")


def timed(fn: Callable[[], object], reps: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(reps):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--verdicts", type=int, default=100_000,
                        help="rule verdicts in the run (four per page)")
    parser.add_argument("--failure-rate", type=float, default=0.3,
                        help="share of pages each rule fails")
    parser.add_argument("--per-group", type=int, default=50,
                        help="failures listed per group in today's HTML")
    parser.add_argument("--reps", type=int, default=3, help="renders timed per format")
    parser.add_argument("--seed", type=int, default=13,
                        help="the generator's seed (the same seed, the same run)")
    parser.add_argument("--quick", action="store_true", help="10,000 verdicts")
    args = parser.parse_args(argv)
    verdicts = 10_000 if args.quick else args.verdicts
    pages = max(1, verdicts // len(RULES))
    with tempfile.TemporaryDirectory(prefix="bench-report-") as tmp:
        with Store.create(Path(tmp) / "store", sync="normal") as store:
            started = time.perf_counter()
            anyio.run(generate, store, pages, args.failure_rate, args.seed)
            print(f"generated {pages:,} pages, {pages * len(RULES):,} verdicts in "
                  f"{time.perf_counter() - started:.1f} s", file=sys.stderr)
            query, data = timed(lambda: report(store, "r1"), args.reps)
        assert isinstance(data, RunReport)
        rows = [("report (query)", query, None)]
        for name, render in (
                ("html, baseline", baseline_html),
                ("html", lambda d: render_html(d, per_group=args.per_group)),
                ("text", render_text), ("json", render_json)):
            seconds, text = timed(lambda r=render: r(data), args.reps)
            rows.append((name, seconds, len(str(text).encode())))
    failures = len(data.failures)
    print(f"{pages * len(RULES):,} verdicts on {pages:,} pages, {failures:,} failures in "
          f"{len(data.groups)} groups (rule and reason); median of {args.reps}")
    print(f"{'':<16} {'seconds':>8} {'bytes':>14} {'vs baseline':>12}")
    base = next(size for name, _s, size in rows if name == "html, baseline")
    for name, seconds, size in rows:
        ratio = f"{size / base:.4f}" if size is not None and name.startswith("html") else ""
        print(f"{name:<16} {seconds:>8.3f} {size or '':>14,} {ratio:>12}" if size is not None
              else f"{name:<16} {seconds:>8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
