"""The report of one run: what the crawl did, the verdicts per rule version, and each
failure with its evidence.

    data = report(store, "run-...")      # or report(store): the latest run
    render_text(data) / render_json(data) / render_html(data)

The crawl's own part (``CrawlSummary``) needs no rules: the run's attempts by outcome and
by HTTP status, the bytes it received, and its session's frontier by state, with the
failures and skips grouped by reason (numbers that differ from URL to URL shown as "…").

One read-only snapshot. The pages of a run are its current attempts (``url_current``) that
got an HTTP response; a verdict counts only if it judged that attempt, so superseded
attempts (a 500 that was retried) never count twice. Every rule version judged in the run
gets a row, versions side by side, so "v2 said pass, v3 says fail" reads off the table.

The report is a pure function of the store's contents: no clock, no path, nothing from the
environment. It names the log size and root it was read at, so the same store (or a
restored copy) gives byte-identical output, and ``evidence prove`` can show any listed
failure is in the log (its ``evaluation_log_index``). The HTML page is static and self-
contained: inline CSS, no script, no external reference (a Content-Security-Policy of
``default-src 'none'`` says so to the browser), every stored string escaped.
"""

from __future__ import annotations

import html
import re
from typing import Any

import msgspec

from .._errors import NotFoundError
from .._store.db import Store

__all__ = ["CrawlSummary", "FailureEvidence", "FailureGroup", "ReasonCount", "RuleTally",
           "RunReport", "latest_run", "render_html", "render_json", "render_text", "report"]

VERDICTS = ("pass", "fail", "error", "not_applicable")


class RuleTally(msgspec.Struct, frozen=True, kw_only=True):
    """One rule version over the run's pages."""

    rule_id: str
    rule_version: str
    rule_hashes: list[str]  # the definitions seen (one, unless a rule was edited unversioned)
    verdicts: dict[str, int]  # every verdict, zeros included
    not_evaluated: int  # pages of the run this rule version has no verdict for


class FailureEvidence(msgspec.Struct, frozen=True, kw_only=True):
    """A ``fail`` or ``error`` verdict and what it was judged on."""

    rule_id: str
    rule_version: str
    verdict: str
    url: str  # as requested
    attempt_id: str
    http_status: int | None
    started_at: str
    input_hash: str
    response_headers_digest: str | None  # BLAKE3 of the stored response head
    body_digest: str | None  # BLAKE3 of the stored body, undecoded
    evaluated_at: str
    evaluation_log_index: int
    attempt_log_index: int
    reason: str
    details: dict[str, Any]


class FailureGroup(msgspec.Struct, frozen=True, kw_only=True):
    """Failures of one rule version with the same verdict and the same reason (numbers
    that differ from page to page, such as a response time, shown as "…")."""

    rule_id: str
    rule_version: str
    verdict: str
    reason: str  # as a sentence
    pattern: str  # the recorded reason with every number as "#": what the group shares
    count: int


class ReasonCount(msgspec.Struct, frozen=True, kw_only=True):
    """URLs of the session's frontier settled in one state for one reason."""

    reason: str  # numbers where every URL agrees, "…" where they differ
    count: int


class CrawlSummary(msgspec.Struct, frozen=True, kw_only=True):
    """What the run did, whatever rules it had."""

    attempts: int  # the run's requests and decisions not to request, robots.txt included
    outcomes: dict[str, int]  # attempts by outcome (response, network_error, timeout, ...)
    statuses: dict[str, int]  # attempts with a response, by HTTP status
    body_bytes: int  # received, as stored (the bodies of the run's attempts)
    frontier: dict[str, int]  # the session's URLs by state (queued, in_flight, done, ...)
    failed: list[ReasonCount]  # the session's failed URLs by reason, largest first
    skipped: list[ReasonCount]  # the session's skipped URLs by reason, largest first


class RunReport(msgspec.Struct, frozen=True, kw_only=True):
    store_id: str
    log_size: int  # the log the report was read at
    log_root: str
    run_id: str
    session_id: str
    run_started_at: str
    run_ended_at: str | None
    run_outcome: str | None
    pages: int  # current attempts with an HTTP response
    rules: list[RuleTally]
    failures: list[FailureEvidence]
    failures_omitted: int  # past max_failures
    groups: list[FailureGroup] = []  # every failure (listed or not), by rule and reason
    crawl: CrawlSummary | None = None  # always given by report()


def _version_key(version: str) -> tuple[int, int, str]:
    return (0, int(version), "") if version.isdigit() else (1, 0, version)


_CURRENT = """
FROM rule_evaluation e
JOIN url_current c ON c.run_id = e.run_id AND c.url_id = e.url_id
                  AND c.attempt_seq = e.attempt_seq
WHERE e.run_id = ?
"""

def latest_run(store: Store) -> str:
    """The run that started last (``NotFoundError`` in a store with no run)."""
    with store.snapshot() as conn:
        rows = conn.execute("SELECT run_id FROM crawl_run ORDER BY started_at DESC, "
                            "run_id DESC LIMIT 1").fetchall()
    if not rows:
        raise NotFoundError("the store has no run to report on",
                            hint="crawl into it first: evidence crawl URL --store STORE")
    return str(rows[0][0])


_STATES = ("queued", "in_flight", "done", "failed", "skipped")


def _crawl_summary(conn: Any, run_id: str, session_id: str) -> CrawlSummary:
    outcomes = dict(conn.execute("SELECT outcome, count(*) FROM fetch_attempt WHERE "
                                 "run_id = ? GROUP BY 1 ORDER BY 1", (run_id,)).fetchall())
    statuses = {str(s): n for s, n in conn.execute(
        "SELECT http_status, count(*) FROM fetch_attempt WHERE run_id = ? AND http_status "
        "IS NOT NULL GROUP BY 1 ORDER BY 1", (run_id,)).fetchall()}
    body_bytes = conn.execute(
        "SELECT coalesce(sum(b.size), 0) FROM fetch_attempt f JOIN artifact b "
        "ON b.artifact_id = f.body_id WHERE f.run_id = ?", (run_id,)).fetchall()[0][0]
    states = dict.fromkeys(_STATES, 0) | dict(conn.execute(
        "SELECT state, count(*) FROM frontier WHERE session_id = ? GROUP BY 1",
        (session_id,)).fetchall())

    def by_reason(state: str) -> list[ReasonCount]:
        reasons: dict[str, list[str]] = {}
        for (reason,) in conn.execute("SELECT reason FROM frontier WHERE session_id = ? "
                                      "AND state = ? ORDER BY frontier_id",
                                      (session_id, state)):
            reasons.setdefault(_shape(reason), []).append(reason)
        return sorted((ReasonCount(reason=_common(found), count=len(found))
                       for found in reasons.values()), key=lambda r: (-r.count, r.reason))

    return CrawlSummary(attempts=sum(outcomes.values()), outcomes=outcomes,
                        statuses=statuses, body_bytes=body_bytes, frontier=states,
                        failed=by_reason("failed"), skipped=by_reason("skipped"))


def report(store: Store, run_id: str | None = None, *,
           max_failures: int | None = None) -> RunReport:
    """The report of ``run_id`` (default: the latest run), read in one snapshot.
    ``NotFoundError`` if there is no such run."""
    if run_id is None:
        run_id = latest_run(store)
    with store.snapshot() as conn:
        run = conn.execute("SELECT session_id, started_at, ended_at, outcome FROM crawl_run "
                           "WHERE run_id = ?", (run_id,)).fetchall()
        if not run:
            raise NotFoundError(f"no run {run_id!r} in the store", run_id=run_id,
                                hint="'evidence status' lists the runs")
        store_id = conn.execute("SELECT value FROM store_meta WHERE key = 'store_id'"
                                ).fetchall()
        head = conn.execute("SELECT tree_size, root FROM commit_log "
                            "ORDER BY batch_seq DESC LIMIT 1").fetchall()
        pages = conn.execute(
            "SELECT count(*) FROM url_current c JOIN fetch_attempt f "
            "ON f.attempt_seq = c.attempt_seq WHERE c.run_id = ? "
            "AND f.http_status IS NOT NULL AND f.response_headers_id IS NOT NULL",
            (run_id,)).fetchall()[0][0]
        counts = conn.execute(
            "SELECT e.rule_id, e.rule_version, e.verdict, count(DISTINCT e.url_id)"
            + _CURRENT + "GROUP BY 1, 2, 3", (run_id,)).fetchall()
        judged = conn.execute(
            "SELECT e.rule_id, e.rule_version, count(DISTINCT e.url_id)" + _CURRENT
            + "GROUP BY 1, 2", (run_id,)).fetchall()
        hashes = conn.execute(
            "SELECT DISTINCT e.rule_id, e.rule_version, "
            "json_extract(e.details, '$.rule_hash')" + _CURRENT
            + "AND json_extract(e.details, '$.rule_hash') IS NOT NULL ORDER BY 1, 2, 3",
            (run_id,)).fetchall()
        failures = conn.execute(
            "SELECT e.rule_id, e.rule_version, e.verdict, f.url, f.attempt_id, "
            "f.http_status, f.started_at, e.input_hash, h.digest, b.digest, "
            "e.evaluated_at, e.log_index, f.log_index, e.details "
            "FROM rule_evaluation e "
            "JOIN url_current c ON c.run_id = e.run_id AND c.url_id = e.url_id "
            "AND c.attempt_seq = e.attempt_seq "
            "JOIN fetch_attempt f ON f.attempt_seq = e.attempt_seq "
            "LEFT JOIN artifact h ON h.artifact_id = f.response_headers_id "
            "LEFT JOIN artifact b ON b.artifact_id = f.body_id "
            "WHERE e.run_id = ? AND e.verdict IN ('fail', 'error')",
            (run_id,)).fetchall()
        crawl = _crawl_summary(conn, run_id, run[0][0])
    tallies: dict[tuple[str, str], dict[str, int]] = {}
    for rule_id, version, verdict, n in counts:
        tallies.setdefault((rule_id, version), dict.fromkeys(VERDICTS, 0))[verdict] = n
    seen = {(r, v): n for r, v, n in judged}
    rule_hashes: dict[tuple[str, str], list[str]] = {}
    for rule_id, version, digest in hashes:
        rule_hashes.setdefault((rule_id, version), []).append(digest)
    rules = [RuleTally(rule_id=r, rule_version=v, rule_hashes=rule_hashes.get((r, v), []),
                       verdicts=tallies[(r, v)], not_evaluated=pages - seen[(r, v)])
             for r, v in sorted(tallies, key=lambda k: (k[0], _version_key(k[1])))]
    evidence = sorted((_failure(row) for row in failures),
                      key=lambda f: (f.rule_id, _version_key(f.rule_version), f.url,
                                     f.attempt_id))
    limit = len(evidence) if max_failures is None else max(0, max_failures)
    session_id, started_at, ended_at, outcome = run[0]
    return RunReport(
        store_id=store_id[0][0] if store_id else "", log_size=head[0][0] if head else 0,
        log_root=head[0][1].hex() if head else "", run_id=run_id, session_id=session_id,
        run_started_at=started_at, run_ended_at=ended_at, run_outcome=outcome, pages=pages,
        rules=rules, failures=evidence[:limit], failures_omitted=len(evidence) - limit,
        groups=_groups(evidence), crawl=crawl)


_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def _shape(reason: str) -> str:
    return _NUMBER.sub("#", reason)


def _groups(failures: list[FailureEvidence]) -> list[FailureGroup]:
    """Failures by (rule version, verdict, reason shape), largest first."""
    members: dict[tuple[str, str, str, str], list[str]] = {}
    for f in failures:
        members.setdefault((f.rule_id, f.rule_version, f.verdict, _shape(f.reason)),
                           []).append(f.reason)
    groups = [FailureGroup(rule_id=r, rule_version=v, verdict=verdict,
                           reason=sentence(_common(reasons)), pattern=shape,
                           count=len(reasons))
              for (r, v, verdict, shape), reasons in members.items()]
    return sorted(groups, key=lambda g: (-g.count, g.rule_id, _version_key(g.rule_version),
                                         g.verdict, g.reason))


def _common(reasons: list[str]) -> str:
    """One reason for a group: its numbers where all agree, "…" where they differ."""
    first = reasons[0]
    numbers = [_NUMBER.findall(r) for r in reasons]
    same = [all(n[i] == numbers[0][i] for n in numbers) for i in range(len(numbers[0]))]
    parts = iter(same)
    return _NUMBER.sub(lambda m: m.group(0) if next(parts) else "…", first)


def sentence(text: str) -> str:
    """A reason as a sentence: a capital first letter and a full stop (the stored reason is
    evidence and stays as it was recorded; this is only how a report shows it)."""
    text = text.strip()
    if not text:
        return text
    if text[0].isalpha():
        text = text[0].upper() + text[1:]
    return text if text.endswith((".", "!", "?")) else text + "."


def _failure(row: tuple[Any, ...]) -> FailureEvidence:
    (rule_id, version, verdict, url, attempt_id, status, started_at, input_hash, head,
     body, evaluated_at, log_index, attempt_index, details) = row
    data = msgspec.json.decode(details)
    data = data if isinstance(data, dict) else {"value": data}
    return FailureEvidence(
        rule_id=rule_id, rule_version=version, verdict=verdict, url=url,
        attempt_id=attempt_id, http_status=status, started_at=started_at,
        input_hash=input_hash, response_headers_digest=head, body_digest=body,
        evaluated_at=evaluated_at, evaluation_log_index=log_index,
        attempt_log_index=attempt_index, reason=str(data.get("reason", "")), details=data)


# --- rendering -----------------------------------------------------------------------------

def render_json(data: RunReport) -> str:
    return msgspec.json.format(msgspec.json.encode(data).decode()) + "\n"


def render_text(data: RunReport) -> str:
    lines = [
        f"run      {data.run_id} ({data.run_outcome or 'running'}), session {data.session_id}",
        f"         started {data.run_started_at}, ended {data.run_ended_at or '-'}",
        f"store    {data.store_id}, read at log size {data.log_size}, root {data.log_root}",
        f"pages    {data.pages} (current attempt per URL with an HTTP response)",
        "",
    ]
    if data.crawl is not None:
        lines += [*_crawl_text(data.crawl), ""]
    if not data.rules:
        lines.append("no rule verdicts in this run (try 'evidence rules evaluate')")
    else:
        width = max(len(f"{t.rule_id} v{t.rule_version}") for t in data.rules)
        lines.append(f"{'rule':<{width}}  {'pass':>6} {'fail':>6} {'error':>6} {'n/a':>6} "
                     f"{'not evaluated':>13}")
        for t in data.rules:
            v = t.verdicts
            lines.append(f"{f'{t.rule_id} v{t.rule_version}':<{width}}  {v['pass']:>6} "
                         f"{v['fail']:>6} {v['error']:>6} {v['not_applicable']:>6} "
                         f"{t.not_evaluated:>13}")
    total = len(data.failures) + data.failures_omitted
    if data.groups:
        width = max(len(f"{g.rule_id} v{g.rule_version}") for g in data.groups)
        lines += ["", "failures and errors by rule and reason:"]
        lines += [f"{g.count:>8}  {g.verdict:<5}  {f'{g.rule_id} v{g.rule_version}':<{width}}  "
                  f"{g.reason}" for g in data.groups]
    lines += ["", f"failures and errors: {total}"]
    for f in data.failures:
        lines += [
            f"{f.verdict.upper():<5} {f.rule_id} v{f.rule_version}  {f.url}",
            f"      attempt {f.attempt_id}, HTTP {f.http_status}, started {f.started_at}",
            f"      reason  {sentence(f.reason)}",
            f"      input   {f.input_hash}",
            f"      head    {f.response_headers_digest or '-'}",
            f"      body    {f.body_digest or '-'}",
            f"      log     evaluation #{f.evaluation_log_index}, "
            f"attempt #{f.attempt_log_index}",
        ]
    if data.failures_omitted:
        lines.append(f"... {data.failures_omitted} more not listed (raise --max-failures)")
    return "\n".join(lines) + "\n"


def _crawl_text(c: CrawlSummary) -> list[str]:
    def counts(values: dict[str, int]) -> str:
        return ", ".join(f"{k} {n}" for k, n in values.items()) or "none"

    lines = [f"attempts {c.attempts}: {counts(c.outcomes)}",
             f"status   {counts(c.statuses)}",
             f"received {c.body_bytes} bytes of bodies",
             f"frontier {counts(c.frontier)} (the session's)"]
    for title, reasons in (("failed", c.failed), ("skipped", c.skipped)):
        if reasons:
            lines.append(f"{title} by reason:")
            lines += [f"{r.count:>8}  {r.reason}" for r in reasons]
    return lines


_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#1b1b1b;background:#fff}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:2em}
table{border-collapse:collapse;margin:.5em 0}th,td{border:1px solid #ccc;padding:.3em .6em;
text-align:left;vertical-align:top}th{background:#f3f3f3}td.n{text-align:right}
code,.hash{font-family:ui-monospace,monospace;font-size:12px;word-break:break-all}
td.url{min-width:18em}
tr.fail td.verdict{color:#a40000;font-weight:bold}tr.error td.verdict{color:#8a5a00;
font-weight:bold}dl{display:grid;grid-template-columns:max-content auto;gap:.2em 1em}
dt{font-weight:bold}dd{margin:0}pre{white-space:pre-wrap;word-break:break-all;margin:0}
"""


def render_html(data: RunReport, *, per_group: int = 50) -> str:
    """One static page: verdicts per rule, failures grouped by rule and reason with their
    counts, and each group's first ``per_group`` failures with their evidence (the page stays
    small at any size of run: the JSON and text reports list every failure)."""
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
    summary = (
        '<table id="rules"><thead><tr><th>rule</th><th>version</th><th>pass</th>'
        "<th>fail</th><th>error</th><th>n/a</th><th>not evaluated</th>"
        "<th>definition hash</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
        if rows else "<p>No rule verdicts in this run.</p>")
    listed: dict[tuple[str, str, str, str], list[FailureEvidence]] = {}
    for f in data.failures:
        listed.setdefault((f.rule_id, f.rule_version, f.verdict, _shape(f.reason)),
                          []).append(f)
    index, sections = [], []
    for n, g in enumerate(data.groups, 1):
        members = listed.get((g.rule_id, g.rule_version, g.verdict, g.pattern), [])
        index.append(f'<tr class="{e(g.verdict)}"><td class="verdict">{e(g.verdict)}</td>'
                     f"<td>{e(g.rule_id)} v{e(g.rule_version)}</td><td>{e(g.reason)}</td>"
                     f'<td class="n">{g.count}</td><td class="n">group {n}</td></tr>')
        shown = members[:per_group]
        more = g.count - len(shown)
        sections.append(
            f'<h3 id="group-{n}">Group {n}: {e(g.verdict)}, {e(g.rule_id)} '
            f"v{e(g.rule_version)}, {g.count}</h3>\n<p>{e(g.reason)}</p>\n"
            + ('<table class="failures"><thead><tr><th>verdict</th><th>URL</th><th>attempt'
               "</th><th>evidence</th></tr></thead><tbody>"
               + "".join(_failure_row(f) for f in shown) + "</tbody></table>\n"
               if shown else "")
            + (f"<p>{more} more in this group not listed here ('evidence report --format "
               "json' lists every failure with its evidence).</p>\n" if more else ""))
    groups = (
        '<table id="groups"><thead><tr><th>verdict</th><th>rule</th><th>reason</th>'
        "<th>failures</th><th></th></tr></thead><tbody>" + "".join(index)
        + "</tbody></table>" if index else "<p>None.</p>")
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
        + (_crawl_html(data.crawl) if data.crawl is not None else "")
        + f"<h2>Verdicts per rule</h2>\n{summary}\n"
        f'<h2>Failures and errors (<span id="failure-count">{total}</span>) by rule and '
        f"reason</h2>\n{groups}\n" + "".join(sections) + "</body>\n</html>\n")


def _crawl_html(c: CrawlSummary) -> str:
    e = html.escape

    def table(ident: str, head: str, values: list[tuple[str, int]]) -> str:
        rows = "".join(f'<tr><td>{e(k)}</td><td class="n">{n}</td></tr>' for k, n in values)
        return (f'<table id="{ident}"><thead><tr><th>{head}</th><th>count</th></tr></thead>'
                f"<tbody>{rows}</tbody></table>\n" if values else "<p>None.</p>\n")

    return (f'<h2>The crawl</h2>\n<p id="attempts">{c.attempts} attempts, {c.body_bytes} '
            "bytes of bodies received.</p>\n<h3>Attempts by outcome</h3>\n"
            + table("outcomes", "outcome", list(c.outcomes.items()))
            + "<h3>Responses by HTTP status</h3>\n"
            + table("statuses", "status", list(c.statuses.items()))
            + "<h3>The session's frontier</h3>\n"
            + table("frontier", "state", list(c.frontier.items()))
            + "<h3>Failed, by reason</h3>\n"
            + table("failed", "reason", [(r.reason, r.count) for r in c.failed])
            + "<h3>Skipped, by reason</h3>\n"
            + table("skipped", "reason", [(r.reason, r.count) for r in c.skipped]))


def _failure_row(f: FailureEvidence) -> str:
    e = html.escape
    details = e(msgspec.json.encode(f.details).decode())
    return (f'<tr class="{e(f.verdict)}" data-rule="{e(f.rule_id)}" '
            f'data-attempt="{e(f.attempt_id)}"><td class="verdict">{e(f.verdict)}</td>'
            f'<td class="url"><code>{e(f.url)}</code></td>'
            f"<td><code>{e(f.attempt_id)}</code><br>HTTP {e(str(f.http_status))}, "
            f"{e(f.started_at)}</td>"
            f'<td class="hash"><details><summary>log #{f.evaluation_log_index} (attempt '
            f"#{f.attempt_log_index})</summary>input {e(f.input_hash)}<br>head "
            f"{e(f.response_headers_digest or '-')}<br>body {e(f.body_digest or '-')}"
            f"<pre>{details}</pre></details></td></tr>")
