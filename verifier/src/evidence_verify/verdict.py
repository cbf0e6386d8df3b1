"""What every check returns: ok, what was checked, each problem, and what it does not prove."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Verdict:
    """``ok`` is True only when there is no problem. ``facts`` are what the evidence says
    once verified (a tree size, a root, who signed); ``notes`` say what was not proven."""

    kind: str
    subject: str
    ok: bool = False
    facts: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def problem(self, message: str) -> None:
        self.problems.append(message)

    def finish(self) -> Verdict:
        self.ok = not self.problems
        return self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
