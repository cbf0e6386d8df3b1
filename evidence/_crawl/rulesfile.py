"""The rules file: a TOML file of named, versioned compliance rules, strictly validated.

This module owns the format (docs/rules.md): every error names the file, the rule and the
field, and says how to fix it. A rule's ``definition_hash`` pins its definition, so a
verdict recorded under an id and version can always be traced to the rule that made it
(``_crawl.rules`` judges pages with them, and refuses a changed definition under a recorded
version).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import blake3
import msgspec
from selectolax.lexbor import LexborHTMLParser, SelectolaxError

from .._errors import RulesError

__all__ = ["RULE_TYPES", "AppliesTo", "Rule", "RuleSet", "RulesError", "load_rules",
           "parse_rules"]

RULE_TYPES = ("selector", "regex", "header", "max_response_time", "link")
_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_VERSION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")
_TOKEN_RE = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}")
_MEDIA_RE = re.compile(r"[a-z0-9!#$&^_.+-]+/(\*|[a-z0-9!#$&^_.+-]+)")
_STATUS_CLASS_RE = re.compile(r"[1-5]xx")
_json = msgspec.json.Encoder(order="sorted")


@dataclass(frozen=True, kw_only=True)
class AppliesTo:
    """Which pages a rule judges; the others get ``not_applicable``."""

    url: str | None = None  # a regular expression searched in the URL as requested
    content_type: tuple[str, ...] = ()  # media types, "type/*" allowed; () means any
    status: tuple[int | str, ...] = ("2xx",)  # codes, "Nxx" classes or "any"

    def record(self) -> dict[str, Any]:
        return {"url": self.url, "content_type": list(self.content_type),
                "status": list(self.status)}


@dataclass(frozen=True, kw_only=True)
class Rule:
    """One validated rule. ``params`` are its type's fields, with defaults filled in."""

    id: str
    version: str
    type: str
    description: str = ""
    applies_to: AppliesTo = field(default_factory=AppliesTo)
    params: Mapping[str, Any] = field(default_factory=dict)
    definition_hash: str = ""
    # "response": the document as the server sent it; "rendered": the DOM a browser
    # rendered from it (docs/replay.md), for body rules of a crawl with --render.
    input: str = "response"
    _compiled: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def reads_rendered(self) -> bool:
        return self.input == "rendered"

    @property
    def reads_body(self) -> bool:
        return self.type in ("selector", "link") or (
            self.type == "regex" and self.params["header"] is None)

    @property
    def reads_elapsed(self) -> bool:
        return self.type == "max_response_time"

    def record(self) -> dict[str, Any]:
        """The definition as a rules-file table (``RuleSet.from_record`` reads it back)."""
        rendered = {"input": self.input} if self.reads_rendered else {}
        return {"id": self.id, "version": self.version, "type": self.type,
                "description": self.description, "applies_to": self.applies_to.record(),
                **rendered, **self.params}


@dataclass(frozen=True)
class RuleSet:
    """The rules of one file, in file order. Iterable; ``as_record`` is JSON-ready."""

    rules: tuple[Rule, ...]
    source: str = "<rules>"

    def __iter__(self) -> Iterator[Rule]:
        return iter(self.rules)

    def __len__(self) -> int:
        return len(self.rules)

    @property
    def response(self) -> tuple[Rule, ...]:
        """The rules that read the response (judged when a page is fetched)."""
        return tuple(r for r in self.rules if not r.reads_rendered)

    @property
    def rendered(self) -> tuple[Rule, ...]:
        """The rules that read a rendered DOM (judged with the page's render)."""
        return tuple(r for r in self.rules if r.reads_rendered)

    def as_record(self) -> list[dict[str, Any]]:
        """Every definition in full, with its hash: what a crawl session should record."""
        return [r.record() | {"definition_hash": r.definition_hash} for r in self.rules]

    @classmethod
    def from_record(cls, records: Sequence[Mapping[str, Any]],
                    source: str = "<recorded rules>") -> RuleSet:
        tables = [{k: v for k, v in r.items() if k != "definition_hash" and v is not None}
                  for r in records]
        for table in tables:
            if isinstance(table.get("applies_to"), Mapping):
                table["applies_to"] = {k: v for k, v in table["applies_to"].items()
                                       if v is not None}
        rules = _parse_tables(tables, source)
        for rule, record in zip(rules, records, strict=True):
            recorded = record.get("definition_hash")
            if recorded is not None and recorded != rule.definition_hash:
                raise RulesError(
                    f"{source}: rule {rule.id!r} version {rule.version!r} was recorded with "
                    f"hash {recorded}; its definition now hashes to {rule.definition_hash}",
                    path=source, rule=rule.id, field="definition_hash",
                    hint="the recorded rules were edited, or this version of evidence reads "
                    "them differently")
        return rules


def load_rules(path: str | Path) -> RuleSet:
    """Read and validate a rules file; any defect is a ``RulesError`` naming rule and field."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise RulesError(f"cannot read rules file {path}: {exc.strerror}", path=str(path),
                         hint="check the path given to --rules") from None
    except UnicodeDecodeError as exc:
        raise RulesError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})",
                         path=str(path), hint="save the rules file as UTF-8") from None
    return parse_rules(text, source=str(path))


def parse_rules(text: str, *, source: str = "<rules>") -> RuleSet:
    """Validate rules given as TOML text (``source`` names them in errors)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RulesError(f"{source}: not valid TOML: {exc}", path=source,
                         hint="fix the syntax at the line and column given") from None
    unknown = sorted(set(data) - {"rule"})
    if unknown:
        raise RulesError(f"{source}: unknown top-level key {unknown[0]!r}", path=source,
                         field=unknown[0], hint="each rule is a [[rule]] table")
    tables = data.get("rule")
    if not isinstance(tables, list) or not tables:
        raise RulesError(f"{source}: defines no rules", path=source,
                         hint="add at least one [[rule]] table with id, version and type")
    return _parse_tables(tables, source)


def _parse_tables(tables: Sequence[Any], source: str) -> RuleSet:
    rules: list[Rule] = []
    seen: set[tuple[str, str]] = set()
    for number, table in enumerate(tables, 1):
        rule = _Parser(table, number, source).rule()
        if (rule.id, rule.version) in seen:
            raise RulesError(f"{source}: rule {rule.id!r} (#{number}): version "
                             f"{rule.version!r} is defined twice", path=source, rule=rule.id,
                             field="version", hint="give each definition its own version")
        seen.add((rule.id, rule.version))
        rules.append(rule)
    return RuleSet(tuple(rules), source)


_TYPE_FIELDS: dict[str, tuple[str, ...]] = {
    "selector": ("selector", "expect"),
    "regex": ("pattern", "header", "expect"),
    "header": ("name",),
    "max_response_time": ("max_ms",),
    "link": ("url", "text", "expect"),
}
_COMMON = ("id", "version", "type", "description", "applies_to", "input")


class _Parser:
    """Validates one [[rule]] table; every error names the rule and the field."""

    def __init__(self, table: Any, number: int, source: str) -> None:
        self.source, self.number = source, number
        self.name = f"rule #{number}"
        self.rule_id: str | None = None
        if not isinstance(table, Mapping):
            self.fail(None, "not a table", "write each rule as a [[rule]] table")
        self.table = table
        ident = table.get("id")
        if isinstance(ident, str) and _ID_RE.fullmatch(ident):
            self.rule_id = ident
            self.name = f"rule {ident!r} (#{number})"

    def fail(self, field_name: str | None, problem: str, hint: str) -> NoReturn:
        where = f"{self.source}: {self.name}" + (f": field {field_name!r}" if field_name else "")
        raise RulesError(f"{where}: {problem}", path=self.source, rule=self.rule_id,
                         field=field_name, hint=hint)

    def rule(self) -> Rule:
        t = self.table
        for key in ("id", "version", "type"):
            if key not in t:
                self.fail(key, "missing", f"every rule needs {', '.join(_COMMON[:3])}")
        ident = t["id"]
        if not isinstance(ident, str) or not _ID_RE.fullmatch(ident):
            self.fail("id", f"{ident!r} is not a rule id",
                      "use 1-128 characters of letters, digits, '.', '_' and '-'")
        version = self.version(t["version"])
        kind = t["type"]
        if kind not in RULE_TYPES:
            self.fail("type", f"unknown rule type {kind!r}",
                      f"use one of: {', '.join(RULE_TYPES)}")
        allowed = set(_COMMON) | set(_TYPE_FIELDS[kind])
        unknown = sorted(set(t) - allowed)
        if unknown:
            self.fail(unknown[0], f"not a field of a {kind!r} rule",
                      f"its fields: {', '.join(sorted(allowed))}")
        description = t.get("description", "")
        if not isinstance(description, str):
            self.fail("description", "must be a string", "quote it")
        compiled: dict[str, Any] = {}
        applies_to = self.applies_to(t.get("applies_to", {}), compiled)
        params = getattr(self, f"_{kind}")(t, compiled)
        source = t.get("input", "response")
        if source not in ("response", "rendered"):
            self.fail("input", f"must be 'response' or 'rendered', not {source!r}",
                      "'response': the document the server sent (default); 'rendered': "
                      "the DOM a browser rendered (crawl with --render)")
        semantic = {"id": ident, "version": version, "type": kind,
                    "applies_to": applies_to.record(), **params}
        if source == "rendered":  # absent by default: older definitions keep their hash
            if not (kind in ("selector", "link") or (kind == "regex" and
                                                    params.get("header") is None)):
                self.fail("input", f"a {kind!r} rule reads no document, so it cannot read "
                          "the rendered one", "only selector, link and body regex rules "
                          "take input = 'rendered'")
            semantic["input"] = source
        return Rule(id=ident, version=version, type=kind, description=description,
                    applies_to=applies_to, params=params, input=source,
                    definition_hash=blake3.blake3(_json.encode(semantic)).hexdigest(),
                    _compiled=compiled)

    def version(self, value: Any) -> str:
        if isinstance(value, bool) or not isinstance(value, int | str):
            self.fail("version", f"must be an integer or a string, not {value!r}",
                      'write version = 3 or version = "3.1" (a float is ambiguous)')
        text = str(value)
        if (isinstance(value, int) and value < 0) or not _VERSION_RE.fullmatch(text):
            self.fail("version", f"{value!r} is not a version",
                      "use a non-negative integer or 1-64 of letters, digits, '.', '_', "
                      "'+' and '-'")
        return text

    def regex(self, name: str, value: Any, compiled: dict[str, Any], key: str) -> str:
        if not isinstance(value, str) or not value:
            self.fail(name, "must be a non-empty string (a regular expression)",
                      "use a TOML literal string: pattern = '\\d+'")
        try:
            compiled[key] = re.compile(value)
        except re.error as exc:
            self.fail(name, f"invalid regular expression {value!r}: {exc.msg} at position "
                      f"{exc.pos}", "Python 're' syntax; inline flags like (?i) work")
        return value

    def expect(self, t: Mapping[str, Any]) -> str:
        value = t.get("expect", "match")
        if value not in ("match", "no_match"):
            self.fail("expect", f"must be 'match' or 'no_match', not {value!r}",
                      "'match': must be found; 'no_match': must not be found")
        return value

    def applies_to(self, value: Any, compiled: dict[str, Any]) -> AppliesTo:
        if not isinstance(value, Mapping):
            self.fail("applies_to", "must be a table", "applies_to = { url = '^https://' }")
        unknown = sorted(set(value) - {"url", "content_type", "status"})
        if unknown:
            self.fail(f"applies_to.{unknown[0]}", "not a field of applies_to",
                      "its fields: url, content_type, status")
        url = None
        if "url" in value:
            url = self.regex("applies_to.url", value["url"], compiled, "applies_to.url")
        types = value.get("content_type", [])
        types = [types] if isinstance(types, str) else types
        if not isinstance(types, list) or not all(
                isinstance(x, str) and _MEDIA_RE.fullmatch(x.strip().lower()) for x in types):
            self.fail("applies_to.content_type", f"{types!r} is not a list of media types",
                      'content_type = ["text/html", "text/*"] (no parameters)')
        status = value.get("status", ["2xx"])
        status = [status] if isinstance(status, int | str) else status
        if not isinstance(status, list) or not status or not all(
                (isinstance(s, int) and not isinstance(s, bool) and 100 <= s <= 599)
                or (isinstance(s, str) and (s == "any" or _STATUS_CLASS_RE.fullmatch(s)))
                for s in status):
            self.fail("applies_to.status", f"{status!r} is not a list of statuses",
                      'status = [200, "3xx"] or "any" (default ["2xx"])')
        return AppliesTo(url=url, content_type=tuple(x.strip().lower() for x in types),
                         status=tuple(status))

    def _selector(self, t: Mapping[str, Any], compiled: dict[str, Any]) -> dict[str, Any]:
        selector = t.get("selector")
        if not isinstance(selector, str) or not selector.strip():
            self.fail("selector", "must be a non-empty string (a CSS selector)",
                      "selector = 'a[href*=privacy]'")
        try:
            LexborHTMLParser("<html></html>").css(selector)
        except SelectolaxError:
            self.fail("selector", f"invalid CSS selector {selector!r}",
                      "CSS Selectors level 4 as parsed by lexbor (selectolax)")
        return {"selector": selector, "expect": self.expect(t)}

    def _regex(self, t: Mapping[str, Any], compiled: dict[str, Any]) -> dict[str, Any]:
        if "pattern" not in t:
            self.fail("pattern", "missing", "pattern = '...' (a regular expression)")
        pattern = self.regex("pattern", t["pattern"], compiled, "pattern")
        header = t.get("header")
        if header is not None and (not isinstance(header, str)
                                   or not _TOKEN_RE.fullmatch(header)):
            self.fail("header", f"{header!r} is not a header name",
                      "omit it to search the body; header = 'Cache-Control' for a header")
        return {"pattern": pattern, "header": header and header.lower(),
                "expect": self.expect(t)}

    def _header(self, t: Mapping[str, Any], compiled: dict[str, Any]) -> dict[str, Any]:
        name = t.get("name")
        if not isinstance(name, str) or not _TOKEN_RE.fullmatch(name):
            self.fail("name", f"{name!r} is not a header name",
                      "name = 'Strict-Transport-Security'")
        return {"name": name.lower()}

    def _max_response_time(self, t: Mapping[str, Any],
                           compiled: dict[str, Any]) -> dict[str, Any]:
        value = t.get("max_ms")
        if isinstance(value, bool) or not isinstance(value, int | float) or not (
                0 < value < float("inf")):
            self.fail("max_ms", f"must be a positive number of milliseconds, not {value!r}",
                      "max_ms = 2000")
        return {"max_ms": float(value)}

    def _link(self, t: Mapping[str, Any], compiled: dict[str, Any]) -> dict[str, Any]:
        if "url" not in t and "text" not in t:
            self.fail("url", "missing (a link rule needs url, text or both)",
                      "url = '/privacy' matches the link's absolute URL; text = '(?i)privacy' "
                      "its text")
        url = self.regex("url", t["url"], compiled, "url") if "url" in t else None
        text = self.regex("text", t["text"], compiled, "text") if "text" in t else None
        return {"url": url, "text": text, "expect": self.expect(t)}
