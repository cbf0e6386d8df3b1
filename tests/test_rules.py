"""Compliance rules: strict rules files, every rule type on crafted pages, verdicts as evidence."""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path
from urllib.parse import urlsplit

import anyio
import blake3
import msgspec
import pytest

from evidence import CrawlConfig, Crawler, CrawlOptions, EvidenceError, FetchAttempt, Store
from evidence._cli.rules import add_commands
from evidence._crawl.fetch import fetch
from evidence._crawl.http import crawl_client
from evidence._crawl.rules import INPUT_FORMAT, evaluate_page, evaluate_stored
from evidence._crawl.rulesfile import RulesError, RuleSet, load_rules, parse_rules
from evidence._demo.site import SiteConfig, TestSite

from .conftest import Factory, asubmit, lose_payload, submit_all

HTML = "text/html; charset=utf-8"


def run_cli(*argv: object) -> int:
    """These commands as ``_cli.main`` runs them (an EvidenceError exits 2)."""
    parser = argparse.ArgumentParser(prog="evidence")
    add_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args([str(a) for a in argv])
    try:
        return args.func(args)
    except EvidenceError as exc:
        print(f"Error: {exc}")
        if exc.hint:
            print(f"Try: {exc.hint}")
        return 2


def head(status: int = 200, headers: dict[str, str] | None = None) -> bytes:
    fields = {"Content-Type": HTML} if headers is None else headers
    lines = [f"HTTP/1.1 {status} X"] + [f"{k}: {v}" for k, v in fields.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


class Pages:
    """Crafted responses put in a store as the current attempts of their run."""

    def __init__(self, store: Store, make: Factory, runs: tuple[str, ...] = ("r1",)) -> None:
        self.store, self.make = store, make
        submit_all(store, [make.session(), *(make.run(r) for r in runs)])

    def attempt(self, url: str, body: bytes | None, *, status: int = 200,
                headers: dict[str, str] | None = None, run_id: str = "r1",
                sequence: int = 0, elapsed_ms: float = 5.0, **kw: object) -> FetchAttempt:
        artifacts = self.store.artifacts
        return self.make.attempt(
            url, run_id=run_id, sequence=sequence, http_status=status, elapsed_ms=elapsed_ms,
            response_headers=artifacts.put("headers", head(status, headers)),
            body=None if body is None else artifacts.put("body", body), **kw)

    def add(self, url: str, body: bytes | None, **kw: object) -> FetchAttempt:
        attempt = self.attempt(url, body, **kw)
        [ack] = submit_all(self.store, [attempt])
        assert ack.status == "committed", ack.reason
        return attempt


def verdicts(store: Store) -> dict[tuple[str, str, str], str]:
    """(path, rule id, version) -> verdict, for every recorded evaluation."""
    rows = store.connection.execute(
        "SELECT u.fetch_key, e.rule_id, e.rule_version, e.verdict FROM rule_evaluation e "
        "JOIN url_identity u USING (url_id)").fetchall()
    return {(urlsplit(k).path, r, v): verdict for k, r, v, verdict in rows}


def evaluation_rows(store: Store) -> list[tuple]:
    return store.connection.execute(
        "SELECT evaluation_id, run_id, url_id, rule_id, rule_version, input_hash, verdict, "
        "attempt_seq, evaluated_at, details, log_index FROM rule_evaluation "
        "ORDER BY evaluation_id").fetchall()


# --- every rule type, on a page that passes and a page that fails ---------------------------

GOOD = (b'<!doctype html><html><head><title>Shop</title></head><body><h1>Welcome</h1>'
        b'<p>Copyright 2025 Example Ltd.</p><footer><a href="/legal/privacy">Privacy'
        b" <b>policy</b></a></footer></body></html>")
BAD = (b"<!doctype html><html><head><title>Shop</title>"
       b'<script src="http://tracker.example/t.js"></script></head><body>'
       b"<p>Lorem ipsum.</p><a href=/terms>Terms</a>"
       b'<a href="http://tracker.example/pixel">.</a></body></html>')
GOOD_HEADERS = {"Content-Type": HTML, "Strict-Transport-Security": "max-age=63072000",
                "Cache-Control": "no-store"}
BAD_HEADERS = {"Content-Type": HTML, "Cache-Control": "public, max-age=600"}

CASES = {  # rule id -> its definition: passes on GOOD, fails on BAD
    "has-h1": 'type = "selector"\nselector = "h1"',
    "no-tracker-script": 'type = "selector"\nselector = "script[src*=tracker]"\n'
                         'expect = "no_match"',
    "copyright": "type = \"regex\"\npattern = 'Copyright \\d{4}'",
    "no-placeholder": "type = \"regex\"\npattern = '(?i)lorem ipsum'\nexpect = \"no_match\"",
    "no-store": 'type = "regex"\nheader = "Cache-Control"\npattern = "no-store"',
    "hsts": 'type = "header"\nname = "Strict-Transport-Security"',
    "fast": 'type = "max_response_time"\nmax_ms = 1000',
    "privacy-text": "type = \"link\"\ntext = '(?i)privacy policy'",
    "privacy-url": "type = \"link\"\nurl = '^http://example\\.com/legal/privacy$'",
    "no-tracker-link": "type = \"link\"\nurl = 'tracker\\.example'\nexpect = \"no_match\"",
}


def rules_text(cases: dict[str, str], version: object = 1) -> str:
    return "\n".join(f'[[rule]]\nid = "{rule_id}"\nversion = {json.dumps(version)}\n{body}\n'
                     for rule_id, body in cases.items())


@pytest.fixture
def pages(store: Store, make: Factory) -> Pages:
    return Pages(store, make)


def test_each_rule_type_passes_and_fails_on_crafted_pages(store: Store, pages: Pages) -> None:
    pages.add("http://example.com/good", GOOD, headers=GOOD_HEADERS, elapsed_ms=40.0)
    pages.add("http://example.com/bad", BAD, headers=BAD_HEADERS, elapsed_ms=4000.0)
    summary = evaluate_stored(store, parse_rules(rules_text(CASES)))
    assert summary.ok and summary.pages == 2 and summary.added == 2 * len(CASES)
    found = verdicts(store)
    assert {r: found[("/good", r, "1")] for r in CASES} == dict.fromkeys(CASES, "pass")
    assert {r: found[("/bad", r, "1")] for r in CASES} == dict.fromkeys(CASES, "fail")


def test_failure_details_say_why_and_show_the_evidence(store: Store, pages: Pages) -> None:
    pages.add("http://example.com/bad", BAD, headers=BAD_HEADERS, elapsed_ms=4000.0)
    evaluate_stored(store, parse_rules(rules_text(CASES)))
    details = {r: json.loads(d) for r, d in store.connection.execute(
        "SELECT rule_id, details FROM rule_evaluation")}
    assert details["has-h1"]["reason"] == ("selector `h1` not found in the document; "
                                           "it must be")
    assert details["no-tracker-script"]["first"].startswith('<script src="http://tracker')
    assert details["no-placeholder"]["match"] == "Lorem ipsum"
    assert details["hsts"] == details["hsts"] | {
        "reason": "required header strict-transport-security is absent", "value": None}
    assert details["fast"]["elapsed_ms"] == 4000.0 and details["fast"]["max_ms"] == 1000.0
    assert details["no-tracker-link"]["found"]["url"] == "http://tracker.example/pixel"
    assert details["privacy-text"]["links"] == 2


def test_evaluate_page_gives_exactly_what_stored_evaluation_records(
        store: Store, pages: Pages) -> None:
    attempt = pages.add("http://example.com/good", GOOD, headers=GOOD_HEADERS)
    rules = parse_rules(rules_text(CASES))
    live = evaluate_page(
        rules, url=attempt.url, attempt_id=attempt.attempt_id, run_id="r1",
        headers_bytes=store.artifacts.read(attempt.response_headers),
        body_bytes=store.artifacts.read(attempt.body), headers_ref=attempt.response_headers,
        body_ref=attempt.body, elapsed_ms=attempt.elapsed_ms)
    evaluate_stored(store, rules)
    stored = {r: (h, v, json.loads(d)) for r, h, v, d in store.connection.execute(
        "SELECT rule_id, input_hash, verdict, details FROM rule_evaluation")}
    assert {m.rule_id: (m.input_hash, m.verdict, m.details) for m in live} == stored
    # Submitted later (as the crawler would have), every one is a duplicate, not a new row.
    acks = submit_all(store, live)
    assert {a.status for a in acks} == {"duplicate"}


def test_evaluate_page_refuses_bytes_that_are_not_the_named_artifact(
        store: Store, pages: Pages) -> None:
    attempt = pages.add("http://example.com/good", GOOD, headers=GOOD_HEADERS)
    with pytest.raises(RulesError, match="body bytes do not match"):
        evaluate_page(parse_rules(rules_text(CASES)), url=attempt.url,
                      attempt_id=attempt.attempt_id, run_id="r1",
                      headers_bytes=store.artifacts.read(attempt.response_headers),
                      body_bytes=BAD, headers_ref=attempt.response_headers,
                      body_ref=attempt.body, elapsed_ms=1.0)


# --- versions, duplicates, conflicts ----------------------------------------------------------

def test_a_version_bump_adds_rows_and_leaves_old_verdicts_untouched(
        store: Store, pages: Pages, tmp_path: Path) -> None:
    pages.add("http://example.com/good", GOOD, headers=GOOD_HEADERS)
    pages.add("http://example.com/bad", BAD, headers=BAD_HEADERS)
    v1 = parse_rules('[[rule]]\nid = "title"\nversion = 1\ntype = "selector"\n'
                     'selector = "h1"\n')
    first = evaluate_stored(store, v1)
    assert (first.added, first.verdicts) == (2, {"title@1": {"fail": 1, "pass": 1}})
    before = evaluation_rows(store)
    # v2 asks for the <title> element instead: the old pages are judged again, from disk.
    v2 = parse_rules('[[rule]]\nid = "title"\nversion = 2\ntype = "selector"\n'
                     'selector = "head > title"\n')
    second = evaluate_stored(store, v2)
    assert (second.added, second.verdicts) == (2, {"title@2": {"pass": 2}})
    after = evaluation_rows(store)
    assert after[:2] == before, "v1 rows, their input hashes and verdicts are unchanged"
    assert [(r[3], r[4], r[6]) for r in after[2:]] == [("title", "2", "pass")] * 2
    assert {r[5] for r in after[2:]} == {r[5] for r in before}, "same input, same hash"
    assert verdicts(store)[("/bad", "title", "1")] == "fail"


def test_the_same_rule_version_on_the_same_input_is_never_a_second_row(
        store: Store, pages: Pages) -> None:
    pages.add("http://example.com/good", GOOD, headers=GOOD_HEADERS)
    pages.add("http://example.com/bad", BAD, headers=BAD_HEADERS)
    rules = parse_rules(rules_text(CASES))
    evaluate_stored(store, rules)
    before = evaluation_rows(store)
    again = evaluate_stored(store, rules)
    assert (again.added, again.already_recorded, again.duplicates) == (0, 20, 0)
    rechecked = evaluate_stored(store, rules, recheck=True)
    assert (rechecked.added, rechecked.duplicates, rechecked.conflicts) == (0, 20, 0)
    assert rechecked.ok
    assert evaluation_rows(store) == before
    assert store.connection.execute("SELECT count(*) FROM quarantine").fetchall() == [(0,)]


def test_a_rule_edited_without_a_version_bump_is_refused(store: Store, pages: Pages) -> None:
    pages.add("http://example.com/good", GOOD, headers=GOOD_HEADERS)
    evaluate_stored(store, parse_rules('[[rule]]\nid = "t"\nversion = 1\ntype = "selector"\n'
                                       'selector = "h1"\n'))
    edited = parse_rules('[[rule]]\nid = "t"\nversion = 1\ntype = "selector"\n'
                         'selector = "h2"\n')
    with pytest.raises(RulesError, match="'t' version '1' was recorded with another") as exc:
        evaluate_stored(store, edited)
    assert "bump" in exc.value.hint
    # Only the description changed: the same definition, accepted.
    same = parse_rules('[[rule]]\nid = "t"\nversion = 1\ntype = "selector"\n'
                       'selector = "h1"\ndescription = "the page has a heading"\n')
    assert evaluate_stored(store, same).already_recorded == 1


def test_a_different_verdict_on_recorded_input_is_a_conflict_and_changes_nothing(
        store: Store, pages: Pages) -> None:
    attempt = pages.add("http://example.com/good", GOOD, headers=GOOD_HEADERS)
    rules = parse_rules('[[rule]]\nid = "t"\nversion = 1\ntype = "header"\nname = "hsts"\n')
    evaluate_stored(store, rules)
    before = evaluation_rows(store)
    [message] = evaluate_page(rules, url=attempt.url, attempt_id=attempt.attempt_id,
                              run_id="r1", headers_bytes=head(200, GOOD_HEADERS),
                              body_bytes=GOOD, headers_ref=attempt.response_headers,
                              body_ref=attempt.body, elapsed_ms=1.0)
    forged = msgspec.structs.replace(message, verdict="pass")
    assert message.verdict == "fail"
    [ack] = submit_all(store, [forged])
    assert ack.status == "conflict"
    assert evaluation_rows(store) == before


# --- the input and its hash --------------------------------------------------------------------

def test_input_hash_is_blake3_of_the_documented_canonical_json(
        store: Store, pages: Pages) -> None:
    attempt = pages.add("http://example.com/good", GOOD, headers=GOOD_HEADERS,
                        elapsed_ms=12.5)
    rules = parse_rules(rules_text({"hsts": CASES["hsts"], "fast": CASES["fast"],
                                    "has-h1": CASES["has-h1"]}))
    evaluate_stored(store, rules)
    h, b = attempt.response_headers, attempt.body
    headers = {"namespace": "headers", "digest": h.digest, "size": h.size}
    base = {"format": INPUT_FORMAT, "url": attempt.url, "response_headers": headers}
    expected = {
        "hsts": base,
        "fast": base | {"elapsed_ms": 12.5},
        "has-h1": base | {"body": {"namespace": "body", "digest": b.digest, "size": b.size,
                                   "truncated": False}},
    }
    rows = dict(store.connection.execute(
        "SELECT rule_id, json_object('hash', input_hash, 'details', json(details)) "
        "FROM rule_evaluation").fetchall())
    for rule_id, description in expected.items():
        canonical = json.dumps(description, sort_keys=True, separators=(",", ":"),
                               ensure_ascii=False).encode()
        row = json.loads(rows[rule_id])
        assert row["hash"] == blake3.blake3(canonical).hexdigest(), rule_id
        assert row["details"]["input"] == description, "the row shows what was hashed"


def test_a_header_rule_hash_ignores_the_body_and_a_body_rule_hash_does_not(
        store: Store, make: Factory) -> None:
    pages = Pages(store, make, runs=("r1", "r2"))
    pages.add("http://example.com/p", GOOD, headers=GOOD_HEADERS, run_id="r1")
    pages.add("http://example.com/p", BAD, headers=GOOD_HEADERS, run_id="r2")
    evaluate_stored(store, parse_rules(rules_text({"hsts": CASES["hsts"],
                                                   "has-h1": CASES["has-h1"]})))
    hashes = {}
    for run, rule, digest in store.connection.execute(
            "SELECT run_id, rule_id, input_hash FROM rule_evaluation"):
        hashes.setdefault(rule, {})[run] = digest
    assert hashes["hsts"]["r1"] == hashes["hsts"]["r2"]
    assert hashes["has-h1"]["r1"] != hashes["has-h1"]["r2"]


# --- which pages, and what a rule can read -------------------------------------------------

def test_only_the_current_attempt_with_a_response_is_judged(
        store: Store, pages: Pages) -> None:
    url = "http://example.com/retried"
    failed = pages.attempt(url, b"oops", status=500, sequence=0)
    final = pages.attempt(url, GOOD, headers=GOOD_HEADERS, sequence=1)
    timeout = pages.make.attempt("http://example.com/slow", outcome="timeout",
                                 http_status=None)
    submit_all(store, [failed, final, timeout])
    summary = evaluate_stored(store, parse_rules(rules_text({"hsts": CASES["hsts"]})))
    assert summary.pages == 1
    [(attempt_id,)] = store.connection.execute(
        "SELECT f.attempt_id FROM rule_evaluation e JOIN fetch_attempt f USING (attempt_seq)")
    assert attempt_id == final.attempt_id


def test_applies_to_status_url_and_content_type(store: Store, pages: Pages) -> None:
    pages.add("http://example.com/missing", b"<html><h1>Not found</h1></html>", status=404)
    pages.add("http://example.com/notes.txt", b"plain", headers={"Content-Type": "text/plain"})
    pages.add("http://example.com/shop/a", GOOD, headers=GOOD_HEADERS)
    rules = parse_rules(rules_text({
        "h1": 'type = "selector"\nselector = "h1"',
        "h1-any-status": 'type = "selector"\nselector = "h1"\napplies_to = { status = "any" }',
        "shop-hsts": 'type = "header"\nname = "strict-transport-security"\n'
                     "applies_to = { url = '/shop/' }",
        "text-only": 'type = "regex"\npattern = "plain"\n'
                     'applies_to = { content_type = ["text/*"], status = [200, "3xx"] }',
    }))
    evaluate_stored(store, rules)
    found = verdicts(store)
    assert found[("/missing", "h1", "1")] == "not_applicable"
    assert found[("/missing", "h1-any-status", "1")] == "pass"
    assert found[("/notes.txt", "h1", "1")] == "not_applicable"  # not HTML
    assert found[("/notes.txt", "shop-hsts", "1")] == "not_applicable"
    assert found[("/shop/a", "shop-hsts", "1")] == "pass"
    assert found[("/notes.txt", "text-only", "1")] == "pass"
    assert found[("/shop/a", "text-only", "1")] == "fail"  # text/html is text/*
    assert found[("/missing", "text-only", "1")] == "not_applicable"
    reasons = {json.loads(d)["reason"] for (d,) in store.connection.execute(
        "SELECT details FROM rule_evaluation WHERE verdict = 'not_applicable'")}
    assert "status 404 is not in 2xx" in reasons
    assert "not an HTML document (Content-Type text/plain)" in reasons


def test_a_truncated_body_is_an_error_for_body_rules_only(store: Store, pages: Pages) -> None:
    pages.add("http://example.com/big", GOOD[:60], headers=GOOD_HEADERS, outcome="too_large",
              body_truncated=True)
    evaluate_stored(store, parse_rules(rules_text({"hsts": CASES["hsts"],
                                                   "has-h1": CASES["has-h1"]})))
    found = verdicts(store)
    assert found[("/big", "hsts", "1")] == "pass"
    assert found[("/big", "has-h1", "1")] == "error"


def test_bodies_are_read_as_a_browser_would_decode_them(store: Store, pages: Pages) -> None:
    pages.add("http://example.com/gz", gzip.compress(GOOD),
              headers=GOOD_HEADERS | {"Content-Encoding": "gzip"})
    pages.add("http://example.com/broken", b"\x1f\x8bnot gzip",
              headers=GOOD_HEADERS | {"Content-Encoding": "gzip"})
    pages.add("http://example.com/latin", "<p>Caf\u00e9 cr\u00e8me</p>".encode("latin-1"),
              headers={"Content-Type": "text/html; charset=ISO-8859-1"})
    evaluate_stored(store, parse_rules(rules_text({
        "copyright": CASES["copyright"], "cafe": 'type = "regex"\npattern = "Café crème"'})))
    found = verdicts(store)
    assert found[("/gz", "copyright", "1")] == "pass"
    assert found[("/broken", "copyright", "1")] == "error"
    assert found[("/latin", "cafe", "1")] == "pass"


def test_links_resolve_against_base_and_fall_back_to_image_alt(
        store: Store, pages: Pages) -> None:
    pages.add("http://example.com/a/page", b'<base href="/legal/"><a href="privacy">'
              b'<img src=p.png alt="Privacy"></a>', headers=GOOD_HEADERS)
    evaluate_stored(store, parse_rules(rules_text({"p": "type = \"link\"\ntext = '^Privacy$'\n"
                                                   "url = '^http://example\\.com/legal/"
                                                   "privacy$'"})))
    assert verdicts(store)[("/a/page", "p", "1")] == "pass"


def test_an_unreadable_artifact_is_reported_and_not_judged(store: Store, pages: Pages) -> None:
    pages.add("http://example.com/good", GOOD, headers=GOOD_HEADERS)
    lost = pages.add("http://example.com/lost", b"<h1>gone</h1>", headers=GOOD_HEADERS)
    lose_payload(store, lost.body)
    summary = evaluate_stored(store, parse_rules(rules_text({"h": CASES["has-h1"]})))
    assert (summary.added, summary.unreadable, summary.ok) == (1, 1, False)
    assert "lost" in summary.problems[0] and "not in the store" in summary.problems[0]
    assert ("/lost", "h", "1") not in verdicts(store)


# --- the rules file ----------------------------------------------------------------------------

def test_a_rules_file_round_trips_through_its_record() -> None:
    rules = parse_rules(rules_text(CASES) + '[[rule]]\nid = "s"\nversion = "2.1"\n'
                        'type = "regex"\npattern = "x"\ndescription = "d"\n'
                        "applies_to = { url = '^https://', content_type = 'TEXT/HTML', "
                        'status = [200, "3xx"] }\n')
    record = json.loads(json.dumps(rules.as_record()))
    again = RuleSet.from_record(record)
    assert again.rules == rules.rules
    assert [r.definition_hash for r in again] == [r["definition_hash"] for r in record]
    assert rules.rules[-1].applies_to.content_type == ("text/html",)
    record[0]["selector"] = "h2"
    with pytest.raises(RulesError, match="'has-h1' version '1' was recorded with hash"):
        RuleSet.from_record(record)


BAD_FILES = [
    ('id = "x"', "unknown top-level key 'id'"),
    ("", "defines no rules"),
    ("[[rule]\n", "not valid TOML"),
    ('[[rule]]\nversion = 1\ntype = "header"\nname = "x"', "rule #1: field 'id': missing"),
    ('[[rule]]\nid = "a b"\nversion = 1\ntype = "header"', "field 'id': 'a b' is not a rule id"),
    ('[[rule]]\nid = "x"\ntype = "header"\nname = "h"', "rule 'x' (#1): field 'version': "
     "missing"),
    ('[[rule]]\nid = "x"\nversion = 1.5\ntype = "header"\nname = "h"',
     "field 'version': must be an integer or a string, not 1.5"),
    ('[[rule]]\nid = "x"\nversion = true\ntype = "header"\nname = "h"',
     "field 'version': must be an integer or a string"),
    ('[[rule]]\nid = "x"\nversion = 1\ntype = "xpath"', "field 'type': unknown rule type "
     "'xpath'"),
    ('[[rule]]\nid = "x"\nversion = 1\ntype = "regex"\npattern = "(unclosed"',
     "field 'pattern': invalid regular expression '(unclosed': missing ), unterminated "
     "subpattern at position 0"),
    ('[[rule]]\nid = "x"\nversion = 1\ntype = "regex"', "field 'pattern': missing"),
    ('[[rule]]\nid = "x"\nversion = 1\ntype = "selector"\nselector = "div["',
     "field 'selector': invalid CSS selector 'div['"),
    ('[[rule]]\nid = "x"\nversion = 1\ntype = "selector"\nselector = "h1"\nexpct = "match"',
     "field 'expct': not a field of a 'selector' rule"),
    ('[[rule]]\nid = "x"\nversion = 1\ntype = "selector"\nselector = "h1"\nexpect = "absent"',
     "field 'expect': must be 'match' or 'no_match'"),
    ('[[rule]]\nid = "x"\nversion = 1\ntype = "header"\nname = "Bad Name"',
     "field 'name': 'Bad Name' is not a header name"),
    ('[[rule]]\nid = "x"\nversion = 1\ntype = "max_response_time"\nmax_ms = -5',
     "field 'max_ms': must be a positive number"),
    ('[[rule]]\nid = "x"\nversion = 1\ntype = "link"', "field 'url': missing (a link rule "
     "needs url, text or both)"),
    ('[[rule]]\nid = "x"\nversion = 1\ntype = "link"\ntext = "[a-"',
     "field 'text': invalid regular expression"),
    ('[[rule]]\nid = "x"\nversion = 1\ntype = "header"\nname = "h"\n'
     'applies_to = { host = "a" }', "field 'applies_to.host': not a field of applies_to"),
    ('[[rule]]\nid = "x"\nversion = 1\ntype = "header"\nname = "h"\n'
     'applies_to = { url = "(" }', "field 'applies_to.url': invalid regular expression"),
    ('[[rule]]\nid = "x"\nversion = 1\ntype = "header"\nname = "h"\n'
     'applies_to = { status = [99] }', "field 'applies_to.status': [99] is not a list"),
    ('[[rule]]\nid = "x"\nversion = 1\ntype = "header"\nname = "h"\n'
     'applies_to = { content_type = ["text/html; charset=utf-8"] }',
     "field 'applies_to.content_type'"),
    ('[[rule]]\nid = "x"\nversion = 1\ntype = "header"\nname = "h"\n'
     '[[rule]]\nid = "x"\nversion = "1"\ntype = "header"\nname = "i"',
     "rule 'x' (#2): version '1' is defined twice"),
]


@pytest.mark.parametrize(("text", "message"), BAD_FILES)
def test_bad_rules_files_are_refused_naming_the_rule_and_field(text: str, message: str) -> None:
    with pytest.raises(RulesError) as exc:
        parse_rules(text, source="rules.toml")
    assert str(exc.value).startswith("rules.toml: ")
    assert message in str(exc.value)
    assert exc.value.hint


def test_cli_rules_check_and_a_bad_file(tmp_path: Path, capsys) -> None:
    good = tmp_path / "rules.toml"
    good.write_text(rules_text(CASES))
    assert run_cli("rules", "check", good) == 0
    out = capsys.readouterr().out
    assert f"{good}: 10 rule(s)" in out
    rows = [line for line in out.splitlines()[1:] if line.startswith("  ")]
    assert rows[0].split() == ["rule", "type", "definition", "hash"] and len(rows) == 11
    assert any(r.split()[:3] == ["privacy-url", "v1", "link"] for r in rows)
    # The columns align: each row's type and hash start where the header's do.
    for column in ("type", "definition hash"):
        start = rows[0].index(column)
        assert all(r[start - 2:start] == "  " and r[start] != " " for r in rows), out
    bad = tmp_path / "bad.toml"
    bad.write_text('[[rule]]\nid = "x"\nversion = 1\ntype = "regex"\npattern = "("\n')
    assert run_cli("rules", "check", bad) == 2
    out = capsys.readouterr().out
    assert f"Error: {bad}: rule 'x' (#1): field 'pattern': invalid regular expression" in out
    assert run_cli("rules", "check", tmp_path / "absent.toml") == 2
    assert "cannot read rules file" in capsys.readouterr().out
    assert load_rules(good).source == str(good)


# --- against a real crawl ---------------------------------------------------------------------

SITE_RULES = """
[[rule]]
id = "heading"
version = 1
type = "selector"
selector = "body > h1"

[[rule]]
id = "home-link"
version = 1
type = "link"
text = "^Home$"
url = "/$"

[[rule]]
id = "fast"
version = 1
type = "max_response_time"
max_ms = 300

[[rule]]
id = "etag"
version = 1
type = "header"
name = "ETag"
"""


def test_rules_judge_a_real_crawl_of_the_test_site(tmp_path: Path, capsys) -> None:
    with TestSite(SiteConfig(pages=8, slow={"/p/3": 0.5})) as site, \
            Store.create(tmp_path / "s") as store:
        result = anyio.run(Crawler(store, CrawlConfig(seeds=[site.url]),
                                   CrawlOptions(workers=2)).run)
    assert result.session_completed
    rules = tmp_path / "rules.toml"
    rules.write_text(SITE_RULES)
    assert run_cli("rules", "evaluate", tmp_path / "s", "--rules", rules, "--run",
                   result.run_id, "--json") == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["ok"] and summary["added"] == 4 * summary["pages"]
    with Store.open(tmp_path / "s") as store:
        found = verdicts(store)
        # Elapsed time includes storing the payloads (fsync): judge by what was recorded.
        slow = {urlsplit(u).path for (u,) in store.connection.execute(
            "SELECT f.url FROM url_current c JOIN fetch_attempt f USING (attempt_seq) "
            "WHERE f.elapsed_ms > 300 AND f.http_status BETWEEN 200 AND 299")}
    failed = {(path, rule) for (path, rule, _), v in found.items() if v == "fail"}
    assert "/p/3" in slow
    assert failed == {("/", "home-link")} | {(p, "fast") for p in slow}
    assert found[("/robots.txt", "heading", "1")] == "not_applicable"  # text/plain
    assert found[("/old", "etag", "1")] == "not_applicable"  # a 301
    assert all(found[(p, "heading", "1")] == "pass" for p in site.reachable_pages())
    # Again: everything is already recorded; nothing is added.
    assert run_cli("rules", "evaluate", tmp_path / "s", "--rules", rules) == 0
    assert "0 verdict(s) added" in capsys.readouterr().out
    assert run_cli("rules", "evaluate", tmp_path / "s", "--rules", rules, "--run",
                   "no-such-run") == 2
    assert "no run 'no-such-run'" in capsys.readouterr().out


def test_the_crawler_path_fetch_then_evaluate_page_in_the_pages_group(
        store: Store, pages: Pages) -> None:
    """What the crawler is to do: judge each fetched page and submit it with the attempt."""
    rules = parse_rules(SITE_RULES)

    async def crawl_one(url: str) -> list:
        async with crawl_client(connections=1, timeout=10.0) as client:
            result = await fetch(client, store.artifacts, url=url, run_id="r1", sequence=0,
                                 user_agent="evidence-test", max_body_bytes=1 << 20)
        attempt = result.attempt
        document = attempt.content or attempt.body
        judged = evaluate_page(
            rules, url=attempt.url, attempt_id=attempt.attempt_id, run_id="r1",
            headers_bytes=store.artifacts.read(attempt.response_headers),
            body_bytes=store.artifacts.read(document),
            headers_ref=attempt.response_headers, body_ref=document,
            elapsed_ms=attempt.elapsed_ms, body_truncated=attempt.body_truncated,
            decoded=True, content_coding=attempt.content_coding)
        return await asubmit(store, [attempt, *judged])

    with TestSite(SiteConfig(pages=4)) as site:
        acks = anyio.run(crawl_one, site.url + "p/1")
    assert [a.status for a in acks] == ["committed"] * 5
    assert {v for (p, _, _), v in verdicts(store).items() if p == "/p/1"} == {"pass"}
    again = evaluate_stored(store, rules)
    assert (again.pages, again.added, again.already_recorded) == (1, 0, 4)
