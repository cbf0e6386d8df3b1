"""The one error: evidence that cannot be read at all (a bad file is a Verdict problem)."""

from __future__ import annotations


class VerifyError(Exception):
    """A file that cannot be read, or a key that is not a key; ``hint`` says what to try."""

    def __init__(self, message: str, *, hint: str = "") -> None:
        super().__init__(message)
        self.hint = hint
